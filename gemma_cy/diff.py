"""Reference-vs-fast diffing: per-layer errors over a prompt, then greedy
decoding on both engines until the first divergent token.

Both engines share one observer protocol, observer(layer, op, pos, value), so
the diff only records what each engine reports and compares like with like.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .engines import make_engine
from .tolerance import errors, tolerance_for, within
from .weights import Weights


@dataclass
class LayerRow:
    """Worst error of one (layer, op) over the prompt positions."""

    layer: int
    op: str
    max_abs: float
    max_rel: float
    ok: bool
    positions: int


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
        lines = [f"{'layer':>5}  {'op':<12} {'max_abs':>10} {'max_rel':>10}  within tolerance"]
        for r in self.rows:
            lines.append(f"{r.layer:>5}  {r.op:<12} {r.max_abs:10.3e} {r.max_rel:10.3e}  "
                         f"{'yes' if r.ok else 'NO'}")
        if self.divergence is None:
            lines.append(f"greedy: {self.n_steps}/{self.n_steps} tokens identical")
        else:
            d = self.divergence
            lines.append(f"greedy: first divergence at step {d.step}: reference {d.reference_id}, "
                         f"other {d.other_id}; reference top-1/top-2 margin {d.reference_margin:.4g}")
        return "\n".join(lines)


class Recorder:
    """An observer that keeps a copy of every value, keyed (layer, op, pos)."""

    def __init__(self):
        self.values: dict[tuple[int, str, int], np.ndarray] = {}
        self.order: list[tuple[int, str]] = []

    def __call__(self, layer: int, op: str, pos: int, value: np.ndarray) -> None:
        if (layer, op) not in self.order:
            self.order.append((layer, op))
        self.values[(layer, op, pos)] = np.array(value, dtype=np.float32, copy=True)


def top2_margin(logits: np.ndarray) -> float:
    """top-1 minus top-2 logit."""
    top = np.partition(np.asarray(logits, np.float64), -2)[-2:]
    return float(top[1] - top[0])


def argmax(logits: np.ndarray) -> int:
    """Greedy pick, lowest id on ties (SPEC A6)."""
    return int(np.argmax(logits))


def compare_layers(reference: Recorder, other: Recorder) -> list[LayerRow]:
    """Per (layer, op): worst error over the positions both engines reported."""
    rows = []
    for layer, op in reference.order:
        atol, rtol = tolerance_for(op)
        keys = [k for k in reference.values if k[0] == layer and k[1] == op and k in other.values]
        if not keys:
            continue
        worst_abs = worst_rel = 0.0
        ok = True
        for key in keys:
            a, b = other.values[key], reference.values[key]
            if a.shape != b.shape:
                ok = False
                worst_abs = worst_rel = float("inf")
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
    """Compare engine ``other`` against ``reference`` on one prompt: every
    observed intermediate over the prompt, then ``n_steps`` greedy tokens."""
    n_steps = max(0, min(n_steps, reference.cache_len - len(prompt_ids)))
    ref_rec, oth_rec = Recorder(), Recorder()
    reference.reset()
    other.reset()
    reference.prefill(prompt_ids, ref_rec)
    other.prefill(prompt_ids, oth_rec)
    rows = compare_layers(ref_rec, oth_rec)
    ref_ids, oth_ids, divergence = greedy_pair(reference, other, prompt_ids, n_steps)
    return DiffReport(rows, n_steps, ref_ids, oth_ids, divergence)


def diff_engines(weights: Weights, prompt_ids: Sequence[int], n_steps: int = 64,
                 max_cache_len: int = 8192, engines: tuple[str, str] = ("reference", "fast")) -> DiffReport:
    """Build engines ``engines`` (reference first) over ``weights`` and diff them."""
    reference = make_engine(engines[0], weights, max_cache_len)
    other = make_engine(engines[1], weights, max_cache_len)
    return diff(reference, other, prompt_ids, n_steps)
