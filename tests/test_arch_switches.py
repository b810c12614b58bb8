"""Llama 3's RoPE frequency divisors and Qwen 2's q/k/v biases at the
boundary: what a file must hold for each, what it may not, and the kernel
that turns the divisors into RoPE tables (docs/model.md#llama-3,
docs/model.md#qwen-2). Their proofs against transformers and llama.cpp are
tests/test_arch_oracles.py's."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gguf_model import gguf_tensor_name, read_gguf, read_gguf_f32, tensor_name
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.quant.types import GGML_TYPE_IDS
from gemma_cy_reference.ops import rope_cos_sin
from helpers import GOLDENS, ISA, kernels

ARCH = GOLDENS / "arch"
F32 = GGML_TYPE_IDS["F32"]


def copy_gguf(src, dst, drop=(), put: dict | None = None) -> str:
    """``src`` rewritten to ``dst``: the same metadata, tensors in ``drop``
    left out, those in ``put`` (name -> f32 vector) replaced or added."""
    gf = parse_gguf(str(src))
    put = dict(put or {})
    tensors = []
    for name, t in gf.tensors.items():
        if name in drop:
            continue
        if name in put:
            v = np.ascontiguousarray(put.pop(name), np.float32)
            tensors.append(TensorData(name, F32, tuple(reversed(v.shape)), v))
        else:
            tensors.append(TensorData(name, t.ggml_type, t.dims, np.array(gf.raw(name))))
    for name, v in put.items():
        v = np.ascontiguousarray(v, np.float32)
        tensors.append(TensorData(name, F32, tuple(reversed(v.shape)), v))
    write_gguf(dst, dict(gf.fields), tensors)
    return str(dst)


def refused(path, *needles) -> None:
    for reader in (read_gguf, read_gguf_f32):
        with pytest.raises(ModelFormatError) as e:
            reader(path)
        msg = str(e.value)
        assert "\n" not in msg and all(n in msg for n in needles), msg


def test_the_files_say_which_switches():
    llama = read_gguf(str(ARCH / "llama3" / "model-q8_0.gguf")).config
    assert llama.rope_freqs and not llama.qkv_bias and llama.rope_pairing == "interleaved"
    qwen2 = read_gguf(str(ARCH / "qwen2" / "model-q8_0.gguf")).config
    assert qwen2.qkv_bias and not qwen2.rope_freqs and qwen2.rope_pairing == "half_split"
    assert qwen2.rope_base == 1e6 and not qwen2.qk_norm
    qwen3 = read_gguf(str(ARCH / "qwen3" / "model-q8_0.gguf")).config
    assert not (qwen3.qkv_bias or qwen3.rope_freqs)


def test_bias_and_rope_freqs_names_round_trip():
    for g in ("blk.3.attn_q.bias", "blk.3.attn_k.bias", "blk.3.attn_v.bias", "blk.3.attn_q.weight",
              "rope_freqs.weight"):
        assert gguf_tensor_name(tensor_name(g, 4)) == g
    assert tensor_name("blk.0.attn_output.bias", 4) is None  # Qwen 2 has none: refused as unexpected
    assert tensor_name("blk.0.ffn_up.bias", 4) is None


def test_qwen2_without_a_bias_is_refused(tmp_path):
    path = copy_gguf(ARCH / "qwen2" / "model-f32.gguf", tmp_path / "m.gguf", drop={"blk.1.attn_v.bias"})
    refused(path, "missing tensor 'blk.1.attn_v.bias'")


def test_bias_of_the_wrong_length_is_refused(tmp_path):
    path = copy_gguf(ARCH / "qwen2" / "model-f32.gguf", tmp_path / "m.gguf",
                     put={"blk.0.attn_k.bias": np.zeros(64)})
    refused(path, "'blk.0.attn_k.bias'", "expected shape (32,)")


@pytest.mark.parametrize("arch, extra", [
    ("qwen3", "blk.0.attn_q.bias"),  # Qwen 3 dropped Qwen 2's biases
    ("qwen2", "rope_freqs.weight"),  # Qwen 2 has no RoPE scaling
    ("gemma2", "rope_freqs.weight"),
])
def test_a_tensor_the_architecture_lacks_is_refused(tmp_path, arch, extra):
    n = 64 if extra.endswith("bias") else 16
    path = copy_gguf(ARCH / arch / "model-f32.gguf", tmp_path / "m.gguf", put={extra: np.ones(n)})
    refused(path, f"unexpected tensor '{extra}'")


@pytest.mark.parametrize("bad, needles", [
    (np.zeros(16), ("rope_freqs holds a value that is not finite and > 0",)),
    (np.full(16, np.nan), ("rope_freqs",)),
    (-np.ones(16), ("rope_freqs holds a value that is not finite and > 0",)),
    (np.ones(8), ("'rope_freqs.weight'", "expected shape (16,)")),
])
def test_bad_rope_freqs_are_refused(tmp_path, bad, needles):
    path = copy_gguf(ARCH / "llama3" / "model-f32.gguf", tmp_path / "m.gguf", put={"rope_freqs.weight": bad})
    refused(path, *needles)


def test_rope_freqs_of_ones_are_plain_rope(tmp_path):
    """Divisors of 1 give the bits of a file without the tensor: the switch
    changes the angles only through the values."""
    from gemma_cy.fast.engine import FastEngine

    src = ARCH / "llama3" / "model-f32.gguf"
    ones = read_gguf(copy_gguf(src, tmp_path / "ones.gguf", put={"rope_freqs.weight": np.ones(16)}))
    plain = read_gguf(copy_gguf(src, tmp_path / "plain.gguf", drop={"rope_freqs.weight"}))
    assert ones.config.rope_freqs and not plain.config.rope_freqs
    ids = [5, 17, 200, 3, 99, 41, 7, 300]
    a, b = FastEngine(ones, 64).prefill(ids), FastEngine(plain, 64).prefill(ids)
    assert a.tobytes() == b.tobytes()
    real = FastEngine(read_gguf(str(src)), 64).prefill(ids)
    assert real.tobytes() != a.tobytes()  # the file's own divisors move the logits


@ISA
@pytest.mark.parametrize("pos, head_dim", [(0, 32), (5, 32), (511, 64), (32767, 128)])
def test_rope_tables_with_divisors_are_the_references(isa, pos, head_dim):
    """The kernel's cos/sin of pos * base^(-2j/hd) / f[j] equal the
    reference's (f64 angles rounded once; libm and NumPy may differ by one
    f64 ulp, so one f32 ulp)."""
    rng = np.random.default_rng(pos)
    factors = rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32)
    want_cos, want_sin = rope_cos_sin(pos, head_dim, 500000.0, factors)
    cos_t, sin_t = kernels(isa).rope_cos_sin(pos, head_dim, 500000.0, factors)
    np.testing.assert_array_max_ulp(cos_t, want_cos, maxulp=1)
    np.testing.assert_array_max_ulp(sin_t, want_sin, maxulp=1)
    plain_cos, _ = rope_cos_sin(pos, head_dim, 500000.0)
    assert pos == 0 or not np.array_equal(plain_cos, want_cos)
    with pytest.raises(ValueError, match="factors of shape"):
        kernels(isa).rope_cos_sin(pos, head_dim, 500000.0, factors[:-1])


# ---------------------------------------------------------------- Phi-3


def test_phi3_reads_its_fused_matrices_as_their_parts():
    """The parts are runs of whole rows of the fused matrix: q, k, v (and
    gate, up) equal the fused rows, for every block type the file has."""
    for kind in ("f32", "q8_0", "q6_k"):
        path = str(ARCH / "phi3" / f"model-{kind}.gguf")
        w, gf = read_gguf_f32(path), parse_gguf(path)
        c = w.config
        assert c.rope_dims == 12 and c.rope_freqs and c.rope_pairing == "half_split"
        assert c.max_seq_len == 512  # the original context: the short factors' range
        assert abs(c.rope_attn_factor - (1 + np.log(4) / np.log(512)) ** 0.5) < 1e-6
        from gemma_cy.quant.ggml import dequantize
        for layer in range(c.n_layers):
            t = gf.tensors[f"blk.{layer}.attn_qkv.weight"]
            qkv = dequantize(gf.raw(t.name), t.ggml_type, t.shape)
            got = np.concatenate([w[f"layers.{layer}.{p}"].dequantize() for p in ("q_proj", "k_proj", "v_proj")])
            assert got.tobytes() == np.asarray(qkv, np.float32).tobytes(), (kind, layer)
            t = gf.tensors[f"blk.{layer}.ffn_up.weight"]
            up = dequantize(gf.raw(t.name), t.ggml_type, t.shape)
            got = np.concatenate([w[f"layers.{layer}.{p}"].dequantize() for p in ("gate_proj", "up_proj")])
            assert got.tobytes() == np.asarray(up, np.float32).tobytes(), (kind, layer)
        short = gf.raw("rope_factors_short.weight").view(np.float32)
        assert w["rope_freqs"].dequantize().tobytes() == short.tobytes()


@pytest.mark.parametrize("drop, needle", [
    ({"blk.1.attn_qkv.weight"}, "missing tensor 'blk.1.attn_qkv.weight'"),
    ({"rope_factors_long.weight"}, "'rope_factors_long.weight' is missing"),
    ({"rope_factors_short.weight"}, "'rope_factors_short.weight' is missing"),
])
def test_phi3_without_a_tensor_is_refused(tmp_path, drop, needle):
    refused(copy_gguf(ARCH / "phi3" / "model-f32.gguf", tmp_path / "m.gguf", drop=drop), needle)


def test_phi3_fused_matrix_of_the_wrong_shape_is_refused(tmp_path):
    path = copy_gguf(ARCH / "phi3" / "model-f32.gguf", tmp_path / "m.gguf",
                     put={"blk.0.attn_qkv.weight": np.zeros((96, 64))})
    refused(path, "'blk.0.attn_qkv.weight'", "expected shape (128, 64)", "fused q_proj, k_proj, v_proj")


def test_phi3_with_both_fused_and_split_matrices_is_refused(tmp_path):
    path = copy_gguf(ARCH / "phi3" / "model-f32.gguf", tmp_path / "m.gguf",
                     put={"blk.0.attn_k.weight": np.zeros((32, 64))})
    refused(path, "'blk.0.attn_k.weight'", "both the model's layers.0.k_proj")


def test_phi3_long_factors_of_the_wrong_length_are_refused(tmp_path):
    path = copy_gguf(ARCH / "phi3" / "model-f32.gguf", tmp_path / "m.gguf",
                     put={"rope_factors_long.weight": np.ones(8)})
    refused(path, "'rope_factors_long.weight' is F32 with dims [8]", "F32 of 6 values each")


def test_phi3_window_from_the_file_is_every_layers(tmp_path):
    """transformers' Phi3 applies config.sliding_window to every layer
    (Phi-3-mini's files say 2047); 0 means none (Phi-4-mini)."""
    from gemma_cy.formats.gguf_config import gguf_config

    gf = parse_gguf(str(ARCH / "phi3" / "model-f32.gguf"))
    assert gguf_config(gf).sliding_window == 0
    path = tmp_path / "w.gguf"
    fields = dict(gf.fields)
    fields["phi3.attention.sliding_window"] = 2047
    write_gguf(path, fields, [TensorData(n, t.ggml_type, t.dims, np.array(gf.raw(n))) for n, t in gf.tensors.items()])
    c = read_gguf(str(path)).config
    assert c.sliding_window == 2047 and all(c.is_local(layer) for layer in range(c.n_layers))


def test_convert_keeps_phi3_fused(tmp_path):
    from gemma_cy.commands.convert import convert

    out = tmp_path / "out.gguf"
    convert(str(ARCH / "phi3" / "model-f32.gguf"), str(out))
    gf = parse_gguf(str(out))
    assert "blk.0.attn_qkv.weight" in gf.tensors and gf.tensors["blk.0.attn_qkv.weight"].type_name == "Q8_0"
    assert read_gguf(str(out)).config.rope_dims == 12


@pytest.mark.parametrize("rope_dims, needle", [(7, "rope_dims = 7"), (18, "rope_dims = 18"), (-2, "rope_dims = -2")])
def test_rope_dims_must_fit_the_head(rope_dims, needle):
    from gemma_cy.model.config import ModelConfig

    with pytest.raises(ModelFormatError, match=needle):
        ModelConfig(n_layers=1, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=64, vocab_size=8,
                    max_seq_len=8, rope_dims=rope_dims)


@ISA
@pytest.mark.parametrize("pairing", ["interleaved", "half_split"])
def test_partial_rope_rotates_the_first_dims_only(isa, pairing):
    from gemma_cy_reference.ops import rope

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    got = kernels(isa).rope(x, 37, 10000.0, pairing, rot_dims=12)
    want = rope(x, 37, 10000.0, pairing, rot_dims=12)
    np.testing.assert_array_equal(got[:, 12:], x[:, 12:])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # the kernel may fuse a * cos - b * sin
    assert not np.array_equal(got[:, :12], x[:, :12])


# ---------------------------------------------------------------- Gemma 4


def test_gemma4_config_from_its_file():
    c = read_gguf(str(ARCH / "gemma4" / "model-q8_0.gguf")).config
    assert (c.head_dim, c.head_dim_global, c.kv_shared_layers, c.per_layer_input_dim) == (16, 32, 3, 32)
    assert c.attn_k_eq_v and c.v_norm and c.layer_scalars and c.rope_freqs_global_only and c.query_scale == 1.0
    assert c.mlp_dims == (128, 128, 128, 256, 256, 256) and c.sliding_window_pattern == 3
    assert [c.kv_source(layer) for layer in range(6)] == [0, 1, 2, 1, 1, 2]
    assert [c.has_v_proj(layer) for layer in range(6)] == [True, True, False, True, True, False]
    assert c.final_softcap == 5.0


@pytest.mark.parametrize("drop, put, needle", [
    ({"blk.1.attn_k.weight"}, None, "missing tensor 'blk.1.attn_k.weight'"),
    ({"per_layer_token_embd.weight"}, None, "missing tensor 'per_layer_token_embd.weight'"),
    ((), {"blk.4.attn_k_norm.weight": np.ones(16)}, "unexpected tensor 'blk.4.attn_k_norm.weight'"),
    ((), {"blk.5.attn_v.weight": np.ones((64, 64))}, "unexpected tensor 'blk.5.attn_v.weight'"),
])
def test_gemma4_tensor_set_follows_its_layers(tmp_path, drop, put, needle):
    refused(copy_gguf(ARCH / "gemma4" / "model-f32.gguf", tmp_path / "m.gguf", drop=drop, put=put), needle)


def test_gemma4_experts_are_read_one_matrix_each():
    """Each expert's matrices are its rows of the file's 3-D tensors, for
    every block type the file has; the router stays f32 (as stored)."""
    from gemma_cy.quant.ggml import dequantize

    for kind in ("f32", "q8_0"):
        path = str(ARCH / "gemma4_moe" / f"model-{kind}.gguf")
        w, gf = read_gguf_f32(path), parse_gguf(path)
        c = w.config
        assert (c.n_experts, c.n_experts_used, c.expert_mlp_dim) == (4, 2, 64)
        for layer in range(c.n_layers):
            for key, part in (("ffn_gate_up_exps", "gate_up"), ("ffn_down_exps", "down")):
                t = gf.tensors[f"blk.{layer}.{key}.weight"]
                whole = np.asarray(dequantize(gf.raw(t.name), t.ggml_type, (t.shape[0] * t.shape[1], t.shape[2])),
                                   np.float32)
                got = np.concatenate([w[f"layers.{layer}.expert{e}_{part}"].dequantize() for e in range(4)])
                assert got.tobytes() == whole.tobytes(), (kind, layer, key)
        assert gf.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"


@pytest.mark.parametrize("drop, put, needle", [
    ({"blk.2.ffn_down_exps.weight"}, None, "missing tensor 'blk.2.ffn_down_exps.weight'"),
    ({"blk.1.ffn_gate_inp.scale"}, None, "missing tensor 'blk.1.ffn_gate_inp.scale'"),
    ((), {"blk.0.ffn_down_exps.weight": np.zeros((4, 64, 32))}, "'blk.0.ffn_down_exps.weight'"),
])
def test_gemma4_expert_tensors_are_checked(tmp_path, drop, put, needle):
    refused(copy_gguf(ARCH / "gemma4_moe" / "model-f32.gguf", tmp_path / "m.gguf", drop=drop, put=put), needle)


@pytest.mark.parametrize("shared, needle", [(6, "kv_shared_layers = 6"), (-1, "kv_shared_layers = -1")])
def test_shared_layers_need_a_layer_of_their_kind(shared, needle):
    from gemma_cy.model.config import ModelConfig

    with pytest.raises(ModelFormatError, match=needle):
        ModelConfig(n_layers=6, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=64, vocab_size=8,
                    max_seq_len=8, sliding_window=4, sliding_window_pattern=3, kv_shared_layers=shared)


def test_reference_cache_follows_the_sharing():
    """The reference's cache has rows for the layers that compute k and v
    only (Gemma 4's shared layers read their source's row)."""
    from gemma_cy_reference.weights import KVCache

    c = read_gguf(str(ARCH / "gemma4" / "model-q8_0.gguf")).config
    cache = KVCache(c, 16)
    assert cache.key_cache.shape == (3, 16, 2, 32) and cache.index == [0, 1, 2, 1, 1, 2]
    uniform = read_gguf(str(ARCH / "qwen3" / "model-q8_0.gguf")).config
    assert KVCache(uniform, 4).index == list(range(uniform.n_layers))
