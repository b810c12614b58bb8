"""The plain generate loop of the reference (llama3.np style).

    logits = prefill(prompt); repeat: id = pick(logits); logits = decode(id)

Used by tests and by diffing engines token for token; the full-featured loop
(tokenizer, sampler, streaming, stop reasons) is gemma_cy.generation.generator.
"""
from __future__ import annotations

from typing import Callable, Collection, Sequence

import numpy as np

from gemma_cy.model.logits import argmax  # the greedy pick: lowest id among equal maxima


def generate(engine, prompt_ids: Sequence[int], n_steps: int,
             sample: Callable[[np.ndarray], int] | None = None,
             stop_ids: Collection[int] = ()) -> list[int]:
    """Run ``prompt_ids`` from the engine's current position, then pick up to
    ``n_steps`` tokens with ``sample`` (logits -> id; None = greedy argmax).

    Returns the picked ids (not the prompt). Stops after a picked id that is
    in ``stop_ids`` (it is returned, not decoded). The last picked id is
    never decoded, so the cache needs len(prompt_ids) + n_steps - 1
    positions; past that, engine.decode raises TokenIndexError.
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps = {n_steps!r}, must be an integer >= 0")
    pick = argmax if sample is None else sample
    logits = engine.prefill(prompt_ids)  # (vocab,)
    out: list[int] = []
    while len(out) < n_steps:
        token = int(pick(logits))
        out.append(token)
        if token in stop_ids or len(out) == n_steps:
            break
        logits = engine.decode(token)  # (vocab,)
    return out
