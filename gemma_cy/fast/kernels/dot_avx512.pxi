# The quantized dot products and GEMVs with AVX-512 F/BW/VL intrinsics
# (module simd_avx512). The GEMVs run row after row, prefetching ahead.
#
# k_dot_i8: per 16 values, one unaligned 16-byte load widened int8 -> int32 ->
# f32 and one FMA; four independent accumulators (64 values per step). The
# tail uses masked loads (AVX512BW+VL for bytes), which never touch memory
# past the end.
#
# k_dot_q8_0: k_dot_affine's order with a = f32(d) and no offset: per 16
# values the exact weights f32(q) * f32(d) (8 bits times an f16's 11: exact)
# and one FMA with x; each block's first 16 values into acc0, its last 16
# into acc1; acc0 + acc1, its 16 lanes summed as _sum8(lanes 0-7) +
# _sum8(lanes 8-15).
# So a Q8_0 matrix's GEMM is the affine one on rows dequantized once.
#
# k_dot_q5_0: k_dot_q8_0's steps on the exact weights formed in registers.
# A value's level is n - 16 + 16 h (n its nibble, h its qh bit). Per block,
# a 16-entry table of f32(n) * f32(d) (exact: 4 bits times an f16's 11) and
# the vector -16 * f32(d) (exact); the 16 bytes of qs widened to int32 index
# the table by their low nibbles (values 0-15) or, shifted down, their high
# ones (16-31); the lanes whose h is 0 (qh as a lane mask) add -16 d, and
# f32(n d) + (-16 d) is exact too (the sum (n - 16) d has 15 bits). So every
# weight is f32(level) * f32(d), as a Q8_0 block's, and a Q5_0 matrix gives
# its Q8_0 conversion's bits. The form keeps per-lane rotates off the one
# 512-bit multiply unit the multiplies and FMAs need (scripts/probe_units.c,
# docs/benchmarks.md#history).

from libc.math cimport fmaf

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
    void _mm512_mask_storeu_ps(void* p, __mmask16 k, __m512 a)
    __m512 _mm512_setzero_ps()
    __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c)
    __m512 _mm512_add_ps(__m512 a, __m512 b)
    __m512 _mm512_mask_add_ps(__m512 src, __mmask16 k, __m512 a, __m512 b)
    __m512 _mm512_mul_ps(__m512 a, __m512 b)
    __m512 _mm512_sub_ps(__m512 a, __m512 b)
    __m512 _mm512_fmsub_ps(__m512 a, __m512 b, __m512 c)  # a * b - c, rounded once
    __m512 _mm512_set1_ps(float a)
    void _mm512_storeu_ps(void* p, __m512 a)
    __m512i _mm512_cvtepu8_epi32(__m128i a)
    __m512i _mm512_and_si512(__m512i a, __m512i b)
    __m512i _mm512_srli_epi32(__m512i a, unsigned int imm)
    __m512i _mm512_set1_epi32(int a)
    __m512i _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8, int e9,
                              int e10, int e11, int e12, int e13, int e14, int e15)
    __m512 _mm512_shuffle_f32x4(__m512 a, __m512 b, int imm)
    __m512 _mm512_shuffle_ps(__m512 a, __m512 b, int imm)
    __m512 _mm512_permutexvar_ps(__m512i idx, __m512 a)
    __m512 _mm512_setr_ps(float e0, float e1, float e2, float e3, float e4, float e5, float e6, float e7, float e8,
                          float e9, float e10, float e11, float e12, float e13, float e14, float e15)


cdef inline __m512 _widen16(const int8_t* q) noexcept nogil:
    """q[0:16] as 16 f32."""
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(<const __m128i*> q)))


cdef inline __mmask16 _low_lanes(Py_ssize_t n) noexcept nogil:
    """The min(n, 16) low lanes."""
    return <__mmask16> 0xFFFF if n >= 16 else <__mmask16> ((1 << n) - 1)


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
        tail = _low_lanes(n - i)
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


cdef inline void _q5_0_weights(__m512* lo, __m512* hi, const uint8_t* block, __m512 d) noexcept nogil:
    """The exact weights f32(level) * f32(d) of one Q5_0 block (see the top
    of this file): lo values 0-15, hi values 16-31."""
    cdef __m512 nd = _mm512_mul_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), d)
    cdef __m512 low = _mm512_mul_ps(_mm512_set1_ps(-16), d)
    cdef __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> (block + 6)))
    cdef uint32_t qh
    memcpy(&qh, block + 2, 4)  # (x86: little-endian, as the file)
    qh = ~qh  # the lanes that add -16 d
    lo[0] = _mm512_permutexvar_ps(v, nd)  # reads bits 0-3 of each index
    lo[0] = _mm512_mask_add_ps(lo[0], <__mmask16> (qh & 0xFFFF), lo[0], low)
    hi[0] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), nd)
    hi[0] = _mm512_mask_add_ps(hi[0], <__mmask16> (qh >> 16), hi[0], low)


cdef inline void _block_weights(__m512* lo, __m512* hi, const uint8_t* block, bint q5_0) noexcept nogil:
    """The exact weights f32(level) * f32(d) of one Q8_0 block (q5_0 False)
    or Q5_0 block: lo values 0-15, hi values 16-31 (what the GEMV multiplies
    and the GEMM lays out; 8 bits times an f16's 11: exact)."""
    cdef __m512 d = _mm512_set1_ps(_block_d(block))
    cdef const int8_t* q = <const int8_t*> (block + 2)
    if q5_0:
        _q5_0_weights(lo, hi, block, d)
    else:
        lo[0] = _mm512_mul_ps(_widen16(q), d)
        hi[0] = _mm512_mul_ps(_widen16(q + 16), d)


cdef inline void _block_step(__m512* lo, __m512* hi, const uint8_t* block, const float* x,
                             bint q5_0) noexcept nogil:
    """lo += the block's first 16 weights times x[0:16], hi its last 16 times x[16:32]."""
    cdef __m512 w0, w1
    _block_weights(&w0, &w1, block, q5_0)
    lo[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), lo[0])
    hi[0] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), hi[0])


cdef inline __m512 _blocks_lanes(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks,
                                 bint q5_0) noexcept nogil:
    """The 16 lanes k_dot_q8_0 (q5_0 False) or k_dot_q5_0 sums: acc0 + acc1."""
    cdef __m512 acc[2]
    cdef const uint8_t* b = blocks
    cdef Py_ssize_t k, size = Q5_0_BYTES if q5_0 else Q8_0_BYTES
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]
    for k in range(n_blocks):
        _block_step(&acc[0], &acc[1], b, x, q5_0)
        b += size
        x += Q8_0_BLOCK
    return _mm512_add_ps(acc[0], acc[1])


cdef inline float _dot_blocks(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks,
                              bint q5_0) noexcept nogil:
    """k_dot_q8_0 (q5_0 False) or k_dot_q5_0: one loop for both layouts."""
    return _sum16(_blocks_lanes(blocks, x, n_blocks, q5_0))


cdef inline void _gemv_blocks(float* out, const uint8_t* blocks, const float* x, Py_ssize_t rows,
                              Py_ssize_t n_blocks, bint q5_0) noexcept nogil:
    """The GEMV of a Q8_0 (q5_0 False) or Q5_0 matrix, row after row, each
    row's lanes (_blocks_lanes) kept until eight are summed at once by
    _sum16x8 (the bits of _sum16: k_dot_q8_0's, k_dot_q5_0's: 15 shuffles
    for eight rows rather than ~16 for each); the last rows one at a time.
    Rows stay one after the other: read side by side from DRAM they stream
    far slower (docs/benchmarks.md#history). Hints GEMV_PREFETCH_ROWS ahead."""
    cdef Py_ssize_t row_bytes = n_blocks * (Q5_0_BYTES if q5_0 else Q8_0_BYTES), r = 0, i
    cdef __m512 v[8]
    while r + 8 <= rows:
        for i in range(8):
            _prefetch_row(blocks + (r + i) * row_bytes, row_bytes)
            v[i] = _blocks_lanes(blocks + (r + i) * row_bytes, x, n_blocks, q5_0)
        _sum16x8(out + r, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
        r += 8
    while r < rows:
        _prefetch_row(blocks + r * row_bytes, row_bytes)
        out[r] = _dot_blocks(blocks + r * row_bytes, x, n_blocks, q5_0)
        r += 1


# Decode of several sequences (a batch step: a few positions, each of another
# sequence): a Q8_0 or Q5_0 matrix read once for up to GEMV_POSITIONS
# positions. Each block's weights are formed once (_block_weights) and
# multiplied with every position's 32 values, each position keeping the
# GEMV's two accumulators (first and last 16 values of each block) in the
# GEMV's block order, and its lanes summed by _sum16x8 as the GEMV sums
# them: every (row, position) result has the GEMV's bits
# (docs/numerics.md#batch-invariance), for the cost of one pass over the
# weights instead of the block GEMM's, built for prefill, which below 4
# positions falls back to a dot product per row and position.
cdef enum:
    GEMV_POSITIONS = 8


cdef inline void _gemv_blocks_positions(float* out, const uint8_t* blocks, const float* x, Py_ssize_t rows,
                                        Py_ssize_t n_blocks, const Py_ssize_t T, bint q5_0) noexcept nogil:
    """out[t * rows + r] = k_dot_q8_0 (k_dot_q5_0) of row r and position t
    (x + t * 32 n_blocks), t < T <= GEMV_POSITIONS; T a constant where the
    dispatcher calls it, so the accumulators stay in registers."""
    cdef Py_ssize_t size = Q5_0_BYTES if q5_0 else Q8_0_BYTES, row_bytes = n_blocks * size, cols = n_blocks * Q8_0_BLOCK
    cdef Py_ssize_t r = 0, i, k, t, n
    cdef __m512 acc[2 * GEMV_POSITIONS]
    cdef __m512 lanes[GEMV_POSITIONS * 8]  # (position, row of eight)
    cdef __m512 w0, w1
    cdef const uint8_t* b
    cdef const float* xk
    while r < rows:
        n = 8 if rows - r >= 8 else 1
        for i in range(n):
            b = blocks + (r + i) * row_bytes
            _prefetch_row(b, row_bytes)
            for t in range(T):
                acc[2 * t] = _mm512_setzero_ps()
                acc[2 * t + 1] = acc[2 * t]
            xk = x
            for k in range(n_blocks):
                _block_weights(&w0, &w1, b, q5_0)
                for t in range(T):
                    acc[2 * t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xk + t * cols), acc[2 * t])
                    acc[2 * t + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xk + t * cols + 16), acc[2 * t + 1])
                b += size
                xk += Q8_0_BLOCK
            for t in range(T):
                lanes[t * 8 + i] = _mm512_add_ps(acc[2 * t], acc[2 * t + 1])
        for t in range(T):
            if n == 8:
                _sum16x8(out + t * rows + r, lanes[t * 8], lanes[t * 8 + 1], lanes[t * 8 + 2], lanes[t * 8 + 3],
                         lanes[t * 8 + 4], lanes[t * 8 + 5], lanes[t * 8 + 6], lanes[t * 8 + 7])
            else:
                out[t * rows + r] = _sum16(lanes[t * 8])
        r += n


cdef void _gemv_positions(float* out, const QMatrix* w, const float* x, Py_ssize_t T) noexcept nogil:
    """_gemv_blocks_positions with T (2 .. GEMV_POSITIONS) as a constant."""
    cdef bint q5_0 = w.layout == QLAYOUT_Q5_0
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK
    if T == 2:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 2, q5_0)
    elif T == 3:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 3, q5_0)
    elif T == 4:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 4, q5_0)
    elif T == 5:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 5, q5_0)
    elif T == 6:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 6, q5_0)
    elif T == 7:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 7, q5_0)
    else:
        _gemv_blocks_positions(out, w.blocks, x, w.rows, nb, 8, q5_0)


cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    return _dot_blocks(blocks, x, n_blocks, False)


cdef float k_dot_q5_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    return _dot_blocks(blocks, x, n_blocks, True)


cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    _gemv_blocks(out, blocks, x, rows, n_blocks, False)


cdef void _gemv_q5_0(float* out, const QMatrix* w, const float* x) noexcept nogil:
    _gemv_blocks(out, w.blocks, x, w.rows, w.cols // Q8_0_BLOCK, True)


# _gemm (prefill) of a Q8_0, Q5_0, Q4_K or Q4_1 matrix as stored, or an
# affine one (Q6_K and the other k-quants as records): GEMM_ROW_TILE rows'
# exact weights formed once into scratch as f32 (a Q8_0 row's
# f32(q) * f32(d); Q4_K and Q4_1 their records' f32(f32(a * q) - b), the
# nibbles unpacked as their GEMVs do), then a 4-row x
# 6-position kernel (4 x 4 for the rest). k_dot_affine's (and k_dot_q8_0's)
# accumulator g only ever takes the 16-value groups g, g + 2, g + 4, ... of
# a row (the first and the last 16 of each 32), so the kernel runs one g at
# a time with one accumulator per output: 24 in registers, each weight
# loaded once for six positions and each activation once for four rows,
# and the two partial sums are combined as the GEMV combines its
# accumulators, a0 + a1, lanes summed alike: the same operations on the
# same values in the same order, so the same bits.

cdef enum:
    GEMM_ROW_TILE = 8  # rows whose weights _gemm forms at once (two 4-row kernels)
    GEMM_POSITION_TILE = 64  # positions per pass over the matrix in _gemm
    GEMM_ROW_PAD = 16  # floats after each row of _gemm's weights (see there)
    GEMM_GROUP_MAJOR_COLS = 2048  # rows this long or longer go group-major in _gemm (see there)


cdef Py_ssize_t k_gemm_scratch_floats(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    # the rows' weights (and a pass's positions, for long rows) as f32 (_gemm), or a q8 panel and its
    # tables (q8_vnni.pxi)
    cdef Py_ssize_t positions = min(n_tokens, <Py_ssize_t> GEMM_POSITION_TILE) if cols >= GEMM_GROUP_MAJOR_COLS else 0
    return max((GEMM_ROW_TILE + positions) * (cols + GEMM_ROW_PAD), (_gemm_q8_scratch_bytes(cols, n_tokens) + 3) // 4)


cdef inline float* _slot(float* w, const Py_ssize_t* half, Py_ssize_t group) noexcept nogil:
    """Where 16-value group ``group`` of a row starting at w goes: in place
    (half NULL), or in the row's group-major copy (_halves)."""
    if half == NULL:
        return w + 16 * group
    return w + half[group & 1] + 16 * (group >> 1)


cdef inline void _halves(Py_ssize_t* half, Py_ssize_t cols) noexcept nogil:
    """half[g] .. half[g + 1]: where accumulator g's 16-value groups g,
    g + 2, g + 4, ... of a row of cols values (a multiple of 32) lie side by
    side in its group-major copy."""
    half[0] = 0
    half[1] = cols // 2
    half[2] = cols


cdef inline void _group_major_row(float* dst, const float* src, Py_ssize_t cols,
                                  const Py_ssize_t* half) noexcept nogil:
    """dst = the row src of cols values, each 16-value group at _slot."""
    cdef Py_ssize_t k
    for k in range(cols // 16):
        _mm512_storeu_ps(_slot(dst, half, k), _mm512_loadu_ps(src + 16 * k))


cdef inline void _blocks_row(float* w, const uint8_t* row, Py_ssize_t nb, bint q5_0,
                             const Py_ssize_t* half) noexcept nogil:
    """One Q8_0 (q5_0 False) or Q5_0 row's exact weights, as the GEMV forms
    them (_block_weights), each 16-value group at _slot."""
    cdef Py_ssize_t k, size = Q5_0_BYTES if q5_0 else Q8_0_BYTES
    cdef __m512 lo, hi
    for k in range(nb):
        _block_weights(&lo, &hi, row, q5_0)
        _mm512_storeu_ps(_slot(w, half, 2 * k), lo)
        _mm512_storeu_ps(_slot(w, half, 2 * k + 1), hi)
        row += size


cdef inline bint _gemm_takes_q5_0() noexcept nogil:
    """Q5_0 matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef inline bint _gemm_takes_q4_k() noexcept nogil:
    """Q4_K matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef inline bint _gemm_takes_q4_1() noexcept nogil:
    """Q4_1 matrices go to this module's _gemm as stored (k_gemm)."""
    return True


cdef void _gemv_q4_1(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """k_matvec of a Q4_1 matrix: _dot_q4_1 row after row, prefetching ahead."""
    cdef Py_ssize_t r, nb = w.cols // Q8_0_BLOCK, row_bytes = nb * Q4_1_BYTES
    for r in range(w.rows):
        _prefetch_row(w.blocks + r * row_bytes, row_bytes)
        out[r] = _dot_q4_1(w.blocks + r * row_bytes, x, nb)


cdef inline void _affine_row(float* w, const uint8_t* rec, Py_ssize_t cols, Py_ssize_t sub,
                             bint has_offset, const Py_ssize_t* half) noexcept nogil:
    """One affine row's exact weights f32(f32(a * q) - b), as _affine32 forms
    them, each 16-value group at _slot."""
    cdef Py_ssize_t k, rb = sub + 4 + (4 if has_offset else 0)
    cdef __m512 va, vb
    for k in range(cols // 32):
        va = _mm512_set1_ps(_load_f32(rec + sub))
        vb = _mm512_set1_ps(_load_f32(rec + sub + 4)) if has_offset else _mm512_setzero_ps()
        _mm512_storeu_ps(_slot(w, half, 2 * k), _affine16(<const int8_t*> rec, va, vb, has_offset))
        if sub == 16:  # the next 16 values are the next record's
            rec += rb
            va = _mm512_set1_ps(_load_f32(rec + 16))
            if has_offset:
                vb = _mm512_set1_ps(_load_f32(rec + 20))
            _mm512_storeu_ps(_slot(w, half, 2 * k + 1), _affine16(<const int8_t*> rec, va, vb, has_offset))
        else:
            _mm512_storeu_ps(_slot(w, half, 2 * k + 1), _affine16(<const int8_t*> rec + 16, va, vb, has_offset))
        rec += rb


cdef inline void _q4_1_row(float* w, const uint8_t* row, Py_ssize_t nb, const Py_ssize_t* half) noexcept nogil:
    """One Q4_1 row's exact weights (_q4_1_weights, as the GEMV forms them),
    each 16-value group at _slot: block k's low nibbles are group 2 k, its
    high nibbles 2 k + 1."""
    cdef __m512i m15 = _mm512_set1_epi32(15)
    cdef __m512 lo, hi
    cdef Py_ssize_t k
    for k in range(nb):
        _q4_1_weights(&lo, &hi, row, m15)
        _mm512_storeu_ps(_slot(w, half, 2 * k), lo)
        _mm512_storeu_ps(_slot(w, half, 2 * k + 1), hi)
        row += Q4_1_BYTES


cdef inline void _q4_k_row(float* w, const uint8_t* row, const float* ab, Py_ssize_t cols,
                           const Py_ssize_t* half) noexcept nogil:
    """One Q4_K row's exact weights (ab: its sub-blocks' a, b; _q4_k_weights,
    as the GEMV forms them), each 16-value group at _slot: groups 4 j ..
    4 j + 3 are the values 64 j .. 64 j + 63."""
    cdef __m512i m15 = _mm512_set1_epi32(15)
    cdef __m512 v[4]
    cdef Py_ssize_t j, g
    for j in range(cols // 64):
        _q4_k_weights(v, row, ab, j, m15)
        for g in range(4):
            _mm512_storeu_ps(_slot(w, half, 4 * j + g), v[g])
        ab += 4


cdef inline void _group_step_4x4(__m512* acc, const float* w0, const float* w1, const float* w2,
                                 const float* w3, const float* x0, const float* x1, const float* x2,
                                 const float* x3, Py_ssize_t j) noexcept nogil:
    """acc[4 r + t] += w_r[j:j+16] x_t[j:j+16], rows and positions 0..3: four
    weight loads, four activation loads, sixteen FMAs (a pointer per row and
    position, so that gcc keeps the weights in registers)."""
    cdef __m512 wa = _mm512_loadu_ps(w0 + j)
    cdef __m512 wb = _mm512_loadu_ps(w1 + j)
    cdef __m512 wc = _mm512_loadu_ps(w2 + j)
    cdef __m512 wd = _mm512_loadu_ps(w3 + j)
    cdef __m512 xv = _mm512_loadu_ps(x0 + j)
    acc[0] = _mm512_fmadd_ps(wa, xv, acc[0])
    acc[4] = _mm512_fmadd_ps(wb, xv, acc[4])
    acc[8] = _mm512_fmadd_ps(wc, xv, acc[8])
    acc[12] = _mm512_fmadd_ps(wd, xv, acc[12])
    xv = _mm512_loadu_ps(x1 + j)
    acc[1] = _mm512_fmadd_ps(wa, xv, acc[1])
    acc[5] = _mm512_fmadd_ps(wb, xv, acc[5])
    acc[9] = _mm512_fmadd_ps(wc, xv, acc[9])
    acc[13] = _mm512_fmadd_ps(wd, xv, acc[13])
    xv = _mm512_loadu_ps(x2 + j)
    acc[2] = _mm512_fmadd_ps(wa, xv, acc[2])
    acc[6] = _mm512_fmadd_ps(wb, xv, acc[6])
    acc[10] = _mm512_fmadd_ps(wc, xv, acc[10])
    acc[14] = _mm512_fmadd_ps(wd, xv, acc[14])
    xv = _mm512_loadu_ps(x3 + j)
    acc[3] = _mm512_fmadd_ps(wa, xv, acc[3])
    acc[7] = _mm512_fmadd_ps(wb, xv, acc[7])
    acc[11] = _mm512_fmadd_ps(wc, xv, acc[11])
    acc[15] = _mm512_fmadd_ps(wd, xv, acc[15])


cdef void _affine_group_4x4(__m512* part, const float* w, Py_ssize_t w_stride, const float* x,
                            Py_ssize_t x_stride, Py_ssize_t j, Py_ssize_t end, Py_ssize_t step,
                            float* out, Py_ssize_t out_stride) noexcept nogil:
    """part[4 r + t] = the 16 lanes of k_dot_affine's accumulator g for row r
    (w + r * w_stride) and position t (x + t * x_stride), rows and positions
    0..3: the 16 values at j, j + step, ... below end, which are the groups
    g, g + 2, ... in order, in place (j = 16 g, step 32) or group-major
    (step 16). In a function of its own,
    so that its 16 accumulators and the four weight vectors are all gcc has
    to keep in registers. With out, part holds accumulator 0's lanes and
    the tile's sums go to out (as _affine_group_4x6 writes them)."""
    cdef __m512 acc[16]
    cdef float sums[16]
    cdef Py_ssize_t i
    cdef const float* w1 = w + w_stride
    cdef const float* w2 = w + 2 * w_stride
    cdef const float* w3 = w + 3 * w_stride
    cdef const float* x1 = x + x_stride
    cdef const float* x2 = x + 2 * x_stride
    cdef const float* x3 = x + 3 * x_stride
    for i in range(16):
        acc[i] = _mm512_setzero_ps()
    while j < end:
        _group_step_4x4(acc, w, w1, w2, w3, x, x1, x2, x3, j)
        j += step
    if out == NULL:
        for i in range(16):
            part[i] = acc[i]
        return
    for i in range(16):
        acc[i] = _mm512_add_ps(part[i], acc[i])
    _sum16x8(sums, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])
    _sum16x8(sums + 8, acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
    for i in range(16):
        out[(i % 4) * out_stride + i // 4] = sums[i]


cdef void _affine_group_4x6(__m512* part, const float* w, Py_ssize_t w_stride, const float* x,
                            Py_ssize_t x_stride, Py_ssize_t j, Py_ssize_t end, Py_ssize_t step,
                            float* out, Py_ssize_t out_stride) noexcept nogil:
    """_affine_group_4x4 for rows 0..3 and positions 0..5: part[6 r + t]. 24
    accumulators, four weight vectors and one activation vector: 29 of the
    32 registers; each step loads 10 vectors for 24 FMAs (the 4 x 4 tile:
    8 for 16). With out (the second accumulator's pass), part holds the
    first's, and out[t * out_stride + r] = the GEMV's sum of the two:
    a0 + a1, its lanes by _sum16x8 (the bits of _sum16), straight from the
    registers (no stores of this pass's accumulators and loads back)."""
    cdef __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0
    cdef __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0
    cdef __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0
    cdef __m512 d0 = a0, d1 = a0, d2 = a0, d3 = a0, d4 = a0, d5 = a0
    cdef __m512 wa, wb, wc, wd, xv
    cdef const float* w1 = w + w_stride
    cdef const float* w2 = w + 2 * w_stride
    cdef const float* w3 = w + 3 * w_stride
    while j < end:
        wa = _mm512_loadu_ps(w + j); wb = _mm512_loadu_ps(w1 + j)
        wc = _mm512_loadu_ps(w2 + j); wd = _mm512_loadu_ps(w3 + j)
        xv = _mm512_loadu_ps(x + j)
        a0 = _mm512_fmadd_ps(wa, xv, a0); b0 = _mm512_fmadd_ps(wb, xv, b0)
        c0 = _mm512_fmadd_ps(wc, xv, c0); d0 = _mm512_fmadd_ps(wd, xv, d0)
        xv = _mm512_loadu_ps(x + x_stride + j)
        a1 = _mm512_fmadd_ps(wa, xv, a1); b1 = _mm512_fmadd_ps(wb, xv, b1)
        c1 = _mm512_fmadd_ps(wc, xv, c1); d1 = _mm512_fmadd_ps(wd, xv, d1)
        xv = _mm512_loadu_ps(x + 2 * x_stride + j)
        a2 = _mm512_fmadd_ps(wa, xv, a2); b2 = _mm512_fmadd_ps(wb, xv, b2)
        c2 = _mm512_fmadd_ps(wc, xv, c2); d2 = _mm512_fmadd_ps(wd, xv, d2)
        xv = _mm512_loadu_ps(x + 3 * x_stride + j)
        a3 = _mm512_fmadd_ps(wa, xv, a3); b3 = _mm512_fmadd_ps(wb, xv, b3)
        c3 = _mm512_fmadd_ps(wc, xv, c3); d3 = _mm512_fmadd_ps(wd, xv, d3)
        xv = _mm512_loadu_ps(x + 4 * x_stride + j)
        a4 = _mm512_fmadd_ps(wa, xv, a4); b4 = _mm512_fmadd_ps(wb, xv, b4)
        c4 = _mm512_fmadd_ps(wc, xv, c4); d4 = _mm512_fmadd_ps(wd, xv, d4)
        xv = _mm512_loadu_ps(x + 5 * x_stride + j)
        a5 = _mm512_fmadd_ps(wa, xv, a5); b5 = _mm512_fmadd_ps(wb, xv, b5)
        c5 = _mm512_fmadd_ps(wc, xv, c5); d5 = _mm512_fmadd_ps(wd, xv, d5)
        j += step
    if out == NULL:
        part[0] = a0; part[1] = a1; part[2] = a2; part[3] = a3; part[4] = a4; part[5] = a5
        part[6] = b0; part[7] = b1; part[8] = b2; part[9] = b3; part[10] = b4; part[11] = b5
        part[12] = c0; part[13] = c1; part[14] = c2; part[15] = c3; part[16] = c4; part[17] = c5
        part[18] = d0; part[19] = d1; part[20] = d2; part[21] = d3; part[22] = d4; part[23] = d5
        return
    cdef float sums[24]
    _sum16x8(sums, _mm512_add_ps(part[0], a0), _mm512_add_ps(part[1], a1), _mm512_add_ps(part[2], a2),
             _mm512_add_ps(part[3], a3), _mm512_add_ps(part[4], a4), _mm512_add_ps(part[5], a5),
             _mm512_add_ps(part[6], b0), _mm512_add_ps(part[7], b1))
    _sum16x8(sums + 8, _mm512_add_ps(part[8], b2), _mm512_add_ps(part[9], b3), _mm512_add_ps(part[10], b4),
             _mm512_add_ps(part[11], b5), _mm512_add_ps(part[12], c0), _mm512_add_ps(part[13], c1),
             _mm512_add_ps(part[14], c2), _mm512_add_ps(part[15], c3))
    _sum16x8(sums + 16, _mm512_add_ps(part[16], c4), _mm512_add_ps(part[17], c5), _mm512_add_ps(part[18], d0),
             _mm512_add_ps(part[19], d1), _mm512_add_ps(part[20], d2), _mm512_add_ps(part[21], d3),
             _mm512_add_ps(part[22], d4), _mm512_add_ps(part[23], d5))
    for j in range(24):
        out[(j % 6) * out_stride + j // 6] = sums[j]


cdef void _affine_4x6(float* out, Py_ssize_t out_stride, const float* w, Py_ssize_t w_stride, const float* x,
                      Py_ssize_t x_stride, const Py_ssize_t* first, const Py_ssize_t* end,
                      Py_ssize_t step) noexcept nogil:
    """out[t * out_stride + r] = k_dot_affine of row r (its exact weights at
    w + r * w_stride) with position t (x + t * x_stride), rows 0..3,
    positions 0..5; accumulator g's values at first[g], first[g] + step, ...
    below end[g] (see _gemm)."""
    cdef __m512 part[24]  # accumulator 0's (6 r + t)
    _affine_group_4x6(part, w, w_stride, x, x_stride, first[0], end[0], step, NULL, 0)
    _affine_group_4x6(part, w, w_stride, x, x_stride, first[1], end[1], step, out, out_stride)


cdef void _affine_4x4(float* out, Py_ssize_t out_stride, const float* w, Py_ssize_t w_stride, const float* x,
                      Py_ssize_t x_stride, const Py_ssize_t* first, const Py_ssize_t* end,
                      Py_ssize_t step) noexcept nogil:
    """_affine_4x6 for positions 0..3."""
    cdef __m512 part[16]  # accumulator 0's (4 r + t)
    _affine_group_4x4(part, w, w_stride, x, x_stride, first[0], end[0], step, NULL, 0)
    _affine_group_4x4(part, w, w_stride, x, x_stride, first[1], end[1], step, out, out_stride)


cdef void _gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                float* scratch) noexcept nogil:
    """k_gemm of a Q8_0, Q5_0, Q4_K, Q4_1 or affine matrix by the blocked kernel above:
    positions in passes of GEMM_POSITION_TILE; in each, GEMM_ROW_TILE rows'
    weights formed at a time (they stay in L1/L2), the 4 x 6 kernel over
    every four rows and six positions of the pass (4 x 4 for four left
    over); rows and positions no whole tile covers by the GEMV's own dot
    product (the same bits). Rows of GEMM_GROUP_MAJOR_COLS values or more
    are formed, and each pass's positions copied, group-major: accumulator
    g's groups side by side, so that each of its passes reads one run
    rather than every other 64 bytes of rows that no longer fit L1 (a
    measured choice: docs/benchmarks.md#history). Other matrices:
    _gemm_by_rows."""
    cdef bint q5_0 = w.layout == QLAYOUT_Q5_0
    cdef bint blocks = w.layout == QLAYOUT_Q8_0 or q5_0
    cdef bint q4_k = w.layout == QLAYOUT_Q4_K, q4_1 = w.layout == QLAYOUT_Q4_1  # (their records' order: affine)
    cdef Py_ssize_t rows = w.rows, cols = w.cols, nb = w.cols // Q8_0_BLOCK, row_bytes, t, t0, tn, r, i, n, g
    # rows ws = cols + 16 floats apart: at 1,024 or 2,048 columns, rows a
    # multiple of 4 KiB apart fall in the same L1 sets as each other and as
    # the activations, and evict each other (docs/benchmarks.md#history)
    cdef Py_ssize_t ws = cols + GEMM_ROW_PAD
    cdef float* wt = scratch  # (GEMM_ROW_TILE, ws) the rows' weights
    cdef float* xt = scratch + GEMM_ROW_TILE * ws  # (<= GEMM_POSITION_TILE, ws) the pass's positions, long rows
    cdef const float* xp  # the pass's positions as the kernel reads them, xs apart
    cdef Py_ssize_t xs, step
    cdef Py_ssize_t half[3]
    cdef Py_ssize_t first[2]
    cdef Py_ssize_t end[2]
    cdef const Py_ssize_t* layout = NULL  # NULL: rows in place; else half (group-major)
    if not (blocks or q4_k or q4_1 or w.layout == QLAYOUT_AFFINE) or scratch == NULL:
        _gemm_by_rows(out, w, x, n_tokens)
        return
    if blocks and n_tokens <= GEMV_POSITIONS:  # a batch's decode step: one pass, the GEMV's bits
        _gemv_positions(out, w, x, n_tokens)
        return
    if cols >= GEMM_GROUP_MAJOR_COLS:
        _halves(half, cols)
        layout = half
        step = 16
        for g in range(2):
            first[g] = half[g]
            end[g] = half[g + 1]
    else:
        step = 32
        for g in range(2):
            first[g] = 16 * g
            end[g] = cols - 15  # j + 16 <= cols
    row_bytes = _row_bytes(w)
    t0 = 0
    while t0 < n_tokens:
        tn = min(<Py_ssize_t> GEMM_POSITION_TILE, n_tokens - t0)
        xp = x + t0 * cols
        xs = cols
        if layout != NULL:
            for t in range(tn):
                _group_major_row(xt + t * ws, x + (t0 + t) * cols, cols, layout)
            xp = xt
            xs = ws
        r = 0
        while r < rows:
            n = min(<Py_ssize_t> GEMM_ROW_TILE, rows - r)
            for i in range(n):
                if not w.resident:
                    _prefetch_row(w.blocks + (r + i) * row_bytes, row_bytes)
                if blocks:
                    _blocks_row(wt + i * ws, w.blocks + (r + i) * row_bytes, nb, q5_0, layout)
                elif q4_k:
                    _q4_k_row(wt + i * ws, w.blocks + (r + i) * row_bytes, w.ab + (r + i) * nb * 2, cols, layout)
                elif q4_1:
                    _q4_1_row(wt + i * ws, w.blocks + (r + i) * row_bytes, nb, layout)
                else:
                    _affine_row(wt + i * ws, w.blocks + (r + i) * row_bytes, cols, w.sub, w.has_offset, layout)
            i = 0
            while i + 4 <= n:
                t = 0
                while t + 6 <= tn:
                    _affine_4x6(out + (t0 + t) * rows + r + i, rows, wt + i * ws, ws, xp + t * xs, xs, first, end,
                                step)
                    t += 6
                if t + 4 <= tn:
                    _affine_4x4(out + (t0 + t) * rows + r + i, rows, wt + i * ws, ws, xp + t * xs, xs, first, end,
                                step)
                    t += 4
                _dots(out, w, r + i, 4, t0 + t, t0 + tn, row_bytes, x)
                i += 4
            _dots(out, w, r + i, n - i, t0, t0 + tn, row_bytes, x)
            r += n
        t0 += tn


cdef inline void _dots(float* out, const QMatrix* w, Py_ssize_t r, Py_ssize_t n_rows, Py_ssize_t t_lo,
                       Py_ssize_t t_hi, Py_ssize_t row_bytes, const float* x) noexcept nogil:
    """out[t * rows + r + i] = the GEMV's dot product of row r + i with
    position t, for i < n_rows and t_lo <= t < t_hi (what no 4 x 4 tile covers)."""
    cdef Py_ssize_t i, t
    for i in range(n_rows):
        for t in range(t_lo, t_hi):
            if w.layout == QLAYOUT_Q8_0:
                out[t * w.rows + r + i] = k_dot_q8_0(w.blocks + (r + i) * row_bytes, x + t * w.cols,
                                                     w.cols // Q8_0_BLOCK)
            elif w.layout == QLAYOUT_Q5_0:
                out[t * w.rows + r + i] = k_dot_q5_0(w.blocks + (r + i) * row_bytes, x + t * w.cols,
                                                     w.cols // Q8_0_BLOCK)
            elif w.layout == QLAYOUT_Q4_K:
                out[t * w.rows + r + i] = k_dot_q4_k(w.blocks + (r + i) * row_bytes,
                                                     w.ab + (r + i) * (w.cols // Q8_0_BLOCK) * 2, x + t * w.cols,
                                                     w.cols)
            elif w.layout == QLAYOUT_Q4_1:
                out[t * w.rows + r + i] = _dot_q4_1(w.blocks + (r + i) * row_bytes, x + t * w.cols,
                                                    w.cols // Q8_0_BLOCK)
            else:
                out[t * w.rows + r + i] = k_dot_affine(w.blocks + (r + i) * row_bytes, x + t * w.cols, w.cols,
                                                       w.sub, w.has_offset)


cdef inline float _sum16(__m512 a) noexcept nogil:
    """The 16 lanes of a summed as _sum8(lanes 0-7) + _sum8(lanes 8-15)."""
    cdef float lanes[16]
    _mm512_storeu_ps(lanes, a)
    return _sum8(lanes) + _sum8(lanes + 8)


cdef inline void _sum16x8(float* out, __m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5,
                          __m512 a6, __m512 a7) noexcept nogil:
    """out[k] = _sum16(a_k) for 8 vectors, bit for bit (every sum pairs the
    same lanes in the same tree), in 15 shuffles and 8 adds: the four 128-bit
    quarters Q0..Q3 of each vector become Q0 + Q1 and Q2 + Q3 (lanes i + i+4
    of each half), then lanes (0 + 1) and (2 + 3) of each quarter, then their
    sum; each half's _sum8 sits in one lane, and the two halves are added."""
    # (Q0 + Q1, Q2 + Q3) of vectors k and k+1 side by side: [k lo, k hi, k+1 lo, k+1 hi]
    cdef __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x88), _mm512_shuffle_f32x4(a0, a1, 0xDD))
    cdef __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x88), _mm512_shuffle_f32x4(a2, a3, 0xDD))
    cdef __m512 p45 = _mm512_add_ps(_mm512_shuffle_f32x4(a4, a5, 0x88), _mm512_shuffle_f32x4(a4, a5, 0xDD))
    cdef __m512 p67 = _mm512_add_ps(_mm512_shuffle_f32x4(a6, a7, 0x88), _mm512_shuffle_f32x4(a6, a7, 0xDD))
    # per quarter: [P0 + P1, P2 + P3, Q0 + Q1, Q2 + Q3] of two vectors P, Q
    cdef __m512 t = _mm512_add_ps(_mm512_shuffle_ps(p01, p23, 0x88), _mm512_shuffle_ps(p01, p23, 0xDD))
    cdef __m512 u = _mm512_add_ps(_mm512_shuffle_ps(p45, p67, 0x88), _mm512_shuffle_ps(p45, p67, 0xDD))
    # quarter 0: the low halves' _sum8 of vectors 0, 2, 4, 6; 1: their high halves; 2, 3: of 1, 3, 5, 7
    cdef __m512 w = _mm512_add_ps(_mm512_shuffle_ps(t, u, 0x88), _mm512_shuffle_ps(t, u, 0xDD))
    cdef __m512 f = _mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, 0xB1))  # low + high: quarters 0 and 2
    _mm512_mask_storeu_ps(out, 0xFF, _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0), f))


cdef void _scores8(float* out, const float* q, const float* keys, Py_ssize_t key_stride,
                   Py_ssize_t n) noexcept nogil:
    """k_scores for 8 keys (_score bit for bit: one 16-lane FMA chain per key
    over the whole 16s, _sum16, then the tail by FMAs in order), each 16
    query values loaded once for the 8 keys."""
    cdef __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0
    cdef __m512 qv
    cdef Py_ssize_t j = 0, k, i
    cdef float s
    while j + 16 <= n:
        qv = _mm512_loadu_ps(q + j)
        a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + j), a0)
        a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + key_stride + j), a1)
        a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 2 * key_stride + j), a2)
        a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 3 * key_stride + j), a3)
        a4 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 4 * key_stride + j), a4)
        a5 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 5 * key_stride + j), a5)
        a6 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 6 * key_stride + j), a6)
        a7 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + 7 * key_stride + j), a7)
        j += 16
    _sum16x8(out, a0, a1, a2, a3, a4, a5, a6, a7)
    if j < n:
        for k in range(8):
            s = out[k]
            for i in range(j, n):
                s = fmaf(q[i], keys[k * key_stride + i], s)
            out[k] = s


cdef float _score(const float* q, const float* key, Py_ssize_t n) noexcept nogil:
    """One score of k_scores, _scores8's bits for one key: a 16-lane FMA chain
    over the whole 16s, _sum16, then the tail by explicit FMAs (not left to
    the compiler, which runs this module with -ffp-contract=off)."""
    cdef __m512 a = _mm512_setzero_ps()
    cdef Py_ssize_t j = 0
    cdef float s
    while j + 16 <= n:
        a = _mm512_fmadd_ps(_mm512_loadu_ps(q + j), _mm512_loadu_ps(key + j), a)
        j += 16
    s = _sum16(a)
    while j < n:
        s = fmaf(q[j], key[j], s)
        j += 1
    return s


cdef void _weighted_rows_pass(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                              const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    """k_weighted_rows' pass with FMAs: every value of y takes y = fma(w[r,
    i], x[i], y) in the order of i (one rounding per step), whether its row
    runs in a group of four (32 columns in 8 registers, each x vector loaded
    once for the four rows) or alone (64 columns in 4), and the last < 32 or
    < 64 columns in masked steps of 16: the same steps whichever rows or
    calls share the sum."""
    cdef __m512 a0, a1, a2, a3, a4, a5, a6, a7, x0, x1, w0, w1, w2, w3
    cdef Py_ssize_t r = 0, c, i
    cdef __mmask16 keep
    cdef const float* xi
    cdef float* yr
    while r + 4 <= m:
        yr = y + r * y_stride
        c = 0
        while c + 32 <= n:
            a0 = _mm512_loadu_ps(yr + c); a1 = _mm512_loadu_ps(yr + c + 16)
            a2 = _mm512_loadu_ps(yr + y_stride + c); a3 = _mm512_loadu_ps(yr + y_stride + c + 16)
            a4 = _mm512_loadu_ps(yr + 2 * y_stride + c); a5 = _mm512_loadu_ps(yr + 2 * y_stride + c + 16)
            a6 = _mm512_loadu_ps(yr + 3 * y_stride + c); a7 = _mm512_loadu_ps(yr + 3 * y_stride + c + 16)
            for i in range(n_x):
                xi = x + i * x_stride + c
                x0 = _mm512_loadu_ps(xi)
                x1 = _mm512_loadu_ps(xi + 16)
                w0 = _mm512_set1_ps(w[r * w_stride + i])
                w1 = _mm512_set1_ps(w[(r + 1) * w_stride + i])
                w2 = _mm512_set1_ps(w[(r + 2) * w_stride + i])
                w3 = _mm512_set1_ps(w[(r + 3) * w_stride + i])
                a0 = _mm512_fmadd_ps(w0, x0, a0); a1 = _mm512_fmadd_ps(w0, x1, a1)
                a2 = _mm512_fmadd_ps(w1, x0, a2); a3 = _mm512_fmadd_ps(w1, x1, a3)
                a4 = _mm512_fmadd_ps(w2, x0, a4); a5 = _mm512_fmadd_ps(w2, x1, a5)
                a6 = _mm512_fmadd_ps(w3, x0, a6); a7 = _mm512_fmadd_ps(w3, x1, a7)
            _mm512_storeu_ps(yr + c, a0); _mm512_storeu_ps(yr + c + 16, a1)
            _mm512_storeu_ps(yr + y_stride + c, a2); _mm512_storeu_ps(yr + y_stride + c + 16, a3)
            _mm512_storeu_ps(yr + 2 * y_stride + c, a4); _mm512_storeu_ps(yr + 2 * y_stride + c + 16, a5)
            _mm512_storeu_ps(yr + 3 * y_stride + c, a6); _mm512_storeu_ps(yr + 3 * y_stride + c + 16, a7)
            c += 32
        while c < n:  # masked steps of 16
            keep = _low_lanes(n - c)
            a0 = _mm512_maskz_loadu_ps(keep, yr + c)
            a2 = _mm512_maskz_loadu_ps(keep, yr + y_stride + c)
            a4 = _mm512_maskz_loadu_ps(keep, yr + 2 * y_stride + c)
            a6 = _mm512_maskz_loadu_ps(keep, yr + 3 * y_stride + c)
            for i in range(n_x):
                x0 = _mm512_maskz_loadu_ps(keep, x + i * x_stride + c)
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[r * w_stride + i]), x0, a0)
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(w[(r + 1) * w_stride + i]), x0, a2)
                a4 = _mm512_fmadd_ps(_mm512_set1_ps(w[(r + 2) * w_stride + i]), x0, a4)
                a6 = _mm512_fmadd_ps(_mm512_set1_ps(w[(r + 3) * w_stride + i]), x0, a6)
            _mm512_mask_storeu_ps(yr + c, keep, a0)
            _mm512_mask_storeu_ps(yr + y_stride + c, keep, a2)
            _mm512_mask_storeu_ps(yr + 2 * y_stride + c, keep, a4)
            _mm512_mask_storeu_ps(yr + 3 * y_stride + c, keep, a6)
            c += 16
        r += 4
    while r < m:  # one row
        yr = y + r * y_stride
        c = 0
        while c + 64 <= n:
            a0 = _mm512_loadu_ps(yr + c); a1 = _mm512_loadu_ps(yr + c + 16)
            a2 = _mm512_loadu_ps(yr + c + 32); a3 = _mm512_loadu_ps(yr + c + 48)
            for i in range(n_x):
                xi = x + i * x_stride + c
                w0 = _mm512_set1_ps(w[r * w_stride + i])
                a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi), a0)
                a1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi + 16), a1)
                a2 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi + 32), a2)
                a3 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi + 48), a3)
            _mm512_storeu_ps(yr + c, a0); _mm512_storeu_ps(yr + c + 16, a1)
            _mm512_storeu_ps(yr + c + 32, a2); _mm512_storeu_ps(yr + c + 48, a3)
            c += 64
        while c < n:
            keep = _low_lanes(n - c)
            a0 = _mm512_maskz_loadu_ps(keep, yr + c)
            for i in range(n_x):
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[r * w_stride + i]),
                                     _mm512_maskz_loadu_ps(keep, x + i * x_stride + c), a0)
            _mm512_mask_storeu_ps(yr + c, keep, a0)
            c += 16
        r += 1


# Attention at decode (_scores_few, _weighted_few): a step's query heads of
# one kv head are m <= 4 rows, and the keys and values of the span come from
# DRAM, read once. Each key (value) vector is loaded once for all m rows, and
# the span is read in the order of memory with one hint per 64 bytes read,
# FEW_AHEAD_BYTES ahead: hints spread over the work keep a steady number of
# reads in flight (the hardware prefetcher alone, or hints in bursts, left
# the span streaming at half the read probe: docs/benchmarks.md#history).

cdef inline void _add4(__m512* a0, __m512* a1, __m512* a2, __m512* a3, __m512 q, __m512 k0, __m512 k1,
                       __m512 k2, __m512 k3) noexcept nogil:
    """One row's step over 4 keys: a_k = fma(q, k_k, a_k) (a score chain per key)."""
    a0[0] = _mm512_fmadd_ps(q, k0, a0[0])
    a1[0] = _mm512_fmadd_ps(q, k1, a1[0])
    a2[0] = _mm512_fmadd_ps(q, k2, a2[0])
    a3[0] = _mm512_fmadd_ps(q, k3, a3[0])


cdef bint _scores_few(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                      const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys, Py_ssize_t n) noexcept nogil:
    """k_scores for m <= 4 rows and keys n floats apart (a kv head's span of
    the head-major cache), 4 keys at a time for every row: 4 m FMA chains,
    each key vector loaded once; each score is _score's steps (a 16-lane
    chain over the whole 16s, _sum16 by _sum16x8, the tail in order).
    False, with nothing done, for other shapes."""
    cdef __m512 z = _mm512_setzero_ps()
    cdef __m512 a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, k0, k1, k2, k3
    cdef Py_ssize_t i = 0, j, r
    cdef const float* kp
    cdef const char* hint = <const char*> keys + FEW_AHEAD_BYTES
    cdef const char* end = <const char*> (keys + n_keys * n)
    cdef float sums[16]
    if m > 4 or key_stride != n or n < 16:
        return False
    while i + 4 <= n_keys:
        kp = keys + i * n
        a0 = z; a1 = z; a2 = z; a3 = z; b0 = z; b1 = z; b2 = z; b3 = z
        c0 = z; c1 = z; c2 = z; c3 = z; d0 = z; d1 = z; d2 = z; d3 = z
        j = 0
        while j + 16 <= n:
            k0 = _mm512_loadu_ps(kp + j)
            k1 = _mm512_loadu_ps(kp + n + j)
            k2 = _mm512_loadu_ps(kp + 2 * n + j)
            k3 = _mm512_loadu_ps(kp + 3 * n + j)
            _hint_stream(&hint, end, 4 * 64)
            _add4(&a0, &a1, &a2, &a3, _mm512_loadu_ps(q + j), k0, k1, k2, k3)
            if m > 1:
                _add4(&b0, &b1, &b2, &b3, _mm512_loadu_ps(q + q_stride + j), k0, k1, k2, k3)
            if m > 2:
                _add4(&c0, &c1, &c2, &c3, _mm512_loadu_ps(q + 2 * q_stride + j), k0, k1, k2, k3)
            if m > 3:
                _add4(&d0, &d1, &d2, &d3, _mm512_loadu_ps(q + 3 * q_stride + j), k0, k1, k2, k3)
            j += 16
        _sum16x8(sums, a0, a1, a2, a3, b0, b1, b2, b3)
        _sum16x8(sums + 8, c0, c1, c2, c3, d0, d1, d2, d3)
        for r in range(m):
            memcpy(out + r * out_stride + i, sums + 4 * r, 4 * sizeof(float))
        if j < n:
            _score_tails(out + i, out_stride, q, q_stride, m, kp, n, 4, j, n)
        i += 4
    while i < n_keys:
        for r in range(m):
            out[r * out_stride + i] = _score(q + r * q_stride, keys + i * n, n)
        i += 1
    return True


cdef inline void _axpy4(__m512* a0, __m512* a1, __m512* a2, __m512* a3, float w, __m512 x0, __m512 x1,
                        __m512 x2, __m512 x3) noexcept nogil:
    """One row's step over 64 columns: a_k = fma(w, x_k, a_k) (y += w x, fused)."""
    cdef __m512 wv = _mm512_set1_ps(w)
    a0[0] = _mm512_fmadd_ps(wv, x0, a0[0])
    a1[0] = _mm512_fmadd_ps(wv, x1, a1[0])
    a2[0] = _mm512_fmadd_ps(wv, x2, a2[0])
    a3[0] = _mm512_fmadd_ps(wv, x3, a3[0])


cdef inline void _weighted_tile(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                                const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n,
                                const char** hint, const char* end) noexcept nogil:
    """y (m <= 4, n <= 64) += w (m, n_x) . x (n_x, n): y in 4 m registers,
    each x vector loaded once for the m rows; a hint per 64 bytes of x."""
    cdef __m512 z = _mm512_setzero_ps()
    cdef __m512 a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z
    cdef __m512 c0 = z, c1 = z, c2 = z, c3 = z, d0 = z, d1 = z, d2 = z, d3 = z, x0, x1, x2, x3
    cdef __mmask16 k0 = _low_lanes(n), k1 = _low_lanes(n - 16) if n > 16 else 0
    cdef __mmask16 k2 = _low_lanes(n - 32) if n > 32 else 0, k3 = _low_lanes(n - 48) if n > 48 else 0
    cdef Py_ssize_t i, r, lines = (n + 15) // 16
    cdef const float* xi
    cdef float* yr
    for r in range(m):  # (the registers of rows past m stay 0 and are never stored)
        yr = y + r * y_stride
        x0 = _mm512_maskz_loadu_ps(k0, yr); x1 = _mm512_maskz_loadu_ps(k1, yr + 16)
        x2 = _mm512_maskz_loadu_ps(k2, yr + 32); x3 = _mm512_maskz_loadu_ps(k3, yr + 48)
        if r == 0:
            a0 = x0; a1 = x1; a2 = x2; a3 = x3
        elif r == 1:
            b0 = x0; b1 = x1; b2 = x2; b3 = x3
        elif r == 2:
            c0 = x0; c1 = x1; c2 = x2; c3 = x3
        else:
            d0 = x0; d1 = x1; d2 = x2; d3 = x3
    for i in range(n_x):
        xi = x + i * x_stride
        x0 = _mm512_maskz_loadu_ps(k0, xi); x1 = _mm512_maskz_loadu_ps(k1, xi + 16)
        x2 = _mm512_maskz_loadu_ps(k2, xi + 32); x3 = _mm512_maskz_loadu_ps(k3, xi + 48)
        _hint_stream(hint, end, 64 * lines)
        _axpy4(&a0, &a1, &a2, &a3, w[i], x0, x1, x2, x3)
        if m > 1:
            _axpy4(&b0, &b1, &b2, &b3, w[w_stride + i], x0, x1, x2, x3)
        if m > 2:
            _axpy4(&c0, &c1, &c2, &c3, w[2 * w_stride + i], x0, x1, x2, x3)
        if m > 3:
            _axpy4(&d0, &d1, &d2, &d3, w[3 * w_stride + i], x0, x1, x2, x3)
    for r in range(m):
        if r == 0:
            x0 = a0; x1 = a1; x2 = a2; x3 = a3
        elif r == 1:
            x0 = b0; x1 = b1; x2 = b2; x3 = b3
        elif r == 2:
            x0 = c0; x1 = c1; x2 = c2; x3 = c3
        else:
            x0 = d0; x1 = d1; x2 = d2; x3 = d3
        yr = y + r * y_stride
        _mm512_mask_storeu_ps(yr, k0, x0); _mm512_mask_storeu_ps(yr + 16, k1, x1)
        _mm512_mask_storeu_ps(yr + 32, k2, x2); _mm512_mask_storeu_ps(yr + 48, k3, x3)


cdef bint _weighted_few(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                        const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    """k_weighted_rows for m <= 4 rows and x rows n floats apart (a kv
    head's span of the head-major cache): up to 64 columns at a time in
    registers (_weighted_tile); rows of up to 64 columns in one pass over x,
    in the order of memory; wider ones in passes of FEW_PASS_ROWS x rows
    (in L1 while each 64 columns go over them), the hints a pass further
    ahead. Every value takes y = fma(w[r, i], x[i], y) in the order of i,
    as _weighted_rows_pass. False, with nothing done, for other shapes."""
    cdef Py_ssize_t i, k, c
    cdef const char* hint = <const char*> x + FEW_AHEAD_BYTES
    cdef const char* end = <const char*> (x + n_x * n)
    if m > 4 or x_stride != n:
        return False
    if n <= 64:
        _weighted_tile(y, y_stride, w, w_stride, m, x, n, n_x, n, &hint, end)
        return True
    hint += FEW_PASS_ROWS * n * sizeof(float)
    i = 0
    while i < n_x:
        k = min(<Py_ssize_t> FEW_PASS_ROWS, n_x - i)
        c = 0
        while c < n:
            _weighted_tile(y + c, y_stride, w + i, w_stride, m, x + i * n + c, n, k, min(n - c, 64), &hint, end)
            c += 64
        i += k
    return True


# k_dot_affine (see kernels/common.pxi): per 16 values, the exact weights
# f32(f32(a * q) - b) (one widening, one product, one subtraction) and one
# FMA with x. Two accumulators, so that two FMA chains run at once: the
# first 16 values of every 32 go to acc0, the last 16 to acc1; the 16 lanes
# of acc0 + acc1 summed as k_dot_q8_0's. (Two chains keep the FMAs' latency
# hidden behind each weight's forming, and let the GEMM run two passes per
# tile, not four.)

cdef inline __m512 _affine16(const int8_t* q, __m512 a, __m512 b, bint has_offset) noexcept nogil:
    """The exact weights f32(f32(a * q[0:16]) - b)."""
    # (a * q is exact for every type with an offset: one fused rounding is the same)
    return _mm512_fmsub_ps(_widen16(q), a, b) if has_offset else _mm512_mul_ps(_widen16(q), a)


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


cdef inline __m512 _affine_lanes(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                                 bint has_offset) noexcept nogil:
    """The 16 lanes k_dot_affine sums: acc0 + acc1."""
    cdef __m512 acc[2]
    cdef Py_ssize_t k, nb = cols // 32, rb = sub + 4 + (4 if has_offset else 0)
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]
    for k in range(nb):
        rec = _affine32(&acc[0], &acc[1], rec, x, sub, has_offset, rb)
        x += 32
    return _mm512_add_ps(acc[0], acc[1])


cdef float k_dot_affine(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                        bint has_offset) noexcept nogil:
    return _sum16(_affine_lanes(rec, x, cols, sub, has_offset))


cdef void _gemv_affine(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                       Py_ssize_t sub, bint has_offset) noexcept nogil:
    """k_gemv_affine as _gemv_blocks runs Q8_0 rows: one row after the other,
    eight rows' lanes summed at once by _sum16x8 (k_dot_affine's bits)."""
    cdef Py_ssize_t row_bytes = cols // sub * (sub + 4 + (4 if has_offset else 0)), r = 0, i
    cdef __m512 v[8]
    while r + 8 <= rows:
        for i in range(8):
            _prefetch_row(rec + (r + i) * row_bytes, row_bytes)
            v[i] = _affine_lanes(rec + (r + i) * row_bytes, x, cols, sub, has_offset)
        _sum16x8(out + r, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
        r += 8
    while r < rows:
        _prefetch_row(rec + r * row_bytes, row_bytes)
        out[r] = k_dot_affine(rec + r * row_bytes, x, cols, sub, has_offset)
        r += 1


cdef inline __m512 _q4_k16(__m512i levels, __m512 a, __m512 b) noexcept nogil:
    """_affine16's exact weights f32(f32(a * q) - b), from 16 levels in int32
    lanes, in one fused multiply-subtract (a * q is exact: Q4_K, Q4_1)."""
    return _mm512_fmsub_ps(_mm512_cvtepi32_ps(levels), a, b)


cdef inline void _q4_k_weights(__m512* v, const uint8_t* row, const float* ab, Py_ssize_t j,
                               __m512i m15) noexcept nogil:
    """v[0..3] = the exact weights of values 64 j .. 64 j + 63 of a Q4_K row
    (sub-blocks 2 j, 2 j + 1; ab their a, b): the low nibbles of the 32 bytes
    are sub-block 2 j (values 0-15, 16-31 in v[0], v[1]), the high nibbles
    sub-block 2 j + 1 (v[2], v[3]). The GEMV and the GEMM both form them here."""
    cdef const uint8_t* qs = _q4_k_qs(row, j)
    cdef __m512 a_lo = _mm512_set1_ps(ab[0]), b_lo = _mm512_set1_ps(ab[1])
    cdef __m512 a_hi = _mm512_set1_ps(ab[2]), b_hi = _mm512_set1_ps(ab[3])
    cdef __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> qs))
    cdef __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> (qs + 16)))
    v[0] = _q4_k16(_mm512_and_si512(b0, m15), a_lo, b_lo)
    v[1] = _q4_k16(_mm512_and_si512(b1, m15), a_lo, b_lo)
    v[2] = _q4_k16(_mm512_srli_epi32(b0, 4), a_hi, b_hi)
    v[3] = _q4_k16(_mm512_srli_epi32(b1, 4), a_hi, b_hi)


cdef inline __m512 _q4_k_lanes(const uint8_t* row, const float* ab, const float* x,
                               Py_ssize_t cols) noexcept nogil:
    # k_dot_affine's order with the levels unpacked in registers: sub-block
    # 2 j is the low nibbles of 32 bytes, sub-block 2 j + 1 their high
    # nibbles; each sub-block's values 0-15 into acc[0], 16-31 into acc[1]
    cdef __m512 acc[2]
    cdef __m512 v[4]
    cdef __m512i m15 = _mm512_set1_epi32(15)
    cdef Py_ssize_t j, n = cols // 64  # pairs of sub-blocks
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]
    for j in range(n):
        _q4_k_weights(v, row, ab, j, m15)
        acc[0] = _mm512_fmadd_ps(v[0], _mm512_loadu_ps(x), acc[0])
        acc[1] = _mm512_fmadd_ps(v[1], _mm512_loadu_ps(x + 16), acc[1])
        acc[0] = _mm512_fmadd_ps(v[2], _mm512_loadu_ps(x + 32), acc[0])
        acc[1] = _mm512_fmadd_ps(v[3], _mm512_loadu_ps(x + 48), acc[1])
        ab += 4
        x += 64
    return _mm512_add_ps(acc[0], acc[1])


cdef float k_dot_q4_k(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil:
    return _sum16(_q4_k_lanes(row, ab, x, cols))


cdef void _gemv_q4_k(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """The GEMV of a Q4_K matrix as _gemv_blocks runs Q8_0 rows: row after row,
    eight rows' lanes summed at once by _sum16x8 (k_dot_q4_k's bits)."""
    cdef Py_ssize_t nb = w.cols // Q4_K_BLOCK, row_bytes = nb * Q4_K_BYTES, r = 0, i
    cdef __m512 v[8]
    while r + 8 <= w.rows:
        for i in range(8):
            _prefetch_row(w.blocks + (r + i) * row_bytes, row_bytes)
            v[i] = _q4_k_lanes(w.blocks + (r + i) * row_bytes, w.ab + (r + i) * nb * 16, x, w.cols)
        _sum16x8(out + r, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
        r += 8
    while r < w.rows:
        _prefetch_row(w.blocks + r * row_bytes, row_bytes)
        out[r] = k_dot_q4_k(w.blocks + r * row_bytes, w.ab + r * nb * 16, x, w.cols)
        r += 1


cdef inline void _q4_1_weights(__m512* lo, __m512* hi, const uint8_t* block, __m512i m15) noexcept nogil:
    """The exact weights of one Q4_1 block as its record gives them (a =
    f32(d), b = -f32(m)): lo values 0-15 (the low nibbles of qs), hi values
    16-31 (the high ones). The GEMV and the GEMM both form them here."""
    cdef __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(<const __m128i*> (block + 4)))
    cdef __m512 a = _mm512_set1_ps(_block_d(block))
    cdef __m512 b = _mm512_set1_ps(-_block_d(block + 2))
    lo[0] = _q4_k16(_mm512_and_si512(v, m15), a, b)
    hi[0] = _q4_k16(_mm512_srli_epi32(v, 4), a, b)


cdef inline void _q4_1_step(__m512* lo, __m512* hi, const uint8_t* block, const float* x,
                            __m512i m15) noexcept nogil:
    """_affine32 of one Q4_1 block's record (of 32, with an offset: the levels
    are the low nibbles of qs, then the high ones; a = f32(d), b = -f32(m)),
    the levels unpacked in registers: lo += values 0-15 times x[0:16], hi
    values 16-31 times x[16:32]."""
    cdef __m512 w0, w1
    _q4_1_weights(&w0, &w1, block, m15)
    lo[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), lo[0])
    hi[0] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), hi[0])


cdef float _dot_q4_1(const uint8_t* row, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    """k_dot_affine of the row's records, bit for bit, straight from its Q4_1
    blocks: the same steps on the same values in the same order."""
    cdef __m512 acc[2]
    cdef __m512i m15 = _mm512_set1_epi32(15)
    cdef Py_ssize_t k
    cdef float lanes[16]
    acc[0] = _mm512_setzero_ps()
    acc[1] = acc[0]
    for k in range(n_blocks):
        _q4_1_step(&acc[0], &acc[1], row, x, m15)
        row += Q4_1_BYTES
        x += 32
    _mm512_storeu_ps(lanes, _mm512_add_ps(acc[0], acc[1]))
    return _sum8(lanes) + _sum8(lanes + 8)
