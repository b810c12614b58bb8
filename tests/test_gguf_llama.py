"""GGUF architecture "llama" (SmolLM2's): metadata -> ModelConfig, and both
engines on a small hand-made Llama written to a GGUF file and mapped again.

The switches are Llama's (formats/gguf_model.py ``_llama_switches``): SiLU,
interleaved RoPE (llama.cpp's q/k row order), plain gains, no embedding
scale, no q/k-norm, no post-norms, no window, 1/sqrt(head_dim) scores, tied
embeddings when ``output.weight`` is absent. Real SmolLM2 against HF
transformers: tests/test_smollm2_oracle.py.
"""
from __future__ import annotations

import math

import pytest

from gemma_cy.model.config import ModelConfig
from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gguf_writer import write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from helpers import ISA, gguf_tensors, greedy_both, q8_0_weights

LLAMA = ModelConfig(
    n_layers=2, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=96, vocab_size=160, max_seq_len=128,
    activation="silu", rope_pairing="interleaved", rope_base=100000.0, norm_eps=1e-5, norm_gain="plain",
    position_table=False, embed_scale=1.0, query_scale=1 / math.sqrt(16), tied_embeddings=True,
    bos_id=1, eos_ids=(2,))
IDS = [1, 17, 99, 0, 42, 42, 9, 31, 5, 20, 64, 2, 77, 8, 150]


def llama_fields(c: ModelConfig = LLAMA, **extra) -> dict:
    fields = {
        "general.architecture": "llama", "llama.context_length": c.max_seq_len,
        "llama.embedding_length": c.dim, "llama.block_count": c.n_layers,
        "llama.feed_forward_length": c.mlp_dim, "llama.attention.head_count": c.n_heads,
        "llama.attention.head_count_kv": c.n_kv_heads, "llama.rope.dimension_count": c.head_dim,
        "llama.rope.freq_base": c.rope_base, "llama.attention.layer_norm_rms_epsilon": c.norm_eps,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, **extra}
    return {k: v for k, v in fields.items() if v is not None}


def write_llama(path, weights, **extra):
    write_gguf(path, llama_fields(**extra), gguf_tensors(weights))
    return path


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("llama") / "llama.gguf", q8_0_weights(LLAMA))


def test_llama_config_from_metadata(llama_file):
    config = read_gguf(llama_file).config
    assert config.with_changes(norm_eps=1e-5) == LLAMA  # eps is stored as an f32


@pytest.mark.parametrize("extra, needle", [
    ({"llama.rope.dimension_count": 8}, "partial RoPE is not supported"),
    ({"llama.rope.scaling.type": "yarn"}, "rope.scaling"),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, "linear x 4.0 is not supported"),
    ({"llama.attention.head_count_kv": 3}, "n_heads = 4 is not a multiple of n_kv_heads = 3"),
    ({"llama.block_count": None}, "llama.block_count is missing"),
])
def test_llama_bad_metadata_rejected(tmp_path, extra, needle):
    path = write_llama(tmp_path / "bad.gguf", q8_0_weights(LLAMA), **extra)
    with pytest.raises(ModelFormatError, match=needle):
        read_gguf(path)


def test_llama_untied_output(tmp_path):
    untied = LLAMA.with_changes(tied_embeddings=False)
    config = read_gguf(write_llama(tmp_path / "untied.gguf", q8_0_weights(untied))).config
    assert not config.tied_embeddings


@ISA
def test_llama_greedy_64_tokens_identical(isa, llama_file):
    """The fast engine on the mapped file against the reference on the same weights."""
    greedy_both(read_gguf(llama_file), IDS, 64, isa)
