/* bench_copy: the machine's memory copy rate (bytes read + written per
 * second) with a threaded memcpy over buffers far larger than the caches:
 * the ceiling that decode speed is read against.
 *   bench_copy [threads] [MiB per buffer]      (defaults: all CPUs, 512) */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    char *dst;
    const char *src;
    size_t bytes, chunk;
} copy_job;

static void copy_task(void *ctx, int64_t i, int thread) {
    (void)thread;
    const copy_job *j = ctx;
    size_t off = (size_t)i * j->chunk;
    size_t n = off + j->chunk > j->bytes ? j->bytes - off : j->chunk;
    memcpy(j->dst + off, j->src + off, n);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    size_t bytes = (size_t)(argc > 2 ? atol(argv[2]) : 512) << 20;
    og_threadpool *pool = og_threadpool_create(threads);
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!pool || !src || !dst) {
        fprintf(stderr, "bench_copy: no memory\n");
        return 1;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    int n = og_threadpool_size(pool);
    copy_job j = {dst, src, bytes, (bytes / (size_t)(4 * n) + 4095) & ~(size_t)4095};
    int64_t items = (int64_t)((bytes + j.chunk - 1) / j.chunk);
    double best = 1e30;
    for (int rep = 0; rep < 12; rep++) {
        double t0 = og_time_now();
        og_parallel_for(pool, items, copy_task, &j);
        double dt = og_time_now() - t0;
        if (rep >= 2 && dt < best) best = dt;
    }
    printf("copy %zu MiB with %d threads: %.1f GB/s (bytes read + written, best of 10)\n", bytes >> 20, n,
           2.0 * (double)bytes / best / 1e9);
    free(src);
    free(dst);
    og_threadpool_destroy(pool);
    return 0;
}
