/* KV storage in CUDA device memory: stream-ordered allocation, free and
 * copy, and growth in place through virtual memory management (second half
 * of the file). Every runtime and driver call is checked and mapped to an
 * og_status. */
#include "kv/alloc_cuda.h"
#include "kv/kv.h"

#include "core/core.h"

#include <cudaTypedefs.h> /* driver types and function pointer types; nothing links libcuda */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>

static og_status cuda_status(cudaError_t e, const char *what, size_t bytes) {
    og_status st = e == cudaErrorMemoryAllocation ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND;
    return og_set_error(st, "kv cuda allocator: %s (%zu bytes): %s (%s)", what, bytes, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

static og_status cuda_alloc(void *ctx, size_t bytes, void **out) {
    if (!out || bytes == 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda allocator: %s",
                            out ? "zero-byte allocation" : "out is NULL");
    if (og_kv_test_fault("kv cuda allocator: cudaMallocAsync", bytes)) return OG_ERR_OUT_OF_MEMORY;
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes, (cudaStream_t)ctx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* allocation errors are not sticky; clear them */
        return cuda_status(e, "cudaMallocAsync", bytes);
    }
    *out = p;
    return OG_OK;
}

static void cuda_free(void *ctx, void *ptr) {
    if (!ptr) return;
    cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)ctx);
    if (e != cudaSuccess)
        OG_WARN("kv cuda allocator: cudaFreeAsync(%p): %s (%s)", ptr, cudaGetErrorName(e), cudaGetErrorString(e));
}

static og_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return OG_OK;
    if (!dst || !src) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda allocator: copy with a NULL pointer");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)ctx);
    return e == cudaSuccess ? OG_OK : cuda_status(e, "cudaMemcpyAsync device to device", bytes);
}

/* Rows between the host and device memory, ordered on the stream, waited for. */
static og_status cuda_copy_2d(cudaStream_t stream, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                              size_t width, size_t rows, enum cudaMemcpyKind kind) {
    if (rows == 0 || width == 0) return OG_OK;
    if (!dst || !src) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda allocator: copy with a NULL pointer");
    const char *what = kind == cudaMemcpyDeviceToHost ? "cudaMemcpy2DAsync device to host" : "cudaMemcpy2DAsync host to device";
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, kind, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? OG_OK : cuda_status(e, what, width * rows);
}

static og_status cuda_to_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                              size_t rows) {
    return cuda_copy_2d((cudaStream_t)ctx, dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToHost);
}

static og_status cuda_from_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                size_t width, size_t rows) {
    return cuda_copy_2d((cudaStream_t)ctx, dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyHostToDevice);
}

og_status og_kv_allocator_cuda(void *stream, og_kv_allocator *out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_allocator_cuda: out is NULL");
    int count = 0, device = 0, pools = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || (e == cudaSuccess && count == 0)) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_NO_DEVICE, "og_kv_allocator_cuda: no CUDA device (%s)",
                            e == cudaSuccess ? "device count 0" : cudaGetErrorName(e));
    }
    if (e != cudaSuccess) return cuda_status(e, "cudaGetDeviceCount", 0);
    if ((e = cudaGetDevice(&device)) != cudaSuccess) return cuda_status(e, "cudaGetDevice", 0);
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
    if (e != cudaSuccess) return cuda_status(e, "cudaDeviceGetAttribute(MemoryPoolsSupported)", 0);
    if (!pools)
        return og_set_error(OG_ERR_UNSUPPORTED, "og_kv_allocator_cuda: device %d has no stream-ordered memory pools",
                            device);
    *out = (og_kv_allocator){.alloc = cuda_alloc, .free = cuda_free, .copy = cuda_copy, .ctx = stream,
                             .to_host = cuda_to_host, .from_host = cuda_from_host};
    return OG_OK;
}

/* ------------------------------------------------- growth in place (VMM)
 *
 * A reservation is address space for a block's max_bytes
 * (cuMemAddressReserve); its first bytes are backed by physical chunks
 * (cuMemCreate) mapped one after another (cuMemMap, cuMemSetAccess for this
 * device). Every size is rounded up to the allocation granularity. A resize
 * that grows creates and maps one chunk for the bytes it adds, so a growth
 * is three driver calls whatever its size; a resize that shrinks unmaps and
 * releases the chunks wholly past the bytes kept (a rolled-back growth gives
 * back exactly the chunk it mapped). Unmapping waits for the stream first,
 * as does freeing a reservation, so no queued kernel reads unmapped memory.
 * Ring layers and everything else that does not grow in place take
 * stream-ordered blocks (cudaMallocAsync), as the plain allocator does.
 *
 * share (fork) reserves a new block and maps into it the very chunks of the
 * source block that lie wholly below the shared bytes: each mapping holds
 * its own reference to the chunk's physical memory
 * (cuMemRetainAllocationHandle), released when that block unmaps it, so the
 * memory goes when the last block mapping it does. The part of the shared
 * bytes in a chunk that straddles the boundary is copied into the block's
 * first new chunk (at most one chunk of the source: one growth's worth).
 *
 * The driver functions come through the runtime
 * (cudaGetDriverEntryPointByVersion), so nothing links libcuda at build time. */

/* ABI versions the function pointer types below were written against. */
#define VMM_DRIVER_ABI 12000

typedef struct vmm_driver {
    PFN_cuGetErrorName_v6000 error_name;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_attribute;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemRetainAllocationHandle_v11000 retain;
} vmm_driver;

typedef struct vmm_chunk {
    size_t offset, bytes; /* where in the reservation it is mapped, and its size */
    CUmemGenericAllocationHandle handle;
} vmm_chunk;

typedef struct vmm_block {
    CUdeviceptr base;
    size_t max_bytes;   /* the most bytes the block may grow to (reserve's max_bytes) */
    size_t reserved;    /* bytes of address space, a multiple of the granularity */
    size_t backed;      /* bytes mapped from base: the sum of the chunks' sizes   */
    vmm_chunk *chunks;  /* [cap], the first n mapped, in address order           */
    int32_t n, cap;
    struct vmm_block *next;
} vmm_block;

typedef struct vmm_ctx {
    cudaStream_t stream;
    int device;
    size_t granularity;
    CUmemAllocationProp prop; /* pinned device memory of `device` */
    CUmemAccessDesc access;   /* read-write for `device`           */
    vmm_driver drv;
    pthread_mutex_t lock; /* guards `blocks` */
    vmm_block *blocks;    /* live reservations */
} vmm_ctx;

static og_status vmm_status(const vmm_ctx *c, CUresult r, const char *what, size_t bytes) {
    const char *name = NULL;
    if (c->drv.error_name(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUDA driver error";
    return og_set_error(r == CUDA_ERROR_OUT_OF_MEMORY ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND,
                        "kv cuda vmm allocator: %s (%zu bytes) on device %d: %s", what, bytes, c->device, name);
}

static size_t round_up(size_t bytes, size_t granularity) {
    return (bytes + granularity - 1) / granularity * granularity;
}

/* The block reserved at ptr, or NULL (a stream-ordered block, or not ours).
 * Caller holds the lock. */
static vmm_block *vmm_find(vmm_ctx *c, const void *ptr, vmm_block ***link) {
    for (vmm_block **l = &c->blocks; *l; l = &(*l)->next)
        if ((*l)->base == (CUdeviceptr)(uintptr_t)ptr) {
            if (link) *link = l;
            return *l;
        }
    return NULL;
}

/* Unmaps and releases chunks from the end while they lie wholly past `keep`
 * bytes. Waits for the stream first. Stops at the first failure. */
static og_status vmm_unmap_past(vmm_ctx *c, vmm_block *b, size_t keep) {
    if (b->n == 0 || b->chunks[b->n - 1].offset < keep) return OG_OK;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return cuda_status(e, "cudaStreamSynchronize before unmapping", b->backed - keep);
    while (b->n > 0 && b->chunks[b->n - 1].offset >= keep) {
        vmm_chunk *ch = &b->chunks[b->n - 1];
        CUresult r = c->drv.unmap(b->base + ch->offset, ch->bytes);
        if (r != CUDA_SUCCESS) return vmm_status(c, r, "cuMemUnmap", ch->bytes);
        if ((r = c->drv.release(ch->handle)) != CUDA_SUCCESS)
            OG_WARN("kv cuda vmm allocator: cuMemRelease of %zu bytes: error %d", ch->bytes, (int)r);
        b->backed = ch->offset;
        b->n--;
    }
    return OG_OK;
}

/* Backs the block up to `target` bytes (a multiple of the granularity,
 * above b->backed) with one new chunk; all or nothing. */
static og_status vmm_map_to(vmm_ctx *c, vmm_block *b, size_t target) {
    if (b->n == b->cap) {
        int32_t cap = b->cap ? 2 * b->cap : 4;
        vmm_chunk *grown = og_realloc(b->chunks, (size_t)cap * sizeof *grown);
        if (!grown) return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cuda vmm allocator: no host memory for chunks");
        b->chunks = grown;
        b->cap = cap;
    }
    const size_t bytes = target - b->backed;
    const CUdeviceptr at = b->base + b->backed;
    CUmemGenericAllocationHandle h;
    if (og_kv_test_fault("kv cuda vmm allocator: cuMemCreate", bytes)) return OG_ERR_OUT_OF_MEMORY;
    CUresult r = c->drv.create(&h, bytes, &c->prop, 0);
    if (r != CUDA_SUCCESS) return vmm_status(c, r, "cuMemCreate", bytes);
    if ((r = c->drv.map(at, bytes, 0, h, 0)) != CUDA_SUCCESS) {
        og_status st = vmm_status(c, r, "cuMemMap", bytes);
        c->drv.release(h);
        return st;
    }
    if ((r = c->drv.set_access(at, bytes, &c->access, 1)) != CUDA_SUCCESS) {
        og_status st = vmm_status(c, r, "cuMemSetAccess", bytes);
        c->drv.unmap(at, bytes);
        c->drv.release(h);
        return st;
    }
    b->chunks[b->n++] = (vmm_chunk){.offset = b->backed, .bytes = bytes, .handle = h};
    b->backed = target;
    return OG_OK;
}

/* Releases everything of a block (unlinked by the caller); waits for the stream. */
static void vmm_block_destroy(vmm_ctx *c, vmm_block *b) {
    og_status st = vmm_unmap_past(c, b, 0);
    if (st != OG_OK) OG_WARN("%s", og_last_error());
    CUresult r = c->drv.address_free(b->base, b->reserved);
    if (r != CUDA_SUCCESS) OG_WARN("kv cuda vmm allocator: cuMemAddressFree of %zu bytes: error %d", b->reserved, (int)r);
    og_free(b->chunks);
    og_free(b);
}

static og_status vmm_alloc(void *ctx, size_t bytes, void **out) {
    return cuda_alloc(((vmm_ctx *)ctx)->stream, bytes, out);
}

static og_status vmm_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    return cuda_copy(((vmm_ctx *)ctx)->stream, dst, src, bytes);
}

static og_status vmm_reserve(void *ctx, size_t max_bytes, size_t bytes, void **out) {
    vmm_ctx *c = ctx;
    if (!out || bytes == 0 || bytes > max_bytes)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda vmm allocator: reserve of %zu bytes backing %zu: %s",
                            max_bytes, bytes, !out ? "out is NULL" : "bad sizes");
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cuda_status(e, "cudaSetDevice", bytes);
    vmm_block *b = og_calloc(1, sizeof *b);
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cuda vmm allocator: no host memory");
    b->max_bytes = max_bytes;
    b->reserved = round_up(max_bytes, c->granularity);
    CUresult r = c->drv.address_reserve(&b->base, b->reserved, c->granularity, 0, 0);
    if (r != CUDA_SUCCESS) {
        og_free(b);
        return vmm_status(c, r, "cuMemAddressReserve", max_bytes);
    }
    og_status st = vmm_map_to(c, b, round_up(bytes, c->granularity));
    if (st != OG_OK) {
        vmm_block_destroy(c, b);
        return st;
    }
    pthread_mutex_lock(&c->lock);
    b->next = c->blocks;
    c->blocks = b;
    pthread_mutex_unlock(&c->lock);
    *out = (void *)(uintptr_t)b->base;
    return OG_OK;
}

/* Maps a retained handle of `bytes` at `offset` of b as its next chunk; on
 * failure the handle is released. */
static og_status vmm_map_handle(vmm_ctx *c, vmm_block *b, CUmemGenericAllocationHandle h, size_t offset, size_t bytes) {
    if (b->n == b->cap) {
        int32_t cap = b->cap ? 2 * b->cap : 4;
        vmm_chunk *grown = og_realloc(b->chunks, (size_t)cap * sizeof *grown);
        if (!grown) {
            c->drv.release(h);
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cuda vmm allocator: no host memory for chunks");
        }
        b->chunks = grown;
        b->cap = cap;
    }
    const CUdeviceptr at = b->base + offset;
    CUresult r = c->drv.map(at, bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        c->drv.release(h);
        return vmm_status(c, r, "cuMemMap (shared chunk)", bytes);
    }
    if ((r = c->drv.set_access(at, bytes, &c->access, 1)) != CUDA_SUCCESS) {
        og_status st = vmm_status(c, r, "cuMemSetAccess (shared chunk)", bytes);
        c->drv.unmap(at, bytes);
        c->drv.release(h);
        return st;
    }
    b->chunks[b->n++] = (vmm_chunk){.offset = offset, .bytes = bytes, .handle = h};
    b->backed = offset + bytes;
    return OG_OK;
}

static og_status vmm_share(void *ctx, void *src_ctx, void *src, size_t shared_bytes, size_t max_bytes, size_t bytes,
                           void **out) {
    vmm_ctx *c = ctx, *sc = src_ctx;
    if (!out || !sc || bytes == 0 || bytes > max_bytes || shared_bytes > bytes || shared_bytes % c->granularity)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "kv cuda vmm allocator: share of %zu bytes into a reserve of %zu backing %zu: %s",
                            shared_bytes, max_bytes, bytes, !out || !sc ? "NULL argument" : "bad sizes");
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cuda_status(e, "cudaSetDevice", bytes);
    /* the source's rows are complete before they are mapped or copied */
    if (sc->stream != c->stream && (e = cudaStreamSynchronize(sc->stream)) != cudaSuccess)
        return cuda_status(e, "cudaStreamSynchronize of the source's stream", shared_bytes);
    vmm_block *b = og_calloc(1, sizeof *b);
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cuda vmm allocator: no host memory");
    b->max_bytes = max_bytes;
    b->reserved = round_up(max_bytes, c->granularity);
    CUresult r = c->drv.address_reserve(&b->base, b->reserved, c->granularity, 0, 0);
    if (r != CUDA_SUCCESS) {
        og_free(b);
        return vmm_status(c, r, "cuMemAddressReserve", max_bytes);
    }
    og_status st = OG_OK;
    CUdeviceptr src_base = 0;
    pthread_mutex_lock(&sc->lock);
    vmm_block *s = vmm_find(sc, src, NULL);
    if (!s || shared_bytes > s->backed) {
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda vmm allocator: share of %zu bytes of %p: %s", shared_bytes,
                          src, !s ? "not a reservation of the source allocator" : "more than the source backs");
    } else {
        src_base = s->base;
        for (int32_t i = 0; i < s->n && st == OG_OK; i++) {
            const vmm_chunk *ch = &s->chunks[i];
            if (ch->offset + ch->bytes > shared_bytes) break;
            CUmemGenericAllocationHandle h;
            r = c->drv.retain(&h, (void *)(uintptr_t)(s->base + ch->offset));
            st = r == CUDA_SUCCESS ? vmm_map_handle(c, b, h, ch->offset, ch->bytes)
                                   : vmm_status(c, r, "cuMemRetainAllocationHandle", ch->bytes);
        }
    }
    pthread_mutex_unlock(&sc->lock);
    const size_t whole = b->backed; /* shared by mapping; [whole, shared_bytes) is copied */
    const size_t target = round_up(bytes, c->granularity);
    if (st == OG_OK && target > b->backed) st = vmm_map_to(c, b, target);
    if (st == OG_OK && shared_bytes > whole) {
        e = cudaMemcpyAsync((void *)(uintptr_t)(b->base + whole), (const void *)(uintptr_t)(src_base + whole),
                            shared_bytes - whole, cudaMemcpyDeviceToDevice, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream); /* complete before any stream reads it */
        if (e != cudaSuccess) st = cuda_status(e, "copy of the boundary chunk", shared_bytes - whole);
    }
    if (st != OG_OK) {
        vmm_block_destroy(c, b);
        return st;
    }
    pthread_mutex_lock(&c->lock);
    b->next = c->blocks;
    c->blocks = b;
    pthread_mutex_unlock(&c->lock);
    *out = (void *)(uintptr_t)b->base;
    return OG_OK;
}

static og_status vmm_to_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                             size_t rows) {
    return cuda_copy_2d(((vmm_ctx *)ctx)->stream, dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToHost);
}

static og_status vmm_from_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                               size_t rows) {
    return cuda_copy_2d(((vmm_ctx *)ctx)->stream, dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyHostToDevice);
}

static og_status vmm_resize(void *ctx, void *ptr, size_t bytes) {
    vmm_ctx *c = ctx;
    pthread_mutex_lock(&c->lock);
    vmm_block *b = vmm_find(c, ptr, NULL);
    og_status st = OG_OK;
    if (!b || bytes == 0 || bytes > b->max_bytes) {
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda vmm allocator: resize of %p to %zu bytes: %s", ptr, bytes,
                          !b ? "not a reservation of this allocator" : "outside the reservation");
    } else {
        cudaError_t e = cudaSetDevice(c->device);
        size_t target = round_up(bytes, c->granularity);
        if (e != cudaSuccess) st = cuda_status(e, "cudaSetDevice", bytes);
        else if (target > b->backed) st = vmm_map_to(c, b, target);
        else st = vmm_unmap_past(c, b, target);
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

static void vmm_free(void *ctx, void *ptr) {
    vmm_ctx *c = ctx;
    if (!ptr) return;
    pthread_mutex_lock(&c->lock);
    vmm_block **link = NULL, *b = vmm_find(c, ptr, &link);
    if (b) *link = b->next;
    pthread_mutex_unlock(&c->lock);
    if (!b) {
        cuda_free(c->stream, ptr);
        return;
    }
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) OG_WARN("kv cuda vmm allocator: cudaSetDevice(%d): %s", c->device, cudaGetErrorName(e));
    vmm_block_destroy(c, b);
}

/* Fills c->drv; false (with the missing symbol in og_last_error) when the
 * driver lacks one of them. */
static bool vmm_load_driver(vmm_driver *d) {
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"cuGetErrorName", (void **)&d->error_name},
        {"cuDeviceGet", (void **)&d->device_get},
        {"cuDeviceGetAttribute", (void **)&d->device_attribute},
        {"cuMemGetAllocationGranularity", (void **)&d->granularity},
        {"cuMemAddressReserve", (void **)&d->address_reserve},
        {"cuMemAddressFree", (void **)&d->address_free},
        {"cuMemCreate", (void **)&d->create},
        {"cuMemRelease", (void **)&d->release},
        {"cuMemMap", (void **)&d->map},
        {"cuMemUnmap", (void **)&d->unmap},
        {"cuMemSetAccess", (void **)&d->set_access},
        {"cuMemRetainAllocationHandle", (void **)&d->retain},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPointByVersion(syms[i].name, syms[i].fn, VMM_DRIVER_ABI, cudaEnableDefault,
                                                         &found);
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !*syms[i].fn) {
            (void)cudaGetLastError();
            og_set_error(OG_ERR_UNSUPPORTED, "the CUDA driver has no %s", syms[i].name);
            return false;
        }
    }
    return true;
}

/* The device's recommended granules one growth maps (the allocator's
 * granularity is that many of them): a growth's three driver calls cost
 * about the same whatever their size, and a batched step of 256 sessions
 * grew 14 blocks a step by one 2 MiB granule each (bench/gpu/notes.md);
 * more granules a growth means fewer growths for at most that many bytes
 * per session backed ahead of its rows. OG_CUDA_KV_GRANULES (1 to 64)
 * overrides it, for measurements. */
enum { KV_GROWTH_GRANULES = 4 };

static int growth_granules(void) {
    const char *v = getenv("OG_CUDA_KV_GRANULES");
    const int n = v ? atoi(v) : 0;
    return n >= 1 && n <= 64 ? n : KV_GROWTH_GRANULES;
}

/* Sets up c for the current device; OG_ERR_UNSUPPORTED when the driver or
 * the device cannot manage virtual memory. */
static og_status vmm_init(vmm_ctx *c, void *stream) {
    c->stream = (cudaStream_t)stream;
    cudaError_t e = cudaGetDevice(&c->device);
    if (e != cudaSuccess) return cuda_status(e, "cudaGetDevice", 0);
    if (!vmm_load_driver(&c->drv)) return OG_ERR_UNSUPPORTED;
    CUdevice dev;
    int supported = 0;
    CUresult r = c->drv.device_get(&dev, c->device);
    if (r == CUDA_SUCCESS)
        r = c->drv.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (r != CUDA_SUCCESS) return vmm_status(c, r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", 0);
    if (!supported)
        return og_set_error(OG_ERR_UNSUPPORTED, "device %d has no virtual memory management", c->device);
    c->prop = (CUmemAllocationProp){
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->device},
    };
    c->access = (CUmemAccessDesc){
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->device},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    r = c->drv.granularity(&c->granularity, &c->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS) return vmm_status(c, r, "cuMemGetAllocationGranularity", 0);
    if (c->granularity == 0) return og_set_error(OG_ERR_BACKEND, "kv cuda vmm allocator: granularity 0");
    c->granularity *= (size_t)growth_granules();
    return OG_OK;
}

og_status og_kv_allocator_cuda_vmm(void *stream, og_kv_allocator *out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_allocator_cuda_vmm: out is NULL");
    og_kv_allocator plain;
    og_status st = og_kv_allocator_cuda(stream, &plain);
    if (st != OG_OK) return st;
    vmm_ctx *c = og_calloc(1, sizeof *c);
    if (!c) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_kv_allocator_cuda_vmm: no host memory");
    st = vmm_init(c, stream);
    if (st != OG_OK) {
        og_free(c);
        if (st != OG_ERR_UNSUPPORTED) return st;
        OG_DEBUG("og_kv_allocator_cuda_vmm: growth moves storage (%s)", og_last_error());
        *out = plain;
        return OG_OK;
    }
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        og_free(c);
        return og_set_error(OG_ERR_BACKEND, "og_kv_allocator_cuda_vmm: pthread_mutex_init failed");
    }
    *out = (og_kv_allocator){.alloc = vmm_alloc, .free = vmm_free, .copy = vmm_copy, .ctx = c,
                             .reserve = vmm_reserve, .resize = vmm_resize, .granularity = c->granularity,
                             .share = vmm_share, .to_host = vmm_to_host, .from_host = vmm_from_host};
    return OG_OK;
}

size_t og_kv_allocator_cuda_granularity(const og_kv_allocator *a) {
    return a && a->free == vmm_free ? ((const vmm_ctx *)a->ctx)->granularity : 0;
}

void og_kv_allocator_cuda_release(og_kv_allocator *a) {
    if (!a || a->free != vmm_free) return;
    vmm_ctx *c = a->ctx;
    if (c->blocks) OG_WARN("og_kv_allocator_cuda_release: reservations still live; releasing them");
    while (c->blocks) {
        vmm_block *b = c->blocks;
        c->blocks = b->next;
        vmm_block_destroy(c, b);
    }
    pthread_mutex_destroy(&c->lock);
    og_free(c);
    *a = (og_kv_allocator){0};
}
