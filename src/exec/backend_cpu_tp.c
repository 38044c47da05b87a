/* The CPU back end with the model cut into N shards (og_model_params.
 * tensor_parallel > 1): the shards of a tensor-parallel run, in one process,
 * with an in-memory all-reduce. It exists so that the sharding logic
 * (exec/shard.h: which heads, columns, experts and vocabulary rows each shard
 * holds, where partial sums are reduced and split values gathered) is
 * checked on any machine against the unsharded model.
 *
 * Each instruction runs once per shard on that shard's operands and weight
 * slices (a REPLICATED one once: every shard would compute the same bits);
 * shards run one after another, so the result is the one N devices give,
 * with the partial sums added in shard order (shard 0 first). Values live in
 * buffers of the step made when an instruction writes them and freed after
 * their last reader: FULL values one [rows, W] buffer, SPLIT and PARTIAL ones
 * a buffer per shard.
 *
 * Sessions are the CPU back end's: one storage per session in the
 * program's layout; a shard's update_and_attend reads and writes its kv
 * heads' part of every row (a view whose rows keep the full stride), its
 * gated delta rule its value heads' part of the state, its convolution its
 * channels of the state (copied out and back). So a session does not depend
 * on the shard count: fork, save, restore and the prefix cache are
 * unchanged. In int8 / fp8 storage a row's per-head scales follow all of
 * its heads' quants: a shard's view points at its heads' quants and names
 * them as a part of the row (og_attend_args.kv_part), so each head's scale
 * stays where the unsharded model keeps it, and the shard holding the last
 * head writes the row's padding.
 *
 * What it does not do: fuse products (every product is its own call, which
 * the CPU back end's fused runs equal bit for bit), or run shards in
 * parallel threads (the kernels use the model's thread pool instead). */
#include "exec/exec.h"
#include "exec/shard.h"

#include "kernels/attend.h"
#include "kernels/gdn.h"
#include "kernels/moe.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tp_model {
    og_shard_plan *plan;
    int32_t *last_use; /* [n_instrs]: last instruction reading each value, -1 none */
    bool bf16_prefill;
    /* OG_TEST_TP_FAULT=<shard>:<step> (tests/test_tensor_parallel.c): the
     * step-th step of the model (from 1) fails on that shard at the last op on
     * per-session storage, after the shards before it ran it */
    int32_t fault_shard;
    long long fault_step; /* sscanf's %lld */
    atomic_llong steps;
} tp_model;

struct og_step_ctx {
    int32_t *tokens, *positions; /* [rows] */
    float *logits;               /* [tail rows, V] */
    int64_t rows_cap, logits_cap;
    /* per value: FULL buffer, or one per shard */
    float **full;                /* [n_instrs] */
    float **part;                /* [n_instrs * N] */
};

static tp_model *tm_of(const og_model *m) { return m->be; }

/* ------------------------------------------------------------ model */

static void tp_model_free(og_model *m) {
    tp_model *tm = m->be;
    if (!tm) return;
    og_shard_plan_destroy(tm->plan);
    og_free(tm->last_use);
    og_free(tm);
    m->be = NULL;
}

static og_status tp_model_init(og_model *m, const og_model_params *p) {
    tp_model *tm = og_calloc(1, sizeof *tm);
    if (!tm) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    m->be = tm;
    OG_TRY(og_cpu_start_pool(m, p->n_threads));
    OG_TRY(og_shard_plan_create(m->prog, m->logits_instr, p->tensor_parallel, &tm->plan));
    tm->last_use = og_malloc((size_t)m->n_instrs * sizeof *tm->last_use);
    if (!tm->last_use) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    for (int32_t i = 0; i < m->n_instrs; i++) tm->last_use[i] = -1;
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        for (int32_t j = 0; j < in->n_in; j++)
            if (in->in[j].kind == OG_VALUE_ACTIVATION) tm->last_use[in->in[j].index] = i;
    }
    tm->bf16_prefill = og_program_get_model(m->prog)->activation_dtype == OG_DTYPE_BF16;
    const char *fault = getenv("OG_TEST_TP_FAULT");
    tm->fault_shard = -1;
    if (fault && sscanf(fault, "%d:%lld", &tm->fault_shard, &tm->fault_step) != 2) tm->fault_shard = -1;
    return OG_OK;
}

/* ------------------------------------------------------------ sessions, contexts */

static og_status tp_session_init(og_session *s) { return og_kv_session_create(&s->cfg, s->kv_alloc, &s->kv); }
static void tp_session_free(og_session *s) { (void)s; }

static void drop_value(og_model *m, og_step_ctx *c, int32_t v) {
    const int32_t N = tm_of(m)->plan->n_shards;
    og_free(c->full[v]);
    c->full[v] = NULL;
    for (int32_t s = 0; s < N; s++) {
        og_free(c->part[(size_t)v * (size_t)N + (size_t)s]);
        c->part[(size_t)v * (size_t)N + (size_t)s] = NULL;
    }
}

static void tp_ctx_free(og_model *m, og_step_ctx *c) {
    if (!c) return;
    for (int32_t v = 0; c->full && c->part && v < m->n_instrs; v++) drop_value(m, c, v);
    og_free(c->full);
    og_free(c->part);
    og_free(c->tokens);
    og_free(c->positions);
    og_free(c->logits);
    og_free(c);
}

static og_status tp_ctx_create(og_model *m, og_step_ctx **out) {
    og_step_ctx *c = og_calloc(1, sizeof *c);
    if (c) {
        c->full = og_calloc((size_t)m->n_instrs, sizeof *c->full);
        c->part = og_calloc((size_t)m->n_instrs * (size_t)tm_of(m)->plan->n_shards, sizeof *c->part);
    }
    if (!c || !c->full || !c->part) {
        tp_ctx_free(m, c);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a step context");
    }
    *out = c;
    return OG_OK;
}

/* ------------------------------------------------------------ one step */

typedef struct tp_run {
    og_model *m;
    int64_t step;                     /* which step of the model, from 1 */
    og_step_ctx *c;
    const og_step_plan *plan;
    const og_shard_plan *sp;
    bool tail;
    int64_t rows;
    float *scratch[OG_OP_MAX_INPUTS]; /* columns read out of FULL values, per operand, for the shard running */
} tp_run;

static float *alloc_rows(int64_t rows, int64_t width) {
    const size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)(width > 0 ? width : 1);
    return og_malloc(n * sizeof(float));
}

/* Width of value v as shard s holds it. */
static int64_t value_width(const tp_run *r, int32_t v, int32_t s) {
    const og_shard_instr *si = &r->sp->instr[v];
    if (si->layout == OG_SHARD_SPLIT) return og_shard_cols_width(&si->cols[s]);
    return og_program_instr_at(r->m->prog, v)->out_width;
}

/* Copies columns cols of rows [rows, W] of x into dst [rows, width(cols)]. */
static void gather_cols(const float *x, int64_t rows, int64_t W, const og_shard_cols *cols, float *dst) {
    const int64_t w = og_shard_cols_width(cols);
    for (int64_t t = 0; t < rows; t++) {
        int64_t o = 0;
        for (int32_t k = 0; k < cols->n; k++) {
            memcpy(dst + t * w + o, x + t * W + cols->lo[k], (size_t)(cols->hi[k] - cols->lo[k]) * sizeof(float));
            o += cols->hi[k] - cols->lo[k];
        }
    }
}

/* The inverse: dst [rows, W] gets the columns of x [rows, width(cols)]. */
static void scatter_cols(const float *x, int64_t rows, int64_t W, const og_shard_cols *cols, float *dst) {
    const int64_t w = og_shard_cols_width(cols);
    for (int64_t t = 0; t < rows; t++) {
        int64_t o = 0;
        for (int32_t k = 0; k < cols->n; k++) {
            memcpy(dst + t * W + cols->lo[k], x + t * w + o, (size_t)(cols->hi[k] - cols->lo[k]) * sizeof(float));
            o += cols->hi[k] - cols->lo[k];
        }
    }
}

/* Copies the columns want of a shard's rows x [rows, width(have)], which
 * hold the columns have of a value, into dst [rows, width(want)]; every
 * range of want lies inside one of have. */
static void gather_within(const float *x, int64_t rows, const og_shard_cols *have, const og_shard_cols *want,
                          float *dst) {
    const int64_t hw = og_shard_cols_width(have), ww = og_shard_cols_width(want);
    int64_t o = 0;
    for (int32_t k = 0; k < want->n; k++) {
        int64_t at = 0; /* where want's range k starts in x's row */
        for (int32_t j = 0; j < have->n; j++) {
            if (want->lo[k] >= have->lo[j] && want->hi[k] <= have->hi[j]) {
                at += want->lo[k] - have->lo[j];
                break;
            }
            at += have->hi[j] - have->lo[j];
        }
        const int64_t n = want->hi[k] - want->lo[k];
        for (int64_t t = 0; t < rows; t++) memcpy(dst + t * ww + o, x + t * hw + at, (size_t)n * sizeof(float));
        o += n;
    }
}

/* Operand j of instruction i as shard s reads it; *width its columns. NULL
 * for a partial operand shard s does not add (a FULL one beyond shard 0). */
static const void *operand(tp_run *r, int32_t i, int32_t j, int32_t s, int64_t *width, og_dtype *dtype) {
    const og_model *m = r->m;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const og_program_operand o = in->in[j];
    const og_shard_instr *si = &r->sp->instr[i];
    *dtype = OG_DTYPE_F32;
    if (o.kind == OG_VALUE_TENSOR) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, o.index);
        const og_shard_weight *w = og_shard_weight_at(r->sp, i, j, s);
        *dtype = t->dtype;
        *width = w->cols;
        return w->data;
    }
    if (o.kind == OG_VALUE_INPUT) {
        *width = 1;
        return o.index == OG_INPUT_TOKENS ? (const void *)r->c->tokens : (const void *)r->c->positions;
    }
    const int32_t v = o.index, N = r->sp->n_shards;
    const og_shard_instr *src = &r->sp->instr[v];
    float *full = r->c->full[v], *mine = r->c->part[(size_t)v * (size_t)N + (size_t)s];
    *width = value_width(r, v, s);
    switch (si->take[j]) {
    case OG_SHARD_TAKE_COLS: {
        const og_shard_cols *want = &si->in_cols[j][s];
        if (src->layout == OG_SHARD_SPLIT && og_shard_cols_width(want) == *width) return mine; /* all it holds */
        *width = og_shard_cols_width(want);
        og_free(r->scratch[j]);
        r->scratch[j] = alloc_rows(r->rows, *width);
        if (!r->scratch[j]) return NULL;
        if (src->layout == OG_SHARD_SPLIT) gather_within(mine, r->rows, &src->cols[s], want, r->scratch[j]);
        else gather_cols(full, r->rows, og_program_instr_at(m->prog, v)->out_width, want, r->scratch[j]);
        return r->scratch[j];
    }
    case OG_SHARD_TAKE_PARTIAL:
        if (src->layout == OG_SHARD_PARTIAL) return mine;
        return s == 0 ? full : NULL;
    default:
        return full;
    }
}

/* update_and_attend of shard s for every session: its kv heads of the
 * session's rows. */
static og_status attend_shard(tp_run *r, int32_t i, int32_t s, const float *q, const float *k, const float *v,
                              float *out) {
    const og_program_instr *in = og_program_instr_at(r->m->prog, i);
    const og_shard_instr *si = &r->sp->instr[i];
    const og_op_attrs *a = &si->attrs[s];
    const int64_t D = in->attrs.head_dim, qw = a->n_heads * D, kw = a->n_kv_heads * D;
    for (int32_t n = 0; n < r->plan->n_seqs; n++) {
        const og_step_seq *sq = &r->plan->seqs[n];
        og_attend_args aa = {
            .q = q + sq->row0 * qw, .k = k + sq->row0 * kw, .v = v + sq->row0 * kw,
            .positions = r->c->positions + sq->row0, .out = out + sq->row0 * qw,
            .T = sq->T, .n_heads = (int32_t)a->n_heads, .scale = (float)a->scale,
        };
        OG_TRY(og_kv_session_layer_view(sq->s->kv, in->kv_index, &aa.kv));
        const int64_t stride = og_kv_layer_view_row_stride(&aa.kv);
        /* int8 / fp8 rows: D bytes a head, the scales at the row's end */
        const size_t off = (size_t)(si->head0[s] * D) * og_dtype_size(aa.kv.dtype);
        if (og_kv_dtype_quantized(aa.kv.dtype))
            aa.kv_part = (og_kv_row_part){.heads = aa.kv.n_kv_heads, .head0 = si->head0[s]};
        aa.kv.k = (char *)aa.kv.k + off;
        aa.kv.v = (char *)aa.kv.v + off;
        aa.kv.n_kv_heads = (int32_t)a->n_kv_heads;
        aa.kv.row_stride = stride;
        OG_TRY(og_update_and_attend_cpu(&aa, r->m->pool, NULL));
    }
    return OG_OK;
}

/* causal_conv1d of shard s (its channels cols) for every session; the
 * state's channels are copied out and back. */
static og_status conv_shard(tp_run *r, int32_t i, int32_t s, const float *x, const void *w, og_dtype wdt, int64_t Cs,
                            int64_t C, const og_shard_cols *cols, float *out) {
    const og_program_instr *in = og_program_instr_at(r->m->prog, i);
    const og_program_tensor *wt = og_program_tensor_at(r->m->prog, in->in[1].index),
                            *st = og_program_tensor_at(r->m->prog, in->in[2].index);
    const int64_t K = wt->shape[1];
    float *sin = alloc_rows(K - 1, Cs), *sout = alloc_rows(K - 1, Cs);
    og_status rc = sin && sout ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a convolution's state");
    for (int32_t n = 0; rc == OG_OK && n < r->plan->n_seqs; n++) {
        const og_step_seq *q = &r->plan->seqs[n];
        og_kv_state_view v;
        rc = og_kv_session_state_view(q->s->kv, st->state_index, &v);
        if (rc != OG_OK) break;
        if (q->L > 0) gather_cols(v.read, K - 1, C, cols, sin);
        rc = og_causal_conv1d_cpu(r->m->pool, x + q->row0 * Cs, w, wdt, q->L > 0 ? sin : NULL, sout, q->T, Cs, K,
                                  out + q->row0 * Cs);
        if (rc == OG_OK) scatter_cols(sout, K - 1, C, cols, v.write);
    }
    og_free(sin);
    og_free(sout);
    return rc;
}

/* gated_delta_net of shard s (its value heads) for every session. */
static og_status gdn_shard(tp_run *r, int32_t i, int32_t s, const void *const *x, const og_dtype *dt, float *out) {
    const og_program_instr *in = og_program_instr_at(r->m->prog, i);
    const og_shard_instr *si = &r->sp->instr[i];
    const og_op_attrs *at = &si->attrs[s];
    const og_program_tensor *st = og_program_tensor_at(r->m->prog, in->in[5].index);
    const int64_t W = 2 * at->k_heads * at->k_head_dim + at->v_heads * at->v_head_dim, Hv = at->v_heads,
                  head = at->k_head_dim * at->v_head_dim;
    for (int32_t n = 0; n < r->plan->n_seqs; n++) {
        const og_step_seq *q = &r->plan->seqs[n];
        og_kv_state_view v;
        OG_TRY(og_kv_session_state_view(q->s->kv, st->state_index, &v));
        const og_gdn_args ga = {
            .qkv = (const float *)x[0] + q->row0 * W, .a = (const float *)x[1] + q->row0 * Hv,
            .b = (const float *)x[2] + q->row0 * Hv, .A_log = x[3], .dt_bias = x[4], .A_log_dtype = dt[3],
            .dt_bias_dtype = dt[4], .T = q->T, .Hk = at->k_heads, .Hv = Hv, .Dk = at->k_head_dim,
            .Dv = at->v_head_dim, .state_in = q->L > 0 ? (const float *)v.read + si->head0[s] * head : NULL,
            .state_out = (float *)v.write + si->head0[s] * head, .out = out + q->row0 * Hv * at->v_head_dim,
        };
        OG_TRY(og_gated_delta_net_cpu(r->m->pool, &ga));
    }
    return OG_OK;
}

/* embed of shard s: its vocabulary rows [v0, v0 + rows); other tokens zero. */
static og_status embed_shard(tp_run *r, int32_t i, int32_t s, const void *table, og_dtype dt, int64_t H, float *out) {
    const og_shard_instr *si = &r->sp->instr[i];
    const og_shard_weight *w = og_shard_weight_at(r->sp, i, 1, s);
    const int64_t v0 = si->head0[s], n = w->rows;
    for (int64_t t = 0; t < r->rows; t++) {
        const int32_t tok = r->c->tokens[t];
        if (tok < 0 || tok >= og_model_vocab_size(r->m))
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "token id %d at position %lld is outside [0, %lld)", tok,
                                (long long)t, (long long)og_model_vocab_size(r->m));
        if (tok < v0 || tok >= v0 + n) {
            memset(out + t * H, 0, (size_t)H * sizeof(float));
            continue;
        }
        const int32_t local = (int32_t)(tok - v0);
        OG_TRY(og_embed_cpu(NULL, &local, 1, table, dt, n, H, out + t * H));
    }
    return OG_OK;
}

/* Instruction i on shard s into out (its [rows, width] of the output). */
static og_status run_shard(tp_run *r, int32_t i, int32_t s, float *out) {
    const og_model *m = r->m;
    if (i == m->last_attend && s == tm_of(m)->fault_shard && r->step == tm_of(m)->fault_step)
        return og_set_error(OG_ERR_BACKEND, "shard %d: an injected failure (OG_TEST_TP_FAULT)", s);
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const og_shard_instr *si = &r->sp->instr[i];
    const og_op_attrs *a = &si->attrs[s];
    const void *x[OG_OP_MAX_INPUTS] = {0};
    int64_t w[OG_OP_MAX_INPUTS] = {0};
    og_dtype dt[OG_OP_MAX_INPUTS] = {0};
    for (int32_t j = 0; j < in->n_in; j++) {
        x[j] = operand(r, i, j, s, &w[j], &dt[j]);
        if (!x[j] && in->in[j].kind == OG_VALUE_ACTIVATION && si->take[j] == OG_SHARD_TAKE_COLS)
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a shard's operand");
    }
    og_threadpool *pool = m->pool;
    const int64_t T = r->rows;
    switch (in->op) {
    case OG_OP_EMBED:
        return embed_shard(r, i, s, x[1], dt[1], w[1], out);
    case OG_OP_RMS_NORM:
        return og_rms_norm_cpu(pool, x[0], x[1], dt[1], T, w[0], (float)a->eps, out);
    case OG_OP_HEAD_RMS_NORM:
        return og_head_rms_norm_cpu(pool, x[0], x[1], dt[1], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_MATMUL: {
        const og_shard_weight *wt = og_shard_weight_at(r->sp, i, 1, s);
        return og_cpu_plan_matmul(pool, r->plan, r->tail, tm_of(m)->bf16_prefill, x[0], x[1],
                                  in->n_in > 2 ? x[2] : NULL, dt[1], w[0], wt->rows, out);
    }
    case OG_OP_ROPE:
        return og_rope_cpu(pool, &m->rope[i], x[0], x[1], T, a->heads, out);
    case OG_OP_SWIGLU:
        return og_swiglu_cpu(pool, x[0], x[1], T, w[0], out);
    case OG_OP_ADD:
        return og_add_cpu(pool, x[0], x[1], T * w[0], out);
    case OG_OP_SIGMOID_MUL:
        return og_sigmoid_mul_cpu(pool, x[0], x[1], T * w[0], out);
    case OG_OP_RMS_NORM_GATED:
        return og_rms_norm_gated_cpu(pool, x[0], x[1], x[2], dt[2], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_UPDATE_AND_ATTEND:
        return attend_shard(r, i, s, x[0], x[1], x[2], out);
    case OG_OP_CAUSAL_CONV1D: {
        const og_shard_cols *cols = si->mode == OG_SHARD_HEADS ? &si->cols[s] : NULL;
        const og_shard_cols all = {.n = 1, .lo = {0}, .hi = {in->out_width}};
        return conv_shard(r, i, s, x[0], x[1], dt[1], w[0], in->out_width, cols ? cols : &all, out);
    }
    case OG_OP_GATED_DELTA_NET:
        return gdn_shard(r, i, s, x, dt, out);
    case OG_OP_MOE: {
        const og_program_tensor *gu = og_program_tensor_at(m->prog, in->in[2].index);
        const og_shard_weight *dn = og_shard_weight_at(r->sp, i, 3, s);
        og_moe_args ma = {.x = x[0], .logits = x[1], .gate_up = x[2], .gate_up_dtype = dt[2], .down = x[3],
                          .down_dtype = dt[3], .shared = in->n_in > 4 ? x[4] : NULL,
                          .shared_gate = in->n_in > 4 && x[4] ? x[5] : NULL, .T = T, .H = w[0], .F = dn->cols,
                          .E = gu->shape[0], .top_k = (int32_t)a->top_k, .norm_topk_prob = a->norm_topk_prob != 0,
                          .out = out};
        return T > 0 ? og_moe_cpu(pool, &ma) : OG_OK;
    }
    case OG_OP_COUNT:
        break;
    }
    return og_set_error(OG_ERR_UNSUPPORTED, "op %d has no CPU kernel", (int)in->op);
}

/* Instruction i on every shard, then its reduce or gather. */
static og_status run_instr(tp_run *r, int32_t i) {
    og_model *m = r->m;
    og_step_ctx *c = r->c;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const og_shard_instr *si = &r->sp->instr[i];
    const int32_t N = r->sp->n_shards;
    const int64_t W = i == m->logits_instr ? m->vocab : in->out_width;
    float **part = &c->part[(size_t)i * (size_t)N];
    og_status st = OG_OK;
    if (si->mode == OG_SHARD_REPLICATED) {
        float *out = i == m->logits_instr ? c->logits : (c->full[i] = alloc_rows(r->rows, W));
        if (!out) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a value of the step");
        st = run_shard(r, i, 0, out);
    } else {
        const bool partial = si->mode == OG_SHARD_ROWS || si->mode == OG_SHARD_EXPERTS || si->mode == OG_SHARD_VOCAB_EMBED;
        for (int32_t s = 0; st == OG_OK && s < N; s++) {
            const int64_t ws = partial ? W : og_shard_cols_width(&si->cols[s]);
            if (!(part[s] = alloc_rows(r->rows, ws))) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a value of the step");
            if (st == OG_OK) st = run_shard(r, i, s, part[s]);
        }
        if (st == OG_OK && si->reduce) { /* the all-reduce, in shard order */
            for (int32_t s = 1; s < N; s++)
                for (int64_t e = 0; e < r->rows * W; e++) part[0][e] += part[s][e];
            c->full[i] = part[0];
            part[0] = NULL;
        } else if (st == OG_OK && si->gather) { /* the all-gather */
            float *full = i == m->logits_instr ? c->logits : (c->full[i] = alloc_rows(r->rows, W));
            if (!full) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a value of the step");
            for (int32_t s = 0; st == OG_OK && s < N; s++) scatter_cols(part[s], r->rows, W, &si->cols[s], full);
        }
        if (si->reduce || si->gather)
            for (int32_t s = 0; s < N; s++) {
                og_free(part[s]);
                part[s] = NULL;
            }
    }
    for (int32_t j = 0; j < OG_OP_MAX_INPUTS; j++) {
        og_free(r->scratch[j]);
        r->scratch[j] = NULL;
    }
    return st;
}

/* Moves the tail rows of every value still to be read, and of the inputs, to the front. */
static void compact_for_tail(tp_run *r, int32_t from) {
    const og_step_plan *p = r->plan;
    const int32_t N = r->sp->n_shards;
    for (int32_t j = 0; j < p->n_tail_rows; j++) {
        r->c->tokens[j] = r->c->tokens[p->tail_src[j]];
        r->c->positions[j] = r->c->positions[p->tail_src[j]];
    }
    for (int32_t v = 0; v < from; v++) {
        if (tm_of(r->m)->last_use[v] < from) continue;
        for (int32_t s = -1; s < N; s++) {
            float *base = s < 0 ? r->c->full[v] : r->c->part[(size_t)v * (size_t)N + (size_t)s];
            if (!base) continue;
            const int64_t width = s < 0 || r->sp->instr[v].layout != OG_SHARD_SPLIT
                                      ? og_program_instr_at(r->m->prog, v)->out_width
                                      : og_shard_cols_width(&r->sp->instr[v].cols[s]);
            for (int32_t j = 0; j < p->n_tail_rows; j++)
                if (p->tail_src[j] != j)
                    memcpy(base + (int64_t)j * width, base + (int64_t)p->tail_src[j] * width, (size_t)width * sizeof(float));
        }
    }
}

static og_status reserve(og_model *m, og_step_ctx *c, int64_t rows, int64_t logit_rows) {
    if (rows > c->rows_cap) {
        og_free(c->tokens);
        og_free(c->positions);
        c->tokens = og_malloc((size_t)rows * sizeof *c->tokens);
        c->positions = og_malloc((size_t)rows * sizeof *c->positions);
        c->rows_cap = c->tokens && c->positions ? rows : 0;
        if (!c->rows_cap) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a step of %lld rows", (long long)rows);
    }
    if (logit_rows > c->logits_cap) {
        og_free(c->logits);
        c->logits = og_malloc((size_t)(logit_rows * m->vocab) * sizeof(float));
        c->logits_cap = c->logits ? logit_rows : 0;
        if (!c->logits) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the logits of %lld rows", (long long)logit_rows);
    }
    return OG_OK;
}

static og_status tp_step(og_model *m, og_step_ctx *c, const og_step_plan *p) {
    OG_TRY(reserve(m, c, p->n_rows, p->n_tail_rows));
    memcpy(c->tokens, p->tokens, (size_t)p->n_rows * sizeof *c->tokens);
    memcpy(c->positions, p->positions, (size_t)p->n_rows * sizeof *c->positions);
    tp_run r = {.m = m, .c = c, .plan = p, .sp = tm_of(m)->plan, .rows = p->n_rows, .step = ++tm_of(m)->steps};
    const int32_t end = p->n_tail_rows > 0 ? m->n_instrs : m->last_attend + 1;
    og_status st = OG_OK;
    for (int32_t i = 0; st == OG_OK && i < end; i++) {
        if (i == m->last_attend + 1) {
            if (!p->tail_is_all) compact_for_tail(&r, i);
            r.tail = true;
            r.rows = p->n_tail_rows;
        }
        st = run_instr(&r, i);
        if (st != OG_OK) {
            st = og_set_error(st, "instruction %d (%s -> %s): %s", i, og_op_get(og_program_instr_at(m->prog, i)->op)->name,
                              og_program_instr_at(m->prog, i)->out, og_last_error());
            break;
        }
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        for (int32_t j = 0; j < in->n_in; j++)
            if (in->in[j].kind == OG_VALUE_ACTIVATION && tm_of(m)->last_use[in->in[j].index] == i)
                drop_value(m, c, in->in[j].index);
        if (tm_of(m)->last_use[i] < 0) drop_value(m, c, i);
    }
    for (int32_t v = 0; v < m->n_instrs; v++) drop_value(m, c, v);
    if (st != OG_OK) return st;
    return p->n_tail_rows > 0 ? og_cpu_deliver(p, c->logits, m->vocab) : OG_OK;
}

const og_backend_ops og_backend_cpu_tp_ops = {
    .name = "cpu",
    .fusion = &og_fuse_rules_none,
    .model_init = tp_model_init,
    .model_free = tp_model_free,
    .session_init = tp_session_init,
    .session_free = tp_session_free,
    .ctx_create = tp_ctx_create,
    .ctx_free = tp_ctx_free,
    .step = tp_step,
};
