"""Real chat templates against transformers' apply_chat_template (docs/generation.md#real-chat-templates).

Every template in llama.cpp's ``models/templates`` (llama-cpp-python's
sdist, tests/llama_cpp_source.py) renders each conversation of
tests/goldens/chat_templates_llama_cpp.json.gz (made by
scripts/make_template_goldens.py: system roles, several turns, with and
without the generation prompt, with and without tools, an extra template
variable) to transformers' text, or fails where transformers failed (the
template's own raise_exception: Gemma 2 has no system role), with the same
bos and eos spellings and the clock fixed at the goldens' date.
"""
import datetime
import functools
import gzip
import hashlib
import json
from pathlib import Path

import pytest

from gemma_cy.errors import TemplateError
from gemma_cy.tokenizers import chat
from helpers import GOLDENS
from llama_cpp_source import sdist_or_skip

pytestmark = pytest.mark.oracle

GOLDEN = json.loads(gzip.decompress((GOLDENS / "chat_templates_llama_cpp.json.gz").read_bytes()))
TEMPLATES = sorted(GOLDEN["templates"])
# Templates the sandbox refuses where transformers renders: name -> the reason (none today).
REFUSED: dict[str, str] = {}


class SpecialTokens:
    """What render() reads of a tokenizer: the bos and eos spellings."""

    bos_id, eos_id = 0, 1

    def spelling(self, token_id: int) -> str:
        return (GOLDEN["bos_token"], GOLDEN["eos_token"])[token_id]


@functools.lru_cache(maxsize=None)
def template_dir() -> Path:
    return sdist_or_skip("models") / "models" / "templates"


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    now = datetime.datetime.fromisoformat(GOLDEN["now"])
    monkeypatch.setattr(chat, "_now", lambda: now)


def test_goldens_cover_the_issue_s_templates():
    """The templates of the models gemma-cy's users run, each with text on most cases."""
    for name in ("Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct",
                 "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
                 "microsoft-Phi-3.5-mini-instruct", "google-gemma-2-2b-it", "google-gemma-4-31B-it",
                 "mistralai-Mistral-Nemo-Instruct-2407", "HuggingFaceTB-SmolLM3-3B",
                 "ibm-granite-granite-3.3-2B-Instruct"):
        cases = GOLDEN["templates"][name + ".jinja"]["cases"]
        assert sum("text" in c for c in cases.values()) >= 4, name
    assert len(TEMPLATES) >= 60 and set(GOLDEN["cases"]) >= {"system", "multi_turn", "tools", "no_generation_prompt"}


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_renders_as_transformers(name):
    path = template_dir() / name
    source = path.read_text(encoding="utf-8")
    assert hashlib.sha256(source.encode()).hexdigest() == GOLDEN["templates"][name]["sha256"], \
        f"{name} changed since the goldens were made: run scripts/make_template_goldens.py"
    template = chat.ChatTemplate("file", source, ())
    for case, want in GOLDEN["templates"][name]["cases"].items():
        c = GOLDEN["cases"][case]
        args = (template, c["messages"], SpecialTokens(), c["add_generation_prompt"], c["tools"],
                c["template_kwargs"])
        if name in REFUSED:
            with pytest.raises(TemplateError, match=REFUSED[name]):
                chat.render(*args)
        elif "text" in want:
            assert chat.render(*args) == want["text"], f"{name}: {case}"
        else:
            with pytest.raises(TemplateError):
                chat.render(*args)
