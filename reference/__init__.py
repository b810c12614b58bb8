"""gemma_cy_reference: the pure-NumPy reference model (the trusted one).

``layers`` holds one function per layer (the kernels they call in ``ops``,
Gemma 4's extras in ``gemma4``, the q8 mode's matrices in ``q8``, the
dequantized weights and the KV cache in ``weights``), ``model`` the engine,
``generate`` the plain greedy/sampled loop. The Cython fast path mirrors
these names and signatures one to one.
"""
from .model import OBSERVED_OPS, ReferenceEngine, observed_calls

# generate() stays in its module: re-exported here, the function would hide
# the submodule gemma_cy_reference.generate.
__all__ = ["ReferenceEngine", "OBSERVED_OPS", "observed_calls"]
