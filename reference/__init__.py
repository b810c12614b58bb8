"""gemma_cy_reference: the pure-NumPy reference model (the trusted one).

``layers`` holds one function per layer, ``model`` the engine and its KV
cache, ``generate`` the plain greedy/sampled loop. The Cython fast path
mirrors these names and signatures one to one.
"""
from .model import OBSERVED_OPS, ReferenceEngine, observed_calls

# generate() stays in its module: re-exported here, the function would hide
# the submodule gemma_cy_reference.generate.
__all__ = ["ReferenceEngine", "OBSERVED_OPS", "observed_calls"]
