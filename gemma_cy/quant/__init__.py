"""Quantized tensors and their codecs: int8 per tensor, Q8_0 blocks and the
q8 activation rule (``tensors``), and the ggml block types of GGUF files
(``ggml``). Block-level maths only; docs/formats.md#block-types."""
