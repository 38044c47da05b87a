/* The decode products on CUDA by weight format: bf16, q8 and q4 weights of
 * the Qwen3-0.6B shapes (hidden 1024, q/k/v 2048 + 1024 + 1024 as one
 * multi-part launch, o 1024 x 2048, gate/up 3072 x 1024 with the swiglu
 * epilogue, down 1024 x 3072, the tied head 151936 x 1024) at T = 1 and 8
 * rows of x. Times og_gemv_multi_cuda / og_gemv_swiglu_cuda with CUDA
 * events around BATCH back-to-back calls (launch gaps overlap as in a
 * graph), median of REPS batches after a warm-up, rotating over enough
 * copies of the weights that a round reads more than the 60 MB L2 holds.
 * Reports microseconds, weight bytes read per second (quants and scales
 * for q8/q4), and the time as a fraction of bf16's: decode reads the
 * weights once a token, so q8 should come near 0.5 and q4 near 0.25 where
 * memory, not the launch, bounds the product. One JSON line per case.
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
#include <string.h>

enum { REPS = 100, BATCH = 16 };
#define L2_BYTES ((size_t)60 << 20)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* n floats in [-1, 1) from a cheap generator. */
static void fill_f32(float *h, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = (float)((int64_t)(seed % 2001) - 1000) / 1000.0f;
    }
}

/* One weight [N, K] of dtype dt on the device, `copies` times (*bytes each). */
static void **make_weights(og_dtype dt, int64_t N, int64_t K, int copies, size_t *bytes, uint64_t seed) {
    const int64_t shape[2] = {N, K};
    int64_t nb = 0;
    if (!og_tensor_bytes(dt, 2, shape, &nb)) exit(2);
    float *src = malloc((size_t)(N * K) * sizeof(float));
    void *host = malloc((size_t)nb);
    if (!src || !host) exit(2);
    fill_f32(src, (size_t)(N * K), seed);
    if (og_dtype_is_quantized(dt)) {
        if (og_quantize_rows(dt, src, N, K, host) != OG_OK) exit(2);
    } else {
        for (int64_t i = 0; i < N * K; i++) ((uint16_t *)host)[i] = og_bf16_from_f32(src[i]);
    }
    void **d = malloc((size_t)copies * sizeof *d);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&d[c], (size_t)nb));
        CK(cudaMemcpy(d[c], host, (size_t)nb, cudaMemcpyHostToDevice));
    }
    free(src), free(host);
    *bytes = (size_t)nb;
    return d;
}

typedef struct shape {
    const char *name;
    int n_parts;          /* products of one x in one launch; 0: gate/up with swiglu */
    int64_t K, N[3];
} shape;

/* Median microseconds of one call of case s (dtype dt, T rows). */
static double time_case(cudaStream_t st, const shape *s, og_dtype dt, int64_t T, size_t *bytes_out) {
    const int parts = s->n_parts ? s->n_parts : 2;
    size_t per_copy = 0, nb[3];
    for (int p = 0; p < parts; p++) {
        const int64_t shp[2] = {s->N[p], s->K};
        int64_t b = 0;
        og_tensor_bytes(dt, 2, shp, &b);
        nb[p] = (size_t)b;
        per_copy += nb[p];
    }
    const int copies = (int)(2 * L2_BYTES / per_copy + 1);
    void **w[3];
    for (int p = 0; p < parts; p++) w[p] = make_weights(dt, s->N[p], s->K, copies, &nb[p], 77 + (uint64_t)p);
    int64_t out_n = 0;
    for (int p = 0; p < parts; p++) out_n += s->N[p];
    float *x = NULL, *out = NULL;
    CK(cudaMalloc((void **)&x, (size_t)(T * s->K) * sizeof(float)));
    CK(cudaMemset(x, 0, (size_t)(T * s->K) * sizeof(float)));
    CK(cudaMalloc((void **)&out, (size_t)(T * out_n) * sizeof(float)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    int c = 0;
    for (int rep = -2; rep < REPS; rep++) {
        CK(cudaEventRecord(e0, st));
        for (int b = 0; b < BATCH; b++, c = (c + 1) % copies) {
            og_status stt;
            if (s->n_parts) {
                og_gemv_cuda_part pt[3];
                int64_t off = 0;
                for (int p = 0; p < parts; p++) {
                    pt[p] = (og_gemv_cuda_part){w[p][c], NULL, s->N[p], out + T * off};
                    off += s->N[p];
                }
                stt = og_gemv_multi_cuda(st, x, dt, T, s->K, pt, parts);
            } else {
                stt = og_gemv_swiglu_cuda(st, x, w[0][c], NULL, w[1][c], NULL, dt, T, s->K, s->N[0], out);
            }
            if (stt != OG_OK) {
                fprintf(stderr, "%s %s: %s\n", s->name, og_dtype_name(dt), og_last_error());
                exit(1);
            }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (rep >= 0) CK(cudaEventElapsedTime(&ms[rep], e0, e1));
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    for (int p = 0; p < parts; p++) {
        for (int k = 0; k < copies; k++) cudaFree(w[p][k]);
        free(w[p]);
    }
    cudaFree(x), cudaFree(out);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    *bytes_out = per_copy;
    return (double)ms[REPS / 2] * 1000.0 / BATCH;
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const shape shapes[] = {
        {"qkv", 3, 1024, {2048, 1024, 1024}}, {"o", 1, 2048, {1024}},      {"gate_up_swiglu", 0, 1024, {3072, 3072}},
        {"down", 1, 3072, {1024}},            {"head", 1, 1024, {151936}},
    };
    const og_dtype dts[] = {OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
    const int64_t Ts[] = {1, 8};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int ti = 0; ti < 2; ti++) {
            double bf16_us = 0;
            for (int di = 0; di < 3; di++) {
                size_t bytes = 0;
                const double us = time_case(st, &shapes[si], dts[di], Ts[ti], &bytes);
                if (di == 0) bf16_us = us;
                printf("{\"shape\":\"%s\",\"T\":%lld,\"weights\":\"%s\",\"us\":%.2f,\"weight_bytes\":%zu,"
                       "\"GBps\":%.0f,\"time_vs_bf16\":%.3f}\n",
                       shapes[si].name, (long long)Ts[ti], og_dtype_name(dts[di]), us, bytes,
                       (double)bytes / us / 1e3, us / bf16_us);
                fflush(stdout);
            }
        }
    cudaStreamDestroy(st);
    return 0;
}
#endif
