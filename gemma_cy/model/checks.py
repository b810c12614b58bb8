"""The checks every engine makes at its Python boundary, shared so that the
reference and the fast engine raise the same errors with the same messages.

Indices (token ids, positions) are checked here, before any computation:
the kernels never see a bad one (docs/errors.md#case-32). Non-finite activations
are reported after a step as one ``NumericalError`` naming the position and
the first place that went non-finite (row 25). ``CheckedEngine`` is the
engine interface both engines share (reset, forward, prefill, decode): it
checks the inputs, then hands them to the engine's own ``_run``.
"""
from __future__ import annotations

import enum

import operator
from typing import Mapping, Sequence

import numpy as np

from .config import ModelConfig
from .observe import Observer
from .weights import F32_PRODUCT_MATRICES
from ..errors import NumericalError, ParameterError, TokenIndexError
from ..quant.tensors import Q8_0_BLOCK, F32Tensor

# How the engines compute a matrix product's input: "f32" (the default) or
# "q8", the opt-in mode that quantizes every matrix input to int8 per block
# of 32 (docs/numerics.md#activation-modes).
ACTIVATION_MODES = ("f32", "q8")


def check_activation_mode(activations, config: ModelConfig, tensors: Mapping[str, object] | None = None) -> str:
    """``activations`` when it names a mode of ACTIVATION_MODES that the
    model can run; else ParameterError (the user's choice of mode does not
    fit the model). q8 quantizes the inputs of every matrix per block of 32,
    so the widths they have (dim, n_heads*head_dim, mlp_dim) must be
    multiples of 32; and its products are integer ones, so ``tensors`` (the
    model's, when given) must hold no f32 matrix (GGUF F32, F16, BF16)."""
    if activations not in ACTIVATION_MODES:
        raise ParameterError(f"activations = {activations!r}, expected one of {ACTIVATION_MODES}")
    c = config
    layers = range(c.n_layers)
    widths = (c.dim, max(c.n_heads * c.head_dim_of(layer) for layer in layers), max(map(c.mlp_dim_of, layers)))
    every = (*widths, *(c.n_heads * c.head_dim_of(layer) for layer in layers), *map(c.mlp_dim_of, layers),
             c.per_layer_input_dim)  # Gemma 4's layers differ in widths
    if activations == "q8" and any(width % Q8_0_BLOCK for width in every):
        raise ParameterError(f"activations = 'q8' needs dim, n_heads*head_dim and mlp_dim to be multiples "
                             f"of {Q8_0_BLOCK}; this model has {widths[0]}, {widths[1]}, {widths[2]}"
                             + (f" (per-layer input width {c.per_layer_input_dim})" if c.per_layer_input_dim else ""))
    if activations == "q8" and tensors is not None:
        for name, tensor in tensors.items():
            if isinstance(tensor, F32Tensor) and len(tensor.shape) == 2 \
                    and name.rsplit(".", 1)[-1] not in F32_PRODUCT_MATRICES:
                raise ParameterError(f"activations = 'q8' runs integer matrices; {name} is an f32 matrix "
                                     f"(run this model with activations = 'f32')")
    return activations


def cache_length(max_cache_len, config: ModelConfig) -> int:
    """Positions of the KV cache: min(max_cache_len, config.max_seq_len);
    ParameterError unless max_cache_len is an integer > 0."""
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, (int, np.integer)) \
            or max_cache_len <= 0:
        raise ParameterError(f"max_cache_len = {max_cache_len!r}, must be an integer > 0")
    return min(int(max_cache_len), config.max_seq_len)


def check_token(token, vocab_size: int) -> int:
    """``token`` as an int; TokenIndexError unless 0 <= token < vocab_size."""
    token = operator.index(token)
    if not 0 <= token < vocab_size:
        raise TokenIndexError(f"token id {token} outside the vocabulary [0, {vocab_size})")
    return token


def check_position(pos, filled: int, cache_len: int) -> int:
    """``pos`` as an int; TokenIndexError unless 0 <= pos < cache_len and pos
    <= filled (the next free position: a step may rewrite, not skip ahead)."""
    pos = operator.index(pos)
    if not 0 <= pos < cache_len:
        raise TokenIndexError(f"position {pos} outside the KV cache [0, {cache_len})")
    if pos > filled:
        raise TokenIndexError(
            f"position {pos} skips ahead: {filled} positions are filled, so the next is {filled}")
    return pos


def check_prefill(ids: Sequence[int], start: int, vocab_size: int, cache_len: int) -> list[int]:
    """``ids`` as ints, every one checked, to run at positions start, start+1, ...;
    ValueError when empty, TokenIndexError when an id or the last position is out of range."""
    ids = [check_token(token, vocab_size) for token in ids]
    if not ids:
        raise ValueError("prefill: ids is empty (need at least one token)")
    last = start + len(ids) - 1
    if last >= cache_len:
        raise TokenIndexError(
            f"position {last} outside the KV cache [0, {cache_len}): {len(ids)} tokens from position {start}")
    return ids


def non_finite_error(pos: int, first_bad: int | None, n_layers: int) -> NumericalError:
    """The error for NaN/Inf at ``pos``; first_bad is the first place whose
    output was not finite: -1 the embedding, 0..n_layers-1 a layer's residual
    stream, n_layers or None the output head (the logits)."""
    where = ("the embedding" if first_bad == -1 else
             f"layer {first_bad}" if first_bad is not None and 0 <= first_bad < n_layers else
             "the output head")
    return NumericalError(f"non-finite activations at position {pos} (first non-finite: {where})")


class CheckedEngine:
    """The interface of both engines (gemma_cy_reference.model.ReferenceEngine,
    gemma_cy.fast.engine.FastEngine), with its boundary checks written once:
    every id and position is checked here, so an engine's ``_run`` only ever
    sees valid ones. Attributes the engine sets: ``config``, ``cache_len``
    (positions the KV cache holds) and ``pos`` (positions filled so far)."""

    config: ModelConfig
    cache_len: int
    pos: int

    def reset(self) -> None:
        """Forget every position: the next prefill starts at position 0."""
        self.pos = 0

    def rewind(self, pos: int) -> int:
        """Forget positions ``pos`` and later (0 <= pos <= self.pos): the next
        prefill starts at ``pos``, reusing the cached positions before it.
        Returns where the next prefill starts: ``pos`` here; an engine that
        no longer holds what ``pos`` needs may start over at 0 instead."""
        pos = operator.index(pos)
        if not 0 <= pos <= self.pos:
            raise TokenIndexError(f"rewind to position {pos}: only 0 .. {self.pos} are filled")
        self.pos = pos
        return pos

    def forward(self, token: int, pos: int, observer: Observer | None = None) -> np.ndarray:
        """Run ``token`` at position ``pos`` (0 <= pos <= self.pos) and return
        its logits (vocab,) f32. Positions after ``pos`` are forgotten
        (self.pos becomes pos + 1)."""
        token = check_token(token, self.config.vocab_size)
        pos = check_position(pos, self.pos, self.cache_len)
        return self._run([token], pos, observer)

    def prefill(self, ids: Sequence[int], observer: Observer | None = None) -> np.ndarray:
        """Run ``ids`` at positions self.pos, self.pos+1, ...; return the logits
        (vocab,) of the last one. Every id and position is checked first.
        Only the last position computes logits (the output layer is the
        largest matrix); the observer sees "logits" once."""
        ids = check_prefill(ids, self.pos, self.config.vocab_size, self.cache_len)
        return self._run(ids, self.pos, observer)

    def decode(self, token: int, observer: Observer | None = None) -> np.ndarray:
        """Run one token at the next position; return its logits (vocab,)."""
        return self.forward(token, self.pos, observer)

    def states(self, ids: Sequence[int]) -> np.ndarray:
        """Run ``ids`` as ``prefill`` does, and return every position's
        final-normed state (n, dim) f32 instead of the last one's logits:
        ``logits_of(states)`` gives all their logits (for perplexity)."""
        ids = check_prefill(ids, self.pos, self.config.vocab_size, self.cache_len)
        return self._states(ids, self.pos)

    def _run(self, ids: list[int], start: int, observer: Observer | None) -> np.ndarray:
        """The engine's own: run the checked ``ids`` at positions start,
        start+1, ... (logits of the last only), leave self.pos = start +
        len(ids), and return the logits (vocab,) f32 as a new array the
        caller owns; NumericalError on a non-finite step."""
        raise NotImplementedError


class Logits(enum.IntEnum):
    """What a batch segment asks back (the third item of ``step``'s
    segments): no logits (a prompt's part that does not end it), its last
    position's, or every position's (a speculative block). The fast
    engine's ``run_batch`` takes the same numbers (forward.pxi)."""

    NONE = 0
    LAST = 1
    ALL = 2


class CheckedBatchEngine:
    """The interface of the batch engines (gemma_cy.fast.batch.FastBatchEngine,
    gemma_cy_reference.batch.ReferenceBatchEngine): ``n_slots`` sequences,
    each with its own KV cache and ``pos[slot]`` (positions filled), and a
    ``step`` that advances several of them in one pass over the weights
    (docs/architecture.md#batching). Every slot, id and position is checked
    here, so an engine's ``_step`` only sees valid ones. Attributes the
    engine sets: ``config``, ``cache_len`` (positions of each slot's cache),
    ``n_slots`` and ``pos`` (a list, per slot)."""

    config: ModelConfig
    cache_len: int
    n_slots: int
    pos: list[int]

    def _slot(self, slot) -> int:
        slot = operator.index(slot)
        if not 0 <= slot < self.n_slots:
            raise TokenIndexError(f"slot {slot} outside [0, {self.n_slots})")
        return slot

    def reset(self, slot: int) -> None:
        """Forget every position of ``slot``: its next run starts at position 0."""
        self.pos[self._slot(slot)] = 0

    def rewind(self, slot: int, pos: int) -> int:
        """Forget positions ``pos`` and later of ``slot`` (CheckedEngine.rewind)."""
        slot, pos = self._slot(slot), operator.index(pos)
        if not 0 <= pos <= self.pos[slot]:
            raise TokenIndexError(f"slot {slot}: rewind to position {pos}: only 0 .. {self.pos[slot]} are filled")
        self.pos[slot] = pos
        return pos

    def copy(self, src: int, dst: int) -> None:
        """Slot ``dst`` takes slot ``src``'s positions (its KV cache, bit for
        bit) and forgets its own: sequences that share a prompt run it once."""
        src, dst = self._slot(src), self._slot(dst)
        if src == dst:
            raise ParameterError(f"copy: slot {src} onto itself")
        if self.pos[src] == 0:
            raise ParameterError(f"copy: slot {src} holds no positions")
        self._copy(src, dst)
        self.pos[dst] = self.pos[src]

    def _copy(self, src: int, dst: int) -> None:
        raise NotImplementedError

    def step(self, segments: Sequence[tuple[int, Sequence[int], Logits]]) -> list[np.ndarray]:
        """Run each ``(slot, ids, want)`` at the slot's next positions
        (each slot at most once), the whole step in as few passes over the
        weights as fit; return, in order, for each segment that wants them
        the logits (vocab,) f32 of its last position (``Logits.LAST``)
        or (n, vocab) of every position (``Logits.ALL``: a speculative block), as
        new arrays the caller owns. A sequence's results do not depend on
        what else runs in the step (docs/numerics.md#batch-invariance)."""
        checked, seen = [], set()
        for slot, ids, want in segments:
            slot = self._slot(slot)
            if slot in seen:
                raise ParameterError(f"step: slot {slot} appears twice in one step")
            seen.add(slot)
            ids = check_prefill(ids, self.pos[slot], self.config.vocab_size, self.cache_len)
            if isinstance(want, str) or not isinstance(want, (int, np.integer)) or want not in (0, 1, 2):
                raise ParameterError(f"step: want = {want!r}: a Logits (NONE, LAST or ALL)")
            checked.append((slot, ids, Logits(int(want))))
        if not checked:
            raise ParameterError("step: no segments to run")
        return self._step(checked)

    def _step(self, segments: list[tuple[int, list[int], Logits]]) -> list[np.ndarray]:
        """The engine's own: run the checked segments, advance ``pos`` of each slot, return the wanted logits in order; NumericalError naming the
        slot on a non-finite step."""
        raise NotImplementedError


class SlotPositions:
    """The slots' positions as a list-like (read and assigned by index), each
    the ``pos`` of a holder: a batch engine's slot 0 is its one-sequence
    engine's own position, so the two never disagree about that cache."""

    def __init__(self, holders):
        self.holders = holders

    def __getitem__(self, slot: int) -> int:
        return self.holders[slot].pos

    def __setitem__(self, slot: int, value: int) -> None:
        self.holders[slot].pos = value

    def __len__(self) -> int:
        return len(self.holders)
