"""GGUF metadata as a ModelConfig: each architecture's sizes and switches
(``gguf_config``; docs/formats.md#architectures, docs/model.md for what each
switch means). The tensors are gemma_cy.formats.gguf_model's."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFormatError
from ..model.config import ModelConfig
from .gguf_reader import (ARRAY, BOOL, F32_ID, FLOAT_TYPES, INTEGER_TYPES, STRING, VALUE_TYPE_NAMES, GGUFFile,
                          StringArray, type_name)

SUPPORTED_ARCHITECTURES = ("gemma", "gemma2", "gemma3", "gemma4", "llama", "phi3", "qwen2", "qwen3")
# LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): the short factors are read as
# rope_freqs; the long ones, for contexts past the original, are checked and left.
ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG = "rope_factors_short.weight", "rope_factors_long.weight"

# Gemma 3 values the GGUF metadata does not carry (llama.cpp hard-codes them
# for the architecture too): local RoPE base, and the layer pattern (5 local
# layers then 1 global).
GEMMA3_ROPE_BASE_LOCAL = 10000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_ROPE_BASE = 1_000_000.0  # HF Gemma3TextConfig.rope_theta, if freq_base is absent
GEMMA3_27B_LAYERS = 62  # the one size whose query_pre_attn_scalar is dim // n_heads
# Gemma 2's, where its GGUF is silent (llama.cpp's values for the architecture).
GEMMA2_27B_LAYERS = 46  # the one size whose query_pre_attn_scalar is dim // n_heads
GEMMA2_SLIDING_WINDOW, GEMMA2_SLIDING_WINDOW_PATTERN = 4096, 2
GEMMA2_ATTN_SOFTCAP, GEMMA2_FINAL_SOFTCAP = 50.0, 30.0


class _Meta:
    """Typed access to one architecture's metadata keys, with messages."""

    def __init__(self, gf: GGUFFile, arch: str) -> None:
        self.gf, self.arch = gf, arch

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{self.gf.path}: {message}")

    def int(self, key: str, default: int | None = None, *, low: int = 1) -> int:
        full = key.format(arch=self.arch)
        f = self.gf.fields.get(full)
        if f is None:
            if default is None:
                raise self.fail(f"metadata {full} is missing")
            return default
        if f.type not in INTEGER_TYPES:
            raise self.fail(f"metadata {full}: type {type_name(f)}, expected an integer")
        if f.value < low:
            raise self.fail(f"metadata {full}: found {f.value}, must be >= {low}")
        return int(f.value)

    def float(self, key: str, default: float) -> float:
        full = key.format(arch=self.arch)
        f = self.gf.fields.get(full)
        if f is None:
            return default
        if f.type not in FLOAT_TYPES:
            raise self.fail(f"metadata {full}: type {type_name(f)}, expected a float")
        return float(f.value)


def gguf_config(gf: GGUFFile) -> ModelConfig:
    """The ModelConfig of a parsed GGUF file (architectures in SUPPORTED_ARCHITECTURES).

    All: sizes (``{arch}.*``), eps, RoPE base (``rope.freq_base``), bos/eos
    ids from ``tokenizer.ggml.*``; vocab_size is the embedding's row count;
    no position table; tied embeddings when there is no ``output.weight``.
    The architecture's own switches: ``_gemma_switches``, ``_gemma2_switches``, ``_gemma3_switches``,
    ``_llama_switches``, ``_phi3_switches``, ``_qwen2_switches``, ``_qwen3_switches``,
    ``_gemma4_switches`` (which also sets the sizes that differ per layer).
    """
    arch_field = gf.fields.get("general.architecture")
    if arch_field is None or arch_field.type != STRING:
        raise ModelFormatError(f"{gf.path}: metadata general.architecture is missing or not a string")
    arch = arch_field.value
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFormatError(f"{gf.path}: architecture {arch!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    m = _Meta(gf, arch)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None or len(emb.dims) != 2:
        raise ModelFormatError(f"{gf.path}: tensor token_embd.weight is missing or not 2-D")
    n_layers = m.int("{arch}.block_count")
    if n_layers > len(gf.tensors):  # bounds every loop over layers below
        raise m.fail(f"metadata {arch}.block_count = {n_layers}, but the file holds only "
                     f"{len(gf.tensors)} tensors")
    dim = m.int("{arch}.embedding_length")
    n_heads = m.int("{arch}.attention.head_count")
    head_dim = m.int("{arch}.attention.key_length", default=dim // n_heads)
    value_len = m.int("{arch}.attention.value_length", default=head_dim)
    if value_len != head_dim:  # (Gemma 4: the global layers' sizes)
        raise m.fail(f"metadata {arch}.attention.value_length = {value_len} differs from key_length "
                     f"= {head_dim}; one head_dim is supported")
    scaling = gf.value(f"{arch}.rope.scaling.type", "none")
    factor = m.float("{arch}.rope.scaling.factor", 1.0)
    if (scaling not in ("none", "linear") or (scaling == "linear" and factor != 1.0)) and not (
            arch == "phi3" and scaling == "longrope") and not (arch == "gemma3" and scaling == "linear"):
        raise m.fail(f"metadata {arch}.rope.scaling: {scaling} x {factor} is not supported "
                     f"(supported: none; linear on Gemma 3's global layers; Phi-3's longrope)")
    special = {}
    for key in ("bos", "eos", "eot"):
        f = gf.fields.get(f"tokenizer.ggml.{key}_token_id")
        if f is not None and f.type not in INTEGER_TYPES:
            raise m.fail(f"metadata tokenizer.ggml.{key}_token_id: type {type_name(f)}, expected an integer")
        special[key] = None if f is None else int(f.value)
    vocab_size = emb.dims[1]
    _check_vocab_metadata(gf, vocab_size)
    switches = {"gemma": _gemma_switches, "gemma2": _gemma2_switches, "gemma3": _gemma3_switches,
                "gemma4": _gemma4_switches, "llama": _llama_switches, "phi3": _phi3_switches,
                "qwen2": _qwen2_switches, "qwen3": _qwen3_switches}[arch](gf, m, n_layers, dim, n_heads, head_dim)
    eos_ids = [special["eos"], special["eot"]] + switches.pop("extra_eos_ids")
    try:
        return ModelConfig(
            n_layers=n_layers, dim=dim, n_heads=n_heads,
            n_kv_heads=switches.pop("n_kv_heads", None) or m.int("{arch}.attention.head_count_kv", default=n_heads),
            head_dim=switches.pop("head_dim", head_dim),
            mlp_dim=switches.pop("mlp_dim", None) or m.int("{arch}.feed_forward_length"),
            vocab_size=vocab_size, max_seq_len=switches.pop("max_seq_len", None) or m.int("{arch}.context_length"),
            position_table=False,
            tied_embeddings="output.weight" not in gf.tensors,
            bos_id=special["bos"],
            eos_ids=tuple(sorted({i for i in eos_ids if i is not None})),
            **switches)
    except ModelFormatError as e:
        raise ModelFormatError(f"{gf.path}: {e}") from None


def _gemma3_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                     head_dim: int) -> dict:
    """Gemma 3's ModelConfig switches.

    From metadata: RoPE global base (``rope.freq_base``; the local base from
    ``rope.freq_base_swa``), eps, sliding window (required and at least 1,
    as llama.cpp requires it: a window of 0 would run every layer with full
    attention, another model), soft-caps if present.
    Derived where the file says nothing (as llama.cpp does): local RoPE base
    10000, pattern 6 (layer l global when (l+1) % 6 == 0), query scale
    1/sqrt(query_pre_attn_scalar) with the scalar = head_dim (dim // n_heads
    for the 62-layer 27B), embed_scale = f32(sqrt(dim)), GELU-tanh,
    half-split RoPE, q/k-norm, sandwich norms. End of turn
    (``<end_of_turn>``, when ``tokenizer.ggml.eot_token_id`` is absent) is an
    eos id too.

    Norm gains: llama.cpp's converter stores Gemma's RMSNorm weights as
    1 + w (its ``norm_shift``), so the gain is used as stored: "plain". (In
    this file every norm value minus 1 is exactly a bf16, the checkpoint's
    dtype: the +1 was added in f32 after reading bf16 w, the same f32 value
    HF computes as ``1.0 + weight.float()``.)
    """
    window = m.int("{arch}.attention.sliding_window")  # required, >= 1: every Gemma 3 has local layers
    linear = gf.value(f"{m.arch}.rope.scaling.type", "none") == "linear"
    pre_attn_scalar = dim // n_heads if n_layers == GEMMA3_27B_LAYERS else head_dim
    has_eot = "tokenizer.ggml.eot_token_id" in gf.fields
    return dict(
        activation="gelu_tanh", rope_pairing="half_split",
        rope_base=m.float("{arch}.rope.freq_base", GEMMA3_ROPE_BASE),
        rope_base_local=m.float("{arch}.rope.freq_base_swa", GEMMA3_ROPE_BASE_LOCAL),
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        norm_gain="plain", embed_scale=float(np.float32(math.sqrt(dim))),
        qk_norm=True, post_norms=True,
        query_scale=1.0 / math.sqrt(pre_attn_scalar),
        rope_scale_global=m.float("{arch}.rope.scaling.factor", 1.0) if linear else 1.0,
        sliding_window=window, **_swa_layers(gf, m, m.arch, n_layers),
        attn_softcap=m.float("{arch}.attn_logit_softcapping", 0.0),
        final_softcap=m.float("{arch}.final_logit_softcapping", 0.0),
        extra_eos_ids=[] if has_eot else [_token_id(gf, "<end_of_turn>")])


def _per_layer_ints(gf: GGUFFile, m: _Meta, key: str, n_layers: int) -> list[int] | None:
    """Metadata ``key`` as one integer per layer (an array of n_layers, or one
    integer for all), or None when absent."""
    f = gf.fields.get(key.format(arch=m.arch))
    if f is None:
        return None
    if f.type != ARRAY:
        return [m.int(key)] * n_layers
    if f.item_type not in INTEGER_TYPES or len(f.value) != n_layers or any(int(v) < 1 for v in f.value):
        raise m.fail(f"metadata {key.format(arch=m.arch)}: expected {n_layers} integers >= 1, found "
                     f"{len(f.value)} of {VALUE_TYPE_NAMES[f.item_type]}")
    return [int(v) for v in f.value]


def _gemma4_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                     head_dim: int) -> dict:
    """Gemma 4's (text model) ModelConfig (docs/model.md#gemma-4): Gemma 3's
    block with gains as stored (its converter adds no 1: transformers'
    Gemma4RMSNorm is x * w), scores unscaled (query scale 1), v RMS-normed
    without a gain, each layer's output times its ``layer_output_scale``,
    and sizes per layer kind: ``attention.key_length`` is the global layers'
    head_dim and ``key_length_swa`` the local ones'; ``head_count_kv`` and
    ``feed_forward_length`` may be one value per layer (the double-wide MLP
    of shared layers). ``attention.shared_kv_layers``: the last N layers read
    the cache of the last earlier layer of their kind. A global layer without
    ``attn_v`` takes v from k's projection. ``embedding_length_per_layer_input``
    switches the per-layer inputs on. RoPE: the local layers over the whole
    head with ``rope.freq_base_swa``; the global ones with ``rope.freq_base``
    and the ``rope_freqs`` divisors (1, or 1e30 for the pairs transformers'
    "proportional" RoPE leaves unrotated). ``expert_count`` (26B-A4B) adds
    the expert block: ``expert_used_count`` chosen per position, each of
    ``expert_feed_forward_length``."""
    n_experts = m.int("{arch}.expert_count", default=0, low=0)
    local_hd = m.int("{arch}.attention.key_length_swa", default=head_dim)
    if m.int("{arch}.attention.value_length_swa", default=local_hd) != local_hd:
        raise m.fail(f"metadata {m.arch}.attention.value_length_swa differs from key_length_swa = {local_hd}")
    for key, want in (("{arch}.rope.dimension_count", head_dim), ("{arch}.rope.dimension_count_swa", local_hd)):
        if m.int(key, default=want) != want:
            raise m.fail(f"metadata {key.format(arch=m.arch)} = {m.int(key)}: partial RoPE is expressed by "
                         f"rope_freqs in Gemma 4; expected the whole head, {want}")
    swa = _swa_layers(gf, m, m.arch, n_layers)
    pattern = swa["sliding_window_pattern"]
    local = list(swa.get("local_layers", ())) or [(layer + 1) % pattern != 0 if pattern else True
                                                   for layer in range(n_layers)]
    kv = _per_layer_ints(gf, m, "{arch}.attention.head_count_kv", n_layers) or [n_heads] * n_layers
    mlp = _per_layer_ints(gf, m, "{arch}.feed_forward_length", n_layers)
    if mlp is None:
        raise m.fail(f"metadata {m.arch}.feed_forward_length is missing")
    kv_local = {k for k, is_local in zip(kv, local) if is_local}
    kv_global = {k for k, is_local in zip(kv, local) if not is_local}
    if len(kv_local) > 1 or len(kv_global) > 1:
        raise m.fail(f"metadata {m.arch}.attention.head_count_kv: one value per layer kind expected, found {kv}")
    first_global = next((layer for layer in range(n_layers) if not local[layer]), None)
    k_eq_v = first_global is not None and f"blk.{first_global}.attn_v.weight" not in gf.tensors \
        and f"blk.{first_global}.attn_k.weight" in gf.tensors
    has_eot = "tokenizer.ggml.eot_token_id" in gf.fields
    n_kv = kv_local.pop() if kv_local else kv[0]
    return dict(
        activation="gelu_tanh", rope_pairing="half_split",
        rope_base=m.float("{arch}.rope.freq_base", GEMMA3_ROPE_BASE),
        rope_base_local=m.float("{arch}.rope.freq_base_swa", GEMMA3_ROPE_BASE_LOCAL),
        rope_freqs="rope_freqs.weight" in gf.tensors, rope_freqs_global_only=True,
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        norm_gain="plain", embed_scale=float(np.float32(math.sqrt(dim))),
        qk_norm=True, post_norms=True, v_norm=True, layer_scalars=True, query_scale=1.0,
        sliding_window=m.int("{arch}.attention.sliding_window"), **swa,
        final_softcap=m.float("{arch}.final_logit_softcapping", 0.0),
        head_dim=local_hd, head_dim_global=head_dim if head_dim != local_hd else 0,
        n_kv_heads=n_kv, n_kv_heads_global=kv_global.pop() if kv_global and kv_global != {n_kv} else 0,
        mlp_dim=max(mlp), mlp_dims=tuple(mlp) if len(set(mlp)) > 1 else (),
        kv_shared_layers=m.int("{arch}.attention.shared_kv_layers", default=0, low=0),
        attn_k_eq_v=k_eq_v,
        per_layer_input_dim=m.int("{arch}.embedding_length_per_layer_input", default=0, low=0),
        n_experts=n_experts, n_experts_used=m.int("{arch}.expert_used_count") if n_experts else 0,
        expert_mlp_dim=m.int("{arch}.expert_feed_forward_length") if n_experts else 0,
        extra_eos_ids=[] if has_eot else [i for i in (_token_id(gf, "<turn|>"), _token_id(gf, "<end_of_turn>"))
                                          if i is not None])


def _gemma_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                    head_dim: int) -> dict:
    """Gemma (1)'s ModelConfig switches (docs/model.md#gemma-1): GELU-tanh
    gating, RMSNorm gains stored as 1 + w ("plain"), embedding times f32
    sqrt(dim), half-split RoPE with ``rope.freq_base`` (10000) on every
    layer, scores scaled by 1/sqrt(head_dim); no q/k norm, no sandwich
    norms, no window, no soft-caps. End of turn joins the eos ids as for
    Gemma 3."""
    has_eot = "tokenizer.ggml.eot_token_id" in gf.fields
    rope_base = m.float("{arch}.rope.freq_base", 10000.0)
    return dict(
        activation="gelu_tanh", rope_pairing="half_split", rope_base=rope_base, rope_base_local=rope_base,
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        norm_gain="plain", embed_scale=float(np.float32(math.sqrt(dim))),
        qk_norm=False, post_norms=False, query_scale=1.0 / math.sqrt(head_dim),
        extra_eos_ids=[] if has_eot else [_token_id(gf, "<end_of_turn>")])


def _gemma2_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                     head_dim: int) -> dict:
    """Gemma 2's ModelConfig switches (docs/model.md#gemma-2): Gemma 1's
    block with sandwich norms, a sliding window on every other layer
    (``attention.sliding_window``, 4096; pattern 2: layer l global when l
    is odd; ``rope.freq_base_swa`` defaults to the one base), soft-caps on
    the attention scores and the logits (``attn_logit_softcapping`` 50,
    ``final_logit_softcapping`` 30), and queries scaled by
    1/sqrt(query_pre_attn_scalar), which the GGUF does not carry: head_dim,
    or dim // n_heads for the 46-layer 27B (llama.cpp's rule)."""
    gemma = _gemma_switches(gf, m, n_layers, dim, n_heads, head_dim)
    scalar = dim // n_heads if n_layers == GEMMA2_27B_LAYERS else head_dim
    return {**gemma, "post_norms": True, "query_scale": 1.0 / math.sqrt(scalar),
            "rope_base_local": m.float("{arch}.rope.freq_base_swa", gemma["rope_base"]),
            "sliding_window": m.int("{arch}.attention.sliding_window", default=GEMMA2_SLIDING_WINDOW),
            **_swa_layers(gf, m, m.arch, n_layers, GEMMA2_SLIDING_WINDOW_PATTERN),
            "attn_softcap": m.float("{arch}.attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP),
            "final_softcap": m.float("{arch}.final_logit_softcapping", GEMMA2_FINAL_SOFTCAP)}


def _llama_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                    head_dim: int) -> dict:
    """Llama's ModelConfig switches (SmolLM2 is one): SiLU gating, plain
    RMSNorm gains (no +1), embedding unscaled, no q/k-norm, no post-norms, no
    sliding window, scores scaled by 1/sqrt(head_dim).

    RoPE pairs are interleaved, (2j, 2j+1): llama.cpp's converter permutes
    the rows of each q and k head from HF's half-split layout so that its own
    adjacent-pair RoPE applies (HF's GGUF loader undoes the permutation and
    rotates half-split: the same function). RoPE must cover the whole head
    (``rope.dimension_count`` == head_dim). Llama 3's RoPE scaling is the
    ``rope_freqs`` tensor the converter writes (one divisor per pair of a
    head, docs/model.md#llama-3); a file that holds it runs with it.
    """
    _check_whole_head_rope(m, head_dim)
    return dict(
        activation="silu", rope_pairing="interleaved", rope_freqs="rope_freqs.weight" in gf.tensors,
        rope_base=m.float("{arch}.rope.freq_base", 10000.0),
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        norm_gain="plain", embed_scale=1.0, qk_norm=False, post_norms=False,
        query_scale=1.0 / math.sqrt(head_dim), extra_eos_ids=[])


def _phi3_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                   head_dim: int) -> dict:
    """Phi-3's (Phi-3, 3.5 and 4 mini) ModelConfig switches: Llama's block
    (its q/k/v and gate/up matrices fused in the file: ``split_fused``),
    RoPE on half-split pairs (llama.cpp's NEOX) over the first
    ``rope.dimension_count`` dims of each head (Phi-4-mini: 3/4 of them),
    a sliding window on every layer when ``attention.sliding_window`` is
    not 0 (as transformers' Phi3 applies it; llama.cpp ignores it), and
    LongRoPE when the file holds its factors: the short ones divide the
    pairs' frequencies, cos and sin are multiplied by
    ``rope.scaling.attn_factor``, and the context is capped at
    ``rope.scaling.original_context_length``, the last position the short
    factors serve (docs/model.md#phi-3)."""
    rot = m.int("{arch}.rope.dimension_count", default=head_dim)
    if rot > head_dim or rot % 2:
        raise m.fail(f"metadata {m.arch}.rope.dimension_count = {rot}: must be even and <= head_dim = {head_dim}")
    longrope = ROPE_FACTORS_SHORT in gf.tensors or ROPE_FACTORS_LONG in gf.tensors
    switches = dict(
        activation="silu", rope_pairing="half_split", rope_base=m.float("{arch}.rope.freq_base", 10000.0),
        rope_dims=0 if rot == head_dim else rot, rope_freqs=longrope,
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        norm_gain="plain", embed_scale=1.0, qk_norm=False, post_norms=False,
        query_scale=1.0 / math.sqrt(head_dim), extra_eos_ids=[],
        sliding_window=m.int("{arch}.attention.sliding_window", default=0, low=0), sliding_window_pattern=0)
    if longrope:
        for name in (ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG):
            t = gf.tensors.get(name)
            if t is None or t.ggml_type != F32_ID or t.dims != (rot // 2,):
                raise m.fail(f"LongRoPE needs tensors {ROPE_FACTORS_SHORT!r} and {ROPE_FACTORS_LONG!r}, "
                             f"F32 of {rot // 2} values each; {name!r} is "
                             f"{'missing' if t is None else f'{t.type_name} with dims {list(t.dims)}'}")
        switches["rope_attn_factor"] = m.float("{arch}.rope.scaling.attn_factor", 1.0)
        switches["max_seq_len"] = min(m.int("{arch}.context_length"),
                                      m.int("{arch}.rope.scaling.original_context_length"))
    return switches


def _qwen2_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                    head_dim: int) -> dict:
    """Qwen 2 (and 2.5)'s ModelConfig switches: Llama's block with a bias
    added to q, k and v after their projections (``attn_{q,k,v}.bias``; no
    bias on the output projection), RoPE on half-split pairs (llama.cpp's
    NEOX rotation, as for Qwen 3), and Qwen's defaults of RoPE base and eps.
    No RoPE scaling (a ``rope_freqs`` tensor is refused as unexpected)."""
    return {**_llama_switches(gf, m, n_layers, dim, n_heads, head_dim),
            "rope_pairing": "half_split", "qkv_bias": True, "rope_freqs": False,
            "rope_base": m.float("{arch}.rope.freq_base", 1_000_000.0),
            "norm_eps": m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6)}


def _qwen3_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                    head_dim: int) -> dict:
    """Qwen 3's (dense) ModelConfig switches: Llama's block (SiLU gating,
    plain RMSNorm gains, embedding unscaled, no post-norms, no window) with
    an RMSNorm over each head of q and k before RoPE (gains as stored: HF's
    Qwen3RMSNorm is x * w), RoPE on half-split pairs (llama.cpp's NEOX
    rotation: its converter leaves Qwen's q and k rows as HF has them),
    scores scaled by 1/sqrt(head_dim), head_dim from ``attention.key_length``
    (128 in every released size, not dim / n_heads), and its own defaults
    of RoPE base and eps. RoPE must cover the whole head."""
    return {**_llama_switches(gf, m, n_layers, dim, n_heads, head_dim),
            "rope_pairing": "half_split", "qk_norm": True, "rope_freqs": False,
            "rope_base": m.float("{arch}.rope.freq_base", 1_000_000.0),
            "norm_eps": m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6)}


def _check_whole_head_rope(m: _Meta, head_dim: int) -> None:
    """``rope.dimension_count`` (default head_dim) must be head_dim: no partial RoPE."""
    rot = m.int("{arch}.rope.dimension_count", default=head_dim)
    if rot != head_dim:
        raise m.fail(f"metadata {m.arch}.rope.dimension_count = {rot} differs from head_dim = {head_dim}; "
                     f"partial RoPE is not supported")


def _swa_layers(gf: GGUFFile, m: _Meta, arch: str, n_layers: int,
                default: int = GEMMA3_SLIDING_WINDOW_PATTERN) -> dict:
    """Which layers slide, as ModelConfig switches: ``sliding_window_pattern``
    (layer l global when (l+1) % p == 0) from the metadata's int, or the
    architecture's (Gemma 3's 6) when absent; from one bool per layer (True
    = sliding, as Gemma 4's and newer Gemma 3 files store it) the period when
    the flags have one, else the flags themselves (``local_layers``)."""
    key = f"{arch}.attention.sliding_window_pattern"
    f = gf.fields.get(key)
    if f is None:
        return {"sliding_window_pattern": default}
    if f.type != ARRAY:
        return {"sliding_window_pattern": m.int("{arch}.attention.sliding_window_pattern")}
    if f.item_type != BOOL or len(f.value) != n_layers:
        raise m.fail(f"metadata {key}: expected {n_layers} BOOLs, found {len(f.value)} of "
                     f"{VALUE_TYPE_NAMES[f.item_type]}")
    local = [bool(v) for v in f.value]
    for p in range(1, n_layers + 2):
        if local == [(l + 1) % p != 0 for l in range(n_layers)]:
            return {"sliding_window_pattern": p}
    return {"sliding_window_pattern": 0, "local_layers": tuple(local)}


def _check_vocab_metadata(gf: GGUFFile, vocab_size: int) -> None:
    """The tokenizer arrays hold one entry per embedding row; special ids are
    in the vocabulary (docs/errors.md#case-12)."""
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        f = gf.fields.get(key)
        if f is None:
            continue
        if f.type != ARRAY:
            raise ModelFormatError(f"{gf.path}: metadata {key}: type {type_name(f)}, expected an array")
        if len(f.value) != vocab_size:
            raise ModelFormatError(f"{gf.path}: metadata {key}: {len(f.value)} entries, expected "
                                   f"vocab_size = {vocab_size} (rows of token_embd.weight)")
    for key in ("bos", "eos", "eot", "unknown", "padding", "sep", "cls", "mask"):
        full = f"tokenizer.ggml.{key}_token_id"
        f = gf.fields.get(full)
        if f is None:
            continue
        if f.type not in INTEGER_TYPES or not 0 <= f.value < vocab_size:
            raise ModelFormatError(f"{gf.path}: metadata {full} = {f.value!r}, must be an id in "
                                   f"[0, {vocab_size})")


def _token_id(gf: GGUFFile, piece: str) -> int | None:
    """The first id of ``piece`` in the file's vocabulary, or None."""
    tokens = gf.value("tokenizer.ggml.tokens")
    if not isinstance(tokens, StringArray):
        return None
    return tokens.index_of(piece.encode("utf-8"))
