"""reference/layers.py at the edges of its rules (soft-caps at or below 1,
the f32 RoPE table, the q8 mode's row chunks and its refusal of f32
matrices; docs/model.md, docs/numerics.md), cases found by mutation testing.

Expected values are recomputed here in float64 from the documented formulas
(cap * tanh(x / cap), softmax over the capped scores, cos/sin rounded once
to f32), from the engine's own observed q, k and v where a whole layer
would otherwise have to be re-implemented.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from gemma_cy.errors import ParameterError
from gemma_cy.model.config import ModelConfig
from gemma_cy.model.tolerance import DEFAULT
from gemma_cy.model.weights import Weights
from gemma_cy.quant.tensors import F32Tensor, Q8_0Tensor, quantize_per_tensor, quantize_q8_0
from gemma_cy_reference.layers import attention, logits
from gemma_cy_reference.model import ReferenceEngine
from gemma_cy_reference.ops import rope_cos_sin
from gemma_cy_reference.q8 import Q8Matrix
from gemma_cy_reference.weights import F32Weights, KVCache
from helpers import cached_weights

ATOL, RTOL = DEFAULT

SEED = ModelConfig(n_layers=1, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                   vocab_size=64, max_seq_len=16)


@pytest.mark.parametrize("cap", [1.0, 0.5])
def test_final_softcap_at_or_below_one_is_applied(cap):
    """Any final_softcap > 0 caps the logits: cap * tanh(z / cap), also for
    caps of 1 and below (not only the large caps real models use)."""
    rng = np.random.default_rng(1)
    lm_head = rng.standard_normal((64, 32)).astype(np.float32)
    x = rng.standard_normal(32).astype(np.float32)
    z = lm_head.astype(np.float64) @ x.astype(np.float64)
    assert np.max(np.abs(z)) > 4 * cap  # the cap bites: uncapped logits are far outside it
    out = logits(x, SimpleNamespace(lm_head=lm_head), SEED.with_changes(final_softcap=cap))
    assert np.max(np.abs(out)) <= cap
    np.testing.assert_allclose(out, cap * np.tanh(z / cap), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("cap", [1.0, 0.5])
def test_attention_softcap_at_or_below_one_is_applied(cap):
    """Any attn_softcap > 0 caps the attention scores before the softmax.
    The expected attention output is recomputed in float64 from the q, k, v
    the layer observed: s = cap * tanh(q.k * scale / cap), softmax over the
    positions, weighted sum of the values (GQA: head h reads kv head
    h * n_kv_heads // n_heads)."""
    config = SEED.with_changes(attn_softcap=cap)
    layer = F32Weights.from_weights(cached_weights(config)).layers[0]
    cache = KVCache(config, 4)
    seen: dict[tuple[str, int], np.ndarray] = {}

    def observer(layer_index, op, pos, value):
        seen[op, pos] = np.array(value, dtype=np.float64)

    rng = np.random.default_rng(2)
    for pos in range(3):
        attention(4.0 * rng.standard_normal(config.dim).astype(np.float32), layer, 0, pos, cache,
                  config, observer)
    pos = 2
    q = seen["q", pos]  # (nh, hd)
    keys = np.stack([seen["k", t] for t in range(pos + 1)])  # (T, nkv, hd)
    values = np.stack([seen["v", t] for t in range(pos + 1)])  # (T, nkv, hd)
    expected, largest = [], 0.0
    for h in range(config.n_heads):
        kvh = h * config.n_kv_heads // config.n_heads
        s = keys[:, kvh] @ q[h] * config.scores_scale  # (T,)
        largest = max(largest, float(np.max(np.abs(s))))
        s = cap * np.tanh(s / cap)
        p = np.exp(s - s.max())
        p /= p.sum()
        expected.append(p @ values[:, kvh])
    assert largest > 4 * cap  # the cap bites
    np.testing.assert_allclose(seen["attn_out", pos], np.concatenate(expected), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("pos", "head_dim", "base"), [(0, 8, 10000.0), (7, 8, 10000.0), (1234, 16, 1e6)])
def test_rope_cos_sin_are_f64_angles_rounded_once_to_f32(pos, head_dim, base):
    """rope_cos_sin returns f32 arrays: cos and sin of the float64 angles
    pos * base^(-2j/hd), each rounded once to f32 (the table the fast engine
    reproduces bit for bit)."""
    cos, sin = rope_cos_sin(pos, head_dim, base)
    assert cos.dtype == np.float32 and sin.dtype == np.float32
    angles = [pos * base ** (-2.0 * j / head_dim) for j in range(head_dim // 2)]
    # within one f32 ulp of libm's values: two maths libraries may round an f64 cos differently
    # by one f64 ulp, which can move the f32 rounding by one ulp, never more
    for got, fn in ((cos, math.cos), (sin, math.sin)):
        want = np.array([fn(a) for a in angles], np.float32)
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
        assert ulps.max(initial=0) <= 1


@pytest.mark.parametrize("kind", ["int8", "q8_0"])
def test_q8_matrix_rows_beyond_one_chunk_are_computed(monkeypatch, kind):
    """Q8Matrix works through the rows ROWS_PER_CHUNK at a time (a real
    vocabulary has more rows than one chunk): with chunks of 3 rows, a
    (40, 32) matrix (more rows than columns) gives the same product, row for
    row, as in one chunk."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 32)).astype(np.float32)
    tensor = quantize_per_tensor(w) if kind == "int8" else Q8_0Tensor(quantize_q8_0(w))
    x = rng.standard_normal(32).astype(np.float32)
    whole = Q8Matrix(tensor) @ x
    monkeypatch.setattr(Q8Matrix, "ROWS_PER_CHUNK", 3)
    np.testing.assert_array_equal(Q8Matrix(tensor) @ x, whole)


def test_q8_reference_refuses_a_model_with_an_f32_matrix():
    """The reference engine in the q8 mode refuses a model holding an f32
    matrix (q8 products are integer ones) with ParameterError naming it,
    like every other engine (gemma_cy.model.checks.check_activation_mode)."""
    config = SEED.with_changes(mlp_dim=64)
    weights = cached_weights(config)
    tensors = dict(weights.tensors)
    tensors["layers.0.q_proj"] = F32Tensor(tensors["layers.0.q_proj"].dequantize())
    with pytest.raises(ParameterError, match="layers.0.q_proj"):
        ReferenceEngine(Weights(config, tensors), 16, "q8")
