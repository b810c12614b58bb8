"""What the test modules share. A test module imports these from here, never
from another test module (nor from conftest.py, which holds only fixtures).

- paths and subprocesses: ``REPO``, ``run_script``, ``cli``, ``assert_one_line_error``,
  ``assert_rejected_under_python_O`` (docs/errors.md row 15);
- the SIMD modules: ``AVAILABLE``, ``ISA`` (run a test once per module),
  ``kernels``;
- two engines compared (docs/numerics.md#tolerances,
  docs/numerics.md#local-error-not-drift, docs/numerics.md#greedy-agreement):
  ``assert_within``, ``record``, ``check_each_op_against_the_reference``,
  ``check_every_op_free_running``, ``assert_same_greedy_id``,
  ``greedy_engines_agree``, ``greedy_both``, ``reference_agrees_with_oracle``;
- small models and files: ``make_weights``/``cached_weights`` (int8 per
  tensor), ``q8_0_weights``, ``with_tensor``, ``gguf_tensors``, the
  byte-level BPE hand vocab (``bpe_hand_vocab``), and the HF goldens
  (``golden_rows``, ``golden_report``).
"""
from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gemma_cy.generation.local_error import teacher_forced
from gemma_cy.fast import ops
from gemma_cy.fast.engine import FastEngine
from gemma_cy.formats.gguf_model import gguf_tensor_name
from gemma_cy.formats.gguf_writer import TensorData
from gemma_cy.model.config import ModelConfig
from gemma_cy.model.logits import argmax, top2_margin
from gemma_cy.model.tolerance import DEFAULT, EXACT, tolerance_for
from gemma_cy.model.weights import Weights, expected_shapes
from gemma_cy.quant.types import GGML_TYPE_IDS
from gemma_cy.quant.tensors import F32Tensor, Int8Tensor, Q8_0Tensor, quantize_per_tensor, quantize_q8_0
from gemma_cy.tokenizers.bpe import byte_alphabet
from gemma_cy_reference.model import ReferenceEngine

REPO = Path(__file__).resolve().parent.parent
GOLDENS = REPO / "tests" / "goldens"
# The seed engine's fixture (docs/formats.md#the-tiny-test-fixture), as
# scripts/make_test_weights.py --size tiny writes it.
TINY_SHA256 = "83f240224e71ca95a87356a016b2ccb41a26efa10af4c150935cd1d5f0c8df57"


# ---------------------------------------------------------------------------
# Subprocesses


def run_script(*args: str) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in the repository; raises if it fails."""
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, check=True)


def cli(*args: str, timeout: float = 120, env_extra: dict | None = None, input: str | None = None):
    """Run `python -m gemma_cy.commands.cli ARGS` and return the CompletedProcess.
    stdin is ``input`` (default: empty, so a run without --prompt reads an
    empty prompt instead of whatever stdin the test runner has)."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "gemma_cy.commands.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env, input="" if input is None else input)


def assert_one_line_error(result, *needles: str, code: int | None = None) -> None:
    """``result`` (a CompletedProcess) failed (with exit status ``code``, if
    given) with one line on stderr, no traceback, holding every needle."""
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_rejected_under_python_O(reader: str, directory: Path, cases: dict[str, bytes],
                                   good: str | None = None) -> None:
    """docs/errors.md row 15: the checks are not asserts. Writes each of
    ``cases`` (file name -> bytes) into ``directory`` and reads it, under
    ``python -O``, with ``reader`` ("module:function"): every one must raise
    ModelFormatError; then ``good`` (a path), if given, must read."""
    for name, data in cases.items():
        (directory / name).write_bytes(data)
    module, function = reader.split(":")
    script = textwrap.dedent(f"""
        import sys
        from gemma_cy.errors import ModelFormatError
        from {module} import {function} as read
        if __debug__:
            sys.exit("not running under -O")
        for name in {sorted(cases)!r}:
            try:
                read({str(directory)!r} + "/" + name)
            except ModelFormatError:
                continue
            sys.exit("accepted " + name)
        if {good!r} is not None:
            read({good!r})
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------
# The SIMD modules: ``@ISA`` runs a test once per module, skipping (with the
# reason) those this CPU cannot run or this architecture does not build.

AVAILABLE = ops.available()


def _skip_reason(name: str) -> str:
    if not ops._cpu_runs(name):
        return f"this CPU cannot run {name} (it runs: {', '.join(AVAILABLE)})"
    return f"{name} is not built on this architecture"


# GEMMA_CY_REQUIRE_ISAS=avx512,neon (comma-separated): those modules must run
# here, so their tests fail instead of skipping; how a module's tests are made
# to run on new hardware before it joins ops.TESTED_ON_HARDWARE.
REQUIRED = [name.strip() for name in os.environ.get("GEMMA_CY_REQUIRE_ISAS", "").split(",") if name.strip()]


def _isa_param(name: str):
    """Run on ``name`` when this CPU and build can; skip with the reason when
    not, unless GEMMA_CY_REQUIRE_ISAS names it: then the test runs and fails
    on ops.module_for's one-line error."""
    if name in AVAILABLE or name in REQUIRED:
        return pytest.param(name)
    return pytest.param(name, marks=pytest.mark.skip(reason=_skip_reason(name)))


ISA = pytest.mark.parametrize("isa", [_isa_param(name) for name in ops.ISAS])


def kernels(isa: str):
    return ops.module_for(isa)


# ---------------------------------------------------------------------------
# Two engines compared


def assert_within(actual, expected, what: str, tolerance: tuple[float, float] = DEFAULT) -> None:
    """|actual - expected| <= atol + rtol*|expected| element by element, for
    ``tolerance`` = (atol, rtol), a class of gemma_cy.model.tolerance
    (docs/numerics.md#tolerances); EXACT means equal."""
    atol, rtol = tolerance
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


def record(engine, ids, run_decode: bool = True) -> dict:
    """(layer, op, pos) -> value of every observer call while running ``ids``,
    one decode per position (so every position has logits)."""
    seen = {}

    def observer(layer, op, pos, value):
        seen[layer, op, pos] = value
    if run_decode:
        for token in ids:
            engine.decode(token, observer)
    else:
        engine.prefill(ids, observer)
    return seen


def check_each_op_against_the_reference(weights: Weights, ids, isa: str) -> None:
    """Every op of every position of the fast engine equals the reference's
    layer function applied to the fast engine's own input of that op
    (gemma_cy.generation.local_error.teacher_forced, the diff tool's local check),
    within the op's bound (``tolerance_for``, the diff tool's table: the
    embedding and the residual adds exactly)."""
    got = record(FastEngine(weights, 64, isa), ids)
    want = teacher_forced(ReferenceEngine(weights, 64), got, ids)
    assert len(want) == len(got)
    for key, value in want.items():
        assert_within(got[key], value, str(key), tolerance_for(key[1], weights.config))


def check_every_op_free_running(weights: Weights, ids, isa: str) -> None:
    """Both engines run ``ids`` on their own: every op of every position
    within the default bound, and the embedding (the same rows from the same
    token ids in both) exactly."""
    got = record(FastEngine(weights, 64, isa), ids)
    want = record(ReferenceEngine(weights, 64), ids)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert_within(got[key], value, str(key), EXACT if key[1] == "embed" else DEFAULT)


def assert_rewinds_and_resets(engine) -> None:
    """The CheckedEngine contract on a fresh engine: forward(token, pos) rewrites
    position pos and forgets what came after it; reset() starts over, and
    the same ids give the same logits bit for bit."""
    first = engine.prefill([1, 2, 3])
    engine.prefill([4, 5])
    assert engine.pos == 5
    np.testing.assert_array_equal(engine.forward(3, 2), first)  # rewrites position 2
    assert engine.pos == 3
    engine.reset()
    assert engine.pos == 0
    np.testing.assert_array_equal(engine.prefill([1, 2, 3]), first)


def assert_same_greedy_id(want, got, label: str, step: int, names: tuple[str, str] = ("reference", "fast")) -> int:
    """The greedy picks of logits ``want`` (engine ``names[0]``) and ``got``
    (``names[1]``) are equal; returns the id. A divergence reports, in
    docs/numerics.md#greedy-agreement's form, the step, both ids and the
    first engine's top-1/top-2 margin."""
    a, b = argmax(want), argmax(got)
    assert a == b, (f"{label}: step {step}: {names[0]} id {a}, {names[1]} id {b}; "
                    f"{names[0]} top-1/top-2 margin {top2_margin(want):.6g}")
    return a


def greedy_engines_agree(ref, fast, ids, n: int, label: str, judge_drift: bool = True) -> list[int]:
    """Reset both engines, prefill ``ids`` and greedy-decode ``n`` tokens on
    each: the ids must be equal (docs/numerics.md#greedy-agreement). With
    ``judge_drift``, every step's logits (the last one's too), each engine
    running on its own cache, must also be within the default tolerance of
    docs/numerics.md#tolerances. Returns the greedy ids."""
    ref.reset()
    fast.reset()
    want, got = ref.prefill(ids), fast.prefill(ids)
    out = []
    for step in range(n):
        token = assert_same_greedy_id(want, got, label, step)
        if judge_drift:
            assert_within(got, want, f"{label}: logits at step {step}")
        out.append(token)
        want, got = ref.decode(token), fast.decode(token)
    if judge_drift:
        assert_within(got, want, f"{label}: final logits")
    return out


def greedy_both(weights: Weights, ids: list[int], n: int, isa: str) -> None:
    """Greedy-decode ``n`` tokens on both engines: the ids must be equal. The
    tiny fixture's free-running logits are not judged over 64 steps
    (docs/numerics.md#local-error-not-drift): its random weights amplify one
    rounding through the residual cancellation described in
    tests/test_forward.py, and over 64 free-running steps every ISA module
    comes near the tolerance (measured on "Once upon a time": the worst step
    at 0.83-1.13 of it, by the module's summation order). Each op is judged
    on its own inputs by check_each_op_against_the_reference."""
    greedy_engines_agree(ReferenceEngine(weights, 256), FastEngine(weights, 256, isa), ids, n, isa,
                         judge_drift=False)


def reference_agrees_with_oracle(reference, prompt: dict, golden_dir: Path, rms_limit: float) -> None:
    """The reference on ``prompt`` (a golden record: prompt_ids, logits_file,
    greedy_ids, step_margins, step_second_ids, and logits_ids when the file
    holds only those ids' logits) against the oracle's goldens:
    last-position logits rms below ``rms_limit``, then the same greedy ids
    (a divergence reports the step and the oracle's margin there)."""
    reference.reset()
    logits = reference.prefill(prompt["prompt_ids"])
    oracle = np.load(golden_dir / prompt["logits_file"])
    sample = prompt.get("logits_ids")  # a real vocabulary's goldens keep a sample of the ids (make_arch_goldens)
    kept = logits if sample is None else logits[sample]
    rms = float(np.sqrt(np.mean((kept.astype(np.float64) - oracle) ** 2)))
    print(f"{prompt['name']}: logits rms {rms:.3g}")
    assert rms < rms_limit, f"{prompt['name']}: last-position logits rms {rms:.4g} >= {rms_limit}"
    for step, want in enumerate(prompt["greedy_ids"]):
        got = argmax(logits)
        if got != want:
            pytest.fail(f"{prompt['name']}: greedy step {step}: reference {got}, oracle {want}; "
                        f"oracle's top-1/top-2 margin {prompt['step_margins'][step]:.4g} "
                        f"(second choice {prompt['step_second_ids'][step]})")
        if step + 1 < len(prompt["greedy_ids"]):
            logits = reference.decode(got)


def engine_near_oracle(engine, prompt: dict, golden_dir: Path, rms_limit: float) -> None:
    """An engine that rounds on purpose (the q8 activation mode) against the
    oracle's goldens on ``prompt``: last-position logits rms below
    ``rms_limit``; then greedy tokens equal to the oracle's until they
    diverge, and a divergence only where the oracle's top-1/top-2 margin is
    below what the engine's own error explains: 2 * sqrt(2) * rms (two
    standard deviations of the difference of two logits' errors, rms being
    the engine's logit error measured on this prompt). The test prints the
    step, both ids and the margin of every divergence."""
    engine.reset()
    logits = engine.prefill(prompt["prompt_ids"])
    oracle = np.load(golden_dir / prompt["logits_file"])
    rms = float(np.sqrt(np.mean((logits.astype(np.float64) - oracle) ** 2)))
    bound = 2 * math.sqrt(2) * rms
    assert rms < rms_limit, f"{prompt['name']}: last-position logits rms {rms:.4g} >= {rms_limit}"
    for step, want in enumerate(prompt["greedy_ids"]):
        got = argmax(logits)
        if got != want:
            margin = prompt["step_margins"][step]
            print(f"{prompt['name']}: rms {rms:.3g}; diverges at step {step}: engine {got}, oracle {want}, "
                  f"oracle margin {margin:.4g} (bound {bound:.3g})")
            assert margin < bound, (f"{prompt['name']}: greedy step {step}: engine {got}, oracle {want} at an "
                                    f"oracle margin of {margin:.4g}, more than the engine's error explains "
                                    f"({bound:.3g} = 2 sqrt(2) x logits rms {rms:.3g})")
            return
        if step + 1 < len(prompt["greedy_ids"]):
            logits = engine.decode(got)
    print(f"{prompt['name']}: rms {rms:.3g}; all {len(prompt['greedy_ids'])} greedy tokens agree")


def teacher_forced_figures(engine, ids: list[int], oracle_argmax) -> tuple[float, float, int]:
    """Feed ``ids`` one by one (teacher forcing): (top-1 agreement with
    ``oracle_argmax``, perplexity of each next id, positions scored)."""
    engine.reset()
    argmaxes, nlls = [], []
    for pos, token in enumerate(ids[:-1]):
        logits = engine.decode(token).astype(np.float64)
        argmaxes.append(int(np.argmax(logits)))
        top = logits.max()
        nlls.append(top + math.log(float(np.exp(logits - top).sum())) - logits[ids[pos + 1]])
    agreement = float(np.mean(np.array(argmaxes) == np.asarray(oracle_argmax)[:len(argmaxes)]))
    return agreement, math.exp(float(np.mean(nlls))), len(nlls)


# ---------------------------------------------------------------------------
# Small models


def make_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """Random weights quantized per tensor; matrices scaled by 1/sqrt(in) so
    activations stay O(1). Plain gains are standard normal (like the seed's
    fixture); (1 + g) gains have g small."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        w = rng.standard_normal(shape)
        if len(shape) == 1 and config.norm_gain == "one_plus":
            w = 0.3 * w
        elif len(shape) == 2 and not name.startswith("embed"):
            w = w / math.sqrt(shape[1])
        tensors[name] = quantize_per_tensor(w.astype(np.float32))
    return Weights(config, tensors)


@functools.lru_cache(maxsize=None)
def cached_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """``make_weights``, made once per (config, seed) and session."""
    return make_weights(config, seed)


def q8_0_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """Random Weights as a GGUF file holds them: Q8_0 matrices (scaled by
    1/sqrt(in), so activations stay O(1)) and F32 gains near 1."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        w = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1:
            tensors[name] = F32Tensor(1 + np.float32(0.3) * w)
        else:
            scale = 1.0 if name == "embed_tokens" else 1 / math.sqrt(shape[1])
            tensors[name] = Q8_0Tensor(quantize_q8_0(w * np.float32(scale)))
    return Weights(config, tensors)


def with_tensor(weights: Weights, name: str, q=None, scale=None) -> Weights:
    """``weights`` with Int8Tensor ``name``'s values ``q`` and/or its scale replaced."""
    tensors = dict(weights.tensors)
    old = tensors[name]
    tensors[name] = Int8Tensor(q=old.q if q is None else q, scale=np.float32(old.scale if scale is None else scale))
    return Weights(weights.config, tensors)


def gemma3_gguf_fields(c: ModelConfig) -> dict:
    """The GGUF metadata of a Gemma 3 model of config ``c``."""
    return {
        "general.architecture": "gemma3", "gemma3.context_length": c.max_seq_len,
        "gemma3.embedding_length": c.dim, "gemma3.block_count": c.n_layers,
        "gemma3.feed_forward_length": c.mlp_dim, "gemma3.attention.head_count": c.n_heads,
        "gemma3.attention.head_count_kv": c.n_kv_heads, "gemma3.attention.key_length": c.head_dim,
        "gemma3.attention.value_length": c.head_dim, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": c.rope_base, "gemma3.attention.sliding_window": c.sliding_window,
        "gemma3.attention.sliding_window_pattern": c.sliding_window_pattern,
    }


def gguf_tensors(weights: Weights) -> list[TensorData]:
    """``weights`` (Q8_0 and F32 tensors) as gguf_writer tensors under
    llama.cpp's names, dims in GGUF order (the row length first)."""
    out = []
    for name, t in weights.tensors.items():
        if isinstance(t, Q8_0Tensor):
            out.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["Q8_0"], tuple(reversed(t.shape)),
                                  t.blocks))
        else:
            out.append(TensorData(gguf_tensor_name(name), GGML_TYPE_IDS["F32"], tuple(reversed(t.shape)),
                                  t.data))
    return out


# ---------------------------------------------------------------------------
# Tokenizers: a byte-level BPE vocab built by hand, and HF's goldens

BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_MISSING = 0x04  # a byte the hand vocab lacks (SmolLM2's lacks it too)
# (left, right) in rank order; each merged token is added to the vocab
BPE_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("b", "c"), ("a", "b"), ("Ġ", "Ġ"), ("ĠĠ", "Ġ"), ("'", "s"),
              ("Ċ", "Ċ"), ("ä", "½"), ("ä½", "ł"), ("-", ">")]


def bpe_hand_vocab(merges=BPE_MERGES) -> tuple[list[str], list[int], list[str]]:
    """(tokens, types, merges) of a small byte-level BPE vocab: SmolLM2's
    three markers (control), every byte but BPE_MISSING, and ``merges``."""
    tokens = BPE_SPECIALS + [c for b, c in enumerate(byte_alphabet()) if b != BPE_MISSING]
    tokens += [a + b for a, b in merges if a + b not in tokens]
    types = [3] * len(BPE_SPECIALS) + [1] * (len(tokens) - len(BPE_SPECIALS))
    return tokens, types, [f"{a} {b}" for a, b in merges]


def golden_rows(name: str, maker: str) -> list[dict]:
    """The records of tests/goldens/``name`` (JSON lines). The goldens are
    committed, so a missing one fails the test (naming the script that makes
    it, ``maker``) instead of skipping it silently."""
    path = GOLDENS / name
    if not path.exists():
        pytest.fail(f"{path} missing (it is committed; make it again with scripts/{maker})")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def golden_report(what: str, rows: list[dict], bad: list[tuple[dict, list, list]]) -> str:
    """The failure message of a golden comparison: how many of ``rows`` agree,
    and the first few of ``bad`` (row, ours, HF's)."""
    lines = [f"{what}: {len(rows) - len(bad)}/{len(rows)} strings agree with HF transformers; first differences:"]
    lines += [f"  {r['text'][:60]!r}: ours {got[:16]} HF {want[:16]}" for r, got, want in bad[:5]]
    return "\n".join(lines)


class ScriptedEngine:
    """An engine whose logits follow a script: step i favours token
    script[i] (10 against 0 over ``vocab`` ids; token 0 once the script
    runs out), or is the whole logits row script[i] when that is an array.
    Records the ids it was fed; refuses to write past its cache."""

    def __init__(self, script, cache_len=256, vocab=1024):
        self.script, self.cache_len, self.vocab, self.pos, self.fed = list(script), cache_len, vocab, 0, []

    def reset(self):
        self.pos, self.fed = 0, []

    def rewind(self, pos):
        self.pos = pos
        del self.fed[pos:]

    def _logits(self):
        step = len(self.fed) - self.n_prompt
        row = self.script[step] if step < len(self.script) else 0
        if isinstance(row, np.ndarray):
            return row.copy()
        logits = np.zeros(self.vocab, np.float32)
        logits[row] = 10.0
        return logits

    def prefill(self, ids, observer=None):
        self.n_prompt = len(self.fed) + len(ids)
        self.fed += list(ids)
        self.pos += len(ids)
        return self._logits()

    def decode(self, token, observer=None):
        if self.pos >= self.cache_len:
            raise AssertionError("wrote past the cache")
        self.fed.append(token)
        self.pos += 1
        return self._logits()
