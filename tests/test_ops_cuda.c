/* The CUDA kernels of ops_cuda.h (all but attention) against the plain C
 * references of kernels/ops.h, on odd sizes with fresh random inputs and
 * outputs poisoned before each run.
 *
 * Tolerances: element-wise ops (embed, add) are exact; swiglu, rope and the
 * norms use the same f32 formulas with the device's own expf/cosf/sinf and a
 * different summation order: 1e-6 + 1e-5 relative. Matrix products sum K
 * products in another order: atol 1e-5 * sqrt(K) + rtol 1e-5 (inputs in
 * [-1, 1]). The tensor-core decode products (bf16, q8, q4 weights, K a
 * multiple of 32) carry x as bf16 hi + lo, within 2^-16 |x| of x: a product
 * then moves by up to 2^-16 sum |w x|, whose random-signed sum over K terms
 * of |w x| <= 1 (mean 1/4) stands near 3e-6 sqrt(K), inside the same atol.
 * A swiglu of products is held to the products' tolerance carried through
 * silu(g) * u (compare_swiglu): the output scales an error of g by |u|.
 *
 * Fused kernels (add + rms_norm, head rms_norm + rope, gate/up products with
 * the swiglu epilogue, several products of one x in one launch) against the
 * unfused CUDA kernels run in turn, bit for bit (they share formulas and
 * summation order), and against the composition of the C references with
 * the tolerances above.
 *
 * Quantized weights (q8, q4, made by og_quantize_rows from inputs in
 * [-1, 1]) against og_matmul_ref / og_embed_ref on the same tensors: embed
 * and og_dequantize_cuda are exact (scale * q is exact in f32); products
 * have the tolerance of the float ones (the weights are the exact values
 * scale * q, |w| <= 1, and only the summation order differs: each lane's
 * 4 products summed then scaled, lanes added by a tree; gemv_q.cu's x as
 * int8 terms: prod_atol below), for the gemv, the
 * back end's two paths for wider steps (the gemv on chunks of rows;
 * dequantized panels and SGEMM), and the fused variants against the
 * unfused kernels bit for bit. Odd sizes: N = 1, 17, 67, 259; K of one
 * group to five rounds of the slabs a lane loads ahead; T = 1, 3, 8, 40,
 * 200. The split-K bf16 products (og_gemv_cuda_set_split) at the 0.6B, 8B
 * and 32B-like shapes: test_split. The narrow-batch products: test_narrow.
 * Skipped (77) without a CUDA build or
 * device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"

#include "cuda_check.h"
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

static og_rng rng;

static void *up(const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* A device output of n floats, poisoned. */
static float *poisoned(size_t n) {
    float *h = malloc(n * 4);
    og_poison(h, n);
    float *d = up(h, n * 4);
    free(h);
    return d;
}
static float *down(const float *d, size_t n) {
    float *h = malloc(n * 4);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
/* The bf16 copy a kernel wrote beside its f32 output (d16) is the
 * round-to-nearest-even rounding of that output, bit for bit. */
static void check_bf16_copy(const char *what, const float *dout, const uint16_t *d16, size_t n) {
    float *o = down(dout, n);
    uint16_t *h = malloc(n * 2);
    CK(cudaMemcpy(h, d16, n * 2, cudaMemcpyDeviceToHost));
    size_t i = 0;
    while (i < n && h[i] == og_bf16_from_f32(o[i])) i++;
    CHECK_MSG(i == n, "%s: bf16 copy differs at %zu (0x%04x for %g)", what, i, i < n ? h[i] : 0,
              (double)o[i < n ? i : 0]);
    free(o), free(h);
}
static float *rand_f32(size_t n) {
    float *x = malloc(n * 4);
    og_rng_fill(&rng, x, n, -1, 1);
    return x;
}
/* n weights of dtype (bf16 stored rounded). */
static void *rand_w(size_t n, og_dtype dt) {
    void *w = malloc(n * og_dtype_size(dt));
    for (size_t i = 0; i < n; i++) og_store_f32(w, dt, i, og_rng_uniform(&rng, -1, 1));
    return w;
}

static void compare(const char *what, const float *got, const float *want, size_t n, double atol, double rtol) {
    size_t worst = 0;
    double r = og_tol_ratio(got, want, n, atol, rtol, &worst);
    CHECK_MSG(r <= 1.0, "%s: ratio %.3g at %zu (got %g, want %g)", what, r, worst, (double)got[worst],
              (double)want[worst]);
}

/* The products' absolute tolerance over sqrt(K): 1e-5, and 4e-5 for the
 * q8 / q4 products while gemv_q.cu is on. That kernel multiplies x as two
 * int8 terms a group of 32 (x within u / 2 = m / 64516 of its value, m the
 * group's largest |x|): each product moves by a random-signed sum of K
 * errors of standard deviation |w| u / sqrt(12) = |w| m / 111,700 or less,
 * at most 5.2e-6 sqrt(K) for these weights (rms |w| up to 0.58: rows of
 * [-1, 1] quantized) and x in [-1, 1], so 4e-5 sqrt(K) is over seven
 * deviations (2e-5, under four, failed 5 of 3,563 cases). */
static double prod_atol = 1e-5;

/* silu(g) * u against its reference, where g and u are products computed
 * to within e = prod_atol sqrt(K) + 1e-5 |.| (the products' tolerance): silu'
 * lies in [-0.1, 1.1] and |silu(g)| <= |g|, so the output may move by
 * 1.1 |u| e(g) + |g| e(u) (plus the second order), and swiglu's own f32
 * formula by 1e-5 relative. */
static void compare_swiglu(const char *what, const float *got, const float *g, const float *u, const float *ref,
                           size_t n, int64_t K) {
    const double a = prod_atol * sqrt((double)K);
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double eg = a + 1e-5 * fabs(g[i]), eu = a + 1e-5 * fabs(u[i]);
        const double tol = 1.1 * fabs(u[i]) * eg + fabs(g[i]) * eu + eg * eu + 1e-6 + 1e-5 * fabs(ref[i]);
        const double r = fabs((double)got[i] - (double)ref[i]) / tol;
        if (!(r <= worst)) worst = r, at = i; /* a NaN is the worst */
    }
    CHECK_MSG(worst <= 1.0, "%s: ratio %.3g at %zu (got %g, want %g)", what, worst, at, (double)got[at],
              (double)ref[at]);
}

/* The first product of the process stages exactly 48 KB of x (T = 1, K =
 * 12288, an 8B model's down product) beside the kernel's own shared memory:
 * a launch that did not ask for more than 48 KB first would fail. */
static void test_matmul_first_staged(void) {
    og_test_section("gemv: first launch staging 48 KB of x");
    const int64_t T = 1, K = 12288, N = 17;
    float *x = rand_f32((size_t)(T * K)), *ref = malloc((size_t)(T * N) * 4);
    void *w = rand_w((size_t)(N * K), OG_DTYPE_BF16);
    CHECK_OK(og_matmul_ref(x, w, NULL, OG_DTYPE_BF16, T, K, N, ref));
    float *dx = up(x, (size_t)(T * K) * 4), *dout = poisoned((size_t)(T * N));
    void *dw = up(w, (size_t)(N * K) * 2);
    CHECK_OK(og_gemv_cuda(NULL, dx, dw, NULL, OG_DTYPE_BF16, T, K, N, dout));
    float *got = down(dout, (size_t)(T * N));
    compare("gemv bf16 T=1 K=12288", got, ref, (size_t)(T * N), 1e-5 * sqrt((double)K), 1e-5);
    free(x), free(ref), free(w), free(got);
    cudaFree(dx), cudaFree(dout), cudaFree(dw);
}

static void test_matmul(void) {
    og_test_section("gemv and cuBLAS-shaped products");
    const int64_t Ts[] = {1, 3, 8};
    /* K of every chunk count the CUDA-core gemv loads ahead (4, 8, 16), of two rounds, and not a multiple
     * of 8; multiples of 32 take the tensor-core gemv, with x staged in shared memory, or read from memory
     * where 8 rows of it do not fit there (4128) */
    const int64_t Ks[] = {1, 7, 64, 1000, 1024, 2048, 3072, 4128, 5000};
    const int64_t Ns[] = {1, 17, 129};
    for (int dti = 0; dti < 2; dti++)
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++)
                for (size_t c = 0; c < 3; c++) {
                    og_dtype dt = dti ? OG_DTYPE_F32 : OG_DTYPE_BF16;
                    int64_t T = Ts[a], K = Ks[b], N = Ns[c];
                    bool bias = (a + b + c) % 2;
                    float *x = rand_f32((size_t)(T * K)), *ref = malloc((size_t)(T * N) * 4);
                    void *w = rand_w((size_t)(N * K), dt), *bv = rand_w((size_t)N, dt);
                    CHECK_OK(og_matmul_ref(x, w, bias ? bv : NULL, dt, T, K, N, ref));
                    float *dx = up(x, (size_t)(T * K) * 4), *dout = poisoned((size_t)(T * N));
                    void *dw = up(w, (size_t)(N * K) * og_dtype_size(dt)), *db = up(bv, (size_t)N * og_dtype_size(dt));
                    CHECK_OK(og_gemv_cuda(NULL, dx, dw, bias ? db : NULL, dt, T, K, N, dout));
                    float *got = down(dout, (size_t)(T * N));
                    char what[96];
                    snprintf(what, sizeof what, "gemv %s T=%lld K=%lld N=%lld", og_dtype_name(dt), (long long)T,
                             (long long)K, (long long)N);
                    compare(what, got, ref, (size_t)(T * N), 1e-5 * sqrt((double)K), 1e-5);
                    free(x), free(ref), free(w), free(bv), free(got);
                    cudaFree(dx), cudaFree(dout), cudaFree(dw), cudaFree(db);
                }
    /* the bf16 hi + lo split carries x to ~2^-16 (each bf16 rounding is within 2^-8) */
    const int64_t n = 4099;
    float *x = rand_f32((size_t)n);
    float *dx = up(x, (size_t)n * 4);
    uint16_t *dhi = NULL, *dlo = NULL;
    CK(cudaMalloc((void **)&dhi, (size_t)n * 2));
    CK(cudaMalloc((void **)&dlo, (size_t)n * 2));
    CHECK_OK(og_split_bf16_cuda(NULL, dx, n, dhi, dlo));
    uint16_t *hi = malloc((size_t)n * 2), *lo = malloc((size_t)n * 2);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hi, dhi, (size_t)n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lo, dlo, (size_t)n * 2, cudaMemcpyDeviceToHost));
    float *sum = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        CHECK_MSG(hi[i] == og_bf16_from_f32(x[i]), "split hi %lld", (long long)i);
        sum[i] = og_f32_from_bf16(hi[i]) + og_f32_from_bf16(lo[i]);
    }
    compare("split bf16 hi + lo", sum, x, (size_t)n, 0, 1.0 / 65536.0);
    free(x), free(hi), free(lo), free(sum);
    cudaFree(dx), cudaFree(dhi), cudaFree(dlo);
}

static void test_rows(void) {
    og_test_section("embed, norms, rope, swiglu, add");
    const int64_t Ts[] = {1, 3, 17, 129};
    for (size_t ti = 0; ti < 4; ti++) {
        const int64_t T = Ts[ti], H = 257, V = 301, n = 3, D = 64;
        og_dtype dt = ti % 2 ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        /* embed */
        int32_t *tok = malloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)(og_rng_next(&rng) % (uint64_t)V);
        tok[0] = (int32_t)V - 1;
        void *table = rand_w((size_t)(V * H), dt);
        float *ref = malloc((size_t)(T * H) * 4);
        CHECK_OK(og_embed_ref(tok, T, table, dt, V, H, ref));
        int32_t *dtok = up(tok, (size_t)T * 4);
        void *dtable = up(table, (size_t)(V * H) * og_dtype_size(dt));
        float *dout = poisoned((size_t)(T * H));
        CHECK_OK(og_embed_cuda(NULL, dtok, T, dtable, dt, V, H, dout));
        float *got = down(dout, (size_t)(T * H));
        compare("embed", got, ref, (size_t)(T * H), 0, 0);
        free(got), free(ref), free(table), free(tok);
        cudaFree(dtok), cudaFree(dtable), cudaFree(dout);

        /* rms_norm, in place on the device */
        float *x = rand_f32((size_t)(T * H));
        void *w = rand_w((size_t)H, dt);
        ref = malloc((size_t)(T * H) * 4);
        CHECK_OK(og_rms_norm_ref(x, w, dt, T, H, 1e-6f, ref));
        float *dx = up(x, (size_t)(T * H) * 4);
        void *dw = up(w, (size_t)H * og_dtype_size(dt));
        CHECK_OK(og_rms_norm_cuda(NULL, dx, dw, dt, T, H, 1e-6f, dx));
        got = down(dx, (size_t)(T * H));
        compare("rms_norm", got, ref, (size_t)(T * H), 1e-6, 1e-5);
        free(x), free(w), free(ref), free(got);
        cudaFree(dx), cudaFree(dw);

        /* head_rms_norm */
        x = rand_f32((size_t)(T * n * D));
        w = rand_w((size_t)D, dt);
        ref = malloc((size_t)(T * n * D) * 4);
        CHECK_OK(og_head_rms_norm_ref(x, w, dt, T, n, D, 1e-6f, ref));
        dx = up(x, (size_t)(T * n * D) * 4);
        dw = up(w, (size_t)D * og_dtype_size(dt));
        dout = poisoned((size_t)(T * n * D));
        CHECK_OK(og_head_rms_norm_cuda(NULL, dx, dw, dt, T, n, D, 1e-6f, dout));
        got = down(dout, (size_t)(T * n * D));
        compare("head_rms_norm", got, ref, (size_t)(T * n * D), 1e-6, 1e-5);
        free(w), free(ref), free(got);
        cudaFree(dw), cudaFree(dout);

        /* rope at positions far from 0 (angles up to ~5000 rad) */
        og_rope_table table_r;
        og_rope_params rp = {.type = OG_ROPE_DEFAULT, .theta = 10000.0f, .factor = 1.0f};
        CHECK_OK(og_rope_table_init(&table_r, (int32_t)D, &rp));
        int32_t *pos = malloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(4000 + 37 * t);
        ref = malloc((size_t)(T * n * D) * 4);
        CHECK_OK(og_rope_ref(&table_r, x, pos, T, n, ref));
        float *dinv = up(table_r.inv_freq, (size_t)(D / 2) * 4);
        int32_t *dpos = up(pos, (size_t)T * 4);
        dout = poisoned((size_t)(T * n * D));
        CHECK_OK(og_rope_cuda(NULL, dinv, D, dx, dpos, T, n, dout));
        got = down(dout, (size_t)(T * n * D));
        compare("rope", got, ref, (size_t)(T * n * D), 1e-6, 1e-5);
        free(x), free(pos), free(ref), free(got);
        cudaFree(dx), cudaFree(dinv), cudaFree(dpos), cudaFree(dout);

        /* swiglu, add */
        const int64_t F = T * 385;
        float *g = rand_f32((size_t)F), *u = rand_f32((size_t)F);
        ref = malloc((size_t)F * 4);
        float *dg = up(g, (size_t)F * 4), *du = up(u, (size_t)F * 4);
        CHECK_OK(og_swiglu_ref(g, u, 1, F, ref));
        dout = poisoned((size_t)F);
        uint16_t *d16 = (uint16_t *)poisoned((size_t)(F + 1) / 2);
        CHECK_OK(og_swiglu_cuda(NULL, dg, du, F, dout, d16));
        got = down(dout, (size_t)F);
        compare("swiglu", got, ref, (size_t)F, 1e-6, 1e-5);
        check_bf16_copy("swiglu", dout, d16, (size_t)F);
        free(got);
        cudaFree(d16);
        CHECK_OK(og_add_ref(g, u, F, ref));
        CHECK_OK(og_add_cuda(NULL, dg, du, F, dg)); /* in place */
        got = down(dg, (size_t)F);
        compare("add", got, ref, (size_t)F, 0, 0);
        free(g), free(u), free(ref), free(got);
        cudaFree(dg), cudaFree(du), cudaFree(dout);
    }
}

/* The bytes of two device results agree exactly. */
static void same_bits(const char *what, const float *da, const float *db, size_t n) {
    float *a = down(da, n), *b = down(db, n);
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], 4) == 0) i++;
    CHECK_MSG(i == n, "%s: fused and unfused differ at %zu (%g vs %g)", what, i, (double)a[i < n ? i : 0],
              (double)b[i < n ? i : 0]);
    free(a), free(b);
}

static void test_fused(void) {
    og_test_section("fused kernels vs the unfused composition");
    const int64_t Ts[] = {1, 3, 8, 17};
    for (size_t ti = 0; ti < 4; ti++) {
        const int64_t T = Ts[ti], N = 1031, n = 5, D = ti % 2 ? 128 : 64;
        const og_dtype dt = ti % 2 ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        const size_t es = og_dtype_size(dt);
        char what[96];

        /* residual add + rms_norm */
        float *a = rand_f32((size_t)(T * N)), *b = rand_f32((size_t)(T * N));
        void *w = rand_w((size_t)N, dt);
        float *sum_ref = malloc((size_t)(T * N) * 4), *ref = malloc((size_t)(T * N) * 4);
        CHECK_OK(og_add_ref(a, b, T * N, sum_ref));
        CHECK_OK(og_rms_norm_ref(sum_ref, w, dt, T, N, 1e-6f, ref));
        float *da = up(a, (size_t)(T * N) * 4), *db = up(b, (size_t)(T * N) * 4);
        void *dw = up(w, (size_t)N * es);
        float *dsum = poisoned((size_t)(T * N)), *dout = poisoned((size_t)(T * N));
        float *usum = poisoned((size_t)(T * N)), *uout = poisoned((size_t)(T * N));
        uint16_t *d16 = (uint16_t *)poisoned((size_t)(T * N + 1) / 2);
        CHECK_OK(og_add_rms_norm_cuda(NULL, da, db, dw, dt, T, N, 1e-6f, dsum, dout, d16));
        CHECK_OK(og_add_cuda(NULL, da, db, T * N, usum));
        CHECK_OK(og_rms_norm_cuda(NULL, usum, dw, dt, T, N, 1e-6f, uout));
        snprintf(what, sizeof what, "add_rms_norm T=%lld %s", (long long)T, og_dtype_name(dt));
        same_bits(what, dsum, usum, (size_t)(T * N));
        same_bits(what, dout, uout, (size_t)(T * N));
        check_bf16_copy(what, dout, d16, (size_t)(T * N));
        cudaFree(d16);
        float *got = down(dout, (size_t)(T * N));
        compare(what, got, ref, (size_t)(T * N), 1e-6, 1e-5);
        free(a), free(b), free(w), free(sum_ref), free(ref), free(got);
        cudaFree(da), cudaFree(db), cudaFree(dw), cudaFree(dsum), cudaFree(dout), cudaFree(usum), cudaFree(uout);

        /* head rms_norm + rope */
        const size_t hn = (size_t)(T * n * D);
        float *x = rand_f32(hn), *normed = malloc(hn * 4);
        w = rand_w((size_t)D, dt);
        og_rope_table table;
        og_rope_params rp = {.type = OG_ROPE_DEFAULT, .theta = 1000000.0f, .factor = 1.0f};
        CHECK_OK(og_rope_table_init(&table, (int32_t)D, &rp));
        int32_t *pos = malloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(977 + 13 * t);
        ref = malloc(hn * 4);
        CHECK_OK(og_head_rms_norm_ref(x, w, dt, T, n, D, 1e-6f, normed));
        CHECK_OK(og_rope_ref(&table, normed, pos, T, n, ref));
        float *dx = up(x, hn * 4), *dinv = up(table.inv_freq, (size_t)(D / 2) * 4);
        int32_t *dpos = up(pos, (size_t)T * 4);
        dw = up(w, (size_t)D * es);
        dout = poisoned(hn);
        uout = poisoned(hn);
        float *unorm = poisoned(hn);
        CHECK_OK(og_head_norm_rope_cuda(NULL, dx, dw, dt, dinv, dpos, T, n, D, 1e-6f, dout));
        CHECK_OK(og_head_rms_norm_cuda(NULL, dx, dw, dt, T, n, D, 1e-6f, unorm));
        CHECK_OK(og_rope_cuda(NULL, dinv, D, unorm, dpos, T, n, uout));
        snprintf(what, sizeof what, "head_norm_rope T=%lld D=%lld %s", (long long)T, (long long)D, og_dtype_name(dt));
        same_bits(what, dout, uout, hn);
        {   /* two jobs in one launch: the second over the last n-1 heads' rows as other heads */
            float *j0 = poisoned(hn), *j1 = poisoned(hn), *s1 = poisoned(hn);
            const int64_t n1 = n > 1 ? n - 1 : 1;
            const og_head_norm_rope_cuda_job jobs[2] = {{dx, dw, dt, dinv, n, D, 1e-6f, j0},
                                                        {dx + D * (n - n1), dw, dt, dinv, n1, D, 1e-5f, j1}};
            CHECK_OK(og_head_norm_rope_multi_cuda(NULL, jobs, 2, dpos, T));
            CHECK_OK(og_head_norm_rope_cuda(NULL, dx + D * (n - n1), dw, dt, dinv, dpos, T, n1, D, 1e-5f, s1));
            same_bits(what, j0, dout, hn);
            same_bits(what, j1, s1, (size_t)(T * n1 * D));
            cudaFree(j0), cudaFree(j1), cudaFree(s1);
        }
        got = down(dout, hn);
        compare(what, got, ref, hn, 1e-6, 1e-5);
        free(x), free(normed), free(w), free(pos), free(ref), free(got);
        cudaFree(dx), cudaFree(dinv), cudaFree(dpos), cudaFree(dw), cudaFree(dout), cudaFree(uout), cudaFree(unorm);

        /* gate/up products with the swiglu epilogue, and three products in one launch */
        if (T > OG_GEMV_CUDA_MAX_T) continue;
        /* 1024 and 672 take the norm prologue (og_gemv_cuda_norm_fits), 1000 the CUDA-core kernel (not a
         * multiple of 32) */
        const int64_t K = ti == 2 ? 1000 : ti == 1 ? 672 : 1024, F = 389;
        const bool bias = ti % 2;
        x = rand_f32((size_t)(T * K));
        void *wg = rand_w((size_t)(F * K), dt), *wu = rand_w((size_t)(F * K), dt);
        void *bg = rand_w((size_t)F, dt), *bu = rand_w((size_t)F, dt);
        float *g = malloc((size_t)(T * F) * 4), *u = malloc((size_t)(T * F) * 4);
        ref = malloc((size_t)(T * F) * 4);
        CHECK_OK(og_matmul_ref(x, wg, bias ? bg : NULL, dt, T, K, F, g));
        CHECK_OK(og_matmul_ref(x, wu, bias ? bu : NULL, dt, T, K, F, u));
        CHECK_OK(og_swiglu_ref(g, u, T, F, ref));
        dx = up(x, (size_t)(T * K) * 4);
        void *dwg = up(wg, (size_t)(F * K) * es), *dwu = up(wu, (size_t)(F * K) * es);
        void *dbg = up(bg, (size_t)F * es), *dbu = up(bu, (size_t)F * es);
        float *dg = poisoned((size_t)(T * F)), *du = poisoned((size_t)(T * F));
        dout = poisoned((size_t)(T * F));
        uout = poisoned((size_t)(T * F));
        CHECK_OK(og_gemv_swiglu_cuda(NULL, dx, dwg, bias ? dbg : NULL, dwu, bias ? dbu : NULL, dt, T, K, F, dout));
        CHECK_OK(og_gemv_cuda(NULL, dx, dwg, bias ? dbg : NULL, dt, T, K, F, dg));
        CHECK_OK(og_gemv_cuda(NULL, dx, dwu, bias ? dbu : NULL, dt, T, K, F, du));
        CHECK_OK(og_swiglu_cuda(NULL, dg, du, T * F, uout, NULL));
        snprintf(what, sizeof what, "gemv_swiglu T=%lld K=%lld %s", (long long)T, (long long)K, og_dtype_name(dt));
        same_bits(what, dout, uout, (size_t)(T * F));
        got = down(dout, (size_t)(T * F));
        compare_swiglu(what, got, g, u, ref, (size_t)(T * F), K);
        free(got);
        /* parts of 389, 17 and 389 rows: gate, the first 17 rows of up, up */
        float *p0 = poisoned((size_t)(T * F)), *p1 = poisoned((size_t)(T * 17)), *p2 = poisoned((size_t)(T * F));
        float *u17 = poisoned((size_t)(T * 17));
        const og_gemv_cuda_part parts[3] = {{dwg, bias ? dbg : NULL, F, p0}, {dwu, NULL, 17, p1},
                                            {dwu, bias ? dbu : NULL, F, p2}};
        CHECK_OK(og_gemv_multi_cuda(NULL, dx, dt, T, K, parts, 3));
        CHECK_OK(og_gemv_cuda(NULL, dx, dwu, NULL, dt, T, K, 17, u17));
        snprintf(what, sizeof what, "gemv_multi T=%lld K=%lld %s", (long long)T, (long long)K, og_dtype_name(dt));
        same_bits(what, p0, dg, (size_t)(T * F));
        same_bits(what, p1, u17, (size_t)(T * 17));
        same_bits(what, p2, du, (size_t)(T * F));
        if (og_gemv_cuda_norm_fits(dt, T, K)) { /* the add + rms_norm prologue: the bits of og_add_rms_norm_cuda before the products */
            float *ra = rand_f32((size_t)(T * K)), *rb = rand_f32((size_t)(T * K));
            void *wn = rand_w((size_t)K, dt);
            float *na = up(ra, (size_t)(T * K) * 4), *db2 = up(rb, (size_t)(T * K) * 4);
            void *dwn = up(wn, (size_t)K * es);
            float *nsum = poisoned((size_t)(T * K)), *unormed = poisoned((size_t)(T * K));
            float *fsum = poisoned((size_t)(T * K)), *fsum2 = poisoned((size_t)(T * K));
            float *f0 = poisoned((size_t)(T * F)), *f1 = poisoned((size_t)(T * 17)), *fsw = poisoned((size_t)(T * F));
            CHECK_OK(og_add_rms_norm_cuda(NULL, na, db2, dwn, dt, T, K, 1e-6f, nsum, unormed, NULL));
            CHECK_OK(og_gemv_multi_cuda(NULL, unormed, dt, T, K, parts, 3));
            CHECK_OK(og_gemv_swiglu_cuda(NULL, unormed, dwg, bias ? dbg : NULL, dwu, bias ? dbu : NULL, dt, T, K, F,
                                         dout));
            og_gemv_cuda_norm nm = {na, db2, dwn, dt, 1e-6f, fsum};
            const og_gemv_cuda_part fparts[2] = {{dwg, bias ? dbg : NULL, F, f0}, {dwu, NULL, 17, f1}};
            CHECK_OK(og_gemv_norm_multi_cuda(NULL, NULL, &nm, dt, T, K, fparts, 2));
            nm.sum = fsum2;
            CHECK_OK(og_gemv_norm_swiglu_cuda(NULL, NULL, &nm, dwg, bias ? dbg : NULL, dwu, bias ? dbu : NULL, dt, T,
                                              K, F, fsw));
            snprintf(what, sizeof what, "gemv with add+rms_norm T=%lld K=%lld %s", (long long)T, (long long)K,
                     og_dtype_name(dt));
            same_bits(what, fsum, nsum, (size_t)(T * K));
            same_bits(what, fsum2, nsum, (size_t)(T * K));
            same_bits(what, f0, p0, (size_t)(T * F));
            same_bits(what, f1, p1, (size_t)(T * 17));
            same_bits(what, fsw, dout, (size_t)(T * F));
            free(ra), free(rb), free(wn);
            cudaFree(na), cudaFree(db2), cudaFree(dwn), cudaFree(nsum), cudaFree(unormed), cudaFree(fsum);
            cudaFree(fsum2), cudaFree(f0), cudaFree(f1), cudaFree(fsw);
        }
        free(x), free(wg), free(wu), free(bg), free(bu), free(g), free(u), free(ref);
        cudaFree(dx), cudaFree(dwg), cudaFree(dwu), cudaFree(dbg), cudaFree(dbu), cudaFree(dg), cudaFree(du);
        cudaFree(dout), cudaFree(uout), cudaFree(p0), cudaFree(p1), cudaFree(p2), cudaFree(u17);
    }
}

/* ---- the split-K bf16 products (og_gemv_cuda_set_split) ----
 * Every product of the 0.6B, 8B and 32B-like shapes (q/k/v in one launch
 * with biases, o, gate/up with the swiglu epilogue, down, the LM head of
 * vocabulary 151936) at T = 1..8, with the split kernel on and its split
 * count chosen from the shape: against og_matmul_ref (and og_swiglu_ref) on
 * a sample of output features (every row of a small matrix; of a large one
 * every s-th row, s odd so that the sample meets every row of a tile, and
 * the last tile), at the gemv's tolerance. Then bit for bit: the counts
 * forced to 1, 2 and 4 and the rings capped at 16 KB give the chosen
 * count's bits (the sums do not depend on the split), the T rows of a call
 * are the first T rows of the T = 8 call, and the add + rms_norm prologue
 * gives the bits of og_add_rms_norm_cuda then the product. Two odd products
 * (K of 3 and 129 units, N = 17 and 67) take forced counts against the
 * reference. The weights repeat a block of 1000003 random bf16 values (a
 * prime: no row or unit of 32 has another's values at the same k), so that
 * 1.5 GB heads are quick to make. OG_CUDA_TEST_QUICK=1 keeps the 0.6B shape
 * without its head, T = 1, 3, 8; OG_CUDA_TEST_SPLIT_ONLY=1 runs this section
 * alone. */
enum { SPLIT_PERIOD = 1000003 };
static uint16_t *split_pattern; /* [SPLIT_PERIOD * 64 + SPLIT_PERIOD] */

static void *split_weights(int64_t N, int64_t K, size_t off) {
    const size_t n = (size_t)(N * K), chunk = (size_t)SPLIT_PERIOD * 64;
    uint8_t *d = NULL;
    CK(cudaMalloc((void **)&d, n * 2));
    for (size_t i = 0; i < n; i += chunk)
        CK(cudaMemcpy(d + i * 2, split_pattern + off, (n - i < chunk ? n - i : chunk) * 2, cudaMemcpyHostToDevice));
    return d;
}

/* The sampled rows' reference products: ref[t * N + r] for the rows r kept by split_row. */
static bool split_row(int64_t r, int64_t N, int64_t stride) { return r % stride == 0 || r >= N - 16; }

static void split_ref(const float *x, int64_t T, int64_t K, int64_t N, size_t off, const uint16_t *bias,
                      int64_t stride, float *ref) {
    float col[OG_GEMV_CUDA_MAX_T];
    for (int64_t r = 0; r < N; r++) {
        if (!split_row(r, N, stride)) continue;
        const uint16_t *w = split_pattern + (off + (size_t)(r * K)) % SPLIT_PERIOD;
        CHECK_OK(og_matmul_ref(x, w, bias ? bias + r : NULL, OG_DTYPE_BF16, T, K, 1, col));
        for (int64_t t = 0; t < T; t++) ref[t * N + r] = col[t];
    }
}

/* got (device [T, N]) against ref on the sampled rows. */
static void split_compare(const char *what, const float *dgot, const float *ref, int64_t T, int64_t K, int64_t N,
                          int64_t stride) {
    float *got = down(dgot, (size_t)(T * N));
    float *a = malloc((size_t)(T * N) * 4), *b = malloc((size_t)(T * N) * 4);
    size_t n = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < N; r++)
            if (split_row(r, N, stride)) a[n] = got[t * N + r], b[n] = ref[t * N + r], n++;
    compare(what, a, b, n, 1e-5 * sqrt((double)K), 1e-5);
    free(got), free(a), free(b);
}

typedef struct split_shape {
    const char *name;
    int kind; /* 0: parts of one launch, 1: gate/up + swiglu */
    int n_parts;
    int64_t K, N[3];
    bool bias;
} split_shape;

static void split_case(const split_shape *s, const int64_t *Ts, int nT, int forced) {
    const int parts = s->kind ? 2 : s->n_parts;
    const int64_t K = s->K;
    int64_t most = 0;
    for (int p = 0; p < parts; p++) most += s->N[p] * K;
    const int64_t stride = most > (4 << 20) ? (most / (4 << 20)) | 1 : 1;
    void *dw[3];
    uint16_t *bias[3] = {NULL, NULL, NULL};
    void *db[3] = {NULL, NULL, NULL};
    size_t off[3];
    for (int p = 0; p < parts; p++) {
        off[p] = (size_t)(p * 7919 + K) % SPLIT_PERIOD;
        dw[p] = split_weights(s->N[p], K, off[p]);
        if (s->bias) {
            bias[p] = rand_w((size_t)s->N[p], OG_DTYPE_BF16);
            db[p] = up(bias[p], (size_t)s->N[p] * 2);
        }
    }
    const int64_t TM = OG_GEMV_CUDA_MAX_T;
    float *x = rand_f32((size_t)(TM * K));
    float *dx = up(x, (size_t)(TM * K) * 4);
    float *ref[3], *d8[3], *dout[3];
    for (int p = 0; p < parts; p++) {
        ref[p] = malloc((size_t)(TM * s->N[p]) * 4);
        split_ref(x, TM, K, s->N[p], off[p], bias[p], stride, ref[p]);
        d8[p] = poisoned((size_t)(TM * s->N[p]));
        dout[p] = poisoned((size_t)(TM * s->N[p]));
    }
    float *sw = NULL;
    if (s->kind) { /* the swiglu of the two references */
        sw = malloc((size_t)(TM * s->N[0]) * 4);
        CHECK_OK(og_swiglu_ref(ref[0], ref[1], TM, s->N[0], sw));
    }
    /* runs the product at T rows into out (parts, or out[0] for swiglu) */
#define SPLIT_RUN(T_, out)                                                                                         \
    do {                                                                                                           \
        if (s->kind) {                                                                                             \
            CHECK_OK(og_gemv_swiglu_cuda(NULL, dx, dw[0], db[0], dw[1], db[1], OG_DTYPE_BF16, (T_), K, s->N[0],    \
                                         (out)[0]));                                                               \
        } else {                                                                                                   \
            og_gemv_cuda_part pt[3];                                                                               \
            for (int p_ = 0; p_ < parts; p_++) pt[p_] = (og_gemv_cuda_part){dw[p_], db[p_], s->N[p_], (out)[p_]};  \
            CHECK_OK(og_gemv_multi_cuda(NULL, dx, OG_DTYPE_BF16, (T_), K, pt, parts));                             \
        }                                                                                                          \
    } while (0)
    const int outs = s->kind ? 1 : parts;
    og_gemv_cuda_set_split(1, forced, 0);
    SPLIT_RUN(TM, d8);
    for (int ti = 0; ti < nT; ti++) {
        const int64_t T = Ts[ti];
        char what[128];
        og_gemv_cuda_set_split(1, forced, 0);
        SPLIT_RUN(T, dout);
        for (int p = 0; p < outs; p++) {
            snprintf(what, sizeof what, "split %s part %d T=%lld splits %d", s->name, p, (long long)T, forced);
            if (!s->kind) {
                split_compare(what, dout[p], ref[p], T, K, s->N[p], stride);
            } else { /* swiglu of the sampled rows, at compare_swiglu's tolerance */
                const int64_t F = s->N[0];
                float *got = down(dout[0], (size_t)(T * F));
                float *g = malloc((size_t)(T * F) * 4), *u = malloc((size_t)(T * F) * 4);
                float *a = malloc((size_t)(T * F) * 4), *b = malloc((size_t)(T * F) * 4);
                size_t n = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < F; r++)
                        if (split_row(r, F, stride))
                            g[n] = ref[0][t * F + r], u[n] = ref[1][t * F + r], a[n] = got[t * F + r],
                            b[n] = sw[t * F + r], n++;
                compare_swiglu(what, a, g, u, b, n, K);
                free(got), free(g), free(u), free(a), free(b);
            }
            /* the first T rows of the T = 8 call */
            same_bits(what, dout[p], d8[p], (size_t)(T * (s->kind ? s->N[0] : s->N[p])));
        }
        if (forced) continue;
        /* forced counts and capped rings: the same bits */
        const int variants[4][2] = {{1, 0}, {2, 0}, {4, 0}, {0, 16}};
        for (int v = 0; v < 4; v++) {
            float *alt[3];
            for (int p = 0; p < outs; p++) alt[p] = poisoned((size_t)(T * s->N[p]));
            og_gemv_cuda_set_split(1, variants[v][0], variants[v][1]);
            SPLIT_RUN(T, alt);
            for (int p = 0; p < outs; p++) {
                snprintf(what, sizeof what, "split %s part %d T=%lld: splits %d ring %d KB vs chosen", s->name, p,
                         (long long)T, variants[v][0], variants[v][1]);
                same_bits(what, alt[p], dout[p], (size_t)(T * s->N[p]));
                cudaFree(alt[p]);
            }
        }
        /* the add + rms_norm prologue where it is taken: x = rms_norm(a + b) */
        if (og_gemv_cuda_norm_fits(OG_DTYPE_BF16, T, K)) {
            float *ra = rand_f32((size_t)(T * K)), *rb = rand_f32((size_t)(T * K));
            void *wn = rand_w((size_t)K, OG_DTYPE_BF16);
            float *na = up(ra, (size_t)(T * K) * 4), *nb = up(rb, (size_t)(T * K) * 4);
            void *dwn = up(wn, (size_t)K * 2);
            float *nsum = poisoned((size_t)(T * K)), *normed = poisoned((size_t)(T * K)), *fsum = poisoned((size_t)(T * K));
            float *uo[3], *fo[3];
            for (int p = 0; p < outs; p++) uo[p] = poisoned((size_t)(T * s->N[p])), fo[p] = poisoned((size_t)(T * s->N[p]));
            og_gemv_cuda_set_split(1, 0, 0);
            CHECK_OK(og_add_rms_norm_cuda(NULL, na, nb, dwn, OG_DTYPE_BF16, T, K, 1e-6f, nsum, normed, NULL));
            const og_gemv_cuda_norm nm = {na, nb, dwn, OG_DTYPE_BF16, 1e-6f, fsum};
            og_gemv_cuda_part pt[3], fp[3];
            for (int p = 0; p < parts; p++) {
                pt[p] = (og_gemv_cuda_part){dw[p], db[p], s->N[p], s->kind ? uo[0] : uo[p]};
                fp[p] = (og_gemv_cuda_part){dw[p], db[p], s->N[p], s->kind ? fo[0] : fo[p]};
            }
            if (s->kind) {
                CHECK_OK(og_gemv_swiglu_cuda(NULL, normed, dw[0], db[0], dw[1], db[1], OG_DTYPE_BF16, T, K, s->N[0], uo[0]));
                CHECK_OK(og_gemv_norm_swiglu_cuda(NULL, NULL, &nm, dw[0], db[0], dw[1], db[1], OG_DTYPE_BF16, T, K,
                                                  s->N[0], fo[0]));
            } else {
                CHECK_OK(og_gemv_multi_cuda(NULL, normed, OG_DTYPE_BF16, T, K, pt, parts));
                CHECK_OK(og_gemv_norm_multi_cuda(NULL, NULL, &nm, OG_DTYPE_BF16, T, K, fp, parts));
            }
            snprintf(what, sizeof what, "split %s T=%lld with add+rms_norm", s->name, (long long)T);
            same_bits(what, fsum, nsum, (size_t)(T * K));
            for (int p = 0; p < outs; p++) {
                same_bits(what, fo[p], uo[p], (size_t)(T * s->N[p]));
                cudaFree(uo[p]), cudaFree(fo[p]);
            }
            free(ra), free(rb), free(wn);
            cudaFree(na), cudaFree(nb), cudaFree(dwn), cudaFree(nsum), cudaFree(normed), cudaFree(fsum);
        }
    }
#undef SPLIT_RUN
    og_gemv_cuda_set_split(-1, 0, 0);
    for (int p = 0; p < parts; p++) {
        cudaFree(dw[p]), cudaFree(db[p]), cudaFree(d8[p]), cudaFree(dout[p]);
        free(bias[p]), free(ref[p]);
    }
    free(x), free(sw);
    cudaFree(dx);
}

static void test_split(void) {
    og_test_section("split-K bf16 products at model shapes");
    const bool quick = getenv("OG_CUDA_TEST_QUICK") && getenv("OG_CUDA_TEST_QUICK")[0] == '1';
    const size_t n = (size_t)SPLIT_PERIOD * 65;
    split_pattern = malloc(n * 2);
    for (size_t i = 0; i < SPLIT_PERIOD; i++) split_pattern[i] = og_bf16_from_f32(og_rng_uniform(&rng, -1, 1));
    for (size_t i = SPLIT_PERIOD; i < n; i++) split_pattern[i] = split_pattern[i - SPLIT_PERIOD];
    const split_shape shapes[] = {
        {"0.6b qkv", 0, 3, 1024, {2048, 1024, 1024}, true}, {"0.6b o", 0, 1, 2048, {1024}, false},
        {"0.6b gate_up", 1, 2, 1024, {3072, 3072}, false}, {"0.6b down", 0, 1, 3072, {1024}, false},
        {"0.6b head", 0, 1, 1024, {151936}, false},
        {"8b qkv", 0, 3, 4096, {4096, 1024, 1024}, true}, {"8b o", 0, 1, 4096, {4096}, false},
        {"8b gate_up", 1, 2, 4096, {12288, 12288}, false}, {"8b down", 0, 1, 12288, {4096}, false},
        {"8b head", 0, 1, 4096, {151936}, false},
        {"32b qkv", 0, 3, 5120, {8192, 1024, 1024}, true}, {"32b o", 0, 1, 8192, {5120}, false},
        {"32b gate_up", 1, 2, 5120, {25600, 25600}, true}, {"32b down", 0, 1, 25600, {5120}, false},
        {"32b head", 0, 1, 5120, {151936}, false},
    };
    const int64_t all[] = {1, 2, 3, 4, 5, 6, 7, 8}, few[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        if (quick && (i >= 4)) break;
        split_case(&shapes[i], quick ? few : all, quick ? 3 : 8, 0);
    }
    /* odd sizes: 3 and 129 units of K (the last round of chains partly empty), N not a multiple of 16 */
    const split_shape odd[] = {{"odd K=96", 0, 2, 96, {17, 5}, true}, {"odd K=4128", 0, 1, 4128, {67}, true}};
    for (size_t i = 0; i < 2; i++)
        for (int f = 1; f <= 4; f *= 2) split_case(&odd[i], few, 3, f);
    free(split_pattern);
    split_pattern = NULL;
}

/* ---- quantized weights (q8, q4) ---- */

/* Random [N, K] weights in [-1, 1) quantized to dt (og_quantize_rows, the
 * reference layout); group 1 of row 0 is all zero (a zero scale) when it
 * exists. *bytes gets the tensor's size. */
static void *rand_q(og_dtype dt, int64_t N, int64_t K, size_t *bytes) {
    float *src = rand_f32((size_t)(N * K));
    if (K >= 2 * OG_QUANT_GROUP) memset(src + OG_QUANT_GROUP, 0, OG_QUANT_GROUP * sizeof(float));
    const int64_t shape[2] = {N, K};
    int64_t nb = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &nb));
    void *w = malloc((size_t)nb);
    CHECK_OK(og_quantize_rows(dt, src, N, K, w));
    free(src);
    *bytes = (size_t)nb;
    return w;
}

/* The rows of a quantized [N, K] tensor as f32 (og_dequantize_row: exact). */
static float *dequantized(og_dtype dt, const void *w, int64_t N, int64_t K) {
    float *f = malloc((size_t)(N * K) * 4);
    for (int64_t n = 0; n < N; n++) og_dequantize_row(dt, w, N, K, n, f + n * K);
    return f;
}

/* The narrow-batch products (og_gemm_narrow_cuda): bf16 x, bf16 / q8 / q4
 * weights, a bias on one part (bf16 beside bf16 weights, f32 beside q8/q4),
 * three parts of odd widths in one launch, against a double-precision sum
 * of x times the exact weights (the bf16 values, or scale * q) at the
 * products' tolerance; at every split count (the partial tiles of a cluster
 * added in rank order); and a row's bits the same at every T (its sums never
 * see the other rows). */
static void test_narrow(void) {
    og_test_section("narrow-batch products (og_gemm_narrow_cuda)");
    const int64_t Ts[] = {1, 9, 16, 17, 32, 33, 64}, TM = 64;
    const int64_t Ns[3] = {300, 128, 1000};
    const og_dtype dts[3] = {OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
    for (int di = 0; di < 3; di++)
        for (int ki = 0; ki < 2; ki++) {
            const og_dtype dt = dts[di];
            const bool quant = dt != OG_DTYPE_BF16;
            const int64_t K = ki ? 4096 : 1024;
            float *x = rand_f32((size_t)(TM * K));
            uint16_t *xb = malloc((size_t)(TM * K) * 2);
            for (int64_t i = 0; i < TM * K; i++) xb[i] = og_bf16_from_f32(x[i]), x[i] = og_f32_from_bf16(xb[i]);
            uint16_t *dx = up(xb, (size_t)(TM * K) * 2);
            void *dw[3];
            float *ref[3], *dout[3], *dfull[3];
            const og_dtype bias_dt = quant ? OG_DTYPE_F32 : OG_DTYPE_BF16;
            void *bias = rand_w((size_t)Ns[0], bias_dt);
            void *dbias = up(bias, (size_t)Ns[0] * og_dtype_size(bias_dt));
            for (int p = 0; p < 3; p++) {
                const int64_t N = Ns[p];
                size_t bytes = (size_t)(N * K) * 2;
                void *w = quant ? rand_q(dt, N, K, &bytes) : rand_w((size_t)(N * K), dt);
                float *wf = quant ? dequantized(dt, w, N, K) : malloc((size_t)(N * K) * 4);
                if (!quant)
                    for (int64_t i = 0; i < N * K; i++) wf[i] = og_f32_from_bf16(((const uint16_t *)w)[i]);
                dw[p] = up(w, bytes);
                ref[p] = malloc((size_t)(TM * N) * 4);
                for (int64_t t = 0; t < TM; t++)
                    for (int64_t n = 0; n < N; n++) {
                        double acc = p == 0 ? og_load_f32(bias, bias_dt, (size_t)n) : 0.0;
                        for (int64_t k = 0; k < K; k++) acc += (double)x[t * K + k] * wf[n * K + k];
                        ref[p][t * N + n] = (float)acc;
                    }
                free(w), free(wf);
                dout[p] = poisoned((size_t)(TM * N));
                dfull[p] = poisoned((size_t)(TM * N));
            }
            const og_gemv_cuda_part full[3] = {{dw[0], dbias, Ns[0], dfull[0]}, {dw[1], NULL, Ns[1], dfull[1]},
                                               {dw[2], NULL, Ns[2], dfull[2]}};
            const og_gemv_cuda_part parts[3] = {{dw[0], dbias, Ns[0], dout[0]}, {dw[1], NULL, Ns[1], dout[1]},
                                                {dw[2], NULL, Ns[2], dout[2]}};
            for (int forced = 0; forced <= 8; forced = forced ? 2 * forced : 1) {
                og_gemm_narrow_cuda_set_splits(forced);
                CHECK_OK(og_gemm_narrow_cuda(NULL, dx, dt, TM, K, full, 3));
                for (int p = 0; p < 3; p++) {
                    char what[96];
                    snprintf(what, sizeof what, "narrow %s K=%lld part %d T=%lld splits %d", og_dtype_name(dt),
                             (long long)K, p, (long long)TM, forced);
                    float *got = down(dfull[p], (size_t)(TM * Ns[p]));
                    compare(what, got, ref[p], (size_t)(TM * Ns[p]), 1e-5 * sqrt((double)K), 1e-5);
                    free(got);
                }
                for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) { /* row t's bits at every T */
                    const int64_t T = Ts[ti];
                    CHECK_OK(og_gemm_narrow_cuda(NULL, dx, dt, T, K, parts, 3));
                    for (int p = 0; p < 3; p++) {
                        char what[96];
                        snprintf(what, sizeof what, "narrow %s K=%lld part %d T=%lld splits %d against T=64",
                                 og_dtype_name(dt), (long long)K, p, (long long)T, forced);
                        same_bits(what, dout[p], dfull[p], (size_t)(T * Ns[p]));
                    }
                }
            }
            og_gemm_narrow_cuda_set_splits(-1);
            for (int p = 0; p < 3; p++) free(ref[p]), cudaFree(dw[p]), cudaFree(dout[p]), cudaFree(dfull[p]);
            free(x), free(xb), free(bias), cudaFree(dx), cudaFree(dbias);
        }
    /* what it does not take, refused by name */
    const og_gemv_cuda_part bad = {NULL, NULL, 16, NULL};
    CHECK(og_gemm_narrow_cuda(NULL, NULL, OG_DTYPE_BF16, 65, 1024, &bad, 1) == OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "gemm_narrow_cuda") != NULL);
    CHECK(!og_gemm_narrow_cuda_takes((const uint16_t *)16, OG_DTYPE_Q4_K, 16, 1024, &bad, 1));
}

/* What the back end does with quantized weights in a step wider than the
 * gemv: the gemv on chunks of OG_GEMV_CUDA_MAX_T rows (chunked), or the
 * weight dequantized panel by panel (rows of `panel`) and SGEMM. */
static void wide_q(cublasHandle_t blas, bool chunked, const float *dx, const void *dw, const float *db, og_dtype dt,
                   int64_t T, int64_t K, int64_t N, int64_t panel, float *dpanel, float *dout) {
    if (chunked) {
        for (int64_t t0 = 0; t0 < T; t0 += OG_GEMV_CUDA_MAX_T) {
            const int64_t n = T - t0 < OG_GEMV_CUDA_MAX_T ? T - t0 : OG_GEMV_CUDA_MAX_T;
            CHECK_OK(og_gemv_cuda(NULL, dx + t0 * K, dw, db, dt, n, K, N, dout + t0 * N));
        }
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (db) CHECK_OK(og_fill_rows_cuda(NULL, db, OG_DTYPE_F32, T, N, dout));
    for (int64_t n0 = 0; n0 < N; n0 += panel) {
        const int64_t rows = N - n0 < panel ? N - n0 : panel;
        CHECK_OK(og_dequantize_cuda(NULL, dw, dt, N, K, n0, rows, dpanel));
        CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)K, &one, dpanel, (int)K, dx, (int)K,
                          db ? &one : &zero, dout + n0, (int)N) == CUBLAS_STATUS_SUCCESS);
    }
}

static void test_quant_embed(void) {
    og_test_section("quantized: embed and dequantize, exact");
    const int64_t Hs[] = {32, 96, 1056};
    const int64_t V = 67;
    for (int q = 0; q < 2; q++)
        for (size_t hi = 0; hi < 3; hi++) {
            const og_dtype dt = q ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
            const int64_t H = Hs[hi], T = 5;
            size_t nb;
            void *table = rand_q(dt, V, H, &nb);
            int32_t tok[5] = {(int32_t)V - 1, 0, 17, 0, 33};
            float *ref = malloc((size_t)(T * H) * 4);
            CHECK_OK(og_embed_ref(tok, T, table, dt, V, H, ref));
            int32_t *dtok = up(tok, sizeof tok);
            void *dtable = up(table, nb);
            float *dout = poisoned((size_t)(T * H));
            CHECK_OK(og_embed_cuda(NULL, dtok, T, dtable, dt, V, H, dout));
            float *got = down(dout, (size_t)(T * H));
            char what[96];
            snprintf(what, sizeof what, "embed %s H=%lld", og_dtype_name(dt), (long long)H);
            compare(what, got, ref, (size_t)(T * H), 0, 0);
            free(got);
            /* every row, and a panel in the middle, as og_dequantize_row */
            float *all = dequantized(dt, table, V, H);
            float *dpan = poisoned((size_t)(V * H));
            CHECK_OK(og_dequantize_cuda(NULL, dtable, dt, V, H, 0, V, dpan));
            got = down(dpan, (size_t)(V * H));
            snprintf(what, sizeof what, "dequantize %s K=%lld", og_dtype_name(dt), (long long)H);
            compare(what, got, all, (size_t)(V * H), 0, 0);
            free(got);
            CHECK_OK(og_dequantize_cuda(NULL, dtable, dt, V, H, 17, 9, dpan));
            got = down(dpan, (size_t)(9 * H));
            compare(what, got, all + 17 * H, (size_t)(9 * H), 0, 0);
            /* refusals: rows past the end, K not whole groups, a misaligned tensor */
            CHECK_STATUS(og_dequantize_cuda(NULL, dtable, dt, V, H, V - 2, 3, dpan), OG_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(og_embed_cuda(NULL, dtok, T, dtable, dt, V, H - 8, dout), OG_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(og_embed_cuda(NULL, dtok, T, (char *)dtable + 8, dt, V, H, dout), OG_ERR_INVALID_ARGUMENT);
            free(got), free(all), free(ref), free(table);
            cudaFree(dtok), cudaFree(dtable), cudaFree(dout), cudaFree(dpan);
        }
}

static void test_quant_matmul(void) {
    og_test_section("quantized: gemv, chunked gemv and dequantize + SGEMM");
    /* K: one group and three (part of a slab of 128: idle lanes), 384 (4
     * slabs loaded ahead), 1056, 2080 and 4128 (8 ahead; 2, 3 and 5 rounds,
     * the last one partial) */
    const int64_t Ks[] = {32, 96, 384, 1056, 2080, 4128};
    const int64_t Ns[] = {1, 17, 67, 259};
    const int64_t Ts[] = {1, 3, 8, 40, 200};
    cublasHandle_t blas;
    CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    for (int q = 0; q < 2; q++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
                const og_dtype dt = q ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
                const int64_t K = Ks[ki], N = Ns[ni];
                size_t nb;
                void *w = rand_q(dt, N, K, &nb);
                float *bv = rand_f32((size_t)N);
                void *dw = up(w, nb);
                float *db = up(bv, (size_t)N * 4);
                /* a panel of a third of the rows: several SGEMMs into one out */
                const int64_t panel = N > 3 ? N / 3 : 1;
                float *dpanel = poisoned((size_t)(panel * K));
                for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                    const int64_t T = Ts[ti];
                    if (T > OG_GEMV_CUDA_MAX_T && K > 1056) continue; /* the wide paths at K <= 1056 */
                    const bool bias = (ni + ti) % 2;
                    float *x = rand_f32((size_t)(T * K)), *ref = malloc((size_t)(T * N) * 4);
                    CHECK_OK(og_matmul_ref(x, w, bias ? bv : NULL, dt, T, K, N, ref));
                    float *dx = up(x, (size_t)(T * K) * 4), *dout = poisoned((size_t)(T * N));
                    char what[128];
                    for (int path = 0; path < (T > OG_GEMV_CUDA_MAX_T ? 2 : 1); path++) {
                        if (T <= OG_GEMV_CUDA_MAX_T)
                            CHECK_OK(og_gemv_cuda(NULL, dx, dw, bias ? db : NULL, dt, T, K, N, dout));
                        else
                            wide_q(blas, path == 0, dx, dw, bias ? db : NULL, dt, T, K, N, panel, dpanel, dout);
                        float *got = down(dout, (size_t)(T * N));
                        snprintf(what, sizeof what, "%s %s T=%lld K=%lld N=%lld%s",
                                 T <= OG_GEMV_CUDA_MAX_T ? "gemv" : path == 0 ? "chunked gemv" : "dequantize + sgemm",
                                 og_dtype_name(dt), (long long)T, (long long)K, (long long)N, bias ? " bias" : "");
                        compare(what, got, ref, (size_t)(T * N), prod_atol * sqrt((double)K), 1e-5);
                        free(got);
                    }
                    if (T == 3 && ni == 1) { /* refusals: x not 16-byte aligned, K not whole groups */
                        CHECK_STATUS(og_gemv_cuda(NULL, dx + 1, dw, NULL, dt, 1, K, N, dout),
                                     OG_ERR_INVALID_ARGUMENT);
                        CHECK_STATUS(og_gemv_cuda(NULL, dx, dw, NULL, dt, 1, K - 8, N, dout), OG_ERR_INVALID_ARGUMENT);
                    }
                    free(x), free(ref);
                    cudaFree(dx), cudaFree(dout);
                }
                free(w), free(bv);
                cudaFree(dw), cudaFree(db), cudaFree(dpanel);
            }
    cublasDestroy(blas);
}

/* The fused gemv variants over quantized weights: gemv_swiglu against two
 * gemvs and og_swiglu_cuda, gemv_multi against one gemv a part, and the
 * add + rms_norm prologue against og_add_rms_norm_cuda before them, all bit
 * for bit (one summation order); and against the C references' composition. */
static void test_quant_fused(void) {
    og_test_section("quantized: fused gemv variants");
    const int64_t Ks[] = {32, 96, 384, 1056, 2080, 4096}; /* 4096: gemv_q.cu's fold of the norm at one row */
    const int64_t Ts[] = {1, 3, 8};
    for (int q = 0; q < 2; q++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                const og_dtype dt = q ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
                const int64_t K = Ks[ki], T = Ts[ti], F = 67;
                const bool bias = (ki + ti + q) % 2;
                char what[128];
                size_t nb;
                void *wg = rand_q(dt, F, K, &nb), *wu = rand_q(dt, F, K, &nb);
                float *bg = rand_f32((size_t)F), *bu = rand_f32((size_t)F);
                float *x = rand_f32((size_t)(T * K));
                float *g = malloc((size_t)(T * F) * 4), *u = malloc((size_t)(T * F) * 4);
                float *ref = malloc((size_t)(T * F) * 4);
                CHECK_OK(og_matmul_ref(x, wg, bias ? bg : NULL, dt, T, K, F, g));
                CHECK_OK(og_matmul_ref(x, wu, bias ? bu : NULL, dt, T, K, F, u));
                CHECK_OK(og_swiglu_ref(g, u, T, F, ref));
                float *dx = up(x, (size_t)(T * K) * 4);
                void *dwg = up(wg, nb), *dwu = up(wu, nb);
                float *dbg = bias ? up(bg, (size_t)F * 4) : NULL, *dbu = bias ? up(bu, (size_t)F * 4) : NULL;
                float *dg = poisoned((size_t)(T * F)), *du = poisoned((size_t)(T * F));
                float *dout = poisoned((size_t)(T * F)), *uout = poisoned((size_t)(T * F));
                CHECK_OK(og_gemv_swiglu_cuda(NULL, dx, dwg, dbg, dwu, dbu, dt, T, K, F, dout));
                CHECK_OK(og_gemv_cuda(NULL, dx, dwg, dbg, dt, T, K, F, dg));
                CHECK_OK(og_gemv_cuda(NULL, dx, dwu, dbu, dt, T, K, F, du));
                CHECK_OK(og_swiglu_cuda(NULL, dg, du, T * F, uout, NULL));
                snprintf(what, sizeof what, "gemv_swiglu %s T=%lld K=%lld%s", og_dtype_name(dt), (long long)T,
                         (long long)K, bias ? " bias" : "");
                same_bits(what, dout, uout, (size_t)(T * F));
                float *got = down(dout, (size_t)(T * F));
                compare_swiglu(what, got, g, u, ref, (size_t)(T * F), K);
                free(got);
                /* parts of 67, 17 and 67 rows: gate, a [17, K] weight of its own, up */
                size_t nb17;
                void *w17 = rand_q(dt, 17, K, &nb17);
                void *dw17 = up(w17, nb17);
                float *p0 = poisoned((size_t)(T * F)), *p1 = poisoned((size_t)(T * 17)), *p2 = poisoned((size_t)(T * F));
                float *u17 = poisoned((size_t)(T * 17));
                const og_gemv_cuda_part parts[3] = {{dwg, dbg, F, p0}, {dw17, NULL, 17, p1}, {dwu, dbu, F, p2}};
                CHECK_OK(og_gemv_multi_cuda(NULL, dx, dt, T, K, parts, 3));
                CHECK_OK(og_gemv_cuda(NULL, dx, dw17, NULL, dt, T, K, 17, u17));
                snprintf(what, sizeof what, "gemv_multi %s T=%lld K=%lld", og_dtype_name(dt), (long long)T,
                         (long long)K);
                same_bits(what, p0, dg, (size_t)(T * F));
                same_bits(what, p1, u17, (size_t)(T * 17));
                same_bits(what, p2, du, (size_t)(T * F));
                {   /* part 1 against the reference too */
                    float *r17 = malloc((size_t)(T * 17) * 4);
                    CHECK_OK(og_matmul_ref(x, w17, NULL, dt, T, K, 17, r17));
                    got = down(p1, (size_t)(T * 17));
                    compare(what, got, r17, (size_t)(T * 17), prod_atol * sqrt((double)K), 1e-5);
                    free(got), free(r17);
                }
                if (og_gemv_cuda_norm_fits(dt, T, K)) { /* the add + rms_norm prologue */
                    float *ra = rand_f32((size_t)(T * K)), *rb = rand_f32((size_t)(T * K));
                    void *wn = rand_w((size_t)K, OG_DTYPE_BF16);
                    float *na = up(ra, (size_t)(T * K) * 4), *nbv = up(rb, (size_t)(T * K) * 4);
                    void *dwn = up(wn, (size_t)K * 2);
                    float *nsum = poisoned((size_t)(T * K)), *normed = poisoned((size_t)(T * K));
                    float *fsum = poisoned((size_t)(T * K)), *fsum2 = poisoned((size_t)(T * K));
                    float *f0 = poisoned((size_t)(T * F)), *f1 = poisoned((size_t)(T * 17));
                    float *fsw = poisoned((size_t)(T * F));
                    CHECK_OK(og_add_rms_norm_cuda(NULL, na, nbv, dwn, OG_DTYPE_BF16, T, K, 1e-6f, nsum, normed, NULL));
                    CHECK_OK(og_gemv_multi_cuda(NULL, normed, dt, T, K, parts, 3));
                    CHECK_OK(og_gemv_swiglu_cuda(NULL, normed, dwg, dbg, dwu, dbu, dt, T, K, F, dout));
                    og_gemv_cuda_norm nm = {na, nbv, dwn, OG_DTYPE_BF16, 1e-6f, fsum};
                    const og_gemv_cuda_part fparts[2] = {{dwg, dbg, F, f0}, {dw17, NULL, 17, f1}};
                    CHECK_OK(og_gemv_norm_multi_cuda(NULL, NULL, &nm, dt, T, K, fparts, 2));
                    nm.sum = fsum2;
                    CHECK_OK(og_gemv_norm_swiglu_cuda(NULL, NULL, &nm, dwg, dbg, dwu, dbu, dt, T, K, F, fsw));
                    snprintf(what, sizeof what, "gemv with add+rms_norm %s T=%lld K=%lld", og_dtype_name(dt),
                             (long long)T, (long long)K);
                    same_bits(what, fsum, nsum, (size_t)(T * K));
                    same_bits(what, fsum2, nsum, (size_t)(T * K));
                    same_bits(what, f0, p0, (size_t)(T * F));
                    same_bits(what, f1, p1, (size_t)(T * 17));
                    same_bits(what, fsw, dout, (size_t)(T * F));
                    free(ra), free(rb), free(wn);
                    cudaFree(na), cudaFree(nbv), cudaFree(dwn), cudaFree(nsum), cudaFree(normed);
                    cudaFree(fsum), cudaFree(fsum2), cudaFree(f0), cudaFree(f1), cudaFree(fsw);
                }
                free(wg), free(wu), free(bg), free(bu), free(x), free(g), free(u), free(ref);
                free(w17);
                cudaFree(dx), cudaFree(dwg), cudaFree(dwu), cudaFree(dbg), cudaFree(dbu), cudaFree(dg);
                cudaFree(du), cudaFree(dout), cudaFree(uout), cudaFree(dw17);
                cudaFree(p0), cudaFree(p1), cudaFree(p2), cudaFree(u17);
            }
}

/* Random quantized [N, K] weights made directly in the format (quants
 * uniform over their range, q8 in [-127, 127]; scales in [0, 1/127] or
 * [0, 1/8], so |w| <= 1): fast enough for the model-sized matrices below,
 * where og_quantize_rows on random floats would take most of the test. */
static void *rand_q_fast(og_dtype dt, int64_t N, int64_t K, size_t *bytes) {
    const int64_t shape[2] = {N, K};
    int64_t nb = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &nb));
    uint8_t *w = malloc((size_t)nb);
    const size_t nq = (size_t)(N * K) / (dt == OG_DTYPE_Q4 ? 2 : 1);
    uint64_t st = 0x9e3779b97f4a7c15ull ^ (uint64_t)(N * 131 + K);
    for (size_t i = 0; i < nq; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        uint8_t b = (uint8_t)(st >> 32);
        if (dt == OG_DTYPE_Q8 && b == 0x80) b = 0x81; /* -128 is outside q8's range */
        w[i] = b;
    }
    og_f16 *sc = (og_f16 *)(w + nq);
    const size_t ns = ((size_t)nb - nq) / 2;
    for (size_t i = 0; i < ns; i++)
        sc[i] = og_f16_from_f32(og_rng_uniform(&rng, 0, 1) / (dt == OG_DTYPE_Q4 ? 8.0f : 127.0f));
    *bytes = (size_t)nb;
    return w;
}

/* The decode products of three model shapes (0.6B, 8B and a 32B-like one:
 * q/k/v in one multi-part launch, o, gate/up with the swiglu epilogue,
 * down), q8 and q4, T = 1..8, against og_matmul_ref (computed once for 8
 * rows: a row's output does not depend on the others) at the products'
 * tolerance, with OG_CUDA_GEMVQ on (og_gemvq_cuda_set); cases past its
 * shared memory (T x K > 28160 floats) take the other kernels.
 * OG_CUDA_TEST_QUICK=1 (the sanitizer runs) keeps the 0.6B shape only. */
static void test_quant_model_shapes(void) {
    og_test_section(og_gemvq_cuda_get() == 1 ? "quantized: model-shaped products, OG_CUDA_GEMVQ=ring"
                                        : "quantized: model-shaped products");
    typedef struct {
        const char *model;
        int64_t H, I, q, kv, o_in;
    } mshape;
    const mshape ms[] = {{"0.6b", 1024, 3072, 2048, 1024, 2048},
                         {"8b", 4096, 12288, 4096, 1024, 4096},
                         {"32b", 5120, 25600, 8192, 1024, 8192}};
    const char *quick = getenv("OG_CUDA_TEST_QUICK");
    const int n_models = quick && quick[0] == '1' ? 1 : 3;
    enum { TM = OG_GEMV_CUDA_MAX_T };
    for (int mi = 0; mi < n_models; mi++)
        for (int q = 0; q < 2; q++) {
            const mshape *m = &ms[mi];
            const og_dtype dt = q ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
            char what[160];
            /* product 0: q/k/v (3 parts, a bias on q), 1: o, 2: gate/up + swiglu, 3: down */
            for (int pi = 0; pi < 4; pi++) {
                const int64_t K = pi == 1 ? m->o_in : pi == 3 ? m->I : m->H;
                const int n_w = pi == 0 ? 3 : pi == 2 ? 2 : 1;
                int64_t Ns[3] = {pi == 0 ? m->q : pi == 1 ? m->H : pi == 2 ? m->I : m->H, m->kv, pi == 2 ? m->I : m->kv};
                if (pi == 2) Ns[1] = m->I;
                void *w[3], *dw[3];
                float *ref[3], *dout[3];
                float *x = rand_f32((size_t)(TM * K)), *bias = rand_f32((size_t)Ns[0]);
                float *dx = up(x, (size_t)(TM * K) * 4), *dbias = up(bias, (size_t)Ns[0] * 4);
                for (int i = 0; i < n_w; i++) {
                    size_t nb;
                    w[i] = rand_q_fast(dt, Ns[i], K, &nb);
                    dw[i] = up(w[i], nb);
                    ref[i] = malloc((size_t)(TM * Ns[i]) * 4);
                    CHECK_OK(og_matmul_ref(x, w[i], pi == 0 && i == 0 ? bias : NULL, dt, TM, K, Ns[i], ref[i]));
                    dout[i] = poisoned((size_t)(TM * Ns[i]));
                }
                float *sw_ref = NULL;
                if (pi == 2) {
                    sw_ref = malloc((size_t)(TM * Ns[0]) * 4);
                    CHECK_OK(og_swiglu_ref(ref[0], ref[1], TM, Ns[0], sw_ref));
                }
                static const char *names[] = {"qkv", "o", "gate_up_swiglu", "down"};
                for (int64_t T = 1; T <= TM; T++) {
                    snprintf(what, sizeof what, "%s %s %s T=%lld K=%lld", m->model, names[pi], og_dtype_name(dt),
                             (long long)T, (long long)K);
                    if (pi == 0) {
                        og_gemv_cuda_part parts[3];
                        for (int i = 0; i < 3; i++)
                            parts[i] = (og_gemv_cuda_part){dw[i], i == 0 ? dbias : NULL, Ns[i], dout[i]};
                        CHECK_OK(og_gemv_multi_cuda(NULL, dx, dt, T, K, parts, 3));
                    } else if (pi == 2) {
                        CHECK_OK(og_gemv_swiglu_cuda(NULL, dx, dw[0], NULL, dw[1], NULL, dt, T, K, Ns[0], dout[0]));
                    } else {
                        CHECK_OK(og_gemv_cuda(NULL, dx, dw[0], NULL, dt, T, K, Ns[0], dout[0]));
                    }
                    if (pi == 2) {
                        float *got = down(dout[0], (size_t)(T * Ns[0]));
                        compare_swiglu(what, got, ref[0], ref[1], sw_ref, (size_t)(T * Ns[0]), K);
                        free(got);
                    } else {
                        for (int i = 0; i < n_w; i++) {
                            float *got = down(dout[i], (size_t)(T * Ns[i]));
                            compare(what, got, ref[i], (size_t)(T * Ns[i]), prod_atol * sqrt((double)K), 1e-5);
                            free(got);
                        }
                    }
                }
                for (int i = 0; i < n_w; i++) {
                    free(w[i]), free(ref[i]);
                    cudaFree(dw[i]), cudaFree(dout[i]);
                }
                free(x), free(bias), free(sw_ref);
                cudaFree(dx), cudaFree(dbias);
            }
        }
}

static void test_argmax(void) {
    og_test_section("argmax");
    const int64_t Vs[] = {1, 2, 1023, 1025, 32769, 151936}; /* 32769: one past a full pass of the blocks */
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, og_argmax_cuda_scratch_bytes()));
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        for (int variant = 0; variant < 4; variant++) {
            const int64_t V = Vs[vi];
            float *x = rand_f32((size_t)V);
            if (variant == 1 && V > 3) x[V - 1] = x[V / 2] = x[1] = 2.0f;  /* ties: the first wins */
            if (variant == 2 && V > 3) x[V - 2] = x[V / 3 + 1] = NAN;      /* the first NaN wins   */
            if (variant == 3) for (int64_t i = 0; i < V; i++) x[i] = -1.0f; /* all equal: index 0  */
            int64_t want = -1;
            CHECK_OK(og_argmax_ref(x, V, &want));
            float *dx = up(x, (size_t)V * 4);
            int32_t *didx = NULL, got = -1;
            CK(cudaMalloc((void **)&didx, 4));
            CHECK_OK(og_argmax_cuda(NULL, dx, V, didx, scratch));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(&got, didx, 4, cudaMemcpyDeviceToHost));
            CHECK_MSG(got == want, "argmax V=%lld variant %d: got %d, want %lld", (long long)V, variant, got,
                      (long long)want);
            free(x);
            cudaFree(dx), cudaFree(didx);
        }
    }
    cudaFree(scratch);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    rng = og_rng_seed(77001);
    if (getenv("OG_CUDA_TEST_SPLIT_ONLY") && getenv("OG_CUDA_TEST_SPLIT_ONLY")[0] == '1') { /* a sanitizer's run */
        test_split();
        return og_test_finish();
    }
    if (getenv("OG_CUDA_TEST_NARROW_ONLY") && getenv("OG_CUDA_TEST_NARROW_ONLY")[0] == '1') { /* a sanitizer's run */
        test_narrow();
        return og_test_finish();
    }
    const bool quant_only = getenv("OG_CUDA_TEST_QUANT_ONLY") && getenv("OG_CUDA_TEST_QUANT_ONLY")[0] == '1';
    if (quant_only) { /* a sanitizer's run: the q8 / q4 products with gemv_q.cu at every T */
        og_gemvq_cuda_set(1);
        prod_atol = 4e-5;
        test_quant_matmul();
        test_quant_fused();
        test_quant_model_shapes();
        return og_test_finish();
    }
    test_matmul_first_staged(); /* first: no launch before it may have asked for the shared memory */
    test_matmul();
    test_rows();
    test_fused();
    test_split();
    test_quant_embed();
    test_narrow();
    /* the q8 / q4 products with the bandwidth-first kernel off, then on
     * (OG_CUDA_GEMVQ=ring), whatever the environment asked */
    const int gemvq = og_gemvq_cuda_set(0);
    for (int on = 0; on < 2; on++) {
        og_gemvq_cuda_set(on);
        prod_atol = on ? 4e-5 : 1e-5;
        og_test_section(on ? "==== q8 / q4 products, OG_CUDA_GEMVQ=ring" : "==== q8 / q4 products, OG_CUDA_GEMVQ off");
        test_quant_matmul();
        test_quant_fused();
        if (on) test_quant_model_shapes(); /* the new kernel's model shapes (their references take a while) */
    }
    og_gemvq_cuda_set(gemvq);
    prod_atol = 1e-5;
    test_argmax();
    return og_test_finish();
}
#endif
