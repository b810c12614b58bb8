"""Q8_0, Q5_0, Q4_K, Q4_1 and affine-record matrices packed as 16-row panels (gemma_cy/fast/panels.py,
the avx512 module's q8 mode): every product and every looked-up row is the
matrix's own, bit for bit, for one position (decode), a few (a batch) and many
(prefill); the packing is exact for every level and every f16 scale; a
model in the q8 mode runs its Q8_0 matrices as panels and decodes the ids
it decodes without them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_cy.fast import ops
from gemma_cy.fast.panels import Q8Panels, can_pack
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor
from gemma_cy.quant.tensors import Q8_0Tensor, quantize_q8_0

if "avx512" not in ops.available():
    pytest.skip("Q8_0 panels are the avx512 module's (AVX-512 VNNI); this CPU runs "
                f"{', '.join(ops.available())}", allow_module_level=True)
AVX512 = ops.module_for("avx512")


def random_q8_0(rng, rows: int, cols: int) -> Q8_0Tensor:
    """Every level (-128 .. 127, as the file may store them) and finite f16 scales of every size."""
    blocks = rng.integers(0, 256, (rows, cols // 32, 34), dtype=np.uint8)
    scales = rng.uniform(-2.0, 2.0, (rows, cols // 32)) * 2.0 ** rng.integers(-20, 4, (rows, cols // 32))
    blocks[..., :2] = scales.astype(np.float16).view(np.uint8).reshape(rows, cols // 32, 2)
    return Q8_0Tensor(blocks)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def assert_products_and_rows_equal(p, t, rng, positions: int) -> None:
    """The panels ``p`` give the products of ``positions`` random rows of x
    (any magnitude) and the first and last rows of the matrix ``t`` itself,
    bit for bit."""
    rows, cols = t.shape
    x = (rng.standard_normal((positions, cols)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    assert same_bits(AVX512.gemm(p, x, "q8"), AVX512.gemm(t, x, "q8"))
    for row in (0, rows - 1):
        assert same_bits(AVX512.matrix_row(p, row), AVX512.matrix_row(t, row))


@settings(max_examples=40, deadline=None)
@given(panels=st.integers(1, 6), blocks=st.integers(1, 40), positions=st.integers(1, 19),
       seed=st.integers(0, 2**32 - 1))
def test_products_are_the_q8_0_matrix_bit_for_bit(panels, blocks, positions, seed):
    rng = np.random.default_rng(seed)
    t = random_q8_0(rng, 16 * panels, 32 * blocks)
    p = AVX512.q8_panels(t)
    assert isinstance(p, Q8Panels) and p.shape == t.shape
    x = (rng.standard_normal((positions, 32 * blocks)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    assert same_bits(AVX512.gemm(p, x, "q8"), AVX512.gemm(t, x, "q8"))


@settings(max_examples=30, deadline=None)
@given(panels=st.integers(1, 4), super_blocks=st.integers(1, 5), positions=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_q4_k_panels_are_the_q4_k_matrix_bit_for_bit(panels, super_blocks, positions, seed):
    """Every nibble, and sub-block scales and offsets of every size (the
    kernels read a, b as worked out at load, not the super-block's bytes)."""
    rng = np.random.default_rng(seed)
    rows, cols = 16 * panels, 256 * super_blocks
    ab = rng.standard_normal((rows, cols // 32, 2)) * 2.0 ** rng.integers(-20, 4, (rows, cols // 32, 2))
    t = Q4_KTensor(rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8), ab.astype(np.float32))
    p = AVX512.q8_panels(t)
    assert p.levels4 and p.panels.nbytes < t.blocks.nbytes + t.ab.nbytes  # 384 bytes per 16 x 32, not 416
    assert_products_and_rows_equal(p, t, rng, positions)


@settings(max_examples=30, deadline=None)
@given(panels=st.integers(1, 4), blocks=st.integers(1, 24), positions=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_q4_1_panels_are_the_q4_1_matrix_bit_for_bit(panels, blocks, positions, seed):
    """Every nibble, f16 scales d and offsets m of every size and sign (the
    panels hold a = f32(d), b = -f32(m)); decode, a batch's few positions and
    a prefill's many, against the Q4_1 matrix as stored."""
    rng = np.random.default_rng(seed)
    rows, cols = 16 * panels, 32 * blocks
    raw = rng.integers(0, 256, (rows, blocks, 20), dtype=np.uint8)
    dm = rng.uniform(-2.0, 2.0, (rows, blocks, 2)) * 2.0 ** rng.integers(-20, 4, (rows, blocks, 2))
    raw[..., :4] = dm.astype(np.float16).view(np.uint8).reshape(rows, blocks, 4)
    t = Q4_1Tensor(raw)
    p = AVX512.q8_panels(t)
    assert p.levels4 and p.panels.nbytes == rows * blocks * 24  # 384 bytes per 16 x 32
    assert_products_and_rows_equal(p, t, rng, positions)


@settings(max_examples=40, deadline=None)
@given(panels=st.integers(1, 4), blocks=st.integers(1, 24), positions=st.integers(1, 9),
       sub=st.sampled_from([16, 32]), offset=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_affine_panels_are_the_records_bit_for_bit(panels, blocks, positions, sub, offset, seed):
    """Records of 16 (Q6_K, Q3_K; Q2_K with offsets) and of 32 (Q5_K...):
    every int8 level, f32 a and b of every size and sign; the panels take the
    records' own bytes."""
    rng = np.random.default_rng(seed)
    rows, cols = 16 * panels, 32 * blocks
    n_sub, width = cols // sub, sub + (8 if offset else 4)
    records = rng.integers(0, 256, (rows, n_sub, width), dtype=np.uint8)
    scales = rng.standard_normal((rows, n_sub, (width - sub) // 4)) * 2.0 ** rng.integers(-20, 4, (rows, n_sub, 1))
    records[..., sub:] = scales.astype(np.float32).view(np.uint8).reshape(rows, n_sub, width - sub)
    t = AffineTensor(records, sub, offset, "test")
    p = AVX512.q8_panels(t)
    assert p.sub == sub and p.has_offset == offset and p.panels.nbytes == records.nbytes
    assert_products_and_rows_equal(p, t, rng, positions)


@settings(max_examples=40, deadline=None)
@given(panels=st.integers(1, 4), blocks=st.integers(1, 24), positions=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_q5_0_panels_are_the_q5_0_matrix_bit_for_bit(panels, blocks, positions, seed):
    """Every level (all 32 of each block's qs and qh bits drawn) and f16 d of
    every size; against the Q5_0 matrix as stored and its Q8_0 conversion."""
    rng = np.random.default_rng(seed)
    rows, cols = 16 * panels, 32 * blocks
    raw = rng.integers(0, 256, (rows, blocks, 22), dtype=np.uint8)
    d = rng.uniform(-2.0, 2.0, (rows, blocks)) * 2.0 ** rng.integers(-20, 4, (rows, blocks))
    raw[..., :2] = d.astype(np.float16).view(np.uint8).reshape(rows, blocks, 2)
    t = Q5_0Tensor(raw)
    p = AVX512.q8_panels(t)
    assert p.levels5 and p.panels.nbytes == rows * blocks * 24  # 384 bytes per 16 x 32, 352 as Q5_0
    assert_products_and_rows_equal(p, t, rng, positions)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    assert same_bits(AVX512.gemm(p, x, "q8"), AVX512.gemm(t.q8_0(), x, "q8"))  # the conversion's, too


def test_rows_look_up_as_the_q8_0_matrix():
    rng = np.random.default_rng(7)
    t = random_q8_0(rng, 64, 640)
    p = AVX512.q8_panels(t)
    for row in range(64):
        assert same_bits(AVX512.matrix_row(p, row), AVX512.matrix_row(t, row)), row


def test_what_cannot_be_packed_is_refused():
    rng = np.random.default_rng(1)
    assert not can_pack(random_q8_0(rng, 24, 64))  # not a multiple of 16 rows
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        AVX512.q8_panels(random_q8_0(rng, 24, 64))
    p = AVX512.q8_panels(random_q8_0(rng, 16, 64))
    with pytest.raises(ValueError, match="q8 activations only"):
        AVX512.gemm(p, np.zeros((1, 64), np.float32), "f32")


def test_a_quantized_matrix_packs_to_its_own_values():
    w = np.random.default_rng(3).standard_normal((32, 96)).astype(np.float32)
    t = Q8_0Tensor(quantize_q8_0(w))
    p = AVX512.q8_panels(t)
    rows = np.stack([AVX512.matrix_row(p, r) for r in range(32)])
    assert same_bits(rows, t.dequantize().astype(np.float32))


def test_a_q8_model_runs_its_q8_0_matrices_as_panels_and_decodes_the_same():
    """Gemma 3's switches (tests/test_forward_gguf.py's config), every
    matrix Q8_0 and a multiple of 16 rows: the avx512 engine's q8 mode holds
    them all as panels; prefilling a prompt in one block (four positions a
    pass) and decoding it one position at a time (the one-position kernel)
    give the same logits bit for bit, and the greedy ids of the reference's
    q8 mode."""
    from helpers import q8_0_weights
    from test_forward_gguf import Q8_CONFIG, Q8_IDS

    from gemma_cy.fast.engine import FastEngine
    from gemma_cy_reference.model import ReferenceEngine

    weights = q8_0_weights(Q8_CONFIG)
    matrices = [t for t in weights.tensors.values() if isinstance(t, Q8_0Tensor)]
    whole = FastEngine(weights, 64, "avx512", activations="q8")
    assert whole.model.panel_bytes == sum(t.blocks.nbytes // 34 * 36 for t in matrices)
    stepwise = FastEngine(weights, 64, "avx512", activations="q8")
    block = whole.prefill(Q8_IDS)
    for t in Q8_IDS:
        one = stepwise.prefill([t]) if t == Q8_IDS[0] else stepwise.decode(t)
    assert same_bits(np.asarray(block, np.float32), np.asarray(one, np.float32))
    reference = ReferenceEngine(weights, 64, "q8")
    want, got = reference.prefill(Q8_IDS), block
    for _ in range(16):
        token = int(np.argmax(want))
        assert int(np.argmax(got)) == token
        want, got = reference.decode(token), whole.decode(token)
    assert FastEngine(weights, 64, "avx512").model.panel_bytes == 0  # f32 activations: Q8_0 blocks as stored
