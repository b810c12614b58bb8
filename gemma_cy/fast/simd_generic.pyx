"""gemma-cy kernels in portable C, built with no -m flags (the architecture's
baseline: SSE2 on x86-64, NEON on arm64), so they run on any CPU of it.

Its own files: kernels/dot_generic.pxi, and kernels/q8_generic.pxi (shared
with simd_neon). The rest: docs/architecture.md#isa-dispatch.
"""
include "kernels/common.pxi"
include "kernels/portable.pxi"
include "kernels/rows.pxi"
include "kernels/dot_generic.pxi"
include "kernels/q8_generic.pxi"
include "kernels/wrappers.pxi"
include "forward.pxi"
