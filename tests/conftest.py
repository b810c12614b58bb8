"""Shared fixtures: the tiny seed model, generated once per test session by
the same script users run (scripts/make_test_weights.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_cy import ops
from gemma_cy.cpu_features import supported

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
    """Run `python -m gemma_cy.cli ARGS` and return the CompletedProcess."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "gemma_cy.cli", *args], cwd=REPO, capture_output=True,
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
