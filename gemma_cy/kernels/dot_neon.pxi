# k_dot_i8 with NEON intrinsics (module simd_neon, aarch64 only).
# Per 8 values: one 8-byte load (any alignment) widened int8 -> int16 ->
# 2 x int32 -> 2 x f32 and two FMAs; four independent accumulators (16
# values per step).

cdef extern from "arm_neon.h" nogil:
    ctypedef struct int8x8_t:
        pass
    ctypedef struct int16x8_t:
        pass
    ctypedef struct int16x4_t:
        pass
    ctypedef struct int32x4_t:
        pass
    ctypedef struct float32x4_t:
        pass
    int8x8_t vld1_s8(const int8_t* p)
    int16x8_t vmovl_s8(int8x8_t a)
    int16x4_t vget_low_s16(int16x8_t a)
    int16x4_t vget_high_s16(int16x8_t a)
    int32x4_t vmovl_s16(int16x4_t a)
    float32x4_t vcvtq_f32_s32(int32x4_t a)
    float32x4_t vld1q_f32(const float* p)
    float32x4_t vdupq_n_f32(float v)
    float32x4_t vfmaq_f32(float32x4_t acc, float32x4_t a, float32x4_t b)  # acc + a*b
    float32x4_t vaddq_f32(float32x4_t a, float32x4_t b)
    void vst1q_f32(float* p, float32x4_t a)


cdef float k_dot_i8(const int8_t* q, const float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef float32x4_t a0 = vdupq_n_f32(0)
    cdef float32x4_t a1 = vdupq_n_f32(0)
    cdef float32x4_t a2 = vdupq_n_f32(0)
    cdef float32x4_t a3 = vdupq_n_f32(0)
    cdef int16x8_t w
    cdef Py_ssize_t i = 0
    cdef float lanes[8]
    cdef float s
    while i + 16 <= n:
        w = vmovl_s8(vld1_s8(q + i))
        a0 = vfmaq_f32(a0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i))
        a1 = vfmaq_f32(a1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 4))
        w = vmovl_s8(vld1_s8(q + i + 8))
        a2 = vfmaq_f32(a2, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i + 8))
        a3 = vfmaq_f32(a3, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 12))
        i += 16
    if i + 8 <= n:
        w = vmovl_s8(vld1_s8(q + i))
        a0 = vfmaq_f32(a0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vld1q_f32(x + i))
        a1 = vfmaq_f32(a1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), vld1q_f32(x + i + 4))
        i += 8
    vst1q_f32(lanes, vaddq_f32(a0, a2))
    vst1q_f32(lanes + 4, vaddq_f32(a1, a3))
    s = _sum8(lanes)
    while i < n:  # fewer than 8 left (see dot_avx2.pxi)
        s += q[i] * x[i]
        i += 1
    return s * scale
