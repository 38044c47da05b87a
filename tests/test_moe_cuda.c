/* The moe kernels on the GPU (kernels/cuda/moe_cuda.h) against the C
 * reference og_moe_ref (kernels/moe.h): f32 / bf16 / q8 / q4 expert stacks,
 * with and without the gated shared expert, odd sizes, a 128-expert top-8
 * layer of decode and of prefill widths, outputs poisoned; each row alone
 * gives the same bits as in the batch (every (row, expert) product is summed
 * in one order whatever the other rows pick); routing ties go to the lower
 * expert index, as on the CPU; the grouped GEMM on the tensor cores (switched
 * on by og_moe_cuda_set_gemm) against the same reference and bounds, at
 * prefill widths and uneven expert loads; refusals.
 * Skipped (77) without a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/moe.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>

static void *stack(og_rng *rng, og_dtype dt, int64_t E, int64_t N, int64_t K, float s, size_t *bytes_out) {
    const int64_t shape[3] = {E, N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 3, shape, &bytes));
    void *w = malloc((size_t)bytes);
    float *src = malloc(sizeof(float) * (size_t)(N * K));
    for (int64_t e = 0; e < E; e++) {
        og_rng_fill(rng, src, (size_t)(N * K), -s, s);
        if (og_dtype_is_quantized(dt)) {
            CHECK_OK(og_quantize_rows(dt, src, N, K, (void *)og_moe_expert(w, dt, e, N, K)));
        } else {
            for (int64_t i = 0; i < N * K; i++) og_store_f32(w, dt, (size_t)(e * N * K + i), src[i]);
        }
    }
    free(src);
    *bytes_out = (size_t)bytes;
    return w;
}

static void *up(const void *h, size_t n) {
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 1));
    if (h && n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); /* h NULL: an output buffer */
    return d;
}

/* skew: 0 plain logits; 1 a third of the experts never picked (their
 * logits lowered by 30) and expert 1 picked by every row (raised by 8),
 * so that some experts have no rows and one has T, over several GEMM tiles.
 * gemm: the grouped GEMM switched on (og_moe_cuda_set_gemm). */
static void check_case_ex(og_rng *rng, og_dtype gdt, og_dtype ddt, int64_t T, int64_t H, int64_t F, int64_t E,
                          int32_t k, bool norm, bool shared, bool ties, int skew, bool gemm) {
    og_moe_cuda_set_gemm(gemm);
    const size_t xs = sizeof(float) * (size_t)(T * H);
    float *x = malloc(xs), *lg = malloc(sizeof(float) * (size_t)(T * E)), *sh = malloc(xs),
          *sg = malloc(sizeof(float) * (size_t)T), *ref = malloc(xs), *got = malloc(xs), *alone = malloc(xs);
    og_rng_fill(rng, x, (size_t)(T * H), -1.5f, 1.5f);
    og_rng_fill(rng, lg, (size_t)(T * E), -2.0f, 2.0f);
    if (ties) /* logits that are exact halves: equal probabilities */
        for (int64_t i = 0; i < T * E; i++) lg[i] = (float)(int)(lg[i] * 2) / 2;
    if (skew)
        for (int64_t t = 0; t < T; t++)
            for (int64_t e = 0; e < E; e++) lg[t * E + e] += e == 1 ? 8.0f : e % 3 == 2 ? -30.0f : 0.0f;
    og_rng_fill(rng, sh, (size_t)(T * H), -1.0f, 1.0f);
    og_rng_fill(rng, sg, (size_t)T, -3.0f, 3.0f);
    size_t gb, db;
    void *gu = stack(rng, gdt, E, 2 * F, H, 1.7f / sqrtf((float)H), &gb);
    void *dn = stack(rng, ddt, E, H, F, 1.7f / sqrtf((float)F), &db);
    og_moe_args a = {.x = x, .logits = lg, .gate_up = gu, .gate_up_dtype = gdt, .down = dn, .down_dtype = ddt,
                     .shared = shared ? sh : NULL, .shared_gate = shared ? sg : NULL, .T = T, .H = H, .F = F, .E = E,
                     .top_k = k, .norm_topk_prob = norm, .out = ref};
    CHECK_OK(og_moe_ref(&a));
    float *dx = up(x, xs), *dl = up(lg, sizeof(float) * (size_t)(T * E)), *dsh = up(sh, xs),
          *dsg = up(sg, sizeof(float) * (size_t)T), *dout = up(NULL, xs);
    void *dgu = up(gu, gb), *ddn = up(dn, db);
    void *scratch = NULL;
    const size_t sb = og_moe_cuda_scratch_bytes(T, k, E, H, F);
    CHECK(sb > 0);
    CK(cudaMalloc(&scratch, sb));
    CK(cudaMemset(dout, 0xff, xs)); /* NaN: a row never written shows */
    og_moe_cuda_args ca = {.x = dx, .logits = dl, .gate_up = dgu, .gate_up_dtype = gdt, .down = ddn,
                           .down_dtype = ddt, .shared = shared ? dsh : NULL, .shared_gate = shared ? dsg : NULL,
                           .T = T, .H = H, .F = F, .E = E, .top_k = k, .norm_topk_prob = norm, .out = dout};
    CHECK_OK(og_moe_cuda(NULL, &ca, scratch));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, xs, cudaMemcpyDeviceToHost));
    char what[160];
    snprintf(what, sizeof what, "%s/%s T %lld H %lld F %lld E %lld k %d norm %d shared %d ties %d skew %d gemm %d",
             og_dtype_name(gdt), og_dtype_name(ddt), (long long)T, (long long)H, (long long)F, (long long)E, k, norm,
             shared, ties, skew, gemm);
    /* f32 sums of at most max(H, F) unit-scale products in another order
     * than the reference's (test_moe.c's bound); equal expf results on both
     * sides keep the routing identical, ties included */
    CHECK_MSG(og_tol_ratio(got, ref, (size_t)(T * H), 1e-4, 1e-4, NULL) <= 1, "cuda vs ref: %s", what);
    for (int64_t t = 0; t < T; t++) {
        og_moe_cuda_args b = ca;
        b.x = dx + t * H;
        b.logits = dl + t * E;
        b.shared = shared ? dsh + t * H : NULL;
        b.shared_gate = shared ? dsg + t : NULL;
        b.T = 1;
        b.out = dout + t * H;
        CHECK_OK(og_moe_cuda(NULL, &b, scratch));
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(alone, dout, xs, cudaMemcpyDeviceToHost));
    /* the grouped GEMM takes this step (moe_cuda.h): 64 pairs or more and a
     * bf16 matrix whose K is a multiple of 8 */
    const bool on_mma = gemm && T * k >= 64 &&
                        ((gdt == OG_DTYPE_BF16 && H % 8 == 0) || (ddt == OG_DTYPE_BF16 && F % 8 == 0));
    if (!on_mma) {
        CHECK_MSG(memcmp(alone, got, xs) == 0, "rows alone differ from the batch: %s", what);
    } else {
        /* rows alone take the CUDA cores: the same bound against each other */
        CHECK_MSG(og_tol_ratio(alone, got, (size_t)(T * H), 1e-4, 1e-4, NULL) <= 1, "rows alone vs batch: %s", what);
        /* and the batch did not: its x carried as bf16 hi + lo moves the bits */
        og_moe_cuda_set_gemm(false);
        CHECK_OK(og_moe_cuda(NULL, &ca, scratch));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(alone, dout, xs, cudaMemcpyDeviceToHost));
        CHECK_MSG(memcmp(alone, got, xs) != 0, "the batch gave the CUDA cores' bits (GEMM not taken?): %s", what);
        og_moe_cuda_set_gemm(true);
        /* and again: the same bits (no state kept between calls) */
        CHECK_OK(og_moe_cuda(NULL, &ca, scratch));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(alone, dout, xs, cudaMemcpyDeviceToHost));
        CHECK_MSG(memcmp(alone, got, xs) == 0, "the GEMM's bits changed between calls: %s", what);
    }
    cudaFree(dx), cudaFree(dl), cudaFree(dsh), cudaFree(dsg), cudaFree(dout), cudaFree(dgu), cudaFree(ddn);
    cudaFree(scratch);
    free(x), free(lg), free(sh), free(sg), free(ref), free(got), free(alone), free(gu), free(dn);
}

static void check_case(og_rng *rng, og_dtype gdt, og_dtype ddt, int64_t T, int64_t H, int64_t F, int64_t E,
                       int32_t k, bool norm, bool shared, bool ties) {
    check_case_ex(rng, gdt, ddt, T, H, F, E, k, norm, shared, ties, 0, false);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    og_rng rng = og_rng_seed(2027);
    const bool quick = getenv("OG_CUDA_TEST_QUICK") != NULL;
    og_test_section("og_moe_cuda against og_moe_ref");
    for (int d = 0; d < 2; d++) {
        const og_dtype dt = d ? OG_DTYPE_BF16 : OG_DTYPE_F32;
        check_case(&rng, dt, dt, 1, 17, 7, 5, 2, true, false, false);
        check_case(&rng, dt, dt, 3, 33, 13, 8, 3, false, true, false);
        check_case(&rng, dt, dt, 17, 16, 24, 4, 1, true, true, true);
        check_case(&rng, dt, dt, 40, 24, 9, 16, 4, true, false, true);
    }
    check_case(&rng, OG_DTYPE_Q8, OG_DTYPE_Q8, 5, 64, 32, 8, 2, true, true, false);
    check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 19, 96, 32, 8, 2, false, false, false);
    check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q8, 7, 32, 64, 6, 3, true, true, true);
    og_test_section("a 128-expert top-8 layer (Qwen3-30B-A3B's routing, small widths)");
    check_case(&rng, OG_DTYPE_BF16, OG_DTYPE_BF16, 1, 256, 96, 128, 8, true, false, false);
    check_case(&rng, OG_DTYPE_BF16, OG_DTYPE_BF16, quick ? 16 : 64, 256, 96, 128, 8, true, false, false);
    if (!quick) check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 200, 256, 96, 128, 8, true, true, false);
    og_test_section("the CUDA-core products by chunks (mode 2), 8 weights a lane (1), one element (0)");
    /* decode (one token), a few tokens, more than 8 pairs of one expert
     * (skew: ties send rows to the same experts), quantized steps past the
     * GEMM's threshold (they stay on the CUDA cores), mixed types, one
     * matrix on the vector path and the other not (F 96) */
    for (int v = 2; v >= 0; v--) { /* the chunk products, the 8-a-lane ones, then the element ones on the same cases */
        og_moe_cuda_set_vec(v);
        check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 1, 512, 256, 16, 4, true, true, false);
        check_case(&rng, OG_DTYPE_Q8, OG_DTYPE_Q8, 5, 256, 256, 8, 2, false, false, false);
        check_case(&rng, OG_DTYPE_BF16, OG_DTYPE_BF16, 1, 256, 512, 32, 8, true, false, false);
        check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 40, 256, 256, 8, 2, true, true, true);
        check_case(&rng, OG_DTYPE_BF16, OG_DTYPE_Q4, 3, 768, 256, 8, 3, true, false, false);
        check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q8, 9, 256, 96, 8, 2, true, true, false);
        check_case(&rng, OG_DTYPE_Q8, OG_DTYPE_Q4, 2, 1280, 512, 8, 2, true, false, false); /* 5 rounds of k */
        /* K whole chunks but not whole 256s (q4 K 96 and 64: 3 and 2 chunks
         * of a group), a feature count that is not whole warps of 4 (bf16 N
         * 42, down K 21: not a chunk of 8, so the element path), 4 and 8
         * pairs at once over experts with more pairs than that */
        check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 1, 96, 64, 8, 2, true, false, false);
        check_case(&rng, OG_DTYPE_Q4, OG_DTYPE_Q4, 4, 96, 64, 4, 3, true, true, true);
        check_case(&rng, OG_DTYPE_BF16, OG_DTYPE_BF16, 6, 40, 21, 4, 2, false, false, true);
        check_case(&rng, OG_DTYPE_Q8, OG_DTYPE_Q8, 33, 160, 64, 4, 2, true, false, true);
    }
    og_moe_cuda_set_vec(2);
    og_test_section("the grouped GEMM on the tensor cores (OG_CUDA_MOE_GEMM=1)");
    /* 1 token of top 64 of 64 (64 pairs, one row per expert); 7 tokens of
     * top 16; 64 and 300 tokens of 128 experts top 8; sizes whose K and N
     * are not whole stages or tiles (200 = 6 x 32 + 8, 72); uneven loads
     * (skew: experts with no rows, one with every row); f32 and q8 beside
     * bf16 (the f32 / q8 matrix keeps the CUDA cores); below the threshold
     * (decode) on the CUDA cores */
    const og_dtype BF = OG_DTYPE_BF16;
    check_case_ex(&rng, BF, BF, 1, 64, 32, 64, 64, true, false, false, 0, true);
    check_case_ex(&rng, BF, BF, 7, 128, 48, 32, 16, true, true, false, 0, true);
    check_case_ex(&rng, BF, BF, 7, 200, 72, 32, 16, false, false, true, 1, true);
    check_case_ex(&rng, BF, BF, 64, 256, 96, 128, 8, true, false, false, 0, true);
    check_case_ex(&rng, BF, BF, 64, 200, 72, 16, 2, true, true, false, 1, true);
    check_case_ex(&rng, BF, BF, quick ? 100 : 300, 256, 96, 128, 8, true, false, false, 0, true);
    check_case_ex(&rng, BF, BF, quick ? 100 : 300, 136, 200, 8, 2, true, true, false, 1, true);
    check_case_ex(&rng, BF, OG_DTYPE_F32, 40, 64, 40, 8, 2, true, false, false, 0, true);
    check_case_ex(&rng, OG_DTYPE_Q8, BF, 40, 64, 40, 8, 2, false, false, false, 1, true);
    check_case_ex(&rng, BF, BF, 4, 256, 96, 128, 8, true, false, false, 0, true); /* 32 pairs: CUDA cores */
    check_case_ex(&rng, BF, BF, 30, 20, 12, 8, 4, true, false, false, 0, true);   /* K not a multiple of 8 */
    og_moe_cuda_set_gemm(false);
    og_test_section("refusals");
    float dummy = 0;
    og_moe_cuda_args bad = {.x = &dummy, .logits = &dummy, .gate_up = &dummy, .gate_up_dtype = OG_DTYPE_F32,
                            .down = &dummy, .down_dtype = OG_DTYPE_F32, .T = 1, .H = 8, .F = 4, .E = 4, .top_k = 5,
                            .out = &dummy};
    CHECK_STATUS(og_moe_cuda(NULL, &bad, &dummy), OG_ERR_INVALID_ARGUMENT);
    bad.top_k = 2;
    bad.gate_up_dtype = OG_DTYPE_I32;
    CHECK_STATUS(og_moe_cuda(NULL, &bad, &dummy), OG_ERR_UNSUPPORTED);
    return og_test_finish();
}
#endif
