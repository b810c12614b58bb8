"""Q8_0, Q5_0, Q4_K, Q4_1 and affine-record matrices packed as 16-row panels
(QLAYOUT_Q8_PANELS, QLAYOUT_Q5_PANELS, QLAYOUT_Q4_PANELS, QLAYOUT_AFFINE_PANELS,
gemma_cy/fast/kernels/api.pxi) for the q8 mode of a module whose kernels
read them (the avx512 module's, q8_vnni.pxi): docs/architecture.md#memory.

Why: a decode step streams every matrix from DRAM once per token. Q8_0's
34-byte blocks straddle cache lines, and a row's dot product ends in a
horizontal sum; as panels, 16 rows' levels of a block lie in eight aligned
64-byte vectors that vpdpbusd takes whole, lane i holding row i, so one
contiguous run of vectors feeds 16 rows at once and nothing is summed
across lanes (docs/benchmarks.md#where-a-decode-steps-bytes-go). The
levels and scales are the file's, so every product is the matrix's own
bit for bit. Q5_0's levels keep their five bits: the low four two to a
byte, the fifth as one 64-bit mask per level vector (set by a masked add
of 16). Q4_K's and Q4_1's levels stay two to a byte (unpacked by a
mask and a shift), each block's a and b beside them as vectors (Q4_1's
a = f32(d), b = -f32(m): ggml's value f32(d) q + f32(m) as f32(a q) - b).
A matrix of any other integer type, held as affine records of 16 or 32
(Q6_K, Q3_K, Q5_K, Q2_K...), keeps its int8 levels and its records' a (and
b) as vectors: the records' own bytes, rearranged.

The panels live in one anonymous arena of 2 MiB pages, written once at
load (Gemma 3 270M's q8 engine started 0-0.2 s later on the Zen 4 VM, within
the noise of a shared host); each source's file pages are released
as it is packed, so the memory is the panels' alone (36 bytes per 32
weights against Q8_0's 34, 24 against Q5_0's 22, Q4_K's 26 with its a, b and Q4_1's 20,
an affine matrix's records' own). Affine records live on the heap (laid
out at load, ``Weights`` keeps them): their panels are a second copy.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from ..quant.affine import AffineTensor, Q4_KTensor
from ..quant.ggml import Q4_1Tensor, Q5_0Tensor
from ..quant.tensors import Q8_0Tensor

PANEL_ROWS = 16
PANEL_BLOCK_BYTES = 576  # a block of 32 columns of 16 rows: 512 bytes of levels, 16 f32 scales
Q4_PANEL_BLOCK_BYTES = 384  # Q4_K's and Q4_1's: 256 bytes of 4-bit levels, 16 f32 a, 16 f32 b
Q5_PANEL_BLOCK_BYTES = 384  # Q5_0's: 256 bytes of low 4 bits, 64 of fifth bits, 16 f32 d
ALIGN_BYTES = 64


@dataclass(frozen=True)
class Q8Panels:
    """A Q8_0 matrix (rows, cols) as panels: ``panels`` (rows / 16, cols /
    32, 576) uint8, read-only, 64-byte aligned; or (``levels4``) a Q4_K or Q4_1 one,
    (rows / 16, cols / 32, 384); or (``levels5``) a Q5_0 one, (rows / 16,
    cols / 32, 384); or (``sub`` 16 or 32) one of affine records
    of ``sub`` values, with an offset b or not, (rows / 16, cols / 32,
    affine_block_bytes(sub, has_offset))."""

    panels: np.ndarray
    levels4: bool = False
    levels5: bool = False
    sub: int = 0
    has_offset: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.panels.shape[0] * PANEL_ROWS, self.panels.shape[1] * 32


def affine_block_bytes(sub: int, has_offset: bool) -> int:
    """Bytes of a 16 x 32 block of affine panels: the levels, then a vector
    of a per record (two for records of 16), then as many of b if any."""
    return 512 + 64 * (32 // sub) * (2 if has_offset else 1)


def _stored(tensor) -> np.ndarray:
    return tensor.records if isinstance(tensor, AffineTensor) else tensor.blocks


def can_pack(tensor) -> bool:
    """True for a 2-D Q8_0, Q5_0, Q4_K, Q4_1 or
    affine (records of 16 or 32) matrix of a multiple of 16 rows (and some)."""
    if not isinstance(tensor, (Q8_0Tensor, Q5_0Tensor, Q4_KTensor, Q4_1Tensor, AffineTensor)):
        return False
    stored = _stored(tensor)
    return (stored.ndim == 3 and stored.shape[0] > 0 and stored.shape[0] % PANEL_ROWS == 0
            and stored.shape[1] > 0 and tensor.shape[1] % 32 == 0)


def panel_shape(tensor) -> tuple[int, int, int]:
    """The shape of ``tensor``'s Q8Panels.panels."""
    rows, cols = tensor.shape
    if isinstance(tensor, AffineTensor):
        size = affine_block_bytes(tensor.sub, tensor.has_offset)
    elif isinstance(tensor, Q5_0Tensor):
        size = Q5_PANEL_BLOCK_BYTES
    else:
        size = Q4_PANEL_BLOCK_BYTES if has_levels4(tensor) else PANEL_BLOCK_BYTES
    return rows // PANEL_ROWS, cols // 32, size


def panels_of(tensor, panels: np.ndarray) -> Q8Panels:
    """``panels`` (packed from ``tensor``) as the Q8Panels of its kind."""
    if isinstance(tensor, AffineTensor):
        return Q8Panels(panels, sub=tensor.sub, has_offset=tensor.has_offset)
    if isinstance(tensor, Q5_0Tensor):
        return Q8Panels(panels, levels5=True)
    return Q8Panels(panels, has_levels4(tensor))


def has_levels4(tensor) -> bool:
    """True for the types whose panels keep 4-bit levels (Q4_K, Q4_1: a and b per 32)."""
    return isinstance(tensor, (Q4_KTensor, Q4_1Tensor))


def panel_bytes(tensor) -> int:
    return int(np.prod(panel_shape(tensor)))


def new_arena(size: int) -> tuple[mmap.mmap, np.ndarray] | None:
    """An anonymous writable arena of ``size`` bytes advised onto 2 MiB
    pages, and its bytes as an array; None when it cannot be had."""
    try:
        arena = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE)
    return arena, np.frombuffer(arena, np.uint8)
