/* The CUDA executor: the step transaction of exec.c with every instruction on
 * the device.
 *
 * A model uploads its weights (as stored: bf16 or f32) and rope tables once.
 * A session owns a non-blocking stream on which everything of it is ordered:
 * its KV storage (og_kv_allocator_cuda_vmm of kv/alloc_cuda.h: flat layers
 * reserve address space for max_capacity rows once and grow by mapping
 * memory at the end, so their addresses never move; without virtual memory
 * management growth copies to a larger block, ordered on the stream before
 * the step that reads it), its activation slots
 * (the model's slot plan, [max_write, slot_width] f32 each), the attention
 * scratch, the logits and a small "step block" in device memory holding the
 * step's L, tokens and positions. Kernels read L and positions from the step
 * block, never from launch arguments, so a captured decode graph serves every
 * decode step: the step block's upload from pinned host memory is a node of
 * the graph, and the host writes the pinned block before each replay.
 *
 * Decode graphs: one-token steps replay a graph per output kind (none, logits
 * of the row, arg-max token, sampled token); a graph is captured on first use
 * and again only when some layer's storage address changed, which growth in
 * place never does (so a session captures once per kind used), and growth by
 * copy (no virtual memory management) does, or, for the sampled token, when
 * the sampler block had to grow. Flat layers' kernels never read the
 * allocated row count, so a graph stays valid across growth in place. Every
 * capture is counted in the session's metrics (og_kv_session_note_capture).
 *
 * Sampling on the device (og_exec_cuda_eval_sample): the sampler's per-step
 * inputs (its draw, parameters and recent tokens) go into a second pinned
 * block, the "sampler block", uploaded by a node of the graph like the step
 * block; the forbidden-token bitmap changes rarely, so it is uploaded ahead
 * of the step only when it differs from the last upload. The sampling kernel
 * (kernels/cuda/sample_cuda.h) runs after the logits and only the token comes
 * back. What that kernel does not serve (og_sample_cuda_supported) is sampled
 * on the host from the logits.
 *
 * Matrix products: up to OG_GEMV_CUDA_MAX_T rows stream the weights once
 * (gemv, f32 activations); wider steps go to cuBLAS: f32 weights by SGEMM,
 * bf16 weights by two bf16 tensor-core products of the activations split
 * into bf16 hi + lo parts (f32 accumulation), which keeps the activations to
 * about 2^-17 relative, close to the CPU's f32 products.
 *
 * Fusions: at load the program is cut into launch steps. Most steps are
 * one instruction; these patterns become one launch each (the CPU executor
 * runs the program as written):
 *   add -> rms_norm of its sum            add_rms_norm (both outputs written)
 *   head_rms_norm -> its only reader rope head_norm_rope (the normed heads
 *                                          are never written); two such
 *                                          pairs (q and k) share a launch
 *   matmul gate, matmul up -> swiglu      gemv_swiglu (gate and up written
 *                                          only by steps wider than the gemv)
 *   consecutive matmuls of one input      gemv_multi (e.g. q, k, v)
 *   add -> rms_norm -> the products of    the products' gemv, computing the
 *   the normed value (one step above)     norm itself (the normed value is
 *                                          never written)
 * The steps get their own scratch slot plan (the greedy plan of exec.c over
 * steps instead of instructions), so a step never writes a slot another
 * value still needs, whichever instruction of it the program listed first.
 *
 * Every step ends with a stream synchronization, so that a failed kernel
 * fails its own step (which then does not commit) and the pinned step block
 * is free for the next one.
 */
#include "exec/exec.h"

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/sample_cuda.h"
#include "kv/alloc_cuda.h"
#include "model/sample.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <string.h>

enum { OUT_NONE = 0, OUT_LOGITS, OUT_NEXT, OUT_SAMPLE, OUT_KINDS };

enum { STEP_ONE = 0, STEP_ADD_NORM, STEP_NORM_ROPE, STEP_GATE_UP, STEP_GEMVS };
#define STEP_MAX_INSTRS (OG_GEMV_CUDA_MAX_PARTS + 2)
/* Output features up to which a product takes an add + norm prologue (below
 * a vocabulary; measured: the prologue cost the logits product 75 us of 94). */
#define NORM_PROLOGUE_MAX_ROWS 16384

/* One launch step: kind, and its instructions in program order (gate, up,
 * swiglu for STEP_GATE_UP). A product step may begin with a prologue of
 * n_pre = 2 instructions, the add and the rms_norm that make its input,
 * folded into its gemv. */
typedef struct cuda_step {
    int kind;
    int32_t n, n_pre;
    int32_t instr[STEP_MAX_INSTRS];
} cuda_step;

struct og_cuda_model {
    int device;
    void **weights;  /* [n_tensors]: device copy of every weight tensor, NULL for runtime ones */
    float *inv_freq; /* [n_instrs, OG_ROPE_MAX_HEAD_DIM / 2]: rope tables */
    cuda_step *steps; /* [n_steps] in execution order */
    int32_t n_steps;
    int32_t *slot_of;   /* [n_instrs]: scratch slot of each output, -1 when never written */
    int64_t *slot_width;/* [n_slots] */
    int32_t n_slots;
};

struct og_cuda_session {
    cudaStream_t stream;
    og_kv_allocator alloc;
    cublasHandle_t blas;
    float **slots;              /* [n_slots] of [max_write, slot_width]    */
    float *logits_row;          /* [V]: last-row logits (graphs use it)    */
    float *logits_rows;         /* [logits_rows_cap, V]: all-rows mode     */
    int64_t logits_rows_cap;
    float *partials;            /* attention split scratch                 */
    uint16_t *split_hi, *split_lo; /* [max_write * max K] bf16 parts       */
    int64_t max_k;
    unsigned char *step_host;   /* pinned step block: L, tokens, positions */
    unsigned char *step_dev;    /* its device copy                         */
    size_t step_bytes;
    int32_t *next_host;         /* pinned [1] */
    int32_t *next_dev;          /* [1] */
    void *argmax_scratch;       /* og_argmax_cuda_scratch_bytes() */
    /* device sampling, allocated on first use: */
    unsigned char *sample_host; /* pinned sampler block: og_sample_cuda_step, recent ids [sample_recent_cap] */
    unsigned char *sample_dev;  /* its device copy                         */
    size_t sample_bytes;
    int32_t sample_recent_cap;
    uint32_t *forbidden_dev;    /* [W] forbidden-token bitmap              */
    uint32_t *forbidden_seen;   /* [W] host copy of what was uploaded      */
    bool forbidden_valid;       /* forbidden_seen holds an upload          */
    uint32_t *marks_dev;        /* [W] sampler scratch, zero between steps */
    cudaGraphExec_t graph[OUT_KINDS];
    void **graph_storage;       /* [2 * n_layers]: k, v addresses the graphs hold */
};

/* ------------------------------------------------------------ helpers */

static og_status cuda_fail(cudaError_t e, const char *what) {
    og_status st = e == cudaErrorMemoryAllocation ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND;
    return og_set_error(st, "cuda executor: %s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}
#define CUDA_TRY(call, what)                                                                                       \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(e_, what);                                                         \
    } while (0)

static og_status blas_fail(cublasStatus_t e, const char *what) {
    return og_set_error(OG_ERR_BACKEND, "cuda executor: %s: cuBLAS status %d", what, (int)e);
}

/* The step block: int64 L, then int32 tokens [max_write], positions [max_write]. */
static int64_t *step_length_dev(struct og_cuda_session *c) { return (int64_t *)(void *)c->step_dev; }
static int32_t *step_tokens(unsigned char *block) { return (int32_t *)(void *)(block + sizeof(int64_t)); }
static int32_t *step_positions(unsigned char *block, int32_t max_write) { return step_tokens(block) + max_write; }
/* The sampler block: og_sample_cuda_step, then the recent ids [sample_recent_cap]. */
static int32_t *sample_recent(unsigned char *block) { return (int32_t *)(void *)(block + sizeof(og_sample_cuda_step)); }

/* ------------------------------------------------------------ fusion plan */

static int32_t producer(og_program_operand o) { return o.kind == OG_VALUE_ACTIVATION ? o.index : -1; }
static bool same_operand(og_program_operand a, og_program_operand b) { return a.kind == b.kind && a.index == b.index; }

typedef struct plan_ctx {
    const og_model *m;
    int32_t *uses;   /* [n]: operand references of each output */
    int32_t *anchor; /* [n]: first instruction of its group, -1 when alone */
    cuda_step *group;/* [n]: the group anchored at i */
} plan_ctx;

static const og_program_instr *at(const plan_ctx *c, int32_t i) { return og_program_instr_at(c->m->prog, i); }

/* i may join a group: not yet grouped, not the logits, on the same side of
 * the last attention as the group's first instruction (the tail runs on one row). */
static bool joinable(const plan_ctx *c, int32_t i, int32_t first) {
    const og_model *m = c->m;
    return c->anchor[i] < 0 && i != m->logits_instr && (i > m->last_attend) == (first > m->last_attend);
}

static void add_group(plan_ctx *c, int kind, int32_t n, const int32_t *members) {
    int32_t a = members[0];
    for (int32_t k = 1; k < n; k++)
        if (members[k] < a) a = members[k];
    cuda_step *g = &c->group[a];
    g->kind = kind;
    g->n = n;
    for (int32_t k = 0; k < n; k++) {
        g->instr[k] = members[k];
        c->anchor[members[k]] = a;
    }
}

static bool weights_alike(const og_model *m, const og_program_instr *a, const og_program_instr *b) {
    const og_program_tensor *wa = og_program_tensor_at(m->prog, a->in[1].index);
    const og_program_tensor *wb = og_program_tensor_at(m->prog, b->in[1].index);
    return a->in[1].kind == OG_VALUE_TENSOR && b->in[1].kind == OG_VALUE_TENSOR && wa->dtype == wb->dtype &&
           a->n_in == b->n_in;
}

static void find_groups(plan_ctx *c) {
    const og_model *m = c->m;
    const int32_t n = m->n_instrs;
    for (int32_t i = 0; i + 1 < n; i++) { /* add -> rms_norm of the sum */
        const og_program_instr *a = at(c, i), *b = at(c, i + 1);
        if (a->op == OG_OP_ADD && b->op == OG_OP_RMS_NORM && producer(b->in[0]) == i && joinable(c, i, i) &&
            joinable(c, i + 1, i))
            add_group(c, STEP_ADD_NORM, 2, (int32_t[]){i, i + 1});
    }
    for (int32_t i = 0; i < n; i++) { /* head_rms_norm -> rope, its only reader */
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_HEAD_RMS_NORM || c->uses[i] != 1 || !joinable(c, i, i)) continue;
        int32_t j = i + 1;
        while (j < n && producer(at(c, j)->in[0]) != i) j++;
        if (j == n) continue;
        const og_program_instr *r = at(c, j);
        if (r->op == OG_OP_ROPE && r->attrs.heads == a->attrs.heads && joinable(c, j, i) &&
            (int64_t)m->rope[j].head_dim * a->attrs.heads == a->out_width)
            add_group(c, STEP_NORM_ROPE, 2, (int32_t[]){i, j});
    }
    for (int32_t a = 0; a < n; a++) { /* two head norm + rope pairs (q and k) -> one launch */
        if (c->anchor[a] != a || c->group[a].kind != STEP_NORM_ROPE || c->group[a].n != 2) continue;
        for (int32_t b = a + 1; b < n; b++) {
            if (c->anchor[b] != b || c->group[b].kind != STEP_NORM_ROPE || c->group[b].n != 2 ||
                (a > m->last_attend) != (b > m->last_attend))
                continue;
            /* b may run at a's place when every value it reads exists by then */
            const int32_t p = producer(at(c, b)->in[0]);
            if (p >= a) break;
            const cuda_step first = c->group[a], second = c->group[b];
            add_group(c, STEP_NORM_ROPE, 4,
                      (int32_t[]){first.instr[0], first.instr[1], second.instr[0], second.instr[1]});
            break;
        }
    }
    for (int32_t s = 0; s < n; s++) { /* gate and up products -> swiglu */
        const og_program_instr *sw = at(c, s);
        if (sw->op != OG_OP_SWIGLU) continue;
        const int32_t g = producer(sw->in[0]), u = producer(sw->in[1]);
        if (g < 0 || u < 0 || g == u || c->uses[g] != 1 || c->uses[u] != 1) continue;
        const og_program_instr *gi = at(c, g), *ui = at(c, u);
        const int32_t first = g < u ? g : u;
        if (gi->op == OG_OP_MATMUL && ui->op == OG_OP_MATMUL && same_operand(gi->in[0], ui->in[0]) &&
            weights_alike(m, gi, ui) && gi->out_width == ui->out_width && joinable(c, g, first) &&
            joinable(c, u, first) && joinable(c, s, first))
            add_group(c, STEP_GATE_UP, 3, (int32_t[]){g, u, s});
    }
    for (int32_t i = 0; i < n; i++) { /* consecutive products of one input */
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_MATMUL || !joinable(c, i, i)) continue;
        int32_t members[STEP_MAX_INSTRS] = {i}, k = 1;
        for (int32_t j = i + 1; j < n && k < STEP_MAX_INSTRS; j++) {
            const og_program_instr *b = at(c, j);
            if (b->op != OG_OP_MATMUL || !joinable(c, j, i) || !same_operand(a->in[0], b->in[0]) ||
                !weights_alike(m, a, b))
                break;
            members[k++] = j;
        }
        if (k > 1) add_group(c, STEP_GEMVS, k, members);
    }
}

/* Outputs a step writes (into outs): every member's but a fused norm's. */
static int32_t step_outputs(const og_model *m, const cuda_step *st, int32_t *outs) {
    int32_t k = 0;
    for (int32_t j = 0; j < st->n; j++) {
        const int32_t i = st->instr[j];
        if (i == m->logits_instr || (st->kind == STEP_NORM_ROPE && j % 2 == 0)) continue; /* norms stay unwritten */
        outs[k++] = i;
    }
    return k;
}

static bool step_has(const cuda_step *st, int32_t i) {
    for (int32_t j = 0; j < st->n; j++)
        if (st->instr[j] == i) return true;
    return false;
}

/* The greedy slot plan of exec.c, over steps: an output takes the narrowest
 * free slot wide enough, else widens a free one, else opens one; a slot is
 * freed after the last step that reads it. */
static og_status plan_step_slots(og_model *m, struct og_cuda_model *cm) {
    const int32_t n = m->n_instrs;
    int32_t *last_use = og_malloc((size_t)n * sizeof *last_use);
    bool *busy = og_calloc((size_t)n, sizeof *busy);
    cm->slot_of = og_malloc((size_t)n * sizeof *cm->slot_of);
    cm->slot_width = og_calloc((size_t)n, sizeof *cm->slot_width);
    og_status st = OG_OK;
    if (!last_use || !busy || !cm->slot_of || !cm->slot_width) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda back end: no memory for the step plan");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) last_use[i] = -1, cm->slot_of[i] = -1;
    for (int32_t k = 0; k < cm->n_steps; k++) {
        const cuda_step *sp = &cm->steps[k];
        for (int32_t j = 0; j < sp->n; j++) {
            const og_program_instr *in = og_program_instr_at(m->prog, sp->instr[j]);
            for (int32_t o = 0; o < in->n_in; o++) {
                const int32_t p = producer(in->in[o]);
                if (p >= 0 && !step_has(sp, p)) last_use[p] = k;
            }
        }
    }
    for (int32_t k = 0; k < cm->n_steps; k++) {
        const cuda_step *sp = &cm->steps[k];
        int32_t outs[STEP_MAX_INSTRS];
        const int32_t n_out = step_outputs(m, sp, outs);
        for (int32_t o = 0; o < n_out; o++) {
            const int64_t width = og_program_instr_at(m->prog, outs[o])->out_width;
            int32_t best = -1;
            for (int32_t s = 0; s < cm->n_slots; s++) {
                if (busy[s]) continue;
                if (best < 0) {
                    best = s;
                    continue;
                }
                const bool fits = cm->slot_width[s] >= width, best_fits = cm->slot_width[best] >= width;
                if ((fits && (!best_fits || cm->slot_width[s] < cm->slot_width[best])) ||
                    (!fits && !best_fits && cm->slot_width[s] > cm->slot_width[best]))
                    best = s;
            }
            if (best < 0) best = cm->n_slots++;
            if (cm->slot_width[best] < width) cm->slot_width[best] = width;
            busy[best] = true;
            cm->slot_of[outs[o]] = best;
        }
        for (int32_t j = 0; j < sp->n; j++) {
            const og_program_instr *in = og_program_instr_at(m->prog, sp->instr[j]);
            for (int32_t o = 0; o < in->n_in; o++) {
                const int32_t p = producer(in->in[o]);
                if (p >= 0 && last_use[p] == k && cm->slot_of[p] >= 0) busy[cm->slot_of[p]] = false;
            }
        }
        for (int32_t o = 0; o < n_out; o++)
            if (last_use[outs[o]] < 0) busy[cm->slot_of[outs[o]]] = false;
    }
done:
    og_free(last_use);
    og_free(busy);
    return st;
}

/* True when every reader of the norm's output is a product of step p (its
 * input operand), so the add + norm can become p's gemv prologue. */
static bool takes_prologue(const plan_ctx *c, const cuda_step *p, int32_t norm) {
    if (p->n_pre || !(p->kind == STEP_GEMVS || p->kind == STEP_GATE_UP ||
                      (p->kind == STEP_ONE && at(c, p->instr[0])->op == OG_OP_MATMUL)))
        return false;
    if ((p->instr[0] > c->m->last_attend) != (norm > c->m->last_attend)) return false; /* rows differ in the tail */
    int32_t reads = 0;
    for (int32_t j = 0; j < p->n; j++) {
        const og_program_instr *in = at(c, p->instr[j]);
        for (int32_t o = 0; o < in->n_in; o++)
            if (producer(in->in[o]) == norm) {
                if (in->op != OG_OP_MATMUL || o != 0) return false;
                reads++;
            }
    }
    /* every block of the gemv norms x for itself: worth it for a few waves of
     * blocks, not for a vocabulary-wide product */
    int64_t rows = 0;
    for (int32_t j = 0; j < p->n; j++)
        if (at(c, p->instr[j])->op == OG_OP_MATMUL) rows += at(c, p->instr[j])->out_width;
    return reads > 0 && reads == c->uses[norm] && rows <= NORM_PROLOGUE_MAX_ROWS;
}

/* An add + rms_norm step directly followed by the products of its normed
 * output joins them as their prologue (one launch fewer). */
static void fold_norm_prologues(const plan_ctx *c, struct og_cuda_model *cm) {
    int32_t kept = 0;
    for (int32_t k = 0; k < cm->n_steps; k++) {
        cuda_step *sp = &cm->steps[k];
        if (sp->kind == STEP_ADD_NORM && k + 1 < cm->n_steps && takes_prologue(c, &cm->steps[k + 1], sp->instr[1])) {
            cuda_step *next = &cm->steps[k + 1];
            memmove(next->instr + 2, next->instr, (size_t)next->n * sizeof *next->instr);
            next->instr[0] = sp->instr[0];
            next->instr[1] = sp->instr[1];
            next->n += 2;
            next->n_pre = 2;
            continue; /* the add + norm step itself is dropped */
        }
        cm->steps[kept++] = *sp;
    }
    cm->n_steps = kept;
}

static og_status plan_steps(og_model *m, struct og_cuda_model *cm) {
    const int32_t n = m->n_instrs;
    plan_ctx c = {m, og_calloc((size_t)n, sizeof(int32_t)), og_malloc((size_t)n * sizeof(int32_t)),
                  og_calloc((size_t)n, sizeof(cuda_step))};
    cm->steps = og_calloc((size_t)n, sizeof *cm->steps);
    og_status st = OG_OK;
    if (!c.uses || !c.anchor || !c.group || !cm->steps) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda back end: no memory for the step plan");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        c.anchor[i] = -1;
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        for (int32_t j = 0; j < in->n_in; j++) {
            const int32_t p = producer(in->in[j]);
            if (p >= 0) c.uses[p]++;
        }
    }
    find_groups(&c);
    for (int32_t i = 0; i < n; i++) {
        if (c.anchor[i] == i) cm->steps[cm->n_steps++] = c.group[i];
        else if (c.anchor[i] < 0) cm->steps[cm->n_steps++] = (cuda_step){STEP_ONE, 1, 0, {i}};
    }
    fold_norm_prologues(&c, cm);
    st = plan_step_slots(m, cm);
done:
    og_free(c.uses);
    og_free(c.anchor);
    og_free(c.group);
    return st;
}

/* ------------------------------------------------------------ models */

og_status og_exec_cuda_model_init(og_model *m) {
    if (!og_cuda_device_present()) return og_set_error(OG_ERR_NO_DEVICE, "cuda back end: no CUDA device is present");
    struct og_cuda_model *cm = og_calloc(1, sizeof *cm);
    if (!cm) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda back end: no memory");
    m->cuda = cm;
    CUDA_TRY(cudaGetDevice(&cm->device), "cudaGetDevice");
    const int32_t n_tensors = og_program_n_tensors(m->prog);
    cm->weights = og_calloc((size_t)n_tensors, sizeof *cm->weights);
    if (!cm->weights) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda back end: no memory");
    for (int32_t i = 0; i < n_tensors; i++) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, i);
        if (t->binding != OG_BINDING_WEIGHT || t->nbytes == 0) continue;
        char what[160];
        snprintf(what, sizeof what, "uploading weight %s (%llu bytes)", t->name, (unsigned long long)t->nbytes);
        CUDA_TRY(cudaMalloc(&cm->weights[i], (size_t)t->nbytes), what);
        CUDA_TRY(cudaMemcpy(cm->weights[i], t->data, (size_t)t->nbytes, cudaMemcpyHostToDevice), what);
    }
    const size_t per = OG_ROPE_MAX_HEAD_DIM / 2;
    const size_t bytes = (size_t)m->n_instrs * per * sizeof(float);
    CUDA_TRY(cudaMalloc((void **)&cm->inv_freq, bytes), "rope tables");
    for (int32_t i = 0; i < m->n_instrs; i++) {
        if (og_program_instr_at(m->prog, i)->op != OG_OP_ROPE) continue;
        CUDA_TRY(cudaMemcpy(cm->inv_freq + (size_t)i * per, m->rope[i].inv_freq, per * sizeof(float),
                            cudaMemcpyHostToDevice),
                 "rope tables");
    }
    return plan_steps(m, cm);
}

void og_exec_cuda_model_free(og_model *m) {
    struct og_cuda_model *cm = m->cuda;
    if (!cm) return;
    if (cm->weights)
        for (int32_t i = 0; i < og_program_n_tensors(m->prog); i++) cudaFree(cm->weights[i]);
    cudaFree(cm->inv_freq);
    og_free(cm->weights);
    og_free(cm->steps);
    og_free(cm->slot_of);
    og_free(cm->slot_width);
    og_free(cm);
    m->cuda = NULL;
}

/* ------------------------------------------------------------ sessions */

static void drop_graphs(struct og_cuda_session *c) {
    for (int k = 0; k < OUT_KINDS; k++) {
        if (c->graph[k]) cudaGraphExecDestroy(c->graph[k]);
        c->graph[k] = NULL;
    }
}

og_status og_exec_cuda_session_init(og_session *s) {
    og_model *m = s->m;
    struct og_cuda_session *c = og_calloc(1, sizeof *c);
    if (!c) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda session: no memory");
    s->cuda = c;
    CUDA_TRY(cudaSetDevice(m->cuda->device), "cudaSetDevice");
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    og_status st = og_kv_allocator_cuda_vmm(c->stream, &c->alloc);
    if (st == OG_OK) st = og_kv_session_create(&s->cfg, &c->alloc, &s->kv);
    if (st != OG_OK) return st;
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        return blas_fail(bs, "cublasCreate");
    }
    if ((bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasSetStream");

    const int32_t mw = s->cfg.max_write;
    const int64_t V = og_model_vocab_size(m);
    c->slots = og_calloc((size_t)m->cuda->n_slots, sizeof *c->slots);
    c->graph_storage = og_calloc((size_t)s->cfg.n_layers * 2, sizeof *c->graph_storage);
    if (!c->slots || !c->graph_storage) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda session: no memory");
    for (int32_t i = 0; i < m->cuda->n_slots; i++)
        CUDA_TRY(cudaMalloc((void **)&c->slots[i], (size_t)mw * (size_t)m->cuda->slot_width[i] * sizeof(float)),
                 "activation slots");
    CUDA_TRY(cudaMalloc((void **)&c->logits_row, (size_t)V * sizeof(float)), "logits");
    int64_t scratch = 0;
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        if (in->op == OG_OP_UPDATE_AND_ATTEND) {
            const og_kv_layer_config *l = &s->cfg.layers[in->kv_index];
            int64_t f = og_attend_cuda_scratch_floats((int32_t)in->attrs.n_heads, l->head_dim);
            if (f > scratch) scratch = f;
        } else if (in->op == OG_OP_MATMUL) {
            const og_program_operand x = in->in[0];
            int64_t K = x.kind == OG_VALUE_ACTIVATION ? og_program_instr_at(m->prog, x.index)->out_width : 0;
            if (K > c->max_k) c->max_k = K;
        }
    }
    if (scratch > 0) { /* its split counters start at zero; every step leaves them so */
        CUDA_TRY(cudaMalloc((void **)&c->partials, (size_t)scratch * sizeof(float)), "attention scratch");
        CUDA_TRY(cudaMemset(c->partials, 0, (size_t)scratch * sizeof(float)), "attention scratch");
    }
    if (mw > OG_GEMV_CUDA_MAX_T && c->max_k > 0) {
        const size_t parts = (size_t)mw * (size_t)c->max_k * sizeof(uint16_t);
        CUDA_TRY(cudaMalloc((void **)&c->split_hi, parts), "matmul scratch");
        CUDA_TRY(cudaMalloc((void **)&c->split_lo, parts), "matmul scratch");
    }
    c->step_bytes = sizeof(int64_t) + 2 * (size_t)mw * sizeof(int32_t);
    CUDA_TRY(cudaMallocHost((void **)&c->step_host, c->step_bytes), "pinned step block");
    CUDA_TRY(cudaMalloc((void **)&c->step_dev, c->step_bytes), "step block");
    CUDA_TRY(cudaMallocHost((void **)&c->next_host, sizeof(int32_t)), "pinned token");
    CUDA_TRY(cudaMalloc((void **)&c->next_dev, sizeof(int32_t)), "token");
    CUDA_TRY(cudaMalloc(&c->argmax_scratch, og_argmax_cuda_scratch_bytes()), "arg-max scratch");
    return OG_OK;
}

void og_exec_cuda_session_free(og_session *s) {
    struct og_cuda_session *c = s->cuda;
    if (!c) return;
    drop_graphs(c);
    og_kv_session_destroy(s->kv); /* frees storage on c->stream */
    s->kv = NULL;
    og_kv_allocator_cuda_release(&c->alloc);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    if (c->slots)
        for (int32_t i = 0; i < s->m->cuda->n_slots; i++) cudaFree(c->slots[i]);
    cudaFree(c->logits_row);
    cudaFree(c->logits_rows);
    cudaFree(c->partials);
    cudaFree(c->split_hi);
    cudaFree(c->split_lo);
    cudaFree(c->step_dev);
    cudaFree(c->next_dev);
    cudaFree(c->argmax_scratch);
    cudaFree(c->sample_dev);
    cudaFree(c->forbidden_dev);
    cudaFree(c->marks_dev);
    cudaFreeHost(c->step_host);
    cudaFreeHost(c->next_host);
    cudaFreeHost(c->sample_host);
    og_free(c->forbidden_seen);
    if (c->stream) cudaStreamDestroy(c->stream);
    og_free(c->slots);
    og_free(c->graph_storage);
    og_free(c);
    s->cuda = NULL;
}

/* ------------------------------------------------------------ one step */

typedef struct step_ctx {
    og_session *s;
    int32_t T;
    float *logits;      /* device destination of the logits instruction */
    bool tail_last_row; /* the tail runs on row T-1 alone */
} step_ctx;

static const void *operand_dev(const step_ctx *x, og_program_operand o, int64_t row, int64_t *width,
                               og_dtype *dtype) {
    const og_model *m = x->s->m;
    struct og_cuda_session *c = x->s->cuda;
    if (o.kind == OG_VALUE_TENSOR) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, o.index);
        *dtype = t->dtype;
        *width = t->rank >= 2 ? t->shape[t->rank - 1] : t->shape[0];
        return m->cuda->weights[o.index];
    }
    *dtype = OG_DTYPE_F32;
    if (o.kind == OG_VALUE_INPUT) {
        *width = 1;
        return o.index == OG_INPUT_TOKENS ? (const void *)(step_tokens(c->step_dev) + row)
                                          : (const void *)(step_positions(c->step_dev, x->s->cfg.max_write) + row);
    }
    const og_program_instr *p = og_program_instr_at(m->prog, o.index);
    *width = p->out_width;
    const int32_t slot = m->cuda->slot_of[o.index];
    return slot >= 0 ? c->slots[slot] + row * p->out_width : NULL; /* NULL: a fused step's unwritten value */
}

static og_status matmul(og_session *s, const float *x, const void *w, const void *bias, og_dtype dt, int64_t T,
                        int64_t K, int64_t N, float *out) {
    struct og_cuda_session *c = s->cuda;
    if (T <= OG_GEMV_CUDA_MAX_T) return og_gemv_cuda(c->stream, x, w, bias, dt, T, K, N, out);
    if (T > INT32_MAX || K > INT32_MAX || N > INT32_MAX || K > c->max_k)
        return og_set_error(OG_ERR_UNSUPPORTED, "matmul: %lld x %lld x %lld exceeds the cuBLAS path", (long long)T,
                            (long long)K, (long long)N);
    const float one = 1.0f, zero = 0.0f;
    const float *beta = &zero;
    if (bias) {
        og_status st = og_fill_rows_cuda(c->stream, bias, dt, T, N, out);
        if (st != OG_OK) return st;
        beta = &one;
    }
    cublasStatus_t bs;
    if (dt == OG_DTYPE_F32) {
        bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, w, (int)K, x, (int)K, beta,
                         out, (int)N);
        return bs == CUBLAS_STATUS_SUCCESS ? OG_OK : blas_fail(bs, "cublasSgemm");
    }
    og_status st = og_split_bf16_cuda(c->stream, x, T * K, c->split_hi, c->split_lo);
    if (st != OG_OK) return st;
    /* out[T, N] row-major is out^T [N, T] column-major = W^T-as-stored . x^T */
    bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, w, CUDA_R_16BF, (int)K,
                      c->split_hi, CUDA_R_16BF, (int)K, beta, out, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, w, CUDA_R_16BF, (int)K,
                          c->split_lo, CUDA_R_16BF, (int)K, &one, out, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    return bs == CUBLAS_STATUS_SUCCESS ? OG_OK : blas_fail(bs, "cublasGemmEx bf16");
}

/* The device operands of instruction i (the tail reads full-row values at
 * row T-1), its output, and the rows it runs on (returned). */
typedef struct instr_io {
    const void *v[OG_OP_MAX_INPUTS];
    int64_t w[OG_OP_MAX_INPUTS];
    og_dtype dt[OG_OP_MAX_INPUTS];
    float *out;
} instr_io;

static int64_t instr_operands(const step_ctx *x, int32_t i, instr_io *io) {
    const og_model *m = x->s->m;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    const bool tail = x->tail_last_row && i > m->last_attend;
    memset(io, 0, sizeof *io);
    for (int32_t j = 0; j < in->n_in; j++) {
        og_program_operand o = in->in[j];
        bool full_rows = o.kind == OG_VALUE_INPUT || (o.kind == OG_VALUE_ACTIVATION && o.index <= m->last_attend);
        int64_t row = tail && full_rows ? x->T - 1 : 0;
        io->v[j] = operand_dev(x, o, row, &io->w[j], &io->dt[j]);
    }
    const int32_t slot = m->cuda->slot_of[i];
    io->out = i == m->logits_instr ? x->logits : slot >= 0 ? x->s->cuda->slots[slot] : NULL; /* NULL: never written */
    return tail ? 1 : x->T;
}

static og_status run_instr(step_ctx *x, int32_t i) {
    og_session *s = x->s;
    const og_model *m = s->m;
    struct og_cuda_session *c = s->cuda;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    instr_io io;
    const int64_t T = instr_operands(x, i, &io);
    const void *const *v = io.v;
    const int64_t *w = io.w;
    const og_dtype *dt = io.dt;
    float *out = io.out;
    const og_op_attrs *a = &in->attrs;
    switch (in->op) {
    case OG_OP_EMBED: {
        const og_program_tensor *t = og_program_tensor_at(m->prog, in->in[1].index);
        return og_embed_cuda(c->stream, v[0], T, v[1], dt[1], t->shape[0], t->shape[1], out);
    }
    case OG_OP_RMS_NORM:
        return og_rms_norm_cuda(c->stream, v[0], v[1], dt[1], T, w[0], (float)a->eps, out);
    case OG_OP_HEAD_RMS_NORM:
        return og_head_rms_norm_cuda(c->stream, v[0], v[1], dt[1], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_MATMUL:
        return matmul(s, v[0], v[1], in->n_in > 2 ? v[2] : NULL, dt[1], T, w[0], in->out_width, out);
    case OG_OP_ROPE:
        return og_rope_cuda(c->stream, m->cuda->inv_freq + (size_t)i * (OG_ROPE_MAX_HEAD_DIM / 2),
                            m->rope[i].head_dim, v[0], v[1], T, a->heads, out);
    case OG_OP_SWIGLU:
        return og_swiglu_cuda(c->stream, v[0], v[1], T * w[0], out);
    case OG_OP_ADD:
        return og_add_cuda(c->stream, v[0], v[1], T * w[0], out);
    case OG_OP_UPDATE_AND_ATTEND: {
        og_attend_cuda_args aa = {
            .q = v[0], .k = v[1], .v = v[2], .out = out, .T = (int32_t)T, .n_heads = (int32_t)a->n_heads,
            .scale = (float)a->scale, .length = step_length_dev(c), .partials = c->partials,
        };
        og_status st = og_kv_session_layer_view(s->kv, in->kv_index, &aa.kv);
        if (st != OG_OK) return st;
        return og_update_and_attend_cuda(c->stream, &aa);
    }
    case OG_OP_COUNT:
        break;
    }
    return og_set_error(OG_ERR_UNSUPPORTED, "instruction %d: op %d has no CUDA kernel", i, (int)in->op);
}

/* One launch step: a fused kernel, or its instructions one by one where the
 * step is wider than the fused kernel serves. *failed names the instruction
 * whose launch failed. */
/* Runs instructions one by one; *failed names the one whose launch failed. */
static og_status run_each(step_ctx *x, const int32_t *instrs, int32_t n, int32_t *failed) {
    for (int32_t k = 0; k < n; k++) {
        *failed = instrs[k];
        og_status st = run_instr(x, instrs[k]);
        if (st != OG_OK) return st;
    }
    return OG_OK;
}

/* The add + rms_norm prologue of step sp as a gemv's norm input, when the
 * step's rows take the gemv path and fit its shared memory. */
static bool norm_prologue(step_ctx *x, const cuda_step *sp, og_gemv_cuda_norm *nm) {
    if (!sp->n_pre) return false;
    instr_io a, b;
    const int64_t T = instr_operands(x, sp->instr[0], &a);
    if (T > OG_GEMV_CUDA_MAX_T || !og_gemv_cuda_norm_fits(T, a.w[0])) return false;
    instr_operands(x, sp->instr[1], &b);
    const og_program_instr *norm = og_program_instr_at(x->s->m->prog, sp->instr[1]);
    *nm = (og_gemv_cuda_norm){a.v[0], a.v[1], b.v[1], b.dt[1], (float)norm->attrs.eps, a.out};
    return true;
}

/* One launch step: a fused kernel, or its instructions one by one where the
 * step is wider than the fused kernel serves. *failed names the instruction
 * whose launch failed. */
static og_status run_fused(step_ctx *x, const cuda_step *sp, int32_t *failed) {
    const og_model *m = x->s->m;
    struct og_cuda_session *c = x->s->cuda;
    og_gemv_cuda_norm norm;
    const og_gemv_cuda_norm *pro = norm_prologue(x, sp, &norm) ? &norm : NULL;
    if (sp->n_pre && !pro) { /* the prologue on its own: the products then read its output */
        og_status st = run_each(x, sp->instr, sp->n_pre, failed);
        if (st != OG_OK) return st;
    }
    const int32_t *mi = sp->instr + sp->n_pre, n = sp->n - sp->n_pre;
    const int32_t i = mi[0];
    instr_io a, b;
    *failed = i;
    switch (sp->kind) {
    case STEP_ADD_NORM: {
        const int64_t T = instr_operands(x, i, &a);
        instr_operands(x, mi[1], &b);
        const og_program_instr *nrm = og_program_instr_at(m->prog, mi[1]);
        return og_add_rms_norm_cuda(c->stream, a.v[0], a.v[1], b.v[1], b.dt[1], T, a.w[0], (float)nrm->attrs.eps,
                                    a.out, b.out);
    }
    case STEP_NORM_ROPE: { /* pairs (head norm, rope) */
        og_head_norm_rope_cuda_job jobs[2];
        int64_t T = 0;
        for (int32_t k = 0; k < n / 2; k++) {
            const int32_t norm_i = mi[2 * k], rope_i = mi[2 * k + 1];
            T = instr_operands(x, norm_i, &a);
            instr_operands(x, rope_i, &b);
            const og_program_instr *nrm = og_program_instr_at(m->prog, norm_i);
            const int64_t heads = nrm->attrs.heads;
            jobs[k] = (og_head_norm_rope_cuda_job){a.v[0], a.v[1], a.dt[1],
                                                   m->cuda->inv_freq + (size_t)rope_i * (OG_ROPE_MAX_HEAD_DIM / 2),
                                                   heads, a.w[0] / heads, (float)nrm->attrs.eps, b.out};
        }
        return og_head_norm_rope_multi_cuda(c->stream, jobs, n / 2, b.v[1], T);
    }
    case STEP_GATE_UP: {
        const int64_t T = instr_operands(x, i, &a);
        if (T > OG_GEMV_CUDA_MAX_T) break;
        instr_operands(x, mi[1], &b);
        instr_io sw;
        instr_operands(x, mi[2], &sw);
        const og_program_instr *g = og_program_instr_at(m->prog, i);
        return og_gemv_norm_swiglu_cuda(c->stream, pro ? NULL : a.v[0], pro, a.v[1], g->n_in > 2 ? a.v[2] : NULL,
                                        b.v[1], g->n_in > 2 ? b.v[2] : NULL, a.dt[1], T, a.w[0], g->out_width, sw.out);
    }
    case STEP_GEMVS:
    case STEP_ONE: {
        const int64_t T = instr_operands(x, i, &a);
        if (T > OG_GEMV_CUDA_MAX_T || (sp->kind == STEP_ONE && !pro)) break;
        og_gemv_cuda_part parts[OG_GEMV_CUDA_MAX_PARTS];
        for (int32_t k = 0; k < n; k++) {
            const og_program_instr *in = og_program_instr_at(m->prog, mi[k]);
            instr_operands(x, mi[k], &b);
            parts[k] = (og_gemv_cuda_part){b.v[1], in->n_in > 2 ? b.v[2] : NULL, in->out_width, b.out};
        }
        return og_gemv_norm_multi_cuda(c->stream, pro ? NULL : a.v[0], pro, a.dt[1], T, a.w[0], parts, n);
    }
    default:
        break;
    }
    return run_each(x, mi, n, failed);
}

static og_status run_step_group(step_ctx *x, const cuda_step *sp, int32_t *failed) {
    og_status st = run_fused(x, sp, failed);
    if (st == OG_OK) *failed = -1;
    return st;
}

/* Enqueues one step's work on the session's stream: the step block upload,
 * every instruction, then for OUT_NEXT the arg-max, for OUT_SAMPLE the
 * sampler block upload and the sampler, and the token's copy back. */
static og_status enqueue_step(og_session *s, int32_t T, int kind, float *dev_logits, bool last_row, int32_t *failed) {
    const og_model *m = s->m;
    struct og_cuda_session *c = s->cuda;
    *failed = -1;
    CUDA_TRY(cudaMemcpyAsync(c->step_dev, c->step_host, c->step_bytes, cudaMemcpyHostToDevice, c->stream),
             "step block upload");
    step_ctx x = {s, T, dev_logits, last_row};
    const int32_t end = kind == OUT_NONE ? m->last_attend + 1 : m->n_instrs;
    for (int32_t k = 0; k < m->cuda->n_steps; k++) {
        const cuda_step *sp = &m->cuda->steps[k];
        if (sp->instr[0] >= end) continue; /* the tail, when no output is asked for */
        og_status st = run_step_group(&x, sp, failed);
        if (st != OG_OK) return st;
    }
    if (kind == OUT_NEXT) {
        og_status st = og_argmax_cuda(c->stream, dev_logits, og_model_vocab_size(m), c->next_dev, c->argmax_scratch);
        if (st != OG_OK) return st;
    }
    if (kind == OUT_SAMPLE) {
        CUDA_TRY(cudaMemcpyAsync(c->sample_dev, c->sample_host, c->sample_bytes, cudaMemcpyHostToDevice, c->stream),
                 "sampler block upload");
        og_status st = og_sample_cuda(c->stream, dev_logits, og_model_vocab_size(m),
                                      (const og_sample_cuda_step *)(void *)c->sample_dev,
                                      sample_recent(c->sample_dev),
                                      c->forbidden_dev, c->marks_dev, c->next_dev);
        if (st != OG_OK) return st;
    }
    if (kind == OUT_NEXT || kind == OUT_SAMPLE)
        CUDA_TRY(cudaMemcpyAsync(c->next_host, c->next_dev, sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream),
                 "token copy back");
    return OG_OK;
}

/* True when the graphs were captured against the storage bound now. */
static bool graphs_current(og_session *s) {
    struct og_cuda_session *c = s->cuda;
    bool same = true;
    for (int32_t l = 0; l < s->cfg.n_layers; l++) {
        og_kv_layer_view v;
        og_kv_session_layer_view(s->kv, l, &v);
        if (c->graph_storage[2 * l] != v.k || c->graph_storage[2 * l + 1] != v.v) same = false;
        c->graph_storage[2 * l] = v.k;
        c->graph_storage[2 * l + 1] = v.v;
    }
    return same;
}

static og_status capture(og_session *s, int kind, int32_t *failed) {
    struct og_cuda_session *c = s->cuda;
    CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    og_status st = enqueue_step(s, 1, kind, c->logits_row, true, failed);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (st != OG_OK) {
        if (g) cudaGraphDestroy(g);
        return st;
    }
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamEndCapture");
    e = cudaGraphInstantiate(&c->graph[kind], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        c->graph[kind] = NULL;
        return cuda_fail(e, "cudaGraphInstantiate");
    }
    og_kv_session_note_capture(s->kv);
    return OG_OK;
}

/* One transaction of T <= max_write tokens. */
static og_status run_step(og_session *s, const int32_t *tokens, int32_t T, int kind, float *logits, bool last_row) {
    const og_model *m = s->m;
    struct og_cuda_session *c = s->cuda;
    const int64_t L = og_kv_session_length(s->kv);
    const int64_t V = og_model_vocab_size(m);
    for (int32_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "token id %d at position %lld is outside [0, %lld)",
                                 tokens[t], (long long)(L + t), (long long)V);
    og_status st = og_exec_begin_step(s, T);
    if (st != OG_OK) return st;
    /* the pinned block is free: the previous step ended with a synchronization */
    *(int64_t *)(void *)c->step_host = L;
    int32_t *tok = step_tokens(c->step_host), *pos = step_positions(c->step_host, s->cfg.max_write);
    for (int32_t t = 0; t < T; t++) {
        tok[t] = tokens[t];
        pos[t] = (int32_t)(L + t);
    }
    float *dev_logits = c->logits_row;
    if (kind == OUT_LOGITS && !last_row && T > 1) {
        if (c->logits_rows_cap < T) {
            cudaFree(c->logits_rows);
            c->logits_rows = NULL;
            c->logits_rows_cap = 0;
            cudaError_t e = cudaMalloc((void **)&c->logits_rows, (size_t)T * (size_t)V * sizeof(float));
            if (e != cudaSuccess) {
                og_kv_session_abort(s->kv);
                return og_errbuf_set(&s->err, cuda_fail(e, "logits rows"), "%s", og_last_error());
            }
            c->logits_rows_cap = T;
        }
        dev_logits = c->logits_rows;
    }
    int32_t failed = -1;
    if (T == 1 && m->cuda_graphs) {
        if (!graphs_current(s)) drop_graphs(c);
        if (!c->graph[kind]) st = capture(s, kind, &failed);
        if (st == OG_OK) {
            cudaError_t e = cudaGraphLaunch(c->graph[kind], c->stream);
            if (e != cudaSuccess) st = cuda_fail(e, "cudaGraphLaunch");
        }
    } else {
        st = enqueue_step(s, T, kind, dev_logits, last_row, &failed);
    }
    if (st == OG_OK && logits) {
        const size_t rows = last_row ? 1 : (size_t)T;
        cudaError_t e = cudaMemcpyAsync(logits, dev_logits, rows * (size_t)V * sizeof(float), cudaMemcpyDeviceToHost,
                                        c->stream);
        if (e != cudaSuccess) st = cuda_fail(e, "logits copy back");
    }
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (st == OG_OK && e != cudaSuccess) st = cuda_fail(e, "step");
    if (st != OG_OK) {
        og_kv_session_abort(s->kv);
        if (failed >= 0)
            return og_errbuf_set(&s->err, st, "instruction %d (%s -> %s) at length %lld: %s", failed,
                                 og_op_get(og_program_instr_at(m->prog, failed)->op)->name,
                                 og_program_instr_at(m->prog, failed)->out, (long long)L, og_last_error());
        return og_errbuf_set(&s->err, st, "step at length %lld: %s", (long long)L, og_last_error());
    }
    st = og_kv_session_commit(s->kv, T);
    if (st != OG_OK) return og_errbuf_set(&s->err, st, "commit: %s", og_kv_session_last_error(s->kv));
    return OG_OK;
}

/* Makes the sampling buffers ready for this sampler: the scratch and the
 * forbidden-token bitmap on first use, and a sampler block with room for its
 * recent tokens (a larger one drops the sampling graph, which holds the old). */
static og_status sample_buffers(og_session *s, const og_sampler *sampler) {
    struct og_cuda_session *c = s->cuda;
    const size_t words = (size_t)(og_model_vocab_size(s->m) + 31) / 32;
    if (!c->marks_dev) {
        CUDA_TRY(cudaMalloc((void **)&c->marks_dev, words * sizeof(uint32_t)), "sampler scratch");
        cudaError_t e = cudaMemsetAsync(c->marks_dev, 0, words * sizeof(uint32_t), c->stream);
        if (e != cudaSuccess) {
            cudaFree(c->marks_dev);
            c->marks_dev = NULL;
            return cuda_fail(e, "sampler scratch");
        }
    }
    if (!c->forbidden_dev) CUDA_TRY(cudaMalloc((void **)&c->forbidden_dev, words * sizeof(uint32_t)), "forbidden tokens");
    if (!c->forbidden_seen && !(c->forbidden_seen = og_malloc(words * sizeof(uint32_t))))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda session: no memory for the forbidden tokens");
    const int32_t need = og_sampler_get_params(sampler)->repeat_last_n;
    if (c->sample_host && c->sample_dev && need <= c->sample_recent_cap) return OG_OK;
    if (c->graph[OUT_SAMPLE]) cudaGraphExecDestroy(c->graph[OUT_SAMPLE]);
    c->graph[OUT_SAMPLE] = NULL;
    cudaFreeHost(c->sample_host);
    cudaFree(c->sample_dev);
    c->sample_host = c->sample_dev = NULL;
    c->sample_recent_cap = 0;
    c->sample_bytes = sizeof(og_sample_cuda_step) + (size_t)need * sizeof(int32_t);
    CUDA_TRY(cudaMallocHost((void **)&c->sample_host, c->sample_bytes), "pinned sampler block");
    CUDA_TRY(cudaMalloc((void **)&c->sample_dev, c->sample_bytes), "sampler block");
    c->sample_recent_cap = need;
    return OG_OK;
}

/* Writes the sampler block for the next step (the draw is read, not
 * consumed) and uploads the forbidden bitmap when it changed. */
static og_status sample_inputs(og_session *s, const og_sampler *sampler) {
    struct og_cuda_session *c = s->cuda;
    const og_sampler_params *p = og_sampler_get_params(sampler);
    const int32_t *recent;
    const int32_t n_recent = p->repeat_penalty != 1.0f ? og_sampler_recent(sampler, &recent) : 0;
    const uint32_t *forbidden = og_sampler_forbidden(sampler);
    *(og_sample_cuda_step *)(void *)c->sample_host = (og_sample_cuda_step){
        .uniform = og_sampler_peek_uniform(sampler), .temperature = p->temperature, .top_p = p->top_p,
        .min_p = p->min_p, .repeat_penalty = p->repeat_penalty, .top_k = p->top_k, .n_recent = n_recent,
        .use_forbidden = forbidden != NULL};
    if (n_recent > 0) memcpy(sample_recent(c->sample_host), recent, (size_t)n_recent * sizeof(int32_t));
    const size_t bytes = (size_t)(og_model_vocab_size(s->m) + 31) / 32 * sizeof(uint32_t);
    if (!forbidden || (c->forbidden_valid && !memcmp(forbidden, c->forbidden_seen, bytes))) return OG_OK;
    memcpy(c->forbidden_seen, forbidden, bytes);
    c->forbidden_valid = false;
    /* from pageable memory: the copy has read forbidden_seen when this returns */
    CUDA_TRY(cudaMemcpyAsync(c->forbidden_dev, c->forbidden_seen, bytes, cudaMemcpyHostToDevice, c->stream),
             "forbidden tokens upload");
    c->forbidden_valid = true;
    return OG_OK;
}

/* The steps of one eval call. The last step's output: logits (all rows or
 * the last), else with next: the arg-max, or with a sampler too: the token
 * the device sampler draws (the sampler itself is not advanced here). */
static og_status eval_steps(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, float *logits,
                            int all_rows, int32_t *next, const og_sampler *sampler) {
    const int64_t V = og_model_vocab_size(s->m);
    int64_t step = s->cfg.max_write;
    if (chunk > 0 && chunk < step) step = chunk;
    CUDA_TRY(cudaSetDevice(s->m->cuda->device), "cudaSetDevice");
    for (int64_t done = 0; done < n;) {
        int32_t T = (int32_t)(n - done < step ? n - done : step);
        bool last = done + T == n;
        int kind = OUT_NONE;
        float *dst = NULL;
        if (logits && all_rows) kind = OUT_LOGITS, dst = logits + done * V;
        else if (logits && last) kind = OUT_LOGITS, dst = logits;
        else if (next && last) kind = sampler ? OUT_SAMPLE : OUT_NEXT;
        if (kind == OUT_SAMPLE) {
            og_status st = sample_inputs(s, sampler);
            if (st != OG_OK) return og_errbuf_set(&s->err, st, "%s", og_last_error());
        }
        og_status st = run_step(s, tokens + done, T, kind, dst, !(logits && all_rows));
        if (st != OG_OK) return st;
        if (kind == OUT_NEXT || kind == OUT_SAMPLE) *next = *s->cuda->next_host;
        done += T;
    }
    return OG_OK;
}

og_status og_exec_cuda_eval(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, float *logits,
                            int all_rows, int32_t *next) {
    return eval_steps(s, tokens, n, chunk, logits, all_rows, next, NULL);
}

og_status og_exec_cuda_eval_sample(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                   og_sampler *sampler, int32_t *next) {
    const int64_t V = og_model_vocab_size(s->m);
    const og_sampler_params *p = og_sampler_get_params(sampler);
    if (!og_sample_cuda_supported(p->temperature, p->top_k, V)) { /* the host samples the logits */
        float *logits = og_malloc((size_t)V * sizeof *logits);
        if (!logits) return og_errbuf_set(&s->err, OG_ERR_OUT_OF_MEMORY, "og_session_eval_sample: no memory for logits");
        og_status st = eval_steps(s, tokens, n, chunk, logits, 0, NULL, NULL);
        if (st == OG_OK) *next = og_sampler_sample(sampler, logits);
        og_free(logits);
        return st;
    }
    cudaError_t e = cudaSetDevice(s->m->cuda->device);
    og_status st = e == cudaSuccess ? sample_buffers(s, sampler) : cuda_fail(e, "cudaSetDevice");
    if (st != OG_OK) return og_errbuf_set(&s->err, st, "sampling buffers: %s", og_last_error());
    int32_t token = -1;
    st = eval_steps(s, tokens, n, chunk, NULL, 0, &token, sampler);
    if (st != OG_OK) return st;
    if (token < 0 || token >= V)
        return og_errbuf_set(&s->err, OG_ERR_BACKEND, "the device sampler returned token %d (vocabulary %lld)",
                             (int)token, (long long)V);
    og_sampler_commit(sampler, token);
    *next = token;
    return OG_OK;
}
