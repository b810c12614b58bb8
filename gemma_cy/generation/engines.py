"""Engine selection: the name a user gives -> an engine over loaded Weights.

"fast" (the default) is the Cython forward pass, gemma_cy.fast.engine;
"reference" the NumPy one, imported only when asked for.
"""
from __future__ import annotations

from ..errors import ParameterError
from ..model.weights import Weights

ENGINES = ("reference", "fast")
DEFAULT_ENGINE = "fast"
ACTIVATIONS = ("f32", "q8")  # "q8": the opt-in int8-activation mode


def make_engine(name: str, weights: Weights, max_cache_len: int, activations: str = "f32"):
    """Build engine ``name`` ("reference" or "fast") with a KV cache of
    min(max_cache_len, model max) positions. ``activations``: "f32" (the
    default) or "q8", the opt-in mode that quantizes every matrix input
    to int8 per block of 32 (docs/numerics.md#activation-modes: both engines do it bit for bit the
    same way; it costs fidelity, so it is never the default)."""
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len <= 0:
        raise ParameterError(f"max_cache_len = {max_cache_len!r}, must be an integer > 0")
    if activations not in ACTIVATIONS:
        raise ParameterError(f"activations = {activations!r}, expected one of {ACTIVATIONS}")
    if activations == "q8":
        widths = (weights.config.dim, weights.config.q_dim, weights.config.mlp_dim)
        if any(w % 32 for w in widths):
            raise ParameterError(f"activations = 'q8' needs dim, n_heads*head_dim and mlp_dim to be multiples "
                                 f"of 32; this model has {widths[0]}, {widths[1]}, {widths[2]}")
    if name == "reference":
        from gemma_cy_reference.model import ReferenceEngine
        return ReferenceEngine(weights, max_cache_len, activations)
    if name == "fast":
        from ..fast.engine import FastEngine
        return FastEngine(weights, max_cache_len, activations=activations)
    raise ParameterError(f"engine = {name!r}, expected one of {ENGINES}")
