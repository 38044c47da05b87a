/* CUDA kernels of the hybrid (Gated DeltaNet) layers, callable from C: the
 * same ops and arguments as kernels/gdn.h (whose references they are tested
 * against), on device pointers, enqueued on `stream` (a cudaStream_t as
 * void *). Arguments are checked on the host before anything is enqueued
 * (OG_ERR_INVALID_ARGUMENT / OG_ERR_UNSUPPORTED), a failed launch is
 * OG_ERR_BACKEND. Nothing here allocates.
 *
 * Decode steps of many sessions read each session's state addresses from a
 * device table (og_state_cuda_seq, in the step block), so that a captured
 * decode graph serves any sessions, as attention's KV tables do.
 *
 * gated_delta_net runs the recurrent form for every step width: one block
 * per value head holds the head's state (Dk x Dv f32) in shared memory for
 * the whole step, reading the committed state once and writing the new one
 * once; tokens go one after another. (The chunked form on the tensor cores
 * is not written yet: prefill runs the tokens in turn.) Dk * Dv * 4 bytes
 * must fit the device's shared memory (OG_ERR_UNSUPPORTED otherwise;
 * 128 x 128 takes 64 KiB).
 * Letters as in kernels/gdn.h. */
#ifndef OG_KERNELS_GDN_CUDA_H
#define OG_KERNELS_GDN_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/gdn.h"

og_status og_causal_conv1d_cuda(void *stream, const float *x /* [T, C] */, const void *weight /* [C, K] */,
                                og_dtype weight_dtype, const float *state_in /* [K-1, C] or NULL */,
                                float *state_out /* [K-1, C] */, int64_t T, int64_t C, int64_t K,
                                float *out /* [T, C] */);
/* Allows the delta rule kernels the shared memory of heads of Dk x Dv
 * (OG_ERR_UNSUPPORTED when it does not fit): called by the launches outside
 * graph captures; call it once before capturing one. */
og_status og_gated_delta_net_cuda_prepare(int64_t Dk, int64_t Dv);
/* a->* are device pointers (A_log and dt_bias included). */
og_status og_gated_delta_net_cuda(void *stream, const og_gdn_args *a);
og_status og_rms_norm_gated_cuda(void *stream, const float *x /* [T, n*D] */, const float *z /* [T, n*D] */,
                                 const void *weight /* [D] */, og_dtype weight_dtype, int64_t T, int64_t n, int64_t D,
                                 float eps, float *out /* [T, n*D] */);
og_status og_sigmoid_mul_cuda(void *stream, const float *x /* [n] */, const float *gate /* [n] */, int64_t n,
                              float *out /* [n] */);

/* ---- batched decode: one token of each of B sessions, the states' addresses
 * read from a device table (the step block), so that a captured graph serves
 * any sessions the host writes there ---- */
typedef struct og_state_cuda_seq { /* one session's copies of one state (16 bytes) */
    const float *read; /* the committed copy, NULL at length 0 (zero state) */
    float *write;      /* the copy the step writes; NULL for a padded entry (skipped) */
} og_state_cuda_seq;
/* Row b of x / out belongs to table entry b. */
og_status og_causal_conv1d_batch_cuda(void *stream, const float *x /* [B, C] */, const void *weight /* [C, K] */,
                                      og_dtype weight_dtype, const og_state_cuda_seq *seqs /* [B] device */,
                                      int32_t B, int64_t C, int64_t K, float *out /* [B, C] */);
/* a->T is ignored (one token a session); a->state_in / state_out are ignored
 * (the table's); a->qkv, a->a, a->b, a->out hold B rows. */
og_status og_gated_delta_net_batch_cuda(void *stream, const og_gdn_args *a, const og_state_cuda_seq *seqs /* [B] */,
                                        int32_t B);

#ifdef __cplusplus
}
#endif

#endif /* OG_KERNELS_GDN_CUDA_H */
