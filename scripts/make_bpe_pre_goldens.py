"""Golden ids for every byte-level BPE pre-tokenizer, from HF ``tokenizers`` (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_bpe_pre_goldens.py

For each rule of gemma_cy/tokenizers/bpe_pre.py the family's own HF pipeline
(``PIPELINES``: the normalizer and pre-tokenizer of its models'
``tokenizer.json``, ``ignore_merges`` where Llama 3 sets it; ``default`` is
llama.cpp's regex list, as HF Splits; ``gpt-4o`` is tiktoken's o200k_base
pattern as Phi-4-mini's and the other o200k tokenizer.json files split it, no
normalizer, no ``ignore_merges``) gets a small byte-level BPE trained
here with ``BpeTrainer`` on a seeded text (all 256 byte symbols, ~500
tokens, three control tokens). HF encodes the corpus (make_tokenizer_goldens'
seeded corpus, the smollm2 additions, and ``adversarial()``: strings aimed at
each rule's edges) and the script writes, gzipped JSON in tests/goldens/bpe_pre/:

``corpus.json.gz``     the strings, once for every rule;
``<rule>.json.gz``     the vocab (tokens in id order, control ids), the
                       merges, HF's ids of each string (control tokens as
                       text) and HF's pieces of each adversarial string;
                       a rule with strings of its own (``EXTRA``: gpt-4o's
                       ``o200k_strings()``) has them as ``extra``, after the
                       corpus, in its ids and pieces (and its training text),
                       so that the shared corpus and the other goldens stay
                       as they were.

It also writes gemma_cy/tokenizers/unicode_classes.py: the character classes
HF's components use, recorded over every code point (its regex engine's
``\\p{L}``, ``\\p{N}``, ``\\p{M}``, ``\\p{P}``, which are Unicode 16.0's general
categories, and its ``\\p{Lu}``..``\\p{Lo}``, checked to partition ``\\p{L}``
and to make o200k's two letter classes; ``Digits``' numeric test, Unicode
17.0's N; ``Punctuation``'s table, older than both; the characters its NFC
normalizer knows), and checks that HF's ``\\s`` is the White_Space set
bpe_pre names.
"""
from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
OUT = ROOT / "tests" / "goldens" / "bpe_pre"
TABLES = ROOT / "gemma_cy" / "tokenizers" / "unicode_classes.py"
SEED = 20261204
VOCAB_SIZE = 520
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_WORD = r"[^\r\n\p{L}\p{N}]?%s(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
O200K = (_WORD % f"{_UPPER}*{_LOWER}+" + "|" + _WORD % f"{_UPPER}+{_LOWER}*"
         + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # tiktoken's o200k_base
CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


def deepseek_letters() -> str:
    from gemma_cy.tokenizers.bpe_pre import DS_LETTERS

    return "".join(f"{p[0]}-{p[1]}" if p[0] != p[1] else p[0] for p in DS_LETTERS.split(" "))


def pipelines() -> dict:
    """rule -> (normalizer, pre-tokenizer, ignore_merges), as each family's tokenizer.json declares them."""
    from tokenizers import Regex, normalizers
    from tokenizers import pre_tokenizers as pt

    def split(pattern: str):
        return pt.Split(Regex(pattern), behavior="isolated", invert=False)

    bytes_only = pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    byte_level = pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    smollm = pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    return {
        "gpt-2": (None, byte_level, False),
        "mpt": (normalizers.NFC(), byte_level, False),
        "smollm": (None, smollm, False),
        "command-r": (normalizers.NFC(), smollm, False),
        "llama-bpe": (None, pt.Sequence([split(LLAMA3), bytes_only]), True),
        "qwen2": (normalizers.NFC(), pt.Sequence([split(QWEN2), bytes_only]), False),
        "qwen35": (None, pt.Sequence([split(QWEN35), bytes_only]), False),
        "deepseek-llm": (normalizers.Sequence([]), pt.Sequence([
            split("[\r\n]"), split(f"\\s?[{deepseek_letters()}]+"),
            split("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"), split("\\s+$"), split(CJK),
            pt.Digits(individual_digits=True), bytes_only]), False),
        "deepseek-coder": (normalizers.Sequence([]), pt.Sequence([
            split("[\r\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"), split(CJK),
            pt.Digits(individual_digits=True), bytes_only]), False),
        "falcon": (None, pt.Sequence([pt.Punctuation(behavior="contiguous"), byte_level,
                                      pt.Digits(individual_digits=False), split("[0-9][0-9][0-9]")]), False),
        "default": (None, pt.Sequence([split(r"[\p{P}\$\+<=>\^~\|]+"), split(GPT2), split(r"\p{N}+"),
                                       split("[0-9][0-9][0-9]"), bytes_only]), False),
        "gpt-4o": (None, pt.Sequence([split(O200K), bytes_only]), False),
    }


# ---------------------------------------------------------------- character classes


def _code_points() -> list[str]:
    return [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def _ranges(cps: set[int]) -> list[str]:
    """Hex words: ``lo-hi`` (inclusive), ``c``, and ``lo-hi/2`` for every other
    code point of lo..hi (three or more; upper and lower case often alternate)."""
    runs: list[list[int]] = []
    for c in sorted(cps):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    out: list[str] = []
    i = 0
    while i < len(runs):
        j = i
        while runs[i][0] == runs[i][1] and j + 1 < len(runs) and runs[j + 1][0] == runs[j + 1][1] == runs[j][0] + 2:
            j += 1
        a, b = runs[i]
        if j - i >= 2:
            out.append(f"{a:x}-{runs[j][0]:x}/2")
            i = j + 1
            continue
        out.append(f"{a:x}" if a == b else f"{a:x}-{b:x}")
        i += 1
    return out


def record_classes() -> tuple[dict[str, set[int]], set[int]]:
    """Every code point HF's components put in each class (module docstring), and its ``\\s``."""
    from tokenizers import Regex, normalizers
    from tokenizers import pre_tokenizers as pt

    chars = _code_points()
    text = "".join(chars)

    def regex_class(pattern: str) -> set[int]:
        kept = bytearray(len(text))
        for _, (a, b) in pt.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text):
            kept[a:b] = b"\1" * (b - a)
        return {ord(chars[i]) for i in range(len(text)) if not kept[i]}

    spaced = "a".join(chars)

    def alone(pre) -> set[int]:
        return {ord(p) for p, _ in pre.pre_tokenize_str(spaced) if len(p) == 1 and p != "a"}

    nfd = normalizers.NFD()
    nfc_active: set[int] = set()
    for c in chars:
        d = nfd.normalize_str(c)
        if d != c:  # decomposes: it and every part of it take part in composition
            nfc_active.add(ord(c))
            nfc_active.update(ord(x) for x in d)
        elif (nfd.normalize_str("a" + c + "\u0334") != "a" + c + "\u0334"
              or nfd.normalize_str("a\u093c" + c) != "a\u093c" + c):
            nfc_active.add(ord(c))  # a combining class: > 1 moves U+0334 (1) before it, 1..6 moves before U+093C (7)
    classes = {"LETTER": regex_class(r"\p{L}"), "NUMBER": regex_class(r"\p{N}"), "MARK": regex_class(r"\p{M}"),
               "PUNCTUATION": regex_class(r"\p{P}"), "NUMERIC": alone(pt.Digits(individual_digits=True)) - {97},
               "PUNCTUATION_HF": alone(pt.Punctuation()), "NFC_ACTIVE": nfc_active}
    cases = {c: regex_class(rf"\p{{{c}}}") for c in ("Lu", "Lt", "Ll", "Lm", "Lo")}
    if sum(map(len, cases.values())) != len(classes["LETTER"]) or set().union(*cases.values()) != classes["LETTER"]:
        raise SystemExit("HF's \\p{Lu}, \\p{Lt}, \\p{Ll}, \\p{Lm}, \\p{Lo} do not partition its \\p{L}")
    classes["LETTER_UPPER"], classes["LETTER_LOWER"] = cases["Lu"] | cases["Lt"], cases["Ll"]
    upper, lower = (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")  # o200k's two classes
    both = (classes["LETTER"] - classes["LETTER_UPPER"] - classes["LETTER_LOWER"]) | classes["MARK"]
    if regex_class(upper) != classes["LETTER_UPPER"] | both or regex_class(lower) != classes["LETTER_LOWER"] | both:
        raise SystemExit("HF's o200k letter classes are not the unions bpe_pre builds")
    return classes, regex_class(r"\s")


def write_classes(classes: dict[str, set[int]]) -> None:
    lines = ['r"""Character classes of HF ``tokenizers``, recorded over every code point by',
             'scripts/make_bpe_pre_goldens.py (do not edit; see gemma_cy/tokenizers/bpe_pre.py).',
             "",
             "LETTER, NUMBER, MARK, PUNCTUATION: its regex engine's \\p{L}, \\p{N}, \\p{M}, \\p{P}",
             "(Unicode 16.0 general categories). NUMERIC: what its Digits pre-tokenizer splits",
             "(Unicode 17.0's N). PUNCTUATION_HF: what its Punctuation pre-tokenizer splits (ASCII",
             "punctuation and an older table's P). NFC_ACTIVE: the characters its NFC tables give",
             "a combining class, a decomposition or a part in one. LETTER_UPPER, LETTER_LOWER: its",
             "\\p{Lu} with \\p{Lt}, and \\p{Ll} (the rest of LETTER is \\p{Lm} and \\p{Lo}). Ranges: hex,",
             "inclusive; lo-hi/2 is every other code point from lo to hi.",
             '"""']
    for name, cps in classes.items():
        words = _ranges(cps)
        lines.append(f"{name} = (")
        row = ""
        for w in words:
            if len(row) + len(w) + 1 > 100:
                lines.append(f'    "{row}"')
                row = ""
            row += w + " "
        lines.append(f'    "{row}"')
        lines.append(")")
    TABLES.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {TABLES.relative_to(ROOT)}: {len(lines)} lines", file=sys.stderr)


# ---------------------------------------------------------------- corpus and goldens

DIGIT_SETS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹¼½¾", "ⅠⅡⅢⅫ", "𝟘𝟙𝟚"]
MARKS = ["\u0301", "\u0308", "\u0316", "\u0334", "\u093c", "\u0345", "\u07fd", "\u0898", "\u1ac1", "\u20dd"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\x85", "\u200b", "\x1c", "\v"]


def adversarial(seed: int = SEED) -> list[str]:
    """Strings aimed at the rules' edges (recorded with HF's pieces too)."""
    rng = random.Random(seed)
    texts = [f"x{d * k}y" for d in ("1", "٣", "７", "²") for k in range(1, 8)]
    texts += [f"a {d[:k]}" for d in DIGIT_SETS for k in (1, 2, 3, 4, 7)] + [" 12", " 1234567", "12 345 6789"]
    texts += [f"{w}'{c}" for w in ("it", "IT", "I") for c in ("s", "S", "ſ", "ll", "LL", "Ll", "re", "RE", "ve", "VE",
                                                               "m", "M", "d", "D", "t", "T", "x", "")]
    texts += ["'s", "'S", "'ſ", "''s", " 's", "  'LL", "’s", "'s's", "don't!", "'sa", "'\u0301s", "'ſa", "x'ſt", "'ſſ",
              "I'ſ good", "'Sx", "'LLx", "'ﬅx", "'\u212ax"]
    texts += ["a\r\nb", "a\r\n\r\nb", "\r\n\r\n", "a \r\n b", "a  \n  b", "a \t\n\t b", "  \n", "x\n ", "\r", "a\r\rb",
              ".\n\n", "!!\r\n", "a  ", "a\u00a0b", "a \u00a0b", "a\u3000b", "\u3000。", " 。", "a\u2028b", "a\x85b"]
    texts += ["e\u0301", "\u00e9", "a\u0316\u0301", "a\u0301\u0316", "x\u07fd\u0316", "a\u0898\u0316",
              "\U00011935\U00011930", "\U00011938", "\u1100\u1161\u11a8", "\uac00\u11a8", "Å Å", "ﬁ", "\u0344",
              " \u0301word", "\u0301\u0301", "word\u0301\u0301 ", "\u0915\u093f\u0902", " \u093fa"]
    texts += ["\U000105c0\U000105c1", "a\U00010940b", "\U00011de0\U00011de1", "x\U00010d40", "\u0378\u0379", "\U000e0001"]
    texts += ["ΐ\u1fd3Ί\u1fdbώ\u1f7dι\u1fbeΩ\u2126K\u212aÅ\u212b", "ǅǆ ʔ ƻ", "Ὑὗ", "𐐀𐑏𞤀𞥃𞥄", "µ ª º"]
    texts += ["ò в ²", "²³¹", "Ù£", "x²y", "१२३४"]
    texts += ["$+<=>^~|`", "a$b", "(a)", "«a»", "a--b", "...", "a\u2e45b", "\U0001144b", "\u166d\u111c9"]
    texts += ["我们 가나다 ア。", "一龥龦", "\u0800\u4e00", "\ud7ff\uac00", "▁ ▁", "Việt Nam"]
    texts += ["😀😀", "👍🏽 a", "🇫🇷🇯🇵", "x🎉y", "\u200d\u200d"]
    alphabet = ("aZ'ſsSlL .,!?$<|~`-_\t\n\r\u00a0\u3000" + "".join(DIGIT_SETS) + "".join(MARKS)
                + "éñ你가ア。！а\u1fd3\u212a😀\U000105c0\U00011de0")
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 16))) for _ in range(240)]
    texts += ["".join(rng.choice(SPACES) for _ in range(rng.randint(1, 6))) + rng.choice(["x", "1", ".", "", "é"])
              for _ in range(60)]
    return texts


def o200k_strings(seed: int = SEED) -> list[str]:
    """Strings aimed at gpt-4o's pattern (its golden alone: the shared corpus stays as it was)."""
    rng = random.Random(seed + 1)
    texts = ["HelloWorld", "iPhone", "McDonald's", "ALLCAPS'LL", "HTMLParser", "getHTTPResponseCode", "camelCase",
             "snake_case", "Hello World", " HelloWorld", "ABC", "ABCdef", "aBC", "A", "a", "I'm", "I'M", "it's", "IT'S",
             "don'T", "we'Ve", "x'ſ", "X'ſt", "they'LL've", "'s", "'S'", " 's", "O'Neil", "o'neil's", "rock'n'roll",
             "a/b\n", "a/b\n/c", ".\n/", "x.\r\n//y", "#!/usr/bin\n/", "http://x.y/z", "a //b", " /", "/\n\n/",
             "12345", "1234567", "x1234y", "a 1 22 333 4444", "３４５６", "٣٤٥٦", "ⅫⅫⅫⅫ", "1/2", "3.14159",
             "helloÉcole", "ÉCOLEdu", "ΑλφαΒήτα", "ΣΊΣΥΦΟΣ's", "МоскваРоссия", "StraßeSTRASSE", "ǅemal ǈubljana",
             "ᾈδης ᾼ", "ʰʲxʷ", "aʰB", "Aʰb", "々々a", "x々Y", "ﬁﬀ ﬃ", "ﬁX", "Xﬁ",
             "e\u0301", "E\u0301cole", "e\u0301COLE", "\u0301's", "\u0301\u0301a", " \u0301a", "a\u0301\u0301B",
             "A\u0301b", "\u0301X", "x\u0301'S", "\u0915\u093f\u0902\u0924\u0941", "नमस्ते दुनिया",
             "我们Hello", "Hello我们world", "カタカナABCdef", "ひらがなabc", "한국어Korean", "가A나b",
             "\u1c89\u1c8a", "\ua7cb\ua7cd", "\ua7dax\ua7db", "\U00010d50\U00010d70", "a\U0001e030B", "\U0001df25X",
             "x\U00010d4e", "A\U0001e4ebb", "tab\tWord", "\tWord", "\rWord", "\nWord", "\u00a0Word", "\u3000Word",
             "(Hello)", "[iPhone]", "-McDonald", "$HOME", "@User's", "😀Hello", "👍🏽iPhone", "a\u200dB"]
    alphabet = ("aAbBzZ'sStTlLmMdDreRE" + "ſ/ .-_\t\n\r\u00a0" + "0129٣３Ⅻ" + "ǅʰ々ªéÉßσΣ" + "\u0301\u093c\u0345"
                + "你가ア" + "\u1c89\u1c8a\U0001e030" + "😀")
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 16))) for _ in range(300)]
    # often enough that the trained vocab merges across Llama 3's piece ends (its golden then fails under that name)
    texts += ["It's the iPhone's day, isn't it? We're sure they'll say so.\n/usr/e\u0301te\u0301 " * 60]
    return texts


EXTRA = {"gpt-4o": o200k_strings}  # rule -> its own strings, after the shared corpus


def build(rule: str, texts: list[str]):
    """The rule's HF tokenizer with a BPE trained here on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, trainers
    from tokenizers import pre_tokenizers as pt

    normalizer, pre, ignore_merges = pipelines()[rule]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pt.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def add_whole_words(tok, texts: list[str], count: int = 12):
    """Llama 3's vocab has tokens its merges never make; give the trained one
    some (the corpus' most frequent pieces that are not tokens yet, appended
    to the vocab with no merge), so that the goldens check ``ignore_merges``."""
    from collections import Counter

    from tokenizers import Tokenizer

    vocab = tok.get_vocab()
    seen = Counter(p for t in texts for p, _ in tok.pre_tokenizer.pre_tokenize_str(t))
    words = [p for p, _ in seen.most_common() if p not in vocab and len(p) >= 3][:count]
    spec = json.loads(tok.to_str())
    for word in words:
        spec["model"]["vocab"][word] = len(spec["model"]["vocab"])
    return Tokenizer.from_str(json.dumps(spec))


def goldens(rule: str, texts: list[str], n_adversarial: int) -> dict:
    extra = EXTRA[rule]() if rule in EXTRA else []
    texts, n_adversarial = texts + extra, n_adversarial + len(extra)
    tok = build(rule, texts)
    if pipelines()[rule][2]:
        tok = add_whole_words(tok, texts)
    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise SystemExit(f"{rule}: the vocab's ids are not 0..n-1")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tok.encode_special_tokens = True
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    tok.encode_special_tokens = False
    parsed = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    normalizer, pre, _ = pipelines()[rule]
    pieces = []
    for text in texts[-n_adversarial:]:
        normal = normalizer.normalize_str(text) if normalizer is not None else text
        pieces.append([p for p, _ in pre.pre_tokenize_str(normal)])
    got = {"pre": rule, "tokens": tokens, "control": [vocab[t] for t in SPECIALS], "merges": merges,
           "ignore_merges": model.get("ignore_merges", False), "ids": ids,
           "ids_special": {str(i): p for i, (p, q) in enumerate(zip(parsed, ids)) if p != q},
           "adversarial_pieces": pieces}
    if extra:
        got["extra"] = extra
    return got


def corpus_texts() -> tuple[list[str], int]:
    from make_smollm2_goldens import smollm2_corpus

    extra = adversarial()
    return smollm2_corpus() + extra, len(extra)


def write_gz(path: Path, obj) -> int:
    data = gzip.compress(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8"), mtime=0)
    path.write_bytes(data)
    return len(data)


def main() -> int:
    classes, space = record_classes()
    write_classes(classes)  # before bpe_pre, which reads them, is imported
    from gemma_cy.tokenizers.bpe_pre import WHITESPACE

    if space != {ord(c) for c in WHITESPACE}:
        raise SystemExit("HF's \\s is not the White_Space set of bpe_pre.WHITESPACE")
    texts, n_adversarial = corpus_texts()
    OUT.mkdir(parents=True, exist_ok=True)
    size = write_gz(OUT / "corpus.json.gz", {"texts": texts, "adversarial": n_adversarial})
    for rule in pipelines():
        got = goldens(rule, texts, n_adversarial)
        size += write_gz(OUT / f"{rule}.json.gz", got)
        print(f"{rule}: {len(got['tokens'])} tokens, {len(got['merges'])} merges, "
              f"{sum(map(len, got['ids']))} ids", file=sys.stderr)
    print(f"wrote {len(texts)} strings x {len(pipelines())} rules to {OUT.relative_to(ROOT)}: {size} bytes",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
