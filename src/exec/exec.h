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
    og_errbuf err;
};

struct og_session {
    og_model *m;                /* borrowed                             */
    og_kv_config cfg;           /* the program's manifest, kv dtype possibly overridden */
    og_kv_session *kv;          /* owned: this session's KV storage     */
    og_program_bindings *bind;  /* owned: runtime tensors, bound per step */
    float **slots;              /* [n_slots] of [max_write, slot_width] */
    int32_t *positions;         /* [max_write]                          */
    og_errbuf err;
};

/* The program a model runs; borrowed. */
const og_program *og_model_program(const og_model *m);

#endif
