"""Request bodies of `gemma-cy serve`, as OpenAI's API defines them
(docs/server.md#endpoints), validated by pydantic.

Fields OpenAI defines and gemma-cy does not implement are refused by name
(``UNSUPPORTED``) rather than ignored; fields no API defines are refused
(extra="forbid"), except those llama.cpp's server adds and gemma-cy
implements (``top_k``, ``min_p``, ``repeat_penalty``).
"""
from __future__ import annotations

import json
import os
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ParameterError
from ..generation.params import GenerationParams

MAX_N = 16  # samples of one prompt per request
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
# OpenAI fields gemma-cy does not implement: accepted when null, else refused by name
UNSUPPORTED = ("logit_bias", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
               "service_tier", "store", "metadata", "modalities", "audio", "prediction", "reasoning_effort",
               "web_search_options")


class Sampling(BaseModel):
    """The sampling fields both endpoints share. Ranges are GenerationParams'
    (checked by ``to_params``), but for OpenAI's own, narrower ones."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = 1.0
    top_k: int = 0  # llama.cpp's extension; 0: off
    min_p: float = 0.0  # llama.cpp's extension; 0: off
    repeat_penalty: float = 1.0  # llama.cpp's extension; 1: off
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    grammar: str | None = None  # llama.cpp's extension: a GBNF (or Lark) grammar
    json_schema: dict | None = None  # llama.cpp's extension: a JSON Schema
    speculative: Literal["lookup", "none"] | None = None  # gemma-cy's: draft by prompt lookup (None: the server's --draft)
    draft_max: int | None = None  # gemma-cy's: ids drafted at most per block

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data):
        if isinstance(data, dict):
            for key in UNSUPPORTED:
                if key in data:
                    if data[key] not in (None, [], {}):
                        raise ValueError(f"{key}: not supported by gemma-cy")
                    data = {k: v for k, v in data.items() if k != key}
        return data

    def constraint(self) -> dict:
        """The structured-output keywords this request gives (docs/structured_output.md)."""
        fmt = getattr(self, "response_format", None)
        out = {"response_format": fmt.model_dump() if fmt is not None else None,
               "grammar": self.grammar, "json_schema": self.json_schema}
        return {k: v for k, v in out.items() if v is not None}

    def to_params(self, max_tokens: int, logprobs: int | None, draft: str | None = None) -> GenerationParams:
        """The request's GenerationParams (checked there: ParameterError
        naming the field); a seed drawn at random when none is given.
        ``draft``: the server's speculative draft, unless the request says."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise ParameterError(f"stop: at most {MAX_STOP} strings, got {len(stops)}")
        speculative = draft if self.speculative is None else self.speculative
        if speculative != "lookup" and self.draft_max is not None:
            raise ParameterError("draft_max: needs speculative decoding (\"speculative\": \"lookup\", or the "
                                 "server's --draft lookup)")
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")
        return GenerationParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                                top_k=self.top_k, min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                                presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                seed=seed, stop=tuple(stops), logprobs=logprobs,
                                speculative="lookup" if speculative == "lookup" else None,
                                draft_max=self.draft_max, **self.constraint())


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """A chat message; content as a string or a list of text parts."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, value):
        """A string or text parts; anything else named by its part, not by
        the validator's internal path (``content.str``, ``content.list[...]``)."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("expected a string or a list of text parts ({\"type\": \"text\", \"text\": ...})")
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                what = f"type {json.dumps(kind)}" if isinstance(part, dict) else f"a {type(part).__name__}"
                raise ValueError(f"part {i} is {what}: gemma-cy reads text parts only "
                                 "({\"type\": \"text\", \"text\": ...})")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i}: a text part needs \"text\", a string")
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None


class CompletionRequest(Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(min_length=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value):
        def ids(v):
            return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        if isinstance(value, str) or (isinstance(value, list) and value and (
                ids(value) or all(isinstance(p, str) for p in value) or all(ids(p) for p in value))):
            return value
        raise ValueError("expected a string, a list of strings, a list of token ids or a list of such lists "
                         "(not empty)")


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str
    add_special: bool = False
    parse_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[int]


Sampling.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
