"""Repetition penalties (gemma_cy/generation/penalties.py,
docs/generation.md#penalties): the sign rule, values below one, an empty
window, and the errors naming the parameter and its range.

Each test pins down a documented rule that tests/test_generation_api.py
states only for easier inputs (found by mutation testing).
"""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.errors import ParameterError
from gemma_cy.generation.penalties import Penalties

# ---------------------------------------------------------------- penalties


def test_repeat_penalty_divides_every_positive_logit_even_below_one():
    """repeat_penalty divides a positive logit and multiplies a non-positive
    one: the rule is about the sign, so 0.5 becomes 0.25 with r = 2 (not 1.0)."""
    x = np.array([0.5, -0.5, 0.0, 3.0], np.float32)
    Penalties(repeat_penalty=2.0).apply([0, 1, 2], x)
    assert x.tolist() == [0.25, -1.0, 0.0, 3.0]


def test_repeat_penalty_below_one_is_valid():
    """repeat_penalty may be any finite value > 0 (docs: > 0): 0.5 is
    accepted and boosts a positive logit, 0 and below are refused."""
    x = np.array([1.0, -1.0], np.float32)
    Penalties(repeat_penalty=0.5).apply([0, 1], x)
    assert x.tolist() == [2.0, -0.5]
    for bad in (0.0, -0.5):
        with pytest.raises(ParameterError):
            Penalties(repeat_penalty=bad)


def test_repeat_last_n_zero_is_valid_and_turns_the_penalties_off():
    """repeat_last_n is an integer >= 0; 0 means an empty window, so even
    strong penalties leave the logits unchanged (not the whole context)."""
    p = Penalties(repeat_penalty=2.0, presence_penalty=1.0, frequency_penalty=1.0, repeat_last_n=0)
    assert not p.active
    x = np.array([1.0, -1.0, 2.0], np.float32)
    p.apply([0, 1, 0], x)
    assert x.tolist() == [1.0, -1.0, 2.0]


def test_penalty_values_are_stored_as_floats():
    """The three penalties are normalized to Python floats (ints and NumPy
    scalars are accepted as input), so what a Penalties holds and shows is
    the same whatever type the caller passed."""
    p = Penalties(repeat_penalty=2, presence_penalty=np.float32(0.5), frequency_penalty=np.int64(1))
    for name, want in (("repeat_penalty", 2.0), ("presence_penalty", 0.5), ("frequency_penalty", 1.0)):
        value = getattr(p, name)
        assert type(value) is float and value == want, (name, value)


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"repeat_penalty": 0}, ("repeat_penalty", "> 0")),
        ({"presence_penalty": float("nan")}, ("presence_penalty", "finite")),
        ({"frequency_penalty": float("inf")}, ("frequency_penalty", "finite")),
        ({"repeat_last_n": -1}, ("repeat_last_n", ">= 0")),
    ],
)
def test_bad_penalties_name_the_parameter_and_its_valid_range(kwargs, needles):
    """A rejected penalty raises ParameterError naming the parameter and its
    valid range, the convention of docs/errors.md case 21."""
    with pytest.raises(ParameterError) as info:
        Penalties(**kwargs)
    for needle in needles:
        assert needle in str(info.value)
