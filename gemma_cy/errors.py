"""The package's own exceptions.

Every error a user can cause (a bad file, a bad flag, a prompt that does not
fit) is one of these, so the CLI can print it as one line and exit non-zero.
Each subclasses the builtin a caller would expect (``ValueError``,
``IndexError``...) so plain ``except ValueError`` keeps working.
"""


class GemmaCyError(Exception):
    """Base class of every error gemma-cy raises on purpose."""


class ModelFormatError(GemmaCyError, ValueError):
    """A weights or tokenizer file breaks its format's rules.

    The message names the file, the field, the value found and the limit.
    """


class ParameterError(GemmaCyError, ValueError):
    """A generation or sampling parameter is outside its valid range."""


class UnknownSettingError(ParameterError, TypeError):
    """A keyword that is no generation setting (a TypeError, as Python's own for an unknown keyword)."""


class ContextLengthError(GemmaCyError, ValueError):
    """The prompt does not fit in the context (KV cache)."""


class TokenIndexError(GemmaCyError, IndexError):
    """A token id or position is outside the model's vocabulary or cache."""


class NumericalError(GemmaCyError, ArithmeticError):
    """The forward pass produced NaN or Inf (names the layer and position)."""


class GenerationStateError(GemmaCyError, RuntimeError):
    """A generation resumed after another one took over the model's KV cache."""


class TemplateError(GemmaCyError, ValueError):
    """A chat template failed to render, or tried something the sandbox forbids."""
