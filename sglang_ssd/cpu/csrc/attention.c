/* Batch-invariant attention over SGLang's paged KV pool, for decode and TARGET_VERIFY batches.
 *
 * Why: with the linear kernel (linear.c) every row of a forward is computed the same way whatever the
 * batch, except attention, which torch runs as one SDPA call per request whose shape (1 query in a
 * decode step, n in a verify) picks its own blocking and summation order. Here every (query, head)
 * pair is reduced in one fixed order that does not depend on how many queries share the call: each
 * score is a dot product in one fixed order (8 lane sums over d, then a fixed tree), the softmax sum
 * runs in 8 lanes by key position then the same tree, exp is one fixed polynomial, and each output
 * element is one FMA chain over the keys in position order. Keys a query may not see contribute
 * nothing at all (not a tiny weight), so a draft token's attention in a verify is bit-identical to the
 * same token's in a decode step, whose call simply has no such keys; and so are its logits.
 * It also replaces a dozen torch calls per request and layer (gathers, mask building, SDPA) by one.
 * The AVX2 route computes together the pairs that read one kv head of one request (the grouped query
 * heads, times the n tokens of a verify: 15 pairs for the 135M target at K = 4): each key and value row
 * is then read once for all of them instead of once per pair, while every pair keeps its own chains.
 * Measured in one interleaved run against the pair-at-a-time kernel: a 5-token verify 1.3-1.7x faster,
 * a decode step 1.1-1.2x (bench/attention_microbench.py --code-b).
 *
 * Batch layout: bs requests with n query tokens each (decode: n = 1), request b's queries are rows
 * b*n .. b*n+n-1 of q [bs*n, heads*head_dim] (row stride ldq). Request b has `prefix` committed
 * tokens (seq_lens[b], minus n when lens_count_queries: a decode step's seq_lens include the new
 * token) and its queries sit at positions prefix .. prefix+n-1; the pool slot of position j is
 * req_to_token[req_rows[b] * table_stride + j]. Query i sees every prefix key, and of the query
 * tokens those that mask[b][i][.] allows (mask: uint8 [bs, n, n]; NULL = causal chain, j <= i).
 * K/V pools are [slots, kv_heads, head_dim] with row stride pool_stride (elements); query head h reads
 * kv head h / (heads / kv_heads) (grouped-query attention). out is [bs*n, heads*head_dim], contiguous.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* The fixed tree that turns 8 lane sums into one: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). */
static float tree8(const float l[8]) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

/* exp(x) for x <= 0 (a score minus its row max): x = k ln2 + r, 2^k * p(r) with Cephes' degree-6
 * polynomial (about 1 ulp); below -87 it returns exp(-87) instead of underflowing. */
static float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : x;
    float k = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    return ldexpf(y, (int)k);
}

/* Whether query i of request b may see query token j (both in 0..n-1). */
static int sees(const uint8_t *mask, long b, long n, long i, long j) {
    return mask ? mask[(b * n + i) * n + j] != 0 : j <= i;
}

/* The arguments every (query, head) pair needs. */
typedef struct {
    const float *k_cache, *v_cache;
    long pool_stride, D;
    const int32_t *slots; /* this request's pool slot per position */
    long prefix, n, b;
    const uint8_t *mask;
    float scale;
} pair_ctx;

static int visible(const pair_ctx *c, long i, long j) { return j < c->prefix || sees(c->mask, c->b, c->n, i, j - c->prefix); }

/* Portable route: one (query i, head) pair reading kv head g; same orders as the AVX2 route, without FMA. */
static void pair_portable(const pair_ctx *c, const float *q, long i, long g, float *score, float *out) {
    long L = c->prefix + c->n, D = c->D;
    float m = -INFINITY, lanes[8] = {0};
    for (long j = 0; j < L; ++j) {
        const float *kj = c->k_cache + (long)c->slots[j] * c->pool_stride + g * D;
        float l[8] = {0};
        for (long d = 0; d < D; ++d) l[d % 8] += q[d] * kj[d];
        score[j] = tree8(l) * c->scale;
        if (visible(c, i, j) && score[j] > m) m = score[j];
    }
    for (long j = 0; j < L; ++j) {
        score[j] = visible(c, i, j) ? exp_poly(score[j] - m) : 0.0f;
        lanes[j % 8] += score[j];
    }
    float inv = 1.0f / tree8(lanes);
    for (long d = 0; d < D; ++d) out[d] = 0.0f;
    for (long j = 0; j < L; ++j) {
        if (!visible(c, i, j)) continue;
        const float *vj = c->v_cache + (long)c->slots[j] * c->pool_stride + g * D;
        for (long d = 0; d < D; ++d) out[d] += score[j] * vj[d];
    }
    for (long d = 0; d < D; ++d) out[d] *= inv;
}

typedef void (*pair_fn)(const pair_ctx *, const float *, long, long, float *, float *);

/* Returns 0, or -1 when its scratch memory cannot be had (the caller then falls back to torch). */
/* The most keys any request of the batch has (its prefix and its n query tokens). */
static long longest_request(const int64_t *seq_lens, int lens_count_queries, long bs, long n) {
    long longest = 0;
    for (long b = 0; b < bs; ++b) {
        long L = seq_lens[b] + (lens_count_queries ? 0 : n);
        longest = L > longest ? L : longest;
    }
    return longest;
}

/* What every pair of request b needs (both drivers below). */
#define REQUEST_CTX(b)                                                                                     \
    {k_cache, v_cache, pool_stride, D, req_to_token + req_rows[b] * table_stride,                         \
     seq_lens[b] - (lens_count_queries ? n : 0), n, b, mask, scale}

static int attention(const float *q, long ldq, float *out, const float *k_cache, const float *v_cache,
                     long pool_stride, const int32_t *req_to_token, long table_stride, const int64_t *req_rows,
                     const int64_t *seq_lens, int lens_count_queries, long bs, long n, const uint8_t *mask,
                     long heads, long kv_heads, long D, float scale, pair_fn pair) {
    long G = heads / kv_heads;
    float *score = malloc(sizeof(float) * (size_t)(longest_request(seq_lens, lens_count_queries, bs, n) + 8));
    if (!score) return -1;
    for (long b = 0; b < bs; ++b) {
        pair_ctx c = REQUEST_CTX(b);
        for (long i = 0; i < n; ++i)
            for (long h = 0; h < heads; ++h)
                pair(&c, q + (b * n + i) * ldq + h * D, i, h / G, score, out + ((b * n + i) * heads + h) * D);
    }
    free(score);
    return 0;
}

#define ATTENTION_ARGS                                                                                        \
    const float *q, long ldq, float *out, const float *k_cache, const float *v_cache, long pool_stride,      \
        const int32_t *req_to_token, long table_stride, const int64_t *req_rows, const int64_t *seq_lens,    \
        int lens_count_queries, long bs, long n, const uint8_t *mask, long heads, long kv_heads, long D,     \
        float scale
#define ATTENTION_PASS                                                                                        \
    q, ldq, out, k_cache, v_cache, pool_stride, req_to_token, table_stride, req_rows, seq_lens,              \
        lens_count_queries, bs, n, mask, heads, kv_heads, D, scale

int ssd_attention_portable(ATTENTION_ARGS) { return attention(ATTENTION_PASS, pair_portable); }

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

/* exp_poly on 8 lanes, with FMAs. */
AVX2 static inline __m256 exp_poly8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* tree8 of 8 vectors at once: lane t of the result = tree8 of vector t's lanes. */
AVX2 static inline __m256 tree8x8(__m256 a[8]) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* score[j0 + t] for the 8 keys at kp[0..7]: lane sums over d (a product, then one FMA per 8 more
 * dimensions), the fixed tree, times the scale. */
AVX2 static inline __attribute__((always_inline)) void scores8(const float *q, const float *const kp[8], long D,
                                                               __m256 scale, float *dst) {
    __m256 a[8], qv = _mm256_loadu_ps(q);
    for (int t = 0; t < 8; ++t) a[t] = _mm256_mul_ps(qv, _mm256_loadu_ps(kp[t]));
    for (long d = 8; d < D; d += 8) {
        qv = _mm256_loadu_ps(q + d);
        for (int t = 0; t < 8; ++t) a[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp[t] + d), a[t]);
    }
    _mm256_storeu_ps(dst, _mm256_mul_ps(tree8x8(a), scale));
}

/* The pool rows of keys j0 .. j0+7 (keys past the end repeat the last one; their scores are dropped). */
static inline void key_rows(const pair_ctx *c, const float *kbase, long j0, long L, const float *kp[8]) {
    for (int t = 0; t < 8; ++t) kp[t] = kbase + (long)c->slots[j0 + t < L ? j0 + t : L - 1] * c->pool_stride;
}

/* Query i's scores (score[0 .. L), 8 past it as scratch) into softmax weights: exp(score - visible max),
 * exactly 0 where it may not look; returns 1 / their sum (8 lanes by key position, then the fixed tree). */
AVX2 static float softmax_row(const pair_ctx *c, long i, float *score) {
    long L = c->prefix + c->n;
    /* The visible maximum: 8 lanes over the prefix keys (all visible), then the query tokens one by
     * one. A maximum is the same value in any order; only the sign of a zero maximum could differ,
     * and score - m is the same either way. */
    const long P = c->prefix < L ? c->prefix : L;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 8 <= P; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(score + j));
    float lm[8], m = -INFINITY;
    _mm256_storeu_ps(lm, mx);
    for (int t = 0; t < 8; ++t) m = lm[t] > m ? lm[t] : m;
    for (; j < L; ++j)
        if (visible(c, i, j) && score[j] > m) m = score[j];
    __m256 mv = _mm256_set1_ps(m), lanes = _mm256_setzero_ps();
    for (long j0 = 0; j0 < L; j0 += 8) {
        __m256 p = exp_poly8(_mm256_sub_ps(_mm256_loadu_ps(score + j0), mv));
        _mm256_storeu_ps(score + j0, p);
        if (j0 + 8 <= P) { /* every key of the block visible: add the weights as they are */
            lanes = _mm256_add_ps(lanes, p);
            continue;
        }
        for (long jj = j0; jj < j0 + 8; ++jj)  /* keys it may not see, and past the end: exactly 0 */
            if (jj >= L || !visible(c, i, jj)) score[jj] = 0.0f;
        lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(score + j0));
    }
    float l[8];
    _mm256_storeu_ps(l, lanes);
    return 1.0f / tree8(l);
}

#define AHEAD 8 /* value rows asked for ahead of the one in use */

/* The weighted value sum of `rt` (query, head) pairs over one kv head, for W output vectors from
 * vbase: out_r = inv_r * (one FMA chain per element over the keys query qi[r] may see, in key order).
 * The pairs share each value row's load: the prefix keys, which all of them see, in one loop; the
 * query tokens' keys each pair by its own mask. rt and W are constants where this is inlined.
 * `row` > 0 (the first pass over the values) also prefetches that many floats of the row AHEAD keys on:
 * with scattered slots the hardware prefetcher cannot guess the next row, and the later passes, one
 * 16-float column each, then find every row in cache. */
AVX2 static inline __attribute__((always_inline)) void value_tile(const pair_ctx *c, const float *vbase,
                                                                  const long *qi, float *const *sc,
                                                                  const float *inv, float *const *out, int rt,
                                                                  int W, long row) {
    __m256 acc[6][2];
    for (int r = 0; r < rt; ++r)
        for (int w = 0; w < W; ++w) acc[r][w] = _mm256_setzero_ps();
    const long L = c->prefix + c->n, P = c->prefix < L ? c->prefix : L;
    for (long j = 0; j < P; ++j) {
        const float *vj = vbase + (long)c->slots[j] * c->pool_stride;
        if (row && j + AHEAD < P) {
            const float *ahead = vbase + (long)c->slots[j + AHEAD] * c->pool_stride;
            for (long d = 0; d < row; d += 16) _mm_prefetch((const char *)(ahead + d), _MM_HINT_T0);
        }
        __m256 v0 = _mm256_loadu_ps(vj), v1 = W == 2 ? _mm256_loadu_ps(vj + 8) : v0;
        for (int r = 0; r < rt; ++r) {
            __m256 p = _mm256_set1_ps(sc[r][j]);
            acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
            if (W == 2) acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
        }
    }
    for (long j = P; j < L; ++j) {
        const float *vj = vbase + (long)c->slots[j] * c->pool_stride;
        for (int r = 0; r < rt; ++r) {
            if (!visible(c, qi[r], j)) continue;
            __m256 p = _mm256_set1_ps(sc[r][j]);
            for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * w), acc[r][w]);
        }
    }
    for (int r = 0; r < rt; ++r)
        for (int w = 0; w < W; ++w) _mm256_storeu_ps(out[r] + 8 * w, _mm256_mul_ps(acc[r][w], _mm256_set1_ps(inv[r])));
}

#define PAIRS_MAX 24 /* pairs per group pass: their score rows are the scratch (PAIRS_MAX x (L + 8) floats) */
#define TILE_PAIRS 6 /* pairs per value tile: 6 x 2 accumulators, 2 value vectors and a weight fill 15 registers */

/* `rp` pairs that read kv head g of one request: query token qi[r], its row q[r], its output out[r].
 * Each pair gets exactly the operations it gets alone (rp = 1, pair_avx2): the same functions, in the
 * same order per element; the pairs only share the reads of the keys and values: each key row is read from memory
 * once for all of them, not once per pair (grouped-query heads and the tokens of a verify read the
 * same kv head). */
AVX2 static void group_avx2(const pair_ctx *c, long g, long rp, const long *qi, const float *const *q,
                            float *const *out, float *score, long ls) {
    long L = c->prefix + c->n, D = c->D;
    const float *kbase = c->k_cache + g * D, *vbase = c->v_cache + g * D;
    __m256 scale = _mm256_set1_ps(c->scale);
    float *sc[PAIRS_MAX], inv[PAIRS_MAX];
    for (long r = 0; r < rp; ++r) sc[r] = score + r * ls;
    for (long j0 = 0; j0 < L; j0 += 8) {
        const float *kp[8];
        key_rows(c, kbase, j0, L, kp);
        for (long r = 0; r < rp; ++r) scores8(q[r], kp, D, scale, sc[r] + j0);
    }
    for (long r = 0; r < rp; ++r) inv[r] = softmax_row(c, qi[r], sc[r]);
    for (long r0 = 0, rt; r0 < rp; r0 += rt) {
        long tiles = (rp - r0 + TILE_PAIRS - 1) / TILE_PAIRS;
        rt = (rp - r0 + tiles - 1) / tiles; /* as even as possible: 15 pairs = 5 + 5 + 5 */
        for (long d0 = 0; d0 < D; d0 += 16) {
            float *o[TILE_PAIRS];
            for (long r = 0; r < rt; ++r) o[r] = out[r0 + r] + d0;
            int W = D - d0 >= 16 ? 2 : 1;
            long row = r0 == 0 && d0 == 0 ? D : 0;
            switch (rt * 4 + W) {
#define VT(RT, WW) \
    case RT * 4 + WW: value_tile(c, vbase + d0, qi + r0, sc + r0, inv + r0, o, RT, WW, row); break;
                VT(1, 1) VT(1, 2) VT(2, 1) VT(2, 2) VT(3, 1) VT(3, 2) VT(4, 1) VT(4, 2) VT(5, 1) VT(5, 2) VT(6, 1) VT(6, 2)
#undef VT
            }
        }
    }
}

/* One (query, head) pair at a time, each reading its kv head's keys and values itself: the reference
 * the grouped route must equal bit for bit (tests), and the other side of its A/B (bench). */
AVX2 static void pair_avx2(const pair_ctx *c, const float *q, long i, long g, float *score, float *out) {
    group_avx2(c, g, 1, &i, &q, &out, score, 0);
}

/* The grouped route: per request and kv head, its pairs (heads / kv_heads query heads x n tokens) in
 * passes of up to PAIRS_MAX. Returns 0, or -1 without scratch memory. */
AVX2 static int attention_grouped(ATTENTION_ARGS) {
    long G = heads / kv_heads, longest = longest_request(seq_lens, lens_count_queries, bs, n);
    long ls = (longest + 7) / 8 * 8 + 8, per = n * G < PAIRS_MAX ? n * G : PAIRS_MAX;
    float *score = malloc(sizeof(float) * (size_t)(ls * per));
    if (!score) return -1;
    for (long b = 0; b < bs; ++b) {
        pair_ctx c = REQUEST_CTX(b);
        for (long g = 0; g < kv_heads; ++g)
            for (long r0 = 0; r0 < n * G; r0 += per) {
                long rp = n * G - r0 < per ? n * G - r0 : per, qi[PAIRS_MAX];
                const float *qr[PAIRS_MAX];
                float *outr[PAIRS_MAX];
                for (long r = 0; r < rp; ++r) {
                    long i = (r0 + r) / G, h = g * G + (r0 + r) % G;
                    qi[r] = i, qr[r] = q + (b * n + i) * ldq + h * D, outr[r] = out + ((b * n + i) * heads + h) * D;
                }
                group_avx2(&c, g, rp, qi, qr, outr, score, ls);
            }
    }
    free(score);
    return 0;
}

int ssd_attention_avx2(ATTENTION_ARGS) {
    return D % 8 ? attention(ATTENTION_PASS, pair_portable) : attention_grouped(ATTENTION_PASS);
}
int ssd_attention_avx2_pairwise(ATTENTION_ARGS) { return attention(ATTENTION_PASS, D % 8 ? pair_portable : pair_avx2); }
#else
int ssd_attention_avx2(ATTENTION_ARGS) { return attention(ATTENTION_PASS, pair_portable); }
int ssd_attention_avx2_pairwise(ATTENTION_ARGS) { return attention(ATTENTION_PASS, pair_portable); }
#endif
