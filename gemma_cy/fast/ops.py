"""The kernels (int8 and Q8_0 dot/GEMV, f32 dot and axpy, RMSNorm, RoPE,
softmax, soft-cap, gated activations, residual add, int8 and Q8_0
dequantize), from the best SIMD module this CPU runs.

The same kernel sources are built once per instruction set, as the extension
modules ``gemma_cy.fast.simd_<isa>`` (see setup.py and gemma_cy/fast/kernels/). At
import this module picks one: the environment variable ``GEMMA_CY_SIMD``
(generic | avx2 | avx512 | neon) when set, else the first of ``ISAS`` that the
CPU supports and this build has and whose tests have run on such a CPU
(``TESTED_ON_HARDWARE``; the others are experimental, used only when named).
The kernels know nothing of the model graph.

Python API (all arrays C-contiguous; read-only inputs are fine):
    dot_i8(q, x, scale) -> float
    dot_f32(a, b) -> float                    one attention score (the bits of scores(a[None], b[None]))
    axpy(a, x, y, out=None) -> out (y + a*x)
    scores(q, keys) -> out (m, n_keys)        q (m, n), keys (n_keys, n): attention scores
    weighted_rows(w, x, y, out=None) -> out   y (m, n) + w (m, n_x) . x (n_x, n), as repeated axpy
    softcap(x, cap, out=None) -> out
    gemv_i8(q, scale, x, out=None) -> out (rows,)
    rmsnorm(x, gain, eps, one_plus, out=None) -> out
    rope_cos_sin(pos, head_dim, base) -> (cos, sin)
    rope(x, pos, base, pairing, out=None) -> out
    softmax(x, out=None) -> out
    silu_mul(gate, up, out=None) -> out
    gelu_tanh_mul(gate, up, out=None) -> out
    add(x, y, out=None) -> out
    dequantize_i8(q, scale, out=None) -> out
    dot_q8_0(blocks, x) -> float              blocks uint8 (n_blocks, 34)
    gemv_q8_0(blocks, x, out=None) -> out     blocks uint8 (rows, n_blocks, 34)
    quantize_q8(x) -> (q, d)                  x (32 n,) -> int8 (32 n,), f32 (n,): the q8 mode's rule
    gemm(tensor, x, activations="f32") -> out x (T, cols) -> (T, rows), as a block of the forward pass
    matrix_row(tensor, row) -> out            (cols,): one row, as an embedding lookup
    dequantize_q8_0(blocks, out=None) -> out  (32 * n_blocks,)
Wrong dtypes raise TypeError; wrong shapes, non-contiguous arrays and bad
``out`` arrays raise ValueError. Cython callers use the ``k_*`` C functions
declared in gemma_cy/fast/kernels/api.pxi instead. Each module also holds the
whole forward pass over its kernels, ``FastModel`` (gemma_cy/fast/forward.pxi),
which gemma_cy.fast.engine drives.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

from .cpu_features import supported
from ..errors import ParameterError

ISAS = ("avx512", "avx2", "neon", "generic")  # best first
# The cpu_features keys each module needs (avx512 is built with VNNI: see setup.py).
REQUIRES = {"avx512": ("avx512", "vnni"), "avx2": ("avx2",), "neon": ("neon",), "generic": ()}
ENV_VAR = "GEMMA_CY_SIMD"
# The modules whose whole test suite has passed on a CPU with their
# instruction set (docs/architecture.md#isa-dispatch). Only these are chosen
# automatically; any other is experimental, run only when ENV_VAR names it.
# A module joins once `make test GEMMA_CY_REQUIRE_ISAS=<name>` has passed on
# such a CPU (that switch turns the tests' skips of <name> into failures).
TESTED_ON_HARDWARE = ("avx512", "avx2", "generic")
# The modules with an affine-matrix kernel of their own (dot_<isa>.pxi); the
# others run the portable loop of kernels/common.pxi.
OWN_AFFINE_KERNELS = ("avx512", "avx2")


def _cpu_runs(name: str) -> bool:
    features = supported()
    return all(features[need] for need in REQUIRES[name])


def _built(name: str) -> bool:
    return importlib.util.find_spec(f"gemma_cy.fast.simd_{name}") is not None


def available() -> list[str]:
    """Names of the SIMD modules this CPU can run and this build has, best first."""
    return [name for name in ISAS if _cpu_runs(name) and _built(name)]


def experimental(name: str) -> bool:
    """True for a module whose tests have not run on a CPU with its instruction set."""
    return name not in TESTED_ON_HARDWARE


def choose(forced: str, runnable: list[str]) -> str:
    """The module to use: ``forced`` (ENV_VAR's value) when given, else the
    best of ``runnable`` whose tests have run on such hardware."""
    if forced:
        return forced
    tested = [name for name in runnable if not experimental(name)]
    if not tested:
        raise ImportError("gemma_cy: no tested kernel module gemma_cy.fast.simd_* is built (run `make build`)")
    return tested[0]


def module_for(name: str) -> ModuleType:
    """The kernel module ``gemma_cy.fast.simd_<name>``; ParameterError (one line)
    when the name is unknown, the CPU cannot run it or this build lacks it."""
    if name not in REQUIRES:
        raise ParameterError(f"unknown SIMD kernel set {name!r}, expected one of {', '.join(ISAS)}")
    if not _cpu_runs(name):
        raise ParameterError(
            f"this CPU cannot run the {name} kernels (it can run: {', '.join(available())})")
    if not _built(name):
        raise ParameterError(
            f"the {name} kernels are not built for this machine (built and runnable: {', '.join(available())})")
    return importlib.import_module(f"gemma_cy.fast.simd_{name}")


def _choose() -> str:
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced:
        try:
            module_for(forced)
        except ParameterError as error:
            raise ParameterError(f"{ENV_VAR}={forced}: {error}") from None
        return forced
    return choose("", available())


ISA: str = _choose()  # the name of the module in use
_impl = module_for(ISA)

dot_i8 = _impl.dot_i8
dot_f32 = _impl.dot_f32
axpy = _impl.axpy
scores = _impl.scores
weighted_rows = _impl.weighted_rows
softcap = _impl.softcap
gemv_i8 = _impl.gemv_i8
rmsnorm = _impl.rmsnorm
rope_cos_sin = _impl.rope_cos_sin
rope = _impl.rope
softmax = _impl.softmax
silu_mul = _impl.silu_mul
gelu_tanh_mul = _impl.gelu_tanh_mul
add = _impl.add
dequantize_i8 = _impl.dequantize_i8
dot_q8_0 = _impl.dot_q8_0
gemv_q8_0 = _impl.gemv_q8_0
dequantize_q8_0 = _impl.dequantize_q8_0
quantize_q8 = _impl.quantize_q8
gemm = _impl.gemm
