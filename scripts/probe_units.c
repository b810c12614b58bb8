/* What one core's 512-bit vector units sustain: the cost, in core cycles,
 * of each AVX-512 instruction the avx512 kernels are made of, alone and in
 * pairs (docs/benchmarks.md#history, seventeenth session).
 *
 *     gcc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma \
 *         scripts/probe_units.c -o /tmp/probe_units && /tmp/probe_units
 *
 * "alone": 8 independent chains of one instruction (enough to cover a 4-cycle
 * latency at two per cycle), cycles per instruction. "pair": 4 chains of A
 * and 4 of B interleaved, cycles per A + B: 2.0 for two instructions that
 * need the same unit, 1.0 for two that run side by side. Cycles come from a
 * chain of dependent integer adds (1 cycle each) timed in the same process,
 * so the figures do not depend on the clock; on a shared host, run it twice.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define N 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Seconds per cycle: N dependent 1-cycle adds. */
static double cycle_seconds(void) {
    long x = 1;
    double t = now();
    for (long i = 0; i < N / 8; i++)
        __asm__ volatile("add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
                         "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0" : "+r"(x));
    return (now() - t) / N;
}

static __m512 c1;
static __m512i ci;

#define I(a) _mm512_castps_si512(a)
#define F(a) _mm512_castsi512_ps(a)
#define FMA(a) _mm512_fmadd_ps(a, c1, c1)
#define MUL(a) _mm512_mul_ps(a, c1)
#define ADD(a) _mm512_add_ps(a, c1)
#define CVT(a) _mm512_cvtepi32_ps(I(a))
#define PERM(a) _mm512_permutexvar_ps(I(a), c1)
#define PERM2(a) _mm512_permutex2var_ps(c1, I(a), c1)
#define TERN(a) F(_mm512_ternarylogic_epi32(I(a), ci, ci, 0xE4))
#define RORV(a) F(_mm512_rorv_epi32(I(a), ci))
#define PADD(a) F(_mm512_add_epi32(I(a), ci))
#define SRLI(a) F(_mm512_srli_epi32(I(a), 4))
#define MOVSX(a) F(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(I(a))))
#define MOVZX(a) F(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(I(a))))
#define DPBUSD(a) F(_mm512_dpbusd_epi32(I(a), ci, ci))

/* The asm barriers keep the 8 chains distinct and in registers. */
#define KEEP() __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7))
#define RUN(name, OPA, OPB, per)                                                         \
    {                                                                                    \
        __m512 a0 = c1, a1 = c1, a2 = c1, a3 = c1, a4 = c1, a5 = c1, a6 = c1, a7 = c1; \
        KEEP();                                                                          \
        double t = now();                                                                \
        for (long i = 0; i < N / 8; i++) {                                               \
            a0 = OPA(a0); a1 = OPA(a1); a2 = OPA(a2); a3 = OPA(a3);                      \
            a4 = OPB(a4); a5 = OPB(a5); a6 = OPB(a6); a7 = OPB(a7);                      \
            KEEP();                                                                      \
        }                                                                                \
        t = now() - t;                                                                   \
        printf("%-22s %.2f cycles\n", name, t / (N / (per)) / cycle);                  \
    }
#define ALONE(name, OP) RUN(name, OP, OP, 1)
#define PAIR(name, OPA, OPB) RUN(name, OPA, OPB, 2)

int main(void) {
    double cycle = cycle_seconds();
    c1 = _mm512_set1_ps(1.0001f);
    ci = _mm512_set1_epi32(3);
    printf("clock ~%.2f GHz; cycles per zmm instruction, 8 chains of it:\n", 1e-9 / cycle);
    ALONE("vfmadd231ps", FMA) ALONE("vmulps", MUL) ALONE("vaddps", ADD) ALONE("vcvtdq2ps", CVT)
    ALONE("vpermps", PERM) ALONE("vpermt2ps", PERM2) ALONE("vpternlogd", TERN) ALONE("vprorvd", RORV)
    ALONE("vpaddd", PADD) ALONE("vpsrld", SRLI) ALONE("vpmovsxbd", MOVSX) ALONE("vpmovzxbd", MOVZX)
    ALONE("vpdpbusd", DPBUSD)
    printf("cycles per pair, 4 chains of each:\n");
    PAIR("fma + mul", FMA, MUL) PAIR("fma + add", FMA, ADD) PAIR("fma + cvtdq2ps", FMA, CVT)
    PAIR("fma + vpsrld", FMA, SRLI) PAIR("fma + vprorvd", FMA, RORV) PAIR("fma + vpdpbusd", FMA, DPBUSD)
    PAIR("fma + vpternlogd", FMA, TERN) PAIR("fma + vpmovsxbd", FMA, MOVSX) PAIR("fma + vpermps", FMA, PERM)
    PAIR("cvtdq2ps + vaddps", CVT, ADD) PAIR("cvtdq2ps + vpmovsxbd", CVT, MOVSX)
    PAIR("vpmovsxbd + vpermps", MOVSX, PERM)
    return 0;
}
