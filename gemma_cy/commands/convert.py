"""Convert a GGUF model to the layout gemma-cy runs: Q8_0 matrices, F32 norms.

    convert("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q8_0.gguf", progress=...)

Every matrix (a tensor of 2+ dims) becomes Q8_0 (int8, one f16 scale per 32
values along the input dimension: llama.cpp's layout, so llama.cpp runs the
result too); Q8_0, Q4_0 and Q5_0 sources map to it exactly, other types are
dequantized and rounded once (``gemma_cy.quant.ggml.to_q8_0``, docs/numerics.md#weights-as-stored). Vectors
(norm gains) become F32. Every metadata key of the source is kept as it is
(tokenizer included), except ``general.file_type``, which becomes 7
(llama.cpp's MOSTLY_Q8_0). Tensor names and order are kept.

``to_llama2c`` writes any model gemma-cy reads as a llama2.c checkpoint
(fp32 or int8 v2), with a GGUF's SentencePiece vocab as tokenizer.bin.

The source is validated like any model file before conversion starts:
``parse_gguf`` (docs/errors.md cases 1-15), a supported architecture, and exactly
the tensors its metadata implies, with the right shapes.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

import numpy as np

from ..errors import ModelFormatError
from ..formats.gguf_reader import UINT32, Field, TensorInfo, parse_gguf
from ..formats.gguf_writer import TensorData, write_gguf
from ..formats.gguf_model import check_model_file
from ..quant.ggml import DEQUANTIZABLE, F16, F32, Q8_0, dequantize, is_exact_in_q8_0, to_q8_0
from ..quant.types import GGML_TYPES

FILE_TYPE_MOSTLY_Q8_0 = 7  # llama.cpp's llama_ftype for "all matrices Q8_0"
FILE_TYPE_MOSTLY_F16 = 1
# convert's ``matrices``: -> (the GGML type of every matrix, general.file_type)
MATRIX_TYPES = {"q8_0": (Q8_0, FILE_TYPE_MOSTLY_Q8_0), "f16": (F16, FILE_TYPE_MOSTLY_F16)}

# progress(done, total, name): called after each tensor is written
Progress = Callable[[int, int, str], None]


def convert(in_path, out_path, progress: Progress | None = None, matrices: str = "q8_0") -> dict[str, str]:
    """Convert GGUF ``in_path`` to a Q8_0/F32 GGUF at ``out_path``; with
    ``matrices="f16"``, every matrix dequantized and stored as F16 instead
    (a larger copy of the same weights, e.g. a target for a draft model).

    Returns tensor name -> what was done ("exact Q5_0", "rounded Q4_K",
    "f32 F32", "f16 Q4_K"...). ``progress(done, total, name)`` is called after each
    tensor. Raises ModelFormatError for a source gemma-cy cannot read or
    convert (naming the tensor and the supported types); the output appears
    only once complete.
    """
    if matrices not in MATRIX_TYPES:
        raise ValueError(f"matrices = {matrices!r}, expected one of {tuple(MATRIX_TYPES)}")
    gf = parse_gguf(in_path)
    check_model_file(gf)
    for t in gf.tensors.values():
        if GGML_TYPES[t.ggml_type].name not in DEQUANTIZABLE:
            raise ModelFormatError(f"{gf.path}: tensor {t.name!r} is {t.type_name}; the converter reads "
                                   f"{', '.join(DEQUANTIZABLE)}")
        if matrices == "q8_0" and len(t.dims) > 1 and t.dims[0] % 32:
            raise ModelFormatError(f"{gf.path}: tensor {t.name!r}: ne0 = {t.dims[0]} is not a multiple "
                                   f"of 32, so it cannot be Q8_0")
    fields = dict(gf.fields)
    fields["general.file_type"] = Field(UINT32, MATRIX_TYPES[matrices][1])
    total = len(gf.tensors)
    done: dict[str, str] = {}

    def producer(t: TensorInfo) -> Callable[[], np.ndarray]:
        def produce() -> np.ndarray:
            raw = gf.raw(t.name)
            if len(t.dims) == 1:
                out = dequantize(raw, t.ggml_type, t.shape)
                how = "f32"
            elif matrices == "f16":
                out = dequantize(raw, t.ggml_type, t.shape).astype(np.float16)
                how = "f16"
            else:
                try:
                    out = to_q8_0(raw, t.ggml_type, t.shape)
                except ValueError as e:  # e.g. a scale too large for f16
                    raise ModelFormatError(f"{gf.path}: tensor {t.name!r}: {e}") from None
                how = "exact" if is_exact_in_q8_0(t.ggml_type) else "rounded"
            done[t.name] = f"{how} {t.type_name}"
            if progress is not None:
                progress(len(done), total, t.name)
            return out
        return produce

    tensors = [TensorData(t.name, F32 if len(t.dims) == 1 else MATRIX_TYPES[matrices][0], t.dims, producer(t))
               for t in gf.tensors.values()]
    write_gguf(out_path, fields, tensors)
    return done


def stderr_progress(label: str) -> Progress:
    """A progress callback for stderr: on a terminal one line redrawn at each
    new percent; otherwise (a log) only the final line."""
    start = time.perf_counter()
    shown = [-1]
    tty = sys.stderr.isatty()

    def show(done: int, total: int, name: str) -> None:
        percent = 100 * done // total
        if done == total:
            sys.stderr.write(f"\r{label}: {total} tensors ({time.perf_counter() - start:.1f} s)\n")
        elif tty and percent != shown[0]:
            sys.stderr.write(f"\r{label}: {done}/{total} tensors ({percent}%)")
        else:
            return
        shown[0] = percent
        sys.stderr.flush()
    return show


def to_llama2c(in_path, out_path, version: int = 0, group_size: int = 64) -> str | None:
    """Write the model in ``in_path`` (GGUF, GMW1 or llama2.c) as a llama2.c
    checkpoint at ``out_path`` (``formats.llama2c.write_llama2c``: version 0
    fp32, 2 int8 in groups of ``group_size``). The source is read with its
    original values where a format has them (a GGUF of any type dequantized
    to f32, a llama2.c file as f32), so nothing is rounded twice.

    A GGUF with a SentencePiece vocab also gets its tokenizer.bin written
    next to ``out_path`` (the file run.c and ``gemma-cy --weights OUT``
    look for); returns that path, or None when none was written. Raises
    ModelFormatError for a source llama2.c cannot express (naming the feature).
    """
    from ..api import open_weights, read_magic
    from ..formats.gguf_model import read_gguf_f32
    from ..formats.llama2c import is_llama2c_checkpoint, read_llama2c_f32, write_llama2c
    from ..tokenizers.llama2c import export_gguf_vocab

    in_path, out_path = os.fspath(in_path), os.fspath(out_path)
    magic = read_magic(in_path)
    if magic == b"GGUF":
        weights = read_gguf_f32(in_path)
    elif magic != b"GMW1" and is_llama2c_checkpoint(in_path):
        weights = read_llama2c_f32(in_path)
    else:
        weights = open_weights(in_path)
    write_llama2c(out_path, weights, version=version, group_size=group_size)
    if magic != b"GGUF":
        return None
    if parse_gguf(in_path).value("tokenizer.ggml.model") != "llama":
        return None
    tok_path = os.path.join(os.path.dirname(out_path), "tokenizer.bin")
    export_gguf_vocab(in_path, tok_path)
    return tok_path
