"""Gemma 4's tokenizer: BPE with ranked merges over U+2581 text, byte fallback (docs/generation.md#gemma-4s-tokenizer).

A GGUF with ``tokenizer.ggml.model = "gemma4"`` is what llama.cpp's
converter writes from Gemma 4's HF ``tokenizer.json``: the tokens (spaces
spelled U+2581 "▁"), their types, the ranked merges
(``tokenizer.ggml.merges``, "▁t he" = merge "▁t" with "he"), the special
ids, ``add_bos_token`` true. Encoding runs as HF's ``GemmaTokenizer``
(transformers, on ``tokenizers``' BPE) does:

1. the markers are matched whole first, leftmost and longest (only with
   ``parse_special``; see below), the text between them encoded on its own;
2. normalize: every space becomes U+2581 (nothing else; no pre-split: the
   pre-tokenizer Split(" ") finds no space left, so the text is one piece);
3. one symbol per character: its token, else (byte fallback) one symbol
   per UTF-8 byte, the token spelled ``<0xHH>``; with a byte token missing,
   the unknown id (a run of them fused into one);
4. merge: keep a queue of (rank of the pair's merge, left position); pop
   the lowest (leftmost on ties); an entry still stands when the pair now
   at its position merges into the same token (HF's ``Word.merge_all``:
   several merges can make one token, and the entry keeps its own rank);
   join the pair, queue the pairs it forms with its neighbours, repeat.

The queue makes a text of n characters O(n log n) however long it is (a
whole text is one piece; a 100 KB text takes about a quarter second).

Token types (GGUF, llama.cpp's): CONTROL and UNKNOWN ids decode to nothing
and are matched only with ``parse_special``. The converter retypes seven of
Gemma 4's special tokens USER_DEFINED so llama.cpp always renders them
(``VISIBLE_MARKERS``: ``<|channel>``, ``<|"|>``...): they decode to their
text, and are still special as in HF, matched only with ``parse_special``.
Any other USER_DEFINED token is an HF added token that is not special and
is matched whole always. Bytes that are not valid UTF-8
(``greedy.text_to_bytes``) become their byte tokens, so
``decode_bytes(encode(b)) == b``.
"""
from __future__ import annotations

import heapq
import re

from ..errors import ModelFormatError
from .bpe import check_vocab_sizes, merges_vocab_fields
from .greedy import AddedTokens, PieceTable, encode_utf8_runs, text_to_bytes

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF token types
TOKEN_TYPES = (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)
META_SPACE = "\u2581"
# HF special tokens that llama.cpp's converter (Gemma4Model.set_vocab) types USER_DEFINED.
VISIBLE_MARKERS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                             "<tool_response|>", '<|"|>'})
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Gemma4Tokenizer(PieceTable):
    """Gemma 4's BPE tokenizer over a GGUF vocab (module docstring).

    Offers what ``SentencePieceTokenizer`` and ``BPETokenizer`` offer:
    ``encode`` (no BOS), ``decode``, ``decode_bytes``, ``piece_bytes``,
    ``stream_decoder``, ``token_id``, ``is_control``, ``vocab_size``/
    ``bos_id``/``eos_id``/``unk_id``/``pad_id``, ``add_bos``/``add_eos``
    and ``chat_template``. Building one checks the vocab and raises
    ``ModelFormatError`` naming ``source`` and the rule broken.
    """

    def __init__(self, tokens, types, merges, bos_id: int, eos_id: int, unk_id: int | None = None,
                 pad_id: int | None = None, add_bos: bool = True, add_eos: bool = False,
                 chat_template: str | None = None, source: str = "") -> None:
        where = source or "vocab"
        n = check_vocab_sizes(where, tokens, types, bos_id, eos_id, unk_id, pad_id)
        ids: dict[str, int] = {}
        out: list[bytes] = []
        control: list[bool] = []
        special: list[tuple[bytes, int]] = []  # matched with parse_special only
        always: list[tuple[bytes, int]] = []   # matched whole in any text
        for i, (token, ttype) in enumerate(zip(tokens, types)):
            if not isinstance(token, str) or not token:
                raise ModelFormatError(f"{where}: token {i}: empty or not a string")
            if type(ttype) is not int or ttype not in TOKEN_TYPES:
                raise ModelFormatError(f"{where}: token {i} ({token[:32]!r}): type {ttype!r} unknown, "
                                       f"must be one of {TOKEN_TYPES}")
            if token in ids:
                raise ModelFormatError(f"{where}: token {i} ({token[:32]!r}) duplicates token {ids[token]}")
            ids[token] = i
            m = _BYTE_TOKEN.fullmatch(token)
            if (ttype == BYTE) != (m is not None):
                raise ModelFormatError(f"{where}: token {i} ({token[:32]!r}): type {ttype}, but a token is "
                                       f"typed BYTE ({BYTE}) exactly when it is spelled <0xHH>")
            spelled = token.encode()
            control.append(ttype in (CONTROL, UNKNOWN))
            out.append(b"" if control[-1] else bytes((int(m.group(1), 16),)) if m
                       else token.replace(META_SPACE, " ").encode())
            if control[-1] or (ttype == USER_DEFINED and token in VISIBLE_MARKERS):
                special.append((spelled, i))
            elif ttype == USER_DEFINED:
                always.append((spelled, i))
        byte_ids = [ids.get(f"<0x{b:02X}>", -1) for b in range(256)]  # as HF and llama.cpp look them up
        if min(byte_ids) < 0 and unk_id is None:
            raise ModelFormatError(f"{where}: no byte token <0x{byte_ids.index(-1):02X}> and no unknown token: "
                                   f"a character without a token has no id")
        rank_of: dict[int, int] = {}  # left id * n + right id -> rank
        merged: list[int] = []        # rank -> the id the merge makes
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1) if isinstance(merge, str) else -1
            if cut < 0:
                raise ModelFormatError(f"{where}: merge {rank} ({str(merge)[:40]!r}) must be two tokens "
                                       f"separated by a space")
            left, right = merge[:cut], merge[cut + 1:]
            pair = (ids.get(left), ids.get(right), ids.get(left + right))
            if None in pair:
                raise ModelFormatError(f"{where}: merge {rank} ({merge[:40]!r}) names a token not in the vocab "
                                       f"(both halves and their join must be tokens)")
            key = pair[0] * n + pair[1]
            if key in rank_of:
                raise ModelFormatError(f"{where}: merge {rank} ({merge[:40]!r}) repeats merge {rank_of[key]}")
            rank_of[key] = rank
            merged.append(pair[2])

        self.source = source
        self.vocab_size = n
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = bos_id, eos_id, unk_id, pad_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.chat_template = chat_template
        self._out = out
        self._control = control
        self._ids = {token.encode(): i for token, i in ids.items()}  # token_id() takes the file's spelling
        self._char_ids = {token: i for token, i in ids.items() if len(token) == 1}
        self._byte_ids = byte_ids
        self._rank_of = rank_of
        self._merged = merged
        self._added = AddedTokens(always, special)

    @classmethod
    def from_gguf(cls, path) -> Gemma4Tokenizer:
        """The tokenizer a GGUF file's metadata describes (``path`` or a parsed
        ``GGUFFile``; ``tokenizer.ggml.*``; ``add_bos_token`` absent: true,
        as HF's GemmaTokenizer; ``add_eos_token`` absent: false)."""
        v = merges_vocab_fields(path, "gemma4", "a gemma4 vocab")
        special = v["special"]
        return cls(list(v["tokens"]), v["types"], list(v["merges"]), special["bos"], special["eos"],
                   special["unknown"], special["padding"], add_bos=True if v["add_bos"] is None else bool(v["add_bos"]),
                   add_eos=bool(v["add_eos"]), chat_template=v["chat_template"], source=v["source"])

    def control_pieces(self) -> tuple[str, ...]:
        """The markers special parsing matches (control tokens and the
        visible markers), longest first: what a chat message's content may
        not smuggle in (PieceTable.control_pieces)."""
        return self._added.control_pieces

    def encode(self, text: str | bytes, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, without BOS. With ``parse_special`` the
        markers written in the text become their ids (leftmost, longest
        first); the text between them is encoded on its own."""
        data = text_to_bytes(text)
        return self._added.split(data, parse_special, self._encode_plain)

    def _encode_plain(self, data: bytes) -> list[int]:
        """Ids of ``data``; bytes that are not UTF-8 become byte tokens (the unknown id without one)."""
        byte_ids, unk = self._byte_ids, self.unk_id
        return encode_utf8_runs(data, self._bpe, lambda b: byte_ids[b] if byte_ids[b] >= 0 else unk)

    def _symbols(self, text: str) -> list[int]:
        """Step 3: each character's id, else its UTF-8 bytes' ids, else the
        unknown id (a run of such characters: one)."""
        get, byte_ids, unk = self._char_ids.get, self._byte_ids, self.unk_id
        ids: list[int] = []
        unknown = False  # the last symbol is an unknown id made here
        for ch in text:
            token = get(ch)
            if token is None:
                fallback = [byte_ids[b] for b in ch.encode()]
                if min(fallback) < 0:
                    if not unknown:
                        ids.append(unk)
                    unknown = True
                    continue
                ids += fallback
            else:
                ids.append(token)
            unknown = False
        return ids

    def _bpe(self, text: str) -> list[int]:
        """Steps 2 to 4 over one stretch of text."""
        if not text:
            return []
        text = text.replace(" ", META_SPACE)
        get = self._char_ids.get
        ids = [get(ch, -1) for ch in text]
        if -1 in ids:
            ids = self._symbols(text)
        n = len(ids)
        if n < 2:
            return ids
        v, rank_of, merged = self.vocab_size, self._rank_of.get, self._merged
        # the queue: rank * n + left position, lowest first; a removed symbol's id is -1
        agenda = [r * n + k for k in range(n - 1) if (r := rank_of(ids[k] * v + ids[k + 1])) is not None]
        heapq.heapify(agenda)
        after = list(range(1, n + 1))
        after[-1] = -1
        before = list(range(-1, n - 1))
        pop, push = heapq.heappop, heapq.heappush
        while agenda:
            rank, left = divmod(pop(agenda), n)
            right = after[left]
            if ids[left] < 0 or right < 0:
                continue
            now = rank_of(ids[left] * v + ids[right])
            made = merged[rank]
            if now is None or merged[now] != made:
                continue  # stale: the pair here has changed since
            ids[left], ids[right] = made, -1
            nxt = after[left] = after[right]
            if nxt >= 0:
                before[nxt] = left
                r = rank_of(made * v + ids[nxt])
                if r is not None:
                    push(agenda, r * n + left)
            prv = before[left]
            if prv >= 0:
                r = rank_of(ids[prv] * v + made)
                if r is not None:
                    push(agenda, r * n + prv)
        return [i for i in ids if i >= 0]
