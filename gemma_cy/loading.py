"""Opening a model's files: the weights and the tokenizer, each format chosen
by its magic bytes (docs/formats.md), with one-line errors for paths that
cannot be used. ``gemma_cy.load`` (gemma_cy.api) builds a Model from what
these return.
"""
from __future__ import annotations

import contextlib
import os

from .errors import ModelFormatError
from .formats.gguf_model import read_gguf
from .formats.gmw import read_gmw
from .formats.mapped import check_regular
from .formats.llama2c import V2_MAGIC_BYTES, is_llama2c_checkpoint, read_llama2c
from .model.weights import Weights
from .tokenizers.greedy import GreedyTokenizer
from .tokenizers.llama2c import Llama2cTokenizer


def read_magic(path: str) -> bytes:
    """The first 4 bytes of ``path``, with one-line errors for unusable paths."""
    if not os.path.exists(path):
        raise ModelFormatError(f"{path}: no such file")
    check_regular(path, os.stat(path), "model")
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot read ({e.strerror})") from None


@contextlib.contextmanager
def _taken_for(path: str, magic: bytes, what: str, guessed: bool, magics: str):
    """A file read as ``what`` without a magic saying so (``guessed``: by
    its name or sizes): its format error says which format it was taken
    for, so that a file of no known format is not reported as a broken
    llama2.c file."""
    try:
        yield
    except ModelFormatError as e:
        if not guessed:
            raise
        detail = str(e).removeprefix(f"{path}: ")
        raise ModelFormatError(f"{path}: unknown format: magic {magic!r} is not {magics}; read as a "
                               f"magic-less {what}, it fails: {detail}") from None


def open_weights(path: str) -> Weights:
    """Read a weights file, choosing the format by its magic bytes."""
    magic = read_magic(path)
    if magic == b"GMW1":
        return read_gmw(path)
    if magic == b"GGUF":
        return read_gguf(path)
    if is_llama2c_checkpoint(path):  # the v2 magic, a ".bin" name, or a legacy header fitting the size
        with _taken_for(path, magic, "legacy llama2.c checkpoint", magic != V2_MAGIC_BYTES,
                        "GMW1's, GGUF's or llama2.c v2's"):
            return read_llama2c(path)
    raise ModelFormatError(f"{path}: unknown weights format (magic {magic!r}; supported: GMW1, GGUF, "
                           f"llama2.c .bin)")


def open_tokenizer(path: str):
    """Read a tokenizer, choosing the format by its magic bytes: a GMT1 file
    (longest-match), or the vocabulary inside a GGUF model (by its
    ``tokenizer.ggml.model``: "gpt2" byte-level BPE, "gemma4" Gemma 4's BPE, else SentencePiece)."""
    magic = read_magic(path)
    if magic == b"GMT1":
        return GreedyTokenizer.from_file(path)
    if magic == b"GGUF":
        from .formats.gguf_reader import parse_gguf
        return tokenizer_from_gguf(parse_gguf(path))
    if path.endswith(".bin"):  # llama2.c's tokenizer.bin has no magic
        with _taken_for(path, magic, "llama2.c tokenizer.bin", True, "GMT1's or GGUF's"):
            return Llama2cTokenizer.from_file(path)
    raise ModelFormatError(f"{path}: unknown tokenizer format (magic {magic!r}; supported: GMT1, GGUF, "
                           f"llama2.c tokenizer.bin)")


# tokenizer.ggml.model values (llama.cpp's vocabulary types) gemma-cy reads.
TOKENIZER_MODELS = {"llama": "SentencePiece", "gpt2": "byte-level BPE", "gemma4": "Gemma 4's BPE"}


def tokenizer_from_gguf(gf):
    """The vocabulary of a parsed GGUF: byte-level BPE when its
    ``tokenizer.ggml.model`` is "gpt2", Gemma 4's BPE when "gemma4",
    SentencePiece when "llama" (or absent, as in the seed engine's files);
    any other model (WordPiece, Unigram...) is refused rather than read as SentencePiece."""
    model = gf.value("tokenizer.ggml.model")
    if model is not None and model not in TOKENIZER_MODELS:
        known = ", ".join(f"{k!r} ({v})" for k, v in TOKENIZER_MODELS.items())
        raise ModelFormatError(f"{gf.path}: tokenizer.ggml.model = {model!r} is not supported (supported: {known})")
    if model == "gpt2":
        from .tokenizers.bpe import BPETokenizer
        return BPETokenizer.from_gguf(gf)
    if model == "gemma4":
        from .tokenizers.gemma4_bpe import Gemma4Tokenizer
        return Gemma4Tokenizer.from_gguf(gf)
    from .tokenizers.sp import SentencePieceTokenizer
    return SentencePieceTokenizer.from_gguf(gf)


def default_tokenizer_path(weights: str) -> str:
    """A GGUF carries its own vocabulary; a llama2.c checkpoint's is tokenizer.bin in
    its directory (run.c's default name); a GMW1 file's tokenizer sits next to it (+ ".tok")."""
    magic = read_magic(weights)
    if magic != b"GMW1" and magic != b"GGUF" and is_llama2c_checkpoint(weights):
        return os.path.join(os.path.dirname(weights), "tokenizer.bin")
    return weights if magic == b"GGUF" else weights + ".tok"


def open_model_files(weights: str, tokenizer: str | None = None):
    """(Weights, tokenizer) of a model's files: ``tokenizer`` None is the
    default beside the weights (``default_tokenizer_path``); a GGUF that is
    both is parsed once. ModelFormatError when the two vocabularies differ."""
    tok_path = tokenizer if tokenizer is not None else default_tokenizer_path(weights)
    if tok_path == weights and read_magic(weights) == b"GGUF":  # one file: parse its header once
        from .formats.gguf_reader import parse_gguf
        gf = parse_gguf(weights)
        loaded, tok = read_gguf(gf), tokenizer_from_gguf(gf)
    else:
        loaded, tok = open_weights(weights), open_tokenizer(tok_path)
    if tok.vocab_size != loaded.config.vocab_size:
        raise ModelFormatError(
            f"tokenizer vocab_size = {tok.vocab_size} does not match the weights' vocab_size = "
            f"{loaded.config.vocab_size}")
    return loaded, tok
