"""A vocabulary as a constraint library reads it: every id's bytes.

llguidance (docs/structured_output.md#the-vocabulary) computes a grammar's
token mask from the bytes each id stands for, so one table serves every
tokenizer gemma-cy has (SentencePiece, byte-level BPE, llama2.c's): an
ordinary id is what it decodes to (``piece_bytes``: a byte piece its byte,
``▁`` a space, a GPT-2 byte character its byte); a control or unknown id,
which decodes to nothing, is its spelling behind the marker byte 0xFF,
llguidance's sign for a special token (no grammar can produce it, since
0xFF never occurs in UTF-8; for the same reason the byte piece <0xFF>,
which is the lone byte 0xFF, can never be allowed by a grammar over text).
"""
from __future__ import annotations

import hashlib

SPECIAL_MARK = b"\xff"


def token_bytes(tokenizer) -> list[bytes]:
    """Id -> bytes for ``tokenizer`` (a ``PieceTable``), special ids marked."""
    spelled = tokenizer.control_spellings()
    out = tokenizer.all_piece_bytes()
    for tid, data in enumerate(out):
        if not data or tokenizer.is_control(tid):
            out[tid] = SPECIAL_MARK + spelled.get(tid, f"<special_{tid}>".encode())
    return out


def vocabulary_digest(tokenizer) -> bytes:
    """A BLAKE2b digest of ``token_bytes(tokenizer)`` (each id's bytes,
    length-prefixed): equal for two vocabularies that give every id the
    same bytes. A digest, not the table: Gemma's is 262,144 byte strings."""
    h = hashlib.blake2b(digest_size=32)
    for piece in token_bytes(tokenizer):
        h.update(len(piece).to_bytes(4, "little") + piece)
    return h.digest()
