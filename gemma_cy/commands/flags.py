"""What every gemma-cy command line shares: exit codes, one-line usage
errors, and the flag types (docs/generation.md#cli)."""
from __future__ import annotations

import argparse

from ..errors import ParameterError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(ParameterError):
    """A flag value a subcommand cannot use: one line and exit 2, like argparse's errors."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def int_flag(text: str) -> int:
    """An integer flag value, written in decimal: what ``int(text, 10)``
    accepts ("250", "-1", "+3", "1_000", surrounding spaces). Anything else
    ("1e3", "0x10", "2.0", "") is an argparse error that quotes the text."""
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def float_flag(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def id_list_flag(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]."""
    try:
        ids = [int(part, 10) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def read_utf8(path: str, what: str) -> str:
    """The UTF-8 text of ``path`` ('-': stdin), or ParameterError in one
    line naming ``what`` (the flag or argument): a file that cannot be read,
    or bytes that are not UTF-8 text (a binary file)."""
    import sys
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise ParameterError(f"{what} {path}: cannot read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParameterError(f"{what} {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                             f"give a text file") from None


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """-m (the weights, default the packaged Gemma 3 270M) and --tok_path,
    as every subcommand that loads one model takes them."""
    p.add_argument("-m", "--weights_path", "--weights", dest="weights",
                   help="weights file (default: Gemma 3 270M, as its package ships it)")
    p.add_argument("--tok_path", help="tokenizer file (default: as for gemma-cy)")
