/* The mixture-of-experts layer on CUDA (moe_cuda.h) at prefill widths: the
 * grouped products on the CUDA cores ("cores", the default) against the
 * grouped GEMM on the tensor cores ("mma", og_moe_cuda_set_gemm, the switch
 * OG_CUDA_MOE_GEMM=1 sets), at the Qwen3-30B-A3B expert shape: hidden 2048,
 * 128 experts of intermediate 768, top 8, bf16 expert weights (1.2 GB),
 * prefills of 512 and 4096 tokens (and any given as arguments).
 * One whole og_moe_cuda call (route, group, gate_up, SwiGLU, down, combine)
 * timed by CUDA events, median of REPS after a warm-up. TFLOP/s counts the
 * products' 2 * T * k * (2F * H + H * F) operations (the mma kernel does
 * twice that on the tensor cores: x is carried as bf16 hi + lo). Also the
 * largest difference between the two outputs relative to the largest output
 * (they agree to the split's 2^-16 and the order of the sums). One JSON line
 * per case, a table last.
 *   bench_moe_cuda [tokens ...]
 * Router logits, x and the weights are random (uniform; every expert gets
 * rows at these widths). Without CUDA it says so and exits 77. */
#include "core/core.h"

#include <stdio.h>

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/ops_cuda.h"

#include "cuda_bench.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { REPS = 10, MAX_CASES = 16 };
static const int64_t H = 2048, E = 128, F = 768;
static const int32_t K_TOP = 8;

static uint64_t g_seed = 88172645463325252ull;
static float uniform(float lo, float hi) {
    g_seed ^= g_seed << 13, g_seed ^= g_seed >> 7, g_seed ^= g_seed << 17;
    return lo + (hi - lo) * (float)((double)(g_seed >> 11) / 9007199254740992.0);
}

/* A device stack [E, N, K] of bf16 values uniform in (-s, s): a host tile
 * of 16 Mi values (bf16 rounded down from f32) copied over and over. */
static void *bf16_stack(int64_t N, int64_t K, float s) {
    const size_t n = (size_t)(E * N * K), tile = (size_t)16 << 20;
    uint16_t *h = malloc(tile * sizeof *h);
    if (!h) exit(2);
    for (size_t i = 0; i < tile; i++) {
        const float v = uniform(-s, s);
        uint32_t b;
        memcpy(&b, &v, 4);
        h[i] = (uint16_t)(b >> 16);
    }
    void *d = NULL;
    CK(cudaMalloc(&d, n * 2));
    for (size_t at = 0; at < n; at += tile)
        CK(cudaMemcpy((char *)d + at * 2, h, (n - at < tile ? n - at : tile) * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static float time_call(cudaStream_t st, const og_moe_cuda_args *a, void *scratch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    for (int r = -2; r < REPS; r++) {
        CK(cudaEventRecord(e0, st));
        if (og_moe_cuda(st, a, scratch) != OG_OK) {
            fprintf(stderr, "og_moe_cuda: %s\n", og_last_error());
            exit(1);
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (r >= 0) CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms[REPS / 2];
}

typedef struct {
    int64_t T;
    double cores_ms, mma_ms, cores_tflops, mma_tflops, diff;
} result;

int main(int argc, char **argv) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    int64_t Ts[MAX_CASES] = {512, 4096};
    int n_t = 2;
    if (argc > 1) {
        n_t = 0;
        for (int i = 1; i < argc && n_t < MAX_CASES; i++)
            if (atoll(argv[i]) > 0) Ts[n_t++] = atoll(argv[i]);
    }
    int64_t T_max = 0;
    for (int i = 0; i < n_t; i++) T_max = Ts[i] > T_max ? Ts[i] : T_max;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *gu = bf16_stack(2 * F, H, 1.7f / sqrtf((float)H)), *dn = bf16_stack(H, F, 1.7f / sqrtf((float)F));
    float *hx = malloc(sizeof(float) * (size_t)(T_max * H)), *hl = malloc(sizeof(float) * (size_t)(T_max * E)),
          *o1 = malloc(sizeof(float) * (size_t)(T_max * H)), *o2 = malloc(sizeof(float) * (size_t)(T_max * H));
    if (!hx || !hl || !o1 || !o2) return 2;
    for (int64_t i = 0; i < T_max * H; i++) hx[i] = uniform(-1.5f, 1.5f);
    for (int64_t i = 0; i < T_max * E; i++) hl[i] = uniform(-2.0f, 2.0f);
    float *x = NULL, *lg = NULL, *out = NULL;
    CK(cudaMalloc((void **)&x, sizeof(float) * (size_t)(T_max * H)));
    CK(cudaMalloc((void **)&lg, sizeof(float) * (size_t)(T_max * E)));
    CK(cudaMalloc((void **)&out, sizeof(float) * (size_t)(T_max * H)));
    CK(cudaMemcpy(x, hx, sizeof(float) * (size_t)(T_max * H), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(lg, hl, sizeof(float) * (size_t)(T_max * E), cudaMemcpyHostToDevice));
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, og_moe_cuda_scratch_bytes(T_max, K_TOP, E, H, F)));
    result res[MAX_CASES];
    for (int i = 0; i < n_t; i++) {
        const int64_t T = Ts[i];
        const og_moe_cuda_args a = {.x = x, .logits = lg, .gate_up = gu, .gate_up_dtype = OG_DTYPE_BF16, .down = dn,
                                    .down_dtype = OG_DTYPE_BF16, .T = T, .H = H, .F = F, .E = E, .top_k = K_TOP,
                                    .norm_topk_prob = true, .out = out};
        const double flop = 2.0 * (double)(T * K_TOP) * (double)(2 * F * H + H * F);
        og_moe_cuda_set_gemm(false);
        const double cores = time_call(st, &a, scratch);
        CK(cudaMemcpy(o1, out, sizeof(float) * (size_t)(T * H), cudaMemcpyDeviceToHost));
        og_moe_cuda_set_gemm(true);
        const double mma = time_call(st, &a, scratch);
        CK(cudaMemcpy(o2, out, sizeof(float) * (size_t)(T * H), cudaMemcpyDeviceToHost));
        double big = 0, diff = 0;
        for (int64_t j = 0; j < T * H; j++) {
            big = fmax(big, fabs((double)o1[j]));
            diff = fmax(diff, fabs((double)o1[j] - (double)o2[j]));
        }
        res[i] = (result){T, cores, mma, flop / (cores * 1e-3) / 1e12, flop / (mma * 1e-3) / 1e12, diff / big};
        printf("{\"bench\":\"moe_prefill\",\"T\":%lld,\"H\":%lld,\"E\":%lld,\"top_k\":%d,\"F\":%lld,\"weights\":\"bf16\","
               "\"cores_ms\":%.3f,\"mma_ms\":%.3f,\"cores_tflops\":%.2f,\"mma_tflops\":%.2f,\"speedup\":%.2f,"
               "\"max_diff_rel\":%.2e}\n",
               (long long)T, (long long)H, (long long)E, K_TOP, (long long)F, cores, mma, res[i].cores_tflops,
               res[i].mma_tflops, cores / mma, res[i].diff);
        fflush(stdout);
    }
    og_moe_cuda_set_gemm(false);
    printf("\nmoe layer prefill, hidden %lld, %lld experts of %lld, top %d, bf16 experts\n", (long long)H,
           (long long)E, (long long)F, K_TOP);
    printf("%8s %10s %10s %12s %12s %8s %10s\n", "tokens", "cores ms", "mma ms", "cores TF/s", "mma TF/s", "speedup",
           "max diff");
    for (int i = 0; i < n_t; i++)
        printf("%8lld %10.3f %10.3f %12.2f %12.2f %8.2f %10.2e\n", (long long)res[i].T, res[i].cores_ms,
               res[i].mma_ms, res[i].cores_tflops, res[i].mma_tflops, res[i].cores_ms / res[i].mma_ms, res[i].diff);
    int rc = 0;
    for (int i = 0; i < n_t; i++)
        if (!(res[i].diff <= 1e-3)) {
            fprintf(stderr, "T %lld: the two kernels' outputs differ by %.2e of the largest\n", (long long)res[i].T,
                    res[i].diff);
            rc = 1;
        }
    cudaFree(gu), cudaFree(dn), cudaFree(x), cudaFree(lg), cudaFree(out), cudaFree(scratch);
    free(hx), free(hl), free(o1), free(o2);
    return rc;
}
#endif
