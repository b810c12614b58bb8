"""Chat templates on the real models against HF transformers' apply_chat_template
(tests/goldens/chat_templates.jsonl, made by scripts/make_chat_goldens.py):
the rendered text and its token ids, system roles and several turns
included. Gemma 3's packaged GGUF carries no template, so both sides render
the one Google ships with the instruction-tuned Gemma 3 (docs/generation.md#chat);
SmolLM2's comes from its GGUF."""
import functools

import pytest

from gemma_cy.api import open_tokenizer
from gemma_cy.errors import GemmaCyError
from gemma_cy.tokenizers.chat import chat_ids, chat_template_for, render
from helpers import golden_rows

pytestmark = pytest.mark.oracle

ROWS = golden_rows("chat_templates.jsonl", "make_chat_goldens.py")[1:]  # the first line names the oracle


@functools.lru_cache(maxsize=None)
def tokenizer(model: str):
    from gemma_cy.formats.packaged import default_model_path, smollm2_source_path

    try:
        path = default_model_path(progress=False) if model == "gemma3_270m" else smollm2_source_path()
    except GemmaCyError as e:
        pytest.skip(f"the {model} package is not installed ({e})")
    return open_tokenizer(path)


def test_goldens_cover_both_models_and_system_roles():
    assert {r["model"] for r in ROWS} == {"gemma3_270m", "smollm2_135m"}
    assert any(m["role"] == "system" for r in ROWS for m in r["messages"])
    assert any(len(r["messages"]) >= 4 for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['model']}-{i}" for i, r in enumerate(ROWS)])
def test_chat_ids_equal_transformers(row):
    tok = tokenizer(row["model"])
    template = chat_template_for(tok)
    assert template.name == ("gemma" if row["model"] == "gemma3_270m" else "file")
    assert render(template, row["messages"], tok, row["add_generation_prompt"]) == row["text"]
    assert chat_ids(tok, template, row["messages"], row["add_generation_prompt"]) == row["ids"]
