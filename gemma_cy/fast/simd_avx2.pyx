"""gemma-cy kernels for AVX2 + FMA (-mavx2 -mfma): x86-64 CPUs since Haswell (2013) and Zen.

One of the simd_<isa> modules built from the same sources (setup.py): the
int8 dot product in kernels/dot_avx2.pxi, the other kernels in
kernels/common.pxi, and the whole forward pass over them (FastModel) in
forward.pxi. gemma_cy.fast.ops picks the module this CPU runs best; the
C interface is kernels/api.pxi.
"""
include "kernels/common.pxi"
include "kernels/dot_avx2.pxi"
include "kernels/q8_x86.pxi"
include "forward.pxi"
