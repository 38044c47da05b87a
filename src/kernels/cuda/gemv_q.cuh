/* The bandwidth-first decode product for q8 / q4 weights (gemv_q.cu),
 * behind the gemv entry points of ops_cuda.h: ops.cu checks the arguments
 * and calls og_gemvq_run when og_gemvq_takes says the case fits. Internal to
 * src/kernels/cuda.
 *
 * Letters: T rows of x (1..8), K in features, N out features of a part, F
 * the ffn width of a gate/up pair. */
#ifndef OG_KERNELS_CUDA_GEMV_Q_CUH
#define OG_KERNELS_CUDA_GEMV_Q_CUH

#include "kernels/cuda/ops_cuda.h"

#include <cuda_runtime.h>

struct og_gemvq_launch {
    cudaStream_t stream;
    og_dtype dtype;              /* of every weight: q8 or q4               */
    int64_t T, K;
    const float *x;              /* [T, K] 16-byte aligned, or NULL with norm set */
    const og_gemv_cuda_norm *norm;
    /* parts of one launch (og_gemv_norm_multi_cuda), or, with swiglu, the
     * gate (w[0]) and up (w[1]) weights of out = silu(gate) * up written to
     * out[0] ([T, F], F = N[0]) */
    int n_parts;
    bool swiglu;
    const void *w[OG_GEMV_CUDA_MAX_PARTS];    /* [N, K], 16-byte aligned */
    const float *bias[OG_GEMV_CUDA_MAX_PARTS]; /* [N] or NULL */
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];       /* [T, N] */
};

/* True when the switch is on (og_gemvq_cuda_get) and the case fits: q8 or
 * q4 weights, 1 <= T <= 8, and x (T x K floats) within the shared memory a
 * block stages it in. */
bool og_gemvq_takes(og_dtype dtype, int64_t T, int64_t K);

/* Enqueues the launch described (already checked by the caller). */
og_status og_gemvq_run(const og_gemvq_launch *l);

#endif /* OG_KERNELS_CUDA_GEMV_Q_CUH */
