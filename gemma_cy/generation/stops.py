"""Stop strings: generation ends where one appears in the decoded text (docs/generation.md#stop-strings).

Text is held back while its end could still grow into a stop string, so a
stop string split over several tokens is never printed, not even in part:

    >>> s = StopStrings(["\\n\\nQ:"])
    >>> s.push("Paris.\\n"), s.push("\\n"), s.push("Q:")
    ('Paris.', '', '')
    >>> s.found
    '\\n\\nQ:'
"""
from __future__ import annotations

from typing import Iterable

from ..errors import ParameterError


def check_stop_strings(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (one string is a list of one)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        items = [stop]
    elif isinstance(stop, (list, tuple)):
        items = list(stop)
    else:
        items = None
    if items is None or not all(isinstance(s, str) for s in items):
        raise ParameterError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in items):
        raise ParameterError("stop: an empty string would stop before the first token")
    return tuple(dict.fromkeys(items))  # order kept, duplicates dropped


class StopStrings:
    """Feeds on decoded text; ``push`` returns what is safe to show."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.pending = ""  # text that may be the start of a stop string
        self.found: str | None = None  # the stop string that ended the text

    def push(self, text: str) -> str:
        """Add ``text``; return the part that can no longer be in a stop
        string. Once a stop string is found, the text before it is returned
        and everything after is dropped."""
        if self.found is not None:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        first = None
        for s in self.stops:  # the earliest occurrence wins; the longest at the same place
            i = self.pending.find(s)
            if i >= 0 and (first is None or i < first[0] or (i == first[0] and len(s) > len(first[1]))):
                first = (i, s)
        if first is not None:
            out = self.pending[:first[0]]
            self.found, self.pending = first[1], ""
            return out
        hold = self._held_length()
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        """At the end of generation: the held text (no stop string came)."""
        out, self.pending = ("", "") if self.found is not None else (self.pending, "")
        return out

    def _held_length(self) -> int:
        """The longest end of ``pending`` that begins some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:k]):
                    best = k
                    break
        return best
