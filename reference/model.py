"""The reference engine: the layers of ``layers.py`` run over a KV cache.

    logits = engine.prefill(prompt_ids)      # positions pos .. pos+len-1
    logits = engine.decode(next_id)          # position pos

The engine is the trusted model the Cython fast path is checked against: both
expose the same methods, raise the same errors and call the same observer.
"""
from __future__ import annotations

import numpy as np

from gemma_cy.model.checks import CheckedEngine, cache_length, non_finite_error
# The observer's calls (which, in what order, what shapes) are defined once, in
# gemma_cy.model.observe, for both engines; re-exported here.
from gemma_cy.model.observe import OBSERVED_OPS, observed_calls
from gemma_cy.model.weights import Weights

from .gemma4 import per_layer_inputs
from .layers import Observer, block, embed, final_norm, logits, no_observer
from .weights import F32Weights, KVCache

__all__ = ["ReferenceEngine", "OBSERVED_OPS", "observed_calls"]


def _read_only(observer: Observer) -> Observer:
    """Wrap ``observer`` so it sees read-only arrays: it may keep them, but
    cannot change the computation by writing into them."""
    def observe(layer: int, op: str, pos: int, value: np.ndarray) -> None:
        value.flags.writeable = False
        observer(layer, op, pos, value)
    return observe


class ReferenceEngine(CheckedEngine):
    """NumPy reference engine over ``weights`` with a KV cache of
    min(max_cache_len, config.max_seq_len) positions: ``reset()``,
    ``forward(token, pos)``, ``prefill(ids)``, ``decode(token)``
    (gemma_cy.model.checks.CheckedEngine: they check their inputs first).

    Computes in f32 from weights dequantized once here (docs/numerics.md#the-reference);
    ``activations="q8"`` quantizes every matrix input to int8 per block of 32
    (the fast path's opt-in q8 mode, mirrored bit for bit).
    ``pos`` counts the positions filled so far; prefill and decode continue
    from it, ``reset()`` starts over.

    Attributes: ``config`` (ModelConfig), ``cache_len`` (positions the cache
    holds), ``pos``, ``weights`` (F32Weights, the dequantized tensors),
    ``cache`` (KVCache).
    """

    def __init__(self, weights: Weights, max_cache_len: int, activations: str = "f32", n_slots: int = 1) -> None:
        self.config = weights.config
        self.cache_len = cache_length(max_cache_len, self.config)
        self.activations = activations
        self.weights = F32Weights.from_weights(weights, activations)
        self.cache = KVCache(self.config, self.cache_len)
        self.pos = 0
        self.n_slots = n_slots
        self._batch = None

    @property
    def batch(self):
        """The ReferenceBatchEngine of n_slots slots whose slot 0 is this engine."""
        if self._batch is None:
            from .batch import ReferenceBatchEngine
            self._batch = ReferenceBatchEngine.over(self, self.n_slots)
        return self._batch

    def _run(self, ids: list[int], start: int, observer: Observer | None) -> np.ndarray:
        """Positions start .. start+len(ids)-1, inputs already checked, one
        ``_step`` each; the logits of the last."""
        observe = no_observer if observer is None else _read_only(observer)
        for i, token in enumerate(ids):
            out = self._step(token, start + i, observe, want_logits=i == len(ids) - 1)
        return out

    def _states(self, ids: list[int], start: int) -> np.ndarray:
        """Final-normed states (n, dim) of the checked ``ids`` from ``start``."""
        rows = []
        for i, token in enumerate(ids):
            self._step(token, start + i, no_observer, want_logits=False)
            rows.append(self.last_state)
        return np.stack(rows).astype(np.float32, copy=False)

    def logits_of(self, states: np.ndarray) -> np.ndarray:
        """Logits (T, vocab) of final-normed states (T, dim), row by row as ``_step`` computes them."""
        with np.errstate(all="ignore"):
            return np.stack([logits(row, self.weights, self.config) for row in np.asarray(states)]).astype(
                np.float32, copy=False)

    def _step(self, token: int, pos: int, observe: Observer, want_logits: bool = True) -> np.ndarray | None:
        """One position, inputs already checked; returns its logits (None when
        not ``want_logits``); raises NumericalError on a non-finite output,
        naming the first layer whose output was not finite."""
        c, w = self.config, self.weights
        first_bad = None  # first layer (-1 = embedding) with a non-finite output
        # NaN/Inf is reported once, as NumericalError, not as numpy warnings
        with np.errstate(all="ignore"):
            x = embed(w, token, pos, c)  # (dim,)
            observe(-1, "embed", pos, x)
            if not np.all(np.isfinite(x)):
                first_bad = -1
            ple = per_layer_inputs(w, token, x, c) if c.per_layer_input_dim else None  # (n_layers, ple)
            for layer in range(c.n_layers):
                x = block(x, w.layers[layer], layer, pos, self.cache, c, observe,
                          None if ple is None else ple[layer])  # (dim,)
                if first_bad is None and not np.all(np.isfinite(x)):
                    first_bad = layer
            xn = final_norm(x, w, c)  # (dim,)
            self.last_state = xn
            observe(c.n_layers, "final_norm", pos, xn)
            out = logits(xn, w, c) if want_logits else None  # (vocab,)
            if out is not None:
                observe(c.n_layers, "logits", pos, out)
        if first_bad is not None or (out is not None and not np.all(np.isfinite(out))):
            raise non_finite_error(pos, first_bad, c.n_layers)
        self.pos = pos + 1
        return out
