"""Byte-level BPE (GPT-2 style) built from a GGUF vocab: SmolLM2's, Llama 3's, Qwen's tokenizers.

A GGUF with ``tokenizer.ggml.model == "gpt2"`` carries the tokens (spelled
in GPT-2's byte alphabet: every byte is one printable character, e.g. space
-> "Ġ", newline -> "Ċ"), their types and the ranked merges
(``tokenizer.ggml.merges``, "Ġ t" = merge "Ġ" with "t"). Encoding runs as
HF ``tokenizers`` does for the family's ``tokenizer.json``:

1. pre-tokenize by the rule ``tokenizer.ggml.pre`` names (``bpe_pre``: GPT-2,
   SmolLM, Llama 3, Qwen 2 and 3.5, DeepSeek, Falcon, Command-R and
   llama.cpp's default; absent means ``gpt-2``), e.g. SmolLM2's
   ``Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]``:
   every numeric character a piece of its own, GPT-2's pattern between them;
2. each piece's UTF-8 bytes become byte symbols, then the adjacent pair with
   the lowest merge rank is merged (leftmost on ties) until no pair has a
   merge (Llama 3: a piece that is a whole token is that token). Results
   are cached per piece (pieces of up to CACHE_PIECE_BYTES bytes,
   CACHE_LIMIT of them).

A byte whose symbol is not in the vocab (SmolLM2's lacks 21, among them
0x04, 0xC0 and 0xF5..0xFF) is dropped, as HF (a BPE without ``unk_token``)
and llama.cpp drop it: its neighbours then merge as if adjacent.

USER_DEFINED tokens (HF's added tokens that are not special: Qwen's and
DeepSeek's extras, GPT-NeoX's space runs) are matched whole, leftmost-longest,
in any text; control tokens (``<|im_start|>``, ``<|im_end|>``...) join them
only with ``parse_special=True``; the text between them is pre-tokenized on
its own (as HF splits added tokens first). Decoding maps each byte symbol
back to its byte (a token written outside the byte alphabet gives its own
UTF-8, as HF's ByteLevel decoder does); control, unknown and unused tokens,
and the converter's invented ``[PADn]`` fillers, decode to nothing
(docs/generation.md#byte-level-bpe). Text that is not valid UTF-8 (``greedy.text_to_bytes``) is
tokenized byte for byte, so ``decode_bytes(encode(b)) == b`` but for
dropped bytes and, where the rule normalizes, NFC.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .bpe_pre import PRE_TOKENIZERS, pre_tokenizer
from .chat import template_from_gguf
from .greedy import AddedTokens, PieceTable, text_to_bytes

# GGUF token types (llama.cpp's llama_token_type) a byte-level vocab may hold
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 2, 3, 4, 5
TOKEN_TYPES = {TOKEN_NORMAL: "normal", TOKEN_UNKNOWN: "unknown", TOKEN_CONTROL: "control",
               TOKEN_USER_DEFINED: "user-defined", TOKEN_UNUSED: "unused"}
SILENT_TYPES = (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_UNUSED)  # decode to nothing, never produced from text

CACHE_LIMIT = 1 << 16  # pieces remembered; the cache starts over past this
CACHE_PIECE_BYTES = 64  # longer pieces are not remembered: the cache stays under ~70 MB however hostile the text


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for
    themselves, the other 68 bytes take U+0100.. in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return chars


def token_text_bytes(token: str, byte_of: dict[str, int]) -> bytes:
    """What a token decodes to, as HF's ByteLevel decoder makes it: the bytes
    its characters stand for in the byte alphabet when every one is in it,
    else its own UTF-8 (a token written outside the alphabet, e.g. Command-R's
    U+200D, or a USER_DEFINED token with a space in it)."""
    try:
        return bytes(byte_of[ch] for ch in token)
    except KeyError:
        return token.encode()


def check_vocab_sizes(where: str, tokens, types, bos_id, eos_id, unk_id, pad_id) -> int:
    """The vocabulary's size; ModelFormatError when it is empty, its types do
    not match its tokens, or a special id is outside it."""
    n = len(tokens)
    if n == 0:
        raise ModelFormatError(f"{where}: vocab_size is 0, must be > 0")
    if len(types) != n:
        raise ModelFormatError(f"{where}: {len(types)} token types for {n} tokens; must equal vocab_size")
    for field, value in (("bos_id", bos_id), ("eos_id", eos_id), ("unk_id", unk_id), ("pad_id", pad_id)):
        if value is not None and (type(value) is not int or not 0 <= value < n):
            raise ModelFormatError(f"{where}: {field} {value!r} must be in [0, vocab_size {n})")
    return n


def merges_vocab_fields(path, model: str, what: str) -> dict:
    """The ``tokenizer.ggml.*`` fields of a vocabulary with ranked merges
    (``path`` or a parsed GGUFFile whose ``tokenizer.ggml.model`` must be
    ``model``): tokens, types, merges, special ids (bos and eos required),
    add_bos / add_eos / pre (None when absent), the chat template and the
    source name. A missing or mistyped key is a one-line ModelFormatError
    naming ``what`` needs it."""
    from ..formats import gguf_reader

    gf = path if isinstance(path, gguf_reader.GGUFFile) else gguf_reader.parse_gguf(path)
    name = gf.path

    def get(key: str, kinds: tuple[int, ...], item_kinds: tuple[int, ...] | None = None, required=True):
        f = gf.fields.get(key)
        if f is None:
            if required:
                raise ModelFormatError(f"{name}: metadata key {key} missing; {what} needs it")
            return None
        if f.type not in kinds or (item_kinds is not None and f.item_type not in item_kinds):
            raise ModelFormatError(f"{name}: metadata key {key} has type {gguf_reader.type_name(f)}")
        return f.value

    found = get("tokenizer.ggml.model", (gguf_reader.STRING,))
    if found != model:
        raise ModelFormatError(f"{name}: tokenizer.ggml.model is {found!r}; {what} needs {model!r}")
    return {
        "tokens": get("tokenizer.ggml.tokens", (gguf_reader.ARRAY,), (gguf_reader.STRING,)),
        "types": [int(t) for t in get("tokenizer.ggml.token_type", (gguf_reader.ARRAY,), gguf_reader.INTEGER_TYPES)],
        "merges": get("tokenizer.ggml.merges", (gguf_reader.ARRAY,), (gguf_reader.STRING,)),
        "special": {key: get(f"tokenizer.ggml.{key}_token_id", gguf_reader.INTEGER_TYPES,
                             required=key in ("bos", "eos")) for key in ("bos", "eos", "unknown", "padding")},
        "add_bos": get("tokenizer.ggml.add_bos_token", (gguf_reader.BOOL,), required=False),
        "add_eos": get("tokenizer.ggml.add_eos_token", (gguf_reader.BOOL,), required=False),
        "pre": get("tokenizer.ggml.pre", (gguf_reader.STRING,), required=False),
        "chat_template": template_from_gguf(gf), "source": name}


class BPETokenizer(PieceTable):
    """Byte-level BPE over a GGUF vocab (module docstring).

    Offers what ``SentencePieceTokenizer`` offers: ``encode`` (no BOS),
    ``decode``, ``decode_bytes``, ``piece_bytes``, ``stream_decoder``,
    ``token_id``, ``is_control``, ``vocab_size``/``bos_id``/``eos_id``/
    ``unk_id``/``pad_id``, plus ``add_bos`` (does the model expect BOS
    first?) and ``chat_template`` (the file's Jinja template, or None).
    Building one checks the vocab and raises ``ModelFormatError`` naming
    ``source`` and the rule broken.
    """

    def __init__(self, tokens: list[str], types: list[int], merges: list[str], bos_id: int, eos_id: int,
                 unk_id: int | None = None, pad_id: int | None = None, pre: str = "smollm",
                 add_bos: bool = False, chat_template: str | None = None, source: str = "") -> None:
        where = source or "vocab"
        n = check_vocab_sizes(where, tokens, types, bos_id, eos_id, unk_id, pad_id)
        rule = pre_tokenizer(pre)
        if rule is None:
            raise ModelFormatError(f"{where}: pre-tokenizer {pre!r} is not supported "
                                   f"(supported: {', '.join(PRE_TOKENIZERS)})")
        chars = byte_alphabet()
        byte_of = {ch: b for b, ch in enumerate(chars)}
        out: list[bytes] = []
        control: list[bool] = []
        special: list[tuple[bytes, int]] = []  # matched with parse_special only
        always: list[tuple[bytes, int]] = []   # USER_DEFINED: matched whole in any text
        ids: dict[str, int] = {}
        for i, (token, ttype) in enumerate(zip(tokens, types)):
            if not isinstance(token, str) or not token:
                raise ModelFormatError(f"{where}: token {i}: empty or not a string")
            if isinstance(ttype, bool) or not hasattr(ttype, "__index__") or int(ttype) not in TOKEN_TYPES:
                raise ModelFormatError(f"{where}: token {i} ({token[:32]!r}): type {ttype!r} is not supported "
                                       f"(byte-level vocabs: {', '.join(f'{t} {n}' for t, n in TOKEN_TYPES.items())})")
            ttype = int(ttype)
            silent = ttype in SILENT_TYPES or (ttype == TOKEN_USER_DEFINED and token == f"[PAD{i}]")
            control.append(silent)
            out.append(b"" if silent else token_text_bytes(token, byte_of))
            if ttype in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                special.append((token.encode(), i))
            elif ttype == TOKEN_USER_DEFINED and not silent:
                always.append((token.encode(), i))
            ids.setdefault(token, i)
        rank_of: dict[tuple[int, int], tuple[int, int]] = {}  # (left id, right id) -> (rank, merged id)
        for rank, merge in enumerate(merges):
            parts = merge.split(" ") if isinstance(merge, str) else ()
            if len(parts) != 2 or not all(parts):
                raise ModelFormatError(f"{where}: merge {rank} ({str(merge)[:40]!r}) must be two tokens "
                                       f"separated by one space")
            pair = [ids.get(p) for p in (*parts, parts[0] + parts[1])]
            if None in pair:
                raise ModelFormatError(f"{where}: merge {rank} ({merge[:40]!r}) names a token not in the vocab")
            if (pair[0], pair[1]) in rank_of:
                raise ModelFormatError(f"{where}: merge {rank} ({merge[:40]!r}) repeats merge "
                                       f"{rank_of[pair[0], pair[1]][0]}")
            rank_of[pair[0], pair[1]] = (rank, pair[2])

        self.source = source
        self.vocab_size = n
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.pad_id = pad_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.pre = pre
        self._out = out
        self._control = control
        self._ids = {token.encode(): i for token, i in ids.items()}  # token_id() takes the file's spelling
        self._byte_ids = [ids.get(ch, -1) for ch in chars]  # -1: not in the vocab, dropped
        self._merges = rank_of
        self._rule = rule
        self._token_ids = {out[i]: i for i in reversed(range(n))  # ignore_merges: whole NORMAL tokens
                           if int(types[i]) == TOKEN_NORMAL and all(ch in byte_of for ch in tokens[i])}
        self._cache: dict[bytes, list[int]] = {}
        self._added = AddedTokens(always, special)

    @classmethod
    def from_gguf(cls, path) -> BPETokenizer:
        """The tokenizer a GGUF file's metadata describes (``path`` or a parsed
        ``GGUFFile``; ``tokenizer.ggml.*``; BOS first only when
        ``add_bos_token`` says so)."""
        v = merges_vocab_fields(path, "gpt2", "a byte-level BPE vocab")
        special = v["special"]
        return cls(v["tokens"], v["types"], v["merges"], special["bos"], special["eos"], special["unknown"],
                   special["padding"], pre=v["pre"] or "gpt-2", add_bos=bool(v["add_bos"]),
                   chat_template=v["chat_template"], source=v["source"])

    def encode(self, text: str | bytes, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, without BOS. With ``parse_special`` the
        control tokens written in the text become their ids (leftmost,
        longest first); the text between them is encoded on its own."""
        data = text_to_bytes(text)
        return self._added.split(data, parse_special, self._encode_plain)

    def control_pieces(self) -> tuple[str, ...]:
        """The control tokens' spellings, longest first: what special parsing
        matches and a chat message's content may not smuggle in
        (PieceTable.control_pieces; USER_DEFINED tokens are text)."""
        return self._added.control_pieces

    def _encode_plain(self, data: bytes) -> list[int]:
        text = data.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 -> U+DC80..U+DCFF
        ids: list[int] = []
        cache = self._cache
        whole = self._token_ids if self._rule.ignore_merges else None
        for piece in self._rule.pieces(text):
            got = cache.get(piece)
            if got is None:
                token = whole.get(piece) if whole is not None else None
                got = [token] if token is not None else self._bpe(piece)
                if len(piece) <= CACHE_PIECE_BYTES:
                    if len(cache) >= CACHE_LIMIT:
                        cache.clear()
                    cache[piece] = got
            ids += got
        return ids

    def _bpe(self, piece: bytes) -> list[int]:
        """Merge the byte symbols of one piece: lowest rank first, leftmost on ties."""
        byte_ids = self._byte_ids
        symbols = [byte_ids[b] for b in piece if byte_ids[b] >= 0]
        merges = self._merges
        while len(symbols) > 1:
            best, at = None, -1
            for k in range(len(symbols) - 1):
                m = merges.get((symbols[k], symbols[k + 1]))
                if m is not None and (best is None or m[0] < best[0]):
                    best, at = m, k
            if best is None:
                break
            symbols[at:at + 2] = [best[1]]
        return symbols
