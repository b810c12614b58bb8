"""gemma_cy.model.logits: the greedy pick (lowest id on ties) and the
top-1/top-2 margin, and that every greedy picker in the tree picks through it
(docs/generation.md#sampler, docs/numerics.md#greedy-agreement)."""
import numpy as np
import pytest

from gemma_cy.commands.diff import greedy_pair
from gemma_cy.generation.sampling import Sampler
from gemma_cy.model.logits import argmax, top2_margin
from gemma_cy_reference.generate import generate

TIED = np.array([0.5, 3.0, -1.0, 3.0, 2.0], np.float32)  # ids 1 and 3 tie at the top


def test_argmax_is_the_lowest_id_among_equal_maxima():
    assert argmax(TIED) == 1
    assert argmax(np.zeros(6, np.float32)) == 0
    assert argmax(np.array([-np.inf, 2.0, 2.0])) == 1
    assert isinstance(argmax(TIED), int)


def test_argmax_compares_in_the_logits_own_dtype():
    assert argmax(np.array([1.0, 1.0 + 1e-12])) == 1  # distinct in f64
    assert argmax(np.array([1.0, 1.0 + 1e-12]).astype(np.float32)) == 0  # equal in f32: the lower id


@pytest.mark.parametrize("logits, margin", [
    ([1.0, 5.0, 3.0], 2.0),
    ([4.0, 1.0, 4.0], 0.0),  # a tie at the top
    ([-np.inf, 2.5, -np.inf], np.inf),
    ([7.0], np.inf),  # no second choice
])
def test_top2_margin(logits, margin):
    assert top2_margin(np.array(logits, np.float32)) == margin


def test_top2_margin_is_taken_in_float64():
    x = np.array([0.1, 0.2], np.float16)
    assert top2_margin(x) == float(np.float64(x[1]) - np.float64(x[0]))


class Constant:
    """An engine whose logits are always ``logits``."""

    def __init__(self, logits):
        self.logits = logits

    def reset(self):
        pass

    def prefill(self, ids, observer=None):
        return self.logits.copy()

    def decode(self, token, observer=None):
        return self.logits.copy()


def test_every_greedy_picker_breaks_ties_alike():
    """The sampler's greedy mode, the reference's generate loop and the diff
    tool's greedy pair all pick id 1 of TIED, the helper's pick."""
    assert Sampler(temperature=0).sample(TIED) == 1
    assert generate(Constant(TIED), [0], 3) == [1, 1, 1]
    ref_ids, other_ids, divergence = greedy_pair(Constant(TIED), Constant(TIED), [0], 3)
    assert ref_ids == other_ids == [1, 1, 1] and divergence is None
    swapped = TIED.copy()
    swapped[3] += 1.0
    _, _, divergence = greedy_pair(Constant(TIED), Constant(swapped), [0], 3)
    assert (divergence.step, divergence.reference_id, divergence.other_id) == (0, 1, 3)
    assert divergence.reference_margin == 0.0
