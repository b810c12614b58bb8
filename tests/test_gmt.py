"""GMT1 v1 reader and writer (docs/formats.md#gmt1-tokenizer) against docs/errors.md cases 1-15 and 30.

Malicious files are built with struct.pack in tmp_path, independently of the
module's own Struct constants.
"""
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_cy.errors import ModelFormatError
from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
from gemma_cy.formats import gmt
from gemma_cy.formats.gmt import PIECE_BYTE, PIECE_CONTROL, PIECE_NORMAL, Vocab, read_gmt, write_gmt
from helpers import assert_rejected_under_python_O

U32_EDGES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1)
F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # largest finite binary32


def header(vocab_size, bos=0, eos=0, unk=0, pad=0, magic=b"GMT1", version=1, reserved=bytes(20)):
    return struct.pack("<4s6I", magic, version, vocab_size, bos, eos, unk, pad) + reserved


def entry(piece: bytes, ptype: int = 0, score: float = 0.0, length: int | None = None) -> bytes:
    return struct.pack("<IIf", len(piece) if length is None else length, ptype, score) + piece


def small_entries():
    return [
        entry(b"<eos>", 2, 0.0),
        entry(b"<bos>", 2, 0.0),
        entry(b"hello", 0, -1.5),
        entry(b" world", 0, -2.0),
        entry(b"\xff", 1, -3.0),
    ]


def small_file() -> bytes:
    return header(5, bos=1, eos=0, unk=2, pad=0) + b"".join(small_entries())


def write(tmp_path, data: bytes, name="t.tok"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def rejects(tmp_path, data: bytes, *words: str):
    path = write(tmp_path, data)
    with pytest.raises(ModelFormatError) as info:
        read_gmt(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, message
    return message


# ---------------------------------------------------------------- round trip

def test_small_file_reads(tmp_path):
    vocab = read_gmt(write(tmp_path, small_file()))
    assert vocab.pieces == [b"<eos>", b"<bos>", b"hello", b" world", b"\xff"]
    assert vocab.types == [2, 2, 0, 0, 1]
    assert vocab.scores == [0.0, 0.0, -1.5, -2.0, -3.0]
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id) == (1, 0, 2, 0)
    assert vocab.vocab_size == 5


def test_write_matches_hand_packed_bytes(tmp_path):
    vocab = read_gmt(write(tmp_path, small_file()))
    write_gmt(tmp_path / "again.tok", vocab)
    assert (tmp_path / "again.tok").read_bytes() == small_file()


@pytest.mark.parametrize("size", [270, 1024])
def test_fixture_round_trip(tmp_path, size):
    vocab = fixture_vocab(size)
    write_gmt(tmp_path / "f.tok", vocab)
    back = read_gmt(tmp_path / "f.tok")
    assert back.pieces == vocab.pieces
    assert back.types == vocab.types
    assert back.scores == vocab.scores  # -id is exact in f32
    assert (back.bos_id, back.eos_id, back.unk_id, back.pad_id) == (2, 1, 3, 0)
    assert os.path.getsize(tmp_path / "f.tok") == 48 + sum(12 + len(p) for p in vocab.pieces)


def test_scores_round_to_f32(tmp_path):
    vocab = Vocab([b"a", b"bc"], [PIECE_BYTE, PIECE_NORMAL], [0.1, -1e30], 0, 0, 0, 0)
    write_gmt(tmp_path / "s.tok", vocab)
    back = read_gmt(tmp_path / "s.tok")
    assert back.scores == [struct.unpack("<f", struct.pack("<f", s))[0] for s in (0.1, -1e30)]


def test_empty_piece_and_duplicates_are_valid(tmp_path):
    data = header(3) + entry(b"") + entry(b"ab") + entry(b"ab")
    assert read_gmt(write(tmp_path, data)).pieces == [b"", b"ab", b"ab"]


# ---------------------------------------------------------------- docs/errors.md cases

@pytest.mark.parametrize("size", [0, 1, 20, 47])
def test_row1_truncated_header(tmp_path, size):
    rejects(tmp_path, small_file()[:size], "truncated header", str(size), "48")


@pytest.mark.parametrize("magic", [b"GMW1", b"gmt1", b"\0\0\0\0", b"GGUF"])
def test_row2_wrong_magic(tmp_path, magic):
    rejects(tmp_path, magic + small_file()[4:], "magic", repr(magic), "GMT1")


@pytest.mark.parametrize("version", [0, 2, 3, 2**32 - 1])
def test_row2_unsupported_version(tmp_path, version):
    data = bytearray(small_file())
    data[4:8] = struct.pack("<I", version)
    rejects(tmp_path, bytes(data), "version", str(version), "expected 1")


@pytest.mark.parametrize("index", [0, 7, 19])
def test_row3_reserved_nonzero(tmp_path, index):
    data = bytearray(small_file())
    data[28 + index] = 0x01
    rejects(tmp_path, bytes(data), "reserved")


@pytest.mark.parametrize("count", [0, 6, 2**31 - 1, 2**32 - 1])
def test_row4_vocab_size_rejected_before_loop(tmp_path, count):
    data = bytearray(small_file())
    data[8:12] = struct.pack("<I", count)
    rejects(tmp_path, bytes(data), "vocab_size", str(count))


def test_row4_vocab_size_checked_against_bytes_left(tmp_path):
    # 2**31-1 entries would need 24 GiB: rejected from the header alone.
    message = rejects(tmp_path, header(2**31 - 1) + entry(b"x"), "vocab_size")
    assert str((2**31 - 1) * 12) in message


def test_row7_one_byte_short(tmp_path):
    rejects(tmp_path, small_file()[:-1], "entry 4", "piece length 1")


def test_row7_entry_header_cut(tmp_path):
    # vocab_size 2, the second entry header has only 11 of its 12 bytes.
    data = header(2) + entry(b"ab") + entry(b"")[:11]
    rejects(tmp_path, data, "entry", "truncated")


def test_row7_vocab_size_larger_than_entries(tmp_path):
    data = header(3) + entry(b"a" * 40) + entry(b"b")
    rejects(tmp_path, data, "entry 2")


@pytest.mark.parametrize("extra", [b"\0", b"junk", entry(b"x")])
def test_row7_trailing_bytes(tmp_path, extra):
    rejects(tmp_path, small_file() + extra, "trailing", str(len(extra)))


@pytest.mark.parametrize("ptype", [3, 255, 2**31, 2**32 - 1])
def test_row9_unknown_piece_type(tmp_path, ptype):
    data = header(2) + entry(b"ab") + entry(b"cd", ptype)
    rejects(tmp_path, data, "entry 1", "type", str(ptype))


@pytest.mark.parametrize("score", [float("nan"), float("inf"), float("-inf")])
def test_row10_non_finite_score(tmp_path, score):
    data = header(2) + entry(b"ab") + entry(b"cd", 0, score)
    rejects(tmp_path, data, "entry 1", "score")


@pytest.mark.parametrize("length", [4, 5, 2**31, 2**32 - 1])
def test_row11_piece_length_past_end(tmp_path, length):
    data = header(1) + entry(b"abc", length=length)
    rejects(tmp_path, data, "piece length", str(length), "3 bytes left")


@pytest.mark.parametrize("field", ["bos", "eos", "unk", "pad"])
@pytest.mark.parametrize("value", [5, 6, 2**31 - 1, 2**32 - 1])
def test_row12_special_id_out_of_range(tmp_path, field, value):
    data = header(5, **{field: value}) + b"".join(small_entries())
    rejects(tmp_path, data, f"{field}_id", str(value), "vocab_size 5")


@pytest.mark.parametrize("piece", [b"", b"ab", b"<0x41>", b"<0x-1>", b"<0x100>"])
def test_row13_byte_piece_must_be_one_byte(tmp_path, piece):
    # GMT1 stores the raw byte itself, so "exactly two hex digits" becomes
    # "exactly one byte".
    data = header(2) + entry(b"ab") + entry(piece, PIECE_BYTE)
    rejects(tmp_path, data, "entry 1", "byte piece", "exactly 1")


U32_FIELD_OFFSETS = (4, 8, 12, 16, 20, 24, 48, 52)  # header u32s, then entry 0's len and type


@st.composite
def mutated_file(draw):
    data = bytearray(small_file())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "u32", "f32", "append"]))
        if kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "u32":
            offset = draw(st.sampled_from(U32_FIELD_OFFSETS + (draw(st.integers(0, 80)),)))
            value = draw(st.sampled_from(U32_EDGES + (5, 6, 12)))
            data[offset:offset + 4] = struct.pack("<I", value)
        elif kind == "f32":
            data[56:60] = struct.pack("<f", draw(st.sampled_from([float("nan"), float("inf"), 1e38, -0.0])))
        else:
            data += draw(st.binary(max_size=16))
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated_file())
def test_row14_mutation_fuzz(tmp_path, data):
    path = write(tmp_path, data)
    try:
        vocab = read_gmt(path)
    except ModelFormatError as e:
        assert str(path) in str(e)
        return
    # Whatever is accepted is a valid vocabulary that writes back identically.
    write_gmt(tmp_path / "back.tok", vocab)
    assert (tmp_path / "back.tok").read_bytes() == data


def test_row15_same_results_under_python_O(tmp_path):
    cases = {
        "empty": b"",
        "magic": b"XXXX" + small_file()[4:],
        "reserved": small_file()[:30] + b"\1" + small_file()[31:],
        "count": header(2**32 - 1) + entry(b"a"),
        "length": header(1) + entry(b"a", length=2**32 - 1),
        "type": header(1) + entry(b"a", 9),
        "byte": header(1) + entry(b"ab", PIECE_BYTE),
        "nan": header(1) + entry(b"a", 0, float("nan")),
        "special": header(1, eos=1) + entry(b"a"),
        "trailing": small_file() + b"\0",
    }
    good = write(tmp_path, small_file(), "good.tok")
    assert_rejected_under_python_O("gemma_cy.formats.gmt:read_gmt", tmp_path, cases, str(good))


def test_row30_missing_path(tmp_path):
    with pytest.raises(ModelFormatError, match="missing.tok"):
        read_gmt(tmp_path / "missing.tok")


def test_row30_directory(tmp_path):
    with pytest.raises(ModelFormatError, match=str(tmp_path)):
        read_gmt(tmp_path)


def test_row30_unreadable(tmp_path, monkeypatch):
    # chmod 000 does not stop root, so the refusal is simulated where open() is called.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gmt, "open", refuse, raising=False)
    with pytest.raises(ModelFormatError, match="cannot read tokenizer file: Permission denied"):
        read_gmt(write(tmp_path, small_file()))


# ---------------------------------------------------------------- Vocab rules (the writer's side)

def good_fields():
    return dict(pieces=[b"<eos>", b"ab", b"c"], types=[PIECE_CONTROL, PIECE_NORMAL, PIECE_BYTE],
                scores=[0.0, -1.0, -2.0], bos_id=0, eos_id=0, unk_id=1, pad_id=2)


@pytest.mark.parametrize("change, word", [
    (dict(pieces=[], types=[], scores=[]), "vocab_size is 0"),
    (dict(types=[0, 0]), "types"),
    (dict(scores=[0.0]), "scores"),
    (dict(bos_id=3), "bos_id"),
    (dict(pad_id=-1), "pad_id"),
    (dict(unk_id=1.0), "unk_id"),
    (dict(types=[2, 0, 3]), "type 3"),
    (dict(types=[2, 1, 1]), "byte piece"),
    (dict(scores=[0.0, float("nan"), 0.0]), "score"),
    (dict(scores=[0.0, 1e39, 0.0]), "score"),
    (dict(pieces=[b"<eos>", "ab", b"c"]), "must be bytes"),
])
def test_vocab_rejects_invalid_fields(change, word):
    with pytest.raises(ModelFormatError, match=word):
        Vocab(**{**good_fields(), **change})


def test_vocab_error_names_source():
    with pytest.raises(ModelFormatError, match="model.tok"):
        Vocab(**{**good_fields(), "bos_id": 9}, source="model.tok")


# ------------------------------------------- rules at their boundaries
# Each pins down a documented rule that the tests above state only away from
# its boundary (found by mutation testing).

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
