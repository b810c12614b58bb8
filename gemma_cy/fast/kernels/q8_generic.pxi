# int8 activations (the opt-in "q8" mode) in portable C, for the generic and
# NEON modules (contracts in api.pxi; the AVX2 and AVX-512 modules use
# q8_x86.pxi). -O3 vectorizes the 32-value inner loops with the baseline ISA.
#
# Order (every module's, and the reference's): each block's integer sum is
# exact (int32, and so in f32); one f32 FMA per block adds isum * scale_b
# to the row's f32 sum, block after block (docs/numerics.md#activation-modes).

from libc.math cimport fmaf, rintf
from libc.math cimport INFINITY
from libc.stdint cimport int32_t


cdef inline float _amax_bits(const float* x, Py_ssize_t n) noexcept nogil:
    """max |x[i]| taken on the bit patterns with the sign cleared, so a NaN
    (any NaN) wins over +inf, which wins over every finite value: a block
    holding a non-finite value gets a non-finite scale (and the dot products
    a non-finite result), never a silently finite one."""
    cdef uint32_t bits, top = 0
    cdef float result
    cdef Py_ssize_t i
    for i in range(n):
        memcpy(&bits, &x[i], 4)
        bits &= 0x7FFFFFFF
        if bits > top:
            top = bits
    memcpy(&result, &top, 4)
    return result


cdef void k_quantize_q8(int8_t* q, float* d, const float* x, Py_ssize_t n_blocks) noexcept nogil:
    cdef Py_ssize_t b, i
    cdef float amax, scale, inv, v
    for b in range(n_blocks):
        amax = _amax_bits(x + b * Q8_0_BLOCK, Q8_0_BLOCK)
        scale = amax / <float> 127.0
        inv = <float> 1.0 / scale if scale != 0 else <float> 0.0
        if inv == INFINITY:  # a block so small that 1/d overflows: q = 0, as for d == 0
            inv = 0
        d[b] = scale
        for i in range(Q8_0_BLOCK):
            v = rintf(x[b * Q8_0_BLOCK + i] * inv)
            # finite blocks give |v| <= 127; NaN/out of range -> -128, as the
            # AVX2 conversion (0x80000000) saturated to int8 does
            q[b * Q8_0_BLOCK + i] = <int8_t> v if -128 <= v <= 127 else -128


cdef inline int32_t _isum_q8(const int8_t* a, const int8_t* b) noexcept nogil:
    """sum of the 32 products a[i] * b[i], exact in int32."""
    cdef int32_t s = 0
    cdef Py_ssize_t i
    for i in range(Q8_0_BLOCK):
        s += a[i] * b[i]
    return s


cdef float k_dot_i8_q8(const int8_t* w, const int8_t* xq, const float* xd, Py_ssize_t n_blocks,
                       float scale) noexcept nogil:
    cdef float acc = 0
    cdef Py_ssize_t b
    for b in range(n_blocks):
        acc = fmaf(<float> _isum_q8(w + b * Q8_0_BLOCK, xq + b * Q8_0_BLOCK), xd[b], acc)
    return acc * scale


cdef float k_dot_q8_0_q8(const uint8_t* blocks, const int8_t* xq, const float* xd,
                         Py_ssize_t n_blocks) noexcept nogil:
    cdef float acc = 0
    cdef float s
    cdef const uint8_t* blk
    cdef Py_ssize_t b
    for b in range(n_blocks):
        blk = blocks + b * Q8_0_BYTES
        s = _block_d(blk) * xd[b]
        acc = fmaf(<float> _isum_q8(<const int8_t*> (blk + 2), xq + b * Q8_0_BLOCK), s, acc)
    return acc


cdef void _dot_rows_q8(float* out, const QMatrix* w, Py_ssize_t row, Py_ssize_t n_rows,
                       const int8_t* xq, const float* xd) noexcept nogil:
    """out[i] = k_dot_*_q8 of row row + i of w, i < n_rows."""
    cdef Py_ssize_t nb = w.cols // Q8_0_BLOCK, i
    for i in range(n_rows):
        if w.layout == QLAYOUT_I8_TENSOR:
            out[i] = k_dot_i8_q8(w.q + (row + i) * w.cols, xq, xd, nb, w.scale)
        elif w.layout == QLAYOUT_AFFINE:
            out[i] = k_dot_affine_q8(w.blocks + (row + i) * _affine_row_bytes(w), xq, xd, w.cols, w.sub,
                                     w.has_offset)
        else:
            out[i] = k_dot_q8_0_q8(w.blocks + (row + i) * nb * Q8_0_BYTES, xq, xd, nb)


cdef inline bint _q8_gemv_takes_q4_1() noexcept nogil:
    """The q8 mode's decode has no Q4_1 GEMV of its own here: the engine lays
    Q4_1 matrices out as records once (forward.pxi)."""
    return False


cdef bint k_q8_stores_panels() noexcept nogil:
    """No: this module's q8 products read Q8_0 blocks (api.pxi)."""
    return False


cdef void k_pack_q8_panels(uint8_t* dst, const QMatrix* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    pass  # never called: k_q8_stores_panels() is False here
