"""Benchmark: a list of prompts through the Python API, batched by default (docs/benchmarks.md#a-list-of-prompts).

    python scripts/bench_list.py                  # 8 prompts, 64 tokens each, medians of 3
    python scripts/bench_list.py --repeat 1       # a quick look

One process, one thread, the default model (Gemma 3 270M) loaded once with
``gemma_cy.load()`` and no keyword. The same 8 prompts (lines of the GPL-3
text, or fixed sentences where it is absent) run two ways, alternating in
each repetition: ``model.complete(prompts)`` (the list: as many at once as
the model's default slots allow) and ``[model.complete(p) for p in
prompts]`` (one after another). Greedy, ``--tokens`` each, stop at EOS off,
so both generate the same number of tokens, and the ids are checked equal
(batch invariance). Reported: seconds per generated token of each way
(whole calls: prefill included), their ratio, and the model's slots.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench_host import cpu_name

TEXT = Path("/usr/share/common-licenses/GPL-3")
FALLBACK = ["The capital of France is", "Once upon a time, in a small village,", "The three laws of motion are",
            "A recipe for bread needs", "In 1969 the first people to walk on the Moon", "Photosynthesis turns",
            "The best way to learn a language is", "Rivers flow to the sea because"]


def prompts_of(n: int) -> list[str]:
    if TEXT.exists():
        lines = [line.strip() for line in TEXT.read_text(encoding="utf-8").splitlines() if len(line.strip()) > 40]
        return [lines[11 * k] for k in range(n)]
    return (FALLBACK * (n // len(FALLBACK) + 1))[:n]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    import gemma_cy

    model = gemma_cy.load()
    prompts = prompts_of(args.prompts)
    settings = dict(max_tokens=args.tokens, temperature=0, terminate_on_eos=False)
    model.complete(prompts[0], max_tokens=4, temperature=0)  # warm: first touches of the weights
    listed, one_by_one = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        together = model.complete(prompts, **settings)
        listed.append((time.perf_counter() - start) / sum(len(c.ids) for c in together))
        start = time.perf_counter()
        alone = [model.complete(prompt, **settings) for prompt in prompts]
        one_by_one.append((time.perf_counter() - start) / sum(len(c.ids) for c in alone))
        assert [c.ids for c in together] == [c.ids for c in alone], "a batched sequence differs from it alone"
    a, b = statistics.median(listed), statistics.median(one_by_one)
    print(f"host: {cpu_name()}; Gemma 3 270M (its package's file), gemma_cy.load() with no keyword: "
          f"{model.max_sequences} slots; {args.prompts} prompts x {args.tokens} greedy tokens, medians of "
          f"{args.repeat}")
    print("| way | ms per generated token |")
    print("|---|---|")
    print(f"| `model.complete(prompts)` | {a * 1e3:.2f} |")
    print(f"| `[model.complete(p) for p in prompts]` | {b * 1e3:.2f} |")
    print(f"the list runs {b / a:.2f}x faster per token; every sequence's ids equal its own run alone")


if __name__ == "__main__":
    main()
