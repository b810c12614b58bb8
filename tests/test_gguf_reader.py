"""The GGUF reader (gemma_cy/formats/gguf_reader.py, through read_gguf of
gemma_cy/formats/gguf_model.py) against docs/errors.md cases 1-15 and 30:
malicious files built byte by byte with the builder of tests/gguf_helpers.py,
mutation fuzz of the tiny model, python -O; string arrays read in place
(the C scan and the Python loop checking each other), and tensor data left
unmapped after the parse."""
from __future__ import annotations

import math
import os
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_cy.quant import types as gt
from gemma_cy.errors import ModelFormatError
from gemma_cy.formats import gguf_reader as G
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.quant.tensors import F32Tensor
from gemma_cy.model.weights import expected_shapes
from helpers import assert_rejected_under_python_O
from gguf_helpers import (T, f32_tensor_file, gguf_bytes, gstr, kv_str, kv_u32, parse_reject, put, random_blocks,
                          reject, tensor_data, tiny_arrays, tiny_fields, tinfo, write_tiny)


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    path = write_tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    with open(path, "rb") as f:
        return f.read()


# ================================================================ docs/errors.md cases 1-15

# -- row 1: truncated header
@pytest.mark.parametrize("size", [0, 1, 4, 23])
def test_truncated_header(tmp_path, size, tiny_bytes):
    reject(put(tmp_path, tiny_bytes[:size]), "truncated header", f"{size} bytes")


# -- row 2: magic and version
def test_wrong_magic(tmp_path, tiny_bytes):
    reject(put(tmp_path, b"GGML" + tiny_bytes[4:]), "magic: found b'GGML', expected b'GGUF'")


@pytest.mark.parametrize("version, needle", [(1, "found 1, expected one of (2, 3)"),
                                             (4, "found 4"), (0, "found 0"),
                                             (0x03000000, "big-endian")])
def test_bad_version(tmp_path, tiny_bytes, version, needle):
    reject(put(tmp_path, tiny_bytes[:4] + struct.pack("<I", version) + tiny_bytes[8:]), "version", needle)


def test_version_2_is_read(tmp_path, tiny_bytes):
    assert read_gguf(put(tmp_path, tiny_bytes[:4] + struct.pack("<I", 2) + tiny_bytes[8:])).config.dim == 32


# -- row 3: GGUF has no reserved fields; its padding must be zero
def test_nonzero_padding(tmp_path):
    data = gguf_bytes([], [tinfo("t", [3], T["F32"], 0)], np.ones(3, "<f4").tobytes() + bytes(20))
    parse_gguf(put(tmp_path, data))
    head_end = 24 + len(tinfo("t", [3], T["F32"], 0))
    bad = bytearray(data)
    bad[head_end] = 1
    parse_reject(tmp_path, bytes(bad), "padding after the tensor infos", "expected 0")
    bad = bytearray(data)
    bad[-1] = 7
    parse_reject(tmp_path, bytes(bad), "padding after tensor 't'")


# -- row 4: counts
@pytest.mark.parametrize("field_offset, what", [(8, "tensors"), (16, "metadata keys")])
@pytest.mark.parametrize("count", [2**31 - 1, 2**32 - 1, 2**64 - 1])
def test_huge_counts_rejected_before_looping(tmp_path, tiny_bytes, field_offset, what, count):
    raw = bytearray(tiny_bytes)
    struct.pack_into("<Q", raw, field_offset, count)
    tracemalloc.start()
    t0 = time.perf_counter()
    msg = reject(put(tmp_path, bytes(raw)), "counts:", "need at least")
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1 and peak < 10 * 2**20, (elapsed, peak, msg)


def test_zero_counts(tmp_path):
    assert parse_gguf(put(tmp_path, gguf_bytes())).tensors == {}
    reject(put(tmp_path, gguf_bytes(), "empty.gguf"), "general.architecture is missing")
    reject(put(tmp_path, gguf_bytes([kv_str("general.architecture", "gemma3")]), "notensors.gguf"),
           "token_embd.weight is missing")


@pytest.mark.parametrize("count", [2**31 - 1, 2**32 - 1, 2**64 - 1])
def test_huge_array_count(tmp_path, count):
    kv = gstr("a") + struct.pack("<IIQ", G.ARRAY, G.UINT32, count) + bytes(8)
    parse_reject(tmp_path, gguf_bytes([kv]), f"{count} items of UINT32 need at least")
    kv = gstr("s") + struct.pack("<IIQ", G.ARRAY, G.STRING, count) + bytes(16)
    parse_reject(tmp_path, gguf_bytes([kv]), f"{count} items of STRING")


# -- rows 5, 6: dims
@pytest.mark.parametrize("dims, needle", [
    ([0], "include 0"), ([4, 0], "include 0"), ([], "n_dims found 0"), ([1] * 5, "n_dims found 5"),
    ([4194305, 4194305, 211106198978564], "overflows 64 bits"),
    ([2**64 - 1, 2], "overflows 64 bits"),
])
def test_bad_dims(tmp_path, dims, needle):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", dims, T["F32"], 0)], bytes(64)), needle)


def test_quantized_ne0_not_a_block_multiple(tmp_path):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [33, 1], T["Q8_0"], 0)], bytes(64)),
                 "ne0 = 33 is not a multiple of Q8_0's block size 32")


# -- row 7: sizes and offsets
def test_one_byte_short_or_long(tmp_path, tiny_bytes):
    reject(put(tmp_path, tiny_bytes[:-1]), "past the end of the file")
    reject(put(tmp_path, tiny_bytes + b"\0"), "trailing bytes")
    # the last tensor's padding may be present or absent, nothing else
    data = f32_tensor_file([1.0, 2.0, 3.0])  # padded to 32 bytes of data
    assert parse_gguf(put(tmp_path, data)).tensors["t"].nbytes == 12
    parse_gguf(put(tmp_path, data[:-20]))
    parse_reject(tmp_path, data[:-21], "past the end")
    parse_reject(tmp_path, data[:-19], "trailing bytes")


@pytest.mark.parametrize("offset", [32, 2**63, 2**64 - 32])
def test_tensor_offset_past_eof(tmp_path, offset):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [4], T["F32"], offset)], bytes(16)),
                 "past the end of the file")


def test_tensor_size_past_eof(tmp_path):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [2**40], T["F32"], 0)], bytes(16)),
                 "past the end of the file")


def test_misaligned_offset(tmp_path):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [4], T["F32"], 4)], bytes(32)),
                 "not a multiple of the alignment 32")


@pytest.mark.parametrize("alignment, needle", [(0, "power of two"), (24, "power of two")])
def test_bad_alignment(tmp_path, alignment, needle):
    parse_reject(tmp_path, gguf_bytes([kv_u32("general.alignment", alignment)]), needle)
    kv = gstr("general.alignment") + struct.pack("<IQ", G.UINT64, 32)
    parse_reject(tmp_path, gguf_bytes([kv]), "expected UINT32")


# -- row 8: overlaps, gaps, duplicates
def test_overlapping_tensors(tmp_path):
    infos = [tinfo("a", [16], T["F32"], 0), tinfo("b", [16], T["F32"], 32)]
    parse_reject(tmp_path, gguf_bytes([], infos, bytes(128)), "'b'", "overlaps tensor 'a'")


def test_gap_between_tensors(tmp_path):
    infos = [tinfo("a", [8], T["F32"], 0), tinfo("b", [8], T["F32"], 64)]
    parse_reject(tmp_path, gguf_bytes([], infos, bytes(96)), "'b'", "gap after 'a'")


def test_duplicate_tensor_names(tmp_path):
    infos = [tinfo("a", [8], T["F32"], 0), tinfo("a", [8], T["F32"], 32)]
    parse_reject(tmp_path, gguf_bytes([], infos, bytes(64)), "tensor 'a' appears twice")


def test_duplicate_keys(tmp_path):
    parse_reject(tmp_path, gguf_bytes([kv_u32("k", 1), kv_u32("k", 2)]), "key 'k' appears twice")


def test_empty_key_and_name(tmp_path):
    parse_reject(tmp_path, gguf_bytes([kv_u32("", 1)]), "is empty")
    parse_reject(tmp_path, gguf_bytes([], [tinfo("", [8], T["F32"], 0)], bytes(32)), "empty name")


# -- row 9: unknown enums
@pytest.mark.parametrize("ggml_type", [4, 5, 9, 15, 31, 99, 2**32 - 1])
def test_unknown_ggml_type(tmp_path, ggml_type):
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [32], ggml_type, 0)], bytes(64)),
                 f"unknown ggml type {ggml_type}")


def test_unknown_value_types(tmp_path):
    parse_reject(tmp_path, gguf_bytes([gstr("k") + struct.pack("<I", 13) + bytes(8)]), "unknown value type 13")
    parse_reject(tmp_path, gguf_bytes([gstr("k") + struct.pack("<IIQ", G.ARRAY, 77, 1) + bytes(8)]),
                 "unknown array item type 77")
    parse_reject(tmp_path, gguf_bytes([gstr("k") + struct.pack("<IIQ", G.ARRAY, G.ARRAY, 1) + bytes(16)]),
                 "arrays of arrays")
    parse_reject(tmp_path, gguf_bytes([gstr("k") + struct.pack("<IB", G.BOOL, 2)]), "BOOL byte is 2")
    parse_reject(tmp_path, gguf_bytes([gstr("k") + struct.pack("<IIQ3B", G.ARRAY, G.BOOL, 3, 0, 1, 5)]),
                 "BOOL array holds the byte 5")


# -- row 10: NaN/Inf, zero scales
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_inf_in_f32_tensor(tmp_path, bad):
    parse_reject(tmp_path, f32_tensor_file([1.0, bad, 2.0]), "'t' (F32): NaN or Inf in value #1")


@pytest.mark.parametrize("type_name, bad", [("F16", np.float16(np.inf)), ("BF16", None)])
def test_nan_inf_in_half_tensors(tmp_path, type_name, bad):
    raw = (np.array([0, 0x7FC0, 0], "<u2") if bad is None else np.array([0, bad, 0], "<f2")).view(np.uint8)
    parse_reject(tmp_path, gguf_bytes([], [tinfo("t", [3], T[type_name], 0)], raw.tobytes()),
                 f"({type_name}): NaN or Inf in value #1")


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_nan_inf_in_block_scales(tmp_path, type_name):
    t = gt.GGML_TYPES[T[type_name]]
    raw = random_blocks(type_name, 2)
    at = G._F16_SCALE_OFFSETS[type_name][-1]
    raw[1, at:at + 2] = np.array([np.nan], "<f2").view(np.uint8)
    data = gguf_bytes([], [tinfo("t", [2 * t.block_size], t.id, 0)], raw.tobytes())
    parse_reject(tmp_path, data, f"({type_name}): NaN or Inf in block scale #1")


def test_nan_in_model_norm_and_scale(tmp_path):
    arrays = tiny_arrays()
    arrays["blk.0.attn_norm.weight"][3] = np.nan
    reject(write_tiny(tmp_path / "n.gguf", arrays=arrays), "'blk.0.attn_norm.weight'", "NaN or Inf")
    tensors = tensor_data(tiny_arrays())
    assert tensors[0].name == "token_embd.weight"
    blocks = tensors[0].data.copy()
    blocks[5, 0, :2] = np.array([np.inf], "<f2").view(np.uint8)
    tensors[0] = TensorData(tensors[0].name, T["Q8_0"], tensors[0].dims, blocks)
    write_gguf(tmp_path / "i.gguf", tiny_fields(), tensors)
    reject(str(tmp_path / "i.gguf"), "'token_embd.weight' (Q8_0): NaN or Inf in block scale #5")


def test_zero_scale_dequantizes_to_zeros(tmp_path):
    arrays = tiny_arrays()
    arrays["token_embd.weight"][4] = 0
    w = read_gguf(write_tiny(tmp_path / "z.gguf", arrays=arrays))
    assert not np.any(w["embed_tokens"].row(4))
    assert np.all(w["embed_tokens"].d[4] == 0)


# -- row 11: string and array lengths
@pytest.mark.parametrize("length", [64, 2**32 - 1, 2**64 - 1])
def test_string_longer_than_file(tmp_path, length):
    kv = gstr("k") + struct.pack("<IQ", G.STRING, length) + b"abcdefgh"
    parse_reject(tmp_path, gguf_bytes([kv]), f"length {length}", "bytes left")
    parse_reject(tmp_path, gguf_bytes([struct.pack("<Q", length) + b"k" * 12]), f"length {length}")


def test_string_array_item_longer_than_file(tmp_path):
    kv = gstr("k") + struct.pack("<IIQ", G.ARRAY, G.STRING, 2) + gstr("ok") + struct.pack("<Q", 2**40)
    parse_reject(tmp_path, gguf_bytes([kv]), "metadata 'k'[1]: length 1099511627776")


def test_invalid_utf8(tmp_path):
    parse_reject(tmp_path, gguf_bytes([kv_str("k", b"\xff\xfe")]), "not valid UTF-8")
    kv = gstr("k") + struct.pack("<IIQ", G.ARRAY, G.STRING, 2) + gstr("ok") + gstr(b"\xc3")
    parse_reject(tmp_path, gguf_bytes([kv]), "metadata 'k'[1]: not valid UTF-8")


# -- row 12 is in test_bad_metadata (vocab arrays, special ids); row 13
# (byte-token text) belongs to the tokenizer built from these arrays.

# -- row 30: paths
def test_paths(tmp_path):
    reject(str(tmp_path / "nope.gguf"), "no such file")
    reject(str(tmp_path), "is a directory")
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    reject(fifo, "not a regular file")


# -- row 14: mutation fuzz

def _outcome(path):
    """Only two outcomes: ModelFormatError, or Weights whose tensors have the
    shapes the config implies (and finite norms and scales)."""
    try:
        w = read_gguf(path)
    except ModelFormatError as e:
        assert "\n" not in str(e)
        return
    shapes = expected_shapes(w.config)
    assert set(w.tensors) == set(shapes)
    for name, t in w.tensors.items():
        assert t.shape == shapes[name]
        if isinstance(t, F32Tensor):
            assert np.all(np.isfinite(t.data))
        else:
            assert np.all(np.isfinite(t.d))


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzz_truncate(tmp_path, tiny_bytes, data):
    cut = data.draw(st.integers(0, len(tiny_bytes) - 1))
    path = put(tmp_path, tiny_bytes[:cut], "fuzz.gguf")
    with pytest.raises(ModelFormatError):
        read_gguf(path)


@FUZZ
@given(data=st.data())
def test_fuzz_flip_bytes(tmp_path, tiny_bytes, data):
    raw = bytearray(tiny_bytes)
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)),
                               min_size=1, max_size=8))
    for at, mask in flips:
        raw[at] ^= mask
    _outcome(put(tmp_path, bytes(raw), "fuzz.gguf"))


EDGE = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1)


@FUZZ
@given(data=st.data())
def test_fuzz_edge_values(tmp_path, tiny_bytes, data):
    raw = bytearray(tiny_bytes)
    gf = parse_gguf(put(tmp_path, tiny_bytes, "base.gguf"))
    meta_end = min(t.offset for t in gf.tensors.values())
    writes = data.draw(st.lists(st.tuples(st.integers(4, meta_end - 8), st.sampled_from(EDGE),
                                          st.sampled_from("IQ")), min_size=1, max_size=4))
    for at, value, fmt in writes:
        struct.pack_into("<" + fmt, raw, at, value & (2**32 - 1) if fmt == "I" else value)
    t0 = time.perf_counter()
    _outcome(put(tmp_path, bytes(raw), "fuzz.gguf"))
    assert time.perf_counter() - t0 < 5


# -- row 15: python -O
def test_rejects_under_python_O(tmp_path, tiny_bytes):
    cases = {"empty": b"", "magic": b"XXXX" + tiny_bytes[4:], "short": tiny_bytes[:-1],
             "long": tiny_bytes + b"\0", "huge_count": tiny_bytes[:8] + struct.pack("<Q", 2**64 - 1)
             + tiny_bytes[16:], "nan": f32_tensor_file([math.nan])}
    good = put(tmp_path, tiny_bytes, "good.gguf")
    assert_rejected_under_python_O("gemma_cy.formats.gguf_model:read_gguf", tmp_path, cases, str(good))


# -- string arrays stay where they lie in the map; their UTF-8 is checked at parse
_written = iter(range(10**9))


def _string_array_file(tmp_path, items: list[bytes]):
    """A GGUF whose one metadata key "k" is the array of ``items``, in a new file."""
    kv = gstr("k") + struct.pack("<IIQ", G.ARRAY, G.STRING, len(items)) + b"".join(gstr(b) for b in items)
    return put(tmp_path, gguf_bytes([kv]), name=f"strings{next(_written)}.gguf")


_TEXTS = st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=6), max_size=40)


@pytest.fixture(params=["C scan", "Python loop"])
def string_scan(request, monkeypatch):
    """Each string-array test runs twice: with the reader's C scan of the
    lengths (gemma_cy/formats/string_scan.pyx) and with the Python loop it
    falls back to without the extension, so that each checks the other."""
    if request.param == "C scan":
        if G.scan_string_starts is None:
            pytest.skip("gemma_cy.formats.string_scan is not built (run `make build`)")
    else:
        monkeypatch.setattr(G, "scan_string_starts", None)
        monkeypatch.setattr(G, "zero_string_lengths", None)
    return request.param


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=_TEXTS)
def test_string_array_reads_back_every_string(tmp_path, string_scan, texts):
    gf = parse_gguf(_string_array_file(tmp_path, [t.encode() for t in texts]))
    strings = gf.value("k")
    assert strings == texts and list(strings) == texts and len(strings) == len(texts)
    assert strings.raw_list() == [t.encode() for t in texts]
    for i, t in enumerate(texts):
        assert strings[i] == t and strings.index_of(t.encode()) == texts.index(t)
    assert strings.index_of("\x00not there".encode()) is None
    assert strings[1:3] == texts[1:3]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=_TEXTS, data=st.data())
def test_string_array_names_the_first_invalid_string(tmp_path, string_scan, texts, data):
    """A string that is not UTF-8 on its own is refused by index, even where it
    and its neighbours would join into valid UTF-8 (the check sees each
    string alone, as a per-string decode would)."""
    items = [t.encode() for t in texts]
    at = data.draw(st.integers(0, len(items)))
    bad = data.draw(st.sampled_from([b"\xc3", b"\xa9", b"\xe2\x82", b"\xff", b"a\x80", b"\xed\xa0\x80"]))
    items.insert(at, bad)
    if at + 1 < len(items) and bad == b"\xc3":
        items[at + 1] = b"\xa9" + items[at + 1]  # joined, "\xc3\xa9" would be "é"
    first_bad = next(i for i, b in enumerate(items) if not _utf8(b))
    with pytest.raises(ModelFormatError, match=rf"metadata 'k'\[{first_bad}\]: not valid UTF-8"):
        parse_gguf(_string_array_file(tmp_path, items))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=_TEXTS, data=st.data())
def test_string_array_that_does_not_fit_names_the_string(tmp_path, string_scan, texts, data):
    """An array cut short (its last string's length, or its bytes, past the end
    of the file) or claiming more strings than it holds is refused at the
    first string that does not fit, by index and offset."""
    items = [t.encode() for t in texts] + [data.draw(st.binary(min_size=1, max_size=5))]
    body = b"".join(gstr(b) for b in items)
    extra = data.draw(st.integers(0, 3))  # strings claimed beyond those written
    cut = data.draw(st.integers(1, len(gstr(items[-1])))) if extra == 0 else 0
    kv = gstr("k") + struct.pack("<IIQ", G.ARRAY, G.STRING, len(items) + extra) + body[:len(body) - cut]
    first_short = len(items) - 1 if extra == 0 else len(items)
    head = 4 + 4 + 8 + 8 + len(kv) - len(body) + cut  # where the array's strings start
    at = head + sum(len(gstr(b)) for b in items[:first_short])  # where the short one starts
    left = head + len(body) - cut - at
    expected = (rf"metadata 'k'\[{first_short}\] length: needs 8 bytes at offset {at}, only {left} left" if left < 8
                else rf"metadata 'k'\[{first_short}\]: length {len(items[-1])} at offset {at} is larger than the "
                     rf"{left - 8} bytes left")
    if 8 * (len(items) + extra) > len(body) - cut:  # refused before the loop: too few bytes for the count
        expected = rf"metadata 'k': {len(items) + extra} items of STRING need at least"
    data_bytes = gguf_bytes([kv], alignment=1)
    with pytest.raises(ModelFormatError, match=expected):
        parse_gguf(put(tmp_path, data_bytes, name=f"short{next(_written)}.gguf"))


def test_string_scan_checks_what_it_is_given():
    """The extension's own arguments are checked before its loops run without
    bounds checks: an offset outside the buffer, starts that are not inside
    the copy or not in order."""
    if G.scan_string_starts is None:
        pytest.skip("gemma_cy.formats.string_scan is not built (run `make build`)")
    data = np.frombuffer(gstr(b"ab") + gstr(b"c"), np.uint8)
    starts = np.zeros(3, np.int64)
    assert G.scan_string_starts(data, 0, starts) == (2, 19)  # the third does not fit
    assert list(starts[:2]) == [8, 18]
    for pos in (-1, 20):
        with pytest.raises(ValueError, match="outside the 19 bytes"):
            G.scan_string_starts(data, pos, starts)
    joined = data.copy()
    G.zero_string_lengths(joined, starts[:2], 0)
    assert joined.tobytes() == bytes(8) + b"ab" + bytes(8) + b"c"
    for bad in ([4], [18, 8], [8, 20], [8, 12]):
        with pytest.raises(ValueError, match="zero_string_lengths: string"):
            G.zero_string_lengths(data.copy(), np.array(bad, np.int64), 0)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_string_array_digest_is_of_the_bytes_in_the_file(tmp_path):
    a = parse_gguf(_string_array_file(tmp_path, [b"x", b"yz"])).value("k")
    b = parse_gguf(_string_array_file(tmp_path, [b"x", b"yz"])).value("k")
    c = parse_gguf(_string_array_file(tmp_path, [b"xy", b"z"])).value("k")
    assert a.digest() == b.digest() != c.digest()


def _mapped_rss_kb(path) -> int:
    """Resident kB of this process's maps of ``path`` (/proc/self/smaps)."""
    total, here = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0] and not line[0].isupper():
            here = line.rstrip().endswith(str(path))
        elif here and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_parse_leaves_the_tensor_data_unmapped(tmp_path):
    """Checking every block scale reads every page of the data; those pages are
    released after each tensor, so a parsed file is not resident in the process."""
    rows = 4096
    blocks = np.zeros((rows, 64, 34), np.uint8)  # Q8_0 (4096, 2048): 8.9 MB
    blocks[:, :, 1] = 0x3C  # d = 1.0
    path = put(tmp_path, gguf_bytes([], [tinfo("w", [2048, rows], T["Q8_0"], 0)], blocks.tobytes()))
    gf = parse_gguf(path)
    assert _mapped_rss_kb(path) < 1024, "the tensor's pages stayed mapped after the check"
    assert int(gf.raw("w")[1::34].min()) == 0x3C  # and the data reads back through the map
    assert _mapped_rss_kb(path) > 4096
