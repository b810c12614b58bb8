"""llama2.c checkpoints (run.c fp32, runq.c v2) and tokenizer.bin.

Independent checks: headers and offsets are built here with struct.pack from
llama2.c's documented layout (run.c / runq.c / export.py), not with the
writer; the model is checked against a NumPy transcription of run.c's
forward pass written in this file; the tokenizer against ids worked out by
hand (following run.c's encode step by step in the comments) and against a
literal transcription of run.c's quadratic merge loop.
"""
import json
import math
import struct

import numpy as np
import pytest

from helpers import assert_one_line_error, assert_within, cli, gguf_tensors

import gemma_cy
from gemma_cy.api import Model, open_tokenizer, open_weights
from gemma_cy.model.config import ModelConfig
from gemma_cy.errors import ModelFormatError, TokenIndexError
from gemma_cy.formats.gguf_writer import write_gguf
from gemma_cy.formats.llama2c import read_llama2c, read_llama2c_f32, write_llama2c
from gemma_cy.tokenizers.llama2c import (Llama2cTokenizer, read_tokenizer_bin, sentencepiece_to_llama2c, write_tokenizer_bin)
from gemma_cy.quant.tensors import F32Tensor, Int8Tensor, Q8_0Tensor
from gemma_cy.model.weights import Weights, expected_shapes

# ---------------------------------------------------------------- a hand-written vocab
# ids 0..2 specials, 3..258 the byte pieces (run.c's byte fallback: byte + 3), then:
WORDS = [
    (b" ", -1000.0),                # 259 the dummy prefix
    (b"a", -1000.0),                # 260
    (b"b", -1000.0),                # 261
    (b"c", -1000.0),                # 262
    (b"ab", -1.0),                  # 263
    (b"bc", -2.0),                  # 264
    (b" a", -3.0),                  # 265
    (b" ab", -0.5),                 # 266
    (b"abc", -4.0),                 # 267
    ("é".encode(), -1000.0),        # 268
    (b"ca", -1.0),                  # 269 (ties with "ab")
    (b"ba", -5.0),                  # 270
    (b"cc", -1e10),                 # 271 never merged: run.c needs a score > -1e10
    (b"\x80\x80\x80\x80", -1000.0),  # 272 four stray continuation bytes, one run.c group
    (b"\n", -1000.0),               # 273
]
PIECES = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)] + [p for p, _ in WORDS]
SCORES = [0.0] * 259 + [s for _, s in WORDS]
VOCAB = len(PIECES)  # 274
SP, A, B, C, AB, BC, SP_A, SP_AB, ABC, E_ACUTE, CA, BA, CC, CONT4, NL = range(259, 274)


def byte_id(b: int) -> int:
    return b + 3


@pytest.fixture(scope="module")
def tok() -> Llama2cTokenizer:
    return Llama2cTokenizer(PIECES, SCORES, max(len(p) for p in PIECES))


def run_c_encode(t: Llama2cTokenizer, data: bytes, bos: bool, eos: bool) -> list[int]:
    """run.c's encode transcribed literally: the quadratic scan, strict >."""
    ids = [1] if bos else []
    if data:
        ids.append(PIECES.index(b" "))
    i = 0
    while i < len(data):
        j = i + 1
        while j < len(data) and j - i < 4 and data[j] & 0xC0 == 0x80:
            j += 1
        group = data[i:j]
        ids += [PIECES.index(group)] if group in PIECES else [b + 3 for b in group]
        i = j
    while True:
        best_score, best_id, best_idx = np.float32(-1e10), -1, -1
        for k in range(len(ids) - 1):
            joined = PIECES[ids[k]] + PIECES[ids[k + 1]]
            if joined in PIECES and np.float32(SCORES[PIECES.index(joined)]) > best_score:
                best_score, best_id, best_idx = np.float32(SCORES[PIECES.index(joined)]), PIECES.index(joined), k
        if best_idx == -1:
            break
        ids[best_idx:best_idx + 2] = [best_id]
    return ids + [2] if eos else ids


# ---------------------------------------------------------------- tokenizer: encode / decode

@pytest.mark.parametrize("text, expected", [
    # "abc": [" ", a, b, c]; pairs " a" -3, "ab" -1, "bc" -2 -> "ab": [" ", ab, c];
    # pairs " ab" -0.5, "abc" -4 -> " ab": [" ab", c]; " abc" is no piece: done.
    ("abc", [SP_AB, C]),
    # "cab": [" ", c, a, b]; pairs " c" none, "ca" -1, "ab" -1: a tie, the
    # leftmost ("ca") wins -> [" ", ca, b]; " ca", "cab" are no pieces: done.
    ("cab", [SP, CA, B]),
    # "a€": [" ", a, E2+3, 82+3, AC+3] (no piece "€": byte fallback); " a" -3
    # merges; "a<0xE2>" etc. are no pieces.
    ("a€", [SP_A, byte_id(0xE2), byte_id(0x82), byte_id(0xAC)]),
    # "bé": [" ", b, é] ("é" is a piece: one code point of two bytes); " b",
    # "bé" are no pieces.
    ("bé", [SP, B, E_ACUTE]),
    # "cc": [" ", c, c]; "cc" has score -1e10, not > run.c's start -1e10.
    ("cc", [SP, C, C]),
    # "ba": [" ", b, a]; "ba" -5 merges; " ba" is no piece.
    ("ba", [SP, BA]),
    # "": no dummy prefix for empty text.
    ("", []),
    # five continuation bytes: run.c groups them 4 + 1; the 4 are a piece,
    # the last one falls back to its byte.
    (b"\x80" * 5, [SP, CONT4, byte_id(0x80)]),
    # NUL (run.c would stop there): one more byte, fallback id 3.
    (b"a\x00", [SP_A, byte_id(0)]),
])
def test_encode_hand_computed(tok, text, expected):
    assert tok.encode(text) == expected
    data = text.encode() if isinstance(text, str) else text
    if 0 not in data:
        assert run_c_encode(tok, data, False, False) == expected  # the transcription agrees too


def test_encode_bos_eos_take_part_as_in_run_c(tok):
    # [BOS, " ", a, b] -> "ab" -1 -> [BOS, " ", ab] -> " ab" -> [BOS, " ab"], then EOS.
    assert tok.encode_run_c("ab", bos=True, eos=True) == [1, SP_AB, 2]
    assert tok.encode_run_c("", bos=True, eos=False) == [1]
    assert tok.encode("<s>", parse_special=True) == tok.encode("<s>")  # no special pieces to parse


def test_heap_merge_equals_run_c_scan_on_random_text(tok):
    rng = np.random.default_rng(1)
    alphabet = list("abc é€\n") + ["\x80"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 24))))
        data = text.encode("utf-8", "surrogatepass") if "\x80" not in text else \
            text.replace("\x80", "").encode() + b"\x80" * text.count("\x80")
        for bos in (False, True):
            assert tok.encode_run_c(data, bos=bos) == run_c_encode(tok, data, bos, False), data


def test_decode_strips_space_after_bos_and_maps_bytes(tok):
    assert tok.decode([SP_AB, C]) == " abc"
    assert tok.decode([1, SP_AB, C]) == "abc"  # run.c drops the leading space after BOS
    assert tok.decode([1, byte_id(0x20)]) == " "  # not a byte piece's space: "<0x20>" starts with "<"
    assert tok.decode([SP_A, byte_id(0xE2), byte_id(0x82), byte_id(0xAC)]) == " a€"
    assert tok.decode([0, 1, 2]) == ""  # unk, BOS, EOS are control tokens
    assert tok.decode_bytes([byte_id(0xFF)]) == b"\xff"
    with pytest.raises(TokenIndexError):
        tok.decode([VOCAB])


def test_stream_decoder_knows_the_previous_token(tok):
    d = tok.stream_decoder(prev_id=1)
    assert d.push(SP_AB) == "ab" and d.push(SP_A) == " a"
    d = tok.stream_decoder()
    # "€" split over three byte tokens: held back until whole
    assert [d.push(t) for t in (byte_id(0xE2), byte_id(0x82), byte_id(0xAC))] == ["", "", "€"]


def test_round_trip(tok):
    rng = np.random.default_rng(2)
    for _ in range(200):
        text = "".join(rng.choice(list("abc é€\n🙂x"), size=int(rng.integers(0, 20))))
        assert tok.decode(tok.encode_run_c(text, bos=True)) == text
        assert tok.decode(tok.encode(text)) == (" " + text if text else "")


def test_long_prompt_is_fast(tok):
    import time
    start = time.perf_counter()
    ids = tok.encode("abc " * 50_000)
    assert time.perf_counter() - start < 20
    assert tok.decode(ids) == " " + "abc " * 50_000


# ---------------------------------------------------------------- tokenizer.bin

def tokenizer_bytes(pieces=PIECES, scores=SCORES, max_len=None) -> bytes:
    """tokenizer.bin as llama2.c's tokenizer.py writes it."""
    out = struct.pack("<i", max(len(p) for p in pieces) if max_len is None else max_len)
    for p, s in zip(pieces, scores):
        out += struct.pack("<fi", s, len(p)) + p
    return out


def test_tokenizer_bin_round_trip_and_layout(tmp_path):
    path = tmp_path / "tokenizer.bin"
    write_tokenizer_bin(path, PIECES, SCORES)
    assert path.read_bytes() == tokenizer_bytes()
    pieces, scores, max_len = read_tokenizer_bin(path)
    assert pieces == PIECES and scores == [float(np.float32(s)) for s in SCORES] and max_len == 6
    assert read_tokenizer_bin(path, vocab_size=VOCAB)[0] == PIECES
    assert isinstance(open_tokenizer(str(path)), Llama2cTokenizer)


def test_sentencepiece_export_matches_tokenizer_py():
    # llama2.c's tokenizer.py: BOS -> "\n<s>\n", EOS -> "\n</s>\n", U+2581 -> " "
    sp = ["<unk>", "<s>", "</s>", "<0x0A>", "▁the", "▁▁", "x"]
    assert sentencepiece_to_llama2c([p.encode() for p in sp], 1, 2) == \
        [b"<unk>", b"\n<s>\n", b"\n</s>\n", b"<0x0A>", b" the", b"  ", b"x"]


def _record_at(i: int) -> int:
    """Offset of token i's record in tokenizer_bytes()."""
    return 4 + sum(8 + len(p) for p in PIECES[:i])


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d[:2], "truncated header"),
    (lambda d: b"", "truncated header"),
    (lambda d: d[:-1], "truncated piece"),
    (lambda d: d + b"\x00\x00", "truncated record"),  # trailing bytes
    (lambda d: struct.pack("<i", 0) + d[4:], "max_token_length: found 0"),
    (lambda d: struct.pack("<i", -5) + d[4:], "max_token_length: found -5"),
    (lambda d: d[:_record_at(5) + 4] + struct.pack("<i", -1) + d[_record_at(5) + 8:], "length -1"),
    (lambda d: d[:_record_at(5) + 4] + struct.pack("<i", 7) + d[_record_at(5) + 8:], "length 7"),
    (lambda d: d[:_record_at(5)] + struct.pack("<f", float("nan")) + d[_record_at(5) + 4:], "score nan"),
    (lambda d: d[:_record_at(5) + 4] + struct.pack("<i", 2**31 - 1) + d[_record_at(5) + 8:], "length 2147483647"),
])
def test_bad_tokenizer_bin(tmp_path, mutate, needle):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(mutate(tokenizer_bytes()))
    with pytest.raises(ModelFormatError) as e:
        Llama2cTokenizer.from_file(path)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("index, piece, needle", [
    (3, b"<0x01>", "expected the byte piece <0x00>"),
    (10, b"<0x7z>", "expected the byte piece"),
    (SP + 1, b"<0xZZ>", "two upper-case hex digits"),
    (SP + 1, b"<0x100>", "two upper-case hex digits"),
    (SP + 1, b"<0x-1>", "two upper-case hex digits"),
    (SP + 1, b"<0x41>", "duplicates token 68"),
    (SP + 1, b"a\x00", "NUL byte"),
    (SP, b"  ", "no \" \" piece"),
])
def test_bad_vocab(tmp_path, index, piece, needle):
    pieces = list(PIECES)
    pieces[index] = piece
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(tokenizer_bytes(pieces))
    with pytest.raises(ModelFormatError, match=needle.replace("(", r"\(")):
        Llama2cTokenizer.from_file(path)


def test_too_few_tokens_and_count_mismatch(tmp_path):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(tokenizer_bytes(PIECES[:200], SCORES[:200]))
    with pytest.raises(ModelFormatError, match="at least 259"):
        Llama2cTokenizer.from_file(path)
    path.write_bytes(tokenizer_bytes())
    with pytest.raises(ModelFormatError, match="274 tokens, expected the model's vocab_size 300"):
        read_tokenizer_bin(path, vocab_size=300)


# ---------------------------------------------------------------- a random Llama model

def llama_config(vocab=VOCAB, tied=False, dim=64, n_heads=4, n_kv_heads=2, hidden=96, n_layers=2,
                 seq_len=64) -> ModelConfig:
    return ModelConfig(n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
                       head_dim=dim // n_heads, mlp_dim=hidden, vocab_size=vocab, max_seq_len=seq_len,
                       activation="silu", rope_pairing="interleaved", rope_base=10000.0, norm_eps=1e-5,
                       norm_gain="plain", position_table=False, tied_embeddings=tied, bos_id=1,
                       eos_ids=(1, 2))  # run.c stops on BOS as on EOS


def random_q8_0(rng, shape) -> np.ndarray:
    """Q8_0 blocks (rows, cols/32, 34) whose every block holds a +-127, so
    that quantize_q8_0(dequantize(blocks)) gives the same blocks back."""
    rows, cols = shape
    q = rng.integers(-127, 128, size=(rows, cols // 32, 32))
    q[..., 0] = np.where(rng.random((rows, cols // 32)) < 0.5, -127, 127)
    d = (rng.uniform(0.5, 1.5, size=(rows, cols // 32, 1)) / (127 * math.sqrt(cols) / 2)).astype(np.float16)
    blocks = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    blocks[..., :2] = d.view(np.uint8)
    blocks[..., 2:] = q.astype(np.int8).view(np.uint8)
    return blocks


def random_weights(config: ModelConfig, seed=0, q8=True) -> Weights:
    """Q8_0 matrices (exactly re-quantizable) or f32 ones, f32 norm gains near 1."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            tensors[name] = F32Tensor((1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        elif q8:
            tensors[name] = Q8_0Tensor(random_q8_0(rng, shape))
        else:
            tensors[name] = F32Tensor((rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32))
    return Weights(config=config, tensors=tensors, source="random")


def f32(weights: Weights, name: str) -> np.ndarray:
    return np.asarray(weights[name].dequantize(), dtype=np.float32)


# ---------------------------------------------------------------- the layout, byte for byte

def legacy_offsets(c: ModelConfig):
    """(name, offset, shape) of every tensor of run.c's layout, from its
    documented order; and the total size."""
    hs, L, dim, hid, kv = c.dim // c.n_heads, c.n_layers, c.dim, c.mlp_dim, c.kv_dim
    order = [("embed_tokens", (c.vocab_size, dim)), ("attn_norm", (L, dim)), ("q_proj", (L, dim, dim)),
             ("k_proj", (L, kv, dim)), ("v_proj", (L, kv, dim)), ("o_proj", (L, dim, dim)),
             ("ffn_norm", (L, dim)), ("gate_proj", (L, hid, dim)), ("down_proj", (L, dim, hid)),
             ("up_proj", (L, hid, dim)), ("final_norm", (dim,)), ("freq_cis_real", (c.max_seq_len, hs // 2)),
             ("freq_cis_imag", (c.max_seq_len, hs // 2))]
    if not c.tied_embeddings:
        order.append(("lm_head", (c.vocab_size, dim)))
    out, at = [], 28
    for name, shape in order:
        out.append((name, at, shape))
        at += 4 * math.prod(shape)
    return out, at


@pytest.mark.parametrize("tied", [False, True])
def test_legacy_layout_byte_for_byte(tmp_path, tied):
    c = llama_config(tied=tied)
    w = random_weights(c, q8=False)
    path = tmp_path / "m.bin"
    write_llama2c(path, w)
    data = path.read_bytes()
    vocab = c.vocab_size if tied else -c.vocab_size  # run.c: negative = unshared classifier
    assert data[:28] == struct.pack("<7i", 64, 96, 2, 4, 2, vocab, 64)
    offsets, size = legacy_offsets(c)
    assert len(data) == size
    for name, at, shape in offsets:
        values = np.frombuffer(data, dtype="<f4", count=math.prod(shape), offset=at).reshape(shape)
        if name.startswith("freq_cis"):
            j = np.arange(shape[1])
            angle = np.arange(shape[0])[:, None] * 10000.0 ** (-2 * j / (c.dim // c.n_heads))
            np.testing.assert_allclose(values, (np.cos if name.endswith("real") else np.sin)(angle),
                                       atol=2e-5)
        elif len(shape) == 3 or name in ("attn_norm", "ffn_norm"):
            for layer in range(c.n_layers):
                assert np.array_equal(values[layer], f32(w, f"layers.{layer}.{name}")), name
        else:
            assert np.array_equal(values, f32(w, name)), name


def test_v2_layout_byte_for_byte(tmp_path):
    c = llama_config(tied=False)
    w = random_weights(c, q8=False)
    path = tmp_path / "q.bin"
    write_llama2c(path, w, version=2, group_size=32)
    data = path.read_bytes()
    head = struct.pack("<I", 0x616B3432) + struct.pack("<i", 2) + struct.pack("<7i", 64, 96, 2, 4, 2, VOCAB, 64)
    head += struct.pack("<B", 0) + struct.pack("<i", 32)  # shared_classifier, group_size at 37
    assert data[:4] == b"24ka" and data[:256] == head + bytes(256 - len(head))
    at = 256
    for kind in ("attn_norm", "ffn_norm"):
        for layer in range(c.n_layers):
            assert np.array_equal(np.frombuffer(data, "<f4", c.dim, at), f32(w, f"layers.{layer}.{kind}"))
            at += 4 * c.dim
    assert np.array_equal(np.frombuffer(data, "<f4", c.dim, at), f32(w, "final_norm"))
    at += 4 * c.dim
    names = (["embed_tokens"] + [f"layers.{l}.{k}" for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "down_proj", "up_proj") for l in range(c.n_layers)]
             + ["lm_head"])
    for name in names:
        values = f32(w, name).reshape(-1, 32)  # export.py's groups of the flattened tensor
        q = np.frombuffer(data, np.int8, values.size, at).reshape(-1, 32)
        s = np.frombuffer(data, "<f4", len(values), at + values.size)
        at += values.size + 4 * len(values)
        expected_s = np.abs(values).max(axis=1) / np.float32(127)
        assert np.array_equal(s, expected_s), name
        assert np.array_equal(q, np.round(values / expected_s[:, None]).astype(np.int8)), name  # half to even
        assert np.all(np.abs(q * s[:, None] - values) <= s[:, None] / 2 * (1 + 1e-6)), name
    assert at == len(data)


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("tied", [False, True])
def test_fp32_round_trip_is_exact(tmp_path, tied):
    c = llama_config(tied=tied)
    w = random_weights(c)
    path = tmp_path / "m.bin"
    write_llama2c(path, w)
    back = read_llama2c(path)
    assert back.config == c
    f32_back = read_llama2c_f32(path)
    for name, t in w.tensors.items():
        assert np.array_equal(f32(f32_back, name), f32(w, name)), name
        if isinstance(t, Q8_0Tensor):  # every block holds a +-127: re-quantized to the same bytes
            assert isinstance(back[name], Q8_0Tensor) and np.array_equal(back[name].blocks, t.blocks), name
        else:
            assert isinstance(back[name], F32Tensor) and np.array_equal(back[name].data, t.data), name
    assert not f32_back["final_norm"].data.flags.writeable  # a zero-copy view of the map


def test_v2_round_trip_within_group_quantization(tmp_path):
    c = llama_config(hidden=128)
    w = random_weights(c, q8=False)
    path = tmp_path / "q.bin"
    write_llama2c(path, w, version=2, group_size=64)
    back, back_f32 = read_llama2c(path), read_llama2c_f32(path)
    assert back.config == c
    for name in w.tensors:
        orig, got = f32(w, name), f32(back_f32, name)
        if orig.ndim == 1:
            assert np.array_equal(orig, got)
            continue
        groups = orig.reshape(-1, 64)
        step = np.abs(groups).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(got.reshape(-1, 64) - groups) <= step / 2 * (1 + 1e-6)), name
        # the engines' Q8_0 re-quantization: half a Q8_0 step d = max|x|/127 of
        # the block, plus |q| <= 127 times the f16 rounding of d (2^-11 d)
        q8 = f32(back, name).reshape(-1, 32)
        block_step = np.abs(got.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(q8 - got.reshape(-1, 32)) <= block_step * (0.5 + 127 * 2.0**-11) * 1.001), name


def test_rows_not_a_multiple_of_32_fall_back_to_one_scale(tmp_path):
    c = llama_config(hidden=40)  # w2 rows have 40 values: no Q8_0
    w = random_weights(c, q8=False)
    path = tmp_path / "m.bin"
    write_llama2c(path, w)
    back = read_llama2c(path)
    assert isinstance(back["layers.0.down_proj"], Int8Tensor)
    assert isinstance(back["layers.0.gate_proj"], Q8_0Tensor)
    write_llama2c(tmp_path / "q.bin", w, version=2, group_size=8)
    assert read_llama2c(tmp_path / "q.bin").config == c


@pytest.mark.parametrize("change, needle", [
    (dict(position_table=True), "position_table"),
    (dict(qk_norm=True), "qk_norm"),
    (dict(post_norms=True), "post_norms"),
    (dict(activation="gelu_tanh"), "activation"),
    (dict(rope_pairing="half_split"), "rope_pairing"),
    (dict(embed_scale=8.0), "embed_scale"),
    (dict(norm_gain="one_plus"), "norm_gain"),
    (dict(final_softcap=30.0), "final_softcap"),
    (dict(attn_softcap=50.0), "attn_softcap"),
    (dict(sliding_window=8), "sliding_window"),
    (dict(rope_base=1e6), "rope_base"),
    (dict(norm_eps=1e-6), "norm_eps"),
    (dict(query_scale=0.1), "query_scale"),
    (dict(head_dim=32), "n_heads*head_dim = 128 != dim = 64"),
    (dict(bos_id=2, eos_ids=(1,)), "llama2.c fixes BOS = 1"),
    (dict(eos_ids=(3,)), "llama2.c fixes BOS = 1"),
])
def test_writer_refuses_what_llama2c_cannot_express(tmp_path, change, needle):
    c = llama_config().with_changes(**change)
    tensors = {n: F32Tensor(np.ones(s, np.float32)) for n, s in expected_shapes(c).items()}
    with pytest.raises(ModelFormatError) as e:
        write_llama2c(tmp_path / "x.bin", Weights(config=c, tensors=tensors))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(version=1), "version = 1"),
    (dict(version=2, group_size=0), "group_size: found 0"),
    (dict(version=2, group_size=-32), "group_size: found -32"),
    (dict(version=2, group_size=48), "must divide dim = 64"),
    (dict(version=2, group_size=64), "must divide hidden_dim = 96"),
])
def test_writer_refuses_bad_versions_and_groups(tmp_path, kwargs, needle):
    with pytest.raises(ModelFormatError, match=needle):
        write_llama2c(tmp_path / "x.bin", random_weights(llama_config(), q8=False), **kwargs)


def test_writer_refuses_nan(tmp_path):
    w = random_weights(llama_config(), q8=False)
    w.tensors["layers.1.up_proj"].data[3, 4] = np.nan
    with pytest.raises(ModelFormatError, match="layers.1.up_proj: value nan"):
        write_llama2c(tmp_path / "x.bin", w)


# ---------------------------------------------------------------- bad files

@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama2c")
    w = random_weights(llama_config(), q8=False)
    write_llama2c(d / "m.bin", w)
    write_llama2c(d / "q.bin", w, version=2, group_size=32)
    return (d / "m.bin").read_bytes(), (d / "q.bin").read_bytes()


def header7(dim=64, hidden=96, layers=2, heads=4, kv=2, vocab=-VOCAB, seq=64) -> bytes:
    return struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq)


def v2_head(version=2, params=(64, 96, 2, 4, 2, VOCAB, 64), shared=0, group=32, pad=b"") -> bytes:
    head = struct.pack("<Ii7iBi", 0x616B3432, version, *params, shared, group) + pad
    return head + bytes(256 - len(head))


LEGACY_BAD = [
    (lambda d: b"", "truncated header"),
    (lambda d: d[:20], "truncated header"),
    (lambda d: d[:-1], "1 bytes too short"),
    (lambda d: d + b"\0", "1 bytes too long"),
    (lambda d: header7(dim=0) + d[28:], "dim: found 0"),
    (lambda d: header7(hidden=-96) + d[28:], "hidden_dim: found -96"),
    (lambda d: header7(vocab=0) + d[28:], "vocab_size: found 0"),
    (lambda d: header7(kv=3) + d[28:], "n_kv_heads: found 3, must divide n_heads = 4"),
    (lambda d: header7(heads=5, kv=5) + d[28:], "n_heads: found 5, must divide dim = 64"),
    (lambda d: header7(heads=64, kv=64) + d[28:], "head_size = dim / n_heads = 1, must be even"),
    (lambda d: header7(dim=2**31 - 2, heads=1, kv=1) + d[28:], "file size"),  # no allocation first
    (lambda d: header7(vocab=-2**31) + d[28:], "file size"),
    (lambda d: header7(seq=2**31 - 1) + d[28:], "file size"),
    (lambda d: header7(vocab=VOCAB) + d[28:], "bytes too long"),  # shared: the classifier is extra
    (lambda d: d[:28 + 4 * 100] + struct.pack("<f", float("nan")) + d[28 + 4 * 101:],
     "tensor embed_tokens: value nan at index 100"),
    (lambda d: d[:-4] + struct.pack("<f", float("inf")), "tensor lm_head: value inf"),
]


def assert_every_reader_rejects(tmp_path, data: bytes, needle: str) -> None:
    """``data`` as a file: each llama2.c reader (and open_weights) raises a
    one-line ModelFormatError naming the file and holding ``needle``."""
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    for read in (read_llama2c, read_llama2c_f32, open_weights):
        with pytest.raises(ModelFormatError) as e:
            read(str(path))
        assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("mutate, needle", LEGACY_BAD)
def test_bad_legacy_files(tmp_path, good_files, mutate, needle):
    assert_every_reader_rejects(tmp_path, mutate(good_files[0]), needle)


def _first_scale_offset() -> int:
    return 256 + 4 * (2 * 2 * 64 + 64) + VOCAB * 64


V2_BAD = [
    (lambda d: d[:100], "truncated header"),
    (lambda d: v2_head(version=3) + d[256:], "version: found 3, expected 2"),
    (lambda d: v2_head(shared=2) + d[256:], "shared_classifier: found 2"),
    (lambda d: v2_head(pad=b"\x01") + d[256:], "header padding: found 0x01 at offset 41"),
    (lambda d: v2_head(group=0) + d[256:], "group_size: found 0"),
    (lambda d: v2_head(group=-32) + d[256:], "group_size: found -32"),
    (lambda d: v2_head(group=48) + d[256:], "must divide dim = 64"),
    (lambda d: v2_head(params=(64, 96, 2, 4, 2, -VOCAB, 64)) + d[256:], "vocab_size: found -274"),
    (lambda d: d[:-1], "1 bytes too short"),
    (lambda d: d + b"\0" * 4, "4 bytes too long"),
    (lambda d: d[:_first_scale_offset()] + struct.pack("<f", float("nan")) + d[_first_scale_offset() + 4:],
     "tensor embed_tokens: scale nan"),
    (lambda d: d[:_first_scale_offset()] + struct.pack("<f", -1.0) + d[_first_scale_offset() + 4:],
     "tensor embed_tokens: scale -1.0"),
    (lambda d: d[:256] + struct.pack("<f", float("inf")) + d[260:], "tensor layers.0.attn_norm: value inf"),
]


@pytest.mark.parametrize("mutate, needle", V2_BAD)
def test_bad_v2_files(tmp_path, good_files, mutate, needle):
    assert_every_reader_rejects(tmp_path, mutate(good_files[1]), needle)


def test_zero_scale_dequantizes_to_zeros(tmp_path, good_files):
    d = bytearray(good_files[1])
    at = _first_scale_offset()
    d[at:at + 4] = struct.pack("<f", 0.0)
    path = tmp_path / "z.bin"
    path.write_bytes(bytes(d))
    assert np.all(read_llama2c_f32(path)["embed_tokens"].data[0, :32] == 0)


def test_detection(tmp_path, good_files):
    legacy = tmp_path / "model.ckpt"  # no .bin name: recognised by its exact size
    legacy.write_bytes(good_files[0])
    assert open_weights(str(legacy)).config == llama_config()
    other = tmp_path / "model.dat"
    other.write_bytes(good_files[0] + b"\0")
    with pytest.raises(ModelFormatError, match="unknown weights format"):
        open_weights(str(other))
    v2 = tmp_path / "model.q"  # the magic is enough
    v2.write_bytes(good_files[1])
    assert open_weights(str(v2)).config == llama_config()


# ---------------------------------------------------------------- the model: run.c in NumPy

def run_c_forward(path, tokens: list[int]) -> np.ndarray:
    """run.c's forward pass over a legacy checkpoint, transcribed here: the
    file parsed from the documented offsets; returns the logits of each
    position (T, vocab)."""
    data = open(path, "rb").read()
    dim, hidden, L, nh, nkv, vocab, seq = struct.unpack_from("<7i", data)
    shared, vocab = vocab > 0, abs(vocab)
    hs = dim // nh
    kv_dim, kv_mul = nkv * hs, nh // nkv
    ptr = [28]

    def take(*shape):
        a = np.frombuffer(data, "<f4", math.prod(shape), ptr[0]).reshape(shape)
        ptr[0] += 4 * math.prod(shape)
        return a

    emb = take(vocab, dim)
    rms_att = take(L, dim)
    wq, wk, wv, wo = take(L, dim, dim), take(L, kv_dim, dim), take(L, kv_dim, dim), take(L, dim, dim)
    rms_ffn = take(L, dim)
    w1, w2, w3 = take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    rms_final = take(dim)
    take(seq, hs // 2), take(seq, hs // 2)
    wcls = emb if shared else take(vocab, dim)

    def rmsnorm(x, w):
        return w * (x / np.sqrt(np.mean(x * x) + np.float32(1e-5)))

    kc = np.zeros((L, seq, kv_dim), np.float32)
    vc = np.zeros((L, seq, kv_dim), np.float32)
    out = []
    for pos, token in enumerate(tokens):
        x = emb[token].copy()
        for l in range(L):
            xb = rmsnorm(x, rms_att[l])
            q, k, v = wq[l] @ xb, wk[l] @ xb, wv[l] @ xb
            for i in range(0, dim, 2):
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                fcr, fci = math.cos(pos * freq), math.sin(pos * freq)
                for vec in ((q, k) if i < kv_dim else (q,)):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            kc[l, pos], vc[l, pos] = k, v
            att_out = np.zeros(dim, np.float32)
            for h in range(nh):
                kh = kc[l, :pos + 1, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
                att = kh @ q[h * hs:(h + 1) * hs] / math.sqrt(hs)
                att = np.exp(att - att.max())
                att /= att.sum()
                att_out[h * hs:(h + 1) * hs] = att @ vc[l, :pos + 1, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
            x = x + wo[l] @ att_out
            xb = rmsnorm(x, rms_ffn[l])
            hb = w1[l] @ xb
            x = x + w2[l] @ (hb / (1 + np.exp(-hb)) * (w3[l] @ xb))
        out.append(wcls @ rmsnorm(x, rms_final))
    return np.array(out)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random untied Llama model (Q8_0 matrices, exactly re-quantizable)
    exported as fp32 and v2 checkpoints next to a tokenizer.bin."""
    d = tmp_path_factory.mktemp("export")
    w = random_weights(llama_config(), seed=3)
    write_llama2c(d / "model.bin", w)
    write_llama2c(d / "model_q.bin", w, version=2, group_size=32)
    write_tokenizer_bin(d / "tokenizer.bin", PIECES, SCORES)
    return w, d


def test_reference_engine_is_run_c(exported):
    _, d = exported
    tokens = [1, SP_AB, C, NL, BA, 7, 200, 3, SP]
    want = run_c_forward(d / "model.bin", tokens)
    from gemma_cy_reference.model import ReferenceEngine
    engine = ReferenceEngine(read_llama2c_f32(d / "model.bin"), 64)
    got = np.array([engine.forward(t, pos) for pos, t in enumerate(tokens)])
    assert_within(got, want, "logits against run.c")
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))


def greedy(model, prompt: str, n=16) -> list[int]:
    gen = model.generate(prompt, n_dec=n, temperature=0, terminate_on_eos=False)
    list(gen)
    return gen.generated_ids


def test_end_to_end_both_engines_same_tokens(exported):
    w, d = exported
    tok = Llama2cTokenizer.from_file(d / "tokenizer.bin")
    runs = {}
    for engine in ("fast", "reference"):
        runs["original", engine] = greedy(Model(w, tok, engine, 64), "abc cab")
        for name in ("model.bin", "model_q.bin"):
            model = gemma_cy.load(d / name, engine=engine, max_cache_len=64)  # tokenizer.bin found next to it
            assert isinstance(model.tokenizer, Llama2cTokenizer)
            assert model.tokenize("abc cab") == [1] + tok.encode("abc cab")
            runs[name, engine] = greedy(model, "abc cab")
    assert len(runs["original", "fast"]) == 16
    for key in [("original", "reference"), ("model.bin", "fast"), ("model.bin", "reference")]:
        assert runs[key] == runs["original", "fast"], key
    assert runs["model_q.bin", "fast"] == runs["model_q.bin", "reference"]
    # the fp32 file from run.c's own forward pass: the same greedy tokens
    ids = [1] + tok.encode("abc cab")
    for _ in range(16):
        ids.append(int(run_c_forward(d / "model.bin", ids)[-1].argmax()))
    assert ids[-16:] == runs["model.bin", "reference"]


# ---------------------------------------------------------------- CLI

def test_cli_runs_a_llama2c_checkpoint(exported):
    w, d = exported
    result = cli("--weights", str(d / "model.bin"), "--tok_path", str(d / "tokenizer.bin"), "--prompt",
                 "abc cab", "--n_dec", "8", "--temp", "0", "--terminate_on_eos", "0", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    tok = Llama2cTokenizer.from_file(d / "tokenizer.bin")
    assert out["generated_ids"] == greedy(Model(w, tok, "fast", 64), "abc cab", 8)
    assert cli("--weights", str(d / "model_q.bin"), "--prompt", "ab", "--n_dec", "4").returncode == 0
    dump = cli("--weights", str(d / "model.bin"), "--dump")
    assert dump.returncode == 0 and "lm_head" in dump.stdout and "Q8_0Tensor" in dump.stdout


def test_cli_convert_to_llama2c(tmp_path, exported):
    _, d = exported
    out = tmp_path / "out_q.bin"
    result = cli("convert", str(d / "model.bin"), str(out), "--to", "llama2c", "--version", "2",
                 "--group_size", "32")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == (d / "model_q.bin").read_bytes()
    back = tmp_path / "back.bin"
    assert cli("convert", str(out), "-o", str(back), "--to", "llama2c").returncode == 0
    assert read_llama2c(back).config == llama_config()
    assert_one_line_error(cli("convert", str(d / "model.bin"), str(tmp_path / "x.bin"), "--to", "llama2c",
                              "--version", "2", "--group_size", "48"), "group_size: found 48")
    assert_one_line_error(cli("convert", str(d / "model.bin"), "--to", "llama2c"), "give the output file")


def test_cli_bad_files_are_one_line_errors(tmp_path, good_files, exported):
    _, d = exported
    bad = tmp_path / "bad.bin"
    bad.write_bytes(good_files[0][:-1])
    assert_one_line_error(cli("--weights", str(bad), "--tok_path", str(d / "tokenizer.bin"), "--prompt", "a"),
                          str(bad), "too short")
    bad_tok = tmp_path / "tok.bin"
    bad_tok.write_bytes(tokenizer_bytes()[:-3])
    assert_one_line_error(cli("--weights", str(d / "model.bin"), "--tok_path", str(bad_tok), "--prompt", "a"),
                          str(bad_tok), "truncated")
    short_tok = tmp_path / "short.bin"
    short_tok.write_bytes(tokenizer_bytes(PIECES + [b"zz"], SCORES + [0.0]))
    assert_one_line_error(cli("--weights", str(d / "model.bin"), "--tok_path", str(short_tok), "--prompt", "a"),
                          "vocab_size = 275 does not match")


def test_convert_gguf_writes_tokenizer_bin(tmp_path):
    """A Llama-architecture GGUF with a SentencePiece vocab -> model.bin +
    tokenizer.bin, the vocab as llama2.c's tokenizer.py exports it."""
    c = llama_config()
    w = random_weights(c, q8=False)
    sp_pieces = (["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
                 + [p.decode("utf-8", "replace").replace(" ", "\u2581") for p in PIECES[259:]])
    sp_pieces[CONT4] = "x4"  # GGUF strings are UTF-8
    types = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    fields = {"general.architecture": "llama", "llama.context_length": 64, "llama.embedding_length": 64,
              "llama.block_count": 2, "llama.feed_forward_length": 96, "llama.attention.head_count": 4,
              "llama.attention.head_count_kv": 2, "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5),
              "llama.rope.freq_base": np.float32(10000.0), "tokenizer.ggml.model": "llama",
              "tokenizer.ggml.tokens": sp_pieces, "tokenizer.ggml.scores": np.array(SCORES, np.float32),
              "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.bos_token_id": 1,
              "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    write_gguf(tmp_path / "l.gguf", fields, gguf_tensors(w))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = cli("convert", str(tmp_path / "l.gguf"), str(out_dir / "m.bin"), "--to", "llama2c")
    assert result.returncode == 0, result.stderr
    back = read_llama2c_f32(out_dir / "m.bin")
    for name in w.tensors:
        assert np.array_equal(f32(back, name), f32(w, name)), name
    expected = list(PIECES)
    expected[CONT4] = b"x4"
    assert read_tokenizer_bin(out_dir / "tokenizer.bin")[0] == expected


def test_a_llama2c_model_can_be_held_to_a_grammar(exported):
    """Structured output on a tokenizer.bin vocabulary (docs/structured_output.md#the-vocabulary):
    byte pieces are their byte, <s> and </s> are marked special, and a regex holds."""
    pytest.importorskip("llguidance", reason="structured output needs llguidance (make test installs it)")
    import re

    import gemma_cy
    from gemma_cy.tokenizers.token_bytes import SPECIAL_MARK, token_bytes

    _, d = exported
    model = gemma_cy.load(str(d / "model.bin"), str(d / "tokenizer.bin"), max_cache_len=64)
    table = token_bytes(model.tokenizer)
    assert table[byte_id(ord("A"))] == b"A" and table[NL] == b"\n" and table[CONT4] == b"\x80\x80\x80\x80"
    assert table[1].startswith(SPECIAL_MARK) and table[2].startswith(SPECIAL_MARK)
    for seed in range(3):
        out = model.complete("ab", regex="[abc]{2,4}!", temperature=1.0, seed=seed, max_tokens=12)
        assert out.stop_reason == "grammar" and re.fullmatch("[abc]{2,4}!", out.text), out
