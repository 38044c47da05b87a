/* Decode products of q8 / q4 weights designed around the memory: out[T, N]
 * = x[T, K] @ W[N, K]^T (+ bias) for T = 1..8 rows of x, the weights read
 * once with 16-byte loads, several of them in flight per lane, turned into
 * exact f32 values in registers and multiplied on the CUDA cores in f32.
 *
 * Letters: T rows of x, K in features, N out features of a part, F ffn width.
 *
 * Work: a block of 8 warps stages x (or, with the norm prologue, rms_norm(a
 * + b)) in shared memory once, then each warp owns R weight rows (R
 * features of a part, or R / 2 features of gate and of up for the swiglu
 * form) over all of K. A row is walked in steps of 512 bytes, lane l taking
 * bytes 16 l .. 16 l + 15 of the step: 16 quants of half a group (q8) or
 * one whole group (q4: byte j holds element j in its low nibble and j + 16
 * in its high one). The loads of the next U steps of every row (R x U = 8
 * loads of 16 bytes a lane, with their f16 scales) are in flight while a
 * step is used; the first U are issued before waiting for the previous
 * kernel (weights are never written by one). A block holds 256 threads and
 * two or more blocks fit an SM, so an SM keeps 64 KB or more of loads in
 * flight.
 *
 * x in shared memory: the float4 c of a row of x (k = 4 c .. 4 c + 3) lies
 * at c ^ ((c >> 3) & 7), a permutation inside each run of 8 float4 (128
 * bytes): at each of a lane's 16-byte reads the 8 lanes of a quarter warp
 * (whose reads are 64 bytes apart for q8, 128 for q4) then hit 8 different
 * 16-byte bank groups, one shared-memory wavefront.
 *
 * Sums: bytes become floats by the byte-permute trick of ops.cu (exact);
 * each lane sums the 4 products of a word's quants with x in f32, scales
 * that sum (acc = fma(scale, sum, acc)), word after word of its chunk and
 * step after step; the lanes' sums meet by a shuffle tree. That order
 * depends on K only: the plain, multi-part, swiglu and norm forms give the
 * same bits for an output, whatever R or the other parts are. */
#include "kernels/cuda/gemv_q.cuh"

#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

namespace {

using namespace og_cuda;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kStepBytes = 512; /* bytes of a row a warp reads a step: 16 a lane */
constexpr int kLoads = 8;       /* 16-byte loads in flight a lane: R rows x U steps */
/* x staged per block: up to 110 KB, so that two blocks fit an SM (228 KB,
 * 1 KB of it reserved a block); a 32B-like down product (K = 25600) fits at
 * T = 1 */
constexpr int64_t kSmemMax = 110 * 1024;

struct q_norm { /* the add + rms_norm prologue (og_gemv_cuda_norm) */
    const float *a, *b;
    const void *w;
    bool bf16;
    float eps;
    float *sum;
};

struct q_params {
    const uint8_t *w[OG_GEMV_CUDA_MAX_PARTS];
    const float *bias[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1]; /* part i owns warp tasks first[i] .. first[i + 1] - 1 */
    int n;
    const float *x;
    q_norm nm;
    int64_t T, K;
};

__device__ inline int swz(int c) { return c ^ ((c >> 3) & 7); }

/* Streamed weights: read once, so they skip L1. */
__device__ inline uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ inline unsigned short ld_scale(const unsigned short *p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

/* The four bytes of v, each minus bias, as exact floats: a byte put in the
 * low mantissa bits of 2^23 is the float 2^23 + b. */
__device__ inline void bytes_f32(uint32_t v, float bias, float f[4]) {
    const float magic = 8388608.0f + bias;
    f[0] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7540)) - magic;
    f[1] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7541)) - magic;
    f[2] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7542)) - magic;
    f[3] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7543)) - magic;
}

/* x = rms_norm(a + b) into shared memory, with the bits of
 * add_rms_norm_kernel (256 threads a row, each summing its elements k = tid,
 * tid + 256, ... with fmaf; the 8 warp sums added as block_sum does). Block
 * 0 writes sum = a + b. */
__device__ void stage_norm(const q_norm &nm, int64_t T, int64_t K, float4 *xs) {
    __shared__ float part[kWarps];
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t t = 0; t < T; t++) {
        const int64_t base = t * K;
        float sq = 0.0f;
        for (int64_t i = threadIdx.x; i < K; i += kThreads) {
            const float v = nm.a[base + i] + nm.b[base + i];
            if (blockIdx.x == 0) nm.sum[base + i] = v;
            sq = fmaf(v, v, sq);
        }
        sq = warp_sum(sq);
        if (lane == 0) part[warp] = sq;
        __syncthreads();
        if (warp == 0) {
            float v = lane < kWarps ? part[lane] : 0.0f;
            v = warp_sum(v);
            if (lane == 0) rs[t] = 1.0f / sqrtf(v / (float)K + nm.eps);
        }
        __syncthreads();
    }
    const int64_t K4 = K / 4, n = T * K4;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        const int64_t t = i / K4, c = i - t * K4, k = 4 * c;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = ((nm.a[t * K + k + e] + nm.b[t * K + k + e]) * rs[t]) * load_w(nm.w, nm.bf16, k + e);
        xs[t * K4 + swz((int)c)] = make_float4(v[0], v[1], v[2], v[3]);
    }
}

__device__ void stage_x(const float *x, int64_t T, int64_t K, float4 *xs) {
    const int64_t K4 = K / 4, n = T * K4;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        const int64_t t = i / K4, c = i - t * K4;
        xs[t * K4 + swz((int)c)] = x4[i];
    }
}

/* acc[r][t] += the products of the R rows' chunks of one step (cur, their
 * scales cs) with x; xb: the lane's first float4 of x in the step, swizzled
 * (its chunk's float4 i then lies at xb ^ i). */
template <bool Q4, int R, int MT>
__device__ inline void step_dot(const uint4 cur[R], const unsigned short cs[R], const float4 *xs, int64_t K4,
                                int xb, int64_t T, float acc[R][MT]) {
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) sc[r] = __half2float(__ushort_as_half(cs[r]));
    constexpr int kQuads = Q4 ? 8 : 4; /* quads of 4 weights in a lane's chunk */
#pragma unroll
    for (int i = 0; i < kQuads; i++) {
        float q[R][4];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t words[4] = {cur[r].x, cur[r].y, cur[r].z, cur[r].w};
            if (Q4) { /* quad i < 4: low nibbles of word i (elements 4 i ..); else high nibbles of word i - 4 */
                const uint32_t w = words[i & 3];
                bytes_f32(i < 4 ? w & 0x0f0f0f0fu : (w >> 4) & 0x0f0f0f0fu, 8.0f, q[r]);
            } else {
                bytes_f32(words[i] ^ 0x80808080u, 128.0f, q[r]);
            }
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t < T) {
                const float4 a = xs[t * K4 + (xb ^ i)];
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

/* A warp's task: R rows of one part (or R / 2 features of gate and up),
 * where its quants and scales lie, and the first U steps of them loaded. */
template <bool Q4, int R, int U, bool SW>
struct q_task {
    static constexpr int RF = SW ? R / 2 : R;      /* features of a task */
    static constexpr int kScaleStep = Q4 ? 32 : 16; /* groups (scales) of a row a step */
    int part;
    int64_t N, j0;
    const uint8_t *q[R];
    const unsigned short *s[R];

    __device__ void start(const q_params &p, int64_t task, int64_t rb, int steps, int lane, uint4 buf[R][U],
                          unsigned short sc[R][U]) {
        part = 0;
        while (part + 1 < p.n && task >= p.first[part + 1]) part++;
        N = p.N[part];
        j0 = (task - p.first[part]) * RF;
        const int64_t K = p.K;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int m = SW ? r / RF : 0;
            const int64_t j = j0 + (SW ? r % RF : r), row = j < N ? j : N - 1;
            const uint8_t *base = p.w[part + m];
            q[r] = base + row * rb + 16 * lane;
            s[r] = reinterpret_cast<const unsigned short *>(base + N * rb) + row * (K / OG_QUANT_GROUP) +
                   (Q4 ? lane : lane / 2);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (u < steps && (int64_t)u * kStepBytes + 16 * lane < rb)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    buf[r][u] = ld_stream16(q[r] + (int64_t)u * kStepBytes);
                    sc[r][u] = ld_scale(s[r] + u * kScaleStep);
                }
    }
};

/* MT: rows of x the registers are sized for (1, or 8 with T <= 8). The
 * grid is at most two blocks an SM, and warp w of block b takes tasks
 * w * gridDim + b, then every gridDim * 8 on: when tasks outnumber warps,
 * the warps with one more task are spread over every SM. A warp with no
 * task takes part in the staging only. */
template <bool Q4, int R, int MT, bool SW, bool NORM>
__global__ void __launch_bounds__(kThreads, 2) gemvq_kernel(q_params p) {
    constexpr int U = kLoads / R; /* steps in flight */
    using task_t = q_task<Q4, R, U, SW>;
    constexpr int RF = task_t::RF, kScaleStep = task_t::kScaleStep;
    extern __shared__ float4 xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t ntasks = p.first[p.n], stride = (int64_t)gridDim.x * kWarps;
    const int64_t K = p.K, K4 = K / 4, T = p.T;
    const int64_t rb = Q4 ? K / 2 : K; /* bytes of a row of quants */
    const int steps = (int)((rb + kStepBytes - 1) / kStepBytes);
    const auto active = [&](int st) { return (int64_t)st * kStepBytes + 16 * lane < rb; };
    int64_t task = (int64_t)warp * gridDim.x + blockIdx.x;
    task_t tk;
    uint4 buf[R][U];
    unsigned short sc[R][U];
    if (task < ntasks) tk.start(p, task, rb, steps, lane, buf, sc);
    grid_wait();
    if (NORM) stage_norm(p.nm, T, K, xs);
    else stage_x(p.x, T, K, xs);
    __syncthreads();
    for (; task < ntasks; task += stride) {
        if (task >= stride) tk.start(p, task, rb, steps, lane, buf, sc); /* not the first: loaded above */
        float acc[R][MT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < MT; t++) acc[r][t] = 0.0f;
        for (int s0 = 0; s0 < steps; s0 += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int st = s0 + u;
                if (st >= steps) break;
                uint4 cur[R];
                unsigned short cs[R];
#pragma unroll
                for (int r = 0; r < R; r++) cur[r] = buf[r][u], cs[r] = sc[r][u];
                const int nx = st + U;
                if (nx < steps && active(nx))
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        buf[r][u] = ld_stream16(tk.q[r] + (int64_t)nx * kStepBytes);
                        sc[r][u] = ld_scale(tk.s[r] + nx * kScaleStep);
                    }
                if (active(st)) {
                    /* the lane's first float4 of x: q8 k = 512 st + 16 l, q4 k = 32 (32 st + l) */
                    const int c0 = Q4 ? (st * 32 + lane) * 8 : st * 128 + 4 * lane;
                    step_dot<Q4, R, MT>(cur, cs, xs, K4, swz(c0), T, acc);
                }
            }
        }
        const int64_t N = tk.N, j0 = tk.j0;
        float *out = p.out[tk.part];
#pragma unroll
        for (int r = 0; r < RF; r++) {
            const int64_t j = j0 + r;
            if (j >= N) break; /* warp-uniform */
            if (SW) {
                const float bg = p.bias[0] ? p.bias[0][j] : 0.0f, bu = p.bias[1] ? p.bias[1][j] : 0.0f;
#pragma unroll
                for (int t = 0; t < MT; t++)
                    if (t < T) {
                        const float g = warp_sum(acc[r][t]) + bg, u = warp_sum(acc[RF + r][t]) + bu;
                        if (lane == 0) out[t * N + j] = g / (1.0f + expf(-g)) * u;
                    }
            } else {
                const float b = p.bias[tk.part] ? p.bias[tk.part][j] : 0.0f;
#pragma unroll
                for (int t = 0; t < MT; t++)
                    if (t < T) {
                        const float v = warp_sum(acc[r][t]);
                        if (lane == 0) out[t * N + j] = v + b;
                    }
            }
        }
    }
}

int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess) {
            (void)cudaGetLastError();
            return 132;
        }
        return v;
    }();
    return n;
}

template <bool Q4, int R, int MT, bool SW, bool NORM>
og_status launch(const og_gemvq_launch *l, q_params &p) {
    constexpr int RF = SW ? R / 2 : R;
    int64_t tasks = 0;
    const int n = SW ? 1 : l->n_parts;
    for (int i = 0; i < n; i++) {
        p.first[i] = tasks;
        tasks += (p.N[i] + RF - 1) / RF;
    }
    p.first[n] = tasks;
    int64_t blocks = (tasks + kWarps - 1) / kWarps;
    if (blocks > (int64_t)2 * sm_count()) blocks = (int64_t)2 * sm_count(); /* the rest loop (gemvq_kernel) */
    void (*kernel)(q_params) = gemvq_kernel<Q4, R, MT, SW, NORM>;
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemMax);
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemv_cuda: %lld bytes of shared memory refused: %s", (long long)kSmemMax,
                            cudaGetErrorString(allowed));
    }
    const size_t smem = (size_t)(p.T * p.K) * sizeof(float);
    launch_pdl_smem(kernel, dim3((unsigned)blocks), dim3(kThreads), smem, l->stream, p);
    return launched("gemv_cuda");
}

/* R = 4 rows a warp halves the x a block stages per weight byte; taken for
 * one row of x when the launch still has two blocks an SM (R = 2 otherwise:
 * a small product wants every SM, and with 8 rows of x R = 4 spills
 * registers). The norm prologue (K <= 2048) always takes R = 2. */
template <bool Q4, int MT, bool SW>
og_status launch_rows(const og_gemvq_launch *l, q_params &p) {
    if (l->norm) return launch<Q4, 2, MT, SW, true>(l, p);
    int64_t rows = 0;
    for (int i = 0; i < (SW ? 2 : l->n_parts); i++) rows += l->N[i];
    if (MT == 1 && rows >= (int64_t)2 * sm_count() * kWarps * 4) return launch<Q4, 4, 1, SW, false>(l, p);
    return launch<Q4, 2, MT, SW, false>(l, p);
}

template <bool Q4>
og_status launch_fmt(const og_gemvq_launch *l, q_params &p) {
    if (l->T == 1) return l->swiglu ? launch_rows<Q4, 1, true>(l, p) : launch_rows<Q4, 1, false>(l, p);
    return l->swiglu ? launch_rows<Q4, OG_GEMV_CUDA_MAX_T, true>(l, p)
                     : launch_rows<Q4, OG_GEMV_CUDA_MAX_T, false>(l, p);
}

/* -1 until the first call reads OG_CUDA_GEMVQ; then 0 (off), 1 (every T)
 * or 2 (one row of x only, the default). */
std::atomic<int> g_on{-1};

} /* namespace */

extern "C" int og_gemvq_cuda_get(void) {
    int v = g_on.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("OG_CUDA_GEMVQ");
        v = !env ? 2 : !strcmp(env, "ring") ? 1 : !strcmp(env, "0") || !strcmp(env, "off") ? 0 : 2;
        int expect = -1;
        if (!g_on.compare_exchange_strong(expect, v)) v = expect; /* another thread read it first */
    }
    return v;
}

extern "C" int og_gemvq_cuda_set(int mode) {
    const int prev = og_gemvq_cuda_get();
    g_on.store(mode >= 0 && mode <= 2 ? mode : 2);
    return prev;
}

bool og_gemvq_takes(og_dtype dtype, int64_t T, int64_t K) {
    if (dtype != OG_DTYPE_Q8 && dtype != OG_DTYPE_Q4) return false;
    if (T < 1 || T > OG_GEMV_CUDA_MAX_T || K < OG_QUANT_GROUP || K % OG_QUANT_GROUP) return false;
    if (T * K * (int64_t)sizeof(float) > kSmemMax) return false;
    /* measured on an H200 (bench_gemv_cuda, 8B products): faster than the
       CUDA-core kernel at one row (8B decode q8 197 -> 240, q4 219 -> 271
       tok/s), slower than the tensor-core one from two rows on */
    const int mode = og_gemvq_cuda_get();
    return mode == 1 || (mode == 2 && T == 1);
}

og_status og_gemvq_run(const og_gemvq_launch *l) {
    q_params p;
    memset(&p, 0, sizeof p);
    const int n = l->swiglu ? 2 : l->n_parts;
    for (int i = 0; i < n; i++) {
        p.w[i] = static_cast<const uint8_t *>(l->w[i]);
        p.bias[i] = l->bias[i];
        p.out[i] = l->out[i];
        p.N[i] = l->N[i];
    }
    p.n = l->swiglu ? 1 : n;
    p.x = l->x;
    p.T = l->T;
    p.K = l->K;
    if (l->norm)
        p.nm = q_norm{l->norm->a, l->norm->b, l->norm->weight, l->norm->weight_dtype == OG_DTYPE_BF16, l->norm->eps,
                      l->norm->sum};
    return l->dtype == OG_DTYPE_Q4 ? launch_fmt<true>(l, p) : launch_fmt<false>(l, p);
}
