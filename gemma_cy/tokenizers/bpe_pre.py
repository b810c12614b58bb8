"""Pre-tokenizers of byte-level BPE vocabularies: GGUF ``tokenizer.ggml.pre``.

Before its merges run, a byte-level BPE cuts the text into pieces, and each
family cuts differently. Every rule here is the pipeline of the HF
``tokenizer.json`` the family's models ship (llama.cpp names the rule in
``tokenizer.ggml.pre`` and keeps its own regex list for it; where the two
differ we follow HF, docs/generation.md#byte-level-bpe). A rule is an
optional NFC normalizer, then splits applied one after the other to every
piece so far (HF's ``Sequence`` of pre-tokenizers: a split keeps both the
matches and the text between them), then the pieces' UTF-8 bytes:

- ``gpt-2``: GPT-2's pattern (HF ``ByteLevel(use_regex=True)``)
  ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``.
- ``mpt`` (GPT-NeoX-20B's tokenizer, which MPT ships): NFC, then GPT-2's pattern.
- ``smollm`` (also ``starcoder``, ``refact``): every numeric character a
  piece of its own (HF ``Digits(individual_digits=True)``), then GPT-2's pattern.
- ``command-r``: NFC, then as ``smollm``.
- ``llama-bpe`` (Llama 3): the tiktoken pattern
  ``(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|
  ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+``; a piece that is
  a whole token of the vocab is that token, merges or not (``ignore_merges``).
- ``qwen2``: NFC, then the same pattern with ``\\p{N}`` (one digit a piece).
- ``qwen35``: as ``qwen2`` without NFC (Qwen 3.5's tokenizer.json has no
  normalizer: a decomposed "é" stays "e" + U+0301), combining marks in words:
  ``[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+`` and ``?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*``.
- ``deepseek-llm``: ``[\\r\\n]``; ``\\s?`` + a run of DeepSeek's letter list;
  ``\\s?`` + a run of ASCII and full-width punctuation; trailing white space;
  runs of CJK; every numeric character alone.
- ``deepseek-coder``: ``[\\r\\n]``; ``\\s?\\p{L}+``; ``\\s?\\p{P}+``; runs of
  CJK; every numeric character alone.
- ``falcon``: runs of punctuation (HF ``Punctuation``), GPT-2's pattern, and
  then, on the pieces' bytes as GPT-2's byte alphabet spells them, runs of
  numeric characters and ``[0-9][0-9][0-9]`` (bytes 0xB2, 0xB3, 0xB9 and
  0xBC..0xBE are spelled ``²³¹¼½¾``: numeric, so they split as digits do).
- ``default`` (llama.cpp's list for names it has no rule for; no HF
  tokenizer): ``[\\p{P}$+<=>^~|]+``, GPT-2's pattern, ``\\p{N}+``, ``[0-9][0-9][0-9]``.
- ``gpt-4o`` (Phi-4-mini and other o200k vocabularies): tiktoken's o200k_base,
  ``[^\\r\\n\\p{L}\\p{N}]?U*W+c?|[^\\r\\n\\p{L}\\p{N}]?U+W*c?|\\p{N}{1,3}|
  ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`` with
  ``U = [\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]``, ``W = [\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]``
  and ``c = (?i:'s|'t|'re|'ve|'m|'ll|'d)``: "HelloWorld" is "Hello", "World".

Each regex is a scanner over character classes: the alternatives are tried
in order at each position, the first that matches wins (greedy, with the
backtracking the pattern implies, e.g. ``\\s+(?!\\S)`` gives a space run but
its last character when a non-space follows). The classes are the ones HF's
``tokenizers`` library uses (``unicode_classes``: its regex engine's Unicode
16.0 categories and letter subcategories, its ``Digits``' numeric test, its
``Punctuation`` table, its NFC tables), so they do not move with the Python
running us. ``\\s`` is Unicode White_Space (not ``str.isspace``);
case-insensitive contractions fold ``ſ`` (U+017F) to ``s`` as Unicode case
folding does.
"""
from __future__ import annotations

import unicodedata
from bisect import bisect_right
from typing import Callable

from . import unicode_classes

# Character class bits. L, N, M, P: Unicode 16.0 general categories (HF's regex engine);
# LU: Lu or Lt, LL: Ll; CASELESS: Lm, Lo or M, which o200k's upper and lower classes share.
(L, N, M, P, SPACE, NUMERIC, PUNCT, NFC_ACTIVE, DS_LETTER, DS_PUNCT, CJK, DEF_PUNCT,
 LU, LL, CASELESS) = (1 << b for b in range(15))
UPPER, LOWER = LU | CASELESS, LL | CASELESS  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], [\p{Ll}\p{Lm}\p{Lo}\p{M}]

WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                       "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")  # Unicode White_Space
CR_LF = "\r\n"
FOLDS = {"s": "sS\u017f", "t": "tT", "r": "rR", "e": "eE", "v": "vV", "m": "mM", "l": "lL", "d": "dD"}
# DeepSeek LLM's letters, punctuation and CJK, as its tokenizer.json lists them (inclusive ranges).
DS_LETTERS = ("AZ az µµ ÀÖ Øö øƺ Ƽƿ Ǆʓ ʕʯ Ͱͳ Ͷͷ ͻͽ ͿͿ ΆΆ ΈΊ ΌΌ ΎΡ Σϵ Ϸҁ Ҋԯ ԱՖ ႠჅ ᎠᏵ ᏸᏽ ᲐᲺ ᲽᲿ ᴀᴫ ᵫᵷ "
              "ᵹᶚ Ḁἕ ἘἝ ἠὅ ὈὍ ὐὗ ὙὙ ὛὛ ὝὝ Ὗ\u1f7d ᾀᾴ ᾶᾼ \u1fbe\u1fbe ῂῄ ῆῌ ῐ\u1fd3 ῖ\u1fdb ῠῬ ῲῴ "
              "ῶῼ ℂℂ ℇℇ ℊℓ ℕℕ ℙℝ ℤℤ \u2126\u2126 ℨℨ \u212aℭ ℯℴ ℹℹ ℼℿ ⅅⅉ ⅎⅎ Ↄↄ Ⱀⱻ Ȿⳤ Ⳬⳮ Ⳳⳳ Ꙁꙭ Ꚁꚛ Ꜣꝯ "
              "ꝱꞇ Ꞌꞎ ꭰꮿ ﬀﬆ ﬓﬗ ＡＺ ａｚ \U00010400\U0001044f \U000104b0\U000104d3 \U000104d8\U000104fb "
              "\U00010c80\U00010cb2 \U00010cc0\U00010cf2 \U000118a0\U000118df \U0001e900\U0001e943")
DS_PUNCTS = "!/ :~ ！／ ：～ ‘‟ \u3000。"
CJK_RANGES = "一龥 \u0800一 가\ud7ff"
DEFAULT_PUNCT = "$+<=>^~|"  # with \p{P}, llama.cpp's first split of its default list
NUMERIC_BYTES = frozenset(b"0123456789\xb2\xb3\xb9\xbc\xbd\xbe")  # numeric in GPT-2's byte alphabet
CLASS_CACHE_LIMIT = 1 << 16


def _bounds(ranges: str) -> list[int]:
    """``"lo-hi lo-hi/2 c"`` (hex, inclusive; ``/2``: every other code point) -> [lo, hi + 1, ...] for bisect."""
    out: list[int] = []
    for r in ranges.split():
        r, _, step = r.partition("/")
        lo, _, hi = r.partition("-")
        if step:
            out += [b for c in range(int(lo, 16), int(hi, 16) + 1, int(step)) for b in (c, c + 1)]
        else:
            out += [int(lo, 16), int(hi or lo, 16) + 1]
    return out


def _char_bounds(pairs: str) -> list[int]:
    """Pairs of characters (inclusive ranges, space-separated; they may
    overlap, as the CJK ranges do) -> bounds."""
    out: list[int] = []
    for lo, hi in sorted((ord(pair[0]), ord(pair[1]) + 1) for pair in pairs.split(" ")):
        if out and lo <= out[-1]:
            out[-1] = max(out[-1], hi)
        else:
            out += [lo, hi]
    return out


_TABLES = [(bit, _bounds(spec)) for bit, spec in (
    (L, unicode_classes.LETTER), (N, unicode_classes.NUMBER), (M, unicode_classes.MARK),
    (P, unicode_classes.PUNCTUATION), (NUMERIC, unicode_classes.NUMERIC),
    (PUNCT, unicode_classes.PUNCTUATION_HF), (NFC_ACTIVE, unicode_classes.NFC_ACTIVE),
    (LU, unicode_classes.LETTER_UPPER), (LL, unicode_classes.LETTER_LOWER))]
_TABLES += [(DS_LETTER, _char_bounds(DS_LETTERS)), (DS_PUNCT, _char_bounds(DS_PUNCTS)),
            (CJK, _char_bounds(CJK_RANGES))]
_CLASSES: dict[str, int] = {}


def char_class(c: str) -> int:
    """The class bits of one character (lone surrogates, i.e. bytes that are not UTF-8, have none)."""
    k = _CLASSES.get(c)
    if k is None:
        cp = ord(c)
        k = SPACE if c in WHITESPACE else 0
        for bit, bounds in _TABLES:
            if bisect_right(bounds, cp) & 1:
                k |= bit
        if k & P or c in DEFAULT_PUNCT:
            k |= DEF_PUNCT
        if k & M or k & L and not k & (LU | LL):
            k |= CASELESS
        if len(_CLASSES) >= CLASS_CACHE_LIMIT:
            _CLASSES.clear()
        _CLASSES[c] = k
    return k


def nfc(text: str) -> str:
    """NFC as HF's normalizer computes it. Its tables are older than Python's:
    a character they give no combining class, decomposition or composition is
    left alone and blocks both reordering and composition across it, so only
    the runs of characters they do know (NFC_ACTIVE) are normalized."""
    if text.isascii():
        return text
    out: list[str] = []
    start = -1
    for i, c in enumerate(text):
        if char_class(c) & NFC_ACTIVE:
            if start < 0:
                start = i
        else:
            if start >= 0:
                out.append(unicodedata.normalize("NFC", text[start:i]))
                start = -1
            out.append(c)
    if start >= 0:
        out.append(unicodedata.normalize("NFC", text[start:]))
    return "".join(out)


# A matcher: (text, classes, i, n) -> end of the match at i, or -1.
Matcher = Callable[[str, list, int, int], int]


def _run_end(k: list[int], j: int, n: int, bits: int) -> int:
    while j < n and k[j] & bits:
        j += 1
    return j


def _run_end_not(k: list[int], j: int, n: int, bits: int) -> int:
    while j < n and not k[j] & bits:
        j += 1
    return j


def _space_run(t: str, k: list[int], i: int, n: int) -> int:
    """``\\s+(?!\\S)|\\s+`` at a white-space character: a run at the end whole,
    a longer one but its last character, a single one alone."""
    j = _run_end(k, i + 1, n, SPACE)
    return j if j == n or j - i == 1 else j - 1


def _contraction(t: str, i: int, n: int) -> int:
    """The end of ``(?i:'s|'t|'re|'ve|'m|'ll|'d)`` at i, or i."""
    if t[i:i + 1] == "'" and i + 1 < n:
        a = t[i + 1]
        if any(a in FOLDS[x] for x in "stmd"):
            return i + 2
        if i + 2 < n and any(a in FOLDS[x] and t[i + 2] in FOLDS[y] for x, y in ("re", "ve", "ll")):
            return i + 3
    return i


def _breaks_or_spaces(t: str, k: list[int], i: int, n: int) -> int:
    """``\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`` at a white-space character: the run up
    to its last CR or LF, else GPT-2's white-space rules."""
    end = _run_end(k, i + 1, n, SPACE)
    last = max(t.rfind("\n", i, end), t.rfind("\r", i, end))
    return last + 1 if last >= 0 else _space_run(t, k, i, n)


def gpt2_match(t: str, k: list[int], i: int, n: int) -> int:
    """GPT-2's pattern (contractions case-sensitive); matches everywhere."""
    c = t[i]
    if c == "'" and i + 1 < n:
        if t[i + 1] in "stmd":
            return i + 2
        if t[i + 1:i + 3] in ("re", "ve", "ll"):
            return i + 3
    j = i + 1 if c == " " and i + 1 < n and not k[i + 1] & SPACE else i
    for bits in (L, N):
        if k[j] & bits:
            return _run_end(k, j + 1, n, bits)
    if not k[j] & SPACE:
        return _run_end_not(k, j + 1, n, SPACE | L | N)
    return _space_run(t, k, i, n)


def tiktoken_matcher(digits: int, letters: int) -> Matcher:
    """The Llama 3 / Qwen 2 pattern: ``\\p{N}{1,digits}``; words of ``letters``
    (L, or L and M for Qwen 3.5), whose marks then leave the symbol class."""
    symbol_stop = SPACE | N | L | letters  # what ends a run of symbols

    def match(t: str, k: list[int], i: int, n: int) -> int:
        c = t[i]
        j = _contraction(t, i, n)
        if j > i:
            return j
        kc = k[i]
        if kc & letters:
            return _run_end(k, i + 1, n, letters)
        if c not in CR_LF and not kc & (L | N) and i + 1 < n and k[i + 1] & letters:
            return _run_end(k, i + 2, n, letters)  # one leading non-letter, non-digit, not CR/LF
        if kc & N:
            j = i + 1
            while j < n and j - i < digits and k[j] & N:
                j += 1
            return j
        j = i + 1 if c == " " and i + 1 < n and not k[i + 1] & symbol_stop else i
        if not k[j] & symbol_stop:
            j = _run_end_not(k, j + 1, n, symbol_stop)
            while j < n and t[j] in CR_LF:
                j += 1
            return j
        return _breaks_or_spaces(t, k, i, n)

    return match


def o200k_match(t: str, k: list[int], i: int, n: int) -> int:
    """tiktoken's o200k_base (GPT-4o): words split by case, each with one
    optional leading non-letter non-digit (not CR or LF) and an optional
    contraction, ``[^\\r\\n\\p{L}\\p{N}]?UPPER*LOWER+c?`` then ``...UPPER+LOWER*c?``
    (UPPER: Lu Lt Lm Lo M, LOWER: Ll Lm Lo M); digits in threes; a symbol run
    (marks included) with its trailing CR, LF and ``/``; then white space as Llama 3's."""
    c, kc = t[i], k[i]
    starts = (i + 1, i) if c not in CR_LF and not kc & (L | N) else (i,)  # with the leading character first
    for j in starts:
        u = _run_end(k, j, n, UPPER)
        for s in range(u, j - 1, -1):  # UPPER* gives back until LOWER+ can start
            if s < n and k[s] & LOWER:
                return _contraction(t, _run_end(k, s + 1, n, LOWER), n)
    for j in starts:
        if j < n and k[j] & UPPER:
            return _contraction(t, _run_end(k, _run_end(k, j + 1, n, UPPER), n, LOWER), n)
    if kc & N:
        j = i + 1
        while j < n and j - i < 3 and k[j] & N:
            j += 1
        return j
    stop = SPACE | L | N
    j = i + 1 if c == " " and i + 1 < n and not k[i + 1] & stop else i
    if not k[j] & stop:
        j = _run_end_not(k, j + 1, n, stop)
        while j < n and t[j] in "\r\n/":
            j += 1
        return j
    return _breaks_or_spaces(t, k, i, n)


def run_matcher(bits: int, spaced: bool = False, limit: int = 0) -> Matcher:
    """``[class]+`` (``\\s?[class]+`` when spaced; single characters when limit is 1)."""
    def match(t: str, k: list[int], i: int, n: int) -> int:
        j = i + 1 if spaced and k[i] & SPACE and i + 1 < n and k[i + 1] & bits else i
        if not k[j] & bits:
            return -1
        return j + 1 if limit == 1 else _run_end(k, j + 1, n, bits)
    return match


def line_break(t: str, k: list[int], i: int, n: int) -> int:
    """``[\\r\\n]``."""
    return i + 1 if t[i] in CR_LF else -1


def three_digits(t: str, k: list[int], i: int, n: int) -> int:
    """``[0-9][0-9][0-9]``."""
    return i + 3 if i + 3 <= n and all("0" <= c <= "9" for c in t[i:i + 3]) else -1


def trailing_space(t: str, k: list[int], i: int, n: int) -> int:
    """``\\s+$``: the white space that ends the piece (one answer per run: a run
    that does not reach the end is stepped over by ``split``)."""
    if not k[i] & SPACE:
        return -1
    end = _run_end(k, i + 1, n, SPACE)
    return end if end == n else -end - 2


def split(text: str, match: Matcher) -> list[str]:
    """Every match, left to right, and the text between them (HF's "Isolated")."""
    n = len(text)
    k = [char_class(c) for c in text]
    out: list[str] = []
    gap = i = 0
    while i < n:
        j = match(text, k, i, n)
        if j < -1:
            i = -j - 2  # no match can start inside this run
            continue
        if j < 0:
            i += 1
            continue
        if gap < i:
            out.append(text[gap:i])
        out.append(text[i:j])
        i = gap = j
    if gap < n:
        out.append(text[gap:])
    return out


def falcon_bytes(piece: bytes) -> list[bytes]:
    """Falcon's splits after the byte alphabet: runs of numeric byte
    characters, then ``[0-9][0-9][0-9]`` within them."""
    out: list[bytes] = []
    i, n = 0, len(piece)
    while i < n:
        numeric = piece[i] in NUMERIC_BYTES
        j = i + 1
        while j < n and (piece[j] in NUMERIC_BYTES) == numeric:
            j += 1
        if not numeric:
            out.append(piece[i:j])
        else:
            gap = i
            while i < j:
                if i + 3 <= j and all(48 <= b <= 57 for b in piece[i:i + 3]):
                    if gap < i:
                        out.append(piece[gap:i])
                    out.append(piece[i:i + 3])
                    i = gap = i + 3
                else:
                    i += 1
            if gap < j:
                out.append(piece[gap:j])
        i = j
    return out


class PreTokenizer:
    """One rule: ``pieces(text)`` -> the byte strings BPE merges within."""

    def __init__(self, name: str, matchers: tuple[Matcher, ...], normalize: bool = False,
                 ignore_merges: bool = False, byte_split: Callable[[bytes], list[bytes]] | None = None) -> None:
        self.name = name
        self.matchers = matchers
        self.normalize = normalize
        self.ignore_merges = ignore_merges  # a piece that is a whole token is that token
        self.byte_split = byte_split

    def pieces(self, text: str) -> list[bytes]:
        """The pieces of ``text`` (lone surrogates stand for bytes that are not UTF-8)."""
        if self.normalize:
            text = nfc(text)
        parts = [text] if text else []
        for match in self.matchers:
            parts = [p for part in parts for p in split(part, match)]
        out = [p.encode("utf-8", "surrogateescape") for p in parts]
        if self.byte_split is not None:
            out = [b for piece in out for b in self.byte_split(piece)]
        return out


_DIGIT = run_matcher(NUMERIC, limit=1)
_SMOLLM = (_DIGIT, gpt2_match)
_RULES = [
    PreTokenizer("gpt-2", (gpt2_match,)),
    PreTokenizer("mpt", (gpt2_match,), normalize=True),
    PreTokenizer("smollm", _SMOLLM),
    PreTokenizer("command-r", _SMOLLM, normalize=True),
    PreTokenizer("llama-bpe", (tiktoken_matcher(3, L),), ignore_merges=True),
    PreTokenizer("qwen2", (tiktoken_matcher(1, L),), normalize=True),
    PreTokenizer("qwen35", (tiktoken_matcher(1, L | M),)),
    PreTokenizer("deepseek-llm", (line_break, run_matcher(DS_LETTER, spaced=True), run_matcher(DS_PUNCT, spaced=True),
                                  trailing_space, run_matcher(CJK), _DIGIT)),
    PreTokenizer("deepseek-coder", (line_break, run_matcher(L, spaced=True), run_matcher(P, spaced=True),
                                    run_matcher(CJK), _DIGIT)),
    PreTokenizer("falcon", (run_matcher(PUNCT), gpt2_match), byte_split=falcon_bytes),
    PreTokenizer("default", (run_matcher(DEF_PUNCT), gpt2_match, run_matcher(N), three_digits)),
    PreTokenizer("gpt-4o", (o200k_match,)),
]
RULES = {rule.name: rule for rule in _RULES}
# Other names llama.cpp gives the same rule (its llama-vocab.cpp), spelled as it spells them.
ALIASES = {"starcoder": "smollm", "refact": "smollm", "llama3": "llama-bpe", "llama-v3": "llama-bpe"}
PRE_TOKENIZERS = (*RULES, *ALIASES)


def pre_tokenizer(name: str) -> PreTokenizer | None:
    """The rule ``tokenizer.ggml.pre`` names, or None."""
    return RULES.get(ALIASES.get(name, name))
