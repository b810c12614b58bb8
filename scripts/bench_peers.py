"""One engine's run of scripts/bench.py's figure set for a real model, in its own process.

    .venv-peers/bin/python scripts/bench_peers.py --engine llama.cpp --model Q.gguf --prompts P.json
    .venv-peers/bin/python scripts/bench_peers.py --engine transformers --model Q4_K_M.gguf --prompts P.json

``measure`` is the protocol every engine runs, gemma-cy's included
(scripts/bench.py imports it); the peers here run under .venv-peers
(scripts/peers_setup.sh), which gemma-cy itself never imports:

  llama.cpp     llama-cpp-python's ``Llama`` with one thread for decode and
                batch, n_ctx from ``context_size`` (1024 unless the longest
                prompt and the decoded tokens need more), n_batch 512;
                ``Llama.eval`` feeds tokens (a prompt in batches of 512) and
                the argmax is taken over the raw logits of the last position
                (``llama_get_logits_ith``), so no sampler runs.
  transformers  ``AutoModelForCausalLM`` from the GGUF (dequantized to f32),
                torch with one thread, under ``torch.inference_mode``: one
                forward over the prompt, then one token at a time on the KV
                cache (``cache=``, transformers 5's ``past_key_values``),
                logits of the last position only.

Prints one JSON line with the fields ``measure`` returns.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Callable

import numpy as np

MIN_CTX = 1024  # KV cache positions of every engine at least (what every run had before 4,096-token prompts)
N_AGREE = 16  # greedy ids kept after each decode prompt, to check that engines run the same model


def context_size(prompts: dict, n_dec: int) -> int:
    """KV cache positions every engine is given: the longest prompt plus
    ``n_dec`` decoded tokens and one spare, rounded up to a multiple of 256
    (llama.cpp pads its context so), and at least ``MIN_CTX``."""
    longest = max(len(ids) for ids in [prompts["short"], prompts["ttft"], *prompts["contexts"].values()])
    return max(MIN_CTX, -(-(longest + n_dec + 1) // 256) * 256)


def measure(load: Callable[[int], object], prompts: dict, n_dec: int) -> dict:
    """Load an engine and run the figure set on it, each figure once.

    ``load(n_ctx)`` returns an engine with room for ``n_ctx`` positions
    (``context_size``) and ``reset()``, ``prefill(ids) -> argmax id`` and
    ``decode(id) -> argmax id``. ``prompts`` holds token ids: "short" (8
    tokens), "ttft" (128) and "contexts" ({"128": ids, "512": ids, "4096":
    ids, ...}). TTFT is the first call after the load (cold: as a user's first
    prompt sees it): the 128-token prefill and its argmax, key
    ``ttft_128_ms``. Then, after a reset each, the short prompt and every
    context in turn: the prefill, timed for a context (``prefill_N_tok_s``:
    warm), then ``n_dec`` greedy decode steps on the state it left
    (``decode_after_short_tok_s``, ``decode_after_N_tok_s``), whose first
    ``N_AGREE`` ids are kept (``greedy_ids_after_short``, ``..._after_N``).
    One prefill per context serves both figures, so a 4,096-token context
    costs one long prefill, not two.
    """
    start = time.perf_counter()
    engine = load(context_size(prompts, n_dec))
    figures = {"load_s": time.perf_counter() - start}
    start = time.perf_counter()
    engine.prefill(prompts["ttft"])
    figures[f"ttft_{len(prompts['ttft'])}_ms"] = 1e3 * (time.perf_counter() - start)
    for name, ids in [("short", prompts["short"]), *prompts["contexts"].items()]:
        engine.reset()
        start = time.perf_counter()
        token = engine.prefill(ids)
        if name != "short":
            figures[f"prefill_{name}_tok_s"] = len(ids) / (time.perf_counter() - start)
        greedy = [token]
        start = time.perf_counter()
        for _ in range(n_dec):
            token = engine.decode(token)
            greedy.append(token)
        figures[f"decode_after_{name}_tok_s"] = n_dec / (time.perf_counter() - start)
        figures[f"greedy_ids_after_{name}"] = greedy[:N_AGREE]
    figures["peak_rss_mb"] = peak_rss_mb()
    return figures


def peak_rss_mb() -> float:
    """This process's peak resident set, MB. On Linux VmHWM, the peak of this
    process image: ru_maxrss starts at the parent's peak when the child was
    started by vfork + exec (as subprocess does), so it would report the
    benchmark driver's own peak whenever that is larger."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB, but bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class LlamaCpp:
    """llama-cpp-python on a GGUF file, one thread."""

    def __init__(self, path: str, n_ctx: int) -> None:
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, n_threads=1, n_threads_batch=1, n_ctx=n_ctx,
                                   n_batch=512, verbose=False)
        self.get_logits = llama_cpp.llama_get_logits_ith
        self.n_vocab = self.llm.n_vocab()

    def reset(self) -> None:
        self.llm.reset()  # the next eval drops the KV cache from position 0

    def prefill(self, ids: list[int]) -> int:
        self.llm.eval(ids)
        logits = np.ctypeslib.as_array(self.get_logits(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def decode(self, token: int) -> int:
        return self.prefill([token])


class Transformers:
    """HF transformers on a GGUF file dequantized to f32, one torch thread
    (its KV cache grows as needed: ``n_ctx`` is not used)."""

    def __init__(self, path: str, n_ctx: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(1)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                          dtype=torch.float32).eval()
        self.cache = None

    def reset(self) -> None:
        self.cache = None

    def prefill(self, ids: list[int]) -> int:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([ids]), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.cache
        return int(out.logits[0, -1].argmax())

    def decode(self, token: int) -> int:
        return self.prefill([token])


PEERS = {"llama.cpp": (LlamaCpp, "llama_cpp"), "transformers": (Transformers, "transformers")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=sorted(PEERS), required=True)
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--prompts", required=True,
                   help='JSON: token ids {"short": ids, "ttft": ids, "contexts": {"128": ids, ...}}')
    p.add_argument("--n_dec", type=int, default=128)
    args = p.parse_args()
    engine_class, module = PEERS[args.engine]
    try:
        __import__(module)
    except ImportError:
        print(f"{module} is not installed in {sys.prefix} (make bench-peers installs it)", file=sys.stderr)
        return 3
    with open(args.prompts) as f:
        prompts = json.load(f)
    print(json.dumps(measure(lambda n_ctx: engine_class(args.model, n_ctx), prompts, args.n_dec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
