/* The products of a narrow batch (9 to 64 rows of x: a batched decode step
 * of that many sessions) by bf16 weights, two ways in the same run:
 *   narrow  og_gemm_narrow_cuda, every part of a step in one launch (what
 *           the back end takes by default)
 *   cublas  one cublasGemmEx a part, bf16 x, f32 out (what it took before,
 *           and what OG_CUDA_NARROW=0 restores)
 * for the products of the 0.6b, 8b and 32b shapes of bench_gemv_cuda (q, k,
 * v as three parts of one x; gate and up as two), at T = 16, 32 and 64.
 * Times BATCH back-to-back calls between CUDA events, median of REPS
 * batches after a warm-up, rotating over enough copies of the weights that
 * a round reads more than the 60 MB L2 holds. Reports microseconds, weight
 * bytes read per second, that rate as a fraction of a device-to-device copy
 * measured in the same run, and cuBLAS's time over the kernel's. One JSON
 * line per case, a table last.
 *   bench_narrow_cuda [shape ...]     (default: 0.6b 8b 32b)
 * Weights are random bf16 values. Built in every configuration; without
 * CUDA it says so and exits 77. */
#include "core/core.h"

#include <stdio.h>

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "kernels/cuda/ops_cuda.h"

#include "cuda_bench.h"
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

enum { REPS = 30, BATCH = 16, MAX_T = 64 };
#define L2_BYTES ((size_t)60 << 20)

typedef struct shape {
    const char *model, *name;
    int n_parts;
    int64_t K, N[3];
} shape;

/* `copies` device copies of a bf16 [N, K] weight of small random values. */
static void **make_weights(int64_t N, int64_t K, int copies, uint64_t seed) {
    const size_t n = (size_t)(N * K);
    uint16_t *h = malloc(n * 2);
    if (!h) exit(2);
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = og_bf16_from_f32(((float)(seed >> 40) / (float)(1 << 24) - 0.5f) * 0.1f);
    }
    void **d = malloc((size_t)copies * sizeof *d);
    if (!d) exit(2);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&d[c], n * 2));
        CK(cudaMemcpy(d[c], h, n * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

/* Median microseconds of one call (every part) at T rows. */
static double time_case(cudaStream_t st, cublasHandle_t blas, bool narrow, const shape *s, void **const *w,
                        int copies, int64_t T, const uint16_t *x, float *out) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    int c = 0;
    const float one = 1.0f, zero = 0.0f;
    for (int rep = -2; rep < REPS; rep++) {
        CK(cudaEventRecord(e0, st));
        for (int b = 0; b < BATCH; b++, c = (c + 1) % copies) {
            og_gemv_cuda_part pt[3];
            int64_t off = 0;
            for (int p = 0; p < s->n_parts; p++) {
                pt[p] = (og_gemv_cuda_part){w[p][c], NULL, s->N[p], out + T * off};
                off += s->N[p];
            }
            if (narrow) {
                if (og_gemm_narrow_cuda(st, x, T, s->K, pt, s->n_parts) != OG_OK) {
                    fprintf(stderr, "%s %s T=%lld: %s\n", s->model, s->name, (long long)T, og_last_error());
                    exit(1);
                }
                continue;
            }
            for (int p = 0; p < s->n_parts; p++)
                if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)pt[p].N, (int)T, (int)s->K, &one, pt[p].weight,
                                 CUDA_R_16BF, (int)s->K, x, CUDA_R_16BF, (int)s->K, &zero, pt[p].out, CUDA_R_32F,
                                 (int)pt[p].N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                    fprintf(stderr, "%s %s T=%lld: cublasGemmEx failed\n", s->model, s->name, (long long)T);
                    exit(1);
                }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (rep >= 0) CK(cudaEventElapsedTime(&ms[rep], e0, e1));
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return (double)ms[REPS / 2] * 1000.0 / BATCH;
}

int main(int argc, char **argv) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, st) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublas: no handle\n");
        return 1;
    }
    const shape shapes[] = {
        {"0.6b", "qkv", 3, 1024, {2048, 1024, 1024}}, {"0.6b", "o", 1, 2048, {1024}},
        {"0.6b", "gate_up", 2, 1024, {3072, 3072}},   {"0.6b", "down", 1, 3072, {1024}},
        {"8b", "qkv", 3, 4096, {4096, 1024, 1024}},   {"8b", "o", 1, 4096, {4096}},
        {"8b", "gate_up", 2, 4096, {12288, 12288}},   {"8b", "down", 1, 12288, {4096}},
        {"32b", "qkv", 3, 5120, {8192, 1024, 1024}},  {"32b", "o", 1, 8192, {5120}},
        {"32b", "gate_up", 2, 5120, {25600, 25600}},  {"32b", "down", 1, 25600, {5120}},
    };
    const int64_t Ts[] = {16, 32, 64};
    enum { NT = 3 };
    const double copy = copy_rate(st);
    printf("{\"bench\":\"copy\",\"copy_GBps\":%.0f}\n", copy / 1e9);
    double table[sizeof shapes / sizeof *shapes][NT][2];
    bool ran[sizeof shapes / sizeof *shapes] = {false};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        bool wanted = argc < 2;
        for (int a = 1; a < argc; a++) wanted = wanted || !strcmp(argv[a], s->model);
        if (!wanted) continue;
        ran[si] = true;
        size_t per_copy = 0;
        int64_t out_n = 0;
        for (int p = 0; p < s->n_parts; p++) per_copy += (size_t)(s->N[p] * s->K) * 2, out_n += s->N[p];
        const int copies = (int)(2 * L2_BYTES / per_copy + 1);
        void **w[3];
        for (int p = 0; p < s->n_parts; p++) w[p] = make_weights(s->N[p], s->K, copies, 77 + (uint64_t)p);
        uint16_t *x = NULL;
        float *out = NULL;
        CK(cudaMalloc((void **)&x, (size_t)(MAX_T * s->K) * 2));
        CK(cudaMemset(x, 0, (size_t)(MAX_T * s->K) * 2));
        CK(cudaMalloc((void **)&out, (size_t)(MAX_T * out_n) * sizeof(float)));
        CK(cudaDeviceSynchronize());
        for (int ti = 0; ti < NT; ti++)
            for (int k = 0; k < 2; k++) {
                const bool narrow = k == 1;
                const double us = time_case(st, blas, narrow, s, w, copies, Ts[ti], x, out);
                const double gbps = (double)per_copy / us / 1e3;
                table[si][ti][k] = us;
                printf("{\"bench\":\"narrow\",\"model\":\"%s\",\"shape\":\"%s\",\"T\":%lld,\"kernel\":\"%s\","
                       "\"us\":%.2f,\"weight_bytes\":%zu,\"GBps\":%.0f,\"fraction_of_copy\":%.3f}\n",
                       s->model, s->name, (long long)Ts[ti], narrow ? "narrow" : "cublas", us, per_copy, gbps,
                       gbps * 1e9 / copy);
                fflush(stdout);
            }
        for (int p = 0; p < s->n_parts; p++) {
            for (int c = 0; c < copies; c++) cudaFree(w[p][c]);
            free(w[p]);
        }
        cudaFree(x), cudaFree(out);
    }
    printf("---- bf16 products of T rows: us cuBLAS -> us narrow (narrow's fraction of the %.0f GB/s copy rate; "
           "cuBLAS time / narrow time)\n",
           copy / 1e9);
    printf("%-5s %-8s %32s %32s %32s\n", "model", "product", "T=16", "T=32", "T=64");
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        if (!ran[si]) continue;
        const shape *s = &shapes[si];
        size_t per_copy = 0;
        for (int p = 0; p < s->n_parts; p++) per_copy += (size_t)(s->N[p] * s->K) * 2;
        printf("%-5s %-8s", s->model, s->name);
        for (int ti = 0; ti < NT; ti++) {
            char cell[64];
            const double cu = table[si][ti][0], na = table[si][ti][1];
            snprintf(cell, sizeof cell, "%.1f -> %.1f (%.2f; %.2fx)", cu, na, (double)per_copy / na / 1e3 * 1e9 / copy,
                     cu / na);
            printf(" %32s", cell);
        }
        printf("\n");
    }
    cublasDestroy(blas);
    cudaStreamDestroy(st);
    return 0;
}
#endif
