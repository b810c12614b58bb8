"""Chat templates (gemma_cy.tokenizers.chat): chosen from the model's tokenizer, applied
by Model.chat_ids, with a one-line error for a model that has none."""
import pytest

from gemma_cy.tokenizers.bpe import BPETokenizer
from gemma_cy.tokenizers.chat import CHATML, GEMMA, chat_format_for
from gemma_cy.errors import ParameterError
from helpers import bpe_hand_vocab

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bpe(template=None, drop_markers=False):
    tokens, types, merges = bpe_hand_vocab()
    if drop_markers:
        tokens = ["<|a|>", "<|b|>", "<|c|>"] + tokens[3:]
    return BPETokenizer(tokens, types, merges, 1, 2, chat_template=template)


def test_chatml_with_the_templates_default_system_message():
    chat = chat_format_for(bpe(SMOLLM2_TEMPLATE))
    assert (chat.user, chat.turn_end, chat.stop_pieces) == (CHATML.user, CHATML.turn_end, CHATML.stop_pieces)
    assert chat.first == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                          "Hugging Face<|im_end|>\n")
    escaped = SMOLLM2_TEMPLATE.replace("\n", "\\n")  # a template spelling newlines as \n
    assert chat_format_for(bpe(escaped)) == chat


def test_choice_by_template_then_by_vocabulary():
    assert chat_format_for(bpe("{{ '<|im_start|>' + m }}")) == CHATML
    assert chat_format_for(bpe("<start_of_turn>user")) == GEMMA
    assert chat_format_for(bpe("{{ messages }}")) is None
    assert chat_format_for(bpe(None)) == CHATML
    assert chat_format_for(bpe(None, drop_markers=True)) is None


def test_gemma_chat_ids_unchanged(tiny_model):
    tok = tiny_model.tokenizer
    assert tiny_model.chat == GEMMA and tok.add_bos
    assert tiny_model.chat_ids("hi") == ([tok.bos_id] + tok.encode("<start_of_turn>user\n", parse_special=True)
                                         + tok.encode("hi")
                                         + tok.encode("<end_of_turn>\n<start_of_turn>model\n", parse_special=True))
    assert tiny_model.stop_ids >= {tok.eos_id, tok.token_id("<end_of_turn>")}


def test_no_template_is_one_clear_error(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model, "chat", None)
    with pytest.raises(ParameterError, match="has no chat template"):
        tiny_model.prompt_ids("hi", chat_format=True)


def test_empty_prompt_is_bos_even_without_add_bos(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model.tokenizer, "add_bos", False)
    assert tiny_model.prompt_ids("") == [tiny_model.tokenizer.bos_id]
    assert tiny_model.prompt_ids("a b") == tiny_model.tokenizer.encode("a b")
    assert tiny_model.chat_ids("x")[0] != tiny_model.tokenizer.bos_id
