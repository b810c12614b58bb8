# The C interface of every gemma_cy.fast.simd_<isa> module: each module's .pxd
# includes this file, so Cython checks every ISA's definitions against these
# prototypes, and a later Cython module can `from gemma_cy.fast.simd_avx2 cimport ...`
# (or include the kernels and get them inlined).
#
# Conventions (llama2.c's): outputs first, then inputs, then sizes. Pointers are
# raw and trusted (no checks: the def wrappers in wrappers.pxi validate); int8
# rows may start at any byte address; f32 pointers need only 4-byte alignment.
# An output may be the same pointer as an input of the same shape (in-place)
# except in the GEMVs (k_gemv_*, k_matvec), where out must not overlap x.

from libc.stdint cimport int8_t, uint8_t, uint16_t

# How a quantized matrix is stored; k_matvec and k_matrix_row pick the kernel.
cdef enum QLayout:
    QLAYOUT_I8_TENSOR = 0  # int8, one f32 scale for the whole tensor (GMW1, docs/formats.md#int8-per-tensor-quantization)
    QLAYOUT_Q8_0 = 1  # llama.cpp's Q8_0: int8 with one f16 scale per block of 32 (GGUF)
    QLAYOUT_AFFINE = 2  # int8 levels, an f32 scale and offset per sub-block: any other GGUF integer type, exactly
    QLAYOUT_F32 = 3  # f32 values (GGUF F32, and F16 / BF16 widened exactly at load)
    QLAYOUT_Q4_K = 4  # ggml's Q4_K super-blocks as the file stores them, with their sub-blocks' a, b as f32
    QLAYOUT_Q5_0 = 5  # ggml's Q5_0 blocks as the file stores them: a Q8_0 block's d and levels in 22 bytes
    QLAYOUT_Q4_1 = 6  # ggml's Q4_1 blocks as the file stores them: an affine record of 32's levels, a, b in 20 bytes
    QLAYOUT_Q8_PANELS = 7  # a Q8_0 matrix as 16-row panels, packed at load for the q8 mode of a module that stores them
    QLAYOUT_Q4_PANELS = 8  # a Q4_K or Q4_1 matrix as 16-row panels of 4-bit levels, likewise
    QLAYOUT_AFFINE_PANELS = 9  # a QLAYOUT_AFFINE matrix as 16-row panels of its int8 levels, likewise
    QLAYOUT_Q5_PANELS = 10  # a Q5_0 matrix as 16-row panels of 5-bit levels, likewise

# QLAYOUT_Q8_PANELS: rows (a multiple of 16) in panels of 16, back to back;
# a panel is cols / 32 blocks of Q8_PANEL_BLOCK_BYTES, 64-byte aligned: eight
# vectors of 64 bytes, lane i (4 bytes) of vector k holding row i's levels
# 4 k .. 4 k + 3 of the block, each + 128 (as uint8), then the 16 rows'
# f32(d) (16 f32). The same levels and scales as the Q8_0 blocks, so every
# product is the Q8_0 matrix's, bit for bit (q8_vnni.pxi). Only k_gemm_q8
# and k_matrix_row read it (the q8 mode runs every integer product).
# QLAYOUT_Q4_PANELS: a Q4_K matrix the same way with its 4-bit levels two to
# a byte: per block of 32 columns, four vectors of 64 bytes whose low nibbles
# are vectors 0-3 of a QLAYOUT_Q8_PANELS block and high nibbles vectors 4-7
# (the levels 0 .. 15 themselves, not + 128), then the 16 rows' sub-block a,
# then their b (f32): Q4_PANEL_BLOCK_BYTES, against the 416 bytes those 16 x
# 32 weights take as Q4_K super-blocks with their a, b (a Q4_1 matrix: a =
# f32(d), b = -f32(m), as its affine records hold them).
# QLAYOUT_AFFINE_PANELS: a QLAYOUT_AFFINE matrix (records of sub = 16 or 32
# values, with an offset b or not) likewise: per block of 32 columns the
# eight level vectors of a QLAYOUT_Q8_PANELS block (levels + 128), then the
# 16 rows' a of each record in the block (one vector, or two for records of
# 16), then their b likewise when the records have one:
# _affine_panel_block_bytes(sub, has_offset), the records' own bytes.
# QLAYOUT_Q5_PANELS: a Q5_0 matrix: per block of 32 columns, four vectors of
# 64 bytes holding the low four bits of each level + 16 (0 .. 31) as
# QLAYOUT_Q4_PANELS holds its nibbles (vectors 0-3 of a QLAYOUT_Q8_PANELS
# block in the low nibbles, 4-7 in the high ones), then eight 64-bit words,
# word k's bit j the fifth bit of byte j of level vector k, then the 16
# rows' f32(d): Q5_PANEL_BLOCK_BYTES, against 352 as Q5_0 blocks.
cdef enum:
    Q8_PANEL_ROWS = 16
    Q8_PANEL_BLOCK_BYTES = 576
    Q4_PANEL_BLOCK_BYTES = 384
    Q5_PANEL_BLOCK_BYTES = 384

# Q4_K: each run of 256 values of a row is one super-block of 144 bytes (f16
# d, f16 dmin, 12 bytes of 6-bit scales and mins, then 128 bytes qs):
# sub-block 2 j + 0/1 (32 values) is the low/high nibbles of qs[32 j ...].
cdef enum:
    Q4_K_BLOCK = 256  # values per super-block
    Q4_K_BYTES = 144  # bytes per super-block
    Q4_K_RECORD_BYTES = 320  # one super-block as affine records: 8 x (32 levels, a, b)

# Q5_0: each run of 32 values of a row is one block of 22 bytes: the f16
# scale d (little-endian), qh (a little-endian u32: bit j is the high bit of
# value j), then qs[16] (value j < 16 the low nibble of qs[j], value 16 + j
# its high nibble). Level j = (nibble | high bit << 4) - 16, in [-16, 15];
# dequantized value = f32(d) * level: a Q8_0 block's d and int8 levels.
cdef enum:
    Q5_0_BYTES = 22  # bytes per block of 32

# Q4_1: each run of 32 values of a row is one block of 20 bytes: the f16
# scale d, the f16 offset m (little-endian), then qs[16] (value j < 16 the
# low nibble of qs[j], 16 + j its high nibble). Weight j = f32(d) * q_j +
# f32(m), one rounding: the affine record of 32 with a = f32(d), b = -f32(m).
cdef enum:
    Q4_1_BYTES = 20  # bytes per block of 32
    Q4_1_RECORD_BYTES = 40  # one block as an affine record: 32 levels, a, b

# QLAYOUT_Q4_K, QLAYOUT_Q4_1 and QLAYOUT_Q5_0 rows are turned, this many at a time, into
# the layout whose kernels they borrow (affine records, Q8_0 blocks) by
# k_gemm, k_gemm_q8 and k_matrix_row.
cdef enum:
    CONVERT_ROW_TILE = 256

# Q8_0: each run of 32 values of a row is one block of 34 bytes, the f16 scale
# d (little-endian) then the 32 int8 q; a row is cols / 32 blocks back to back,
# rows back to back. Blocks start at any byte address (a GGUF tensor starts
# 32-byte aligned; its 34-byte blocks do not stay so). Dequantized value =
# f32(d) * q.
cdef enum:
    Q8_0_BLOCK = 32  # values per block
    Q8_0_BYTES = 34  # bytes per block

# A weight matrix (rows, cols) as the kernels see it: a zero-copy pointer
# into the (memory-mapped, read-only) file, its scale and its layout.
cdef struct QMatrix:
    const int8_t* q  # QLAYOUT_I8_TENSOR: (rows, cols) row-major, rows back to back, any start address
    const float* w32  # QLAYOUT_F32: (rows, cols) row-major, rows back to back
    const uint8_t* blocks  # QLAYOUT_Q8_0: (rows, cols / 32, 34) bytes, any start address;
                           # QLAYOUT_AFFINE: (rows, cols / sub, sub + 4 [+ 4]) records, 4-byte aligned;
                           # QLAYOUT_Q4_K: (rows, cols / 256, 144) super-blocks, any address;
                           # QLAYOUT_Q5_0: (rows, cols / 32, 22) blocks, any address;
                           # QLAYOUT_Q4_1: (rows, cols / 32, 20) blocks, any address;
                           # QLAYOUT_Q8_PANELS: (rows / 16, cols / 32, 576) panel blocks, 64-byte aligned;
                           # QLAYOUT_Q4_PANELS: (rows / 16, cols / 32, 384), likewise
    float scale  # QLAYOUT_I8_TENSOR: the one scale of the tensor
    Py_ssize_t rows
    Py_ssize_t cols  # QLAYOUT_Q8_0, QLAYOUT_AFFINE, QLAYOUT_Q5_0, QLAYOUT_Q4_1: a multiple of 32 (QLAYOUT_Q4_K: of 256)
    Py_ssize_t sub  # QLAYOUT_AFFINE: values per sub-block (16 or 32); QLAYOUT_Q4_K, QLAYOUT_Q4_1: 32
    bint has_offset  # QLAYOUT_AFFINE: records carry an offset b after the scale a; QLAYOUT_Q4_K, QLAYOUT_Q4_1: true
    const float* ab  # QLAYOUT_Q4_K: (rows, cols / 32, 2) each sub-block's a and b (f32, exact)
    uint8_t* scratch  # QLAYOUT_Q4_K, QLAYOUT_Q4_1, QLAYOUT_Q5_0: k_convert_scratch_bytes(layout, cols, n_tokens) bytes,
                      # 64-byte aligned, that k_gemm, k_gemm_q8 and k_matrix_row may overwrite (the
                      # owner's; one per thread)
    QLayout layout
    bint resident  # expected in cache (the whole model fits the last-level cache): see k_gemv_i8_resident

cdef enum RopePairing:
    ROPE_INTERLEAVED = 0  # pair j is (x[2j], x[2j+1])        (seed, docs/model.md#the-seed-model-gmw1)
    ROPE_HALF_SPLIT = 1   # pair j is (x[j], x[j + head_dim/2]) (Gemma, docs/model.md#gemma-3)

# (sum_i q[i] * x[i]) * scale: f32 products and sums, scale applied once after
# the sum (docs/formats.md#int8-per-tensor-quantization). q (n,) int8, x (n,) f32.
cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil

# out[r] = k_dot_i8(q + r*cols, x, cols, scale) bit for bit (one summation
# order per module, however many rows a kernel runs at once): q (rows, cols)
# int8 row-major with rows back to back, x (cols,), out (rows,).
cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil

# k_gemv_i8 bit for bit, for a matrix the caller expects in cache (a model
# whose weights fit the last-level cache, read again every step): a module
# may run several rows at once there, sharing the loads of x, which pays in
# cache and costs when the rows stream from DRAM. k_matvec calls it for a
# QMatrix marked resident.
cdef void k_gemv_i8_resident(float* out, const int8_t* q, float scale, const float* x,
                             Py_ssize_t rows, Py_ssize_t cols) noexcept nogil

# sum_b f32(d_b) * (sum_{i < 32} q_b[i] * x[32 b + i]) over the n_blocks Q8_0
# blocks of one row (34 bytes each, any address), x (32 * n_blocks,): each
# block's products summed in f32 first, then scaled by its d (the order of
# each module is written in its dot_<isa>.pxi).
cdef float k_dot_q8_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil

# out[r] = k_dot_q8_0(blocks + r * n_blocks * 34, x, n_blocks) bit for bit:
# blocks (rows, n_blocks, 34), x (32 * n_blocks,), out (rows,).
cdef void k_gemv_q8_0(float* out, const uint8_t* blocks, const float* x,
                      Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil

# Affine rows (QLAYOUT_AFFINE; gemma_cy.quant.affine): cols / sub records of
# sub int8 levels q, the scale a (f32) and, when has_offset, the offset b
# (f32); weight = f32(f32(a * q) - b), ggml's dequantized value bit for bit.
# k_dot_affine sums the exact weights times x in the order of k_dot_q8_0
# (32-value blocks, 8-value group g into accumulator g): cols a multiple of 32.
cdef float k_dot_affine(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                        bint has_offset) noexcept nogil

# out[r] = k_dot_affine of row r, bit for bit: rec (rows, cols / sub, record bytes).
cdef void k_gemv_affine(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                        Py_ssize_t sub, bint has_offset) noexcept nogil

# out (cols,) = one affine row's weights, exactly.
cdef void k_dequantize_affine(float* out, const uint8_t* rec, Py_ssize_t cols, Py_ssize_t sub,
                              bint has_offset) noexcept nogil

# Q4_K rows (QLAYOUT_Q4_K; gemma_cy.quant.affine.Q4_KTensor): the file's
# super-blocks for the levels, and each sub-block's a = d * scale and
# b = dmin * min as f32 (worked out once at load, exactly), so that a row
# reads 0.8125 bytes per weight against an affine record's 1.25.
# k_q4_k_records writes one super-block (block, its 16 floats ab) as the 8
# affine records of gemma_cy.quant.affine.AffineLevels.records: the same bytes.
cdef void k_q4_k_records(uint8_t* rec, const uint8_t* block, const float* ab) noexcept nogil

# k_dot_affine of the row's records, bit for bit, straight from the
# super-blocks: what a decode step runs.
cdef float k_dot_q4_k(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil

# Q5_0 rows (QLAYOUT_Q5_0; gemma_cy.quant.ggml.Q5_0Tensor): the file's blocks,
# 22 bytes per 32 weights against Q8_0's 34. k_q5_0_to_q8_0 writes n_blocks
# blocks (blocks, 22 bytes each) as the Q8_0 blocks of
# gemma_cy.quant.ggml.to_q8_0 (out, 34 bytes each): the same d, the levels.
cdef void k_q5_0_to_q8_0(uint8_t* out, const uint8_t* blocks, Py_ssize_t n_blocks) noexcept nogil

# k_dot_q8_0 of the row's Q8_0 blocks, bit for bit, straight from its n_blocks
# Q5_0 blocks (the levels unpacked in registers): what a decode step runs.
cdef float k_dot_q5_0(const uint8_t* blocks, const float* x, Py_ssize_t n_blocks) noexcept nogil

# The scratch a matrix of ``layout`` with cols columns needs for n_tokens
# positions (0 for a layout that needs none).
cdef Py_ssize_t k_convert_scratch_bytes(QLayout layout, Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil

# out (w.rows,) = dequantized w . x (cols,), whatever w's layout; out must
# not overlap x.
cdef void k_matvec(float* out, const QMatrix* w, const float* x) noexcept nogil

# out (n_tokens, w.rows) = x (n_tokens, w.cols) . dequantized w^T, row-major
# (a prefill's projection of a block of positions): out[t, r] is
# k_matvec's out[r] for x[t] bit for bit (the same dot product per row and
# token; rows are read once per tile of tokens, so a block costs one pass
# over the weights instead of one per token). out must not overlap x.
# scratch: at least k_gemm_scratch_floats(w.cols, n_tokens) floats the module
# may overwrite (the caller allocates it once: no allocation in a step).
cdef void k_gemm(float* out, const QMatrix* w, const float* x, Py_ssize_t n_tokens,
                 float* scratch) noexcept nogil

# The f32 scratch k_gemm and k_gemm_q8 of this module need for n_tokens
# positions of a matrix with cols columns (0: none).
cdef Py_ssize_t k_gemm_scratch_floats(Py_ssize_t cols, Py_ssize_t n_tokens) noexcept nogil

# --- int8 activations (the opt-in "q8" mode; docs/numerics.md#activation-modes: the reference
# quantizes the same way, gemma_cy.quant.quantize_activations_q8) ---
#
# Each run of 32 activations gets one f32 scale d = max|x| / 127 (f32
# division) and q = rint(x * (1/d)) (f32 product, round half to even;
# d == 0 gives q = 0): x (32 * n_blocks,) -> q (32 * n_blocks,), d (n_blocks,).
cdef void k_quantize_q8(int8_t* q, float* d, const float* x, Py_ssize_t n_blocks) noexcept nogil

# acc * scale, acc = fmaf(f32(isum_b), xd[b], acc) block after block from
# 0, isum_b = sum_{i<32} w[32b+i] * xq[32b+i]: an int8 row with one scale
# (GMW1) times quantized activations. Each block's integer sum is exact
# (and so is its f32), each block adds one f32 FMA, block after block: one
# order in every module and in the reference (reference/q8.py, Q8Matrix,
# with an exact FMA in NumPy), so the q8 products agree bit for bit.
cdef float k_dot_i8_q8(const int8_t* w, const int8_t* xq, const float* xd, Py_ssize_t n_blocks,
                       float scale) noexcept nogil

# acc = fmaf(f32(isum_b), f32(f32(d_b) * xd[b]), acc) block after block: one
# row of Q8_0 blocks times quantized activations (llama.cpp's
# vec_dot_q8_0_q8_0 with an f32 activation scale, in k_dot_i8_q8's order).
cdef float k_dot_q8_0_q8(const uint8_t* blocks, const int8_t* xq, const float* xd,
                         Py_ssize_t n_blocks) noexcept nogil

# An affine row times quantized activations, in f32: per record, exact
# integer sums of q * xq (and of xq, for an offset), then acc = fmaf(isum,
# f32(a * xd), acc) and acc = fmaf(-qsum, f32(b * xd), acc), in record
# order (kernels/common.pxi).
cdef float k_dot_affine_q8(const uint8_t* rec, const int8_t* xq, const float* xd, Py_ssize_t cols,
                           Py_ssize_t sub, bint has_offset) noexcept nogil

# k_gemm over quantized activations: xq (n_tokens, w.cols) int8, xd
# (n_tokens, w.cols / 32); out[t, r] = k_dot_*_q8 of row r and token t, bit
# for bit. w.cols must be a multiple of 32; w is not QLAYOUT_F32 (the q8 mode does
# not run f32 matrices: gemma_cy.model.checks refuses them). scratch: as
# k_gemm's (k_gemm_scratch_floats(w.cols, n_tokens) floats covers both).
cdef void k_gemm_q8(float* out, const QMatrix* w, const int8_t* xq, const float* xd,
                    Py_ssize_t n_tokens, float* scratch) noexcept nogil

# out (w.cols,) = row ``row`` of w dequantized (an embedding lookup).
cdef void k_matrix_row(float* out, const QMatrix* w, Py_ssize_t row) noexcept nogil

# Whether this module's k_gemm_q8 reads QLAYOUT_Q8_PANELS matrices (the
# avx512 module's: q8_vnni.pxi); elsewhere k_pack_q8_panels writes nothing.
cdef bint k_q8_stores_panels() noexcept nogil

# Rows r0 .. r1 - 1 (multiples of 16, r1 <= w.rows) of a QLAYOUT_Q8_0 (or
# QLAYOUT_Q4_K) matrix w (w.rows a multiple of 16) packed as panels r0 / 16
# .. into dst (a QLAYOUT_Q8_PANELS (QLAYOUT_Q4_PANELS) matrix's memory,
# 64-byte aligned, panel 0 at dst).
cdef void k_pack_q8_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil

# sum_i a[i] * b[i] in f32, a, b (n,): one score of k_scores, in its order.
cdef float k_dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil

# Attention scores: out[r * out_stride + i] = q_r . key_i for the m query
# rows q + r * q_stride and the n_keys keys + i * key_stride, each of n
# values; every score in one order, whatever the rows and keys of the call
# (8 lanes over the whole 8s, summed by _sum8, then the last < 8 products in
# order), so a score's bits do not depend on how attention groups its work.
cdef void k_scores(float* out, Py_ssize_t out_stride, const float* q, Py_ssize_t q_stride, Py_ssize_t m,
                   const float* keys, Py_ssize_t key_stride, Py_ssize_t n_keys, Py_ssize_t n) noexcept nogil

# y += a * x (the weighted sum of v), x, y (n,).
cdef void k_axpy(float* y, float a, const float* x, Py_ssize_t n) noexcept nogil

# y_r (n,) += sum_i w[r * w_stride + i] * x_i for r < m, over the rows x_i =
# x + i * x_stride, i < n_x: each value takes k_axpy's steps in the order of i,
# so a sum split over calls has the bits of one call (the attention output of
# the query heads of one kv head: x read once per 4 rows).
cdef void k_weighted_rows(float* y, Py_ssize_t y_stride, const float* w, Py_ssize_t w_stride, Py_ssize_t m,
                          const float* x, Py_ssize_t x_stride, Py_ssize_t n_x, Py_ssize_t n) noexcept nogil

# x *= s in place (the embedding scale), x (n,).
cdef void k_scale(float* x, float s, Py_ssize_t n) noexcept nogil

# x = cap * tanh(x / cap) in place (Gemma 2's soft-cap), in f64 rounded once; cap > 0.
cdef void k_softcap(float* x, Py_ssize_t n, float cap) noexcept nogil

# True when every x[i] (n,) is finite (no NaN, no +-inf).
cdef bint k_all_finite(const float* x, Py_ssize_t n) noexcept nogil

# out = x / sqrt(mean(x^2) + eps) * g, or * (1 + g) when one_plus (Gemma).
# x, g, out (n,); the sum of squares and the 1/sqrt are in f64.
cdef void k_rmsnorm(float* out, const float* x, const float* g, Py_ssize_t n,
                    double eps, bint one_plus) noexcept nogil

# cos[j], sin[j] of pos * base^(-2j/head_dim) [/ factors[j]], j < head_dim/2:
# computed in f64 and rounded once to f32 (as reference/ops.py rope_cos_sin);
# factors (head_dim/2,) or NULL; each multiplied by scale in f64 before the
# rounding (LongRoPE's attention factor; 1 = none). head_dim: the rotated width.
cdef void k_rope_cos_sin(float* cos_out, float* sin_out, Py_ssize_t head_dim,
                         Py_ssize_t pos, double base, const float* factors, double scale) noexcept nogil

# Rotates in place every pair (a, b) of the first rot_dims values of each head
# of x (n_heads, head_dim): (a, b) -> (a cos_j - b sin_j, a sin_j + b cos_j),
# pairs chosen by `pairing` within those rot_dims; the rest pass unchanged.
cdef void k_rope_apply(float* x, const float* cos_t, const float* sin_t, Py_ssize_t n_heads,
                       Py_ssize_t head_dim, Py_ssize_t rot_dims, RopePairing pairing) noexcept nogil

# Stable softmax of x (n,) in place: exp(x - max) / sum, the sum in f64.
cdef void k_softmax(float* x, Py_ssize_t n) noexcept nogil

# out = act(gate) * up, act computed in f64 without libm (a vectorized e^x) and
# the product rounded once to f32: the correctly rounded f32 but within ~1e-6
# ulp of a tie. NaN in gives NaN, a -inf gate NaN (-inf * 0, as the reference).
cdef void k_silu_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil
cdef void k_gelu_tanh_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil

# x += y (the residual add), x, y (n,).
cdef void k_add(float* x, const float* y, Py_ssize_t n) noexcept nogil

# out = q * scale (one f32 product each: bit-exact with NumPy's q.astype(f32) * scale).
cdef void k_dequantize_i8(float* out, const int8_t* q, float scale, Py_ssize_t n) noexcept nogil

# out (32 * n_blocks,) = f32(d) * q of each Q8_0 block (one f32 product each:
# bit-exact with gemma_cy.quant.dequantize_q8_0).
cdef void k_dequantize_q8_0(float* out, const uint8_t* blocks, Py_ssize_t n_blocks) noexcept nogil

# The f32 value of the IEEE binary16 with bits h (exact: every f16 is an f32),
# by bit manipulation (no F16C needed).
cdef float k_f16_to_f32(uint16_t h) noexcept nogil
