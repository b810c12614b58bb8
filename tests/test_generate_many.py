"""Several prompts at once through the API (docs/generation.md#batching):
``Model.complete([...])`` and ``Model.generate_many`` give every prompt
exactly what ``Model.complete`` gives it alone, whatever the mix of
sampling settings, stop strings, penalties and processors, however many
run together and in whichever order they join."""
import numpy as np
import pytest

import gemma_cy
from gemma_cy.errors import ContextLengthError, GenerationStateError, ParameterError

PROMPTS = ["Once upon a time", "The cat", "1 2 3 4", "hello world, héllo", "", "a b c d e f g h i j k l m n o p",
           "The three most important inventions"]


def settings_of(i: int) -> dict:
    """A different mix per prompt: greedy, seeded sampling, filters, penalties, stops, a processor."""
    mixes = [
        dict(temperature=0, max_tokens=7),
        dict(temperature=0.9, seed=3, max_tokens=9),
        dict(temperature=1.2, seed=11, top_k=20, top_p=0.9, max_tokens=5),
        dict(temperature=0, repeat_penalty=1.3, presence_penalty=0.5, max_tokens=8),
        dict(temperature=0.7, seed=5, stop=["e"], max_tokens=12),
        dict(temperature=0, logits_processor=lambda ids, x: np.where(np.arange(len(x)) % 2 == 0, x, -np.inf),
             max_tokens=6),
        dict(temperature=0.8, seed=9, frequency_penalty=0.4, max_tokens=10, terminate_on_eos=False),
    ]
    return mixes[i % len(mixes)]


def alone(path, prompt, engine="fast", **kw):
    return gemma_cy.load(path, engine=engine, max_cache_len=256).complete(prompt, **kw)


@pytest.mark.parametrize("max_sequences", [1, 3, 8])
def test_each_prompt_gets_what_it_gets_alone(tiny_model_path, max_sequences):
    model = gemma_cy.load(tiny_model_path, max_cache_len=256, max_sequences=max_sequences)
    got = model.complete(PROMPTS, per_sequence=[settings_of(i) for i in range(len(PROMPTS))])
    assert len(got) == len(PROMPTS)
    for i, (prompt, c) in enumerate(zip(PROMPTS, got)):
        want = alone(tiny_model_path, prompt, **settings_of(i))
        assert (c.ids, c.text, c.stop_reason, c.stop_string, c.prompt_ids) == \
            (want.ids, want.text, want.stop_reason, want.stop_string, want.prompt_ids), f"prompt {i}"


def test_streamed_steps_are_each_sequences_text(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, max_cache_len=256, max_sequences=4)
    run = model.generate_many(PROMPTS[:5], temperature=0.8, seed=2, max_tokens=6)
    texts = [""] * 5
    order = []
    for i, step in run:
        texts[i] += step.text
        order.append(i)
    assert len(set(order[:4])) > 1  # tokens of several sequences interleave
    for i in range(5):
        g = run.generations[i]
        assert texts[i] == g.text and g.stop_reason in ("max_tokens", "eos")
        assert g.text == alone(tiny_model_path, PROMPTS[i], temperature=0.8, seed=2, max_tokens=6).text


def test_the_reference_engine_batches_too(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, engine="reference", max_cache_len=64, max_sequences=2)
    got = model.complete(PROMPTS[:3], temperature=0, max_tokens=4)
    assert [c.ids for c in got] == [alone(tiny_model_path, p, engine="reference", temperature=0,
                                          max_tokens=4).ids for p in PROMPTS[:3]]


def test_a_batch_takes_the_cache_over(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, max_cache_len=256, max_sequences=2)
    single = model.generate("The cat", temperature=0, max_tokens=5)
    next(single)
    model.complete(["a", "b"], temperature=0, max_tokens=2)
    with pytest.raises(GenerationStateError):
        next(single)
    assert model.complete("The cat", temperature=0, max_tokens=5).ids == \
        alone(tiny_model_path, "The cat", temperature=0, max_tokens=5).ids


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.generate_many([]), ParameterError, "empty"),
    (lambda m: m.generate_many("one prompt"), ParameterError, "list of prompts"),
    (lambda m: m.generate_many(["a", "b"], per_sequence=[{}]), ParameterError, "2 dicts"),
    (lambda m: m.generate_many(["a", "b"], per_sequence=[{}, {"temprature": 1}]), ParameterError,
     "prompt 1: unknown keyword 'temprature'"),
    (lambda m: m.generate_many(["a", "b"], per_sequence=[{}, {"temperature": -1}]), ParameterError, "temperature"),
    (lambda m: m.generate_many(["a"], observer=print), ParameterError, "observer"),
    (lambda m: m.generate_many(["a", [1] * 300]), ContextLengthError, "do not fit"),
    (lambda m: m.generate_many(["a", [5000]]), Exception, "5000"),
])
def test_bad_batches_fail_before_anything_runs(tiny_model_path, call, error, match):
    model = gemma_cy.load(tiny_model_path, max_cache_len=256, max_sequences=2)
    with pytest.raises(error, match=match):
        call(model)


def test_max_sequences_is_checked(tiny_model_path):
    with pytest.raises(ParameterError, match="max_sequences"):
        gemma_cy.load(tiny_model_path, max_sequences=0)


def count_prompt_rows(model) -> list[int]:
    """Spy on the batch engine: the rows of every multi-row segment it runs."""
    batch = model.engine.batch
    rows, step = [], batch.step

    def counting(segments):
        rows.extend(len(ids) for _, ids, _ in segments if len(ids) > 1)
        return step(segments)
    batch.step = counting
    return rows


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_n_samples_of_one_prompt_prefill_it_once(tiny_model_path, engine):
    """n=4: the prompt's 90 positions run once (the other three copy the KV
    cache); sample k is what complete gives alone with seed + k."""
    prompt = [(13 * i + 5) % 1000 + 3 for i in range(90)]
    model = gemma_cy.load(tiny_model_path, engine=engine, max_cache_len=128, max_sequences=4)
    rows = count_prompt_rows(model)
    got = model.complete(prompt, n=4, temperature=0.9, seed=7, max_tokens=6, terminate_on_eos=False)
    assert sum(rows) == len(prompt)
    for k, c in enumerate(got):
        want = alone(tiny_model_path, prompt, engine=engine, temperature=0.9, seed=7 + k, max_tokens=6,
                     terminate_on_eos=False)
        assert (c.ids, c.text) == (want.ids, want.text), f"sample {k}"
    assert len({tuple(c.ids) for c in got}) > 1  # the samples differ


def test_n_chat_replies(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, max_cache_len=128, max_sequences=2)
    messages = [{"role": "user", "content": "hello there"}]
    got = model.chat_complete(messages, n=3, temperature=1.0, seed=1, max_tokens=5)
    assert len(got) == 3
    for k, c in enumerate(got):
        other = gemma_cy.load(tiny_model_path, max_cache_len=128)
        assert c.ids == other.chat_complete(messages, temperature=1.0, seed=1 + k, max_tokens=5).ids


@pytest.mark.parametrize("kwargs, match", [({"n": 0}, "n = 0"), ({"n": 2, "rng": gemma_cy.SplitMix64(1)}, "seed, not rng"),
                                           ({"n": True}, "n = True")])
def test_bad_n_is_refused(tiny_model_path, kwargs, match):
    model = gemma_cy.load(tiny_model_path, max_cache_len=64, max_sequences=2)
    with pytest.raises(ParameterError, match=match):
        model.complete("a", **kwargs)
