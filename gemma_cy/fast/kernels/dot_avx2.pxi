# The quantized dot products and GEMVs with AVX2 + FMA intrinsics
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
# Q8_0 (one f16 scale d per block of 32). Summation order of a row, the same
# in the GEMV and the GEMM: four 8-lane accumulators a0..a3, a_g taking the
# g-th 8-value group of every block in turn, each product the dequantized
# weight times x: a_g = fma(f32(q) * f32(d), x, a_g) (f32(q) * f32(d) is
# exact: 8 bits times the 11 of an f16 significand); lanes = (a0 + a1) +
# (a2 + a3), summed by _sum8 (k_dot_i8's order, without a tail).
# - k_dot_q8_0 (the GEMV, decode) runs one row at a time, prefetching ahead:
#   the four chains give it the parallelism it needs from a single row (the
#   rows stream from DRAM; several rows at once measured ~2x slower there).
# - _gemm (prefill) dequantizes GEMM_ROW_TILE rows at a time into
#   scratch, laid out group-major (row, g, block, 8), and copies x into the
#   same layout once, so every accumulator chain reads contiguous memory;
#   then a 3-row x 4-position kernel keeps 12 accumulators in registers,
#   each 8 weights loaded once for 4 positions and each 8 activations once
#   for 3 rows (one load per 1.7 FMAs, where the GEMV needs one per FMA).
#   Measured on Zen 3: ~1.5-1.8x the multiply-adds/s of the kernel it
#   replaced (per block: products paired, then scaled, for four positions).
#   An int8 matrix whose rows are whole runs of 32 has the same order (no
#   per-block scale, the tensor's scale after the sum) and takes the same
#   path, its rows only widened; a Q5_0 matrix too, its rows dequantized
#   from the levels _q5_0_word forms (the weights of its Q8_0 conversion).
# - k_dot_q5_0 (the GEMV of a Q5_0 matrix) takes k_dot_q8_0's steps on each
#   block's levels, unpacked eight at a time in 64-bit general registers
#   (_q5_0_levels: the integer ports are idle here) and read back by
#   _widen8 (store forwarding). Unpacking them in vector registers instead
#   (llama.cpp's bytes_from_bits_32, shuffles and compares) measured ~1.9x
#   k_dot_q8_0's time per block on Zen 5, this ~1.25x.

from libc.math cimport fmaf

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m128i:
        pass
    ctypedef struct __m256i:
        pass
    ctypedef struct __m256:
        pass
    ctypedef struct __m128:
        pass
    __m128i _mm_loadl_epi64(const __m128i* p)  # 8 bytes, any alignment
    __m128i _mm_cvtsi64_si128(long long a)
    __m256i _mm256_cvtepi8_epi32(__m128i a)
    __m256i _mm256_cvtepu8_epi32(__m128i a)
    __m256i _mm256_and_si256(__m256i a, __m256i b)
    __m256i _mm256_srli_epi32(__m256i a, int imm)
    __m256i _mm256_set1_epi32(int a)
    __m256 _mm256_cvtepi32_ps(__m256i a)
    __m256 _mm256_loadu_ps(const float* p)
    __m256 _mm256_setzero_ps()
    __m256 _mm256_set1_ps(float a)
    __m256 _mm256_mul_ps(__m256 a, __m256 b)
    __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c)
    __m256 _mm256_add_ps(__m256 a, __m256 b)
    void _mm256_storeu_ps(float* p, __m256 a)
    __m128 _mm256_castps256_ps128(__m256 a)
    __m128 _mm256_extractf128_ps(__m256 a, int i)
    __m128 _mm_add_ps(__m128 a, __m128 b)
    __m128 _mm_hadd_ps(__m128 a, __m128 b)
    __m256 _mm256_fmsub_ps(__m256 a, __m256 b, __m256 c)  # a * b - c, rounded once
    void _mm_storeu_ps(float* p, __m128 a)

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


cdef enum:
    GEMM_ROW_TILE = 6  # rows of a Q8_0 matrix dequantized at once by _gemm (two 3-row kernels)
    GEMM_POSITION_TILE = 64  # positions per pass over the matrix in _gemm


cdef inline __m256 _block_scale(const uint8_t* block) noexcept nogil:
    """f32(d) of one Q8_0 block in all 8 lanes."""
    return _mm256_set1_ps(_block_d(block))


cdef inline void _block_q8_0(__m256* acc, __m256 d, __m256 w0, __m256 w1, __m256 w2, __m256 w3,
                             const float* x) noexcept nogil:
    """acc[g] = fma(w_g * d, x[8 g: 8 g + 8], acc[g]): one block of k_dot_q8_0,
    w_g its levels 8 g .. 8 g + 7 as f32 (w_g * d is exact)."""
    acc[0] = _mm256_fmadd_ps(_mm256_mul_ps(w0, d), _mm256_loadu_ps(x), acc[0])
    acc[1] = _mm256_fmadd_ps(_mm256_mul_ps(w1, d), _mm256_loadu_ps(x + 8), acc[1])
    acc[2] = _mm256_fmadd_ps(_mm256_mul_ps(w2, d), _mm256_loadu_ps(x + 16), acc[2])
    acc[3] = _mm256_fmadd_ps(_mm256_mul_ps(w3, d), _mm256_loadu_ps(x + 24), acc[3])


cdef inline float _acc_sum(const __m256* acc) noexcept nogil:
    """_sum8 of the lanes (acc[0] + acc[1]) + (acc[2] + acc[3])."""
    cdef float lanes[8]
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
    return _sum8(lanes)


cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    cdef __m256 acc[4]
    cdef const int8_t* q
    cdef Py_ssize_t k
    acc[0] = _mm256_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for k in range(n_blocks):
        q = <const int8_t*> (blocks + 2)
        _block_q8_0(acc, _block_scale(blocks), _widen8(q), _widen8(q + 8), _widen8(q + 16), _widen8(q + 24), x)
        blocks += Q8_0_BYTES
        x += Q8_0_BLOCK
    return _acc_sum(acc)


cdef float k_dot_q5_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    cdef __m256 acc[4]
    cdef int8_t levels[32]  # (written, then read at once: stays in L1)
    cdef Py_ssize_t k
    acc[0] = _mm256_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for k in range(n_blocks):
        _q5_0_levels(levels, blocks)
        _block_q8_0(acc, _block_scale(blocks), _widen8(levels), _widen8(levels + 8), _widen8(levels + 16),
                    _widen8(levels + 24), x)
        blocks += Q5_0_BYTES
        x += Q8_0_BLOCK
    return _acc_sum(acc)


cdef inline void _dot2_q8_0(float* out, const uint8_t* b0, const uint8_t* b1, const float* x,
                            Py_ssize_t n_blocks) noexcept nogil:
    """out[0], out[1] = k_dot_q8_0 of the rows b0 and b1, bit for bit (each
    row's steps in k_dot_q8_0's order: _block_q8_0's FMAs, _sum8's lane
    sum), interleaved: eight accumulator chains in flight where one row has
    four, so that the FMA latency (4 cycles on Zen 3) does not bound a
    block's steps. Eight named registers, not two _block_q8_0 arrays: with
    the arrays gcc kept the sums in memory and the GEMV ran slower than one
    row at a time."""
    cdef __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0
    cdef __m256 d, e, xv
    cdef const int8_t* q
    cdef const int8_t* r
    cdef Py_ssize_t k
    for k in range(n_blocks):
        d = _block_scale(b0)
        e = _block_scale(b1)
        q = <const int8_t*> (b0 + 2)
        r = <const int8_t*> (b1 + 2)
        xv = _mm256_loadu_ps(x)
        a0 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(q), d), xv, a0)
        c0 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(r), e), xv, c0)
        xv = _mm256_loadu_ps(x + 8)
        a1 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(q + 8), d), xv, a1)
        c1 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(r + 8), e), xv, c1)
        xv = _mm256_loadu_ps(x + 16)
        a2 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(q + 16), d), xv, a2)
        c2 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(r + 16), e), xv, c2)
        xv = _mm256_loadu_ps(x + 24)
        a3 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(q + 24), d), xv, a3)
        c3 = _mm256_fmadd_ps(_mm256_mul_ps(_widen8(r + 24), e), xv, c3)
        b0 += Q8_0_BYTES
        b1 += Q8_0_BYTES
        x += Q8_0_BLOCK
    _sum8x4(out, 1, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
            _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)), a0, a0, 1.0)


cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    # two rows at a time (_dot2_q8_0), prefetching ahead; an odd last row alone
    cdef Py_ssize_t r = 0, row_bytes = n_blocks * Q8_0_BYTES
    cdef float pair[4]
    while r + 2 <= rows:
        _prefetch_row(blocks + r * row_bytes, 2 * row_bytes)
        _dot2_q8_0(pair, blocks + r * row_bytes, blocks + (r + 1) * row_bytes, x, n_blocks)
        out[r] = pair[0]
        out[r + 1] = pair[1]
        r += 2
    if r < rows:
        _prefetch_row(blocks + r * row_bytes, row_bytes)
        out[r] = k_dot_q8_0(blocks + r * row_bytes, x, n_blocks)


cdef Py_ssize_t k_gemm_scratch_floats(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    # GEMM_ROW_TILE dequantized rows, then the positions' x regrouped (_gemm), or a q8 panel and its
    # tables (q8_avx2.pxi)
    return max((GEMM_ROW_TILE + n_tokens) * cols, (_gemm_q8_scratch_bytes(cols, n_tokens) + 3) // 4)


cdef inline void _dequantize_grouped(float* out, const uint8_t* row, Py_ssize_t n_blocks) noexcept nogil:
    """One Q8_0 row dequantized group-major: out[(g * n_blocks + k) * 8 + j] =
    f32(d_k) * q_k[8 g + j] (exact), out (4 * n_blocks * 8,)."""
    cdef Py_ssize_t k, g, stride = n_blocks * 8
    cdef const int8_t* q
    cdef __m256 d
    for k in range(n_blocks):
        d = _block_scale(row)
        q = <const int8_t*> (row + 2)
        for g in range(4):
            _mm256_storeu_ps(out + g * stride + k * 8, _mm256_mul_ps(_widen8(q + 8 * g), d))
        row += Q8_0_BYTES


cdef inline void _dequantize_grouped_q5_0(float* out, const uint8_t* row, Py_ssize_t n_blocks) noexcept nogil:
    """One Q5_0 row dequantized group-major, as _dequantize_grouped its
    Q8_0 conversion (the same levels and d, so the same f32 weights): each
    group's 8 levels formed in a general register (_q5_0_word) and moved
    to a vector register, not written to a Q8_0 tile and read back."""
    cdef Py_ssize_t k, g, stride = n_blocks * 8
    cdef __m256 d
    for k in range(n_blocks):
        d = _block_scale(row)
        for g in range(4):
            _mm256_storeu_ps(out + g * stride + k * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_cvtsi64_si128(<long long> _q5_0_word(row, g)))), d))
        row += Q5_0_BYTES


cdef inline void _dequantize_grouped_q4_k(float* out, const uint8_t* row, const float* ab,
                                         Py_ssize_t cols) noexcept nogil:
    """One Q4_K row (super-blocks back to back, ab its sub-blocks' a, b)
    dequantized group-major as _affine_grouped its records: the exact
    weights f32(f32(a * q) - b), sub-block s as block s, the levels unpacked
    in registers as k_dot_q4_k does (so the same weights and order as the
    records, without writing them)."""
    cdef Py_ssize_t j, g, stride = cols // 32 * 8
    cdef __m256i m15 = _mm256_set1_epi32(15), v
    cdef __m256 a_lo, b_lo, a_hi, b_hi
    cdef const uint8_t* qs
    for j in range(cols // 64):  # sub-blocks 2 j (low nibbles) and 2 j + 1 (high)
        qs = _q4_k_qs(row, j)
        a_lo = _mm256_set1_ps(ab[0])
        b_lo = _mm256_set1_ps(ab[1])
        a_hi = _mm256_set1_ps(ab[2])
        b_hi = _mm256_set1_ps(ab[3])
        for g in range(4):
            v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*> (qs + 8 * g)))
            _mm256_storeu_ps(out + g * stride + 16 * j,
                             _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m15)), a_lo, b_lo))
            _mm256_storeu_ps(out + g * stride + 16 * j + 8,
                             _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), a_hi, b_hi))
        ab += 4


cdef inline void _q4_1_groups(__m256* w, const uint8_t* block) noexcept nogil:
    """w[g] = the exact weights f32(f32(a * q) - b) of group g (values 8 g ..
    8 g + 7) of one Q4_1 block, as its record gives them (a = f32(d),
    b = -f32(m)): groups 0, 1 the low nibbles of qs[0:8], qs[8:16], groups
    2, 3 their high nibbles."""
    cdef __m256i m15 = _mm256_set1_epi32(15)
    cdef __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*> (block + 4)))
    cdef __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*> (block + 12)))
    cdef __m256 a = _mm256_set1_ps(_block_d(block))
    cdef __m256 b = _mm256_set1_ps(-_block_d(block + 2))
    w[0] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), a, b)
    w[1] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m15)), a, b)
    w[2] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), a, b)
    w[3] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), a, b)


cdef inline void _dequantize_grouped_q4_1(float* out, const uint8_t* row, Py_ssize_t n_blocks) noexcept nogil:
    """One Q4_1 row dequantized group-major as _affine_grouped its records
    (_q4_1_groups: the same weights and order, without writing them)."""
    cdef Py_ssize_t k, stride = n_blocks * 8
    cdef __m256 w[4]
    for k in range(n_blocks):
        _q4_1_groups(w, row + k * Q4_1_BYTES)
        _mm256_storeu_ps(out + k * 8, w[0])
        _mm256_storeu_ps(out + stride + k * 8, w[1])
        _mm256_storeu_ps(out + 2 * stride + k * 8, w[2])
        _mm256_storeu_ps(out + 3 * stride + k * 8, w[3])


cdef float _dot_q4_1(const uint8_t* row, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    """k_dot_affine of the row's records (of 32, with offsets), bit for bit,
    straight from its Q4_1 blocks: acc[g] += w[g] * x[8 g ...] block after
    block, _acc_sum."""
    cdef __m256 acc[4]
    cdef __m256 w[4]
    cdef Py_ssize_t k
    acc[0] = _mm256_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for k in range(n_blocks):
        _q4_1_groups(w, row)
        acc[0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc[0])
        acc[1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc[1])
        acc[2] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc[2])
        acc[3] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc[3])
        row += Q4_1_BYTES
        x += 32
    return _acc_sum(acc)


cdef void _gemv_q4_k(float* out, const QMatrix* w, const float* x) noexcept nogil:
    _gemv_q4_k_rows(out, w, x)  # (common.pxi)


cdef void _gemv_affine(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                       Py_ssize_t sub, bint has_offset) noexcept nogil:
    _gemv_affine_rows(out, rec, x, rows, cols, sub, has_offset)  # (common.pxi)


cdef void _gemv_q5_0(float* out, const QMatrix* w, const float* x) noexcept nogil:
    _gemv_q5_0_rows(out, w, x)  # (common.pxi)


cdef void _gemv_q4_1(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """k_matvec of a Q4_1 matrix: _dot_q4_1 row after row, prefetching ahead."""
    cdef Py_ssize_t r, nb = w.cols // Q8_0_BLOCK, row_bytes = nb * Q4_1_BYTES
    for r in range(w.rows):
        _prefetch_row(w.blocks + r * row_bytes, row_bytes)
        out[r] = _dot_q4_1(w.blocks + r * row_bytes, x, nb)


cdef inline void _widen_grouped(float* out, const int8_t* row, Py_ssize_t n_blocks) noexcept nogil:
    """One int8 row (one scale per tensor, applied after the sum) as f32,
    group-major like _dequantize_grouped: out[(g * n_blocks + k) * 8 + j] =
    row[32 k + 8 g + j]."""
    cdef Py_ssize_t k, g, stride = n_blocks * 8
    for k in range(n_blocks):
        for g in range(4):
            _mm256_storeu_ps(out + g * stride + k * 8, _widen8(row + 32 * k + 8 * g))


cdef inline void _group_columns(float* out, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    """x (32 * n_blocks,) in the group-major layout of _dequantize_grouped:
    out[(g * n_blocks + k) * 8 + j] = x[32 k + 8 g + j]."""
    cdef Py_ssize_t k, g, stride = n_blocks * 8
    for k in range(n_blocks):
        for g in range(4):
            _mm256_storeu_ps(out + g * stride + k * 8, _mm256_loadu_ps(x + 32 * k + 8 * g))


cdef inline __m128 _fold(__m256 a) noexcept nogil:
    """a[0:4] + a[4:8]."""
    return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1))


cdef inline void _sum8x4(float* out, Py_ssize_t stride, __m256 a, __m256 b, __m256 c, __m256 d,
                         float scale) noexcept nogil:
    """out[0], out[stride], out[2 stride], out[3 stride] = _sum8 of the lanes
    of a, b, c, d, bit for bit (((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 +
    v7)): halves folded, then two rounds of adjacent pairs), times scale."""
    cdef float sums[4]
    _mm_storeu_ps(sums, _mm_hadd_ps(_mm_hadd_ps(_fold(a), _fold(b)), _mm_hadd_ps(_fold(c), _fold(d))))
    out[0] = sums[0] * scale
    out[stride] = sums[1] * scale
    out[2 * stride] = sums[2] * scale
    out[3 * stride] = sums[3] * scale


cdef inline __m256 _lanes(const __m256* part, Py_ssize_t i) noexcept nogil:
    """(a0 + a1) + (a2 + a3) of accumulator i, part (4 groups, n) with n =
    the accumulators per group."""
    return _mm256_add_ps(_mm256_add_ps(part[i], part[12 + i]), _mm256_add_ps(part[24 + i], part[36 + i]))


cdef inline void _step_3x4(__m256* acc, const float* w0, const float* w1, const float* w2,
                           const float* x0, const float* x1, const float* x2, const float* x3,
                           Py_ssize_t j) noexcept nogil:
    """acc[4 i + t] += w_i[j:j+8] * x_t[j:j+8] for rows i < 3 and positions
    t < 4: three weight loads, four activation loads, twelve FMAs. Seven
    base pointers and one offset, so that gcc keeps the weights in registers
    and loads each activation once (with one stride and pointer-per-row
    arithmetic it loaded the weights again for every position: 16 loads for
    12 FMAs, load-bound on Zen 3)."""
    cdef __m256 wa = _mm256_loadu_ps(w0 + j)
    cdef __m256 wb = _mm256_loadu_ps(w1 + j)
    cdef __m256 wc = _mm256_loadu_ps(w2 + j)
    cdef __m256 xv = _mm256_loadu_ps(x0 + j)
    acc[0] = _mm256_fmadd_ps(wa, xv, acc[0])
    acc[4] = _mm256_fmadd_ps(wb, xv, acc[4])
    acc[8] = _mm256_fmadd_ps(wc, xv, acc[8])
    xv = _mm256_loadu_ps(x1 + j)
    acc[1] = _mm256_fmadd_ps(wa, xv, acc[1])
    acc[5] = _mm256_fmadd_ps(wb, xv, acc[5])
    acc[9] = _mm256_fmadd_ps(wc, xv, acc[9])
    xv = _mm256_loadu_ps(x2 + j)
    acc[2] = _mm256_fmadd_ps(wa, xv, acc[2])
    acc[6] = _mm256_fmadd_ps(wb, xv, acc[6])
    acc[10] = _mm256_fmadd_ps(wc, xv, acc[10])
    xv = _mm256_loadu_ps(x3 + j)
    acc[3] = _mm256_fmadd_ps(wa, xv, acc[3])
    acc[7] = _mm256_fmadd_ps(wb, xv, acc[7])
    acc[11] = _mm256_fmadd_ps(wc, xv, acc[11])


cdef inline void _group_3x4(__m256* part, const float* w, Py_ssize_t w_stride,
                            const float* x, Py_ssize_t x_stride, Py_ssize_t n) noexcept nogil:
    """part[4 i + t] = the 8 lanes of sum_j w_i[j] x_t[j] over j < n (n a
    multiple of 8; lane l sums j = l mod 8 in order) for rows i < 3 and
    positions t < 4: 12 accumulator chains in registers, one step per
    iteration. One group of _kernel_3x4, in a function of its own: inside
    the group loop (or unrolled by two) gcc ran out of registers and
    reloaded the weights for every position."""
    cdef __m256 acc[12]
    cdef Py_ssize_t i, j = 0
    cdef const float* w1 = w + w_stride
    cdef const float* w2 = w + 2 * w_stride
    cdef const float* x1 = x + x_stride
    cdef const float* x2 = x + 2 * x_stride
    cdef const float* x3 = x + 3 * x_stride
    for i in range(12):
        acc[i] = _mm256_setzero_ps()
    while j < n:
        _step_3x4(acc, w, w1, w2, x, x1, x2, x3, j)
        j += 8
    for i in range(12):
        part[i] = acc[i]


cdef void _kernel_3x4(float* out, Py_ssize_t out_stride, const float* w, Py_ssize_t w_stride,
                      const float* x, Py_ssize_t x_stride, Py_ssize_t n_blocks, float scale) noexcept nogil:
    """out[t * out_stride + i] (times scale) for rows i < 3 and positions t < 4: w holds the
    3 rows and x the 4 positions group-major (row i at w + i w_stride,
    position t at x + t x_stride), one group at a time (_group_3x4)."""
    cdef __m256 part[48]  # (4 groups, 3 rows x 4 positions)
    cdef Py_ssize_t g, i, n = n_blocks * 8
    for g in range(4):
        _group_3x4(part + 12 * g, w + g * n, w_stride, x + g * n, x_stride, n)
    for i in range(3):
        _sum8x4(out + i, out_stride, _lanes(part, 4 * i), _lanes(part, 4 * i + 1),
                _lanes(part, 4 * i + 2), _lanes(part, 4 * i + 3), scale)


cdef void _kernel_3x1(float* out, const float* w, Py_ssize_t w_stride, const float* x,
                      Py_ssize_t n_blocks, float scale) noexcept nogil:
    """_kernel_3x4 for one position (the last < 4 of a block): out[0:3]."""
    cdef __m256 a0, a1, a2, xv
    cdef __m256 part[12]  # (4 groups, 3 rows)
    cdef const float* wg
    cdef const float* xg
    cdef Py_ssize_t g, k, i
    cdef float lanes[8]
    for g in range(4):
        a0 = _mm256_setzero_ps()
        a1 = a0; a2 = a0
        wg = w + g * n_blocks * 8
        xg = x + g * n_blocks * 8
        for k in range(n_blocks):
            xv = _mm256_loadu_ps(xg)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wg), xv, a0)
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wg + w_stride), xv, a1)
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wg + 2 * w_stride), xv, a2)
            wg += 8
            xg += 8
        part[3 * g] = a0; part[3 * g + 1] = a1; part[3 * g + 2] = a2
    for i in range(3):
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(part[i], part[3 + i]),
                                              _mm256_add_ps(part[6 + i], part[9 + i])))
        out[i] = _sum8(lanes) * scale


cdef void _scores8(float* out, const float* q, const float* keys, Py_ssize_t key_stride,
                   Py_ssize_t n) noexcept nogil:
    """k_scores for 8 keys (_score bit for bit: one 8-lane FMA chain per key,
    _sum8, the tail by FMAs in order), the 8 accumulators in registers and
    the 8 sums folded four keys at a time (_sum8x4)."""
    cdef __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0
    cdef __m256 qv
    cdef Py_ssize_t j = 0, k, i
    cdef float s
    while j + 8 <= n:
        qv = _mm256_loadu_ps(q + j)
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + j), a0)
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + key_stride + j), a1)
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 2 * key_stride + j), a2)
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 3 * key_stride + j), a3)
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 4 * key_stride + j), a4)
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 5 * key_stride + j), a5)
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 6 * key_stride + j), a6)
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + 7 * key_stride + j), a7)
        j += 8
    _sum8x4(out, 1, a0, a1, a2, a3, 1.0)
    _sum8x4(out + 4, 1, a4, a5, a6, a7, 1.0)
    if j < n:
        for k in range(8):
            s = out[k]
            for i in range(j, n):
                s = fmaf(q[i], keys[k * key_stride + i], s)
            out[k] = s


cdef float _score(const float* q, const float* key, Py_ssize_t n) noexcept nogil:
    """One score of k_scores, _scores8's bits for one key: an 8-lane FMA chain
    over the whole 8s, _sum8, then the tail by explicit FMAs (not left to
    the compiler's contraction, which differs between -O0 and -O3)."""
    cdef __m256 a = _mm256_setzero_ps()
    cdef Py_ssize_t j = 0
    cdef float lanes[8]
    cdef float s
    while j + 8 <= n:
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(key + j), a)
        j += 8
    _mm256_storeu_ps(lanes, a)
    s = _sum8(lanes)
    while j < n:
        s = fmaf(q[j], key[j], s)
        j += 1
    return s


cdef inline bint _gemm_takes_q5_0() noexcept nogil:
    """Q5_0 matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef inline bint _gemm_takes_q4_k() noexcept nogil:
    """Q4_K matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef inline bint _gemm_takes_q4_1() noexcept nogil:
    """Q4_1 matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef void _gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                float* scratch) noexcept nogil:
    """k_gemm (see the orders at the top of this file): a Q8_0 or Q5_0 matrix
    (a Q5_0 row dequantized from its levels, _dequantize_grouped_q5_0: the
    weights and the order of its Q8_0 conversion), or an int8 one whose
    rows are whole runs of 32 (its k_dot_i8 order is then the same as
    Q8_0's, with the scale after the sum), by the blocked kernels:
    positions in passes of GEMM_POSITION_TILE; in each, GEMM_ROW_TILE rows
    dequantized at a time (then tiles of 3 for the last 1 to 5, the last
    one overlapping the one before if need be), the kernels run over every
    position of the pass (the dequantized rows stay in L1, the pass's x in
    L2); a matrix of 1 or 2 rows by the GEMV's dot product, bit for bit the
    same order. An affine matrix (its k_dot_affine has the Q8_0 order) takes
    the same path, its rows dequantized exactly by _affine_grouped. Other
    int8 matrices and f32 ones: _gemm_by_rows."""
    cdef bint q5_0 = w.layout == QLAYOUT_Q5_0
    cdef bint q8_0 = w.layout == QLAYOUT_Q8_0 or q5_0  # (a Q5_0 matrix: its Q8_0 conversion's order)
    cdef bint q4_k = w.layout == QLAYOUT_Q4_K  # (its records' order: affine)
    cdef bint q4_1 = w.layout == QLAYOUT_Q4_1  # (likewise)
    cdef bint affine = w.layout == QLAYOUT_AFFINE or q4_k or q4_1
    cdef Py_ssize_t rows = w.rows, cols = w.cols, nb = w.cols // Q8_0_BLOCK
    cdef Py_ssize_t row_bytes = _row_bytes(w)
    cdef const uint8_t* base = w.blocks if q8_0 or affine else <const uint8_t*> w.q
    cdef float scale = 1.0 if q8_0 or affine else w.scale  # (x * 1.0 is x, bit for bit)
    cdef float* wt = scratch  # (GEMM_ROW_TILE, cols) dequantized rows, group-major
    cdef float* xt = scratch + GEMM_ROW_TILE * cols  # (n_tokens, cols) x, group-major
    cdef Py_ssize_t t, t0, tn, r, i, n
    if w.layout == QLAYOUT_F32 or (not q8_0 and not affine and cols % Q8_0_BLOCK != 0):
        _gemm_by_rows(out, w, x, n_tokens)
        return
    for t in range(n_tokens):
        _group_columns(xt + t * cols, x + t * cols, nb)
    t0 = 0
    while t0 < n_tokens:
        tn = min(<Py_ssize_t> GEMM_POSITION_TILE, n_tokens - t0)
        r = 0
        while r < rows and rows >= 3:
            if r + GEMM_ROW_TILE <= rows:
                n = GEMM_ROW_TILE
            else:  # 3-row tiles for the last 1 to 5 rows; one of 1 or 2 overlaps the tile before
                n = 3  # (its rows are written again with the same bits: each row's order is its own)
                r = min(r, rows - 3)
            for i in range(n):
                if not w.resident:
                    _prefetch_row(base + (r + i) * row_bytes, row_bytes)
                if q5_0:
                    _dequantize_grouped_q5_0(wt + i * cols, base + (r + i) * row_bytes, nb)
                elif q4_k:
                    _dequantize_grouped_q4_k(wt + i * cols, base + (r + i) * row_bytes, w.ab + (r + i) * nb * 2, cols)
                elif q4_1:
                    _dequantize_grouped_q4_1(wt + i * cols, base + (r + i) * row_bytes, nb)
                elif q8_0:
                    _dequantize_grouped(wt + i * cols, base + (r + i) * row_bytes, nb)
                elif affine:
                    _affine_grouped(wt + i * cols, base + (r + i) * row_bytes, cols, w.sub, w.has_offset)
                else:
                    _widen_grouped(wt + i * cols, w.q + (r + i) * cols, nb)
            t = t0
            while t + 4 <= t0 + tn:  # both 3-row kernels on the same positions: their x stays in L1
                _kernel_3x4(out + t * rows + r, rows, wt, cols, xt + t * cols, cols, nb, scale)
                if n == GEMM_ROW_TILE:
                    _kernel_3x4(out + t * rows + r + 3, rows, wt + 3 * cols, cols, xt + t * cols, cols, nb, scale)
                t += 4
            while t < t0 + tn:
                _kernel_3x1(out + t * rows + r, wt, cols, xt + t * cols, nb, scale)
                if n == GEMM_ROW_TILE:
                    _kernel_3x1(out + t * rows + r + 3, wt + 3 * cols, cols, xt + t * cols, nb, scale)
                t += 1
            r += n
        while r < rows:  # a matrix of 1 or 2 rows
            for t in range(t0, t0 + tn):
                if q5_0:
                    out[t * rows + r] = k_dot_q5_0(base + r * row_bytes, x + t * cols, nb)
                elif q4_k:
                    out[t * rows + r] = k_dot_q4_k(base + r * row_bytes, w.ab + r * nb * 2, x + t * cols, cols)
                elif q4_1:
                    out[t * rows + r] = _dot_q4_1(base + r * row_bytes, x + t * cols, nb)
                elif q8_0:
                    out[t * rows + r] = k_dot_q8_0(base + r * row_bytes, x + t * cols, nb)
                elif affine:
                    out[t * rows + r] = k_dot_affine(base + r * row_bytes, x + t * cols, cols, w.sub, w.has_offset)
                else:
                    out[t * rows + r] = k_dot_i8(w.q + r * cols, x + t * cols, cols, scale)
            r += 1
        t0 += tn


# Affine matrices (see kernels/common.pxi) with AVX2 + FMA: per 8 values one
# 8-byte load widened to f32, times the sub-block's scale, minus its offset
# (the exact weight, as _dequantize_grouped's f32(q) * f32(d) for Q8_0), then
# one FMA with 8 activations into accumulator g: the Q8_0 order, so the GEMM
# runs affine rows through the same group-major kernels.

cdef inline __m256 _affine8(const int8_t* q, __m256 a, __m256 b, bint has_offset) noexcept nogil:
    """The exact weights f32(f32(a * q[0:8]) - b)."""
    # (a * q is exact for every type with an offset: one fused rounding is the same)
    return _mm256_fmsub_ps(_widen8(q), a, b) if has_offset else _mm256_mul_ps(_widen8(q), a)


cdef inline const uint8_t* _affine_block32(__m256* acc, const uint8_t* rec, const float* x, Py_ssize_t sub,
                                           bint has_offset, Py_ssize_t rb) noexcept nogil:
    """acc[g] += the exact weights of the next 32 values' group g times
    x[8 g: 8 g + 8] (one record of 32, or two of 16); returns the record
    after them."""
    cdef const int8_t* q = <const int8_t*> rec
    cdef __m256 va = _mm256_set1_ps(_load_f32(rec + sub))
    cdef __m256 vb = _mm256_set1_ps(_load_f32(rec + sub + 4)) if has_offset else _mm256_setzero_ps()
    acc[0] = _mm256_fmadd_ps(_affine8(q, va, vb, has_offset), _mm256_loadu_ps(x), acc[0])
    acc[1] = _mm256_fmadd_ps(_affine8(q + 8, va, vb, has_offset), _mm256_loadu_ps(x + 8), acc[1])
    if sub == 16:  # the next 16 values are the next record's
        rec += rb
        q = <const int8_t*> rec
        va = _mm256_set1_ps(_load_f32(rec + 16))
        if has_offset:
            vb = _mm256_set1_ps(_load_f32(rec + 20))
        acc[2] = _mm256_fmadd_ps(_affine8(q, va, vb, has_offset), _mm256_loadu_ps(x + 16), acc[2])
        acc[3] = _mm256_fmadd_ps(_affine8(q + 8, va, vb, has_offset), _mm256_loadu_ps(x + 24), acc[3])
    else:
        acc[2] = _mm256_fmadd_ps(_affine8(q + 16, va, vb, has_offset), _mm256_loadu_ps(x + 16), acc[2])
        acc[3] = _mm256_fmadd_ps(_affine8(q + 24, va, vb, has_offset), _mm256_loadu_ps(x + 24), acc[3])
    return rec + rb


cdef float k_dot_affine(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                        bint has_offset) noexcept nogil:
    cdef __m256 acc[4]
    cdef Py_ssize_t k, rb = sub + 4 + (4 if has_offset else 0)
    acc[0] = _mm256_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for k in range(cols // 32):
        rec = _affine_block32(acc, rec, x + 32 * k, sub, has_offset, rb)
    return _acc_sum(acc)


cdef float k_dot_q4_k(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil:
    # k_dot_affine's order with the levels unpacked in registers: group g (8
    # values) of sub-block 2 j, the low nibbles of qs[8 g ...], into acc[g],
    # then the same group of sub-block 2 j + 1, their high nibbles
    cdef __m256 acc[4]
    cdef __m256i m15 = _mm256_set1_epi32(15), v
    cdef __m256 a_lo, b_lo, a_hi, b_hi
    cdef const uint8_t* qs
    cdef Py_ssize_t j, g, n = cols // 64  # pairs of sub-blocks
    acc[0] = _mm256_setzero_ps()
    acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0]
    for j in range(n):
        qs = _q4_k_qs(row, j)
        a_lo = _mm256_set1_ps(ab[0])
        b_lo = _mm256_set1_ps(ab[1])
        a_hi = _mm256_set1_ps(ab[2])
        b_hi = _mm256_set1_ps(ab[3])
        for g in range(4):
            v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*> (qs + 8 * g)))
            acc[g] = _mm256_fmadd_ps(_mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m15)), a_lo, b_lo),
                                     _mm256_loadu_ps(x + 8 * g), acc[g])
            acc[g] = _mm256_fmadd_ps(_mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), a_hi, b_hi),
                                     _mm256_loadu_ps(x + 32 + 8 * g), acc[g])
        ab += 4
        x += 64
    return _acc_sum(acc)


cdef inline void _affine_grouped(float* out, const uint8_t* rec, Py_ssize_t cols, Py_ssize_t sub,
                                 bint has_offset) noexcept nogil:
    """One affine row as exact f32 weights, group-major like
    _dequantize_grouped: out[(g * nb + k) * 8 + j] = w[32 k + 8 g + j]. Block
    k of 32 values is one record of 32 (groups 0-3) or two of 16 (groups
    0-1, then 2-3): the places follow from k alone (a general index per
    group cost as much as the products)."""
    cdef Py_ssize_t nb = cols // 32, stride = nb * 8, rb = sub + 4 + (4 if has_offset else 0), k, h
    cdef __m256 va, vb = _mm256_setzero_ps()
    cdef const int8_t* q
    for k in range(nb):
        if sub == 32:
            q = <const int8_t*> rec
            va = _mm256_set1_ps(_load_f32(rec + 32))
            if has_offset:
                vb = _mm256_set1_ps(_load_f32(rec + 36))
            _mm256_storeu_ps(out + k * 8, _affine8(q, va, vb, has_offset))
            _mm256_storeu_ps(out + stride + k * 8, _affine8(q + 8, va, vb, has_offset))
            _mm256_storeu_ps(out + 2 * stride + k * 8, _affine8(q + 16, va, vb, has_offset))
            _mm256_storeu_ps(out + 3 * stride + k * 8, _affine8(q + 24, va, vb, has_offset))
            rec += rb
        else:
            for h in range(2):
                q = <const int8_t*> rec
                va = _mm256_set1_ps(_load_f32(rec + 16))
                if has_offset:
                    vb = _mm256_set1_ps(_load_f32(rec + 20))
                _mm256_storeu_ps(out + 2 * h * stride + k * 8, _affine8(q, va, vb, has_offset))
                _mm256_storeu_ps(out + (2 * h + 1) * stride + k * 8, _affine8(q + 8, va, vb, has_offset))
                rec += rb


# Attention at decode (_scores_few, _weighted_few): as the avx512 module's
# (see there), with 8-lane vectors: a step's query heads of one kv head are
# m <= 4 rows, and the span of keys or values is read once, in the order of
# memory, with hints FEW_AHEAD_BYTES ahead spread over the work.

cdef inline void _add4(__m256* a0, __m256* a1, __m256* a2, __m256* a3, __m256 q, __m256 k0, __m256 k1,
                       __m256 k2, __m256 k3) noexcept nogil:
    """One row's step over 4 keys: a_k = fma(q, k_k, a_k) (a score chain per key)."""
    a0[0] = _mm256_fmadd_ps(q, k0, a0[0])
    a1[0] = _mm256_fmadd_ps(q, k1, a1[0])
    a2[0] = _mm256_fmadd_ps(q, k2, a2[0])
    a3[0] = _mm256_fmadd_ps(q, k3, a3[0])


cdef bint _scores_few(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                      const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys, Py_ssize_t n) noexcept nogil:
    """k_scores for m <= 4 rows and keys n floats apart (a kv head's span of
    the head-major cache), 4 keys at a time, two rows per pass over them (8
    chains; the first pass reads the keys from memory, the second from L1);
    each score is _score's steps (an 8-lane chain over the whole 8s, _sum8
    by _sum8x4, the tail in order). False, with nothing done, for other
    shapes."""
    cdef __m256 z = _mm256_setzero_ps()
    cdef __m256 a0, a1, a2, a3, b0, b1, b2, b3, k0, k1, k2, k3
    cdef Py_ssize_t i = 0, j, r, rp
    cdef const float* kp
    cdef const char* hint = <const char*> keys + FEW_AHEAD_BYTES
    cdef const char* end = <const char*> (keys + n_keys * n)
    if m > 4 or key_stride != n or n < 8:
        return False
    while i + 4 <= n_keys:
        kp = keys + i * n
        rp = 0
        while rp < m:
            a0 = z; a1 = z; a2 = z; a3 = z; b0 = z; b1 = z; b2 = z; b3 = z
            j = 0
            while j + 8 <= n:
                k0 = _mm256_loadu_ps(kp + j)
                k1 = _mm256_loadu_ps(kp + n + j)
                k2 = _mm256_loadu_ps(kp + 2 * n + j)
                k3 = _mm256_loadu_ps(kp + 3 * n + j)
                if rp == 0:
                    _hint_stream(&hint, end, 4 * 32)
                _add4(&a0, &a1, &a2, &a3, _mm256_loadu_ps(q + rp * q_stride + j), k0, k1, k2, k3)
                if rp + 1 < m:
                    _add4(&b0, &b1, &b2, &b3, _mm256_loadu_ps(q + (rp + 1) * q_stride + j), k0, k1, k2, k3)
                j += 8
            _sum8x4(out + rp * out_stride + i, 1, a0, a1, a2, a3, 1.0)
            if rp + 1 < m:
                _sum8x4(out + (rp + 1) * out_stride + i, 1, b0, b1, b2, b3, 1.0)
            rp += 2
        if j < n:
            _score_tails(out + i, out_stride, q, q_stride, m, kp, n, 4, j, n)
        i += 4
    while i < n_keys:
        for r in range(m):
            out[r * out_stride + i] = _score(q + r * q_stride, keys + i * n, n)
        i += 1
    return True


cdef inline void _axpy2(__m256* a0, __m256* a1, float w, __m256 x0, __m256 x1) noexcept nogil:
    """One row's step over 16 columns: a_k = fma(w, x_k, a_k) (y += w x, fused)."""
    cdef __m256 wv = _mm256_set1_ps(w)
    a0[0] = _mm256_fmadd_ps(wv, x0, a0[0])
    a1[0] = _mm256_fmadd_ps(wv, x1, a1[0])


cdef inline void _weighted_tile(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                                const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, bint two,
                                const char** hint, const char* end) noexcept nogil:
    """y (m <= 4, 16 columns, or 8 when not two) += w (m, n_x) . x (n_x, the
    same columns): y in registers, each x vector loaded once for the m rows;
    a hint per 64 bytes of x read (32 when not two: twice a line)."""
    cdef __m256 z = _mm256_setzero_ps()
    cdef __m256 a0 = z, a1 = z, b0 = z, b1 = z, c0 = z, c1 = z, d0 = z, d1 = z, x0, x1 = z
    cdef Py_ssize_t i, r
    cdef const float* xi
    cdef float* yr
    for r in range(m):  # (the registers of rows past m stay 0 and are never stored)
        yr = y + r * y_stride
        x0 = _mm256_loadu_ps(yr)
        if two:
            x1 = _mm256_loadu_ps(yr + 8)
        if r == 0:
            a0 = x0; a1 = x1
        elif r == 1:
            b0 = x0; b1 = x1
        elif r == 2:
            c0 = x0; c1 = x1
        else:
            d0 = x0; d1 = x1
    for i in range(n_x):
        xi = x + i * x_stride
        x0 = _mm256_loadu_ps(xi)
        if two:
            x1 = _mm256_loadu_ps(xi + 8)
        _hint_stream(hint, end, 64 if two else 32)
        _axpy2(&a0, &a1, w[i], x0, x1)
        if m > 1:
            _axpy2(&b0, &b1, w[w_stride + i], x0, x1)
        if m > 2:
            _axpy2(&c0, &c1, w[2 * w_stride + i], x0, x1)
        if m > 3:
            _axpy2(&d0, &d1, w[3 * w_stride + i], x0, x1)
    for r in range(m):
        if r == 0:
            x0 = a0; x1 = a1
        elif r == 1:
            x0 = b0; x1 = b1
        elif r == 2:
            x0 = c0; x1 = c1
        else:
            x0 = d0; x1 = d1
        yr = y + r * y_stride
        _mm256_storeu_ps(yr, x0)
        if two:
            _mm256_storeu_ps(yr + 8, x1)


cdef inline void _weighted_columns(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride,
                                   Py_ssize_t m, const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n,
                                   const char** hint, const char* end) noexcept nogil:
    """y (m <= 4, n) += w (m, n_x) . x (n_x, n): 16 (or 8) columns at a time
    in registers (_weighted_tile), the last < 8 columns by fmaf; every value
    takes y = fma(w[r, i], x[i], y) in the order of i."""
    cdef Py_ssize_t c = 0, col, r, i
    cdef float acc
    while c + 8 <= n:
        _weighted_tile(y + c, y_stride, w, w_stride, m, x + c, x_stride, n_x, c + 16 <= n, hint, end)
        c += 16 if c + 16 <= n else 8
    for col in range(c, n):
        for r in range(m):
            acc = y[r * y_stride + col]
            for i in range(n_x):
                acc = fmaf(w[r * w_stride + i], x[i * x_stride + col], acc)
            y[r * y_stride + col] = acc


cdef void _weighted_rows_pass(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                              const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    """k_weighted_rows' pass with explicit FMAs: rows four at a time through
    _weighted_columns (no hints), so every value takes the steps of
    _weighted_few whatever the compiler's contraction (the portable pass's
    y += w * x is fused at -O3 and not at -O0)."""
    cdef Py_ssize_t r = 0, rows
    cdef const char* none = <const char*> x  # an empty stream: no hints
    while r < m:
        rows = min(<Py_ssize_t> 4, m - r)
        _weighted_columns(y + r * y_stride, y_stride, w + r * w_stride, w_stride, rows, x, x_stride, n_x, n,
                          &none, none)
        r += rows


cdef bint _weighted_few(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                        const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    """k_weighted_rows for m <= 4 rows and x rows n floats apart (a kv
    head's span of the head-major cache): passes of FEW_PASS_ROWS x rows (in
    L1 while each 16 columns go over them in registers: _weighted_columns),
    the hints a pass and FEW_AHEAD_BYTES ahead, in the order of memory; the
    steps of _weighted_rows_pass. False, with nothing done, for other
    shapes."""
    cdef Py_ssize_t i = 0, k
    cdef const char* hint = <const char*> x + FEW_AHEAD_BYTES + FEW_PASS_ROWS * n * sizeof(float)
    cdef const char* end = <const char*> (x + n_x * n)
    if m > 4 or x_stride != n:
        return False
    while i < n_x:
        k = min(<Py_ssize_t> FEW_PASS_ROWS, n_x - i)
        _weighted_columns(y, y_stride, w + i, w_stride, m, x + i * n, n, k, n, &hint, end)
        i += k
    return True
