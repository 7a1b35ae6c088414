/* Weight-stationary, batch-invariant small-M linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]).
 *
 * Why: decoding reads every weight once per step; a K+1-token verify should read them once too and
 * reuse each weight row for all M input rows while it sits in L1. And every output element is reduced
 * in one fixed order (one 8-lane accumulator over k in ascending steps, a fixed horizontal sum, the
 * k tail, then the bias), whatever M is, where the row sits, or which register tile computed it, so a
 * row's result is bit-identical between a 1-row decode and a 16-row verify.
 *
 * Layout: x is [M, K] with row stride ldx (elements, unit column stride), w is [N, K] contiguous, y is
 * [M, N] with row stride ldy. Rows of x are taken in chunks of CHUNK_M; within a chunk a block of 4
 * weight rows stays in L1 while every group of 2 or 3 input rows passes over it (`block_rows`).
 *
 * Tried and measured against this (interleaved, bench/linear_microbench.py-style runs): two
 * accumulators per element (even/odd chunks) let a single row stream the weights faster, but its
 * multi-row tiles then hold half the weight reuse or need two passes, 10-40 % slower at M >= 2;
 * software prefetch of the next block for a single row: no gain.
 */
#include <stddef.h>
#include <stdint.h>

#define CHUNK_M 16

/* ---- portable route: the same order of operations in plain C (no FMA contraction, see Makefile) ---- */

static float dot_portable(const float *x, const float *w, long K) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long k = 0;
    for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) lane[l] += x[k + l] * w[k + l];
    float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (; k < K; ++k) s += x[k] * w[k];
    return s;
}

void ssd_linear_portable(const float *x, long ldx, const float *w, const float *b, float *y, long ldy,
                         long M, long N, long K) {
    for (long m0 = 0; m0 < M; m0 += CHUNK_M) {
        long m1 = m0 + CHUNK_M < M ? m0 + CHUNK_M : M;
        for (long n = 0; n < N; ++n)
            for (long m = m0; m < m1; ++m) {
                float s = dot_portable(x + m * ldx, w + n * K, K);
                y[m * ldy + n] = b ? s + b[n] : s;
            }
    }
}

/* ---- AVX2 + FMA route ---- */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum8(__m256 v) {
    /* lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1: the portable route's order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

/* One register tile: MR input rows x NR weight rows, MR*NR independent accumulators. */
#define TILE(MR, NR)                                                                               \
    AVX2 static void tile_##MR##x##NR(const float *x, long ldx, const float *w, long K, long k8,    \
                                      const float *b, float *y, long ldy, const float *pf) {       \
        __m256 acc[MR][NR];                                                                        \
        for (int i = 0; i < MR; ++i)                                                               \
            for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();                          \
        for (long k = 0; k < k8; k += 8) {                                                         \
            if (pf && (k & 15) == 0)                                                               \
                for (int j = 0; j < NR; ++j) _mm_prefetch((const char *)(pf + j * K + k), _MM_HINT_T1); \
            __m256 xv[MR];                                                                         \
            for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + k);                 \
            for (int j = 0; j < NR; ++j) {                                                         \
                __m256 wv = _mm256_loadu_ps(w + j * K + k);                                        \
                for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);    \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < MR; ++i)                                                               \
            for (int j = 0; j < NR; ++j) {                                                         \
                float s = hsum8(acc[i][j]);                                                        \
                for (long k = k8; k < K; ++k) s += x[i * ldx + k] * w[j * K + k];              \
                y[i * ldy + j] = b ? s + b[j] : s;                                                 \
            }                                                                                      \
    }

TILE(1, 8)
TILE(2, 4)
TILE(3, 4)
TILE(1, 1)

/* Input rows [0, rows), rows >= 2, against the 4 weight rows at w, which stay in L1 while every
 * group of input rows passes over them: 3-row tiles, ending on two 2-row tiles rather than a lone
 * row (4 = 2 + 2, 7 = 3 + 2 + 2, 16 = 3*4 + 2 + 2), whose 4 accumulators would be FMA-latency bound.
 * `pf` is the next weight block: the first tile asks for it, so its read overlaps this arithmetic. */
AVX2 static void block_rows(const float *x, long ldx, const float *w, long K, long k8, const float *b,
                            float *y, long ldy, long rows, const float *pf) {
    long threes = rows % 3 == 1 ? (rows - 4) / 3 : rows / 3, m = 0;
    for (long t = 0; t < threes; ++t, m += 3, pf = 0) tile_3x4(x + m * ldx, ldx, w, K, k8, b, y + m * ldy, ldy, pf);
    for (; m < rows; m += 2, pf = 0) tile_2x4(x + m * ldx, ldx, w, K, k8, b, y + m * ldy, ldy, pf);
}

/* Which tile computes an element never changes its value: every tile runs the same sequence per
 * element (see the top of this file). */
AVX2 void ssd_linear_avx2(const float *x, long ldx, const float *w, const float *b, float *y, long ldy,
                          long M, long N, long K) {
    long k8 = K & ~7L;
    for (long m0 = 0; m0 < M; m0 += CHUNK_M) {
        long rows = M - m0 < CHUNK_M ? M - m0 : CHUNK_M;
        const float *xc = x + m0 * ldx;
        float *yc = y + m0 * ldy;
        long n = 0;
        if (rows == 1) {
            /* One input row. Weight rows shorter than a page: one row after the other, a single
             * sequential stream (interleaving short rows restarts the hardware prefetcher on every
             * row: measured up to 1.5x a plain read of the same bytes). Longer rows: eight at a
             * time, whose parallel streams read faster than one. */
            if (K * (long)sizeof(float) >= 4096)
                for (; n + 8 <= N; n += 8) tile_1x8(xc, ldx, w + n * K, K, k8, b ? b + n : 0, yc + n, ldy, 0);
        } else {
            for (; n + 4 <= N; n += 4)
                block_rows(xc, ldx, w + n * K, K, k8, b ? b + n : 0, yc + n, ldy, rows,
                           n + 8 <= N ? w + (n + 4) * K : 0);
        }
        for (; n < N; ++n) /* what is left: element by element */
            for (long m = 0; m < rows; ++m)
                tile_1x1(xc + m * ldx, ldx, w + n * K, K, k8, b ? b + n : 0, yc + m * ldy + n, ldy, 0);
    }
}

int ssd_cpu_has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
int ssd_cpu_has_avx2_fma(void) { return 0; }
void ssd_linear_avx2(const float *x, long ldx, const float *w, const float *b, float *y, long ldy, long M,
                     long N, long K) {
    ssd_linear_portable(x, ldx, w, b, y, ldy, M, N, K);
}
#endif
