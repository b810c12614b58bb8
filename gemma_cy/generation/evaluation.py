"""Perplexity over a text, and what a change costs against a baseline
(docs/generation.md#evaluation): llama.cpp's llama-perplexity, its convention
and its rows, so that the figures compare directly.

The text's ids (BOS first when the model adds one) are cut into chunks of
``ctx`` tokens; each chunk runs from an empty KV cache with BOS as its first
token (when the model adds one); only the second half of each chunk is
scored: position j (ctx/2 <= j <= ctx-2) predicts token j+1, so a chunk
scores ctx/2 - 1 tokens, each with at least ctx/2 tokens of context.

Against a baseline B (another file, the reference engine, the other
activation mode), per scored position, with p = softmax of the logits:

    KL(B || A) = sum_v p_B(v) (ln p_B(v) - ln p_A(v))     llama.cpp's "KLD"
    delta_p    = p_A(correct) - p_B(correct)
    same top   = argmax A == argmax B
    top-5 overlap = |top5(A) & top5(B)| / 5

Means come with their standard error, sqrt(var / (n - 1)); the perplexity's
is ppl * sqrt(var(nll) / (n - 1)), as llama-perplexity prints it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import ParameterError

ROWS_PER_BLOCK = 16  # logits rows held at once: 16 x 262,144 f32 is 16 MB


@dataclass
class Evaluation:
    """Every figure of one evaluation (NaN where there is no baseline)."""

    text_tokens: int
    ctx: int
    chunks: int
    scored: int
    perplexity: float
    perplexity_error: float
    baseline: str | None = None
    baseline_perplexity: float = math.nan
    baseline_perplexity_error: float = math.nan
    ln_ppl_ratio: float = math.nan
    ln_ppl_ratio_error: float = math.nan
    kl_mean: float = math.nan
    kl_mean_error: float = math.nan
    kl_median: float = math.nan
    kl_p99: float = math.nan
    kl_p999: float = math.nan
    kl_max: float = math.nan
    same_top1: float = math.nan
    same_top1_error: float = math.nan
    top5_overlap: float = math.nan
    mean_delta_p: float = math.nan
    mean_delta_p_error: float = math.nan
    rms_delta_p: float = math.nan
    interrupted: bool = False
    per_layer: list[dict] = field(default_factory=list)
    per_position_kl: list[float] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("per_position_kl")
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}

    def format(self) -> str:
        """llama-perplexity's figures as a small table."""
        def ppl(value: float, error: float) -> str:
            return f"{value:.4f}{pm(error, '.4f')}" if value < 1e6 else f"{value:.4e}{pm(error, '.4e')}"
        lines = [f"{self.text_tokens} tokens; {plural(self.chunks, 'chunk')} of {self.ctx}; "
                 f"{plural(self.scored, 'position')} scored"
                 + (" (interrupted: figures so far)" if self.interrupted else ""),
                 f"perplexity                 {ppl(self.perplexity, self.perplexity_error)}"]
        if self.baseline is None:
            return "\n".join(lines)
        lines += [f"baseline ({self.baseline}):",
                  f"  perplexity               {ppl(self.baseline_perplexity, self.baseline_perplexity_error)}",
                  f"  ln(PPL / PPL_base)       {self.ln_ppl_ratio:.6f}{pm(self.ln_ppl_ratio_error, '.6f')}",
                  f"  KL divergence, mean      {self.kl_mean:.6f}{pm(self.kl_mean_error, '.6f')}",
                  f"  KL median / 99% / 99.9%  {self.kl_median:.6f} / {self.kl_p99:.6f} / {self.kl_p999:.6f}",
                  f"  KL max                   {self.kl_max:.6f}",
                  f"  same top-1               {100 * self.same_top1:.2f}%{pm(100 * self.same_top1_error, '.2f', '%')}",
                  f"  top-5 overlap            {100 * self.top5_overlap:.2f}%",
                  f"  mean delta p             {100 * self.mean_delta_p:.4f}%{pm(100 * self.mean_delta_p_error, '.4f', '%')}",
                  f"  RMS delta p              {100 * self.rms_delta_p:.4f}%"]
        if self.per_layer:
            lines += [f"per op, each judged on the same inputs ({self.per_layer[0]['positions']} positions), "
                      f"largest relative rms error first:",
                      f"  {'layer':>5} {'op':<10} {'rel. rms':>10} {'max abs':>10}  tensors"]
            lines += [f"  {r['layer']:>5} {r['op']:<10} {r['relative_rms']:10.3e} {r['max_error']:10.3e}  "
                      f"{', '.join(r['tensors'])}" for r in self.per_layer]
        return "\n".join(lines)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def pm(error: float, spec: str, unit: str = "") -> str:
    """" +/- error" in ``spec``; without an error (one scored position has
    no spread to estimate it from) a note saying so, never "+/- nan"."""
    return " (no error estimate from one position)" if math.isnan(error) else f" +/- {error:{spec}}{unit}"


def check_ctx_value(ctx) -> int:
    """``ctx`` as a chunk length of any text: an even integer >= 4."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 4 or ctx % 2:
        raise ParameterError(f"ctx = {ctx!r}, must be an even integer >= 4")
    return ctx


def check_ctx(ctx, n_tokens: int, context_len: int) -> int:
    """``ctx`` as a valid chunk length for a text of ``n_tokens``."""
    check_ctx_value(ctx)
    if ctx > context_len:
        raise ParameterError(f"ctx = {ctx} is more than the model's context of {context_len} tokens")
    if n_tokens < 2 * ctx:
        raise ParameterError(f"the text has {n_tokens} tokens; evaluating with ctx {ctx} needs at least "
                             f"{2 * ctx} (two chunks)")
    return ctx


def chunk_ids(ids: Sequence[int], ctx: int, bos_id: int | None) -> list[list[int]]:
    """The text's chunks of ``ctx`` ids, each starting with BOS when ``bos_id`` is given."""
    out = []
    for start in range(0, len(ids) - ctx + 1, ctx):
        chunk = list(ids[start:start + ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(chunk)
    return out


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """(rows, vocab) f32 -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def _top5(logp: np.ndarray) -> np.ndarray:
    return np.argpartition(-logp, 5, axis=1)[:, :5]


def _mean_error(values: np.ndarray) -> tuple[float, float]:
    n = len(values)
    mean = float(np.mean(values)) if n else math.nan
    error = float(np.sqrt(np.var(values) / (n - 1))) if n > 1 else math.nan
    return mean, error


class _Tally:
    """Per scored position: nll of A and B, KL, same top-1, top-5 overlap, delta p."""

    def __init__(self):
        self.nll_a, self.nll_b, self.kl, self.same, self.top5, self.dp = [], [], [], [], [], []

    def add(self, logp_a: np.ndarray, logp_b: np.ndarray | None, targets: np.ndarray) -> None:
        rows = np.arange(len(targets))
        self.nll_a.append(-logp_a[rows, targets])
        if logp_b is None:
            return
        self.nll_b.append(-logp_b[rows, targets])
        p_b = np.exp(logp_b)
        self.kl.append(np.sum(p_b * (logp_b - logp_a), axis=1))
        self.same.append(np.argmax(logp_a, axis=1) == np.argmax(logp_b, axis=1))
        a5, b5 = _top5(logp_a), _top5(logp_b)
        self.top5.append(np.array([len(set(a) & set(b)) / 5 for a, b in zip(a5, b5)]))
        self.dp.append(np.exp(logp_a[rows, targets]) - p_b[rows, targets])

    def result(self, text_tokens: int, ctx: int, chunks: int, baseline: str | None,
               interrupted: bool) -> Evaluation:
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0)  # noqa: E731
        nll_a = cat(self.nll_a)
        if len(nll_a) == 0:
            raise KeyboardInterrupt  # nothing was computed: a plain interruption
        mean, err = _mean_error(nll_a)
        ev = Evaluation(text_tokens, ctx, chunks, len(nll_a), math.exp(mean), math.exp(mean) * err,
                        interrupted=interrupted)
        if baseline is None:
            return ev
        nll_b, kl = cat(self.nll_b), cat(self.kl)
        mean_b, err_b = _mean_error(nll_b)
        ev.baseline = baseline
        ev.baseline_perplexity, ev.baseline_perplexity_error = math.exp(mean_b), math.exp(mean_b) * err_b
        ev.ln_ppl_ratio, ev.ln_ppl_ratio_error = _mean_error(nll_a - nll_b)
        ev.kl_mean, ev.kl_mean_error = _mean_error(kl)
        ev.kl_median, ev.kl_p99, ev.kl_p999 = (float(np.percentile(kl, q)) for q in (50, 99, 99.9))
        ev.kl_max = float(kl.max())
        ev.same_top1, ev.same_top1_error = _mean_error(cat(self.same).astype(np.float64))
        ev.top5_overlap = float(np.mean(cat(self.top5)))
        dp = cat(self.dp)
        ev.mean_delta_p, ev.mean_delta_p_error = _mean_error(dp)
        ev.rms_delta_p = float(np.sqrt(np.mean(dp ** 2)))
        ev.per_position_kl = kl.tolist()
        return ev


def evaluate(engine, ids: Sequence[int], ctx: int, bos_id: int | None, baseline=None,
             baseline_name: str | None = None, max_chunks: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> Evaluation:
    """Perplexity of ``engine`` over ``ids`` in chunks of ``ctx`` (module
    docstring), and, with a ``baseline`` engine, the rows that compare them.
    Both engines need a KV cache of at least ``ctx`` positions. Ctrl-C
    returns the figures of the chunks done so far (``interrupted``)."""
    chunks = chunk_ids(ids, ctx, bos_id)
    if max_chunks is not None:
        if isinstance(max_chunks, bool) or not isinstance(max_chunks, int) or max_chunks < 1:
            raise ParameterError(f"chunks = {max_chunks!r}, must be an integer >= 1")
        chunks = chunks[:max_chunks]
    first = ctx // 2
    tally = _Tally()
    done = 0
    interrupted = False
    try:
        for chunk in chunks:
            targets = np.array(chunk[first + 1:], dtype=np.int64)  # (ctx/2 - 1,)
            engine.reset()
            states_a = engine.states(chunk)[first:ctx - 1]  # (ctx/2 - 1, dim)
            if baseline is not None:
                baseline.reset()
                states_b = baseline.states(chunk)[first:ctx - 1]
            for lo in range(0, len(targets), ROWS_PER_BLOCK):
                hi = min(lo + ROWS_PER_BLOCK, len(targets))
                logp_a = _log_softmax(engine.logits_of(states_a[lo:hi]))
                logp_b = None if baseline is None else _log_softmax(baseline.logits_of(states_b[lo:hi]))
                tally.add(logp_a, logp_b, targets[lo:hi])
            done += 1
            if progress is not None:
                progress(done, len(chunks))
    except KeyboardInterrupt:
        interrupted = True
        # a chunk cut short is dropped whole: its figures would mix with nothing
        for name in ("nll_a", "nll_b", "kl", "same", "top5", "dp"):
            parts = getattr(tally, name)
            total = sum(len(p) for p in parts)
            keep = done * (ctx // 2 - 1)
            while parts and total > keep:
                total -= len(parts.pop())
    return tally.result(len(ids), ctx, done, baseline_name if baseline is not None else None, interrupted)


def evaluate_model(model, text_or_ids, ctx: int = 512, chunks: int | None = None, against=None,
                   per_layer: bool = False, per_layer_positions: int = 64, progress=None) -> Evaluation:
    """``Model.evaluate``: perplexity of ``model`` over a text or ids, and,
    with ``against``, what it costs against a baseline (``baseline_of``);
    ``per_layer``: every op of every layer judged on the same inputs over the
    first ``per_layer_positions`` positions of the first chunk."""
    ids = model.tokenize(text_or_ids) if isinstance(text_or_ids, (str, bytes)) else model.prompt_ids(text_or_ids)
    check_ctx(ctx, len(ids), model.context_len)
    baseline, name = baseline_of(model, against, text_or_ids, ids, ctx)
    if per_layer and baseline is None:
        raise ParameterError("per_layer needs a baseline to judge against (against=...)")
    if per_layer and (isinstance(per_layer_positions, bool) or not isinstance(per_layer_positions, int)
                      or not 1 <= per_layer_positions <= ctx):
        raise ParameterError(f"per_layer_positions = {per_layer_positions!r}, must be in [1, ctx {ctx}]")
    model.cache.reset()
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    result = evaluate(model.engine, ids, ctx, bos, baseline, name, chunks, progress)
    if per_layer and not result.interrupted:
        first = list(ids[:per_layer_positions])
        if bos is not None:
            first[0] = bos
        result.per_layer = per_layer_table(model, against, first)
    model.cache.reset()
    return result


def _is_model(against) -> bool:
    return not isinstance(against, str) and hasattr(against, "engine") and hasattr(against, "weights")


def per_layer_table(model, against, ids: list[int]) -> list[dict]:
    """The per-op table: an engine observed, a reference engine judging on its inputs."""
    from gemma_cy_reference.model import ReferenceEngine
    from .local_error import per_op_table

    activations = getattr(model.engine, "activations", "f32")
    if _is_model(against):  # this model's ops on the baseline's inputs
        judge = ReferenceEngine(model.weights, len(ids), activations)
        return per_op_table(against.engine, judge, ids, model.weights, against.weights)
    judge_mode = against if against in ("f32", "q8") else activations  # the baseline's ops on this model's inputs
    judge = ReferenceEngine(model.weights, len(ids), judge_mode)
    return per_op_table(model.engine, judge, ids, model.weights)


def baseline_of(model, against, text_or_ids, ids, ctx):
    """(engine, name) of the baseline ``against`` names: another Model of
    the same vocabulary, "reference" (this file on the NumPy engine), "f32"
    or "q8" (this file in that activation mode); (None, None) for none."""
    from .engines import make_engine

    if against is None:
        return None, None
    if _is_model(against):
        if against.config.vocab_size != model.config.vocab_size:
            raise ParameterError(f"against: its vocabulary has {against.config.vocab_size} tokens, this "
                                 f"model's {model.config.vocab_size}: the two cannot be compared")
        if isinstance(text_or_ids, (str, bytes)) and against.tokenize(text_or_ids) != ids:
            raise ParameterError("against: the two models tokenize the text differently (another vocabulary)")
        if against.context_len < ctx:
            raise ParameterError(f"against: its context of {against.context_len} tokens is less than ctx {ctx}")
        against.cache.reset()
        return against.engine, against.weights.source or "the other model"
    activations = getattr(model.engine, "activations", "f32")
    if against == "reference":
        return make_engine("reference", model.weights, ctx, activations), "reference engine"
    if against in ("f32", "q8"):
        return make_engine(model.engine_name, model.weights, ctx, against), f"{against} activations"
    raise ParameterError(f"against = {against!r}: expected a Model, 'reference', 'f32' or 'q8'")
