/* The executor: what every back end shares (exec.h).
 *
 * A step is a transaction (DESIGN.md sections 5 and 7): og_model_step checks
 * every item, marks its sessions as stepping, prepares each session's KV
 * storage (which may grow it) and binds it; if any of that fails, every
 * session already prepared is rolled back and nothing ran. Then the back end
 * runs the step over the plan (one pass over the program for the rows of
 * all sessions), and only when it succeeded does every session commit.
 * og_session_eval and its variants are steps of one session, the input cut
 * into steps of at most max_write tokens.
 *
 * Back ends are reached through og_backend_ops only: the CPU back end
 * (backend_cpu.c) and, in CUDA builds, the CUDA back end (backend_cuda.c).
 */
#include "exec/exec.h"

#include "exec/sample.h"
#include "exec/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef OG_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

og_model_params og_model_default_params(void) {
    og_model_params p = {OG_BACKEND_AUTO, 0, 1, 1, 0, {0}};
    return p;
}

og_session_params og_session_default_params(void) {
    og_session_params p = {OG_DTYPE_COUNT, NULL};
    return p;
}

/* ------------------------------------------------------------ scratch slots */

og_status og_exec_plan_slots(int32_t n, int32_t n_steps, const int32_t *def, const int32_t *last,
                             const int64_t *width, int32_t *slot_of, int64_t *slot_width, int32_t *n_slots) {
    bool *busy = og_calloc((size_t)(n > 0 ? n : 1), sizeof *busy);
    if (!busy) return og_set_error(OG_ERR_OUT_OF_MEMORY, "executor: no memory for the scratch plan");
    *n_slots = 0;
    for (int32_t i = 0; i < n; i++) slot_of[i] = -1;
    for (int32_t k = 0; k < n_steps; k++) {
        /* outputs first, so none shares a slot with an input of its step */
        for (int32_t i = 0; i < n; i++) {
            if (def[i] != k || width[i] < 0) continue;
            int32_t best = -1;
            for (int32_t s = 0; s < *n_slots; s++) {
                if (busy[s]) continue;
                if (best < 0) {
                    best = s;
                    continue;
                }
                const bool fits = slot_width[s] >= width[i], best_fits = slot_width[best] >= width[i];
                if ((fits && (!best_fits || slot_width[s] < slot_width[best])) ||
                    (!fits && !best_fits && slot_width[s] > slot_width[best]))
                    best = s;
            }
            if (best < 0) {
                best = (*n_slots)++;
                slot_width[best] = 0;
            }
            if (slot_width[best] < width[i]) slot_width[best] = width[i];
            busy[best] = true;
            slot_of[i] = best;
        }
        for (int32_t i = 0; i < n; i++)
            if (slot_of[i] >= 0 && (last[i] == k || (def[i] == k && last[i] < 0))) busy[slot_of[i]] = false;
    }
    og_free(busy);
    return OG_OK;
}

/* ------------------------------------------------------------ models */

static const og_backend_ops *backend_ops(og_backend b) {
#ifdef OG_HAVE_CUDA
    if (b == OG_BACKEND_CUDA) return &og_backend_cuda_ops;
#endif
    (void)b;
    return &og_backend_cpu_ops;
}

/* The shard count and the devices of p: in range, a device per shard,
 * none twice. */
static og_status check_devices(const og_model_params *p) {
    if (p->tensor_parallel < 0 || p->tensor_parallel > OG_SHARD_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: tensor_parallel %d: 1 to %d shards",
                            p->tensor_parallel, OG_SHARD_MAX);
    if (p->n_devices < 0 || p->n_devices > OG_TENSOR_PARALLEL_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: n_devices %d: 0 to %d", p->n_devices,
                            OG_TENSOR_PARALLEL_MAX);
    const int32_t shards = p->tensor_parallel > 1 ? p->tensor_parallel : 1;
    if (p->n_devices > 0 && p->n_devices != shards)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: %d device%s for %d shard%s: give one device a "
                                                     "shard",
                            p->n_devices, p->n_devices == 1 ? "" : "s", shards, shards == 1 ? "" : "s");
    for (int32_t i = 0; i < p->n_devices; i++) {
        if (p->devices[i] < 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: device %d: a CUDA device ordinal is 0 or more",
                                p->devices[i]);
        for (int32_t j = 0; j < i; j++)
            if (p->devices[j] == p->devices[i])
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: device %d given twice: one shard a device",
                                    p->devices[i]);
    }
    return OG_OK;
}

og_backend og_model_params_backend(const og_model_params *params) {
    const og_model_params p = params ? *params : og_model_default_params();
    if (p.backend == OG_BACKEND_CUDA) return OG_BACKEND_CUDA;
    if (p.backend != OG_BACKEND_AUTO) return OG_BACKEND_CPU;
    if (p.n_devices > 0) return OG_BACKEND_CUDA; /* devices name GPUs */
#ifdef OG_HAVE_CUDA
    if (og_cuda_device_present()) return OG_BACKEND_CUDA;
#endif
    return OG_BACKEND_CPU;
}

/* The threads a wide step prepares its sessions on (prepare_all): the CPU
 * back end's pool, or a few of their own where the back end has none (on
 * CUDA the host prepares while the device waits, about 3 us a session:
 * 0.8 ms of a 7 ms step of 256 sessions). OG_PREPARE_PARALLEL=<sessions>
 * sets the fewest sessions a step prepares in parallel (0: never). */
static og_status start_host_pool(og_model *m) {
    m->prepare_parallel_min = 32;
    const char *env = getenv("OG_PREPARE_PARALLEL");
    if (env && *env) m->prepare_parallel_min = atoi(env) > 0 ? atoi(env) : INT32_MAX;
    if (m->pool) {
        m->host_pool = m->pool;
        return OG_OK;
    }
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int n = cpus > 4 ? 4 : (int)cpus - 1;
    if (n < 2 || m->prepare_parallel_min == INT32_MAX) return OG_OK;
    if (!(m->host_pool = m->own_host_pool = og_threadpool_create(n)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "cannot start %d threads to prepare sessions", n);
    return OG_OK;
}

og_status og_model_load(const char *path, const og_model_params *params, og_model **out) {
    if (!path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: NULL argument");
    *out = NULL;
    og_model_params p = params ? *params : og_model_default_params();
    OG_TRY(check_devices(&p));
    const og_backend backend = og_model_params_backend(&p);
#ifndef OG_HAVE_CUDA
    if (backend == OG_BACKEND_CUDA)
        return og_set_error(OG_ERR_UNSUPPORTED, "og_model_load: this build has no CUDA back end; "
                                                "use the cpu back end%s",
                            p.n_devices > 0 ? " (devices name CUDA devices)" : "");
#endif
    if (p.n_devices > 0 && backend != OG_BACKEND_CUDA)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_load: %d device%s given to the cpu back end: devices "
                                                     "name CUDA devices",
                            p.n_devices, p.n_devices == 1 ? "" : "s");
    const bool sharded = p.tensor_parallel > 1;
    if (sharded && backend == OG_BACKEND_CUDA)
        return og_set_error(OG_ERR_UNSUPPORTED, "og_model_load: tensor parallel %d on the cuda back end is not built "
                                                "yet (the cpu back end runs it in one process)",
                            p.tensor_parallel);
    og_model *m = og_calloc(1, sizeof *m);
    if (!m) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: no memory");
    pthread_mutex_init(&m->lock, NULL);
    m->backend = backend;
    m->ops = sharded ? &og_backend_cpu_tp_ops : backend_ops(backend);
    m->cuda_graphs = p.cuda_graphs != 0;
    og_status st = og_program_open(path, &m->prog);
    if (st != OG_OK) {
        pthread_mutex_destroy(&m->lock);
        og_free(m);
        return st; /* og_last_error() names the rule */
    }
    og_program_prefault(m->prog);
    m->kv = *og_program_kv_config(m->prog);
    m->n_instrs = og_program_n_instrs(m->prog);
    m->logits_instr = og_program_logits_instr(m->prog);
    m->vocab = og_program_get_model(m->prog)->vocab_size;
    m->last_attend = -1;
    m->rope = og_calloc((size_t)m->n_instrs, sizeof *m->rope);
    if (!m->rope) {
        og_model_destroy(m);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: no memory");
    }
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        if (og_op_is_stateful(in->op)) m->last_attend = i; /* KV or state: per session, every row */
        if (in->op == OG_OP_ROPE) {
            og_rope_params rp = {
                .type = in->attrs.rope_type,
                .theta = (float)in->attrs.theta,
                .factor = in->attrs.factor > 0 ? (float)in->attrs.factor : 1.0f,
                .low_freq_factor = (float)in->attrs.low_freq_factor,
                .high_freq_factor = (float)in->attrs.high_freq_factor,
                .original_max_position = (int32_t)in->attrs.original_max_position_embeddings,
                .rotary_dim = (int32_t)in->attrs.rotary_dim,
            };
            st = og_rope_table_init(&m->rope[i], (int32_t)in->attrs.head_dim, &rp);
            if (st != OG_OK) {
                og_set_error(st, "%s: instruction %d (rope): %s", path, i, og_last_error());
                og_model_destroy(m);
                return st;
            }
        }
    }
    og_fuse_program fp;
    st = og_fuse_program_of(m->prog, m->logits_instr, m->last_attend, &fp);
    if (st == OG_OK) {
        st = og_fuse_plan(&fp, m->ops->fusion, &m->steps, &m->n_steps);
        og_free((void *)fp.instr);
    }
    if (st != OG_OK) {
        og_model_destroy(m);
        return st;
    }
    const cJSON *mj = og_program_model_json(m->prog), *ref = cJSON_GetObjectItemCaseSensitive(mj, "refused_token_ids");
    if (cJSON_IsArray(ref) && cJSON_GetArraySize(ref) > 0) {
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(mj, "refused_tokens_reason"), *e;
        m->refused_reason = cJSON_IsString(why) ? why->valuestring : "the program does not take it";
        if (!(m->refused = og_calloc((size_t)cJSON_GetArraySize(ref), sizeof *m->refused))) {
            og_model_destroy(m);
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_load: no memory");
        }
        cJSON_ArrayForEach(e, ref) if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < (double)m->vocab)
            m->refused[m->n_refused++] = (int32_t)e->valuedouble;
    }
    st = m->ops->model_init(m, &p);
    if (st == OG_OK) st = start_host_pool(m);
    if (st != OG_OK) {
        og_set_error(st, "og_model_load: %s: %s back end: %s", path, m->ops->name, og_last_error());
        og_model_destroy(m);
        return st;
    }
    *out = m;
    return OG_OK;
}

void og_model_destroy(og_model *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_idle; i++) m->ops->ctx_free(m, m->idle[i]);
    og_free(m->idle);
    m->ops->model_free(m);
    og_threadpool_destroy(m->pool);
    og_threadpool_destroy(m->own_host_pool);
    og_program_close(m->prog);
    og_free(m->rope);
    og_free(m->steps);
    og_free(m->refused);
    pthread_mutex_destroy(&m->lock);
    og_free(m);
}

int64_t og_model_vocab_size(const og_model *m) { return m->vocab; }
const og_kv_config *og_model_kv_config(const og_model *m) { return &m->kv; }

og_status og_model_set_context(og_model *m, int64_t n_ctx) {
    if (!m) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_set_context: NULL model");
    const og_kv_config *prog = og_program_kv_config(m->prog);
    if (n_ctx < 0 || n_ctx > prog->max_capacity)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_model_set_context: a context of %lld tokens: the program declares at most %lld "
                            "(its max-context; export the model again with a larger --max-context)",
                            (long long)n_ctx, (long long)prog->max_capacity);
    m->kv = *prog;
    if (n_ctx == 0) return OG_OK;
    /* the storage a session reserves and grows to is bounded by n_ctx; a
     * step never writes more than the session can hold */
    m->kv.max_capacity = n_ctx;
    if (m->kv.initial_capacity > n_ctx) m->kv.initial_capacity = n_ctx;
    if (m->kv.max_write > n_ctx) m->kv.max_write = (int32_t)n_ctx;
    return OG_OK;
}
const char *og_model_tokenizer_json(const og_model *m) { return og_program_tokenizer_json(m->prog); }
const char *og_model_tokenizer_config(const og_model *m) { return og_program_tokenizer_config(m->prog); }
const char *og_model_no_tokenizer_reason(const og_model *m) {
    if (!m || og_program_tokenizer_json(m->prog)) return NULL;
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(og_program_model_json(m->prog), "no_tokenizer");
    return cJSON_IsString(why) ? why->valuestring : NULL;
}
og_backend og_model_backend(const og_model *m) { return m->backend; }

og_status og_model_metrics_get(const og_model *m, og_model_metrics *out) {
    if (!m || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_metrics_get: NULL argument");
    pthread_mutex_lock((pthread_mutex_t *)&m->lock);
    *out = m->metrics;
    pthread_mutex_unlock((pthread_mutex_t *)&m->lock);
    return OG_OK;
}

void og_model_note_graph(og_model *m, const og_step_plan *plan, int32_t bucket, bool captured) {
    pthread_mutex_lock(&m->lock);
    if (captured) {
        m->metrics.graph_captures++;
        m->metrics.bucket_captures[bucket]++;
    } else {
        m->metrics.bucket_replays[bucket]++;
    }
    pthread_mutex_unlock(&m->lock);
    if (captured)
        for (int32_t i = 0; i < plan->n_seqs; i++) og_kv_session_note_capture(plan->seqs[i].s->kv);
}

/* A step context of the model's idle ones, or a new one. */
static og_status ctx_take(og_model *m, og_step_ctx **out) {
    pthread_mutex_lock(&m->lock);
    *out = m->n_idle > 0 ? m->idle[--m->n_idle] : NULL;
    pthread_mutex_unlock(&m->lock);
    return *out ? OG_OK : m->ops->ctx_create(m, out);
}

static void ctx_give_back(og_model *m, og_step_ctx *c) {
    pthread_mutex_lock(&m->lock);
    if (m->n_idle == m->idle_cap) {
        int32_t cap = m->idle_cap ? 2 * m->idle_cap : 4;
        og_step_ctx **grown = og_realloc(m->idle, (size_t)cap * sizeof *grown);
        if (grown) {
            m->idle = grown;
            m->idle_cap = cap;
        }
    }
    bool kept = m->n_idle < m->idle_cap;
    if (kept) m->idle[m->n_idle++] = c;
    pthread_mutex_unlock(&m->lock);
    if (!kept) m->ops->ctx_free(m, c);
}

/* ------------------------------------------------------------ sessions */

og_status og_session_create(og_model *m, const og_session_params *params, og_session **out) {
    if (!m || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_create: NULL argument");
    *out = NULL;
    og_session_params p = params ? *params : og_session_default_params();
    if (p.kv_dtype != OG_DTYPE_COUNT && p.kv_dtype != OG_DTYPE_F32 && p.kv_dtype != OG_DTYPE_BF16 &&
        p.kv_dtype != OG_DTYPE_INT8 && p.kv_dtype != OG_DTYPE_FP8)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_create: kv dtype %s is not bf16, f32, int8 or fp8",
                            og_dtype_name(p.kv_dtype));
    og_session *s = og_calloc(1, sizeof *s);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_create: no memory");
    s->m = m;
    s->cfg = m->kv;
    if (p.kv_dtype != OG_DTYPE_COUNT) s->cfg.kv_dtype = p.kv_dtype;
    s->kv_alloc = p.kv_allocator;
    atomic_init(&s->stepping, 0);
    og_status st = m->ops->session_init(s);
    s->kv_alloc = NULL; /* copied by the KV session, if used */
    if (st == OG_OK) st = og_program_bindings_create(m->prog, &s->bind);
    if (st != OG_OK) {
        og_session_destroy(s);
        return st;
    }
    *out = s;
    return OG_OK;
}

void og_session_destroy(og_session *s) {
    if (!s) return;
    og_program_bindings_destroy(s->bind);
    s->m->ops->session_free(s);
    og_kv_session_destroy(s->kv); /* a back end that freed it left NULL */
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

/* ------------------------------------------------------------ the step */

/* Rows of the tail an item's output needs. */
static int32_t tail_rows_of(const og_batch_item *it) {
    if (it->output == OG_OUTPUT_NONE) return 0;
    return it->output == OG_OUTPUT_LOGITS_ALL ? it->n_tokens : 1;
}

/* Refuses what no back end can run, naming the item; changes nothing. */
static og_status check_items(og_model *m, og_batch_item *items, int32_t n) {
    const int32_t max_write = og_program_kv_config(m->prog)->max_write;
    for (int32_t i = 0; i < n; i++) {
        og_batch_item *it = &items[i];
        og_session *s = it->session;
        if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: no session", i);
        if (s->m != m)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: the session belongs to another model", i);
        if (it->n_tokens < 1 || !it->tokens)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: %s", i,
                                it->n_tokens < 1 ? "no tokens (n_tokens < 1)" : "tokens is NULL");
        if (it->n_tokens > max_write)
            return og_set_error(OG_ERR_WRITE_TOO_WIDE,
                                "og_model_step: item %d: %d tokens exceed the program's max_write %d (one step "
                                "writes at most max_write; og_session_eval splits longer inputs)",
                                i, it->n_tokens, max_write);
        for (int32_t t = 0; t < it->n_tokens; t++) {
            if (it->tokens[t] < 0 || it->tokens[t] >= m->vocab)
                return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                    "og_model_step: item %d: token id %d at index %d is outside [0, %lld)", i,
                                    it->tokens[t], t, (long long)m->vocab);
            for (int32_t k = 0; k < m->n_refused; k++)
                if (it->tokens[t] == m->refused[k])
                    return og_set_error(OG_ERR_UNSUPPORTED, "og_model_step: item %d: token id %d at index %d is refused: %s",
                                        i, it->tokens[t], t, m->refused_reason);
        }
        if ((unsigned)it->output >= OG_OUTPUT_COUNT)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: unknown output %d", i,
                                (int)it->output);
        if ((it->output == OG_OUTPUT_LOGITS || it->output == OG_OUTPUT_LOGITS_ALL) && !it->logits)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: a logits output with logits NULL", i);
        if (it->output == OG_OUTPUT_SAMPLE) {
            if (!it->sampler)
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: item %d: a sample output with no sampler", i);
            if (og_sampler_vocab(it->sampler) != m->vocab)
                return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                    "og_model_step: item %d: the sampler is for a vocabulary of %lld, the model has %lld",
                                    i, (long long)og_sampler_vocab(it->sampler), (long long)m->vocab);
        }
        if (it->allowed && it->output != OG_OUTPUT_ARGMAX && it->output != OG_OUTPUT_SAMPLE &&
            it->output != OG_OUTPUT_LOGITS)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "og_model_step: item %d: an allowed mask needs an ARGMAX, SAMPLE or LOGITS output", i);
        /* the same session twice is found when its stepping flag is taken */
        for (int32_t j = 0; j < i && it->output == OG_OUTPUT_SAMPLE; j++)
            if (items[j].output == OG_OUTPUT_SAMPLE && items[j].sampler == it->sampler)
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: items %d and %d share one sampler", j, i);
    }
    return OG_OK;
}

typedef struct step_buffers {
    og_step_seq *seqs;
    int32_t *tokens, *positions, *tail_src;
} step_buffers;

static void plan_free(og_step_plan *p) {
    og_free(p->seqs);
    og_free(p->tokens);
    og_free(p->positions);
    og_free(p->tail_src);
}

/* Group of an item in row order: one-token steps, then wider steps that need
 * at most one tail row, then those that need all of theirs. */
static int group_of(const og_batch_item *it) {
    if (it->n_tokens == 1) return 0;
    return tail_rows_of(it) <= 1 ? 1 : 2;
}

/* The plan of a step whose sessions are prepared (their lengths are L). */
static og_status plan_build(og_batch_item *items, int32_t n, og_step_plan *p) {
    memset(p, 0, sizeof *p);
    int64_t rows = 0;
    for (int32_t i = 0; i < n; i++) rows += items[i].n_tokens;
    if (rows > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: %lld rows in one step", (long long)rows);
    p->n_seqs = n;
    p->n_rows = (int32_t)rows;
    p->seqs = og_calloc((size_t)n, sizeof *p->seqs);
    p->tokens = og_malloc((size_t)rows * sizeof *p->tokens);
    p->positions = og_malloc((size_t)rows * sizeof *p->positions);
    p->tail_src = og_malloc((size_t)rows * sizeof *p->tail_src);
    if (!p->seqs || !p->tokens || !p->positions || !p->tail_src) {
        plan_free(p);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_step: no memory for the plan of %lld rows", (long long)rows);
    }
    int32_t k = 0, row = 0;
    for (int g = 0; g < 3; g++)
        for (int32_t i = 0; i < n; i++) {
            og_batch_item *it = &items[i];
            if (group_of(it) != g) continue;
            og_step_seq *q = &p->seqs[k++];
            q->s = it->session;
            q->item = it;
            q->T = it->n_tokens;
            q->L = og_kv_session_length(it->session->kv);
            q->row0 = row;
            q->tail_rows = tail_rows_of(it);
            for (int32_t t = 0; t < q->T; t++) {
                p->tokens[row + t] = it->tokens[t];
                p->positions[row + t] = (int32_t)(q->L + t);
            }
            if (g == 0) p->n_single++;
            row += q->T;
        }
    /* tail rows: single-row outputs first (groups 0 and 1 in row order),
     * then every row of the LOGITS_ALL steps: increasing step rows */
    int32_t j = 0;
    for (int32_t i = 0; i < n; i++) {
        og_step_seq *q = &p->seqs[i];
        q->tail_row0 = j;
        if (q->tail_rows == 1) p->tail_src[j++] = q->row0 + q->T - 1;
    }
    p->n_tail_single = j;
    for (int32_t i = 0; i < n; i++) {
        og_step_seq *q = &p->seqs[i];
        if (q->tail_rows <= 1) continue;
        q->tail_row0 = j;
        for (int32_t t = 0; t < q->T; t++) p->tail_src[j++] = q->row0 + t;
    }
    p->n_tail_rows = j;
    p->tail_is_all = j == p->n_rows;
    p->decode_only = p->n_single == n;
    return OG_OK;
}

/* Prepares (and binds) one session for T tokens; on failure it is as it was. */
static og_status begin_session(og_session *s, int32_t T) {
    const int64_t L = og_kv_session_length(s->kv);
    og_status st = og_kv_session_prepare(s->kv, T);
    if (st != OG_OK)
        return og_errbuf_set(&s->err, st, "step of %d tokens at length %lld: %s", T, (long long)L,
                             og_kv_session_last_error(s->kv));
    og_program_bindings_clear(s->bind);
    st = og_program_bind_kv(s->bind, s->kv);
    if (st == OG_OK) st = og_program_bindings_check(s->bind);
    if (st != OG_OK) {
        og_kv_session_rollback(s->kv);
        return og_errbuf_set(&s->err, st, "step refused: %s", og_program_bindings_last_error(s->bind));
    }
    return OG_OK;
}

/* Prepares the n items' sessions, all or nothing, naming the first item
 * (in item order) that failed. A wide step prepares on the host pool
 * (og_model.host_pool) in ranges of sessions: each prepare
 * touches only its own session (and the allocator, which is safe across
 * threads), so the result is the one the calling thread alone gives, but
 * for which sessions after a failed one were prepared (and rolled back
 * with the rest). A range is a quarter of a thread's share. */
typedef struct prepare_job {
    og_model *m;
    og_batch_item *items;
    int32_t n, range;
    og_status *st; /* [n] */
} prepare_job;

static void prepare_range(void *ctx, int64_t r, int thread) {
    (void)thread;
    const prepare_job *j = ctx;
    const int64_t end = (r + 1) * j->range < j->n ? (r + 1) * j->range : j->n;
    const og_status ready = j->m->ops->host_thread ? j->m->ops->host_thread(j->m) : OG_OK;
    for (int64_t i = r * j->range; i < end; i++) {
        og_session *s = j->items[i].session;
        j->st[i] = ready != OG_OK ? og_errbuf_set(&s->err, ready, "preparing thread: %s", og_last_error())
                                  : begin_session(s, j->items[i].n_tokens);
    }
}

static og_status prepare_all(og_model *m, og_batch_item *items, int32_t n) {
    og_status st = OG_OK;
    if (!m->host_pool || n < m->prepare_parallel_min) {
        for (int32_t i = 0; i < n; i++) {
            og_session *s = items[i].session;
            if ((st = begin_session(s, items[i].n_tokens)) != OG_OK) {
                for (int32_t k = 0; k < i; k++) og_kv_session_rollback(items[k].session->kv);
                return og_set_error(st, "og_model_step: item %d: %s", i, s->err.msg);
            }
        }
        return OG_OK;
    }
    og_status *sts = og_malloc((size_t)n * sizeof *sts);
    if (!sts) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_model_step: no memory for %d items", n);
    const int32_t ranges = 4 * og_threadpool_size(m->host_pool);
    prepare_job j = {m, items, n, (n + ranges - 1) / ranges, sts};
    og_parallel_for(m->host_pool, (n + j.range - 1) / j.range, prepare_range, &j);
    int32_t failed = -1;
    for (int32_t i = 0; i < n && failed < 0; i++)
        if (sts[i] != OG_OK) failed = i;
    if (failed >= 0) {
        for (int32_t k = 0; k < n; k++)
            if (sts[k] == OG_OK) og_kv_session_rollback(items[k].session->kv);
        st = og_set_error(sts[failed], "og_model_step: item %d: %s", failed, items[failed].session->err.msg);
    }
    og_free(sts);
    return st;
}

static void release(og_batch_item *items, int32_t n) {
    for (int32_t i = 0; i < n; i++) atomic_store(&items[i].session->stepping, 0);
}

og_status og_model_step(og_model *m, og_batch_item *items, int32_t n) {
    if (!m || !items) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: NULL argument");
    if (n < 1) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: no items (n_items %d)", n);
    og_status st = check_items(m, items, n);
    if (st != OG_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        int expected = 0;
        if (!atomic_compare_exchange_strong(&items[i].session->stepping, &expected, 1)) {
            release(items, i);
            for (int32_t j = 0; j < i; j++) /* taken by this call: an item repeats it */
                if (items[j].session == items[i].session)
                    return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_model_step: items %d and %d are the same session",
                                        j, i);
            return og_set_error(OG_ERR_STATE, "og_model_step: item %d: the session is already in a step", i);
        }
    }
    const double t0 = og_time_now();
    st = prepare_all(m, items, n);
    if (st != OG_OK) {
        release(items, n);
        return st;
    }
    og_step_plan plan;
    st = plan_build(items, n, &plan);
    if (st != OG_OK) {
        for (int32_t i = 0; i < n; i++) og_kv_session_rollback(items[i].session->kv);
        release(items, n);
        return st;
    }
    double wait = 0;
    plan.wait_seconds = &wait;
    const double t1 = og_time_now();
    og_step_ctx *c = NULL;
    st = ctx_take(m, &c);
    if (st == OG_OK) {
        st = m->ops->step(m, c, &plan);
        ctx_give_back(m, c);
    }
    const double t2 = og_time_now();
    if (st != OG_OK) {
        char cause[OG_ERRMSG_CAP];
        snprintf(cause, sizeof cause, "%s", og_last_error());
        for (int32_t i = 0; i < n; i++) {
            og_kv_session_rollback(items[i].session->kv);
            og_errbuf_set(&items[i].session->err, st, "step at length %lld: %s",
                          (long long)og_kv_session_length(items[i].session->kv), cause);
        }
        og_set_error(st, "og_model_step: %s", cause);
    } else {
        for (int32_t i = 0; i < n; i++) og_kv_session_commit(items[i].session->kv, items[i].n_tokens);
        const double t3 = og_time_now();
        pthread_mutex_lock(&m->lock);
        m->metrics.steps++;
        m->metrics.rows += plan.n_rows;
        m->metrics.prepare_seconds += t1 - t0;
        m->metrics.submit_seconds += t2 - t1 - wait;
        m->metrics.wait_seconds += wait;
        m->metrics.finish_seconds += t3 - t2;
        pthread_mutex_unlock(&m->lock);
    }
    plan_free(&plan);
    release(items, n);
    return st;
}

/* ------------------------------------------------------------ one session */

/* Feeds n tokens to one session in steps of at most max_write (or chunk);
 * the last step's output is `last`, earlier steps' NONE (or LOGITS_ALL into
 * logits + done * V when every row is wanted). */
static og_status eval_steps(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, og_batch_item last) {
    const int64_t V = s->m->vocab;
    int64_t step = s->cfg.max_write;
    if (chunk > 0 && chunk < step) step = chunk;
    for (int64_t done = 0; done < n;) {
        const int32_t T = (int32_t)(n - done < step ? n - done : step);
        og_batch_item it = {.session = s, .tokens = tokens + done, .n_tokens = T};
        if (last.output == OG_OUTPUT_LOGITS_ALL) {
            it.output = OG_OUTPUT_LOGITS_ALL;
            it.logits = last.logits + done * V;
        } else if (done + T == n) {
            it.output = last.output;
            it.logits = last.logits;
            it.sampler = last.sampler;
        }
        og_status st = og_model_step(s->m, &it, 1);
        if (st != OG_OK) {
            /* the session's own words, without the batch's "item 0" */
            const char *why = og_last_error();
            const char *prefix = "og_model_step: item 0: ";
            if (!strncmp(why, prefix, strlen(prefix))) why += strlen(prefix);
            else if (!strncmp(why, "og_model_step: ", 15)) why += 15;
            char cause[OG_ERRMSG_CAP];
            snprintf(cause, sizeof cause, "%s", why);
            return og_errbuf_set(&s->err, st, "%s", cause);
        }
        if (done + T == n) s->last_token = it.token;
        done += T;
    }
    return OG_OK;
}

og_status og_session_eval(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, float *logits,
                          int all_rows) {
    if (!s || (!tokens && n > 0)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval: no tokens");
    og_batch_item last = {.output = !logits ? OG_OUTPUT_NONE : all_rows ? OG_OUTPUT_LOGITS_ALL : OG_OUTPUT_LOGITS,
                          .logits = logits};
    return eval_steps(s, tokens, n, chunk, last);
}

og_status og_session_eval_next(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, int32_t *next) {
    if (!s || !next || (!tokens && n > 0))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval_next: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval_next: no tokens");
    og_status st = eval_steps(s, tokens, n, chunk, (og_batch_item){.output = OG_OUTPUT_ARGMAX});
    if (st == OG_OK) *next = s->last_token;
    return st;
}

og_status og_session_eval_sample(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                 og_sampler *sampler, int32_t *next) {
    if (!s || !sampler || !next || (!tokens && n > 0))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_eval_sample: NULL argument");
    if (n <= 0) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "og_session_eval_sample: no tokens");
    if (og_sampler_vocab(sampler) != s->m->vocab)
        return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT,
                             "og_session_eval_sample: the sampler is for a vocabulary of %lld, the model has %lld",
                             (long long)og_sampler_vocab(sampler), (long long)s->m->vocab);
    og_status st = eval_steps(s, tokens, n, chunk, (og_batch_item){.output = OG_OUTPUT_SAMPLE, .sampler = sampler});
    if (st == OG_OK) *next = s->last_token;
    return st;
}

/* ------------------------------------------------------------ fork */

#include "kv/kv.h"

og_status og_session_checkpoint(og_session *s) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_checkpoint: session is NULL");
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->stepping, &expected, 1))
        return og_set_error(OG_ERR_STATE, "og_session_checkpoint: the session is in a step");
    og_status st = og_kv_session_checkpoint(s->kv);
    atomic_store(&s->stepping, 0);
    if (st != OG_OK) og_errbuf_set(&s->err, st, "%s", og_kv_session_last_error(s->kv));
    return st;
}

int64_t og_session_fork_point(const og_session *s, int64_t at_most) {
    return s ? og_kv_session_fork_point(s->kv, at_most) : -1;
}

og_status og_session_fork(og_session *parent, int64_t at_length, og_session **out) {
    if (!parent || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_fork: NULL argument");
    *out = NULL;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&parent->stepping, &expected, 1))
        return og_set_error(OG_ERR_STATE, "og_session_fork: the parent is in a step");
    og_session_params p = og_session_default_params();
    p.kv_dtype = parent->cfg.kv_dtype;
    /* the CPU back end takes the parent's allocator, so that the child can
     * map the parent's memory; CUDA sessions each have a VMM allocator of
     * their own, which shares across sessions */
    if (parent->m->backend != OG_BACKEND_CUDA) p.kv_allocator = og_kv_session_allocator(parent->kv);
    og_session *c = NULL;
    og_kv_session *kv = NULL;
    og_status st = og_session_create(parent->m, &p, &c);
    if (st == OG_OK) st = og_kv_session_fork(parent->kv, at_length, og_kv_session_allocator(c->kv), &kv);
    atomic_store(&parent->stepping, 0);
    if (st != OG_OK) {
        char cause[OG_ERRMSG_CAP];
        snprintf(cause, sizeof cause, "%s", og_last_error());
        og_session_destroy(c);
        og_errbuf_set(&parent->err, st, "og_session_fork at %lld: %s", (long long)at_length, cause);
        return og_set_error(st, "og_session_fork at %lld: %s", (long long)at_length, cause);
    }
    og_kv_session_destroy(c->kv);
    c->kv = kv;
    *out = c;
    return OG_OK;
}
