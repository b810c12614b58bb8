"""GGUF v2/v3, llama.cpp's model file: a strict reader, a writer, and the
mapping of a Gemma 3 or Llama file to ``Weights``.

Layout (little-endian; v2 and v3 are laid out the same, v1 is not read):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv      x  key: string | u32 value_type | value
    n_tensors x  name: string | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset
    zero padding to the alignment (key general.alignment, default 32)
    tensor data: tensor i at data_start + offset_i
    string = u64 length | UTF-8 bytes;  array = u32 item_type | u64 count | items

``ne0`` is the contiguous axis: a matrix (out, in) in NumPy order has
dims [in, out], and quantized blocks run along ne0 (the input dimension).

Validation (BAD_INPUTS rows 1-15): the file is memory-mapped and every
length, count and offset is checked against the bytes actually left, with
Python ints and in the subtraction form, before anything is looped over or
allocated; counts of keys and tensors are checked against the minimum bytes
each entry takes before the loops start. Tensors must follow each other in
the order of their infos, each padded to the alignment, with no gap, overlap
or trailing bytes (llama.cpp's own loader has the same rule). Float tensors
(F32, F16, BF16, F64) and the f16 scales of quantized blocks are checked for
NaN and Inf; alignment padding must be zero bytes. Every breach raises one ``ModelFormatError`` line naming the
file, the field, the value found and the rule.

``parse_gguf`` returns the file as it is (metadata and raw tensors);
``read_gguf`` maps a Gemma 3 or Llama file to ``Weights`` (``gguf_config`` for the
metadata, ``TENSOR_NAMES`` for the tensor names). The engines run Q8_0
matrices and F32 norms; other types go through ``gemma_cy.convert`` first.

This module uses only NumPy: the ``gguf`` package (gguf-py) is not needed
to read, write or convert, and serves the tests as an independent check.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFormatError
from .mapped import atomic_write, map_file
from ..ggml_quants import GGML_TYPE_IDS, GGML_TYPES
from ..quant import Q8_0_BLOCK, Q8_0_BYTES, F32Tensor, Q8_0Tensor
from ..weights import Weights, expected_shapes

MAGIC = b"GGUF"
VERSIONS = (2, 3)
HEADER_SIZE = 24  # magic, version, n_tensors, n_kv
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
INT64_MAX = 2**63 - 1  # ggml counts elements and bytes in int64

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
                    "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64")
# fixed-size value types -> (struct format, NumPy dtype), little-endian
_SCALARS = {UINT8: ("<B", "<u1"), INT8: ("<b", "<i1"), UINT16: ("<H", "<u2"), INT16: ("<h", "<i2"),
            UINT32: ("<I", "<u4"), INT32: ("<i", "<i4"), FLOAT32: ("<f", "<f4"), BOOL: ("<B", "<u1"),
            UINT64: ("<Q", "<u8"), INT64: ("<q", "<i8"), FLOAT64: ("<d", "<f8")}
_STRUCTS = {t: struct.Struct(fmt) for t, (fmt, _) in _SCALARS.items()}
_DTYPES = {t: dtype for t, (_, dtype) in _SCALARS.items()}
INTEGER_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)
FLOAT_TYPES = (FLOAT32, FLOAT64)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Minimum bytes of one metadata entry (key length, type, a 1-byte value) and
# of one tensor info (name length, n_dims, one dim, type, offset): a count
# that cannot fit the bytes left is rejected before any loop.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
_MIN_ITEM_BYTES = {STRING: 8, **{t: np.dtype(d).itemsize for t, d in _DTYPES.items()}}

# Byte offsets of the f16 scales inside one block, checked for NaN/Inf (row 10)
_F16_SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                      "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                      "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}

F32_ID, Q8_0_ID = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["Q8_0"]


# ---------------------------------------------------------------------------
# The file as it is


@dataclass(frozen=True)
class Field:
    """One metadata value: its GGUF ``type``, the value, and for an ARRAY the
    ``item_type``. Numeric arrays are read-only NumPy views of the file (BOOL
    arrays: np.bool_), string arrays lists of str."""

    type: int
    value: Any
    item_type: int | None = None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: ``dims`` in GGUF order (ne0, the contiguous axis,
    first), ``offset`` from the start of the file, ``nbytes`` of data."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy shape: the dims reversed ((out, in) for a matrix)."""
        return tuple(reversed(self.dims))

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


@dataclass
class GGUFFile:
    """A parsed GGUF file: metadata ``fields`` and ``tensors`` (both in file
    order) over a read-only memory map of the file."""

    path: str
    version: int
    alignment: int
    fields: dict[str, Field]
    tensors: dict[str, TensorInfo]
    mm: mmap.mmap = field(repr=False)

    def value(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key``, or ``default`` when absent."""
        f = self.fields.get(key)
        return default if f is None else f.value

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name``'s bytes: a read-only uint8 view of the file."""
        t = self.tensors[name]
        return np.frombuffer(self.mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)


def parse_gguf(path) -> GGUFFile:
    """Map and validate a GGUF v2/v3 file; raise ModelFormatError naming the
    file, the field, the value found and the rule for any breach (module
    docstring). Zero-copy: tensors and numeric arrays are views of the map."""
    name = os.fspath(path)
    mm = map_file(name, "GGUF", HEADER_SIZE)
    try:
        return _Parser(name, mm).parse()
    except ModelFormatError:
        _close_quietly(mm)
        raise


def _close_quietly(mm: mmap.mmap) -> None:
    """Close ``mm`` unless views of it still exist (they keep it alive; it is
    then freed with the last one)."""
    try:
        mm.close()
    except BufferError:
        pass


class _Parser:
    """A cursor over the map; every read checks the bytes left first."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name, self.mm, self.size, self.pos = name, mm, len(mm), 0

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{self.name}: {message}")

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.fail(f"{what}: needs {n} bytes at offset {self.pos}, only {self.left()} left "
                            f"(file has {self.size} bytes)")

    def scalar(self, vtype: int, what: str):
        s = _STRUCTS[vtype]
        self.need(s.size, what)
        (v,) = s.unpack_from(self.mm, self.pos)
        self.pos += s.size
        return v

    def string(self, what: str) -> str:
        n = self.scalar(UINT64, f"{what} length")
        if n > self.left():
            raise self.fail(f"{what}: length {n} at offset {self.pos - 8} is larger than the "
                            f"{self.left()} bytes left")
        raw = self.mm[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def parse(self) -> GGUFFile:
        magic = self.mm[0:4]
        if magic != MAGIC:
            raise self.fail(f"magic: found {magic!r}, expected {MAGIC!r}")
        self.pos = 4
        version = self.scalar(UINT32, "version")
        if version not in VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in VERSIONS:
                raise self.fail(f"version: found {version:#x}, a big-endian GGUF file; only "
                                f"little-endian files are supported")
            raise self.fail(f"version: found {version}, expected one of {VERSIONS}")
        n_tensors = self.scalar(UINT64, "tensor count")
        n_kv = self.scalar(UINT64, "metadata key count")
        least = n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES
        if least > self.left():
            raise self.fail(f"counts: {n_kv} metadata keys and {n_tensors} tensors need at least "
                            f"{least} bytes, the file has {self.left()} after the header")
        fields = self._fields(n_kv)
        alignment = self._alignment(fields)
        infos = [self._tensor_info(i) for i in range(n_tensors)]
        tensors = self._place(infos, alignment)
        return GGUFFile(path=self.name, version=version, alignment=alignment, fields=fields,
                        tensors=tensors, mm=self.mm)

    # -- metadata

    def _fields(self, n_kv: int) -> dict[str, Field]:
        fields: dict[str, Field] = {}
        for i in range(n_kv):
            at = self.pos
            key = self.string(f"metadata key #{i}")
            if not key:
                raise self.fail(f"metadata key #{i} at offset {at} is empty")
            if key in fields:
                raise self.fail(f"metadata key {key!r} appears twice (second at offset {at})")
            vtype = self.scalar(UINT32, f"metadata {key!r} type")
            fields[key] = self._value(vtype, f"metadata {key!r}")
        return fields

    def _value(self, vtype: int, what: str) -> Field:
        if vtype == STRING:
            return Field(STRING, self.string(what))
        if vtype == ARRAY:
            return self._array(what)
        if vtype not in _STRUCTS:
            raise self.fail(f"{what}: unknown value type {vtype} (known: 0..{len(VALUE_TYPE_NAMES) - 1})")
        v = self.scalar(vtype, what)
        if vtype == BOOL:
            if v > 1:
                raise self.fail(f"{what}: BOOL byte is {v}, expected 0 or 1")
            v = bool(v)
        return Field(vtype, v)

    def _array(self, what: str) -> Field:
        item_type = self.scalar(UINT32, f"{what} item type")
        if item_type == ARRAY:
            raise self.fail(f"{what}: arrays of arrays are not supported")
        if item_type not in _MIN_ITEM_BYTES:
            raise self.fail(f"{what}: unknown array item type {item_type} "
                            f"(known: 0..{len(VALUE_TYPE_NAMES) - 1})")
        count = self.scalar(UINT64, f"{what} item count")
        least = count * _MIN_ITEM_BYTES[item_type]
        if least > self.left():
            raise self.fail(f"{what}: {count} items of {VALUE_TYPE_NAMES[item_type]} need at least "
                            f"{least} bytes, only {self.left()} left")
        if item_type == STRING:
            return Field(ARRAY, self._strings(count, what), STRING)
        values = np.frombuffer(self.mm, dtype=_DTYPES[item_type], count=count, offset=self.pos)
        if item_type == BOOL:
            if count and int(values.max()) > 1:
                raise self.fail(f"{what}: BOOL array holds the byte {int(values.max())}, expected 0 or 1")
            values = values.view(np.bool_)
        self.pos += least
        return Field(ARRAY, values, item_type)

    def _strings(self, count: int, what: str) -> list[str]:
        """``count`` strings back to back (``string`` unrolled: a vocabulary
        has ~262k of them)."""
        mm, pos, size, unpack = self.mm, self.pos, self.size, _U64.unpack_from
        out = [b""] * count
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{what}[{i}] length")
            (n,) = unpack(mm, pos)
            pos += 8
            if n > size - pos:
                raise self.fail(f"{what}[{i}]: length {n} at offset {pos - 8} is larger than the "
                                f"{size - pos} bytes left")
            out[i] = mm[pos:pos + n]
            pos += n
        self.pos = pos
        try:
            return [b.decode("utf-8") for b in out]
        except UnicodeDecodeError as e:
            bad = next(i for i, b in enumerate(out) if not _is_utf8(b))
            raise self.fail(f"{what}[{bad}]: not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def _alignment(self, fields: dict[str, Field]) -> int:
        f = fields.get("general.alignment")
        if f is None:
            return DEFAULT_ALIGNMENT
        if f.type != UINT32:
            raise self.fail(f"general.alignment: type {_type_name(f)}, expected UINT32")
        if f.value == 0 or f.value & (f.value - 1):
            raise self.fail(f"general.alignment: found {f.value}, must be a power of two")
        return f.value

    # -- tensors

    def _tensor_info(self, i: int) -> tuple[str, int, tuple[int, ...], int]:
        at = self.pos
        name = self.string(f"tensor #{i} name")
        if not name:
            raise self.fail(f"tensor #{i} at offset {at}: empty name")
        n_dims = self.scalar(UINT32, f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name!r}: n_dims found {n_dims}, must be 1..{MAX_DIMS}")
        self.need(8 * n_dims, f"tensor {name!r} dims")
        dims = struct.unpack_from(f"<{n_dims}Q", self.mm, self.pos)
        self.pos += 8 * n_dims
        ggml_type = self.scalar(UINT32, f"tensor {name!r} type")
        offset = self.scalar(UINT64, f"tensor {name!r} offset")
        return name, ggml_type, dims, offset

    def _place(self, infos, alignment: int) -> dict[str, TensorInfo]:
        """Check each tensor's type, size and offset; the data must be the
        tensors back to back in info order, each padded to ``alignment``."""
        data_start = _align(self.pos, alignment)
        data_size = self.size - data_start  # may be negative: checked below
        self._check_padding(self.pos, data_start, "after the tensor infos")
        tensors: dict[str, TensorInfo] = {}
        expected = 0  # where the next tensor must start, relative to data_start
        prev = None
        for name, ggml_type, dims, offset in infos:
            if name in tensors:
                raise self.fail(f"tensor {name!r} appears twice")
            t = GGML_TYPES.get(ggml_type)
            if t is None:
                raise self.fail(f"tensor {name!r}: unknown ggml type {ggml_type}")
            if 0 in dims:
                raise self.fail(f"tensor {name!r}: dims {list(dims)} include 0")
            n = math.prod(dims)  # a Python int: cannot wrap
            if n > INT64_MAX:
                raise self.fail(f"tensor {name!r}: dims {list(dims)} hold {n} values, more than "
                                f"2^63 - 1 (the product overflows 64 bits)")
            if dims[0] % t.block_size:
                raise self.fail(f"tensor {name!r}: ne0 = {dims[0]} is not a multiple of "
                                f"{t.name}'s block size {t.block_size}")
            nbytes = n // t.block_size * t.type_size
            if offset % alignment:
                raise self.fail(f"tensor {name!r}: offset {offset} is not a multiple of the "
                                f"alignment {alignment}")
            if offset > data_size or nbytes > data_size - offset:
                raise self.fail(f"tensor {name!r}: data [{offset}, {offset + nbytes}) of the data "
                                f"section past the end of the file (data section has "
                                f"{max(data_size, 0)} bytes)")
            if offset < expected:
                raise self.fail(f"tensor {name!r}: offset {offset} overlaps tensor {prev!r}, "
                                f"which ends at {expected} (padded)")
            if offset > expected:
                raise self.fail(f"tensor {name!r}: offset {offset} leaves a gap after "
                                f"{'the tensor infos' if prev is None else repr(prev)}: expected {expected}")
            tensors[name] = TensorInfo(name, ggml_type, tuple(dims), data_start + offset, nbytes)
            expected = _align(offset + nbytes, alignment)
            self._check_padding(data_start + offset + nbytes, data_start + expected, f"after tensor {name!r}")
            prev = name
        if infos:
            last = tensors[prev]
            unpadded = last.offset + last.nbytes
            if self.size not in (unpadded, data_start + expected):
                raise self.fail(f"file size: found {self.size} bytes, the last tensor ends at "
                                f"{unpadded} ({self.size - unpadded} trailing bytes)")
        elif self.size not in (self.pos, data_start):
            raise self.fail(f"file size: found {self.size} bytes, the metadata ends at {self.pos} "
                            f"and there are no tensors ({self.size - self.pos} trailing bytes)")
        for info in tensors.values():
            self._check_finite(info)
        return tensors

    def _check_padding(self, start: int, end: int, what: str) -> None:
        """Padding bytes (the part inside the file) must be zero, as every
        GGUF writer leaves them: anything else is corruption."""
        pad = self.mm[start:min(end, self.size)]
        if pad.strip(b"\0"):
            at = start + next(i for i, b in enumerate(pad) if b)
            raise self.fail(f"padding {what}: byte at offset {at} is {self.mm[at]:#04x}, expected 0")

    def _check_finite(self, t: TensorInfo) -> None:
        """Reject NaN/Inf in float data and in the f16 scales of quantized blocks."""
        name = t.type_name
        data = np.frombuffer(self.mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        if name in ("F32", "F16", "F64"):
            bad = ~np.isfinite(data.view({"F32": "<f4", "F16": "<f2", "F64": "<f8"}[name]))
        elif name == "BF16":
            bad = (data.view("<u2") & 0x7F80) == 0x7F80  # exponent all ones
        elif name in _F16_SCALE_OFFSETS:
            blocks = data.reshape(-1, GGML_TYPES[t.ggml_type].type_size)
            bad = np.zeros(blocks.shape[0], dtype=bool)
            for at in _F16_SCALE_OFFSETS[name]:
                bad |= (blocks[:, at + 1] & 0x7C) == 0x7C  # f16 exponent all ones
        else:
            return
        if np.any(bad):
            where = int(np.argmax(bad))
            unit = "value" if name in ("F32", "F16", "F64", "BF16") else "block scale"
            raise self.fail(f"tensor {t.name!r} ({name}): NaN or Inf in {unit} #{where}")


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _align(n: int, alignment: int) -> int:
    return n + (-n % alignment)


def _type_name(f: Field) -> str:
    name = VALUE_TYPE_NAMES[f.type]
    return f"ARRAY of {VALUE_TYPE_NAMES[f.item_type]}" if f.type == ARRAY else name


# ---------------------------------------------------------------------------
# Writing


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
        for vtype, dtype in _DTYPES.items():
            if vtype != BOOL and np.dtype(dtype) == value.dtype.newbyteorder("<"):
                return Field(ARRAY, value, vtype)
        raise ValueError(f"no GGUF array type for dtype {value.dtype}")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return Field(ARRAY, list(value), STRING)
    raise ValueError(f"no GGUF value type for {type(value).__name__}")


def _encode_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def _encode_field(key: str, f: Field) -> bytes:
    out = [_encode_string(key), _U32.pack(f.type)]
    if f.type == STRING:
        out.append(_encode_string(f.value))
    elif f.type == ARRAY:
        out.append(_U32.pack(f.item_type) + _U64.pack(len(f.value)))
        if f.item_type == STRING:
            out.extend(_encode_string(s) for s in f.value)
        elif f.item_type in _DTYPES:
            out.append(np.ascontiguousarray(f.value, dtype=_DTYPES[f.item_type]).tobytes())
        else:
            raise ValueError(f"metadata {key!r}: cannot write arrays of type {f.item_type}")
    elif f.type in _STRUCTS:
        out.append(_STRUCTS[f.type].pack(f.value))
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
        infos.append(_encode_string(t.name) + _U32.pack(len(t.dims))
                     + struct.pack(f"<{len(t.dims)}Q", *t.dims)
                     + _U32.pack(t.ggml_type) + _U64.pack(offset))
        offset = _align(offset + t.nbytes, alignment)
    try:
        head = b"".join([MAGIC, _U32.pack(3), _U64.pack(len(tensors)), _U64.pack(len(typed)),
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


# ---------------------------------------------------------------------------
# Gemma 3 and Llama: GGUF metadata -> ModelConfig, GGUF tensors -> Weights

SUPPORTED_ARCHITECTURES = ("gemma3", "llama")

# llama.cpp tensor names -> Weights names (gemma_cy.weights); per layer
# "blk.{l}.<key>.weight" -> "layers.{l}.<value>"
GLOBAL_TENSOR_NAMES = {"token_embd.weight": "embed_tokens", "output_norm.weight": "final_norm",
                       "output.weight": "lm_head"}
LAYER_TENSOR_NAMES = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
    "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm",
    "post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_ffn_norm",
    "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
}
_LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)\.weight")

# Gemma 3 values the GGUF metadata does not carry (llama.cpp hard-codes them
# for the architecture too): local RoPE base, and the layer pattern (5 local
# layers then 1 global).
GEMMA3_ROPE_BASE_LOCAL = 10000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_ROPE_BASE = 1_000_000.0  # HF Gemma3TextConfig.rope_theta, if freq_base is absent
GEMMA3_27B_LAYERS = 62  # the one size whose query_pre_attn_scalar is dim // n_heads


def tensor_name(gguf_name: str, n_layers: int) -> str | None:
    """The Weights name of a llama.cpp tensor name, or None if it has none."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    m = _LAYER_NAME.fullmatch(gguf_name)
    if m and int(m.group(1)) < n_layers and m.group(2) in LAYER_TENSOR_NAMES:
        return f"layers.{m.group(1)}.{LAYER_TENSOR_NAMES[m.group(2)]}"
    return None


def gguf_tensor_name(weights_name: str) -> str:
    """The llama.cpp name of a Weights tensor name (inverse of ``tensor_name``)."""
    for g, w in GLOBAL_TENSOR_NAMES.items():
        if w == weights_name:
            return g
    _, layer, short = weights_name.split(".")
    key = next(k for k, v in LAYER_TENSOR_NAMES.items() if v == short)
    return f"blk.{layer}.{key}.weight"


class _Meta:
    """Typed access to one architecture's metadata keys, with messages."""

    def __init__(self, gf: GGUFFile, arch: str) -> None:
        self.gf, self.arch = gf, arch

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{self.gf.path}: {message}")

    def int(self, key: str, default: int | None = None, *, low: int = 1) -> int:
        full = key.format(arch=self.arch)
        f = self.gf.fields.get(full)
        if f is None:
            if default is None:
                raise self.fail(f"metadata {full} is missing")
            return default
        if f.type not in INTEGER_TYPES:
            raise self.fail(f"metadata {full}: type {_type_name(f)}, expected an integer")
        if f.value < low:
            raise self.fail(f"metadata {full}: found {f.value}, must be >= {low}")
        return int(f.value)

    def float(self, key: str, default: float) -> float:
        full = key.format(arch=self.arch)
        f = self.gf.fields.get(full)
        if f is None:
            return default
        if f.type not in FLOAT_TYPES:
            raise self.fail(f"metadata {full}: type {_type_name(f)}, expected a float")
        return float(f.value)


def gguf_config(gf: GGUFFile) -> ModelConfig:
    """The ModelConfig of a parsed GGUF file (architectures "gemma3" and "llama").

    Both: sizes (``{arch}.*``), eps, RoPE base (``rope.freq_base``), bos/eos
    ids from ``tokenizer.ggml.*``; vocab_size is the embedding's row count;
    no position table; tied embeddings when there is no ``output.weight``.
    The architecture's own switches: ``_gemma3_switches``, ``_llama_switches``.
    """
    arch_field = gf.fields.get("general.architecture")
    if arch_field is None or arch_field.type != STRING:
        raise ModelFormatError(f"{gf.path}: metadata general.architecture is missing or not a string")
    arch = arch_field.value
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFormatError(f"{gf.path}: architecture {arch!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    m = _Meta(gf, arch)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None or len(emb.dims) != 2:
        raise ModelFormatError(f"{gf.path}: tensor token_embd.weight is missing or not 2-D")
    n_layers = m.int("{arch}.block_count")
    if n_layers > len(gf.tensors):  # bounds every loop over layers below
        raise m.fail(f"metadata {arch}.block_count = {n_layers}, but the file holds only "
                     f"{len(gf.tensors)} tensors")
    dim = m.int("{arch}.embedding_length")
    n_heads = m.int("{arch}.attention.head_count")
    head_dim = m.int("{arch}.attention.key_length", default=dim // n_heads)
    value_len = m.int("{arch}.attention.value_length", default=head_dim)
    if value_len != head_dim:
        raise m.fail(f"metadata {arch}.attention.value_length = {value_len} differs from key_length "
                     f"= {head_dim}; one head_dim is supported")
    scaling = gf.value(f"{arch}.rope.scaling.type", "none")
    factor = m.float("{arch}.rope.scaling.factor", 1.0)
    if scaling not in ("none", "linear") or (scaling == "linear" and factor != 1.0):
        raise m.fail(f"metadata {arch}.rope.scaling: {scaling} x {factor} is not supported "
                     f"(no RoPE scaling: Gemma 3 270M and 1B, SmolLM2)")
    special = {}
    for key in ("bos", "eos", "eot"):
        f = gf.fields.get(f"tokenizer.ggml.{key}_token_id")
        if f is not None and f.type not in INTEGER_TYPES:
            raise m.fail(f"metadata tokenizer.ggml.{key}_token_id: type {_type_name(f)}, expected an integer")
        special[key] = None if f is None else int(f.value)
    vocab_size = emb.dims[1]
    _check_vocab_metadata(gf, vocab_size)
    switches = (_gemma3_switches if arch == "gemma3" else _llama_switches)(gf, m, n_layers, dim, n_heads, head_dim)
    eos_ids = [special["eos"], special["eot"]] + switches.pop("extra_eos_ids")
    try:
        return ModelConfig(
            n_layers=n_layers, dim=dim, n_heads=n_heads,
            n_kv_heads=m.int("{arch}.attention.head_count_kv", default=n_heads),
            head_dim=head_dim, mlp_dim=m.int("{arch}.feed_forward_length"),
            vocab_size=vocab_size, max_seq_len=m.int("{arch}.context_length"),
            position_table=False,
            tied_embeddings="output.weight" not in gf.tensors,
            bos_id=special["bos"],
            eos_ids=tuple(sorted({i for i in eos_ids if i is not None})),
            **switches)
    except ModelFormatError as e:
        raise ModelFormatError(f"{gf.path}: {e}") from None


def _gemma3_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                     head_dim: int) -> dict:
    """Gemma 3's ModelConfig switches.

    From metadata: RoPE global base (``rope.freq_base``; the local base from
    ``rope.freq_base_swa``), eps, sliding window, soft-caps if present.
    Derived where the file says nothing (as llama.cpp does): local RoPE base
    10000, pattern 6 (layer l global when (l+1) % 6 == 0), query scale
    1/sqrt(query_pre_attn_scalar) with the scalar = head_dim (dim // n_heads
    for the 62-layer 27B), embed_scale = f32(sqrt(dim)), GELU-tanh,
    half-split RoPE, q/k-norm, sandwich norms. End of turn
    (``<end_of_turn>``, when ``tokenizer.ggml.eot_token_id`` is absent) is an
    eos id too.

    Norm gains: llama.cpp's converter stores Gemma's RMSNorm weights as
    1 + w (its ``norm_shift``), so the gain is used as stored: "plain". (In
    this file every norm value minus 1 is exactly a bf16, the checkpoint's
    dtype: the +1 was added in f32 after reading bf16 w, the same f32 value
    HF computes as ``1.0 + weight.float()``.)
    """
    window = m.int("{arch}.attention.sliding_window", default=0, low=0)
    pattern = _swa_pattern(gf, m, m.arch, n_layers) if window else 0
    pre_attn_scalar = dim // n_heads if n_layers == GEMMA3_27B_LAYERS else head_dim
    has_eot = "tokenizer.ggml.eot_token_id" in gf.fields
    return dict(
        activation="gelu_tanh", rope_pairing="half_split",
        rope_base=m.float("{arch}.rope.freq_base", GEMMA3_ROPE_BASE),
        rope_base_local=m.float("{arch}.rope.freq_base_swa", GEMMA3_ROPE_BASE_LOCAL),
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        norm_gain="plain", embed_scale=float(np.float32(math.sqrt(dim))),
        qk_norm=True, post_norms=True,
        query_scale=1.0 / math.sqrt(pre_attn_scalar),
        sliding_window=window, sliding_window_pattern=pattern,
        attn_softcap=m.float("{arch}.attn_logit_softcapping", 0.0),
        final_softcap=m.float("{arch}.final_logit_softcapping", 0.0),
        extra_eos_ids=[] if has_eot else [_token_id(gf, "<end_of_turn>")])


def _llama_switches(gf: GGUFFile, m: _Meta, n_layers: int, dim: int, n_heads: int,
                    head_dim: int) -> dict:
    """Llama's ModelConfig switches (SmolLM2 is one): SiLU gating, plain
    RMSNorm gains (no +1), embedding unscaled, no q/k-norm, no post-norms, no
    sliding window, scores scaled by 1/sqrt(head_dim).

    RoPE pairs are interleaved, (2j, 2j+1): llama.cpp's converter permutes
    the rows of each q and k head from HF's half-split layout so that its own
    adjacent-pair RoPE applies (HF's GGUF loader undoes the permutation and
    rotates half-split: the same function). RoPE must cover the whole head
    (``rope.dimension_count`` == head_dim).
    """
    rot = m.int("{arch}.rope.dimension_count", default=head_dim)
    if rot != head_dim:
        raise m.fail(f"metadata {m.arch}.rope.dimension_count = {rot} differs from head_dim = {head_dim}; "
                     f"partial RoPE is not supported")
    return dict(
        activation="silu", rope_pairing="interleaved",
        rope_base=m.float("{arch}.rope.freq_base", 10000.0),
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        norm_gain="plain", embed_scale=1.0, qk_norm=False, post_norms=False,
        query_scale=1.0 / math.sqrt(head_dim), extra_eos_ids=[])


def _swa_pattern(gf: GGUFFile, m: _Meta, arch: str, n_layers: int) -> int:
    """Sliding-window period: the metadata's (an int, or one bool per layer,
    True = sliding) if present, else Gemma 3's 6."""
    key = f"{arch}.attention.sliding_window_pattern"
    f = gf.fields.get(key)
    if f is None:
        return GEMMA3_SLIDING_WINDOW_PATTERN
    if f.type != ARRAY:
        return m.int("{arch}.attention.sliding_window_pattern")
    if f.item_type != BOOL or len(f.value) != n_layers:
        raise m.fail(f"metadata {key}: expected {n_layers} BOOLs, found {len(f.value)} of "
                     f"{VALUE_TYPE_NAMES[f.item_type]}")
    local = [bool(v) for v in f.value]
    for p in range(1, n_layers + 2):
        if local == [(l + 1) % p != 0 for l in range(n_layers)]:
            return p
    raise m.fail(f"metadata {key}: the per-layer pattern is not periodic (every p-th layer "
                 f"global), which gemma-cy cannot express")


def _check_vocab_metadata(gf: GGUFFile, vocab_size: int) -> None:
    """The tokenizer arrays hold one entry per embedding row; special ids are
    in the vocabulary (BAD_INPUTS row 12)."""
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        f = gf.fields.get(key)
        if f is None:
            continue
        if f.type != ARRAY:
            raise ModelFormatError(f"{gf.path}: metadata {key}: type {_type_name(f)}, expected an array")
        if len(f.value) != vocab_size:
            raise ModelFormatError(f"{gf.path}: metadata {key}: {len(f.value)} entries, expected "
                                   f"vocab_size = {vocab_size} (rows of token_embd.weight)")
    for key in ("bos", "eos", "eot", "unknown", "padding", "sep", "cls", "mask"):
        full = f"tokenizer.ggml.{key}_token_id"
        f = gf.fields.get(full)
        if f is None:
            continue
        if f.type not in INTEGER_TYPES or not 0 <= f.value < vocab_size:
            raise ModelFormatError(f"{gf.path}: metadata {full} = {f.value!r}, must be an id in "
                                   f"[0, {vocab_size})")


def _token_id(gf: GGUFFile, piece: str) -> int | None:
    tokens = gf.value("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return None
    try:
        return tokens.index(piece)
    except ValueError:
        return None


def check_model_tensors(gf: GGUFFile, config: ModelConfig,
                        allowed_types: Iterable[int] | None = None) -> dict[str, str]:
    """Check that ``gf`` holds exactly the tensors ``config`` needs, with the
    right shapes (and, if given, types): returns GGUF name -> Weights name.
    Raises ModelFormatError naming the first tensor that breaks a rule."""
    shapes = expected_shapes(config)
    names: dict[str, str] = {}
    for g, t in gf.tensors.items():
        w = tensor_name(g, config.n_layers)
        if w is None or w not in shapes:
            raise ModelFormatError(f"{gf.path}: unexpected tensor {g!r} (not part of a "
                                   f"{gf.value('general.architecture')} model with {config.n_layers} layers)")
        if t.shape != shapes[w]:
            raise ModelFormatError(
                f"{gf.path}: tensor {g!r} has dims {list(t.dims)} (shape {t.shape}), expected shape "
                f"{shapes[w]} from the metadata")
        if allowed_types is not None and t.ggml_type not in allowed_types:
            raise ModelFormatError(
                f"{gf.path}: tensor {g!r} is {t.type_name}; gemma-cy runs Q8_0 matrices and F32 "
                f"norms: convert the file first (gemma-cy convert IN.gguf -o OUT.gguf)")
        names[g] = w
    missing = sorted(set(shapes) - set(names.values()))
    if missing:
        raise ModelFormatError(f"{gf.path}: missing tensor {gguf_tensor_name(missing[0])!r}")
    return names


def read_gguf(path) -> Weights:
    """Read a Gemma 3 or Llama GGUF file of Q8_0 matrices and F32 norms as Weights of
    zero-copy, read-only views (``Q8_0Tensor``, ``F32Tensor``) of the mapped
    file; the map stays alive through ``Weights.keepalive``. Tied embeddings
    stay one tensor. Raises ModelFormatError for anything ``parse_gguf`` or
    ``gguf_config`` rejects, an unexpected, missing or misshapen tensor, or
    another tensor type (convert such files first: ``gemma_cy.convert``)."""
    gf = parse_gguf(path)
    try:
        config = gguf_config(gf)
        names = check_model_tensors(gf, config)
        tensors = {}
        for g, w in names.items():
            t = gf.tensors[g]
            if len(t.dims) == 1 and t.ggml_type == F32_ID:
                tensors[w] = F32Tensor(np.frombuffer(gf.mm, dtype=np.float32, count=t.dims[0],
                                                     offset=t.offset))
            elif len(t.dims) == 2 and t.ggml_type == Q8_0_ID:
                tensors[w] = Q8_0Tensor(gf.raw(g).reshape(t.dims[1], t.dims[0] // Q8_0_BLOCK, Q8_0_BYTES))
            else:
                raise ModelFormatError(
                    f"{gf.path}: tensor {g!r} is {t.type_name} with {len(t.dims)} dims; gemma-cy runs "
                    f"Q8_0 matrices and F32 norms: convert the file first "
                    f"(gemma-cy convert IN.gguf -o OUT.gguf)")
        return Weights(config=config, tensors=tensors, source=gf.path, keepalive=[gf.mm])
    except ModelFormatError:
        _close_quietly(gf.mm)
        raise


def read_gguf_f32(path) -> Weights:
    """Read any supported Gemma 3 or Llama GGUF (Q4_K, Q4_1, Q5_0, Q6_K, Q8_0, F16, F32...)
    with every tensor dequantized to f32 (``F32Tensor``, owned arrays): the
    original weights as HF transformers sees them, for the reference engine's
    checks against an independent implementation. Not zero-copy (Gemma 3
    270M takes ~1.1 GB)."""
    from ..ggml_quants import dequantize

    gf = parse_gguf(path)
    try:
        config = gguf_config(gf)
        names = check_model_tensors(gf, config)
        tensors = {}
        for g, w in names.items():
            t = gf.tensors[g]
            try:
                values = dequantize(gf.raw(g), t.ggml_type, t.shape)
                tensors[w] = F32Tensor(np.require(values, np.float32, ["C", "O"]))  # own it: the map closes
            except ValueError as e:
                raise ModelFormatError(f"{gf.path}: tensor {g!r} ({t.type_name}): {e}") from None
            if not np.all(np.isfinite(tensors[w].data)):
                raise ModelFormatError(f"{gf.path}: tensor {g!r} holds NaN or Inf")
        return Weights(config=config, tensors=tensors, source=gf.path)
    finally:
        _close_quietly(gf.mm)
