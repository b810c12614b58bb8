"""GMT1 v1: the seed engine's tokenizer file (docs/formats.md#gmt1-tokenizer). Reads and writes it.

Layout (little-endian):

    header, 48 bytes: magic "GMT1" | u32 version = 1 | u32 vocab_size |
                      u32 bos_id | u32 eos_id | u32 unk_id | u32 pad_id |
                      20 reserved zero bytes
    vocab_size entries, back to back: u32 len | u32 type | f32 score | len bytes

Type 0 is a normal piece, 1 a byte piece (the piece is the one raw byte it
stands for), 2 a control piece. Nothing after the last entry.
"""
from __future__ import annotations

import math
import numbers
import operator
import os
import struct
from dataclasses import dataclass

from ..errors import ModelFormatError

MAGIC = b"GMT1"
VERSION = 1
HEADER = struct.Struct("<4s6I20s")  # magic, version, vocab_size, bos, eos, unk, pad, reserved
ENTRY = struct.Struct("<IIf")  # len, type, score; the piece's bytes follow

PIECE_NORMAL = 0
PIECE_BYTE = 1
PIECE_CONTROL = 2
PIECE_TYPES = (PIECE_NORMAL, PIECE_BYTE, PIECE_CONTROL)

F32_MAX = 3.4028234663852886e38  # largest finite binary32: a score must fit


@dataclass(frozen=True)
class Vocab:
    """A tokenizer's pieces and special ids, as every tokenizer format gives.

    Entry ``i`` is ``pieces[i]`` (raw bytes), ``types[i]`` (PIECE_*) and
    ``scores[i]``. Building one checks every rule of docs/formats.md#gmt1-tokenizer, so a ``Vocab``
    that exists is valid; ``source`` names the file in messages.
    """

    pieces: list[bytes]
    types: list[int]
    scores: list[float]
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "vocab"
        n = len(self.pieces)
        if n == 0:
            raise ModelFormatError(f"{where}: vocab_size is 0, must be > 0")
        if n > 0xFFFFFFFF:
            raise ModelFormatError(f"{where}: vocab_size {n} exceeds the u32 limit {0xFFFFFFFF}")
        if len(self.types) != n or len(self.scores) != n:
            raise ModelFormatError(
                f"{where}: {len(self.types)} types and {len(self.scores)} scores "
                f"for {n} pieces; each must equal vocab_size {n}"
            )
        for name in ("bos_id", "eos_id", "unk_id", "pad_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < n:
                raise ModelFormatError(f"{where}: {name} {value!r} must be in [0, vocab_size {n})")
        for i, (piece, ptype, score) in enumerate(zip(self.pieces, self.types, self.scores)):
            if not isinstance(piece, bytes):
                raise ModelFormatError(f"{where}: entry {i}: piece is {type(piece).__name__}, must be bytes")
            if not _is_int(ptype) or ptype not in PIECE_TYPES:
                raise ModelFormatError(f"{where}: entry {i}: type {ptype!r} unknown, must be one of {PIECE_TYPES}")
            if ptype == PIECE_BYTE and len(piece) != 1:
                raise ModelFormatError(
                    f"{where}: entry {i}: byte piece {piece[:16]!r} is {len(piece)} bytes, must be exactly 1"
                )
            if not _is_finite_f32(score):
                raise ModelFormatError(f"{where}: entry {i}: score {score!r} must be a finite f32")

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)


def _is_int(value) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _is_finite_f32(value) -> bool:
    """A real number (not a bool, not text that float() would parse) that fits a finite f32."""
    if isinstance(value, (str, bytes, bytearray, bool)) or not isinstance(value, numbers.Real):
        return False
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(x) and abs(x) <= F32_MAX


def read_gmt(path: str | os.PathLike) -> Vocab:
    """Read and validate a GMT1 v1 file; raise ModelFormatError on any flaw."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFormatError(f"{name}: cannot read tokenizer file: {e.strerror or e}") from None

    if len(data) < HEADER.size:
        raise ModelFormatError(f"{name}: truncated header: {len(data)} bytes, GMT1 header needs {HEADER.size}")
    magic, version, vocab_size, bos_id, eos_id, unk_id, pad_id, reserved = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ModelFormatError(f"{name}: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ModelFormatError(f"{name}: version {version}, expected {VERSION}")
    if reserved != bytes(len(reserved)):
        raise ModelFormatError(f"{name}: reserved header bytes 28..47 are {reserved.hex()}, must be all zero")
    body = len(data) - HEADER.size
    if vocab_size == 0:
        raise ModelFormatError(f"{name}: vocab_size is 0, must be > 0")
    # Each entry takes at least ENTRY.size bytes: a count the file cannot hold
    # is rejected before any loop or allocation depends on it.
    if vocab_size * ENTRY.size > body:
        raise ModelFormatError(
            f"{name}: vocab_size {vocab_size} needs at least {vocab_size * ENTRY.size} bytes "
            f"of entries, file has {body}"
        )
    for field_name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("unk_id", unk_id), ("pad_id", pad_id)):
        if value >= vocab_size:
            raise ModelFormatError(f"{name}: {field_name} {value} must be < vocab_size {vocab_size}")

    pieces: list[bytes] = []
    types: list[int] = []
    scores: list[float] = []
    offset = HEADER.size
    end = len(data)
    unpack_entry = ENTRY.unpack_from
    for i in range(vocab_size):
        if end - offset < ENTRY.size:
            raise ModelFormatError(
                f"{name}: entry {i} of vocab_size {vocab_size} at offset {offset}: truncated, "
                f"needs {ENTRY.size} bytes, {end - offset} left"
            )
        length, ptype, score = unpack_entry(data, offset)
        offset += ENTRY.size
        if length > end - offset:
            raise ModelFormatError(
                f"{name}: entry {i} at offset {offset - ENTRY.size}: piece length {length} "
                f"exceeds the {end - offset} bytes left"
            )
        pieces.append(data[offset:offset + length])
        types.append(ptype)
        scores.append(score)
        offset += length
    if offset != end:
        raise ModelFormatError(f"{name}: {end - offset} trailing bytes after entry {vocab_size - 1} (offset {offset})")
    return Vocab(pieces, types, scores, bos_id, eos_id, unk_id, pad_id, source=name)


def write_gmt(path: str | os.PathLike, vocab: Vocab) -> None:
    """Write ``vocab`` as a GMT1 v1 file (scores are stored as f32)."""
    out = [HEADER.pack(MAGIC, VERSION, vocab.vocab_size, vocab.bos_id, vocab.eos_id,
                       vocab.unk_id, vocab.pad_id, bytes(20))]
    pack_entry = ENTRY.pack
    for piece, ptype, score in zip(vocab.pieces, vocab.types, vocab.scores):
        out.append(pack_entry(len(piece), ptype, score))
        out.append(piece)
    with open(path, "wb") as f:
        f.write(b"".join(out))
