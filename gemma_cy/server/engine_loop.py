"""The engine thread of `gemma-cy serve` (docs/server.md#scheduling).

One thread owns the model and runs its batch scheduler
(gemma_cy.generation.batch.Scheduler): sequences submitted from any thread
wait in a bounded queue, join the running batch as slots free, and every
step is one pass over the weights for all of them. The forward pass runs
with the GIL released, so the HTTP event loop keeps serving meanwhile; it
never waits on this thread. Each sequence reports to its ``sink`` (called
on this thread): a ``TokenEvent`` per token, a ``DoneEvent`` when it ends,
or an ``ErrorEvent`` if its step failed.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import GemmaCyError
from ..generation.generator import Completion, Step
from ..generation.logprobs import TokenLogprob
from ..generation.params import GenerationParams


@dataclass(frozen=True)
class TokenEvent:
    """One generated token (``logprob`` when the request asked for them)."""

    step: Step
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class DoneEvent:
    """The sequence ended: its Completion (None: cancelled before it joined a batch)."""

    completion: Completion | None


@dataclass(frozen=True)
class ErrorEvent:
    """The sequence's step failed (one line)."""

    message: str


Event = TokenEvent | DoneEvent | ErrorEvent
Sink = Callable[[Event], None]


class QueueFull(GemmaCyError):
    """More sequences than the running batch and the queue can hold."""


class ShuttingDown(GemmaCyError):
    """The server was told to stop: it takes no new sequences (HTTP 503)."""


@dataclass(eq=False)
class Ticket:
    """One submitted sequence: its prompt, settings and sink; ``index`` in
    the scheduler once the engine thread took it in."""

    ids: list[int]
    params: GenerationParams
    sink: Sink
    index: int | None = None
    cancelled: bool = False


@dataclass
class LoopStats:
    """What /metrics and /health read (updated by the engine thread)."""

    live: int = 0  # sequences in slots
    waiting: int = 0  # sequences queued for a slot
    decode_tok_s: float = 0.0  # tokens per second of the last busy second
    prompt_tokens: int = 0
    generated_tokens: int = 0
    _window: list = field(default_factory=list)  # (time, tokens) of recent steps


class EngineLoop:
    """The model's one engine thread. ``max_queue``: sequences that may wait
    beyond the ``max_sequences`` running ones (more: QueueFull)."""

    def __init__(self, model, max_queue: int):
        self.model = model
        self.capacity = model.max_sequences + max_queue
        self.scheduler = model.scheduler(on_finish=self._finished)
        self.stats = LoopStats()
        self._cond = threading.Condition()
        self._inbox: list[Ticket] = []
        self._cancels: list[Ticket] = []
        self._by_index: dict[int, Ticket] = {}
        self._pending = 0  # submitted and not yet ended
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gemma-cy engine", daemon=True)
        self._thread.start()

    @property
    def accepting(self) -> bool:
        return not self._closed and self._pending < self.capacity

    @property
    def stopping(self) -> bool:
        """True once ``stop_accepting`` (or ``close``) was called."""
        return self._closed

    @property
    def idle(self) -> bool:
        """True when no submitted sequence is still running or queued."""
        return self._pending == 0

    def submit(self, sequences: list[tuple[list[int], GenerationParams, Sink]]) -> list[Ticket]:
        """Queue every sequence of one request, or none (QueueFull)."""
        with self._cond:
            if self._closed:
                raise ShuttingDown("the server is shutting down; retry on another")
            if self._pending + len(sequences) > self.capacity:
                raise QueueFull(f"{self._pending} sequences running or queued, room for {self.capacity}")
            tickets = [Ticket(list(ids), params, sink) for ids, params, sink in sequences]
            self._inbox.extend(tickets)
            self._pending += len(tickets)
            self._cond.notify()
        return tickets

    def cancel(self, tickets: list[Ticket]) -> None:
        """End these sequences at the next step (their slots freed)."""
        with self._cond:
            for t in tickets:
                if not t.cancelled:
                    t.cancelled = True
                    self._cancels.append(t)
            self._cond.notify()

    def cancel_all(self) -> None:
        with self._cond:
            tickets = list(self._inbox) + list(self._by_index.values())
        self.cancel(tickets)

    def stop_accepting(self) -> None:
        """Take no new sequence (``submit`` raises ShuttingDown); what was
        submitted runs on, and the thread ends once nothing runs."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def close(self, timeout: float | None = 5.0) -> None:
        """``stop_accepting``, and wait up to ``timeout`` s for the thread to end."""
        self.stop_accepting()
        self._thread.join(timeout)

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._cond:
                while not (self._inbox or self._cancels or scheduler.busy or self._closed):
                    self._cond.wait()
                if self._closed and not (self._inbox or scheduler.busy):
                    return
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
            for t in inbox:
                t.index = scheduler.add(t.ids, self._maker(t))
                self._by_index[t.index] = t
                self.stats.prompt_tokens += len(t.ids)
            for t in cancels:
                if t.index is not None:
                    scheduler.cancel(t.index)
            self._step()

    def _maker(self, ticket: Ticket):
        return functools.partial(self.model.slot_generation, ticket.ids, ticket.params)

    def _step(self) -> None:
        scheduler = self.scheduler
        tokens = 0
        try:
            for index, step in scheduler.step():
                ticket = self._by_index.get(index)
                if ticket is None:
                    continue
                g = scheduler.generations[index]
                lp = g.logprobs[-1] if step.token_id is not None and g.top_logprobs is not None else None
                tokens += step.token_id is not None
                ticket.sink(TokenEvent(step, lp))
        except Exception as e:  # noqa: BLE001 - one failed step must not end the server
            message = f"{type(e).__name__}: {e}" if not isinstance(e, GemmaCyError) else str(e)
            for slot, seq in list(scheduler.running.items()):
                ticket = self._by_index.get(seq.index)
                if ticket is not None:
                    ticket.sink(ErrorEvent(message))
                    self._by_index.pop(seq.index, None)
                scheduler.cancel(seq.index)
        self._count(tokens)

    def _count(self, tokens: int) -> None:
        s, now = self.stats, time.perf_counter()
        s.generated_tokens += tokens
        s._window.append((now, tokens))
        while s._window and now - s._window[0][0] > 1.0:
            s._window.pop(0)
        span = now - s._window[0][0] if len(s._window) > 1 else 0.0
        s.decode_tok_s = sum(n for _, n in s._window[1:]) / span if span > 0 else 0.0
        s.live, s.waiting = len(self.scheduler.running), len(self.scheduler.waiting)

    def _finished(self, index: int) -> None:
        ticket = self._by_index.pop(index, None)
        g = self.scheduler.generations[index]
        self.scheduler.forget(index)  # the server keeps no finished generation
        with self._cond:
            self._pending -= 1
        if ticket is not None:
            ticket.sink(DoneEvent(None if g is None else g.completion()))
