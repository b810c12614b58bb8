"""The test fixture tokenizer: a deterministic English-ish GMT1 vocabulary.

Layout of ``fixture_vocab(n)``:

    ids 0..5          control: <pad> <eos> <bos> <unk> <start_of_turn> <end_of_turn>
    ids 6..n-257      normal pieces: the lists below (words with and without
                      a leading space, punctuation, digits, suffixes), then
                      generated lowercase letter groups (" aa", "aa", " ab"...)
                      for as many as are needed
    ids n-256..n-1    the 256 byte pieces, byte b at id n-256+b

Every piece is unique, so no piece is shadowed by another. A normal piece is
never a single byte (that is what the byte pieces are for). Scores are
-id for normal and byte pieces and 0 for control pieces.
"""
from __future__ import annotations

import operator
from itertools import product
from string import ascii_lowercase

from ..formats.gmt import PIECE_BYTE, PIECE_CONTROL, PIECE_NORMAL, Vocab

CONTROL_PIECES = (b"<pad>", b"<eos>", b"<bos>", b"<unk>", b"<start_of_turn>", b"<end_of_turn>")
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
N_BYTES = 256
MIN_NORMAL = 8  # a fixture with fewer word pieces is not a tokenizer worth testing
MIN_VOCAB = len(CONTROL_PIECES) + MIN_NORMAL + N_BYTES
MAX_VOCAB = 1 << 20  # bounds the generation time (about 1 s per 256k pieces)

# Most frequent first: a small vocab keeps the head of this list.
WORDS = """
the of and to in is it that was for on are as with he she they be at one have
this from or had by not word but what some we can out other were all there
when up use your how said an each which do their time if will way about many
then them write would like so these her long make thing see him two has look
more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place
made live where after back little only round man year came show every good me
give our under name very through just form sentence great think say help low
line differ turn cause much mean before move right boy old too same tell does
set three want air well also play small end put home read hand port large
spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near
build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw
left late run while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those
both mark often letter until mile river car feet care second book carry took
science eat room friend began idea fish mountain stop once base hear horse cut
sure watch color face wood main enough plain girl usual young ready above ever
red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete
ship area half rock order fire south problem piece told knew pass since top
whole king space heard best hour better true during hundred five remember step
early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold
notice voice unit power town fine certain fly fall lead cry dark machine note
wait plan figure star box noun field rest correct able pound done beauty drive
stood contain front teach week final gave green quick develop ocean warm free
minute strong special mind behind clear tail produce fact street inch multiply
nothing course stay wheel full force blue object decide surface deep moon
island foot system busy test record boat common gold possible plane stead dry
wonder laugh thousand ago ran check game shape equate hot miss brought heat
snow tire bring yes distant fill east paint language among model token text
""".split()

CAPITALIZED = """
The It In This He She We They You What When There How If And But Then So
""".split()

SUFFIXES = """
ing ed er ly es est tion ment ness able ful less ous ive al ity ism ist ize
ship hood ward wise
""".split()

PUNCTUATION = (
    ", ", ". ", "! ", "? ", ": ", "; ", ".\n", "\n\n", "  ", "...", " (", ") ",
    " \"", "\" ", " '", "'s", "n't", "'re", "'ll", "'ve", "'m", "'d", " -", " --",
    "--", ",\n", " $", "%)", "**", "##",
)

DIGITS = tuple(f" {d}" for d in range(10))
NUMBERS = tuple(f"{d:02d}" for d in range(100))
HEAD_WORDS = 100  # the most common words come before the short lists


def _listed_pieces() -> list[bytes]:
    """The hand-written normal pieces, most useful first, duplicates dropped.

    The 1024 fixture keeps about the first 760: the common words, every
    punctuation, digit, suffix and capitalized piece, and most other words.
    """
    def with_and_without_space(words):
        return [form for word in words for form in (" " + word, word)]

    ordered = (
        with_and_without_space(WORDS[:HEAD_WORDS])
        + list(PUNCTUATION)
        + list(DIGITS)
        + SUFFIXES
        + with_and_without_space(CAPITALIZED)
        + with_and_without_space(WORDS[HEAD_WORDS:])
        + list(NUMBERS)
    )
    seen: set[bytes] = set()
    pieces = []
    for text in ordered:
        piece = text.encode("utf-8")
        if len(piece) > 1 and piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return pieces


def _normal_pieces(count: int) -> list[bytes]:
    """``count`` unique multi-byte normal pieces: the list, then letter groups."""
    pieces = _listed_pieces()[:count]
    seen = set(pieces)
    length = 2
    while len(pieces) < count:
        for letters in product(ascii_lowercase, repeat=length):
            word = "".join(letters).encode("ascii")
            for piece in (b" " + word, word):
                if piece not in seen:
                    seen.add(piece)
                    pieces.append(piece)
            if len(pieces) >= count:
                break
        length += 1
    return pieces[:count]


def fixture_vocab(vocab_size: int = 1024) -> Vocab:
    """The fixture tokenizer with ``vocab_size`` pieces (layout: module docstring).

    ``vocab_size`` must be in [MIN_VOCAB, MAX_VOCAB]; 1024 matches the tiny
    weights preset, 262144 the Gemma-3-sized benchmark preset.
    """
    n = operator.index(vocab_size)
    if not MIN_VOCAB <= n <= MAX_VOCAB:
        raise ValueError(
            f"fixture vocab_size {n} must be in [{MIN_VOCAB}, {MAX_VOCAB}] "
            f"({len(CONTROL_PIECES)} control + at least {MIN_NORMAL} normal + {N_BYTES} byte pieces)"
        )
    normal = _normal_pieces(n - len(CONTROL_PIECES) - N_BYTES)
    pieces = list(CONTROL_PIECES) + normal + [bytes([b]) for b in range(N_BYTES)]
    types = (
        [PIECE_CONTROL] * len(CONTROL_PIECES)
        + [PIECE_NORMAL] * len(normal)
        + [PIECE_BYTE] * N_BYTES
    )
    scores = [0.0 if t == PIECE_CONTROL else -float(i) for i, t in enumerate(types)]
    return Vocab(pieces, types, scores, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID, pad_id=PAD_ID)
