# k_dot_i8 with AVX-512 F/BW/VL intrinsics (module simd_avx512).
# Per 16 values: one unaligned 16-byte load widened int8 -> int32 -> f32 and
# one FMA; four independent accumulators (64 values per step). The tail uses
# masked loads (AVX512BW+VL for bytes), which never touch memory past the end.

cdef extern from "immintrin.h" nogil:
    ctypedef struct __m128i:
        pass
    ctypedef struct __m512i:
        pass
    ctypedef struct __m512:
        pass
    ctypedef unsigned short __mmask16
    __m128i _mm_loadu_si128(const __m128i* p)
    __m128i _mm_maskz_loadu_epi8(__mmask16 k, const void* p)
    __m512i _mm512_cvtepi8_epi32(__m128i a)
    __m512 _mm512_cvtepi32_ps(__m512i a)
    __m512 _mm512_loadu_ps(const void* p)
    __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p)
    __m512 _mm512_setzero_ps()
    __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c)
    __m512 _mm512_add_ps(__m512 a, __m512 b)
    void _mm512_storeu_ps(void* p, __m512 a)


cdef inline __m512 _widen16(const int8_t* q) noexcept nogil:
    """q[0:16] as 16 f32."""
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(<const __m128i*> q)))


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef __m512 a0 = _mm512_setzero_ps()
    cdef __m512 a1 = _mm512_setzero_ps()
    cdef __m512 a2 = _mm512_setzero_ps()
    cdef __m512 a3 = _mm512_setzero_ps()
    cdef Py_ssize_t i = 0
    cdef __mmask16 tail
    cdef float lanes[16]
    while i + 64 <= n:
        a0 = _mm512_fmadd_ps(_widen16(q + i), _mm512_loadu_ps(x + i), a0)
        a1 = _mm512_fmadd_ps(_widen16(q + i + 16), _mm512_loadu_ps(x + i + 16), a1)
        a2 = _mm512_fmadd_ps(_widen16(q + i + 32), _mm512_loadu_ps(x + i + 32), a2)
        a3 = _mm512_fmadd_ps(_widen16(q + i + 48), _mm512_loadu_ps(x + i + 48), a3)
        i += 64
    while i + 16 <= n:
        a0 = _mm512_fmadd_ps(_widen16(q + i), _mm512_loadu_ps(x + i), a0)
        i += 16
    if i < n:
        tail = <__mmask16> ((1 << (n - i)) - 1)  # the n - i < 16 low lanes
        a1 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail, q + i))),
            _mm512_maskz_loadu_ps(tail, x + i), a1)
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
    return (_sum8(lanes) + _sum8(lanes + 8)) * scale
