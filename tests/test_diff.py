"""The diff tool must flag what differs: a perturbed layer, a flipped token."""
import numpy as np
import pytest

from helpers import cli

from gemma_cy.commands.diff import diff
from gemma_cy_reference.model import ReferenceEngine


class Perturbed(ReferenceEngine):
    """The reference, with one observed value scaled by 1+delta and one logit raised."""

    def __init__(self, weights, cache_len, op, delta, logit_bias=None):
        super().__init__(weights, cache_len)
        self.op, self.delta, self.logit_bias = op, delta, logit_bias

    def _step(self, token, pos, observe, want_logits=True):
        def nudged(layer, op, p, value):
            hit = (layer, op) == self.op
            observe(layer, op, p, value * (1 + self.delta) if hit else value)
        logits = super()._step(token, pos, nudged, want_logits)
        if logits is not None and self.logit_bias is not None:
            logits = logits.copy()
            logits[self.logit_bias] += 1e3
        return logits


def test_identical_engines_agree(tiny):
    report = diff(ReferenceEngine(tiny, 64), ReferenceEngine(tiny, 64), [2, 50, 60], 8)
    assert report.ok and report.divergence is None and len(report.reference_ids) == 8
    assert all(row.max_abs == 0 for row in report.rows)


def test_a_perturbed_layer_is_flagged(tiny):
    report = diff(ReferenceEngine(tiny, 64), Perturbed(tiny, 64, (1, "mlp"), 0.01), [2, 50, 60], 2)
    bad = [(r.layer, r.op) for r in report.rows if not r.ok]
    # the nudged mlp output no longer matches the reference's mlp of the same
    # input, nor the residual sum the engine really computed from the unnudged one
    assert bad == [(1, "mlp"), (1, "resid_mlp")]
    assert not report.ok
    small = diff(ReferenceEngine(tiny, 64), Perturbed(tiny, 64, (1, "attn_norm"), 1e-4), [2, 50, 60], 2)
    assert small.layers_ok  # a relative 1e-4 is inside rtol 1e-3


@pytest.mark.parametrize("op, flagged", [
    ((-1, "embed"), [(-1, "embed"), (0, "resid_attn")]),
    ((0, "resid_mlp"), [(0, "resid_mlp"), (1, "resid_attn")]),
])
def test_the_embedding_and_residual_adds_are_judged_exactly(tiny, op, flagged):
    """The diff tool holds the ops the tests hold exact (the embedding, the
    residual adds: gemma_cy.model.tolerance.OP_TOLERANCE) to exactness: a
    relative change of 1e-6, far inside the default bound, is flagged there,
    and at the next residual add that takes the changed value as its input."""
    report = diff(ReferenceEngine(tiny, 64), Perturbed(tiny, 64, op, 1e-6), [2, 50, 60], 2)
    assert [(r.layer, r.op) for r in report.rows if not r.ok] == flagged


def test_first_divergence_reports_ids_and_margin(tiny):
    ref = ReferenceEngine(tiny, 64)
    report = diff(ref, Perturbed(tiny, 64, None, 0.0, logit_bias=7), [2, 50, 60], 5)
    d = report.divergence
    assert d is not None and d.step == 0 and d.other_id == 7
    ref.reset()
    logits = ref.prefill([2, 50, 60])
    top = np.sort(logits.astype(np.float64))[-2:]
    assert d.reference_id == int(np.argmax(logits))
    assert d.reference_margin == pytest.approx(top[1] - top[0])


def test_cli_diff_exit_codes(tiny_model_path):
    ok = cli("diff", "--weights", str(tiny_model_path), "--prompt", "hello", "--n_dec", "4",
             "--engines", "reference,reference")
    assert ok.returncode == 0, ok.stderr
    assert "4/4 tokens identical" in ok.stdout and "resid_mlp" in ok.stdout
    bad = cli("diff", "--weights", str(tiny_model_path), "--engines", "reference")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
