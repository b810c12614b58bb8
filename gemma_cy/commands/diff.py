"""Reference-vs-fast diffing: per-layer errors over a prompt, then greedy
decoding on both engines until the first divergent token.

Both engines share one observer protocol, observer(layer, op, pos, value), so
the diff records what each engine reports and compares like with like.

Two errors per (layer, op):
- **local** (judged against docs/numerics.md#tolerances): the other engine's output of the op
  against the reference's layer function applied to the other engine's *own*
  input of that op (its attn_norm output, its cached keys and values...). The
  two then differ only by accumulation order inside that one layer, which is
  what the per-layer tolerance bounds; a wrong kernel shows up at its layer.
- **drift** (shown, not judged): both engines free-running, so errors of
  earlier layers carry forward. In an ill-conditioned model (the tiny seed
  fixture: unscaled N(0,1) weights, MLP outputs ~2e4 that the residual adds
  cancel to ~1) drift in the residual stream exceeds atol + rtol*|x| for any
  two f32 engines, even the reference against itself in float64; the greedy
  tokens are the end-to-end judge there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..generation.engines import make_engine
from ..generation.local_error import Recorder, teacher_forced
from ..model.logits import argmax, top2_margin
from ..model.tolerance import errors, tolerance_for, within
from ..model.weights import Weights


@dataclass
class LayerRow:
    """Worst local error of one (layer, op) over the prompt positions, and
    the worst free-running drift."""

    layer: int
    op: str
    max_abs: float
    max_rel: float
    ok: bool
    positions: int
    drift_abs: float = 0.0


@dataclass
class Divergence:
    """First greedy step where the engines picked different tokens."""

    step: int
    reference_id: int
    other_id: int
    reference_margin: float  # reference's top-1 minus top-2 logit at that step


@dataclass
class DiffReport:
    rows: list[LayerRow]
    n_steps: int
    reference_ids: list[int] = field(default_factory=list)
    other_ids: list[int] = field(default_factory=list)
    divergence: Divergence | None = None

    @property
    def layers_ok(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def ok(self) -> bool:
        return self.layers_ok and self.divergence is None

    def format(self) -> str:
        """The report as a text table."""
        lines = [f"{'layer':>5}  {'op':<12} {'max_abs':>10} {'max_rel':>10}  {'within tol':<10} "
                 f"{'drift_abs':>10}"]
        for r in self.rows:
            lines.append(f"{r.layer:>5}  {r.op:<12} {r.max_abs:10.3e} {r.max_rel:10.3e}  "
                         f"{'yes' if r.ok else 'NO':<10} {r.drift_abs:10.3e}")
        if self.divergence is None:
            lines.append(f"greedy: {self.n_steps}/{self.n_steps} tokens identical")
        else:
            d = self.divergence
            lines.append(f"greedy: first divergence at step {d.step}: reference {d.reference_id}, "
                         f"other {d.other_id}; reference top-1/top-2 margin {d.reference_margin:.4g}")
        return "\n".join(lines)


def compare_layers(reference: dict, other: dict, order: list[tuple[int, str]], config=None) -> list[LayerRow]:
    """Per (layer, op) in ``order``: worst error over the positions both
    dicts ((layer, op, pos) -> value) hold; ``reference`` is the expected side.
    ``config``: the model's ModelConfig (tolerance_for's bound of its ops)."""
    rows = []
    for layer, op in order:
        atol, rtol = tolerance_for(op, config)
        keys = [k for k in reference if k[0] == layer and k[1] == op and k in other]
        if not keys:
            continue
        worst_abs = worst_rel = 0.0
        ok = True
        for key in keys:
            a, b = other[key], reference[key]
            if a.shape != b.shape:
                ok, worst_abs, worst_rel = False, float("inf"), float("inf")
                continue
            max_abs, max_rel = errors(a, b, atol)
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            ok = ok and within(a, b, atol, rtol)
        rows.append(LayerRow(layer, op, worst_abs, worst_rel, ok, len(keys)))
    return rows


def greedy_pair(reference, other, prompt_ids: Sequence[int], n_steps: int):
    """Greedy-decode both engines side by side; stop at the first divergence."""
    reference.reset()
    other.reset()
    ref_logits = reference.prefill(prompt_ids)
    oth_logits = other.prefill(prompt_ids)
    ref_ids: list[int] = []
    oth_ids: list[int] = []
    for step in range(n_steps):
        r, o = argmax(ref_logits), argmax(oth_logits)
        ref_ids.append(r)
        oth_ids.append(o)
        if r != o:
            return ref_ids, oth_ids, Divergence(step, r, o, top2_margin(ref_logits))
        if step + 1 < n_steps:
            ref_logits = reference.decode(r)
            oth_logits = other.decode(o)
    return ref_ids, oth_ids, None


def diff(reference, other, prompt_ids: Sequence[int], n_steps: int = 64) -> DiffReport:
    """Compare engine ``other`` against ``reference`` (a ReferenceEngine) on
    one prompt: every observed op over the prompt (local error judged, drift
    shown), then ``n_steps`` greedy tokens."""
    n_steps = max(0, min(n_steps, reference.cache_len - len(prompt_ids)))
    ref_rec, oth_rec = Recorder(), Recorder()
    reference.reset()
    other.reset()
    reference.prefill(prompt_ids, ref_rec)
    other.prefill(prompt_ids, oth_rec)
    c = reference.config
    rows = compare_layers(teacher_forced(reference, oth_rec.values, prompt_ids), oth_rec.values, ref_rec.order, c)
    drift = {(r.layer, r.op): r.max_abs for r in compare_layers(ref_rec.values, oth_rec.values, ref_rec.order, c)}
    for row in rows:
        row.drift_abs = drift.get((row.layer, row.op), 0.0)
    ref_ids, oth_ids, divergence = greedy_pair(reference, other, prompt_ids, n_steps)
    return DiffReport(rows, n_steps, ref_ids, oth_ids, divergence)


def diff_engines(weights: Weights, prompt_ids: Sequence[int], n_steps: int = 64,
                 max_cache_len: int = 8192, engines: tuple[str, str] = ("reference", "fast"),
                 activations: str = "f32") -> DiffReport:
    """Build engines ``engines`` (reference first) over ``weights``, both with
    ``activations`` ("f32" or the opt-in "q8"), and diff them."""
    reference = make_engine(engines[0], weights, max_cache_len, activations)
    other = make_engine(engines[1], weights, max_cache_len, activations)
    return diff(reference, other, prompt_ids, n_steps)
