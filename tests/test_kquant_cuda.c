/* The CUDA kernels of kquant_cuda.h against the C references (og_matmul_ref,
 * og_embed_ref, og_dequantize_row: the weights' exact values, which
 * test_kquant checks against the gguf package), and the CUDA back end on
 * k-quant programs against the CPU back end.
 *
 * Kernels, every k-quant, weights from og_quantize_rows (rows of varied
 * magnitude) and from random bytes with finite scales; odd sizes: N 1, 17,
 * 67, 259; K 256, 768, 2048; T 1, 3, 8:
 *  - gemv (f32 x, exact weights, f32 sums in another order): within
 *    2 gamma_(K+16) sum |x w| (+ |bias|) of the reference, the bound of any
 *    two f32 orders of the same sum;
 *  - dequantization of a panel and embedding: bit for bit.
 * The integer gemv (q4_k, q5_k, q6_k; T 1 to 8; K 256, 768, 2048, 4096; N
 * as above), against the CPU's plain C integer gemv og_kq_gemv_scalar:
 *  - x's int8 terms (og_kquant_quantize_x_cuda) equal og_kq_quantize_x's
 *    bit for bit (hi, lo, the sums by 16, u = d / 254), zero blocks and a
 *    block with a NaN included;
 *  - the products: the integer sums are exact on both, so they differ by
 *    f32 rounding only. A unit's term (u d) A_i - (u dmin) B_i takes 3
 *    roundings, a lane adds at most ceil(nb / 4) of them, 5 shuffle levels
 *    and the bias follow: gamma_(nb/4 + 10) S on the GPU; the CPU's block
 *    terms take 3, its two sums nb and the difference 1 (and the bias 1):
 *    gamma_(nb + 5) S; S = sum |(u d) A_i| + |(u dmin) B_i| over units <=
 *    sum over elements of |x~| (|w| + 2 |dmin m|) + |bias| (x~ = u (254 hi
 *    + lo), w the exact weight, dmin m its sub-block's min: q4_k, q5_k), so
 *    |gpu - cpu| <= (gamma_(nb/4 + 10) + gamma_(nb + 5)) S.
 *    The second cut (variant 2, OG_CUDA_KQUANT_GEMV=v2) adds the same unit
 *    terms, ceil(nb / 16) a lane, then 5 shuffle levels, 2 levels across
 *    its 4 warps and the bias: gamma_(ceil(nb/16) + 12) S on the GPU (3
 *    roundings a term, 1 spare). The streamed one (variant 3, the default
 *    at 1 and 2 rows) must give variant 1's outputs bit for bit: the same
 *    lanes add the same unit terms in the same order. Every variant runs
 *    on every case, 2 and 3 again through og_kquant_gemv_int8_cuda with the
 *    switch set, and variant 3 once more with three parts in one launch
 *    (og_kquant_gemv_int8_multi_cuda: the first N, N / 2 + 1 and 1 rows of
 *    the weight), each part variant 1's bits for its rows, and again from
 *    f32 x (og_kquant_gemv_x_multi_cuda: each block writes x's terms into
 *    its shared memory where they fit, else they go through a scratch);
 *    its add + rms_norm prologue (og_kquant_gemv_x_multi_cuda with a norm)
 *    against og_add_rms_norm_cuda then the products of its output: the
 *    products and the sums bit for bit (q4_k, q5_k, q6_k; 1 to 3 parts; T 1,
 *    2; K 2048 to 12288; an f32 and a bf16 norm weight); the swiglu in the
 *    gate / up launch (og_kquant_gemv_x_swiglu_cuda) against the two
 *    products then og_swiglu_cuda, bit for bit (from x and from the norm,
 *    with and without biases, N odd, 2 and 4 rows a task, 1 to 8 rows of x);
 *    v2 also on
 *    N 4227 (K 4096) and 2001 (K 2048), every T: its blocks of 4 and 2 rows
 *    (on 132 SMs; fewer than 6 blocks an SM of them take 1) and their tails, and
 *    the 8B products' shapes (K 4096 N 6144, K 12288 N 4096; T 1, 2, 5, 8),
 *    left out with OG_CUDA_TEST_QUICK=1 (sanitizer runs).
 * Back end: the checkpoint of tests/data/kquant's files (written here by
 * kquant_fixture.c) exported with the q4_k_m, q5_k_m and q2_k mixes and
 * every matrix q3_k, f32 activations; logits of a 48-token prompt fed at
 * once (prefill: dequantized panels and SGEMM on both) and a token at a time
 * (decode: the CUDA gemv with f32 x, the CPU with x in two int8 terms,
 * 1/64516 of a block's largest value an element) within 5e-4 of the logits'
 * scale of each other, measured near 1e-4 on the CPU's own decode against
 * its prefill (test_gguf_kquant).
 * og_dequantize_split_cuda, for q8, q4 and every k-quant (the panels of a
 * bf16 program's quantized prefill): a panel's hi and lo are
 * og_bf16_from_f32(w) and og_bf16_from_f32(w - hi) of the exact weights
 * og_dequantize_row gives, bit for bit; bf16 weights and a misaligned lo
 * are refused. Skipped (77) without CUDA or a device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "core/core.h"
#include "kernels/cuda/kquant_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/kquant_cpu.h"
#include "kernels/ops.h"
#include "kquant_fixture.h"
#include "import/export.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { QK = OG_KQUANT_BLOCK };
static const double U = 0x1p-24;
static double gamma_n(int64_t n) { return (double)n * U / (1.0 - (double)n * U); }
static const og_dtype k_types[] = {OG_DTYPE_Q2_K, OG_DTYPE_Q3_K, OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
static og_rng rng;

static void *up(const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}
static float *down(const float *dev, size_t n) {
    float *h = malloc(n * sizeof *h);
    CK(cudaMemcpy(h, dev, n * sizeof *h, cudaMemcpyDeviceToHost));
    return h;
}
static float *poisoned(size_t n) {
    float *h = malloc(n * sizeof *h);
    og_poison(h, n);
    float *d = up(h, n * sizeof *h);
    free(h);
    return d;
}

/* Offsets of each block's f16 scales (d, then dmin or -1). */
static void scale_offsets(og_dtype dt, int *d, int *dmin) {
    switch (dt) {
    case OG_DTYPE_Q2_K: *d = 80, *dmin = 82; return;
    case OG_DTYPE_Q3_K: *d = 108, *dmin = -1; return;
    case OG_DTYPE_Q6_K: *d = 208, *dmin = -1; return;
    default: *d = 0, *dmin = 2; return;
    }
}

/* A [N, K] k-quant tensor (host) and its values. */
static uint8_t *make_weights(og_dtype dt, int64_t N, int64_t K, bool random_bytes, float *w_exact) {
    const size_t rb = og_kquant_row_bytes(dt, K), bb = og_kquant_block_bytes(dt);
    uint8_t *w = malloc(rb * (size_t)N);
    if (random_bytes) {
        for (size_t i = 0; i < rb * (size_t)N; i++) w[i] = (uint8_t)og_rng_next(&rng);
        int od, om;
        scale_offsets(dt, &od, &om);
        for (size_t b = 0; b < rb * (size_t)N / bb; b++)
            for (int k = 0; k < 2; k++) {
                const int off = k ? om : od;
                if (off < 0) continue;
                uint8_t *h = w + b * bb + (size_t)off;
                h[1] = (uint8_t)((h[1] & 0x83) | ((1 + og_rng_next(&rng) % 8) << 2));
            }
    } else {
        float *src = malloc(sizeof(float) * (size_t)(N * K));
        og_rng_fill(&rng, src, (size_t)(N * K), -1.0f, 1.0f);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) src[n * K + k] *= ldexpf(1.0f, (int)(n % 5) - 2);
        CHECK_OK(og_quantize_rows(dt, src, N, K, w));
        free(src);
    }
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, w, N, K, n, w_exact + n * K);
    return w;
}

static void check_gemv(og_dtype dt, int64_t K, int64_t N, bool random_bytes, bool with_bias) {
    static const int64_t Ts[] = {1, 3, 8};
    float *we = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *w = make_weights(dt, N, K, random_bytes, we);
    void *dw = up(w, og_kquant_row_bytes(dt, K) * (size_t)N);
    float *bias = malloc(sizeof(float) * (size_t)N);
    og_rng_fill(&rng, bias, (size_t)N, -1.0f, 1.0f);
    float *dbias = with_bias ? up(bias, sizeof(float) * (size_t)N) : NULL;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int64_t T = Ts[ti];
        float *x = malloc(sizeof(float) * (size_t)(T * K)), *ref = malloc(sizeof(float) * (size_t)(T * N));
        og_rng_fill(&rng, x, (size_t)(T * K), -1.0f, 1.0f);
        CHECK_OK(og_matmul_ref(x, w, with_bias ? bias : NULL, dt, T, K, N, ref));
        float *dx = up(x, sizeof(float) * (size_t)(T * K)), *dout = poisoned((size_t)(T * N));
        CHECK_OK(og_kquant_gemv_cuda(NULL, dx, dw, dbias, dt, T, K, N, dout));
        CK(cudaDeviceSynchronize());
        float *out = down(dout, (size_t)(T * N));
        double worst = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
                double mag = with_bias ? fabs((double)bias[n]) : 0;
                for (int64_t k = 0; k < K; k++) mag += fabs((double)x[t * K + k] * we[n * K + k]);
                double d = fabs((double)out[t * N + n] - ref[t * N + n]) / (2 * gamma_n(K + 16) * mag + 1e-30);
                if (isnan(out[t * N + n])) d = INFINITY;
                worst = d > worst ? d : worst;
            }
        CHECK_MSG(worst <= 1.0, "gemv %s K=%lld N=%lld T=%lld bytes=%d bias=%d: ratio %.3g", og_dtype_name(dt),
                  (long long)K, (long long)N, (long long)T, random_bytes, with_bias, worst);
        free(x), free(ref), free(out);
        CK(cudaFree(dx));
        CK(cudaFree(dout));
    }
    /* a panel of rows, dequantized */
    const int64_t row0 = N / 3, rows = N - row0;
    float *dp = poisoned((size_t)(rows * K));
    CHECK_OK(og_kquant_dequantize_cuda(NULL, dw, dt, N, K, row0, rows, dp));
    CK(cudaDeviceSynchronize());
    float *p = down(dp, (size_t)(rows * K));
    CHECK_MSG(memcmp(p, we + row0 * K, sizeof(float) * (size_t)(rows * K)) == 0, "dequantize %s K=%lld N=%lld",
              og_dtype_name(dt), (long long)K, (long long)N);
    free(p);
    CK(cudaFree(dp));
    /* embedding rows */
    const int32_t tokens[5] = {0, (int32_t)(N - 1), (int32_t)(N / 2), 0, (int32_t)(N / 3)};
    float *ref = malloc(sizeof(float) * (size_t)(5 * K));
    CHECK_OK(og_embed_ref(tokens, 5, w, dt, N, K, ref));
    int32_t *dtok = up(tokens, sizeof tokens);
    float *de = poisoned((size_t)(5 * K));
    CHECK_OK(og_kquant_embed_cuda(NULL, dtok, 5, dw, dt, N, K, de));
    CK(cudaDeviceSynchronize());
    float *e = down(de, (size_t)(5 * K));
    CHECK_MSG(memcmp(e, ref, sizeof(float) * (size_t)(5 * K)) == 0, "embed %s K=%lld", og_dtype_name(dt),
              (long long)K);
    free(e), free(ref);
    CK(cudaFree(dtok));
    CK(cudaFree(de));
    free(we), free(w), free(bias);
    CK(cudaFree(dw));
    if (dbias) CK(cudaFree(dbias));
}

/* dmin * min of the sub-block of element k of row n (q4_k, q5_k; else 0). */
static double min_at(og_dtype dt, const uint8_t *w, int64_t K, int64_t n, int64_t k) {
    if (dt != OG_DTYPE_Q4_K && dt != OG_DTYPE_Q5_K) return 0;
    const uint8_t *b = w + (size_t)n * og_kquant_row_bytes(dt, K) + (size_t)(k / QK) * og_kquant_block_bytes(dt);
    const int j = (int)(k % QK) / 32;
    const int m = j < 4 ? b[8 + j] & 63 : (b[8 + j] >> 4) | ((b[j] >> 6) << 4);
    return (double)og_f32_from_f16((og_f16)(b[2] | (b[3] << 8))) * m;
}

/* Rounding steps of the GPU's sums in the integer gemv's variant v (see
 * the header). */
/* Where chunk c of 16 of a block's 256 terms of x sits in the device's hi
   and lo arrays (kquant.cu places them so that the 8 lanes reading one block
   fall on 8 bank groups): the table of c0 | (c1 ^ c2) << 1 | c3 << 2 | c2 << 3. */
static int terms_chunk(int c) {
    static const int at[16] = {0, 1, 2, 3, 10, 11, 8, 9, 4, 5, 6, 7, 14, 15, 12, 13};
    return at[c];
}

static int64_t gpu_steps(int v, int64_t nb) { return v == 1 ? nb / 4 + 10 : (nb + 15) / 16 + 12; }

static void check_int8_ts(og_dtype dt, int64_t K, int64_t N, bool random_bytes, bool with_bias, const int64_t *Ts,
                          int nT) {
    const int64_t nb = K / QK;
    float *we = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *w = make_weights(dt, N, K, random_bytes, we);
    void *dw = up(w, og_kquant_row_bytes(dt, K) * (size_t)N);
    float *bias = malloc(sizeof(float) * (size_t)N);
    og_rng_fill(&rng, bias, (size_t)N, -1.0f, 1.0f);
    float *dbias = with_bias ? up(bias, sizeof(float) * (size_t)N) : NULL;
    double *mins = malloc(sizeof(double) * (size_t)(N * K / 32)); /* one a sub-block of 32 */
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k += 32) mins[(n * K + k) / 32] = min_at(dt, w, K, n, k);
    for (int ti = 0; ti < nT; ti++) {
        const int64_t T = Ts[ti];
        float *x = malloc(sizeof(float) * (size_t)(T * K)), *ref = malloc(sizeof(float) * (size_t)(T * N));
        og_rng_fill(&rng, x, (size_t)(T * K), -1.0f, 1.0f);
        for (int64_t i = 0; i < T * K; i++) x[i] *= ldexpf(1.0f, (int)((i / QK) % 7) - 3); /* blocks of varied scale */
        if (T >= 2) memset(x + K, 0, QK * sizeof(float));                                 /* a block of zeros */
        const bool nan_row = T == OG_KQUANT_GEMV_CUDA_MAX_T;
        if (nan_row) x[(T - 1) * K + 5] = NAN;
        og_kq_x *xh = malloc(sizeof(og_kq_x) * (size_t)(T * nb));
        og_kq_quantize_x(x, T, K, xh);
        og_kq_gemv_scalar(dt, xh, T, w, K, N, ref, N);
        float *dx = up(x, sizeof(float) * (size_t)(T * K)), *dout = poisoned((size_t)(T * N));
        const size_t xq_bytes = og_kquant_x_cuda_bytes(T, K);
        CHECK(xq_bytes == (size_t)(T * nb) * 592);
        void *dxq = NULL;
        CK(cudaMalloc(&dxq, xq_bytes));
        CK(cudaMemset(dxq, 0xA5, xq_bytes));
        CHECK_OK(og_kquant_quantize_x_cuda(NULL, dx, T, K, dxq));
        CK(cudaDeviceSynchronize());
        /* the terms: the layout of kquant.cu's xq_block (hi, lo, sum16, u),
           hi and lo by chunks of 16 placed as terms_chunk says */
        uint8_t *xq = malloc(xq_bytes);
        CK(cudaMemcpy(xq, dxq, xq_bytes, cudaMemcpyDeviceToHost));
        int bad_terms = 0;
        for (int64_t i = 0; i < T * nb; i++) {
            const uint8_t *g = xq + (size_t)i * 592;
            const float u = xh[i].d / 254.0f;
            int8_t hi[QK], lo[QK];
            for (int c = 0; c < QK / 16; c++) {
                memcpy(hi + 16 * c, g + 16 * terms_chunk(c), 16);
                memcpy(lo + 16 * c, g + QK + 16 * terms_chunk(c), 16);
            }
            bad_terms += memcmp(hi, xh[i].hi, QK) != 0 || memcmp(lo, xh[i].lo, QK) != 0 ||
                         memcmp(g + 2 * QK, xh[i].sum16, sizeof xh[i].sum16) != 0 ||
                         (isnan(u) ? !isnan(*(const float *)(g + 2 * QK + 64)) : memcmp(g + 2 * QK + 64, &u, 4) != 0);
        }
        CHECK_MSG(bad_terms == 0, "x terms %s K=%lld T=%lld: %d of %lld blocks differ from og_kq_quantize_x",
                  og_dtype_name(dt), (long long)K, (long long)T, bad_terms, (long long)(T * nb));
        /* S of the header for each (t, n), once for every variant */
        double *mag = malloc(sizeof(double) * (size_t)(T * N));
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
                double m = with_bias ? fabs((double)bias[n]) : 0;
                for (int64_t b = 0; b < nb; b++) {
                    const og_kq_x *xb = &xh[t * nb + b];
                    const double u = (double)(xb->d / 254.0f);
                    for (int e = 0; e < QK; e++) {
                        const int64_t k = b * QK + e;
                        m += u * fabs(254.0 * xb->hi[e] + xb->lo[e]) *
                             (fabs((double)we[n * K + k]) * (1 + 0x1p-20) + 2 * fabs(mins[(n * K + k) / 32]));
                    }
                }
                mag[t * N + n] = m;
            }
        /* variants 1, 2 and 3 given; 2 and 3 chosen by the switch; 3 must
           give variant 1's bits (the same lanes and order of sums) */
        float *first = NULL;
        for (int run = 0; run < 5; run++) {
            const int v = run == 0 ? 1 : run == 1 || run == 3 ? 2 : 3;
            CK(cudaMemset(dout, 0xFF, sizeof(float) * (size_t)(T * N))); /* NaN until written */
            if (run < 3) CHECK_OK(og_kquant_gemv_int8_variant_cuda(NULL, v, dxq, dw, dbias, dt, T, K, N, dout));
            else {
                setenv("OG_CUDA_KQUANT_GEMV", v == 2 ? "v2" : "stream", 1);
                CHECK(og_kquant_gemv_cuda_variant_for(T, dt, 1) == v && og_kquant_gemv_cuda_int8_wanted());
                CHECK_OK(og_kquant_gemv_int8_cuda(NULL, dxq, dw, dbias, dt, T, K, N, dout));
                setenv("OG_CUDA_KQUANT_GEMV", "dp4a", 1);
                CHECK(og_kquant_gemv_cuda_variant_for(T, dt, 3) == 1);
                unsetenv("OG_CUDA_KQUANT_GEMV");
                /* the default: by rows, dtype and parts */
                CHECK(og_kquant_gemv_cuda_variant_for(T, dt, 1) == (T == 1 && dt == OG_DTYPE_Q4_K ? 3 : T <= 2 ? 2 : 1));
                CHECK(og_kquant_gemv_cuda_variant_for(T, dt, 3) == (T <= 2 ? 3 : 1));
            }
            CK(cudaDeviceSynchronize());
            float *out = down(dout, (size_t)(T * N));
            if (v == 3)
                CHECK_MSG(memcmp(out, first, sizeof(float) * (size_t)(T * N)) == 0,
                          "int8 gemv v3%s %s K=%lld N=%lld T=%lld: not variant 1's bits", run == 4 ? " (switch)" : "",
                          og_dtype_name(dt), (long long)K, (long long)N, (long long)T);
            const double tol = gamma_n(gpu_steps(v, nb)) + gamma_n(nb + 5);
            double worst = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < N; n++) {
                    const float r = ref[t * N + n] + (with_bias ? bias[n] : 0.0f), o = out[t * N + n];
                    if (nan_row && t == T - 1) {
                        CHECK_MSG(isnan(o) && isnan(r), "int8 gemv v%d %s: a row of x with a NaN gave %g (CPU %g)", v,
                                  og_dtype_name(dt), o, r);
                        continue;
                    }
                    double d = fabs((double)o - r) / (tol * mag[t * N + n] + 1e-37);
                    if (isnan(o) || isnan(r)) d = INFINITY;
                    worst = d > worst ? d : worst;
                }
            CHECK_MSG(worst <= 1.0, "int8 gemv v%d%s %s K=%lld N=%lld T=%lld bytes=%d bias=%d: ratio %.3g", v,
                      run >= 3 ? " (switch)" : "", og_dtype_name(dt), (long long)K, (long long)N, (long long)T,
                      random_bytes, with_bias, worst);
            if (run == 0) first = out;
            else free(out);
        }
        /* several parts in one launch (the q, k, v of a layer): the first
           N, N / 2 + 1 and 1 rows of the weight, the bias on the first only;
           each part gives variant 1's bits for its rows: from xq, then from
           x (the terms written by each block where they fit, else into a
           fresh scratch first) */
        for (int from_x = 0; from_x < 2; from_x++) {
            const int64_t Np[3] = {N, N / 2 + 1, 1};
            float *douts[3];
            og_gemv_cuda_part parts[3];
            for (int i = 0; i < 3; i++) {
                douts[i] = poisoned((size_t)(T * Np[i]));
                parts[i] = (og_gemv_cuda_part){dw, i == 0 ? dbias : NULL, Np[i], douts[i]};
            }
            void *scratch = NULL;
            CK(cudaMalloc(&scratch, xq_bytes));
            CK(cudaMemset(scratch, 0xA5, xq_bytes));
            if (from_x) CHECK_OK(og_kquant_gemv_x_multi_cuda(NULL, dx, NULL, scratch, dt, T, K, parts, 3));
            else CHECK_OK(og_kquant_gemv_int8_multi_cuda(NULL, 3, dxq, dt, T, K, parts, 3));
            CK(cudaDeviceSynchronize());
            CK(cudaFree(scratch));
            for (int i = 0; i < 3; i++) {
                float *o = down(douts[i], (size_t)(T * Np[i]));
                int bad = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = 0; n < Np[i]; n++) {
                        const float want = first[t * N + n] - (i > 0 && with_bias ? bias[n] : 0.0f);
                        const float got = o[t * Np[i] + n];
                        /* with the bias left out the sum differs by its addition: compare to the reference then */
                        if (i == 0 || !with_bias) bad += memcmp(&got, &want, sizeof got) != 0 && !(isnan(got) && isnan(want));
                        else bad += !(fabs((double)got - want) <= 2 * U * (fabs((double)want) + fabs((double)bias[n])) ||
                                      (isnan(got) && isnan(want)));
                    }
                CHECK_MSG(bad == 0, "int8 gemv multi-part%s %s K=%lld N=%lld T=%lld part %d: %d outputs differ",
                          from_x ? " from x" : "", og_dtype_name(dt), (long long)K, (long long)N, (long long)T, i, bad);
                free(o);
                CK(cudaFree(douts[i]));
            }
        }
        free(first);
        free(x), free(ref), free(mag), free(xh), free(xq);
        CK(cudaFree(dx));
        CK(cudaFree(dout));
        CK(cudaFree(dxq));
    }
    free(we), free(w), free(bias), free(mins);
    CK(cudaFree(dw));
    if (dbias) CK(cudaFree(dbias));
}

static void check_int8(og_dtype dt, int64_t K, int64_t N, bool random_bytes, bool with_bias) {
    static const int64_t all_T[] = {1, 2, 3, 4, 5, 6, 7, 8};
    check_int8_ts(dt, K, N, random_bytes, with_bias, all_T, 8);
}

/* The add + rms_norm prologue of the streamed gemv against og_add_rms_norm_cuda
 * then the same products from its output: the products and the sums a + b
 * bit for bit (the normed x has add_rms_norm_kernel's bits, so its terms and
 * every unit's integers are the same). */
static void check_norm_prologue(og_dtype dt, int64_t K, int64_t T, int n_parts, bool bf16_weight) {
    const int64_t N = 67;
    float *we = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *w = make_weights(dt, N, K, false, we);
    uint8_t *dw = up(w, og_kquant_row_bytes(dt, K) * (size_t)N);
    float *a = malloc(sizeof(float) * (size_t)(T * K)), *b = malloc(sizeof(float) * (size_t)(T * K));
    float *g = malloc(sizeof(float) * (size_t)K);
    og_rng_fill(&rng, a, (size_t)(T * K), -2.0f, 2.0f);
    og_rng_fill(&rng, b, (size_t)(T * K), -1.0f, 1.0f);
    og_rng_fill(&rng, g, (size_t)K, 0.5f, 1.5f);
    uint16_t *g16 = malloc(sizeof(uint16_t) * (size_t)K);
    for (int64_t k = 0; k < K; k++) g16[k] = og_bf16_from_f32(g[k]);
    float *da = up(a, sizeof(float) * (size_t)(T * K)), *db = up(b, sizeof(float) * (size_t)(T * K));
    void *dg = bf16_weight ? up(g16, sizeof(uint16_t) * (size_t)K) : up(g, sizeof(float) * (size_t)K);
    const og_dtype gdt = bf16_weight ? OG_DTYPE_BF16 : OG_DTYPE_F32;
    float *dsum_ref = poisoned((size_t)(T * K)), *dx = poisoned((size_t)(T * K)), *dsum = poisoned((size_t)(T * K));
    void *dxq = NULL;
    CK(cudaMalloc(&dxq, og_kquant_x_cuda_bytes(T, K)));
    float *ref[OG_KQUANT_GEMV_CUDA_MAX_PARTS], *got[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    og_gemv_cuda_part pr[OG_KQUANT_GEMV_CUDA_MAX_PARTS], pg[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    for (int i = 0; i < n_parts; i++) {
        const int64_t Ni = N - 16 * i;
        ref[i] = poisoned((size_t)(T * Ni)), got[i] = poisoned((size_t)(T * Ni));
        pr[i] = (og_gemv_cuda_part){dw, NULL, Ni, ref[i]};
        pg[i] = (og_gemv_cuda_part){dw, NULL, Ni, got[i]};
    }
    const float eps = 1e-6f;
    CHECK_OK(og_add_rms_norm_cuda(NULL, da, db, dg, gdt, T, K, eps, dsum_ref, dx, NULL));
    CHECK_OK(og_kquant_gemv_x_multi_cuda(NULL, dx, NULL, dxq, dt, T, K, pr, n_parts));
    const og_gemv_cuda_norm nm = {da, db, dg, gdt, eps, dsum};
    CHECK(og_kquant_gemv_cuda_norm_takes(dt, T, K, n_parts));
    CHECK_OK(og_kquant_gemv_x_multi_cuda(NULL, NULL, &nm, dxq, dt, T, K, pg, n_parts));
    CK(cudaDeviceSynchronize());
    float *s_ref = down(dsum_ref, (size_t)(T * K)), *s_got = down(dsum, (size_t)(T * K));
    CHECK_MSG(memcmp(s_ref, s_got, sizeof(float) * (size_t)(T * K)) == 0, "norm prologue %s K=%lld T=%lld: sums differ",
              og_dtype_name(dt), (long long)K, (long long)T);
    for (int i = 0; i < n_parts; i++) {
        const int64_t Ni = N - 16 * i;
        float *r = down(ref[i], (size_t)(T * Ni)), *o = down(got[i], (size_t)(T * Ni));
        CHECK_MSG(memcmp(r, o, sizeof(float) * (size_t)(T * Ni)) == 0,
                  "norm prologue %s K=%lld T=%lld parts %d (%s weight) part %d: products differ from the norm then "
                  "the gemv",
                  og_dtype_name(dt), (long long)K, (long long)T, n_parts, bf16_weight ? "bf16" : "f32", i);
        free(r), free(o);
        CK(cudaFree(ref[i]));
        CK(cudaFree(got[i]));
    }
    /* refused where the kernel would not stage x (one q6_k part) and with x and norm both */
    CHECK(!og_kquant_gemv_cuda_norm_takes(OG_DTYPE_Q6_K, 1, K, 1));
    CHECK_STATUS(og_kquant_gemv_x_multi_cuda(NULL, dx, &nm, dxq, dt, T, K, pg, n_parts), OG_ERR_INVALID_ARGUMENT);
    free(s_ref), free(s_got), free(we), free(w), free(a), free(b), free(g), free(g16);
    void *dev[] = {dw, da, db, dg, dsum_ref, dx, dsum, dxq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CK(cudaFree(dev[i]));
}

/* The swiglu in the gate / up launch (og_kquant_gemv_x_swiglu_cuda): its
 * output equals the two products (og_kquant_gemv_x_multi_cuda) then
 * og_swiglu_cuda bit for bit, from x or from the norm prologue, with and
 * without biases. N odd: the last task's second feature of each part lies
 * past N. */
static void check_swiglu(og_dtype dt, int64_t K, int64_t T, bool with_bias, bool from_norm) {
    const int64_t N = 67;
    float *we = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t *wg = make_weights(dt, N, K, false, we), *wu = make_weights(dt, N, K, false, we);
    const size_t wbytes = og_kquant_row_bytes(dt, K) * (size_t)N;
    uint8_t *dwg = up(wg, wbytes), *dwu = up(wu, wbytes);
    float *bias = malloc(sizeof(float) * (size_t)(2 * N));
    og_rng_fill(&rng, bias, (size_t)(2 * N), -1.0f, 1.0f);
    float *dbias = up(bias, sizeof(float) * (size_t)(2 * N));
    float *a = malloc(sizeof(float) * (size_t)(T * K)), *b = malloc(sizeof(float) * (size_t)(T * K));
    float *g = malloc(sizeof(float) * (size_t)K);
    og_rng_fill(&rng, a, (size_t)(T * K), -2.0f, 2.0f);
    og_rng_fill(&rng, b, (size_t)(T * K), -1.0f, 1.0f);
    og_rng_fill(&rng, g, (size_t)K, 0.5f, 1.5f);
    float *da = up(a, sizeof(float) * (size_t)(T * K)), *db = up(b, sizeof(float) * (size_t)(T * K));
    float *dg = up(g, sizeof(float) * (size_t)K);
    float *dx = poisoned((size_t)(T * K)), *dsum = poisoned((size_t)(T * K)), *dsum2 = poisoned((size_t)(T * K));
    float *gate = poisoned((size_t)(T * N)), *upo = poisoned((size_t)(T * N));
    float *ref = poisoned((size_t)(T * N)), *got = poisoned((size_t)(T * N));
    void *dxq = NULL;
    CK(cudaMalloc(&dxq, og_kquant_x_cuda_bytes(T, K)));
    const float eps = 1e-6f;
    /* x: the norm's output, so that both ways read the same values */
    CHECK_OK(og_add_rms_norm_cuda(NULL, da, db, dg, OG_DTYPE_F32, T, K, eps, dsum, dx, NULL));
    const og_gemv_cuda_part parts[2] = {{dwg, with_bias ? dbias : NULL, N, gate},
                                        {dwu, with_bias ? dbias + N : NULL, N, upo}};
    CHECK_OK(og_kquant_gemv_x_multi_cuda(NULL, dx, NULL, dxq, dt, T, K, parts, 2));
    CHECK_OK(og_swiglu_cuda(NULL, gate, upo, T * N, ref, NULL));
    CHECK(og_kquant_gemv_cuda_swiglu_takes(dt, T, K));
    const og_gemv_cuda_part fused[2] = {{dwg, with_bias ? dbias : NULL, N, NULL},
                                        {dwu, with_bias ? dbias + N : NULL, N, NULL}};
    const og_gemv_cuda_norm nm = {da, db, dg, OG_DTYPE_F32, eps, dsum2};
    if (from_norm) CHECK_OK(og_kquant_gemv_x_swiglu_cuda(NULL, NULL, &nm, dxq, dt, T, K, fused, got));
    else CHECK_OK(og_kquant_gemv_x_swiglu_cuda(NULL, dx, NULL, dxq, dt, T, K, fused, got));
    CK(cudaDeviceSynchronize());
    float *r = down(ref, (size_t)(T * N)), *o = down(got, (size_t)(T * N));
    const char *rows = getenv("OG_CUDA_KQUANT_ROWS");
    CHECK_MSG(memcmp(r, o, sizeof(float) * (size_t)(T * N)) == 0,
              "swiglu in the gate / up launch %s K=%lld T=%lld%s%s, rows a task %s: differs from the products then "
              "og_swiglu_cuda",
              og_dtype_name(dt), (long long)K, (long long)T, with_bias ? ", biases" : "",
              from_norm ? ", from the norm" : "", rows ? rows : "by the rule");
    /* refused: gate and up of different widths */
    const og_gemv_cuda_part uneven[2] = {fused[0], {dwu, NULL, N - 1, NULL}};
    CHECK_STATUS(og_kquant_gemv_x_swiglu_cuda(NULL, dx, NULL, dxq, dt, T, K, uneven, got), OG_ERR_INVALID_ARGUMENT);
    free(r), free(o), free(we), free(wg), free(wu), free(bias), free(a), free(b), free(g);
    void *dev[] = {dwg, dwu, dbias, da, db, dg, dx, dsum, dsum2, gate, upo, ref, got, dxq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CK(cudaFree(dev[i]));
}

static void check_swiglus(void) {
    og_test_section("the swiglu in the gate / up launch: the products then og_swiglu_cuda, bit for bit");
    const og_dtype dts[] = {OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
    const char *const rows[] = {NULL, "2", "4"};
    for (int d = 0; d < 3; d++)
        for (int ri = 0; ri < 3; ri++) {
            if (rows[ri]) setenv("OG_CUDA_KQUANT_ROWS", rows[ri], 1);
            for (int64_t T = 1; T <= 2; T++) {
                check_swiglu(dts[d], 4096, T, false, false);
                check_swiglu(dts[d], 2048, T, true, false);
                check_swiglu(dts[d], 4096, T, ri == 0, true);
            }
            unsetenv("OG_CUDA_KQUANT_ROWS");
        }
    /* more rows than the default takes the stream at: x's terms staged
       (K 4096, 8 rows) or written first by their own launch (K 12288, 4 rows) */
    CHECK(!og_kquant_gemv_cuda_swiglu_takes(OG_DTYPE_Q4_K, 3, 4096) || getenv("OG_CUDA_KQUANT_GEMV"));
    setenv("OG_CUDA_KQUANT_GEMV", "stream", 1);
    for (int d = 0; d < 3; d++) {
        check_swiglu(dts[d], 4096, OG_KQUANT_GEMV_CUDA_MAX_T, true, false);
        check_swiglu(dts[d], 12288, 4, false, false);
    }
    unsetenv("OG_CUDA_KQUANT_GEMV");
}

static void check_refusals(void) {
    og_test_section("arguments refused before anything runs");
    float *dx = poisoned(1024), *dout = poisoned(1024);
    uint8_t *dw = NULL;
    CK(cudaMalloc((void **)&dw, 4096));
    CHECK_STATUS(og_kquant_gemv_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q4_K, 1, 128, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q4_K, 9, 256, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_cuda(NULL, dx, dw + 2, NULL, OG_DTYPE_Q6_K, 1, 256, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q8, 1, 256, 2, dout), OG_ERR_UNSUPPORTED);
    CHECK_STATUS(og_kquant_dequantize_cuda(NULL, dw, OG_DTYPE_Q4_K, 2, 256, 1, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_int8_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q3_K, 1, 256, 2, dout), OG_ERR_UNSUPPORTED);
    CHECK_STATUS(og_kquant_gemv_int8_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q4_K, 9, 256, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_int8_cuda(NULL, dx, dw, NULL, OG_DTYPE_Q4_K, 1, 200, 2, dout), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_int8_variant_cuda(NULL, 4, dx, dw, NULL, OG_DTYPE_Q4_K, 1, 256, 2, dout),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_int8_variant_cuda(NULL, 3, dx, dw, NULL, OG_DTYPE_Q3_K, 1, 256, 2, dout),
                 OG_ERR_UNSUPPORTED);
    og_gemv_cuda_part five[5] = {{dw, NULL, 2, dout}, {dw, NULL, 2, dout}, {dw, NULL, 2, dout}, {dw, NULL, 2, dout},
                                 {dw, NULL, 2, dout}};
    CHECK_STATUS(og_kquant_gemv_int8_multi_cuda(NULL, 3, dx, OG_DTYPE_Q4_K, 1, 256, five, 5), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_x_multi_cuda(NULL, NULL, NULL, dw, OG_DTYPE_Q4_K, 1, 256, five, 1), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_x_multi_cuda(NULL, dx, NULL, dw, OG_DTYPE_Q3_K, 1, 256, five, 1), OG_ERR_UNSUPPORTED);
    five[1].N = 0;
    CHECK_STATUS(og_kquant_gemv_int8_multi_cuda(NULL, 3, dx, OG_DTYPE_Q4_K, 1, 256, five, 2), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_gemv_int8_variant_cuda(NULL, 2, dx, dw, NULL, OG_DTYPE_Q3_K, 1, 256, 2, dout),
                 OG_ERR_UNSUPPORTED);
    CHECK_STATUS(og_kquant_gemv_int8_variant_cuda(NULL, 2, dx, dw, NULL, OG_DTYPE_Q6_K, 9, 256, 2, dout),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_quantize_x_cuda(NULL, dx, 9, 256, dw), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kquant_quantize_x_cuda(NULL, dx + 1, 1, 256, dw), OG_ERR_INVALID_ARGUMENT);
    CHECK(og_kquant_x_cuda_bytes(1, 300) == 0);
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaFree(dw));
}

/* ---- the back end ---- */

static float *logits(const char *path, og_backend b, const int32_t *tok, int n, int chunk) {
    og_model_params mp = og_model_default_params();
    mp.backend = b;
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, &mp, &m));
    const int64_t V = m ? og_model_vocab_size(m) : 0;
    float *out = malloc(sizeof(float) * (size_t)(n * (V ? V : 1)));
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = OG_DTYPE_F32;
    og_session *s = NULL;
    if (m) CHECK_OK(og_session_create(m, &sp, &s));
    if (s) CHECK_OK(og_session_eval(s, tok, n, chunk, out, 1));
    og_session_destroy(s);
    og_model_destroy(m);
    return out;
}

static void check_backend(const char *dir) {
    static const struct {
        const char *mix;
        og_dtype uniform;
    } k[] = {{"q4_k_m", OG_DTYPE_COUNT}, {"q5_k_m", OG_DTYPE_COUNT}, {"q2_k", OG_DTYPE_COUNT},
             {NULL, OG_DTYPE_Q3_K}};
    enum { N = 48, V = 256 };
    int32_t tok[N];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(og_test_splitmix(&s) % V);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char title[96], path[] = "/tmp/og_kq_cuda_XXXXXX";
        snprintf(title, sizeof title, "back end: %s program, CUDA (%s gemv) against CPU",
                 k[i].mix ? k[i].mix : og_dtype_name(k[i].uniform),
                 !og_kquant_gemv_cuda_int8_wanted() ? "f32 x"
                 : getenv("OG_CUDA_KQUANT_GEMV") ? getenv("OG_CUDA_KQUANT_GEMV")
                                                  : "integer, variant by rows, dtype and parts");
        og_test_section(title);
        int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        og_export_options o;
        og_export_default_options(&o);
        o.dtype = OG_DTYPE_F32;
        if (k[i].mix) CHECK_OK(og_weight_mix_parse(k[i].mix, &o.mix));
        else o.weights = k[i].uniform;
        CHECK_OK(og_export_hf(dir, path, &o, NULL));
        for (int chunk = 0; chunk <= 1; chunk++) {
            float *c = logits(path, OG_BACKEND_CPU, tok, N, chunk), *g = logits(path, OG_BACKEND_CUDA, tok, N, chunk);
            double worst = 0, scale = 0;
            for (int j = 0; j < N * V; j++) {
                const double d = fabs((double)c[j] - g[j]);
                worst = d > worst || isnan(d) ? d : worst;
                scale = fmax(scale, fabs((double)c[j]));
            }
            CHECK_MSG(worst <= 5e-4 * scale, "%s, %s: max |logit diff| %g, %g of the scale %g", title,
                      chunk ? "a token at a time" : "prefill", worst, worst / scale, scale);
            fprintf(stderr, "%s, %s: max |logit diff| %.3g (%.3g of the scale)\n", title,
                    chunk ? "a token at a time" : "prefill", worst, worst / scale);
            free(c), free(g);
        }
        unlink(path);
    }
}

/* Rows [N / 3, N) of a random [N, K] weight of dt as bf16 hi + lo. */
static void check_split(og_dtype dt, int64_t N, int64_t K) {
    float *src = malloc(sizeof(float) * (size_t)(N * K)), *w = malloc(sizeof(float) * (size_t)(N * K));
    const size_t bytes = og_weight_row_bytes(dt, K) * (size_t)N;
    void *q = malloc(bytes);
    og_rng_fill(&rng, src, (size_t)(N * K), -3.0f, 3.0f);
    CHECK_OK(og_dtype_is_kquant(dt) ? og_kquant_quantize_rows(dt, src, N, K, q) : og_quantize_rows(dt, src, N, K, q));
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, q, N, K, n, w + n * K);
    const int64_t row0 = N / 3, rows = N - row0, n = rows * K;
    void *dq = up(q, bytes);
    uint16_t *dh = NULL, *dl = NULL, *h = malloc(2 * (size_t)n), *l = malloc(2 * (size_t)n);
    CK(cudaMalloc((void **)&dh, 2 * (size_t)n));
    CK(cudaMalloc((void **)&dl, 2 * (size_t)n + 16));
    CK(cudaMemset(dh, 0xff, 2 * (size_t)n));
    CK(cudaMemset(dl, 0xff, 2 * (size_t)n));
    CHECK_OK(og_dequantize_split_cuda(NULL, dq, dt, N, K, row0, rows, dh, dl));
    CK(cudaMemcpy(h, dh, 2 * (size_t)n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l, dl, 2 * (size_t)n, cudaMemcpyDeviceToHost));
    int64_t i = 0;
    for (; i < n; i++) {
        const float v = w[row0 * K + i];
        const og_bf16 want_hi = og_bf16_from_f32(v), want_lo = og_bf16_from_f32(v - og_f32_from_bf16(want_hi));
        if (h[i] != want_hi || l[i] != want_lo) break;
    }
    CHECK_MSG(i == n, "dequantize_split %s K=%lld N=%lld: element %lld is 0x%04x + 0x%04x", og_dtype_name(dt),
              (long long)K, (long long)N, (long long)(i < n ? i : 0), i < n ? h[i] : 0, i < n ? l[i] : 0);
    CHECK_STATUS(og_dequantize_split_cuda(NULL, dq, dt, N, K, row0, rows, dh, (uint16_t *)((char *)dl + 2)),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_dequantize_split_cuda(NULL, dq, OG_DTYPE_BF16, N, K, row0, rows, dh, dl), OG_ERR_INVALID_ARGUMENT);
    free(src), free(w), free(q), free(h), free(l);
    CK(cudaFree(dq));
    CK(cudaFree(dh));
    CK(cudaFree(dl));
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    rng = og_rng_seed(35035);
    const int64_t Ks[] = {256, 768, 2048}, Ns[] = {1, 17, 67, 259};
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        og_test_section(og_dtype_name(k_types[t]));
        for (size_t a = 0; a < sizeof Ks / sizeof Ks[0]; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
                check_gemv(k_types[t], Ks[a], Ns[b], (a + b) % 2 == 0, b % 2 == 1);
    }
    static const og_dtype int8_types[] = {OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
    const int64_t Ks8[] = {256, 768, 2048, 4096};
    for (size_t t = 0; t < sizeof int8_types / sizeof int8_types[0]; t++) {
        char title[64];
        snprintf(title, sizeof title, "%s: integer gemv against og_kq_gemv_scalar", og_dtype_name(int8_types[t]));
        og_test_section(title);
        for (size_t a = 0; a < sizeof Ks8 / sizeof Ks8[0]; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
                check_int8(int8_types[t], Ks8[a], Ns[b], (a + b) % 2 == 0, b % 2 == 1);
        if (!getenv("OG_CUDA_TEST_QUICK")) {
            /* v2's blocks of several rows (N past 132 x 8 blocks of them) and their tail; the 8B shapes */
            static const int64_t some_T[] = {1, 2, 5, 8};
            check_int8(int8_types[t], 4096, 4227, t % 2 == 0, true);
            check_int8(int8_types[t], 2048, 2001, t % 2 == 1, true); /* 2 rows a block on 132 SMs */
            check_int8_ts(int8_types[t], 4096, 6144, false, false, some_T, 4);
            check_int8_ts(int8_types[t], 12288, 4096, true, false, some_T, 4);
        }
    }
    check_refusals();
    og_test_section("the add + rms_norm prologue of the streamed gemv");
    for (int bf = 0; bf < 2; bf++) {
        check_norm_prologue(OG_DTYPE_Q4_K, 4096, 1, 1, bf);
        check_norm_prologue(OG_DTYPE_Q4_K, 4096, 2, 3, bf);
        check_norm_prologue(OG_DTYPE_Q6_K, 2048, 1, 2, bf);
        check_norm_prologue(OG_DTYPE_Q5_K, 12288, 2, 2, bf);
    }
    check_swiglus();
    og_test_section("dequantized panels as bf16 hi + lo, every quantized dtype");
    static const og_dtype split_types[] = {OG_DTYPE_Q8,   OG_DTYPE_Q4,   OG_DTYPE_Q2_K, OG_DTYPE_Q3_K,
                                           OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
    for (size_t t = 0; t < sizeof split_types / sizeof split_types[0]; t++) {
        check_split(split_types[t], 67, 768);
        check_split(split_types[t], 5, 2048);
    }
    char dir[] = "/tmp/og_kq_cuda_ckpt_XXXXXX";
    if (mkdtemp(dir)) {
        CHECK(og_test_write_kq_checkpoint(dir));
        setenv("OG_CUDA_KQUANT_GEMV", "f32x", 1); /* the f32-x gemv */
        CHECK(!og_kquant_gemv_cuda_int8_wanted());
        check_backend(dir);
        unsetenv("OG_CUDA_KQUANT_GEMV"); /* the default: the integer gemv where it takes the dtype */
        CHECK(og_kquant_gemv_cuda_int8_wanted());
        check_backend(dir);
        setenv("OG_CUDA_KQUANT_GEMV", "v2", 1); /* the integer gemv's second cut */
        CHECK(og_kquant_gemv_cuda_int8_wanted() && og_kquant_gemv_cuda_variant_for(1, OG_DTYPE_Q4_K, 3) == 2 &&
              og_kquant_gemv_cuda_variant_for(8, OG_DTYPE_Q6_K, 1) == 2);
        check_backend(dir);
        setenv("OG_CUDA_KQUANT_GEMV", "stream", 1); /* the streamed one at every T */
        CHECK(og_kquant_gemv_cuda_variant_for(1, OG_DTYPE_Q6_K, 1) == 3 && og_kquant_gemv_cuda_variant_for(8, OG_DTYPE_Q4_K, 3) == 3);
        check_backend(dir);
        setenv("OG_CUDA_KQUANT_GEMV", "dp4a", 1); /* the first cut at every T */
        CHECK(og_kquant_gemv_cuda_variant_for(1, OG_DTYPE_Q4_K, 3) == 1);
        check_backend(dir);
        unsetenv("OG_CUDA_KQUANT_GEMV");
        char p[600];
        snprintf(p, sizeof p, "%s/config.json", dir), unlink(p);
        snprintf(p, sizeof p, "%s/model.safetensors", dir), unlink(p);
        rmdir(dir);
    }
    return og_test_finish();
}
#endif
