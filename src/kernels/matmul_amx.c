/* AMX tile products for the bf16 prefill matmul (see matmul_amx.h).
 *
 * A tile product C[M, N'] += A[M, 32] B[32, N'] (TDPBF16PS) wants B in pairs
 * of k (row r of a B tile holds k = 2r, 2r + 1 of every column). Rows of the
 * weight matrix [N, K] are already the A layout (16 out features x 32 k), so
 * the kernel computes the transpose, C[n, t] = sum_k w[n, k] x[t, k]: A
 * tiles are weight rows, B tiles the activations, rounded to bf16 and packed
 * once per call into k pairs, xp [TP/16, K/32, 16 pairs, 16 tokens, 2]
 * (TP = T rounded up to 32; tokens past T are zero).
 *
 * Blocking: 4 C tiles (2 x 16 out features by 2 x 16 tokens), 2 A and 2 B
 * tiles, all 8 tile registers: per 32 k, 4 tile loads feed 4 products, over
 * all of K before the C tiles are stored (so each output sums its k in
 * order, 32 at a time). A panel is 32 out features: its weight rows are
 * copied into a per-thread buffer in tile order, [K/32][2 tiles][16 rows]
 * [32 k] (1 KB a tile, loaded at a 64-byte stride), and every 32-token block
 * runs from it. Loading A tiles straight from the weights instead (a stride
 * of 2K bytes: 16 rows in 2 or 1 L1 sets, and 32 row streams from memory on
 * the first token block) ran the 0.6B shapes at 0.3-0.45 TFLOP/s.
 *
 * Memory and tiles overlap: a worker copies the next panel into its second
 * buffer a few 64-byte pieces after each 32-k step of this panel's products,
 * in the order the weights lie (a panel's rows are adjacent, so one
 * sequential stream, with a software prefetch PREFETCH bytes ahead), and so
 * reads each weight once, from memory, while the tile unit works. Workers
 * claim PANELS panels at a time from a shared counter, the next claim made
 * while the last panel of the previous one runs, so only a worker's first
 * panel is copied with no products beside it. Each C tile is stored to a
 * 16 x 16 buffer, transposed in zmm registers and written to out with the
 * bias, 16 features a store; the last panel's missing rows are zeros.
 * Scratch: 2 panels (128 K bytes) per thread, plus xp, both og_scratch's
 * (kept by the calling thread between calls).
 *
 * Quantized weights (q8, q4, the k-quants: og_matmul_quant_amx) take the
 * same tiles. A panel's 32 rows are dequantized exactly to f32 (the values
 * og_dequantize_row gives) and each weight split into two bf16 values, hi =
 * bf16(w) and lo = bf16(w - hi), both rounded to nearest: hi + lo is w
 * within 2^-16 |w|, where bf16 alone would be 2^-8. The panel holds both,
 * [K/32][hi, lo][2 tiles][16 rows][32 k], and every 32 k runs 8 products
 * (hi and lo into the same C tiles) for the bf16 path's 4. The panel is
 * made whole before its products (one buffer; quantized weights are a
 * fraction of bf16's bytes, so the overlap matters less), and the f32 rows
 * of the dequantization sit beside it: 256 K bytes per thread in all. */
#include "kernels/matmul_amx.h"

#include "kernels/ops_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_amx_allowed = 1;

void og_cpu_amx_allow(bool allow) { atomic_store(&g_amx_allowed, allow ? 1 : 0); }

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>

#include "kernels/bf16_split_x86.h"
#include <sys/syscall.h>
#include <unistd.h>

#define OG_ARCH_REQ_XCOMP_PERM 0x1023 /* asm/prctl.h: ask for an XSAVE feature's state */
#define OG_XFEATURE_XTILEDATA 18

/* PANELS panels of 32 out features per claim of a worker: one stretch of
 * weights read in order, next to the one it claimed before */
enum { TB = 16, KB = 32, PANELS = 8, PREFETCH = 1024 };

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
    const void *w;        /* [N, K] of dt                   */
    og_dtype dt;          /* bf16, or a quantized format     */
    const void *bias;     /* [N] of og_bias_dtype(dt), or NULL */
    int64_t T, K, N, TP;
    og_cpu_isa isa;
    og_bf16 *xp;          /* [TP/16, K/32, 16, 16, 2]       */
    og_bf16 *scratch;     /* [threads, stride]              */
    int64_t stride;       /* bf16: 2 panels [2, 32, K]; quantized: the hi / lo panel [2, 32, K] and f32 rows [32, K] */
    float *out;           /* [T, N]                         */
    atomic_llong next_claim; /* the next PANELS panels a worker takes */
} amx_job;

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")

/* 16 x 16 32-bit elements, rows `stride` elements apart: r[i][j] = in[j][i]. */
static inline void transpose16(const float *in, int64_t stride, __m512 r[TB]) {
    __m512 t[TB];
    for (int i = 0; i < TB; i++) r[i] = _mm512_loadu_ps(in + i * stride);
    for (int i = 0; i < TB; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < TB; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < TB; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* 16 tokens of x (block b) rounded to bf16 and scattered into k pairs:
 * the 16 rows are rounded into the thread's panel buffer, then each block
 * of 16 pairs x 16 tokens is one 16 x 16 transpose of 32-bit pairs. */
static void pack_task(void *ctx, int64_t b, int thread) {
    const amx_job *j = ctx;
    const int64_t K = j->K, kblocks = K / KB;
    og_bf16 *rows = j->scratch + (size_t)thread * (size_t)j->stride; /* [16, K] in a panel buffer */
    for (int64_t i = 0; i < TB; i++) {
        const int64_t t = b * TB + i;
        if (t < j->T) og_f32_to_bf16_cpu(j->x + t * K, rows + i * K, (size_t)K);
        else memset(rows + i * K, 0, (size_t)K * sizeof *rows);
    }
    float *blk = (float *)(j->xp + (size_t)b * (size_t)kblocks * TB * KB); /* [K/32, 16 pairs, 16 tokens] */
    for (int64_t kb = 0; kb < kblocks; kb++) {
        __m512 r[TB];
        transpose16((const float *)(rows + kb * KB), K / 2, r); /* row i: token i's 16 pairs of the block */
        for (int p = 0; p < TB; p++) _mm512_storeu_ps(blk + (kb * TB + p) * TB, r[p]);
    }
}

/* Copies a panel's weight rows into its tile order a few 64-byte pieces at
 * a time, in the order they lie in memory (the panel's rows are adjacent:
 * one sequential stream), asking for the piece PREFETCH bytes ahead. */
typedef struct {
    const og_bf16 *src; /* the panel's first row */
    og_bf16 *dst;       /* [K/32, 2, 16, 32]     */
    int64_t r, q;       /* next piece: row r, k = 32 q */
    int64_t rows, kblocks;
} panel_copy;

static inline void copy_pieces(panel_copy *pc, int64_t pieces) {
    for (int64_t u = 0; u < pieces && pc->r < pc->rows; u++) {
        const og_bf16 *s = pc->src + (pc->r * pc->kblocks + pc->q) * KB;
        _mm_prefetch((const char *)s + PREFETCH, _MM_HINT_T2);
        _mm512_store_si512((void *)(pc->dst + pc->q * 2 * TB * KB + pc->r * KB), _mm512_loadu_si512((const void *)s));
        if (++pc->q == pc->kblocks) pc->q = 0, pc->r++;
    }
}

/* Rows past a panel's last real row are zeros (whole tiles). */
static void zero_rows(og_bf16 *panel, int64_t kblocks, int64_t rows) {
    for (int64_t kb = 0; kb < kblocks; kb++)
        for (int64_t r = rows; r < 2 * TB; r++)
            _mm512_store_si512((void *)(panel + kb * 2 * TB * KB + r * KB), _mm512_setzero_si512());
}

/* c[4][16][16]: C tiles (n block i, token block k) at c[2i + k], over all
 * of K; A tiles from a panel of `parts` bf16 terms per weight (1, or 2 for
 * hi and lo), B tiles from xp. Between tile products it copies `pieces`
 * pieces of the next panel. */
static void block_kernel(const og_bf16 *panel, int64_t K, int parts, const og_bf16 *b0, const og_bf16 *b1,
                         panel_copy *next, int64_t pieces, float c[4][TB][TB]) {
    const int64_t kblocks = K / KB;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kblocks; kb++) {
        _tile_loadd(6, b0 + kb * TB * KB, TB * 2 * (int64_t)sizeof(og_bf16));
        _tile_loadd(7, b1 + kb * TB * KB, TB * 2 * (int64_t)sizeof(og_bf16));
        for (int h = 0; h < parts; h++) {
            const og_bf16 *a = panel + (kb * parts + h) * 2 * TB * KB;
            _tile_loadd(4, a, KB * (int64_t)sizeof(og_bf16));
            _tile_loadd(5, a + TB * KB, KB * (int64_t)sizeof(og_bf16));
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        copy_pieces(next, pieces);
    }
    _tile_stored(0, c[0], TB * sizeof(float));
    _tile_stored(1, c[1], TB * sizeof(float));
    _tile_stored(2, c[2], TB * sizeof(float));
    _tile_stored(3, c[3], TB * sizeof(float));
}

/* out[t0 + 16k + tt, n0 + 16i + f] = c[2i + k][f][tt] + bias[16i + f] for
 * the rows and features that exist: a transpose, then 16 features a store. */
static void write_block(const amx_job *j, float c[4][TB][TB], int64_t t0, int64_t n0, int64_t rows,
                        const float bias[2 * TB]) {
    for (int i = 0; i < 2 && TB * i < rows; i++) {
        const int64_t width = rows - TB * i < TB ? rows - TB * i : TB;
        const __mmask16 m = (__mmask16)((1u << width) - 1);
        const __m512 b = _mm512_loadu_ps(bias + TB * i);
        for (int k = 0; k < 2; k++) {
            __m512 r[TB];
            transpose16(&c[2 * i + k][0][0], TB, r);
            for (int64_t tt = 0; tt < TB && t0 + k * TB + tt < j->T; tt++)
                _mm512_mask_storeu_ps(j->out + (t0 + k * TB + tt) * j->N + n0 + TB * i, m, _mm512_add_ps(r[tt], b));
        }
    }
}

/* Panel p's rows (32 out features, fewer in the last one). */
static int64_t panel_rows(const amx_job *j, int64_t p) { return j->N - 32 * p < 32 ? j->N - 32 * p : 32; }

/* Panel p's bias as f32 (zeros past its rows, or without a bias). */
static void panel_bias(const amx_job *j, int64_t p, float bias[2 * TB]) {
    memset(bias, 0, 2 * TB * sizeof *bias);
    for (int64_t i = 0; j->bias && i < panel_rows(j, p); i++)
        bias[i] = og_load_f32(j->bias, og_bias_dtype(j->dt), (size_t)(32 * p + i));
}

/* All 8 tile registers 16 rows of 64 bytes. C: 16 f32; A: 32 bf16; B: 16
 * pairs of bf16. */
static void tiles_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* One worker: takes panels from the shared counter one ahead of the one it
 * multiplies, and copies the next into its second buffer meanwhile. */
static void tiles_worker(void *ctx, int64_t item, int thread) {
    amx_job *j = ctx;
    const int64_t K = j->K, kblocks = K / KB, panels = (j->N + 31) / 32;
    const int64_t tblocks = j->TP / (2 * TB);
    /* the next panel's 32 K / 32 pieces spread over this panel's products */
    const int64_t pieces = (2 * TB + tblocks - 1) / tblocks;
    int64_t p = PANELS * atomic_fetch_add(&j->next_claim, 1), end = p + PANELS < panels ? p + PANELS : panels;
    if (p >= panels) return;
    tiles_configure();
    const og_bf16 *w = j->w;
    og_bf16 *buf[2] = {j->scratch + (size_t)thread * (size_t)j->stride,
                       j->scratch + (size_t)thread * (size_t)j->stride + 32 * K};
    panel_copy first = {w + (size_t)p * 32 * (size_t)K, buf[0], 0, 0, panel_rows(j, p), kblocks};
    copy_pieces(&first, first.rows * kblocks);
    zero_rows(buf[0], kblocks, first.rows);
    float c[4][TB][TB];
    for (int cur = 0; p < panels; cur ^= 1) {
        const int64_t n0 = 32 * p, rows = panel_rows(j, p);
        int64_t q = p + 1;
        if (q == end) {
            q = PANELS * atomic_fetch_add(&j->next_claim, 1);
            end = q + PANELS < panels ? q + PANELS : panels;
        }
        panel_copy next = {w + (q < panels ? (size_t)q * 32 * (size_t)K : 0), buf[cur ^ 1], 0, 0,
                           q < panels ? panel_rows(j, q) : 0, kblocks};
        float bias[2 * TB];
        panel_bias(j, p, bias);
        for (int64_t t0 = 0; t0 < j->T; t0 += 2 * TB) {
            const og_bf16 *b0 = j->xp + (size_t)(t0 / TB) * (size_t)kblocks * TB * KB;
            block_kernel(buf[cur], K, 1, b0, b0 + kblocks * TB * KB, &next, pieces, c);
            write_block(j, c, t0, n0, rows, bias);
        }
        copy_pieces(&next, next.rows * kblocks);
        if (next.rows) zero_rows(buf[cur ^ 1], kblocks, next.rows);
        p = q;
    }
    _tile_release();
}

/* Quantized panel p as hi and lo bf16 tiles (see the file comment), through
 * the f32 rows tmp [32, K]; rows past the panel's last are zeros. */
static void split_panel(const amx_job *j, int64_t p, float *tmp, og_bf16 *panel) {
    const int64_t K = j->K, kblocks = K / KB, rows = panel_rows(j, p);
    og_dequantize_rows_cpu(j->isa, j->dt, j->w, j->N, K, 32 * p, rows, tmp);
    for (int64_t r = 0; r < 2 * TB; r++)
        for (int64_t kb = 0; kb < kblocks; kb++) {
            og_bf16 *hi = panel + (kb * 2 * 2 * TB + r) * KB, *lo = hi + 2 * TB * KB;
            if (r >= rows) {
                _mm512_store_si512((void *)hi, _mm512_setzero_si512());
                _mm512_store_si512((void *)lo, _mm512_setzero_si512());
                continue;
            }
            for (int h = 0; h < KB; h += 16) {
                __m256i vl;
                const __m256i vh = og_split16_bf16(_mm512_loadu_ps(tmp + r * K + kb * KB + h), &vl);
                _mm256_store_si256((__m256i *)(hi + h), vh);
                _mm256_store_si256((__m256i *)(lo + h), vl);
            }
        }
}

/* One worker of a quantized product: claims PANELS panels at a time, makes
 * each panel's hi / lo tiles and runs every token block over them. */
static void split_worker(void *ctx, int64_t item, int thread) {
    amx_job *j = ctx;
    const int64_t K = j->K, kblocks = K / KB, panels = (j->N + 31) / 32;
    og_bf16 *panel = j->scratch + (size_t)thread * (size_t)j->stride; /* [K/32, 2, 32, 32] */
    float *tmp = (float *)(panel + 64 * K);                         /* [32, K] */
    bool configured = false;
    float c[4][TB][TB];
    panel_copy none = {0};
    for (int64_t p; (p = PANELS * atomic_fetch_add(&j->next_claim, 1)) < panels;) {
        if (!configured) tiles_configure(), configured = true;
        for (const int64_t end = p + PANELS < panels ? p + PANELS : panels; p < end; p++) {
            float bias[2 * TB];
            split_panel(j, p, tmp, panel);
            panel_bias(j, p, bias);
            for (int64_t t0 = 0; t0 < j->T; t0 += 2 * TB) {
                const og_bf16 *b0 = j->xp + (size_t)(t0 / TB) * (size_t)kblocks * TB * KB;
                block_kernel(panel, K, 2, b0, b0 + kblocks * TB * KB, &none, 0, c);
                write_block(j, c, t0, 32 * p, panel_rows(j, p), bias);
            }
        }
    }
    if (configured) _tile_release();
}

#pragma GCC pop_options

/* Packs x, then runs `worker` on every thread of the pool over j's panels. */
static og_status amx_run(og_threadpool *pool, amx_job *j, void (*worker)(void *, int64_t, int)) {
    const int threads = og_threadpool_size(pool);
    og_bf16 *xp = og_scratch(OG_SCRATCH_ACTIVATIONS, (size_t)j->TP * (size_t)j->K * sizeof *xp);
    og_bf16 *scratch_mem = og_scratch(OG_SCRATCH_PANELS, (size_t)threads * (size_t)j->stride * sizeof(og_bf16) + 64);
    if (!xp || !scratch_mem)
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "matmul_amx: no memory to pack %lld x %lld activations",
                            (long long)j->T, (long long)j->K);
    j->xp = xp;
    j->scratch = (og_bf16 *)(((uintptr_t)scratch_mem + 63) & ~(uintptr_t)63);
    og_parallel_for(pool, j->TP / TB, pack_task, j);
    og_parallel_for(pool, threads, worker, j);
    return OG_OK;
}

og_status og_matmul_bf16_amx(og_threadpool *pool, const float *x, const og_bf16 *weight, const og_bf16 *bias,
                             int64_t T, int64_t K, int64_t N, float *out) {
    if (!og_cpu_has_amx_bf16() || K % KB)
        return og_set_error(OG_ERR_UNSUPPORTED, "matmul_bf16_amx: no AMX here, or K = %lld is not a multiple of %d",
                            (long long)K, KB);
    amx_job j = {x, weight, OG_DTYPE_BF16, bias, T, K, N, (T + 2 * TB - 1) / (2 * TB) * (2 * TB),
                 og_cpu_isa_active(), NULL, NULL, 64 * K, out, 0};
    return amx_run(pool, &j, tiles_worker);
}

og_status og_matmul_quant_amx(og_threadpool *pool, const float *x, const void *weight, og_dtype dt, const void *bias,
                              int64_t T, int64_t K, int64_t N, float *out) {
    if (!og_cpu_has_amx_bf16() || K % KB || !og_dtype_is_quantized(dt))
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "matmul_quant_amx: no AMX here, K = %lld is not a multiple of %d, or %s is not quantized",
                            (long long)K, KB, og_dtype_name(dt));
    amx_job j = {x, weight, dt, bias, T, K, N, (T + 2 * TB - 1) / (2 * TB) * (2 * TB),
                 og_cpu_isa_active(), NULL, NULL, 128 * K, out, 0};
    return amx_run(pool, &j, split_worker);
}

#else /* no AMX intrinsics: never usable */

bool og_cpu_has_amx_bf16(void) { return false; }

og_status og_matmul_bf16_amx(og_threadpool *pool, const float *x, const og_bf16 *weight, const og_bf16 *bias,
                             int64_t T, int64_t K, int64_t N, float *out) {
    (void)pool, (void)x, (void)weight, (void)bias, (void)T, (void)K, (void)N, (void)out;
    return og_set_error(OG_ERR_UNSUPPORTED, "matmul_bf16_amx: built without AMX support");
}

og_status og_matmul_quant_amx(og_threadpool *pool, const float *x, const void *weight, og_dtype dt, const void *bias,
                              int64_t T, int64_t K, int64_t N, float *out) {
    (void)pool, (void)x, (void)weight, (void)dt, (void)bias, (void)T, (void)K, (void)N, (void)out;
    return og_set_error(OG_ERR_UNSUPPORTED, "matmul_quant_amx: built without AMX support");
}

#endif
