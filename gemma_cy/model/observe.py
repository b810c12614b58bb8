"""The per-layer observer hook, shared by every engine (reference and fast).

An observer is a callable ``observer(layer, op, pos, value)`` that an
engine's ``forward``/``prefill``/``decode`` calls with each intermediate of
each position, in this order (a diff tool walks two engines with it); value
is a read-only f32 array that the observer may keep:

  layer -1        "embed"       (dim,)    token row * embed_scale (+ position row)
  layer l         "attn_norm"   (dim,)    input of attention
    0..n_layers-1 "q"           (nh, hd)  after q-norm and RoPE
                  "k"           (nkv, hd) after k-norm and RoPE (as cached)
                  "v"           (nkv, hd) as cached
                  "attn_out"    (qd,)     weighted sum of v, before o_proj
                  "attn"        (dim,)    after o_proj (and post_attn_norm)
                  "resid_attn"  (dim,)    x after the attention residual add
                  "ffn_norm"    (dim,)    input of the MLP
                  "mlp"         (dim,)    after down_proj (and post_ffn_norm)
                  "resid_mlp"   (dim,)    x after the MLP residual add: the layer's output
  (Gemma 4: "resid_mlp" after the per-layer input block and times the layer scalar)
  layer n_layers  "final_norm"  (dim,)
                  "logits"      (vocab,)  after the final soft-cap, if any

(nh, nkv, hd: query heads, key/value heads, head_dim; qd = nh * hd.) An
engine that does not compute the logits of a position (the fast engine's
prefill, except at its last position) makes no "logits" call for it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .config import ModelConfig

Observer = Callable[[int, str, int, np.ndarray], None]

EMBED_OPS = ("embed",)
LAYER_OPS = ("attn_norm", "q", "k", "v", "attn_out", "attn", "resid_attn",
             "ffn_norm", "mlp", "resid_mlp")
HEAD_OPS = ("final_norm", "logits")
OBSERVED_OPS = EMBED_OPS + LAYER_OPS + HEAD_OPS


def observed_calls(n_layers: int) -> list[tuple[int, str]]:
    """(layer, op) of every observer call of one position, in call order."""
    calls = [(-1, op) for op in EMBED_OPS]
    for layer in range(n_layers):
        calls += [(layer, op) for op in LAYER_OPS]
    calls += [(n_layers, op) for op in HEAD_OPS]
    return calls


def op_shape(config: ModelConfig, op: str, layer: int = 0) -> tuple[int, ...]:
    """Shape of the value observed for ``op`` of ``layer`` in a model with ``config``
    (Gemma 4's layers differ in head_dim and kv heads)."""
    c = config
    hd, nkv = c.head_dim_of(layer), c.n_kv_heads_of(layer)
    shapes = {"q": (c.n_heads, hd), "k": (nkv, hd),
              "v": (nkv, hd), "attn_out": (c.n_heads * hd,), "logits": (c.vocab_size,)}
    if op not in OBSERVED_OPS:
        raise ValueError(f"op = {op!r}, expected one of {OBSERVED_OPS}")
    return shapes.get(op, (c.dim,))
