"""Tiny models of the architectures beyond the real files, made and proven offline (docs/model.md#architecture-oracles).

    .venv-oracle/bin/python scripts/make_arch_goldens.py --hf           # models, GGUFs, transformers' goldens
    .venv-peers/bin/python scripts/make_arch_goldens.py --llama_cpp     # quantized files, llama.cpp's greedy ids

No model can be downloaded here, so each architecture's proof is a model
made here: transformers builds a tiny random one from a config with every
feature of the architecture switched on, llama.cpp's own converter
(``convert_hf_to_gguf.py``, from llama-cpp-python's source distribution,
``LLAMA_CPP_VERSION``) writes it to GGUF at F32, BF16 and Q8_0, and
llama.cpp's quantizer (``llama_model_quantize``) makes Q4_K_M and Q6_K
from the F32 file. Into ``tests/goldens/arch/<arch>/`` go the files,
``greedy.json`` (per prompt: the ids, transformers' 64 greedy ids with
each step's margin and runner-up, its last-position top 20, again with
the weights rounded to bf16 as the BF16 file holds them; llama.cpp's 64 greedy ids
on the F32 and Q8_0 files, its KV cache in f32) and ``logits_<name>.npy`` (transformers' f32
last-position logits).

A byte-level BPE tokenizer is SmolLM2's with the family's own
normalizer and pre-tokenizer (Llama 3's "llama-bpe", Qwen's "qwen2"),
retrained by the ``tokenizers`` library to TOKENIZER_VOCAB tokens on the
repository's tokenizer corpus so the files stay small. The converter
recognizes a pre-tokenizer by hashing what a vocabulary makes of a test
text, and a retrained vocabulary's hash is new to it, so the run names
the rule it was trained with in place of that lookup; every other step
is the converter's own. Gemma's and Phi-3's vocabularies are SentencePiece
models trained here, Gemma 4's a merges BPE (``GemmaBPEVocab``).

The *_vocab models run a family's real vocabulary instead
(``RealVocab``: llama.cpp's ggml-vocab-<name>.gguf read by transformers)
with its released chat template; transformers' ids for a few chats go
into their greedy.json too. Their vocab x hidden tables make them large,
so they are narrow, those tables ternary, the F32 file alone kept
(xz-compressed, ``COMPRESSED``) and the logits kept for a sample of ids.

Weights: transformers' initialization scaled by WEIGHT_SCALE, so that the
random model's logits spread and greedy decoding is not a run of near
ties; the seed is fixed, so the same versions make the same files.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "arch"
LLAMA_CPP_VERSION = "0.3.36"
TOKENIZER_VOCAB = 512
SP_VOCAB = 1024  # the trainer keeps every character of 98% coverage: more than 512 on this corpus
WEIGHT_SCALE = 4.0
SEED = 20261206
N_GREEDY = 64
OUTTYPES = ("f32", "bf16", "q8_0")  # the converter's; Q4_K_M and Q6_K come from the quantizer
LOGITS_SAMPLE_ABOVE = 4096  # a vocabulary this large keeps a sample of the logits (the files stay small)
LOGITS_STRIDE = 37
KV_F32 = 0  # GGML_TYPE_F32: llama.cpp's KV cache in f32, not its default f16, as gemma-cy and transformers keep it
QUANTIZED = {"q4_k_m": 15, "q6_k": 18}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q4_K_M, LLAMA_FTYPE_MOSTLY_Q6_K

PROMPTS = [
    ("story", "Once upon a time, in a small village by the sea,"),
    ("numbers", "The first ten prime numbers are 2, 3, 5, 7, 11,"),
    ("code", "def add(a, b):\n    return"),
    ("list", "Shopping list:\n- apples\n- bread\n-"),
    ("french", "Le petit chat dort sur le canapé, et"),
    ("question", "Q: What is the capital of France?\nA:"),
    ("json", '{"name": "Alice", "age": 30, "city":'),
    ("long", "The licenses for most software and other practical works are designed to take away your "
             "freedom to share and change the works. By contrast, the GNU General Public License is intended "
             "to guarantee your freedom to share and change all versions of a program"),
]


def qwen3_config():
    """Qwen 3 (dense): per-head q/k RMSNorm, head_dim set apart from
    hidden_size / heads (64, not 32), grouped-query attention, tied
    embeddings. Rows of 128 are too short for the K-quants' blocks of 256,
    so llama.cpp's quantizer gives those tensors its fallback types (the
    K-quant kernels are proven on Gemma 3's real file); the files stay
    small (4 MB in all)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=TOKENIZER_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                       rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
                       bos_token_id=None, eos_token_id=0, pad_token_id=None)


def gemma2_config():
    """Gemma 2: sandwich norms, GELU-tanh, a sliding window on every other
    layer shorter than the test prompts, soft-caps low enough to bend the
    scores and logits of this small model, query_pre_attn_scalar = head_dim
    (llama.cpp's rule for every size but the 27B)."""
    from transformers import Gemma2Config

    return Gemma2Config(vocab_size=TOKENIZER_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                        rms_norm_eps=1e-6, query_pre_attn_scalar=64, sliding_window=16,
                        attn_logit_softcapping=10.0, final_logit_softcapping=3.0,
                        hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1, bos_token_id=2)


def gemma_config():
    """Gemma (1): GELU-tanh GeGLU, embedding scale, one key/value head (as
    the 2B), head_dim apart from hidden_size / heads."""
    from transformers import GemmaConfig

    return GemmaConfig(vocab_size=TOKENIZER_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                       rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1,
                       bos_token_id=2)


def llama3_config():
    """Llama 3.x: its RoPE scaling ("llama3": per-pair frequency divisors,
    written by the converter as the rope_freqs tensor) with the original
    context set to 64 positions, so that the divisors run through all three
    of their regimes (1, the smooth ramp, the full factor) over the 16 pairs
    of a head; grouped-query attention, tied embeddings (as the 1B and 3B).
    Half as wide as the first models: the files stay under 0.6 MB each."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                       rms_norm_eps=1e-5, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64},
                       bos_token_id=None, eos_token_id=0, pad_token_id=None)


def qwen2_config():
    """Qwen 2 / 2.5: biases on the q, k and v projections (drawn at random
    below: transformers starts them at zero, which would prove nothing),
    grouped-query attention, tied embeddings (as the 0.5B)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
                       bos_token_id=None, eos_token_id=0, pad_token_id=None)


def phi3_config():
    """Phi-3 / Phi-4-mini: fused q/k/v and gate/up matrices (transformers
    holds them fused too), RoPE over the first 3/4 of each head (Phi-4-mini's
    partial_rotary_factor), LongRoPE with short and long factors and the
    attention factor of a 4x longer context (the context used stays within
    the original 512 positions, where both transformers and llama.cpp take
    the short factors), untied lm_head."""
    from transformers import Phi3Config

    return Phi3Config(vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      original_max_position_embeddings=512, partial_rotary_factor=0.75, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0, 1.3, 1.9, 2.5, 3.7, 5.0],
                                       "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]},
                      sliding_window=None, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                      bos_token_id=2)


def gemma4_config():
    """Gemma 4 (text): six layers, local and global (pattern 3) with a
    window of 8, shorter than every prompt; the global layers' heads twice
    as wide (32) with v taken from k's projection (attention_k_eq_v) and
    "proportional" RoPE over a quarter of the head; the last three layers
    reading the caches of layers 1 and 2 (num_kv_shared_layers: the layer
    before them global, as in the released models, where llama.cpp's fixed
    offsets and transformers' "last layer of the same kind" agree) with a
    double-wide MLP; per-layer inputs of 32; a final soft-cap of 5. No
    mixture-of-experts block (not yet implemented)."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2, sliding_window=8,
        final_logit_softcapping=5.0, hidden_size_per_layer_input=32, vocab_size_per_layer_input=TOKENIZER_VOCAB,
        attention_k_eq_v=True, num_kv_shared_layers=3, use_double_wide_mlp=True, rms_norm_eps=1e-6,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)


def gemma4_moe_config():
    """Gemma 4 with the expert block (as the 26B-A4B): three layers (local,
    local, global; window 8), two head sizes with v from k on the global
    layer, and beside each layer's MLP 4 experts of width 64, 2 chosen per
    position by the router (its scale and the per-expert scales drawn
    around 1 with the gains); no per-layer inputs, no shared caches."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=8,
        final_logit_softcapping=5.0, hidden_size_per_layer_input=0, attention_k_eq_v=True, num_kv_shared_layers=0,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64, rms_norm_eps=1e-6,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)


def gemma3_linear_config():
    """Gemma 3 as the 4B, 12B and 27B are: linear RoPE scaling, factor 8, on
    the global layers only (rope_parameters "full_attention"; the local ones
    keep base 10000 unscaled). Six layers, the sixth global (pattern 6, the
    converter writes no pattern for Gemma 3), a window of 8 shorter than
    every prompt, q/k norms, sandwich norms."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        query_pre_attn_scalar=16, sliding_window=8, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)


def gemma4_mixed_config():
    """Gemma 4 with a layer pattern no period describes: global, local,
    global, then three layers sharing caches (local, local, global), so each
    kind's source is the last earlier layer of its kind (1 and 2; there
    llama.cpp's fixed offsets agree with transformers). The file stores one
    flag per layer; everything else as ``gemma4_config``."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=512,
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"], sliding_window=8,
        final_logit_softcapping=5.0, hidden_size_per_layer_input=32, vocab_size_per_layer_input=TOKENIZER_VOCAB,
        attention_k_eq_v=True, num_kv_shared_layers=3, use_double_wide_mlp=True, rms_norm_eps=1e-6,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)


def narrow(make_config, **sizes):
    """``make_config`` with other sizes: the models on a real vocabulary are
    kept narrow, as their embedding table is vocab x hidden_size."""
    def make():
        config = make_config()
        for key, value in sizes.items():
            setattr(config, key, value)
        return config
    make.__doc__ = f"{make_config.__doc__} Sizes: {sizes}."
    return make


# arch -> (its transformers config, its vocabulary: "bpe:<rule>" (SmolLM2's, with that pre-tokenizer), "sp" (Gemma's SentencePiece),
# "sp_llama" (SentencePiece with Llama's settings: Phi-3's) or "gemma_bpe" (Gemma 4's merges BPE))
ARCHS = {"qwen3": (qwen3_config, "bpe:qwen2"), "gemma2": (gemma2_config, "sp"), "gemma": (gemma_config, "sp"),
         "llama3": (llama3_config, "bpe:llama-bpe"), "qwen2": (qwen2_config, "bpe:qwen2"),
         "phi3": (phi3_config, "sp_llama"),
         "gemma4": (gemma4_config, "gemma_bpe"), "gemma4_moe": (gemma4_moe_config, "gemma_bpe"),
         "gemma3_linear": (gemma3_linear_config, "sp"), "gemma4_mixed": (gemma4_mixed_config, "gemma_bpe"),
         # the families' own vocabularies (llama.cpp's ggml-vocab-<name>.gguf) and chat templates (its
         # models/templates/<file>): "real:<name>:<file>"
         "qwen2_vocab": (narrow(qwen2_config, hidden_size=32, intermediate_size=64), "real:qwen2:Qwen-Qwen2.5-7B-Instruct.jinja"),
         "qwen3_vocab": (narrow(qwen3_config, hidden_size=32, intermediate_size=64, head_dim=32),
                         "real:qwen2:Qwen-Qwen3-0.6B.jinja"),
         "phi3_vocab": (phi3_config, "real:phi-3:microsoft-Phi-3.5-mini-instruct.jinja")}
CHATS = ("user", "system", "multi_turn", "no_generation_prompt", "no_thinking")  # make_template_goldens' cases
# Files per architecture: every converter and quantizer type, but for Gemma 4 (F32 and Q8_0: the BF16
# reading is proven on the others), whose per-layer
# embedding would make them large and whose rows of 64 leave the K-quants to their fallbacks anyway.
ARCH_OUTTYPES = {"gemma4": ("f32", "q8_0"), "gemma4_moe": ("f32", "q8_0"), "gemma3_linear": ("f32", "q8_0"),
                 "gemma4_mixed": ("f32", "q8_0"), "qwen2_vocab": ("f32",), "qwen3_vocab": ("f32",),
                 "phi3_vocab": ("f32",)}
# Files kept compressed (xz): those whose real vocabulary makes them large; the tests unpack them.
COMPRESSED = ("qwen2_vocab", "qwen3_vocab", "phi3_vocab")
GEMMA4_GAIN_STD = 0.3  # Gemma 4's gains are used as stored (x * w): drawn around 1 so that they matter
BIAS_SCALE = 0.5  # std of the random q/k/v biases


def converter_source() -> Path:
    """llama.cpp's converter (convert_hf_to_gguf.py, conversion/, gguf-py/)
    from llama-cpp-python's source distribution, fetched and unpacked once
    (tests/llama_cpp_source.py, the copy the tests read too)."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # (gemma_cy for its cache directory)
    from llama_cpp_source import llama_cpp_dir

    return llama_cpp_dir("convert_hf_to_gguf.py", "conversion", "gguf-py")


CONVERT = """
import sys
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
sys.path.insert(0, {llama!r})
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}  # the rule the vocabulary was trained with
convert_hf_to_gguf.main()
"""


class BPEVocab:
    """SmolLM2's tokenizer (from its GGUF, digits split as SmolLM2's own
    tokenizer.json does), retrained to TOKENIZER_VOCAB tokens; with another
    ``rule`` (a llama.cpp pre-tokenizer name), its normalizer and
    pre-tokenizer replaced by that family's first (make_bpe_pre_goldens'
    pipelines: Llama 3's "llama-bpe", Qwen's "qwen2"), so the file names
    the rule its models' files name."""

    def __init__(self, rule: str = "smollm"):
        from make_bpe_pre_goldens import pipelines
        from make_smollm2_goldens import gguf_path, smollm2_corpus, split_digits
        from make_tokenizer_goldens import load_hf_tokenizer

        base = load_hf_tokenizer(gguf_path())
        split_digits(base)
        normalizer, pre, ignore_merges = pipelines()[rule]
        if rule != "smollm":
            if normalizer is not None:
                base.backend_tokenizer.normalizer = normalizer
            base.backend_tokenizer.pre_tokenizer = pre
        texts = smollm2_corpus() + [text for _, text in PROMPTS]
        self.tok = base.train_new_from_iterator(texts * 4, vocab_size=TOKENIZER_VOCAB,
                                                new_special_tokens=["<|endoftext|>"])
        self.tok.backend_tokenizer.model.ignore_merges = ignore_merges
        self.rule = rule
        self.size = len(self.tok)
        self.eos_id = self.tok.convert_tokens_to_ids("<|endoftext|>")

    def save(self, directory: str) -> None:
        self.tok.save_pretrained(directory)

    def encode(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


class GemmaBPEVocab:
    """Gemma 4's tokenizer: transformers' GemmaTokenizer (a BPE with ranked
    merges and byte fallback over text with spaces as U+2581) over a
    vocabulary the ``tokenizers`` trainer makes here: Gemma's specials, the
    256 byte tokens, merges up to TOKENIZER_VOCAB; the converter writes it
    as ``tokenizer.ggml.model`` "gemma4" with its merges."""

    def __init__(self):
        import json as _json

        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
        from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

        from make_smollm2_goldens import smollm2_corpus

        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        bpe.normalizer = normalizers.Replace(" ", "\u2581")
        bpe.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, limit_alphabet=120, show_progress=False,
                                      special_tokens=specials + [f"<0x{b:02X}>" for b in range(256)])
        bpe.train_from_iterator((smollm2_corpus() + [text for _, text in PROMPTS]) * 2, trainer)
        merges = _json.loads(bpe.to_str())["model"]["merges"]
        self.tok = GemmaTokenizer(vocab=bpe.get_vocab(), merges=[tuple(m) if isinstance(m, list)
                                                                  else tuple(m.split(" ")) for m in merges])
        self.size, self.eos_id = len(self.tok), self.tok.convert_tokens_to_ids("<eos>")
        self.bos_id = self.tok.convert_tokens_to_ids("<bos>")

    def save(self, directory: str) -> None:
        self.tok.save_pretrained(directory)

    def encode(self, text: str) -> list[int]:
        """BOS first, as the file says (add_bos_token: a GemmaTokenizer made
        from a vocabulary and merges adds none of its own)."""
        return [self.bos_id] + self.tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


class SPVocab:
    """A SentencePiece BPE model with Gemma's settings (no dummy prefix,
    byte fallback, digits split, whitespace kept; pad 0, eos 1, bos 2, unk
    3, Gemma's turn markers as control pieces), trained by the
    ``sentencepiece`` trainer to TOKENIZER_VOCAB pieces on the corpus; the
    oracle of its ids is that library (BOS first, as Gemma's files say).
    ``llama_settings``: Llama 2's (and Phi-3's) instead: the dummy prefix,
    the library's default whitespace handling kept but for runs of spaces
    (Llama's model keeps them), and no turn markers."""

    def __init__(self, llama_settings: bool = False):
        import io

        import sentencepiece as spm

        from make_smollm2_goldens import smollm2_corpus

        model = io.BytesIO()
        texts = [t for t in smollm2_corpus() + [text for _, text in PROMPTS] if t.strip()]
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts * 4), model_writer=model, vocab_size=SP_VOCAB, model_type="bpe",
            byte_fallback=True, split_digits=True, add_dummy_prefix=llama_settings,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, character_coverage=0.98,
            pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
            unk_piece="<unk>", control_symbols=[] if llama_settings else ["<start_of_turn>", "<end_of_turn>"],
            max_sentence_length=1 << 16, num_threads=1, minloglevel=2)
        self.proto = model.getvalue()
        self.sp = spm.SentencePieceProcessor(model_proto=self.proto)
        self.size, self.eos_id = self.sp.get_piece_size(), self.sp.eos_id()
        self.unk_id = self.sp.unk_id()  # (config.json names it: the converter finds no tokenizer.json here)

    def save(self, directory: str) -> None:
        Path(directory, "tokenizer.model").write_bytes(self.proto)

    def encode(self, text: str) -> list[int]:
        return [self.sp.bos_id()] + self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)


class RealVocab:
    """A family's own vocabulary: llama.cpp's ``models/ggml-vocab-<name>.gguf``
    (its converter's output on the model's real HF tokenizer, with the test
    pairs HF's ids came from), read back by transformers
    (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, whose ids equal
    those pairs: checked here). Saved for the converter as transformers
    saves it; a SentencePiece vocabulary (Phi-3's) also as the
    ``tokenizer.model`` its converter reads, rebuilt from the GGUF's pieces,
    scores and types with Llama's settings."""

    def __init__(self, name: str, template: str):
        from transformers import AutoTokenizer

        models = converter_source() / "models"
        self.path = models / f"ggml-vocab-{name}.gguf"
        self.tok = AutoTokenizer.from_pretrained(str(models), gguf_file=self.path.name)
        self.name, self.rule = name, {"qwen2": "qwen2"}.get(name, "default")
        self.size, self.eos_id = len(self.tok), self.tok.eos_token_id
        texts = self.path.with_name(self.path.name + ".inp").read_text(encoding="utf-8").split(
            "\n__ggml_vocab_test__\n")
        pairs = self.path.with_name(self.path.name + ".out").read_text(encoding="utf-8").split("\n")
        wrong = [t for t, ids in zip(texts, pairs) if self.tok.encode(t, add_special_tokens=False)
                 != [int(i) for i in ids.split()]]
        if wrong:
            raise SystemExit(f"{name}: transformers' tokenizer from the GGUF misses the test pairs on {wrong[:3]}")
        self.template = template  # the released model's own chat template, saved with the tokenizer
        self.tok.chat_template = (models / "templates" / template).read_text(encoding="utf-8")

    def chats(self) -> list[dict]:
        """transformers' ids for CHATS in this template (apply_chat_template, tokenize=True)."""
        from make_template_goldens import CASES

        out = []
        for case in CHATS:
            messages, add_generation_prompt, _, extra = CASES[case]
            ids = self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                               tokenize=True, return_dict=False, **extra)
            out.append({"name": case, "messages": messages, "add_generation_prompt": add_generation_prompt,
                        "template_kwargs": extra, "ids": [int(i) for i in ids]})
        return out

    def save(self, directory: str) -> None:
        self.tok.save_pretrained(directory)
        if self.name == "phi-3":
            Path(directory, "tokenizer.model").write_bytes(self.sentencepiece_model())

    def sentencepiece_model(self) -> bytes:
        """The SentencePiece BPE model of the GGUF's base pieces (the ids
        before the added tokens), Llama's normalizer settings."""
        from gguf import GGUFReader
        from sentencepiece import sentencepiece_model_pb2 as pb

        reader = GGUFReader(str(self.path))

        def array(key):
            f = reader.fields[key]
            return [f.parts[i] for i in f.data]

        tokens = [bytes(t).decode() for t in array("tokenizer.ggml.tokens")]
        scores = [float(v[0]) for v in array("tokenizer.ggml.scores")]
        types = [int(v[0]) for v in array("tokenizer.ggml.token_type")]
        base = next(i for i, t in enumerate(tokens) if t == "<|endoftext|>")  # Phi-3's first added token
        m = pb.ModelProto()
        for i in range(base):
            kind = 2 if i == 0 else 3 if tokens[i] in ("<s>", "</s>") else types[i]
            m.pieces.add(piece=tokens[i], score=scores[i], type=kind)
        m.trainer_spec.model_type = pb.TrainerSpec.BPE
        m.trainer_spec.vocab_size = base
        m.trainer_spec.byte_fallback = True
        m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
        m.normalizer_spec.name = "identity"
        m.normalizer_spec.add_dummy_prefix = True
        m.normalizer_spec.remove_extra_whitespaces = False
        m.normalizer_spec.escape_whitespaces = True
        return m.SerializeToString()

    def encode(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def make_hf(arch: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    make_config, kind = ARCHS[arch]
    if kind.startswith("real:"):
        tok = RealVocab(*kind.partition(":")[2].split(":"))
    elif kind.startswith("bpe"):
        tok = BPEVocab(kind.partition(":")[2] or "smollm")
    else:
        tok = GemmaBPEVocab() if kind == "gemma_bpe" else SPVocab(llama_settings=kind == "sp_llama")
    config = make_config()
    config.vocab_size = tok.size
    config.eos_token_id = tok.eos_id
    if hasattr(tok, "unk_id"):
        config.unk_token_id = tok.unk_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(WEIGHT_SCALE)
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_SCALE)
            elif arch.startswith("gemma4"):
                p.normal_(1.0, GEMMA4_GAIN_STD)
            elif arch.startswith("gemma3"):  # stored as w, used as 1 + w: drawn around 0
                p.normal_(0.0, GEMMA4_GAIN_STD)
        if arch in COMPRESSED:  # the vocab x hidden tables: ternary (-s, 0, s), so that xz packs them small
            for name, p in model.named_parameters():
                if p.dim() == 2 and p.shape[0] == config.vocab_size:
                    scale = float(p.abs().mean()) * 1.5
                    p.copy_(torch.randint(-1, 2, p.shape, dtype=torch.float32) * scale)
        for name, b in model.named_buffers():
            if arch.startswith("gemma4") and name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save(tmp)
        llama = converter_source()
        env = dict(os.environ, PYTHONPATH=str(llama / "gguf-py"))
        for outtype in ARCH_OUTTYPES.get(arch, OUTTYPES):
            code = CONVERT.format(llama=str(llama), pre=getattr(tok, "rule", "smollm"))
            subprocess.run([sys.executable, "-c", code, tmp, "--outtype", outtype,
                            "--outfile", str(out / f"model-{outtype}.gguf")], check=True, env=env)
    if arch in COMPRESSED:
        for outtype in ARCH_OUTTYPES[arch]:
            pack(out / f"model-{outtype}.gguf")
    records = oracle_records(model, tok, out, "")
    records_bf16 = []
    if "bf16" in ARCH_OUTTYPES.get(arch, OUTTYPES):
        with torch.no_grad():  # the weights the BF16 file holds, in f32: its own oracle (vectors stay F32 there)
            for p in model.parameters():
                if p.dim() > 1:
                    p.copy_(p.to(torch.bfloat16).float())
        records_bf16 = oracle_records(model, tok, out, "_bf16")
    import transformers
    header = {"arch": arch, "oracle": f"transformers {transformers.__version__}, torch {torch.__version__}, f32, "
                                      f"eager attention", "converter": f"llama-cpp-python {LLAMA_CPP_VERSION}",
              "config": config.to_dict(), "seed": SEED, "weight_scale": WEIGHT_SCALE, "n_greedy": N_GREEDY}
    if isinstance(tok, RealVocab):
        header.update(vocabulary=tok.path.name, chat_template=tok.template, chats=tok.chats())
    (out / "greedy.json").write_text(json.dumps({**header, "prompts": records, "prompts_bf16": records_bf16},
                                                indent=1, default=str))


def pack(path: Path) -> None:
    """``path`` -> ``path.xz`` (the tests unpack it; llama.cpp's step unpacks it again)."""
    import lzma

    Path(str(path) + ".xz").write_bytes(lzma.compress(path.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
    path.unlink()


def unpacked(path: Path) -> Path:
    """``path``, from ``path.xz`` into a temporary file when only that exists."""
    import lzma

    if path.exists():
        return path
    tmp = Path(tempfile.mkdtemp()) / path.name
    tmp.write_bytes(lzma.decompress(Path(str(path) + ".xz").read_bytes()))
    return tmp


def oracle_records(model, tok, out: Path, suffix: str) -> list[dict]:
    """Per prompt: its ids, the last position's logits (logits<suffix>_<name>.npy),
    N_GREEDY greedy ids with each step's top-1/top-2 margin and runner-up
    (every step one cache-free forward of the whole context), the top 20."""
    import torch

    from make_model_goldens import top2

    records = []
    with torch.inference_mode():
        for name, text in PROMPTS:
            ids = tok.encode(text)
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            sample = None  # a real vocabulary's logits: every LOGITS_STRIDE-th id and the top 20, not all
            if len(logits) > LOGITS_SAMPLE_ABOVE:
                top = torch.topk(logits, 20).indices.tolist()
                sample = sorted(set(range(0, len(logits), LOGITS_STRIDE)) | set(top))
            kept = logits.numpy() if sample is None else logits.numpy()[sample]
            np.save(out / f"logits{suffix}_{name}.npy", kept.astype(np.float32))
            gen, margins, second, ctx = [], [], [], list(ids)
            for _ in range(N_GREEDY):
                step = model(torch.tensor([ctx])).logits[0, -1].float()
                best, runner_up, margin = top2(step)
                gen.append(best)
                second.append(runner_up)
                margins.append(margin)
                ctx.append(best)
            values, indices = torch.topk(logits, 20)
            records.append({"name": name, "text": text, "prompt_ids": ids, "greedy_ids": gen,
                            "step_margins": margins, "step_second_ids": second,
                            "top20_ids": [int(i) for i in indices], "top20_logits": [float(v) for v in values],
                            "logits_file": f"logits{suffix}_{name}.npy",
                            **({"logits_ids": sample} if sample is not None else {})})
            print(f"{name}{suffix}: {len(ids)} ids, min margin {min(margins):.3f}: {tok.decode(gen)!r}",
                  file=sys.stderr)
    return records


def make_llama_cpp(arch: str, out: Path) -> None:
    """Q4_K_M and Q6_K from the F32 file; llama.cpp's greedy ids on the F32 and Q8_0 files."""
    import llama_cpp

    for name, ftype in QUANTIZED.items() if arch not in ARCH_OUTTYPES else ():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 1
        if llama_cpp.llama_model_quantize(str(out / "model-f32.gguf").encode(),
                                          str(out / f"model-{name}.gguf").encode(), params) != 0:
            raise SystemExit(f"quantizing to {name} failed")
    golden = json.loads((out / "greedy.json").read_text())
    for kind in [k for k in ("f32", "q8_0") if k in ARCH_OUTTYPES.get(arch, OUTTYPES)]:
        llm = llama_cpp.Llama(model_path=str(unpacked(out / f"model-{kind}.gguf")), n_ctx=512, n_threads=1,
                              n_threads_batch=1, verbose=False, logits_all=False, type_k=KV_F32, type_v=KV_F32)
        for rec in golden["prompts"]:
            llm.reset()
            gen = []
            for token in llm.generate(rec["prompt_ids"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                      repeat_penalty=1.0, reset=True):
                gen.append(int(token))
                if len(gen) == N_GREEDY:
                    break
            rec[f"llama_cpp_{kind}"] = gen
    golden["llama_cpp"] = f"llama-cpp-python {llama_cpp.__version__}, one thread, f32 KV cache"
    (out / "greedy.json").write_text(json.dumps(golden, indent=1, default=str))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf", action="store_true", help="build the models and transformers' goldens")
    p.add_argument("--llama_cpp", action="store_true", help="quantize and record llama.cpp's greedy ids")
    p.add_argument("--arch", default=",".join(ARCHS))
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for arch in args.arch.split(","):
        if args.hf:
            make_hf(arch, OUT / arch)
        if args.llama_cpp:
            make_llama_cpp(arch, OUT / arch)


if __name__ == "__main__":
    main()
