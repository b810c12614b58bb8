"""The reference engine with several sequences: one ReferenceEngine per slot.

    engine = ReferenceEngine(weights, max_cache_len, n_slots=n_slots).batch
    a, b = engine.step([(0, prompt_ids, Logits.LAST), (1, [next_id], Logits.LAST)])

Each slot is a ReferenceEngine with its own KVCache over one shared copy of
the dequantized weights; a step runs each segment on its slot's engine, one
position after another. A sequence's results cannot depend on the others:
batch invariance by construction, which the fast engine's one-pass step is
held to (docs/numerics.md#batch-invariance).
"""
from __future__ import annotations

import copy

import numpy as np

from gemma_cy.model.checks import CheckedBatchEngine, Logits, SlotPositions

from .layers import KVCache

__all__ = ["ReferenceBatchEngine"]


class ReferenceBatchEngine(CheckedBatchEngine):
    """``n_slots`` sequences over one engine's weights (CheckedBatchEngine);
    ``engines[slot]`` is each slot's ReferenceEngine (its ``cache`` the slot's
    KVCache), all sharing one F32Weights."""

    @classmethod
    def over(cls, engine, n_slots: int) -> "ReferenceBatchEngine":
        """``n_slots`` slots whose slot 0 is ``engine`` (a ReferenceEngine: its
        ``batch`` property makes this) itself, its weights shared. (This module
        does not import reference/model.py, which imports it: no circle.)"""
        self = cls.__new__(cls)
        self.engines = [engine]
        for _ in range(n_slots - 1):
            other = copy.copy(engine)  # the same weights, a cache of its own
            other.cache = KVCache(engine.config, engine.cache_len)
            other.pos = 0
            self.engines.append(other)
        self.config, self.cache_len, self.activations = engine.config, engine.cache_len, engine.activations
        self.n_slots = n_slots
        return self

    @property
    def pos(self) -> list[int]:
        return SlotPositions(self.engines)

    def _copy(self, src: int, dst: int) -> None:
        n = self.engines[src].pos
        for a, b in ((self.engines[src].cache.key_cache, self.engines[dst].cache.key_cache),
                     (self.engines[src].cache.value_cache, self.engines[dst].cache.value_cache)):
            b[:, :n] = a[:, :n]

    def _step(self, segments: list[tuple[int, list[int], Logits]]) -> list[np.ndarray]:
        out = []
        for slot, ids, want in segments:
            engine = self.engines[slot]
            try:
                logits = engine.logits_of(engine.states(ids)) if want == Logits.ALL else engine.prefill(ids)
            except ArithmeticError as e:  # NumericalError
                raise type(e)(f"slot {slot}: {e}") from None
            if want:
                out.append(logits)
        return out
