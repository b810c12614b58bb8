"""The public Python API: ``gemma_cy.load(...)`` -> ``Model`` (docs/generation.md#python-api).

    >>> model = gemma_cy.load()                     # the default model, Gemma 3 270M
    >>> model.complete("The capital of France is", max_tokens=20, temperature=0).text
    >>> for step in model.chat([{"role": "user", "content": "Hi!"}]):
    ...     print(step.text, end="")
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Sequence

import numpy as np

from .tokenizers.chat import chat_ids, chat_template_for
from .generation.engines import DEFAULT_ENGINE, make_engine
from .generation.penalties import DEFAULT_REPEAT_LAST_N, Penalties
from .generation.sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE
from .generation.session import Session
from .errors import GemmaCyError, ModelFormatError, ParameterError, TokenIndexError
from .formats.gguf_model import read_gguf
from .formats.gmw import read_gmw
from .formats.mapped import check_regular, return_freed_heap
from .formats.llama2c import V2_MAGIC_BYTES, is_llama2c_checkpoint, read_llama2c
from .tokenizers.llama2c import Llama2cTokenizer
from .generation.evaluation import Evaluation, check_ctx, evaluate
from .generation.batch import BatchGeneration, SlotEngine
from .generation.generator import Completion, Generation, Observer, check_prompt_fits
from .generation.constraint import CONSTRAINT_KEYWORDS, Constraint, ConstraintCompiler, constraint_spec
from .generation.logprobs import check_top_logprobs
from .generation.speculative import DRAFT_MAX, DraftModel, check_draft_max, check_speculative
from .generation.stops import check_stop_strings
from .generation.sampling import Sampler
from .tokenizers.greedy import GreedyTokenizer
from .tokenizers.token_bytes import vocabulary_digest
from .model.weights import Weights


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


def load(weights: str | os.PathLike | None = None, tokenizer: str | None = None, engine: str = DEFAULT_ENGINE,
         max_cache_len: int = 8192, activations: str = "f32", max_sequences: int = 1) -> "Model":
    """Load a model: ``weights`` file path (GGUF, GMW1 or a llama2.c
    checkpoint; None: the default model, Gemma 3 270M from its package),
    ``tokenizer`` path (default: the GGUF itself, weights + ".tok" for
    GMW1, tokenizer.bin beside a llama2.c checkpoint), ``engine`` "fast" |
    "reference", and the KV cache length (context = min(max_cache_len, the
    model's max_seq_len)). ``activations="q8"`` is the opt-in
    int8-activation mode (gemma_cy.generation.engines.make_engine).
    ``max_sequences``: how many sequences ``generate_many`` runs at once,
    each with its own KV cache of that context (docs/generation.md#batching)."""
    if weights is None:
        from .formats.packaged import default_model_path
        weights = default_model_path()
    weights = os.fspath(weights)
    tok_path = os.fspath(tokenizer) if tokenizer is not None else default_tokenizer_path(weights)
    if tok_path == weights and read_magic(weights) == b"GGUF":  # one file: parse its header once
        from .formats.gguf_model import read_gguf
        from .formats.gguf_reader import parse_gguf
        gf = parse_gguf(weights)
        loaded, tok = read_gguf(gf), tokenizer_from_gguf(gf)
    else:
        loaded, tok = open_weights(weights), open_tokenizer(tok_path)
    return_freed_heap()  # before the engine lays out its weights: the start-up peak
    if tok.vocab_size != loaded.config.vocab_size:
        raise ModelFormatError(
            f"tokenizer vocab_size = {tok.vocab_size} does not match the weights' vocab_size = "
            f"{loaded.config.vocab_size}")
    return Model(loaded, tok, engine, max_cache_len, activations, max_sequences)


# What one sequence of a batch may set (Model._generation's keywords, less the engine's own).
_SEQUENCE_KEYWORDS = frozenset({"max_tokens", "n_dec", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                "presence_penalty", "frequency_penalty", "repeat_last_n", "seed", "rng", "stop",
                                "logits_processor", "accept_token", "terminate_on_eos", "logprobs",
                                "speculative", "draft_max", *CONSTRAINT_KEYWORDS})


def _several_prompts(prompt) -> bool:
    """True for a list of prompts (its items strings, bytes or id lists), not one prompt of ids."""
    return (isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and len(prompt) > 0
            and all(isinstance(p, (str, bytes)) or (isinstance(p, Sequence) and not isinstance(p, (str, bytes)))
                    for p in prompt))


def _max_tokens(max_tokens, n_dec) -> int:
    """``max_tokens`` and its seed name ``n_dec``: either, or both if equal; default 250."""
    if max_tokens is not None and n_dec is not None and max_tokens != n_dec:
        raise ParameterError(f"max_tokens = {max_tokens!r} and n_dec = {n_dec!r}: give one of them")
    value = max_tokens if max_tokens is not None else n_dec
    return 250 if value is None else value


class Model:
    """A loaded model: weights, tokenizer, chat template and an engine with its KV cache.

    The model has one KV cache per slot (``max_sequences``; one by
    default), so one generation runs on a slot at a time: starting another
    (``generate``, ``chat``, ``complete``...) or calling ``logits`` takes the
    cache over, and resuming the older generation raises
    GenerationStateError naming the slot
    (docs/generation.md#one-generation-at-a-time). A cache outlives its
    generation: a prompt that starts with what the cache holds runs only
    the rest (docs/generation.md#prefix-reuse).
    """

    def __init__(self, weights: Weights, tokenizer: GreedyTokenizer, engine: str = DEFAULT_ENGINE,
                 max_cache_len: int = 8192, activations: str = "f32", max_sequences: int = 1):
        self.weights = weights
        self.config = weights.config
        self.tokenizer = tokenizer
        self.engine_name = engine
        self.max_sequences = max_sequences
        self.engine = make_engine(engine, weights, max_cache_len, activations, max_sequences)
        self.session = Session(self.engine, 0 if max_sequences > 1 else None)
        self._sessions: list[Session] | None = None  # every slot's, slot 0's being self.session
        self.chat_template = chat_template_for(tokenizer)  # None: the model has no chat template
        stops = {tokenizer.eos_id, *self.config.eos_ids}
        for piece in self.chat_template.stop_pieces if self.chat_template else ():
            tid = tokenizer.token_id(piece)
            if tid is not None:
                stops.add(tid)
        self.stop_ids = frozenset(stops)
        self._constraints: ConstraintCompiler | None = None  # built at the first constrained generation

    @property
    def context_len(self) -> int:
        """Positions in the KV cache: min(max_cache_len, model max)."""
        return self.engine.cache_len

    def tokenize(self, text: str | bytes, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, BOS first if ``add_bos`` (default: as the
        model's tokenizer says; Gemma yes, SmolLM2 no; and then EOS last when
        the file's ``add_eos_token`` says so). Control pieces typed
        in ``text`` stay plain text unless ``parse_special``."""
        add_eos = add_bos is None and getattr(self.tokenizer, "add_eos", False)  # the file's, with its add_bos
        if add_bos is None:
            add_bos = self.tokenizer.add_bos
        ids = self.tokenizer.encode(text, parse_special=parse_special)
        return [self.tokenizer.bos_id] * add_bos + ids + [self.tokenizer.eos_id] * add_eos

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (control tokens give nothing)."""
        return self.tokenizer.decode(list(ids))

    def chat_ids(self, messages: str | Sequence[dict], system: str | None = None,
                 add_generation_prompt: bool = True, tools: Sequence[dict] | None = None,
                 template_kwargs: dict | None = None) -> list[int]:
        """Token ids of a chat in the model's template, ready for its reply
        (gemma_cy.tokenizers.chat.render: ``messages`` [{"role", "content"}], or
        one user prompt as a string after ``system``; ``tools`` and
        ``template_kwargs`` as transformers passes them). The markers are control
        tokens, the messages' text plain text. ParameterError: no chat template."""
        if self.chat_template is None:
            raise ParameterError(f"chat format: {self.weights.source or 'this model'} has no chat template "
                                 f"(neither its own nor Gemma's or ChatML's markers); run it without chat")
        if isinstance(messages, (str, bytes)):
            text = messages.decode("utf-8", "replace") if isinstance(messages, bytes) else messages
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": text}]
        elif system is not None:
            raise ParameterError("system: give the system message inside messages, or a prompt string")
        return chat_ids(self.tokenizer, self.chat_template, messages, add_generation_prompt, tools, template_kwargs)

    def prompt_ids(self, prompt: str | bytes | Sequence[int], chat_format: bool = False,
                   parse_special: bool = False, system: str | None = None) -> list[int]:
        """The ids a prompt runs as: text is tokenized, BOS first if the model
        adds one (an empty prompt is just [BOS] either way: the model needs
        one token to start from); with ``chat_format`` it is one user turn
        of the chat template (after ``system``, if given); a sequence of
        ints is taken as ids, checked."""
        if isinstance(prompt, (str, bytes)):
            if chat_format:
                return self.chat_ids(prompt, system=system)
            if system is not None:
                raise ParameterError("system: a system message needs the chat format (chat_format=True)")
            return self.tokenize(prompt, parse_special=parse_special) or [self.tokenizer.bos_id]
        if prompt and all(isinstance(m, dict) for m in prompt):
            raise ParameterError("prompt: a list of messages goes to Model.chat(messages), not generate()")
        ids = []
        for i in prompt:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise ParameterError(f"prompt: expected text or token ids (ints), got an element {i!r:.60}")
            ids.append(int(i))
        for i in ids:
            if not 0 <= i < self.config.vocab_size:
                raise TokenIndexError(f"prompt id {i} outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _generation(self, ids: list[int], *, max_tokens=None, n_dec=None, temperature=DEFAULT_TEMPERATURE,
                    top_k=0, top_p=1.0, min_p=DEFAULT_MIN_P, repeat_penalty=1.0, presence_penalty=0.0,
                    frequency_penalty=0.0, repeat_last_n=DEFAULT_REPEAT_LAST_N, seed=0, rng=None, stop=None,
                    logits_processor=None, accept_token=None, observer=None,
                    terminate_on_eos=True, engine=None, session=None, reused=0, logprobs=None,
                    speculative=None, draft_max=None, draft=None, **constraint) -> Generation:
        """A Generation of ``ids`` from the engine's current position (the
        model's engine and session, or a batch slot's), its first ``reused``
        ids already in the cache; ``constraint``: one of CONSTRAINT_KEYWORDS."""
        compiled = self.compile_constraint(constraint)
        sampler = Sampler(temperature=temperature, min_p=min_p, top_k=top_k, top_p=top_p, seed=seed, rng=rng)
        penalties = Penalties(repeat_penalty, presence_penalty, frequency_penalty, repeat_last_n)
        return Generation(self.engine if engine is None else engine, self.tokenizer, sampler, ids,
                          _max_tokens(max_tokens, n_dec),
                          stop_ids=self.stop_ids if terminate_on_eos else frozenset(), observer=observer,
                          stop=stop, logits_processor=logits_processor, accept_token=accept_token,
                          penalties=penalties, session=self.session if session is None else session,
                          reused=reused, logprobs=logprobs, constraint=compiled,
                          speculative=self.draft_for(speculative, draft_max, draft))

    def draft_for(self, speculative=None, draft_max=None, draft: "Model | None" = None):
        """The draft the keywords ask for: None, prompt lookup
        (``speculative="lookup"``) or ``draft``, another Model of the same
        vocabulary, decoding greedily on its own KV cache."""
        if draft is None:
            return check_speculative(speculative, draft_max)
        if draft_max is not None:
            check_draft_max(draft_max)
        if speculative is not None:
            raise ParameterError("speculative and draft: give one (speculative='lookup' or draft=Model)")
        if not isinstance(draft, Model):
            raise ParameterError(f"draft: expected a Model (gemma_cy.load(...)), got {type(draft).__name__}")
        if draft is self:
            raise ParameterError("draft: the model itself; a draft model needs its own KV cache (load it again)")
        if draft.config.vocab_size != self.config.vocab_size or draft.vocabulary_digest != self.vocabulary_digest:
            raise ParameterError(f"draft: its vocabulary ({draft.config.vocab_size} ids) is not this model's "
                                 f"({self.config.vocab_size} ids); a draft model must share the tokenizer")
        return DraftModel(draft.engine, draft.session, DRAFT_MAX if draft_max is None else draft_max)

    @functools.cached_property
    def vocabulary_digest(self) -> bytes:
        """What two models must share for one to draft for the other (token_bytes.vocabulary_digest)."""
        return vocabulary_digest(self.tokenizer)

    def compile_constraint(self, keywords: dict) -> Constraint | None:
        """The Constraint the keywords ask for (docs/structured_output.md), or None."""
        unknown = sorted(set(keywords) - set(CONSTRAINT_KEYWORDS))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        spec = constraint_spec(**keywords)
        if spec is None:
            return None
        if self._constraints is None:
            self._constraints = ConstraintCompiler(self.tokenizer, self.config.vocab_size, self.stop_ids)
        return self._constraints.compile(spec)

    def generate(self, prompt: str | bytes | Sequence[int] = "", *, chat_format: bool = False,
                 system: str | None = None, parse_special: bool = False, keep_cache: bool = False,
                 **sampling) -> Generation:
        """Start generating from a prompt; iterate the result for
        ``Step(token_id, text)``; ``stop_reason`` says why it ended.

        Keywords (docs/generation.md#python-api): ``max_tokens`` (or the
        seed's ``n_dec``; default 250), ``temperature`` (0.8; 0 = greedy),
        ``top_k`` (0 = off), ``top_p`` (1 = off), ``min_p`` (0.05),
        ``repeat_penalty`` (1 = off), ``presence_penalty`` and
        ``frequency_penalty`` (0 = off) over the last ``repeat_last_n`` (64)
        ids, ``seed`` (0), ``rng`` (a ``SplitMix64`` stream to draw from
        and advance instead of a new one from ``seed``: pass one stream to
        every turn of a chat so that turns do not repeat one another's
        draws), ``stop`` (strings that end the text, never
        shown), ``logits_processor`` (``f(ids, logits) -> logits``, or a
        list of them: ids is the context so far, logits a writable f32
        copy), ``accept_token`` (``f(id) -> bool``: False ends the
        generation before that id), ``observer``, ``terminate_on_eos``,
        ``logprobs`` (None; k in 0 .. 20: each generated id's
        log-probability and the k likeliest alternatives', in
        ``generation.logprobs`` and ``Completion.logprobs``). Structured
        output (docs/structured_output.md), at most one of:
        ``response_format`` (OpenAI's: ``{"type": "json_object"}`` or
        ``{"type": "json_schema", "json_schema": {"schema": {...}}}``),
        ``json_schema`` (a dict or JSON text), ``regex``, ``grammar`` (Lark
        or GBNF text), ``choices`` (a list of strings): only ids that keep
        the text a prefix of a match are sampled, and the generation ends
        with stop reason "grammar" when the match is complete.
        ``speculative="lookup"`` (and ``draft_max``, 7): draft ids by prompt
        lookup and check them in one block forward; the output is plain
        decoding's, id for id (docs/generation.md#speculative-decoding);
        ``draft=Model``: draft with that smaller model of the same
        vocabulary instead.
        ``keep_cache`` continues from the KV cache's current position
        instead of starting over. Otherwise the positions the prompt shares
        with what the cache holds (an earlier prompt and its output) are
        kept and only the rest runs (docs/generation.md#prefix-reuse): the
        same tokens and logits, bit for bit, as running it all.
        """
        ids = self.prompt_ids(prompt, chat_format=chat_format, parse_special=parse_special, system=system)
        if keep_cache and self.session.in_sync():
            return self._generation(ids, **sampling)
        if sampling.get("observer") is not None:  # an observer sees every position run
            self.session.reset()
            return self._generation(ids, **sampling)
        return self._generation(ids, reused=self.session.reuse_prefix(ids), **sampling)

    def complete(self, prompt: str | bytes | Sequence[int] = "", n: int | None = None,
                 **kwargs) -> Completion | list[Completion]:
        """``generate`` run to the end: a Completion(text, ids, stop_reason,
        prompt_ids, timing). Given a list of prompts (strings, bytes or id
        lists), ``generate_many`` run to the end: their Completions, in order.
        ``n``: that many samples of the one prompt, as a list (``_samples``)."""
        if n is not None:
            if _several_prompts(prompt):
                raise ParameterError("n: samples of one prompt; for several prompts give each its own entry")
            ids = self.prompt_ids(prompt, chat_format=kwargs.pop("chat_format", False),
                                  parse_special=kwargs.pop("parse_special", False), system=kwargs.pop("system", None))
            return self._samples(ids, n, kwargs)
        if _several_prompts(prompt):
            return self.generate_many(prompt, **kwargs).complete()
        return self.generate(prompt, **kwargs).complete()

    def _samples(self, ids: list[int], n, kwargs: dict) -> list[Completion]:
        """``n`` completions of one prompt, run together: the prompt is
        prefilled once (the others copy its KV cache), sample k draws from
        seed + k (so the samples differ, and a seed reproduces them all)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise ParameterError(f"n = {n!r}, must be an integer in [1, 1024]")
        if "rng" in kwargs:
            raise ParameterError("n: each sample draws from seed + k; give seed, not rng")
        seed = kwargs.pop("seed", 0)
        Sampler(seed=seed)  # ParameterError for a bad seed, before seed + k
        per_sequence = [{"seed": (seed + k) % 2**64} for k in range(n)]
        return self.generate_many([ids] * n, per_sequence=per_sequence, **kwargs).complete()

    def generate_many(self, prompts: Sequence[str | bytes | Sequence[int]], *, chat_format: bool = False,
                      system: str | None = None, parse_special: bool = False,
                      per_sequence: Sequence[dict] | None = None, **sampling) -> BatchGeneration:
        """Generate from several prompts at once (docs/generation.md#batching):
        up to ``max_sequences`` (a ``load`` argument) run together, each step
        one pass over the weights for all of them, the rest join as others
        end. Iterate the result for ``(index, Step)`` as tokens arrive;
        ``complete()`` gives the Completions in order. Keywords are
        ``generate``'s and apply to every prompt; ``per_sequence[i]`` (a
        dict, one per prompt) overrides them for prompt i. Each sequence's
        tokens are exactly those ``generate`` gives it alone. Takes the
        model's KV cache over, as any new generation does."""
        if not _several_prompts(prompts) and not (isinstance(prompts, Sequence) and len(prompts) == 0):
            raise ParameterError("prompts: expected a list of prompts (strings, bytes or lists of ids)")
        if not prompts:
            raise ParameterError("prompts: the list is empty")
        if per_sequence is None:
            per_sequence = [{}] * len(prompts)
        if len(per_sequence) != len(prompts) or not all(isinstance(d, dict) for d in per_sequence):
            raise ParameterError(f"per_sequence: expected {len(prompts)} dicts, one per prompt")
        for d in per_sequence:
            if "observer" in d or "observer" in sampling:
                raise ParameterError("observer: a batched sequence cannot be observed; run it alone (generate)")
        ids = [self.prompt_ids(p, chat_format=chat_format, parse_special=parse_special, system=system)
               for p in prompts]
        kwargs = [{**sampling, **d} for d in per_sequence]
        for i, (prompt, kw) in enumerate(zip(ids, kwargs)):  # every argument checked before anything runs
            try:
                self.check_sequence(prompt, kw)
            except GemmaCyError as e:
                raise type(e)(f"prompt {i}: {e}") from None
        return self.run_many(ids, kwargs)

    def check_sequence(self, ids: list[int], keywords: dict) -> None:
        """One sequence of a batch, checked before anything runs: its prompt
        fits the context and every keyword is one ``generate`` takes, in range."""
        kw = keywords
        unknown = sorted(set(kw) - _SEQUENCE_KEYWORDS)
        if "draft" in unknown:
            raise ParameterError("draft: a draft model drafts for one sequence at a time (generate or complete "
                                 "of one prompt); a batch's sequences can draft by speculative='lookup'")
        if unknown:
            raise ParameterError(f"unknown keyword {unknown[0]!r}")
        check_prompt_fits(len(ids), 0, self.engine.cache_len)
        Sampler(**{k: kw[k] for k in ("temperature", "min_p", "top_k", "top_p", "seed", "rng") if k in kw})
        Penalties(*(kw.get(k, d) for k, d in (("repeat_penalty", 1.0), ("presence_penalty", 0.0),
                                              ("frequency_penalty", 0.0), ("repeat_last_n", DEFAULT_REPEAT_LAST_N))))
        check_stop_strings(kw.get("stop"))
        check_top_logprobs(kw.get("logprobs"))
        check_speculative(kw.get("speculative"), kw.get("draft_max"))
        self.compile_constraint({k: kw[k] for k in CONSTRAINT_KEYWORDS if k in kw})
        Generation.check_n_dec(_max_tokens(kw.get("max_tokens"), kw.get("n_dec")))

    def run_many(self, ids: list[list[int]], keywords: list[dict], on_finish=None) -> BatchGeneration:
        """``generate_many`` of prompts already as ids, each with its checked
        keywords (``check_sequence``); ``on_finish(index)`` is called as
        each sequence ends. A sequence takes over the slot it joins (the
        one whose cache shares most of its prompt)."""
        makers = [functools.partial(self._slot_generation, prompt, kw) for prompt, kw in zip(ids, keywords)]
        return BatchGeneration(self.engine.batch, makers, [list(p) for p in ids], self.sessions, on_finish)

    @property
    def sessions(self) -> list[Session]:
        """Every slot's cache and owner (``Session``); slot 0 is ``session``."""
        if self._sessions is None:
            batch = self.engine.batch
            self._sessions = [self.session] + [Session(SlotEngine(batch, s), s) for s in range(1, batch.n_slots)]
        return self._sessions

    def _slot_generation(self, ids: list[int], kwargs: dict, engine, session, reused: int) -> Generation:
        return self._generation(ids, engine=engine, session=session, reused=reused, **kwargs)

    def chat(self, messages: Sequence[dict], **sampling) -> Generation:
        """Start the model's reply to ``messages`` ([{"role": "system" |
        "user" | "assistant", "content": str}, ...]) in its chat template;
        streams like ``generate`` and takes the same keywords. The KV cache
        positions this chat shares with the last one run on the model (the
        earlier turns) are reused, not run again."""
        ids = self.chat_ids(messages)
        if sampling.get("observer") is not None:  # an observer sees every position run
            self.session.reset()
            return self._generation(ids, **sampling)
        return self._generation(ids, reused=self.session.reuse_prefix(ids), **sampling)

    def chat_complete(self, messages: Sequence[dict], n: int | None = None,
                      **sampling) -> Completion | list[Completion]:
        """``chat`` run to the end: the reply as a Completion; with ``n``,
        that many replies as a list (``complete``'s ``n``)."""
        if n is not None:
            return self._samples(self.chat_ids(messages), n, sampling)
        return self.chat(messages, **sampling).complete()

    def evaluate(self, text_or_ids: str | bytes | Sequence[int], ctx: int = 512, chunks: int | None = None,
                 against: "Model | str | None" = None, per_layer: bool = False, per_layer_positions: int = 64,
                 progress=None) -> Evaluation:
        """Perplexity over a text, llama-perplexity's way (gemma_cy.generation.evaluation),
        and, with ``against``, what this model costs against a baseline:
        another ``Model`` of the same vocabulary, ``"reference"`` (this file on
        the NumPy reference engine), or ``"f32"`` / ``"q8"`` (this file in that
        activation mode). ``per_layer``: every op of every layer judged on the
        same inputs over the first ``per_layer_positions`` positions of the
        first chunk, largest error first, with its tensors' block types.
        ``progress(done, total)`` is called per chunk."""
        ids = self.tokenize(text_or_ids) if isinstance(text_or_ids, (str, bytes)) else self.prompt_ids(text_or_ids)
        check_ctx(ctx, len(ids), self.context_len)
        baseline, name = self._baseline(against, text_or_ids, ids, ctx)
        if per_layer and baseline is None:
            raise ParameterError("per_layer needs a baseline to judge against (against=...)")
        if per_layer and (isinstance(per_layer_positions, bool) or not isinstance(per_layer_positions, int)
                          or not 1 <= per_layer_positions <= ctx):
            raise ParameterError(f"per_layer_positions = {per_layer_positions!r}, must be in [1, ctx {ctx}]")
        self.session.reset()
        bos = self.tokenizer.bos_id if self.tokenizer.add_bos else None
        result = evaluate(self.engine, ids, ctx, bos, baseline, name, chunks, progress)
        if per_layer and not result.interrupted:
            first = list(ids[:per_layer_positions])
            if bos is not None:
                first[0] = bos
            result.per_layer = self._per_layer(against, first)
        self.session.reset()
        return result

    def _per_layer(self, against, ids: list[int]) -> list[dict]:
        """The per-op table: an engine observed, a reference engine judging on its inputs."""
        from gemma_cy_reference.model import ReferenceEngine
        from .generation.local_error import per_op_table

        activations = getattr(self.engine, "activations", "f32")
        if isinstance(against, Model):  # this model's ops on the baseline's inputs
            judge = ReferenceEngine(self.weights, len(ids), activations)
            return per_op_table(against.engine, judge, ids, self.weights, against.weights)
        judge_mode = against if against in ("f32", "q8") else activations  # the baseline's ops on this model's inputs
        judge = ReferenceEngine(self.weights, len(ids), judge_mode)
        return per_op_table(self.engine, judge, ids, self.weights)

    def _baseline(self, against, text_or_ids, ids, ctx):
        """(engine, name) of the baseline ``against`` names; (None, None) for none."""
        if against is None:
            return None, None
        if isinstance(against, Model):
            if against.config.vocab_size != self.config.vocab_size:
                raise ParameterError(f"against: its vocabulary has {against.config.vocab_size} tokens, this "
                                     f"model's {self.config.vocab_size}: the two cannot be compared")
            if isinstance(text_or_ids, (str, bytes)) and against.tokenize(text_or_ids) != ids:
                raise ParameterError("against: the two models tokenize the text differently (another vocabulary)")
            if against.context_len < ctx:
                raise ParameterError(f"against: its context of {against.context_len} tokens is less than ctx {ctx}")
            against.session.reset()
            return against.engine, against.weights.source or "the other model"
        activations = getattr(self.engine, "activations", "f32")
        if against == "reference":
            return make_engine("reference", self.weights, ctx, activations), "reference engine"
        if against in ("f32", "q8"):
            return make_engine(self.engine_name, self.weights, ctx, against), f"{against} activations"
        raise ParameterError(f"against = {against!r}: expected a Model, 'reference', 'f32' or 'q8'")

    def logits(self, prompt: str | bytes | Sequence[int], position: int | str = -1,
               observer: Observer | None = None, positions: str | None = None) -> np.ndarray:
        """Logits (vocab,) f32 at ``position`` of the prompt (default: the last),
        computed from a fresh KV cache over the prompt up to that position.
        ``position="all"`` (or ``positions="all"``): the logits of every
        position, (T, vocab), from one pass over the prompt and products
        with the output layer of up to 64 positions each."""
        if positions is not None:
            if positions != "all":
                raise ParameterError(f"positions = {positions!r}: the only value is 'all'")
            position = "all"
        ids = self.prompt_ids(prompt)
        n = len(ids)
        if position == "all":
            if observer is not None:
                raise ParameterError("logits(position='all') takes no observer: observe one position at a time")
            self.session.reset()
            from .generation.generator import check_prompt_fits
            check_prompt_fits(n - 1, 0, self.context_len)
            out = self.engine.logits_of(self.engine.states(ids))
            self.session.ids = list(ids)
            return out
        if isinstance(position, bool) or not isinstance(position, int) or not -n <= position < n:
            raise ParameterError(f"position = {position!r}, must be in [-{n}, {n}) for a {n}-token prompt")
        end = position % n + 1
        self.session.reset()
        out = np.array(self.engine.prefill(ids[:end], observer), copy=True)
        self.session.ids = ids[:end]
        return out
