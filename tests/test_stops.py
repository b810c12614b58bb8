"""Stop strings (gemma_cy/generation/stops.py, docs/generation.md#stop-strings):
which stop wins, what is held back, flushing, and the errors.

Each test pins down a documented rule that tests/test_generation_api.py
states only for easier inputs (found by mutation testing).
"""
from __future__ import annotations

import pytest

from gemma_cy.errors import ParameterError
from gemma_cy.generation.stops import StopStrings, check_stop_strings

# ------------------------------------------------------------- stop strings


def test_the_first_occurrence_of_a_stop_string_ends_the_text():
    """A stop string appearing twice in one piece of text ends it at its
    first occurrence."""
    s = StopStrings(("ab",))
    assert s.push("xabyab") == "x" and s.found == "ab"


def test_earliest_stop_wins_over_a_longer_later_one():
    """A stop string found earlier in the text wins over a longer one that
    starts later."""
    s = StopStrings(("b", "cde"))
    assert s.push("abcdef") == "a" and s.found == "b"


def test_longest_stop_wins_at_the_same_place_whatever_the_order():
    """Of stop strings starting at the same place, the longest wins, also
    when a shorter one is listed first."""
    s = StopStrings(("b", "bcd"))
    assert s.push("abcde") == "a" and s.found == "bcd"


def test_every_prefix_length_of_a_stop_string_is_held_back():
    """Text ending with any proper prefix of a stop string is held back
    (here "ab" of "abcd", a prefix two shorter than the longest checked), and
    the stop string completed by the next piece is never shown."""
    s = StopStrings(("abcd",))
    assert s.push("xab") == "x"
    assert s.push("cd") == "" and s.found == "abcd"


def test_flush_after_a_stop_returns_nothing():
    """Once a stop string was found, flush() has nothing to give back (the
    generator calls it after a stop found in the decoder's last bytes)."""
    s = StopStrings(("b",))
    assert s.push("abc") == "a"
    assert s.flush() == ""


def test_flush_empties_the_held_text():
    """flush() returns the held text once; the held text is then empty."""
    s = StopStrings(("xyz",))
    assert s.push("axy") == "a"
    assert s.flush() == "xy"
    assert s.flush() == ""
    assert s.push("b") == "b"


@pytest.mark.parametrize(("bad", "needle"), [([1], "stop must be a string"), ([""], "empty string")])
def test_bad_stop_strings_say_what_is_wrong(bad, needle):
    """check_stop_strings' ParameterError says what is wrong with ``stop``."""
    with pytest.raises(ParameterError, match=needle):
        check_stop_strings(bad)
