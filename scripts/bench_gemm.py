"""Throughput of the prefill GEMM (``ops.gemm``) per block type, in G multiply-adds/s.

Gemma 3 270M's shapes (q: 1024 x 640, k and v: 256 x 640, gate and up:
2048 x 640, o: 640 x 1024, down: 640 x 2048) in the block types its
packaged file runs (Q8_0, Q5_0, Q4_K, Q6_K), random weights with every level
and a small f16 scale, for 64 positions (one block of the forward pass)
and 512; q8 activations, or f32 with --mode f32. One line of JSON, so that
two builds can be compared in fresh processes, runs interleaved:

    for i in 1 2 3; do for b in OLD NEW; do PYTHONPATH=$b python scripts/bench_gemm.py; done; done

(docs/benchmarks.md#how-to-benchmark: compare within one run only).
"""
from __future__ import annotations

import argparse
import json

from bench_kernels import best_seconds  # sets the BLAS threads to 1 first

import numpy as np

from gemma_cy.fast import ops
from gemma_cy.fast.buffers import aligned_zeros
from gemma_cy.formats.gguf_reader import _F16_SCALE_OFFSETS
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q5_0Tensor
from gemma_cy.quant.tensors import Q8_0Tensor, quantize_q8_0
from gemma_cy.quant.types import GGML_TYPE_IDS, GGML_TYPES

CASES = [("Q8_0", 2048, 640), ("Q8_0", 1024, 640), ("Q8_0", 256, 640), ("Q5_0", 2048, 640), ("Q5_0", 1024, 640),
         ("Q4_K", 640, 1024), ("Q4_K", 640, 2048), ("Q6_K", 640, 2048)]


def matrix(kind: str, rows: int, cols: int, rng):
    """A (rows, cols) matrix of block type ``kind`` as the engine holds it."""
    if kind == "Q8_0":
        return Q8_0Tensor(quantize_q8_0(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05))
    t = GGML_TYPES[GGML_TYPE_IDS[kind]]
    raw = rng.integers(0, 256, (rows * cols // t.block_size, t.type_size), dtype=np.uint8)
    for at in _F16_SCALE_OFFSETS[kind]:
        raw[:, at:at + 2] = np.full(raw.shape[0], 1e-3, "<f2").view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(rows, -1)
    if kind == "Q5_0":
        return Q5_0Tensor.from_raw(raw, (rows, cols))
    return Q4_KTensor.from_raw(raw, (rows, cols)) if kind == "Q4_K" else AffineTensor.from_raw(raw, t.id, (rows, cols))


def aligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` on a cache line, as the engine's activations are
    (gemma_cy/fast/buffers.py)."""
    out = aligned_zeros(a.shape, a.dtype)
    out[...] = a
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="q8", choices=("q8", "f32"))
    parser.add_argument("--positions", default="64,512")
    parser.add_argument("--min-time", type=float, default=0.3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    figures = {"isa": ops.ISA, "mode": args.mode}
    for kind, rows, cols in CASES:
        w = matrix(kind, rows, cols, rng)
        for n in (int(p) for p in args.positions.split(",")):
            x = aligned(rng.standard_normal((n, cols)).astype(np.float32))
            seconds = best_seconds(lambda: ops.gemm(w, x, args.mode), args.min_time)
            figures[f"{kind} {rows}x{cols} T{n}"] = round(rows * cols * n / seconds / 1e9, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
