"""A small Gemma 4 vocabulary and HF transformers' ids for it (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_gemma4_tokenizer_goldens.py [--llama-cpp DIR] [--peers-python PATH] [-o DIR]

(``--llama-cpp``: the llama.cpp tree whose gguf-py is used, by default the one
in llama-cpp-python 0.3.36's source distribution under ~/.cache/gemma-cy.)

No Gemma 4 tokenizer can be downloaded here, so this script makes one the
way Google's is built, small, and proves gemma-cy's ``gemma4`` tokenizer
(gemma_cy/tokenizers/gemma4_bpe.py) against HF's on it:

1. **Train** a BPE with HF ``tokenizers`` on the repository's tokenizer
   corpus (make_tokenizer_goldens.corpus, seeded) under Gemma's normalizer
   (" " -> U+2581, nothing pre-split, so merges cross words and lines), at
   most ``ALPHABET`` characters (the rest of the corpus' characters must go
   through byte fallback).
2. **Assemble** a Gemma-shaped vocabulary: Gemma's specials (<pad> <eos>
   <bos> <unk> <mask>), Gemma 4's chat and media markers (MARKERS), the 256
   byte tokens <0x00>..<0xFF>, then the trained tokens. The merges are
   made as HF makes Gemma's from its SentencePiece model (transformers'
   ``generate_merges``): every split of a token into two tokens, ranked by
   the token's score (here its place in the vocab). Several merges then
   make the same token, so the queue rule of HF's ``Word.merge_all``
   matters, as it does for Google's vocabulary.
3. **Wrap** it as transformers' ``GemmaTokenizer`` (BPE with byte fallback
   and fuse_unk, normalizer Replace(" ", "▁"), pre-tokenizer Split(" ",
   merged_with_previous), decoder Replace + ByteFallback + Fuse; the
   markers as special tokens; a Gemma 4 style chat template) and
   ``save_pretrained`` it.
4. **Convert** the saved directory as llama.cpp's converter does
   (conversion/gemma.py ``Gemma4Model.set_vocab``, run from llama.cpp's own
   gguf-py: ``LlamaHfVocab`` tokens, scores and types with the visible
   markers retyped USER_DEFINED, ``SpecialVocab(load_merges=True)``,
   add_space_prefix false, add_bos_token true) into a vocab-only GGUF
   (general.architecture "gemma4", no tensors): ``vocab.gguf``.
5. **Encode** the corpus (plus Gemma 4 chat strings) with the HF tokenizer
   and write ``ids.jsonl`` as make_tokenizer_goldens.write_jsonl does:
   ``ids`` with ``add_special_tokens=False, split_special_tokens=True``,
   ``ids_special`` where parsing the markers differs, ``hf_decoded`` where
   HF's decode is not the text (HF's decode of the ids less the control
   ids: HF spells a control id out, gemma-cy decodes it to nothing).
6. Optionally (``--peers-python``, a Python with llama-cpp-python) record
   llama.cpp's ids for the same strings (``llama_ids`` in ``llama.json``,
   only where they differ from HF's) and print how many differ and why.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from make_tokenizer_goldens import corpus

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "gemma4_tokenizer"
LLAMA_CPP = Path.home() / ".cache" / "gemma-cy" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
# Gemma 4's markers: turns, thinking channel, tools, string quote, think switch, media.
MARKERS = ["[multimodal]", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>",
           "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>",
           "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>",
           "<unused0>", "<unused1>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TRAINED = 1100      # tokens the trainer makes (alphabet + merges)
ALPHABET = 200      # characters it may keep; the others fall back to bytes

# A Gemma 4 style chat template (turns <|turn>role ... <turn|>, "model" for the assistant).
TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|turn>' + role + '\\n' + (message['content'] | trim) + '<turn|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\\n' }}{%- endif -%}"
)


def gemma4_corpus() -> list[str]:
    """make_tokenizer_goldens' corpus, plus Gemma 4 chat text and newline mixes."""
    import random

    rng = random.Random(20260904)
    texts = corpus()
    words = [w for t in texts[200:400] for w in t.split()][:300]
    texts += MARKERS + ["<|turn", "turn|>", "<|channel", "<||>", "<|TURN>", "<<|turn>>", "<0x0A>", "<0x"]
    roles = ["user", "model", "system", "tool"]
    for _ in range(60):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        texts.append(f"<|turn>{rng.choice(roles)}\n{body}<turn|>\n" + rng.choice(["", "<|turn>model\n"]))
    for _ in range(40):
        texts.append(rng.choice(MARKERS) + rng.choice(["", " ", "\n", "x", "thought\n"]) + rng.choice(MARKERS))
    texts += ["<|turn>model\n<|channel>thought\nLet me think.<channel|>The answer is 4.<turn|>",
              '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "<|image><|image|><image|>\n\n"]
    for _ in range(80):
        texts.append(rng.choice(["", "a", ":", " "]) + rng.choice(["\n", "\n\n", " \n", "\n ", "\n\t", ":\n"])
                     * rng.randint(1, 5) + rng.choice(["", "b", " b", "e", "-"]))
    return texts


def train(texts: list[str]) -> list[str]:
    """The trained tokens, in the trainer's order (alphabet, then merges by rank).

    The trainer is run so that it is deterministic: its own alphabet limit
    drops characters tied in count at random, so the ``ALPHABET`` most
    frequent characters (ties by code point) are chosen here and the
    others taken out of the training text; "<0x" is taken out too (no
    trained token may spell a byte token)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, normalizers, trainers

    texts = [t.replace("<0x", "<0 x").replace(" ", "\u2581") for t in texts]
    counts = Counter(ch for t in texts for ch in t)
    keep = set(sorted(counts, key=lambda ch: (-counts[ch], ord(ch)))[:ALPHABET])
    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=TRAINED, show_progress=False)
    tok.train_from_iterator(["".join(ch for ch in t if ch in keep) for t in texts], trainer)
    model = json.loads(tok.to_str())["model"]
    return sorted(model["vocab"], key=model["vocab"].get)


def assemble(texts: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(token -> id, merges): specials, markers, bytes, then the trained
    tokens; merges as HF derives them from a SentencePiece model
    (transformers' ``generate_merges`` with scores, as its Gemma converter
    calls it): every split of a token into two tokens, by the token's
    score (here: vocab order), longer left half first; none makes or uses
    a special, marker or byte token."""
    from transformers.tokenization_utils_base import generate_merges

    tokens = SPECIALS + MARKERS + BYTES
    taken = set(tokens)
    tokens += [t for t in train(texts) if t not in taken]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SystemExit("duplicate tokens")
    scores = {t: -float(i) for i, t in enumerate(tokens)}
    return vocab, generate_merges(vocab, scores, skip_tokens=taken)


def hf_tokenizer(vocab, merges, out_dir: Path):
    """transformers' GemmaTokenizer over the vocabulary, saved to ``out_dir`` and loaded back."""
    from transformers import AutoTokenizer, GemmaTokenizer

    tok = GemmaTokenizer(vocab=vocab, merges=merges, extra_special_tokens=MARKERS)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out_dir)
    loaded = AutoTokenizer.from_pretrained(out_dir)
    if type(loaded).__name__ != "GemmaTokenizer":
        raise SystemExit(f"reloaded as {type(loaded).__name__}")
    return loaded


def convert(hf_dir: Path, gguf_path: Path) -> set[int]:
    """The tokenizer half of llama.cpp's Gemma4Model: set_vocab, line for line, into a vocab-only GGUF."""
    import gguf

    vocab = gguf.LlamaHfVocab(hf_dir)
    visible = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
               "<tool_response|>", '<|"|>'}  # Gemma4Model.set_vocab's visible_tokens
    tokens, scores, types = [], [], []
    for text, score, toktype in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(gguf.TokenType.USER_DEFINED if text.decode() in visible else toktype)
    writer = gguf.GGUFWriter(str(gguf_path), "gemma4")
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(writer)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL}


def write_rows(tok, control: set[int], texts, plain, special, out: Path) -> None:
    """One JSON line per string: text, ids, ids_special when parsing the
    markers changes them, hf_decoded when HF's decode (of the ids less the
    control ids) is not the text."""
    with open(out, "w", encoding="utf-8") as f:
        for text, ids, ids_special in zip(texts, plain, special):
            row = {"text": text, "ids": ids}
            if ids_special != ids:
                row["ids_special"] = ids_special
            decoded = tok.decode([i for i in ids if i not in control])
            if decoded != text:
                row["hf_decoded"] = decoded
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(texts)} strings to {out}", file=sys.stderr)


LLAMA_SCRIPT = """
import json, sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
out = []
for text in json.load(open(sys.argv[2], encoding="utf-8")):
    data = text.encode("utf-8")
    out.append([llm.tokenize(data, add_bos=False, special=False) if data else [],
                llm.tokenize(data, add_bos=False, special=True) if data else []])
json.dump(out, open(sys.argv[3], "w"))
"""


def llama_ids(peers_python: str, gguf_path: Path, texts: list[str], tmp: Path) -> list[list[list[int]]]:
    """llama.cpp's ids of ``texts`` ([plain, special parsed] each), by llama-cpp-python in ``peers_python``."""
    (tmp / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    (tmp / "run.py").write_text(LLAMA_SCRIPT, encoding="utf-8")
    subprocess.run([peers_python, str(tmp / "run.py"), str(gguf_path), str(tmp / "texts.json"),
                    str(tmp / "ids.json")], check=True)
    return json.loads((tmp / "ids.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", default=str(LLAMA_CPP), help="llama.cpp source tree (for its gguf-py)")
    parser.add_argument("--peers-python", help="a Python with llama-cpp-python: also record llama.cpp's ids")
    parser.add_argument("-o", "--out", default=str(OUT))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(args.llama_cpp) / "gguf-py"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    texts = gemma4_corpus()
    vocab, merges = assemble(texts)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = hf_tokenizer(vocab, merges, tmp / "hf")
        control = convert(tmp / "hf", out / "vocab.gguf")
        plain = [tok(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] for t in texts]
        special = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        print(f"vocab {len(vocab)} tokens, {len(merges)} merges; {sum(map(len, plain))} ids over "
              f"{len(texts)} strings", file=sys.stderr)
        write_rows(tok, control, texts, plain, special, out / "ids.jsonl")
        if args.peers_python:
            got = llama_ids(args.peers_python, out / "vocab.gguf", texts, tmp)
            rows = [{"line": i, "llama_ids": g[0]} | ({"llama_ids_special": g[1]} if g[1] != special[i] else {})
                    for i, g in enumerate(got) if g[0] != plain[i] or g[1] != special[i]]
            (out / "llama.json").write_text(json.dumps(rows) + "\n", encoding="utf-8")
            n_plain = sum(g[0] != plain[i] for i, g in enumerate(got))
            n_special = sum(g[1] != special[i] for i, g in enumerate(got))
            print(f"llama.cpp differs from HF on {n_plain}/{len(texts)} strings (plain), {n_special} "
                  f"(markers parsed); recorded in {out / 'llama.json'}", file=sys.stderr)
    print(f"wrote {out / 'vocab.gguf'} ({os.path.getsize(out / 'vocab.gguf')} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
