/* The executor's internals: what a loaded model and a session hold. The API
 * is in include/offgraph.h (models and sessions). */
#ifndef OG_EXEC_H
#define OG_EXEC_H

#include "core/core.h"
#include "kernels/ops.h"
#include "program/program.h"

struct og_model {
    og_program *prog;      /* owned: weights mapped read-only          */
    og_backend backend;
    og_threadpool *pool;   /* owned; NULL runs on the calling thread   */
    int32_t n_instrs;
    int32_t logits_instr;  /* the instruction producing "logits"       */
    int32_t last_attend;   /* the last update_and_attend, -1 if none   */
    og_rope_table *rope;   /* [n_instrs]: filled for rope instructions */
    /* scratch plan: instruction i writes slot slot_of[i] (-1: logits go to
     * the caller); slot s holds rows of slot_width[s] floats */
    int32_t *slot_of;      /* [n_instrs] */
    int64_t *slot_width;   /* [n_instrs], n_slots used */
    int32_t n_slots;
    struct og_cuda_model *cuda; /* owned: device weights (CUDA back end), else NULL */
    bool cuda_graphs;           /* CUDA decode steps replay captured graphs */
    og_errbuf err;
};

struct og_session {
    og_model *m;                /* borrowed                             */
    og_kv_config cfg;           /* the program's manifest, kv dtype possibly overridden */
    og_kv_session *kv;          /* owned: this session's KV storage     */
    og_program_bindings *bind;  /* owned: runtime tensors, bound per step */
    float **slots;              /* [n_slots] of [max_write, slot_width] */
    int32_t *positions;         /* [max_write]                          */
    float *last_logits;         /* [V] the last row, for eval_next / eval_sample on the CPU; made on first use */
    struct og_cuda_session *cuda; /* owned: device state (CUDA back end), else NULL */
    og_errbuf err;
};

/* Begins a step of T tokens for any back end: prepares the KV session (may
 * grow storage), binds the runtime tensors and refuses the step if any is
 * unbound. On failure nothing changed and the session's error says why. */
og_status og_exec_begin_step(og_session *s, int32_t T);

/* The program a model runs; borrowed. */
const og_program *og_model_program(const og_model *m);

/* The CUDA executor (exec_cuda.c, CUDA builds only). Model: uploads the
 * weights and rope tables once. Session: creates the session's stream, its KV
 * session over device storage (s->kv) and its device scratch. Eval: the
 * og_session_eval contract on the device; next (if not NULL) receives the
 * arg-max token of the last position, computed on the device. */
og_status og_exec_cuda_model_init(og_model *m);
void og_exec_cuda_model_free(og_model *m);
og_status og_exec_cuda_session_init(og_session *s);
void og_exec_cuda_session_free(og_session *s);
og_status og_exec_cuda_eval(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk, float *logits,
                            int all_rows, int32_t *next);
/* og_session_eval_sample on the device: the sampler's choice is made there
 * (kernels/cuda/sample_cuda.h), or on the host from the copied logits where
 * the device sampler does not serve the parameters. The sampler's vocabulary
 * is the model's (the caller checked). */
og_status og_exec_cuda_eval_sample(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                   og_sampler *sampler, int32_t *next);

#endif
