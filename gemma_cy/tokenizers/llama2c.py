"""llama2.c's tokenizer: the tokenizer.bin file and run.c's encode/decode.

File layout (little-endian; written by llama2.c's tokenizer.py):

    int32 max_token_length
    per token, back to back:  f32 score | int32 len | len bytes (the piece)

The file does not say how many tokens it holds: run.c reads as many as the
checkpoint's vocab_size. Here the file is read to its end, every record
whole, and the count is the vocab size; ``api.load`` then checks it against
the model (``read_tokenizer_bin(path, vocab_size=n)`` checks it at once).
A file with more records than the model has tokens is refused, where run.c
would ignore the rest.

Pieces are SentencePiece's with U+2581 turned back into " "; ids 0, 1, 2
are <unk>, BOS ("\\n<s>\\n") and EOS ("\\n</s>\\n"); ids 3..258 are the byte
pieces "<0x00>".."<0xFF>" (run.c's byte fallback is id = byte + 3).

Encode (run.c's ``encode``), on the UTF-8 bytes of the text:
  1. optional BOS (1); if the text is non-empty, the id of the piece " "
     (the dummy prefix);
  2. each code point (a byte and up to 3 following continuation bytes,
     as run.c groups them) becomes the id of the piece equal to it, or, if
     there is none, one id per byte: byte + 3;
  3. repeatedly merge the adjacent pair whose concatenated *pieces* (the
     file's text, "<0x41>" for a byte token) are a piece with the highest
     score above -1e10, the leftmost such pair on ties (run.c's strict >);
  4. optional EOS (2).
Step 3 runs here on a heap keyed by (-score, position) over a linked list,
which picks the same pair as run.c's quadratic scan at every step.
Where run.c's bsearch over a sorted vocab would find any of several equal
pieces, the lowest id is taken. run.c stops at a NUL byte (a C string);
here NUL is one more byte (byte fallback id 3).

Decode (run.c's ``decode``): the piece of the id; after BOS (previous id
1) a leading " " is dropped; a "<0xHH>" piece is that raw byte. Unlike
run.c, the ids 0, 1, 2 decode to nothing (they are control tokens here,
as in every gemma-cy tokenizer).

Validation (docs/errors.md cases 1, 4, 7, 10-13): truncated records, lengths
< 1 or > max_token_length, NaN/Inf scores, NUL bytes in a piece, fewer than
259 tokens, byte pieces missing from ids 3..258 or "<0x..." pieces that
are not exactly two hex digits, and no " " piece (run.c's dummy prefix
needs it): one ModelFormatError line naming the file each.
"""
from __future__ import annotations

import codecs
import heapq
import math
import mmap
import os
import re
import struct

from ..errors import ModelFormatError
from ..formats.mapped import atomic_write, map_file
from .greedy import PieceTable, text_to_bytes

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_OFFSET = 3  # run.c: "the first 3 vocab elements are <unk>, <s>, </s>"
N_BYTES = 256
MIN_VOCAB = BYTE_OFFSET + N_BYTES
BOS_PIECE = b"\n<s>\n"  # what llama2.c's tokenizer.py writes for BOS and EOS
EOS_PIECE = b"\n</s>\n"
SPACE = b" "
META_SPACE = "\u2581".encode()
MERGE_FLOOR = -1e10  # run.c: best_score starts at -1e10 (exact in f32); only scores above it merge
_I32 = struct.Struct("<i")
_RECORD = struct.Struct("<fi")  # score, len
_HEX_PIECE = re.compile(rb"<0x([0-9A-F]{2})>")
F32_MAX = 3.4028234663852886e38


def read_tokenizer_bin(path, vocab_size: int | None = None) -> tuple[list[bytes], list[float], int]:
    """``(pieces, scores, max_token_length)`` of a tokenizer.bin file, read to
    its end; with ``vocab_size`` the token count must equal it. Raises
    ModelFormatError for a missing or malformed file (see the module docstring)."""
    name = os.fspath(path)
    data = map_file(name, "tokenizer.bin", _I32.size)  # a wrong file is refused at its first bad record
    try:
        return _parse(name, data, vocab_size)
    finally:
        data.close()


def _parse(name: str, data: mmap.mmap, vocab_size: int | None) -> tuple[list[bytes], list[float], int]:
    (max_len,) = _I32.unpack_from(data, 0)
    if max_len < 1:
        raise ModelFormatError(f"{name}: max_token_length: found {max_len}, must be > 0")
    pieces: list[bytes] = []
    scores: list[float] = []
    at, end = _I32.size, len(data)
    while at < end:
        i = len(pieces)
        if end - at < _RECORD.size:
            raise ModelFormatError(f"{name}: token {i}: truncated record at offset {at} ({end - at} bytes "
                                   f"left, a record starts with {_RECORD.size})")
        score, n = _RECORD.unpack_from(data, at)
        if not math.isfinite(score):
            raise ModelFormatError(f"{name}: token {i}: score {score!r} at offset {at}, must be finite")
        if not 1 <= n <= max_len:
            raise ModelFormatError(f"{name}: token {i}: length {n} at offset {at + 4}, must be in "
                                   f"[1, max_token_length {max_len}]")
        at += _RECORD.size
        if end - at < n:
            raise ModelFormatError(f"{name}: token {i}: truncated piece at offset {at} ({end - at} bytes "
                                   f"left, length says {n})")
        pieces.append(data[at:at + n])
        scores.append(score)
        at += n
    if vocab_size is not None and len(pieces) != vocab_size:
        raise ModelFormatError(f"{name}: {len(pieces)} tokens, expected the model's vocab_size {vocab_size}")
    return pieces, scores, max_len


def write_tokenizer_bin(path, pieces: list[bytes], scores: list[float]) -> None:
    """Write ``pieces`` and ``scores`` as tokenizer.bin (max_token_length = the
    longest piece), as llama2.c's tokenizer.py does. The file appears at
    ``path`` only once complete. Raises ModelFormatError for unequal lists,
    an empty piece or a score that is not a finite f32."""
    name = os.fspath(path)
    if len(pieces) != len(scores) or not pieces:
        raise ModelFormatError(f"write {name}: {len(pieces)} pieces and {len(scores)} scores; need the "
                               f"same number, at least one")
    for i, (piece, score) in enumerate(zip(pieces, scores)):
        if not isinstance(piece, bytes) or not piece:
            raise ModelFormatError(f"write {name}: token {i}: piece {piece!r} must be non-empty bytes")
        if not (math.isfinite(score) and abs(score) <= F32_MAX):
            raise ModelFormatError(f"write {name}: token {i}: score {score!r} must be a finite f32")
    with atomic_write(name) as f:
        f.write(_I32.pack(max(len(p) for p in pieces)))
        for piece, score in zip(pieces, scores):
            f.write(_RECORD.pack(score, len(piece)))
            f.write(piece)


def sentencepiece_to_llama2c(pieces: list[bytes], bos_id: int, eos_id: int) -> list[bytes]:
    """A SentencePiece vocab's pieces as llama2.c's tokenizer.py exports
    them: BOS -> "\\n<s>\\n", EOS -> "\\n</s>\\n", every U+2581 -> " ";
    "<0xHH>" byte pieces and the rest as they are."""
    out = []
    for i, piece in enumerate(pieces):
        if i == bos_id:
            piece = BOS_PIECE
        elif i == eos_id:
            piece = EOS_PIECE
        out.append(piece.replace(META_SPACE, SPACE))
    return out


def export_gguf_vocab(gguf_path, out_path) -> None:
    """Write the SentencePiece vocab of a GGUF model (tokenizer.ggml.model
    "llama") as tokenizer.bin; ModelFormatError if it has another kind."""
    from ..formats.gguf_reader import parse_gguf
    from .sp import read_gguf_vocab

    name = os.fspath(gguf_path)
    kind = parse_gguf(name).value("tokenizer.ggml.model")  # the map closes with the parsed file
    if kind != "llama":
        raise ModelFormatError(f"{name}: tokenizer.ggml.model = {kind!r}; only a SentencePiece vocab "
                               f"(\"llama\") maps to llama2.c's tokenizer.bin")
    pieces, scores, _, special = read_gguf_vocab(gguf_path)
    for key in ("bos", "eos"):
        if key not in special:
            raise ModelFormatError(f"{name}: tokenizer.ggml.{key}_token_id missing")
    write_tokenizer_bin(out_path, sentencepiece_to_llama2c(pieces, special["bos"], special["eos"]), scores)


class Llama2cTokenizer(PieceTable):
    """run.c's BPE tokenizer over a tokenizer.bin vocab (see the module
    docstring). Offers what every gemma-cy tokenizer offers: ``encode``
    (no BOS), ``decode``, ``decode_bytes``, ``piece_bytes``,
    ``stream_decoder``, ``token_id``, ``is_control``, ``vocab_size``,
    ``bos_id``, ``eos_id``, ``unk_id``; and ``encode_run_c`` with run.c's
    own BOS/EOS flags."""

    def __init__(self, pieces: list[bytes], scores: list[float], max_token_length: int,
                 source: str = "") -> None:
        where = source or "tokenizer.bin"
        n = len(pieces)
        if n < MIN_VOCAB or len(scores) != n:
            raise ModelFormatError(f"{where}: {n} tokens and {len(scores)} scores; llama2.c needs equal "
                                   f"counts of at least {MIN_VOCAB} (<unk>, BOS, EOS, then 256 byte pieces)")
        for i, piece in enumerate(pieces):
            if b"\0" in piece:
                raise ModelFormatError(f"{where}: token {i}: piece {piece[:32]!r} holds a NUL byte "
                                       f"(run.c's pieces are C strings)")
            byte_id = i - BYTE_OFFSET
            if 0 <= byte_id < N_BYTES:
                if piece != b"<0x%02X>" % byte_id:
                    raise ModelFormatError(f"{where}: token {i}: piece {piece[:32]!r}, expected the byte "
                                           f"piece <0x{byte_id:02X}> (run.c's byte fallback is byte + 3)")
            elif piece.startswith(b"<0x") and _HEX_PIECE.fullmatch(piece) is None:
                raise ModelFormatError(f"{where}: token {i}: piece {piece[:32]!r} looks like a byte piece "
                                       f"but is not <0xHH> with two upper-case hex digits")
            elif _HEX_PIECE.fullmatch(piece):
                raise ModelFormatError(f"{where}: token {i}: byte piece {piece!r} duplicates token "
                                       f"{int(piece[3:5], 16) + BYTE_OFFSET}")
        self.source = source
        self.vocab_size = n
        self.max_token_length = max_token_length
        self.bos_id = BOS_ID
        self.eos_id = EOS_ID
        self.unk_id = UNK_ID
        self.pieces = list(pieces)
        self.scores = [float(s) for s in scores]
        self._control = [i in (UNK_ID, BOS_ID, EOS_ID) for i in range(n)]
        self._ids: dict[bytes, int] = {}
        for i, piece in enumerate(pieces):
            self._ids.setdefault(piece, i)
        self._out = [b"" if self._control[i] else
                     bytes([i - BYTE_OFFSET]) if i < MIN_VOCAB else piece for i, piece in enumerate(pieces)]
        # after BOS, run.c drops a leading " " of the piece (not of a byte piece's byte)
        self._out_after_bos = [out[1:] if pieces[i].startswith(SPACE) and not self._control[i] else out
                               for i, out in enumerate(self._out)]
        self._space_id = self._ids.get(SPACE)
        if self._space_id is None:
            raise ModelFormatError(f"{where}: no \" \" piece; run.c's encoder prepends it (the dummy prefix)")

    @classmethod
    def from_file(cls, path, vocab_size: int | None = None) -> Llama2cTokenizer:
        """Load a tokenizer.bin file (see ``read_tokenizer_bin``)."""
        name = os.fspath(path)
        pieces, scores, max_len = read_tokenizer_bin(name, vocab_size)
        return cls(pieces, scores, max_len, source=name)

    def encode(self, text: str | bytes, parse_special: bool = False) -> list[int]:
        """run.c's ``encode`` without BOS or EOS. llama2.c has no special
        pieces to parse: ``parse_special`` changes nothing."""
        return self.encode_run_c(text, bos=False, eos=False)

    def encode_run_c(self, text: str | bytes, bos: bool = True, eos: bool = False) -> list[int]:
        """run.c's ``encode(t, text, bos, eos, ...)`` (module docstring), the
        BOS taking part in the merges as in run.c."""
        data = text_to_bytes(text)
        ids = [BOS_ID] if bos else []
        if data:
            ids.append(self._space_id)
        lookup = self._ids
        i, n = 0, len(data)
        while i < n:
            j = i + 1
            while j < n and j - i < 4 and data[j] & 0xC0 == 0x80:
                j += 1
            token = lookup.get(data[i:j])
            if token is not None:
                ids.append(token)
            else:
                ids.extend(b + BYTE_OFFSET for b in data[i:j])
            i = j
        ids = self._merge(ids)
        if eos:
            ids.append(EOS_ID)
        return ids

    def _merge(self, ids: list[int]) -> list[int]:
        """run.c's merge loop: the best-scoring mergeable pair first, the
        leftmost on ties, until none is left; a heap of (-score, left index)
        over a linked list of the surviving tokens."""
        n = len(ids)
        if n < 2:
            return ids
        tok = list(ids)
        nxt = list(range(1, n + 1))  # index of the next surviving token (n: none)
        prv = list(range(-1, n - 1))
        alive = [True] * n
        pieces, lookup, scores = self.pieces, self._ids, self.scores

        def candidate(i: int) -> tuple[float, int, int, int, int] | None:
            """The heap entry of the pair (i, next of i), if it merges."""
            j = nxt[i]
            if j < n:
                merged = lookup.get(pieces[tok[i]] + pieces[tok[j]])
                if merged is not None and scores[merged] > MERGE_FLOOR:
                    return (-scores[merged], i, merged, tok[i], tok[j])
            return None

        heap = [e for e in map(candidate, range(n - 1)) if e is not None]
        heapq.heapify(heap)
        while heap:
            _, i, merged, left, right = heapq.heappop(heap)
            j = nxt[i]
            if not alive[i] or j >= n or tok[i] != left or tok[j] != right:
                continue  # stale: a neighbour merged since this pair was pushed
            tok[i] = merged
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            for k in (prv[i], i):
                entry = candidate(k) if k >= 0 else None
                if entry is not None:
                    heapq.heappush(heap, entry)
        return [tok[i] for i in range(n) if alive[i]]

    def decode_bytes(self, ids, prev_id: int | None = None) -> bytes:
        """The bytes of ``ids`` as run.c prints them: a leading " " dropped
        right after BOS (``prev_id`` is the id before the first one, if any)."""
        parts = []
        for token_id in ids:
            token = self._check_id(token_id)
            parts.append((self._out_after_bos if prev_id == BOS_ID else self._out)[token])
            prev_id = token
        return b"".join(parts)

    def stream_decoder(self, prev_id: int | None = None) -> Llama2cStreamDecoder:
        """A decoder fed one id at a time that never splits a character;
        ``prev_id`` is the id before the first one pushed (e.g. the prompt's
        last), which decides whether the first piece's leading space goes."""
        return Llama2cStreamDecoder(self, prev_id)


class Llama2cStreamDecoder:
    """Incremental ``Llama2cTokenizer.decode``: holds an incomplete UTF-8
    tail; concatenating every ``push`` and ``flush()`` gives ``decode``."""

    def __init__(self, tokenizer: Llama2cTokenizer, prev_id: int | None = None) -> None:
        self._tokenizer = tokenizer
        self._prev = prev_id
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (maybe "")."""
        data = self._tokenizer.decode_bytes([token_id], self._prev)
        self._prev = token_id
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End the stream: return the held-back tail (as U+FFFD) and reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
