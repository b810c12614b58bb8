"""scripts/bench.py's "cli" part: decode as a user gets it, through the
command line, beside llama-cpp-python's own generation loop.

Each run is a fresh process. gemma-cy's is exactly what a user runs,
``python -m gemma_cy --prompt PROMPT --n_dec N --temp 0 --terminate_on_eos 0
--json`` (and ``--activations q8``), and its figure is the ``decode_tok_s``
of its JSON: the tokens after the first over the time they took, so
everything the CLI does per token is in it (the logits' checks, sampling,
detokenizing, stop strings, the generate machine: docs/generation.md). Beside
it, llama-cpp-python on the same file: ``Llama.generate`` (its own per-token
loop: llama.cpp's sampler, greedy), timed from its first token to its N-th.
Compare each with the engine loop of the "warm" part of the same run.
"""
from __future__ import annotations

import json
import shlex
import sys

# llama-cpp-python's decode through its Python generation loop (argv: GGUF
# file, prompt, n_ctx, tokens): greedy, EOS not checked (as --terminate_on_eos 0).
LLAMA_DECODE = """
import json, sys, time
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_threads=1, n_threads_batch=1, n_ctx=int(sys.argv[3]), verbose=False)
n, stamps = int(sys.argv[4]), []
for _ in llm.generate(llm.tokenize(sys.argv[2].encode()), temp=0.0):
    stamps.append(time.perf_counter())
    if len(stamps) == n:
        break
print(json.dumps({"decode_tok_s": (n - 1) / (stamps[-1] - stamps[0])}))
"""


def cli_commands(original: str, quant: str, default: bool, prompt: str, n_ctx: int, n_dec: int,
                 peers_python: str | None) -> list[tuple[str, list[str], bool]]:
    """(label, command, ours) of the cli part: gemma-cy's CLI in both
    activation modes on the file as stored (the default model run without
    --weights, as a user would), then llama-cpp-python's loop if installed."""
    cli = [sys.executable, "-m", "gemma_cy", "--prompt", prompt, "--n_dec", str(n_dec), "--temp", "0",
           "--terminate_on_eos", "0", "--json"] + ([] if default else ["--weights", original])
    rows = [(f"gemma-cy CLI decode ({quant} as stored)", cli, True),
            (f"gemma-cy CLI decode, q8 activations ({quant} as stored)", cli + ["--activations", "q8"], True)]
    if peers_python:  # (labels unlike the start part's: a row's results are found by its label)
        rows.append((f"llama-cpp-python generate ({quant}, the same file)",
                     [peers_python, "-c", LLAMA_DECODE, original, prompt, str(n_ctx), str(n_dec)], False))
    return rows


def print_cli(rows: list, results: dict, prompt: str, n_dec: int) -> None:
    """The cli table: decode tok/s of each command (medians), then each of
    gemma-cy's over each peer's, and the commands."""
    done = [r for r in rows if r.label in results]
    print("\n### Decode through the command line: a fresh process per run, as a user runs it\n")
    print(f"Prompt {json.dumps(prompt)}, {n_dec} greedy tokens (end of text not checked), one thread.")
    for row in rows:
        if not row.runs:
            print(f"- {row.label}: failed: {row.errors[-1] if row.errors else 'no run'}")
    if not done:
        return
    print("\n| command | decode tok/s |\n|---|---|")
    for row in done:
        print(f"| {row.label} | {results[row.label]['decode_tok_s']:.1f} |")
    for ours in (r for r in done if r.ours):
        for peer in (r for r in done if not r.ours):
            ratio = results[ours.label]["decode_tok_s"] / results[peer.label]["decode_tok_s"]
            print(f"| {ours.label} / {peer.label} | {ratio:.2f}x |")
    print_commands(done, f"`python -c` importing llama_cpp, `Llama(model_path=FILE, n_threads=1, n_threads_batch=1, "
                         f"n_ctx=N)`, then `generate(tokenize(PROMPT), temp=0.0)` timed from its first token to its "
                         f"{n_dec}th")


def print_commands(rows: list, peer_text: str) -> None:
    """A line per row: gemma-cy's command as run, a peer's as ``peer_text``."""
    print()
    for row in rows:
        shown = ["python" if c == sys.executable else c for c in row.cmd]
        print(f"- {row.label}: `{shlex.join(shown)}`" if row.ours else f"- {row.label}: {peer_text}")
