/* Lowering of a Hugging Face checkpoint to a program file. */
#include "import/export.h"

#include "core/core.h"
#include "import/safetensors.h"
#include "core/textfile.h"

#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

void og_export_default_options(og_export_options *o) {
    memset(o, 0, sizeof *o);
    o->dtype = OG_DTYPE_COUNT;
    o->kv_dtype = OG_DTYPE_BF16;
    o->weights = OG_DTYPE_COUNT;
}

/* One weight to convert while the payload is written: a checkpoint tensor
 * as stored (reshaped at most), or derived from one: some of its rows in
 * another order (rows), each value plus one (plus_one). */
typedef struct weight_src {
    const og_st_tensor *t;
    og_dtype dst;
    const og_export_source *src;
    int32_t rank;          /* the program tensor's shape                   */
    int64_t shape[2];
    int64_t *rows;         /* [shape[0]]: source row of each row, or NULL; owned */
    bool plus_one;
    og_threadpool *pool;   /* quantizes its rows; NULL: the calling thread alone */
} weight_src;

/* Quantizing one tensor's rows across a pool: blocks of 64 rows, the first
 * error of any block kept. With `from`, each block first converts its own
 * rows of that source tensor to f32 into src, so the conversion runs on
 * every thread too. */
typedef struct quant_job {
    og_dtype dt;
    const float *src;         /* [N, K]: the rows quantized */
    const og_st_tensor *from; /* [N, K] in its own dtype, or NULL: src is filled */
    float *fill;              /* with from: src, each block's rows written first */
    int64_t N, K;
    void *dst;
    og_status rc;
    char why[256];
    pthread_mutex_t lock;
} quant_job;

enum { QUANT_BLOCK_ROWS = 64 };

static void quant_task(void *ctx, int64_t i, int thread) {
    (void)thread;
    quant_job *j = ctx;
    const int64_t r0 = i * QUANT_BLOCK_ROWS, r1 = r0 + QUANT_BLOCK_ROWS < j->N ? r0 + QUANT_BLOCK_ROWS : j->N;
    if (j->from) {
        const og_st_tensor *t = j->from;
        float *f = j->fill + r0 * j->K;
        const size_t i0 = (size_t)(r0 * j->K), n = (size_t)((r1 - r0) * j->K);
        if (t->dtype == OG_DTYPE_BF16)
            for (size_t e = 0; e < n; e++) f[e] = og_f32_from_bf16(((const og_bf16 *)t->data)[i0 + e]);
        else if (t->dtype == OG_DTYPE_F16)
            for (size_t e = 0; e < n; e++) f[e] = og_f32_from_f16(((const og_f16 *)t->data)[i0 + e]);
        else
            for (size_t e = 0; e < n; e++) f[e] = og_load_f32(t->data, t->dtype, i0 + e);
    }
    const og_status rc = og_quantize_row_range(j->dt, j->src, j->N, j->K, r0, r1, j->dst);
    if (rc == OG_OK) return;
    pthread_mutex_lock(&j->lock);
    if (j->rc == OG_OK || r0 == 0) { /* the lowest block's reason is kept when several fail */
        j->rc = rc;
        snprintf(j->why, sizeof j->why, "%s", og_last_error());
    }
    pthread_mutex_unlock(&j->lock);
}

static og_status run_quant_job(og_threadpool *pool, quant_job *j) {
    j->rc = OG_OK;
    pthread_mutex_init(&j->lock, NULL);
    og_parallel_for(pool, (j->N + QUANT_BLOCK_ROWS - 1) / QUANT_BLOCK_ROWS, quant_task, j);
    pthread_mutex_destroy(&j->lock);
    return j->rc == OG_OK ? OG_OK : og_set_error(j->rc, "%s", j->why);
}

/* Quantizes `from` [N, K] through the f32 scratch rows (filled here). */
static og_status quantize_from(og_threadpool *pool, og_dtype dt, const og_st_tensor *from, float *scratch, int64_t N,
                               int64_t K, void *dst) {
    quant_job j = {.dt = dt, .src = scratch, .from = from, .fill = scratch, .N = N, .K = K, .dst = dst};
    return run_quant_job(pool, &j);
}

/* Quantizes the f32 rows src [N, K]. */
static og_status quantize_parallel(og_threadpool *pool, og_dtype dt, const float *src, int64_t N, int64_t K,
                                   void *dst) {
    quant_job j = {.dt = dt, .src = src, .N = N, .K = K, .dst = dst};
    return run_quant_job(pool, &j);
}

typedef struct exporter {
    const og_hf_config *cfg;
    const og_export_source *src;
    const char *prefix; /* of the text model's tensors: "model." or "model.language_model." */
    og_program_writer *w;
    weight_src *srcs; /* one per weight added; fill contexts */
    int32_t n_srcs, cap_srcs;
    og_dtype dtype;   /* activations, norms, unquantized matrices          */
    og_dtype weights; /* embedding table and matmul weights                */
    og_weight_mix mix; /* or per matrix (og_weight_mix_dtype, as stored)  */
    int64_t n_params;
    uint64_t weight_bytes;
    int32_t n_unquantized, n_fallback;
    uint32_t matrix_dtypes; /* bit per dtype a matrix was given */
    og_threadpool *pool; /* quantizes weights (q8, q4, k-quants) on every CPU; NULL otherwise */
    struct stack_src **stacks; /* expert stacks' fill contexts, owned */
    int32_t n_stacks, cap_stacks;
} exporter;

/* t's elements as f32 into out [numel]. */
static og_status load_f32(const weight_src *s, float *out) {
    const og_st_tensor *t = s->t;
    if (s->src->fill) return s->src->fill(s->src->ctx, t, OG_DTYPE_F32, out);
    for (size_t i = 0; i < (size_t)t->numel; i++)
        out[i] = t->dtype == OG_DTYPE_F16 ? og_f32_from_f16(((const og_f16 *)t->data)[i]) : og_load_f32(t->data, t->dtype, i);
    return OG_OK;
}

/* Converts t's elements to dst; called by the writer during finish. A
 * quantized dst is quantized from f32 here, unless the source holds that
 * very format (a GGUF q8_0 / q4_0 tensor), which its fill copies exactly. */
/* A derived tensor (weight_src.rows / plus_one): the source in f32, its
 * rows gathered, plus one, then stored or quantized as dst. */
static og_status fill_derived(const weight_src *s, void *dst) {
    const og_st_tensor *t = s->t;
    const int64_t src_rows = t->shape[0], row = t->numel / src_rows;
    const int64_t rows = s->shape[0], n = rows * row;
    float *f = og_malloc((size_t)t->numel * sizeof *f), *g = og_malloc((size_t)n * sizeof *g);
    og_status rc = f && g ? load_f32(s, f) : og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory for \"%s\"", t->name);
    for (int64_t r = 0; rc == OG_OK && r < rows; r++) {
        const int64_t from = s->rows ? s->rows[r] : r;
        for (int64_t i = 0; i < row; i++) g[r * row + i] = f[from * row + i] + (s->plus_one ? 1.0f : 0.0f);
    }
    if (rc == OG_OK) {
        if (og_dtype_is_quantized(s->dst))
            rc = quantize_parallel(s->pool, s->dst, g, rows, row, dst);
        else
            for (int64_t i = 0; i < n; i++) og_store_f32(dst, s->dst, (size_t)i, g[i]);
    }
    og_free(f);
    og_free(g);
    return rc == OG_OK ? OG_OK : og_set_error(rc, "export: tensor \"%s\": %s", t->name, og_last_error());
}

static og_status fill_weight(void *ctx, void *dst, size_t nbytes) {
    const weight_src *s = ctx;
    const og_st_tensor *t = s->t;
    const size_t n = (size_t)t->numel;
    int64_t want = 0;
    if (!og_tensor_bytes(s->dst, s->rank, s->shape, &want) || nbytes != (size_t)want)
        return og_set_error(OG_ERR_STATE, "export: tensor \"%s\": writer asked for %zu bytes, expected %lld",
                            t->name, nbytes, (long long)want);
    if (s->rows || s->plus_one) return fill_derived(s, dst);
    if (og_dtype_is_quantized(s->dst) && t->dtype != s->dst) {
        float *f = og_malloc(n * sizeof *f);
        if (!f) return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory for tensor \"%s\" as f32", t->name);
        /* a source with its own reader fills f whole; a mapped one is
         * converted block by block by the quantizing threads */
        og_status rc = s->src->fill ? load_f32(s, f) : OG_OK;
        if (rc == OG_OK)
            rc = quantize_from(s->pool, s->dst, s->src->fill ? NULL : t, f, s->shape[0], s->shape[1], dst);
        og_free(f);
        return rc == OG_OK ? OG_OK : og_set_error(rc, "export: tensor \"%s\": %s", t->name, og_last_error());
    }
    if (s->src->fill) return s->src->fill(s->src->ctx, t, s->dst, dst);
    if (t->dtype == s->dst) {
        memcpy(dst, t->data, nbytes);
        return OG_OK;
    }
    for (size_t i = 0; i < n; i++) {
        float x;
        if (t->dtype == OG_DTYPE_F16)
            x = og_f32_from_f16(((const og_f16 *)t->data)[i]);
        else
            x = og_load_f32(t->data, t->dtype, i);
        og_store_f32(dst, s->dst, i, x);
    }
    return OG_OK;
}

static og_status writer_error(const exporter *e, og_status rc) {
    return og_set_error(rc, "%s", og_program_writer_last_error(e->w));
}

/* The checkpoint tensor `name`, which must have the shape want [rank]. */
static og_status find_checked(exporter *e, const char *name, int32_t rank, const int64_t *want,
                              const og_st_tensor **out) {
    const og_st_tensor *t = e->src->find(e->src->ctx, name);
    if (!t) return og_set_error(OG_ERR_FORMAT, "checkpoint: tensor \"%s\" is missing", name);
    bool ok = t->rank == rank;
    for (int32_t i = 0; ok && i < rank; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char got[96] = "[", exp[96] = "[";
        for (int32_t i = 0; i < t->rank; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        for (int32_t i = 0; i < rank; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%lld", i ? ", " : "", (long long)want[i]);
        strncat(got, "]", sizeof got - strlen(got) - 1);
        strncat(exp, "]", sizeof exp - strlen(exp) - 1);
        return og_set_error(OG_ERR_FORMAT, "checkpoint %s: tensor \"%s\" has shape %s, %s implies %s", t->file, name,
                            got, e->src->config_name, exp);
    }
    *out = t;
    return OG_OK;
}

/* Adds program tensor `name` [rank: shape] of dtype dt, filled from t as
 * stored, or derived from it (rows, owned from here on; plus_one). */
static og_status add_from(exporter *e, const char *name, const og_st_tensor *t, int32_t rank, const int64_t *shape,
                          og_dtype dt, int64_t *rows, bool plus_one) {
    if (e->n_srcs == e->cap_srcs) {
        og_free(rows);
        return og_set_error(OG_ERR_STATE, "export: more weights than planned (%d)", e->cap_srcs);
    }
    weight_src *s = &e->srcs[e->n_srcs++];
    *s = (weight_src){.t = t, .dst = dt, .src = e->src, .rank = rank, .rows = rows, .plus_one = plus_one,
                      .pool = e->pool};
    memcpy(s->shape, shape, (size_t)rank * sizeof *shape);
    og_status rc = og_program_writer_add_weight(e->w, name, dt, rank, shape, fill_weight, s);
    if (rc != OG_OK) return writer_error(e, rc);
    int64_t bytes = 0;
    og_tensor_bytes(dt, rank, shape, &bytes);
    e->n_params += rank == 1 ? shape[0] : shape[0] * shape[1];
    e->weight_bytes += (uint64_t)bytes;
    return OG_OK;
}

/* Adds the checkpoint tensor `name`, which must have the given shape, as
 * dtype dt. */
static og_status add_tensor_as(exporter *e, const char *name, int32_t rank, int64_t d0, int64_t d1, og_dtype dt) {
    const int64_t want[2] = {d0, d1};
    const og_st_tensor *t;
    OG_TRY(find_checked(e, name, rank, want, &t));
    return add_from(e, name, t, rank, want, dt, NULL, false);
}

/* A norm weight (or any tensor that stays in the program's dtype). */
static og_status add_weight(exporter *e, const char *name, int32_t rank, int64_t d0, int64_t d1) {
    return add_tensor_as(e, name, rank, d0, d1, e->dtype);
}

/* A matrix [d0, d1] in the weights' dtype (or the mix's for it) where its
 * rows are whole blocks, else the fallback; *dt gets the dtype it was
 * stored as (its bias follows og_bias_dtype). */
/* The dtype the matrix `name` [., d1] is stored as, counted in e's figures. */
static og_dtype matrix_dtype(exporter *e, const char *name, int64_t d1) {
    og_dtype want = e->weights;
    if (e->mix == OG_MIX_AS_STORED) {
        const og_st_tensor *t = e->src->find(e->src->ctx, name);
        want = t && og_dtype_is_quantized(t->dtype) ? t->dtype : e->dtype;
    } else if (e->mix != OG_MIX_NONE) {
        want = og_weight_mix_dtype(e->mix, e->cfg, name, d1, e->dtype);
    } else {
        want = og_kquant_fallback(want, d1, e->dtype);
    }
    if (og_dtype_is_quantized(e->weights) && !og_dtype_is_quantized(want)) e->n_unquantized++;
    else if (e->mix == OG_MIX_NONE && want != e->weights) e->n_fallback++;
    e->matrix_dtypes |= 1u << want;
    return want;
}

static og_status add_matrix(exporter *e, const char *name, int64_t d0, int64_t d1, og_dtype *dt) {
    const og_dtype want = matrix_dtype(e, name, d1);
    if (dt) *dt = want;
    return add_tensor_as(e, name, 2, d0, d1, want);
}

static og_status instr(exporter *e, og_op op, const char *out, const og_op_attrs *attrs, int32_t n_in,
                       const char *const *in) {
    og_op_attrs none = {0};
    og_status rc = og_program_writer_add_instr(e->w, op, in, n_in, out, attrs ? attrs : &none);
    return rc == OG_OK ? OG_OK : writer_error(e, rc);
}

#define IN(...) (int32_t)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), (const char *[]){__VA_ARGS__}
#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)
/* NAME for a char * of 48 bytes (an output name given by a caller) */
#define NAME48(buf, ...) (snprintf(buf, 48, __VA_ARGS__), buf)

/* matmul of x by "<w>.weight" (+ "<w>.bias" when bias) into out. */
static og_status linear(exporter *e, const char *x, const char *w, int64_t n, int64_t k, bool bias,
                        const char *out) {
    char wn[160], bn[160];
    og_dtype wdt;
    og_status rc = add_matrix(e, NAME(wn, "%s.weight", w), n, k, &wdt);
    if (rc == OG_OK && bias) rc = add_tensor_as(e, NAME(bn, "%s.bias", w), 1, n, 0, og_bias_dtype(wdt));
    if (rc != OG_OK) return rc;
    return bias ? instr(e, OG_OP_MATMUL, out, NULL, IN(x, wn, bn)) : instr(e, OG_OP_MATMUL, out, NULL, IN(x, wn));
}

/* ---- mixture-of-experts MLPs ----
 * A sparse layer lowers to: the router's matmul (its weight stays in the
 * program's dtype: quantizing it would move routing decisions), then for a
 * shared expert its gate/up matmuls, swiglu, down matmul and its gate's
 * [1, H] matmul, then one moe instruction over two expert stacks,
 * <p>.mlp.experts.gate_up_proj [E, 2F, H] (per expert F gate rows, then F
 * up rows: transformers' fused layout) and <p>.mlp.experts.down_proj
 * [E, H, F]. The stacks are gathered from either checkpoint layout: the
 * fused 3-D tensors of those names, or one tensor per expert
 * (<p>.mlp.experts.<e>.gate_proj.weight, up_proj, down_proj; a GGUF file's
 * expert tensors are mapped to these names). With --weights q8|q4 the
 * stacks are quantized expert by expert (a quantized stack is E quantized
 * matrices one after the other). */

/* A stack [E, N, K] gathered from checkpoint tensors: expert e's rows are
 * its pieces' rows one after the other. A piece is a [n, K] tensor of its
 * own (one per expert: t[e * n_pieces + j]) or expert e's slice of an
 * [E, n, K] tensor (stacked: t[j]). */
typedef struct stack_src {
    const og_export_source *src;
    char name[192];        /* the program tensor, in messages */
    og_dtype dst;
    int64_t E, N, K;
    int32_t n_pieces;      /* 1 or 2 */
    bool stacked;
    const og_st_tensor **t;
    og_threadpool *pool;
} stack_src;

static void stack_free(stack_src *s) {
    if (!s) return;
    og_free(s->t);
    og_free(s);
}

/* Piece j of expert e as a [n, K] tensor: a per-expert tensor itself (the
 * source's own pointer: a fill callback may need it), or a view of a
 * stacked one's slice written to *view (stacked sources have no fill). */
static const og_st_tensor *stack_piece(const stack_src *s, int64_t e, int32_t j, og_st_tensor *view) {
    if (!s->stacked) return s->t[e * s->n_pieces + j];
    og_st_tensor v = *s->t[j];
    const int64_t n = v.shape[1];
    const size_t es = og_dtype_size(v.dtype);
    v.rank = 2;
    v.shape[0] = n;
    v.shape[1] = s->K;
    v.shape[2] = 0;
    v.numel = n * s->K;
    v.nbytes = (size_t)v.numel * es;
    v.data = (const char *)v.data + (size_t)e * v.nbytes;
    *view = v;
    return view;
}

/* A view's elements as f32 into out [numel]. */
static og_status piece_f32(const stack_src *s, const og_st_tensor *v, float *out) {
    if (s->src->fill) return s->src->fill(s->src->ctx, v, OG_DTYPE_F32, out);
    for (size_t i = 0; i < (size_t)v->numel; i++)
        out[i] = v->dtype == OG_DTYPE_F16 ? og_f32_from_f16(((const og_f16 *)v->data)[i]) : og_load_f32(v->data, v->dtype, i);
    return OG_OK;
}

static og_status fill_stack(void *ctx, void *dst, size_t nbytes) {
    const stack_src *s = ctx;
    const int64_t shape[2] = {s->N, s->K}, N = s->N, K = s->K;
    int64_t per = 0;
    if (!og_tensor_bytes(s->dst, 2, shape, &per) || nbytes != (size_t)(per * s->E))
        return og_set_error(OG_ERR_STATE, "export: tensor \"%s\": writer asked for %zu bytes", s->name, nbytes);
    const bool quant = og_dtype_is_quantized(s->dst);
    float *f = og_malloc((size_t)(N * K) * sizeof *f);
    void *q = quant ? og_malloc((size_t)per) : NULL; /* a piece's own quantized [n, K] */
    og_status rc = f && (q || !quant) ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory for \"%s\"", s->name);
    for (int64_t e = 0; rc == OG_OK && e < s->E; e++) {
        uint8_t *out = (uint8_t *)dst + (size_t)(e * per);
        int64_t r = 0;
        bool exact = quant;
        og_st_tensor view;
        for (int32_t j = 0; j < s->n_pieces; j++) exact = exact && stack_piece(s, e, j, &view)->dtype == s->dst;
        for (int32_t j = 0; rc == OG_OK && j < s->n_pieces; j++) {
            const og_st_tensor *vp = stack_piece(s, e, j, &view);
            const og_st_tensor v = *vp;
            const int64_t n = v.shape[0];
            if (exact) {
                /* the source holds these very blocks (GGUF q8_0 / q4_0): its
                 * quants and scales go to this expert's two planes */
                rc = s->src->fill(s->src->ctx, vp, s->dst, q);
                if (rc != OG_OK) break;
                const size_t rb = og_quant_row_bytes(s->dst, K), sb = (size_t)(K / OG_QUANT_GROUP) * 2;
                memcpy(out + (size_t)r * rb, q, (size_t)n * rb);
                memcpy(out + (size_t)N * rb + (size_t)r * sb, (uint8_t *)q + (size_t)n * rb, (size_t)n * sb);
            } else if (!quant && !s->src->fill && v.dtype == s->dst) {
                memcpy(out + (size_t)(r * K) * og_dtype_size(s->dst), v.data, v.nbytes);
            } else {
                rc = piece_f32(s, vp, f + r * K);
                if (rc == OG_OK && !quant)
                    for (int64_t i = 0; i < n * K; i++) og_store_f32(out, s->dst, (size_t)(r * K + i), f[r * K + i]);
            }
            r += n;
        }
        if (rc == OG_OK && quant && !exact) rc = quantize_parallel(s->pool, s->dst, f, N, K, out);
    }
    og_free(f);
    og_free(q);
    return rc == OG_OK ? OG_OK : og_set_error(rc, "export: tensor \"%s\": %s", s->name, og_last_error());
}

/* The checkpoint tensor `name`, which must be [d0, d1] (d2 > 0: [d0, d1, d2]). */
static og_status find_shaped(exporter *e, const char *name, int64_t d0, int64_t d1, int64_t d2,
                             const og_st_tensor **out) {
    const og_st_tensor *t = e->src->find(e->src->ctx, name);
    if (!t) return og_set_error(OG_ERR_FORMAT, "checkpoint %s: tensor \"%s\" is missing", e->src->origin, name);
    const int32_t rank = d2 > 0 ? 3 : 2;
    if (t->rank != rank || t->shape[0] != d0 || t->shape[1] != d1 || (rank == 3 && t->shape[2] != d2))
        return og_set_error(OG_ERR_FORMAT, "checkpoint %s: tensor \"%s\" has rank %d shape [%lld, %lld, %lld], %s implies "
                            "[%lld, %lld%s%lld]", t->file, name, t->rank, (long long)t->shape[0],
                            (long long)(t->rank > 1 ? t->shape[1] : 0), (long long)(t->rank > 2 ? t->shape[2] : 0),
                            e->src->config_name, (long long)d0, (long long)d1, rank == 3 ? ", " : "] (",
                            (long long)(rank == 3 ? d2 : 2));
    *out = t;
    return OG_OK;
}

/* Adds the stack `name` [E, N, K] of the n_pieces tensors pieces[] (printf
 * patterns with the expert's index, or names of stacked tensors). */
static og_status add_stack(exporter *e, const char *name, int64_t E, int64_t N, int64_t K, bool stacked, int32_t n_pieces,
                           const char *const *pieces) {
    if (e->n_stacks == e->cap_stacks) return og_set_error(OG_ERR_STATE, "export: more expert stacks than planned");
    stack_src *s = og_calloc(1, sizeof *s);
    const int64_t n_t = stacked ? n_pieces : E * n_pieces;
    if (s) s->t = og_calloc((size_t)n_t, sizeof *s->t);
    if (!s || !s->t) {
        stack_free(s);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    e->stacks[e->n_stacks++] = s;
    *s = (stack_src){.src = e->src, .E = E, .N = N, .K = K, .n_pieces = n_pieces, .stacked = stacked, .t = s->t,
                     .pool = e->pool};
    const int64_t n = N / n_pieces;
    if (stacked && e->src->fill)
        return og_set_error(OG_ERR_UNSUPPORTED, "export: %s: stacked expert tensors from this source", name);
    for (int64_t i = 0; i < n_t; i++) {
        char tn[192];
        if (stacked) snprintf(tn, sizeof tn, "%s", pieces[i]);
        else snprintf(tn, sizeof tn, pieces[i % n_pieces], (int)(i / n_pieces));
        OG_TRY(find_shaped(e, tn, stacked ? E : n, stacked ? n : K, stacked ? K : 0, &s->t[i]));
    }
    /* q8 / q4 stacks (as --weights asks, or as a GGUF file stores them);
     * k-quant weights and mixes leave the experts in the program's dtype
     * (the moe kernels take q8 and q4 stacks) */
    og_dtype dt = e->dtype;
    if (e->mix == OG_MIX_AS_STORED) {
        og_st_tensor view;
        const og_dtype st = stack_piece(s, 0, 0, &view)->dtype;
        if (st == OG_DTYPE_Q8 || st == OG_DTYPE_Q4) dt = st;
    } else if (e->mix == OG_MIX_NONE && (e->weights == OG_DTYPE_Q8 || e->weights == OG_DTYPE_Q4) &&
               K % OG_QUANT_GROUP == 0) {
        dt = e->weights;
    }
    if (og_dtype_is_quantized(e->weights) && !og_dtype_is_quantized(dt)) e->n_unquantized++;
    e->matrix_dtypes |= 1u << dt;
    s->dst = dt;
    const int64_t shape[3] = {E, N, K};
    og_status rc = og_program_writer_add_weight(e->w, name, dt, 3, shape, fill_stack, s);
    if (rc != OG_OK) return writer_error(e, rc);
    snprintf(s->name, sizeof s->name, "%s", name);
    int64_t bytes = 0;
    og_tensor_bytes(dt, 3, shape, &bytes);
    e->n_params += E * N * K;
    e->weight_bytes += (uint64_t)bytes;
    return OG_OK;
}

/* The experts and router of sparse layer i (prefix p), x its normed input. */
static og_status lower_moe(exporter *e, int32_t i, const char *p, const char *x, const char *out) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size, F = c->moe_intermediate_size, E = c->num_experts;
    const int64_t S = c->shared_expert_intermediate_size;
    char w[192], router[64], gu[192], dn[192], sh[64], sg[64];
    og_status rc;
    char shg[64], shu[64], sha[64];
    if (S > 0 && ((rc = linear(e, x, NAME(w, "%s.mlp.shared_expert.gate_proj", p), S, H, false, NAME(shg, "l%d.shared_gate_proj", i))) ||
                  (rc = linear(e, x, NAME(w, "%s.mlp.shared_expert.up_proj", p), S, H, false, NAME(shu, "l%d.shared_up", i))) ||
                  (rc = instr(e, OG_OP_SWIGLU, NAME(sha, "l%d.shared_act", i), NULL, IN(shg, shu))) ||
                  (rc = linear(e, sha, NAME(w, "%s.mlp.shared_expert.down_proj", p), H, S, false, NAME(sh, "l%d.shared", i))) ||
                  (rc = add_weight(e, NAME(w, "%s.mlp.shared_expert_gate.weight", p), 2, 1, H)) ||
                  (rc = instr(e, OG_OP_MATMUL, NAME(sg, "l%d.shared_gate", i), NULL, IN(x, w)))))
        return rc;
    if ((rc = add_weight(e, NAME(w, "%s.mlp.gate.weight", p), 2, E, H)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME(router, "l%d.router", i), NULL, IN(x, w))))
        return rc;
    NAME(gu, "%s.mlp.experts.gate_up_proj", p);
    NAME(dn, "%s.mlp.experts.down_proj", p);
    if (e->src->find(e->src->ctx, gu)) {
        const char *g1[1] = {gu}, *d1[1] = {dn};
        rc = add_stack(e, gu, E, 2 * F, H, true, 1, g1);
        if (rc == OG_OK) rc = add_stack(e, dn, E, H, F, true, 1, d1);
    } else {
        char pg[160], pu[160], pd[160];
        snprintf(pg, sizeof pg, "%s.mlp.experts.%%d.gate_proj.weight", p);
        snprintf(pu, sizeof pu, "%s.mlp.experts.%%d.up_proj.weight", p);
        snprintf(pd, sizeof pd, "%s.mlp.experts.%%d.down_proj.weight", p);
        if (!e->src->find(e->src->ctx, NAME(w, pg, 0)))
            return og_set_error(OG_ERR_FORMAT, "checkpoint %s: layer %d has neither \"%s\" nor \"%s\" (experts fused or one "
                                "tensor per expert)", e->src->origin, i, gu, w);
        const char *g2[2] = {pg, pu}, *d1[1] = {pd};
        rc = add_stack(e, gu, E, 2 * F, H, false, 2, g2);
        if (rc == OG_OK) rc = add_stack(e, dn, E, H, F, false, 1, d1);
    }
    if (rc != OG_OK) return rc;
    og_op_attrs ma = {.top_k = c->num_experts_per_tok, .norm_topk_prob = c->norm_topk_prob};
    return S > 0 ? instr(e, OG_OP_MOE, out, &ma, IN(x, router, gu, dn, sh, sg))
                 : instr(e, OG_OP_MOE, out, &ma, IN(x, router, gu, dn));
}

/* Layer i's MLP of x (its normed input) into out: dense or experts. */
static og_status lower_mlp(exporter *e, int32_t i, const char *p, const char *x, const char *out) {
    const og_hf_config *c = e->cfg;
    if (c->num_experts > 0 && c->layer_moe[i]) return lower_moe(e, i, p, x, out);
    const int64_t H = c->hidden_size, F = c->intermediate_size;
    char w[160], g[64], u[64], act[64];
    og_status rc;
    if ((rc = linear(e, x, NAME(w, "%s.mlp.gate_proj", p), F, H, c->mlp_bias, NAME(g, "l%d.gate", i))) ||
        (rc = linear(e, x, NAME(w, "%s.mlp.up_proj", p), F, H, c->mlp_bias, NAME(u, "l%d.up", i))) ||
        (rc = instr(e, OG_OP_SWIGLU, NAME(act, "l%d.act", i), NULL, IN(g, u))))
        return rc;
    return linear(e, act, NAME(w, "%s.mlp.down_proj", p), H, F, c->mlp_bias, out);
}

static og_status lower_layer(exporter *e, int32_t i, const char *x, char *out, size_t out_cap) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size, D = c->head_dim;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    char p[48], w[160], an[64], q[64], k[64], v[64], qr[64], kr[64], at[64], o[64], h[64], mn[64], dn[64], kc[48],
        vc[48];
    og_status rc;
    snprintf(p, sizeof p, "%slayers.%d", e->prefix, i);
    og_op_attrs norm = {.eps = c->rms_norm_eps};
    if ((rc = add_weight(e, NAME(w, "%s.input_layernorm.weight", p), 1, H, 0)) ||
        (rc = instr(e, OG_OP_RMS_NORM, NAME(an, "l%d.attn_norm", i), &norm, IN(x, w))) ||
        (rc = linear(e, an, NAME(w, "%s.self_attn.q_proj", p), Hq * D, H, c->qkv_bias, NAME(q, "l%d.q", i))) ||
        (rc = linear(e, an, NAME(w, "%s.self_attn.k_proj", p), Hkv * D, H, c->qkv_bias, NAME(k, "l%d.k", i))) ||
        (rc = linear(e, an, NAME(w, "%s.self_attn.v_proj", p), Hkv * D, H, c->qkv_bias, NAME(v, "l%d.v", i))))
        return rc;
    if (c->qk_norm) {
        og_op_attrs qa = {.eps = c->rms_norm_eps, .heads = Hq}, ka = {.eps = c->rms_norm_eps, .heads = Hkv};
        char qn[64], kn[64];
        if ((rc = add_weight(e, NAME(w, "%s.self_attn.q_norm.weight", p), 1, D, 0)) ||
            (rc = instr(e, OG_OP_HEAD_RMS_NORM, NAME(qn, "l%d.q_norm", i), &qa, IN(q, w))) ||
            (rc = add_weight(e, NAME(w, "%s.self_attn.k_norm.weight", p), 1, D, 0)) ||
            (rc = instr(e, OG_OP_HEAD_RMS_NORM, NAME(kn, "l%d.k_norm", i), &ka, IN(k, w))))
            return rc;
        memcpy(q, qn, sizeof q);
        memcpy(k, kn, sizeof k);
    }
    og_op_attrs rope = {.head_dim = D,
                        .theta = c->rope.theta,
                        .rope_type = c->rope.type,
                        .factor = c->rope.factor,
                        .low_freq_factor = c->rope.low_freq_factor,
                        .high_freq_factor = c->rope.high_freq_factor,
                        .original_max_position_embeddings = c->rope.original_max_position_embeddings};
    og_op_attrs rq = rope, rk = rope;
    rq.heads = Hq;
    rk.heads = Hkv;
    og_op_attrs attn = {.layer_id = i, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .scale = 0.0};
    if ((rc = instr(e, OG_OP_ROPE, NAME(qr, "l%d.q_rope", i), &rq, IN(q, "positions"))) ||
        (rc = instr(e, OG_OP_ROPE, NAME(kr, "l%d.k_rope", i), &rk, IN(k, "positions"))) ||
        (rc = instr(e, OG_OP_UPDATE_AND_ATTEND, NAME(at, "l%d.attn", i), &attn,
                    IN(qr, kr, v, "positions", NAME(kc, "kv.%d.k", i), NAME(vc, "kv.%d.v", i)))) ||
        (rc = linear(e, at, NAME(w, "%s.self_attn.o_proj", p), H, Hq * D, c->o_bias, NAME(o, "l%d.attn_out", i))) ||
        (rc = instr(e, OG_OP_ADD, NAME(h, "l%d.resid", i), NULL, IN(x, o))) ||
        (rc = add_weight(e, NAME(w, "%s.post_attention_layernorm.weight", p), 1, H, 0)) ||
        (rc = instr(e, OG_OP_RMS_NORM, NAME(mn, "l%d.mlp_norm", i), &norm, IN(h, w))) ||
        (rc = lower_mlp(e, i, p, mn, NAME(dn, "l%d.mlp_out", i))))
        return rc;
    snprintf(out, out_cap, "l%d.out", i);
    return instr(e, OG_OP_ADD, out, NULL, IN(h, dn));
}

/* ---- hybrid families (qwen3_5) ----
 * Norms scale by (1 + w): their weights are stored as f32 values 1 + w (what
 * transformers computes in f32 before the product, bf16 checkpoints
 * included), so rms_norm and head_rms_norm run them as they are. The gated
 * attention's q_proj holds, per head, the D query rows and then the D rows
 * of its output gate: they become two matrices. Partial RoPE rotates pairs
 * (i, i + rd/2) of each head's first rd dims; the rope op rotates pairs (i,
 * i + D/2), so the query and key rows (and their norm weights) are stored
 * with each head's dims permuted to put pair (i, i + rd/2) on (i, i + D/2),
 * the rest pairing up as rotations by angle 0 (rotary_dim: zero inverse
 * frequencies past rd/2). Scores q.k are sums over the dims and do not
 * change when both sides are permuted alike; values are not permuted. */

/* The rope op's largest head dim (kernels/ops.h OG_ROPE_MAX_HEAD_DIM). */
#define ROPE_MAX_HEAD_DIM 1024

/* perm [D]: the dim stored at each position of a permuted head. */
static void rope_perm(int64_t D, int64_t rd, int64_t *perm) {
    for (int64_t i = 0; i < rd / 2; i++) {
        perm[i] = i;
        perm[D / 2 + i] = rd / 2 + i;
    }
    for (int64_t j = 0; j < (D - rd) / 2; j++) {
        perm[rd / 2 + j] = rd + 2 * j;
        perm[D / 2 + rd / 2 + j] = rd + 2 * j + 1;
    }
}

/* Rows [heads * D] of a derived tensor: head h's position p takes source
 * row h * stride + offset + perm[p] (perm NULL: p). Owned by the caller. */
static int64_t *head_rows(int64_t heads, int64_t D, int64_t stride, int64_t offset, const int64_t *perm) {
    int64_t *r = og_malloc((size_t)(heads * D) * sizeof *r);
    if (!r) return NULL;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t p = 0; p < D; p++) r[h * D + p] = h * stride + offset + (perm ? perm[p] : p);
    return r;
}

/* A derived matrix [n, k] (quantized like the others when its rows are
 * whole groups) of rows of checkpoint tensor src [src_n, k]; rows owned. */
static og_status add_rows_matrix(exporter *e, const char *name, const char *src, int64_t src_n, int64_t k,
                                 int64_t *rows, int64_t n) {
    const int64_t want[2] = {src_n, k}, shape[2] = {n, k};
    const og_st_tensor *t;
    og_status rc = rows ? find_checked(e, src, 2, want, &t) : og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    if (rc != OG_OK) {
        og_free(rows);
        return rc;
    }
    return add_from(e, name, t, 2, shape, matrix_dtype(e, src, k), rows, false);
}

/* A (1 + w) norm weight [n] of checkpoint tensor src, as f32 1 + w; its
 * positions permuted per head of D when perm is set. */
static og_status add_norm_plus_one(exporter *e, const char *name, const char *src, int64_t n, const int64_t *perm) {
    const int64_t want[1] = {n};
    const og_st_tensor *t;
    OG_TRY(find_checked(e, src, 1, want, &t));
    int64_t *rows = perm ? head_rows(1, n, n, 0, perm) : NULL;
    if (perm && !rows) return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    return add_from(e, name, t, 1, want, OG_DTYPE_F32, rows, true);
}

/* A norm of x by `<p>.<norm>.weight` in the family's form, into out. */
static og_status norm_of(exporter *e, const char *x, const char *p, const char *norm, int64_t n, const char *out) {
    char src[160], w[176];
    og_op_attrs na = {.eps = e->cfg->rms_norm_eps};
    snprintf(src, sizeof src, "%s.%s.weight", p, norm);
    if (e->cfg->norm_plus_one) {
        snprintf(w, sizeof w, "%s.plus1", src);
        OG_TRY(add_norm_plus_one(e, w, src, n, NULL));
    } else {
        snprintf(w, sizeof w, "%s", src);
        OG_TRY(add_weight(e, w, 1, n, 0));
    }
    return instr(e, OG_OP_RMS_NORM, out, &na, IN(x, w));
}

/* The gated full-attention token mixer of hybrid layer i: an (its normed
 * input) -> out. */
static og_status lower_gated_attention(exporter *e, int32_t i, const char *p, const char *an, const char *out) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size, D = c->head_dim, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const int64_t rd = c->rotary_dim;
    char src[160], w[176], q[48], g[48], k[48], v[48], qn[48], kn[48], qr[48], kr[48], at[48], ag[48], kc[32], vc[32];
    int64_t perm[ROPE_MAX_HEAD_DIM];
    if (D > ROPE_MAX_HEAD_DIM)
        return og_set_error(OG_ERR_UNSUPPORTED, "export: head_dim %lld is over the rope op's %d", (long long)D,
                            ROPE_MAX_HEAD_DIM);
    rope_perm(D, rd, perm);
    const int64_t *pm = rd < D ? perm : NULL;
    og_status rc;
    /* q_proj [Hq * 2D, H]: per head D query rows, then D gate rows */
    snprintf(src, sizeof src, "%s.self_attn.q_proj.weight", p);
    if ((rc = add_rows_matrix(e, NAME(w, "%s.query", src), src, Hq * 2 * D, H, head_rows(Hq, D, 2 * D, 0, pm), Hq * D)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME(q, "l%d.q", i), NULL, IN(an, w))) ||
        (rc = add_rows_matrix(e, NAME(w, "%s.gate", src), src, Hq * 2 * D, H, head_rows(Hq, D, 2 * D, D, NULL), Hq * D)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME(g, "l%d.gate_attn", i), NULL, IN(an, w))))
        return rc;
    snprintf(src, sizeof src, "%s.self_attn.k_proj.weight", p);
    if ((rc = add_rows_matrix(e, NAME(w, "%s.rope_perm", src), src, Hkv * D, H, head_rows(Hkv, D, D, 0, pm), Hkv * D)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME(k, "l%d.k", i), NULL, IN(an, w))) ||
        (rc = linear(e, an, NAME(w, "%s.self_attn.v_proj", p), Hkv * D, H, false, NAME(v, "l%d.v", i))))
        return rc;
    og_op_attrs qa = {.eps = c->rms_norm_eps, .heads = Hq}, ka = {.eps = c->rms_norm_eps, .heads = Hkv};
    snprintf(src, sizeof src, "%s.self_attn.q_norm.weight", p);
    if ((rc = add_norm_plus_one(e, NAME(w, "%s.plus1", src), src, D, pm)) ||
        (rc = instr(e, OG_OP_HEAD_RMS_NORM, NAME(qn, "l%d.q_norm", i), &qa, IN(q, w))))
        return rc;
    snprintf(src, sizeof src, "%s.self_attn.k_norm.weight", p);
    if ((rc = add_norm_plus_one(e, NAME(w, "%s.plus1", src), src, D, pm)) ||
        (rc = instr(e, OG_OP_HEAD_RMS_NORM, NAME(kn, "l%d.k_norm", i), &ka, IN(k, w))))
        return rc;
    og_op_attrs rope = {.head_dim = D,
                        .theta = c->rope.theta,
                        .rope_type = c->rope.type,
                        .factor = c->rope.factor,
                        .low_freq_factor = c->rope.low_freq_factor,
                        .high_freq_factor = c->rope.high_freq_factor,
                        .original_max_position_embeddings = c->rope.original_max_position_embeddings,
                        .rotary_dim = rd < D ? rd : 0};
    og_op_attrs rq = rope, rk = rope;
    rq.heads = Hq;
    rk.heads = Hkv;
    og_op_attrs attn = {.layer_id = i, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .scale = 0.0};
    if ((rc = instr(e, OG_OP_ROPE, NAME(qr, "l%d.q_rope", i), &rq, IN(qn, "positions"))) ||
        (rc = instr(e, OG_OP_ROPE, NAME(kr, "l%d.k_rope", i), &rk, IN(kn, "positions"))) ||
        (rc = instr(e, OG_OP_UPDATE_AND_ATTEND, NAME(at, "l%d.attn", i), &attn,
                    IN(qr, kr, v, "positions", NAME(kc, "kv.%d.k", i), NAME(vc, "kv.%d.v", i)))) ||
        (rc = instr(e, OG_OP_SIGMOID_MUL, NAME(ag, "l%d.attn_gated", i), NULL, IN(at, g))))
        return rc;
    return linear(e, ag, NAME(w, "%s.self_attn.o_proj", p), H, Hq * D, false, out);
}

/* Qwen3-Next's fused projections as Qwen3.5's four: in_proj_qkvz holds,
 * per key head g (r = Hv / Hk value heads each), q_g [Dk], k_g [Dk], the v
 * of its r value heads [r Dv] and their z [r Dv]; in_proj_ba, per key head,
 * the b of its r value heads, then their a. Their rows are gathered into
 * in_proj_qkv (every q, every k, every v), in_proj_z, in_proj_b and
 * in_proj_a; outputs named into qkv, z, b, a [48] each. */
static og_status fused_projections(exporter *e, int32_t i, const char *p, const char *an, char *qkv, char *z, char *b,
                                   char *a) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size, Hk = c->linear_k_heads, Hv = c->linear_v_heads, Dk = c->linear_k_head_dim,
                  Dv = c->linear_v_head_dim, r = Hv / Hk, C = 2 * Hk * Dk + Hv * Dv;
    const int64_t gw = 2 * Dk + 2 * r * Dv, n_qkvz = Hk * gw;
    char src[176], w[192];
    int64_t *rq = og_malloc((size_t)C * sizeof *rq), *rz = og_malloc((size_t)(Hv * Dv) * sizeof *rz);
    int64_t *rb = og_malloc((size_t)Hv * sizeof *rb), *ra = og_malloc((size_t)Hv * sizeof *ra);
    if (!rq || !rz || !rb || !ra) {
        og_free(rq), og_free(rz), og_free(rb), og_free(ra);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    int64_t n = 0;
    for (int64_t g = 0; g < Hk; g++)
        for (int64_t j = 0; j < Dk; j++) rq[n++] = g * gw + j; /* q */
    for (int64_t g = 0; g < Hk; g++)
        for (int64_t j = 0; j < Dk; j++) rq[n++] = g * gw + Dk + j; /* k */
    for (int64_t g = 0; g < Hk; g++)
        for (int64_t j = 0; j < r * Dv; j++) rq[n++] = g * gw + 2 * Dk + j; /* v */
    for (int64_t g = 0, m = 0; g < Hk; g++)
        for (int64_t j = 0; j < r * Dv; j++) rz[m++] = g * gw + 2 * Dk + r * Dv + j; /* z */
    for (int64_t g = 0; g < Hk; g++)
        for (int64_t j = 0; j < r; j++) {
            rb[g * r + j] = g * 2 * r + j;
            ra[g * r + j] = g * 2 * r + r + j;
        }
    og_status rc;
    snprintf(src, sizeof src, "%s.linear_attn.in_proj_qkvz.weight", p);
    if ((rc = add_rows_matrix(e, NAME(w, "%s.qkv", src), src, n_qkvz, H, rq, C)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME48(qkv, "l%d.qkv", i), NULL, IN(an, w)))) {
        og_free(rz), og_free(rb), og_free(ra);
        return rc;
    }
    if ((rc = add_rows_matrix(e, NAME(w, "%s.z", src), src, n_qkvz, H, rz, Hv * Dv)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME48(z, "l%d.z", i), NULL, IN(an, w)))) {
        og_free(rb), og_free(ra);
        return rc;
    }
    snprintf(src, sizeof src, "%s.linear_attn.in_proj_ba.weight", p);
    if ((rc = add_rows_matrix(e, NAME(w, "%s.b", src), src, 2 * Hv, H, rb, Hv)) ||
        (rc = instr(e, OG_OP_MATMUL, NAME48(b, "l%d.b", i), NULL, IN(an, w)))) {
        og_free(ra);
        return rc;
    }
    if ((rc = add_rows_matrix(e, NAME(w, "%s.a", src), src, 2 * Hv, H, ra, Hv))) return rc;
    return instr(e, OG_OP_MATMUL, NAME48(a, "l%d.a", i), NULL, IN(an, w));
}

/* The Gated DeltaNet token mixer of hybrid layer i: an -> out. Qwen3.5
 * stores in_proj_qkv, in_proj_z, in_proj_b and in_proj_a; Qwen3-Next their
 * fused forms (fused_projections), unless its source split them
 * (og_hf_config.split_in_proj: a GGUF file). */
static og_status lower_linear_attention(exporter *e, int32_t i, const char *p, const char *an, const char *out) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size, Hk = c->linear_k_heads, Hv = c->linear_v_heads, Dk = c->linear_k_head_dim,
                  Dv = c->linear_v_head_dim, K = c->linear_conv_kernel, C = 2 * Hk * Dk + Hv * Dv;
    char w[176], qkv[48], z[48], b[48], a[48], cv[48], core[48], nrm[48], A[176], dt[176], sc[40], sr[40];
    og_status rc;
    if (c->family == OG_HF_QWEN3_NEXT && !c->split_in_proj)
        rc = fused_projections(e, i, p, an, qkv, z, b, a);
    else if (!(rc = linear(e, an, NAME(w, "%s.linear_attn.in_proj_qkv", p), C, H, false, NAME(qkv, "l%d.qkv", i))) &&
             !(rc = linear(e, an, NAME(w, "%s.linear_attn.in_proj_z", p), Hv * Dv, H, false, NAME(z, "l%d.z", i))) &&
             !(rc = linear(e, an, NAME(w, "%s.linear_attn.in_proj_b", p), Hv, H, false, NAME(b, "l%d.b", i))))
        rc = linear(e, an, NAME(w, "%s.linear_attn.in_proj_a", p), Hv, H, false, NAME(a, "l%d.a", i));
    if (rc != OG_OK) return rc;
    /* conv1d.weight [C, 1, K] as [C, K] */
    const int64_t cw[3] = {C, 1, K}, cs[2] = {C, K}, hv[1] = {Hv};
    const og_st_tensor *t;
    snprintf(w, sizeof w, "%s.linear_attn.conv1d.weight", p);
    og_op_attrs conv = {.layer_id = i};
    if ((rc = find_checked(e, w, 3, cw, &t)) || (rc = add_from(e, w, t, 2, cs, e->dtype, NULL, false)) ||
        (rc = instr(e, OG_OP_CAUSAL_CONV1D, NAME(cv, "l%d.conv", i), &conv, IN(qkv, w, NAME(sc, "state.%d.conv", i)))))
        return rc;
    /* A_log and dt_bias in f32, as transformers takes them */
    snprintf(A, sizeof A, "%s.linear_attn.A_log", p);
    snprintf(dt, sizeof dt, "%s.linear_attn.dt_bias", p);
    og_op_attrs ga = {.layer_id = i, .k_heads = Hk, .v_heads = Hv, .k_head_dim = Dk, .v_head_dim = Dv};
    og_op_attrs na = {.heads = Hv, .eps = c->rms_norm_eps};
    if ((rc = find_checked(e, A, 1, hv, &t)) || (rc = add_from(e, A, t, 1, hv, OG_DTYPE_F32, NULL, false)) ||
        (rc = find_checked(e, dt, 1, hv, &t)) || (rc = add_from(e, dt, t, 1, hv, OG_DTYPE_F32, NULL, false)) ||
        (rc = instr(e, OG_OP_GATED_DELTA_NET, NAME(core, "l%d.delta", i), &ga,
                    IN(cv, a, b, A, dt, NAME(sr, "state.%d.recurrent", i)))) ||
        (rc = add_weight(e, NAME(w, "%s.linear_attn.norm.weight", p), 1, Dv, 0)) ||
        (rc = instr(e, OG_OP_RMS_NORM_GATED, NAME(nrm, "l%d.delta_norm", i), &na, IN(core, z, w))))
        return rc;
    return linear(e, nrm, NAME(w, "%s.linear_attn.out_proj", p), H, Hv * Dv, false, out);
}

/* Hybrid layer i: (1 + w) norms around a Gated DeltaNet or gated attention
 * token mixer and the MLP. */
static og_status lower_hybrid_layer(exporter *e, int32_t i, const char *x, char *out, size_t out_cap) {
    const og_hf_config *c = e->cfg;
    const int64_t H = c->hidden_size;
    char p[64], an[48], mix[48], h[48], mn[48], dn[48];
    og_status rc;
    snprintf(p, sizeof p, "%slayers.%d", e->prefix, i);
    if ((rc = norm_of(e, x, p, "input_layernorm", H, NAME(an, "l%d.attn_norm", i))) ||
        (rc = c->layer_linear[i] ? lower_linear_attention(e, i, p, an, NAME(mix, "l%d.mix", i))
                                 : lower_gated_attention(e, i, p, an, NAME(mix, "l%d.mix", i))) ||
        (rc = instr(e, OG_OP_ADD, NAME(h, "l%d.resid", i), NULL, IN(x, mix))) ||
        (rc = norm_of(e, h, p, "post_attention_layernorm", H, NAME(mn, "l%d.mlp_norm", i))) ||
        (rc = lower_mlp(e, i, p, mn, NAME(dn, "l%d.mlp_out", i))))
        return rc;
    snprintf(out, out_cap, "l%d.out", i);
    return instr(e, OG_OP_ADD, out, NULL, IN(h, dn));
}

/* The KV manifest: ring for sliding layers whose window is shorter than
 * max_context, flat otherwise. layers[] has cfg->num_hidden_layers entries. */
static int32_t build_kv(const og_hf_config *c, const og_export_options *o, og_kv_layer_config *layers,
                        og_kv_state_config *states, og_kv_config *kv) {
    int32_t rings = 0, n = 0, ns = 0;
    for (int32_t i = 0; i < c->num_hidden_layers; i++) {
        if (og_hf_is_hybrid(c->family) && c->layer_linear[i]) {
            /* a Gated DeltaNet layer: its convolution's last K - 1 inputs and
             * the recurrent state of every value head */
            const int64_t C = 2 * (int64_t)c->linear_k_heads * c->linear_k_head_dim +
                              (int64_t)c->linear_v_heads * c->linear_v_head_dim;
            states[ns++] = (og_kv_state_config){.layer_id = i, .name = "conv", .dtype = OG_DTYPE_F32, .rank = 2,
                                                .shape = {c->linear_conv_kernel - 1, C}};
            states[ns++] = (og_kv_state_config){
                .layer_id = i, .name = "recurrent", .dtype = OG_DTYPE_F32, .rank = 3,
                .shape = {c->linear_v_heads, c->linear_k_head_dim, c->linear_v_head_dim}};
            continue;
        }
        bool ring = c->layer_sliding[i] && c->sliding_window < o->max_context;
        layers[n++] = (og_kv_layer_config){.layer_id = i,
                                           .policy = ring ? OG_KV_RING : OG_KV_FLAT,
                                           .window = ring ? c->sliding_window : 0,
                                           .n_kv_heads = c->num_key_value_heads,
                                           .head_dim = c->head_dim};
        rings += ring;
    }
    *kv = (og_kv_config){.version = OG_KV_MANIFEST_VERSION,
                         .kv_dtype = o->kv_dtype,
                         .max_capacity = o->max_context,
                         .initial_capacity = o->initial_capacity,
                         .max_write = o->max_write,
                         .n_model_layers = c->num_hidden_layers,
                         .n_layers = n,
                         .layers = layers,
                         .n_states = ns,
                         .states = ns ? states : NULL};
    return rings;
}

/* Fills defaults and checks the options against each other. */
/* The positions a config covers: max_position_embeddings, or with a rope
 * scaling the original context times its factor when that is more. */
static int64_t trained_context(const og_hf_config *c) {
    int64_t n = c->max_position_embeddings;
    if (c->rope.type != OG_ROPE_DEFAULT && c->rope.factor > 1) {
        int64_t orig = c->rope.original_max_position_embeddings > 0 ? c->rope.original_max_position_embeddings : n;
        double scaled = (double)orig * c->rope.factor;
        if (scaled > (double)n) n = scaled < (double)INT64_MAX / 2 ? (int64_t)scaled : INT64_MAX / 2;
    }
    return n;
}

static og_status resolve_options(const og_hf_config *c, const og_st_tensor *embed, og_export_options *o) {
    if (o->max_context < 0 || o->initial_capacity < 0 || o->max_write < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: max-context, initial-capacity and max-write must be positive");
    if (o->max_context == 0)
        o->max_context = c->max_position_embeddings < OG_EXPORT_DEFAULT_MAX_CONTEXT ? c->max_position_embeddings
                                                                                     : OG_EXPORT_DEFAULT_MAX_CONTEXT;
    const int64_t trained = trained_context(c);
    if (o->max_context > trained && o->check_max_context)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "export: max-context %lld exceeds the %lld positions the model was trained for "
                            "(config.json max_position_embeddings%s): RoPE positions it never saw give poor "
                            "output; --force-max-context exports anyway",
                            (long long)o->max_context, (long long)trained,
                            c->rope.type != OG_ROPE_DEFAULT ? ", with its rope scaling" : "");
    if (o->initial_capacity == 0)
        o->initial_capacity = o->max_context < OG_EXPORT_DEFAULT_INITIAL_CAPACITY ? o->max_context
                                                                                  : OG_EXPORT_DEFAULT_INITIAL_CAPACITY;
    if (o->max_write == 0)
        o->max_write = (int32_t)(o->max_context < OG_EXPORT_DEFAULT_MAX_WRITE ? o->max_context
                                                                              : OG_EXPORT_DEFAULT_MAX_WRITE);
    if (o->initial_capacity > o->max_context)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: initial-capacity %lld exceeds max-context %lld",
                            (long long)o->initial_capacity, (long long)o->max_context);
    if (o->max_write > o->max_context)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: max-write %d exceeds max-context %lld", o->max_write,
                            (long long)o->max_context);
    if (o->kv_dtype != OG_DTYPE_BF16 && o->kv_dtype != OG_DTYPE_F32 && o->kv_dtype != OG_DTYPE_INT8 &&
        o->kv_dtype != OG_DTYPE_FP8)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: kv-dtype %s is not bf16, f32, int8 or fp8",
                            og_dtype_name(o->kv_dtype));
    if (o->dtype == OG_DTYPE_COUNT && (o->weights == OG_DTYPE_BF16 || o->weights == OG_DTYPE_F32))
        o->dtype = o->weights; /* float weights name the program's dtype */
    if (o->dtype == OG_DTYPE_COUNT) {
        og_dtype src = c->has_dtype ? c->dtype : embed->dtype;
        if (og_dtype_is_quantized(src)) src = OG_DTYPE_BF16; /* GGUF q8_0 / q4_0 tables */
        o->dtype = src == OG_DTYPE_BF16 ? OG_DTYPE_BF16 : OG_DTYPE_F32;
    }
    if (o->dtype != OG_DTYPE_BF16 && o->dtype != OG_DTYPE_F32)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: dtype %s is not bf16 or f32", og_dtype_name(o->dtype));
    if (o->mix != OG_MIX_NONE && o->mix != OG_MIX_AS_STORED) o->weights = og_weight_mix_default(o->mix);
    if (o->weights == OG_DTYPE_COUNT) o->weights = o->dtype;
    if (o->weights != o->dtype && !og_dtype_is_quantized(o->weights))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: weights %s is not q8, q4, a k-quant or the dtype (%s)",
                            og_dtype_name(o->weights), og_dtype_name(o->dtype));
    return OG_OK;
}

/* Reads <dir>/<name> if it exists: *text NULL when absent. */
static og_status read_optional(const char *dir, const char *name, char **text) {
    char path[4096];
    *text = NULL;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return og_set_error(OG_ERR_IO, "export: path too long: %s/%s", dir, name);
    if (access(path, F_OK) != 0) return OG_OK;
    return og_read_text_file(path, text, NULL);
}

/* transformers 5 saves the chat template to chat_template.jinja beside
 * tokenizer_config.json; it is embedded as the config's "chat_template"
 * (a template already in the config wins). *cfg (may be NULL) is replaced. */
static og_status add_chat_template(const char *dir, char **cfg) {
    char *tpl = NULL;
    og_status rc = read_optional(dir, "chat_template.jinja", &tpl);
    if (rc != OG_OK || !tpl) return rc;
    cJSON *root = *cfg ? cJSON_Parse(*cfg) : cJSON_CreateObject();
    char *text = NULL;
    if (!cJSON_IsObject(root))
        rc = og_set_error(OG_ERR_FORMAT, "export: %s/tokenizer_config.json is not a JSON object", dir);
    else if (!cJSON_HasObjectItem(root, "chat_template") && !cJSON_AddStringToObject(root, "chat_template", tpl))
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    if (rc == OG_OK && !(text = cJSON_PrintUnformatted(root)))
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    if (rc == OG_OK) {
        og_free(*cfg);
        *cfg = og_strdup(text);
        if (!*cfg) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    cJSON_free(text);
    cJSON_Delete(root);
    og_free(tpl);
    return rc;
}

static og_status lower(exporter *e, const og_export_options *o, og_export_summary *sum) {
    const og_hf_config *c = e->cfg;
    og_status rc;
    og_kv_layer_config *layers = og_calloc((size_t)c->num_hidden_layers, sizeof *layers);
    og_kv_state_config *states = og_calloc(2 * (size_t)c->num_hidden_layers, sizeof *states);
    if (!layers || !states) {
        og_free(layers);
        og_free(states);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    og_kv_config kv;
    sum->n_ring_layers = build_kv(c, o, layers, states, &kv);
    sum->n_state_layers = kv.n_states / 2;
    og_program_model m = {.activation_dtype = o->dtype,
                          .vocab_size = c->vocab_size,
                          .hidden_size = c->hidden_size,
                          .intermediate_size = c->intermediate_size,
                          .num_hidden_layers = c->num_hidden_layers,
                          .num_attention_heads = c->num_attention_heads,
                          .num_key_value_heads = c->num_key_value_heads,
                          .head_dim = c->head_dim,
                          .rms_norm_eps = c->rms_norm_eps,
                          .tie_word_embeddings = c->tie_word_embeddings,
                          .rope = {.theta = c->rope.theta,
                                   .type = c->rope.type,
                                   .factor = c->rope.factor,
                                   .low_freq_factor = c->rope.low_freq_factor,
                                   .high_freq_factor = c->rope.high_freq_factor,
                                   .original_max_position_embeddings = c->rope.original_max_position_embeddings}};
    snprintf(m.family, sizeof m.family, "%s", og_hf_family_name(c->family));
    cJSON *extra = cJSON_CreateObject();
    if (extra) {
        cJSON_AddNumberToObject(extra, "max_position_embeddings", (double)c->max_position_embeddings);
        cJSON_AddNumberToObject(extra, "sliding_window", c->sliding_window);
        if (c->num_experts > 0) { /* for inspect and the benchmarks: the moe instructions carry what runs */
            cJSON_AddNumberToObject(extra, "num_experts", c->num_experts);
            cJSON_AddNumberToObject(extra, "num_experts_per_tok", c->num_experts_per_tok);
            cJSON_AddNumberToObject(extra, "moe_intermediate_size", (double)c->moe_intermediate_size);
            cJSON_AddNumberToObject(extra, "moe_layers", c->n_moe_layers);
        }
        if (c->n_vision_tokens > 0) { /* og_model_step refuses them by name */
            cJSON *ids = cJSON_AddArrayToObject(extra, "refused_token_ids");
            for (int32_t i = 0; ids && i < c->n_vision_tokens; i++)
                cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)c->vision_tokens[i]));
            cJSON_AddStringToObject(extra, "refused_tokens_reason",
                                    "vision inputs: the checkpoint's image and video placeholders (this program is its "
                                    "text model)");
        }
        if (!e->src->tokenizer_json && e->src->no_tokenizer)
            cJSON_AddStringToObject(extra, "no_tokenizer", e->src->no_tokenizer);
    }
    rc = og_program_writer_set_model(e->w, &m, extra);
    if (rc == OG_OK) rc = og_program_writer_set_kv(e->w, &kv);
    if (rc == OG_OK) rc = og_program_writer_add_kv_runtime(e->w);
    og_free(layers);
    og_free(states);
    if (rc != OG_OK) return writer_error(e, rc);

    const int64_t V = c->vocab_size, H = c->hidden_size;
    char x[64] = "embed", embed[96], model[64];
    snprintf(embed, sizeof embed, "%sembed_tokens.weight", e->prefix);
    snprintf(model, sizeof model, "%.*s", (int)strlen(e->prefix) - 1, e->prefix); /* without the final dot */
    if ((rc = add_matrix(e, embed, V, H, NULL)) || (rc = instr(e, OG_OP_EMBED, x, NULL, IN("tokens", embed))))
        return rc;
    for (int32_t i = 0; i < c->num_hidden_layers; i++) {
        char next[64];
        if ((rc = og_hf_is_hybrid(c->family) ? lower_hybrid_layer(e, i, x, next, sizeof next)
                                             : lower_layer(e, i, x, next, sizeof next)))
            return rc;
        memcpy(x, next, sizeof x);
    }
    const char *head = c->tie_word_embeddings ? embed : "lm_head.weight";
    if ((rc = norm_of(e, x, model, "norm", H, "final_norm")) ||
        (!c->tie_word_embeddings && (rc = add_matrix(e, head, V, H, NULL))) ||
        (rc = instr(e, OG_OP_MATMUL, "logits", NULL, IN("final_norm", head))))
        return rc;

    if (e->src->tokenizer_json) {
        rc = og_program_writer_set_tokenizer(e->w, e->src->tokenizer_json, e->src->tokenizer_config);
        if (rc != OG_OK) return writer_error(e, rc);
    }
    sum->has_tokenizer = e->src->tokenizer_json != NULL;
    rc = og_program_writer_finish(e->w, o->progress, o->progress_ctx);
    return rc == OG_OK ? OG_OK : writer_error(e, rc);
}

og_status og_export_program(const og_hf_config *cfg, const og_export_source *src, const char *out_path,
                            const og_export_options *opts, og_export_summary *summary) {
    if (!cfg || !src || !src->find || !out_path) return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: NULL argument");
    og_export_options o;
    if (opts) o = *opts;
    else og_export_default_options(&o);
    exporter e = {.cfg = cfg, .src = src, .prefix = "model."};
    og_export_summary sum = {0};
    og_status rc = OG_OK;
    const og_st_tensor *embed = src->find(src->ctx, "model.embed_tokens.weight");
    if (!embed && og_hf_is_hybrid(cfg->family)) {
        /* a vision + text checkpoint keeps the text model's tensors there */
        embed = src->find(src->ctx, "model.language_model.embed_tokens.weight");
        if (embed) e.prefix = "model.language_model.";
    }
    if (!embed)
        rc = og_set_error(OG_ERR_FORMAT, "checkpoint %s: tensor \"model.embed_tokens.weight\" is missing",
                          src->origin);
    if (rc == OG_OK) rc = resolve_options(cfg, embed, &o);
    if (rc == OG_OK) {
        /* embed, final norm, lm_head, and per layer: 2 norms, 7 matrices,
         * up to 3 q/k/v + 1 o + 3 mlp biases, 2 q/k norms */
        e.cap_srcs = 3 + cfg->num_hidden_layers * 24;
        e.srcs = og_calloc((size_t)e.cap_srcs, sizeof *e.srcs);
        e.cap_stacks = 2 * cfg->num_hidden_layers;
        e.stacks = og_calloc((size_t)e.cap_stacks, sizeof *e.stacks);
        if (!e.stacks) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
        e.dtype = o.dtype;
        e.weights = o.weights;
        e.mix = o.mix;
        if (!e.srcs) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
        /* quantizing is the slow part of a q8 / q4 export (~70 M weights a
         * second a core): every CPU takes rows of each tensor. Without
         * threads the calling one quantizes alone. */
        if (rc == OG_OK && og_dtype_is_quantized(o.weights)) e.pool = og_threadpool_create(0);
    }
    if (rc == OG_OK) { /* a temp file left by a killed export of the same target goes */
        char tmp[4096];
        if (snprintf(tmp, sizeof tmp, "%s" OG_EXPORT_TEMP_SUFFIX, out_path) < (int)sizeof tmp) unlink(tmp);
    }
    if (rc == OG_OK) rc = og_program_writer_create(out_path, &e.w);
    if (rc == OG_OK) rc = lower(&e, &o, &sum);
    if (rc == OG_OK && summary) {
        sum.family = cfg->family;
        sum.n_layers = cfg->num_hidden_layers;
        sum.n_params = e.n_params;
        sum.weight_bytes = e.weight_bytes;
        sum.dtype = o.dtype;
        sum.kv_dtype = o.kv_dtype;
        sum.weights = o.weights;
        sum.n_unquantized = e.n_unquantized;
        sum.n_fallback = e.n_fallback;
        sum.matrix_dtypes = e.matrix_dtypes;
        sum.mix = o.mix;
        sum.max_context = o.max_context;
        sum.initial_capacity = o.initial_capacity;
        sum.max_write = o.max_write;
        sum.trained_context = trained_context(cfg);
        *summary = sum;
    }
    og_program_writer_destroy(e.w);
    for (int32_t i = 0; i < e.n_srcs; i++) og_free(e.srcs[i].rows);
    og_threadpool_destroy(e.pool);
    og_free(e.srcs);
    for (int32_t i = 0; i < e.n_stacks; i++) stack_free(e.stacks[i]);
    og_free(e.stacks);
    return rc;
}

static const og_st_tensor *find_st(void *ctx, const char *name) { return og_safetensors_find(ctx, name); }

og_status og_export_hf(const char *hf_dir, const char *out_path, const og_export_options *opts,
                       og_export_summary *summary) {
    if (!hf_dir || !out_path) return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: NULL path");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", hf_dir) >= (int)sizeof path)
        return og_set_error(OG_ERR_IO, "export: path too long: %s", hf_dir);
    og_hf_config *cfg = og_malloc(sizeof *cfg);
    if (!cfg) return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    og_safetensors *st = NULL;
    char *tok = NULL, *tok_cfg = NULL;
    og_status rc = og_hf_config_load(path, cfg);
    if (rc == OG_OK) rc = og_safetensors_open_dir(hf_dir, &st);
    if (rc == OG_OK && (rc = read_optional(hf_dir, "tokenizer.json", &tok)) == OG_OK &&
        (rc = read_optional(hf_dir, "tokenizer_config.json", &tok_cfg)) == OG_OK)
        rc = add_chat_template(hf_dir, &tok_cfg);
    if (rc == OG_OK) {
        og_export_source src = {.find = find_st,
                                .ctx = st,
                                .origin = hf_dir,
                                .config_name = "config.json",
                                .tokenizer_json = tok,
                                .tokenizer_config = tok ? tok_cfg : NULL};
        rc = og_export_program(cfg, &src, out_path, opts, summary);
    }
    if (rc == OG_OK && summary) { /* what a text model does not run: multi-token prediction, vision */
        for (int64_t i = 0; i < og_safetensors_count(st); i++) {
            const char *n = og_safetensors_at(st, i)->name;
            summary->n_skipped += !strncmp(n, "mtp.", 4) || !strncmp(n, "model.visual.", 13);
        }
    }
    og_free(tok);
    og_free(tok_cfg);
    og_safetensors_close(st);
    og_free(cfg);
    return rc;
}
