"""A soak of `gemma-cy serve`: many requests, many of them abandoned (docs/benchmarks.md#server-soak).

    python scripts/soak_server.py                      # 5,000 requests, 16 clients, the default model
    python scripts/soak_server.py --requests 500       # a quick look

One server (``--max_sequences`` 8, ``--ctx`` 1024) on Gemma 3 270M. Each
of ``--clients`` threads sends requests one after another, each drawn
from a fixed seed: chat or text completions, streamed or not, greedy or
sampled, 1 to 48 tokens, sometimes n = 2, sometimes a JSON Schema; about
a third are abandoned: the client closes its connection after a random
0 to 300 ms (a non-streamed request mid-decode, or a stream after some
chunks). After a warm-up of ``--warmup`` requests the server's RSS is
read (``/proc/PID/status``); at the end, once ``gemma_cy_live_sequences``
is back to 0, it is read again. Reports the statuses, the abandoned
count, seconds until the slots were free, and both RSS figures; exits 1
if a request got a 5xx, the slots did not free within 5 s, or the RSS
grew by more than 10%.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench_host import cpu_name
from bench_server import free_port, wait_ready

REPO = Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):",
           "The three laws of motion are", "A recipe for bread:"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def live_sequences(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("gemma_cy_live_sequences ")).split()[-1])


def request_of(rng: random.Random) -> tuple[str, dict, float | None]:
    """(path, body, seconds after which the client leaves, or None)."""
    prompt = rng.choice(PROMPTS)
    body = {"max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(1 << 30),
            "stream": rng.random() < 0.5}
    if rng.random() < 0.15:
        body["n"] = 2
    if rng.random() < 0.5:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        if rng.random() < 0.15:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    else:
        path, body["prompt"] = "/v1/completions", prompt
    leave = rng.uniform(0, 0.3) if rng.random() < 0.35 else None
    return path, body, leave


def send_raw_and_leave(url: str, path: str, body: dict, after: float) -> str:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(data), data))
        time.sleep(after)
    return "left"


def one(url: str, path: str, body: dict, leave: float | None) -> str:
    if leave is not None:
        return send_raw_and_leave(url, path, body, leave)
    with httpx.Client(base_url=url, timeout=300) as h:
        if body["stream"]:
            with h.stream("POST", path, json=body) as r:
                for _ in r.iter_lines():
                    pass
                return str(r.status_code)
        return str(h.post(path, json=body).status_code)


def run(url: str, count: int, clients: int, seed: int) -> Counter:
    rng = random.Random(seed)
    jobs = [request_of(rng) for _ in range(count)]
    with ThreadPoolExecutor(clients) as pool:
        return Counter(pool.map(lambda job: one(url, *job), jobs))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--model", help="weights file (default: the packaged Gemma 3 270M)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from gemma_cy.formats.packaged import default_model_path
    model = args.model or default_model_path(progress=False)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gemma_cy", "serve", "-m", model, "--port", str(port),
                             "--max_sequences", "8", "--ctx", "1024", "--max_queue", "64"], cwd=REPO,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        start = time.monotonic()
        warm = run(url, args.warmup, args.clients, seed=1)
        before = rss_kib(proc.pid)
        statuses = run(url, args.requests, args.clients, seed=2)
        left_at = time.monotonic()
        while live_sequences(url) != 0 and time.monotonic() - left_at < 30:
            time.sleep(0.05)
        freed = time.monotonic() - left_at
        after = rss_kib(proc.pid)
        took = time.monotonic() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    errors = {s: n for s, n in statuses.items() if s.startswith("5")}
    print(f"host: {cpu_name()}")
    print(f"requests: {args.requests} after {args.warmup} warm-up ({dict(warm)}), {args.clients} clients, "
          f"{took:.0f} s in all")
    print(f"statuses: {dict(sorted(statuses.items()))} (left: abandoned by the client)")
    print(f"live sequences back to 0 {freed:.2f} s after the last request; exit code {code}")
    print(f"RSS: {before / 1024:.1f} MiB after the warm-up, {after / 1024:.1f} MiB at the end "
          f"({(after / before - 1) * 100:+.1f}%)")
    ok = not errors and freed < 5 and after <= before * 1.10 and code == 0
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
