"""A KV cache outlives its generation (docs/generation.md#prefix-reuse): a
prompt that starts with what a slot's cache holds (an earlier prompt and
its output, a chat's earlier turns) runs only the rest, and the generation
is the one a fresh model gives, logits bit for bit; a batch sequence joins
the slot whose cache shares most of its prompt; a generation whose slot
another took over stops with an error naming the slot."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.api import Model
from gemma_cy.errors import GenerationStateError
from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from helpers import cached_weights, q8_0_weights
from test_batch_engine import ODD, Q8

CACHE = 128
# test_batch_engine's models with room for the fixture tokenizer's pieces:
# sliding-window layers of 4 and 6 positions (rings) in both
SMALL, SMALL_Q8 = ODD.with_changes(vocab_size=300), Q8.with_changes(vocab_size=320)
# (weights, engine, activations)
SETUPS = {
    "fast f32": (lambda: cached_weights(SMALL, 5), "fast", "f32"),
    "fast q8": (lambda: q8_0_weights(SMALL_Q8, 6), "fast", "q8"),
    "reference": (lambda: cached_weights(SMALL, 5), "reference", "f32"),
}


def model_of(setup: str, max_sequences: int = 1, cache: int = CACHE) -> Model:
    make, engine, activations = SETUPS[setup]
    w = make()
    return Model(w, GreedyTokenizer(fixture_vocab(w.config.vocab_size)), engine, cache, activations, max_sequences)


def recording(seen: list):
    """A logits processor that keeps a copy of every logits vector it is shown."""
    def record(ids, x):
        seen.append(np.array(x, copy=True))
    return record


def run(model: Model, prompt: list[int], n: int = 6) -> tuple[list[int], list[np.ndarray], object]:
    seen: list[np.ndarray] = []
    out = model.complete(prompt, temperature=0, max_tokens=n, terminate_on_eos=False,
                         logits_processor=recording(seen))
    return out.ids, seen, out


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))


def count_rows(model: Model) -> list[int]:
    """Spy: the ids of every prefill the model's engine runs."""
    rows, prefill = [], model.engine.prefill

    def counting(ids, observer=None):
        rows.append(len(ids))
        return prefill(ids, observer)
    model.engine.prefill = counting
    return rows


PROMPT = [(7 * i + 3) % 150 + 1 for i in range(40)]


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_second_complete_that_extends_the_first_runs_only_the_new_tokens(setup):
    model = model_of(setup)
    first, _, _ = run(model, PROMPT)
    longer = PROMPT + first + [5, 9, 2]
    rows = count_rows(model)
    ids, logits, out = run(model, longer)
    cached = len(PROMPT) + len(first) - 1  # the last generated token never ran
    assert (out.timing.reused_tokens, out.timing.prefill_tokens) == (cached, len(longer) - cached)
    assert rows == [len(longer) - cached] and out.prompt_ids == longer
    want_ids, want_logits, _ = run(model_of(setup), longer)
    assert ids == want_ids
    if setup != "reference":  # the fast engine's contract is bits (docs/numerics.md#batch-invariance)
        assert same_bits(logits, want_logits)


@pytest.mark.parametrize("setup", ["fast f32", "fast q8"])
@pytest.mark.parametrize("shared", [1, 3, 20, 39])
def test_a_prompt_that_parts_from_the_cache_keeps_what_it_shares(setup, shared):
    """Rewinding into the rings: kept when the sliding-window layers still
    hold what the position needs, else the cache starts over; bits equal either way."""
    model = model_of(setup)
    run(model, PROMPT, n=30)
    other = PROMPT[:shared] + [201, 202, 203, 204, 205]  # ids PROMPT does not hold
    ids, logits, out = run(model, other)
    assert out.timing.reused_tokens in (0, shared)
    assert out.timing.prefill_tokens == len(other) - out.timing.reused_tokens
    want_ids, want_logits, _ = run(model_of(setup), other)
    assert ids == want_ids and same_bits(logits, want_logits)


def test_the_rings_decide_how_far_back_a_cache_can_be_kept():
    """A 4-position window's ring holds its window plus 256 rows of slack
    (docs/architecture.md): after 330 positions it no longer holds
    positions 16 .. 19, which position 20 attends to, so that cache starts
    over; position 300's window it still holds."""
    long = [(5 * i + 1) % 150 + 1 for i in range(330)]
    model = model_of("fast f32", cache=400)
    run(model, long, n=1)
    far = run(model, long[:20] + [1])[2]
    assert far.timing.reused_tokens == 0 and far.timing.prefill_tokens == 21
    model = model_of("fast f32", cache=400)
    run(model, long, n=1)
    near = run(model, long[:300] + [1])[2]
    assert near.timing.reused_tokens == 300


def test_an_observer_sees_every_position():
    model = model_of("fast f32")
    run(model, PROMPT)
    seen = []
    out = model.complete(PROMPT + [3], temperature=0, max_tokens=2,
                         observer=lambda *a, **k: seen.append(1))
    assert out.timing.reused_tokens == 0 and out.timing.prefill_tokens == len(PROMPT) + 1


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_batch_sequence_joins_the_slot_that_holds_its_prefix(setup):
    model = model_of(setup, max_sequences=3)
    a, b = PROMPT, [9] * 5 + PROMPT[5:30]
    first = model.complete([a, b], temperature=0, max_tokens=4, terminate_on_eos=False)
    slot_of = {tuple(s.ids[:5]): s.slot for s in model.slot_caches if s.ids}
    later = [b + first[1].ids + [4], a + first[0].ids + [7, 8], [1, 2, 3]]
    rows = []
    step = model.engine.batch.step

    def counting(segments):
        rows.extend((slot, len(ids)) for slot, ids, _ in segments if len(ids) > 1)
        return step(segments)
    model.engine.batch.step = counting
    got = model.complete(later, temperature=0, max_tokens=5, terminate_on_eos=False)
    for prompt, c, earlier in zip(later, got, [b, a, None]):
        want = model_of(setup).complete(prompt, temperature=0, max_tokens=5, terminate_on_eos=False)
        assert c.ids == want.ids and c.prompt_ids == prompt
        if earlier is not None:
            assert c.timing.reused_tokens == len(earlier) + 3  # prompt and 4 tokens, the last not run
    slot_a, slot_b = slot_of[tuple(a[:5])], slot_of[tuple(b[:5])]
    assert sorted(rows) == sorted([(slot_b, 2), (slot_a, 3), (3 - slot_a - slot_b, 3)])
    assert model.slot_caches[slot_b].ids[:len(later[0])] == later[0]


def test_a_batch_whose_slot_was_taken_over_names_the_slot():
    model = model_of("fast f32", max_sequences=2)
    first = model.generate_many([PROMPT, PROMPT[:10]], temperature=0, max_tokens=8)
    next(first)
    model.complete([[5, 6, 7], [8, 9]], temperature=0, max_tokens=2)
    with pytest.raises(GenerationStateError, match=r"\(slot [01]\)"):
        next(first)


def test_a_batch_leaves_a_single_generation_on_another_slot_alone():
    model = model_of("fast f32", max_sequences=2)
    single = model.generate(PROMPT, temperature=0, max_tokens=6, terminate_on_eos=False)
    head = [next(single).token_id]
    model.complete([[5, 6, 7]], temperature=0, max_tokens=3)  # one sequence: the free slot 1
    head += [s.token_id for s in single]
    assert head == run(model_of("fast f32"), PROMPT)[0]
