"""gemma_cy.quant.affine: every ggml integer block type as int8 levels with a
scale and an offset per sub-block, checked bit for bit against the gguf
package's dequantizers (an independent implementation of ggml's
dequantize_row_*), on hypothesis-drawn blocks: extreme, subnormal, zero and
negative f16 scales, every byte of the packed K-quant scales, several blocks
per row (docs/numerics.md#weights-as-stored)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_cy.formats.gguf_reader import _F16_SCALE_OFFSETS
from gemma_cy.quant.affine import AFFINE_TYPES, DECOMPOSERS, to_affine
from gemma_cy.quant.types import GGML_TYPE_IDS, GGML_TYPES

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) is the independent oracle")

# Byte offsets of each type's f16 scales in its block (the reader checks them for NaN/Inf).
F16_AT = _F16_SCALE_OFFSETS
# f16 scales worth drawing: the largest finite, the smallest normal and subnormal, zero, both signs.
SPECIAL_F16 = [65504.0, -65504.0, 2.0**-14, 2.0**-24, -(2.0**-24), 0.0, -0.0, 1.0, -1.0, 0.000123]


def theirs(raw: np.ndarray, name: str) -> np.ndarray:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    return np.asarray(values, dtype=np.float32).reshape(raw.shape[0], -1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@st.composite
def blocks(draw, name: str):
    """(rows, n_blocks * type_size) u8 of ``name``: random bytes, each f16 scale
    drawn from SPECIAL_F16 or any finite f16."""
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    rows = draw(st.integers(1, 3))
    n_blocks = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * n_blocks, t.type_size), dtype=np.uint8)
    finite = st.one_of(st.sampled_from(SPECIAL_F16), st.floats(-65504, 65504, width=16))
    for at in F16_AT[name]:
        scales = np.array(draw(st.lists(finite, min_size=rows * n_blocks, max_size=rows * n_blocks)), "<f2")
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, n_blocks * t.type_size)


def test_every_integer_block_type_has_a_decomposer_and_an_oracle():
    assert set(AFFINE_TYPES) <= set(F16_AT)
    for name in AFFINE_TYPES:
        assert hasattr(gguf.GGMLQuantizationType, name)


@pytest.mark.parametrize("name", AFFINE_TYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_levels_times_scale_minus_offset_are_ggml_values_bit_for_bit(name, data):
    raw = data.draw(blocks(name))
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    cols = raw.shape[1] // t.type_size * t.block_size
    ours = to_affine(raw, t.id, (raw.shape[0], cols))
    assert ours.q.shape == (raw.shape[0], cols) and ours.q.dtype == np.int8
    assert ours.a.shape == (raw.shape[0], cols // ours.sub)
    assert same_bits(ours.values(), theirs(raw, name))


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q2_K", "Q3_K", "Q6_K"])
def test_every_byte_of_the_packed_scales(name):
    """256 blocks whose scale bytes take every value in every position, so every
    6-bit (Q4_K, Q5_K, Q3_K), 4-bit (Q2_K) and int8 (Q6_K) scale and min code
    is decoded at least once."""
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    at = {"Q4_K": (4, 16), "Q5_K": (4, 16), "Q2_K": (0, 16), "Q3_K": (96, 108), "Q6_K": (192, 208)}[name]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (256, t.type_size), dtype=np.uint8)
    width = at[1] - at[0]
    raw[:, at[0]:at[1]] = (np.arange(256)[:, None] + 17 * np.arange(width)[None, :]) % 256
    for f in F16_AT[name]:
        raw[:, f:f + 2] = np.full(256, 0.0625, "<f2").view(np.uint8).reshape(-1, 2)
    ours = to_affine(raw, t.id, (256, t.block_size))
    assert same_bits(ours.values(), theirs(raw, name))


@pytest.mark.parametrize("name", AFFINE_TYPES)
def test_records_pack_levels_scale_and_offset_per_sub_block(name):
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (2, 2 * t.type_size), dtype=np.uint8)
    for f in F16_AT[name]:
        for blk in range(2):
            raw[:, blk * t.type_size + f:blk * t.type_size + f + 2] = \
                rng.normal(0, 1, 2).astype("<f2").view(np.uint8).reshape(2, 2)
    lv = to_affine(raw, t.id, (2, 2 * t.block_size))
    rec = lv.records()
    n_sub = 2 * t.block_size // lv.sub
    assert rec.shape == (2, n_sub, lv.record_bytes())
    np.testing.assert_array_equal(rec[:, :, :lv.sub].view(np.int8).reshape(2, -1), lv.q)
    np.testing.assert_array_equal(rec[:, :, lv.sub:lv.sub + 4].copy().view("<f4")[..., 0], lv.a)
    if lv.b is None:
        assert lv.record_bytes() == lv.sub + 4
    else:
        np.testing.assert_array_equal(rec[:, :, lv.sub + 4:].copy().view("<f4")[..., 0], lv.b)


def test_levels_stay_in_each_types_range():
    """The kernels widen int8 levels: each type's levels fit the range its bits allow."""
    rng = np.random.default_rng(11)
    expect = {"Q8_0": (-128, 127), "Q4_0": (-8, 7), "Q5_0": (-16, 15), "Q4_1": (0, 15), "Q5_1": (0, 31),
              "Q2_K": (0, 3), "Q3_K": (-4, 3), "Q4_K": (0, 15), "Q5_K": (0, 31), "Q6_K": (-32, 31)}
    for name, (lo, hi) in expect.items():
        t = GGML_TYPES[GGML_TYPE_IDS[name]]
        raw = rng.integers(0, 256, (64, t.type_size), dtype=np.uint8)
        for f in F16_AT[name]:
            raw[:, f:f + 2] = np.full(64, 1.0, "<f2").view(np.uint8).reshape(-1, 2)
        q = to_affine(raw, t.id, (64, t.block_size)).q
        assert lo <= q.min() and q.max() <= hi, name
        assert q.min() == lo and q.max() == hi, f"{name}: 64 random blocks should reach both ends"


def test_bad_inputs_are_one_line_value_errors():
    q4k = GGML_TYPE_IDS["Q4_K"]
    with pytest.raises(ValueError, match="multiple of 256"):
        to_affine(np.zeros(144, np.uint8), q4k, (2, 128))
    with pytest.raises(ValueError, match="do not hold"):
        to_affine(np.zeros(143, np.uint8), q4k, (1, 256))
    with pytest.raises(ValueError, match="IQ4_NL has no integer blocks"):
        to_affine(np.zeros(18, np.uint8), GGML_TYPE_IDS["IQ4_NL"], (1, 32))
    assert set(DECOMPOSERS) <= set(GGML_TYPES)


@pytest.mark.parametrize("name", AFFINE_TYPES)
def test_affine_tensor_holds_the_files_weights(name):
    from gemma_cy.quant.affine import AffineTensor

    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, (3, 2 * t.type_size), dtype=np.uint8)
    for blk in range(2):
        for f in F16_AT[name]:
            at = blk * t.type_size + f
            raw[:, at:at + 2] = rng.normal(0, 0.1, 3).astype("<f2").view(np.uint8).reshape(3, 2)
    w = AffineTensor.from_raw(raw, t.id, (3, 2 * t.block_size))
    assert w.shape == (3, 2 * t.block_size) and w.source == name
    assert same_bits(w.dequantize(), theirs(raw, name))
    assert same_bits(w.row(1), theirs(raw, name)[1])
