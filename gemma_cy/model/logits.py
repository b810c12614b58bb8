"""Two readings of a logits vector that every layer above shares: the greedy
pick and the top-1/top-2 margin (docs/generation.md#sampler,
docs/numerics.md#greedy-agreement).

The sampler's greedy mode, the reference's generate loop, ``gemma-cy diff``
and the tests' engine comparisons all pick and report through these two, so a
tie is broken the same way everywhere and a divergence report means the same
number everywhere.
"""
from __future__ import annotations

import numpy as np


def argmax(logits: np.ndarray) -> int:
    """The greedy pick: the id of the highest logit, the lowest id among
    equal maxima (``np.argmax`` returns the first maximum). The values are
    compared in their own dtype (f64 logits are not rounded to f32 first).
    NaN is the caller's to rule out: ``np.argmax`` returns the first NaN's id."""
    return int(np.argmax(logits))


def top2_margin(logits: np.ndarray) -> float:
    """The highest logit minus the second highest, in float64: 0 for a tie at
    the top, ``inf`` for a vector of fewer than two values. How close a
    greedy step was to picking another id."""
    x = np.asarray(logits, np.float64).reshape(-1)
    if x.size < 2:
        return float("inf")
    top = np.partition(x, -2)[-2:]
    return float(top[1] - top[0])
