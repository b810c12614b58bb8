"""The layers of the reference model: one small pure NumPy function each.

Read top to bottom, this is the model (docs/model.md#the-seed-model-gmw1 for the seed, docs/model.md#gemma-3 for Gemma 3):

    x = embed(token, pos)                                       # (dim,)
    for each layer l:
        x = x + [post_attn_norm] attention(attn_norm(x), pos, cache)
        x = x + [post_ffn_norm]  mlp(ffn_norm(x))
    logits = logits(final_norm(x))                              # (vocab,)

Everything is f32, computed from weights dequantized once (docs/numerics.md#the-reference); the
only f64 is the RoPE angle table (see ``rope_cos_sin``). In the opt-in "q8"
mode the matrices are ``Q8Matrix`` instead: ``w @ x`` quantizes x to int8
per block of 32 first, as the fast path's q8 mode does, bit for bit (its f32
FMAs built exactly from f64 operations, ``fma_f32``). The Cython fast path
mirrors these functions one to one: same names, same signatures.

Abbreviations used in the shape comments:
    dim     hidden size (residual stream)        hd   head_dim
    nh      query heads                          nkv  key/value heads
    qd      nh * hd                              kvd  nkv * hd
    mlp     MLP hidden width                     T    positions attended to
    vocab   vocabulary size
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemma_cy.model.checks import check_activation_mode
from gemma_cy.model.config import ModelConfig
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor
from gemma_cy.quant.tensors import Q8_0_BLOCK, Int8Tensor, Q8_0Tensor, quantize_activations_q8
from gemma_cy.model.observe import Observer  # observer(layer, op, pos, value): the calls are listed there
from gemma_cy.model.weights import Weights

GELU_TANH_C = np.float32(np.sqrt(2.0 / np.pi))  # sqrt(2/pi) of the tanh approximation
GELU_TANH_A = np.float32(0.044715)


# ---------------------------------------------------------------------------
# Weights, dequantized once


@dataclass(frozen=True)
class LayerWeights:
    """One transformer layer's tensors as f32 (see gemma_cy.model.weights); in the
    q8 mode the seven matrices are Q8Matrix."""

    q_proj: np.ndarray  # (qd, dim)
    k_proj: np.ndarray  # (kvd, dim)
    v_proj: np.ndarray  # (kvd, dim)
    o_proj: np.ndarray  # (dim, qd)
    gate_proj: np.ndarray  # (mlp, dim)
    up_proj: np.ndarray  # (mlp, dim)
    down_proj: np.ndarray  # (dim, mlp)
    attn_norm: np.ndarray  # (dim,)
    ffn_norm: np.ndarray  # (dim,)
    q_norm: np.ndarray | None  # (hd,) when config.qk_norm
    k_norm: np.ndarray | None  # (hd,) when config.qk_norm
    post_attn_norm: np.ndarray | None  # (dim,) when config.post_norms
    post_ffn_norm: np.ndarray | None  # (dim,) when config.post_norms
    q_bias: np.ndarray | None = None  # (qd,) when config.qkv_bias
    k_bias: np.ndarray | None = None  # (kvd,) when config.qkv_bias
    v_bias: np.ndarray | None = None  # (kvd,) when config.qkv_bias
    rope_freqs: np.ndarray | None = None  # (rotary_dims/2,) when config.rope_freqs applies to this layer
    ple_gate: np.ndarray | None = None  # (ple, dim) when config.per_layer_input_dim (Gemma 4)
    ple_proj: np.ndarray | None = None  # (dim, ple)
    ple_post_norm: np.ndarray | None = None  # (dim,)
    layer_scalar: np.ndarray | None = None  # (1,) when config.layer_scalars
    moe: dict | None = None  # Gemma 4's expert block: router_proj, router_scale, expert_scales, the three norms,
    # experts: a list of (gate_up (2*emlp, dim), down (dim, emlp)) per expert


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """f32(a * b + c) rounded once, elementwise, for f32 arrays: C's fmaf,
    what one FMA instruction gives. NumPy has none, so: a * b is exact in
    f64 (24 + 24 bits); s = a * b + c rounded to f64 and its error e (Knuth's
    two-sum, exact); s rounded to odd (the f64 neighbour on the exact sum's
    side whose last bit is 1, when e != 0), which the cast to f32 then
    rounds as it would the exact sum, since f64 keeps more than 24 + 1 bits
    (docs/numerics.md#activation-modes)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c = np.broadcast_to(c.astype(np.float64), p.shape)
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)
        bits = s.view(np.uint64).copy()
        fix = (e != 0) & np.isfinite(e) & ((bits & 1) == 0)
        away = (e > 0) == (s > 0)  # the exact sum is further from zero than s
        bits[fix & away] += np.uint64(1)
        bits[fix & ~away] -= np.uint64(1)
        return bits.view(np.float64).astype(np.float32)


class Q8Matrix:
    """A weight matrix (rows, cols) for the q8 mode: ``w @ x`` quantizes x
    (cols,) to int8 per block of 32 (gemma_cy.quant.tensors.quantize_activations_q8)
    and returns (rows,) f32, bit for bit what the fast path computes:

        isum[r, b] = sum_i wq[r, b, i] * xq[b, i]     exact integers (< 2^20)
        s[r, b]    = xd[b]                  Int8Tensor (one weight scale w_s)
                   = f32(d[r, b] * xd[b])   Q8_0Tensor, Q5_0Tensor (block scales d)
        acc[r]     = fma_f32(f32(isum[r, b]), s[r, b], acc[r])   block after block, from 0
        out[r]     = acc[r]  [* w_s, one f32 product]

    all in f32, one rounding per block (the kernels' FMA; the order is the
    kernels' order, so the sums are the same numbers).
    """

    ROWS_PER_CHUNK = 8192  # bounds the f32 copy of the int8 values to ~20 MB at cols 640

    def __init__(self, tensor: Int8Tensor | Q8_0Tensor | Q5_0Tensor | AffineTensor | Q4_KTensor | Q4_1Tensor) -> None:
        rows, cols = tensor.shape
        if cols % Q8_0_BLOCK:
            raise ValueError(f"q8 activations need cols % {Q8_0_BLOCK} == 0, got a ({rows}, {cols}) matrix")
        self.shape = (rows, cols)
        self.affine = tensor.levels() if isinstance(tensor, (AffineTensor, Q4_KTensor, Q4_1Tensor)) else None
        if self.affine is not None:
            self.wq, self.wd, self.scale = None, None, None
        elif isinstance(tensor, (Q8_0Tensor, Q5_0Tensor)):  # a Q5_0Tensor's levels and d are its Q8_0 blocks'
            self.wq = tensor.qs  # (rows, nb, 32) int8
            self.wd = tensor.d.astype(np.float32).reshape(rows, -1)  # (rows, nb) f32
            self.scale = None
        else:
            self.wq = tensor.q.reshape(rows, -1, Q8_0_BLOCK)  # (rows, nb, 32) int8
            self.wd = None
            self.scale = np.float32(tensor.scale)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        xq, xd = quantize_activations_q8(x)  # (cols,) int8, (nb,) f32
        if self.affine is not None:
            return self._affine_matmul(xq, xd)
        xq = xq.reshape(-1, Q8_0_BLOCK).astype(np.float32)  # (nb, 32)
        out = np.empty(self.shape[0], dtype=np.float32)  # (rows,)
        for r in range(0, self.shape[0], self.ROWS_PER_CHUNK):
            wq = self.wq[r:r + self.ROWS_PER_CHUNK].astype(np.float32)  # (n, nb, 32)
            isum = np.einsum("rbk,bk->rb", wq, xq)  # (n, nb), exact integers (< 2^24: exact in f32)
            if self.scale is None:
                s = self.wd[r:r + len(wq)] * xd  # (n, nb): f32 products
            else:
                s = np.broadcast_to(xd, isum.shape)  # (n, nb)
            acc = np.zeros(len(wq), dtype=np.float32)  # (n,)
            for b in range(isum.shape[1]):  # block after block, as the kernels
                acc = fma_f32(isum[:, b], s[:, b], acc)
            out[r:r + len(wq)] = acc if self.scale is None else acc * self.scale
        return out

    def _affine_matmul(self, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
        """An AffineTensor (or a Q4_KTensor or Q4_1Tensor, read as its records) times quantized activations,
        record after record, in f32:
        acc = fma_f32(f32(isum), f32(a * d), acc), then acc = fma_f32(-f32(qsum), f32(b * d), acc),
        with isum = sum q * xq and qsum = sum xq over the record's values and d
        the activations' block scale (kernels/common.pxi, k_dot_affine_q8)."""
        lv, sub = self.affine, self.affine.sub
        rows, cols = self.shape
        n_sub = cols // sub
        xs = xq.reshape(n_sub, sub).astype(np.int64)  # (n_sub, sub)
        d = np.repeat(xd, Q8_0_BLOCK // sub)  # (n_sub,) the block scale of each record
        acc = np.zeros(rows, dtype=np.float32)  # (rows,)
        for s in range(n_sub):  # record after record, as the kernels
            q = lv.q[:, s * sub:(s + 1) * sub].astype(np.int64)  # (rows, sub)
            isum = (q @ xs[s]).astype(np.float32)  # (rows,) exact integers
            acc = fma_f32(isum, lv.a[:, s] * d[s], acc)
            if lv.b is not None:
                acc = fma_f32(np.float32(-xs[s].sum()), lv.b[:, s] * d[s], acc)
        return acc


@dataclass(frozen=True)
class F32Weights:
    """The whole model's tensors as f32: what the reference computes with."""

    embed_tokens: np.ndarray  # (vocab, dim)
    embed_positions: np.ndarray | None  # (max_seq_len, dim) when config.position_table
    layers: tuple[LayerWeights, ...]  # n_layers
    final_norm: np.ndarray  # (dim,)
    lm_head: np.ndarray  # (vocab, dim); the same array as embed_tokens when tied
    embed_per_layer: object = None  # (vocab, n_layers*ple) when config.per_layer_input_dim: the tensor, rows read per token
    per_layer_model_proj: np.ndarray | None = None  # (n_layers*ple, dim)
    per_layer_proj_norm: np.ndarray | None = None  # (ple,)

    @classmethod
    def from_weights(cls, weights: Weights, activations: str = "f32") -> "F32Weights":
        """Dequantize every tensor of ``weights`` (q * scale, docs/formats.md#int8-per-tensor-quantization) once.
        activations "q8": the matrices become Q8Matrix (int8 inputs) instead;
        the embedding rows and norm gains stay f32. ParameterError for a mode
        the model cannot run (gemma_cy.model.checks.check_activation_mode)."""
        c = weights.config
        check_activation_mode(activations, c, weights.tensors)

        def deq(name: str) -> np.ndarray:
            return weights[name].dequantize()

        def matrix(name: str):
            return Q8Matrix(weights[name]) if activations == "q8" else deq(name)

        def optional(name: str, present: bool) -> np.ndarray | None:
            return deq(name) if present else None

        def optional_matrix(name: str):
            return matrix(name) if name in weights.tensors else None

        rope_freqs = optional("rope_freqs", c.rope_freqs)  # (hd/2,), every layer's (global ones' in Gemma 4)
        ple = c.per_layer_input_dim > 0
        layers = []
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            own_kv = c.kv_source(layer) == layer
            layers.append(LayerWeights(
                q_proj=matrix(p + "q_proj"), k_proj=optional_matrix(p + "k_proj"),
                v_proj=optional_matrix(p + "v_proj"),
                o_proj=matrix(p + "o_proj"), gate_proj=matrix(p + "gate_proj"),
                up_proj=matrix(p + "up_proj"), down_proj=matrix(p + "down_proj"),
                attn_norm=deq(p + "attn_norm"), ffn_norm=deq(p + "ffn_norm"),
                q_norm=optional(p + "q_norm", c.qk_norm), k_norm=optional(p + "k_norm", c.qk_norm and own_kv),
                post_attn_norm=optional(p + "post_attn_norm", c.post_norms),
                post_ffn_norm=optional(p + "post_ffn_norm", c.post_norms),
                q_bias=optional(p + "q_bias", c.qkv_bias), k_bias=optional(p + "k_bias", c.qkv_bias),
                v_bias=optional(p + "v_bias", c.qkv_bias),
                rope_freqs=c.rope_divisors(rope_freqs, c.is_local(layer)),
                ple_gate=optional_matrix(p + "ple_gate"), ple_proj=optional_matrix(p + "ple_proj"),
                ple_post_norm=optional(p + "ple_post_norm", ple),
                layer_scalar=optional(p + "layer_scalar", c.layer_scalars),
                moe=None if not c.n_experts else {
                    "router_proj": deq(p + "router_proj"), "router_scale": deq(p + "router_scale"),
                    "expert_scales": deq(p + "expert_scales"),
                    **{n: deq(p + n) for n in ("moe_post_norm_1", "moe_pre_norm_2", "moe_post_norm_2")},
                    "experts": [(matrix(p + f"expert{e}_gate_up"), matrix(p + f"expert{e}_down"))
                                for e in range(c.n_experts)]}))
        embed_tokens = deq("embed_tokens")
        if activations == "q8":
            lm_head = Q8Matrix(weights.lm_head)
        else:  # tied: one array, not a second dequantized copy of the embedding
            lm_head = embed_tokens if c.tied_embeddings else deq("lm_head")
        return cls(
            embed_tokens=embed_tokens,
            embed_positions=optional("embed_positions", c.position_table),
            layers=tuple(layers),
            final_norm=deq("final_norm"),
            lm_head=lm_head,
            embed_per_layer=weights["embed_per_layer"] if ple else None,
            per_layer_model_proj=optional_matrix("per_layer_model_proj"),
            per_layer_proj_norm=optional("per_layer_proj_norm", ple))


class KVCache:
    """Rotated keys and raw values of every layer and position so far
    (``key_cache``, ``value_cache``: llama2.c's names, as in the fast
    engine's FastModel)."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        # layers of other sizes (Gemma 4) use [:, :their nkv, :their hd] of the widest
        c = config
        n_kv = max(c.n_kv_heads_of(layer) for layer in range(c.n_layers))
        hd = max(c.head_dim_of(layer) for layer in range(c.n_layers))
        # Gemma 4's shared layers hold none of their own: index[layer] is the row
        # of the layer whose keys and values it reads (layer l itself elsewhere)
        own = sorted({c.kv_source(layer) for layer in range(c.n_layers)})
        self.index = [own.index(c.kv_source(layer)) for layer in range(c.n_layers)]
        shape = (len(own), max_len, n_kv, hd)
        self.max_len = max_len
        self.key_cache = np.zeros(shape, dtype=np.float32)  # (layers with a cache, max_len, nkv, hd)
        self.value_cache = np.zeros(shape, dtype=np.float32)  # (layers with a cache, max_len, nkv, hd)


def no_observer(layer: int, op: str, pos: int, value: np.ndarray) -> None:
    """The observer used when none is given: ignores every call."""


# ---------------------------------------------------------------------------
# Kernels (know nothing of the graph)


def rmsnorm(x: np.ndarray, gain: np.ndarray, eps: float, one_plus: bool) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g, or * (1 + g) (Gemma), over the last axis.

    x (..., n), gain (n,) -> (..., n). The last axis lets the same function
    normalize each head of q or k (q/k-norm).
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    g = np.float32(1.0) + gain if one_plus else gain  # (n,)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * g


def rope_cos_sin(pos: int, head_dim: int, base: float, freq_factors: np.ndarray | None = None,
                 scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles pos * base^(-2j/hd) [/ freq_factors[j]], j < hd/2, [times
    scale], as f32 (hd/2,). ``head_dim`` is the rotated width (config.rotary_dims).

    The angles are computed in f64 and rounded once: in f32, pos * inv_freq
    loses ~pos * 6e-8 rad (1e-3 at 16k positions), which is accuracy the
    reference should not give away. The fast path may tabulate these.
    ``freq_factors`` (Llama 3's rope_freqs, docs/model.md#llama-3) divide
    each pair's frequency: 1 keeps it, 8 turns it 8 times slower.
    ``scale`` is LongRoPE's attention factor (docs/model.md#phi-3), applied
    in f64 before the one rounding.
    """
    j = np.arange(head_dim // 2, dtype=np.float64)  # (hd/2,)
    inv_freq = float(base) ** (-2.0 * j / head_dim)  # (hd/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)  # (hd/2,)
    angle = pos * inv_freq  # (hd/2,)
    if scale != 1.0:
        return (np.cos(angle) * scale).astype(np.float32), (np.sin(angle) * scale).astype(np.float32)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rope(x: np.ndarray, pos: int, base: float, pairing: str, freq_factors: np.ndarray | None = None,
         rot_dims: int = 0, scale: float = 1.0) -> np.ndarray:
    """Rotate each head's pairs by pos * inv_freq_j: x (n, hd) -> (n, hd).

    pairing "interleaved": pair j is (x[2j], x[2j+1]) (seed, docs/model.md#the-seed-model-gmw1);
    "half_split": pair j is (x[j], x[j + hd/2]) (Gemma, HF rotate_half).
    Pair (a, b) -> (a cos - b sin, a sin + b cos). With ``rot_dims`` (> 0,
    < hd) only each head's first rot_dims values are rotated, as a head of
    that width, and the rest pass unchanged (Phi-4-mini, docs/model.md#phi-3).
    """
    if rot_dims and rot_dims < x.shape[-1]:
        out = x.copy()  # (n, hd)
        out[:, :rot_dims] = rope(x[:, :rot_dims], pos, base, pairing, freq_factors, 0, scale)
        return out
    head_dim = x.shape[-1]
    cos, sin = rope_cos_sin(pos, head_dim, base, freq_factors, scale)  # (hd/2,) each
    if pairing == "interleaved":
        a, b = x[:, 0::2], x[:, 1::2]  # (n, hd/2) each
    else:
        a, b = x[:, :head_dim // 2], x[:, head_dim // 2:]  # (n, hd/2) each
    ra = a * cos - b * sin  # (n, hd/2)
    rb = a * sin + b * cos  # (n, hd/2)
    out = np.empty_like(x)  # (n, hd)
    if pairing == "interleaved":
        out[:, 0::2], out[:, 1::2] = ra, rb
    else:
        out[:, :head_dim // 2], out[:, head_dim // 2:] = ra, rb
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    """Stable softmax over the last axis: exp(x - max) / sum."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): squashes x into (-cap, cap) (Gemma 2)."""
    c = np.float32(cap)
    return c * np.tanh(x / c)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid(x) = exp(-log(1 + exp(-x))): no overflow."""
    return x * np.exp(-np.logaddexp(np.float32(0.0), -x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GELU, tanh approximation)."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(GELU_TANH_C * (x + GELU_TANH_A * x * x * x)))


GATE_ACTIVATION_FUNCTIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def window_start(pos: int, window: int) -> int:
    """First position a query at ``pos`` attends to: the last ``window``
    positions, ``pos`` included; window 0 = all, from 0."""
    return max(0, pos - window + 1) if window > 0 else 0


# ---------------------------------------------------------------------------
# The model's layers


def embed(weights: F32Weights, token: int, pos: int, config: ModelConfig) -> np.ndarray:
    """Token row * embed_scale (+ the learned position row): (dim,)."""
    x = weights.embed_tokens[token] * np.float32(config.embed_scale)  # (dim,)
    if config.position_table:
        x = x + weights.embed_positions[pos]  # (dim,)
    return x


def attention(x: np.ndarray, w: LayerWeights, layer: int, pos: int, cache: KVCache,
              config: ModelConfig, observer: Observer = no_observer) -> np.ndarray:
    """Self-attention of one layer at one position: xn (dim,) -> (dim,).

    Writes this position's rotated key and raw value into ``cache`` and
    attends over positions window_start(pos, window) .. pos. Observes
    "q", "k", "v" and "attn_out". Returns o_proj's output (no post-norm).
    """
    c = config
    one_plus = c.norm_gain == "one_plus"
    hd, nkv, src = c.head_dim_of(layer), c.n_kv_heads_of(layer), c.kv_source(layer)
    base = c.rope_base_for(layer)
    q = (w.q_proj @ x).reshape(c.n_heads, hd)  # (nh, hd)
    if c.qkv_bias:
        q = q + w.q_bias.reshape(c.n_heads, hd)  # (nh, hd)
    if c.qk_norm:
        q = rmsnorm(q, w.q_norm, c.norm_eps, one_plus)  # (nh, hd)
    q = rope(q, pos, base, c.rope_pairing, w.rope_freqs, c.rope_dims, c.rope_attn_factor)  # (nh, hd)
    if src == layer:
        k = (w.k_proj @ x).reshape(nkv, hd)  # (nkv, hd)
        v = (w.v_proj @ x).reshape(nkv, hd) if w.v_proj is not None else k  # (nkv, hd); Gemma 4: k's projection
        if c.qkv_bias:
            k = k + w.k_bias.reshape(nkv, hd)  # (nkv, hd)
            v = v + w.v_bias.reshape(nkv, hd)  # (nkv, hd)
        if c.qk_norm:
            k = rmsnorm(k, w.k_norm, c.norm_eps, one_plus)  # (nkv, hd)
        if c.v_norm:
            v = rmsnorm(v, np.ones(hd, np.float32), c.norm_eps, False)  # (nkv, hd), no gain
        k = rope(k, pos, base, c.rope_pairing, w.rope_freqs, c.rope_dims, c.rope_attn_factor)  # (nkv, hd)
        cache.key_cache[cache.index[layer], pos, :nkv, :hd] = k
        cache.value_cache[cache.index[layer], pos, :nkv, :hd] = v
    else:  # Gemma 4's shared layers: the keys and values layer src cached for this position
        i = cache.index[layer]
        k, v = cache.key_cache[i, pos, :nkv, :hd], cache.value_cache[i, pos, :nkv, :hd]  # (nkv, hd)
    observer(layer, "q", pos, q)
    observer(layer, "k", pos, k)
    observer(layer, "v", pos, v)

    start = window_start(pos, c.window(layer))
    # GQA: query head h reads kv head h * nkv // nh
    kv_head = np.arange(c.n_heads) * nkv // c.n_heads  # (nh,)
    keys = cache.key_cache[cache.index[layer], start:pos + 1, :nkv, :hd][:, kv_head]  # (T, nh, hd)
    values = cache.value_cache[cache.index[layer], start:pos + 1, :nkv, :hd][:, kv_head]  # (T, nh, hd)

    scores = np.einsum("hd,thd->ht", q, keys) * np.float32(c.scores_scale)  # (nh, T)
    if c.attn_softcap > 0:
        scores = softcap(scores, c.attn_softcap)  # (nh, T)
    probs = softmax(scores)  # (nh, T)
    out = np.einsum("ht,thd->hd", probs, values).reshape(c.n_heads * hd)  # (qd,)
    observer(layer, "attn_out", pos, out)
    return w.o_proj @ out  # (dim,)


def mlp(x: np.ndarray, w: LayerWeights, config: ModelConfig) -> np.ndarray:
    """Gated MLP: down(act(gate x) * (up x)); xn (dim,) -> (dim,)."""
    act = GATE_ACTIVATION_FUNCTIONS[config.activation]
    h = act(w.gate_proj @ x) * (w.up_proj @ x)  # (mlp,)
    return w.down_proj @ h  # (dim,)


def block(x: np.ndarray, w: LayerWeights, layer: int, pos: int, cache: KVCache,
          config: ModelConfig, observer: Observer = no_observer,
          per_layer_input: np.ndarray | None = None) -> np.ndarray:
    """One transformer layer: x (dim,) -> (dim,).

    x += [post_attn_norm] attention(attn_norm(x)); x += [post_ffn_norm] mlp(ffn_norm(x));
    Gemma 4: x += ple_post_norm(ple_proj(act(ple_gate x) * per_layer_input)), then x *= layer_scalar
    ("resid_mlp" observes the layer's output, after them).
    """
    c = config
    one_plus = c.norm_gain == "one_plus"
    xn = rmsnorm(x, w.attn_norm, c.norm_eps, one_plus)  # (dim,)
    observer(layer, "attn_norm", pos, xn)
    a = attention(xn, w, layer, pos, cache, c, observer)  # (dim,)
    if c.post_norms:
        a = rmsnorm(a, w.post_attn_norm, c.norm_eps, one_plus)  # (dim,)
    observer(layer, "attn", pos, a)
    x = x + a  # (dim,)
    observer(layer, "resid_attn", pos, x)

    xn = rmsnorm(x, w.ffn_norm, c.norm_eps, one_plus)  # (dim,)
    observer(layer, "ffn_norm", pos, xn)
    m = mlp(xn, w, c)  # (dim,)
    if w.moe is not None:  # Gemma 4: the expert block beside the MLP, both normed, then summed
        m = rmsnorm(m, w.moe["moe_post_norm_1"], c.norm_eps, one_plus) + experts(x, w.moe, c)  # (dim,)
    if c.post_norms:
        m = rmsnorm(m, w.post_ffn_norm, c.norm_eps, one_plus)  # (dim,)
    observer(layer, "mlp", pos, m)
    x = x + m  # (dim,)
    if per_layer_input is not None:
        act = GATE_ACTIVATION_FUNCTIONS[c.activation]
        h = w.ple_proj @ (act(w.ple_gate @ x) * per_layer_input)  # (dim,)
        x = x + rmsnorm(h, w.ple_post_norm, c.norm_eps, one_plus)  # (dim,)
    if w.layer_scalar is not None:
        x = x * w.layer_scalar[0]  # (dim,)
    observer(layer, "resid_mlp", pos, x)
    return x


def experts(x: np.ndarray, moe: dict, config: ModelConfig) -> np.ndarray:
    """Gemma 4's expert block on the residual x (dim,) -> (dim,), normed.

    Router: softmax of router_proj (rmsnorm(x), no gain, * router_scale /
    sqrt(dim)); the top n_experts_used probabilities (the larger index
    first on a tie... as torch.topk: highest value first), renormalized to
    sum 1, each times its expert's scale. Each chosen expert e runs on
    rmsnorm(x, moe_pre_norm_2): gate and up halves of gate_up_e, down_e of
    act(gate) * up, weighted; only the chosen experts' weights are read.
    The sum is normed with moe_post_norm_2 (docs/model.md#gemma-4)."""
    c = config
    one_plus = c.norm_gain == "one_plus"
    h = rmsnorm(x, np.ones(c.dim, np.float32), c.norm_eps, False) * moe["router_scale"] \
        * np.float32(c.dim ** -0.5)  # (dim,)
    probs = softmax(moe["router_proj"] @ h)  # (n_experts,)
    chosen = np.argsort(-probs, kind="stable")[:c.n_experts_used]  # (k,) highest first, lower index on ties
    weights = probs[chosen] / probs[chosen].sum(dtype=np.float32)  # (k,)
    weights = weights * moe["expert_scales"][chosen]  # (k,)
    xn = rmsnorm(x, moe["moe_pre_norm_2"], c.norm_eps, one_plus)  # (dim,)
    act = GATE_ACTIVATION_FUNCTIONS[c.activation]
    out = np.zeros(c.dim, np.float32)  # (dim,)
    for e, weight in sorted(zip(chosen.tolist(), weights)):  # in expert order, as transformers adds them
        gate_up, down = moe["experts"][e]
        gu = gate_up @ xn  # (2 * emlp,)
        out = out + (down @ (act(gu[:c.expert_mlp_dim]) * gu[c.expert_mlp_dim:])) * weight  # (dim,)
    return rmsnorm(out, moe["moe_post_norm_2"], c.norm_eps, one_plus)


def per_layer_inputs(weights: F32Weights, token: int, x: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Gemma 4's per-layer inputs of one position, (n_layers, ple): from the
    embedded token x (dim,), the projection RMS-normed per layer plus the
    token's row of the per-layer embedding (times sqrt(ple)), both times
    1/sqrt(2) (docs/model.md#gemma-4)."""
    c = config
    ple = c.per_layer_input_dim
    proj = (weights.per_layer_model_proj @ x) * np.float32(c.dim ** -0.5)  # (n_layers*ple,)
    proj = rmsnorm(proj.reshape(c.n_layers, ple), weights.per_layer_proj_norm, c.norm_eps,
                   c.norm_gain == "one_plus")  # (n_layers, ple)
    row = np.asarray(weights.embed_per_layer.row(token), np.float32)  # (n_layers*ple,)
    own = row.reshape(c.n_layers, ple) * np.float32(ple ** 0.5)  # (n_layers, ple)
    return (proj + own) * np.float32(2.0 ** -0.5)  # (n_layers, ple)


def final_norm(x: np.ndarray, weights: F32Weights, config: ModelConfig) -> np.ndarray:
    """RMSNorm with the final gain: (dim,) -> (dim,)."""
    return rmsnorm(x, weights.final_norm, config.norm_eps, config.norm_gain == "one_plus")


def logits(x: np.ndarray, weights: F32Weights, config: ModelConfig) -> np.ndarray:
    """lm_head . x, soft-capped when config.final_softcap > 0: (dim,) -> (vocab,)."""
    out = weights.lm_head @ x  # (vocab,)
    if config.final_softcap > 0:
        out = softcap(out, config.final_softcap)  # (vocab,)
    return out
