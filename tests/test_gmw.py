"""GMW1 reader and writer: round trip, the seed fixture, and docs/errors.md cases 1-15.

Malicious files are built with struct.pack in tmp_path. A small valid model
(1 layer, dim 8) is the base of the byte-level tests and the fuzz.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
import time
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_cy.model.config import ModelConfig
from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gmw import HEADER_SIZE, gmw_config, gmw_file_size, gmw_layout, read_gmw, write_gmw
from gemma_cy.commands.presets import preset_config, random_weights
from gemma_cy.quant.tensors import Int8Tensor, quantize_per_tensor
from gemma_cy.model.weights import expected_shapes
from helpers import TINY_SHA256, assert_rejected_under_python_O

SMALL = dict(n_layers=1, dim=8, n_heads=2, n_kv_heads=1, mlp_dim=12,
             vocab_size=10, max_seq_len=4, head_dim=4, rope_base=10000.0)
FIELDS = ("n_layers", "dim", "n_heads", "n_kv_heads", "mlp_dim", "vocab_size",
          "max_seq_len", "head_dim")
FIELD_OFFSET = {f: 8 + 4 * i for i, f in enumerate(FIELDS)}  # u32 fields after magic, version
EDGE_U32 = (0, 1, 2, 2**31 - 1, 2**32 - 1)
U32_MAX = 2**32 - 1


def header(magic=b"GMW1", version=1, reserved=bytes(20), **fields) -> bytes:
    """A 64-byte GMW1 header: SMALL's values unless overridden."""
    h = {**SMALL, **fields}
    return struct.pack("<4s9If20s", magic, version, *(h[f] for f in FIELDS),
                       h["rope_base"], reserved)


def small_tensors(config: ModelConfig, seed: int = 0) -> dict[str, Int8Tensor]:
    """Random quantized tensors of every GMW1 tensor of ``config``."""
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    return {name: quantize_per_tensor(rng.standard_normal(shapes[name]).astype(np.float32))
            for name, _ in gmw_layout(config)}


def scale_offset(config: ModelConfig, name: str) -> int:
    """File offset of tensor ``name``'s f32 scale."""
    offset = HEADER_SIZE
    for tname, (rows, cols) in gmw_layout(config):
        offset += rows * cols
        if tname == name:
            return offset
        offset += 4
    raise KeyError(name)


def write_bytes(tmp_path, data: bytes, name: str = "m.gmw") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def reject(path, *words) -> str:
    """read_gmw(path) must raise ModelFormatError naming the file and ``words``."""
    with pytest.raises(ModelFormatError) as info:
        read_gmw(path)
    msg = str(info.value)
    assert str(path) in msg
    for word in words:
        assert str(word) in msg, (word, msg)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def small_config() -> ModelConfig:
    return gmw_config(**SMALL)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory, small_config):
    """(path, bytes, tensors) of a valid small GMW1 file."""
    tensors = small_tensors(small_config)
    path = tmp_path_factory.mktemp("gmw") / "small.gmw"
    write_gmw(path, small_config, tensors)
    return str(path), path.read_bytes(), tensors


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """The seed fixture, written once per session."""
    config, tensors = random_weights("tiny")
    path = tmp_path_factory.mktemp("tiny") / "tiny.gmw"
    write_gmw(path, config, tensors)
    return str(path)


# ---------------------------------------------------------------- round trip

def test_round_trip_values_shapes_dtypes(small_file, small_config):
    path, _, tensors = small_file
    w = read_gmw(path)
    assert w.config == small_config
    assert list(w.tensors) == [name for name, _ in gmw_layout(small_config)]
    for name, t in tensors.items():
        got = w[name]
        assert got.q.dtype == np.int8
        assert got.q.shape == t.q.shape == expected_shapes(small_config)[name]
        assert np.array_equal(got.q, t.q)
        assert isinstance(got.scale, np.float32) and got.scale == t.scale


def test_views_are_read_only_and_zero_copy(small_file, small_config):
    path, _, _ = small_file
    w = read_gmw(path)
    base = w["embed_tokens"].q.__array_interface__["data"][0] - HEADER_SIZE
    offset = HEADER_SIZE
    for name, (rows, cols) in gmw_layout(small_config):
        q = w[name].q
        assert not q.flags.writeable and not q.flags.owndata and q.flags.c_contiguous
        # each view points into the mapped file at its own offset: no copy
        assert q.__array_interface__["data"][0] - base == offset
        offset += rows * cols + 4
        with pytest.raises(ValueError):
            q.flat[0] = 1
    assert w.keepalive


def test_layout_matches_weights_names_and_closed_form_size():
    for name in ("tiny", "small", "270m-gmw1"):
        c = preset_config(name)
        layout = gmw_layout(c)
        shapes = expected_shapes(c)
        assert [n for n, _ in layout] == list(shapes)
        assert all(math.prod(fs) == math.prod(shapes[n]) for n, fs in layout)
        assert HEADER_SIZE + sum(r * k + 4 for _, (r, k) in layout) == gmw_file_size(
            c.n_layers, c.dim, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size, c.max_seq_len)


def test_tiny_fixture_is_byte_identical_to_the_seed(tiny_file):
    with open(tiny_file, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == TINY_SHA256
    w = read_gmw(tiny_file)
    assert w.config == preset_config("tiny")
    gains = w["layers.0.attn_norm"].dequantize()
    assert 0.3 < np.mean(gains < 0) < 0.7  # seed's standard-normal gains


# ------------------------------------------------------- docs/errors.md#case-1

def test_empty_file(tmp_path):
    reject(write_bytes(tmp_path, b""), "truncated header", "0 bytes")


def test_shorter_than_header(tmp_path):
    reject(write_bytes(tmp_path, header()[:63]), "truncated header", "63 bytes", "64")


# ------------------------------------------------------- row 2

def test_wrong_magic(tmp_path):
    reject(write_bytes(tmp_path, header(magic=b"GGUF")), "magic", "GGUF", "GMW1")


@pytest.mark.parametrize("version", [0, 2, 2**32 - 1])
def test_unsupported_version(tmp_path, version):
    reject(write_bytes(tmp_path, header(version=version)), "version", f"found {version}", "expected 1")


# ------------------------------------------------------- row 3

@pytest.mark.parametrize("at", [0, 7, 19])
def test_reserved_bytes_non_zero(tmp_path, small_file, at):
    data = bytearray(small_file[1])
    data[44 + at] = 0x80
    reject(write_bytes(tmp_path, bytes(data)), "reserved", str(44 + at))


# ------------------------------------------------------- row 4

@pytest.mark.parametrize("field", FIELDS)
def test_zero_count(tmp_path, field):
    reject(write_bytes(tmp_path, header(**{field: 0})), field, "found 0", "> 0")


@pytest.mark.parametrize("value", [2**31 - 1, 2**32 - 1])
@pytest.mark.parametrize("field", FIELDS)
def test_huge_count_rejected_before_allocating(tmp_path, field, value):
    path = write_bytes(tmp_path, header(**{field: value}))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ModelFormatError):
            read_gmw(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("field", ["n_layers", "vocab_size", "max_seq_len", "mlp_dim"])
def test_huge_free_count_fails_the_size_check(tmp_path, field):
    # fields no header rule ties to another: only the exact file size catches them
    expected = gmw_file_size(**{k: v for k, v in {**SMALL, field: 2**32 - 1}.items()
                                if k not in ("n_heads", "rope_base")})
    reject(write_bytes(tmp_path, header(**{field: 2**32 - 1})), "file size", "64 bytes", str(expected))


# ------------------------------------------------------- row 5

def test_dim_not_multiple_of_n_heads(tmp_path):
    reject(write_bytes(tmp_path, header(dim=10, n_heads=4, n_kv_heads=1, head_dim=2)),
           "n_heads", "found 4", "dim = 10")


def test_n_heads_not_multiple_of_n_kv_heads(tmp_path):
    reject(write_bytes(tmp_path, header(n_heads=2, n_kv_heads=3)),
           "n_kv_heads", "found 3", "n_heads = 2")


def test_head_dim_not_dim_over_n_heads(tmp_path):
    reject(write_bytes(tmp_path, header(head_dim=8)), "head_dim", "found 8", "= 4")


def test_odd_head_dim(tmp_path):
    reject(write_bytes(tmp_path, header(dim=6, n_heads=2, head_dim=3)), "head_dim", "found 3", "even")


@pytest.mark.parametrize("rope_base", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_bad_rope_base(tmp_path, rope_base):
    reject(write_bytes(tmp_path, header(rope_base=rope_base)), "rope_base", repr(rope_base))


# ------------------------------------------------------- row 6

def test_overflowing_product_that_wraps_to_the_real_size(tmp_path):
    # These dims make the exact size 36893488147419103348 (> 2^65); in u64
    # arithmetic it wraps to 116, the very size of this file. Python ints
    # do not wrap, so the reader must see the mismatch.
    fields = dict(n_layers=1, dim=2**31, n_heads=2**15, n_kv_heads=1, head_dim=2**16,
                  mlp_dim=2**31, vocab_size=2**32 - 2**30 - 2**16 - 2, max_seq_len=1)
    exact = gmw_file_size(**{k: v for k, v in fields.items() if k != "n_heads"})
    assert exact % 2**64 == 116
    path = write_bytes(tmp_path, header(**fields) + bytes(116 - HEADER_SIZE))
    reject(path, "file size", "found 116 bytes", str(exact))


def test_all_counts_max(tmp_path):
    reject(write_bytes(tmp_path, header(**{f: 2**32 - 1 for f in FIELDS})))


# ------------------------------------------------------- row 7

def test_one_byte_short(tmp_path, small_file):
    data = small_file[1]
    reject(write_bytes(tmp_path, data[:-1]), "file size", f"found {len(data) - 1}",
           f"expected {len(data)}", "1 bytes too short")


def test_one_byte_long(tmp_path, small_file):
    data = small_file[1]
    reject(write_bytes(tmp_path, data + b"\0"), "file size", f"found {len(data) + 1}",
           f"expected {len(data)}", "1 bytes too long")


def test_header_only(tmp_path):
    reject(write_bytes(tmp_path, header()), "file size", "found 64 bytes")


# ------------------------------------------------------- row 10

@pytest.mark.parametrize("tensor", ["embed_tokens", "layers.0.attn_norm", "lm_head"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, -1e-30])
def test_bad_scale(tmp_path, small_file, small_config, tensor, bad):
    data = bytearray(small_file[1])
    struct.pack_into("<f", data, scale_offset(small_config, tensor), bad)
    reject(write_bytes(tmp_path, bytes(data)), "scale", tensor)


def test_zero_scale_dequantizes_to_zeros(tmp_path, small_file, small_config):
    data = bytearray(small_file[1])
    struct.pack_into("<f", data, scale_offset(small_config, "layers.0.q_proj"), 0.0)
    w = read_gmw(write_bytes(tmp_path, bytes(data)))
    deq = w["layers.0.q_proj"].dequantize()
    assert np.any(w["layers.0.q_proj"].q != 0)
    assert np.array_equal(deq, np.zeros_like(deq)) and np.all(np.isfinite(deq))


# ------------------------------------------------------- row 30 (paths)

def test_missing_path(tmp_path):
    reject(str(tmp_path / "nope.gmw"), "no such file")


def test_directory_as_path(tmp_path):
    reject(str(tmp_path), "directory")


def test_fifo_does_not_hang(tmp_path):
    path = str(tmp_path / "fifo")
    os.mkfifo(path)
    reject(path, "not a regular file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path, small_file):
    path = write_bytes(tmp_path, small_file[1])
    os.chmod(path, 0)
    reject(path, "cannot open")


# ------------------------------------------------------- row 14: mutation fuzz

def _read_outcome(path, original_size):
    """Only two outcomes are allowed: ModelFormatError, or Weights whose
    tensors have exactly the shapes the config implies."""
    try:
        w = read_gmw(path)
    except ModelFormatError:
        return
    shapes = expected_shapes(w.config)
    assert set(w.tensors) == set(shapes)
    for name, t in w.tensors.items():
        assert t.q.shape == shapes[name] and t.q.dtype == np.int8 and not t.q.flags.writeable
        assert np.isfinite(t.scale) and t.scale >= 0
    assert os.path.getsize(path) == original_size


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzz_truncate(tmp_path, small_file, data):
    raw = small_file[1]
    cut = data.draw(st.integers(0, len(raw) - 1))
    path = write_bytes(tmp_path, raw[:cut], "fuzz.gmw")
    with pytest.raises(ModelFormatError):
        read_gmw(path)


@FUZZ
@given(data=st.data())
def test_fuzz_flip_bytes(tmp_path, small_file, data):
    raw = bytearray(small_file[1])
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)),
                               min_size=1, max_size=8))
    for at, mask in flips:
        raw[at] ^= mask
    path = write_bytes(tmp_path, bytes(raw), "fuzz.gmw")
    _read_outcome(path, len(raw))


@FUZZ
@given(data=st.data())
def test_fuzz_header_fields_edge_values(tmp_path, small_file, data):
    raw = bytearray(small_file[1])
    offsets = [4] + list(FIELD_OFFSET.values()) + [40]  # version, counts, rope_base
    writes = data.draw(st.lists(st.tuples(st.sampled_from(offsets), st.sampled_from(EDGE_U32)),
                                min_size=1, max_size=4))
    for at, value in writes:
        struct.pack_into("<I", raw, at, value)
    path = write_bytes(tmp_path, bytes(raw), "fuzz.gmw")
    _read_outcome(path, len(raw))


# ------------------------------------------------------- row 15: python -O

def test_rejects_under_python_O(tmp_path, small_file):
    raw = small_file[1]
    cases = {
        "empty": b"",
        "magic": b"XXXX" + raw[4:],
        "short": raw[:-1],
        "odd_head_dim": header(dim=6, n_heads=2, head_dim=3),
        "huge": header(n_layers=2**32 - 1),
        "nan_scale": raw[:-4] + struct.pack("<f", math.nan),
    }
    assert_rejected_under_python_O("gemma_cy.formats.gmw:read_gmw", tmp_path, cases, small_file[0])


# ------------------------------------------------------- writer

def test_writer_rejects_configs_gmw1_cannot_express(tmp_path, small_config):
    tensors = small_tensors(small_config)
    path = tmp_path / "w.gmw"
    bad = {
        "head_dim": small_config.with_changes(head_dim=8),  # n_heads*head_dim != dim
        "tied_embeddings": small_config.with_changes(tied_embeddings=True),
        "activation": small_config.with_changes(activation="gelu_tanh"),
        "position_table": small_config.with_changes(position_table=False),
        "norm_gain": small_config.with_changes(norm_gain="one_plus"),
        "rope_base": small_config.with_changes(rope_base=0.1),  # not an exact f32
        "bos_id": small_config.with_changes(bos_id=2),
    }
    for word, config in bad.items():
        with pytest.raises(ModelFormatError, match=word):
            write_gmw(path, config, tensors)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_writer_rejects_bad_tensors(tmp_path, small_config):
    path = tmp_path / "w.gmw"
    good = small_tensors(small_config)
    q = good["lm_head"].q
    cases = {
        "missing tensor": {k: v for k, v in good.items() if k != "lm_head"},
        "no place": {**good, "extra": good["lm_head"]},
        "expected int8": {**good, "lm_head": Int8Tensor(q.astype(np.int16), good["lm_head"].scale)},
        "expected int8 (8,)": {**good, "final_norm": Int8Tensor(np.zeros((8, 1), np.int8),
                                                                np.float32(1))},
        "scale": {**good, "lm_head": Int8Tensor(q, np.float32(np.nan))},
    }
    for word, tensors in cases.items():
        with pytest.raises(ModelFormatError, match=word.replace("(", r"\(").replace(")", r"\)")):
            write_gmw(path, small_config, tensors)
    assert os.listdir(tmp_path) == []


# ------------------------------------------- rules at their boundaries
# Each pins down a documented rule that the tests above state only away from
# its boundary or for the default value (found by mutation testing).

@pytest.mark.parametrize("rope_base", [500000.0, 1.0, 0.5])
def test_rope_base_round_trips(tmp_path, rope_base):
    """The header's rope_base (any finite f32 > 0, also 1 and below) is
    written and read back as the config's rope_base, not a default."""
    config = gmw_config(**{**SMALL, "rope_base": rope_base})
    assert config.rope_base == rope_base
    path = tmp_path / "r.gmw"
    write_gmw(path, config, small_tensors(config))
    assert read_gmw(path).config.rope_base == rope_base


def test_weights_name_the_file_they_were_read_from(tmp_path):
    """read_gmw's Weights carry the path as ``source`` (used in messages)."""
    config = gmw_config(**SMALL)
    path = tmp_path / "s.gmw"
    write_gmw(path, config, small_tensors(config))
    assert read_gmw(path).source == str(path)


def test_u32_max_counts_are_expressible(tmp_path):
    """A count of exactly 2**32 - 1 fits GMW1's u32 (the writer gets past
    the header check and stops at the missing tensors); 2**32 does not."""
    config = gmw_config(**{**SMALL, "max_seq_len": U32_MAX})
    with pytest.raises(ModelFormatError, match="missing tensor"):
        write_gmw(tmp_path / "u.gmw", config, {})
    config = gmw_config(**{**SMALL, "max_seq_len": U32_MAX + 1})
    with pytest.raises(ModelFormatError, match="does not fit"):
        write_gmw(tmp_path / "u.gmw", config, {})


@pytest.mark.parametrize("bad", [math.inf, -math.inf, -1.0, -1e-30, 1e39])
def test_writer_rejects_every_scale_read_gmw_would_refuse(tmp_path, bad):
    """The writer refuses a scale that is infinite, negative or beyond f32
    (the reader's rule: finite and >= 0), without a NumPy overflow warning."""
    config = gmw_config(**SMALL)
    tensors = small_tensors(config)
    tensors["lm_head"] = Int8Tensor(tensors["lm_head"].q, bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelFormatError, match="scale"):
            write_gmw(tmp_path / "w.gmw", config, tensors)


def test_writer_accepts_a_zero_scale(tmp_path):
    """A zero scale is valid (that tensor dequantizes to zeros), so the
    writer accepts it and the reader gives it back."""
    config = gmw_config(**SMALL)
    tensors = small_tensors(config)
    tensors["lm_head"] = Int8Tensor(tensors["lm_head"].q, np.float32(0.0))
    write_gmw(tmp_path / "z.gmw", config, tensors)
    assert read_gmw(tmp_path / "z.gmw").tensors["lm_head"].scale == 0.0


def test_writer_rejects_a_rope_base_beyond_f32_without_a_warning(tmp_path):
    """A rope_base that overflows f32 is not expressible: ModelFormatError,
    not a NumPy overflow warning on the way."""
    config = gmw_config(**SMALL).with_changes(rope_base=1e39)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelFormatError, match="rope_base"):
            write_gmw(tmp_path / "w.gmw", config, small_tensors(config))
