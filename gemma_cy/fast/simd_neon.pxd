# The C interface of gemma_cy.fast.simd_neon (cimport it from here).
include "kernels/api.pxi"
