"""Quantized tensors and their codecs (one codec per storage layout).

``Int8Tensor``: int8 values with one f32 scale for the whole tensor (GMW1,
docs/formats.md#int8-per-tensor-quantization). Dequantized value = q * scale; in a dot product the scale is applied
once after the sum. Both engines and every writer use these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

SCALE_FLOOR = 1e-9  # keeps an all-zero tensor's scale positive (docs/formats.md#int8-per-tensor-quantization)
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
    """Quantize ``w`` to int8 with one scale (docs/formats.md#int8-per-tensor-quantization).

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


# ---------------------------------------------------------------------------
# GGUF tensor types: F32 (norm gains) and llama.cpp's Q8_0 (matrices).
#
# Q8_0 stores each run of 32 values along the input dimension (GGUF's ne0, a
# matrix row) as one block of 34 bytes: an f16 scale d, then 32 int8 q.
# Dequantized value = f32(d) * q. Blocks of a row are back to back, rows
# back to back, so a (rows, cols) matrix is a (rows, cols // 32, 34) uint8
# array: the file's bytes as they are, with no copy.

Q8_0_BLOCK = 32  # values per block
Q8_0_BYTES = 34  # bytes per block: f16 d + 32 int8
F16_MAX = 65504.0  # largest finite f16: a block scale above it cannot be stored


@dataclass(frozen=True)
class F32Tensor:
    """f32 values kept as they are (GGUF F32; norm gains).

    ``data`` is usually a read-only zero-copy view of a memory-mapped file;
    ``dequantize()`` returns that view itself, not a copy (do not write to it).
    """

    data: np.ndarray  # f32, any shape

    def __post_init__(self) -> None:
        if not isinstance(self.data, np.ndarray) or self.data.dtype != np.float32:
            raise TypeError(f"F32Tensor needs a float32 ndarray, got {_describe(self.data)}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def dequantize(self) -> np.ndarray:
        """All values as f32 (the stored array itself)."""
        return self.data

    def row(self, index: int) -> np.ndarray:
        """One row (an embedding lookup), or one value of a vector."""
        return self.data[index]


@dataclass(frozen=True)
class Q8_0Tensor:
    """int8 with one f16 scale per block of 32 along the last axis (Q8_0).

    ``blocks`` is uint8 (..., cols // 32, 34), usually a read-only zero-copy
    view of a memory-mapped GGUF file; ``shape`` is (..., cols). ``d`` and
    ``qs`` are strided views of the scales (..., nb) f16 and the values
    (..., nb, 32) int8 inside the blocks.
    """

    blocks: np.ndarray  # uint8, (rows, n_blocks, 34)

    def __post_init__(self) -> None:
        b = self.blocks
        if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.ndim < 2 \
                or b.shape[-1] != Q8_0_BYTES:
            raise TypeError(f"Q8_0Tensor needs a uint8 ndarray (..., n_blocks, {Q8_0_BYTES}), "
                            f"got {_describe(b)}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.blocks.shape[:-2] + (self.blocks.shape[-2] * Q8_0_BLOCK,)

    @property
    def d(self) -> np.ndarray:
        """Block scales, f16 (..., n_blocks) (a strided view)."""
        return self.blocks[..., :2].view("<f2")[..., 0]

    @property
    def qs(self) -> np.ndarray:
        """Block values, int8 (..., n_blocks, 32) (a strided view)."""
        return self.blocks[..., 2:].view(np.int8)

    def dequantize(self) -> np.ndarray:
        """All values as f32: f32(d) * q, shape ``self.shape``."""
        return dequantize_q8_0(self.blocks)

    def row(self, index: int) -> np.ndarray:
        """One dequantized row as f32 (an embedding lookup)."""
        return dequantize_q8_0(self.blocks[index])


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, halves away from zero (C ``roundf``).

    floor(|x|) + (frac >= 0.5), where frac = |x| - floor(|x|) is exact in
    binary floating point; ``np.round`` would round halves to even.
    """
    a = np.abs(x)
    f = np.floor(a)
    return np.copysign(f + (a - f >= 0.5), x)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Quantize f32 ``x`` (..., cols), cols % 32 == 0, to Q8_0 blocks
    uint8 (..., cols // 32, 34), bit-exact with llama.cpp's reference
    quantizer (ggml's quantize_row_q8_0_ref, gguf-py's Q8_0):

        d = max|x| / 127 (f32);  q = roundf(x * (1 / d)) (f32, halves away
        from zero);  stored: f16(d), int8 q.

    The values are scaled by the f32 d's reciprocal, not by the f16-rounded
    d that is stored. A zero block gives d = 0 and q = 0. A block so small
    that 1/d overflows f32 (max|x| < ~4e-37; C would cast inf to int8) gets
    q = 0 as well: its f16 d is 0, so it dequantizes to zeros either way.
    Raises ValueError on NaN/Inf or when d does not fit an f16.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % Q8_0_BLOCK != 0:
        raise ValueError(f"Q8_0 needs a last axis that is a multiple of {Q8_0_BLOCK}, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot quantize a tensor holding NaN or Inf")
    lead = x.shape[:-1]
    nb = x.shape[-1] // Q8_0_BLOCK
    blocks = x.reshape(-1, Q8_0_BLOCK)  # (n, 32)
    d = np.max(np.abs(blocks), axis=1, keepdims=True) / np.float32(127)  # (n, 1) f32
    if blocks.size and float(np.max(d)) > F16_MAX:
        raise ValueError(f"a Q8_0 block scale of {float(np.max(d)):.6g} does not fit an f16 "
                         f"(max {F16_MAX}): values up to {127 * F16_MAX:.6g} only")
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1) / d  # (n, 1)
    inv[~np.isfinite(inv)] = 0  # d == 0, or 1/d overflows
    q = np.clip(round_half_away(blocks * inv), -127, 127).astype(np.int8)  # (n, 32)
    out = np.empty((blocks.shape[0], Q8_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(lead + (nb, Q8_0_BYTES))


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 blocks uint8 (..., nb, 34) -> f32 (..., nb * 32): f32(d) * q."""
    d = blocks[..., :2].view("<f2").astype(np.float32)  # (..., nb, 1)
    q = blocks[..., 2:].view(np.int8).astype(np.float32)  # (..., nb, 32)
    return (q * d).reshape(blocks.shape[:-2] + (blocks.shape[-2] * Q8_0_BLOCK,))


def _describe(a) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


# ---------------------------------------------------------------------------
# int8 activations: the opt-in "q8" mode (docs/numerics.md#activation-modes). The fast path
# (kernels/q8_*.pxi, k_quantize_q8) and the reference quantize every matrix
# input with this one rule, bit for bit.


def quantize_activations_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize f32 activations x (..., n), n % 32 == 0, per block of 32:
    returns q int8 (..., n) and d f32 (..., n // 32), x ~= q * d.

        d = max|x| / 127 (f32 division);  q = rint(x * (1 / d)) (f32 product,
        halves to even, as the CPU's float->int conversion); q = 0 when
        d == 0 or 1/d overflows (a block below ~1e-38).

    max|x| is taken on the bit patterns with the sign cleared, so a block
    holding NaN gets a NaN d and one holding inf an inf d: a non-finite input
    gives non-finite products, never finite ones. Non-finite q values are
    -128 (the int8 saturation of the CPU's 0x80000000).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % Q8_0_BLOCK != 0:
        raise ValueError(f"q8 activations need a last axis that is a multiple of {Q8_0_BLOCK}, "
                         f"got shape {x.shape}")
    blocks = x.reshape(x.shape[:-1] + (-1, Q8_0_BLOCK))  # (..., nb, 32)
    bits = np.max(blocks.view(np.uint32) & np.uint32(0x7FFFFFFF), axis=-1)  # (..., nb)
    d = bits.view(np.float32) / np.float32(127)  # (..., nb) f32
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)  # (..., nb)
    inv[inv == np.inf] = 0  # a block so small that 1/d overflows: q = 0, as for d == 0
    with np.errstate(invalid="ignore"):
        v = np.rint(blocks * inv[..., None])  # (..., nb, 32) f32
    q = np.where((v >= -128) & (v <= 127), v, -128).astype(np.int8)
    return q.reshape(x.shape), d
