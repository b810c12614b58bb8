"""Several generations at once on a batch engine: continuous batching
(docs/generation.md#batching).

Each sequence is an ordinary ``Generation`` (the same sampler, penalties,
processors, stop strings and stop reasons as one run alone) on one slot of
a batch engine (``SlotEngine``). Instead of running its own engine calls,
the scheduler drives each generation's ``steps()``: every step it takes
the decode request of every running sequence and, in the room left in one
pass of the forward pass, the next chunk of a waiting prompt, runs them
all in one ``step`` of the batch engine, and sends each sequence its
logits. A sequence joins when a slot is free and leaves when it ends; a
running sequence waits at most one chunk of another's prompt per token.
A speculative sequence's block (its last id and its draft) runs whole in
the step, every position's logits sent back, as a decode row is.
Each one's tokens are those it gets alone (docs/numerics.md#batch-invariance).
Sequences with the same prompt (``n`` samples of one prompt) that run at
the same time prefill it once: the others take a copy of its KV cache and
logits. Each slot's cache outlives its sequence (``SlotCache``): a sequence
joins the free slot whose cache shares the longest prefix with its prompt
and runs only the rest (a conversation's next turn, a prompt that extends
an earlier one).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import ParameterError
from ..model.checks import Logits
from .generator import Completion, LogitsRequest, Generation, Step
from .slot_cache import SlotCache

DEFAULT_ROWS_PER_STEP = 64  # for an engine that does not say (the reference)


class SlotEngine:
    """Slot ``slot`` of a batch engine with the one-sequence engine interface
    (``config``, ``cache_len``, ``pos``, ``reset``, ``rewind``, ``prefill``,
    ``decode``): what a Generation and a SlotCache need."""

    def __init__(self, batch, slot: int):
        self.batch, self.slot = batch, slot
        self.config, self.cache_len = batch.config, batch.cache_len

    @property
    def pos(self) -> int:
        return self.batch.pos[self.slot]

    def reset(self) -> None:
        self.batch.reset(self.slot)

    def rewind(self, pos: int) -> int:
        return self.batch.rewind(self.slot, pos)

    def prefill(self, ids: Sequence[int], observer=None) -> np.ndarray:
        _no_observer(observer)
        return self.batch.step([(self.slot, ids, Logits.LAST)])[0]

    def decode(self, token: int, observer=None) -> np.ndarray:
        _no_observer(observer)
        return self.batch.step([(self.slot, [token], Logits.LAST)])[0]


def _no_observer(observer) -> None:
    if observer is not None:
        raise ParameterError("observer: a batched sequence cannot be observed; run it alone (generate)")


@dataclass
class _Running:
    """A sequence in a slot: its generation, its steps, and the request it waits on."""

    index: int
    generation: Generation
    steps: Iterator
    request: LogitsRequest
    prefilled: int = 0  # ids of a prefill request already run
    copies_to: list[int] = field(default_factory=list)  # slots whose sequences have this prompt and wait on its run
    waits_on: int | None = None  # the slot running this sequence's prompt, whose cache it takes when done


class Scheduler:
    """Continuous batching over ``batch``'s slots: ``add`` a sequence at any
    time (it waits for a free slot, in order), ``cancel`` one, and ``step``
    advances every running sequence by one pass of the forward pass,
    yielding ``(index, Step)`` as tokens come. ``slot_caches[s]`` is slot s's
    cache and owner (None: fresh ones, for this scheduler alone);
    ``on_finish(index)`` is called as each sequence ends (cancelled ones too)."""

    def __init__(self, batch, slot_caches: list[SlotCache] | None = None,
                 on_finish: Callable[[int], None] | None = None):
        self.batch = batch
        self.slot_caches = slot_caches if slot_caches is not None else \
            [SlotCache(SlotEngine(batch, s), s) for s in range(batch.n_slots)]
        self.on_finish = on_finish
        self.rows = getattr(batch, "rows_per_pass", DEFAULT_ROWS_PER_STEP)
        self.generations: list[Generation | None] = []  # sequence i's, None until it joins (or if cancelled first)
        self._makers: list[Callable[[SlotEngine, SlotCache, int], Generation] | None] = []
        self._prompts: list[list[int]] = []
        self.waiting: deque[int] = deque()
        self.free: deque[int] = deque(range(batch.n_slots))
        self.running: dict[int, _Running] = {}  # slot -> sequence, in the order they joined

    @property
    def busy(self) -> bool:
        """True while a sequence waits or runs."""
        return bool(self.waiting or self.running)

    def add(self, prompt: list[int], maker: Callable[[SlotEngine, SlotCache, int], Generation]) -> int:
        """Queue a sequence: ``maker(engine, cache, reused)`` makes its
        Generation of ``prompt`` when it joins a slot. Returns its index."""
        self._prompts.append(list(prompt))
        self._makers.append(maker)
        self.generations.append(None)
        self.waiting.append(len(self._makers) - 1)
        return len(self._makers) - 1

    def cancel(self, index: int) -> None:
        """End sequence ``index`` now: a waiting one never runs, a running one
        stops with stop_reason "cancelled" and its slot is free for the next
        step. Nothing for one that has ended."""
        if index in self.waiting:
            self.waiting.remove(index)
            self._finished(index)
            return
        for slot, seq in list(self.running.items()):
            if seq.index == index:
                if seq.waits_on is not None:  # that slot must not copy into this one once another has it
                    self.running[seq.waits_on].copies_to.remove(slot)
                seq.steps.close()
                seq.generation.stop_reason = "cancelled"
                self._leave(slot, seq)
                for other in seq.copies_to:  # they wait on a prefill that will not finish: run their own
                    self.running[other].waits_on = None
                return

    def forget(self, index: int) -> None:
        """Drop an ended sequence's Generation and prompt (a long-running
        scheduler keeps nothing of what it has finished)."""
        self.generations[index] = None
        self._prompts[index] = []

    def step(self) -> Iterator[tuple[int, Step]]:
        """Join waiting sequences to free slots, run one pass of the forward
        pass for every running one, and yield their Steps."""
        self._join()
        running, batch = self.running, self.batch
        for seq in running.values():  # GenerationStateError (naming the slot) if another took it over
            seq.generation.cache.check(seq.generation)
        segments, room = [], self.rows
        for slot, seq in running.items():  # every decoding sequence: one row, or its speculative block
            if seq.request.all_logits:
                segments.append((slot, seq.request.ids, Logits.ALL))
                room -= len(seq.request.ids)
            elif not seq.request.prefill:
                segments.append((slot, seq.request.ids, Logits.LAST))
                room -= 1
        for slot, seq in running.items():  # then prompts, as much as one pass has room for
            if seq.request.prefill and not seq.request.all_logits and seq.waits_on is None and room > 0:
                part = seq.request.ids[seq.prefilled:seq.prefilled + room]
                seq.prefilled += len(part)
                room -= len(part)
                segments.append((slot, part, Logits(seq.prefilled == len(seq.request.ids))))
        if not segments:
            return
        outs = iter(batch.step(segments))
        for slot, _, want in segments:
            if not want:
                continue
            logits = next(outs)
            seq = running[slot]
            shared = [(other, running[other]) for other in seq.copies_to]
            for other, _ in shared:  # the same prompt: the same cache and logits, copied
                batch.copy(slot, other)
            seq.copies_to = []
            for s, sq in [(slot, seq)] + shared:
                sq.waits_on = None
                for step in self._advance(sq, logits if sq is seq else logits.copy()):
                    yield sq.index, step
                if sq.request is None:  # finished: leave
                    self._leave(s, sq)

    def _join(self) -> None:
        while self.waiting and self.free:
            i = self.waiting.popleft()
            slot = self._slot_for(self._prompts[i], self.free)
            self.free.remove(slot)
            cache = self.slot_caches[slot]
            reused = cache.reuse_prefix(self._prompts[i])
            generation = self._makers[i](SlotEngine(self.batch, slot), cache, reused)
            self._makers[i] = None
            self.generations[i] = generation
            generation._started = True
            steps = generation.steps()
            seq = self.running[slot] = _Running(i, generation, steps, next(steps))
            runner = self._same_prompt(self.running, seq)
            if runner is not None:  # the prompt is being run already: take its cache when it is done
                seq.waits_on = runner
                self.running[runner].copies_to.append(slot)

    def _leave(self, slot: int, seq: _Running) -> None:
        del self.running[slot]
        self.free.append(slot)
        self._finished(seq.index)

    def _finished(self, index: int) -> None:
        if self.on_finish is not None:
            self.on_finish(index)

    def _slot_for(self, prompt: list[int], free: deque) -> int:
        """The free slot whose cache shares the longest prefix with ``prompt``,
        one that no unfinished generation (a ``generate`` left open) holds
        first; on a tie, the one free the longest."""
        def rank(s: int):
            owner = self.slot_caches[s].owner
            idle = owner is None or getattr(owner, "finished", True)
            return idle, self.slot_caches[s].shared_prefix(prompt), -free.index(s)
        return max(free, key=rank)

    @staticmethod
    def _same_prompt(running: dict[int, _Running], seq: _Running) -> int | None:
        """The slot of a running sequence whose prompt, still to finish its
        prefill, is ``seq``'s own, or None."""
        for slot, other in running.items():
            if other is not seq and other.waits_on is None and other.request is not None \
                    and other.request.prompt and other.generation.prompt_ids == seq.generation.prompt_ids:
                return slot
        return None

    @staticmethod
    def _advance(seq: _Running, logits: np.ndarray) -> Iterator[Step]:
        """Send ``seq`` its logits and pass on its Steps up to its next request
        (``seq.request`` None when it has ended). GenerationStateError if
        another generation took its slot over meanwhile."""
        seq.generation.cache.check(seq.generation)
        try:
            value = seq.steps.send(logits)
            while isinstance(value, Step):
                yield value
                value = next(seq.steps)
        except StopIteration:
            seq.request = None
            return
        seq.request, seq.prefilled = value, 0


class BatchGeneration:
    """What ``Model.generate_many`` returns: iterate it for ``(index, Step)``
    as tokens arrive, from whichever sequence made them; ``generations[i]``
    is sequence i's Generation (None until it joined) with its text,
    stop_reason and timing; ``complete()`` runs to the end and returns the
    Completions in the order of the prompts. ``makers[i](engine, cache,
    reused)`` makes sequence i's Generation of ``prompts[i]`` on ``scheduler``."""

    def __init__(self, scheduler: Scheduler, makers: list[Callable[[SlotEngine, SlotCache, int], Generation]],
                 prompts: list[list[int]]):
        if len(prompts) != len(makers):
            raise ParameterError(f"{len(makers)} sequences and {len(prompts)} prompts")
        self.scheduler = scheduler
        for prompt, maker in zip(prompts, makers):
            self.scheduler.add(prompt, maker)
        self._iterator = self._run()

    @property
    def generations(self) -> list[Generation | None]:
        return self.scheduler.generations

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, Step]:
        return next(self._iterator)

    def complete(self) -> list[Completion]:
        for _ in self:
            pass
        return [g.completion() for g in self.generations]

    def _run(self) -> Iterator[tuple[int, Step]]:
        while self.scheduler.busy:
            yield from self.scheduler.step()
