"""A model file's own chat template is the one rendered, whatever the file's
vocabulary type (docs/generation.md#chat): SentencePiece (Gemma) files as well
as byte-level BPE ones, with the sandbox, deadline and caps applying to both.

The Gemma files here are the packaged Gemma 3 270M with its template set by
llama.cpp's own metadata tool (`gguf-new-metadata`, from the gguf package),
the way a user would; the expected ids come from plain jinja2 rendering of
the same template with the file's specials."""
import json
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest

from gemma_cy import api
from gemma_cy.errors import ModelFormatError, TemplateError
from gemma_cy.formats.gguf_writer import write_gguf
from gemma_cy.tokenizers.bpe import BPETokenizer
from gemma_cy.tokenizers.chat import chat_ids, chat_template_for
from gemma_cy.tokenizers.sp import SentencePieceTokenizer
from fuzz.harnesses import sp_vocab_fields
from helpers import assert_one_line_error, bpe_hand_vocab, cli

CUSTOM = ("{{ bos_token }}{% for m in messages %}<start_of_turn>CUSTOM {{ m['role'] }}: {{ m['content'] }}"
          "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
HOSTILE = "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}"

# The sandbox's refusals (test_chat.py holds the same cases on a hand-built
# BPE tokenizer); here each reaches the template through a file, of each kind.
REFUSED = [
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ("{{ messages.__class__ }}", "unsafe"),
    (HOSTILE, "unsafe"),
    ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    ("{{ raise_exception.__globals__ }}", "unsafe"),
    ("{% set x = messages.append({'role': 'x'}) %}", "chat template"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took more than"),
    ("{% for i in range(10**9) %}{% endfor %}", "Range too big"),
    ("{{ 'a' * 10000000000 }}", "repeating"),
    ("{% set s = namespace(t='a') %}{% for i in range(100) %}{% set s.t = s.t + s.t %}{% endfor %}{{ s.t }}",
     "joining"),
    ("{{ 2 ** 100000000 }}", "too large"),
    ("{% for i in range(100000) %}{{ 'aaaaaaaaaaaaaaaaaaaa' }}{% endfor %}", "passed"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
]


def vocab_file(kind: str, path: Path, template: str | None) -> str:
    """A vocabulary-only GGUF of ``kind`` ("sp": SentencePiece, "bpe":
    byte-level BPE) carrying ``template`` (None: no template key)."""
    if kind == "sp":
        fields = sp_vocab_fields()
    else:
        tokens, types, merges = bpe_hand_vocab()
        fields = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
                  "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
                  "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
                  "tokenizer.ggml.eos_token_id": 2}
    if template is not None:
        fields["tokenizer.chat_template"] = template
    write_gguf(path, fields, [])
    return str(path)


@pytest.mark.parametrize("kind, cls", [("sp", SentencePieceTokenizer), ("bpe", BPETokenizer)])
def test_every_gguf_vocabulary_carries_its_files_template(kind, cls, tmp_path):
    tok = api.open_tokenizer(vocab_file(kind, tmp_path / "v.gguf", CUSTOM))
    assert isinstance(tok, cls)
    chosen = chat_template_for(tok)
    assert (chosen.name, chosen.source) == ("file", CUSTOM)
    assert api.open_tokenizer(vocab_file(kind, tmp_path / "none.gguf", None)).chat_template is None


def test_a_template_that_is_not_a_string_is_refused(tmp_path):
    path = tmp_path / "v.gguf"
    write_gguf(path, {**sp_vocab_fields(), "tokenizer.chat_template": 7}, [])
    with pytest.raises(ModelFormatError, match="tokenizer.chat_template has type"):
        api.open_tokenizer(str(path))


@pytest.mark.parametrize("kind", ["sp", "bpe"])
@pytest.mark.parametrize("source, match", REFUSED)
def test_hostile_and_runaway_templates_in_a_file_are_refused(kind, source, match, tmp_path):
    import time
    tok = api.open_tokenizer(vocab_file(kind, tmp_path / "v.gguf", source))
    start = time.monotonic()
    with pytest.raises(TemplateError, match=match) as e:
        chat_ids(tok, chat_template_for(tok), [{"role": "user", "content": "hi"}])
    assert "\n" not in str(e.value) and time.monotonic() - start < 5


# ---------------------------------------------------------------- the real Gemma 3 file


def with_template(source_path: str, out: Path, template: str) -> str:
    """``source_path`` with its chat template set by llama.cpp's gguf-new-metadata."""
    tool = Path(sys.executable).parent / "gguf-new-metadata"
    if not tool.exists():
        pytest.skip("gguf-new-metadata (the gguf package's script) is not installed; make test installs it")
    subprocess.run([str(tool), "--force", "--chat-template", template, source_path, str(out)], check=True,
                   capture_output=True, timeout=300)
    return str(out)


@pytest.fixture(scope="module")
def custom_gemma(default_model, tmp_path_factory) -> str:
    return with_template(default_model, tmp_path_factory.mktemp("custom") / "custom.gguf", CUSTOM)


def test_the_packaged_base_model_has_no_template_and_gets_gemmas(default_model):
    assert api.load(default_model, max_cache_len=64).chat_template.name == "gemma"


def test_a_gemma_files_own_template_is_rendered(custom_gemma):
    """`--chat_format 1`, chat() and chat_ids() render the file's template:
    the ids of plain jinja2's rendering, with the file's <bos> spelling."""
    model = api.load(custom_gemma, max_cache_len=64)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = jinja2.Environment().from_string(CUSTOM).render(messages=messages, add_generation_prompt=True,
                                                           bos_token="<bos>", eos_token="<eos>")
    assert text.startswith("<bos><start_of_turn>CUSTOM system: Be brief.<end_of_turn>\n")
    want = model.tokenizer.encode(text, parse_special=True)
    assert want[0] == model.tokenizer.bos_id and model.tokenizer.token_id("<start_of_turn>") in want
    assert model.chat_template.name == "file"
    assert model.chat_ids(messages) == want

    out = cli("-m", custom_gemma, "--chat_format", "1", "--system", "Be brief.", "-p", "hi", "-n", "1",
              "--temp", "0", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["prompt_ids"] == want


def test_a_hostile_template_in_a_gemma_file_is_one_line(default_model, tmp_path):
    path = with_template(default_model, tmp_path / "hostile.gguf", HOSTILE)
    out = cli("-m", path, "--chat_format", "1", "-p", "hi", "-n", "1", timeout=300)
    assert_one_line_error(out, "chat template refused by the sandbox", code=1)
