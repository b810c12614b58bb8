"""The GMT1 tokenizer: greedy longest match over raw UTF-8 bytes (docs/formats.md#gmt1-tokenizer).

Engine-agnostic: it maps text to ids and ids to text, nothing else.

Encoding works on bytes. A ``str`` is turned into bytes by ``text_to_bytes``:
plain UTF-8, except for lone surrogates, which no UTF-8 encoder accepts:

* U+DC80..U+DCFF become the raw byte 0x80..0xFF. This is Python's
  ``surrogateescape`` convention, the way ``sys.argv`` and ``os.fsdecode``
  carry bytes that are not valid UTF-8, so a prompt given on the command line
  reaches the tokenizer as exactly the bytes the user typed (as in the seed).
* Any other lone surrogate becomes its 3-byte form (``surrogatepass``,
  ED A0 80 for U+D800).

Either way the result is not valid UTF-8: it is tokenized through byte
pieces and decodes to U+FFFD, like any other invalid byte sequence. Text
without lone surrogates round-trips exactly: ``decode(encode(t)) == t``.
"""
from __future__ import annotations

import codecs
import operator
import os
import re

from ..errors import TokenIndexError
from ..formats.gmt import PIECE_CONTROL, Vocab, read_gmt

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_LEAF: dict = {}  # shared, never mutated: the children of every trie leaf


_INVALID_RUN = re.compile("[\udc80-\udcff]+")  # bytes that are not UTF-8, after surrogateescape


def encode_utf8_runs(data: bytes, encode, byte_id) -> list[int]:
    """Ids of ``data`` whose UTF-8 runs go to ``encode(str)`` and whose bytes
    that are not UTF-8 each become ``byte_id(b)`` (the byte-fallback
    vocabularies: SentencePiece, Gemma 4's BPE), in order."""
    if not data:
        return []
    try:
        return encode(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8", "surrogateescape")
    ids: list[int] = []
    done = 0
    for m in _INVALID_RUN.finditer(text):
        if m.start() > done:
            ids += encode(text[done:m.start()])
        ids += [byte_id(ord(c) - 0xDC00) for c in m.group()]
        done = m.end()
    if done < len(text):
        ids += encode(text[done:])
    return ids


def text_to_bytes(text: str | bytes | bytearray | memoryview) -> bytes:
    """The bytes ``encode`` tokenizes (see the module docstring for ``str``)."""
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return _encode_with_surrogates(text)
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError(f"text must be str or bytes, not {type(text).__name__}")


def _encode_with_surrogates(text: str) -> bytes:
    out = bytearray()
    start = 0
    for m in _LONE_SURROGATE.finditer(text):
        out += text[start:m.start()].encode("utf-8")
        code = ord(m.group())
        if 0xDC80 <= code <= 0xDCFF:
            out.append(code - 0xDC00)
        else:
            out += m.group().encode("utf-8", "surrogatepass")
        start = m.end()
    out += text[start:].encode("utf-8")
    return bytes(out)


def _build_trie(entries: list[tuple[bytes, int]]) -> dict:
    """A byte trie: ``{byte: [id or -1, children]}``, nested.

    ``entries`` are (piece, id) in ascending id, so on a duplicated piece the
    first id wins. Leaves share one empty dict until they get a child, which
    keeps a 262k-piece trie small. Empty pieces can never match: skipped.
    """
    root: dict = {}
    for piece, token in entries:
        node = root
        last = len(piece) - 1
        for k, byte in enumerate(piece):
            child = node.get(byte)
            if child is None:
                child = node[byte] = [-1, _LEAF]
            if k == last:
                if child[0] < 0:
                    child[0] = token
            else:
                if child[1] is _LEAF:
                    child[1] = {}
                node = child[1]
    return root


def _longest_match(root: dict, data: bytes, start: int) -> tuple[int, int]:
    """(id, end) of the longest piece in ``root`` at ``data[start:]``; (-1, start) if none."""
    best_id, best_end = -1, start
    node = root
    j, n = start, len(data)
    while j < n:
        child = node.get(data[j])
        if child is None:
            break
        j += 1
        token, node = child
        if token >= 0:
            best_id, best_end = token, j
    return best_id, best_end


class SpecialPieces:
    """The control pieces a text may spell out (``<start_of_turn>``,
    ``<|im_end|>``...): ``split(data, encode_plain)`` encodes ``data`` with
    each of them (leftmost, longest first) as its id and the text between
    them by ``encode_plain``. Shared by the GGUF tokenizers."""

    def __init__(self, entries: list[tuple[bytes, int]]) -> None:
        self.trie = _build_trie(entries)
        first = sorted({piece[0] for piece, _ in entries if piece})
        # a quick scan for the bytes a control piece can start with
        self.start = re.compile(b"[" + b"".join(re.escape(bytes([b])) for b in first) + b"]") if first else None

    def split(self, data: bytes, encode_plain) -> list[int]:
        if self.start is None:
            return encode_plain(data)
        ids: list[int] = []
        done = 0
        for m in self.start.finditer(data):
            start = m.start()
            if start < done:
                continue
            token, end = _longest_match(self.trie, data, start)
            if token < 0:
                continue
            ids += encode_plain(data[done:start])
            ids.append(token)
            done = end
        ids += encode_plain(data[done:])
        return ids


class AddedTokens:
    """The tokens a vocabulary matches whole before its own encoding (HF's
    added tokens): ``always`` in any text (USER_DEFINED), ``special`` only
    with special parsing (control tokens), each a list of (spelling, id).
    ``split(data, parse_special, encode_plain)`` encodes ``data`` with them;
    ``control_pieces`` are the special ones' spellings, longest first (what a
    chat message's content may not smuggle in). Shared by the byte-level and
    Gemma 4 BPE tokenizers."""

    def __init__(self, always: list[tuple[bytes, int]], special: list[tuple[bytes, int]]) -> None:
        self.control_pieces = tuple(sorted({p.decode() for p, _ in special}, key=lambda p: (-len(p), p)))
        self._always = SpecialPieces(always)
        self._parsed = SpecialPieces(always + special)

    def split(self, data: bytes, parse_special: bool, encode_plain) -> list[int]:
        return (self._parsed if parse_special else self._always).split(data, encode_plain)


class PieceTable:
    """What every tokenizer shares once its pieces are known: id checks and
    decoding. A subclass sets ``vocab_size``, ``_out`` (id -> the bytes it
    decodes to, b"" for control tokens), ``_ids`` (piece -> first id) and
    ``_control`` (id -> bool); it may override ``add_bos`` (does the model
    expect BOS before a prompt?) and ``chat_template`` (the model file's
    Jinja chat template, see ``gemma_cy.tokenizers.chat``)."""

    add_bos: bool = True
    chat_template: str | None = None
    vocab_size: int
    _out: list[bytes]
    _ids: dict[bytes, int]
    _control: list[bool]

    def _check_id(self, token_id) -> int:
        try:
            token = operator.index(token_id)
        except TypeError:
            raise TypeError(f"token id must be an integer, not {type(token_id).__name__}") from None
        if not 0 <= token < self.vocab_size:
            raise TokenIndexError(f"token id {token} out of range [0, vocab_size {self.vocab_size})")
        return token

    def piece_bytes(self, token_id: int) -> bytes:
        """What one id decodes to, as bytes (b"" for a control token)."""
        return self._out[self._check_id(token_id)]

    def all_piece_bytes(self) -> list[bytes]:
        """``piece_bytes`` of every id, in id order."""
        return list(self._out)

    def decode_bytes(self, ids) -> bytes:
        """The pieces of ``ids`` concatenated; control tokens give nothing."""
        out = self._out
        n = self.vocab_size
        parts = []
        for token_id in ids:
            if type(token_id) is not int or not 0 <= token_id < n:
                token_id = self._check_id(token_id)
            parts.append(out[token_id])
        return b"".join(parts)

    def decode(self, ids) -> str:
        """``decode_bytes(ids)`` as text; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", "replace")

    def stream_decoder(self, prev_id: int | None = None) -> StreamDecoder:
        """A decoder fed one id at a time that never splits a character.
        ``prev_id``, the id before the first one pushed, does not change the
        text here (llama2.c's tokenizer drops a leading space after BOS)."""
        return StreamDecoder(self)

    def token_id(self, piece: str | bytes) -> int | None:
        """Id of the piece exactly equal to ``piece`` (first one; as the file
        spells it), or None."""
        return self._ids.get(text_to_bytes(piece))

    def is_control(self, token_id: int) -> bool:
        """True if ``token_id`` is a control token (decodes to nothing)."""
        return self._control[self._check_id(token_id)]

    def spelling(self, token_id: int) -> str:
        """How the vocabulary spells ``token_id``: a control token's piece
        (one whose first id it is), else the text it decodes to."""
        for piece in self.control_pieces():
            if self.token_id(piece) == token_id:
                return piece
        return self.decode([token_id])

    def control_spellings(self) -> dict[int, bytes]:
        """Control id -> its piece as the file spells it (where it has one)."""
        control = self._control
        return {i: p for p, i in self._ids.items() if control[i] and p}

    def control_pieces(self) -> tuple[str, ...]:
        """The control pieces' spellings (``<eos>``, ``<start_of_turn>``...),
        longest first: what special parsing matches in a text."""
        cached = getattr(self, "_control_pieces", None)
        if cached is None:
            control = self._control
            found = {p.decode("utf-8", "replace") for p, i in self._ids.items() if control[i] and p}
            cached = self._control_pieces = tuple(sorted(found, key=lambda p: (-len(p), p)))
        return cached


class GreedyTokenizer(PieceTable):
    """Greedy longest-match tokenizer over a ``Vocab`` (the seed's algorithm).

    Control pieces (``<eos>``, ``<start_of_turn>``...) are matched only with
    ``parse_special=True``; user text is encoded with it off, so a typed
    ``<eos>`` stays plain text (docs/errors.md#case-20).
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.vocab_size = vocab.vocab_size
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.unk_id = vocab.unk_id
        self.pad_id = vocab.pad_id
        self._control = [t == PIECE_CONTROL for t in vocab.types]
        # What each id decodes to: control pieces give nothing; a byte piece
        # is the byte itself, so every other piece is just its bytes.
        self._out = [b"" if c else p for p, c in zip(vocab.pieces, self._control)]
        self._trie = _build_trie([(p, i) for i, (p, c) in enumerate(zip(vocab.pieces, self._control)) if not c])
        self._special_trie = _build_trie([(p, i) for i, (p, c) in enumerate(zip(vocab.pieces, self._control)) if c])
        self._ids: dict[bytes, int] = {}
        for i, p in enumerate(vocab.pieces):
            self._ids.setdefault(p, i)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> GreedyTokenizer:
        """Load a GMT1 file (see ``gemma_cy.formats.gmt.read_gmt``)."""
        return cls(read_gmt(path))

    def encode(self, text: str | bytes, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``: no normalization, no dummy space, no BOS.

        At each byte position the longest matching piece wins (on equal
        pieces the lowest id). Byte pieces are pieces of length 1, so the
        byte fallback is part of the same match; a byte with no piece at all
        gives ``unk_id`` and the next position is the next byte.
        """
        data = text_to_bytes(text)
        trie = self._trie
        special = self._special_trie if parse_special else {}
        unk = self.unk_id
        ids: list[int] = []
        append = ids.append
        i, n = 0, len(data)
        while i < n:
            token, end = _longest_match(trie, data, i)
            if data[i] in special:
                s_token, s_end = _longest_match(special, data, i)
                if s_end > end or (s_end == end and s_token < token):
                    token, end = s_token, s_end
            if token < 0:
                append(unk)
                i += 1
            else:
                append(token)
                i = end
        return ids


class StreamDecoder:
    """Incremental ``decode``: text is released once its characters are whole.

    ``push`` holds back a tail that is an incomplete UTF-8 sequence and may
    still be completed; anything that can no longer be valid becomes U+FFFD
    at once, as whole-text decoding would make it. Concatenating every
    ``push`` result and ``flush()`` gives ``decode`` of all the ids.
    """

    def __init__(self, tokenizer: GreedyTokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (maybe "")."""
        return self._utf8.decode(self._tokenizer.piece_bytes(token_id))

    def flush(self) -> str:
        """End the stream: return the held-back tail (as U+FFFD) and reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
