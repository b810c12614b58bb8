"""Engine selection: the name a user gives -> an engine over loaded Weights.

"fast" (the default) is the Cython forward pass, gemma_cy.fast.engine;
"reference" the NumPy one, imported only when asked for.
"""
from __future__ import annotations

import os

from ..errors import ParameterError
from ..model.checks import ACTIVATION_MODES, cache_length, check_activation_mode
from ..model.weights import Weights

ENGINES = ("reference", "fast")
DEFAULT_ENGINE = "fast"
# What the q8 mode gains over f32, by SIMD module: `--help` and the README's
# flag table say these same words (tests/test_readme_shell.py holds them
# equal). Measured with scripts/bench.py --models gemma3 --parts warm on one
# Zen 4 core, each module forced by GEMMA_CY_SIMD (docs/benchmarks.md).
Q8_SPEED = ("prefill ~1.6x faster with AVX-512 VNNI, ~1.2x with AVX2; decode about equal with AVX-512 VNNI, "
            "~1.6x faster with AVX2: each module on one Zen 4, 2026-12-06")
__all__ = ["ACTIVATION_MODES", "DEFAULT_ENGINE", "ENGINES", "Q8_SPEED", "make_engine"]


# Slots a model has when not told (load's max_sequences=None): a list of up to
# this many prompts (or n samples) decodes together, each step one pass over
# the weights; beyond ~8 the aggregate gains little on one core (its
# lm_head product is per sequence: docs/benchmarks.md#batched-decode).
DEFAULT_MAX_SEQUENCES = 8
MEMORY_SHARE = 0.5  # of the memory available at load that full caches of every default slot may take


def sequence_cache_bytes(config, cache_len: int) -> int:
    """The most one sequence's keys and values can take: every layer's
    ``cache_len`` rows of the model's kv width in f32 (an upper bound: a
    sliding-window layer keeps fewer rows)."""
    return config.n_layers * cache_len * config.kv_dim * 4 * 2


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (the physical memory where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_sequences(config, cache_len: int) -> int:
    """The slots of a model loaded without ``max_sequences``: up to
    DEFAULT_MAX_SEQUENCES, as many as fit MEMORY_SHARE of the available
    memory with every cache full. A slot's cache is a lazily filled map
    (docs/architecture.md#batching): it takes memory only as its positions
    fill, so a model that never batches pays nothing for them."""
    budget = int(available_memory() * MEMORY_SHARE)
    return max(1, min(DEFAULT_MAX_SEQUENCES, budget // max(1, sequence_cache_bytes(config, cache_len))))


def check_max_sequences(max_sequences) -> int:
    if isinstance(max_sequences, bool) or not isinstance(max_sequences, int) or not 1 <= max_sequences <= 4096:
        raise ParameterError(f"max_sequences = {max_sequences!r}, must be an integer in [1, 4096]")
    return max_sequences


def make_engine(name: str, weights: Weights, max_cache_len: int, activations: str = "f32", max_sequences: int = 1):
    """Build engine ``name`` ("reference" or "fast") with a KV cache of
    min(max_cache_len, model max) positions. ``activations``: "f32" (the
    default) or "q8", the opt-in mode that quantizes every matrix input
    to int8 per block of 32 (docs/numerics.md#activation-modes: both engines do it bit for bit the
    same way; it costs fidelity, so it is never the default). ``max_sequences``:
    the slots of its ``batch`` engine (several sequences at once; slot 0 is
    the engine's own cache)."""
    cache_length(max_cache_len, weights.config)  # ParameterError unless an integer > 0
    check_activation_mode(activations, weights.config, weights.tensors)  # ParameterError unless the model can run it
    check_max_sequences(max_sequences)
    if name == "reference":
        from gemma_cy_reference.model import ReferenceEngine
        return ReferenceEngine(weights, max_cache_len, activations, n_slots=max_sequences)
    if name == "fast":
        from ..fast.engine import FastEngine
        return FastEngine(weights, max_cache_len, activations=activations, n_slots=max_sequences)
    raise ParameterError(f"engine = {name!r}, expected one of {ENGINES}")
