"""Model size presets (GMW1 shapes) and their deterministic random weights.

``tiny`` is the seed engine's test fixture (docs/formats.md#the-tiny-test-fixture): its weights are the
seed's byte for byte. The larger presets are for tests and benchmarks; a
standard-normal init would overflow at their sizes, so they are scaled
(see ``random_weights``).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..model.config import ModelConfig
from ..errors import ModelFormatError, ParameterError
from ..formats.gmw import gmw_config, gmw_layout
from ..quant.tensors import Int8Tensor, quantize_per_tensor

SEED = 20260818  # docs/formats.md#the-tiny-test-fixture: one generator for the whole file, in file order

PRESETS: dict[str, dict] = {
    # the seed's fixture (docs/formats.md#the-tiny-test-fixture)
    "tiny": dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=1, mlp_dim=1024,
                 vocab_size=1024, max_seq_len=256, head_dim=64, rope_base=10000.0),
    # a few MB: GQA with 2 kv heads, for tests that want more than one kv head
    "small": dict(n_layers=4, dim=512, n_heads=8, n_kv_heads=2, mlp_dim=1536,
                  vocab_size=4096, max_seq_len=512, head_dim=64, rope_base=10000.0),
    # Gemma-3-270M-like sizes in GMW1 (head_dim 160 so that n_heads*head_dim
    # == dim; untied lm_head): ~427 MB, for benchmarks
    "270m-gmw1": dict(n_layers=18, dim=640, n_heads=4, n_kv_heads=1, mlp_dim=2048,
                 vocab_size=262144, max_seq_len=4096, head_dim=160, rope_base=10000.0),
}

# Real models a file can be checked against (--model_size), beside the GMW1
# presets: their sizes as the model's GGUF gives them.
REAL_MODELS: dict[str, dict] = {
    # Gemma 3 270M (the default model)
    "270m": dict(n_layers=18, dim=640, n_heads=4, n_kv_heads=1, head_dim=256, mlp_dim=2048,
                 vocab_size=262144, max_seq_len=32768),
}

# presets drawn exactly as the seed drew them: every tensor standard normal
SEED_INIT = frozenset({"tiny"})

_CHUNK_VALUES = 1 << 22  # f64 values drawn per call: bounds the temporary to 32 MB
_NORM_GAIN_STD = 0.1


def preset_config(name: str) -> ModelConfig:
    """The GMW1 ModelConfig of preset ``name`` (ParameterError if unknown)."""
    if name not in PRESETS:
        raise ParameterError(f"unknown model size {name!r}: expected one of {sorted(PRESETS)}")
    return gmw_config(**PRESETS[name])


def match_preset(config: ModelConfig) -> str | None:
    """Name of the preset ``config`` equals, or None.

    Tokenizer-given fields (bos_id, eos_ids) are ignored: a preset fixes
    the model, not its special tokens.
    """
    bare = dataclasses.replace(config, bos_id=None, eos_ids=())
    for name in PRESETS:
        if preset_config(name) == bare:
            return name
    return None


def check_preset(config: ModelConfig, name: str, source: str = "weights") -> None:
    """Raise ModelFormatError naming the first field where ``config`` differs
    from preset ``name`` (the CLI's ``--model_size`` check): a real model's
    sizes (REAL_MODELS), or every field of a GMW1 preset."""
    if name in REAL_MODELS:
        for field, expected in REAL_MODELS[name].items():
            found = getattr(config, field)
            if found != expected:
                raise ModelFormatError(
                    f"{source}: {field} = {found!r}, but model size {name!r} has {expected!r}")
        return
    if name not in PRESETS:
        raise ParameterError(f"unknown model size {name!r}: expected one of {sorted({*PRESETS, *REAL_MODELS})}")
    want = preset_config(name)
    for field in dataclasses.fields(ModelConfig):
        if field.name in ("bos_id", "eos_ids"):
            continue
        found, expected = getattr(config, field.name), getattr(want, field.name)
        if found != expected:
            raise ModelFormatError(
                f"{source}: {field.name} = {found!r}, but model size {name!r} has {expected!r}")


def random_weights(name: str) -> tuple[ModelConfig, dict[str, Int8Tensor]]:
    """Deterministic random int8 weights of preset ``name`` (docs/formats.md#the-tiny-test-fixture).

    One ``np.random.default_rng(SEED)``; for each tensor in GMW1 file order,
    ``rng.standard_normal(shape)`` in f64 (drawn in row chunks: the stream,
    and so every value, is the same as one call), mapped to
    ``mean + std * z``, cast to f32 and quantized per tensor (docs/formats.md#int8-per-tensor-quantization).

    ``tiny`` (SEED_INIT) uses mean 0, std 1 for every tensor, the seed's own
    draw. The other presets keep activations near unit size: norm gains
    1 + 0.1 z; embed_tokens z (rows are looked up, then RMS-normalized);
    every other matrix [out][in] z / sqrt(in), so a product with a
    unit-RMS vector stays unit-RMS.
    """
    config = preset_config(name)
    rng = np.random.default_rng(SEED)
    tensors = {}
    for tname, shape in gmw_layout(config):
        mean, std = _init(name, tname, shape)
        w = _draw(rng, shape, mean, std)
        tensors[tname] = quantize_per_tensor(w.reshape(-1) if shape[1] == 1 else w)
    return config, tensors


def _init(preset: str, tname: str, shape: tuple[int, int]) -> tuple[float, float]:
    """(mean, std) of tensor ``tname`` of ``preset`` (see random_weights)."""
    cols = shape[1]
    if preset in SEED_INIT:
        return 0.0, 1.0
    if cols == 1:
        return 1.0, _NORM_GAIN_STD
    if tname == "embed_tokens":
        return 0.0, 1.0
    return 0.0, 1.0 / math.sqrt(cols)


def _draw(rng: np.random.Generator, shape: tuple[int, int], mean: float, std: float) -> np.ndarray:
    """``mean + std * rng.standard_normal(shape)`` as f32, drawn in row chunks."""
    rows, cols = shape
    w = np.empty(shape, dtype=np.float32)
    step = max(1, _CHUNK_VALUES // cols)
    for r in range(0, rows, step):
        z = rng.standard_normal((min(step, rows - r), cols))  # f64
        w[r:r + step] = z * std + mean  # exact for mean 0, std 1 (the seed's values)
    return w
