"""Sampler and SplitMix64 (docs/generation.md#sampler; docs/errors.md cases 21-25).

Expected values are worked out here independently: known SplitMix64 outputs
and a re-statement of its formula, hand-built distributions whose kept sets
and walk results are computed by hand, a float64 reference of the filters,
and empirical frequencies checked against the renormalized distribution.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gemma_cy.errors import NumericalError, ParameterError
from gemma_cy.generation.sampling import Sampler, SplitMix64
from gemma_cy.model.tolerance import PROBABILITIES

GAMMA = 0x9E3779B97F4A7C15
TWO64 = 2**64

# A hand-built distribution over 7 ids (sums to 1). By probability:
# id 1 (.30) > 3 (.25) > 5 (.20) > 2 (.10) > 6 (.08) > 0 (.05) > 4 (.02).
P7 = np.array([0.05, 0.30, 0.10, 0.25, 0.02, 0.20, 0.08])
LOGITS7 = np.log(P7).astype(np.float32)  # with T = 1, softmax gives back P7


def splitmix64_outputs(seed: int, n: int) -> list[int]:
    """SplitMix64 re-stated from docs/generation.md#sampler with Python ints and explicit % 2**64."""
    out, s = [], seed
    for _ in range(n):
        s = (s + GAMMA) % TWO64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % TWO64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % TWO64
        out.append(z ^ (z >> 31))
    return out


class ForcedUniform:
    """Stands in for ``Sampler.rng``: returns the given uniforms, counts the draws."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.draws = 0

    def uniform(self) -> float:
        self.draws += 1
        return self.values.pop(0)


def kept(sampler: Sampler, logits) -> list[int]:
    ids, _ = sampler.candidates(logits)
    return ids.tolist()


# ---------------------------------------------------------------- SplitMix64


def test_splitmix64_seed0_known_outputs():
    rng = SplitMix64(0)
    assert [rng.next_u64() for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


@pytest.mark.parametrize("seed", [0, 1, 42, 0xDEADBEEF, GAMMA, TWO64 - 1])
def test_splitmix64_matches_restated_formula(seed):
    rng = SplitMix64(seed)
    assert [rng.next_u64() for _ in range(200)] == splitmix64_outputs(seed, 200)


def test_uniform_is_top_53_bits_and_in_unit_interval():
    rng = SplitMix64(7)
    expected = [(z >> 11) / 2.0**53 for z in splitmix64_outputs(7, 1000)]
    got = [rng.uniform() for _ in range(1000)]
    assert got == expected
    assert all(0.0 <= u < 1.0 for u in got)


def test_same_seed_same_stream_different_seed_different_stream():
    a, b, c = SplitMix64(123), SplitMix64(123), SplitMix64(124)
    sa = [a.next_u64() for _ in range(50)]
    assert sa == [b.next_u64() for _ in range(50)]
    assert sa != [c.next_u64() for _ in range(50)]


@pytest.mark.parametrize("seed", [-1, TWO64, 2**100, 1.5, 1.0, "1", None, True, [1]])
def test_splitmix64_rejects_bad_seeds(seed):
    with pytest.raises(ParameterError, match=r"\[0, 2\*\*64\)"):
        SplitMix64(seed)


def test_splitmix64_accepts_numpy_integer_seed():
    assert SplitMix64(np.uint64(5)).next_u64() == splitmix64_outputs(5, 1)[0]


# ------------------------------------------------------ validation (row 21)

BAD_PARAMETERS = [
    ({"temperature": -0.1}, "temperature", ">= 0"),
    ({"temperature": -1}, "temperature", ">= 0"),
    ({"temperature": -1e-300}, "temperature", ">= 0"),
    ({"temperature": float("nan")}, "temperature", ">= 0"),
    ({"temperature": float("inf")}, "temperature", ">= 0"),
    ({"temperature": float("-inf")}, "temperature", ">= 0"),
    ({"temperature": np.float32("nan")}, "temperature", ">= 0"),
    ({"temperature": 10**400}, "temperature", ">= 0"),
    ({"temperature": "0.7"}, "temperature", ">= 0"),
    ({"temperature": None}, "temperature", ">= 0"),
    ({"temperature": True}, "temperature", ">= 0"),
    ({"temperature": [0.7]}, "temperature", ">= 0"),
    ({"min_p": -0.01}, "min_p", r"\[0, 1\]"),
    ({"min_p": 1.01}, "min_p", r"\[0, 1\]"),
    ({"min_p": float("nan")}, "min_p", r"\[0, 1\]"),
    ({"min_p": float("inf")}, "min_p", r"\[0, 1\]"),
    ({"min_p": "0.1"}, "min_p", r"\[0, 1\]"),
    ({"min_p": True}, "min_p", r"\[0, 1\]"),
    ({"top_p": 0}, "top_p", r"\(0, 1\]"),
    ({"top_p": 0.0}, "top_p", r"\(0, 1\]"),
    ({"top_p": -0.5}, "top_p", r"\(0, 1\]"),
    ({"top_p": 1.0001}, "top_p", r"\(0, 1\]"),
    ({"top_p": float("nan")}, "top_p", r"\(0, 1\]"),
    ({"top_p": float("inf")}, "top_p", r"\(0, 1\]"),
    ({"top_p": "0.9"}, "top_p", r"\(0, 1\]"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"top_k": 1.5}, "top_k", ">= 0"),
    ({"top_k": 2.0}, "top_k", ">= 0"),
    ({"top_k": float("nan")}, "top_k", ">= 0"),
    ({"top_k": "5"}, "top_k", ">= 0"),
    ({"top_k": True}, "top_k", ">= 0"),
    ({"seed": -1}, "seed", r"2\*\*64"),
    ({"seed": TWO64}, "seed", r"2\*\*64"),
    ({"seed": "7"}, "seed", r"2\*\*64"),
]


@pytest.mark.parametrize(("kwargs", "name", "valid_range"), BAD_PARAMETERS)
def test_bad_parameters_are_rejected_with_the_valid_range(kwargs, name, valid_range):
    with pytest.raises(ParameterError, match=rf"{name}.*{valid_range}") as info:
        Sampler(**kwargs)
    assert isinstance(info.value, ValueError)


def first_draw(weights: np.ndarray, seed: int) -> int:
    """The id a sampler seeded ``seed`` draws from ids 0..n-1 with ``weights``
    (not normalized; 0 = not a candidate), worked out here in float64: the
    first uniform of the re-stated SplitMix64 (top 53 bits), then the first id
    whose cumulative probability exceeds it. The uniform must not sit within
    rounding distance of a boundary, so that there is one right answer."""
    u = (splitmix64_outputs(seed, 1)[0] >> 11) / 2.0**53
    cumulative = np.cumsum(weights / weights.sum())
    assert np.all(np.abs(cumulative - u) > 1e-3), (u, cumulative)
    return int(np.sum(cumulative <= u))


# softmax(log(P7) / T) is proportional to P7 ** (1 / T); T = 0.7 is the default
P7_T07 = P7 ** (1 / 0.7)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"temperature": 0}, 1),  # greedy: id 1 (.30) is the most probable
        ({"temperature": 0.0, "min_p": 0.0}, 1),  # temperature 0 is greedy whatever else is given
        ({"temperature": 1e-30, "min_p": 1.0}, 1),  # only the top id has p >= 1 * max(p)
        ({"temperature": 1e30, "top_p": 1.0}, first_draw(np.ones(7), 0)),  # uniform over all 7 ids
        ({"temperature": np.float32(0.5), "top_p": 1e-9}, 1),  # the top id alone reaches the mass
        ({"top_k": 0}, first_draw(P7_T07, 0)),  # k = 0 is off: every id, at T = 0.7
        ({"top_k": np.int64(40)}, first_draw(P7_T07, 0)),  # k > 7 keeps every id
        ({"top_k": 10**30}, first_draw(P7_T07, 0)),
        # p >= 0.05 * max(p) at T = 0.7 keeps every id but 4 (.02: (.02 / .3) ** (1 / .7) < .05)
        ({"seed": TWO64 - 1, "min_p": 0.05}, first_draw(np.where(np.arange(7) == 4, 0.0, P7_T07), TWO64 - 1)),
    ],
)
def test_boundary_parameters_are_accepted(kwargs, expected):
    assert Sampler(**kwargs).sample(LOGITS7) == expected


def test_validation_survives_python_O():
    code = (
        "from gemma_cy.generation.sampling import Sampler\n"
        "from gemma_cy.errors import ParameterError\n"
        "for kw in ({'temperature': -1}, {'min_p': 2}, {'top_p': 0}, {'top_k': -1}):\n"
        "    try:\n"
        "        Sampler(**kw)\n"
        "    except ParameterError:\n"
        "        continue\n"
        "    raise SystemExit('accepted %r' % kw)\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------- greedy


def test_greedy_modes():
    assert Sampler(temperature=0).is_greedy
    assert Sampler(temperature=0, min_p=0.1, top_k=5, top_p=0.9).is_greedy
    assert not Sampler(temperature=0.7).is_greedy  # a temperature alone samples
    assert not Sampler().is_greedy
    assert not Sampler(temperature=1e-30).is_greedy
    assert not Sampler(temperature=0.7, min_p=0.0).is_greedy
    assert not Sampler(temperature=0.7, top_k=0).is_greedy
    assert not Sampler(temperature=0.7, top_p=1.0).is_greedy


def test_greedy_is_argmax_lowest_id_wins_ties():
    assert Sampler(temperature=0).sample(np.array([1.0, 3.0, 3.0, 2.0], np.float32)) == 1
    assert Sampler(temperature=0).sample(np.array([-np.inf, 5.0, -np.inf, 5.0])) == 1
    assert Sampler(temperature=0).sample(np.zeros(10, np.float32)) == 0
    ids, probs = Sampler(temperature=0, min_p=0.5).candidates(np.array([0.0, 2.0, 2.0]))
    assert ids.tolist() == [1] and probs.tolist() == [1.0]


def test_greedy_uses_the_raw_logits_not_f32_rounded_ones():
    # 1 and 1 + 1e-12 are equal in f32; the argmax of the f64 input is id 1.
    assert Sampler(temperature=0).sample(np.array([1.0, 1.0 + 1e-12])) == 1


def test_greedy_is_identical_for_every_seed_row22():
    rng = np.random.default_rng(0)
    steps = [rng.standard_normal(50).astype(np.float32) for _ in range(20)]
    expected = [int(np.argmax(x)) for x in steps]
    for seed in [0, 1, 2, 99, 2**63, TWO64 - 1]:
        for kwargs in ({"temperature": 0, "min_p": 0.05}, {"temperature": 0, "top_k": 3, "top_p": 0.5}):
            sampler = Sampler(seed=seed, **kwargs)
            assert [sampler.sample(x) for x in steps] == expected


def test_greedy_draws_no_uniform():
    sampler = Sampler(temperature=0, min_p=0.1, seed=77)
    sampler.rng = ForcedUniform()  # would raise IndexError on a draw
    for _ in range(5):
        sampler.sample(LOGITS7)
    assert sampler.rng.draws == 0
    real = Sampler(temperature=0.9, seed=77)  # samples: one draw per token
    for _ in range(5):
        real.sample(LOGITS7)
    assert real.rng.next_u64() == splitmix64_outputs(77, 6)[5]


# ------------------------------------------------- determinism (row 23)


def test_same_seed_same_tokens_different_seed_different_tokens():
    rng = np.random.default_rng(1)
    steps = [rng.standard_normal(64).astype(np.float32) for _ in range(100)]

    def run(seed):
        sampler = Sampler(temperature=1.5, min_p=0.0, top_k=30, top_p=0.95, seed=seed)
        return [sampler.sample(x) for x in steps]

    assert run(5) == run(5)
    assert run(5) != run(6)


@pytest.mark.parametrize(
    "kwargs",
    [{"min_p": 0.3}, {"top_k": 1}, {"top_p": 0.01}, {"min_p": 0.0, "top_k": 3}],
)
def test_exactly_one_uniform_per_sampled_token(kwargs):
    sampler = Sampler(temperature=1.0, seed=9, **kwargs)
    n = 25
    for _ in range(n):
        sampler.sample(LOGITS7)  # top_k=1 / top_p=0.01 keep one id: still one draw
    # SplitMix64's state advances by GAMMA per draw.
    assert sampler.rng.state == (9 + n * GAMMA) % TWO64


def test_candidates_draws_no_uniform():
    sampler = Sampler(temperature=1.0, min_p=0.1, seed=3)
    sampler.candidates(LOGITS7)
    assert sampler.rng.state == 3


# --------------------------------------------- filters on hand-built sets


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"min_p": 0.0}, [0, 1, 2, 3, 4, 5, 6]),
        ({"min_p": 0.3}, [1, 2, 3, 5]),  # p >= 0.09
        ({"min_p": 0.5}, [1, 3, 5]),  # p >= 0.15
        ({"min_p": 0.9}, [1]),  # p >= 0.27
        ({"min_p": 1.0}, [1]),
        ({"top_k": 0}, [0, 1, 2, 3, 4, 5, 6]),
        ({"top_k": 1}, [1]),
        ({"top_k": 3}, [1, 3, 5]),
        ({"top_k": 5}, [1, 2, 3, 5, 6]),
        ({"top_k": 7}, [0, 1, 2, 3, 4, 5, 6]),
        ({"top_k": 1000}, [0, 1, 2, 3, 4, 5, 6]),
        ({"top_p": 0.2}, [1]),  # .30 already reaches .2
        ({"top_p": 0.5}, [1, 3]),  # .30 + .25 = .55
        ({"top_p": 0.56}, [1, 3, 5]),  # .55 < .56 <= .75
        ({"top_p": 0.9}, [1, 2, 3, 5, 6]),  # .85 < .9 <= .93
        ({"top_p": 1.0}, [0, 1, 2, 3, 4, 5, 6]),
    ],
)
def test_single_filter_keeps_the_hand_computed_set(kwargs, expected):
    sampler = Sampler(temperature=1.0, **kwargs)
    ids, probs = sampler.candidates(LOGITS7)
    assert ids.tolist() == expected
    renormalized = P7[expected] / P7[expected].sum()
    np.testing.assert_allclose(probs, renormalized, rtol=1e-5, atol=1e-6)
    assert ids.dtype == np.int64 and probs.dtype == np.float64


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # top-k first: {1, 3, 5} renormalized to .4, .333, .267; top-p .7 then
        # needs 2 ids. (top-p first would keep {1, 3, 5}: .75 >= .7.)
        ({"top_k": 3, "top_p": 0.7}, [1, 3]),
        # top-p before min-p: top-p .7 keeps {1, 3, 5}, min-p .5 (p >= .15)
        # keeps all three. (min-p first would leave {1, 3, 5} renormalized,
        # and top-p .7 on that would keep only {1, 3}.)
        ({"top_p": 0.7, "min_p": 0.5}, [1, 3, 5]),
        ({"top_k": 3, "top_p": 0.7, "min_p": 0.8}, [1, 3]),  # .25/.30 = .83
        ({"top_k": 3, "top_p": 0.7, "min_p": 0.9}, [1]),
        ({"top_k": 5, "top_p": 0.9, "min_p": 0.3}, [1, 2, 3, 5]),
        ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, [0, 1, 2, 3, 4, 5, 6]),
    ],
)
def test_filters_apply_in_order_top_k_top_p_min_p(kwargs, expected):
    ids, probs = Sampler(temperature=1.0, **kwargs).candidates(LOGITS7)
    assert ids.tolist() == expected
    np.testing.assert_allclose(probs, P7[expected] / P7[expected].sum(), rtol=1e-5, atol=1e-6)


def test_top_k_ties_at_the_boundary_keep_the_lower_ids():
    logits = np.array([0.0, 1.0, 1.0, 1.0, 0.5, 1.0], np.float32)
    assert kept(Sampler(temperature=1.0, top_k=2), logits) == [1, 2]
    assert kept(Sampler(temperature=1.0, top_k=5), logits) == [1, 2, 3, 4, 5]
    assert kept(Sampler(temperature=1.0, top_k=1), np.zeros(6, np.float32)) == [0]
    assert kept(Sampler(temperature=1.0, top_k=3), np.zeros(6, np.float32)) == [0, 1, 2]


def test_top_p_inclusion_rule_and_ties():
    flat = np.zeros(4, np.float32)
    # four equal ids, .25 each: the crossing id is included, later ties are not
    assert kept(Sampler(temperature=1.0, top_p=0.25), flat) == [0]
    assert kept(Sampler(temperature=1.0, top_p=0.5), flat) == [0, 1]  # reaches .5 exactly
    assert kept(Sampler(temperature=1.0, top_p=0.51), flat) == [0, 1, 2]
    assert kept(Sampler(temperature=1.0, top_p=1.0), flat) == [0, 1, 2, 3]
    # .1, .3, .3, .3: the three ties come first by probability, then by id
    logits = np.log(np.array([0.1, 0.3, 0.3, 0.3])).astype(np.float32)
    assert kept(Sampler(temperature=1.0, top_p=0.5), logits) == [1, 2]
    assert kept(Sampler(temperature=1.0, top_p=0.95), logits) == [0, 1, 2, 3]


def test_min_p_keeps_ties_with_the_maximum():
    logits = np.array([2.0, 1.0, 2.0, 2.0, -3.0], np.float32)
    assert kept(Sampler(temperature=1.0, min_p=1.0), logits) == [0, 2, 3]


def test_temperature_divides_the_logits():
    logits = np.array([0.0, math.log(2.0)], np.float32)  # p = 1/3, 2/3 at T = 1
    r = math.sqrt(2.0)  # exp(log(2) / 2)
    cases = [(1.0, [1 / 3, 2 / 3]), (0.5, [1 / 5, 4 / 5]), (2.0, [1 / (1 + r), r / (1 + r)])]
    for t, expected in cases:
        _, probs = Sampler(temperature=t, min_p=0.0).candidates(logits)
        np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)


def test_zero_probability_ids_are_never_candidates():
    logits = np.array([0.0, -np.inf, 0.0, -200.0], np.float32)  # exp(-200) underflows in f32
    assert kept(Sampler(temperature=1.0, min_p=0.0), logits) == [0, 2]
    assert kept(Sampler(temperature=1.0, top_k=4), logits) == [0, 2]
    assert kept(Sampler(temperature=1.0, top_p=1.0), logits) == [0, 2]


def test_extreme_temperatures():
    # tiny: only the maximum survives (ties shared); huge: uniform over finite ids
    logits = np.array([1.0, 3.0, 3.0, 0.0], np.float32)
    ids, probs = Sampler(temperature=1e-50, min_p=0.0).candidates(logits)
    assert ids.tolist() == [1, 2] and probs.tolist() == [0.5, 0.5]
    logits = np.array([1e30, -1e30, -np.inf, 0.0])
    ids, probs = Sampler(temperature=1e300, min_p=0.0).candidates(logits)
    assert ids.tolist() == [0, 1, 3]
    np.testing.assert_allclose(probs, [1 / 3] * 3, rtol=1e-6)


def test_huge_logit_ranges_do_not_overflow():
    logits = np.array([1e308, -1e308, 0.0, -np.inf])
    with np.errstate(all="raise"):
        assert Sampler(temperature=0.5, min_p=0.0, seed=1).sample(logits) == 0
        assert kept(Sampler(temperature=1e-3, top_p=0.9), logits) == [0]


def test_sampling_does_not_modify_the_logits():
    logits = LOGITS7.copy()
    Sampler(temperature=0.8, top_k=3, top_p=0.9, min_p=0.1).sample(logits)
    np.testing.assert_array_equal(logits, LOGITS7)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_dtypes_agree(dtype):
    ids, probs = Sampler(temperature=1.0, min_p=0.3).candidates(LOGITS7.astype(dtype))
    assert ids.tolist() == [1, 2, 3, 5]
    np.testing.assert_allclose(probs, P7[ids] / P7[ids].sum(), atol=2e-3)


def test_large_vocab_top_p_matches_a_full_sort():
    # Exercises the top-p pre-filter on a Gemma-sized vocabulary against a
    # plain float64 sort of the whole distribution.
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    p = np.exp((logits.astype(np.float64) - logits.max()) / 0.8)
    p /= p.sum()
    order = np.lexsort((np.arange(p.size), -p))
    cum = np.cumsum(p[order])
    for top_p in (0.5, 0.9, 0.99):
        n = int(np.argmax(cum >= top_p)) + 1
        assert kept(Sampler(temperature=0.8, top_p=top_p), logits) == sorted(order[:n].tolist())
    sampler = Sampler(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=1)
    ids, _ = sampler.candidates(logits)
    assert sampler.sample(logits) in set(ids.tolist())


# ------------------------------------------------------------------ the walk


def test_walk_is_renormalized_not_the_seeds_bug():
    # p = .4 .3 .2 .1; min_p .5 keeps p >= .2: ids 0, 1, 2, renormalized to
    # 4/9, 3/9, 2/9 -> cumulative .444, .778, 1. The seed engine accumulated
    # the raw .4, .7, .9 and gave the rest to id 2: for u = .42 it returned
    # 1 and for u = .75 it returned 2.
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    cases = [(0.0, 0), (0.42, 0), (0.44, 0), (0.45, 1), (0.75, 1), (0.77, 1),
             (0.78, 2), (0.95, 2), (1.0 - 2.0**-53, 2)]
    sampler = Sampler(temperature=1.0, min_p=0.5)
    sampler.rng = ForcedUniform(*[u for u, _ in cases])
    assert [sampler.sample(logits) for _ in cases] == [want for _, want in cases]
    assert sampler.rng.draws == len(cases)


def test_walk_goes_in_ascending_id_order_not_by_probability():
    logits = np.log(np.array([0.1, 0.6, 0.3])).astype(np.float32)  # cum .1, .7, 1
    sampler = Sampler(temperature=1.0, min_p=0.0)
    sampler.rng = ForcedUniform(0.05, 0.11, 0.69, 0.71)
    assert [sampler.sample(logits) for _ in range(4)] == [0, 1, 1, 2]


def test_walk_skips_dropped_ids():
    # top-k 2 keeps ids 1 and 3 (.30, .25 of P7) -> renormalized .545, .455
    sampler = Sampler(temperature=1.0, top_k=2)
    sampler.rng = ForcedUniform(0.0, 0.54, 0.55, 0.999)
    assert [sampler.sample(LOGITS7) for _ in range(4)] == [1, 1, 3, 3]


def test_walk_returns_the_last_kept_id_when_u_is_past_the_total():
    # u = 1.0 never comes from SplitMix64 but stands for rounding past the
    # total; id 2 has probability 0, so the last kept id is 1.
    sampler = Sampler(temperature=1.0, min_p=0.0)
    sampler.rng = ForcedUniform(1.0)
    assert sampler.sample(np.array([0.0, 0.0, -np.inf], np.float32)) == 1


# ------------------------------------------------------------- statistics

N_DRAWS = 10_000


def bound(q: np.ndarray, n: int) -> np.ndarray:
    """5 binomial standard deviations of a frequency, plus one count of slack."""
    return 5.0 * np.sqrt(q * (1.0 - q) / n) + 1.0 / n


@pytest.mark.parametrize(
    ("kwargs", "kept_ids", "power"),
    [
        ({"temperature": 1.0, "min_p": 0.3}, [1, 2, 3, 5], 1.0),
        ({"temperature": 1.0, "top_k": 3}, [1, 3, 5], 1.0),
        ({"temperature": 1.0, "top_p": 0.9}, [1, 2, 3, 5, 6], 1.0),
        ({"temperature": 0.5, "min_p": 0.0}, [0, 1, 2, 3, 4, 5, 6], 2.0),  # p ** (1/T)
    ],
)
def test_empirical_frequencies_match_the_renormalized_distribution(kwargs, kept_ids, power):
    q = np.zeros(7)
    q[kept_ids] = P7[kept_ids] ** power
    q /= q.sum()
    sampler = Sampler(seed=20240601, **kwargs)
    counts = np.bincount([sampler.sample(LOGITS7) for _ in range(N_DRAWS)], minlength=7)
    freq = counts / N_DRAWS
    dropped = [i for i in range(7) if i not in kept_ids]
    assert counts[dropped].sum() == 0
    assert np.all(np.abs(freq - q) <= bound(q, N_DRAWS)), (freq, q)


def test_the_statistical_bound_would_catch_the_seeds_bug():
    # Seed bug for min_p .3 on P7: raw p for ids 1, 2, 3 and all the rest on
    # id 5. The bound used above must reject that distribution.
    q = P7[[1, 2, 3, 5]] / P7[[1, 2, 3, 5]].sum()
    bug = np.array([0.30, 0.10, 0.25, 1.0 - 0.65])
    assert np.any(np.abs(bug - q) > 2 * bound(q, N_DRAWS))


# --------------------------------------------------- edge logits (row 24-25)

ALL_SETTINGS = [
    {"temperature": 0},
    {"temperature": 0.7},
    {"temperature": 0.7, "min_p": 0.0},
    {"temperature": 0.7, "min_p": 0.05},
    {"temperature": 0.7, "min_p": 1.0},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 1.0, "top_k": 40},
    {"temperature": 1.0, "top_p": 1e-9},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 1e-50, "top_k": 3, "top_p": 0.5, "min_p": 0.5},
    {"temperature": 1e300, "top_k": 3, "top_p": 0.5, "min_p": 0.5},
]


@pytest.mark.parametrize("kwargs", ALL_SETTINGS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_equal_logits_give_a_valid_id(kwargs, dtype):
    logits = np.full(10, 3.0, dtype)
    sampler = Sampler(seed=4, **kwargs)
    ids, probs = sampler.candidates(logits)
    assert len(ids) >= 1 and np.isclose(probs.sum(), 1.0)
    np.testing.assert_allclose(probs, 1.0 / len(ids))
    for _ in range(20):
        assert 0 <= sampler.sample(logits) < 10


@pytest.mark.parametrize("kwargs", ALL_SETTINGS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_minus_inf_but_one_gives_that_id(kwargs, dtype):
    logits = np.full(10, -np.inf, dtype)
    logits[7] = -5.0
    sampler = Sampler(seed=4, **kwargs)
    ids, probs = sampler.candidates(logits)
    assert ids.tolist() == [7] and probs.tolist() == [1.0]
    assert [sampler.sample(logits) for _ in range(5)] == [7] * 5


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"min_p": 0.1}, {"top_k": 3}])
@pytest.mark.parametrize(
    "logits",
    [
        np.array([0.0, np.nan, 1.0], np.float32),
        np.array([np.nan, np.nan]),
        np.array([np.nan, -np.inf], np.float16),
        np.array([0.0, np.inf, 1.0]),
        np.array([-np.inf, -np.inf, -np.inf], np.float32),
    ],
    ids=["nan", "all-nan", "nan-f16", "plus-inf", "all-minus-inf"],
)
def test_nan_or_inf_logits_raise_numerical_error(kwargs, logits):
    sampler = Sampler(**kwargs)
    with pytest.raises(NumericalError):
        sampler.sample(logits)
    with pytest.raises(NumericalError):
        sampler.candidates(logits)


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"min_p": 0.1}])
@pytest.mark.parametrize(
    "logits",
    [
        np.zeros((2, 3), np.float32),
        np.float32(1.0),
        np.zeros(0, np.float32),
        np.arange(5),
        np.ones(3, bool),
        np.ones(3, np.complex64),
        np.array(["a", "b"]),
        None,
        "logits",
        [1, 2, 3],
    ],
    ids=["2d", "0d", "empty", "int", "bool", "complex", "str-array", "none", "str", "int-list"],
)
def test_logits_must_be_a_1d_float_array(kwargs, logits):
    with pytest.raises(ParameterError, match="1-D float"):
        Sampler(**kwargs).sample(logits)


def test_a_list_of_floats_is_accepted():
    assert Sampler(temperature=0).sample([0.5, 2.0, 1.0]) == 1


# ------------------------------------------- against a float64 reference

def reference_kept(logits, temperature, top_k, top_p, min_p):
    """The documented filters in float64, ordering ties by (-logit, id).

    Returns the kept ids, or None when a top-p or min-p boundary lies within
    rounding distance (there the f32 engine may legitimately differ).
    """
    ids = [i for i, v in enumerate(logits) if v != -np.inf]
    m = max(logits[i] for i in ids)
    weight = {i: math.exp((logits[i] - m) / temperature) for i in ids}

    def by_probability(cands):
        return sorted(cands, key=lambda i: (-logits[i], i))

    if top_k:
        ids = by_probability(ids)[:top_k]
    if top_p is not None and top_p < 1.0:
        total = sum(weight[i] for i in ids)
        cum, chosen = 0.0, []
        for i in by_probability(ids):
            chosen.append(i)
            cum += weight[i] / total
            if abs(cum - top_p) < 1e-5:
                return None
            if cum >= top_p:
                break
        ids = chosen
    if min_p:
        top = max(weight[i] for i in ids)
        if any(abs(weight[i] / top - min_p) < 1e-5 for i in ids):
            return None
        ids = [i for i in ids if weight[i] >= min_p * top]
    return sorted(ids), np.array([weight[i] for i in sorted(ids)])


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.integers(-6, 6).map(float), st.just(-np.inf)), min_size=1, max_size=24
    ),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
    top_k=st.one_of(st.none(), st.integers(0, 30)),
    top_p=st.one_of(st.none(), st.sampled_from([0.05, 0.3, 0.5, 0.77, 0.9, 0.99, 1.0])),
    min_p=st.one_of(st.none(), st.sampled_from([0.0, 0.01, 0.1, 0.2, 0.5, 1.0])),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_candidates_and_walk_match_a_float64_reference(
    values, temperature, top_k, top_p, min_p, u
):
    assume(any(v != -np.inf for v in values))
    assume(not (top_k is None and top_p is None and min_p is None))
    logits = np.array(values, np.float32)
    reference = reference_kept(values, temperature, top_k, top_p, min_p)
    assume(reference is not None)
    want_ids, want_w = reference
    sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ids, probs = sampler.candidates(logits)
    assert ids.tolist() == want_ids
    q = want_w / want_w.sum()
    atol, rtol = PROBABILITIES
    np.testing.assert_allclose(probs, q, rtol=rtol, atol=atol)
    # the walk: first kept id whose renormalized cumulative exceeds u, unless
    # u sits within rounding distance of a boundary
    cum = np.cumsum(q)
    assume(np.all(np.abs(cum - u) > 1e-5))
    sampler.rng = ForcedUniform(u)
    expected = want_ids[min(int(np.sum(cum <= u)), len(want_ids) - 1)]
    assert sampler.sample(logits) == expected


# ---------------------------------------------------------------- describe


def test_describe_names_the_mode_and_settings():
    assert "greedy" in Sampler(temperature=0).describe()
    assert "greedy" not in Sampler(temperature=0.7).describe()
    text = Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=11).describe()
    assert "greedy" not in text
    for part in ("0.8", "top_k 40", "top_p 0.95", "min_p 0.05", "seed 11"):
        assert part in text
