"""ModelConfig: the single source of truth for sizes and architecture switches.

Every file format maps into one ``ModelConfig``; both engines read only it.
A new model family is new values here, never a subclass or an
``if family ==`` in an engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ModelFormatError

GATE_ACTIVATIONS = ("silu", "gelu_tanh")  # the gated MLP's activation (ModelConfig.activation)
ROPE_PAIRINGS = ("interleaved", "half_split")
NORM_GAINS = ("plain", "one_plus")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and switches of a decoder-only transformer.

    Defaults are the seed engine's (GMW1, docs/model.md#the-seed-model-gmw1); Gemma 3 sets the
    switches (docs/model.md#gemma-3).
    """

    # sizes
    n_layers: int
    dim: int  # hidden size (residual stream width)
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA: n_heads % n_kv_heads == 0)
    head_dim: int  # per head; n_heads*head_dim may differ from dim (Gemma 3)
    mlp_dim: int  # hidden width of the gated MLP
    vocab_size: int
    max_seq_len: int  # context the model supports (rows of the position table)

    # architecture switches
    activation: str = "silu"  # gate activation: "silu" | "gelu_tanh"
    rope_pairing: str = "interleaved"  # (2j, 2j+1) | (j, j + head_dim/2)
    rope_base: float = 10000.0  # global-attention layers
    rope_base_local: float | None = None  # sliding-window layers; None = rope_base
    norm_eps: float = 1e-6
    norm_gain: str = "plain"  # "plain": x*g | "one_plus": x*(1+g)
    position_table: bool = True  # learned absolute position rows added to the embedding
    embed_scale: float = 1.0  # embedding multiplier (Gemma: sqrt(dim) as f32)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE
    qkv_bias: bool = False  # Qwen 2: a bias added to q, k and v after their projections
    rope_freqs: bool = False  # Llama 3: the "rope_freqs" tensor divides pair j's frequency, every layer
    rope_dims: int = 0  # dims of each head RoPE rotates (the first ones); 0 = all (Phi-4-mini: 3/4)
    rope_attn_factor: float = 1.0  # LongRoPE: cos and sin multiplied by it
    rope_freqs_global_only: bool = False  # Gemma 4: rope_freqs divide the global layers' frequencies only
    rope_scale_global: float = 1.0  # Gemma 3 4B-27B: linear RoPE scaling, the global layers' frequencies / this
    # Gemma 4 (docs/model.md#gemma-4): layers that differ from each other
    head_dim_global: int = 0  # head_dim of the global (full-attention) layers; 0 = head_dim
    n_kv_heads_global: int = 0  # key/value heads of the global layers; 0 = n_kv_heads
    mlp_dims: tuple[int, ...] = ()  # each layer's MLP width; () = mlp_dim everywhere
    kv_shared_layers: int = 0  # the last N layers attend over the cache of the last earlier layer of their kind
    attn_k_eq_v: bool = False  # global layers have no v_proj: v is k's projection (before k-norm and RoPE)
    v_norm: bool = False  # v RMS-normalized over head_dim, without a gain
    layer_scalars: bool = False  # each layer's output times its "layer_scalar" (1,)
    per_layer_input_dim: int = 0  # Gemma 4's per-layer inputs: a second embedding gated into every layer
    n_experts: int = 0  # Gemma 4 26B-A4B: experts beside every layer's MLP; 0 = none
    n_experts_used: int = 0  # experts each position runs (top-k of the router)
    expert_mlp_dim: int = 0  # each expert's MLP width
    post_norms: bool = False  # sandwich norms after attention and MLP
    query_scale: float | None = None  # scores *= this; None = 1/sqrt(head_dim)
    sliding_window: int = 0  # local layers attend to the last N positions; 0 = off
    sliding_window_pattern: int = 0  # layer l is global when (l+1) % pattern == 0
    local_layers: tuple[bool, ...] = ()  # one flag per layer (True: sliding window), over the pattern; () = the pattern
    attn_softcap: float = 0.0  # Gemma 2: tanh soft-cap of scores; 0 = off
    final_softcap: float = 0.0  # Gemma 2: tanh soft-cap of logits; 0 = off
    tied_embeddings: bool = False  # lm_head is embed_tokens
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.validate()

    # derived sizes
    @property
    def q_dim(self) -> int:
        """Width of all query heads together: n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def scores_scale(self) -> float:
        """Multiplier of q.k before softmax."""
        if self.query_scale is not None:
            return self.query_scale
        return 1.0 / math.sqrt(self.head_dim)

    def head_dim_of(self, layer: int) -> int:
        """head_dim of ``layer``: head_dim_global on a global layer when set."""
        return self.head_dim_global if self.head_dim_global and not self.is_local(layer) else self.head_dim

    def n_kv_heads_of(self, layer: int) -> int:
        """Key/value heads of ``layer``: n_kv_heads_global on a global layer when set."""
        return self.n_kv_heads_global if self.n_kv_heads_global and not self.is_local(layer) else self.n_kv_heads

    def mlp_dim_of(self, layer: int) -> int:
        """The MLP width of ``layer``."""
        return self.mlp_dims[layer] if self.mlp_dims else self.mlp_dim

    def has_v_proj(self, layer: int) -> bool:
        """False on a global layer of a model whose v is k's projection (attn_k_eq_v)."""
        return not (self.attn_k_eq_v and not self.is_local(layer))

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values ``layer`` attends over: itself, or
        for one of the last kv_shared_layers layers the last layer before
        them of the same kind (local or global)."""
        first_shared = self.n_layers - self.kv_shared_layers
        if layer < first_shared:
            return layer
        local = self.is_local(layer)
        return max(l for l in range(first_shared) if self.is_local(l) == local)

    @property
    def rotary_dims(self) -> int:
        """Dims of each head RoPE rotates: rope_dims, or head_dim when 0."""
        return self.rope_dims or self.head_dim

    def is_local(self, layer: int) -> bool:
        """True when ``layer`` uses sliding-window attention: its flag in
        local_layers when they are given, else by the period."""
        if self.sliding_window <= 0:
            return False
        if self.local_layers:
            return self.local_layers[layer]
        if self.sliding_window_pattern <= 0:
            return True
        return (layer + 1) % self.sliding_window_pattern != 0

    def rope_divisors(self, rope_freqs: np.ndarray | None, local: bool) -> np.ndarray | None:
        """The divisors of each RoPE pair's frequency on a local or a global
        layer, f32 (pairs,), or None for none: the file's ``rope_freqs``
        (every layer's, or the global layers' only with
        rope_freqs_global_only), times rope_scale_global on a global layer
        (Gemma 3's linear scaling, docs/model.md#gemma-3)."""
        factors = None if local and self.rope_freqs_global_only else rope_freqs
        if local or self.rope_scale_global == 1.0:
            return factors
        pairs = (self.rope_dims or self.head_dim_global or self.head_dim) // 2
        ones = np.ones(pairs, np.float32) if factors is None else np.asarray(factors, np.float32)
        return ones * np.float32(self.rope_scale_global)

    def window(self, layer: int) -> int:
        """How many past positions (itself included) ``layer`` attends to; 0 = all."""
        return self.sliding_window if self.is_local(layer) else 0

    def rope_base_for(self, layer: int) -> float:
        """RoPE base of ``layer`` (local layers may use a different base)."""
        if self.is_local(layer) and self.rope_base_local is not None:
            return self.rope_base_local
        return self.rope_base

    def with_changes(self, **changes) -> "ModelConfig":
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)

    def validate(self) -> None:
        """Raise ModelFormatError naming the first field that breaks a rule."""
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim",
                     "mlp_dim", "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelFormatError(f"config: {name} = {value!r}, must be an integer > 0")
        if self.n_heads % self.n_kv_heads != 0:
            raise ModelFormatError(
                f"config: n_heads = {self.n_heads} is not a multiple of n_kv_heads = {self.n_kv_heads}")
        if self.head_dim % 2 != 0:
            raise ModelFormatError(f"config: head_dim = {self.head_dim}, must be even (RoPE pairs)")
        if (not isinstance(self.rope_dims, int) or isinstance(self.rope_dims, bool) or self.rope_dims < 0
                or self.rope_dims % 2 or self.rope_dims > self.head_dim):
            raise ModelFormatError(f"config: rope_dims = {self.rope_dims!r}, must be even and in [0, head_dim = "
                                   f"{self.head_dim}] (0 = the whole head)")
        for name in ("head_dim_global", "n_kv_heads_global", "kv_shared_layers", "per_layer_input_dim", "n_experts",
                     "n_experts_used", "expert_mlp_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ModelFormatError(f"config: {name} = {value!r}, must be an integer >= 0 (0 = off)")
        if self.n_experts and not (0 < self.n_experts_used <= self.n_experts and self.expert_mlp_dim > 0):
            raise ModelFormatError(f"config: {self.n_experts} experts need n_experts_used in [1, {self.n_experts}] "
                                   f"and expert_mlp_dim > 0; found {self.n_experts_used}, {self.expert_mlp_dim}")
        if self.head_dim_global % 2 or (self.n_kv_heads_global and self.n_heads % self.n_kv_heads_global):
            raise ModelFormatError(f"config: head_dim_global = {self.head_dim_global} must be even and "
                                   f"n_kv_heads_global = {self.n_kv_heads_global} divide n_heads = {self.n_heads}")
        if self.mlp_dims and (len(self.mlp_dims) != self.n_layers or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.mlp_dims)):
            raise ModelFormatError(f"config: mlp_dims = {self.mlp_dims!r}, must be {self.n_layers} integers > 0")
        if self.kv_shared_layers:
            first_shared = self.n_layers - self.kv_shared_layers
            kinds = {self.is_local(l) for l in range(max(first_shared, 0))}
            if first_shared < 1 or any(self.is_local(l) not in kinds for l in range(first_shared, self.n_layers)):
                raise ModelFormatError(f"config: kv_shared_layers = {self.kv_shared_layers}: every shared layer needs "
                                       f"an earlier layer of its kind (local or global) among the first "
                                       f"{max(first_shared, 0)}")
        if self.activation not in GATE_ACTIVATIONS:
            raise ModelFormatError(f"config: activation = {self.activation!r}, expected one of {GATE_ACTIVATIONS}")
        if self.rope_pairing not in ROPE_PAIRINGS:
            raise ModelFormatError(f"config: rope_pairing = {self.rope_pairing!r}, expected one of {ROPE_PAIRINGS}")
        if self.norm_gain not in NORM_GAINS:
            raise ModelFormatError(f"config: norm_gain = {self.norm_gain!r}, expected one of {NORM_GAINS}")
        if self.local_layers and (len(self.local_layers) != self.n_layers
                                  or not all(type(v) is bool for v in self.local_layers)):
            raise ModelFormatError(f"config: local_layers must be {self.n_layers} bools (one per layer) or ()")
        for name in ("rope_base", "norm_eps", "embed_scale", "rope_attn_factor", "rope_scale_global"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ModelFormatError(f"config: {name} = {value!r}, must be finite and > 0")
        if self.rope_base_local is not None and not (
                math.isfinite(self.rope_base_local) and self.rope_base_local > 0):
            raise ModelFormatError(f"config: rope_base_local = {self.rope_base_local!r}, must be finite and > 0")
        if self.query_scale is not None and not (math.isfinite(self.query_scale) and self.query_scale > 0):
            raise ModelFormatError(f"config: query_scale = {self.query_scale!r}, must be finite and > 0")
        for name in ("attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ModelFormatError(f"config: {name} = {value!r}, must be finite and >= 0 (0 = off)")
        if self.sliding_window < 0 or self.sliding_window_pattern < 0:
            raise ModelFormatError("config: sliding_window and sliding_window_pattern must be >= 0")
        special = ([self.bos_id] if self.bos_id is not None else []) + list(self.eos_ids)
        for tok in special:
            if not (0 <= tok < self.vocab_size):
                raise ModelFormatError(
                    f"config: special token id {tok} outside the vocabulary [0, {self.vocab_size})")
