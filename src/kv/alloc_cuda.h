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

/* Device memory made ahead of the growths of the sessions of one model:
 * chunks of one unit of the growth-in-place allocators' granularity (four
 * recommended granules), which a thread of the pool keeps made, so that a
 * growth in a step's prepare maps one instead of asking the driver for
 * memory (cuMemCreate). The thread starts at the first growth; it keeps
 * OG_CUDA_KV_POOL chunks (default 8, at most 64), so a model whose sessions
 * grow holds up to that many units of device memory beyond its sessions'.
 * A chunk is mapped once and never returns to the pool. */
typedef struct og_kv_cuda_pool og_kv_cuda_pool;
typedef struct og_kv_pool_stats {
    int32_t held, target; /* chunks made and not taken; how many the pool keeps */
    size_t unit;          /* bytes of a chunk */
    int64_t taken, made;  /* since creation: chunks growths took; chunks the thread made */
} og_kv_pool_stats;
/* *out = a pool for the current device, or NULL (OG_OK) when
 * OG_CUDA_KV_POOL is 0 or the device cannot grow storage in place. */
og_status og_kv_cuda_pool_create(og_kv_cuda_pool **out);
/* Stops the thread and releases the chunks not taken; after every
 * allocator given the pool is released. NULL is a no-op. */
void og_kv_cuda_pool_destroy(og_kv_cuda_pool *p);
/* *out: p's figures (zeroes for NULL). */
void og_kv_cuda_pool_stats(og_kv_cuda_pool *p, og_kv_pool_stats *out);

/* Fills *out with the allocator CUDA sessions use: like og_kv_allocator_cuda
 * (alloc, free and copy ordered on `stream`), plus growth in place through
 * CUDA virtual memory management: reserve takes address space for the
 * largest size once, resize maps or unmaps device memory at its end, so a
 * flat layer's storage never moves (see og_kv_allocator in offgraph.h).
 * Memory is backed in multiples of four of the device's recommended
 * allocation granules (OG_CUDA_KV_GRANULES changes how many), which the
 * allocator's `granularity` member reports. With a pool (NULL: none), a
 * growth of one such unit maps a chunk the pool made ahead.
 * Freeing or shrinking a reservation first waits for `stream`. Calls make the
 * device that was current at creation current on the calling thread.
 * When the driver or the device has no virtual memory management, *out is
 * og_kv_allocator_cuda's allocator (reserve and resize NULL: growth moves).
 * Errors as og_kv_allocator_cuda. On success the allocator must be released
 * with og_kv_allocator_cuda_release after every session using it is
 * destroyed; its calls may come from several threads. */
og_status og_kv_allocator_cuda_vmm(void *stream, og_kv_cuda_pool *pool, og_kv_allocator *out);

/* Bytes a growth-in-place allocator of og_kv_allocator_cuda_vmm backs at a
 * time (its allocation granularity); 0 for any other allocator. */
size_t og_kv_allocator_cuda_granularity(const og_kv_allocator *a);

/* Releases what og_kv_allocator_cuda_vmm holds and zeroes *a; a no-op for
 * other allocators and NULL. Reservations still live are freed (with a
 * warning). */
void og_kv_allocator_cuda_release(og_kv_allocator *a);

#endif /* OG_KV_ALLOC_CUDA_H */
