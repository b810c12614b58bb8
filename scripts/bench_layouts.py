"""What one block of weights costs each layout of the fast engine's GEMV
(docs/benchmarks.md#block-layouts-per-block-cost): ns per 32 weights and
bytes per 32 weights, for the Q4_K, Q6_K and Q5_0 matrices of the packaged
Gemma 3 file held as affine records, as Q8_0 (the conversion), and Q4_K and
Q5_0 as the file stores them.

    python scripts/bench_layouts.py [--isa avx512] [--repeat 7]

"In cache": one matrix, read again and again (it stays in L2/L3): the
kernel's own cost. "From DRAM": distinct copies totalling ~400 MB, read
one after the other, as a decode step reads its matrices. Every layout's
repetitions are interleaved; figures are medians.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np

from gemma_cy.fast import ops
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.packaged import default_model_path
from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q5_0Tensor, is_exact_in_q8_0, to_q8_0
from gemma_cy.quant.tensors import Q8_0Tensor

DRAM_BYTES = 400e6


def held_bytes(t) -> int:
    if isinstance(t, AffineTensor):
        return t.records.nbytes
    if isinstance(t, Q4_KTensor):
        return t.blocks.nbytes + t.ab.nbytes
    return t.blocks.nbytes


def layouts(gf, name: str, copies: int = 8) -> dict[str, object]:
    """The matrix ``name`` with its rows repeated ``copies`` times (so that
    one GEMV takes long enough for the call's own overhead not to count),
    held each way."""
    t = gf.tensors[name]
    raw = np.tile(gf.raw(name).reshape(t.shape[0], -1), (copies, 1))
    shape = (t.shape[0] * copies, t.shape[1])
    rounded = "" if is_exact_in_q8_0(t.ggml_type) else " (rounded)"
    out = {f"{t.type_name} as affine records": AffineTensor.from_raw(raw, t.ggml_type, shape),
           f"{t.type_name} as Q8_0{rounded}": Q8_0Tensor(to_q8_0(raw, t.ggml_type, shape))}
    if t.type_name == "Q4_K":
        out["Q4_K as stored"] = Q4_KTensor.from_raw(raw, shape)
    if t.type_name == "Q5_0":
        out["Q5_0 as stored"] = Q5_0Tensor.from_raw(raw, shape)
    return out


def seconds(m, tensors: list, x: np.ndarray) -> float:
    start = time.perf_counter()
    for t in tensors:
        m.gemm(t, x)
    return (time.perf_counter() - start) / len(tensors)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isa", default=None, help="SIMD module (default: the one ops picks)")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    m = ops.module_for(a.isa or ops.ISA)
    gf = parse_gguf(default_model_path())
    names = {"Q4_K": "blk.0.attn_output.weight", "Q6_K": "blk.0.ffn_down.weight", "Q5_0": "blk.0.ffn_up.weight"}
    print(f"SIMD module: {m.__name__.rsplit('_', 1)[-1]}")
    print("| layout | bytes per 32 weights | ns per 32 weights, in cache | ns per 32 weights, from DRAM |")
    print("|---|---|---|---|")
    for kind, name in names.items():
        held = layouts(gf, name)
        rows, cols = next(iter(held.values())).shape
        x = np.random.default_rng(0).uniform(-1, 1, (1, cols)).astype(np.float32)
        blocks = rows * cols / 32
        sets = {k: [copy.deepcopy(t) for _ in range(max(1, int(DRAM_BYTES // held_bytes(t))))]
                for k, t in held.items()}
        hot = {k: [] for k in held}
        cold = {k: [] for k in held}
        for _ in range(a.repeat):
            for k, t in held.items():
                hot[k].append(seconds(m, [t] * 10, x))
                cold[k].append(seconds(m, sets[k], x))
        for k, t in held.items():
            print(f"| {k} ({rows}x{cols}) | {held_bytes(t) / blocks:.2f} | "
                  f"{statistics.median(hot[k]) * 1e9 / blocks:.2f} | {statistics.median(cold[k]) * 1e9 / blocks:.2f} |")
        del sets


if __name__ == "__main__":
    main()
