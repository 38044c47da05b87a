/* NCCL for tensor parallel across GPUs (docs/tensor-parallel.md), loaded
 * when first asked for (dlopen of libnccl.so.2, the library the CUDA toolkit
 * ships), so that a machine without it runs everything else: one process
 * drives the GPUs, a communicator of one rank per GPU (ncclCommInitAll), and
 * in-place sum all-reduces of f32 activations enqueued on a stream (and so
 * captured into its decode graphs). As built, the CUDA back end uses it at
 * N = 1 only, behind OG_CUDA_NCCL=1: the check that the all-reduces after
 * the row-parallel products sit where the planner puts them, inside the
 * captured graphs, and change no bit (one rank's sum is its own value). */
#ifndef OG_EXEC_NCCL_CUDA_H
#define OG_EXEC_NCCL_CUDA_H

#include "core/core.h"

#include <cuda_runtime.h>

typedef struct og_nccl og_nccl;

/* A communicator over n_devices GPUs (their CUDA ordinals). On success *out
 * is owned by the caller (og_nccl_close). OG_ERR_UNSUPPORTED naming the
 * library when it cannot be loaded; OG_ERR_BACKEND when NCCL refuses. */
og_status og_nccl_open(int n_devices, const int *devices, og_nccl **out);
void og_nccl_close(og_nccl *c);
/* buf[count] (f32, on rank's GPU) becomes the sum over every rank's buf,
 * enqueued on stream (every rank must enqueue its own). */
og_status og_nccl_all_reduce_sum(og_nccl *c, int rank, float *buf, size_t count, cudaStream_t stream);

#endif /* OG_EXEC_NCCL_CUDA_H */
