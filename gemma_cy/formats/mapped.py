"""Model files on disk, the same way for every format: opening one read-only
and memory-mapping it with one-line errors (a FIFO, a directory or a short
file is refused alike), and writing one atomically."""
from __future__ import annotations

import mmap
import os
import stat
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from ..errors import ModelFormatError


def check_regular(name: str, st: os.stat_result, kind: str) -> None:
    """ModelFormatError unless ``st`` (of ``name``) is a regular file: a
    directory, a FIFO (reading would block) or a device (/dev/zero would
    never end) is refused before anything is read."""
    if stat.S_ISDIR(st.st_mode):
        raise ModelFormatError(f"{name}: is a directory, expected a {kind} file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelFormatError(f"{name}: not a regular file (a pipe, socket or device), expected a {kind} file")


def map_file(name: str, kind: str, header_size: int, huge_pages: bool = True) -> mmap.mmap:
    """Open ``name`` (a regular file of at least ``header_size`` bytes, a
    ``kind`` file such as "GMW1") and map it read-only; ``huge_pages``:
    advise 2 MiB pages (advise_huge_pages), for a file read whole at every
    step, not for one read a few pages at a time."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang before fstat can refuse it.
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ModelFormatError(f"{name}: no such file") from None
    except OSError as e:
        raise ModelFormatError(f"{name}: cannot open: {e.strerror}") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise ModelFormatError(f"{name!r}: cannot open: {e}") from None
    try:
        st = os.fstat(fd)
        check_regular(name, st, kind)
        if st.st_size < header_size:
            raise ModelFormatError(
                f"{name}: truncated header: file has {st.st_size} bytes, the {kind} header is "
                f"{header_size} bytes")
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{name}: cannot map the file: {e}") from None
        if huge_pages:
            advise_huge_pages(mm)
        return mm
    finally:
        os.close(fd)


def advise_huge_pages(mm: mmap.mmap) -> None:
    """Ask for 2 MiB pages on the map (MADV_HUGEPAGE), where the kernel has
    them for files: a page fault then reads the file from disk in 2 MiB
    folios, which the map gets as 2 MiB pages (FilePmdMapped); otherwise the
    page cache takes whatever sizes its readahead picks (measured:
    docs/benchmarks.md#history, eleventh session). A kernel without it (or
    that refuses it) maps the file as before."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass


def release_pages(mm: mmap.mmap, start: int, stop: int) -> None:
    """Drop this process's mapping of the whole pages inside bytes [start,
    stop) of ``mm``, a read-only map of a file: the file's page cache keeps
    them and a later read maps them again, unchanged, so views of those
    bytes stay valid. What is only read once (checked, copied or converted
    at load) then stops counting towards the process's resident memory."""
    first = -(-max(start, 0) // mmap.PAGESIZE) * mmap.PAGESIZE
    last = min(stop, len(mm)) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        mm.madvise(mmap.MADV_DONTNEED, first, last - first)


def return_freed_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's
    ``malloc_trim``; nothing elsewhere). Loading a model frees tens of MB of
    short-lived objects (the vocabulary's UTF-8 check, tables built once),
    and glibc keeps such pages resident for reuse: ~17 MB of Gemma 3's
    start-up peak (docs/architecture.md#memory)."""
    global _trim
    if _trim is None:
        import ctypes
        try:
            _trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
        except (OSError, AttributeError):  # not glibc
            _trim = False
    if _trim:
        _trim(0)


_trim = None  # glibc's malloc_trim once looked up; False where there is none


@contextmanager
def atomic_write(name: str) -> Iterator[BinaryIO]:
    """Write ``name`` through a private ``.partial`` file renamed into place
    only when the block completes, so a reader never sees half a file; an
    OSError becomes a one-line ModelFormatError."""
    tmp = f"{name}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, name)
    except OSError as e:
        raise ModelFormatError(f"{name}: cannot write: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
