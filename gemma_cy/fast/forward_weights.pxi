# The weight wiring of the forward pass (forward.pxi): which tensor of a
# gemma_cy.model.weights.Weights feeds which matrix product, as a QMatrix
# (kernels/api.pxi: a pointer into the mapped file or the load-time arena,
# no copy) or a norm gain (dequantized once to f32, exactly the reference's
# values). LayerWeights is one layer's, the struct the step reads;
# _wire_weights fills a FastModelMemory's (forward_build.pxi). gemm and
# matrix_row run one matrix the way the step does, for tests and tools.

from libc.string cimport memset
from cpython.mem cimport PyMem_Malloc

from gemma_cy.errors import ModelFormatError
from gemma_cy.model.checks import ACTIVATION_MODES
from gemma_cy.fast.arena import lay_out_for_decode, read_only_map, release_file_maps, release_range
from gemma_cy.fast.panels import (ALIGN_BYTES, Q8Panels, affine_block_bytes, can_pack, new_arena, panel_bytes,
                                  panel_shape, panels_of)
from gemma_cy.fast.buffers import aligned_zeros
from gemma_cy.model.weights import LAYER_MATRICES
from gemma_cy.quant.tensors import F32Tensor, Int8Tensor, Q8_0Tensor
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor


# A model whose matrices take at most this many bytes in all is taken to stay
# in the last-level cache between steps (Zen 3: 32 MB of L3, shared by the
# cores), so its int8 GEMVs use k_gemv_i8_resident. The tiny model: 2.2 MB;
# the 270M-sized ones: ~260 MB.
cdef enum:
    RESIDENT_MODEL_BYTES = 8 << 20


# One transformer layer's weights (reference/weights.py LayerWeights). Sizes:
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


cdef int _wire_weights(FastModelMemory model, object weights) except -1:
    """Points ``model``'s matrices and gains (FastModelMemory's weights, each
    layer's LayerWeights) at the tensors of ``weights``, the matrices a
    decode step streams laid out in its order (gemma_cy/fast/arena.py);
    model.act_q8 is set. The name of each tensor a product reads is here."""
    c = weights.config
    keep = model._keep  # every array a pointer points into
    tensors = weights.tensors
    head = "embed_tokens" if c.tied_embeddings else "lm_head"
    if model.act_q8 and k_q8_stores_panels():
        # every integer matrix of 16 k rows as panels (fast/panels.py)
        tensors = _pack_panels(tensors, ["embed_tokens", head] + [
            f"layers.{layer}.{name}" for layer in range(c.n_layers) for name in LAYER_MATRICES], keep)
        model.panel_bytes = sum(t.panels.nbytes for t in tensors.values() if isinstance(t, Q8Panels))
    if model.act_q8:
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
    ple = c.per_layer_input_dim
    per_layer = LAYER_MATRICES + (("ple_gate", "ple_proj") if ple else ())
    packed, arena = lay_out_for_decode(tensors, (["per_layer_model_proj"] if ple else []) + [
        f"layers.{layer}.{name}" for layer in range(c.n_layers) for name in per_layer
        if f"layers.{layer}.{name}" in tensors] + [head])  # (a shared layer has no k_proj, v_proj)
    keep.append(arena)
    matrix = lambda name: packed[name] if name in packed else tensors[name]
    scratch = _convert_scratch(tensors.values(), BLOCK)
    model.embed_tokens = _qmatrix(matrix("embed_tokens"), keep, resident, scratch, BLOCK)
    if c.position_table:
        model.embed_positions = _qmatrix(matrix("embed_positions"), keep, resident, scratch, BLOCK)
    model.lm_head = model.embed_tokens if c.tied_embeddings else _qmatrix(matrix("lm_head"), keep, resident,
                                                                          scratch, BLOCK)
    model.final_gain = _gain(weights["final_norm"], keep)
    if ple:
        model.embed_per_layer = _qmatrix(matrix("embed_per_layer"), keep, resident, scratch, BLOCK)
        model.per_layer_model_proj = _qmatrix(matrix("per_layer_model_proj"), keep, resident, scratch, BLOCK)
        model.per_layer_proj_norm = _gain(weights["per_layer_proj_norm"], keep)
        # the reference's f32 factors (reference/gemma4.py per_layer_inputs)
        model.ple_proj_scale, model.ple_embed_scale, model.ple_sum_scale = c.dim ** -0.5, ple ** 0.5, 2.0 ** -0.5
    model.layers = <LayerWeights*> PyMem_Malloc(c.n_layers * sizeof(LayerWeights))
    if model.layers == NULL:
        raise MemoryError("FastModel: no memory for the layer table")
    cdef Py_ssize_t n_exp = c.n_experts, e, base
    if n_exp:
        model.expert_table = <QMatrix*> PyMem_Malloc(c.n_layers * n_exp * 2 * sizeof(QMatrix))
        if model.expert_table == NULL:
            raise MemoryError("FastModel: no memory for the expert table")
    cdef LayerWeights* w
    for layer in range(c.n_layers):
        w = &model.layers[layer]
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
                model.expert_table[base + 2 * e] = _qmatrix(
                    matrix(p + f"expert{e}_gate_up"), keep, resident, scratch, BLOCK)
                model.expert_table[base + 2 * e + 1] = _qmatrix(
                    matrix(p + f"expert{e}_down"), keep, resident, scratch, BLOCK)
            w.experts = model.expert_table + base
        else:
            w.router_proj = _no_matrix()
            w.router_scale = w.expert_scales = NULL
            w.moe_post_norm_1 = w.moe_pre_norm_2 = w.moe_post_norm_2 = NULL
            w.experts = NULL
        release_file_maps(weights.keepalive)  # what reading its gains mapped (gemma_cy/fast/arena.py)
    return 0


PACK_CHUNK_ROWS = 4096  # rows packed, then their file pages released, at a time


cdef dict _pack_panels(dict tensors, list names, list keep):
    """``tensors`` with each matrix among ``names`` that can be packed
    (panels.can_pack) as its Q8Panels, all in one arena of 2 MiB pages (kept
    in ``keep``); each source's pages in a read-only file map released as
    it is packed (gemma_cy/fast/panels.py). Unchanged when the arena cannot
    be had."""
    names = [n for n in dict.fromkeys(names) if n in tensors and can_pack(tensors[n])]
    starts, size = [], 0
    for n in names:
        starts.append(size)
        size += -(-panel_bytes(tensors[n]) // ALIGN_BYTES) * ALIGN_BYTES
    made = new_arena(size) if names else None
    if made is None:
        return tensors
    arena, memory = made
    keep.append(arena)
    out = dict(tensors)
    cdef QMatrix m
    cdef uint8_t* dst
    cdef Py_ssize_t r0, r1
    for n, start in zip(names, starts):
        t = tensors[n]
        stored = t.records if isinstance(t, AffineTensor) else t.blocks
        rows = stored.shape[0]
        panels = memory[start:start + panel_bytes(t)].reshape(panel_shape(t))
        m = _qmatrix(t, [], False, _convert_scratch([t], 1), 1)
        dst = <uint8_t*> <size_t> panels.ctypes.data
        source = read_only_map(stored) if stored.flags.c_contiguous else None
        for r0 in range(0, rows, PACK_CHUNK_ROWS):
            r1 = min(r0 + PACK_CHUNK_ROWS, rows)
            with nogil:
                k_pack_q8_panels(dst, &m, r0, r1)
            if source is not None:
                chunk = stored[r0:r1]
                release_range(source, chunk.ctypes.data, chunk.ctypes.data + chunk.nbytes)
        panels.flags.writeable = False
        out[n] = panels_of(t, panels)
    return out


cdef Py_ssize_t _matrix_bytes(object tensor):
    """Bytes of a weight matrix's values as stored (0 for a vector)."""
    if isinstance(tensor, Q8Panels):
        return tensor.panels.nbytes
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
    elif isinstance(tensor, Q8Panels):
        blocks = _array(tensor.panels, "panels", np.uint8, (3,))
        if tensor.sub:
            if tensor.sub not in (16, 32) or tensor.levels4 or tensor.levels5:
                raise ValueError(f"affine panels of records of {tensor.sub}: expected 16 or 32, 8-bit levels")
            need = affine_block_bytes(tensor.sub, tensor.has_offset)
        elif tensor.levels5:
            if tensor.levels4:
                raise ValueError("panels of 4-bit and of 5-bit levels at once")
            need = Q5_PANEL_BLOCK_BYTES
        else:
            need = Q4_PANEL_BLOCK_BYTES if tensor.levels4 else Q8_PANEL_BLOCK_BYTES
        if blocks.shape[2] != need or (<size_t> &blocks[0, 0, 0]) % 64:
            raise ValueError(f"panels of shape {tensor.panels.shape}: expected (rows / 16, n, {need}), "
                             f"64-byte aligned")
        if not k_q8_stores_panels():
            raise ValueError("Q8_0 panels: this module's kernels do not read them (k_q8_stores_panels)")
        keep.append(tensor.panels)
        m.blocks = &blocks[0, 0, 0]
        m.rows = blocks.shape[0] * Q8_PANEL_ROWS
        m.cols = blocks.shape[1] * Q8_0_BLOCK
        m.layout = QLAYOUT_Q8_PANELS
        if tensor.levels4:  # Q4_K's or Q4_1's: records of 32 with an offset
            m.layout = QLAYOUT_Q4_PANELS
            m.sub = 32
            m.has_offset = True
        elif tensor.levels5:  # Q5_0's
            m.layout = QLAYOUT_Q5_PANELS
        elif tensor.sub:  # affine records' levels, a (and b)
            m.layout = QLAYOUT_AFFINE_PANELS
            m.sub = tensor.sub
            m.has_offset = tensor.has_offset
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


cdef const float* _gain(object tensor, list keep) except? NULL:
    """A norm gain (Int8Tensor or F32Tensor) dequantized once to an owned f32
    array (exactly the reference's values); NULL for an absent (None) gain."""
    if tensor is None:
        return NULL
    return _f32(np.array(tensor.dequantize(), dtype=np.float32, order="C", copy=True), keep)


def gemm(tensor, x, str activations="f32", bint resident=False):
    """out (T, rows) = x (T, cols) . w^T for a weight matrix ``tensor``
    (Int8Tensor, Q8_0Tensor, AffineTensor, Q4_KTensor, Q4_1Tensor, Q5_0Tensor, a 2-D F32Tensor, or Q8Panels
    with q8 activations) the way the forward pass
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
    if activations != "q8" and _stored_panels(&m):
        raise ValueError("gemm: Q8_0 panels run with q8 activations only")
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


def q8_panels(tensor):
    """``tensor`` (a Q8_0Tensor, Q5_0Tensor, Q4_KTensor, Q4_1Tensor or
    AffineTensor of a multiple of 16 rows) as Q8Panels, packed by this
    module's k_pack_q8_panels, as the q8 mode's load packs it;
    ValueError where the module's kernels read no panels. For tests and tools."""
    if not k_q8_stores_panels():
        raise ValueError("q8_panels: this module's kernels do not read panels")
    if not can_pack(tensor):
        raise ValueError("q8_panels: needs a Q8_0, Q5_0, Q4_K, Q4_1 or affine matrix of a multiple of 16 rows")
    return _pack_panels({"w": tensor}, ["w"], [])["w"]


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
