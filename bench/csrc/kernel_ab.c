/* A/B of compile-time variants of the small-M kernel (sglang_ssd/cpu/csrc/linear.c), in one process.
 *
 * bench/kernel_ab.sh builds linear.c three times with different -D flags (symbols renamed lin_v0..2)
 * and links them here. For every target shape and M = 1..maxM the three variants run interleaved,
 * repeat by repeat, on weight copies rotated past the L3 cache (as a decode step streams 540 MB), on 2 MB pages as the route packs them;
 * medians in microseconds and the ratio to M = 1, and whether the outputs are bit-identical (they must
 * be: every variant keeps the same reduction chain per element). With CHAIN = 1 (the default) each
 * call is told the next copy as the product that follows it, as the route does inside a forward
 * (its first group of panels is prefetched while this call computes); CHAIN = 0 times calls alone.
 * ONLY (a shape's name) times that shape alone.
 *     usage: kernel_ab REPEATS MAX_M [CHAIN] [ONLY]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

typedef void (*lin_t)(const float *, long, const float *, const float *, float *, long, long, long, long, const void *,
                      long);
void lin_v0(const float *, long, const float *, const float *, float *, long, long, long, long, const void *, long);
void lin_v1(const float *, long, const float *, const float *, float *, long, long, long, long, const void *, long);
void lin_v2(const float *, long, const float *, const float *, float *, long, long, long, long, const void *, long);
long pk_size_v0(long, long);
long lead_v0(long, long, long); /* ssd_lead_bytes: how much of a successor the route prefetches */
void pack_v0(const float *, long, long, float *); /* the packed layout is the same in every variant */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float uniform(void) { return rand() / (float)RAND_MAX - 0.5f; }

int main(int argc, char **argv) {
    /* SmolLM2-135M: qkv, o, gate_up, down, head as (K, N) */
    const long shapes[5][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}, {576, 49152}};
    const char *names[5] = {"qkv", "o", "gate_up", "down", "head"};
    const lin_t variant[3] = {lin_v0, lin_v1, lin_v2};
    int repeats = argc > 1 ? atoi(argv[1]) : 9, max_m = argc > 2 ? atoi(argv[2]) : 8;
    int chain = argc > 3 ? atoi(argv[3]) : 1;
    const char *only = argc > 4 ? argv[4] : NULL;
    if (repeats < 1 || repeats > 64 || max_m < 1 || max_m > 16) {
        fprintf(stderr, "usage: kernel_ab REPEATS(1-64) MAX_M(1-16) [CHAIN(0|1)] [SHAPE]\n");
        return 2;
    }
    for (int si = 0; si < 5; ++si) {
        if (only && strcmp(only, names[si])) continue;
        long K = shapes[si][0], N = shapes[si][1], bytes = pk_size_v0(N, K) * 4;
        long lead = lead_v0(N, K, 4); /* the successor's share, as linear.py passes it */
        int copies = (int)((96L << 20) / bytes) + 1; /* together past the 32 MB L3 */
        if (copies < 2) copies = 2;
        float *w = malloc(N * K * 4), *x = malloc(16 * K * 4), *y[3];
        for (long i = 0; i < N * K; ++i) w[i] = uniform();
        for (long i = 0; i < 16 * K; ++i) x[i] = uniform();
        /* back to back on 2 MB pages, as the route packs them (linear.py's _Arena) */
        long stride = (bytes + 4095) / 4096 * 4096;
        size_t arena = ((size_t)copies * stride + (2 << 20) - 1) / (2 << 20) * (2 << 20);
        char *base = aligned_alloc(2 << 20, arena);
        madvise(base, arena, MADV_HUGEPAGE);
        float **wp = malloc(copies * sizeof(float *));
        for (int c = 0; c < copies; ++c) {
            wp[c] = (float *)(base + c * stride);
            pack_v0(w, N, K, wp[c]);
        }
        for (int v = 0; v < 3; ++v) y[v] = malloc(16 * N * 4);
        int calls = copies < 8 ? 8 : copies; /* per timing: at least 8 products, each on the next copy */
        printf("%s K=%ld N=%ld copies=%d chain=%d\n", names[si], K, N, copies, chain);
        double first[3] = {0};
        long turn = 0;
        for (int M = 1; M <= max_m; ++M) {
            double t[3][64];
            for (int r = 0; r < repeats; ++r)
                for (int v = 0; v < 3; ++v) {
                    double t0 = now();
                    for (int i = 0; i < calls; ++i, ++turn) {
                        const float *next = chain ? wp[(turn + 1) % copies] : NULL;
                        variant[v](x, K, wp[turn % copies], NULL, y[v], N, M, N, K, next, lead);
                    }
                    t[v][r] = (now() - t0) / calls * 1e6;
                }
            int same = !memcmp(y[0], y[1], M * N * 4) && !memcmp(y[0], y[2], M * N * 4);
            printf(" M=%d", M);
            for (int v = 0; v < 3; ++v) {
                qsort(t[v], repeats, sizeof(double), by_value);
                double med = t[v][repeats / 2];
                if (M == 1) first[v] = med;
                printf("  v%d %8.1fus (%.2fx)", v, med, med / first[v]);
            }
            printf("  %s\n", same ? "same" : "DIFF");
        }
        for (int v = 0; v < 3; ++v) free(y[v]);
        free(base), free(wp), free(w), free(x);
    }
    return 0;
}
