"""`gemma-cy serve` when clients leave and when it is told to stop
(docs/server.md#scheduling, #running-it): a non-streaming request whose
client goes away frees its slot within 1 s whatever the token rate, and
SIGTERM then exits within 2 s; while a stopping server drains, /health
and new requests are answered 503 and the running request still ends."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (make test installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")

from server_helpers import ServerProcess  # noqa: E402

# Gemma 3 270M counts on greedily from here for thousands of tokens (~45 tok/s
# on one core): a request that runs far longer than any check below.
COUNTING = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000, "temperature": 0}


def live_sequences(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("gemma_cy_live_sequences ")).split()[-1])


def wait_for(condition, timeout: float, step: float = 0.02) -> float:
    """Seconds until ``condition()`` held (pytest.fail past ``timeout``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def post_raw(url: str, body: dict) -> socket.socket:
    """A POST sent on a bare socket, its answer never read."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


@pytest.fixture(scope="module")
def server(default_model):
    proc = ServerProcess("-m", default_model, "--ctx", "4096", "--max_sequences", "2")
    yield proc
    proc.stop()


def leave(how: str, url: str) -> None:
    """Start the counting request, let it decode for a second, then leave as ``how`` says."""
    if how == "read timeout":
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=COUNTING, timeout=httpx.Timeout(10, read=1.5))
        return
    sock = post_raw(url, COUNTING)
    wait_for(lambda: live_sequences(url) == 1, 30)
    time.sleep(1.0)  # tokens arrive every ~20 ms meanwhile
    if how == "shutdown":
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.mark.parametrize("how", ["close", "shutdown", "read timeout"])
def test_a_non_streaming_client_that_leaves_frees_its_slot_within_1s(server, how):
    leave(how, server.url)
    took = wait_for(lambda: live_sequences(server.url) == 0, 1.0)
    assert took < 1.0
    r = httpx.post(server.url + "/v1/completions", json={**COUNTING, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_sigterm_with_a_left_request_pending_exits_within_2s(default_model):
    proc = ServerProcess("-m", default_model, "--ctx", "4096", "--max_sequences", "2")
    try:
        sock = post_raw(proc.url, COUNTING)
        wait_for(lambda: live_sequences(proc.url) == 1, 30)
        time.sleep(0.5)
        sock.close()
        start = time.monotonic()
        code, log = proc.stop(timeout=30)
        took = time.monotonic() - start
    finally:
        proc.proc.kill()
    assert code == 0, log
    assert took < 2.0, took


def test_a_draining_server_answers_503_and_finishes_what_runs(default_model):
    proc = ServerProcess("-m", default_model, "--ctx", "512", "--max_sequences", "2")
    chunks: list[dict] = []

    def stream():
        with httpx.Client(base_url=proc.url, timeout=120) as h:
            with h.stream("POST", "/v1/completions", json={**COUNTING, "max_tokens": 150, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:])["choices"][0])
    thread = threading.Thread(target=stream)
    try:
        assert httpx.get(proc.url + "/health", timeout=10).json() == {"status": "ok"}
        thread.start()
        wait_for(lambda: bool(chunks), 60)
        proc.proc.send_signal(15)
        wait_for(lambda: httpx.get(proc.url + "/health", timeout=10).status_code == 503, 5)
        health = httpx.get(proc.url + "/health", timeout=10)
        assert health.json() == {"status": "stopping"}
        refused = httpx.post(proc.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert "shutting down" in error["message"] and error["code"] == "shutting_down"
        assert len(chunks) < 150  # all of that happened while the request still ran
        thread.join(120)
        code, log = proc.stop(timeout=30)
    finally:
        proc.proc.kill()
    assert code == 0, log
    assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == ["length"]
    assert len([c for c in chunks if c["text"]]) >= 100
