"""The checks every engine makes at its Python boundary, shared so that the
reference and the fast engine raise the same errors with the same messages.

Indices (token ids, positions) are checked here, before any computation:
the kernels never see a bad one (docs/errors.md#case-32). Non-finite activations
are reported after a step as one ``NumericalError`` naming the position and
the first place that went non-finite (row 25).
"""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from .config import ModelConfig
from ..errors import NumericalError, ParameterError, TokenIndexError


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
