"""The SentencePiece tokenizer of real Gemma models, built from a GGUF vocab (docs/model.md#gemma-3).

A GGUF file carries no ``tokenizer.model``; it carries the pieces, their
scores and their types (``tokenizer.ggml.tokens/scores/token_type``). From
those this module builds the tables of a SentencePiece BPE model with
Gemma's settings, and ``sp_bpe`` encodes with them exactly as the
``sentencepiece`` package does for the equivalent ModelProto
(``build_model_proto``, which the tests hand to that package):

* model type BPE: repeatedly merge the adjacent pair whose joined piece has
  the highest score (leftmost on ties); byte fallback for characters no
  piece covers; digits are single pieces in the vocab, so they come out
  split one by one;
* normalizer "identity": no NFKC, no dummy prefix, extra whitespace kept,
  and every space written as U+2581 before matching;
* user-defined pieces (newline, tab and space runs, HTML tags) are matched
  whole, longest first, and never merged further. llama.cpp's converter
  stores the space runs with real spaces ("  "); SentencePiece matches
  after spaces became U+2581, so they are spelled "\u2581\u2581".

A vocabulary SentencePiece would refuse is refused here too (each rule in
``_spell_checked``), naming the token.

Two things differ on purpose from running SentencePiece on the raw text:

* Bytes that are not valid UTF-8 (see ``greedy.text_to_bytes``) become
  their byte pieces, so ``decode_bytes(encode(b)) == b`` for any bytes;
  SentencePiece itself would turn each into U+FFFD.
* Control pieces (``<bos>``, ``<start_of_turn>``...) typed in the text are
  plain text unless ``parse_special=True`` (docs/errors.md#case-20).

The GGUF's settings apply (docs/model.md#tokenizer-settings):
``tokenizer.ggml.add_space_prefix`` (absent: true, llama.cpp's default for
a "llama" vocabulary; Gemma's files say false) prepends a space to the
text, and to each stretch of text after a control piece with
``parse_special``, as llama.cpp does, and decoding drops the first
piece's leading space at the start of a text (after BOS), as
SentencePiece does; ``add_bos_token`` (absent: true) and
``add_eos_token`` (absent: false) say what ``Model.tokenize`` adds.

Decoding turns U+2581 back into a space, a byte piece into its byte, and a
control or unknown piece into nothing. Text with a literal U+2581 therefore
decodes with a space there (as in every SentencePiece Gemma tokenizer).
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence

import numpy as np

from ..errors import ModelFormatError
from . import sp_cache
from .chat import template_from_gguf
from .greedy import PieceTable, SpecialPieces, StreamDecoder, encode_utf8_runs, text_to_bytes
from .sp_bpe import BPEVocab, SentencePieceBPE
from .sp_tables import PackedPieces, VocabTables, build_index

# GGUF token types (llama.cpp's llama_token_type), the same numbers as
# SentencePiece's ModelProto.SentencePiece.Type.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6
TOKEN_TYPES = (TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE)

SPACE = b" "
META_SPACE = "\u2581".encode()  # SentencePiece's visible space
_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
F32_MAX = 3.4028234663852886e38
MAX_PIECE_BYTES = 7999  # SentencePiece refuses longer pieces

# The GGUF keys of the special ids; bos, eos and unk must be present.
SPECIAL_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


def _vocab_fields(gf) -> tuple[object, np.ndarray, np.ndarray, dict[str, int]]:
    """``(tokens, scores, types, special ids)`` of a parsed GGUF file, each of
    the type the vocabulary needs (``tokens`` a StringArray, ``scores`` and
    ``types`` NumPy views of the file), or ModelFormatError naming the key."""
    from ..formats import gguf_reader

    name = gf.path

    def array(key: str, item_types: tuple[int, ...]):
        field = gf.fields.get(key)
        if field is None:
            raise ModelFormatError(f"{name}: metadata key {key} missing; a SentencePiece vocab needs it")
        if field.type != gguf_reader.ARRAY or field.item_type not in item_types:
            found = gguf_reader.VALUE_TYPE_NAMES[field.type] if field.type < len(gguf_reader.VALUE_TYPE_NAMES) else field.type
            raise ModelFormatError(f"{name}: metadata key {key} has type {found}, must be an array of "
                                   f"{' or '.join(gguf_reader.VALUE_TYPE_NAMES[t] for t in item_types)}")
        return field.value

    tokens = array("tokenizer.ggml.tokens", (gguf_reader.STRING,))
    scores = array("tokenizer.ggml.scores", gguf_reader.FLOAT_TYPES)
    types = array("tokenizer.ggml.token_type", gguf_reader.INTEGER_TYPES)
    special = {}
    for short, key in SPECIAL_KEYS.items():
        value = gf.value(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ModelFormatError(f"{name}: {key} = {value!r}, must be an integer id")
            special[short] = value
    return tokens, scores, types, special


def read_gguf_vocab(path) -> tuple[list[bytes], list[float], list[int], dict[str, int]]:
    """``(pieces, scores, types, special ids)`` from a GGUF file's metadata
    (``path``, or the file already parsed: a ``GGUFFile``).

    The special ids dict maps "bos", "eos", "unk", "pad" to the ids the file
    gives (keys it lacks are left out). The file is parsed and validated by
    gemma_cy.formats.gguf; the vocabulary's own rules are checked by
    ``SentencePieceTokenizer``.
    """
    from ..formats import gguf_reader

    gf = path if isinstance(path, gguf_reader.GGUFFile) else gguf_reader.parse_gguf(path)
    tokens, scores, types, special = _vocab_fields(gf)
    return tokens.raw_list(), [float(x) for x in scores], [int(x) for x in types], special


def _cached_tables(gf) -> tuple[str | None, VocabTables | None]:
    """(the cache key of ``gf``'s vocabulary, or None when it is too small to
    cache; its tables from the cache, or None)."""
    tokens, scores, types, special = _vocab_fields(gf)
    n = len(tokens)
    if n < sp_cache.CACHE_MIN_PIECES or len(scores) != n or len(types) != n \
            or any(short not in special for short in ("bos", "eos", "unk")):
        return None, None  # small, or the checks of the build must speak
    ids = (special["bos"], special["eos"], special["unk"], special.get("pad"))
    key = sp_cache.cache_key(tokens, scores, types, ids)
    return key, sp_cache.load(key, n)


def _special_ids(gf) -> tuple[int, int, int, int]:
    """(bos, eos, unk, pad) of a vocabulary with bos, eos and unk ids (their
    range is build_tables' check); pad defaults to unk."""
    special = _vocab_fields(gf)[3]
    return special["bos"], special["eos"], special["unk"], special.get("pad", special["unk"])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _field_int(number: int, value: int) -> bytes:
    """A varint protobuf field (wire type 0); negative ints as 10-byte two's complement."""
    return _varint(number << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)


def build_model_proto(pieces: list[bytes], scores: list[float], types: list[int], unk_id: int,
                      bos_id: int, eos_id: int, pad_id: int) -> bytes:
    """A serialized SentencePiece ``ModelProto`` (BPE) with Gemma's settings.

    ``pieces`` are as the proto must spell them (spaces already U+2581),
    ``types`` SentencePiece's enum. Field numbers are those of
    ``sentencepiece_model.proto``: ModelProto{pieces 1, trainer_spec 2,
    normalizer_spec 3}; SentencePiece{piece 1, score 2 (float), type 3}:
    keys 0x0a (field 1, length-delimited), 0x15 (field 2, fixed32) and 0x18
    (field 3, varint).
    """
    f32 = struct.Struct("<f").pack
    small = [bytes((v,)) for v in range(128)]  # one-byte varints, the common case
    parts = []
    for piece, score, ptype in zip(pieces, scores, types):
        size = len(piece)
        entry = (b"\x0a" + (small[size] if size < 128 else _varint(size)) + piece
                 + b"\x15" + f32(score) + b"\x18" + small[ptype])
        size = len(entry)
        parts.append(b"\x0a" + (small[size] if size < 128 else _varint(size)) + entry)
    has_bytes = TOKEN_BYTE in types
    trainer = b"".join([
        _field_int(3, 2),                  # model_type = BPE
        _field_int(4, len(pieces)),        # vocab_size
        _field_int(25, 1),                 # split_digits
        _field_int(26, 1),                 # allow_whitespace_only_pieces
        _field_int(35, int(has_bytes)),    # byte_fallback
        _field_int(40, unk_id),
        _field_int(41, bos_id),
        _field_int(42, eos_id),
        _field_int(43, pad_id),
        _field_bytes(45, pieces[unk_id]),  # unk_piece
        _field_bytes(46, pieces[bos_id]),  # bos_piece
        _field_bytes(47, pieces[eos_id]),  # eos_piece
        _field_bytes(48, pieces[pad_id]),  # pad_piece
    ])
    normalizer = b"".join([
        _field_bytes(1, b"identity"),      # name: no character map
        _field_int(3, 0),                  # add_dummy_prefix = false
        _field_int(4, 0),                  # remove_extra_whitespaces = false
        _field_int(5, 1),                  # escape_whitespaces: " " -> U+2581
    ])
    parts.append(_field_bytes(2, trainer))
    parts.append(_field_bytes(3, normalizer))
    return b"".join(parts)


def _spell_checked(pieces, scores, types, unk_id: int, where: str):
    """Check every token and spell it for the proto: (proto pieces, proto
    types, what each id decodes to, the id of each byte's piece); raises
    ModelFormatError naming the first token that breaks a rule."""
    n = len(pieces)
    sp_pieces: list[bytes] = []  # as the proto spells them
    sp_types: list[int] = []
    out: list[bytes] = []        # what each id decodes to
    byte_ids = [-1] * 256        # the id of each byte's piece
    first_of: dict[bytes, int] = {}
    for i in range(n):
        piece, score, ptype = pieces[i], scores[i], types[i]
        if not isinstance(piece, bytes):
            raise ModelFormatError(f"{where}: token {i}: piece is {type(piece).__name__}, must be bytes")
        if type(ptype) is not int or ptype not in TOKEN_TYPES:
            raise ModelFormatError(f"{where}: token {i} ({piece[:32]!r}): type {ptype!r} unknown, "
                                   f"must be one of {TOKEN_TYPES}")
        if not isinstance(score, (int, float)) or not math.isfinite(score) or abs(score) > F32_MAX:
            raise ModelFormatError(f"{where}: token {i} ({piece[:32]!r}): score {score!r} must be a finite f32")
        if not piece:
            raise ModelFormatError(f"{where}: token {i}: empty piece")
        if len(piece) > MAX_PIECE_BYTES:
            raise ModelFormatError(f"{where}: token {i} ({piece[:32]!r}...): {len(piece)} bytes, "
                                   f"SentencePiece's limit is {MAX_PIECE_BYTES}")
        if b"\x00" in piece:
            raise ModelFormatError(f"{where}: token {i}: piece {piece[:32]!r} holds a NUL byte")
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"{where}: token {i}: piece {piece[:32]!r} is not valid UTF-8") from None
        if i == unk_id:
            ptype = TOKEN_UNKNOWN  # llama.cpp's converter types <unk> CONTROL; SentencePiece needs UNKNOWN
        elif ptype == TOKEN_UNKNOWN:
            ptype = TOKEN_CONTROL  # another UNKNOWN (Phi-3's [PADn]): SentencePiece allows one
        spelled = piece
        if ptype == TOKEN_BYTE:
            m = _BYTE_PIECE.fullmatch(piece)
            if m is None:
                raise ModelFormatError(f"{where}: token {i}: byte piece {piece[:32]!r} must be <0xHH> "
                                       f"with exactly two hex digits")
            value = int(m.group(1), 16)
            if byte_ids[value] >= 0:
                raise ModelFormatError(f"{where}: token {i}: byte piece {piece!r} duplicates token "
                                       f"{byte_ids[value]}")
            byte_ids[value] = i
            spelled = b"<0x%02X>" % value
            out.append(bytes([value]))
        elif ptype in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            out.append(b"")
        else:
            if ptype == TOKEN_USER_DEFINED:
                spelled = piece.replace(SPACE, META_SPACE)
            out.append(piece.replace(META_SPACE, SPACE))
        if spelled in first_of:
            raise ModelFormatError(f"{where}: token {i} ({piece[:32]!r}) duplicates token {first_of[spelled]} "
                                   f"({pieces[first_of[spelled]][:32]!r})")
        first_of[spelled] = i
        sp_pieces.append(spelled)
        sp_types.append(ptype)
    missing = [b for b in range(256) if byte_ids[b] < 0]
    if 0 < len(missing) < 256:
        raise ModelFormatError(f"{where}: {256 - len(missing)} byte pieces, but byte fallback needs all 256 "
                               f"(<0x{missing[0]:02X}> is missing)")
    return sp_pieces, sp_types, out, byte_ids


def _spell_fast(pieces, scores, types, unk_id: int):
    """``_spell_checked``'s result by whole-vocabulary checks (a 262,144-token
    vocabulary in a fraction of its time), or None when any check fails."""
    n = len(pieces)
    if set(map(type, pieces)) != {bytes} or set(map(type, types)) != {int} or not set(types) <= set(TOKEN_TYPES):
        return None
    if min(map(len, pieces)) == 0 or max(map(len, pieces)) > MAX_PIECE_BYTES:
        return None
    try:
        score_values = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if score_values.shape != (n,) or not np.all(np.abs(score_values) <= F32_MAX):  # NaN fails too
        return None
    try:
        joined = b"\x00".join(pieces)
        joined.decode("utf-8")  # a bad sequence cannot borrow bytes across the NUL
    except UnicodeDecodeError:
        return None
    if joined.count(0) != n - 1:  # a piece holds a NUL
        return None
    sp_types = [TOKEN_CONTROL if t == TOKEN_UNKNOWN else t for t in types]  # _spell_checked's retyping
    sp_types[unk_id] = TOKEN_UNKNOWN
    sp_pieces = list(pieces)
    out = [p.replace(META_SPACE, SPACE) for p in pieces]
    byte_ids = [-1] * 256
    for i, ptype in enumerate(sp_types):
        if ptype == TOKEN_NORMAL:
            continue
        if ptype == TOKEN_BYTE:
            m = _BYTE_PIECE.fullmatch(pieces[i])
            if m is None or byte_ids[int(m.group(1), 16)] >= 0:
                return None
            value = int(m.group(1), 16)
            byte_ids[value] = i
            sp_pieces[i] = b"<0x%02X>" % value
            out[i] = bytes([value])
        elif ptype in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            out[i] = b""
        elif ptype == TOKEN_USER_DEFINED:
            sp_pieces[i] = pieces[i].replace(SPACE, META_SPACE)
    if len(set(sp_pieces)) != n or 0 < byte_ids.count(-1) < 256:
        return None
    return sp_pieces, sp_types, out, byte_ids


def build_tables(pieces: list[bytes], scores: list[float], types: list[int], bos_id: int, eos_id: int,
                 unk_id: int, pad_id: int | None = None, source: str = "") -> VocabTables:
    """Check a vocabulary (``ModelFormatError`` naming ``source``, the token
    and the rule it breaks) and build the tables a tokenizer runs from."""
    where = source or "vocab"
    n = len(pieces)
    if n == 0:
        raise ModelFormatError(f"{where}: vocab_size is 0, must be > 0")
    if n >= 2**31:
        raise ModelFormatError(f"{where}: vocab_size {n} exceeds SentencePiece's limit {2**31 - 1}")
    if len(scores) != n or len(types) != n:
        raise ModelFormatError(
            f"{where}: {len(scores)} scores and {len(types)} token types for {n} tokens; "
            f"each must equal vocab_size {n}")
    if pad_id is None:
        pad_id = unk_id
    for field, value in (("bos_id", bos_id), ("eos_id", eos_id), ("unk_id", unk_id), ("pad_id", pad_id)):
        if type(value) is not int or not 0 <= value < n:
            raise ModelFormatError(f"{where}: {field} {value!r} must be in [0, vocab_size {n})")

    spelled = _spell_fast(pieces, scores, types, unk_id)
    if spelled is None:  # some rule is broken: the careful pass names the token and the rule
        spelled = _spell_checked(pieces, scores, types, unk_id, where)
    sp_pieces, sp_types, _, byte_ids = spelled
    spelled_pieces = PackedPieces.pack(sp_pieces)
    return VocabTables(
        pieces=PackedPieces.pack(pieces), spelled=spelled_pieces,
        types=np.array(sp_types, np.int8), scores=np.array(scores, np.float32), index=build_index(spelled_pieces),
        byte_ids=np.array(byte_ids, np.int32))


class DecodedPieces(Sequence):
    """id -> the bytes it decodes to, worked out from the piece table when
    asked (no third copy of the vocabulary): nothing for a control or
    unknown piece, its byte for a byte piece, else the piece with each
    U+2581 a space (what ``_spell_checked`` lists as ``out``)."""

    def __init__(self, pieces: PackedPieces, types: np.ndarray, byte_ids: np.ndarray) -> None:
        self._pieces = pieces
        self._silent = ((types == TOKEN_CONTROL) | (types == TOKEN_UNKNOWN)).tobytes()  # 1 byte per id
        self._byte_of = {token: value for value, token in enumerate(byte_ids.tolist()) if token >= 0}

    def __len__(self) -> int:
        return len(self._pieces)

    def __iter__(self):
        """Every id's bytes in order (the vocabulary whole, in one pass)."""
        silent, byte_of, pieces = self._silent, self._byte_of, self._pieces
        blob, base, offsets = pieces.blob, pieces.base, pieces.offsets.tolist()
        for token_id in range(len(offsets) - 1):
            if silent[token_id]:
                yield b""
            elif token_id in byte_of:
                yield bytes((byte_of[token_id],))
            else:
                yield blob[base + offsets[token_id]:base + offsets[token_id + 1]].replace(META_SPACE, SPACE)

    def __getitem__(self, token_id: int) -> bytes:
        if self._silent[token_id]:
            return b""
        value = self._byte_of.get(token_id)
        if value is not None:
            return bytes((value,))
        return self._pieces[token_id].replace(META_SPACE, SPACE)


class SentencePieceTokenizer(PieceTable):
    """Gemma's SentencePiece BPE tokenizer over a GGUF vocab.

    Offers what ``GreedyTokenizer`` offers: ``encode`` (no BOS), ``decode``,
    ``decode_bytes``, ``piece_bytes``, ``stream_decoder``, ``token_id``,
    ``is_control``, and ``vocab_size``/``bos_id``/``eos_id``/``unk_id``/
    ``pad_id``. Building one checks the vocab and raises ``ModelFormatError``
    naming ``source`` and the rule broken.
    """

    def __init__(self, pieces: list[bytes], scores: list[float], types: list[int], bos_id: int,
                 eos_id: int, unk_id: int, pad_id: int | None = None, source: str = "") -> None:
        self._adopt(build_tables(pieces, scores, types, bos_id, eos_id, unk_id, pad_id, source),
                    bos_id, eos_id, unk_id, unk_id if pad_id is None else pad_id, source)

    def _adopt(self, tables: VocabTables, bos_id: int, eos_id: int, unk_id: int, pad_id: int,
               source: str) -> None:
        """Run from ``tables``, built from a checked vocabulary here or read
        back from the cache (sp_cache)."""
        n = len(tables.pieces)
        self._bpe = SentencePieceBPE(BPEVocab(spelled=tables.spelled, scores=tables.scores, types=tables.types,
                                              index=tables.index, unk_id=unk_id, byte_ids=tables.byte_ids))
        self.source = source
        self.vocab_size = n
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.unk_id = unk_id
        self.pad_id = pad_id
        self._tables = tables
        self._out = DecodedPieces(tables.pieces, tables.types, tables.byte_ids)
        self._byte_ids = [unk_id if b < 0 else b for b in tables.byte_ids.tolist()]  # no piece: unknown
        control = (tables.types == TOKEN_CONTROL) | (tables.types == TOKEN_UNKNOWN)
        self._control = control  # bool (n,)
        self._control_ids = np.flatnonzero(control).tolist()
        self._special_pieces = None  # built at the first encode with parse_special

    @property
    def _specials(self) -> SpecialPieces:
        if self._special_pieces is None:
            self._special_pieces = SpecialPieces([(self._tables.pieces[i], i) for i in self._control_ids])
        return self._special_pieces

    def is_control(self, token_id: int) -> bool:
        """True if ``token_id`` is a control token (decodes to nothing)."""
        return bool(self._control[self._check_id(token_id)])

    def token_id(self, piece: str | bytes) -> int | None:
        """Id of the piece exactly equal to ``piece`` (first one; as the file
        spells it), or None."""
        return self._tables.pieces.find(text_to_bytes(piece))

    def spelling(self, token_id: int) -> str:
        """PieceTable.spelling, read from the piece table: a control token's
        piece when it is that piece's first id."""
        token_id = self._check_id(token_id)
        piece = self._tables.pieces[token_id]
        if self._control[token_id] and self.token_id(piece) == token_id:
            return piece.decode("utf-8", "replace")
        return self.decode([token_id])

    def control_spellings(self) -> dict[int, bytes]:
        """PieceTable.control_spellings, read from the piece table."""
        return {i: self._tables.pieces[i] for i in self._control_ids if self._tables.pieces[i]}

    def control_pieces(self) -> tuple[str, ...]:
        """The control pieces' spellings, longest first (PieceTable.control_pieces)."""
        found = {self._tables.pieces[i].decode("utf-8", "replace") for i in self._control_ids}
        return tuple(sorted(found - {""}, key=lambda p: (-len(p), p)))

    add_space_prefix = False  # a space before the text (SentencePiece's dummy prefix)
    add_eos = False  # the model expects EOS after a prompt

    def _settings(self, gf) -> None:
        """add_space_prefix, add_bos and add_eos from the file's metadata,
        each llama.cpp's default for a "llama" vocabulary when absent."""
        from ..formats import gguf_reader

        def flag(key: str, default: bool) -> bool:
            f = gf.fields.get(key)
            if f is None:
                return default
            if f.type != gguf_reader.BOOL:
                raise ModelFormatError(f"{gf.path}: metadata {key}: type "
                                       f"{gguf_reader.VALUE_TYPE_NAMES[f.type] if f.type < 13 else f.type}, "
                                       f"expected BOOL")
            return bool(f.value)
        self.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", True)
        self.add_bos = flag("tokenizer.ggml.add_bos_token", True)
        self.add_eos = flag("tokenizer.ggml.add_eos_token", False)

    @classmethod
    def from_gguf(cls, path) -> SentencePieceTokenizer:
        """The tokenizer a GGUF file's metadata describes (``path`` or a parsed
        ``GGUFFile``; see ``read_gguf_vocab``), with the file's chat
        template when it has one. A vocabulary of at least
        sp_cache.CACHE_MIN_PIECES pieces is built once and kept in the user's
        cache directory (gemma_cy.tokenizers.sp_cache)."""
        from ..formats import gguf_reader

        gf = path if isinstance(path, gguf_reader.GGUFFile) else gguf_reader.parse_gguf(path)
        template = template_from_gguf(gf)
        key, tables = _cached_tables(gf)
        if tables is not None:
            tok = cls.__new__(cls)
            tok._adopt(tables, *_special_ids(gf), source=gf.path)
            tok.chat_template = template
            tok._settings(gf)
            return tok
        pieces, scores, types, special = read_gguf_vocab(gf)
        for short in ("bos", "eos", "unk"):
            if short not in special:
                raise ModelFormatError(f"{gf.path}: metadata key {SPECIAL_KEYS[short]} missing")
        ids = _special_ids(gf)
        tables = build_tables(pieces, scores, types, *ids, source=gf.path)
        if key is not None:
            sp_cache.store(key, tables)
        tok = cls.__new__(cls)
        tok._adopt(tables, *ids, source=gf.path)
        tok.chat_template = template
        tok._settings(gf)
        return tok

    def encode(self, text: str | bytes, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, without BOS.

        With ``parse_special`` the control pieces written in the text
        (``<start_of_turn>``...) become their ids, leftmost and longest
        first; the text between them is encoded as usual.
        """
        data = text_to_bytes(text)
        plain = self._encode_prefixed if self.add_space_prefix else self._encode_plain
        return self._specials.split(data, plain) if parse_special else plain(data)

    def _encode_prefixed(self, data: bytes) -> list[int]:
        """``_encode_plain`` of the text with a space before it (add_space_prefix)."""
        return self._encode_plain(SPACE + data) if data else []

    def decode_bytes(self, ids, prev_id: int | None = None) -> bytes:
        """PieceTable.decode_bytes; with add_space_prefix, the first
        non-control piece of a text (``prev_id`` None or BOS: the id before
        the first) loses the space its piece starts with, as SentencePiece
        decodes."""
        if not self.add_space_prefix or prev_id not in (None, self.bos_id):
            return super().decode_bytes(ids)
        ids = list(ids)
        for k, token_id in enumerate(ids):
            token_id = self._check_id(token_id)
            if not self._control[token_id]:
                first = self._out[token_id]
                if self._tables.pieces[token_id].startswith(META_SPACE):
                    first = first[1:]
                return super().decode_bytes(ids[:k]) + first + super().decode_bytes(ids[k + 1:])
        return b""

    def stream_decoder(self, prev_id: int | None = None) -> StreamDecoder:
        """PieceTable.stream_decoder; ``prev_id`` (the id before the first
        pushed, e.g. the prompt's last) None or BOS: the text starts here,
        so the first piece's prefix space goes (decode_bytes)."""
        return SentencePieceStreamDecoder(self, prev_id)

    def _encode_plain(self, data: bytes) -> list[int]:
        """SentencePiece ids of ``data``; bytes that are not UTF-8 become byte pieces."""
        return encode_utf8_runs(data, self._bpe.encode, self._byte_ids.__getitem__)


class SentencePieceStreamDecoder(StreamDecoder):
    """Incremental ``SentencePieceTokenizer.decode_bytes`` from ``prev_id``:
    concatenating every ``push`` and ``flush()`` gives its decode."""

    def __init__(self, tokenizer: SentencePieceTokenizer, prev_id: int | None = None) -> None:
        super().__init__(tokenizer)
        self._at_start = tokenizer.add_space_prefix and prev_id in (None, tokenizer.bos_id)

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (maybe "")."""
        if not self._at_start:
            return super().push(token_id)
        data = self._tokenizer.decode_bytes([token_id], None)
        self._at_start = self._tokenizer.is_control(token_id)  # (control ids decode to nothing: still the start)
        return self._utf8.decode(data)
