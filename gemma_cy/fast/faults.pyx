# cython: language_level=3
"""One line and exit 1, instead of a crash, when a memory-mapped model file
shrinks under the process (docs/errors.md#faults).

gemma-cy maps weights files read-only and runs on the mapped bytes (a 250 MB
model is not copied). If the file is truncated or rewritten in place while
it is in use, the next read of a page past its new end raises SIGBUS, which
would kill the process with "Bus error" and no explanation; the handler
installed here writes one line to stderr and exits with status 1. Nothing
can be recovered at that point (the fault can come from inside a kernel
running without the GIL), so the handler only uses write() and _exit(),
which are safe in a signal handler. Replacing the file by renaming a new
one over it is safe without any of this: the mapping keeps the old file.
"""
from libc.string cimport memcpy

cdef extern from "<signal.h>" nogil:
    ctypedef void (*sighandler_t)(int)
    int SIGBUS
    sighandler_t signal(int signum, sighandler_t handler)

cdef extern from "<unistd.h>" nogil:
    ssize_t write(int fd, const void* buf, size_t count)
    void _exit(int status)

cdef enum:
    MESSAGE_MAX = 512
cdef char _message[MESSAGE_MAX]
cdef size_t _message_len = 0


cdef void _on_bus_error(int signum) noexcept nogil:
    write(2, _message, _message_len)
    _exit(1)


def install_bus_error_handler(str message) -> None:
    """On SIGBUS, write ``message`` (one line; a newline is added) to stderr
    and exit with status 1."""
    global _message_len
    cdef bytes line = (message.replace("\n", " ") + "\n").encode("utf-8", "replace")[:MESSAGE_MAX]
    memcpy(_message, <const char*>line, len(line))
    _message_len = len(line)
    signal(SIGBUS, _on_bus_error)
