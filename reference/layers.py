"""The layers of the reference model: one small pure NumPy function each.

Read top to bottom, this is the model (docs/model.md#the-seed-model-gmw1 for the seed, docs/model.md#gemma-3 for Gemma 3):

    x = embed(token, pos)                                       # (dim,)
    for each layer l:
        x = x + [post_attn_norm] attention(attn_norm(x), pos, cache)
        x = x + [post_ffn_norm]  mlp(ffn_norm(x))
    logits = logits(final_norm(x))                              # (vocab,)

Everything is f32, computed from weights dequantized once (weights.py,
docs/numerics.md#the-reference); the only f64 is the RoPE angle table (see
``ops.rope_cos_sin``). In the opt-in "q8" mode the matrices are ``Q8Matrix``
instead (q8.py), bit for bit the fast path's q8 mode. The kernels the layers
call are in ops.py, Gemma 4's extras (experts, per-layer inputs) in
gemma4.py. The Cython fast path (gemma_cy/fast/forward.pxi) mirrors these
functions one to one: same names, same signatures.

Abbreviations used in the shape comments:
    dim     hidden size (residual stream)        hd   head_dim
    nh      query heads                          nkv  key/value heads
    qd      nh * hd                              kvd  nkv * hd
    mlp     MLP hidden width                     T    positions attended to
    vocab   vocabulary size
"""
from __future__ import annotations

import numpy as np

from gemma_cy.model.config import ModelConfig
from gemma_cy.model.observe import Observer  # observer(layer, op, pos, value): the calls are listed there

from .gemma4 import experts, per_layer_input
from .ops import GATE_ACTIVATION_FUNCTIONS, rmsnorm, rope, softcap, softmax, window_start
from .weights import F32Weights, KVCache, LayerWeights


def no_observer(layer: int, op: str, pos: int, value: np.ndarray) -> None:
    """The observer used when none is given: ignores every call."""


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
          ple_input: np.ndarray | None = None) -> np.ndarray:
    """One transformer layer: x (dim,) -> (dim,).

    x += [post_attn_norm] attention(attn_norm(x)); x += [post_ffn_norm] mlp(ffn_norm(x));
    Gemma 4 (gemma4.py): with experts, the MLP's output is moe_post_norm_1(mlp) + experts(x);
    x = per_layer_input(x, ple_input) (``ple_input``: this layer's (ple,)), then x *= layer_scalar
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
    if ple_input is not None:
        x = per_layer_input(x, w, ple_input, c)  # (dim,)
    if w.layer_scalar is not None:
        x = x * w.layer_scalar[0]  # (dim,)
    observer(layer, "resid_mlp", pos, x)
    return x


def final_norm(x: np.ndarray, weights: F32Weights, config: ModelConfig) -> np.ndarray:
    """RMSNorm with the final gain: (dim,) -> (dim,)."""
    return rmsnorm(x, weights.final_norm, config.norm_eps, config.norm_gain == "one_plus")


def logits(x: np.ndarray, weights: F32Weights, config: ModelConfig) -> np.ndarray:
    """lm_head . x, soft-capped when config.final_softcap > 0: (dim,) -> (vocab,)."""
    out = weights.lm_head @ x  # (vocab,)
    if config.final_softcap > 0:
        out = softcap(out, config.final_softcap)  # (vocab,)
    return out
