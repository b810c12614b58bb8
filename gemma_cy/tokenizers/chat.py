"""Chat templates: how one user turn is wrapped, and which pieces end a turn.

A model family's template is data (``ChatFormat``), chosen from the model's
own tokenizer: the Jinja ``tokenizer.chat_template`` a GGUF carries when the
tokenizer kept it, else the turn markers its vocabulary has. Only the
template's own markers are control tokens; the user's text stays plain text.

* Gemma: ``<start_of_turn>user\\n{prompt}<end_of_turn>\\n<start_of_turn>model\\n``,
  BOS first; the turn ends at ``<end_of_turn>``.
* ChatML (SmolLM2): ``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``;
  the turn ends at ``<|im_end|>`` (or ``<|endoftext|>``). A template that
  writes a default system message when the chat has none (SmolLM2's:
  "You are a helpful AI assistant named SmolLM, trained by Hugging Face")
  gets it before the first turn, as the template renders it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatFormat:
    """One family's template. ``user`` holds ``{prompt}``; ``first`` comes
    before the first turn only (after BOS, if the model adds BOS); ``turn_end``
    closes the model's previous turn before a later user turn (generation
    stops on it without feeding it to the cache); ``stop_pieces`` end a turn."""

    name: str
    user: str
    turn_end: str
    stop_pieces: tuple[str, ...]
    first: str = ""


GEMMA = ChatFormat("gemma", "<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n",
                   "<end_of_turn>\n", ("<end_of_turn>",))
CHATML = ChatFormat("chatml", "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
                    "<|im_end|>\n", ("<|im_end|>", "<|endoftext|>"))

# A constant default system message in a ChatML Jinja template; "\n" may be
# a newline or the two characters backslash, n.
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)([^<>{}'\"]*?)<\|im_end\|>")


def chat_format_for(tokenizer) -> ChatFormat | None:
    """The ChatFormat of ``tokenizer``'s model, or None when it has none: by
    its ``chat_template`` text if it has one, else by the markers in its
    vocabulary (``<start_of_turn>`` -> Gemma, ``<|im_start|>`` -> ChatML)."""
    template = getattr(tokenizer, "chat_template", None)
    if template:
        if "<|im_start|>" in template:
            m = _DEFAULT_SYSTEM.search(template)
            if m is None:
                return CHATML
            system = m.group(1).replace("\\n", "\n")
            return ChatFormat(CHATML.name, CHATML.user, CHATML.turn_end, CHATML.stop_pieces,
                              first=f"<|im_start|>system\n{system}<|im_end|>\n")
        if "<start_of_turn>" in template:
            return GEMMA
        return None
    if tokenizer.token_id("<start_of_turn>") is not None:
        return GEMMA
    if tokenizer.token_id("<|im_start|>") is not None:
        return CHATML
    return None
