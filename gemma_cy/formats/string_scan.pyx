"""Where each string of a GGUF string array starts: the reader's one loop
that runs once per vocabulary entry (262,144 of them for Gemma 3), in C.

A GGUF string is a u64 little-endian byte count, then that many bytes
(docs/formats.md). ``gguf_reader._Parser._strings`` calls this first and
then goes on in Python from wherever it stopped, so a string that does not
fit is reported there, with the Python loop's own message.
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy


def scan_string_starts(const uint8_t[::1] data, Py_ssize_t pos, int64_t[::1] starts):
    """Read the strings back to back from offset ``pos`` of ``data`` and write
    the offset of string i's first byte to ``starts[i]``, until all
    ``len(starts)`` are read or the next one does not fit (fewer than 8
    bytes left for its length, or a length past the end of ``data``).
    Returns (strings read, the offset after the last one read).

    The length is read in the host's byte order: the caller uses this on a
    little-endian host only."""
    cdef Py_ssize_t size = data.shape[0], count = starts.shape[0], i = 0
    cdef uint64_t n
    if pos < 0 or pos > size:
        raise ValueError(f"scan_string_starts: offset {pos} is outside the {size} bytes")
    with nogil:
        while i < count and size - pos >= 8:
            memcpy(&n, &data[pos], 8)
            if n > <uint64_t> (size - pos - 8):
                break
            pos += 8
            starts[i] = pos
            pos += <Py_ssize_t> n
            i += 1
    return i, pos


def zero_string_lengths(uint8_t[::1] joined, const int64_t[::1] starts, Py_ssize_t first):
    """Zero the 8 length bytes before each string in ``joined``, a copy of
    the array's bytes from offset ``first`` on (``starts`` as
    scan_string_starts wrote them, in order): what is left is the strings
    with NULs between them, for one UTF-8 check of them all."""
    cdef Py_ssize_t i, at, end = 0, size = joined.shape[0]
    for i in range(starts.shape[0]):  # checked first: the loop below writes without bounds checks
        at = starts[i] - first
        if at - 8 < end or at > size:
            raise ValueError(f"zero_string_lengths: string {i} starts at {starts[i]}, "
                             f"not within {first + end + 8}..{first + size}")
        end = at
    with nogil:
        for i in range(starts.shape[0]):
            at = starts[i] - first
            joined[at - 8] = 0; joined[at - 7] = 0; joined[at - 6] = 0; joined[at - 5] = 0
            joined[at - 4] = 0; joined[at - 3] = 0; joined[at - 2] = 0; joined[at - 1] = 0
