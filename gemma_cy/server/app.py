"""`gemma-cy serve`'s HTTP API: OpenAI's chat and text completions, the
model list, health, Prometheus metrics and llama.cpp's tokenize and
detokenize, over one EngineLoop (docs/server.md).

Every error is OpenAI's error object, ``{"error": {"message", "type",
"param", "code"}}``, with a 4xx status: malformed JSON and invalid fields
400, an unknown model 404, a wrong key 401, a body over the limit 413, a
full queue 429 with Retry-After. A client that goes away has its
sequences cancelled at the next step.
"""
from __future__ import annotations

import asyncio
import functools
import json
from importlib.metadata import version
from pathlib import Path

from fastapi import FastAPI, Request
from pydantic import ValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import GemmaCyError, TemplateError
from .engine_loop import DoneEvent, EngineLoop, ErrorEvent, QueueFull, ShuttingDown, TokenEvent
from .openapi import (ChatCompletion, ChatCompletionChunk, Health, ModelList, ModelObject, Text, TextCompletion,
                      TextCompletionChunk, Tokens, completion_responses, document, errors)
from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .requests import (FINISH_REASONS, BadRequest, RequestRun, chat_logprob, chat_messages, completion_logprobs,
                       new_id, now, prompt_id_lists, refuse_unsupported, sequence_params, usage)

DEFAULT_MAX_BODY = 1 << 20
OPEN_PATHS = ("/", "/health", "/metrics")  # answered without the API key
UNKNOWN_ENDPOINT = "(unknown)"  # the metrics label of every path the server has no route for
PAGE = Path(__file__).with_name("chat.html")


def error_body(message: str, kind: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, kind: str = "invalid_request_error", param=None, code=None,
                   headers=None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)


class Metrics:
    """The /metrics registry (one per app)."""

    def __init__(self, engine: EngineLoop):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("gemma_cy_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        r.register(_TokenCounts(engine))
        Gauge("gemma_cy_queue_depth", "sequences waiting for a slot", registry=r).set_function(
            lambda: engine.stats.waiting)
        Gauge("gemma_cy_live_sequences", "sequences in slots", registry=r).set_function(lambda: engine.stats.live)
        Gauge("gemma_cy_decode_tokens_per_second", "tokens generated per second, last second", registry=r) \
            .set_function(lambda: engine.stats.decode_tok_s)


class ModelNotFound(GemmaCyError):
    """A request for a model this server does not have: 404."""


class _TokenCounts:
    """Counters of the engine thread's token totals, read at each scrape."""

    def __init__(self, engine: EngineLoop):
        self.engine = engine

    def collect(self):
        stats = self.engine.stats
        yield CounterMetricFamily("gemma_cy_prompt_tokens", "prompt tokens submitted", value=stats.prompt_tokens)
        yield CounterMetricFamily("gemma_cy_generated_tokens", "tokens generated", value=stats.generated_tokens)


class BodyLimit:
    """ASGI middleware: the request body is read up to ``limit`` bytes before
    the app sees it; more (declared or sent) gets 413 and is not read on."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                return await self._too_large(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send):
        response = error_response(413, f"request body over {self.limit} bytes", code="body_too_large",
                                  headers={"Connection": "close"})
        await response(scope, receive, send)


def create_app(model, engine: EngineLoop, model_name: str, api_key: str | None = None,
               max_body: int = DEFAULT_MAX_BODY, draft: str | None = None) -> FastAPI:
    disable_created_metrics()
    app = FastAPI(title="gemma-cy", version=version("gemma-cy"), docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    metrics = Metrics(engine)
    app.state.engine, app.state.metrics = engine, metrics

    def endpoint_of(request: Request) -> str:
        """The metrics label of a request: its route's path template
        ("/v1/models/{model_id:path}"), never the raw path (a label per
        requested path would let any client grow /metrics without bound)."""
        for route in app.routes:
            if route.matches(request.scope)[0] != Match.NONE:  # (PARTIAL: the path, another method)
                return route.path
        return UNKNOWN_ENDPOINT

    @app.middleware("http")
    async def count_and_check_key(request: Request, call_next):
        if api_key is not None and request.url.path not in OPEN_PATHS:
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                response = error_response(401, "a missing or wrong API key (Authorization: Bearer KEY)",
                                          "authentication_error", code="invalid_api_key")
                metrics.requests.labels(endpoint_of(request), "401").inc()
                return response
        response = await call_next(request)
        metrics.requests.labels(endpoint_of(request), str(response.status_code)).inc()
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return error_response(400, str(exc), param=exc.param, code=exc.code)

    @app.exception_handler(ModelNotFound)
    async def not_found(request: Request, exc: ModelNotFound):
        return error_response(404, str(exc), "not_found_error", "model", "model_not_found")

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull):
        return error_response(429, f"busy: {exc}; retry later", "rate_limit_error", code="queue_full",
                              headers={"Retry-After": "1"})

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, exc: ShuttingDown):
        return error_response(503, str(exc), "server_error", code="shutting_down",
                              headers={"Retry-After": "1", "Connection": "close"})

    async def accepted(request: Request, shape):
        """The request's body as ``shape``, for the served model, asking only
        for what gemma-cy does (else BadRequest, or ModelNotFound)."""
        body = await parse(request, shape)
        if body.model not in (None, "", model_name):
            raise ModelNotFound(f"model {body.model!r} does not exist; this server has {model_name!r}")
        refuse_unsupported(body, chat=shape is ChatCompletionRequest)
        return body

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8") if PAGE.exists() else "<p>gemma-cy</p>")

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "busy or stopping"}})
    async def health():
        """200 "ok"; 503 "stopping" while a stopped server drains (so a
        balancer sends it nothing new), 503 "busy" while its queue is full."""
        if engine.stopping:
            return JSONResponse({"status": "stopping"}, status_code=503, headers={"Connection": "close"})
        if not engine.accepting:
            return JSONResponse({"status": "busy"}, status_code=503, headers={"Retry-After": "1"})
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus text"}})
    async def metrics_text():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_object() -> dict:
        return {"id": model_name, "object": "model", "created": now(), "owned_by": "gemma-cy",
                "context_length": model.context_len}

    @app.get("/v1/models", response_model=ModelList, responses=errors(401))
    async def models():
        return {"object": "list", "data": [model_object()]}

    @app.get("/v1/models/{model_id:path}", response_model=ModelObject, responses=errors(401, 404))
    async def one_model(model_id: str):
        """OpenAI's retrieve (``client.models.retrieve``): the model, or 404 model_not_found."""
        if model_id != model_name:
            raise ModelNotFound(f"model {model_id!r} does not exist; this server has {model_name!r}")
        return model_object()

    @app.post("/tokenize", response_model=Tokens, responses=errors(400, 401, 413))
    async def tokenize(request: Request):
        body = await parse(request, TokenizeRequest)
        ids = model.tokenize(body.content, add_bos=body.add_special, parse_special=body.parse_special)
        if body.with_pieces:
            return {"tokens": [{"id": i, "piece": model.tokenizer.decode_bytes([i]).decode("utf-8", "replace")}
                               for i in ids]}
        return {"tokens": ids}

    @app.post("/detokenize", response_model=Text, responses=errors(400, 401, 413))
    async def detokenize(request: Request):
        body = await parse(request, DetokenizeRequest)
        bad = [i for i in body.tokens if not 0 <= i < model.config.vocab_size]
        if bad:
            raise BadRequest(f"token id {bad[0]} outside the vocabulary [0, {model.config.vocab_size})", "tokens")
        return {"content": model.detokenize(body.tokens)}

    @app.post("/v1/chat/completions", responses=completion_responses(ChatCompletion, ChatCompletionChunk))
    async def chat_completions(request: Request):
        body = await accepted(request, ChatCompletionRequest)
        try:
            ids = model.chat_ids(chat_messages(body))
        except TemplateError as e:
            raise BadRequest(str(e), "messages", "template_error") from None
        except GemmaCyError as e:
            raise BadRequest(str(e), "messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        top = (body.top_logprobs or 0) if body.logprobs else None
        params = sequence_params(model, body, ids, max_tokens, top, draft)
        run = RequestRun(engine, [(ids, params.for_sample(k)) for k in range(body.n)])
        meta = {"id": new_id("chatcmpl"), "created": now(), "model": model_name}
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def choice(k, completion):
            return {"index": k, "message": {"role": "assistant", "content": completion.text},
                    "logprobs": None if top is None else
                    {"content": [chat_logprob(model.tokenizer, lp) for lp in completion.logprobs]},
                    "finish_reason": finish_reason(completion)}
        return await respond(request, run, body.stream and chat_chunks(run, meta, model.tokenizer, len(ids),
                                                                       include_usage),
                             choice, {**meta, "object": "chat.completion"}, len(ids))

    @app.post("/v1/completions", responses=completion_responses(TextCompletion, TextCompletionChunk))
    async def completions(request: Request):
        body = await accepted(request, CompletionRequest)
        prompts = prompt_id_lists(model, body.prompt)
        sequences = []
        for ids in prompts:
            params = sequence_params(model, body, ids, body.max_tokens, body.logprobs, draft)
            sequences += [(ids, params.for_sample(k)) for k in range(body.n)]
        run = RequestRun(engine, sequences)
        meta = {"id": new_id("cmpl"), "created": now(), "model": model_name}
        echoes = [model.detokenize(ids) if body.echo else "" for ids in prompts for _ in range(body.n)]
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        in_tokens = sum(len(ids) for ids in prompts)  # each prompt once, whatever n (as OpenAI counts)

        def choice(k, completion):
            return {"index": k, "text": echoes[k] + completion.text,
                    "logprobs": None if body.logprobs is None else
                    completion_logprobs(model.tokenizer, completion.logprobs, len(echoes[k])),
                    "finish_reason": finish_reason(completion)}
        return await respond(request, run, body.stream and text_chunks(run, meta, model.tokenizer, echoes,
                                                                       in_tokens, include_usage),
                             choice, {**meta, "object": "text_completion"}, in_tokens)

    app.openapi = functools.cache(lambda: document(app, keyed=api_key is not None))
    return BodyLimit(app, max_body)


async def parse(request: Request, shape):
    """The body as JSON (whatever the Content-Type says, as llama.cpp's
    server reads it), validated as ``shape``; BadRequest naming the field."""
    raw = await request.body()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("malformed JSON: the body is not UTF-8", code="json_invalid") from None
    except ValueError as e:
        raise BadRequest(f"malformed JSON: {e}", code="json_invalid") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply", code="json_invalid") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}", code="json_invalid")
    try:
        return shape.model_validate(data, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = first.get("msg", "invalid").removeprefix("Value error, ")
        if param and first.get("type") != "missing":
            value = json.dumps(first.get("input"))
            message = f"{param} = {value if len(value) <= 60 else value[:57] + '...'}: {message}"
        elif param:
            message = f"{param}: {message}"
        raise BadRequest(message, param) from None


def finish_reason(completion) -> str:
    """OpenAI's finish_reason of a Completion (None: cancelled before it ran)."""
    return "cancelled" if completion is None else FINISH_REASONS[completion.stop_reason]


async def respond(request: Request, run: RequestRun, chunks, choice, head: dict, in_tokens: int):
    """A streamed request's events (``chunks``), or, for one that is not
    streamed, the response: ``head``, ``choice(k, completion)`` of every
    sequence, and the usage. A client gone away: 499, its sequences
    cancelled; a sequence that failed: 500 (503 if the server stopped it)."""
    if chunks:
        return sse(request, run, chunks)
    finals = await gather(request, run)
    if finals is None:
        return Response(status_code=499)
    for _, error in finals:
        if error is not None:
            return error_response(503 if error.startswith("cancelled") else 500, error, "server_error")
    completions = [c for c, _ in finals]
    out_tokens = sum(len(c.ids) for c in completions)
    return {**head, "choices": [choice(k, c) for k, c in enumerate(completions)],
            "usage": usage(in_tokens, out_tokens, completions[0].timing.reused_tokens)}


async def gather(request: Request, run: RequestRun) -> list | None:
    """Every sequence's (Completion, error message) in order, or None if
    the client went away first: a watcher waits on the connection's own
    disconnect message, so the sequences are cancelled as soon as the
    socket closes, however fast tokens arrive."""
    finals: list = [(None, None)] * len(run.tickets)
    watcher = asyncio.create_task(abandon_when_gone(request, run))
    try:
        while run.open:
            got = await run.next_event()
            if got is None:
                return None
            k, event = got
            if isinstance(event, DoneEvent) and event.completion is None:
                finals[k] = (None, "cancelled: the server is shutting down")
            elif isinstance(event, DoneEvent):
                finals[k] = (event.completion, None)
            elif isinstance(event, ErrorEvent):
                finals[k] = (None, event.message)
    except asyncio.CancelledError:
        run.cancel()
        raise
    finally:
        watcher.cancel()
    return finals


async def abandon_when_gone(request: Request, run: RequestRun) -> None:
    """Wait for the ASGI ``http.disconnect`` of ``request`` (its body is
    read already, so the next message is that), then abandon ``run``."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.abandon()
            return


def sse(request: Request, run: RequestRun, chunks) -> StreamingResponse:
    """Server-sent events of ``chunks`` (dicts), ``data: [DONE]`` last; the
    sequences are cancelled if the client goes away mid-stream."""
    async def events():
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if run.open:
                run.cancel()
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def stream_chunks(run: RequestRun, base: dict, opening: list[dict], token_choice, end_choice,
                        n_prompt: int, include_usage: bool):
    """A streamed request's chunks: the ``opening`` choices, one chunk per
    token with text (or a log-probability): ``token_choice(k, step,
    logprob)``, one per sequence's end: ``end_choice(k)`` and its
    finish_reason, then the usage if asked for."""
    for choice in opening:
        yield {**base, "choices": [{**choice, "finish_reason": None}]}
    out_tokens = 0
    while run.open:
        k, event = await run.next_event()
        if isinstance(event, TokenEvent):
            if event.step.text or event.logprob is not None:
                yield {**base, "choices": [{**token_choice(k, event.step, event.logprob), "finish_reason": None}]}
        elif isinstance(event, DoneEvent):
            out_tokens += len(event.completion.ids) if event.completion is not None else 0
            yield {**base, "choices": [{**end_choice(k), "finish_reason": finish_reason(event.completion)}]}
        else:
            yield {"error": error_body(event.message, "server_error")["error"]}
    if include_usage:
        yield {**base, "choices": [], "usage": usage(n_prompt, out_tokens)}


def chat_chunks(run: RequestRun, meta: dict, tokenizer, n_prompt: int, include_usage: bool):
    """/v1/chat/completions streamed: the role first, then ``delta.content``."""
    def token(k, step, lp):
        return {"index": k, "delta": {"content": step.text},
                "logprobs": None if lp is None else {"content": [chat_logprob(tokenizer, lp)]}}
    opening = [{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
               for k in range(len(run.tickets))]
    return stream_chunks(run, {**meta, "object": "chat.completion.chunk"}, opening, token,
                         lambda k: {"index": k, "delta": {}, "logprobs": None}, n_prompt, include_usage)


def text_chunks(run: RequestRun, meta: dict, tokenizer, echoes: list[str], n_prompt: int, include_usage: bool):
    """/v1/completions streamed: the echoed prompt first, then ``text``."""
    offsets = [len(e) for e in echoes]

    def token(k, step, lp):
        logprobs = None if lp is None else completion_logprobs(tokenizer, [lp], offsets[k])
        offsets[k] += len(step.text)
        return {"index": k, "text": step.text, "logprobs": logprobs}
    opening = [{"index": k, "text": echo, "logprobs": None} for k, echo in enumerate(echoes) if echo]
    return stream_chunks(run, {**meta, "object": "text_completion"}, opening, token,
                         lambda k: {"index": k, "text": "", "logprobs": None}, n_prompt, include_usage)
