/* The decode products on CUDA by weight format: bf16, q8 and q4 weights of
 * the products of three model shapes, at T = 1, 2, 4 and 8 rows of x:
 *   0.6b  Qwen3-0.6B: hidden 1024, q/k/v 2048 + 1024 + 1024 (one multi-part
 *         launch), o 1024 x 2048, gate/up 3072 x 1024 (swiglu epilogue),
 *         down 1024 x 3072, head 151936 x 1024
 *   8b    Qwen3-8B: hidden 4096, q/k/v 4096 + 1024 + 1024, o 4096 x 4096,
 *         gate/up 12288 x 4096, down 4096 x 12288, head 151936 x 4096
 *   32b   a 32B-like shape: hidden 5120, q/k/v 8192 + 1024 + 1024,
 *         o 5120 x 8192, gate/up 25600 x 5120, down 5120 x 25600 (its head
 *         is the 8b head's kind of product and is left out)
 * Times og_gemv_multi_cuda / og_gemv_swiglu_cuda with CUDA events around
 * BATCH back-to-back calls (launch gaps overlap as in a graph), median of
 * REPS batches after a warm-up, rotating over enough copies of the weights
 * that a round reads more than the 60 MB L2 holds. Reports microseconds,
 * weight bytes read per second (quants and scales for q8/q4), that rate as a
 * fraction of a device-to-device copy measured in the same run (bytes read +
 * written per second: the ceiling a decode product is held to), and the time
 * as a fraction of bf16's. One JSON line per case, a table last.
 * bf16 runs each case under several kernels ("kernel" in the JSON): ring
 * (the default gemv_tc ring kernel), split (the split-K kernel of
 * OG_CUDA_GEMV_SPLIT=1, its split count chosen from the shape), split1 /
 * split2 / split4 (the count forced) and split_r32 (rings capped at 32 KB a
 * block), through og_gemv_cuda_set_split; a second table sets split beside
 * ring in microseconds and fraction of the copy rate. q8 and q4 run each
 * case with gemv_q.cu off ("other": the CUDA-core and tensor-core kernels)
 * and with gemv_q.cu at every T ("gemvq", what OG_CUDA_GEMVQ=ring selects;
 * by default it takes one row of x only), switched by og_gemvq_cuda_set; a
 * third table sets gemvq beside other in GB/s of weights and fraction of the
 * copy rate.
 *   bench_gemv_cuda [shape ...]     (default: 0.6b 8b 32b)
 * The weights' values are random bytes: a product's time does not depend on
 * them. Built in every configuration; without CUDA it says so and exits 77. */
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
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { REPS = 50, BATCH = 16, MAX_CASES = 1024 };
#define L2_BYTES ((size_t)60 << 20)

/* A weight [N, K] of dtype dt on the device, `copies` times, filled with a
 * 16 MiB block of bytes made by a cheap generator and repeated. For q8/q4 the
 * scales are then overwritten with f16 values in (0, 1): random bytes would
 * give infinities and NaNs, which cost the same but read badly. */
static void **make_weights(og_dtype dt, int64_t N, int64_t K, int copies, size_t *bytes, uint64_t seed) {
    const int64_t shape[2] = {N, K};
    int64_t nb = 0;
    if (!og_tensor_bytes(dt, 2, shape, &nb)) exit(2);
    const size_t tile = (size_t)16 << 20;
    uint8_t *host = malloc(tile);
    if (!host) exit(2);
    for (size_t i = 0; i < tile; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        host[i] = (uint8_t)(seed >> 24);
    }
    if (dt == OG_DTYPE_BF16) /* keep bf16 values finite and small: clear the top exponent bit */
        for (size_t i = 1; i < tile; i += 2) host[i] &= 0xbf;
    void **d = malloc((size_t)copies * sizeof *d);
    if (!d) exit(2);
    const size_t quants = og_dtype_is_quantized(dt) ? (size_t)(N * K) / (dt == OG_DTYPE_Q4 ? 2 : 1) : (size_t)nb;
    uint16_t *scales = NULL;
    const size_t n_scales = og_dtype_is_quantized(dt) ? ((size_t)nb - quants) / 2 : 0;
    if (n_scales) {
        scales = malloc(n_scales * 2);
        if (!scales) exit(2);
        for (size_t i = 0; i < n_scales; i++) scales[i] = (uint16_t)(0x2000 + (i * 2654435761u) % 0x1800); /* f16 in (2^-7, 0.5) */
    }
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&d[c], (size_t)nb));
        for (size_t off = 0; off < (size_t)nb; off += tile)
            CK(cudaMemcpy((uint8_t *)d[c] + off, host, (size_t)nb - off < tile ? (size_t)nb - off : tile,
                          cudaMemcpyHostToDevice));
        if (n_scales) CK(cudaMemcpy((uint8_t *)d[c] + quants, scales, n_scales * 2, cudaMemcpyHostToDevice));
    }
    free(host), free(scales);
    *bytes = (size_t)nb;
    return d;
}

typedef struct shape {
    const char *model, *name;
    int n_parts;          /* products of one x in one launch; 0: gate/up with swiglu */
    int64_t K, N[3];
} shape;

/* The kernels a bf16 case runs under (og_gemv_cuda_set_split's arguments). */
typedef struct variant {
    const char *name;
    int mode, splits, ring_kb;
} variant;
static const variant bf16_variants[] = {{"ring", 0, 0, 0},   {"split", 1, 0, 0},  {"split1", 1, 1, 0},
                                        {"split2", 1, 2, 0}, {"split4", 1, 4, 0}, {"split_r32", 1, 0, 32}};
/* q8 / q4: the CUDA-core and tensor-core kernels (gemv_q.cu off), then gemv_q.cu at every T (og_gemvq_cuda_set modes 0 and 1) */
static const variant q_variants[] = {{"other", 0, 0, 0}, {"gemvq", 1, 0, 0}};

typedef struct result {
    const char *model, *name, *dt, *kernel;
    int64_t T;
    double us, frac, vs_bf16;
} result;

/* Median microseconds of one call of case s (weights w[part][copy]) at T rows. */
static double time_case(cudaStream_t st, const shape *s, og_dtype dt, void **const *w, int copies, int64_t T,
                        const float *x, float *out) {
    const int parts = s->n_parts ? s->n_parts : 2;
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
            if (stt != OG_OK) { /* a variant that cannot launch: its rows are left out, the rest go on */
                fprintf(stderr, "%s %s %s T=%lld: %s\n", s->model, s->name, og_dtype_name(dt), (long long)T,
                        og_last_error());
                (void)cudaStreamSynchronize(st);
                (void)cudaGetLastError();
                cudaEventDestroy(e0), cudaEventDestroy(e1);
                return -1.0;
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
    const shape shapes[] = {
        {"0.6b", "qkv", 3, 1024, {2048, 1024, 1024}},  {"0.6b", "o", 1, 2048, {1024}},
        {"0.6b", "gate_up_swiglu", 0, 1024, {3072, 3072}}, {"0.6b", "down", 1, 3072, {1024}},
        {"0.6b", "head", 1, 1024, {151936}},
        {"8b", "qkv", 3, 4096, {4096, 1024, 1024}},    {"8b", "o", 1, 4096, {4096}},
        {"8b", "gate_up_swiglu", 0, 4096, {12288, 12288}}, {"8b", "down", 1, 12288, {4096}},
        {"8b", "head", 1, 4096, {151936}},
        {"32b", "qkv", 3, 5120, {8192, 1024, 1024}},   {"32b", "o", 1, 8192, {5120}},
        {"32b", "gate_up_swiglu", 0, 5120, {25600, 25600}}, {"32b", "down", 1, 25600, {5120}},
    };
    const og_dtype dts[] = {OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
    const int64_t Ts[] = {1, 2, 4, 8};
    const double copy = copy_rate(st);
    printf("{\"bench\":\"copy\",\"copy_GBps\":%.0f}\n", copy / 1e9);
    result res[MAX_CASES];
    int n_res = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        bool wanted = argc < 2;
        for (int a = 1; a < argc; a++) wanted = wanted || !strcmp(argv[a], s->model);
        if (!wanted) continue;
        const int parts = s->n_parts ? s->n_parts : 2;
        double bf16_us[4] = {0};
        for (int di = 0; di < 3; di++) {
            const bool bf16 = dts[di] == OG_DTYPE_BF16;
            const int n_var = bf16 ? (int)(sizeof bf16_variants / sizeof *bf16_variants)
                                   : (int)(sizeof q_variants / sizeof *q_variants);
            const int gemvq_was = og_gemvq_cuda_get();
            size_t per_copy = 0, nb[3];
            for (int p = 0; p < parts; p++) {
                const int64_t shp[2] = {s->N[p], s->K};
                int64_t b = 0;
                og_tensor_bytes(dts[di], 2, shp, &b);
                nb[p] = (size_t)b;
                per_copy += nb[p];
            }
            const int copies = (int)(2 * L2_BYTES / per_copy + 1);
            void **w[3];
            for (int p = 0; p < parts; p++) w[p] = make_weights(dts[di], s->N[p], s->K, copies, &nb[p], 77 + (uint64_t)p);
            int64_t out_n = 0;
            for (int p = 0; p < parts; p++) out_n += s->N[p];
            float *x = NULL, *out = NULL;
            CK(cudaMalloc((void **)&x, (size_t)(8 * s->K) * sizeof(float)));
            CK(cudaMemset(x, 0, (size_t)(8 * s->K) * sizeof(float)));
            CK(cudaMalloc((void **)&out, (size_t)(8 * out_n) * sizeof(float)));
            CK(cudaStreamSynchronize(0)); /* the legacy stream's copies: st (non-blocking) waits for none */
            for (int vi = 0; vi < n_var; vi++) {
                const variant *v = bf16 ? &bf16_variants[vi] : &q_variants[vi];
                if (bf16) og_gemv_cuda_set_split(v->mode, v->splits, v->ring_kb);
                else og_gemvq_cuda_set(v->mode);
                for (int ti = 0; ti < 4; ti++) {
                    const double us = time_case(st, s, dts[di], w, copies, Ts[ti], x, out);
                    if (us < 0) { /* the table keeps its row, as nan */
                        if (bf16 && vi == 0) exit(1);
                        printf("{\"bench\":\"gemv\",\"model\":\"%s\",\"shape\":\"%s\",\"T\":%lld,\"weights\":\"%s\","
                               "\"kernel\":\"%s\",\"error\":\"launch failed\"}\n",
                               s->model, s->name, (long long)Ts[ti], og_dtype_name(dts[di]), v->name);
                        if (n_res < MAX_CASES)
                            res[n_res++] = (result){s->model, s->name, og_dtype_name(dts[di]), v->name, Ts[ti], NAN,
                                                    NAN, NAN};
                        continue;
                    }
                    if (bf16 && vi == 0) bf16_us[ti] = us;
                    const double gbps = (double)per_copy / us / 1e3;
                    printf("{\"bench\":\"gemv\",\"model\":\"%s\",\"shape\":\"%s\",\"T\":%lld,\"weights\":\"%s\","
                           "\"kernel\":\"%s\",\"us\":%.2f,\"weight_bytes\":%zu,\"GBps\":%.0f,\"fraction_of_copy\":%.3f,"
                           "\"time_vs_bf16\":%.3f}\n",
                           s->model, s->name, (long long)Ts[ti], og_dtype_name(dts[di]), v->name, us, per_copy, gbps,
                           gbps * 1e9 / copy, us / bf16_us[ti]);
                    fflush(stdout);
                    if (n_res < MAX_CASES)
                        res[n_res++] = (result){s->model, s->name, og_dtype_name(dts[di]), v->name, Ts[ti], us,
                                                gbps * 1e9 / copy, us / bf16_us[ti]};
                }
            }
            og_gemv_cuda_set_split(-1, 0, 0);
            og_gemvq_cuda_set(gemvq_was);
            for (int p = 0; p < parts; p++) {
                for (int k = 0; k < copies; k++) cudaFree(w[p][k]);
                free(w[p]);
            }
            cudaFree(x), cudaFree(out);
        }
    }
    printf("---- decode products, fraction of the copy rate (%.0f GB/s) by rows of x\n", copy / 1e9);
    printf("%-5s %-15s %-5s %-9s %8s %8s %8s %8s\n", "model", "product", "dtype", "kernel", "T=1", "T=2", "T=4",
           "T=8");
    for (int i = 0; i + 3 < n_res; i += 4)
        printf("%-5s %-15s %-5s %-9s %8.2f %8.2f %8.2f %8.2f\n", res[i].model, res[i].name, res[i].dt, res[i].kernel,
               res[i].frac, res[i + 1].frac, res[i + 2].frac, res[i + 3].frac);
    printf("---- bf16: ring kernel -> split kernel, us (fraction of copy) by rows of x\n");
    printf("%-5s %-15s %25s %25s %25s %25s\n", "model", "product", "T=1", "T=2", "T=4", "T=8");
    for (int i = 0; i + 3 < n_res; i += 4) {
        if (strcmp(res[i].kernel, "ring")) continue;
        int j = i + 4; /* the split rows of the same product */
        while (j + 3 < n_res && strcmp(res[j].kernel, "split")) j += 4;
        if (j + 3 >= n_res || strcmp(res[j].name, res[i].name) || strcmp(res[j].model, res[i].model)) continue;
        printf("%-5s %-15s", res[i].model, res[i].name);
        for (int t = 0; t < 4; t++)
            printf(" %6.1f %.2f->%6.1f %.2f", res[i + t].us, res[i + t].frac, res[j + t].us, res[j + t].frac);
        printf("\n");
    }
    printf("---- q8 / q4: other kernels -> gemvq (gemv_q.cu), GB/s of weights (fraction of copy) by rows of x\n");
    printf("%-5s %-15s %-5s %21s %21s %21s %21s\n", "model", "product", "dtype", "T=1", "T=2", "T=4", "T=8");
    for (int i = 0; i + 7 < n_res; i += 4) {
        if (strcmp(res[i].kernel, "other") || strcmp(res[i + 4].kernel, "gemvq")) continue;
        printf("%-5s %-15s %-5s", res[i].model, res[i].name, res[i].dt);
        for (int t = 0; t < 4; t++)
            printf(" %4.0f %.2f->%4.0f %.2f", res[i + t].frac * copy / 1e9, res[i + t].frac,
                   res[i + 4 + t].frac * copy / 1e9, res[i + 4 + t].frac);
        printf("\n");
    }
    cudaStreamDestroy(st);
    return 0;
}
#endif
