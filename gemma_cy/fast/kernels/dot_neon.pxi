# The quantized dot products and GEMVs with NEON intrinsics (module
# simd_neon, aarch64 only). The GEMVs run row after row, prefetching ahead.
#
# k_dot_i8: per 8 values, one 8-byte load (any alignment) widened int8 ->
# int16 -> 2 x int32 -> 2 x f32 and two FMAs; four independent accumulators
# (16 values per step).
#
# k_dot_q8_0: per block, the 32 products in two 4-lane chains, p0 taking the
# 4-value groups 0, 2, 4, 6 and p1 groups 1, 3, 5, 7 (the first of each a
# product, the rest FMAs), p = p0 + p1, then acc += f32(d) * p (one FMA; d
# converted by vcvt_f32_f16); even blocks into acc0, odd ones into acc1; the
# 4 lanes of acc0 + acc1 summed as (l0 + l2) + (l1 + l3). k_dot_q5_0: the
# same, each block's levels unpacked first (_block_levels).

cdef extern from "arm_neon.h" nogil:
    ctypedef struct int8x8_t:
        pass
    ctypedef struct int16x8_t:
        pass
    ctypedef struct int16x4_t:
        pass
    ctypedef struct int32x4_t:
        pass
    ctypedef struct float32x4_t:
        pass
    ctypedef struct uint16x4_t:
        pass
    ctypedef struct float16x4_t:
        pass
    int8x8_t vld1_s8(const int8_t* p)
    int16x8_t vmovl_s8(int8x8_t a)
    int16x4_t vget_low_s16(int16x8_t a)
    int16x4_t vget_high_s16(int16x8_t a)
    int32x4_t vmovl_s16(int16x4_t a)
    float32x4_t vcvtq_f32_s32(int32x4_t a)
    float32x4_t vld1q_f32(const float* p)
    float32x4_t vdupq_n_f32(float v)
    float32x4_t vfmaq_f32(float32x4_t acc, float32x4_t a, float32x4_t b)  # acc + a*b
    float32x4_t vaddq_f32(float32x4_t a, float32x4_t b)
    void vst1q_f32(float* p, float32x4_t a)
    float32x4_t vmulq_f32(float32x4_t a, float32x4_t b)
    uint16x4_t vdup_n_u16(uint16_t v)
    float16x4_t vreinterpret_f16_u16(uint16x4_t a)
    float32x4_t vcvt_f32_f16(float16x4_t a)


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef float32x4_t a0 = vdupq_n_f32(0)
    cdef float32x4_t a1 = vdupq_n_f32(0)
    cdef float32x4_t a2 = vdupq_n_f32(0)
    cdef float32x4_t a3 = vdupq_n_f32(0)
    cdef int16x8_t w
    cdef Py_ssize_t i = 0
    cdef float lanes[8]
    cdef float s
    while i + 16 <= n:
        w = vmovl_s8(vld1_s8(q + i))
        a0 = vfmaq_f32(a0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i))
        a1 = vfmaq_f32(a1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 4))
        w = vmovl_s8(vld1_s8(q + i + 8))
        a2 = vfmaq_f32(a2, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i + 8))
        a3 = vfmaq_f32(a3, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 12))
        i += 16
    if i + 8 <= n:
        w = vmovl_s8(vld1_s8(q + i))
        a0 = vfmaq_f32(a0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i))
        a1 = vfmaq_f32(a1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 4))
        i += 8
    vst1q_f32(lanes, vaddq_f32(a0, a2))
    vst1q_f32(lanes + 4, vaddq_f32(a1, a3))
    s = _sum8(lanes)
    while i < n:  # fewer than 8 left (see dot_avx2.pxi)
        s += q[i] * x[i]
        i += 1
    return s * scale


cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef void k_gemv_i8_resident(float* out, const int8_t* q, float scale, const float* x,
                             Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    _gemv_i8_rows(out, q, scale, x, rows, cols)


cdef inline float32x4_t _block_q8_0(float32x4_t acc, const uint8_t* block, const int8_t* q,
                                    const float* x) noexcept nogil:
    """acc + f32(d) * the block's 32 products with x[0:32], summed to 4 lanes:
    d at the block's byte 0, its levels at q (_block_levels)."""
    cdef float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(_load_u16(block))))
    cdef float32x4_t p0, p1
    cdef int16x8_t w = vmovl_s8(vld1_s8(q))
    p0 = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x))
    p1 = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + 4))
    w = vmovl_s8(vld1_s8(q + 8))
    p0 = vfmaq_f32(p0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + 8))
    p1 = vfmaq_f32(p1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + 12))
    w = vmovl_s8(vld1_s8(q + 16))
    p0 = vfmaq_f32(p0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + 16))
    p1 = vfmaq_f32(p1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + 20))
    w = vmovl_s8(vld1_s8(q + 24))
    p0 = vfmaq_f32(p0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + 24))
    p1 = vfmaq_f32(p1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + 28))
    return vfmaq_f32(acc, d, vaddq_f32(p0, p1))


cdef inline float _dot_blocks(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks,
                              bint q5_0) noexcept nogil:
    """k_dot_q8_0 (q5_0 False) or k_dot_q5_0 (each block's levels unpacked
    first): one loop for both layouts."""
    cdef float32x4_t acc0 = vdupq_n_f32(0)
    cdef float32x4_t acc1 = vdupq_n_f32(0)
    cdef Py_ssize_t k = 0, size = Q5_0_BYTES if q5_0 else Q8_0_BYTES
    cdef int8_t levels[64]
    cdef const uint8_t* b
    cdef float lanes[4]
    while k + 2 <= n_blocks:
        b = blocks + k * size
        acc0 = _block_q8_0(acc0, b, _block_levels(levels, b, q5_0), x + k * Q8_0_BLOCK)
        b = blocks + (k + 1) * size
        acc1 = _block_q8_0(acc1, b, _block_levels(levels + 32, b, q5_0), x + (k + 1) * Q8_0_BLOCK)
        k += 2
    if k < n_blocks:
        b = blocks + k * size
        acc0 = _block_q8_0(acc0, b, _block_levels(levels, b, q5_0), x + k * Q8_0_BLOCK)
    vst1q_f32(lanes, vaddq_f32(acc0, acc1))
    return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])


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
