"""The local error of each op (docs/numerics.md#local-error-not-drift): one
engine's output of an op against another's layer function applied to the
*same* input, so that each op is judged alone, not with the errors the
layers before it passed on. `gemma-cy diff` judges them against the
tolerances; `gemma-cy eval --per_layer` ranks them (which tensor costs most).

    rec = Recorder(); engine.prefill(ids, rec)                 # every op's output
    want = teacher_forced(ReferenceEngine(...), rec.values, ids)  # the judge's ops on those inputs
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class Recorder:
    """An observer that keeps a copy of every value, keyed (layer, op, pos)."""

    def __init__(self):
        self.values: dict[tuple[int, str, int], np.ndarray] = {}
        self.order: list[tuple[int, str]] = []

    def __call__(self, layer: int, op: str, pos: int, value: np.ndarray) -> None:
        if (layer, op) not in self.order:
            self.order.append((layer, op))
        self.values[(layer, op, pos)] = np.array(value, dtype=np.float32, copy=True)


def teacher_forced(reference, got: dict, ids: Sequence[int]) -> dict:
    """(layer, op, pos) -> the reference's layer functions applied to the
    other engine's own inputs of each op (``got``: what it observed while
    running ``ids`` from position 0)."""
    from gemma_cy_reference import gemma4, ops
    from gemma_cy_reference.weights import KVCache
    from gemma_cy_reference import layers as L

    c, w = reference.config, reference.weights
    cache = KVCache(c, len(ids))  # filled with the other engine's keys and values
    one_plus = c.norm_gain == "one_plus"
    want: dict = {}

    def norm(x, gain):
        return ops.rmsnorm(x, gain, c.norm_eps, one_plus)

    for pos, token in enumerate(ids):
        def at(layer, op):
            return got[layer, op, pos]
        want[-1, "embed", pos] = L.embed(w, token, pos, c)
        x = at(-1, "embed")
        # Gemma 4: the per-layer inputs of the other engine's embedding (n_layers, ple)
        ple = gemma4.per_layer_inputs(w, token, x, c) if c.per_layer_input_dim else None
        for layer in range(c.n_layers):
            lw = w.layers[layer]
            want[layer, "attn_norm", pos] = norm(x, lw.attn_norm)
            inner: dict = {}
            L.attention(at(layer, "attn_norm"), lw, layer, pos, cache, c,
                        lambda _l, op, _p, value: inner.__setitem__(op, value))
            for op in ("q", "k", "v", "attn_out"):
                want[layer, op, pos] = inner[op]
            if c.kv_source(layer) == layer:  # (a shared layer observes its source's: cached there)
                nkv, hd = c.n_kv_heads_of(layer), c.head_dim_of(layer)
                cache.key_cache[cache.index[layer], pos, :nkv, :hd] = at(layer, "k")
                cache.value_cache[cache.index[layer], pos, :nkv, :hd] = at(layer, "v")
            attn = lw.o_proj @ at(layer, "attn_out")
            want[layer, "attn", pos] = norm(attn, lw.post_attn_norm) if c.post_norms else attn
            want[layer, "resid_attn", pos] = x + at(layer, "attn")
            want[layer, "ffn_norm", pos] = norm(at(layer, "resid_attn"), lw.ffn_norm)
            m = L.mlp(at(layer, "ffn_norm"), lw, c)
            if lw.moe is not None:  # Gemma 4's expert block, on the other engine's residual
                m = norm(m, lw.moe["moe_post_norm_1"]) + gemma4.experts(at(layer, "resid_attn"), lw.moe, c)
            want[layer, "mlp", pos] = norm(m, lw.post_ffn_norm) if c.post_norms else m
            out = at(layer, "resid_attn") + at(layer, "mlp")
            if ple is not None:  # Gemma 4's per-layer input block, on the other engine's residual
                act = ops.GATE_ACTIVATION_FUNCTIONS[c.activation]
                out = out + norm(lw.ple_proj @ (act(lw.ple_gate @ out) * ple[layer]), lw.ple_post_norm)
            if lw.layer_scalar is not None:
                out = out * lw.layer_scalar[0]
            want[layer, "resid_mlp", pos] = out
            x = at(layer, "resid_mlp")
        head = c.n_layers
        want[head, "final_norm", pos] = L.final_norm(x, w, c)
        if (head, "logits", pos) in got:
            want[head, "logits", pos] = L.logits(at(head, "final_norm"), w, c)
    return want



# The weight tensors behind each observed op of a layer (the op's own error
# comes from them; norms only from their gain vectors).
OP_TENSORS = {"attn_norm": ("attn_norm",), "q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",),
              "attn_out": ("q_proj",), "attn": ("o_proj",), "ffn_norm": ("ffn_norm",),
              "mlp": ("gate_proj", "up_proj", "down_proj")}
OUTPUT_TENSORS = {"embed": ("embed_tokens",), "final_norm": ("final_norm",), "logits": ("lm_head",)}


@dataclass
class OpError:
    """One (layer, op) over the observed positions: the rms of the error,
    the rms of the value (their ratio ranks the ops), the largest error."""

    layer: int
    op: str
    rms_error: float
    rms_value: float
    max_error: float
    positions: int

    @property
    def relative(self) -> float:
        return self.rms_error / self.rms_value if self.rms_value > 0 else float("inf") * (self.rms_error > 0)


def op_errors(observed: dict, judged: dict) -> list[OpError]:
    """Per (layer, op): ``judged`` (the judge's op on the observed inputs)
    against ``observed`` (the engine's own output), over every position
    both hold; largest relative rms error first. Residual adds (exact in
    both engines) are left out."""
    groups: dict = {}
    for key, value in judged.items():
        if key in observed and not key[1].startswith("resid"):
            groups.setdefault(key[:2], []).append((np.asarray(observed[key], np.float64),
                                                   np.asarray(value, np.float64)))
    rows = []
    for (layer, op), pairs in groups.items():
        err = np.concatenate([(a - b).ravel() for a, b in pairs])
        val = np.concatenate([b.ravel() for _, b in pairs])
        rows.append(OpError(layer, op, float(np.sqrt(np.mean(err ** 2))), float(np.sqrt(np.mean(val ** 2))),
                            float(np.max(np.abs(err))) if err.size else 0.0, len(pairs)))
    rows.sort(key=lambda r: -r.relative)
    return rows


def tensors_of(layer: int, op: str, n_layers: int) -> list[str]:
    """The Weights names of the tensors behind one observed op."""
    if layer < 0 or layer >= n_layers:
        return list(OUTPUT_TENSORS.get(op, ()))
    return [f"layers.{layer}.{name}" for name in OP_TENSORS.get(op, ())]


def block_type(tensor) -> str:
    """How a tensor is stored: its GGUF block type, F32, or int8 per tensor (GMW1)."""
    from ..quant.affine import AffineTensor, Q4_KTensor
    from ..quant.ggml import Q4_1Tensor, Q5_0Tensor
    from ..quant.tensors import F32Tensor, Int8Tensor, Q8_0Tensor
    if isinstance(tensor, (AffineTensor, Q4_KTensor, Q4_1Tensor, Q5_0Tensor)):
        return tensor.source
    if isinstance(tensor, Q8_0Tensor):
        return "Q8_0"
    if isinstance(tensor, Int8Tensor):
        return "int8"
    if isinstance(tensor, F32Tensor):
        return "F32"
    return type(tensor).__name__


def per_op_table(observed_engine, judge, ids: Sequence[int], weights, baseline_weights=None) -> list[dict]:
    """Run ``observed_engine`` over ``ids`` from position 0, judge every op
    with ``judge`` (a ReferenceEngine) on the same inputs, and return the
    rows of op_errors with the tensors behind each op and their block types
    in ``weights`` (and in ``baseline_weights``, when another file is the
    baseline), largest relative error first."""
    rec = Recorder()
    observed_engine.reset()
    observed_engine.prefill(ids, rec)
    rows = op_errors(rec.values, teacher_forced(judge, rec.values, ids))
    n_layers = weights.config.n_layers
    out = []
    for r in rows:
        names = [n for n in tensors_of(r.layer, r.op, n_layers) if n in weights.tensors]
        out.append({"layer": r.layer, "op": r.op, "relative_rms": r.relative, "rms_error": r.rms_error,
                    "max_error": r.max_error, "positions": r.positions,
                    "tensors": [f"{n} ({block_type(weights.tensors[n])}"
                                + (f"; baseline {block_type(baseline_weights.tensors[n])})"
                                   if baseline_weights is not None and n in baseline_weights.tensors else ")")
                                for n in names]})
    return out
