/* q8 / q4 decode products on integers (kernels/quant_int_cpu.h):
 *  - x's terms: the AVX-512 writer gives the plain C one's bits; every
 *    element within m / 64516 of u (254 hi + lo) (m the group's largest
 *    |x|, and f32 rounding), terms in [-127, 127], s their group's sum; groups of zeros, of
 *    values below 2^-120, and with a NaN or infinity as the header says;
 *  - the GEMV through og_matmul_cpu (one row) and og_matmul_rows_cpu (R
 *    rows, each the bits of its single call) at every ISA level this CPU
 *    runs, against og_matmul_ref (f32 x times the dequantized weights):
 *    within the bound of x's rounding, sum over groups of m / 64516 *
 *    sum |w|, plus f32 rounding; against the plain C integer GEMV within
 *    f32 reassociation; AVX-512 with vpdpbusd and without: the same bits;
 *  - a NaN in x gives NaN in every product of its row;
 *  - switched off (the default), og_matmul_cpu is back within f32 rounding
 *    of the reference, far inside x's rounding bound.
 * Weights from og_quantize_rows (rows of varied magnitude) and from random
 * bytes with finite scales (every level, q8's -128 too). Sizes around the
 * kernel's chunks (4 groups) and sets (16 groups): K 32 to 2144.
 * Letters: R rows of x, K in features, N out features, G groups a row. */
#include "core/core.h"
#include "harness.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "kernels/quant_int_cpu.h"

#include <stdlib.h>
#include <string.h>

enum { QG = OG_QUANT_GROUP };
static const double U = 0x1p-24;
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }

/* Rows of x with groups of every kind: group g of row r uniform in
 * [-2, 2) times 2^((g + r) % 9 - 4), except every 7th all zeros and every
 * 11th at 1e-37 (below 2^-120: written as zeros). */
static void fill_x(og_rng *rng, float *x, int64_t R, int64_t K) {
    og_rng_fill(rng, x, (size_t)(R * K), -2.0f, 2.0f);
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < K / QG; g++) {
            float *v = x + r * K + g * QG;
            for (int e = 0; e < QG; e++) {
                if (g % 7 == 6) v[e] = 0.0f;
                else if (g % 11 == 10) v[e] = 1e-37f * (v[e] < 0 ? -1.0f : 1.0f);
                else v[e] = ldexpf(v[e], (int)((g + r) % 9) - 4);
            }
        }
}

static int8_t term(const og_qi_x *o, int j, int e, int part) {
    return o->t[j / 4][part + (e >= 16)][16 * (j % 4) + e % 16];
}

static void check_terms(og_rng *rng, int64_t K) {
    const int64_t R = 3, n = og_qi_sets(K), G = K / QG;
    float *x = malloc(sizeof(float) * (size_t)(R * K));
    og_qi_x *a = malloc(sizeof *a * (size_t)(R * n)), *b = malloc(sizeof *b * (size_t)(R * n));
    fill_x(rng, x, R, K);
    x[2 * K + 5] = NAN; /* row 2: group 0 NaN, the last group an infinity */
    x[2 * K + K - 1] = -INFINITY;
    memset(a, 0x5a, sizeof *a * (size_t)(R * n));
    og_qi_quantize_scalar(x, R, K, a);
    if (og_cpu_isa_detect() == OG_CPU_ISA_AVX512) {
        memset(b, 0xa5, sizeof *b * (size_t)(R * n));
        og_qi_quantize_avx512(x, R, K, b);
        CHECK_MSG(memcmp(a, b, sizeof *a * (size_t)(R * n)) == 0, "AVX-512 terms != plain C terms (K=%lld)",
                  (long long)K);
    }
    int bad = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < n * 16; g++) {
            const og_qi_x *o = &a[r * n + g / 16];
            const int j = (int)(g % 16);
            if (g >= G) { /* past K: zeros */
                bad += o->u[j] != 0.0f || o->s[j] != 0;
                for (int e = 0; e < QG; e++) bad += term(o, j, e, 0) != 0 || term(o, j, e, 2) != 0;
                continue;
            }
            const float *v = x + r * K + g * QG;
            double m = 0;
            bool finite = true;
            for (int e = 0; e < QG; e++) {
                finite = finite && isfinite(v[e]);
                m = fabs(v[e]) > m ? fabs(v[e]) : m;
            }
            if (!finite) {
                bad += !isnan(o->u[j]);
                continue;
            }
            if (m < 0x1p-120) {
                bad += o->u[j] != 0.0f || o->s[j] != 0;
                continue;
            }
            int64_t s = 0;
            for (int e = 0; e < QG; e++) {
                const int h = term(o, j, e, 0), l = term(o, j, e, 2);
                bad += h < -127 || h > 127 || l < -127 || l > 127;
                const double err = fabs((double)v[e] - (double)o->u[j] * (254.0 * h + l));
                /* half a unit u, plus the roundings of u, x * 127 / m and (t - hi) * 254 */
                bad += err > m / 64516 + 4 * U * m;
                s += 254 * h + l;
            }
            bad += s != o->s[j];
        }
    CHECK_MSG(bad == 0, "x's terms off their contract in %d places (K=%lld)", bad, (long long)K);
    free(x);
    free(a);
    free(b);
}

/* [N, K] q8 / q4 weights; their values (og_dequantize_row) into w_exact.
 * random_bytes: every quant byte random, the f16 scales in [2^-10, 2^-3)
 * with either sign; else og_quantize_rows of uniform rows, row f scaled by
 * 2^(f % 5 - 2). */
static uint8_t *make_weights(og_rng *r, og_dtype dt, int64_t N, int64_t K, bool random_bytes, float *w_exact) {
    const int64_t shape[2] = {N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
    uint8_t *w = malloc((size_t)bytes);
    if (random_bytes) {
        const size_t qbytes = og_quant_row_bytes(dt, K) * (size_t)N;
        for (size_t i = 0; i < qbytes; i++) w[i] = (uint8_t)og_rng_next(r);
        og_f16 *s = (og_f16 *)(w + qbytes);
        for (int64_t i = 0; i < N * (K / QG); i++)
            s[i] = og_f16_from_f32(ldexpf(og_rng_uniform(r, 1.0f, 2.0f), -10 + (int)(og_rng_next(r) % 7)) *
                                   (og_rng_next(r) % 2 ? -1.0f : 1.0f));
    } else {
        float *src = malloc(sizeof(float) * (size_t)(N * K));
        og_rng_fill(r, src, (size_t)(N * K), -1.0f, 1.0f);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) src[n * K + k] *= ldexpf(1.0f, (int)(n % 5) - 2);
        CHECK_OK(og_quantize_rows(dt, src, N, K, w));
        free(src);
    }
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, w, N, K, n, w_exact + n * K);
    return w;
}

static void check_gemv(og_threadpool *pool, og_rng *rng, og_dtype dt, int64_t R, int64_t K, int64_t N,
                       bool random_bytes) {
    const int64_t n = og_qi_sets(K);
    float *x = malloc(sizeof(float) * (size_t)(R * K)), *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    float *ref = malloc(sizeof(float) * (size_t)(R * N)), *single = malloc(sizeof(float) * (size_t)(R * N));
    float *rows = malloc(sizeof(float) * (size_t)(R * N)), *plain = malloc(sizeof(float) * (size_t)(R * N));
    double *bound = malloc(sizeof(double) * (size_t)(R * N)), *mag = malloc(sizeof(double) * (size_t)(R * N));
    double *dot = malloc(sizeof(double) * (size_t)(R * N));
    og_qi_x *xi = malloc(sizeof *xi * (size_t)(R * n));
    uint8_t *w = make_weights(rng, dt, N, K, random_bytes, w_exact);
    fill_x(rng, x, R, K);
    if (R > 2) x[(R - 1) * K + K / 2] = NAN; /* the last row's products: NaN */
    CHECK_OK(og_matmul_ref(x, w, NULL, dt, R, K, N, ref));
    og_qi_quantize_scalar(x, R, K, xi);
    og_qi_gemv_scalar(dt, xi, R, w, og_quant_scales(dt, w, N, K), K, N, plain, N);
    for (int64_t r = 0; r < R; r++)
        for (int64_t f = 0; f < N; f++) {
            const double xr = og_terms_bound(x + r * K, w_exact + f * K, K);
            double m = 0;
            for (int64_t k = 0; k < K; k++) m += fabs((double)x[r * K + k] * w_exact[f * K + k]);
            bound[r * N + f] = xr + 2 * gamma_n(K + 40) * (m + xr);
            mag[r * N + f] = m + xr;
            dot[r * N + f] = m; /* sum |x w| */
        }
    /* the plain C integer GEMV: the reference's value within the bound */
    for (int64_t i = 0; i < R * N; i++)
        CHECK_MSG(fabs((double)plain[i] - ref[i]) <= bound[i] || (isnan(plain[i]) && isnan(ref[i])),
                  "plain integer GEMV vs ref (%s, K=%lld N=%lld): %g vs %g, bound %g", og_dtype_name(dt),
                  (long long)K, (long long)N, plain[i], ref[i], bound[i]);
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(single, (size_t)(R * N));
        for (int64_t r = 0; r < R; r++) CHECK_OK(og_matmul_cpu(pool, x + r * K, w, NULL, dt, 1, K, N, single + r * N));
        og_poison(rows, (size_t)(R * N));
        CHECK_OK(og_matmul_rows_cpu(pool, x, w, NULL, dt, R, K, N, rows));
        CHECK_MSG(memcmp(rows, single, sizeof(float) * (size_t)(R * N)) == 0,
                  "rows != single (%s, %s, R=%lld K=%lld N=%lld)", og_cpu_isa_name((og_cpu_isa)isa),
                  og_dtype_name(dt), (long long)R, (long long)K, (long long)N);
        double worst = 0, worst_plain = 0;
        for (int64_t i = 0; i < R * N; i++) {
            if (isnan(ref[i])) {
                worst = isnan(single[i]) ? worst : INFINITY;
                continue;
            }
            const double d = fabs((double)single[i] - ref[i]) / (bound[i] + 1e-30);
            const double p = fabs((double)single[i] - plain[i]) / (2 * gamma_n(K + 40) * mag[i] + 1e-30);
            worst = isnan(d) ? INFINITY : d > worst ? d : worst;
            if (og_qi_active((og_cpu_isa)isa)) worst_plain = isnan(p) ? INFINITY : p > worst_plain ? p : worst_plain;
        }
        CHECK_MSG(worst <= 1.0, "decode vs ref (%s, %s, R=%lld K=%lld N=%lld bytes=%d): ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)R, (long long)K, (long long)N,
                  random_bytes, worst);
        CHECK_MSG(worst_plain <= 1.0, "decode vs the plain integer GEMV (%s, %s, K=%lld N=%lld): ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)K, (long long)N, worst_plain);
        if (isa != OG_CPU_ISA_AVX512) continue;
        /* without vpdpbusd (and with it where the CPU has it): the same bits */
        og_qi_quantize(OG_CPU_ISA_AVX512, x, R, K, xi);
        for (int vnni = 0; vnni <= (int)og_cpu_has_avx512_vnni(); vnni++)
            for (int stream = 0; stream < 2; stream++) {
                og_poison(rows, (size_t)(R * N));
                og_qi_gemv_avx512(dt, xi, R, w, og_quant_scales(dt, w, N, K), K, N, stream, vnni, rows, N);
                CHECK_MSG(memcmp(rows, single, sizeof(float) * (size_t)(R * N)) == 0,
                          "AVX-512 GEMV (vnni=%d, stream=%d) != og_matmul_cpu (%s, R=%lld K=%lld N=%lld)", vnni,
                          stream, og_dtype_name(dt), (long long)R, (long long)K, (long long)N);
            }
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    /* switched off: f32 x, within gamma_{K+40} of the reference's sum
     * (test_ops_matmul.c counts the roundings) */
    og_qi_enable(0);
    og_poison(single, (size_t)(R * N));
    for (int64_t r = 0; r < R; r++) CHECK_OK(og_matmul_cpu(pool, x + r * K, w, NULL, dt, 1, K, N, single + r * N));
    int off_bad = 0;
    for (int64_t i = 0; i < R * N; i++)
        off_bad += isnan(ref[i]) ? !isnan(single[i])
                                 : !(fabs((double)single[i] - ref[i]) <= 2 * gamma_n(K + 40) * dot[i]);
    CHECK_MSG(off_bad == 0, "switched off: %d products not within f32 rounding (%s, K=%lld N=%lld)", off_bad,
              og_dtype_name(dt), (long long)K, (long long)N);
    og_qi_enable(1);
    free(x);
    free(w_exact);
    free(ref);
    free(single);
    free(rows);
    free(plain);
    free(bound);
    free(mag);
    free(dot);
    free(xi);
    free(w);
}

int main(void) {
    og_threadpool *pool = og_threadpool_create(3);
    CHECK(pool != NULL);
    og_rng rng = og_rng_seed(2026);
    og_qi_enable(1);
    printf("isa levels: %s down to scalar, avx512_vnni %s\n", og_cpu_isa_name(og_cpu_isa_detect()),
           og_cpu_has_avx512_vnni() ? "yes" : "no");
    static const int64_t Ks[] = {32, 96, 128, 512, 544, 768, 1056, 2144};
    og_test_section("x's terms");
    for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++) check_terms(&rng, Ks[k]);
    static const int64_t Rs[] = {1, 2, 3, 4, 5, 9};
    static const int64_t Ns[] = {1, 3, 17, 67};
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        char name[64];
        snprintf(name, sizeof name, "%s decode products on integers", og_dtype_name(dt));
        og_test_section(name);
        for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++)
            for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++)
                check_gemv(pool, &rng, dt, Rs[(k + c) % 6], Ks[k], Ns[c], (k + c) % 2 == 1);
        check_gemv(pool, &rng, dt, 9, 3072, 259, true); /* several claims a thread */
    }
    og_threadpool_destroy(pool);
    return og_test_finish();
}
