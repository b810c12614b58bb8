"""llama.cpp's own files, from the llama-cpp-python source distribution, fetched once.

The sdist (pinned version and SHA-256) carries llama.cpp's tokenizer test
vocabularies (``models/ggml-vocab-*.gguf`` with the ``.inp``/``.out`` pairs
its ``test-tokenizer-0`` reads, made by HF ``tokenizers`` from each model's
real tokenizer), the real chat templates of many models
(``models/templates/*.jinja``) and the HF-to-GGUF converter. It is
downloaded from the package index (PEP 691 JSON, no build step) into
gemma-cy's cache directory, checked against its hash, and only the members
asked for are unpacked beside it.

Used by the tests (``sdist_or_skip``: a pytest skip naming the reason when
the index cannot be reached) and by scripts/make_arch_goldens.py (the
converter).
"""
from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from gemma_cy.formats.packaged import cache_dir

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
FILENAME = f"llama_cpp_python-{VERSION}.tar.gz"
INDEX = os.environ.get("GEMMA_CY_PYPI_SIMPLE", "https://pypi.org/simple/")
PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
TIMEOUT = 60


class Unreachable(Exception):
    """The package index or its file host could not be reached."""


def cache_root() -> Path:
    """This sdist's folder in gemma-cy's own cache directory."""
    return cache_dir() / f"llama-cpp-python-{VERSION}"


def _fetch(url: str, accept: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise Unreachable(f"{url}: {e}") from None


def sdist_path() -> Path:
    """The sdist in the cache, downloaded and hash-checked the first time."""
    path = cache_root() / FILENAME
    if path.exists():
        return path
    listing = json.loads(_fetch(INDEX.rstrip("/") + "/llama-cpp-python/", "application/vnd.pypi.simple.v1+json"))
    url = next((f["url"] for f in listing["files"] if f["filename"] == FILENAME), None)
    if url is None:
        raise RuntimeError(f"{FILENAME} is not on {INDEX}")
    data = _fetch(url)
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{FILENAME}: SHA-256 {digest}, expected {SHA256}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)
    return path


def llama_cpp_dir(*names: str) -> Path:
    """llama.cpp's tree in the cache, with ``names`` (folders or files relative
    to it: "models", "gguf-py", "convert_hf_to_gguf.py") unpacked from the
    sdist when not yet there (a folder is there once its marker is)."""
    root = cache_root() / "vendor" / "llama.cpp"

    def done(name: str) -> Path:
        return root / name if name.endswith(".py") else root / name / ".complete"

    missing = [name.strip("/") for name in names if not done(name.strip("/")).exists()]
    if missing:
        with tarfile.open(sdist_path()) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and any(
                m.name == PREFIX + name or m.name.startswith(PREFIX + name + "/") for name in missing)]
            for m in members:
                m.name = "vendor/llama.cpp/" + m.name[len(PREFIX):]
            tar.extractall(cache_root(), members=members, filter="data")
        for name in missing:
            if not done(name).parent.is_dir():
                raise RuntimeError(f"{FILENAME} has no vendor/llama.cpp/{name}")
            if not name.endswith(".py"):
                done(name).touch()
    return root


def sdist_or_skip(*folders: str) -> Path:
    """``llama_cpp_dir(*folders)``, or a pytest skip saying the index is unreachable."""
    import pytest
    try:
        return llama_cpp_dir(*folders)
    except Unreachable as e:
        pytest.skip(f"llama-cpp-python {VERSION} sdist not cached and the package index is unreachable ({e})")
