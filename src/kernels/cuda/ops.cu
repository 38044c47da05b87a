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
#include "kernels/cuda/kquant_cuda.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_q.cuh"
#include "kernels/cuda/gemv_tc.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include <type_traits>

namespace {

using namespace og_cuda;

int grid_for(int64_t count, int threads) {
    const int64_t b = (count + threads - 1) / threads;
    return (int)(b < 65536 ? (b < 1 ? 1 : b) : 65536);
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

/* The weight of a product or an embedding table [rows, K]: bf16, f32, or
 * quantized (K a multiple of OG_QUANT_GROUP, the tensor 16-byte aligned so
 * that every group is: cudaMalloc'd tensors are). */
og_status check_matrix(const char *op, const void *w, og_dtype dt, int64_t K) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: weight is NULL", op);
    if (!og_dtype_is_quantized(dt)) return check_weight(op, w, dt);
    if (K % OG_QUANT_GROUP)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a %s weight needs K = %lld to be a multiple of %d", op,
                            og_dtype_name(dt), (long long)K, OG_QUANT_GROUP);
    if ((uintptr_t)w & 15u)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a %s weight must be 16-byte aligned", op,
                            og_dtype_name(dt));
    return OG_OK;
}

#define OG_CUDA_TRY(expr)                                                                                          \
    do {                                                                                                           \
        og_status st_ = (expr);                                                                                    \
        if (st_ != OG_OK) return st_;                                                                              \
    } while (0)

/* ---- embed ---- */
__global__ void embed_kernel(const int32_t *tokens, const void *table, bool bf16, int64_t H, float *out) {
    grid_wait();
    const int64_t t = blockIdx.x;
    const int64_t row = (int64_t)tokens[t] * H;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) out[t * H + h] = load_w(table, bf16, row + h);
}

/* ---- rms norm: a block of 256 per row ---- */
__global__ void rms_norm_kernel(const float *x, const void *w, bool bf16, int64_t N, float eps, float *out) {
    grid_wait();
    const float *xr = x + blockIdx.x * N;
    float *orow = out + blockIdx.x * N;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    const float r = 1.0f / sqrtf(block_sum(s) / (float)N + eps);
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) orow[i] = (xr[i] * r) * load_w(w, bf16, i);
}

/* ---- head rms norm: a warp per head row of D ---- */
__global__ void head_rms_norm_kernel(const float *x, const void *w, bool bf16, int64_t rows, int64_t D, float eps,
                                     float *out) {
    grid_wait();
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
 * what was written, so both outputs equal add followed by rms_norm. A row of
 * up to 256 PER elements is held in registers: every load is issued before
 * the first is used (one round trip to memory, where the loop below makes
 * one a element: 16 of them at hidden 4096, ~8 us of a decode step's
 * layer); PER = 0 loops over any width. Both sum in the same order. */
template <int PER>
__global__ void add_rms_norm_kernel(const float *a, const float *b, const void *w, bool bf16, int64_t N, float eps,
                                    float *sum, float *out, __nv_bfloat16 *out16) {
    grid_wait();
    const int64_t base = blockIdx.x * N;
    float s = 0.0f;
    if constexpr (PER > 0) {
        float v[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * 256;
            v[k] = i < N ? a[base + i] + b[base + i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * 256;
            if (i < N) {
                sum[base + i] = v[k];
                s = fmaf(v[k], v[k], s);
            }
        }
        const float r = 1.0f / sqrtf(block_sum(s) / (float)N + eps);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * 256;
            if (i < N) {
                const float o = (v[k] * r) * load_w(w, bf16, i);
                out[base + i] = o;
                if (out16) out16[base + i] = __float2bfloat16_rn(o);
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
            const float v = a[base + i] + b[base + i];
            sum[base + i] = v;
            s = fmaf(v, v, s);
        }
        const float r = 1.0f / sqrtf(block_sum(s) / (float)N + eps);
        for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
            const float o = (sum[base + i] * r) * load_w(w, bf16, i);
            out[base + i] = o;
            if (out16) out16[base + i] = __float2bfloat16_rn(o);
        }
    }
}

/* ---- head rms norm + rope: a warp per head row of D ----
 * The norm's output stays in registers: each lane rotates the pairs
 * (i, i + D/2) it normed, with the formulas of the two plain kernels. Up to
 * two jobs (e.g. the q and the k heads of a layer) share one launch: the
 * warps past job 0's rows take job 1's. */
struct norm_rope_jobs {
    const float *x[2];
    const void *w[2];
    const float *inv_freq[2];
    float *out[2];
    int64_t rows[2], n[2], D[2];
    float eps[2];
    bool bf16[2];
};

__global__ void head_norm_rope_kernel(norm_rope_jobs jb, int64_t total_rows, const int32_t *pos) {
    grid_wait();
    int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= total_rows) return; /* whole warps leave */
    const int j = r < jb.rows[0] ? 0 : 1;
    if (j) r -= jb.rows[0];
    const int64_t D = jb.D[j];
    const float *xr = jb.x[j] + r * D;
    float s = 0.0f;
    for (int64_t i = lane; i < D; i += 32) s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    const float f = 1.0f / sqrtf(s / (float)D + jb.eps[j]);
    const int64_t half = D / 2;
    const float p = (float)pos[r / jb.n[j]];
    const void *w = jb.w[j];
    const bool bf16 = jb.bf16[j];
    float *out = jb.out[j] + r * D;
    for (int64_t i = lane; i < half; i += 32) {
        const float angle = p * jb.inv_freq[j][i];
        const float c = cosf(angle), sn = sinf(angle);
        const float a = (xr[i] * f) * load_w(w, bf16, i), b = (xr[i + half] * f) * load_w(w, bf16, i + half);
        out[i] = a * c - b * sn;
        out[i + half] = b * c + a * sn;
    }
}

/* ---- rope: one thread per pair (i, i + D/2) ---- */
__global__ void rope_kernel(const float *inv_freq, int64_t D, const float *x, const int32_t *pos, int64_t T,
                            int64_t n, float *out) {
    grid_wait();
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
__global__ void swiglu_kernel(const float *gate, const float *up, int64_t count, float *out, __nv_bfloat16 *out16) {
    grid_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float o = g / (1.0f + expf(-g)) * up[i];
        out[i] = o;
        if (out16) out16[i] = __float2bfloat16_rn(o);
    }
}

__global__ void add_kernel(const float *a, const float *b, int64_t count, float *out) {
    grid_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

/* ---- gemv: a warp per output feature, every row of x at once ----
 * The vector path (VEC) needs K % 8 == 0 and 16-byte aligned x and weight:
 * each lane takes chunks of 8 consecutive weights (16 bytes of bf16, 32 of
 * f32), lane l the chunks at k = 8 l + 256 c. A small matrix is latency
 * bound, so the weights of up to CH chunks per lane (of every row the warp
 * owns) are loaded before any is used: with CH = K / 256 a row of K <= 4096
 * is one round trip to memory. Each lane still adds its chunks in increasing
 * k, so the sums do not depend on CH. gemv_dot leaves each lane's partial
 * sums of w . x[t] in acc; the kernels reduce them across the warp, so a
 * fused kernel that calls it gives the same bits as the plain one. The loads
 * go ahead of grid_wait (programmatic dependent launch: the weights are never
 * written by an earlier kernel); x is read only after it. */
template <typename WT>
struct chunk8 { /* 8 weights as loaded */
    uint4 a, b;   /* bf16: a; f32: a, b */
};

template <typename WT>
__device__ inline chunk8<WT> load_chunk(const WT *p) {
    chunk8<WT> c;
    c.a = __ldg(reinterpret_cast<const uint4 *>(p));
    if (sizeof(WT) == 4) c.b = __ldg(reinterpret_cast<const uint4 *>(p) + 1);
    else c.b = make_uint4(0, 0, 0, 0);
    return c;
}

template <typename WT>
__device__ inline void unpack_chunk(const chunk8<WT> &c, float wf[8]) {
    const uint32_t q[8] = {c.a.x, c.a.y, c.a.z, c.a.w, c.b.x, c.b.y, c.b.z, c.b.w};
    if (sizeof(WT) == 2) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wf[2 * i] = __uint_as_float(q[i] << 16);
            wf[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) wf[i] = __uint_as_float(q[i]);
    }
}

/* The residual add + rms_norm that precedes a product, done by every block
 * of the gemv for itself (gemv_norm_x): x = rms_norm(a + b) goes to shared
 * memory, block 0 also writes sum = a + b. The sums of squares are added in
 * the order of add_rms_norm_kernel (256 threads, lane and warp trees), so x
 * has the bits that kernel writes. */
struct gemv_norm {
    const float *a, *b; /* [T, K] */
    const void *w;      /* [K]    */
    bool bf16;
    float eps;
    float *sum;         /* [T, K] */
};

constexpr int kGemvRows = 4; /* output features (warps) of a gemv block */
constexpr int kGemvThreads = 32 * kGemvRows;
constexpr int kNormThreads = 256; /* the threads add_rms_norm_kernel reduces over */

__device__ const float *gemv_norm_x(const gemv_norm &nm, int64_t T, int64_t K) {
    extern __shared__ float4 xs4[]; /* [T, K] floats, 16-byte aligned for the vector loads */
    float *xs = reinterpret_cast<float *>(xs4);
    __shared__ float part[OG_GEMV_CUDA_MAX_T][kNormThreads / 32];
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int64_t t = 0; t < T; t++) {
        /* this thread stands for threads tid and tid + 128 of add_rms_norm_kernel */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float sq = 0.0f;
            for (int64_t i = tid + half * kGemvThreads; i < K; i += kNormThreads) {
                const float v = nm.a[t * K + i] + nm.b[t * K + i];
                xs[t * K + i] = v;
                if (blockIdx.x == 0) nm.sum[t * K + i] = v;
                sq = fmaf(v, v, sq);
            }
            sq = warp_sum(sq);
            if (lane == 0) part[t][warp + half * kGemvRows] = sq;
        }
    }
    __syncthreads();
    if (warp == 0)
        for (int64_t t = 0; t < T; t++) {
            float v = lane < kNormThreads / 32 ? part[t][lane] : 0.0f;
            v = warp_sum(v);
            if (lane == 0) rs[t] = 1.0f / sqrtf(v / (float)K + nm.eps);
        }
    __syncthreads();
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = tid; i < K; i += kGemvThreads) xs[t * K + i] = (xs[t * K + i] * rs[t]) * load_w(nm.w, nm.bf16, i);
    __syncthreads();
    return xs;
}

/* The product of x (or, with NORM, of rms_norm(a + b)) with R weight rows. */
template <typename WT, bool VEC, int CH, int R, bool NORM>
__device__ inline void gemv_dot(const float *x, const gemv_norm &nm, const WT *const wr[R], int64_t T, int64_t K,
                                int lane, float acc[R][OG_GEMV_CUDA_MAX_T]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) acc[r][t] = 0.0f;
    const int64_t first = VEC ? (int64_t)lane * 8 : lane;
    chunk8<WT> w[R][VEC ? CH : 1];
    if (VEC) { /* the first CH chunks of every row before waiting */
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < CH; c++)
                if (first + 256 * c < K) w[r][c] = load_chunk<WT>(wr[r] + first + 256 * c);
    }
    grid_wait(); /* every thread, once: gemv_norm_x synchronizes the block */
    if (NORM) x = gemv_norm_x(nm, T, K);
    if (VEC) {
        for (int64_t k0 = first; k0 < K; k0 += 256 * CH) {
            if (k0 != first) {
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int c = 0; c < CH; c++)
                        if (k0 + 256 * c < K) w[r][c] = load_chunk<WT>(wr[r] + k0 + 256 * c);
            }
#pragma unroll
            for (int c = 0; c < CH; c++) {
                const int64_t k = k0 + 256 * c;
                if (k >= K) break;
#pragma unroll
                for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
                    if (t < T) {
                        const float4 a = *reinterpret_cast<const float4 *>(x + t * K + k);
                        const float4 b = *reinterpret_cast<const float4 *>(x + t * K + k + 4);
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            float wf[8];
                            unpack_chunk<WT>(w[r][c], wf);
                            float s = acc[r][t];
                            s = fmaf(a.x, wf[0], s), s = fmaf(a.y, wf[1], s), s = fmaf(a.z, wf[2], s);
                            s = fmaf(a.w, wf[3], s), s = fmaf(b.x, wf[4], s), s = fmaf(b.y, wf[5], s);
                            s = fmaf(b.z, wf[6], s), s = fmaf(b.w, wf[7], s);
                            acc[r][t] = s;
                        }
                    }
                }
            }
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float wf = load_w(wr[r], sizeof(WT) == 2, k);
#pragma unroll
                for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++)
                    if (t < T) acc[r][t] = fmaf(x[t * K + k], wf, acc[r][t]);
            }
        }
    }
}

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

/* A warp past the last feature computes the last one again and stores
 * nothing: every warp takes part in the block's barriers. */
template <typename WT, bool VEC, int CH, bool NORM>
__global__ void gemv_kernel(const float *x, gemv_norm nm, gemv_parts<WT> p, int64_t T, int64_t K) {
    int part = 0;
    while (part + 1 < p.n && (int64_t)blockIdx.x >= p.first[part + 1]) part++;
    const int64_t j = (blockIdx.x - p.first[part]) * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int64_t N = p.N[part], row = j < N ? j : N - 1;
    float acc[1][OG_GEMV_CUDA_MAX_T];
    const WT *const rows[1] = {p.w[part] + row * K};
    gemv_dot<WT, VEC, CH, 1, NORM>(x, nm, rows, T, K, lane, acc);
    if (j >= N) return;
    const float b = p.bias[part] ? load_w(p.bias[part], sizeof(WT) == 2, j) : 0.0f;
    float *out = p.out[part];
#pragma unroll
    for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
        if (t < T) {
            const float s = warp_sum(acc[0][t]);
            if (lane == 0) out[t * N + j] = s + b;
        }
    }
}

/* gate and up products of one x with silu(gate) * up as the epilogue: a warp
 * per feature reads both weight rows; gate and up never reach memory. */
template <typename WT, bool VEC, int CH, bool NORM>
__global__ void gemv_swiglu_kernel(const float *x, gemv_norm nm, const WT *wg, const WT *bg, const WT *wu,
                                   const WT *bu, int64_t T, int64_t K, int64_t F, float *out) {
    const int64_t j = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int64_t row = j < F ? j : F - 1;
    float acc[2][OG_GEMV_CUDA_MAX_T];
    const WT *const rows[2] = {wg + row * K, wu + row * K};
    gemv_dot<WT, VEC, CH, 2, NORM>(x, nm, rows, T, K, lane, acc);
    if (j >= F) return;
    const float b_g = bg ? load_w(bg, sizeof(WT) == 2, j) : 0.0f;
    const float b_u = bu ? load_w(bu, sizeof(WT) == 2, j) : 0.0f;
#pragma unroll
    for (int t = 0; t < OG_GEMV_CUDA_MAX_T; t++) {
        if (t < T) {
            const float g = warp_sum(acc[0][t]) + b_g, u = warp_sum(acc[1][t]) + b_u;
            if (lane == 0) out[t * F + j] = g / (1.0f + expf(-g)) * u;
        }
    }
}

/* ---- quantized weights (q8, q4; layout at OG_QUANT_GROUP in offgraph.h) ----
 * A [N, K] tensor is two planes: the quants of every row (q8: K bytes, q4:
 * K/2 bytes per row), then the f16 scales [N, K/32]. A row's quants are a
 * multiple of 16 bytes (K is a multiple of 32), so every group of a row is
 * 16-byte aligned when the tensor is (the host checks it): the gemv reads
 * words of 4 quants, the dequantizer 8-byte runs.
 *
 * Bytes become floats without a conversion instruction: a byte b put in the
 * low mantissa bits of 2^23 (a byte permute) is the float 2^23 + b, and
 * subtracting 2^23 + bias leaves b - bias exactly. q8 bytes are flipped to
 * q + 128 first (xor 0x80), q4 nibbles are stored as q + 8. */
struct qrow {         /* one row of a quantized tensor */
    const uint8_t *q; /* its quants   */
    const __half *s;  /* its scales [K / 32] */
};

__device__ inline qrow q_row(const void *w, bool q4, int64_t N, int64_t K, int64_t row) {
    const int64_t rb = q4 ? K / 2 : K;
    const uint8_t *base = static_cast<const uint8_t *>(w);
    return qrow{base + row * rb, reinterpret_cast<const __half *>(base + N * rb) + row * (K / OG_QUANT_GROUP)};
}

__device__ inline float q_scale(const qrow &r, int64_t g) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(r.s) + g)));
}

/* The four bytes of v, each minus bias, as exact floats. */
__device__ inline void bytes_f32(uint32_t v, float bias, float f[4]) {
    const float magic = 8388608.0f + bias; /* 2^23 + bias */
    f[0] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7540)) - magic;
    f[1] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7541)) - magic;
    f[2] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7542)) - magic;
    f[3] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7543)) - magic;
}

/* Where lane l's weights of a row lie: its four weights 4 l .. 4 l + 3 of
 * slab 0 (the slabs of 128 follow at a fixed stride) and their group's
 * scale. q4: byte j of a group holds element j (low nibble) and j + 16
 * (high nibble), so elements j .. j + 3 are one nibble (shift) of bytes
 * j mod 16 .. + 3, and lanes l and l + 4 read the same word. */
struct qlane {
    const unsigned int *w;    /* slab i's word at w[i * q_word_stride()] */
    const unsigned short *s;  /* slab i's scale (f16 bits) at s[i * 4] */
};

template <bool Q4>
__device__ inline qlane q_lane(const qrow &r, int lane) {
    const int e = 4 * lane, g = e / OG_QUANT_GROUP;
    return qlane{reinterpret_cast<const unsigned int *>(r.q + (Q4 ? g * 16 + (e & 15) : e)),
                 reinterpret_cast<const unsigned short *>(r.s) + g};
}
template <bool Q4>
constexpr int q_word_stride() { return Q4 ? 16 : 32; } /* words of one slab of 128 quants */

/* Four weights as loaded: the word of their quants, their scale's bits. */
struct qword {
    uint32_t w;
    unsigned short s;
};

template <bool Q4>
__device__ inline qword load_qword(const qlane &l, int slab) {
    return qword{__ldg(l.w + slab * q_word_stride<Q4>()), __ldg(l.s + slab * 4)};
}

/* The integers q of four weights (shift: the lane's q4 nibble, 0 or 4). */
template <bool Q4>
__device__ inline void unpack_qword(const qword &c, int shift, float q[4]) {
    if (Q4) bytes_f32((c.w >> shift) & 0x0f0f0f0fu, 8.0f, q);
    else bytes_f32(c.w ^ 0x80808080u, 128.0f, q);
}

/* The product of x (or, with NORM, of rms_norm(a + b)) with R quantized
 * weight rows, for up to MT rows of x (MT: 1, or OG_GEMV_CUDA_MAX_T).
 * Lane l takes the four weights e = 128 i + 4 l .. + 3 of every slab i of
 * 128: a warp's loads of x are then 512 contiguous bytes (four L1
 * wavefronts; a lane per group of 32 would touch 32 lines per load), of
 * q8 quants 128 contiguous bytes and of q4 quants 64. The lane's four
 * products x * q are summed in f32, then scaled, acc = fma(scale, sum,
 * acc), slab after slab in increasing order; the sums depend neither on CH
 * (slabs per lane loaded ahead) nor on R, so the plain, multi and swiglu
 * kernels and the norm prologue give the same bits. x must be 16-byte
 * aligned (K is a multiple of 32: every row then is). */
template <bool Q4, int CH, int R, bool NORM, int MT>
__device__ inline void gemv_dot_q(const float *x, const gemv_norm &nm, const qrow wr[R], int64_t T, int64_t K,
                                  int lane, float acc[R][MT]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < MT; t++) acc[r][t] = 0.0f;
    /* the lane's slabs: 0 .. n-1 (slab i holds its weights 128 i + 4 l .. + 3) */
    const int n = (int)((K - 4 * lane + 127) / 128);
    const int shift = Q4 ? ((lane >> 2) & 1) * 4 : 0;
    qlane L[R];
#pragma unroll
    for (int r = 0; r < R; r++) L[r] = q_lane<Q4>(wr[r], lane);
    qword w[R][CH];
#pragma unroll
    for (int r = 0; r < R; r++) /* the first CH slabs of every row before waiting */
#pragma unroll
        for (int c = 0; c < CH; c++)
            if (c < n) w[r][c] = load_qword<Q4>(L[r], c);
    grid_wait(); /* every thread, once: gemv_norm_x synchronizes the block */
    if (NORM) x = gemv_norm_x(nm, T, K);
    const float *xl = x + 4 * lane;
    for (int i0 = 0; i0 < n; i0 += CH) {
        if (i0) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int c = 0; c < CH; c++)
                    if (i0 + c < n) w[r][c] = load_qword<Q4>(L[r], i0 + c);
        }
#pragma unroll
        for (int c = 0; c < CH; c++) {
            if (i0 + c >= n) break;
            float q[R][4], sc[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                unpack_qword<Q4>(w[r][c], shift, q[r]);
                sc[r] = __half2float(__ushort_as_half(w[r][c].s));
            }
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t < T) {
                    const float4 a = *reinterpret_cast<const float4 *>(xl + t * K + 128 * (i0 + c));
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float d = a.x * q[r][0];
                        d = fmaf(a.y, q[r][1], d), d = fmaf(a.z, q[r][2], d), d = fmaf(a.w, q[r][3], d);
                        acc[r][t] = fmaf(sc[r], d, acc[r][t]);
                    }
                }
            }
        }
    }
}

/* Up to OG_GEMV_CUDA_MAX_PARTS products of one x by quantized weights (f32
 * biases), in one launch: part i owns the blocks from first[i] on. */
struct gemv_q_parts {
    const void *w[OG_GEMV_CUDA_MAX_PARTS];
    const float *bias[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1];
    int n;
};

/* Output features of one warp of the quantized gemv: x is loaded once for
 * both rows (a q4 row needs 8 bytes of x per byte of weights, which the
 * load units would otherwise feel before memory does). */
constexpr int kQRowsPerWarp = 2;
constexpr int kQGemvFeatures = kGemvRows * kQRowsPerWarp; /* per block */

/* A warp's rows past the last feature compute the last one again and store
 * nothing: every warp takes part in the block's barriers. */
template <bool Q4, int CH, bool NORM, int MT>
__global__ void gemv_q_kernel(const float *x, gemv_norm nm, gemv_q_parts p, int64_t T, int64_t K) {
    int part = 0;
    while (part + 1 < p.n && (int64_t)blockIdx.x >= p.first[part + 1]) part++;
    const int64_t j0 = (blockIdx.x - p.first[part]) * (int64_t)kQGemvFeatures + (threadIdx.x >> 5) * kQRowsPerWarp;
    const int lane = threadIdx.x & 31;
    const int64_t N = p.N[part];
    qrow rows[kQRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kQRowsPerWarp; r++) rows[r] = q_row(p.w[part], Q4, N, K, j0 + r < N ? j0 + r : N - 1);
    float acc[kQRowsPerWarp][MT];
    gemv_dot_q<Q4, CH, kQRowsPerWarp, NORM, MT>(x, nm, rows, T, K, lane, acc);
    float *out = p.out[part];
#pragma unroll
    for (int r = 0; r < kQRowsPerWarp; r++) {
        const int64_t j = j0 + r;
        if (j >= N) break; /* warp-uniform */
        const float b = p.bias[part] ? p.bias[part][j] : 0.0f;
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t < T) {
                const float s = warp_sum(acc[r][t]);
                if (lane == 0) out[t * N + j] = s + b;
            }
        }
    }
}

/* gate and up products by quantized weights with silu(gate) * up as the
 * epilogue: a warp per feature reads both rows, as gemv_swiglu_kernel. */
template <bool Q4, int CH, bool NORM, int MT>
__global__ void gemv_swiglu_q_kernel(const float *x, gemv_norm nm, const void *wg, const float *bg, const void *wu,
                                     const float *bu, int64_t T, int64_t K, int64_t F, float *out) {
    const int64_t j = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int64_t row = j < F ? j : F - 1;
    const qrow rows[2] = {q_row(wg, Q4, F, K, row), q_row(wu, Q4, F, K, row)};
    float acc[2][MT];
    gemv_dot_q<Q4, CH, 2, NORM, MT>(x, nm, rows, T, K, lane, acc);
    if (j >= F) return;
    const float b_g = bg ? bg[j] : 0.0f, b_u = bu ? bu[j] : 0.0f;
#pragma unroll
    for (int t = 0; t < MT; t++) {
        if (t < T) {
            const float g = warp_sum(acc[0][t]) + b_g, u = warp_sum(acc[1][t]) + b_u;
            if (lane == 0) out[t * F + j] = g / (1.0f + expf(-g)) * u;
        }
    }
}

/* Elements e .. e + 7 of row `row` of a quantized [N, K] tensor as f32 (the
 * exact values scale * q). */
template <bool Q4>
__device__ inline void dequant8(const void *w, int64_t N, int64_t K, int64_t row, int64_t e, float q[8]) {
    const qrow r = q_row(w, Q4, N, K, row);
    const int64_t g = e / OG_QUANT_GROUP;
    const int s = (int)(e % OG_QUANT_GROUP) / 8;
    uint2 v;
    if (Q4) { /* elements 8 s .. 8 s + 7: bytes 8 (s & 1) .. + 7 of the group, nibble s >> 1 */
        v = __ldg(reinterpret_cast<const uint2 *>(r.q + g * 16 + 8 * (s & 1)));
        const int shift = (s >> 1) * 4;
        v.x = (v.x >> shift) & 0x0f0f0f0fu;
        v.y = (v.y >> shift) & 0x0f0f0f0fu;
    } else {
        v = __ldg(reinterpret_cast<const uint2 *>(r.q + e));
        v.x ^= 0x80808080u;
        v.y ^= 0x80808080u;
    }
    bytes_f32(v.x, Q4 ? 8.0f : 128.0f, q);
    bytes_f32(v.y, Q4 ? 8.0f : 128.0f, q + 4);
    const float sc = q_scale(r, g);
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] *= sc;
}

/* Rows row0 .. row0 + rows - 1 of a quantized [N, K] tensor as f32: a
 * thread per 8 elements. */
template <bool Q4>
__global__ void dequantize_kernel(const void *w, int64_t N, int64_t K, int64_t row0, int64_t rows, float *out) {
    grid_wait();
    const int64_t per_row = K / 8, total = rows * per_row;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < total; u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = u / per_row, e = (u % per_row) * 8; /* row i of the slice, first element e */
        float q[8];
        dequant8<Q4>(w, N, K, row0 + i, e, q);
        float4 *o = reinterpret_cast<float4 *>(out + i * K + e);
        o[0] = make_float4(q[0], q[1], q[2], q[3]);
        o[1] = make_float4(q[4], q[5], q[6], q[7]);
    }
}

/* Row row0 + blockIdx.y as bf16 hi + lo (og_split8_bf16), 8 elements a
 * thread. */
template <bool Q4>
__global__ void dequantize_split_kernel(const void *w, int64_t N, int64_t K, int64_t row0, __nv_bfloat16 *hi,
                                        __nv_bfloat16 *lo) {
    grid_wait();
    const int64_t i = blockIdx.y;
    for (int64_t e = 8 * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x); e < K; e += 8 * (int64_t)gridDim.x * blockDim.x) {
        float q[8];
        dequant8<Q4>(w, N, K, row0 + i, e, q);
        og_split8_bf16(q, hi + i * K + e, lo + i * K + e);
    }
}

/* ---- embed from a quantized table: element = f32(scale) * q, exact ---- */
template <bool Q4>
__global__ void embed_q_kernel(const int32_t *tokens, const void *table, int64_t V, int64_t H, float *out) {
    grid_wait();
    const int64_t t = blockIdx.x;
    const qrow r = q_row(table, Q4, V, H, tokens[t]);
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        int q;
        if (Q4) {
            const int64_t g = h / OG_QUANT_GROUP, j = h % OG_QUANT_GROUP;
            const uint8_t b = r.q[g * 16 + (j & 15)];
            q = (int)(j < 16 ? b & 15 : b >> 4) - 8;
        } else {
            q = (int8_t)r.q[h];
        }
        out[t * H + h] = __half2float(r.s[h / OG_QUANT_GROUP]) * (float)q;
    }
}

__global__ void split_bf16_kernel(const float *x, int64_t count, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    grid_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        __nv_bfloat16 h, l;
        og_split_bf16(x[i], &h, &l);
        hi[i] = h;
        if (lo) lo[i] = l;
    }
}

__global__ void fill_rows_kernel(const void *bias, bool bf16, int64_t T, int64_t N, float *out) {
    grid_wait();
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

/* Two passes: kArgmaxBlocks blocks each leave the best of their stride of x
 * in the scratch, one block picks the best of those. */
constexpr int kArgmaxThreads = 256, kArgmaxBlocks = 128;

/* The best (value, index) over the block, in thread 0. */
__device__ inline void block_best(float &best, int64_t &bi) {
    __shared__ float sv[kArgmaxThreads];
    __shared__ int64_t si[kArgmaxThreads];
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
    best = sv[0];
    bi = si[0];
}

__global__ void argmax_part_kernel(const float *x, int64_t V, float *part_v, int64_t *part_i) {
    grid_wait();
    float best = x[0];
    int64_t bi = 0;
    for (int64_t i = blockIdx.x * (int64_t)kArgmaxThreads + threadIdx.x; i < V; i += (int64_t)kArgmaxBlocks * kArgmaxThreads)
        if (better(x[i], i, best, bi)) best = x[i], bi = i;
    block_best(best, bi);
    if (threadIdx.x == 0) part_v[blockIdx.x] = best, part_i[blockIdx.x] = bi;
}

__global__ void argmax_final_kernel(const float *part_v, const int64_t *part_i, int32_t *index) {
    grid_wait();
    float best = part_v[0];
    int64_t bi = part_i[0];
    for (int b = threadIdx.x; b < kArgmaxBlocks; b += kArgmaxThreads)
        if (better(part_v[b], part_i[b], best, bi)) best = part_v[b], bi = part_i[b];
    block_best(best, bi);
    if (threadIdx.x == 0) *index = (int32_t)bi;
}


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
    OG_CUDA_TRY(check_matrix(op, table, table_dtype, H));
    OG_CUDA_TRY(check_dims(op, V, H));
    OG_CUDA_TRY(check_dims(op, T, H));
    if (!tokens || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: tokens or out is NULL", op);
    if (T > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows", op, (long long)T);
    if (og_dtype_is_quantized(table_dtype)) {
        if (table_dtype == OG_DTYPE_Q4)
            launch_pdl(embed_q_kernel<true>, dim3((unsigned)T), dim3(256), static_cast<cudaStream_t>(stream), tokens,
                       table, V, H, out);
        else
            launch_pdl(embed_q_kernel<false>, dim3((unsigned)T), dim3(256), static_cast<cudaStream_t>(stream), tokens,
                       table, V, H, out);
        return launched(op);
    }
    launch_pdl(embed_kernel, dim3((unsigned)T), dim3(256), static_cast<cudaStream_t>(stream), tokens, table,
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
    launch_pdl(rms_norm_kernel, dim3((unsigned)T), dim3(256), static_cast<cudaStream_t>(stream), x, weight,
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
    launch_pdl(head_rms_norm_kernel, dim3((unsigned)blocks), dim3(256), static_cast<cudaStream_t>(stream), 
        x, weight, weight_dtype == OG_DTYPE_BF16, rows, D, eps, out);
    return launched(op);
}

extern "C" og_status og_add_rms_norm_cuda(void *stream, const float *a, const float *b, const void *weight,
                                          og_dtype weight_dtype, int64_t T, int64_t N, float eps, float *sum,
                                          float *out, uint16_t *out_bf16) {
    const char *op = "add_rms_norm_cuda";
    OG_CUDA_TRY(check_weight(op, weight, weight_dtype));
    OG_CUDA_TRY(check_dims(op, T, N));
    if (!a || !b || !sum || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a, b, sum or out is NULL", op);
    if (!(eps >= 0.0f) || isinf(eps)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)eps);
    if (T > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows", op, (long long)T);
    const auto kernel = N <= 4 * 256 ? add_rms_norm_kernel<4> : N <= 16 * 256 ? add_rms_norm_kernel<16>
                        : N <= 32 * 256 ? add_rms_norm_kernel<32> : add_rms_norm_kernel<0>;
    launch_pdl(kernel, dim3((unsigned)T), dim3(256), static_cast<cudaStream_t>(stream), 
        a, b, weight, weight_dtype == OG_DTYPE_BF16, N, eps, sum, out, reinterpret_cast<__nv_bfloat16 *>(out_bf16));
    return launched(op);
}

extern "C" og_status og_head_norm_rope_multi_cuda(void *stream, const og_head_norm_rope_cuda_job *jobs, int n_jobs,
                                                  const int32_t *positions, int64_t T) {
    const char *op = "head_norm_rope_cuda";
    if (!jobs || n_jobs < 1 || n_jobs > 2 || !positions)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %d jobs (1 or 2) or positions NULL", op, n_jobs);
    norm_rope_jobs jb = {};
    int64_t total = 0;
    for (int k = 0; k < n_jobs; k++) {
        const og_head_norm_rope_cuda_job *j = &jobs[k];
        OG_CUDA_TRY(check_weight(op, j->weight, j->weight_dtype));
        OG_CUDA_TRY(check_dims(op, T, j->n));
        OG_CUDA_TRY(check_dims(op, T * j->n, j->D));
        if (!j->x || !j->inv_freq || !j->out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is NULL", op);
        if (j->D < 2 || j->D % 2)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: head dim %lld is not even", op, (long long)j->D);
        if (!(j->eps >= 0.0f) || isinf(j->eps))
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)j->eps);
        jb.x[k] = j->x, jb.w[k] = j->weight, jb.inv_freq[k] = j->inv_freq, jb.out[k] = j->out;
        jb.rows[k] = T * j->n, jb.n[k] = j->n, jb.D[k] = j->D, jb.eps[k] = j->eps;
        jb.bf16[k] = j->weight_dtype == OG_DTYPE_BF16;
        total += jb.rows[k];
    }
    const int64_t blocks = (total + 7) / 8;
    if (blocks > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %lld rows", op, (long long)total);
    launch_pdl(head_norm_rope_kernel, dim3((unsigned)blocks), dim3(256), static_cast<cudaStream_t>(stream), jb, total,
               positions);
    return launched(op);
}

extern "C" og_status og_head_norm_rope_cuda(void *stream, const float *x, const void *weight, og_dtype weight_dtype,
                                            const float *inv_freq, const int32_t *positions, int64_t T, int64_t n,
                                            int64_t D, float eps, float *out) {
    const og_head_norm_rope_cuda_job job = {x, weight, weight_dtype, inv_freq, n, D, eps, out};
    return og_head_norm_rope_multi_cuda(stream, &job, 1, positions, T);
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
    launch_pdl(rope_kernel, dim3(grid_for(pairs, 256)), dim3(256), static_cast<cudaStream_t>(stream), inv_freq, D, x, positions, T, n,
                                                                                     out);
    return launched(op);
}

extern "C" og_status og_swiglu_cuda(void *stream, const float *gate, const float *up, int64_t count, float *out,
                                    uint16_t *out_bf16) {
    if (!gate || !up || !out || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "swiglu_cuda: NULL buffer or count %lld", (long long)count);
    launch_pdl(swiglu_kernel, dim3(grid_for(count, 256)), dim3(256), static_cast<cudaStream_t>(stream), gate, up, count, out,
               reinterpret_cast<__nv_bfloat16 *>(out_bf16));
    return launched("swiglu_cuda");
}

extern "C" og_status og_add_cuda(void *stream, const float *a, const float *b, int64_t count, float *out) {
    if (!a || !b || !out || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "add_cuda: NULL buffer or count %lld", (long long)count);
    launch_pdl(add_kernel, dim3(grid_for(count, 256)), dim3(256), static_cast<cudaStream_t>(stream), a, b, count, out);
    return launched("add_cuda");
}

namespace {

/* Chunks per lane loaded ahead (gemv_dot): the whole row of K <= 4096 bf16
 * (2048 f32) weights at once, fewer for short rows. */
int gemv_chunks(int64_t K, size_t weight_size) {
    if (K <= 1024) return 4;
    return K <= 2048 || weight_size == 4 ? 8 : 16;
}

/* The launch shape every gemv launch shares: which x (or norm prologue), its
 * shared memory, and the chunks per lane. */
struct gemv_launch {
    cudaStream_t st;
    const float *x; /* NULL with a norm prologue */
    gemv_norm nm;
    bool norm, vec;
    int64_t T, K;
    size_t smem;
};

/* Calls f(vec, chunks, norm), three compile-time constants
 * (std::integral_constant), with the kernel instance g asks for. */
template <typename WT, typename F>
void with_gemv_shape(const gemv_launch &g, F f) {
    const auto norm_too = [&](auto vec, auto chunks) {
        if (g.norm) f(vec, chunks, std::true_type{});
        else f(vec, chunks, std::false_type{});
    };
    const int ch = gemv_chunks(g.K, sizeof(WT));
    if (!g.vec) norm_too(std::false_type{}, std::integral_constant<int, 1>{});
    else if (ch == 4) norm_too(std::true_type{}, std::integral_constant<int, 4>{});
    else if (ch == 8) norm_too(std::true_type{}, std::integral_constant<int, 8>{});
    else norm_too(std::true_type{}, std::integral_constant<int, sizeof(WT) == 2 ? 16 : 8>{});
}

template <typename WT>
og_status launch_gemv(const gemv_launch &g, const og_gemv_cuda_part *parts, int n) {
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
    with_gemv_shape<WT>(g, [&](auto vec, auto ch, auto norm) {
        launch_pdl_smem(gemv_kernel<WT, vec.value, ch.value, norm.value>, dim3((unsigned)blocks), dim3(kGemvThreads),
                        g.smem, g.st, g.x, g.nm, p, g.T, g.K);
    });
    return launched("gemv_cuda");
}

template <typename WT>
void launch_swiglu(const gemv_launch &g, unsigned blocks, const void *wg, const void *bg, const void *wu,
                   const void *bu, int64_t F, float *out) {
    with_gemv_shape<WT>(g, [&](auto vec, auto ch, auto norm) {
        launch_pdl_smem(gemv_swiglu_kernel<WT, vec.value, ch.value, norm.value>, dim3(blocks), dim3(kGemvThreads),
                        g.smem, g.st, g.x, g.nm, static_cast<const WT *>(wg), static_cast<const WT *>(bg),
                        static_cast<const WT *>(wu), static_cast<const WT *>(bu), g.T, g.K, F, out);
    });
}

/* Slabs of 128 weights per lane the quantized gemv loads ahead (a word and
 * a scale each): a row of K <= 1024 at once, longer rows in rounds of 8. */
int gemv_q_chunks(int64_t K) {
    if (K <= 128) return 1;
    return K <= 512 ? 4 : 8;
}

/* Calls f(chunks, norm, max_rows), three compile-time constants, with the
 * quantized kernel instance g asks for; max_rows is 1 for one row of x
 * (decode of one session: no registers held for rows that never come). */
template <bool Q4, typename F>
void with_gemv_q_shape(const gemv_launch &g, F f) {
    const auto rows_too = [&](auto chunks, auto norm) {
        if (g.T == 1) f(chunks, norm, std::integral_constant<int, 1>{});
        else f(chunks, norm, std::integral_constant<int, OG_GEMV_CUDA_MAX_T>{});
    };
    const auto norm_too = [&](auto chunks) {
        if (g.norm) rows_too(chunks, std::true_type{});
        else rows_too(chunks, std::false_type{});
    };
    const int ch = gemv_q_chunks(g.K);
    if (ch == 1) norm_too(std::integral_constant<int, 1>{});
    else if (ch == 4) norm_too(std::integral_constant<int, 4>{});
    else norm_too(std::integral_constant<int, 8>{});
}

template <bool Q4>
og_status launch_gemv_q(const gemv_launch &g, const og_gemv_cuda_part *parts, int n) {
    gemv_q_parts p = {};
    p.n = n;
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) {
        p.w[i] = parts[i].weight;
        p.bias[i] = static_cast<const float *>(parts[i].bias);
        p.out[i] = parts[i].out;
        p.N[i] = parts[i].N;
        p.first[i] = blocks;
        blocks += (parts[i].N + kQGemvFeatures - 1) / kQGemvFeatures;
    }
    p.first[n] = blocks;
    if (blocks > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "gemv_cuda: %lld blocks", (long long)blocks);
    with_gemv_q_shape<Q4>(g, [&](auto ch, auto norm, auto mt) {
        launch_pdl_smem(gemv_q_kernel<Q4, ch.value, norm.value, mt.value>, dim3((unsigned)blocks),
                        dim3(kGemvThreads), g.smem, g.st, g.x, g.nm, p, g.T, g.K);
    });
    return launched("gemv_cuda");
}

template <bool Q4>
void launch_swiglu_q(const gemv_launch &g, unsigned blocks, const void *wg, const void *bg, const void *wu,
                     const void *bu, int64_t F, float *out) {
    with_gemv_q_shape<Q4>(g, [&](auto ch, auto norm, auto mt) {
        launch_pdl_smem(gemv_swiglu_q_kernel<Q4, ch.value, norm.value, mt.value>, dim3(blocks), dim3(kGemvThreads),
                        g.smem, g.st, g.x, g.nm, wg, static_cast<const float *>(bg), wu,
                        static_cast<const float *>(bu), g.T, g.K, F, out);
    });
}

/* The quantized kernels read x with 16-byte loads and have no scalar path:
 * x must be 16-byte aligned (the norm prologue's x in shared memory is). */
og_status check_q_input(const char *op, const gemv_launch &g) {
    if (g.norm || aligned16(g.x)) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x must be 16-byte aligned beside quantized weights", op);
}

/* Checks the x or norm prologue of a gemv and fills the launch shape (vec
 * still to be narrowed by the weights' alignment). */
og_status gemv_setup(const char *op, void *stream, const float *x, const og_gemv_cuda_norm *norm, og_dtype weight_dtype,
                     int64_t T, int64_t K, gemv_launch *g) {
    *g = gemv_launch{};
    g->st = static_cast<cudaStream_t>(stream);
    g->x = x;
    g->T = T;
    g->K = K;
    g->vec = K % 8 == 0;
    if (!norm) {
        if (!x) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x is NULL", op);
        g->vec = g->vec && aligned16(x);
        return OG_OK;
    }
    if (!norm->a || !norm->b || !norm->sum)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: norm a, b or sum is NULL", op);
    OG_CUDA_TRY(check_weight(op, norm->weight, norm->weight_dtype));
    if (!(norm->eps >= 0.0f) || isinf(norm->eps))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g", op, (double)norm->eps);
    if (!og_gemv_cuda_norm_fits(weight_dtype, T, K))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a norm prologue of %lld x %lld does not fit", op,
                            (long long)T, (long long)K);
    g->norm = true;
    g->nm = gemv_norm{norm->a, norm->b, norm->weight, norm->weight_dtype == OG_DTYPE_BF16, norm->eps, norm->sum};
    g->smem = (size_t)(T * K) * sizeof(float);
    return OG_OK;
}

og_status check_gemv(const char *op, const void *weight, og_dtype dt, int64_t T, int64_t K, int64_t N,
                     const float *out) {
    OG_CUDA_TRY(check_matrix(op, weight, dt, K));
    OG_CUDA_TRY(check_dims(op, N, K));
    OG_CUDA_TRY(check_dims(op, T, K));
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
    if (T > OG_GEMV_CUDA_MAX_T)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows, at most %d", op, (long long)T,
                            OG_GEMV_CUDA_MAX_T);
    if ((N + kGemvRows - 1) / kGemvRows > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: N = %lld", op, (long long)N);
    return OG_OK;
}

} /* namespace */

extern "C" bool og_gemv_cuda_norm_fits(og_dtype weight_dtype, int64_t T, int64_t K) {
    /* Up to 2048 floats of x (the 0.6B shape's hidden 1024 for two rows):
     * there a product is a few microseconds and the launch saved is worth
     * it. Past that every block's own norm pass costs more than the separate
     * add_rms_norm launch, which runs while the product's blocks already load
     * their weights (programmatic dependent launch): measured on the 8B shape,
     * the q/k/v product took 26 us with the norm in its blocks and the o
     * product of 32 MB 13 us (bench/gpu/notes.md). gemv_q.cu's q8 / q4
     * products fold it up to 4096 floats: its blocks read a and b several
     * float4 at a time, and the 8B decode measured faster with the fold (H100,
     * q4 296.6 -> 313.0 tok/s, q8 218.4 -> 226.7). */
    if (T < 1 || K < 1 || T > OG_GEMV_CUDA_MAX_T) return false;
    return K <= 2048 / T || (og_gemvq_takes(weight_dtype, T, K) && K <= 4096 / T);
}

extern "C" og_status og_gemv_norm_multi_cuda(void *stream, const float *x, const og_gemv_cuda_norm *norm,
                                             og_dtype weight_dtype, int64_t T, int64_t K,
                                             const og_gemv_cuda_part *parts, int n_parts) {
    const char *op = "gemv_cuda";
    if (!parts || n_parts < 1 || n_parts > OG_GEMV_CUDA_MAX_PARTS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %d parts (1..%d)", op, n_parts, OG_GEMV_CUDA_MAX_PARTS);
    gemv_launch g;
    OG_CUDA_TRY(gemv_setup(op, stream, x, norm, weight_dtype, T, K, &g));
    for (int i = 0; i < n_parts; i++) {
        OG_CUDA_TRY(check_gemv(op, parts[i].weight, weight_dtype, T, K, parts[i].N, parts[i].out));
        g.vec = g.vec && aligned16(parts[i].weight);
    }
    if (og_dtype_is_quantized(weight_dtype)) OG_CUDA_TRY(check_q_input(op, g));
    if (og_gemvq_takes(weight_dtype, T, K)) {
        og_gemvq_launch l = {};
        l.stream = g.st, l.dtype = weight_dtype, l.T = T, l.K = K, l.x = norm ? NULL : x, l.norm = norm;
        l.n_parts = n_parts;
        for (int i = 0; i < n_parts; i++)
            l.w[i] = parts[i].weight, l.bias[i] = static_cast<const float *>(parts[i].bias), l.N[i] = parts[i].N,
            l.out[i] = parts[i].out;
        return og_gemvq_run(&l);
    }
    const void *ws[OG_GEMV_CUDA_MAX_PARTS];
    for (int i = 0; i < n_parts; i++) ws[i] = parts[i].weight;
    if (og_gemv_tc_takes(weight_dtype, T, K, norm ? NULL : x, ws, n_parts)) {
        og_gemv_tc_launch l = {};
        l.stream = g.st, l.dtype = weight_dtype, l.T = T, l.K = K, l.x = norm ? NULL : x, l.norm = norm;
        l.n_parts = n_parts;
        for (int i = 0; i < n_parts; i++)
            l.w[i] = parts[i].weight, l.bias[i] = parts[i].bias, l.N[i] = parts[i].N, l.out[i] = parts[i].out;
        return og_gemv_tc_run(&l);
    }
    if (og_dtype_is_quantized(weight_dtype))
        return weight_dtype == OG_DTYPE_Q4 ? launch_gemv_q<true>(g, parts, n_parts)
                                           : launch_gemv_q<false>(g, parts, n_parts);
    return weight_dtype == OG_DTYPE_BF16 ? launch_gemv<__nv_bfloat16>(g, parts, n_parts)
                                         : launch_gemv<float>(g, parts, n_parts);
}

extern "C" og_status og_gemv_multi_cuda(void *stream, const float *x, og_dtype weight_dtype, int64_t T, int64_t K,
                                        const og_gemv_cuda_part *parts, int n_parts) {
    return og_gemv_norm_multi_cuda(stream, x, NULL, weight_dtype, T, K, parts, n_parts);
}

extern "C" og_status og_gemv_cuda(void *stream, const float *x, const void *weight, const void *bias,
                                  og_dtype weight_dtype, int64_t T, int64_t K, int64_t N, float *out) {
    const og_gemv_cuda_part part = {weight, bias, N, out};
    return og_gemv_multi_cuda(stream, x, weight_dtype, T, K, &part, 1);
}

extern "C" og_status og_gemv_norm_swiglu_cuda(void *stream, const float *x, const og_gemv_cuda_norm *norm,
                                              const void *w_gate, const void *b_gate, const void *w_up,
                                              const void *b_up, og_dtype weight_dtype, int64_t T, int64_t K,
                                              int64_t F, float *out) {
    const char *op = "gemv_swiglu_cuda";
    gemv_launch g;
    OG_CUDA_TRY(gemv_setup(op, stream, x, norm, weight_dtype, T, K, &g));
    OG_CUDA_TRY(check_gemv(op, w_gate, weight_dtype, T, K, F, out));
    OG_CUDA_TRY(check_matrix(op, w_up, weight_dtype, K));
    g.vec = g.vec && aligned16(w_gate) && aligned16(w_up);
    const unsigned blocks = (unsigned)((F + kGemvRows - 1) / kGemvRows);
    const bool bf16 = weight_dtype == OG_DTYPE_BF16;
    if (og_dtype_is_quantized(weight_dtype)) OG_CUDA_TRY(check_q_input(op, g));
    if (og_gemvq_takes(weight_dtype, T, K)) {
        og_gemvq_launch l = {};
        l.stream = g.st, l.dtype = weight_dtype, l.T = T, l.K = K, l.x = norm ? NULL : x, l.norm = norm;
        l.swiglu = true;
        l.w[0] = w_gate, l.w[1] = w_up, l.bias[0] = static_cast<const float *>(b_gate),
        l.bias[1] = static_cast<const float *>(b_up), l.N[0] = l.N[1] = F, l.out[0] = out;
        return og_gemvq_run(&l);
    }
    const void *ws[2] = {w_gate, w_up};
    if (og_gemv_tc_takes(weight_dtype, T, K, norm ? NULL : x, ws, 2)) {
        og_gemv_tc_launch l = {};
        l.stream = g.st, l.dtype = weight_dtype, l.T = T, l.K = K, l.x = norm ? NULL : x, l.norm = norm;
        l.swiglu = true;
        l.w[0] = w_gate, l.w[1] = w_up, l.bias[0] = b_gate, l.bias[1] = b_up, l.N[0] = l.N[1] = F, l.out[0] = out;
        return og_gemv_tc_run(&l);
    }
    if (og_dtype_is_quantized(weight_dtype)) {
        if (weight_dtype == OG_DTYPE_Q4) launch_swiglu_q<true>(g, blocks, w_gate, b_gate, w_up, b_up, F, out);
        else launch_swiglu_q<false>(g, blocks, w_gate, b_gate, w_up, b_up, F, out);
    } else if (bf16) launch_swiglu<__nv_bfloat16>(g, blocks, w_gate, b_gate, w_up, b_up, F, out);
    else launch_swiglu<float>(g, blocks, w_gate, b_gate, w_up, b_up, F, out);
    return launched(op);
}

extern "C" og_status og_gemv_swiglu_cuda(void *stream, const float *x, const void *w_gate, const void *b_gate,
                                         const void *w_up, const void *b_up, og_dtype weight_dtype, int64_t T,
                                         int64_t K, int64_t F, float *out) {
    return og_gemv_norm_swiglu_cuda(stream, x, NULL, w_gate, b_gate, w_up, b_up, weight_dtype, T, K, F, out);
}

extern "C" og_status og_dequantize_cuda(void *stream, const void *weight, og_dtype weight_dtype, int64_t N,
                                        int64_t K, int64_t row0, int64_t rows, float *out) {
    const char *op = "dequantize_cuda";
    if (!og_dtype_is_quantized(weight_dtype))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: dtype %s is not q8 or q4", op, og_dtype_name(weight_dtype));
    OG_CUDA_TRY(check_matrix(op, weight, weight_dtype, K));
    OG_CUDA_TRY(check_dims(op, N, K));
    if (!out || ((uintptr_t)out & 15u))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out is NULL or not 16-byte aligned", op);
    if (row0 < 0 || rows < 1 || row0 > N - rows)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: rows [%lld, %lld) of %lld", op, (long long)row0,
                            (long long)(row0 + rows), (long long)N);
    const dim3 grid(grid_for(rows * (K / 8), 256));
    if (weight_dtype == OG_DTYPE_Q4)
        launch_pdl(dequantize_kernel<true>, grid, dim3(256), static_cast<cudaStream_t>(stream), weight, N, K, row0,
                   rows, out);
    else
        launch_pdl(dequantize_kernel<false>, grid, dim3(256), static_cast<cudaStream_t>(stream), weight, N, K, row0,
                   rows, out);
    return launched(op);
}

extern "C" og_status og_dequantize_split_cuda(void *stream, const void *weight, og_dtype weight_dtype, int64_t N,
                                              int64_t K, int64_t row0, int64_t rows, uint16_t *hi, uint16_t *lo) {
    const char *op = "dequantize_split_cuda";
    if (!og_dtype_is_quantized(weight_dtype))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: dtype %s is not quantized", op, og_dtype_name(weight_dtype));
    if (!hi || !lo || !aligned16(hi) || !aligned16(lo))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: hi or lo is NULL or not 16-byte aligned", op);
    if (og_dtype_is_kquant(weight_dtype))
        return og_kquant_dequantize_split_cuda(stream, weight, weight_dtype, N, K, row0, rows, hi, lo);
    OG_CUDA_TRY(check_matrix(op, weight, weight_dtype, K));
    OG_CUDA_TRY(check_dims(op, N, K));
    if (row0 < 0 || rows < 1 || rows > 65535 || row0 > N - rows)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: rows [%lld, %lld) of %lld (at most 65535 a call)", op,
                            (long long)row0, (long long)(row0 + rows), (long long)N);
    const dim3 grid((unsigned)((K / 8 + 127) / 128), (unsigned)rows);
    __nv_bfloat16 *h = reinterpret_cast<__nv_bfloat16 *>(hi), *l = reinterpret_cast<__nv_bfloat16 *>(lo);
    if (weight_dtype == OG_DTYPE_Q4)
        launch_pdl(dequantize_split_kernel<true>, grid, dim3(128), static_cast<cudaStream_t>(stream), weight, N, K,
                   row0, h, l);
    else
        launch_pdl(dequantize_split_kernel<false>, grid, dim3(128), static_cast<cudaStream_t>(stream), weight, N, K,
                   row0, h, l);
    return launched(op);
}

extern "C" og_status og_split_bf16_cuda(void *stream, const float *x, int64_t count, uint16_t *hi, uint16_t *lo) {
    if (!x || !hi || count < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "split_bf16_cuda: NULL buffer or count %lld", (long long)count);
    launch_pdl(split_bf16_kernel, dim3(grid_for(count, 256)), dim3(256), static_cast<cudaStream_t>(stream), 
        x, count, reinterpret_cast<__nv_bfloat16 *>(hi), reinterpret_cast<__nv_bfloat16 *>(lo));
    return launched("split_bf16_cuda");
}

extern "C" og_status og_fill_rows_cuda(void *stream, const void *bias, og_dtype dtype, int64_t T, int64_t N,
                                       float *out) {
    const char *op = "fill_rows_cuda";
    OG_CUDA_TRY(check_weight(op, bias, dtype));
    OG_CUDA_TRY(check_dims(op, T, N));
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
    launch_pdl(fill_rows_kernel, dim3(grid_for(T * N, 256)), dim3(256), static_cast<cudaStream_t>(stream), 
        bias, dtype == OG_DTYPE_BF16, T, N, out);
    return launched(op);
}

extern "C" size_t og_argmax_cuda_scratch_bytes(void) { return kArgmaxBlocks * (sizeof(float) + sizeof(int64_t)); }

extern "C" og_status og_argmax_cuda(void *stream, const float *x, int64_t V, int32_t *index, void *scratch) {
    if (!x || !index || !scratch || V < 1 || V > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "argmax_cuda: NULL buffer or V = %lld", (long long)V);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    int64_t *part_i = static_cast<int64_t *>(scratch);
    float *part_v = reinterpret_cast<float *>(part_i + kArgmaxBlocks);
    launch_pdl(argmax_part_kernel, dim3(kArgmaxBlocks), dim3(kArgmaxThreads), st, x, V, part_v, part_i);
    launch_pdl(argmax_final_kernel, dim3(1), dim3(kArgmaxThreads), st, part_v, part_i, index);
    return launched("argmax_cuda");
}
