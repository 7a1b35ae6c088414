/* RMSNorm of SGLang's `RMSNorm.forward_native` on fp32 rows, with the residual add, in one call.
 *
 * Why: the native path is about seven small torch ops per norm (add, pow, mean, add, rsqrt, two
 * products), two norms per layer: a tenth of a decode step of the 135M target in a py-spy profile of
 * the server, for arithmetic that takes a microsecond.
 *
 * Same bits as torch: every rounded operation is the one torch performs, in its order, and the
 * library is built with -ffp-contract=off (no fused multiply-add):
 *     h = x + residual                          (when a residual is given; h is the new residual)
 *     s = sum(h * h)                            in torch's order for a contiguous inner sum, below
 *     r = 1 / sqrt(s / n + eps)                 (mean = sum / n; rsqrt = 1 / sqrt, both rounded)
 *     y = (h * r) * w
 * torch sums a contiguous row in `lanes`-wide vectors (its Vectorized<float> width on this build),
 * 4 vectors per step, with the steps accumulated in a cascade of 4 levels of 2^level_power steps
 * each (aten/src/ATen/native/cpu/SumKernel.cpp: multi_row_sum, row_sum, vectorized_inner_sum). The
 * vector width is the one thing that can differ between torch builds and CPUs: rmsnorm.py checks the
 * kernel against torch once per process and uses it only where the bits agree.
 *
 * x: [rows, n] with row stride ldx; residual likewise (ldr) or NULL; out and res_out contiguous
 * [rows, n] (res_out only with a residual). Returns 0, or -1 for a lane count it does not take.
 */
#include <math.h>
#include <string.h>

#define ILP 4     /* vectors per step of torch's row_sum */
#define LEVELS 4  /* cascade levels of torch's multi_row_sum */
#define MAX_LANES 16

static long ceil_log2(long x) {
    if (x <= 2) return 1;
    long r = 0;
    while ((1L << r) < x) ++r;
    return r;
}

/* acc[k][l] += h[(row * ILP + k) * lanes + l]^2 for one step of ILP vectors */
static void add_step(float acc[ILP][MAX_LANES], const float *h, long row, int lanes) {
    for (int k = 0; k < ILP; ++k)
        for (int l = 0; l < lanes; ++l) {
            float v = h[(row * ILP + k) * lanes + l];
            acc[k][l] += v * v;
        }
}

static float sum_of_squares(const float *h, long n, int lanes) {
    const long vecs = n / lanes, steps = vecs / ILP;
    float acc[LEVELS][ILP][MAX_LANES];
    memset(acc, 0, sizeof acc);
    long power = ceil_log2(steps) / LEVELS;
    if (power < 4) power = 4;
    const long level_step = 1L << power, level_mask = level_step - 1;
    long i = 0;
    while (i + level_step <= steps) {
        for (long j = 0; j < level_step; ++j, ++i) add_step(acc[0], h, i, lanes);
        for (int j = 1; j < LEVELS; ++j) {
            for (int k = 0; k < ILP; ++k)
                for (int l = 0; l < lanes; ++l) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (level_mask << (j * power))) != 0) break;
        }
    }
    for (; i < steps; ++i) add_step(acc[0], h, i, lanes);
    for (int j = 1; j < LEVELS; ++j)
        for (int k = 0; k < ILP; ++k)
            for (int l = 0; l < lanes; ++l) acc[0][k][l] += acc[j][k][l];
    float *v = acc[0][0];
    for (long q = steps * ILP; q < vecs; ++q) /* whole vectors past the last full step */
        for (int l = 0; l < lanes; ++l) {
            float e = h[q * lanes + l];
            v[l] += e * e;
        }
    for (int k = 1; k < ILP; ++k)
        for (int l = 0; l < lanes; ++l) v[l] += acc[0][k][l];
    float total = 0.0f;
    for (long e = vecs * lanes; e < n; ++e) total += h[e] * h[e]; /* the scalar tail first */
    for (int l = 0; l < lanes; ++l) total += v[l];
    return total;
}

int ssd_rmsnorm(const float *x, long ldx, const float *res, long ldr, const float *w, float eps, float *out,
                float *res_out, long rows, long n, int lanes) {
    if (lanes < 1 || lanes > MAX_LANES) return -1;
    for (long m = 0; m < rows; ++m) {
        const float *xm = x + m * ldx;
        float *ym = out + m * n;
        const float *h = xm;
        if (res) {
            float *hm = res_out + m * n;
            const float *rm = res + m * ldr;
            for (long j = 0; j < n; ++j) hm[j] = xm[j] + rm[j];
            h = hm;
        }
        const float mean = sum_of_squares(h, n, lanes) / (float)n;
        const float r = 1.0f / sqrtf(mean + eps);
        for (long j = 0; j < n; ++j) ym[j] = (h[j] * r) * w[j];
    }
    return 0;
}
