"""The fast engine with several sequences: one pass over the weights for all of them.

    engine = FastBatchEngine(weights, max_cache_len, n_slots)
    a, b = engine.step([(0, prompt_ids, Logits.LAST), (1, [next_id], Logits.LAST)])

Each slot is one sequence with its own KV cache (FastModel's slots, in one
lazily filled map: a slot takes memory only as it fills). A step packs the
segments, in the order given, into blocks of at most BLOCK_ROWS rows and
runs each block as one forward pass (the matrix products over all its
rows, attention per slot): decode rows first, then prompt chunks, is the
caller's order (gemma_cy.generation.batch). Every row gets the bits it gets
alone (docs/numerics.md#batch-invariance).
"""
from __future__ import annotations

import types

import numpy as np

from . import ops
from ..errors import TokenIndexError
from ..model.checks import CheckedBatchEngine, Logits, SlotPositions, cache_length, non_finite_error
from ..model.weights import Weights


class FastBatchEngine(CheckedBatchEngine):
    """``n_slots`` sequences over ``weights``, each with a KV cache of
    min(max_cache_len, config.max_seq_len) positions (CheckedBatchEngine);
    ``isa`` and ``activations`` as FastEngine's. ``model`` is the FastModel
    (``slot_cache(slot)``: a slot's keys and values, read-only views)."""

    def __init__(self, weights: Weights, max_cache_len: int, n_slots: int, isa: str | None = None,
                 activations: str = "f32") -> None:
        self.config = weights.config
        self.cache_len = cache_length(max_cache_len, self.config)
        self.isa = ops.ISA if isa is None else isa
        self.activations = activations
        module = ops.module_for(self.isa)
        self.model = module.FastModel(weights, self.cache_len, activations, n_slots)
        self.rows_per_pass = module.BLOCK_ROWS
        self.n_slots = n_slots
        self.pos = [0] * n_slots

    @classmethod
    def over(cls, engine) -> "FastBatchEngine":
        """The batch engine over a FastEngine's FastModel (its weights and
        slots, no copy): slot 0 is the engine's own cache."""
        self = cls.__new__(cls)
        self.config, self.cache_len, self.isa = engine.config, engine.cache_len, engine.isa
        self.activations, self.model = engine.activations, engine.model
        self.rows_per_pass = ops.module_for(self.isa).BLOCK_ROWS
        self.n_slots = engine.model.n_slots
        self.pos = SlotPositions([engine] + [types.SimpleNamespace(pos=0) for _ in range(self.n_slots - 1)])
        return self

    def rewind(self, slot: int, pos: int) -> int:
        """CheckedBatchEngine.rewind; a slot whose sliding-window rings no
        longer hold what ``pos`` needs starts over at 0 (FastEngine.rewind)."""
        super().rewind(slot, pos)
        if not self.model.resumable(self.pos[slot], slot):
            self.pos[slot] = 0
        return self.pos[slot]

    def _copy(self, src: int, dst: int) -> None:
        self.model.copy_slot(src, dst, self.pos[src])

    def _step(self, segments: list[tuple[int, list[int], Logits]]) -> list[np.ndarray]:
        for slot, _, _ in segments:
            if not self.model.resumable(self.pos[slot], slot):
                raise TokenIndexError(f"slot {slot}: position {self.pos[slot]} cannot be run again: the "
                                      f"sliding-window layers' rings no longer hold the positions before it")
        rows: list[list[np.ndarray]] = [[] for _ in segments]  # each segment's logits, pass by pass
        done = [0] * len(segments)  # ids of each segment run so far
        while any(done[i] < len(ids) for i, (_, ids, _) in enumerate(segments)):
            call, which, room = [], [], self.rows_per_pass
            for i, (slot, ids, want) in enumerate(segments):
                take = min(len(ids) - done[i], room)
                if take > 0:
                    last = done[i] + take == len(ids)
                    call.append((slot, ids[done[i]:done[i] + take],
                                 want if want == Logits.ALL else Logits(want == Logits.LAST and last)))
                    which.append(i)
                    done[i] += take
                    room -= take
            logits, at = self._run_pass(call), 0
            for i, (_, part, want) in zip(which, call):
                n = len(part) if want == Logits.ALL else int(want)
                if n:
                    rows[i].append(logits[at:at + n])
                    at += n
        return [got[0][0] if want == Logits.LAST else np.concatenate(got)
                for (_, _, want), got in zip(segments, rows) if want]

    def _run_pass(self, call: list[tuple[int, list[int], Logits]]) -> np.ndarray:
        """One block: the segments' rows in one forward pass; the logits
        (n, vocab) of the rows their ``want`` asks for, in order."""
        ids = np.array([t for _, seg, _ in call for t in seg], dtype=np.int32)
        slots = np.array([slot for slot, _, _ in call], dtype=np.int32)
        starts = np.array([self.pos[slot] for slot, _, _ in call], dtype=np.int32)
        lens = np.array([len(seg) for _, seg, _ in call], dtype=np.int32)
        wants = np.array([want for _, _, want in call], dtype=np.int32)
        ran = self.model.run_batch(ids, slots, starts, lens, wants)
        for slot, seg, _ in call:
            self.pos[slot] += len(seg)  # every row of the block ran, finite or not
        if ran < len(ids):
            status = self.model.row_status(len(ids))
            row = 0
            for k, (slot, seg, _) in enumerate(call):
                bad = [i for i in range(len(seg)) if status[row + i] != -2]
                if bad:
                    self.pos[slot] = 0  # its cache holds a non-finite row: start over
                    error = non_finite_error(int(starts[k]) + bad[0], int(status[row + bad[0]]),
                                             self.config.n_layers)
                    raise type(error)(f"slot {slot}: {error}")
                row += len(seg)
        return self.model.batch_logits[:int(sum(len(seg) if w == Logits.ALL else int(w) for _, seg, w in call))].copy()
