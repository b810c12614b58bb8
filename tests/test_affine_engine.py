"""Every GGUF integer block type run as the file stores it
(docs/numerics.md#weights-as-stored): the fast engine's affine kernels
(k_dot_affine for decode, the blocked GEMM for prefill, the row lookup of an
embedding) against a float64 product of the file's exact weights, bit for
bit between the GEMV and the GEMM of each module; and a whole model whose
matrices cycle through all ten types, read from a GGUF file, against the
NumPy reference op by op and token for token, on every SIMD module."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemma_cy.errors import ModelFormatError, ParameterError
from gemma_cy.fast.engine import FastEngine
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import gguf_tensor_name
from gemma_cy.generation.engines import make_engine
from gemma_cy.model.config import ModelConfig
from gemma_cy.model.weights import expected_shapes
from gemma_cy.formats.gguf_reader import _F16_SCALE_OFFSETS
from gemma_cy.quant.affine import AFFINE_TYPES, DECOMPOSERS, AffineTensor, Q4_KTensor, to_affine
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor, to_q8_0
from gemma_cy.quant.types import GGML_TYPE_IDS, GGML_TYPES
from gemma_cy.quant.tensors import Int8Tensor, Q8_0Tensor
from gemma_cy_reference.q8 import Q8Matrix
from gemma_cy_reference.model import ReferenceEngine
from helpers import (ISA, check_each_op_against_the_reference, gemma3_gguf_fields, greedy_both,
                     greedy_engines_agree, kernels)

# Byte offsets of each type's f16 scales in its block (the reader checks them for NaN/Inf).
F16_AT = _F16_SCALE_OFFSETS
U = 2.0 ** -24  # f32's unit roundoff


def random_raw(name: str, rows: int, cols: int, rng, target: float) -> np.ndarray:
    """Random blocks of type ``name`` for a (rows, cols) matrix, the f16
    scales set so that the largest |weight| is about ``target`` (weights are
    linear in the block's f16 fields)."""
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    raw = rng.integers(0, 256, (rows * cols // t.block_size, t.type_size), dtype=np.uint8)
    for at in F16_AT[name]:
        raw[:, at:at + 2] = np.full(raw.shape[0], 1.0, "<f2").view(np.uint8).reshape(-1, 2)
    peak = float(np.max(np.abs(to_affine(raw, t.id, (rows, cols)).values()))) or 1.0
    for at in F16_AT[name]:
        raw[:, at:at + 2] = np.full(raw.shape[0], target / peak, "<f2").view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A rounding-error bound of an f32 dot product of rows of w with x in any
    order of <= cols / 32 + 8 chained additions: (cols / 32 + 8) u sum|w x|,
    plus the products' own rounding (one u each)."""
    chain = w.shape[1] / 32 + 8
    return (chain + 1) * U * (np.abs(w.astype(np.float64)) @ np.abs(x.astype(np.float64)).T).T


@ISA
@pytest.mark.parametrize("name", AFFINE_TYPES)
@pytest.mark.parametrize("rows", [1, 2, 7])
def test_affine_gemv_and_gemm_against_float64(isa, name, rows):
    m = kernels(isa)
    rng = np.random.default_rng(rows * 1000 + AFFINE_TYPES.index(name))
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    cols = 2 * max(t.block_size, 32) if t.block_size < 256 else 512
    tensor = AffineTensor.from_raw(random_raw(name, rows, cols, rng, 0.5), t.id, (rows, cols))
    w = tensor.dequantize()
    x = rng.uniform(-1, 1, (9, cols)).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T  # (9, rows)
    block = m.gemm(tensor, x)  # the prefill path: 9 positions at once
    assert np.all(np.abs(block - want) <= bound(w, x)), np.max(np.abs(block - want) / bound(w, x))
    for i in range(x.shape[0]):  # the decode path, one position: the same bits
        step = m.gemm(tensor, x[i:i + 1])
        np.testing.assert_array_equal(step[0], block[i], err_msg=f"{isa} {name} position {i}")


@ISA
def test_affine_gemm_covers_row_tiles_and_positions(isa):
    """13 rows (two 6-row tiles and an overlapping 3-row one) and 70 positions
    (past one pass of 64): every (position, row) the GEMV's bits."""
    m = kernels(isa)
    rng = np.random.default_rng(3)
    tensor = AffineTensor.from_raw(random_raw("Q4_K", 13, 256, rng, 0.3), GGML_TYPE_IDS["Q4_K"], (13, 256))
    x = rng.uniform(-1, 1, (70, 256)).astype(np.float32)
    block = m.gemm(tensor, x)
    steps = np.concatenate([m.gemm(tensor, x[i:i + 1]) for i in range(70)])
    np.testing.assert_array_equal(block, steps)


@ISA
@pytest.mark.parametrize("cols", [96, 160])
def test_affine_gemm_rows_ending_in_half_a_group_of_64(isa, cols):
    """Rows of 96 and 160 values (whole 32s, not whole 64s: a GEMV whose
    step is 64 values ends in half a step), 9 rows and 70 positions:
    every (position, row) the GEMV's bits, and within a few roundings of
    float64. (Only 32-value types end so: a k-quant row is whole 256s.)"""
    m = kernels(isa)
    rng = np.random.default_rng(cols)
    for name in ("Q4_1", "Q5_1"):
        t = GGML_TYPES[GGML_TYPE_IDS[name]]
        tensor = AffineTensor.from_raw(random_raw(name, 9, cols, rng, 0.5), t.id, (9, cols))
        x = rng.uniform(-1, 1, (70, cols)).astype(np.float32)
        block = m.gemm(tensor, x)
        steps = np.concatenate([m.gemm(tensor, x[i:i + 1]) for i in range(70)])
        np.testing.assert_array_equal(block, steps, err_msg=f"{isa} {name}")
        w = tensor.dequantize()
        want = x.astype(np.float64) @ w.astype(np.float64).T
        assert np.all(np.abs(block - want) <= bound(w, x))


@ISA
@pytest.mark.parametrize("name", AFFINE_TYPES)
def test_affine_q8_mode_is_the_references_bit_for_bit(isa, name):
    """--activations q8 on an affine matrix: the kernels' products equal the
    reference's Q8Matrix bit for bit (exact integer sums, f64 terms in one
    order), GEMV and GEMM alike, and a float64 evaluation of the same
    quantized activations times the file's exact weights within a bound of a
    few roundings of the result."""
    from gemma_cy.quant.tensors import quantize_activations_q8
    from gemma_cy_reference.q8 import Q8Matrix

    m = kernels(isa)
    rng = np.random.default_rng(AFFINE_TYPES.index(name))
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    rows, cols = 5, 512
    tensor = AffineTensor.from_raw(random_raw(name, rows, cols, rng, 0.5), t.id, (rows, cols))
    x = rng.uniform(-1, 1, (6, cols)).astype(np.float32)
    block = m.gemm(tensor, x, activations="q8")
    reference = Q8Matrix(tensor)
    w = tensor.dequantize().astype(np.float64)
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(block[i], reference @ x[i], err_msg=f"{isa} {name} position {i}")
        np.testing.assert_array_equal(m.gemm(tensor, x[i:i + 1], activations="q8")[0], block[i])
        xq, xd = quantize_activations_q8(x[i])
        xv = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 32)
        want = w @ xv
        assert np.all(np.abs(block[i] - want) <= 4 * U * (np.abs(w) @ np.abs(xv))), (isa, name, i)


# f16 scales from the extremes: zero, subnormal, the largest finite, negative.
SPECIAL_F16 = np.array([0.0, 2.0 ** -24, 3 * 2.0 ** -20, 6.1e-5, 65504.0, -1.5, 1e-3], np.float16)


def special_blocks(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random blocks of ``name`` (random_raw) whose two f16 fields at bytes
    0 and 2 (Q4_K's d and dmin, Q4_1's d and m) are drawn, for about a
    third of the blocks, from the extremes: zero, subnormal, the largest
    finite, negative."""
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    raw = random_raw(name, rows, cols, rng, 0.5).reshape(-1, t.type_size).copy()
    pick = rng.random(raw.shape[0]) < 0.3
    for at in (0, 2):
        values = raw[:, at:at + 2].copy().view("<f2")[:, 0]
        values[pick] = rng.choice(SPECIAL_F16, int(pick.sum()))
        raw[:, at:at + 2] = values.astype("<f2").view(np.uint8).reshape(-1, 2)
    return raw


def stored_and_records(kind: str, stored_type, raw: np.ndarray):
    """``raw`` (rows, bytes) as stored_type (the file's blocks) and as its
    affine records, once the stored tensor's weights are checked against
    the gguf package's; returns (stored, records, their weights)."""
    import gguf

    t = GGML_TYPES[GGML_TYPE_IDS[kind]]
    stored = stored_type.from_raw(raw, (raw.shape[0], raw.shape[1] // t.type_size * t.block_size))
    records = AffineTensor.from_raw(raw, GGML_TYPE_IDS[kind], stored.shape)
    theirs = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType[kind]).reshape(stored.shape)
    np.testing.assert_array_equal(stored.dequantize().view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    return stored, records, theirs


def special_q4_k(rows: int, cols: int, rng) -> np.ndarray:
    """Q4_K blocks with special_blocks' f16 d and dmin; every 6-bit scale
    and min code appears (the 12 scale bytes are random)."""
    return special_blocks("Q4_K", rows, cols, rng).reshape(rows, -1)


@ISA
@pytest.mark.parametrize("rows, cols, positions", [(1, 256, 1), (2, 512, 5), (3, 512, 9), (257, 256, 70), (5, 1024, 1)])
def test_q4_k_as_stored_is_its_records_bit_for_bit(isa, rows, cols, positions):
    """A Q4_K matrix read from its super-blocks (QLAYOUT_Q4_K: the decode GEMV
    unpacks nibbles in registers, and so do the avx2 and avx512 GEMMs; the
    other GEMMs and the q8 mode turn tiles of 256 rows into records) gives the bits its
    affine records give, in both
    activation modes, past a tile of rows and a pass of positions; and its
    weights are the gguf package's."""
    m = kernels(isa)
    rng = np.random.default_rng(rows * 7 + cols)
    stored, records, _ = stored_and_records("Q4_K", Q4_KTensor, special_q4_k(rows, cols, rng))
    assert_gemm_bits_equal(m, stored, records, rng.uniform(-1, 1, (positions, cols)).astype(np.float32), isa)


def special_q4_1(rows: int, cols: int, rng) -> np.ndarray:
    """Q4_1 blocks with special_blocks' f16 d and m, the first block's
    nibbles 0..15 (value j and 16 + j: nibble j)."""
    raw = special_blocks("Q4_1", rows, cols, rng)
    raw[0, 4:20] = np.arange(16, dtype=np.uint8) * 17
    return raw.reshape(rows, -1)


@ISA
@pytest.mark.parametrize("rows, cols, positions", [(1, 32, 1), (2, 64, 5), (3, 96, 9), (257, 576, 70), (5, 1536, 1)])
def test_q4_1_as_stored_is_its_records_bit_for_bit(isa, rows, cols, positions):
    """A Q4_1 matrix read from its blocks (QLAYOUT_Q4_1: the avx2 GEMV and
    GEMM and the avx512 GEMV and GEMM unpack the nibbles in registers; the other
    paths, the q8 mode and the row lookup turn tiles of 256 rows into
    records) gives the bits
    its affine records give, in both activation modes, past a tile of rows
    and a pass of positions, and so does the reference's q8 matrix; its
    weights are the gguf package's."""
    m = kernels(isa)
    rng = np.random.default_rng(rows * 7 + cols)
    stored, records, theirs = stored_and_records("Q4_1", Q4_1Tensor, special_q4_1(rows, cols, rng))
    np.testing.assert_array_equal(stored.affine().records, records.records)
    x = rng.uniform(-1, 1, (positions, cols)).astype(np.float32)
    decoded_q8 = assert_gemm_bits_equal(m, stored, records, x, isa)
    np.testing.assert_array_equal((Q8Matrix(stored) @ x[-1]).view(np.uint32), decoded_q8.view(np.uint32))
    for r in sorted({0, rows // 2, rows - 1}):  # an embedding lookup
        np.testing.assert_array_equal(m.matrix_row(stored, r).view(np.uint32), stored.row(r).view(np.uint32))
        np.testing.assert_array_equal(stored.row(r).view(np.uint32), theirs[r].astype(np.float32).view(np.uint32))


def test_q4_1_tensor_refuses_what_is_not_a_matrix_of_whole_blocks():
    raw = np.zeros((3, 20), np.uint8)
    with pytest.raises(ValueError, match="multiple of 32"):
        Q4_1Tensor.from_raw(raw, (3, 48))
    with pytest.raises(ValueError, match="do not hold"):
        Q4_1Tensor.from_raw(raw, (2, 64))
    with pytest.raises(TypeError):
        Q4_1Tensor(np.zeros((3, 1, 22), np.uint8))


def assert_gemm_bits_equal(m, stored, converted, x: np.ndarray, isa: str) -> np.ndarray:
    """m.gemm of ``stored`` gives the bits of m.gemm of ``converted`` in both
    activation modes, for every position of x and for its last one alone
    (the decode path); returns the last one's q8 output."""
    for activations in ("f32", "q8"):
        want = m.gemm(converted, x, activations)
        got = m.gemm(stored, x, activations)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{isa} {activations}")
        one = m.gemm(stored, x[-1:], activations)  # the decode path
        np.testing.assert_array_equal(one[0].view(np.uint32), want[-1].view(np.uint32), err_msg=f"{isa} decode")
    return one[0]


@ISA
@pytest.mark.parametrize("kind, cols", [("Q8_0 blocks", 2048), ("Q8_0 blocks", 2080), ("Q5_0 as stored", 2080),
                                        ("Q4_K as stored", 2048), ("Q6_K", 2048), ("Q4_1", 2080),
                                        ("Q4_1 as stored", 2080)])
def test_f32_gemm_of_long_rows_is_the_gemv_at_every_position(isa, kind, cols):
    """Rows of 2,048 values or more (the avx512 GEMM forms them, and copies
    the positions, group-major: each accumulator's 16-value groups side by
    side; 2,080 is not a whole number of 64s, so a step of 64 ends halfway):
    9 rows and 70 positions (6- and 4-position tiles, and what no tile
    covers), every (position, row) the one-position GEMV's bits, and within
    a few roundings of float64."""
    m = kernels(isa)
    rng = np.random.default_rng(cols + len(kind))
    w = q8_gemm_matrix(kind, 9, cols, rng)
    x = rng.uniform(-1, 1, (70, cols)).astype(np.float32)
    block = m.gemm(w, x)
    steps = np.concatenate([m.gemm(w, x[i:i + 1]) for i in range(70)])
    np.testing.assert_array_equal(block.view(np.uint32), steps.view(np.uint32), err_msg=f"{isa} {kind} {cols}")
    exact = w.dequantize().astype(np.float64)
    assert np.all(np.abs(block - x.astype(np.float64) @ exact.T) <= bound(exact, x))


def q8_gemm_matrix(kind: str, rows: int, cols: int, rng):
    """A (rows, cols) matrix of any layout the q8 mode runs, with every int8
    level (-128 too) and, for Q8_0, f16 scales from the extremes."""
    if kind == "int8":
        return Int8Tensor(rng.integers(-128, 128, (rows, cols), dtype=np.int8), np.float32(rng.uniform(1e-3, 1)))
    if kind == "Q8_0 blocks":
        blocks = rng.integers(0, 256, (rows, cols // 32, 34), dtype=np.uint8)
        d = rng.choice(np.concatenate([SPECIAL_F16, np.float16(rng.uniform(-0.1, 0.1, 8))]), (rows, cols // 32))
        blocks[..., :2] = d.astype("<f2").view(np.uint8).reshape(rows, cols // 32, 2)
        return Q8_0Tensor(blocks)
    if kind == "Q4_K as stored":
        return Q4_KTensor.from_raw(special_q4_k(rows, cols, rng), (rows, cols))
    if kind == "Q5_0 as stored":
        return Q5_0Tensor.from_raw(random_raw("Q5_0", rows, cols, rng, 0.5), (rows, cols))
    if kind == "Q4_1 as stored":
        return Q4_1Tensor.from_raw(special_q4_1(rows, cols, rng), (rows, cols))
    return AffineTensor.from_raw(random_raw(kind, rows, cols, rng, 0.5), GGML_TYPE_IDS[kind], (rows, cols))


@ISA
@pytest.mark.parametrize("kind", ["int8", "Q8_0 blocks", "Q4_K as stored", "Q5_0 as stored", "Q4_1 as stored",
                                  *AFFINE_TYPES])
@pytest.mark.parametrize("rows, cols", [(1, 256), (15, 512), (17, 256), (40, 768)])
def test_q8_gemm_is_the_gemv_at_every_position(isa, kind, rows, cols):
    """The q8 GEMM (the avx512 module: panels of 16 rows, 4 positions at a
    time, integer sums by vpdpbusd) gives at every position the bits of the
    one-position GEMV (k_dot_*_q8) and of the reference's Q8Matrix: rows
    that end in part of a panel, 2 to 9 positions (a last group of 1 to 3),
    every layout and record size, activations at +-127 against levels of
    -128 (the largest integer sums)."""
    from gemma_cy.quant.tensors import quantize_activations_q8
    from gemma_cy_reference.q8 import Q8Matrix

    m = kernels(isa)
    rng = np.random.default_rng(rows * 1000 + cols + len(kind))
    w = q8_gemm_matrix(kind, rows, cols, rng)
    reference = Q8Matrix(w)
    x = rng.uniform(-1, 1, (9, cols)).astype(np.float32)
    x[0] = np.where(np.arange(cols) % 2, 3.0, -3.0)  # every q = +-127
    steps = np.stack([m.gemm(w, x[i:i + 1], activations="q8")[0] for i in range(9)])
    for i in range(9):
        np.testing.assert_array_equal(steps[i].view(np.uint32), (reference @ x[i]).view(np.uint32),
                                      err_msg=f"{isa} {kind} GEMV position {i}")
    for n in (2, 3, 4, 5, 9):
        block = m.gemm(w, x[:n], activations="q8")
        np.testing.assert_array_equal(block.view(np.uint32), steps[:n].view(np.uint32),
                                      err_msg=f"{isa} {kind} {n} positions")
    assert quantize_activations_q8(x[0])[0].min() == -127


@ISA
@pytest.mark.parametrize("name", [n for n in AFFINE_TYPES if GGML_TYPES[GGML_TYPE_IDS[n]].block_size == 32])
@pytest.mark.parametrize("cols", [32, 96, 160])
def test_q8_mode_rows_of_an_odd_number_of_records(isa, name, cols):
    """Rows of 1, 3 or 5 records of 32 (the x86 kernels reduce two records
    at a time, then a last one alone): the q8 GEMV and GEMM give the
    reference's Q8Matrix bits at every position."""
    m = kernels(isa)
    rng = np.random.default_rng(cols + len(name))
    t = GGML_TYPES[GGML_TYPE_IDS[name]]
    tensor = AffineTensor.from_raw(random_raw(name, 7, cols, rng, 0.5), t.id, (7, cols))
    reference = Q8Matrix(tensor)
    x = rng.uniform(-1, 1, (5, cols)).astype(np.float32)
    block = m.gemm(tensor, x, activations="q8")
    for i in range(x.shape[0]):
        want = (reference @ x[i]).view(np.uint32)
        np.testing.assert_array_equal(m.gemm(tensor, x[i:i + 1], activations="q8")[0].view(np.uint32), want,
                                      err_msg=f"{isa} {name} GEMV position {i}")
        np.testing.assert_array_equal(block[i].view(np.uint32), want, err_msg=f"{isa} {name} GEMM position {i}")


def test_q4_k_tensor_refuses_bytes_that_do_not_hold_it():
    raw = np.zeros(144 * 2, np.uint8)
    with pytest.raises(ValueError, match="do not hold"):
        Q4_KTensor.from_raw(raw, (3, 256))
    with pytest.raises(ValueError, match="multiple of 256"):
        Q4_KTensor.from_raw(raw, (1, 288))


def special_q5_0(rows: int, cols: int, rng) -> np.ndarray:
    """Random Q5_0 blocks whose f16 d is drawn from the extremes as well
    (zero, subnormal, the largest finite, negative), the first block holding
    every level -16..15 in order (the rest random qh and qs bytes)."""
    raw = rng.integers(0, 256, (rows * cols // 32, 22), dtype=np.uint8)
    special = np.array([0.0, 2.0 ** -24, 3 * 2.0 ** -20, 6.1e-5, 65504.0, -1.5, 1e-3], np.float16)
    d = rng.uniform(-0.05, 0.05, raw.shape[0]).astype(np.float16)
    pick = rng.random(raw.shape[0]) < 0.3
    d[pick] = rng.choice(special, int(pick.sum()))
    raw[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    raw[0, 2:6] = np.array([0xFFFF0000], "<u4").view(np.uint8)  # values 16..31 have the high bit
    raw[0, 6:22] = np.arange(16, dtype=np.uint8) * 17  # value j and 16 + j: nibble j
    return raw.reshape(rows, -1)


@ISA
@pytest.mark.parametrize("rows, cols, positions", [(1, 32, 1), (2, 64, 5), (3, 96, 9), (257, 640, 70), (5, 1024, 1)])
def test_q5_0_as_stored_is_its_q8_0_blocks_bit_for_bit(isa, rows, cols, positions):
    """A Q5_0 matrix read from its blocks (QLAYOUT_Q5_0: the decode GEMV
    unpacks the levels in registers, and so do the avx2 and avx512 GEMMs;
    the other GEMMs, the q8 mode and the row lookup turn tiles of 256 rows
    into Q8_0 blocks) gives the bits its Q8_0
    conversion gives, in both activation modes, past a tile of rows and a
    pass of positions, and so does the reference's q8 matrix; its weights
    are the gguf package's."""
    import gguf

    m = kernels(isa)
    rng = np.random.default_rng(rows * 7 + cols)
    raw = special_q5_0(rows, cols, rng)
    stored = Q5_0Tensor.from_raw(raw, (rows, cols))
    converted = Q8_0Tensor(to_q8_0(raw, GGML_TYPE_IDS["Q5_0"], (rows, cols)))
    theirs = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType.Q5_0).reshape(rows, cols)
    np.testing.assert_array_equal(stored.dequantize().view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    assert np.array_equal(stored.qs[0, 0], np.arange(-16, 16))
    x = rng.uniform(-1, 1, (positions, cols)).astype(np.float32)
    decoded_q8 = assert_gemm_bits_equal(m, stored, converted, x, isa)
    np.testing.assert_array_equal((Q8Matrix(stored) @ x[-1]).view(np.uint32), decoded_q8.view(np.uint32))
    for r in sorted({0, rows // 2, rows - 1}):  # an embedding lookup
        np.testing.assert_array_equal(m.matrix_row(stored, r).view(np.uint32), stored.row(r).view(np.uint32))


def test_q5_0_tensor_refuses_what_does_not_hold_a_matrix():
    raw = np.zeros(22 * 2, np.uint8)
    with pytest.raises(ValueError, match="do not hold"):
        Q5_0Tensor.from_raw(raw, (3, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q5_0Tensor.from_raw(raw, (1, 48))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q5_0Tensor.from_raw(raw, (64,))
    with pytest.raises(TypeError, match="uint8 blocks"):
        Q5_0Tensor(np.zeros((2, 1, 34), np.uint8))
    with pytest.raises(ValueError, match="Q5_0 blocks must be C-contiguous"):  # the kernels' boundary
        kernels("generic").gemm(Q5_0Tensor(np.zeros((2, 2, 22), np.uint8)[:, ::2]), np.zeros((1, 32), np.float32))


def test_q8_mode_refuses_f32_matrices():
    from gemma_cy.quant.tensors import F32Tensor

    with pytest.raises(ValueError, match="q8 activations run integer matrices, not f32 ones"):
        kernels("generic").gemm(F32Tensor(np.zeros((2, 64), np.float32)), np.zeros((1, 64), np.float32),
                                activations="q8")


# ---------------------------------------------------------------------------
# A whole model of every type, through a GGUF file

# Gemma 3's switches with every matrix width a multiple of 256 (the K-quants'
# blocks): a 4-position window on layer 0, tied embeddings.
CONFIG = ModelConfig(
    n_layers=2, dim=256, n_heads=2, n_kv_heads=1, head_dim=128, mlp_dim=512, vocab_size=96,
    max_seq_len=64, activation="gelu_tanh", rope_pairing="half_split", rope_base=1e6,
    rope_base_local=1e4, norm_gain="plain", position_table=False,
    embed_scale=float(np.float32(math.sqrt(256))), qk_norm=True, post_norms=True,
    sliding_window=4, sliding_window_pattern=2, tied_embeddings=True)
IDS = [2, 17, 90, 0, 42, 42, 9, 31, 5, 20, 64, 1]


def write_model_gguf(path, kinds: tuple[str, ...], matrix, seed: int) -> dict[str, str]:
    """A GGUF file of CONFIG: F32 gains near 1, and matrix i (in file order)
    of type kinds[i % len(kinds)], its data ``matrix(kind, name, shape, rng)``.
    Returns {Weights name: type}."""
    rng = np.random.default_rng(seed)
    tensors, types = [], {}
    matrices = [n for n, s in expected_shapes(CONFIG).items() if len(s) == 2]
    for name, shape in expected_shapes(CONFIG).items():
        dims = tuple(reversed(shape))
        if len(shape) == 1:
            gain = (1 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
            tensors.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["F32"], dims, gain))
            continue
        kind = kinds[matrices.index(name) % len(kinds)]
        tensors.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS[kind], dims, matrix(kind, name, shape, rng)))
        types[name] = kind
    assert set(types.values()) == set(kinds)
    write_gguf(path, gemma3_gguf_fields(CONFIG), tensors)
    return types


def weight_scale(name: str, shape) -> float:
    """Weights of about this size keep the activations O(1)."""
    return 1.0 if name == "embed_tokens" else 1.0 / math.sqrt(shape[1])


@pytest.fixture(scope="module")
def every_type_gguf(tmp_path_factory):
    """A GGUF file whose matrices cycle through every integer block type."""
    path = tmp_path_factory.mktemp("affine") / "every_type.gguf"
    types = write_model_gguf(path, AFFINE_TYPES, lambda kind, name, shape, rng: random_raw(
        kind, shape[0], shape[1], rng, 2.0 * weight_scale(name, shape)).reshape(-1), seed=11)
    return path, types


def test_every_matrix_is_read_as_the_file_stores_it(every_type_gguf):
    import gguf

    path, types = every_type_gguf
    weights = read_gguf(path)
    reader = gguf.GGUFReader(str(path))
    theirs = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    for name, kind in types.items():
        t = weights[name]
        held = {"Q8_0": Q8_0Tensor, "Q4_0": Q8_0Tensor, "Q5_0": Q5_0Tensor, "Q4_K": Q4_KTensor,
                "Q4_1": Q4_1Tensor}.get(kind, AffineTensor)
        assert isinstance(t, held), (name, kind, type(t))
        ours = t.dequantize()
        want = np.asarray(theirs[gguf_tensor_name(name)], np.float32).reshape(ours.shape)
        np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32), err_msg=f"{name} ({kind})")


@pytest.fixture(params=["every_type_gguf", "float_gguf"])
def model_gguf(request):
    """Each test model's GGUF path: every integer block type, then F32/F16/BF16."""
    return request.getfixturevalue(request.param)[0]


@ISA
def test_model_each_op_matches_the_reference(isa, model_gguf):
    check_each_op_against_the_reference(read_gguf(model_gguf), IDS, isa)


@ISA
def test_model_greedy_tokens_identical(isa, model_gguf):
    greedy_both(read_gguf(model_gguf), IDS, 40, isa)


@ISA
def test_every_type_model_in_q8_mode_fast_equals_reference(isa, every_type_gguf):
    """--activations q8 on the every-type model: 40 greedy tokens identical
    on both engines, every step's logits within tolerance (their matrix
    products agree bit for bit; the other ops differ in f32 order only)."""
    weights = read_gguf(every_type_gguf[0])
    greedy_engines_agree(make_engine("reference", weights, 64, "q8"), FastEngine(weights, 64, isa, activations="q8"),
                         IDS, 40, f"{isa} q8")


def test_a_type_without_integer_blocks_is_one_error_naming_the_tensor(tmp_path):
    """An IQ4_NL matrix (a non-linear code book, not integer levels): one
    ModelFormatError naming the tensor and its type."""
    rng = np.random.default_rng(2)
    tensors = []
    for name, shape in expected_shapes(CONFIG).items():
        dims = tuple(reversed(shape))
        if len(shape) == 1:
            tensors.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["F32"], dims, np.ones(shape, np.float32)))
        elif name == "layers.1.up_proj":
            raw = rng.integers(0, 256, (shape[0] * shape[1] // 32, 18), dtype=np.uint8)
            raw[:, :2] = np.full(raw.shape[0], 0.01, "<f2").view(np.uint8).reshape(-1, 2)
            tensors.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["IQ4_NL"], dims, raw.reshape(-1)))
        else:
            raw = random_raw("Q8_0", shape[0], shape[1], rng, 0.1)
            tensors.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["Q8_0"], dims, raw.reshape(-1)))
    path = tmp_path / "iq4.gguf"
    write_gguf(path, gemma3_gguf_fields(CONFIG), tensors)
    with pytest.raises(ModelFormatError, match=r"tensor 'blk\.1\.ffn_up\.weight' is IQ4_NL") as err:
        read_gguf(path)
    assert "\n" not in str(err.value)
    assert set(DECOMPOSERS) == {GGML_TYPE_IDS[n] for n in AFFINE_TYPES}


# ---------------------------------------------------------------------------
# Float matrices (F32 as mapped, F16 and BF16 widened to f32 at load, exactly)

@ISA
@pytest.mark.parametrize("rows", [1, 7])
def test_f32_matrix_gemv_and_gemm_against_float64(isa, rows):
    from gemma_cy.quant.tensors import F32Tensor

    m = kernels(isa)
    rng = np.random.default_rng(rows)
    w = rng.uniform(-1, 1, (rows, 200)).astype(np.float32)  # a width that is not a multiple of 32
    x = rng.uniform(-1, 1, (9, 200)).astype(np.float32)
    block = m.gemm(F32Tensor(w), x)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(block - want) <= bound(w, x) + 4 * U * np.abs(want))
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(m.gemm(F32Tensor(w), x[i:i + 1])[0], block[i])


def float_matrix(kind: str, name: str, shape, rng) -> np.ndarray:
    w = (rng.standard_normal(shape) * weight_scale(name, shape)).astype(np.float32)
    return {"F32": w, "F16": w.astype("<f2"), "BF16": (w.view("<u4") >> 16).astype("<u2")}[kind]


@pytest.fixture(scope="module")
def float_gguf(tmp_path_factory):
    """A GGUF file whose matrices cycle through F32, F16 and BF16."""
    path = tmp_path_factory.mktemp("float") / "float.gguf"
    return path, write_model_gguf(path, ("F32", "F16", "BF16"), float_matrix, seed=5)


def test_float_matrices_are_read_as_the_file_stores_them(float_gguf):
    import gguf

    from gemma_cy.quant.tensors import F32Tensor

    path, kinds = float_gguf
    weights = read_gguf(path)
    theirs = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for name, kind in kinds.items():
        t = weights[name]
        assert isinstance(t, F32Tensor) and t.data.dtype == np.float32, (name, kind)
        raw = theirs[gguf_tensor_name(name)]
        want = np.asarray(gguf.quants.dequantize(raw.data, raw.tensor_type), np.float32).reshape(t.shape)
        np.testing.assert_array_equal(t.data.view(np.uint32), want.view(np.uint32), err_msg=f"{name} ({kind})")
    f32_name = next(n for n, k in kinds.items() if k == "F32")
    assert not weights[f32_name].data.flags.writeable  # F32: a read-only view of the map


def test_q8_mode_on_a_float_model_is_one_parameter_error(float_gguf):
    with pytest.raises(ParameterError, match=r"activations = 'q8' runs integer matrices; \S+ is an f32 matrix"):
        make_engine("fast", read_gguf(float_gguf[0]), 32, "q8")
