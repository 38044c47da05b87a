/* CUDA kernels of the moe instruction (program/ops.h; the CPU versions and
 * their definition are in kernels/moe.h), callable from C. Conventions as
 * ops_cuda.h: device pointers, a stream passed as void *, host-side argument
 * checks, launches checked, nothing allocated (the caller's scratch).
 *
 * Letters as kernels/moe.h: T rows, H hidden, E experts, k top_k, F an
 * expert's intermediate size, M = T * k (row, expert) pairs.
 *
 * The whole layer is six launches whose sizes depend on T alone (so a decode
 * step's graph replays them whatever the rows pick) and no host round trip:
 *   1. route: per row, softmax of the router logits and the top k (larger
 *      first, equal p the lower expert index), weights renormalised when
 *      asked;
 *   2. group: the M pairs counted and placed by expert (a device-side list
 *      of the experts some row picked, with each one's pairs);
 *   3. gate_up: one launch over (feature tile, listed expert): each block
 *      reads its expert's rows once for all of that expert's pairs, across
 *      tokens and sessions (a grouped GEMV; blocks past the list's length
 *      return at once);
 *   4. SwiGLU of the pairs' gate and up halves;
 *   5. down: as 3 over the pairs' SwiGLU;
 *   6. combine: per row, the sum over its experts in increasing index of
 *      weight * output, from zero, plus sigmoid(shared_gate) * shared.
 * Products accumulate in f32 (bf16, f32, q8 and q4 stacks: a q8/q4 stack is
 * E quantized matrices one after the other). Wide steps run the same grouped
 * kernels on the CUDA cores when the grouped GEMM is switched off
 * (OG_CUDA_MOE_GEMM=0; on by default, 27x-55x faster on an H200): else steps of
 * 64 pairs or more run 3 and 5 on the tensor cores for bf16 weights (K a
 * multiple of 8), one launch over (feature tile, row tile of an expert) with
 * the tiles found on the device, the activations split into bf16 hi + lo as
 * the dense wide products split them (og_split_bf16_cuda): the f32 product
 * up to about 2^-16 of x and the order of the sums. Such a step's bits then
 * differ from those of its rows run alone (which take the CUDA cores). */
#ifndef OG_KERNELS_MOE_CUDA_H
#define OG_KERNELS_MOE_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/core.h"

typedef struct og_moe_cuda_args {
    const float *x;          /* [T, H]                                 */
    const float *logits;     /* [T, E]                                 */
    const void *gate_up;     /* [E, 2F, H]                             */
    og_dtype gate_up_dtype;  /* f32, bf16, q8, q4                      */
    const void *down;        /* [E, H, F]                              */
    og_dtype down_dtype;
    const float *shared;     /* [T, H] or NULL                         */
    const float *shared_gate;/* [T] (with shared)                      */
    int64_t T, H, F, E;
    int32_t top_k;           /* 1..min(E, 64)                          */
    bool norm_topk_prob;
    float *out;              /* [T, H]                                 */
} og_moe_cuda_args;

/* Bytes of device scratch og_moe_cuda needs for these sizes (16-byte
 * aligned pieces); 0 when they overflow. */
size_t og_moe_cuda_scratch_bytes(int64_t T, int32_t top_k, int64_t E, int64_t H, int64_t F);

/* The moe instruction on the stream; scratch holds at least
 * og_moe_cuda_scratch_bytes(T, top_k, E, H, F) bytes (no contents kept
 * between calls). */
og_status og_moe_cuda(void *stream, const og_moe_cuda_args *a, void *scratch);

/* Whether steps of 64 pairs or more with bf16 weights take the grouped GEMM
 * on the tensor cores: read from OG_CUDA_MOE_GEMM ("0": off; anything else or
 * unset: on) at the first call, or set by og_moe_cuda_set_gemm (tests,
 * benchmarks; it returns the previous choice). */
bool og_moe_cuda_get_gemm(void);
bool og_moe_cuda_set_gemm(bool on);

/* How the CUDA-core products of bf16 / q8 / q4 experts read their weights:
 * 2 (the default), a 16-byte chunk of a row a lane and 4 features a warp
 * (K a multiple of 8 / 16 / 32 weights); 1, 8 weights a lane and one feature
 * a warp (K a multiple of 256); 0, one element at a time (every K and
 * type, the f32 experts' path). Where a mode's K or alignment does not hold
 * the next lower one runs. Read from OG_CUDA_MOE_VEC ("0", "1"; unset or
 * anything else: 2) at the first call, or set by og_moe_cuda_set_vec
 * (returns the previous mode). */
int og_moe_cuda_get_vec(void);
int og_moe_cuda_set_vec(int mode);

#ifdef __cplusplus
}
#endif

#endif /* OG_KERNELS_MOE_CUDA_H */
