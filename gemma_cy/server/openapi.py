"""The OpenAPI document of `gemma-cy serve` (``GET /openapi.json``,
docs/server.md#the-openapi-document): every endpoint's request body (the
pydantic models of protocol.py that validate it), its responses by status
with OpenAI's shapes, and the bearer key.

The handlers read their bodies themselves (any Content-Type, errors as
OpenAI's objects), so FastAPI does not see the request models; ``document``
adds them. The response models here only describe what the handlers
build; tests/test_server_schema.py holds the two together (schemathesis:
every response must match the document).
"""
from __future__ import annotations

from typing import Literal

from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

FinishReason = Literal["stop", "length", "cancelled"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error object: every 4xx (and 503) the server answers."""

    error: ErrorDetail


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: FinishReason


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion (the last, with
    ``stream_options.include_usage``, has no choices and the usage)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TextChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: FinishReason | None


class TextCompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChunkChoice]
    usage: Usage | None = None


class ModelObject(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    context_length: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelObject]


class Health(BaseModel):
    status: Literal["ok", "busy", "stopping"]


class TokenPiece(BaseModel):
    id: int
    piece: str


class Tokens(BaseModel):
    tokens: list[int] | list[TokenPiece]


class Text(BaseModel):
    content: str


def errors(*statuses: int) -> dict:
    """The ``responses`` entries of these error statuses."""
    why = {400: "a malformed body or an invalid field", 401: "a missing or wrong API key (with --api_key)",
           404: "a model this server does not have", 405: "another method", 413: "a body over --max_body",
           429: "the queue is full (Retry-After)", 503: "the server is stopping (Retry-After)"}
    return {s: {"model": ErrorResponse, "description": why[s]} for s in statuses}


def completion_responses(model, chunk) -> dict:
    """A completions endpoint's responses: the JSON object, or (``stream``)
    server-sent events, each a ``chunk`` (or an error object, if a step
    failed mid-stream) as JSON, then ``[DONE]`` (OpenAPI 3.2's
    ``itemSchema``, with ``contentSchema`` for the JSON in ``data``)."""
    event = {"type": "object", "required": ["data"], "properties": {"data": {
        "type": "string", "if": {"const": "[DONE]"},
        "else": {"contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [{"$ref": f"#/components/schemas/{chunk.__name__}"},
                                             {"$ref": "#/components/schemas/ErrorResponse"}]}}}}}
    return {200: {"model": model, "description": "the completion; with \"stream\": true, server-sent events",
                  "content": {"text/event-stream": {"itemSchema": event}}},
            **errors(400, 401, 404, 413, 429, 503)}


REQUEST_BODIES = {("/v1/chat/completions", "post"): ChatCompletionRequest,
                  ("/v1/completions", "post"): CompletionRequest,
                  ("/tokenize", "post"): TokenizeRequest,
                  ("/detokenize", "post"): DetokenizeRequest}
OPEN_OPERATIONS = {"/", "/health", "/metrics"}  # answered without the key


def document(app, keyed: bool) -> dict:
    """The app's OpenAPI document, with the request bodies the handlers
    validate and, if ``keyed``, the bearer key on every operation but the
    open ones."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="OpenAI's chat and text completions, and llama.cpp's tokenize, over gemma-cy's "
                                  "batching engine (docs/server.md).")
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    _, top = models_json_schema([(m, "validation") for m in REQUEST_BODIES.values()],
                                ref_template="#/components/schemas/{model}")
    components.update(top.get("$defs", {}))
    _, chunks = models_json_schema([(m, "serialization") for m in (ChatCompletionChunk, TextCompletionChunk)],
                                   ref_template="#/components/schemas/{model}")
    components.update(chunks.get("$defs", {}))
    for (path, method), shape in REQUEST_BODIES.items():
        doc["paths"][path][method]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape.__name__}"}}}}
    for path, operations in doc["paths"].items():
        for operation in operations.values():
            operation["responses"].pop("422", None)  # no handler answers FastAPI's validation error
            if keyed and path not in OPEN_OPERATIONS:
                operation["security"] = [{"bearer": []}]
    if keyed:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
