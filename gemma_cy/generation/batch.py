"""Several generations at once on a batch engine: continuous batching
(docs/generation.md#batching).

Each sequence is an ordinary ``Generation`` (the same sampler, penalties,
processors, stop strings and stop reasons as one run alone) on one slot of
a batch engine (``SlotEngine``). Instead of running its own engine calls,
the scheduler drives each generation's ``machine()``: every step it takes
the decode request of every running sequence and, in the room left in one
pass of the forward pass, the next chunk of a waiting prompt, runs them
all in one ``step`` of the batch engine, and sends each sequence its
logits. A sequence joins when a slot is free and leaves when it ends; a
running sequence waits at most one chunk of another's prompt per token.
Each one's tokens are those it gets alone (docs/numerics.md#batch-invariance).
Sequences with the same prompt (``n`` samples of one prompt) that run at
the same time prefill it once: the others take a copy of its KV cache and
logits.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import ParameterError
from .generator import Completion, Forward, Generation, Step
from .session import Session

DEFAULT_ROWS_PER_STEP = 64  # for an engine that does not say (the reference)


class SlotEngine:
    """Slot ``slot`` of a batch engine with the one-sequence engine interface
    (``config``, ``cache_len``, ``pos``, ``reset``, ``rewind``, ``prefill``,
    ``decode``): what a Generation and a Session need."""

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
        return self.batch.step([(self.slot, ids, True)])[0]

    def decode(self, token: int, observer=None) -> np.ndarray:
        _no_observer(observer)
        return self.batch.step([(self.slot, [token], True)])[0]


def _no_observer(observer) -> None:
    if observer is not None:
        raise ParameterError("observer: a batched sequence cannot be observed; run it alone (generate)")


@dataclass
class _Running:
    """A sequence in a slot: its generation, its machine, and the request it waits on."""

    index: int
    generation: Generation
    machine: Iterator
    request: Forward
    fed: int = 0  # ids of a prefill request already run
    followers: list[int] = field(default_factory=list)  # slots whose sequences share this prompt, waiting on it
    leader: int | None = None  # the slot whose prefill this sequence waits on


@dataclass
class BatchGeneration:
    """What ``Model.generate_many`` returns: iterate it for ``(index, Step)``
    as tokens arrive, from whichever sequence made them; ``generations[i]``
    is sequence i's Generation (None until it joined) with its text,
    stop_reason and timing; ``complete()`` runs to the end and returns the
    Completions in the order of the prompts."""

    batch: object
    makers: list[Callable[[SlotEngine, Session], Generation]]
    on_finish: Callable[[int], None] | None = None  # called with a sequence's index as it ends
    generations: list[Generation | None] = field(default_factory=list)

    def __post_init__(self):
        self.generations = [None] * len(self.makers)
        self._iterator = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, Step]:
        return next(self._iterator)

    def complete(self) -> list[Completion]:
        for _ in self:
            pass
        return [Completion(g.text, list(g.generated_ids), g.stop_reason, list(g.prompt_ids), g.timing,
                           g.stop_string) for g in self.generations]

    def _run(self) -> Iterator[tuple[int, Step]]:
        batch = self.batch
        rows = getattr(batch, "rows_per_pass", DEFAULT_ROWS_PER_STEP)
        waiting = deque(range(len(self.makers)))
        free = deque(range(batch.n_slots))
        running: dict[int, _Running] = {}  # slot -> sequence, in the order they joined
        while waiting or running:
            while waiting and free:  # join
                i, slot = waiting.popleft(), free.popleft()
                engine = SlotEngine(batch, slot)
                engine.reset()
                generation = self.makers[i](engine, Session(engine))
                self.generations[i] = generation
                generation._started = True
                machine = generation.machine()
                seq = running[slot] = _Running(i, generation, machine, next(machine))
                leader = self._same_prompt(running, seq)
                if leader is not None:  # the prompt is being run already: take its cache when it is done
                    seq.leader = leader
                    running[leader].followers.append(slot)
            segments, room = [], rows
            for slot, seq in running.items():  # every decoding sequence, one row each
                if not seq.request.prefill:
                    segments.append((slot, seq.request.ids, True))
                    room -= 1
            for slot, seq in running.items():  # then prompts, as much as one pass has room for
                if seq.request.prefill and seq.leader is None and room > 0:
                    part = seq.request.ids[seq.fed:seq.fed + room]
                    seq.fed += len(part)
                    room -= len(part)
                    segments.append((slot, part, seq.fed == len(seq.request.ids)))
            outs = iter(batch.step(segments))
            for slot, _, want in segments:
                if not want:
                    continue
                logits = next(outs)
                seq = running[slot]
                shared = [(f, running[f]) for f in seq.followers]
                for follower, _ in shared:  # the same prompt: the same cache and logits, copied
                    batch.copy(slot, follower)
                seq.followers = []
                for s, sq in [(slot, seq)] + shared:
                    sq.leader = None
                    for step in self._advance(sq, logits if sq is seq else logits.copy()):
                        yield sq.index, step
                    if sq.request is None:  # finished: leave
                        del running[s]
                        free.append(s)
                        if self.on_finish is not None:
                            self.on_finish(sq.index)

    @staticmethod
    def _same_prompt(running: dict[int, _Running], seq: _Running) -> int | None:
        """The slot of a running sequence whose prompt, still to finish its
        prefill, is ``seq``'s own, or None."""
        for slot, other in running.items():
            if other is not seq and other.leader is None and other.request is not None \
                    and other.request.prefill and other.request.ids == seq.request.ids:
                return slot
        return None

    @staticmethod
    def _advance(seq: _Running, logits: np.ndarray) -> Iterator[Step]:
        """Send ``seq`` its logits and pass on its Steps up to its next request
        (``seq.request`` None when it has ended)."""
        try:
            value = seq.machine.send(logits)
            while isinstance(value, Step):
                yield value
                value = next(seq.machine)
        except StopIteration:
            seq.request = None
            return
        seq.request, seq.fed = value, 0
