"""llama2.c checkpoints: the fp32 ``run.c`` layout and the int8 ``runq.c``
"version 2" layout (llama2.c's export.py). Reads and writes.

Legacy fp32 (run.c; no magic), little-endian:

    7 x int32   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
                (vocab_size < 0: an unshared classifier ``wcls`` ends the file)
    f32 tensors, back to back, each row-major (out, in) like torch's Linear:
      token_embedding_table (vocab, dim)
      rms_att_weight (L, dim)
      wq (L, qd, dim)   wk (L, kv, dim)   wv (L, kv, dim)   wo (L, dim, qd)
      rms_ffn_weight (L, dim)
      w1 (L, hidden, dim)   w2 (L, dim, hidden)   w3 (L, hidden, dim)
      rms_final_weight (dim,)
      freq_cis_real, freq_cis_imag (seq_len, head_size/2) each: skipped on
          read (run.c computes RoPE itself); written as cos / sin of the angles
      wcls (vocab, dim), only when vocab_size < 0

    head_size = dim / n_heads, qd = n_heads*head_size (= dim), kv =
    n_kv_heads*head_size. run.c's matmul(xout, x, w, n, d) computes
    W (d, n) @ x with W row-major, so every matrix is stored (out, in), the
    ``Weights`` convention; w1 = gate_proj, w3 = up_proj, w2 = down_proj.

Version 2 (runq.c, export.py's version2_export):

    u32 magic 0x616b3432 ("ak42": the file starts with the bytes b"24ka")
    int32 version = 2 | 7 x int32 as above (vocab_size > 0)
    u8 shared_classifier (0 | 1) | int32 group_size (at offset 37, unaligned)
    zero bytes up to offset 256
    f32: rms_att_weight (L, dim), rms_ffn_weight (L, dim), rms_final_weight (dim,)
    quantized tensors, each as int8 q (numel) then f32 scales (numel / group_size):
      token embedding, then wq x L, wk x L, wv x L, wo x L, w1 x L, w2 x L,
      w3 x L (stacked by kind, as export.py writes them), then wcls unless shared.
    A group is group_size consecutive values of the flattened tensor;
    value = q * scale of its group. gemma-cy requires group_size to divide
    dim and hidden_dim, so a group never crosses a row (runq.c needs that
    too: it quantizes its activations in the same groups).

The model (run.c): RMSNorm x * g / sqrt(mean(x^2) + 1e-5) (plain gain),
RoPE on interleaved pairs (2j, 2j+1) of each head with angle
pos * 10000^(-2j / head_size), scores / sqrt(head_size), query head h reads
kv head h / (n_heads / n_kv_heads), SiLU-gated MLP, no embedding scale, BOS
1, EOS 2: ``llama2c_config``.

Reading for the engines (``read_llama2c``): norm gains stay f32
(``F32Tensor``, zero-copy views of the mapped file); every matrix becomes
``Q8_0Tensor`` (quant.quantize_q8_0, llama.cpp's codec) when its row length
is a multiple of 32, else ``Int8Tensor`` (one scale for the whole tensor,
docs/formats.md#int8-per-tensor-quantization) - e.g. stories260K's hidden_dim 172. fp32 values are quantized once;
v2 values are dequantized (q * scale in f32) and re-quantized to Q8_0. That
is exact only where a Q8_0 block's f16 scale d = max|x|/127 and the rounding
of x / d give back the same values, which a group scale generally does not
allow; the error is below one Q8_0 step (max|x| of the block / 254 plus
the f16 rounding of d). ``read_llama2c_f32`` gives the file's own values
as ``F32Tensor`` for the reference engine instead (zero-copy for fp32).

Validation (docs/errors.md cases 1-15), before any tensor is touched: every
size positive, n_heads dividing dim, n_kv_heads dividing n_heads, even
head_size, the group size (v2) at least 1 and dividing dim and hidden_dim,
padding bytes zero, and the file size equal to the one the header implies,
computed with Python ints. Then every f32 value (fp32) or scale (v2) is
checked finite (scales also >= 0; a zero scale dequantizes to zeros).
Each breach is one ``ModelFormatError`` line naming the file.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..model.config import ModelConfig
from ..errors import ModelFormatError
from ..quant.tensors import Q8_0_BLOCK, F32Tensor, Q8_0Tensor, quantize_per_tensor, quantize_q8_0
from ..model.weights import Weights
from .mapped import atomic_write, map_file

LEGACY_HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
V2_MAGIC = 0x616B3432  # "ak42" as export.py packs it: struct.pack("I", 0x616b3432)
V2_MAGIC_BYTES = struct.pack("<I", V2_MAGIC)  # b"24ka"
V2_VERSION = 2
V2_HEADER_SIZE = 256
V2_HEAD = struct.Struct("<Ii7iBi")  # magic, version, 7 params, shared_classifier, group_size: 41 bytes
VERSIONS = (0, V2_VERSION)  # 0: the legacy fp32 layout (it has no version field)
F32 = 4
INT32_MAX = 2**31 - 1
ROPE_BASE = 10000.0  # run.c: powf(10000.0f, ...)
NORM_EPS = 1e-5  # run.c: rmsnorm's 1e-5f
BOS_ID = 1  # run.c: BOS (=1), EOS (=2)
EOS_ID = 2
FREQ_TABLES = ("freq_cis_real", "freq_cis_imag")  # skipped on read
CHUNK_VALUES = 1 << 22  # values per chunk of a conversion: bounds the temporaries

_PARAMS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
_LAYER_KINDS = (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("o_proj", "wo"),
                ("gate_proj", "w1"), ("down_proj", "w2"), ("up_proj", "w3"))


@dataclass(frozen=True)
class Header:
    """The 7 sizes of a llama2.c header, the classifier flag and (v2) the group size."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int  # always > 0 here (the legacy sign is ``shared``)
    seq_len: int
    shared: bool  # the classifier is the token embedding
    version: int = 0
    group_size: int = 0  # v2 only

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_size


def llama2c_config(h: Header) -> ModelConfig:
    """The ModelConfig run.c computes for header ``h`` (see the module docstring)."""
    return ModelConfig(
        n_layers=h.n_layers, dim=h.dim, n_heads=h.n_heads, n_kv_heads=h.n_kv_heads,
        head_dim=h.head_size, mlp_dim=h.hidden_dim, vocab_size=h.vocab_size, max_seq_len=h.seq_len,
        activation="silu", rope_pairing="interleaved", rope_base=ROPE_BASE, norm_eps=NORM_EPS,
        norm_gain="plain", position_table=False, embed_scale=1.0, qk_norm=False, post_norms=False,
        tied_embeddings=h.shared, bos_id=BOS_ID,
        # run.c's generate loop stops when the model emits BOS (how TinyStories
        # models end a story); EOS ends a sequence too
        eos_ids=(BOS_ID, EOS_ID))


def layout(h: Header) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the file in file order: (Weights name, shape).

    The RoPE tables of the legacy layout are named FREQ_TABLES. In v2 the
    f32 norms come first, then the quantized matrices. Reader and writer
    both walk this list, so the order is defined once.
    """
    L, dim, qd, kv, hid = h.n_layers, h.dim, h.n_heads * h.head_size, h.kv_dim, h.hidden_dim
    shapes = {"q_proj": (qd, dim), "k_proj": (kv, dim), "v_proj": (kv, dim), "o_proj": (dim, qd),
              "gate_proj": (hid, dim), "down_proj": (dim, hid), "up_proj": (hid, dim)}

    def stack(kind: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"layers.{layer}.{kind}", shape) for layer in range(L)]

    embed = [("embed_tokens", (h.vocab_size, dim))]
    head = [] if h.shared else [("lm_head", (h.vocab_size, dim))]
    if h.version == V2_VERSION:
        return (stack("attn_norm", (dim,)) + stack("ffn_norm", (dim,)) + [("final_norm", (dim,))]
                + embed + [e for kind, _ in _LAYER_KINDS for e in stack(kind, shapes[kind])] + head)
    half = (h.seq_len, h.head_size // 2)
    return (embed + stack("attn_norm", (dim,))
            + [e for kind in ("q_proj", "k_proj", "v_proj", "o_proj") for e in stack(kind, shapes[kind])]
            + stack("ffn_norm", (dim,))
            + [e for kind in ("gate_proj", "down_proj", "up_proj") for e in stack(kind, shapes[kind])]
            + [("final_norm", (dim,)), (FREQ_TABLES[0], half), (FREQ_TABLES[1], half)] + head)


def file_size(h: Header) -> int:
    """Exact size in bytes of a file with header ``h``: a closed form in
    Python ints (no loop over layers, nothing can wrap); equals the sum over
    ``layout``."""
    dim, L, qd, kv, hid = h.dim, h.n_layers, h.n_heads * h.head_size, h.kv_dim, h.hidden_dim
    classifiers = 1 if h.shared else 2
    matrices = classifiers * h.vocab_size * dim + L * (2 * qd * dim + 2 * kv * dim + 3 * hid * dim)
    norms = 2 * L * dim + dim
    if h.version == V2_VERSION:
        return V2_HEADER_SIZE + F32 * norms + matrices + F32 * (matrices // h.group_size)
    tables = 2 * h.seq_len * (h.head_size // 2)
    return LEGACY_HEADER.size + F32 * (matrices + norms + tables)


# ---------------------------------------------------------------------------
# reading

def is_llama2c_checkpoint(path: str) -> bool:
    """True when ``path`` looks like a llama2.c checkpoint: the v2 magic, a
    name ending in ".bin" (the legacy layout has no magic), or a legacy
    header whose sizes give exactly the file's size. Reads at most 28 bytes."""
    try:
        if not os.path.isfile(path):  # no open() of a FIFO or a directory
            return False
        with open(path, "rb") as f:
            head = f.read(LEGACY_HEADER.size)
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError):
        return False
    if head[:4] == V2_MAGIC_BYTES or os.fspath(path).endswith(".bin"):
        return True
    if len(head) < LEGACY_HEADER.size:
        return False
    try:
        return file_size(_legacy_header(os.fspath(path), head)) == size
    except ModelFormatError:
        return False


def read_llama2c(path) -> Weights:
    """Read a llama2.c checkpoint (fp32 or v2, told apart by the v2 magic)
    as Weights the engines run: f32 norm gains (zero-copy views), Q8_0 or
    per-tensor int8 matrices (see the module docstring). Raises
    ModelFormatError for any breach of the layout."""
    return _read(os.fspath(path), for_engine=True)


def read_llama2c_f32(path) -> Weights:
    """Read a llama2.c checkpoint with every tensor as ``F32Tensor``: the
    file's values (fp32: zero-copy views of the mapped file; v2: q * scale),
    for the reference engine. The fast engine does not run f32 matrices."""
    return _read(os.fspath(path), for_engine=False)


def _read(name: str, for_engine: bool) -> Weights:
    mm = map_file(name, "llama2.c", LEGACY_HEADER.size)
    try:
        h = _parse_header(name, mm)
        try:
            config = llama2c_config(h)
        except ModelFormatError as e:
            raise ModelFormatError(f"{name}: {e}") from None
        tensors = _tensors(name, mm, h, for_engine)
    except ModelFormatError:
        _close_quietly(mm)
        raise
    return Weights(config=config, tensors=tensors, source=name, keepalive=[mm], architecture="llama2.c")


def _close_quietly(mm: mmap.mmap) -> None:
    """Close ``mm`` unless a view of it is still alive (the traceback of the
    error being raised can hold one): then the garbage collector closes it."""
    try:
        mm.close()
    except BufferError:
        pass


def _legacy_header(name: str, raw: bytes) -> Header:
    """The legacy header's sizes, validated; vocab_size < 0 means unshared."""
    values = dict(zip(_PARAMS, LEGACY_HEADER.unpack_from(raw, 0)))
    vocab = values["vocab_size"]
    if vocab == 0:
        raise ModelFormatError(f"{name}: vocab_size: found 0, must be non-zero")
    values["vocab_size"] = abs(vocab)
    h = Header(**values, shared=vocab > 0)
    _check_sizes(name, h)
    return h


def _parse_header(name: str, mm: mmap.mmap) -> Header:
    """Validate the header (either layout) and the file size; return it."""
    size = len(mm)
    if mm[:4] == V2_MAGIC_BYTES:
        if size < V2_HEADER_SIZE:
            raise ModelFormatError(f"{name}: truncated header: file has {size} bytes, the llama2.c v2 "
                                   f"header is {V2_HEADER_SIZE} bytes")
        _, version, *params, shared, group_size = V2_HEAD.unpack_from(mm, 0)
        if version != V2_VERSION:
            raise ModelFormatError(f"{name}: version: found {version}, expected {V2_VERSION} (llama2.c v2)")
        if shared not in (0, 1):
            raise ModelFormatError(f"{name}: shared_classifier: found {shared}, must be 0 or 1")
        pad = mm[V2_HEAD.size:V2_HEADER_SIZE]
        if any(pad):
            at = next(i for i, b in enumerate(pad) if b)
            raise ModelFormatError(f"{name}: header padding: found 0x{pad[at]:02x} at offset "
                                   f"{V2_HEAD.size + at}, expected zero bytes up to {V2_HEADER_SIZE}")
        h = Header(**dict(zip(_PARAMS, params)), shared=bool(shared), version=V2_VERSION,
                   group_size=group_size)
        _check_sizes(name, h)
    else:
        h = _legacy_header(name, mm[:LEGACY_HEADER.size])
    expected = file_size(h)
    if size != expected:
        how = "short" if size < expected else "long"
        raise ModelFormatError(
            f"{name}: file size: found {size} bytes, expected {expected} bytes from the llama2.c header "
            f"({abs(expected - size)} bytes too {how})")
    return h


def _check_sizes(name: str, h: Header) -> None:
    """Every size positive, heads dividing evenly, even head_size, and (v2)
    a group size that divides every row."""
    for field in _PARAMS:
        value = getattr(h, field)
        if value <= 0:
            raise ModelFormatError(f"{name}: {field}: found {value}, must be > 0")
    if h.dim % h.n_heads != 0:
        raise ModelFormatError(f"{name}: n_heads: found {h.n_heads}, must divide dim = {h.dim}")
    if h.n_heads % h.n_kv_heads != 0:
        raise ModelFormatError(f"{name}: n_kv_heads: found {h.n_kv_heads}, must divide n_heads = {h.n_heads}")
    if h.head_size % 2 != 0:
        raise ModelFormatError(f"{name}: head_size = dim / n_heads = {h.head_size}, must be even "
                               f"(RoPE rotates pairs)")
    if h.version == V2_VERSION:
        _check_group_size(name, h.group_size, h.dim, h.hidden_dim)


def _check_group_size(name: str, group_size: int, dim: int, hidden_dim: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ModelFormatError(f"{name}: group_size: found {group_size!r}, must be an integer >= 1")
    for field, value in (("dim", dim), ("hidden_dim", hidden_dim)):
        if value % group_size != 0:
            raise ModelFormatError(f"{name}: group_size: found {group_size}, must divide {field} = {value} "
                                   f"(a group may not cross a row)")


def _tensors(name: str, mm: mmap.mmap, h: Header, for_engine: bool) -> dict:
    """Check every value or scale, then build the tensors (the file size
    was checked against the header, so every offset is in bounds)."""
    tensors = {}
    offset = V2_HEADER_SIZE if h.version == V2_VERSION else LEGACY_HEADER.size
    for tname, shape in layout(h):
        n = math.prod(shape)
        if h.version == V2_VERSION and len(shape) == 2:
            q = np.frombuffer(mm, dtype=np.int8, count=n, offset=offset).reshape(
                shape[0], shape[1] // h.group_size, h.group_size)  # (rows, groups, group_size)
            scales = np.frombuffer(mm, dtype="<f4", count=n // h.group_size, offset=offset + n).reshape(
                q.shape[:2] + (1,))  # (rows, groups, 1)
            bad = ~(np.isfinite(scales) & (scales >= 0))
            if bad.any():
                at = int(np.flatnonzero(bad)[0])
                raise ModelFormatError(f"{name}: tensor {tname}: scale {float(scales.flat[at])!r} at "
                                       f"offset {offset + n + F32 * at}, must be finite and >= 0")
            offset += n + F32 * (n // h.group_size)
            produce = _dequantizer(q, scales, shape)
            tensors[tname] = _engine_matrix(name, tname, shape, produce) if for_engine \
                else F32Tensor(produce(0, shape[0]))
            continue
        values = np.frombuffer(mm, dtype="<f4", count=n, offset=offset).reshape(shape)
        offset += F32 * n
        if tname in FREQ_TABLES:
            continue
        _check_finite(name, tname, values)
        if for_engine and len(shape) == 2:
            tensors[tname] = _engine_matrix(name, tname, shape, lambda r0, r1, v=values: v[r0:r1])
        else:
            tensors[tname] = F32Tensor(values)
    return tensors


def _dequantizer(q: np.ndarray, scales: np.ndarray, shape: tuple[int, int]):
    """A function (r0, r1) -> rows r0..r1-1 of q * scale as f32 (rows, cols)."""
    def produce(r0: int, r1: int) -> np.ndarray:
        return (q[r0:r1].astype(np.float32) * scales[r0:r1]).reshape(r1 - r0, shape[1])
    return produce


def _check_finite(name: str, tname: str, values: np.ndarray) -> None:
    """Raise naming the first NaN/Inf of ``values`` (checked in chunks: no
    full-size temporary)."""
    flat = values.reshape(-1)
    for start in range(0, len(flat), CHUNK_VALUES):
        chunk = flat[start:start + CHUNK_VALUES]
        if not np.isfinite(chunk).all():
            at = start + int(np.flatnonzero(~np.isfinite(chunk))[0])
            raise ModelFormatError(f"{name}: tensor {tname}: value {float(flat[at])!r} at index {at}; "
                                   f"weights must be finite")


def _engine_matrix(name: str, tname: str, shape: tuple[int, int], produce):
    """The engines' form of a matrix whose f32 rows ``produce(r0, r1)``
    gives: Q8_0 when the row length is a multiple of 32 (quantized in row
    chunks), else one int8 scale for the whole tensor."""
    rows, cols = shape
    try:
        if cols % Q8_0_BLOCK != 0:
            return quantize_per_tensor(produce(0, rows))
        blocks = np.empty((rows, cols // Q8_0_BLOCK, 34), dtype=np.uint8)
        step = max(1, CHUNK_VALUES // cols)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            blocks[r0:r1] = quantize_q8_0(produce(r0, r1))
        return Q8_0Tensor(blocks)
    except ValueError as e:  # a block scale too large for f16
        raise ModelFormatError(f"{name}: tensor {tname}: {e}") from None


# ---------------------------------------------------------------------------
# writing

def write_llama2c(path, weights: Weights, version: int = 0, group_size: int = 64) -> None:
    """Write ``weights`` as a llama2.c checkpoint: ``version`` 0 is run.c's
    fp32 layout (every tensor dequantized to f32), 2 is runq.c's int8 layout
    with ``group_size`` values per scale, quantized as export.py does:
    scale = max|w| / 127 (f32), q = round(w / scale), halves to even
    (torch.round); an all-zero group gets scale 0 and q 0.

    Raises ModelFormatError when the config has a feature llama2.c cannot
    express (naming the field: position table, q/k-norm, post-norms, GELU,
    half-split RoPE, an embedding scale, a one_plus gain, soft-caps, a
    sliding window, n_heads*head_dim != dim, RoPE base or eps other than
    run.c's 10000 and 1e-5, sizes beyond int32), for a bad version or group
    size, or a NaN/Inf weight. The file appears at ``path`` only once complete.
    """
    name = os.fspath(path)
    if isinstance(version, bool) or version not in VERSIONS:
        raise ModelFormatError(f"write {name}: version = {version!r}, expected one of {VERSIONS}")
    c = weights.config
    h = _header_for(name, c, version, group_size)
    with atomic_write(name) as f:
        if version == V2_VERSION:
            head = V2_HEAD.pack(V2_MAGIC, V2_VERSION, *(getattr(h, p) for p in _PARAMS), int(h.shared),
                                group_size)
            f.write(head + bytes(V2_HEADER_SIZE - len(head)))
        else:
            params = [getattr(h, p) for p in _PARAMS]
            params[_PARAMS.index("vocab_size")] *= 1 if h.shared else -1
            f.write(LEGACY_HEADER.pack(*params))
        for tname, shape in layout(h):
            if tname in FREQ_TABLES:
                f.write(_bytes(_rope_table(h, tname)))
                continue
            values = np.asarray(weights[tname].dequantize(), dtype=np.float32).reshape(shape)
            _check_finite(f"write {name}", tname, values)
            if version == V2_VERSION and len(shape) == 2:
                step = max(1, CHUNK_VALUES // shape[1])
                scales = []  # (rows, cols // group_size) in row chunks: written after all of q
                for r0 in range(0, shape[0], step):
                    q, s = quantize_groups(values[r0:r0 + step], group_size)
                    f.write(_bytes(q))
                    scales.append(s)
                f.write(_bytes(np.concatenate(scales)))
            else:
                f.write(_bytes(values))


def _header_for(name: str, c: ModelConfig, version: int, group_size: int) -> Header:
    """The header for ``c``; raises unless reading it back gives ``c``."""
    for field in ("dim", "mlp_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"):
        if getattr(c, field) > INT32_MAX:
            raise ModelFormatError(f"write {name}: {field} = {getattr(c, field)} does not fit llama2.c's "
                                   f"int32 (max {INT32_MAX})")
    if c.q_dim != c.dim:
        raise ModelFormatError(f"write {name}: n_heads*head_dim = {c.q_dim} != dim = {c.dim}; llama2.c "
                               f"derives head_size = dim / n_heads")
    h = Header(dim=c.dim, hidden_dim=c.mlp_dim, n_layers=c.n_layers, n_heads=c.n_heads,
               n_kv_heads=c.n_kv_heads, vocab_size=c.vocab_size, seq_len=c.max_seq_len,
               shared=c.tied_embeddings, version=version,
               group_size=group_size if version == V2_VERSION else 0)
    if version == V2_VERSION:
        _check_group_size(f"write {name}", group_size, c.dim, c.mlp_dim)
    if c.bos_id not in (None, BOS_ID) or set(c.eos_ids) - {BOS_ID, EOS_ID}:
        raise ModelFormatError(f"write {name}: bos_id = {c.bos_id!r}, eos_ids = {c.eos_ids!r}: llama2.c "
                               f"fixes BOS = {BOS_ID} and EOS = {EOS_ID}")
    as_read = llama2c_config(h)
    if c.scores_scale != as_read.scores_scale:
        raise ModelFormatError(f"write {name}: query_scale = {c.query_scale!r} cannot be expressed in "
                               f"llama2.c (run.c scales scores by 1/sqrt(head_size))")
    if np.float32(c.norm_eps) != np.float32(NORM_EPS):
        raise ModelFormatError(f"write {name}: norm_eps = {c.norm_eps!r} cannot be expressed in llama2.c "
                               f"(run.c adds 1e-5f)")
    for field in ModelConfig.__dataclass_fields__:
        if field in ("bos_id", "eos_ids", "query_scale", "norm_eps", "rope_base_local",
                     "sliding_window_pattern"):
            continue
        if getattr(c, field) != getattr(as_read, field):
            raise ModelFormatError(f"write {name}: {field} = {getattr(c, field)!r} cannot be expressed in "
                                   f"llama2.c (it means {getattr(as_read, field)!r})")
    return h


def quantize_groups(values: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """export.py's quantize_q80: ``values`` f32 (..., cols), cols % group_size
    == 0, -> (q int8 (..., cols), scales f32 (..., cols // group_size)).

    scale = max|w| / 127 in f32 per group; q = round(w / scale) in f32,
    halves to even (torch.round, np.round). A zero group: scale 0, q 0.
    """
    w = np.asarray(values, dtype=np.float32)
    g = w.reshape(-1, group_size)  # (groups, group_size)
    scales = np.max(np.abs(g), axis=1) / np.float32(127)  # (groups,) f32
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.round(g / scales[:, None])
    q[scales == 0] = 0
    q = np.clip(q, -127, 127).astype(np.int8)
    return q.reshape(w.shape), scales.reshape(w.shape[:-1] + (w.shape[-1] // group_size,))


def _rope_table(h: Header, tname: str) -> np.ndarray:
    """freq_cis_real (cos) or freq_cis_imag (sin) of pos * 10000^(-2j/head_size),
    (seq_len, head_size/2) f32, as llama2.c's model.py precomputes them."""
    j = np.arange(0, h.head_size, 2, dtype=np.float32) / np.float32(h.head_size)  # (hs/2,)
    inv_freq = np.float32(1) / np.power(np.float32(ROPE_BASE), j)  # (hs/2,)
    angles = np.outer(np.arange(h.seq_len, dtype=np.float32), inv_freq)  # (seq_len, hs/2)
    return (np.cos if tname == FREQ_TABLES[0] else np.sin)(angles).astype(np.float32)


def _bytes(a: np.ndarray) -> memoryview:
    """The bytes of ``a`` in little-endian C order (no copy when already so)."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a).cast("B")
