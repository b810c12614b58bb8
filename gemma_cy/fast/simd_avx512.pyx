"""gemma-cy kernels for AVX-512 F/BW/VL (-mavx512f -mavx512bw -mavx512vl):
Skylake-SP and later Intel, Zen 4 and later.

Its own files: kernels/dot_avx512.pxi, and kernels/q8_x86.pxi (written with
AVX2 intrinsics, shared with simd_avx2). The rest: docs/architecture.md#isa-dispatch.
"""
include "kernels/common.pxi"
include "kernels/dot_avx512.pxi"
include "kernels/q8_x86.pxi"
include "kernels/wrappers.pxi"
include "forward.pxi"
