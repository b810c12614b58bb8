"""The tables a SentencePiece tokenizer runs from (``VocabTables``): pieces
packed in one blob (``PackedPieces``) and the hash index of their
spellings (``build_index``), built by gemma_cy.tokenizers.sp, searched by
sp_bpe, stored and read back by sp_cache (docs/model.md#tokenizer-cache).
"""
from __future__ import annotations

import mmap
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError

EMPTY = -1  # an empty slot of the hash table


def build_index(spelled: PackedPieces) -> np.ndarray:
    """An open-addressing hash table (int32, power-of-two size at least twice
    the pieces): slot CRC-32(piece) & (size - 1), then the next slots in
    turn, holds the piece's id; EMPTY ends a search."""
    n = len(spelled)
    size = 1 << max(4, (2 * n - 1).bit_length())
    mask = size - 1
    table = np.full(size, EMPTY, np.int32)
    slots = memoryview(table)
    blob, offsets, base = spelled.blob, memoryview(spelled.offsets), spelled.base
    crc32 = zlib.crc32
    for i in range(n):
        slot = crc32(blob[base + offsets[i]:base + offsets[i + 1]]) & mask
        while slots[slot] != EMPTY:
            slot = (slot + 1) & mask
        slots[slot] = i
    return table


def index_consistent(table: np.ndarray, n: int) -> bool:
    """A stored table's shape and ids fit an ``n``-piece vocabulary (every id
    once, at most half the slots full); a search may then index with them unchecked."""
    if table.dtype != np.int32 or table.ndim != 1 or table.size < 2 * n or table.size & (table.size - 1):
        return False
    ids = table[table != EMPTY]
    return ids.size == n and bool(np.all(np.bincount(ids, minlength=n) == 1)) if n else ids.size == 0



class PackedPieces(Sequence):
    """A list of byte strings held as one blob and their offsets: id -> bytes.

    ``blob`` is bytes, or a read-only map whose bytes [base, base +
    offsets[-1]) are the blob (a cache entry's); ``offsets`` int32 (n + 1,),
    from 0 to the blob's length."""

    def __init__(self, blob: bytes | mmap.mmap, offsets: np.ndarray, base: int = 0) -> None:
        self.blob, self.offsets, self.base = blob, offsets, base

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
        return self.blob[self.base + int(self.offsets[i]):self.base + int(self.offsets[i + 1])]

    @property
    def size(self) -> int:
        """Bytes of the blob."""
        return int(self.offsets[-1])

    def data(self) -> bytes | memoryview:
        """The blob's bytes (a view of them in a map)."""
        return memoryview(self.blob)[self.base:self.base + self.size]

    def find(self, piece: bytes) -> int | None:
        """The first id whose bytes are ``piece``, or None: a search of the
        blob, keeping a match only where it is one whole piece."""
        if not piece:
            return None
        base, end = self.base, self.base + self.size
        at = self.blob.find(piece, base, end)
        while at >= 0:
            i = int(np.searchsorted(self.offsets, at - base, side="left"))
            if self.offsets[i] == at - base and i < len(self) and self.offsets[i + 1] == at - base + len(piece):
                return i
            at = self.blob.find(piece, at + 1, end)
        return None


@dataclass(frozen=True)
class VocabTables:
    """What a SentencePieceTokenizer runs from, once its vocabulary is checked:
    per id the ``pieces`` as the file spells them (``pieces.find``: a
    piece's first id), as SentencePiece spells them (``spelled``),
    SentencePiece's ``types`` and the ``scores``;
    the hash ``index`` of the spellings (build_index); ``byte_ids``
    (the id of each byte's piece, -1 if none)."""

    pieces: PackedPieces
    spelled: PackedPieces
    types: np.ndarray     # int8 (n,)
    scores: np.ndarray    # f32 (n,)
    index: np.ndarray     # int32 (2^k,)
    byte_ids: np.ndarray  # int32 (256,)
