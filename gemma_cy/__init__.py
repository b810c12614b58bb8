"""gemma-cy: a readable CPU inference engine for Gemma-family models.

``gemma_cy.load(weights, tokenizer=None, engine=...)`` returns a ``Model``
with ``generate``, ``tokenize``, ``detokenize`` and ``logits``.

The names below are imported on first use (PEP 562), so importing one
low-level module (``gemma_cy.formats.gmw``) does not load the whole stack.
"""
from .model.config import ModelConfig
from .errors import (ContextLengthError, GemmaCyError, GenerationStateError, ModelFormatError,
                     NumericalError, ParameterError, TemplateError, TokenIndexError)

_LAZY = {"load": "api", "Model": "api", "Completion": "api", "Generation": "generation.generator",
         "Step": "generation.generator", "SplitMix64": "generation.sampling"}

__all__ = ["load", "Model", "ModelConfig", "Generation", "Step", "Completion", "SplitMix64", "GemmaCyError",
           "ModelFormatError", "ParameterError", "ContextLengthError", "TokenIndexError",
           "NumericalError", "GenerationStateError", "TemplateError", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'gemma_cy' has no attribute {name!r}")
