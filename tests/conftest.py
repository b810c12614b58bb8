"""Shared fixtures: the tiny seed model, generated once per test session by
the same script users run (scripts/make_test_weights.py), its weights and a
Model over it; the tiny Gemma 3 GGUF of tests/gguf_helpers.py. Shared helpers
(not fixtures) are in tests/helpers.py and tests/gguf_helpers.py."""
from pathlib import Path

import pytest

from gemma_cy.api import Model
from gemma_cy.formats.gmw import read_gmw
from gemma_cy.model.weights import Weights
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from gguf_helpers import write_tiny
from helpers import run_script


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """models/tiny.gmw (+ .tok) in a session temp dir."""
    path = tmp_path_factory.mktemp("models") / "tiny.gmw"
    run_script("scripts/make_test_weights.py", "--size", "tiny", "-o", str(path))
    return path


@pytest.fixture(scope="session")
def tiny(tiny_model_path) -> Weights:
    """The tiny fixture's weights (read-only views of the file)."""
    return read_gmw(str(tiny_model_path))


@pytest.fixture(scope="session")
def tiny_model(tiny, tiny_model_path) -> Model:
    """A Model over the tiny weights with the fixture's tokenizer (for
    prompts and chat ids) and a reference engine of 256 positions."""
    return Model(tiny, GreedyTokenizer.from_file(str(tiny_model_path) + ".tok"), "reference", 256)


@pytest.fixture
def tiny_gguf(tmp_path) -> str:
    """The tiny Gemma 3 model (2 layers, dim 32; Q8_0 matrices) as a GGUF in tmp_path."""
    return write_tiny(tmp_path / "tiny.gguf")


@pytest.fixture(scope="session")
def default_model() -> str:
    """The packaged Gemma 3 270M's GGUF path (what `make run` installs), or a skip saying so."""
    from gemma_cy.errors import GemmaCyError
    from gemma_cy.formats.packaged import default_model_path

    try:
        return default_model_path(progress=False)
    except GemmaCyError as e:
        pytest.skip(f"the default model package is not installed ({e})")
