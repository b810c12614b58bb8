"""GGUF writer (gemma_cy/formats/gguf_writer.py) and what read_gguf
(gemma_cy/formats/gguf_model.py) reads back: the tiny Gemma 3 model round
trip (read-only views of the map, tied and untied embeddings), the writer's
bytes against hand-built ones, every field type, and gguf-py (the ``gguf``
package, an independent implementation) reading our files and we its."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.quant import ggml as gq
from gemma_cy.api import open_weights
from gemma_cy.formats import gguf_model, gguf_writer
from gemma_cy.formats import gguf_reader as G
from gemma_cy.formats.gguf_reader import Field, parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.quant.tensors import F32Tensor, Q8_0Tensor, dequantize_q8_0, quantize_q8_0
from gemma_cy.model.weights import expected_shapes
from gguf_helpers import T, gguf_bytes, kv_str, kv_u32, tiny_arrays, tinfo, write_tiny


# ================================================================ round trip

def test_round_trip_tiny_model(tiny_gguf):
    arrays = tiny_arrays()
    w = read_gguf(tiny_gguf)
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


def test_tensors_are_read_only_views_of_the_map(tiny_gguf):
    w = read_gguf(tiny_gguf)
    mm = w.keepalive[0]
    for t in w.tensors.values():
        arr = t.blocks if isinstance(t, Q8_0Tensor) else t.data
        assert not arr.flags.writeable
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is mm  # np.frombuffer(mm): no copy


def test_tied_embeddings_are_one_tensor(tiny_gguf):
    w = read_gguf(tiny_gguf)
    assert w.config.tied_embeddings and "lm_head" not in w.tensors
    assert w.lm_head is w["embed_tokens"]


def test_reference_engine_runs_the_tensor_types(tiny_gguf):
    from gemma_cy_reference.model import ReferenceEngine
    eng = ReferenceEngine(read_gguf(tiny_gguf), 16)
    assert eng.weights.lm_head is eng.weights.embed_tokens  # no second copy when tied
    logits = eng.prefill([2, 4, 5, 6])
    assert logits.shape == (12,) and np.all(np.isfinite(logits))


def test_untied_model_reads_output_weight(tmp_path):
    arrays = tiny_arrays()
    arrays["output.weight"] = np.full((12, 32), 127.0, dtype=np.float32)  # d = 1: exact in Q8_0
    w = read_gguf(write_tiny(tmp_path / "untied.gguf", arrays=arrays))
    assert not w.config.tied_embeddings
    np.testing.assert_array_equal(w.lm_head.dequantize(), arrays["output.weight"])


def test_open_weights_picks_gguf_by_magic(tiny_gguf):
    assert open_weights(tiny_gguf).config.dim == 32


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


def test_gguf_py_reads_our_files_and_we_read_its_files(tmp_path, tiny_gguf):
    gguf = pytest.importorskip("gguf", reason="gguf-py is the independent GGUF implementation")
    r = gguf.GGUFReader(tiny_gguf)
    assert r.fields["general.architecture"].contents() == "gemma3"
    assert [t.name for t in r.tensors] == list(tiny_arrays())
    for t in r.tensors:
        ours = read_gguf(tiny_gguf)[gguf_model.tensor_name(t.name, 2)].dequantize()
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
