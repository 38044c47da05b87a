/* The moe kernels on the GPU (kernels/cuda/moe_cuda.h) against the C
 * reference og_moe_ref (kernels/moe.h): f32 / bf16 / q8 / q4 expert stacks,
 * with and without the gated shared expert, odd sizes, a 128-expert top-8
 * layer of decode and of prefill widths, outputs poisoned; each row alone
 * gives the same bits as in the batch (every (row, expert) product is summed
 * in one order whatever the other rows pick); routing ties go to the lower
 * expert index, as on the CPU; refusals.
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

static void check_case(og_rng *rng, og_dtype gdt, og_dtype ddt, int64_t T, int64_t H, int64_t F, int64_t E,
                       int32_t k, bool norm, bool shared, bool ties) {
    const size_t xs = sizeof(float) * (size_t)(T * H);
    float *x = malloc(xs), *lg = malloc(sizeof(float) * (size_t)(T * E)), *sh = malloc(xs),
          *sg = malloc(sizeof(float) * (size_t)T), *ref = malloc(xs), *got = malloc(xs), *alone = malloc(xs);
    og_rng_fill(rng, x, (size_t)(T * H), -1.5f, 1.5f);
    og_rng_fill(rng, lg, (size_t)(T * E), -2.0f, 2.0f);
    if (ties) /* logits that are exact halves: equal probabilities */
        for (int64_t i = 0; i < T * E; i++) lg[i] = (float)(int)(lg[i] * 2) / 2;
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
    snprintf(what, sizeof what, "%s/%s T %lld H %lld F %lld E %lld k %d norm %d shared %d ties %d",
             og_dtype_name(gdt), og_dtype_name(ddt), (long long)T, (long long)H, (long long)F, (long long)E, k, norm,
             shared, ties);
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
    CHECK_MSG(memcmp(alone, got, xs) == 0, "rows alone differ from the batch: %s", what);
    cudaFree(dx), cudaFree(dl), cudaFree(dsh), cudaFree(dsg), cudaFree(dout), cudaFree(dgu), cudaFree(ddn);
    cudaFree(scratch);
    free(x), free(lg), free(sh), free(sg), free(ref), free(got), free(alone), free(gu), free(dn);
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
