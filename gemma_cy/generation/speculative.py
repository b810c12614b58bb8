"""Drafts for speculative decoding (docs/generation.md#speculative-decoding).

A draft proposes the next few ids; the generate loop runs the last chosen
id and the draft through the model as one block (which gives the bits of
decoding them one at a time: docs/numerics.md#bit-for-bit) and then
samples each position as plain decoding would, from those logits, in
order, with the same random draws. Position i's draft id is kept only if
it is exactly the id sampled there; the first one that differs ends the
block, the positions after it are rewound out of the KV cache, and the
sampled id goes on as usual. So a speculative generation is plain
decoding's, id for id and logit for logit, greedy or sampled; a good
draft only saves forward passes.

``PromptLookup`` drafts by looking the context's last few ids up earlier
in the context (the prompt and what was generated): where they occurred
before, what followed them then is the draft. It costs nothing when
nothing matches (no draft, a plain decode step), and pays off when the
reply repeats its input: quoting, editing, extracting, code.

``DraftModel`` drafts with a second, cheaper model of the same vocabulary
(a smaller model of the family, or a smaller quantization of the same
file): it decodes greedily on its own KV cache, which follows the context
by rewinding to what it shares with it. Its draft is a deterministic
function of the context, so the check above keeps the output exactly the
target's, sampled or greedy, and a seeded run gives plain decoding's ids.
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError

DRAFT_MAX = 7  # ids drafted at most per block: with the id before them, the 8 positions a decode step reads a matrix once for
NGRAM_MAX, NGRAM_MIN = 4, 2  # the looked-up suffix: its longest and shortest length


def check_draft_max(draft_max) -> int:
    if isinstance(draft_max, bool) or not isinstance(draft_max, int) or not 1 <= draft_max <= 32:
        raise ParameterError(f"draft_max = {draft_max!r}, must be an integer in [1, 32]")
    return draft_max


class Draft:
    """What a draft shares: ``draft_max`` ids at most per block, fewer after
    a block whose draft was cut early (doubling again after one kept whole),
    and the count of ids drafted and kept. ``propose(context, limit)``
    returns the ids to check after ``context`` (at most ``limit``)."""

    def __init__(self, draft_max: int = DRAFT_MAX) -> None:
        self.draft_max = check_draft_max(draft_max)
        self.size = draft_max  # ids to draft next
        self.drafted = 0  # ids drafted so far
        self.accepted = 0  # of which kept

    def prefill(self, context: list[int]) -> None:
        """The prompt has run (``context``: everything in the cache): get
        ready to draft after it. Nothing for a draft without a model."""

    def propose(self, context: list[int], limit: int) -> list[int]:
        raise NotImplementedError

    def record(self, drafted: int, accepted: int) -> None:
        """A block's outcome: shrink the next draft to what was kept plus one,
        or double it (up to draft_max) when all was kept."""
        self.drafted += drafted
        self.accepted += accepted
        self.size = min(self.draft_max, self.size * 2) if accepted == drafted else max(1, accepted + 1)


class PromptLookup(Draft):
    """Draft ids by prompt lookup: what followed the latest earlier
    occurrence of the context's last few ids."""

    def __init__(self, draft_max: int = DRAFT_MAX) -> None:
        super().__init__(draft_max)
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> where it last started, among those indexed
        self._indexed = 0  # n-grams ending before this position are in _latest

    def propose(self, context: list[int], limit: int) -> list[int]:
        """Up to ``min(self.size, limit)`` ids to follow ``context``, or []:
        what followed the latest earlier occurrence of its last 4, 3 or 2
        ids. ``context`` only grows from one call to the next (one
        generation's prompt and kept ids), so each n-gram is indexed once."""
        k = min(self.size, limit)
        n_ctx = len(context)
        for end in range(self._indexed, n_ctx - 1):  # n-grams with an id after them
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if end + 1 >= n:
                    self._latest[tuple(context[end + 1 - n:end + 1])] = end + 1 - n
        self._indexed = max(self._indexed, n_ctx - 1)
        if k <= 0:
            return []
        for n in range(min(NGRAM_MAX, n_ctx - 1), NGRAM_MIN - 1, -1):
            start = self._latest.get(tuple(context[n_ctx - n:]))
            if start is not None:
                return context[start + n:start + n + k]
        return []


class DraftModel(Draft):
    """Draft ids with another model: its greedy continuation of the context.
    ``engine`` and ``cache`` are the draft model's (its own KV cache,
    taken over at every draft, as any generation on it would)."""

    def __init__(self, engine, cache, draft_max: int = DRAFT_MAX) -> None:
        super().__init__(draft_max)
        self.engine, self.cache = engine, cache

    def prefill(self, context: list[int]) -> None:
        """Run the prompt through the draft model too, all but its last id
        (the first draft runs that one and drafts from its logits), so the
        prompt's cost in the draft model counts with the prompt's, as the
        time before the first token."""
        if 2 <= len(context) < self.engine.cache_len:
            self._follow(context[:-1])

    def propose(self, context: list[int], limit: int) -> list[int]:
        """Up to ``min(self.size, limit)`` ids: the draft model's argmax after
        ``context``, then after each of those."""
        engine, cache = self.engine, self.cache
        k = min(self.size, limit, engine.cache_len - len(context))
        if k <= 0:
            return []
        logits = self._follow(context)
        if logits is None:
            return []
        out = [int(np.argmax(logits))]
        while len(out) < k:
            logits = engine.decode(out[-1])
            cache.ids.append(out[-1])
            out.append(int(np.argmax(logits)))
        return out

    def _follow(self, ids: list[int]) -> np.ndarray | None:
        """Take the draft model's cache over and make it hold ``ids``: keep
        what it shares with them (rewound past the last block's cut), run the
        rest (at least the last id); the logits after ``ids``, or None when
        they hold ids it was not told (a bare engine's unknown positions)."""
        self.cache.claim(self)
        kept = self.cache.reuse_prefix(ids)
        new = ids[kept:]
        if min(new) < 0:
            return None
        logits = self.engine.prefill(new)  # (one id too: a prefill gives decode's bits)
        self.cache.ids.extend(new)
        return logits


def check_speculative(speculative, draft_max) -> None:
    """ParameterError unless ``speculative`` is None or "lookup" (prompt
    lookup) and ``draft_max`` comes with a draft (a draft model is
    ``Model.draft_for``'s to check)."""
    if speculative is None:
        if draft_max is not None:
            raise ParameterError("draft_max: needs speculative='lookup' or a draft model")
        return
    if speculative != "lookup":
        raise ParameterError(f"speculative = {speculative!r}: the draft is 'lookup' (prompt lookup); "
                             f"for a draft model pass draft=Model")
    if draft_max is not None:
        check_draft_max(draft_max)


def draft_for(model, params) -> Draft | None:
    """The draft ``params`` (GenerationParams) ask for on ``model``: None,
    prompt lookup (``speculative="lookup"``) or ``params.draft``, another
    Model of the same vocabulary, decoding greedily on its own KV cache."""
    draft, draft_max = params.draft, DRAFT_MAX if params.draft_max is None else params.draft_max
    if draft is None:
        return PromptLookup(draft_max) if params.speculative else None
    if not hasattr(draft, "vocabulary_digest") or not hasattr(draft, "cache"):
        raise ParameterError(f"draft: expected a Model (gemma_cy.load(...)), got {type(draft).__name__}")
    if draft is model:
        raise ParameterError("draft: the model itself; a draft model needs its own KV cache (load it again)")
    if draft.config.vocab_size != model.config.vocab_size or draft.vocabulary_digest != model.vocabulary_digest:
        raise ParameterError(f"draft: its vocabulary ({draft.config.vocab_size} ids) is not this model's "
                             f"({model.config.vocab_size} ids); a draft model must share the tokenizer")
    return DraftModel(draft.engine, draft.cache, draft_max)
