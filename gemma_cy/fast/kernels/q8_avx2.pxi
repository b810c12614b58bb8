# The q8 mode's GEMM (k_gemm_q8, prefill) with AVX2, for the avx2 module.
# The contract and the one order of every q8 product are in api.pxi and
# q8_x86.pxi: per block of 32 (or record of 16) an exact integer sum, added
# times the block's f32 scale to the row's f32 sum by one FMA, block after
# block. Only the integer sums are grouped differently here
# (any grouping of exact integers gives the same integer), so the results
# are the GEMV's (k_dot_*_q8) and the reference's Q8Matrix bit for bit.
#
# A panel of PANEL_ROWS = 16 rows (q8_x86.pxi reads them) is repacked once
# per call into scratch and reused for every position, each row in one
# 32-bit lane of two vectors of 8 rows, so no horizontal sum is needed: a
# product of panel vector (k, g) (at 64 k + 32 g in the block's levels) with
# activation dword k broadcast gives every row's products of that dword at
# once. Zen 3 runs one vpmaddubsw or vpmaddwd per cycle (the f32 FMA two),
# so what counts is the products per instruction of that port:
#
# - Narrow levels (every row of the panel within 129 levels of each other:
#   Q4_K's 0..15, Q5_0's -16..15, Q6_K's -32..31, but not Q8_0's full
#   -127..127): lane i of vector (k, g) holds row 8 g + i's levels 4 k ..
#   4 k + 3 as uint8 u = level + c (c = minus the panel's lowest level;
#   PANEL_U8). vpmaddubsw(u, xq) gives 16 int16 pair sums, |pair| <= 2 * 127
#   * U (U the panel's highest u), exact, and vpaddw adds `run` of them in
#   int16 while run * 254 * U <= 32767 (8 steps for U = 15: a whole record
#   of 32; 4 for U = 31; 2 for U = 63) before one vpmaddwd by ones widens
#   them to int32: up to 32 products per instruction of the port, against
#   the f32 FMA's 16. The record's exact sum of q * xq is then that sum
#   minus c * sum(xq).
# - Wide levels (PANEL_I16): lane i of vector (k, g) holds row 8 g + i's
#   levels 2 k, 2 k + 1 as int16, and vpmaddwd(levels, xq as int16 pairs)
#   adds two products into each int32 lane: 16 per instruction, the f32
#   path's rate. (vpmaddubsw cannot take these: a level + 128 times xq
#   overflows its int16 pair sums, and the sign trick costs a vpmaddwd too.)
#
# Either way a record's 16 rows end as exact int32 sums, and the scaling
# runs in f32 on 4 x 4 lanes, one FMA per term, as the GEMV's fmaf: acc =
# fma(f32(isum), f32(a * xd), acc), then for an offset acc = fma(-f32(sum
# xq), f32(b * xd), acc) (vfnmadd: -(x y) + acc, rounded once). After
# the levels of a block come the rows' scales as in q8_vnni.pxi (16 f32 a,
# for records of 16 the second record's a, and with an offset the b). A
# record of 16 is the first or second half of the block's vectors.
#
# The activations are laid out once per call as PanelActs (below), block b
# of position t at b * n_pad + t; the positions are padded with zeros to a
# multiple of four, and the rows of a last, partial panel are copies of the
# last row: both are computed and never stored. A uint8 panel runs two
# positions at a time against all 16 rows (each broadcast activation dword
# meets both vectors of rows), the 32 f32 sums of the step in a small
# struct over the whole row; an int16 panel four positions against all 16
# rows, the 64 f32 sums in a small array in L1.
#
# The scaling of each record's sums (a conversion and an FMA per 4 rows and
# term) and the integer products share a uint8 panel's time
# (docs/benchmarks.md has the figures). The int16 adds
# of a run go through p16_add_epi16_in_order: left to itself gcc computes
# all 32 products of a run first and spills them.

from libc.stdint cimport int16_t
from libc.string cimport memset

cdef extern from "immintrin.h" nogil:
    q8_m256i p16_add_epi32 "_mm256_add_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i p16_sub_epi32 "_mm256_sub_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i p16_add_epi16 "_mm256_add_epi16"(q8_m256i a, q8_m256i b)
    q8_m256i p16_add_epi8 "_mm256_add_epi8"(q8_m256i a, q8_m256i b)
    q8_m256i p16_min_epi8 "_mm256_min_epi8"(q8_m256i a, q8_m256i b)
    q8_m256i p16_max_epi8 "_mm256_max_epi8"(q8_m256i a, q8_m256i b)
    q8_m256i p16_setzero_si256 "_mm256_setzero_si256"()
    q8_m256i p16_cvtepi8_epi16 "_mm256_cvtepi8_epi16"(q8_m128i a)
    q8_m256i p16_unpacklo_epi32 "_mm256_unpacklo_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i p16_unpackhi_epi32 "_mm256_unpackhi_epi32"(q8_m256i a, q8_m256i b)
    q8_m256i p16_unpacklo_epi64 "_mm256_unpacklo_epi64"(q8_m256i a, q8_m256i b)
    q8_m256i p16_unpackhi_epi64 "_mm256_unpackhi_epi64"(q8_m256i a, q8_m256i b)
    q8_m256i p16_permute2x128 "_mm256_permute2x128_si256"(q8_m256i a, q8_m256i b, int imm)
    q8_m128 p16_fnmadd_ps128 "_mm_fnmadd_ps"(q8_m128 a, q8_m128 b, q8_m128 c)
    q8_m128 p16_loadu_ps128 "_mm_loadu_ps"(const float* p)

cdef extern from *:
    """
    #include <immintrin.h>
    /* acc + p (int16 lanes) in this order: without the empty asm gcc
       regroups a run of such adds into a tree over all the products, which
       no longer fit in the 16 registers and are spilled. */
    static inline __m256i gcy_add_epi16_in_order(__m256i acc, __m256i p) {
        acc = _mm256_add_epi16(acc, p);
        __asm__ volatile("" : "+x"(acc) : : "memory");
        return acc;
    }
    """
    q8_m256i p16_add_epi16_in_order "gcy_add_epi16_in_order"(q8_m256i acc, q8_m256i p) nogil


cdef enum:
    PAIR_POSITIONS = 4  # positions per step of _panel_positions (int16 panels); n_pad's multiple
    PANEL_I16_LEVEL_BYTES = 1024  # a block's 32 values of 16 rows as int16
    PANEL_U8_LEVEL_BYTES = 512  # as uint8
    PAIR_MAX_BLOCK_BYTES = 1280  # int16 levels with four scale vectors (records of 16 with offsets)
    U8_MAX_RANGE = 129  # the widest u = level + c that vpmaddubsw takes: 2 * 127 * 129 <= 32767

cdef enum PanelLevels:
    PANEL_U8 = 0
    PANEL_I16 = 1


# One position's block of 32 quantized activations as the panel kernels
# read them (128 bytes): the four positions of a step sit side by side.
cdef struct PanelAct:
    int16_t xq16[32]  # as int16 (PANEL_I16)
    int8_t xq[32]  # as they are (PANEL_U8)
    float xd  # the block's scale
    int32_t qsum_i[2]  # sum xq over each record of the block (one of 32, or two of 16)
    int32_t unused
    float qsum[2]  # the same, for the offset terms (exact)


# How one panel is packed.
cdef struct PanelForm:
    PanelLevels levels
    Py_ssize_t block_bytes  # the levels, then the scale vectors
    Py_ssize_t level_bytes
    int32_t c  # PANEL_U8: u = level + c
    Py_ssize_t run  # PANEL_U8: products of vpmaddubsw added in int16 before they widen


cdef Py_ssize_t _gemm_q8_scratch_bytes(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    """A panel (64-byte aligned), then the activations as PanelActs, the
    positions padded to a multiple of PAIR_POSITIONS."""
    cdef Py_ssize_t n_pad = (max(n_tokens, 1) + PAIR_POSITIONS - 1) // PAIR_POSITIONS * PAIR_POSITIONS
    return 64 + cols // 32 * (PAIR_MAX_BLOCK_BYTES + n_pad * <Py_ssize_t> sizeof(PanelAct))


cdef inline void _transpose8(q8_m256i* c, const q8_m256i* r) noexcept nogil:
    """c[k] lane i = r[i] lane k: an 8 x 8 transpose of 32-bit lanes (pairs
    of lanes, then pairs of pairs, then the 128-bit halves)."""
    cdef q8_m256i t[8]
    cdef q8_m256i u[8]
    cdef Py_ssize_t j
    for j in range(4):
        t[2 * j] = p16_unpacklo_epi32(r[2 * j], r[2 * j + 1])
        t[2 * j + 1] = p16_unpackhi_epi32(r[2 * j], r[2 * j + 1])
    for j in range(2):  # u[4 j + m]: rows 4 j .. 4 j + 3, lanes m and m + 4
        u[4 * j] = p16_unpacklo_epi64(t[4 * j], t[4 * j + 2])
        u[4 * j + 1] = p16_unpackhi_epi64(t[4 * j], t[4 * j + 2])
        u[4 * j + 2] = p16_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3])
        u[4 * j + 3] = p16_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3])
    for j in range(4):
        c[j] = p16_permute2x128(u[j], u[4 + j], 0x20)
        c[j + 4] = p16_permute2x128(u[j], u[4 + j], 0x31)


cdef inline void _pack_i16(uint8_t* dst, const q8_m256i* y) noexcept nogil:
    """dst (PANEL_I16_LEVEL_BYTES) = the 16 rows' 32 levels y[i]: vector
    (k, g) at dst + 64 k + 32 g, lane i = row 8 g + i's levels 2 k, 2 k + 1
    as int16."""
    cdef q8_m256i r[8]
    cdef q8_m256i c[8]
    cdef Py_ssize_t g, h, i, k
    for g in range(2):
        for h in range(2):  # levels 16 h .. 16 h + 15: vectors k = 8 h .. 8 h + 7
            for i in range(8):
                if h == 0:
                    r[i] = p16_cvtepi8_epi16(q8_castsi256_si128(y[8 * g + i]))
                else:
                    r[i] = p16_cvtepi8_epi16(q8_extracti128_si256(y[8 * g + i], 1))
            _transpose8(c, r)
            for k in range(8):
                q8_storeu_si256(<q8_m256i*> (dst + 64 * (8 * h + k) + 32 * g), c[k])


cdef inline void _pack_u8(uint8_t* dst, const q8_m256i* y, q8_m256i c) noexcept nogil:
    """dst (PANEL_U8_LEVEL_BYTES) = the 16 rows' 32 levels y[i] plus c:
    vector (k, g) at dst + 64 k + 32 g, lane i = row 8 g + i's u 4 k .. 4 k + 3."""
    cdef q8_m256i r[8]
    cdef q8_m256i t[8]
    cdef Py_ssize_t g, i, k
    for g in range(2):
        for i in range(8):
            r[i] = p16_add_epi8(y[8 * g + i], c)
        _transpose8(t, r)
        for k in range(8):
            q8_storeu_si256(<q8_m256i*> (dst + 64 * k + 32 * g), t[k])


cdef PanelForm _pack_panel(uint8_t* panel, const QMatrix* w, Py_ssize_t r0, bint offset,
                           Py_ssize_t size) noexcept nogil:
    """Rows r0 .. r0 + 15 of w as a panel (the layouts above; rows past the
    last are copies of it): the panel's levels read once to find their
    range, which picks the layout, then again to lay them out."""
    cdef q8_m256i y[16]
    cdef q8_m256i lo = q8_set1_epi8(127), hi = q8_set1_epi8(-128)
    cdef int8_t lows[32]
    cdef int8_t highs[32]
    cdef PanelRows rows
    cdef PanelForm form
    cdef Py_ssize_t b, i, nb = w.cols // 32, scale_bytes = 64 * (32 // size) * (2 if offset else 1)
    cdef int32_t low = 127, high = -128
    _panel_rows(&rows, w, r0)
    for b in range(nb):
        _panel_block(y, <float*> (panel + b * PAIR_MAX_BLOCK_BYTES), w, &rows, b)  # (levels only: scratch)
        for i in range(PANEL_ROWS):
            lo = p16_min_epi8(lo, y[i])
            hi = p16_max_epi8(hi, y[i])
    q8_storeu_si256(<q8_m256i*> lows, lo)
    q8_storeu_si256(<q8_m256i*> highs, hi)
    for i in range(32):
        low = min(low, <int32_t> lows[i])
        high = max(high, <int32_t> highs[i])
    if high - low <= U8_MAX_RANGE:
        form.levels = PANEL_U8
        form.level_bytes = PANEL_U8_LEVEL_BYTES
        form.c = -low
        form.run = min(<Py_ssize_t> 8, 32767 // (254 * max(high - low, 1)))
    else:
        form.levels = PANEL_I16
        form.level_bytes = PANEL_I16_LEVEL_BYTES
        form.c = 0
        form.run = 0
    form.block_bytes = form.level_bytes + scale_bytes
    for b in range(nb):
        _panel_block(y, <float*> (panel + b * form.block_bytes + form.level_bytes), w, &rows, b)
        if form.levels == PANEL_U8:
            _pack_u8(panel + b * form.block_bytes, y, q8_set1_epi8(<char> form.c))
        else:
            _pack_i16(panel + b * form.block_bytes, y)
    return form


cdef void _panel_activations(PanelAct* acts, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                             Py_ssize_t n_pad, Py_ssize_t cols, Py_ssize_t size) noexcept nogil:
    """acts[b * n_pad + t] = block b of position t (PanelAct), positions
    n_tokens .. n_pad - 1 all zeros (computed with the rest, never stored)."""
    cdef Py_ssize_t nb = cols // 32, b, t, h, i
    cdef int32_t total
    cdef PanelAct* blk
    cdef const int8_t* src
    memset(acts, 0, nb * n_pad * sizeof(PanelAct))
    for t in range(n_tokens):
        for b in range(nb):
            blk = acts + b * n_pad + t
            src = xq + t * cols + 32 * b
            memcpy(blk.xq, src, 32)
            for i in range(32):
                blk.xq16[i] = src[i]
            blk.xd = xd[t * nb + b]
            for h in range(32 // size):
                total = 0
                for i in range(h * size, (h + 1) * size):
                    total += src[i]
                blk.qsum_i[h] = total
                blk.qsum[h] = total


cdef inline void _term4(q8_m128* f, q8_m128i isum, const float* a, q8_m128 xd) noexcept nogil:
    """f = fma(f32(isum), f32(a * xd), f) for 4 rows (one rounding)."""
    f[0] = q8_fmadd_ps128(q8_cvtepi32_ps128(isum), q8_mul_ps128(p16_loadu_ps128(a), xd), f[0])


cdef inline void _offset4(q8_m128* f, q8_m128 qsum, const float* b, q8_m128 xd) noexcept nogil:
    """f = fma(-qsum, f32(b * xd), f) for 4 rows (one rounding)."""
    f[0] = p16_fnmadd_ps128(qsum, q8_mul_ps128(p16_loadu_ps128(b), xd), f[0])


cdef inline void _add_term(float* acc, q8_m256i isum, const float* a, float xd) noexcept nogil:
    """acc[0:8] = fma(f32(isum), f32(a * xd), acc[0:8]) for 8 rows (_term4 on each half)."""
    cdef q8_m128 xv = q8_set1_ps128(xd)
    cdef q8_m128 f0 = p16_loadu_ps128(acc), f1 = p16_loadu_ps128(acc + 4)
    _term4(&f0, q8_castsi256_si128(isum), a, xv)
    _term4(&f1, q8_extracti128_si256(isum, 1), a + 4, xv)
    q8_storeu_ps128(acc, f0)
    q8_storeu_ps128(acc + 4, f1)


cdef inline void _sub_offset(float* acc, const float* b, float xd, float qsum) noexcept nogil:
    """acc[0:8] = fma(-qsum, f32(b * xd), acc[0:8]) for 8 rows (_offset4 on each half)."""
    cdef q8_m128 xv = q8_set1_ps128(xd)
    cdef q8_m128 q = q8_set1_ps128(qsum), f0 = p16_loadu_ps128(acc), f1 = p16_loadu_ps128(acc + 4)
    _offset4(&f0, q, b, xv)
    _offset4(&f1, q, b + 4, xv)
    q8_storeu_ps128(acc, f0)
    q8_storeu_ps128(acc + 4, f1)


cdef inline void _record_terms(float* acc, q8_m256i s0, q8_m256i s1, const float* a, const float* b,
                               const PanelAct* x, Py_ssize_t h) noexcept nogil:
    """Record h's terms of one position x for the 16 rows (exact sums s0:
    rows 0-7, s1: rows 8-15) into acc[0:16], in order: a, then the offset b
    (NULL: none)."""
    _add_term(acc, s0, a, x.xd)
    _add_term(acc + 8, s1, a + 8, x.xd)
    if b != NULL:
        _sub_offset(acc, b, x.xd, x.qsum[h])
        _sub_offset(acc + 8, b + 8, x.xd, x.qsum[h])


cdef inline q8_m256i _bcast(const void* xq, Py_ssize_t k) noexcept nogil:
    """Activation dword k in all 8 lanes."""
    return q8_set1_epi32((<const int32_t*> xq)[k])


cdef inline void _record_i16(float* acc, const uint8_t* p, Py_ssize_t k0, Py_ssize_t k1, const float* a,
                             const float* b, const PanelAct* x, Py_ssize_t h) noexcept nogil:
    """One record (int16 panel vectors k0 .. k1 - 1) of the 16 rows and the
    four positions x[0 .. 3]: its exact integer sums (eight named
    registers: an array here would live in memory), then its terms,
    acc[16 t + i] for row i and position t."""
    cdef q8_m256i s00 = p16_setzero_si256(), s01 = s00, s02 = s00, s03 = s00
    cdef q8_m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00
    cdef q8_m256i w0, w1, xv
    cdef Py_ssize_t k
    for k in range(k0, k1):
        w0 = q8_loadu_si256(<const q8_m256i*> (p + 64 * k))
        w1 = q8_loadu_si256(<const q8_m256i*> (p + 64 * k + 32))
        xv = _bcast(x[0].xq16, k)
        s00 = p16_add_epi32(s00, q8_madd_epi16(w0, xv))
        s10 = p16_add_epi32(s10, q8_madd_epi16(w1, xv))
        xv = _bcast(x[1].xq16, k)
        s01 = p16_add_epi32(s01, q8_madd_epi16(w0, xv))
        s11 = p16_add_epi32(s11, q8_madd_epi16(w1, xv))
        xv = _bcast(x[2].xq16, k)
        s02 = p16_add_epi32(s02, q8_madd_epi16(w0, xv))
        s12 = p16_add_epi32(s12, q8_madd_epi16(w1, xv))
        xv = _bcast(x[3].xq16, k)
        s03 = p16_add_epi32(s03, q8_madd_epi16(w0, xv))
        s13 = p16_add_epi32(s13, q8_madd_epi16(w1, xv))
    _record_terms(acc, s00, s10, a, b, x, h)
    _record_terms(acc + 16, s01, s11, a, b, x + 1, h)
    _record_terms(acc + 32, s02, s12, a, b, x + 2, h)
    _record_terms(acc + 48, s03, s13, a, b, x + 3, h)


cdef inline void _block_records(float* acc, const uint8_t* p, const PanelForm* form, bint sub16, bint offset,
                                const PanelAct* x) noexcept nogil:
    """One block of an int16 panel against four positions x[0 .. 3]: its
    one record of 32 or two of 16, each record's terms in order."""
    cdef const float* sc = <const float*> (p + form.level_bytes)
    if sub16:  # scales a0, a1, then offsets b0, b1
        _record_i16(acc, p, 0, 8, sc, sc + 32 if offset else NULL, x, 0)
        _record_i16(acc, p, 8, 16, sc + 16, sc + 48 if offset else NULL, x, 1)
    else:  # a, then b
        _record_i16(acc, p, 0, 16, sc, sc + 16 if offset else NULL, x, 0)


cdef inline void _u8_run(q8_m256i* s, const uint8_t* p, const int8_t* xa, const int8_t* xb, Py_ssize_t k,
                         Py_ssize_t n) noexcept nogil:
    """s[0], s[1] (rows 0-7 and 8-15, position a), s[2], s[3] (position b)
    += the exact sums of uint8 panel vectors (j, 0) and (j, 1), j = k .. k +
    n - 1, times activation dword j of xa and of xb: vpmaddubsw products
    added in int16 (n at most the panel's run), then widened by vpmaddwd.
    Each broadcast dword meets both vectors of the 16 rows."""
    cdef q8_m256i h0 = p16_setzero_si256(), h1 = h0, h2 = h0, h3 = h0, w0, w1, xv
    cdef q8_m256i ones = q8_set1_epi16(1)
    cdef Py_ssize_t j
    for j in range(k, k + n):
        w0 = q8_loadu_si256(<const q8_m256i*> (p + 64 * j))
        w1 = q8_loadu_si256(<const q8_m256i*> (p + 64 * j + 32))
        xv = _bcast(xa, j)
        h0 = p16_add_epi16_in_order(h0, q8_maddubs_epi16(w0, xv))
        h1 = p16_add_epi16_in_order(h1, q8_maddubs_epi16(w1, xv))
        xv = _bcast(xb, j)
        h2 = p16_add_epi16_in_order(h2, q8_maddubs_epi16(w0, xv))
        h3 = p16_add_epi16_in_order(h3, q8_maddubs_epi16(w1, xv))
    s[0] = p16_add_epi32(s[0], q8_madd_epi16(h0, ones))
    s[1] = p16_add_epi32(s[1], q8_madd_epi16(h1, ones))
    s[2] = p16_add_epi32(s[2], q8_madd_epi16(h2, ones))
    s[3] = p16_add_epi32(s[3], q8_madd_epi16(h3, ones))


cdef inline void _u8_terms(q8_m128* f0, q8_m128* f1, q8_m256i isum, const float* a, const float* b,
                           const PanelAct* x, Py_ssize_t h) noexcept nogil:
    """8 rows' terms of record h for position x, into their f32 sums f0
    (rows 0-3), f1 (4-7), in order: a, then the offset b (NULL: none)."""
    cdef q8_m128 xd = q8_set1_ps128(x.xd)
    cdef q8_m128 qsum
    _term4(f0, q8_castsi256_si128(isum), a, xd)
    _term4(f1, q8_extracti128_si256(isum, 1), a + 4, xd)
    if b != NULL:
        qsum = q8_set1_ps128(x.qsum[h])
        _offset4(f0, qsum, b, xd)
        _offset4(f1, qsum, b + 4, xd)


# The f32 sums of the 16 rows and two positions of _panel_pair_u8: rows
# 4 i .. 4 i + 3 of position a in a[i], of position b in b[i].
cdef struct PairSums:
    q8_m128 a[4]
    q8_m128 b[4]


cdef inline void _record_u8_pair(PairSums* f, const uint8_t* p, Py_ssize_t k0, Py_ssize_t k1,
                                 const PanelForm* form, const float* a, const float* b, const PanelAct* xa,
                                 const PanelAct* xb, Py_ssize_t h) noexcept nogil:
    """One record (uint8 panel vectors k0 .. k1 - 1, p the block's first;
    a, b the scales and offsets of its 16 rows) and two positions xa, xb:
    the exact integer sums (runs of vpmaddubsw, minus c * sum(xq)), then
    their terms into the rows' f32 sums f."""
    cdef q8_m256i s[4]
    cdef q8_m256i ca = q8_set1_epi32(form.c * xa.qsum_i[h]), cb = q8_set1_epi32(form.c * xb.qsum_i[h])
    cdef Py_ssize_t k
    s[0] = p16_setzero_si256()
    s[1] = s[0]
    s[2] = s[0]
    s[3] = s[0]
    # runs of a length known here, so that gcc unrolls each
    if form.run >= 8 and k1 - k0 == 8:
        _u8_run(s, p, xa.xq, xb.xq, k0, 8)
    elif form.run >= 4:
        for k in range(k0, k1, 4):
            _u8_run(s, p, xa.xq, xb.xq, k, 4)
    elif form.run >= 2:
        for k in range(k0, k1, 2):
            _u8_run(s, p, xa.xq, xb.xq, k, 2)
    else:
        for k in range(k0, k1):
            _u8_run(s, p, xa.xq, xb.xq, k, 1)
    _u8_terms(&f.a[0], &f.a[1], p16_sub_epi32(s[0], ca), a, b, xa, h)
    _u8_terms(&f.a[2], &f.a[3], p16_sub_epi32(s[1], ca), a + 8, NULL if b == NULL else b + 8, xa, h)
    _u8_terms(&f.b[0], &f.b[1], p16_sub_epi32(s[2], cb), a, b, xb, h)
    _u8_terms(&f.b[2], &f.b[3], p16_sub_epi32(s[3], cb), a + 8, NULL if b == NULL else b + 8, xb, h)


cdef void _panel_pair_u8(float* res, const uint8_t* panel, Py_ssize_t nb, const PanelForm* form, bint sub16,
                         bint offset, const PanelAct* x, Py_ssize_t n_pad, bint scaled, float scale) noexcept nogil:
    """res[16 j + i] = the q8 product of panel row i (PANEL_U8) and position
    j < 2 (x[b * n_pad + j], block b): the f32 sums over the whole row, times
    scale when scaled (int8 rows). The scales of the
    second group of 8 rows are 8 floats further on, like its vectors 32
    bytes."""
    cdef PairSums f
    cdef const uint8_t* p
    cdef const float* sc
    cdef Py_ssize_t b, i
    for i in range(4):
        f.a[i] = q8_setzero_ps128()
        f.b[i] = f.a[i]
    for b in range(nb):
        p = panel + b * form.block_bytes
        sc = <const float*> (p + form.level_bytes)
        if sub16:  # scales a0, a1, then offsets b0, b1
            _record_u8_pair(&f, p, 0, 4, form, sc, sc + 32 if offset else NULL, x, x + 1, 0)
            _record_u8_pair(&f, p, 4, 8, form, sc + 16, sc + 48 if offset else NULL, x, x + 1, 1)
        else:  # a, then b
            _record_u8_pair(&f, p, 0, 8, form, sc, sc + 16 if offset else NULL, x, x + 1, 0)
        x += n_pad
    for i in range(4):
        if scaled:
            f.a[i] = q8_mul_ps128(f.a[i], q8_set1_ps128(scale))
            f.b[i] = q8_mul_ps128(f.b[i], q8_set1_ps128(scale))
        q8_storeu_ps128(res + 4 * i, f.a[i])
        q8_storeu_ps128(res + 16 + 4 * i, f.b[i])


cdef void _panel_positions(float* res, const uint8_t* panel, Py_ssize_t nb, const PanelForm* form, bint sub16,
                           bint offset, const PanelAct* acts, Py_ssize_t n_pad, bint scaled,
                           float scale) noexcept nogil:
    """res[16 j + i] = the q8 product of panel row i (PANEL_I16) and
    position j < 4 (acts[b * n_pad + j], block b): the f32 sum block after
    block, times scale when scaled (int8 rows)."""
    cdef float acc[PAIR_POSITIONS * PANEL_ROWS]
    cdef Py_ssize_t b, j
    memset(acc, 0, sizeof(acc))
    for b in range(nb):
        _block_records(acc, panel + b * form.block_bytes, form, sub16, offset, acts)
        acts += n_pad
    for j in range(0, PAIR_POSITIONS * PANEL_ROWS, 4):
        if scaled:
            q8_storeu_ps128(res + j, q8_mul_ps128(p16_loadu_ps128(acc + j), q8_set1_ps128(scale)))
        else:
            q8_storeu_ps128(res + j, p16_loadu_ps128(acc + j))


cdef void _gemm_q8_panels(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          uint8_t* scratch) noexcept nogil:
    """k_gemm_q8 by panels of 16 rows (the layouts above), every position of
    the call against one panel before the next is packed; scratch:
    _gemm_q8_scratch_bytes(w.cols, n_tokens) bytes."""
    cdef Py_ssize_t rows = w.rows, nb = w.cols // 32, size = _panel_record(w), r0, n, t, j
    cdef Py_ssize_t n_pad = (n_tokens + PAIR_POSITIONS - 1) // PAIR_POSITIONS * PAIR_POSITIONS
    cdef bint offset = _panel_offset(w), sub16 = size == 16, scaled = w.layout == QLAYOUT_I8_TENSOR
    cdef uint8_t* panel = <uint8_t*> ((<size_t> scratch + 63) & ~(<size_t> 63))
    cdef PanelAct* acts = <PanelAct*> (panel + nb * PAIR_MAX_BLOCK_BYTES)
    cdef float res[PAIR_POSITIONS * PANEL_ROWS]
    cdef PanelForm form
    _panel_activations(acts, xq, xd, n_tokens, n_pad, w.cols, size)
    r0 = 0
    while r0 < rows:
        n = min(<Py_ssize_t> PANEL_ROWS, rows - r0)
        form = _pack_panel(panel, w, r0, offset, size)
        if not w.resident:
            _prefetch_panel(w, r0 + PANEL_ROWS)
        t = 0
        while form.levels == PANEL_U8 and t < n_tokens:
            _panel_pair_u8(res, panel, nb, &form, sub16, offset, acts + t, n_pad, scaled,
                           w.scale if scaled else 1.0)
            for j in range(min(<Py_ssize_t> 2, n_tokens - t)):
                memcpy(out + (t + j) * rows + r0, res + j * PANEL_ROWS, n * sizeof(float))
            t += 2
        while t < n_tokens:
            _panel_positions(res, panel, nb, &form, sub16, offset, acts + t, n_pad, scaled,
                             w.scale if scaled else 1.0)
            for j in range(min(<Py_ssize_t> PAIR_POSITIONS, n_tokens - t)):
                memcpy(out + (t + j) * rows + r0, res + j * PANEL_ROWS, n * sizeof(float))
            t += PAIR_POSITIONS
        r0 += PANEL_ROWS


cdef bint _q8_0_positions(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          float* scratch) noexcept nogil:
    """The avx512 module's kernel for a batch's few positions through a Q8_0
    matrix (q8_vnni_positions.pxi) needs vpdpbusd; here False: _gemm_q8
    takes its other paths."""
    return False


cdef bint k_q8_stores_panels() noexcept nogil:
    """No: this module repacks its panels per call (above; api.pxi)."""
    return False


cdef void k_pack_q8_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    pass  # never called: k_q8_stores_panels() is False here


cdef void _gemm_q8_stored(float* out, const QMatrix* w, const int8_t* xq, const float* xd, Py_ssize_t n_tokens,
                          uint8_t* scratch) noexcept nogil:
    pass  # never called: this module stores no panels
