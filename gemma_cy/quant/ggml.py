"""ggml's tensor types: their block sizes, and codecs from each to f32 or Q8_0.

A GGUF tensor of a quantized type is a sequence of blocks along ne0 (the
contiguous axis, a matrix row): ``block_size`` values stored in
``type_size`` bytes. Everything here works on whole blocks, as uint8 arrays
(n_blocks, type_size), following ggml's C reference (ggml-quants.c,
``dequantize_row_*``) operation for operation in f32, so the results are
bit-exact with it (and with gguf-py, which the tests check against).

Used by the converter (any supported source type -> Q8_0 / F32); the engines
only see ``quant.Q8_0Tensor`` and ``quant.F32Tensor``.

Re-quantizing to Q8_0 (docs/numerics.md#weights-as-stored): a Q4_0, Q5_0 or Q8_0 block already is
32 symmetric integer levels times one f16 scale, so it maps to Q8_0 exactly
(same d, q - 8 / q - 16 / q as int8, no rounding); every other type is
dequantized and quantized again (``quant.quantize_q8_0``).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .tensors import Q8_0_BLOCK, Q8_0_BYTES, quantize_q8_0


class GGMLType(NamedTuple):
    """One ggml tensor type: its enum value, name and block geometry."""

    id: int
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


# The types of ggml's enum ggml_type that GGUF files hold. Left out: retired
# ids (4, 5, 31-33, 36-38), Q8_1 and Q8_K (ggml's internal dot-product
# formats, never written to files) and types newer than this table; a file
# holding any of them is rejected as an unknown type.
GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4), GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18), GGMLType(3, "Q4_1", 32, 20),
    GGMLType(6, "Q5_0", 32, 22), GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34),
    GGMLType(10, "Q2_K", 256, 84), GGMLType(11, "Q3_K", 256, 110),
    GGMLType(12, "Q4_K", 256, 144), GGMLType(13, "Q5_K", 256, 176),
    GGMLType(14, "Q6_K", 256, 210),
    GGMLType(16, "IQ2_XXS", 256, 66), GGMLType(17, "IQ2_XS", 256, 74),
    GGMLType(18, "IQ3_XXS", 256, 98), GGMLType(19, "IQ1_S", 256, 50),
    GGMLType(20, "IQ4_NL", 32, 18), GGMLType(21, "IQ3_S", 256, 110),
    GGMLType(22, "IQ2_S", 256, 82), GGMLType(23, "IQ4_XS", 256, 136),
    GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8), GGMLType(29, "IQ1_M", 256, 56),
    GGMLType(30, "BF16", 1, 2), GGMLType(34, "TQ1_0", 256, 54),
    GGMLType(35, "TQ2_0", 256, 66), GGMLType(39, "MXFP4", 32, 17),
)}
GGML_TYPE_IDS: dict[str, int] = {t.name: t.id for t in GGML_TYPES.values()}

F32, F16, BF16 = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["F16"], GGML_TYPE_IDS["BF16"]
Q8_0 = GGML_TYPE_IDS["Q8_0"]


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of each block, as f32 (n, 1)."""
    return blocks[:, at:at + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_0-style packing: 16 bytes -> 32 values, low nibbles then high. (n, 32) u8."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0-style 5th bits: 4 bytes (a little-endian u32) -> bit j of value j. (n, 32) u8."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0_levels(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 block (d, qs[16]) -> int levels q - 8 in [-8, 7], (n, 32) int8."""
    return _nibbles(blocks[:, 2:18]).astype(np.int8) - np.int8(8)


def _q5_0_levels(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 block (d, qh[4], qs[16]) -> int levels q - 16 in [-16, 15], (n, 32) int8."""
    q = _nibbles(blocks[:, 6:22]) | (_high_bits(blocks[:, 2:6]) << 4)
    return q.astype(np.int8) - np.int8(16)


def _dequant_f32(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f4").astype(np.float32)


def _dequant_f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f2").astype(np.float32)


def _dequant_bf16(b: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an f32
    return (b.copy().view("<u2").astype(np.uint32) << 16).view(np.float32)


def _dequant_q8_0(b: np.ndarray) -> np.ndarray:
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b, 0)


def _dequant_q4_0(b: np.ndarray) -> np.ndarray:
    return _q4_0_levels(b).astype(np.float32) * _f16(b, 0)


def _dequant_q5_0(b: np.ndarray) -> np.ndarray:
    return _q5_0_levels(b).astype(np.float32) * _f16(b, 0)


def _dequant_q4_1(b: np.ndarray) -> np.ndarray:
    # (d, m, qs[16]): q * d + m
    return _nibbles(b[:, 4:20]).astype(np.float32) * _f16(b, 0) + _f16(b, 2)


def _dequant_q5_1(b: np.ndarray) -> np.ndarray:
    # (d, m, qh[4], qs[16]): q * d + m
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q.astype(np.float32) * _f16(b, 0) + _f16(b, 2)


def _k4_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in 12 bytes (ggml's
    get_scale_min_k4): (n, 12) u8 -> two (n, 8) f32."""
    s = scales
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _dequant_q4_k(b: np.ndarray) -> np.ndarray:
    # (d, dmin, scales[12], qs[128]); 8 sub-blocks of 32: (d*sc) * q - (dmin*m)
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 32)  # each 32 bytes hold two sub-blocks
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    d = (_f16(b, 0) * sc)[:, :, None]  # (n, 8, 1)
    m = (_f16(b, 2) * mn)[:, :, None]  # (n, 8, 1)
    return (d * q - m).reshape(n, 256)


def _dequant_q5_k(b: np.ndarray) -> np.ndarray:
    # (d, dmin, scales[12], qh[32], qs[128]); sub-block s takes bit s of each qh byte
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]  # (n, 32)
    high = np.stack([(qh >> s) & 1 for s in range(8)], axis=1)  # (n, 8, 32)
    qs = b[:, 48:176].reshape(n, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    q = (low | (high << 4)).astype(np.float32)  # (n, 8, 32)
    d = (_f16(b, 0) * sc)[:, :, None]
    m = (_f16(b, 2) * mn)[:, :, None]
    return (d * q - m).reshape(n, 256)


def _dequant_q6_k(b: np.ndarray) -> np.ndarray:
    # (ql[128], qh[64], scales[16] int8, d); two halves of 128 values, each
    # from 64 ql bytes and 32 qh bytes; value p of a half uses scale p // 16.
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 32)
    lo, hi = ql[:, :, :32], ql[:, :, 32:]
    q = np.stack([(lo & 0x0F) | ((qh & 3) << 4),
                  (hi & 0x0F) | (((qh >> 2) & 3) << 4),
                  (lo >> 4) | (((qh >> 4) & 3) << 4),
                  (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=2)  # (n, 2, 4, 32)
    q = (q.astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
    d = (_f16(b, 208) * sc)[:, :, None]  # (n, 16, 1)
    return (d * q).reshape(n, 256)


_DEQUANTIZERS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    GGML_TYPE_IDS["F32"]: _dequant_f32, GGML_TYPE_IDS["F16"]: _dequant_f16,
    GGML_TYPE_IDS["BF16"]: _dequant_bf16, GGML_TYPE_IDS["Q8_0"]: _dequant_q8_0,
    GGML_TYPE_IDS["Q4_0"]: _dequant_q4_0, GGML_TYPE_IDS["Q4_1"]: _dequant_q4_1,
    GGML_TYPE_IDS["Q5_0"]: _dequant_q5_0, GGML_TYPE_IDS["Q5_1"]: _dequant_q5_1,
    GGML_TYPE_IDS["Q4_K"]: _dequant_q4_k, GGML_TYPE_IDS["Q5_K"]: _dequant_q5_k,
    GGML_TYPE_IDS["Q6_K"]: _dequant_q6_k,
}
DEQUANTIZABLE = tuple(sorted(GGML_TYPES[t].name for t in _DEQUANTIZERS))

# Block-for-block exact maps to Q8_0: (n, type_size) -> int8 levels (n, 32)
_EXACT_LEVELS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    GGML_TYPE_IDS["Q8_0"]: lambda b: b[:, 2:].view(np.int8),
    GGML_TYPE_IDS["Q4_0"]: _q4_0_levels,
    GGML_TYPE_IDS["Q5_0"]: _q5_0_levels,
}


def _as_blocks(raw: np.ndarray, ggml_type: int, n_values: int) -> np.ndarray:
    """``raw`` bytes of ``n_values`` values of ``ggml_type`` as (n_blocks, type_size) u8."""
    t = GGML_TYPES[ggml_type]
    if n_values % t.block_size or raw.size != n_values // t.block_size * t.type_size:
        raise ValueError(f"{raw.size} bytes do not hold {n_values} values of type {t.name}")
    return raw.reshape(-1, t.type_size)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """The values of a tensor stored as ``raw`` (uint8 bytes) of ``ggml_type``,
    as a new f32 array of ``shape`` (NumPy order: ne0 last).

    Raises ValueError for a type with no dequantizer here (see DEQUANTIZABLE).
    """
    if ggml_type not in _DEQUANTIZERS:
        name = GGML_TYPES[ggml_type].name if ggml_type in GGML_TYPES else str(ggml_type)
        raise ValueError(f"cannot dequantize ggml type {name} (supported: {', '.join(DEQUANTIZABLE)})")
    n = 1
    for s in shape:
        n *= s
    blocks = _as_blocks(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1), ggml_type, n)
    return _DEQUANTIZERS[ggml_type](blocks).reshape(shape)


def is_exact_in_q8_0(ggml_type: int) -> bool:
    """True when blocks of ``ggml_type`` map to Q8_0 with no rounding."""
    return ggml_type in _EXACT_LEVELS


def to_q8_0(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Re-quantize a tensor (``raw`` bytes of ``ggml_type``, NumPy ``shape``,
    last axis a multiple of 32) to Q8_0 blocks uint8 (..., cols // 32, 34).

    Q8_0, Q4_0 and Q5_0 keep every block's f16 scale and integer levels: the
    result dequantizes to exactly the source's values. Other types are
    dequantized and quantized with ``quant.quantize_q8_0`` (rounding).
    """
    if not shape or shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"Q8_0 needs a last axis that is a multiple of {Q8_0_BLOCK}, got shape {shape}")
    out_shape = tuple(shape[:-1]) + (shape[-1] // Q8_0_BLOCK, Q8_0_BYTES)
    if ggml_type in _EXACT_LEVELS:
        n = 1
        for s in shape:
            n *= s
        blocks = _as_blocks(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1), ggml_type, n)
        out = np.empty((blocks.shape[0], Q8_0_BYTES), dtype=np.uint8)
        out[:, :2] = blocks[:, :2]  # the same f16 d
        out[:, 2:] = _EXACT_LEVELS[ggml_type](blocks).view(np.uint8)
        return out.reshape(out_shape)
    return quantize_q8_0(dequantize(raw, ggml_type, shape))
