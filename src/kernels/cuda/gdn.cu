/* CUDA kernels of the hybrid layers (gdn_cuda.h). Letters as in
 * kernels/gdn.h. Plain launches (no programmatic dependent launch): each
 * kernel starts when the work before it on the stream is done. */
extern "C" {
#include "kernels/cuda/gdn_cuda.h"
#include "kernels/gdn_internal.h"
#include "kernels/ops_internal.h"
}

#include "kernels/cuda/common.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

using og_cuda::block_sum;
using og_cuda::launched;
using og_cuda::load_w;
using og_cuda::warp_sum;

namespace {

__device__ inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- causal_conv1d: one thread per channel, the tokens in turn, the last
 * K inputs of the channel in registers ---- */
__global__ void conv_kernel(const float *x, const void *w, bool bf16, const float *state_in, float *state_out,
                            int64_t T, int64_t C, int K, float *out) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float wk[OG_GDN_MAX_KERNEL], win[OG_GDN_MAX_KERNEL]; /* taps; the last K - 1 inputs then the new one */
    for (int j = 0; j < K; j++) wk[j] = load_w(w, bf16, c * K + j);
    for (int j = 0; j < K - 1; j++) win[j] = state_in ? state_in[(int64_t)j * C + c] : 0.0f;
    for (int64_t t = 0; t < T; t++) {
        win[K - 1] = x[t * C + c];
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc += wk[j] * win[j];
        out[t * C + c] = silu(acc);
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
    for (int j = 0; j < K - 1; j++) state_out[(int64_t)j * C + c] = win[j];
}

/* ---- gated_delta_net: one block per value head, its state in shared
 * memory; thread j owns column j (and j + blockDim.x, ...) of the state ---- */
__global__ void gdn_kernel(og_gdn_args a, int64_t W) {
    extern __shared__ float smem[];
    const int64_t h = blockIdx.x, Dk = a.Dk, Dv = a.Dv, kh = h / (a.Hv / a.Hk);
    float *S = smem;                  /* [Dk, Dv] */
    float *q = S + Dk * Dv, *k = q + Dk; /* [Dk] each */
    float *u = k + Dk;                /* [Dv] */
    __shared__ float scal[2];         /* decay, beta of the token */
    const float *S_in = a.state_in ? a.state_in + h * Dk * Dv : nullptr;
    for (int64_t i = threadIdx.x; i < Dk * Dv; i += blockDim.x) S[i] = S_in ? S_in[i] : 0.0f;
    for (int64_t t = 0; t < a.T; t++) {
        const float *row = a.qkv + t * W;
        const float *qs = row + kh * Dk, *ks = row + a.Hk * Dk + kh * Dk, *vs = row + 2 * a.Hk * Dk + h * Dv;
        float qq = 0.0f, kk = 0.0f;
        for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
            qq += qs[i] * qs[i];
            kk += ks[i] * ks[i];
        }
        qq = block_sum(qq);
        kk = block_sum(kk);
        const float qn = rsqrtf(qq + 1e-6f) * rsqrtf((float)Dk), kn = rsqrtf(kk + 1e-6f);
        for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
            q[i] = qs[i] * qn;
            k[i] = ks[i] * kn;
        }
        if (threadIdx.x == 0) {
            const float A = expf(load_w(a.A_log, a.A_log_dtype == OG_DTYPE_BF16, h));
            const float dt = load_w(a.dt_bias, a.dt_bias_dtype == OG_DTYPE_BF16, h);
            const float xa = a.a[t * a.Hv + h] + dt;
            const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
            scal[0] = expf(-A * sp);
            scal[1] = 1.0f / (1.0f + expf(-a.b[t * a.Hv + h]));
        }
        __syncthreads();
        const float e = scal[0], beta = scal[1];
        for (int64_t j = threadIdx.x; j < Dv; j += blockDim.x) {
            float kv = 0.0f;
            for (int64_t i = 0; i < Dk; i++) kv += (S[i * Dv + j] * e) * k[i];
            u[j] = (vs[j] - kv) * beta;
        }
        /* each thread reads back only its own columns of u: no barrier needed here */
        float *o = a.out + t * a.Hv * Dv + h * Dv;
        for (int64_t j = threadIdx.x; j < Dv; j += blockDim.x) {
            const float uj = u[j];
            float acc = 0.0f;
            for (int64_t i = 0; i < Dk; i++) {
                const float s = S[i * Dv + j] * e + k[i] * uj;
                S[i * Dv + j] = s;
                acc += s * q[i];
            }
            o[j] = acc;
        }
        __syncthreads(); /* q and k of the next token overwrite these */
    }
    float *S_out = a.state_out + h * Dk * Dv;
    for (int64_t i = threadIdx.x; i < Dk * Dv; i += blockDim.x) S_out[i] = S[i];
}

/* ---- rms_norm_gated: one warp per head row ---- */
__global__ void norm_gated_kernel(const float *x, const float *z, const void *w, bool bf16, int64_t rows, int64_t D,
                                  float eps, float *out) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *xr = x + r * D, *zr = z + r * D;
    float ss = 0.0f;
    for (int64_t i = lane; i < D; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = lane; i < D; i += 32) out[r * D + i] = load_w(w, bf16, i) * (xr[i] * inv) * silu(zr[i]);
}

__global__ void sigmoid_mul_kernel(const float *x, const float *g, int64_t n, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * (1.0f / (1.0f + expf(-g[i])));
}

unsigned blocks_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} /* namespace */

extern "C" og_status og_causal_conv1d_cuda(void *stream, const float *x, const void *weight, og_dtype wdt,
                                           const float *state_in, float *state_out, int64_t T, int64_t C, int64_t K,
                                           float *out) {
    OG_TRY(og_gdn_check_conv("causal_conv1d_cuda", x, weight, wdt, state_in, state_out, T, C, K, out));
    conv_kernel<<<blocks_for(C, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, weight, wdt == OG_DTYPE_BF16, state_in, state_out, T, C, (int)K, out);
    return launched("causal_conv1d_cuda");
}

extern "C" og_status og_gated_delta_net_cuda(void *stream, const og_gdn_args *a) {
    const char *op = "gated_delta_net_cuda";
    OG_TRY(og_gdn_check(op, a));
    const size_t smem = (size_t)(a->Dk * a->Dv + 2 * a->Dk + a->Dv) * sizeof(float);
    int dev = 0, max_smem = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return launched(op);
    if (smem + 64 > (size_t)max_smem)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: a head's state of %lld x %lld floats does not fit %d bytes of shared "
                                                "memory", op, (long long)a->Dk, (long long)a->Dv, max_smem);
    if (cudaFuncSetAttribute(gdn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launched(op);
    const int threads = a->Dv >= 256 ? 256 : (int)((a->Dv + 31) / 32 * 32);
    gdn_kernel<<<(unsigned)a->Hv, threads, smem, static_cast<cudaStream_t>(stream)>>>(
        *a, 2 * a->Hk * a->Dk + a->Hv * a->Dv);
    return launched(op);
}

extern "C" og_status og_rms_norm_gated_cuda(void *stream, const float *x, const float *z, const void *weight,
                                            og_dtype wdt, int64_t T, int64_t n, int64_t D, float eps, float *out) {
    OG_TRY(og_gdn_check_norm("rms_norm_gated_cuda", x, z, weight, wdt, T, n, D, eps, out));
    const int64_t rows = T * n;
    norm_gated_kernel<<<blocks_for(rows, 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, z, weight, wdt == OG_DTYPE_BF16, rows, D, eps, out);
    return launched("rms_norm_gated_cuda");
}

extern "C" og_status og_sigmoid_mul_cuda(void *stream, const float *x, const float *gate, int64_t n, float *out) {
    OG_TRY(og_ops_check_binary("sigmoid_mul_cuda", x, "x", gate, "gate", 1, n, out));
    sigmoid_mul_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, gate, n, out);
    return launched("sigmoid_mul_cuda");
}
