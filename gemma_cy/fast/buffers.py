"""Zeroed working buffers whose first element starts on a cache line.

NumPy puts a large array 16 bytes into a page (glibc's header before an
mmap'd block), so a buffer it returns starts 16 bytes past a cache line and
every 64-byte (zmm) load the kernels make from it straddles two lines. The
engine's activations, scratch and tile buffers come from here instead
(docs/architecture.md#memory).
"""
from __future__ import annotations

import numpy as np

CACHE_LINE_BYTES = 64


def aligned_zeros(shape, dtype=np.float32) -> np.ndarray:
    """A new C-contiguous array of zeros of ``shape`` (an int or a tuple) and
    ``dtype`` whose first element is CACHE_LINE_BYTES-aligned: a view into a
    slightly larger array, which it keeps alive."""
    dtype = np.dtype(dtype)
    n = max(1, int(np.prod(shape, dtype=np.int64)))
    pad = CACHE_LINE_BYTES // dtype.itemsize
    buf = np.zeros(n + pad, dtype)
    skip = (-buf.ctypes.data % CACHE_LINE_BYTES) // dtype.itemsize
    return buf[skip:skip + n].reshape(shape)
