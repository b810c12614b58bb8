"""Choosing the next token from a logits vector (docs/generation.md#sampler); both engines use it.

``SplitMix64`` is the random stream; ``Sampler`` turns logits into one token
id, either greedily (argmax, temperature 0) or by drawing one uniform from a
filtered, renormalized distribution (any positive temperature).

Sampling, step by step (V = vocabulary size):

1. ``w = exp((logits - max(logits)) / T)`` in f32: the softmax numerators,
   stable, with ``max(w) == 1`` exactly. ``p = w / sum(w)``. Ids whose weight
   underflows to 0 (``-inf`` logits included) can never be drawn, so they are
   never candidates.
2. Filters, each keeping a subset of the current candidates and judging by
   their probabilities renormalized over that subset, in the order
   top-k, top-p, min-p:

   - top-k keeps the k most probable ids; at the boundary, equal
     probabilities are taken in ascending id order (lower id kept).
   - top-p keeps the smallest prefix of the candidates sorted by descending
     probability (equal probabilities: ascending id) whose mass reaches
     ``top_p``: the id that crosses the threshold is included, later ids that
     tie with it are not. If rounding keeps the running sum below the target,
     every candidate is kept; ``top_p == 1`` keeps every candidate.
   - min-p keeps ids with ``p_i >= min_p * max(p)`` (ties with the bound kept).

   The most probable id (lowest id among equals) survives every filter, so the
   kept set is never empty.
3. One uniform ``u`` in [0, 1); walk the kept ids in ascending id order,
   accumulating their probabilities renormalized over the kept set, and
   return the first id where ``u < cumulative``; if rounding leaves ``u`` at
   or above the total, the last kept id. (Computed in float64 as
   ``u * sum(w_kept) < cumsum(w_kept)``: the same test without dividing.)

Logits holding NaN or +inf, or only -inf, raise ``NumericalError`` in every
mode, greedy included: a broken forward pass never silently becomes token 0.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import NumericalError, ParameterError
from ..model.logits import argmax

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB

# Temperatures are applied in f32; outside this range T itself would round to
# 0 or inf there (0/0 and -inf/inf are NaN). Clamping keeps the limits: a tiny
# T acts as greedy with ties drawn at random, a huge T as uniform over the
# finite logits.
_T_MIN = float(np.finfo(np.float32).tiny)
_T_MAX = float(np.finfo(np.float32).max)


def _as_float(value) -> float:
    """``value`` as a float; NaN for anything that is not a real number.

    Bools are refused (True is an int, but not a sampling parameter), and so
    are ints too large for a float: NaN then fails every range check.
    """
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return float("nan")
    try:
        return float(value)
    except OverflowError:
        return float("nan")


def _is_integer(value) -> bool:
    """An integer (Python or NumPy) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


class SplitMix64:
    """SplitMix64 random stream (docs/generation.md#sampler), in Python ints modulo 2**64.

    next: s += 0x9E3779B97F4A7C15; z = s; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
    z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31.
    """

    def __init__(self, seed: int) -> None:
        if not _is_integer(seed) or not 0 <= int(seed) <= MASK64:
            raise ParameterError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.state = int(seed)

    def next_u64(self) -> int:
        """The next 64-bit output, as a Python int in [0, 2**64)."""
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """A float in [0, 1): the top 53 bits of ``next_u64()`` times 2**-53 (exact)."""
        return (self.next_u64() >> 11) * 2.0**-53


def _walk(ids: np.ndarray | None, w: np.ndarray, u: float) -> int:
    """The id the walk lands on (docs/generation.md#sampler).

    Candidates ``ids`` ascending (None: ids 0..n-1) with weights ``w`` >= 0,
    not necessarily normalized: the first id whose renormalized cumulative
    probability exceeds ``u``, i.e. ``u * total < cumulative`` (no division
    over the whole vector). If rounding leaves ``u`` at or above the total,
    the last id of positive weight.
    """
    cumulative = np.cumsum(w, dtype=np.float64)  # (n,)
    i = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    if i == len(w):
        i = int(np.flatnonzero(w)[-1])
    return i if ids is None else int(ids[i])


# The filters below take the f32 weights ``w`` (V,) of the whole vocabulary
# and the current candidates ``ids`` (ascending), where None means every id:
# the first filter then works on ``w`` itself and never builds a (V,) index
# array (at V = 262144 each such array costs about a millisecond).


def _subset(w: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """The candidates' weights: ``w`` itself when ``ids`` is None."""
    return w if ids is None else w[ids]


def _as_ids(positions: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """Map positions in ``_subset(w, ids)`` back to token ids."""
    return positions if ids is None else ids[positions]


def _top_k(w: np.ndarray, ids: np.ndarray | None, k: int) -> np.ndarray | None:
    """The k candidates of largest weight; equal weights at the boundary: lower id first."""
    sub = _subset(w, ids)
    n = len(sub)
    if k >= n:
        return ids
    kth = np.partition(sub, n - k)[n - k]  # the k-th largest weight
    above = np.flatnonzero(sub > kth)
    tied = np.flatnonzero(sub == kth)[: k - len(above)]  # ascending, so lowest ids
    return _as_ids(np.sort(np.concatenate([above, tied])), ids)


def _nucleus(w: np.ndarray, target: float) -> np.ndarray | None:
    """Positions of the shortest prefix (by descending weight, then position)
    whose running sum reaches ``target``, ascending; None if it never does."""
    order = np.argsort(-w, kind="stable")  # stable: equal weights keep ascending order
    cumulative = np.cumsum(w[order], dtype=np.float64)
    n_keep = int(np.searchsorted(cumulative, target, side="left")) + 1  # first cum >= target
    if n_keep > len(w):
        return None
    return np.sort(order[:n_keep])


def _top_p(w: np.ndarray, ids: np.ndarray | None, top_p: float) -> np.ndarray | None:
    """The smallest set of most probable candidates whose renormalized mass >= top_p."""
    sub = _subset(w, ids)
    n = len(sub)
    if top_p >= 1.0 or n == 1:
        return ids
    total = float(np.sum(sub, dtype=np.float64))
    target = top_p * total
    # Sorting a whole 262144-token vocabulary costs ~20 ms. Candidates with
    # p < (1 - top_p) / (n - 1) are rarely needed (together they weigh less
    # than 1 - top_p), and the candidates above any threshold are a prefix of
    # the full sorted order, so trying that prefix first gives the same answer.
    cutoff = (1.0 - top_p) * total / (n - 1)
    likely = np.flatnonzero(sub >= cutoff)
    if len(likely) < n:
        kept = _nucleus(sub[likely], target)
        if kept is not None:
            return _as_ids(likely[kept], ids)
    kept = _nucleus(sub, target)
    return ids if kept is None else _as_ids(kept, ids)


def _min_p(w: np.ndarray, ids: np.ndarray | None, min_p: float) -> np.ndarray:
    """Candidates with p_i >= min_p * max(p).

    max(w) over the candidates is exactly 1 (the top id survives every filter
    and exp(0) == 1), so the test is ``w_i >= min_p``, made exact in f32.
    """
    bound = np.float32(min_p)
    if float(bound) < min_p:
        bound = np.nextafter(bound, np.float32(np.inf))
    return _as_ids(np.flatnonzero(_subset(w, ids) >= bound), ids)


# The defaults of the API and CLI (docs/generation.md#sampler): llama.cpp's
# temperature and Min-P; top-k and top-p off, so that the seed engine's Min-P
# runs (--temp T --minp P) draw exactly the seed's tokens.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_MIN_P = 0.05


class Sampler:
    """Greedy or filtered temperature sampling over a logits vector (docs/generation.md#sampler).

    temperature: finite, >= 0. Exactly 0 means greedy; any positive value
        samples. A negative temperature is refused (docs/errors.md#case-21).
    min_p: None (off) or in [0, 1]; 0 keeps every token.
    top_k: None (off) or an integer >= 0; 0 keeps every token.
    top_p: None (off) or in (0, 1]; 1 keeps every token.
    seed: integer in [0, 2**64) for the SplitMix64 stream ``self.rng``.
    rng: instead of a new stream from ``seed``, an existing SplitMix64 to
        draw from (and advance): one stream shared by the turns of a chat
        continues where the last turn left it.

    A bare ``Sampler()`` samples at DEFAULT_TEMPERATURE over the whole
    softmax; the API and CLI add ``min_p=DEFAULT_MIN_P``.
    """

    def __init__(
        self,
        temperature: float = DEFAULT_TEMPERATURE,
        min_p: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        rng: SplitMix64 | None = None,
    ) -> None:
        # `not lo <= v <= hi` is also true for NaN, so NaN fails every check.
        if not 0.0 <= _as_float(temperature) < float("inf"):
            raise ParameterError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
            )
        if min_p is not None and not 0.0 <= _as_float(min_p) <= 1.0:
            raise ParameterError(f"min_p must be a number in [0, 1], got {min_p!r}")
        if top_p is not None and not 0.0 < _as_float(top_p) <= 1.0:
            raise ParameterError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if top_k is not None and (not _is_integer(top_k) or int(top_k) < 0):
            raise ParameterError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        self.temperature = _as_float(temperature)
        self.min_p = None if min_p is None else _as_float(min_p)
        self.top_k = None if top_k is None else int(top_k)
        self.top_p = None if top_p is None else _as_float(top_p)
        if rng is not None and not isinstance(rng, SplitMix64):
            raise ParameterError(f"rng must be a gemma_cy.SplitMix64 stream, got {type(rng).__name__}")
        self.rng = SplitMix64(seed) if rng is None else rng
        self.seed = self.rng.state

    @property
    def is_greedy(self) -> bool:
        """True when ``sample`` returns the argmax and draws no uniform: temperature 0."""
        return self.temperature == 0.0

    def describe(self) -> str:
        """One line for the CLI's stderr: the mode and every setting in use."""
        if self.is_greedy:
            return "greedy (temperature 0)"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top_k {self.top_k}" + (" (off)" if self.top_k == 0 else ""))
        if self.top_p is not None:
            parts.append(f"top_p {self.top_p:g}")
        if self.min_p is not None:
            parts.append(f"min_p {self.min_p:g}")
        parts.append(f"seed {self.seed}")
        return "sampling: " + ", ".join(parts)

    def sample(self, logits) -> int:
        """The next token id; draws exactly one uniform unless greedy."""
        x = _check_logits(logits)
        if self.is_greedy:
            return argmax(x)  # lowest id wins ties
        ids, w = self._filter(x)
        return _walk(ids, w, self.rng.uniform())

    def candidates(self, logits) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probs): the kept ids, ascending, and their renormalized probabilities.

        ``ids`` int64 (n,), ``probs`` float64 (n,) summing to 1; greedy gives
        the argmax with probability 1. Draws no uniform.
        """
        x = _check_logits(logits)
        if self.is_greedy:
            return np.array([argmax(x)], dtype=np.int64), np.ones(1)
        ids, w = self._filter(x)
        positive = np.flatnonzero(w > 0)  # a weight of 0 can never be drawn
        probs = w[positive].astype(np.float64)
        probs /= probs.sum()
        return _as_ids(positive, ids).astype(np.int64, copy=False), probs

    def _filter(self, x: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Candidates after top-k, top-p, min-p (None: every id) and their f32 weights.

        ``x`` already checked. Weights may include zeros (underflow, -inf).
        """
        w = _weights(x, self.temperature)  # (V,) f32, max exactly 1
        ids = None
        if self.top_k:
            ids = _top_k(w, ids, self.top_k)
        if self.top_p is not None:
            ids = _top_p(w, ids, self.top_p)
        if self.min_p:
            ids = _min_p(w, ids, self.min_p)
        return ids, _subset(w, ids)


def _check_logits(logits) -> np.ndarray:
    """Logits as a 1-D float array; the package's errors otherwise.

    NaN or +inf anywhere, or every logit -inf, is a ``NumericalError``: the
    forward pass went wrong, and returning some id (token 0) would hide it.
    """
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0 or not np.issubdtype(x.dtype, np.floating):
        raise ParameterError(
            "logits must be a non-empty 1-D float array, "
            f"got shape {x.shape} dtype {x.dtype}"
        )
    m = x.max()  # NaN propagates: one pass finds NaN, +inf and all -inf
    if np.isnan(m):
        raise NumericalError(f"logits contain NaN (first at id {int(np.argmax(np.isnan(x)))})")
    if m == np.inf:
        raise NumericalError(f"logits contain +inf (first at id {int(np.argmax(x))})")
    if m == -np.inf:
        raise NumericalError("every logit is -inf: no token can be chosen")
    return x


def _weights(x: np.ndarray, temperature: float) -> np.ndarray:
    """exp((x - max(x)) / T) in f32: softmax numerators, max exactly 1.

    The max is subtracted before dividing by T (the same value in exact
    arithmetic) so no intermediate exceeds 0 and nothing overflows to +inf.
    """
    if x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    t = np.float32(min(max(temperature, _T_MIN), _T_MAX))
    with np.errstate(over="ignore", under="ignore"):
        w = (x - x.max()).astype(np.float32, copy=False)  # (V,) <= 0; the one (V,) buffer
        np.divide(w, t, out=w)
        return np.exp(w, out=w)
