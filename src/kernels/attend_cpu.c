/* update_and_attend: the fast CPU kernel.
 *
 * Letters:
 *   T    tokens in the step          Hq   query heads
 *   Hkv  kv heads                    G    query heads per kv head (Hq / Hkv)
 *   D    head dim                    L    committed length before the step
 *   R    allocated rows              W    ring window
 *   KB   keys per chunk              QB   query rows per work item
 *   S    split-K partitions          RS   elements between storage rows
 *                                         (kv.row_stride, Hkv * D when dense)
 *
 * Work items:
 *   prefill / short decode: (block of QB query rows) x (kv head). An item walks
 *     the keys its rows can see in chunks of KB keys; each chunk is widened to
 *     f32 once (bf16 storage) and then used by all QB * G queries of the item,
 *     so every kv row is read once per item rather than once per query head.
 *     Where the ISA table has a fused bf16 update (AVX-512, D % 32 == 0), bf16
 *     chunks are not widened: the update reads them in place for the G query
 *     heads of a row, and prefetches the next chunk's lines as it goes.
 *     int8 and fp8 chunks are always widened, each row's quants times its
 *     head's scale (core/kv_quant.h), as the reference reads them.
 *     Each query keeps an online softmax (running max m, sum l, acc in the
 *     output row), updated once per chunk.
 *   long decode (T == 1, more than OG_ATTEND_SPLIT_MIN_KEYS visible keys):
 *     one item per split of the keys, over every kv head so that it streams
 *     its rows of storage front to back (with the next chunk prefetched); each
 *     leaves a partial (m, l, acc) per query head in scratch, and a second
 *     pass merges them per query head by rescaling with exp(m_s - max_s m_s).
 */
#include "kernels/attend.h"
#include "kernels/attend_amx.h"
#include "kernels/attend_isa.h"
#include "kernels/ops.h"
#include "core/kv_quant.h"

#include <math.h>

#define KB 32     /* keys per chunk: K and V chunks of 32 x 128 f32 stay in L1/L2 */
#define QB_MAX 16 /* most query rows per item */

/* ------------------------------------------------------ scalar fallback */

static void scores_scalar(const float *q, const float *K, int64_t ks, int32_t D, int32_t n,
                          float scale, float *s) {
    for (int32_t j = 0; j < n; j++) {
        const float *kj = K + j * ks;
        float dot = 0.0f;
        for (int32_t d = 0; d < D; d++) dot += q[d] * kj[d];
        s[j] = scale * dot;
    }
}

static void accumulate_scalar(float *acc, const float *V, int64_t ks, int32_t D, int32_t n,
                              const float *p) {
    for (int32_t j = 0; j < n; j++) {
        const float *vj = V + j * ks;
        for (int32_t d = 0; d < D; d++) acc[d] += p[j] * vj[d];
    }
}

static void rescale_scalar(float *acc, float c, int32_t D) {
    for (int32_t d = 0; d < D; d++) acc[d] *= c;
}

static void widen_scalar(float *dst, const og_bf16 *src, int64_t ss, int32_t D, int32_t n) {
    for (int32_t j = 0; j < n; j++)
        for (int32_t d = 0; d < D; d++) dst[(int64_t)j * D + d] = og_f32_from_bf16(src[j * ss + d]);
}

static void widen_i8_scalar(float *dst, const uint8_t *src, float scale, int32_t D) {
    for (int32_t d = 0; d < D; d++) dst[d] = (float)(int8_t)src[d] * scale;
}

static void widen_fp8_scalar(float *dst, const uint8_t *src, float scale, int32_t D) {
    for (int32_t d = 0; d < D; d++) dst[d] = og_kv_fp8_values[src[d]] * scale;
}

static const og_attend_ops g_ops_scalar = {
    scores_scalar, accumulate_scalar, rescale_scalar, widen_scalar, NULL, widen_i8_scalar, widen_fp8_scalar, NULL,
};

static const og_attend_ops *isa_ops(og_cpu_isa isa) {
    switch (isa) {
    case OG_CPU_ISA_SCALAR: return &g_ops_scalar;
    case OG_CPU_ISA_AVX2: return og_attend_ops_avx2();
    case OG_CPU_ISA_AVX512: return og_attend_ops_avx512();
    default: return NULL;
    }
}

/* ------------------------------------------------------------- the call */

typedef struct cpu_ctx {
    const og_attend_args *a;
    const og_attend_ops *ops;
    int64_t T, Hq, Hkv, D, G, L, R, W; /* W = 0 for flat */
    int64_t RS;                  /* elements between storage rows (kv.row_stride; >= Hkv * D) */
    int64_t soff;                /* int8 / fp8: bytes from a row to its head 0 scale (og_kv_scale_offset) */
    float scale;
    int64_t qb, n_blocks;        /* query rows per item, items per kv head */
    /* split-K (S == 1: not split) */
    int64_t S, split_keys, first_key; /* first_key: the decode query's first visible key */
    float *part_m, *part_l;      /* [S, Hq] */
    float *part_acc;             /* [S, Hq, D] */
    /* per-thread scratch: Kc [KB, D], Vc [KB, D] (bf16 only), s [2, KB], m [QB*G], l [QB*G] */
    float *scratch;
    int64_t scratch_per_thread;  /* floats */
} cpu_ctx;

/* Head g of n quantized rows (int8 or fp8, heads of D, head 0's scale
 * soff bytes in), rows row_bytes apart from src, into dst [n, D] f32:
 * quant times the row's scale for the head, the product the reference
 * takes. */
static void widen_quant(const og_attend_ops *ops, float *dst, const unsigned char *src, int64_t row_bytes,
                        og_dtype dt, int64_t soff, int64_t D, int64_t g, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        const unsigned char *row = src + j * row_bytes;
        const float sc = og_kv_row_scale_at(row, soff, g);
        if (dt == OG_DTYPE_INT8) ops->widen_i8(dst + (int64_t)j * D, row + g * D, sc, (int32_t)D);
        else ops->widen_fp8(dst + (int64_t)j * D, row + g * D, sc, (int32_t)D);
    }
}

/* One query's online-softmax update over n keys of a chunk.
 * q [D], K/V [n, D] at ks, acc [D]; s [n] scratch. */
static void softmax_update(const cpu_ctx *c, const float *q, const float *K, const float *V,
                           int64_t ks, int32_t n, float *m, float *l, float *acc, float *s) {
    const int32_t D = (int32_t)c->D;
    c->ops->scores(q, K, ks, D, n, c->scale, s);
    float cmax = s[0];
    for (int32_t j = 1; j < n; j++) cmax = s[j] > cmax ? s[j] : cmax;
    if (cmax > *m) {
        if (*m != -INFINITY) {
            const float r = expf(*m - cmax);
            *l *= r;
            c->ops->rescale(acc, r, D);
        }
        *m = cmax;
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - *m);
        sum += s[j];
    }
    *l += sum;
    c->ops->accumulate(acc, V, ks, D, n, s);
}

/* Asks for the next chunk's k and v rows (heads g0 .. g1-1 of the keys from
 * j0 on) to be brought into cache while the current chunk is computed: a
 * decode is bound by memory latency otherwise. Into L2, not L1: a chunk's
 * rows of one kv head lie a storage row (RS elements) apart, so they
 * share a few L1 sets and would evict each other before use. */
static void prefetch_chunk(const cpu_ctx *c, int64_t j0, int64_t key_hi, int64_t g0,
                           int64_t g1) {
    const og_kv_layer_view *kv = &c->a->kv;
    const int64_t esize = (int64_t)og_dtype_size(kv->dtype);
    const int64_t row_bytes = c->RS * esize;
    const int64_t lo = g0 * c->D * esize;
    int64_t hi = g1 * c->D * esize; /* bytes within a row */
    /* and the scales, right after the last head's quants in a whole row */
    const bool scales = og_kv_dtype_quantized(kv->dtype) && g1 == c->Hkv;
    if (scales && c->soff == hi) hi += c->Hkv * OG_KV_SCALE_BYTES;
    const int64_t end = key_hi - j0 < KB ? key_hi : j0 + KB;
    for (int64_t j = j0; j < end; j++) {
        const int64_t off = (c->W > 0 ? j % c->R : j) * row_bytes;
        for (int64_t b = lo; b < hi; b += 64) {
            __builtin_prefetch((const char *)kv->k + off + b, 0, 2);
            __builtin_prefetch((const char *)kv->v + off + b, 0, 2);
        }
        if (scales && c->soff != g1 * c->D) { /* a shard's heads: the scales lie apart */
            __builtin_prefetch((const char *)kv->k + off + c->soff, 0, 2);
            __builtin_prefetch((const char *)kv->v + off + c->soff, 0, 2);
        }
    }
}

/* The keys of chunk [j0, j0 + n) query row r of the step (position L + t0 +
 * r) sees: *lo is the first as an offset into the chunk, the count is
 * returned (0: none). */
static int64_t row_keys(const cpu_ctx *c, int64_t t0, int64_t r, int64_t j0, int64_t n, int64_t *lo) {
    const int64_t p = c->L + t0 + r;
    const int64_t lo_abs = og_attend_first_key(c->W, p) > j0 ? og_attend_first_key(c->W, p) : j0;
    const int64_t hi_abs = p + 1 < j0 + n ? p + 1 : j0 + n;
    *lo = lo_abs - j0;
    return hi_abs > lo_abs ? hi_abs - lo_abs : 0;
}

/* Attends query rows t0 .. t0+rows-1, heads of kv heads g0 .. g1-1, over keys
 * [key_lo, key_hi). With nh = (g1 - g0) * G query heads per row, query head
 * g0*G + x of row r keeps its state at m[r*nh + x], l[r*nh + x] and
 * acc + r*acc_stride + x*D. Chunks visit every kv head before moving on, so
 * a call over all kv heads reads storage front to back. */
static void attend_keys(const cpu_ctx *c, int thread, int64_t t0, int64_t rows, int64_t g0,
                        int64_t g1, int64_t key_lo, int64_t key_hi, float *acc,
                        int64_t acc_stride, float *m, float *l) {
    const og_kv_layer_view *kv = &c->a->kv;
    const int64_t D = c->D, G = c->G, nh = (g1 - g0) * G, rs = c->RS; /* storage row stride */
    float *scratch = c->scratch + thread * c->scratch_per_thread;
    float *Kc = scratch, *Vc = Kc + KB * D, *s = Vc + KB * D; /* [KB, D], [KB, D], [2, KB] */
    const float *q_base = c->a->q + (t0 * c->Hq + g0 * G) * D; /* row r at r * Hq * D */
    /* bf16 rows read in place by the fused update where the table has one */
    const bool fused = kv->dtype == OG_DTYPE_BF16 && c->ops->update_bf16 && D % 32 == 0 &&
                       D <= OG_ATTEND_FUSED_MAX_D;
    /* int8 / fp8 rows read in place likewise (quants, the scales at the row's tail) */
    const bool fused_q = og_kv_dtype_quantized(kv->dtype) && c->ops->update_q8 && D % 16 == 0 &&
                         D <= OG_ATTEND_FUSED_MAX_D;

    for (int64_t j0 = key_lo; j0 < key_hi;) {
        const int64_t slot = c->W > 0 ? j0 % c->R : j0;
        int64_t n = key_hi - j0 < KB ? key_hi - j0 : KB;
        if (n > c->R - slot) n = c->R - slot; /* a chunk never crosses the ring's wrap */
        if (!fused && !fused_q) prefetch_chunk(c, j0 + n, key_hi, g0, g1);
        /* the fused update prefetches as it reads: the same rows of the next
         * n rows of storage, unless they wrap the ring; past key_hi they are
         * the next split's (or the step's own) rows, read next */
        const int64_t pf = slot + 2 * n <= c->R ? n * rs : 0;
        for (int64_t g = g0; g < g1; g++) {
            if (fused) {
                const og_bf16 *Kb = (const og_bf16 *)kv->k + slot * rs + g * D;
                const og_bf16 *Vb = (const og_bf16 *)kv->v + slot * rs + g * D;
                for (int64_t r = 0; r < rows; r++) {
                    int64_t lo;
                    const int64_t cnt = row_keys(c, t0, r, j0, n, &lo), x = (g - g0) * G;
                    if (!cnt) continue;
                    c->ops->update_bf16(q_base + r * c->Hq * D + x * D, (int32_t)G,
                                        Kb + lo * rs, Vb + lo * rs, rs,
                                        (int32_t)D, (int32_t)cnt, pf, c->scale,
                                        &m[r * nh + x], &l[r * nh + x],
                                        acc + r * acc_stride + x * D, s);
                }
                continue;
            }
            if (fused_q) { /* rows of rs bytes; head g's scale soff + 4 g - g D bytes past its quants */
                const uint8_t *Kq = (const uint8_t *)kv->k + slot * rs + g * D;
                const uint8_t *Vq = (const uint8_t *)kv->v + slot * rs + g * D;
                const int64_t soff = c->soff + g * OG_KV_SCALE_BYTES - g * D;
                for (int64_t r = 0; r < rows; r++) {
                    int64_t lo;
                    const int64_t cnt = row_keys(c, t0, r, j0, n, &lo), x = (g - g0) * G;
                    if (!cnt) continue;
                    c->ops->update_q8(q_base + r * c->Hq * D + x * D, (int32_t)G, Kq + lo * rs, Vq + lo * rs, rs,
                                      soff, kv->dtype == OG_DTYPE_FP8, (int32_t)D, (int32_t)cnt, pf,
                                      c->scale, &m[r * nh + x], &l[r * nh + x], acc + r * acc_stride + x * D, s);
                }
                continue;
            }
            const float *K, *V;
            int64_t ks;
            if (kv->dtype == OG_DTYPE_F32) {
                K = (const float *)kv->k + slot * rs + g * D;
                V = (const float *)kv->v + slot * rs + g * D;
                ks = rs;
            } else if (og_kv_dtype_quantized(kv->dtype)) { /* rows of rs bytes */
                widen_quant(c->ops, Kc, (const unsigned char *)kv->k + slot * rs, rs, kv->dtype, c->soff, D, g,
                            (int32_t)n);
                widen_quant(c->ops, Vc, (const unsigned char *)kv->v + slot * rs, rs, kv->dtype, c->soff, D, g,
                            (int32_t)n);
                K = Kc;
                V = Vc;
                ks = D;
            } else {
                c->ops->widen(Kc, (const og_bf16 *)kv->k + slot * rs + g * D, rs,
                              (int32_t)D, (int32_t)n);
                c->ops->widen(Vc, (const og_bf16 *)kv->v + slot * rs + g * D, rs,
                              (int32_t)D, (int32_t)n);
                K = Kc;
                V = Vc;
                ks = D;
            }
            for (int64_t r = 0; r < rows; r++) {
                int64_t lo;
                const int64_t cnt = row_keys(c, t0, r, j0, n, &lo);
                if (!cnt) continue;
                for (int64_t x = (g - g0) * G; x < (g - g0 + 1) * G; x++) {
                    softmax_update(c, q_base + r * c->Hq * D + x * D, K + lo * ks, V + lo * ks,
                                   ks, (int32_t)cnt, &m[r * nh + x],
                                   &l[r * nh + x], acc + r * acc_stride + x * D, s);
                }
            }
        }
        j0 += n;
    }
}

/* Writes token t's k and v rows into storage. */
static void write_token(void *ctx, int64_t t, int thread) {
    const cpu_ctx *c = ctx;
    const og_kv_layer_view *kv = &c->a->kv;
    const int64_t p = c->L + t, slot = c->W > 0 ? p % c->R : p, n = c->Hkv * c->D;
    const float *k = c->a->k + t * n, *v = c->a->v + t * n; /* [Hkv, D] */
    if (og_kv_dtype_quantized(kv->dtype)) { /* rows of RS bytes */
        og_kv_quantize_heads(kv->dtype, k, c->Hkv, c->D, c->a->kv_part, (unsigned char *)kv->k + slot * c->RS);
        og_kv_quantize_heads(kv->dtype, v, c->Hkv, c->D, c->a->kv_part, (unsigned char *)kv->v + slot * c->RS);
    } else if (kv->dtype == OG_DTYPE_F32) {
        memcpy((float *)kv->k + slot * c->RS, k, (size_t)n * sizeof(float));
        memcpy((float *)kv->v + slot * c->RS, v, (size_t)n * sizeof(float));
    } else {
        og_f32_to_bf16_cpu(k, (og_bf16 *)kv->k + slot * c->RS, (size_t)n);
        og_f32_to_bf16_cpu(v, (og_bf16 *)kv->v + slot * c->RS, (size_t)n);
    }
}

/* Item (block b, kv head g): rows b*QB .. of the output, finished in place. */
static void block_item(void *ctx, int64_t item, int thread) {
    const cpu_ctx *c = ctx;
    const int64_t b = item / c->Hkv, g = item % c->Hkv, D = c->D, G = c->G;
    const int64_t t0 = b * c->qb, rows = c->T - t0 < c->qb ? c->T - t0 : c->qb;
    float *scratch = c->scratch + thread * c->scratch_per_thread;
    float *m = scratch + 2 * KB * D + 2 * KB, *l = m + QB_MAX * G; /* [rows, G] each */
    float *acc = c->a->out + (t0 * c->Hq + g * G) * D;        /* row r at r * Hq * D */
    for (int64_t r = 0; r < rows; r++) {
        memset(acc + r * c->Hq * D, 0, (size_t)(G * D) * sizeof(float));
        for (int64_t i = 0; i < G; i++) {
            m[r * G + i] = -INFINITY;
            l[r * G + i] = 0.0f;
        }
    }
    attend_keys(c, thread, t0, rows, g, g + 1, og_attend_first_key(c->W, c->L + t0), c->L + t0 + rows,
                acc, c->Hq * D, m, l);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < G; i++)
            c->ops->rescale(acc + r * c->Hq * D + i * D, 1.0f / l[r * G + i], (int32_t)D);
}

/* Split s of a decode, over every kv head (so it streams its rows of storage
 * front to back): a partial (m, l, acc) per query head. */
static void split_item(void *ctx, int64_t s, int thread) {
    const cpu_ctx *c = ctx;
    const int64_t Hq = c->Hq, D = c->D;
    const int64_t key_lo = c->first_key + s * c->split_keys;
    const int64_t key_end = c->L + 1; /* the decode query sits at position L */
    const int64_t key_hi = key_end - key_lo < c->split_keys ? key_end : key_lo + c->split_keys;
    float *m = c->part_m + s * Hq, *l = c->part_l + s * Hq; /* [Hq] */
    float *acc = c->part_acc + s * Hq * D;                   /* [Hq, D] */
    memset(acc, 0, (size_t)(Hq * D) * sizeof(float));
    for (int64_t h = 0; h < Hq; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    attend_keys(c, thread, 0, 1, 0, c->Hkv, key_lo, key_hi, acc, Hq * D, m, l);
}

/* Merges the S partials of query head h into its output row. */
static void merge_item(void *ctx, int64_t h, int thread) {
    const cpu_ctx *c = ctx;
    const int64_t Hq = c->Hq, D = c->D;
    float w[OG_ATTEND_MAX_SPLITS];
    const float *m = c->part_m + h, *l = c->part_l + h; /* [S] at stride Hq */
    float mx = -INFINITY, lsum = 0.0f;
    for (int64_t s = 0; s < c->S; s++) mx = m[s * Hq] > mx ? m[s * Hq] : mx;
    for (int64_t s = 0; s < c->S; s++) {
        w[s] = expf(m[s * Hq] - mx);
        lsum += w[s] * l[s * Hq];
    }
    float *out = c->a->out + h * D; /* [D] */
    memset(out, 0, (size_t)D * sizeof(float));
    /* head h's partial acc rows over the splits: [S, D] at stride Hq * D */
    c->ops->accumulate(out, c->part_acc + h * D, Hq * D, (int32_t)D, (int32_t)c->S, w);
    c->ops->rescale(out, 1.0f / lsum, (int32_t)D);
}

og_status og_update_and_attend_cpu_isa(const og_attend_args *a, og_threadpool *pool,
                                       og_cpu_isa isa, og_attend_stats *stats) {
    og_status st = og_attend_check(a);
    if (st != OG_OK) return st;
    const og_attend_ops *ops = og_cpu_isa_supported(isa) ? isa_ops(isa) : NULL;
    if (!ops)
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "update_and_attend: instruction set %s is not available on this CPU",
                            og_cpu_isa_name(isa));

    const og_kv_layer_view *kv = &a->kv;
    cpu_ctx c = {
        .a = a,
        .ops = ops,
        .T = a->T,
        .Hq = a->n_heads,
        .Hkv = kv->n_kv_heads,
        .D = kv->head_dim,
        .G = a->n_heads / kv->n_kv_heads,
        .L = kv->length,
        .R = kv->rows,
        .W = kv->policy == OG_KV_RING ? kv->window : 0,
        .RS = og_kv_layer_view_row_stride(kv),
        .soff = og_kv_scale_offset(a->kv_part, kv->n_kv_heads, kv->head_dim),
        .scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)kv->head_dim),
        .S = 1,
    };
    const int64_t n_threads = og_threadpool_size(pool);

    /* plan: split-K for long decodes, else blocks of query rows */
    c.first_key = og_attend_first_key(c.W, c.L);
    const int64_t visible = c.L + 1 - c.first_key;
    if (c.T == 1 && visible > OG_ATTEND_SPLIT_MIN_KEYS) {
        c.S = (visible + OG_ATTEND_SPLIT_KEYS - 1) / OG_ATTEND_SPLIT_KEYS;
        if (c.S > OG_ATTEND_MAX_SPLITS) c.S = OG_ATTEND_MAX_SPLITS;
        c.split_keys = (visible + c.S - 1) / c.S;
        c.S = (visible + c.split_keys - 1) / c.split_keys; /* no empty last split */
    }
    c.qb = QB_MAX / c.G > 1 ? QB_MAX / c.G : 1;
    if (c.qb > c.T) c.qb = c.T;
    /* smaller blocks while there are too few items to keep every thread busy */
    while (c.qb > 1 && ((c.T + c.qb - 1) / c.qb) * c.Hkv < 4 * n_threads) c.qb /= 2;
    c.n_blocks = (c.T + c.qb - 1) / c.qb;

    /* scratch for the call, taken before anything is written */
    c.scratch_per_thread = 2 * KB * c.D + 2 * KB + 2 * QB_MAX * c.G;
    const int64_t part = c.S > 1 ? c.S * c.Hq * (2 + c.D) : 0;
    float *mem = og_scratch(OG_SCRATCH_ATTEND, (size_t)(n_threads * c.scratch_per_thread + part) * sizeof(float));
    if (!mem)
        return og_set_error(OG_ERR_OUT_OF_MEMORY,
                            "update_and_attend: layer %d: no memory for %lld floats of scratch",
                            kv->layer_id,
                            (long long)(n_threads * c.scratch_per_thread + part));
    c.scratch = mem;
    if (c.S > 1) {
        c.part_m = mem + n_threads * c.scratch_per_thread;
        c.part_l = c.part_m + c.S * c.Hq;
        c.part_acc = c.part_l + c.S * c.Hq;
    }

    /* 1. write every token's k and v; 2. attend */
    og_parallel_for(pool, c.T, write_token, &c);
    if (c.S > 1) {
        og_parallel_for(pool, c.S, split_item, &c);
        og_parallel_for(pool, c.Hq, merge_item, &c);
    } else {
        og_parallel_for(pool, c.n_blocks * c.Hkv, block_item, &c);
    }
    if (stats) {
        stats->splits = (int32_t)c.S;
        stats->amx = 0;
    }
    return OG_OK;
}

/* A step the tile path takes (attend_amx.h): its scratch first, then the k
 * and v writes as above, then the tiles. */
static og_status attend_amx(const og_attend_args *a, og_threadpool *pool, og_attend_stats *stats) {
    const og_kv_layer_view *kv = &a->kv;
    const size_t bytes = og_attend_amx_scratch_bytes(a, og_threadpool_size(pool));
    void *mem = og_scratch(OG_SCRATCH_ATTEND, bytes);
    if (!mem)
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "update_and_attend: layer %d: no memory for %zu bytes of scratch",
                            kv->layer_id, bytes);
    const cpu_ctx c = {
        .a = a,
        .T = a->T,
        .Hkv = kv->n_kv_heads,
        .D = kv->head_dim,
        .L = kv->length,
        .R = kv->rows,
        .W = kv->policy == OG_KV_RING ? kv->window : 0,
        .RS = og_kv_layer_view_row_stride(kv),
    };
    og_parallel_for(pool, c.T, write_token, (void *)&c);
    og_attend_amx_run(a, pool, mem);
    if (stats) {
        stats->splits = 1;
        stats->amx = 1;
    }
    return OG_OK;
}

og_status og_update_and_attend_cpu(const og_attend_args *a, og_threadpool *pool,
                                   og_attend_stats *stats) {
    const og_status st = og_attend_check(a);
    if (st != OG_OK) return st;
    if (og_attend_amx_usable(a)) return attend_amx(a, pool, stats);
    return og_update_and_attend_cpu_isa(a, pool, og_cpu_isa_active(), stats);
}
