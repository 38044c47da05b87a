/* The CPU back end: runs a prepared step (exec.h) with the kernels of
 * kernels/ops.h and kernels/attend.h.
 *
 * Activations are f32 rows: the step's N rows (every session's tokens, in the
 * plan's row order) go through each row-wise instruction at once. Each
 * instruction's output lives in a scratch slot of the step context (slots
 * are shared between values whose lifetimes do not overlap, planned once per
 * model); contexts grow their slots to the widest step they have run.
 *
 * Results are bit for bit those of each session stepped alone, whatever the
 * batch around it:
 *  - row-wise kernels (embed, norms, rope, swiglu, add) compute every row on
 *    its own;
 *  - a product computes one-token rows (decode rows, and the single tail row
 *    of a wider step) with og_matmul_rows_cpu, which reads the weights once
 *    for all of them and gives each row the bits og_matmul_cpu gives it
 *    alone; a wider step's rows go through og_matmul_cpu (or, in a bf16
 *    program, og_matmul_bf16_cpu) as one call of its own T rows, as alone;
 *  - update_and_attend runs per session over its own storage.
 *
 * Products of one x that follow one another (q, k and v; gate and up, with
 * the swiglu after them: the runs the fusion matcher finds under
 * og_fuse_rules_cpu, exec/fuse.h) run as one parallel-for in steps whose
 * rows are all one-token rows (og_matmul_rows_multi_cpu,
 * og_matmul_rows_swiglu_cpu: the same bits as one call each); the scratch
 * plan treats such a run as one step, so none of its outputs shares a slot
 * with a value it reads.
 *
 * The tail (every instruction after the last update_and_attend works row by
 * row) runs only on the rows whose output is wanted: before it, the values
 * it reads are compacted in place to those rows (plan->tail_src increases and
 * never points below its index, so the copy is safe in place).
 */
#include "exec/exec.h"
#include "kernels/cpu_isa.h"

#include "kernels/attend.h"
#include "kernels/gdn.h"
#include "kernels/moe.h"
#include "exec/sample.h"

#include <stdio.h>
#include <string.h>

typedef struct cpu_model {
    int32_t *slot_of;    /* [n_instrs]: scratch slot of each output, -1 for the logits */
    int64_t *slot_width; /* [n_instrs], n_slots used */
    int32_t n_slots;
    bool *tail_reads;    /* [n_instrs]: a value made before the tail that the tail reads */
    bool bf16_prefill;   /* products of wider steps round activations to bf16 */
    int32_t *fuse_end;   /* [n_instrs]: last instruction of the fused run that starts here, or -1 */
    bool *fuse_glu;      /* [n_instrs]: that run is gate, up and their swiglu */
    int64_t weight_bytes; /* counted in og_cpu_weights_loaded while the model lives */
} cpu_model;

struct og_step_ctx {
    float **slots;       /* [n_slots] of [rows_cap, slot_width] */
    int32_t *tokens;     /* [rows_cap] the step's (then the tail's) tokens    */
    int32_t *positions;  /* [rows_cap]                                        */
    int64_t rows_cap;
    float *logits;       /* [logits_cap, V] the tail rows' logits             */
    int64_t logits_cap;
};

static cpu_model *cm_of(const og_model *m) { return m->be; }

/* ------------------------------------------------------------ model */

static void cpu_model_free(og_model *m) {
    cpu_model *cm = m->be;
    if (!cm) return;
    og_cpu_weights_loaded(-cm->weight_bytes);
    og_free(cm->slot_of);
    og_free(cm->slot_width);
    og_free(cm->tail_reads);
    og_free(cm->fuse_end);
    og_free(cm->fuse_glu);
    og_free(cm);
    m->be = NULL;
}

/* Instruction in reads value v. */
static bool reads_value(const og_program_instr *in, int32_t v) {
    for (int32_t j = 0; j < in->n_in; j++)
        if (in->in[j].kind == OG_VALUE_ACTIVATION && in->in[j].index == v) return true;
    return false;
}

/* The fused runs, from the steps of the model's plan (fuse.h under
 * og_fuse_rules_cpu: products of one x, and gate, up and swiglu, each a
 * contiguous run of the program). */
static void plan_fusion(og_model *m, cpu_model *cm) {
    for (int32_t i = 0; i < m->n_instrs; i++) {
        cm->fuse_end[i] = -1;
        cm->fuse_glu[i] = false;
    }
    for (int32_t k = 0; k < m->n_steps; k++) {
        const og_fuse_step *s = &m->steps[k];
        if (s->n < 2) continue;
        cm->fuse_end[s->instr[0]] = s->instr[s->n - 1];
        cm->fuse_glu[s->instr[0]] = s->kind == OG_FUSE_GATE_UP;
    }
}

og_status og_cpu_start_pool(og_model *m, int32_t n_threads) {
    m->pool = n_threads == 1 ? NULL : og_threadpool_create(n_threads);
    if (n_threads != 1 && !m->pool) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cannot start %d threads", n_threads);
    return OG_OK;
}

static og_status cpu_model_init(og_model *m, const og_model_params *p) {
    const int32_t n = m->n_instrs;
    cpu_model *cm = og_calloc(1, sizeof *cm);
    if (!cm) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    m->be = cm;
    cm->weight_bytes = (int64_t)og_program_weight_bytes(m->prog);
    og_cpu_weights_loaded(cm->weight_bytes); /* picks how the products prefetch */
    OG_TRY(og_cpu_start_pool(m, p->n_threads));
    cm->slot_of = og_malloc((size_t)n * sizeof *cm->slot_of);
    cm->slot_width = og_calloc((size_t)n, sizeof *cm->slot_width);
    cm->tail_reads = og_calloc((size_t)n, sizeof *cm->tail_reads);
    cm->fuse_end = og_malloc((size_t)n * sizeof *cm->fuse_end);
    cm->fuse_glu = og_malloc((size_t)n * sizeof *cm->fuse_glu);
    int32_t *def = og_malloc((size_t)n * sizeof *def), *last = og_malloc((size_t)n * sizeof *last);
    int64_t *width = og_malloc((size_t)n * sizeof *width);
    og_status st = OG_OK;
    if (!cm->slot_of || !cm->slot_width || !cm->tail_reads || !cm->fuse_end || !cm->fuse_glu || !def ||
        !last || !width) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the scratch plan");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        def[i] = i;
        last[i] = -1;
        width[i] = i == m->logits_instr ? -1 : in->out_width;
    }
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        for (int32_t j = 0; j < in->n_in; j++) {
            const og_program_operand o = in->in[j];
            if (o.kind != OG_VALUE_ACTIVATION) continue;
            last[o.index] = i;
            if (og_exec_in_tail(m, i) && og_exec_full_rows(m, o)) cm->tail_reads[o.index] = true;
        }
    }
    /* a fused run writes every output at its first instruction and reads
     * its inputs until its end */
    plan_fusion(m, cm);
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = cm->fuse_end[i];
        if (e < 0) continue;
        for (int32_t k = i; k <= e; k++) {
            def[k] = i;
            for (int32_t v = 0; v < n; v++)
                if (last[v] >= i && last[v] < e && reads_value(og_program_instr_at(m->prog, k), v)) last[v] = e;
        }
    }
    st = og_exec_plan_slots(n, n, def, last, width, cm->slot_of, cm->slot_width, &cm->n_slots);
    cm->bf16_prefill = og_program_get_model(m->prog)->activation_dtype == OG_DTYPE_BF16;
done:
    og_free(def);
    og_free(last);
    og_free(width);
    return st;
}

/* ------------------------------------------------------------ sessions */

static og_status cpu_session_init(og_session *s) { return og_kv_session_create(&s->cfg, s->kv_alloc, &s->kv); }
static void cpu_session_free(og_session *s) { (void)s; }

/* ------------------------------------------------------------ contexts */

static void cpu_ctx_free(og_model *m, og_step_ctx *c) {
    if (!c) return;
    if (c->slots)
        for (int32_t i = 0; i < cm_of(m)->n_slots; i++) og_free(c->slots[i]);
    og_free(c->slots);
    og_free(c->tokens);
    og_free(c->positions);
    og_free(c->logits);
    og_free(c);
}

static og_status cpu_ctx_create(og_model *m, og_step_ctx **out) {
    og_step_ctx *c = og_calloc(1, sizeof *c);
    if (c) c->slots = og_calloc((size_t)(cm_of(m)->n_slots > 0 ? cm_of(m)->n_slots : 1), sizeof *c->slots);
    if (!c || !c->slots) {
        cpu_ctx_free(m, c);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a step context");
    }
    *out = c;
    return OG_OK;
}

/* Grows a buffer of count elements of size bytes to at least need; keeps
 * nothing (contents are per step). */
static bool grow(void **buf, int64_t need, size_t size) {
    void *p = og_malloc((size_t)need * size);
    if (!p) return false;
    og_free(*buf);
    *buf = p;
    return true;
}

static og_status ctx_reserve(og_model *m, og_step_ctx *c, int64_t rows, int64_t logit_rows) {
    const cpu_model *cm = cm_of(m);
    if (rows > c->rows_cap) {
        int64_t cap = rows > 2 * c->rows_cap ? rows : 2 * c->rows_cap;
        bool ok = grow((void **)&c->tokens, cap, sizeof(int32_t)) && grow((void **)&c->positions, cap, sizeof(int32_t));
        for (int32_t i = 0; ok && i < cm->n_slots; i++) ok = grow((void **)&c->slots[i], cap * cm->slot_width[i], sizeof(float));
        if (!ok) {
            c->rows_cap = 0; /* some slots are smaller now: grow all next time */
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the scratch of %lld rows", (long long)cap);
        }
        c->rows_cap = cap;
    }
    if (logit_rows > c->logits_cap) {
        if (!grow((void **)&c->logits, logit_rows * m->vocab, sizeof(float))) {
            c->logits_cap = 0;
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the logits of %lld rows", (long long)logit_rows);
        }
        c->logits_cap = logit_rows;
    }
    return OG_OK;
}

/* ------------------------------------------------------------ one step */

typedef struct step_run {
    og_model *m;
    og_step_ctx *c;
    const og_step_plan *plan;
    bool tail;        /* running the tail: rows are the tail's rows */
    int64_t rows;     /* rows of the current phase */
} step_run;

static const void *operand_ptr(const step_run *r, og_program_operand o, int64_t *width, og_dtype *dtype) {
    const og_model *m = r->m;
    if (o.kind == OG_VALUE_TENSOR) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, o.index);
        *dtype = t->dtype;
        *width = t->rank >= 2 ? t->shape[t->rank - 1] : t->shape[0];
        return t->data;
    }
    *dtype = OG_DTYPE_F32;
    if (o.kind == OG_VALUE_INPUT) {
        *width = 1;
        return o.index == OG_INPUT_TOKENS ? (const void *)r->c->tokens : (const void *)r->c->positions;
    }
    *width = og_program_instr_at(m->prog, o.index)->out_width;
    return r->c->slots[cm_of(m)->slot_of[o.index]];
}

/* x [rows, K] @ w^T over the phase's rows: one-token rows together, each
 * wider step's rows as a call of their own (see the file comment). */
og_status og_cpu_plan_matmul(og_threadpool *pool, const og_step_plan *p, bool tail, bool bf16_prefill, const float *x,
                             const void *w, const void *bias, og_dtype dt, int64_t K, int64_t N, float *out) {
    const int64_t singles = tail ? p->n_tail_single : p->n_single;
    if (singles > 0) OG_TRY(og_matmul_rows_cpu(pool, x, w, bias, dt, singles, K, N, out));
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        const int64_t rows = tail ? q->tail_rows : q->T;
        if (rows <= 1) continue;
        const int64_t row0 = tail ? q->tail_row0 : q->row0;
        const float *xs = x + row0 * K;
        float *os = out + row0 * N;
        if (bf16_prefill) OG_TRY(og_matmul_bf16_cpu(pool, xs, w, bias, dt, rows, K, N, os));
        else OG_TRY(og_matmul_cpu(pool, xs, w, bias, dt, rows, K, N, os));
    }
    return OG_OK;
}

static og_status matmul(const step_run *r, const float *x, const void *w, const void *bias, og_dtype dt, int64_t K,
                        int64_t N, float *out) {
    return og_cpu_plan_matmul(r->m->pool, r->plan, r->tail, cm_of(r->m)->bf16_prefill, x, w, bias, dt, K, N, out);
}

/* update_and_attend of session i of the step over its own storage. */
typedef struct attend_job {
    const step_run *r;
    const og_program_instr *in;
    const float *q, *k, *v; /* the step's [N, ...] rows */
    float *out;
    og_status *status;      /* [K] when sessions run in parallel */
    char (*why)[OG_ERRMSG_CAP];
} attend_job;

static og_status attend_one(const attend_job *j, int32_t i, og_threadpool *pool) {
    const step_run *r = j->r;
    const og_step_seq *s = &r->plan->seqs[i];
    const int64_t qw = j->in->out_width, kw = og_program_instr_at(r->m->prog, j->in->in[1].index)->out_width;
    og_attend_args aa = {
        .q = j->q + s->row0 * qw, .k = j->k + s->row0 * kw, .v = j->v + s->row0 * kw,
        .positions = r->c->positions + s->row0, .out = j->out + s->row0 * qw,
        .T = s->T, .n_heads = (int32_t)j->in->attrs.n_heads, .scale = (float)j->in->attrs.scale,
    };
    OG_TRY(og_kv_session_layer_view(s->s->kv, j->in->kv_index, &aa.kv));
    return og_update_and_attend_cpu(&aa, pool, NULL);
}

static void attend_task(void *ctx, int64_t i, int thread) {
    const attend_job *j = ctx;
    j->status[i] = attend_one(j, (int32_t)i, NULL);
    if (j->status[i] != OG_OK) snprintf(j->why[i], OG_ERRMSG_CAP, "%s", og_last_error());
}

/* Sessions of a decode step (one row each) run in parallel, each on one
 * thread; otherwise each session's attention spreads over the threads. The
 * kernel's results do not depend on its threads, so both give every
 * session the bits it gets alone. */
static og_status attend(const step_run *r, const og_program_instr *in, const float *q, const float *k,
                        const float *v, float *out) {
    const og_step_plan *p = r->plan;
    attend_job j = {r, in, q, k, v, out, NULL, NULL};
    og_threadpool *pool = r->m->pool;
    if (!p->decode_only || p->n_seqs < 2 || p->n_seqs < og_threadpool_size(pool)) {
        for (int32_t i = 0; i < p->n_seqs; i++) OG_TRY(attend_one(&j, i, pool));
        return OG_OK;
    }
    j.status = og_malloc((size_t)p->n_seqs * sizeof *j.status);
    j.why = og_malloc((size_t)p->n_seqs * sizeof *j.why);
    og_status st = OG_OK;
    if (!j.status || !j.why) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "attention of %d sessions: no memory", p->n_seqs);
    if (st == OG_OK) og_parallel_for(pool, p->n_seqs, attend_task, &j);
    for (int32_t i = 0; st == OG_OK && i < p->n_seqs; i++)
        if (j.status[i] != OG_OK) st = og_set_error(j.status[i], "session of row %d: %s", p->seqs[i].row0, j.why[i]);
    og_free(j.status);
    og_free(j.why);
    return st;
}

/* The state of the step's session i that operand o (a runtime state tensor) names. */
static og_status state_of(const step_run *r, int32_t i, og_program_operand o, og_kv_state_view *v) {
    const og_program_tensor *t = og_program_tensor_at(r->m->prog, o.index);
    return og_kv_session_state_view(r->plan->seqs[i].s->kv, t->state_index, v);
}

/* causal_conv1d of every session of the step over its own state. */
static og_status conv_sessions(const step_run *r, const og_program_instr *in, const float *x, const void *w,
                               og_dtype wdt, int64_t C, int64_t K, float *out) {
    for (int32_t i = 0; i < r->plan->n_seqs; i++) {
        const og_step_seq *q = &r->plan->seqs[i];
        og_kv_state_view v;
        OG_TRY(state_of(r, i, in->in[2], &v));
        OG_TRY(og_causal_conv1d_cpu(r->m->pool, x + q->row0 * C, w, wdt, q->L > 0 ? v.read : NULL, v.write, q->T, C,
                                    K, out + q->row0 * C));
    }
    return OG_OK;
}

/* gated_delta_net of every session of the step over its own state. */
static og_status gdn_sessions(const step_run *r, const og_program_instr *in, const void *const *x,
                              const og_dtype *dt, float *out) {
    const og_op_attrs *at = &in->attrs;
    const int64_t W = 2 * at->k_heads * at->k_head_dim + at->v_heads * at->v_head_dim, Hv = at->v_heads;
    for (int32_t i = 0; i < r->plan->n_seqs; i++) {
        const og_step_seq *q = &r->plan->seqs[i];
        og_kv_state_view v;
        OG_TRY(state_of(r, i, in->in[5], &v));
        const og_gdn_args ga = {
            .qkv = (const float *)x[0] + q->row0 * W, .a = (const float *)x[1] + q->row0 * Hv,
            .b = (const float *)x[2] + q->row0 * Hv, .A_log = x[3], .dt_bias = x[4], .A_log_dtype = dt[3],
            .dt_bias_dtype = dt[4], .T = q->T, .Hk = at->k_heads, .Hv = Hv, .Dk = at->k_head_dim,
            .Dv = at->v_head_dim, .state_in = q->L > 0 ? v.read : NULL, .state_out = v.write,
            .out = out + q->row0 * Hv * at->v_head_dim,
        };
        OG_TRY(og_gated_delta_net_cpu(r->m->pool, &ga));
    }
    return OG_OK;
}

static og_status run_instr(const step_run *r, int32_t i) {
    const og_model *m = r->m;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const void *x[OG_OP_MAX_INPUTS] = {0};
    int64_t w[OG_OP_MAX_INPUTS] = {0};
    og_dtype dt[OG_OP_MAX_INPUTS] = {0};
    for (int32_t j = 0; j < in->n_in; j++) x[j] = operand_ptr(r, in->in[j], &w[j], &dt[j]);
    float *out = i == m->logits_instr ? r->c->logits : r->c->slots[cm_of(m)->slot_of[i]];
    og_threadpool *pool = m->pool;
    const og_op_attrs *a = &in->attrs;
    const int64_t T = r->rows;
    switch (in->op) {
    case OG_OP_EMBED: {
        const og_program_tensor *t = og_program_tensor_at(m->prog, in->in[1].index);
        return og_embed_cpu(pool, x[0], T, x[1], dt[1], t->shape[0], t->shape[1], out);
    }
    case OG_OP_RMS_NORM:
        return og_rms_norm_cpu(pool, x[0], x[1], dt[1], T, w[0], (float)a->eps, out);
    case OG_OP_HEAD_RMS_NORM:
        return og_head_rms_norm_cpu(pool, x[0], x[1], dt[1], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_MATMUL:
        return matmul(r, x[0], x[1], in->n_in > 2 ? x[2] : NULL, dt[1], w[0], in->out_width, out);
    case OG_OP_ROPE:
        return og_rope_cpu(pool, &m->rope[i], x[0], x[1], T, a->heads, out);
    case OG_OP_SWIGLU:
        return og_swiglu_cpu(pool, x[0], x[1], T, w[0], out);
    case OG_OP_ADD:
        return og_add_cpu(pool, x[0], x[1], T * w[0], out);
    case OG_OP_UPDATE_AND_ATTEND:
        return attend(r, in, x[0], x[1], x[2], out);
    case OG_OP_CAUSAL_CONV1D: {
        const og_program_tensor *wt = og_program_tensor_at(m->prog, in->in[1].index);
        return conv_sessions(r, in, x[0], x[1], dt[1], w[0], wt->shape[1], out);
    }
    case OG_OP_GATED_DELTA_NET:
        return gdn_sessions(r, in, x, dt, out);
    case OG_OP_RMS_NORM_GATED:
        return og_rms_norm_gated_cpu(pool, x[0], x[1], x[2], dt[2], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_SIGMOID_MUL:
        return og_sigmoid_mul_cpu(pool, x[0], x[1], T * w[0], out);
    case OG_OP_MOE: {
        /* rows grouped by expert across every session of the step (moe.h) */
        const og_program_tensor *gu = og_program_tensor_at(m->prog, in->in[2].index);
        og_moe_args ma = {.x = x[0], .logits = x[1], .gate_up = x[2], .gate_up_dtype = dt[2], .down = x[3],
                          .down_dtype = dt[3], .shared = in->n_in > 4 ? x[4] : NULL,
                          .shared_gate = in->n_in > 5 ? x[5] : NULL, .T = T, .H = w[0], .F = gu->shape[1] / 2,
                          .E = gu->shape[0], .top_k = (int32_t)a->top_k, .norm_topk_prob = a->norm_topk_prob != 0,
                          .out = out};
        return T > 0 ? og_moe_cpu(pool, &ma) : OG_OK;
    }
    case OG_OP_COUNT:
        break;
    }
    return og_set_error(OG_ERR_UNSUPPORTED, "op %d has no CPU kernel", (int)in->op);
}

/* The fused run of instructions [i, fuse_end[i]] over a phase of one-token
 * rows only. */
static og_status run_fused(const step_run *r, int32_t i) {
    const og_model *m = r->m;
    const cpu_model *cm = cm_of(m);
    const int32_t e = cm->fuse_end[i];
    const int32_t last_product = cm->fuse_glu[i] ? e - 1 : e;
    og_matmul_part parts[OG_MATMUL_MAX_PARTS];
    const float *x = NULL;
    int64_t K = 0;
    for (int32_t k = i; k <= last_product; k++) {
        const og_program_instr *in = og_program_instr_at(m->prog, k);
        og_dtype dt, wdt;
        int64_t w;
        x = operand_ptr(r, in->in[0], &K, &dt);
        og_matmul_part *p = &parts[k - i];
        p->weight = operand_ptr(r, in->in[1], &w, &wdt);
        p->bias = in->n_in > 2 ? operand_ptr(r, in->in[2], &w, &dt) : NULL;
        p->weight_dtype = wdt;
        p->N = in->out_width;
        p->out = r->c->slots[cm->slot_of[k]];
    }
    if (cm->fuse_glu[i])
        return og_matmul_rows_swiglu_cpu(m->pool, x, r->rows, K, &parts[0], &parts[1], r->c->slots[cm->slot_of[e]]);
    return og_matmul_rows_multi_cpu(m->pool, x, r->rows, K, parts, last_product - i + 1);
}

/* Moves the tail's rows of every value the tail reads to the front. */
static void compact_for_tail(const step_run *r) {
    const og_model *m = r->m;
    const og_step_plan *p = r->plan;
    for (int32_t j = 0; j < p->n_tail_rows; j++) {
        r->c->tokens[j] = r->c->tokens[p->tail_src[j]];
        r->c->positions[j] = r->c->positions[p->tail_src[j]];
    }
    for (int32_t i = 0; i <= m->last_attend; i++) {
        if (!cm_of(m)->tail_reads[i]) continue;
        const int64_t width = og_program_instr_at(m->prog, i)->out_width;
        float *base = r->c->slots[cm_of(m)->slot_of[i]];
        for (int32_t j = 0; j < p->n_tail_rows; j++)
            if (p->tail_src[j] != j)
                memcpy(base + (int64_t)j * width, base + (int64_t)p->tail_src[j] * width, (size_t)width * sizeof(float));
    }
}

/* Every item's output from the tail rows' logits [n_tail_rows, V] (an
 * item's allowed mask is applied to its row in place first). */
og_status og_cpu_deliver(const og_step_plan *p, float *logits, int64_t V) {
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        og_batch_item *it = q->item;
        float *row = logits + (int64_t)q->tail_row0 * V;
        if (it->allowed) og_logits_mask(row, V, it->allowed); /* one row: LOGITS_ALL takes no mask */
        switch (it->output) {
        case OG_OUTPUT_LOGITS:
        case OG_OUTPUT_LOGITS_ALL:
            memcpy(it->logits, row, (size_t)(q->tail_rows * V) * sizeof(float));
            break;
        case OG_OUTPUT_ARGMAX: {
            int64_t best = 0;
            OG_TRY(og_argmax_cpu(row, V, &best));
            it->token = (int32_t)best;
            break;
        }
        case OG_OUTPUT_SAMPLE:
            it->token = og_sampler_sample(it->sampler, row);
            break;
        default:
            break;
        }
    }
    return OG_OK;
}

static og_status cpu_step(og_model *m, og_step_ctx *c, const og_step_plan *p) {
    OG_TRY(ctx_reserve(m, c, p->n_rows, p->n_tail_rows));
    memcpy(c->tokens, p->tokens, (size_t)p->n_rows * sizeof *c->tokens);
    memcpy(c->positions, p->positions, (size_t)p->n_rows * sizeof *c->positions);
    step_run r = {m, c, p, false, p->n_rows};
    const int32_t end = p->n_tail_rows > 0 ? m->n_instrs : m->last_attend + 1;
    for (int32_t i = 0; i < end; i++) {
        if (i == m->last_attend + 1) {
            if (!p->tail_is_all) compact_for_tail(&r);
            r.tail = true;
            r.rows = p->n_tail_rows;
        }
        const int32_t first = i;
        og_status st;
        if (cm_of(m)->fuse_end[i] >= 0 && r.rows > 0 && r.rows == (r.tail ? p->n_tail_single : p->n_single)) {
            st = run_fused(&r, i);
            i = cm_of(m)->fuse_end[i];
        } else {
            st = run_instr(&r, i);
        }
        if (st != OG_OK) {
            i = first;
            const og_program_instr *in = og_program_instr_at(m->prog, i);
            return og_set_error(st, "instruction %d (%s -> %s): %s", i, og_op_get(in->op)->name, in->out,
                                og_last_error());
        }
    }
    return p->n_tail_rows > 0 ? og_cpu_deliver(p, c->logits, m->vocab) : OG_OK;
}

const og_backend_ops og_backend_cpu_ops = {
    .name = "cpu",
    .fusion = &og_fuse_rules_cpu,
    .model_init = cpu_model_init,
    .model_free = cpu_model_free,
    .session_init = cpu_session_init,
    .session_free = cpu_session_free,
    .ctx_create = cpu_ctx_create,
    .ctx_free = cpu_ctx_free,
    .step = cpu_step,
};
