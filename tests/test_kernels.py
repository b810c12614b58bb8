"""The kernels of every SIMD module this CPU runs (gemma_cy.fast.simd_<isa>, picked
by gemma_cy.fast.ops), each against a NumPy computation written here in float64.

Tolerances are those of docs/numerics.md#tolerances, |actual - expected| <= atol + rtol*|expected|:
default 2e-3 / 1e-3; softmax and the SiLU/GELU gating 1e-4 / 1e-5;
dequantized rows and residual adds exact.

The dot products and GEMVs (int8, Q8_0) sum n f32 products in an order
that differs from float64's, so their error grows with n and with the size
of the terms. They are judged by a bound derived from that (``sum_bound``:
what any summation order with the modules' longest path can lose, relative
to the sum of the terms' magnitudes), which is far tighter than a fixed
atol on long rows: at 10,240 columns it catches a dropped 32-value block
(test_sum_bound_catches_a_dropped_block), where the default atol did not.

Buffers around the data are filled with NaN (f32) and 0x7F (int8), so a
kernel that reads past its end gets a wrong answer here; the guard-page test
makes such a read fault outright.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gemma_cy.fast import ops
from gemma_cy.model.tolerance import DEFAULT, PROBABILITIES

from helpers import AVAILABLE, ISA, kernels

ATOL, RTOL = DEFAULT  # docs/numerics.md#tolerances, default
ATOL_ACT, RTOL_ACT = PROBABILITIES  # docs/numerics.md#tolerances, softmax and SiLU/GELU
U = 2.0 ** -24  # unit roundoff of f32
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])



def assert_close(actual, expected, atol=ATOL, rtol=RTOL):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def dot_error_bound(n: int, x_max: float, w_max: float) -> float:
    """Worst-case |f32 result - exact| of any module's int8 dot over n terms
    with |x| <= x_max and |q * scale| <= w_max.

    Each term's rounding error is at most (additions on its path + 2) * u *
    |term| (one product, one final scaling). n/8 + 3 + 7 bounds every
    module's path: n/32 per lane in the generic and AVX2 modules (plus up to
    3 eight-value steps and 2 to join their four accumulators), n/64 in the
    AVX-512 one, then 3 to add the 8 lanes and up to 7 tail terms.
    """
    path = n / 8 + 3 + 7 + 2
    return path * U * n * x_max * w_max


def sum_bound(abs_sum, n: int, lanes: int = 8):
    """Bound on |f32 result - exact| of a dot product of n terms whose
    magnitudes add up to ``abs_sum``: each term's path has at most
    n/lanes + 12 additions (see dot_error_bound: the int8 and Q8_0 kernels
    keep 32 partial sums or more, ``lanes=32``; the f32 dot 8), plus at most
    two more roundings (its product, a block or row scaling) and the
    result's: (n/lanes + 15) * u * abs_sum, and half an ulp of the smallest
    subnormal per product."""
    return (n / lanes + 15) * U * np.asarray(abs_sum, np.float64) + n * 2.0 ** -149


def assert_dot_close(actual, w: np.ndarray, x: np.ndarray, lanes: int = 32) -> None:
    """``actual`` (f32) against w @ x in float64, within ``sum_bound``:
    w (n,) or (rows, n) the dequantized weights in float64, x (n,)."""
    w64, x64 = np.asarray(w, np.float64), np.asarray(x, np.float64)
    expected = w64 @ x64
    bound = sum_bound(np.abs(w64) @ np.abs(x64), x64.size, lanes)
    err = np.abs(np.asarray(actual, np.float64) - expected)
    assert np.all(err <= bound), f"max error {np.max(err):.3g} over a bound of {np.min(bound):.3g} .. {np.max(bound):.3g}"


def int8_at(values: np.ndarray, offset: int) -> np.ndarray:
    """``values`` copied into a larger int8 buffer starting ``offset`` bytes
    past a 64-byte boundary (rows in GMW1 files start at any address); the
    rest of the buffer holds 0x7F, so a read past either end shows."""
    buf = np.full(values.size + 128, 0x7F, np.int8)
    start = (-buf.ctypes.data) % 64 + offset
    view = buf[start:start + values.size].reshape(values.shape)
    view[...] = values
    return view


def f32_at(values: np.ndarray, offset: int) -> np.ndarray:
    """``values`` copied into a larger f32 buffer ``offset`` items past a
    64-byte boundary (so loads start at every position within a vector); the
    rest of the buffer holds NaN, so a read past either end shows."""
    buf = np.full(values.size + 32, np.nan, np.float32)
    start = (-buf.ctypes.data) % 64 // 4 + offset
    view = buf[start:start + values.size].reshape(values.shape)
    view[...] = values
    return view


def arrays(dtype, shape, elements=None):
    """A hypothesis array strategy whose every entry is drawn on its own
    (``fill=st.nothing()``): hypothesis' default fills most of a large array
    with one value, which hides lane, order and pairing bugs. Special values
    still come, entry by entry, from ``elements``."""
    return hnp.arrays(dtype, shape, elements=elements, fill=st.nothing())


def read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# ---------------------------------------------------------------------------
# int8 dot product and GEMV

X_MAX, W_MAX, N_MAX = 2.0, 1.0, 300  # dot_error_bound(300, 2, 1) ~ 1.8e-3 <= ATOL


def i8_f64(q: np.ndarray, x: np.ndarray, scale) -> np.ndarray:
    """The int8 dot product or GEMV, (q @ x) * scale, computed in float64."""
    return (q.astype(np.float64) @ x.astype(np.float64)) * np.float64(scale)


def test_dot_value_ranges_keep_the_default_tolerance():
    assert dot_error_bound(N_MAX, X_MAX, W_MAX) <= ATOL
    assert all(dot_error_bound(n, 1.0, 2 / np.sqrt(n)) <= ATOL for n in (640, 1152, 2048))


@ISA
def test_dot_i8_every_length(isa):
    """Lengths 0..200 cover 2N around every vector width and step (8, 16, 32,
    64) and every tail; starts cycle through the 64 byte offsets."""
    m = kernels(isa)
    rng = np.random.default_rng(1)
    for n in range(201):
        q = int8_at(rng.integers(-128, 128, n).astype(np.int8), (7 * n) % 64)
        x = f32_at(rng.uniform(-X_MAX, X_MAX, n).astype(np.float32), n % 16)
        scale = np.float32(W_MAX / 128)
        assert_dot_close(m.dot_i8(q, x, scale), q.astype(np.float64) * np.float64(scale), x)


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), q_offset=st.integers(0, 63), x_offset=st.integers(0, 15),
       scale=st.floats(1e-4, W_MAX / 128).map(np.float32))
def test_dot_i8_matches_numpy(isa, data, n, q_offset, x_offset, scale):
    q = data.draw(arrays(np.int8, n))
    x = data.draw(arrays(np.float32, n, elements=st.floats(-X_MAX, X_MAX, width=32)))
    q, x = read_only(int8_at(q, q_offset)), read_only(f32_at(x, x_offset))
    assert_dot_close(kernels(isa).dot_i8(q, x, scale), q.astype(np.float64) * np.float64(scale), x)


# Drawn GEMV cases: any shape (rows not a multiple of 4, column tails), the
# matrix read-only at any byte offset, the weights and inputs in the ranges of
# dot_error_bound.
GEMV_I8_CASES = given(data=st.data(), rows=st.integers(1, 24), cols=st.integers(1, N_MAX),
                      offset=st.integers(0, 63), scale=st.floats(1e-4, W_MAX / 128).map(np.float32))


def draw_gemv_i8(data, rows: int, cols: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(q (rows, cols) read-only at ``offset``, x (cols,) read-only) of one drawn case."""
    q = read_only(int8_at(data.draw(arrays(np.int8, (rows, cols))), offset))
    x = read_only(data.draw(arrays(np.float32, cols, elements=st.floats(-X_MAX, X_MAX, width=32))))
    return q, x


@ISA
@SETTINGS
@GEMV_I8_CASES
def test_gemv_i8_matches_numpy(isa, data, rows, cols, offset, scale):
    """Read-only matrix at any byte offset; out written in its slot only."""
    q, x = draw_gemv_i8(data, rows, cols, offset)
    slots = np.full(rows + 2, 7.0, np.float32)
    out = kernels(isa).gemv_i8(q, scale, x, slots[1:-1])
    assert out.base is slots
    assert_dot_close(out, q.astype(np.float64) * np.float64(scale), x)
    assert slots[0] == 7.0 and slots[-1] == 7.0


@ISA
@pytest.mark.parametrize("rows, cols", [(64, 640), (40, 1152), (32, 2048)])
def test_gemv_i8_model_widths(isa, rows, cols):
    """Model-sized rows (Gemma 3 270M / 1B widths up to 2048), |x| <= 1, weights up to
    2/sqrt(cols): the default atol holds for these (see dot_error_bound)."""
    rng = np.random.default_rng(cols)
    q = read_only(int8_at(rng.integers(-128, 128, (rows, cols)).astype(np.int8), 3))
    x = rng.uniform(-1, 1, cols).astype(np.float32)
    scale = np.float32(2 / np.sqrt(cols) / 128)
    assert_dot_close(kernels(isa).gemv_i8(q, scale, x), q.astype(np.float64) * np.float64(scale), x)


@ISA
@pytest.mark.parametrize("resident", [False, True])
def test_gemv_i8_rows_are_dot_products(isa, resident):
    """One kernel, one order: each row of the GEMV equals dot_i8 bit for bit,
    whether the module runs it row by row or several rows at once (resident)."""
    m = kernels(isa)
    rng = np.random.default_rng(5)
    for rows, cols in [(13, 77), (8, 256), (3, 40), (9, 1000)]:
        q = int8_at(rng.integers(-128, 128, (rows, cols)).astype(np.int8), 1)
        x = rng.uniform(-1, 1, cols).astype(np.float32)
        out = m.gemv_i8(q, 0.003, x, resident=resident)
        assert [float(v) for v in out] == [m.dot_i8(q[r], x, 0.003) for r in range(rows)]


@ISA
@SETTINGS
@GEMV_I8_CASES
def test_gemv_i8_resident_matches_numpy(isa, data, rows, cols, offset, scale):
    """The in-cache kernel: any shape (rows not a multiple of 4, column tails), any offset."""
    q, x = draw_gemv_i8(data, rows, cols, offset)
    out = kernels(isa).gemv_i8(q, scale, x, resident=True)
    assert_dot_close(out, q.astype(np.float64) * np.float64(scale), x)


@ISA
def test_gemv_i8_empty(isa):
    m = kernels(isa)
    assert m.gemv_i8(np.zeros((0, 5), np.int8), 1.0, np.ones(5, np.float32)).shape == (0,)
    np.testing.assert_array_equal(m.gemv_i8(np.zeros((3, 0), np.int8), 1.0, np.ones(0, np.float32)), 0)
    assert m.dot_i8(np.zeros(0, np.int8), np.zeros(0, np.float32), 1.0) == 0.0


# ---------------------------------------------------------------------------
# Q8_0 (llama.cpp's blocks of 32 int8 with one f16 scale): dot, GEMV, dequantize
#
# A row is n_blocks blocks of 34 bytes (f16 d, then 32 int8 q), back to back;
# in a GGUF file the tensor starts 32-byte aligned but its rows and blocks
# start at any address, so the tests place them at every byte offset. The
# expected values are computed here in float64 from the bytes:
# sum_b f64(d_b) * sum_i q_b[i] * x[32 b + i].

Q8_0_BYTES = 34


def q8_0_blocks(rng: np.random.Generator, shape: tuple[int, ...], d_max: float) -> np.ndarray:
    """Random Q8_0 blocks uint8 (*shape, 34): q anywhere in int8, d uniform in
    [-d_max, d_max] rounded to f16."""
    blocks = np.empty(shape + (Q8_0_BYTES,), np.uint8)
    blocks[..., 2:] = rng.integers(0, 256, shape + (32,), dtype=np.uint8)
    d = rng.uniform(-d_max, d_max, shape).astype("<f2")
    blocks[..., :2] = d.reshape(shape + (1,)).view(np.uint8)
    return blocks


def bytes_at(values: np.ndarray, offset: int) -> np.ndarray:
    """``values`` (uint8) copied to a buffer ``offset`` bytes past a 64-byte boundary."""
    return int8_at(values.view(np.int8), offset).view(np.uint8)


def q8_0_f64(blocks: np.ndarray) -> np.ndarray:
    """The dequantized values of Q8_0 blocks (..., nb, 34) in float64 (..., nb * 32)."""
    d = blocks[..., :2].copy().view("<f2").astype(np.float64)  # (..., nb, 1)
    q = blocks[..., 2:].view(np.int8).astype(np.float64)  # (..., nb, 32)
    return (q * d).reshape(blocks.shape[:-2] + (-1,))


@ISA
def test_dequantize_q8_0_is_exact_for_every_f16_scale(isa):
    """All 65536 f16 bit patterns as block scales with q = 1, 0, -1: f32(d)
    exactly as NumPy converts it (subnormals, zeros, infinities, NaN)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    blocks = np.zeros((bits.size, Q8_0_BYTES), np.uint8)
    blocks[:, :2] = bits.astype("<u2").reshape(-1, 1).view(np.uint8)
    blocks[:, 2], blocks[:, 3] = 1, 0xFF  # q = 1, -1; the rest 0
    out = kernels(isa).dequantize_q8_0(read_only(blocks)).reshape(-1, 32)
    d = bits.view("<f2").astype(np.float32)
    finite = np.isfinite(d)
    with np.errstate(invalid="ignore"):
        for col, q in [(0, 1), (1, -1), (2, 0)]:
            expected = d * np.float32(q)
            np.testing.assert_array_equal(out[finite, col].view(np.uint32), expected[finite].view(np.uint32))
            np.testing.assert_array_equal(np.isnan(out[:, col]), np.isnan(expected))
            np.testing.assert_array_equal(out[~finite & ~np.isnan(d), col], expected[~finite & ~np.isnan(d)])


@ISA
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 40), offset=st.integers(0, 63))
def test_dequantize_q8_0_matches_the_codec(isa, seed, n_blocks, offset):
    """Bit for bit gemma_cy.quant.tensors.dequantize_q8_0 (what the reference uses), at any address."""
    from gemma_cy.quant.tensors import dequantize_q8_0
    blocks = read_only(bytes_at(q8_0_blocks(np.random.default_rng(seed), (n_blocks,), 1e3), offset))
    out = kernels(isa).dequantize_q8_0(blocks)
    np.testing.assert_array_equal(out.view(np.uint32), dequantize_q8_0(blocks).view(np.uint32))


@ISA
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_blocks=st.integers(1, 64), offset=st.integers(0, 63),
       x_offset=st.integers(0, 15))
def test_dot_q8_0_matches_numpy(isa, seed, n_blocks, offset, x_offset):
    """Rows of 32 .. 2048 values, any start address of the blocks and of x."""
    rng = np.random.default_rng(seed)
    n = 32 * n_blocks
    blocks = read_only(bytes_at(q8_0_blocks(rng, (n_blocks,), 1.0), offset))
    x = read_only(f32_at(rng.uniform(-1, 1, n).astype(np.float32), x_offset))
    assert_dot_close(kernels(isa).dot_q8_0(blocks, x), q8_0_f64(blocks), x)


@ISA
@SETTINGS
@given(data=st.data(), n_blocks=st.integers(1, 12), offset=st.integers(0, 63))
def test_dot_q8_0_drawn_values(isa, data, n_blocks, offset):
    """Values hypothesis draws (extremes of int8 and of the scale range included)."""
    n = 32 * n_blocks
    q = data.draw(arrays(np.int8, (n_blocks, 32)))
    d = data.draw(arrays(np.float16, n_blocks, elements=st.floats(-1.0, 1.0, width=16)))
    x = data.draw(arrays(np.float32, n, elements=st.floats(-X_MAX, X_MAX, width=32)))
    blocks = np.empty((n_blocks, Q8_0_BYTES), np.uint8)
    blocks[:, :2] = d.astype("<f2").reshape(-1, 1).view(np.uint8)
    blocks[:, 2:] = q.view(np.uint8)
    blocks = read_only(bytes_at(blocks, offset))
    assert_dot_close(kernels(isa).dot_q8_0(blocks, read_only(x)), q8_0_f64(blocks), x)


@ISA
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 24), n_blocks=st.integers(1, 24),
       offset=st.integers(0, 63))
def test_gemv_q8_0_matches_numpy(isa, seed, rows, n_blocks, offset):
    """Read-only matrix at any byte offset; out written in its slot only."""
    rng = np.random.default_rng(seed)
    n = 32 * n_blocks
    blocks = read_only(bytes_at(q8_0_blocks(rng, (rows, n_blocks), 1.0), offset))
    x = read_only(rng.uniform(-1, 1, n).astype(np.float32))
    slots = np.full(rows + 2, 7.0, np.float32)
    out = kernels(isa).gemv_q8_0(blocks, x, slots[1:-1])
    assert out.base is slots
    assert_dot_close(out, q8_0_f64(blocks), x)
    assert slots[0] == 7.0 and slots[-1] == 7.0


@ISA
@pytest.mark.parametrize("rows, cols", [(64, 640), (40, 1152), (32, 2048), (16, 4096), (8, 10240)])
def test_gemv_q8_0_model_widths(isa, rows, cols):
    """Model-sized rows (Gemma 3 widths, and past them), misaligned by 5
    bytes, with a real model's scale: weights up to ~2/sqrt(cols)."""
    rng = np.random.default_rng(cols)
    blocks = read_only(bytes_at(q8_0_blocks(rng, (rows, cols // 32), 2 / np.sqrt(cols) / 127), 5))
    x = rng.uniform(-1, 1, cols).astype(np.float32)
    assert_dot_close(kernels(isa).gemv_q8_0(blocks, x), q8_0_f64(blocks), x)


def test_sum_bound_catches_a_dropped_block():
    """The bound's power: at 10,240 columns, a result missing one 32-value
    block (a tail or pairing bug) is out of bounds in at least 7 rows of 8,
    each bug site tried; the default atol, with the weights shrunk until it
    held, missed it in 5 of 8."""
    rng = np.random.default_rng(10240)
    rows, cols = 8, 10240
    w = q8_0_f64(q8_0_blocks(rng, (rows, cols // 32), 2 / np.sqrt(cols) / 127))
    x = rng.uniform(-1, 1, cols)
    exact = w @ x
    bound = sum_bound(np.abs(w) @ np.abs(x), cols, lanes=32)
    for block in (0, 17, cols // 32 - 1):
        lost = w[:, 32 * block:32 * block + 32] @ x[32 * block:32 * block + 32]
        caught = np.abs((exact - lost) - exact) > bound
        assert caught.sum() >= 7, (block, lost, bound)


@ISA
def test_gemv_q8_0_rows_are_dot_products(isa):
    """One kernel, one order: each row of the GEMV equals dot_q8_0 bit for bit."""
    m = kernels(isa)
    rng = np.random.default_rng(6)
    for n_blocks in (1, 2, 3, 20):
        blocks = bytes_at(q8_0_blocks(rng, (9, n_blocks), 0.01), 3)
        x = rng.uniform(-1, 1, 32 * n_blocks).astype(np.float32)
        out = m.gemv_q8_0(blocks, x)
        assert [float(v) for v in out] == [m.dot_q8_0(blocks[r], x) for r in range(9)]


@ISA
def test_q8_0_empty(isa):
    m = kernels(isa)
    assert m.gemv_q8_0(np.zeros((0, 2, 34), np.uint8), np.ones(64, np.float32)).shape == (0,)
    np.testing.assert_array_equal(m.gemv_q8_0(np.zeros((3, 0, 34), np.uint8), np.ones(0, np.float32)), 0)
    assert m.dot_q8_0(np.zeros((0, 34), np.uint8), np.zeros(0, np.float32)) == 0.0
    assert m.dequantize_q8_0(np.zeros((0, 34), np.uint8)).shape == (0,)


# ---------------------------------------------------------------------------
# f32 dot (q.k), axpy (weighted sum of v), soft-cap


@ISA
def test_dot_f32_every_length(isa):
    """Lengths 0..100 cover the 8-lane step and every tail; starts cycle
    through the positions within a vector. Each is one attention score, bit
    for bit."""
    m = kernels(isa)
    rng = np.random.default_rng(2)
    for n in range(101):
        a = f32_at(rng.uniform(-X_MAX, X_MAX, n).astype(np.float32), n % 16)
        b = f32_at(rng.uniform(-1, 1, n).astype(np.float32), (3 * n) % 16)
        got = m.dot_f32(a, b)
        assert_dot_close(got, a, b, lanes=8)
        assert np.float32(got).view(np.uint32) == m.scores(a[None], b[None])[0, 0].view(np.uint32)


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), offset=st.integers(0, 15))
def test_dot_f32_matches_numpy(isa, data, n, offset):
    """Any values in |a| <= 2, |b| <= 1, judged by sum_bound."""
    a = read_only(f32_at(data.draw(arrays(np.float32, n, elements=st.floats(-X_MAX, X_MAX, width=32))),
                         offset))
    b = read_only(data.draw(arrays(np.float32, n, elements=st.floats(-W_MAX, W_MAX, width=32))))
    assert_dot_close(kernels(isa).dot_f32(a, b), a, b, lanes=8)


@ISA
@SETTINGS
@given(data=st.data(), m=st.integers(1, 5), n_keys=st.integers(1, 27), n=st.integers(0, 70))
def test_scores_do_not_depend_on_grouping(isa, data, m, n_keys, n):
    """Attention scores q . keys^T: every score has the same bits computed in
    one call (keys in groups of 8, the rest one by one), alone, or in a call
    that starts at another key; and it is the dot product (vs float64).
    Lengths around the 8-lane step and every odd tail."""
    mod = kernels(isa)
    q = data.draw(arrays(np.float32, (m, n), elements=st.floats(-X_MAX, X_MAX, width=32)))
    keys = data.draw(arrays(np.float32, (n_keys, n), elements=st.floats(-W_MAX, W_MAX, width=32)))
    got = mod.scores(read_only(q), read_only(keys))
    alone = np.array([[mod.scores(q[r:r + 1], keys[i:i + 1])[0, 0] for i in range(n_keys)] for r in range(m)],
                     np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), alone.view(np.uint32))
    start = data.draw(st.integers(0, n_keys - 1))
    np.testing.assert_array_equal(mod.scores(q, keys[start:]).view(np.uint32), got[:, start:].view(np.uint32))
    for r in range(m):
        assert_dot_close(got[r], keys, q[r], lanes=8)


@ISA
@SETTINGS
@given(data=st.data(), m=st.integers(1, 9), n_x=st.integers(1, 40), n=st.integers(1, 150),
       split=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))  # n_x past two passes of 16 x rows
def test_weighted_rows_is_repeated_axpy(isa, data, m, n_x, n, split, seed):
    """y + w . x matches NumPy; each row has the bits of the same row alone,
    and of the sum split in two calls at any row of x (attention splits a
    tile's value rows that way). The weights are drawn entry by entry; x and
    y (up to 7,000 values, more than hypothesis draws one by one) come from
    a seeded generator, every entry its own value and magnitude."""
    mod = kernels(isa)
    rng = np.random.default_rng(seed)
    w = read_only(data.draw(arrays(np.float32, (m, n_x), elements=st.floats(0, 1, width=32))))
    x = read_only(random_f32(rng, (n_x, n)))
    y = read_only(random_f32(rng, (m, n)))
    whole = mod.weighted_rows(w, x, y)
    exact = y.astype(np.float64) + w.astype(np.float64) @ x.astype(np.float64)
    # n_x products and n_x sums, each rounded once (or fused): each error at
    # most 2^-24 of the largest partial sum (<= |y| + |w| . |x|), or half the
    # smallest subnormal (2^-150) where the values are subnormal
    bound = 2 * n_x * (2.0 ** -24 * (np.abs(y) + np.abs(w).astype(np.float64) @ np.abs(x)) + 2.0 ** -150)
    assert np.all(np.abs(whole - exact) <= bound), np.max(np.abs(whole - exact) - bound)
    alone = np.stack([mod.weighted_rows(w[r:r + 1].copy(), x, y[r:r + 1].copy())[0] for r in range(m)])
    np.testing.assert_array_equal(whole, alone)
    split = min(split, n_x)
    first = mod.weighted_rows(np.ascontiguousarray(w[:, :split]), x[:split].copy(), y)
    both = mod.weighted_rows(np.ascontiguousarray(w[:, split:]), x[split:].copy(), first, out=first)
    assert both is first
    np.testing.assert_array_equal(both, whole)


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), offset=st.integers(0, 15), a=st.floats(-1, 1, width=32))
def test_axpy_matches_numpy(isa, data, n, offset, a):
    """y + a*x: one product and one sum per value (fused or not: within 1 ulp)."""
    x = read_only(f32_at(data.draw(arrays(np.float32, n, elements=finite)), offset))
    y = data.draw(arrays(np.float32, n, elements=finite))
    expected = y.astype(np.float64) + np.float64(a) * x.astype(np.float64)
    m = kernels(isa)
    assert_close(m.axpy(a, x, read_only(y.copy())), expected)
    assert m.axpy(a, x, y, out=y) is y
    assert_close(y, expected)


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), cap=st.sampled_from([1.5, 4.0, 30.0, 50.0]))
def test_softcap_matches_numpy(isa, data, n, cap):
    """cap * tanh(x / cap), scores far past the cap included."""
    x = read_only(data.draw(arrays(np.float32, n, elements=st.floats(-1e4, 1e4, width=32))))
    expected = cap * np.tanh(x.astype(np.float64) / cap)
    out = kernels(isa).softcap(x, cap)
    assert_close(out, expected, ATOL_ACT, RTOL_ACT)
    assert np.all(np.abs(out) <= cap)


# ---------------------------------------------------------------------------
# Norm, RoPE, softmax, gating, add, dequantize

finite = st.floats(-100, 100, width=32)


def random_f32(rng: np.random.Generator, shape) -> np.ndarray:
    """Every entry its own sign, digits and magnitude (1e-3 .. 1e2)."""
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 2, shape)).astype(np.float32)


@ISA
@SETTINGS
@given(data=st.data(), rows=st.integers(1, 4), n=st.integers(1, N_MAX), one_plus=st.booleans(),
       eps=st.sampled_from([1e-6, 1e-5]))
def test_rmsnorm_matches_numpy(isa, data, rows, n, one_plus, eps):
    x = read_only(data.draw(arrays(np.float32, (rows, n), elements=finite)))
    gain = read_only(data.draw(arrays(np.float32, n, elements=st.floats(-2, 2, width=32))))
    x64 = x.astype(np.float64)
    g64 = 1 + gain.astype(np.float64) if one_plus else gain.astype(np.float64)
    expected = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * g64
    m = kernels(isa)
    assert_close(m.rmsnorm(x, gain, eps, one_plus), expected)
    assert_close(m.rmsnorm(x[0], gain, eps, one_plus), expected[0])


def rope_f64(x: np.ndarray, pos: int, base: float, pairing: str) -> np.ndarray:
    """The rotation in float64, angles pos * base^(-2j/hd) in float64."""
    hd = x.shape[1]
    angle = pos * float(base) ** (-2.0 * np.arange(hd // 2) / hd)
    c, s = np.cos(angle), np.sin(angle)
    x = x.astype(np.float64)
    ia = np.arange(0, hd, 2) if pairing == "interleaved" else np.arange(hd // 2)
    ib = ia + 1 if pairing == "interleaved" else ia + hd // 2
    out = np.empty_like(x)
    out[:, ia] = x[:, ia] * c - x[:, ib] * s
    out[:, ib] = x[:, ia] * s + x[:, ib] * c
    return out


@ISA
@SETTINGS
@given(data=st.data(), n_heads=st.integers(1, 5), half=st.integers(1, 130),
       pos=st.integers(0, 40000), base=st.sampled_from([10000.0, 1e6, 500.0]),
       pairing=st.sampled_from(["interleaved", "half_split"]))
def test_rope_matches_numpy(isa, data, n_heads, half, pos, base, pairing):
    x = read_only(data.draw(arrays(np.float32, (n_heads, 2 * half), elements=st.floats(-10, 10, width=32))))
    assert_close(kernels(isa).rope(x, pos, base, pairing), rope_f64(x, pos, base, pairing))


@ISA
@pytest.mark.parametrize("pos, head_dim, base", [(0, 2, 10000.0), (7, 64, 10000.0), (32767, 256, 1e6),
                                                 (511, 256, 10000.0)])
def test_rope_cos_sin_is_f64_rounded_once(isa, pos, head_dim, base):
    """cos/sin of the f64 angles, rounded once to f32 (as the reference):
    equal up to the last bit (libm and NumPy may differ by one f64 ulp)."""
    angle = pos * float(base) ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    cos_t, sin_t = kernels(isa).rope_cos_sin(pos, head_dim, base)
    np.testing.assert_array_max_ulp(cos_t, np.cos(angle).astype(np.float32), maxulp=1)
    np.testing.assert_array_max_ulp(sin_t, np.sin(angle).astype(np.float32), maxulp=1)


def softmax_f64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


@ISA
@SETTINGS
@given(data=st.data(), rows=st.integers(1, 3), n=st.integers(1, N_MAX))
def test_softmax_matches_numpy(isa, data, rows, n):
    x = read_only(data.draw(arrays(np.float32, (rows, n), elements=st.floats(-50, 50, width=32))))
    assert_close(kernels(isa).softmax(x), softmax_f64(x), ATOL_ACT, RTOL_ACT)


@ISA
def test_softmax_masked_scores(isa):
    """-inf scores (masked positions) get probability 0."""
    x = np.array([[1.0, -np.inf, 3.0, -np.inf], [-np.inf, -np.inf, 0.5, -np.inf]], np.float32)
    out = kernels(isa).softmax(x)
    assert_close(out, softmax_f64(x), ATOL_ACT, RTOL_ACT)
    assert out[0, 1] == 0 and out[1, 2] == 1


def silu_f64(g):
    return g / (1 + np.exp(-g))


def gelu_tanh_f64(g):
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), act=st.sampled_from(["silu", "gelu_tanh"]))
def test_gating_matches_numpy(isa, data, n, act):
    """act(gate) * up, gates past exp's f32/f64 overflow included."""
    gate = read_only(data.draw(arrays(np.float32, n, elements=st.one_of(
        st.floats(-20, 20, width=32), st.sampled_from([-1e4, -800.0, -90.0, 90.0, 800.0, 1e4])))))
    up = read_only(data.draw(arrays(np.float32, n, elements=st.floats(-10, 10, width=32))))
    m = kernels(isa)
    fn, ref = (m.silu_mul, silu_f64) if act == "silu" else (m.gelu_tanh_mul, gelu_tanh_f64)
    with np.errstate(over="ignore"):
        expected = ref(gate.astype(np.float64)) * up
    assert_close(fn(gate, up), expected, ATOL_ACT, RTOL_ACT)


def gelu_tanh_exact_f64(g):
    """gelu_tanh in float64 to within a few f64 ulps, for the f32 ulp checks:
    0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), the same function without the
    cancellation of 1 + tanh(u) near -1, which leaves no digit of f64 for
    g < -5 (gelu_tanh_f64 gives 0 at g = -10, not -1.2e-37)."""
    u = np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)
    with np.errstate(over="ignore"):
        return g / (1 + np.exp(-2 * u))


def f32_ulps(actual: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|actual - exact| in units of the f32 spacing at exact (2^-149 among
    the subnormals): a correctly rounded f32 result is within 0.5."""
    a = np.abs(exact)
    _, e = np.frexp(a)
    ulp = np.where(a < 2.0 ** -126, 2.0 ** -149, np.ldexp(1.0, e - 24))
    return np.abs(actual.astype(np.float64) - exact) / ulp


# The activations are computed in f64 and rounded once, so each result is
# the correctly rounded f32 but within ~1e-6 ulp of a tie; 0.501 leaves that
# margin and still fails an f32 evaluation or a libm-free exp/tanh that is
# off by more than ~1e-11 relative.
ULP_ACT = 0.501
# Every 509th f32 in [0, 20] (a prime stride: every exponent and a spread of
# mantissas), ~2.2e6 gates a sign; past |g| = 20 silu is g or 0 to the last
# ulp, gelu_tanh already at |g| = 10.
GATE_SWEEP = np.arange(0, np.float32(20).view(np.uint32) + 1, 509, dtype=np.uint32)


@ISA
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gating_is_correctly_rounded_on_a_dense_sweep(isa, act):
    """act(gate) * up on every 509th f32 gate in [-20, 20] (up = 1, then
    random up): at most ULP_ACT f32 ulps from float64."""
    m = kernels(isa)
    fn, ref = (m.silu_mul, silu_f64) if act == "silu" else (m.gelu_tanh_mul, gelu_tanh_exact_f64)
    rng = np.random.default_rng(5)
    for sign in (0, 0x80000000):
        for chunk in np.array_split(GATE_SWEEP | np.uint32(sign), 4):
            gate = chunk.view(np.float32)
            with np.errstate(over="ignore"):
                exact = ref(gate.astype(np.float64))
            for up in (np.ones_like(gate), rng.uniform(-4, 4, gate.size).astype(np.float32)):
                err = f32_ulps(fn(gate, up), exact * up)
                worst = int(np.argmax(err))
                assert err[worst] <= ULP_ACT, f"gate {gate[worst]!r}, up {up[worst]!r}: {err[worst]:.4f} ulp"


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), act=st.sampled_from(["silu", "gelu_tanh"]))
def test_gating_is_correctly_rounded_on_any_f32(isa, data, n, act):
    """Any finite f32 gate (subnormals, the saturation around exp's f64
    range), |up| <= 1 so that the product stays an f32: at most ULP_ACT."""
    gate = read_only(data.draw(arrays(np.float32, n, elements=st.one_of(
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        st.floats(-720, -700, width=32), st.floats(-22, -20, width=32)))))
    up = read_only(data.draw(arrays(np.float32, n, elements=st.floats(-1, 1, width=32))))
    m = kernels(isa)
    fn, ref = (m.silu_mul, silu_f64) if act == "silu" else (m.gelu_tanh_mul, gelu_tanh_exact_f64)
    with np.errstate(over="ignore"):
        exact = ref(gate.astype(np.float64)) * up
    assert f32_ulps(fn(gate, up), exact).max() <= ULP_ACT


@ISA
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gating_special_values(isa, act):
    """NaN in gives NaN; +inf gate gives inf * up; -inf gate gives NaN (as the
    reference: -inf * 0); gates far below zero give the signed zero
    sign(g) sign(up) 0; a gate past the saturation is g * up exactly."""
    m = kernels(isa)
    fn = m.silu_mul if act == "silu" else m.gelu_tanh_mul
    f32 = np.finfo(np.float32)
    gate = np.array([np.nan, 1.0, np.inf, np.inf, -np.inf, 0.0, -0.0, -1e4, -f32.max, -800.0, -708.5, 1e4,
                     f32.max, f32.tiny, -f32.smallest_subnormal], np.float32)
    up = np.array([1.0, np.nan, 2.0, -3.0, 1.0, -1.0, 1.0, 1.0, -f32.max, 0.5, f32.max, -0.25,
                   0.5, 1.0, 1.0], np.float32)
    want = np.array([np.nan, np.nan, np.inf, -np.inf, np.nan, -0.0, -0.0, -0.0, 0.0, -0.0, -0.0, -2500.0,
                     f32.max / 2, f32.tiny / 2, -0.0], np.float32)
    got = fn(gate, up)
    np.testing.assert_array_equal(got, want)
    signed = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(want[signed]))


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), offset=st.integers(0, 15))
def test_add_is_exact(isa, data, n, offset):
    x = read_only(f32_at(data.draw(arrays(np.float32, n, elements=finite)), offset))
    y = read_only(data.draw(arrays(np.float32, n, elements=finite)))
    np.testing.assert_array_equal(kernels(isa).add(x, y), x + y)


@ISA
@SETTINGS
@given(data=st.data(), n=st.integers(1, N_MAX), offset=st.integers(0, 63),
       scale=st.floats(1e-9, 10).map(np.float32))
def test_dequantize_i8_is_exact(isa, data, n, offset, scale):
    """Bit for bit the reference's q.astype(f32) * f32(scale) (docs/numerics.md#bit-for-bit)."""
    q = read_only(int8_at(data.draw(arrays(np.int8, n)), offset))
    out = kernels(isa).dequantize_i8(q, scale)
    np.testing.assert_array_equal(out.view(np.uint32), (q.astype(np.float32) * scale).view(np.uint32))


@ISA
def test_out_in_place_equals_new_array(isa):
    """out=<an input> (in place) gives what a fresh out gives."""
    m = kernels(isa)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    y = rng.standard_normal(64).astype(np.float32)
    g = rng.standard_normal(64).astype(np.float32)
    cases = [
        (lambda a, out=None: m.rmsnorm(a, g, 1e-6, True, out), x),
        (lambda a, out=None: m.rope(a, 17, 10000.0, "half_split", out), x),
        (lambda a, out=None: m.softmax(a, out), x),
        (lambda a, out=None: m.silu_mul(a, y, out), x[0]),
        (lambda a, out=None: m.gelu_tanh_mul(y, a, out), x[1]),
        (lambda a, out=None: m.add(a, y, out), x[2]),
        (lambda a, out=None: m.add(y, a, out), x[3]),
    ]
    for fn, a in cases:
        fresh = fn(a.copy())
        inplace = a.copy()
        assert fn(inplace, out=inplace) is inplace
        np.testing.assert_array_equal(inplace, fresh)


# ---------------------------------------------------------------------------
# Argument validation (shared by every module; run on each anyway)


def _bad_calls(m):
    f = np.ones(8, np.float32)
    q = np.ones(8, np.int8)
    q2 = np.ones((4, 8), np.int8)
    h = np.ones((2, 8), np.float32)
    strided = np.ones(16, np.float32)[::2]
    unaligned = np.frombuffer(np.zeros(40, np.uint8).tobytes(), np.float32, count=8, offset=1)
    read_only_out = read_only(np.ones(4, np.float32))
    blocks = np.zeros((2, 34), np.uint8)
    f32 = np.ones(64, np.float32)
    return [
        (TypeError, lambda: m.dot_i8(f, f, 1.0)),  # q not int8
        (TypeError, lambda: m.dot_i8(q, q, 1.0)),  # x not f32
        (TypeError, lambda: m.dot_i8(list(q), f, 1.0)),  # not an ndarray
        (ValueError, lambda: m.dot_i8(q, f[:7], 1.0)),  # lengths differ
        (ValueError, lambda: m.dot_i8(q, strided, 1.0)),  # not contiguous
        (ValueError, lambda: m.dot_i8(q, unaligned, 1.0)),  # f32 at an odd byte address
        (TypeError, lambda: m.gemv_i8(q2.astype(np.int16), 1.0, f)),
        (TypeError, lambda: m.gemv_i8(q2, 1.0, f.astype(np.float64))),
        (ValueError, lambda: m.gemv_i8(q, 1.0, f)),  # q not 2-D
        (ValueError, lambda: m.gemv_i8(q2, 1.0, f[:5])),  # cols != len(x)
        (ValueError, lambda: m.gemv_i8(q2.T, 1.0, f[:4])),  # Fortran order
        (ValueError, lambda: m.gemv_i8(q2, 1.0, f, np.ones(3, np.float32))),  # out shape
        (ValueError, lambda: m.gemv_i8(q2, 1.0, f, read_only_out)),
        (TypeError, lambda: m.gemv_i8(q2, 1.0, f, np.ones(4, np.float64))),
        (ValueError, lambda: m.gemv_i8(np.ones((8, 8), np.int8), 1.0, f, f)),  # out is x
        (ValueError, lambda: m.rmsnorm(h, f[:5], 1e-6, False)),
        (ValueError, lambda: m.rmsnorm(np.ones((2, 2, 8), np.float32), f, 1e-6, False)),
        (TypeError, lambda: m.rmsnorm(h.astype(np.float16), f, 1e-6, False)),
        (ValueError, lambda: m.rope(f, 1, 10000.0, "interleaved")),  # not (heads, hd)
        (ValueError, lambda: m.rope(np.ones((2, 7), np.float32), 1, 10000.0, "interleaved")),  # odd hd
        (ValueError, lambda: m.rope(h, 1, 10000.0, "rotate_half")),
        (ValueError, lambda: m.softmax(h[:, ::2])),
        (ValueError, lambda: m.softmax(h, h[:, :4].copy())),
        (ValueError, lambda: m.silu_mul(f, f[:4])),
        (TypeError, lambda: m.gelu_tanh_mul(f, f.astype(np.float64))),
        (ValueError, lambda: m.add(h, h)),  # 1-D only
        (TypeError, lambda: m.dequantize_i8(np.ones(4, np.uint8), 1.0)),
        (TypeError, lambda: m.dot_f32(f, q)),
        (ValueError, lambda: m.dot_f32(f, f[:7])),
        (ValueError, lambda: m.dot_f32(strided, f)),
        (ValueError, lambda: m.axpy(1.0, f, f[:4])),
        (TypeError, lambda: m.axpy(1.0, q, f)),
        (ValueError, lambda: m.axpy(1.0, f, f.copy(), f)),  # out is x
        (ValueError, lambda: m.softcap(f, 0.0)),
        (ValueError, lambda: m.softcap(f, float("nan"))),
        (ValueError, lambda: m.softcap(h, 1.0)),  # 1-D only
        (TypeError, lambda: m.dot_q8_0(blocks.view(np.int8), f32)),  # blocks not uint8
        (ValueError, lambda: m.dot_q8_0(blocks[:, :33], f32)),  # not 34-byte blocks
        (ValueError, lambda: m.dot_q8_0(blocks, f32[:63])),  # 64 values, x has 63
        (ValueError, lambda: m.dot_q8_0(np.zeros((4, 34), np.uint8)[::2], f32)),  # not contiguous
        (ValueError, lambda: m.gemv_q8_0(blocks, f32)),  # not 3-D
        (ValueError, lambda: m.gemv_q8_0(blocks[None], f32[:32])),
        (TypeError, lambda: m.gemv_q8_0(blocks[None], f32.astype(np.float64))),
        (ValueError, lambda: m.gemv_q8_0(blocks[None], f32, np.ones(2, np.float32))),  # out shape
        (ValueError, lambda: m.dequantize_q8_0(blocks[None])),
        (ValueError, lambda: m.dequantize_q8_0(blocks, np.ones(63, np.float32))),
    ]


@ISA
def test_bad_arguments_raise(isa):
    m = kernels(isa)
    for error, call in _bad_calls(m):
        with pytest.raises(error):
            call()


@ISA
def test_out_sharing_memory_with_an_input_is_refused(isa):
    m = kernels(isa)
    buf = np.arange(12, dtype=np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        m.add(buf[0:8], buf[4:12].copy(), buf[2:10])  # overlaps x, is not x
    with pytest.raises(ValueError, match="shares memory"):
        m.gemv_i8(np.ones((6, 6), np.int8), 1.0, buf[0:6], buf[3:9])


# ---------------------------------------------------------------------------
# The facade


def test_ops_picks_the_best_available_module():
    forced = os.environ.get(ops.ENV_VAR, "").strip().lower()
    assert ops.ISA == (forced or AVAILABLE[0])
    assert "generic" in AVAILABLE
    assert ops.gemv_i8 is ops.module_for(ops.ISA).gemv_i8


def _import_ops_with(value: str) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            "try:\n    from gemma_cy.fast import ops\n"
            "except ValueError as error:\n    print(error)\n    sys.exit(3)\n"
            "print(ops.ISA)\n")
    env = dict(os.environ, **{ops.ENV_VAR: value})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_env_var_forces_each_available_module():
    for name in AVAILABLE:
        done = _import_ops_with(name.upper())
        assert (done.returncode, done.stdout.strip()) == (0, name), done.stderr


@pytest.mark.parametrize("name", [n for n in ops.ISAS if n not in AVAILABLE] + ["sse9"])
def test_env_var_naming_an_unusable_module_is_a_one_line_error(name):
    done = _import_ops_with(name)
    assert done.returncode == 3, done.stderr
    assert done.stdout.count("\n") == 1 and f"GEMMA_CY_SIMD={name}" in done.stdout
    with pytest.raises(ValueError):
        ops.module_for(name)


def test_only_modules_tested_on_their_hardware_are_chosen_automatically():
    """docs/architecture.md#isa-dispatch: the best runnable module whose tests
    have run on such a CPU; an experimental one (NEON until then) only when
    GEMMA_CY_SIMD names it."""
    assert ops.experimental("neon") and not any(ops.experimental(n) for n in ("avx512", "avx2", "generic"))
    assert ops.choose("", ["avx512", "avx2", "generic"]) == "avx512"
    assert ops.choose("", ["neon", "generic"]) == "generic"
    assert ops.choose("neon", ["neon", "generic"]) == "neon"
    with pytest.raises(ImportError, match="no tested kernel module"):
        ops.choose("", ["neon"])
    assert ops.ISA == (os.environ.get("GEMMA_CY_SIMD") or ops.choose("", ops.available()))


def test_avx512_without_vnni_runs_the_avx2_module(monkeypatch):
    """The avx512 module is built with -mavx512vnni (its q8 GEMM), so a CPU
    with AVX-512 F/BW/VL but no VNNI (Skylake-SP) must not pick it:
    ops.REQUIRES, docs/architecture.md#isa-dispatch."""
    features = {"avx2": True, "avx512": True, "vnni": False, "neon": False}
    monkeypatch.setattr(ops, "supported", lambda: features)
    monkeypatch.setattr(ops, "_built", lambda name: name != "neon")
    assert ops.available() == ["avx2", "generic"]
    assert ops.choose("", ops.available()) == "avx2"
    with pytest.raises(ValueError, match="cannot run the avx512 kernels"):
        ops.module_for("avx512")
    features["vnni"] = True
    assert ops.choose("", ops.available()) == "avx512"
