/* The products of a narrow batch (9 to 64 rows of x: a batched decode step
 * of that many sessions) by bf16 weights, two ways in the same run:
 *   narrow  og_gemm_narrow_cuda, every part of a step in one launch (what
 *           the back end takes by default), over bf16, q8 and q4 weights
 *   cublas  one cublasGemmEx a part over bf16 weights, bf16 x, f32 out (what
 *           the back end took before, and what OG_CUDA_NARROW=0 restores)
 * for the products of the 0.6b, 8b and 32b shapes of bench_gemv_cuda (q, k,
 * v as three parts of one x; gate and up as two), at T = 16, 32 and 64.
 * Times BATCH back-to-back calls between CUDA events, median of REPS
 * batches after a warm-up, rotating over enough copies of the weights that
 * a round reads more than the 60 MB L2 holds. Reports microseconds, weight
 * bytes read per second (quants and scales for q8 / q4), that rate as a
 * fraction of a device-to-device copy measured in the same run, and
 * cuBLAS's time over the narrow kernel's on the same bf16 weights. One JSON
 * line per case, a table last.
 *   bench_narrow_cuda [shape ...]     (default: 0.6b 8b 32b)
 * BENCH_NARROW_T="1,4,8" times those row counts instead (at most three).
 * Weights are random values (a product's time does not depend on them). Built in every configuration; without
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

/* `copies` device copies of a [N, K] weight of dtype dt: bf16 small random
 * values; q8 / q4 random quants and f16 scales in (2^-7, 0.5). */
static void **make_weights(og_dtype dt, int64_t N, int64_t K, int copies, size_t *bytes, uint64_t seed) {
    const int64_t dims[2] = {N, K};
    int64_t nb = 0;
    if (!og_tensor_bytes(dt, 2, dims, &nb)) exit(2);
    uint8_t *h = malloc((size_t)nb);
    if (!h) exit(2);
    if (dt == OG_DTYPE_BF16) {
        for (int64_t i = 0; i < N * K; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            ((uint16_t *)h)[i] = og_bf16_from_f32(((float)(seed >> 40) / (float)(1 << 24) - 0.5f) * 0.1f);
        }
    } else {
        const size_t quants = og_quant_row_bytes(dt, K) * (size_t)N;
        for (size_t i = 0; i < quants; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            h[i] = (uint8_t)(seed >> 24);
        }
        uint16_t *sc = (uint16_t *)(h + quants);
        for (size_t i = 0; i < ((size_t)nb - quants) / 2; i++) sc[i] = (uint16_t)(0x2000 + (i * 2654435761u) % 0x1800);
    }
    void **d = malloc((size_t)copies * sizeof *d);
    if (!d) exit(2);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&d[c], (size_t)nb));
        CK(cudaMemcpy(d[c], h, (size_t)nb, cudaMemcpyHostToDevice));
    }
    free(h);
    *bytes = (size_t)nb;
    return d;
}

/* Median microseconds of one call (every part) at T rows. */
static double time_case(cudaStream_t st, cublasHandle_t blas, og_dtype dt, bool narrow, const shape *s,
                        void **const *w, int copies, int64_t T, const uint16_t *x, float *out) {
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
                if (og_gemm_narrow_cuda(st, x, dt, T, s->K, pt, s->n_parts) != OG_OK) {
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
    /* BENCH_NARROW_T: see the top of the file; each count 1 .. MAX_T */
    int64_t Ts[] = {16, 32, 64};
    enum { NT = 3, NK = 4 };
    const char *t_env = getenv("BENCH_NARROW_T");
    for (int ti = 0; t_env && *t_env && ti < NT; ti++) {
        char *end = NULL;
        const long t = strtol(t_env, &end, 10);
        if (end == t_env || t < 1 || t > MAX_T) break;
        Ts[ti] = t;
        t_env = *end == ',' ? end + 1 : end;
    }
    /* kernel k: cuBLAS over bf16, then the narrow kernel over bf16, q8, q4 */
    const char *kname[NK] = {"cublas", "narrow", "narrow", "narrow"};
    const og_dtype kdt[NK] = {OG_DTYPE_BF16, OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
    const double copy = copy_rate(st);
    printf("{\"bench\":\"copy\",\"copy_GBps\":%.0f}\n", copy / 1e9);
    enum { NS = sizeof shapes / sizeof *shapes };
    double us_of[NS][NK][NT], frac_of[NS][NK][NT];
    bool ran[NS] = {false};
    for (size_t si = 0; si < NS; si++) {
        const shape *s = &shapes[si];
        bool wanted = argc < 2;
        for (int a = 1; a < argc; a++) wanted = wanted || !strcmp(argv[a], s->model);
        if (!wanted) continue;
        ran[si] = true;
        int64_t out_n = 0;
        for (int p = 0; p < s->n_parts; p++) out_n += s->N[p];
        uint16_t *x = NULL;
        float *out = NULL;
        CK(cudaMalloc((void **)&x, (size_t)(MAX_T * s->K) * 2));
        CK(cudaMemset(x, 0, (size_t)(MAX_T * s->K) * 2));
        CK(cudaMalloc((void **)&out, (size_t)(MAX_T * out_n) * sizeof(float)));
        for (int k = 0; k < NK; k++) {
            size_t per_copy = 0, nb[3];
            for (int p = 0; p < s->n_parts; p++) {
                const int64_t shp[2] = {s->N[p], s->K};
                int64_t b = 0;
                og_tensor_bytes(kdt[k], 2, shp, &b);
                nb[p] = (size_t)b;
                per_copy += nb[p];
            }
            const int copies = (int)(2 * L2_BYTES / per_copy + 1);
            void **w[3];
            for (int p = 0; p < s->n_parts; p++)
                w[p] = make_weights(kdt[k], s->N[p], s->K, copies, &nb[p], 77 + (uint64_t)p);
            CK(cudaDeviceSynchronize());
            for (int ti = 0; ti < NT; ti++) {
                const double us = time_case(st, blas, kdt[k], k > 0, s, w, copies, Ts[ti], x, out);
                const double gbps = (double)per_copy / us / 1e3;
                us_of[si][k][ti] = us;
                frac_of[si][k][ti] = gbps * 1e9 / copy;
                printf("{\"bench\":\"narrow\",\"model\":\"%s\",\"shape\":\"%s\",\"T\":%lld,\"kernel\":\"%s\","
                       "\"weights\":\"%s\",\"us\":%.2f,\"weight_bytes\":%zu,\"GBps\":%.0f,\"fraction_of_copy\":%.3f}\n",
                       s->model, s->name, (long long)Ts[ti], kname[k], og_dtype_name(kdt[k]), us, per_copy, gbps,
                       gbps * 1e9 / copy);
                fflush(stdout);
            }
            for (int p = 0; p < s->n_parts; p++) {
                for (int c = 0; c < copies; c++) cudaFree(w[p][c]);
                free(w[p]);
            }
        }
        cudaFree(x), cudaFree(out);
    }
    printf("---- products of T rows: us (fraction of the %.0f GB/s copy rate) by kernel and weights\n", copy / 1e9);
    printf("%-5s %-8s %-3s %17s %17s %17s %17s %9s\n", "model", "product", "T", "cublas bf16", "narrow bf16",
           "narrow q8", "narrow q4", "cublas/nb");
    for (size_t si = 0; si < NS; si++) {
        if (!ran[si]) continue;
        for (int ti = 0; ti < NT; ti++) {
            printf("%-5s %-8s %-3lld", shapes[si].model, shapes[si].name, (long long)Ts[ti]);
            for (int k = 0; k < NK; k++) {
                char cell[40];
                snprintf(cell, sizeof cell, "%.1f (%.2f)", us_of[si][k][ti], frac_of[si][k][ti]);
                printf(" %17s", cell);
            }
            printf(" %8.2fx\n", us_of[si][0][ti] / us_of[si][1][ti]);
        }
    }
    cublasDestroy(blas);
    cudaStreamDestroy(st);
    return 0;
}
#endif
