/* The executor: runs a program's instructions for one session's step.
 *
 * A step is a transaction (DESIGN.md section 5): the executor reads the step
 * width, asks the KV manager to prepare it (which may grow storage and move
 * it), binds the session's storage to the program's runtime tensors, runs
 * every instruction, and commits only when all of them succeeded. Inputs
 * longer than max_write are cut into steps by the executor.
 *
 * Activations are f32 rows [T, width]. Each instruction's output lives in a
 * scratch slot of the session; slots are shared between values whose
 * lifetimes do not overlap (planned once per model, see plan_slots).
 *
 * Every layer after the last update_and_attend works row by row, so when only
 * the last position's logits are wanted those instructions run on the last
 * row alone, and when no logits are wanted they do not run at all.
 */
#include "exec/exec.h"

#include "kernels/attend.h"
#include "kernels/ops.h"
#include "model/sample.h"

#include <math.h>
#include <stdio.h>

#ifdef OG_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

og_model_params og_model_default_params(void) {
    og_model_params p = {OG_BACKEND_AUTO, 0, 1};
    return p;
}

og_session_params og_session_default_params(void) {
    og_session_params p = {OG_DTYPE_COUNT};
    return p;
}

/* ------------------------------------------------------------ the plan */

/* Index of the instruction producing an activation operand, or -1. */
static int32_t producer(og_program_operand o) { return o.kind == OG_VALUE_ACTIVATION ? o.index : -1; }

/* Assigns a scratch slot to every instruction output but the logits, so that
 * no slot holds two values alive at once and no output shares a slot with an
 * input of its own instruction. Greedy in program order: an output takes the
 * narrowest free slot that is wide enough, else widens a free one, else opens
 * a new one; a slot is freed after the last instruction that reads it. */
static og_status plan_slots(og_model *m) {
    const int32_t n = m->n_instrs;
    int32_t *last_use = og_malloc((size_t)n * sizeof *last_use);
    m->slot_of = og_malloc((size_t)n * sizeof *m->slot_of);
    m->slot_width = og_malloc((size_t)n * sizeof *m->slot_width);
    bool *busy = og_calloc((size_t)n, sizeof *busy);
    if (!last_use || !m->slot_of || !m->slot_width || !busy) {
        og_free(last_use);
        og_free(busy);
        return og_errbuf_set(&m->err, OG_ERR_OUT_OF_MEMORY, "executor: no memory for the plan");
    }
    for (int32_t i = 0; i < n; i++) last_use[i] = -1;
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        for (int32_t j = 0; j < in->n_in; j++) {
            int32_t p = producer(in->in[j]);
            if (p >= 0) last_use[p] = i;
        }
    }
    m->n_slots = 0;
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        m->slot_of[i] = -1;
        if (i != m->logits_instr) {
            int32_t best = -1;
            for (int32_t s = 0; s < m->n_slots; s++) {
                if (busy[s]) continue;
                if (best < 0) { best = s; continue; }
                bool fits = m->slot_width[s] >= in->out_width;
                bool best_fits = m->slot_width[best] >= in->out_width;
                if ((fits && (!best_fits || m->slot_width[s] < m->slot_width[best])) ||
                    (!fits && !best_fits && m->slot_width[s] > m->slot_width[best]))
                    best = s;
            }
            if (best < 0) {
                best = m->n_slots++;
                m->slot_width[best] = 0;
            }
            if (m->slot_width[best] < in->out_width) m->slot_width[best] = in->out_width;
            busy[best] = true;
            m->slot_of[i] = best;
        }
        /* free the slots whose value this instruction read for the last time */
        for (int32_t j = 0; j < in->n_in; j++) {
            int32_t p = producer(in->in[j]);
            if (p >= 0 && last_use[p] == i && m->slot_of[p] >= 0) busy[m->slot_of[p]] = false;
        }
        if (last_use[i] < 0 && m->slot_of[i] >= 0) busy[m->slot_of[i]] = false;
    }
    og_free(last_use);
    og_free(busy);
    return OG_OK;
}

/* ------------------------------------------------------------ models */

og_status og_model_load(const char *path, const og_model_params *params, og_model **out) {
    if (!path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: NULL argument");
    *out = NULL;
    og_model_params p = params ? *params : og_model_default_params();
    og_backend backend = p.backend == OG_BACKEND_CUDA ? OG_BACKEND_CUDA : OG_BACKEND_CPU;
#ifdef OG_HAVE_CUDA
    if (p.backend == OG_BACKEND_AUTO && og_cuda_device_present()) backend = OG_BACKEND_CUDA;
#else
    if (backend == OG_BACKEND_CUDA)
        return og_set_error(OG_ERR_UNSUPPORTED, "og_model_load: this build has no CUDA back end; "
                                                "use the cpu back end");
#endif
    og_model *m = og_calloc(1, sizeof *m);
    if (!m) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: no memory");
    m->backend = backend;
    m->cuda_graphs = p.cuda_graphs != 0;
    og_status st = og_program_open(path, &m->prog);
    if (st != OG_OK) {
        og_free(m);
        return st; /* og_last_error() names the rule */
    }
    og_program_prefault(m->prog);
    m->n_instrs = og_program_n_instrs(m->prog);
    m->logits_instr = og_program_logits_instr(m->prog);
    m->last_attend = -1;
    m->rope = og_calloc((size_t)m->n_instrs, sizeof *m->rope);
    if (!m->rope) {
        og_model_free(m);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: no memory");
    }
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        if (in->op == OG_OP_UPDATE_AND_ATTEND) m->last_attend = i;
        if (in->op == OG_OP_ROPE) {
            og_rope_params rp = {
                .type = in->attrs.rope_type,
                .theta = (float)in->attrs.theta,
                .factor = in->attrs.factor > 0 ? (float)in->attrs.factor : 1.0f,
                .low_freq_factor = (float)in->attrs.low_freq_factor,
                .high_freq_factor = (float)in->attrs.high_freq_factor,
                .original_max_position = (int32_t)in->attrs.original_max_position_embeddings,
            };
            st = og_rope_table_init(&m->rope[i], (int32_t)in->attrs.head_dim, &rp);
            if (st != OG_OK) {
                og_set_error(st, "%s: instruction %d (rope): %s", path, i, og_last_error());
                og_model_free(m);
                return st;
            }
        }
    }
    st = plan_slots(m);
    if (st != OG_OK) {
        og_model_free(m);
        return st;
    }
#ifdef OG_HAVE_CUDA
    if (m->backend == OG_BACKEND_CUDA) {
        st = og_exec_cuda_model_init(m);
        if (st != OG_OK) {
            og_set_error(st, "og_model_load: %s: %s", path, og_last_error());
            og_model_free(m);
            return st;
        }
        *out = m;
        return OG_OK;
    }
#endif
    m->pool = p.n_threads == 1 ? NULL : og_threadpool_create(p.n_threads);
    if (p.n_threads != 1 && !m->pool) {
        og_model_free(m);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: cannot start threads");
    }
    *out = m;
    return OG_OK;
}

void og_model_free(og_model *m) {
    if (!m) return;
#ifdef OG_HAVE_CUDA
    og_exec_cuda_model_free(m);
#endif
    og_threadpool_destroy(m->pool);
    og_program_close(m->prog);
    og_free(m->rope);
    og_free(m->slot_of);
    og_free(m->slot_width);
    og_free(m);
}

int64_t og_model_vocab_size(const og_model *m) { return og_program_get_model(m->prog)->vocab_size; }
const og_kv_config *og_model_kv_config(const og_model *m) { return og_program_kv_config(m->prog); }
const char *og_model_tokenizer_json(const og_model *m) { return og_program_tokenizer_json(m->prog); }
const char *og_model_tokenizer_config(const og_model *m) { return og_program_tokenizer_config(m->prog); }
og_backend og_model_backend(const og_model *m) { return m->backend; }
const og_program *og_model_program(const og_model *m) { return m->prog; }

/* ------------------------------------------------------------ sessions */

og_status og_session_create(og_model *m, const og_session_params *params, og_session **out) {
    if (!m || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_create: NULL argument");
    *out = NULL;
    og_session_params p = params ? *params : og_session_default_params();
    const og_kv_config *decl = og_program_kv_config(m->prog);
    og_session *s = og_calloc(1, sizeof *s);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_create: no memory");
    s->m = m;
    s->cfg = *decl;
    if (p.kv_dtype != OG_DTYPE_COUNT) {
        if (p.kv_dtype != OG_DTYPE_F32 && p.kv_dtype != OG_DTYPE_BF16) {
            og_free(s);
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_create: kv dtype %s is not bf16 or f32",
                                og_dtype_name(p.kv_dtype));
        }
        s->cfg.kv_dtype = p.kv_dtype;
    }
    og_status st = OG_OK;
#ifdef OG_HAVE_CUDA
    if (m->backend == OG_BACKEND_CUDA) {
        st = og_exec_cuda_session_init(s); /* device storage and scratch */
        if (st == OG_OK) st = og_program_bindings_create(m->prog, &s->bind);
        if (st != OG_OK) {
            og_session_destroy(s);
            return st;
        }
        *out = s;
        return OG_OK;
    }
#endif
    st = og_kv_session_create(&s->cfg, NULL, &s->kv);
    if (st == OG_OK) st = og_program_bindings_create(m->prog, &s->bind);
    const int64_t rows = s->cfg.max_write;
    if (st == OG_OK) {
        s->slots = og_calloc((size_t)m->n_slots, sizeof *s->slots);
        s->positions = og_malloc((size_t)rows * sizeof *s->positions);
        if (!s->slots || !s->positions) st = OG_ERR_OUT_OF_MEMORY;
        for (int32_t i = 0; st == OG_OK && i < m->n_slots; i++) {
            s->slots[i] = og_malloc((size_t)(rows * m->slot_width[i]) * sizeof(float));
            if (!s->slots[i]) st = OG_ERR_OUT_OF_MEMORY;
        }
        if (st != OG_OK) og_set_error(st, "og_session_create: no memory for %d scratch slots of %lld rows",
                                      m->n_slots, (long long)rows);
    }
    if (st != OG_OK) {
        og_session_destroy(s);
        return st;
    }
    *out = s;
    return OG_OK;
}

void og_session_destroy(og_session *s) {
    if (!s) return;
    if (s->slots)
        for (int32_t i = 0; i < s->m->n_slots; i++) og_free(s->slots[i]);
    og_free(s->slots);
    og_free(s->positions);
    og_free(s->last_logits);
    og_program_bindings_destroy(s->bind);
#ifdef OG_HAVE_CUDA
    og_exec_cuda_session_free(s); /* frees s->kv on its stream */
#endif
    og_kv_session_destroy(s->kv);
    og_free(s);
}

void og_session_reset(og_session *s) {
    if (s) og_kv_session_reset(s->kv);
}

int64_t og_session_length(const og_session *s) { return og_kv_session_length(s->kv); }

og_status og_session_metrics(const og_session *s, og_kv_metrics *out) {
    return og_kv_session_metrics(s->kv, out);
}

const og_kv_session *og_session_kv(const og_session *s) { return s->kv; }

const char *og_session_last_error(const og_session *s) { return s->err.msg; }

/* ------------------------------------------------------------ one step */

/* Where operand o of a row-range starting at `row` lives. */
typedef struct step_ctx {
    og_session *s;
    const int32_t *tokens; /* [T]            */
    int32_t T;
    float *logits;         /* this step's logits destination, or NULL */
    bool tail_last_row;    /* the tail runs on row T-1 alone          */
} step_ctx;

static const void *operand_ptr(const step_ctx *c, og_program_operand o, int64_t row, int64_t *width,
                               og_dtype *dtype) {
    const og_model *m = c->s->m;
    if (o.kind == OG_VALUE_TENSOR) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, o.index);
        *dtype = t->dtype;
        *width = t->rank >= 2 ? t->shape[t->rank - 1] : t->shape[0];
        return t->data;
    }
    *dtype = OG_DTYPE_F32;
    if (o.kind == OG_VALUE_INPUT) {
        *width = 1;
        return o.index == OG_INPUT_TOKENS ? (const void *)(c->tokens + row)
                                          : (const void *)(c->s->positions + row);
    }
    const og_program_instr *p = og_program_instr_at(m->prog, o.index);
    *width = p->out_width;
    return c->s->slots[m->slot_of[o.index]] + row * p->out_width;
}

static og_status run_instr(step_ctx *c, int32_t i) {
    og_session *s = c->s;
    const og_model *m = s->m;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const bool tail = c->tail_last_row && i > m->last_attend;
    const int64_t T = tail ? 1 : c->T;
    /* values made before the tail keep all T rows: the tail reads the last */
    const void *x[OG_OP_MAX_INPUTS] = {0};
    int64_t w[OG_OP_MAX_INPUTS] = {0};
    og_dtype dt[OG_OP_MAX_INPUTS] = {0};
    for (int32_t j = 0; j < in->n_in; j++) {
        og_program_operand o = in->in[j];
        bool full_rows = o.kind == OG_VALUE_INPUT || (o.kind == OG_VALUE_ACTIVATION && o.index <= m->last_attend);
        int64_t row = tail && full_rows ? c->T - 1 : 0;
        x[j] = operand_ptr(c, o, row, &w[j], &dt[j]);
    }
    float *out = i == m->logits_instr ? c->logits : s->slots[m->slot_of[i]];
    og_threadpool *pool = m->pool;
    const og_op_attrs *a = &in->attrs;
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
        /* A bf16 program's prefill multiplies bf16-rounded activations, as
         * transformers does in bf16; decode (one row, bound by streaming the
         * weights) keeps f32 activations, which cost nothing there. */
        if (T > 1 && og_program_get_model(m->prog)->activation_dtype == OG_DTYPE_BF16)
            return og_matmul_bf16_cpu(pool, x[0], x[1], in->n_in > 2 ? x[2] : NULL, dt[1], T, w[0], in->out_width, out);
        return og_matmul_cpu(pool, x[0], x[1], in->n_in > 2 ? x[2] : NULL, dt[1], T, w[0], in->out_width, out);
    case OG_OP_ROPE:
        return og_rope_cpu(pool, &m->rope[i], x[0], x[1], T, a->heads, out);
    case OG_OP_SWIGLU:
        return og_swiglu_cpu(pool, x[0], x[1], T, w[0], out);
    case OG_OP_ADD:
        return og_add_cpu(pool, x[0], x[1], T * w[0], out);
    case OG_OP_UPDATE_AND_ATTEND: {
        og_attend_args aa = {
            .q = x[0], .k = x[1], .v = x[2], .positions = x[3], .out = out,
            .T = (int32_t)T, .n_heads = (int32_t)a->n_heads, .scale = (float)a->scale,
        };
        og_status st = og_kv_session_layer_view(s->kv, in->kv_index, &aa.kv);
        if (st != OG_OK) return st;
        return og_update_and_attend_cpu(&aa, pool, NULL);
    }
    case OG_OP_COUNT:
        break;
    }
    return og_set_error(OG_ERR_UNSUPPORTED, "instruction %d: op %d has no CPU kernel", i, (int)in->op);
}

og_status og_exec_begin_step(og_session *s, int32_t T) {
    const int64_t L = og_kv_session_length(s->kv);
    og_status st = og_kv_session_prepare(s->kv, T);
    if (st != OG_OK)
        return og_errbuf_set(&s->err, st, "step of %d tokens at length %lld: %s", T, (long long)L,
                             og_kv_session_last_error(s->kv));
    og_program_bindings_clear(s->bind);
    st = og_program_bind_kv(s->bind, s->kv);
    if (st == OG_OK) st = og_program_bindings_check(s->bind);
    if (st != OG_OK) {
        og_kv_session_abort(s->kv);
        return og_errbuf_set(&s->err, st, "step refused: %s", og_program_bindings_last_error(s->bind));
    }
    return OG_OK;
}

/* One transaction of T <= max_write tokens. */
static og_status run_step(og_session *s, const int32_t *tokens, int32_t T, float *logits, bool last_row) {
    const og_model *m = s->m;
    const int64_t L = og_kv_session_length(s->kv);
    og_status st = og_exec_begin_step(s, T);
    if (st != OG_OK) return st;
    for (int32_t t = 0; t < T; t++) s->positions[t] = (int32_t)(L + t);
    step_ctx c = {s, tokens, T, logits, last_row};
    /* without a logits destination nothing after the last attention matters */
    const int32_t end = logits ? m->n_instrs : m->last_attend + 1;
    for (int32_t i = 0; i < end; i++) {
        st = run_instr(&c, i);
        if (st != OG_OK) {
            og_kv_session_abort(s->kv);
            return og_errbuf_set(&s->err, st, "instruction %d (%s -> %s) at length %lld: %s", i,
                                 og_op_get(og_program_instr_at(m->prog, i)->op)->name,
                                 og_program_instr_at(m->prog, i)->out, (long long)L, og_last_error());
        }
    }
    st = og_kv_session_commit(s->kv, T);
    if (st != OG_OK) return og_errbuf_set(&s->err, st, "commit: %s", og_kv_session_last_error(s->kv));
    return OG_OK;
}

og_status og_session_eval(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, float *logits,
                          int all_rows) {
    if (!s || (!tokens && n > 0)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval: no tokens");
#ifdef OG_HAVE_CUDA
    if (s->cuda) return og_exec_cuda_eval(s, tokens, n, chunk, logits, all_rows, NULL);
#endif
    const int64_t V = og_model_vocab_size(s->m);
    int64_t step = s->cfg.max_write;
    if (chunk > 0 && chunk < step) step = chunk;
    for (int64_t done = 0; done < n;) {
        int32_t T = (int32_t)(n - done < step ? n - done : step);
        bool last = done + T == n;
        float *dst = NULL;
        if (logits && all_rows) dst = logits + done * V;
        else if (logits && last) dst = logits;
        og_status st = run_step(s, tokens + done, T, dst, logits && !all_rows);
        if (st != OG_OK) return st;
        done += T;
    }
    return OG_OK;
}

/* og_session_eval of the last row into the session's own logits row
 * (the CPU side of eval_next and eval_sample). */
static og_status eval_last_row(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, const char *what,
                               float **row) {
    if (!s->last_logits) s->last_logits = og_malloc((size_t)og_model_vocab_size(s->m) * sizeof *s->last_logits);
    if (!s->last_logits) return og_errbuf_set(&s->err, OG_ERR_OUT_OF_MEMORY, "%s: no memory for logits", what);
    *row = s->last_logits;
    return og_session_eval(s, tokens, n, chunk, s->last_logits, 0);
}

og_status og_session_eval_next(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, int32_t *next) {
    if (!s || !next || (!tokens && n > 0))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval_next: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval_next: no tokens");
#ifdef OG_HAVE_CUDA
    if (s->cuda) return og_exec_cuda_eval(s, tokens, n, chunk, NULL, 0, next);
#endif
    float *logits = NULL;
    og_status st = eval_last_row(s, tokens, n, chunk, "og_session_eval_next", &logits);
    int64_t best = 0;
    if (st == OG_OK) st = og_argmax_cpu(logits, og_model_vocab_size(s->m), &best);
    if (st == OG_OK) *next = (int32_t)best;
    return st;
}

og_status og_session_eval_sample(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                 og_sampler *sampler, int32_t *next) {
    if (!s || !sampler || !next || (!tokens && n > 0))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval_sample: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval_sample: no tokens");
    const int64_t V = og_model_vocab_size(s->m);
    if (og_sampler_vocab(sampler) != V)
        return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT,
                             "og_session_eval_sample: the sampler is for a vocabulary of %lld, the model has %lld",
                             (long long)og_sampler_vocab(sampler), (long long)V);
#ifdef OG_HAVE_CUDA
    if (s->cuda) return og_exec_cuda_eval_sample(s, tokens, n, chunk, sampler, next);
#endif
    float *logits = NULL;
    og_status st = eval_last_row(s, tokens, n, chunk, "og_session_eval_sample", &logits);
    if (st == OG_OK) *next = og_sampler_sample(sampler, logits);
    return st;
}
