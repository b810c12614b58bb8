# The forward pass: the layers of reference/layers.py (embed, rmsnorm, rope,
# attention, mlp, block, final_norm, logits), with the same names, as nogil
# methods of FastModel over this module's kernels. FastModel owns the weights
# (zero-copy pointers into the mapped file), the scratch buffers and the KV
# cache (llama2.c's TransformerWeights + RunState); FastModel.run runs one or
# more positions through every layer in one call with the GIL released, with
# no allocation and no Python inside.
#
# Positions run in blocks of up to BLOCK (a decode step is a block of one):
# each layer takes the block as a (T, width) matrix, so a prefill reads each
# weight matrix once per block (k_gemm) instead of once per position, and
# the result is the same, bit for bit, as running the positions one by one
# (the same dot product per row and position; attention of position t reads
# the cache up to t only).
#
# Activations: f32 (the default), or "q8": every matrix input quantized to
# int8 per block of 32 first (k_quantize_q8), the opt-in mode of
# docs/numerics.md#activation-modes that the reference mirrors
# (gemma_cy.quant.tensors.quantize_activations_q8).
#
# Included by every gemma_cy/fast/simd_<isa>.pyx after the kernels and their
# wrappers (kernels/wrappers.pxi: _array validates the inputs here too), so
# each ISA module has the whole step with its own kernels inlined. The engine around
# it (index checks, observer calls, errors) is gemma_cy/fast/engine.py.
#
# Observer hook, one code path: with tracing on, the same step copies each
# intermediate the reference observes (gemma_cy.observe) into a trace buffer
# laid out once; the Python caller hands them to the observer after the call.
#
# The layer methods that index memoryviews with computed positions (KV cache,
# scores, trace) are `except -1`: in the debug build (GEMMA_CY_DEBUG=1, bounds
# checks on) an index error raises out of the nogil step instead of being
# printed and ignored. Release builds never raise there; each call pays one
# compare. The elementwise kernels below them stay `noexcept`.

cimport cython
import mmap
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset

from gemma_cy.errors import ModelFormatError
from gemma_cy.model.checks import ACTIVATION_MODES, check_activation_mode
from gemma_cy.model.observe import op_shape
from gemma_cy.fast.arena import lay_out_for_decode, release_file_maps
from gemma_cy.fast.buffers import aligned_zeros
from gemma_cy.model.weights import LAYER_MATRICES
from gemma_cy.quant.tensors import F32Tensor, Int8Tensor, Q8_0Tensor
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor


# The layer ops the trace records, in gemma_cy.observe.LAYER_OPS order; the
# names of the same ops, in the same order, are LAYER_TRACE_OPS.
cdef enum LayerOp:
    OP_ATTN_NORM = 0
    OP_Q = 1
    OP_K = 2
    OP_V = 3
    OP_ATTN_OUT = 4
    OP_ATTN = 5
    OP_RESID_ATTN = 6
    OP_FFN_NORM = 7
    OP_MLP = 8
    OP_RESID_MLP = 9
    N_LAYER_OPS = 10

BLOCK_ROWS = BLOCK  # rows (positions, of one or several slots) per pass of the forward pass

LAYER_TRACE_OPS = ("attn_norm", "q", "k", "v", "attn_out", "attn", "resid_attn",
                   "ffn_norm", "mlp", "resid_mlp")

# A model whose matrices take at most this many bytes in all is taken to stay
# in the last-level cache between steps (Zen 3: 32 MB of L3, shared by the
# cores), so its int8 GEMVs use k_gemv_i8_resident. The tiny model: 2.2 MB;
# the 270M-sized ones: ~260 MB.
cdef enum:
    RESIDENT_MODEL_BYTES = 8 << 20

# Positions per block of the forward pass (scratch is (BLOCK, width)).
cdef enum:
    BLOCK = 64
# Positions of a block whose queries share each pass over the keys and values
# in attention: the window's rows come from L2/L3 once per tile, not per position.
cdef enum:
    ATT_TILE = 4
# Rows a sliding-window layer's ring keeps beyond its window: at least BLOCK
# (a block writes its rows before its first position reads the window
# behind it); the rest is how far back a run may start again (a chat turn
# reusing its prefix), docs/architecture.md#kv-cache.
cdef enum:
    RING_SLACK = 4 * BLOCK

# FastModel.first_bad: where a step's activations first went non-finite
# (-1 the embedding, 0..n_layers-1 a layer's residual, n_layers the logits).
cdef enum:
    ALL_FINITE = -2

# run_batch's want_logits: 1 the segment's last position's logits, 2 every position's.
cdef enum:
    WANT_ALL = 2


# One transformer layer's weights (reference.layers.LayerWeights). Sizes:
# dim hidden, hd head_dim, qd = n_heads*hd, kvd = n_kv_heads*hd, mlp (the
# MLP matrices' rows), ple the per-layer input width. hd, nkv and mlp are
# the layer's own (Gemma 4's layers differ: config.head_dim_of, n_kv_heads_of,
# mlp_dim_of); every buffer is sized by the widest layer.
cdef struct LayerWeights:
    Py_ssize_t hd, nkv, qd, kvd  # this layer's head_dim, kv heads, n_heads*hd, nkv*hd
    bint own_kv  # computes and caches k and v; else reads layer kv_source's cache (config.kv_source)
    bint v_from_k  # no v_proj: v is k's projection, before k-norm and RoPE (config.attn_k_eq_v)
    QMatrix q_proj  # (qd, dim)
    QMatrix k_proj  # (kvd, dim); rows 0 unless own_kv
    QMatrix v_proj  # (kvd, dim); rows 0 unless own_kv and not v_from_k
    QMatrix o_proj  # (dim, qd)
    QMatrix gate_proj  # (mlp, dim)
    QMatrix up_proj  # (mlp, dim)
    QMatrix down_proj  # (dim, mlp)
    const float* attn_norm  # (dim,)
    const float* ffn_norm  # (dim,)
    const float* q_norm  # (hd,), NULL unless config.qk_norm
    const float* k_norm  # (hd,), NULL unless config.qk_norm
    const float* post_attn_norm  # (dim,), NULL unless config.post_norms
    const float* post_ffn_norm  # (dim,), NULL unless config.post_norms
    const float* q_bias  # (qd,), NULL unless config.qkv_bias
    const float* k_bias  # (kvd,), NULL unless config.qkv_bias
    const float* v_bias  # (kvd,), NULL unless config.qkv_bias
    QMatrix ple_gate  # (ple, dim); rows 0 unless config.per_layer_input_dim
    QMatrix ple_proj  # (dim, ple)
    const float* ple_post_norm  # (dim,), NULL unless config.per_layer_input_dim
    float layer_scalar  # the layer's output times this when config.layer_scalars
    # Gemma 4's expert block (config.n_experts; all NULL / 0 rows without it)
    QMatrix router_proj  # (n_experts, dim), f32 in every file: an f32 product in both activation modes
    const float* router_scale  # (dim,)
    const float* expert_scales  # (n_experts,)
    const float* moe_post_norm_1  # (dim,) the MLP's output's norm
    const float* moe_pre_norm_2  # (dim,) the experts' input's norm
    const float* moe_post_norm_2  # (dim,) the experts' output's norm
    const QMatrix* experts  # (n_experts, 2): expert e's gate_up (2 emlp, dim) at 2e, its down (dim, emlp) at 2e+1
    Py_ssize_t rope_table  # 0: the global RoPE base's cos/sin, 1: the local one's
    Py_ssize_t window  # positions attended to, itself included; 0 = all


# A layer that reads another's cache (config.kv_source: Gemma 4's shared
# layers) has that layer's LayerCache: the same memory, no cache of its own.
cdef struct LayerCache:
    float* keys  # (nkv, rows, hd): kv head h's rotated key of position p at [h, p % rows]
    float* values  # (nkv, rows, hd): its raw value
    Py_ssize_t rows  # cache_len; for a sliding-window layer at most window + RING_SLACK (a ring)
    Py_ssize_t window  # the layer's window (0: every position)


cdef Py_ssize_t _matrix_bytes(object tensor):
    """Bytes of a weight matrix's values as stored (0 for a vector)."""
    if len(tensor.shape) != 2:
        return 0
    if isinstance(tensor, (Q8_0Tensor, Q5_0Tensor, Q4_1Tensor)):
        return tensor.blocks.nbytes
    if isinstance(tensor, AffineTensor):
        return tensor.records.nbytes
    if isinstance(tensor, Q4_KTensor):
        return tensor.blocks.nbytes + tensor.ab.nbytes
    if isinstance(tensor, F32Tensor):
        return tensor.data.nbytes
    return tensor.q.nbytes


cdef QLayout _converted_layout(object tensor):
    """QLAYOUT_Q4_K, QLAYOUT_Q4_1 or QLAYOUT_Q5_0 for the tensors whose matrices the
    kernels convert a tile at a time (k_convert_scratch_bytes), else
    QLAYOUT_I8_TENSOR (which needs no scratch)."""
    if isinstance(tensor, Q4_KTensor):
        return QLAYOUT_Q4_K
    if isinstance(tensor, Q5_0Tensor):
        return QLAYOUT_Q5_0
    if isinstance(tensor, Q4_1Tensor):
        return QLAYOUT_Q4_1
    return QLAYOUT_I8_TENSOR


cdef object _convert_scratch(object tensors, Py_ssize_t n_tokens):
    """One scratch (uint8, 64-byte aligned) for every Q4_KTensor, Q4_1Tensor
    and Q5_0Tensor among ``tensors`` run on up to n_tokens positions at once
    (k_convert_scratch_bytes of the widest), or None when there is none."""
    cdef Py_ssize_t size = 0
    cdef QLayout layout
    for t in tensors:
        layout = _converted_layout(t)
        if layout != QLAYOUT_I8_TENSOR:
            size = max(size, k_convert_scratch_bytes(layout, t.shape[1], n_tokens))
    if size == 0:
        return None
    return aligned_zeros(size, np.uint8)


cdef QMatrix _qmatrix(object tensor, list keep, bint resident, object scratch=None,
                      Py_ssize_t n_tokens=0) except *:
    """The kernels' view of a weight matrix (Int8Tensor, Q8_0Tensor, AffineTensor, Q4_KTensor,
    Q4_1Tensor, Q5_0Tensor, 2-D F32Tensor): a pointer into its (read-only, usually
    mapped) values, no copy; ``keep`` keeps the array alive. ``resident``:
    the model stays in cache. A Q4_KTensor, Q4_1Tensor or Q5_0Tensor needs ``scratch``
    (_convert_scratch) for k_gemm calls of up to n_tokens positions."""
    cdef const int8_t[:, ::1] view
    cdef const uint8_t[:, :, ::1] blocks
    cdef const float[:, ::1] w32
    cdef const float[:, :, ::1] ab
    cdef uint8_t[::1] scratch_view
    cdef Py_ssize_t need
    cdef QMatrix m
    m.q = NULL
    m.blocks = NULL
    m.w32 = NULL
    m.sub = 0
    m.has_offset = False
    m.ab = NULL
    m.scratch = NULL
    m.scale = 1
    m.resident = resident
    if isinstance(tensor, Int8Tensor):
        view = tensor.q
        keep.append(tensor.q)
        m.q = &view[0, 0]
        m.scale = tensor.scale
        m.rows = view.shape[0]
        m.cols = view.shape[1]
        m.layout = QLAYOUT_I8_TENSOR
    elif isinstance(tensor, Q8_0Tensor):
        blocks = _array(tensor.blocks, "Q8_0 blocks", np.uint8, (3,))
        keep.append(tensor.blocks)
        m.blocks = &blocks[0, 0, 0]
        m.rows = blocks.shape[0]
        m.cols = blocks.shape[1] * Q8_0_BLOCK
        m.layout = QLAYOUT_Q8_0
    elif isinstance(tensor, F32Tensor) and tensor.data.ndim == 2:
        w32 = _array(tensor.data, "f32 matrix", np.float32, (2,))
        keep.append(tensor.data)
        m.w32 = &w32[0, 0]
        m.rows = w32.shape[0]
        m.cols = w32.shape[1]
        m.layout = QLAYOUT_F32
    elif isinstance(tensor, AffineTensor):
        blocks = _array(tensor.records, "affine records", np.uint8, (3,))
        keep.append(tensor.records)
        m.blocks = &blocks[0, 0, 0]
        m.rows = blocks.shape[0]
        m.cols = blocks.shape[1] * tensor.sub
        m.sub = tensor.sub
        m.has_offset = tensor.has_offset
        if m.cols % Q8_0_BLOCK or (<size_t> m.blocks) % 4:
            raise ModelFormatError(f"affine matrix of {m.cols} columns at {<size_t> m.blocks:#x}: "
                                   f"the kernels need a multiple of {Q8_0_BLOCK} columns, 4-byte aligned records")
        m.layout = QLAYOUT_AFFINE
    elif isinstance(tensor, Q4_KTensor):
        blocks = _array(tensor.blocks, "Q4_K blocks", np.uint8, (3,))
        ab = _array(tensor.ab, "Q4_K scales", np.float32, (3,))
        if blocks.shape[2] != Q4_K_BYTES or ab.shape[0] != blocks.shape[0] or ab.shape[1] != 8 * blocks.shape[1] \
                or ab.shape[2] != 2:
            raise ValueError(f"Q4_K blocks of shape {tensor.blocks.shape} with scales of shape {tensor.ab.shape}: "
                             f"expected (rows, n, {Q4_K_BYTES}) and (rows, 8 n, 2)")
        keep.extend((tensor.blocks, tensor.ab))
        m.blocks = &blocks[0, 0, 0]
        m.ab = &ab[0, 0, 0]
        m.rows = blocks.shape[0]
        m.cols = blocks.shape[1] * Q4_K_BLOCK
        m.sub = 32
        m.has_offset = True
        m.layout = QLAYOUT_Q4_K
    elif isinstance(tensor, Q5_0Tensor):
        blocks = _array(tensor.blocks, "Q5_0 blocks", np.uint8, (3,))
        if blocks.shape[2] != Q5_0_BYTES:
            raise ValueError(f"Q5_0 blocks of shape {tensor.blocks.shape}: expected (rows, n, {Q5_0_BYTES})")
        keep.append(tensor.blocks)
        m.blocks = &blocks[0, 0, 0]
        m.rows = blocks.shape[0]
        m.cols = blocks.shape[1] * Q8_0_BLOCK
        m.layout = QLAYOUT_Q5_0
    elif isinstance(tensor, Q4_1Tensor):
        blocks = _array(tensor.blocks, "Q4_1 blocks", np.uint8, (3,))
        if blocks.shape[2] != Q4_1_BYTES:
            raise ValueError(f"Q4_1 blocks of shape {tensor.blocks.shape}: expected (rows, n, {Q4_1_BYTES})")
        keep.append(tensor.blocks)
        m.blocks = &blocks[0, 0, 0]
        m.rows = blocks.shape[0]
        m.cols = blocks.shape[1] * Q8_0_BLOCK
        m.sub = 32  # its records'
        m.has_offset = True
        m.layout = QLAYOUT_Q4_1
    else:
        raise ModelFormatError(f"the fast engine has no kernels for {type(tensor).__name__} tensors")
    if m.layout == QLAYOUT_Q4_K or m.layout == QLAYOUT_Q4_1 or m.layout == QLAYOUT_Q5_0:  # the kernels write there
        need = k_convert_scratch_bytes(m.layout, m.cols, n_tokens)
        if scratch is None or _array(scratch, "scratch", np.uint8, (1,)).nbytes < need \
                or scratch.ctypes.data % 64 or not scratch.flags.writeable:
            raise ValueError(f"a {type(tensor).__name__} of {m.cols} columns needs a writable scratch of "
                             f"{need} bytes, 64-byte aligned, for {n_tokens} positions (_convert_scratch)")
        keep.append(scratch)
        scratch_view = scratch
        m.scratch = &scratch_view[0]
    return m


cdef QMatrix _no_matrix() noexcept:
    """The QMatrix of an absent matrix: 0 rows, 0 columns, no memory."""
    cdef QMatrix m
    memset(&m, 0, sizeof(QMatrix))
    return m


cdef object _zeros(object shape):
    """A new f32 array of zeros of ``shape`` (an int or a tuple), its first
    value on a cache line (gemma_cy/fast/buffers.py)."""
    return aligned_zeros(shape, np.float32)


cdef object _filled_as_used(object shape):
    """A new f32 array of zeros of ``shape`` whose memory is taken 4 KiB page by
    page as it is first written: an anonymous map without np.zeros's advice
    to use 2 MiB pages for large arrays, under which the first position of
    each layer's KV cache would take 2 MiB (docs/architecture.md#memory)."""
    n_bytes = max(1, int(np.prod(shape, dtype=np.int64))) * 4
    pages = mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, np.float32, count=n_bytes // 4).reshape(shape)


cdef object _read_only_view(object array):
    """A read-only view of ``array`` (the owner keeps writing into it)."""
    view = array.view()
    view.flags.writeable = False
    return view


cdef float* _f32(object array, list keep) except NULL:
    """A pointer to the values of an owned f32 array (C-contiguous, non-empty)."""
    cdef float[::1] view = array
    keep.append(array)
    return &view[0]


cdef const float* _gain(object tensor, list keep) except? NULL:
    """A norm gain (Int8Tensor or F32Tensor) dequantized once to an owned f32
    array (exactly the reference's values); NULL for an absent (None) gain."""
    if tensor is None:
        return NULL
    return _f32(np.array(tensor.dequantize(), dtype=np.float32, order="C", copy=True), keep)


cdef inline Py_ssize_t _window_start(Py_ssize_t pos, Py_ssize_t window) noexcept nogil:
    """The first position that position pos attends to (window 0: all of them)."""
    return pos - window + 1 if window > 0 and pos - window + 1 > 0 else 0


@cython.final
cdef class FastModel:
    """The whole forward pass of one model in Cython, over this module's kernels.

    FastModel(weights, cache_len, activations="f32"): weights is a
    gemma_cy.model.weights.Weights (its matrices, Int8Tensor or Q8_0Tensor,
    are used in place: zero-copy views of the mapped file; a tied lm_head is
    the embedding itself), cache_len the positions of the KV cache
    (1..config.max_seq_len), activations "f32" or "q8" (ParameterError for a
    mode the model cannot run: gemma_cy.model.checks.check_activation_mode).

    ``run(ids, pos, logits=True, trace=False)`` runs the int32 ids at
    positions pos, pos+1, ... and returns how many positions completed.
    Results: ``last_logits`` (vocab,) of the last position, ``trace`` and
    ``trace_layout`` (the intermediates of a traced position), ``first_bad``,
    ``key_cache`` / ``value_cache``: per layer (rows, n_kv_heads, head_dim)
    of that layer (Gemma 4's differ), position p at row p % rows
    (``cache_row``); rows is cache_len, or for a sliding-window layer a ring
    of window + RING_SLACK rows (docs/architecture.md#kv-cache); a layer that
    reads another's cache (config.kv_source) shows that one, and holds no
    memory of its own (``cache_bytes``). All are read-only views of buffers
    the next run overwrites. A run starts at a position the cache can
    resume from (``resumable``), else IndexError.
    gemma_cy.fast.engine.FastEngine is the engine built on this.

    With ``n_slots`` > 1 it holds that many sequences, each with its own KV
    cache and positions (a slot): ``run_batch`` advances several slots in
    one pass over the weights, each slot's rows a segment of consecutive
    positions, and each row gets the bits it gets alone (the matrix
    products are per row; attention reads its own slot's cache). ``run``,
    ``run_token`` and ``run_states`` run slot 0; ``slot_cache(slot)`` and
    ``slot_high(slot)`` show any slot's cache.
    gemma_cy.fast.batch.BatchEngine is the engine built on this.
    """

    # sizes (abbreviations as in reference/layers.py; head_dim, n_kv_heads, q_dim, kv_dim and mlp_dim are
    # the config's: a layer's own are in its LayerWeights)
    cdef readonly Py_ssize_t n_layers, dim, n_heads, n_kv_heads, head_dim, q_dim, kv_dim
    cdef readonly Py_ssize_t mlp_dim, vocab_size, cache_len, n_slots
    # switches
    cdef double norm_eps
    cdef bint one_plus  # gains are (1 + g)
    cdef bint gelu  # gate activation: gelu_tanh, else silu
    cdef bint position_table
    cdef RopePairing pairing
    cdef float embed_scale, scores_scale, attn_softcap, final_softcap  # soft-caps: 0 = off
    cdef double rope_bases[2]  # global, local (layers' rope_table)
    # per table (0 global, 1 local): divisors of the pairs' frequencies (config.rope_freqs), or NULL
    cdef const float* rope_factors[2]
    cdef Py_ssize_t rot_dims[2]  # per table: dims of each head RoPE rotates (rope_dims, else the head)
    cdef Py_ssize_t rope_half  # pairs per table row: max(rot_dims) / 2
    cdef double rope_scale  # cos and sin times this (config.rope_attn_factor)

    # weights
    cdef QMatrix embed_tokens  # (vocab, dim)
    cdef QMatrix embed_positions  # (max_seq_len, dim), when position_table
    cdef QMatrix lm_head  # (vocab, dim): embed_tokens' own struct when tied (same memory)
    cdef const float* final_gain  # (dim,)
    cdef LayerWeights* layers  # (n_layers,)
    # Gemma 4's per-layer inputs (config.per_layer_input_dim = ple_dim; 0 = none)
    cdef readonly Py_ssize_t ple_dim
    cdef QMatrix embed_per_layer  # (vocab, n_layers * ple): a row per token
    cdef QMatrix per_layer_model_proj  # (n_layers * ple, dim)
    cdef const float* per_layer_proj_norm  # (ple,)
    cdef float ple_proj_scale, ple_embed_scale, ple_sum_scale  # dim^-0.5, ple^0.5, 2^-0.5 as f32
    cdef bint v_norm  # v RMS-normed per head without a gain (config.v_norm)
    cdef bint layer_scalars  # each layer's output times its layer_scalar
    cdef const float* ones  # (max(widest hd, dim),) the gain of a norm without one: v's, the router input's
    # Gemma 4's expert block (config.n_experts, n_experts_used, expert_mlp_dim; 0 = none)
    cdef readonly Py_ssize_t n_experts, n_experts_used, expert_mlp_dim
    cdef QMatrix* expert_table  # (n_layers, n_experts, 2) every layer's experts' matrices (LayerWeights.experts)
    cdef float router_dim_scale  # dim^-0.5 as f32 (the reference's)
    cdef float* moe_h  # (dim,) the router's input
    cdef float* moe_probs  # (n_experts,) the router's scores, then probabilities
    cdef float* moe_weight  # (n_experts,) a chosen expert's weight (the others' unused)
    cdef int8_t* moe_taken  # (n_experts,) 1 for a chosen expert
    cdef float* moe_xn  # (dim,) the experts' input
    cdef float* moe_gu  # (2 emlp,) an expert's gate and up, then act(gate) * up in the first half
    cdef float* moe_tmp  # (dim,) an expert's output
    cdef float* moe_sum  # (dim,) the weighted sum of the chosen experts' outputs

    # run state: scratch buffers, allocated once; T = positions of the block
    cdef bint act_q8  # quantize every matrix input to int8 per block of 32
    cdef float* x  # (BLOCK, dim) residual stream
    cdef float* xb  # (BLOCK, dim) normed input of attention / MLP
    cdef float* xb2  # (BLOCK, dim) output of attention / MLP; the position row in embed
    cdef float* q  # (BLOCK, qd) queries
    cdef float* ao  # (BLOCK, qd) attention output (weighted sums of v), before o_proj
    cdef float* q_tile  # (ATT_TILE * nh, hd) the query rows of one kv head over a tile of positions
    cdef float* ao_tile  # (ATT_TILE * nh, hd) their attention output
    cdef float* hb  # (BLOCK, mlp) gate, then act(gate) * up
    cdef float* hb2  # (BLOCK, mlp) up
    cdef int8_t* xq  # (BLOCK, max width) a matrix input quantized (q8 mode)
    cdef float* xd  # (BLOCK, max width / 32) its block scales (q8 mode)
    cdef float* gemm_scratch  # k_gemm's and k_gemm_q8's (k_gemm_scratch_floats(max width, BLOCK),)
    cdef float* rope_cos  # (BLOCK, 2, rope_half): cos of each position's angles, global and local base
    cdef float* rope_sin  # (BLOCK, 2, rope_half)
    cdef float* ple_in  # (BLOCK, n_layers, ple) each row's per-layer inputs (ple_dim > 0)
    cdef float* ple_row  # (n_layers * ple,) a token's row of embed_per_layer
    cdef float* out  # (out_rows, vocab) logits, of the block's rows out_row[0 .. n_out-1]
    cdef float[::1] att  # (ATT_TILE * nh, cache_len) scores, then probabilities, of the rows of q_tile
    cdef LayerCache* caches  # (n_slots, n_layers) each slot's layers' keys and values (slot_cache: read-only views)
    cdef float* k_block  # (BLOCK, kvd) the block's keys, before they go to their cache rows
    cdef float* v_block  # (BLOCK, kvd) its values
    cdef readonly Py_ssize_t cache_bytes  # of every slot's keys and values (a shared layer's count once)
    cdef Py_ssize_t* highs  # (n_slots,) 1 + the last position written since the slot's cache was emptied
    cdef int bad_at[BLOCK]  # per row of a block: ALL_FINITE or where it went non-finite
    # the rows of a block: row t runs position row_pos[t] of slot row_slot[t]; the rows of one slot
    # are consecutive positions in consecutive rows (a segment)
    cdef Py_ssize_t row_slot[BLOCK]
    cdef Py_ssize_t row_pos[BLOCK]
    cdef Py_ssize_t out_row[BLOCK]  # the rows whose logits the block computes, into out's rows 0 .. n_out-1
    cdef Py_ssize_t n_out, out_rows

    # the trace of one position: embed, n_layers * the layer ops, final_norm, logits
    cdef bint tracing
    cdef float[::1] trace_buf
    cdef Py_ssize_t* trace_at  # (n_layers, N_LAYER_OPS) offset of each layer op (layers differ in size)
    cdef Py_ssize_t trace_head  # offset of final_norm (logits follow it)

    # run_states: where each position's final-normed state goes (NULL: nowhere)
    cdef float* states_out  # (n, dim)
    cdef Py_ssize_t states_at  # rows written so far

    cdef readonly int first_bad  # ALL_FINITE (-2), or where the last run went non-finite
    cdef readonly object last_logits, key_cache, value_cache, trace, trace_layout
    cdef readonly object batch_logits  # (out_rows, vocab): run_batch's logits, one row per segment that wants them
    cdef list _slot_caches  # per slot: (key_cache, value_cache) read-only views
    cdef list _keep  # every array a pointer above points into

    def __cinit__(self):
        self.layers = NULL
        self.caches = NULL
        self.highs = NULL
        self.trace_at = NULL
        self.states_out = NULL
        self.expert_table = NULL

    def __dealloc__(self):
        PyMem_Free(self.layers)
        PyMem_Free(self.expert_table)
        PyMem_Free(self.caches)
        PyMem_Free(self.highs)
        PyMem_Free(self.trace_at)

    def __init__(self, weights, Py_ssize_t cache_len, str activations="f32", Py_ssize_t n_slots=1):
        c = weights.config
        if not 0 < cache_len <= c.max_seq_len:
            raise ValueError(f"cache_len = {cache_len}, must be in [1, {c.max_seq_len}]")
        if n_slots < 1:
            raise ValueError(f"n_slots = {n_slots}, must be >= 1")
        self.n_slots = n_slots
        self.act_q8 = check_activation_mode(activations, c, weights.tensors) == "q8"  # ParameterError when it does not fit
        self._keep = [weights]  # weights.keepalive holds the mapped file
        keep = self._keep
        self.n_layers, self.dim, self.n_heads, self.n_kv_heads = c.n_layers, c.dim, c.n_heads, c.n_kv_heads
        self.head_dim, self.q_dim, self.kv_dim, self.mlp_dim = c.head_dim, c.q_dim, c.kv_dim, c.mlp_dim
        self.vocab_size, self.cache_len = c.vocab_size, cache_len
        self.norm_eps = c.norm_eps
        self.one_plus = c.norm_gain == "one_plus"
        self.gelu = c.activation == "gelu_tanh"
        self.position_table = c.position_table
        self.pairing = ROPE_INTERLEAVED if c.rope_pairing == "interleaved" else ROPE_HALF_SPLIT
        self.embed_scale = c.embed_scale
        self.scores_scale = c.scores_scale
        self.attn_softcap = c.attn_softcap
        self.final_softcap = c.final_softcap
        self.rope_bases[0] = c.rope_base
        self.rope_bases[1] = c.rope_base if c.rope_base_local is None else c.rope_base_local
        # table 0 turns the global layers' heads (head_dim_global when set), table 1 the local ones';
        # each with its divisors of the pairs' frequencies (config.rope_divisors: Gemma 4's rope_freqs
        # and Gemma 3's linear scaling divide the global table's only)
        rope_freqs = weights["rope_freqs"].dequantize() if c.rope_freqs else None
        for table in range(2):
            divisors = c.rope_divisors(rope_freqs, table == 1)
            self.rope_factors[table] = NULL if divisors is None else \
                _f32(np.array(divisors, dtype=np.float32, order="C", copy=True), keep)
        self.rot_dims[0] = c.rope_dims or c.head_dim_global or c.head_dim
        self.rot_dims[1] = c.rotary_dims
        self.rope_half = max(self.rot_dims[0], self.rot_dims[1]) // 2
        self.rope_scale = c.rope_attn_factor
        self.ple_dim = c.per_layer_input_dim
        self.v_norm = c.v_norm
        self.layer_scalars = c.layer_scalars
        self.n_experts, self.n_experts_used, self.expert_mlp_dim = c.n_experts, c.n_experts_used, c.expert_mlp_dim

        tensors = weights.tensors
        if self.act_q8:
            # The q8 mode runs each Q5_0 matrix as its Q8_0 conversion (the
            # same weights: docs/numerics.md), laid out once here: its decode
            # GEMV on Q8_0 rows beats both converting tiles on every step and
            # unpacking Q5_0 levels inside the q8 dot product, which costs
            # more per block than the Q8_0 rows' extra bytes
            # (docs/benchmarks.md#history, sixth session). A module without
            # a q8 GEMV of Q4_1 blocks runs each Q4_1 matrix as its records
            # likewise (_gemv_affine32_q8 or the portable one).
            takes_q4_1 = _q8_gemv_takes_q4_1()
            tensors = {name: t.q8_0() if isinstance(t, Q5_0Tensor) else
                       t.affine() if isinstance(t, Q4_1Tensor) and not takes_q4_1 else t
                       for name, t in tensors.items()}
        cdef bint resident = sum(_matrix_bytes(t) for t in tensors.values()) <= RESIDENT_MODEL_BYTES
        # the matrices a decode step streams, in its order, copied out of the
        # file's map into one arena of 2 MiB pages, unless the map has such
        # pages already (gemma_cy/fast/arena.py)
        head = "embed_tokens" if c.tied_embeddings else "lm_head"
        ple = c.per_layer_input_dim
        per_layer = LAYER_MATRICES + (("ple_gate", "ple_proj") if ple else ())
        packed, arena = lay_out_for_decode(tensors, (["per_layer_model_proj"] if ple else []) + [
            f"layers.{layer}.{name}" for layer in range(c.n_layers) for name in per_layer
            if f"layers.{layer}.{name}" in tensors] + [head])  # (a shared layer has no k_proj, v_proj)
        keep.append(arena)
        matrix = lambda name: packed[name] if name in packed else tensors[name]
        scratch = _convert_scratch(tensors.values(), BLOCK)
        self.embed_tokens = _qmatrix(matrix("embed_tokens"), keep, resident, scratch, BLOCK)
        if c.position_table:
            self.embed_positions = _qmatrix(matrix("embed_positions"), keep, resident, scratch, BLOCK)
        self.lm_head = self.embed_tokens if c.tied_embeddings else _qmatrix(matrix("lm_head"), keep, resident,
                                                                            scratch, BLOCK)
        self.final_gain = _gain(weights["final_norm"], keep)
        if ple:
            self.embed_per_layer = _qmatrix(matrix("embed_per_layer"), keep, resident, scratch, BLOCK)
            self.per_layer_model_proj = _qmatrix(matrix("per_layer_model_proj"), keep, resident, scratch, BLOCK)
            self.per_layer_proj_norm = _gain(weights["per_layer_proj_norm"], keep)
            # the reference's f32 factors (reference/layers.py per_layer_inputs)
            self.ple_proj_scale, self.ple_embed_scale, self.ple_sum_scale = c.dim ** -0.5, ple ** 0.5, 2.0 ** -0.5
        self.layers = <LayerWeights*> PyMem_Malloc(c.n_layers * sizeof(LayerWeights))
        if self.layers == NULL:
            raise MemoryError("FastModel: no memory for the layer table")
        cdef Py_ssize_t n_exp = c.n_experts, e, base
        if n_exp:
            self.expert_table = <QMatrix*> PyMem_Malloc(c.n_layers * n_exp * 2 * sizeof(QMatrix))
            if self.expert_table == NULL:
                raise MemoryError("FastModel: no memory for the expert table")
        cdef LayerWeights* w
        for layer in range(c.n_layers):
            w = &self.layers[layer]
            p = f"layers.{layer}."
            w.hd, w.nkv = c.head_dim_of(layer), c.n_kv_heads_of(layer)
            w.qd, w.kvd = c.n_heads * w.hd, w.nkv * w.hd
            w.own_kv = c.kv_source(layer) == layer
            w.v_from_k = w.own_kv and not c.has_v_proj(layer)
            w.q_proj = _qmatrix(matrix(p + "q_proj"), keep, resident, scratch, BLOCK)
            w.k_proj = _qmatrix(matrix(p + "k_proj"), keep, resident, scratch, BLOCK) if w.own_kv else _no_matrix()
            w.v_proj = (_qmatrix(matrix(p + "v_proj"), keep, resident, scratch, BLOCK)
                        if w.own_kv and not w.v_from_k else _no_matrix())
            w.o_proj = _qmatrix(matrix(p + "o_proj"), keep, resident, scratch, BLOCK)
            w.gate_proj = _qmatrix(matrix(p + "gate_proj"), keep, resident, scratch, BLOCK)
            w.up_proj = _qmatrix(matrix(p + "up_proj"), keep, resident, scratch, BLOCK)
            w.down_proj = _qmatrix(matrix(p + "down_proj"), keep, resident, scratch, BLOCK)
            w.attn_norm = _gain(weights[p + "attn_norm"], keep)
            w.ffn_norm = _gain(weights[p + "ffn_norm"], keep)
            w.q_norm = _gain(weights[p + "q_norm"] if c.qk_norm else None, keep)
            w.k_norm = _gain(weights[p + "k_norm"] if c.qk_norm and w.own_kv else None, keep)
            w.post_attn_norm = _gain(weights[p + "post_attn_norm"] if c.post_norms else None, keep)
            w.post_ffn_norm = _gain(weights[p + "post_ffn_norm"] if c.post_norms else None, keep)
            w.q_bias = _gain(weights[p + "q_bias"] if c.qkv_bias else None, keep)
            w.k_bias = _gain(weights[p + "k_bias"] if c.qkv_bias else None, keep)
            w.v_bias = _gain(weights[p + "v_bias"] if c.qkv_bias else None, keep)
            w.ple_gate = _qmatrix(matrix(p + "ple_gate"), keep, resident, scratch, BLOCK) if ple else _no_matrix()
            w.ple_proj = _qmatrix(matrix(p + "ple_proj"), keep, resident, scratch, BLOCK) if ple else _no_matrix()
            w.ple_post_norm = _gain(weights[p + "ple_post_norm"] if ple else None, keep)
            w.layer_scalar = float(weights[p + "layer_scalar"].dequantize()[0]) if c.layer_scalars else 1
            w.rope_table = 1 if c.is_local(layer) else 0
            w.window = c.window(layer)
            if n_exp:  # the router is f32 in every file (gemma_cy.model.checks lets the q8 mode run it)
                w.router_proj = _qmatrix(tensors[p + "router_proj"], keep, resident, scratch, BLOCK)
                w.router_scale = _gain(weights[p + "router_scale"], keep)
                w.expert_scales = _gain(weights[p + "expert_scales"], keep)
                w.moe_post_norm_1 = _gain(weights[p + "moe_post_norm_1"], keep)
                w.moe_pre_norm_2 = _gain(weights[p + "moe_pre_norm_2"], keep)
                w.moe_post_norm_2 = _gain(weights[p + "moe_post_norm_2"], keep)
                base = <Py_ssize_t> layer * n_exp * 2
                for e in range(n_exp):
                    self.expert_table[base + 2 * e] = _qmatrix(
                        matrix(p + f"expert{e}_gate_up"), keep, resident, scratch, BLOCK)
                    self.expert_table[base + 2 * e + 1] = _qmatrix(
                        matrix(p + f"expert{e}_down"), keep, resident, scratch, BLOCK)
                w.experts = self.expert_table + base
            else:
                w.router_proj = _no_matrix()
                w.router_scale = w.expert_scales = NULL
                w.moe_post_norm_1 = w.moe_pre_norm_2 = w.moe_post_norm_2 = NULL
                w.experts = NULL
            release_file_maps(weights.keepalive)  # what reading its gains mapped (gemma_cy/fast/arena.py)

        self.x, self.xb, self.xb2 = (_f32(_zeros(BLOCK * c.dim), keep), _f32(_zeros(BLOCK * c.dim), keep),
                                     _f32(_zeros(BLOCK * c.dim), keep))
        # the widest layer's sizes (Gemma 4's layers differ); the MLP's buffers also hold the per-layer input's
        every = range(c.n_layers)
        q_dim = max(c.n_heads * c.head_dim_of(layer) for layer in every)
        kv_dim = max(c.n_kv_heads_of(layer) * c.head_dim_of(layer) for layer in every)
        head_dim = max(c.head_dim_of(layer) for layer in every)
        mlp_dim = max(max(c.mlp_dim_of(layer) for layer in every), ple)
        self.q, self.ao = _f32(_zeros(BLOCK * q_dim), keep), _f32(_zeros(BLOCK * q_dim), keep)
        self.hb, self.hb2 = _f32(_zeros(BLOCK * mlp_dim), keep), _f32(_zeros(BLOCK * mlp_dim), keep)
        widest = max(c.dim, q_dim, mlp_dim, c.expert_mlp_dim)  # (an expert's down_proj takes emlp)
        xq = aligned_zeros(BLOCK * widest, np.int8)
        cdef int8_t[::1] xq_view = xq
        keep.append(xq)
        self.xq = &xq_view[0]
        self.xd = _f32(_zeros(BLOCK * (widest // Q8_0_BLOCK + 1)), keep)
        self.gemm_scratch = _f32(_zeros(max(1, k_gemm_scratch_floats(widest, BLOCK))), keep)
        self.rope_cos = _f32(_zeros(BLOCK * 2 * self.rope_half), keep)
        self.rope_sin = _f32(_zeros(BLOCK * 2 * self.rope_half), keep)
        if ple:
            self.ple_in = _f32(_zeros(BLOCK * c.n_layers * ple), keep)
            self.ple_row = _f32(_zeros(c.n_layers * ple), keep)
        if c.v_norm or n_exp:  # the gain of a norm without one (v's, the router input's)
            self.ones = _f32(np.ones(max(head_dim, c.dim), np.float32), keep)
        cdef int8_t[::1] taken_view = np.zeros(max(1, n_exp), np.int8)
        if n_exp:
            self.router_dim_scale = c.dim ** -0.5
            self.moe_h, self.moe_xn = _f32(_zeros(c.dim), keep), _f32(_zeros(c.dim), keep)
            self.moe_tmp, self.moe_sum = _f32(_zeros(c.dim), keep), _f32(_zeros(c.dim), keep)
            self.moe_probs, self.moe_weight = _f32(_zeros(n_exp), keep), _f32(_zeros(n_exp), keep)
            self.moe_gu = _f32(_zeros(2 * c.expert_mlp_dim), keep)
            keep.append(taken_view.base)
            self.moe_taken = &taken_view[0]
        self.out_rows = 1 if n_slots == 1 else BLOCK  # (pages a batch never fills are never touched)
        logits = _zeros((1, c.vocab_size)) if n_slots == 1 else _filled_as_used((BLOCK, c.vocab_size))
        self.out = _f32(logits.reshape(-1), keep)
        self.batch_logits = _read_only_view(logits)
        self.q_tile = _f32(_zeros(ATT_TILE * c.n_heads * head_dim), keep)
        self.ao_tile = _f32(_zeros(ATT_TILE * c.n_heads * head_dim), keep)
        self.att = _filled_as_used(ATT_TILE * c.n_heads * cache_len)
        self.k_block, self.v_block = _f32(_zeros(BLOCK * kv_dim), keep), _f32(_zeros(BLOCK * kv_dim), keep)
        self._lay_out_cache(c, cache_len)
        self.last_logits = _read_only_view(logits[0])
        self._lay_out_trace(c)
        self.first_bad = ALL_FINITE

    cdef int _lay_out_cache(self, object config, Py_ssize_t cache_len) except -1:
        """Each slot's layers' keys and values: cache_len rows, or for a layer
        with a sliding window a ring of window + RING_SLACK rows, all in one
        map that takes memory as rows fill (a slot that never runs takes
        none). Head-major, (nkv, rows, hd) per layer, the layer's own sizes:
        attention reads one kv head's rows of consecutive positions, and they
        lie one after another in memory (docs/architecture.md#kv-cache);
        key_cache[layer] shows slot 0's as (rows, nkv, hd), as the
        reference's. A layer that reads another's cache (config.kv_source)
        holds none: its entry is its source's, memory and views."""
        cdef Py_ssize_t n_layers = config.n_layers
        cdef Py_ssize_t n = n_layers * self.n_slots
        self.caches = <LayerCache*> PyMem_Malloc(n * sizeof(LayerCache))
        self.highs = <Py_ssize_t*> PyMem_Malloc(self.n_slots * sizeof(Py_ssize_t))
        if self.caches == NULL or self.highs == NULL:
            raise MemoryError("FastModel: no memory for the cache table")
        windows = [config.window(layer) for layer in range(n_layers)]
        rows = [min(cache_len, w + RING_SLACK) if w > 0 else cache_len for w in windows]
        sources = [config.kv_source(layer) for layer in range(n_layers)]
        shapes = [(config.n_kv_heads_of(layer), r, config.head_dim_of(layer)) for layer, r in enumerate(rows)]
        sizes = [int(np.prod(shape)) for shape in shapes]
        per_slot = sum(size for layer, size in enumerate(sizes) if sources[layer] == layer)
        keys = _filled_as_used(self.n_slots * per_slot)
        values = _filled_as_used(self.n_slots * per_slot)
        self.cache_bytes = 2 * self.n_slots * per_slot * sizeof(float)
        cdef float* k0 = _f32(keys, self._keep)
        cdef float* v0 = _f32(values, self._keep)
        cdef Py_ssize_t slot, layer, at = 0
        cdef LayerCache* kv
        self._slot_caches = []
        for slot in range(self.n_slots):
            self.highs[slot] = 0
            key_views, value_views = [], []
            for layer in range(n_layers):
                kv = &self.caches[slot * n_layers + layer]
                if sources[layer] != layer:  # the source's cache (an earlier layer: laid out already)
                    kv[0] = self.caches[slot * n_layers + sources[layer]]
                    key_views.append(key_views[sources[layer]])
                    value_views.append(value_views[sources[layer]])
                    continue
                kv.keys = k0 + at
                kv.values = v0 + at
                kv.rows = rows[layer]
                kv.window = windows[layer]
                key_views.append(_read_only_view(keys[at:at + sizes[layer]].reshape(shapes[layer]).transpose(1, 0, 2)))
                value_views.append(
                    _read_only_view(values[at:at + sizes[layer]].reshape(shapes[layer]).transpose(1, 0, 2)))
                at += sizes[layer]
            self._slot_caches.append((tuple(key_views), tuple(value_views)))
        self.key_cache, self.value_cache = self._slot_caches[0]
        return 0

    def slot_cache(self, Py_ssize_t slot):
        """(key_cache, value_cache) of ``slot``, as ``key_cache`` / ``value_cache`` show slot 0's."""
        self._check_slot(slot)
        return self._slot_caches[slot]

    def slot_high(self, Py_ssize_t slot):
        """1 + the last position ``slot`` wrote since its cache was emptied (a run from 0 empties it)."""
        self._check_slot(slot)
        return self.highs[slot]

    @property
    def high(self):
        """slot_high(0)."""
        return self.highs[0]

    cdef int _check_slot(self, Py_ssize_t slot) except -1:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} outside [0, {self.n_slots})")
        return 0

    def cache_row(self, Py_ssize_t layer, Py_ssize_t pos, Py_ssize_t slot=0):
        """The row of ``key_cache[layer]`` / ``value_cache[layer]`` (of
        ``slot``'s cache) that holds position ``pos``, or None when the
        layer's ring no longer holds it (or it was never written)."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"cache_row: layer {layer} outside [0, {self.n_layers})")
        self._check_slot(slot)
        cdef LayerCache* kv = &self.caches[slot * self.n_layers + layer]
        cdef Py_ssize_t high = self.highs[slot]
        if not 0 <= pos < high or pos < high - kv.rows:
            return None
        return pos % kv.rows

    def resumable(self, Py_ssize_t pos, Py_ssize_t slot=0):
        """True when a run of ``slot`` can start at ``pos`` (0 <= pos <=
        slot_high(slot)): every layer still holds the positions before
        ``pos`` that it attends to. A ring keeps its last rows positions;
        once a run has gone further than that past ``pos``, ``pos`` can only
        be reached again from 0."""
        self._check_slot(slot)
        cdef Py_ssize_t layer, first, high = self.highs[slot]
        cdef const LayerCache* kv = &self.caches[slot * self.n_layers]
        if pos == 0:
            return True
        if not 0 < pos <= high:
            return False
        for layer in range(self.n_layers):
            first = _window_start(pos, kv[layer].window)
            if first < high - kv[layer].rows:
                return False
        return True

    cdef int _check_run(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t slot=0) except -1:
        """IndexError unless positions pos .. pos+n-1 fit the cache and a run of ``slot`` can start at pos."""
        if not 0 <= pos <= self.cache_len - n:
            raise IndexError(f"run: positions {pos}..{pos + n - 1} outside the KV cache [0, {self.cache_len})")
        if not self.resumable(pos, slot):
            raise IndexError(f"run: position {pos} cannot be run again: the sliding-window layers' cache "
                             f"(a ring) no longer holds the positions before it; run again from position 0")
        return 0

    cdef int _lay_out_trace(self, object config) except -1:
        """Offsets and shapes of every observed op in the trace of one position
        (each layer's own sizes: gemma_cy.model.observe.op_shape)."""
        self.trace_at = <Py_ssize_t*> PyMem_Malloc(self.n_layers * N_LAYER_OPS * sizeof(Py_ssize_t))
        if self.trace_at == NULL:
            raise MemoryError("FastModel: no memory for the trace table")
        layout = {(-1, "embed"): (0, op_shape(config, "embed"))}
        offset = self.dim
        for layer in range(self.n_layers):
            for i, op in enumerate(LAYER_TRACE_OPS):
                shape = op_shape(config, op, layer)
                self.trace_at[layer * N_LAYER_OPS + i] = offset
                layout[layer, op] = (offset, shape)
                offset += int(np.prod(shape))
        self.trace_head = offset
        layout[self.n_layers, "final_norm"] = (self.trace_head, op_shape(config, "final_norm"))
        layout[self.n_layers, "logits"] = (self.trace_head + self.dim, op_shape(config, "logits"))
        buf = _zeros(self.trace_head + self.dim + self.vocab_size)
        self.trace_buf = buf
        self.trace = _read_only_view(buf)
        self.trace_layout = layout  # (layer, op) -> (offset, shape)
        return 0

    def run(self, ids, Py_ssize_t pos, bint logits=True, bint trace=False):
        """Run ``ids`` (int32 (n,), n >= 1) at positions pos .. pos+n-1, GIL
        released. The logits are computed for the last position only, and only
        when ``logits``; ``trace`` records every intermediate of the position
        (one position per traced call). IndexError for an id outside the
        vocabulary or a position outside the cache: the step never sees one.

        Returns n when every position's activations stayed finite; else the
        index i of the position that went non-finite (it ran whole; positions
        after it did not run) and first_bad says where.
        """
        _array(ids, "ids", np.int32, (1,))
        cdef const int32_t[::1] tv = ids
        cdef Py_ssize_t n = tv.shape[0], i, done
        if n == 0:
            raise ValueError("run: ids is empty")
        if trace and n != 1:
            raise ValueError("run: a traced call runs one position (the trace holds one)")
        self._check_run(pos, n)
        for i in range(n):
            if not 0 <= tv[i] < self.vocab_size:
                raise IndexError(f"run: token id {tv[i]} outside the vocabulary [0, {self.vocab_size})")
        self.tracing = trace
        try:
            with nogil:
                done = self.run_blocks(&tv[0], n, pos, logits)
        finally:
            self.tracing = False
        return done

    def run_states(self, ids, Py_ssize_t pos, states):
        """``run`` without logits, writing the final-normed state of every
        position into ``states`` (n, dim) f32: what the output layer turns
        into each position's logits (``logits_of``). Returns as ``run``."""
        _array(ids, "ids", np.int32, (1,))
        _out(states, (ids.shape[0], self.dim), (ids,))
        cdef const int32_t[::1] tv = ids
        cdef float[:, ::1] sv = states
        cdef Py_ssize_t n = tv.shape[0], i, done
        if n == 0:
            raise ValueError("run_states: ids is empty")
        self._check_run(pos, n)
        for i in range(n):
            if not 0 <= tv[i] < self.vocab_size:
                raise IndexError(f"run: token id {tv[i]} outside the vocabulary [0, {self.vocab_size})")
        self.states_out, self.states_at = &sv[0, 0], 0
        try:
            with nogil:
                done = self.run_blocks(&tv[0], n, pos, False)
        finally:
            self.states_out = NULL
        return done

    def logits_of(self, states, out=None):
        """The logits (T, vocab) of final-normed states (T, dim): the output
        layer and soft-cap exactly as ``run`` computes one position's, BLOCK
        rows per product."""
        _array(states, "states", np.float32, (2,))
        if states.shape[1] != self.dim:
            raise ValueError(f"logits_of: states have {states.shape[1]} columns, the model's dim is {self.dim}")
        out = _out(out, (states.shape[0], self.vocab_size), (states,))
        cdef const float[:, ::1] sv = states
        cdef float[:, ::1] ov = out
        cdef Py_ssize_t T = sv.shape[0], lo, size, t
        if T == 0:
            return out
        with nogil:
            lo = 0
            while lo < T:
                size = min(<Py_ssize_t> BLOCK, T - lo)
                self.matmul(&ov[lo, 0], &self.lm_head, &sv[lo, 0], size)
                if self.final_softcap > 0:
                    for t in range(size):
                        k_softcap(&ov[lo + t, 0], self.vocab_size, self.final_softcap)
                lo += size
        return out

    def run_token(self, Py_ssize_t token, Py_ssize_t pos):
        """``run`` of the one id ``token`` at ``pos``, with logits and no trace:
        a decode step without an ids array to build and check. Returns 1, or
        0 when the position went non-finite (first_bad says where)."""
        cdef int32_t tok
        cdef Py_ssize_t done
        self._check_run(pos, 1)
        if not 0 <= token < self.vocab_size:
            raise IndexError(f"run: token id {token} outside the vocabulary [0, {self.vocab_size})")
        tok = <int32_t> token
        with nogil:
            done = self.run_blocks(&tok, 1, pos, True)
        return done

    def run_batch(self, ids, seg_slots, seg_pos, seg_lens, want_logits):
        """One block of several slots' rows, GIL released: segment i runs
        ``seg_lens[i]`` ids of ``ids`` (int32, the segments' ids one after
        another, at most BLOCK in all) at positions seg_pos[i] .. of slot
        seg_slots[i] (each slot at most once); the segments with
        ``want_logits[i]`` 1 get the logits of their last position, those
        with 2 of every position (a speculative block), in order, in the rows
        of ``batch_logits`` (at most ``out_rows`` in all). A segment from position 0 empties
        its slot's cache first. Every index is checked here (IndexError,
        ValueError): the step never sees a bad one.

        Returns the number of rows when every row stayed finite; else the
        first row that went non-finite (``row_status`` says where, per row).
        """
        cdef const int32_t[::1] tv, sv, pv, lv, wv
        for name, a in (("ids", ids), ("seg_slots", seg_slots), ("seg_pos", seg_pos), ("seg_lens", seg_lens),
                        ("want_logits", want_logits)):
            _array(a, name, np.int32, (1,))
        tv, sv, pv, lv, wv = ids, seg_slots, seg_pos, seg_lens, want_logits
        cdef Py_ssize_t S = sv.shape[0], T = tv.shape[0], i, j, t = 0, done, slot
        if S == 0 or not (pv.shape[0] == lv.shape[0] == wv.shape[0] == S):
            raise ValueError(f"run_batch: {S} segment slots, {pv.shape[0]} positions, {lv.shape[0]} lengths, "
                             f"{wv.shape[0]} logits flags: expected one of each per segment, at least one")
        if len(set(seg_slots.tolist())) != S:
            raise ValueError("run_batch: a slot appears in more than one segment")
        if any(n < 1 for n in seg_lens.tolist()) or sum(seg_lens.tolist()) != T:
            raise ValueError(f"run_batch: segment lengths {seg_lens.tolist()} must be >= 1 and sum to len(ids) = {T}")
        if T > BLOCK:
            raise ValueError(f"run_batch: {T} rows, at most {BLOCK} per call")
        n_out = 0
        for i in range(S):
            if not 0 <= wv[i] <= WANT_ALL:
                raise ValueError(f"run_batch: want_logits[{i}] = {wv[i]}: 0 none, 1 the last position, 2 every one")
            n_out += lv[i] if wv[i] == WANT_ALL else wv[i]
        if n_out > self.out_rows:
            raise ValueError(f"run_batch: {n_out} rows of logits, at most {self.out_rows} per call")
        for i in range(S):
            self._check_slot(sv[i])
            self._check_run(pv[i], lv[i], sv[i])
        for i in range(T):
            if not 0 <= tv[i] < self.vocab_size:
                raise IndexError(f"run_batch: token id {tv[i]} outside the vocabulary [0, {self.vocab_size})")
        self.n_out = 0
        for i in range(S):
            slot = sv[i]
            if pv[i] == 0:
                self.highs[slot] = 0
            for j in range(lv[i]):
                self.row_slot[t], self.row_pos[t] = slot, pv[i] + j
                t += 1
            if wv[i] == WANT_ALL:
                for j in range(lv[i]):
                    self.out_row[self.n_out] = t - lv[i] + j
                    self.n_out += 1
            elif wv[i]:
                self.out_row[self.n_out] = t - 1
                self.n_out += 1
        with nogil:
            done = self.run_rows(&tv[0], T)
        for i in range(S):  # each segment wrote its rows, however the block ended
            if pv[i] + lv[i] > self.highs[sv[i]]:
                self.highs[sv[i]] = pv[i] + lv[i]
        return done

    def copy_slot(self, Py_ssize_t src, Py_ssize_t dst, Py_ssize_t n_pos):
        """Slot ``dst`` takes slot ``src``'s keys and values of positions 0 ..
        n_pos-1 (bit for bit: a copy) and forgets the rest: sequences that
        share a prompt run it once. ``src`` must still hold what position
        n_pos needs (``resumable(n_pos, src)``)."""
        self._check_slot(src)
        self._check_slot(dst)
        if src == dst:
            raise ValueError("copy_slot: src and dst are the same slot")
        if not 0 < n_pos <= self.highs[src] or not self.resumable(n_pos, src):
            raise IndexError(f"copy_slot: slot {src} does not hold positions 0 .. {n_pos - 1} "
                             f"(it has run to {self.highs[src]})")
        cdef Py_ssize_t layer, head, n, hd
        cdef const LayerCache* a
        cdef LayerCache* b
        for layer in range(self.n_layers):
            if not self.layers[layer].own_kv:  # its cache is its source layer's, copied there
                continue
            hd = self.layers[layer].hd
            a = &self.caches[src * self.n_layers + layer]
            b = &self.caches[dst * self.n_layers + layer]
            n = min(n_pos, a.rows)  # a ring holds its last rows positions: all of its rows then
            for head in range(self.layers[layer].nkv):
                memcpy(b.keys + head * b.rows * hd, a.keys + head * a.rows * hd, n * hd * sizeof(float))
                memcpy(b.values + head * b.rows * hd, a.values + head * a.rows * hd, n * hd * sizeof(float))
        self.highs[dst] = n_pos

    def row_status(self, Py_ssize_t n):
        """Per row of the last block (n rows): -2 (finite), or where it went
        non-finite (-1 the embedding, a layer, n_layers the logits)."""
        if not 0 <= n <= BLOCK:
            raise ValueError(f"row_status: n = {n} outside [0, {BLOCK}]")
        return np.array([self.bad_at[i] for i in range(n)], dtype=np.int32)

    # -----------------------------------------------------------------------
    # The forward pass (reads like reference/model.py and reference/layers.py,
    # each layer over a block of T positions: row t of a (T, width) buffer
    # is position pos0 + t). run_block is the reference's ReferenceEngine._step
    # over a block of positions; ``forward(token, pos)`` is, in both engines
    # (FastEngine, ReferenceEngine), one token at one position, as in llama2.c.

    cdef Py_ssize_t run_blocks(self, const int32_t* ids, Py_ssize_t n, Py_ssize_t pos0,
                               bint want_logits) except -1 nogil:
        """Positions pos0 .. pos0+n-1 (prefill, or one decode step) in blocks
        of BLOCK; logits of the last only. Stops after a block in which a
        position went non-finite and returns that position's index."""
        cdef Py_ssize_t lo = 0, t, size
        if pos0 == 0:  # a run from the start: nothing cached before it counts
            self.highs[0] = 0
        while lo < n:
            size = min(<Py_ssize_t> BLOCK, n - lo)
            t = self.run_block(ids + lo, size, pos0 + lo, want_logits and lo + size == n)
            if pos0 + lo + size > self.highs[0]:  # the block wrote its rows, however it ended
                self.highs[0] = pos0 + lo + size
            if t < size:
                return lo + t
            lo += size
        return n

    cdef Py_ssize_t run_block(self, const int32_t* ids, Py_ssize_t T, Py_ssize_t pos0,
                              bint want_logits) except -1 nogil:
        """Positions pos0 .. pos0+T-1 (T <= BLOCK) of slot 0: run_rows with
        the logits (when want_logits) of the last position."""
        cdef Py_ssize_t t
        for t in range(T):
            self.row_slot[t], self.row_pos[t] = 0, pos0 + t
        self.n_out = 1 if want_logits else 0
        self.out_row[0] = T - 1
        return self.run_rows(ids, T)

    cdef Py_ssize_t run_rows(self, const int32_t* ids, Py_ssize_t T) except -1 nogil:
        """The block's T rows (row_slot, row_pos; T <= BLOCK): x = embed;
        x = block(x) for each layer; final_norm and logits of the rows
        out_row[0 .. n_out-1] into self.out's rows, in one product. Returns
        T, or the first row that went non-finite (first_bad says where)."""
        cdef Py_ssize_t layer, t, i, half = self.rope_half, dim = self.dim
        cdef int table
        for t in range(T):
            for table in range(2):
                k_rope_cos_sin(self.rope_cos + (2 * t + table) * half, self.rope_sin + (2 * t + table) * half,
                               self.rot_dims[table], self.row_pos[t], self.rope_bases[table],
                               self.rope_factors[table], self.rope_scale)
            self.embed(self.x + t * dim, ids[t], self.row_pos[t])  # (dim,)
            self.bad_at[t] = ALL_FINITE if k_all_finite(self.x + t * dim, dim) else -1
        if self.ple_dim > 0:
            self.per_layer_inputs(ids, T)  # (T, n_layers, ple)
        self.observe(0, self.x, dim)
        for layer in range(self.n_layers):
            self.block(self.x, &self.layers[layer], layer, T)  # (T, dim)
            for t in range(T):
                if self.bad_at[t] == ALL_FINITE and not k_all_finite(self.x + t * dim, dim):
                    self.bad_at[t] = layer
        if self.states_out != NULL:
            for t in range(T):
                self.final_norm(self.states_out + (self.states_at + t) * dim, self.x + t * dim)  # (dim,)
            self.states_at += T
        self.final_norm(self.xb, self.x + (T - 1) * dim)  # (dim,)
        self.observe(self.trace_head, self.xb, dim)
        if self.n_out > 0:
            for i in range(self.n_out):
                self.final_norm(self.xb + i * dim, self.x + self.out_row[i] * dim)  # (n_out, dim)
            self.logits(self.out, self.xb, self.n_out)  # (n_out, vocab)
            self.observe(self.trace_head + dim, self.out, self.vocab_size)
            for i in range(self.n_out):
                t = self.out_row[i]
                if self.bad_at[t] == ALL_FINITE and not k_all_finite(self.out + i * self.vocab_size,
                                                                     self.vocab_size):
                    self.bad_at[t] = self.n_layers
        self.first_bad = ALL_FINITE
        for t in range(T):
            if self.bad_at[t] != ALL_FINITE:
                self.first_bad = self.bad_at[t]
                return t
        return T

    cdef int block(self, float* x, const LayerWeights* w, Py_ssize_t layer, Py_ssize_t T) except -1 nogil:
        """One transformer layer on x (T, dim) in place:
        x += [post_attn_norm] attention(attn_norm(x)); x += [post_ffn_norm] mlp(ffn_norm(x));
        Gemma 4: with experts, the MLP's output is moe_post_norm_1(mlp) + experts(x), each row
        on its own; x += the per-layer input's block (per_layer_input), then x *= layer_scalar."""
        cdef Py_ssize_t dim = self.dim, t
        self.rmsnorm(self.xb, x, w.attn_norm, dim, T)  # (T, dim)
        self.observe_layer(layer, OP_ATTN_NORM, self.xb, dim)
        self.attention(self.xb2, self.xb, w, layer, T)  # (T, dim)
        if w.post_attn_norm != NULL:
            self.rmsnorm(self.xb2, self.xb2, w.post_attn_norm, dim, T)
        self.observe_layer(layer, OP_ATTN, self.xb2, dim)
        k_add(x, self.xb2, T * dim)
        self.observe_layer(layer, OP_RESID_ATTN, x, dim)

        self.rmsnorm(self.xb, x, w.ffn_norm, dim, T)  # (T, dim)
        self.observe_layer(layer, OP_FFN_NORM, self.xb, dim)
        self.mlp(self.xb2, self.xb, w, T)  # (T, dim)
        if self.n_experts > 0:  # Gemma 4: the expert block beside the MLP, both normed, then summed
            self.rmsnorm(self.xb2, self.xb2, w.moe_post_norm_1, dim, T)
            for t in range(T):  # each row its own experts: one position's products (= decode, bit for bit)
                self.experts(self.xb + t * dim, x + t * dim, w)  # (dim,) (xb is free after the MLP)
            k_add(self.xb2, self.xb, T * dim)
        if w.post_ffn_norm != NULL:
            self.rmsnorm(self.xb2, self.xb2, w.post_ffn_norm, dim, T)
        self.observe_layer(layer, OP_MLP, self.xb2, dim)
        k_add(x, self.xb2, T * dim)
        if self.ple_dim > 0:
            self.per_layer_input(x, w, layer, T)
        if self.layer_scalars:
            k_scale(x, w.layer_scalar, T * dim)
        self.observe_layer(layer, OP_RESID_MLP, x, dim)
        return 0

    cdef inline void per_layer_inputs(self, const int32_t* ids, Py_ssize_t T) noexcept nogil:
        """Gemma 4's per-layer inputs of the block's rows, from their
        embeddings x (T, dim) into ple_in (T, n_layers, ple):
        (RMSNorm_ple(P x * dim^-0.5) + embed_per_layer[token] * ple^0.5) * 2^-0.5,
        the norm over each layer's ple values (reference/layers.py per_layer_inputs)."""
        cdef Py_ssize_t n = self.n_layers * self.ple_dim, t
        self.matmul(self.ple_in, &self.per_layer_model_proj, self.x, T)  # (T, n_layers * ple)
        k_scale(self.ple_in, self.ple_proj_scale, T * n)
        self.rmsnorm(self.ple_in, self.ple_in, self.per_layer_proj_norm, self.ple_dim, T * self.n_layers)
        for t in range(T):
            k_matrix_row(self.ple_row, &self.embed_per_layer, ids[t])  # (n_layers * ple,)
            k_scale(self.ple_row, self.ple_embed_scale, n)
            k_add(self.ple_in + t * n, self.ple_row, n)
        k_scale(self.ple_in, self.ple_sum_scale, T * n)

    cdef inline void per_layer_input(self, float* x, const LayerWeights* w, Py_ssize_t layer,
                                     Py_ssize_t T) noexcept nogil:
        """x (T, dim) += ple_post_norm(ple_proj(act(ple_gate x) * this layer's input)), in place."""
        cdef Py_ssize_t ple = self.ple_dim, n = self.n_layers * ple, t
        self.matmul(self.hb, &w.ple_gate, x, T)  # (T, ple)
        for t in range(T):
            if self.gelu:
                k_gelu_tanh_mul(self.hb + t * ple, self.hb + t * ple, self.ple_in + t * n + layer * ple, ple)
            else:
                k_silu_mul(self.hb + t * ple, self.hb + t * ple, self.ple_in + t * n + layer * ple, ple)
        self.matmul(self.xb2, &w.ple_proj, self.hb, T)  # (T, dim)
        self.rmsnorm(self.xb2, self.xb2, w.ple_post_norm, self.dim, T)
        k_add(x, self.xb2, T * self.dim)

    cdef inline void embed(self, float* out, Py_ssize_t token, Py_ssize_t pos) noexcept nogil:
        """Token row * embed_scale (+ the learned position row): out (dim,).
        Bit for bit the reference's: the same f32 products and sum."""
        k_matrix_row(out, &self.embed_tokens, token)
        if self.embed_scale != 1:
            k_scale(out, self.embed_scale, self.dim)
        if self.position_table:
            k_matrix_row(self.xb2, &self.embed_positions, pos)
            k_add(out, self.xb2, self.dim)

    cdef inline void rmsnorm(self, float* out, const float* x, const float* gain, Py_ssize_t n,
                             Py_ssize_t rows) noexcept nogil:
        """x / sqrt(mean(x^2) + eps) * g, or * (1 + g), of each row: x, out (rows, n), gain (n,)."""
        cdef Py_ssize_t r
        for r in range(rows):
            k_rmsnorm(out + r * n, x + r * n, gain, n, self.norm_eps, self.one_plus)

    cdef inline void rope(self, float* x, Py_ssize_t n_heads, Py_ssize_t hd, Py_ssize_t t,
                          Py_ssize_t table) noexcept nogil:
        """Rotates each head of x (n_heads, hd) in place by the angles of
        position t of the block (table 0: global base, 1: local base)."""
        cdef Py_ssize_t half = self.rope_half
        k_rope_apply(x, self.rope_cos + (2 * t + table) * half, self.rope_sin + (2 * t + table) * half,
                     n_heads, hd, self.rot_dims[table], self.pairing)

    cdef inline void matmul(self, float* out, const QMatrix* w, const float* x, Py_ssize_t T) noexcept nogil:
        """out (T, w.rows) = x (T, w.cols) . w^T; in q8 mode x is quantized to
        int8 per block of 32 first."""
        if self.act_q8:
            k_quantize_q8(self.xq, self.xd, x, T * w.cols // Q8_0_BLOCK)
            k_gemm_q8(out, w, self.xq, self.xd, T, self.gemm_scratch)
        else:
            k_gemm(out, w, x, T, self.gemm_scratch)

    cdef int attention(self, float* out, const float* x, const LayerWeights* w, Py_ssize_t layer,
                       Py_ssize_t T) except -1 nogil:
        """Self-attention of one layer over the block's rows: xn (T, dim) ->
        out (T, dim); row t is position row_pos[t] of slot row_slot[t].

        k and v of the block are computed straight into the cache rows of its
        positions, each in its slot's cache (rotated key, raw value); then
        query head h of a row reads kv head h * nkv // nh of its slot over
        the positions start .. its own of its window (causal: never a later
        position of the block). The query heads of one kv head over a tile of
        up to ATT_TILE consecutive rows of one segment (one slot) go
        together, each row's scores and sums taking the steps one position
        alone takes."""
        cdef Py_ssize_t hd = w.hd, nh = self.n_heads, nkv = w.nkv, kvd = w.kvd
        cdef Py_ssize_t qd = w.qd, t, row, head, seg_end
        cdef LayerCache* kv
        cdef float* k = self.k_block  # (T, nkv, hd)
        cdef float* v = self.v_block  # (T, nkv, hd)
        self.matmul(self.q, &w.q_proj, x, T)  # (T, nh, hd)
        if w.own_kv:
            self.matmul(k, &w.k_proj, x, T)  # (T, nkv, hd)
            if w.v_from_k:  # Gemma 4's global layers: v is k's projection
                memcpy(v, k, T * kvd * sizeof(float))
            else:
                self.matmul(v, &w.v_proj, x, T)  # (T, nkv, hd)
        if w.q_bias != NULL:
            for t in range(T):
                k_add(self.q + t * qd, w.q_bias, qd)
                if w.own_kv:
                    k_add(k + t * kvd, w.k_bias, kvd)
                    k_add(v + t * kvd, w.v_bias, kvd)
        if w.q_norm != NULL:
            self.rmsnorm(self.q, self.q, w.q_norm, hd, T * nh)
        if w.k_norm != NULL:
            self.rmsnorm(k, k, w.k_norm, hd, T * nkv)
        if self.v_norm and w.own_kv:  # no gain
            for t in range(T * nkv):
                k_rmsnorm(v + t * hd, v + t * hd, self.ones, hd, self.norm_eps, False)
        for t in range(T):
            self.rope(self.q + t * qd, nh, hd, t, w.rope_table)
            if w.own_kv:
                self.rope(k + t * kvd, nkv, hd, t, w.rope_table)
        if w.own_kv:
            for t in range(T):  # into the cache rows of the rows' positions, in their slots
                kv = &self.caches[self.row_slot[t] * self.n_layers + layer]
                row = self.row_pos[t] % kv.rows
                for head in range(nkv):
                    memcpy(kv.keys + (head * kv.rows + row) * hd, k + t * kvd + head * hd, hd * sizeof(float))
                    memcpy(kv.values + (head * kv.rows + row) * hd, v + t * kvd + head * hd, hd * sizeof(float))
        elif self.tracing:  # a shared layer observes the keys and values it reads: its source's of the row
            for t in range(T):
                kv = &self.caches[self.row_slot[t] * self.n_layers + layer]
                row = self.row_pos[t] % kv.rows
                for head in range(nkv):
                    memcpy(k + t * kvd + head * hd, kv.keys + (head * kv.rows + row) * hd, hd * sizeof(float))
                    memcpy(v + t * kvd + head * hd, kv.values + (head * kv.rows + row) * hd, hd * sizeof(float))
        self.observe_layer(layer, OP_Q, self.q, qd)
        self.observe_layer(layer, OP_K, k, kvd)
        self.observe_layer(layer, OP_V, v, kvd)

        cdef Py_ssize_t t0 = 0, n_pos, h, g, n_group
        while t0 < T:
            seg_end = t0 + 1  # the segment: rows of one slot at consecutive positions
            while seg_end < T and self.row_slot[seg_end] == self.row_slot[t0] \
                    and self.row_pos[seg_end] == self.row_pos[seg_end - 1] + 1:
                seg_end += 1
            kv = &self.caches[self.row_slot[t0] * self.n_layers + layer]
            while t0 < seg_end:
                n_pos = ATT_TILE if seg_end - t0 > ATT_TILE else seg_end - t0
                h = 0
                while h < nh:
                    g = h * nkv // nh
                    n_group = 1
                    while h + n_group < nh and (h + n_group) * nkv // nh == g:
                        n_group += 1
                    self.attend_tile(w, kv, self.q + t0 * qd + h * hd, self.row_pos[t0], n_pos, n_group, g)
                    for t in range(n_pos):
                        memcpy(self.ao + (t0 + t) * qd + h * hd, self.ao_tile + t * n_group * hd,
                               n_group * hd * sizeof(float))
                    h += n_group
                t0 += n_pos
        self.observe_layer(layer, OP_ATTN_OUT, self.ao, qd)
        self.matmul(out, &w.o_proj, self.ao, T)  # (T, dim)
        return 0

    cdef int attend_tile(self, const LayerWeights* w, const LayerCache* kv, const float* q, Py_ssize_t pos1,
                         Py_ssize_t n_pos, Py_ssize_t n_group, Py_ssize_t g) except -1 nogil:
        """n_group query heads that read kv head g of the cache ``kv`` (one
        slot's layer), of positions pos1 ..
        pos1+n_pos-1: q (n_pos rows qd apart, n_group, hd) -> ao_tile
        (n_pos, n_group, hd).

        Position p sees the cache rows [start_p, p+1), inside the tile's span
        [lo, hi); every row of q_tile gets scores over the whole span (one
        pass over the keys), and keeps its own range. The weighted sums of v
        run in the order of the positions: the rows before c0 (the last
        position's start) per position, [c0, c1) (seen by every position)
        for all rows at once, then the rest per position."""
        cdef Py_ssize_t hd = w.hd, qd = w.qd, cl = self.cache_len
        cdef Py_ssize_t rows = n_pos * n_group, p, r, i, start, end, split
        cdef Py_ssize_t lo = _window_start(pos1, w.window), hi = pos1 + n_pos
        cdef Py_ssize_t c0 = _window_start(hi - 1, w.window)
        cdef Py_ssize_t c1 = pos1 + 1 if pos1 + 1 > c0 else c0
        cdef float* att = &self.att[0]  # (rows, cache_len): row r's score of position lo + i at i
        cdef float* score
        for p in range(n_pos):
            memcpy(self.q_tile + p * n_group * hd, q + p * qd, n_group * hd * sizeof(float))
        self.scores_of(att, cl, rows, kv, hd, g, lo, hi)
        for p in range(n_pos):
            start = _window_start(pos1 + p, w.window)
            for r in range(p * n_group, (p + 1) * n_group):
                score = att + r * cl + (start - lo)
                k_scale(score, self.scores_scale, pos1 + p + 1 - start)
                if self.attn_softcap > 0:
                    k_softcap(score, pos1 + p + 1 - start, self.attn_softcap)
                k_softmax(score, pos1 + p + 1 - start)
        memset(self.ao_tile, 0, rows * hd * sizeof(float))
        for p in range(n_pos):  # [start, min(end, c0))
            start = _window_start(pos1 + p, w.window)
            end = pos1 + p + 1
            split = end if end < c0 else c0
            if split > start:
                self.weighted_values(self.ao_tile + p * n_group * hd, att + p * n_group * cl + (start - lo), cl,
                                     n_group, kv, hd, g, start, split)
        if c1 > c0:
            self.weighted_values(self.ao_tile, att + (c0 - lo), cl, rows, kv, hd, g, c0, c1)
        for p in range(n_pos):  # [max(min(end, c0), c1), end)
            end = pos1 + p + 1
            split = end if end < c0 else c0
            split = split if split > c1 else c1
            if end > split:
                self.weighted_values(self.ao_tile + p * n_group * hd, att + p * n_group * cl + (split - lo), cl,
                                     n_group, kv, hd, g, split, end)
        return 0

    cdef inline void scores_of(self, float* att, Py_ssize_t att_stride, Py_ssize_t rows, const LayerCache* kv,
                               Py_ssize_t hd, Py_ssize_t g, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
        """att[r, i] = q_tile row r . key of kv head g at position lo + i, for
        lo <= lo + i < hi: one k_scores per run of consecutive cache rows (a
        span wraps a ring at most once; each score's bits are the same)."""
        cdef Py_ssize_t pos = lo, row, n
        while pos < hi:
            row = pos % kv.rows
            n = min(hi - pos, kv.rows - row)
            k_scores(att + (pos - lo), att_stride, self.q_tile, hd, rows,
                     kv.keys + (g * kv.rows + row) * hd, hd, n, hd)
            pos += n

    cdef inline void weighted_values(self, float* y, const float* probs, Py_ssize_t probs_stride, Py_ssize_t m,
                                     const LayerCache* kv, Py_ssize_t hd, Py_ssize_t g, Py_ssize_t a,
                                     Py_ssize_t b) noexcept nogil:
        """y (m, hd) += probs (m, b - a) . the values of kv head g at positions
        a .. b-1, in the order of the positions: one k_weighted_rows per run
        of consecutive cache rows (a sum split over calls has the bits of one)."""
        cdef Py_ssize_t pos = a, row, n
        while pos < b:
            row = pos % kv.rows
            n = min(b - pos, kv.rows - row)
            k_weighted_rows(y, hd, probs + (pos - a), probs_stride, m,
                            kv.values + (g * kv.rows + row) * hd, hd, n, hd)
            pos += n

    cdef inline void mlp(self, float* out, const float* x, const LayerWeights* w, Py_ssize_t T) noexcept nogil:
        """Gated MLP: down(act(gate x) * (up x)); xn (T, dim) -> out (T, dim)."""
        self.matmul(self.hb, &w.gate_proj, x, T)  # (T, mlp)
        self.matmul(self.hb2, &w.up_proj, x, T)  # (T, mlp)
        if self.gelu:
            k_gelu_tanh_mul(self.hb, self.hb, self.hb2, T * w.gate_proj.rows)
        else:
            k_silu_mul(self.hb, self.hb, self.hb2, T * w.gate_proj.rows)
        self.matmul(out, &w.down_proj, self.hb, T)  # (T, dim)

    cdef void experts(self, float* out, const float* x, const LayerWeights* w) noexcept nogil:
        """Gemma 4's expert block on one row's residual x (dim,) -> out (dim,)
        (reference/layers.py experts): the router's softmax over
        router_proj (rmsnorm(x), no gain, * router_scale * dim^-0.5), an f32
        product in both modes; the n_experts_used most probable (lower index
        first on a tie), weights renormalized to sum 1 (summed in f32) times
        expert_scales; each chosen expert, in expert order, on
        rmsnorm(x, moe_pre_norm_2): out += down_e(act(gate) * up of gate_up_e) * weight;
        out = rmsnorm(out, moe_post_norm_2). Only the chosen experts' matrices are read."""
        cdef Py_ssize_t dim = self.dim, n = self.n_experts, emlp = self.expert_mlp_dim, i, k, e, best
        cdef float total = 0
        k_rmsnorm(self.moe_h, x, self.ones, dim, self.norm_eps, False)
        for i in range(dim):
            self.moe_h[i] = self.moe_h[i] * w.router_scale[i] * self.router_dim_scale
        k_gemm(self.moe_probs, &w.router_proj, self.moe_h, 1, self.gemm_scratch)  # (n_experts,) f32 always
        k_softmax(self.moe_probs, n)
        memset(self.moe_taken, 0, n)
        for k in range(self.n_experts_used):  # highest first, the lower index on a tie (a stable argsort)
            best = -1
            for e in range(n):
                if not self.moe_taken[e] and (best < 0 or self.moe_probs[e] > self.moe_probs[best]):
                    best = e
            self.moe_taken[best] = 1
            total = total + self.moe_probs[best]
        for e in range(n):
            if self.moe_taken[e]:
                self.moe_weight[e] = self.moe_probs[e] / total * w.expert_scales[e]
        k_rmsnorm(self.moe_xn, x, w.moe_pre_norm_2, dim, self.norm_eps, self.one_plus)
        memset(self.moe_sum, 0, dim * sizeof(float))
        for e in range(n):  # in expert order, as the reference adds them
            if not self.moe_taken[e]:
                continue
            self.matmul(self.moe_gu, &w.experts[2 * e], self.moe_xn, 1)  # (2 emlp,)
            if self.gelu:
                k_gelu_tanh_mul(self.moe_gu, self.moe_gu, self.moe_gu + emlp, emlp)
            else:
                k_silu_mul(self.moe_gu, self.moe_gu, self.moe_gu + emlp, emlp)
            self.matmul(self.moe_tmp, &w.experts[2 * e + 1], self.moe_gu, 1)  # (dim,)
            k_scale(self.moe_tmp, self.moe_weight[e], dim)
            k_add(self.moe_sum, self.moe_tmp, dim)
        k_rmsnorm(out, self.moe_sum, w.moe_post_norm_2, dim, self.norm_eps, self.one_plus)

    cdef inline void final_norm(self, float* out, const float* x) noexcept nogil:
        """RMSNorm with the final gain: (dim,) -> out (dim,)."""
        self.rmsnorm(out, x, self.final_gain, self.dim, 1)

    cdef inline void logits(self, float* out, const float* x, Py_ssize_t T) noexcept nogil:
        """lm_head . x, soft-capped when final_softcap > 0: (T, dim) -> out (T, vocab)."""
        cdef Py_ssize_t t
        self.matmul(out, &self.lm_head, x, T)
        if self.final_softcap > 0:
            for t in range(T):
                k_softcap(out + t * self.vocab_size, self.vocab_size, self.final_softcap)

    # -----------------------------------------------------------------------
    # Trace

    cdef inline int observe(self, Py_ssize_t at, const float* value, Py_ssize_t n) except -1 nogil:
        """Copy value (n,) to the trace at offset ``at`` when tracing."""
        if self.tracing:
            memcpy(&self.trace_buf[at], value, n * sizeof(float))
        return 0

    cdef inline int observe_layer(self, Py_ssize_t layer, LayerOp op, const float* value,
                                  Py_ssize_t n) except -1 nogil:
        return self.observe(self.trace_at[layer * N_LAYER_OPS + <int> op], value, n)



def gemm(tensor, x, str activations="f32", bint resident=False):
    """out (T, rows) = x (T, cols) . w^T for a weight matrix ``tensor``
    (Int8Tensor, Q8_0Tensor, AffineTensor, Q4_KTensor, Q4_1Tensor, Q5_0Tensor or a 2-D F32Tensor) the way the
    forward pass
    computes a block of
    T positions (k_gemm, or k_quantize_q8 + k_gemm_q8 when activations is
    "q8"); ``resident`` picks the in-cache variant. For tests and tools."""
    keep = []
    _array(x, "x", np.float32, (2,))
    cdef QMatrix m = _qmatrix(tensor, keep, resident, _convert_scratch([tensor], x.shape[0]), x.shape[0])
    if x.shape[1] != m.cols:
        raise ValueError(f"gemm: x has {x.shape[1]} columns, the matrix {m.cols}")
    if activations not in ACTIVATION_MODES:
        raise ValueError(f"activations = {activations!r}, expected one of {ACTIVATION_MODES}")
    if activations == "q8" and m.layout == QLAYOUT_F32:
        raise ValueError("gemm: q8 activations run integer matrices, not f32 ones")
    if activations == "q8" and m.cols % Q8_0_BLOCK:
        raise ValueError(f"gemm: q8 activations need cols % {Q8_0_BLOCK} == 0, got {m.cols}")
    out = np.empty((x.shape[0], m.rows), np.float32)
    cdef const float[:, ::1] xv = x
    cdef float[:, ::1] ov = out
    cdef Py_ssize_t T = x.shape[0], nb = m.cols // Q8_0_BLOCK
    xq = np.empty(max(1, T * m.cols), np.int8)
    xd = np.empty(max(1, T * nb), np.float32)
    scratch = _zeros(max(1, k_gemm_scratch_floats(m.cols, T)))  # (64-byte aligned, as the engine's)
    cdef int8_t[::1] xqv = xq
    cdef float[::1] xdv = xd
    cdef float[::1] sv = scratch
    cdef bint q8 = activations == "q8"  # (a str compare must not run without the GIL)
    if T == 0 or m.rows == 0:
        return out
    if m.cols == 0:
        out[:] = 0
        return out
    with nogil:
        if q8:
            k_quantize_q8(&xqv[0], &xdv[0], &xv[0, 0], T * nb)
            k_gemm_q8(&ov[0, 0], &m, &xqv[0], &xdv[0], T, &sv[0])
        else:
            k_gemm(&ov[0, 0], &m, &xv[0, 0], T, &sv[0])
    return out


def matrix_row(tensor, Py_ssize_t row):
    """Row ``row`` of a weight matrix ``tensor`` (as for gemm) as f32, the way
    the forward pass looks up an embedding (k_matrix_row). For tests and tools."""
    keep = []
    cdef QMatrix m = _qmatrix(tensor, keep, False, _convert_scratch([tensor], 1), 1)
    if not 0 <= row < m.rows:
        raise IndexError(f"matrix_row: row {row} outside [0, {m.rows})")
    out = np.empty(m.cols, np.float32)
    cdef float[::1] ov = out
    if m.cols:
        with nogil:
            k_matrix_row(&ov[0], &m, row)
    return out
