# int8 activations (the opt-in "q8" mode) with AVX2 intrinsics, for the AVX2
# and AVX-512 modules (both are built with -mavx2 -mfma -mf16c); contracts in
# api.pxi, the portable version in q8_generic.pxi.
#
# Dot products, per block of 32 (llama.cpp's way): w (int8) and xq loaded
# once each; maddubs(|w| as uint8, xq with w's sign) gives 16 int16 pair
# sums (|pair| <= 2 * 128 * 127 < 2^15: no saturation, as |xq| <= 127), madd
# with ones gives 8 int32 lane sums, exact; converted to f32 and added to an
# 8-lane f32 accumulator with the block's scale in one FMA. Even blocks go to
# acc0, odd ones to acc1; lanes = acc0 + acc1, summed by _sum8.
#
# The intrinsics are declared under q8_ names (C names in quotes) so that
# this file can sit next to either module's own declarations.

from libc.stdint cimport int32_t

cdef extern from "immintrin.h" nogil:
    ctypedef struct q8_m256i "__m256i":
        pass
    ctypedef struct q8_m256 "__m256":
        pass
    q8_m256i q8_loadu_si256 "_mm256_loadu_si256"(const void* p)
    void q8_storeu_si256 "_mm256_storeu_si256"(void* p, q8_m256i a)
    q8_m256i q8_sign_epi8 "_mm256_sign_epi8"(q8_m256i a, q8_m256i b)
    q8_m256i q8_maddubs_epi16 "_mm256_maddubs_epi16"(q8_m256i a, q8_m256i b)
    q8_m256i q8_madd_epi16 "_mm256_madd_epi16"(q8_m256i a, q8_m256i b)
    q8_m256i q8_set1_epi16 "_mm256_set1_epi16"(short a)
    q8_m256i q8_set1_epi32 "_mm256_set1_epi32"(int a)
    q8_m256i q8_setr_epi32 "_mm256_setr_epi32"(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7)
    q8_m256i q8_and_si256 "_mm256_and_si256"(q8_m256i a, q8_m256i b)
    q8_m256i q8_max_epi32 "_mm256_max_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i q8_cvtps_epi32 "_mm256_cvtps_epi32"(q8_m256 a)
    q8_m256i q8_packs_epi32 "_mm256_packs_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i q8_packs_epi16 "_mm256_packs_epi16"(q8_m256i a, q8_m256i b)
    q8_m256i q8_permutevar8x32_epi32 "_mm256_permutevar8x32_epi32"(q8_m256i a, q8_m256i idx)
    q8_m256i q8_castps_si256 "_mm256_castps_si256"(q8_m256 a)
    q8_m256 q8_cvtepi32_ps "_mm256_cvtepi32_ps"(q8_m256i a)
    q8_m256 q8_loadu_ps "_mm256_loadu_ps"(const float* p)
    q8_m256 q8_mul_ps "_mm256_mul_ps"(q8_m256 a, q8_m256 b)
    q8_m256 q8_set1_ps "_mm256_set1_ps"(float a)
    q8_m256 q8_setzero_ps "_mm256_setzero_ps"()
    q8_m256 q8_add_ps "_mm256_add_ps"(q8_m256 a, q8_m256 b)
    q8_m256 q8_fmadd_ps "_mm256_fmadd_ps"(q8_m256 a, q8_m256 b, q8_m256 c)
    void q8_storeu_ps "_mm256_storeu_ps"(float* p, q8_m256 a)
    float q8_cvtsh_ss "_cvtsh_ss"(unsigned short h)


cdef void k_quantize_q8(int8_t* q, float* d, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    # max|x| on the bit patterns with the sign cleared (q8_generic.pxi's
    # _amax_bits: a NaN wins over inf over every finite value), as int32 max
    cdef q8_m256i no_sign = q8_set1_epi32(0x7FFFFFFF)
    cdef q8_m256i order = q8_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)
    cdef q8_m256 v0, v1, v2, v3, inv_v
    cdef q8_m256i top, i0, i1, i2, i3
    cdef int32_t lanes[8]
    cdef int32_t bits
    cdef float amax, scale, inv
    cdef Py_ssize_t b, j
    for b in range(n_blocks):
        v0 = q8_loadu_ps(x)
        v1 = q8_loadu_ps(x + 8)
        v2 = q8_loadu_ps(x + 16)
        v3 = q8_loadu_ps(x + 24)
        top = q8_max_epi32(q8_max_epi32(q8_and_si256(q8_castps_si256(v0), no_sign),
                                        q8_and_si256(q8_castps_si256(v1), no_sign)),
                           q8_max_epi32(q8_and_si256(q8_castps_si256(v2), no_sign),
                                        q8_and_si256(q8_castps_si256(v3), no_sign)))
        q8_storeu_si256(lanes, top)
        bits = lanes[0]
        for j in range(1, 8):
            if lanes[j] > bits:
                bits = lanes[j]
        memcpy(&amax, &bits, 4)
        scale = amax / <float> 127.0
        inv = <float> 1.0 / scale if scale != 0 else <float> 0.0
        d[b] = scale
        inv_v = q8_set1_ps(inv)
        # rint(x * inv) (round half to even: the default MXCSR mode), then
        # int32 -> int16 -> int8 with saturation; the packs interleave the
        # 128-bit lanes, the permute puts the 32 values back in order
        i0 = q8_cvtps_epi32(q8_mul_ps(v0, inv_v))
        i1 = q8_cvtps_epi32(q8_mul_ps(v1, inv_v))
        i2 = q8_cvtps_epi32(q8_mul_ps(v2, inv_v))
        i3 = q8_cvtps_epi32(q8_mul_ps(v3, inv_v))
        i0 = q8_packs_epi16(q8_packs_epi32(i0, i1), q8_packs_epi32(i2, i3))
        q8_storeu_si256(q, q8_permutevar8x32_epi32(i0, order))
        x += Q8_0_BLOCK
        q += Q8_0_BLOCK


cdef inline q8_m256 _isum8_q8(const int8_t* w, const int8_t* xq, q8_m256i ones) noexcept nogil:
    """The 32 products w[i] * xq[i] as 8 exact int32 lane sums, in f32."""
    cdef q8_m256i wv = q8_loadu_si256(w)
    cdef q8_m256i xv = q8_loadu_si256(xq)
    return q8_cvtepi32_ps(q8_madd_epi16(q8_maddubs_epi16(q8_sign_epi8(wv, wv), q8_sign_epi8(xv, wv)), ones))


cdef float k_dot_i8_q8(const int8_t* w, const int8_t* xq, const float* xd, Py_ssize_t n_blocks,
                       float scale) noexcept nogil:
    cdef q8_m256i ones = q8_set1_epi16(1)
    cdef q8_m256 acc0 = q8_setzero_ps()
    cdef q8_m256 acc1 = q8_setzero_ps()
    cdef float lanes[8]
    cdef Py_ssize_t b = 0
    while b + 2 <= n_blocks:
        acc0 = q8_fmadd_ps(q8_set1_ps(xd[b]), _isum8_q8(w, xq, ones), acc0)
        acc1 = q8_fmadd_ps(q8_set1_ps(xd[b + 1]), _isum8_q8(w + Q8_0_BLOCK, xq + Q8_0_BLOCK, ones), acc1)
        w += 2 * Q8_0_BLOCK
        xq += 2 * Q8_0_BLOCK
        b += 2
    if b < n_blocks:
        acc0 = q8_fmadd_ps(q8_set1_ps(xd[b]), _isum8_q8(w, xq, ones), acc0)
    q8_storeu_ps(lanes, q8_add_ps(acc0, acc1))
    return _sum8(lanes) * scale


cdef float k_dot_q8_0_q8(const uint8_t* blocks, const int8_t* xq, const float* xd,
                         Py_ssize_t n_blocks) noexcept nogil:
    cdef q8_m256i ones = q8_set1_epi16(1)
    cdef q8_m256 acc0 = q8_setzero_ps()
    cdef q8_m256 acc1 = q8_setzero_ps()
    cdef float lanes[8]
    cdef Py_ssize_t b = 0
    while b + 2 <= n_blocks:
        acc0 = q8_fmadd_ps(q8_set1_ps(q8_cvtsh_ss(_load_u16(blocks)) * xd[b]),
                           _isum8_q8(<const int8_t*> (blocks + 2), xq, ones), acc0)
        acc1 = q8_fmadd_ps(q8_set1_ps(q8_cvtsh_ss(_load_u16(blocks + Q8_0_BYTES)) * xd[b + 1]),
                           _isum8_q8(<const int8_t*> (blocks + Q8_0_BYTES + 2), xq + Q8_0_BLOCK, ones), acc1)
        blocks += 2 * Q8_0_BYTES
        xq += 2 * Q8_0_BLOCK
        b += 2
    if b < n_blocks:
        acc0 = q8_fmadd_ps(q8_set1_ps(q8_cvtsh_ss(_load_u16(blocks)) * xd[b]),
                           _isum8_q8(<const int8_t*> (blocks + 2), xq, ones), acc0)
    q8_storeu_ps(lanes, q8_add_ps(acc0, acc1))
    return _sum8(lanes)
