"""Llama 3's RoPE frequency divisors and Qwen 2's q/k/v biases at the
boundary: what a file must hold for each, what it may not, and the kernel
that turns the divisors into RoPE tables (docs/model.md#llama-3,
docs/model.md#qwen-2). Their proofs against transformers and llama.cpp are
tests/test_arch_oracles.py's."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gguf_model import gguf_tensor_name, read_gguf, read_gguf_f32, tensor_name
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.quant.types import GGML_TYPE_IDS
from gemma_cy_reference.layers import rope_cos_sin
from helpers import GOLDENS, ISA, kernels

ARCH = GOLDENS / "arch"
F32 = GGML_TYPE_IDS["F32"]


def copy_gguf(src, dst, drop=(), put: dict | None = None) -> str:
    """``src`` rewritten to ``dst``: the same metadata, tensors in ``drop``
    left out, those in ``put`` (name -> f32 vector) replaced or added."""
    gf = parse_gguf(str(src))
    put = dict(put or {})
    tensors = []
    for name, t in gf.tensors.items():
        if name in drop:
            continue
        if name in put:
            v = np.ascontiguousarray(put.pop(name), np.float32)
            tensors.append(TensorData(name, F32, tuple(reversed(v.shape)), v))
        else:
            tensors.append(TensorData(name, t.ggml_type, t.dims, np.array(gf.raw(name))))
    for name, v in put.items():
        v = np.ascontiguousarray(v, np.float32)
        tensors.append(TensorData(name, F32, tuple(reversed(v.shape)), v))
    write_gguf(dst, dict(gf.fields), tensors)
    return str(dst)


def refused(path, *needles) -> None:
    for reader in (read_gguf, read_gguf_f32):
        with pytest.raises(ModelFormatError) as e:
            reader(path)
        msg = str(e.value)
        assert "\n" not in msg and all(n in msg for n in needles), msg


def test_the_files_say_which_switches():
    llama = read_gguf(str(ARCH / "llama3" / "model-q8_0.gguf")).config
    assert llama.rope_freqs and not llama.qkv_bias and llama.rope_pairing == "interleaved"
    qwen2 = read_gguf(str(ARCH / "qwen2" / "model-q8_0.gguf")).config
    assert qwen2.qkv_bias and not qwen2.rope_freqs and qwen2.rope_pairing == "half_split"
    assert qwen2.rope_base == 1e6 and not qwen2.qk_norm
    qwen3 = read_gguf(str(ARCH / "qwen3" / "model-q8_0.gguf")).config
    assert not (qwen3.qkv_bias or qwen3.rope_freqs)


def test_bias_and_rope_freqs_names_round_trip():
    for g in ("blk.3.attn_q.bias", "blk.3.attn_k.bias", "blk.3.attn_v.bias", "blk.3.attn_q.weight",
              "rope_freqs.weight"):
        assert gguf_tensor_name(tensor_name(g, 4)) == g
    assert tensor_name("blk.0.attn_output.bias", 4) is None  # Qwen 2 has none: refused as unexpected
    assert tensor_name("blk.0.ffn_up.bias", 4) is None


def test_qwen2_without_a_bias_is_refused(tmp_path):
    path = copy_gguf(ARCH / "qwen2" / "model-f32.gguf", tmp_path / "m.gguf", drop={"blk.1.attn_v.bias"})
    refused(path, "missing tensor 'blk.1.attn_v.bias'")


def test_bias_of_the_wrong_length_is_refused(tmp_path):
    path = copy_gguf(ARCH / "qwen2" / "model-f32.gguf", tmp_path / "m.gguf",
                     put={"blk.0.attn_k.bias": np.zeros(64)})
    refused(path, "'blk.0.attn_k.bias'", "expected shape (32,)")


@pytest.mark.parametrize("arch, extra", [
    ("qwen3", "blk.0.attn_q.bias"),  # Qwen 3 dropped Qwen 2's biases
    ("qwen2", "rope_freqs.weight"),  # Qwen 2 has no RoPE scaling
    ("gemma2", "rope_freqs.weight"),
])
def test_a_tensor_the_architecture_lacks_is_refused(tmp_path, arch, extra):
    n = 64 if extra.endswith("bias") else 16
    path = copy_gguf(ARCH / arch / "model-f32.gguf", tmp_path / "m.gguf", put={extra: np.ones(n)})
    refused(path, f"unexpected tensor '{extra}'")


@pytest.mark.parametrize("bad, needles", [
    (np.zeros(16), ("rope_freqs holds a value that is not finite and > 0",)),
    (np.full(16, np.nan), ("rope_freqs",)),
    (-np.ones(16), ("rope_freqs holds a value that is not finite and > 0",)),
    (np.ones(8), ("'rope_freqs.weight'", "expected shape (16,)")),
])
def test_bad_rope_freqs_are_refused(tmp_path, bad, needles):
    path = copy_gguf(ARCH / "llama3" / "model-f32.gguf", tmp_path / "m.gguf", put={"rope_freqs.weight": bad})
    refused(path, *needles)


def test_rope_freqs_of_ones_are_plain_rope(tmp_path):
    """Divisors of 1 give the bits of a file without the tensor: the switch
    changes the angles only through the values."""
    from gemma_cy.fast.engine import FastEngine

    src = ARCH / "llama3" / "model-f32.gguf"
    ones = read_gguf(copy_gguf(src, tmp_path / "ones.gguf", put={"rope_freqs.weight": np.ones(16)}))
    plain = read_gguf(copy_gguf(src, tmp_path / "plain.gguf", drop={"rope_freqs.weight"}))
    assert ones.config.rope_freqs and not plain.config.rope_freqs
    ids = [5, 17, 200, 3, 99, 41, 7, 300]
    a, b = FastEngine(ones, 64).prefill(ids), FastEngine(plain, 64).prefill(ids)
    assert a.tobytes() == b.tobytes()
    real = FastEngine(read_gguf(str(src)), 64).prefill(ids)
    assert real.tobytes() != a.tobytes()  # the file's own divisors move the logits


@ISA
@pytest.mark.parametrize("pos, head_dim", [(0, 32), (5, 32), (511, 64), (32767, 128)])
def test_rope_tables_with_divisors_are_the_references(isa, pos, head_dim):
    """The kernel's cos/sin of pos * base^(-2j/hd) / f[j] equal the
    reference's (f64 angles rounded once; libm and NumPy may differ by one
    f64 ulp, so one f32 ulp)."""
    rng = np.random.default_rng(pos)
    factors = rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32)
    want_cos, want_sin = rope_cos_sin(pos, head_dim, 500000.0, factors)
    cos_t, sin_t = kernels(isa).rope_cos_sin(pos, head_dim, 500000.0, factors)
    np.testing.assert_array_max_ulp(cos_t, want_cos, maxulp=1)
    np.testing.assert_array_max_ulp(sin_t, want_sin, maxulp=1)
    plain_cos, _ = rope_cos_sin(pos, head_dim, 500000.0)
    assert pos == 0 or not np.array_equal(plain_cos, want_cos)
    with pytest.raises(ValueError, match="factors of shape"):
        kernels(isa).rope_cos_sin(pos, head_dim, 500000.0, factors[:-1])
