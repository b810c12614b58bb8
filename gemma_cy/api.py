"""The public Python API: ``gemma_cy.load(...)`` -> ``Model`` (docs/generation.md#python-api).

    >>> model = gemma_cy.load()                     # the default model, Gemma 3 270M
    >>> model.complete("The capital of France is", max_tokens=20, temperature=0).text
    >>> for step in model.chat([{"role": "user", "content": "Hi!"}]):
    ...     print(step.text, end="")
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np

from .errors import GemmaCyError, ParameterError, TokenIndexError
from .formats.mapped import return_freed_heap
from .generation.batch import BatchGeneration, Scheduler, SlotEngine
from .generation.constraint import Constraint, ConstraintCompiler
from .generation.engines import DEFAULT_ENGINE, default_max_sequences, make_engine
from .generation.evaluation import Evaluation, evaluate_model
from .generation.generator import Completion, Generation, Observer, check_prompt_fits
from .generation.params import GenerationParams
from .generation.slot_cache import SlotCache
from .generation.speculative import draft_for
from .loading import (default_tokenizer_path, open_model_files, open_tokenizer, open_weights,  # noqa: F401
                      read_magic, tokenizer_from_gguf)
from .model.checks import cache_length
from .model.weights import Weights
from .tokenizers.chat import chat_ids, chat_template_for
from .tokenizers.greedy import GreedyTokenizer
from .tokenizers.token_bytes import vocabulary_digest


def load(weights: str | os.PathLike | None = None, tokenizer: str | None = None, engine: str = DEFAULT_ENGINE,
         max_cache_len: int = 8192, activations: str = "f32", max_sequences: int | None = None) -> "Model":
    """Load a model: ``weights`` file path (GGUF, GMW1 or a llama2.c
    checkpoint; None: the default model, Gemma 3 270M from its package),
    ``tokenizer`` path (default: the GGUF itself, weights + ".tok" for
    GMW1, tokenizer.bin beside a llama2.c checkpoint), ``engine`` "fast" |
    "reference", and the KV cache length (context = min(max_cache_len, the
    model's max_seq_len)). ``activations="q8"`` is the opt-in
    int8-activation mode (gemma_cy.generation.engines.make_engine).
    ``max_sequences``: how many sequences a list of prompts (or ``n``
    samples) runs at once, each with its own KV cache of that context;
    None: up to 8, as the memory allows (docs/generation.md#batching)."""
    if weights is None:
        from .formats.packaged import default_model_path
        weights = default_model_path()
    loaded, tok = open_model_files(os.fspath(weights), None if tokenizer is None else os.fspath(tokenizer))
    return_freed_heap()  # before the engine lays out its weights: the start-up peak
    return Model(loaded, tok, engine, max_cache_len, activations, max_sequences)


def _several_prompts(prompt) -> bool:
    """True for a list of prompts (its items strings, bytes or id lists), not one prompt of ids."""
    return (isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and len(prompt) > 0
            and all(isinstance(p, (str, bytes)) or (isinstance(p, Sequence) and not isinstance(p, (str, bytes)))
                    for p in prompt))


class Model:
    """A loaded model: weights, tokenizer, chat template and an engine with its KV cache.

    The model has one KV cache per slot (``max_sequences``; up to 8 by
    default); one generation runs on slot 0 at a time: starting another
    (``generate``, ``chat``, ``complete``...) or calling ``logits`` takes the
    cache over, and resuming the older generation raises
    GenerationStateError naming the slot
    (docs/generation.md#one-generation-at-a-time). A cache outlives its
    generation: a prompt that starts with what the cache holds runs only
    the rest (docs/generation.md#prefix-reuse).
    """

    def __init__(self, weights: Weights, tokenizer: GreedyTokenizer, engine: str = DEFAULT_ENGINE,
                 max_cache_len: int = 8192, activations: str = "f32", max_sequences: int | None = None):
        self.weights = weights
        self.config = weights.config
        self.tokenizer = tokenizer
        self.engine_name = engine
        if max_sequences is None:
            max_sequences = default_max_sequences(self.config, cache_length(max_cache_len, self.config))
        self.max_sequences = max_sequences
        self.engine = make_engine(engine, weights, max_cache_len, activations, max_sequences)
        self.cache = SlotCache(self.engine, 0 if max_sequences > 1 else None)
        self._slot_caches: list[SlotCache] | None = None  # every slot's, slot 0's being self.cache
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

    def generation(self, ids: list[int], params: GenerationParams, *, engine=None, cache: SlotCache | None = None,
                   reused: int = 0) -> Generation:
        """A Generation of ``ids`` under ``params`` from the engine's current
        position: the model's engine and cache, or a batch slot's (what the
        batch scheduler and the server call); its first ``reused`` ids
        already in the cache (``SlotCache.reuse_prefix``)."""
        return Generation(self.engine if engine is None else engine, self.tokenizer, ids, params,
                          stop_ids=self.stop_ids, cache=self.cache if cache is None else cache, reused=reused,
                          constraint=self.constraint_for(params), speculative=self.draft_for(params))

    def check(self, ids: list[int], params: GenerationParams) -> None:
        """What ``params`` cannot check alone, before anything runs: the
        prompt fits the context, the grammar compiles for this vocabulary,
        a draft model shares it."""
        check_prompt_fits(len(ids), 0, self.engine.cache_len)
        self.constraint_for(params)
        self.draft_for(params)

    def draft_for(self, params: GenerationParams | None = None, *, draft: "Model | None" = None):
        """The draft ``params`` ask for (or ``draft`` alone): speculative.draft_for."""
        return draft_for(self, params if params is not None else GenerationParams(draft=draft))

    @functools.cached_property
    def vocabulary_digest(self) -> bytes:
        """What two models must share for one to draft for the other (token_bytes.vocabulary_digest)."""
        return vocabulary_digest(self.tokenizer)

    def constraint_for(self, params: GenerationParams) -> Constraint | None:
        """A fresh Constraint for the structured output ``params`` ask for
        (docs/structured_output.md), or None; each grammar is compiled once."""
        if params.constraint_spec is None:
            return None
        if self._constraints is None:
            self._constraints = ConstraintCompiler(self.tokenizer, self.config.vocab_size, self.stop_ids)
        return self._constraints.compile(params.constraint_spec)

    def generate(self, prompt: str | bytes | Sequence[int] = "", params: GenerationParams | None = None, *,
                 chat_format: bool = False, system: str | None = None, parse_special: bool = False,
                 keep_cache: bool = False, **settings) -> Generation:
        """Start generating from a prompt; iterate the result for
        ``Step(token_id, text)``; ``stop_reason`` says why it ended.

        The settings are ``params`` (a GenerationParams) with any keyword
        set on top, each one of GenerationParams' fields
        (docs/generation.md#python-api: ``max_tokens`` or the seed's
        ``n_dec``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, the
        penalties, ``seed`` or ``rng``, ``stop``, ``logits_processor``,
        ``accept_token``, ``observer``, ``terminate_on_eos``, ``logprobs``,
        structured output, ``speculative`` or ``draft``).
        ``keep_cache`` continues from the KV cache's current position
        instead of starting over. Otherwise the positions the prompt shares
        with what the cache holds (an earlier prompt and its output) are
        kept and only the rest runs (docs/generation.md#prefix-reuse): the
        same tokens and logits, bit for bit, as running it all.
        """
        params = GenerationParams.from_keywords(settings, params)
        ids = self.prompt_ids(prompt, chat_format=chat_format, parse_special=parse_special, system=system)
        if keep_cache and self.cache.in_sync():
            return self.generation(ids, params)
        return self._fresh_generation(ids, params)

    def _fresh_generation(self, ids: list[int], params: GenerationParams) -> Generation:
        if params.observer is not None:  # an observer sees every position run
            self.cache.reset()
            return self.generation(ids, params)
        return self.generation(ids, params, reused=self.cache.reuse_prefix(ids))

    def complete(self, prompt: str | bytes | Sequence[int] = "", params: GenerationParams | None = None,
                 n: int | None = None, **kwargs) -> Completion | list[Completion]:
        """``generate`` run to the end: a Completion(text, ids, stop_reason,
        prompt_ids, timing). Given a list of prompts (strings, bytes or id
        lists), ``generate_many`` run to the end: their Completions, in order.
        ``n``: that many samples of the one prompt, as a list (``_samples``)."""
        if n is not None:
            if _several_prompts(prompt):
                raise ParameterError("n: samples of one prompt; for several prompts give each its own entry")
            ids = self.prompt_ids(prompt, chat_format=kwargs.pop("chat_format", False),
                                  parse_special=kwargs.pop("parse_special", False), system=kwargs.pop("system", None))
            return self._samples(ids, n, GenerationParams.from_keywords(kwargs, params))
        if _several_prompts(prompt):
            return self.generate_many(prompt, params, **kwargs).complete()
        return self.generate(prompt, params, **kwargs).complete()

    def _samples(self, ids: list[int], n, params: GenerationParams) -> list[Completion]:
        """``n`` completions of one prompt, run together: the prompt is
        prefilled once (the others copy its KV cache), sample k draws from
        seed + k (so the samples differ, and a seed reproduces them all)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise ParameterError(f"n = {n!r}, must be an integer in [1, 1024]")
        if params.rng is not None:
            raise ParameterError("n: each sample draws from seed + k; give seed, not rng")
        return self._run_checked([ids] * n, [params.for_sample(k) for k in range(n)]).complete()

    def generate_many(self, prompts: Sequence[str | bytes | Sequence[int]], params: GenerationParams | None = None,
                      *, chat_format: bool = False, system: str | None = None, parse_special: bool = False,
                      per_sequence: Sequence[dict] | None = None, **settings) -> BatchGeneration:
        """Generate from several prompts at once (docs/generation.md#batching):
        up to ``max_sequences`` (a ``load`` argument) run together, each step
        one pass over the weights for all of them, the rest join as others
        end. Iterate the result for ``(index, Step)`` as tokens arrive;
        ``complete()`` gives the Completions in order. The settings
        (``generate``'s) apply to every prompt; ``per_sequence[i]`` (a
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
        shared = GenerationParams.from_keywords(settings, params)
        ids, each = [], []
        for i, (prompt, own) in enumerate(zip(prompts, per_sequence)):
            try:
                ids.append(self.prompt_ids(prompt, chat_format=chat_format, parse_special=parse_special,
                                           system=system))
                each.append(GenerationParams.from_keywords(own, shared))
            except GemmaCyError as e:
                raise type(e)(f"prompt {i}: {e}") from None
        return self._run_checked(ids, each)

    def _run_checked(self, ids: list[list[int]], params: list[GenerationParams]) -> BatchGeneration:
        """``run_many`` once every sequence passed ``check`` (nothing runs otherwise)."""
        for i, (prompt, p) in enumerate(zip(ids, params)):
            if p.observer is not None:
                raise ParameterError("observer: a batched sequence cannot be observed; run it alone (generate)")
            if p.draft is not None:
                raise ParameterError("draft: a draft model drafts for one sequence at a time (generate or complete "
                                     "of one prompt); a batch's sequences can draft by speculative='lookup'")
            try:
                self.check(prompt, p)
            except GemmaCyError as e:
                raise type(e)(f"prompt {i}: {e}") from None
        return self.run_many(ids, params)

    def run_many(self, ids: list[list[int]], params: list[GenerationParams], on_finish=None) -> BatchGeneration:
        """Prompts already as ids, each under its checked settings
        (``check``); ``on_finish(index)`` is called as each sequence ends.
        A sequence takes over the slot it joins (the one whose cache shares
        most of its prompt)."""
        makers = [functools.partial(self.slot_generation, prompt, p) for prompt, p in zip(ids, params)]
        return BatchGeneration(self.scheduler(on_finish), makers, [list(p) for p in ids])

    def scheduler(self, on_finish=None) -> Scheduler:
        """A continuous-batching Scheduler over this model's slots
        (gemma_cy.generation.batch), as the server's engine thread runs one:
        sequences added with a maker (``slot_generation`` of their ids and
        settings) join as slots free."""
        return Scheduler(self.engine.batch, self.slot_caches, on_finish)

    @property
    def slot_caches(self) -> list[SlotCache]:
        """Every slot's cache and owner (``SlotCache``); slot 0 is ``cache``."""
        if self._slot_caches is None:
            batch = self.engine.batch
            self._slot_caches = [self.cache] + [SlotCache(SlotEngine(batch, s), s) for s in range(1, batch.n_slots)]
        return self._slot_caches

    def slot_generation(self, ids: list[int], params: GenerationParams, engine, cache, reused: int) -> Generation:
        """``generation`` on a batch slot: what a Scheduler's maker calls, with
        the slot's engine, cache and the prompt ids its cache already holds."""
        return self.generation(ids, params, engine=engine, cache=cache, reused=reused)

    def chat(self, messages: Sequence[dict], params: GenerationParams | None = None, **settings) -> Generation:
        """Start the model's reply to ``messages`` ([{"role": "system" |
        "user" | "assistant", "content": str}, ...]) in its chat template;
        streams like ``generate`` and takes the same settings. The KV cache
        positions this chat shares with the last one run on the model (the
        earlier turns) are reused, not run again."""
        params = GenerationParams.from_keywords(settings, params)
        return self._fresh_generation(self.chat_ids(messages), params)

    def chat_complete(self, messages: Sequence[dict], params: GenerationParams | None = None, n: int | None = None,
                      **settings) -> Completion | list[Completion]:
        """``chat`` run to the end: the reply as a Completion; with ``n``,
        that many replies as a list (``complete``'s ``n``)."""
        if n is not None:
            return self._samples(self.chat_ids(messages), n, GenerationParams.from_keywords(settings, params))
        return self.chat(messages, params, **settings).complete()

    def evaluate(self, text_or_ids: str | bytes | Sequence[int], ctx: int = 512, chunks: int | None = None,
                 against: "Model | str | None" = None, per_layer: bool = False, per_layer_positions: int = 64,
                 progress=None) -> Evaluation:
        """Perplexity over a text, llama-perplexity's way, and, with
        ``against``, what this model costs against a baseline: another
        ``Model`` of the same vocabulary, ``"reference"`` (this file on the
        NumPy reference engine), or ``"f32"`` / ``"q8"`` (this file in that
        activation mode). ``per_layer``: every op of every layer judged on
        the same inputs over the first ``per_layer_positions`` positions of
        the first chunk, largest error first, with its tensors' block types.
        ``progress(done, total)`` is called per chunk
        (gemma_cy.generation.evaluation.evaluate_model)."""
        return evaluate_model(self, text_or_ids, ctx, chunks, against, per_layer, per_layer_positions, progress)

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
            self.cache.reset()
            check_prompt_fits(n - 1, 0, self.context_len)
            out = self.engine.logits_of(self.engine.states(ids))
            self.cache.ids = list(ids)
            return out
        if isinstance(position, bool) or not isinstance(position, int) or not -n <= position < n:
            raise ParameterError(f"position = {position!r}, must be in [-{n}, {n}) for a {n}-token prompt")
        end = position % n + 1
        self.cache.reset()
        out = np.array(self.engine.prefill(ids[:end], observer), copy=True)
        self.cache.ids = ids[:end]
        return out
