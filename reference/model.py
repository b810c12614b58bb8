"""The reference engine: the layers of ``layers.py`` run over a KV cache.

    logits = engine.prefill(prompt_ids)      # positions pos .. pos+len-1
    logits = engine.decode(next_id)          # position pos

The engine is the trusted model the Cython fast path is checked against: both
expose the same methods, raise the same errors and call the same observer.
"""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from gemma_cy.errors import NumericalError, ParameterError, TokenIndexError
from gemma_cy.weights import Weights

from .layers import F32Weights, KVCache, Observer, block, embed, final_norm, logits, no_observer

# The observer's calls for one position, in this order (a diff tool walks
# both engines with it): observer(layer, op, pos, value), value read-only f32.
#   layer -1        "embed"       (dim,)    token row * embed_scale (+ position row)
#   layer l         "attn_norm"   (dim,)    input of attention
#     0..n_layers-1 "q"           (nh, hd)  after q-norm and RoPE
#                   "k"           (nkv, hd) after k-norm and RoPE (as cached)
#                   "v"           (nkv, hd) as cached
#                   "attn_out"    (qd,)     weighted sum of v, before o_proj
#                   "attn"        (dim,)    after o_proj (and post_attn_norm)
#                   "resid_attn"  (dim,)    x after the attention residual add
#                   "ffn_norm"    (dim,)    input of the MLP
#                   "mlp"         (dim,)    after down_proj (and post_ffn_norm)
#                   "resid_mlp"   (dim,)    x after the MLP residual add: the layer's output
#   layer n_layers  "final_norm"  (dim,)
#                   "logits"      (vocab,)  after the final soft-cap, if any
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


def _read_only(observer: Observer) -> Observer:
    """Wrap ``observer`` so it sees read-only arrays: it may keep them, but
    cannot change the computation by writing into them."""
    def observe(layer: int, op: str, pos: int, value: np.ndarray) -> None:
        value.flags.writeable = False
        observer(layer, op, pos, value)
    return observe


class ReferenceEngine:
    """NumPy reference engine over ``weights`` with a KV cache of
    min(max_cache_len, config.max_seq_len) positions.

    Computes in f32 from weights dequantized once here (SPEC Part C).
    ``pos`` counts the positions filled so far; prefill and decode continue
    from it, ``reset()`` starts over.

    Attributes: ``config`` (ModelConfig), ``cache_len`` (positions the cache
    holds), ``pos``, ``weights`` (F32Weights, the dequantized tensors),
    ``cache`` (KVCache).
    """

    def __init__(self, weights: Weights, max_cache_len: int) -> None:
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, (int, np.integer)) \
                or max_cache_len <= 0:
            raise ParameterError(f"max_cache_len = {max_cache_len!r}, must be an integer > 0")
        self.config = weights.config
        self.cache_len = min(int(max_cache_len), self.config.max_seq_len)
        self.weights = F32Weights.from_weights(weights)
        self.cache = KVCache(self.config, self.cache_len)
        self.pos = 0

    def reset(self) -> None:
        """Forget every position: the next prefill starts at position 0."""
        self.pos = 0

    def forward(self, token: int, pos: int, observer: Observer | None = None) -> np.ndarray:
        """Run ``token`` at position ``pos`` (0 <= pos <= self.pos) and return
        its logits (vocab,) f32. Positions after ``pos`` are forgotten
        (self.pos becomes pos + 1)."""
        token = self._check_token(token)
        pos = operator.index(pos)
        if not 0 <= pos < self.cache_len:
            raise TokenIndexError(f"position {pos} outside the KV cache [0, {self.cache_len})")
        if pos > self.pos:
            raise TokenIndexError(
                f"position {pos} skips ahead: {self.pos} positions are filled, so the next is {self.pos}")
        return self._step(token, pos, no_observer if observer is None else _read_only(observer))

    def prefill(self, ids: Sequence[int], observer: Observer | None = None) -> np.ndarray:
        """Run ``ids`` at positions self.pos, self.pos+1, ...; return the logits
        (vocab,) of the last one. Every id and position is checked first."""
        ids = [self._check_token(token) for token in ids]
        if not ids:
            raise ValueError("prefill: ids is empty (need at least one token)")
        last = self.pos + len(ids) - 1
        if last >= self.cache_len:
            raise TokenIndexError(
                f"position {last} outside the KV cache [0, {self.cache_len}): "
                f"{len(ids)} tokens from position {self.pos}")
        observe = no_observer if observer is None else _read_only(observer)
        for token in ids:
            out = self._step(token, self.pos, observe)
        return out

    def decode(self, token: int, observer: Observer | None = None) -> np.ndarray:
        """Run one token at the next position; return its logits (vocab,)."""
        return self.forward(token, self.pos, observer)

    def _check_token(self, token) -> int:
        token = operator.index(token)
        if not 0 <= token < self.config.vocab_size:
            raise TokenIndexError(
                f"token id {token} outside the vocabulary [0, {self.config.vocab_size})")
        return token

    def _step(self, token: int, pos: int, observe: Observer) -> np.ndarray:
        """One position, inputs already checked; raises NumericalError on
        non-finite logits, naming the first layer whose output was not finite."""
        c, w = self.config, self.weights
        first_bad = None  # first layer (-1 = embedding) with a non-finite output
        # NaN/Inf is reported once, as NumericalError, not as numpy warnings
        with np.errstate(all="ignore"):
            x = embed(w, token, pos, c)  # (dim,)
            observe(-1, "embed", pos, x)
            if not np.all(np.isfinite(x)):
                first_bad = -1
            for layer in range(c.n_layers):
                x = block(x, w.layers[layer], layer, pos, self.cache, c, observe)  # (dim,)
                if first_bad is None and not np.all(np.isfinite(x)):
                    first_bad = layer
            xn = final_norm(x, w, c)  # (dim,)
            observe(c.n_layers, "final_norm", pos, xn)
            out = logits(xn, w, c)  # (vocab,)
            observe(c.n_layers, "logits", pos, out)
        if not np.all(np.isfinite(out)):
            where = ("the embedding" if first_bad == -1 else
                     f"layer {first_bad}" if first_bad is not None else "the output head")
            raise NumericalError(f"non-finite logits at position {pos} (first non-finite: {where})")
        self.pos = pos + 1
        return out
