"""GGUF v2/v3, llama.cpp's model file: the strict reader (the file as it is:
metadata fields and raw tensors, nothing mapped to a model yet).

Layout (little-endian; v2 and v3 are laid out the same, v1 is not read):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv      x  key: string | u32 value_type | value
    n_tensors x  name: string | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset
    zero padding to the alignment (key general.alignment, default 32)
    tensor data: tensor i at data_start + offset_i
    string = u64 length | UTF-8 bytes;  array = u32 item_type | u64 count | items

``ne0`` is the contiguous axis: a matrix (out, in) in NumPy order has
dims [in, out], and quantized blocks run along ne0 (the input dimension).

Validation (docs/formats.md#checks, docs/errors.md cases 1-15): the file is
memory-mapped and every length, count and offset is checked against the bytes
actually left, with Python ints and in the subtraction form, before anything is
looped over or allocated; counts of keys and tensors are checked against the
minimum bytes each entry takes before the loops start. Tensors must follow each
other in the order of their infos, each padded to the alignment, with no gap,
overlap or trailing bytes (llama.cpp's own loader has the same rule). Float
tensors (F32, F16, BF16, F64) and the f16 scales of quantized blocks are
checked for NaN and Inf; alignment padding must be zero bytes. Every breach
raises one ``ModelFormatError`` line naming the file, the field, the value
found and the rule.

This package uses only NumPy and, for the offsets of a string array's
strings, the small C loop in string_scan.pyx (a Python loop stands in when the
extension is not built): the ``gguf`` package (gguf-py) is not needed to read,
write or convert, and serves the tests as an independent check.
"""
from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelFormatError
from ..quant.types import GGML_TYPE_IDS, GGML_TYPES
from .mapped import map_file, release_pages

try:  # the C loop over a string array's lengths; the Python loop below does without it
    from .string_scan import scan_string_starts, zero_string_lengths
except ImportError:
    scan_string_starts = zero_string_lengths = None
if sys.byteorder != "little":  # it reads each u64 length in the host's order
    scan_string_starts = None

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
STRUCTS = {t: struct.Struct(fmt) for t, (fmt, _) in _SCALARS.items()}
DTYPES = {t: dtype for t, (_, dtype) in _SCALARS.items()}
INTEGER_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)
FLOAT_TYPES = (FLOAT32, FLOAT64)
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")

# Minimum bytes of one metadata entry (key length, type, a 1-byte value) and
# of one tensor info (name length, n_dims, one dim, type, offset): a count
# that cannot fit the bytes left is rejected before any loop.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
_MIN_ITEM_BYTES = {STRING: 8, **{t: np.dtype(d).itemsize for t, d in DTYPES.items()}}

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
    arrays: np.bool_), string arrays StringArrays (sequences of str)."""

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
        close_quietly(mm)
        raise


def close_quietly(mm: mmap.mmap) -> None:
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
        s = STRUCTS[vtype]
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
        if vtype not in STRUCTS:
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
        values = np.frombuffer(self.mm, dtype=DTYPES[item_type], count=count, offset=self.pos)
        if item_type == BOOL:
            if count and int(values.max()) > 1:
                raise self.fail(f"{what}: BOOL array holds the byte {int(values.max())}, expected 0 or 1")
            values = values.view(np.bool_)
        self.pos += least
        return Field(ARRAY, values, item_type)

    def _strings(self, count: int, what: str) -> StringArray:
        """``count`` strings back to back (``string`` unrolled: a vocabulary
        has ~262k of them), left where they lie in the map; their UTF-8 is
        checked all at once (each string's length bytes zeroed in a copy of
        the array: a NUL ends any multi-byte sequence, so no character can
        run from one string into the next). The offsets come from the C scan
        (string_scan.pyx) up to the first string that does not fit, then from
        the Python loop, which reports that string (and, without the
        extension, reads them all: the same offsets and errors, some 200x
        slower: docs/benchmarks.md#history, eleventh session)."""
        pos, size, unpack = self.pos, self.size, U64.unpack_from
        starts = np.zeros(count, np.int64)
        with memoryview(self.mm) as mv:
            done = 0
            if scan_string_starts is not None:
                done, pos = scan_string_starts(mv.cast("B"), pos, starts)
            for i in range(done, count):
                if size - pos < 8:
                    self.pos = pos
                    self.need(8, f"{what}[{i}] length")
                (n,) = unpack(mv, pos)
                pos += 8
                if n > size - pos:
                    raise self.fail(f"{what}[{i}]: length {n} at offset {pos - 8} is larger than the "
                                    f"{size - pos} bytes left")
                starts[i] = pos
                pos += n
        first, self.pos = self.pos, pos
        strings = StringArray(self.mm, starts, first, pos)
        copy = np.frombuffer(self.mm, np.uint8, count=pos - first, offset=first).copy()
        if zero_string_lengths is not None:
            zero_string_lengths(copy, strings.starts, first)
        else:
            length_bytes = np.zeros(copy.size + 1, np.int8)
            length_bytes[strings.starts - 8 - first] += 1  # each index once per statement
            length_bytes[strings.starts - first] -= 1
            copy[np.cumsum(length_bytes[:-1], dtype=np.int8) > 0] = 0
        try:
            copy.tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            bad = int(np.searchsorted(strings.starts, first + e.start, side="right")) - 1
            try:
                strings.raw(bad).decode("utf-8")
            except UnicodeDecodeError as e:
                raise self.fail(f"{what}[{bad}]: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            raise self.fail(f"{what}[{bad}]: not valid UTF-8 ({e.reason})") from None
        return strings

    def _alignment(self, fields: dict[str, Field]) -> int:
        f = fields.get("general.alignment")
        if f is None:
            return DEFAULT_ALIGNMENT
        if f.type != UINT32:
            raise self.fail(f"general.alignment: type {type_name(f)}, expected UINT32")
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
        data_start = align(self.pos, alignment)
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
            expected = align(offset + nbytes, alignment)
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
        release_pages(self.mm, t.offset, t.offset + t.nbytes)  # read once here: not resident for it


class StringArray(Sequence):
    """A GGUF array of strings where it lies in the file's map (checked UTF-8):
    a read-only sequence of str (decoded as read; equal to a list or tuple
    of the same strings), ``raw(i)`` / ``raw_list()`` for the bytes, and
    ``digest()`` of the array's bytes in the file, what a cache built from
    the strings is keyed by (gemma_cy.tokenizers.sp)."""

    def __init__(self, mm: mmap.mmap, starts: np.ndarray, first: int, stop: int) -> None:
        self.mm, self.starts, self.first, self.stop = mm, starts, first, stop
        # each string ends where the next one's 8-byte length begins
        self.ends = np.append(starts[1:] - 8, stop) if starts.size else starts

    def __len__(self) -> int:
        return self.starts.size

    def raw(self, i: int) -> bytes:
        return self.mm[self.starts[i]:self.ends[i]]

    def raw_list(self) -> list[bytes]:
        mm = self.mm
        return [mm[a:b] for a, b in zip(self.starts.tolist(), self.ends.tolist())]

    def index_of(self, raw: bytes) -> int | None:
        """The first index whose string is ``raw``, or None (a search of the
        file's bytes for the string with its length, kept where a string
        starts)."""
        pattern = U64.pack(len(raw)) + raw
        at = self.mm.find(pattern, self.first, self.stop)
        while at >= 0:
            i = int(np.searchsorted(self.starts, at + 8))
            if i < self.starts.size and self.starts[i] == at + 8 and self.ends[i] == at + len(pattern):
                return i
            at = self.mm.find(pattern, at + 1, self.stop)
        return None

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.raw(i).decode("utf-8")

    def __iter__(self):
        return (b.decode("utf-8") for b in self.raw_list())

    def __eq__(self, other) -> bool:
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings at offset {self.first})"

    def digest(self) -> str:
        """BLAKE2b (128 bits, hex) of the array's bytes in the file (each
        string with its length)."""
        with memoryview(self.mm) as mv:
            return hashlib.blake2b(mv[self.first:self.stop], digest_size=16).hexdigest()


def align(n: int, alignment: int) -> int:
    return n + (-n % alignment)


def type_name(f: Field) -> str:
    name = VALUE_TYPE_NAMES[f.type]
    return f"ARRAY of {VALUE_TYPE_NAMES[f.item_type]}" if f.type == ARRAY else name
