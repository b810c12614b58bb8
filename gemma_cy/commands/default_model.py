"""The default models (gemma_cy.formats.packaged, re-exported here for the
commands and scripts) and ``q8_0_conversion``: a packaged GGUF converted
once to Q8_0 into ``cache_dir()``, the re-quantized baseline the benchmarks
compare the file as stored against.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import GemmaCyError
from ..formats.packaged import (MODEL_PACKAGE, PIP_NAME, SMOLLM2_FILE, SMOLLM2_PIP_NAME, cache_dir,
                                default_model_path, smollm2_model_path, smollm2_source_path)

__all__ = ["MODEL_PACKAGE", "PIP_NAME", "SMOLLM2_FILE", "SMOLLM2_PIP_NAME", "cache_dir", "default_model_path",
           "q8_0_conversion", "smollm2_model_path", "smollm2_source_path"]


def q8_0_conversion(source: str) -> str:
    """``source`` (a GGUF) converted to Q8_0 by ``gemma-cy convert``, made once
    into ``cache_dir()`` under the source's name, size and modification
    time: the re-quantized baseline the benchmarks
    compare the file as stored against. Raises GemmaCyError with one line
    when the cache cannot be written."""
    from .convert import convert

    info = os.stat(source)
    stem = Path(source).stem
    target = cache_dir() / f"{stem}.{info.st_size}.{int(info.st_mtime)}.q8_0.gguf"
    if not target.is_file():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            convert(source, target)
        except OSError as e:
            raise GemmaCyError(f"cannot convert {source} into {target.parent}: {e.strerror or e}") from None
        # A reinstalled package gives its file a new mtime, so a new name: the
        # conversions of the file it replaced are never read again (~145 MB
        # each for SmolLM2), and go.
        for stale in target.parent.glob(f"{stem}.*.q8_0.gguf"):
            if stale != target:
                stale.unlink(missing_ok=True)
    return str(target)
