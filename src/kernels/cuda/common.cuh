/* Device and launch helpers shared by the CUDA kernel files (ops.cu,
 * gemv.cu): warp and block sums, the programmatic-dependent-launch wait, and
 * the launch wrapper that allows it. Internal to src/kernels/cuda. */
#ifndef OG_KERNELS_CUDA_COMMON_CUH
#define OG_KERNELS_CUDA_COMMON_CUH

#include "core/core.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

namespace og_cuda {

__device__ inline float load_w(const void *w, bool bf16, int64_t i) {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(w)[i]) : static_cast<const float *>(w)[i];
}

__device__ inline float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* The sum of every thread's s over the block (of at most 1024 threads), in
 * every thread: lane trees, then warp 0 adds the warps' sums (the order the
 * gemv norm prologues reproduce). Calls may follow each other directly. */
__device__ inline float block_sum(float s) {
    __shared__ float part[32];
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    const float sum = part[0];
    __syncthreads(); /* a next call's writes to part wait until every thread has read this one's sum */
    return sum;
}

/* Waits for the kernels this one depends on (programmatic dependent launch;
 * a no-op when launched without it), and lets the next kernel start its own
 * prologue. Every kernel launched by launch_pdl calls it before it reads what
 * an earlier kernel wrote or writes anything. */
__device__ inline void grid_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
}

/* Streamed weights (the decode products'): read once, so they skip L1. */
__device__ inline uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* A weight w as bf16 hi = bf16(w) and lo = bf16(w - hi), both rounded to
 * nearest: hi + lo is w within 2^-16 |w| (the panels of a tensor-core
 * product of quantized weights). */
__device__ inline void og_split_bf16(float w, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    const __nv_bfloat16 h = __float2bfloat16_rn(w);
    *hi = h;
    *lo = __float2bfloat16_rn(w - __bfloat162float(h));
}
/* Eight of them, stored with one 16-byte store each (hi, lo 16-byte aligned). */
__device__ inline void og_split8_bf16(const float w[8], __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    __align__(16) __nv_bfloat16 h[8], l[8];
#pragma unroll
    for (int j = 0; j < 8; j++) og_split_bf16(w[j], &h[j], &l[j]);
    *reinterpret_cast<uint4 *>(hi) = *reinterpret_cast<const uint4 *>(h);
    *reinterpret_cast<uint4 *>(lo) = *reinterpret_cast<const uint4 *>(l);
}

inline og_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return OG_OK;
    return og_set_error(OG_ERR_BACKEND, "%s: launch: %s (%s)", op, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Programmatic dependent launch is allowed unless the environment sets
 * OG_CUDA_PDL=0. */
inline bool pdl_enabled() {
    static const bool on = [] {
        const char *v = getenv("OG_CUDA_PDL");
        return !(v && v[0] == '0');
    }();
    return on;
}

/* Launches kernel with programmatic dependent launch allowed (pdl_enabled):
 * it may start while the kernel before it on the stream still runs, and
 * waits in grid_wait for that kernel's results. Errors are left for
 * launched() to report. */
template <typename... Params, typename... Args>
void launch_ex(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl && pdl_enabled() ? 1 : 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
void launch_pdl_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
    launch_ex(true, kernel, grid, block, smem, stream, args...);
}

/* Launches kernel after the kernel before it on the stream has finished
 * (no programmatic dependent launch): for kernels that read, before their
 * grid_wait, memory an earlier kernel may still be writing. */
template <typename... Params, typename... Args>
void launch_after_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args... args) {
    launch_ex(false, kernel, grid, block, smem, stream, args...);
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
    launch_pdl_smem(kernel, grid, block, 0, stream, args...);
}

} /* namespace og_cuda */

#endif /* OG_KERNELS_CUDA_COMMON_CUH */
