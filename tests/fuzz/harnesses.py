"""Fuzz targets (docs/errors.md#fuzzing): each takes arbitrary bytes and feeds
them to one of gemma-cy's readers or tokenizers the way a user's file would
reach it. An error of the package's own (GemmaCyError: a one-line refusal)
is the expected answer to a bad input; anything else escaping a target (a
traceback of another type, a signal, a hang) is a bug.

    TARGETS[name](data)     run one input
    SEEDS[name]()           the valid small files the fuzzer starts from
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from gemma_cy import api
from gemma_cy.errors import GemmaCyError

SCRATCH = tempfile.mkdtemp(prefix="gemma-cy-fuzz-")
TEXTS = ("", "a", "Hello, world!", "héllo wörld 🍂 秋", "  \n\t x  ", "<bos><start_of_turn>user\n",
         "<|im_start|>", "12345 67.89", "\x00\xff")
MAX_FORWARD_VALUES = 2_000_000  # run a forward step only on models this small


def as_file(data: bytes, name: str) -> str:
    path = os.path.join(SCRATCH, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def exercise_tokenizer(tok) -> None:
    """Encode and decode a few texts, special parsing on and off, and some ids."""
    for text in TEXTS:
        for special in (False, True):
            ids = tok.encode(text, parse_special=special)
            tok.decode(ids)
    n = tok.vocab_size
    tok.decode([i % n for i in range(0, 3 * n, max(1, n // 7))])
    stream = tok.stream_decoder()
    for i in range(min(n, 40)):
        stream.push(i)
    stream.flush()


def exercise_weights(weights) -> None:
    """One prefill step on both engines, if the model is small enough."""
    c = weights.config
    values = sum(int(np.prod(t.shape)) for t in weights.tensors.values())
    if values > MAX_FORWARD_VALUES or c.vocab_size > 100_000:
        return
    from gemma_cy.fast.engine import FastEngine
    from gemma_cy_reference.model import ReferenceEngine

    ids = [i % c.vocab_size for i in (c.bos_id or 0, 1, 2)]
    for engine in (FastEngine(weights, 4), ReferenceEngine(weights, 4)):
        engine.prefill(ids)


def expect_own_errors(fn):
    """Run ``fn(data)``; a GemmaCyError is a valid refusal."""
    def target(data: bytes) -> None:
        try:
            fn(data)
        except GemmaCyError:
            pass
    target.__name__ = fn.__name__
    return target


@expect_own_errors
def gguf_model(data: bytes) -> None:
    exercise_weights(api.open_weights(as_file(data, "model.gguf")))


@expect_own_errors
def gguf_vocab(data: bytes) -> None:
    exercise_tokenizer(api.open_tokenizer(as_file(data, "vocab.gguf")))


@expect_own_errors
def gmw(data: bytes) -> None:
    exercise_weights(api.open_weights(as_file(data, "model.gmw")))


@expect_own_errors
def gmt(data: bytes) -> None:
    exercise_tokenizer(api.open_tokenizer(as_file(data, "vocab.tok")))


@expect_own_errors
def llama2c_model(data: bytes) -> None:
    from gemma_cy.formats.llama2c import read_llama2c
    exercise_weights(read_llama2c(as_file(data, "model.bin")))


@expect_own_errors
def llama2c_tokenizer(data: bytes) -> None:
    from gemma_cy.tokenizers.llama2c import Llama2cTokenizer
    exercise_tokenizer(Llama2cTokenizer.from_file(as_file(data, "tokenizer.bin")))


_CHAT_TOKENIZER = None


@expect_own_errors
def chat_template(data: bytes) -> None:
    """The bytes as a Jinja chat template, rendered for a few conversations:
    with the byte-level BPE vocabulary, and as the ``tokenizer.chat_template``
    of a SentencePiece GGUF vocabulary, read back through the file path a
    user's Gemma file takes (api.open_tokenizer, then chat_template_for)."""
    from gemma_cy.formats.gguf_writer import write_gguf
    from gemma_cy.tokenizers.chat import ChatTemplate, chat_ids, chat_template_for
    global _CHAT_TOKENIZER
    if _CHAT_TOKENIZER is None:
        from gemma_cy.tokenizers.bpe import BPETokenizer
        tokens, types, merges = bpe_vocab()
        _CHAT_TOKENIZER = BPETokenizer(tokens, types, merges, 1, 2)
    source = data.decode("utf-8", "replace")
    path = os.path.join(SCRATCH, "template.gguf")
    write_gguf(path, {**sp_vocab_fields(), "tokenizer.chat_template": source}, [])
    sp = api.open_tokenizer(path)
    from_file = chat_template_for(sp)
    assert source == "" or (from_file.name, from_file.source) == ("file", source), "the file's template was not read"
    for tok, template in ((_CHAT_TOKENIZER, ChatTemplate("file", source, ())), (sp, from_file)):
        if template is None:
            continue
        for messages in ([{"role": "user", "content": "hi"}],
                         [{"role": "system", "content": "S"}, {"role": "user", "content": "a<|im_end|>b"},
                          {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]):
            chat_ids(tok, template, messages)


_TOKENIZERS = None


@expect_own_errors
def tokenize(data: bytes) -> None:
    """Arbitrary bytes through every tokenizer kind (first byte chooses),
    encoded with special parsing on and off; the rest read as ids, decoded."""
    global _TOKENIZERS
    if _TOKENIZERS is None:
        _TOKENIZERS = [api.open_tokenizer(as_file(seed, name)) for name, seed in
                       (("t.tok", seed_gmt()), ("t.gguf", seed_gguf_model()), ("b.gguf", seed_bpe_vocab()))]
        from gemma_cy.tokenizers.llama2c import Llama2cTokenizer
        _TOKENIZERS.append(Llama2cTokenizer.from_file(as_file(seed_llama2c_tokenizer(), "tokenizer.bin")))
    if not data:
        return
    tok = _TOKENIZERS[data[0] % len(_TOKENIZERS)]
    body = data[1:]
    tok.encode(body, parse_special=bool(data[0] & 0x80))
    tok.encode(body.decode("utf-8", "replace"))
    ids = np.frombuffer(body[:len(body) // 2 * 2], dtype="<u2").astype(int).tolist()
    tok.decode(ids)  # out-of-range ids are a TokenIndexError
    stream = tok.stream_decoder()
    for i in ids:
        stream.push(i)
    stream.flush()


# ---------------------------------------------------------------------------
# Seeds: valid small files made by gemma-cy's own writers


def bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """The test suite's hand-made byte-level BPE vocabulary (ChatML's three
    markers, the byte symbols, a few merges): tests/helpers.py."""
    from helpers import bpe_hand_vocab
    return bpe_hand_vocab()


def _gguf_bytes(fields: dict, tensors: list) -> bytes:
    from gemma_cy.formats.gguf_writer import write_gguf
    path = os.path.join(SCRATCH, "seed.gguf")
    write_gguf(path, fields, tensors)
    with open(path, "rb") as f:
        return f.read()


def sp_vocab_fields() -> dict:
    """The GGUF metadata of a SentencePiece vocabulary of 300 pieces (the fixture vocabulary)."""
    from gemma_cy.tokenizers.fixture_vocab import fixture_vocab

    vocab = fixture_vocab(300)
    pieces = [p.decode("latin-1") if vocab.types[i] != 1 else f"<0x{p[0]:02X}>" for i, p in enumerate(vocab.pieces)]
    types = [{0: 1, 1: 6, 2: 3}[t] for t in vocab.types]
    types[vocab.unk_id] = 2
    return {"general.architecture": "gemma3", "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": pieces, "tokenizer.ggml.scores": np.array(vocab.scores, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.bos_token_id": vocab.bos_id,
            "tokenizer.ggml.eos_token_id": vocab.eos_id, "tokenizer.ggml.unknown_token_id": vocab.unk_id}


def seed_gguf_model() -> bytes:
    """A Gemma 3 model of 2 layers, dim 32, vocab 300 (Q8_0 matrices, one Q4_K,
    F32 norms) with its SentencePiece vocabulary."""
    from gemma_cy.formats.gguf_writer import TensorData
    from gemma_cy.quant.tensors import quantize_q8_0
    from gemma_cy.quant.types import GGML_TYPE_IDS as T

    n_layers, dim, heads, head_dim, mlp = 2, 32, 2, 16, 64
    fields = {"general.architecture": "gemma3", "gemma3.context_length": 64, "gemma3.embedding_length": dim,
              "gemma3.block_count": n_layers, "gemma3.feed_forward_length": mlp,
              "gemma3.attention.head_count": heads, "gemma3.attention.head_count_kv": 1,
              "gemma3.attention.key_length": head_dim, "gemma3.attention.value_length": head_dim,
              "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1e6,
              "gemma3.attention.sliding_window": 8, **sp_vocab_fields()}
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (300, dim), "output_norm.weight": (dim,)}
    for l in range(n_layers):
        p = f"blk.{l}."
        shapes.update({p + "attn_q.weight": (heads * head_dim, dim), p + "attn_k.weight": (head_dim, dim),
                       p + "attn_v.weight": (head_dim, dim), p + "attn_output.weight": (dim, heads * head_dim),
                       p + "ffn_gate.weight": (mlp, dim), p + "ffn_up.weight": (mlp, dim),
                       p + "ffn_down.weight": (dim, mlp), p + "attn_norm.weight": (dim,),
                       p + "ffn_norm.weight": (dim,), p + "post_attention_norm.weight": (dim,),
                       p + "post_ffw_norm.weight": (dim,), p + "attn_q_norm.weight": (head_dim,),
                       p + "attn_k_norm.weight": (head_dim,)})
    tensors = []
    for name, shape in shapes.items():
        a = (rng.standard_normal(shape) * 0.1 + (len(shape) == 1)).astype(np.float32)
        if len(shape) == 1:
            tensors.append(TensorData(name, T["F32"], shape, a))
        else:
            tensors.append(TensorData(name, T["Q8_0"], tuple(reversed(shape)), quantize_q8_0(a)))
    return _gguf_bytes(fields, tensors)


def seed_bpe_vocab() -> bytes:
    tokens, types, merges = bpe_vocab()
    return _gguf_bytes({"general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
                        "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
                        "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.merges": merges,
                        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}, [])


def seed_gmw() -> bytes:
    """A GMW1 model of 1 layer, dim 64, vocab 300."""
    from gemma_cy.formats.gmw import gmw_config, gmw_layout, write_gmw
    from gemma_cy.quant.tensors import quantize_per_tensor
    config = gmw_config(n_layers=1, dim=64, n_heads=2, n_kv_heads=1, mlp_dim=128, vocab_size=300, max_seq_len=16,
                        head_dim=32, rope_base=10000.0)
    rng = np.random.default_rng(1)
    tensors = {name: quantize_per_tensor((rng.standard_normal(shape) * 0.1 + (shape[1] == 1)).astype(np.float32)
                                         .reshape(-1 if shape[1] == 1 else shape[0], *(() if shape[1] == 1
                                                                                      else (shape[1],))))
               for name, shape in gmw_layout(config)}
    path = os.path.join(SCRATCH, "seed.gmw")
    write_gmw(path, config, tensors)
    with open(path, "rb") as f:
        return f.read()


def seed_gmt() -> bytes:
    from gemma_cy.formats.gmt import write_gmt
    from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
    path = os.path.join(SCRATCH, "seed.tok")
    write_gmt(path, fixture_vocab(300))
    with open(path, "rb") as f:
        return f.read()


def seed_llama2c_model() -> bytes:
    """A llama2.c checkpoint (dim 32, 1 layer, vocab 300), written by
    write_llama2c from a legacy file of random values."""
    import struct
    from gemma_cy.formats.llama2c import Header, file_size, read_llama2c, write_llama2c
    h = Header(dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=300, seq_len=16, shared=True)
    values = np.random.default_rng(2).standard_normal((file_size(h) - 28) // 4).astype("<f4") * 0.1
    source = as_file(struct.pack("<7i", 32, 64, 1, 2, 1, 300, 16) + values.tobytes(), "seed-src.bin")
    out = os.path.join(SCRATCH, "seed.bin")
    write_llama2c(out, read_llama2c(source), version=0)
    with open(out, "rb") as f:
        return f.read()


def seed_llama2c_tokenizer() -> bytes:
    from gemma_cy.tokenizers.llama2c import write_tokenizer_bin
    pieces = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)] + \
        [b" ", b"e", b"t", b" the", b"he", b"in", "é".encode()]
    path = os.path.join(SCRATCH, "seed-tokenizer.bin")
    write_tokenizer_bin(path, pieces, [float(-i) for i in range(len(pieces))])
    with open(path, "rb") as f:
        return f.read()


def seed_templates() -> list[bytes]:
    from gemma_cy.tokenizers.chat import CHATML_TEMPLATE, GEMMA_TEMPLATE
    return [GEMMA_TEMPLATE.encode(), CHATML_TEMPLATE.encode(),
            b"{% for m in messages %}{% if loop.first %}{{ m | tojson }}{% endif %}{{ m['role'] }}{% endfor %}"]


TARGETS = {f.__name__: f for f in (gguf_model, gguf_vocab, gmw, gmt, llama2c_model, llama2c_tokenizer,
                                   chat_template, tokenize)}
SEEDS = {
    "gguf_model": lambda: [seed_gguf_model()],
    "gguf_vocab": lambda: [seed_gguf_model(), seed_bpe_vocab()],
    "gmw": lambda: [seed_gmw()],
    "gmt": lambda: [seed_gmt()],
    "llama2c_model": lambda: [seed_llama2c_model()],
    "llama2c_tokenizer": lambda: [seed_llama2c_tokenizer()],
    "chat_template": seed_templates,
    "tokenize": lambda: [bytes([k]) + t.encode() for k in (0, 1, 2, 3, 0x81, 0x82) for t in TEXTS[:4]],
}
