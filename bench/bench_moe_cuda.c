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
 * and decode widths (1, 8 and 64 tokens, bf16 and q4 experts): the CUDA-core
 * products one element at a time, 8 weights a lane and a 16-byte chunk a
 * lane (og_moe_cuda_set_vec's modes 0, 1 and 2: OG_CUDA_MOE_VEC), each call on
 * a new token's router logits so that it picks other experts than the call
 * before (the q4 experts of one token, 21 MB, would otherwise stay in L2),
 * with the bytes of the experts the calls read over the time:
 *   bench_moe_cuda decode
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

/* A device stack [E, N, K] of q4 matrices (docs/program-format.md: the
 * rows' nibbles, then an f16 scale per group of 32): random nibbles, scale
 * 1/64. Returns one matrix's bytes in *ebytes. */
static void *q4_stack(int64_t N, int64_t K, size_t *ebytes) {
    const size_t q = (size_t)(N * K / 2), sc = (size_t)(N * (K / 32));
    *ebytes = q + sc * 2;
    uint8_t *h = malloc(*ebytes);
    if (!h) exit(2);
    for (size_t i = 0; i < q; i++) h[i] = (uint8_t)(uniform(0.0f, 256.0f));
    for (size_t i = 0; i < sc; i++) h[q + 2 * i] = 0x00, h[q + 2 * i + 1] = 0x24; /* f16 1/64 */
    void *d = NULL;
    CK(cudaMalloc(&d, *ebytes * (size_t)E));
    for (int64_t e = 0; e < E; e++) CK(cudaMemcpy((char *)d + (size_t)e * *ebytes, h, *ebytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Median ms of og_moe_cuda(a); rotate > 0: call r reads x and logits
 * rotate * (r % 16) rows further (16 tokens' worth of rows are there). */
static float time_call_rot(cudaStream_t st, const og_moe_cuda_args *a0, void *scratch, int64_t rotate) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    for (int r = -2; r < REPS; r++) {
        og_moe_cuda_args b = *a0;
        const og_moe_cuda_args *a = &b;
        if (rotate > 0) {
            const int64_t at = rotate * ((r + 2) % 16);
            b.x += at * H, b.logits += at * E;
        }
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

static float time_call(cudaStream_t st, const og_moe_cuda_args *a, void *scratch) {
    return time_call_rot(st, a, scratch, 0);
}

/* The decode widths: element-at-a-time against vector products. */
static int decode_mode(cudaStream_t st) {
    static const int64_t Ts[3] = {1, 8, 64};
    const int64_t T_max = 64 * 16;
    float *hx = malloc(sizeof(float) * (size_t)(T_max * H)), *hl = malloc(sizeof(float) * (size_t)(T_max * E));
    if (!hx || !hl) return 2;
    for (int64_t i = 0; i < T_max * H; i++) hx[i] = uniform(-1.5f, 1.5f);
    for (int64_t i = 0; i < T_max * E; i++) hl[i] = uniform(-2.0f, 2.0f);
    float *x = NULL, *lg = NULL, *out = NULL;
    CK(cudaMalloc((void **)&x, sizeof(float) * (size_t)(T_max * H)));
    CK(cudaMalloc((void **)&lg, sizeof(float) * (size_t)(T_max * E)));
    CK(cudaMalloc((void **)&out, sizeof(float) * (size_t)(64 * H)));
    CK(cudaMemcpy(x, hx, sizeof(float) * (size_t)(T_max * H), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(lg, hl, sizeof(float) * (size_t)(T_max * E), cudaMemcpyHostToDevice));
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, og_moe_cuda_scratch_bytes(64, K_TOP, E, H, F)));
    size_t qgu = 0, qdn = 0;
    void *bgu = bf16_stack(2 * F, H, 1.7f / sqrtf((float)H)), *bdn = bf16_stack(H, F, 1.7f / sqrtf((float)F));
    void *q4gu = q4_stack(2 * F, H, &qgu), *q4dn = q4_stack(H, F, &qdn);
    CK(cudaStreamSynchronize(0)); /* the legacy stream's copies: st (non-blocking) waits for none */
    printf("moe layer decode, hidden %lld, %lld experts of %lld, top %d (each call a new token's experts)\n",
           (long long)H, (long long)E, (long long)F, K_TOP);
    printf("%6s %8s %12s %12s %12s %10s %12s\n", "tokens", "weights", "element us", "8-a-lane us", "chunk us", "speedup",
           "chunk GB/s");
    og_moe_cuda_set_gemm(false);
    for (int w = 0; w < 2; w++) {
        const bool q4 = w == 1;
        const double per_expert = q4 ? (double)(qgu + qdn) : (double)(3 * F * H * 2);
        for (int i = 0; i < 3; i++) {
            const int64_t T = Ts[i];
            const og_moe_cuda_args a = {.x = x, .logits = lg, .gate_up = q4 ? q4gu : bgu,
                                        .gate_up_dtype = q4 ? OG_DTYPE_Q4 : OG_DTYPE_BF16, .down = q4 ? q4dn : bdn,
                                        .down_dtype = q4 ? OG_DTYPE_Q4 : OG_DTYPE_BF16, .T = T, .H = H, .F = F,
                                        .E = E, .top_k = K_TOP, .norm_topk_prob = true, .out = out};
            og_moe_cuda_set_vec(0);
            const double el = time_call_rot(st, &a, scratch, T) * 1e3;
            og_moe_cuda_set_vec(1);
            const double ve = time_call_rot(st, &a, scratch, T) * 1e3;
            og_moe_cuda_set_vec(2);
            const double ch = time_call_rot(st, &a, scratch, T) * 1e3;
            /* experts read: at most E, at most T * k (distinct picks, an upper bound) */
            const double experts = (double)(T * K_TOP < E ? T * K_TOP : E);
            printf("%6lld %8s %12.1f %12.1f %12.1f %10.2f %12.0f\n", (long long)T, q4 ? "q4" : "bf16", el, ve, ch,
                   el / ch, experts * per_expert / (ch * 1e-6) / 1e9);
            printf("{\"bench\":\"moe_decode\",\"T\":%lld,\"weights\":\"%s\",\"element_us\":%.2f,\"vector_us\":%.2f,"
                   "\"chunk_us\":%.2f}\n",
                   (long long)T, q4 ? "q4" : "bf16", el, ve, ch);
            fflush(stdout);
        }
    }
    cudaFree(bgu), cudaFree(bdn), cudaFree(q4gu), cudaFree(q4dn), cudaFree(x), cudaFree(lg), cudaFree(out);
    cudaFree(scratch);
    free(hx), free(hl);
    return 0;
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
    if (argc == 2 && !strcmp(argv[1], "decode")) {
        cudaStream_t ds;
        CK(cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking));
        return decode_mode(ds);
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
    CK(cudaStreamSynchronize(0)); /* the legacy stream's copies: st (non-blocking) waits for none */
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
