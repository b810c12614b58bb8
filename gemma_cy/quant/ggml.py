"""ggml's tensor types to f32 or Q8_0: whole tensors, as uint8 arrays of
blocks along ne0 (the contiguous axis, a matrix row).

The float types convert as stored; every integer block type goes through
``affine`` (int8 levels, scale and offset per sub-block), whose values are
ggml's ``dequantize_row_*`` bit for bit (the tests compare with gguf-py).

Used by the converter and by ``read_gguf_f32`` (the reference's f32 copy of
a file). Re-quantizing to Q8_0 (docs/numerics.md#weights-as-stored): a Q4_0,
Q5_0 or Q8_0 block already is 32 symmetric integer levels times one f16
scale, so it maps to Q8_0 exactly (same d, the levels as int8, no rounding);
every other type is dequantized and quantized again (``quantize_q8_0``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .affine import AFFINE_TYPES, DECOMPOSERS, to_affine
from .tensors import Q8_0_BLOCK, Q8_0_BYTES, quantize_q8_0
from .types import GGML_TYPE_IDS, GGML_TYPES

F32, F16, BF16 = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["F16"], GGML_TYPE_IDS["BF16"]
Q8_0 = GGML_TYPE_IDS["Q8_0"]


def _dequant_f32(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f4").astype(np.float32)


def _dequant_f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f2").astype(np.float32)


def _dequant_bf16(b: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an f32
    return (b.copy().view("<u2").astype(np.uint32) << 16).view(np.float32)


_FLOATS: dict[int, Callable[[np.ndarray], np.ndarray]] = {F32: _dequant_f32, F16: _dequant_f16, BF16: _dequant_bf16}
DEQUANTIZABLE = tuple(sorted([GGML_TYPES[t].name for t in _FLOATS] + list(AFFINE_TYPES)))
# Block-for-block exact maps to Q8_0: one f16 scale at byte 0, symmetric levels
_EXACT_IN_Q8_0 = (GGML_TYPE_IDS["Q8_0"], GGML_TYPE_IDS["Q4_0"], GGML_TYPE_IDS["Q5_0"])


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
    if ggml_type in DECOMPOSERS:
        return to_affine(raw, ggml_type, tuple(shape)).values()
    if ggml_type not in _FLOATS:
        name = GGML_TYPES[ggml_type].name if ggml_type in GGML_TYPES else str(ggml_type)
        raise ValueError(f"cannot dequantize ggml type {name} (supported: {', '.join(DEQUANTIZABLE)})")
    n = 1
    for s in shape:
        n *= s
    blocks = _as_blocks(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1), ggml_type, n)
    return _FLOATS[ggml_type](blocks).reshape(shape)


def is_exact_in_q8_0(ggml_type: int) -> bool:
    """True when blocks of ``ggml_type`` map to Q8_0 with no rounding."""
    return ggml_type in _EXACT_IN_Q8_0


def to_q8_0(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Re-quantize a tensor (``raw`` bytes of ``ggml_type``, NumPy ``shape``,
    last axis a multiple of 32) to Q8_0 blocks uint8 (..., cols // 32, 34).

    Q8_0, Q4_0 and Q5_0 keep every block's f16 scale and integer levels: the
    result dequantizes to exactly the source's values. Other types are
    dequantized and quantized with ``quantize_q8_0`` (rounding).
    """
    if not shape or shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"Q8_0 needs a last axis that is a multiple of {Q8_0_BLOCK}, got shape {shape}")
    out_shape = tuple(shape[:-1]) + (shape[-1] // Q8_0_BLOCK, Q8_0_BYTES)
    if ggml_type in _EXACT_IN_Q8_0:
        n = 1
        for s in shape:
            n *= s
        blocks = _as_blocks(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1), ggml_type, n)
        out = np.empty((blocks.shape[0], Q8_0_BYTES), dtype=np.uint8)
        out[:, :2] = blocks[:, :2]  # the same f16 d
        out[:, 2:] = to_affine(raw, ggml_type, tuple(shape)).q.reshape(-1, Q8_0_BLOCK).view(np.uint8)
        return out.reshape(out_shape)
    return quantize_q8_0(dequantize(raw, ggml_type, shape))
