"""gemma_cy.fast.buffers: working buffers on a cache line (docs/architecture.md#memory)."""
import numpy as np
import pytest

from gemma_cy.fast.buffers import CACHE_LINE_BYTES, aligned_zeros


@pytest.mark.parametrize("shape", [1, 7, 64 * 640, (64, 2048), 10 ** 6, (3, 5, 7)])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_aligned_zeros_start_on_a_cache_line(shape, dtype):
    a = aligned_zeros(shape, dtype)
    assert a.ctypes.data % CACHE_LINE_BYTES == 0
    assert a.shape == np.zeros(shape).shape and a.dtype == dtype and a.flags.c_contiguous
    assert not a.any()
    a[...] = 1  # writable, and the whole view lies inside its buffer
    assert a.base is not None and a.base.size >= a.size and a.sum() == a.size

