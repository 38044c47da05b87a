/* Matmul throughput on the Qwen3-0.6B shapes with bf16 weights:
 *  - decode GEMV (T = 1): time and weight GB/s, next to a threaded memcpy of
 *    the same bytes in the same run (reported as bytes read + written);
 *    weights cycle through copies larger than the last-level cache so every
 *    call streams from memory, as in a real decode step;
 *  - prefill GEMM (T = 128, 512): time and GFLOP/s, the weights cycling
 *    through copies as well: a model's layers stream theirs from memory in
 *    every prefill, and one matrix called again from the caches runs faster
 *    than any prefill can.
 * A per-token projection sums 28 layers of GEMVs plus the logits matmul.
 * Usage: bench_ops_cpu [threads]   (default: online CPUs)
 * Letters: T tokens, K in features, N out features. */
#include "core/core.h"
#include "kernels/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 28 };
#define STREAM_BYTES ((size_t)512 << 20) /* well above any L3 of this class */

typedef struct {
    const char *name;
    int64_t K, N;
    int per_layer; /* 0 for the logits matmul */
} shape;

static const shape SHAPES[] = {
    {"q_proj", 1024, 2048, 1},    {"k_proj", 1024, 1024, 1}, {"v_proj", 1024, 1024, 1},
    {"o_proj", 2048, 1024, 1},    {"gate_proj", 1024, 3072, 1},
    {"up_proj", 1024, 3072, 1},   {"down_proj", 3072, 1024, 1},
    {"lm_head", 1024, 151936, 0},
};

typedef struct {
    char *dst;
    const char *src;
    size_t bytes, chunk;
} copy_job;

static void copy_task(void *ctx, int64_t i, int thread) {
    const copy_job *j = ctx;
    size_t off = (size_t)i * j->chunk;
    size_t n = off + j->chunk <= j->bytes ? j->chunk : j->bytes - off;
    memcpy(j->dst + off, j->src + off, n);
}

static void fill_bf16(og_bf16 *w, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        w[i] = og_bf16_from_f32((float)((int)(seed >> 9) - (1 << 22)) * 0x1p-28f);
    }
}

typedef og_status (*matmul_fn)(og_threadpool *, const float *, const void *, const void *,
                                og_dtype, int64_t, int64_t, int64_t, float *);

/* Prefill GEMMs of every shape at T = 128 and 512; nonzero on failure. */
static int prefill(og_threadpool *pool, matmul_fn matmul, const char *what) {
    size_t n_shapes = sizeof SHAPES / sizeof *SHAPES;
    static const int64_t Tp[] = {128, 512};
    printf("\nprefill GEMM, bf16 weights, %s\n", what);
    printf("%-10s %6s %6s %7s %10s %9s\n", "matrix", "T", "K", "N", "ms", "GFLOP/s");
    for (size_t ti = 0; ti < 2; ti++) {
        double step = 0, flops = 0;
        for (size_t s = 0; s < n_shapes; s++) {
            const shape *sh = &SHAPES[s];
            int64_t T = Tp[ti];
            size_t elems = (size_t)(sh->K * sh->N), bytes = elems * sizeof(og_bf16);
            size_t copies = STREAM_BYTES / bytes + 1;
            og_bf16 *w = og_malloc(copies * bytes);
            float *x = og_malloc((size_t)(T * sh->K) * sizeof(float));
            float *out = og_malloc((size_t)(T * sh->N) * sizeof(float));
            if (!w || !x || !out) {
                fprintf(stderr, "bench_ops_cpu: out of memory\n");
                return 1;
            }
            fill_bf16(w, elems, 7);
            for (size_t c = 1; c < copies; c++) memcpy(w + c * elems, w, bytes);
            for (int64_t i = 0; i < T * sh->K; i++) x[i] = (float)((i % 11) - 5) * 0.125f;
            og_status st = matmul(pool, x, w, NULL, OG_DTYPE_BF16, T, sh->K, sh->N, out);
            if (st != OG_OK) {
                fprintf(stderr, "bench_ops_cpu: %s\n", og_last_error());
                return 1;
            }
            double f = 2.0 * (double)T * (double)sh->K * (double)sh->N;
            int reps = (int)(2e10 / f) + 1;
            double t0 = og_time_now();
            for (int r = 0; r < reps; r++)
                matmul(pool, x, w + (size_t)(r % (int)copies) * elems, NULL, OG_DTYPE_BF16, T, sh->K, sh->N, out);
            double dt = (og_time_now() - t0) / reps;
            printf("%-10s %6lld %6lld %7lld %10.3f %9.1f\n", sh->name, (long long)T,
                   (long long)sh->K, (long long)sh->N, dt * 1e3, f / dt / 1e9);
            int mult = sh->per_layer ? LAYERS : 1;
            step += mult * dt;
            flops += mult * f;
            og_free(w);
            og_free(x);
            og_free(out);
        }
        printf("  all matmuls of a %lld-token prefill: %.1f ms, %.1f GFLOP/s, %.0f tok/s\n",
               (long long)Tp[ti], step * 1e3, flops / step / 1e9, (double)Tp[ti] / step);
    }
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    og_threadpool *pool = og_threadpool_create(threads);
    if (!pool) {
        fprintf(stderr, "bench_ops_cpu: cannot start threads\n");
        return 1;
    }
    printf("threads %d, isa %s\n\n", og_threadpool_size(pool),
           og_cpu_isa_name(og_cpu_isa_active()));
    size_t n_shapes = sizeof SHAPES / sizeof *SHAPES;
    double step_gemv = 0, step_copy = 0;
    size_t step_bytes = 0;

    printf("decode GEMV, T = 1, bf16 weights streamed from memory\n");
    printf("%-10s %6s %7s %10s %9s %10s %16s %7s\n", "matrix", "K", "N", "MB", "us",
           "GB/s", "memcpy GB/s r+w", "ratio");
    for (size_t s = 0; s < n_shapes; s++) {
        const shape *sh = &SHAPES[s];
        size_t elems = (size_t)(sh->K * sh->N), bytes = elems * sizeof(og_bf16);
        size_t copies = STREAM_BYTES / bytes + 1;
        og_bf16 *w = og_malloc(copies * bytes);
        char *dst = og_malloc(bytes);
        float *x = og_malloc((size_t)sh->K * sizeof(float));
        float *out = og_malloc((size_t)sh->N * sizeof(float));
        if (!w || !dst || !x || !out) {
            fprintf(stderr, "bench_ops_cpu: out of memory\n");
            return 1;
        }
        for (size_t c = 0; c < copies; c++) fill_bf16(w + c * elems, elems, (uint32_t)(c + 1));
        for (int64_t k = 0; k < sh->K; k++) x[k] = (float)((k % 7) - 3) * 0.25f;

        int reps = (int)(copies * 4 > 64 ? copies * 4 : 64);
        og_matmul_cpu(pool, x, w, NULL, OG_DTYPE_BF16, 1, sh->K, sh->N, out); /* warm */
        double t0 = og_time_now();
        for (int r = 0; r < reps; r++)
            og_matmul_cpu(pool, x, w + (size_t)(r % (int)copies) * elems, NULL, OG_DTYPE_BF16,
                          1, sh->K, sh->N, out);
        double gemv = (og_time_now() - t0) / reps;

        copy_job cj = {dst, NULL, bytes, (bytes + 2 * (size_t)og_threadpool_size(pool) - 1) /
                                             (2 * (size_t)og_threadpool_size(pool))};
        double t1 = og_time_now();
        for (int r = 0; r < reps; r++) {
            cj.src = (const char *)(w + (size_t)(r % (int)copies) * elems);
            og_parallel_for(pool, (int64_t)((bytes + cj.chunk - 1) / cj.chunk), copy_task, &cj);
        }
        double copy = (og_time_now() - t1) / reps;

        printf("%-10s %6lld %7lld %10.2f %9.1f %10.1f %16.1f %7.2f\n", sh->name,
               (long long)sh->K, (long long)sh->N, bytes / 1e6, gemv * 1e6, bytes / gemv / 1e9,
               2.0 * bytes / copy / 1e9, (bytes / gemv) / (2.0 * bytes / copy));
        int mult = sh->per_layer ? LAYERS : 1;
        step_gemv += mult * gemv;
        step_copy += mult * copy;
        step_bytes += (size_t)mult * bytes;
        og_free(w);
        og_free(dst);
        og_free(x);
        og_free(out);
    }
    printf("\nper token (28 layers + lm_head): %.1f MB of weights, GEMVs %.2f ms = %.1f tok/s "
           "(%.1f GB/s); memcpy of the same bytes %.2f ms\n\n",
           step_bytes / 1e6, step_gemv * 1e3, 1.0 / step_gemv, step_bytes / step_gemv / 1e9,
           step_copy * 1e3);

    if (prefill(pool, og_matmul_cpu, "f32 activations: panels widened to f32, OpenBLAS sgemm") ||
        prefill(pool, og_matmul_bf16_cpu,
                og_cpu_has_avx512_bf16() ? "bf16 activations: vdpbf16ps"
                                         : "bf16 activations: rounded, then as above"))
        return 1;
    og_threadpool_destroy(pool);
    return 0;
}
