/* The KV planner: for one layer and one step, which physical slots are
 * written and which are read. Kernels (CPU and CUDA) use these runs to find
 * rows in the layer's storage; the planner refuses a step before any kernel
 * runs (DESIGN.md section 2).
 *
 * Letters: T tokens in the step, L committed length, W ring window,
 * R = W + max_write - 1 ring slots. Positions are logical token indices;
 * slots are rows of the sequence-major storage [rows, Hkv, D]:
 *   flat: slot(p) = p          ring: slot(p) = p mod R
 */
#ifndef OG_KV_PLAN_H
#define OG_KV_PLAN_H

#include "offgraph.h"

/* A contiguous range of slots holding consecutive positions:
 * slot + i holds position pos + i for i in [0, count). */
typedef struct og_kv_run {
    int64_t slot;
    int64_t pos;
    int64_t count;
} og_kv_run;

/* One layer's plan for a step of T tokens at committed length L. */
typedef struct og_kv_plan {
    int64_t length;      /* L                                             */
    int32_t width;       /* T                                             */
    og_kv_policy policy;
    int64_t slots;       /* slot space: flat max_capacity, ring R         */
    int64_t rows_needed; /* rows the layer must hold for the step: flat L+T, ring R */
    int n_write;         /* 1, or 2 when a ring write wraps               */
    og_kv_run write[2];  /* positions L .. L+T-1, in position order       */
    int n_read;          /* 1, or 2 when the ring window wraps            */
    og_kv_run read[2];   /* keys any query of the step can see, in position order:
                            flat [0, L+T); ring (L-W, L+T) clipped at 0    */
} og_kv_plan;

/* Plans layer (an entry of a validated cfg) for T tokens at length L.
 * Refuses T < 1 or L < 0 (OG_ERR_INVALID_ARGUMENT), T > max_write
 * (OG_ERR_WRITE_TOO_WIDE) and, for a flat layer, L + T > max_capacity
 * (OG_ERR_CAPACITY); *out is untouched on refusal. */
og_status og_kv_plan_layer(const og_kv_config *cfg, const og_kv_layer_config *layer, int64_t L,
                           int32_t T, og_kv_plan *out);

#endif /* OG_KV_PLAN_H */
