"""Presets: sizes, matching, and the deterministic random weights (docs/formats.md#the-tiny-test-fixture)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gemma_cy.commands import presets
from gemma_cy.errors import ModelFormatError, ParameterError
from gemma_cy.formats.gmw import gmw_file_size, gmw_layout
from gemma_cy.commands.presets import PRESETS, check_preset, match_preset, preset_config, random_weights
from gemma_cy.quant.tensors import quantize_per_tensor
from gemma_cy.model.weights import Weights, expected_shapes
from helpers import REPO, TINY_SHA256


@pytest.fixture(scope="module")
def small_weights() -> Weights:
    config, tensors = random_weights("small")
    return Weights(config=config, tensors=tensors)


def test_tiny_is_the_seed_preset():
    c = preset_config("tiny")
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.mlp_dim, c.vocab_size,
            c.max_seq_len, c.head_dim, c.rope_base) == (2, 256, 4, 1, 1024, 1024, 256, 64, 10000.0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_gmw1_config(name):
    c = preset_config(name)
    assert c.n_heads * c.head_dim == c.dim  # GMW1's q_proj is [dim][dim]
    assert c.position_table and not c.tied_embeddings and c.activation == "silu"
    assert match_preset(c) == name


def test_270m_sizes_and_file_size():
    c = preset_config("270m-gmw1")
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim,
            c.vocab_size) == (18, 640, 4, 1, 160, 2048, 262144)
    size = gmw_file_size(c.n_layers, c.dim, c.n_kv_heads, c.head_dim, c.mlp_dim,
                         c.vocab_size, c.max_seq_len)
    assert size == 427_401_048


def test_match_preset_ignores_special_tokens_only():
    tiny = preset_config("tiny")
    assert match_preset(tiny.with_changes(bos_id=2, eos_ids=(1,))) == "tiny"
    assert match_preset(tiny.with_changes(n_layers=3)) is None
    assert match_preset(tiny.with_changes(norm_gain="one_plus")) is None


def test_check_preset_names_the_field():
    tiny = preset_config("tiny")
    check_preset(tiny, "tiny")
    with pytest.raises(ModelFormatError, match=r"m\.gmw: n_layers = 2, but model size 'small' has 4"):
        check_preset(tiny, "small", source="m.gmw")


def test_unknown_preset():
    with pytest.raises(ParameterError, match="huge.*tiny"):
        preset_config("huge")
    with pytest.raises(ParameterError):
        random_weights("huge")


def test_tiny_weights_follow_the_literal_spec_recipe():
    # docs/formats.md#the-tiny-test-fixture as written: one generator, one standard_normal call per tensor
    # in file order, f64 -> f32, quantize. random_weights draws in chunks.
    config, tensors = random_weights("tiny")
    rng = np.random.default_rng(20260818)
    for name, shape in gmw_layout(config):
        want = quantize_per_tensor(rng.standard_normal(shape).astype(np.float32))
        assert np.array_equal(tensors[name].q, want.q.reshape(tensors[name].q.shape)), name
        assert tensors[name].scale == want.scale, name


def test_chunked_draw_equals_one_draw(monkeypatch):
    full = random_weights("tiny")[1]
    monkeypatch.setattr(presets, "_CHUNK_VALUES", 1000)  # several chunks per matrix
    chunked = random_weights("tiny")[1]
    for name, t in full.items():
        assert np.array_equal(t.q, chunked[name].q) and t.scale == chunked[name].scale


@settings(max_examples=60, deadline=None, derandomize=True)
@given(w=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, max_side=24),
                    elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       chunk=st.integers(1, 50))
def test_chunked_quantization_equals_the_one_shot_formula(w, chunk):
    """quantize_per_tensor works in row chunks; it must equal docs/formats.md#int8-per-tensor-quantization done in one go."""
    from gemma_cy.quant import tensors as quant
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quant, "QUANT_CHUNK_VALUES", chunk)
        got = quantize_per_tensor(w)
    scale = np.float32(max(float(np.max(np.abs(w))), 1e-9) / 127.0)
    want = np.clip(np.round(w / scale), -128, 127).astype(np.int8)
    assert got.q.dtype == np.int8 and np.array_equal(got.q, want)
    assert got.scale == scale


def test_small_weights_are_deterministic_and_finite(small_weights):
    again = random_weights("small")[1]
    shapes = expected_shapes(small_weights.config)
    for name, t in small_weights.tensors.items():
        assert t.q.shape == shapes[name]
        assert np.isfinite(t.scale) and t.scale > 0
        assert np.array_equal(t.q, again[name].q) and t.scale == again[name].scale
    gains = small_weights["layers.0.attn_norm"].dequantize()
    assert abs(float(gains.mean()) - 1.0) < 0.05 and gains.min() > 0


def _rmsnorm(x, g, eps=1e-6):
    return x / np.sqrt(np.mean(x * x) + eps) * g


def test_small_forward_of_one_token_stays_finite(small_weights):
    # At position 0 attention sees only itself, so each query head outputs
    # its kv head's v: enough to run every matrix of the model once (docs/model.md#the-seed-model-gmw1).
    w, c = small_weights, small_weights.config
    x = w["embed_tokens"].row(7) + w["embed_positions"].row(0)  # (dim,)
    for layer in range(c.n_layers):
        t = {name: w.layer(layer, name).dequantize() for name in
             ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "attn_norm", "ffn_norm")}
        v = (t["v_proj"] @ _rmsnorm(x, t["attn_norm"])).reshape(c.n_kv_heads, c.head_dim)
        heads = v[[h * c.n_kv_heads // c.n_heads for h in range(c.n_heads)]]  # (n_heads, head_dim)
        x = x + t["o_proj"] @ heads.reshape(-1)
        xn = _rmsnorm(x, t["ffn_norm"])
        gate = t["gate_proj"] @ xn
        x = x + t["down_proj"] @ (gate / (1 + np.exp(-gate)) * (t["up_proj"] @ xn))
        assert np.all(np.isfinite(x)) and np.sqrt(np.mean(x * x)) < 10, layer
    logits = w.lm_head.dequantize() @ _rmsnorm(x, w["final_norm"].dequantize())
    assert np.all(np.isfinite(logits)) and np.abs(logits).max() < 20


def test_make_test_weights_script(tmp_path):
    out = tmp_path / "t" / "tiny.gmw"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "make_test_weights.py"),
                          "--size", "tiny", "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == TINY_SHA256
    assert out.exists() and Path(str(out) + ".tok").exists()
