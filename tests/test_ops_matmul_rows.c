/* matmul_rows (R independent decode rows against one pass over the
 * weights): every output row bit for bit equal to og_matmul_cpu on that row
 * alone (T = 1), at every ISA level this CPU runs, for pools of 1 (NULL), 2
 * and 3 threads on either side; and within the f32 summation bound of
 * og_matmul_ref. Odd sizes around the kernels' tiles: R around the row
 * blocks (4), K around the 16- and 32-element chunks, N around the groups
 * of 4 features (whose leftovers take another summation order).
 * Letters: R rows (sessions), K in features, N out features. */
#include "harness.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

static const double U = 0x1p-24; /* f32 unit roundoff */

/* gamma_n = n u / (1 - n u): bound on the relative error of an n-term f32
 * sum of products (Higham, 3.1), whatever the summation order or FMA use. */
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }

typedef struct {
    og_threadpool *pools[3]; /* NULL (caller only), 2 threads, 3 threads */
    int n_pools;
} pools;

/* Quantized weights (q8, q4): og_quantize_rows of uniform [-1, 1) rows
 * into w, their values (og_dequantize_row, exact) into w_exact [N, K]. */
static void *make_quant(og_rng *rng, og_dtype dt, int64_t N, int64_t K, float *w_exact) {
    const int64_t shape[2] = {N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
    void *w = malloc((size_t)bytes);
    float *src = malloc(sizeof(float) * (size_t)(N * K));
    og_rng_fill(rng, src, (size_t)(N * K), -1.0f, 1.0f);
    CHECK_OK(og_quantize_rows(dt, src, N, K, w));
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, w, N, K, n, w_exact + n * K);
    free(src);
    return w;
}

static void check_case(const pools *p, og_rng *rng, og_dtype dt, int64_t R, int64_t K, int64_t N,
                       bool with_bias) {
    const bool quant = og_dtype_is_quantized(dt);
    const og_dtype bdt = og_bias_dtype(dt);
    float *x = malloc(sizeof(float) * (size_t)(R * K));  /* [R, K] */
    float *w_exact = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] the weights' values */
    void *w;                                             /* [N, K] of dt */
    void *b = with_bias ? malloc(og_dtype_size(bdt) * (size_t)N) : NULL; /* [N] */
    float *ref = malloc(sizeof(float) * (size_t)(R * N));  /* [R, N] */
    double *mag = malloc(sizeof(double) * (size_t)(R * N)); /* [R, N] sum |x w| + |b| */
    float *single = malloc(sizeof(float) * (size_t)(R * N)); /* [R, N] */
    float *rows = malloc(sizeof(float) * (size_t)(R * N));   /* [R, N] */
    og_rng_fill(rng, x, (size_t)(R * K), -2.0f, 2.0f);
    if (quant) {
        w = make_quant(rng, dt, N, K, w_exact);
    } else {
        w = malloc(og_dtype_size(dt) * (size_t)(N * K));
        for (size_t i = 0; i < (size_t)(N * K); i++) {
            og_store_f32(w, dt, i, og_rng_uniform(rng, -1.0f, 1.0f));
            w_exact[i] = og_load_f32(w, dt, i);
        }
    }
    for (size_t i = 0; with_bias && i < (size_t)N; i++)
        og_store_f32(b, bdt, i, og_rng_uniform(rng, -1.0f, 1.0f));
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double m = with_bias ? fabs((double)og_load_f32(b, bdt, (size_t)n)) : 0.0;
            for (int64_t k = 0; k < K; k++)
                m += fabs((double)x[r * K + k] * (double)w_exact[n * K + k]);
            mag[r * N + n] = m;
        }
    og_poison(ref, (size_t)(R * N));
    CHECK_OK(og_matmul_ref(x, w, b, dt, R, K, N, ref));
    /* both within gamma_{K+1} mag of the exact sum, so within twice that of
     * each other; the quantized GEMV within gamma_{K+40} (its groups' sums
     * are scaled and then added: test_ops_matmul.c counts the roundings) */
    const double g2 = gamma_n(K + 1) + gamma_n(quant ? K + 40 : K + 1);

    /* the levels below the top run the GEMV's own loop per row, so the big
     * cases stay at the top level (keeps the sanitizer build to a minute) */
    int lowest = R * K * N > 4000000 ? (int)og_cpu_isa_detect() : OG_CPU_ISA_SCALAR;
    for (int isa = og_cpu_isa_detect(); isa >= lowest; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        /* the single rows on one thread, the batch on every pool; at the top
         * level and for a few rows also the single rows on 3 threads (each
         * pooled call of a tiny case is mostly waking the pool) */
        int n_single = isa == (int)og_cpu_isa_detect() && R <= 5 ? p->n_pools : 1;
        for (int ps = 0; ps < n_single; ps += p->n_pools - 1) {
            og_poison(single, (size_t)(R * N));
            for (int64_t r = 0; r < R; r++)
                CHECK_OK(og_matmul_cpu(p->pools[ps], x + r * K, w, b, dt, 1, K, N,
                                       single + r * N));
            for (int pr = 0; pr < p->n_pools; pr++) {
                og_poison(rows, (size_t)(R * N));
                CHECK_OK(og_matmul_rows_cpu(p->pools[pr], x, w, b, dt, R, K, N, rows));
                int bad = 0;
                for (int64_t r = 0; r < R; r++)
                    bad += memcmp(rows + r * N, single + r * N, sizeof(float) * (size_t)N) != 0;
                CHECK_MSG(bad == 0,
                          "rows != single (%s, %s, R=%lld K=%lld N=%lld bias=%d, pools %d/%d) "
                          "in %d rows",
                          og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R,
                          (long long)K, (long long)N, with_bias, pr, ps, bad);
                double worst = 0;
                for (size_t i = 0; i < (size_t)(R * N); i++) {
                    double d = fabs((double)rows[i] - (double)ref[i]) / (g2 * mag[i] + 1e-30);
                    if (isnan(rows[i]) || isnan(d)) d = INFINITY;
                    if (d > worst) worst = d;
                }
                CHECK_MSG(worst <= 1.0,
                          "rows vs ref (%s, %s, R=%lld K=%lld N=%lld bias=%d, pool %d): ratio %.3g",
                          og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R,
                          (long long)K, (long long)N, with_bias, pr, worst);
            }
        }
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(x);
    free(w);
    free(w_exact);
    free(b);
    free(ref);
    free(mag);
    free(single);
    free(rows);
}

static void check_errors(og_threadpool *pool) {
    float x[16] = {0}, out[12];
    og_bf16 w[12] = {0};
    CHECK_STATUS(og_matmul_rows_cpu(pool, NULL, w, NULL, OG_DTYPE_BF16, 1, 3, 4, out),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, NULL, NULL, OG_DTYPE_BF16, 1, 3, 4, out),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 0, 3, 4, out),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 1, 0, 4, out),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_F16, 1, 3, 4, out),
                 OG_ERR_UNSUPPORTED);
    /* out overlapping x ([2, 3] vs [2, 4]) is refused before anything is written */
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 2, 3, 4, x + 5),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "overlaps x") != NULL);
    CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, INT64_MAX, 3, 2, out),
                 OG_ERR_INVALID_ARGUMENT);
}

/* Every case, for the weights as they are here (in cache) or as the
 * kernels take weights streamed from memory (streamed: other loops and
 * prefetches, the same bits). */
static void check_all(const pools *p, og_rng *rng, bool streamed) {
    const char *how = streamed ? ", streamed" : "";
    static const int64_t Rs[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64};
    static const int64_t Ks[] = {1, 3, 17, 31, 32, 33, 129, 1024};
    static const int64_t Ns[] = {1, 3, 4, 5, 7, 129, 257};
    for (int dti = 0; dti < 2; dti++) {
        og_dtype dt = dti ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        char name[64];
        snprintf(name, sizeof name, "matmul_rows == matmul per row, %s weights%s", og_dtype_name(dt), how);
        og_test_section(name);
        for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++)
                for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++)
                    for (int bias = 0; bias < 2; bias++)
                        check_case(p, rng, dt, Rs[a], Ks[b], Ns[c], bias);
        /* panels split over several tasks per thread; K long enough to be
         * swept in chunks (1024 at AVX-512), with and without a tail */
        check_case(p, rng, dt, 9, 3072 + 17, 1031, true);
        check_case(p, rng, dt, 6, 2048, 9, false);
        check_case(p, rng, dt, 5, 2048 + 33, 7, true);
    }
    /* quantized weights: K whole groups of 32 (one, an odd number, more than
     * the 16 whose scales widen at once); R and N around the AVX-512 tiles
     * of 4 rows x 4 features, every leftover of each */
    static const int64_t Rq[] = {1, 2, 3, 4, 5, 8, 17};
    static const int64_t Kq[] = {32, 96, 1056};
    static const int64_t Nq[] = {1, 6, 17, 67, 259};
    for (int dti = 0; dti < 2; dti++) {
        og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        char name[64];
        snprintf(name, sizeof name, "matmul_rows == matmul per row, %s weights%s", og_dtype_name(dt), how);
        og_test_section(name);
        for (size_t a = 0; a < sizeof Rq / sizeof *Rq; a++)
            for (size_t b = 0; b < sizeof Kq / sizeof *Kq; b++)
                for (size_t c = 0; c < sizeof Nq / sizeof *Nq; c++)
                    check_case(p, rng, dt, Rq[a], Kq[b], Nq[c], (a + b + c) % 2 == 0);
        check_case(p, rng, dt, 9, 3072, 1031, true); /* several claims per thread */
    }
}

int main(void) {
    pools p = {{NULL, og_threadpool_create(2), og_threadpool_create(3)}, 3};
    CHECK(p.pools[1] != NULL && p.pools[2] != NULL);
    og_rng rng = og_rng_seed(11);
    printf("isa levels: %s down to scalar\n", og_cpu_isa_name(og_cpu_isa_detect()));
    check_all(&p, &rng, false);
    /* a terabyte of weights "loaded": og_cpu_weights_fit_cache says no */
    og_cpu_weights_loaded(1ll << 40);
    CHECK(!og_cpu_weights_fit_cache());
    check_all(&p, &rng, true);
    og_cpu_weights_loaded(-(1ll << 40));
    og_test_section("matmul_rows argument errors");
    check_errors(p.pools[1]);
    og_threadpool_destroy(p.pools[1]);
    og_threadpool_destroy(p.pools[2]);
    return og_test_finish();
}
