"""Golden chat token ids from HF transformers' ``apply_chat_template`` (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_chat_goldens.py

For Gemma 3 270M and SmolLM2-135M-Instruct, the tokenizer HF builds from
each GGUF renders a fixed set of conversations (system roles, several
turns, whitespace, non-ASCII text) with ``add_generation_prompt`` and
tokenizes them (``tokenize=True``); one JSON line per (model,
conversation) goes to tests/goldens/chat_templates.jsonl:

    {"model": ..., "messages": [...], "add_generation_prompt": ..., "text": ..., "ids": [...]}

SmolLM2's GGUF carries its template and HF renders that. The packaged Gemma
3 GGUF (the base model) carries none, so HF is handed the template Google
ships with the Gemma 3 instruction-tuned models, read from gemma-cy's own
copy (gemma_cy/tokenizers/chat.py): what is checked is the rendering (jinja2
settings, bos_token) and the tokenization of the rendered text.

The corrections the tokenizer goldens apply (Gemma's space runs, SmolLM2's
digit split) are applied here too; no conversation reaches their cases
except SmolLM2's digits.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "chat_templates.jsonl"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

CONVERSATIONS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "You are a pirate. Answer in one sentence."},
      {"role": "user", "content": "Where is the treasure buried?"}], True),
    ([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Name a prime number."},
      {"role": "assistant", "content": "7"},
      {"role": "user", "content": "And one above 100?"}], True),
    ([{"role": "user", "content": "  Translate to French:\n\n  'The cat sleeps.'  \n"}], True),
    ([{"role": "user", "content": "Écris un haïku sur l'automne 🍂 — 秋の葉"}], True),
    ([{"role": "user", "content": "Count: 1, 22, 333, 4444.5"},
      {"role": "assistant", "content": "Four numbers."}], False),
    ([{"role": "user", "content": "def f(x):\n    return x * 2\n\nWhat does f do?"}], True),
]


def gemma_tokenizer(path: str):
    from make_tokenizer_goldens import add_space_runs, load_hf_tokenizer

    from gemma_cy.tokenizers.chat import GEMMA_TEMPLATE

    tok = load_hf_tokenizer(path)
    add_space_runs(tok)
    return tok, GEMMA_TEMPLATE


def smollm2_tokenizer(path: str):
    from make_smollm2_goldens import load_hf_tokenizer, split_digits

    tok = load_hf_tokenizer(path)
    split_digits(tok)
    return tok, None  # the file's own template


def hf_ids(tok, messages, add_generation_prompt: bool, template) -> tuple[str, list[int]]:
    text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                   chat_template=template)
    out = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                  chat_template=template)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return text, [int(i) for i in ids]


def main() -> int:
    from gemma_cy.formats.packaged import default_model_path, smollm2_source_path

    rows = []
    for name, path, load in (("gemma3_270m", default_model_path(), gemma_tokenizer),
                             ("smollm2_135m", smollm2_source_path(), smollm2_tokenizer)):
        tok, template = load(path)
        for messages, add_generation_prompt in CONVERSATIONS:
            text, ids = hf_ids(tok, messages, add_generation_prompt, template)
            rows.append({"model": name, "messages": messages, "add_generation_prompt": add_generation_prompt,
                         "text": text, "ids": ids})
    import transformers
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(json.dumps({"oracle": f"transformers {transformers.__version__}"}) + "\n")
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: {len(rows)} conversations", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
