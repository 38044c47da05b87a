/* The AMX bf16 prefill kernel (src/kernels/matmul_amx.c) against a
 * double-precision oracle over x rounded to bf16 (rounded here, by
 * og_bf16_from_f32, not by the kernel's vector conversion), with the
 * rigorous f32 summation bound gamma_{K+1} * sum |x w| (Higham 3.1: any
 * order, products of two bf16 values are exact in f32). Sizes straddle the
 * kernel's blocks: T around 16 and 32 (token tiles), N around 16, 32 and 64
 * (feature tiles, the zero-padded tail of a 32-feature panel), K from one
 * tile row (32) to many; then N past the 256 features (8 panels) a worker
 * claims at once, with a short last claim and panel, at the 0.6B K's. og_matmul_bf16_cpu with AMX allowed and refused must both meet the
 * bound (the second runs the vdpbf16ps kernel it replaces). Where the CPU
 * has no AMX the kernel must refuse, and og_matmul_bf16_cpu still works.
 *
 * Quantized weights (og_matmul_quant_amx: q8, q4 and every k-quant, each
 * weight carried as bf16 hi + lo) against the same oracle over the weights
 * og_dequantize_row gives. Its bound: 2K exact products summed in f32,
 * gamma_{2K+1} * sum(|x hi| + |x lo|), with |hi| + |lo| <= (1 + 2^-6) |w|,
 * plus the split's own error, |w - hi - lo| <= 2^-16 |w|: (gamma_{2K+1} *
 * (1 + 2^-6) + 2^-16) * sum |x w|. Dropping lo (bf16 weights, 2^-8) breaks
 * it at the small K's, where gamma is small.
 * Letters: T tokens, K in features, N out features. */
#include "harness.h"
#include "kernels/matmul_amx.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

static const double U = 0x1p-24; /* f32 unit roundoff */

static double worst_ratio(const float *got, const float *xr, const og_bf16 *w, const og_bf16 *b, int64_t T, int64_t K,
                          int64_t N) {
    const double g = (double)(K + 1) * U / (1.0 - (double)(K + 1) * U);
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)xr[t * K + k] * (double)og_f32_from_bf16(w[n * K + k]);
                s += p;
                m += fabs(p);
            }
            if (b) {
                s += og_f32_from_bf16(b[n]);
                m += fabs((double)og_f32_from_bf16(b[n]));
            }
            const float y = got[t * N + n];
            const double r = isnan(y) ? INFINITY : fabs((double)y - s) / (g * m + 1e-30);
            if (r > worst) worst = r;
        }
    return worst;
}

static void check_case(og_threadpool *pool, og_rng *r, int64_t T, int64_t K, int64_t N, bool with_bias) {
    float *x = malloc(sizeof(float) * (size_t)(T * K));  /* [T, K] */
    float *xr = malloc(sizeof(float) * (size_t)(T * K)); /* [T, K] x rounded to bf16 */
    og_bf16 *w = malloc(sizeof(og_bf16) * (size_t)(N * K));
    og_bf16 *b = with_bias ? malloc(sizeof(og_bf16) * (size_t)N) : NULL;
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
    for (int64_t i = 0; i < N * K; i++) w[i] = og_bf16_from_f32(og_rng_uniform(r, -1.0f, 1.0f));
    for (int64_t i = 0; with_bias && i < N; i++) b[i] = og_bf16_from_f32(og_rng_uniform(r, -1.0f, 1.0f));
    if (og_cpu_has_amx_bf16()) {
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_bf16_amx(pool, x, w, b, T, K, N, got));
        const double q = worst_ratio(got, xr, w, b, T, K, N);
        CHECK_MSG(q <= 1.0, "amx T=%lld K=%lld N=%lld bias=%d: ratio %.3g", (long long)T, (long long)K, (long long)N,
                  with_bias, q);
    } else {
        CHECK_STATUS(og_matmul_bf16_amx(pool, x, w, b, T, K, N, got), OG_ERR_UNSUPPORTED);
    }
    for (int allow = 1; allow >= 0; allow--) { /* the dispatcher, with and without AMX */
        og_cpu_amx_allow(allow);
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_bf16_cpu(pool, x, w, b, OG_DTYPE_BF16, T, K, N, got));
        const double q = worst_ratio(got, xr, w, b, T, K, N);
        CHECK_MSG(q <= 1.0, "matmul_bf16_cpu (amx %s) T=%lld K=%lld N=%lld bias=%d: ratio %.3g",
                  allow ? "allowed" : "refused", (long long)T, (long long)K, (long long)N, with_bias, q);
    }
    og_cpu_amx_allow(true);
    free(x);
    free(xr);
    free(w);
    free(b);
    free(got);
}

/* The quantized bound above, as a ratio (<= 1 passes); bias f32 or NULL. */
static double worst_ratio_q(const float *got, const float *xr, const float *wf, const float *b, int64_t T, int64_t K,
                            int64_t N) {
    const double g = (double)(2 * K + 1) * U / (1.0 - (double)(2 * K + 1) * U);
    const double rel = g * (1.0 + 0x1p-6) + 0x1p-16;
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = b ? b[n] : 0.0, m = b ? fabs((double)b[n]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)xr[t * K + k] * (double)wf[n * K + k];
                s += p;
                m += fabs(p);
            }
            const float y = got[t * N + n];
            const double r = isnan(y) ? INFINITY : fabs((double)y - s) / (rel * m + 1e-30);
            if (r > worst) worst = r;
        }
    return worst;
}

static void check_quant_case(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T, int64_t K, int64_t N,
                             bool with_bias) {
    float *x = malloc(sizeof(float) * (size_t)(T * K));  /* [T, K] */
    float *xr = malloc(sizeof(float) * (size_t)(T * K)); /* [T, K] x rounded to bf16 */
    float *src = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] before quantization */
    float *wf = malloc(sizeof(float) * (size_t)(N * K));  /* [N, K] as dequantized */
    void *w = malloc(og_weight_row_bytes(dt, K) * (size_t)N);
    float *b = with_bias ? malloc(sizeof(float) * (size_t)N) : NULL;
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
    og_rng_fill(r, src, (size_t)(N * K), -1.0f, 1.0f);
    if (og_dtype_is_kquant(dt)) CHECK_OK(og_kquant_quantize_rows(dt, src, N, K, w));
    else CHECK_OK(og_quantize_rows(dt, src, N, K, w));
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, w, N, K, n, wf + n * K);
    if (b) og_rng_fill(r, b, (size_t)N, -1.0f, 1.0f);
    if (og_cpu_has_amx_bf16()) {
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_quant_amx(pool, x, w, dt, b, T, K, N, got));
        const double q = worst_ratio_q(got, xr, wf, b, T, K, N);
        CHECK_MSG(q <= 1.0, "quant amx %s T=%lld K=%lld N=%lld bias=%d: ratio %.3g", og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N, with_bias, q);
    } else {
        CHECK_STATUS(og_matmul_quant_amx(pool, x, w, dt, b, T, K, N, got), OG_ERR_UNSUPPORTED);
    }
    /* the dispatcher: AMX, the vdpbf16ps pairs (AMX refused), f32 products (ISA capped at AVX2) */
    static const char *const modes[] = {"amx allowed", "amx refused", "isa avx2"};
    for (int mode = 0; mode < 3; mode++) {
        og_cpu_amx_allow(mode == 0);
        if (mode == 2) og_cpu_isa_limit(OG_CPU_ISA_AVX2);
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_bf16_cpu(pool, x, w, b, dt, T, K, N, got));
        const double q = worst_ratio_q(got, xr, wf, b, T, K, N);
        CHECK_MSG(q <= 1.0, "matmul_bf16_cpu %s (%s) T=%lld K=%lld N=%lld bias=%d: ratio %.3g", og_dtype_name(dt),
                  modes[mode], (long long)T, (long long)K, (long long)N, with_bias, q);
        og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    }
    og_cpu_amx_allow(true);
    free(x);
    free(xr);
    free(src);
    free(wf);
    free(w);
    free(b);
    free(got);
}

int main(void) {
    og_rng r = og_rng_seed(20261203);
    og_threadpool *pool = og_threadpool_create(3);
    og_test_section("AMX bf16 tile products vs double over bf16-rounded x, sizes around the tiles");
    printf("AMX-BF16 %s\n", og_cpu_has_amx_bf16() ? "present: the tile kernel runs" : "absent: only its refusal runs");
    const int64_t Ts[] = {1, 15, 16, 17, 33, 64, 100};
    const int64_t Ns[] = {1, 17, 31, 32, 33, 64, 100, 259};
    const int64_t Ks[] = {32, 96, 1056};
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++)
            for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++)
                check_case((a + c) % 2 ? pool : NULL, &r, Ts[a], Ks[k], Ns[c], (a + c + k) % 2 == 0);
    og_test_section("several claims of 8 panels, a short last panel, K 2048 and 3072");
    check_case(pool, &r, 17, 3072, 600, true);
    check_case(pool, &r, 1, 2048, 777, false);
    check_case(NULL, &r, 33, 1024, 520, true);
    og_test_section("a 0.6B-shaped product: T 128, K 1024, N 3072");
    check_case(pool, &r, 128, 1024, 3072, false);

    og_test_section("quantized weights as hi + lo bf16 tiles: q8 and q4, sizes around the tiles");
    const og_dtype qdts[] = {OG_DTYPE_Q8, OG_DTYPE_Q4};
    const int64_t qTs[] = {1, 17, 33, 100}, qNs[] = {1, 33, 64, 259}, qKs[] = {32, 96, 1056};
    for (size_t d = 0; d < 2; d++)
        for (size_t a = 0; a < sizeof qTs / sizeof qTs[0]; a++)
            for (size_t c = 0; c < sizeof qNs / sizeof qNs[0]; c++)
                for (size_t k = 0; k < sizeof qKs / sizeof qKs[0]; k++)
                    check_quant_case((a + c) % 2 ? pool : NULL, &r, qdts[d], qTs[a], qKs[k], qNs[c],
                                     (a + c + k + d) % 2 == 0);
    og_test_section("k-quant weights (q2_k .. q6_k) as hi + lo bf16 tiles");
    for (og_dtype dt = OG_DTYPE_Q2_K; dt <= OG_DTYPE_Q6_K; dt++) {
        check_quant_case(pool, &r, dt, 17, 256, 33, dt % 2 == 0);
        check_quant_case(NULL, &r, dt, 64, 1024, 259, dt % 2 == 1);
    }
    og_test_section("a refusal names what it cannot take");
    {
        float xx[32] = {0}, out[1];
        og_bf16 wb[32] = {0};
        CHECK_STATUS(og_matmul_quant_amx(NULL, xx, wb, OG_DTYPE_BF16, NULL, 1, 32, 1, out), OG_ERR_UNSUPPORTED);
    }

    og_test_section("capping the ISA below AVX-512 turns AMX off with the other bf16 kernels");
    og_cpu_isa_limit(OG_CPU_ISA_AVX2);
    CHECK(!og_cpu_has_amx_bf16());
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
