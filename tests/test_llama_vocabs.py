"""llama.cpp's tokenizer test suite, on its real vocabularies (docs/generation.md#real-vocabularies).

Each ``models/ggml-vocab-<name>.gguf`` of llama-cpp-python's sdist is the
vocabulary llama.cpp's converter wrote from that model's real HF tokenizer;
its ``.inp`` holds test strings (separated by ``\\n__ggml_vocab_test__\\n``)
and its ``.out`` the ids HF ``tokenizers`` gave each (``encode(text,
add_special_tokens=False)``), one line per string: what llama.cpp's
``test-tokenizer-0`` checks itself against. gemma-cy must give the same
ids, string for string, for every vocabulary with pairs; the vocabularies
without pairs load, or are refused in one line naming why.
"""
import unicodedata

import pytest

from gemma_cy.api import open_tokenizer
from gemma_cy.errors import ModelFormatError
from llama_cpp_source import sdist_or_skip

SEPARATOR = "\n__ggml_vocab_test__\n"
WITH_PAIRS = ("command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
              "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder")
LOADS = ("aquila", "gpt-neox")
# Refused, and the words the one-line reason must hold.
REFUSED = {"baichuan": "tokenizer.ggml.unknown_token_id missing",  # SentencePiece needs an unknown piece
           "bert-bge": "'bert' is not supported",          # WordPiece
           "nomic-bert-moe": "'t5' is not supported"}      # Unigram


def vocab_path(name: str):
    return sdist_or_skip("models") / "models" / f"ggml-vocab-{name}.gguf"


def pairs(name: str) -> list[tuple[str, list[int]]]:
    path = vocab_path(name)
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    if texts[-1] == "":  # the file ends with a separator
        texts.pop()
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{name}: {len(texts)} strings, {len(lines)} id lines"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@pytest.fixture(scope="module")
def tokenizers():
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = open_tokenizer(str(vocab_path(name)))
        return cache[name]
    return get


@pytest.mark.parametrize("name", WITH_PAIRS)
def test_ids_equal_hf(tokenizers, name):
    tok = tokenizers(name)
    cases = pairs(name)
    assert len(cases) >= 40
    wrong = [(text, want, got) for text, want in cases if (got := tok.encode(text)) != want]
    assert not wrong, f"{name}: {len(wrong)}/{len(cases)} differ, first {wrong[0][0]!r}: " \
                      f"HF {wrong[0][1][:16]}, gemma-cy {wrong[0][2][:16]}"


@pytest.mark.parametrize("name", [n for n in WITH_PAIRS if n not in ("llama-spm", "phi-3")])
def test_decode_gives_the_text_back(tokenizers, name):
    """HF's ids of every test string decode to the string, NFC-normalized
    where the vocabulary normalizes (qwen2, command-r, mpt). (SentencePiece's
    dummy-prefix space makes llama-spm's and phi-3's decode a rule of its
    own: tests/test_sp_llama_settings.py.)"""
    tok = tokenizers(name)
    for text, ids in pairs(name):
        if name in ("qwen2", "command-r", "mpt"):
            text = unicodedata.normalize("NFC", text)
        got = tok.decode(ids)
        assert got == text, f"{name}: {text!r} decodes to {got!r}"


def test_user_defined_tokens_match_in_any_text(tokenizers):
    """USER_DEFINED tokens are HF added tokens that are not special: matched
    whole before pre-tokenization, with or without parse_special; the
    converter's invented [PADn] fillers are not tokens HF has, so they stay text."""
    mpt = tokenizers("mpt")
    spaces = " " * 24
    run = mpt.token_id(spaces)
    assert run is not None and mpt.encode("a" + spaces + "b")[1] == run
    command_r = tokenizers("command-r")
    turn = command_r.token_id("<|START_OF_TURN_TOKEN|>")
    assert command_r.encode("x<|START_OF_TURN_TOKEN|>y").count(turn) == 1
    assert command_r.decode([turn]) == "<|START_OF_TURN_TOKEN|>"
    qwen = tokenizers("qwen2")
    pad = qwen.token_id("[PAD151646]")
    assert pad == 151646 and pad not in qwen.encode("[PAD151646]") and pad not in qwen.encode("[PAD151646]", True)
    assert qwen.decode([pad]) == "" and qwen.is_control(pad)
    end = qwen.token_id("<|im_end|>")
    assert end not in qwen.encode("<|im_end|>") and qwen.encode("<|im_end|>", parse_special=True) == [end]


@pytest.mark.parametrize("name", LOADS)
def test_vocabularies_without_pairs_load(name):
    tok = open_tokenizer(str(vocab_path(name)))
    assert tok.vocab_size > 30000 and tok.decode(tok.encode("Hello, world!")) == "Hello, world!"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_vocabularies_are_refused_in_one_line(name):
    with pytest.raises(ModelFormatError) as e:
        open_tokenizer(str(vocab_path(name)))
    assert REFUSED[name] in str(e.value) and "\n" not in str(e.value)
