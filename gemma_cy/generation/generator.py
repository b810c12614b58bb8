"""The generate loop: engine-agnostic, shared by the CLI and the Python API.

prompt ids -> engine.prefill -> [penalties, logits processors -> sample
-> stop? -> stream text -> engine.decode]*

Stop reasons (``Generation.stop_reason``, docs/generation.md#stop-reasons):
  "eos"         the model produced a stop id (<eos>, <end_of_turn>); not printed
  "stop"        a stop string appeared in the text; it and what follows are not printed
  "rejected"    ``accept_token`` returned False for the sampled id; not printed
  "grammar"     the constraint (structured output) is complete: the model
                chose end-of-sequence where the grammar allowed it (not
                printed), or the grammar takes no further token
  "max_tokens"  max_tokens tokens were generated
  "length"      the context (KV cache) is full: prompt + generated == cache_len
  "interrupted" the generation started but has not finished: the caller
                stopped iterating (``break``, Ctrl-C) and may still resume it
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from ..errors import ContextLengthError, ParameterError
from ..model.observe import Observer
from .constraint import Constraint
from .speculative import Draft
from .logprobs import TokenLogprob, token_logprob
from .params import GenerationParams
from .slot_cache import SlotCache
from .stops import StopStrings

LogitsProcessor = Callable[[list, np.ndarray], np.ndarray]


class Engine(Protocol):
    """What the loop needs of an engine (reference and fast both provide it)."""

    cache_len: int
    pos: int

    def reset(self) -> None: ...
    def prefill(self, ids: Sequence[int], observer: Observer | None = None) -> np.ndarray: ...
    def decode(self, token: int, observer: Observer | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class LogitsRequest:
    """What a generation asks of its engine between Steps: run ``ids`` at the
    next positions (``prefill``: the prompt; else one decode step) and send
    back the logits of the last. ``Generation._run`` answers at once on its
    own engine; the batch scheduler (gemma_cy.generation.batch) answers many
    generations' requests in one pass over the weights."""

    ids: list[int]
    prefill: bool
    all_logits: bool = False  # send back every position's logits (n, vocab): a speculative block
    prompt: bool = False  # the generation's prompt (what sequences with the same prompt can share)


@dataclass(frozen=True)
class Step:
    """One generated token and the text it completes (may be "" while a
    multi-byte character is still incomplete). The last Step may carry
    ``token_id=None``: the flushed tail of an incomplete character."""

    token_id: int | None
    text: str


@dataclass
class Timing:
    """Wall-clock seconds and token counts of the two phases."""

    prefill_tokens: int = 0  # prompt tokens run (not those whose cache was reused)
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    reused_tokens: int = 0  # prompt tokens already in the KV cache from an earlier generation
    drafted_tokens: int = 0  # speculative decoding: ids a draft proposed
    accepted_tokens: int = 0  # of which kept (each the id sampled at its position)
    forward_passes: int = 0  # decode passes through the model (a speculative block is one)

    @property
    def acceptance(self) -> float:
        """Drafted ids kept, as a fraction (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @staticmethod
    def _rate(tokens: int, seconds: float) -> float:
        return tokens / seconds if seconds > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self._rate(self.prefill_tokens, self.prefill_seconds)

    @property
    def decode_tok_s(self) -> float:
        return self._rate(self.decode_tokens, self.decode_seconds)


def check_prompt_fits(n_prompt: int, start_pos: int, cache_len: int) -> None:
    """Raise ContextLengthError unless the prompt leaves room to generate."""
    if n_prompt == 0:
        raise ParameterError("prompt: no tokens (an empty prompt is [BOS])")
    if start_pos + n_prompt >= cache_len:
        raise ContextLengthError(
            f"prompt: {n_prompt} tokens (starting at position {start_pos}) do not fit the "
            f"context of {cache_len} tokens (need at least one free position)")


@dataclass(frozen=True)
class Completion:
    """A finished generation: the generated ``text`` and ``ids``, why it
    stopped (and the stop string, for "stop"), the prompt's ids and the timing."""

    text: str
    ids: list[int]
    stop_reason: str
    prompt_ids: list[int]
    timing: Timing
    stop_string: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per id, when asked for (generation.logprobs)


class Generation:
    """An iterator of ``Step``s; after it ends, ``stop_reason`` says why.

    Runs the prompt from the engine's current position (so a chat can keep
    its KV cache across turns); the caller resets the engine for a fresh
    start. ``reused``: the prompt's first ``reused`` ids are already the
    cache's last positions (``SlotCache.reuse_prefix``), so only the rest
    runs; the generation is the same, bit for bit, as with all of it run
    (docs/numerics.md#batch-invariance). ``cache`` (gemma_cy.generation.slot_cache) tracks the KV cache: a
    generation whose cache another one took over raises
    GenerationStateError when resumed.
    """

    def __init__(self, engine: Engine, tokenizer, prompt_ids: Sequence[int],
                 params: GenerationParams = GenerationParams(), *, stop_ids: frozenset[int] = frozenset(),
                 cache: SlotCache | None = None, reused: int = 0, constraint: Constraint | None = None,
                 speculative: Draft | None = None):
        self.params = params  # its settings, checked when it was built (generation.params)
        self.engine, self.tokenizer, self.sampler = engine, tokenizer, params.sampler()
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = params.max_tokens
        self.stop_ids = frozenset(stop_ids) if params.terminate_on_eos else frozenset()
        self.observer = params.observer
        self.stop = params.stop
        self.processors = params.logits_processor or ()
        self.accept_token = params.accept_token
        self.top_logprobs = params.logprobs
        self.logprobs: list[TokenLogprob] = []  # one per generated id, when ``top_logprobs`` is not None
        self.penalties = params.penalties()
        self.constraint = constraint  # generation.constraint: which ids the grammar allows next
        if speculative is not None and self.observer is not None:
            raise ParameterError("speculative: an observed generation runs one position at a time")
        self.speculative = speculative  # generation.speculative: drafts checked in blocks
        if not 0 <= reused < max(len(self.prompt_ids), 1) or reused > engine.pos:
            raise ParameterError(f"reused = {reused}: must leave at least one of the prompt's "
                                 f"{len(self.prompt_ids)} ids to run and be at most the cache's {engine.pos}")
        self.reused = reused
        check_prompt_fits(len(self.prompt_ids) - reused, engine.pos, engine.cache_len)
        if cache is None:  # a bare engine: positions already filled hold ids we were not told
            cache = SlotCache(engine)
            cache.ids = [-1] * engine.pos
        self.cache = cache
        self.context_ids: list[int] = list(cache.ids[:engine.pos - reused])  # everything before the prompt
        cache.claim(self)
        self.generated_ids: list[int] = []
        self.text = ""
        self.stop_token: int | None = None
        self.stop_string: str | None = None
        self.timing = Timing()
        self._reason: str | None = None
        self._started = False
        self._iterator = self._run()

    @property
    def stop_reason(self) -> str | None:
        """Why it ended; "interrupted" while started and unfinished; None before the first step."""
        if self._reason is not None:
            return self._reason
        return "interrupted" if self._started else None

    @stop_reason.setter
    def stop_reason(self, reason: str | None) -> None:
        self._reason = reason

    @property
    def finished(self) -> bool:
        return self._reason is not None and self._reason != "interrupted"

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        if not self.finished:
            self.cache.check(self)
        self._started = True
        if self._reason == "interrupted":  # resumed after the CLI marked it
            self._reason = None
        return next(self._iterator)

    def complete(self) -> Completion:
        """Run to the end (or on from where it was left) and return the Completion."""
        for _ in self:
            pass
        return self.completion()

    def completion(self) -> Completion:
        """What the generation has made so far, as a Completion."""
        return Completion(self.text, list(self.generated_ids), self.stop_reason, list(self.prompt_ids),
                          self.timing, self.stop_string,
                          None if self.top_logprobs is None else list(self.logprobs))

    @property
    def max_new_tokens(self) -> int:
        """max_tokens clamped so that prompt + generated fits the context."""
        room = self.engine.cache_len - len(self.context_ids) - len(self.prompt_ids)
        return min(self.max_tokens, room)

    def _next_logits(self, logits: np.ndarray) -> np.ndarray:
        """The logits the sampler sees: penalized, then each processor's, in order."""
        if not self.processors and not self.penalties.active:
            return logits
        context = self.context_ids + self.prompt_ids + self.generated_ids
        x = np.array(logits, dtype=np.float32, copy=True)  # (vocab,) writable
        self.penalties.apply(context, x)
        for proc in self.processors:
            out = proc(list(context), x)
            out = np.asarray(x if out is None else out)
            if out.shape != x.shape or not np.issubdtype(out.dtype, np.floating):
                raise ParameterError(f"logits_processor {proc!r} returned shape {out.shape} dtype "
                                     f"{out.dtype}; expected float {x.shape}")
            x = np.array(out, dtype=np.float32, copy=True)
        return x

    def _finish(self, reason: str, token: int | None = None) -> None:
        self._reason, self.stop_token = reason, token

    def _draft(self, n_run: int, budget: int) -> list[int]:
        """The speculative draft to run after ``n_run`` ids, or []: room for
        it in the budget (the id sampled after it needs none) and the cache."""
        if self.speculative is None:
            return []
        room = min(budget - len(self.generated_ids) - 1, self.engine.cache_len - self.engine.pos - n_run)
        return self.speculative.propose(self.context_ids + self.prompt_ids + self.generated_ids, room)

    def _drop_draft(self, draft: list[int], kept: int, drafted: int) -> list[int]:
        """Record the block's outcome and rewind its unmatched positions out
        of the KV cache (and the cache's ids). Returns the ids to run
        again if the rewind had to empty a sliding-window ring (none when
        drafts stay within its slack, as they do)."""
        if drafted:
            self.speculative.record(drafted, kept)
            self.timing.drafted_tokens += drafted
            self.timing.accepted_tokens += kept
        if not draft:
            return []
        ids = self.cache.ids
        target = len(ids) - len(draft)
        start = self.engine.rewind(target)
        lost = ids[start:target]
        del ids[start:]
        return lost

    def _run(self) -> Iterator[Step]:
        """The generation on its own engine: ``steps``' LogitsRequests
        answered at once, its Steps passed on."""
        steps = self.steps()
        try:
            request = next(steps)
            while True:
                if isinstance(request, LogitsRequest):
                    if request.all_logits:
                        logits = self.engine.logits_of(self.engine.states(request.ids))
                    elif request.prefill:
                        logits = self.engine.prefill(request.ids, self.observer)
                    else:
                        logits = self.engine.decode(request.ids[0], self.observer)
                    request = steps.send(logits)
                else:
                    yield request
                    request = next(steps)
        except StopIteration:
            return

    def steps(self) -> Iterator[Step | LogitsRequest]:
        """The generate loop without an engine: yields a LogitsRequest where it
        needs logits (and is sent them), and a Step per token shown."""
        budget = self.max_new_tokens
        decoder = self.tokenizer.stream_decoder(prev_id=self.prompt_ids[-1])
        stops = StopStrings(self.stop)
        ids = self.cache.ids
        start = time.perf_counter()
        logits = yield LogitsRequest(self.prompt_ids[self.reused:], prefill=True, prompt=True)
        ids.extend(self.prompt_ids[self.reused:])
        if self.speculative is not None:  # (a draft model runs the prompt too)
            self.speculative.prefill(self.context_ids + self.prompt_ids)
        self.timing.prefill_seconds = time.perf_counter() - start
        self.timing.prefill_tokens = len(self.prompt_ids) - self.reused
        self.timing.reused_tokens = self.reused
        decode_start = time.perf_counter()
        constraint = self.constraint
        draft: list[int] = []  # speculative: drafted ids whose positions ran, not yet matched
        rows = None  # the logits after each of them
        kept = drafted = 0  # of the current block
        stopped = False
        while True:
            if constraint is not None and constraint.finished:
                self._finish("grammar")
                break
            if len(self.generated_ids) >= budget:
                self._finish("max_tokens" if budget == self.max_tokens else "length")
                break
            seen = self._next_logits(logits)
            if constraint is not None:
                seen = constraint.mask(seen)
            token = self.sampler.sample(seen)
            if token in self.stop_ids:
                self._finish("eos" if constraint is None else "grammar", token)
                break
            if self.accept_token is not None and not self.accept_token(token):
                self._finish("rejected", token)
                break
            if self.top_logprobs is not None:
                self.logprobs.append(token_logprob(seen, token, self.top_logprobs))
            if constraint is not None:
                constraint.consume(token)
            run = [token]
            if constraint is not None:  # ids the grammar allows alone follow without sampling
                forced = constraint.forced_ids(budget - len(self.generated_ids) - 1, self.stop_ids)
                run += forced
                if self.top_logprobs is not None:  # the only id allowed: probability 1
                    self.logprobs += [TokenLogprob(f, 0.0, ((f, 0.0),)[:self.top_logprobs]) for f in forced]
            stopped = False
            for shown_id in run:
                self.generated_ids.append(shown_id)
                shown = stops.push(decoder.push(shown_id))
                self.text += shown
                if stops.found is not None:
                    del self.logprobs[len(self.generated_ids):]  # (forced ids after the stop are not kept)
                    self.stop_string = stops.found
                    self._finish("stop", shown_id)
                    stopped = True
                yield Step(shown_id, shown)
                if stopped:
                    break
            if stopped:
                break
            if len(self.generated_ids) < budget and not (constraint is not None and constraint.finished):
                if draft and draft[:len(run)] == run:  # the draft held: these positions ran already
                    logits, rows, draft = rows[len(run) - 1], rows[len(run):], draft[len(run):]
                    kept += len(run)
                else:
                    lost = self._drop_draft(draft, kept, drafted)
                    if lost:  # (a ring reset by the rewind: run what it dropped again)
                        yield LogitsRequest(lost, prefill=True)
                        ids.extend(lost)
                    draft, kept, drafted = self._draft(len(run), budget), 0, 0
                    if draft:
                        rows = yield LogitsRequest(run + draft, prefill=True, all_logits=True)
                        ids.extend(run + draft)
                        logits, rows, drafted = rows[len(run) - 1], rows[len(run):], len(draft)
                    else:
                        logits = yield LogitsRequest(run, prefill=len(run) > 1)
                        ids.extend(run)
                    self.timing.forward_passes += 1
                self.timing.decode_tokens += len(run)
                self.timing.decode_seconds = time.perf_counter() - decode_start
        lost = self._drop_draft(draft, kept, drafted)
        if lost:
            yield LogitsRequest(lost, prefill=True)
            ids.extend(lost)
        if stopped:
            return
        tail = stops.push(decoder.flush())
        if stops.found is not None:
            self.stop_string = stops.found
            self._reason = "stop"
        tail += stops.flush()
        if tail:
            self.text += tail
            yield Step(None, tail)
