/* The AMX tile path of update_and_attend (src/kernels/attend_amx.c) against
 * the double-precision oracle (tests/support/oracle.c) on odd sizes: rows
 * not a multiple of the 32-row items, key counts not a multiple of the
 * 64-key blocks, history before the step, GQA groups 1 to 8, sliding
 * windows whose ring wraps, padded storage rows, head dims 32 to 256; then
 * "spike" keys that make a wrongly masked key move outputs by far more than
 * the tolerance; then the steps the tile path must leave to the vector
 * kernel. The test skips (77) where AMX is absent and fails when the tile
 * path did not run where it should have (og_attend_stats.amx).
 *
 * Letters: T tokens, Hq / Hkv heads, G = Hq / Hkv, D head dim, L length,
 * W window, n the keys a query sees, u = 2^-8 the unit roundoff of bf16
 * (8 significant bits, round to nearest even).
 *
 * Tolerance, per output element (token t, head h, component d):
 *   The kernel rounds each query row to bf16 (q~) and computes its scores
 *   from q~; the oracle is given q~ (rounded here by og_oracle_round_bf16,
 *   from the definition), so that rounding step is part of the definition
 *   compared, not an error. What remains:
 *   1. Scores: a tile product takes bf16 products exactly in f32 and sums
 *      D of them in f32, then one f32 multiply by scale log2(e): each score
 *      is off by at most Delta_j = (D + 2) 2^-24 scale sum_d |q~_d k_jd|,
 *      so a weight w_j = e^{s_j} / sum_i e^{s_i} moves by a factor within
 *      e^{+-2 Delta}, Delta the largest Delta_j the row sees.
 *   2. Weights: p_j = 2^{s_j - m} is rounded to bf16 before it multiplies
 *      v_j, and l sums the rounded p_j, so each normalized weight moves by
 *      a factor within (1 +- u') / (1 -+ u'), u' = u + 2^-14 (2^-14 covers
 *      the f32 work on a weight: the exp2 polynomial, 1.2e-7 truncation
 *      plus a few roundings, and one rescale factor of the same accuracy per
 *      64-key block, at most 64 of them here: ~2e-5 < 6.1e-5).
 *   Together: w~_j = w_j (1 + e_j) with |e_j| <= rho = e^{2 Delta}
 *   (1 + u') / (1 - u') - 1. Both weight sets sum to one, so
 *     o~_d - o_d = sum_j (w~_j - w_j) v_jd = sum_j (w~_j - w_j)(v_jd - o_d),
 *     |o~_d - o_d| <= rho max_j |v_jd - o_d| over the keys the row sees.
 *   On top: the vector kernel's own bound (tests/test_attend_cpu.c), atol
 *   2e-5 + rtol 1e-4, for the f32 sums over keys of the products P V (the
 *   tile unit adds in f32 as the vector kernel does) and of l.
 *   With inputs in [-1, 1) rho is about 2u = 0.0078: a key wrongly dropped
 *   or added among n moves an output by ~0.6 / n, so the plain cases see
 *   mask errors only where n is small (early rows, narrow windows); the
 *   spike cases below make every row's output hang on a few keys. */
#include "attend_seq.h"
#include "harness.h"
#include "kernels/attend.h"
#include "kernels/attend_amx.h"
#include "core/kv_quant.h"
#include "kernels/matmul_amx.h"
#include "oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 2e-5
#define RTOL 1e-4
#define U_BF16 (1.0 / 256.0)
#define U_EXTRA (1.0 / 16384.0)

typedef struct amx_case {
    int32_t T;
    int64_t L;
    int32_t D, Hq, Hkv;
    int32_t W, max_write; /* W 0: flat; a ring has W + max_write - 1 rows */
    int32_t pad;          /* elements between the layer's rows (row_stride - Hkv * D) */
    float scale;          /* 0: 1/sqrt(D) */
    int32_t spike;        /* every spike-th key a spike (0: none) */
} amx_case;

static const amx_case k_cases[] = {
    /* G = 1, no history, 37 rows: a second item of 5 rows */
    {37, 0, 64, 4, 4, 0, 0, 0, 0.0f, 0},
    /* the 0.6B shape (G = 2, D = 128) with history: 145 keys, off the blocks */
    {100, 45, 128, 16, 8, 0, 0, 0, 0.0f, 0},
    /* G = 4, padded rows, a given scale */
    {50, 300, 128, 8, 2, 0, 0, 24, 0.3f, 0},
    /* ring W = 40 that wraps inside the step: 116 rows, positions 100..176 */
    {77, 100, 64, 8, 4, 40, 77, 0, 0.0f, 0},
    /* G = 3 (rows of one token split across items), D = 96 (3 d chunks) */
    {33, 10, 96, 6, 2, 0, 0, 0, 0.0f, 0},
    /* D = 256, G = 2, one kv head */
    {40, 70, 256, 2, 1, 0, 0, 0, 0.0f, 0},
    /* D = 32, G = 8: 4 tokens per item, long history */
    {9, 1000, 32, 8, 1, 0, 0, 0, 0.0f, 0},
    /* a 512-token chunk after 700 tokens, the 0.6B heads */
    {512, 700, 128, 16, 8, 0, 0, 0, 0.0f, 0},
    /* 32 rows over 8016 keys: the longest history 32 rows take the tiles for */
    {16, 8000, 64, 4, 2, 0, 0, 0, 0.0f, 0},
    /* ring with the window wider than the step, keys from before the step's wrap */
    {64, 1000, 128, 4, 2, 300, 64, 16, 0.0f, 0},
    /* spikes: causal edges (keys 28, 57, 86 in the step itself) */
    {100, 0, 64, 4, 2, 0, 0, 0, 0.0f, 29},
    /* spikes: a window of 40 (one or two spikes seen), edges move with the row */
    {90, 300, 128, 8, 4, 40, 90, 0, 0.0f, 29},
    /* spikes: long history, a spike every 97 keys (about 21 seen), G = 4 */
    {70, 2000, 128, 4, 1, 0, 0, 0, 0.0f, 97},
    /* spikes: G = 3 and a ring of 130 keys over 64-key blocks */
    {40, 500, 96, 6, 2, 130, 40, 8, 0.0f, 31},
};

/* bf16 storage for the history of s (positions 0 .. s->n - 1) with rows RS
 * elements apart: flat rows 0.., ring the last rows positions at p mod rows.
 * Rows never written and the padding hold NaN bits. */
static og_kv_layer_view make_storage(const og_test_seq *s, int32_t W, int64_t rows, int64_t RS) {
    og_kv_layer_view kv = {.layer_id = 0, .policy = W ? OG_KV_RING : OG_KV_FLAT, .dtype = OG_DTYPE_BF16,
                           .window = W, .n_kv_heads = s->Hkv, .head_dim = s->D, .rows = rows, .length = s->n,
                           .row_stride = RS};
    const int64_t HD = (int64_t)s->Hkv * s->D;
    const size_t bytes = (size_t)(rows * RS) * sizeof(og_bf16);
    kv.k = malloc(bytes);
    kv.v = malloc(bytes);
    memset(kv.k, 0xff, bytes);
    memset(kv.v, 0xff, bytes);
    const int64_t first = W && s->n > rows ? s->n - rows : 0;
    for (int64_t p = first; p < s->n; p++) {
        const int64_t slot = W ? p % rows : p;
        for (int64_t i = 0; i < HD; i++) {
            ((og_bf16 *)kv.k)[slot * RS + i] = og_bf16_from_f32(s->ks[p * HD + i]);
            ((og_bf16 *)kv.v)[slot * RS + i] = og_bf16_from_f32(s->vs[p * HD + i]);
        }
    }
    return kv;
}

/* Makes every spike-th key (positions spike-1, 2 spike-1, ...) score about
 * 12 against every query: component 0 of each query is 1 and of a spike key
 * 12 / scale (rounded to bf16), so that each row's output is mostly the
 * mean of the spikes it sees. Spike values are +-1. */
static void add_spikes(og_test_seq *s, int32_t spike, float scale, og_rng *r) {
    const int64_t HD = (int64_t)s->Hkv * s->D;
    float big = 12.0f / (scale != 0.0f ? scale : 1.0f / sqrtf((float)s->D));
    og_oracle_round_bf16(&big, 1);
    for (int64_t p = 0; p < s->n; p++) {
        for (int64_t h = 0; h < s->Hq; h++) s->q[(p * s->Hq + h) * s->D] = 1.0f;
        if (p % spike != spike - 1) continue;
        for (int64_t h = 0; h < s->Hkv; h++) {
            s->k[p * HD + h * s->D] = s->ks[p * HD + h * s->D] = big;
            for (int64_t d = 0; d < s->D; d++)
                s->v[p * HD + h * s->D + d] = s->vs[p * HD + h * s->D + d] =
                    og_rng_next(r) & 1 ? 1.0f : -1.0f;
        }
    }
}

/* Largest |got - want| / bound over the step's outputs, the bound of the
 * comment at the top; *max_err gets the largest |got - want|, *max_tol the
 * largest bf16 term. qr: the step's queries rounded to bf16. */
static double bound_ratio(const og_test_seq *s, const float *qr, int64_t pos, int32_t T, int32_t W, float scale,
                          const float *got, const double *want, double *max_err, double *max_tol,
                          size_t *worst) {
    const int32_t D = s->D, Hq = s->Hq, G = s->Hq / s->Hkv;
    const double sc = scale != 0.0f ? scale : 1.0 / sqrt((double)D);
    double *dev = malloc((size_t)D * sizeof *dev);
    double ratio = 0;
    *max_err = *max_tol = 0;
    for (int32_t t = 0; t < T; t++) {
        const int64_t p = pos + t, first = W && p - W + 1 > 0 ? p - W + 1 : 0;
        for (int32_t h = 0; h < Hq; h++) {
            const float *q = qr + ((int64_t)t * Hq + h) * D;
            const double *o = want + ((int64_t)t * Hq + h) * D;
            double delta = 0;
            for (int32_t d = 0; d < D; d++) dev[d] = 0;
            for (int64_t j = first; j <= p; j++) {
                const float *k = s->ks + (j * s->Hkv + h / G) * D, *v = s->vs + (j * s->Hkv + h / G) * D;
                double a = 0;
                for (int32_t d = 0; d < D; d++) {
                    a += fabs((double)q[d] * k[d]);
                    const double e = fabs(v[d] - o[d]);
                    dev[d] = e > dev[d] ? e : dev[d];
                }
                delta = a > delta ? a : delta;
            }
            delta *= (D + 2) * ldexp(1.0, -24) * sc;
            const double up = U_BF16 + U_EXTRA, rho = exp(2 * delta) * (1 + up) / (1 - up) - 1;
            for (int32_t d = 0; d < D; d++) {
                const size_t i = ((size_t)t * Hq + h) * D + d;
                const double err = fabs(got[i] - want[i]), tol = ATOL + RTOL * fabs(want[i]) + rho * dev[d];
                if (!(err <= tol * ratio) || isnan(err)) {
                    ratio = isnan(err) ? INFINITY : err / tol;
                    *worst = i;
                }
                *max_err = err > *max_err ? err : *max_err;
                *max_tol = rho * dev[d] > *max_tol ? rho * dev[d] : *max_tol;
            }
        }
    }
    free(dev);
    return ratio;
}

static void run_case(const amx_case *c, og_threadpool *pool, uint64_t seed) {
    char name[200];
    snprintf(name, sizeof name, "T=%d L=%lld D=%d Hq=%d Hkv=%d %s W=%d pad=%d scale=%g spike=%d", c->T,
             (long long)c->L, c->D, c->Hq, c->Hkv, c->W ? "ring" : "flat", c->W, c->pad, (double)c->scale,
             c->spike);
    og_test_section(name);
    og_rng r = og_rng_seed(seed);
    og_test_seq s;
    if (!og_test_seq_init(&s, c->Hq, c->Hkv, c->D, OG_DTYPE_BF16, c->L + c->T)) {
        CHECK_MSG(false, "%s: out of memory", name);
        return;
    }
    og_test_seq_append(&s, &r, (int32_t)(c->L + c->T));
    if (c->spike) add_spikes(&s, c->spike, c->scale, &r);
    s.n = c->L; /* storage holds the history; the step writes the rest */
    const int64_t rows = c->W ? c->W + c->max_write - 1 : c->L + c->T + 3;
    const int64_t RS = (int64_t)c->Hkv * c->D + c->pad;
    og_kv_layer_view orig = make_storage(&s, c->W, rows, RS);
    s.n = c->L + c->T;
    const int64_t pos = c->L;
    const size_t n_out = (size_t)c->T * c->Hq * c->D;
    float *got = malloc(n_out * sizeof(float)), *got1 = malloc(n_out * sizeof(float));
    float *qr = malloc(n_out * sizeof(float));
    double *want = malloc(n_out * sizeof(double));

    /* the reference's storage after the step */
    og_kv_layer_view ref_kv = og_test_kv_clone(&orig);
    float *ref_out = malloc(n_out * sizeof(float));
    og_attend_args a = {.q = s.q + pos * c->Hq * c->D, .k = s.k + pos * c->Hkv * c->D,
                        .v = s.v + pos * c->Hkv * c->D, .out = ref_out, .T = c->T, .n_heads = c->Hq,
                        .scale = c->scale, .kv = ref_kv};
    CHECK_OK(og_update_and_attend_ref(&a));
    free(ref_out);

    /* the tile path, with the pool and on the calling thread alone */
    for (int with_pool = 1; with_pool >= 0; with_pool--) {
        og_kv_layer_view kv = og_test_kv_clone(&orig);
        a.kv = kv;
        a.out = with_pool ? got : got1;
        og_poison(a.out, n_out);
        og_attend_stats stats = {0};
        CHECK_OK(og_update_and_attend_cpu(&a, with_pool ? pool : NULL, &stats));
        CHECK_MSG(stats.amx == 1, "%s%s: the tile path did not run", name, with_pool ? "" : " [no pool]");
        CHECK_MSG(memcmp(kv.k, ref_kv.k, og_test_kv_bytes(&kv)) == 0 && memcmp(kv.v, ref_kv.v, og_test_kv_bytes(&kv)) == 0,
                  "%s: storage after the step differs from the reference's", name);
        og_test_kv_free(&kv);
    }
    /* every item is computed the same way whichever thread takes it */
    CHECK_MSG(memcmp(got, got1, n_out * sizeof(float)) == 0, "%s: outputs depend on the thread pool", name);

    memcpy(qr, a.q, n_out * sizeof(float));
    og_oracle_round_bf16(qr, n_out);
    og_oracle_attention(qr, s.ks, s.vs, pos + c->T, pos, c->T, c->Hq, c->Hkv, c->D, c->W, c->scale, want);
    double max_err, max_tol;
    size_t worst = 0;
    const double ratio = bound_ratio(&s, qr, pos, c->T, c->W, c->scale, got, want, &max_err, &max_tol, &worst);
    CHECK_MSG(ratio <= 1.0, "%s: element %zu got %.9g want %.9g (%.3g of the bound)", name, worst,
              (double)got[worst], want[worst], ratio);
    printf("  %-70s max |err| %.2e, largest bf16 bound %.2e, worst/bound %.3f\n", name, max_err, max_tol, ratio);

    free(got);
    free(got1);
    free(qr);
    free(want);
    og_test_kv_free(&ref_kv);
    og_test_kv_free(&orig);
    og_test_seq_free(&s);
}

/* Steps the tile path must leave to the vector kernel, which then holds
 * them to its own f32 tolerance against the oracle (q not rounded). */
static void not_taken(og_threadpool *pool) {
    static const struct {
        const char *why;
        int32_t T;
        int64_t L;
        int32_t D, Hq, Hkv;
        og_dtype dt;
        int isa; /* 1: through og_update_and_attend_cpu_isa */
        int off; /* 1: og_attend_amx_allow(false) */
    } cases[] = {
        {"D = 80, not a multiple of 32", 64, 20, 80, 4, 2, OG_DTYPE_BF16, 0, 0},
        {"D = 288, over the largest", 40, 20, 288, 2, 1, OG_DTYPE_BF16, 0, 0},
        {"f32 storage", 64, 20, 64, 4, 2, OG_DTYPE_F32, 0, 0},
        {"int8 storage", 64, 20, 64, 4, 2, OG_DTYPE_INT8, 0, 0},
        {"T * G = 30 rows, under 32", 15, 20, 128, 4, 2, OG_DTYPE_BF16, 0, 0},
        {"a decode", 1, 20, 128, 16, 8, OG_DTYPE_BF16, 0, 0},
        {"32 rows over 8256 keys, more than 256 a row", 16, 8240, 64, 4, 2, OG_DTYPE_BF16, 0, 0},
        {"og_update_and_attend_cpu_isa", 64, 20, 128, 4, 2, OG_DTYPE_BF16, 1, 0},
        {"og_attend_amx_allow(false)", 64, 20, 128, 4, 2, OG_DTYPE_BF16, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        og_test_section(cases[i].why);
        const int64_t L = cases[i].L;
        const int32_t T = cases[i].T, D = cases[i].D, Hq = cases[i].Hq, Hkv = cases[i].Hkv;
        og_rng r = og_rng_seed(500 + i);
        og_test_seq s;
        CHECK(og_test_seq_init(&s, Hq, Hkv, D, cases[i].dt, L + T));
        og_test_seq_append(&s, &r, (int32_t)(L + T));
        const int64_t RB = og_kv_dtype_row_bytes(cases[i].dt, Hkv, D), HD = (int64_t)Hkv * D;
        og_kv_layer_view kv = {.layer_id = 0, .policy = OG_KV_FLAT, .dtype = cases[i].dt, .n_kv_heads = Hkv,
                               .head_dim = D, .rows = L + T, .length = L};
        kv.k = calloc((size_t)((L + T) * RB), 1);
        kv.v = calloc((size_t)((L + T) * RB), 1);
        for (int64_t p = 0; p < L; p++) {
            if (og_kv_dtype_quantized(cases[i].dt)) {
                og_kv_quantize_row(cases[i].dt, s.k + p * HD, Hkv, D, (unsigned char *)kv.k + p * RB);
                og_kv_quantize_row(cases[i].dt, s.v + p * HD, Hkv, D, (unsigned char *)kv.v + p * RB);
            } else {
                for (int64_t e = 0; e < HD; e++) {
                    og_store_f32(kv.k, cases[i].dt, (size_t)(p * HD + e), s.ks[p * HD + e]);
                    og_store_f32(kv.v, cases[i].dt, (size_t)(p * HD + e), s.vs[p * HD + e]);
                }
            }
        }
        const size_t n_out = (size_t)T * Hq * D;
        float *out = malloc(n_out * sizeof(float));
        og_poison(out, n_out);
        og_attend_args a = {.q = s.q + L * Hq * D, .k = s.k + L * HD, .v = s.v + L * HD, .out = out, .T = T,
                            .n_heads = Hq, .kv = kv};
        og_attend_stats stats = {.amx = -1};
        if (cases[i].off) og_attend_amx_allow(false);
        if (cases[i].isa) CHECK_OK(og_update_and_attend_cpu_isa(&a, pool, og_cpu_isa_active(), &stats));
        else CHECK_OK(og_update_and_attend_cpu(&a, pool, &stats));
        og_attend_amx_allow(true);
        CHECK_MSG(stats.amx == 0, "%s: took the tile path", cases[i].why);
        CHECK_MSG(og_test_seq_check(&s, L, T, 0, 0.0f, out, ATOL, RTOL) <= 1.0, "%s: vector kernel vs oracle",
                  cases[i].why);
        free(out);
        free(kv.k);
        free(kv.v);
        og_test_seq_free(&s);
    }
}

int main(void) {
    const char *env = getenv("OG_CPU_AMX_ATTEND");
    if (env && !strcmp(env, "0")) {
        printf("OG_CPU_AMX_ATTEND=0: the tile attention is off, nothing to test\n");
        return OG_TEST_SKIP;
    }
    if (!og_cpu_has_amx_bf16()) {
        printf("no usable AMX-BF16 here (or OG_CPU_AMX=0): skipped\n");
        return OG_TEST_SKIP;
    }
    og_threadpool *pool = og_threadpool_create(3);
    CHECK(pool != NULL);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) run_case(&k_cases[i], pool, 2000 + i);
    not_taken(pool);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
