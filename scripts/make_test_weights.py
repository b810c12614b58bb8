"""Write a preset's deterministic random weights (GMW1) and its tokenizer (GMT1).

    python scripts/make_test_weights.py --size tiny -o models/tiny.gmw

writes PATH and PATH + ".tok", then prints the weights file's SHA-256
(tiny: 83f240224e71ca95a87356a016b2ccb41a26efa10af4c150935cd1d5f0c8df57,
the seed engine's fixture, docs/formats.md#the-tiny-test-fixture).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys

from gemma_cy.errors import GemmaCyError
from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
from gemma_cy.formats.gmt import write_gmt
from gemma_cy.formats.gmw import write_gmw
from gemma_cy.commands.presets import PRESETS, random_weights


def sha256_of(path: str) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Parse flags, write the two files, print the SHA-256; 1 on a known error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("-o", "--output", help="weights path (default models/<size>.gmw)")
    args = parser.parse_args(argv)
    path = args.output or os.path.join("models", f"{args.size}.gmw")
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        config, tensors = random_weights(args.size)
        write_gmw(path, config, tensors)
        del tensors
        write_gmt(path + ".tok", fixture_vocab(config.vocab_size))
    except (GemmaCyError, OSError) as e:
        print(f"make_test_weights: {e}", file=sys.stderr)
        return 1
    print(f"{sha256_of(path)}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
