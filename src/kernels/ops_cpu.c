/* Fast CPU versions of the ops in ops.h: run-time ISA dispatch, threads from
 * og_threadpool, OpenBLAS for prefill matmuls. Each must agree with its
 * og_<op>_ref within the tolerance its tests justify.
 * Letters as in ops.h: T tokens, K in features, N out features / row width,
 * V vocabulary, H hidden, F ffn, D head dim, n heads per row. */
#define _POSIX_C_SOURCE 200809L
#include "kernels/kquant_cpu.h"
#include "kernels/ops_internal.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

/* ---- bf16 <-> f32 ---- */

void og_bf16_to_f32_cpu(const og_bf16 *src, float *dst, size_t n) {
    switch (og_cpu_isa_active()) {
    case OG_CPU_ISA_AVX512: og_bf16_to_f32_avx512(src, dst, n); return;
    case OG_CPU_ISA_AVX2: og_bf16_to_f32_avx2(src, dst, n); return;
    default: og_bf16_to_f32_ref(src, dst, n); return;
    }
}

void og_f32_to_bf16_cpu(const float *src, og_bf16 *dst, size_t n) {
    switch (og_cpu_isa_active()) {
    case OG_CPU_ISA_AVX512: og_f32_to_bf16_avx512(src, dst, n); return;
    case OG_CPU_ISA_AVX2: og_f32_to_bf16_avx2(src, dst, n); return;
    default: og_f32_to_bf16_ref(src, dst, n); return;
    }
}

/* ---- quantized weights: where a block of rows lies, and as f32 ---- */

/* Rows [n0, n0 + rows) of a [N, K] q8/q4 tensor w: their quants and their
 * scales (the two planes, og_quant_scales). */
typedef struct {
    const uint8_t *q;  /* [rows, og_quant_row_bytes] */
    const og_f16 *s;   /* [rows, K / OG_QUANT_GROUP] */
} quant_block;

static quant_block quant_rows(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n0) {
    quant_block b = {(const uint8_t *)w + (size_t)n0 * og_quant_row_bytes(dt, K),
                     og_quant_scales(dt, w, N, K) + n0 * (K / OG_QUANT_GROUP)};
    return b;
}

void og_dequantize_rows_cpu(og_cpu_isa isa, og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n0,
                            int64_t rows, float *dst /* [rows, K] */) {
    if (og_dtype_is_kquant(dt)) {
        og_kq_dequantize(isa, dt, (const uint8_t *)w + (size_t)n0 * og_kquant_row_bytes(dt, K), K, rows, dst);
        return;
    }
    quant_block b = quant_rows(dt, w, N, K, n0);
    if (isa == OG_CPU_ISA_AVX512)
        og_dequantize_rows_avx512(b.q, b.s, dt, K, rows, dst);
    else if (isa == OG_CPU_ISA_AVX2)
        og_dequantize_rows_avx2(b.q, b.s, dt, K, rows, dst);
    else
        for (int64_t r = 0; r < rows; r++) og_dequantize_row(dt, w, N, K, n0 + r, dst + r * K);
}

void og_quant_ints_rows_cpu(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n0, int64_t rows,
                            og_bf16 *ints, float *scales) {
    quant_block b = quant_rows(dt, w, N, K, n0);
    og_quant_ints_avx512(b.q, dt, K, rows, ints);
    for (int64_t i = 0; i < rows * (K / OG_QUANT_GROUP); i++) scales[i] = og_f32_from_f16(b.s[i]);
}

/* Rows [n0, n0 + rows) of a float (bf16 or f32) [N, K] weight. */
static const void *float_rows(og_dtype dt, const void *w, int64_t K, int64_t n0) {
    return (const char *)w + (size_t)n0 * (size_t)K * og_dtype_size(dt);
}

/* ---- embed: one task per token ---- */

typedef struct {
    const int32_t *tokens; /* [T]    */
    const void *table;     /* [V, H] */
    og_dtype dt;
    int64_t V, H;
    og_cpu_isa isa;
    float *out;            /* [T, H] */
} embed_job;

static void embed_task(void *ctx, int64_t t, int thread) {
    const embed_job *j = ctx;
    size_t row = (size_t)j->tokens[t] * (size_t)j->H;
    float *dst = j->out + t * j->H;
    if (og_dtype_is_quantized(j->dt))
        og_dequantize_rows_cpu(j->isa, j->dt, j->table, j->V, j->H, j->tokens[t], 1, dst);
    else if (j->dt == OG_DTYPE_BF16)
        og_bf16_to_f32_cpu((const og_bf16 *)j->table + row, dst, (size_t)j->H);
    else
        memcpy(dst, (const float *)j->table + row, (size_t)j->H * sizeof(float));
}

og_status og_embed_cpu(og_threadpool *pool, const int32_t *tokens, int64_t T, const void *table,
                       og_dtype table_dtype, int64_t V, int64_t H, float *out) {
    OG_TRY(og_ops_check_embed("embed", tokens, T, table, table_dtype, V, H, out));
    embed_job j = {tokens, table, table_dtype, V, H, og_cpu_isa_active(), out};
    og_parallel_for(pool, T, embed_task, &j);
    return OG_OK;
}

/* ---- rms_norm: tasks of whole rows ---- */

typedef struct {
    const float *x; /* [rows, N] */
    const void *w;  /* [N]       */
    og_dtype dt;
    int64_t rows, N, rows_per_task;
    float eps;
    og_cpu_isa isa;
    float *out;     /* [rows, N] */
} rms_job;

static float sum_squares(og_cpu_isa isa, const float *x, int64_t N) {
    if (isa == OG_CPU_ISA_AVX512) return og_sum_squares_avx512(x, N);
    if (isa == OG_CPU_ISA_AVX2) return og_sum_squares_avx2(x, N);
    float s = 0.0f;
    for (int64_t i = 0; i < N; i++) s += x[i] * x[i];
    return s;
}

static void rms_task(void *ctx, int64_t task, int thread) {
    const rms_job *j = ctx;
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->N; /* [N] */
        float *o = j->out + r * j->N;     /* [N] */
        float mean = sum_squares(j->isa, x, j->N) / (float)j->N;
        float inv = 1.0f / sqrtf(mean + j->eps);
        if (j->dt == OG_DTYPE_BF16) {
            const og_bf16 *w = j->w;
            for (int64_t i = 0; i < j->N; i++) o[i] = (x[i] * inv) * og_f32_from_bf16(w[i]);
        } else {
            const float *w = j->w;
            for (int64_t i = 0; i < j->N; i++) o[i] = (x[i] * inv) * w[i];
        }
    }
}

/* Rows grouped so that a task touches about 16 KiB of x. */
static void rms_run(og_threadpool *pool, const float *x, const void *w, og_dtype dt, int64_t rows,
                    int64_t N, float eps, float *out) {
    int64_t per = 4096 / N > 1 ? 4096 / N : 1;
    rms_job j = {x, w, dt, rows, N, per, eps, og_cpu_isa_active(), out};
    og_parallel_for(pool, (rows + per - 1) / per, rms_task, &j);
}

og_status og_rms_norm_cpu(og_threadpool *pool, const float *x, const void *weight,
                          og_dtype weight_dtype, int64_t T, int64_t N, float eps, float *out) {
    OG_TRY(og_ops_check_rms_norm("rms_norm", x, weight, weight_dtype, T, N, eps, out));
    rms_run(pool, x, weight, weight_dtype, T, N, eps, out);
    return OG_OK;
}

og_status og_head_rms_norm_cpu(og_threadpool *pool, const float *x, const void *weight,
                               og_dtype weight_dtype, int64_t T, int64_t n, int64_t D, float eps,
                               float *out) {
    OG_TRY(og_ops_check_dim(T, "head_rms_norm", "T"));
    OG_TRY(og_ops_check_dim(n, "head_rms_norm", "heads"));
    int64_t rows;
    if (!og_mul_overflow_i64(T, n, &rows))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "head_rms_norm: T x heads overflows");
    OG_TRY(og_ops_check_rms_norm("head_rms_norm", x, weight, weight_dtype, rows, D, eps, out));
    rms_run(pool, x, weight, weight_dtype, rows, D, eps, out);
    return OG_OK;
}

/* ---- matmul ---- */

static void gemv_rows_scalar(const float *x, const void *w, og_dtype dt, int64_t K, int64_t rows,
                             float *out) {
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += x[k] * og_load_f32(w, dt, (size_t)(r * K + k));
        out[r] = acc;
    }
}

/* Quantized rows: per group the 32 products summed, then times the group's
 * scale into the row's sum (the order of the SIMD versions, in one lane). */
static void gemv_q_rows_scalar(const float *x, quant_block b, og_dtype dt, int64_t K,
                               int64_t rows, float *out) {
    const int64_t G = K / OG_QUANT_GROUP;
    const size_t rb = og_quant_row_bytes(dt, K);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *q = b.q + (size_t)r * rb;
        float acc = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + g * OG_QUANT_GROUP;
            float d = 0.0f;
            if (dt == OG_DTYPE_Q8) {
                const int8_t *qg = (const int8_t *)q + g * OG_QUANT_GROUP;
                for (int i = 0; i < OG_QUANT_GROUP; i++) d += xg[i] * (float)qg[i];
            } else {
                const uint8_t *qg = q + g * (OG_QUANT_GROUP / 2);
                for (int i = 0; i < OG_QUANT_GROUP / 2; i++)
                    d += xg[i] * (float)((int)(qg[i] & 15) - 8);
                for (int i = 0; i < OG_QUANT_GROUP / 2; i++)
                    d += xg[i + OG_QUANT_GROUP / 2] * (float)((int)(qg[i] >> 4) - 8);
            }
            acc += d * og_f32_from_f16(b.s[r * G + g]);
        }
        out[r] = acc;
    }
}

/* out[r] = dot(x, w[n0 + r]) for r in [0, rows), at isa; xp is x split
 * even/odd for bf16 weights at AVX-512. Each feature's sum depends on
 * neither n0 nor rows (the loops' groups of 4 features start at multiples
 * of 4: rows_run's claims), so a block split any other way gives the same
 * bits. stream: quantized weights stream from memory (prefetched into L2
 * only). */
static void gemv_block(og_cpu_isa isa, const float *x, const float *xp, const og_kq_x *xq, const void *w,
                       og_dtype dt, int64_t K, int64_t N, int64_t n0, int64_t rows, bool stream, float *out) {
    if (og_dtype_is_kquant(dt)) {
        og_kq_gemv(isa, dt, xq, 1, (const uint8_t *)w + (size_t)n0 * og_kquant_row_bytes(dt, K), K, rows, stream,
                   out, 1);
        return;
    }
    if (og_dtype_is_quantized(dt)) {
        quant_block b = quant_rows(dt, w, N, K, n0);
        if (isa == OG_CPU_ISA_AVX512)
            og_gemv_q_rows_avx512(x, b.q, b.s, dt, K, rows, stream, out);
        else if (isa == OG_CPU_ISA_AVX2)
            og_gemv_q_rows_avx2(x, b.q, b.s, dt, K, rows, stream, out);
        else
            gemv_q_rows_scalar(x, b, dt, K, rows, out);
        return;
    }
    const void *wb = float_rows(dt, w, K, n0);
    if (isa == OG_CPU_ISA_AVX512)
        og_gemv_rows_avx512(x, xp, wb, dt, K, rows, out);
    else if (isa == OG_CPU_ISA_AVX2)
        og_gemv_rows_avx2(x, wb, dt, K, rows, out);
    else
        gemv_rows_scalar(x, wb, dt, K, rows, out);
}

/* out[c] += bias[n0 + c] for the block's rows (the bias is f32 beside
 * quantized weights: og_bias_dtype). */
static void add_bias(const void *bias, og_dtype dt, int64_t n0, int64_t rows, float *out) {
    const og_dtype bdt = og_bias_dtype(dt);
    for (int64_t c = 0; c < rows; c++) out[c] += og_load_f32(bias, bdt, (size_t)(n0 + c));
}

/* x [R, K] as og_kq_x blocks in the calling thread's scratch, for
 * products with k-quant weights; NULL when out of memory. */
static const og_kq_x *quantize_x(const float *x, int64_t R, int64_t K) {
    og_kq_x *xq = og_scratch(OG_SCRATCH_QUANT_X, (size_t)(R * (K / OG_KQUANT_BLOCK)) * sizeof *xq);
    if (xq) og_kq_quantize_x(x, R, K, xq);
    return xq;
}

/* ---- matmul_rows: R decode rows, one pass over the weights ----
 * Several products of the same x (og_matmul_rows_multi_cpu) share one
 * parallel-for. Their output features are laid end to end, each part from a
 * multiple of 4, and cut into one lane per thread: contiguous runs of about
 * equal size. A thread takes its own lane's features in order, a claim of
 * about 32 KiB of weights at a time, so it reads one run of memory start to
 * end, which the hardware prefetcher follows best; then it takes claims from
 * the other lanes that are not yet done. A claim runs all R rows over its
 * features, so its weights come from memory once and from cache for the
 * other rows. Claims start at multiples of 4 features of their part, so the
 * SIMD GEMVs' groups of 4 features start at multiples of 4 whatever the
 * thread count: with bf16 weights at AVX-512, features [0, N & ~3) take the
 * even/odd scheme and the rest the 16-wide one, which og_matmul_rows_cpu
 * reproduces at any R. */
typedef struct {
    const void *w;     /* [N, K]                                         */
    const void *bias;  /* [N] of og_bias_dtype(dt)                       */
    og_dtype dt;
    int64_t N;         /* out features                                   */
    int64_t f0;        /* where its features start in the job's space    */
    int64_t n_eo;      /* features [0, n_eo) take the even/odd scheme    */
    float *out;        /* [R, N]                                         */
} rows_part;

/* A claim's weights, and the most lanes a call cuts (the threads of a
 * larger pool take claims from those). */
enum { ROWS_CLAIM_BYTES = 32768, ROWS_MAX_LANES = 64 };

/* A thread's run of the features: the next claim at `next`, done at `end`
 * (a cache line each: every thread claims from them). */
typedef struct {
    _Alignas(64) atomic_llong next;
    int64_t end;
} rows_lane;

typedef struct {
    const float *x;    /* [R, K]                                         */
    const float *xp;   /* [R, K] x split even/odd (AVX-512 + bf16), or x */
    float *split;      /* [R, K] where the split is written, or NULL     */
    float *scratch;    /* [threads, acc] the AVX-512 kernel's sums, or NULL */
    size_t acc;        /* floats of scratch per thread                   */
    int64_t R, K;
    og_cpu_isa isa;
    bool stream;       /* the weights stream from memory (og_cpu_weights_fit_cache) */
    const og_kq_x *xq; /* [R, K / 256] x as int8 blocks when a part has k-quant weights */
    const rows_part *parts;
    int n_parts;
    float *glu;        /* [R, N]: swiglu(part 0, part 1) per claim, or NULL */
    rows_lane *lanes;  /* [n_lanes], one per thread of the pool          */
    int n_lanes;
    int64_t claim;     /* features a claim takes, a multiple of 4       */
} rows_job;

static void split_task(void *ctx, int64_t r, int thread) {
    const rows_job *j = ctx;
    og_split_even_odd_avx512(j->x + r * j->K, j->K, j->split + r * j->K);
}

/* One element of swiglu: silu(g) * u (og_swiglu_cpu and the fused
 * gate/up products both use it, so both give the same bits). */
static inline float swiglu1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Features [n0, n0 + rows) of part p for all R rows. */
static void rows_panel(const rows_job *j, const rows_part *p, int64_t n0, int64_t rows, int thread) {
    if (og_dtype_is_kquant(p->dt)) {
        /* every ISA's k-quant GEMV takes the rows of x itself */
        og_kq_gemv(j->isa, p->dt, j->xq, j->R,
                   (const uint8_t *)p->w + (size_t)n0 * og_kquant_row_bytes(p->dt, j->K), j->K, rows, j->stream,
                   p->out + n0, p->N);
    } else if (og_dtype_is_quantized(p->dt)) {
        /* AVX-512: tiles of features x rows sharing each widened group;
         * else the GEMV's own loop, once per row. Either way the first row
         * (block) brings the panel into the caches for the others: into L2
         * alone when the weights do not fit the caches. */
        if (j->isa == OG_CPU_ISA_AVX512 && j->R > 1) {
            quant_block b = quant_rows(p->dt, p->w, p->N, j->K, n0);
            og_matmul_rows_q_avx512(j->x, b.q, b.s, p->dt, j->R, j->K, rows, j->stream,
                                    p->out + n0, p->N);
        } else {
            for (int64_t r = 0; r < j->R; r++)
                gemv_block(j->isa, j->x + r * j->K, NULL, NULL, p->w, p->dt, j->K, p->N, n0, rows,
                           j->stream && r == 0, p->out + r * p->N + n0);
        }
    } else if (j->isa == OG_CPU_ISA_AVX512 && j->R > 1) {
        const void *w = float_rows(p->dt, p->w, j->K, n0);
        int64_t eo = p->n_eo - n0;
        eo = eo < 0 ? 0 : eo > rows ? rows : eo;
        float *scratch = j->scratch ? j->scratch + (size_t)thread * j->acc : NULL;
        og_matmul_rows_avx512(j->x, p->dt == OG_DTYPE_BF16 ? j->xp : j->x, w, p->dt, j->R, j->K,
                              rows, eo, scratch, p->out + n0, p->N);
    } else {
        /* The single-row loops, once per row; the panel stays in cache. One
         * row at AVX-512 takes this way too: in cache the GEMV's four weight
         * rows a pass hide more latency than the tiles' two (the demo
         * model's products at 2 threads: 251 against 272-287 us a token),
         * and from memory it reads each row as one stream */
        for (int64_t r = 0; r < j->R; r++)
            gemv_block(j->isa, j->x + r * j->K, j->xp + r * j->K, NULL, p->w, p->dt, j->K, p->N, n0, rows, false,
                       p->out + r * p->N + n0);
    }
    if (p->bias)
        for (int64_t r = 0; r < j->R; r++)
            add_bias(p->bias, p->dt, n0, rows, p->out + r * p->N + n0);
}

/* Features [n0, n0 + rows) of part p (and with glu the same ones of part
 * 1, then swiglu of both). */
static void rows_features(const rows_job *j, const rows_part *p, int64_t n0, int64_t rows, int thread) {
    rows_panel(j, p, n0, rows, thread);
    if (!j->glu) return;
    const rows_part *u = &j->parts[1];
    rows_panel(j, u, n0, rows, thread);
    for (int64_t r = 0; r < j->R; r++) {
        const float *g = p->out + r * p->N + n0, *up = u->out + r * p->N + n0;
        float *o = j->glu + r * p->N + n0;
        for (int64_t c = 0; c < rows; c++) o[c] = swiglu1(g[c], up[c]);
    }
}

/* An item of the parallel-for: the claims of the thread's own lane, then
 * of the others. */
static void rows_task(void *ctx, int64_t item, int thread) {
    (void)item;
    const rows_job *j = ctx;
    const int n_parts = j->glu ? 1 : j->n_parts; /* with glu the space is the gate's */
    for (int k = 0; k < j->n_lanes; k++) {
        rows_lane *l = &j->lanes[(thread + k) % j->n_lanes];
        for (;;) {
            const int64_t g = atomic_fetch_add_explicit(&l->next, j->claim, memory_order_relaxed);
            if (g >= l->end) break;
            const int64_t g1 = g + j->claim < l->end ? g + j->claim : l->end;
            for (int i = 0; i < n_parts; i++) {
                const rows_part *p = &j->parts[i];
                const int64_t lo = g > p->f0 ? g - p->f0 : 0, hi = g1 - p->f0 < p->N ? g1 - p->f0 : p->N;
                if (lo < hi) rows_features(j, p, lo, hi - lo, thread);
            }
        }
    }
}

/* The split rows and the kernel's sums of small calls live on the stack. */
enum { ROWS_LOCAL_FLOATS = 4096 };

static og_status rows_run(og_threadpool *pool, const float *x, int64_t R, int64_t K,
                          const og_matmul_part *in, int n_parts, float *glu) {
    rows_part parts[OG_MATMUL_MAX_PARTS];
    rows_lane lanes[ROWS_MAX_LANES];
    rows_job j = {x, x, NULL, NULL, 0, R, K, og_cpu_isa_active(), !og_cpu_weights_fit_cache(),
                  NULL, parts, n_parts, glu, lanes, 0, 0};
    for (int i = 0; i < n_parts && !j.xq; i++)
        if (og_dtype_is_kquant(in[i].weight_dtype) && !(j.xq = quantize_x(x, R, K)))
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "matmul_rows: no memory for %lld rows of x as int8 blocks",
                                (long long)R);
    /* the space of features (with glu, the gate's: a claim runs up's too) */
    int64_t space = 0, row_bytes = 0;
    for (int i = 0; i < n_parts; i++) {
        parts[i] = (rows_part){in[i].weight, in[i].bias, in[i].weight_dtype, in[i].N, space, 0, in[i].out};
        if (!glu || i == 0) space += (in[i].N + 3) & ~(int64_t)3;
        const int64_t b = (int64_t)og_weight_row_bytes(in[i].weight_dtype, K);
        if (b > row_bytes) row_bytes = b;
    }
    j.claim = (ROWS_CLAIM_BYTES / row_bytes + 3) & ~(int64_t)3;
    if (j.claim < 4) j.claim = 4;
    const int threads = og_threadpool_size(pool);
    j.n_lanes = threads < ROWS_MAX_LANES ? threads : ROWS_MAX_LANES;
    for (int t = 0; t < j.n_lanes; t++) {
        atomic_init(&lanes[t].next, t == 0 ? 0 : lanes[t - 1].end);
        lanes[t].end = t + 1 == j.n_lanes ? space : (space * (t + 1) / j.n_lanes + 3) & ~(int64_t)3;
    }
    /* bf16 weights at AVX-512 (the GEMV and the tiles) read x split
     * even/odd; the tiles, for a long K, keep sums in scratch sized by a
     * claim's features */
    bool split = false;
    for (int i = 0; i < n_parts; i++) {
        rows_part *p = &parts[i];
        if (j.isa != OG_CPU_ISA_AVX512 || p->dt != OG_DTYPE_BF16) continue;
        p->n_eo = p->N & ~(int64_t)3;
        if (p->n_eo == 0 || K < 32) continue; /* below 32 the split is x itself */
        split = true;
        if (R == 1) continue; /* the GEMV keeps no sums */
        size_t acc = og_matmul_rows_avx512_scratch(K, j.claim);
        if (acc > j.acc) j.acc = acc;
    }
    /* [R, K] split x, then [threads, acc] sums: one block of scratch */
    float local[ROWS_LOCAL_FLOATS];
    float *scratch = NULL;
    if (split) {
        const size_t floats = (size_t)(R * K);
        if (j.acc > (SIZE_MAX / sizeof(float) - floats) / (size_t)threads)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "matmul_rows: scratch for R %lld x K %lld overflows",
                                (long long)R, (long long)K);
        const size_t need = floats + (size_t)threads * j.acc;
        scratch = need <= ROWS_LOCAL_FLOATS ? local : og_malloc(need * sizeof(float));
        if (!scratch)
            return og_set_error(OG_ERR_OUT_OF_MEMORY,
                                "matmul_rows: no memory for %lld x %lld split rows",
                                (long long)R, (long long)K);
        j.xp = j.split = scratch;
        if (j.acc) j.scratch = scratch + floats;
        if (R * K <= ROWS_LOCAL_FLOATS) /* a few microseconds: not worth waking the pool */
            for (int64_t r = 0; r < R; r++) split_task(&j, r, 0);
        else
            og_parallel_for(pool, R, split_task, &j);
    }
    og_parallel_for(pool, j.n_lanes, rows_task, &j);
    if (scratch != local) og_free(scratch);
    return OG_OK;
}

og_status og_matmul_rows_cpu(og_threadpool *pool, const float *x, const void *weight,
                             const void *bias, og_dtype weight_dtype, int64_t R, int64_t K,
                             int64_t N, float *out) {
    OG_TRY(og_ops_check_matmul(x, weight, bias, weight_dtype, R, K, N, out));
    const og_matmul_part part = {weight, bias, weight_dtype, N, out};
    return rows_run(pool, x, R, K, &part, 1, NULL);
}

og_status og_matmul_rows_multi_cpu(og_threadpool *pool, const float *x, int64_t R, int64_t K,
                                   const og_matmul_part *parts, int n_parts) {
    if (n_parts < 1 || n_parts > OG_MATMUL_MAX_PARTS || !parts)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "matmul_rows_multi: %d parts (1 to %d)",
                            n_parts, OG_MATMUL_MAX_PARTS);
    for (int i = 0; i < n_parts; i++) {
        OG_TRY(og_ops_check_matmul(x, parts[i].weight, parts[i].bias, parts[i].weight_dtype, R, K,
                                   parts[i].N, parts[i].out));
        for (int k = 0; k < i; k++)
            OG_TRY(og_ops_check_disjoint(parts[i].out, (size_t)(R * parts[i].N) * sizeof(float),
                                         parts[k].out, (size_t)(R * parts[k].N) * sizeof(float),
                                         "matmul_rows_multi", "the out of an earlier part"));
    }
    return rows_run(pool, x, R, K, parts, n_parts, NULL);
}

og_status og_matmul_rows_swiglu_cpu(og_threadpool *pool, const float *x, int64_t R, int64_t K,
                                    const og_matmul_part *gate, const og_matmul_part *up,
                                    float *out) {
    OG_TRY(og_ops_check_ptr(gate, "matmul_rows_swiglu", "gate"));
    OG_TRY(og_ops_check_ptr(up, "matmul_rows_swiglu", "up"));
    if (gate->N != up->N)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "matmul_rows_swiglu: gate has %lld features, up %lld",
                            (long long)gate->N, (long long)up->N);
    OG_TRY(og_ops_check_matmul(x, gate->weight, gate->bias, gate->weight_dtype, R, K, gate->N,
                               gate->out));
    OG_TRY(og_ops_check_matmul(x, up->weight, up->bias, up->weight_dtype, R, K, up->N, up->out));
    /* out is written while other tasks still read x and write gate and up */
    const size_t bytes = (size_t)(R * gate->N) * sizeof(float);
    OG_TRY(og_ops_check_ptr(out, "matmul_rows_swiglu", "out"));
    OG_TRY(og_ops_check_disjoint(up->out, bytes, gate->out, bytes, "matmul_rows_swiglu", "gate"));
    OG_TRY(og_ops_check_disjoint(out, bytes, gate->out, bytes, "matmul_rows_swiglu", "gate"));
    OG_TRY(og_ops_check_disjoint(out, bytes, up->out, bytes, "matmul_rows_swiglu", "up"));
    OG_TRY(og_ops_check_disjoint(out, bytes, x, (size_t)(R * K) * sizeof(float),
                                 "matmul_rows_swiglu", "x"));
    const og_matmul_part parts[2] = {*gate, *up};
    return rows_run(pool, x, R, K, parts, 2, out);
}

/* Prefill (T > 1): each task takes a panel of PANEL output features, widens
 * its bf16 weights (or dequantizes its q8/q4 ones, exactly) to f32 in the
 * thread's scratch and runs sgemm over all T rows, so each weight is read
 * from memory once per call and reused T times from cache.
 *
 * The rows go to sgemm SG_ROWS at a time, the last ones padded with zero rows
 * to SG_ROWS from a scratch copy: OpenBLAS's kernels for AVX2 machines (its
 * Haswell and Zen builds) give a row of C bits that depend on how many rows
 * the call has and where the row sits in it (measured: a row of a 62-row call
 * differs from the same row of a 70-row call), and the runtime promises that a
 * row's product does not depend on the step it came in (a fork, a prefix hit
 * or a chunked prompt gives the bits of one whole prefill). Calls of 8 rows
 * gave every row the same bits at every offset there. */
enum { PANEL = 64, SG_ROWS = 8 };

typedef struct {
    const float *x;    /* [T, K]             */
    const void *w;     /* [N, K]             */
    const void *bias;  /* [N] of og_bias_dtype(dt) */
    og_dtype dt;
    int64_t T, K, N;
    og_cpu_isa isa;
    float *scratch;    /* [threads, PANEL x K + SG_ROWS x K + SG_ROWS x PANEL] */
    size_t per_thread; /* floats of scratch a thread */
    float *out;        /* [T, N]             */
} gemm_job;

static void gemm_task(void *ctx, int64_t task, int thread) {
    const gemm_job *j = ctx;
    int64_t n0 = task * PANEL;
    int64_t nb = n0 + PANEL <= j->N ? PANEL : j->N - n0;
    const float *panel = float_rows(j->dt, j->w, j->K, n0); /* [nb, K] */
    float *mine = j->scratch + (size_t)thread * j->per_thread;
    float *xpad = mine + (size_t)PANEL * (size_t)j->K, *opad = xpad + (size_t)SG_ROWS * (size_t)j->K;
    if (j->dt != OG_DTYPE_F32) {
        float *s = mine;
        if (og_dtype_is_quantized(j->dt))
            og_dequantize_rows_cpu(j->isa, j->dt, j->w, j->N, j->K, n0, nb, s);
        else
            og_bf16_to_f32_cpu((const og_bf16 *)panel, s, (size_t)(nb * j->K));
        panel = s;
    }
    float beta = 0.0f;
    if (j->bias) {
        const og_dtype bdt = og_bias_dtype(j->dt);
        for (int64_t t = 0; t < j->T; t++)
            for (int64_t c = 0; c < nb; c++)
                j->out[t * j->N + n0 + c] = og_load_f32(j->bias, bdt, (size_t)(n0 + c));
        beta = 1.0f;
    }
    for (int64_t t0 = 0; t0 < j->T; t0 += SG_ROWS) {
        const int64_t m = j->T - t0 < SG_ROWS ? j->T - t0 : SG_ROWS;
        if (m == SG_ROWS) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, SG_ROWS, (blasint)nb, (blasint)j->K, 1.0f,
                        j->x + t0 * j->K, (blasint)j->K, panel, (blasint)j->K, beta, j->out + t0 * j->N + n0,
                        (blasint)j->N);
            continue;
        }
        /* the last rows, padded: the same call as a full block's */
        memcpy(xpad, j->x + t0 * j->K, sizeof(float) * (size_t)(m * j->K));
        memset(xpad + m * j->K, 0, sizeof(float) * (size_t)((SG_ROWS - m) * j->K));
        for (int64_t t = 0; t < SG_ROWS; t++)
            for (int64_t c = 0; c < nb; c++) opad[t * PANEL + c] = t < m ? j->out[(t0 + t) * j->N + n0 + c] : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, SG_ROWS, (blasint)nb, (blasint)j->K, 1.0f, xpad,
                    (blasint)j->K, panel, (blasint)j->K, beta, opad, PANEL);
        for (int64_t t = 0; t < m; t++) memcpy(j->out + (t0 + t) * j->N + n0, opad + t * PANEL, sizeof(float) * (size_t)nb);
    }
}

/* The pool supplies the parallelism; OpenBLAS's own threads would compete
 * with it for the same cores. */
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

static og_status gemm_run(og_threadpool *pool, const float *x, const void *w, const void *bias,
                          og_dtype dt, int64_t T, int64_t K, int64_t N, float *out) {
    if (T > INT_MAX || K > INT_MAX || N > INT_MAX)
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "matmul: T %lld, K %lld, N %lld exceed the BLAS int range",
                            (long long)T, (long long)K, (long long)N);
    pthread_once(&g_blas_once, blas_single_thread);
    /* a thread's weight panel as f32 (bf16, quantized), then its padded rows of x and of out */
    const size_t per_thread = (size_t)(PANEL + SG_ROWS) * (size_t)K + SG_ROWS * PANEL;
    float *scratch = og_scratch(OG_SCRATCH_PANELS, (size_t)og_threadpool_size(pool) * per_thread * sizeof(float));
    if (!scratch)
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "matmul: no memory for %d weight panels of %d x %lld floats",
                            og_threadpool_size(pool), PANEL + SG_ROWS, (long long)K);
    gemm_job j = {x, w, bias, dt, T, K, N, og_cpu_isa_active(), scratch, per_thread, out};
    og_parallel_for(pool, (N + PANEL - 1) / PANEL, gemm_task, &j);
    return OG_OK;
}

og_status og_matmul_cpu(og_threadpool *pool, const float *x, const void *weight, const void *bias,
                        og_dtype weight_dtype, int64_t T, int64_t K, int64_t N, float *out) {
    OG_TRY(og_ops_check_matmul(x, weight, bias, weight_dtype, T, K, N, out));
    if (T == 1) {
        const og_matmul_part part = {weight, bias, weight_dtype, N, out};
        return rows_run(pool, x, 1, K, &part, 1, NULL);
    }
    return gemm_run(pool, x, weight, bias, weight_dtype, T, K, N, out);
}

/* ---- rope: one task per token; cos/sin computed once per token ---- */

typedef struct {
    const og_rope_table *table;
    const float *x;          /* [T, n*D] */
    const int32_t *positions; /* [T]     */
    int64_t n;
    float *out;              /* [T, n*D] */
} rope_job;

static void rope_task(void *ctx, int64_t t, int thread) {
    const rope_job *j = ctx;
    int64_t D = j->table->head_dim, half = D / 2;
    float c[OG_ROPE_MAX_HEAD_DIM / 2], s[OG_ROPE_MAX_HEAD_DIM / 2]; /* [D/2] */
    float pos = (float)j->positions[t];
    for (int64_t i = 0; i < half; i++) {
        float angle = pos * j->table->inv_freq[i];
        c[i] = cosf(angle);
        s[i] = sinf(angle);
    }
    for (int64_t h = 0; h < j->n; h++) {
        const float *xh = j->x + (t * j->n + h) * D; /* [D] */
        float *oh = j->out + (t * j->n + h) * D;     /* [D] */
        for (int64_t i = 0; i < half; i++) {
            float a = xh[i], b = xh[i + half];
            oh[i] = a * c[i] - b * s[i];
            oh[i + half] = b * c[i] + a * s[i];
        }
    }
}

og_status og_rope_cpu(og_threadpool *pool, const og_rope_table *table, const float *x,
                      const int32_t *positions, int64_t T, int64_t n, float *out) {
    OG_TRY(og_ops_check_rope("rope", table, x, positions, T, n, out));
    rope_job j = {table, x, positions, n, out};
    og_parallel_for(pool, T, rope_task, &j);
    return OG_OK;
}

/* ---- swiglu and add: tasks of CHUNK elements ---- */

enum { CHUNK = 16384 };

typedef struct {
    const float *a, *b; /* [count] */
    int64_t count;
    float *out;         /* [count] */
} binary_job;

static void swiglu_task(void *ctx, int64_t task, int thread) {
    const binary_job *j = ctx;
    int64_t i0 = task * CHUNK, i1 = i0 + CHUNK < j->count ? i0 + CHUNK : j->count;
    for (int64_t i = i0; i < i1; i++) {
        j->out[i] = swiglu1(j->a[i], j->b[i]);
    }
}

static void add_task(void *ctx, int64_t task, int thread) {
    const binary_job *j = ctx;
    int64_t i0 = task * CHUNK, i1 = i0 + CHUNK < j->count ? i0 + CHUNK : j->count;
    for (int64_t i = i0; i < i1; i++) j->out[i] = j->a[i] + j->b[i];
}

og_status og_swiglu_cpu(og_threadpool *pool, const float *gate, const float *up, int64_t T,
                        int64_t F, float *out) {
    OG_TRY(og_ops_check_binary("swiglu", gate, "gate", up, "up", T, F, out));
    binary_job j = {gate, up, T * F, out};
    og_parallel_for(pool, (T * F + CHUNK - 1) / CHUNK, swiglu_task, &j);
    return OG_OK;
}

og_status og_add_cpu(og_threadpool *pool, const float *a, const float *b, int64_t n, float *out) {
    OG_TRY(og_ops_check_binary("add", a, "a", b, "b", 1, n, out));
    binary_job j = {a, b, n, out};
    og_parallel_for(pool, (n + CHUNK - 1) / CHUNK, add_task, &j);
    return OG_OK;
}

/* ---- argmax ---- */

og_status og_argmax_cpu(const float *x, int64_t V, int64_t *index) {
    OG_TRY(og_ops_check_ptr(x, "argmax", "x"));
    OG_TRY(og_ops_check_ptr(index, "argmax", "index"));
    OG_TRY(og_ops_check_dim(V, "argmax", "V"));
    switch (og_cpu_isa_active()) {
    case OG_CPU_ISA_AVX512: *index = og_argmax_avx512(x, V); return OG_OK;
    case OG_CPU_ISA_AVX2: *index = og_argmax_avx2(x, V); return OG_OK;
    default: return og_argmax_ref(x, V, index);
    }
}
