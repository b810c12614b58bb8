# k_dot_i8 in portable C, for the generic module (no -m flags). Eight lane
# sums, the same layout as one AVX2 register, let -O3 vectorize the loop with
# the baseline ISA (SSE2 on x86-64, NEON on arm64) without reassociating floats.

cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef float acc[8]
    cdef Py_ssize_t i = 0, j
    cdef float s
    for j in range(8):
        acc[j] = 0
    while i + 8 <= n:
        for j in range(8):
            acc[j] += q[i + j] * x[i + j]
        i += 8
    s = _sum8(acc)
    while i < n:
        s += q[i] * x[i]
        i += 1
    return s * scale
