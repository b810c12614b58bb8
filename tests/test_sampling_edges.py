"""The sampler's rules at their edges (gemma_cy/generation/sampling.py,
docs/generation.md#sampler): the walk in float64 and on its boundaries, ties
at the top-k and top-p cut, min-p after the other filters, describe() and the
numerical errors; rules tests/test_sampling.py states but does not pin down
tightly enough to tell the code from a small change to it (found by mutation
testing).

Expected values are worked out by hand from the documented rules, as in
tests/test_sampling.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemma_cy.errors import NumericalError
from gemma_cy.generation.sampling import Sampler


class ForcedUniform:
    """Stands in for ``Sampler.rng``: returns the given uniforms."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def uniform(self) -> float:
        return self.values.pop(0)


def kept(sampler: Sampler, logits) -> list[int]:
    ids, _ = sampler.candidates(logits)
    return ids.tolist()


def log2_weight(e: int) -> float:
    """The logit whose weight exp(logit) at T = 1 is about 2**-e."""
    return -e * math.log(2.0)


# ------------------------------------------------------------------ the walk


def test_walk_accumulates_in_float64():
    """The walk sums the kept weights in float64: a weight far below f32
    resolution next to 1.0 still owns its slice of [0, 1). Weights 1, ~2**-30,
    1: u = .5 lands past id 0's 1/(2+e) and inside id 1's slice. Summed in f32
    the middle weight vanishes and the walk returns id 2."""
    logits = np.array([0.0, log2_weight(30), 0.0], np.float32)
    sampler = Sampler(temperature=1.0)
    sampler.rng = ForcedUniform(0.5)
    assert sampler.sample(logits) == 1


def test_walk_u_on_a_boundary_goes_to_the_next_id():
    """The walk returns the first id whose cumulative probability exceeds u
    (strictly): u = .5 over two equal ids is id 1, and u = 0 never lands on a
    leading id of probability 0."""
    sampler = Sampler(temperature=1.0)
    sampler.rng = ForcedUniform(0.5)
    assert sampler.sample(np.zeros(2, np.float32)) == 1
    sampler.rng = ForcedUniform(0.0)
    assert sampler.sample(np.array([-np.inf, 0.0], np.float32)) == 1


def test_walk_past_the_total_returns_the_last_kept_id_of_many():
    """u at or past the total (u = 1.0 stands for rounding) gives the last id
    of positive weight: id 2 of three kept ids, not some other kept id."""
    sampler = Sampler(temperature=1.0)
    sampler.rng = ForcedUniform(1.0)
    assert sampler.sample(np.array([0.0, 0.0, 0.0, -np.inf], np.float32)) == 2


# ------------------------------------------------------------------ filters


def test_top_k_ties_at_the_boundary_with_larger_ids_above():
    """top-k with some ids strictly above the k-th weight keeps only as many
    tied ids as are needed to make k (lowest ids first), not k more."""
    logits = np.array([2.0, 1.0, 1.0, 1.0], np.float32)
    assert kept(Sampler(temperature=1.0, top_k=2), logits) == [0, 1]
    assert kept(Sampler(temperature=1.0, top_k=3), logits) == [0, 1, 2]


def test_top_p_ties_in_a_large_mixed_vocabulary_keep_the_lower_ids():
    """top-p orders equal probabilities by ascending id also when the sort is
    over a mixed vocabulary large enough for an unstable sort to reorder ties:
    100 ids, weight 1 at ids 0, 7, ..., 98 (15 ids) and .9 elsewhere; top_p
    is set so the prefix ends with the 20th id of weight .9 (mass 33 of 91.5,
    the threshold half a weight before it)."""
    ids = np.arange(100)
    logits = np.where(ids % 7 == 0, 0.0, math.log(0.9)).astype(np.float32)
    total = 15 * 1.0 + 85 * 0.9
    top_p = (15 + 20 * 0.9 - 0.45) / total
    expected = sorted(ids[ids % 7 == 0].tolist() + ids[ids % 7 != 0][:20].tolist())
    assert kept(Sampler(temperature=1.0, top_p=top_p), logits) == expected


def test_top_p_one_keeps_a_candidate_below_float64_resolution():
    """top_p == 1 keeps every candidate, even one whose weight (~2**-60) is
    lost when added to 1.0 in float64, where a running sum would already
    reach the total at the first id."""
    logits = np.array([0.0, log2_weight(60)], np.float32)
    assert kept(Sampler(temperature=1.0, top_p=1.0), logits) == [0, 1]


def test_top_p_mass_is_summed_in_float64():
    """The top-p threshold is top_p times the float64 total: three weights of
    ~2**-25 (each lost next to 1.0 in f32) together hold ~9e-8 of the mass,
    more than 1 - top_p = 1e-9, so the top id alone does not reach it."""
    logits = np.array([0.0] + [log2_weight(25)] * 3, np.float32)
    assert kept(Sampler(temperature=1.0, top_p=1.0 - 1e-9), logits) == [0, 1, 2, 3]


def test_top_p_rounding_below_the_target_after_top_k_keeps_every_candidate():
    """If rounding keeps the running sum below the top-p target, every
    candidate is kept; after top-k, that means top-k's ids. Here the float64
    total of 1 and seven weights of 2**-53 exceeds the running sum (which
    stays at 1.0), so top_p = 1 - 2**-53 is never reached."""
    logits = np.array([0.0] + [log2_weight(53)] * 7 + [-np.inf], np.float32)
    sampler = Sampler(temperature=1.0, top_k=8, top_p=1.0 - 2.0**-53)
    assert kept(sampler, logits) == list(range(8))


@pytest.mark.parametrize("kwargs", [{"top_k": 1}, {"top_p": 0.3}])
def test_min_p_judges_only_the_candidates_earlier_filters_kept(kwargs):
    """min-p keeps a subset of the current candidates: it never brings back
    an id that top-k or top-p dropped (all three ids pass min_p .01 alone)."""
    logits = np.array([0.0, 0.1, -0.1], np.float32)
    assert kept(Sampler(temperature=1.0, min_p=0.01, **kwargs), logits) == [1]


def test_sampling_ignores_the_global_numpy_error_state():
    """exp underflowing to 0 is expected (docs: ids of weight 0 are never
    candidates), so a caller's np.errstate(all='raise') must not turn it
    into a FloatingPointError."""
    logits = np.array([0.0, -200.0], np.float32)
    with np.errstate(all="raise"):
        assert kept(Sampler(temperature=1.0), logits) == [0]
        assert Sampler(temperature=1.0, seed=5).sample(logits) == 0


# ----------------------------------------------------------- settings, describe


def test_off_filters_stay_none():
    """A filter left off stays None (not NaN), and describe() does not list it."""
    sampler = Sampler(temperature=0.8, min_p=0.05)
    assert sampler.top_p is None and sampler.top_k is None
    assert "top_p" not in sampler.describe()
    assert "top_k" not in sampler.describe()


@pytest.mark.parametrize(
    ("kwargs", "parts"),
    [
        ({"top_k": 0, "seed": 3}, ["temperature 0.8", "top_k 0 (off)", "seed 3"]),
        ({"top_k": 1, "seed": 3}, ["temperature 0.8", "top_k 1", "seed 3"]),
        (
            {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 11},
            ["temperature 0.8", "top_k 40", "top_p 0.95", "min_p 0.05", "seed 11"],
        ),
    ],
)
def test_describe_lists_exactly_the_settings_and_marks_top_k_0_off(kwargs, parts):
    """describe() lists the settings in use, comma-separated, and says
    "(off)" after top_k exactly when top_k is 0."""
    text = Sampler(temperature=0.8, **kwargs).describe()
    assert text.split(": ", 1)[1].split(", ") == parts


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"min_p": 0.1}])
@pytest.mark.parametrize(
    ("logits", "pattern"),
    [
        (np.array([0.0, 1.0, np.nan, np.nan], np.float32), r"NaN.*\bid 2\b"),
        (np.array([0.0, np.inf, 1.0, np.inf]), r"\+inf.*\bid 1\b"),
        (np.array([-np.inf, -np.inf], np.float32), r"every logit is -inf"),
    ],
    ids=["nan", "plus-inf", "all-minus-inf"],
)
def test_numerical_error_names_the_problem_and_the_first_id(kwargs, logits, pattern):
    """The sampler's NumericalError says what is wrong with the logits and,
    for NaN or +inf, the first id holding it (docs/errors.md case 25)."""
    with pytest.raises(NumericalError, match=pattern):
        Sampler(**kwargs).sample(logits)
