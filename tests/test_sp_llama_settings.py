"""A SentencePiece vocabulary with Llama's settings (dummy prefix, byte
fallback, digits split: Llama 2, TinyLlama, Mistral, Phi-3), trained here
with the `sentencepiece` trainer and written to a GGUF as llama.cpp's
converter writes it, encodes and decodes exactly as the `sentencepiece`
library does (docs/model.md#tokenizer-settings)."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (make test installs it)")

from gemma_cy.formats.gguf_writer import write_gguf  # noqa: E402
from gemma_cy.tokenizers.sp import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN,  # noqa: E402
                                    TOKEN_UNUSED, SentencePieceTokenizer)
from helpers import GOLDENS  # noqa: E402

EXTRA = ["Hello world", " leading space", "  two leading", "trailing  ", "12345 and 3.14159", "tab\there",
         "line\nbreak\n\nparagraph", "naïve café 東京 😀 Ω", "ǅ unusual ↯ ⟁ characters", "\u2581literal", "x"]


def corpus() -> list[str]:
    """The repository's tokenizer corpus (the texts of the Gemma 3 goldens) and a few more."""
    with open(GOLDENS / "gemma3_tokenizer.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return [t for t in texts if "\x00" not in t] + EXTRA


@pytest.fixture(scope="module")
def trained():
    """A BPE model trained with Llama's settings on the corpus."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for t in corpus() if t.strip()] * 3), model_writer=model, vocab_size=2000,
        model_type="bpe", byte_fallback=True, split_digits=True, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        character_coverage=0.99, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=1 << 16,
        num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def converted(sp, path, space_prefix: bool | None) -> str:
    """``sp`` as llama.cpp's convert_hf_to_gguf.py writes a SentencePiece
    vocabulary: every piece, its score and type, the special ids, and
    add_space_prefix from the model's add_dummy_prefix (None: the key left
    out, as older converters did)."""
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(TOKEN_UNKNOWN if sp.is_unknown(i) else TOKEN_CONTROL if sp.is_control(i) else
                     TOKEN_UNUSED if sp.is_unused(i) else TOKEN_BYTE if sp.is_byte(i) else TOKEN_NORMAL)
    fields = {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
              "tokenizer.ggml.scores": np.array(scores, np.float32),
              "tokenizer.ggml.token_type": np.array(types, np.int32),
              "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
              "tokenizer.ggml.unknown_token_id": sp.unk_id(), "tokenizer.ggml.add_bos_token": True,
              "tokenizer.ggml.add_eos_token": False}
    if space_prefix is not None:
        fields["tokenizer.ggml.add_space_prefix"] = space_prefix
    write_gguf(path, fields, [])
    return str(path)


@pytest.mark.parametrize("space_prefix", [True, None])
def test_llama_settings_encode_as_sentencepiece(trained, tmp_path, space_prefix):
    tok = SentencePieceTokenizer.from_gguf(converted(trained, tmp_path / "v.gguf", space_prefix))
    assert tok.add_space_prefix and tok.add_bos and not tok.add_eos
    texts = corpus()
    assert sum(trained.is_byte(i) for t in texts for i in trained.encode(t)) > 0  # byte fallback exercised
    for text in texts:
        ids = trained.encode(text)
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == trained.decode(ids), text


def test_without_the_prefix_the_text_is_read_as_it_is(trained, tmp_path):
    """add_space_prefix false (Gemma's setting): no space before the text,
    what the trainer's model gives for a text that does not start a line."""
    tok = SentencePieceTokenizer.from_gguf(converted(trained, tmp_path / "v.gguf", False))
    with_prefix = SentencePieceTokenizer.from_gguf(converted(trained, tmp_path / "w.gguf", True))
    assert tok.encode("Hello world") != with_prefix.encode("Hello world")
    assert tok.encode(" Hello world") == with_prefix.encode("Hello world")
