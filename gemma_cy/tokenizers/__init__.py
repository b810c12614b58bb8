"""Text <-> token ids, one module per algorithm (docs/generation.md#tokenizers):
``greedy`` (GMT1 longest match, and the piece table the others share), ``sp``
(SentencePiece from GGUF metadata), ``bpe`` (byte-level BPE), ``llama2c``
(llama2.c's tokenizer.bin), ``fixture_vocab`` (the vocabulary of the tiny test
fixture) and ``chat`` (chat templates: which pieces wrap and end a turn)."""
