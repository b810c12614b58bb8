# The C interface of every gemma_cy.simd_<isa> module: each module's .pxd
# includes this file, so Cython checks every ISA's definitions against these
# prototypes, and a later Cython module can `from gemma_cy.simd_avx2 cimport ...`
# (or include the kernels and get them inlined).
#
# Conventions (llama2.c's): outputs first, then inputs, then sizes. Pointers are
# raw and trusted (no checks: the def wrappers in common.pxi validate); int8
# rows may start at any byte address; f32 pointers need only 4-byte alignment.
# An output may be the same pointer as an input of the same shape (in-place)
# except in k_gemv_i8, where out must not overlap x.

from libc.stdint cimport int8_t

cdef enum RopePairing:
    ROPE_INTERLEAVED = 0  # pair j is (x[2j], x[2j+1])        (seed, SPEC A5)
    ROPE_HALF_SPLIT = 1   # pair j is (x[j], x[j + head_dim/2]) (Gemma, SPEC B)

# (sum_i q[i] * x[i]) * scale: f32 products and sums, scale applied once after
# the sum (SPEC A2). q (n,) int8, x (n,) f32.
cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil

# out[r] = k_dot_i8(q + r*cols, x, cols, scale): q (rows, cols) int8 row-major
# with rows back to back, x (cols,), out (rows,).
cdef void k_gemv_i8(float* out, const int8_t* q, float scale, const float* x,
                    Py_ssize_t rows, Py_ssize_t cols) noexcept nogil

# out = x / sqrt(mean(x^2) + eps) * g, or * (1 + g) when one_plus (Gemma).
# x, g, out (n,); the sum of squares and the 1/sqrt are in f64.
cdef void k_rmsnorm(float* out, const float* x, const float* g, Py_ssize_t n,
                    double eps, bint one_plus) noexcept nogil

# cos[j], sin[j] of pos * base^(-2j/head_dim), j < head_dim/2: computed in f64
# and rounded once to f32 (as reference.layers.rope_cos_sin).
cdef void k_rope_cos_sin(float* cos_out, float* sin_out, Py_ssize_t head_dim,
                         Py_ssize_t pos, double base) noexcept nogil

# Rotates in place every pair (a, b) of each head of x (n_heads, head_dim):
# (a, b) -> (a cos_j - b sin_j, a sin_j + b cos_j), pairs chosen by `pairing`.
cdef void k_rope_apply(float* x, const float* cos_t, const float* sin_t, Py_ssize_t n_heads,
                       Py_ssize_t head_dim, RopePairing pairing) noexcept nogil

# Stable softmax of x (n,) in place: exp(x - max) / sum, the sum in f64.
cdef void k_softmax(float* x, Py_ssize_t n) noexcept nogil

# out = act(gate) * up, act computed in f64 and the product rounded once to f32.
cdef void k_silu_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil
cdef void k_gelu_tanh_mul(float* out, const float* gate, const float* up, Py_ssize_t n) noexcept nogil

# x += y (the residual add), x, y (n,).
cdef void k_add(float* x, const float* y, Py_ssize_t n) noexcept nogil

# out = q * scale (one f32 product each: bit-exact with NumPy's q.astype(f32) * scale).
cdef void k_dequantize_i8(float* out, const int8_t* q, float scale, Py_ssize_t n) noexcept nogil
