/* Decode products of q8 / q4 weights designed around the memory: out[T, N]
 * = x[T, K] @ W[N, K]^T (+ bias) for T = 1..8 rows of x, the weights read
 * once with 16-byte loads, a fixed number of them in flight per lane from
 * the kernel's start to its end, and multiplied in integers.
 *
 * Letters: T rows of x, K in features, N out features of a part, F ffn width,
 * G = K / 32 groups of a row.
 *
 * x as two int8 terms. Each block stages x (or, with the norm prologue,
 * rms_norm(a + b)) in shared memory as the terms of each group of 32
 * elements: with m the group's largest |x|, u = m / (127 * 254),
 *   x ~ u (254 hi + lo),  hi = rne(x 127 / m),  lo = rne((x 127 / m - hi) 254),
 * both in [-127, 127] (x within u / 2 of it: 2^-15 m), and the group's sum
 * S = sum (254 hi + lo). A group whose m is below 2^-120 is zeros; one with
 * a NaN or an infinity has u = NaN, so its products are NaN. Every block
 * computes the same terms with the same operations (rounding by adding
 * 1.5 * 2^23), so the forms below agree bit for bit.
 *
 * Sums: a weight group's quants q (q8: signed bytes; q4: nibbles n, q = n -
 * 8) meet hi and lo in __dp4a sums, exact in int32:
 *   I = 254 sum(q hi) + sum(q lo)   (q4: 254 sum(n hi) + sum(n lo) - 8 S),
 * and the lane adds fma(scale * u, (float)I, acc) group after group of its
 * chunks; the lanes' sums meet by a shuffle tree. That order depends on K
 * only: the plain, multi-part, swiglu and norm forms give the same bits for
 * an output, whatever the other parts are. On the CUDA cores in f32 (the
 * kernel before this one) a q4 byte cost about 7 instructions and kept the
 * SM's issue slots full at half the copy rate; here it costs about 1.5.
 *
 * Work: a warp's tasks are R rows each (R = 2, or 4 on products of two or
 * more tasks a warp: R features of a part, or R / 2 features of gate and
 * of up for the swiglu form), over all of K, walked in steps of 512 bytes a
 * row: lane l takes bytes 16 l .. 16 l + 15 of a step, 16 quants of half a
 * group (q8) or one whole group (q4: byte j holds element j in its low
 * nibble and j + 16 in its high one). Its loads run kLoads / R steps ahead
 * of its sums as one stream over all its tasks: the
 * next task's first steps are in flight while this one's last are summed,
 * and the first are issued before waiting for the previous kernel (weights
 * are never written by one). The grid gives every warp the same number of
 * tasks (within one), over every SM.
 *
 * Terms in shared memory, per row of x: hi[Kp], lo[Kp], then (u, S) per
 * group. q8 keeps x's order, so a lane's 16 terms of a step are 16 adjacent
 * bytes. q4 lays each run of 32 groups (1024 elements, one step of a row)
 * out as the groups' first halves, 16 bytes each, then their second halves:
 * a lane's two halves lie 512 bytes apart and a warp's 16-byte reads of a
 * half are adjacent, one shared-memory wavefront each (Kp = K rounded up to
 * 1024). */
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
/* x's terms staged per block: up to 110 KB, so that two blocks fit an SM
 * (228 KB, 1 KB of it reserved a block) */
constexpr int64_t kSmemMax = 110 * 1024;
constexpr int kStageRounds = 4; /* float4 of x a thread loads at once when staging */
constexpr float kRound = 12582912.0f; /* 1.5 * 2^23: v + kRound rounds v to an integer (|v| < 2^22) */

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

struct q_gs { /* a group's term scale and sum of 254 hi + lo */
    float u;
    int s;
};

/* Bytes of a row's terms: q4 rounds K up to whole steps (1024 elements). */
__host__ __device__ inline int64_t terms_pitch(bool q4, int64_t K) { return q4 ? (K + 1023) / 1024 * 1024 : K; }

__host__ __device__ inline int64_t smem_bytes(bool q4, int64_t T, int64_t K) {
    return T * (2 * terms_pitch(q4, K) + (K / OG_QUANT_GROUP) * (int64_t)sizeof(q_gs));
}

__device__ inline unsigned short ld_scale(const unsigned short *p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

/* The low bytes of four words, in order. */
__device__ inline uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

/* Where element k of a row lies in its terms (4-aligned k keeps its 4). */
template <bool Q4>
__device__ inline int64_t term_at(int64_t k) {
    if (!Q4) return k;
    const int64_t e = k & 1023, j = e & 31;
    return (k - e) + (j >> 4) * 512 + (e >> 5) * 16 + (j & 15);
}

/* Four elements v (k .. k + 3 of a row) of a group of 32 spread over 8
 * lanes: the group's terms into hi, lo (at term_at) and its (u, S) into
 * gs[k / 32] when in. Every lane of the warp calls it (shuffles). */
template <bool Q4>
__device__ inline void quantize_group4(const float v[4], bool in, int8_t *hi, int8_t *lo, q_gs *gs, int64_t k,
                                       int lane) {
    float m = 0.0f;
    int bad = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float a = fabsf(v[e]);
        bad |= !(a <= 3.4028235e38f); /* NaN or infinity */
        m = fmaxf(m, a);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    const bool zero = bad || !(m >= 0x1p-120f);
    const float id = zero ? 0.0f : 127.0f / m;
    const float u = bad ? NAN : zero ? 0.0f : m / 32258.0f; /* 127 * 254 */
    uint32_t hb[4], lb[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float s = __fmul_rn(v[e], id);
        const float r = __fadd_rn(s, kRound), h = __fsub_rn(r, kRound);
        hb[e] = __float_as_uint(r); /* low byte: hi as int8 */
        lb[e] = __float_as_uint(__fadd_rn(__fmul_rn(__fsub_rn(s, h), 254.0f), kRound));
    }
    const uint32_t hw = pack_low_bytes(hb[0], hb[1], hb[2], hb[3]);
    const uint32_t lw = pack_low_bytes(lb[0], lb[1], lb[2], lb[3]);
    int sum = 254 * __dp4a((int)hw, 0x01010101, 0) + __dp4a((int)lw, 0x01010101, 0);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (in) {
        const int64_t at = term_at<Q4>(k);
        *reinterpret_cast<uint32_t *>(hi + at) = hw;
        *reinterpret_cast<uint32_t *>(lo + at) = lw;
        if ((lane & 7) == 0) gs[k / OG_QUANT_GROUP] = q_gs{u, sum};
    }
}

/* The terms of x (or rms_norm(a + b), with the bits of add_rms_norm_kernel:
 * 256 threads a row, each summing its elements k = tid, tid + 256, ... with
 * fmaf; the 8 warp sums added as block_sum does; block 0 writes sum = a + b)
 * into shared memory. Eight lanes take a group, four elements each. */
template <bool Q4, bool NORM>
__device__ void stage_terms(const q_params &p, int8_t *xh, int8_t *xl, q_gs *gs) {
    __shared__ float part[kWarps];
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t T = p.T, K = p.K, Kp = terms_pitch(Q4, K), G = K / OG_QUANT_GROUP;
    const q_norm &nm = p.nm;
    if (NORM) {
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
    }
    const int64_t K4 = K / 4, n = T * K4; /* n: a multiple of 8, so a group's 8 lanes are all in or all out */
    /* kStageRounds float4 of x a thread in flight at once: read one at a
       time, a 12288-float row of x took 12 round trips to memory a block */
    for (int64_t base = threadIdx.x - lane; base < n; base += kStageRounds * kThreads) {
        float v[kStageRounds][4];
#pragma unroll
        for (int b = 0; b < kStageRounds; b++) {
            const int64_t i = base + b * kThreads + lane, t = i < n ? i / K4 : 0, k = 4 * (i - t * K4);
#pragma unroll
            for (int e = 0; e < 4; e++) v[b][e] = 0.0f;
            if (i < n) {
                if (NORM) {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        v[b][e] = ((nm.a[t * K + k + e] + nm.b[t * K + k + e]) * rs[t]) * load_w(nm.w, nm.bf16, k + e);
                } else {
                    const float4 f = reinterpret_cast<const float4 *>(p.x)[i];
                    v[b][0] = f.x, v[b][1] = f.y, v[b][2] = f.z, v[b][3] = f.w;
                }
            }
        }
#pragma unroll
        for (int b = 0; b < kStageRounds; b++) {
            if (base + b * kThreads >= n) break; /* warp-uniform */
            const int64_t i = base + b * kThreads + lane, t = i < n ? i / K4 : 0, k = 4 * (i - t * K4);
            quantize_group4<Q4>(v[b], i < n, xh + t * Kp, xl + t * Kp, gs + t * G, k, lane);
        }
    }
}

__device__ inline uint4 lds16(const int8_t *p) { return *reinterpret_cast<const uint4 *>(p); }

/* acc[r][t] += the products of the R rows' chunks of step st (cur, their
 * scales cs) with x's terms. */
template <bool Q4, int R, int MT>
__device__ inline void step_dot(const uint4 cur[R], const unsigned short cs[R], const int8_t *xh, const int8_t *xl,
                                const q_gs *gs, int64_t Kp, int64_t G, int st, int lane, int64_t T,
                                float acc[R][MT]) {
    float dw[R];
#pragma unroll
    for (int r = 0; r < R; r++) dw[r] = __half2float(__ushort_as_half(cs[r]));
    if (Q4) {
        uint32_t nl[R][4], nh[R][4]; /* elements 0..15 and 16..31 of the group, as bytes 0..15 */
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t words[4] = {cur[r].x, cur[r].y, cur[r].z, cur[r].w};
#pragma unroll
            for (int w = 0; w < 4; w++) nl[r][w] = words[w] & 0x0f0f0f0fu, nh[r][w] = (words[w] >> 4) & 0x0f0f0f0fu;
        }
        const int64_t xo = (int64_t)st * 1024 + 16 * lane, g = (int64_t)st * 32 + lane;
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t < T) {
                const uint4 h0 = lds16(xh + t * Kp + xo), h1 = lds16(xh + t * Kp + xo + 512);
                const uint4 l0 = lds16(xl + t * Kp + xo), l1 = lds16(xl + t * Kp + xo + 512);
                const q_gs gv = gs[t * G + g];
                const int hs[8] = {(int)h0.x, (int)h0.y, (int)h0.z, (int)h0.w,
                                   (int)h1.x, (int)h1.y, (int)h1.z, (int)h1.w};
                const int ls[8] = {(int)l0.x, (int)l0.y, (int)l0.z, (int)l0.w,
                                   (int)l1.x, (int)l1.y, (int)l1.z, (int)l1.w};
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int a = 0, b = 0;
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        a = __dp4a((int)nl[r][w], hs[w], a), a = __dp4a((int)nh[r][w], hs[4 + w], a);
                        b = __dp4a((int)nl[r][w], ls[w], b), b = __dp4a((int)nh[r][w], ls[4 + w], b);
                    }
                    const int I = 254 * a + b - 8 * gv.s;
                    acc[r][t] = fmaf(dw[r] * gv.u, (float)I, acc[r][t]);
                }
            }
        }
    } else {
        const int64_t xo = (int64_t)st * kStepBytes + 16 * lane, g = (int64_t)st * 16 + (lane >> 1);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t < T) {
                const uint4 h = lds16(xh + t * Kp + xo), l = lds16(xl + t * Kp + xo);
                const float u = gs[t * G + g].u;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int a = __dp4a((int)cur[r].x, (int)h.x, 0), b = __dp4a((int)cur[r].x, (int)l.x, 0);
                    a = __dp4a((int)cur[r].y, (int)h.y, a), b = __dp4a((int)cur[r].y, (int)l.y, b);
                    a = __dp4a((int)cur[r].z, (int)h.z, a), b = __dp4a((int)cur[r].z, (int)l.z, b);
                    a = __dp4a((int)cur[r].w, (int)h.w, a), b = __dp4a((int)cur[r].w, (int)l.w, b);
                    acc[r][t] = fmaf(dw[r] * u, (float)(254 * a + b), acc[r][t]);
                }
            }
        }
    }
}

/* The part of a task and its first feature (RF features a task). */
template <int RF>
__device__ inline int task_part(const q_params &p, int64_t task, int64_t *j0) {
    int part = 0;
    while (part + 1 < p.n && task >= p.first[part + 1]) part++;
    *j0 = (task - p.first[part]) * RF;
    return part;
}

/* A warp's stream of weight loads: task by task (every stride-th), step by
 * step, the R rows of a task at each step. */
template <bool Q4, bool SW, int R>
struct q_loader {
    static constexpr int RF = SW ? R / 2 : R; /* features of a task */
    static constexpr int kScaleStep = Q4 ? 32 : 16; /* groups (scales) of a row a step */
    int64_t task;
    int step;
    const uint8_t *q[R];
    const unsigned short *s[R];

    __device__ void seek(const q_params &p, int64_t rb, int lane) {
        int64_t j0;
        const int part = task_part<RF>(p, task, &j0);
        const int64_t N = p.N[part], K = p.K;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t j = j0 + r % RF, row = j < N ? j : N - 1;
            const uint8_t *base = p.w[part + r / RF]; /* swiglu: gate rows, then up rows */
            q[r] = base + row * rb + 16 * lane;
            s[r] = reinterpret_cast<const unsigned short *>(base + N * rb) + row * (K / OG_QUANT_GROUP) +
                   (Q4 ? lane : lane / 2);
        }
    }
    /* Loads the next step into b, c (when the lane has bytes there) and moves on. */
    __device__ void issue(const q_params &p, int64_t ntasks, int64_t stride, int64_t rb, int steps, int lane,
                          uint4 b[R], unsigned short c[R]) {
        if (task >= ntasks) return;
        if ((int64_t)step * kStepBytes + 16 * lane < rb)
#pragma unroll
            for (int r = 0; r < R; r++) {
                b[r] = ld_stream16(q[r] + (int64_t)step * kStepBytes);
                c[r] = ld_scale(s[r] + step * kScaleStep);
            }
        if (++step == steps) {
            step = 0;
            task += stride;
            if (task < ntasks) seek(p, rb, lane);
        }
    }
};

/* MT: rows of x the registers are sized for (1, or 8 with T <= 8). Warp w
 * of block b takes tasks w * gridDim + b, then every gridDim * 8 on. A warp
 * with no task takes part in the staging only. */
template <bool Q4, int R, int MT, bool SW, bool NORM>
__global__ void __launch_bounds__(kThreads, 2) gemvq_kernel(q_params p) {
    constexpr int U = kLoads / R, RF = SW ? R / 2 : R; /* steps in flight; features of a task */
    extern __shared__ uint4 smem[];
    const int64_t K = p.K, T = p.T, Kp = terms_pitch(Q4, K), G = K / OG_QUANT_GROUP;
    int8_t *xh = reinterpret_cast<int8_t *>(smem), *xl = xh + T * Kp;
    q_gs *gs = reinterpret_cast<q_gs *>(xl + T * Kp);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t ntasks = p.first[p.n], stride = (int64_t)gridDim.x * kWarps;
    const int64_t rb = Q4 ? K / 2 : K; /* bytes of a row of quants */
    const int steps = (int)((rb + kStepBytes - 1) / kStepBytes);
    int64_t task = (int64_t)warp * gridDim.x + blockIdx.x;
    q_loader<Q4, SW, R> ld;
    ld.task = task, ld.step = 0;
    if (task < ntasks) ld.seek(p, rb, lane);
    uint4 buf[U][R];
    unsigned short sc[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) ld.issue(p, ntasks, stride, rb, steps, lane, buf[u], sc[u]);
    grid_wait();
    stage_terms<Q4, NORM>(p, xh, xl, gs);
    __syncthreads();
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < MT; t++) acc[r][t] = 0.0f;
    int st = 0;
    while (task < ntasks) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint4 cur[R];
            unsigned short cs[R];
#pragma unroll
            for (int r = 0; r < R; r++) cur[r] = buf[u][r], cs[r] = sc[u][r];
            ld.issue(p, ntasks, stride, rb, steps, lane, buf[u], sc[u]);
            if ((int64_t)st * kStepBytes + 16 * lane < rb) step_dot<Q4, R, MT>(cur, cs, xh, xl, gs, Kp, G, st, lane, T, acc);
            if (++st < steps) continue;
            /* the task's last step: its outputs */
            int64_t j0;
            const int part = task_part<RF>(p, task, &j0);
            const int64_t N = p.N[part];
            float *out = p.out[part];
#pragma unroll
            for (int r = 0; r < RF; r++) {
                const int64_t j = j0 + r;
                if (SW) {
                    const float bg = p.bias[0] && j < N ? p.bias[0][j] : 0.0f;
                    const float bu = p.bias[1] && j < N ? p.bias[1][j] : 0.0f;
#pragma unroll
                    for (int t = 0; t < MT; t++)
                        if (t < T) {
                            const float g = warp_sum(acc[r][t]) + bg, v = warp_sum(acc[RF + r][t]) + bu;
                            if (lane == 0 && j < N) out[t * N + j] = g / (1.0f + expf(-g)) * v;
                        }
                } else {
                    const float b = p.bias[part] && j < N ? p.bias[part][j] : 0.0f;
#pragma unroll
                    for (int t = 0; t < MT; t++)
                        if (t < T) {
                            const float v = warp_sum(acc[r][t]);
                            if (lane == 0 && j < N) out[t * N + j] = v + b;
                        }
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < MT; t++) acc[r][t] = 0.0f;
            st = 0;
            task += stride;
            if (task >= ntasks) break;
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

/* The grid: blocks per SM as the staged terms allow, two at most (the
 * kernel holds up to 128 registers a thread); every warp the same number
 * of tasks within one, as few warps as that needs, but at least one block
 * an SM while tasks last. */
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
    const int64_t smem = smem_bytes(Q4, p.T, p.K);
    int64_t per_sm = (228 * 1024) / (smem + 1024);
    if (per_sm > 2) per_sm = 2;
    if (per_sm < 1) per_sm = 1;
    const int64_t warps_max = (int64_t)sm_count() * per_sm * kWarps;
    const int64_t each = (tasks + warps_max - 1) / warps_max;
    int64_t blocks = ((tasks + each - 1) / each + kWarps - 1) / kWarps;
    if (blocks < sm_count()) blocks = tasks < sm_count() ? tasks : sm_count();
    void (*kernel)(q_params) = gemvq_kernel<Q4, R, MT, SW, NORM>;
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemMax);
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemv_cuda: %lld bytes of shared memory refused: %s", (long long)kSmemMax,
                            cudaGetErrorString(allowed));
    }
    launch_pdl_smem(kernel, dim3((unsigned)blocks), dim3(kThreads), (size_t)smem, l->stream, p);
    return launched("gemv_cuda");
}

/* R = 4 rows a task halves the x terms read per weight byte; taken at one
 * row of x for products of two or more tasks a warp (R = 2 otherwise: a
 * small product wants its rows spread over every SM). Measured on an H100
 * (bench_gemv_cuda 8b, one row): q8 gate/up 0.90 -> 0.99 of the copy rate,
 * q4 0.85 -> 0.88. */
template <bool Q4, int MT, bool SW>
og_status launch_rows(const og_gemvq_launch *l, q_params &p) {
    int64_t rows = 0;
    for (int i = 0; i < (SW ? 2 : l->n_parts); i++) rows += l->N[i];
    if (MT == 1 && rows >= (int64_t)2 * sm_count() * kWarps * 4 * 2)
        return l->norm ? launch<Q4, 4, 1, SW, true>(l, p) : launch<Q4, 4, 1, SW, false>(l, p);
    return l->norm ? launch<Q4, 2, MT, SW, true>(l, p) : launch<Q4, 2, MT, SW, false>(l, p);
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
    if (smem_bytes(dtype == OG_DTYPE_Q4, T, K) > kSmemMax) return false;
    /* measured on an H100 (bench_gemv_cuda): faster than the tensor-core
       kernel at one row on every product, at two rows on every 8B one (K >=
       4096: q8 0.42-0.58 -> 0.49-0.94 of copy, q4 0.24-0.37 -> 0.29-0.74)
       but not on the 0.6B shape's layers; from four rows mixed or slower */
    const int mode = og_gemvq_cuda_get();
    return mode == 1 || (mode == 2 && (T == 1 || (T == 2 && K >= 4096)));
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
