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

/* iters x 12 independent 8-lane FMAs on registers: the core's FMA throughput with no memory at all. */
__attribute__((target("avx2,fma"))) float probe_fma(long iters) {
    __m256 a[12];
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps((float)i);
    for (long t = 0; t < iters; ++t)
        for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
    for (int i = 1; i < 12; ++i) a[0] = _mm256_add_ps(a[0], a[i]);
    float out[8];
    _mm256_storeu_ps(out, a[0]);
    return out[0];
}
