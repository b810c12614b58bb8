"""gemma-cy kernels for AVX-512 F/BW/VL (-mavx512f -mavx512bw -mavx512vl):
Skylake-SP and later Intel, Zen 4 and later.

One of the simd_<isa> modules built from the same sources (setup.py): the
int8 dot product in kernels/dot_avx512.pxi, the other kernels in
kernels/common.pxi, and the whole forward pass over them (FastModel) in
forward.pxi. gemma_cy.fast.ops picks the module this CPU runs best; the
C interface is kernels/api.pxi.
"""
include "kernels/common.pxi"
include "kernels/dot_avx512.pxi"
include "kernels/q8_x86.pxi"
include "forward.pxi"
