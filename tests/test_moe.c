/* The moe kernels (kernels/moe.h):
 *  - routing against a naive oracle (sort every expert, larger p first, equal
 *    p lower index first), ties included, with and without renormalisation;
 *  - og_moe_ref against a double-precision oracle written from the
 *    definition (transformers' Qwen3-MoE / Qwen3.5-MoE block);
 *  - og_moe_cpu against og_moe_ref at odd sizes, f32 / bf16 / q8 / q4
 *    experts, with and without the gated shared expert, outputs poisoned;
 *  - og_moe_cpu on T rows bit for bit equal to each row alone, for pools of
 *    1, 2 and 3 threads (batched == alone);
 *  - argument refusals.
 * The transformers references (tests/data/moe: the sparse blocks of
 * Qwen3.5-MoE and Qwen3-Next, torch.topk on ties) are checked in
 * test_moe_fixtures.c.
 * Letters as in moe.h. */
#include "harness.h"
#include "kernels/moe.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

/* A stack [E, N, K] of dt with uniform values in [-s, s); its values as f32
 * into exact [E, N, K]. */
static void *make_stack(og_rng *rng, og_dtype dt, int64_t E, int64_t N, int64_t K, float s, float *exact) {
    const int64_t shape[3] = {E, N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 3, shape, &bytes));
    void *w = malloc((size_t)bytes);
    float *src = malloc(sizeof(float) * (size_t)(E * N * K));
    og_rng_fill(rng, src, (size_t)(E * N * K), -s, s);
    if (og_dtype_is_quantized(dt)) {
        for (int64_t e = 0; e < E; e++) {
            void *m = (void *)og_moe_expert(w, dt, e, N, K);
            CHECK_OK(og_quantize_rows(dt, src + e * N * K, N, K, m));
            for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, m, N, K, n, exact + (e * N + n) * K);
        }
    } else {
        for (int64_t i = 0; i < E * N * K; i++) {
            og_store_f32(w, dt, (size_t)i, src[i]);
            exact[i] = og_load_f32(w, dt, (size_t)i);
        }
    }
    free(src);
    return w;
}

/* ---- naive oracles ---- */

static void oracle_route(const float *logits, int64_t E, int32_t k, bool norm, int32_t *ex, double *w) {
    double *p = malloc(sizeof(double) * (size_t)E), mx = logits[0], s = 0;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)E);
    for (int64_t e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int64_t e = 0; e < E; e++) s += (p[e] = exp((double)logits[e] - mx));
    for (int64_t e = 0; e < E; e++) p[e] /= s, idx[e] = (int32_t)e;
    /* selection sort: larger p first, equal p by index */
    for (int32_t j = 0; j < k; j++) {
        int64_t best = j;
        for (int64_t e = j + 1; e < E; e++)
            if (p[idx[e]] > p[idx[best]] || (p[idx[e]] == p[idx[best]] && idx[e] < idx[best])) best = e;
        int32_t t = idx[j];
        idx[j] = idx[best];
        idx[best] = t;
    }
    double sum = 0;
    for (int32_t j = 0; j < k; j++) sum += p[idx[j]];
    for (int32_t j = 0; j < k; j++) ex[j] = idx[j], w[j] = norm ? p[idx[j]] / sum : p[idx[j]];
    free(p);
    free(idx);
}

/* out and mag (sum of |terms| along the way, for the bound) in double. */
static void oracle_moe(const og_moe_args *a, const float *gu, const float *dn, double *out) {
    const int64_t H = a->H, F = a->F, E = a->E;
    double *h = malloc(sizeof(double) * (size_t)F);
    for (int64_t t = 0; t < a->T; t++) {
        int32_t ex[OG_MOE_MAX_TOP_K];
        double w[OG_MOE_MAX_TOP_K];
        oracle_route(a->logits + t * E, E, a->top_k, a->norm_topk_prob, ex, w);
        const float *x = a->x + t * H;
        double *o = out + t * H;
        for (int64_t i = 0; i < H; i++) o[i] = 0;
        for (int32_t j = 0; j < a->top_k; j++) {
            const float *g = gu + (int64_t)ex[j] * 2 * F * H, *d = dn + (int64_t)ex[j] * H * F;
            for (int64_t f = 0; f < F; f++) {
                double gs = 0, us = 0;
                for (int64_t i = 0; i < H; i++) gs += (double)x[i] * g[f * H + i], us += (double)x[i] * g[(F + f) * H + i];
                h[f] = gs / (1 + exp(-gs)) * us;
            }
            for (int64_t i = 0; i < H; i++) {
                double y = 0;
                for (int64_t f = 0; f < F; f++) y += h[f] * d[i * F + f];
                o[i] += w[j] * y;
            }
        }
        if (a->shared) {
            double sg = 1 / (1 + exp(-(double)a->shared_gate[t]));
            for (int64_t i = 0; i < H; i++) o[i] += sg * a->shared[t * H + i];
        }
    }
    free(h);
}

static void check_routing(og_rng *rng) {
    og_test_section("routing: naive oracle, ties to the lower index, renormalisation");
    static const int64_t Es[] = {1, 3, 8, 17, 128};
    for (size_t ei = 0; ei < sizeof Es / sizeof Es[0]; ei++) {
        const int64_t E = Es[ei], T = 9;
        for (int32_t k = 1; k <= (E < 9 ? E : 9); k += (E > 8 ? 4 : 1)) {
            for (int norm = 0; norm < 2; norm++) {
                float *lg = malloc(sizeof(float) * (size_t)(T * E));
                og_rng_fill(rng, lg, (size_t)(T * E), -3, 3);
                /* ties: rows with quantised logits, one row all equal */
                for (int64_t i = 3 * E; i < 6 * E; i++) lg[i] = (float)(int)(lg[i] * 2) / 2;
                for (int64_t i = 6 * E; i < 7 * E; i++) lg[i] = 0.5f;
                int32_t ex[9 * 9];
                float w[9 * 9];
                CHECK_OK(og_moe_route_ref(lg, T, E, k, norm, ex, w));
                for (int64_t t = 0; t < T; t++) {
                    int32_t oe[OG_MOE_MAX_TOP_K];
                    double ow[OG_MOE_MAX_TOP_K];
                    oracle_route(lg + t * E, E, k, norm, oe, ow);
                    for (int32_t j = 0; j < k; j++) {
                        CHECK_MSG(ex[t * k + j] == oe[j], "E %lld k %d row %lld place %d: expert %d, oracle %d",
                                  (long long)E, k, (long long)t, j, ex[t * k + j], oe[j]);
                        /* f32 softmax and sum: a few units of roundoff */
                        CHECK_MSG(fabs(w[t * k + j] - ow[j]) <= 1e-6 + 1e-5 * ow[j], "weight %g oracle %g",
                                  w[t * k + j], ow[j]);
                    }
                }
                free(lg);
            }
        }
    }
    /* all equal: the first k experts */
    float eq[8] = {0};
    int32_t ex[3];
    float w[3];
    CHECK_OK(og_moe_route_ref(eq, 1, 8, 3, true, ex, w));
    CHECK(ex[0] == 0 && ex[1] == 1 && ex[2] == 2);
    CHECK(w[0] == w[1] && w[1] == w[2] && fabsf(w[0] - 1.0f / 3) < 1e-7f);
}

typedef struct {
    og_threadpool *p2, *p3;
} pools;

/* One case: every check at T rows of H, E experts of F, top k. */
static void check_case(const pools *pl, og_rng *rng, og_dtype gdt, og_dtype ddt, int64_t T, int64_t H, int64_t F,
                       int64_t E, int32_t k, bool norm, bool shared) {
    float *x = malloc(sizeof(float) * (size_t)(T * H)), *lg = malloc(sizeof(float) * (size_t)(T * E));
    float *gu_x = malloc(sizeof(float) * (size_t)(E * 2 * F * H)), *dn_x = malloc(sizeof(float) * (size_t)(E * H * F));
    float *sh = malloc(sizeof(float) * (size_t)(T * H)), *sg = malloc(sizeof(float) * (size_t)T);
    og_rng_fill(rng, x, (size_t)(T * H), -1.5f, 1.5f);
    og_rng_fill(rng, lg, (size_t)(T * E), -2.0f, 2.0f);
    og_rng_fill(rng, sh, (size_t)(T * H), -1.0f, 1.0f);
    og_rng_fill(rng, sg, (size_t)T, -3.0f, 3.0f);
    /* unit-gain weights: products keep their inputs' scale */
    void *gu = make_stack(rng, gdt, E, 2 * F, H, 1.7f / sqrtf((float)H), gu_x);
    void *dn = make_stack(rng, ddt, E, H, F, 1.7f / sqrtf((float)F), dn_x);
    og_moe_args a = {.x = x, .logits = lg, .gate_up = gu, .gate_up_dtype = gdt, .down = dn, .down_dtype = ddt,
                     .shared = shared ? sh : NULL, .shared_gate = shared ? sg : NULL, .T = T, .H = H, .F = F, .E = E,
                     .top_k = k, .norm_topk_prob = norm};
    float *ref = malloc(sizeof(float) * (size_t)(T * H)), *fast = malloc(sizeof(float) * (size_t)(T * H));
    float *alone = malloc(sizeof(float) * (size_t)(T * H));
    double *orc = malloc(sizeof(double) * (size_t)(T * H));
    char what[160];
    snprintf(what, sizeof what, "%s/%s T %lld H %lld F %lld E %lld k %d norm %d shared %d", og_dtype_name(gdt),
             og_dtype_name(ddt), (long long)T, (long long)H, (long long)F, (long long)E, k, norm, shared);
    og_poison(ref, (size_t)(T * H));
    a.out = ref;
    CHECK_OK(og_moe_ref(&a));
    oracle_moe(&a, gu_x, dn_x, orc);
    /* f32 sums of at most max(H, F) products of unit-scale values, through
     * a SwiGLU and a sum of k weighted terms: the reference's roundoff is a
     * few gamma_64 ~ 4e-6 of the values' scale (~1); 1e-4 absolute + 1e-4
     * relative leaves room and still catches a wrong weight, expert or term
     * (those move outputs by 1e-2 and more) */
    CHECK_MSG(og_tol_ratio_d(ref, orc, (size_t)(T * H), 1e-4, 1e-4, NULL) <= 1, "ref vs oracle: %s", what);
    og_threadpool *ps[3] = {NULL, pl->p2, pl->p3};
    for (int pi = 0; pi < 3; pi++) {
        og_poison(fast, (size_t)(T * H));
        a.out = fast;
        CHECK_OK(og_moe_cpu(ps[pi], &a));
        CHECK_MSG(og_tol_ratio(fast, ref, (size_t)(T * H), 1e-4, 1e-4, NULL) <= 1, "cpu vs ref (pool %d): %s", pi,
                  what);
        /* each row alone: the same bits */
        for (int64_t t = 0; t < T; t++) {
            og_moe_args b = a;
            b.x = x + t * H;
            b.logits = lg + t * E;
            b.shared = shared ? sh + t * H : NULL;
            b.shared_gate = shared ? sg + t : NULL;
            b.T = 1;
            b.out = alone + t * H;
            CHECK_OK(og_moe_cpu(ps[(pi + 1) % 3], &b));
        }
        CHECK_MSG(memcmp(alone, fast, sizeof(float) * (size_t)(T * H)) == 0, "rows alone differ from the batch: %s",
                  what);
    }
    free(x), free(lg), free(gu_x), free(dn_x), free(sh), free(sg), free(gu), free(dn);
    free(ref), free(fast), free(alone), free(orc);
}

static void check_refusals(void) {
    og_test_section("refusals");
    float x[64] = {0}, lg[4] = {0}, out[64];
    float w[4 * 2 * 4 * 8] = {0}, d[4 * 8 * 4] = {0};
    og_moe_args a = {.x = x, .logits = lg, .gate_up = w, .gate_up_dtype = OG_DTYPE_F32, .down = d,
                     .down_dtype = OG_DTYPE_F32, .T = 1, .H = 8, .F = 4, .E = 4, .top_k = 2, .out = out};
    CHECK_OK(og_moe_cpu(NULL, &a));
    og_moe_args b = a;
    b.top_k = 5;
    CHECK_STATUS(og_moe_cpu(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_moe_ref(&b), OG_ERR_INVALID_ARGUMENT);
    b = a;
    b.out = x; /* out over x */
    CHECK_STATUS(og_moe_cpu(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a;
    b.shared = x + 8;
    CHECK_STATUS(og_moe_ref(&b), OG_ERR_INVALID_ARGUMENT); /* shared without its gate */
    b = a;
    b.gate_up_dtype = OG_DTYPE_Q8; /* H 8: rows not whole groups */
    CHECK_STATUS(og_moe_cpu(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a;
    b.down_dtype = OG_DTYPE_I32;
    CHECK(og_moe_cpu(NULL, &b) != OG_OK);
}

int main(void) {
    og_rng rng = og_rng_seed(27);
    check_routing(&rng);
    pools pl = {og_threadpool_create(2), og_threadpool_create(3)};
    og_test_section("og_moe_cpu against og_moe_ref and the oracle, rows alone");
    static const struct {
        int64_t T, H, F, E;
        int32_t k;
    } fl[] = {{1, 17, 7, 5, 2}, {3, 33, 13, 8, 3}, {17, 16, 24, 4, 1}, {7, 64, 32, 8, 8}, {40, 24, 9, 16, 4}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        for (int dt = 0; dt < 2; dt++) {
            og_dtype d = dt ? OG_DTYPE_BF16 : OG_DTYPE_F32;
            check_case(&pl, &rng, d, d, fl[i].T, fl[i].H, fl[i].F, fl[i].E, fl[i].k, i % 2 == 0, i % 2 == 1);
        }
    /* quantized: H and F whole groups; mixed dtypes as a GGUF file may hold */
    static const struct {
        int64_t T, H, F, E;
        int32_t k;
    } qs[] = {{1, 64, 32, 8, 2}, {5, 32, 64, 6, 3}, {19, 96, 32, 8, 2}};
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        check_case(&pl, &rng, OG_DTYPE_Q8, OG_DTYPE_Q8, qs[i].T, qs[i].H, qs[i].F, qs[i].E, qs[i].k, true, i == 1);
        check_case(&pl, &rng, OG_DTYPE_Q4, OG_DTYPE_Q4, qs[i].T, qs[i].H, qs[i].F, qs[i].E, qs[i].k, false, i != 1);
        check_case(&pl, &rng, OG_DTYPE_Q4, OG_DTYPE_Q8, qs[i].T, qs[i].H, qs[i].F, qs[i].E, qs[i].k, true, true);
        check_case(&pl, &rng, OG_DTYPE_BF16, OG_DTYPE_Q8, qs[i].T, qs[i].H, qs[i].F, qs[i].E, qs[i].k, true, false);
    }
    check_refusals();
    og_threadpool_destroy(pl.p2);
    og_threadpool_destroy(pl.p3);
    return og_test_finish();
}
