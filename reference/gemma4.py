"""Gemma 4's extras to the layers (docs/model.md#gemma-4): the expert block
beside the MLP, and the per-layer inputs (a row per token of a second
embedding, plus a projection of the embedded token) that each layer adds
after its MLP. block (layers.py) calls experts and per_layer_input; the
engine computes per_layer_inputs once per position (model.py).
"""
from __future__ import annotations

import numpy as np

from gemma_cy.model.config import ModelConfig

from .ops import GATE_ACTIVATION_FUNCTIONS, rmsnorm, softmax
from .weights import F32Weights, LayerWeights


def experts(x: np.ndarray, moe: dict, config: ModelConfig) -> np.ndarray:
    """Gemma 4's expert block on the residual x (dim,) -> (dim,), normed.

    Router: softmax of router_proj (rmsnorm(x), no gain, * router_scale /
    sqrt(dim)); the top n_experts_used probabilities (the larger index
    first on a tie... as torch.topk: highest value first), renormalized to
    sum 1, each times its expert's scale. Each chosen expert e runs on
    rmsnorm(x, moe_pre_norm_2): gate and up halves of gate_up_e, down_e of
    act(gate) * up, weighted; only the chosen experts' weights are read.
    The sum is normed with moe_post_norm_2 (docs/model.md#gemma-4)."""
    c = config
    one_plus = c.norm_gain == "one_plus"
    h = rmsnorm(x, np.ones(c.dim, np.float32), c.norm_eps, False) * moe["router_scale"] \
        * np.float32(c.dim ** -0.5)  # (dim,)
    probs = softmax(moe["router_proj"] @ h)  # (n_experts,)
    chosen = np.argsort(-probs, kind="stable")[:c.n_experts_used]  # (k,) highest first, lower index on ties
    weights = probs[chosen] / probs[chosen].sum(dtype=np.float32)  # (k,)
    weights = weights * moe["expert_scales"][chosen]  # (k,)
    xn = rmsnorm(x, moe["moe_pre_norm_2"], c.norm_eps, one_plus)  # (dim,)
    act = GATE_ACTIVATION_FUNCTIONS[c.activation]
    out = np.zeros(c.dim, np.float32)  # (dim,)
    for e, weight in sorted(zip(chosen.tolist(), weights)):  # in expert order, as transformers adds them
        gate_up, down = moe["experts"][e]
        gu = gate_up @ xn  # (2 * emlp,)
        out = out + (down @ (act(gu[:c.expert_mlp_dim]) * gu[c.expert_mlp_dim:])) * weight  # (dim,)
    return rmsnorm(out, moe["moe_post_norm_2"], c.norm_eps, one_plus)


def per_layer_inputs(weights: F32Weights, token: int, x: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Gemma 4's per-layer inputs of one position, (n_layers, ple): from the
    embedded token x (dim,), the projection RMS-normed per layer plus the
    token's row of the per-layer embedding (times sqrt(ple)), both times
    1/sqrt(2) (docs/model.md#gemma-4)."""
    c = config
    ple = c.per_layer_input_dim
    proj = (weights.per_layer_model_proj @ x) * np.float32(c.dim ** -0.5)  # (n_layers*ple,)
    proj = rmsnorm(proj.reshape(c.n_layers, ple), weights.per_layer_proj_norm, c.norm_eps,
                   c.norm_gain == "one_plus")  # (n_layers, ple)
    row = np.asarray(weights.embed_per_layer.row(token), np.float32)  # (n_layers*ple,)
    own = row.reshape(c.n_layers, ple) * np.float32(ple ** 0.5)  # (n_layers, ple)
    return (proj + own) * np.float32(2.0 ** -0.5)  # (n_layers, ple)


def per_layer_input(x: np.ndarray, w: LayerWeights, ple_input: np.ndarray, config: ModelConfig) -> np.ndarray:
    """x + ple_post_norm(ple_proj(act(ple_gate x) * ple_input)): the residual x
    (dim,) after the layer's own input ple_input (ple,), one of per_layer_inputs' rows."""
    c = config
    act = GATE_ACTIVATION_FUNCTIONS[c.activation]
    h = w.ple_proj @ (act(w.ple_gate @ x) * ple_input)  # (dim,)
    return x + rmsnorm(h, w.ple_post_norm, c.norm_eps, c.norm_gain == "one_plus")  # (dim,)
