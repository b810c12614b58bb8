"""SentencePiece's BPE encoding, written out (docs/model.md#sentencepiece-bpe).

Gemma's tokenizer is a SentencePiece BPE model. This module encodes text as
the ``sentencepiece`` package does for the ModelProto that
``sp.build_model_proto`` writes (tests/test_sp_bpe.py holds the two side by
side), without loading that package: its processor for Gemma 3's 262,144
pieces holds ~45 MB, these tables ~10 MB.

On text (valid UTF-8; sp.py deals with bytes that are not):

1. normalize: every space becomes U+2581 "▁" (no dummy prefix, nothing else
   changes);
2. split into symbols: at each position the longest user-defined piece
   (frozen: never merged) or else one UTF-8 character;
3. merge: of all adjacent pairs of unfrozen symbols whose joined bytes are
   a piece (NORMAL, USER_DEFINED or UNUSED), join the one whose piece has the
   highest score, leftmost on ties; repeat until no pair joins;
4. resegment: a symbol that ended as an UNUSED piece is split back into the
   two symbols it was joined from (the last such join of those bytes),
   recursively;
5. look up: each symbol's id (a reserved piece, CONTROL, UNKNOWN or BYTE,
   first; a piece; else the unknown id). An unknown symbol becomes its
   bytes' byte pieces when the vocabulary has them (byte fallback);
   without them a run of unknown symbols is one unknown id.

Step 3 keeps a heap of candidate pairs ordered (-score, left index); a
popped pair whose symbols have changed since it was pushed (one is empty or
their lengths no longer add up) is stale and skipped.
"""
from __future__ import annotations

import heapq
import zlib
from dataclasses import dataclass

import numpy as np

from .greedy import _build_trie, _longest_match
from .sp_tables import EMPTY, PackedPieces

# SentencePiece piece types (ModelProto.SentencePiece.Type); GGUF uses the same numbers.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MERGEABLE = (NORMAL, USER_DEFINED, UNUSED)  # what a pair may join into
META_SPACE = "\u2581"
@dataclass(frozen=True)
class BPEVocab:
    """What the encoder runs from: per id the piece as SentencePiece spells it
    (``spelled``), its ``scores`` (f32) and ``types`` (int8); the ``index``
    of the spellings (build_index); the unknown id; the id of each byte's
    piece (-1 if none)."""

    spelled: PackedPieces
    scores: np.ndarray    # f32 (n,)
    types: np.ndarray     # int8 (n,)
    index: np.ndarray     # int32 (2^k,)
    unk_id: int
    byte_ids: np.ndarray  # int32 (256,)


class SentencePieceBPE:
    """Encodes text to ids as SentencePiece's BPE model with byte fallback."""

    def __init__(self, vocab: BPEVocab) -> None:
        self.unk_id = vocab.unk_id
        self._blob, self._base = vocab.spelled.blob, vocab.spelled.base
        self._offsets = memoryview(vocab.spelled.offsets)
        self._slots = memoryview(vocab.index)
        self._mask = len(vocab.index) - 1
        self._scores = memoryview(vocab.scores)
        types = vocab.types
        self._mergeable = np.isin(types, MERGEABLE).tobytes()  # 1 byte per id
        self._unused = (types == UNUSED).tobytes()
        self._byte_fallback = bool(np.all(vocab.byte_ids >= 0))
        self._byte_ids = vocab.byte_ids.tolist()
        user_defined = np.flatnonzero(types == USER_DEFINED).tolist()
        self._user_trie = _build_trie([(vocab.spelled[i], i) for i in user_defined]) if user_defined else None
        self._user_first = {vocab.spelled[i][0] for i in user_defined}  # bytes a user-defined piece starts with

    def find(self, piece: bytes) -> int:
        """The id spelled ``piece``, or -1."""
        slots, offsets, blob, base, mask = self._slots, self._offsets, self._blob, self._base, self._mask
        slot = zlib.crc32(piece) & mask
        while True:
            i = slots[slot]
            if i == EMPTY:
                return -1
            if blob[base + offsets[i]:base + offsets[i + 1]] == piece:
                return i
            slot = (slot + 1) & mask

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (a str without lone surrogates), without BOS."""
        if not text:
            return []
        symbols, frozen = self._symbols(text.replace(" ", META_SPACE).encode())
        rev_merge: dict[bytes, tuple[bytes, bytes]] = {}
        self._merge(symbols, frozen, rev_merge)
        return self._ids(symbols, rev_merge)

    def _symbols(self, data: bytes) -> tuple[list[bytes], list[bool]]:
        """Step 2: the longest user-defined piece at each position (frozen),
        else one UTF-8 character."""
        symbols: list[bytes] = []
        frozen: list[bool] = []
        at, n = 0, len(data)
        while at < n:
            lead = data[at]
            length = 0
            if self._user_trie is not None and lead in self._user_first:
                length = _longest_match(self._user_trie, data, at)[1] - at
            frozen.append(length > 0)
            if not length:
                length = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            symbols.append(data[at:at + length])
            at += length
        return symbols, frozen

    def _merge(self, symbols: list[bytes], frozen: list[bool], rev_merge: dict) -> None:
        """Step 3, in place: ``symbols`` joined left into right-emptied slots;
        ``rev_merge`` records the last split of each UNUSED piece formed."""
        n = len(symbols)
        prev = list(range(-1, n - 1))
        next_ = list(range(1, n + 1))
        next_[-1] = -1
        agenda: list[tuple[float, int, int, int]] = []
        find, scores, mergeable, unused = self.find, self._scores, self._mergeable, self._unused

        def consider(left: int, right: int) -> None:
            if left < 0 or right < 0 or frozen[left] or frozen[right]:
                return
            joined = symbols[left] + symbols[right]
            i = find(joined)
            if i < 0 or not mergeable[i]:
                return
            heapq.heappush(agenda, (-scores[i], left, right, len(joined)))
            if unused[i]:
                rev_merge[joined] = (symbols[left], symbols[right])

        for i in range(1, n):
            consider(i - 1, i)
        while agenda:
            _, left, right, size = heapq.heappop(agenda)
            a, b = symbols[left], symbols[right]
            if not a or not b or len(a) + len(b) != size:
                continue  # stale: one side was joined elsewhere since
            symbols[left] = a + b
            symbols[right] = b""
            after = next_[right]
            next_[left] = after
            if after >= 0:
                prev[after] = left
            consider(prev[left], left)
            consider(left, after)

    def _ids(self, symbols: list[bytes], rev_merge: dict) -> list[int]:
        """Steps 4 and 5 over the symbols left non-empty, in order."""
        ids: list[int] = []
        unk, unused, byte_ids = self.unk_id, self._unused, self._byte_ids
        prev_unknown = False

        def emit(piece: bytes) -> None:
            nonlocal prev_unknown
            i = self.find(piece)
            if i < 0:
                i = unk
            elif unused[i] and piece in rev_merge:
                left, right = rev_merge[piece]
                emit(left)
                emit(right)
                return
            if i != unk:
                ids.append(i)
            elif self._byte_fallback:
                ids.extend(byte_ids[b] for b in piece)
            elif not prev_unknown:
                ids.append(unk)  # a run of unknown symbols is one unknown id
            prev_unknown = i == unk

        for piece in symbols:
            if piece:
                emit(piece)
        return ids
