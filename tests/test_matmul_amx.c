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

    og_test_section("capping the ISA below AVX-512 turns AMX off with the other bf16 kernels");
    og_cpu_isa_limit(OG_CPU_ISA_AVX2);
    CHECK(!og_cpu_has_amx_bf16());
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
