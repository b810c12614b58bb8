# Row-at-a-time GEMVs (each row's dot product of the module, prefetching
# ahead) of the matrix types a module has no GEMV of its own for: affine,
# Q4_K and Q5_0 (simd_generic, simd_neon, simd_avx2). Included only where used.


cdef void _gemv_affine_rows(float* out, const uint8_t* rec, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                            Py_ssize_t sub, bint has_offset) noexcept nogil:
    """k_gemv_affine one row at a time (k_dot_affine each), prefetching ahead."""
    cdef Py_ssize_t r, row_bytes = cols // sub * (sub + 4 + (4 if has_offset else 0))
    for r in range(rows):
        _prefetch_row(rec + r * row_bytes, row_bytes)
        out[r] = k_dot_affine(rec + r * row_bytes, x, cols, sub, has_offset)


cdef void _gemv_q4_k_rows(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """The GEMV of a Q4_K matrix one row at a time (k_dot_q4_k each), prefetching ahead."""
    cdef Py_ssize_t r, nb = w.cols // Q4_K_BLOCK
    for r in range(w.rows):
        _prefetch_row(w.blocks + r * nb * Q4_K_BYTES, nb * Q4_K_BYTES)
        out[r] = k_dot_q4_k(w.blocks + r * nb * Q4_K_BYTES, w.ab + r * nb * 16, x, w.cols)


cdef void _gemv_q5_0_rows(float* out, const QMatrix* w, const float* x) noexcept nogil:
    """The GEMV of a Q5_0 matrix one row at a time (k_dot_q5_0 each), prefetching ahead."""
    cdef Py_ssize_t r, nb = w.cols // Q8_0_BLOCK
    for r in range(w.rows):
        _prefetch_row(w.blocks + r * nb * Q5_0_BYTES, nb * Q5_0_BYTES)
        out[r] = k_dot_q5_0(w.blocks + r * nb * Q5_0_BYTES, x, nb)
