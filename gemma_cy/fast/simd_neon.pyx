"""gemma-cy kernels for NEON (Advanced SIMD) intrinsics, aarch64 only.

Its own files: kernels/dot_neon.pxi; the q8 mode's kernels are the portable
kernels/q8_generic.pxi. The rest: docs/architecture.md#isa-dispatch.
"""
include "kernels/common.pxi"
include "kernels/portable.pxi"
include "kernels/rows.pxi"
include "kernels/dot_neon.pxi"
include "kernels/q8_generic.pxi"
include "kernels/wrappers.pxi"
include "forward.pxi"
