"""Throughput of the int8 GEMV kernel of every SIMD module this CPU runs.

Prints multiply-adds per second of ``gemv_i8`` on read-only int8 matrices
(like the memory-mapped weights) of two shapes: 2048 x 640 (an MLP projection
of Gemma 3 270M, 1.3 MB: fits the last-level cache) and 262144 x 640 (its
vocabulary head, 168 MB: streamed from DRAM), against NumPy's f32 matrix-vector
product of the same shape (the reference engine's way: 4 bytes per weight).

The NumPy peer runs single-threaded, like the kernels (BLAS threads are set
to 1 unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS say
otherwise). Each time is the best of several runs, each run lasting at
least --min-time seconds in total.

    python scripts/bench_kernels.py [--shapes 2048x640,262144x640] [--min-time 0.5]
"""
from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the BLAS thread settings)

from gemma_cy.fast import ops  # noqa: E402


def best_seconds(fn, min_time: float, repeats: int = 5) -> float:
    """Fastest time of one call of ``fn`` over ``repeats`` batches of calls,
    each batch at least min_time / repeats seconds long."""
    fn()  # warm-up: page faults, caches
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time / repeats:
                break
        best = min(best, elapsed / calls)
    return best


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        rows, cols = item.lower().split("x")
        shapes.append((int(rows), int(cols)))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2048x640,262144x640", help="ROWSxCOLS,... (default: %(default)s)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per measurement (default: %(default)s)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    print(f"SIMD modules this CPU runs: {', '.join(ops.available())} (ops picks {ops.ISA})")
    print(f"{'shape':>12} {'kernel':>10} {'GMAC/s':>8} {'vs numpy':>9}")
    for rows, cols in parse_shapes(args.shapes):
        macs = rows * cols
        q = rng.integers(-128, 128, size=(rows, cols), dtype=np.int8)
        q.setflags(write=False)
        x = rng.standard_normal(cols).astype(np.float32)
        out = np.empty(rows, np.float32)
        scale = np.float32(0.01)

        w = q.astype(np.float32) * scale  # (rows, cols) f32: the peer's weights
        peer = macs / best_seconds(lambda: np.matmul(w, x, out=out), args.min_time)
        del w
        shape = f"{rows}x{cols}"
        print(f"{shape:>12} {'numpy f32':>10} {peer / 1e9:8.2f} {1.0:8.2f}x")
        for name in ops.available():
            gemv = ops.module_for(name).gemv_i8
            rate = macs / best_seconds(lambda: gemv(q, scale, x, out), args.min_time)
            print(f"{shape:>12} {name:>10} {rate / 1e9:8.2f} {rate / peer:8.2f}x")


if __name__ == "__main__":
    main()
