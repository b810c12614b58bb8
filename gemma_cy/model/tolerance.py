"""docs/numerics.md#tolerances tolerances, in one place: |a - b| <= atol + rtol * |b|.

Tests and the diff tool use these; a layer that needs a looser bound gets it
written in docs/numerics.md#tolerances with the reason first, never here alone.
"""
from __future__ import annotations

import numpy as np

DEFAULT = (2e-3, 1e-3)  # (atol, rtol): matmul outputs, norms, residuals, logits
PROBABILITIES = (1e-4, 1e-5)  # softmax, SiLU/GELU outputs, probabilities
EXACT = (0.0, 0.0)  # dequantized rows, token ids, sampled ids

# Tolerance of each observed op (gemma_cy observer names); others: DEFAULT.
OP_TOLERANCE = {"embed": DEFAULT}


def tolerance_for(op: str) -> tuple[float, float]:
    """(atol, rtol) for observed op ``op``."""
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
