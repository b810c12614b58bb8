"""Chat templates: a list of messages -> the token ids a model's chat expects (docs/generation.md#chat).

A GGUF carries its model's Jinja template (``tokenizer.chat_template``); it
is rendered as transformers and llama-cpp-python render it, with jinja2,
but in jinja2's **immutable sandbox**: a template is code inside a file
downloaded from anywhere, so it may loop and branch over the messages but
never reach a Python object's internals (any attribute starting with "_"
is an error here, not a silent empty string). Files without a template
(GMW1, GMT1 vocabularies, a GGUF that left it out, as the packaged Gemma 3
base model does) get a built-in one chosen by the turn markers in their
vocabulary: Gemma 3's own template, or plain ChatML.

The rendered text is tokenized with the template's markers as control
tokens (transformers' ``apply_chat_template(..., tokenize=True)``), with one
difference: a control piece that a message's *content* spells out
(``<end_of_turn>`` typed by a user) stays plain text, as everywhere else in
gemma-cy (docs/errors.md#case-20).
"""
from __future__ import annotations

import datetime
import functools
import json
import re
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import ModelFormatError, ParameterError, TemplateError

# Gemma 3's chat template, as Google ships it with the instruction-tuned
# models: a system message becomes the start of the first user turn; roles
# must alternate; the assistant's role is called "model"; content is trimmed.
GEMMA_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# Plain ChatML, for a vocabulary with its markers but no template of its own.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# The pieces that end a model's turn, by the marker a template uses.
_TURN_ENDS = (("<end_of_turn>", ("<end_of_turn>",)), ("<turn|>", ("<turn|>",)),  # Gemma 3, Gemma 4
              ("<|im_end|>", ("<|im_end|>", "<|endoftext|>")))


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template: ``name`` is "file" (the model file's own),
    "gemma" or "chatml" (built in); ``stop_pieces`` end the model's turn."""

    name: str
    source: str
    stop_pieces: tuple[str, ...]


TEMPLATE_KEY = "tokenizer.chat_template"


def template_from_gguf(gf) -> str | None:
    """The chat template a parsed GGUF file carries (``tokenizer.chat_template``),
    None when it has none; ModelFormatError when the key is not a string.
    Every tokenizer read from a GGUF takes its template from here, whatever
    its vocabulary type (docs/generation.md#chat)."""
    from ..formats import gguf_reader

    field = gf.fields.get(TEMPLATE_KEY)
    if field is None:
        return None
    if field.type != gguf_reader.STRING:
        raise ModelFormatError(f"{gf.path}: metadata key {TEMPLATE_KEY} has type {gguf_reader.type_name(field)}, "
                               f"must be a string")
    return field.value


def _stop_pieces(source: str) -> tuple[str, ...]:
    for marker, pieces in _TURN_ENDS:
        if marker in source:
            return pieces
    return ()


def chat_template_for(tokenizer) -> ChatTemplate | None:
    """The template of ``tokenizer``'s model: the file's own if it has one,
    else a built-in one by the markers in its vocabulary, else None."""
    source = getattr(tokenizer, "chat_template", None)
    if source:
        return ChatTemplate("file", source, _stop_pieces(source))
    if tokenizer.token_id("<start_of_turn>") is not None:
        return ChatTemplate("gemma", GEMMA_TEMPLATE, _stop_pieces(GEMMA_TEMPLATE))
    if tokenizer.token_id("<|im_start|>") is not None:
        return ChatTemplate("chatml", CHATML_TEMPLATE, _stop_pieces(CHATML_TEMPLATE))
    return None


def check_messages(messages) -> list[dict]:
    """``messages`` as a list of {"role": str, "content": str} dicts; ParameterError otherwise."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ParameterError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts, "
                             f"got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ParameterError(f"messages[{i}] must be a dict with a string 'role' and a string 'content', "
                                 f"got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _raise_exception(message):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_now = datetime.datetime.now  # the clock strftime_now reads (tests fix it)


def _strftime_now(fmt):
    return _now().strftime(fmt)


# Names render() gives the template itself; template_kwargs may not take them.
RESERVED_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


def _plain_data(value, where: str, depth: int = 0):
    """``value`` rebuilt from JSON types only (dict with str keys, list,
    str, int, float, bool, None), as transformers hands a template its
    inputs; ParameterError naming ``where`` for anything else."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth > 32:
        raise ParameterError(f"{where}: nested deeper than 32 levels")
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ParameterError(f"{where}: keys must be strings")
        return {k: _plain_data(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise ParameterError(f"{where}: {type(value).__name__} is not JSON data (dict, list, str, number, bool, None)")


def check_tools(tools) -> list[dict] | None:
    """``tools`` (None, or a list of tool definitions as dicts, e.g. OpenAI's
    {"type": "function", "function": {"name", "description", "parameters"}})
    as plain JSON data; ParameterError otherwise."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ParameterError(f"tools must be a list of dicts, got {type(tools).__name__}")
    out = _plain_data(list(tools), "tools")
    for i, tool in enumerate(out):
        if not isinstance(tool, dict):
            raise ParameterError(f"tools[{i}] must be a dict, got {type(tool).__name__}")
    return out


def check_template_kwargs(kwargs) -> dict:
    """Extra variables for the template (``enable_thinking``, ``date_string``...,
    what transformers' apply_chat_template passes on as keyword arguments):
    identifiers not among RESERVED_NAMES, JSON values; ParameterError otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ParameterError(f"template_kwargs must be a dict, got {type(kwargs).__name__}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ParameterError(f"template_kwargs: {name!r} is not a name a template can read")
        if name in RESERVED_NAMES:
            raise ParameterError(f"template_kwargs: {name!r} is set by gemma-cy itself")
    return _plain_data(dict(kwargs), "template_kwargs")


# What one rendering may cost. A template is code from a downloaded file:
# besides the sandbox's rules, it gets a deadline, an output size and a size
# for any string or list that * or + builds (so "{{ 'a' * 10**10 }}" fails at
# once instead of allocating 10 GB).
MAX_RENDER_SECONDS = 2.0
MAX_RENDER_CHARS = 1 << 20
MAX_BUILT_ITEMS = 1 << 20


def _size(value) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


@functools.lru_cache(maxsize=8)
def _compile(source: str):
    """The template compiled in an immutable sandbox, with the globals and
    filters HF chat templates use (raise_exception, strftime_now, tojson)."""
    import jinja2
    import jinja2.ext
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LoudUnsafeUndefined(jinja2.Undefined):
        """The sandbox answers an unsafe attribute with an Undefined that
        prints as ""; here it is an error at once."""

        def __init__(self, hint=None, obj=jinja2.utils.missing, name=None, exc=jinja2.exceptions.UndefinedError):
            if exc is SecurityError:
                raise SecurityError(hint or f"access to {name!r} is unsafe")
            super().__init__(hint, obj, name, exc)

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """Repetition, concatenation and powers whose results would be huge are refused."""

        intercepted_binops = frozenset({"*", "+", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
                if abs(right) > 64 and abs(left) > 1:
                    raise SecurityError(f"{left!r} ** {right!r}: the result would be too large")
            elif operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) is not None and isinstance(n, int) and _size(seq) * n > MAX_BUILT_ITEMS:
                        raise SecurityError(f"repeating {_size(seq)} items {n} times: more than {MAX_BUILT_ITEMS}")
            elif operator == "+" and _size(left) is not None and _size(right) is not None:
                if _size(left) + _size(right) > MAX_BUILT_ITEMS:
                    raise SecurityError(f"joining {_size(left)} and {_size(right)} items: more than "
                                        f"{MAX_BUILT_ITEMS}")
            return super().call_binop(context, operator, left, right)

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the
        assistant's text with it (its AssistantTracker); it renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, undefined=LoudUnsafeUndefined,
                         extensions=[jinja2.ext.loopcontrols, GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"chat template: {type(e).__name__}: {e}") from None
    except (RecursionError, MemoryError, ValueError) as e:  # a parser pushed past its limits
        raise TemplateError(f"chat template: cannot be compiled: {type(e).__name__}") from None


class _Deadline:
    """A trace function that stops a rendering past its deadline (template
    code is plain Python once compiled: every line it runs is seen)."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.count = 0

    def __call__(self, frame, event, arg):
        self.count += 1
        if self.count % 256 == 0 and time.monotonic() > self.end:
            raise TemplateError(f"chat template: rendering took more than {MAX_RENDER_SECONDS:g} s")
        return self


def render(template: ChatTemplate, messages: list[dict], tokenizer, add_generation_prompt: bool = True,
           tools=None, template_kwargs=None) -> str:
    """The template's text for ``messages`` (checked), with bos_token and
    eos_token spelled as the tokenizer's vocabulary spells them, ``tools``
    (``check_tools``; None when there are none, as transformers passes it)
    and ``template_kwargs`` (``check_template_kwargs``); within
    MAX_RENDER_SECONDS and MAX_RENDER_CHARS."""
    import jinja2

    messages = check_messages(messages)
    variables = {**check_template_kwargs(template_kwargs), "tools": check_tools(tools), "documents": None}
    compiled = _compile(template.source)
    parts, size = [], 0
    previous = sys.gettrace()
    sys.settrace(_Deadline(MAX_RENDER_SECONDS))
    try:
        for part in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                      bos_token=_spelling(tokenizer, tokenizer.bos_id),
                                      eos_token=_spelling(tokenizer, tokenizer.eos_id), **variables):
            size += len(part)
            if size > MAX_RENDER_CHARS:
                raise TemplateError(f"chat template: the rendered text passed {MAX_RENDER_CHARS} characters")
            parts.append(part)
    except TemplateError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"chat template refused by the sandbox: {str(e).splitlines()[0]}") from None
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, LookupError, AttributeError,
            ArithmeticError, RecursionError, MemoryError) as e:
        raise TemplateError(f"chat template: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") \
            from None
    finally:
        sys.settrace(previous)
    return "".join(parts)


def _spelling(tokenizer, token_id: int | None) -> str:
    """How the vocabulary spells ``token_id`` (a control token decodes to nothing)."""
    return "" if token_id is None else tokenizer.spelling(token_id)


@functools.lru_cache(maxsize=8)
def _control_pattern(pieces: tuple[str, ...]) -> re.Pattern | None:
    return re.compile("|".join(re.escape(p) for p in pieces)) if pieces else None


_PLACEHOLDER = 0xF0000  # a private-use plane: placeholders for control pieces typed in content


def chat_ids(tokenizer, template: ChatTemplate, messages, add_generation_prompt: bool = True, tools=None,
             template_kwargs=None) -> list[int]:
    """Token ids of ``messages`` in ``template`` (``render``'s arguments):
    the template's markers are control tokens, the messages' text is plain text."""
    messages = check_messages(messages)
    pattern = _control_pattern(tokenizer.control_pieces())
    typed: list[str] = []  # control pieces typed in content, by placeholder index

    def hide(match: re.Match) -> str:
        typed.append(match.group())
        return chr(_PLACEHOLDER + len(typed) - 1)

    if pattern is not None:
        for m in messages:
            if any(_PLACEHOLDER <= ord(c) < _PLACEHOLDER + 0x10000 for c in m["content"]):
                raise ParameterError("message content holds characters of Unicode plane 15 (private use), "
                                     "which gemma-cy reserves for chat rendering")
            m["content"] = pattern.sub(hide, m["content"])
    text = render(template, messages, tokenizer, add_generation_prompt, tools, template_kwargs)
    if not typed:
        return tokenizer.encode(text, parse_special=True)
    ids: list[int] = []
    for part in re.split(f"([{chr(_PLACEHOLDER)}-{chr(_PLACEHOLDER + len(typed) - 1)}])", text):
        if len(part) == 1 and _PLACEHOLDER <= ord(part) < _PLACEHOLDER + len(typed):
            ids += tokenizer.encode(typed[ord(part) - _PLACEHOLDER], parse_special=False)
        elif part:
            ids += tokenizer.encode(part, parse_special=True)
    return ids
