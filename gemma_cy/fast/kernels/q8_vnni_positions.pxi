# A batch's decode step in the q8 mode with AVX-512 VNNI (avx512 module):
# Q8_POSITIONS_MIN .. Q8_POSITIONS_MAX positions, each of another sequence,
# through a Q8_0 matrix (and the Q8_0 tiles a Q5_0 matrix is converted to,
# _gemm_converted). The panel GEMM (q8_vnni.pxi) repacks every row into
# scratch per call, which a prefill block of 64 positions repays and 8 do
# not; the row GEMV (k_dot_q8_0_q8) pays its horizontal sums and scaling
# once per position. Here the positions sit in the 32-bit lanes instead of
# the rows, and each row is read as stored, straight from the matrix.
#
# The activations are laid out once per call (_position_lanes): per block
# of 32, eight vectors where lane p of vector k holds position p's bytes
# 4 k .. 4 k + 3 as uint8 (xq + 128), then one vector of the positions'
# block scales xd. vpdpbusd(acc, vector k, the row's dword k broadcast)
# adds every position's 4 products of dword k at once (uint8 activations
# times the int8 levels, as stored), so after the 8 dwords lane p holds
# sum (xq + 128) * q = sum xq * q + 128 * sum q. One lane past the
# positions (the phantom) holds bytes of 1, so it holds sum q; subtracting
# 128 times it (broadcast) leaves each lane's exact sum xq * q, an integer
# below 2^20 in magnitude. 8 lanes (a 256-bit vector) carry up to 7
# positions and the phantom, 16 lanes up to 15; an 8th position (with 8 lanes)
# or a 16th is the GEMV. vpdpbusd bounds the kernel (Zen 4: a 512-bit one
# costs two 256-bit ones), so what counts is the lanes in use: 8 positions
# ran 5.7 ms through a 65536 x 640 matrix as 7 in lanes and the GEMV, 6.8
# as 8 of 16 lanes. Rows go in groups (4 on 8 lanes, 2 on 16) that share
# each activation load, with hints into L2 for the rows ahead.
#
# The scaling is the GEMV's (q8_x86.pxi, _row_sum_q8 and _scale_q8_0): per
# block s = f32(f32(d) * xd) (vmulps is the C float product), then
# acc = fma(f32(isum), s, acc) in f32 block after block (the integer is
# exact in f32; vfmadd rounds once, as fmaf): every (row, position) result
# is k_dot_q8_0_q8's bits.

cdef extern from *:
    """
    /* vpdpbusd on 8 lanes with the weights' dword as an embedded broadcast
       memory operand ({1to8}), as gcy_dpbusd_bcst (q8_vnni.pxi) on 16. */
    static inline __m256i gcy_dpbusd_bcst8(__m256i acc, __m256i x, const void *w) {
        __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*(const int *)w));
        return acc;
    }
    """
    __m256i gcy_dpbusd_bcst8(__m256i acc, __m256i x, const void* w) nogil
    void qp_prefetch "__builtin_prefetch"(const void* p, int rw, int locality) nogil

cdef extern from "immintrin.h" nogil:
    __m512i qp_setzero_si512 "_mm512_setzero_si512"()
    __m512i qp_add_epi32 "_mm512_add_epi32"(__m512i a, __m512i b)
    __m512i qp_sub_epi32 "_mm512_sub_epi32"(__m512i a, __m512i b)
    __m512i qp_slli_epi32 "_mm512_slli_epi32"(__m512i a, unsigned int imm)
    __m512i qp_permutexvar_epi32 "_mm512_permutexvar_epi32"(__m512i idx, __m512i a)
    __m256i qp_setzero_si256 "_mm256_setzero_si256"()
    __m256i qp_set1_epi32_256 "_mm256_set1_epi32"(int a)
    __m256i qp_add_epi32_256 "_mm256_add_epi32"(__m256i a, __m256i b)
    __m256i qp_sub_epi32_256 "_mm256_sub_epi32"(__m256i a, __m256i b)
    __m256i qp_slli_epi32_256 "_mm256_slli_epi32"(__m256i a, int imm)
    __m256i qp_permutevar8x32 "_mm256_permutevar8x32_epi32"(__m256i a, __m256i idx)
    __m256 qp_loadu_ps_256 "_mm256_loadu_ps"(const float* p)
    __m256 qp_mul_ps_256 "_mm256_mul_ps"(__m256 a, __m256 b)
    __m256 qp_set1_ps_256 "_mm256_set1_ps"(float a)
    __m256 qp_setzero_ps_256 "_mm256_setzero_ps"()
    __m256 qp_cvtepi32_ps_256 "_mm256_cvtepi32_ps"(__m256i a)
    __m256 qp_fmadd_ps_256 "_mm256_fmadd_ps"(__m256 a, __m256 b, __m256 c)


cdef enum:
    Q8_POSITIONS_MIN = 3  # 2 positions run faster row by row (_rows_q8_positions)
    Q8_POSITIONS_MAX = 16
    POSITION_DWORDS = 8  # dwords per block of 32


cdef inline Py_ssize_t _position_block_bytes(Py_ssize_t lanes) noexcept nogil:
    """Bytes of one block's activations in _position_lanes' layout: 8
    vectors of uint8 levels, then one of f32 scales, each 4 * lanes bytes."""
    return (POSITION_DWORDS + 1) * 4 * lanes


cdef void _position_lanes(uint8_t* acts, const int8_t* xq, const float* xd, Py_ssize_t n_lanes,
                          Py_ssize_t lanes, Py_ssize_t cols) noexcept nogil:
    """acts (64-byte aligned; nb * _position_block_bytes(lanes) bytes) = the
    first n_lanes (< lanes) positions' blocks with positions in lanes (the
    layout at the top of this file), lane n_lanes the phantom (bytes of 1,
    scale 0), the lanes past it zero (computed, never stored)."""
    cdef Py_ssize_t nb = cols // Q8_0_BLOCK, block_bytes = _position_block_bytes(lanes), b, t, k
    cdef uint32_t dword
    cdef uint32_t* levels
    cdef uint8_t* blk
    memset(acts, 0, nb * block_bytes)
    for b in range(nb):
        blk = acts + b * block_bytes
        levels = <uint32_t*> blk
        for t in range(n_lanes):
            for k in range(POSITION_DWORDS):
                memcpy(&dword, xq + t * cols + b * Q8_0_BLOCK + 4 * k, 4)
                levels[k * lanes + t] = dword ^ 0x80808080u  # each byte + 128, as uint8
            (<float*> (blk + POSITION_DWORDS * 4 * lanes))[t] = xd[t * nb + b]
        for k in range(POSITION_DWORDS):
            levels[k * lanes + n_lanes] = 0x01010101u


cdef inline void _term8(__m256* acc, __m256i isum, __m256 xd, const uint8_t* block,
                       __m256i phantom) noexcept nogil:
    """acc = fma(f32(isum - 128 * isum[phantom]), f32(f32(d) * xd), acc) on 8
    lanes: one block's terms (exact integer, one rounding)."""
    isum = qp_sub_epi32_256(isum, qp_slli_epi32_256(qp_permutevar8x32(isum, phantom), 7))
    acc[0] = qp_fmadd_ps_256(qp_cvtepi32_ps_256(isum), qp_mul_ps_256(xd, qp_set1_ps_256(_block_d(block))), acc[0])


cdef void _rows_positions8(float* res, const uint8_t* r0, const uint8_t* r1, const uint8_t* r2,
                           const uint8_t* r3, const uint8_t* acts, Py_ssize_t nb, __m256i phantom) noexcept nogil:
    """res[8 i + p] = k_dot_q8_0_q8 of the Q8_0 row ri (as stored) and
    position p, for the 8 lanes of acts (_position_lanes with lanes = 8;
    phantom: its lane in every lane). Four rows share each activation load:
    the loads, not the products, bound one row at a time."""
    cdef __m256 f0 = qp_setzero_ps_256(), f1 = f0, f2 = f0, f3 = f0
    cdef __m256i s0, s1, s2, s3, x
    cdef __m256 xd
    cdef const uint8_t* p
    cdef Py_ssize_t b, k, o
    for b in range(nb):
        p = acts + b * (POSITION_DWORDS + 1) * 32
        o = b * Q8_0_BYTES + 2  # the block's levels
        x = _mm256_loadu_si256(<const __m256i*> p)
        s0 = gcy_dpbusd_bcst8(qp_setzero_si256(), x, r0 + o)
        s1 = gcy_dpbusd_bcst8(qp_setzero_si256(), x, r1 + o)
        s2 = gcy_dpbusd_bcst8(qp_setzero_si256(), x, r2 + o)
        s3 = gcy_dpbusd_bcst8(qp_setzero_si256(), x, r3 + o)
        for k in range(1, POSITION_DWORDS):
            x = _mm256_loadu_si256(<const __m256i*> (p + 32 * k))
            s0 = gcy_dpbusd_bcst8(s0, x, r0 + o + 4 * k)
            s1 = gcy_dpbusd_bcst8(s1, x, r1 + o + 4 * k)
            s2 = gcy_dpbusd_bcst8(s2, x, r2 + o + 4 * k)
            s3 = gcy_dpbusd_bcst8(s3, x, r3 + o + 4 * k)
        xd = qp_loadu_ps_256(<const float*> (p + POSITION_DWORDS * 32))
        _term8(&f0, s0, xd, r0 + o - 2, phantom)
        _term8(&f1, s1, xd, r1 + o - 2, phantom)
        _term8(&f2, s2, xd, r2 + o - 2, phantom)
        _term8(&f3, s3, xd, r3 + o - 2, phantom)
    _mm256_storeu_ps(res, f0)
    _mm256_storeu_ps(res + 8, f1)
    _mm256_storeu_ps(res + 16, f2)
    _mm256_storeu_ps(res + 24, f3)


cdef inline void _term16(__m512* acc, __m512i isum, __m512 xd, const uint8_t* block,
                         __m512i phantom) noexcept nogil:
    """_term8 on 16 lanes."""
    cdef __m512 s = _mm512_mul_ps(xd, _mm512_set1_ps(_block_d(block)))
    isum = qp_sub_epi32(isum, qp_slli_epi32(qp_permutexvar_epi32(phantom, isum), 7))
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[0])


cdef void _rows_positions16(float* res, const uint8_t* r0, const uint8_t* r1, const uint8_t* acts,
                            Py_ssize_t nb, __m512i phantom) noexcept nogil:
    """_rows_positions8 on 16 lanes (_position_lanes with lanes = 16) for
    two rows: res[16 i + p]."""
    cdef __m512 f0 = _mm512_setzero_ps(), f1 = f0
    cdef __m512i s0, s1, x
    cdef __m512 xd
    cdef const uint8_t* p
    cdef Py_ssize_t b, k, o
    for b in range(nb):
        p = acts + b * (POSITION_DWORDS + 1) * 64
        o = b * Q8_0_BYTES + 2
        x = _mm512_loadu_si512(p)
        s0 = gcy_dpbusd_bcst(qp_setzero_si512(), x, r0 + o)
        s1 = gcy_dpbusd_bcst(qp_setzero_si512(), x, r1 + o)
        for k in range(1, POSITION_DWORDS):
            x = _mm512_loadu_si512(p + 64 * k)
            s0 = gcy_dpbusd_bcst(s0, x, r0 + o + 4 * k)
            s1 = gcy_dpbusd_bcst(s1, x, r1 + o + 4 * k)
        xd = _mm512_loadu_ps(p + POSITION_DWORDS * 64)
        _term16(&f0, s0, xd, r0 + o - 2, phantom)
        _term16(&f1, s1, xd, r1 + o - 2, phantom)
    _mm512_storeu_ps(res, f0)
    _mm512_storeu_ps(res + 16, f1)


cdef inline void _prefetch_l2(const uint8_t* at, Py_ssize_t n_bytes) noexcept nogil:
    """Hints (prefetcht2: into L2, not L1) for the 64-byte lines of
    n_bytes at at: rows GEMV_PREFETCH_ROWS groups ahead, as far in time as
    the GEMV's hints; in L1 they would evict each other and the activations."""
    cdef Py_ssize_t b
    for b in range(0, n_bytes, 64):
        qp_prefetch(at + b, 0, 1)


cdef bint _q8_0_positions(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          float* scratch) noexcept nogil:
    """k_gemm_q8 of a Q8_0 matrix at Q8_POSITIONS_MIN .. Q8_POSITIONS_MAX
    positions (the layout at the top of this file), rows as stored, in
    groups of 4 (8 lanes) or 2 (16 lanes), a last group's missing rows the
    last row again (computed, never stored); False (nothing written) for
    other calls. scratch: _gemm_q8_scratch_bytes(w.cols, n_tokens) bytes
    (more than the 64 + nb * 576 this takes)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, row_bytes = nb * Q8_0_BYTES, rows = w.rows, r, i, t
    cdef Py_ssize_t lanes = 8 if n_tokens <= 8 else 16
    cdef Py_ssize_t group = 4 if lanes == 8 else 2
    cdef Py_ssize_t n_lanes = min(n_tokens, lanes - 1)  # positions in lanes; the rest (one) by the GEMV
    cdef uint8_t* acts = <uint8_t*> ((<size_t> scratch + 63) & ~(<size_t> 63))
    cdef const uint8_t* row[4]
    cdef float res[4 * 8]
    if w.layout != QLAYOUT_Q8_0 or n_tokens < Q8_POSITIONS_MIN or n_tokens > Q8_POSITIONS_MAX or scratch == NULL:
        return False
    _position_lanes(acts, xq, xd, n_lanes, lanes, w.cols)
    r = 0
    while r < rows:
        for i in range(group):
            row[i] = w.blocks + min(r + i, rows - 1) * row_bytes
        if not w.resident:
            _prefetch_l2(row[0] + GEMV_PREFETCH_ROWS * group * row_bytes, group * row_bytes)
        if lanes == 8:
            _rows_positions8(res, row[0], row[1], row[2], row[3], acts, nb, qp_set1_epi32_256(<int> n_lanes))
        else:
            _rows_positions16(res, row[0], row[1], acts, nb, _mm512_set1_epi32(<int> n_lanes))
        for i in range(min(group, rows - r)):
            for t in range(n_lanes):
                out[t * rows + r + i] = res[i * lanes + t]
            for t in range(n_lanes, n_tokens):
                out[t * rows + r + i] = k_dot_q8_0_q8(row[i], xq + t * w.cols, xd + t * nb, nb)
        r += group
    return True
