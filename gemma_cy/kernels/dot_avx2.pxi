# The quantized dot products and GEMVs with AVX2 + FMA + F16C intrinsics
# (module simd_avx2, -mavx2 -mfma -mf16c).
#
# int8 (one scale per tensor). Per 8 values: one unaligned 8-byte load
# widened int8 -> int32 -> f32 (vpmovsxbd + vcvtdq2ps) and one FMA with 8
# activations. Summation order of a row, the same in every kernel here: four
# 8-lane accumulators a0..a3 taking the four 8-column groups of each whole
# 32 columns (one chain would be latency-bound), then whole 8s into a0;
# lanes = (a0 + a1) + (a2 + a3), summed by _sum8; the last < 8 products
# added one by one; times the scale. k_gemv_i8_resident (a model that stays
# in cache, like the tiny one) runs four rows at a time, each 8 activations
# loaded once for the four rows: ~+20-30% on Zen 3 in L2 (the loads, not the
# FMAs, bound one row there). k_gemv_i8 runs row after row, prefetching
# ahead: on a model streamed from DRAM (the 270M-sized preset), four rows at
# a time measured ~10% slower, even for its small k_proj and v_proj.
#
# Q8_0 (one f16 scale d per block of 32). Per block: four 8-value groups
# widened as above, p = (q0 x0 + q1 x1) + (q2 x2 + q3 x3) lane by lane (two
# product+FMA pairs, then an add: _pairs4), then acc += f32(d) * p (one FMA; d converted by
# F16C). Even blocks go to acc0, odd blocks to acc1 (two chains); lanes =
# acc0 + acc1, summed by _sum8. Rows run one after the other, prefetching
# ahead (the model-sized Q8_0 matrices stream from DRAM).

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m128i:
        pass
    ctypedef struct __m256i:
        pass
    ctypedef struct __m256:
        pass
    __m128i _mm_loadl_epi64(const __m128i* p)  # 8 bytes, any alignment
    __m256i _mm256_cvtepi8_epi32(__m128i a)
    __m256 _mm256_cvtepi32_ps(__m256i a)
    __m256 _mm256_loadu_ps(const float* p)
    __m256 _mm256_setzero_ps()
    __m256 _mm256_set1_ps(float a)
    __m256 _mm256_mul_ps(__m256 a, __m256 b)
    __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c)
    __m256 _mm256_add_ps(__m256 a, __m256 b)
    void _mm256_storeu_ps(float* p, __m256 a)
    float _cvtsh_ss(unsigned short h)  # F16C: one f16 -> f32, exact

cdef inline __m256 _widen8(const int8_t* q) noexcept nogil:
    """q[0:8] as 8 f32 (exact: every int8 is an f32)."""
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(<const __m128i*> q)))


cdef inline float _finish_i8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, const int8_t* q,
                             const float* x, Py_ssize_t tail, float scale) noexcept nogil:
    """(_sum8((a0 + a1) + (a2 + a3)) + the tail's < 8 products one by one) *
    scale. The tail is scalar: a wider load could cross the end of a
    memory-mapped file into an unmapped page."""
    cdef float lanes[8]
    cdef float s
    cdef Py_ssize_t i
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)))
    s = _sum8(lanes)
    for i in range(tail):
        s += q[i] * x[i]
    return s * scale


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef __m256 a0 = _mm256_setzero_ps()
    cdef __m256 a1 = _mm256_setzero_ps()
    cdef __m256 a2 = _mm256_setzero_ps()
    cdef __m256 a3 = _mm256_setzero_ps()
    cdef Py_ssize_t i = 0
    while i + 32 <= n:
        a0 = _mm256_fmadd_ps(_widen8(q + i), _mm256_loadu_ps(x + i), a0)
        a1 = _mm256_fmadd_ps(_widen8(q + i + 8), _mm256_loadu_ps(x + i + 8), a1)
        a2 = _mm256_fmadd_ps(_widen8(q + i + 16), _mm256_loadu_ps(x + i + 16), a2)
        a3 = _mm256_fmadd_ps(_widen8(q + i + 24), _mm256_loadu_ps(x + i + 24), a3)
        i += 32
    while i + 8 <= n:
        a0 = _mm256_fmadd_ps(_widen8(q + i), _mm256_loadu_ps(x + i), a0)
        i += 8
    return _finish_i8(a0, a1, a2, a3, q + i, x + i, n - i, scale)


cdef void _dot4_i8(float* out, const int8_t* q, Py_ssize_t stride, const float* x,
                   Py_ssize_t n, float scale) noexcept nogil:
    """out[0:4] = k_dot_i8 of the rows q, q + stride, q + 2 stride, q + 3 stride
    (bit for bit: the same order), each 8 activations loaded once for all
    four. 16 accumulators: gcc keeps most in the 16 ymm registers."""
    cdef const int8_t* q0 = q
    cdef const int8_t* q1 = q + stride
    cdef const int8_t* q2 = q + 2 * stride
    cdef const int8_t* q3 = q + 3 * stride
    cdef __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00
    cdef __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00
    cdef __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00
    cdef __m256 a30 = a00, a31 = a00, a32 = a00, a33 = a00
    cdef __m256 xv
    cdef Py_ssize_t i = 0
    while i + 32 <= n:
        xv = _mm256_loadu_ps(x + i)
        a00 = _mm256_fmadd_ps(_widen8(q0 + i), xv, a00)
        a10 = _mm256_fmadd_ps(_widen8(q1 + i), xv, a10)
        a20 = _mm256_fmadd_ps(_widen8(q2 + i), xv, a20)
        a30 = _mm256_fmadd_ps(_widen8(q3 + i), xv, a30)
        xv = _mm256_loadu_ps(x + i + 8)
        a01 = _mm256_fmadd_ps(_widen8(q0 + i + 8), xv, a01)
        a11 = _mm256_fmadd_ps(_widen8(q1 + i + 8), xv, a11)
        a21 = _mm256_fmadd_ps(_widen8(q2 + i + 8), xv, a21)
        a31 = _mm256_fmadd_ps(_widen8(q3 + i + 8), xv, a31)
        xv = _mm256_loadu_ps(x + i + 16)
        a02 = _mm256_fmadd_ps(_widen8(q0 + i + 16), xv, a02)
        a12 = _mm256_fmadd_ps(_widen8(q1 + i + 16), xv, a12)
        a22 = _mm256_fmadd_ps(_widen8(q2 + i + 16), xv, a22)
        a32 = _mm256_fmadd_ps(_widen8(q3 + i + 16), xv, a32)
        xv = _mm256_loadu_ps(x + i + 24)
        a03 = _mm256_fmadd_ps(_widen8(q0 + i + 24), xv, a03)
        a13 = _mm256_fmadd_ps(_widen8(q1 + i + 24), xv, a13)
        a23 = _mm256_fmadd_ps(_widen8(q2 + i + 24), xv, a23)
        a33 = _mm256_fmadd_ps(_widen8(q3 + i + 24), xv, a33)
        i += 32
    while i + 8 <= n:
        xv = _mm256_loadu_ps(x + i)
        a00 = _mm256_fmadd_ps(_widen8(q0 + i), xv, a00)
        a10 = _mm256_fmadd_ps(_widen8(q1 + i), xv, a10)
        a20 = _mm256_fmadd_ps(_widen8(q2 + i), xv, a20)
        a30 = _mm256_fmadd_ps(_widen8(q3 + i), xv, a30)
        i += 8
    out[0] = _finish_i8(a00, a01, a02, a03, q0 + i, x + i, n - i, scale)
    out[1] = _finish_i8(a10, a11, a12, a13, q1 + i, x + i, n - i, scale)
    out[2] = _finish_i8(a20, a21, a22, a23, q2 + i, x + i, n - i, scale)
    out[3] = _finish_i8(a30, a31, a32, a33, q3 + i, x + i, n - i, scale)


cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef void k_gemv_i8_resident(float* out, const int8_t* q, float scale, const float* x,
                             Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    cdef Py_ssize_t r = 0
    while r + 4 <= rows:
        _dot4_i8(out + r, q + r * cols, cols, x, cols, scale)
        r += 4
    while r < rows:
        out[r] = k_dot_i8(q + r * cols, x, cols, scale)
        r += 1


cdef inline __m256 _block_q8_0(const uint8_t* block, const float* x) noexcept nogil:
    """The 32 products of one Q8_0 block with x[0:32], summed to 8 lanes:
    (q0 x0 + q1 x1) + (q2 x2 + q3 x3) by 8-value groups."""
    cdef const int8_t* q = <const int8_t*> (block + 2)
    return _pairs4(_widen8(q), _widen8(q + 8), _widen8(q + 16), _widen8(q + 24), x)


cdef inline __m256 _pairs4(__m256 w0, __m256 w1, __m256 w2, __m256 w3, const float* x) noexcept nogil:
    """(w0 x[0:8] + w1 x[8:16]) + (w2 x[16:24] + w3 x[24:32]) lane by lane:
    two independent mul+FMA pairs, then one add (a dependency chain of three
    operations, not four)."""
    return _mm256_add_ps(_mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(w0, _mm256_loadu_ps(x))),
                         _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), _mm256_mul_ps(w2, _mm256_loadu_ps(x + 16))))


cdef inline __m256 _block_scale(const uint8_t* block) noexcept nogil:
    """f32(d) of one Q8_0 block in all 8 lanes."""
    return _mm256_set1_ps(_cvtsh_ss(_load_u16(block)))


cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    cdef __m256 acc0 = _mm256_setzero_ps()
    cdef __m256 acc1 = _mm256_setzero_ps()
    cdef const uint8_t* b = blocks
    cdef Py_ssize_t k = 0
    cdef float lanes[8]
    while k + 2 <= n_blocks:
        acc0 = _mm256_fmadd_ps(_block_scale(b), _block_q8_0(b, x), acc0)
        acc1 = _mm256_fmadd_ps(_block_scale(b + Q8_0_BYTES), _block_q8_0(b + Q8_0_BYTES, x + Q8_0_BLOCK), acc1)
        b += 2 * Q8_0_BYTES
        x += 2 * Q8_0_BLOCK
        k += 2
    if k < n_blocks:
        acc0 = _mm256_fmadd_ps(_block_scale(b), _block_q8_0(b, x), acc0)
    _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1))
    return _sum8(lanes)


cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    _gemv_q8_0_rows(out, blocks, x, rows, n_blocks)


cdef inline void _dot4_tokens_q8_0(float* out, Py_ssize_t out_stride, const uint8_t* row, const float* x,
                                   Py_ssize_t cols, Py_ssize_t n_blocks) noexcept nogil:
    """k_dot_q8_0 of one row with four tokens x, x + cols, x + 2 cols, x + 3
    cols, bit for bit (each token's products, FMAs and accumulators in
    k_dot_q8_0's order), each block widened once for the four tokens: the
    prefill's GEMM does a quarter of the int8 -> f32 conversions."""
    cdef const float* x0 = x
    cdef const float* x1 = x + cols
    cdef const float* x2 = x + 2 * cols
    cdef const float* x3 = x + 3 * cols
    cdef __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00
    cdef __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00
    cdef __m256 w0, w1, w2, w3, d, p
    cdef const int8_t* q
    cdef const uint8_t* b = row
    cdef Py_ssize_t k, o
    cdef float lanes[8]
    for k in range(n_blocks):
        q = <const int8_t*> (b + 2)
        w0 = _widen8(q)
        w1 = _widen8(q + 8)
        w2 = _widen8(q + 16)
        w3 = _widen8(q + 24)
        d = _block_scale(b)
        o = k * Q8_0_BLOCK
        if k & 1 == 0:
            p = _pairs4(w0, w1, w2, w3, x0 + o)
            a00 = _mm256_fmadd_ps(d, p, a00)
            p = _pairs4(w0, w1, w2, w3, x1 + o)
            a10 = _mm256_fmadd_ps(d, p, a10)
            p = _pairs4(w0, w1, w2, w3, x2 + o)
            a20 = _mm256_fmadd_ps(d, p, a20)
            p = _pairs4(w0, w1, w2, w3, x3 + o)
            a30 = _mm256_fmadd_ps(d, p, a30)
        else:
            p = _pairs4(w0, w1, w2, w3, x0 + o)
            a01 = _mm256_fmadd_ps(d, p, a01)
            p = _pairs4(w0, w1, w2, w3, x1 + o)
            a11 = _mm256_fmadd_ps(d, p, a11)
            p = _pairs4(w0, w1, w2, w3, x2 + o)
            a21 = _mm256_fmadd_ps(d, p, a21)
            p = _pairs4(w0, w1, w2, w3, x3 + o)
            a31 = _mm256_fmadd_ps(d, p, a31)
        b += Q8_0_BYTES
    _mm256_storeu_ps(lanes, _mm256_add_ps(a00, a01))
    out[0] = _sum8(lanes)
    _mm256_storeu_ps(lanes, _mm256_add_ps(a10, a11))
    out[out_stride] = _sum8(lanes)
    _mm256_storeu_ps(lanes, _mm256_add_ps(a20, a21))
    out[2 * out_stride] = _sum8(lanes)
    _mm256_storeu_ps(lanes, _mm256_add_ps(a30, a31))
    out[3 * out_stride] = _sum8(lanes)


cdef void _dot_q8_0_tokens(float* out, Py_ssize_t out_stride, const uint8_t* row, const float* x,
                           Py_ssize_t cols, Py_ssize_t n_blocks, Py_ssize_t n_tokens) noexcept nogil:
    """out[t * out_stride] = k_dot_q8_0(row, x + t * cols, n_blocks) for t < n_tokens
    (one row of k_gemm: the row stays in L1 across the tokens), bit for bit;
    four tokens at a time (_dot4_tokens_q8_0), the rest one by one."""
    cdef Py_ssize_t t = 0
    while t + 4 <= n_tokens:
        _dot4_tokens_q8_0(out + t * out_stride, out_stride, row, x + t * cols, cols, n_blocks)
        t += 4
    while t < n_tokens:
        out[t * out_stride] = k_dot_q8_0(row, x + t * cols, n_blocks)
        t += 1
