/* Weight-stationary, batch-invariant small-M linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]).
 *
 * Why: decoding reads every weight once per step; a K+1-token verify should read them once too and
 * reuse each weight for all M input rows while it sits in cache. And every output element is reduced
 * in one fixed order, whatever M is, where the row sits, or which register tile computed it, so a row's
 * result is bit-identical between a 1-row decode and a 16-row verify.
 *
 * Layout. The weight is packed once (`ssd_pack`) into panels of NR = 16 output columns: panel p holds
 * w[16p + j, k] at wp[(p * K + k) * 16 + j], the last panel padded with zeros. A panel is one
 * sequential stream in memory, and a register tile walks it k by k: load the panel's 16 weights of
 * step k (two vectors), broadcast x[m, k] for each of its rows, one FMA per (row, vector). So each
 * output element lives in one vector lane and is the plain chain
 *     acc = 0; for k = 0..K-1: acc = fma(x[m, k], w[n, k], acc); y = acc (+ b[n])
 * the same in every tile shape: no horizontal sums, no k tail, no dependence on M.
 *
 * x is [M, K] with row stride ldx (elements, unit column stride); y is [M, N] with row stride ldy.
 * `next` (may be NULL) is where the weights of the product that usually follows this one start, and
 * `next_bytes` how much of them to prefetch once this call's own weights are all asked for (see the
 * prefetch stream below): a forward runs its linears back to back in a fixed order, so the first
 * group of the next one can arrive while this one computes. A prefetch never faults, so a stale
 * pointer costs bandwidth, never correctness.
 *
 * Weights come as fp32 or, compiled again by linear_bf16.c with WEIGHT_BF16, as bf16 (uint16 bits):
 * a bf16 weight widens to fp32 exactly (its bits shifted up), so the bf16 build computes the same
 * chain on the same values, bit for bit, and streams half the bytes. The exported names of that build
 * end in _bf16 (FN below).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NR 16

#ifdef WEIGHT_BF16
typedef uint16_t wt_t;
#define FN(name) name##_bf16
static inline float w_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#else
typedef float wt_t;
#define FN(name) name
#define w_f32(v) (v)
long ssd_packed_size(long N, long K) { return (N + NR - 1) / NR * K * NR; }
#endif

void FN(ssd_pack)(const wt_t *w, long N, long K, wt_t *wp) {
    for (long p = 0; p * NR < N; ++p)
        for (long k = 0; k < K; ++k)
            for (long j = 0; j < NR; ++j) {
                long n = p * NR + j;
                wp[(p * K + k) * NR + j] = n < N ? w[n * K + k] : (wt_t)0;
            }
}

/* ---- portable route: the same chain per element in plain C (no FMA contraction, see linear.py) ---- */

void FN(ssd_linear_portable)(const float *x, long ldx, const wt_t *wp, const float *b, float *y, long ldy,
                             long M, long N, long K, const void *next, long next_bytes) {
    (void)next, (void)next_bytes;
    float acc[NR];
    for (long p = 0; p * NR < N; ++p) {
        const wt_t *panel = wp + p * K * NR;
        long width = N - p * NR < NR ? N - p * NR : NR;
        for (long m = 0; m < M; ++m) {
            const float *xm = x + m * ldx;
            for (int j = 0; j < NR; ++j) acc[j] = 0.0f;
            for (long k = 0; k < K; ++k)
                for (int j = 0; j < NR; ++j) acc[j] += xm[k] * w_f32(panel[k * NR + j]);
            for (long j = 0; j < width; ++j) y[m * ldy + p * NR + j] = b ? acc[j] + b[p * NR + j] : acc[j];
        }
    }
}

/* ---- AVX2 + FMA route ---- */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

/* 8 (AVX2) or 16 (AVX-512) consecutive weights as fp32 lanes */
#ifdef WEIGHT_BF16
#define LOADW8(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define LOADW16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#else
#define LOADW8(p) _mm256_loadu_ps(p)
#define LOADW16(p) _mm512_loadu_ps(p)
#endif

#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
#ifndef LEAD
#define LEAD 1 /* how many panel groups the prefetch stream runs ahead of the arithmetic */
#endif
#ifndef PF_MIN_ROWS
#define PF_MIN_ROWS 4
#endif
#ifndef PF_MIN_ROWS_512 /* with the AVX-512 tiles, which read a whole group per pass up to 5 rows */
#define PF_MIN_ROWS_512 6
#endif
/* Every tile runs an element's whole chain over k in registers and stores the result once. Splitting k
 * into passes of 64 or 128 steps (the partial sums waiting in memory between passes), to keep a slice
 * of each panel in L1 across the row tiles, measured no faster. */
#define MC 64  /* rows per chunk; a cut-short last panel goes through an MC x PG x 16 scratch (24 KB) */
#define PG 6   /* panels per group: 1 x 6, 2 x 3, 3 x 2, 6 x 1 and 4 rows x 3 vectors tiles cover it */
#define LINE 64

#ifndef WEIGHT_BF16
/* How much of a weight [N, K] of `elt`-byte values the product before it should prefetch for it (its
 * `next_bytes`): the lead of the weight's own stream, capped at its size. */
long ssd_lead_bytes(long N, long K, long elt) {
    long lead = LEAD * PG * K * NR * elt, size = ssd_packed_size(N, K) * elt;
    return lead < size ? lead : size;
}
#endif

/* One register tile: MR input rows x NP consecutive panels (2 * MR * NP accumulators), over all K.
 * Row i's results go to s + i * lds, plus the bias `b` (may be NULL) at the same columns, added after
 * the chain as in the portable route.
 * While it computes, the tile prefetches `pf_lines` cache lines from `pf`, spread evenly over its k
 * steps: the weights that later tiles will need arrive while this one is busy with arithmetic. */
#define TILE(MR, NP)                                                                                   \
    AVX2 static void tile_##MR##x##NP(const float *x, long ldx, const wt_t *wp, long K,                \
                                      float *s, long lds, const float *b, const char *pf,              \
                                      long pf_lines) {                                                 \
        __m256 acc[MR][2 * NP];                                                                        \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i)                                          \
            _Pragma("GCC unroll 16") for (int j = 0; j < 2 * NP; ++j)                                  \
                acc[i][j] = _mm256_setzero_ps();                                                       \
        long debt = 0;                                                                                 \
        for (long k = 0; k < K; ++k) {                                                                 \
            for (debt += pf_lines; debt >= K; debt -= K, pf += LINE) _mm_prefetch(pf, PF_HINT);        \
            __m256 wv[2 * NP];                                                                         \
            _Pragma("GCC unroll 16") for (int q = 0; q < NP; ++q) {                                    \
                const wt_t *w = wp + (q * K + k) * NR;                                                 \
                wv[2 * q] = LOADW8(w);                                                                 \
                wv[2 * q + 1] = LOADW8(w + 8);                                                         \
            }                                                                                          \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {                                    \
                __m256 xv = _mm256_broadcast_ss(x + i * ldx + k);                                      \
                _Pragma("GCC unroll 16") for (int j = 0; j < 2 * NP; ++j)                              \
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);                                 \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i)                                          \
            _Pragma("GCC unroll 16") for (int j = 0; j < 2 * NP; ++j)                                  \
                _mm256_storeu_ps(s + i * lds + j * 8,                                                  \
                                 b ? _mm256_add_ps(acc[i][j], _mm256_loadu_ps(b + j * 8)) : acc[i][j]); \
    }

TILE(1, 6)
TILE(2, 3)
TILE(3, 2)
TILE(1, 1)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)

/* A 4-row tile over 3 of a group's 12 vectors (16 columns = 2 vectors per panel): 12 accumulators,
 * 3 weight vectors and a broadcast fill the 16 registers. Vector v of the group sits in panel v / 2,
 * half v % 2, so 4 calls (v0 = 0, 3, 6, 9) cover a full group in one pass over its weights. */
AVX2 static void tile_4x3v(const float *x, long ldx, const wt_t *wp, long K, float *s, long lds,
                           const float *b, long v0, const char *pf, long pf_lines) {
    const wt_t *wv0 = wp + ((v0 >> 1) * K) * NR + (v0 & 1) * 8;
    const wt_t *wv1 = wp + (((v0 + 1) >> 1) * K) * NR + ((v0 + 1) & 1) * 8;
    const wt_t *wv2 = wp + (((v0 + 2) >> 1) * K) * NR + ((v0 + 2) & 1) * 8;
    __m256 acc[4][3];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i)
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; ++j)
            acc[i][j] = _mm256_setzero_ps();
    long debt = 0;
    for (long k = 0; k < K; ++k) {
        for (debt += pf_lines; debt >= K; debt -= K, pf += LINE) _mm_prefetch(pf, PF_HINT);
        __m256 w0 = LOADW8(wv0 + k * NR), w1 = LOADW8(wv1 + k * NR), w2 = LOADW8(wv2 + k * NR);
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
            __m256 xv = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
            acc[i][2] = _mm256_fmadd_ps(xv, w2, acc[i][2]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i)
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; ++j)
            _mm256_storeu_ps(s + i * lds + (v0 + j) * 8,
                             b ? _mm256_add_ps(acc[i][j], _mm256_loadu_ps(b + (v0 + j) * 8)) : acc[i][j]);
}

typedef void (*tile_fn)(const float *, long, const wt_t *, long, float *, long, const float *, const char *, long);

/* AVX-512 tiles (where the CPU has it): one 16-float panel step is one register, and 32 registers hold
 * 2-5 rows x 6 panels, a whole group, in one pass that reads the weights once (the AVX2 tiles need two
 * or more passes from 2 rows up, the later ones from L2); 6-8 rows take two passes of 3 panels each.
 * 5 x 6 has more accumulators than registers and gcc keeps four of them on the stack: measured faster
 * than two 5 x 3 passes anyway. Each element is still the same FMA chain over k, so the result is
 * bit-identical to the AVX2 tiles and to any mix. */
#ifndef NO_AVX512
#define AVX512 __attribute__((target("avx512f")))
#define TILE512(MR, NP)                                                                                \
    AVX512 static void z_tile_##MR##x##NP(const float *x, long ldx, const wt_t *wp, long K,            \
                                          float *s, long lds, const float *b, const char *pf,          \
                                          long pf_lines) {                                             \
        __m512 acc[MR][NP];                                                                            \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)                                           \
            _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)                                       \
                acc[i][j] = _mm512_setzero_ps();                                                       \
        long debt = 0;                                                                                 \
        for (long k = 0; k < K; ++k) {                                                                 \
            for (debt += pf_lines; debt >= K; debt -= K, pf += LINE) _mm_prefetch(pf, PF_HINT);        \
            _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j) {                                     \
                __m512 w = LOADW16(wp + (j * K + k) * NR);                                             \
                _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)                                   \
                    acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + k]), w, acc[i][j]);         \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)                                           \
            _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)                                       \
                _mm512_storeu_ps(s + i * lds + j * NR,                                                 \
                                 b ? _mm512_add_ps(acc[i][j], _mm512_loadu_ps(b + j * NR)) : acc[i][j]); \
    }
TILE512(2, 6)
TILE512(3, 6)
TILE512(4, 6)
TILE512(5, 6)
TILE512(6, 3)
TILE512(7, 3)
TILE512(8, 3)
static const tile_fn WHOLE_GROUP[6] = {0, 0, z_tile_2x6, z_tile_3x6, z_tile_4x6, z_tile_5x6};
static const tile_fn HALF_GROUP[9] = {0, 0, 0, 0, 0, 0, z_tile_6x3, z_tile_7x3, z_tile_8x3};
/* Rows per AVX-512 row tile: up to 8 (8 x 3 = 24 accumulators, no spill). Against a limit of 6, 5-12 %
 * faster at M = 7, 8, 14 and 16 and equal elsewhere (bench/results/kernel_ab/tile8.txt). */
#ifndef TILE_MAX_512
#define TILE_MAX_512 8
#endif
/* -1: not decided yet; then whether the tiles above run (one state for both weight types) */
#ifdef WEIGHT_BF16
extern int ssd_use_avx512;
#else
int ssd_use_avx512 = -1;
#endif
#define use_avx512 ssd_use_avx512
static int avx512_on(void) {
    if (use_avx512 < 0) {
        __builtin_cpu_init();
        use_avx512 = __builtin_cpu_supports("avx512f") != 0;
    }
    return use_avx512;
}
#else
static int avx512_on(void) { return 0; }
#endif

static const tile_fn ONE_PANEL[7] = {0, tile_1x1, tile_2x1, tile_3x1, tile_4x1, tile_5x1, tile_6x1};

/* Rows split into tiles of at most `max`, as even as possible (max 6, the AVX2 tiles: 7 = 4 + 3,
 * 16 = 6 + 5 + 5; max 8, the AVX-512 tiles: 9 = 5 + 4, 16 = 8 + 8). */
static long tile_rows(long left, long max) {
    long tiles = (left + max - 1) / max;
    return (left + tiles - 1) / tiles;
}

/* How a row tile of t <= 6 rows covers a full group of PG panels: as sub-tiles of 1, 2, 3, 4 or 6 rows,
 * each run by the tile with at least 10 accumulators for that many rows (fewer leave the FMA units
 * waiting on the previous FMA of the same chain): 1 x 6, 2 x 3, 3 x 2, 6 x 1, and 4 rows by tile_4x3v
 * in one pass (with the prefetch stream from 4 rows: at M = 4, 1.1-1.6x the speed of the 3 + 1 split
 * it replaced on every shape but down, 0.94x there, in one interleaved run; bench/results/kernel_ab/).
 * 5 rows go as 3 + 2: the 3-row pass reads the group from memory two panels at a time, the 2-row pass
 * finds it in L2 (measured faster than two 2 x 3 passes, or 4 x 1 and 5 x 1 tiles). */
static long first_sub_rows(long t) { return t == 5 ? 3 : t; }

/* Calls per full group for a sub-tile of r rows: PG / (panels per call), or 4 runs of 3 vectors. */
static long calls_per_group(long r) { return r == 4 ? 4 : PG / (r == 1 ? 6 : r == 2 ? 3 : r == 3 ? 2 : 1); }

/* The prefetch stream: the next weights to ask for and where they end; then the range that follows
 * (the next product's first weights), taken up once this one is used up. */
typedef struct {
    const char *next, *end, *then, *then_end;
} stream_t;

/* Lines for one tile call: at most `share`, from the current range (switching to the following
 * range when the current one is done). */
static long stream_take(stream_t *st, long share) {
    if (st->next >= st->end && st->then) {
        st->next = st->then, st->end = st->then_end;
        st->then = NULL;
    }
    long lines = (st->end - st->next) / LINE;
    return lines < share ? lines : share;
}

#ifndef NO_AVX512
/* A full group for a row tile of 2-8 rows with the AVX-512 tiles: up to 5 rows in one pass over all 6
 * panels, 6-8 rows in two passes over 3 panels each (each weight read once from memory either way). */
AVX2 static void group_pass512(const float *x, long ldx, const wt_t *wp, long K, float *s, long lds,
                               const float *b, long rows, stream_t *st) {
    long calls = 0;
    for (long m = 0, t; m < rows; m += t) {
        t = tile_rows(rows - m, TILE_MAX_512);
        calls += t >= 6 ? 2 : 1;
    }
    long share = (PG * K + calls - 1) / calls;
    for (long m = 0, t; m < rows; m += t) {
        t = tile_rows(rows - m, TILE_MAX_512);
        const float *xm = x + m * ldx;
        float *sm = s + m * lds;
        for (long c = 0; c < (t >= 6 ? 2 : 1); ++c) {
            long lines = stream_take(st, share);
            if (t >= 6)
                HALF_GROUP[t](xm, ldx, wp + c * 3 * K * NR, K, sm + c * 3 * NR, lds, b ? b + c * 3 * NR : NULL,
                              st->next, lines);
            else
                WHOLE_GROUP[t](xm, ldx, wp, K, sm, lds, b, st->next, lines);
            st->next += lines * LINE;
        }
    }
}
#endif

/* Rows [0, rows) of x against `np` <= PG panels at wp, partial sums in s. The group's tile calls
 * share out the prefetch of as many lines as the group itself reads. An incomplete group (the last
 * one) goes panel by panel. */
AVX2 static void group_pass(const float *x, long ldx, const wt_t *wp, long K, float *s, long lds,
                            const float *b, long rows, long np, stream_t *st) {
    const long step = K * NR;
    const int full = np == PG;
#ifndef NO_AVX512
    /* from 2 rows on, tile_rows makes every row tile 2-8 rows */
    if (full && rows >= 2 && avx512_on()) {
        group_pass512(x, ldx, wp, K, s, lds, b, rows, st);
        return;
    }
#endif
    long calls = 0;
    for (long m = 0, t; m < rows; m += t) {
        t = tile_rows(rows - m, 6);
        for (long r = 0, sr; r < t; r += sr) {
            sr = full ? (r ? t - r : first_sub_rows(t)) : t;
            calls += full ? calls_per_group(sr) : np;
        }
    }
    long share = (np * K + calls - 1) / calls;
    for (long m = 0, t; m < rows; m += t) {
        t = tile_rows(rows - m, 6);
        for (long r = 0, sr; r < t; r += sr) {
            sr = full ? (r ? t - r : first_sub_rows(t)) : t;
            const float *xm = x + (m + r) * ldx;
            float *srow = s + (m + r) * lds;
            const int vec_tile = full && sr == 4; /* calls run 3 vectors each, not whole panels */
            long n_calls = full ? calls_per_group(sr) : np, per = vec_tile ? 0 : np / n_calls;
            for (long c = 0; c < n_calls; ++c) {
                long lines = stream_take(st, share);
                const wt_t *wq = wp + c * per * step;
                float *sm = srow + c * per * NR;
                const float *bm = b ? b + c * per * NR : NULL;
                if (vec_tile)
                    tile_4x3v(xm, ldx, wp, K, srow, lds, b, 3 * c, st->next, lines);
                else if (per == 1)
                    ONE_PANEL[sr](xm, ldx, wq, K, sm, lds, bm, st->next, lines);
                else if (sr == 1)
                    tile_1x6(xm, ldx, wq, K, sm, lds, bm, st->next, lines);
                else if (sr == 2)
                    tile_2x3(xm, ldx, wq, K, sm, lds, bm, st->next, lines);
                else
                    tile_3x2(xm, ldx, wq, K, sm, lds, bm, st->next, lines);
                st->next += lines * LINE;
            }
        }
    }
}

/* Which tile computes an element never changes its value (see the top of this file). */
AVX2 void FN(ssd_linear_avx2)(const float *x, long ldx, const wt_t *wp, const float *b, float *y, long ldy,
                              long M, long N, long K, const void *next, long next_bytes) {
#ifdef NO_NEXT /* for A/B runs (bench/kernel_ab.sh): the stream stops at this product's own weights */
    next = NULL;
#endif
    float s[MC * PG * NR];
    const long panels = (N + NR - 1) / NR;
    const char *end = (const char *)(wp + panels * K * NR);
    for (long m0 = 0; m0 < M; m0 += MC) {
        long rows = M - m0 < MC ? M - m0 : MC;
        long lead = LEAD * PG * K * NR * (long)sizeof(wt_t);
        /* Up to 3 rows the AVX2 tiles read 2-6 panels at once and memory is the bound: a prefetch
         * stream on top only competes with them (measured 1.3-1.9x slower at M = 1). From 4 rows on
         * the arithmetic is long enough for the stream to hide the read. The AVX-512 tiles read whole
         * groups up to 5 rows, and the stream helps them only from 6 (kernel_ab at M = 4-5: 0.9x). */
        stream_t st = {(const char *)wp + lead, end, next, (const char *)next + (next ? next_bytes : 0)};
        if (rows < (avx512_on() ? PF_MIN_ROWS_512 : PF_MIN_ROWS)) st.next = end, st.then = NULL;
        if (st.next > end) st.next = end;
        if (m0 + MC < M) st.then = NULL; /* only the last chunk of rows hands over to the next product */
        for (long p = 0; p < panels; p += PG) {
            long np = panels - p < PG ? panels - p : PG;
            long n0 = p * NR, width = N - n0 < np * NR ? N - n0 : np * NR;
            const float *xm = x + m0 * ldx;
            const wt_t *wg = wp + p * K * NR;
            if (width == np * NR) { /* whole panels: the tiles write y (and add the bias) themselves */
                group_pass(xm, ldx, wg, K, y + m0 * ldy + n0, ldy, b ? b + n0 : NULL, rows, np, &st);
                continue;
            }
            /* the last panel is cut short: through the scratch, then its first `width` columns */
            group_pass(xm, ldx, wg, K, s, PG * NR, NULL, rows, np, &st);
            for (long m = 0; m < rows; ++m) {
                float *ym = y + (m0 + m) * ldy + n0;
                const float *sm = s + m * PG * NR;
                for (long j = 0; j < width; ++j) ym[j] = b ? sm[j] + b[n0 + j] : sm[j];
            }
        }
    }
}

#ifndef WEIGHT_BF16
int ssd_cpu_has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Whether ssd_linear_avx2 runs the AVX-512 tiles; `on` = 0 keeps it to AVX2 (tests compare the bits),
 * 1 = where the CPU has AVX-512F. Returns the new state. */
int ssd_linear_avx512(int on) {
#ifndef NO_AVX512
    use_avx512 = -1;
    use_avx512 = on && avx512_on();
    return use_avx512;
#else
    (void)on;
    return 0;
#endif
}
#endif /* !WEIGHT_BF16 */
#else
#ifndef WEIGHT_BF16
long ssd_lead_bytes(long N, long K, long elt) { return (void)N, (void)K, (void)elt, 0; }
int ssd_cpu_has_avx2_fma(void) { return 0; }
int ssd_linear_avx512(int on) {
    (void)on;
    return 0;
}
#endif
void FN(ssd_linear_avx2)(const float *x, long ldx, const wt_t *wp, const float *b, float *y, long ldy, long M,
                         long N, long K, const void *next, long next_bytes) {
    FN(ssd_linear_portable)(x, ldx, wp, b, y, ldy, M, N, K, next, next_bytes);
}
#endif
