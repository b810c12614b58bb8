"""GGUF metadata -> ModelConfig (gemma_cy/formats/gguf_config.py): Gemma 3's
switches, every metadata key, bad metadata and tensors of the wrong shape,
type or name (docs/errors.md cases 4, 5, 9, 12); and the tokenizer models
gemma_cy.api.tokenizer_from_gguf refuses."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import gguf_config, read_gguf
from gguf_helpers import PIECES, T, reject, tensor_data, tiny_arrays, tiny_fields, write_tiny


# ================================================================ metadata -> ModelConfig

def test_gemma3_config_switches(tiny_gguf):
    c = read_gguf(tiny_gguf).config
    assert c.activation == "gelu_tanh" and c.rope_pairing == "half_split"
    assert c.norm_gain == "plain"  # the GGUF stores 1 + w
    assert c.qk_norm and c.post_norms and not c.position_table
    assert c.embed_scale == float(np.float32(math.sqrt(32)))
    assert c.query_scale == 1 / math.sqrt(16)
    assert c.rope_base == 1e6 and c.rope_base_local == 10000.0  # local base derived for gemma3
    assert c.sliding_window == 8 and c.sliding_window_pattern == 6 and c.local_layers == ()
    assert c.rope_scale_global == 1.0
    assert c.bos_id == 2 and c.eos_ids == (1, 9)  # <eos> and <end_of_turn>
    assert c.attn_softcap == 0 and c.final_softcap == 0
    assert c.norm_eps == float(np.float32(1e-6))


@pytest.mark.parametrize("extra, field, value", [
    ({"gemma3.rope.freq_base_swa": 20000.0}, "rope_base_local", 20000.0),
    ({"gemma3.rope.freq_base": None}, "rope_base", 1e6),
    ({"gemma3.attention.sliding_window_pattern": 2}, "sliding_window_pattern", 2),
    ({"gemma3.attention.sliding_window_pattern": np.array([True, False])}, "sliding_window_pattern", 2),
    ({"gemma3.attention.sliding_window_pattern": np.array([False, True])}, "local_layers", (False, True)),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}, "rope_scale_global", 8.0),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 1.0}, "rope_scale_global", 1.0),
    ({"tokenizer.ggml.eot_token_id": 8}, "eos_ids", (1, 8)),
    ({"gemma3.final_logit_softcapping": 30.0}, "final_softcap", 30.0),
    ({"gemma3.attention.head_count_kv": None}, "n_kv_heads", 2),
])
def test_config_from_metadata_keys(tmp_path, extra, field, value):
    c = gguf_config(parse_gguf(write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**extra))))
    assert getattr(c, field) == value


def test_unsupported_architecture(tmp_path):
    path = write_tiny(tmp_path / "bert.gguf", fields=tiny_fields(**{"general.architecture": "bert"}))
    msg = reject(path, "architecture 'bert' is not supported", "supported: gemma, gemma2, gemma3, gemma4, llama, phi3, qwen2, qwen3")
    assert msg.startswith(path)


@pytest.mark.parametrize("extra, needles", [
    ({"general.architecture": None}, ("general.architecture is missing",)),
    ({"gemma3.block_count": None}, ("gemma3.block_count is missing",)),
    ({"gemma3.attention.sliding_window": None}, ("gemma3.attention.sliding_window is missing",)),
    ({"gemma3.attention.sliding_window": 0}, ("gemma3.attention.sliding_window: found 0, must be >= 1",)),
    ({"gemma3.block_count": 0}, ("block_count: found 0",)),
    ({"gemma3.block_count": 2**32 - 1}, ("block_count = 4294967295", "only")),
    ({"gemma3.embedding_length": "640"}, ("embedding_length: type STRING",)),
    ({"gemma3.attention.head_count_kv": 3}, ("n_heads = 2 is not a multiple of n_kv_heads = 3",)),
    ({"gemma3.attention.key_length": 15, "gemma3.attention.value_length": 15}, ("head_dim = 15",)),
    ({"gemma3.attention.value_length": 8}, ("value_length = 8",)),
    ({"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 8.0}, ("yarn x 8.0 is not supported",)),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 0.0}, ("rope_scale_global = 0.0",)),
    ({"gemma3.rope.freq_base": float("nan")}, ("rope_base",)),
    ({"gemma3.attention.sliding_window_pattern": np.array([True, True, False, True])},
     ("expected 2 BOOLs",)),
    ({"tokenizer.ggml.bos_token_id": 12}, ("bos_token_id = 12", "[0, 12)")),
    ({"tokenizer.ggml.scores": np.zeros(11, np.float32)}, ("scores: 11 entries", "vocab_size = 12")),
    ({"tokenizer.ggml.tokens": PIECES[:-1]}, ("tokens: 11 entries",)),
])
def test_bad_metadata(tmp_path, extra, needles):
    reject(write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**extra)), *needles)


def test_tensor_of_unexpected_shape(tmp_path):
    arrays = tiny_arrays()
    arrays["blk.1.attn_q.weight"] = np.zeros((64, 32), np.float32)
    reject(write_tiny(tmp_path / "s.gguf", arrays=arrays),
           "'blk.1.attn_q.weight'", "shape (64, 32)", "expected shape (32, 32)")


def test_unexpected_missing_and_unrunnable_tensors(tmp_path):
    arrays = tiny_arrays()
    arrays["rope_freqs.weight"] = np.ones(8, np.float32)
    reject(write_tiny(tmp_path / "x.gguf", arrays=arrays), "unexpected tensor 'rope_freqs.weight'")
    arrays = tiny_arrays(n_layers=3)  # a layer the metadata does not have
    reject(write_tiny(tmp_path / "y.gguf", arrays=arrays), "unexpected tensor 'blk.2.")
    arrays = tiny_arrays()
    del arrays["blk.0.attn_k_norm.weight"]
    reject(write_tiny(tmp_path / "z.gguf", arrays=arrays), "missing tensor 'blk.0.attn_k_norm.weight'")
    tensors = tensor_data(tiny_arrays())
    assert tensors[2].name == "blk.0.attn_q.weight"
    tensors[2] = TensorData(tensors[2].name, T["I8"], tensors[2].dims,
                            np.zeros(tensors[2].dims[::-1], np.int8))
    write_gguf(tmp_path / "i8.gguf", tiny_fields(), tensors)
    reject(str(tmp_path / "i8.gguf"), "tensor 'blk.0.attn_q.weight' is I8 with 2 dims",
           "F32, F16, BF16 matrices and those of the integer block types")


@pytest.mark.parametrize("model", ["bert", "t5", "plamo2", "rwkv", "no_vocab"])
def test_a_tokenizer_model_gemma_cy_does_not_read_is_refused(tmp_path, model):
    """Not read as SentencePiece (ids a different model's): one line naming it."""
    from gemma_cy.api import tokenizer_from_gguf

    path = write_tiny(tmp_path / "m.gguf", fields=tiny_fields(**{"tokenizer.ggml.model": model}))
    with pytest.raises(ModelFormatError) as e:
        tokenizer_from_gguf(parse_gguf(path))
    msg = str(e.value)
    assert f"tokenizer.ggml.model = {model!r} is not supported" in msg and "'llama'" in msg and "\n" not in msg
    assert msg.startswith(path)
