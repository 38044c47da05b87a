/* Times the fast CPU update_and_attend against the reference for one decode
 * step over a 32k-token history with the Qwen3-0.6B attention shape
 * (Hq = 16, Hkv = 8, D = 128, bf16 storage, or int8 / fp8: quants and a
 * scale per token and head): median of several runs, the
 * ratio, and the KV bandwidth achieved (bytes of k and v read per second).
 * With a layer count, the fast kernel's decode step runs over that many
 * layers' storage in turn, as a model's does, so a short history still comes
 * from memory rather than from the last-level cache.
 *
 * Letters: Hq/Hkv heads, D head dim, L history length.
 *
 * Usage: bench_attend_cpu [L] [threads] [layers] [bf16|int8|fp8]
 *        (defaults 32768, all CPUs, 1, bf16) */
#include "kernels/attend.h"
#include "core/kv_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 16, HKV = 8, D = 128 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef og_status (*kernel_fn)(const og_attend_args *a, og_threadpool *pool);
static og_status run_ref(const og_attend_args *a, og_threadpool *pool) {
    (void)pool;
    return og_update_and_attend_ref(a);
}
static int64_t g_layers = 1;
static unsigned char *g_k, *g_v; /* [layers, rows, row bytes] each */
static size_t g_layer_bytes;
static og_status run_fast(const og_attend_args *a, og_threadpool *pool) {
    og_attend_args b = *a;
    for (int64_t i = 0; i < g_layers; i++) {
        b.kv.k = g_k + (size_t)i * g_layer_bytes;
        b.kv.v = g_v + (size_t)i * g_layer_bytes;
        og_status st = og_update_and_attend_cpu(&b, pool, NULL);
        if (st != OG_OK) return st;
    }
    return OG_OK;
}

/* Median wall time of `runs` calls, in seconds; negative on failure. */
static double median_time(kernel_fn fn, const og_attend_args *a, og_threadpool *pool, int runs) {
    double t[16];
    if (fn(a, pool) != OG_OK) return -1; /* warm-up: caches, page faults */
    for (int i = 0; i < runs; i++) {
        const double t0 = og_time_now();
        if (fn(a, pool) != OG_OK) return -1;
        t[i] = og_time_now() - t0;
    }
    qsort(t, (size_t)runs, sizeof t[0], cmp_double);
    return t[runs / 2];
}

int main(int argc, char **argv) {
    const int64_t L = argc > 1 ? atoll(argv[1]) : 32768;
    const int threads = argc > 2 ? atoi(argv[2]) : 0;
    g_layers = argc > 3 ? atoll(argv[3]) : 1;
    const char *kv_name = argc > 4 ? argv[4] : "bf16";
    const og_dtype dt = !strcmp(kv_name, "int8") ? OG_DTYPE_INT8
                        : !strcmp(kv_name, "fp8") ? OG_DTYPE_FP8
                        : !strcmp(kv_name, "bf16") ? OG_DTYPE_BF16
                                                   : OG_DTYPE_COUNT;
    if (L < 1 || g_layers < 1 || dt == OG_DTYPE_COUNT) {
        fprintf(stderr, "usage: bench_attend_cpu [L >= 1] [threads] [layers >= 1] [bf16|int8|fp8]\n");
        return 2;
    }
    const int64_t rows = L + 1, row_bytes = og_kv_dtype_row_bytes(dt, HKV, D);
    g_layer_bytes = (size_t)(rows * row_bytes);
    unsigned char *k = malloc(g_layer_bytes * (size_t)g_layers), *v = malloc(g_layer_bytes * (size_t)g_layers);
    g_k = k, g_v = v;
    float q[HQ * D], kn[HKV * D], vn[HKV * D], out_fast[HQ * D], out_ref[HQ * D];
    og_threadpool *pool = og_threadpool_create(threads);
    if (!k || !v || !pool) {
        fprintf(stderr, "bench_attend_cpu: out of memory\n");
        return 1;
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    float kr[HKV * D], vr[HKV * D]; /* one row of k and v */
    for (size_t r = 0; r < (size_t)(rows * g_layers); r++) {
        for (int i = 0; i < HKV * D; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            kr[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
            vr[i] = (float)((s >> 20) & 0xffff) / 32768.0f - 1.0f;
        }
        unsigned char *kd = k + r * (size_t)row_bytes, *vd = v + r * (size_t)row_bytes;
        if (og_kv_dtype_quantized(dt)) {
            og_kv_quantize_row(dt, kr, HKV, D, kd);
            og_kv_quantize_row(dt, vr, HKV, D, vd);
        } else {
            for (int i = 0; i < HKV * D; i++) {
                ((og_bf16 *)kd)[i] = og_bf16_from_f32(kr[i]);
                ((og_bf16 *)vd)[i] = og_bf16_from_f32(vr[i]);
            }
        }
    }
    for (int i = 0; i < HQ * D; i++) q[i] = sinf((float)i);
    for (int i = 0; i < HKV * D; i++) kn[i] = cosf((float)i), vn[i] = sinf(0.5f * (float)i);

    og_attend_args a = {.q = q, .k = kn, .v = vn, .T = 1, .n_heads = HQ,
                        .kv = {.policy = OG_KV_FLAT, .dtype = dt, .n_kv_heads = HKV,
                               .head_dim = D, .rows = rows, .length = L, .k = k, .v = v}};
    og_attend_stats stats = {0};
    a.out = out_fast;
    if (og_update_and_attend_cpu(&a, pool, &stats) != OG_OK) {
        fprintf(stderr, "bench_attend_cpu: %s\n", og_last_error());
        return 1;
    }
    const double t_fast = median_time(run_fast, &a, pool, 15);
    a.out = out_ref;
    const double t_ref = median_time(run_ref, &a, NULL, 3);
    if (t_fast < 0 || t_ref < 0) {
        fprintf(stderr, "bench_attend_cpu: %s\n", og_last_error());
        return 1;
    }
    /* the timed fast runs ended on the last layer's storage; compare on the
     * first layer's, which the reference read */
    a.out = out_fast;
    if (og_update_and_attend_cpu(&a, pool, NULL) != OG_OK) {
        fprintf(stderr, "bench_attend_cpu: %s\n", og_last_error());
        return 1;
    }
    double max_diff = 0;
    for (int i = 0; i < HQ * D; i++) {
        const double d = fabs((double)out_fast[i] - out_ref[i]);
        if (d > max_diff) max_diff = d;
    }
    const double kv_bytes = 2.0 * (double)rows * (double)row_bytes;
    const double t_fast1 = t_fast / (double)g_layers; /* per layer */
    printf("decode over L=%lld (Hq=%d Hkv=%d D=%d %s), %d threads, %s, %d splits, "
           "%lld layers\n", (long long)L, HQ, HKV, D, og_dtype_name(dt), og_threadpool_size(pool),
           og_cpu_isa_name(og_cpu_isa_active()), stats.splits, (long long)g_layers);
    printf("reference  %9.3f ms  (median of 3)   %7.2f GB/s\n", t_ref * 1e3, kv_bytes / t_ref / 1e9);
    printf("fast       %9.3f ms  per layer (median of 15)  %7.2f GB/s\n", t_fast1 * 1e3,
           kv_bytes / t_fast1 / 1e9);
    printf("speed-up   %9.1fx   max |fast - ref| = %.3g\n", t_ref / t_fast1, max_diff);
    og_threadpool_destroy(pool);
    free(k);
    free(v);
    return 0;
}
