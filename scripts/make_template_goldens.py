"""Real chat templates rendered by HF transformers (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_template_goldens.py

llama.cpp keeps the chat templates of many released models in
``models/templates/*.jinja`` (Qwen 2.5 and 3, Llama 3.1-3.3, Phi-3.5,
Gemma 2 and 4, Mistral, SmolLM3, Granite, DeepSeek...), in
llama-cpp-python's sdist (tests/llama_cpp_source.py fetches it). Each one
renders a fixed set of conversations through transformers'
``apply_chat_template(..., tokenize=False)`` (jinja2, its sandbox and
globals), with a tokenizer whose bos and eos tokens are ``BOS``/``EOS``,
the clock fixed at ``NOW`` (templates that print today's date) and the
extra variables of each case; the text, or the error the template raised,
goes to tests/goldens/chat_templates_llama_cpp.json.gz, keyed by the
template's SHA-256 so a changed file is noticed.
"""
from __future__ import annotations

import datetime
import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "chat_templates_llama_cpp.json.gz"
BOS, EOS = "<s>", "</s>"
NOW = datetime.datetime(2024, 7, 26, 9, 30)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}

# name -> (messages, add_generation_prompt, tools, extra template variables)
CASES = {
    "user": ([{"role": "user", "content": "What is the capital of France?"}], True, None, {}),
    "system": ([{"role": "system", "content": "You are a pirate. Answer in one sentence."},
                {"role": "user", "content": "Where is the treasure buried?"}], True, None, {}),
    "multi_turn": ([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Name a prime number."},
                    {"role": "assistant", "content": "7"},
                    {"role": "user", "content": "And one above 100?"}], True, None, {}),
    "no_generation_prompt": ([{"role": "user", "content": "Écris un haïku 🍂 — 秋の葉\n\n  indented"},
                              {"role": "assistant", "content": "Feuilles d'automne."}], False, None, {}),
    "tools": ([{"role": "user", "content": "What is the weather in Paris?"}], True, [WEATHER], {}),
    "tools_system": ([{"role": "system", "content": "You help with the weather."},
                      {"role": "user", "content": "And in Tokyo, in fahrenheit?"}], True, [WEATHER], {}),
    "no_thinking": ([{"role": "user", "content": "2 + 2?"}], True, None, {"enable_thinking": False}),
}


def hf_tokenizer():
    """A tokenizer that only carries the special tokens a template reads."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {BOS: 0, EOS: 1, "x": 2}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="x")),
                                   bos_token=BOS, eos_token=EOS)


def main() -> None:
    import transformers
    import transformers.utils.chat_template_utils as ctu

    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    from llama_cpp_source import VERSION, llama_cpp_dir

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return NOW

    ctu.datetime = FixedClock  # strftime_now reads the module's datetime.now()
    tok = hf_tokenizer()
    templates = {}
    for path in sorted((llama_cpp_dir("models") / "models" / "templates").glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        rows = {}
        for name, (messages, add_generation_prompt, tools, extra) in CASES.items():
            try:
                text = tok.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                               add_generation_prompt=add_generation_prompt, **extra)
                rows[name] = {"text": text}
            except Exception as e:  # the template's own raise_exception, or what it cannot do
                rows[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        templates[path.name] = {"sha256": hashlib.sha256(source.encode()).hexdigest(), "cases": rows}
        print(path.name, sum("text" in r for r in rows.values()), "rendered", file=sys.stderr)
    golden = {"oracle": f"transformers {transformers.__version__} apply_chat_template(tokenize=False)",
              "source": f"llama-cpp-python {VERSION} sdist, vendor/llama.cpp/models/templates",
              "bos_token": BOS, "eos_token": EOS, "now": NOW.isoformat(),
              "cases": {name: {"messages": m, "add_generation_prompt": g, "tools": t, "template_kwargs": k}
                        for name, (m, g, t, k) in CASES.items()},
              "templates": templates}
    OUT.write_bytes(gzip.compress(json.dumps(golden, ensure_ascii=False, indent=0).encode(), mtime=0))
    print(f"wrote {len(templates)} templates x {len(CASES)} cases to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
