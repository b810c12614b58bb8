# cython: language_level=3, boundscheck=False, wraparound=False
"""A grammar's packed token mask applied to the logits, in C
(docs/structured_output.md#what-it-costs).

The constraint engine (llguidance) writes one bit per token id, bit i % 32
of 32-bit word i // 32 set when id i may come next; every id whose bit is
clear gets logit -inf. For Gemma 3's 262,144 ids that is one pass over 1 MiB
of logits and 32 KiB of mask, done here without the GIL; NumPy's
unpackbits and masked copy took ~155 us a token.
"""
from libc.math cimport INFINITY
from libc.stdint cimport uint32_t
from libc.string cimport memcpy


def apply_token_mask(float[::1] out, const float[::1] logits, const uint32_t[::1] bits):
    """out[i] = logits[i] where bit i of ``bits`` is set, else -inf; returns
    the number of ids allowed. Lengths are checked here (the loop has no
    bounds checks): ``out`` and ``logits`` the same, ``bits`` enough words."""
    cdef Py_ssize_t n = logits.shape[0], i, w, start, end
    cdef Py_ssize_t allowed = 0
    cdef uint32_t word
    if out.shape[0] != n:
        raise ValueError(f"out holds {out.shape[0]} logits, logits {n}")
    if bits.shape[0] * 32 < n:
        raise ValueError(f"mask of {bits.shape[0]} words covers {bits.shape[0] * 32} ids, logits {n}")
    with nogil:
        for w in range((n + 31) // 32):
            word = bits[w]
            start = w * 32
            end = min(start + 32, n)
            if word == 0:  # most words of a narrow grammar: nothing allowed
                for i in range(start, end):
                    out[i] = -INFINITY
            elif word == <uint32_t> 0xFFFFFFFF:
                memcpy(&out[start], &logits[start], (end - start) * sizeof(float))
                allowed += end - start
            else:
                for i in range(start, end):
                    if (word >> (i - start)) & 1:
                        out[i] = logits[i]
                        allowed += 1
                    else:
                        out[i] = -INFINITY
    return allowed
