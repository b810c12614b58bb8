"""What a model is, independent of file format and engine: ``ModelConfig``
(sizes and architecture switches), ``Weights`` (named tensors), the checks
every engine makes at its Python boundary, the per-layer observer hook, and
the numerical tolerances (docs/numerics.md#tolerances). Both engines import
from here; nothing here imports an engine."""
