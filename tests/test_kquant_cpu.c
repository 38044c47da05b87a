/* CPU products with k-quant weights (q2_k .. q6_k) against the reference
 * (og_matmul_ref / og_embed_ref: the weights dequantized by
 * og_dequantize_row, which test_kquant checks against the gguf package),
 * at every ISA level this CPU runs, pools of 1 (NULL) and 3 threads:
 *  - decode (T = 1): within the bound of x's rounding to two int8 terms
 *    (per block of 256, d = amax / 127: at most d / 508 an element, so sum
 *    over blocks of d / 508 * sum |w|) plus f32 rounding; and within f32
 *    reassociation of the plain C integer GEMV (og_kq_gemv_scalar: the same
 *    integer sums);
 *  - og_matmul_rows_cpu, og_matmul_rows_multi_cpu and _swiglu_cpu: each row
 *    bit for bit what og_matmul_cpu gives it alone;
 *  - prefill (T > 1): dequantized panels through sgemm, within the f32
 *    summation bound of the reference;
 *  - embed and og_kq_dequantize: bit for bit the reference.
 * Weights from og_quantize_rows (rows of varied magnitude) and from random
 * bytes with finite scales (every level pattern the formats hold). Sizes
 * around the kernels' tiles: N 1, 3, 7, 17, 129; K 256 to 1280.
 * Letters: T tokens, R decode rows, K in features, N out features. */
#include "core/core.h"
#include "harness.h"
#include "kernels/cpu_isa.h"
#include "kernels/kquant_cpu.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

enum { QK = OG_KQUANT_BLOCK };
static const double U = 0x1p-24;
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }

static const og_dtype k_types[] = {OG_DTYPE_Q2_K, OG_DTYPE_Q3_K, OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};

/* Offsets of each block's f16 scales (d, then dmin or -1). */
static void scale_offsets(og_dtype dt, int *d, int *dmin) {
    switch (dt) {
    case OG_DTYPE_Q2_K: *d = 80, *dmin = 82; return;
    case OG_DTYPE_Q3_K: *d = 108, *dmin = -1; return;
    case OG_DTYPE_Q6_K: *d = 208, *dmin = -1; return;
    default: *d = 0, *dmin = 2; return;
    }
}

/* A [N, K] k-quant tensor; its values (og_dequantize_row) into w_exact.
 * random_bytes: every byte random, the f16 scales drawn in [2^-14, 2^-6)
 * with either sign; else og_quantize_rows of uniform rows, row n scaled by
 * 2^(n % 5 - 2). */
static uint8_t *make_weights(og_rng *r, og_dtype dt, int64_t N, int64_t K, bool random_bytes, float *w_exact) {
    const size_t rb = og_kquant_row_bytes(dt, K), bb = og_kquant_block_bytes(dt);
    uint8_t *w = malloc(rb * (size_t)N);
    if (random_bytes) {
        for (size_t i = 0; i < rb * (size_t)N; i++) w[i] = (uint8_t)og_rng_next(r);
        int od, om;
        scale_offsets(dt, &od, &om);
        for (size_t b = 0; b < rb * (size_t)N / bb; b++)
            for (int k = 0; k < 2; k++) {
                const int off = k ? om : od;
                if (off < 0) continue;
                /* exponent field 1..8 (2^-14 .. 2^-7 times 1.mantissa), random sign and mantissa */
                uint8_t *h = w + b * bb + (size_t)off;
                const uint32_t e = 1 + (uint32_t)(og_rng_next(r) % 8);
                h[1] = (uint8_t)((h[1] & 0x83) | (e << 2));
            }
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

/* The bound of x's rounding (kquant_cpu.h) for one row of x against one
 * weight row: d / 508 per element, d = amax / 127 of its block. */
static double int8_bound(const float *x, const float *w, int64_t K) {
    double e = 0;
    for (int64_t b = 0; b < K / QK; b++) {
        float amax = 0;
        double sw = 0;
        for (int i = 0; i < QK; i++) {
            amax = fmaxf(amax, fabsf(x[b * QK + i]));
            sw += fabs((double)w[b * QK + i]);
        }
        e += (double)amax / 127.0 / 508.0 * sw;
    }
    return e * 1.001;
}

static void check_decode(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t K, int64_t N, bool random_bytes,
                         bool with_bias) {
    const int64_t R = 5;
    float *x = malloc(sizeof(float) * (size_t)(R * K));
    float *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *w = make_weights(r, dt, N, K, random_bytes, w_exact);
    float *bias = with_bias ? malloc(sizeof(float) * (size_t)N) : NULL;
    float *ref = malloc(sizeof(float) * (size_t)(R * N)), *single = malloc(sizeof(float) * (size_t)(R * N)),
          *rows = malloc(sizeof(float) * (size_t)(R * N)), *plain = malloc(sizeof(float) * (size_t)(R * N));
    double *bound = malloc(sizeof(double) * (size_t)(R * N)), *mag = malloc(sizeof(double) * (size_t)(R * N));
    og_rng_fill(r, x, (size_t)(R * K), -2.0f, 2.0f);
    for (int64_t i = 0; i < K; i++) x[2 * K + i] *= 1e-3f; /* rows of other magnitudes */
    for (int64_t i = 0; i < QK; i++) x[3 * K + i] = 0;    /* and a block of zeros */
    for (int64_t n = 0; with_bias && n < N; n++) bias[n] = og_rng_uniform(r, -1.0f, 1.0f);
    CHECK_OK(og_matmul_ref(x, w, bias, dt, R, K, N, ref));
    for (int64_t i = 0; i < R; i++)
        for (int64_t n = 0; n < N; n++) {
            double m = with_bias ? fabs((double)bias[n]) : 0;
            for (int64_t k = 0; k < K; k++) m += fabs((double)x[i * K + k] * (double)w_exact[n * K + k]);
            mag[i * N + n] = m;
            bound[i * N + n] = int8_bound(x + i * K, w_exact + n * K, K) + 2 * gamma_n(K + 64) * m;
        }
    /* the plain C integer GEMV, the oracle of the ISA versions */
    og_kq_x *xq = malloc(sizeof(og_kq_x) * (size_t)(R * K / QK));
    og_kq_quantize_x(x, R, K, xq);
    og_kq_gemv_scalar(dt, xq, R, w, K, N, plain, N);
    for (int64_t i = 0; with_bias && i < R; i++)
        for (int64_t n = 0; n < N; n++) plain[i * N + n] += bias[n];

    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(single, (size_t)(R * N));
        for (int64_t i = 0; i < R; i++) CHECK_OK(og_matmul_cpu(pool, x + i * K, w, bias, dt, 1, K, N, single + i * N));
        double worst = 0, worst_plain = 0;
        for (int64_t i = 0; i < R * N; i++) {
            double d = fabs((double)single[i] - (double)ref[i]) / (bound[i] + 1e-30);
            double p = fabs((double)single[i] - (double)plain[i]) / (4 * gamma_n(K / 8 + 64) * mag[i] + 1e-30);
            if (isnan(single[i])) d = p = INFINITY;
            worst = d > worst ? d : worst;
            worst_plain = p > worst_plain ? p : worst_plain;
        }
        CHECK_MSG(worst <= 1.0, "decode vs ref (%s, %s, K=%lld N=%lld bytes=%d bias=%d): ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)K, (long long)N, random_bytes,
                  with_bias, worst);
        CHECK_MSG(worst_plain <= 1.0, "decode vs the plain GEMV (%s, %s, K=%lld N=%lld): ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)K, (long long)N, worst_plain);
        /* R rows at once: each row the bits of its single call */
        for (int64_t rr = 1; rr <= R; rr += 2) {
            og_poison(rows, (size_t)(R * N));
            CHECK_OK(og_matmul_rows_cpu(pool, x, w, bias, dt, rr, K, N, rows));
            CHECK_MSG(memcmp(rows, single, sizeof(float) * (size_t)(rr * N)) == 0,
                      "rows != single (%s, %s, R=%lld K=%lld N=%lld)", og_cpu_isa_name((og_cpu_isa)isa),
                      og_dtype_name(dt), (long long)rr, (long long)K, (long long)N);
        }
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    /* AVX-512 (q4_k .. q6_k) with vpdpbusd and without: the same integer sums, the same bits */
    if (og_cpu_isa_detect() == OG_CPU_ISA_AVX512 &&
        (dt == OG_DTYPE_Q4_K || dt == OG_DTYPE_Q5_K || dt == OG_DTYPE_Q6_K))
        for (int stream = 0; stream < 2; stream++) {
            og_poison(rows, (size_t)(R * N));
            CHECK(og_kq_gemv_avx512(dt, xq, R, w, K, N, stream, false, rows, N));
            for (int64_t i = 0; i < R * N; i++) { /* against the oracle, as above */
                const double p = fabs((double)rows[i] - (double)plain[i] + (with_bias ? bias[i % N] : 0));
                CHECK_MSG(p <= 4 * gamma_n(K / 8 + 64) * mag[i] || (isnan(rows[i]) && isnan(plain[i])),
                          "without AVX512_VNNI vs the plain GEMV (%s, K=%lld N=%lld)", og_dtype_name(dt),
                          (long long)K, (long long)N);
            }
            if (!og_cpu_has_avx512_vnni()) continue;
            og_poison(single, (size_t)(R * N));
            CHECK(og_kq_gemv_avx512(dt, xq, R, w, K, N, stream, true, single, N));
            CHECK_MSG(memcmp(rows, single, sizeof(float) * (size_t)(R * N)) == 0,
                      "AVX512_VNNI != without (%s, K=%lld N=%lld stream=%d)", og_dtype_name(dt), (long long)K,
                      (long long)N, stream);
        }
    free(xq);
    free(x);
    free(w_exact);
    free(w);
    free(bias);
    free(ref);
    free(single);
    free(rows);
    free(plain);
    free(bound);
    free(mag);
}

/* Prefill: exact weights through sgemm, the f32 bound of the reference. */
static void check_prefill(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T, int64_t K, int64_t N) {
    float *x = malloc(sizeof(float) * (size_t)(T * K)), *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *w = make_weights(r, dt, N, K, T % 2 == 1, w_exact);
    float *ref = malloc(sizeof(float) * (size_t)(T * N)), *out = malloc(sizeof(float) * (size_t)(T * N));
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    CHECK_OK(og_matmul_ref(x, w, NULL, dt, T, K, N, ref));
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(out, (size_t)(T * N));
        CHECK_OK(og_matmul_cpu(pool, x, w, NULL, dt, T, K, N, out));
        double worst = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
                double m = 0;
                for (int64_t k = 0; k < K; k++) m += fabs((double)x[t * K + k] * (double)w_exact[n * K + k]);
                double d = fabs((double)out[t * N + n] - (double)ref[t * N + n]) / (2 * gamma_n(K + 1) * m + 1e-30);
                if (isnan(out[t * N + n])) d = INFINITY;
                worst = d > worst ? d : worst;
            }
        CHECK_MSG(worst <= 1.0, "prefill vs ref (%s, %s, T=%lld K=%lld N=%lld): ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T, (long long)K, (long long)N,
                  worst);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(x);
    free(w_exact);
    free(w);
    free(ref);
    free(out);
}

static void check_embed_dequant(og_threadpool *pool, og_rng *r, og_dtype dt) {
    const int64_t V = 37, H = 768, T = 9;
    float *w_exact = malloc(sizeof(float) * (size_t)(V * H));
    uint8_t *table = make_weights(r, dt, V, H, true, w_exact);
    int32_t tokens[9] = {0, 36, 5, 5, 17, 1, 30, 2, 36};
    float *ref = malloc(sizeof(float) * (size_t)(T * H)), *out = malloc(sizeof(float) * (size_t)(T * H)),
          *deq = malloc(sizeof(float) * (size_t)(V * H));
    CHECK_OK(og_embed_ref(tokens, T, table, dt, V, H, ref));
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(out, (size_t)(T * H));
        CHECK_OK(og_embed_cpu(pool, tokens, T, table, dt, V, H, out));
        CHECK_MSG(memcmp(out, ref, sizeof(float) * (size_t)(T * H)) == 0, "embed (%s, %s) differs",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt));
        og_poison(deq, (size_t)(V * H));
        og_kq_dequantize((og_cpu_isa)isa, dt, table, H, V, deq);
        CHECK_MSG(memcmp(deq, w_exact, sizeof(float) * (size_t)(V * H)) == 0, "og_kq_dequantize (%s, %s) differs",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt));
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(w_exact);
    free(table);
    free(ref);
    free(out);
    free(deq);
}

/* q/k/v-like parts of mixed dtypes, and gate/up with their swiglu: each
 * part's rows the bits of og_matmul_rows_cpu alone. */
static void check_multi(og_threadpool *pool, og_rng *r) {
    const int64_t R = 3, K = 512, N0 = 67, N1 = 35;
    float *x = malloc(sizeof(float) * (size_t)(R * K)), *we = malloc(sizeof(float) * (size_t)(N0 * K));
    og_rng_fill(r, x, (size_t)(R * K), -1.0f, 1.0f);
    uint8_t *wa = make_weights(r, OG_DTYPE_Q4_K, N0, K, false, we);
    uint8_t *wb = make_weights(r, OG_DTYPE_Q6_K, N1, K, false, we);
    uint8_t *wc = make_weights(r, OG_DTYPE_Q4_K, N0, K, true, we);
    float *o[6], *g = malloc(sizeof(float) * (size_t)(R * N0)), *g2 = malloc(sizeof(float) * (size_t)(R * N0));
    for (int i = 0; i < 6; i++) o[i] = malloc(sizeof(float) * (size_t)(R * N0));
    og_matmul_part parts[2] = {{wa, NULL, OG_DTYPE_Q4_K, N0, o[0]}, {wb, NULL, OG_DTYPE_Q6_K, N1, o[1]}};
    CHECK_OK(og_matmul_rows_multi_cpu(pool, x, R, K, parts, 2));
    CHECK_OK(og_matmul_rows_cpu(pool, x, wa, NULL, OG_DTYPE_Q4_K, R, K, N0, o[2]));
    CHECK_OK(og_matmul_rows_cpu(pool, x, wb, NULL, OG_DTYPE_Q6_K, R, K, N1, o[3]));
    CHECK(memcmp(o[0], o[2], sizeof(float) * (size_t)(R * N0)) == 0);
    CHECK(memcmp(o[1], o[3], sizeof(float) * (size_t)(R * N1)) == 0);
    og_matmul_part gate = {wa, NULL, OG_DTYPE_Q4_K, N0, o[4]}, up = {wc, NULL, OG_DTYPE_Q4_K, N0, o[5]};
    CHECK_OK(og_matmul_rows_swiglu_cpu(pool, x, R, K, &gate, &up, g));
    CHECK_OK(og_matmul_rows_cpu(pool, x, wc, NULL, OG_DTYPE_Q4_K, R, K, N0, o[3]));
    CHECK_OK(og_swiglu_cpu(pool, o[2], o[3], R, N0, g2));
    CHECK(memcmp(g, g2, sizeof(float) * (size_t)(R * N0)) == 0);
    for (int i = 0; i < 6; i++) free(o[i]);
    free(g);
    free(g2);
    free(x);
    free(we);
    free(wa);
    free(wb);
    free(wc);
}

int main(void) {
    og_threadpool *pool = og_threadpool_create(3);
    CHECK(pool != NULL);
    og_rng r = og_rng_seed(35);
    const int64_t Ks[] = {256, 512, 1280}, Ns[] = {1, 3, 7, 17, 129};
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        const og_dtype dt = k_types[t];
        og_test_section(og_dtype_name(dt));
        for (size_t a = 0; a < sizeof Ks / sizeof Ks[0]; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
                check_decode((a + b) % 2 ? pool : NULL, &r, dt, Ks[a], Ns[b], (a + b + t) % 2 == 0, b % 2 == 1);
        check_prefill(pool, &r, dt, 2, 512, 17);
        check_prefill(NULL, &r, dt, 7, 256, 65);
        check_prefill(pool, &r, dt, 33, 768, 129);
        check_embed_dequant(pool, &r, dt);
    }
    og_test_section("several parts in one pass");
    check_multi(pool, &r);
    check_multi(NULL, &r);
    /* the decode GEMV's loop for weights streamed from memory (one weight
     * row at a time): a terabyte "loaded" makes og_cpu_weights_fit_cache say
     * no; the same checks, rows == single among them */
    og_test_section("decode, weights streamed");
    og_cpu_weights_loaded(1ll << 40);
    CHECK(!og_cpu_weights_fit_cache());
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++)
        for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
            check_decode(b % 2 ? pool : NULL, &r, k_types[t], 1280, Ns[b], (b + t) % 2 == 0, b % 2 == 1);
    og_cpu_weights_loaded(-(1ll << 40));
    og_threadpool_destroy(pool);
    return og_test_finish();
}
