"""Speculative decoding by prompt lookup (docs/generation.md#speculative-decoding):
the output is plain decoding's, id for id and logit for logit, greedy or
sampled, with stop strings, penalties, processors and constraints; drafts
are kept and cut (so both paths run) and the KV cache after it holds what
the session says."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemma_cy
from gemma_cy.api import Model
from gemma_cy.errors import ParameterError
from gemma_cy.generation.speculative import PromptLookup
from gemma_cy.tokenizers.greedy import GreedyTokenizer


def seen_logits(out: list):
    """A logits processor that records every distribution the sampler is given."""
    def record(ids, logits):
        out.append(logits.copy())
        return logits
    return record


def copier(phrase: list[int], strength: float):
    """A processor that pushes a random model to go on with ``phrase`` (the
    id after the last one's place in it), so prompt lookup has something to
    find and a draft is kept or, as strength and sampling allow, cut."""
    after = {a: b for a, b in zip(phrase, phrase[1:] + phrase[:1])}

    def push(ids, logits):
        nxt = after.get(ids[-1])
        if nxt is not None:  # (the model's logits are large: relative to its best)
            logits[nxt] = logits.max() + strength
        return logits
    return push


def run_both(model, prompt, processors=(), **kw):
    plain_seen, spec_seen = [], []
    plain = model.complete(prompt, logits_processor=[*processors, seen_logits(plain_seen)],
                           **{k: v for k, v in kw.items() if k != "draft_max"})
    spec = model.complete(prompt, logits_processor=[*processors, seen_logits(spec_seen)], speculative="lookup",
                          **{"draft_max": None, **kw})
    return plain, spec, plain_seen, spec_seen


def assert_same(plain, spec, plain_seen, spec_seen) -> None:
    assert spec.ids == plain.ids and spec.text == plain.text
    assert spec.stop_reason == plain.stop_reason and spec.logprobs == plain.logprobs
    assert len(spec_seen) == len(plain_seen)
    for a, b in zip(plain_seen, spec_seen):  # every sampled position's logits, bit for bit
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.fixture(scope="module", params=["reference", "fast"])
def tiny_models(request, tiny, tiny_model_path):
    tok = GreedyTokenizer.from_file(str(tiny_model_path) + ".tok")
    return Model(tiny, tok, request.param, 256)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tiny_model_speculative_is_plain_decoding(tiny_models, data):
    model = tiny_models
    vocab = model.config.vocab_size
    phrase = data.draw(st.lists(st.integers(3, vocab - 1), min_size=2, max_size=6))
    repeats = data.draw(st.integers(1, 6))
    prompt = [model.tokenizer.bos_id] + phrase * repeats + data.draw(st.lists(st.integers(3, vocab - 1),
                                                                           max_size=4))
    kw = data.draw(st.sampled_from([dict(temperature=0), dict(temperature=0.9, seed=data.draw(st.integers(0, 99))),
                                    dict(temperature=0, presence_penalty=0.5, repeat_penalty=1.2),
                                    dict(temperature=1.2, seed=3, top_k=20, min_p=0.0)]))
    push = copier(phrase, data.draw(st.sampled_from([-3.0, -1.0, 0.5, 2.0, 8.0])))
    plain, spec, a, b = run_both(model, prompt, [push], max_tokens=data.draw(st.integers(1, 40)), logprobs=2,
                                 terminate_on_eos=False, draft_max=data.draw(st.integers(1, 12)), **kw)
    assert_same(plain, spec, a, b)


def test_drafts_are_kept_and_cut_on_the_tiny_model(tiny_model_path, tiny):
    """Over many prompts both outcomes happen: a draft kept whole and one cut."""
    model = Model(tiny, GreedyTokenizer.from_file(str(tiny_model_path) + ".tok"), "fast", 256)
    drafted = accepted = cut = 0
    rng = np.random.default_rng(0)
    for _ in range(30):
        phrase = rng.integers(3, model.config.vocab_size, 4).tolist()
        plain, spec, a, b = run_both(model, [1] + phrase * 5, [copier(phrase, 1.0)], max_tokens=30, temperature=0.8,
                                     seed=int(rng.integers(1000)), terminate_on_eos=False)
        assert_same(plain, spec, a, b)
        drafted += spec.timing.drafted_tokens
        accepted += spec.timing.accepted_tokens
        cut += spec.timing.accepted_tokens < spec.timing.drafted_tokens
    assert drafted > accepted > 0 and cut > 0


@pytest.fixture(scope="module")
def gemma(default_model):
    return gemma_cy.load(default_model, max_cache_len=2048)


COPY = ("Copy the following text exactly, word for word:\n\n"
        "The licenses for most software and other practical works are designed to take away your "
        "freedom to share and change the works. By contrast, the GNU General Public License is "
        "intended to guarantee your freedom to share and change all versions of a program.")


@pytest.fixture(scope="module")
def gemma_q8(default_model):
    return gemma_cy.load(default_model, max_cache_len=2048, activations="q8")


@pytest.mark.parametrize("mode", ["gemma", "gemma_q8"])
def test_gemma_copying_is_plain_decoding_in_fewer_passes(mode, request):
    gemma = request.getfixturevalue(mode)  # both activation modes
    messages = [{"role": "user", "content": COPY}]
    for kw in (dict(temperature=0), dict(temperature=0.7, seed=11)):
        plain_seen, spec_seen = [], []
        plain = gemma.chat_complete(messages, max_tokens=60, logprobs=5, logits_processor=seen_logits(plain_seen),
                                    **kw)
        spec = gemma.chat_complete(messages, max_tokens=60, logprobs=5, logits_processor=seen_logits(spec_seen),
                                   speculative="lookup", **kw)
        assert_same(plain, spec, plain_seen, spec_seen)
        assert spec.timing.accepted_tokens > 20 and spec.timing.forward_passes < plain.timing.forward_passes / 2


def test_composes_with_stop_strings_and_constraints(gemma):
    messages = [{"role": "user", "content": COPY}]
    for kw in (dict(stop=["freedom to share"]), dict(regex=r"The licenses[a-z ,]{1,60}"),
               dict(stop=["works."], presence_penalty=0.3)):
        plain = gemma.chat_complete(messages, max_tokens=60, temperature=0, **kw)
        spec = gemma.chat_complete(messages, max_tokens=60, temperature=0, speculative="lookup", **kw)
        assert spec.ids == plain.ids and spec.stop_reason == plain.stop_reason and spec.text == plain.text, kw


def test_the_cache_after_it_is_what_the_session_holds(gemma, default_model):
    """Rejected drafts are rewound out of the KV cache: a follow-up prompt
    that reuses the cached prefix gives what a fresh model gives."""
    messages = [{"role": "user", "content": COPY}]
    first = gemma.chat_complete(messages, max_tokens=40, temperature=0, speculative="lookup", draft_max=5)
    assert first.timing.drafted_tokens > first.timing.accepted_tokens  # a draft was cut and rewound
    follow = messages + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]
    reused = gemma.chat_complete(follow, max_tokens=20, temperature=0)
    assert reused.timing.reused_tokens > 0
    fresh = gemma_cy.load(default_model, max_cache_len=2048).chat_complete(follow, max_tokens=20, temperature=0)
    assert reused.ids == fresh.ids


@pytest.mark.parametrize("kw, needle", [
    (dict(speculative="draft-model"), "speculative = 'draft-model'"),
    (dict(speculative="lookup", draft_max=0), "draft_max = 0"),
    (dict(speculative="lookup", draft_max=33), "draft_max = 33"),
    (dict(draft_max=4), "draft_max: needs speculative"),
    (dict(speculative="lookup", observer=lambda *a: None), "observed"),
])
def test_bad_speculative_keywords_are_one_line(tiny_model, kw, needle):
    with pytest.raises(ParameterError) as e:
        tiny_model.complete("hi", max_tokens=2, **kw)
    assert needle in str(e.value)


def scan(context: list[int], k: int) -> list[int]:
    """Prompt lookup written plainly: the longest suffix of 4, 3 or 2 ids,
    its latest earlier start with an id after it, and the k ids after it."""
    for n in (4, 3, 2):
        if len(context) <= n:
            continue
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + k]
    return []


def test_lookup_drafts_what_followed_the_latest_match():
    lookup = PromptLookup(4)
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup.propose(context, 10) == [7, 8, 1, 2]  # the latest, longest
    assert lookup.propose(context + [5, 6], 10) == []  # nothing repeats (6 follows 5 nowhere)
    assert lookup.propose(context + [5, 6, 9, 1], 10) == [2, 3, 7, 8]  # (9, 1) at 4; 4 ids: the size
    assert PromptLookup(4).propose([1, 2, 3, 1, 2], 1) == [3]  # at most the limit
    for n in range(1, 40):  # grown one id at a time: what a fresh scan of the whole context finds
        grown = PromptLookup(8)
        ids = [int(i) for i in np.random.default_rng(n).integers(0, 4, n + 5)]
        for end in range(3, len(ids) + 1):
            got, want = grown.propose(ids[:end], 8), PromptLookup(8).propose(ids[:end], 8)
            assert got == want == scan(ids[:end], 8), (ids[:end], got, want)
    lookup.record(4, 1)
    assert lookup.size == 2
    lookup.record(2, 2)
    assert lookup.size == 4


def test_forced_ids_inside_a_kept_draft(gemma):
    """A grammar's forced ids (a JSON key's text) that a draft already ran:
    the logits after them come from the block, and equal plain decoding's."""
    record = '{"name": "Alice Smith", "age": 30, "city": "Paris", "email": "alice@example.com"}'
    messages = [{"role": "user", "content": f"Copy this JSON exactly: {record}\nAnd again: {record}"}]
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "email"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                             "email": {"type": "string"}}}
    plain_seen, spec_seen = [], []
    plain = gemma.chat_complete(messages, max_tokens=60, temperature=0, json_schema=schema,
                                logits_processor=seen_logits(plain_seen))
    spec = gemma.chat_complete(messages, max_tokens=60, temperature=0, json_schema=schema, speculative="lookup",
                               logits_processor=seen_logits(spec_seen))
    assert_same(plain, spec, plain_seen, spec_seen)
    assert spec.timing.accepted_tokens > 5


def test_cli_draft_lookup_prints_what_plain_prints(default_model):
    import json

    from helpers import assert_one_line_error, cli

    prompt = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat"
    plain = cli("-m", default_model, "-p", prompt, "-n", "24", "--temp", "0", "--json")
    spec = cli("-m", default_model, "-p", prompt, "-n", "24", "--temp", "0", "--json", "--draft", "lookup")
    assert plain.returncode == spec.returncode == 0, spec.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert a["generated_ids"] == b["generated_ids"] and b["accepted_tokens"] > 0
    assert b["forward_passes"] < a["forward_passes"] and "kept" in spec.stderr
    assert_one_line_error(cli("-p", "x", "--draft_max", "3"), "draft_max", code=2)
    assert_one_line_error(cli("-p", "x", "--draft", "lookup", "--draft_max", "0"), "draft_max = 0", code=2)
