"""GGUF v3 writer: metadata fields and tensors (or functions that make them,
one at a time) to a file, atomically. The layout is the reader's
(gemma_cy.formats.gguf_reader; docs/formats.md#gguf)."""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import ModelFormatError
from ..quant.types import GGML_TYPES
from .gguf_reader import (ARRAY, BOOL, DEFAULT_ALIGNMENT, DTYPES, FLOAT32, INT32, INT64, MAGIC, MAX_DIMS, STRING, STRUCTS, U32, U64, UINT32, UINT64, Field, align)
from .mapped import atomic_write


@dataclass(frozen=True)
class TensorData:
    """A tensor to write: ``dims`` in GGUF order (ne0 first) and its bytes, or
    a function returning them (called once, while writing, so a converter
    never holds more than one tensor)."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    data: np.ndarray | Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        t = GGML_TYPES[self.ggml_type]
        return math.prod(self.dims) // t.block_size * t.type_size


def infer_field(value: Any) -> Field:
    """A Field for a plain Python/NumPy value: bool -> BOOL, int -> UINT32
    (INT32 if negative, UINT64/INT64 if larger), float -> FLOAT32, str ->
    STRING, a list of str -> ARRAY of STRING, an ndarray -> ARRAY of its dtype."""
    if isinstance(value, Field):
        return value
    if isinstance(value, (bool, np.bool_)):
        return Field(BOOL, bool(value))
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return Field(UINT32, v)
        if -2**31 <= v < 0:
            return Field(INT32, v)
        return Field(UINT64 if v >= 0 else INT64, v)
    if isinstance(value, (float, np.floating)):
        return Field(FLOAT32, float(value))
    if isinstance(value, str):
        return Field(STRING, value)
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_:
            return Field(ARRAY, value, BOOL)
        for vtype, dtype in DTYPES.items():
            if vtype != BOOL and np.dtype(dtype) == value.dtype.newbyteorder("<"):
                return Field(ARRAY, value, vtype)
        raise ValueError(f"no GGUF array type for dtype {value.dtype}")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return Field(ARRAY, list(value), STRING)
    raise ValueError(f"no GGUF value type for {type(value).__name__}")


def _encode_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return U64.pack(len(b)) + b


def _encode_field(key: str, f: Field) -> bytes:
    out = [_encode_string(key), U32.pack(f.type)]
    if f.type == STRING:
        out.append(_encode_string(f.value))
    elif f.type == ARRAY:
        out.append(U32.pack(f.item_type) + U64.pack(len(f.value)))
        if f.item_type == STRING:
            out.extend(_encode_string(s) for s in f.value)
        elif f.item_type in DTYPES:
            out.append(np.ascontiguousarray(f.value, dtype=DTYPES[f.item_type]).tobytes())
        else:
            raise ValueError(f"metadata {key!r}: cannot write arrays of type {f.item_type}")
    elif f.type in STRUCTS:
        out.append(STRUCTS[f.type].pack(f.value))
    else:
        raise ValueError(f"metadata {key!r}: unknown value type {f.type}")
    return b"".join(out)


def write_gguf(path, fields: Mapping[str, Any], tensors: Sequence[TensorData]) -> None:
    """Write a GGUF v3 file at ``path``: ``fields`` (key -> Field or a plain
    value, see ``infer_field``) in order, then ``tensors`` in order, each
    padded to the alignment (``general.alignment`` if given, else 32).

    Raises ModelFormatError when a tensor's bytes do not match its type and
    dims, names repeat, or the file cannot be written. The file appears at
    ``path`` only once complete (written to a ``.partial`` file, then renamed).
    """
    name = os.fspath(path)
    typed = {key: infer_field(value) for key, value in fields.items()}
    align_field = typed.get("general.alignment")
    alignment = DEFAULT_ALIGNMENT if align_field is None else align_field.value
    if align_field is not None and (align_field.type != UINT32 or alignment <= 0
                                    or alignment & (alignment - 1)):
        raise ModelFormatError(f"write {name}: general.alignment must be a UINT32 power of two")
    seen: set[str] = set()
    infos = []
    offset = 0
    for t in tensors:
        if t.name in seen:
            raise ModelFormatError(f"write {name}: tensor {t.name!r} appears twice")
        seen.add(t.name)
        if t.ggml_type not in GGML_TYPES or not 1 <= len(t.dims) <= MAX_DIMS or min(t.dims) <= 0 \
                or t.dims[0] % GGML_TYPES[t.ggml_type].block_size:
            raise ModelFormatError(f"write {name}: tensor {t.name!r}: type {t.ggml_type} with dims "
                                   f"{list(t.dims)} is not a valid GGUF tensor")
        infos.append(_encode_string(t.name) + U32.pack(len(t.dims))
                     + struct.pack(f"<{len(t.dims)}Q", *t.dims)
                     + U32.pack(t.ggml_type) + U64.pack(offset))
        offset = align(offset + t.nbytes, alignment)
    try:
        head = b"".join([MAGIC, U32.pack(3), U64.pack(len(tensors)), U64.pack(len(typed)),
                         *(_encode_field(k, f) for k, f in typed.items()), *infos])
    except (ValueError, TypeError, struct.error, UnicodeEncodeError) as e:
        raise ModelFormatError(f"write {name}: {e}") from None
    with atomic_write(name) as f:
        f.write(head)
        f.write(bytes(-len(head) % alignment))
        for t in tensors:
            data = t.data() if callable(t.data) else t.data
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if data.size != t.nbytes:
                raise ModelFormatError(
                    f"write {name}: tensor {t.name!r}: {data.size} bytes, expected {t.nbytes} "
                    f"for {GGML_TYPES[t.ggml_type].name} {list(t.dims)}")
            f.write(memoryview(data))
            f.write(bytes(-t.nbytes % alignment))
