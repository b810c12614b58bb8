"""Speculative decoding inside a batch (docs/generation.md#speculative-decoding):
each sequence drafts on its own, its block runs whole in the batch step
with every position's logits, and every sequence gets plain decoding's
ids and logits alone, whatever else runs beside it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemma_cy
from gemma_cy.api import Model
from gemma_cy.errors import ParameterError
from gemma_cy.model.checks import Logits
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from test_speculative import COPY, assert_same, copier, seen_logits


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(scope="module", params=["reference", "fast"])
def tiny_batch(request, tiny, tiny_model_path):
    return Model(tiny, GreedyTokenizer.from_file(str(tiny_model_path) + ".tok"), request.param, 256,
                 max_sequences=4)


def test_a_block_of_every_position_is_what_one_engine_gives(tiny_batch):
    """step(..., "all") beside decode rows and a prompt chunk: each position's
    logits the bits of the one-sequence engine's states and logits_of, and
    a block longer than a pass is split and joined."""
    model = tiny_batch
    batch, engine = model.engine.batch, model.engine
    rng = np.random.default_rng(1)
    vocab = model.config.vocab_size
    prompts = [rng.integers(3, vocab, n).tolist() for n in (5, 9, 3, 7)]
    for slot in range(4):
        batch.reset(slot)
    batch.step([(s, p, False) for s, p in enumerate(prompts)])
    blocks = {1: rng.integers(3, vocab, 6).tolist(), 3: rng.integers(3, vocab, 70).tolist()}  # 70: two passes
    out = batch.step([(0, [4], Logits.LAST), (1, blocks[1], Logits.ALL),
                      (2, rng.integers(3, vocab, 12).tolist(), Logits.LAST), (3, blocks[3], Logits.ALL)])
    assert out[0].shape == (vocab,) and out[1].shape == (6, vocab) and out[3].shape == (70, vocab)
    for slot, got in ((1, out[1]), (3, out[3])):
        engine.reset()
        engine.prefill(prompts[slot])
        want = engine.logits_of(engine.states(blocks[slot]))
        assert np.array_equal(bits(got), bits(want)), slot
    with pytest.raises(ParameterError, match="want = .some.: a Logits"):
        batch.step([(0, [4], "some")])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_batched_lookup_is_each_sequence_alone(tiny_batch, data):
    model = tiny_batch
    vocab = model.config.vocab_size
    n = data.draw(st.integers(2, 5))
    prompts, per, alone = [], [], []
    for i in range(n):
        phrase = data.draw(st.lists(st.integers(3, vocab - 1), min_size=2, max_size=5))
        prompt = [model.tokenizer.bos_id] + phrase * data.draw(st.integers(1, 4))
        kw = dict(max_tokens=data.draw(st.integers(1, 30)), logprobs=2, terminate_on_eos=False,
                  **data.draw(st.sampled_from([dict(temperature=0), dict(temperature=0.9, seed=i),
                                               dict(temperature=0, presence_penalty=0.4)])))
        push = copier(phrase, data.draw(st.sampled_from([-1.0, 0.5, 8.0])))
        seen_plain, seen_batch = [], []
        alone.append((model.complete(prompt, logits_processor=[push, seen_logits(seen_plain)], **kw), seen_plain,
                      seen_batch))
        spec = data.draw(st.booleans())
        prompts.append(prompt)
        per.append(dict(kw, logits_processor=[push, seen_logits(seen_batch)],
                        **(dict(speculative="lookup", draft_max=data.draw(st.integers(1, 12))) if spec else {})))
    got = model.complete(prompts, per_sequence=per)
    for (plain, seen_plain, seen_batch), batched in zip(alone, got):
        assert_same(plain, batched, seen_plain, seen_batch)


@pytest.fixture(scope="module")
def gemma_batch(default_model):
    return gemma_cy.load(default_model, max_cache_len=2048, max_sequences=4)


def test_gemma_copying_in_a_batch(gemma_batch, default_model):
    """Three copy requests and a free one, with lookup, in one batch: each
    reply is the single plain run's, in fewer passes for the copies."""
    texts = [COPY, COPY.replace("exactly", "exactly, please"), "Name three rivers in Europe.",
             "Copy this exactly: one two three four five six seven eight nine ten."]
    single = gemma_cy.load(default_model, max_cache_len=2048)
    plain = [single.chat_complete([{"role": "user", "content": t}], max_tokens=48, temperature=0) for t in texts]
    batch = gemma_batch.generate_many(texts, chat_format=True, max_tokens=48, temperature=0, speculative="lookup")
    got = batch.complete()
    for p, g in zip(plain, got):
        assert g.ids == p.ids and g.stop_reason == p.stop_reason
    assert got[0].timing.forward_passes < plain[0].timing.forward_passes / 2


def test_a_draft_model_is_refused_in_a_batch(tiny_batch):
    with pytest.raises(ParameterError, match="draft: a draft model drafts for one sequence"):
        tiny_batch.complete(["a", "b"], max_tokens=2, draft=tiny_batch)
