"""Log-probabilities of generated tokens (docs/generation.md#log-probabilities).

The distribution is the one the sampler is given: the model's logits after
penalties and logits processors, before temperature and the top-k/top-p/
min-p filters (what OpenAI's and llama.cpp's servers report as logprobs).
It is computed in f64 from the f32 logits: log p_i = x_i - m - log(sum_j
exp(x_j - m)), m = max x; a token a processor or a grammar masked (-inf)
has log p = -inf and is never listed among the ``top`` alternatives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the ``top`` most likely
    tokens' (id, log-probability), most likely first (ties: lower id first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_top_logprobs(n) -> int | None:
    """None (no log-probabilities) or 0 .. MAX_TOP_LOGPROBS alternatives per token."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ParameterError(f"logprobs = {n!r}, must be an integer in [0, {MAX_TOP_LOGPROBS}] (or None)")
    return n


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under softmax(logits), and the ``top`` best."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x)
    if not np.isfinite(m):
        logp = np.full_like(x, -np.inf)
    else:
        shifted = x - m
        logp = shifted - np.log(np.sum(np.exp(shifted)))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, len(x))
        part = np.argpartition(-logp, k - 1)[:k]
        order = sorted(part.tolist(), key=lambda i: (-logp[i], i))
        # ids a mask or processor set to -inf cannot be drawn: they are no alternative (nor JSON)
        best = tuple((int(i), float(logp[i])) for i in order if logp[i] > -np.inf)
    return TokenLogprob(int(token), float(logp[token]), best)
