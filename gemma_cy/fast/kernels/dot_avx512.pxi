# The quantized dot products and GEMVs with AVX-512 F/BW/VL intrinsics and
# F16C (module simd_avx512). The GEMVs run row after row, prefetching ahead.
#
# k_dot_i8: per 16 values, one unaligned 16-byte load widened int8 -> int32 ->
# f32 and one FMA; four independent accumulators (64 values per step). The
# tail uses masked loads (AVX512BW+VL for bytes), which never touch memory
# past the end.
#
# k_dot_q8_0: per block, p = q[0:16] x[0:16] + q[16:32] x[16:32] lane by lane
# (one product, one FMA), then acc += f32(d) * p (one FMA; d converted by
# F16C); even blocks into acc0, odd ones into acc1; the 16 lanes of
# acc0 + acc1 summed as _sum8(lanes 0-7) + _sum8(lanes 8-15).

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m128i:
        pass
    ctypedef struct __m512i:
        pass
    ctypedef struct __m512:
        pass
    ctypedef unsigned short __mmask16
    __m128i _mm_loadu_si128(const __m128i* p)
    __m128i _mm_maskz_loadu_epi8(__mmask16 k, const void* p)
    __m512i _mm512_cvtepi8_epi32(__m128i a)
    __m512 _mm512_cvtepi32_ps(__m512i a)
    __m512 _mm512_loadu_ps(const void* p)
    __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p)
    __m512 _mm512_setzero_ps()
    __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c)
    __m512 _mm512_add_ps(__m512 a, __m512 b)
    __m512 _mm512_mul_ps(__m512 a, __m512 b)
    __m512 _mm512_sub_ps(__m512 a, __m512 b)
    __m512 _mm512_set1_ps(float a)
    void _mm512_storeu_ps(void* p, __m512 a)
    float _cvtsh_ss(unsigned short h)  # F16C: one f16 -> f32, exact
    __m512i _mm512_cvtepu8_epi32(__m128i a)
    __m512i _mm512_and_si512(__m512i a, __m512i b)
    __m512i _mm512_srli_epi32(__m512i a, unsigned int imm)
    __m512i _mm512_set1_epi32(int a)


cdef inline __m512 _widen16(const int8_t* q) noexcept nogil:
    """q[0:16] as 16 f32."""
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(<const __m128i*> q)))


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef __m512 a0 = _mm512_setzero_ps()
    cdef __m512 a1 = _mm512_setzero_ps()
    cdef __m512 a2 = _mm512_setzero_ps()
    cdef __m512 a3 = _mm512_setzero_ps()
    cdef Py_ssize_t i = 0
    cdef __mmask16 tail
    cdef float lanes[16]
    while i + 64 <= n:
        a0 = _mm512_fmadd_ps(_widen16(q + i), _mm512_loadu_ps(x + i), a0)
        a1 = _mm512_fmadd_ps(_widen16(q + i + 16), _mm512_loadu_ps(x + i + 16), a1)
        a2 = _mm512_fmadd_ps(_widen16(q + i + 32), _mm512_loadu_ps(x + i + 32), a2)
        a3 = _mm512_fmadd_ps(_widen16(q + i + 48), _mm512_loadu_ps(x + i + 48), a3)
        i += 64
    while i + 16 <= n:
        a0 = _mm512_fmadd_ps(_widen16(q + i), _mm512_loadu_ps(x + i), a0)
        i += 16
    if i < n:
        tail = <__mmask16> ((1 << (n - i)) - 1)  # the n - i < 16 low lanes
        a1 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail, q + i))),
            _mm512_maskz_loadu_ps(tail, x + i), a1)
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
    return (_sum8(lanes) + _sum8(lanes + 8)) * scale


cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef void k_gemv_i8_resident(float* out, const int8_t* q, float scale, const float* x,
                             Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef inline __m512 _block_q8_0(const uint8_t* block, const float* x) noexcept nogil:
    """The 32 products of one Q8_0 block with x[0:32], summed to 16 lanes."""
    cdef const int8_t* q = <const int8_t*> (block + 2)
    cdef __m512 p = _mm512_mul_ps(_widen16(q), _mm512_loadu_ps(x))
    return _mm512_fmadd_ps(_widen16(q + 16), _mm512_loadu_ps(x + 16), p)


cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    cdef __m512 acc0 = _mm512_setzero_ps()
    cdef __m512 acc1 = _mm512_setzero_ps()
    cdef const uint8_t* b = blocks
    cdef Py_ssize_t k = 0
    cdef float lanes[16]
    while k + 2 <= n_blocks:
        acc0 = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(_load_u16(b))), _block_q8_0(b, x), acc0)
        acc1 = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(_load_u16(b + Q8_0_BYTES))),
                               _block_q8_0(b + Q8_0_BYTES, x + Q8_0_BLOCK), acc1)
        b += 2 * Q8_0_BYTES
        x += 2 * Q8_0_BLOCK
        k += 2
    if k < n_blocks:
        acc0 = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(_load_u16(b))), _block_q8_0(b, x), acc0)
    _mm512_storeu_ps(lanes, _mm512_add_ps(acc0, acc1))
    return _sum8(lanes) + _sum8(lanes + 8)


cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    _gemv_q8_0_rows(out, blocks, x, rows, n_blocks)


cdef Py_ssize_t k_gemm_scratch_floats(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    return 0  # _gemm needs none


cdef void _gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                float* scratch) noexcept nogil:
    _gemm_by_rows(out, w, x, n_tokens)


cdef inline void _scores8(float* out, const float* q, const float* keys, Py_ssize_t key_stride,
                          Py_ssize_t n) noexcept nogil:
    _scores8_portable(out, q, keys, key_stride, n)


cdef inline float _score(const float* q, const float* key, Py_ssize_t n) noexcept nogil:
    return _score_portable(q, key, n)


# k_dot_affine (see kernels/common.pxi): per 16 values, the exact weights
# f32(f32(a * q) - b) (one widening, one product, one subtraction) and one
# FMA with x. Four accumulators, so that four FMA chains run at once: the
# 16-value groups of every 64 values go to acc0..acc3 in turn (a last 32
# values to acc0 and acc1); the 16 lanes of (acc0 + acc1) + (acc2 + acc3)
# summed as k_dot_q8_0's.

cdef inline __m512 _affine16(const int8_t* q, __m512 a, __m512 b, bint has_offset) noexcept nogil:
    """The exact weights f32(f32(a * q[0:16]) - b)."""
    cdef __m512 w = _mm512_mul_ps(_widen16(q), a)
    return _mm512_sub_ps(w, b) if has_offset else w


cdef inline const uint8_t* _affine32(__m512* lo, __m512* hi, const uint8_t* rec, const float* x, Py_ssize_t sub,
                                     bint has_offset, Py_ssize_t rb) noexcept nogil:
    """lo += the first 16 weights of the next 32 values times x[0:16], hi the
    last 16 times x[16:32] (one record of 32, or two of 16); returns the
    record after them."""
    cdef __m512 va = _mm512_set1_ps(_load_f32(rec + sub))
    cdef __m512 vb = _mm512_set1_ps(_load_f32(rec + sub + 4)) if has_offset else _mm512_setzero_ps()
    lo[0] = _mm512_fmadd_ps(_affine16(<const int8_t*> rec, va, vb, has_offset), _mm512_loadu_ps(x), lo[0])
    if sub == 16:  # the next 16 values are the next record's
        rec += rb
        va = _mm512_set1_ps(_load_f32(rec + 16))
        if has_offset:
            vb = _mm512_set1_ps(_load_f32(rec + 20))
        hi[0] = _mm512_fmadd_ps(_affine16(<const int8_t*> rec, va, vb, has_offset), _mm512_loadu_ps(x + 16), hi[0])
    else:
        hi[0] = _mm512_fmadd_ps(_affine16(<const int8_t*> rec + 16, va, vb, has_offset), _mm512_loadu_ps(x + 16),
                                hi[0])
    return rec + rb


cdef float k_dot_affine(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                        bint has_offset) noexcept nogil:
    cdef __m512 acc[4]
    cdef Py_ssize_t k = 0, nb = cols // 32, rb = sub + 4 + (4 if has_offset else 0)
    cdef float lanes[16]
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    while k + 2 <= nb:
        rec = _affine32(&acc[0], &acc[1], rec, x, sub, has_offset, rb)
        rec = _affine32(&acc[2], &acc[3], rec, x + 32, sub, has_offset, rb)
        x += 64
        k += 2
    if k < nb:
        _affine32(&acc[0], &acc[1], rec, x, sub, has_offset, rb)
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
    return _sum8(lanes) + _sum8(lanes + 8)


cdef inline __m512 _q4_k16(__m512i levels, __m512 a, __m512 b) noexcept nogil:
    """_affine16's exact weights f32(f32(a * q) - b), from 16 levels in int32 lanes."""
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(levels), a), b)


cdef float k_dot_q4_k(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil:
    # k_dot_affine's order with the levels unpacked in registers: sub-block
    # 2 j is the low nibbles of 32 bytes (its values 0-15 into acc[0], 16-31
    # into acc[1]), sub-block 2 j + 1 their high nibbles (acc[2], acc[3])
    cdef __m512 acc[4]
    cdef __m512i m15 = _mm512_set1_epi32(15), b0, b1
    cdef __m512 a_lo, b_lo, a_hi, b_hi
    cdef const uint8_t* qs
    cdef Py_ssize_t j, n = cols // 64  # pairs of sub-blocks
    cdef float lanes[16]
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for j in range(n):
        qs = row + (j // 4) * Q4_K_BYTES + 16 + 32 * (j % 4)
        a_lo = _mm512_set1_ps(ab[0])
        b_lo = _mm512_set1_ps(ab[1])
        a_hi = _mm512_set1_ps(ab[2])
        b_hi = _mm512_set1_ps(ab[3])
        b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> qs))
        b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> (qs + 16)))
        acc[0] = _mm512_fmadd_ps(_q4_k16(_mm512_and_si512(b0, m15), a_lo, b_lo), _mm512_loadu_ps(x), acc[0])
        acc[1] = _mm512_fmadd_ps(_q4_k16(_mm512_and_si512(b1, m15), a_lo, b_lo), _mm512_loadu_ps(x + 16), acc[1])
        acc[2] = _mm512_fmadd_ps(_q4_k16(_mm512_srli_epi32(b0, 4), a_hi, b_hi), _mm512_loadu_ps(x + 32), acc[2])
        acc[3] = _mm512_fmadd_ps(_q4_k16(_mm512_srli_epi32(b1, 4), a_hi, b_hi), _mm512_loadu_ps(x + 48), acc[3])
        ab += 4
        x += 64
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
    return _sum8(lanes) + _sum8(lanes + 8)
