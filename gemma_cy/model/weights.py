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


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a model with ``config`` needs."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens": (c.vocab_size, c.dim)}
    if c.position_table:
        shapes["embed_positions"] = (c.max_seq_len, c.dim)
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        shapes[p + "q_proj"] = (c.q_dim, c.dim)
        shapes[p + "k_proj"] = (c.kv_dim, c.dim)
        shapes[p + "v_proj"] = (c.kv_dim, c.dim)
        shapes[p + "o_proj"] = (c.dim, c.q_dim)
        shapes[p + "gate_proj"] = (c.mlp_dim, c.dim)
        shapes[p + "up_proj"] = (c.mlp_dim, c.dim)
        shapes[p + "down_proj"] = (c.dim, c.mlp_dim)
        shapes[p + "attn_norm"] = (c.dim,)
        shapes[p + "ffn_norm"] = (c.dim,)
        if c.qk_norm:
            shapes[p + "q_norm"] = (c.head_dim,)
            shapes[p + "k_norm"] = (c.head_dim,)
        if c.qkv_bias:
            shapes[p + "q_bias"] = (c.q_dim,)
            shapes[p + "k_bias"] = (c.kv_dim,)
            shapes[p + "v_bias"] = (c.kv_dim,)
        if c.post_norms:
            shapes[p + "post_attn_norm"] = (c.dim,)
            shapes[p + "post_ffn_norm"] = (c.dim,)
    shapes["final_norm"] = (c.dim,)
    if c.rope_freqs:
        shapes["rope_freqs"] = (c.rotary_dims // 2,)
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
