/* CUDA kernels for k-quant weights (q2_k .. q6_k: llama.cpp's super-blocks,
 * docs/program-format.md), callable from C. Conventions as ops_cuda.h's:
 * `stream` is a cudaStream_t as void *, pointers are device pointers,
 * arguments are checked on the host before anything is enqueued, launches
 * are checked; nothing allocates. Weights must be 16-byte aligned (a
 * cudaMalloc'd tensor is), x 16-byte aligned, K a multiple of 256.
 *
 * Numerics: f32 x and the exact dequantized weights (the values of
 * og_kquant_dequantize_row, bit for bit), f32 sums. The gemv sums each
 * lane's few products per sub-block, then scales them (d * scale, and
 * less dmin * min times the lane's sum of x); that differs from the
 * reference's sum of x * w by rounding only.
 *
 * Letters: T rows of x, K in features, N out features, V vocabulary, H
 * hidden size. */
#ifndef OG_KERNELS_CUDA_KQUANT_CUDA_H
#define OG_KERNELS_CUDA_KQUANT_CUDA_H

#ifdef __cplusplus
extern "C" { /* core.h has no C++ guard of its own */
#endif

#include "core/core.h"

/* Rows of x a k-quant gemv takes in one launch (each weight read once). */
#define OG_KQUANT_GEMV_CUDA_MAX_T 8

/* out = x @ w^T (+ bias), T in [1, OG_KQUANT_GEMV_CUDA_MAX_T]: a warp per
 * output feature, the weights streamed once for all T rows. bias NULL or
 * [N] f32. out must not overlap x. */
og_status og_kquant_gemv_cuda(void *stream, const float *x /* [T, K] */, const void *w /* [N, K] */,
                              const float *bias /* [N] or NULL */, og_dtype dt, int64_t T, int64_t K, int64_t N,
                              float *out /* [T, N] */);

/* Rows row0 .. row0 + rows - 1 of a [N, K] k-quant weight as f32, bit for
 * bit og_kquant_dequantize_row's: the panel a cuBLAS product of a wide step
 * multiplies. */
og_status og_kquant_dequantize_cuda(void *stream, const void *w /* [N, K] */, og_dtype dt, int64_t N, int64_t K,
                                    int64_t row0, int64_t rows, float *out /* [rows, K] */);

/* out[t] = row tokens[t] of a k-quant table as f32 (og_embed_ref's bits). A
 * token outside [0, V) gives a row of NaN (the host checks ids before). */
og_status og_kquant_embed_cuda(void *stream, const int32_t *tokens /* [T] */, int64_t T, const void *table /* [V, H] */,
                               og_dtype dt, int64_t V, int64_t H, float *out /* [T, H] */);

#ifdef __cplusplus
}
#endif

#endif
