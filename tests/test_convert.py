"""The GGUF converter (gemma_cy/commands/convert.py): a source of many ggml
types to Q8_0 (exact where the source's levels fit, rounded once where
not) or F16, metadata kept, what it cannot read refused; the benchmarks'
cached Q8_0 conversion (gemma_cy/commands/default_model.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from gemma_cy.quant import ggml as gq
from gemma_cy.quant import types as gt
from gemma_cy.commands.convert import convert
from gemma_cy.errors import ModelFormatError
from gemma_cy.formats import gguf_model
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.quant.tensors import quantize_q8_0
from gguf_helpers import T, TINY, put, random_blocks, tensor_data, tiny_arrays, tiny_fields, write_tiny


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
