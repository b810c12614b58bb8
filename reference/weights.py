"""The reference's weights and KV cache: every tensor of a
gemma_cy.model.weights.Weights dequantized once to f32 (docs/numerics.md#the-reference),
or in the q8 mode its matrices as Q8Matrix (q8.py), and the keys and values
the layers cache (layers.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemma_cy.model.checks import check_activation_mode
from gemma_cy.model.config import ModelConfig
from gemma_cy.model.weights import Weights

from .q8 import Q8Matrix


@dataclass(frozen=True)
class LayerWeights:
    """One transformer layer's tensors as f32 (see gemma_cy.model.weights); in the
    q8 mode the seven matrices are Q8Matrix."""

    q_proj: np.ndarray  # (qd, dim)
    k_proj: np.ndarray  # (kvd, dim)
    v_proj: np.ndarray  # (kvd, dim)
    o_proj: np.ndarray  # (dim, qd)
    gate_proj: np.ndarray  # (mlp, dim)
    up_proj: np.ndarray  # (mlp, dim)
    down_proj: np.ndarray  # (dim, mlp)
    attn_norm: np.ndarray  # (dim,)
    ffn_norm: np.ndarray  # (dim,)
    q_norm: np.ndarray | None  # (hd,) when config.qk_norm
    k_norm: np.ndarray | None  # (hd,) when config.qk_norm
    post_attn_norm: np.ndarray | None  # (dim,) when config.post_norms
    post_ffn_norm: np.ndarray | None  # (dim,) when config.post_norms
    q_bias: np.ndarray | None = None  # (qd,) when config.qkv_bias
    k_bias: np.ndarray | None = None  # (kvd,) when config.qkv_bias
    v_bias: np.ndarray | None = None  # (kvd,) when config.qkv_bias
    rope_freqs: np.ndarray | None = None  # (rotary_dims/2,) when config.rope_freqs applies to this layer
    ple_gate: np.ndarray | None = None  # (ple, dim) when config.per_layer_input_dim (Gemma 4)
    ple_proj: np.ndarray | None = None  # (dim, ple)
    ple_post_norm: np.ndarray | None = None  # (dim,)
    layer_scalar: np.ndarray | None = None  # (1,) when config.layer_scalars
    moe: dict | None = None  # Gemma 4's expert block: router_proj, router_scale, expert_scales, the three norms,
    # experts: a list of (gate_up (2*emlp, dim), down (dim, emlp)) per expert


@dataclass(frozen=True)
class F32Weights:
    """The whole model's tensors as f32: what the reference computes with."""

    embed_tokens: np.ndarray  # (vocab, dim)
    embed_positions: np.ndarray | None  # (max_seq_len, dim) when config.position_table
    layers: tuple[LayerWeights, ...]  # n_layers
    final_norm: np.ndarray  # (dim,)
    lm_head: np.ndarray  # (vocab, dim); the same array as embed_tokens when tied
    embed_per_layer: object = None  # (vocab, n_layers*ple) when config.per_layer_input_dim: the tensor, rows read per token
    per_layer_model_proj: np.ndarray | None = None  # (n_layers*ple, dim)
    per_layer_proj_norm: np.ndarray | None = None  # (ple,)

    @classmethod
    def from_weights(cls, weights: Weights, activations: str = "f32") -> "F32Weights":
        """Dequantize every tensor of ``weights`` (q * scale, docs/formats.md#int8-per-tensor-quantization) once.
        activations "q8": the matrices become Q8Matrix (int8 inputs) instead;
        the embedding rows and norm gains stay f32. ParameterError for a mode
        the model cannot run (gemma_cy.model.checks.check_activation_mode)."""
        c = weights.config
        check_activation_mode(activations, c, weights.tensors)

        def deq(name: str) -> np.ndarray:
            return weights[name].dequantize()

        def matrix(name: str):
            return Q8Matrix(weights[name]) if activations == "q8" else deq(name)

        def optional(name: str, present: bool) -> np.ndarray | None:
            return deq(name) if present else None

        def optional_matrix(name: str):
            return matrix(name) if name in weights.tensors else None

        rope_freqs = optional("rope_freqs", c.rope_freqs)  # (hd/2,), every layer's (global ones' in Gemma 4)
        ple = c.per_layer_input_dim > 0
        layers = []
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            own_kv = c.kv_source(layer) == layer
            layers.append(LayerWeights(
                q_proj=matrix(p + "q_proj"), k_proj=optional_matrix(p + "k_proj"),
                v_proj=optional_matrix(p + "v_proj"),
                o_proj=matrix(p + "o_proj"), gate_proj=matrix(p + "gate_proj"),
                up_proj=matrix(p + "up_proj"), down_proj=matrix(p + "down_proj"),
                attn_norm=deq(p + "attn_norm"), ffn_norm=deq(p + "ffn_norm"),
                q_norm=optional(p + "q_norm", c.qk_norm), k_norm=optional(p + "k_norm", c.qk_norm and own_kv),
                post_attn_norm=optional(p + "post_attn_norm", c.post_norms),
                post_ffn_norm=optional(p + "post_ffn_norm", c.post_norms),
                q_bias=optional(p + "q_bias", c.qkv_bias), k_bias=optional(p + "k_bias", c.qkv_bias),
                v_bias=optional(p + "v_bias", c.qkv_bias),
                rope_freqs=c.rope_divisors(rope_freqs, c.is_local(layer)),
                ple_gate=optional_matrix(p + "ple_gate"), ple_proj=optional_matrix(p + "ple_proj"),
                ple_post_norm=optional(p + "ple_post_norm", ple),
                layer_scalar=optional(p + "layer_scalar", c.layer_scalars),
                moe=None if not c.n_experts else {
                    "router_proj": deq(p + "router_proj"), "router_scale": deq(p + "router_scale"),
                    "expert_scales": deq(p + "expert_scales"),
                    **{n: deq(p + n) for n in ("moe_post_norm_1", "moe_pre_norm_2", "moe_post_norm_2")},
                    "experts": [(matrix(p + f"expert{e}_gate_up"), matrix(p + f"expert{e}_down"))
                                for e in range(c.n_experts)]}))
        embed_tokens = deq("embed_tokens")
        if activations == "q8":
            lm_head = Q8Matrix(weights.lm_head)
        else:  # tied: one array, not a second dequantized copy of the embedding
            lm_head = embed_tokens if c.tied_embeddings else deq("lm_head")
        return cls(
            embed_tokens=embed_tokens,
            embed_positions=optional("embed_positions", c.position_table),
            layers=tuple(layers),
            final_norm=deq("final_norm"),
            lm_head=lm_head,
            embed_per_layer=weights["embed_per_layer"] if ple else None,
            per_layer_model_proj=optional_matrix("per_layer_model_proj"),
            per_layer_proj_norm=optional("per_layer_proj_norm", ple))


class KVCache:
    """Rotated keys and raw values of every layer and position so far
    (``key_cache``, ``value_cache``: llama2.c's names, as in the fast
    engine's FastModel)."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        # layers of other sizes (Gemma 4) use [:, :their nkv, :their hd] of the widest
        c = config
        n_kv = max(c.n_kv_heads_of(layer) for layer in range(c.n_layers))
        hd = max(c.head_dim_of(layer) for layer in range(c.n_layers))
        # Gemma 4's shared layers hold none of their own: index[layer] is the row
        # of the layer whose keys and values it reads (layer l itself elsewhere)
        own = sorted({c.kv_source(layer) for layer in range(c.n_layers)})
        self.index = [own.index(c.kv_source(layer)) for layer in range(c.n_layers)]
        shape = (len(own), max_len, n_kv, hd)
        self.max_len = max_len
        self.key_cache = np.zeros(shape, dtype=np.float32)  # (layers with a cache, max_len, nkv, hd)
        self.value_cache = np.zeros(shape, dtype=np.float32)  # (layers with a cache, max_len, nkv, hd)
