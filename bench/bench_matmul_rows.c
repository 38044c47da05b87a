/* Batched decode matmuls: og_matmul_rows_cpu over R rows (one per session)
 * against R separate og_matmul_cpu calls (T = 1), at the Qwen3-0.6B shapes
 * with bf16 weights. Weights cycle through copies larger than the last-level
 * cache so every call streams them from memory, as in a real decode step.
 * Prints ms per call (all R rows; best of 5 trials), the weight GB/s each
 * path streams (one pass for the batched call, R passes for R x 1) and the
 * speedup of the batched call.
 * Then the decode GEMV (R = 1) per weight format side by side: bf16, q8 and
 * q4 (og_tensor_bytes: quants and f16 scales), ms per call, GB/s of weight
 * bytes read and the speedup over bf16 (the bytes ratio is its ceiling).
 * Usage: bench_matmul_rows [threads]   (default: online CPUs)
 * Letters: R rows, K in features, N out features. */
#include "core/core.h"
#include "kernels/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_BYTES ((size_t)512 << 20) /* well above any L3 of this class */

typedef struct {
    const char *name;
    int64_t K, N;
} shape;

static const shape SHAPES[] = {
    {"q_proj", 1024, 2048},
    {"k/v_proj", 1024, 1024},
    {"gate/up", 1024, 3072},
    {"down_proj", 3072, 1024},
};

static void fill_bf16(og_bf16 *w, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        w[i] = og_bf16_from_f32((float)((int)(seed >> 9) - (1 << 22)) * 0x1p-28f);
    }
}

/* Best of 5 trials of ~40 ms of R = 1 calls, each on the next of `copies`
 * copies of `bytes` bytes of weights of dt; seconds per call. */
static double time_gemv(og_threadpool *pool, const char *w, size_t bytes, size_t copies,
                        og_dtype dt, const float *x, int64_t K, int64_t N, float *out) {
    double best = 1e30;
    size_t next = 0;
    for (int trial = 0; trial < 5; trial++) {
        int calls = 0;
        double t0 = og_time_now(), t1;
        do {
            og_matmul_cpu(pool, x, w + (next++ % copies) * bytes, NULL, dt, 1, K, N, out);
            calls++;
        } while ((t1 = og_time_now()) - t0 < 0.04);
        if ((t1 - t0) / calls < best) best = (t1 - t0) / calls;
    }
    return best;
}

/* The R = 1 GEMV of each shape with bf16, q8 and q4 weights. The weights
 * count as loaded (og_cpu_weights_loaded), so the GEMVs prefetch as they do
 * for a model larger than the caches. */
static int bench_formats(og_threadpool *pool) {
    static const og_dtype DTS[] = {OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
    og_cpu_weights_loaded((int64_t)STREAM_BYTES);
    printf("\ndecode GEMV (R = 1) per weight format, weights streamed from memory "
           "(prefetch for weights%s fitting the caches)\n",
           og_cpu_weights_fit_cache() ? "" : " not");
    printf("%-10s %5s %5s", "matrix", "K", "N");
    for (size_t d = 0; d < 3; d++)
        printf(" %6s ms %6s GB/s%s", og_dtype_name(DTS[d]), og_dtype_name(DTS[d]),
               d ? " speedup" : "");
    printf("\n");
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const shape *sh = &SHAPES[s];
        const int64_t dims[2] = {sh->N, sh->K};
        float *src = og_malloc((size_t)(sh->N * sh->K) * sizeof(float)); /* [N, K] */
        float *x = og_malloc((size_t)sh->K * sizeof(float));             /* [K]    */
        float *out = og_malloc((size_t)sh->N * sizeof(float));           /* [N]    */
        if (!src || !x || !out) return 1;
        for (int64_t i = 0; i < sh->K; i++) x[i] = (float)((i % 13) - 6) * 0.1875f;
        printf("%-10s %5lld %5lld", sh->name, (long long)sh->K, (long long)sh->N);
        double bf16_s = 0;
        for (size_t d = 0; d < 3; d++) {
            int64_t b = 0;
            og_tensor_bytes(DTS[d], 2, dims, &b);
            const size_t bytes = (size_t)b, copies = STREAM_BYTES / bytes + 1;
            char *w = og_malloc(copies * bytes); /* [copies, bytes] */
            if (!w) return 1;
            for (size_t c = 0; c < copies; c++) {
                char *wc = w + c * bytes;
                if (DTS[d] == OG_DTYPE_BF16) {
                    fill_bf16((og_bf16 *)wc, (size_t)(sh->N * sh->K), (uint32_t)(c + 1));
                } else {
                    if (c == 0) { /* the values of the first bf16 copy, quantized */
                        uint32_t seed = 1;
                        for (int64_t i = 0; i < sh->N * sh->K; i++) {
                            seed = seed * 1664525u + 1013904223u;
                            src[i] = (float)((int)(seed >> 9) - (1 << 22)) * 0x1p-28f;
                        }
                        if (og_quantize_rows(DTS[d], src, sh->N, sh->K, wc) != OG_OK) return 1;
                    } else {
                        memcpy(wc, w, bytes);
                    }
                }
            }
            const double t = time_gemv(pool, w, bytes, copies, DTS[d], x, sh->K, sh->N, out);
            if (d == 0) bf16_s = t;
            printf(" %9.3f %11.1f", t * 1e3, (double)bytes / t / 1e9);
            if (d) printf(" %7.2f", bf16_s / t);
            og_free(w);
        }
        printf("\n");
        og_free(src);
        og_free(x);
        og_free(out);
    }
    og_cpu_weights_loaded(-(int64_t)STREAM_BYTES);
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    og_threadpool *pool = og_threadpool_create(threads);
    if (!pool) {
        fprintf(stderr, "bench_matmul_rows: cannot start threads\n");
        return 1;
    }
    printf("threads %d, isa %s, bf16 weights streamed from memory\n\n",
           og_threadpool_size(pool), og_cpu_isa_name(og_cpu_isa_active()));
    printf("%-10s %5s %5s %4s %12s %9s %12s %9s %8s %6s\n", "matrix", "K", "N", "R", "rows ms",
           "GB/s", "R x 1 ms", "GB/s", "speedup", "equal");
    static const int64_t Rs[] = {1, 8, 16, 64};
    int failed = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const shape *sh = &SHAPES[s];
        size_t elems = (size_t)(sh->K * sh->N), bytes = elems * sizeof(og_bf16);
        size_t copies = STREAM_BYTES / bytes + 1;
        og_bf16 *w = og_malloc(copies * bytes);               /* [copies, N, K] */
        float *x = og_malloc((size_t)(64 * sh->K) * sizeof(float));   /* [64, K] */
        float *out = og_malloc((size_t)(64 * sh->N) * sizeof(float)); /* [64, N] */
        float *one = og_malloc((size_t)(64 * sh->N) * sizeof(float)); /* [64, N] */
        if (!w || !x || !out || !one) {
            fprintf(stderr, "bench_matmul_rows: out of memory\n");
            return 1;
        }
        for (size_t c = 0; c < copies; c++) fill_bf16(w + c * elems, elems, (uint32_t)(c + 1));
        for (int64_t i = 0; i < 64 * sh->K; i++) x[i] = (float)((i % 13) - 6) * 0.1875f;
        for (size_t ri = 0; ri < sizeof Rs / sizeof *Rs; ri++) {
            int64_t R = Rs[ri];
            if (og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, R, sh->K, sh->N, out) != OG_OK) {
                fprintf(stderr, "bench_matmul_rows: %s\n", og_last_error());
                return 1;
            }
            /* Best of 5 trials of ~40 ms each (other processes only ever add
             * time). Every call, batched or single, takes the next copy of the
             * weights: R sessions stepped one after another each meet the
             * matrix cold, the whole model having passed in between. */
            double rows = 1e30, singles = 1e30;
            size_t next = 0;
            for (int trial = 0; trial < 5; trial++) {
                int calls = 0;
                double t0 = og_time_now(), t1;
                do {
                    og_matmul_rows_cpu(pool, x, w + (next++ % copies) * elems, NULL, OG_DTYPE_BF16,
                                       R, sh->K, sh->N, out);
                    calls++;
                } while ((t1 = og_time_now()) - t0 < 0.04);
                if ((t1 - t0) / calls < rows) rows = (t1 - t0) / calls;
                calls = 0;
                t0 = og_time_now();
                do {
                    for (int64_t r = 0; r < R; r++)
                        og_matmul_cpu(pool, x + r * sh->K, w + (next++ % copies) * elems, NULL,
                                      OG_DTYPE_BF16, 1, sh->K, sh->N, one + r * sh->N);
                    calls++;
                } while ((t1 = og_time_now()) - t0 < 0.04);
                if ((t1 - t0) / calls < singles) singles = (t1 - t0) / calls;
            }
            /* the same weights for the check */
            og_matmul_rows_cpu(pool, x, w, NULL, OG_DTYPE_BF16, R, sh->K, sh->N, out);
            for (int64_t r = 0; r < R; r++)
                og_matmul_cpu(pool, x + r * sh->K, w, NULL, OG_DTYPE_BF16, 1, sh->K, sh->N,
                              one + r * sh->N);
            bool equal = memcmp(out, one, sizeof(float) * (size_t)(R * sh->N)) == 0;
            failed |= !equal;
            printf("%-10s %5lld %5lld %4lld %12.3f %9.1f %12.3f %9.1f %8.2f %6s\n", sh->name,
                   (long long)sh->K, (long long)sh->N, (long long)R, rows * 1e3,
                   bytes / rows / 1e9, singles * 1e3, R * bytes / singles / 1e9, singles / rows,
                   equal ? "yes" : "NO");
        }
        og_free(w);
        og_free(x);
        og_free(out);
        og_free(one);
    }
    failed |= bench_formats(pool);
    og_threadpool_destroy(pool);
    return failed;
}
