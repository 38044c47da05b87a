/* AMX tile products for the bf16 prefill matmul (see matmul_amx.h).
 *
 * A tile product C[M, N'] += A[M, 32] B[32, N'] (TDPBF16PS) wants B in pairs
 * of k (row r of a B tile holds k = 2r, 2r + 1 of every column). Rows of the
 * weight matrix [N, K] are already the A layout: 16 out features x 32 k
 * straight from memory, no packing. So the kernel computes the transpose,
 * C[n, t] = sum_k w[n, k] x[t, k]: A tiles are weight rows, B tiles the
 * activations, rounded to bf16 and packed once per call into k pairs,
 * xp [TP/16, K/32, 16 pairs, 16 tokens, 2] (TP = T rounded up to 32; tokens
 * past T are zero). Each C tile is stored to a 16 x 16 buffer and written to
 * out transposed, with the bias.
 *
 * Blocking: 4 C tiles (2 x 16 out features by 2 x 16 tokens), 2 A and 2 B
 * tiles, all 8 tile registers: per 32 k, 4 tile loads feed 4 products. A
 * task takes NB out features and every token block of them, so its weight
 * rows come from memory for the first token block and from cache for the
 * others. Out features past a multiple of 32 are copied into a zero-padded
 * 32-row scratch so the tiles stay whole. */
#include "kernels/matmul_amx.h"

#include "kernels/ops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_amx_allowed = 1;

void og_cpu_amx_allow(bool allow) { atomic_store(&g_amx_allowed, allow ? 1 : 0); }

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define OG_ARCH_REQ_XCOMP_PERM 0x1023 /* asm/prctl.h: ask for an XSAVE feature's state */
#define OG_XFEATURE_XTILEDATA 18

enum { NB = 64, TB = 16, KB = 32 };

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_amx_usable;

/* CPUID.(7, 0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; then the kernel must
 * let this process use the tile data state (Linux 5.16 and later).
 * OG_CPU_AMX=0 in the environment keeps it off (benchmarks compare). */
static void amx_probe(void) {
    unsigned a, b, c, d;
    const char *env = getenv("OG_CPU_AMX");
    if (env && !strcmp(env, "0")) return;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return;
    g_amx_usable = syscall(SYS_arch_prctl, OG_ARCH_REQ_XCOMP_PERM, OG_XFEATURE_XTILEDATA) == 0;
}

bool og_cpu_has_amx_bf16(void) {
    pthread_once(&g_once, amx_probe);
    return g_amx_usable && atomic_load(&g_amx_allowed) && og_cpu_has_avx512_bf16();
}

typedef struct {
    const float *x;       /* [T, K]                         */
    const og_bf16 *w;     /* [N, K]                         */
    const og_bf16 *bias;  /* [N] or NULL                    */
    int64_t T, K, N, TP;
    og_bf16 *xp;          /* [TP/16, K/32, 16, 16, 2]       */
    og_bf16 *scratch;     /* [threads, 32, K]: rows, tails  */
    float *out;           /* [T, N]                         */
} amx_job;

/* 16 tokens of x (block b) rounded to bf16 and scattered into k pairs. */
static void pack_task(void *ctx, int64_t b, int thread) {
    const amx_job *j = ctx;
    const int64_t K = j->K, kblocks = K / KB;
    og_bf16 *row = j->scratch + (size_t)thread * 32 * (size_t)K; /* [K] */
    uint32_t *blk = (uint32_t *)(j->xp + (size_t)b * (size_t)kblocks * TB * KB); /* [K/32, 16, 16] pairs */
    for (int64_t i = 0; i < TB; i++) {
        const int64_t t = b * TB + i;
        if (t < j->T) og_f32_to_bf16_cpu(j->x + t * K, row, (size_t)K);
        else memset(row, 0, (size_t)K * sizeof *row);
        for (int64_t kb = 0; kb < kblocks; kb++)
            for (int64_t r = 0; r < KB / 2; r++) {
                uint32_t pair;
                memcpy(&pair, row + kb * KB + 2 * r, sizeof pair);
                blk[(kb * (KB / 2) + r) * TB + i] = pair;
            }
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f")

/* c[4][16][16]: C tiles (n block i, token block k) at c[2i + k]. */
static void block_kernel(const og_bf16 *w0, const og_bf16 *w1, int64_t K, const og_bf16 *b0, const og_bf16 *b1,
                         float c[4][TB][TB]) {
    const int64_t kblocks = K / KB;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kblocks; kb++) {
        _tile_loadd(4, w0 + kb * KB, K * (int64_t)sizeof(og_bf16));
        _tile_loadd(5, w1 + kb * KB, K * (int64_t)sizeof(og_bf16));
        _tile_loadd(6, b0 + kb * TB * KB, TB * 2 * (int64_t)sizeof(og_bf16));
        _tile_loadd(7, b1 + kb * TB * KB, TB * 2 * (int64_t)sizeof(og_bf16));
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c[0], TB * sizeof(float));
    _tile_stored(1, c[1], TB * sizeof(float));
    _tile_stored(2, c[2], TB * sizeof(float));
    _tile_stored(3, c[3], TB * sizeof(float));
}

static void tiles_task(void *ctx, int64_t task, int thread) {
    const amx_job *j = ctx;
    const int64_t K = j->K, kblocks = K / KB;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64; /* C: 16 f32; A: 32 bf16; B: 16 pairs of bf16 */
    }
    _tile_loadconfig(&cfg);
    og_bf16 *pad = j->scratch + (size_t)thread * 32 * (size_t)K; /* [32, K] */
    const int64_t n_end = (task + 1) * NB < j->N ? (task + 1) * NB : j->N;
    float c[4][TB][TB];
    for (int64_t n0 = task * NB; n0 < n_end; n0 += 32) {
        const int64_t nn = n_end - n0 < 32 ? n_end - n0 : 32;
        const og_bf16 *w = j->w + (size_t)n0 * (size_t)K;
        if (nn < 32) { /* the last rows, zero-padded to a whole pair of tiles */
            memcpy(pad, w, (size_t)nn * (size_t)K * sizeof *pad);
            memset(pad + nn * K, 0, (size_t)(32 - nn) * (size_t)K * sizeof *pad);
            w = pad;
        }
        float bias[32] = {0};
        if (j->bias)
            for (int64_t i = 0; i < nn; i++) bias[i] = og_f32_from_bf16(j->bias[n0 + i]);
        for (int64_t t0 = 0; t0 < j->T; t0 += 2 * TB) {
            const og_bf16 *b0 = j->xp + (size_t)(t0 / TB) * (size_t)kblocks * TB * KB;
            block_kernel(w, w + TB * K, K, b0, b0 + kblocks * TB * KB, c);
            for (int k = 0; k < 2; k++)
                for (int64_t tt = 0; tt < TB && t0 + k * TB + tt < j->T; tt++) {
                    float *o = j->out + (t0 + k * TB + tt) * j->N + n0;
                    for (int64_t i = 0; i < nn; i++) o[i] = c[2 * (i / TB) + k][i % TB][tt] + bias[i];
                }
        }
    }
    _tile_release();
}

#pragma GCC pop_options

og_status og_matmul_bf16_amx(og_threadpool *pool, const float *x, const og_bf16 *weight, const og_bf16 *bias,
                             int64_t T, int64_t K, int64_t N, float *out) {
    if (!og_cpu_has_amx_bf16() || K % KB)
        return og_set_error(OG_ERR_UNSUPPORTED, "matmul_bf16_amx: no AMX here, or K = %lld is not a multiple of %d",
                            (long long)K, KB);
    const int64_t TP = (T + 2 * TB - 1) / (2 * TB) * (2 * TB);
    const int threads = og_threadpool_size(pool);
    og_bf16 *xp = og_malloc((size_t)TP * (size_t)K * sizeof *xp);
    og_bf16 *scratch = og_malloc((size_t)threads * 32 * (size_t)K * sizeof *scratch);
    if (!xp || !scratch) {
        og_free(xp);
        og_free(scratch);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "matmul_bf16_amx: no memory to pack %lld x %lld activations",
                            (long long)T, (long long)K);
    }
    amx_job j = {x, weight, bias, T, K, N, TP, xp, scratch, out};
    og_parallel_for(pool, TP / TB, pack_task, &j);
    og_parallel_for(pool, (N + NB - 1) / NB, tiles_task, &j);
    og_free(xp);
    og_free(scratch);
    return OG_OK;
}

#else /* no AMX intrinsics: never usable */

bool og_cpu_has_amx_bf16(void) { return false; }

og_status og_matmul_bf16_amx(og_threadpool *pool, const float *x, const og_bf16 *weight, const og_bf16 *bias,
                             int64_t T, int64_t K, int64_t N, float *out) {
    (void)pool, (void)x, (void)weight, (void)bias, (void)T, (void)K, (void)N, (void)out;
    return og_set_error(OG_ERR_UNSUPPORTED, "matmul_bf16_amx: built without AMX support");
}

#endif
