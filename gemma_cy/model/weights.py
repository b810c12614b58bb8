"""Weights: a ModelConfig plus named tensors, as every format loader returns.

Tensor names (shapes use the config's sizes; kv = n_kv_heads*head_dim,
qd = n_heads*head_dim):

    embed_tokens            (vocab_size, dim)
    embed_positions         (max_seq_len, dim)   only when config.position_table
    layers.{l}.q_proj       (qd, dim)
    layers.{l}.k_proj       (kv, dim)
    layers.{l}.v_proj       (kv, dim)
    layers.{l}.o_proj       (dim, qd)
    layers.{l}.gate_proj    (mlp_dim, dim)
    layers.{l}.up_proj      (mlp_dim, dim)
    layers.{l}.down_proj    (dim, mlp_dim)
    layers.{l}.attn_norm    (dim,)
    layers.{l}.ffn_norm     (dim,)
    layers.{l}.q_norm       (head_dim,)          only when config.qk_norm
    layers.{l}.k_norm       (head_dim,)          only when config.qk_norm
    layers.{l}.q_bias       (qd,)                only when config.qkv_bias
    layers.{l}.k_bias       (kv,)                only when config.qkv_bias
    layers.{l}.v_bias       (kv,)                only when config.qkv_bias
    layers.{l}.post_attn_norm (dim,)             only when config.post_norms
    (Gemma 4, docs/model.md#gemma-4: sizes per layer; a layer that reads another's
    cache has no k_proj, v_proj, k_norm; a global layer with attn_k_eq_v no v_proj)
    layers.{l}.ple_gate     (ple, dim)           only when config.per_layer_input_dim (= ple)
    layers.{l}.ple_proj     (dim, ple)
    layers.{l}.ple_post_norm (dim,)
    layers.{l}.layer_scalar (1,)                 only when config.layer_scalars
    layers.{l}.router_proj  (n_experts, dim)     only when config.n_experts (Gemma 4's expert block);
    layers.{l}.router_scale (dim,), .expert_scales (n_experts,), .moe_post_norm_1, .moe_pre_norm_2,
    .moe_post_norm_2 (dim,), .expert{e}_gate_up (2*expert_mlp_dim, dim), .expert{e}_down (dim, expert_mlp_dim)
    embed_per_layer         (vocab_size, n_layers*ple)   only when config.per_layer_input_dim
    per_layer_model_proj    (n_layers*ple, dim)
    per_layer_proj_norm     (ple,)
    layers.{l}.post_ffn_norm  (dim,)             only when config.post_norms
    final_norm              (dim,)
    rope_freqs              (rotary_dims/2,)     only when config.rope_freqs
    lm_head                 (vocab_size, dim)    absent when config.tied_embeddings

Each tensor is one of the quant types, all with ``shape``, ``dequantize()``
and ``row(i)``: ``Int8Tensor`` (GMW1: one scale per tensor), ``Q8_0Tensor``
(GGUF matrices: one f16 scale per 32 values along the input dim) or
``F32Tensor`` (GGUF norm gains). formats/gguf_model.py maps llama.cpp's names
(token_embd, blk.{l}.attn_q, ..., output_norm) to the names above.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ModelConfig
from ..errors import ModelFormatError
from ..quant.tensors import Int8Tensor

LAYER_MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYER_NORMS = ("attn_norm", "ffn_norm")
# Matrices run as f32 products in both activation modes (docs/numerics.md#activation-modes):
# Gemma 4's expert router, f32 in every file (llama.cpp keeps it so too).
F32_PRODUCT_MATRICES = ("router_proj",)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a model with ``config`` needs (sizes per
    layer: ``head_dim_of``, ``n_kv_heads_of``, ``mlp_dim_of``)."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens": (c.vocab_size, c.dim)}
    if c.position_table:
        shapes["embed_positions"] = (c.max_seq_len, c.dim)
    ple = c.per_layer_input_dim
    if ple:
        shapes["embed_per_layer"] = (c.vocab_size, c.n_layers * ple)
        shapes["per_layer_model_proj"] = (c.n_layers * ple, c.dim)
        shapes["per_layer_proj_norm"] = (ple,)
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        hd, mlp = c.head_dim_of(layer), c.mlp_dim_of(layer)
        qd, kvd = c.n_heads * hd, c.n_kv_heads_of(layer) * hd
        own_kv = c.kv_source(layer) == layer
        shapes[p + "q_proj"] = (qd, c.dim)
        if own_kv:
            shapes[p + "k_proj"] = (kvd, c.dim)
            if c.has_v_proj(layer):
                shapes[p + "v_proj"] = (kvd, c.dim)
        shapes[p + "o_proj"] = (c.dim, qd)
        shapes[p + "gate_proj"] = (mlp, c.dim)
        shapes[p + "up_proj"] = (mlp, c.dim)
        shapes[p + "down_proj"] = (c.dim, mlp)
        shapes[p + "attn_norm"] = (c.dim,)
        shapes[p + "ffn_norm"] = (c.dim,)
        if c.qk_norm:
            shapes[p + "q_norm"] = (hd,)
            if own_kv:
                shapes[p + "k_norm"] = (hd,)
        if c.qkv_bias:
            shapes[p + "q_bias"] = (qd,)
            shapes[p + "k_bias"] = (kvd,)
            shapes[p + "v_bias"] = (kvd,)
        if c.post_norms:
            shapes[p + "post_attn_norm"] = (c.dim,)
            shapes[p + "post_ffn_norm"] = (c.dim,)
        if ple:
            shapes[p + "ple_gate"] = (ple, c.dim)
            shapes[p + "ple_proj"] = (c.dim, ple)
            shapes[p + "ple_post_norm"] = (c.dim,)
        if c.layer_scalars:
            shapes[p + "layer_scalar"] = (1,)
        if c.n_experts:
            shapes[p + "router_proj"] = (c.n_experts, c.dim)
            shapes[p + "router_scale"] = (c.dim,)
            shapes[p + "expert_scales"] = (c.n_experts,)
            for name in ("moe_post_norm_1", "moe_pre_norm_2", "moe_post_norm_2"):
                shapes[p + name] = (c.dim,)
            for e in range(c.n_experts):
                shapes[p + f"expert{e}_gate_up"] = (2 * c.expert_mlp_dim, c.dim)
                shapes[p + f"expert{e}_down"] = (c.dim, c.expert_mlp_dim)
    shapes["final_norm"] = (c.dim,)
    if c.rope_freqs:
        shapes["rope_freqs"] = ((c.head_dim_global or c.head_dim) // 2 if c.rope_freqs_global_only
                                else c.rotary_dims // 2,)
    if not c.tied_embeddings:
        shapes["lm_head"] = (c.vocab_size, c.dim)
    return shapes


@dataclass
class Weights:
    """A model's config and its tensors by name (see the module docstring)."""

    config: ModelConfig
    tensors: dict[str, Int8Tensor]
    source: str = ""  # file the tensors were read from (for messages)
    architecture: str = ""  # what the file says it holds: a GGUF's general.architecture, "gmw1", "llama2.c"
    keepalive: list = field(default_factory=list)  # e.g. the mmap behind the views

    def __post_init__(self) -> None:
        expected = expected_shapes(self.config)
        missing = sorted(set(expected) - set(self.tensors))
        if missing:
            raise ModelFormatError(f"{self.source or 'weights'}: missing tensor {missing[0]}")
        for name, shape in expected.items():
            if tuple(self.tensors[name].shape) != shape:
                raise ModelFormatError(
                    f"{self.source or 'weights'}: tensor {name} has shape "
                    f"{tuple(self.tensors[name].shape)}, expected {shape}")
        if self.config.rope_freqs:
            factors = self.tensors["rope_freqs"].dequantize()
            if not (np.all(np.isfinite(factors)) and np.all(factors > 0)):
                raise ModelFormatError(f"{self.source or 'weights'}: tensor rope_freqs holds a value that is "
                                       f"not finite and > 0 (each divides a RoPE frequency)")

    def __getitem__(self, name: str) -> Int8Tensor:
        return self.tensors[name]

    def layer(self, layer: int, name: str) -> Int8Tensor:
        """Tensor ``name`` of layer ``layer`` (e.g. ``layer(0, "q_proj")``)."""
        return self.tensors[f"layers.{layer}.{name}"]

    @property
    def lm_head(self) -> Int8Tensor:
        """The output projection (the embedding itself when tied)."""
        if self.config.tied_embeddings:
            return self.tensors["embed_tokens"]
        return self.tensors["lm_head"]
