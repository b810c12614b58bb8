"""Which SIMD instruction sets this CPU supports (asked of the CPU at run
time, so one build can pick the best kernel on any x86-64)."""

cdef extern from *:
    """
    static int gcy_has(const char *name) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        int f16c_fma = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
        if (name[0] == 'a' && name[3] == '2') return __builtin_cpu_supports("avx2") && f16c_fma;
        if (name[0] == 'a' && name[3] == '5') return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                                                     && __builtin_cpu_supports("avx512vl") && f16c_fma;
        if (name[0] == 'v') return __builtin_cpu_supports("avx512vnni");
        return 0;
    #elif defined(__aarch64__)
        return name[0] == 'n';
    #else
        return 0;
    #endif
    }
    """
    int gcy_has(const char *name) nogil


def supported() -> dict:
    """{'avx2': bool (with FMA and F16C), 'avx512': bool (F+BW+VL, with FMA and F16C),
    'vnni': bool, 'neon': bool}."""
    return {
        "avx2": bool(gcy_has(b"avx2")),
        "avx512": bool(gcy_has(b"avx512")),
        "vnni": bool(gcy_has(b"vnni")),
        "neon": bool(gcy_has(b"neon")),
    }
