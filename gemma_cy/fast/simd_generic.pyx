"""gemma-cy kernels in portable C, built with no -m flags (the architecture's
baseline: SSE2 on x86-64, NEON on arm64), so they run on any CPU of it.

One of the simd_<isa> modules built from the same sources (setup.py): the
int8 dot product in kernels/dot_generic.pxi, the other kernels in
kernels/common.pxi, and the whole forward pass over them (FastModel) in
forward.pxi. gemma_cy.fast.ops picks the module this CPU runs best; the
C interface is kernels/api.pxi.
"""
include "kernels/common.pxi"
include "kernels/dot_generic.pxi"
include "kernels/q8_generic.pxi"
include "forward.pxi"
