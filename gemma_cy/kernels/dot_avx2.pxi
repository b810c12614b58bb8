# k_dot_i8 with AVX2 + FMA intrinsics (module simd_avx2, -mavx2 -mfma).
# Per 8 values: one unaligned 8-byte load widened int8 -> int32 -> f32
# (vpmovsxbd + vcvtdq2ps) and one FMA with 8 activations. Four independent
# accumulators (32 values per step) hide the FMA latency; one chain would be
# latency-bound.

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m128i:
        pass
    ctypedef struct __m256i:
        pass
    ctypedef struct __m256:
        pass
    __m128i _mm_loadl_epi64(const __m128i* p)  # 8 bytes, any alignment
    __m256i _mm256_cvtepi8_epi32(__m128i a)
    __m256 _mm256_cvtepi32_ps(__m256i a)
    __m256 _mm256_loadu_ps(const float* p)
    __m256 _mm256_setzero_ps()
    __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c)
    __m256 _mm256_add_ps(__m256 a, __m256 b)
    void _mm256_storeu_ps(float* p, __m256 a)


cdef inline __m256 _widen8(const int8_t* q) noexcept nogil:
    """q[0:8] as 8 f32 (exact: every int8 is an f32)."""
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(<const __m128i*> q)))


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef __m256 a0 = _mm256_setzero_ps()
    cdef __m256 a1 = _mm256_setzero_ps()
    cdef __m256 a2 = _mm256_setzero_ps()
    cdef __m256 a3 = _mm256_setzero_ps()
    cdef Py_ssize_t i = 0
    cdef float lanes[8]
    cdef float s
    while i + 32 <= n:
        a0 = _mm256_fmadd_ps(_widen8(q + i), _mm256_loadu_ps(x + i), a0)
        a1 = _mm256_fmadd_ps(_widen8(q + i + 8), _mm256_loadu_ps(x + i + 8), a1)
        a2 = _mm256_fmadd_ps(_widen8(q + i + 16), _mm256_loadu_ps(x + i + 16), a2)
        a3 = _mm256_fmadd_ps(_widen8(q + i + 24), _mm256_loadu_ps(x + i + 24), a3)
        i += 32
    while i + 8 <= n:
        a0 = _mm256_fmadd_ps(_widen8(q + i), _mm256_loadu_ps(x + i), a0)
        i += 8
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)))
    s = _sum8(lanes)
    # Fewer than 8 left: scalar, since a wider load could cross the end of a
    # memory-mapped file into an unmapped page.
    while i < n:
        s += q[i] * x[i]
        i += 1
    return s * scale
