"""What the GGUF test modules share: a tiny valid Gemma 3 model (1-2 layers,
dim 32) written with the writer, and a byte-level GGUF builder (``gguf_bytes``
and its parts, struct.pack only: independent of the writer under test) for
malicious files in tmp_path; ``reject``/``parse_reject`` assert the one-line
ModelFormatError; ``random_blocks`` draws blocks of any ggml type."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from gemma_cy.quant import types as gt
from gemma_cy.errors import ModelFormatError
from gemma_cy.formats import gguf_reader as G
from gemma_cy.formats.gguf_reader import parse_gguf
from gemma_cy.formats.gguf_writer import TensorData, write_gguf
from gemma_cy.formats.gguf_model import read_gguf
from gemma_cy.quant.tensors import quantize_q8_0


T = gt.GGML_TYPE_IDS  # ggml type name -> id


# ---------------------------------------------------------------- a tiny model

TINY = dict(n_layers=2, dim=32, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64, vocab=12, ctx=64)
PIECES = ["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "▁c", "<0x41>", "<start_of_turn>",
          "<end_of_turn>", "\n", "▁"]


def tiny_fields(sizes: dict = TINY, **extra) -> dict:
    """Metadata of the tiny Gemma 3 model (``extra`` overrides/adds keys; None removes)."""
    c = sizes
    fields = {
        "general.architecture": "gemma3",
        "general.name": "tiny",
        "gemma3.context_length": c["ctx"],
        "gemma3.embedding_length": c["dim"],
        "gemma3.block_count": c["n_layers"],
        "gemma3.feed_forward_length": c["mlp_dim"],
        "gemma3.attention.head_count": c["n_heads"],
        "gemma3.attention.head_count_kv": c["n_kv_heads"],
        "gemma3.attention.key_length": c["head_dim"],
        "gemma3.attention.value_length": c["head_dim"],
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.attention.sliding_window": 8,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": PIECES,
        "tokenizer.ggml.scores": np.arange(c["vocab"], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([3, 3, 3, 2, 1, 1, 1, 6, 3, 3, 1, 1], dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    fields.update(extra)
    return {k: v for k, v in fields.items() if v is not None}


def tiny_arrays(seed: int = 0, n_layers: int | None = None, sizes: dict = TINY) -> dict[str, np.ndarray]:
    """GGUF name -> f32 values (NumPy shape) of every tiny-model tensor."""
    c = sizes
    rng = np.random.default_rng(seed)
    qd, kvd = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
    shapes = {"token_embd.weight": (c["vocab"], c["dim"]), "output_norm.weight": (c["dim"],)}
    for l in range(c["n_layers"] if n_layers is None else n_layers):
        p = f"blk.{l}."
        shapes.update({p + "attn_q.weight": (qd, c["dim"]), p + "attn_k.weight": (kvd, c["dim"]),
                       p + "attn_v.weight": (kvd, c["dim"]), p + "attn_output.weight": (c["dim"], qd),
                       p + "ffn_gate.weight": (c["mlp_dim"], c["dim"]),
                       p + "ffn_up.weight": (c["mlp_dim"], c["dim"]),
                       p + "ffn_down.weight": (c["dim"], c["mlp_dim"]),
                       p + "attn_norm.weight": (c["dim"],), p + "ffn_norm.weight": (c["dim"],),
                       p + "post_attention_norm.weight": (c["dim"],),
                       p + "post_ffw_norm.weight": (c["dim"],),
                       p + "attn_q_norm.weight": (c["head_dim"],),
                       p + "attn_k_norm.weight": (c["head_dim"],)})
    return {n: (rng.standard_normal(s) * (0.1 if len(s) == 2 else 1) + (len(s) == 1)).astype(np.float32)
            for n, s in shapes.items()}


def tensor_data(arrays: dict[str, np.ndarray]) -> list[TensorData]:
    """Matrices as Q8_0, vectors as F32 (the layout gemma-cy runs)."""
    out = []
    for name, a in arrays.items():
        dims = tuple(reversed(a.shape))
        if a.ndim == 1:
            out.append(TensorData(name, T["F32"], dims, a))
        else:
            out.append(TensorData(name, T["Q8_0"], dims, quantize_q8_0(a)))
    return out


def write_tiny(path, fields=None, arrays=None) -> str:
    write_gguf(path, tiny_fields() if fields is None else fields,
               tensor_data(tiny_arrays() if arrays is None else arrays))
    return str(path)


def reject(path, *needles: str) -> str:
    """read_gguf(path) must raise one-line ModelFormatError containing every needle."""
    with pytest.raises(ModelFormatError) as e:
        read_gguf(path)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def put(tmp_path, data: bytes, name: str = "bad.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# ------------------------------------------------- a byte-level GGUF builder

def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v) -> bytes:
    return gstr(key) + struct.pack("<II", G.UINT32, v)


def kv_str(key, v) -> bytes:
    return gstr(key) + struct.pack("<I", G.STRING) + gstr(v)


def tinfo(name, dims, ggml_type, offset) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf_bytes(kvs=(), infos=(), data=b"", *, magic=b"GGUF", version=3, n_tensors=None,
               n_kv=None, alignment=32) -> bytes:
    head = (magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    return head + bytes(-len(head) % alignment) + data


def f32_tensor_file(values, name="t", extra_kvs=()) -> bytes:
    """A file with one F32 tensor (no model metadata): for parse_gguf tests."""
    data = np.asarray(values, dtype="<f4").tobytes()
    data += bytes(-len(data) % 32)
    return gguf_bytes(list(extra_kvs), [tinfo(name, [len(values)], T["F32"], 0)], data)


def parse_reject(tmp_path, data: bytes, *needles: str) -> str:
    with pytest.raises(ModelFormatError) as e:
        parse_gguf(put(tmp_path, data))
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def random_blocks(type_name: str, n: int, seed: int = 0) -> np.ndarray:
    """Random blocks of a type, with finite small f16 scales."""
    t = gt.GGML_TYPES[T[type_name]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, t.type_size), dtype=np.uint8)
    for at in G._F16_SCALE_OFFSETS.get(type_name, ()):
        raw[:, at:at + 2] = (rng.standard_normal(n) * 0.01).astype("<f2").view(np.uint8).reshape(n, 2)
    if type_name in ("F16", "BF16", "F32"):
        raw = rng.standard_normal(n).astype(np.float32)
        raw = {"F32": raw, "F16": raw.astype("<f2"), "BF16": (raw.view("<u4") >> 16).astype("<u2")}[type_name]
        raw = raw.view(np.uint8).reshape(n, t.type_size)
    return raw
