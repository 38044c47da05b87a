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

/* Fills *out with the allocator CUDA sessions use: like og_kv_allocator_cuda
 * (alloc, free and copy ordered on `stream`), plus growth in place through
 * CUDA virtual memory management: reserve takes address space for the
 * largest size once, resize maps or unmaps device memory at its end, so a
 * flat layer's storage never moves (see og_kv_allocator in offgraph.h).
 * Memory is backed in multiples of four of the device's recommended
 * allocation granules (OG_CUDA_KV_GRANULES changes how many), which the
 * allocator's `granularity` member reports.
 * Freeing or shrinking a reservation first waits for `stream`. Calls make the
 * device that was current at creation current on the calling thread.
 * When the driver or the device has no virtual memory management, *out is
 * og_kv_allocator_cuda's allocator (reserve and resize NULL: growth moves).
 * Errors as og_kv_allocator_cuda. On success the allocator must be released
 * with og_kv_allocator_cuda_release after every session using it is
 * destroyed; its calls may come from several threads. */
og_status og_kv_allocator_cuda_vmm(void *stream, og_kv_allocator *out);

/* Bytes a growth-in-place allocator of og_kv_allocator_cuda_vmm backs at a
 * time (its allocation granularity); 0 for any other allocator. */
size_t og_kv_allocator_cuda_granularity(const og_kv_allocator *a);

/* Releases what og_kv_allocator_cuda_vmm holds and zeroes *a; a no-op for
 * other allocators and NULL. Reservations still live are freed (with a
 * warning). */
void og_kv_allocator_cuda_release(og_kv_allocator *a);

#endif /* OG_KV_ALLOC_CUDA_H */
