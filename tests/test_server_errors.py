"""`gemma-cy serve` under bad input (docs/server.md#errors): every bad
request gets its 4xx status and OpenAI's error object, and changes nothing
else: a good request running meanwhile gets exactly its answer. Also the
API key, the body limit, a flood past the queue, and clients that go away
mid-stream."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (make test installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")

import gemma_cy  # noqa: E402
from helpers import assert_one_line_error, cli  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CTX = 256


@pytest.fixture(scope="module")
def tiny_server(tiny_model_path):
    proc = ServerProcess("-m", str(tiny_model_path), "--ctx", str(CTX), "--max_sequences", "2", "--max_queue", "2",
                         "--api_key", KEY, "--max_body", "8192")
    yield proc
    code, log = proc.stop()
    assert code == 0, log


def expected(tiny_model_path, prompt, **kw):
    return gemma_cy.load(str(tiny_model_path), max_cache_len=CTX).complete(prompt, min_p=0.0, **kw)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and "\n" not in body["error"]["message"]
    return body["error"]


# (path, raw body, status, what the message must say, param)
BAD = [
    ("/v1/completions", b'{"prompt": "hi",', 400, "malformed JSON", None),
    ("/v1/completions", b"\xff\xfe{}", 400, "not UTF-8", None),
    ("/v1/completions", b"[" * 3000 + b"]" * 3000, 400, "malformed JSON", None),
    ("/v1/completions", b'["a list"]', 400, "JSON object", None),
    ("/v1/completions", b'{"prompt": 5}', 400, "prompt", "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": "hot"}', 400, "temperature", "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens = 0", "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 5000}', 400, "5000", "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "n": 17}', 400, "n = 17", "n"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', 400, "at most 4", "stop"),
    ("/v1/completions", b'{"prompt": "hi", "frobnicate": 1}', 400, "frobnicate", "frobnicate"),
    ("/v1/completions", b'{"prompt": "hi", "logit_bias": {"5": 1}}', 400, "logit_bias", None),
    ("/v1/completions", b'{"prompt": [1, 2, 999999]}', 400, "999999", "prompt"),
    ("/v1/completions", b'{"prompt": []}', 400, "prompt", "prompt"),
    ("/v1/completions", json.dumps({"prompt": list(range(3, 300))}).encode(), 400, "256", "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "model": "other"}', 404, "other", "model"),
    ("/v1/completions", b'{"prompt": "hi", "seed": -1}', 400, "seed", "seed"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages", "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "role",
     "messages.0.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}], "top_logprobs": 2}', 400, "logprobs",
     "top_logprobs"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 50}', 400,
     "top_logprobs", "top_logprobs"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": '
     b'{"url": "x"}}]}]}', 400, 'part 0 is type "image_url"', "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400, "text parts",
     "messages.0.content"),
    ("/detokenize", b'{"tokens": [1, -5]}', 400, "-5", "tokens"),
    ("/v1/nowhere", b"{}", 404, "Not Found", None),
]


def test_bad_requests_get_their_error_and_a_good_one_is_unaffected(tiny_server, tiny_model_path):
    good = {}

    def run_good():
        with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=60) as h:
            good["r"] = h.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 200,
                                                        "temperature": 0.8, "seed": 4})
    thread = threading.Thread(target=run_good)
    thread.start()
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=60) as h:
        for path, body, status, needle, param in BAD:
            err = error_of(h.post(path, content=body), status)
            assert needle in err["message"], (body[:60], err)
            if param is not None:
                assert err["param"] == param, (body[:60], err)
        err = error_of(h.get("/v1/completions"), 405)
    thread.join()
    want = expected(tiny_model_path, "Once upon a time", max_tokens=200, temperature=0.8, seed=4)
    assert good["r"].status_code == 200 and good["r"].json()["choices"][0]["text"] == want.text


def test_the_chat_template_refusing_is_a_400(default_model):
    server = ServerProcess("-m", default_model, "--ctx", "256", "--max_sequences", "1")
    try:
        with httpx.Client(base_url=server.url, timeout=60) as h:
            err = error_of(h.post("/v1/chat/completions", json={"messages": [
                {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}), 400)
            assert "alternate" in err["message"] and err["code"] == "template_error"
            err = error_of(h.post("/v1/chat/completions", json={"messages": [
                {"role": "user", "content": "word " * 300}]}), 400)
            assert "256" in err["message"] and err["code"] == "context_length_exceeded" and err["param"] == "messages"
    finally:
        assert server.stop()[0] == 0


def test_the_api_key_is_required(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=30) as h:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            err = error_of(h.post("/v1/completions", json={"prompt": "hi"}, headers=headers), 401)
            assert err["type"] == "authentication_error"
        assert error_of(h.get("/v1/models"), 401)
        assert h.get("/health").status_code == 200  # health and metrics stay open to probes
        assert h.get("/v1/models", headers=AUTH).status_code == 200


def test_a_flood_of_unknown_paths_adds_no_metrics_series(tiny_server):
    """1,000 random paths (404, or 401 without the key) are counted under
    one label: /metrics does not grow with what clients ask for."""
    import random

    def series(text: str) -> set[str]:
        return {line.split(" ")[0] for line in text.splitlines() if line.startswith("gemma_cy_requests_total")}
    with httpx.Client(base_url=tiny_server.url, timeout=30) as h:
        before = series(h.get("/metrics").text)
        rng = random.Random(7)
        for k in range(1000):
            path = "/" + "".join(rng.choice("abcdefghij/0123456789") for _ in range(rng.randint(1, 24)))
            h.get(path, headers=AUTH if k % 2 else {})
        after = series(h.get("/metrics").text)
    added = after - before  # at most: (unknown) x {401, 404}, the page "/" (a path of 1-24 characters
    endpoints = {s.split('endpoint="')[1].split('"')[0] for s in added}  # can be "/"), /metrics's own scrape
    assert endpoints <= {"(unknown)", "/", "/metrics"} and len(added) <= 4, sorted(added)
    assert 'gemma_cy_requests_total{endpoint="(unknown)",status="404"}' in after


def test_a_body_over_the_limit_is_413_before_it_is_read(tiny_server):
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=30) as h:
        big = json.dumps({"prompt": "x" * 10_000}).encode()
        assert error_of(h.post("/v1/completions", content=big), 413)["code"] == "body_too_large"

        def chunked():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b" " * 1000
        assert error_of(h.post("/v1/completions", content=chunked()), 413)
        assert h.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_more_than_the_queue_holds_is_429_and_nothing_accepted_is_lost(tiny_server, tiny_model_path):
    with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=30) as h:
        r = h.post("/v1/completions", json={"prompt": "hi", "n": 5, "max_tokens": 2})  # 2 slots + 2 queued
        assert error_of(r, 429)["type"] == "rate_limit_error" and r.headers["Retry-After"] == "1"

    def one(i):
        with httpx.Client(base_url=tiny_server.url, headers=AUTH, timeout=60) as h:
            return i, h.post("/v1/completions", json={"prompt": f"story {i}", "max_tokens": 120,
                                                      "temperature": 0})
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    statuses = [r.status_code for _, r in results]
    assert set(statuses) <= {200, 429} and 200 in statuses
    for i, r in results:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1"
        else:
            assert r.json()["choices"][0]["text"] == expected(tiny_model_path, f"story {i}", max_tokens=120,
                                                              temperature=0).text


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def live_sequences(h) -> float:
    line = next(x for x in h.get("/metrics").text.splitlines() if x.startswith("gemma_cy_live_sequences "))
    return float(line.split()[-1])


def test_clients_that_go_away_mid_stream_free_their_slots(default_model):
    server = ServerProcess("-m", default_model, "--ctx", "512", "--max_sequences", "4")
    model = gemma_cy.load(default_model, max_cache_len=512)
    body = {"prompt": "Tell me a long story about a dragon.", "max_tokens": 400, "temperature": 0.9, "stream": True}

    def drop(i):
        with httpx.Client(base_url=server.url, timeout=60) as h:
            with h.stream("POST", "/v1/completions", json={**body, "seed": i}) as r:
                lines = r.iter_lines()
                next(line for line in lines if line.startswith("data: "))  # one token, then go away
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(drop, range(20)))  # warm up: the slots' caches, the allocator
            before = rss_kib(server.proc.pid)
            list(pool.map(drop, range(20, 220)))
        with httpx.Client(base_url=server.url, timeout=60) as h:
            deadline = time.monotonic() + 30
            while live_sequences(h) != 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert live_sequences(h) == 0
            r = h.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 8,
                                                "temperature": 0})
            want = model.complete("The capital of France is", max_tokens=8, temperature=0, min_p=0.0)
            assert r.json()["choices"][0]["text"] == want.text
        after = rss_kib(server.proc.pid)
        assert after <= before * 1.05, (before, after)
    finally:
        assert server.stop()[0] == 0


def test_32_concurrent_clients_each_get_what_they_get_alone(tiny_model_path):
    """A bounded load (loopback): 32 clients x 3 requests, streamed and not,
    greedy and seeded, all answered, each answer that request run alone."""
    server = ServerProcess("-m", str(tiny_model_path), "--ctx", str(CTX), "--max_sequences", "8")
    model = gemma_cy.load(str(tiny_model_path), max_cache_len=CTX)

    def client(c):
        out = []
        with httpx.Client(base_url=server.url, timeout=120) as h:
            for r in range(3):
                body = {"prompt": f"client {c} request {r}", "max_tokens": 20 + (c * 7 + r) % 40,
                        "temperature": 0 if (c + r) % 2 else 0.9, "seed": c * 10 + r}
                if r == 1:
                    with h.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                                  if line.startswith("data: ") and line != "data: [DONE]"]
                    out.append((body, resp.status_code, "".join(ch["choices"][0]["text"] for ch in chunks)))
                else:
                    resp = h.post("/v1/completions", json=body)
                    out.append((body, resp.status_code, resp.json()["choices"][0]["text"]))
        return out
    try:
        with ThreadPoolExecutor(32) as pool:
            results = [x for got in pool.map(client, range(32)) for x in got]
    finally:
        assert server.stop()[0] == 0
    assert len(results) == 96 and {status for _, status, _ in results} == {200}
    for body, _, text in results:
        want = model.complete(body["prompt"], max_tokens=body["max_tokens"], temperature=body["temperature"],
                              seed=body["seed"], min_p=0.0)
        assert text == want.text, body


@pytest.mark.parametrize("on_stop", ["finish", "cancel"])
def test_sigterm_finishes_or_cancels_what_runs_and_exits_0(default_model, on_stop):
    server = ServerProcess("-m", default_model, "--ctx", "512", "--max_sequences", "2", "--on_stop", on_stop)
    chunks = []

    def stream():
        with httpx.Client(base_url=server.url, timeout=120) as h:
            with h.stream("POST", "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 60,
                                                           "temperature": 0, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:])["choices"][0])
    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 60
    while not chunks and time.monotonic() < deadline:
        time.sleep(0.02)
    code, log = server.stop()
    thread.join(120)
    assert code == 0, log
    finish = [c["finish_reason"] for c in chunks if c["finish_reason"]]
    if on_stop == "finish":
        assert finish in (["length"], ["stop"]) and len([c for c in chunks if c["text"]]) >= 10
    else:
        assert finish == ["cancelled"] and len([c for c in chunks if c["text"]]) < 60


@pytest.mark.parametrize("args, needle, code", [
    (["--port", "70000"], "--port = 70000", 2),
    (["--max_sequences", "0"], "max_sequences", 2),
    (["--max_queue", "-1"], "--max_queue", 2),
    (["--max_body", "10"], "--max_body", 2),
    (["--api_key", " "], "--api_key", 2),
    (["--ctx", "0"], "--max_cache_len", 2),
    (["--on_stop", "later"], "--on_stop", 2),
    (["--host", "nosuchhost.invalid"], "cannot listen on nosuchhost.invalid", 1),
])
def test_bad_flags_are_one_line(tiny_model_path, args, needle, code):
    assert_one_line_error(cli("serve", "-m", str(tiny_model_path), *args), needle, code=code)


def test_a_port_in_use_is_one_line(tiny_server, tiny_model_path):
    port = tiny_server.url.rsplit(":", 1)[1]
    assert_one_line_error(cli("serve", "-m", str(tiny_model_path), "--port", port), f"127.0.0.1:{port}", code=1)
