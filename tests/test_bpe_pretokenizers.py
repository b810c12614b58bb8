"""Every byte-level BPE pre-tokenizer (gemma_cy/tokenizers/bpe_pre.py) against HF ``tokenizers``.

tests/goldens/bpe_pre/ holds, per rule, a small BPE trained with HF's
``BpeTrainer`` under that family's own HF pipeline and HF's ids for every
corpus string, and for the rule's own strings after them (``extra``: gpt-4o's
mixed-case words; scripts/make_bpe_pre_goldens.py). BPETokenizer built from the
same vocab and merges with ``pre=<rule>`` must give the same ids, string for
string; on the adversarial strings, the same pieces too. The rules must be
told apart by the corpus (each golden can fail), and an unknown name is
refused in one line.
"""
import gzip
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gguf_writer import write_gguf
from gemma_cy.tokenizers.bpe import TOKEN_CONTROL, TOKEN_NORMAL, BPETokenizer, byte_alphabet
from gemma_cy.tokenizers.bpe_pre import ALIASES, PRE_TOKENIZERS, RULES, nfc, pre_tokenizer

pytestmark = pytest.mark.oracle

GOLDENS = Path(__file__).resolve().parent / "goldens" / "bpe_pre"
BYTE_OF = {ch: b for b, ch in enumerate(byte_alphabet())}


def read(name: str):
    return json.loads(gzip.decompress((GOLDENS / f"{name}.json.gz").read_bytes()))


@lru_cache(maxsize=None)
def corpus() -> tuple[list[str], int]:
    data = read("corpus")
    return data["texts"], data["adversarial"]


@lru_cache(maxsize=None)
def golden(rule: str) -> dict:
    return read(rule)


def texts_of(rule: str) -> tuple[list[str], int]:
    """The strings the rule's golden has ids for, and how many at the end have HF's pieces too."""
    texts, n = corpus()
    extra = golden(rule).get("extra", [])
    return texts + extra, n + len(extra)


def fields(rule: str, pre: str | None = None) -> dict:
    g = golden(rule)
    types = [TOKEN_CONTROL if i in g["control"] else TOKEN_NORMAL for i in range(len(g["tokens"]))]
    return {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": rule if pre is None else pre,
            "tokenizer.ggml.tokens": g["tokens"], "tokenizer.ggml.token_type": np.array(types, np.int32),
            "tokenizer.ggml.merges": g["merges"], "tokenizer.ggml.bos_token_id": g["control"][0],
            "tokenizer.ggml.eos_token_id": g["control"][0]}


def build(rule: str, pre: str | None = None) -> BPETokenizer:
    f = fields(rule, pre)
    return BPETokenizer(f["tokenizer.ggml.tokens"], list(f["tokenizer.ggml.token_type"]), f["tokenizer.ggml.merges"],
                        f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"],
                        pre=f["tokenizer.ggml.pre"], source=rule)


def mismatches(tok: BPETokenizer, want: list[list[int]], texts: list[str]) -> list[str]:
    return [f"{t!r}: ours {tok.encode(t)} HF {w}" for t, w in zip(texts, want) if tok.encode(t) != w]


@pytest.fixture(scope="module", params=sorted(RULES))
def rule(request):
    return request.param


def test_goldens_cover_every_rule():
    assert {p.name.removesuffix(".json.gz") for p in GOLDENS.glob("*.json.gz")} == {*RULES, "corpus"}
    assert golden("llama-bpe")["ignore_merges"] and not golden("qwen2")["ignore_merges"]


def test_ids_match_hf(rule):
    texts, _ = texts_of(rule)
    bad = mismatches(build(rule), golden(rule)["ids"], texts)
    assert not bad, f"{len(bad)}/{len(texts)} strings differ from HF, e.g.\n" + "\n".join(bad[:5])


def test_special_parsing_matches_hf(rule):
    texts, _ = texts_of(rule)
    g = golden(rule)
    tok = build(rule)
    assert g["ids_special"], "the corpus writes control tokens as text"
    bad = [t for i, t in enumerate(texts) if "<|" in t
           and tok.encode(t, parse_special=True) != g["ids_special"].get(str(i), g["ids"][i])]
    assert not bad, bad[:5]


def test_adversarial_pieces_match_hf(rule):
    texts, n = texts_of(rule)
    want = [[bytes(BYTE_OF[c] for c in piece) for piece in pieces] for pieces in golden(rule)["adversarial_pieces"]]
    bad = [(t, RULES[rule].pieces(t), w) for t, w in zip(texts[-n:], want) if RULES[rule].pieces(t) != w]
    assert not bad, f"{len(bad)}/{n} differ, e.g. {bad[:3]}"


def test_decode_round_trips(rule):
    texts, _ = texts_of(rule)
    tok = build(rule)
    normalize = nfc if RULES[rule].normalize else str
    bad = [t for t in texts if tok.decode_bytes(tok.encode(t)) != normalize(t).encode()]
    assert not bad, bad[:5]


def test_from_gguf_reads_the_pre_tokenizer(tmp_path, rule):
    texts, _ = texts_of(rule)
    path = tmp_path / f"{rule}.gguf"
    write_gguf(path, fields(rule), [])
    tok = BPETokenizer.from_gguf(str(path))
    assert tok.pre == rule
    bad = mismatches(tok, golden(rule)["ids"][::5], texts[::5])
    assert not bad, bad[:5]


def test_swapping_rule_names_changes_ids(rule):
    """Each golden can fail: read with the next rule's name, some string gets other ids."""
    names = sorted(RULES)
    other = names[(names.index(rule) + 1) % len(names)]
    texts, _ = texts_of(rule)
    tok = build(rule, pre=other)
    assert any(tok.encode(t) != ids for t, ids in zip(texts, golden(rule)["ids"])), (rule, other)


def test_rules_are_distinguishable_on_the_corpus():
    texts, _ = corpus()
    pieces = {name: [r.pieces(t) for t in texts] for name, r in RULES.items()}
    same = [(a, b) for a in RULES for b in RULES if a < b and pieces[a] == pieces[b]]
    assert not same


def test_ignore_merges_matters_for_llama3():
    """A piece that is a whole token but that the merges would split exists in
    the corpus, so the llama-bpe golden checks ignore_merges."""
    texts, _ = corpus()
    tok = build("llama-bpe")
    pieces = {p for t in texts for p in RULES["llama-bpe"].pieces(t)}
    assert any(p in tok._token_ids and tok._bpe(p) != [tok._token_ids[p]] for p in pieces)


@pytest.mark.parametrize("text, pieces", [
    ("HelloWorld iPhone", ["Hello", "World", " i", "Phone"]),
    ("McDonald's ALLCAPS'LL", ["Mc", "Donald's", " ALLCAPS'LL"]),
    ("HTMLParser getHTTPResponse", ["HTMLParser", " get", "HTTPResponse"]),
    ("e\u0301COLE \u0301's", ["e\u0301", "COLE", " \u0301's"]),
    ("a/b\n.\n/x 1234567", ["a", "/b", "\n", ".\n/", "x", " ", "123", "456", "7"]),
    ("ΑλφαΒήτα 我们Hello", ["Αλφα", "Βήτα", " 我们Hello"]),  # Lo is in both classes
])
def test_gpt4o_splits_words_by_case(text, pieces):
    """o200k's words: an upper-case run ends where a lower-case one follows (HF's pieces, from its golden)."""
    assert RULES["gpt-4o"].pieces(text) == [p.encode() for p in pieces]


def test_aliases_name_the_same_rule():
    for alias, target in ALIASES.items():
        assert pre_tokenizer(alias) is RULES[target]
    assert set(PRE_TOKENIZERS) == {*RULES, *ALIASES}


@pytest.mark.parametrize("name", ["tekken", "gpt2", "Qwen2", "", "llama-bpe "])
def test_unknown_pre_refused_in_one_line(tmp_path, name):
    with pytest.raises(ModelFormatError) as e:
        build("gpt-2", pre=name)
    message = str(e.value)
    assert "\n" not in message and repr(name) in message and all(p in message for p in PRE_TOKENIZERS)
    if name:
        path = tmp_path / "bad.gguf"
        write_gguf(path, fields("gpt-2", pre=name), [])
        with pytest.raises(ModelFormatError, match="is not supported"):
            BPETokenizer.from_gguf(str(path))


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=40))
def test_pieces_cover_the_text(text):
    for r in RULES.values():
        want = (nfc(text) if r.normalize else text).encode()
        assert b"".join(r.pieces(text)) == want, r.name
        assert all(r.pieces(text))
