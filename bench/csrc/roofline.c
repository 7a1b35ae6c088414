/* Roofline probes for one core: streaming read bandwidth and fp32 FMA throughput (AVX2+FMA). */
#include <immintrin.h>

/* Sum a large buffer with 8 independent accumulators so that the read, not the adds, is the limit. */
__attribute__((target("avx2,fma"))) float probe_stream_read(const float *p, long n) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (long k = 0; k + 64 <= n; k += 64)
        for (int i = 0; i < 8; ++i) a[i] = _mm256_add_ps(a[i], _mm256_loadu_ps(p + k + 8 * i));
    for (int i = 1; i < 8; ++i) a[0] = _mm256_add_ps(a[0], a[i]);
    float out[8];
    _mm256_storeu_ps(out, a[0]);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

/* iters x 12 independent 8-lane FMAs on named registers: the core's FMA throughput with no memory. */
__attribute__((target("avx2,fma"))) float probe_fma(long iters) {
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f),
           a3 = _mm256_set1_ps(3.f), a4 = _mm256_set1_ps(4.f), a5 = _mm256_set1_ps(5.f),
           a6 = _mm256_set1_ps(6.f), a7 = _mm256_set1_ps(7.f), a8 = _mm256_set1_ps(8.f),
           a9 = _mm256_set1_ps(9.f), a10 = _mm256_set1_ps(10.f), a11 = _mm256_set1_ps(11.f);
    for (long t = 0; t < iters; ++t) {
        a0 = _mm256_fmadd_ps(a0, x, y); a1 = _mm256_fmadd_ps(a1, x, y); a2 = _mm256_fmadd_ps(a2, x, y);
        a3 = _mm256_fmadd_ps(a3, x, y); a4 = _mm256_fmadd_ps(a4, x, y); a5 = _mm256_fmadd_ps(a5, x, y);
        a6 = _mm256_fmadd_ps(a6, x, y); a7 = _mm256_fmadd_ps(a7, x, y); a8 = _mm256_fmadd_ps(a8, x, y);
        a9 = _mm256_fmadd_ps(a9, x, y); a10 = _mm256_fmadd_ps(a10, x, y); a11 = _mm256_fmadd_ps(a11, x, y);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

/* How much of a streaming read one core hides under arithmetic that does not wait for it: per 1 KB
 * block of `p`, the block's loads (summed, unless `read` is 0) and `fmas` rounds of 12 FMAs on chains
 * independent of the loads (none if 0), with a T1 prefetch `pf` bytes ahead (none if 0). Timed with
 * read only, FMAs only, and both, it gives the most of a read that arithmetic can hide on this core.
 * A product's FMAs wait on the weights they consume and hide less: see probe_dependent512. */
#define OVERLAP_BODY(VEC, LOAD, ADD, FMA, SET1, LANES)                                                   \
    VEC a[4], c[12], x = SET1(0.999999f), y = SET1(1e-7f);                                            \
    for (int i = 0; i < 4; ++i) a[i] = SET1(0.f);                                                     \
    for (int i = 0; i < 12; ++i) c[i] = SET1((float)i);                                               \
    for (long k = 0; k + 256 <= n; k += 256) {                                                        \
        if (pf)                                                                                       \
            for (int l = 0; l < 16; ++l) _mm_prefetch((const char *)(p + k) + 64 * l + pf, _MM_HINT_T1); \
        if (read)                                                                                     \
            for (int i = 0; i < 256 / LANES; ++i) a[i & 3] = ADD(a[i & 3], LOAD(p + k + LANES * i));  \
        for (long f = 0; f < fmas; ++f)                                                               \
            for (int i = 0; i < 12; ++i) c[i] = FMA(c[i], x, y);                                      \
    }                                                                                                 \
    for (int i = 0; i < 12; ++i) a[i & 3] = ADD(a[i & 3], c[i]);                                      \
    float out[LANES];                                                                                 \
    for (int i = 0; i < 4; ++i) a[0] = i ? ADD(a[0], a[i]) : a[0];

__attribute__((target("avx2,fma"))) float probe_overlap(const float *p, long n, long fmas, long pf, int read) {
    OVERLAP_BODY(__m256, _mm256_loadu_ps, _mm256_add_ps, _mm256_fmadd_ps, _mm256_set1_ps, 8)
    _mm256_storeu_ps(out, a[0]);
    return out[0] + out[7];
}

/* the same with 16-lane vectors (call only where the CPU has AVX-512F) */
__attribute__((target("avx512f"))) float probe_overlap512(const float *p, long n, long fmas, long pf, int read) {
    OVERLAP_BODY(__m512, _mm512_loadu_ps, _mm512_add_ps, _mm512_fmadd_ps, _mm512_set1_ps, 16)
    _mm512_storeu_ps(out, a[0]);
    return out[0] + out[15];
}

/* The same question for FMAs that consume the stream, as a small-M product's do: 9 rows x 3 vectors
 * of 16 floats per step, one sequential stream of 192 B per step (`steps` of them; with `reuse` the
 * first step's weights every time: the FMAs alone), a T1 prefetch `pf` bytes ahead of the step's own
 * lines (none if 0). With the hardware prefetcher alone, the FMAs wait on the loads they consume. */
__attribute__((target("avx512f"))) float probe_dependent512(const float *w, long steps, const float *x, long pf,
                                                            int reuse) {
    __m512 acc[9][3]; /* 9 rows: the FMAs take about as long as the read (the crossover) */
    for (int i = 0; i < 9; ++i)
        for (int j = 0; j < 3; ++j) acc[i][j] = _mm512_setzero_ps();
    for (long k = 0; k < steps; ++k) {
        const float *wk = reuse ? w : w + k * 48;
        if (pf)
            for (int l = 0; l < 3; ++l) _mm_prefetch((const char *)wk + 64 * l + pf, _MM_HINT_T1);
        __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16), w2 = _mm512_loadu_ps(wk + 32);
        for (int i = 0; i < 9; ++i) {
            __m512 xv = _mm512_set1_ps(x[(k & 255) * 9 + i]);
            acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(xv, w2, acc[i][2]);
        }
    }
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < 9; ++i)
        for (int j = 0; j < 3; ++j) s = _mm512_add_ps(s, acc[i][j]);
    float out[16];
    _mm512_storeu_ps(out, s);
    return out[0] + out[15];
}
