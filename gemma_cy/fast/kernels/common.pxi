# The C-level kernels every simd_<isa> module shares, in typed Cython,
# vectorized by the compiler for the module's -m flags: norms, RoPE, softmax,
# the gating activations, attention's scores and weighted sums, and the GEMV
# and GEMM drivers. Not here: the quantized dot products and GEMVs (k_dot_i8,
# k_gemv_i8, k_dot_q8_0, k_gemv_q8_0: each ISA writes them with its own
# intrinsics, in dot_<isa>.pxi), the q8 mode's kernels (q8_generic.pxi,
# q8_x86.pxi), and the checked def wrappers that validate arguments, release
# the GIL and call these kernels (wrappers.pxi).
#
# The elementwise kernels stay in f32 like the NumPy reference
# (reference/ops.py), except where f64 costs nothing and removes our
# rounding from the comparison: the sums of rmsnorm and softmax, the RoPE
# angles, and the activations.

from libc.math cimport cos, fmaf, pow, sin, sqrt, tanh
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    void __builtin_prefetch(const void* p) nogil  # gcc/clang: a hint that never faults

# The GEMVs ask for the row this many rows ahead while they read the current
# one: one forward stream alone does not keep enough DRAM reads in flight
# (measured on Zen 3, 262144 x 640: ~+20%; within the noise when cached).
cdef enum:
    GEMV_PREFETCH_ROWS = 8
    GEMM_TOKEN_TILE = 16  # positions per pass over a matrix in k_gemm (see there)
    SCORES_AHEAD = 24  # keys hinted ahead in k_scores (see there)
    # A module's decode attention (_scores_few, _weighted_few): how far its
    # hints run ahead of its reads, and value rows per pass when a row is
    # wider than its registers hold (16 KB at 256 columns: L1).
    FEW_AHEAD_BYTES = 8192
    FEW_PASS_ROWS = 16
cdef double SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2/pi) of GELU's tanh approximation
cdef double GELU_CUBIC = 0.044715
# e^x (_exp: the activations' sigmoid, softmax): x = n ln 2 + r with n = round(x / ln 2)
# and |r| <= ln2 / 2, e^x = 2^n e^r (Cody-Waite). Adding 1.5 * 2^52 rounds
# x / ln 2 to an integer n and leaves n in the low bits of the sum; ln 2 is
# split in two (LN2_HI has 32 significant bits, so n * LN2_HI is exact for
# |n| < 2^21) so that r keeps its digits.
cdef double LOG2_E = 1.4426950408889634
cdef double ROUND_MAGIC = 6755399441055744.0  # 1.5 * 2^52
cdef double LN2_HI = 6.93147180369123816490e-01  # 0x3fe62e42fee00000
cdef double LN2_LO = 1.90821492927058770002e-10  # ln 2 - LN2_HI
# sigmoid(t) = 1 / (1 + e^-t) is taken as exactly 0 below SIGMOID_ZERO_BELOW:
# there it is under e^-708 ~ 3e-308, and g * sigmoid * up (|g|, |up| <= f32
# max ~ 3.4e38) under 4e-231, which rounds to a signed zero in f32. Above it
# sigmoid stays a normal f64 (no subnormal slow path).
cdef double SIGMOID_ZERO_BELOW = -708.0
cdef double EXP_TO_INF = 710.0  # n = 1024: the exponent bits of 2^n are those of +inf
# e^x rounds to 0 in f32 below this (e^-200 ~ 1e-87, under half the smallest
# f32 subnormal); softmax clamps its exponents here, inside _exp's range.
cdef float SOFTMAX_ZERO_BELOW = -200.0


cdef inline float _sum8(const float* v) noexcept nogil:
    """v[0] + ... + v[7] in a fixed pairwise order (lanes i and i+4 first)."""
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))


# ---------------------------------------------------------------------------
# C-level kernels (prototypes and contracts: api.pxi)


cdef inline void _prefetch_row(const void* row, Py_ssize_t row_bytes) noexcept nogil:
    """Hints for the row GEMV_PREFETCH_ROWS rows after ``row`` (rows of
    row_bytes, back to back), one per 64-byte line; past the end of the
    matrix they are harmless (a hint never faults)."""
    cdef const char* ahead = <const char*> row + GEMV_PREFETCH_ROWS * row_bytes
    cdef Py_ssize_t b
    for b in range(0, row_bytes, 64):
        __builtin_prefetch(ahead + b)


cdef inline void _hint_stream(const char** next, const char* end, Py_ssize_t n_bytes) noexcept nogil:
    """A stream of hints over memory read in order, FEW_AHEAD_BYTES ahead of
    the reads (decode attention over a kv head's contiguous span): hint the
    64-byte lines in the next n_bytes before end, and move next[0] on by
    n_bytes (never past end). One call per n_bytes read keeps the hints
    spread over the work, a steady number of reads in flight."""
    cdef Py_ssize_t b = 0
    while b < n_bytes and b < end - next[0]:
        __builtin_prefetch(next[0] + b)
        b += 64
    next[0] = next[0] + n_bytes if n_bytes < end - next[0] else end


cdef inline void _score_tails(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                              const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys, Py_ssize_t j,
                              Py_ssize_t n) noexcept nogil:
    """The tails j .. n-1 of n_keys keys' scores for m rows, added to out by
    FMAs in order (the end of every module's _score)."""
    cdef Py_ssize_t r, k, i
    cdef float s
    for r in range(m):
        for k in range(n_keys):
            s = out[r * out_stride + k]
            for i in range(j, n):
                s = fmaf(q[r * q_stride + i], keys[k * key_stride + i], s)
            out[r * out_stride + k] = s


cdef inline void _prefetch_rows(const float* rows, Py_ssize_t n_rows, Py_ssize_t stride,
                                Py_ssize_t n) noexcept nogil:
    """Hints for n_rows rows of n floats, stride floats apart (attention's
    next keys or values: at decode the cache comes from DRAM, and its rows
    are read in short strided runs the hardware prefetcher does not follow
    far enough ahead)."""
    cdef Py_ssize_t i, b
    for i in range(n_rows):
        for b in range(0, n, 16):
            __builtin_prefetch(rows + i * stride + b)


cdef void _gemv_i8_rows(float* out, const int8_t* q, float scale, const float* x,
                        Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    """k_gemv_i8 one row at a time (k_dot_i8 each), prefetching ahead."""
    cdef Py_ssize_t r
    for r in range(rows):
        _prefetch_row(q + r * cols, cols)
        out[r] = k_dot_i8(q + r * cols, x, cols, scale)


# --- Affine matrices (QLAYOUT_AFFINE): every GGUF integer block type as stored
# weights, exactly (docs/formats.md#block-types). A row of cols values is
# cols / sub records of sub + 4 (+ 4) bytes: sub int8 levels q, then the
# sub-block's scale a (f32), then its offset b (f32) when the type has one;
# weight = f32(f32(a * q) - b), which is ggml's dequantized value bit for bit
# (a * q is exact for every type but Q6_K, whose one rounding is ggml's too).
#
# The q8 mode (k_dot_affine_q8, every module): per record, in order, the
# exact integer sums isum = sum q * xq and (with an offset) qsum = sum xq over
# its values, the activations' block scale d = xd[block]; acc (f32) =
# fmaf(isum, f32(a * d), acc), then acc = fmaf(-qsum, f32(b * d), acc) (one
# rounding each). The reference's Q8Matrix computes the same numbers in the
# same order (docs/numerics.md#activation-modes).
#
# Summation order of a row, the Q8_0 order (see the dot_<isa>.pxi files): a
# row is read as 32-value blocks (one record of 32, or two of 16), 8-value
# group g of every block into accumulator g, each product the exact weight
# times x; the accumulators' lanes (a0 + a1) + (a2 + a3), summed by _sum8.

cdef inline float _load_f32(const uint8_t* p) noexcept nogil:
    """The little-endian f32 at p (4-byte aligned in every record)."""
    cdef float v
    memcpy(&v, p, 4)
    return v


cdef inline Py_ssize_t _affine_row_bytes(const QMatrix* w) noexcept nogil:
    """Bytes of one row of an affine matrix."""
    return w.cols // w.sub * (w.sub + 4 + (4 if w.has_offset else 0))


cdef inline Py_ssize_t _row_bytes(const QMatrix* w) noexcept nogil:
    """Bytes of one row of w as it is held, in any layout (api.pxi)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK
    if w.layout == QLAYOUT_Q8_0:
        return nb * Q8_0_BYTES
    if w.layout == QLAYOUT_Q5_0:
        return nb * Q5_0_BYTES
    if w.layout == QLAYOUT_Q4_K:
        return w.cols // Q4_K_BLOCK * Q4_K_BYTES
    if w.layout == QLAYOUT_Q4_1:
        return nb * Q4_1_BYTES
    if w.layout == QLAYOUT_AFFINE:
        return _affine_row_bytes(w)
    if w.layout == QLAYOUT_F32:
        return w.cols * 4
    if w.layout == QLAYOUT_Q8_PANELS:
        return nb * Q8_PANEL_BLOCK_BYTES // Q8_PANEL_ROWS
    if w.layout == QLAYOUT_Q4_PANELS:
        return nb * Q4_PANEL_BLOCK_BYTES // Q8_PANEL_ROWS
    if w.layout == QLAYOUT_Q5_PANELS:
        return nb * Q5_PANEL_BLOCK_BYTES // Q8_PANEL_ROWS
    if w.layout == QLAYOUT_AFFINE_PANELS:
        return nb * _affine_panel_block_bytes(w.sub, w.has_offset) // Q8_PANEL_ROWS
    return w.cols  # QLAYOUT_I8_TENSOR


cdef inline Py_ssize_t _affine_panel_block_bytes(Py_ssize_t sub, bint has_offset) noexcept nogil:
    """Bytes of a 16 x 32 block of a QLAYOUT_AFFINE_PANELS matrix (api.pxi)."""
    return 512 + 64 * (32 // sub) * (2 if has_offset else 1)


cdef inline bint _stored_panels(const QMatrix* w) noexcept nogil:
    """True for the layouts packed as panels at load (the q8 mode only)."""
    return (w.layout == QLAYOUT_Q8_PANELS or w.layout == QLAYOUT_Q4_PANELS or w.layout == QLAYOUT_AFFINE_PANELS
            or w.layout == QLAYOUT_Q5_PANELS)


cdef void k_dequantize_affine(float* out, const uint8_t* rec, Py_ssize_t cols, Py_ssize_t sub,
                              bint has_offset) noexcept nogil:
    cdef float a, b = 0
    cdef const int8_t* q
    cdef Py_ssize_t rb = sub + 4 + (4 if has_offset else 0), s, j, n_sub = cols // sub
    for s in range(n_sub):
        q = <const int8_t*> rec
        a = _load_f32(rec + sub)
        if has_offset:
            b = _load_f32(rec + sub + 4)
        for j in range(sub):
            out[j] = (a * q[j]) - b  # a * q exact but for Q6_K, where b == 0: no fused rounding can differ
        out += sub
        rec += rb


cdef float k_dot_affine_q8(const uint8_t* rec, const int8_t* xq, const float* xd, Py_ssize_t cols,
                           Py_ssize_t sub, bint has_offset) noexcept nogil:
    cdef float acc = 0
    cdef int32_t isum, qsum
    cdef float a, b, d
    cdef const int8_t* q
    cdef Py_ssize_t rb = sub + 4 + (4 if has_offset else 0), s, i, c = 0
    for s in range(cols // sub):
        q = <const int8_t*> rec
        d = xd[c // 32]
        a = _load_f32(rec + sub)
        isum = 0
        for i in range(sub):
            isum += q[i] * xq[c + i]
        acc = fmaf(<float> isum, a * d, acc)
        if has_offset:
            b = _load_f32(rec + sub + 4)
            qsum = 0
            for i in range(sub):
                qsum += xq[c + i]
            acc = fmaf(<float> -qsum, b * d, acc)
        c += sub
        rec += rb
    return acc


cdef void k_gemv_affine(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                        Py_ssize_t sub, bint has_offset) noexcept nogil:
    _gemv_affine(out, rec, x, rows, cols, sub, has_offset)  # each module's own (dot_<isa>.pxi)


# --- Q4_K, Q4_1 and Q5_0 matrices (QLAYOUT_Q4_K, QLAYOUT_Q4_1,
# QLAYOUT_Q5_0): rows read as the file stores them. Every path but the
# decode GEMV and the GEMMs of the modules whose _gemm_takes_q4_k /
# _gemm_takes_q4_1 / _gemm_takes_q5_0 say so (they unpack the levels in
# registers too) turns them into a layout whose kernels it borrows,
# CONVERT_ROW_TILE rows at a time in the matrix's scratch: Q4_K super-blocks
# and Q4_1 blocks into the affine records above (the bytes of
# gemma_cy.quant.affine.AffineLevels.records), Q5_0 blocks into Q8_0 blocks
# (the bytes of gemma_cy.quant.ggml.to_q8_0). The GEMVs (k_dot_q4_k,
# k_dot_q5_0 in each dot_<isa>.pxi, and the modules' _gemv_q4_1) unpack the
# levels in registers in the order of the kernel they stand in for
# (k_dot_affine, k_dot_q8_0), or convert a tile of rows first (a module
# without its own Q4_1 GEMV). So such a matrix gives bit for bit what its
# records or Q8_0 blocks would, on every path.

cdef inline const uint8_t* _q4_k_qs(const uint8_t* row, Py_ssize_t j) noexcept nogil:
    """The 32 bytes of a Q4_K row (super-blocks back to back) whose low
    nibbles are the levels of sub-block 2 j and high nibbles those of
    sub-block 2 j + 1 (j counts over the whole row): super-block j // 4,
    after its d, dmin and 12 scale bytes, group j % 4 of its 128 qs bytes."""
    return row + (j // 4) * Q4_K_BYTES + 16 + 32 * (j % 4)


cdef void k_q4_k_records(uint8_t* rec, const uint8_t* block, const float* ab) noexcept nogil:
    cdef const uint8_t* qs
    cdef uint8_t* out
    cdef Py_ssize_t j, l
    for j in range(4):  # sub-blocks 2 j and 2 j + 1: the low and high nibbles of the same 32 bytes
        qs = _q4_k_qs(block, j)
        out = rec + 80 * j
        for l in range(32):
            out[l] = qs[l] & 0x0F
            out[40 + l] = qs[l] >> 4
    for j in range(8):
        memcpy(rec + 40 * j + 32, ab + 2 * j, 8)


cdef inline void _q4_1_record(uint8_t* rec, const uint8_t* block) noexcept nogil:
    """One Q4_1 block (api.pxi) as an affine record of 32: the levels, then
    a = f32(d) and b = -f32(m) (f32(a * q) - b is f32(d) * q + f32(m),
    ggml's value: a * q is exact, and x - (-y) is x + y in IEEE)."""
    cdef float a = _block_d(block), b = -_block_d(block + 2)
    cdef Py_ssize_t l
    for l in range(16):
        rec[l] = block[4 + l] & 0x0F
        rec[16 + l] = block[4 + l] >> 4
    memcpy(rec + 32, &a, 4)
    memcpy(rec + 36, &b, 4)


# Byte i of _Q5_0_CLEAR[b] is 0xF0 when bit i of b is clear, else 0: or'ed
# into a nibble n, it gives the Q5_0 level as int8 (n | 0xF0 is n - 16; a set
# high bit makes the level n + 16 - 16 = n).
cdef uint64_t _Q5_0_CLEAR[256]


cdef void _fill_q5_0_clear() noexcept:
    cdef Py_ssize_t b, i
    for b in range(256):
        _Q5_0_CLEAR[b] = 0
        for i in range(8):
            if not (b >> i) & 1:
                _Q5_0_CLEAR[b] |= (<uint64_t> 0xF0) << (8 * i)


_fill_q5_0_clear()


cdef inline uint64_t _q5_0_word(const uint8_t* block, Py_ssize_t i) noexcept nogil:
    """Levels 8 i .. 8 i + 7 of one Q5_0 block (see api.pxi) as int8 in a
    little-endian 64-bit word (x86-64 and arm64 are little-endian): the
    nibbles of 8 qs bytes or'ed with _Q5_0_CLEAR of the qh byte of the same
    8 values."""
    cdef uint64_t qs
    memcpy(&qs, block + 6 + 8 * (i & 1), 8)
    return ((qs >> (4 * (i >> 1))) & <uint64_t> 0x0F0F0F0F0F0F0F0F) | _Q5_0_CLEAR[block[2 + i]]


cdef inline void _q5_0_levels(int8_t* q, const uint8_t* block) noexcept nogil:
    """q[0:32] = the levels of one Q5_0 block, as int8."""
    cdef uint64_t w
    cdef Py_ssize_t i
    for i in range(4):  # one word at a time: a 32-byte copy of four words just stored
        w = _q5_0_word(block, i)  # waits for them (no store forwarding): ~4x the conversion's time
        memcpy(q + 8 * i, &w, 8)


cdef inline const int8_t* _block_levels(int8_t* buf, const uint8_t* block, bint q5_0) noexcept nogil:
    """The 32 int8 levels of a Q8_0 block (a pointer into it), or of a Q5_0
    block (unpacked into buf): the portable dot products' one source of
    levels for both layouts."""
    if q5_0:
        _q5_0_levels(buf, block)
        return buf
    return <const int8_t*> (block + 2)


cdef void k_q5_0_to_q8_0(uint8_t* out, const uint8_t* blocks, Py_ssize_t n_blocks) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n_blocks):
        memcpy(out, blocks, 2)  # the same f16 d
        _q5_0_levels(<int8_t*> (out + 2), blocks)
        out += Q8_0_BYTES
        blocks += Q5_0_BYTES


cdef inline Py_ssize_t _converted_row_bytes(QLayout layout, Py_ssize_t cols) noexcept nogil:
    """Bytes of one row of a QLAYOUT_Q4_K matrix as records, or of a
    QLAYOUT_Q5_0 one as Q8_0 blocks; 0 for another layout."""
    if layout == QLAYOUT_Q4_K:
        return cols // Q4_K_BLOCK * Q4_K_RECORD_BYTES
    if layout == QLAYOUT_Q5_0:
        return cols // Q8_0_BLOCK * Q8_0_BYTES
    if layout == QLAYOUT_Q4_1:
        return cols // Q8_0_BLOCK * Q4_1_RECORD_BYTES
    return 0


cdef Py_ssize_t k_convert_scratch_bytes(QLayout layout, Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil:
    # a tile of rows converted, then its (n_tokens, tile) outputs
    cdef Py_ssize_t tile = CONVERT_ROW_TILE * _converted_row_bytes(layout, cols)
    if tile == 0:
        return 0
    return (tile + 63) // 64 * 64 + CONVERT_ROW_TILE * max(n_tokens, 1) * <Py_ssize_t> sizeof(float)


cdef inline QMatrix _converted_rows(const QMatrix* w, Py_ssize_t row, Py_ssize_t n_rows) noexcept nogil:
    """Rows row .. row + n_rows - 1 of a Q4_K or Q4_1 matrix as an affine
    matrix, or of a Q5_0 one as a Q8_0 matrix, in its scratch (written now)."""
    cdef QMatrix m = w[0]
    cdef Py_ssize_t nb, r, k
    if w.layout == QLAYOUT_Q4_K:
        nb = w.cols // Q4_K_BLOCK
        for r in range(n_rows):
            for k in range(nb):
                k_q4_k_records(w.scratch + (r * nb + k) * Q4_K_RECORD_BYTES,
                               w.blocks + ((row + r) * nb + k) * Q4_K_BYTES, w.ab + ((row + r) * nb + k) * 16)
        m.layout = QLAYOUT_AFFINE
    elif w.layout == QLAYOUT_Q4_1:
        nb = w.cols // Q8_0_BLOCK
        for k in range(n_rows * nb):
            _q4_1_record(w.scratch + k * Q4_1_RECORD_BYTES, w.blocks + (row * nb + k) * Q4_1_BYTES)
        m.layout = QLAYOUT_AFFINE
        m.sub = 32
        m.has_offset = True
    else:
        nb = w.cols // Q8_0_BLOCK
        k_q5_0_to_q8_0(w.scratch, w.blocks + row * nb * Q5_0_BYTES, n_rows * nb)
        m.layout = QLAYOUT_Q8_0
    m.blocks = w.scratch
    m.rows = n_rows
    m.resident = True  # just written: in cache
    return m


cdef void _gemm_converted(float* out, const QMatrix* w, const float* x, const int8_t* xq, const float* xd,
                          Py_ssize_t n_tokens, float* scratch) noexcept nogil:
    """k_gemm (xq NULL) or _gemm_q8 of a Q4_K, Q4_1 or Q5_0 matrix: CONVERT_ROW_TILE
    rows at a time converted (_converted_rows), through the kernels of
    their new layout, their outputs copied into place (each row's result is
    its own: the same bits however rows are tiled)."""
    cdef Py_ssize_t r0 = 0, n, t, tile_bytes = CONVERT_ROW_TILE * _converted_row_bytes(w.layout, w.cols)
    cdef QMatrix tile
    cdef float* tile_out = <float*> (w.scratch + (tile_bytes + 63) // 64 * 64)
    while r0 < w.rows:
        n = min(<Py_ssize_t> CONVERT_ROW_TILE, w.rows - r0)
        tile = _converted_rows(w, r0, n)
        if xq == NULL:
            k_gemm(tile_out, &tile, x, n_tokens, scratch)
        else:
            _gemm_q8(tile_out, &tile, xq, xd, n_tokens, scratch)
        for t in range(n_tokens):
            memcpy(out + t * w.rows + r0, tile_out + t * n, n * sizeof(float))
        r0 += n


cdef void _gemv_f32_rows(float* out, const float* w, const float* x, Py_ssize_t rows,
                         Py_ssize_t cols) noexcept nogil:
    """An f32 matrix times x, one row at a time (k_dot_f32 each: the module's
    attention-score order), prefetching ahead."""
    cdef Py_ssize_t r
    for r in range(rows):
        _prefetch_row(w + r * cols, cols * 4)
        out[r] = k_dot_f32(w + r * cols, x, cols)


cdef void k_matvec(float* out, const QMatrix* w, const float* x) noexcept nogil:
    if w.layout == QLAYOUT_I8_TENSOR:
        if w.resident:
            k_gemv_i8_resident(out, w.q, w.scale, x, w.rows, w.cols)
        else:
            k_gemv_i8(out, w.q, w.scale, x, w.rows, w.cols)
    elif w.layout == QLAYOUT_Q8_0:
        k_gemv_q8_0(out, w.blocks, x, w.rows, w.cols // Q8_0_BLOCK)
    elif w.layout == QLAYOUT_AFFINE:
        k_gemv_affine(out, w.blocks, x, w.rows, w.cols, w.sub, w.has_offset)
    elif w.layout == QLAYOUT_F32:
        _gemv_f32_rows(out, w.w32, x, w.rows, w.cols)
    elif w.layout == QLAYOUT_Q4_K:
        _gemv_q4_k(out, w, x)  # each module's own (dot_<isa>.pxi)
    elif w.layout == QLAYOUT_Q5_0:
        _gemv_q5_0(out, w, x)  # each module's own (dot_<isa>.pxi)
    elif w.layout == QLAYOUT_Q4_1:
        _gemv_q4_1(out, w, x)  # each module's own (dot_<isa>.pxi)


cdef void k_gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                 float* scratch) noexcept nogil:
    if n_tokens == 1:
        k_matvec(out, w, x)
    elif (w.layout == QLAYOUT_Q4_K and not _gemm_takes_q4_k()) \
            or (w.layout == QLAYOUT_Q4_1 and not _gemm_takes_q4_1()) \
            or (w.layout == QLAYOUT_Q5_0 and not _gemm_takes_q5_0()):
        _gemm_converted(out, w, x, NULL, NULL, n_tokens, scratch)
    else:
        _gemm(out, w, x, n_tokens, scratch)  # each module's own (dot_<isa>.pxi)


cdef void _gemm_by_rows(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens) noexcept nogil:
    """k_gemm for the modules (and matrices) without a blocked kernel: tokens in
    tiles of GEMM_TOKEN_TILE, each row read once per tile (from DRAM or L3;
    it stays in L1 for the tile's tokens, whose activations stay in L2) and
    multiplied with each of the tile's tokens by the module's dot product."""
    cdef Py_ssize_t t0 = 0, t, tn, r, rows = w.rows, cols = w.cols, nb = w.cols // Q8_0_BLOCK
    cdef Py_ssize_t row_bytes = nb * Q8_0_BYTES
    cdef Py_ssize_t affine_bytes = _affine_row_bytes(w) if w.layout == QLAYOUT_AFFINE else 0
    while t0 < n_tokens:
        tn = min(<Py_ssize_t> GEMM_TOKEN_TILE, n_tokens - t0)
        for r in range(rows):
            if w.layout == QLAYOUT_I8_TENSOR:
                _prefetch_row(w.q + r * cols, cols)
                for t in range(t0, t0 + tn):
                    out[t * rows + r] = k_dot_i8(w.q + r * cols, x + t * cols, cols, w.scale)
            elif w.layout == QLAYOUT_F32:
                _prefetch_row(w.w32 + r * cols, cols * 4)
                for t in range(t0, t0 + tn):
                    out[t * rows + r] = k_dot_f32(w.w32 + r * cols, x + t * cols, cols)
            elif w.layout == QLAYOUT_AFFINE:
                _prefetch_row(w.blocks + r * affine_bytes, affine_bytes)
                for t in range(t0, t0 + tn):
                    out[t * rows + r] = k_dot_affine(w.blocks + r * affine_bytes, x + t * cols, cols, w.sub,
                                                     w.has_offset)
            else:
                _prefetch_row(w.blocks + r * row_bytes, row_bytes)
                for t in range(t0, t0 + tn):
                    out[t * rows + r] = k_dot_q8_0(w.blocks + r * row_bytes, x + t * cols, nb)
        t0 += tn


cdef void k_gemm_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd,
                    Py_ssize_t n_tokens, float* scratch) noexcept nogil:
    _gemm_q8(out, w, xq, xd, n_tokens, scratch)  # each module's own (dot_<isa>.pxi, q8_vnni.pxi)


cdef void _gemm_q8_by_rows(float* out, const QMatrix* w, const int8_t* xq, const float* xd,
                           Py_ssize_t n_tokens) noexcept nogil:
    """k_gemm_q8 by the module's row kernels (_dot_rows_q8): as k_gemm, tiles
    of tokens, each group of four rows read once per tile; one token from
    DRAM (decode) row after row, as the f32 GEMV."""
    cdef Py_ssize_t t0 = 0, t, tn, r, i, n, rows = w.rows, cols = w.cols, nb = w.cols // Q8_0_BLOCK
    cdef Py_ssize_t row_bytes = nb * Q8_0_BYTES if w.layout == QLAYOUT_Q8_0 else (
        _affine_row_bytes(w) if w.layout == QLAYOUT_AFFINE else cols)
    cdef const uint8_t* base = <const uint8_t*> w.q if w.layout == QLAYOUT_I8_TENSOR else w.blocks
    if w.layout == QLAYOUT_Q4_K or w.layout == QLAYOUT_Q5_0 or w.layout == QLAYOUT_Q4_1:
        _gemm_converted(out, w, NULL, xq, xd, n_tokens, NULL)
        return
    if n_tokens == 1 and not w.resident:
        for r in range(rows):
            _prefetch_row(base + r * row_bytes, row_bytes)
            _dot_rows_q8(out + r, w, r, 1, xq, xd)
        return
    while t0 < n_tokens:
        tn = min(<Py_ssize_t> GEMM_TOKEN_TILE, n_tokens - t0)
        for r in range(0, rows, 4):
            n = min(4, rows - r)
            if not w.resident:  # a model that stays in cache: the hints cost more than they give
                for i in range(n):
                    _prefetch_row(base + (r + i) * row_bytes, row_bytes)
            for t in range(t0, t0 + tn):
                _dot_rows_q8(out + t * rows + r, w, r, n, xq + t * cols, xd + t * nb)
        t0 += tn


cdef void k_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil:
    cdef Py_ssize_t nb
    cdef QMatrix tile
    if w.layout == QLAYOUT_I8_TENSOR:
        k_dequantize_i8(out, w.q + row * w.cols, w.scale, w.cols)
    elif w.layout == QLAYOUT_Q8_0:
        nb = w.cols // Q8_0_BLOCK
        k_dequantize_q8_0(out, w.blocks + row * nb * Q8_0_BYTES, nb)
    elif w.layout == QLAYOUT_AFFINE:
        k_dequantize_affine(out, w.blocks + row * _affine_row_bytes(w), w.cols, w.sub, w.has_offset)
    elif w.layout == QLAYOUT_F32:
        memcpy(out, w.w32 + row * w.cols, w.cols * sizeof(float))
    elif w.layout == QLAYOUT_Q4_K or w.layout == QLAYOUT_Q5_0 or w.layout == QLAYOUT_Q4_1:
        tile = _converted_rows(w, row, 1)
        k_matrix_row(out, &tile, 0)
    elif w.layout == QLAYOUT_Q8_PANELS:
        _panel_matrix_row(out, w, row)
    elif w.layout == QLAYOUT_Q4_PANELS:
        _q4_panel_matrix_row(out, w, row)
    elif w.layout == QLAYOUT_AFFINE_PANELS:
        _affine_panel_matrix_row(out, w, row)
    elif w.layout == QLAYOUT_Q5_PANELS:
        _q5_panel_matrix_row(out, w, row)


cdef void _q5_panel_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil:
    """k_matrix_row of a QLAYOUT_Q5_PANELS matrix (api.pxi): level j of the
    row's block b: byte at = 4 (row % 16) + j % 4 of level vector k = j // 4,
    its low four bits the low (k < 4) or high nibble of byte at of vector
    k % 4, its fifth bit bit at of word k; minus 16, times f32(d), as
    k_dequantize_q8_0 of the Q5_0 matrix's Q8_0 conversion (the same product)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, lane = row % Q8_PANEL_ROWS, b, j, k, at
    cdef const uint8_t* blk = w.blocks + row // Q8_PANEL_ROWS * nb * Q5_PANEL_BLOCK_BYTES
    cdef uint64_t word
    cdef float d
    cdef int level
    for b in range(nb):
        d = _load_f32(blk + 320 + 4 * lane)
        for j in range(Q8_0_BLOCK):
            k = j // 4
            at = 4 * lane + j % 4
            level = blk[64 * (k % 4) + at]
            level = (level >> 4) if k >= 4 else (level & 15)
            memcpy(&word, blk + 256 + 8 * k, 8)
            level = level | ((<int> ((word >> at) & 1)) << 4)
            out[b * Q8_0_BLOCK + j] = d * <float> (level - 16)
        blk += Q5_PANEL_BLOCK_BYTES


cdef void _affine_panel_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil:
    """k_matrix_row of a QLAYOUT_AFFINE_PANELS matrix (api.pxi): level j of
    the row's block b is byte j % 4 of lane row % 16 of vector j // 4, minus
    128; weight = (a q) - b with its record's a and b, as k_dequantize_affine."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, lane = row % Q8_PANEL_ROWS, b, j, rec
    cdef Py_ssize_t size = _affine_panel_block_bytes(w.sub, w.has_offset), n_rec = Q8_0_BLOCK // w.sub
    cdef const uint8_t* blk = w.blocks + row // Q8_PANEL_ROWS * nb * size
    cdef float a, o = 0
    for b in range(nb):
        for j in range(Q8_0_BLOCK):
            rec = j // w.sub
            a = _load_f32(blk + 512 + 64 * rec + 4 * lane)
            if w.has_offset:
                o = _load_f32(blk + 512 + 64 * (n_rec + rec) + 4 * lane)
            out[b * Q8_0_BLOCK + j] = (a * <float> (<int> blk[64 * (j // 4) + 4 * lane + j % 4] - 128)) - o
        blk += size


cdef void _q4_panel_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil:
    """k_matrix_row of a QLAYOUT_Q4_PANELS matrix (api.pxi): level j of the
    row's block b is the low (j < 16) or high nibble of byte j % 4 of lane
    row % 16 of vector (j // 4) % 4; weight = (a q) - b, as the Q4_K
    matrix's records give it (k_dequantize_affine)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, lane = row % Q8_PANEL_ROWS, b, j
    cdef const uint8_t* blk = w.blocks + row // Q8_PANEL_ROWS * nb * Q4_PANEL_BLOCK_BYTES
    cdef float a, o
    cdef int level
    for b in range(nb):
        a = _load_f32(blk + 256 + 4 * lane)
        o = _load_f32(blk + 320 + 4 * lane)
        for j in range(Q8_0_BLOCK):
            level = blk[64 * ((j // 4) % 4) + 4 * lane + j % 4]
            level = (level >> 4) if j >= 16 else (level & 15)
            out[b * Q8_0_BLOCK + j] = (a * <float> level) - o
        blk += Q4_PANEL_BLOCK_BYTES


cdef void _panel_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil:
    """k_matrix_row of a QLAYOUT_Q8_PANELS matrix (api.pxi): level j of the
    row's block b is byte j % 4 of lane row % 16 of vector j // 4, minus 128;
    times the block's f32(d), as k_dequantize_q8_0 (the same product)."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, lane = row % Q8_PANEL_ROWS, b, j
    cdef const uint8_t* blk = w.blocks + row // Q8_PANEL_ROWS * nb * Q8_PANEL_BLOCK_BYTES
    cdef float d
    for b in range(nb):
        d = _load_f32(blk + 512 + 4 * lane)
        for j in range(Q8_0_BLOCK):
            out[b * Q8_0_BLOCK + j] = d * <float> (<int> blk[64 * (j // 4) + 4 * lane + j % 4] - 128)
        blk += Q8_PANEL_BLOCK_BYTES


cdef inline uint16_t _load_u16(const uint8_t* p) noexcept nogil:
    """The little-endian u16 at p (any alignment, any host byte order)."""
    return <uint16_t> (p[0] | (p[1] << 8))


cdef float k_f16_to_f32(uint16_t h) noexcept nogil:
    # binary16: sign 1, exponent 5 (bias 15), mantissa 10; binary32: 1, 8 (127), 23
    cdef uint32_t sign = (<uint32_t> (h & 0x8000)) << 16
    cdef uint32_t exponent = (h >> 10) & 0x1f
    cdef uint32_t mantissa = h & 0x3ff
    cdef uint32_t bits
    cdef float f
    if exponent == 0:  # zero or subnormal: mantissa * 2^-24, exact in f32
        f = <float> mantissa * <float> 5.9604644775390625e-08
        return -f if sign else f
    if exponent == 0x1f:  # inf, NaN (payload kept)
        bits = sign | 0x7f800000 | (mantissa << 13)
    else:
        bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13)
    memcpy(&f, &bits, 4)
    return f


# Every f16 as an f32 (k_f16_to_f32 of each of the 65,536 bit patterns, 256
# KB, filled when the module is imported): where a module is built without
# F16C (generic, neon), the GEMVs and the GEMM's weight formation take a Q8_0
# or Q5_0 block's scale from it. Where it has F16C (avx2, avx512), one
# vcvtph2ps does (exact, as the table: every f16 is an f32; a signalling
# NaN comes back quiet, and the loaders refuse non-finite scales anyway):
# a decode step streams the 178 MB Q8_0 lm_head past the table, whose lines
# then miss in L1 and L2 on most blocks (the A/B:
# docs/benchmarks.md#what-was-tried).
cdef float F16_AS_F32[65536]

cdef extern from *:
    """
    #if defined(__F16C__)
    #include <immintrin.h>
    #define GEMMA_CY_F16C 1
    static inline float gemma_cy_cvtsh_ss(unsigned short h) { return _cvtsh_ss(h); }
    #else
    #define GEMMA_CY_F16C 0
    static inline float gemma_cy_cvtsh_ss(unsigned short h) { (void) h; return 0.0f; }
    #endif
    """
    const bint GEMMA_CY_F16C  # the module is built with F16C
    float gemma_cy_cvtsh_ss(unsigned short h) nogil  # one f16 to f32 by F16C


cdef void _fill_f16_table() noexcept nogil:
    cdef Py_ssize_t h
    for h in range(65536):
        F16_AS_F32[h] = k_f16_to_f32(<uint16_t> h)


_fill_f16_table()


cdef inline float _block_d(const uint8_t* block) noexcept nogil:
    """f32(d) of a Q8_0 or Q5_0 block (its f16 scale in bytes 0-1)."""
    if GEMMA_CY_F16C:
        return gemma_cy_cvtsh_ss(_load_u16(block))
    return F16_AS_F32[_load_u16(block)]


cdef float k_dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    return _score(a, b, n)  # one attention score: the same bits as k_scores gives


cdef inline float _score_portable(const float* q, const float* key, Py_ssize_t n) noexcept nogil:
    """One score of k_scores: 8 lane sums over the whole 8s, _sum8, the tail
    (a module's _score when it has none of its own)."""
    cdef float acc[8]
    cdef Py_ssize_t j = 0, l
    cdef float s
    for l in range(8):
        acc[l] = 0
    while j + 8 <= n:
        for l in range(8):
            acc[l] += q[j + l] * key[j + l]
        j += 8
    s = _sum8(acc)
    while j < n:
        s += q[j] * key[j]
        j += 1
    return s


cdef inline void _scores8_portable(float* out, const float* q, const float* keys, Py_ssize_t key_stride,
                                   Py_ssize_t n) noexcept nogil:
    """out[0:8] = _score_portable(q, keys + k * key_stride, n) for 8 keys, bit for bit:
    each 8 query values loaded once for the 8 keys, 8 independent chains (a
    module's _scores8 when it has none of its own)."""
    cdef float acc[8][8]  # (key, lane)
    cdef Py_ssize_t j = 0, k, l
    cdef float s
    for k in range(8):
        for l in range(8):
            acc[k][l] = 0
    while j + 8 <= n:
        for k in range(8):
            for l in range(8):
                acc[k][l] += q[j + l] * keys[k * key_stride + j + l]
        j += 8
    for k in range(8):
        s = _sum8(acc[k])
        for l in range(j, n):
            s += q[l] * keys[k * key_stride + l]
        out[k] = s


cdef void k_scores(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                   const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys, Py_ssize_t n) noexcept nogil:
    # Keys outermost: 8 keys (8 KB at head_dim 256) stay in L1 while every
    # query row passes over them; rows outermost streamed the whole span of
    # keys from L2 once per row. At decode the keys come from DRAM: the 8
    # keys SCORES_AHEAD on are hinted a share before each row's pass, since
    # hinting all 8 at once fills the miss buffers and leaves nothing in
    # flight while the scores run (docs/benchmarks.md#history).
    # A module may have a variant for few rows over a contiguous span (the
    # avx512 one's _scores_few: decode over the head-major cache); it gives
    # the same bits.
    cdef Py_ssize_t r, i = 0, first, per_row = (8 + m - 1) // m
    if _scores_few(out, out_stride, q, q_stride, m, keys, key_stride, n_keys, n):
        return
    while i + 8 <= n_keys:
        for r in range(m):
            first = i + SCORES_AHEAD + r * per_row
            if r * per_row < 8:
                _prefetch_rows(keys + first * key_stride, min(min(per_row, 8 - r * per_row), n_keys - first),
                               key_stride, n)
            _scores8(out + r * out_stride + i, q + r * q_stride, keys + i * key_stride, key_stride, n)
        i += 8
    while i < n_keys:
        for r in range(m):
            out[r * out_stride + i] = _score(q + r * q_stride, keys + i * key_stride, n)
        i += 1


cdef void k_axpy(float* y, float a, const float* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] += a * x[i]


cdef enum:
    WEIGHTED_ROWS_PASS = 16  # x rows per pass of k_weighted_rows (16 KB at 256 columns: L1)
    WEIGHTED_ROWS_FEW = 4  # up to this many output rows (a decode step's heads of one kv head), passes of one x row
    WEIGHTED_ROWS_AHEAD = 16  # x rows hinted ahead then


cdef void k_weighted_rows(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                          const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil:
    # In passes of WEIGHTED_ROWS_PASS x rows: a pass's rows stay in L1 while
    # every group of output rows and columns goes over them, where one pass
    # over all of x read it from L2 once per group. With few output rows
    # (decode: x comes from DRAM, and there is little work per row to hide
    # it behind) a pass is one x row, hinted WEIGHTED_ROWS_AHEAD rows before
    # it is read, so that reads stay in flight while the sums run (a whole
    # pass hinted at once does not: docs/benchmarks.md#history). A sum split
    # over passes has the bits of one pass (each module's _weighted_rows_pass).
    # A module may have a variant for few rows over a contiguous span
    # (_weighted_few, as _scores_few in k_scores), with the same bits.
    cdef Py_ssize_t i = 0, k, rows = WEIGHTED_ROWS_PASS, ahead = WEIGHTED_ROWS_PASS
    if _weighted_few(y, y_stride, w, w_stride, m, x, x_stride, n_x, n):
        return
    if m <= WEIGHTED_ROWS_FEW:
        rows = 1
        ahead = WEIGHTED_ROWS_AHEAD
    while i < n_x:
        k = min(rows, n_x - i)
        _prefetch_rows(x + (i + ahead) * x_stride, min(k, n_x - i - ahead), x_stride, n)
        _weighted_rows_pass(y, y_stride, w + i, w_stride, m, x + i * x_stride, x_stride, k, n)
        i += k


cdef inline void _weighted_rows_pass_portable(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride,
                                              Py_ssize_t m, const float* x, Py_ssize_t x_stride, Py_ssize_t n_x,
                                              Py_ssize_t n) noexcept nogil:
    # A module's _weighted_rows_pass when it has none of its own. 16 columns
    # of up to four output rows stay in registers while the x rows stream
    # past once. Every value takes k_axpy's steps, y += w * x in the order
    # of i (the tail columns are k_axpy itself), whichever rows share a
    # pass: a sum split over several calls has the bits of one call.
    cdef float acc[4][16]
    cdef float wide[64]
    cdef const float* xi
    cdef float w0, w1, w2, w3
    cdef Py_ssize_t r = 0, c, i, j, k
    while r + 4 <= m:
        c = 0
        while c + 16 <= n:
            for k in range(4):
                memcpy(acc[k], y + (r + k) * y_stride + c, 16 * sizeof(float))
            for i in range(n_x):
                xi = x + i * x_stride + c
                w0 = w[r * w_stride + i]
                w1 = w[(r + 1) * w_stride + i]
                w2 = w[(r + 2) * w_stride + i]
                w3 = w[(r + 3) * w_stride + i]
                for j in range(16):
                    acc[0][j] += w0 * xi[j]
                    acc[1][j] += w1 * xi[j]
                    acc[2][j] += w2 * xi[j]
                    acc[3][j] += w3 * xi[j]
            for k in range(4):
                memcpy(y + (r + k) * y_stride + c, acc[k], 16 * sizeof(float))
            c += 16
        r += 4
    while r < m:  # one row: 64 columns at a time (8 independent chains; 16 would be latency-bound)
        c = 0
        while c + 64 <= n:
            memcpy(wide, y + r * y_stride + c, 64 * sizeof(float))
            for i in range(n_x):
                xi = x + i * x_stride + c
                w0 = w[r * w_stride + i]
                for j in range(64):
                    wide[j] += w0 * xi[j]
            memcpy(y + r * y_stride + c, wide, 64 * sizeof(float))
            c += 64
        while c + 16 <= n:
            memcpy(acc[0], y + r * y_stride + c, 16 * sizeof(float))
            for i in range(n_x):
                xi = x + i * x_stride + c
                w0 = w[r * w_stride + i]
                for j in range(16):
                    acc[0][j] += w0 * xi[j]
            memcpy(y + r * y_stride + c, acc[0], 16 * sizeof(float))
            c += 16
        r += 1
    c = n - n % 16
    if c < n:
        for r in range(m):
            for i in range(n_x):
                k_axpy(y + r * y_stride + c, w[r * w_stride + i], x + i * x_stride + c, n - c)


cdef void k_scale(float* x, float s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] *= s


cdef void k_softcap(float* x, Py_ssize_t n, float cap) noexcept nogil:
    cdef Py_ssize_t i
    cdef double c = cap
    for i in range(n):
        x[i] = <float> (c * tanh(x[i] / c))


cdef bint k_all_finite(const float* x, Py_ssize_t n) noexcept nogil:
    # x - x is 0 for every finite x and NaN for NaN and +-inf
    cdef float s = 0
    cdef Py_ssize_t i
    for i in range(n):
        s += x[i] - x[i]
    return s == 0


cdef void k_rmsnorm(float* out, const float* x, const float* g, Py_ssize_t n,
                    double eps, bint one_plus) noexcept nogil:
    # The sum of squares in 8 f64 lanes (each square exact; one running sum
    # was a chain of dependent adds, 4 cycles per value).
    cdef double lanes[8]
    cdef double ss
    cdef float inv
    cdef Py_ssize_t i = 0, l
    for l in range(8):
        lanes[l] = 0
    while i + 8 <= n:
        for l in range(8):
            lanes[l] += <double> x[i + l] * x[i + l]
        i += 8
    ss = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
    while i < n:
        ss += <double> x[i] * x[i]
        i += 1
    inv = <float> (1.0 / sqrt(ss / n + eps))
    if one_plus:
        for i in range(n):
            out[i] = (x[i] * inv) * (<float> 1 + g[i])
    else:
        for i in range(n):
            out[i] = (x[i] * inv) * g[i]


cdef void k_rope_cos_sin(float* cos_out, float* sin_out, Py_ssize_t head_dim,
                         Py_ssize_t pos, double base, const float* factors, double scale) noexcept nogil:
    cdef Py_ssize_t j
    cdef double angle, inv_freq
    for j in range(head_dim // 2):
        inv_freq = pow(base, -2.0 * j / head_dim)
        if factors != NULL:
            inv_freq = inv_freq / <double> factors[j]
        angle = pos * inv_freq
        if scale != 1.0:
            cos_out[j] = <float> (cos(angle) * scale)
            sin_out[j] = <float> (sin(angle) * scale)
        else:
            cos_out[j] = <float> cos(angle)
            sin_out[j] = <float> sin(angle)


cdef void k_rope_apply(float* x, const float* cos_t, const float* sin_t, Py_ssize_t n_heads,
                       Py_ssize_t head_dim, Py_ssize_t rot_dims, RopePairing pairing) noexcept nogil:
    cdef Py_ssize_t half = rot_dims // 2, h, j, ia, ib
    cdef float a, b
    cdef float* head
    for h in range(n_heads):
        head = x + h * head_dim
        for j in range(half):
            if pairing == ROPE_INTERLEAVED:
                ia = 2 * j
                ib = 2 * j + 1
            else:
                ia = j
                ib = j + half
            a = head[ia]
            b = head[ib]
            head[ia] = a * cos_t[j] - b * sin_t[j]
            head[ib] = a * sin_t[j] + b * cos_t[j]


cdef void k_softmax(float* x, Py_ssize_t n) noexcept nogil:
    cdef float m, t
    cdef double total = 0, inv
    cdef Py_ssize_t i
    if n <= 0:
        return
    m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    for i in range(n):  # vectorized: no libm call
        t = x[i] - m  # <= 0, or NaN (stays NaN: the select below keeps it)
        x[i] = <float> _exp(t if not t < SOFTMAX_ZERO_BELOW else SOFTMAX_ZERO_BELOW)
    for i in range(n):
        total += x[i]
    inv = 1.0 / total
    for i in range(n):
        x[i] = <float> (x[i] * inv)


cdef inline double _exp(double x) noexcept nogil:
    """e^x for SIGMOID_ZERO_BELOW <= x < EXP_TO_INF (e^x is +inf at
    EXP_TO_INF; NaN gives NaN) with a relative error below 1e-14: plain
    arithmetic, no libm call and no branch, so the callers' loops vectorize
    (gcc refuses to under -ftrapping-math when arithmetic sits in a branch)."""
    cdef double k, n, r, p, scale
    cdef uint64_t bits
    k = x * LOG2_E + ROUND_MAGIC
    n = k - ROUND_MAGIC
    r = (x - n * LN2_HI) - n * LN2_LO
    # e^r by its Taylor series to r^11: the remainder is below
    # (ln2/2)^12 / 12! < 7e-15 relative.
    p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (
        1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (
            1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800)))))))))))
    # 2^n: its exponent field n + 1023 (1..2047) from the low bits of k; the
    # shift drops the bits of ROUND_MAGIC.
    memcpy(&bits, &k, 8)
    bits = (bits + 1023) << 52
    memcpy(&scale, &bits, 8)
    return p * scale


cdef inline double _sigmoid(double t) noexcept nogil:
    """sigmoid(t) = 1 / (1 + e^-t) with a relative error below 1e-14; exactly
    0 below SIGMOID_ZERO_BELOW (and for NaN: the callers' factor g carries
    the NaN), 1 for t = +inf. Two selects on the input, then _exp."""
    cdef double x = -t
    x = x if x < -SIGMOID_ZERO_BELOW else EXP_TO_INF  # 2^n = +inf: 1 / (1 + inf) = 0
    x = x if x > SIGMOID_ZERO_BELOW else SIGMOID_ZERO_BELOW  # e^x < 2^-1021: 1 + e^x = 1
    return 1.0 / (1.0 + _exp(x))


cdef void k_silu_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil:
    # silu(g) = g sigmoid(g)
    cdef double g
    cdef Py_ssize_t i
    for i in range(n):
        g = gate[i]
        out[i] = <float> (g * _sigmoid(g) * up[i])


cdef void k_gelu_tanh_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil:
    # 0.5 g (1 + tanh(u)) = g sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3): the
    # same function without the cancellation of 1 + tanh(u) for g < 0.
    cdef double g
    cdef Py_ssize_t i
    for i in range(n):
        g = gate[i]
        out[i] = <float> (g * _sigmoid(2.0 * SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g)) * up[i])


cdef void k_add(float* x, const float* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] += y[i]


cdef void k_dequantize_i8(float* out, const int8_t* q, float scale, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = q[i] * scale


cdef void k_dequantize_q8_0(float* out, const uint8_t* blocks, Py_ssize_t n_blocks) noexcept nogil:
    cdef Py_ssize_t b, i
    cdef float d
    cdef const int8_t* q
    for b in range(n_blocks):
        d = k_f16_to_f32(_load_u16(blocks + b * Q8_0_BYTES))
        q = <const int8_t*> (blocks + b * Q8_0_BYTES + 2)
        for i in range(Q8_0_BLOCK):
            out[b * Q8_0_BLOCK + i] = q[i] * d
