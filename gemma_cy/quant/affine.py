"""Every ggml integer block type as one exact layout: int8 levels, and per
sub-block of ``sub`` values (16 or 32) a scale ``a`` and an offset ``b``, so
that each weight is

    w = f32(f32(a * q) - b)

bit for bit the value ggml's ``dequantize_row_*`` gives
(docs/formats.md#block-types, docs/numerics.md#weights-as-stored). Each
type's scales are small integers times an f16, so ``a`` and ``b`` are exact
f32 products (ggml computes them the same way), and for every type but Q6_K
``a * q`` is exact too; ggml rounds Q6_K's ``a * q`` once, and so does the
formula above. A dot product against such a row needs no dequantized copy:

    sum_i w_i x_i = sum_s a_s * sum_{i in s} q_i x_i  -  b_s * sum_{i in s} x_i

(equal up to the order of f32 roundings: the weights are the file's, the
sums are the engine's).

``to_affine(raw, ggml_type, shape)`` returns an ``AffineLevels``; ``records``
packs it as the fast engine reads it: per sub-block, the ``sub`` int8 levels,
then ``a`` (f32), then ``b`` (f32) when the type has offsets, back to back
along each row. ``AffineTensor`` is a weight matrix held so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .types import GGML_TYPE_IDS, GGML_TYPES


@dataclass(frozen=True)
class AffineLevels:
    """A tensor of ``shape`` (..., cols) as ``q`` int8 (..., cols), ``a`` and ``b``
    f32 (..., cols // sub); ``b`` is None for the types without offsets."""

    q: np.ndarray
    a: np.ndarray
    b: np.ndarray | None
    sub: int

    def values(self) -> np.ndarray:
        """The weights, f32(f32(a * q) - b): ggml's dequantized values, bit for bit."""
        a = np.repeat(self.a, self.sub, axis=-1)
        w = a * self.q.astype(np.float32)
        if self.b is not None:
            w = w - np.repeat(self.b, self.sub, axis=-1)
        return w

    def record_bytes(self) -> int:
        """Bytes of one packed sub-block: the levels, a, and b if any."""
        return self.sub + 4 + (4 if self.b is not None else 0)

    def records(self) -> np.ndarray:
        """uint8 (rows, cols // sub, record_bytes): per sub-block, the int8
        levels, then a, then b (little-endian f32), as the kernels read them."""
        rows = int(np.prod(self.q.shape[:-1], dtype=np.int64))
        n_sub = self.q.shape[-1] // self.sub
        out = np.empty((rows, n_sub, self.record_bytes()), dtype=np.uint8)
        out[:, :, :self.sub] = self.q.reshape(rows, n_sub, self.sub).view(np.uint8)
        out[:, :, self.sub:self.sub + 4] = self.a.reshape(rows, n_sub, 1).astype("<f4").view(np.uint8)
        if self.b is not None:
            out[:, :, self.sub + 4:] = self.b.reshape(rows, n_sub, 1).astype("<f4").view(np.uint8)
        return out


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of each block, as f32 (n, 1)."""
    return blocks[:, at:at + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values, low nibbles then high: (n, 32) u8."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian u32) -> bit j of value j: (n, 32) u8."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of Q4_K / Q5_K packed in 12 bytes
    (ggml's get_scale_min_k4): (n, 12) u8 -> two (n, 8) f32."""
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


# Each decomposer: (n, type_size) u8 blocks -> (q (n, block) int8, a (n, block/sub),
# b (n, block/sub) or None), following ggml's dequantize_row_<type>.

def _q8_0(b):
    return b[:, 2:].view(np.int8), _f16(b, 0), None


def _q4_0(b):  # (d, qs[16]): d * (q - 8)
    return _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8), _f16(b, 0), None


def _q5_0(b):  # (d, qh[4], qs[16]): d * (q - 16)
    q = _nibbles(b[:, 6:22]) | (_bits(b[:, 2:6]) << 4)
    return q.astype(np.int8) - np.int8(16), _f16(b, 0), None


def _q4_1(b):  # (d, m, qs[16]): d * q + m
    return _nibbles(b[:, 4:20]).astype(np.int8), _f16(b, 0), -_f16(b, 2)


def _q5_1(b):  # (d, m, qh[4], qs[16]): d * q + m
    q = _nibbles(b[:, 8:24]) | (_bits(b[:, 4:8]) << 4)
    return q.astype(np.int8), _f16(b, 0), -_f16(b, 2)


def _q2_k(b):
    # (scales[16], qs[64], d, dmin): sub-block s = 8h + 2j + g of 16 values
    # takes bits 2j..2j+1 of qs[32h + 16g + l]; scale byte s: low nibble
    # times d, high nibble times dmin.
    n = b.shape[0]
    qs = b[:, 16:80].reshape(n, 2, 1, 2, 16)  # (n, half, -, g, l)
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1, 1)
    q = ((qs >> shifts) & 3).reshape(n, 256)  # (n, half, j, g, l) in output order
    sc = b[:, 0:16]
    a = _f16(b, 80) * (sc & 0x0F).astype(np.float32)
    off = _f16(b, 82) * (sc >> 4).astype(np.float32)
    return q.astype(np.int8), a, off


def _q3_k(b):
    # (hmask[32], qs[64], scales[12], d): sub-block s = 8h + 2j + g of 16
    # values: level ((qs[32h + 16g + l] >> 2j) & 3) - (4 unless bit 4h + j of
    # hmask[16g + l]), scale d * (s6 - 32) with the 6-bit s6 of scale s.
    n = b.shape[0]
    qs = b[:, 32:96].reshape(n, 2, 1, 2, 16)
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1, 1)
    low = (qs >> shifts) & 3  # (n, half, j, g, l)
    hm = b[:, 0:32].reshape(n, 1, 1, 2, 16)
    bit = (np.arange(2).reshape(1, 2, 1, 1, 1) * 4 + np.arange(4).reshape(1, 1, 4, 1, 1)).astype(np.uint8)
    high = (hm >> bit) & 1  # (n, half, j, g, l)
    q = low.astype(np.int8) - np.where(high == 1, 0, 4).astype(np.int8)
    raw = b[:, 96:108].copy().view("<u4")  # (n, 3): ggml's aux[0..2]
    a0, a1, t = raw[:, 0], raw[:, 1], raw[:, 2]
    k1, k2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    aux = np.stack([(a0 & k2) | (((t >> 0) & k1) << 4), (a1 & k2) | (((t >> 2) & k1) << 4),
                    ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4), ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4)],
                   axis=1).astype("<u4")
    s6 = aux.view(np.int8).reshape(n, 16).astype(np.float32)
    return q.reshape(n, 256), _f16(b, 108) * (s6 - 32), None


def _q4_k(b):  # (d, dmin, scales[12], qs[128]); 8 sub-blocks of 32: (d*sc) * q - dmin*m
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 256)
    return q.astype(np.int8), _f16(b, 0) * sc, _f16(b, 2) * mn


def _q5_k(b):  # (d, dmin, scales[12], qh[32], qs[128]); sub-block s takes bit s of each qh byte
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]
    high = np.stack([(qh >> s) & 1 for s in range(8)], axis=1)  # (n, 8, 32)
    qs = b[:, 48:176].reshape(n, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    q = (low | (high << 4)).reshape(n, 256)
    return q.astype(np.int8), _f16(b, 0) * sc, _f16(b, 2) * mn


def _q6_k(b):  # (ql[128], qh[64], scales[16] int8, d); 16 sub-blocks of 16: (d*sc) * (q - 32)
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 32)
    lo, hi = ql[:, :, :32], ql[:, :, 32:]
    q = np.stack([(lo & 0x0F) | ((qh & 3) << 4),
                  (hi & 0x0F) | (((qh >> 2) & 3) << 4),
                  (lo >> 4) | (((qh >> 4) & 3) << 4),
                  (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=2)  # (n, 2, 4, 32)
    q = q.astype(np.int8) - np.int8(32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    return q.reshape(n, 256), _f16(b, 208) * sc, None


# type id -> (decomposer, values per sub-block)
DECOMPOSERS: dict[int, tuple[Callable, int]] = {
    GGML_TYPE_IDS["Q8_0"]: (_q8_0, 32), GGML_TYPE_IDS["Q4_0"]: (_q4_0, 32),
    GGML_TYPE_IDS["Q5_0"]: (_q5_0, 32), GGML_TYPE_IDS["Q4_1"]: (_q4_1, 32),
    GGML_TYPE_IDS["Q5_1"]: (_q5_1, 32), GGML_TYPE_IDS["Q2_K"]: (_q2_k, 16),
    GGML_TYPE_IDS["Q3_K"]: (_q3_k, 16), GGML_TYPE_IDS["Q4_K"]: (_q4_k, 32),
    GGML_TYPE_IDS["Q5_K"]: (_q5_k, 32), GGML_TYPE_IDS["Q6_K"]: (_q6_k, 16),
}
AFFINE_TYPES = tuple(sorted(GGML_TYPES[t].name for t in DECOMPOSERS))


def to_affine(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> AffineLevels:
    """The tensor stored as ``raw`` (uint8 bytes of ``ggml_type``, NumPy ``shape``,
    blocks along the last axis) as exact int8 levels with per-sub-block scales
    and offsets. ValueError for a type without integer blocks (see
    AFFINE_TYPES) or bytes that do not hold ``shape``."""
    if ggml_type not in DECOMPOSERS:
        name = GGML_TYPES[ggml_type].name if ggml_type in GGML_TYPES else str(ggml_type)
        raise ValueError(f"ggml type {name} has no integer blocks to run (supported: {', '.join(AFFINE_TYPES)})")
    t = GGML_TYPES[ggml_type]
    decompose, sub = DECOMPOSERS[ggml_type]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if not shape or shape[-1] % t.block_size:
        raise ValueError(f"{t.name} needs rows of a multiple of {t.block_size} values, got shape {tuple(shape)}")
    flat = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size != n // t.block_size * t.type_size:
        raise ValueError(f"{flat.size} bytes do not hold {n} values of type {t.name}")
    q, a, b = decompose(flat.reshape(-1, t.type_size))
    lead = tuple(shape[:-1])
    n_sub = shape[-1] // sub
    return AffineLevels(q=np.ascontiguousarray(q).reshape(shape),
                        a=np.ascontiguousarray(a, dtype=np.float32).reshape(lead + (n_sub,)),
                        b=None if b is None else np.ascontiguousarray(b, dtype=np.float32).reshape(lead + (n_sub,)),
                        sub=sub)


@dataclass(frozen=True)
class AffineTensor:
    """A weight matrix (rows, cols) of a ggml integer block type, laid out as
    packed records (``AffineLevels.records``): uint8 (rows, cols // sub,
    sub + 4 [+ 4]). ``source`` names the file's type (Q4_K...)."""

    records: np.ndarray
    sub: int
    has_offset: bool
    source: str

    def __post_init__(self) -> None:
        r = self.records
        want = self.sub + 4 + (4 if self.has_offset else 0)
        if not isinstance(r, np.ndarray) or r.dtype != np.uint8 or r.ndim != 3 or r.shape[-1] != want \
                or self.sub not in (16, 32):
            raise TypeError(f"AffineTensor needs uint8 records (rows, n_sub, {want}) and sub 16 or 32")

    @classmethod
    def from_raw(cls, raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> AffineTensor:
        """The matrix stored as ``raw`` bytes of ``ggml_type`` (see ``to_affine``)."""
        levels = to_affine(raw, ggml_type, shape)
        return cls(levels.records(), levels.sub, levels.b is not None, GGML_TYPES[ggml_type].name)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.records.shape[0], self.records.shape[1] * self.sub)

    def levels(self) -> AffineLevels:
        """The records unpacked (views where they can be)."""
        s = self.sub
        q = self.records[:, :, :s].view(np.int8).reshape(self.shape)
        a = self.records[:, :, s:s + 4].copy().view("<f4")[..., 0].astype(np.float32)
        b = self.records[:, :, s + 4:].copy().view("<f4")[..., 0].astype(np.float32) if self.has_offset else None
        return AffineLevels(q=q, a=a, b=b, sub=s)

    def dequantize(self) -> np.ndarray:
        """All weights as f32: ggml's dequantized values, bit for bit."""
        return self.levels().values()

    def row(self, index: int) -> np.ndarray:
        """One row as f32 (an embedding lookup)."""
        one = AffineTensor(self.records[index:index + 1], self.sub, self.has_offset, self.source)
        return one.dequantize()[0]


@dataclass(frozen=True)
class Q4_KTensor:
    """A Q4_K weight matrix (rows, cols) held as the file stores it, for the
    fast engine's QLAYOUT_Q4_K (gemma_cy/fast/kernels/common.pxi): ``blocks``
    uint8 (rows, cols // 256, 144), usually a read-only zero-copy view of the
    map, and ``ab`` f32 (rows, cols // 32, 2), each sub-block's scale a and
    offset b, worked out once (exact f32 products, as ggml forms them). Its
    weights are its records' (``affine()``): 0.8125 bytes per weight read
    against the records' 1.25."""

    blocks: np.ndarray
    ab: np.ndarray

    def __post_init__(self) -> None:
        b, ab = self.blocks, self.ab
        if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.ndim != 3 or b.shape[-1] != 144:
            raise TypeError("Q4_KTensor needs uint8 blocks (rows, n_blocks, 144)")
        if not isinstance(ab, np.ndarray) or ab.dtype != np.float32 or ab.shape != (b.shape[0], b.shape[1] * 8, 2):
            raise TypeError(f"Q4_KTensor needs f32 scales ({b.shape[0]}, {b.shape[1] * 8}, 2)")

    @classmethod
    def from_raw(cls, raw: np.ndarray, shape: tuple[int, int]) -> Q4_KTensor:
        """The Q4_K matrix of ``shape`` stored as ``raw`` (a view of the
        blocks, no copy). ValueError when the bytes do not hold it."""
        levels = to_affine(raw, GGML_TYPE_IDS["Q4_K"], shape)  # checks the size
        rows, cols = shape
        ab = np.ascontiguousarray(np.stack([levels.a, levels.b], axis=-1), dtype=np.float32)  # (rows, cols/32, 2)
        return cls(np.asarray(raw, dtype=np.uint8).reshape(rows, cols // 256, 144), ab)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.blocks.shape[1] * 256)

    source = "Q4_K"

    def levels(self) -> AffineLevels:
        return to_affine(self.blocks, GGML_TYPE_IDS["Q4_K"], self.shape)

    def affine(self) -> AffineTensor:
        """The same weights as records (what every other path reads)."""
        return AffineTensor.from_raw(self.blocks, GGML_TYPE_IDS["Q4_K"], self.shape)

    def dequantize(self) -> np.ndarray:
        """All weights as f32: ggml's dequantized values, bit for bit."""
        return self.levels().values()

    def row(self, index: int) -> np.ndarray:
        """One row as f32 (an embedding lookup)."""
        return to_affine(self.blocks[index:index + 1], GGML_TYPE_IDS["Q4_K"], (1, self.shape[1])).values()[0]

