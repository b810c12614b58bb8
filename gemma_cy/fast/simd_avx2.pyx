"""gemma-cy kernels for AVX2 + FMA (-mavx2 -mfma): x86-64 CPUs since Haswell (2013) and Zen.

Its own files: kernels/dot_avx2.pxi, kernels/q8_avx2.pxi (the q8 mode's
GEMM), and kernels/q8_x86.pxi (shared with simd_avx512). The rest:
docs/architecture.md#isa-dispatch.
"""
include "kernels/common.pxi"
include "kernels/rows.pxi"
include "kernels/dot_avx2.pxi"
include "kernels/q8_x86.pxi"
include "kernels/q8_avx2.pxi"
include "kernels/wrappers.pxi"
include "forward.pxi"
