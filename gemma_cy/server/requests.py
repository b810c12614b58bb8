"""One HTTP request's sequences on the engine thread, and OpenAI's shapes
for what they make (docs/server.md#endpoints).

``RequestRun`` submits a request's sequences (``n`` samples, or one per
prompt) to the EngineLoop and turns the thread's reports into an asyncio
queue the handler awaits; ``cancel`` frees their slots (a client gone).
The rest builds each endpoint's response objects and stream chunks.
"""
from __future__ import annotations

import asyncio
import time
import uuid

from ..errors import ContextLengthError, GemmaCyError
from ..generation.params import DATA_FIELDS, GenerationParams
from ..generation.logprobs import TokenLogprob
from .engine_loop import EngineLoop, Event, TokenEvent
from .protocol import Sampling

FINISH_REASONS = {"eos": "stop", "stop": "stop", "rejected": "stop", "grammar": "stop", "max_tokens": "length", "length": "length",
                  "cancelled": "cancelled"}


class BadRequest(GemmaCyError):
    """A request that cannot run: HTTP 400 with OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def sequence_params(model, req: Sampling, ids: list[int], max_tokens: int | None, logprobs: int | None,
                    draft: str | None = None) -> GenerationParams:
    """The settings of a request's sequences (``req.to_params``), checked
    against ``ids`` and the model (``Model.check``); BadRequest naming the
    field. ``draft``: the server's speculative draft ("lookup" or None),
    used unless the request says (``speculative``). Sample k of ``n`` runs
    ``.for_sample(k)`` (seed + k, as ``complete(n=...)``)."""
    where = "messages" if hasattr(req, "messages") else "prompt"  # the field that holds the prompt
    room = model.context_len - len(ids)
    if room < 1:
        raise BadRequest(f"the prompt is {len(ids)} tokens; this model's context is {model.context_len} tokens "
                         f"(need at least one free position)", where, "context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise BadRequest(f"max_tokens = {max_tokens}: the prompt's {len(ids)} tokens leave {room} of the "
                         f"context's {model.context_len}", "max_tokens", "context_length_exceeded")
    try:
        params = req.to_params(room if max_tokens is None else max_tokens, logprobs, draft)
        model.check(ids, params)
    except ContextLengthError as e:
        raise BadRequest(str(e), where, "context_length_exceeded") from None
    except GemmaCyError as e:
        param = str(e).split(":", 1)[0].split(" ", 1)[0]
        raise BadRequest(str(e), param if param in DATA_FIELDS else None) from None
    return params


class RequestRun:
    """A request's sequences in flight: ``events()`` yields ``(k, event)``
    for sequence k (EngineLoop's events) until every one is done."""

    def __init__(self, engine: EngineLoop, sequences: list[tuple[list[int], GenerationParams]]):
        self.engine = engine
        self.queue: asyncio.Queue = asyncio.Queue()
        self.open = len(sequences)
        loop = asyncio.get_running_loop()

        def sink_of(k: int):
            return lambda event: loop.call_soon_threadsafe(self.queue.put_nowait, (k, event))
        self.tickets = engine.submit([(ids, params, sink_of(k)) for k, (ids, params) in enumerate(sequences)])

    async def next_event(self) -> tuple[int, Event] | None:
        """The next event, or None once the client went away (``abandon``)."""
        k, event = await self.queue.get()
        if k is None:
            return None
        if not isinstance(event, TokenEvent):
            self.open -= 1
        return k, event

    def cancel(self) -> None:
        self.engine.cancel(self.tickets)

    def abandon(self) -> None:
        """The client went away: the sequences cancelled, and the handler
        waiting on ``next_event`` woken with None."""
        self.cancel()
        self.queue.put_nowait((None, None))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def token_text(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text (invalid UTF-8 replaced) and its bytes."""
    data = tokenizer.decode_bytes([token_id])
    return data.decode("utf-8", "replace"), list(data)


def chat_logprob(tokenizer, lp: TokenLogprob) -> dict:
    """OpenAI's chat ``logprobs.content`` entry of one token."""
    text, data = token_text(tokenizer, lp.token_id)
    top = []
    for i, value in lp.top:
        t, b = token_text(tokenizer, i)
        top.append({"token": t, "logprob": value, "bytes": b})
    return {"token": text, "logprob": lp.logprob, "bytes": data, "top_logprobs": top}


def completion_logprobs(tokenizer, lps: list[TokenLogprob], offset: int) -> dict:
    """OpenAI's (legacy) completions ``logprobs`` object; text offsets from ``offset``."""
    tokens, offsets, tops = [], [], []
    for lp in lps:
        text = token_text(tokenizer, lp.token_id)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        tops.append({token_text(tokenizer, i)[0]: v for i, v in lp.top})
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps], "top_logprobs": tops,
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def prompt_id_lists(model, prompt) -> list[list[int]]:
    """A completions ``prompt`` (a string, strings, ids, lists of ids) as id lists; BadRequest."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    out = []
    for i, p in enumerate(prompts):
        try:
            out.append(model.prompt_ids(p))
        except GemmaCyError as e:
            raise BadRequest(f"prompt {i}: {e}" if len(prompts) > 1 else f"prompt: {e}", "prompt") from None
        if isinstance(p, list) and not p:
            raise BadRequest("prompt: an empty list of ids", "prompt")
    return out


def chat_messages(req) -> list[dict]:
    """The request's messages as the chat template takes them ("developer" is OpenAI's "system")."""
    return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]


def refuse_unsupported(req, chat: bool) -> None:
    if chat and req.top_logprobs is not None and not req.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    if not chat:
        if req.suffix:
            raise BadRequest("suffix: not supported by gemma-cy", "suffix", "unsupported")
        if req.best_of not in (None, 1, req.n):
            raise BadRequest("best_of: not supported by gemma-cy (only best_of = n)", "best_of", "unsupported")
        if req.echo and req.logprobs is not None:
            raise BadRequest("echo with logprobs: the prompt's log-probabilities are not supported yet",
                             "logprobs", "unsupported")
