# The C interface of gemma_cy.fast.simd_avx512 (cimport it from here).
include "kernels/api.pxi"
