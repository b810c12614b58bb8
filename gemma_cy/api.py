"""The public Python API: ``gemma_cy.load(...)`` -> ``Model``.

    >>> model = gemma_cy.load("models/tiny.gmw")
    >>> gen = model.generate("Once upon a time", n_dec=20, temperature=0)
    >>> text = "".join(step.text for step in gen); gen.stop_reason
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .tokenizers.chat import chat_format_for
from .generation.engines import DEFAULT_ENGINE, make_engine
from .errors import ModelFormatError, ParameterError, TokenIndexError
from .formats.gguf_model import read_gguf
from .formats.gmw import read_gmw
from .formats.llama2c import is_llama2c_checkpoint, read_llama2c
from .tokenizers.llama2c import Llama2cTokenizer
from .generation.generator import Generation, Observer
from .generation.sampling import Sampler
from .tokenizers.greedy import GreedyTokenizer
from .model.weights import Weights


def read_magic(path: str) -> bytes:
    """The first 4 bytes of ``path``, with one-line errors for unusable paths."""
    if not os.path.exists(path):
        raise ModelFormatError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelFormatError(f"{path}: is a directory, expected a file")
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot read ({e.strerror})") from None


def open_weights(path: str) -> Weights:
    """Read a weights file, choosing the format by its magic bytes."""
    magic = read_magic(path)
    if magic == b"GMW1":
        return read_gmw(path)
    if magic == b"GGUF":
        return read_gguf(path)
    if is_llama2c_checkpoint(path):  # the v2 magic, a ".bin" name, or a legacy header fitting the size
        return read_llama2c(path)
    raise ModelFormatError(f"{path}: unknown weights format (magic {magic!r}; supported: GMW1, GGUF, "
                           f"llama2.c .bin)")


def open_tokenizer(path: str):
    """Read a tokenizer, choosing the format by its magic bytes: a GMT1 file
    (longest-match), or the vocabulary inside a GGUF model (by its
    ``tokenizer.ggml.model``: "gpt2" byte-level BPE, else SentencePiece)."""
    magic = read_magic(path)
    if magic == b"GMT1":
        return GreedyTokenizer.from_file(path)
    if magic == b"GGUF":
        from .formats.gguf_reader import parse_gguf
        gf = parse_gguf(path)
        if gf.value("tokenizer.ggml.model") == "gpt2":
            from .tokenizers.bpe import BPETokenizer
            return BPETokenizer.from_gguf(gf)
        from .tokenizers.sp import SentencePieceTokenizer
        return SentencePieceTokenizer.from_gguf(gf)
    if path.endswith(".bin"):  # llama2.c's tokenizer.bin has no magic
        return Llama2cTokenizer.from_file(path)
    raise ModelFormatError(f"{path}: unknown tokenizer format (magic {magic!r}; supported: GMT1, GGUF, "
                           f"llama2.c tokenizer.bin)")


def default_tokenizer_path(weights: str) -> str:
    """A GGUF carries its own vocabulary; a llama2.c checkpoint's is tokenizer.bin in
    its directory (run.c's default name); a GMW1 file's tokenizer sits next to it (+ ".tok")."""
    magic = read_magic(weights)
    if magic != b"GMW1" and magic != b"GGUF" and is_llama2c_checkpoint(weights):
        return os.path.join(os.path.dirname(weights), "tokenizer.bin")
    return weights if magic == b"GGUF" else weights + ".tok"


def load(weights: str, tokenizer: str | None = None, engine: str = DEFAULT_ENGINE,
         max_cache_len: int = 8192, activations: str = "f32") -> "Model":
    """Load a model: ``weights`` file path (GMW1 or GGUF), ``tokenizer`` path
    (default: the GGUF itself, or weights + ".tok" for GMW1), ``engine``
    "fast" | "reference", and the KV cache length (context =
    min(max_cache_len, the model's max_seq_len)). ``activations="q8"`` is
    the opt-in int8-activation mode (gemma_cy.generation.engines.make_engine)."""
    weights = os.fspath(weights)
    loaded = open_weights(weights)
    tok = open_tokenizer(os.fspath(tokenizer) if tokenizer is not None else default_tokenizer_path(weights))
    if tok.vocab_size != loaded.config.vocab_size:
        raise ModelFormatError(
            f"tokenizer vocab_size = {tok.vocab_size} does not match the weights' vocab_size = "
            f"{loaded.config.vocab_size}")
    return Model(loaded, tok, engine, max_cache_len, activations)


class Model:
    """A loaded model: weights, tokenizer and an engine with its KV cache."""

    def __init__(self, weights: Weights, tokenizer: GreedyTokenizer, engine: str = DEFAULT_ENGINE,
                 max_cache_len: int = 8192, activations: str = "f32"):
        self.weights = weights
        self.config = weights.config
        self.tokenizer = tokenizer
        self.engine_name = engine
        self.engine = make_engine(engine, weights, max_cache_len, activations)
        self.chat = chat_format_for(tokenizer)  # None: the model has no chat template
        stops = {tokenizer.eos_id, *self.config.eos_ids}
        for piece in self.chat.stop_pieces if self.chat else ():
            tid = tokenizer.token_id(piece)
            if tid is not None:
                stops.add(tid)
        self.stop_ids = frozenset(stops)

    @property
    def context_len(self) -> int:
        """Positions in the KV cache: min(max_cache_len, model max)."""
        return self.engine.cache_len

    def tokenize(self, text: str | bytes, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, BOS first if ``add_bos`` (default: as the
        model's tokenizer says; Gemma yes, SmolLM2 no). Control pieces typed
        in ``text`` stay plain text unless ``parse_special``."""
        if add_bos is None:
            add_bos = self.tokenizer.add_bos
        ids = self.tokenizer.encode(text, parse_special=parse_special)
        return [self.tokenizer.bos_id] + ids if add_bos else ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (control tokens give nothing)."""
        return self.tokenizer.decode(list(ids))

    def chat_ids(self, prompt: str, first_turn: bool = True) -> list[int]:
        """One user turn in the model's chat template (``gemma_cy.tokenizers.chat``), ready
        for the model's reply: ``<bos>`` (if the model adds one) and the
        template's opening (e.g. a default system message) first. The
        template's markers are control tokens; the user's text is plain text.
        A later turn of a chat that kept its KV cache (``first_turn=False``)
        has neither and first closes the model's previous turn: generation
        stops on its end-of-turn piece without feeding it to the cache.
        Raises ParameterError when the model has no chat template."""
        if self.chat is None:
            raise ParameterError(f"chat format: {self.weights.source or 'this model'} has no chat template "
                                 f"(neither Gemma's nor ChatML); run it without --chat_format")
        before, after = self.chat.user.split("{prompt}")
        if first_turn:
            start = (([self.tokenizer.bos_id] if self.tokenizer.add_bos else [])
                     + self.tokenizer.encode(self.chat.first, parse_special=True))
        else:
            start = self.tokenizer.encode(self.chat.turn_end, parse_special=True)
        return (start
                + self.tokenizer.encode(before, parse_special=True)
                + self.tokenizer.encode(prompt, parse_special=False)
                + self.tokenizer.encode(after, parse_special=True))

    def prompt_ids(self, prompt: str | bytes | Sequence[int], chat_format: bool = False,
                   parse_special: bool = False) -> list[int]:
        """The ids a prompt runs as: text is tokenized, BOS first if the model
        adds one (an empty prompt is just [BOS] either way: the model needs
        one token to start from); a sequence of ints is taken as ids, checked."""
        if isinstance(prompt, (str, bytes)):
            if chat_format:
                text = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else prompt
                return self.chat_ids(text)
            return self.tokenize(prompt, parse_special=parse_special) or [self.tokenizer.bos_id]
        ids = [int(i) for i in prompt]
        for i in ids:
            if not 0 <= i < self.config.vocab_size:
                raise TokenIndexError(f"prompt id {i} outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def generate(self, prompt: str | bytes | Sequence[int] = "", n_dec: int = 250,
                 temperature: float = 0.7, min_p: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int = 0, chat_format: bool = False,
                 terminate_on_eos: bool = True, parse_special: bool = False,
                 observer: Observer | None = None, keep_cache: bool = False) -> Generation:
        """Start generating; iterate the result for ``Step(token_id, text)``.

        Sampling follows docs/generation.md#sampler: greedy unless ``min_p``, ``top_k`` or
        ``top_p`` is given (or temperature 0). ``keep_cache`` continues from the
        KV cache's current position (multi-turn chat) instead of resetting it.
        """
        sampler = Sampler(temperature=temperature, min_p=min_p, top_k=top_k, top_p=top_p, seed=seed)
        ids = self.prompt_ids(prompt, chat_format=chat_format, parse_special=parse_special)
        if not keep_cache:
            self.engine.reset()
        return Generation(self.engine, self.tokenizer, sampler, ids, n_dec,
                          stop_ids=self.stop_ids if terminate_on_eos else frozenset(),
                          observer=observer)

    def logits(self, prompt: str | bytes | Sequence[int], position: int = -1,
               observer: Observer | None = None) -> np.ndarray:
        """Logits (vocab,) f32 at ``position`` of the prompt (default: the last),
        computed from a fresh KV cache over the prompt up to that position."""
        ids = self.prompt_ids(prompt)
        n = len(ids)
        if isinstance(position, bool) or not isinstance(position, int) or not -n <= position < n:
            raise ParameterError(f"position = {position!r}, must be in [-{n}, {n}) for a {n}-token prompt")
        end = position % n + 1
        self.engine.reset()
        return np.array(self.engine.prefill(ids[:end], observer), copy=True)
