"""File formats: one module per format (GGUF in three: ``gguf_reader``,
``gguf_writer``, ``gguf_model``); each parses, validates and returns a
ModelConfig and named tensors (weights) or a Vocab (tokenizers). No maths.
Byte layouts and checks: docs/formats.md."""
