"""GGUF files as models (Gemma 1, 2 and 3, Llama, Phi-3, Qwen 2 and 3): metadata -> ``ModelConfig``
(``gguf_config``, from gemma_cy.formats.gguf_config), llama.cpp tensor names -> ``Weights`` names, the checks a
model's tensor set must pass, and ``read_gguf`` / ``read_gguf_f32``
(docs/formats.md#architectures). ``read_gguf`` keeps every weight the file
holds: Q8_0 matrices as views of the map, the other integer block types laid
out once at load, exactly (docs/numerics.md#weights-as-stored)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

import numpy as np

from ..errors import ModelFormatError
from ..model.config import ModelConfig
from ..model.weights import Weights, expected_shapes
from ..quant.affine import AFFINE_TYPES, DECOMPOSERS, AffineTensor, Q4_KTensor
from ..quant.types import GGML_TYPE_IDS
from ..quant.ggml import BF16, F16, Q4_1, Q5_0, Q4_1Tensor, Q5_0Tensor, dequantize, is_exact_in_q8_0, to_q8_0
from ..quant.tensors import Q8_0_BLOCK, Q8_0_BYTES, F32Tensor, Q8_0Tensor
from .mapped import release_pages
from .gguf_config import ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT, gguf_config
from .gguf_reader import F32_ID, Q8_0_ID, GGUFFile, close_quietly, parse_gguf

# llama.cpp tensor names -> Weights names (gemma_cy.model.weights); per layer
# "blk.{l}.<key>.weight" -> "layers.{l}.<value>"
GLOBAL_TENSOR_NAMES = {"token_embd.weight": "embed_tokens", "output_norm.weight": "final_norm",
                       "output.weight": "lm_head", "rope_freqs.weight": "rope_freqs",
                       "per_layer_token_embd.weight": "embed_per_layer",  # Gemma 4's per-layer inputs
                       "per_layer_model_proj.weight": "per_layer_model_proj",
                       "per_layer_proj_norm.weight": "per_layer_proj_norm"}
LAYER_TENSOR_NAMES = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
    "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm",
    "post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_ffn_norm",
    "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
    "inp_gate": "ple_gate", "proj": "ple_proj", "post_norm": "ple_post_norm",  # Gemma 4
    "layer_output_scale": "layer_scalar",
    "ffn_gate_inp": "router_proj", "post_ffw_norm_1": "moe_post_norm_1",  # Gemma 4's expert block
    "pre_ffw_norm_2": "moe_pre_norm_2", "post_ffw_norm_2": "moe_post_norm_2",
}
LAYER_BIAS_NAMES = {"attn_q": "q_bias", "attn_k": "k_bias", "attn_v": "v_bias"}  # "blk.{l}.<key>.bias"
LAYER_SCALE_NAMES = {"ffn_gate_inp": "router_scale", "ffn_down_exps": "expert_scales"}  # "blk.{l}.<key>.scale"
# Gemma 4's experts: "blk.{l}.<key>.weight" (n_experts, rows, cols) is read as one matrix per
# expert, "<name>[<e>]" -> "layers.{l}.expert{e}_<part>" (split_experts).
EXPERT_PARTS = {"ffn_gate_up_exps": "gate_up", "ffn_down_exps": "down"}
_EXPERT = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)\.weight\[(0|[1-9][0-9]*)\]")
# Phi-3's fused matrices (docs/model.md#phi-3): "blk.{l}.<key>.weight" holds
# these parts' rows one after the other; each part is read as "<name>[<part>]".
FUSED_PARTS = {"attn_qkv": ("q_proj", "k_proj", "v_proj"), "ffn_up": ("gate_proj", "up_proj")}
_PART = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)\.weight\[([a-z_]+)\]")
_LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z][a-z_0-9]*)\.(weight|bias|scale)")
_KIND_NAMES = {"weight": LAYER_TENSOR_NAMES, "bias": LAYER_BIAS_NAMES, "scale": LAYER_SCALE_NAMES}

def tensor_name(gguf_name: str, n_layers: int) -> str | None:
    """The Weights name of a llama.cpp tensor name, or None if it has none."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    if gguf_name == ROPE_FACTORS_SHORT:
        return "rope_freqs"
    part = _PART.fullmatch(gguf_name)
    if part and int(part.group(1)) < n_layers and part.group(3) in FUSED_PARTS.get(part.group(2), ()):
        return f"layers.{part.group(1)}.{part.group(3)}"
    expert = _EXPERT.fullmatch(gguf_name)
    if expert and int(expert.group(1)) < n_layers and expert.group(2) in EXPERT_PARTS:
        return f"layers.{expert.group(1)}.expert{expert.group(3)}_{EXPERT_PARTS[expert.group(2)]}"
    m = _LAYER_NAME.fullmatch(gguf_name)
    names = _KIND_NAMES[m.group(3)] if m else {}
    if m and int(m.group(1)) < n_layers and m.group(2) in names:
        return f"layers.{m.group(1)}.{names[m.group(2)]}"
    return None


def gguf_tensor_name(weights_name: str) -> str:
    """The llama.cpp name of a Weights tensor name (inverse of ``tensor_name``)."""
    for g, w in GLOBAL_TENSOR_NAMES.items():
        if w == weights_name:
            return g
    _, layer, short = weights_name.split(".")
    expert = re.fullmatch(r"expert[0-9]+_([a-z_]+)", short)
    if expert:  # the file's name of the 3-D tensor that holds it
        return f"blk.{layer}.{next(k for k, v in EXPERT_PARTS.items() if v == expert.group(1))}.weight"
    for kind, names in _KIND_NAMES.items():
        key = next((k for k, v in names.items() if v == short), None)
        if key is not None:
            return f"blk.{layer}.{key}.{kind}"
    raise KeyError(weights_name)


def split_fused(gf: GGUFFile, config: ModelConfig) -> None:
    """Phi-3's fused matrices as their parts: ``blk.{l}.attn_qkv.weight``
    (q_dim + 2 kv_dim rows) becomes ``...[q_proj]``, ``[k_proj]``,
    ``[v_proj]`` and ``blk.{l}.ffn_up.weight`` (2 mlp_dim rows: gate, then
    up) ``[gate_proj]``, ``[up_proj]``, each a run of whole rows of the
    file (so every block type reads as is), entered in ``gf.tensors`` in
    place of the whole; LongRoPE's long factors leave it (checked by
    ``_phi3_switches``). A fused matrix of the wrong shape is refused by
    name."""
    c = config
    rows = {"q_proj": c.q_dim, "k_proj": c.kv_dim, "v_proj": c.kv_dim, "gate_proj": c.mlp_dim, "up_proj": c.mlp_dim}
    gf.tensors.pop(ROPE_FACTORS_LONG, None)
    for name in list(gf.tensors):
        m = _LAYER_NAME.fullmatch(name)
        if not (m and m.group(3) == "weight" and m.group(2) in FUSED_PARTS):
            continue
        t = gf.tensors[name]
        parts = FUSED_PARTS[m.group(2)]
        want = (sum(rows[p] for p in parts), c.dim)
        if t.shape != want:
            raise ModelFormatError(f"{gf.path}: tensor {name!r} has dims {list(t.dims)} (shape {t.shape}), expected "
                                   f"shape {want}: the fused {', '.join(parts)} rows")
        row_bytes = t.nbytes // t.shape[0]
        first = 0
        del gf.tensors[name]
        for p in parts:
            gf.tensors[f"{name}[{p}]"] = replace(t, name=f"{name}[{p}]", dims=(c.dim, rows[p]),
                                                 offset=t.offset + first * row_bytes, nbytes=rows[p] * row_bytes)
            first += rows[p]


def split_experts(gf: GGUFFile, config: ModelConfig) -> None:
    """Gemma 4's expert tensors as one matrix per expert:
    ``blk.{l}.ffn_gate_up_exps.weight`` (n_experts, 2 expert_mlp_dim, dim)
    becomes ``...[0]`` .. ``[n_experts-1]``, and ``ffn_down_exps.weight``
    (n_experts, dim, expert_mlp_dim) the same, each a run of whole rows of
    the file (every block type reads as is; only the experts a position
    chooses are read), entered in ``gf.tensors`` in place of the whole. A
    tensor of the wrong shape is refused by name."""
    c = config
    want = {"ffn_gate_up_exps": (c.n_experts, 2 * c.expert_mlp_dim, c.dim),
            "ffn_down_exps": (c.n_experts, c.dim, c.expert_mlp_dim)}
    for name in list(gf.tensors):
        m = _LAYER_NAME.fullmatch(name)
        if not (m and m.group(3) == "weight" and m.group(2) in EXPERT_PARTS):
            continue
        t = gf.tensors[name]
        if t.shape != want[m.group(2)]:
            raise ModelFormatError(f"{gf.path}: tensor {name!r} has dims {list(t.dims)} (shape {t.shape}), expected "
                                   f"shape {want[m.group(2)]}: one matrix per expert")
        rows, cols = t.shape[1], t.shape[2]
        size = t.nbytes // c.n_experts
        del gf.tensors[name]
        for e in range(c.n_experts):
            gf.tensors[f"{name}[{e}]"] = replace(t, name=f"{name}[{e}]", dims=(cols, rows),
                                                 offset=t.offset + e * size, nbytes=size)


def check_model_tensors(gf: GGUFFile, config: ModelConfig) -> dict[str, str]:
    """Check that ``gf`` holds exactly the tensors ``config`` needs, with the
    right shapes: returns GGUF name -> Weights name. Raises ModelFormatError
    naming the first tensor that breaks a rule. (Which types a reader
    accepts is the reader's rule: ``read_gguf``, ``read_gguf_f32``.)"""
    shapes = expected_shapes(config)
    names: dict[str, str] = {}
    for g, t in gf.tensors.items():
        w = tensor_name(g, config.n_layers)
        if w is None or w not in shapes:
            raise ModelFormatError(f"{gf.path}: unexpected tensor {g!r} (not part of a "
                                   f"{gf.value('general.architecture')} model with {config.n_layers} layers)")
        if t.shape != shapes[w]:
            raise ModelFormatError(
                f"{gf.path}: tensor {g!r} has dims {list(t.dims)} (shape {t.shape}), expected shape "
                f"{shapes[w]} from the metadata")
        if w in names.values():
            first = next(k for k, v in names.items() if v == w)
            raise ModelFormatError(f"{gf.path}: tensors {first!r} and {g!r} are both the model's {w}")
        names[g] = w
    missing = sorted(set(shapes) - set(names.values()))
    if missing:
        raise ModelFormatError(f"{gf.path}: missing tensor {_file_name(gf, missing[0])!r}")
    return names


def check_model_file(gf: GGUFFile) -> ModelConfig:
    """The file's ModelConfig, its tensor set checked as ``_read_model``
    checks it (a Phi-3 file's fused matrices split on a copy of the tensor
    table; ``gf`` is left as it is): for tools that copy the file's tensors
    as they are (``gemma_cy.commands.convert``)."""
    config = gguf_config(gf)
    view = replace(gf, tensors=dict(gf.tensors))
    if gf.value("general.architecture") == "phi3":
        split_fused(view, config)
    if config.n_experts:
        split_experts(view, config)
    check_model_tensors(view, config)
    return config


def _file_name(gf: GGUFFile, weights_name: str) -> str:
    """The file's name of a Weights tensor: the fused matrix that holds it in
    a Phi-3 file (``split_fused``), else llama.cpp's name."""
    if gf.value("general.architecture") == "phi3":
        if weights_name == "rope_freqs":
            return ROPE_FACTORS_SHORT
        _, layer, short = weights_name.split(".") if weights_name.startswith("layers.") else ("", "", "")
        key = next((k for k, parts in FUSED_PARTS.items() if short in parts), None)
        if key is not None:
            return f"blk.{layer}.{key}.weight"
    return gguf_tensor_name(weights_name)


def _read_model(path, tensor: Callable[[GGUFFile, str], object], keep_map: bool) -> Weights:
    """The steps both readers share: parse the file, its ModelConfig, the
    checked tensor set, then ``tensor(gf, gguf_name)`` for every tensor. With
    ``keep_map`` the tensors are views of the map and the Weights keep it
    alive; otherwise the map is closed before returning. On any error the map
    is closed and the error raised. ``path`` may be a GGUFFile already parsed."""
    gf = path if isinstance(path, GGUFFile) else parse_gguf(path)
    try:
        config = gguf_config(gf)
        if gf.value("general.architecture") == "phi3":
            split_fused(gf, config)
        if config.n_experts:
            split_experts(gf, config)
        tensors = {w: tensor(gf, g) for g, w in check_model_tensors(gf, config).items()}
        weights = Weights(config=config, tensors=tensors, source=gf.path, keepalive=[gf.mm] if keep_map else [],
                          architecture=str(gf.value("general.architecture")))
    except BaseException:
        close_quietly(gf.mm)
        raise
    if not keep_map:
        close_quietly(gf.mm)
    return weights


def _mapped_tensor(gf: GGUFFile, g: str) -> F32Tensor | Q8_0Tensor | Q5_0Tensor | AffineTensor | Q4_KTensor \
        | Q4_1Tensor:
    """Tensor ``g`` as the engines run it, every weight the file's value
    (docs/numerics.md#weights-as-stored): an F32 vector or a Q8_0 matrix as a
    zero-copy, read-only view of the map (an F32 matrix too; an F16 or BF16
    one widened to f32 at load, exactly); a Q5_0 matrix as a Q5_0Tensor (a
    view of the map too); a Q4_0 matrix as Q8_0 blocks (the same f16 scale
    and integer levels, laid out once at load);
    a Q4_K matrix as a Q4_KTensor (its blocks a view of the map, each
    sub-block's scale and offset worked out once); a Q4_1 matrix as a
    Q4_1Tensor (a view of the map); a matrix of another
    integer block type as an AffineTensor (levels, scale and offset per
    sub-block, laid out once at load). Any other type or rank is refused,
    naming the tensor and its type."""
    t = gf.tensors[g]
    if len(t.dims) == 1 and t.ggml_type == F32_ID:
        return F32Tensor(np.frombuffer(gf.mm, dtype=np.float32, count=t.dims[0], offset=t.offset))
    if len(t.dims) == 2 and t.ggml_type == Q8_0_ID:
        return Q8_0Tensor(gf.raw(g).reshape(t.dims[1], t.dims[0] // Q8_0_BLOCK, Q8_0_BYTES))
    if len(t.dims) == 2 and t.ggml_type == F32_ID:
        return F32Tensor(np.frombuffer(gf.mm, dtype=np.float32, count=t.dims[0] * t.dims[1],
                                       offset=t.offset).reshape(t.shape))
    try:
        if len(t.dims) == 2 and t.ggml_type in (F16, BF16):  # widened to f32: every value exact
            return _laid_out(gf, t, F32Tensor(np.ascontiguousarray(dequantize(gf.raw(g), t.ggml_type, t.shape),
                                                                   np.float32)))
        if len(t.dims) == 2 and t.ggml_type == Q5_0:
            return Q5_0Tensor.from_raw(gf.raw(g), t.shape)
        if len(t.dims) == 2 and is_exact_in_q8_0(t.ggml_type):
            return _laid_out(gf, t, Q8_0Tensor(to_q8_0(gf.raw(g), t.ggml_type, t.shape)))
        if len(t.dims) == 2 and t.ggml_type == GGML_TYPE_IDS["Q4_K"]:
            return Q4_KTensor.from_raw(gf.raw(g), t.shape)
        if len(t.dims) == 2 and t.ggml_type == Q4_1:
            return Q4_1Tensor.from_raw(gf.raw(g), t.shape)
        if len(t.dims) == 2 and t.ggml_type in DECOMPOSERS:
            return _laid_out(gf, t, AffineTensor.from_raw(gf.raw(g), t.ggml_type, t.shape))
    except ValueError as e:
        raise ModelFormatError(f"{gf.path}: tensor {g!r} ({t.type_name}): {e}") from None
    raise ModelFormatError(
        f"{gf.path}: tensor {g!r} is {t.type_name} with {len(t.dims)} dims; the engines run F32 vectors and "
        f"F32, F16, BF16 matrices and those of the integer block types ({', '.join(AFFINE_TYPES)})")


def _laid_out(gf: GGUFFile, t, tensor):
    """``tensor``, laid out at load from ``t``'s bytes, which are not read
    again: their pages of the map are released (docs/architecture.md#memory)."""
    release_pages(gf.mm, t.offset, t.offset + t.nbytes)
    return tensor


def _dequantized_tensor(gf: GGUFFile, g: str) -> F32Tensor:
    """Tensor ``g`` of any dequantizable type as f32 values the tensor owns
    (the map closes after reading); NaN or Inf refused."""
    t = gf.tensors[g]
    try:
        values = dequantize(gf.raw(g), t.ggml_type, t.shape)
        tensor = F32Tensor(np.require(values, np.float32, ["C", "O"]))  # own it: the map closes
    except ValueError as e:
        raise ModelFormatError(f"{gf.path}: tensor {g!r} ({t.type_name}): {e}") from None
    if not np.all(np.isfinite(tensor.data)):
        raise ModelFormatError(f"{gf.path}: tensor {g!r} holds NaN or Inf")
    return tensor


def read_gguf(path) -> Weights:
    """Read a Gemma 3 or Llama GGUF file as the engines run it: F32 norms and
    Q8_0 matrices as zero-copy, read-only views of the mapped file (the map
    stays alive through ``Weights.keepalive``), every other integer block
    type laid out once, exactly (``_mapped_tensor``). Tied embeddings stay
    one tensor. Raises ModelFormatError for anything ``parse_gguf`` or
    ``gguf_config`` rejects, an unexpected, missing or misshapen tensor, or a
    matrix type the engines do not run (the IQ family, I8..I64, F64), naming
    the tensor and its type."""
    return _read_model(path, _mapped_tensor, keep_map=True)


def read_gguf_f32(path) -> Weights:
    """Read any supported Gemma 3 or Llama GGUF (Q4_K, Q4_1, Q5_0, Q6_K, Q8_0, F16, F32...)
    with every tensor dequantized to f32 (``F32Tensor``, owned arrays): the
    original weights as HF transformers sees them, for the reference engine's
    checks against an independent implementation. Not zero-copy (Gemma 3
    270M takes ~1.1 GB)."""
    return _read_model(path, _dequantized_tensor, keep_map=False)
