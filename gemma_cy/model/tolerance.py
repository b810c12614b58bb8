"""docs/numerics.md#tolerances tolerances, in one place: |a - b| <= atol + rtol * |b|.

Tests and the diff tool use these; a layer that needs a looser bound gets it
written in docs/numerics.md#tolerances with the reason first, never here alone.
"""
from __future__ import annotations

import numpy as np

DEFAULT = (2e-3, 1e-3)  # (atol, rtol): matmul outputs, norms, residuals, logits
PROBABILITIES = (1e-4, 1e-5)  # softmax, SiLU/GELU outputs, probabilities
EXACT = (0.0, 0.0)  # dequantized rows, token ids, sampled ids

# The bound of each observed op (gemma_cy.model.observe names) judged on its
# own inputs (docs/numerics.md#local-error-not-drift); every other op: DEFAULT.
# Exact: the embedding (a dequantized row times the embedding scale, plus a
# position row where the model has one) and the residual adds (one f32
# addition) are the same few correctly rounded f32 operations, in the same
# order, in both engines: given the same inputs they give the same bits.
OP_TOLERANCE = {"embed": EXACT, "resid_attn": EXACT, "resid_mlp": EXACT}


def tolerance_for(op: str, config=None) -> tuple[float, float]:
    """(atol, rtol) of observed op ``op`` computed from the same inputs as the
    reference's (``gemma-cy diff``'s local check, the tests' per-op checks).
    In a model (ModelConfig ``config``) with Gemma 4's per-layer inputs or
    layer scalars, "resid_mlp" is more than an add (the per-layer input's
    gate, norm and product, then the scalar): DEFAULT."""
    if op == "resid_mlp" and config is not None and (config.per_layer_input_dim or config.layer_scalars):
        return DEFAULT
    return OP_TOLERANCE.get(op, DEFAULT)


def within(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    """True when every |a - b| <= atol + rtol*|b| (b is the reference)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(b)))


def errors(a: np.ndarray, b: np.ndarray, atol: float) -> tuple[float, float]:
    """(max |a-b|, max |a-b| / (|b| + atol)): the relative error is taken
    against |b| + atol so that values near zero do not blow it up."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    diff = np.abs(a - b)
    if diff.size == 0:
        return 0.0, 0.0
    return float(diff.max()), float((diff / (np.abs(b) + max(atol, 1e-12))).max())
