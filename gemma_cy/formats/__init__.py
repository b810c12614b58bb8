"""File formats: one module per format; each parses, validates and returns
a ModelConfig and named tensors (weights) or a Vocab (tokenizers). No maths."""
