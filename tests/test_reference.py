"""The NumPy reference model checked against independent facts.

Layer facts (RoPE is a rotation, RMSNorm of a constant, activations against
scalar math, attention over one position, windows, GQA), engine facts (KV
cache, causality, bounds, NaN) and a whole forward pass against a float64
re-implementation written here with loops, sharing nothing with the
reference. Tolerances are docs/numerics.md#tolerances's.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_cy.model.config import ModelConfig
from gemma_cy.errors import NumericalError, ParameterError, TokenIndexError
from gemma_cy.model.logits import argmax
from gemma_cy.model.tolerance import DEFAULT, PROBABILITIES
from gemma_cy.model.weights import Weights
from gemma_cy_reference.generate import generate
from gemma_cy_reference.layers import attention
from gemma_cy_reference.model import OBSERVED_OPS, ReferenceEngine, observed_calls
from gemma_cy_reference.ops import gelu_tanh, rmsnorm, rope, silu
from gemma_cy_reference.weights import F32Weights, KVCache
from helpers import assert_rewinds_and_resets, cached_weights, make_weights, with_tensor

ATOL, RTOL = DEFAULT  # docs/numerics.md#tolerances default
ACT_ATOL, ACT_RTOL = PROBABILITIES  # docs/numerics.md#tolerances: softmax, SiLU/GELU

FEW = settings(max_examples=25, deadline=None)

SEED = ModelConfig(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                   vocab_size=64, max_seq_len=16)
GEMMA3 = ModelConfig(
    n_layers=2, dim=32, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=48, vocab_size=64,
    max_seq_len=16, activation="gelu_tanh", rope_pairing="half_split", rope_base=1e6,
    rope_base_local=1e4, norm_gain="one_plus", position_table=False,
    embed_scale=float(np.float32(math.sqrt(32))), qk_norm=True, post_norms=True,
    sliding_window=3, sliding_window_pattern=2, tied_embeddings=True)
# Gemma 2's switches on Gemma 3's shape: soft-caps small enough to bite, a
# query scale that is not 1/sqrt(head_dim), no q/k-norm.
SOFTCAPS = GEMMA3.with_changes(qk_norm=False, attn_softcap=1.5, final_softcap=4.0,
                               query_scale=0.2)


def engine_for(config: ModelConfig, seed: int = 0, max_cache_len: int = 1 << 20) -> ReferenceEngine:
    return ReferenceEngine(cached_weights(config, seed), max_cache_len)


def run_collecting(engine: ReferenceEngine, ids, op: str = "logits") -> dict[int, np.ndarray]:
    """Decode ``ids`` one by one (so every position computes logits); return
    pos -> the observed value of ``op``."""
    seen = {}

    def observer(layer, name, pos, value):
        if name == op:
            seen[pos] = value.copy()
    for token in ids:
        engine.decode(token, observer)
    return seen


# ---------------------------------------------------------------------------
# A float64 re-implementation, with loops (shares nothing with reference/)


def f64_forward(weights: Weights, ids) -> list[np.ndarray]:
    """Logits (vocab,) of every position of ``ids``, computed in float64."""
    c = weights.config
    W = {name: t.q.astype(np.float64) * float(t.scale) for name, t in weights.tensors.items()}
    head = W["embed_tokens"] if c.tied_embeddings else W["lm_head"]
    hd, half = c.head_dim, c.head_dim // 2
    group = c.n_heads // c.n_kv_heads
    scale = c.query_scale if c.query_scale is not None else 1.0 / math.sqrt(hd)

    def norm(v, g):
        gain = 1.0 + g if c.norm_gain == "one_plus" else g
        return v / math.sqrt(sum(e * e for e in v) / len(v) + c.norm_eps) * gain

    def act(u):
        if c.activation == "silu":
            return u / (1.0 + math.exp(-u))
        return 0.5 * u * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))

    def rotate(v, pos, base):
        out = v.copy()
        for j in range(half):
            a, b = (2 * j, 2 * j + 1) if c.rope_pairing == "interleaved" else (j, j + half)
            theta = pos * base ** (-2.0 * j / hd)
            out[a] = v[a] * math.cos(theta) - v[b] * math.sin(theta)
            out[b] = v[a] * math.sin(theta) + v[b] * math.cos(theta)
        return out

    keys = [[] for _ in range(c.n_layers)]  # [layer][pos][kv head] -> (hd,)
    values = [[] for _ in range(c.n_layers)]
    all_logits = []
    for pos, tok in enumerate(ids):
        x = W["embed_tokens"][tok] * c.embed_scale
        if c.position_table:
            x = x + W["embed_positions"][pos]
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            local = c.sliding_window > 0 and (
                c.sliding_window_pattern == 0 or (layer + 1) % c.sliding_window_pattern != 0)
            base = c.rope_base_local if local and c.rope_base_local is not None else c.rope_base
            first = max(0, pos - c.sliding_window + 1) if local else 0

            xn = norm(x, W[p + "attn_norm"])
            q, k, v = W[p + "q_proj"] @ xn, W[p + "k_proj"] @ xn, W[p + "v_proj"] @ xn
            q_heads, k_heads, v_heads = [], [], []
            for h in range(c.n_heads):
                qh = q[h * hd:(h + 1) * hd]
                if c.qk_norm:
                    qh = norm(qh, W[p + "q_norm"])
                q_heads.append(rotate(qh, pos, base))
            for g in range(c.n_kv_heads):
                kh = k[g * hd:(g + 1) * hd]
                if c.qk_norm:
                    kh = norm(kh, W[p + "k_norm"])
                k_heads.append(rotate(kh, pos, base))
                v_heads.append(v[g * hd:(g + 1) * hd])
            keys[layer].append(k_heads)
            values[layer].append(v_heads)

            attn_out = np.zeros(c.n_heads * hd)
            for h in range(c.n_heads):
                g = h // group
                scores = []
                for t in range(first, pos + 1):
                    s = sum(q_heads[h][i] * keys[layer][t][g][i] for i in range(hd)) * scale
                    if c.attn_softcap > 0:
                        s = c.attn_softcap * math.tanh(s / c.attn_softcap)
                    scores.append(s)
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                total = sum(e)
                for t, weight in zip(range(first, pos + 1), e):
                    attn_out[h * hd:(h + 1) * hd] += weight / total * values[layer][t][g]
            a = W[p + "o_proj"] @ attn_out
            if c.post_norms:
                a = norm(a, W[p + "post_attn_norm"])
            x = x + a

            xn = norm(x, W[p + "ffn_norm"])
            gate, up = W[p + "gate_proj"] @ xn, W[p + "up_proj"] @ xn
            hidden = np.array([act(gate[i]) * up[i] for i in range(c.mlp_dim)])
            m = W[p + "down_proj"] @ hidden
            if c.post_norms:
                m = norm(m, W[p + "post_ffn_norm"])
            x = x + m
        logits = head @ norm(x, W["final_norm"])
        if c.final_softcap > 0:
            logits = np.array([c.final_softcap * math.tanh(z / c.final_softcap) for z in logits])
        all_logits.append(logits)
    return all_logits


@pytest.mark.parametrize("config", [SEED, GEMMA3, SOFTCAPS], ids=["seed", "gemma3", "softcaps"])
def test_forward_matches_float64_loops(config):
    weights = make_weights(config, seed=1)
    ids = [3, 17, 63, 0, 42, 42, 9, 31, 5, 20]  # longer than the window: local layers slide
    expected = f64_forward(weights, ids)
    got = run_collecting(ReferenceEngine(weights, 64), ids)
    assert sorted(got) == list(range(len(ids)))
    for pos in range(len(ids)):
        assert got[pos].dtype == np.float32
        np.testing.assert_allclose(got[pos], expected[pos], atol=ATOL, rtol=RTOL,
                                   err_msg=f"position {pos}")


# ---------------------------------------------------------------------------
# RoPE

PAIRINGS = ("interleaved", "half_split")
head_dims = st.sampled_from([2, 4, 8, 16, 64, 256])
bases = st.sampled_from([10000.0, 1e6, 3.0])


def pairs(x: np.ndarray, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    half = x.shape[-1] // 2
    if pairing == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    return x[..., :half], x[..., half:]


def random_heads(seed: int, n: int, head_dim: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, head_dim)).astype(np.float32)


@FEW
@given(head_dim=head_dims, pos=st.integers(0, 40000), base=bases,
       pairing=st.sampled_from(PAIRINGS), seed=st.integers(0, 2**32 - 1))
def test_rope_preserves_each_pair_norm(head_dim, pos, base, pairing, seed):
    x = random_heads(seed, 3, head_dim)
    y = rope(x, pos, base, pairing)
    assert y.shape == x.shape and y.dtype == np.float32
    xa, xb = pairs(x.astype(np.float64), pairing)
    ya, yb = pairs(y.astype(np.float64), pairing)
    np.testing.assert_allclose(ya ** 2 + yb ** 2, xa ** 2 + xb ** 2, rtol=1e-5, atol=1e-6)


@FEW
@given(head_dim=head_dims, base=bases, pairing=st.sampled_from(PAIRINGS),
       seed=st.integers(0, 2**32 - 1))
def test_rope_is_identity_at_position_zero(head_dim, base, pairing, seed):
    x = random_heads(seed, 2, head_dim)
    np.testing.assert_array_equal(rope(x, 0, base, pairing), x)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_angle_of_each_pair(pairing):
    """Pair j alone, as (1, 0), turns into (cos, sin) of pos * base^(-2j/hd)."""
    head_dim, base, pos = 8, 100.0, 7
    for j in range(head_dim // 2):
        x = np.zeros((1, head_dim), dtype=np.float32)
        a = 2 * j if pairing == "interleaved" else j
        b = 2 * j + 1 if pairing == "interleaved" else j + head_dim // 2
        x[0, a] = 1.0
        y = rope(x, pos, base, pairing)
        theta = pos * base ** (-2.0 * j / head_dim)
        expected = np.zeros(head_dim)
        expected[a], expected[b] = math.cos(theta), math.sin(theta)
        np.testing.assert_allclose(y[0], expected, atol=1e-6)


@FEW
@given(head_dim=head_dims, pos=st.integers(0, 40000), base=bases, seed=st.integers(0, 2**32 - 1))
def test_rope_pairings_are_one_rotation_up_to_a_permutation(head_dim, pos, base, seed):
    # perm lays interleaved pairs out half-split: y[j] = x[2j], y[j + hd/2] = x[2j + 1]
    perm = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    x = random_heads(seed, 3, head_dim)
    np.testing.assert_array_equal(rope(x[:, perm], pos, base, "half_split"),
                                  rope(x, pos, base, "interleaved")[:, perm])


@FEW
@given(head_dim=head_dims, m=st.integers(0, 2000), n=st.integers(0, 2000),
       shift=st.integers(0, 2000), base=bases, pairing=st.sampled_from(PAIRINGS),
       seed=st.integers(0, 2**32 - 1))
def test_rope_scores_depend_only_on_relative_position(head_dim, m, n, shift, base, pairing, seed):
    q, k = random_heads(seed, 2, head_dim)
    dot = float(rope(q[None], m, base, pairing)[0] @ rope(k[None], n, base, pairing)[0])
    shifted = float(rope(q[None], m + shift, base, pairing)[0]
                    @ rope(k[None], n + shift, base, pairing)[0])
    scale = float(np.linalg.norm(q) * np.linalg.norm(k))
    assert abs(dot - shifted) <= 1e-5 * scale


# ---------------------------------------------------------------------------
# RMSNorm and activations


@FEW
@given(c=st.floats(-1e3, 1e3).filter(lambda v: abs(v) >= 0.1), n=st.integers(1, 64),
       one_plus=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_rmsnorm_of_a_constant_vector_is_the_sign_times_the_gain(c, n, one_plus, seed):
    eps = 1e-6
    gain = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x = np.full(n, c, dtype=np.float32)
    y = rmsnorm(x, gain, eps, one_plus)
    g = 1.0 + gain.astype(np.float64) if one_plus else gain.astype(np.float64)
    c32 = float(np.float32(c))
    exact = c32 / math.sqrt(c32 * c32 + eps) * g  # mean(x^2) = c^2
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, np.sign(c) * g, rtol=1e-4, atol=1e-4)  # |c| >= 0.1: eps/c^2 <= 1e-4


def test_rmsnorm_eps_keeps_zero_at_zero():
    y = rmsnorm(np.zeros(8, dtype=np.float32), np.ones(8, dtype=np.float32), 1e-6, False)
    np.testing.assert_array_equal(y, np.zeros(8))


def test_rmsnorm_normalizes_each_row_of_a_matrix_alone():
    x = random_heads(5, 3, 16) * np.array([[1.0], [10.0], [0.01]], dtype=np.float32)
    gain = random_heads(6, 1, 16)[0]
    whole = rmsnorm(x, gain, 1e-6, True)
    for row in range(3):
        np.testing.assert_allclose(whole[row], rmsnorm(x[row], gain, 1e-6, True), rtol=1e-6)
        rms = math.sqrt(np.mean(x[row].astype(np.float64) ** 2) + 1e-6)
        np.testing.assert_allclose(whole[row], x[row] / rms * (1.0 + gain), rtol=1e-5, atol=1e-6)


float_arrays = st.lists(st.floats(-30.0, 30.0, width=32), min_size=1, max_size=50)


@FEW
@given(values=float_arrays)
def test_silu_matches_scalar_formula(values):
    x = np.array(values, dtype=np.float32)
    expected = [v / (1.0 + math.exp(-v)) for v in values]
    y = silu(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, atol=ACT_ATOL, rtol=ACT_RTOL)


@FEW
@given(values=float_arrays)
def test_gelu_tanh_matches_scalar_formula(values):
    x = np.array(values, dtype=np.float32)
    expected = [0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
                for v in values]
    y = gelu_tanh(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, atol=ACT_ATOL, rtol=ACT_RTOL)


def test_silu_has_no_overflow_far_out():
    with np.errstate(over="raise", invalid="raise"):
        y = silu(np.array([-1e4, -100.0, 0.0, 100.0, 1e4], dtype=np.float32))
    np.testing.assert_allclose(y, [0.0, 0.0, 0.0, 100.0, 1e4], atol=1e-30)


# ---------------------------------------------------------------------------
# Attention


def layer0(config: ModelConfig, seed: int = 0):
    return F32Weights.from_weights(cached_weights(config, seed)).layers[0]


def expanded_v_through_o_proj(x: np.ndarray, w, config: ModelConfig) -> np.ndarray:
    """o_proj . (v of each query head's kv head), in float64."""
    v = w.v_proj.astype(np.float64) @ x.astype(np.float64)  # (kvd,)
    hd, group = config.head_dim, config.n_heads // config.n_kv_heads
    heads = [v[(h // group) * hd:(h // group + 1) * hd] for h in range(config.n_heads)]
    return w.o_proj.astype(np.float64) @ np.concatenate(heads)


@FEW
@given(seed=st.integers(0, 2**32 - 1), q_scale=st.sampled_from([0.0, 1.0, 1e3]),
       config=st.sampled_from([SEED, GEMMA3, SOFTCAPS]))
def test_attention_over_one_position_returns_v_through_o_proj(seed, q_scale, config):
    w = layer0(config)
    w = dataclasses.replace(w, q_proj=w.q_proj * np.float32(q_scale))  # any scores
    x = np.random.default_rng(seed).standard_normal(config.dim).astype(np.float32)
    out = attention(x, w, 0, 0, KVCache(config, 4), config)
    np.testing.assert_allclose(out, expanded_v_through_o_proj(x, w, config), atol=ATOL, rtol=RTOL)


def test_window_of_one_attends_to_itself_only():
    config = SEED.with_changes(sliding_window=1)
    w = layer0(config)
    cache = KVCache(config, 8)
    rng = np.random.default_rng(3)
    cache.key_cache[:] = rng.standard_normal(cache.key_cache.shape)
    cache.value_cache[:] = rng.standard_normal(cache.value_cache.shape)
    x = rng.standard_normal(config.dim).astype(np.float32)
    out = attention(x, w, 0, 5, cache, config)
    np.testing.assert_allclose(out, expanded_v_through_o_proj(x, w, config), atol=ATOL, rtol=RTOL)


@FEW
@given(window=st.integers(1, 6), pos=st.integers(0, 10), seed=st.integers(0, 2**32 - 1))
def test_sliding_window_ignores_keys_older_than_the_window(window, pos, seed):
    config = SEED.with_changes(sliding_window=window)
    w = layer0(config)
    rng = np.random.default_rng(seed)
    cache = KVCache(config, 12)
    cache.key_cache[:] = rng.standard_normal(cache.key_cache.shape)
    cache.value_cache[:] = rng.standard_normal(cache.value_cache.shape)
    x = rng.standard_normal(config.dim).astype(np.float32)
    before = attention(x, w, 0, pos, cache, config)
    first = pos - window + 1  # oldest position in the window
    if first > 0:
        cache.key_cache[0, :first] = rng.standard_normal(cache.key_cache[0, :first].shape)
        cache.value_cache[0, :first] = rng.standard_normal(cache.value_cache[0, :first].shape)
    np.testing.assert_array_equal(attention(x, w, 0, pos, cache, config), before)
    if first >= 0 and first < pos:  # the oldest key in the window does count
        cache.value_cache[0, first] += 10.0
        assert not np.allclose(attention(x, w, 0, pos, cache, config), before)


@pytest.mark.parametrize("n_heads,n_kv_heads,expected",
                         [(6, 2, [0, 0, 0, 1, 1, 1]), (6, 3, [0, 0, 1, 1, 2, 2]),
                          (4, 4, [0, 1, 2, 3]), (4, 1, [0, 0, 0, 0])])
def test_gqa_query_head_reads_its_kv_head(n_heads, n_kv_heads, expected):
    head_dim, pos = 4, 3
    config = SEED.with_changes(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, dim=24)
    w = layer0(config)
    # Every value of kv head g is the constant g + 1 (cached positions, and
    # this position's own v: v_proj . e_0): whatever the scores, query head
    # h's weighted sum is the constant of the kv head it reads.
    level = np.repeat(np.arange(n_kv_heads, dtype=np.float32) + 1.0, head_dim)  # (kvd,)
    v_proj = np.zeros_like(w.v_proj)
    v_proj[:, 0] = level
    w = dataclasses.replace(w, v_proj=v_proj)
    cache = KVCache(config, 8)
    cache.key_cache[:] = np.random.default_rng(0).standard_normal(cache.key_cache.shape)
    cache.value_cache[0, :pos] = level.reshape(n_kv_heads, head_dim)
    x = np.zeros(config.dim, dtype=np.float32)
    x[0] = 1.0
    seen = {}
    attention(x, w, 0, pos, cache, config, lambda layer, op, p, value: seen.setdefault(op, value))
    out = seen["attn_out"].reshape(n_heads, head_dim)  # (nh, hd)
    want = np.repeat(np.array(expected, dtype=np.float64) + 1.0, head_dim).reshape(n_heads, head_dim)
    np.testing.assert_allclose(out, want, rtol=1e-6)


# ---------------------------------------------------------------------------
# Engine: observer, KV cache, causality, windows across layers


def test_observer_sees_every_op_in_order_with_its_shape():
    c = GEMMA3
    engine = engine_for(c)
    calls = []
    engine.prefill([1, 2], lambda layer, op, pos, value: calls.append((layer, op, pos, value)))
    order = observed_calls(c.n_layers)
    no_logits = [call for call in order if call[1] != "logits"]  # prefill: logits at its last position only
    assert [(layer, op) for layer, op, pos, _ in calls] == no_logits + order
    assert [pos for _, _, pos, _ in calls] == [0] * len(no_logits) + [1] * len(order)
    assert {op for _, op in order} == set(OBSERVED_OPS)
    shapes = {"q": (c.n_heads, c.head_dim), "k": (c.n_kv_heads, c.head_dim),
              "v": (c.n_kv_heads, c.head_dim), "attn_out": (c.q_dim,), "logits": (c.vocab_size,)}
    for _, op, _, value in calls:
        assert value.dtype == np.float32
        assert value.shape == shapes.get(op, (c.dim,)), op
        assert not value.flags.writeable  # an observer cannot change the computation


def test_observed_values_chain_into_each_other():
    c = SEED
    engine = engine_for(c)
    seen = {}
    logits = engine.prefill([4, 5, 6], lambda layer, op, pos, value: seen.__setitem__((layer, op, pos), value))
    np.testing.assert_array_equal(seen[(c.n_layers, "logits", 2)], logits)
    for layer in range(c.n_layers):
        before = seen[(layer - 1, "resid_mlp", 2)] if layer else seen[(-1, "embed", 2)]
        np.testing.assert_array_equal(seen[(layer, "resid_attn", 2)], before + seen[(layer, "attn", 2)])
        np.testing.assert_array_equal(seen[(layer, "resid_mlp", 2)],
                                      seen[(layer, "resid_attn", 2)] + seen[(layer, "mlp", 2)])
    np.testing.assert_array_equal(engine.cache.key_cache[1, 2], seen[(1, "k", 2)])
    np.testing.assert_array_equal(engine.cache.value_cache[1, 2], seen[(1, "v", 2)])


@pytest.mark.parametrize("config", [SEED, GEMMA3], ids=["seed", "gemma3"])
def test_prefill_equals_decoding_one_by_one(config):
    ids = [7, 1, 60, 33, 2, 2, 19, 50]
    whole = engine_for(config)
    every_op_prefill = []
    last = whole.prefill(ids, lambda *call: every_op_prefill.append(call))
    stepwise = engine_for(config)
    every_op_decode = []
    stepwise.prefill(ids[:3], lambda *call: every_op_decode.append(call))
    for token in ids[3:]:
        out = stepwise.decode(token, lambda *call: every_op_decode.append(call))
    np.testing.assert_array_equal(out, last)
    assert whole.pos == stepwise.pos == len(ids)
    # prefill computes logits at its last position only: positions 0-1 of the
    # stepwise run (its own prefill) have none either; positions 2..6 do
    every_op_decode = [call for call in every_op_decode if call[1] != "logits" or call[2] == len(ids) - 1]
    assert len(every_op_prefill) == len(every_op_decode)
    for a, b in zip(every_op_prefill, every_op_decode):
        assert a[:3] == b[:3]
        np.testing.assert_array_equal(a[3], b[3])


@FEW
@given(prefix=st.lists(st.integers(0, 63), min_size=1, max_size=6),
       tail_a=st.lists(st.integers(0, 63), min_size=1, max_size=4),
       tail_b=st.lists(st.integers(0, 63), min_size=1, max_size=4))
def test_logits_at_t_do_not_depend_on_later_tokens(prefix, tail_a, tail_b):
    engine = engine_for(GEMMA3)
    engine.reset()
    a = run_collecting(engine, prefix + tail_a)
    engine.reset()
    b = run_collecting(engine, prefix + tail_b)
    for pos in range(len(prefix)):
        np.testing.assert_array_equal(a[pos], b[pos])


def test_forward_rewinds_and_reset_starts_over():
    assert_rewinds_and_resets(engine_for(SEED))


@pytest.mark.parametrize("n_layers", [1, 2])
def test_sliding_window_receptive_field_grows_by_window_per_layer(n_layers):
    """With every layer local (window W), position p sees tokens back to
    p - n_layers*(W-1) and no further."""
    window, p = 3, 9
    config = SEED.with_changes(n_layers=n_layers, sliding_window=window, position_table=False)
    engine = engine_for(config)
    ids = list(range(10, 10 + p + 1))
    oldest = p - n_layers * (window - 1)
    base = run_collecting(engine, ids)[p]
    engine.reset()
    older_changed = [50] * oldest + ids[oldest:]
    np.testing.assert_array_equal(run_collecting(engine, older_changed)[p], base)
    engine.reset()
    oldest_changed = ids[:oldest] + [50] + ids[oldest + 1:]
    assert not np.allclose(run_collecting(engine, oldest_changed)[p], base)


def test_without_window_the_first_token_still_counts():
    engine = engine_for(SEED)
    base = run_collecting(engine, [1, 2, 3, 4, 5, 6])[5]
    engine.reset()
    assert not np.allclose(run_collecting(engine, [9, 2, 3, 4, 5, 6])[5], base)


# ---------------------------------------------------------------------------
# Engine: boundaries and errors


def test_cache_len_is_the_smaller_of_request_and_model():
    assert engine_for(SEED, max_cache_len=5).cache_len == 5
    assert engine_for(SEED, max_cache_len=1000).cache_len == SEED.max_seq_len
    assert engine_for(SEED, max_cache_len=5).cache.key_cache.shape == (2, 5, 2, 8)


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_bad_max_cache_len_is_a_parameter_error(bad):
    with pytest.raises(ParameterError, match="max_cache_len"):
        ReferenceEngine(cached_weights(SEED), bad)


@pytest.mark.parametrize("token", [64, 1000, -1])
def test_token_outside_vocabulary_raises_naming_both_numbers(token):
    engine = engine_for(SEED)
    for call in (lambda: engine.prefill([1, token]), lambda: engine.decode(token),
                 lambda: engine.forward(token, 0)):
        with pytest.raises(TokenIndexError, match=rf"{token}.*\b64\b"):
            call()
    assert engine.pos == 0  # nothing ran: every id is checked first


def test_position_past_the_cache_raises_naming_both_numbers():
    engine = engine_for(SEED, max_cache_len=4)
    with pytest.raises(TokenIndexError, match=r"position 4 .*\b4\)"):
        engine.prefill([1, 2, 3, 4, 5])
    assert engine.pos == 0
    engine.prefill([1, 2, 3, 4])
    with pytest.raises(TokenIndexError, match=r"position 4 .*\b4\)"):
        engine.decode(1)
    with pytest.raises(TokenIndexError, match=r"position 7 .*\b4\)"):
        engine.forward(1, 7)
    with pytest.raises(TokenIndexError, match=r"position -1"):
        engine.forward(1, -1)
    assert isinstance(TokenIndexError("x"), IndexError)


def test_position_that_skips_ahead_raises():
    engine = engine_for(SEED)
    engine.prefill([1, 2])
    with pytest.raises(TokenIndexError, match="position 3"):
        engine.forward(1, 3)


def test_empty_prefill_is_a_value_error():
    with pytest.raises(ValueError, match="empty"):
        engine_for(SEED).prefill([])


@pytest.mark.parametrize("name,scale,where,pos", [
    ("layers.1.down_proj", float("nan"), "layer 1", 0),
    ("layers.0.q_proj", float("nan"), "layer 0", 0),
    ("embed_tokens", float("inf"), "the embedding", 0),
    ("lm_head", float("nan"), "the output head", 2),  # prefill computes logits at its last position only
])
def test_non_finite_weights_raise_numerical_error(name, scale, where, pos):
    with np.errstate(invalid="ignore"):  # dequantizing 0 * inf
        engine = ReferenceEngine(with_tensor(cached_weights(SEED), name, scale=scale), 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN is reported once, as the error, not as warnings
        with pytest.raises(NumericalError, match=rf"position {pos} .*{where}"):
            engine.prefill([1, 2, 3])
    assert engine.pos == pos


def test_numerical_error_names_the_position_where_it_starts():
    """Only position 2's row of the position table overflows f32."""
    weights = cached_weights(SEED)
    q = np.zeros(weights["embed_positions"].shape, dtype=np.int8)
    q[2] = 127
    with np.errstate(over="ignore"):
        engine = ReferenceEngine(with_tensor(weights, "embed_positions", q=q, scale=3e36), 16)  # 127 * 3e36 > f32 max
    engine.prefill([1, 2])
    with pytest.raises(NumericalError, match="position 2 .*the embedding"):
        engine.decode(40)
    assert engine.pos == 2


# ---------------------------------------------------------------------------
# generate


def test_generate_greedy_is_the_argmax_loop():
    engine = engine_for(GEMMA3)
    got = generate(engine, [2, 5, 7], 6)
    engine.reset()
    logits = engine.prefill([2, 5, 7])
    expected = []
    for _ in range(6):
        expected.append(int(np.argmax(logits)))
        logits = engine.decode(expected[-1])
    assert got == expected
    assert engine.pos == 3 + 6  # generate decoded all but its last pick


def test_generate_stops_on_a_stop_id_and_returns_it():
    engine = engine_for(SEED)
    picks = iter([4, 9, 1, 8])
    assert generate(engine, [3], 10, sample=lambda logits: next(picks), stop_ids={1}) == [4, 9, 1]
    assert engine.pos == 3


def test_generate_zero_steps_and_bad_steps():
    engine = engine_for(SEED)
    assert generate(engine, [3], 0) == []
    with pytest.raises(ValueError, match="n_steps"):
        generate(engine, [3], -1)


def test_argmax_tie_goes_to_the_lowest_id():
    assert argmax(np.array([1.0, 3.0, 3.0, -2.0], dtype=np.float32)) == 1
