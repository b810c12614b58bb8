"""Benchmark: speculative decoding against plain decoding (docs/benchmarks.md#speculative-decoding).

    python scripts/bench_speculative.py               # every prompt, 3 interleaved repetitions
    python scripts/bench_speculative.py --repeat 1    # a quick look
    python scripts/bench_speculative.py --draft_model # a draft model for an F16 copy of the model

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
Beside them, in the same run, llama-cpp-python (``--peers_python``: a
python with it installed; one thread) on the same file and prompts, plain
and with its ``LlamaPromptLookupDecoding`` (``Llama.generate`` on
gemma-cy's chat ids): decode tok/s from its first token to its last, and
whether its lookup ids are its plain ids. ``--draft_model``: the target is an F16 copy of the model's weights
(written once beside this script's cache) and the draft the stored file
in the q8 mode, a draft-model column beside lookup.
Printed: per prompt the medians and lookup over plain; per kind the median
of those ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_host import cpu_name

LICENSES = Path("/usr/share/common-licenses")
REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
F16_COPY = Path.home() / ".cache" / "gemma-cy" / "gemma-3-270m-f16-from-q4_k_m.gguf"


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


def f16_copy(src: str) -> str:
    """An F16 GGUF of ``src``'s weights (gemma_cy.commands.convert with
    matrices="f16"): a larger target of the same vocabulary for the draft
    model to draft for. Written once."""
    if not F16_COPY.exists():
        from gemma_cy.commands.convert import convert

        F16_COPY.parent.mkdir(parents=True, exist_ok=True)
        convert(src, F16_COPY, matrices="f16")
    return str(F16_COPY)


def llama_worker(args) -> None:
    """In the peers' python: llama-cpp-python plain and with
    LlamaPromptLookupDecoding (``Llama.generate``, greedy) on each prompt's
    ids, gemma-cy's chat ids, so both engines read the same prompt (JSON
    lines in, JSON lines out)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    common = dict(model_path=args.model, n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
    # (LlamaPromptLookupDecoding needs logits_all: without it a prompt longer than n_batch fails with a shape
    # error in 0.3.36; Llama.generate on gemma-cy's chat ids, since its create_chat_completion gave an empty
    # reply with Gemma 3's template here: docs/benchmarks.md#speculative-decoding)
    engines = {"plain": Llama(**common), "lookup": Llama(**common, logits_all=True, draft_model=LlamaPromptLookupDecoding(
        num_pred_tokens=args.draft_max or 10))}
    for line in sys.stdin:
        request = json.loads(line)
        ids, stops = request["ids"], set(request["stop_ids"])
        out = {}
        for mode, llm in engines.items():
            llm.reset()
            stamps, got = [], []
            for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                      reset=True):
                stamps.append(time.perf_counter())
                if token in stops or len(got) == args.tokens:
                    break
                got.append(int(token))
            out[mode] = {"tok_s": (len(got) - 1) / (stamps[len(got) - 1] - stamps[0]) if len(got) > 1 else 0.0,
                         "ids": got}
        print(json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="the first LIMIT prompts of each kind only")
    p.add_argument("--activations", choices=("f32", "q8"), default="f32")
    p.add_argument("--draft_max", type=int, default=None, help="ids drafted at most per block (default 7)")
    p.add_argument("--draft_model", action="store_true",
                   help="target an F16 copy of the model; add a column with the stored file (q8 mode) as draft")
    p.add_argument("--peers_python", default=str(PEERS_PYTHON), help="a python with llama-cpp-python")
    p.add_argument("--no_peers", action="store_true", help="gemma-cy alone")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        llama_worker(args)
        return
    prompts, per_kind = [], {}
    for kind, make in PROMPTS:
        if args.limit is None or per_kind.get(kind, 0) < args.limit:
            prompts.append((kind, make))
            per_kind[kind] = per_kind.get(kind, 0) + 1

    import gemma_cy
    from gemma_cy.formats.packaged import default_model_path

    stored = default_model_path()
    target = f16_copy(stored) if args.draft_model else stored
    model = gemma_cy.load(target, max_cache_len=4096, activations=args.activations)
    modes = {"plain": {}, "lookup": dict(speculative="lookup", draft_max=args.draft_max)}
    if args.draft_model:
        modes["draft"] = dict(draft=gemma_cy.load(stored, max_cache_len=4096, activations="q8"),
                              draft_max=args.draft_max)
    peer = None
    if not args.no_peers and not args.draft_model and Path(args.peers_python).exists():
        peer = subprocess.Popen([args.peers_python, __file__, "--worker", "--model", stored, "--tokens",
                                 str(args.tokens)] + (["--draft_max", str(args.draft_max)] if args.draft_max else []),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    elif not args.no_peers and not args.draft_model:
        print(f"(llama.cpp skipped: no {args.peers_python}; make bench-peers creates .venv-peers)")
    runs = {i: {**{m: [] for m in modes}, "same": True, "n": 0, "kept": [], "passes": [], "peer_plain": [],
                "peer_lookup": [], "peer_same": True} for i in range(len(prompts))}
    for r in range(args.repeat):
        for i, (kind, make) in enumerate(prompts):
            messages = [{"role": "user", "content": make()}]
            rr = runs[i]
            rr["n"] = len(model.chat_ids(messages))
            texts = {}
            for mode, kw in modes.items():
                out = model.chat_complete(messages, max_tokens=args.tokens, temperature=0, **kw)
                rr[mode].append(out.timing.decode_tok_s)
                texts[mode] = out.ids
                if mode == "lookup":
                    rr["kept"].append(out.timing.acceptance)
                    rr["passes"].append(len(out.ids) / max(out.timing.forward_passes, 1))
            rr["same"] &= all(t == texts["plain"] for t in texts.values())
            line = ", ".join(f"{m} {rr[m][-1]:.1f}" for m in modes)
            if peer is not None:
                peer.stdin.write(json.dumps({"ids": model.chat_ids(messages), "stop_ids": sorted(model.stop_ids)})
                                 + "\n")
                peer.stdin.flush()
                got = json.loads(peer.stdout.readline())
                rr["peer_plain"].append(got["plain"]["tok_s"])
                rr["peer_lookup"].append(got["lookup"]["tok_s"])
                rr["peer_same"] &= got["plain"]["ids"] == got["lookup"]["ids"]
                line += f"; llama.cpp plain {got['plain']['tok_s']:.1f}, lookup {got['lookup']['tok_s']:.1f}"
            print(f"repeat {r + 1} prompt {i} ({kind}, {rr['n']} tokens): {line} tok/s, same ids: "
                  f"{all(t == texts['plain'] for t in texts.values())}", flush=True)
    if peer is not None:
        peer.stdin.close()
        peer.wait()
    host = cpu_name()
    what = "an F16 copy of Gemma 3 270M (draft: the stored Q4_K_M, q8 mode)" if args.draft_model else "Gemma 3 270M"
    print(f"\n{host}; {what}, {args.activations}, one thread, greedy, {args.tokens} tokens, "
          f"draft_max {args.draft_max or 7}, medians of {args.repeat}")
    extra = [m for m in modes if m != "plain"]
    cols = ["prompt", "kind", "prompt tokens", "plain tok/s"] + [f"{m} tok/s" for m in extra] + \
        [f"{m} / plain" for m in extra] + ["drafts kept", "tokens per pass", "same ids"]
    if peer is not None:
        cols += ["llama.cpp plain", "llama.cpp lookup", "its lookup / plain", "its ids equal"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    ratios = {(kind, m): [] for kind in ("grounded", "free") for m in extra + (["peer"] if peer else [])}
    for i, (kind, _) in enumerate(prompts):
        rr = runs[i]
        plain = statistics.median(rr["plain"])
        cells = [str(i), kind, str(rr["n"]), f"{plain:.1f}"]
        cells += [f"{statistics.median(rr[m]):.1f}" for m in extra]
        for m in extra:
            ratios[kind, m].append(statistics.median(rr[m]) / plain)
            cells.append(f"{ratios[kind, m][-1]:.2f}x")
        cells += [f"{statistics.median(rr['kept']):.0%}", f"{statistics.median(rr['passes']):.2f}",
                  "yes" if rr["same"] else "NO"]
        if peer is not None:
            pp, pl = statistics.median(rr["peer_plain"]), statistics.median(rr["peer_lookup"])
            ratios[kind, "peer"].append(pl / pp)
            cells += [f"{pp:.1f}", f"{pl:.1f}", f"{pl / pp:.2f}x", "yes" if rr["peer_same"] else "NO"]
        print("| " + " | ".join(cells) + " |")
    for (kind, m), values in ratios.items():
        if values:
            name = "llama.cpp lookup" if m == "peer" else m
            print(f"{kind}: median {name} / plain {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
