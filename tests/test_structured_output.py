"""Structured output (docs/structured_output.md): a corpus of JSON Schemas,
regular expressions, choices and grammars run greedy and sampled on the
real models; every reply that the grammar ended is checked by an oracle
that is not the code under test (the `jsonschema` package, Python's `re`,
the choice list, a fresh llguidance parser), and every other reply says it
ran out of tokens."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

llguidance = pytest.importorskip("llguidance", reason="structured output needs llguidance (make test installs it)")
jsonschema = pytest.importorskip("jsonschema", reason="the oracle for JSON replies is the jsonschema package")

import gemma_cy  # noqa: E402
from gemma_cy.errors import ParameterError  # noqa: E402
from gemma_cy.tokenizers.token_bytes import SPECIAL_MARK, token_bytes  # noqa: E402

S = {"type": "string", "maxLength": 12}
NAME = {"type": "string", "minLength": 1, "maxLength": 10}
SMALL = {"type": "integer", "minimum": 0, "maximum": 99}


def obj(props: dict, required=None, extra=False, **more) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": extra, **more}


# 50 schemas: nested objects, arrays with bounds, enums, patterns and formats,
# integer and number ranges, optional fields, additionalProperties, $ref, anyOf.
SCHEMAS = [
    {"type": "object"},
    {"type": "array", "items": SMALL, "minItems": 1, "maxItems": 4},
    {"type": "boolean"},
    {"type": "integer", "minimum": -5, "maximum": 5},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "email", "maxLength": 30},
    {"type": "string", "format": "uuid"},
    obj({"name": NAME, "age": SMALL}),
    obj({"name": NAME, "age": SMALL}, required=["name"]),
    obj({"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    obj({"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": 1, "maximum": 3}}),
    obj({"color": {"enum": ["red", "green"]}, "shade": {"type": "integer", "minimum": 0, "maximum": 9}}),
    obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}),
    obj({"point": obj({"x": SMALL, "y": SMALL})}),
    obj({"user": obj({"name": NAME, "address": obj({"street": S, "no": SMALL})})}),
    obj({"items": {"type": "array", "items": obj({"id": SMALL, "label": NAME}), "minItems": 1, "maxItems": 2}}),
    obj({"price": {"type": "number", "minimum": 0, "maximum": 1000}, "currency": {"const": "EUR"}}),
    obj({"when": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "time"}}),
    obj({"email": {"type": "string", "format": "email", "maxLength": 30}}),
    obj({"id": {"type": "string", "format": "uuid"}}),
    obj({"a": SMALL, "b": SMALL, "c": SMALL}, required=["a"]),
    obj({"title": NAME}, extra=True, maxProperties=2),
    obj({"v": {"anyOf": [SMALL, NAME]}}),
    obj({"v": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}}),
    {"anyOf": [obj({"kind": {"const": "circle"}, "r": SMALL}), obj({"kind": {"const": "square"}, "side": SMALL})]},
    {"$defs": {"pt": obj({"x": SMALL, "y": SMALL})}, **obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    {"$defs": {"name": NAME}, **obj({"first": {"$ref": "#/$defs/name"}, "last": {"$ref": "#/$defs/name"}})},
    {"type": "array", "items": obj({"n": SMALL}), "maxItems": 3},
    {"type": "array", "prefixItems": [NAME, SMALL], "items": False, "minItems": 2},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    obj({"matrix": {"type": "array", "items": {"type": "array", "items": SMALL, "maxItems": 2}, "maxItems": 2}}),
    obj({"score": {"type": "number", "exclusiveMinimum": 0, "maximum": 10}}),
    obj({"n": {"type": "integer", "minimum": 100, "maximum": 200}}),
    obj({"n": {"type": "integer", "minimum": -50, "maximum": -10}}),
    obj({"code": {"type": "string", "pattern": "^[A-F0-9]{4}$"}}),
    obj({"lang": {"enum": ["en", "fr", "de"]}, "words": {"type": "integer", "minimum": 1, "maximum": 9}}),
    obj({"answer": {"enum": ["yes", "no", "maybe"]}, "why": S}, required=["answer"]),
    obj({"meta": obj({}, extra=False), "data": {"type": "array", "items": SMALL, "maxItems": 2}}),
    obj({"nullable": {"type": ["string", "null"], "maxLength": 8}}),
    obj({"flag": {"type": "boolean"}, "note": S}, required=["flag"]),
    {"type": "object", "properties": {"k": SMALL}, "required": ["k"]},
    obj({"when": {"type": "string", "format": "date-time"}}),
    obj({"ip": {"type": "string", "format": "ipv4"}}),
    obj({"a": obj({"b": obj({"c": obj({"d": SMALL})})})}),
    obj({"pair": {"type": "array", "prefixItems": [{"enum": ["x", "y"]}, SMALL], "items": False, "minItems": 2}}),
    {"oneOf": [obj({"cat": NAME}), obj({"dog": NAME})]},
    obj({"list": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}}),
]

# Every regex and grammar below is bounded (its longest match is a few dozen
# characters), so each reply must end by the grammar within MAX_TOKENS.

def unbounded(schema) -> bool:
    """True if a match can run past MAX_TOKENS within the default bounds
    (docs/structured_output.md#bounds): a time (its fraction of a second), an
    object open to more keys (one that lists properties is closed unless it
    says otherwise), or such a part. A number's digits are bounded."""
    if not isinstance(schema, dict):
        return False
    if schema.get("format") in ("time", "date-time"):
        return True
    if schema.get("type") == "object" and schema.get("additionalProperties", "properties" not in schema) is not False:
        return True
    if schema.get("type") == "array" and "maxItems" not in schema and schema.get("items") is not False:
        return True
    parts = [*schema.get("properties", {}).values(), *schema.get("$defs", {}).values(), *schema.get("anyOf", []),
             *schema.get("oneOf", []), *schema.get("prefixItems", [])]
    if isinstance(schema.get("items"), dict):
        parts.append(schema["items"])
    return any(unbounded(p) for p in parts)


UNBOUNDED = [s for s in SCHEMAS if unbounded(s)]

REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}", r"\d{4}-\d{2}-\d{2}",
           r"#[0-9a-f]{6}", r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)", r"(0|[1-9][0-9]{0,2})(\.[0-9]{1,2})?",
           r" ?[A-Za-z ]{1,20}\."]
CHOICES = [["yes", "no"], [" red", " green", " blue"], ["positive", "negative", "neutral"], ["A", "B", "C", "D"]]
GRAMMARS = [
    'root ::= greeting " " name "."\ngreeting ::= "Hello" | "Hi"\nname ::= [A-Z] [a-z]{1,10}',
    'root ::= "(" expr ")"\nexpr ::= num (("+" | "*") num){0,4}\nnum ::= [0-9]{1,3}',
    'root ::= item ("," item){0,5}\nitem ::= "a" | "b" | "c"',
    'start: "SELECT " COL " FROM " TABLE\nCOL: /[a-z]{1,10}/\nTABLE: /[a-z]{1,10}/',
    'start: word (" " word)~0..4 "!"\nword: /[a-z]{1,8}/',
]
PROMPTS = ["Give me the answer as JSON:", "Here is the data:", "Output:", "The result is"]
RUNS = [dict(temperature=0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2)]
MAX_TOKENS = 96


def run_all(model, prompt_of, specs: list[dict]) -> list[tuple[dict, dict, object]]:
    """Every spec under every RUNS setting, in one batch; (spec, run, Completion)."""
    cases = [(spec, run) for spec in specs for run in RUNS]
    prompts = [prompt_of(i) for i in range(len(cases))]
    done = model.complete(prompts, per_sequence=[{**spec, **run} for spec, run in cases], max_tokens=MAX_TOKENS)
    return [(spec, run, c) for (spec, run), c in zip(cases, done)]


def check_ended(results, valid, unbounded=()) -> None:
    """Every reply the grammar ended is valid; a reply to a bounded spec must
    end by the grammar; one to an unbounded spec may run to MAX_TOKENS."""
    for spec, run, c in results:
        if c.stop_reason == "grammar":
            valid(spec, c.text)
        else:
            assert any(spec == u for u in unbounded), (spec, run, c.stop_reason, c.text)
            assert c.stop_reason == "max_tokens" and len(c.ids) == MAX_TOKENS, (spec, run, c.stop_reason)


@pytest.fixture(scope="module", params=["gemma3", "smollm2"])
def model(request, default_model):
    if request.param == "gemma3":
        return gemma_cy.load(default_model, max_cache_len=256, max_sequences=16)
    from gemma_cy.commands.default_model import smollm2_source_path
    from gemma_cy.errors import GemmaCyError
    try:
        path = smollm2_source_path()
    except GemmaCyError as e:
        pytest.skip(f"the SmolLM2 package is not installed ({e})")
    return gemma_cy.load(path, max_cache_len=256, max_sequences=16)


def test_json_schemas_every_reply_validates(model):
    assert len(SCHEMAS) >= 50
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)

    def valid(spec, text):
        jsonschema.validate(json.loads(text), spec["json_schema"], cls=jsonschema.Draft202012Validator,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)

    results = run_all(model, lambda i: PROMPTS[i % len(PROMPTS)], [{"json_schema": s} for s in SCHEMAS])
    check_ended(results, valid, [{"json_schema": s} for s in UNBOUNDED])


def test_regexes_choices_and_grammars_every_reply_matches(model):
    def valid(spec, text):
        if "regex" in spec:
            assert re.fullmatch(spec["regex"], text), (spec, text)
        elif "choices" in spec:
            assert text in spec["choices"], (spec, text)
        else:  # llguidance's own parser, fresh, fed the text
            grammar = llguidance.grammar_from("grammar", spec["grammar"])
            matcher = llguidance.LLMatcher(model._constraints.lltokenizer, grammar, log_level=0)
            assert matcher.consume_tokens(model.tokenize(text, add_bos=False)) and matcher.is_accepting(), text

    specs = ([{"regex": r} for r in REGEXES] + [{"choices": c} for c in CHOICES]
             + [{"grammar": g} for g in GRAMMARS])
    results = run_all(model, lambda i: PROMPTS[i % len(PROMPTS)], specs)
    check_ended(results, valid)


def test_a_constrained_sequence_gets_the_same_ids_in_a_batch_as_alone(model):
    spec = {"json_schema": SCHEMAS[14]}
    batch = model.complete(["Output:", "Hello", "Output:"],
                           per_sequence=[{**spec, "temperature": 1.0, "seed": 5}, {}, {"regex": "[0-9]+"}],
                           temperature=0, max_tokens=40)
    alone = model.complete("Output:", **spec, temperature=1.0, seed=5, max_tokens=40)
    assert batch[0].ids == alone.ids and batch[0].stop_reason == alone.stop_reason == "grammar"
    assert re.fullmatch("[0-9]+", batch[2].text)


def test_the_grammar_forbids_what_the_model_would_pick(model):
    """A constraint changes the reply: unconstrained greedy text is not a digit string here."""
    free = model.complete("The capital of France is", temperature=0, max_tokens=6)
    held = model.complete("The capital of France is", temperature=0, max_tokens=6, regex=" [0-9]+")
    assert not re.fullmatch(" [0-9]+", free.text) and re.fullmatch(" [0-9]+", held.text)


@pytest.mark.parametrize("kw, needle", [
    (dict(regex="[a-"), "regex: "),
    (dict(json_schema={"type": "objec"}), "json_schema: "),
    (dict(json_schema={"type": "string", "format": "no-such-format"}), "format"),
    (dict(json_schema={"type": "array", "unevaluatedItems": False}), "unevaluatedItems"),
    (dict(json_schema="{not json"), "json_schema: not JSON"),
    (dict(grammar='root ::= undefined_rule'), "undefined_rule"),
    (dict(choices=[]), "choices: "),
    (dict(choices="yes"), "choices: "),
    (dict(response_format={"type": "yaml"}), "response_format: "),
    (dict(response_format={"type": "json_schema"}), "response_format: "),
    (dict(regex="a", choices=["a"]), "at most one constraint"),
    (dict(json_schema={"type": "number", "x-bounds": {"integer_digits": 40}}), "json_schema: x-bounds.integer_digits"),
])
def test_a_constraint_that_does_not_compile_is_refused_before_anything_runs(default_model, kw, needle):
    model = gemma_cy.load(default_model, max_cache_len=64, max_sequences=2)
    for call in (lambda: model.complete("Hi", max_tokens=4, **kw),
                 lambda: model.complete(["Hi", "Ho"], max_tokens=4, per_sequence=[{}, kw])):
        with pytest.raises(ParameterError) as e:
            call()
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert model.cache.ids == []  # nothing ran


def test_every_tokenizer_gives_llguidance_its_bytes(default_model, tiny_model_path):
    """The vocabulary table: ordinary ids are what they decode to, special ids
    are marked, and a text's ids spell the text's bytes."""
    for path in (default_model, str(tiny_model_path)):
        tok = gemma_cy.load(path, max_cache_len=64).tokenizer
        table = token_bytes(tok)
        assert len(table) == tok.vocab_size
        for tid in range(0, tok.vocab_size, max(1, tok.vocab_size // 5000)):
            if tok.is_control(tid) or not tok.piece_bytes(tid):
                assert table[tid].startswith(SPECIAL_MARK)
            else:
                assert table[tid] == tok.piece_bytes(tid)  # (the byte piece <0xFF> is b"\xff" itself)
        assert sum(t.startswith(SPECIAL_MARK) for t in table) == sum(
            tok.is_control(i) or not tok.piece_bytes(i) or tok.piece_bytes(i) == b"\xff" for i in range(len(table)))
        text = "Hello, wörld! 123 {\"a\": [1, 2]}\n"
        assert b"".join(table[i] for i in tok.encode(text)) == text.encode()


def test_cli_flags_give_what_the_api_gives(default_model, tmp_path):
    from helpers import cli

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema), encoding="utf-8")
    (tmp_path / "g.gbnf").write_text('root ::= "Hi " [A-Z] [a-z]{1,6} "."\n', encoding="utf-8")
    (tmp_path / "g.lark").write_text('start: "Hi " /[A-Z][a-z]{1,6}/ "."\n', encoding="utf-8")
    model = gemma_cy.load(default_model, max_cache_len=128)
    cases = [(["--json_schema", str(tmp_path / "s.json")], dict(json_schema=schema)),
             (["--json_schema", json.dumps(schema)], dict(json_schema=schema)),
             (["--json_object"], dict(response_format={"type": "json_object"})),
             (["--regex", "[0-9]{2}"], dict(regex="[0-9]{2}")),
             (["--grammar", str(tmp_path / "g.gbnf")], dict(grammar='root ::= "Hi " [A-Z] [a-z]{1,6} "."\n')),
             (["--grammar", str(tmp_path / "g.lark")], dict(grammar='start: "Hi " /[A-Z][a-z]{1,6}/ "."\n')),
             (["--choice", "red", "--choice", "blue"], dict(choices=["red", "blue"]))]
    for flags, kw in cases:
        out = cli("-m", default_model, "-p", "Answer:", "-n", "24", "--temp", "0", "--json", *flags)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        want = model.complete("Answer:", max_tokens=24, temperature=0, **kw)
        assert got["generated_ids"] == want.ids and got["stop_reason"] == want.stop_reason, flags


@pytest.mark.parametrize("flags, needle", [
    (["--regex", "[a-"], "regex: "),
    (["--json_schema", '{"type": "string", "format": "no-such"}'], "no-such"),
    (["--json_schema", "/no/such/file.json"], "--json_schema /no/such/file.json: cannot read"),
    (["--grammar", "/no/such/file.gbnf"], "--grammar /no/such/file.gbnf: cannot read"),
    (["--regex", "a", "--choice", "a"], "at most one"),
    (["--json_schema", '{"type": "object", "x-bounds": {"depth": 3}}'], "x-bounds: unknown key 'depth'"),
])
def test_cli_refuses_a_constraint_that_does_not_compile_with_exit_2(flags, needle):
    from helpers import assert_one_line_error, cli

    out = cli("-p", "x", *flags)
    assert_one_line_error(out, needle, code=2)
    assert out.stdout == ""


def test_batch_lines_carry_their_own_constraint(default_model):
    import io

    from gemma_cy.commands.batch import run_batch

    model = gemma_cy.load(default_model, max_cache_len=128, max_sequences=4)
    lines = [json.dumps({"prompt": "Year:", "regex": " [0-9]{4}", "max_tokens": 12, "temperature": 0}),
             json.dumps({"prompt": "Color:", "choices": [" red", " blue"], "temperature": 0.8, "seed": 3}),
             json.dumps({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 40,
                         "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[13]}}}),
             json.dumps({"prompt": "x", "regex": "[a-"})]
    out = io.StringIO()
    run_batch(model, lines, out)
    records = [json.loads(r) for r in out.getvalue().splitlines()]
    assert "regex: " in records[3]["error"]
    alone = [model.complete("Year:", regex=" [0-9]{4}", max_tokens=12, temperature=0),
             model.complete("Color:", choices=[" red", " blue"], temperature=0.8, seed=3),
             model.chat_complete([{"role": "user", "content": "JSON please"}], max_tokens=40,
                                 response_format={"type": "json_schema", "json_schema": {"schema": SCHEMAS[13]}})]
    for record, want in zip(records, alone):
        assert record["ids"] == want.ids and record["stop_reason"] == want.stop_reason == "grammar", record


def test_forced_ids_run_as_one_block_and_change_nothing(default_model, monkeypatch):
    """Ids the grammar allows alone (a JSON key's text) are appended without
    sampling and run as one block: greedy gives the ids it gives when each
    is sampled from a one-id mask and decoded alone, in fewer forward passes."""
    from gemma_cy.generation.constraint import Constraint

    model = gemma_cy.load(default_model, max_cache_len=128)
    schema = SCHEMAS[17]  # nested objects: several keys' text forced
    messages = [{"role": "user", "content": "A user as JSON."}]
    passes = []
    engine_prefill = model.engine.prefill
    monkeypatch.setattr(model.engine, "prefill", lambda ids, *a: passes.append(len(ids)) or engine_prefill(ids, *a))
    block = model.chat(messages, json_schema=schema, temperature=0, max_tokens=60)
    block.complete()
    assert block.constraint.forced > 0 and any(n > 1 for n in passes[1:]), passes
    monkeypatch.setattr(Constraint, "forced_ids", lambda self, limit, stop_ids: [])
    alone = model.chat_complete(messages, json_schema=schema, temperature=0, max_tokens=60)
    assert block.generated_ids == alone.ids and block.stop_reason == alone.stop_reason == "grammar"


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 262_144])
def test_the_mask_kernel_is_the_bits(n):
    from gemma_cy.fast.token_mask import apply_token_mask

    rng = np.random.default_rng(n)
    logits = rng.standard_normal(n).astype(np.float32)
    bits = rng.integers(0, 2**32, (n + 31) // 32, dtype=np.uint32)
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:n].astype(bool)  # NumPy's own reading
    out = np.empty_like(logits)
    assert apply_token_mask(out, logits, bits) == allowed.sum()
    assert np.array_equal(out[allowed], logits[allowed]) and np.all(out[~allowed] == -np.inf)
    for bad in ((np.empty(n + 1, np.float32), logits, bits), (out, logits, bits[:-1])):
        if bad[2].size * 32 >= n and bad[0].size == n:
            continue
        with pytest.raises(ValueError):
            apply_token_mask(*bad)


def test_a_stop_string_inside_forced_ids_ends_there_with_one_logprob_per_id(default_model):
    model = gemma_cy.load(default_model, max_cache_len=128)
    schema = obj({"alpha": SMALL, "beta": SMALL})
    out = model.complete("JSON:", json_schema=schema, temperature=0, max_tokens=40, stop=['"be'], logprobs=1)
    assert out.stop_reason == "stop" and out.text.startswith('{"alpha": ') and '"be' not in out.text
    assert len(out.logprobs) == len(out.ids) and [lp.token_id for lp in out.logprobs] == out.ids


def test_penalties_and_processors_compose_with_the_grammar(default_model):
    """The mask comes after penalties and processors: a processor's ban holds
    inside the grammar, and the reply still matches."""
    model = gemma_cy.load(default_model, max_cache_len=128)
    free = model.complete("Digits:", regex="[0-9]{6}", temperature=0, max_tokens=12)
    banned = free.ids[0]

    def ban(ids, logits):
        logits[banned] = -np.inf
        return logits

    for kw in (dict(logits_processor=ban), dict(logits_processor=ban, presence_penalty=1.5, frequency_penalty=0.5),
               dict(logits_processor=ban, temperature=0.9, seed=7, top_k=5, top_p=0.9, repeat_penalty=1.3)):
        out = model.complete("Digits:", regex="[0-9]{6}", max_tokens=12, **{"temperature": 0, **kw})
        assert re.fullmatch("[0-9]{6}", out.text) and banned not in out.ids and out.stop_reason == "grammar", out
