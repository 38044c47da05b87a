/* The executor's internals: what a loaded model and a session hold, the plan
 * of one batched step, and the table of operations every back end provides.
 * The API is in include/offgraph.h (models, sessions, og_model_step).
 *
 * exec.c holds what is the same on every back end: loading, sessions, the
 * step transaction (validate, prepare every session all-or-nothing, run,
 * commit or roll every session back), and the step plan. A back end
 * (backend_cpu.c, backend_cuda.c) only runs a prepared step: it is reached
 * through og_backend_ops, never called by name.
 *
 * Letters: K sessions in a step, T_i tokens of session i, N = sum T_i rows,
 * V vocabulary, B a CUDA batch bucket (a power of two >= K).
 */
#ifndef OG_EXEC_H
#define OG_EXEC_H

#include "core/core.h"
#include "exec/fuse.h"
#include "kernels/ops.h"
#include "program/program.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct og_backend_ops og_backend_ops;
typedef struct og_step_ctx og_step_ctx;

/* ------------------------------------------------------------ models */

struct og_model {
    og_program *prog;      /* owned: weights mapped read-only          */
    /* the KV manifest sessions get: the program's, with the context
     * og_model_set_context chose (max_capacity, and initial_capacity and
     * max_write no larger) */
    og_kv_config kv;
    og_backend backend;
    const og_backend_ops *ops;
    void *be;              /* owned by the back end: its model state   */
    og_threadpool *pool;   /* owned (CPU back end); NULL: calling thread */
    /* the threads a step of at least prepare_parallel_min sessions prepares
     * them on (exec.c, prepare_all): pool, or own_host_pool where the back
     * end has none; NULL: the calling thread */
    og_threadpool *host_pool;
    og_threadpool *own_host_pool; /* owned */
    int32_t prepare_parallel_min;
    int32_t n_instrs;
    int32_t logits_instr;  /* the instruction producing "logits"       */
    int32_t last_attend;   /* the last op on per-session storage (update_and_attend, a state op), -1 if none */
    int64_t vocab;         /* V */
    og_rope_table *rope;   /* [n_instrs]: filled for rope instructions */
    /* the program cut into the steps the back end runs (fuse.h, under the
     * back end's og_fuse_rules), in execution order */
    og_fuse_step *steps;   /* [n_steps] */
    int32_t n_steps;
    /* tokens the program cannot take (the model object's "refused_token_ids",
     * e.g. a vision + text checkpoint's image placeholders), and why */
    int32_t *refused;      /* [n_refused] */
    int32_t n_refused;
    const char *refused_reason; /* borrowed from the program */
    bool cuda_graphs;      /* CUDA decode steps replay captured graphs */
    /* step contexts not in use (each step takes one, so steps of one model
     * may run on several threads at once) */
    pthread_mutex_t lock;
    og_step_ctx **idle;    /* [n_idle] */
    int32_t n_idle, idle_cap;
    og_model_metrics metrics; /* under lock */
};

/* ------------------------------------------------------------ sessions */

struct og_session {
    og_model *m;                /* borrowed                             */
    og_kv_config cfg;           /* the program's manifest, kv dtype possibly overridden */
    og_kv_session *kv;          /* owned: this session's KV storage     */
    og_program_bindings *bind;  /* owned: runtime tensors, bound per step */
    void *be;                   /* owned by the back end: its session state */
    const og_kv_allocator *kv_alloc; /* og_session_params.kv_allocator, during session_init only */
    atomic_int stepping;        /* 1 while a step of this session runs  */
    int32_t last_token;         /* the token of the last ARGMAX / SAMPLE step of og_session_eval_* */
    og_errbuf err;
};

/* ------------------------------------------------------------ the step plan */

/* One session's part of a step. Sessions are ordered so that the rows of
 * one-token sessions come first (rows 0 .. n_single-1), then wider steps, each
 * group in the caller's order; within the wider ones, those whose output
 * needs one row come before those that need every row (LOGITS_ALL). */
typedef struct og_step_seq {
    og_session *s;
    og_batch_item *item;   /* the caller's item                         */
    int32_t T;             /* tokens of this session in the step        */
    int64_t L;             /* committed length before the step          */
    int32_t row0;          /* first of its rows in the step's N rows    */
    int32_t tail_rows;     /* rows of it the tail runs on: 0, 1 or T    */
    int32_t tail_row0;     /* first of those in the tail's rows         */
} og_step_seq;

typedef struct og_step_plan {
    int32_t n_seqs;        /* K */
    og_step_seq *seqs;     /* [K] in row order                          */
    int32_t n_rows;        /* N = sum T_i                               */
    int32_t n_single;      /* sessions (= rows) with T == 1, first      */
    int32_t *tokens;       /* [N]                                       */
    int32_t *positions;    /* [N]: L_i + t                              */
    /* The tail: instructions after the last update_and_attend work row by
     * row, and run only on the rows whose output is wanted. */
    int32_t n_tail_rows;
    int32_t *tail_src;     /* [n_tail_rows]: the step row of each tail row,
                              increasing, tail_src[j] >= j             */
    bool tail_is_all;      /* the tail rows are all N rows, in order   */
    int32_t n_tail_single; /* tail rows 0 .. n_tail_single-1 belong to
                              sessions with one tail row               */
    bool decode_only;      /* every T == 1                              */
    double *wait_seconds;  /* the back end adds its wait for the device here */
} og_step_plan;

/* ------------------------------------------------------------ back ends */

struct og_backend_ops {
    const char *name;
    /* The fusions it runs: og_model_load cuts the program into m->steps
     * under these rules before model_init. */
    const og_fuse_rules *fusion;
    /* Model state after the program is open and m's common fields are set. */
    og_status (*model_init)(og_model *m, const og_model_params *p);
    void (*model_free)(og_model *m); /* may meet a half-made state */
    /* Session state, including s->kv over the back end's storage (s->cfg set). */
    og_status (*session_init)(og_session *s);
    void (*session_free)(og_session *s); /* frees s->kv too; may meet a half-made state */
    /* Makes the calling thread, one of og_model.host_pool's, ready to
     * prepare sessions (their storage's allocator calls): on CUDA, the
     * model's device current. NULL: nothing to do. */
    og_status (*host_thread)(og_model *m);
    /* A step context: the scratch, stream and graphs one step at a time uses. */
    og_status (*ctx_create)(og_model *m, og_step_ctx **out);
    void (*ctx_free)(og_model *m, og_step_ctx *c);
    /* Runs a step whose sessions are all prepared and bound, writing every
     * item's output (logits, token; samplers advanced). On failure no output
     * was written and no sampler moved; the caller rolls the sessions back.
     * og_last_error() says why. */
    og_status (*step)(og_model *m, og_step_ctx *c, const og_step_plan *plan);
};

extern const og_backend_ops og_backend_cpu_ops;
/* The CPU back end with the model cut into og_model_params.tensor_parallel
 * shards run in one process (backend_cpu_tp.c, exec/shard.h). */
extern const og_backend_ops og_backend_cpu_tp_ops;
#ifdef OG_HAVE_CUDA
extern const og_backend_ops og_backend_cuda_ops;
#endif

/* Counts one graph capture / replay of bucket b (2^b sessions) in the model's
 * metrics; every session of the step counts the capture too. */
void og_model_note_graph(og_model *m, const og_step_plan *plan, int32_t bucket, bool captured);

/* The tail row each instruction reads of an operand: instructions after the
 * last attention read values made before it (and the inputs) at tail rows. */
static inline bool og_exec_in_tail(const og_model *m, int32_t instr) { return instr > m->last_attend; }
/* True when operand o of a tail instruction holds all N rows (made before the
 * tail), so the tail must read it at tail rows. */
static inline bool og_exec_full_rows(const og_model *m, og_program_operand o) {
    return o.kind == OG_VALUE_INPUT || (o.kind == OG_VALUE_ACTIVATION && o.index <= m->last_attend);
}

/* Pieces of the CPU back end that its tensor-parallel mode runs too
 * (backend_cpu.c). og_cpu_plan_matmul: x [rows, K] @ w^T (+ bias) over the
 * rows of the step (tail: of its tail), one-token rows in one call and each
 * wider session's rows in a call of their own, so a row gets the bits it
 * gets alone; bf16_prefill rounds the wider rows' x to bf16 (a bf16
 * program). og_cpu_deliver: every item's output from the tail rows' logits
 * [n_tail_rows, V], an item's allowed mask (og_batch_item.allowed) applied
 * to its row in place first. */
og_status og_cpu_plan_matmul(og_threadpool *pool, const og_step_plan *p, bool tail, bool bf16_prefill, const float *x,
                             const void *w, const void *bias, og_dtype dt, int64_t K, int64_t N, float *out);
og_status og_cpu_deliver(const og_step_plan *p, float *logits, int64_t V);
/* m->pool for n_threads (1: none, the calling thread runs the kernels). */
og_status og_cpu_start_pool(og_model *m, int32_t n_threads);

/* The greedy scratch-slot plan shared by the back ends: n values in program
 * order; value i is written by step def[i] and read last by step last[i] (-1:
 * never read); width[i] floats a row (-1 for values that get no slot). Fills
 * slot_of [n] (-1 for no slot), slot_width [n] (n_slots used), *n_slots. A
 * slot never holds two values alive at once, and no value shares a slot with
 * one read by the step that writes it. */
og_status og_exec_plan_slots(int32_t n, int32_t n_steps, const int32_t *def, const int32_t *last,
                             const int64_t *width, int32_t *slot_of, int64_t *slot_width, int32_t *n_slots);

#endif
