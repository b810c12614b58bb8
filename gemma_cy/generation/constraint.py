"""Structured output: a grammar that decides, token by token, which ids may come next.

The grammar engine is llguidance (docs/structured_output.md): from the
user's JSON Schema, regular expression, Lark or GBNF grammar or list of
choices it builds a matcher over the model's vocabulary (as bytes,
``tokenizers.token_bytes``); before each sampling the matcher's packed
bitmask (one bit per id) sets every id it forbids to -inf, and each chosen
id is fed back to it. An id it allows always keeps the text a prefix of
some string of the grammar; an end-of-sequence id is allowed only where
the text is complete, so a generation that ends by the grammar is a whole
match (stop reason "grammar").

``constraint_spec`` turns the API's keywords into one ``ConstraintSpec``;
``ConstraintCompiler`` (one per model: the vocabulary table is built once)
compiles a spec into a fresh ``Constraint`` per generation, refusing a
spec that does not compile with a ParameterError naming the problem
before anything runs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ParameterError
from ..fast.token_mask import apply_token_mask
from ..tokenizers.token_bytes import token_bytes
from .json_bounds import bounded_schema

# The API keywords that ask for a constraint (at most one per generation).
CONSTRAINT_KEYWORDS = ("response_format", "json_schema", "regex", "grammar", "choices")
# JSON as json.dumps writes it: ", " and ": ", no other whitespace. A grammar
# that allows any whitespace lets a small model emit newlines until
# max_tokens (measured: 38 of 150 Gemma 3 replies); a schema's own
# "x-guidance" options override this (docs/structured_output.md#json-layout).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHED_GRAMMARS = 32  # compiled grammars a model keeps (a JSON Schema's takes milliseconds to seconds)
INSTALL = "pip install llguidance (or 'gemma-cy[structured]')"


@dataclass(frozen=True)
class ConstraintSpec:
    """What was asked: ``kind`` (json_schema, regex, grammar, choices) and
    its text (a schema as JSON text, its default bounds added, a regex, Lark
    or GBNF text, or the choices as a JSON list), and where it came from
    for error messages."""

    kind: str
    text: str
    source: str


def _schema_text(schema, where: str) -> str:
    """The schema as JSON text, with the default bounds (json_bounds) where
    it sets none."""
    try:
        return _bounded_text(schema, where)
    except RecursionError:  # json's and the bounds' walk alike
        raise ParameterError(f"{where}: nested deeper than Python's recursion limit") from None


def _bounded_text(schema, where: str) -> str:
    if isinstance(schema, (bytes, bytearray)):
        schema = bytes(schema).decode("utf-8", "replace")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ParameterError(f"{where}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ParameterError(f"{where}: a JSON Schema is an object, got {type(schema).__name__}")
    schema = bounded_schema(schema, where)
    try:
        return json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise ParameterError(f"{where}: not JSON-serializable ({e})") from None


def _response_format_spec(fmt) -> ConstraintSpec | None:
    """OpenAI's ``response_format`` (``{"type": "text" | "json_object" |
    "json_schema", "json_schema": {"name", "schema", "strict"}}``;
    llama.cpp's ``{"type": "json_object", "schema": {...}}`` too)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise ParameterError(f"response_format: expected {{'type': 'text' | 'json_object' | 'json_schema', ...}}, "
                             f"got {fmt!r:.80}")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema", {"type": "object"})
        return ConstraintSpec("json_schema", _schema_text(schema, "response_format.schema"), "response_format")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise ParameterError("response_format: type 'json_schema' needs json_schema: {'name': ..., "
                                 "'schema': {...}}")
        return ConstraintSpec("json_schema", _schema_text(inner["schema"], "response_format.json_schema.schema"),
                              "response_format")
    raise ParameterError(f"response_format: type {kind!r} is not one of 'text', 'json_object', 'json_schema'")


def constraint_spec(response_format=None, json_schema=None, regex=None, grammar=None,
                    choices=None) -> ConstraintSpec | None:
    """The one constraint the keywords ask for (None: none), checked."""
    given = [name for name, value in (("response_format", response_format), ("json_schema", json_schema),
                                      ("regex", regex), ("grammar", grammar), ("choices", choices))
             if value is not None]
    if len(given) > 1:
        raise ParameterError(f"{given[0]} and {given[1]}: give at most one constraint")
    if response_format is not None:
        return _response_format_spec(response_format)
    if json_schema is not None:
        return ConstraintSpec("json_schema", _schema_text(json_schema, "json_schema"), "json_schema")
    if regex is not None:
        if not isinstance(regex, str):
            raise ParameterError(f"regex: expected a string, got {type(regex).__name__}")
        return ConstraintSpec("regex", regex, "regex")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ParameterError("grammar: expected the text of a Lark or GBNF grammar")
        return ConstraintSpec("grammar", grammar, "grammar")
    if choices is not None:
        if (isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices
                or not all(isinstance(c, str) and c for c in choices)):
            raise ParameterError("choices: expected a non-empty list of non-empty strings")
        return ConstraintSpec("choices", json.dumps(list(choices)), "choices")
    return None


def grammar_text(spec: ConstraintSpec) -> str:
    """The llguidance grammar of ``spec`` (ParameterError if it has none)."""
    llg = _llguidance()
    kind = {"json_schema": "json_schema", "regex": "regex", "grammar": "grammar", "choices": "choice"}[spec.kind]
    try:
        if kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_LAYOUT)
        return llg.grammar_from(kind, spec.text)
    except Exception as e:  # noqa: BLE001 - the GBNF converter raises what its parser meets; one line
        raise ParameterError(f"{spec.source}: {_one_line(e)}") from None


def check_spec(spec: ConstraintSpec) -> None:
    """ParameterError naming the problem if ``spec`` does not compile (no
    vocabulary needed: what the CLI checks before it loads a model)."""
    error = _llguidance().LLMatcher.validate_grammar(grammar_text(spec))
    if error:
        raise ParameterError(f"{spec.source}: {_one_line(error)}")


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads of a tokenizer."""

    def __init__(self, tokenizer, stop_ids: Sequence[int]) -> None:
        self.tokens = token_bytes(tokenizer)
        self.eos_token_id = min(stop_ids)
        self.bos_token_id = getattr(tokenizer, "bos_id", None)
        self.special_token_ids = [i for i, t in enumerate(self.tokens) if t[:1] == b"\xff"]
        self._tokenizer = tokenizer
        self._pieces: dict[bytes, int] | None = None  # bytes -> first id, built when first needed
        self._longest = 0

    def __call__(self, data: bytes) -> list[int]:
        """Ids spelling exactly ``data`` (what llguidance asks for the text a
        grammar forces): the tokenizer's own, unless it changes the bytes
        (llama2.c's tokenizer puts a space before the text), then the
        longest pieces first."""
        ids = self._tokenizer.encode(data)
        if b"".join(self.tokens[i] for i in ids) == data:
            return ids
        if self._pieces is None:
            self._pieces = {}
            for i, t in enumerate(self.tokens):
                if t and t[:1] != b"\xff":
                    self._pieces.setdefault(t, i)
            self._longest = max(map(len, self._pieces))
        out, at = [], 0
        while at < len(data):
            for n in range(min(self._longest, len(data) - at), 0, -1):
                tid = self._pieces.get(data[at:at + n])
                if tid is not None:
                    out.append(tid)
                    at += n
                    break
            else:  # a byte no piece spells: leave the rest to llguidance
                break
        return out


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ParameterError(f"structured output needs llguidance: {INSTALL}") from None
    return llguidance


class ConstraintCompiler:
    """Compiles ConstraintSpecs for one model's vocabulary (built on first use)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: Sequence[int]) -> None:
        self._tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, sorted(stop_ids)
        self._lltokenizer = None
        self._compiled: dict[ConstraintSpec, object] = {}  # spec -> its matcher, never fed a token

    @property
    def lltokenizer(self):
        if self._lltokenizer is None:
            llg = _llguidance()
            vocab = _Vocabulary(self._tokenizer, self.stop_ids)
            self._lltokenizer = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=self.vocab_size,
                                                eos_token=list(self.stop_ids))
        return self._lltokenizer

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """A fresh Constraint of ``spec``: a copy of its matcher, compiled
        the first time the spec is seen (the last ``CACHED_GRAMMARS`` kept),
        so checking a request and running its samples compile it once."""
        matcher = self._compiled.pop(spec, None)
        if matcher is None:
            matcher = _llguidance().LLMatcher(self.lltokenizer, grammar_text(spec), log_level=0)
            if matcher.is_error():
                raise ParameterError(f"{spec.source}: {_one_line(matcher.get_error())}")
        self._compiled[spec] = matcher  # the most recently used last
        while len(self._compiled) > CACHED_GRAMMARS:
            del self._compiled[next(iter(self._compiled))]
        return Constraint(matcher.deep_copy(), self.vocab_size)


def _one_line(error) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


class Constraint:
    """One generation's matcher: ``mask`` the logits, ``consume`` each id."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # the packed mask, bit i of word i // 32
        self._masked = np.empty(vocab_size, dtype=np.float32)  # mask's result, reused every token
        self.forced = 0  # ids the grammar allowed alone, appended without sampling (forced_ids)

    @property
    def finished(self) -> bool:
        """True when the grammar takes no further id (a complete match, or an error)."""
        return self.matcher.is_stopped()

    def _fill_bits(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self.matcher.is_error():
            raise ParameterError(f"constraint: {_one_line(self.matcher.get_error())}")

    def allowed(self) -> np.ndarray:
        """The ids the grammar allows next, as one bool per id."""
        self._fill_bits()
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
        return bits.view(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every id the grammar forbids at -inf, in a buffer
        of this constraint's that the next call overwrites."""
        x = np.ascontiguousarray(logits, dtype=np.float32)
        if x.shape != (self.vocab_size,):
            raise ParameterError(f"constraint: logits of shape {x.shape}, the vocabulary has {self.vocab_size} ids")
        self._fill_bits()
        apply_token_mask(self._masked, x, self._bits.view(np.uint32))
        return self._masked

    def forced_ids(self, limit: int, stop_ids) -> list[int]:
        """The ids the grammar now allows alone, one after the other (at most
        ``limit``, none of ``stop_ids``), consumed: they follow without
        sampling and run through the model as one block."""
        if limit <= 0:
            return []
        forced = []
        for token in self.matcher.compute_ff_tokens()[:limit]:
            if token in stop_ids:
                break
            self.consume(token)
            forced.append(token)
        self.forced += len(forced)
        return forced

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ParameterError(f"constraint: id {token} does not continue the grammar "
                                 f"({_one_line(self.matcher.get_error())})")
