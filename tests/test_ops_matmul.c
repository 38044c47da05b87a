/* matmul: the reference against a double-precision dot product with a
 * rigorous f32 error bound, the fast version (GEMV for T == 1, panel sgemm
 * for T > 1, every ISA level) against the reference, exact integer cases
 * that catch any dropped or doubled term, and argument errors.
 * Letters: T tokens, K in features, N out features. */
#include "harness.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

static const double U = 0x1p-24; /* f32 unit roundoff */

/* gamma_n = n u / (1 - n u): bound on the relative error of an n-term f32
 * sum of products (Higham, 3.1), whatever the summation order or FMA use. */
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }

/* Random weights of dtype dt in w; their exact values as f32 in w_exact. */
static void fill_weights(og_rng *r, og_dtype dt, void *w, float *w_exact, size_t n, float lo,
                         float hi) {
    for (size_t i = 0; i < n; i++) {
        float v = og_rng_uniform(r, lo, hi);
        og_store_f32(w, dt, i, v);
        w_exact[i] = og_load_f32(w, dt, i);
    }
}

typedef struct {
    double *exact; /* [T, N] */
    double *mag;   /* [T, N] sum |x w| + |bias| */
} oracle;

static oracle oracle_compute(const float *x, const float *w, const float *bias, int64_t T,
                             int64_t K, int64_t N) {
    oracle o = {malloc(sizeof(double) * (size_t)(T * N)), malloc(sizeof(double) * (size_t)(T * N))};
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[t * K + k] * (double)w[j * K + k];
                s += p;
                m += fabs(p);
            }
            if (bias) {
                s += bias[j];
                m += fabs((double)bias[j]);
            }
            o.exact[t * N + j] = s;
            o.mag[t * N + j] = m;
        }
    return o;
}

/* Largest |got - want| / (scale * mag) (<= 1 passes); NaN is infinitely bad. */
static double bound_ratio(const float *got, const double *want, const double *mag, size_t n,
                          double scale) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        double allowed = scale * mag[i] + 1e-30;
        double r = fabs((double)got[i] - want[i]) / allowed;
        if (r > worst) worst = r;
    }
    return worst;
}

static void check_case(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T, int64_t K,
                       int64_t N, bool with_bias) {
    size_t es = og_dtype_size(dt);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    void *w = malloc(es * (size_t)(N * K));
    float *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    void *b = with_bias ? malloc(es * (size_t)N) : NULL;
    float *b_exact = with_bias ? malloc(sizeof(float) * (size_t)N) : NULL;
    float *ref = malloc(sizeof(float) * (size_t)(T * N));
    float *fast = malloc(sizeof(float) * (size_t)(T * N));
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    fill_weights(r, dt, w, w_exact, (size_t)(N * K), -1.0f, 1.0f);
    if (with_bias) fill_weights(r, dt, b, b_exact, (size_t)N, -1.0f, 1.0f);

    oracle o = oracle_compute(x, w_exact, b_exact, T, K, N);
    og_poison(ref, (size_t)(T * N));
    CHECK_OK(og_matmul_ref(x, w, b, dt, T, K, N, ref));
    double g = gamma_n(K + 1);
    double rr = bound_ratio(ref, o.exact, o.mag, (size_t)(T * N), g);
    CHECK_MSG(rr <= 1.0, "ref vs double: %s T=%lld K=%lld N=%lld bias=%d ratio %.3g",
              og_dtype_name(dt), (long long)T, (long long)K, (long long)N, with_bias, rr);

    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(fast, (size_t)(T * N));
        CHECK_OK(og_matmul_cpu(pool, x, w, b, dt, T, K, N, fast));
        /* both are within gamma of the exact sum, so within 2 gamma of each other */
        double fr = bound_ratio(fast, o.exact, o.mag, (size_t)(T * N), g);
        double fv = 0;
        for (size_t i = 0; i < (size_t)(T * N); i++) {
            double d = fabs((double)fast[i] - (double)ref[i]) / (2 * g * o.mag[i] + 1e-30);
            if (isnan(fast[i]) || d > fv) fv = isnan(fast[i]) ? INFINITY : d;
        }
        CHECK_MSG(fr <= 1.0 && fv <= 1.0,
                  "fast(%s) %s T=%lld K=%lld N=%lld bias=%d: vs double %.3g, vs ref %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N, with_bias, fr, fv);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(o.exact);
    free(o.mag);
    free(x);
    free(w);
    free(w_exact);
    free(b);
    free(b_exact);
    free(ref);
    free(fast);
}

/* Small integers: every product and partial sum is exact in f32, so any
 * order gives the same bits, and a dropped, doubled or misplaced term shows
 * as an exact mismatch. */
static void check_exact(og_threadpool *pool, og_dtype dt, int64_t T, int64_t K, int64_t N) {
    og_rng r = og_rng_seed((uint64_t)(T * 1000003 + K * 1009 + N));
    size_t es = og_dtype_size(dt);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    void *w = malloc(es * (size_t)(N * K));
    float *want = malloc(sizeof(float) * (size_t)(T * N));
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    for (int64_t i = 0; i < T * K; i++) x[i] = (float)((int)(og_rng_next(&r) % 5) - 2);
    for (int64_t i = 0; i < N * K; i++)
        og_store_f32(w, dt, (size_t)i, (float)((int)(og_rng_next(&r) % 5) - 2));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) {
            long s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (long)x[t * K + k] * (long)og_load_f32(w, dt, (size_t)(j * K + k));
            want[t * N + j] = (float)s;
        }
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_cpu(pool, x, w, NULL, dt, T, K, N, got));
        CHECK_MSG(memcmp(got, want, sizeof(float) * (size_t)(T * N)) == 0,
                  "exact integer matmul (%s, %s, T=%lld K=%lld N=%lld) differs",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N);
    }
    og_poison(got, (size_t)(T * N));
    CHECK_OK(og_matmul_ref(x, w, NULL, dt, T, K, N, got));
    CHECK(memcmp(got, want, sizeof(float) * (size_t)(T * N)) == 0);
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(x);
    free(w);
    free(want);
    free(got);
}

/* og_matmul_bf16_cpu: x is rounded to bf16 first, so the oracle is the
 * double-precision sum over the rounded x (rounded here by og_bf16_from_f32,
 * independently of the kernel's vector conversion). Products of two bf16
 * values are exact in f32, so the same gamma_{K+1} bound on the f32
 * summation holds as for og_matmul_cpu; a term computed from unrounded x
 * would be off by up to 2^-8 relative, far outside it. Every ISA level runs
 * (the vdpbf16ps kernel only at the top one, when the CPU has AVX512_BF16). */
static void check_bf16_activations(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T,
                                   int64_t K, int64_t N, bool with_bias) {
    size_t es = og_dtype_size(dt);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    float *xr = malloc(sizeof(float) * (size_t)(T * K));
    void *w = malloc(es * (size_t)(N * K));
    float *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    void *b = with_bias ? malloc(es * (size_t)N) : NULL;
    float *b_exact = with_bias ? malloc(sizeof(float) * (size_t)N) : NULL;
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
    fill_weights(r, dt, w, w_exact, (size_t)(N * K), -1.0f, 1.0f);
    if (with_bias) fill_weights(r, dt, b, b_exact, (size_t)N, -1.0f, 1.0f);
    oracle o = oracle_compute(xr, w_exact, b_exact, T, K, N);
    const double g = gamma_n(K + 1);
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_bf16_cpu(pool, x, w, b, dt, T, K, N, got));
        double fr = bound_ratio(got, o.exact, o.mag, (size_t)(T * N), g);
        CHECK_MSG(fr <= 1.0, "matmul_bf16(%s%s) %s T=%lld K=%lld N=%lld bias=%d: ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa),
                  isa == OG_CPU_ISA_AVX512 && og_cpu_has_avx512_bf16() ? " bf16" : "",
                  og_dtype_name(dt), (long long)T, (long long)K, (long long)N, with_bias, fr);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(o.exact);
    free(o.mag);
    free(x);
    free(xr);
    free(w);
    free(w_exact);
    free(b);
    free(b_exact);
    free(got);
}

/* ---- quantized weights (q8, q4) ----
 * The weights are random f32 quantized by og_quantize_rows; their exact
 * values are decoded here from the layout offgraph.h states (quants plane,
 * then f16 scales; q4 byte j of a group holding elements j and j + 16),
 * independently of og_dequantize_row and of the kernels.
 * Bound: every dequantized weight is exact in f32, so the reference is an
 * f32 sum of K products and the bias, within gamma_{K+1} of the exact sum
 * (as above). The fast GEMV reassociates it: a group's 32 products are summed
 * (at most 32 roundings per term in the scalar loop, fewer in SIMD lanes),
 * scaled (1), added into the row's sums (at most K/32 + 1), the lanes reduced
 * (at most 4) and the bias added (1): under K + 40 roundings per term for
 * any K >= 32, so gamma_{K+40}. T > 1 multiplies the exact f32 weights with
 * sgemm: within gamma_{K+1}. A wrong scale, nibble or group shifts a result
 * by a sizeable fraction of its magnitude, thousands of times these bounds. */
static float q_elem(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n, int64_t k) {
    const uint8_t *b = w;
    const int64_t g = k / 32, j = k % 32;
    int q;
    if (dt == OG_DTYPE_Q8) {
        q = (int8_t)b[n * K + k];
    } else {
        const uint8_t byte = b[n * (K / 2) + g * 16 + j % 16];
        q = (j < 16 ? byte & 15 : byte >> 4) - 8;
    }
    const size_t quants = (size_t)(dt == OG_DTYPE_Q8 ? N * K : N * K / 2);
    og_f16 s;
    memcpy(&s, b + quants + 2 * (size_t)(n * (K / 32) + g), sizeof s);
    return og_f32_from_f16(s) * (float)q;
}

/* A [N, K] tensor of dt quantized from uniform [-1, 1) (groups scaled by up
 * to 8 apart, so the scales differ); its exact values in w_exact [N, K]. */
static void *make_quant(og_rng *r, og_dtype dt, int64_t N, int64_t K, float *w_exact) {
    const int64_t shape[2] = {N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
    void *w = malloc((size_t)bytes);
    float *src = malloc(sizeof(float) * (size_t)(N * K));
    og_rng_fill(r, src, (size_t)(N * K), -1.0f, 1.0f);
    for (int64_t i = 0; i < N * K; i++) src[i] *= (float)(1 << (i / 32 % 4));
    CHECK_OK(og_quantize_rows(dt, src, N, K, w));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) w_exact[n * K + k] = q_elem(dt, w, N, K, n, k);
    free(src);
    return w;
}

static void check_quant_case(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T, int64_t K,
                             int64_t N, bool with_bias) {
    float *x = malloc(sizeof(float) * (size_t)(T * K));          /* [T, K] */
    float *w_exact = malloc(sizeof(float) * (size_t)(N * K));    /* [N, K] */
    float *b = with_bias ? malloc(sizeof(float) * (size_t)N) : NULL; /* [N] f32 */
    float *ref = malloc(sizeof(float) * (size_t)(T * N));        /* [T, N] */
    float *fast = malloc(sizeof(float) * (size_t)(T * N));       /* [T, N] */
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    void *w = make_quant(r, dt, N, K, w_exact);
    if (with_bias) og_rng_fill(r, b, (size_t)N, -1.0f, 1.0f);
    oracle o = oracle_compute(x, w_exact, b, T, K, N);
    og_poison(ref, (size_t)(T * N));
    CHECK_OK(og_matmul_ref(x, w, b, dt, T, K, N, ref));
    const double g_ref = gamma_n(K + 1), g_fast = gamma_n(K + 40);
    double rr = bound_ratio(ref, o.exact, o.mag, (size_t)(T * N), g_ref);
    CHECK_MSG(rr <= 1.0, "ref vs double: %s T=%lld K=%lld N=%lld bias=%d ratio %.3g",
              og_dtype_name(dt), (long long)T, (long long)K, (long long)N, with_bias, rr);
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(fast, (size_t)(T * N));
        CHECK_OK(og_matmul_cpu(pool, x, w, b, dt, T, K, N, fast));
        double fr = bound_ratio(fast, o.exact, o.mag, (size_t)(T * N), g_fast);
        double fv = 0;
        for (size_t i = 0; i < (size_t)(T * N); i++) {
            double d = fabs((double)fast[i] - (double)ref[i]) /
                       ((g_ref + g_fast) * o.mag[i] + 1e-30);
            if (isnan(fast[i]) || d > fv) fv = isnan(fast[i]) ? INFINITY : d;
        }
        CHECK_MSG(fr <= 1.0 && fv <= 1.0,
                  "fast(%s) %s T=%lld K=%lld N=%lld bias=%d: vs double %.3g, vs ref %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N, with_bias, fr, fv);
        /* bf16 activations: x rounded to bf16, then the same sum */
        if (N > 67) continue; /* keeps the test short; the paths are those of smaller N */
        float *xr = malloc(sizeof(float) * (size_t)(T * K));
        for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
        oracle orr = oracle_compute(xr, w_exact, b, T, K, N);
        og_poison(fast, (size_t)(T * N));
        CHECK_OK(og_matmul_bf16_cpu(pool, x, w, b, dt, T, K, N, fast));
        double br = bound_ratio(fast, orr.exact, orr.mag, (size_t)(T * N), g_fast);
        CHECK_MSG(br <= 1.0, "matmul_bf16(%s) %s T=%lld K=%lld N=%lld bias=%d: ratio %.3g",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N, with_bias, br);
        free(orr.exact);
        free(orr.mag);
        free(xr);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(o.exact);
    free(o.mag);
    free(x);
    free(w);
    free(w_exact);
    free(b);
    free(ref);
    free(fast);
}

/* Quantized weights written here byte by byte (not by og_quantize_rows):
 * scales 0.5, 1, 2, 4 by group, quants of every value the format holds
 * (q8 -127..127 and -128; q4 all 16 nibbles), x small integers, so every
 * product and sum is exact and any dropped, doubled or misplaced term, wrong
 * nibble or wrong scale is an exact mismatch. */
static void check_quant_exact(og_threadpool *pool, og_dtype dt, int64_t T, int64_t K, int64_t N) {
    og_rng r = og_rng_seed((uint64_t)(T * 1000003 + K * 1009 + N + dt));
    const int64_t shape[2] = {N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
    uint8_t *w = malloc((size_t)bytes);
    const size_t quants = (size_t)(dt == OG_DTYPE_Q8 ? N * K : N * K / 2);
    for (size_t i = 0; i < quants; i++) w[i] = (uint8_t)og_rng_next(&r);
    static const og_f16 scales[4] = {0x3800, 0x3c00, 0x4000, 0x4400}; /* 0.5 1 2 4 */
    for (int64_t i = 0; i < N * (K / 32); i++)
        memcpy(w + quants + 2 * i, &scales[(i * 7 + 3) % 4], 2);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    float *want = malloc(sizeof(float) * (size_t)(T * N));
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    for (int64_t i = 0; i < T * K; i++) x[i] = (float)((int)(og_rng_next(&r) % 5) - 2);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0; /* halves and integers below 2^24: exact */
            for (int64_t k = 0; k < K; k++) s += (double)x[t * K + k] * q_elem(dt, w, N, K, j, k);
            want[t * N + j] = (float)s;
        }
    for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        og_poison(got, (size_t)(T * N));
        CHECK_OK(og_matmul_cpu(pool, x, w, NULL, dt, T, K, N, got));
        CHECK_MSG(memcmp(got, want, sizeof(float) * (size_t)(T * N)) == 0,
                  "exact quantized matmul (%s, %s, T=%lld K=%lld N=%lld) differs",
                  og_cpu_isa_name((og_cpu_isa)isa), og_dtype_name(dt), (long long)T,
                  (long long)K, (long long)N);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    og_poison(got, (size_t)(T * N));
    CHECK_OK(og_matmul_ref(x, w, NULL, dt, T, K, N, got));
    CHECK(memcmp(got, want, sizeof(float) * (size_t)(T * N)) == 0);
    free(w);
    free(x);
    free(want);
    free(got);
}

static void check_quant_errors(og_threadpool *pool) {
    float x[64] = {0}, out[8];
    float wf[(4 * 64 + 64) / 4] = {0}; /* room for [4, 64] q8 with its scales */
    const uint8_t *w = (const uint8_t *)wf;
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        /* K not a multiple of the group: the rows do not hold whole groups */
        CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, dt, 1, 48, 4, out), OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "not a multiple of 32") != NULL);
        CHECK_STATUS(og_matmul_ref(x, w, NULL, dt, 1, 33, 4, out), OG_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(og_matmul_rows_cpu(pool, x, w, NULL, dt, 1, 16, 4, out),
                     OG_ERR_INVALID_ARGUMENT);
        /* out overlapping the weights' scale plane (past K * N / 2 bytes for q4)
         * is refused: the weight is sized by og_tensor_bytes, not per element */
        float *in_scales = wf + (dt == OG_DTYPE_Q8 ? 4 * 64 : 4 * 32) / 4 + 1;
        CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, dt, 1, 64, 4, in_scales),
                     OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "overlaps weight") != NULL);
        /* the bias is f32 beside quantized weights: out over its last float */
        float bias[5] = {0};
        CHECK_STATUS(og_matmul_ref(x, w, bias, dt, 1, 64, 4, bias + 3), OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "overlaps bias") != NULL);
        CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, dt, 1, INT64_MAX / 32 * 32, 2, out),
                     OG_ERR_INVALID_ARGUMENT);
    }
}

static void check_errors(og_threadpool *pool) {
    float x[16] = {0}, out[12];
    og_bf16 w[12] = {0};
    CHECK_STATUS(og_matmul_cpu(pool, NULL, w, NULL, OG_DTYPE_BF16, 1, 3, 4, out),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_ref(x, w, NULL, OG_DTYPE_BF16, 0, 3, 4, out), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, OG_DTYPE_F16, 1, 3, 4, out), OG_ERR_UNSUPPORTED);
    CHECK(strstr(og_last_error(), "f16") != NULL);
    /* out overlapping x is refused before anything is written */
    CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 1, 3, 4, x + 2),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "overlaps x") != NULL);
    CHECK_STATUS(og_matmul_ref(x, w, NULL, OG_DTYPE_BF16, 2, 3, 4, x + 5), /* [2,3] vs [2,4] */
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matmul_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 1, INT64_MAX, 2, out),
                 OG_ERR_INVALID_ARGUMENT);
}

/* og_matmul_bf16_cpu with k-quant weights (the vdpbf16ps kernel where the CPU
 * has AVX512_BF16, else x rounded through og_matmul_cpu). The weights are
 * random f32 quantized by og_kquant_quantize_rows, their exact values those
 * of the reference decoder og_kquant_dequantize_row (checked against the
 * gguf package by test_kquant); the oracle is the double sum over x rounded
 * to bf16. q6_k goes as bf16 hi + lo pairs, each within 2^-16 |w|; q4_k and
 * q5_k as their exact levels times each group's scale, less the group's min
 * times its sum of x, whose roundings are relative to sum |x| (|d sc q| +
 * d_min m) rather than to sum |x w|. With |d sc q| <= |w| + d_min m and the
 * quantizer's d_min m at most about the largest |w| of the group (it offsets
 * the group's least value), 4 sum_g max_g |w| sum_{k in g} |x| bounds that
 * magnitude; the allowance is gamma_{K+40} + 2^-15 of it. A wrong level
 * plane, scale or min moves a result by a good fraction of its magnitude. */
static void check_kquant_bf16(og_threadpool *pool, og_rng *r, og_dtype dt, int64_t T, int64_t K, int64_t N) {
    float *x = malloc(sizeof(float) * (size_t)(T * K)), *xr = malloc(sizeof(float) * (size_t)(T * K));
    float *wf = malloc(sizeof(float) * (size_t)(N * K)), *w_exact = malloc(sizeof(float) * (size_t)(N * K));
    float *got = malloc(sizeof(float) * (size_t)(T * N));
    void *w = malloc(og_kquant_row_bytes(dt, K) * (size_t)N);
    og_rng_fill(r, x, (size_t)(T * K), -2.0f, 2.0f);
    og_rng_fill(r, wf, (size_t)(N * K), -1.0f, 1.0f);
    for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
    CHECK_OK(og_kquant_quantize_rows(dt, wf, N, K, w));
    for (int64_t n = 0; n < N; n++) og_kquant_dequantize_row(dt, w, K, n, w_exact + n * K);
    oracle o = oracle_compute(xr, w_exact, NULL, T, K, N);
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double m = 0;
            for (int64_t g = 0; g < K / 32; g++) {
                double wmax = 0, xs = 0;
                for (int64_t k = 32 * g; k < 32 * g + 32; k++) {
                    wmax = fmax(wmax, fabs((double)w_exact[n * K + k]));
                    xs += fabs((double)xr[t * K + k]);
                }
                m += 4 * wmax * xs;
            }
            o.mag[t * N + n] = fmax(o.mag[t * N + n], m);
        }
    og_poison(got, (size_t)(T * N));
    CHECK_OK(og_matmul_bf16_cpu(pool, x, w, NULL, dt, T, K, N, got));
    const double ratio = bound_ratio(got, o.exact, o.mag, (size_t)(T * N), gamma_n(K + 40) + 0x1p-15);
    CHECK_MSG(ratio <= 1.0, "matmul_bf16 %s%s T=%lld K=%lld N=%lld: ratio %.3g", og_dtype_name(dt),
              og_cpu_has_avx512_bf16() ? " (vdpbf16ps)" : "", (long long)T, (long long)K, (long long)N, ratio);
    free(o.exact);
    free(o.mag);
    free(x);
    free(xr);
    free(wf);
    free(w_exact);
    free(got);
    free(w);
}

int main(void) {
    og_threadpool *pool = og_threadpool_create(2);
    CHECK(pool != NULL);
    og_rng r = og_rng_seed(7);
    static const int64_t Ts[] = {1, 3, 7, 17, 129};
    static const int64_t Ks[] = {1, 3, 17, 129, 257, 1000};
    static const int64_t Ns[] = {1, 3, 17, 129, 257, 1000};
    og_test_section("matmul vs reference vs double, odd sizes");
    for (int dti = 0; dti < 2; dti++) {
        og_dtype dt = dti ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++)
                for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) {
                    int64_t T = Ts[a], K = Ks[b], N = Ns[c];
                    if (T * K * N > 10000000) continue; /* keeps the test to seconds */
                    check_case(a % 2 ? pool : NULL, &r, dt, T, K, N, (a + b + c) % 2 == 0);
                }
        check_case(pool, &r, dt, 129, 257, 129, true);
    }
    og_test_section("matmul with bf16 activations vs double, odd sizes");
    if (!og_cpu_has_avx512_bf16()) printf("no AVX512_BF16 here: only the rounding fallback runs\n");
    static const int64_t Tb[] = {2, 3, 31, 33, 129};
    static const int64_t Kb[] = {1, 2, 17, 128, 257};
    static const int64_t Nb[] = {1, 7, 9, 65, 257};
    for (size_t a = 0; a < sizeof Tb / sizeof *Tb; a++)
        for (size_t b = 0; b < sizeof Kb / sizeof *Kb; b++)
            for (size_t c = 0; c < sizeof Nb / sizeof *Nb; c++)
                check_bf16_activations(a % 2 ? pool : NULL, &r, OG_DTYPE_BF16, Tb[a], Kb[b],
                                       Nb[c], (a + b + c) % 2 == 0);
    check_bf16_activations(pool, &r, OG_DTYPE_F32, 33, 129, 65, true);
    og_test_section("matmul with bf16 activations and k-quant weights vs double");
    static const og_dtype kq[3] = {OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
    for (int d = 0; d < 3; d++)
        for (int64_t T = 2; T <= 70; T += 34)
            for (int64_t K = 256; K <= 1024; K *= 2) {
                check_kquant_bf16(pool, &r, kq[d], T, K, 7);
                check_kquant_bf16(T > 2 ? pool : NULL, &r, kq[d], T, K, 37);
            }
    og_test_section("matmul exact integer sums");
    check_exact(pool, OG_DTYPE_BF16, 1, 1000, 257);
    check_exact(pool, OG_DTYPE_BF16, 5, 1000, 129);
    check_exact(pool, OG_DTYPE_F32, 1, 257, 1000);
    check_exact(pool, OG_DTYPE_F32, 17, 129, 257);
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        char name[80];
        snprintf(name, sizeof name, "matmul with %s weights vs reference vs double, odd sizes",
                 og_dtype_name(dt));
        og_test_section(name);
        static const int64_t Tq[] = {1, 3, 40};
        static const int64_t Kq[] = {32, 96, 1056};
        static const int64_t Nq[] = {1, 17, 67, 259};
        for (size_t a = 0; a < sizeof Tq / sizeof *Tq; a++)
            for (size_t b = 0; b < sizeof Kq / sizeof *Kq; b++)
                for (size_t c = 0; c < sizeof Nq / sizeof *Nq; c++)
                    for (int bias = 0; bias < 2; bias++)
                        check_quant_case((a + c) % 2 ? pool : NULL, &r, dt, Tq[a], Kq[b], Nq[c],
                                         bias);
        check_quant_exact(pool, dt, 1, 1056, 259);
        check_quant_exact(pool, dt, 3, 96, 67);
        check_quant_exact(NULL, dt, 1, 32, 17);
        check_quant_exact(pool, dt, 40, 1056, 17);
    }
    og_test_section("matmul argument errors");
    check_errors(pool);
    check_quant_errors(pool);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
