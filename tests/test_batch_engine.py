"""Batch invariance of the batch engines (docs/numerics.md#batch-invariance):
several sequences advanced together, joining and leaving at any step, their
prompts cut into any chunks, in any order within a step, each get the
logits, KV cache and greedy tokens of the same sequence run alone on a
fresh engine, bit for bit; the fast engine in f32 and q8, the reference
(by construction) in f32."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gemma_cy.errors import ParameterError, TokenIndexError
from gemma_cy.fast.batch import FastBatchEngine
from gemma_cy.fast.engine import FastEngine
from gemma_cy_reference.model import ReferenceEngine
from helpers import AVAILABLE, cached_weights, q8_0_weights
from test_forward import GEMMA3

# Gemma 3's switches on SIMD-unfriendly sizes (tails in every vector loop),
# a 4-position window on two of three layers (test_forward's); int8 weights, f32 mode.
ODD = GEMMA3.with_changes(max_seq_len=400)
# Widths that are multiples of 32 (the q8 mode's blocks); Q8_0 weights as a GGUF holds them.
Q8 = ODD.with_changes(dim=64, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=96, vocab_size=160,
                      embed_scale=8.0, sliding_window=6)
CACHE = 128
MODES = [("odd", "f32"), ("q8_0", "f32"), ("q8_0", "q8")]


def weights_of(kind: str):
    return cached_weights(ODD, 5) if kind == "odd" else _Q8_WEIGHTS


_Q8_WEIGHTS = q8_0_weights(Q8, 6)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def greedy_alone(engine, prompt: list[int], n_dec: int) -> tuple[list[int], list[np.ndarray]]:
    """The sequence on its own: prefill, then greedy decode; tokens and every logits vector."""
    logits = [engine.prefill(prompt)]
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < n_dec:
        logits.append(engine.decode(tokens[-1]))
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, logits


def valid_rows(model, layer: int, n_pos: int, slot: int | None) -> list[tuple[int, int]]:
    """(position, cache row) of every position 0 .. n_pos-1 the layer's cache still holds."""
    out = []
    for p in range(n_pos):
        row = model.cache_row(layer, p) if slot is None else model.cache_row(layer, p, slot)
        if row is not None:
            out.append((p, row))
    return out


@st.composite
def scenarios(draw, vocab: int):
    """Sequences (prompt, n_dec, join step, prompt chunk sizes), slots, and a seed for the order in each step."""
    b = draw(st.sampled_from([1, 2, 3, 5, 8, 16]))
    seqs = []
    for _ in range(b):
        prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=70))
        chunks = draw(st.lists(st.integers(1, 70), min_size=1, max_size=4))
        seqs.append((prompt, draw(st.integers(1, 6)), draw(st.integers(0, 6)), chunks))
    return seqs, draw(st.integers(1, b)), draw(st.integers(0, 2**32 - 1))


def run_batched(engine, seqs, seed: int):
    """Continuous batching, written out: a sequence joins at its step (or
    when a slot frees), prefills its prompt in its own chunk sizes while the
    others decode, decodes greedily, leaves when done. Segments run in a
    random order each step. Returns per sequence (tokens, logits, KV rows)."""
    rng = np.random.default_rng(seed)
    waiting = sorted(range(len(seqs)), key=lambda i: seqs[i][2])
    live: dict[int, dict] = {}  # slot -> state
    free = list(range(engine.n_slots))
    results = {}
    step = 0
    while waiting or live:
        while waiting and free and seqs[waiting[0]][2] <= step:
            i = waiting.pop(0)
            slot = free.pop(0)
            engine.reset(slot)
            live[slot] = {"seq": i, "fed": 0, "chunk": 0, "tokens": [], "logits": []}
        segments = []
        for slot, s in live.items():
            prompt, n_dec, _, chunks = seqs[s["seq"]]
            if s["fed"] < len(prompt):
                size = chunks[s["chunk"] % len(chunks)]
                part = prompt[s["fed"]:s["fed"] + size]
                s["fed"] += len(part)
                s["chunk"] += 1
                segments.append((slot, part, s["fed"] == len(prompt)))
            else:
                segments.append((slot, [s["tokens"][-1]], True))
        order = rng.permutation(len(segments)).tolist()
        segments = [segments[k] for k in order]
        if segments:
            outs = iter(engine.step(segments))
            for slot, _, want in segments:
                if want:
                    s = live[slot]
                    s["logits"].append(next(outs))
                    s["tokens"].append(int(np.argmax(s["logits"][-1])))
        for slot in [slot for slot, s in live.items() if len(s["tokens"]) == seqs[s["seq"]][1]]:
            s = live.pop(slot)
            results[s["seq"]] = (s["tokens"], s["logits"], kv_snapshot(engine, slot))
            free.append(slot)
        step += 1
    return [results[i] for i in range(len(seqs))]


def kv_snapshot(engine, slot: int):
    if not isinstance(engine, FastBatchEngine):
        return None
    keys, values = engine.model.slot_cache(slot)
    n_pos = engine.pos[slot]
    return [(bits(keys[layer][[r for _, r in rows]]), bits(values[layer][[r for _, r in rows]]), rows)
            for layer in range(engine.config.n_layers)
            for rows in [valid_rows(engine.model, layer, n_pos, slot)]]


def fast_isa_params():
    return [pytest.param(isa, id=isa) for isa in AVAILABLE]


@pytest.mark.parametrize("isa", fast_isa_params())
@pytest.mark.parametrize("kind, mode", MODES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_batch_gives_each_sequence_its_bits_alone(isa, kind, mode, data):
    weights = weights_of(kind)
    seqs, n_slots, seed = data.draw(scenarios(weights.config.vocab_size))
    engine = FastBatchEngine(weights, CACHE, n_slots, isa=isa, activations=mode)
    got = run_batched(engine, seqs, seed)
    for i, (prompt, n_dec, _, _) in enumerate(seqs):
        alone = FastEngine(weights, CACHE, isa=isa, activations=mode)
        tokens, logits = greedy_alone(alone, prompt, n_dec)
        b_tokens, b_logits, b_kv = got[i]
        assert b_tokens == tokens, f"sequence {i}"
        for step, (a, b) in enumerate(zip(logits, b_logits)):
            assert np.array_equal(bits(a), bits(b)), f"sequence {i}, step {step}: logits differ"
        n_pos = len(prompt) + n_dec - 1
        for layer, (k, v, rows) in enumerate(b_kv):
            want_rows = valid_rows(alone.model, layer, n_pos, None)
            assert [p for p, _ in rows] == [p for p, _ in want_rows]
            idx = [r for _, r in want_rows]
            assert np.array_equal(k, bits(alone.model.key_cache[layer][idx])), f"sequence {i}, layer {layer} keys"
            assert np.array_equal(v, bits(alone.model.value_cache[layer][idx])), f"sequence {i}, layer {layer} values"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reference_batch_gives_each_sequence_its_tokens_alone(data):
    weights = cached_weights(ODD, 5)
    seqs, n_slots, seed = data.draw(scenarios(ODD.vocab_size))
    seqs = [(prompt[:12], n_dec, join, chunks) for prompt, n_dec, join, chunks in seqs[:5]]  # NumPy is slow
    engine = ReferenceEngine(weights, CACHE, n_slots=min(n_slots, len(seqs))).batch
    got = run_batched(engine, seqs, seed)
    for i, (prompt, n_dec, _, _) in enumerate(seqs):
        tokens, logits = greedy_alone(ReferenceEngine(weights, CACHE), prompt, n_dec)
        assert got[i][0] == tokens
        assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(logits, got[i][1]))


def test_a_long_prompt_beside_decodes_is_packed_in_passes_of_block_rows():
    """A 300-token prompt (several passes of the block) beside two decoding
    sequences: every segment is split across passes, and still each gets its bits."""
    weights = cached_weights(ODD, 5)
    engine = FastBatchEngine(weights, 400, 3)
    prompts = [list(range(1, 90)), [(7 * i) % 100 for i in range(300)], [5, 6]]
    first = engine.step([(s, p, True) for s, p in enumerate(prompts)])
    second = engine.step([(s, [int(np.argmax(first[s]))], True) for s in range(3)])
    for s, p in enumerate(prompts):
        alone = FastEngine(weights, 400)
        want = alone.prefill(p)
        assert np.array_equal(bits(want), bits(first[s]))
        assert np.array_equal(bits(alone.decode(int(np.argmax(want)))), bits(second[s]))


# Each engine's batch of n slots over weights with a cache of c positions.
BATCH_ENGINES = {"fast": lambda w, c, n: FastBatchEngine(w, c, n),
                 "reference": lambda w, c, n: ReferenceEngine(w, c, n_slots=n).batch}


@pytest.mark.parametrize("engine", sorted(BATCH_ENGINES))
def test_bad_steps_are_refused_before_anything_runs(engine):
    weights = cached_weights(ODD, 5)
    engine = BATCH_ENGINES[engine](weights, 16, 2)
    engine.step([(0, [1, 2, 3], True)])
    with pytest.raises(TokenIndexError, match="slot 2 outside"):
        engine.step([(2, [1], True)])
    with pytest.raises(ParameterError, match="twice"):
        engine.step([(0, [1], True), (0, [2], True)])
    with pytest.raises(TokenIndexError, match="outside the vocabulary"):
        engine.step([(1, [1], True), (0, [100], True)])
    with pytest.raises(TokenIndexError, match="outside the KV cache"):
        engine.step([(1, list(range(17)), True)])
    with pytest.raises(ValueError, match="empty"):
        engine.step([(1, [], True)])
    with pytest.raises(ParameterError, match="no segments"):
        engine.step([])
    assert list(engine.pos) == [3, 0]  # nothing ran
    with pytest.raises(TokenIndexError, match="rewind"):
        engine.rewind(1, 1)


@pytest.mark.parametrize("engine", sorted(BATCH_ENGINES))
def test_a_copied_slot_continues_as_the_original(engine):
    """copy(src, dst): dst holds src's positions bit for bit (a ring that
    has wrapped included) and continues exactly as src would."""
    weights = cached_weights(ODD, 5)
    engine = BATCH_ENGINES[engine](weights, 128, 3)
    prompt = [(3 * i + 1) % 100 for i in range(40)]  # past the 4-position window: the rings wrapped
    engine.step([(0, prompt, True), (2, [1, 2, 3, 4, 5, 6, 7, 8], False)])
    engine.copy(0, 2)
    assert list(engine.pos) == [40, 0, 40]
    a, b = engine.step([(0, [9], True), (2, [9], True)])
    assert np.array_equal(bits(a), bits(b))
    with pytest.raises(ParameterError, match="no positions"):
        engine.copy(1, 0)
    with pytest.raises(ParameterError, match="onto itself"):
        engine.copy(0, 0)
