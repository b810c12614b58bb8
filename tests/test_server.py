"""`gemma-cy serve` driven by the official `openai` client (docs/server.md):
every greedy or seeded reply equals the same request through
``Model.complete``/``chat_complete``, token for token; streamed and not,
``n``, ``stop``, ``seed``, ``logprobs``; the model list, health, metrics,
tokenize and detokenize."""
from __future__ import annotations

import json
import os

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the `openai` client (make test installs it)")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx (make test installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")

import gemma_cy  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402

CTX = 512
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a color."}]
# the server's defaults beside OpenAI's fields: no min-p, no top-k (llama.cpp's extensions, off)
SERVER_DEFAULTS = dict(min_p=0.0, top_k=0)


@pytest.fixture(scope="module")
def server(default_model):
    proc = ServerProcess("-m", default_model, "--ctx", str(CTX), "--max_sequences", "4")
    yield proc
    code, log = proc.stop()
    assert code == 0, log


@pytest.fixture(scope="module")
def model(default_model):
    return gemma_cy.load(default_model, max_cache_len=CTX)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_chat_greedy_and_seeded_equal_chat_complete(client, model):
    for kw in (dict(temperature=0), dict(temperature=0.9, seed=17)):
        got = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=12, **kw)
        want = model.chat_complete(MESSAGES, max_tokens=12, **kw, **SERVER_DEFAULTS)
        choice = got.choices[0]
        assert choice.message.content == want.text and choice.message.role == "assistant"
        assert got.usage.completion_tokens == len(want.ids) and got.usage.prompt_tokens == len(want.prompt_ids)
        assert choice.finish_reason == ("length" if want.stop_reason == "max_tokens" else "stop")


def test_chat_stream_gives_the_same_text_and_usage(client, model):
    want = model.chat_complete(MESSAGES, max_tokens=16, temperature=0.7, seed=3, **SERVER_DEFAULTS)
    chunks = list(client.chat.completions.create(model="", messages=MESSAGES, max_tokens=16, temperature=0.7,
                                                 seed=3, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.ids)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # token by token


def test_n_samples_are_seed_plus_k(client, model):
    got = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=5, n=2)
    want = model.chat_complete(MESSAGES, n=2, max_tokens=8, temperature=1.0, seed=5, **SERVER_DEFAULTS)
    assert [c.message.content for c in sorted(got.choices, key=lambda c: c.index)] == [w.text for w in want]


def test_stop_strings_end_the_reply(client, model):
    got = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=20, temperature=0, stop=["e", "a"])
    want = model.chat_complete(MESSAGES, max_tokens=20, temperature=0, stop=["e", "a"], **SERVER_DEFAULTS)
    assert got.choices[0].message.content == want.text
    assert got.choices[0].finish_reason == "stop" and want.stop_reason == "stop"


def test_logprobs_are_the_models(client, model):
    got = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True,
                                         top_logprobs=3)
    want = model.chat_complete(MESSAGES, max_tokens=5, temperature=0, logprobs=3, **SERVER_DEFAULTS)
    content = got.choices[0].logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in want.logprobs]
    for c, lp in zip(content, want.logprobs):
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == c.logprob <= 0  # greedy: the best
        assert bytes(c.bytes) == model.tokenizer.decode_bytes([lp.token_id])


def test_completions_of_text_ids_and_lists(client, model):
    prompt = "The capital of France is"
    got = client.completions.create(model="", prompt=prompt, max_tokens=8, temperature=0)
    want = model.complete(prompt, max_tokens=8, temperature=0, **SERVER_DEFAULTS)
    assert got.choices[0].text == want.text
    ids = model.tokenize(prompt)
    by_ids = client.completions.create(model="", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == want.text
    two = client.completions.create(model="", prompt=[prompt, "Water boils at"], max_tokens=6, temperature=0.8,
                                    seed=9)
    for choice, p in zip(sorted(two.choices, key=lambda c: c.index), [prompt, "Water boils at"]):
        assert choice.text == model.complete(p, max_tokens=6, temperature=0.8, seed=9, **SERVER_DEFAULTS).text
    echo = client.completions.create(model="", prompt=prompt, max_tokens=8, temperature=0, echo=True)
    assert echo.choices[0].text == model.detokenize(ids) + want.text


def test_completions_logprobs_and_stream(client, model):
    prompt = "One, two, three,"
    got = client.completions.create(model="", prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    want = model.complete(prompt, max_tokens=6, temperature=0, logprobs=2, **SERVER_DEFAULTS)
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == [x.logprob for x in want.logprobs]
    assert "".join(lp.tokens) == want.text and lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="", prompt=prompt, max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == want.text


def test_models_health_metrics_tokenize(server, client, model, default_model):
    listed = client.models.list().data
    assert [m.id for m in listed] == [os.path.basename(default_model)]
    one = client.models.retrieve(listed[0].id)  # the official client's retrieve: GET /v1/models/{id}
    assert one.id == listed[0].id and one.owned_by == "gemma-cy"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with httpx.Client(base_url=server.url, timeout=30) as h:
        assert h.get("/health").json() == {"status": "ok"}
        ids = h.post("/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]
        assert ids == model.tokenize("hello world", add_bos=True)
        assert h.post("/detokenize", json={"tokens": ids}).json()["content"] == model.detokenize(ids)
        text = h.get("/metrics").text
    for name in ("gemma_cy_requests_total", "gemma_cy_generated_tokens_total", "gemma_cy_prompt_tokens_total",
                 "gemma_cy_queue_depth", "gemma_cy_live_sequences", "gemma_cy_decode_tokens_per_second"):
        assert name in text, name
    generated = [line for line in text.splitlines() if line.startswith("gemma_cy_generated_tokens_total")]
    assert float(generated[0].split()[-1]) > 0
    assert 'gemma_cy_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert 'gemma_cy_requests_total{endpoint="/v1/models/{model_id:path}",status="404"}' in text


def test_the_served_model_name_is_checked(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"


SCHEMA = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                                          "shade": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["color", "shade"], "additionalProperties": False}


def test_response_format_json_schema_is_the_models_constrained_reply(client, model):
    jsonschema = pytest.importorskip("jsonschema", reason="the reply's oracle is the jsonschema package")
    fmt = {"type": "json_schema", "json_schema": {"name": "color", "schema": SCHEMA, "strict": True}}
    got = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=60, temperature=0,
                                         response_format=fmt)
    want = model.chat_complete(MESSAGES, max_tokens=60, temperature=0, response_format=fmt, **SERVER_DEFAULTS)
    assert want.stop_reason == "grammar" and got.choices[0].finish_reason == "stop"
    assert got.choices[0].message.content == want.text
    jsonschema.validate(json.loads(want.text), SCHEMA)


def test_llama_cpp_grammar_field_on_completions(client, model):
    got = client.completions.create(model="", prompt="The answer is", max_tokens=10, temperature=0,
                                    extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'})
    want = model.complete("The answer is", max_tokens=10, temperature=0, grammar='root ::= " " ("yes" | "no") "."',
                          **SERVER_DEFAULTS)
    assert got.choices[0].text == want.text and want.text in (" yes.", " no.")


def test_a_constraint_that_does_not_compile_is_a_400_naming_it(client):
    for kw, param in ((dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "format": "no-such-format"}}}), "response_format"),
                      (dict(extra_body={"json_schema": {"type": "integer", "unevaluatedItems": 1}}), "json_schema")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="", messages=MESSAGES, max_tokens=2, **kw)
        assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error", e.value.body


def test_raw_sse_ends_with_done(server):
    with httpx.Client(base_url=server.url, timeout=60) as h:
        with h.stream("POST", "/v1/chat/completions", content=json.dumps(
                {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True})) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert len(lines) >= 1 + 1 + 1 + 1  # the role, at least one token, the finish, [DONE]


def test_the_chat_page_is_one_self_contained_file(server):
    with httpx.Client(base_url=server.url, timeout=30) as h:
        r = h.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "/v1/chat/completions" in page and 'id="system"' in page and "tok/s" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere: works offline


COPY_MESSAGES = [{"role": "user", "content": "Copy this exactly: the quick brown fox jumps over the lazy dog, "
                                             "the quick brown fox jumps over the lazy dog, the quick brown fox."}]


def test_speculative_lookup_is_the_plain_reply(client, model):
    """gemma-cy's extension field: each of n samples drafts on its own in
    the batch, and the replies are plain decoding's."""
    for kw in (dict(temperature=0), dict(temperature=0.8, seed=9, n=2)):
        got = client.chat.completions.create(model="", messages=COPY_MESSAGES, max_tokens=30,
                                             extra_body={"speculative": "lookup", "draft_max": 6}, **kw)
        want = model.chat_complete(COPY_MESSAGES, max_tokens=30, **kw, **SERVER_DEFAULTS)
        want = want if isinstance(want, list) else [want]
        assert [c.message.content for c in sorted(got.choices, key=lambda c: c.index)] == [w.text for w in want]
    for body, param in (({"speculative": "draft"}, "speculative"), ({"draft_max": 4}, "draft_max"),
                        ({"speculative": "lookup", "draft_max": 40}, "draft_max")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="", messages=COPY_MESSAGES, max_tokens=2, extra_body=body)
        assert e.value.body["type"] == "invalid_request_error" and e.value.body["param"] == param, e.value.body


def test_the_servers_draft_is_each_requests_unless_it_says(model):
    """`serve --draft lookup` drafts for every request that does not set `speculative`."""
    from gemma_cy.server.protocol import ChatCompletionRequest
    from gemma_cy.server.requests import sequence_params

    ids = model.chat_ids(COPY_MESSAGES)
    for body, draft, want in (({}, None, None), ({}, "lookup", "lookup"), ({"speculative": "none"}, "lookup", None),
                              ({"speculative": "lookup"}, None, "lookup")):
        req = ChatCompletionRequest(messages=COPY_MESSAGES, **body)
        params = sequence_params(model, req, ids, 4, None, draft)
        assert params.speculative == want, (body, draft)
