"""GMW1 v1: the seed engine's int8 weights file (docs/formats.md#gmw1-weights and #int8-per-tensor-quantization). Reads and writes.

Layout: a 64-byte header, then every tensor back to back as ``rows*cols``
int8 values followed by one f32 scale; no names, no alignment. The header
alone fixes the file size, so that size is the shape check: it is computed
with Python ints and compared to the real size before anything is looped
over or mapped into arrays (docs/errors.md cases 4-7).

GMW1 tensor names -> ``Weights`` names: gamma_attn -> layers.{l}.attn_norm,
gamma_ffn -> layers.{l}.ffn_norm, final_norm_gamma -> final_norm; the others
keep their names (layer ones under ``layers.{l}.``).
"""
from __future__ import annotations

import math
import mmap
import os
import struct

import numpy as np

from ..model.config import ModelConfig
from ..errors import ModelFormatError
from .mapped import atomic_write, map_file
from ..quant.tensors import Int8Tensor
from ..model.weights import Weights

MAGIC = b"GMW1"
VERSION = 1
HEADER_SIZE = 64
SCALE_SIZE = 4  # one f32 after each tensor
U32_MAX = 2**32 - 1

# magic, version, n_layers, dim, n_heads, n_kv_heads, mlp_dim, vocab_size,
# max_seq_len, head_dim (u32), rope_base (f32), reserved (20 bytes)
_HEADER = struct.Struct("<4s9If20s")
_COUNT_FIELDS = ("n_layers", "dim", "n_heads", "n_kv_heads", "mlp_dim",
                 "vocab_size", "max_seq_len", "head_dim")
_RESERVED_OFFSET = 44


def gmw_layout(config: ModelConfig) -> list[tuple[str, tuple[int, int]]]:
    """Every tensor of a GMW1 file in file order: (Weights name, file shape).

    File shapes are (rows, cols); vectors are stored as (n, 1). Reader and
    writer both walk this list, so the order is defined once.
    """
    c = config
    layout = [("embed_tokens", (c.vocab_size, c.dim)),
              ("embed_positions", (c.max_seq_len, c.dim))]
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        layout += [(p + "q_proj", (c.dim, c.dim)),
                   (p + "k_proj", (c.kv_dim, c.dim)),
                   (p + "v_proj", (c.kv_dim, c.dim)),
                   (p + "o_proj", (c.dim, c.dim)),
                   (p + "gate_proj", (c.mlp_dim, c.dim)),
                   (p + "up_proj", (c.mlp_dim, c.dim)),
                   (p + "down_proj", (c.dim, c.mlp_dim)),
                   (p + "attn_norm", (c.dim, 1)),
                   (p + "ffn_norm", (c.dim, 1))]
    layout += [("final_norm", (c.dim, 1)),
               ("lm_head", (c.vocab_size, c.dim))]
    return layout


def gmw_file_size(n_layers: int, dim: int, n_kv_heads: int, head_dim: int,
                  mlp_dim: int, vocab_size: int, max_seq_len: int) -> int:
    """Exact size in bytes of a GMW1 file with these header values.

    Closed form (no loop over layers), in Python ints so that no product can
    wrap, whatever the header holds; equals the sum over ``gmw_layout``.
    """
    kv = n_kv_heads * head_dim
    per_layer = (2 * dim * dim + 2 * kv * dim + 3 * mlp_dim * dim + 2 * dim
                 + 9 * SCALE_SIZE)
    return (HEADER_SIZE
            + 2 * (vocab_size * dim + SCALE_SIZE)  # embed_tokens, lm_head
            + max_seq_len * dim + SCALE_SIZE  # embed_positions
            + n_layers * per_layer
            + dim + SCALE_SIZE)  # final_norm


def gmw_config(n_layers: int, dim: int, n_heads: int, n_kv_heads: int,
               mlp_dim: int, vocab_size: int, max_seq_len: int, head_dim: int,
               rope_base: float) -> ModelConfig:
    """The ModelConfig a GMW1 header means: the seed's switches (docs/model.md#the-seed-model-gmw1).

    SiLU gating, interleaved RoPE, plain norm gain, learned position table,
    untied lm_head, eps 1e-6: all ModelConfig defaults.
    """
    return ModelConfig(n_layers=n_layers, dim=dim, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, head_dim=head_dim, mlp_dim=mlp_dim,
                       vocab_size=vocab_size, max_seq_len=max_seq_len,
                       rope_base=float(rope_base))


def read_gmw(path) -> Weights:
    """Read a GMW1 file as Weights of zero-copy, read-only int8 views.

    The file is memory-mapped read-only; the map stays alive through
    ``Weights.keepalive``. Raises ModelFormatError (naming the file, the
    field, the value found and the rule) for a missing, unreadable or
    non-regular file and for any breach of docs/formats.md#gmw1-weights or a NaN/Inf/negative
    scale. A zero scale is accepted: that tensor dequantizes to zeros.
    """
    name = os.fspath(path)
    mm = map_file(name, "GMW1", HEADER_SIZE)
    try:
        config = _parse_header(name, mm)
        tensors = _tensors(name, mm, config)
    except ModelFormatError:
        mm.close()  # no array views exist yet: _tensors checks every scale first
        raise
    return Weights(config=config, tensors=tensors, source=name, keepalive=[mm], architecture="gmw1")


def _parse_header(name: str, mm: mmap.mmap) -> ModelConfig:
    """Validate the header (docs/formats.md#gmw1-weights) and the file size; return the config."""
    size = len(mm)  # the mapped size, not an earlier stat: the one we will read
    if size < HEADER_SIZE:
        raise ModelFormatError(
            f"{name}: truncated header: file has {size} bytes, the GMW1 header is {HEADER_SIZE} bytes")
    magic, version, *counts, rope_base, reserved = _HEADER.unpack_from(mm, 0)
    if magic != MAGIC:
        raise ModelFormatError(f"{name}: magic: found {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ModelFormatError(f"{name}: version: found {version}, expected {VERSION}")
    if any(reserved):
        at = next(i for i, b in enumerate(reserved) if b)
        raise ModelFormatError(
            f"{name}: reserved bytes: found 0x{reserved[at]:02x} at offset "
            f"{_RESERVED_OFFSET + at}, expected all {len(reserved)} bytes zero")
    h = dict(zip(_COUNT_FIELDS, counts))
    for field in _COUNT_FIELDS:
        if h[field] == 0:
            raise ModelFormatError(f"{name}: {field}: found 0, must be > 0")
    if h["n_heads"] % h["n_kv_heads"] != 0:
        raise ModelFormatError(
            f"{name}: n_kv_heads: found {h['n_kv_heads']}, must divide n_heads = {h['n_heads']}")
    if h["dim"] % h["n_heads"] != 0:
        raise ModelFormatError(
            f"{name}: n_heads: found {h['n_heads']}, must divide dim = {h['dim']}")
    if h["head_dim"] != h["dim"] // h["n_heads"]:
        raise ModelFormatError(
            f"{name}: head_dim: found {h['head_dim']}, expected dim / n_heads = "
            f"{h['dim']} / {h['n_heads']} = {h['dim'] // h['n_heads']}")
    if h["head_dim"] % 2 != 0:
        raise ModelFormatError(
            f"{name}: head_dim: found {h['head_dim']}, must be even (RoPE rotates pairs)")
    if not (math.isfinite(rope_base) and rope_base > 0):
        raise ModelFormatError(f"{name}: rope_base: found {rope_base!r}, must be finite and > 0")

    expected = gmw_file_size(h["n_layers"], h["dim"], h["n_kv_heads"], h["head_dim"],
                             h["mlp_dim"], h["vocab_size"], h["max_seq_len"])
    if size != expected:
        how = "short" if size < expected else "long"
        raise ModelFormatError(
            f"{name}: file size: found {size} bytes, expected {expected} bytes from the "
            f"header ({abs(expected - size)} bytes too {how})")
    try:
        return gmw_config(rope_base=rope_base, **h)
    except ModelFormatError as e:
        raise ModelFormatError(f"{name}: {e}") from None


def _tensors(name: str, mm: mmap.mmap, config: ModelConfig) -> dict[str, Int8Tensor]:
    """Check every scale, then cut the body into read-only int8 views.

    The file size was checked against the header, so every offset is in bounds.
    """
    placed = []  # (name, offset of the int8 values, shape, scale)
    offset = HEADER_SIZE
    for tname, (rows, cols) in gmw_layout(config):
        n = rows * cols
        (scale,) = struct.unpack_from("<f", mm, offset + n)
        if not math.isfinite(scale) or scale < 0:
            raise ModelFormatError(
                f"{name}: tensor {tname}: scale found {scale!r} at offset {offset + n}, "
                f"must be finite and >= 0")
        placed.append((tname, offset, (rows,) if cols == 1 else (rows, cols), scale))
        offset += n + SCALE_SIZE
    data = np.frombuffer(mm, dtype=np.int8)  # read-only: the map is ACCESS_READ
    return {tname: Int8Tensor(q=data[start:start + math.prod(shape)].reshape(shape),
                              scale=np.float32(scale))
            for tname, start, shape, scale in placed}


def write_gmw(path, config: ModelConfig, tensors: dict[str, Int8Tensor]) -> None:
    """Write ``tensors`` as a GMW1 v1 file at ``path`` (docs/formats.md#gmw1-weights).

    ``tensors`` uses the Weights names and shapes (vectors as (n,)); they are
    written in file order, vectors as [n][1]. Raises ModelFormatError when
    ``config`` is not what a GMW1 header can say (read back it must give
    the same config: n_heads*head_dim == dim, learned positions, untied
    lm_head, SiLU, plain gain...), or a tensor is missing, extra, of the
    wrong shape or dtype, or has a NaN/Inf/negative scale. The file appears
    at ``path`` only once complete.
    """
    name = os.fspath(path)
    _check_expressible(name, config)
    layout = gmw_layout(config)
    _check_tensors(name, layout, tensors)
    header = _HEADER.pack(MAGIC, VERSION, *(getattr(config, f) for f in _COUNT_FIELDS),
                          config.rope_base, bytes(_HEADER.size - _RESERVED_OFFSET))
    with atomic_write(name) as f:
        f.write(header)
        for tname, _ in layout:
            t = tensors[tname]
            f.write(memoryview(np.ascontiguousarray(t.q)).cast("B"))
            f.write(struct.pack("<f", np.float32(t.scale)))


def _check_expressible(name: str, config: ModelConfig) -> None:
    """Raise unless reading a GMW1 header written from ``config`` gives ``config``."""
    for field in _COUNT_FIELDS:
        value = getattr(config, field)
        if value > U32_MAX:
            raise ModelFormatError(
                f"write {name}: {field} = {value} does not fit GMW1's u32 (max {U32_MAX})")
    if config.n_heads * config.head_dim != config.dim:
        raise ModelFormatError(
            f"write {name}: n_heads*head_dim = {config.q_dim} != dim = {config.dim}; "
            f"GMW1's q_proj is [dim][dim]")
    with np.errstate(over="ignore"):
        rope_f32 = float(np.float32(config.rope_base))
    if rope_f32 != config.rope_base:
        raise ModelFormatError(
            f"write {name}: rope_base = {config.rope_base!r} is not exactly an f32 "
            f"(GMW1 stores f32: it would read back as {rope_f32!r})")
    as_read = gmw_config(**{f: getattr(config, f) for f in _COUNT_FIELDS},
                         rope_base=config.rope_base)
    if as_read != config:
        for field in config.__dataclass_fields__:
            if getattr(config, field) != getattr(as_read, field):
                raise ModelFormatError(
                    f"write {name}: {field} = {getattr(config, field)!r} cannot be "
                    f"expressed in GMW1 (it means {getattr(as_read, field)!r})")


def _check_tensors(name: str, layout, tensors: dict[str, Int8Tensor]) -> None:
    """Raise unless ``tensors`` holds exactly the layout's tensors, well formed."""
    wanted = {tname for tname, _ in layout}
    extra = sorted(set(tensors) - wanted)
    if extra:
        raise ModelFormatError(f"write {name}: tensor {extra[0]} has no place in GMW1")
    for tname, (rows, cols) in layout:
        if tname not in tensors:
            raise ModelFormatError(f"write {name}: missing tensor {tname}")
        t = tensors[tname]
        shape = (rows,) if cols == 1 else (rows, cols)
        q = np.asarray(t.q)
        if q.dtype != np.int8 or q.shape != shape:
            raise ModelFormatError(
                f"write {name}: tensor {tname}: found {q.dtype} {q.shape}, expected int8 {shape}")
        with np.errstate(over="ignore"):
            scale = np.float32(t.scale)
        if not (np.isfinite(scale) and scale >= 0):
            raise ModelFormatError(
                f"write {name}: tensor {tname}: scale = {t.scale!r}, must be a finite f32 >= 0")
