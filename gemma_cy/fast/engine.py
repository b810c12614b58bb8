"""The fast engine: the Cython forward pass behind the reference engine's interface.

    engine = FastEngine(weights, max_cache_len)   # isa=None: gemma_cy.fast.ops.ISA
    logits = engine.prefill(prompt_ids)           # positions pos .. pos+len-1
    logits = engine.decode(next_id)               # position pos

The forward pass itself is ``FastModel`` of the SIMD module in use
(gemma_cy/fast/forward.pxi, built into every gemma_cy.fast.simd_<isa>): one
GIL-free call per prefill or decode step. This wrapper is the boundary: its
``reset``, ``forward``, ``prefill`` and ``decode`` are the reference's
(gemma_cy.model.checks.CheckedEngine: every token id and position checked
first, the same errors and messages); its ``_run`` turns a non-finite step
into NumericalError and calls the observer (gemma_cy.model.observe) from
the step's trace.

As in the reference, a prefill computes the logits of its last position only
(the lm_head is the biggest matrix of a real model), so with an observer the
"logits" op is observed at that position only; NaN/Inf is found by checking
the residual stream after the embedding and each layer, so a prefill stops
at the first position that goes non-finite, naming that layer; non-finite
logits from a finite residual (a broken lm_head) show where logits are
computed: at a prefill's last position.
"""
from __future__ import annotations

import numpy as np

from . import ops
from ..errors import TokenIndexError
from ..model.checks import CheckedEngine, cache_length, non_finite_error
from ..model.observe import Observer, observed_calls
from ..model.weights import Weights


PREFILL_CHUNK = 64  # positions per GIL-free call in a prefill (~1 s on Gemma 3 270M at worst)


class FastEngine(CheckedEngine):
    """The Cython engine over ``weights`` with a KV cache of
    min(max_cache_len, config.max_seq_len) positions.

    ``isa`` names the SIMD module to run (gemma_cy.fast.ops.ISAS; None: the one
    gemma_cy.fast.ops chose for this CPU). Same interface as
    gemma_cy_reference.model.ReferenceEngine (gemma_cy.model.checks.CheckedEngine):
    ``config``, ``cache_len``, ``pos`` (positions filled so far), ``reset()``,
    ``forward(token, pos)``, ``prefill(ids)``, ``decode(token)``, each
    returning the logits (vocab,) f32 as a new array the caller owns.
    ``activations``: "f32" (default) or "q8" (the opt-in int8-activation
    mode, docs/numerics.md#activation-modes; the reference engine mirrors
    it). ``model`` is the FastModel (its ``key_cache``/``value_cache`` are
    read-only views of the KV cache).
    """

    def __init__(self, weights: Weights, max_cache_len: int, isa: str | None = None,
                 activations: str = "f32", n_slots: int = 1) -> None:
        self.config = weights.config
        self.cache_len = cache_length(max_cache_len, self.config)
        self.isa = ops.ISA if isa is None else isa
        self.activations = activations
        self.model = ops.module_for(self.isa).FastModel(weights, self.cache_len, activations, n_slots)
        self.pos = 0
        self._batch = None
        layout = self.model.trace_layout
        # (layer, op, offset, size, shape) of each observer call of a position, in order
        self._calls = [(layer, op, layout[layer, op][0], int(np.prod(layout[layer, op][1])),
                        layout[layer, op][1]) for layer, op in observed_calls(self.config.n_layers)]
        self._logits_at = layout[self.config.n_layers, "logits"][0]

    @property
    def batch(self):
        """The FastBatchEngine over this engine's FastModel and its n_slots
        slots (slot 0 is this engine's own cache: running the batch takes it
        over, as a new generation does)."""
        if self._batch is None:
            from .batch import FastBatchEngine
            self._batch = FastBatchEngine.over(self)
        return self._batch

    def rewind(self, pos: int) -> int:
        """CheckedEngine.rewind; when a sliding-window layer's ring no longer
        holds the positions before ``pos`` (a run went more than the ring's
        rows past them), the cache is emptied instead. Returns the position
        the next prefill starts at: ``pos``, or 0."""
        super().rewind(pos)
        if not self.model.resumable(self.pos):
            self.reset()
        return self.pos

    def _resumable(self, start: int) -> None:
        if not self.model.resumable(start):
            raise TokenIndexError(
                f"position {start}: the sliding-window layers keep their last "
                f"{min(len(keys) for keys in self.model.key_cache)} "
                f"positions, and the cache has run to position {self.model.high - 1}, so the positions "
                f"before {start} are gone; rewind (or reset) and run again from position 0")

    def _run(self, ids: list[int], start: int, observer: Observer | None) -> np.ndarray:
        """Positions start .. start+len(ids)-1, inputs already checked: one
        call without an observer; one traced call per position with one."""
        self._resumable(start)
        n = len(ids)
        if observer is None:
            if n == 1:  # a decode step: no ids array to build and check
                done = self.model.run_token(ids[0], start)
            else:
                done = self._prefill_chunks(np.array(ids, dtype=np.int32), start)
            if done < n:
                self._fail(start, start + done)
        else:
            tokens = np.array(ids, dtype=np.int32)
            for i in range(n):
                last = i == n - 1
                done = self.model.run(tokens[i:i + 1], start + i, logits=last, trace=True)
                self._observe(observer, start + i, last)
                if done < 1:
                    self._fail(start, start + i)
        self.pos = start + n
        return self.model.last_logits.copy()

    def _states(self, ids: list[int], start: int) -> np.ndarray:
        """Final-normed states (n, dim) of the checked ``ids`` from ``start``,
        PREFILL_CHUNK positions per GIL-free call."""
        self._resumable(start)
        tokens = np.array(ids, dtype=np.int32)
        n = len(tokens)
        out = np.empty((n, self.config.dim), np.float32)
        for lo in range(0, n, PREFILL_CHUNK):
            chunk = tokens[lo:lo + PREFILL_CHUNK]
            ran = self.model.run_states(chunk, start + lo, out[lo:lo + len(chunk)])
            if ran < len(chunk):
                self._fail(start, start + lo + ran)
        self.pos = start + n
        return out

    def logits_of(self, states: np.ndarray) -> np.ndarray:
        """Logits (T, vocab) of final-normed states (T, dim), as a step computes one position's."""
        return self.model.logits_of(np.ascontiguousarray(states, dtype=np.float32))

    def _prefill_chunks(self, tokens: np.ndarray, start: int) -> int:
        """Run ``tokens`` PREFILL_CHUNK positions per GIL-free call (so Ctrl-C
        is seen between calls), logits at the very last position only.
        Returns how many positions ran before a non-finite one."""
        n = len(tokens)
        done = 0
        for lo in range(0, n, PREFILL_CHUNK):
            chunk = tokens[lo:lo + PREFILL_CHUNK]
            ran = self.model.run(chunk, start + lo, logits=lo + len(chunk) == n)
            done += ran
            if ran < len(chunk):
                break
        return done

    def _fail(self, start: int, pos: int) -> None:
        """Raise NumericalError for position ``pos``; the positions before it
        (from ``start``) ran and stay filled, as in the reference."""
        if pos > start:
            self.pos = pos
        raise non_finite_error(pos, self.model.first_bad, self.config.n_layers)

    def _observe(self, observer: Observer, pos: int, with_logits: bool) -> None:
        """Hand the traced position to ``observer`` in the reference's order,
        each value a read-only view of one copy of the trace."""
        trace = self.model.trace
        values = trace.copy() if with_logits else trace[:self._logits_at].copy()
        values.flags.writeable = False
        for layer, op, offset, size, shape in self._calls:
            if op == "logits" and not with_logits:
                continue
            observer(layer, op, pos, values[offset:offset + size].reshape(shape))
