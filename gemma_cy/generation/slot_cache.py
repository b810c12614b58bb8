"""One engine's KV cache: which ids it holds and which generation may use it
(docs/generation.md#one-generation-at-a-time).

A model has one KV cache, so only one generation can run on it at a time.
Starting a new one (or anything else that resets the cache, such as
``Model.logits``) takes the cache over; the older generation, if resumed,
raises ``GenerationStateError`` instead of continuing from another text's
cache. Finished generations leave the cache as it is, so a chat can reuse
the positions its next turn shares with the last (``reuse_prefix``).
"""
from __future__ import annotations

from typing import Sequence

from ..errors import GenerationStateError


class SlotCache:
    """One slot's KV cache: the engine, the ids at its positions 0 .. engine.pos-1,
    and the owner (the generation that may run on it)."""

    def __init__(self, engine, slot: int | None = None):
        self.engine = engine
        self.slot = slot  # which slot of a batch engine the cache is (None: the model's one cache)
        self.ids: list[int] = []  # ids whose keys and values the cache holds, position by position
        self.owner: object | None = None

    def reset(self) -> None:
        """Empty the cache; whoever owned it can no longer run."""
        self.engine.reset()
        self.ids = []
        self.owner = None

    def claim(self, owner: object) -> None:
        """``owner`` is now the one that may run on the cache."""
        self.owner = owner

    def check(self, owner: object) -> None:
        """GenerationStateError unless ``owner`` still holds the cache."""
        if self.owner is not owner:
            where = "" if self.slot is None else f" (slot {self.slot})"
            raise GenerationStateError(
                f"this generation was superseded: a later generate()/chat()/generate_many()/logits() on the "
                f"same model reused its KV cache{where}, so it cannot continue; start it again")

    def in_sync(self) -> bool:
        """True when ``ids`` describes the engine's positions (nobody ran the
        engine behind the cache's back)."""
        return len(self.ids) == self.engine.pos

    def shared_prefix(self, ids: Sequence[int]) -> int:
        """How many of the cached positions ``ids`` starts with (at most
        len(ids) - 1: the last id must run to give logits)."""
        if not self.in_sync():
            return 0
        limit = min(len(self.ids), len(ids) - 1)
        kept = 0
        while kept < limit and self.ids[kept] == ids[kept]:
            kept += 1
        return kept

    def reuse_prefix(self, ids: Sequence[int]) -> int:
        """Keep the cached positions that ``ids`` starts with, at most
        len(ids) - 1 of them (the last id must run to give logits); forget
        the rest. Returns how many are kept: ``ids[kept:]`` is left to run."""
        if not self.in_sync():
            self.reset()
            return 0
        kept = self.engine.rewind(self.shared_prefix(ids))  # 0 when the engine no longer holds what position kept needs
        del self.ids[kept:]
        return kept
