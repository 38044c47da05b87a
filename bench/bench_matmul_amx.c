/* The AMX bf16 prefill product (og_matmul_bf16_amx) on the Qwen3-0.6B
 * shapes at T tokens: every product of a layer (q, k, v, o, gate, up, down),
 * over 28 layers of weights (840 MB, so each call reads its weights from
 * memory as a prefill does), ms per shape summed over the layers, GFLOP/s
 * and the tokens/s of these products alone; the best of `rounds` rounds.
 * OG_BENCH_LAYERS=1 keeps one layer (weights from the caches). To compare
 * two builds, run each one's copy alternately.
 * Usage: bench_matmul_amx [threads] [T] [rounds]
 * Letters: T tokens, K in features, N out features. */
#include "core/core.h"
#include "kernels/matmul_amx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SHAPES = 7, MAX_VARIANTS = 1 };
static int LAYERS = 28;

static const struct {
    const char *name;
    int64_t K, N;
} SHAPE[SHAPES] = {
    {"q_proj", 1024, 2048}, {"k_proj", 1024, 1024}, {"v_proj", 1024, 1024},  {"o_proj", 2048, 1024},
    {"gate", 1024, 3072},   {"up", 1024, 3072},     {"down", 3072, 1024},
};

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    if (getenv("OG_BENCH_LAYERS")) LAYERS = atoi(getenv("OG_BENCH_LAYERS"));
    const int64_t T = argc > 2 ? atoll(argv[2]) : 128;
    const int rounds = argc > 3 ? atoi(argv[3]) : 5;
    const int nv = 1;
    og_threadpool *pool = og_threadpool_create(threads);
    if (!pool || !og_cpu_has_amx_bf16()) {
        fprintf(stderr, "bench_matmul_amx: %s\n", pool ? "no AMX here" : "cannot start threads");
        return 1;
    }
    og_bf16 *w[SHAPES];
    float *x = og_malloc((size_t)T * 3072 * sizeof(float));
    float *out = og_malloc((size_t)T * 3072 * sizeof(float));
    if (!x || !out) return 1;
    for (int64_t i = 0; i < T * 3072; i++) x[i] = (float)((i % 11) - 5) * 0.125f;
    for (int s = 0; s < SHAPES; s++) {
        const size_t elems = (size_t)(SHAPE[s].K * SHAPE[s].N);
        w[s] = og_malloc(elems * LAYERS * sizeof(og_bf16));
        if (!w[s]) return 1;
        uint32_t seed = (uint32_t)s + 1;
        for (size_t i = 0; i < elems; i++) {
            seed = seed * 1664525u + 1013904223u;
            w[s][i] = og_bf16_from_f32((float)((int)(seed >> 9) - (1 << 22)) * 0x1p-28f);
        }
        for (int l = 1; l < LAYERS; l++) memcpy(w[s] + (size_t)l * elems, w[s], elems * sizeof(og_bf16));
    }
    double best[MAX_VARIANTS][SHAPES];
    for (int v = 0; v < nv; v++)
        for (int s = 0; s < SHAPES; s++) best[v][s] = 1e30;
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < nv; v++) {
            for (int s = 0; s < SHAPES; s++) {
                const size_t elems = (size_t)(SHAPE[s].K * SHAPE[s].N);
                const double t0 = og_time_now();
                for (int l = 0; l < LAYERS; l++)
                    if (og_matmul_bf16_amx(pool, x, w[s] + (size_t)l * elems, NULL, T, SHAPE[s].K, SHAPE[s].N, out)) {
                        fprintf(stderr, "bench_matmul_amx: %s\n", og_last_error());
                        return 1;
                    }
                const double dt = og_time_now() - t0;
                if (dt < best[v][s]) best[v][s] = dt;
            }
        }
    printf("og_matmul_bf16_amx, T %lld, threads %d, %d layers, best of %d rounds\n", (long long)T,
           og_threadpool_size(pool), LAYERS, rounds);
    printf("%-8s %5s %5s", "matrix", "K", "N");
    for (int v = 0; v < nv; v++) printf("   %10s %8s", "ms", "GFLOP/s");
    printf("\n");
    double sum[MAX_VARIANTS] = {0}, flops = 0;
    for (int s = 0; s < SHAPES; s++) {
        const double f = 2.0 * (double)T * (double)SHAPE[s].K * (double)SHAPE[s].N * LAYERS;
        flops += f;
        printf("%-8s %5lld %5lld", SHAPE[s].name, (long long)SHAPE[s].K, (long long)SHAPE[s].N);
        for (int v = 0; v < nv; v++) {
            sum[v] += best[v][s];
            printf("   %10.2f %8.0f", best[v][s] * 1e3, f / best[v][s] / 1e9);
        }
        for (int v = 1; v < nv; v++) printf("   x%.2f", best[0][s] / best[v][s]);
        printf("\n");
    }
    printf("all, %2d layers      ", LAYERS);
    for (int v = 0; v < nv; v++) printf("   %10.2f %8.0f", sum[v] * 1e3, flops / sum[v] / 1e9);
    for (int v = 1; v < nv; v++) printf("   x%.2f", sum[0] / sum[v]);
    printf("\n");
    printf("these products alone at %.0f tok/s\n", (double)T / sum[0]);
    for (int s = 0; s < SHAPES; s++) og_free(w[s]);
    og_free(x);
    og_free(out);
    og_threadpool_destroy(pool);
    return 0;
}
