/* Matmul throughput with quantized weights on the Qwen3-0.6B shapes:
 *  - decode GEMV (T = 1) and R decode rows (og_matmul_rows_cpu): time and
 *    weight GB/s, weights cycling through copies larger than the last-level
 *    cache so every call streams them from memory, as a decode step does;
 *  - prefill (T = 128): time and GFLOP/s.
 * A per-token projection sums 28 layers of products plus the logits matmul.
 * Usage: bench_kquant_cpu [dtype [threads [R]]]   dtype: q4_k (default),
 * q5_k, q6_k, q2_k, q3_k, q8, q4, bf16; threads default: online CPUs.
 * Letters: T tokens, R decode rows, K in features, N out features. */
#include "core/core.h"
#include "kernels/ops.h"

#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 28 };
#define STREAM_BYTES ((size_t)512 << 20)

typedef struct {
    const char *name;
    int64_t K, N;
    int per_layer;
} shape;

static const shape SHAPES[] = {
    {"q_proj", 1024, 2048, 1},  {"k_proj", 1024, 1024, 1},    {"v_proj", 1024, 1024, 1},
    {"o_proj", 2048, 1024, 1},  {"gate_proj", 1024, 3072, 1}, {"up_proj", 1024, 3072, 1},
    {"down_proj", 3072, 1024, 1}, {"lm_head", 1024, 151936, 0},
};

/* [N, K] of dt from deterministic values (quantized by og_quantize_rows). */
static void *make_weights(og_dtype dt, int64_t N, int64_t K, uint32_t seed, size_t *bytes) {
    const int64_t shape2[2] = {N, K};
    int64_t b = 0;
    og_tensor_bytes(dt, 2, shape2, &b);
    *bytes = (size_t)b;
    float *f = og_malloc((size_t)(N * K) * sizeof(float));
    void *w = og_malloc((size_t)b);
    for (int64_t i = 0; i < N * K; i++) {
        seed = seed * 1664525u + 1013904223u;
        f[i] = (float)((int)(seed >> 9) - (1 << 22)) * 0x1p-28f;
    }
    if (og_dtype_is_quantized(dt)) og_quantize_rows(dt, f, N, K, w);
    else for (int64_t i = 0; i < N * K; i++) og_store_f32(w, dt, (size_t)i, f[i]);
    og_free(f);
    return w;
}

int main(int argc, char **argv) {
    og_dtype dt = OG_DTYPE_Q4_K;
    if (argc > 1 && og_dtype_parse(argv[1], &dt) != OG_OK) {
        fprintf(stderr, "bench_kquant_cpu: unknown dtype %s\n", argv[1]);
        return 2;
    }
    og_threadpool *pool = og_threadpool_create(argc > 2 ? atoi(argv[2]) : 0);
    const int64_t R = argc > 3 ? atoi(argv[3]) : 4;
    if (!pool || R < 1) return 1;
    printf("%s weights, threads %d, isa %s\n\n", og_dtype_name(dt), og_threadpool_size(pool),
           og_cpu_isa_name(og_cpu_isa_active()));
    printf("%-10s %6s %7s %8s %9s %8s %11s %8s %12s %9s\n", "matrix", "K", "N", "MB", "T=1 us", "GB/s", "R rows us",
           "GB/s", "T=128 ms", "GFLOP/s");
    double step1 = 0, stepR = 0, stepP = 0;
    size_t step_bytes = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const shape *sh = &SHAPES[s];
        size_t bytes = 0;
        void *w0 = make_weights(dt, sh->N, sh->K, 7, &bytes);
        const size_t copies = STREAM_BYTES / bytes + 1;
        char *w = og_malloc(copies * bytes);
        for (size_t c = 0; c < copies; c++) memcpy(w + c * bytes, w0, bytes);
        og_free(w0);
        const int64_t T = 128;
        float *x = og_malloc((size_t)(T * sh->K) * sizeof(float));
        float *out = og_malloc((size_t)(T * sh->N) * sizeof(float));
        for (int64_t i = 0; i < T * sh->K; i++) x[i] = (float)((i % 11) - 5) * 0.125f;
        const int reps = (int)(copies * 2 > 32 ? copies * 2 : 32);
        og_matmul_cpu(pool, x, w, NULL, dt, 1, sh->K, sh->N, out);
        double t0 = og_time_now();
        for (int r = 0; r < reps; r++)
            og_matmul_cpu(pool, x, w + (size_t)(r % (int)copies) * bytes, NULL, dt, 1, sh->K, sh->N, out);
        const double g1 = (og_time_now() - t0) / reps;
        t0 = og_time_now();
        for (int r = 0; r < reps; r++)
            og_matmul_rows_cpu(pool, x, w + (size_t)(r % (int)copies) * bytes, NULL, dt, R, sh->K, sh->N, out);
        const double gR = (og_time_now() - t0) / reps;
        const double f = 2.0 * (double)T * (double)sh->K * (double)sh->N;
        const int preps = (int)(4e9 / f) + 1;
        og_matmul_cpu(pool, x, w, NULL, dt, T, sh->K, sh->N, out);
        t0 = og_time_now();
        for (int r = 0; r < preps; r++) og_matmul_cpu(pool, x, w, NULL, dt, T, sh->K, sh->N, out);
        const double gp = (og_time_now() - t0) / preps;
        printf("%-10s %6lld %7lld %8.2f %9.1f %8.1f %11.1f %8.1f %12.3f %9.1f\n", sh->name, (long long)sh->K,
               (long long)sh->N, bytes / 1e6, g1 * 1e6, bytes / g1 / 1e9, gR * 1e6, bytes / gR / 1e9, gp * 1e3,
               f / gp / 1e9);
        const int mult = sh->per_layer ? LAYERS : 1;
        step1 += mult * g1;
        stepR += mult * gR;
        stepP += mult * gp;
        step_bytes += (size_t)mult * bytes;
        og_free(w);
        og_free(x);
        og_free(out);
    }
    printf("\nper token (28 layers + lm_head): %.1f MB of weights; T=1 %.2f ms = %.1f tok/s (%.1f GB/s); "
           "%lld rows %.2f ms = %.1f tok/s; 128-token prefill %.1f ms = %.0f tok/s\n",
           step_bytes / 1e6, step1 * 1e3, 1.0 / step1, step_bytes / step1 / 1e9, (long long)R, stepR * 1e3,
           (double)R / stepR, stepP * 1e3, 128.0 / stepP);
    og_threadpool_destroy(pool);
    return 0;
}
