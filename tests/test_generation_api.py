"""What the API adds to the generate loop (docs/generation.md#python-api): stop
strings, penalties, logits processors, accept_token, one generation per KV
cache, complete() and chat(); on a scripted engine (exact control over
each step's logits) and on the tiny fixture."""
import numpy as np
import pytest

import gemma_cy
from gemma_cy.errors import GenerationStateError, ParameterError
from gemma_cy.generation.generator import Generation
from gemma_cy.generation.params import GenerationParams
from gemma_cy.generation.penalties import Penalties
from gemma_cy.generation.stops import StopStrings, check_stop_strings
from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from helpers import ScriptedEngine

VOCAB = 1024


@pytest.fixture(scope="module")
def tok():
    return GreedyTokenizer(fixture_vocab(VOCAB))


def byte_ids(text: str) -> list[int]:
    return [VOCAB - 256 + b for b in text.encode()]


def run(tok, script, n, **settings):
    gen = Generation(ScriptedEngine(script), tok, [tok.bos_id], GenerationParams(temperature=0, max_tokens=n, **settings))
    return gen, [s.text for s in gen]


# ------------------------------------------------------------ stop strings


def test_stop_string_split_over_three_tokens_is_never_printed(tok):
    gen, texts = run(tok, byte_ids("ab\n\nQ:cd"), 8, stop=["\n\nQ:"])
    assert gen.text == "ab" and "".join(texts) == "ab"
    assert gen.stop_reason == "stop" and gen.stop_string == "\n\nQ:"
    assert gen.generated_ids == byte_ids("ab\n\nQ:")  # the tokens that formed it are kept as ids
    # nothing of the stop string was shown while it was forming
    assert texts == ["a", "b", "", "", "", ""]


def test_stop_string_that_never_completes_is_released_at_the_end(tok):
    gen, texts = run(tok, byte_ids("ab\n\nQ"), 5, stop=["\n\nQ:"])
    assert gen.stop_reason == "max_tokens" and gen.stop_string is None
    assert gen.text == "ab\n\nQ" == "".join(texts)


def test_partial_match_restarts_inside_the_held_text(tok):
    # "aab": the held "a" fails at "aa" but "a" + "b" still completes "ab"
    gen, _ = run(tok, byte_ids("xaab-"), 5, stop=["ab"])
    assert gen.text == "xa" and gen.stop_reason == "stop"


def test_earliest_then_longest_stop_wins():
    s = StopStrings(("cd", "bcd", "b"))
    assert s.push("abcde") == "a" and s.found == "bcd"
    s = StopStrings(("bc", "bcd"))  # text arrives in pieces: the first to complete ends it
    assert s.push("ab") == "a" and s.push("c") == "" and s.found == "bc" and s.push("d") == ""
    assert check_stop_strings("x") == ("x",) and check_stop_strings(["x", "x", "y"]) == ("x", "y")
    for bad in ("", [""], [1], b"x", 3):
        with pytest.raises(ParameterError):
            check_stop_strings(bad)


def test_stop_on_a_multibyte_character_held_by_the_decoder(tok):
    gen, _ = run(tok, byte_ids("1€2"), 5, stop=["€"])
    assert gen.text == "1" and gen.stop_reason == "stop"


# ------------------------------------------------ processors and accept_token


def test_logits_processor_bans_the_id_greedy_would_pick(tok):
    script = [100, 100, 101, 100]
    gen, _ = run(tok, script, 4)
    assert 100 in gen.generated_ids  # without the processor it is picked

    seen = []

    def ban_100(ids, logits):
        assert logits.flags.writeable and logits.dtype == np.float32
        seen.append(list(ids))
        logits[100] = -np.inf
        return logits

    gen, _ = run(tok, script, 4, logits_processor=ban_100)
    assert 100 not in gen.generated_ids and len(gen.generated_ids) == 4
    assert seen[0] == [tok.bos_id] and seen[2] == [tok.bos_id] + gen.generated_ids[:2]


def test_processors_apply_in_order_and_in_place_edits_count(tok):
    def first(ids, logits):
        logits[7] = 50.0  # edited in place, returns None

    def second(ids, logits):
        return np.where(np.arange(VOCAB) == 7, -np.inf, logits).astype(np.float32)

    gen, _ = run(tok, [100], 1, logits_processor=[first])
    assert gen.generated_ids == [7]
    gen, _ = run(tok, [100], 1, logits_processor=[first, second])
    assert gen.generated_ids == [100]


@pytest.mark.parametrize("bad", [lambda ids, x: x[:5], lambda ids, x: "no", lambda ids, x: x.astype(np.int32)])
def test_processor_returning_the_wrong_thing_is_a_parameter_error(tok, bad):
    with pytest.raises(ParameterError, match="logits_processor"):
        run(tok, [100], 1, logits_processor=bad)


def test_processor_banning_everything_is_a_numerical_error(tok):
    from gemma_cy.errors import NumericalError
    with pytest.raises(NumericalError, match="-inf"):
        run(tok, [100], 1, logits_processor=lambda ids, x: np.full_like(x, -np.inf))


def test_accept_token_ends_generation_before_the_refused_id(tok):
    calls = []

    def accept(token):
        calls.append(token)
        return token != 102

    gen, texts = run(tok, [100, 101, 102, 103], 4, accept_token=accept)
    assert gen.generated_ids == [100, 101] and gen.stop_reason == "rejected" and gen.stop_token == 102
    assert calls == [100, 101, 102]
    with pytest.raises(ParameterError, match="accept_token"):
        run(tok, [100], 1, accept_token=5)


# ---------------------------------------------------------------- penalties


def test_penalties_follow_llama_cpps_definitions():
    logits = np.array([2.0, -2.0, 3.0, 1.0, 0.5], np.float32)
    x = logits.copy()
    Penalties(repeat_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5, repeat_last_n=4).apply(
        [4, 0, 1, 0, 0], x)  # window: 0, 1, 0, 0 (id 4 is outside)
    # id 0: 2 / 2 - 3 * 0.5 - 0.25; id 1: -2 * 2 - 0.5 - 0.25
    assert x.tolist() == [2 / 2 - 1.5 - 0.25, -4 - 0.5 - 0.25, 3.0, 1.0, 0.5]
    y = logits.copy()
    Penalties().apply([0, 1, 2], y)
    assert np.array_equal(y, logits) and not Penalties().active
    for bad in (dict(repeat_penalty=0), dict(repeat_penalty=float("nan")), dict(presence_penalty=float("inf")),
                dict(repeat_last_n=-1), dict(repeat_last_n=True), dict(frequency_penalty="1")):
        with pytest.raises(ParameterError):
            Penalties(**bad)


def test_repeat_penalty_changes_a_greedy_choice(tok):
    row = np.zeros(VOCAB, np.float32)
    row[100], row[101] = 2.0, 1.9
    gen, _ = run(tok, [row] * 3, 3)
    assert gen.generated_ids == [100, 100, 100]
    gen, _ = run(tok, [row] * 3, 3, repeat_penalty=1.1)
    assert gen.generated_ids == [100, 101, 100]  # 2/1.1 < 1.9, then 101 is penalized too: 1.9/1.1 < 2/1.1


# ----------------------------------------------------- stop_reason on break


def test_break_sets_interrupted_and_resuming_finishes(tok):
    gen = Generation(ScriptedEngine([100] * 6), tok, [tok.bos_id], GenerationParams(temperature=0, max_tokens=6))
    assert gen.stop_reason is None
    for i, _ in enumerate(gen):
        if i == 1:
            break
    assert gen.stop_reason == "interrupted"
    rest = gen.complete()
    assert rest.stop_reason == "max_tokens" and len(rest.ids) == 6


# --------------------------------------------- the API on the tiny fixture


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return gemma_cy.load(tiny_model_path, max_cache_len=128)


def test_interleaved_generations_the_older_one_raises(model):
    g1 = model.generate("hello", max_tokens=10, temperature=0, terminate_on_eos=False)
    first = next(g1)
    g2 = model.complete("other text", max_tokens=5, temperature=0, terminate_on_eos=False)
    assert len(g2.ids) == 5
    with pytest.raises(GenerationStateError, match="superseded"):
        next(g1)
    # a generation left alone resumes where it was, identical to an uninterrupted one
    g3 = model.generate("hello", max_tokens=10, temperature=0, terminate_on_eos=False)
    head = [next(g3).token_id for _ in range(3)]
    tail = g3.complete().ids[3:]
    whole = model.complete("hello", max_tokens=10, temperature=0, terminate_on_eos=False).ids
    assert head + tail == whole and head[0] == first.token_id
    with pytest.raises(GenerationStateError):
        model.logits("x") is not None and next(g1)


def test_temperature_sampling_is_reproducible_per_seed_and_differs_between_seeds(model):
    def ids(seed, **kw):
        return model.complete("hello", max_tokens=20, seed=seed, terminate_on_eos=False, **kw).ids
    assert ids(1) == ids(1) and ids(1) != ids(2)  # the defaults sample
    assert ids(1, temperature=1.2) != ids(2, temperature=1.2)
    assert ids(1, temperature=0) == ids(2, temperature=0)


def test_complete_returns_the_whole_text(model):
    out = model.complete("hello", max_tokens=7, temperature=0, terminate_on_eos=False)
    gen = model.generate("hello", max_tokens=7, temperature=0, terminate_on_eos=False)
    assert out.text == "".join(s.text for s in gen) == model.detokenize(out.ids)
    assert out.stop_reason == "max_tokens" and out.prompt_ids == model.prompt_ids("hello")
    with pytest.raises(ParameterError, match="max_tokens"):
        model.complete("hello", max_tokens=3, n_dec=4)
    assert len(model.complete("hello", n_dec=3, temperature=0, terminate_on_eos=False).ids) == 3


def test_messages_to_generate_point_to_chat(model):
    with pytest.raises(ParameterError, match="chat"):
        model.generate([{"role": "user", "content": "hi"}])


def test_chat_reuses_the_cache_of_the_earlier_turns(model):
    messages = [{"role": "user", "content": "hi"}]
    first = model.chat_complete(messages, max_tokens=4, temperature=0)
    cached = list(model.cache.ids)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
    gen = model.chat(messages, max_tokens=4, temperature=0)
    whole = model.chat_ids(messages)
    kept = gen.reused
    assert kept >= len(model.chat_ids(messages[:1])) and whole[:kept] == cached[:kept]
    assert gen.prompt_ids == whole and gen.context_ids == []  # the whole prompt, its first `kept` cached
    out = gen.complete()
    assert out.prompt_ids == whole
    assert (out.timing.reused_tokens, out.timing.prefill_tokens) == (kept, len(whole) - kept)
    # the same turn from an empty cache gives the same greedy reply
    model.cache.reset()
    fresh = model.chat_complete(messages, max_tokens=4, temperature=0)
    assert fresh.ids == out.ids and fresh.timing.reused_tokens == 0


def test_load_without_a_path_is_the_default_model(monkeypatch, tmp_path):
    import gemma_cy.formats.packaged as packaged
    from gemma_cy.errors import GemmaCyError

    monkeypatch.setattr(packaged, "default_model_path", lambda progress=True: str(tmp_path / "default.gguf"))
    with pytest.raises(GemmaCyError, match="default.gguf"):
        gemma_cy.load()
