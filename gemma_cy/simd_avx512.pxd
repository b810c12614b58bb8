# The C interface of gemma_cy.simd_avx512 (cimport it from here).
include "kernels/api.pxi"
