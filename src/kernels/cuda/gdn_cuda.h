/* CUDA kernels of the hybrid (Gated DeltaNet) layers, callable from C: the
 * same ops and arguments as kernels/gdn.h (whose references they are tested
 * against), on device pointers, enqueued on `stream` (a cudaStream_t as
 * void *). Arguments are checked on the host before anything is enqueued
 * (OG_ERR_INVALID_ARGUMENT / OG_ERR_UNSUPPORTED), a failed launch is
 * OG_ERR_BACKEND. Nothing here allocates.
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
/* a->* are device pointers (A_log and dt_bias included). */
og_status og_gated_delta_net_cuda(void *stream, const og_gdn_args *a);
og_status og_rms_norm_gated_cuda(void *stream, const float *x /* [T, n*D] */, const float *z /* [T, n*D] */,
                                 const void *weight /* [D] */, og_dtype weight_dtype, int64_t T, int64_t n, int64_t D,
                                 float eps, float *out /* [T, n*D] */);
og_status og_sigmoid_mul_cuda(void *stream, const float *x /* [n] */, const float *gate /* [n] */, int64_t n,
                              float *out /* [n] */);

#ifdef __cplusplus
}
#endif

#endif /* OG_KERNELS_GDN_CUDA_H */
