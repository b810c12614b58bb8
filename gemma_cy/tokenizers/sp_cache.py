"""A built SentencePiece vocabulary's tables (sp_tables.VocabTables) copied
into the user's cache directory, so a model's tokenizer is built from its GGUF
vocabulary once, not at every start (docs/model.md#tokenizer-cache).

Building Gemma 3's 262,144-piece vocabulary (checking every piece, spelling
it as SentencePiece does and hashing the spellings) takes ~0.5 s of Python;
reading the tables back takes a few milliseconds. The entry is a file of
raw arrays (``_write``) mapped read-only, not read: once its tables are
checked, the process lets go of their pages, and a prompt's lookups map
back only the few they touch, so the ~10 MB of tables do not stay in a
short run's resident memory. The cache file is keyed by
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
import mmap
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError
from .sp_tables import PackedPieces, VocabTables, index_consistent

CACHE_VERSION = 5  # bump when VocabTables or the entry's layout changes
# Vocabularies smaller than this build in well under 0.1 s: no file for them
# (the tests' and fuzzers' small vocabularies leave no trace in the cache).
CACHE_MIN_PIECES = 16384


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
    return cache_dir() / "tokenizers" / f"sentencepiece-{key}.tables"


# An entry: MAGIC, the header's length (u32, little-endian), the header (JSON:
# {"arrays": [[name, dtype, length, offset], ...]}), then each array's bytes
# at its offset, a multiple of ALIGN. Every array is 1-D.
MAGIC = b"GCYSPT" + bytes((0, CACHE_VERSION))
ALIGN = 64
ARRAY_TYPES = {"pieces_blob": "u1", "pieces_offsets": "<i4", "spelled_blob": "u1", "spelled_offsets": "<i4",
               "types": "i1", "scores": "<f4", "index": "<i4", "byte_ids": "<i4"}
HEADER_MAX = 1 << 16


def _write(f, arrays: dict[str, np.ndarray | bytes | memoryview]) -> None:
    """Write ``arrays`` (ARRAY_TYPES' names; a blob as bytes) as one entry to
    the binary file ``f``."""
    parts = {name: np.frombuffer(arrays[name], np.uint8) if dtype == "u1"
             else np.ascontiguousarray(arrays[name], dtype=dtype) for name, dtype in ARRAY_TYPES.items()}
    entries, at = [], 0
    for name, a in parts.items():
        entries.append([name, ARRAY_TYPES[name], int(a.size), at])
        at += -(-a.nbytes // ALIGN) * ALIGN
    header = json.dumps({"arrays": entries}).encode()
    head = len(MAGIC) + 4 + len(header)
    f.write(MAGIC + struct.pack("<I", len(header)) + header + b"\0" * (-head % ALIGN))
    for a in parts.values():
        f.write(a.tobytes() + b"\0" * (-a.nbytes % ALIGN))


def _read(mm: mmap.mmap) -> dict[str, tuple[int, np.ndarray]] | None:
    """Each array of the entry mapped at ``mm``: name -> (where its bytes
    start in the map, the array: a read-only view of them); None unless the
    header is whole and lists each of ARRAY_TYPES' names once, with its
    type, and every array lies inside the map."""
    head = len(MAGIC) + 4
    if len(mm) < head or mm[:len(MAGIC)] != MAGIC:
        return None
    (n,) = struct.unpack("<I", mm[len(MAGIC):head])
    if n > HEADER_MAX or head + n > len(mm):
        return None
    try:
        entries = json.loads(mm[head:head + n])["arrays"]
    except (ValueError, TypeError, KeyError):  # (UnicodeDecodeError is a ValueError)
        return None
    start = -(-(head + n) // ALIGN) * ALIGN
    out = {}
    for e in entries if isinstance(entries, list) else ():
        if not isinstance(e, list) or len(e) != 4 or not isinstance(e[0], str) or e[0] in out \
                or e[1] != ARRAY_TYPES.get(e[0]) or not all(type(v) is int and v >= 0 for v in e[2:]):
            return None
        name, dtype, count, offset = e
        at = start + offset
        if at % ALIGN or at + count * np.dtype(dtype).itemsize > len(mm):
            return None
        out[name] = (at, np.frombuffer(mm, np.dtype(dtype), count, at))
    return out if out.keys() == ARRAY_TYPES.keys() else None


def load(key: str, n: int) -> VocabTables | None:
    """The tables stored under ``key`` for an ``n``-piece vocabulary (views of
    the entry's read-only map), or None when there are none or they do not
    hold together."""
    from ..formats.mapped import map_file, release_pages

    try:
        mm = map_file(str(cache_path(key)), "tokenizer cache", len(MAGIC) + 4, huge_pages=False)
    except ModelFormatError:  # absent or unreadable
        return None
    arrays = _read(mm)
    if arrays is None:
        return None
    at = {name: where for name, (where, _) in arrays.items()}
    a = {name: array for name, (_, array) in arrays.items()}
    tables = VocabTables(
        pieces=PackedPieces(mm, a["pieces_offsets"], at["pieces_blob"]),
        spelled=PackedPieces(mm, a["spelled_offsets"], at["spelled_blob"]),
        types=a["types"], scores=a["scores"], index=a["index"], byte_ids=a["byte_ids"])
    if not _consistent(tables, n, (a["pieces_blob"].size, a["spelled_blob"].size)):
        return None
    release_pages(mm, 0, len(mm))  # checked: what the tokenizer reads later maps back in
    return tables


def _consistent(t: VocabTables, n: int, blob_sizes: tuple[int, int]) -> bool:
    """Shapes, offsets and ids of stored tables within their bounds (what
    the tokenizer indexes without further checks); ``blob_sizes``: the
    stored lengths of the pieces' and the spellings' blobs."""
    for packed, size in zip((t.pieces, t.spelled), blob_sizes):
        o = packed.offsets
        if o.dtype != np.int32 or o.shape != (n + 1,) or o[0] != 0 or o[-1] != size or np.any(np.diff(o) < 0):
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
            _write(f, {"pieces_blob": tables.pieces.data(), "pieces_offsets": tables.pieces.offsets,
                       "spelled_blob": tables.spelled.data(), "spelled_offsets": tables.spelled.offsets,
                       "types": tables.types, "scores": tables.scores, "index": tables.index,
                       "byte_ids": tables.byte_ids})
        for old in path.parent.glob("sentencepiece-*.npz"):  # entries of the format before this one
            old.unlink(missing_ok=True)
    except (OSError, ModelFormatError):  # atomic_write reports an OSError as ModelFormatError
        pass
