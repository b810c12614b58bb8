"""Log-probabilities of generated tokens (docs/generation.md#log-probabilities)."""
import math

import numpy as np
import pytest

from gemma_cy.errors import ParameterError
from gemma_cy.generation.logprobs import token_logprob


def test_a_tokens_logprob_is_its_log_softmax():
    x = np.array([1.0, 3.0, -2.0, 3.0, 0.5], dtype=np.float32)
    z = sum(math.exp(float(v)) for v in x)
    got = token_logprob(x, 4, top=3)
    assert got.logprob == pytest.approx(0.5 - math.log(z), abs=1e-12)
    assert [i for i, _ in got.top] == [1, 3, 0]  # a tie goes to the lower id
    assert got.top[0][1] == pytest.approx(3.0 - math.log(z), abs=1e-12)


def test_masked_tokens_have_minus_infinity_and_are_no_alternative():
    x = np.array([-np.inf, 2.0, -np.inf], dtype=np.float32)
    got = token_logprob(x, 1, top=2)
    assert got.logprob == 0.0 and got.top == ((1, 0.0),)  # -inf is not JSON, and cannot be drawn
    assert token_logprob(x, 0, top=0).logprob == -math.inf


def test_generated_ids_carry_their_logprobs(tiny_model):
    out = tiny_model.complete("hello", max_tokens=5, temperature=0, logprobs=2, terminate_on_eos=False)
    assert [lp.token_id for lp in out.logprobs] == out.ids
    for lp in out.logprobs:  # greedy: the token is the likeliest
        assert lp.top[0] == (lp.token_id, lp.logprob) and lp.logprob <= 0
    seen = []
    masked = tiny_model.complete("hello", max_tokens=3, temperature=0.9, seed=4, logprobs=0,
                                 logits_processor=lambda ids, x: seen.append(x.copy()))
    for lp, x in zip(masked.logprobs, seen):
        assert lp.logprob == pytest.approx(float(x[lp.token_id]) - float(np.logaddexp.reduce(x.astype(np.float64))))
        assert lp.top == ()
    assert tiny_model.complete("hello", max_tokens=2).logprobs is None


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True, "3"])
def test_bad_logprobs_are_refused(tiny_model, bad):
    with pytest.raises(ParameterError, match="logprobs"):
        tiny_model.complete("hello", max_tokens=2, logprobs=bad)
