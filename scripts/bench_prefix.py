"""Benchmark: what shared prompts cost (docs/benchmarks.md#batched-decode).

    python scripts/bench_prefix.py                 # 512-token prompt, n = 4, 5 repetitions
    python scripts/bench_prefix.py --repeat 1      # a quick look

Gemma 3 270M (the default model, as stored), one thread, the f32 mode, a
``--prompt`` (512) token prompt of the GPL-3 text, one greedy token per
completion, so the time is the prefill's. Per repetition, interleaved:

- ``one``: ``complete(prompt)`` on a fresh model;
- ``n``: ``complete(prompt, n=N)`` on a fresh model of N slots (the prompt
  prefilled once, the other N - 1 samples copy its cache);
- ``extend``: on the model of ``one``, ``complete(prompt + its token + 16
  more ids)``: only the 18 new positions run (docs/generation.md#prefix-reuse).

Printed: the medians, ``n`` over ``one`` (1.0 is one prefill; N would be
N prefills) and ``extend`` over ``one``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

TEXT = Path("/usr/share/common-licenses/GPL-3")


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    import gemma_cy

    path = None  # the default model
    probe = gemma_cy.load(path, max_cache_len=args.prompt + 64)
    ids = probe.tokenize(TEXT.read_text(encoding="utf-8"))[:args.prompt]
    extra = probe.tokenize(" and the next sixteen words of some other text that follows here now", add_bos=False)
    kw = dict(temperature=0, max_tokens=1, terminate_on_eos=False)
    times = {"one": [], "n": [], "extend": []}
    for _ in range(args.repeat):
        one = gemma_cy.load(path, max_cache_len=args.prompt + 64)
        t, out = timed(lambda: one.complete(ids, **kw))
        times["one"].append(t)
        longer = ids + out.ids + (extra * 2)[:16]
        t, ext = timed(lambda: one.complete(longer, **kw))
        assert ext.timing.reused_tokens == len(ids), ext.timing
        times["extend"].append(t)
        many = gemma_cy.load(path, max_cache_len=args.prompt + 64, max_sequences=args.n)
        t, _ = timed(lambda: many.complete(ids, n=args.n, **kw))
        times["n"].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"prompt {args.prompt} tokens, medians of {args.repeat}:")
    print(f"  one completion     {med['one'] * 1e3:8.1f} ms")
    print(f"  n = {args.n} completions {med['n'] * 1e3:8.1f} ms  ({med['n'] / med['one']:.2f}x one)")
    print(f"  extend by 17 ids   {med['extend'] * 1e3:8.1f} ms  ({med['extend'] / med['one']:.3f}x one)")


if __name__ == "__main__":
    main()
