"""Benchmark: speculative decoding by prompt lookup against plain decoding (docs/benchmarks.md#speculative-decoding).

    python scripts/bench_speculative.py               # every prompt, 3 interleaved repetitions
    python scripts/bench_speculative.py --repeat 1    # a quick look

Gemma 3 270M (the default model, as stored), one thread, the f32 mode,
greedy, ``--tokens`` (128) tokens per reply, in the model's chat template.
Two kinds of prompt, written for this benchmark:

- grounded: a document of 1,000-2,000 tokens (a licence text from
  /usr/share/common-licenses) and a request to copy, quote or lightly
  edit it, where the reply repeats its input;
- free: a request with nothing in the prompt to repeat.

Per prompt and repetition, interleaved: plain decode tok/s and lookup
decode tok/s (decode time only: the prompt's prefill is the same for both
and is reused from the cache after the first run), and whether the two
texts are identical (they must be: docs/generation.md#speculative-decoding).
Printed: per prompt the medians and lookup over plain; per kind the median
of those ratios.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench_host import cpu_name

LICENSES = Path("/usr/share/common-licenses")


def doc(name: str, start: int, words: int) -> str:
    text = (LICENSES / name).read_text(encoding="utf-8", errors="replace").split(" ")
    return " ".join(text[start:start + words])


PROMPTS = [
    ("grounded", lambda: f"Copy the following text exactly, word for word:\n\n{doc('GPL-3', 200, 900)}"),
    ("grounded", lambda: f"{doc('Apache-2.0', 0, 1000)}\n\nRepeat section 4 of the licence above exactly."),
    ("grounded", lambda: f"{doc('MPL-2.0', 100, 1000)}\n\nQuote the definitions in section 1 word for word."),
    ("grounded", lambda: f"Rewrite this text with every 'Software' replaced by 'Program', changing nothing else:"
                         f"\n\n{doc('Artistic', 0, 900)}"),
    ("grounded", lambda: f"{doc('LGPL-2.1', 300, 1100)}\n\nCopy the first two paragraphs of the text above."),
    ("free", lambda: "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("free", lambda: "Explain how a refrigerator works, step by step."),
    ("free", lambda: "Give me ten ideas for a birthday party for a seven-year-old."),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="the first LIMIT prompts of each kind only")
    p.add_argument("--activations", choices=("f32", "q8"), default="f32")
    p.add_argument("--draft_max", type=int, default=None, help="ids drafted at most per block (default 7)")
    args = p.parse_args()
    prompts, per_kind = [], {}
    for kind, make in PROMPTS:
        if args.limit is None or per_kind.get(kind, 0) < args.limit:
            prompts.append((kind, make))
            per_kind[kind] = per_kind.get(kind, 0) + 1

    import gemma_cy

    model = gemma_cy.load(max_cache_len=4096, activations=args.activations)
    runs = {i: {"plain": [], "lookup": [], "same": True, "n": 0, "kept": [], "passes": []}
            for i in range(len(prompts))}
    for r in range(args.repeat):
        for i, (kind, make) in enumerate(prompts):
            messages = [{"role": "user", "content": make()}]
            runs[i]["n"] = len(model.chat_ids(messages))
            texts = {}
            for mode in ("plain", "lookup"):
                kw = dict(speculative="lookup", draft_max=args.draft_max) if mode == "lookup" else {}
                out = model.chat_complete(messages, max_tokens=args.tokens, temperature=0, **kw)
                runs[i][mode].append(out.timing.decode_tok_s)
                texts[mode] = out.ids
                if mode == "lookup":
                    runs[i]["kept"].append(out.timing.acceptance)
                    runs[i]["passes"].append(len(out.ids) / max(out.timing.forward_passes, 1))
            runs[i]["same"] &= texts["plain"] == texts["lookup"]
            print(f"repeat {r + 1} prompt {i} ({kind}, {runs[i]['n']} tokens): plain {runs[i]['plain'][-1]:.1f}, "
                  f"lookup {runs[i]['lookup'][-1]:.1f} tok/s, same ids: {texts['plain'] == texts['lookup']}",
                  flush=True)
    host = cpu_name()
    print(f"\n{host}; Gemma 3 270M, {args.activations}, one thread, greedy, {args.tokens} tokens, "
          f"draft_max {args.draft_max or 7}, medians of {args.repeat}")
    print("| prompt | kind | prompt tokens | plain tok/s | lookup tok/s | lookup / plain | drafts kept | "
          "tokens per pass | same ids |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {"grounded": [], "free": []}
    for i, (kind, _) in enumerate(prompts):
        rr = runs[i]
        plain, lookup = statistics.median(rr["plain"]), statistics.median(rr["lookup"])
        ratios[kind].append(lookup / plain)
        print(f"| {i} | {kind} | {rr['n']} | {plain:.1f} | {lookup:.1f} | {lookup / plain:.2f}x | "
              f"{statistics.median(rr['kept']):.0%} | {statistics.median(rr['passes']):.2f} | "
              f"{'yes' if rr['same'] else 'NO'} |")
    for kind, values in ratios.items():
        if values:
            print(f"{kind}: median lookup / plain {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
