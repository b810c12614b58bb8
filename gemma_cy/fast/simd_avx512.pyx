"""gemma-cy kernels for AVX-512 F/BW/VL and VNNI (-mavx512f -mavx512bw
-mavx512vl -mavx512vnni): Cascade Lake and later Intel, Zen 4 and later
(Skylake-SP, AVX-512 without VNNI, runs simd_avx2).

Its own files: kernels/dot_avx512.pxi, kernels/q8_vnni.pxi (the q8 mode's
GEMM), kernels/q8_vnni_positions.pxi (its batch decode step), and
kernels/q8_x86.pxi (written with AVX2 intrinsics, shared with simd_avx2).
The rest: docs/architecture.md#isa-dispatch.
"""
include "kernels/common.pxi"
include "kernels/dot_avx512.pxi"
include "kernels/q8_x86.pxi"
include "kernels/q8_vnni.pxi"
include "kernels/q8_vnni_positions.pxi"
include "kernels/wrappers.pxi"
include "forward.pxi"
