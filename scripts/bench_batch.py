"""Benchmark: several sequences decoded together (docs/benchmarks.md#batched-decode).

    python scripts/bench_batch.py                                   # B = 1, 2, 4, 8, 16, 32, f32 and q8, with llama.cpp if .venv-peers exists
    python scripts/bench_batch.py --batches 1,8 --repeat 1 --no_peers   # a quick look

Gemma 3 270M (the default model, its Q4_K_M file as stored), one thread. At
each B, B sequences get prompts of ``--prompt`` (128) tokens (the GPL-3
text's ids, each sequence from its own offset), are prefilled together,
then decode ``--steps`` (128) greedy tokens each, all B in one step: the
aggregate decode tok/s (B x steps / seconds) and the per-sequence one
(steps / seconds), and the process's peak RSS. gemma-cy runs its batch
engine (gemma_cy.fast.batch.FastBatchEngine) in the f32 and q8 activation
modes; llama.cpp (llama-cpp-python under .venv-peers, built by
scripts/peers_setup.sh) runs the same ids through its own multi-sequence
decode: one ``llama_batch`` per step with one sequence id per sequence,
one thread, logits of each sequence's row (what llama-batched-bench
measures). Each (engine, B) is a fresh process; repetitions interleaved;
medians.

The compute-bound limit is printed beside: every sequence still pays its
own lm_head product (Gemma 3: 262,144 x 640 = 168 M multiply-adds per token,
about 60% of a token's ~270 M), so the aggregate cannot grow past the core's
multiply-add rate over a token's multiply-adds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_host import cpu_name

REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
TEXT = Path("/usr/share/common-licenses/GPL-3")


def prompts_of(ids: list[int], b: int, n: int, bos: int) -> list[list[int]]:
    """B prompts of n ids, BOS first, sequence s from offset 97 s of the text (repeated as needed)."""
    while len(ids) < 97 * b + n:
        ids = ids + ids
    return [[bos] + ids[97 * s:97 * s + n - 1] for s in range(b)]


def gemma_worker(args) -> dict:
    from gemma_cy.fast.batch import FastBatchEngine
    from gemma_cy.formats.gguf_model import read_gguf

    prompts = json.loads(Path(args.prompts).read_text())
    b = len(prompts)
    engine = FastBatchEngine(read_gguf(args.model), len(prompts[0]) + args.steps + 8, b, activations=args.mode)
    start = time.perf_counter()
    outs = engine.step([(s, p, True) for s, p in enumerate(prompts)])
    prefill = time.perf_counter() - start
    tokens = [int(np.argmax(o)) for o in outs]
    start = time.perf_counter()
    for _ in range(args.steps):
        outs = engine.step([(s, [tokens[s]], True) for s in range(b)])
        tokens = [int(np.argmax(o)) for o in outs]
    decode = time.perf_counter() - start
    return {"prefill_tok_s": b * len(prompts[0]) / prefill, "decode_tok_s": b * args.steps / decode,
            "first_ids": tokens[:4]}


def llama_worker(args) -> dict:
    """llama.cpp's multi-sequence decode through llama-cpp-python's low-level API."""
    import llama_cpp

    prompts = json.loads(Path(args.prompts).read_text())
    b, n = len(prompts), len(prompts[0])
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = b * (n + args.steps + 8)
    cparams.n_batch = max(512, b * n)
    cparams.n_ubatch = 512
    cparams.n_seq_max = b
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    n_tokens_of = getattr(llama_cpp, "llama_vocab_n_tokens", None) or llama_cpp.llama_n_vocab
    vocab = n_tokens_of(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(max(512, b * n), 0, b)

    def run(rows: list[tuple[int, int, int, bool]]) -> list[int]:
        """rows (token, pos, seq, logits) in one llama_decode; the argmax of each row with logits."""
        argmaxes = []
        for lo in range(0, len(rows), cparams.n_batch):
            part = rows[lo:lo + cparams.n_batch]
            batch.n_tokens = len(part)
            for i, (token, pos, seq, want) in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = want
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i, (_, _, _, want) in enumerate(part):
                if want:
                    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(vocab,))
                    argmaxes.append(int(np.argmax(logits)))
        return argmaxes

    start = time.perf_counter()
    tokens = run([(t, p, s, p == n - 1) for s, prompt in enumerate(prompts) for p, t in enumerate(prompt)])
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(args.steps):
        tokens = run([(tokens[s], n + step, s, True) for s in range(b)])
    decode = time.perf_counter() - start
    return {"prefill_tok_s": b * n / prefill, "decode_tok_s": b * args.steps / decode, "first_ids": tokens[:4]}


def worker_main(args) -> None:
    import resource
    result = (llama_worker if args.engine == "llama.cpp" else gemma_worker)(args)
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the worker's own peak
    print(json.dumps(result))


def run_one(cmd: list[str]) -> dict | None:
    """A fresh process (one thread); its JSON line."""
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    if proc.returncode != 0:
        sys.stderr.write(f"failed: {' '.join(cmd[-6:])}\n{proc.stderr[-1500:]}\n")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no_peers", action="store_true")
    p.add_argument("--peers_python", default=str(PEERS_PYTHON),
                   help="a Python with llama-cpp-python (default: .venv-peers's, made by make bench-peers)")
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument("--worker", choices=("gemma-cy", "llama.cpp"), dest="engine", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="f32", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine:
        return worker_main(args)

    import tempfile
    from gemma_cy.formats.packaged import default_model_path
    from gemma_cy.tokenizers.sp import SentencePieceTokenizer

    model = default_model_path(progress=False)
    tok = SentencePieceTokenizer.from_gguf(model)
    ids = tok.encode(TEXT.read_text(encoding="utf-8")) if TEXT.exists() else list(range(1000, 9000))
    batches = [int(x) for x in args.batches.split(",")]
    engines = [("gemma-cy f32", [sys.executable, __file__, "--worker", "gemma-cy", "--mode", "f32"]),
               ("gemma-cy q8", [sys.executable, __file__, "--worker", "gemma-cy", "--mode", "q8"])]
    if not args.no_peers and Path(args.peers_python).exists():
        engines.append(("llama.cpp", [args.peers_python, __file__, "--worker", "llama.cpp"]))
    elif not args.no_peers:
        print(f"(llama.cpp skipped: no {args.peers_python}; make bench-peers creates .venv-peers)")
    host = cpu_name()
    print(f"host: {host}; Gemma 3 270M Q4_K_M, prompts {args.prompt}, {args.steps} steps, medians of {args.repeat}")
    files = {}
    tmp = tempfile.mkdtemp(prefix="bench-batch-")
    for b in batches:
        path = Path(tmp) / f"prompts-{b}.json"
        path.write_text(json.dumps(prompts_of(ids, b, args.prompt, tok.bos_id)))
        files[b] = str(path)
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeat):
        for b in batches:
            for name, cmd in engines:
                r = run_one(cmd + ["--model", model, "--prompts", files[b], "--steps", str(args.steps)])
                if r is not None:
                    runs.setdefault((name, b), []).append(r)
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in runs.items()}, indent=1))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("decode_tok_s", "prefill_tok_s", "rss_mib")}
           for k, v in runs.items() if v}
    print(f"| engine | B | decode tok/s (all) | per sequence | vs B=1 | prefill tok/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in engines:
        base = med.get((name, batches[0]), {}).get("decode_tok_s")
        for b in batches:
            m = med.get((name, b))
            if m:
                print(f"| {name} | {b} | {m['decode_tok_s']:.1f} | {m['decode_tok_s'] / b:.1f} | "
                      f"{m['decode_tok_s'] / base:.2f}x | {m['prefill_tok_s']:.0f} | {m['rss_mib']:.0f} |")
    for b in batches:
        if ("llama.cpp", b) in med:
            for mode in ("f32", "q8"):
                if (f"gemma-cy {mode}", b) in med:
                    ratio = med[(f"gemma-cy {mode}", b)]["decode_tok_s"] / med[("llama.cpp", b)]["decode_tok_s"]
                    print(f"B={b}: gemma-cy {mode} / llama.cpp decode {ratio:.2f}x")
    print("limit: each sequence pays its own lm_head product, 262,144 x 640 = 168 M multiply-adds of a "
          "token's ~270 M (about 60%): the aggregate tops out near the core's multiply-add rate / 270 M")


if __name__ == "__main__":
    main()
