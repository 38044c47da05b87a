/* KV storage in CUDA device memory (built only with CUDA). */
#ifndef OG_KV_ALLOC_CUDA_H
#define OG_KV_ALLOC_CUDA_H

#include "offgraph.h"

/* Fills *out with an allocator that takes device memory with
 * cudaMallocAsync, frees it with cudaFreeAsync and copies with
 * cudaMemcpyAsync, all ordered on `stream` (a cudaStream_t; NULL = the
 * default stream) of the current device. The allocator holds no state of its
 * own; the stream must outlive every session that uses it. Reads of storage
 * by other streams must synchronize with `stream` first.
 * OG_ERR_NO_DEVICE when no CUDA device is present, OG_ERR_UNSUPPORTED when the
 * current device has no stream-ordered memory pools. */
og_status og_kv_allocator_cuda(void *stream, og_kv_allocator *out);

#endif /* OG_KV_ALLOC_CUDA_H */
