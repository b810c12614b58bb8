"""The opt-in int8-activation mode ("q8", docs/numerics.md#activation-modes) and the block GEMM.

q8: every matrix input is quantized to int8 per block of 32 before the
product, in the fast path (k_quantize_q8 + k_gemm_q8, each SIMD module this
CPU runs) and in the reference (gemma_cy.quant.tensors.quantize_activations_q8 +
reference.layers.Q8Matrix). The quantization and the products agree bit
for bit (exact integer block sums, each added by one f32 FMA in one order);
the other ops differ by f32 summation order only (docs/numerics.md#tolerances
tolerance). Greedy decoding must agree token for token.

Block GEMM: a prefill runs up to 64 positions per layer call; every (row,
position) product is the same dot product as a one-position step, so a
block equals decoding position by position, bit for bit.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gemma_cy.errors import ParameterError
from gemma_cy.generation.engines import make_engine
from gemma_cy.fast.engine import FastEngine
from gemma_cy.quant.ggml import Q5_0Tensor
from gemma_cy.quant.tensors import Q8_0Tensor, quantize_activations_q8, quantize_per_tensor, quantize_q8_0
from gemma_cy.generation.local_error import teacher_forced
from gemma_cy.model.tolerance import DEFAULT, tolerance_for
from gemma_cy.formats.gmw import read_gmw
from gemma_cy_reference.q8 import Q8Matrix, fma_f32
from gemma_cy_reference.model import ReferenceEngine

from helpers import AVAILABLE, ISA, assert_same_greedy_id, assert_within, cli, kernels

ATOL, RTOL = DEFAULT  # docs/numerics.md#tolerances, default
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def quantize_f64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The q8 rule computed independently of gemma_cy.quant.tensors: per block of 32,
    d = f32(max|x| / 127) and q = round-half-even(f32(x * f32(1/d))), in
    Python floats rounded to f32 at each step (finite x only)."""
    blocks = x.astype(np.float64).reshape(-1, 32)
    q = np.zeros(blocks.shape, np.int8)
    d = np.zeros(len(blocks), np.float32)
    for b, block in enumerate(blocks):
        d[b] = np.float32(max(abs(v) for v in block) / 127.0)
        with np.errstate(over="ignore"):  # 1/d may overflow f32 on purpose: q = 0 then
            inv = np.float32(1.0 / np.float64(d[b])) if d[b] != 0 else np.float32(0)
        inv = np.float32(0) if np.isinf(inv) else inv
        for i, v in enumerate(block):
            q[b, i] = int(np.rint(np.float64(np.float32(np.float32(v) * inv))))
    return q.reshape(-1), d


# ---------------------------------------------------------------------------
# The reference's FMA: the q8 products add each block's term by one f32 FMA


def _c_fmaf():
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype = ctypes.c_float
    libm.fmaf.argtypes = [ctypes.c_float] * 3
    return libm.fmaf


def _assert_fmaf(a, b, c):
    fmaf = _c_fmaf()
    got = fma_f32(a, b, c)
    want = np.array([fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], dtype=np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert not len(bad), f"fma_f32({a[bad[0]]!r}, {b[bad[0]]!r}, {c[bad[0]]!r}) = {got[bad[0]]!r}, fmaf {want[bad[0]]!r}"


def test_fma_f32_is_c_fmaf_where_rounding_twice_is_wrong():
    """a * b = 1 + 2^-11 + 2^-24, a tie between two f32 neighbours: a c of
    +-2^-80 decides it, which a sum rounded first to f64 (2^-80 lost) and
    then to f32 (ties to even) gets wrong half the time; also c that cancels
    a * b, and infinities and NaN."""
    a = np.float32(1 + 2 ** -12)
    tiny = np.float32(2 ** -80)
    xs = np.array([a, a, -a, -a, 3, 0, 2 ** 100, 1, np.nan], dtype=np.float32)
    ys = np.array([a, a, a, a, np.inf, np.inf, 2 ** 100, 1, 1], dtype=np.float32)
    zs = np.array([tiny, -tiny, tiny, -tiny, 1, 1, -1, -1, 0], dtype=np.float32)
    _assert_fmaf(xs, ys, zs)
    assert fma_f32(xs[:1], ys[:1], zs[:1])[0] != np.float32(np.float64(xs[0]) * ys[0] + zs[0])  # the trap is real


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_fma_f32_is_c_fmaf(seed):
    """Drawn f32 triples of every magnitude (and the q8 mode's own: integer
    sums < 2^20 times block scales, plus a sum that nearly cancels)."""
    rng = np.random.default_rng(seed)
    n = 300
    a = np.concatenate([rng.integers(-2 ** 20, 2 ** 20, n).astype(np.float32),
                        (rng.standard_normal(n) * 10.0 ** rng.integers(-37, 37, n)).astype(np.float32)])
    b = (rng.standard_normal(2 * n) * 10.0 ** rng.integers(-37, 37, 2 * n)).astype(np.float32)
    c = (rng.standard_normal(2 * n) * 10.0 ** rng.integers(-37, 37, 2 * n)).astype(np.float32)
    with np.errstate(over="ignore"):  # a product past f32's range: c inf, as the FMA's would be
        c[::3] = (-(a[::3].astype(np.float64) * b[::3]) * (1 + rng.standard_normal(len(c[::3])) * 1e-7)).astype(
            np.float32)
    _assert_fmaf(a, b, c)


# ---------------------------------------------------------------------------
# Quantization: one rule, bit for bit


FINITE = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@ISA
@SETTINGS
@given(data=st.data(), n_blocks=st.integers(1, 9))
def test_quantize_kernel_is_the_numpy_rule_bit_for_bit(isa, data, n_blocks):
    x = data.draw(hnp.arrays(np.float32, 32 * n_blocks, elements=FINITE))
    q, d = kernels(isa).quantize_q8(x)
    q_np, d_np = quantize_activations_q8(x)
    np.testing.assert_array_equal(d, d_np)
    np.testing.assert_array_equal(q, q_np)
    q_ind, d_ind = quantize_f64(x)
    np.testing.assert_array_equal(d_np, d_ind)
    np.testing.assert_array_equal(q_np, q_ind)


@ISA
def test_quantize_ties_zero_blocks_and_range(isa):
    """Halves round to even; an all-zero block has d = 0 and q = 0; |q| <= 127."""
    x = np.zeros(96, np.float32)
    x[:32] = np.arange(32) - 16  # max 16: 1/d = 127/16 ... exact products land on halves for some
    x[0] = 127 * 0.5  # block max 63.5 -> d = 0.5, x / d integers; ties come from below
    x[1], x[2], x[3] = 0.25, 0.75, -1.25  # x / 0.5 = 0.5, 1.5, -2.5 -> 0, 2, -2
    x[64:] = np.linspace(-3e-3, 5e-3, 32, dtype=np.float32)
    q, d = kernels(isa).quantize_q8(x)
    q_np, d_np = quantize_activations_q8(x)
    np.testing.assert_array_equal(q, q_np)
    np.testing.assert_array_equal(d, d_np)
    assert d[0] == np.float32(0.5) and list(q[1:4]) == [0, 2, -2]
    assert d[1] == 0 and not q[32:64].any()
    assert np.abs(q.astype(int)).max() <= 127


@ISA
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_a_non_finite_block_gets_a_non_finite_scale(isa, bad):
    x = np.ones(64, np.float32)
    x[40] = bad
    q, d = kernels(isa).quantize_q8(x)
    q_np, d_np = quantize_activations_q8(x)
    assert np.isfinite(d[0]) and not np.isfinite(d[1])
    np.testing.assert_array_equal(d, d_np)  # NaN == NaN for assert_array_equal
    np.testing.assert_array_equal(q[:32], q_np[:32])


# ---------------------------------------------------------------------------
# GEMM: f32 blocks equal one-position products; q8 products vs the reference


def random_matrix(kind: str, rows: int, cols: int, seed: int):
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1
    if kind == "int8":
        return quantize_per_tensor(w)
    return Q8_0Tensor(quantize_q8_0(w))


KINDS = pytest.mark.parametrize("kind", ["int8", "q8_0"])


@ISA
@KINDS
@pytest.mark.parametrize("T, rows, cols", [(2, 37, 96), (5, 37, 96), (16, 37, 96), (17, 37, 96), (33, 37, 96),
                                           # a batch's decode step (2 .. 8 positions in one pass over the
                                           # rows, eight rows summed at once and a rest)
                                           (3, 19, 640), (8, 37, 96), (8, 16, 2048),
                                           # past a pass of 64 positions, row tiles of 6 and their rest
                                           (67, 70, 640), (130, 12, 256),
                                           # matrices of 1 or 2 rows (the GEMV); 6 + 2 rows (the last 3-row
                                           # tile overlaps the 6 by one row)
                                           (5, 1, 64), (5, 2, 64), (5, 8, 96)])
def test_f32_gemm_rows_equal_single_position_products(isa, kind, T, rows, cols):
    w = random_matrix(kind, rows, cols, T)
    x = np.random.default_rng(T + 1).standard_normal((T, cols)).astype(np.float32)
    m = kernels(isa)
    for resident in (False, True):
        block = m.gemm(w, x, "f32", resident)
        for t in range(T):
            np.testing.assert_array_equal(block[t], m.gemm(w, x[t:t + 1], "f32", resident)[0])
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    np.testing.assert_allclose(block, want, atol=ATOL, rtol=RTOL)


@ISA
@KINDS
@pytest.mark.parametrize("rows,cols,T", [(1, 32, 1), (3, 64, 1), (5, 256, 3), (37, 640, 17), (64, 2048, 2),
                                           # one position (the decode GEMV, a row at a time): blocks in
                                           # fours and a rest of 1, 2 or 3
                                           (6, 160, 1), (7, 192, 1), (9, 224, 1)])
def test_q8_gemm_matches_the_reference_q8_matrix(isa, kind, rows, cols, T):
    w = random_matrix(kind, rows, cols, rows + cols)
    x = np.random.default_rng(T).standard_normal((T, cols)).astype(np.float32)
    got = kernels(isa).gemm(w, x, "q8")
    ref = Q8Matrix(w)
    for t in range(T):
        np.testing.assert_array_equal(got[t], ref @ x[t])  # one order everywhere: bit for bit
        for resident in (False, True):  # row after row / four rows at a time
            np.testing.assert_array_equal(got[t], kernels(isa).gemm(w, x[t:t + 1], "q8", resident)[0])
    # and, at every position, what the int8 inputs stand for, computed
    # independently in float64: the integer block sums are exact and their
    # scaling and sum lose at most a few f32 roundings of each block's term
    w64 = w.dequantize().astype(np.float64)
    for t in range(T):
        xq, xd = quantize_f64(x[t])
        x_deq = (xq.reshape(-1, 32).astype(np.float64) * xd[:, None].astype(np.float64)).reshape(-1)
        bound = 3 * 2.0 ** -24 * (np.abs(w64) @ np.abs(x_deq))
        err = np.abs(got[t].astype(np.float64) - w64 @ x_deq)
        assert np.all(err <= bound), (t, float(np.max(err - bound)))


def q8_0_with_levels(rows: int, cols: int, low: int, high: int, seed: int) -> Q8_0Tensor:
    """A Q8_0 matrix whose levels are drawn from [low, high] (each row holds
    both ends), with small positive f16 scales."""
    rng = np.random.default_rng(seed)
    nb = cols // 32
    blocks = np.zeros((rows, nb, 34), np.uint8)
    blocks[:, :, 0:2] = rng.uniform(1e-3, 4e-3, (rows, nb)).astype("<f2").view(np.uint8).reshape(rows, nb, 2)
    levels = rng.integers(low, high + 1, (rows, nb, 32)).astype(np.int8)
    levels[:, 0, 0], levels[:, -1, -1] = low, high
    blocks[:, :, 2:] = levels.view(np.uint8)
    return Q8_0Tensor(blocks)


@ISA
@pytest.mark.parametrize("low, high", [(0, 15), (-16, 15), (-32, 31), (-50, 50), (-64, 65), (-64, 66), (-127, 127),
                                       (3, 3)])
def test_q8_gemm_every_panel_form(isa, low, high):
    # the level range picks how a panel of the x86 q8 GEMMs is laid out
    # (q8_avx2.pxi: uint8 with int16 runs of 8, 4, 2 or 1 steps up to a
    # range of 129, int16 past it): each form, and the boundary, against the
    # reference bit for bit; 37 rows end in a partial panel, 7 positions in
    # a partial step
    w = q8_0_with_levels(37, 256, low, high, high - low)
    x = np.random.default_rng(low + 200).standard_normal((7, 256)).astype(np.float32) * 3
    got = kernels(isa).gemm(w, x, "q8")
    ref = Q8Matrix(w)
    for t in range(7):
        np.testing.assert_array_equal(got[t], ref @ x[t])
        np.testing.assert_array_equal(got[t], kernels(isa).gemm(w, x[t:t + 1], "q8")[0])  # the GEMV


@ISA
@SETTINGS
@given(data=st.data(), rows=st.integers(1, 9), n_blocks=st.integers(1, 10), kind=st.sampled_from(["int8", "q8_0"]))
def test_q8_gemm_drawn_values(isa, data, rows, n_blocks, kind):
    cols = 32 * n_blocks
    w = data.draw(hnp.arrays(np.float32, (rows, cols), elements=st.floats(-1, 1, width=32)))
    x = data.draw(hnp.arrays(np.float32, (2, cols), elements=st.floats(-50, 50, width=32)))
    t = quantize_per_tensor(w) if kind == "int8" else Q8_0Tensor(quantize_q8_0(w))
    got = kernels(isa).gemm(t, x, "q8")
    ref = Q8Matrix(t)
    for i in range(2):
        np.testing.assert_array_equal(got[i], ref @ x[i])
        np.testing.assert_array_equal(kernels(isa).gemm(t, x[i:i + 1], "q8")[0], ref @ x[i])  # the GEMV


def decode_step_matrix(kind: str, rows: int, cols: int, rng):
    """A Q8_0 or Q5_0 matrix with a real model's block scales (f16 d of
    either sign, |d| ~ 1e-4 .. 1e-2) and levels of the whole range: Q8_0
    rows whose first block is all -128 and last all 127 (the largest integer
    sums), Q5_0 random bytes (levels -16..15)."""
    nb = cols // 32
    d = (rng.choice([-1, 1], rows * nb) * 10.0 ** rng.uniform(-4, -2, rows * nb)).astype("<f2")
    if kind == "Q8_0":
        blocks = rng.integers(0, 256, (rows, nb, 34), dtype=np.uint8)
        blocks[:, 0, 2:] = np.uint8(0x80)  # -128
        blocks[:, -1, 2:] = np.uint8(127)
        blocks[..., :2] = d.view(np.uint8).reshape(rows, nb, 2)
        return Q8_0Tensor(blocks)
    raw = rng.integers(0, 256, (rows * nb, 22), dtype=np.uint8)
    raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    return Q5_0Tensor.from_raw(raw.reshape(rows, -1), (rows, cols))


@ISA
@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0"])
@pytest.mark.parametrize("rows, cols", [(1, 32), (37, 96), (19, 640), (257, 2048)])
def test_q8_positions_kernel_is_the_gemv_bit_for_bit(isa, kind, rows, cols):
    """A batch's decode step in the q8 mode: 3 to 17 positions (each of
    another sequence) through a Q8_0 matrix, or the Q8_0 tiles of a Q5_0
    one (the avx512 module: positions in the lanes of 8 or 16, an 8th or
    16th position by the GEMV, 17 by the panels; q8_vnni_positions.pxi) give at
    every (row, position) the one-position GEMV's bits: activation blocks
    of +-127 and mixed signs against blocks of -128 and 127, 257 rows past
    a converted tile of 256."""
    m = kernels(isa)
    rng = np.random.default_rng(rows + cols + len(kind))
    w = decode_step_matrix(kind, rows, cols, rng)
    for T in range(3, 18):
        x = rng.standard_normal((T, cols)).astype(np.float32) * rng.uniform(0.1, 30, (T, 1)).astype(np.float32)
        x[0, :32] = 5  # xq = 127 throughout the first block
        x[T - 1, -32:] = -np.abs(x[T - 1, -32:]) - 1  # a block of negative values only
        got = m.gemm(w, x, "q8")
        for t in range(T):
            one = m.gemm(w, x[t:t + 1], "q8")[0]  # the GEMV
            np.testing.assert_array_equal(got[t].view(np.uint32), one.view(np.uint32), err_msg=f"T={T} t={t}")


def test_q8_needs_widths_that_are_multiples_of_32(tiny):
    odd = tiny.config.with_changes(mlp_dim=1000)
    with pytest.raises(ParameterError, match="multiples of 32"):
        make_engine("fast", type(tiny)(odd, {**tiny.tensors, **{
            f"layers.{l}.{n}": quantize_per_tensor(np.ones(s, np.float32))
            for l in range(odd.n_layers) for n, s in (("gate_proj", (1000, 256)), ("up_proj", (1000, 256)),
                                                      ("down_proj", (256, 1000)))}}), 16, "q8")
    with pytest.raises(ParameterError, match="activations"):
        make_engine("fast", tiny, 16, "int4")


@pytest.mark.parametrize("mode, needle", [("q8", "multiples of 32"), ("int4", "expected one of")])
def test_every_engine_refuses_a_mode_with_one_error(tiny, mode, needle):
    """A mode the model cannot run (q8 on an mlp_dim of 1000) or that does not
    exist: every way of building an engine raises the same ParameterError
    with the same message (gemma_cy.model.checks.check_activation_mode)."""
    odd = tiny.config.with_changes(mlp_dim=1000)
    weights = type(tiny)(odd, {**tiny.tensors, **{
        f"layers.{l}.{n}": quantize_per_tensor(np.ones(s, np.float32))
        for l in range(odd.n_layers) for n, s in (("gate_proj", (1000, 256)), ("up_proj", (1000, 256)),
                                                  ("down_proj", (256, 1000)))}})
    builders = {"make_engine fast": lambda: make_engine("fast", weights, 16, mode),
                "make_engine reference": lambda: make_engine("reference", weights, 16, mode),
                "FastEngine": lambda: FastEngine(weights, 16, activations=mode),
                "ReferenceEngine": lambda: ReferenceEngine(weights, 16, mode),
                **{f"FastModel {isa}": lambda isa=isa: kernels(isa).FastModel(weights, 16, mode) for isa in AVAILABLE}}
    messages = {}
    for what, build in builders.items():
        with pytest.raises(ParameterError, match=needle) as raised:
            build()
        assert type(raised.value) is ParameterError, what
        messages[what] = str(raised.value)
    assert len(set(messages.values())) == 1, messages


# ---------------------------------------------------------------------------
# The engines in q8 mode


def greedy_both_q8(weights, ids, n: int, isa: str) -> None:
    """Greedy-decode ``n`` tokens on both engines in q8 mode: the ids must be
    equal (a divergence reports the step, both ids and the reference's
    top-1/top-2 margin), and every op of every position of the fast engine
    must be within tolerance of the reference's layer function applied to
    the fast engine's own inputs (gemma_cy.generation.local_error.teacher_forced).

    Free-running logits are not compared with the per-op tolerance: two
    engines whose f32 sums differ in order by an ulp can land an activation
    on either side of an int8 rounding boundary, a difference of one
    quantization step (~1% of its block's max) that the tiny fixture's
    residual stream amplifies (measured: up to 0.85 over the logits'
    tolerance after 64 steps, with every op locally within tolerance and
    all 64 tokens identical)."""
    ref, fast = ReferenceEngine(weights, 256, "q8"), FastEngine(weights, 256, isa, activations="q8")
    seen: dict = {}

    def observe(layer, op, pos, value):
        seen[layer, op, pos] = value
    want, got = ref.prefill(ids), fast.prefill(ids, observe)
    seq = list(ids)
    for step in range(n):
        token = assert_same_greedy_id(want, got, isa, step)
        seq.append(token)
        want, got = ref.decode(token), fast.decode(token, observe)
    local = teacher_forced(ReferenceEngine(weights, len(seq), "q8"), seen, seq)
    assert len(local) == len(seen)
    for key, value in local.items():
        assert_within(seen[key], value, f"{isa}: {key}", tolerance_for(key[1]))


@pytest.mark.parametrize("prompt", ["Once upon a time", "The cat sat on the mat", "1 2 3 4 5",
                                    "hello world, héllo wörld"])
def test_q8_greedy_64_tokens_identical(prompt, tiny, tiny_model):
    for isa in AVAILABLE:
        greedy_both_q8(tiny, tiny_model.prompt_ids(prompt), 64, isa)


def test_q8_greedy_64_tokens_identical_chat_format(tiny, tiny_model):
    for isa in AVAILABLE:
        greedy_both_q8(tiny, tiny_model.chat_ids("Tell me a story about a robot."), 64, isa)


def test_q8_is_not_the_f32_path(tiny, tiny_model):
    """The mode changes the numbers (it quantizes), by about its own error,
    at every position: on the tiny fixture the logits move by 1.6% to 3.6%
    of their largest value (measured over three prompts); the bounds are
    0.5% and 5%."""
    for prompt in ("Once upon a time", "The cat sat on the mat"):
        f32, q8 = FastEngine(tiny, 64), FastEngine(tiny, 64, activations="q8")
        for token in tiny_model.prompt_ids(prompt):
            a, b = f32.decode(token), q8.decode(token)
            moved = np.max(np.abs(a - b)) / np.max(np.abs(a))
            assert 0.005 < moved < 0.05, (prompt, moved)


@ISA
@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_prefill_blocks_equal_decoding_one_by_one(isa, activations, tiny):
    """150 positions: blocks of 64, 64, 22 (inside them, the GEMMs' 4-position
    kernels and their rest, attention's tiles of 4) give the same logits and
    KV cache, bit for bit, as 150 one-position steps."""
    ids = [int(i) for i in np.random.default_rng(5).integers(0, tiny.config.vocab_size, 150)]
    whole = FastEngine(tiny, 160, isa, activations=activations)
    last = whole.prefill(ids)
    stepwise = FastEngine(tiny, 160, isa, activations=activations)
    for token in ids:
        out = stepwise.decode(token)
    np.testing.assert_array_equal(out, last)
    for a, b in zip(whole.model.key_cache + whole.model.value_cache,
                    stepwise.model.key_cache + stepwise.model.value_cache):
        np.testing.assert_array_equal(a[:150], b[:150])


def test_cli_q8_mode_and_diff(tiny_model_path):
    run = cli("--weights", str(tiny_model_path), "--prompt", "Once upon", "--n_dec", "8", "--temp", "0",
              "--activations", "q8", "--terminate_on_eos", "0", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    reference = ReferenceEngine(read_gmw(str(tiny_model_path)), 64, "q8")  # the CLI runs the fast engine
    logits, want = reference.prefill(out["prompt_ids"]), []
    for _ in range(8):
        want.append(int(np.argmax(logits)))
        logits = reference.decode(want[-1])
    assert out["engine"] == "fast" and out["generated_ids"] == want
    diff = cli("diff", "--weights", str(tiny_model_path), "--prompt", "Once upon a time", "--n_dec", "32",
               "--activations", "q8")
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "32/32 tokens identical" in diff.stdout
    bad = cli("--weights", str(tiny_model_path), "--prompt", "x", "--activations", "int4")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1


def test_q8_engine_products_at_every_position_against_float64(tiny, tiny_model):
    """The fast engine in q8 mode, every position of a short prompt: each
    product whose input the engine reports (v_proj on attn_norm's output,
    o_proj on the attention output, the output layer on final_norm's
    output; the fixture has no q/k norms or post-norms) equals, within a few
    f32 roundings of each block's term, the product computed here in float64
    from the dequantized weights and the input quantized by quantize_f64,
    this file's own statement of the q8 rule."""
    from gemma_cy.generation.local_error import Recorder

    ids = tiny_model.prompt_ids("Once upon a time, in a land")
    rec = Recorder()
    FastEngine(tiny, 64, activations="q8").prefill(ids, rec)
    checks = [(layer, "attn_norm", f"layers.{layer}.v_proj", "v") for layer in range(tiny.config.n_layers)]
    checks += [(layer, "attn_out", f"layers.{layer}.o_proj", "attn") for layer in range(tiny.config.n_layers)]
    checks += [(tiny.config.n_layers, "final_norm", "lm_head", "logits")]
    compared = 0
    for pos in range(len(ids)):
        for layer, source, tensor, op in checks:
            if (layer, op, pos) not in rec.values:
                continue  # logits: the last position only
            xq, xd = quantize_f64(rec.values[layer, source, pos].reshape(-1))
            x = (xq.reshape(-1, 32).astype(np.float64) * xd[:, None].astype(np.float64)).reshape(-1)
            w = tiny.tensors[tensor].dequantize().astype(np.float64)
            got = rec.values[layer, op, pos].reshape(-1).astype(np.float64)
            bound = 3 * 2.0 ** -24 * (np.abs(w) @ np.abs(x))
            assert np.all(np.abs(got - w @ x) <= bound), (pos, layer, op)
            compared += 1
    assert compared == len(ids) * 2 * tiny.config.n_layers + 1
