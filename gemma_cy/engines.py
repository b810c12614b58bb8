"""Engine selection: the name a user gives -> an engine over loaded Weights.

"fast" (the default) is the Cython forward pass, gemma_cy.fast_engine;
"reference" the NumPy one, imported only when asked for.
"""
from __future__ import annotations

from .errors import ParameterError
from .weights import Weights

ENGINES = ("reference", "fast")
DEFAULT_ENGINE = "fast"


def make_engine(name: str, weights: Weights, max_cache_len: int):
    """Build engine ``name`` ("reference" or "fast") with a KV cache of
    min(max_cache_len, model max) positions."""
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len <= 0:
        raise ParameterError(f"max_cache_len = {max_cache_len!r}, must be an integer > 0")
    if name == "reference":
        from gemma_cy_reference.model import ReferenceEngine
        return ReferenceEngine(weights, max_cache_len)
    if name == "fast":
        from .fast_engine import FastEngine
        return FastEngine(weights, max_cache_len)
    raise ParameterError(f"engine = {name!r}, expected one of {ENGINES}")
