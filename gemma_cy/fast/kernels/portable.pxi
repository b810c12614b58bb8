# The portable kernels of the modules without SIMD ones of their own
# (simd_generic, simd_neon): a Q8_0 matrix's GEMV row by row, an affine row
# and a Q4_K row times x in portable C. Included only where used, so no
# module carries them unused.


cdef void _gemv_q8_0_rows(float* out, const uint8_t* blocks, const float* x,
                          Py_ssize_t rows, Py_ssize_t n_blocks) noexcept nogil:
    """k_gemv_q8_0 one row at a time (k_dot_q8_0 each), prefetching ahead."""
    cdef Py_ssize_t r, row_bytes = n_blocks * Q8_0_BYTES
    for r in range(rows):
        _prefetch_row(blocks + r * row_bytes, row_bytes)
        out[r] = k_dot_q8_0(blocks + r * row_bytes, x, n_blocks)


cdef inline const uint8_t* _affine_portable_acc(float* acc, const uint8_t* rec, const float* x, Py_ssize_t cols,
                                                Py_ssize_t sub, bint has_offset) noexcept nogil:
    """acc[8 g + j] += the exact weights of the next cols values (records at
    rec) times x, column 8 g + j of every 32-value block; returns the record
    after them."""
    cdef float a, b = 0
    cdef const int8_t* q
    cdef Py_ssize_t rb = sub + 4 + (4 if has_offset else 0), k, h, j
    for k in range(cols // 32):
        h = 0
        while h < 32:  # one record of 32, or two of 16
            q = <const int8_t*> rec
            a = _load_f32(rec + sub)
            if has_offset:
                b = _load_f32(rec + sub + 4)
            for j in range(sub):
                acc[h + j] += ((a * q[j]) - b) * x[h + j]
            rec += rb
            h += sub
        x += 32
    return rec


cdef inline float _affine_portable_sum(const float* acc) noexcept nogil:
    cdef float lanes[8]
    cdef Py_ssize_t j
    for j in range(8):
        lanes[j] = (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j])
    return _sum8(lanes)


cdef float _dot_affine_portable(const uint8_t* rec, const float* x, Py_ssize_t cols, Py_ssize_t sub,
                                bint has_offset) noexcept nogil:
    """One row of an affine matrix times x in portable C (the modules without
    an affine kernel of their own): the order above, in 32 lane sums
    acc[8 g + j] (column 8 g + j of every 32-value block; one loop -O3
    vectorizes), unfused (the modules that run it are built with
    -ffp-contract=off)."""
    cdef float acc[32]
    cdef Py_ssize_t j
    for j in range(32):
        acc[j] = 0
    _affine_portable_acc(acc, rec, x, cols, sub, has_offset)
    return _affine_portable_sum(acc)


cdef float _dot_q4_k_portable(const uint8_t* row, const float* ab, const float* x, Py_ssize_t cols) noexcept nogil:
    """k_dot_q4_k for the modules without their own: _dot_affine_portable of
    the row's records, one super-block's records at a time."""
    cdef float acc[32]
    cdef uint8_t rec[Q4_K_RECORD_BYTES]
    cdef Py_ssize_t j, k
    for j in range(32):
        acc[j] = 0
    for k in range(cols // Q4_K_BLOCK):
        k_q4_k_records(rec, row + k * Q4_K_BYTES, ab + 16 * k)
        _affine_portable_acc(acc, rec, x + k * Q4_K_BLOCK, Q4_K_BLOCK, 32, True)
    return _affine_portable_sum(acc)
