"""Repetition penalties: logits of recently seen tokens pushed down (docs/generation.md#penalties).

llama.cpp's three, with its definitions, over the last ``repeat_last_n``
ids of the context (prompt and generated alike); for each distinct id ``t``
seen ``c`` times there:

    repeat_penalty   logit[t] /= r if logit[t] > 0 else logit[t] *= r
    frequency        logit[t] -= c * frequency_penalty
    presence         logit[t] -= presence_penalty

The defaults (1, 0, 0) change nothing, and then no work is done.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ParameterError

DEFAULT_REPEAT_LAST_N = 64


def _finite(name: str, value, lo: float, lo_open: bool = False) -> float:
    """``value`` as a float, finite and >= lo (> lo if ``lo_open``); ParameterError otherwise."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))
    v = float(value) if ok else float("nan")
    if not math.isfinite(v) or v < lo or (lo_open and v == lo):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise ParameterError(f"{name} must be a finite number {bound}, got {value!r}")
    return v


@dataclass(frozen=True)
class Penalties:
    """The three penalties and the window they look back over."""

    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N

    def __post_init__(self) -> None:
        object.__setattr__(self, "repeat_penalty", _finite("repeat_penalty", self.repeat_penalty, 0.0, True))
        # presence and frequency may be negative (encourage repeats), as in llama.cpp and OpenAI
        object.__setattr__(self, "presence_penalty",
                           _finite("presence_penalty", self.presence_penalty, -math.inf))
        object.__setattr__(self, "frequency_penalty",
                           _finite("frequency_penalty", self.frequency_penalty, -math.inf))
        n = self.repeat_last_n
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ParameterError(f"repeat_last_n must be an integer >= 0, got {n!r}")

    @property
    def active(self) -> bool:
        """False when applying them would change nothing."""
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                           or self.frequency_penalty != 0.0)

    def apply(self, context_ids: Sequence[int], logits: np.ndarray) -> None:
        """Penalize ``logits`` (vocab,) f32 in place for the last
        ``repeat_last_n`` of ``context_ids``."""
        if not self.active or not context_ids:
            return
        window = np.asarray(context_ids[-self.repeat_last_n:], dtype=np.int64)
        ids, counts = np.unique(window, return_counts=True)  # (k,), (k,)
        values = logits[ids]
        if self.repeat_penalty != 1.0:
            r = np.float32(self.repeat_penalty)
            values = np.where(values > 0, values / r, values * r).astype(np.float32)
        values = values - np.float32(self.frequency_penalty) * counts.astype(np.float32) \
            - np.float32(self.presence_penalty)
        logits[ids] = values
