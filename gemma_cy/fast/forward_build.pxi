# The construction of a FastModel (forward.pxi): FastModelMemory holds
# everything the step reads (llama2.c's TransformerWeights + RunState): the
# config's sizes and switches, the weights (wired in forward_weights.pxi),
# the scratch buffers of a block, each slot's KV cache and the trace, all
# laid out once in __init__; and the bookkeeping of the slots' caches (what
# each holds, whether a run can resume, copying a prefix). FastModel, its one
# subclass, adds the step.

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t
from libc.string cimport memcpy
import mmap

from gemma_cy.model.checks import check_activation_mode
from gemma_cy.model.observe import op_shape
from gemma_cy.fast.buffers import aligned_zeros


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

LAYER_TRACE_OPS = ("attn_norm", "q", "k", "v", "attn_out", "attn", "resid_attn",
                   "ffn_norm", "mlp", "resid_mlp")

# run_batch's want_logits: 1 the segment's last position's logits, 2 every position's.
cdef enum:
    WANT_ALL = 2

# Rows a sliding-window layer's ring keeps beyond its window: at least BLOCK
# (a block writes its rows before its first position reads the window
# behind it); the rest is how far back a run may start again (a chat turn
# reusing its prefix), docs/architecture.md#kv-cache.
cdef enum:
    RING_SLACK = 4 * BLOCK

# A layer that reads another's cache (config.kv_source: Gemma 4's shared
# layers) has that layer's LayerCache: the same memory, no cache of its own.
cdef struct LayerCache:
    float* keys  # (nkv, rows, hd): kv head h's rotated key of position p at [h, p % rows]
    float* values  # (nkv, rows, hd): its raw value
    Py_ssize_t rows  # cache_len; for a sliding-window layer at most window + RING_SLACK (a ring)
    Py_ssize_t window  # the layer's window (0: every position)


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


cdef inline Py_ssize_t _window_start(Py_ssize_t pos, Py_ssize_t window) noexcept nogil:
    """The first position that position pos attends to (window 0: all of them)."""
    return pos - window + 1 if window > 0 and pos - window + 1 > 0 else 0


cdef class FastModelMemory:
    """What a FastModel holds, laid out once, and its slots' bookkeeping;
    FastModel, its one subclass, adds the step (forward.pxi).

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
    cdef readonly Py_ssize_t panel_bytes  # of the Q8_0 matrices the q8 mode holds as panels (fast/panels.py)
    cdef Py_ssize_t* written_ends  # (n_slots,) 1 + the last position written since the slot's cache was emptied
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
        self.written_ends = NULL
        self.trace_at = NULL
        self.states_out = NULL
        self.expert_table = NULL

    def __dealloc__(self):
        PyMem_Free(self.layers)
        PyMem_Free(self.expert_table)
        PyMem_Free(self.caches)
        PyMem_Free(self.written_ends)
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

        _wire_weights(self, weights)  # forward_weights.pxi
        ple = c.per_layer_input_dim
        cdef Py_ssize_t n_exp = c.n_experts

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
        self.written_ends = <Py_ssize_t*> PyMem_Malloc(self.n_slots * sizeof(Py_ssize_t))
        if self.caches == NULL or self.written_ends == NULL:
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
            self.written_ends[slot] = 0
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
        return self.written_ends[slot]

    @property
    def high(self):
        """slot_high(0)."""
        return self.written_ends[0]

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
        cdef Py_ssize_t written_end = self.written_ends[slot]
        if not 0 <= pos < written_end or pos < written_end - kv.rows:
            return None
        return pos % kv.rows

    def resumable(self, Py_ssize_t pos, Py_ssize_t slot=0):
        """True when a run of ``slot`` can start at ``pos`` (0 <= pos <=
        slot_high(slot)): every layer still holds the positions before
        ``pos`` that it attends to. A ring keeps its last rows positions;
        once a run has gone further than that past ``pos``, ``pos`` can only
        be reached again from 0."""
        self._check_slot(slot)
        cdef Py_ssize_t layer, first, written_end = self.written_ends[slot]
        cdef const LayerCache* kv = &self.caches[slot * self.n_layers]
        if pos == 0:
            return True
        if not 0 < pos <= written_end:
            return False
        for layer in range(self.n_layers):
            first = _window_start(pos, kv[layer].window)
            if first < written_end - kv[layer].rows:
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

    cdef Py_ssize_t _lay_out_rows(self, ids, seg_slots, seg_pos, seg_lens, want_logits) except -1:
        """run_batch's checks of its segments (IndexError, ValueError: the
        step never sees a bad index) and the block's rows they make:
        row_slot, row_pos, and the rows whose logits are wanted (out_row,
        n_out). A segment from position 0 empties its slot's cache first.
        Returns the number of rows."""
        cdef const int32_t[::1] tv, sv, pv, lv, wv
        for name, a in (("ids", ids), ("seg_slots", seg_slots), ("seg_pos", seg_pos), ("seg_lens", seg_lens),
                        ("want_logits", want_logits)):
            _array(a, name, np.int32, (1,))
        tv, sv, pv, lv, wv = ids, seg_slots, seg_pos, seg_lens, want_logits
        cdef Py_ssize_t S = sv.shape[0], T = tv.shape[0], i, j, t = 0, slot
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
                self.written_ends[slot] = 0
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
        return T

    def copy_slot(self, Py_ssize_t src, Py_ssize_t dst, Py_ssize_t n_pos):
        """Slot ``dst`` takes slot ``src``'s keys and values of positions 0 ..
        n_pos-1 (bit for bit: a copy) and forgets the rest: sequences that
        share a prompt run it once. ``src`` must still hold what position
        n_pos needs (``resumable(n_pos, src)``)."""
        self._check_slot(src)
        self._check_slot(dst)
        if src == dst:
            raise ValueError("copy_slot: src and dst are the same slot")
        if not 0 < n_pos <= self.written_ends[src] or not self.resumable(n_pos, src):
            raise IndexError(f"copy_slot: slot {src} does not hold positions 0 .. {n_pos - 1} "
                             f"(it has run to {self.written_ends[src]})")
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
        self.written_ends[dst] = n_pos

    def row_status(self, Py_ssize_t n):
        """Per row of the last block (n rows): -2 (finite), or where it went
        non-finite (-1 the embedding, a layer, n_layers the logits)."""
        if not 0 <= n <= BLOCK:
            raise ValueError(f"row_status: n = {n} outside [0, {BLOCK}]")
        return np.array([self.bad_at[i] for i in range(n)], dtype=np.int32)

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
