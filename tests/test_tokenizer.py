"""GreedyTokenizer, StreamDecoder and the fixture vocabulary (docs/formats.md#gmt1-tokenizer).

Longest match is checked against a brute-force encoder written here; streaming
against whole decoding (docs/errors.md cases 19, 20, 26, 32).
"""
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_cy.errors import TokenIndexError
from gemma_cy.tokenizers.fixture_vocab import MAX_VOCAB, MIN_VOCAB, WORDS, fixture_vocab
from gemma_cy.formats.gmt import PIECE_BYTE, PIECE_CONTROL, PIECE_NORMAL, Vocab, write_gmt
from gemma_cy.tokenizers.greedy import GreedyTokenizer, text_to_bytes

N, B, C = PIECE_NORMAL, PIECE_BYTE, PIECE_CONTROL

# A vocabulary built to make longest match interesting: nested prefixes,
# a duplicated piece, a normal piece equal to a control piece, byte pieces that
# duplicate normal ones, and bytes with no piece at all ("z", "\xff").
HAND = [
    (b"<eos>", C), (b"a", N), (b"ab", N), (b"abc", N), (b"b", N), (b"bc", N),
    (b"bca", N), (b"ca", N), (b"<e", N), (b"cab", N), (b"ab", N), (b"<s>", C),
    (b"<eos>", N), (b"<unk>", C), (b"eo", N), (b"abcab", N),
    (b"a", B), (b"b", B), (b"c", B), (b"<", B), (b">", B), (b"e", B), (b"o", B), (b"s", B),
]
HAND_UNK = 13
HAND_ATOMS = [b"a", b"b", b"c", b"<", b">", b"e", b"o", b"s", b"z", b"\xff", b"<eos>", b"<s>", b"<unk>"]


def hand_vocab() -> Vocab:
    pieces = [p for p, _ in HAND]
    types = [t for _, t in HAND]
    return Vocab(pieces, types, [-float(i) for i in range(len(HAND))], bos_id=0, eos_id=0, unk_id=HAND_UNK, pad_id=0)


def brute_force_encode(vocab: Vocab, data: bytes, parse_special: bool) -> list[int]:
    """At each position, scan every piece; the longest wins, the first id on ties."""
    ids, i = [], 0
    while i < len(data):
        best = None
        for token, (piece, ptype) in enumerate(zip(vocab.pieces, vocab.types)):
            if not piece or (ptype == PIECE_CONTROL and not parse_special):
                continue
            if data.startswith(piece, i) and (best is None or len(piece) > len(vocab.pieces[best])):
                best = token
        if best is None:
            ids.append(vocab.unk_id)
            i += 1
        else:
            ids.append(best)
            i += len(vocab.pieces[best])
    return ids


@pytest.fixture(scope="module")
def hand():
    return GreedyTokenizer(hand_vocab())


@pytest.fixture(scope="module")
def tok():
    return GreedyTokenizer(fixture_vocab(1024))


# ---------------------------------------------------------------- longest match

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(atoms=st.lists(st.sampled_from(HAND_ATOMS), max_size=40), parse_special=st.booleans())
def test_longest_match_equals_brute_force(hand, atoms, parse_special):
    data = b"".join(atoms)
    assert hand.encode(data, parse_special=parse_special) == brute_force_encode(hand.vocab, data, parse_special)


def test_longest_match_examples(hand):
    assert hand.encode(b"abcab") == [15]
    assert hand.encode(b"abcabc") == [15, 18]  # "abcab" then the byte piece "c"
    assert hand.encode(b"abca") == [3, 1]  # "abc" + "a", not "ab" + "ca"
    assert hand.encode(b"bcab") == [6, 4]


def test_duplicated_piece_first_id_wins(hand):
    assert hand.encode(b"ab") == [2]  # not the second "ab" (10)
    assert hand.encode(b"a") == [1]  # the normal "a" shadows the byte piece (16)
    assert hand.token_id("ab") == 2


def test_unk_for_bytes_without_a_piece(hand):
    assert hand.encode(b"z") == [HAND_UNK]
    assert hand.encode(b"azz\xff") == [1, HAND_UNK, HAND_UNK, HAND_UNK]


def test_control_pieces_only_with_parse_special(hand):
    assert hand.encode(b"<eos>") == [12]  # the normal piece of the same text
    assert hand.encode(b"<eos>", parse_special=True) == [0]  # the control piece has the lower id
    assert hand.encode(b"<s>") == [19, 23, 20]
    assert hand.encode(b"<s>", parse_special=True) == [11]
    assert hand.encode(b"<e<s>", parse_special=True) == [8, 11]


# ---------------------------------------------------------------- the fixture tokenizer

def test_row20_typed_control_text_is_plain(tok):
    for marker in ("<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<unk>"):
        ids = tok.encode(marker)
        assert not any(tok.is_control(i) for i in ids)
        assert tok.decode(ids) == marker
        assert tok.encode(marker, parse_special=True) == [tok.token_id(marker)]
    assert tok.encode("<eos>") != [tok.eos_id]


def test_chat_template_with_parse_special(tok):
    ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>\n", parse_special=True)
    assert ids[0] == tok.token_id("<start_of_turn>") == 4
    assert tok.token_id("<end_of_turn>") == 5 and 5 in ids
    assert tok.decode(ids) == "user\nhi\n"


def test_no_bos_no_dummy_space_no_normalization(tok):
    assert tok.encode("") == []
    assert tok.encode("the") == [tok.token_id("the")]
    assert tok.encode(" the") == [tok.token_id(" the")]
    assert tok.encode("The time") == [tok.token_id("The"), tok.token_id(" time")]
    assert tok.decode(tok.encode("e\u0301 ﬁ")) == "e\u0301 ﬁ"  # no NFC / NFKC


def test_special_ids_and_lookup(tok):
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id, tok.vocab_size) == (0, 1, 2, 3, 1024)
    assert [tok.is_control(i) for i in range(7)] == [True] * 6 + [False]
    assert tok.token_id(b" the") == tok.token_id(" the") == 6
    assert tok.token_id("no such piece") is None
    assert tok.decode([tok.bos_id, tok.eos_id]) == ""


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_str_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == tok.encode(text.encode("utf-8"))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=60))
def test_bytes_round_trip(tok, data):
    ids = tok.encode(data)
    assert tok.decode_bytes(ids) == data
    assert tok.decode(ids) == data.decode("utf-8", "replace")


def test_lone_surrogates_examples(tok):
    assert text_to_bytes("a\udcff\udc80") == b"a\xff\x80"  # surrogateescape: the raw bytes
    assert text_to_bytes("\ud800b") == b"\xed\xa0\x80b"  # other lone surrogates: surrogatepass
    assert text_to_bytes("\ud83d\ude00") == b"\xed\xa0\xbd\xed\xb8\x80"  # a split pair stays split
    assert tok.decode(tok.encode("x\udcffy")) == "x\ufffdy"


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.one_of(
    st.characters(codec=None, categories=None),
    st.integers(0xD800, 0xDFFF).map(chr),  # any lone surrogate
    st.integers(0xDC80, 0xDCFF).map(chr),  # the surrogateescape range
), max_size=40))
def test_any_str_encodes(tok, text):
    # Every code point including lone surrogates; never an exception, and the
    # bytes come back exactly.
    expected = b"".join(
        bytes([ord(c) - 0xDC00]) if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("utf-8", "surrogatepass")
        for c in text
    )
    assert tok.decode_bytes(tok.encode(text)) == expected == text_to_bytes(text)


def test_encode_rejects_other_types(tok):
    with pytest.raises(TypeError):
        tok.encode(123)


def test_row19_one_megabyte_prompt(tok):
    rng = random.Random(7)
    parts, size = [], 0
    while size < 1 << 20:
        parts.append(rng.choice([" " + rng.choice(WORDS), "中文", "😀", "\0", "\n", "<eos>", "\udcff"]))
        size += len(parts[-1])
    text = "".join(parts)
    start = time.perf_counter()
    ids = tok.encode(text)
    elapsed = time.perf_counter() - start
    assert tok.decode_bytes(ids) == text_to_bytes(text)
    assert elapsed < 20, f"1 MB prompt took {elapsed:.1f} s"


def test_from_file(tmp_path, tok):
    write_gmt(tmp_path / "f.tok", fixture_vocab(1024))
    loaded = GreedyTokenizer.from_file(tmp_path / "f.tok")
    text = "Hello, world! The quick brown fox.\n"
    assert loaded.encode(text) == tok.encode(text)


# ---------------------------------------------------------------- ids out of range

@pytest.mark.parametrize("bad", [-1, 1024, 2**31, 2**64])
def test_row32_out_of_range_ids(tok, bad):
    with pytest.raises(TokenIndexError, match=str(bad)):
        tok.decode([5, bad])
    with pytest.raises(TokenIndexError):
        tok.decode_bytes([bad])
    with pytest.raises(TokenIndexError):
        tok.is_control(bad)
    with pytest.raises(TokenIndexError):
        tok.stream_decoder().push(bad)


def test_non_integer_ids(tok):
    with pytest.raises(TypeError):
        tok.decode([1.0])
    with pytest.raises(TypeError):
        tok.decode(["a"])


# ---------------------------------------------------------------- streaming

def stream(tok, ids):
    decoder = tok.stream_decoder()
    pieces = [decoder.push(i) for i in ids]
    return pieces, decoder.flush()


def byte_ids(tok, data: bytes) -> list[int]:
    return [tok.vocab_size - 256 + b for b in data]


def test_row26_emoji_and_cjk_held_until_complete(tok):
    for char in ("😀", "中", "é"):
        ids = byte_ids(tok, char.encode("utf-8"))
        pieces, rest = stream(tok, ids)
        assert pieces == [""] * (len(ids) - 1) + [char]
        assert rest == ""


def test_stream_invalid_and_truncated_sequences(tok):
    # A lead byte followed by ASCII: U+FFFD at once, then the ASCII.
    assert stream(tok, byte_ids(tok, b"\xe4a")) == (["", "\ufffda"], "")
    # A truncated character at the end comes out of flush as U+FFFD.
    assert stream(tok, byte_ids(tok, b"x\xf0\x9f")) == (["x", "", ""], "\ufffd")
    # Control tokens in the middle of a character do not split it.
    ids = byte_ids(tok, b"\xe4\xb8") + [tok.eos_id] + byte_ids(tok, b"\xad")
    assert "".join(stream(tok, ids)[0]) == "中" == tok.decode(ids)


def test_flush_resets(tok):
    decoder = tok.stream_decoder()
    decoder.push(byte_ids(tok, b"\xe4")[0])
    assert decoder.flush() == "\ufffd"
    assert decoder.push(byte_ids(tok, b"a")[0]) == "a"


def any_id(tok):
    # Byte pieces (especially UTF-8 lead and continuation bytes) are where
    # characters get split, so draw them more often than their share.
    byte_piece = st.integers(0, 255).map(lambda b: tok.vocab_size - 256 + b)
    return st.one_of(st.integers(0, tok.vocab_size - 1), byte_piece, byte_piece)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_streamed_equals_whole_decode(tok, data):
    ids = data.draw(st.lists(any_id(tok), max_size=40))
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids)


# Pieces that are parts of characters (as byte-level BPE vocabularies have):
# a 4-byte emoji cut 2+2, a CJK character cut 1+2, an invalid surrogate prefix,
# an overlong lead and a too-large code point prefix.
SPLIT_PIECES = [b"\xf0\x9f", b"\x98\x80", b"\xe4", b"\xb8\xad", "中".encode(), "😀".encode(),
                b"\xed\xa0", b"\xc0", b"\xf4\x90", b"a", b"\x80"]


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, len(SPLIT_PIECES)), max_size=16))
def test_streamed_equals_whole_decode_partial_pieces(ids):
    pieces = [b"<eos>"] + SPLIT_PIECES
    types = [PIECE_CONTROL] + [PIECE_NORMAL] * len(SPLIT_PIECES)
    split = GreedyTokenizer(Vocab(pieces, types, [0.0] * len(pieces), 0, 0, 0, 0))
    out, rest = stream(split, ids)
    assert "".join(out) + rest == split.decode(ids)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30))
def test_streamed_text_never_splits_a_character(tok, text):
    ids = tok.encode(text)
    pieces, rest = stream(tok, ids)
    assert rest == ""
    assert "".join(pieces) == text  # a split character would have become U+FFFD


# ---------------------------------------------------------------- fixture_vocab

@pytest.mark.parametrize("size", [MIN_VOCAB, 1024, 4096])
def test_fixture_layout(size):
    vocab = fixture_vocab(size)
    assert vocab.vocab_size == size
    assert vocab.pieces[:6] == [b"<pad>", b"<eos>", b"<bos>", b"<unk>", b"<start_of_turn>", b"<end_of_turn>"]
    assert vocab.types[:6] == [PIECE_CONTROL] * 6
    assert vocab.pieces[-256:] == [bytes([b]) for b in range(256)]
    assert vocab.types[-256:] == [PIECE_BYTE] * 256
    assert set(vocab.types[6:-256]) == {PIECE_NORMAL}
    assert all(len(p) > 1 for p in vocab.pieces[6:-256])
    assert len(set(vocab.pieces)) == size
    assert (vocab.pad_id, vocab.eos_id, vocab.bos_id, vocab.unk_id) == (0, 1, 2, 3)


def test_fixture_is_deterministic_and_nested():
    small, big = fixture_vocab(1024), fixture_vocab(2048)
    assert small == fixture_vocab(1024)
    assert big.pieces[:1024 - 256] == small.pieces[:-256]


def test_fixture_benchmark_size():
    start = time.perf_counter()
    vocab = fixture_vocab(262144)
    elapsed = time.perf_counter() - start
    assert len(set(vocab.pieces)) == 262144
    assert elapsed < 10, f"fixture_vocab(262144) took {elapsed:.1f} s"


@pytest.mark.parametrize("size", [-1, 0, 262, MIN_VOCAB - 1, MAX_VOCAB + 1])
def test_fixture_rejects_bad_sizes(size):
    with pytest.raises(ValueError, match=str(size)):
        fixture_vocab(size)
