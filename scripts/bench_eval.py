"""Speed of `gemma-cy eval` against llama-cpp-python computing every position's
logits (``logits_all=True``), same text, same file, one thread (docs/benchmarks.md).

    python scripts/bench_eval.py [--chunks 2] [--repeat 3]      (make bench-peers runs it)

Both sides score the same chunks the same way (llama-perplexity's
convention, docs/generation.md#evaluation): each chunk of 512 ids, BOS first,
runs from an empty cache; the log-softmax of the second half's logits gives
the nll of the next ids. gemma-cy runs Model.evaluate; llama-cpp-python runs
Llama.eval on the chunk with logits_all and the same NumPy scoring. Each
repetition is a fresh process per engine, the engines interleaved; the
figure is scored chunk tokens per second of the evaluation alone (loading
excluded), medians, and their ratio. Needs .venv-peers (make bench-peers).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
TEXT = "/usr/share/common-licenses/GPL-3"
CTX = 512
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

GEMMA_CY = """
import json, sys, time
import gemma_cy
model = gemma_cy.load(sys.argv[1], max_cache_len={ctx})
text = open(sys.argv[2], encoding="utf-8").read()
start = time.perf_counter()
ev = model.evaluate(text, ctx={ctx}, chunks={chunks})
print(json.dumps({{"seconds": time.perf_counter() - start, "perplexity": ev.perplexity}}))
"""

LLAMA = """
import json, sys, time
import numpy as np
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx={ctx}, n_batch={ctx}, n_ubatch={ctx}, n_threads=1,
            logits_all=True, verbose=False)
text = open(sys.argv[2], encoding="utf-8").read()
ids = llm.tokenize(text.encode("utf-8"), add_bos=True)
bos = llm.token_bos()
nll = []
start = time.perf_counter()
for c in range({chunks}):
    chunk = ids[c * {ctx}:(c + 1) * {ctx}]
    chunk[0] = bos
    llm.reset()
    llm.eval(chunk)
    logits = np.asarray(llm.scores[{ctx} // 2:{ctx} - 1], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    nll += (-logp[np.arange(len(logp)), chunk[{ctx} // 2 + 1:]]).tolist()
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "perplexity": float(np.exp(np.mean(nll)))}}))
"""


def run(python: str, code: str, model: str) -> dict:
    result = subprocess.run([python, "-c", code, model, TEXT], capture_output=True, text=True,
                            env=dict(os.environ, **ONE_THREAD), cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{python}: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    if not PEERS_PYTHON.exists():
        raise SystemExit("no .venv-peers: run `make bench-peers` (builds llama-cpp-python once)")
    from gemma_cy.formats.packaged import default_model_path
    model = default_model_path()
    runs: dict[str, list[dict]] = {"gemma-cy": [], "llama-cpp-python": []}
    for _ in range(a.repeat):  # interleaved
        runs["gemma-cy"].append(run(sys.executable, GEMMA_CY.format(ctx=CTX, chunks=a.chunks), model))
        runs["llama-cpp-python"].append(run(str(PEERS_PYTHON), LLAMA.format(ctx=CTX, chunks=a.chunks), model))
    tokens = a.chunks * CTX
    rate = {k: statistics.median(tokens / r["seconds"] for r in v) for k, v in runs.items()}
    print(f"eval over {a.chunks} chunks of {CTX} of {TEXT}, 1 thread, medians of {a.repeat} (interleaved):")
    for k, v in runs.items():
        print(f"  {k:18s} {rate[k]:7.1f} tok/s   perplexity {v[0]['perplexity']:.4f}")
    print(f"  ratio gemma-cy / llama-cpp-python: {rate['gemma-cy'] / rate['llama-cpp-python']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
