"""The Cython forward pass (gemma_cy.fast.engine.FastEngine over the
FastModel of each gemma_cy.fast.simd_<isa> module this CPU runs) against the NumPy
reference: layer by layer, token for token, errors for errors.

Tolerances are those of docs/numerics.md#tolerances, |fast - ref| <= atol + rtol*|ref|: default
2e-3 / 1e-3; the embedding (dequantized rows) and the residual adds exact;
token ids and sampled ids exact.

How the intermediates are compared. Each op the fast engine reports is
checked against the reference's layer function applied to the fast engine's
own input of that op (its observed attn_norm for attention, its cached keys
and values, ...): the two then differ by accumulation order only, which is
what the tolerance is for. Whole free-running passes are compared too: every
op on the hand-made configs; on the tiny seed fixture the logits and the
normalized ops (attn_norm, ffn_norm, final_norm) of every position; of 64
greedy steps, the ids. Not every op of the tiny fixture free-running: no f32
engine can meet the per-element tolerance on its residual stream: its weights
are unscaled standard normals (docs/formats.md#the-tiny-test-fixture), the MLP output reaches ~2e4 and the
residual adds cancel it down to ~1, so one f32 rounding of a 2e4 term is
already past atol + rtol*|result|. Measured over 12 positions, the reference
itself misses the tolerance against a float64 evaluation of the same model by
up to 0.096 (mlp), 0.071 (resid_attn), 0.058 (resid_mlp); the fast engine
against float64 by 0.037 (mlp), 0.059 (resid_mlp). Teacher-forced per op,
every op is within tolerance.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from gemma_cy.generation import engines
from gemma_cy.fast import ops
from gemma_cy.model.checks import CheckedEngine
from gemma_cy.model.config import ModelConfig
from gemma_cy.errors import NumericalError, ParameterError, TokenIndexError
from gemma_cy.fast.engine import FastEngine
from gemma_cy.generation.generator import Generation
from gemma_cy.generation.params import GenerationParams
from gemma_cy.model.observe import LAYER_OPS, OBSERVED_OPS, observed_calls, op_shape
from gemma_cy.generation.sampling import Sampler
from gemma_cy_reference.model import ReferenceEngine
from helpers import (AVAILABLE, ISA, assert_rewinds_and_resets, assert_within, cached_weights,
                     check_each_op_against_the_reference, check_every_op_free_running, greedy_both, record,
                     with_tensor)

# Gemma 3's switches on small, SIMD-unfriendly sizes: dim 40 and head_dim 12
# leave tails in every vector loop, q_dim 48 != dim, three layers with a
# 4-position window on layers 0 and 1 (layer 2 global, another RoPE base).
GEMMA3 = ModelConfig(
    n_layers=3, dim=40, n_heads=4, n_kv_heads=2, head_dim=12, mlp_dim=72, vocab_size=100,
    max_seq_len=48, activation="gelu_tanh", rope_pairing="half_split", rope_base=1e6,
    rope_base_local=1e4, norm_gain="one_plus", position_table=False,
    embed_scale=float(np.float32(math.sqrt(40))), qk_norm=True, post_norms=True,
    sliding_window=4, sliding_window_pattern=3, tied_embeddings=True)
# Gemma 2's switches on the same shape: soft-caps small enough to bite, a
# query scale that is not 1/sqrt(head_dim), no q/k-norm, MHA, every layer local.
GEMMA2 = GEMMA3.with_changes(qk_norm=False, attn_softcap=1.5, final_softcap=4.0, query_scale=0.2,
                             n_kv_heads=4, sliding_window_pattern=0)
# Gemma 4's layers on the same shape (docs/model.md#gemma-4): global layers (2, 5) with
# wider heads, one kv head and v from k; wider MLPs at the end; layers 4 and 5 read the caches
# of layers 3 and 2; per-layer inputs of 8, layer scalars, v-norm, query scale 1.
GEMMA4 = GEMMA3.with_changes(n_layers=6, head_dim_global=24, n_kv_heads_global=1,
                             mlp_dims=(72, 72, 72, 72, 144, 144), kv_shared_layers=2, attn_k_eq_v=True,
                             v_norm=True, layer_scalars=True, per_layer_input_dim=8, query_scale=1.0,
                             rope_freqs_global_only=True, final_softcap=5.0)
CONFIGS = {"gemma3": GEMMA3, "gemma2": GEMMA2, "gemma4": GEMMA4}
CONFIG_IDS = [3, 17, 99, 0, 42, 42, 9, 31, 5, 20, 64, 1, 77, 8]  # longer than the window


# ---------------------------------------------------------------------------
# (a, b) The forward pass, op by op (helpers.check_each_op_against_the_reference:
# each op on the fast engine's own inputs, with the bound gemma_cy.model.tolerance
# gives the op, the one table the diff tool judges with)


@ISA
def test_tiny_each_op_matches_the_reference_layer(isa, tiny):
    ids = [2] + list(range(5, 1000, 41))  # 26 positions
    check_each_op_against_the_reference(tiny, ids, isa)


@ISA
@pytest.mark.parametrize("name", CONFIGS)
def test_gemma_switches_each_op_matches_the_reference_layer(isa, name):
    check_each_op_against_the_reference(cached_weights(CONFIGS[name], 2), CONFIG_IDS, isa)


@ISA
@pytest.mark.parametrize("name", CONFIGS)
def test_gemma_switches_free_running_every_op_within_tolerance(isa, name):
    """Both engines run on their own: every op of every position agrees."""
    check_every_op_free_running(cached_weights(CONFIGS[name], 2), CONFIG_IDS, isa)


@ISA
def test_tiny_free_running_logits_within_tolerance(isa, tiny):
    """Every position's logits, each engine on its own (see the module
    docstring for why the tiny fixture's residual stream is not compared so)."""
    ids = [2] + list(range(3, 1000, 37))
    got = record(FastEngine(tiny, 256, isa), ids)
    want = record(ReferenceEngine(tiny, 256), ids)
    n = tiny.config.n_layers
    for pos in range(len(ids)):
        for layer, op in [(n, "final_norm"), (n, "logits")] + [(layer, op) for layer in range(n)
                                                              for op in ("attn_norm", "ffn_norm")]:
            assert_within(got[layer, op, pos], want[layer, op, pos], f"position {pos} layer {layer} {op}")


@ISA
def test_trace_records_the_observed_layer_ops_in_order(isa):
    assert ops.module_for(isa).LAYER_TRACE_OPS == LAYER_OPS


def test_observer_sees_every_op_in_order_with_its_shape():
    c = GEMMA3
    engine = FastEngine(cached_weights(c, 2), 16)
    calls = []
    engine.prefill([1, 2], lambda layer, op, pos, value: calls.append((layer, op, pos, value)))
    engine.decode(3, lambda layer, op, pos, value: calls.append((layer, op, pos, value)))
    order = observed_calls(c.n_layers)
    no_logits = [call for call in order if call[1] != "logits"]  # prefill: logits of the last only
    assert [(layer, op) for layer, op, _, _ in calls] == no_logits + order + order
    assert [pos for _, _, pos, _ in calls] == [0] * len(no_logits) + [1] * len(order) + [2] * len(order)
    assert {op for _, op in order} == set(OBSERVED_OPS)
    for _, op, _, value in calls:
        assert value.dtype == np.float32 and value.shape == op_shape(c, op), op
        assert not value.flags.writeable
    kept = calls[0][3].copy()
    engine.decode(4, lambda *call: None)
    np.testing.assert_array_equal(calls[0][3], kept)  # an observer may keep what it saw


def test_observer_does_not_change_the_result_and_kv_cache_holds_k_and_v():
    weights = cached_weights(GEMMA3, 2)
    ids = CONFIG_IDS[:6]
    plain = FastEngine(weights, 16).prefill(ids)
    engine = FastEngine(weights, 16)
    seen = {}
    observed = engine.prefill(ids, lambda layer, op, pos, value: seen.__setitem__((layer, op, pos), value))
    np.testing.assert_array_equal(observed, plain)
    np.testing.assert_array_equal(seen[GEMMA3.n_layers, "logits", 5], plain)
    for layer in range(GEMMA3.n_layers):
        row = engine.model.cache_row(layer, 4)
        np.testing.assert_array_equal(engine.model.key_cache[layer][row], seen[layer, "k", 4])
        np.testing.assert_array_equal(engine.model.value_cache[layer][row], seen[layer, "v", 4])


def test_both_engines_name_the_kv_cache_alike():
    """One pair of names for the KV cache in both engines (llama2.c's
    key_cache / value_cache): the fast engine's FastModel and the
    reference's KVCache hold the same rows under them."""
    weights = cached_weights(GEMMA3, 2)
    ids = CONFIG_IDS[:6]
    fast, reference = FastEngine(weights, 16), ReferenceEngine(weights, 16)
    fast.prefill(ids)
    reference.prefill(ids)
    for name in ("key_cache", "value_cache"):
        for layer in range(GEMMA3.n_layers):  # no ring has wrapped: position p is row p
            assert_within(getattr(fast.model, name)[layer][:len(ids)], getattr(reference.cache, name)[layer, :len(ids)],
                          name)


# ---------------------------------------------------------------------------
# (c, d) Generation: greedy and sampled, token for token

PROMPTS = ["Once upon a time", "The cat sat on the mat", "1 2 3 4 5", "hello world, héllo wörld", ""]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_identical(prompt, tiny, tiny_model):
    ids = tiny_model.prompt_ids(prompt)
    for isa in AVAILABLE:
        greedy_both(tiny, ids, 64, isa)


def test_greedy_64_tokens_identical_chat_format(tiny, tiny_model):
    ids = tiny_model.chat_ids("Tell me a story about a robot.")
    assert len(ids) > 8
    for isa in AVAILABLE:
        greedy_both(tiny, ids, 64, isa)


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_sampled_decode_identical(seed, tiny, tiny_model):
    """Temperature + Min-P with a fixed seed: the same ids on both engines."""
    ids = tiny_model.prompt_ids("Once upon a time")
    runs = []
    for engine in (ReferenceEngine(tiny, 256), FastEngine(tiny, 256)):
        sampler = Sampler(temperature=0.9, min_p=0.05, seed=seed)
        logits = engine.prefill(ids)
        out = []
        for _ in range(48):
            out.append(sampler.sample(logits))
            logits = engine.decode(out[-1])
        runs.append(out)
    assert runs[0] == runs[1]


def test_generation_loop_runs_on_the_fast_engine(tiny, tiny_model):
    """The shared generate loop over both engines: same text, same stop."""
    results = []
    for engine in (ReferenceEngine(tiny, 256), FastEngine(tiny, 256)):
        gen = Generation(engine, tiny_model.tokenizer, tiny_model.prompt_ids("The cat"),
                         GenerationParams(temperature=0.8, min_p=0.1, seed=3, max_tokens=20))
        text = "".join(step.text for step in gen)
        results.append((gen.generated_ids, text, gen.stop_reason))
    assert results[0] == results[1]


# ---------------------------------------------------------------------------
# (f) Prefill, decode, forward, reset


@ISA
def test_prefill_equals_decoding_one_by_one(isa, tiny):
    """The same step runs both ways: bit for bit the same logits and cache."""
    ids = [2, 40, 7, 900, 13, 13, 600, 1]
    whole = FastEngine(tiny, 32, isa)
    last = whole.prefill(ids)
    stepwise = FastEngine(tiny, 32, isa)
    stepwise.prefill(ids[:3])
    for token in ids[3:]:
        out = stepwise.decode(token)
    np.testing.assert_array_equal(out, last)
    assert whole.pos == stepwise.pos == len(ids)
    for a, b in zip(whole.model.key_cache + whole.model.value_cache,
                    stepwise.model.key_cache + stepwise.model.value_cache):
        np.testing.assert_array_equal(a[:len(ids)], b[:len(ids)])


def test_forward_rewinds_and_reset_starts_over():
    assert_rewinds_and_resets(FastEngine(cached_weights(GEMMA3, 2), 16))


def test_logits_are_the_callers_copy():
    engine = FastEngine(cached_weights(GEMMA3, 2), 16)
    first = engine.prefill([1, 2, 3])
    kept = first.copy()
    engine.decode(9)
    np.testing.assert_array_equal(first, kept)
    first[:] = 0  # writable, and not the engine's buffer
    assert np.any(engine.model.last_logits != 0)


# ---------------------------------------------------------------------------
# (e) Bad inputs: the same errors, with the same messages, as the reference


def error_of(call) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def bad_calls(engine):
    return {
        "token = vocab": lambda: engine.decode(GEMMA3.vocab_size),
        "token -1": lambda: engine.prefill([1, -1]),
        "token 10**6 in forward": lambda: engine.forward(10**6, 0),
        "token not an int": lambda: engine.decode(2.0),
        "pos = cache_len": lambda: engine.forward(1, 4),
        "pos -1": lambda: engine.forward(1, -1),
        "pos skips ahead": lambda: engine.forward(1, 3),
        "prefill past the cache": lambda: engine.prefill([1, 2, 3, 4, 5]),
        "empty prefill": lambda: engine.prefill([]),
    }


def test_bad_indices_raise_what_the_reference_raises():
    weights = cached_weights(GEMMA3, 2)
    fast, ref = FastEngine(weights, 4), ReferenceEngine(weights, 4)
    fast.prefill([1, 2])
    ref.prefill([1, 2])
    fast_calls, ref_calls = bad_calls(fast), bad_calls(ref)
    for name in fast_calls:
        assert error_of(fast_calls[name]) == error_of(ref_calls[name]), name
    assert fast.pos == ref.pos == 2  # nothing ran
    kinds = {name: error_of(call)[0] for name, call in fast_calls.items()}
    assert kinds["token = vocab"] is TokenIndexError and kinds["pos = cache_len"] is TokenIndexError
    assert kinds["empty prefill"] is ValueError
    fast.prefill([3, 4])  # fills the cache: the next decode is past it
    with pytest.raises(TokenIndexError, match=r"position 4 outside the KV cache \[0, 4\)"):
        fast.decode(1)


def test_both_engines_share_one_checked_boundary():
    """reset, forward, prefill and decode (the checks before any computation)
    are written once, in gemma_cy.model.checks.CheckedEngine; each engine
    brings only its own _run."""
    for name in ("reset", "forward", "prefill", "decode"):
        assert getattr(FastEngine, name) is getattr(ReferenceEngine, name) is getattr(CheckedEngine, name), name
    assert FastEngine._run is not CheckedEngine._run and ReferenceEngine._run is not CheckedEngine._run


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_bad_max_cache_len_is_a_parameter_error(bad):
    with pytest.raises(ParameterError, match="max_cache_len"):
        FastEngine(cached_weights(GEMMA3, 2), bad)


def test_cache_len_and_isa_choice():
    weights = cached_weights(GEMMA3, 2)
    assert FastEngine(weights, 5).cache_len == 5
    assert FastEngine(weights, 10**6).cache_len == GEMMA3.max_seq_len
    assert [k.shape for k in FastEngine(weights, 5).model.key_cache] == [(5, 2, 12)] * 3
    assert FastEngine(weights, 5).isa == ops.ISA
    with pytest.raises(ParameterError, match="sse9"):
        FastEngine(weights, 5, isa="sse9")


@ISA
def test_the_kernel_module_refuses_bad_indices_itself(isa):
    """FastModel.run checks too (IndexError), for callers other than FastEngine."""
    model = FastEngine(cached_weights(GEMMA3, 2), 8, isa).model
    for ids, pos in [([100], 0), ([-1], 0), ([1], 8), ([1, 2], 7), ([1], -1)]:
        with pytest.raises(IndexError):
            model.run(np.array(ids, np.int32), pos)
    with pytest.raises(TypeError):
        model.run(np.array([1], np.int64), 0)
    with pytest.raises(ValueError):
        model.run(np.array([1, 2], np.int32), 0, trace=True)
    with pytest.raises(ValueError):
        model.run(np.array([], np.int32), 0)


def cdef_methods(source: str) -> dict[str, tuple[str, str]]:
    """name -> (declaration, body) of every cdef method of a .pxi source."""
    methods = {}
    for m in re.finditer(r"^    cdef (?!class)[^=\n]*?(\w+)\(self\b(.*?)\)([^()\n]*):$", source, re.M | re.S):
        end = re.search(r"^ {0,4}\S", source[m.end():], re.M)
        methods[m.group(1)] = (m.group(0), source[m.end():m.end() + end.start() if end else None])
    return methods


def test_methods_that_index_memoryviews_propagate_bounds_errors():
    """A cdef method of FastModel that indexes a memoryview at a computed
    position, or calls one that does, is declared ``except -1``, not
    ``noexcept``: in the debug build (GEMMA_CY_DEBUG=1) a bounds error must
    raise out of the step, not be printed and ignored (forward.pxi's header)."""
    fast = Path(__file__).resolve().parent.parent / "gemma_cy" / "fast"
    source = "".join(p.read_text() for p in sorted(fast.glob("forward*.pxi")))
    views = set(re.findall(r"^    cdef (?:const )?\w+\[[^\]]*\] (\w+)", source, re.M))
    assert {"att", "trace_buf"} <= views
    methods = cdef_methods(source)
    assert {"attention", "attend_tile", "observe"} <= set(methods)
    raising = {name for name, (_, body) in methods.items()
               if any(re.search(rf"\bself\.{v}\[", body) for v in views)}
    grown = True
    while grown:  # and every method that calls one of them
        callers = {name for name, (_, body) in methods.items()
                   if any(re.search(rf"\bself\.{r}\(", body) for r in raising)}
        grown = not callers <= raising
        raising |= callers
    bad = [name for name in sorted(raising)
           if "except -1" not in methods[name][0] or "noexcept" in methods[name][0]]
    assert not bad, f"declared noexcept, but they index memoryviews (or call a method that does): {bad}"


@ISA
@pytest.mark.parametrize("name,scale,where", [
    ("layers.1.down_proj", float("nan"), "layer 1"),
    ("layers.0.q_proj", float("nan"), "layer 0"),
    ("embed_tokens", float("inf"), "the embedding"),
])
def test_non_finite_weights_raise_numerical_error(isa, tiny, name, scale, where):
    with np.errstate(invalid="ignore"):
        engine = FastEngine(with_tensor(tiny, name, scale=scale), 16, isa)
    with pytest.raises(NumericalError, match=rf"position 0 .*{where}"):
        engine.prefill([1, 2, 3])
    assert engine.pos == 0
    with pytest.raises(NumericalError, match=rf"position 0 .*{where}"):
        engine.decode(1, lambda *call: None)  # with an observer: the same


def test_non_finite_output_head_is_found_where_logits_are_computed(tiny):
    """A NaN lm_head leaves the residual stream finite: prefill computes logits
    at its last position only, so that is the position named (the reference
    names position 0, where it computed logits first)."""
    engine = FastEngine(with_tensor(tiny, "lm_head", scale=float("nan")), 16)
    with pytest.raises(NumericalError, match="position 2 .*the output head"):
        engine.prefill([1, 2, 3])
    assert engine.pos == 2
    engine.reset()
    with pytest.raises(NumericalError, match="position 0 .*the output head"):
        engine.decode(1)


def test_numerical_error_names_the_position_where_it_starts(tiny):
    """Only position 2's row of the position table overflows f32."""
    q = np.zeros(tiny["embed_positions"].shape, dtype=np.int8)
    q[2] = 127
    engine = FastEngine(with_tensor(tiny, "embed_positions", q=q, scale=3e36), 16)  # 127 * 3e36 > f32 max
    engine.prefill([1, 2])
    with pytest.raises(NumericalError, match="position 2 .*the embedding"):
        engine.decode(40)
    assert engine.pos == 2
    engine.reset()
    seen = []
    with pytest.raises(NumericalError, match="position 2 .*the embedding"):
        engine.prefill([1, 2, 3, 4], lambda layer, op, pos, value: seen.append(pos))
    assert engine.pos == 2 and max(seen) == 2  # the bad position was observed, the next did not run


# ---------------------------------------------------------------------------
# Engine selection


def test_fast_is_the_default_engine(tiny):
    assert engines.DEFAULT_ENGINE == "fast"
    assert isinstance(engines.make_engine("fast", tiny, 64), FastEngine)
    assert isinstance(engines.make_engine("reference", tiny, 64), ReferenceEngine)


def test_long_prefill_in_chunks_equals_decoding_one_by_one(tiny):
    """A prefill longer than PREFILL_CHUNK runs as several GIL-free calls;
    it must equal running the positions one at a time."""
    from gemma_cy.fast.engine import PREFILL_CHUNK
    ids = [2] + [(7 * i) % 1000 + 10 for i in range(2 * PREFILL_CHUNK + 5)]
    whole = FastEngine(tiny, 256)
    last = whole.prefill(ids)
    stepwise = FastEngine(tiny, 256)
    for token in ids:
        out = stepwise.decode(token)
    np.testing.assert_array_equal(last, out)
    for a, b in zip(whole.model.key_cache + whole.model.value_cache,
                    stepwise.model.key_cache + stepwise.model.value_cache):
        np.testing.assert_array_equal(a, b)
    assert whole.pos == stepwise.pos == len(ids)


# ---------------------------------------------------------------------------
# The sliding-window layers' cache is a ring (docs/architecture.md#kv-cache)

RING = GEMMA3.with_changes(max_seq_len=1024)  # window 4 on layers 0 and 1: rings of 4 + RING_SLACK rows
RING_IDS = [(11 * i + 3) % 100 for i in range(700)]
SLACK = 256  # forward_build.pxi's RING_SLACK


def test_sliding_window_layers_keep_a_ring_of_window_plus_slack_rows():
    model = FastEngine(cached_weights(RING, 2), 1024).model
    assert [len(k) for k in model.key_cache] == [4 + SLACK, 4 + SLACK, 1024]
    assert [len(k) for k in FastEngine(cached_weights(RING, 2), 200).model.key_cache] == [200, 200, 200]


@pytest.mark.parametrize("isa", AVAILABLE)
def test_a_wrapped_ring_gives_the_reference_logits_and_the_same_bits_every_way(isa):
    """700 positions: each ring wraps twice. Against the reference (a full
    cache) within tolerance, and bit for bit the same whether the positions
    run as one prefill, one by one, or in uneven pieces."""
    weights = cached_weights(RING, 2)
    whole = FastEngine(weights, 1024, isa)
    last = whole.prefill(RING_IDS)
    reference = ReferenceEngine(weights, 1024)
    assert_within(last, reference.prefill(RING_IDS), "logits")
    stepwise = FastEngine(weights, 1024, isa)
    for token in RING_IDS:
        out = stepwise.decode(token)
    np.testing.assert_array_equal(out, last)
    pieces = FastEngine(weights, 1024, isa)
    for lo, hi in ((0, 3), (3, 70), (70, 71), (71, 600), (600, 699), (699, 700)):
        out = pieces.prefill(RING_IDS[lo:hi])
    np.testing.assert_array_equal(out, last)
    for layer in range(RING.n_layers):
        for pos in (699, 600, 440):  # held by every layer (a ring holds the last 260)
            rows = [e.model.cache_row(layer, pos) for e in (whole, stepwise)]
            np.testing.assert_array_equal(whole.model.key_cache[layer][rows[0]],
                                          stepwise.model.key_cache[layer][rows[1]])
        assert whole.model.cache_row(layer, 439) == (None if layer < 2 else 439)


def test_rewinding_within_the_ring_continues_and_further_starts_over():
    weights = cached_weights(RING, 2)
    want = FastEngine(weights, 1024).prefill(RING_IDS[:500])
    engine = FastEngine(weights, 1024)
    engine.prefill(RING_IDS)
    assert engine.rewind(450) == 450 and engine.pos == 450  # 446..449 are still in the rings
    assert engine.rewind(443) == 443  # the furthest back: it reads 440..442, the oldest rows held
    np.testing.assert_array_equal(engine.prefill(RING_IDS[443:500]), want)
    engine.prefill(RING_IDS[500:])
    assert engine.rewind(442) == 0 and engine.pos == 0  # it would read 439, overwritten: start over
    np.testing.assert_array_equal(engine.prefill(RING_IDS[:500]), want)


def test_running_where_the_ring_no_longer_reaches_is_refused():
    engine = FastEngine(cached_weights(RING, 2), 1024)
    engine.prefill(RING_IDS)
    with pytest.raises(TokenIndexError, match="position 100: the sliding-window layers keep their last 260"):
        engine.forward(5, 100)
    assert engine.pos == 700
    with pytest.raises(IndexError, match="position 100 cannot be run again"):
        engine.model.run(np.array([5], np.int32), 100)
    engine.forward(5, 699)  # still held: runs
    engine.forward(5, 0)  # position 0 needs nothing before it
    assert engine.pos == 1
    engine.forward(6, 1)  # and the run from 0 started the cache over
    assert engine.model.high == 2


def test_a_chat_reusing_its_prefix_starts_over_when_the_ring_moved_on():
    from gemma_cy.generation.slot_cache import SlotCache
    engine = FastEngine(cached_weights(RING, 2), 1024)
    cache = SlotCache(engine)
    engine.prefill(RING_IDS)
    cache.ids = list(RING_IDS)
    assert cache.reuse_prefix(RING_IDS[:650] + [1, 2]) == 650  # 646..649 still held
    assert cache.reuse_prefix(RING_IDS[:20] + [1]) == 0  # 16..19 were overwritten
    assert cache.ids == [] and engine.pos == 0
