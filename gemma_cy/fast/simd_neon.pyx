"""gemma-cy kernels for NEON (Advanced SIMD) intrinsics, aarch64 only.

One of the simd_<isa> modules built from the same sources (setup.py): the
int8 dot product in kernels/dot_neon.pxi, the other kernels in
kernels/common.pxi, and the whole forward pass over them (FastModel) in
forward.pxi. gemma_cy.fast.ops picks the module this CPU runs best; the
C interface is kernels/api.pxi.
"""
include "kernels/common.pxi"
include "kernels/dot_neon.pxi"
include "kernels/q8_generic.pxi"
include "forward.pxi"
