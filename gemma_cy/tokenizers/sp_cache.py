"""A built SentencePiece vocabulary (``VocabTables``) and its copy in the
user's cache directory, so a model's tokenizer is built from its GGUF
vocabulary once, not at every start (docs/model.md#tokenizer-cache).

Building Gemma 3's 262,144-piece vocabulary (checking every piece, spelling
it as SentencePiece does and hashing the spellings) takes ~0.5 s of Python;
reading the tables back takes a few milliseconds. The cache file is keyed by
a hash of everything the tables are built from: the bytes of the tokens,
scores and types arrays as the GGUF file stores them, their types, and the
special ids. So a different file with the same vocabulary shares the entry,
and any change to the vocabulary misses it. An entry that cannot be read or
does not hold together is ignored (and rebuilt); one that cannot be written
is skipped: the cache only ever saves time.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError

CACHE_VERSION = 4  # bump when VocabTables changes
# Vocabularies smaller than this build in well under 0.1 s: no file for them
# (the tests' and fuzzers' small vocabularies leave no trace in the cache).
CACHE_MIN_PIECES = 16384


class PackedPieces(Sequence):
    """A list of byte strings held as one blob and their offsets: id -> bytes."""

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        self.blob, self.offsets = blob, offsets  # offsets: int32 (n + 1,), from 0 to len(blob)

    @classmethod
    def pack(cls, pieces: list[bytes]) -> PackedPieces:
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        if lengths.sum() >= 2**31:
            raise ModelFormatError(f"vocabulary of {lengths.sum()} bytes; at most {2**31 - 1} are supported")
        offsets = np.zeros(len(pieces) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
        return cls(b"".join(pieces), offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, i: int) -> bytes:
        return self.blob[self.offsets[i]:self.offsets[i + 1]]

    def find(self, piece: bytes) -> int | None:
        """The first id whose bytes are ``piece``, or None: a search of the
        blob, keeping a match only where it is one whole piece."""
        if not piece:
            return None
        at = self.blob.find(piece)
        while at >= 0:
            i = int(np.searchsorted(self.offsets, at, side="left"))
            if self.offsets[i] == at and i < len(self) and self.offsets[i + 1] == at + len(piece):
                return i
            at = self.blob.find(piece, at + 1)
        return None


@dataclass(frozen=True)
class VocabTables:
    """What a SentencePieceTokenizer runs from, once its vocabulary is checked:
    per id the ``pieces`` as the file spells them (``pieces.find``: a
    piece's first id), as SentencePiece spells them (``spelled``),
    SentencePiece's ``types`` and the ``scores``;
    the hash ``index`` of the spellings (sp_bpe.build_index); ``byte_ids``
    (the id of each byte's piece, -1 if none)."""

    pieces: PackedPieces
    spelled: PackedPieces
    types: np.ndarray     # int8 (n,)
    scores: np.ndarray    # f32 (n,)
    index: np.ndarray     # int32 (2^k,)
    byte_ids: np.ndarray  # int32 (256,)


def cache_key(tokens, scores: np.ndarray, types: np.ndarray, special: tuple[int, ...]) -> str:
    """The hash a vocabulary's tables are stored under: ``tokens`` a
    gemma_cy.formats.gguf_reader.StringArray, ``scores`` and ``types`` the
    file's arrays, ``special`` the (bos, eos, unk, pad) ids."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([CACHE_VERSION, tokens.digest(), str(scores.dtype), str(types.dtype),
                         list(special)]).encode())
    h.update(np.ascontiguousarray(scores).tobytes())
    h.update(np.ascontiguousarray(types).tobytes())
    return h.hexdigest()


def cache_path(key: str) -> Path:
    from ..formats.packaged import cache_dir
    return cache_dir() / "tokenizers" / f"sentencepiece-{key}.npz"


def load(key: str, n: int) -> VocabTables | None:
    """The tables stored under ``key`` for an ``n``-piece vocabulary, or None
    when there are none or they do not hold together."""
    try:
        with np.load(cache_path(key), allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
        tables = VocabTables(
            pieces=PackedPieces(arrays["pieces_blob"].tobytes(), arrays["pieces_offsets"]),
            spelled=PackedPieces(arrays["spelled_blob"].tobytes(), arrays["spelled_offsets"]),
            types=arrays["types"], scores=arrays["scores"], index=arrays["index"], byte_ids=arrays["byte_ids"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent, or not a whole entry
        return None
    return tables if _consistent(tables, n) else None


def _consistent(t: VocabTables, n: int) -> bool:
    """Shapes, offsets and ids of stored tables within their bounds (what
    the tokenizer indexes without further checks)."""
    from .sp_bpe import index_consistent

    for packed in (t.pieces, t.spelled):
        o = packed.offsets
        if o.dtype != np.int32 or o.shape != (n + 1,) or o[0] != 0 or o[-1] != len(packed.blob) \
                or np.any(np.diff(o) < 0):
            return False
    if t.types.dtype != np.int8 or t.types.shape != (n,) or t.scores.dtype != np.float32 \
            or t.scores.shape != (n,) or not index_consistent(t.index, n):
        return False
    return t.byte_ids.dtype == np.int32 and t.byte_ids.shape == (256,) and not np.any(t.byte_ids >= n) \
        and not np.any(t.byte_ids < -1)


def store(key: str, tables: VocabTables) -> None:
    """Write ``tables`` under ``key`` (atomically: a reader sees the whole
    file or none); a cache that cannot be written is skipped."""
    from ..formats.mapped import atomic_write

    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(str(path)) as f:
            np.savez(f, pieces_blob=np.frombuffer(tables.pieces.blob, np.uint8), pieces_offsets=tables.pieces.offsets,
                     spelled_blob=np.frombuffer(tables.spelled.blob, np.uint8),
                     spelled_offsets=tables.spelled.offsets,
                     types=tables.types, scores=tables.scores, index=tables.index, byte_ids=tables.byte_ids)
    except (OSError, ModelFormatError):  # atomic_write reports an OSError as ModelFormatError
        pass
