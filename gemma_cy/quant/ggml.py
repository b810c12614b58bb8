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

``Q5_0Tensor`` holds a Q5_0 matrix as the file stores it, for the fast
engine's QLAYOUT_Q5_0: its weights, levels and scales are its Q8_0
conversion's, in 22 bytes per 32 weights instead of 34.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .affine import AFFINE_TYPES, DECOMPOSERS, AffineLevels, AffineTensor, to_affine
from .tensors import Q8_0_BLOCK, Q8_0_BYTES, Q8_0Tensor, quantize_q8_0
from .types import GGML_TYPE_IDS, GGML_TYPES

F32, F16, BF16 = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["F16"], GGML_TYPE_IDS["BF16"]
Q8_0, Q5_0 = GGML_TYPE_IDS["Q8_0"], GGML_TYPE_IDS["Q5_0"]
Q5_0_BYTES = 22  # bytes per Q5_0 block of 32: f16 d, qh[4], qs[16]


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


def _matrix_blocks(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> np.ndarray:
    """``raw`` bytes of a (rows, cols) matrix of ``ggml_type`` as (rows,
    cols // block_size, type_size) u8, a view; ValueError when ``shape`` is
    not a matrix of whole blocks or the bytes do not hold it."""
    t = GGML_TYPES[ggml_type]
    if len(shape) != 2 or shape[1] % t.block_size:
        raise ValueError(f"{t.name} needs a matrix with rows of a multiple of {t.block_size} values, "
                         f"got shape {tuple(shape)}")
    rows, cols = shape
    blocks = _as_blocks(np.asarray(raw, dtype=np.uint8).reshape(-1), ggml_type, rows * cols)
    return blocks.reshape(rows, cols // t.block_size, t.type_size)


def _check_blocks(blocks, ggml_type: int) -> None:
    """TypeError unless ``blocks`` is uint8 (rows, n_blocks, type_size)."""
    t = GGML_TYPES[ggml_type]
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 3 \
            or blocks.shape[-1] != t.type_size:
        raise TypeError(f"{t.name}Tensor needs uint8 blocks (rows, n_blocks, {t.type_size})")


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


@dataclass(frozen=True)
class Q5_0Tensor:
    """A Q5_0 weight matrix (rows, cols) held as the file stores it, for the
    fast engine's QLAYOUT_Q5_0 (gemma_cy/fast/kernels/common.pxi): ``blocks``
    uint8 (rows, cols // 32, 22), usually a read-only zero-copy view of the
    map. Block: f16 d, then qh (4 bytes, a little-endian u32 whose bit j is
    the high bit of value j), then qs (16 bytes: values 0-15 in the low
    nibbles, 16-31 in the high ones); weight j = f32(d) * (q_j - 16) with
    q_j = nibble | high bit << 4. It holds exactly the Q8_0 blocks of
    ``q8_0()`` (the same d, the levels q_j - 16 as int8), in 22 bytes per 32
    weights against their 34."""

    blocks: np.ndarray

    def __post_init__(self) -> None:
        _check_blocks(self.blocks, Q5_0)

    @classmethod
    def from_raw(cls, raw: np.ndarray, shape: tuple[int, int]) -> Q5_0Tensor:
        """The Q5_0 matrix of ``shape`` stored as ``raw`` (a view of the
        blocks, no copy). ValueError when ``shape`` is not a matrix of whole
        blocks or the bytes do not hold it."""
        return cls(_matrix_blocks(raw, Q5_0, shape))

    source = "Q5_0"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.blocks.shape[1] * Q8_0_BLOCK)

    @property
    def d(self) -> np.ndarray:
        """Block scales, f16 (rows, n_blocks) (a strided view), as Q8_0Tensor.d."""
        return self.blocks[..., :2].view("<f2")[..., 0]

    @property
    def qs(self) -> np.ndarray:
        """The levels q - 16, int8 (rows, n_blocks, 32), as Q8_0Tensor.qs."""
        return to_affine(self.blocks, Q5_0, self.shape).q.reshape(self.blocks.shape[:2] + (Q8_0_BLOCK,))

    def q8_0(self) -> Q8_0Tensor:
        """The same weights as Q8_0 blocks (what every other path reads)."""
        return Q8_0Tensor(to_q8_0(self.blocks, Q5_0, self.shape))

    def dequantize(self) -> np.ndarray:
        """All weights as f32: ggml's dequantized values, bit for bit."""
        return self.q8_0().dequantize()

    def row(self, index: int) -> np.ndarray:
        """One row as f32 (an embedding lookup)."""
        return Q5_0Tensor(self.blocks[index:index + 1]).dequantize()[0]


Q4_1 = GGML_TYPE_IDS["Q4_1"]
Q4_1_BYTES = 20  # f16 d, f16 m, 16 bytes of nibbles per block of 32


@dataclass(frozen=True)
class Q4_1Tensor:
    """A Q4_1 weight matrix (rows, cols) held as the file stores it, for the
    fast engine's QLAYOUT_Q4_1 (gemma_cy/fast/kernels/common.pxi): ``blocks``
    uint8 (rows, cols // 32, 20), usually a read-only zero-copy view of the
    map. Block: f16 d, f16 m, then qs (16 bytes: value j < 16 the low nibble
    of qs[j], 16 + j its high nibble); weight j = f32(d) * q_j + f32(m), one
    rounding. Its weights are its records' (``affine()``: a = f32(d),
    b = -f32(m)), read from 0.625 bytes per weight against the records'
    1.25."""

    blocks: np.ndarray

    def __post_init__(self) -> None:
        _check_blocks(self.blocks, Q4_1)

    @classmethod
    def from_raw(cls, raw: np.ndarray, shape: tuple[int, int]) -> Q4_1Tensor:
        """The Q4_1 matrix of ``shape`` stored as ``raw`` (a view of the
        blocks, no copy). ValueError when ``shape`` is not a matrix of whole
        blocks or the bytes do not hold it."""
        return cls(_matrix_blocks(raw, Q4_1, shape))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.blocks.shape[1] * 32)

    source = "Q4_1"

    def levels(self) -> AffineLevels:
        return to_affine(self.blocks, Q4_1, self.shape)

    def affine(self) -> AffineTensor:
        """The same weights as records (what the paths that convert read)."""
        return AffineTensor.from_raw(self.blocks, Q4_1, self.shape)

    def dequantize(self) -> np.ndarray:
        """All weights as f32: ggml's dequantized values, bit for bit."""
        return self.levels().values()

    def row(self, index: int) -> np.ndarray:
        """One row as f32 (an embedding lookup)."""
        return Q4_1Tensor(self.blocks[index:index + 1]).dequantize()[0]
