"""The Q8_0 codec (gemma_cy/quant/tensors.py) and the ggml codecs
(gemma_cy/quant/ggml.py, the type table of gemma_cy/quant/types.py): rounding
rules without gguf-py, then bit for bit against gguf-py's quantizers and
dequantizers (an independent implementation of llama.cpp's); exact and
rounded requantization to Q8_0."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_cy.quant import ggml as gq
from gemma_cy.quant import types as gt
from gemma_cy.quant.tensors import F32Tensor, Q8_0Tensor, dequantize_q8_0, quantize_q8_0, round_half_away
from gguf_helpers import T, random_blocks


# ================================================================ Q8_0 codec

def test_q8_0_codec_rules_without_gguf():
    x = np.zeros((3, 32), np.float32)
    x[1, 0] = 127.0  # d = 1: every value is rounded as is
    x[1, 1:6] = [0.5, 1.5, -2.5, 2.4999998, -0.5]
    x[2, :] = 1e-38  # 1/d overflows f32: gives q = 0, d = 0
    b = quantize_q8_0(x)
    assert b.shape == (3, 1, 34)
    assert b[0].tobytes() == bytes(34)  # zero block: d = 0, q = 0
    q = b[1, 0, 2:].view(np.int8)
    assert list(q[:6]) == [127, 1, 2, -3, 2, -1]  # halves away from zero, not to even
    assert b[1, 0, :2].view("<f2")[0] == 1.0
    assert not np.any(dequantize_q8_0(b)[2])
    np.testing.assert_array_equal(round_half_away(np.array([-0.5, 0.49999997, 2.5], np.float32)),
                                  [-1, 0, 3])
    with pytest.raises(ValueError, match="f16"):
        quantize_q8_0(np.full(32, 1e7, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        quantize_q8_0(np.full(32, np.nan, np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.zeros(31, np.float32))


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e3, 1e-30, 3e4])
def test_q8_0_quantize_bit_exact_with_gguf_py(scale):
    gguf = pytest.importorskip("gguf", reason="gguf-py's Q8_0 quantize is the reference to match bit for bit")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((48, 256)) * scale).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.arange(32) - 16.5  # exact halves after scaling
    x[2, :64] = np.round(rng.standard_normal(64) * 50) / 2
    ours = quantize_q8_0(x).reshape(48, -1)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    assert ours.tobytes() == theirs.tobytes()
    np.testing.assert_array_equal(dequantize_q8_0(quantize_q8_0(x)),
                                  gguf.quants.dequantize(theirs, gguf.GGMLQuantizationType.Q8_0))


def test_q8_0_tensor_interface():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    t = Q8_0Tensor(quantize_q8_0(x))
    assert t.shape == (4, 64) and t.d.shape == (4, 2) and t.qs.shape == (4, 2, 32)
    np.testing.assert_array_equal(t.dequantize(), t.qs.astype(np.float32).reshape(4, 2, 32).__mul__(
        t.d.astype(np.float32)[..., None]).reshape(4, 64))
    np.testing.assert_allclose(t.dequantize(), x, atol=np.abs(x).max() / 127)
    with pytest.raises(TypeError):
        Q8_0Tensor(np.zeros((4, 2, 33), np.uint8))
    with pytest.raises(TypeError):
        F32Tensor(np.zeros(3, np.float64))


# ================================================================ ggml codecs

@pytest.mark.parametrize("type_name", gq.DEQUANTIZABLE)
def test_dequantize_bit_exact_with_gguf_py(type_name):
    gguf = pytest.importorskip("gguf", reason="gguf-py's dequantizers are the independent reference")
    t = gt.GGML_TYPES[T[type_name]]
    n_values = 4 * 256
    raw = random_blocks(type_name, n_values // t.block_size)
    ours = gq.dequantize(raw.reshape(-1), t.id, (4, 256))
    theirs = gguf.quants.dequantize(raw.reshape(4, -1), gguf.GGMLQuantizationType[type_name])
    assert ours.dtype == np.float32 and ours.tobytes() == theirs.astype(np.float32).tobytes()


def test_type_table_matches_gguf_py():
    gguf = pytest.importorskip("gguf", reason="gguf-py lists ggml's block sizes independently")
    for t in gt.GGML_TYPES.values():
        q = gguf.GGMLQuantizationType(t.id)
        assert q.name == t.name and gguf.GGML_QUANT_SIZES[q] == (t.block_size, t.type_size)


@pytest.mark.parametrize("type_name, low, high", [("Q8_0", -128, 127), ("Q5_0", -16, 15), ("Q4_0", -8, 7)])
def test_exact_requantization(type_name, low, high):
    raw = random_blocks(type_name, 64, seed=3)
    shape = (8, 256)
    blocks = gq.to_q8_0(raw.reshape(-1), T[type_name], shape)
    assert gq.is_exact_in_q8_0(T[type_name])
    # the same f16 scale, integer levels in the source's range, and identical values
    np.testing.assert_array_equal(blocks.reshape(-1, 34)[:, :2], raw[:, :2])
    q = blocks[..., 2:].view(np.int8)
    assert q.min() >= low and q.max() <= high and q.min() == low and q.max() == high
    source = gq.dequantize(raw.reshape(-1), T[type_name], shape)
    assert dequantize_q8_0(blocks).tobytes() == source.tobytes()


def test_k_quants_are_rounded_once():
    raw = random_blocks("Q4_K", 8, seed=4)
    source = gq.dequantize(raw.reshape(-1), T["Q4_K"], (8, 256))
    blocks = gq.to_q8_0(raw.reshape(-1), T["Q4_K"], (8, 256))
    assert not gq.is_exact_in_q8_0(T["Q4_K"])
    np.testing.assert_array_equal(blocks, quantize_q8_0(source))


def test_dequantize_rejects_unsupported_types():
    with pytest.raises(ValueError, match="cannot dequantize ggml type IQ2_XXS"):
        gq.dequantize(np.zeros(66, np.uint8), T["IQ2_XXS"], (256,))
