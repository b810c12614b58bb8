# The q8 mode's GEMM (k_gemm_q8, prefill) with AVX-512 VNNI, for the avx512
# module (built with -mavx512vnni; gemma_cy.fast.ops runs it only on a CPU
# that has VNNI). The contract and the one order of every q8 product are in
# api.pxi and q8_x86.pxi: per block of 32 (or record of 16) an exact integer
# sum, added times the block's f32 scale to the row's f32 sum by one FMA,
# block after block. Only the integer sums are grouped differently
# here (any grouping of exact integers gives the same integer), so the
# results are the GEMV's (k_dot_*_q8) and the reference's Q8Matrix bit for
# bit.
#
# Layout: a panel of PANEL_ROWS = 16 rows, repacked once per call into
# scratch and reused for every position. Per block of 32 values, eight
# vectors of 64 bytes: 32-bit lane i of vector k holds row i's values
# 4 k .. 4 k + 3 (as uint8: level + 128), then the rows' scales (16 f32 a:
# f32(d) of a Q8_0 block, 1 for int8 rows, a of an affine record) and, for
# the affine types with an offset, their 16 b; a block of two records of 16
# holds the first record's values in vectors 0-3, the second's in 4-7, then
# a0, a1 (and b0, b1). So each lane is a row and no horizontal sum is
# needed: vpdpbusd(acc, panel vector k, activation dword k broadcast)
# accumulates every row's 4 products of dword k at once, and after the 8 (or
# 4) of a record acc holds the 16 rows' sums of (q + 128) * xq. Starting acc
# at -128 * sum(xq) of the record (kept with the activations) leaves the exact
# sum q * xq: |partial sums| < 2^21. The scaling then runs in f32 on the 16
# lanes, one FMA per term, as the GEMV's fmaf: acc = fma(f32(isum),
# f32(a * xd), acc), then for an offset acc = fma(-f32(sum xq), f32(b * xd),
# acc) (vfnmadd: -(x y) + acc, rounded once): docs/numerics.md#activation-modes.
#
# The activations are laid out once per call as PanelBlocks (below): block
# b of position t at b * n_pad + t, so the four positions that share each
# panel vector load (eight loads for 32 vpdpbusd) sit side by side; the
# positions are padded with zeros to a multiple of four, and the rows of a
# last, partial panel are copies of the last row: both are computed and
# never stored.

from libc.string cimport memset

cdef extern from *:
    """
    #include <immintrin.h>
    /* vpdpbusd with the activation dword as an embedded broadcast memory
       operand ({1to16}): gcc does not fold _mm512_set1_epi32(load) into it. */
    static inline __m512i gcy_dpbusd_bcst(__m512i acc, __m512i w, const void *x) {
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int *)x));
        return acc;
    }
    """
    __m512i gcy_dpbusd_bcst(__m512i acc, __m512i w, const void* x) nogil

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m256i:
        pass
    ctypedef struct __m256:
        pass
    __m512i _mm512_loadu_si512(const void* p)
    void _mm512_storeu_si512(void* p, __m512i a)
    __m512i _mm512_castsi256_si512(__m256i a)
    __m256i _mm512_castsi512_si256(__m512i a)
    __m512i _mm512_inserti64x4(__m512i a, __m256i b, int imm)
    __m256i _mm512_extracti64x4_epi64(__m512i a, int imm)
    __m512i _mm512_unpacklo_epi32(__m512i a, __m512i b)
    __m512i _mm512_unpackhi_epi32(__m512i a, __m512i b)
    __m512i _mm512_unpacklo_epi64(__m512i a, __m512i b)
    __m512i _mm512_unpackhi_epi64(__m512i a, __m512i b)
    __m512i _mm512_permutex2var_epi64(__m512i a, __m512i idx, __m512i b)
    __m512i _mm512_set_epi64(long long e7, long long e6, long long e5, long long e4, long long e3,
                             long long e2, long long e1, long long e0)
    __m512i _mm512_xor_si512(__m512i a, __m512i b)
    __m512i _mm512_add_epi32(__m512i a, __m512i b)
    __m512i _mm512_and_si512(__m512i a, __m512i b)
    __m512i _mm512_or_si512(__m512i a, __m512i b)
    __m512i _mm512_srli_epi16(__m512i a, unsigned int imm)
    __m512i _mm512_slli_epi16(__m512i a, unsigned int imm)
    __m512i _mm512_set1_epi8(char a)
    ctypedef unsigned long long __mmask64
    __mmask64 _mm512_test_epi8_mask(__m512i a, __m512i b)
    __m512i _mm512_mask_add_epi8(__m512i src, __mmask64 k, __m512i a, __m512i b)
    __m512i _mm512_sub_epi8(__m512i a, __m512i b)
    __m512i _mm512_add_epi8(__m512i a, __m512i b)
    __m512 _mm512_fnmadd_ps(__m512 a, __m512 b, __m512 c)
    void _mm256_storeu_ps(float* p, __m256 a)
    __m256i _mm256_loadu_si256(const __m256i* p)
    __m256i _mm256_set1_epi8(char a)
    __m256i _mm256_and_si256(__m256i a, __m256i b)
    __m256i _mm256_srli_epi16(__m256i a, int imm)
    __m256i _mm256_inserti128_si256(__m256i a, __m128i b, int imm)
    __m256i _mm256_castsi128_si256(__m128i a)


cdef enum:
    PANEL_POSITIONS = 4  # positions that share each panel vector load
    PANEL_LEVEL_BYTES = 512  # a block's 32 values of 16 rows
    PANEL_MAX_BLOCK_BYTES = 768  # with four scale vectors (records of 16 with offsets)


# One position's block of 32 quantized activations as the panel kernel reads
# them (64 bytes): the four positions of a step sit side by side, so that one
# pointer reaches them all.
cdef struct PanelBlock:
    int8_t xq[32]
    float xd  # the block's scale
    int32_t bias[2]  # -128 * sum xq over each record of the block (one of 32, or two of 16)
    float qsum[2]  # sum xq over the same records (the offset terms; exact)


cdef Py_ssize_t _gemm_q8_scratch_bytes(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    """A panel (64-byte aligned), then the activations as PanelBlocks, the
    positions padded to a multiple of PANEL_POSITIONS."""
    cdef Py_ssize_t n_pad = (max(n_tokens, 1) + PANEL_POSITIONS - 1) // PANEL_POSITIONS * PANEL_POSITIONS
    return 64 + cols // 32 * (PANEL_MAX_BLOCK_BYTES + n_pad * <Py_ssize_t> sizeof(PanelBlock))


cdef inline void _pack_levels(uint8_t* dst, const __m256i* y) noexcept nogil:
    """dst (8 x 64 bytes) = the 16 rows' 32 levels y[i] as panel vectors:
    lane i of vector k = y[i]'s bytes 4 k .. 4 k + 3, each + 128 (uint8).
    Rows i and i + 8 share a vector; an 8 x 8 dword transpose in each half
    (unpacks), then the halves' 128-bit lanes put in row order."""
    cdef __m512i z[8]
    cdef __m512i t[8]
    cdef __m512i u, v
    cdef __m512i flip = _mm512_set1_epi32(-0x7F7F7F80)  # 0x80808080
    cdef __m512i first = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0)  # column k < 4 of rows 0-15
    cdef __m512i second = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2)  # column k + 4
    cdef Py_ssize_t j, k
    for j in range(8):
        z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(y[j]), y[j + 8], 1)
    for j in range(4):
        t[2 * j] = _mm512_unpacklo_epi32(z[2 * j], z[2 * j + 1])
        t[2 * j + 1] = _mm512_unpackhi_epi32(z[2 * j], z[2 * j + 1])
    for k in range(4):  # u: rows 0-3 | 8-11, columns k, k + 4; v: rows 4-7 | 12-15
        if k % 2 == 0:
            u = _mm512_unpacklo_epi64(t[k // 2], t[k // 2 + 2])
            v = _mm512_unpacklo_epi64(t[k // 2 + 4], t[k // 2 + 6])
        else:
            u = _mm512_unpackhi_epi64(t[k // 2], t[k // 2 + 2])
            v = _mm512_unpackhi_epi64(t[k // 2 + 4], t[k // 2 + 6])
        _mm512_storeu_si512(dst + 64 * k, _mm512_xor_si512(_mm512_permutex2var_epi64(u, first, v), flip))
        _mm512_storeu_si512(dst + 64 * (k + 4), _mm512_xor_si512(_mm512_permutex2var_epi64(u, second, v), flip))


cdef void _pack_panel(uint8_t* panel, const QMatrix* w, Py_ssize_t r0, Py_ssize_t block_bytes) noexcept nogil:
    """Rows r0 .. r0 + 15 of w as a panel (the layout above); rows past the
    last are copies of it."""
    cdef __m256i y[16]
    cdef PanelRows rows
    cdef Py_ssize_t b
    _panel_rows(&rows, w, r0)
    for b in range(w.cols // 32):
        _panel_block(<q8_m256i*> y, <float*> (panel + b * block_bytes + PANEL_LEVEL_BYTES), w, &rows, b)
        _pack_levels(panel + b * block_bytes, y)


cdef void _panel_activations(PanelBlock* acts, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                             Py_ssize_t n_pad, Py_ssize_t cols, Py_ssize_t size) noexcept nogil:
    """acts[b * n_pad + t] = block b of position t (PanelBlock), positions
    n_tokens .. n_pad - 1 all zeros (computed with the rest, never stored)."""
    cdef Py_ssize_t nb = cols // 32, b, t, h, i
    cdef int32_t total
    cdef PanelBlock* blk
    memset(acts, 0, nb * n_pad * sizeof(PanelBlock))
    for t in range(n_tokens):
        for b in range(nb):
            blk = acts + b * n_pad + t
            memcpy(blk.xq, xq + t * cols + 32 * b, 32)
            blk.xd = xd[t * nb + b]
            for h in range(32 // size):
                total = 0
                for i in range(h * size, (h + 1) * size):
                    total += blk.xq[i]
                blk.bias[h] = -128 * total
                blk.qsum[h] = total


cdef inline __m512i _isum(const __m512i* w, Py_ssize_t n, const int8_t* x, int32_t bias) noexcept nogil:
    """The 16 rows' exact sums of q * x over 4 n values: vpdpbusd of the
    panel vectors w[0 .. n - 1] with each dword of x broadcast."""
    cdef __m512i acc = _mm512_set1_epi32(bias)
    cdef Py_ssize_t k
    for k in range(n):
        acc = gcy_dpbusd_bcst(acc, w[k], x + 4 * k)
    return acc


cdef inline void _add_term(__m512* acc, __m512i isum, __m512 a, float xd) noexcept nogil:
    """acc = fma(f32(isum), f32(a * xd), acc), 16 rows (one rounding each)."""
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(a, _mm512_set1_ps(xd)), acc[0])


cdef inline void _sub_offset(__m512* acc, __m512 b, float xd, float qsum) noexcept nogil:
    """acc = fma(-qsum, f32(b * xd), acc), 16 rows (one rounding each)."""
    acc[0] = _mm512_fnmadd_ps(_mm512_set1_ps(qsum), _mm512_mul_ps(b, _mm512_set1_ps(xd)), acc[0])


cdef inline void _position_block(__m512* acc, const __m512i* wv, __m512 a0, __m512 a1, __m512 b0,
                                 __m512 b1, bint sub16, bint offset, const PanelBlock* x) noexcept nogil:
    """One position's terms of one block for the panel's 16 rows, in order:
    record 0 (a0, b0), then for records of 16 record 1 (a1, b1)."""
    if sub16:
        _add_term(acc, _isum(wv, 4, x.xq, x.bias[0]), a0, x.xd)
        if offset:
            _sub_offset(acc, b0, x.xd, x.qsum[0])
        _add_term(acc, _isum(wv + 4, 4, x.xq + 16, x.bias[1]), a1, x.xd)
        if offset:
            _sub_offset(acc, b1, x.xd, x.qsum[1])
    else:
        _add_term(acc, _isum(wv, 8, x.xq, x.bias[0]), a0, x.xd)
        if offset:
            _sub_offset(acc, b0, x.xd, x.qsum[0])


cdef void _panel_positions(float* res, const uint8_t* panel, Py_ssize_t nb, Py_ssize_t block_bytes,
                           bint sub16, bint offset, const PanelBlock* acts, Py_ssize_t n_pad, bint scaled,
                           float scale) noexcept nogil:
    """res[16 j + i] = the q8 product of panel row i and position j < 4
    (acts[b * n_pad + j], block b): the f32 sum block after block, times
    scale when scaled (int8 rows). The four positions' sums are four named
    registers (an array here would live in memory)."""
    cdef __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0
    cdef __m512i wv[8]
    cdef __m512 a0, a1 = _mm512_setzero_ps(), b0 = a1, b1 = a1
    cdef Py_ssize_t b, k
    cdef const uint8_t* p
    for b in range(nb):
        p = panel + b * block_bytes
        for k in range(8):
            wv[k] = _mm512_loadu_si512(p + 64 * k)
        a0 = _mm512_loadu_ps(p + PANEL_LEVEL_BYTES)
        if sub16:
            a1 = _mm512_loadu_ps(p + PANEL_LEVEL_BYTES + 64)
            if offset:
                b0 = _mm512_loadu_ps(p + PANEL_LEVEL_BYTES + 128)
                b1 = _mm512_loadu_ps(p + PANEL_LEVEL_BYTES + 192)
        elif offset:
            b0 = _mm512_loadu_ps(p + PANEL_LEVEL_BYTES + 64)
        _position_block(&f0, wv, a0, a1, b0, b1, sub16, offset, acts)
        _position_block(&f1, wv, a0, a1, b0, b1, sub16, offset, acts + 1)
        _position_block(&f2, wv, a0, a1, b0, b1, sub16, offset, acts + 2)
        _position_block(&f3, wv, a0, a1, b0, b1, sub16, offset, acts + 3)
        acts += n_pad
    if scaled:
        f0 = _mm512_mul_ps(f0, _mm512_set1_ps(scale))
        f1 = _mm512_mul_ps(f1, _mm512_set1_ps(scale))
        f2 = _mm512_mul_ps(f2, _mm512_set1_ps(scale))
        f3 = _mm512_mul_ps(f3, _mm512_set1_ps(scale))
    _mm512_storeu_ps(res, f0)
    _mm512_storeu_ps(res + 16, f1)
    _mm512_storeu_ps(res + 32, f2)
    _mm512_storeu_ps(res + 48, f3)


cdef void _gemm_q8_panels(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          uint8_t* scratch) noexcept nogil:
    """k_gemm_q8 by panels of 16 rows (the layout above), every position of
    the call against one panel before the next is packed; scratch:
    _gemm_q8_scratch_bytes(w.cols, n_tokens) bytes."""
    cdef Py_ssize_t rows = w.rows, nb = w.cols // 32, size = _panel_record(w), r0, n, t, j
    cdef Py_ssize_t n_pad = (n_tokens + PANEL_POSITIONS - 1) // PANEL_POSITIONS * PANEL_POSITIONS
    cdef bint offset = _panel_offset(w), sub16 = size == 16, scaled = w.layout == QLAYOUT_I8_TENSOR
    cdef Py_ssize_t block_bytes = PANEL_LEVEL_BYTES + 64 * (32 // size) * (2 if offset else 1)
    cdef uint8_t* panel = <uint8_t*> ((<size_t> scratch + 63) & ~(<size_t> 63))
    cdef PanelBlock* acts = <PanelBlock*> (panel + nb * PANEL_MAX_BLOCK_BYTES)
    cdef float res[PANEL_POSITIONS * PANEL_ROWS]
    _panel_activations(acts, xq, xd, n_tokens, n_pad, w.cols, size)
    r0 = 0
    while r0 < rows:
        n = min(<Py_ssize_t> PANEL_ROWS, rows - r0)
        _pack_panel(panel, w, r0, block_bytes)
        if not w.resident:
            _prefetch_panel(w, r0 + PANEL_ROWS)
        t = 0
        while t < n_tokens:
            _panel_positions(res, panel, nb, block_bytes, sub16, offset, acts + t, n_pad, scaled,
                             w.scale if scaled else 1.0)
            for j in range(min(<Py_ssize_t> PANEL_POSITIONS, n_tokens - t)):
                memcpy(out + (t + j) * rows + r0, res + j * PANEL_ROWS, n * sizeof(float))
            t += PANEL_POSITIONS
        r0 += PANEL_ROWS


# --- Panels stored at load (QLAYOUT_Q8_PANELS, api.pxi): the q8 mode of
# this module packs every Q8_0 matrix of 16 k rows once (forward_weights.pxi),
# in the layout above, so no call repacks, and a decode step streams each
# matrix as one run of aligned 64-byte vectors that vpdpbusd takes whole:
# no horizontal sums, no 34-byte blocks straddling lines. The sums are
# _gemm_q8_panels' (per block the exact integer sum, then one FMA with
# f32(d * xd), block after block), so every result is the Q8_0 matrix's.

cdef bint k_q8_stores_panels() noexcept nogil:
    return True


cdef void k_pack_q8_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    cdef Py_ssize_t nb = w.cols // 32, r = r0
    if w.layout == QLAYOUT_Q4_K or w.layout == QLAYOUT_Q4_1:
        _pack_q4_panels(dst, w, r0, r1)
        return
    if w.layout == QLAYOUT_Q5_0:
        _pack_q5_panels(dst, w, r0, r1)
        return
    cdef Py_ssize_t size = Q8_PANEL_BLOCK_BYTES  # a Q8_0 matrix's blocks; an affine one's:
    if w.layout == QLAYOUT_AFFINE:
        size = _affine_panel_block_bytes(w.sub, w.has_offset)
    while r < r1:
        _pack_panel(dst + r // PANEL_ROWS * nb * size, w, r, size)
        r += PANEL_ROWS


cdef void _pack_q4_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """k_pack_q8_panels of a Q4_K or Q4_1 matrix: each block as _pack_panel lays it
    out (levels + 128, a, b), its level vectors k and k + 4 folded into one
    of nibbles (the + 128 taken off: levels 0 .. 15), then a and b."""
    cdef Py_ssize_t nb = w.cols // 32, r = r0, b, k
    cdef __m256i y[16]
    cdef PanelRows rows
    cdef uint8_t tmp[PANEL_LEVEL_BYTES + 128]
    cdef uint8_t* blk
    cdef __m512i m15 = _mm512_set1_epi8(15)
    while r < r1:
        _panel_rows(&rows, w, r)
        for b in range(nb):
            blk = dst + (r // PANEL_ROWS * nb + b) * Q4_PANEL_BLOCK_BYTES
            _panel_block(<q8_m256i*> y, <float*> (tmp + PANEL_LEVEL_BYTES), w, &rows, b)
            _pack_levels(tmp, y)
            for k in range(4):
                _mm512_storeu_si512(blk + 64 * k, _mm512_or_si512(
                    _mm512_and_si512(_mm512_loadu_si512(tmp + 64 * k), m15),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_loadu_si512(tmp + 64 * (k + 4)), m15), 4)))
            memcpy(blk + 256, tmp + PANEL_LEVEL_BYTES, 128)  # a, then b
        r += PANEL_ROWS


cdef void _pack_q5_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """k_pack_q8_panels of a Q5_0 matrix: each block as _pack_panel lays out
    its Q8_0 conversion (levels + 128, f32(d)), the levels then made level +
    16 (0 .. 31): the low four bits of vectors k and k + 4 folded into one
    of nibbles, each vector's fifth bits a 64-bit word, then f32(d)."""
    cdef Py_ssize_t nb = w.cols // 32, r = r0, b, k
    cdef __m256i y[16]
    cdef PanelRows rows
    cdef uint8_t tmp[PANEL_LEVEL_BYTES + 64]
    cdef uint8_t* blk
    cdef __m512i m15 = _mm512_set1_epi8(15), to5 = _mm512_set1_epi8(112), bit4 = _mm512_set1_epi8(16)
    cdef __m512i v[8]
    cdef __mmask64 fifth
    while r < r1:
        _panel_rows(&rows, w, r)
        for b in range(nb):
            blk = dst + (r // PANEL_ROWS * nb + b) * Q5_PANEL_BLOCK_BYTES
            _panel_block(<q8_m256i*> y, <float*> (tmp + PANEL_LEVEL_BYTES), w, &rows, b)
            _pack_levels(tmp, y)
            for k in range(8):  # level + 128 - 112: 0 .. 31
                v[k] = _mm512_sub_epi8(_mm512_loadu_si512(tmp + 64 * k), to5)
                fifth = _mm512_test_epi8_mask(v[k], bit4)
                memcpy(blk + 256 + 8 * k, &fifth, 8)
            for k in range(4):
                _mm512_storeu_si512(blk + 64 * k, _mm512_or_si512(
                    _mm512_and_si512(v[k], m15), _mm512_slli_epi16(_mm512_and_si512(v[k + 4], m15), 4)))
            memcpy(blk + 320, tmp + PANEL_LEVEL_BYTES, 64)  # f32(d)
        r += PANEL_ROWS


cdef inline void _q5_levels(__m512i* wv, const uint8_t* blk) noexcept nogil:
    """The eight level vectors of a QLAYOUT_Q5_PANELS block: level + 16
    (uint8, 0 .. 31), the fifth bit added by a masked add of 16."""
    cdef __m512i m15 = _mm512_set1_epi8(15), bit4 = _mm512_set1_epi8(16)
    cdef __m512i v, lo
    cdef __mmask64 fifth
    cdef Py_ssize_t k
    for k in range(4):
        v = _mm512_loadu_si512(blk + 64 * k)
        lo = _mm512_and_si512(v, m15)
        memcpy(&fifth, blk + 256 + 8 * k, 8)
        wv[k] = _mm512_mask_add_epi8(lo, fifth, lo, bit4)
        lo = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15)
        memcpy(&fifth, blk + 256 + 8 * (k + 4), 8)
        wv[k + 4] = _mm512_mask_add_epi8(lo, fifth, lo, bit4)


cdef inline void _q5_panel_one(float* res, const uint8_t* panel, Py_ssize_t nb, const PanelBlock* acts,
                               Py_ssize_t n_pad) noexcept nogil:
    """_panel_one of a QLAYOUT_Q5_PANELS panel: the levels + 16 against a
    bias of -16 sum xq (bias[0] / 8: exact), so each block's integer sum is
    the Q8_0 conversion's, then _panel_one's one FMA with f32(d * xd)."""
    cdef __m512 f = _mm512_setzero_ps()
    cdef __m512i wv[8]
    cdef Py_ssize_t b
    for b in range(nb):
        _q5_levels(wv, panel)
        _add_term(&f, _mm512_add_epi32(_isum(wv, 4, acts.xq, acts.bias[0] // 8), _isum(wv + 4, 4, acts.xq + 16, 0)),
                  _mm512_loadu_ps(panel + 320), acts.xd)
        panel += Q5_PANEL_BLOCK_BYTES
        acts += n_pad
    _mm512_storeu_ps(res, f)


cdef void _q5_unpack_panel(uint8_t* dst, const uint8_t* panel, Py_ssize_t nb) noexcept nogil:
    """A QLAYOUT_Q5_PANELS panel as a QLAYOUT_Q8_PANELS one (levels + 128,
    f32(d)), for the four-position kernel."""
    cdef __m512i wv[8]
    cdef __m512i to8 = _mm512_set1_epi8(112)
    cdef Py_ssize_t b, k
    for b in range(nb):
        _q5_levels(wv, panel)
        for k in range(8):
            _mm512_storeu_si512(dst + 64 * k, _mm512_add_epi8(wv[k], to8))
        memcpy(dst + PANEL_LEVEL_BYTES, panel + 320, 64)
        dst += Q8_PANEL_BLOCK_BYTES
        panel += Q5_PANEL_BLOCK_BYTES


cdef inline void _q4_levels(__m512i* wv, const uint8_t* blk) noexcept nogil:
    """The eight level vectors of a QLAYOUT_Q4_PANELS block as a
    QLAYOUT_Q8_PANELS block holds them (levels + 128)."""
    cdef __m512i m15 = _mm512_set1_epi8(15), top = _mm512_set1_epi8(-128)
    cdef __m512i v
    cdef Py_ssize_t k
    for k in range(4):
        v = _mm512_loadu_si512(blk + 64 * k)
        wv[k] = _mm512_or_si512(_mm512_and_si512(v, m15), top)
        wv[k + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m15), top)


cdef inline void _q4_panel_one(float* res, const uint8_t* panel, Py_ssize_t nb, const PanelBlock* acts,
                               Py_ssize_t n_pad) noexcept nogil:
    """_panel_one of a QLAYOUT_Q4_PANELS panel: per block the exact integer
    sum (two chains), then the a term and the b offset, _position_block's
    order for records of 32 with an offset."""
    cdef __m512 f = _mm512_setzero_ps()
    cdef __m512i wv[8]
    cdef Py_ssize_t b, k
    for b in range(nb):
        _q4_levels(wv, panel)
        _add_term(&f, _mm512_add_epi32(_isum(wv, 4, acts.xq, acts.bias[0]), _isum(wv + 4, 4, acts.xq + 16, 0)),
                  _mm512_loadu_ps(panel + 256), acts.xd)
        _sub_offset(&f, _mm512_loadu_ps(panel + 320), acts.xd, acts.qsum[0])
        panel += Q4_PANEL_BLOCK_BYTES
        acts += n_pad
    _mm512_storeu_ps(res, f)


cdef void _q4_unpack_panel(uint8_t* dst, const uint8_t* panel, Py_ssize_t nb) noexcept nogil:
    """A QLAYOUT_Q4_PANELS panel as _pack_panel lays out a Q4_K one (block
    bytes PANEL_LEVEL_BYTES + 128), for the four-position kernel."""
    cdef __m512i wv[8]
    cdef Py_ssize_t b, k
    for b in range(nb):
        _q4_levels(wv, panel)
        for k in range(8):
            _mm512_storeu_si512(dst + 64 * k, wv[k])
        memcpy(dst + PANEL_LEVEL_BYTES, panel + 256, 128)
        dst += PANEL_LEVEL_BYTES + 128
        panel += Q4_PANEL_BLOCK_BYTES


cdef inline void _panel_one(float* res, const uint8_t* panel, Py_ssize_t nb, const PanelBlock* acts,
                            Py_ssize_t n_pad) noexcept nogil:
    """res[i] = the q8 product of panel row i and one position (acts[b *
    n_pad], block b): _panel_positions' first position alone. No prefetch
    hints: a panel matrix is one contiguous run in 2 MiB pages, which the
    hardware's own prefetch streams (hints 4 KiB ahead cost a decode step 5%:
    docs/benchmarks.md#what-was-tried)."""
    cdef __m512 f = _mm512_setzero_ps()
    cdef __m512i wv[8]
    cdef __m512i lo, hi
    cdef Py_ssize_t b, k
    for b in range(nb):
        for k in range(8):
            wv[k] = _mm512_loadu_si512(panel + 64 * k)
        # two chains of four (an exact integer sum in any grouping)
        lo = _isum(wv, 4, acts.xq, acts.bias[0])
        hi = _isum(wv + 4, 4, acts.xq + 16, 0)
        _add_term(&f, _mm512_add_epi32(lo, hi), _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES), acts.xd)
        panel += Q8_PANEL_BLOCK_BYTES
        acts += n_pad
    _mm512_storeu_ps(res, f)


cdef inline void _affine_panel_one(float* res, const uint8_t* panel, Py_ssize_t nb, Py_ssize_t block_bytes,
                                   bint sub16, bint offset, const PanelBlock* acts, Py_ssize_t n_pad) noexcept nogil:
    """_panel_one of a QLAYOUT_AFFINE_PANELS panel: _panel_positions' first
    position alone (_position_block's order)."""
    cdef __m512 f = _mm512_setzero_ps()
    cdef __m512i wv[8]
    cdef __m512 a0, a1 = _mm512_setzero_ps(), b0 = a1, b1 = a1
    cdef Py_ssize_t b, k
    for b in range(nb):
        for k in range(8):
            wv[k] = _mm512_loadu_si512(panel + 64 * k)
        a0 = _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES)
        if sub16:
            a1 = _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES + 64)
            if offset:
                b0 = _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES + 128)
                b1 = _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES + 192)
        elif offset:
            b0 = _mm512_loadu_ps(panel + PANEL_LEVEL_BYTES + 64)
        _position_block(&f, wv, a0, a1, b0, b1, sub16, offset, acts)
        panel += block_bytes
        acts += n_pad
    _mm512_storeu_ps(res, f)


cdef void _gemm_q8_stored(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          uint8_t* scratch) noexcept nogil:
    """k_gemm_q8 of a matrix packed at load (_stored_panels): one position
    panel by panel (_panel_one, _q4_panel_one, _q5_panel_one,
    _affine_panel_one), more four at a time (_panel_positions, a Q4 or Q5
    panel unpacked first); scratch: as _gemm_q8_panels'."""
    cdef Py_ssize_t nb = w.cols // 32, p, t, j
    cdef Py_ssize_t n_pad = (n_tokens + PANEL_POSITIONS - 1) // PANEL_POSITIONS * PANEL_POSITIONS
    cdef bint q4 = w.layout == QLAYOUT_Q4_PANELS, affine = w.layout == QLAYOUT_AFFINE_PANELS
    cdef bint q5 = w.layout == QLAYOUT_Q5_PANELS
    cdef bint sub16 = affine and w.sub == 16, offset = q4 or (affine and w.has_offset)
    cdef Py_ssize_t stored = Q4_PANEL_BLOCK_BYTES if q4 else (Q5_PANEL_BLOCK_BYTES if q5 else (
        _affine_panel_block_bytes(w.sub, w.has_offset) if affine else Q8_PANEL_BLOCK_BYTES))
    cdef Py_ssize_t block_bytes = PANEL_LEVEL_BYTES + 128 if q4 else (  # as _panel_positions reads
        Q8_PANEL_BLOCK_BYTES if q5 else stored)
    cdef uint8_t* unpacked = <uint8_t*> ((<size_t> scratch + 63) & ~(<size_t> 63))  # a Q4 or Q5 panel, unpacked
    cdef PanelBlock* acts = <PanelBlock*> (unpacked + nb * PANEL_MAX_BLOCK_BYTES)
    cdef const uint8_t* panel
    cdef float res[PANEL_POSITIONS * PANEL_ROWS]
    _panel_activations(acts, xq, xd, n_tokens, n_pad, w.cols, 16 if sub16 else 32)
    for p in range(w.rows // PANEL_ROWS):
        panel = w.blocks + p * nb * stored
        if n_tokens == 1:
            if q4:
                _q4_panel_one(out + p * PANEL_ROWS, panel, nb, acts, n_pad)
            elif q5:
                _q5_panel_one(out + p * PANEL_ROWS, panel, nb, acts, n_pad)
            elif affine:
                _affine_panel_one(out + p * PANEL_ROWS, panel, nb, stored, sub16, offset, acts, n_pad)
            else:
                _panel_one(out + p * PANEL_ROWS, panel, nb, acts, n_pad)
            continue
        if q4:
            _q4_unpack_panel(unpacked, panel, nb)
            panel = unpacked
        elif q5:
            _q5_unpack_panel(unpacked, panel, nb)
            panel = unpacked
        t = 0
        while t < n_tokens:
            _panel_positions(res, panel, nb, block_bytes, sub16, offset, acts + t, n_pad, False, 1.0)
            for j in range(min(<Py_ssize_t> PANEL_POSITIONS, n_tokens - t)):
                memcpy(out + (t + j) * w.rows + p * PANEL_ROWS, res + j * PANEL_ROWS, PANEL_ROWS * sizeof(float))
            t += PANEL_POSITIONS
