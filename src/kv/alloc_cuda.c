/* KV storage in CUDA device memory: stream-ordered allocation, free and
 * copy. Every runtime call is checked and mapped to an og_status. */
#include "kv/alloc_cuda.h"

#include "core/core.h"

#include <cuda_runtime_api.h>

static og_status cuda_status(cudaError_t e, const char *what, size_t bytes) {
    og_status st = e == cudaErrorMemoryAllocation ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND;
    return og_set_error(st, "kv cuda allocator: %s (%zu bytes): %s (%s)", what, bytes, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

static og_status cuda_alloc(void *ctx, size_t bytes, void **out) {
    if (!out || bytes == 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cuda allocator: %s",
                            out ? "zero-byte allocation" : "out is NULL");
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
    *out = (og_kv_allocator){.alloc = cuda_alloc, .free = cuda_free, .copy = cuda_copy, .ctx = stream};
    return OG_OK;
}
