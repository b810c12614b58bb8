# k_dot_i8 in portable C, for the generic module (no -m flags). 32 lane sums,
# the layout of the AVX2 module's four 8-wide accumulators, let -O3 vectorize
# the loop with the baseline ISA (SSE2 on x86-64, NEON on arm64) without
# reassociating floats; short per-lane chains (n/32 terms) also keep the
# rounding error of long rows close to the SIMD modules'.

cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef float acc[32]
    cdef float lanes[8]
    cdef Py_ssize_t i = 0, j
    cdef float s
    for j in range(32):
        acc[j] = 0
    while i + 32 <= n:
        for j in range(32):
            acc[j] += q[i + j] * x[i + j]
        i += 32
    while i + 8 <= n:
        for j in range(8):
            acc[j] += q[i + j] * x[i + j]
        i += 8
    for j in range(8):  # as the AVX2 module: (a0 + a1) + (a2 + a3), lane by lane
        lanes[j] = (acc[j] + acc[j + 8]) + (acc[j + 16] + acc[j + 24])
    s = _sum8(lanes)
    while i < n:
        s += q[i] * x[i]
        i += 1
    return s * scale
