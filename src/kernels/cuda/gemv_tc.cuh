/* The decode products on the tensor cores (gemv_tc.cu), behind the gemv
 * entry points of ops_cuda.h: ops.cu checks the arguments and calls
 * og_gemv_tc_launch when og_gemv_tc_takes says the case fits. Internal to
 * src/kernels/cuda.
 *
 * Letters: T rows of x (1..8), K in features, N out features of a part, F
 * the ffn width of a gate/up pair. */
#ifndef OG_KERNELS_CUDA_GEMV_TC_CUH
#define OG_KERNELS_CUDA_GEMV_TC_CUH

#include "kernels/cuda/ops_cuda.h"

#include <cuda_runtime.h>

struct og_gemv_tc_launch {
    cudaStream_t stream;
    og_dtype dtype;              /* of every weight: bf16, q8 or q4          */
    int64_t T, K;
    const float *x;              /* [T, K], or NULL with norm set           */
    const og_gemv_cuda_norm *norm;
    /* parts of one launch (og_gemv_norm_multi_cuda), or, with swiglu, the
     * gate (part 0) and up (part 1) weights of out = silu(gate) * up written
     * to out[0] ([T, F], F = N[0] = N[1]) */
    int n_parts;
    bool swiglu;
    const void *w[OG_GEMV_CUDA_MAX_PARTS];    /* [N, K] */
    const void *bias[OG_GEMV_CUDA_MAX_PARTS]; /* [N] or NULL: bf16 beside bf16 weights, f32 beside q8/q4 */
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];       /* [T, N] */
};

/* True when the tensor-core kernels take a product of these weights (bf16,
 * or q8 / q4 with 2 rows of x or more; K a multiple of 32; x and every
 * weight 16-byte aligned) and the environment does not ask for the
 * CUDA-core kernels (OG_CUDA_GEMV=cores). */
bool og_gemv_tc_takes(og_dtype dtype, int64_t T, int64_t K, const float *x, const void *const *w, int n_w);

/* Enqueues the launch described (already checked by the caller). */
og_status og_gemv_tc_run(const og_gemv_tc_launch *l);

#endif /* OG_KERNELS_CUDA_GEMV_TC_CUH */
