"""GMT1 reader and Vocab rules: cases found by mutation testing
(gemma_cy/formats/gmt.py, docs/formats.md#gmt1-tokenizer).

Files are built with struct.pack, independently of the module's constants,
as in tests/test_gmt.py.
"""
import struct

import pytest

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gmt import PIECE_CONTROL, PIECE_NORMAL, Vocab, read_gmt, write_gmt

F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # largest finite binary32


def header(vocab_size, bos=0, eos=0, unk=0, pad=0) -> bytes:
    return struct.pack("<4s6I", b"GMT1", 1, vocab_size, bos, eos, unk, pad) + bytes(20)


def entry(piece: bytes, ptype: int = 0, score: float = 0.0) -> bytes:
    return struct.pack("<IIf", len(piece), ptype, score) + piece


@pytest.mark.parametrize("score", [None, "x", object()])
def test_vocab_rejects_a_score_that_is_not_a_number(score):
    """A score that is not a number at all (not just non-finite) is refused
    by Vocab with ModelFormatError, before write_gmt could fail to pack it."""
    with pytest.raises(ModelFormatError, match="score"):
        Vocab([b"<eos>", b"a"], [PIECE_CONTROL, PIECE_NORMAL], [0.0, score], 0, 0, 0, 0)


def test_scores_at_the_f32_limit_are_valid_and_round_trip(tmp_path):
    """The largest finite f32 (and its negative) is a valid score: the rule
    is |score| <= F32_MAX, and the file reads back with the same values."""
    vocab = Vocab([b"a", b"b"], [PIECE_NORMAL, PIECE_NORMAL], [F32_MAX, -F32_MAX], 0, 0, 0, 0)
    write_gmt(tmp_path / "m.tok", vocab)
    assert read_gmt(tmp_path / "m.tok").scores == [F32_MAX, -F32_MAX]


def test_a_file_of_only_empty_pieces_is_valid(tmp_path):
    """Every entry takes at least 12 bytes, so a file whose entries are all
    empty pieces is exactly vocab_size * 12 bytes of body: the up-front size
    check must accept that boundary."""
    path = tmp_path / "e.tok"
    path.write_bytes(header(3) + entry(b"") * 3)
    vocab = read_gmt(path)
    assert vocab.pieces == [b"", b"", b""] and vocab.types == [0, 0, 0]


@pytest.mark.parametrize("score", ["1.5", b"1", True, None, [1.0]])
def test_a_score_that_is_text_or_a_bool_is_refused_not_written(score, tmp_path):
    """Vocab used to accept "1.5" and b"1" (float() parses them); write_gmt
    then died with a struct.error traceback."""
    with pytest.raises(ModelFormatError, match="score"):
        Vocab([b"<unk>", b"a"], [PIECE_CONTROL, PIECE_NORMAL], [0.0, score], 0, 0, 0, 0)
