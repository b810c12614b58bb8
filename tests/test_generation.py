"""The generate loop (stop rules, clamping, streaming) on a scripted engine,
and the public API on the tiny fixture."""
import numpy as np
import pytest

import gemma_cy
from gemma_cy.errors import ContextLengthError, ParameterError, TokenIndexError
from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
from gemma_cy.generation.generator import Generation
from gemma_cy.generation.params import GenerationParams
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from helpers import ScriptedEngine

VOCAB = 1024


@pytest.fixture(scope="module")
def tok():
    return GreedyTokenizer(fixture_vocab(VOCAB))


def byte_id(tok, b):
    return VOCAB - 256 + b


def greedy(max_tokens: int) -> GenerationParams:
    return GenerationParams(temperature=0, max_tokens=max_tokens)


def test_stops_on_eos_without_printing_it(tok):
    engine = ScriptedEngine([100, 101, tok.eos_id, 102])
    gen = Generation(engine, tok, [tok.bos_id], greedy(10), stop_ids=frozenset({tok.eos_id}))
    steps = list(gen)
    assert [s.token_id for s in steps] == [100, 101]
    assert gen.stop_reason == "eos" and gen.stop_token == tok.eos_id
    assert gen.text == tok.decode([100, 101])


def test_eos_is_an_ordinary_token_without_stop_ids(tok):
    engine = ScriptedEngine([100, tok.eos_id, 102])
    gen = Generation(engine, tok, [tok.bos_id], greedy(3))
    assert [s.token_id for s in gen] == [100, tok.eos_id, 102]
    assert gen.stop_reason == "max_tokens"


def test_length_clamp_never_writes_past_the_cache(tok):
    engine = ScriptedEngine([100] * 50, cache_len=8)
    gen = Generation(engine, tok, [tok.bos_id, 10, 11], greedy(50))
    assert gen.max_new_tokens == 5
    assert len(list(gen)) == 5
    assert gen.stop_reason == "length"
    assert engine.pos <= engine.cache_len


def test_prompt_must_leave_a_free_position(tok):
    with pytest.raises(ContextLengthError, match="8"):
        Generation(ScriptedEngine([1], cache_len=8), tok, [2] * 8, greedy(5))
    with pytest.raises(ParameterError):
        Generation(ScriptedEngine([1]), tok, [], greedy(5))
    with pytest.raises(ParameterError):
        Generation(ScriptedEngine([1]), tok, [2], greedy(-1))


def test_multibyte_character_is_held_until_complete(tok):
    euro = "€".encode()  # 3 bytes, streamed as three byte tokens
    script = [byte_id(tok, b) for b in euro] + [byte_id(tok, ord("!"))]
    gen = Generation(ScriptedEngine(script), tok, [tok.bos_id], greedy(4))
    assert [s.text for s in gen] == ["", "", "€", "!"]


def test_incomplete_tail_is_flushed_as_replacement(tok):
    script = [byte_id(tok, 0xE2), byte_id(tok, 0x82)]
    gen = Generation(ScriptedEngine(script), tok, [tok.bos_id], greedy(2))
    texts = [s.text for s in gen]
    assert "".join(texts) == tok.decode(script) == gen.text
    assert gen.stop_reason == "max_tokens"


def test_closing_the_iterator_marks_interrupted(tok):
    gen = Generation(ScriptedEngine([100] * 10), tok, [tok.bos_id], greedy(10))
    next(gen)
    gen._iterator.close()
    assert gen.stop_reason == "interrupted"


def test_api_generate_and_logits(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, engine="reference")
    gen = model.generate("hello world", n_dec=8, temperature=0, terminate_on_eos=False)
    steps = list(gen)
    assert len(gen.generated_ids) == 8 and gen.stop_reason == "max_tokens"
    assert "".join(s.text for s in steps) == model.detokenize(gen.generated_ids)
    ids = model.tokenize("hello world")
    full = model.logits(ids)
    assert int(np.argmax(full)) == gen.generated_ids[0]
    # the logits of an earlier position only see the prefix
    assert np.array_equal(model.logits(ids, position=1), model.logits(ids[:2]))
    with pytest.raises(ParameterError):
        model.logits(ids, position=len(ids))
    with pytest.raises(TokenIndexError):
        model.generate([2, VOCAB])


def test_api_prompt_with_nul_lone_surrogate_and_1mb(tiny_model_path):
    model = gemma_cy.load(tiny_model_path)
    for prompt in ("a\x00b", "x\ud800y", b"\xff\xfe", "word " * 200_000):
        ids = model.prompt_ids(prompt)
        assert ids[0] == model.tokenizer.bos_id and all(0 <= i < VOCAB for i in ids)


def test_api_rejects_mismatched_tokenizer(tiny_model_path, tmp_path):
    from gemma_cy.formats.gmt import write_gmt
    other = tmp_path / "other.tok"
    write_gmt(str(other), fixture_vocab(512))
    with pytest.raises(gemma_cy.ModelFormatError, match="vocab_size"):
        gemma_cy.load(tiny_model_path, tokenizer=other)
