/* update_and_attend on CUDA against the plain C reference (og_update_and_attend_ref)
 * on odd sizes: T of 1, 3, 17, 129; histories 0, 1, 255, 257, 4097; flat and
 * ring (wrapping) layers, windows 37, 100 and 1000; GQA ratios 1, 3, 4, 8
 * (and 12: two head chunks); head dims 64 and 128 (and 8); bf16 and f32
 * storage. Fresh random inputs per case, outputs poisoned before each run,
 * the written storage rows compared exactly. Every case runs the split-K
 * kernel twice on one scratch (the second run checks that the first left
 * its split counters at 0); steps the tiled tensor-core kernel takes (T > 1,
 * bf16 storage, D 64/128) then run tiled.
 *
 * Tolerance, split-K: both sides read the same stored (bf16-rounded) keys
 * and values and accumulate in f32; only the order of the sums and exp2 of
 * pre-scaled scores against exp differ. Over at most ~4k keys that is well
 * under 1e-5 relative per output; outputs are convex mixes of values in
 * [-1, 1], so atol 5e-5 + rtol 5e-4 leaves a margin while a wrong or missing
 * key moves an output by ~1e-3 or more.
 * Tolerance, tiled: the weights p are rounded to bf16 (relative error at
 * most 2^-9) before P x V while the row sums use the unrounded p, so an
 * output moves by at most 2^-9 max|v| = 1.95e-3 (|v| <= 1); q carried as
 * bf16 hi + lo adds ~2^-17 relative to the scores. Elementwise bound: atol
 * 2.2e-3. The rounding errors are independent, so over a whole case they
 * average out: ||got - ref|| / ||ref|| must also stay under 1e-2, which a
 * missing key tile or a wrong head breaks.
 * OG_CUDA_TEST_QUICK=1 keeps T <= 17 and histories <= 257 (sanitizer runs).
 * Skipped (77) without a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/attend.h"
#include "kernels/cuda/ops_cuda.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>

typedef struct attend_case {
    og_kv_policy policy;
    int32_t T, Hkv, G, D, W;
    int64_t L;
    og_dtype dtype;
    float scale;
} attend_case;

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void run_case(const attend_case *c, og_rng *rng, cudaStream_t stream) {
    const int32_t T = c->T, Hkv = c->Hkv, Hq = c->Hkv * c->G, D = c->D;
    const int64_t R = c->policy == OG_KV_FLAT ? c->L + T + 5 : (int64_t)c->W + T + 1; /* ring max_write T + 2 */
    const size_t es = og_dtype_size(c->dtype), row = (size_t)Hkv * (size_t)D;
    const size_t qn = (size_t)T * Hq * D, kn = (size_t)T * row, sn = (size_t)R * row;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *ref = malloc(qn * 4), *got = malloc(qn * 4);
    void *kc = malloc(sn * es), *vc = malloc(sn * es), *kc_got = malloc(sn * es), *vc_got = malloc(sn * es);
    og_rng_fill(rng, q, qn, -1, 1);
    og_rng_fill(rng, k, kn, -1, 1);
    og_rng_fill(rng, v, kn, -1, 1);
    /* history: every stored row random (rows not yet written are random too:
     * a kernel that read them would show) */
    for (size_t i = 0; i < sn; i++) {
        og_store_f32(kc, c->dtype, i, og_rng_uniform(rng, -1, 1));
        og_store_f32(vc, c->dtype, i, og_rng_uniform(rng, -1, 1));
    }
    void *dq = dev_copy(q, qn * 4), *dk = dev_copy(k, kn * 4), *dv = dev_copy(v, kn * 4);
    void *dkc = dev_copy(kc, sn * es), *dvc = dev_copy(vc, sn * es);
    og_poison(got, qn);
    void *dout = dev_copy(got, qn * 4);
    float *partials = NULL;
    const size_t scratch = (size_t)og_attend_cuda_scratch_floats(Hq, D) * 4;
    CK(cudaMalloc((void **)&partials, scratch));
    CK(cudaMemset(partials, 0, scratch)); /* the split counters start at 0 */
    int64_t *dlen = dev_copy(&c->L, sizeof c->L);

    og_kv_layer_view view = {.layer_id = 0, .policy = c->policy, .dtype = c->dtype,
                             .window = c->policy == OG_KV_RING ? c->W : 0, .n_kv_heads = Hkv, .head_dim = D,
                             .rows = R, .length = c->L, .k = kc, .v = vc};
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int32_t t = 0; t < T; t++) pos[t] = (int32_t)(c->L + t);
    og_attend_args ra = {.q = q, .k = k, .v = v, .positions = pos, .out = ref, .T = T, .n_heads = Hq,
                         .scale = c->scale, .kv = view};
    CHECK_OK(og_update_and_attend_ref(&ra)); /* writes kc, vc too */

    /* split-K twice (the second step finds the split counters the first left
     * at 0, and rewrites the same storage rows), then tiled where it applies */
    const bool tiled = og_attend_cuda_tiled(T, c->dtype, D);
    for (int pass = 0; pass < (tiled ? 3 : 2); pass++) {
        og_attend_cuda_args ga = {.q = dq, .k = dk, .v = dv, .out = dout, .T = T, .n_heads = Hq, .scale = c->scale,
                                  .kv = view, .length = dlen, .partials = partials, .split_k = tiled && pass < 2};
        ga.kv.k = dkc, ga.kv.v = dvc;
        og_poison(got, qn);
        CK(cudaMemcpy(dout, got, qn * 4, cudaMemcpyHostToDevice));
        CHECK_OK(og_update_and_attend_cuda(stream, &ga));
        CK(cudaStreamSynchronize(stream));
        CK(cudaMemcpy(got, dout, qn * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(kc_got, dkc, sn * es, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(vc_got, dvc, sn * es, cudaMemcpyDeviceToHost));
        const bool tc = tiled && pass == 2;
        size_t worst = 0;
        double r = og_tol_ratio(got, ref, qn, tc ? 2.2e-3 : 5e-5, tc ? 0.0 : 5e-4, &worst);
        double err2 = 0.0, ref2 = 0.0;
        for (size_t i = 0; i < qn; i++) {
            err2 += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            ref2 += (double)ref[i] * ref[i];
        }
        const double rel = sqrt(err2 / ref2);
        CHECK_MSG(r <= 1.0 && !(rel > (tc ? 1e-2 : 1e-3)),
                  "%s %s %s T=%d L=%lld Hq=%d Hkv=%d D=%d W=%d: ratio %.3g at %zu (got %g, want %g), rel %.3g",
                  tc ? "tiled" : "split-K", c->policy == OG_KV_FLAT ? "flat" : "ring", og_dtype_name(c->dtype), T,
                  (long long)c->L, Hq, Hkv, D, c->W, r, worst, (double)got[worst], (double)ref[worst], rel);
        CHECK_MSG(memcmp(kc_got, kc, sn * es) == 0 && memcmp(vc_got, vc, sn * es) == 0,
                  "storage differs after the step (T=%d L=%lld)", T, (long long)c->L);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dkc), cudaFree(dvc), cudaFree(dout), cudaFree(partials),
        cudaFree(dlen);
    free(q), free(k), free(v), free(ref), free(got), free(kc), free(vc), free(kc_got), free(vc_got), free(pos);
}

/* Malformed arguments are refused before anything is enqueued. */
static void test_refusals(void) {
    og_test_section("refusals");
    float *buf = NULL;
    CK(cudaMalloc((void **)&buf, 1 << 20));
    og_attend_cuda_args a = {.q = buf, .k = buf, .v = buf, .out = buf, .T = 1, .n_heads = 4, .partials = buf,
                             .kv = {.policy = OG_KV_FLAT, .dtype = OG_DTYPE_BF16, .n_kv_heads = 2, .head_dim = 64,
                                    .rows = 8, .length = 0, .k = buf, .v = buf}};
    CHECK_OK(og_update_and_attend_cuda(NULL, &a));
    og_attend_cuda_args b = a;
    b.kv.head_dim = 96;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNSUPPORTED);
    b = a, b.n_heads = 3;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a, b.kv.length = 8;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_CAPACITY);
    b = a, b.kv.k = NULL;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNBOUND);
    b = a, b.kv.policy = OG_KV_RING, b.kv.window = 6, b.T = 4; /* R 8: at most 3 per step */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_WRITE_TOO_WIDE);
    CK(cudaDeviceSynchronize());
    cudaFree(buf);
}

/* The split count follows the live length, not the capacity, and fills
 * about one wave of blocks (4 per SM) at long histories. */
static void test_splits(void) {
    og_test_section("split count");
    const int64_t K = OG_ATTEND_CUDA_SPLIT_KEYS;
    CHECK(og_attend_cuda_splits(1, 1, 32, 8, 132) == 1);
    CHECK(og_attend_cuda_splits(K, 1, 32, 8, 132) == 1);
    CHECK(og_attend_cuda_splits(K + 1, 1, 32, 8, 132) == 2);
    CHECK(og_attend_cuda_splits(16 * K, 1, 32, 8, 132) == 16);
    /* 8 kv heads x 66 splits = 528 blocks = 4 x 132; 65 would leave a gap */
    CHECK(og_attend_cuda_max_splits(1, 32, 8, 132) == 66);
    CHECK(og_attend_cuda_splits(131072, 1, 32, 8, 132) == 66);
    /* G 12 is served in two head chunks: 2 blocks per split */
    CHECK(og_attend_cuda_max_splits(1, 12, 1, 10) == 20);
    CHECK(og_attend_cuda_max_splits(1, 64, 64, 132) == 9);
    CHECK(og_attend_cuda_max_splits(1, 1, 1, 1000) == OG_ATTEND_CUDA_MAX_SPLITS);
    CHECK(og_attend_cuda_max_splits(129, 1, 1, 132) == 1);
    for (int32_t T = 1; T < 300; T += 3) {
        const int32_t s = og_attend_cuda_max_splits(T, 4, 2, 132);
        CHECK_MSG(s >= 1 && (s == 1 || s * T <= OG_ATTEND_CUDA_SPLIT_ROWS), "T=%d: %d splits past the scratch", T, s);
    }
    CHECK(og_attend_cuda_tiled(2, OG_DTYPE_BF16, 128) && og_attend_cuda_tiled(129, OG_DTYPE_BF16, 16));
    CHECK(!og_attend_cuda_tiled(1, OG_DTYPE_BF16, 128) && !og_attend_cuda_tiled(3, OG_DTYPE_F32, 64) &&
          !og_attend_cuda_tiled(3, OG_DTYPE_BF16, 8) && !og_attend_cuda_tiled(3, OG_DTYPE_BF16, 256));
    int32_t prev = 1;
    for (int64_t n = 1; n < 20000; n += 7) {
        int32_t s = og_attend_cuda_splits(n, 3, 8, 2, 132);
        int64_t chunk = (n + s - 1) / s;
        CHECK_MSG(s >= 1 && (s - 1) * chunk < n, "n=%lld: %d splits leave one empty", (long long)n, s);
        CHECK_MSG(s >= prev && (s - 1) * K < n, "n=%lld: %d splits after %d", (long long)n, s, prev);
        prev = s;
    }
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    test_splits();
    test_refusals();
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    og_rng rng = og_rng_seed(20251202);
    const int32_t Ts[] = {1, 3, 17, 129};
    const int64_t Ls[] = {0, 1, 255, 257, 4097};
    const int32_t Gs[] = {1, 3, 4, 8, 12};
    const int32_t Ds[] = {64, 128, 8};
    /* OG_CUDA_TEST_QUICK: the sizes a sanitizer run can afford */
    const bool quick = getenv("OG_CUDA_TEST_QUICK") != NULL;
    int n = 0;
    og_test_section("kernel vs reference");
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++)
                for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++) {
                    /* T = 129 over 4097 keys: G 1 and 4 only, which keeps the reference in seconds */
                    if (Ts[ti] == 129 && Ls[li] > 257 && (Ls[li] != 4097 || (Gs[gi] != 1 && Gs[gi] != 4) || Ds[di] == 8))
                        continue;
                    if (quick && (Ts[ti] > 17 || Ls[li] > 257)) continue;
                    if (Ds[di] == 8 && Gs[gi] == 12) continue;
                    for (int variant = 0; variant < 2; variant++) {
                        attend_case c = {
                            .policy = variant ? OG_KV_RING : OG_KV_FLAT,
                            .T = Ts[ti], .Hkv = Gs[gi] >= 8 ? 1 : 2, .G = Gs[gi], .D = Ds[di],
                            /* windows of 37 / 100 keys, and 1000 over 4097 (several splits) */
                            .W = variant ? (int32_t)(Ls[li] > 1000 ? 1000 : li % 2 ? 100 : 37) : 0, .L = Ls[li],
                            /* prefill mostly bf16 (the tiled kernel), decode alternating */
                            .dtype = (Ts[ti] > 1 ? (n / 2) % 4 == 3 : (n / 2) % 2) ? OG_DTYPE_F32 : OG_DTYPE_BF16,
                            .scale = n % 3 == 0 ? 0.0f : 0.07f,
                        };
                        run_case(&c, &rng, stream);
                        n++;
                    }
                }
    printf("%d cases\n", n);
    CK(cudaStreamDestroy(stream));
    return og_test_finish();
}
#endif
