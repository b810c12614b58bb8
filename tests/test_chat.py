"""Chat templates (gemma_cy.tokenizers.chat): chosen from the model's tokenizer,
rendered with jinja2 in its sandbox, tokenized with the template's markers as
control tokens and the messages' text as plain text. The token ids of real
models' templates are checked against transformers in test_chat_goldens.py."""
import pytest

from gemma_cy.errors import ParameterError, TemplateError
from gemma_cy.tokenizers.bpe import BPETokenizer
from gemma_cy.tokenizers.chat import (CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate, chat_ids,
                                      chat_template_for, check_messages, render)
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


def user(text):
    return [{"role": "user", "content": text}]


def test_choice_by_the_files_template_then_by_vocabulary():
    own = chat_template_for(bpe(SMOLLM2_TEMPLATE))
    assert (own.name, own.source, own.stop_pieces) == ("file", SMOLLM2_TEMPLATE, ("<|im_end|>", "<|endoftext|>"))
    assert chat_template_for(bpe(None)).name == "chatml"
    assert chat_template_for(bpe(None, drop_markers=True)) is None


def test_builtin_gemma_template_on_the_tiny_model(tiny_model):
    tok = tiny_model.tokenizer
    assert tiny_model.chat_template.name == "gemma" and tok.add_bos
    special = lambda s: tok.encode(s, parse_special=True)  # noqa: E731
    want = ([tok.bos_id] + special("<start_of_turn>user\n") + tok.encode("hi")
            + special("<end_of_turn>\n<start_of_turn>model\n"))
    assert tiny_model.chat_ids("hi") == want
    assert tiny_model.chat_ids(user("  hi \n")) == want  # Gemma's template trims the content
    assert tiny_model.stop_ids >= {tok.eos_id, tok.token_id("<end_of_turn>")}


def test_gemma_system_message_and_turns(tiny_model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    text = render(tiny_model.chat_template, check_messages(messages), tiny_model.tokenizer)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello."
                    "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert tiny_model.chat_ids("Hi", system="Be brief.") == tiny_model.chat_ids(messages[:2])


def test_roles_must_alternate_is_the_templates_one_line_error(tiny_model):
    with pytest.raises(TemplateError, match="roles must alternate"):
        tiny_model.chat_ids([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_control_pieces_typed_in_content_stay_text(tiny_model):
    tok = tiny_model.tokenizer
    end = tok.token_id("<end_of_turn>")
    ids = tiny_model.chat_ids("a<end_of_turn>b<bos>")
    plain = tok.encode("a<end_of_turn>b<bos>")
    assert ids.count(end) == 1 and ids.count(tok.bos_id) == 1  # the template's own markers only
    start = len([tok.bos_id] + tok.encode("<start_of_turn>user\n", parse_special=True))
    assert ids[start:start + len(plain)] == plain


def test_smollm2_template_writes_its_default_system_message():
    tok = bpe(SMOLLM2_TEMPLATE)
    template = chat_template_for(tok)
    assert render(template, user("hi"), tok) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    with_system = [{"role": "system", "content": "S"}] + user("hi")
    assert render(template, with_system, tok, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    ids = chat_ids(tok, template, user("hi"))
    assert ids[0] == tok.token_id("<|im_start|>") and ids[-1] == tok.encode("\n")[-1]


def test_builtin_chatml():
    tok = bpe(None)
    assert render(chat_template_for(tok), user("x"), tok) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert CHATML_TEMPLATE != GEMMA_TEMPLATE


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__ }}",
    "{{ ''.__class__ }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{% set x = messages.append({'role': 'x'}) %}",  # the sandbox is immutable too
])
def test_hostile_templates_are_refused_by_the_sandbox(source):
    tok = bpe(source)
    with pytest.raises(TemplateError) as e:
        chat_ids(tok, chat_template_for(tok), user("hi"))
    message = str(e.value)
    assert "\n" not in message and "chat template" in message
    assert "object" not in message or "unsafe" in message or "immutable" in message


@pytest.mark.parametrize("source, match", [
    ("{% for %}", "TemplateSyntaxError"),
    ("{{ messages[5]['content'] }}", "chat template"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ raise_exception('no tools here') }}", "no tools here"),
])
def test_broken_templates_are_one_line_errors(source, match):
    tok = bpe(source)
    with pytest.raises(TemplateError, match=match) as e:
        chat_ids(tok, chat_template_for(tok), user("hi"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("messages", [
    "hi", [], [{"role": "user"}], [{"role": "user", "content": 5}], [("user", "hi")], None,
])
def test_bad_messages_are_one_line_errors(messages):
    with pytest.raises(ParameterError, match="messages"):
        check_messages(messages)


def test_no_template_is_one_clear_error(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model, "chat_template", None)
    with pytest.raises(ParameterError, match="has no chat template"):
        tiny_model.prompt_ids("hi", chat_format=True)


def test_template_with_tojson_and_loop_controls():
    source = ("{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
              "{{ m | tojson }}{% endfor %}")
    tok = bpe(source)
    out = render(ChatTemplate("file", source, ()), check_messages(
        [{"role": "skip", "content": "x"}, {"role": "user", "content": "é"}]), tok)
    assert out == '{"role": "user", "content": "é"}'


def test_empty_prompt_is_bos_even_without_add_bos(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model.tokenizer, "add_bos", False)
    assert tiny_model.prompt_ids("") == [tiny_model.tokenizer.bos_id]
    assert tiny_model.prompt_ids("a b") == tiny_model.tokenizer.encode("a b")


@pytest.mark.parametrize("source, match", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took more than"),
    ("{{ 'a' * 10000000000 }}", "repeating"),
    ("{{ messages * 10000000 }}", "repeating"),
    ("{% set s = namespace(t='a') %}{% for i in range(100) %}{% set s.t = s.t + s.t %}{% endfor %}{{ s.t }}",
     "joining"),
    ("{{ 2 ** 100000000 }}", "too large"),
    ("{% for i in range(100000) %}{{ 'aaaaaaaaaaaaaaaaaaaa' }}{% endfor %}", "passed"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
])
def test_template_resource_bombs_end_in_one_line(source, match):
    """A template is code from a downloaded file: besides the sandbox's
    rules it has a deadline, an output cap and a cap on what * and + build."""
    import time
    tok = bpe(source)
    start = time.monotonic()
    with pytest.raises(TemplateError, match=match) as e:
        chat_ids(tok, chat_template_for(tok), user("hi"))
    assert "\n" not in str(e.value) and time.monotonic() - start < 5


@pytest.mark.parametrize("tools, kwargs, needle", [
    ("get_weather", None, "tools must be a list of dicts"),
    ([1], None, "tools\\[0\\] must be a dict"),
    ([{"f": object()}], None, "tools\\[0\\].f: object is not JSON data"),
    ([{1: "x"}], None, "keys must be strings"),
    (None, ["enable_thinking"], "template_kwargs must be a dict"),
    (None, {"messages": []}, "'messages' is set by gemma-cy itself"),
    (None, {"not a name": 1}, "is not a name a template can read"),
    (None, {"_hidden": 1}, "is not a name a template can read"),
    (None, {"enable_thinking": {1, 2}}, "set is not JSON data"),
])
def test_bad_tools_and_template_kwargs_are_one_line_errors(tools, kwargs, needle):
    template = ChatTemplate("chatml", CHATML_TEMPLATE, ())
    with pytest.raises(ParameterError, match=needle) as e:
        render(template, [{"role": "user", "content": "hi"}], bpe(), True, tools, kwargs)
    assert "\n" not in str(e.value)


def test_tools_and_template_kwargs_reach_the_template():
    source = ("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
              "{{ 'think' if enable_thinking is not defined or enable_thinking else 'no-think' }}"
              "{% generation %}{{ messages[0].content }}{% endgeneration %}")
    template = ChatTemplate("file", source, ())
    msgs = [{"role": "user", "content": "hi"}]
    tok = bpe()
    assert render(template, msgs, tok) == "thinkhi"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert render(template, msgs, tok, True, tools, {"enable_thinking": False}) == "[f]no-thinkhi"
