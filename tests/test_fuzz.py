"""The fuzz harnesses (tests/fuzz/, docs/errors.md#fuzzing) in the normal suite:
the committed seeds are valid files, every committed corpus and regression
input runs through its target without an error outside the package's own,
and each harness fuzzes for a few seconds as a smoke test."""
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.harnesses import SEEDS, TARGETS, as_file
from helpers import REPO

FUZZ = Path(__file__).resolve().parent / "fuzz"


def inputs(name: str) -> list[Path]:
    return sorted([*(FUZZ / "corpus" / name).glob("*"), *(FUZZ / "regressions" / name).glob("*")])


def test_every_harness_has_committed_seeds():
    assert set(TARGETS) == set(SEEDS)
    for name in TARGETS:
        assert any(p.name.startswith("seed-") for p in inputs(name)), f"{name}: no seeds (run.py --write-seeds)"


def test_seed_files_are_valid_models_and_vocabularies():
    """A seed the readers refused would start the fuzzer from nothing."""
    from gemma_cy import api
    from gemma_cy.formats.llama2c import read_llama2c
    from gemma_cy.tokenizers.llama2c import Llama2cTokenizer
    from fuzz.harnesses import exercise_tokenizer, exercise_weights

    opened = {"gguf_model": lambda p: exercise_weights(api.open_weights(p)),
              "gguf_vocab": lambda p: exercise_tokenizer(api.open_tokenizer(p)),
              "gmw": lambda p: exercise_weights(api.open_weights(p)),
              "gmt": lambda p: exercise_tokenizer(api.open_tokenizer(p)),
              "llama2c_model": lambda p: exercise_weights(read_llama2c(p)),
              "llama2c_tokenizer": lambda p: exercise_tokenizer(Llama2cTokenizer.from_file(p))}
    suffix = {"gguf_model": ".gguf", "gguf_vocab": ".gguf", "gmw": ".gmw", "gmt": ".tok", "llama2c_model": ".bin",
              "llama2c_tokenizer": ".bin"}
    for name, check in opened.items():
        for seed in (FUZZ / "corpus" / name).glob("seed-*"):
            check(as_file(seed.read_bytes(), f"check{suffix[name]}"))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_corpus_and_regressions_replay(name):
    for path in inputs(name):
        TARGETS[name](path.read_bytes())  # a GemmaCyError is caught inside; anything else fails here


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_harness_smoke(name, tmp_path):
    pytest.importorskip("atheris", reason="atheris (the fuzzer) is not installed; make test installs it")
    # --rss-limit-mb 0: the child's peak RSS starts at this test process's (see run.py)
    result = subprocess.run([sys.executable, str(FUZZ / "run.py"), name, "--seconds", "2", "--rss-limit-mb", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Done" in result.stderr and "stat::number_of_executed_units" in result.stderr


LEAK_PROBE = r"""
import os, sys
import atheris
import numpy as np
sys.path.insert(0, sys.argv[1])
from fuzz.run import without_comparison_leak
with atheris.instrument_imports(include=["gemma_cy"]):
    from gemma_cy.quant.tensors import round_half_away   # compares an array with a constant

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

x = np.linspace(-4, 4, 100_000, dtype=np.float32)  # each comparison's result: 100 KB
seen = {"n": 0}
def target(data):
    seen["n"] += 1
    if seen["n"] == 10:
        seen["rss"] = rss_mb()
    halves = round_half_away(np.array([0.5, -0.5, 1.49, 2.5, -2.5], np.float32))
    assert halves.tolist() == [1, -1, 1, 3, -3], halves
    round_half_away(x)
    if seen["n"] == 1010:
        print(f"growth {rss_mb() - seen['rss']:.1f}", flush=True)
        os._exit(0)
# -rss_limit_mb=0: libFuzzer's RSS is the peak this child inherits from the test process (see run.py)
atheris.Setup([sys.argv[0], "-runs=2000", "-rss_limit_mb=0", "-artifact_prefix=" + sys.argv[2] + "/"],
              without_comparison_leak(atheris, target))
atheris.Fuzz()
"""


def test_fuzzing_does_not_leak_comparison_results(tmp_path):
    """atheris keeps the result of every instrumented comparison of arrays
    (tests/fuzz/run.py, without_comparison_leak): 1,000 inputs that each
    compare a 100 KB array would hold ~100 MB. Through run.py's wrapper the
    process stays flat, and the comparisons still give the right answers."""
    pytest.importorskip("atheris", reason="atheris (the fuzzer) is not installed; make test installs it")
    result = subprocess.run([sys.executable, "-c", LEAK_PROBE, str(FUZZ.parent), str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    growth = float(result.stdout.split("growth")[-1])
    assert growth < 20, f"RSS grew {growth} MB over 1,000 inputs"
