/* Decode attention on CUDA: one session, Hq = 32, Hkv = 8, D = 128, bf16
 * storage, histories 128 / 4k / 32k / 128k. Times og_update_and_attend_cuda (one
 * token: one split-K launch that writes the KV row and merges its splits) with CUDA events around
 * BATCH back-to-back calls (as a decode step issues them, so launch gaps
 * overlap as in a graph), median of 200 batches after a warm-up, rotating
 * over enough layers' storage that the KV bytes of a round exceed the 60 MB L2. Reports microseconds, KV bytes read per second,
 * and that rate as a fraction of a device-to-device copy measured in the same
 * run (bytes read plus written). Prints one JSON line per history.
 * Built in every configuration; without CUDA it says so and exits 77. */
#include "core/core.h"

#include <stdio.h>

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "kernels/cuda/ops_cuda.h"

#include "cuda_check.h"
#include <stdlib.h>

enum { REPS = 200, BATCH = 16 };

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Fills n bf16 values with a cheap pattern of small random-looking numbers. */
static void fill_bf16(uint16_t *h, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = og_bf16_from_f32((float)((int64_t)(seed % 2001) - 1000) / 1000.0f);
    }
}

/* Device-to-device copy rate in bytes (read + written) per second. */
static double copy_rate(cudaStream_t st) {
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[20];
    for (int i = 0; i < 23; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (i >= 3) CK(cudaEventElapsedTime(&ms[i - 3], e0, e1));
    }
    qsort(ms, 20, sizeof *ms, cmp_float);
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * (double)bytes / (ms[10] * 1e-3);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double copy = copy_rate(st);
    printf("device-to-device copy: %.0f GB/s (read + written)\n", copy / 1e9);
    const int32_t Hq = 32, Hkv = 8, D = 128;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t Ls[] = {128, 4096, 32768, 131072};
    for (int li = 0; li < 4; li++) {
        const int64_t L = Ls[li], rows = L + 1;
        const size_t layer = (size_t)rows * Hkv * D; /* elements of k (or v) */
        const size_t kv_bytes = 2 * (size_t)L * Hkv * D * 2; /* what one call must read */
        int n_layers = (int)(256e6 / (double)kv_bytes) + 1;
        if (n_layers < 2) n_layers = 2;
        uint16_t **k = calloc((size_t)n_layers, sizeof *k), **v = calloc((size_t)n_layers, sizeof *v);
        uint16_t *h = malloc(layer * 2);
        for (int l = 0; l < n_layers; l++) {
            CK(cudaMalloc((void **)&k[l], layer * 2));
            CK(cudaMalloc((void **)&v[l], layer * 2));
            fill_bf16(h, layer, 1234 + (uint64_t)l);
            CK(cudaMemcpy(k[l], h, layer * 2, cudaMemcpyHostToDevice));
            fill_bf16(h, layer, 777 + (uint64_t)l);
            CK(cudaMemcpy(v[l], h, layer * 2, cudaMemcpyHostToDevice));
        }
        free(h);
        float *q, *kn, *vn, *out, *part;
        int64_t *dlen;
        CK(cudaMalloc((void **)&q, (size_t)Hq * D * 4));
        CK(cudaMalloc((void **)&kn, (size_t)Hkv * D * 4));
        CK(cudaMalloc((void **)&vn, (size_t)Hkv * D * 4));
        CK(cudaMalloc((void **)&out, (size_t)Hq * D * 4));
        const size_t scratch = (size_t)og_attend_cuda_scratch_floats(Hq, D) * 4;
        CK(cudaMalloc((void **)&part, scratch));
        CK(cudaMemset(part, 0, scratch)); /* the split counters start at 0 */
        CK(cudaMalloc((void **)&dlen, 8));
        float *hq = malloc((size_t)Hq * D * 4);
        for (int i = 0; i < Hq * D; i++) hq[i] = (float)((i * 37) % 101 - 50) / 50.0f;
        CK(cudaMemcpy(q, hq, (size_t)Hq * D * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(kn, hq, (size_t)Hkv * D * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(vn, hq, (size_t)Hkv * D * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dlen, &L, 8, cudaMemcpyHostToDevice));
        free(hq);
        og_attend_cuda_args a = {.q = q, .k = kn, .v = vn, .out = out, .T = 1, .n_heads = Hq, .scale = 0,
                                 .length = dlen, .partials = part,
                                 .kv = {.policy = OG_KV_FLAT, .dtype = OG_DTYPE_BF16, .n_kv_heads = Hkv,
                                        .head_dim = D, .rows = rows, .length = L}};
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float ms[REPS];
        int next = 0;
        for (int r = -10; r < REPS; r++) {
            CK(cudaEventRecord(e0, st));
            for (int b = 0; b < BATCH; b++, next = (next + 1) % n_layers) {
                a.kv.k = k[next], a.kv.v = v[next];
                if (og_update_and_attend_cuda(st, &a) != OG_OK) {
                    fprintf(stderr, "bench_attend_cuda: %s\n", og_last_error());
                    return 1;
                }
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) {
                CK(cudaEventElapsedTime(&ms[r], e0, e1));
                ms[r] /= BATCH;
            }
        }
        qsort(ms, REPS, sizeof *ms, cmp_float);
        const double sec = ms[REPS / 2] * 1e-3;
        const double rate = (double)kv_bytes / sec;
        printf("{\"bench\":\"decode_attention\",\"impl\":\"offgraph\",\"L\":%lld,\"Hq\":%d,\"Hkv\":%d,\"D\":%d,"
               "\"us\":%.2f,\"kv_GBps\":%.1f,\"copy_GBps\":%.1f,\"fraction_of_copy\":%.3f,\"splits\":%d}\n",
               (long long)L, Hq, Hkv, D, sec * 1e6, rate / 1e9, copy / 1e9, rate / copy,
               og_attend_cuda_splits(L + 1, 1, Hq, Hkv, sms));
        for (int l = 0; l < n_layers; l++) cudaFree(k[l]), cudaFree(v[l]);
        free(k), free(v);
        cudaFree(q), cudaFree(kn), cudaFree(vn), cudaFree(out), cudaFree(part), cudaFree(dlen);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    cudaStreamDestroy(st);
    return 0;
}
#endif
