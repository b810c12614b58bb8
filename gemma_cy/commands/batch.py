"""`gemma-cy batch IN.jsonl -o OUT.jsonl`: many requests, one file, decoded together
(docs/generation.md#the-batch-command).

One request per line: ``{"prompt": "..."}``, ``{"prompt_ids": [...]}`` or
``{"messages": [...]}`` (the model's chat template), plus any of the
sampling keywords of ``Model.generate`` and an optional ``"id"`` copied to
the result. One result per line, in the order of the input, each holding
``index`` (the input line's, from 0), the text, ids, stop reason and
timing; a line that cannot be run (bad JSON, an unknown keyword, a prompt
too long...) gets ``{"index": i, "error": "..."}`` in its place and the
others still run. Results are written as soon as every line before them
is, so a run cut short (Ctrl-C) leaves every finished result in the file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import GemmaCyError, ParameterError
from ..generation.params import GenerationParams
from ..generation.engines import ACTIVATION_MODES, DEFAULT_ENGINE, ENGINES, check_max_sequences
from .flags import EXIT_ERROR, EXIT_INTERRUPTED, OneLineParser, UsageError, add_model_flags, int_flag, read_utf8

# Request keys besides the settings (GenerationParams.from_json takes the rest).
PROMPT_KEYS = ("prompt", "prompt_ids", "messages")
MAX_LINE_BYTES = 16 << 20


def parse_request(model, line: str) -> tuple[list[int], GenerationParams, Any]:
    """(prompt ids, settings, id) of one input line; GemmaCyError (one line) if it cannot run."""
    if len(line) > MAX_LINE_BYTES:
        raise ParameterError(f"line of {len(line)} characters: at most {MAX_LINE_BYTES}")
    try:
        request = json.loads(line)
    except ValueError as e:
        raise ParameterError(f"not JSON: {e}") from None
    if not isinstance(request, dict):
        raise ParameterError(f"expected a JSON object, got {type(request).__name__}")
    given = [k for k in PROMPT_KEYS if k in request]
    if len(given) != 1:
        raise ParameterError(f"give exactly one of {', '.join(PROMPT_KEYS)} (got {', '.join(given) or 'none'})")
    params = GenerationParams.from_json({k: v for k, v in request.items() if k not in PROMPT_KEYS and k != "id"})
    if given[0] == "messages":
        ids = model.chat_ids(request["messages"])
    elif given[0] == "prompt_ids":
        if not isinstance(request["prompt_ids"], list):  # (a string would be read as text)
            raise ParameterError("prompt_ids must be a list of integers")
        ids = model.prompt_ids(request["prompt_ids"])  # its ids checked there
    else:
        if not isinstance(request["prompt"], str):
            raise ParameterError("prompt must be a string")
        ids = model.prompt_ids(request["prompt"])
    model.check(ids, params)
    return ids, params, request.get("id")


def result_record(index: int, request_id, generation) -> dict:
    t = generation.timing
    out = {"index": index, "text": generation.text, "ids": list(generation.generated_ids),
           "stop_reason": generation.stop_reason, "stop_string": generation.stop_string,
           "prompt_tokens": len(generation.prompt_ids), "completion_tokens": len(generation.generated_ids),
           "cached_tokens": t.reused_tokens, "prefill_tok_s": t.prefill_tok_s, "decode_tok_s": t.decode_tok_s}
    if generation.top_logprobs is not None:  # asked for: each id's, and the likeliest alternatives'
        out["logprobs"] = [{"id": lp.token_id, "logprob": lp.logprob, "top": [list(pair) for pair in lp.top]}
                           for lp in generation.logprobs]
    return out if request_id is None else {"id": request_id, **out}


class OrderedWriter:
    """Writes record i once records 0 .. i-1 are written; ``flush_rest``
    writes whatever finished beyond a gap (a run cut short)."""

    def __init__(self, out, n: int):
        self.out, self.n = out, n
        self.ready: dict[int, dict] = {}
        self.next = 0
        self.written = 0

    def put(self, index: int, record: dict) -> None:
        self.ready[index] = record
        while self.next in self.ready:
            self._write(self.ready.pop(self.next))
            self.next += 1
        self.out.flush()

    def flush_rest(self) -> None:
        for index in sorted(self.ready):
            self._write(self.ready.pop(index))
        self.out.flush()

    def _write(self, record: dict) -> None:
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.written += 1


def run_batch(model, lines: list[str], out, progress=None) -> tuple[int, int]:
    """Run every request line on ``model``, writing results to ``out`` in
    order; returns (errors, results written). ``progress(done, total)``
    follows the requests."""
    writer = OrderedWriter(out, len(lines))
    good: list[tuple[int, list[int], GenerationParams, Any]] = []
    errors = 0
    done = [0]
    for i, line in enumerate(lines):
        try:
            ids, params, request_id = parse_request(model, line)
        except GemmaCyError as e:
            writer.put(i, {"index": i, "error": str(e)})
            errors += 1
            continue
        good.append((i, ids, params, request_id))
    if progress is not None:
        progress(len(lines) - len(good), len(lines))
    if not good:
        return errors, writer.written

    def finished(k: int) -> None:
        index, _, _, request_id = good[k]
        writer.put(index, result_record(index, request_id, run.generations[k]))
        done[0] += 1
        if progress is not None:
            progress(len(lines) - len(good) + done[0], len(lines))

    run = model.run_many([ids for _, ids, _, _ in good], [params for _, _, params, _ in good], on_finish=finished)
    try:
        for _ in run:
            pass
    except KeyboardInterrupt:
        writer.flush_rest()
        missing = len(lines) - writer.written
        sys.stderr.write(f"gemma-cy batch: interrupted: {writer.written} of {len(lines)} results written, "
                         f"{missing} missing\n")
        raise
    return errors, writer.written


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy batch",
                      description="Run a JSONL file of requests (one per line: prompt, prompt_ids or messages, "
                                  "plus sampling keywords), several sequences decoded together; one result "
                                  "per line, in input order.")
    p.add_argument("input", metavar="IN.jsonl", help="requests, one JSON object per line ('-': stdin)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="results, one per line ('-': stdout)")
    add_model_flags(p)
    p.add_argument("--max_sequences", type=int_flag, default=8,
                   help="sequences decoded together, each with its own KV cache (default 8)")
    p.add_argument("--max_cache_len", "--ctx", dest="max_cache_len", type=int_flag, default=2048,
                   help="context of each sequence (default 2048)")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="compute engine")
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32", help="activation mode")
    return p


def run(args) -> int:
    """`gemma-cy batch`: exit 0 when every line ran, 1 when some were errors
    (their records say why), 130 on Ctrl-C (what finished is written)."""
    from .. import api

    check_max_sequences(args.max_sequences)
    if args.max_cache_len <= 0:
        raise UsageError(f"--max_cache_len = {args.max_cache_len}, must be > 0")
    if args.input != "-" and os.path.abspath(args.input) == os.path.abspath(args.output):
        raise UsageError("batch: the output must not be the input file")
    text = read_utf8(args.input, "batch: input")
    lines = [line for line in text.splitlines() if line.strip()]
    if not args.weights:
        from ..formats.packaged import default_model_path
        args.weights = default_model_path()
    model = api.load(args.weights, args.tok_path, engine=args.engine, max_cache_len=args.max_cache_len,
                     activations=args.activations, max_sequences=args.max_sequences)
    sys.stderr.write(f"{len(lines)} requests; {args.max_sequences} sequences at once, each with a context of "
                     f"{model.context_len} tokens: KV caches of at most "
                     f"{kv_cache_mib(model) * args.max_sequences:.0f} MiB\n")
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    except OSError as e:
        raise ParameterError(f"{args.output}: cannot write ({e.strerror})") from None
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(lines), unit="request", file=sys.stderr, desc="batch")

    def progress(done, total):
        if bar is not None:
            bar.update(done - bar.n)
    try:
        errors, written = run_batch(model, lines, out, progress)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if bar is not None:
            bar.close()
        if out is not sys.stdout:
            out.close()
    if errors:
        sys.stderr.write(f"gemma-cy batch: {errors} of {len(lines)} requests could not run (their records say why)\n")
        return EXIT_ERROR
    return 0


def kv_cache_mib(model) -> float:
    """The most one sequence's keys and values take: every layer's rows (a
    sliding-window layer's ring, in the fast engine) of n_kv_heads * head_dim
    f32, keys and values."""
    engine = model.engine
    if hasattr(engine, "model"):  # the fast engine: its layers' rows, rings included
        rows = sum(keys.shape[0] for keys in engine.model.key_cache)
    else:
        rows = model.config.n_layers * model.context_len
    return rows * model.config.kv_dim * 4 * 2 / 2**20
