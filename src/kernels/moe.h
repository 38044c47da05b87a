/* Kernels of the moe instruction (program/ops.h): a mixture-of-experts MLP
 * with a softmax top-k router and an optional gated shared expert
 * (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next).
 *
 * Letter legend (shape comments on buffers):
 *   T  rows of the step (every session's tokens)
 *   H  hidden size (an expert's input and output width)
 *   E  experts          k  experts per row (top_k)
 *   F  an expert's intermediate size
 *   M  selected (row, expert) pairs of a call: T * k
 *
 * og_moe_ref is the plain C reference (one thread, no SIMD, every row on its
 * own); og_moe_cpu the fast version: it routes every row, groups the rows by
 * expert (across tokens and sessions: each selected expert's weights are
 * read once per call for all of its rows) and runs each expert's products
 * with og_matmul_rows_cpu, whose result for a row does not depend on the
 * other rows of the call; so a row gets the same bits whatever the batch
 * around it (batched == alone, prefill == token by token). Both validate
 * their arguments alike and write nothing on failure. */
#ifndef OG_KERNELS_MOE_H
#define OG_KERNELS_MOE_H

#include "core/core.h"

#include <stdbool.h>

/* Largest top_k the kernels take (stack arrays of this size). */
#define OG_MOE_MAX_TOP_K 64

typedef struct og_moe_args {
    const float *x;          /* [T, H]                                      */
    const float *logits;     /* [T, E] the router's logits                  */
    const void *gate_up;     /* [E, 2F, H]: per expert F gate rows, F up rows */
    og_dtype gate_up_dtype;  /* f32, bf16, f16, q8, q4                      */
    const void *down;        /* [E, H, F]                                   */
    og_dtype down_dtype;
    const float *shared;     /* [T, H] the shared expert's output, or NULL  */
    const float *shared_gate;/* [T] its gate's logit (with shared)          */
    int64_t T, H, F, E;
    int32_t top_k;           /* 1..min(E, OG_MOE_MAX_TOP_K)                 */
    bool norm_topk_prob;     /* renormalise the top_k weights to sum 1      */
    float *out;              /* [T, H]; overlaps no input                   */
} og_moe_args;

/* Routing of T rows: p = softmax(logits row) in f32; experts[t] gets the
 * top_k experts by p, larger first, equal p the lower index first (the set
 * torch.topk picks on the GPU); weights[t] their p, divided by the sum of
 * the top_k p (summed larger first) when norm. */
og_status og_moe_route_ref(const float *logits /* [T, E] */, int64_t T, int64_t E, int32_t top_k, bool norm,
                           int32_t *experts /* [T, top_k] */, float *weights /* [T, top_k] */);

/* out[t] = sum over the selected e in increasing e of
 *   w_e * down[e] @ swiglu(gate_up[e][:F] @ x[t], gate_up[e][F:] @ x[t])
 * plus sigmoid(shared_gate[t]) * shared[t] when shared is given; the sum
 * starts at 0 and adds in that order (transformers' index_add_ order). */
og_status og_moe_ref(const og_moe_args *a);
og_status og_moe_cpu(og_threadpool *pool, const og_moe_args *a);

/* Expert e's [N, K] matrix in a stack [E, N, K] of dtype dt (a quantized
 * stack holds E quantized matrices one after the other). */
static inline const void *og_moe_expert(const void *stack, og_dtype dt, int64_t e, int64_t N, int64_t K) {
    int64_t shape[2] = {N, K}, bytes = 0;
    og_tensor_bytes(dt, 2, shape, &bytes);
    return (const char *)stack + (size_t)e * (size_t)bytes;
}

/* One row of og_moe_route_ref (both kernels route with it): p [E] is
 * scratch, ex [k] and w [k] get the experts and weights. */
void og_moe_route_row(const float *logits /* [E] */, int64_t E, int32_t k, bool norm, float *p /* [E] */,
                      int32_t *ex /* [k] */, float *w /* [k] */);

/* The checks both versions make (shared by moe_ref.c and moe_cpu.c). */
og_status og_moe_check(const og_moe_args *a);

#endif /* OG_KERNELS_MOE_H */
