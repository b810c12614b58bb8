"""Quantized tensors and their codecs (one codec per storage layout).

``Int8Tensor``: int8 values with one f32 scale for the whole tensor (GMW1,
SPEC A2). Dequantized value = q * scale; in a dot product the scale is applied
once after the sum. Both engines and every writer use these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

SCALE_FLOOR = 1e-9  # keeps an all-zero tensor's scale positive (SPEC A2)
QUANT_CHUNK_VALUES = 1 << 22  # values per chunk: bounds the temporaries to ~16 MB


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
    Works in row chunks, so a (262144, 640) matrix needs no full-size f32
    temporaries.
    """
    w = np.asarray(w)
    flat = w.reshape(len(w), -1) if w.ndim else w.reshape(1, 1)
    step = max(1, QUANT_CHUNK_VALUES // max(1, flat.shape[1]))
    chunks = range(0, len(flat), step)
    amax = max((float(np.max(np.abs(flat[r:r + step]))) for r in chunks if flat[r:r + step].size), default=0.0)
    if not math.isfinite(amax):
        raise ValueError("cannot quantize a tensor holding NaN or Inf")
    scale = np.float32(max(amax, SCALE_FLOOR) / 127.0)
    q = np.empty(flat.shape, dtype=np.int8)
    for r in chunks:
        q[r:r + step] = np.clip(np.round(flat[r:r + step].astype(np.float32) / scale), -128, 127)
    return Int8Tensor(q=q.reshape(w.shape), scale=scale)


def dequantize_per_tensor(q: np.ndarray, scale) -> np.ndarray:
    """q * scale as f32 (a zero scale gives zeros)."""
    return q.astype(np.float32) * np.float32(scale)
