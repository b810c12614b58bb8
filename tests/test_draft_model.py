"""Speculative decoding with a draft model (docs/generation.md#speculative-decoding):
another model of the same vocabulary drafts greedily on its own KV cache,
and the output is still plain decoding's, id for id and logit for logit,
greedy or sampled, in both engines and both activation modes."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemma_cy
from gemma_cy.api import Model
from gemma_cy.errors import ParameterError
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from test_speculative import COPY, assert_same, copier, seen_logits

OTHER = {"reference": "fast", "fast": "reference"}


def with_draft(model, draft, prompt, processors=(), chat=False, **kw):
    """Plain and draft-model runs of one prompt, with every sampled position's logits."""
    run = model.chat_complete if chat else model.complete
    plain_seen, spec_seen = [], []
    plain = run(prompt, logits_processor=[*processors, seen_logits(plain_seen)],
                **{k: v for k, v in kw.items() if k != "draft_max"})
    spec = run(prompt, logits_processor=[*processors, seen_logits(spec_seen)], draft=draft, **kw)
    return plain, spec, plain_seen, spec_seen


@pytest.fixture(scope="module", params=["reference", "fast"])
def tiny_pair(request, tiny, tiny_model_path):
    """A target on one engine and a draft over the same weights on the other
    (so its argmax may differ): the target's processors push it where the
    draft does not go, and drafts are cut as well as kept."""
    tok = GreedyTokenizer.from_file(str(tiny_model_path) + ".tok")
    return Model(tiny, tok, request.param, 256), Model(tiny, tok, OTHER[request.param], 256)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tiny_draft_model_is_plain_decoding(tiny_pair, data):
    model, draft = tiny_pair
    vocab = model.config.vocab_size
    phrase = data.draw(st.lists(st.integers(3, vocab - 1), min_size=2, max_size=6))
    prompt = [model.tokenizer.bos_id] + data.draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=30))
    kw = data.draw(st.sampled_from([dict(temperature=0), dict(temperature=0.9, seed=data.draw(st.integers(0, 99))),
                                    dict(temperature=0, presence_penalty=0.5, repeat_penalty=1.2),
                                    dict(temperature=1.2, seed=3, top_k=20, min_p=0.0)]))
    processors = data.draw(st.sampled_from([(), (copier(phrase, 2.0),)]))
    plain, spec, a, b = with_draft(model, draft, prompt, processors, max_tokens=data.draw(st.integers(1, 40)),
                                   logprobs=2, terminate_on_eos=False, draft_max=data.draw(st.integers(1, 12)), **kw)
    assert_same(plain, spec, a, b)
    assert draft.cache.in_sync()  # its KV cache holds what its SlotCache says


def test_tiny_drafts_are_kept_and_cut(tiny_pair):
    model, draft = tiny_pair
    phrase = [5, 9, 14, 20]
    plain, spec, a, b = with_draft(model, draft, [1, 7, 8, 9], [copier(phrase, 1.0)], max_tokens=40,
                                   temperature=0.8, seed=4, terminate_on_eos=False)
    assert_same(plain, spec, a, b)
    t = spec.timing
    assert t.drafted_tokens > t.accepted_tokens > 0 and t.forward_passes < plain.timing.forward_passes


@pytest.fixture(scope="module")
def gemma(default_model):
    return gemma_cy.load(default_model, max_cache_len=2048)


@pytest.fixture(scope="module")
def gemma_q8(default_model):
    return gemma_cy.load(default_model, max_cache_len=2048, activations="q8")


STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@pytest.mark.parametrize("target, drafter", [("gemma", "gemma_q8"), ("gemma_q8", "gemma")])
def test_gemma_other_mode_drafts_plain_decoding(target, drafter, request):
    """The same file in the other activation mode drafts: free text, not a
    copy, and the output is the target's own, greedy and sampled."""
    model, draft = request.getfixturevalue(target), request.getfixturevalue(drafter)
    messages = [{"role": "user", "content": STORY}]
    for kw in (dict(temperature=0), dict(temperature=0.7, seed=11)):
        plain, spec, a, b = with_draft(model, draft, messages, chat=True, max_tokens=60, logprobs=5, **kw)
        assert_same(plain, spec, a, b)
        t = spec.timing
        assert t.accepted_tokens > 30 and t.forward_passes < plain.timing.forward_passes / 2, t


def test_draft_model_composes_with_stops_and_constraints(gemma, gemma_q8):
    messages = [{"role": "user", "content": COPY}]
    for kw in (dict(stop=["freedom to share"]), dict(regex=r"The licenses[a-z ,]{1,60}"),
               dict(stop=["works."], presence_penalty=0.3)):
        plain = gemma.chat_complete(messages, max_tokens=60, temperature=0, **kw)
        spec = gemma.chat_complete(messages, max_tokens=60, temperature=0, draft=gemma_q8, **kw)
        assert spec.ids == plain.ids and spec.stop_reason == plain.stop_reason and spec.text == plain.text, kw


def test_a_generation_on_the_draft_is_superseded(gemma, gemma_q8):
    """The draft model's KV cache is taken over at every draft, as by any generation on it."""
    own = gemma_q8.generate("Once upon a time", max_tokens=5, temperature=0)
    next(own)
    gemma.complete("Hello there", max_tokens=4, temperature=0, draft=gemma_q8)
    with pytest.raises(gemma_cy.GenerationStateError):
        next(own)


def test_bad_drafts_are_one_line(tiny_model, gemma):
    for kw, needle in ((dict(draft=tiny_model), "draft: the model itself"),
                       (dict(draft="model.gguf"), "draft: expected a Model"),
                       (dict(draft=gemma, speculative="lookup"), "give one"),
                       (dict(draft=gemma), "vocabulary"),
                       (dict(draft=gemma, draft_max=0), "draft_max = 0")):
        with pytest.raises(ParameterError) as e:
            tiny_model.complete("hi", max_tokens=2, **kw)
        assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ParameterError, match="draft: a draft model drafts for one sequence"):
        tiny_model.complete(["a", "b"], max_tokens=2, draft=gemma)


def test_cli_draft_model_prints_what_plain_prints(default_model, tmp_path):
    from helpers import assert_one_line_error, cli

    prompt = "The three primary colours are"
    plain = cli("-m", default_model, "-p", prompt, "-n", "24", "--temp", "0", "--json")
    spec = cli("-m", default_model, "-p", prompt, "-n", "24", "--temp", "0", "--json", "--draft", default_model,
               "--draft_max", "4")
    assert plain.returncode == spec.returncode == 0, spec.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert a["generated_ids"] == b["generated_ids"] and b["accepted_tokens"] > 0
    assert b["forward_passes"] < a["forward_passes"] and "kept" in spec.stderr
    assert_one_line_error(cli("-p", "x", "--draft", str(tmp_path / "absent.gguf")), "absent.gguf")
