"""The generate loop: engine-agnostic, shared by the CLI and the Python API.

prompt ids -> engine.prefill -> [sample -> stop? -> stream text -> engine.decode]*

Stop reasons (``Generation.stop_reason``):
  "eos"         the model produced a stop id (<eos>, <end_of_turn>); not printed
  "max_tokens"  n_dec tokens were generated
  "length"      the context (KV cache) is full: prompt + generated == cache_len
  "interrupted" the caller stopped iterating early (e.g. Ctrl-C)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from ..errors import ContextLengthError, ParameterError
from ..model.observe import Observer
from .sampling import Sampler


class Engine(Protocol):
    """What the loop needs of an engine (reference and fast both provide it)."""

    cache_len: int
    pos: int

    def reset(self) -> None: ...
    def prefill(self, ids: Sequence[int], observer: Observer | None = None) -> np.ndarray: ...
    def decode(self, token: int, observer: Observer | None = None) -> np.ndarray: ...


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

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

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


@dataclass
class Generation:
    """An iterator of ``Step``s; after it ends, ``stop_reason`` says why.

    Runs the prompt from the engine's current position (so a chat can keep
    its KV cache across turns); the caller resets the engine for a fresh start.
    """

    engine: Engine
    tokenizer: object  # GreedyTokenizer-like: stream_decoder()
    sampler: Sampler
    prompt_ids: list[int]
    n_dec: int
    stop_ids: frozenset[int] = frozenset()
    observer: Observer | None = None
    generated_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    stop_token: int | None = None
    timing: Timing = field(default_factory=Timing)

    def __post_init__(self) -> None:
        if isinstance(self.n_dec, bool) or not isinstance(self.n_dec, int) or self.n_dec < 0:
            raise ParameterError(f"n_dec = {self.n_dec!r}, must be an integer >= 0")
        check_prompt_fits(len(self.prompt_ids), self.engine.pos, self.engine.cache_len)
        self._iterator = self._run()

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        return next(self._iterator)

    @property
    def max_new_tokens(self) -> int:
        """n_dec clamped so that prompt + generated fits the context."""
        room = self.engine.cache_len - self.engine.pos - len(self.prompt_ids)
        return min(self.n_dec, room)

    def _run(self) -> Iterator[Step]:
        budget = self.max_new_tokens
        decoder = self.tokenizer.stream_decoder(prev_id=self.prompt_ids[-1])
        try:
            start = time.perf_counter()
            logits = self.engine.prefill(self.prompt_ids, self.observer)
            self.timing.prefill_seconds = time.perf_counter() - start
            self.timing.prefill_tokens = len(self.prompt_ids)
            decode_start = time.perf_counter()
            while True:
                if len(self.generated_ids) >= budget:
                    self.stop_reason = "max_tokens" if budget == self.n_dec else "length"
                    break
                token = self.sampler.sample(logits)
                if token in self.stop_ids:
                    self.stop_reason, self.stop_token = "eos", token
                    break
                self.generated_ids.append(token)
                piece = decoder.push(token)
                self.text += piece
                yield Step(token, piece)
                if len(self.generated_ids) < budget:
                    logits = self.engine.decode(token, self.observer)
                    self.timing.decode_tokens += 1
                    self.timing.decode_seconds = time.perf_counter() - decode_start
            tail = decoder.flush()
            if tail:
                self.text += tail
                yield Step(None, tail)
        except GeneratorExit:
            self.stop_reason = self.stop_reason or "interrupted"
            raise
        finally:
            if self.stop_reason is None:
                self.stop_reason = "interrupted"
