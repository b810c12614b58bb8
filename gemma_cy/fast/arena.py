"""The fast engine's weight matrices, copied out of the file's memory map into
one anonymous arena backed by 2 MiB pages, in the order a decode step reads
them, when the kernel does not map the file's own pages that way
(lay_out_for_decode).

Why: decode streams every matrix from DRAM once per token. Through a map of
4 KiB pages that is tens of thousands of pages per step, and anonymous
memory advised MADV_HUGEPAGE gets 2 MiB pages (AnonHugePages), from which
Gemma 3 decoded 3-7% faster on a host whose kernel never mapped a file's
page cache with 2 MiB pages. Where the page cache holds 2 MiB folios and the
file's map gets them, the copy is skipped (lay_out_for_decode). The
measurements: docs/benchmarks.md#history (the arena's A/B; eleventh
session for the map's).

Memory: each source range's pages are released from this process
(MADV_DONTNEED on the shared read-only map: the file's page cache keeps them,
and a later read, by the reference engine say, maps them again), a chunk at a
time, so peak RSS stays about what the map alone would reach. Only matrices
that come from a read-only file map are copied; ones already in memory (built or
quantized at load) stay where they are, and so does everything when the
arena cannot be allocated.
"""
from __future__ import annotations

import mmap
from dataclasses import replace

import numpy as np

from ..formats.mapped import release_pages
from ..quant.affine import Q4_KTensor
from ..quant.ggml import Q4_1Tensor, Q5_0Tensor
from ..quant.tensors import Int8Tensor, Q8_0Tensor

COPY_CHUNK_BYTES = 8 << 20  # copied, then released from the map, at a time
ALIGN_BYTES = 64  # each matrix starts on a cache line
# Run from the file's own map when at least this share of the streamed
# matrices' mapped bytes is in 2 MiB pages (lay_out_for_decode)
MAP_HUGE_SHARE = 0.5


def _values(tensor) -> np.ndarray | None:
    """The stored values of a weight matrix (int8 q, Q8_0 or ggml blocks), or
    None for anything else (a vector, an f32 tensor, records built at load)."""
    if isinstance(tensor, Int8Tensor) and tensor.q.ndim == 2:
        return tensor.q
    if isinstance(tensor, Q8_0Tensor) and tensor.blocks.ndim == 3:
        return tensor.blocks
    if isinstance(tensor, (Q4_KTensor, Q4_1Tensor, Q5_0Tensor)):
        return tensor.blocks
    return None


def read_only_map(array: np.ndarray) -> mmap.mmap | None:
    """The read-only mmap.mmap under ``array`` (through its chain of bases),
    or None. Read-only: its pages can be dropped (MADV_DONTNEED) and read
    back unchanged; a writable map (an arena, anonymous memory) would come
    back as zeros, so it is never a source."""
    base = array.base
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    if isinstance(base, mmap.mmap) and memoryview(base).readonly:
        return base
    return None


def release_range(source: mmap.mmap, start: int, stop: int) -> None:
    """Drop this process's mapping of the whole pages inside the address range
    [start, stop) of ``source`` (a read-only shared file map)."""
    map_start = np.frombuffer(source, np.uint8, count=1).ctypes.data
    release_pages(source, start - map_start, stop - map_start)


def _copy_releasing(dst: np.ndarray, src: np.ndarray, source: mmap.mmap) -> None:
    """dst[...] = src (both C-contiguous), COPY_CHUNK_BYTES at a time, each
    chunk's source pages released once copied."""
    flat_dst, flat_src = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    for at in range(0, flat_src.size, COPY_CHUNK_BYTES):
        chunk = flat_src[at:at + COPY_CHUNK_BYTES]
        flat_dst[at:at + chunk.size] = chunk
        release_range(source, chunk.ctypes.data, chunk.ctypes.data + chunk.size)


def pack_matrices(tensors: dict[str, object], order: list[str]) -> tuple[dict[str, object], object]:
    """Copy the matrices mapped read-only from a file among ``tensors[name] for name in order``
    into one arena, in that order. Returns (name -> tensor: the copies, and
    every other named tensor as it was; the arena, to keep alive while the
    copies are used, or None when nothing was copied). Duplicate names are
    packed once (a tied embedding)."""
    names = [n for n in dict.fromkeys(order)
             if (v := _values(tensors[n])) is not None and v.flags.c_contiguous and read_only_map(v) is not None]
    packed = {n: tensors[n] for n in order}
    if not names:
        return packed, None
    starts, size = [], 0
    for n in names:
        starts.append(size)
        size += -(-_values(tensors[n]).nbytes // ALIGN_BYTES) * ALIGN_BYTES
    try:
        arena = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # no room for a second copy: run from the file's map, as before
        return packed, None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE)
    memory = np.frombuffer(arena, np.uint8)
    for n, start in zip(names, starts):
        src = _values(tensors[n])
        dst = memory[start:start + src.nbytes].view(src.dtype).reshape(src.shape)
        _copy_releasing(dst, src, read_only_map(src))
        dst.flags.writeable = False
        # (Q8_0Tensor, Q4_KTensor, Q4_1Tensor, Q5_0Tensor hold blocks)
        field = "q" if isinstance(tensors[n], Int8Tensor) else "blocks"
        packed[n] = replace(tensors[n], **{field: dst})
    return packed, arena


def lay_out_for_decode(tensors: dict[str, object], order: list[str]) -> tuple[dict[str, object], object]:
    """``pack_matrices(tensors, order)``, unless the kernel already maps the
    file's pages of those matrices with 2 MiB pages: then the same
    (name -> tensor) dict, every matrix left in the map, and no arena.

    Why: on a kernel whose page cache holds large folios (ext4 and XFS on
    Linux 6.x; formats.mapped.advise_huge_pages asks for them), the file's
    map is as good to stream from as the arena, and the arena's 2 MiB pages
    are not free: a fresh anonymous page is zeroed on first touch, which on
    the benchmark's virtual machine was most of the CLI's start to its first
    token. With at least MAP_HUGE_SHARE of the pages in 2 MiB pages, the
    arena could gain at most about half of its decode gain, which would
    repay that start-up only after hundreds of tokens (docs/architecture.md#memory,
    docs/benchmarks.md#history, eleventh session)."""
    share = huge_page_share(tensors, order)
    if share is not None and share >= MAP_HUGE_SHARE:
        return {n: tensors[n] for n in order}, None
    return pack_matrices(tensors, order)


def huge_page_share(tensors: dict[str, object], order: list[str]) -> float | None:
    """The share of the pages of the read-only file maps holding the matrices
    ``tensors[name] for name in order`` that this process maps with 2 MiB
    pages, once every page of those matrices is mapped (each is read once
    here: from the page cache, a few ms for Gemma 3; from disk, what the
    first forward pass would read anyway). From Linux's /proc/self/smaps
    (FilePmdMapped over Rss of each map); None without it or without a
    mapped matrix."""
    maps: dict[int, int] = {}  # id -> the map's first address
    for n in dict.fromkeys(order):
        v = _values(tensors[n])
        source = None if v is None or not v.flags.c_contiguous else read_only_map(v)
        if source is None:
            continue
        int(v.reshape(-1).view(np.uint8)[::mmap.PAGESIZE].max())  # maps every page of the matrix
        maps[id(source)] = np.frombuffer(source, np.uint8, count=1).ctypes.data
    if not maps:
        return None
    try:
        with open("/proc/self/smaps", "rb") as f:
            smaps = f.read().decode("ascii", "replace")
    except OSError:
        return None
    huge = resident = 0
    starts, inside = set(maps.values()), False
    for line in smaps.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and not line[:1].isupper():  # a mapping's first line: "start-stop perms ..."
            inside = int(head.split("-")[0], 16) in starts
        elif inside and line.startswith(("Rss:", "FilePmdMapped:")):
            kb = int(line.split()[1])
            if line.startswith("Rss:"):
                resident += kb
            else:
                huge += kb
    return huge / resident if resident else None


def release_file_maps(keepalive: list) -> None:
    """Drop this process's mapping of every page of the read-only file maps
    in ``keepalive`` (a Weights' keepalive).

    FastModel calls it after each layer's norm gains are read: reading a few
    KB of a file maps its neighbourhood too (fault-around; on a kernel with
    large page-cache folios, the whole folio), so the gains of Gemma 3 270M,
    which lie between its matrices in the file, mapped ~70 MB of matrix pages
    that pack_matrices had released, and the CLI's peak RSS went from ~1.25x
    to 1.55x the file's size (measured on an Intel Xeon host, kernel 6.18).
    Whatever the engine still reads through a map (a matrix left there when
    no arena could be had) faults back in, unchanged, so views of it stay
    valid (release_pages)."""
    for source in keepalive:
        if isinstance(source, mmap.mmap) and memoryview(source).readonly:
            release_pages(source, 0, len(source))
