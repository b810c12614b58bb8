# The quantized dot products and GEMVs in portable C, for the generic module
# (no -m flags); the GEMVs run row after row, prefetching ahead.
#
# k_dot_i8: 32 lane sums (four 8-wide accumulators), which let -O3 vectorize
# the loop with the baseline ISA (SSE2 on x86-64, NEON on arm64) without
# reassociating floats; short per-lane chains (n/32 terms) also keep the
# rounding error of long rows close to the SIMD modules'.

cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef float acc[32]
    cdef float lanes[8]
    cdef Py_ssize_t i = 0, j
    cdef float s
    for j in range(32):
        acc[j] = 0
    while i + 32 <= n:
        for j in range(32):
            acc[j] += q[i + j] * x[i + j]
        i += 32
    while i + 8 <= n:
        for j in range(8):
            acc[j] += q[i + j] * x[i + j]
        i += 8
    for j in range(8):  # (a0 + a1) + (a2 + a3), lane by lane
        lanes[j] = (acc[j] + acc[j + 8]) + (acc[j + 16] + acc[j + 24])
    s = _sum8(lanes)
    while i < n:
        s += q[i] * x[i]
        i += 1
    return s * scale


cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef void k_gemv_i8_resident(float* out, const int8_t* q, float scale, const float* x,
                             Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


# k_dot_q8_0: the AVX2 module's order, unfused, in 32 lane sums: the
# dequantized weight f32(q) * f32(d) (exact) times x, acc[8 g + j] taking
# column 8 g + j of every block in turn (one loop -O3 vectorizes); lanes[j] =
# (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j]); the f16 scale converted
# by k_f16_to_f32 (bit manipulation). k_dot_q5_0: the same, each block's
# levels unpacked first (_block_levels).

cdef inline float _dot_blocks(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks,
                              bint q5_0) noexcept nogil:
    """k_dot_q8_0 (q5_0 False) or k_dot_q5_0: one loop for both layouts."""
    cdef float acc[32]
    cdef float lanes[8]
    cdef float d
    cdef int8_t levels[32]
    cdef const int8_t* q
    cdef Py_ssize_t k, j
    for j in range(32):
        acc[j] = 0
    for k in range(n_blocks):
        d = _block_d(blocks)
        q = _block_levels(levels, blocks, q5_0)
        for j in range(32):
            acc[j] += (q[j] * d) * x[j]
        blocks += Q5_0_BYTES if q5_0 else Q8_0_BYTES
        x += Q8_0_BLOCK
    for j in range(8):
        lanes[j] = (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j])
    return _sum8(lanes)


cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    return _dot_blocks(blocks, x, n_blocks, False)


cdef float k_dot_q5_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    return _dot_blocks(blocks, x, n_blocks, True)


cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    _gemv_q8_0_rows(out, blocks, x, rows, n_blocks)


cdef Py_ssize_t k_gemm_scratch_floats(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    return 0  # _gemm needs none


cdef inline bint _gemm_takes_q5_0() noexcept nogil:
    """Q5_0 matrices reach _gemm converted to Q8_0 a tile of rows at a time (k_gemm)."""
    return False


cdef inline bint _gemm_takes_q4_k() noexcept nogil:
    """Q4_K matrices reach _gemm as affine records, a tile of rows at a time (k_gemm)."""
    return False


cdef inline bint _gemm_takes_q4_1() noexcept nogil:
    """Q4_1 matrices reach _gemm as affine records, a tile of rows at a time (k_gemm)."""
    return False


cdef void _gemv_q4_k(float* out, const QMatrix* w, const float* x) noexcept nogil:
    _gemv_q4_k_rows(out, w, x)  # (common.pxi)


cdef void _gemv_affine(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                       Py_ssize_t sub, bint has_offset) noexcept nogil:
    _gemv_affine_rows(out, rec, x, rows, cols, sub, has_offset)  # (common.pxi)


cdef void _gemv_q5_0(float* out, const QMatrix* w, const float* x) noexcept nogil:
    _gemv_q5_0_rows(out, w, x)  # (common.pxi)


cdef void _gemv_q4_1(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """k_matvec of a Q4_1 matrix: a tile of rows at a time as records, then
    their GEMV (_gemm_converted; no Q4_1 dot product of this module's own)."""
    _gemm_converted(out, w, x, NULL, NULL, 1, NULL)


cdef void _gemm_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                   float* scratch) noexcept nogil:
    _gemm_q8_by_rows(out, w, xq, xd, n_tokens)


cdef void _gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                float* scratch) noexcept nogil:
    _gemm_by_rows(out, w, x, n_tokens)


cdef inline void _scores8(float* out, const float* q, const float* keys, Py_ssize_t key_stride,
                          Py_ssize_t n) noexcept nogil:
    _scores8_portable(out, q, keys, key_stride, n)


cdef inline float _score(const float* q, const float* key, Py_ssize_t n) noexcept nogil:
    return _score_portable(q, key, n)


cdef inline void _weighted_rows_pass(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                                     const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    _weighted_rows_pass_portable(y, y_stride, w, w_stride, m, x, x_stride, n_x, n)


cdef float k_dot_affine(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                        bint has_offset) noexcept nogil:
    return _dot_affine_portable(rec, x, cols, sub, has_offset)


cdef float k_dot_q4_k(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil:
    return _dot_q4_k_portable(row, ab, x, cols)


cdef inline bint _scores_few(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                             const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys,
                             Py_ssize_t n) noexcept nogil:
    return False  # no decode variant here: k_scores' own loop


cdef inline bint _weighted_few(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                               const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    return False  # no decode variant here: k_weighted_rows' own passes
