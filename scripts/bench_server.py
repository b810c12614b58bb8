"""Benchmark: `gemma-cy serve` under concurrent clients, beside llama-cpp-python's server (docs/benchmarks.md#server-load).

    python scripts/bench_server.py                                   # 1, 8 and 32 clients x 3 requests, with llama.cpp if .venv-peers exists
    python scripts/bench_server.py --clients 8 --repeat 1 --no_peers # a quick look

Gemma 3 270M (the default model, its Q4_K_M file as stored), one thread
each. A server is started per engine: `gemma-cy serve` (``--max_sequences``
8, the f32 mode) and `python -m llama_cpp.server` (llama-cpp-python under
.venv-peers, one thread, its default one sequence at a time). At each
client count C, C threads each send ``--requests`` (3) non-streaming
completions one after the other: the GPL-3 text from an offset of their
own, ``--prompt`` (64) tokens, ``--max_tokens`` (64) greedy tokens. Per
(engine, C): every request's latency (p50, p95), and the aggregate tok/s
(completion tokens over the wall time of the whole load). Engines
interleaved per repetition; medians of ``--repeat`` (3).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_host import cpu_name

REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
TEXT = Path("/usr/share/common-licenses/GPL-3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not start")


def start(engine: str, model: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if engine == "gemma-cy":
        cmd = [sys.executable, "-m", "gemma_cy", "serve", "-m", model, "--port", str(port), "--max_sequences",
               str(args.max_sequences), "--ctx", str(args.ctx), "--max_queue", "256"]
    else:
        cmd = [args.peers_python, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--n_threads",
               "1", "--n_threads_batch", "1", "--n_ctx", str(args.ctx)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def post(url: str, body: dict) -> tuple[float, int]:
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - start, answer["usage"]["completion_tokens"]


def load(url: str, prompts: list[str], clients: int, args) -> dict:
    def client(c: int) -> list[tuple[float, int]]:
        return [post(url, {"prompt": prompts[(c * args.requests + r) % len(prompts)], "max_tokens": args.max_tokens,
                           "temperature": 0}) for r in range(args.requests)]
    post(url, {"prompt": prompts[0], "max_tokens": 4, "temperature": 0})  # warm
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = [x for got in pool.map(client, range(clients)) for x in got]
    wall = time.perf_counter() - start
    latencies = sorted(t for t, _ in done)
    return {"tok_s": sum(n for _, n in done) / wall, "p50": statistics.median(latencies),
            "p95": latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))],
            "tokens": sum(n for _, n in done)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--max_sequences", type=int, default=8)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no_peers", action="store_true")
    p.add_argument("--peers_python", default=str(PEERS_PYTHON), help="a python with llama-cpp-python[server]")
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args()

    import gemma_cy
    from gemma_cy.formats.packaged import default_model_path

    model_path = default_model_path()
    model = gemma_cy.load(model_path, max_cache_len=args.ctx)
    ids = model.tokenize(TEXT.read_text(encoding="utf-8"), add_bos=False)
    prompts = [model.detokenize(ids[97 * i:97 * i + args.prompt]) for i in range(64)]
    del model
    engines = ["gemma-cy"] + ([] if args.no_peers or not Path(args.peers_python).exists() else ["llama.cpp"])
    if len(engines) == 1 and not args.no_peers:
        print(f"llama.cpp skipped: no {args.peers_python} (scripts/peers_setup.sh makes .venv-peers)")
    counts = [int(c) for c in args.clients.split(",")]
    runs: dict = {}
    for rep in range(args.repeat):
        for engine in engines:
            proc, url = start(engine, model_path, args)
            try:
                for c in counts:
                    runs.setdefault((engine, c), []).append(load(url, prompts, c, args))
                    r = runs[(engine, c)][-1]
                    print(f"repeat {rep + 1} {engine:9s} {c:3d} clients: {r['tok_s']:7.1f} tok/s, "
                          f"p50 {r['p50']:.2f} s, p95 {r['p95']:.2f} s", flush=True)
            finally:
                proc.terminate()
                proc.wait(60)
    host = cpu_name()
    print(f"\n{host}; {args.requests} requests per client, {args.prompt}-token prompts, {args.max_tokens} tokens, "
          f"medians of {args.repeat}")
    print("| clients | " + " | ".join(f"{e} tok/s | p50 s | p95 s" for e in engines) + " |")
    print("|---" * (1 + 3 * len(engines)) + "|")
    for c in counts:
        cells = []
        for e in engines:
            rs = runs[(e, c)]
            cells += [f"{statistics.median(r['tok_s'] for r in rs):.1f}", f"{statistics.median(r['p50'] for r in rs):.2f}",
                      f"{statistics.median(r['p95'] for r in rs):.2f}"]
        print(f"| {c} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{e} {c}": v for (e, c), v in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
