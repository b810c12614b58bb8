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
# positions and the phantom, 16 lanes up to 15; a 16th position is the GEMV.
#
# The scaling is the GEMV's (q8_x86.pxi, _row_sum_q8 and _scale_q8_0): per
# block s = f32(f32(d) * xd) (vmulps is the C float product), then
# acc += f64(isum) * f64(s) in f64 block after block, rounded once to f32
# at the end. The product has 20 + 24 significant bits, exact in f64, so
# the FMA rounds once, as the GEMV's add does: every (row, position) result
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


cdef void _row_positions8(float* res, const uint8_t* row, const uint8_t* acts, Py_ssize_t nb,
                          __m256i phantom) noexcept nogil:
    """res[p] = k_dot_q8_0_q8 of the Q8_0 row at row and position p, for
    the 8 lanes of acts (_position_lanes with lanes = 8; phantom: its lane
    index in every lane). Two integer accumulators per block halve the
    chain of vpdpbusd."""
    cdef __m512d acc = _mm512_setzero_pd()
    cdef __m256i s0, s1, isum
    cdef __m256 s
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef Py_ssize_t b
    for b in range(nb):
        x = acts + b * (POSITION_DWORDS + 1) * 32
        q = row + b * Q8_0_BYTES + 2
        s0 = gcy_dpbusd_bcst8(qp_setzero_si256(), _mm256_loadu_si256(<const __m256i*> x), q)
        s1 = gcy_dpbusd_bcst8(qp_setzero_si256(), _mm256_loadu_si256(<const __m256i*> (x + 32)), q + 4)
        s0 = gcy_dpbusd_bcst8(s0, _mm256_loadu_si256(<const __m256i*> (x + 64)), q + 8)
        s1 = gcy_dpbusd_bcst8(s1, _mm256_loadu_si256(<const __m256i*> (x + 96)), q + 12)
        s0 = gcy_dpbusd_bcst8(s0, _mm256_loadu_si256(<const __m256i*> (x + 128)), q + 16)
        s1 = gcy_dpbusd_bcst8(s1, _mm256_loadu_si256(<const __m256i*> (x + 160)), q + 20)
        s0 = gcy_dpbusd_bcst8(s0, _mm256_loadu_si256(<const __m256i*> (x + 192)), q + 24)
        s1 = gcy_dpbusd_bcst8(s1, _mm256_loadu_si256(<const __m256i*> (x + 224)), q + 28)
        isum = qp_add_epi32_256(s0, s1)
        isum = qp_sub_epi32_256(isum, qp_slli_epi32_256(qp_permutevar8x32(isum, phantom), 7))
        s = qp_mul_ps_256(qp_loadu_ps_256(<const float*> (x + 256)), qp_set1_ps_256(_block_d(q - 2)))
        acc = _mm512_fmadd_pd(_mm512_cvtepi32_pd(isum), _mm512_cvtps_pd(s), acc)
    _mm256_storeu_ps(res, _mm512_cvtpd_ps(acc))


cdef void _row_positions16(float* res, const uint8_t* row, const uint8_t* acts, Py_ssize_t nb,
                           __m512i phantom) noexcept nogil:
    """_row_positions8 on 16 lanes (_position_lanes with lanes = 16)."""
    cdef __m512d lo = _mm512_setzero_pd(), hi = lo
    cdef __m512i s0, s1, isum
    cdef __m512 s
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef Py_ssize_t b
    for b in range(nb):
        x = acts + b * (POSITION_DWORDS + 1) * 64
        q = row + b * Q8_0_BYTES + 2
        s0 = gcy_dpbusd_bcst(qp_setzero_si512(), _mm512_loadu_si512(x), q)
        s1 = gcy_dpbusd_bcst(qp_setzero_si512(), _mm512_loadu_si512(x + 64), q + 4)
        s0 = gcy_dpbusd_bcst(s0, _mm512_loadu_si512(x + 128), q + 8)
        s1 = gcy_dpbusd_bcst(s1, _mm512_loadu_si512(x + 192), q + 12)
        s0 = gcy_dpbusd_bcst(s0, _mm512_loadu_si512(x + 256), q + 16)
        s1 = gcy_dpbusd_bcst(s1, _mm512_loadu_si512(x + 320), q + 20)
        s0 = gcy_dpbusd_bcst(s0, _mm512_loadu_si512(x + 384), q + 24)
        s1 = gcy_dpbusd_bcst(s1, _mm512_loadu_si512(x + 448), q + 28)
        isum = qp_add_epi32(s0, s1)
        isum = qp_sub_epi32(isum, qp_slli_epi32(qp_permutexvar_epi32(phantom, isum), 7))
        s = _mm512_mul_ps(_mm512_loadu_ps(x + 512), _mm512_set1_ps(_block_d(q - 2)))
        lo = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(isum)),
                             _mm512_cvtps_pd(_mm512_castps512_ps256(s)), lo)
        hi = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(isum, 1)), _mm512_cvtps_pd(_upper8(s)),
                             hi)
    _mm256_storeu_ps(res, _mm512_cvtpd_ps(lo))
    _mm256_storeu_ps(res + 8, _mm512_cvtpd_ps(hi))


cdef bint _q8_0_positions(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          float* scratch) noexcept nogil:
    """k_gemm_q8 of a Q8_0 matrix at Q8_POSITIONS_MIN .. Q8_POSITIONS_MAX
    positions (the layout at the top of this file), row after row as
    stored; False (nothing written) for other calls. scratch:
    _gemm_q8_scratch_bytes(w.cols, n_tokens) bytes (more than the
    64 + nb * 576 this takes)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, row_bytes = nb * Q8_0_BYTES, rows = w.rows, r, t
    cdef Py_ssize_t lanes = 8 if n_tokens < 8 else 16
    cdef Py_ssize_t n_lanes = min(n_tokens, lanes - 1)  # positions in lanes; the rest (one) by the GEMV
    cdef uint8_t* acts = <uint8_t*> ((<size_t> scratch + 63) & ~(<size_t> 63))
    cdef const uint8_t* row
    cdef float res[16]
    if w.layout != QLAYOUT_Q8_0 or n_tokens < Q8_POSITIONS_MIN or n_tokens > Q8_POSITIONS_MAX or scratch == NULL:
        return False
    _position_lanes(acts, xq, xd, n_lanes, lanes, w.cols)
    for r in range(rows):
        row = w.blocks + r * row_bytes
        if not w.resident:
            _prefetch_row(row, row_bytes)
        if lanes == 8:
            _row_positions8(res, row, acts, nb, qp_set1_epi32_256(<int> n_lanes))
        else:
            _row_positions16(res, row, acts, nb, _mm512_set1_epi32(<int> n_lanes))
        for t in range(n_lanes):
            out[t * rows + r] = res[t]
        for t in range(n_lanes, n_tokens):
            out[t * rows + r] = k_dot_q8_0_q8(row, xq + t * w.cols, xd + t * nb, nb)
    return True
