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
    result = subprocess.run([sys.executable, str(FUZZ / "run.py"), name, "--seconds", "2"], cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Done" in result.stderr and "stat::number_of_executed_units" in result.stderr
