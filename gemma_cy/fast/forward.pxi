# The forward pass: the layers of reference/layers.py (embed, attention, mlp,
# block, final_norm, logits; rmsnorm and rope of reference/ops.py; Gemma 4's
# per_layer_inputs, per_layer_input and experts of reference/gemma4.py), with
# the same names, as nogil methods of FastModel over this module's kernels,
# read top to bottom from run_rows (the whole pass) down. FastModel.run runs one or more positions
# through every layer in one call with the GIL released, with no allocation
# and no Python inside. What the step reads is laid out once, elsewhere:
# which tensor feeds which product in forward_weights.pxi (LayerWeights), the
# weights' pointers, scratch buffers and KV cache, with their shapes, in
# forward_build.pxi (FastModelMemory, FastModel's base: llama2.c's
# TransformerWeights + RunState, and their construction).
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
# each ISA module has the whole step with its own kernels inlined; it
# includes the other two files. The engine around it (index checks, observer
# calls, errors) is gemma_cy/fast/engine.py.
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
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset


# Positions per block of the forward pass (scratch is (BLOCK, width)).
cdef enum:
    BLOCK = 64
BLOCK_ROWS = BLOCK  # rows (positions, of one or several slots) per pass of the forward pass
# Positions of a block whose queries share each pass over the keys and values
# in attention: the window's rows come from L2/L3 once per tile, not per position.
cdef enum:
    ATT_TILE = 4
# FastModel.first_bad: where a step's activations first went non-finite
# (-1 the embedding, 0..n_layers-1 a layer's residual, n_layers the logits).
cdef enum:
    ALL_FINITE = -2

include "forward_weights.pxi"
include "forward_build.pxi"


@cython.final
cdef class FastModel(FastModelMemory):
    """The whole forward pass of one model in Cython, over this module's
    kernels: FastModelMemory (its constructor, what it holds and shows, the
    slots' bookkeeping) with the step that runs positions through it.
    gemma_cy.fast.engine.FastEngine and gemma_cy.fast.batch.BatchEngine are
    the engines built on this."""

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
        cdef Py_ssize_t T = self._lay_out_rows(ids, seg_slots, seg_pos, seg_lens, want_logits), i, done
        cdef const int32_t[::1] tv = ids, sv = seg_slots, pv = seg_pos, lv = seg_lens
        with nogil:
            done = self.run_rows(&tv[0], T)
        for i in range(sv.shape[0]):  # each segment wrote its rows, however the block ended
            if pv[i] + lv[i] > self.written_ends[sv[i]]:
                self.written_ends[sv[i]] = pv[i] + lv[i]
        return done

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
            self.written_ends[0] = 0
        while lo < n:
            size = min(<Py_ssize_t> BLOCK, n - lo)
            t = self.run_block(ids + lo, size, pos0 + lo, want_logits and lo + size == n)
            if pos0 + lo + size > self.written_ends[0]:  # the block wrote its rows, however it ended
                self.written_ends[0] = pos0 + lo + size
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
        the norm over each layer's ple values (reference/gemma4.py per_layer_inputs)."""
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

    cdef int attend_tile(self, const LayerWeights* w, const LayerCache* kv, const float* q, Py_ssize_t pos0,
                         Py_ssize_t n_pos, Py_ssize_t n_group, Py_ssize_t g) except -1 nogil:
        """n_group query heads that read kv head g of the cache ``kv`` (one
        slot's layer), of positions pos0 ..
        pos0+n_pos-1: q (n_pos rows qd apart, n_group, hd) -> ao_tile
        (n_pos, n_group, hd).

        Position p sees the cache rows [start_p, p+1), inside the tile's span
        [lo, hi); every row of q_tile gets scores over the whole span (one
        pass over the keys), and keeps its own range. The weighted sums of v
        run in the order of the positions: the rows before c0 (the last
        position's start) per position, [c0, c1) (seen by every position)
        for all rows at once, then the rest per position."""
        cdef Py_ssize_t hd = w.hd, qd = w.qd, cl = self.cache_len
        cdef Py_ssize_t rows = n_pos * n_group, p, r, i, start, end, split
        cdef Py_ssize_t lo = _window_start(pos0, w.window), hi = pos0 + n_pos
        cdef Py_ssize_t c0 = _window_start(hi - 1, w.window)
        cdef Py_ssize_t c1 = pos0 + 1 if pos0 + 1 > c0 else c0
        cdef float* att = &self.att[0]  # (rows, cache_len): row r's score of position lo + i at i
        cdef float* score
        for p in range(n_pos):
            memcpy(self.q_tile + p * n_group * hd, q + p * qd, n_group * hd * sizeof(float))
        self.scores_of(att, cl, rows, kv, hd, g, lo, hi)
        for p in range(n_pos):
            start = _window_start(pos0 + p, w.window)
            for r in range(p * n_group, (p + 1) * n_group):
                score = att + r * cl + (start - lo)
                k_scale(score, self.scores_scale, pos0 + p + 1 - start)
                if self.attn_softcap > 0:
                    k_softcap(score, pos0 + p + 1 - start, self.attn_softcap)
                k_softmax(score, pos0 + p + 1 - start)
        memset(self.ao_tile, 0, rows * hd * sizeof(float))
        for p in range(n_pos):  # [start, min(end, c0))
            start = _window_start(pos0 + p, w.window)
            end = pos0 + p + 1
            split = end if end < c0 else c0
            if split > start:
                self.weighted_values(self.ao_tile + p * n_group * hd, att + p * n_group * cl + (start - lo), cl,
                                     n_group, kv, hd, g, start, split)
        if c1 > c0:
            self.weighted_values(self.ao_tile, att + (c0 - lo), cl, rows, kv, hd, g, c0, c1)
        for p in range(n_pos):  # [max(min(end, c0), c1), end)
            end = pos0 + p + 1
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
        (reference/gemma4.py experts): the router's softmax over
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
