/* CUDA kernels of every instruction but update_and_attend (attend.cu).
 *
 * Letters (as in ops_cuda.h): T tokens, K in features, N out features / row
 * width, V vocabulary, H hidden, F ffn, D head dim, n heads per row.
 *
 * Element-wise kernels use grid-stride loops with int64 indices; row kernels
 * give a block (rms_norm) or a warp (head_rms_norm, gemv outputs) to a row.
 * Math follows the CPU references: accurate cosf/sinf/expf (no fast-math),
 * f32 accumulation.
 */
#include "kernels/cuda/ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

__device__ inline float load_w(const void *w, bool bf16, int64_t i) {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(w)[i]) : static_cast<const float *>(w)[i];
}

__device__ inline float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

int grid_for(int64_t count, int threads) {
    const int64_t b = (count + threads - 1) / threads;
    return (int)(b < 65536 ? (b < 1 ? 1 : b) : 65536);
}

og_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return OG_OK;
    return og_set_error(OG_ERR_BACKEND, "%s: launch: %s (%s)", op, cudaGetErrorName(e), cudaGetErrorString(e));
}

og_status check_dims(const char *op, int64_t a, int64_t b) {
    if (a >= 1 && b >= 1 && a <= INT64_MAX / b) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: sizes %lld x %lld are not positive or overflow", op,
                        (long long)a, (long long)b);
}

og_status check_weight(const char *op, const void *w, og_dtype dt) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: weight is NULL", op);
    if (dt != OG_DTYPE_BF16 && dt != OG_DTYPE_F32)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: weight dtype %s (bf16 or f32)", op, og_dtype_name(dt));
    return OG_OK;
}

#define OG_CUDA_TRY(expr)                                                                                          \
    do {                                                                                                           \
        og_status st_ = (expr);                                                                                    \
        if (st_ != OG_OK) return st_;                                                                              \
    } while (0)

/* ---- embed ---- */
__global__ void embed_kernel(const int32_t *tokens, const void *table, bool bf16, int64_t H, float *out) {
    const int64_t t = blockIdx.x;
    const int64_t row = (int64_t)tokens[t] * H;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) out[t * H + h] = load_w(table, bf16, row + h);
}

/* ---- rms norm: a block of 256 per row ---- */
__global__ void rms_norm_kernel(const float *x, const void *w, bool bf16, int64_t N, float eps, float *out) {
    __shared__ float part[32];
    const float *xr = x + blockIdx.x * N;
    float *orow = out + blockIdx.x * N;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    const float r = 1.0f / sqrtf(part[0] / (float)N + eps);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) orow[i] = (xr[i] * r) * load_w(w, bf16, i);
}

/* ---- head rms norm: a warp per head row of D ---- */
__global__ void head_rms_norm_kernel(const float *x, const void *w, bool bf16, int64_t rows, int64_t D, float eps,
                                     float *out) {
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return; /* whole warps leave: the shuffles below stay full */
    const float *xr = x + r * D;
    float s = 0.0f;
    for (int64_t i = lane; i < D; i += 32) s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    const float f = 1.0f / sqrtf(s / (float)D + eps);
    for (int64_t i = lane; i < D; i += 32) out[r * D + i] = (xr[i] * f) * load_w(w, bf16, i);
}

/* ---- residual add + rms norm: a block of 256 per row ----
 * sum = a + b is written (the residual stream goes on), then normed from
 * what was written, so both outputs equal add followed by rms_norm. */
__global__ void add_rms_norm_kernel(const float *a, const float *b, const void *w, bool bf16, int64_t N, float eps,
                                    float *sum, float *out) {
    __shared__ float part[32];
    const int64_t base = blockIdx.x * N;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        const float v = a[base + i] + b[base + i];
        sum[base + i] = v;
        s = fmaf(v, v, s);
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    const float r = 1.0f / sqrtf(part[0] / (float)N + eps);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) out[base + i] = (sum[base + i] * r) * load_w(w, bf16, i);
}

/* ---- head rms norm + rope: a warp per head row of D ----
 * The norm's output stays in registers: each lane rotates the pairs
 * (i, i + D/2) it normed, with the formulas of the two plain kernels. */
__global__ void head_norm_rope_kernel(const float *x, const void *w, bool bf16, const float *inv_freq,
                                      const int32_t *pos, int64_t rows, int64_t n, int64_t D, float eps, float *out) {
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return; /* whole warps leave */
    const float *xr = x + r * D;
    float s = 0.0f;
    for (int64_t i = lane; i < D; i += 32) s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    const float f = 1.0f / sqrtf(s / (float)D + eps);
    const int64_t half = D / 2;
    const float p = (float)pos[r / n];
    for (int64_t i = lane; i < half; i += 32) {
        const float angle = p * inv_freq[i];
        const float c = cosf(angle), sn = sinf(angle);
        const float a = (xr[i] * f) * load_w(w, bf16, i), b = (xr[i + half] * f) * load_w(w, bf16, i + half);
        out[r * D + i] = a * c - b * sn;
        out[r * D + i + half] = b * c + a * sn;
    }
}

/* ---- rope: one thread per pair (i, i + D/2) ---- */
__global__ void rope_kernel(const float *inv_freq, int64_t D, const float *x, const int32_t *pos, int64_t T,
                            int64_t n, float *out) {
    const int64_t half = D / 2, total = T * n * half;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = k % half, th = k / half, t = th / n;
        const float angle = (float)pos[t] * inv_freq[i];
        const float c = cosf(angle), s = sinf(angle);
        const float a = x[th * D + i], b = x[th * D + i + half];
        out[th * D + i] = a * c - b * s;
        out[th * D + i + half] = b * c + a * s;
    }
}

/* ---- swiglu, add ---- */
__global__ void swiglu_kernel(const float *gate, const float *up, int64_t count, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(const float *a, const float *b, int64_t count, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

/* ---- gemv: a warp per output feature, every row of x at once ----
 * The vector path (VEC) needs K % 8 == 0 and 16-byte aligned x and weight:
 * each lane takes 8 consecutive weights (16 bytes of bf16, 32 of f32).
 * gemv_dot leaves each lane's partial sums of w . x[t] in acc; the kernels
 * reduce them across the warp, so a fused kernel that calls it gives the same
 * bits as the plain one. */
template <typename WT, bool VEC>
__device__ inline void gemv_dot(const float *x, const WT *wr, int64_t T, int64_t K, int lane,
                                float acc[OG_GEMV_CUDA_MAX_T]) {
#pragma unroll
    for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) acc[t] = 0.0f;
    if (VEC) {
#pragma unroll 4
        for (int64_t k = (int64_t)lane * 8; k < K; k += 256) {
            float wf[8];
            if (sizeof(WT) == 2) {
                const uint4 u = *reinterpret_cast<const uint4 *>(wr + k);
                const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    wf[2 * i] = __uint_as_float(q[i] << 16);
                    wf[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
                }
            } else {
                const float4 a = *reinterpret_cast<const float4 *>(wr + k);
                const float4 b = *reinterpret_cast<const float4 *>(wr + k + 4);
                wf[0] = a.x, wf[1] = a.y, wf[2] = a.z, wf[3] = a.w, wf[4] = b.x, wf[5] = b.y, wf[6] = b.z, wf[7] = b.w;
            }
#pragma unroll
            for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
                if (t < T) {
                    const float4 a = *reinterpret_cast<const float4 *>(x + t * K + k);
                    const float4 b = *reinterpret_cast<const float4 *>(x + t * K + k + 4);
                    float s = acc[t];
                    s = fmaf(a.x, wf[0], s), s = fmaf(a.y, wf[1], s), s = fmaf(a.z, wf[2], s), s = fmaf(a.w, wf[3], s);
                    s = fmaf(b.x, wf[4], s), s = fmaf(b.y, wf[5], s), s = fmaf(b.z, wf[6], s), s = fmaf(b.w, wf[7], s);
                    acc[t] = s;
                }
            }
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) {
            const float wf = load_w(wr, sizeof(WT) == 2, k);
#pragma unroll
            for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++)
                if (t < T) acc[t] = fmaf(x[t * K + k], wf, acc[t]);
        }
    }
}

/* Output features (warps) of a gemv block: small blocks spread a narrow
 * product (N ~ 1k) over every multiprocessor. */
constexpr int kGemvRows = 4;

/* Up to OG_GEMV_CUDA_MAX_PARTS products of one x, in one launch: part i owns
 * the blocks from first[i] on (kGemvRows output features per block). */
template <typename WT>
struct gemv_parts {
    const WT *w[OG_GEMV_CUDA_MAX_PARTS];
    const WT *bias[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1];
    int n;
};

template <typename WT, bool VEC>
__global__ void gemv_kernel(const float *x, gemv_parts<WT> p, int64_t T, int64_t K) {
    int part = 0;
    while (part + 1 < p.n && (int64_t)blockIdx.x >= p.first[part + 1]) part++;
    const int64_t j = (blockIdx.x - p.first[part]) * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int64_t N = p.N[part];
    if (j >= N) return;
    float acc[OG_GEMV_CUDA_MAX_T];
    gemv_dot<WT, VEC>(x, p.w[part] + j * K, T, K, lane, acc);
    const float b = p.bias[part] ? load_w(p.bias[part], sizeof(WT) == 2, j) : 0.0f;
    float *out = p.out[part];
#pragma unroll
    for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
        if (t < T) {
            const float s = warp_sum(acc[t]);
            if (lane == 0) out[t * N + j] = s + b;
        }
    }
}

/* gate and up products of one x with silu(gate) * up as the epilogue: a warp
 * per feature reads both weight rows; gate and up never reach memory. */
template <typename WT, bool VEC>
__global__ void gemv_swiglu_kernel(const float *x, const WT *wg, const WT *bg, const WT *wu, const WT *bu, int64_t T,
                                   int64_t K, int64_t F, float *out) {
    const int64_t j = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (j >= F) return;
    float ag[OG_GEMV_CUDA_MAX_T], au[OG_GEMV_CUDA_MAX_T];
    gemv_dot<WT, VEC>(x, wg + j * K, T, K, lane, ag);
    gemv_dot<WT, VEC>(x, wu + j * K, T, K, lane, au);
    const float b_g = bg ? load_w(bg, sizeof(WT) == 2, j) : 0.0f;
    const float b_u = bu ? load_w(bu, sizeof(WT) == 2, j) : 0.0f;
#pragma unroll
    for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
        if (t < T) {
            const float g = warp_sum(ag[t]) + b_g, u = warp_sum(au[t]) + b_u;
            if (lane == 0) out[t * F + j] = g / (1.0f + expf(-g)) * u;
        }
    }
}

__global__ void split_bf16_kernel(const float *x, int64_t count, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
        hi[i] = h;
        lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
    }
}

__global__ void fill_rows_kernel(const void *bias, bool bf16, int64_t T, int64_t N, float *out) {
    const int64_t total = T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = load_w(bias, bf16, i % N);
}

/* ---- argmax: one block; (value, index) pairs, NaN above every number ---- */
__device__ inline bool better(float a, int64_t ia, float b, int64_t ib) {
    const bool na = isnan(a), nb = isnan(b);
    if (na || nb) return na && (!nb || ia < ib);
    return a > b || (a == b && ia < ib);
}

constexpr int kArgmaxThreads = 1024;
__global__ void argmax_kernel(const float *x, int64_t V, int32_t *index) {
    __shared__ float sv[kArgmaxThreads];
    __shared__ int64_t si[kArgmaxThreads];
    float best = x[0];
    int64_t bi = 0;
    for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads)
        if (better(x[i], i, best, bi)) best = x[i], bi = i;
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kArgmaxThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *index = (int32_t)si[0];
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} /* namespace */

extern "C" bool og_cuda_device_present(void) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

extern "C" og_status og_embed_cuda(void *stream, const int32_t *tokens, int64_t T, const void *table,
                                   og_dtype table_dtype, int64_t V, int64_t H, float *out) {
    const char *op = "embed_cuda";
    OG_CUDA_TRY(check_weight(op, table, table_dtype));
    OG_CUDA_TRY(check_dims(op, V, H));
    OG_CUDA_TRY(check_dims(op, T, H));
    if (!tokens || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: tokens or out is NULL", op);
    if (T > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows", op, (long long)T);
    embed_kernel<<<(unsigned)T, 256, 0, static_cast<cudaStream_t>(stream)>>>(tokens, table,
                                                                            table_dtype == OG_DTYPE_BF16, H, out);
    return launched(op);
}

extern "C" og_status og_rms_norm_cuda(void *stream, const float *x, const void *weight, og_dtype weight_dtype,
                                      int64_t T, int64_t N, float eps, float *out) {
    const char *op = "rms_norm_cuda";
    OG_CUDA_TRY(check_weight(op, weight, weight_dtype));
    OG_CUDA_TRY(check_dims(op, T, N));
    if (!x || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x or out is NULL", op);
    if (!(eps >= 0.0f) || isinf(eps)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)eps);
    if (T > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows", op, (long long)T);
    rms_norm_kernel<<<(unsigned)T, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, weight,
                                                                               weight_dtype == OG_DTYPE_BF16, N, eps, out);
    return launched(op);
}

extern "C" og_status og_head_rms_norm_cuda(void *stream, const float *x, const void *weight, og_dtype weight_dtype,
                                           int64_t T, int64_t n, int64_t D, float eps, float *out) {
    const char *op = "head_rms_norm_cuda";
    OG_CUDA_TRY(check_weight(op, weight, weight_dtype));
    OG_CUDA_TRY(check_dims(op, T, n));
    OG_CUDA_TRY(check_dims(op, T * n, D));
    if (!x || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x or out is NULL", op);
    if (!(eps >= 0.0f) || isinf(eps)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)eps);
    const int64_t rows = T * n, blocks = (rows + 7) / 8;
    if (blocks > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %lld rows", op, (long long)rows);
    head_rms_norm_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, weight, weight_dtype == OG_DTYPE_BF16, rows, D, eps, out);
    return launched(op);
}

extern "C" og_status og_add_rms_norm_cuda(void *stream, const float *a, const float *b, const void *weight,
                                          og_dtype weight_dtype, int64_t T, int64_t N, float eps, float *sum,
                                          float *out) {
    const char *op = "add_rms_norm_cuda";
    OG_CUDA_TRY(check_weight(op, weight, weight_dtype));
    OG_CUDA_TRY(check_dims(op, T, N));
    if (!a || !b || !sum || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a, b, sum or out is NULL", op);
    if (!(eps >= 0.0f) || isinf(eps)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)eps);
    if (T > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows", op, (long long)T);
    add_rms_norm_kernel<<<(unsigned)T, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        a, b, weight, weight_dtype == OG_DTYPE_BF16, N, eps, sum, out);
    return launched(op);
}

extern "C" og_status og_head_norm_rope_cuda(void *stream, const float *x, const void *weight, og_dtype weight_dtype,
                                            const float *inv_freq, const int32_t *positions, int64_t T, int64_t n,
                                            int64_t D, float eps, float *out) {
    const char *op = "head_norm_rope_cuda";
    OG_CUDA_TRY(check_weight(op, weight, weight_dtype));
    OG_CUDA_TRY(check_dims(op, T, n));
    OG_CUDA_TRY(check_dims(op, T * n, D));
    if (!x || !inv_freq || !positions || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is NULL", op);
    if (D < 2 || D % 2) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: head dim %lld is not even", op, (long long)D);
    if (!(eps >= 0.0f) || isinf(eps)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)eps);
    const int64_t rows = T * n, blocks = (rows + 7) / 8;
    if (blocks > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %lld rows", op, (long long)rows);
    head_norm_rope_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, weight, weight_dtype == OG_DTYPE_BF16, inv_freq, positions, rows, n, D, eps, out);
    return launched(op);
}

extern "C" og_status og_rope_cuda(void *stream, const float *inv_freq, int64_t D, const float *x,
                                  const int32_t *positions, int64_t T, int64_t n, float *out) {
    const char *op = "rope_cuda";
    if (!inv_freq || !x || !positions || !out)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is NULL", op);
    if (D < 2 || D % 2) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: head dim %lld is not even", op, (long long)D);
    OG_CUDA_TRY(check_dims(op, T, n));
    OG_CUDA_TRY(check_dims(op, T * n, D));
    const int64_t pairs = T * n * (D / 2);
    rope_kernel<<<grid_for(pairs, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(inv_freq, D, x, positions, T, n,
                                                                                     out);
    return launched(op);
}

extern "C" og_status og_swiglu_cuda(void *stream, const float *gate, const float *up, int64_t count, float *out) {
    if (!gate || !up || !out || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "swiglu_cuda: NULL buffer or count %lld", (long long)count);
    swiglu_kernel<<<grid_for(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(gate, up, count, out);
    return launched("swiglu_cuda");
}

extern "C" og_status og_add_cuda(void *stream, const float *a, const float *b, int64_t count, float *out) {
    if (!a || !b || !out || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "add_cuda: NULL buffer or count %lld", (long long)count);
    add_kernel<<<grid_for(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(a, b, count, out);
    return launched("add_cuda");
}

namespace {

template <typename WT>
og_status launch_gemv(cudaStream_t st, const float *x, const og_gemv_cuda_part *parts, int n, int64_t T, int64_t K,
                      bool vec) {
    gemv_parts<WT> p = {};
    p.n = n;
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) {
        p.w[i] = static_cast<const WT *>(parts[i].weight);
        p.bias[i] = static_cast<const WT *>(parts[i].bias);
        p.out[i] = parts[i].out;
        p.N[i] = parts[i].N;
        p.first[i] = blocks;
        blocks += (parts[i].N + kGemvRows - 1) / kGemvRows;
    }
    p.first[n] = blocks;
    if (blocks > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "gemv_cuda: %lld blocks", (long long)blocks);
    if (vec) gemv_kernel<WT, true><<<(unsigned)blocks, 32 * kGemvRows, 0, st>>>(x, p, T, K);
    else gemv_kernel<WT, false><<<(unsigned)blocks, 32 * kGemvRows, 0, st>>>(x, p, T, K);
    return launched("gemv_cuda");
}

og_status check_gemv(const char *op, const float *x, const void *weight, og_dtype dt, int64_t T, int64_t K, int64_t N,
                     const float *out) {
    OG_CUDA_TRY(check_weight(op, weight, dt));
    OG_CUDA_TRY(check_dims(op, N, K));
    OG_CUDA_TRY(check_dims(op, T, K));
    if (!x || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x or out is NULL", op);
    if (T > OG_GEMV_CUDA_MAX_T)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows, at most %d", op, (long long)T,
                            OG_GEMV_CUDA_MAX_T);
    if ((N + kGemvRows - 1) / kGemvRows > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: N = %lld", op, (long long)N);
    return OG_OK;
}

} /* namespace */

extern "C" og_status og_gemv_multi_cuda(void *stream, const float *x, og_dtype weight_dtype, int64_t T, int64_t K,
                                        const og_gemv_cuda_part *parts, int n_parts) {
    const char *op = "gemv_cuda";
    if (!parts || n_parts < 1 || n_parts > OG_GEMV_CUDA_MAX_PARTS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %d parts (1..%d)", op, n_parts, OG_GEMV_CUDA_MAX_PARTS);
    bool vec = K % 8 == 0 && aligned16(x);
    for (int i = 0; i < n_parts; i++) {
        OG_CUDA_TRY(check_gemv(op, x, parts[i].weight, weight_dtype, T, K, parts[i].N, parts[i].out));
        vec = vec && aligned16(parts[i].weight);
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return weight_dtype == OG_DTYPE_BF16 ? launch_gemv<__nv_bfloat16>(st, x, parts, n_parts, T, K, vec)
                                         : launch_gemv<float>(st, x, parts, n_parts, T, K, vec);
}

extern "C" og_status og_gemv_cuda(void *stream, const float *x, const void *weight, const void *bias,
                                  og_dtype weight_dtype, int64_t T, int64_t K, int64_t N, float *out) {
    const og_gemv_cuda_part part = {weight, bias, N, out};
    return og_gemv_multi_cuda(stream, x, weight_dtype, T, K, &part, 1);
}

extern "C" og_status og_gemv_swiglu_cuda(void *stream, const float *x, const void *w_gate, const void *b_gate,
                                         const void *w_up, const void *b_up, og_dtype weight_dtype, int64_t T,
                                         int64_t K, int64_t F, float *out) {
    const char *op = "gemv_swiglu_cuda";
    OG_CUDA_TRY(check_gemv(op, x, w_gate, weight_dtype, T, K, F, out));
    OG_CUDA_TRY(check_weight(op, w_up, weight_dtype));
    const bool vec = K % 8 == 0 && aligned16(x) && aligned16(w_gate) && aligned16(w_up);
    const unsigned blocks = (unsigned)((F + kGemvRows - 1) / kGemvRows), threads = 32 * kGemvRows;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (weight_dtype == OG_DTYPE_BF16) {
        typedef __nv_bfloat16 B;
        const B *wg = static_cast<const B *>(w_gate), *bg = static_cast<const B *>(b_gate);
        const B *wu = static_cast<const B *>(w_up), *bu = static_cast<const B *>(b_up);
        if (vec) gemv_swiglu_kernel<B, true><<<blocks, threads, 0, st>>>(x, wg, bg, wu, bu, T, K, F, out);
        else gemv_swiglu_kernel<B, false><<<blocks, threads, 0, st>>>(x, wg, bg, wu, bu, T, K, F, out);
    } else {
        const float *wg = static_cast<const float *>(w_gate), *bg = static_cast<const float *>(b_gate);
        const float *wu = static_cast<const float *>(w_up), *bu = static_cast<const float *>(b_up);
        if (vec) gemv_swiglu_kernel<float, true><<<blocks, threads, 0, st>>>(x, wg, bg, wu, bu, T, K, F, out);
        else gemv_swiglu_kernel<float, false><<<blocks, threads, 0, st>>>(x, wg, bg, wu, bu, T, K, F, out);
    }
    return launched(op);
}

extern "C" og_status og_split_bf16_cuda(void *stream, const float *x, int64_t count, uint16_t *hi, uint16_t *lo) {
    if (!x || !hi || !lo || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "split_bf16_cuda: NULL buffer or count %lld", (long long)count);
    split_bf16_kernel<<<grid_for(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, count, reinterpret_cast<__nv_bfloat16 *>(hi), reinterpret_cast<__nv_bfloat16 *>(lo));
    return launched("split_bf16_cuda");
}

extern "C" og_status og_fill_rows_cuda(void *stream, const void *bias, og_dtype dtype, int64_t T, int64_t N,
                                       float *out) {
    const char *op = "fill_rows_cuda";
    OG_CUDA_TRY(check_weight(op, bias, dtype));
    OG_CUDA_TRY(check_dims(op, T, N));
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
    fill_rows_kernel<<<grid_for(T * N, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        bias, dtype == OG_DTYPE_BF16, T, N, out);
    return launched(op);
}

extern "C" og_status og_argmax_cuda(void *stream, const float *x, int64_t V, int32_t *index) {
    if (!x || !index || V < 1 || V > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "argmax_cuda: NULL buffer or V = %lld", (long long)V);
    argmax_kernel<<<1, kArgmaxThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, V, index);
    return launched("argmax_cuda");
}
