"""The default bounds of a JSON reply (docs/structured_output.md#bounds): the
grammar refuses a number, a string, a key or a free value past them, keeps
the bounds a schema gives itself and those its "x-bounds" asks for, and the
default model's replies to JSON Schemas with number fields and to
json_object end by the grammar and validate (the `jsonschema` package and
Python's `json` are the oracles)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance (make test installs it)")
jsonschema = pytest.importorskip("jsonschema", reason="the oracle for JSON replies is the jsonschema package")

import gemma_cy  # noqa: E402
from gemma_cy.errors import ParameterError  # noqa: E402
from gemma_cy.generation.constraint import ConstraintCompiler, constraint_spec  # noqa: E402
from gemma_cy.generation.json_bounds import JSON_BOUNDS, WHITESPACE, bounded_schema  # noqa: E402

NUMBER_SCHEMAS = Path(__file__).parent / "data" / "number_schemas.json"
RUNS = [dict(temperature=0), dict(temperature=0.8, seed=1), dict(temperature=0.8, seed=2)]


@pytest.fixture(scope="module")
def model(default_model):
    return gemma_cy.load(default_model, max_cache_len=1100, max_sequences=32)


@pytest.fixture(scope="module")
def accepts(model):
    """accepts(text, **constraint): the grammar takes the whole of ``text`` and
    may end there (a fresh matcher, fed the text's ids)."""
    compiler = ConstraintCompiler(model.tokenizer, model.config.vocab_size, model.stop_ids)

    def accepts(text: str, **constraint) -> bool:
        matcher = compiler.compile(constraint_spec(**constraint)).matcher
        ids = model.tokenize(text, add_bos=False)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
    return accepts


def test_a_number_without_bounds_has_15_integral_and_10_fraction_digits(accepts):
    number, integer = {"type": "number"}, {"type": "integer"}
    confidence = {"type": "object", "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                  "required": ["confidence"], "additionalProperties": False}
    for schema, good, bad in [
            (number, ["9" * 15, "-" + "9" * 15, "0." + "5" * 10, "9" * 15 + "." + "9" * 10],
             ["1" * 16, "1" * 40, "0." + "5" * 11, "0." + "5" * 30, "0.5" + "0" * 29, "1e5"]),
            (integer, ["9" * 15, "-" + "9" * 15, "0"], ["1" * 16, "1" * 40, "-" + "1" * 40]),
            (confidence, ['{"confidence": 0.5}', '{"confidence": 0.' + "5" * 10 + "}"],
             ['{"confidence": 0.5' + "0" * 30 + "}", '{"confidence": 0.' + "5" * 11 + "}"])]:
        assert all(accepts(text, json_schema=schema) for text in good), schema
        assert not any(accepts(text, json_schema=schema) for text in bad), schema


def test_json_object_bounds_its_free_values(accepts):
    """Numbers, strings and keys as above; 16 members a container, 3 levels
    of containers, the reply's own object the first."""
    fmt = {"type": "json_object"}
    members = ", ".join(f'"k{i}": {i}' for i in range(16))
    for text in ['{"a": 1.5, "b": "x", "c": [1, {"d": null}]}', '{"a": [[1]], "b": {"c": {"d": 1}}}',
                 "{" + members + "}", '{"' + "k" * 2000 + '": "' + "v" * 2000 + '"}']:
        assert accepts(text, response_format=fmt), text[:60]
    for text in ['{"a": ' + "1" * 40 + "}", '{"a": 0.' + "5" * 30 + "}", '{"a": [[[1]]]}',
                 '{"a": {"b": {"c": {"d": 1}}}}', "{" + members + ', "k16": 16}', '{"a": "' + "v" * 2001 + '"}',
                 '{"' + "k" * 2001 + '": 1}', '{"a": [' + ", ".join("1" * 17) + "]}"]:
        assert not accepts(text, response_format=fmt), text[:60]


def test_a_schemas_own_bounds_are_kept(accepts):
    """Where a schema bounds a value itself, its bound holds, larger or finer
    than the default; the side it leaves open gets the default."""
    for schema, text in [({"type": "integer", "minimum": 0, "maximum": 1e30}, "9" * 18),
                         ({"type": "number", "minimum": 0, "maximum": 1e18}, "9" * 18 + ".5"),
                         ({"type": "number", "minimum": 1e16}, "9" * 17),
                         ({"type": "number", "minimum": 1e-12, "maximum": 1}, "0.000000000002"),
                         ({"type": "string", "maxLength": 5000}, '"' + "a" * 3000 + '"'),
                         ({"type": "string", "minLength": 2500}, '"' + "a" * 2500 + '"'),
                         ({"allOf": [{"type": "number", "maximum": 1e18}, {"type": "number"}]}, "9" * 17),
                         ({"type": "object", "allOf": [{"properties": {"b": {"type": "string", "maxLength": 5000}}}]},
                          '{"b": "' + "a" * 3000 + '"}')]:
        assert accepts(text, json_schema=schema), schema
    for schema, text in [({"type": "integer", "minimum": 0}, "9" * 18),
                         ({"type": "integer", "maximum": 0}, "-" + "9" * 18),
                         ({"type": "number", "minimum": 0}, "9" * 18 + ".5"),
                         ({"type": "string"}, '"' + "a" * 3000 + '"')]:
        assert not accepts(text, json_schema=schema), schema


def test_an_object_that_lists_properties_takes_no_others_unless_it_says(accepts):
    """llama.cpp's reading of a missing additionalProperties (xgrammar's and
    outlines' too); where the object is a part of an intersection (allOf, a
    $ref beside keywords), the others' keys are kept."""
    listed = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}
    assert accepts('{"a": 1, "b": 2}', json_schema=listed) and not accepts('{"a": 1, "c": 2}', json_schema=listed)
    assert accepts('{"a": 1, "c": [2, {"d": "x"}]}', json_schema={**listed, "additionalProperties": True})
    assert not accepts('{"a": 1, "c": ' + "1" * 40 + "}", json_schema={**listed, "additionalProperties": True})
    other = {"type": "object", "properties": {"c": {"type": "integer"}}}
    for schema in [{"allOf": [listed, other]}, {"$ref": "#/$defs/listed", "$defs": {"listed": listed}, **other},
                   {**listed, "allOf": [other]}]:
        assert accepts('{"a": 1, "c": 2}', json_schema=schema), schema
    assert not accepts('{"a": 1, "d": 2}', json_schema={"anyOf": [listed, other]})


def test_x_bounds_changes_a_default_and_null_removes_it(accepts):
    def schema(kind, **bounds):
        return {"type": kind, "x-bounds": bounds}
    assert accepts("1" * 40 + "." + "5" * 30, json_schema=schema("number", integer_digits=None, fraction_digits=None))
    assert accepts('"' + "a" * 3000 + '"', json_schema=schema("string", string_length=None))
    assert not accepts("1234", json_schema=schema("integer", integer_digits=3))
    assert not accepts("0.55", json_schema=schema("number", fraction_digits=1))
    assert not accepts('{"a": [1]}', json_schema=schema("object", free_depth=1))
    assert accepts('{"a": {"b": {"c": {"d": 1}}}}', json_schema=schema("object", free_depth=None))
    assert not accepts('{"a": 1, "b": 2}', json_schema=schema("object", free_members=1))


def test_flexible_whitespace_is_bounded_unless_the_schema_gives_a_pattern(accepts):
    flexible = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    assert accepts('{\n  "a": 1\n}', json_schema=flexible) and accepts('{ "a" : 1 }', json_schema=flexible)
    assert not accepts('{\n\n\n"a": 1}', json_schema=flexible) and not accepts('{"a":' + " " * 30 + "1}",
                                                                                  json_schema=flexible)
    unbounded = {"type": "object", "x-guidance": {"whitespace_flexible": True, "whitespace_pattern": r"[\x20\x0A]+"}}
    assert accepts('{\n\n\n"a":' + " " * 30 + "1}", json_schema=unbounded)
    assert bounded_schema(flexible, "json_schema")["x-guidance"]["whitespace_pattern"] == WHITESPACE


def test_the_rewrite_adds_only_what_the_schema_leaves_open():
    own = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5},
                                            "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2,
                                                  "multipleOf": 0.5},
                                            "s": {"type": "string", "maxLength": 3},
                                            "e": {"enum": [1.23456789012345, "x" * 3000]}},
           "required": ["n", "x", "s", "e"], "additionalProperties": False}
    assert bounded_schema(own, "json_schema") == own
    given = {"type": "number", "minimum": 0, "x-bounds": {"fraction_digits": 2}}
    assert bounded_schema(given, "json_schema") == {"type": "number", "minimum": 0, "exclusiveMaximum": 10**15,
                                                    "multipleOf": 0.01}
    assert "x-bounds" in given  # the caller's schema is left as it was
    assert JSON_BOUNDS == {"integer_digits": 15, "fraction_digits": 10, "string_length": 2000, "free_members": 16,
                           "free_depth": 3}  # the figures docs/structured_output.md#bounds gives


@pytest.mark.parametrize("bounds, needle", [
    ("tight", "x-bounds is an object"), ({"digits": 3}, "x-bounds: unknown key 'digits'"),
    ({"integer_digits": 19}, "x-bounds.integer_digits = 19"), ({"fraction_digits": 16}, "x-bounds.fraction_digits"),
    ({"free_depth": True}, "x-bounds.free_depth = True"), ({"string_length": -1}, "x-bounds.string_length"),
])
def test_a_bad_x_bounds_is_a_one_line_parameter_error(bounds, needle):
    for where, kw in [("json_schema", dict(json_schema={"type": "number", "x-bounds": bounds})),
                      ("response_format.schema", dict(response_format={"type": "json_object", "schema": {
                          "type": "object", "x-bounds": bounds}}))]:
        with pytest.raises(ParameterError) as e:
            constraint_spec(**kw)
        assert str(e.value).startswith(f"{where}: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_a_schema_nested_past_the_recursion_limit_is_a_one_line_parameter_error():
    deep = {"type": "integer"}
    for _ in range(3000):
        deep = {"type": "object", "properties": {"a": deep}}
    for schema in (deep, '{"a": ' * 5000 + "1" + "}" * 5000):
        with pytest.raises(ParameterError, match=r"^json_schema: nested deeper than Python's recursion limit$"):
            constraint_spec(json_schema=schema)


JSON_OBJECT_PROMPTS = ["Give me a JSON object describing a cat.", "List three fruits as JSON.", "JSON please",
                       "What is 2+2? Answer in JSON.", "Tell me a joke as JSON."]


@pytest.mark.slow
def test_json_object_replies_end_and_parse(model):
    """Greedy and seeded replies that ran to max_tokens before the bounds
    (endless keys: greedy "Give me a JSON object describing a cat." repeats
    "weight", "color"... for ever) end by the grammar and parse; the server's
    request path builds the same grammar."""
    from gemma_cy.server.protocol import ChatCompletionRequest
    from gemma_cy.server.requests import sequence_params

    cases = [(p, run) for p in JSON_OBJECT_PROMPTS for run in RUNS]
    done = model.generate_many([p for p, _ in cases], chat_format=True, max_tokens=1024,
                               per_sequence=[{"response_format": {"type": "json_object"}, **run} for _, run in cases])
    for (prompt, run), reply in zip(cases, done.complete()):
        assert reply.stop_reason == "grammar", (prompt, run, reply.text[-80:])
        assert isinstance(json.loads(reply.text), dict)
        if prompt == JSON_OBJECT_PROMPTS[0] and run == RUNS[0]:
            greedy = reply
    messages = [{"role": "user", "content": JSON_OBJECT_PROMPTS[0]}]
    request = ChatCompletionRequest(messages=messages, response_format={"type": "json_object"}, temperature=0)
    ids = model.chat_ids(messages)
    served = model.complete(ids, sequence_params(model, request, ids, 1024, None))
    assert served.ids == greedy.ids and served.stop_reason == "grammar"


@pytest.mark.slow
def test_50_number_schemas_every_reply_ends_and_validates(model):
    """The done-when measurement (docs/structured_output.md#bounds): 50 JSON
    Schemas with number fields, greedy and two seeds, 200 tokens at most."""
    cases = [(case, run) for case in json.loads(NUMBER_SCHEMAS.read_text(encoding="utf-8")) for run in RUNS]
    assert len(cases) == 150
    start = time.perf_counter()
    done = model.generate_many([case["prompt"] for case, _ in cases], chat_format=True, max_tokens=200,
                               per_sequence=[{"json_schema": case["schema"], **run} for case, run in cases]).complete()
    seconds = time.perf_counter() - start
    valid = 0
    for (case, run), reply in zip(cases, done):
        assert reply.stop_reason == "grammar", (case["schema"], run, reply.text[-80:])
        jsonschema.validate(json.loads(reply.text), case["schema"], cls=jsonschema.Draft202012Validator)
        valid += 1
    print(f"{valid}/{len(cases)} replies ended by the grammar and valid, {sum(len(r.ids) for r in done)} ids, "
          f"{seconds:.1f} s")
