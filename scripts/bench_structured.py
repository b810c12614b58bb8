"""Benchmark: what a structured-output constraint costs a decode (docs/benchmarks.md#structured-output).

    python scripts/bench_structured.py                # 5 interleaved repetitions
    python scripts/bench_structured.py --repeat 1     # a quick look

Gemma 3 270M (the default model, as stored), one thread, the f32 mode,
greedy, the same chat prompt per repetition, interleaved:

- ``free``: no constraint, ``--tokens`` (128) tokens, end-of-sequence off;
- ``schema``: a JSON Schema (a list of up to 16 records of a name, an age
  and a city), up to ``--tokens`` tokens.

Per run: decode tok/s (generated tokens over decode time; ids the grammar
forced run as blocks, so they count as tokens too), the time spent on the
constraint per generated token (the llguidance mask, applying it, feeding
the chosen id back), and the forced ids. Printed: medians, and schema
over free decode tok/s.
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench_host import cpu_name

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"], "properties": {
    "people": {"type": "array", "minItems": 16, "maxItems": 16, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
        "properties": {"name": {"type": "string", "maxLength": 16},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "city": {"type": "string", "maxLength": 16}}}}}}
MESSAGES = [{"role": "user", "content": "List sixteen people with their name, age and city."}]


def timed_constraint():
    """Constraint with its mask/consume/forced_ids timed (seconds, in ``spent``)."""
    from gemma_cy.generation import constraint

    spent = [0.0]
    for name in ("mask", "consume", "forced_ids"):
        original = getattr(constraint.Constraint, name)

        def wrapper(self, *a, _original=original):
            start = time.perf_counter()
            try:
                return _original(self, *a)
            finally:
                spent[0] += time.perf_counter() - start
        setattr(constraint.Constraint, name, wrapper)
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    import gemma_cy

    spent = timed_constraint()
    model = gemma_cy.load(max_cache_len=512)
    model.chat_complete(MESSAGES, json_schema=SCHEMA, max_tokens=4, temperature=0)  # the vocabulary table, once
    rows = {"free": [], "schema": []}
    for r in range(args.repeat):
        for name in rows:
            kw = dict(json_schema=SCHEMA) if name == "schema" else dict(terminate_on_eos=False)
            spent[0] = 0.0
            gen = model.chat(MESSAGES, max_tokens=args.tokens, temperature=0, **kw)
            gen.complete()
            n = len(gen.generated_ids)
            forced = gen.constraint.forced if gen.constraint is not None else 0
            rows[name].append((gen.timing.decode_tok_s, spent[0] / max(n, 1) * 1e6, forced, n, gen.stop_reason))
            print(f"repeat {r + 1} {name:6} {gen.timing.decode_tok_s:6.1f} tok/s, constraint "
                  f"{spent[0] / max(n, 1) * 1e6:6.1f} us/token, {forced} of {n} ids forced ({gen.stop_reason})",
                  flush=True)
    host = cpu_name()
    print(f"\n{host}; Gemma 3 270M, one thread, greedy, medians of {args.repeat}")
    print("| run | decode tok/s | constraint us/token | forced ids |")
    print("|---|---|---|---|")
    for name, runs in rows.items():
        print(f"| {name} | {statistics.median(x[0] for x in runs):.1f} | {statistics.median(x[1] for x in runs):.1f} "
              f"| {statistics.median(x[2] for x in runs):.0f} of {statistics.median(x[3] for x in runs):.0f} |")
    ratio = statistics.median(x[0] for x in rows["schema"]) / statistics.median(x[0] for x in rows["free"])
    print(f"schema / free decode: {ratio:.2f}x")


if __name__ == "__main__":
    main()
