# int8 activations (the opt-in "q8" mode) with AVX2 intrinsics, for the AVX2
# and AVX-512 modules (both are built with -mavx2 -mfma -mf16c); contracts in
# api.pxi, the portable version in q8_generic.pxi.
#
# Dot products, per block of 32 (llama.cpp's way): w (int8) and xq loaded
# once each; maddubs(|w| as uint8, xq with w's sign) gives 16 int16 pair
# sums (|pair| <= 2 * 128 * 127 < 2^15: no saturation, as |xq| <= 127), madd
# with ones 8 int32 lane sums. Several positions (prefill): rows run four
# at a time, each activation block loaded once for the four; the four rows'
# lanes are summed (exact integers) by hadds into one int32 per row,
# converted to f32 (exact: |isum| < 2^20), and added times the block's
# scale to the row's f32 sum by one FMA, block after block: the one order
# every module and the reference use, so q8 products agree bit for bit
# (api.pxi). One position (decode, k_dot_*_q8): one row at a time, its
# blocks reduced four at a time by the same hadds and their terms added in
# block order (rows streamed from DRAM four at once ran at ~4.6 GB/s: Gemma
# 3 decoded 15-16 tok/s in q8 mode against 25-28 row by row). Affine
# records of 16 (Q6_K...) pair up in one register per activation block
# (_dot_affine16_q8); a Q4_K row is read as stored at decode, two nibble
# sub-blocks per 32 bytes (_dot_q4_k_q8), no tile converted per call.

# The intrinsics are declared under q8_ names (C names in quotes) so that
# this file can sit next to either module's own declarations.

from libc.math cimport INFINITY, fmaf
from libc.stdint cimport int32_t

cdef extern from "immintrin.h" nogil:
    ctypedef struct q8_m256i "__m256i":
        pass
    ctypedef struct q8_m256 "__m256":
        pass
    ctypedef struct q8_m128 "__m128":
        pass
    ctypedef struct q8_m128i "__m128i":
        pass
    q8_m256i q8_hadd_epi32 "_mm256_hadd_epi32"(q8_m256i a, q8_m256i b)
    q8_m128i q8_castsi256_si128 "_mm256_castsi256_si128"(q8_m256i a)
    q8_m128i q8_extracti128_si256 "_mm256_extracti128_si256"(q8_m256i a, int imm)
    q8_m128i q8_add_epi32_128 "_mm_add_epi32"(q8_m128i a, q8_m128i b)
    q8_m128 q8_cvtepi32_ps128 "_mm_cvtepi32_ps"(q8_m128i a)
    q8_m128 q8_setzero_ps128 "_mm_setzero_ps"()
    q8_m128 q8_setr_ps128 "_mm_setr_ps"(float a0, float a1, float a2, float a3)
    q8_m128 q8_fmadd_ps128 "_mm_fmadd_ps"(q8_m128 a, q8_m128 b, q8_m128 c)
    q8_m256 q8_hadd_ps "_mm256_hadd_ps"(q8_m256 a, q8_m256 b)
    q8_m128 q8_castps256_ps128 "_mm256_castps256_ps128"(q8_m256 a)
    q8_m128 q8_extractf128_ps "_mm256_extractf128_ps"(q8_m256 a, int imm)
    q8_m128 q8_add_ps128 "_mm_add_ps"(q8_m128 a, q8_m128 b)
    q8_m128 q8_mul_ps128 "_mm_mul_ps"(q8_m128 a, q8_m128 b)
    q8_m128 q8_set1_ps128 "_mm_set1_ps"(float a)
    void q8_storeu_ps128 "_mm_storeu_ps"(float* p, q8_m128 a)
    q8_m256i q8_loadu_si256 "_mm256_loadu_si256"(const q8_m256i* p)
    void q8_storeu_si256 "_mm256_storeu_si256"(q8_m256i* p, q8_m256i a)
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
    q8_m128i q8_loadu_si128 "_mm_loadu_si128"(const void* p)
    q8_m256i q8_castsi128_si256 "_mm256_castsi128_si256"(q8_m128i a)
    q8_m256i q8_inserti128_si256 "_mm256_inserti128_si256"(q8_m256i a, q8_m128i b, int imm)
    q8_m256i q8_set1_epi8 "_mm256_set1_epi8"(char a)
    q8_m256i q8_srli_epi16 "_mm256_srli_epi16"(q8_m256i a, int imm)
    q8_m128i q8_srli_epi16_128 "_mm_srli_epi16"(q8_m128i a, int imm)


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
        q8_storeu_si256(<q8_m256i*> lanes, top)
        bits = lanes[0]
        for j in range(1, 8):
            if lanes[j] > bits:
                bits = lanes[j]
        memcpy(&amax, &bits, 4)
        scale = amax / <float> 127.0
        inv = <float> 1.0 / scale if scale != 0 else <float> 0.0
        if inv == INFINITY:  # a block so small that 1/d overflows: q = 0, as for d == 0
            inv = 0
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
        q8_storeu_si256(<q8_m256i*> q, q8_permutevar8x32_epi32(i0, order))
        x += Q8_0_BLOCK
        q += Q8_0_BLOCK


cdef inline q8_m256i _isum8_q8(const int8_t* w, q8_m256i xv, q8_m256i ones) noexcept nogil:
    """The 32 products w[i] * x[i] (x already loaded) as 8 exact int32 lane sums."""
    cdef q8_m256i wv = q8_loadu_si256(<const q8_m256i*> (w))
    return q8_madd_epi16(q8_maddubs_epi16(q8_sign_epi8(wv, wv), q8_sign_epi8(xv, wv)), ones)


cdef inline q8_m128 _isum_rows4(q8_m256i v0, q8_m256i v1, q8_m256i v2, q8_m256i v3) noexcept nogil:
    """The four rows' block sums (exact int32: the lane order does not
    matter), as four f32 lanes (exact: |sum| < 2^24)."""
    cdef q8_m256i h = q8_hadd_epi32(q8_hadd_epi32(v0, v1), q8_hadd_epi32(v2, v3))
    return q8_cvtepi32_ps128(q8_add_epi32_128(q8_castsi256_si128(h), q8_extracti128_si256(h, 1)))


cdef inline q8_m128 _dot4_i8_q8(const int8_t* w0, const int8_t* w1, const int8_t* w2, const int8_t* w3,
                                const int8_t* xq, const float* xd, Py_ssize_t n_blocks, float scale) noexcept nogil:
    """(acc = fma(f32(isum_b), xd[b], acc), block after block) * scale of
    four int8 rows with the same quantized activations: each activation
    block loaded once for the four rows, the rows' f32 sums in the four
    lanes of one register."""
    cdef q8_m256i ones = q8_set1_epi16(1), xv
    cdef q8_m128 acc = q8_setzero_ps128()
    cdef Py_ssize_t b, o
    for b in range(n_blocks):
        o = b * Q8_0_BLOCK
        xv = q8_loadu_si256(<const q8_m256i*> (xq + o))
        acc = q8_fmadd_ps128(_isum_rows4(_isum8_q8(w0 + o, xv, ones), _isum8_q8(w1 + o, xv, ones),
                                         _isum8_q8(w2 + o, xv, ones), _isum8_q8(w3 + o, xv, ones)),
                             q8_set1_ps128(xd[b]), acc)
    return q8_mul_ps128(acc, q8_set1_ps128(scale))


cdef inline float _scale_q8_0(const uint8_t* block, float xd) noexcept nogil:
    """f32(f32(d) * xd): a Q8_0 block's scale times the activation block's."""
    return _block_d(block) * xd


cdef inline q8_m128 _dot4_q8_0_q8(const uint8_t* b0, const uint8_t* b1, const uint8_t* b2, const uint8_t* b3,
                                  const int8_t* xq, const float* xd, Py_ssize_t n_blocks) noexcept nogil:
    """acc = fma(f32(isum_b), f32(f32(d_b) * xd[b]), acc), block after block,
    of four Q8_0 rows with the same quantized activations (as _dot4_i8_q8)."""
    cdef q8_m256i ones = q8_set1_epi16(1), xv
    cdef q8_m128 acc = q8_setzero_ps128()
    cdef float x_scale
    cdef Py_ssize_t b, o
    for b in range(n_blocks):
        xv = q8_loadu_si256(<const q8_m256i*> (xq + b * Q8_0_BLOCK))
        x_scale = xd[b]
        o = b * Q8_0_BYTES
        acc = q8_fmadd_ps128(
            _isum_rows4(_isum8_q8(<const int8_t*> (b0 + o + 2), xv, ones),
                        _isum8_q8(<const int8_t*> (b1 + o + 2), xv, ones),
                        _isum8_q8(<const int8_t*> (b2 + o + 2), xv, ones),
                        _isum8_q8(<const int8_t*> (b3 + o + 2), xv, ones)),
            q8_setr_ps128(_scale_q8_0(b0 + o, x_scale), _scale_q8_0(b1 + o, x_scale),
                          _scale_q8_0(b2 + o, x_scale), _scale_q8_0(b3 + o, x_scale)), acc)
    return acc


cdef inline float _add_blocks4(float acc, q8_m128 isums, const float* s) noexcept nogil:
    """Four consecutive blocks' terms added one after the other, each by one
    FMA: acc = fma(isum_k, s[k], acc), k = 0..3."""
    cdef float t[4]
    q8_storeu_ps128(t, isums)
    return fmaf(t[3], s[3], fmaf(t[2], s[2], fmaf(t[1], s[1], fmaf(t[0], s[0], acc))))


cdef inline float _row_sum_q8(const uint8_t* w, bint q8_0_blocks, const int8_t* xq, const float* xd,
                               Py_ssize_t n_blocks) noexcept nogil:
    """acc = fma(f32(isum_b), s_b, acc) over one row, block after block, in f32.
    q8_0_blocks: w is Q8_0 blocks and s_b = f32(f32(d_b) * xd[b]); else w is
    int8 runs of 32 and s_b = xd[b] (the tensor's scale comes after).
    Four blocks at a time: their integer sums reduced together (_isum_rows4),
    their terms then added in block order."""
    cdef Py_ssize_t stride = Q8_0_BYTES if q8_0_blocks else Q8_0_BLOCK
    cdef Py_ssize_t at = 2 if q8_0_blocks else 0  # the int8 values' offset in a block
    cdef q8_m256i ones = q8_set1_epi16(1), x0, x1, x2, x3
    cdef float scales[4]
    cdef float acc = 0
    cdef float t[4]
    cdef Py_ssize_t b = 0, k
    cdef const uint8_t* blk
    while b + 4 <= n_blocks:
        blk = w + b * stride
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + b * Q8_0_BLOCK))
        x1 = q8_loadu_si256(<const q8_m256i*> (xq + (b + 1) * Q8_0_BLOCK))
        x2 = q8_loadu_si256(<const q8_m256i*> (xq + (b + 2) * Q8_0_BLOCK))
        x3 = q8_loadu_si256(<const q8_m256i*> (xq + (b + 3) * Q8_0_BLOCK))
        for k in range(4):
            scales[k] = _scale_q8_0(blk + k * stride, xd[b + k]) if q8_0_blocks else xd[b + k]
        acc = _add_blocks4(acc, _isum_rows4(_isum8_q8(<const int8_t*> (blk + at), x0, ones),
                                            _isum8_q8(<const int8_t*> (blk + stride + at), x1, ones),
                                            _isum8_q8(<const int8_t*> (blk + 2 * stride + at), x2, ones),
                                            _isum8_q8(<const int8_t*> (blk + 3 * stride + at), x3, ones)),
                           scales)
        b += 4
    while b < n_blocks:  # the last < 4 blocks, one at a time
        blk = w + b * stride
        x1 = _isum8_q8(<const int8_t*> (blk + at), q8_loadu_si256(<const q8_m256i*> (xq + b * Q8_0_BLOCK)), ones)
        q8_storeu_ps128(t, _isum_rows4(x1, x1, x1, x1))
        acc = fmaf(t[0], _scale_q8_0(blk, xd[b]) if q8_0_blocks else xd[b], acc)
        b += 1
    return acc


cdef float k_dot_i8_q8(const int8_t* w, const int8_t* xq, const float* xd, Py_ssize_t n_blocks,
                       float scale) noexcept nogil:
    return _row_sum_q8(<const uint8_t*> w, False, xq, xd, n_blocks) * scale


cdef float k_dot_q8_0_q8(const uint8_t* blocks, const int8_t* xq, const float* xd,
                         Py_ssize_t n_blocks) noexcept nogil:
    return _row_sum_q8(blocks, True, xq, xd, n_blocks)


cdef inline int32_t _hsum_epi32(q8_m256i v) noexcept nogil:
    """The sum of 8 int32 lanes (exact: the order does not matter)."""
    cdef q8_m128i h = q8_add_epi32_128(q8_castsi256_si128(v), q8_extracti128_si256(v, 1))
    cdef int32_t lanes[4]
    memcpy(lanes, &h, 16)
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


cdef float _dot_affine32_q8(const uint8_t* rec, const int8_t* xq, const float* xd, Py_ssize_t cols,
                            bint has_offset) noexcept nogil:
    """k_dot_affine_q8 for records of 32 values (Q4_1, Q5_1, Q4_K, Q5_K):
    each record's exact integer sums by maddubs/madd, two records' sums (and
    sums of xq) reduced together (_isum_rows4), then the f32 FMAs in the
    portable loop's order (kernels/common.pxi), so the same number."""
    cdef q8_m256i ones = q8_set1_epi16(1), unit = q8_set1_epi8(1), x0, x1, i0, i1
    cdef float acc = 0
    cdef float t[4]
    cdef float d0, d1
    cdef Py_ssize_t rb = 32 + 4 + (4 if has_offset else 0), b = 0, nb = cols // 32
    while b + 2 <= nb:
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        x1 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b + 32))
        d0 = xd[b]
        d1 = xd[b + 1]
        i0 = _isum8_q8(<const int8_t*> rec, x0, ones)
        i1 = _isum8_q8(<const int8_t*> (rec + rb), x1, ones)
        if has_offset:  # terms: isum0 a0 d0, -qsum0 b0 d0, isum1 a1 d1, -qsum1 b1 d1
            q8_storeu_ps128(t, _isum_rows4(i0, q8_madd_epi16(q8_maddubs_epi16(unit, x0), ones),
                                           i1, q8_madd_epi16(q8_maddubs_epi16(unit, x1), ones)))
            acc = fmaf(t[0], _load_f32(rec + 32) * d0, acc)
            acc = fmaf(-t[1], _load_f32(rec + 36) * d0, acc)
            acc = fmaf(t[2], _load_f32(rec + rb + 32) * d1, acc)
            acc = fmaf(-t[3], _load_f32(rec + rb + 36) * d1, acc)
        else:
            q8_storeu_ps128(t, _isum_rows4(i0, i1, i0, i1))
            acc = fmaf(t[0], _load_f32(rec + 32) * d0, acc)
            acc = fmaf(t[1], _load_f32(rec + rb + 32) * d1, acc)
        rec += 2 * rb
        b += 2
    if b < nb:  # an odd last record
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        d0 = xd[b]
        acc = fmaf(<float> _hsum_epi32(_isum8_q8(<const int8_t*> rec, x0, ones)), _load_f32(rec + 32) * d0, acc)
        if has_offset:
            acc = fmaf(<float> -_hsum_epi32(q8_madd_epi16(q8_maddubs_epi16(unit, x0), ones)),
                       _load_f32(rec + 36) * d0, acc)
    return acc


cdef enum:
    QSUM_BLOCKS = 1024  # activation blocks whose sums _gemv_affine32_q8 keeps on the stack (32768 columns)


cdef void _dot2_affine32_q8(float* out, const uint8_t* rec0, const uint8_t* rec1, const int8_t* xq,
                            const float* xd, const float* qsum, Py_ssize_t cols, bint has_offset) noexcept nogil:
    """out[0:2] = _dot_affine32_q8 of the rows of records rec0 and rec1, bit
    for bit: each pair of activation blocks loaded once for both rows, the
    four records' integer sums reduced together (_isum_rows4), the sums of
    xq per block (``qsum``, exact) worked out once per call of
    _gemv_affine32_q8, not once per row; each row's f32 FMAs in its own
    order, the two chains side by side (one row's chain of dependent FMAs
    bound the single-row kernel)."""
    cdef q8_m256i ones = q8_set1_epi16(1), x0, x1
    cdef float acc0 = 0, acc1 = 0
    cdef float t[4]
    cdef float d0, d1
    cdef Py_ssize_t rb = 32 + 4 + (4 if has_offset else 0), b = 0, nb = cols // 32
    while b + 2 <= nb:
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        x1 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b + 32))
        d0 = xd[b]
        d1 = xd[b + 1]
        q8_storeu_ps128(t, _isum_rows4(_isum8_q8(<const int8_t*> rec0, x0, ones),
                                       _isum8_q8(<const int8_t*> (rec0 + rb), x1, ones),
                                       _isum8_q8(<const int8_t*> rec1, x0, ones),
                                       _isum8_q8(<const int8_t*> (rec1 + rb), x1, ones)))
        acc0 = fmaf(t[0], _load_f32(rec0 + 32) * d0, acc0)
        acc1 = fmaf(t[2], _load_f32(rec1 + 32) * d0, acc1)
        if has_offset:  # _dot_affine32_q8's terms: isum0 a0 d0, -qsum0 b0 d0, isum1 a1 d1, -qsum1 b1 d1
            acc0 = fmaf(-qsum[b], _load_f32(rec0 + 36) * d0, acc0)
            acc1 = fmaf(-qsum[b], _load_f32(rec1 + 36) * d0, acc1)
        acc0 = fmaf(t[1], _load_f32(rec0 + rb + 32) * d1, acc0)
        acc1 = fmaf(t[3], _load_f32(rec1 + rb + 32) * d1, acc1)
        if has_offset:
            acc0 = fmaf(-qsum[b + 1], _load_f32(rec0 + rb + 36) * d1, acc0)
            acc1 = fmaf(-qsum[b + 1], _load_f32(rec1 + rb + 36) * d1, acc1)
        rec0 += 2 * rb
        rec1 += 2 * rb
        b += 2
    if b < nb:  # an odd last record
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        d0 = xd[b]
        acc0 = fmaf(<float> _hsum_epi32(_isum8_q8(<const int8_t*> rec0, x0, ones)), _load_f32(rec0 + 32) * d0, acc0)
        acc1 = fmaf(<float> _hsum_epi32(_isum8_q8(<const int8_t*> rec1, x0, ones)), _load_f32(rec1 + 32) * d0, acc1)
        if has_offset:
            acc0 = fmaf(-qsum[b], _load_f32(rec0 + 36) * d0, acc0)
            acc1 = fmaf(-qsum[b], _load_f32(rec1 + 36) * d0, acc1)
    out[0] = acc0
    out[1] = acc1


cdef bint _gemv_affine32_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd) noexcept nogil:
    """One position (decode) of an affine matrix of records of 32 in the q8
    mode: rows two at a time (_dot2_affine32_q8), an odd last one by
    _dot_affine32_q8, prefetching ahead. False (nothing written) for rows
    longer than QSUM_BLOCKS blocks."""
    cdef q8_m256i ones = q8_set1_epi16(1), unit = q8_set1_epi8(1)
    cdef float qsum[QSUM_BLOCKS]
    cdef Py_ssize_t nb = w.cols // 32, b, r = 0, row_bytes = _affine_row_bytes(w)
    if nb > QSUM_BLOCKS:
        return False
    for b in range(nb):  # sum xq over each block: exact integers
        qsum[b] = <float> _hsum_epi32(q8_madd_epi16(q8_maddubs_epi16(
            unit, q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))), ones))
    while r + 2 <= w.rows:
        if not w.resident:
            _prefetch_row(w.blocks + r * row_bytes, 2 * row_bytes)
        _dot2_affine32_q8(out + r, w.blocks + r * row_bytes, w.blocks + (r + 1) * row_bytes, xq, xd, qsum,
                          w.cols, w.has_offset)
        r += 2
    if r < w.rows:
        out[r] = _dot_affine32_q8(w.blocks + r * row_bytes, xq, xd, w.cols, w.has_offset)
    return True


cdef inline q8_m256i _q4_1_levels_q8(const uint8_t* block, q8_m256i m15) noexcept nogil:
    """The 32 levels of one Q4_1 block (api.pxi) as uint8, in value order:
    the low nibbles of qs, then the high ones (its record's levels)."""
    cdef q8_m128i qs = q8_loadu_si128(block + 4)
    return q8_and_si256(q8_inserti128_si256(q8_castsi128_si256(qs), q8_srli_epi16_128(qs, 4), 1), m15)


cdef inline q8_m256i _isum_u8_q8(q8_m256i levels, q8_m256i xv, q8_m256i ones) noexcept nogil:
    """32 products of uint8 levels (< 128) and xq as 8 exact int32 lane sums."""
    return q8_madd_epi16(q8_maddubs_epi16(levels, xv), ones)


cdef void _dot2_q4_1_q8(float* out, const uint8_t* row0, const uint8_t* row1, const int8_t* xq,
                        const float* xd, const float* qsum, Py_ssize_t n_blocks) noexcept nogil:
    """out[0:2] = _dot2_affine32_q8 of the records of the Q4_1 rows row0 and
    row1, bit for bit, straight from the blocks: the levels unpacked in
    registers (unsigned, so maddubs takes them as they are: the same exact
    sums), a = f32(d) and b = -f32(m) read from each block's f16 (the
    records' f32, so the same f32 FMAs in the same order)."""
    cdef q8_m256i ones = q8_set1_epi16(1), m15 = q8_set1_epi8(15), x0, x1
    cdef float acc0 = 0, acc1 = 0
    cdef float t[4]
    cdef float d0, d1
    cdef Py_ssize_t b = 0
    cdef const uint8_t* c0
    cdef const uint8_t* c1
    while b + 2 <= n_blocks:
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        x1 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b + 32))
        d0 = xd[b]
        d1 = xd[b + 1]
        c0 = row0 + b * Q4_1_BYTES
        c1 = row1 + b * Q4_1_BYTES
        q8_storeu_ps128(t, _isum_rows4(_isum_u8_q8(_q4_1_levels_q8(c0, m15), x0, ones),
                                       _isum_u8_q8(_q4_1_levels_q8(c0 + Q4_1_BYTES, m15), x1, ones),
                                       _isum_u8_q8(_q4_1_levels_q8(c1, m15), x0, ones),
                                       _isum_u8_q8(_q4_1_levels_q8(c1 + Q4_1_BYTES, m15), x1, ones)))
        acc0 = fmaf(-qsum[b], -_block_d(c0 + 2) * d0, fmaf(t[0], _block_d(c0) * d0, acc0))
        acc1 = fmaf(-qsum[b], -_block_d(c1 + 2) * d0, fmaf(t[2], _block_d(c1) * d0, acc1))
        acc0 = fmaf(-qsum[b + 1], -_block_d(c0 + Q4_1_BYTES + 2) * d1, fmaf(t[1], _block_d(c0 + Q4_1_BYTES) * d1, acc0))
        acc1 = fmaf(-qsum[b + 1], -_block_d(c1 + Q4_1_BYTES + 2) * d1, fmaf(t[3], _block_d(c1 + Q4_1_BYTES) * d1, acc1))
        b += 2
    if b < n_blocks:  # an odd last block
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        d0 = xd[b]
        c0 = row0 + b * Q4_1_BYTES
        c1 = row1 + b * Q4_1_BYTES
        acc0 = fmaf(<float> _hsum_epi32(_isum_u8_q8(_q4_1_levels_q8(c0, m15), x0, ones)), _block_d(c0) * d0, acc0)
        acc1 = fmaf(<float> _hsum_epi32(_isum_u8_q8(_q4_1_levels_q8(c1, m15), x0, ones)), _block_d(c1) * d0, acc1)
        acc0 = fmaf(-qsum[b], -_block_d(c0 + 2) * d0, acc0)
        acc1 = fmaf(-qsum[b], -_block_d(c1 + 2) * d0, acc1)
    out[0] = acc0
    out[1] = acc1


cdef inline bint _q8_gemv_takes_q4_1() noexcept nogil:
    """The q8 mode's decode reads Q4_1 matrices as stored here (_gemv_q4_1_q8)."""
    return True


cdef bint _gemv_q4_1_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd) noexcept nogil:
    """One position (decode) of a Q4_1 matrix in the q8 mode, as stored:
    rows two at a time (_dot2_q4_1_q8), an odd last one paired with itself;
    _gemv_affine32_q8's bits. False (nothing written) for rows longer than
    QSUM_BLOCKS blocks."""
    cdef q8_m256i ones = q8_set1_epi16(1), unit = q8_set1_epi8(1)
    cdef float qsum[QSUM_BLOCKS]
    cdef float pair[2]
    cdef Py_ssize_t nb = w.cols // 32, b, r = 0, row_bytes = nb * Q4_1_BYTES
    if nb > QSUM_BLOCKS:
        return False
    for b in range(nb):  # sum xq over each block: exact integers
        qsum[b] = <float> _hsum_epi32(q8_madd_epi16(q8_maddubs_epi16(
            unit, q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))), ones))
    while r + 2 <= w.rows:
        if not w.resident:
            _prefetch_row(w.blocks + r * row_bytes, 2 * row_bytes)
        _dot2_q4_1_q8(out + r, w.blocks + r * row_bytes, w.blocks + (r + 1) * row_bytes, xq, xd, qsum, nb)
        r += 2
    if r < w.rows:
        _dot2_q4_1_q8(pair, w.blocks + r * row_bytes, w.blocks + r * row_bytes, xq, xd, qsum, nb)
        out[r] = pair[0]
    return True


cdef inline q8_m256i _record_pair_sums(q8_m256i v, q8_m256i ones) noexcept nogil:
    """The int16 pair sums v (16 of them, record 0 in the low 128-bit lane,
    record 1 in the high) as int32 sums of each lane: lane 0 holds record
    0's, lane 4 record 1's (exact integers)."""
    v = q8_madd_epi16(v, ones)
    v = q8_hadd_epi32(v, v)
    return q8_hadd_epi32(v, v)


cdef float _dot_affine16_q8(const uint8_t* rec, const int8_t* xq, const float* xd, Py_ssize_t cols,
                            bint has_offset) noexcept nogil:
    """k_dot_affine_q8 for records of 16 values (Q6_K, Q2_K, Q3_K): the two
    records of each block of 32 activations side by side in one register,
    their exact integer sums (and, with an offset, sum xq over each) by
    maddubs/madd, then the f32 FMAs in the portable loop's order
    (kernels/common.pxi), so the same number."""
    cdef q8_m256i ones = q8_set1_epi16(1), unit = q8_set1_epi8(1), xv, wv, isums, qsums
    cdef float acc = 0
    cdef int32_t isum[8]
    cdef int32_t qsum[8]
    cdef float d
    cdef Py_ssize_t rb = 16 + 4 + (4 if has_offset else 0), b
    for b in range(cols // 32):
        xv = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        wv = q8_inserti128_si256(q8_castsi128_si256(q8_loadu_si128(rec)), q8_loadu_si128(rec + rb), 1)
        isums = _record_pair_sums(q8_maddubs_epi16(q8_sign_epi8(wv, wv), q8_sign_epi8(xv, wv)), ones)
        q8_storeu_si256(<q8_m256i*> isum, isums)
        d = xd[b]
        acc = fmaf(<float> isum[0], _load_f32(rec + 16) * d, acc)
        if has_offset:
            qsums = _record_pair_sums(q8_maddubs_epi16(unit, xv), ones)
            q8_storeu_si256(<q8_m256i*> qsum, qsums)
            acc = fmaf(<float> -qsum[0], _load_f32(rec + 20) * d, acc)
        acc = fmaf(<float> isum[4], _load_f32(rec + rb + 16) * d, acc)
        if has_offset:
            acc = fmaf(<float> -qsum[4], _load_f32(rec + rb + 20) * d, acc)
        rec += 2 * rb
    return acc


cdef float _dot_q4_k_q8(const uint8_t* row, const float* ab, const int8_t* xq, const float* xd,
                        Py_ssize_t cols) noexcept nogil:
    """k_dot_affine_q8 of a Q4_K row read as stored: sub-blocks 2 j and
    2 j + 1 are the low and high nibbles of the same 32 bytes, their a and b
    the row's ab[4 j .. 4 j + 3] (the records _gemm_converted would make,
    so the same FMAs in the same order). The levels are 0..15, so maddubs
    takes them as they are, unsigned; the pair's two integer sums and two
    sums of xq are reduced together (_isum_rows4)."""
    cdef q8_m256i ones = q8_set1_epi16(1), unit = q8_set1_epi8(1), m15 = q8_set1_epi8(15), x0, x1, y
    cdef float acc = 0
    cdef float t[4]
    cdef float d0, d1
    cdef Py_ssize_t b
    for b in range(0, cols // 32, 2):
        y = q8_loadu_si256(<const q8_m256i*> _q4_k_qs(row, b // 2))
        x0 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b))
        x1 = q8_loadu_si256(<const q8_m256i*> (xq + 32 * b + 32))
        d0 = xd[b]
        d1 = xd[b + 1]
        q8_storeu_ps128(t, _isum_rows4(q8_madd_epi16(q8_maddubs_epi16(q8_and_si256(y, m15), x0), ones),
                                       q8_madd_epi16(q8_maddubs_epi16(unit, x0), ones),
                                       q8_madd_epi16(q8_maddubs_epi16(q8_and_si256(q8_srli_epi16(y, 4), m15), x1),
                                                     ones),
                                       q8_madd_epi16(q8_maddubs_epi16(unit, x1), ones)))
        acc = fmaf(t[0], ab[2 * b] * d0, acc)  # isum a d, then -qsum b d, of each sub-block
        acc = fmaf(-t[1], ab[2 * b + 1] * d0, acc)
        acc = fmaf(t[2], ab[2 * b + 2] * d1, acc)
        acc = fmaf(-t[3], ab[2 * b + 3] * d1, acc)
    return acc


cdef void _gemv_q4_k_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd) noexcept nogil:
    """One position (decode) of a Q4_K matrix in the q8 mode, row after row
    as stored (_dot_q4_k_q8), prefetching ahead: no tile converted per call."""
    cdef Py_ssize_t r, row_bytes = w.cols // Q4_K_BLOCK * Q4_K_BYTES, nb = w.cols // 32
    for r in range(w.rows):
        if not w.resident:
            _prefetch_row(w.blocks + r * row_bytes, row_bytes)
        out[r] = _dot_q4_k_q8(w.blocks + r * row_bytes, w.ab + r * nb * 2, xq, xd, w.cols)


cdef void _dot_rows_q8(float* out, const QMatrix* w, Py_ssize_t row, Py_ssize_t n_rows,
                       const int8_t* xq, const float* xd) noexcept nogil:
    """out[i] = k_dot_*_q8 of row row + i of w, i < n_rows <= 4, bit for bit:
    four rows in one pass (each activation block loaded once for the four),
    fewer than four one at a time (the decode GEMV calls it row by row)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, i
    cdef Py_ssize_t row_bytes = nb * Q8_0_BYTES
    cdef float sums[4]
    if w.layout == QLAYOUT_AFFINE:  # row by row
        for i in range(n_rows):
            if w.sub == 32:
                out[i] = _dot_affine32_q8(w.blocks + (row + i) * _affine_row_bytes(w), xq, xd, w.cols, w.has_offset)
            elif w.sub == 16:
                out[i] = _dot_affine16_q8(w.blocks + (row + i) * _affine_row_bytes(w), xq, xd, w.cols, w.has_offset)
            else:
                out[i] = k_dot_affine_q8(w.blocks + (row + i) * _affine_row_bytes(w), xq, xd, w.cols, w.sub,
                                         w.has_offset)
        return
    if n_rows < 4:
        for i in range(n_rows):
            if w.layout == QLAYOUT_I8_TENSOR:
                out[i] = k_dot_i8_q8(w.q + (row + i) * w.cols, xq, xd, nb, w.scale)
            else:
                out[i] = k_dot_q8_0_q8(w.blocks + (row + i) * row_bytes, xq, xd, nb)
        return
    if w.layout == QLAYOUT_I8_TENSOR:
        q8_storeu_ps128(sums, _dot4_i8_q8(w.q + row * w.cols, w.q + (row + 1) * w.cols, w.q + (row + 2) * w.cols,
                                          w.q + (row + 3) * w.cols, xq, xd, nb, w.scale))
    else:
        q8_storeu_ps128(sums, _dot4_q8_0_q8(w.blocks + row * row_bytes, w.blocks + (row + 1) * row_bytes,
                                            w.blocks + (row + 2) * row_bytes, w.blocks + (row + 3) * row_bytes,
                                            xq, xd, nb))
    for i in range(4):
        out[i] = sums[i]


# Panels of PANEL_ROWS rows for the q8 GEMMs that keep one row per 32-bit
# lane (q8_vnni.pxi with 512-bit vectors, q8_avx2.pxi with two 256-bit
# vectors of 8 rows): what both read of a matrix, block by block. Each
# module lays the levels out for its own product instructions.

cdef enum:
    PANEL_ROWS = 16  # rows per panel


cdef struct PanelRows:
    Py_ssize_t row_of[16]  # the matrix row each panel row reads (the last row again past the end)
    const uint8_t* rows[16]  # where those rows start, as stored


cdef inline Py_ssize_t _panel_record(const QMatrix* w) noexcept nogil:
    """Values per record of w's q8 products: 16 for affine records of 16, else 32."""
    return 16 if w.layout == QLAYOUT_AFFINE and w.sub == 16 else 32


cdef inline bint _panel_offset(const QMatrix* w) noexcept nogil:
    """True when w's records carry an offset b (some affine types; every Q4_K)."""
    return (w.layout == QLAYOUT_AFFINE or w.layout == QLAYOUT_Q4_K) and w.has_offset


cdef inline bint _panel_layout(const QMatrix* w) noexcept nogil:
    """True for the layouts _panel_block reads."""
    return (w.layout == QLAYOUT_I8_TENSOR or w.layout == QLAYOUT_Q8_0 or w.layout == QLAYOUT_AFFINE
            or w.layout == QLAYOUT_Q4_K)


cdef inline Py_ssize_t _panel_row_bytes(const QMatrix* w) noexcept nogil:
    """Bytes of one row of w as stored (any layout the q8 mode runs)."""
    if w.layout == QLAYOUT_I8_TENSOR:
        return w.cols
    if w.layout == QLAYOUT_Q8_0:
        return w.cols // 32 * Q8_0_BYTES
    if w.layout == QLAYOUT_Q4_K:
        return w.cols // Q4_K_BLOCK * Q4_K_BYTES
    if w.layout == QLAYOUT_Q4_1:
        return w.cols // 32 * Q4_1_BYTES
    if w.layout == QLAYOUT_Q5_0:
        return w.cols // 32 * Q5_0_BYTES
    return _affine_row_bytes(w)


cdef inline const uint8_t* _panel_row(const QMatrix* w, Py_ssize_t r) noexcept nogil:
    """Row r of w as stored."""
    return (<const uint8_t*> w.q if w.layout == QLAYOUT_I8_TENSOR else w.blocks) + r * _panel_row_bytes(w)


cdef void _prefetch_panel(const QMatrix* w, Py_ssize_t r0) noexcept nogil:
    """Hints for every line of rows r0 .. r0 + 15 (and their Q4_K a, b): the
    next panel, read from DRAM while this one is multiplied."""
    cdef Py_ssize_t row_bytes = _panel_row_bytes(w), r, at
    cdef const uint8_t* row
    for r in range(r0, min(r0 + PANEL_ROWS, w.rows)):
        row = _panel_row(w, r)
        for at in range(0, row_bytes, 64):
            __builtin_prefetch(row + at)
        if w.layout == QLAYOUT_Q4_K:
            for at in range(0, w.cols // 32 * 2, 16):
                __builtin_prefetch(w.ab + r * (w.cols // 32) * 2 + at)


cdef inline void _panel_rows(PanelRows* p, const QMatrix* w, Py_ssize_t r0) noexcept nogil:
    """The rows of the panel that starts at row r0; rows past the last are
    copies of it (computed, never stored)."""
    cdef Py_ssize_t i, r
    for i in range(PANEL_ROWS):
        r = min(r0 + i, w.rows - 1)
        p.row_of[i] = r
        p.rows[i] = _panel_row(w, r)


cdef void _panel_block(q8_m256i* y, float* sc, const QMatrix* w, const PanelRows* p, Py_ssize_t b) noexcept nogil:
    """Block b (32 values) of the panel's 16 rows: y[i] = row i's 32 levels
    (int8; an affine record of 16 in each 128-bit half), and their scales as
    vectors of 16 f32 at sc: a (f32(d) of a Q8_0 block, 1 for int8 rows, a
    of an affine record), then for records of 16 the second record's a; then,
    with an offset, b (and the second record's b)."""
    cdef Py_ssize_t nb = w.cols // 32, i
    cdef Py_ssize_t rb = w.sub + 4 + (4 if w.has_offset else 0)
    cdef bint offset = _panel_offset(w)
    cdef q8_m256i m15 = q8_set1_epi8(15)
    cdef const uint8_t* at
    cdef const float* ab
    if w.layout == QLAYOUT_I8_TENSOR:
        for i in range(PANEL_ROWS):
            y[i] = q8_loadu_si256(<const q8_m256i*> (p.rows[i] + 32 * b))
            sc[i] = 1  # s = f32(1 * xd) = xd; the tensor's scale comes after the sum
    elif w.layout == QLAYOUT_Q8_0:
        for i in range(PANEL_ROWS):
            at = p.rows[i] + b * Q8_0_BYTES
            y[i] = q8_loadu_si256(<const q8_m256i*> (at + 2))
            sc[i] = _block_d(at)  # f32(d): exact, every f16 is an f32
    elif w.layout == QLAYOUT_Q4_K:  # sub-block b: the low or high nibbles of 32 bytes
        for i in range(PANEL_ROWS):
            y[i] = q8_loadu_si256(<const q8_m256i*> _q4_k_qs(p.rows[i], b // 2))
            if b % 2:
                y[i] = q8_srli_epi16(y[i], 4)
            y[i] = q8_and_si256(y[i], m15)
            ab = w.ab + (p.row_of[i] * nb + b) * 2
            sc[i] = ab[0]
            sc[16 + i] = ab[1]
    elif w.layout == QLAYOUT_Q5_0:  # its Q8_0 conversion's levels and f32(d)
        for i in range(PANEL_ROWS):
            at = p.rows[i] + b * Q5_0_BYTES
            _q5_0_levels(<int8_t*> &y[i], at)
            sc[i] = _block_d(at)
    elif w.layout == QLAYOUT_Q4_1:  # as _q4_1_record: a = f32(d), b = -f32(m); low nibbles first
        for i in range(PANEL_ROWS):
            at = p.rows[i] + b * Q4_1_BYTES
            y[i] = _q4_1_levels_q8(at, m15)
            sc[i] = _block_d(at)
            sc[16 + i] = -_block_d(at + 2)
    elif _panel_record(w) == 16:  # two records
        for i in range(PANEL_ROWS):
            at = p.rows[i] + 2 * b * rb
            y[i] = q8_inserti128_si256(q8_castsi128_si256(q8_loadu_si128(at)), q8_loadu_si128(at + rb), 1)
            sc[i] = _load_f32(at + 16)
            sc[16 + i] = _load_f32(at + rb + 16)
            if offset:
                sc[32 + i] = _load_f32(at + 20)
                sc[48 + i] = _load_f32(at + rb + 20)
    else:
        for i in range(PANEL_ROWS):
            at = p.rows[i] + b * rb
            y[i] = q8_loadu_si256(<const q8_m256i*> at)
            sc[i] = _load_f32(at + 32)
            if offset:
                sc[16 + i] = _load_f32(at + 36)


# A batch's decode step in the q8 mode (a few positions, each of another
# sequence): the panels below repack every row into scratch per call, which
# a prefill block of 64 positions repays and 2 do not (decoding 2 sequences
# together ran slower than one). Up to Q8_ROW_POSITIONS positions, a Q8_0
# matrix is read row after row, as the decode GEMV streams it, and each row
# is multiplied with every position while it is in L1: each result is
# k_dot_q8_0_q8, the GEMV's own product. The avx512 module takes 3 to 16
# positions with the positions in vector lanes instead (_q8_0_positions,
# q8_vnni_positions.pxi; the avx2 module's says no).
cdef enum:
    Q8_ROW_POSITIONS = 4


cdef void _rows_q8_positions(float* out, const QMatrix* w, const int8_t* xq, const float* xd,
                             Py_ssize_t n_tokens) noexcept nogil:
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, row_bytes = nb * Q8_0_BYTES, r, t
    for r in range(w.rows):
        _prefetch_row(w.blocks + r * row_bytes, row_bytes)
        for t in range(n_tokens):
            out[t * w.rows + r] = k_dot_q8_0_q8(w.blocks + r * row_bytes, xq + t * w.cols, xd + t * nb, nb)


cdef void _gemm_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                   float* scratch) noexcept nogil:
    """The x86 modules' k_gemm_q8: panels for a block of positions (each
    module's _gemm_q8_panels: q8_avx2.pxi, q8_vnni.pxi; panels stored at
    load, _gemm_q8_stored: q8_vnni.pxi; a batch's few
    positions through a Q8_0 matrix row after row, _q8_0_positions where the
    module has it, else _rows_q8_positions; a Q5_0 matrix a tile
    of rows at a time converted to Q8_0, _gemm_converted); one position
    (decode: rows streamed from DRAM) row after row (a Q4_K matrix as
    stored, _gemv_q4_k_q8; records of 32 two rows at a time,
    _gemv_affine32_q8), and so is any other layout _panel_block does not
    read."""
    if _stored_panels(w):
        _gemm_q8_stored(out, w, xq, xd, n_tokens, <uint8_t*> scratch)
    elif w.layout == QLAYOUT_Q4_K and n_tokens == 1:
        _gemv_q4_k_q8(out, w, xq, xd)
    elif w.layout == QLAYOUT_AFFINE and w.sub == 32 and n_tokens == 1 and _gemv_affine32_q8(out, w, xq, xd):
        pass
    elif w.layout == QLAYOUT_Q4_1 and n_tokens == 1 and _gemv_q4_1_q8(out, w, xq, xd):
        pass
    elif w.layout == QLAYOUT_Q8_0 and _q8_0_positions(out, w, xq, xd, n_tokens, scratch):
        pass
    elif w.layout == QLAYOUT_Q8_0 and 2 <= n_tokens <= Q8_ROW_POSITIONS:
        _rows_q8_positions(out, w, xq, xd, n_tokens)
    elif (w.layout == QLAYOUT_Q5_0 or w.layout == QLAYOUT_Q4_1) and n_tokens >= 2 and scratch != NULL:
        _gemm_converted(out, w, NULL, xq, xd, n_tokens, scratch)
    elif n_tokens < 2 or scratch == NULL or not _panel_layout(w):
        _gemm_q8_by_rows(out, w, xq, xd, n_tokens)
    else:
        _gemm_q8_panels(out, w, xq, xd, n_tokens, <uint8_t*> scratch)
