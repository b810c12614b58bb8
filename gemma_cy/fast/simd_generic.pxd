# The C interface of gemma_cy.fast.simd_generic (cimport it from here).
include "kernels/api.pxi"
