"""GenerationParams (gemma_cy/generation/params.py): every setting in one
class, checked when built, and every surface (keywords, JSON lines, CLI
flags, server bodies) built from it; a model's default slots; the grammar
cache (docs/generation.md#generation-settings)."""
from __future__ import annotations

import dataclasses
import json

import pytest

import gemma_cy
from gemma_cy.commands.cli import build_parser, check_values
from gemma_cy.errors import ParameterError, UnknownSettingError
from gemma_cy.generation import engines
from gemma_cy.generation.params import DATA_FIELDS, FIELDS, FLAG_FIELDS, GenerationParams, cli_flags


@pytest.mark.parametrize("setting, value, needle", [
    ("max_tokens", -1, "max_tokens = -1"), ("max_tokens", 2.5, "max_tokens = 2.5"),
    ("temperature", -0.1, "temperature"), ("temperature", float("nan"), "temperature"),
    ("min_p", 1.5, "min_p"), ("top_k", -1, "top_k"), ("top_p", 0.0, "top_p"),
    ("repeat_penalty", 0.0, "repeat_penalty"), ("presence_penalty", float("inf"), "presence_penalty"),
    ("repeat_last_n", -2, "repeat_last_n"), ("seed", -1, "seed"), ("seed", 2**64, "seed"),
    ("stop", [""], "stop"), ("stop", 5, "stop"), ("terminate_on_eos", 2, "terminate_on_eos"),
    ("logprobs", 21, "logprobs"), ("speculative", "ngram", "speculative"), ("draft_max", 3, "draft_max"),
    ("regex", 7, "regex"), ("choices", [], "choices"), ("json_schema", "{not json", "json_schema"),
    ("accept_token", 3, "accept_token"), ("logits_processor", [1], "logits_processor"),
])
def test_a_value_out_of_range_is_refused_when_built(setting, value, needle):
    with pytest.raises(ParameterError, match=needle):
        GenerationParams(**{setting: value})


def test_defaults_and_normal_forms():
    p = GenerationParams()
    assert (p.max_tokens, p.temperature, p.min_p, p.top_k, p.top_p, p.seed) == (250, 0.8, 0.05, 0, 1.0, 0)
    q = GenerationParams(stop="\n", terminate_on_eos=0, choices=["a", "b"])
    assert q.stop == ("\n",) and q.terminate_on_eos is False and q.choices == ("a", "b")
    assert q.constraint_spec.kind == "choices"
    assert GenerationParams(response_format={"type": "text"}).constraint_spec is None
    assert GenerationParams(regex="[0-9]+").constraint_spec.kind == "regex"


def test_two_constraints_are_refused():
    with pytest.raises(ParameterError, match="at most one constraint"):
        GenerationParams(regex="a", choices=["b"])


def test_keywords_n_dec_and_unknown_names():
    assert GenerationParams.from_keywords({"n_dec": 7}).max_tokens == 7
    assert GenerationParams.from_keywords({"n_dec": 7, "max_tokens": 7}).max_tokens == 7
    with pytest.raises(ParameterError, match="give one"):
        GenerationParams.from_keywords({"n_dec": 7, "max_tokens": 8})
    with pytest.raises(UnknownSettingError, match="unknown keyword 'temp'") as e:
        GenerationParams.from_keywords({"temp": 0.5})
    assert isinstance(e.value, TypeError)  # as Python's own for an unknown keyword
    base = GenerationParams(temperature=0, max_tokens=5)
    assert GenerationParams.from_keywords({"seed": 3}, base) == dataclasses.replace(base, seed=3)
    assert GenerationParams.from_keywords({}, base) is base


def test_json_takes_the_data_settings_only():
    assert "rng" not in DATA_FIELDS and "observer" not in DATA_FIELDS and "draft" not in DATA_FIELDS
    p = GenerationParams.from_json({"temperature": 0, "stop": ["x"], "json_schema": {"type": "object"}})
    assert p.data() == {"temperature": 0, "stop": ["x"], "json_schema": {"type": "object"}}
    assert GenerationParams.from_json(json.loads(json.dumps(p.data()))) == p  # data() round-trips
    with pytest.raises(ParameterError, match="unknown key 'rng'"):
        GenerationParams.from_json({"rng": 1})


def test_every_flag_setting_is_a_cli_flag_and_parses_to_the_same_params():
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    assert set(FLAG_FIELDS) <= dests
    args = parser.parse_args(["-n", "9", "--temp", "0.5", "--minp", "0.1", "--topk", "4", "--topp", "0.9",
                              "--repeat_penalty", "1.1", "--presence_penalty", "0.2", "--frequency_penalty", "0.3",
                              "--repeat_last_n", "32", "-s", "11", "--stop", "A", "--stop", "B",
                              "--terminate_on_eos", "0", "--draft", "lookup", "--draft_max", "5"])
    check_values(args)
    assert args.params == GenerationParams(max_tokens=9, temperature=0.5, min_p=0.1, top_k=4, top_p=0.9,
                                           repeat_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3,
                                           repeat_last_n=32, seed=11, stop=("A", "B"), terminate_on_eos=False,
                                           speculative="lookup", draft_max=5)
    defaults = build_parser().parse_args([])
    check_values(defaults)
    assert defaults.params == GenerationParams()
    assert len(cli_flags()) == len(FLAG_FIELDS)


def test_a_bad_flag_names_the_flag_as_typed():
    args = build_parser().parse_args(["--temp", "-1"])
    with pytest.raises(ParameterError, match=r"^--temp: temperature"):
        check_values(args)


def test_the_server_body_maps_to_the_same_params():
    from gemma_cy.server.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=0.3, top_k=2, seed=5,
                                stop="END", min_p=0.0, json_schema={"type": "object"})
    p = req.to_params(max_tokens=12, logprobs=None)
    assert p == GenerationParams(max_tokens=12, temperature=0.3, top_k=2, seed=5, stop=("END",), min_p=0.0,
                                 json_schema={"type": "object"})
    assert p.for_sample(2).seed == 7 and GenerationParams(seed=2**64 - 1).for_sample(1).seed == 0
    with pytest.raises(ParameterError, match="top_k"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], top_k=-3).to_params(4, None)


def test_every_field_is_known_to_from_keywords():
    assert set(FIELDS) == {f.name for f in dataclasses.fields(GenerationParams)}
    for name in FIELDS:  # each a keyword generate() takes: no hand-kept list beside the class
        GenerationParams.from_keywords({name: getattr(GenerationParams(), name)})


def test_model_generate_takes_a_params_object_with_keywords_on_top(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, max_cache_len=64)
    greedy = GenerationParams(temperature=0, max_tokens=6, terminate_on_eos=False)
    a = model.complete("ab", greedy)
    assert len(a.ids) == 6
    assert model.complete("ab", greedy, max_tokens=3).ids == a.ids[:3]
    assert model.complete("ab", temperature=0, max_tokens=6, terminate_on_eos=False).ids == a.ids


def test_default_slots_follow_the_memory(tiny_model_path, monkeypatch):
    model = gemma_cy.load(tiny_model_path, max_cache_len=64)
    assert model.max_sequences == engines.DEFAULT_MAX_SEQUENCES  # a tiny model: the memory is no limit
    per = engines.sequence_cache_bytes(model.config, 64)
    monkeypatch.setattr(engines, "available_memory", lambda: int(per * 3 / engines.MEMORY_SHARE) + 1)
    assert engines.default_max_sequences(model.config, 64) == 3
    monkeypatch.setattr(engines, "available_memory", lambda: 0)
    assert engines.default_max_sequences(model.config, 64) == 1
    assert gemma_cy.load(tiny_model_path, max_cache_len=64, max_sequences=2).max_sequences == 2


def test_a_list_of_prompts_runs_together_without_a_keyword(tiny_model_path):
    model = gemma_cy.load(tiny_model_path, max_cache_len=64)
    prompts = ["ab", "cd", "ef", "gh"]
    run = model.generate_many(prompts, temperature=0, max_tokens=4, terminate_on_eos=False)
    seen_running = 0
    for _ in run:
        seen_running = max(seen_running, len(run.scheduler.running))
    assert seen_running == len(prompts)  # all four in slots at once
    alone = [model.complete(p, temperature=0, max_tokens=4, terminate_on_eos=False).ids for p in prompts]
    assert [c.ids for c in run.complete()] == alone


def test_a_grammar_is_compiled_once_per_spec(tiny_model_path, monkeypatch):
    pytest.importorskip("llguidance", reason="structured output needs llguidance")
    from gemma_cy.generation import constraint

    compiled = []
    real = constraint.grammar_text
    monkeypatch.setattr(constraint, "grammar_text", lambda spec: compiled.append(spec) or real(spec))
    model = gemma_cy.load(tiny_model_path, max_cache_len=64)
    outs = model.complete("ab", n=3, temperature=1.0, max_tokens=4, choices=["yes", "no"])
    assert len(compiled) == 1
    assert all("yes".startswith(c.text) or "no".startswith(c.text) for c in outs), [c.text for c in outs]
    model.complete("cd", max_tokens=4, choices=["yes", "no"])
    assert len(compiled) == 1  # the same spec again: from the cache
    model.complete("cd", max_tokens=4, choices=["maybe"])
    assert len(compiled) == 2
