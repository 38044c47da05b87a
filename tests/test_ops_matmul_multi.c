/* Several products of the same decode rows in one parallel-for
 * (og_matmul_rows_multi_cpu) and the gate/up products with their swiglu
 * (og_matmul_rows_swiglu_cpu): every part's out bit for bit what
 * og_matmul_rows_cpu gives that part alone, the swiglu bit for bit what
 * og_swiglu_ref gives on those outs (the same expression in f32), at every
 * ISA level this CPU runs and for pools of 1 (NULL), 2 and 3 threads; and
 * each part within the f32 summation bound of og_matmul_ref. Sizes around
 * the kernels' tiles and the task split: N of each part around the groups
 * of 4 features, parts of very different N (the tasks of a call are sized
 * from all its parts, so a part's tasks differ from a call of its own), K
 * around the 16- and 32-element chunks, R of 1 (the GEMV's loop) and more
 * (the tiles).
 * Letters: R rows, K in features, N out features of a part. */
#include "harness.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

static const double U = 0x1p-24; /* f32 unit roundoff */

/* gamma_n = n u / (1 - n u): bound on the relative error of an n-term f32
 * sum of products (Higham, 3.1), whatever the summation order or FMA use. */
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }

enum { MAX_PARTS = 4 };

typedef struct {
    void *w;        /* [N, K] of dt */
    void *b;        /* [N] of og_bias_dtype(dt), or NULL */
    float *w_exact; /* [N, K] the weights' values */
    float *ref;     /* [R, N] og_matmul_ref */
    double *mag;    /* [R, N] sum |x w| + |b| */
    float *alone;   /* [R, N] og_matmul_rows_cpu of this part alone */
    float *out;     /* [R, N] of the multi call */
    int64_t N;
} part_data;

static void make_part(og_rng *rng, og_dtype dt, int64_t R, int64_t K, int64_t N, bool with_bias,
                      const float *x, part_data *p) {
    const og_dtype bdt = og_bias_dtype(dt);
    p->N = N;
    p->w_exact = malloc(sizeof(float) * (size_t)(N * K));
    if (og_dtype_is_quantized(dt)) {
        const int64_t shape[2] = {N, K};
        int64_t bytes = 0;
        CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
        p->w = malloc((size_t)bytes);
        float *src = malloc(sizeof(float) * (size_t)(N * K));
        og_rng_fill(rng, src, (size_t)(N * K), -1.0f, 1.0f);
        CHECK_OK(og_quantize_rows(dt, src, N, K, p->w));
        for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, p->w, N, K, n, p->w_exact + n * K);
        free(src);
    } else {
        p->w = malloc(og_dtype_size(dt) * (size_t)(N * K));
        for (size_t i = 0; i < (size_t)(N * K); i++) {
            og_store_f32(p->w, dt, i, og_rng_uniform(rng, -1.0f, 1.0f));
            p->w_exact[i] = og_load_f32(p->w, dt, i);
        }
    }
    p->b = with_bias ? malloc(og_dtype_size(bdt) * (size_t)N) : NULL;
    for (size_t i = 0; with_bias && i < (size_t)N; i++)
        og_store_f32(p->b, bdt, i, og_rng_uniform(rng, -1.0f, 1.0f));
    p->ref = malloc(sizeof(float) * (size_t)(R * N));
    p->mag = malloc(sizeof(double) * (size_t)(R * N));
    p->alone = malloc(sizeof(float) * (size_t)(R * N));
    p->out = malloc(sizeof(float) * (size_t)(R * N));
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double m = with_bias ? fabs((double)og_load_f32(p->b, bdt, (size_t)n)) : 0.0;
            for (int64_t k = 0; k < K; k++) m += fabs((double)x[r * K + k] * (double)p->w_exact[n * K + k]);
            p->mag[r * N + n] = m;
        }
    CHECK_OK(og_matmul_ref(x, p->w, p->b, dt, R, K, N, p->ref));
}

static void free_part(part_data *p) {
    free(p->w);
    free(p->b);
    free(p->w_exact);
    free(p->ref);
    free(p->mag);
    free(p->alone);
    free(p->out);
}

/* Worst |out - ref| over its bound: og_matmul_ref and the kernel each within
 * gamma_{K+1} mag of the exact sum (one rounding more for the bias), the
 * quantized GEMV within gamma_{K+40} (test_ops_matmul.c counts its
 * roundings), so within the sum of the two of each other. */
static double worst_ratio(const part_data *p, og_dtype dt, int64_t R, int64_t K) {
    const double g2 = gamma_n(K + 1) + gamma_n(og_dtype_is_quantized(dt) ? K + 40 : K + 1);
    double worst = 0;
    for (size_t i = 0; i < (size_t)(R * p->N); i++) {
        double d = fabs((double)p->out[i] - (double)p->ref[i]) / (g2 * p->mag[i] + 1e-30);
        if (isnan(p->out[i]) || isnan(d)) d = INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

/* n parts of Ns (with swiglu: n == 2, gate and up of Ns[0] features). */
static void check_case(og_threadpool *const *pools, int n_pools, og_rng *rng, og_dtype dt, int64_t R,
                       int64_t K, const int64_t *Ns, int n, bool swiglu) {
    float *x = malloc(sizeof(float) * (size_t)(R * K)); /* [R, K] */
    og_rng_fill(rng, x, (size_t)(R * K), -2.0f, 2.0f);
    part_data p[MAX_PARTS];
    for (int i = 0; i < n; i++) make_part(rng, dt, R, K, Ns[i], (i + R) % 2 == 0, x, &p[i]);
    const int64_t F = Ns[0];
    float *glu = swiglu ? malloc(sizeof(float) * (size_t)(R * F)) : NULL;     /* [R, F] */
    float *glu_ref = swiglu ? malloc(sizeof(float) * (size_t)(R * F)) : NULL; /* [R, F] */
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        for (int i = 0; i < n; i++)
            CHECK_OK(og_matmul_rows_cpu(NULL, x, p[i].w, p[i].b, dt, R, K, p[i].N, p[i].alone));
        for (int pr = 0; pr < n_pools; pr++) {
            og_matmul_part parts[MAX_PARTS];
            for (int i = 0; i < n; i++) {
                og_poison(p[i].out, (size_t)(R * p[i].N));
                parts[i] = (og_matmul_part){p[i].w, p[i].b, dt, p[i].N, p[i].out};
            }
            if (swiglu) {
                og_poison(glu, (size_t)(R * F));
                CHECK_OK(og_matmul_rows_swiglu_cpu(pools[pr], x, R, K, &parts[0], &parts[1], glu));
            } else {
                CHECK_OK(og_matmul_rows_multi_cpu(pools[pr], x, R, K, parts, n));
            }
            for (int i = 0; i < n; i++) {
                CHECK_MSG(memcmp(p[i].out, p[i].alone, sizeof(float) * (size_t)(R * p[i].N)) == 0,
                          "part %d of %d != alone (%s, %s, R=%lld K=%lld N=%lld, swiglu %d, pool %d)", i, n,
                          og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R, (long long)K,
                          (long long)p[i].N, swiglu, pr);
                double worst = worst_ratio(&p[i], dt, R, K);
                CHECK_MSG(worst <= 1.0, "part %d vs ref (%s, %s, R=%lld K=%lld N=%lld, pool %d): ratio %.3g", i,
                          og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R, (long long)K,
                          (long long)p[i].N, pr, worst);
            }
            if (swiglu) {
                CHECK_OK(og_swiglu_ref(p[0].out, p[1].out, R, F, glu_ref));
                CHECK_MSG(memcmp(glu, glu_ref, sizeof(float) * (size_t)(R * F)) == 0,
                          "swiglu != og_swiglu_ref of the products (%s, %s, R=%lld K=%lld F=%lld, pool %d)",
                          og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R, (long long)K,
                          (long long)F, pr);
            }
        }
    }
    og_cpu_isa_limit(og_cpu_isa_detect());
    for (int i = 0; i < n; i++) free_part(&p[i]);
    free(x);
    free(glu);
    free(glu_ref);
}

static void check_errors(og_threadpool *pool) {
    float x[8] = {0}, out[64];
    og_bf16 w[32] = {0};
    og_matmul_part parts[2] = {{w, NULL, OG_DTYPE_BF16, 4, out}, {w, NULL, OG_DTYPE_BF16, 4, out + 8}};
    CHECK_STATUS(og_matmul_rows_multi_cpu(pool, x, 1, 4, parts, 0), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_multi_cpu(pool, x, 1, 4, parts, OG_MATMUL_MAX_PARTS + 1),
                 OG_ERR_INVALID_ARGUMENT);
    /* outs overlapping each other, or x, are refused before anything is written */
    parts[1].out = out + 2;
    CHECK_STATUS(og_matmul_rows_multi_cpu(pool, x, 1, 4, parts, 2), OG_ERR_INVALID_ARGUMENT);
    parts[1].out = x + 2;
    CHECK_STATUS(og_matmul_rows_multi_cpu(pool, x, 1, 4, parts, 2), OG_ERR_INVALID_ARGUMENT);
    parts[1].out = out + 8;
    CHECK_OK(og_matmul_rows_multi_cpu(pool, x, 1, 4, parts, 2));
    /* swiglu: gate and up of different N; out over x or a product */
    parts[1].N = 3;
    CHECK_STATUS(og_matmul_rows_swiglu_cpu(pool, x, 1, 4, &parts[0], &parts[1], out + 16),
                 OG_ERR_INVALID_ARGUMENT);
    parts[1].N = 4;
    CHECK_STATUS(og_matmul_rows_swiglu_cpu(pool, x, 1, 4, &parts[0], &parts[1], out + 2),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_rows_swiglu_cpu(pool, x, 1, 4, &parts[0], &parts[1], x + 1),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_matmul_rows_swiglu_cpu(pool, x, 1, 4, &parts[0], &parts[1], out + 16));
}

int main(void) {
    og_threadpool *pools[3] = {NULL, og_threadpool_create(2), og_threadpool_create(3)};
    CHECK(pools[1] != NULL && pools[2] != NULL);
    og_rng rng = og_rng_seed(23);
    printf("isa levels: %s down to scalar\n", og_cpu_isa_name(og_cpu_isa_detect()));
    static const int64_t Rs[] = {1, 2, 5};
    static const int64_t Ks[] = {17, 32, 33, 256, 768};
    /* q/k/v-like parts of very different sizes, every leftover of 4 */
    static const int64_t Ns[][3] = {{256, 64, 64}, {129, 7, 3}, {1, 5, 258}};
    for (int dti = 0; dti < 4; dti++) {
        static const og_dtype dts[] = {OG_DTYPE_BF16, OG_DTYPE_F32, OG_DTYPE_Q8, OG_DTYPE_Q4};
        const og_dtype dt = dts[dti];
        char name[80];
        snprintf(name, sizeof name, "multi and swiglu == each product alone, %s weights", og_dtype_name(dt));
        og_test_section(name);
        for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++) {
                const int64_t K = og_dtype_is_quantized(dt) ? (Ks[b] + 31) / 32 * 32 : Ks[b];
                for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) check_case(pools, 3, &rng, dt, Rs[a], K, Ns[c], 3, false);
                static const int64_t F[][2] = {{768, 768}, {13, 13}};
                for (size_t c = 0; c < 2; c++) check_case(pools, 3, &rng, dt, Rs[a], K, F[c], 2, true);
            }
    }
    og_test_section("multi and swiglu argument errors");
    check_errors(pools[1]);
    og_threadpool_destroy(pools[1]);
    og_threadpool_destroy(pools[2]);
    return og_test_finish();
}
