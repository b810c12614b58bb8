"""Quantized tensors and their codecs (one codec per storage layout).

``Int8Tensor``: int8 values with one f32 scale for the whole tensor (GMW1,
SPEC A2). Dequantized value = q * scale; in a dot product the scale is applied
once after the sum. Both engines and every writer use these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALE_FLOOR = 1e-9  # keeps an all-zero tensor's scale positive (SPEC A2)


@dataclass(frozen=True)
class Int8Tensor:
    """int8 values (rows, cols) with one f32 scale: w ~= q * scale.

    ``q`` is usually a read-only zero-copy view of a memory-mapped file.
    Vectors (norm gains) have shape (n,).
    """

    q: np.ndarray  # int8, (rows, cols) or (n,)
    scale: np.float32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape

    def dequantize(self) -> np.ndarray:
        """All values as f32: q * scale (same shape as ``q``)."""
        return dequantize_per_tensor(self.q, self.scale)

    def row(self, index: int) -> np.ndarray:
        """One dequantized row as f32 (an embedding lookup)."""
        return dequantize_per_tensor(self.q[index], self.scale)


def quantize_per_tensor(w: np.ndarray) -> Int8Tensor:
    """Quantize ``w`` to int8 with one scale (SPEC A2).

    scale = max(max|w|, 1e-9) / 127 in float64, stored as f32;
    q = clip(round_half_to_even(w / scale), -128, 127), where the division is
    f32 / f32 by the *stored* scale: that is what the seed engine did (it
    reproduces the fixture's SHA-256; dividing in float64 does not).
    """
    w = np.asarray(w)
    if w.size and not np.all(np.isfinite(w)):
        raise ValueError("cannot quantize a tensor holding NaN or Inf")
    amax = float(np.max(np.abs(w))) if w.size else 0.0
    scale = np.float32(max(amax, SCALE_FLOOR) / 127.0)
    q = np.clip(np.round(w.astype(np.float32) / scale), -128, 127).astype(np.int8)
    return Int8Tensor(q=q, scale=scale)


def dequantize_per_tensor(q: np.ndarray, scale) -> np.ndarray:
    """q * scale as f32 (a zero scale gives zeros)."""
    return q.astype(np.float32) * np.float32(scale)
