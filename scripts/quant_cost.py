"""What the weights cost on Gemma 3 270M: teacher-forced over real English.

    python scripts/quant_cost.py [--n 2048] [--engine fast]

Runs the GPL-3 text (the same 2048 tokens as the transformers goldens in
tests/goldens/gemma3_270m/teacher_forced.json, BOS first) through
  original: the chosen engine on the packaged Q4_K_M file, every weight as stored
            (with f32 activations, then with the opt-in q8 activations)
  q8_0:     the chosen engine on the file re-quantized to Q8_0 (gemma-cy convert,
            made once into gemma-cy's cache directory)
  f32:      the reference engine on the original GGUF dequantized to f32
and prints, over the predicted positions: each one's perplexity of the
actual next token and its top-1 agreement with transformers, and the
agreement of the first two with f32.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from gemma_cy.commands.default_model import default_model_path, q8_0_conversion
from gemma_cy.generation.engines import make_engine
from gemma_cy.formats.gguf_model import read_gguf, read_gguf_f32
from gemma_cy.model.logits import argmax

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "gemma3_270m" / "teacher_forced.json"


def teacher_forced(engine, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(argmax at each position, NLL of the next actual token) for ids[:-1]."""
    argmaxes, nlls = [], []
    engine.reset()
    for pos, token in enumerate(ids[:-1]):
        logits = engine.decode(token).astype(np.float64)
        argmaxes.append(argmax(logits))
        top = logits.max()
        log_z = top + math.log(float(np.exp(logits - top).sum()))
        nlls.append(log_z - logits[ids[pos + 1]])
    return np.array(argmaxes), np.array(nlls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048, help="predicted positions (<= 2048)")
    p.add_argument("--engine", default="fast", help="the engine of the first two rows")
    args = p.parse_args()
    golden = json.loads(GOLDEN.read_text())
    ids = golden["ids"][: args.n + 1]
    hf_argmax = np.array(golden["argmax_ids"][: args.n])
    source = default_model_path()

    results = {}
    for label, weights, engine, activations in (
            ("original", read_gguf(source), args.engine, "f32"),
            ("original, q8 activations", read_gguf(source), args.engine, "q8"),
            ("q8_0", read_gguf(q8_0_conversion(source)), args.engine, "f32"),
            ("f32", read_gguf_f32(source), "reference", "f32")):
        start = time.perf_counter()
        argmaxes, nlls = teacher_forced(make_engine(engine, weights, len(ids), activations), ids)
        results[label] = (argmaxes, nlls)
        print(f"{label} ({engine}): {len(nlls)} positions in {time.perf_counter() - start:.0f} s, "
              f"perplexity {math.exp(nlls.mean()):.4f}, top-1 agreement with transformers "
              f"{100 * np.mean(argmaxes == hf_argmax):.2f}%")
    for label in ("original", "original, q8 activations", "q8_0"):
        agree = np.mean(results[label][0] == results["f32"][0])
        print(f"{label} vs f32 top-1 agreement: {100 * agree:.2f}% over {len(ids) - 1} positions")
    print(f"transformers (golden): perplexity {golden['perplexity']:.4f}")


if __name__ == "__main__":
    main()
