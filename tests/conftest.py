"""Shared fixtures: the tiny seed model, generated once per test session by
the same script users run (scripts/make_test_weights.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_cy.fast import ops
from gemma_cy.fast.cpu_features import supported

REPO = Path(__file__).resolve().parent.parent
TINY_SHA256 = "83f240224e71ca95a87356a016b2ccb41a26efa10af4c150935cd1d5f0c8df57"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, check=True)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """models/tiny.gmw (+ .tok) in a session temp dir."""
    path = tmp_path_factory.mktemp("models") / "tiny.gmw"
    run_script("scripts/make_test_weights.py", "--size", "tiny", "-o", str(path))
    return path


def cli(*args: str, timeout: float = 120, env_extra: dict | None = None, input: str | None = None):
    """Run `python -m gemma_cy.commands.cli ARGS` and return the CompletedProcess."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "gemma_cy.commands.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env, input=input)


# ---------------------------------------------------------------------------
# The SIMD modules: ``@ISA`` runs a test once per module, skipping (with the
# reason) those this CPU cannot run or this architecture does not build.

AVAILABLE = ops.available()


def _skip_reason(name: str) -> str:
    need = ops.REQUIRES[name]
    if need is not None and not supported()[need]:
        return f"this CPU cannot run {name} (it runs: {', '.join(AVAILABLE)})"
    return f"{name} is not built on this architecture"


ISA = pytest.mark.parametrize("isa", [
    pytest.param(name, marks=pytest.mark.skipif(name not in AVAILABLE, reason=_skip_reason(name)))
    for name in ops.ISAS])


def kernels(isa: str):
    return ops.module_for(isa)


# ---------------------------------------------------------------------------
# Shared checks of two engines, and of the reference against an oracle's goldens


def greedy_engines_agree(ref, fast, ids, n: int, label: str, judge_drift: bool = True) -> list[int]:
    """Reset both engines, prefill ``ids`` and greedy-decode ``n`` tokens on
    each: the ids must be equal (docs/numerics.md#greedy-agreement; a
    divergence reports the step, both ids and the reference's top-1/top-2
    margin). With ``judge_drift``, every step's logits (the last one's too),
    each engine running on its own cache, must also be within the default
    tolerance of docs/numerics.md#tolerances. Returns the greedy ids."""
    import numpy as np

    from gemma_cy.model.tolerance import DEFAULT

    atol, rtol = DEFAULT
    ref.reset()
    fast.reset()
    want, got = ref.prefill(ids), fast.prefill(ids)
    out = []
    for step in range(n):
        a, b = int(np.argmax(want)), int(np.argmax(got))
        top2 = np.sort(want)[-2:]
        assert a == b, (f"{label}: step {step}: reference id {a}, fast id {b}; "
                        f"reference top-1/top-2 margin {top2[1] - top2[0]:.6g}")
        if judge_drift:
            np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"{label}: logits at step {step}")
        out.append(a)
        want, got = ref.decode(a), fast.decode(b)
    if judge_drift:
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"{label}: final logits")
    return out


def reference_agrees_with_oracle(reference, prompt: dict, golden_dir: Path, rms_limit: float) -> None:
    """The reference on ``prompt`` (a golden record: prompt_ids, logits_file,
    greedy_ids, step_margins, step_second_ids) against the oracle's goldens:
    last-position logits rms below ``rms_limit``, then the same greedy ids
    (a divergence reports the step and the oracle's margin there)."""
    import numpy as np

    reference.reset()
    logits = reference.prefill(prompt["prompt_ids"])
    oracle = np.load(golden_dir / prompt["logits_file"])
    rms = float(np.sqrt(np.mean((logits.astype(np.float64) - oracle) ** 2)))
    print(f"{prompt['name']}: logits rms {rms:.3g}")
    assert rms < rms_limit, f"{prompt['name']}: last-position logits rms {rms:.4g} >= {rms_limit}"
    for step, want in enumerate(prompt["greedy_ids"]):
        got = int(np.argmax(logits))
        if got != want:
            pytest.fail(f"{prompt['name']}: greedy step {step}: reference {got}, oracle {want}; "
                        f"oracle's top-1/top-2 margin {prompt['step_margins'][step]:.4g} "
                        f"(second choice {prompt['step_second_ids'][step]})")
        if step + 1 < len(prompt["greedy_ids"]):
            logits = reference.decode(got)
