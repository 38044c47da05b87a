/* The moe instruction on the GPU (moe_cuda.h): routing, grouping of the
 * (row, expert) pairs by expert on the device, grouped products over a
 * device-side expert list, SwiGLU, and the per-row weighted sum.
 * Letters as moe_cuda.h. */
#include "kernels/cuda/moe_cuda.h"

#include "kernels/cuda/common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string.h>

namespace {

constexpr int kMaxTopK = 64;
constexpr int kRouteThreads = 256;
constexpr int kGroupThreads = 1024;
constexpr int kWarps = 8;         /* warps of a product block */
constexpr int kFeatPerWarp = 4;   /* output features of a warp */
constexpr int kPairChunk = 8;     /* pairs a lane sums at once */
/* The grouped GEMM on the tensor cores (grouped_mma_kernel) */
constexpr int kMmaBM = 64;        /* grouped places (pairs) of a tile */
constexpr int kMmaBN = 128;       /* output features of a tile */
constexpr int kMmaBK = 32;        /* k of a stage */
constexpr int kMmaThreads = 256;  /* 8 warps: 2 (rows) x 4 (features) of 32 x 32 */
constexpr int64_t kMmaMinPairs = 64; /* fewer pairs (decode) keep grouped_kernel */

/* Pieces of the scratch, in order (each 16-byte aligned). */
struct scratch_map {
    int32_t *ids;      /* [M] experts of each pair, rank order per row */
    float *w;          /* [M] their weights                             */
    int32_t *pos;      /* [M] each pair's place in the grouped order    */
    int32_t *row;      /* [M] the row of each grouped place             */
    int32_t *start;    /* [E + 1] first grouped place of each expert    */
    int32_t *list;     /* [E] the experts some pair picked, increasing   */
    int32_t *n_list;   /* [1] their number                              */
    int32_t *tiles;    /* [E + 1] first GEMM row tile of each expert    */
    float *gu;         /* [M, 2F]                                       */
    float *h;          /* [M, F]                                        */
    float *y;          /* [M, H]                                        */
};

size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

bool plan(int64_t T, int32_t k, int64_t E, int64_t H, int64_t F, size_t *total, scratch_map *m, char *base) {
    const size_t M = (size_t)T * (size_t)k;
    if (T < 1 || k < 1 || E < 1 || H < 1 || F < 1 || M / (size_t)k != (size_t)T) return false;
    const size_t widest = (size_t)(2 * F > H ? 2 * F : H);
    if (M > SIZE_MAX / 64 / widest) return false;
    const size_t sizes[11] = {M * 4, M * 4, M * 4, M * 4, ((size_t)E + 1) * 4, (size_t)E * 4, 16,
                              ((size_t)E + 1) * 4, M * (size_t)(2 * F) * 4, M * (size_t)F * 4, M * (size_t)H * 4};
    size_t off = 0;
    void **dst[11] = {(void **)&m->ids, (void **)&m->w, (void **)&m->pos, (void **)&m->row, (void **)&m->start,
                      (void **)&m->list, (void **)&m->n_list, (void **)&m->tiles, (void **)&m->gu, (void **)&m->h,
                      (void **)&m->y};
    for (int i = 0; i < 11; i++) {
        if (base) *dst[i] = base + off;
        off += up16(sizes[i]);
    }
    *total = off;
    return true;
}

/* A weight element of row r of expert e's [N, K] matrix, and the matrix. */
struct wmat {
    const void *base;  /* the stack */
    int dt;            /* 0 f32, 1 bf16, 2 q8, 3 q4 */
    int64_t N, K;
    size_t bytes;      /* one expert's matrix */
};

__device__ inline float w_at(const wmat &m, const char *eb, int64_t r, int64_t c) {
    switch (m.dt) {
    case 0: return reinterpret_cast<const float *>(eb)[r * m.K + c];
    case 1: return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(eb)[r * m.K + c]);
    default: {
        const bool q4 = m.dt == 3;
        const size_t rb = q4 ? (size_t)m.K / 2 : (size_t)m.K;
        const __half *s = reinterpret_cast<const __half *>(eb + (size_t)m.N * rb);
        const float scale = __half2float(s[r * (m.K / 32) + c / 32]);
        const uint8_t *q = reinterpret_cast<const uint8_t *>(eb) + (size_t)r * rb;
        if (!q4) return scale * (float)reinterpret_cast<const int8_t *>(q)[c];
        const int64_t g = c / 32, j = c % 32;
        const uint8_t b = q[g * 16 + (j & 15)];
        return scale * (float)((int)(j < 16 ? (b & 15) : (b >> 4)) - 8);
    }
    }
}

__device__ inline float block_max(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float u = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) u = fmaxf(u, __shfl_xor_sync(0xffffffffu, u, o));
        if (threadIdx.x == 0) part[0] = u;
    }
    __syncthreads();
    const float r = part[0];
    __syncthreads();
    return r;
}

/* 1. One block per row: p = softmax(logits), then k rounds of a warp
 * arg-max over the experts not yet taken (equal p: the lower index). */
__global__ void route_kernel(const float *logits, int64_t E, int32_t k, bool norm, int32_t *ids, float *w) {
    extern __shared__ float p[]; /* [E] */
    __shared__ int32_t taken[kMaxTopK];
    __shared__ float taken_p[kMaxTopK];
    const int64_t t = blockIdx.x;
    const float *l = logits + t * E;
    float mx = -INFINITY;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
    mx = block_max(mx);
    float s = 0.0f;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        p[e] = expf(l[e] - mx);
        s += p[e];
    }
    s = og_cuda::block_sum(s);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = p[e] / s;
        p[e] = isnan(v) ? 0.0f : v; /* a row of NaN (a graph's padding) still picks k experts */
    }
    __syncthreads();
    /* the k rounds in the first warp alone: no block barrier per round */
    if (threadIdx.x < 32) {
        for (int32_t j = 0; j < k; j++) {
            float bv = -1.0f;
            int32_t bi = 0x7fffffff;
            for (int64_t e = threadIdx.x; e < E; e += 32) {
                if (p[e] < 0.0f) continue; /* taken */
                if (p[e] > bv || (p[e] == bv && e < bi)) bv = p[e], bi = (int32_t)e;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
            }
            __syncwarp(); /* every lane's reads of p before lane 0 marks the pick (a shuffle orders no memory) */
            if (threadIdx.x == 0) {
                taken[j] = bi;
                taken_p[j] = bv;
                p[bi] = -1.0f;
            }
            __syncwarp();
        }
    }
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) sum += taken_p[j];
        for (int32_t j = 0; j < k; j++) {
            ids[t * k + j] = taken[j];
            w[t * k + j] = norm ? taken_p[j] / sum : taken_p[j];
        }
    }
}

/* 2. One block: count the pairs per expert, the first place of each, the
 * list of picked experts in increasing index, each pair's place, and the
 * first row tile of kMmaBM places of each expert for grouped_mma_kernel
 * (tiles[E]: their number). The counts live in shared memory (E int32) and
 * the first warp scans them 32 experts at a time (one thread walking them
 * through global memory took ~80 µs of a 128-expert decode step). */
__global__ void group_kernel(const int32_t *ids, int64_t M, int64_t E, int32_t *start, int32_t *list,
                             int32_t *n_list, int32_t *pos, int32_t *row, int32_t k, int32_t *tiles) {
    extern __shared__ int32_t cnt[]; /* [E]: counts, then placement cursors */
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int32_t acc = 0, tacc = 0, n = 0;
        for (int64_t base = 0; base < E; base += 32) {
            const int64_t e = base + lane;
            const int32_t c = e < E ? cnt[e] : 0, tc = (c + kMmaBM - 1) / kMmaBM;
            int32_t sc = c, st = tc; /* inclusive prefix sums over the lanes */
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, st, o);
                if (lane >= o) sc += a, st += b;
            }
            const unsigned picked = __ballot_sync(0xffffffffu, c > 0);
            if (e < E) {
                start[e] = acc + sc - c;
                tiles[e] = tacc + st - tc;
                if (c > 0) list[n + __popc(picked & ((1u << lane) - 1u))] = (int32_t)e;
                cnt[e] = acc + sc - c;
            }
            acc += __shfl_sync(0xffffffffu, sc, 31);
            tacc += __shfl_sync(0xffffffffu, st, 31);
            n += __popc(picked);
        }
        if (lane == 0) {
            start[E] = acc;
            tiles[E] = tacc;
            *n_list = n;
        }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        const int32_t at = atomicAdd(&cnt[ids[i]], 1);
        pos[i] = at;
        row[at] = (int32_t)(i / k);
    }
}

/* 3 and 5. Grid (feature tiles, listed experts): the block of list entry y
 * computes features [f0, f0 + kWarps * kFeatPerWarp) of its expert for every
 * pair of that expert, reading each weight row once per kPairChunk pairs.
 * in: [rows, K]; the pair at place q reads in row src[q] (src NULL: q). */
__global__ void grouped_kernel(wmat m, const float *in, const int32_t *src, const int32_t *list,
                               const int32_t *n_list, const int32_t *start, float *out) {
    const int32_t y = blockIdx.y;
    if (y >= *n_list) return;
    const int32_t e = list[y];
    const int32_t q0 = start[e], q1 = start[e + 1];
    const char *eb = static_cast<const char *>(m.base) + (size_t)e * m.bytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int fi = 0; fi < kFeatPerWarp; fi++) {
        const int64_t f = ((int64_t)blockIdx.x * kWarps + warp) * kFeatPerWarp + fi;
        if (f >= m.N) break;
        for (int32_t qc = q0; qc < q1; qc += kPairChunk) {
            const int n = q1 - qc < kPairChunk ? q1 - qc : kPairChunk;
            float acc[kPairChunk];
#pragma unroll
            for (int j = 0; j < kPairChunk; j++) acc[j] = 0.0f;
            for (int64_t c = lane; c < m.K; c += 32) {
                const float wv = w_at(m, eb, f, c);
#pragma unroll
                for (int j = 0; j < kPairChunk; j++)
                    if (j < n) {
                        const int64_t r = src ? src[qc + j] : qc + j;
                        acc[j] += wv * in[r * m.K + c];
                    }
            }
#pragma unroll
            for (int j = 0; j < kPairChunk; j++) {
                const float v = og_cuda::warp_sum(acc[j]);
                if (lane == 0 && j < n) out[(int64_t)(qc + j) * m.N + f] = v;
            }
        }
    }
}

/* 3 and 5 for bf16, q8 and q4 weights with K a multiple of kVecK (the
 * decode steps, and wide steps of quantized experts): as grouped_kernel, but
 * one feature a warp, and a lane reads 8 weights of a row at once (16 bytes of bf16, 8 of q8, 4 of
 * q4) and the matching 8 inputs as two float4, so a warp streams 256 weights
 * a row per round instead of 32 single elements, and the type is resolved
 * at compile time. Lane l of a round at k0 takes: bf16 and q8, k0 + 8 l ..
 * + 7; q4, the 4 bytes 4 (l % 4) .. + 3 of group k0 / 32 + l / 4, that is
 * its low nibbles (k 32 g + 4 (l % 4) + 0..3) and high ones (16 further). */
constexpr int kVecK = 256;

template <int DT>
__device__ inline void vec_weights(const char *eb, int64_t N, int64_t K, int64_t f, int64_t k0, int lane, float w[8],
                                   int64_t *p0, int64_t *p1) {
    if (DT == 1) {
        const int64_t c = k0 + 8 * lane;
        const uint4 v = *reinterpret_cast<const uint4 *>(eb + ((size_t)f * K + c) * 2);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(u[i] << 16);
            w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
        *p0 = c;
        *p1 = c + 4;
    } else if (DT == 2) {
        const int64_t c = k0 + 8 * lane;
        const uint2 v = *reinterpret_cast<const uint2 *>(eb + (size_t)f * K + c);
        const float sc = __half2float(reinterpret_cast<const __half *>(eb + (size_t)N * K)[f * (K / 32) + c / 32]);
        const uint32_t u[2] = {v.x, v.y};
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = sc * (float)(int8_t)(u[i / 4] >> (8 * (i % 4)));
        *p0 = c;
        *p1 = c + 4;
    } else {
        const int64_t g = k0 / 32 + lane / 4, sub = lane % 4;
        const uint32_t v = *reinterpret_cast<const uint32_t *>(eb + (size_t)f * (K / 2) + g * 16 + 4 * sub);
        const float sc = __half2float(reinterpret_cast<const __half *>(eb + (size_t)N * (K / 2))[f * (K / 32) + g]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t b = (v >> (8 * i)) & 0xffu;
            w[i] = sc * (float)((int)(b & 15u) - 8);
            w[4 + i] = sc * (float)((int)(b >> 4) - 8);
        }
        *p0 = g * 32 + 4 * sub;
        *p1 = *p0 + 16;
    }
}

/* One warp a feature (a block: kWarps features of one listed expert); the
 * rounds of k are taken kVecRounds at a time, their weights loaded before
 * any is used, so that a lane has that many loads in flight. */
constexpr int kVecRounds = 4;

template <int DT>
__global__ void grouped_vec_kernel(wmat m, const float *in, const int32_t *src, const int32_t *list,
                                   const int32_t *n_list, const int32_t *start, float *out) {
    const int32_t y = blockIdx.y;
    if (y >= *n_list) return;
    const int32_t e = list[y];
    const int32_t q0 = start[e], q1 = start[e + 1];
    const char *eb = static_cast<const char *>(m.base) + (size_t)e * m.bytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t f = (int64_t)blockIdx.x * kWarps + warp;
    if (f >= m.N) return;
    for (int32_t qc = q0; qc < q1; qc += kPairChunk) {
        const int n = q1 - qc < kPairChunk ? q1 - qc : kPairChunk;
        const float *xr[kPairChunk];
#pragma unroll
        for (int j = 0; j < kPairChunk; j++)
            xr[j] = in + (int64_t)(src ? src[qc + (j < n ? j : 0)] : qc + (j < n ? j : 0)) * m.K;
        float acc[kPairChunk];
#pragma unroll
        for (int j = 0; j < kPairChunk; j++) acc[j] = 0.0f;
        for (int64_t k0 = 0; k0 < m.K; k0 += kVecRounds * kVecK) {
            float w[kVecRounds][8];
            int64_t p0[kVecRounds], p1[kVecRounds];
#pragma unroll
            for (int u = 0; u < kVecRounds; u++)
                if (k0 + u * kVecK < m.K) vec_weights<DT>(eb, m.N, m.K, f, k0 + u * kVecK, lane, w[u], &p0[u], &p1[u]);
#pragma unroll
            for (int u = 0; u < kVecRounds; u++) {
                if (k0 + u * kVecK >= m.K) break;
#pragma unroll
                for (int j = 0; j < kPairChunk; j++)
                    if (j < n) {
                        const float4 a = *reinterpret_cast<const float4 *>(xr[j] + p0[u]);
                        const float4 b = *reinterpret_cast<const float4 *>(xr[j] + p1[u]);
                        acc[j] += w[u][0] * a.x + w[u][1] * a.y + w[u][2] * a.z + w[u][3] * a.w + w[u][4] * b.x +
                                  w[u][5] * b.y + w[u][6] * b.z + w[u][7] * b.w;
                    }
            }
        }
#pragma unroll
        for (int j = 0; j < kPairChunk; j++) {
            const float v = og_cuda::warp_sum(acc[j]);
            if (lane == 0 && j < n) out[(int64_t)(qc + j) * m.N + f] = v;
        }
    }
}

/* 3 and 5 for bf16, q8 and q4 weights (mode 2 of og_moe_cuda_set_vec, the
 * default): a lane reads one 16-byte chunk of a weight row at a time (8 bf16
 * weights, 16 q8 ones of one group, or the 32 q4 ones of one group: all the
 * group's nibbles), a warp owns kChunkFeat features, and the loads of
 * kChunkRounds rounds of every feature are issued before any is used. At one
 * token the products are a few kilobytes per warp, so what bounds them is the
 * bytes in flight per SM: grouped_vec_kernel's q4 rounds were 4 bytes a lane
 * (an H200 read q4 experts at a quarter of bf16's rate), these are 16 bytes
 * a lane for every format.
 * A pair's sum does not depend on the others of its step: lane l sums its
 * chunks l, l + 32, ... in order with one fmaf per weight, then the warp sums
 * the lanes, whatever P (the pairs summed at once) the step's width picked,
 * so a row gives the same bits alone and in a batch. */
/* Word i (0..3) of v; i a constant after unrolling. */
__device__ inline uint32_t word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

constexpr int kChunkFeat = 4;   /* features of a warp */
constexpr int kChunkRounds = 2; /* rounds of 32 chunks whose loads are in flight together */

template <int DT> struct chunk_of {
    static constexpr int kW = DT == 1 ? 8 : DT == 2 ? 16 : 32; /* weights of a 16-byte chunk */
};

/* The 4 weights 4 q .. 4 q + 3 of a chunk (raw: its 16 bytes; sc: its group's scale). */
template <int DT> __device__ inline void chunk_quad(const uint4 &raw, float sc, int q, float w[4]) {
    if (DT == 1) {
        const uint32_t a = word(raw, 2 * (q & 1)), b = word(raw, 2 * (q & 1) + 1);
        (void)sc;
        w[0] = __uint_as_float(a << 16), w[1] = __uint_as_float(a & 0xffff0000u);
        w[2] = __uint_as_float(b << 16), w[3] = __uint_as_float(b & 0xffff0000u);
    } else if (DT == 2) {
        const uint32_t v = word(raw, q);
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = sc * (float)(int8_t)(v >> (8 * i));
    } else {
        /* k 4 q .. 4 q + 3 of the group: the low nibbles of bytes 4 q .. (q < 4),
         * the high nibbles of bytes 4 (q - 4) .. (q >= 4) */
        const uint32_t v = word(raw, q & 3);
        const int sh = q < 4 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = sc * (float)((int)((v >> (8 * i + sh)) & 15u) - 8);
    }
}

template <int DT> __device__ inline void chunk_load(const char *eb, int64_t N, int64_t K, int64_t f, int64_t ci,
                                                     uint4 *raw, float *sc) {
    if (DT == 1) {
        *raw = *reinterpret_cast<const uint4 *>(eb + ((size_t)f * K + (size_t)ci * 8) * 2);
        *sc = 1.0f;
    } else if (DT == 2) {
        *raw = *reinterpret_cast<const uint4 *>(eb + (size_t)f * K + (size_t)ci * 16);
        *sc = __half2float(reinterpret_cast<const __half *>(eb + (size_t)N * K)[f * (K / 32) + ci / 2]);
    } else {
        *raw = *reinterpret_cast<const uint4 *>(eb + (size_t)f * (K / 2) + (size_t)ci * 16);
        *sc = __half2float(reinterpret_cast<const __half *>(eb + (size_t)N * (K / 2))[f * (K / 32) + ci]);
    }
}

/* Grid (feature tiles of kWarps * kChunkFeat, listed experts). P: pairs
 * summed at once (1, 2, 4 or 8, from the step's width). */
template <int DT, int P>
__global__ void grouped_chunk_kernel(wmat m, const float *in, const int32_t *src, const int32_t *list,
                                     const int32_t *n_list, const int32_t *start, float *out) {
    constexpr int kW = chunk_of<DT>::kW;
    const int32_t y = blockIdx.y;
    if (y >= *n_list) return;
    const int32_t e = list[y];
    const int32_t q0 = start[e], q1 = start[e + 1];
    const char *eb = static_cast<const char *>(m.base) + (size_t)e * m.bytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t f0 = ((int64_t)blockIdx.x * kWarps + warp) * kChunkFeat;
    if (f0 >= m.N) return;
    const int64_t chunks = m.K / kW;
    for (int32_t qc = q0; qc < q1; qc += P) {
        const int n = q1 - qc < P ? q1 - qc : P;
        const float *xr[P];
#pragma unroll
        for (int j = 0; j < P; j++)
            xr[j] = in + (int64_t)(src ? src[qc + (j < n ? j : 0)] : qc + (j < n ? j : 0)) * m.K;
        float acc[kChunkFeat][P];
#pragma unroll
        for (int fi = 0; fi < kChunkFeat; fi++)
#pragma unroll
            for (int j = 0; j < P; j++) acc[fi][j] = 0.0f;
        for (int64_t r0 = 0; r0 < chunks; r0 += 32 * kChunkRounds) {
            uint4 raw[kChunkRounds][kChunkFeat];
            float sc[kChunkRounds][kChunkFeat];
#pragma unroll
            for (int u = 0; u < kChunkRounds; u++) {
                const int64_t ci = r0 + 32 * u + lane;
#pragma unroll
                for (int fi = 0; fi < kChunkFeat; fi++)
                    if (ci < chunks && f0 + fi < m.N) chunk_load<DT>(eb, m.N, m.K, f0 + fi, ci, &raw[u][fi], &sc[u][fi]);
            }
#pragma unroll
            for (int u = 0; u < kChunkRounds; u++) {
                const int64_t ci = r0 + 32 * u + lane;
                if (ci >= chunks) break;
#pragma unroll
                for (int j = 0; j < P; j++) {
                    if (j >= n) break;
#pragma unroll
                    for (int q = 0; q < kW / 4; q++) {
                        const float4 xv = *reinterpret_cast<const float4 *>(xr[j] + ci * kW + 4 * q);
#pragma unroll
                        for (int fi = 0; fi < kChunkFeat; fi++) {
                            if (f0 + fi >= m.N) break;
                            float w[4];
                            chunk_quad<DT>(raw[u][fi], sc[u][fi], q, w);
                            float a = acc[fi][j];
                            a = fmaf(w[0], xv.x, a);
                            a = fmaf(w[1], xv.y, a);
                            a = fmaf(w[2], xv.z, a);
                            a = fmaf(w[3], xv.w, a);
                            acc[fi][j] = a;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int fi = 0; fi < kChunkFeat; fi++)
#pragma unroll
            for (int j = 0; j < P; j++) {
                const float v = og_cuda::warp_sum(acc[fi][j]);
                if (lane == 0 && j < n && f0 + fi < m.N) out[(int64_t)(qc + j) * m.N + f0 + fi] = v;
            }
    }
}

/* 3 and 5 on the tensor cores, for steps of kMmaMinPairs pairs or more
 * (OG_CUDA_MOE_GEMM=1): out[q, n] = sum_c W_e[n, c] in[src[q], c] for the
 * places q of each expert e, bf16 weights [N, K] (K a multiple of 8).
 * Grid (feature tiles of kMmaBN, row tiles): row tile y is tile
 * y - tiles[e] of the expert e with tiles[e] <= y < tiles[e + 1] (a binary
 * search over group_kernel's prefix; the grid has the most tiles any routing
 * can give, ceil(M / kMmaBM) + min(E, M), and blocks past tiles[E] return
 * at once), so one launch covers every expert with no host round trip and a
 * graph replays it whatever the rows pick.
 * A block's 8 warps each own 32 places x 32 features (2 x 4 mma.m16n8k16
 * tiles, bf16 operands, f32 sums). Per stage of kMmaBK k: the in rows are
 * read as f32 and split, as og_split_bf16_cuda does for the dense products,
 * into hi = bf16(x) and lo = bf16(x - hi), both multiplied by the weights
 * (x to about 2^-16 relative; the dense wide products' accuracy); the next
 * stage's loads are in flight while this one's products run (two shared
 * buffers, one barrier a stage).
 * The k order inside a stage: lane (g = lane / 4, c = lane % 4) takes k =
 * 8 c + 4 s + 0..3 at step s of the mma's two k16 steps, for the rows of in
 * and of W alike (one 16-byte shared load a row a stage), a permutation of
 * the stage's k that leaves the sum a product of the same terms. */
__device__ inline uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

__device__ inline void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}


__global__ void __launch_bounds__(kMmaThreads) grouped_mma_kernel(const void *w, size_t ebytes, int64_t N, int64_t K,
                                                                  const float *in, const int32_t *src,
                                                                  const int32_t *start, const int32_t *tiles,
                                                                  int64_t E, float *out) {
    __shared__ __align__(16) __nv_bfloat16 sa_hi[2][kMmaBM][kMmaBK];
    __shared__ __align__(16) __nv_bfloat16 sa_lo[2][kMmaBM][kMmaBK];
    __shared__ __align__(16) __nv_bfloat16 sb[2][kMmaBN][kMmaBK];
    const int32_t y = (int32_t)blockIdx.y;
    if (y >= tiles[E]) return;
    int32_t lo = 0, hi = (int32_t)E - 1; /* the last expert whose first tile is at or before y */
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (tiles[mid] <= y) lo = mid;
        else hi = mid - 1;
    }
    const int32_t e = lo;
    const int32_t r0 = start[e] + (y - tiles[e]) * kMmaBM;
    const int32_t r1 = min(start[e + 1], r0 + kMmaBM);
    const int64_t n0 = (int64_t)blockIdx.x * kMmaBN;
    const __nv_bfloat16 *we =
        reinterpret_cast<const __nv_bfloat16 *>(static_cast<const char *>(w) + (size_t)e * ebytes);
    const int tid = threadIdx.x;
    /* loads: in rows tid / 8 and tid / 8 + 32, 4 floats at k 4 (tid % 8);
     * weight rows tid / 4 and tid / 4 + 64, 8 values at k 8 (tid % 4) */
    const int a_row = tid >> 3, a_k = (tid & 7) * 4, b_row = tid >> 2, b_k = (tid & 3) * 8;
    const float *a_src[2];
    const __nv_bfloat16 *b_src[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int32_t q = r0 + a_row + i * 32;
        a_src[i] = q < r1 ? in + (int64_t)(src ? src[q] : q) * K : nullptr;
        const int64_t n = n0 + b_row + i * 64;
        b_src[i] = n < N ? we + n * K : nullptr;
    }
    float4 av[2];
    uint4 bv[2];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int64_t ka = k0 + a_k, kb = k0 + b_k;
            av[i] = a_src[i] && ka < K ? *reinterpret_cast<const float4 *>(a_src[i] + ka) : make_float4(0, 0, 0, 0);
            bv[i] = b_src[i] && kb < K ? __ldg(reinterpret_cast<const uint4 *>(b_src[i] + kb)) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const __nv_bfloat162 h01 = __floats2bfloat162_rn(av[i].x, av[i].y);
            const __nv_bfloat162 h23 = __floats2bfloat162_rn(av[i].z, av[i].w);
            const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
            const __nv_bfloat162 l01 = __floats2bfloat162_rn(av[i].x - f01.x, av[i].y - f01.y);
            const __nv_bfloat162 l23 = __floats2bfloat162_rn(av[i].z - f23.x, av[i].w - f23.y);
            *reinterpret_cast<uint2 *>(&sa_hi[buf][a_row + i * 32][a_k]) = make_uint2(bf16x2_bits(h01), bf16x2_bits(h23));
            *reinterpret_cast<uint2 *>(&sa_lo[buf][a_row + i * 32][a_k]) = make_uint2(bf16x2_bits(l01), bf16x2_bits(l23));
            *reinterpret_cast<uint4 *>(&sb[buf][b_row + i * 64][b_k]) = bv[i];
        }
    };
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;
    const int64_t stages = (K + kMmaBK - 1) / kMmaBK;
    load(0);
    store(0);
    __syncthreads();
    for (int64_t st = 0; st < stages; st++) {
        const int buf = (int)(st & 1);
        if (st + 1 < stages) load((st + 1) * kMmaBK);
        uint4 ah[2][2], al[2][2], b[4];
#pragma unroll
        for (int mf = 0; mf < 2; mf++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm + mf * 16 + g + h * 8;
                ah[mf][h] = *reinterpret_cast<const uint4 *>(&sa_hi[buf][r][c * 8]);
                al[mf][h] = *reinterpret_cast<const uint4 *>(&sa_lo[buf][r][c * 8]);
            }
#pragma unroll
        for (int nf = 0; nf < 4; nf++) b[nf] = *reinterpret_cast<const uint4 *>(&sb[buf][wn + nf * 8 + g][c * 8]);
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int mf = 0; mf < 2; mf++)
#pragma unroll
                for (int nf = 0; nf < 4; nf++) {
                    const uint32_t b0 = word(b[nf], 2 * s), b1 = word(b[nf], 2 * s + 1);
                    mma_bf16(acc[mf][nf], word(ah[mf][0], 2 * s), word(ah[mf][1], 2 * s), word(ah[mf][0], 2 * s + 1),
                             word(ah[mf][1], 2 * s + 1), b0, b1);
                    mma_bf16(acc[mf][nf], word(al[mf][0], 2 * s), word(al[mf][1], 2 * s), word(al[mf][0], 2 * s + 1),
                             word(al[mf][1], 2 * s + 1), b0, b1);
                }
        if (st + 1 < stages) store(buf ^ 1);
        __syncthreads();
    }
    /* acc[mf][nf]: places wm + 16 mf + g (+ 8 for v >= 2), features wn + 8 nf + 2 c (+ 1 for odd v) */
#pragma unroll
    for (int mf = 0; mf < 2; mf++)
#pragma unroll
        for (int nf = 0; nf < 4; nf++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int32_t q = r0 + wm + mf * 16 + g + (v >= 2 ? 8 : 0);
                const int64_t n = n0 + wn + nf * 8 + 2 * c + (v & 1);
                if (q < r1 && n < N) out[(int64_t)q * N + n] = acc[mf][nf][v];
            }
}

/* 4. h = silu(gate) * up for every pair: gu [M, 2F] -> h [M, F]. */
__global__ void swiglu_pairs_kernel(const float *gu, int64_t M, int64_t F, float *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * F) return;
    const int64_t q = i / F, c = i % F;
    const float g = gu[q * 2 * F + c], u = gu[q * 2 * F + F + c];
    h[i] = g / (1.0f + expf(-g)) * u;
}

/* 6. Blocks (row, 256 columns of it): the row's experts in increasing
 * index, weighted, summed from zero; then the gated shared expert. (One
 * block a row took 10 us of a one-token 2048-wide step on an H200: a block
 * walking 8 columns a thread, each a chain of dependent loads.) */
__global__ void combine_kernel(const int32_t *ids, const float *w, const int32_t *pos, const float *y, int32_t k,
                               int64_t H, const float *shared, const float *shared_gate, float *out) {
    __shared__ int32_t order[kMaxTopK];
    const int64_t t = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int32_t j = 0; j < k; j++) {
            int32_t at = j;
            while (at > 0 && ids[t * k + order[at - 1]] > ids[t * k + j]) {
                order[at] = order[at - 1];
                at--;
            }
            order[at] = j;
        }
    }
    __syncthreads();
    const float g = shared ? 1.0f / (1.0f + expf(-shared_gate[t])) : 0.0f;
    for (int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; c < H; c += (int64_t)gridDim.y * blockDim.x) {
        float acc = 0.0f;
        for (int32_t q = 0; q < k; q++) {
            const int32_t j = order[q];
            acc = acc + y[(int64_t)pos[t * k + j] * H + c] * w[t * k + j];
        }
        if (shared) acc = acc + g * shared[t * H + c];
        out[t * H + c] = acc;
    }
}

int dt_code(og_dtype dt) {
    switch (dt) {
    case OG_DTYPE_F32: return 0;
    case OG_DTYPE_BF16: return 1;
    case OG_DTYPE_Q8: return 2;
    case OG_DTYPE_Q4: return 3;
    default: return -1;
    }
}

/* The grouped GEMM switch: -1 until the first call reads OG_CUDA_MOE_GEMM. */
std::atomic<int> g_gemm{-1};

/* Steps 3 and 5 on the CUDA cores, by og_moe_cuda_get_vec's mode where the
 * type, K and alignment allow: 2, grouped_chunk_kernel; 1,
 * grouped_vec_kernel; else grouped_kernel. */
std::atomic<int> g_vec{-1};

template <int DT>
void launch_chunk(const wmat &w, const float *in, const int32_t *src, const scratch_map &m, int64_t listed,
                  int64_t rows, cudaStream_t st, float *out) {
    const dim3 grid((unsigned)((w.N + kWarps * kChunkFeat - 1) / (kWarps * kChunkFeat)), (unsigned)listed);
    /* an expert has at most one pair of each row */
    if (rows <= 1)
        grouped_chunk_kernel<DT, 1><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else if (rows <= 2)
        grouped_chunk_kernel<DT, 2><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else if (rows <= 4)
        grouped_chunk_kernel<DT, 4><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else
        grouped_chunk_kernel<DT, 8><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
}

void grouped_products(const wmat &w, const float *in, const int32_t *src, const scratch_map &m, int64_t listed,
                      int64_t rows, cudaStream_t st, float *out) {
    const int mode = og_moe_cuda_get_vec();
    const bool aligned = w.dt >= 1 && og_cuda::aligned16(w.base) && og_cuda::aligned16(in) && w.bytes % 16 == 0;
    const int kw = w.dt == 1 ? 8 : w.dt == 2 ? 16 : 32;
    if (mode == 2 && aligned && w.K % kw == 0) {
        if (w.dt == 1) launch_chunk<1>(w, in, src, m, listed, rows, st, out);
        else if (w.dt == 2) launch_chunk<2>(w, in, src, m, listed, rows, st, out);
        else launch_chunk<3>(w, in, src, m, listed, rows, st, out);
        return;
    }
    const bool vec = mode >= 1 && aligned && w.K % kVecK == 0;
    const int64_t feat = vec ? kWarps : (int64_t)kWarps * kFeatPerWarp;
    const dim3 grid((unsigned)((w.N + feat - 1) / feat), (unsigned)listed);
    if (vec && w.dt == 1)
        grouped_vec_kernel<1><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else if (vec && w.dt == 2)
        grouped_vec_kernel<2><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else if (vec && w.dt == 3)
        grouped_vec_kernel<3><<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
    else
        grouped_kernel<<<grid, kWarps * 32, 0, st>>>(w, in, src, m.list, m.n_list, m.start, out);
}

} /* namespace */

extern "C" bool og_moe_cuda_get_gemm(void) {
    int v = g_gemm.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("OG_CUDA_MOE_GEMM");
        v = env && !strcmp(env, "0") ? 0 : 1; /* on unless OG_CUDA_MOE_GEMM=0: 27-55x the CUDA cores on an H200 */
        int expect = -1;
        if (!g_gemm.compare_exchange_strong(expect, v)) v = expect; /* another thread read it first */
    }
    return v == 1;
}

extern "C" bool og_moe_cuda_set_gemm(bool on) {
    const bool prev = og_moe_cuda_get_gemm();
    g_gemm.store(on ? 1 : 0);
    return prev;
}

extern "C" int og_moe_cuda_get_vec(void) {
    int v = g_vec.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("OG_CUDA_MOE_VEC");
        v = env && (!strcmp(env, "0") || !strcmp(env, "1")) ? env[0] - '0' : 2;
        int expect = -1;
        if (!g_vec.compare_exchange_strong(expect, v)) v = expect;
    }
    return v;
}

extern "C" int og_moe_cuda_set_vec(int mode) {
    const int prev = og_moe_cuda_get_vec();
    g_vec.store(mode < 0 ? 0 : mode > 2 ? 2 : mode);
    return prev;
}

extern "C" size_t og_moe_cuda_scratch_bytes(int64_t T, int32_t top_k, int64_t E, int64_t H, int64_t F) {
    size_t total = 0;
    scratch_map m;
    return plan(T, top_k, E, H, F, &total, &m, nullptr) ? total : 0;
}

extern "C" og_status og_moe_cuda(void *stream, const og_moe_cuda_args *a, void *scratch) {
    if (!a || !a->x || !a->logits || !a->gate_up || !a->down || !a->out || !scratch)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_cuda: NULL argument");
    if (a->top_k < 1 || a->top_k > a->E || a->top_k > kMaxTopK)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_cuda: top_k %d is outside [1, min(E %lld, %d)]", a->top_k,
                            (long long)a->E, kMaxTopK);
    if (a->shared && !a->shared_gate) return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_cuda: shared without its gate");
    const int gdt = dt_code(a->gate_up_dtype), ddt = dt_code(a->down_dtype);
    if (gdt < 0 || ddt < 0)
        return og_set_error(OG_ERR_UNSUPPORTED, "moe_cuda: expert dtypes %s / %s (f32, bf16, q8, q4)",
                            og_dtype_name(a->gate_up_dtype), og_dtype_name(a->down_dtype));
    if ((gdt >= 2 && a->H % 32) || (ddt >= 2 && a->F % 32))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_cuda: quantized rows must be whole groups of 32");
    if ((size_t)a->E * sizeof(float) > 48 * 1024)
        return og_set_error(OG_ERR_UNSUPPORTED, "moe_cuda: %lld experts: the router keeps E floats in shared memory "
                            "(at most 12288)", (long long)a->E);
    scratch_map m;
    size_t total = 0;
    if (!plan(a->T, a->top_k, a->E, a->H, a->F, &total, &m, static_cast<char *>(scratch)))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_cuda: sizes overflow the scratch");
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t M = a->T * a->top_k, F = a->F, H = a->H;
    route_kernel<<<(unsigned)a->T, kRouteThreads, (size_t)a->E * sizeof(float), st>>>(a->logits, a->E, a->top_k,
                                                                                        a->norm_topk_prob, m.ids, m.w);
    group_kernel<<<1, kGroupThreads, (size_t)a->E * sizeof(int32_t), st>>>(m.ids, M, a->E, m.start, m.list, m.n_list,
                                                                           m.pos, m.row, a->top_k, m.tiles);
    int64_t shape[2] = {2 * F, H}, bytes = 0;
    og_tensor_bytes(a->gate_up_dtype, 2, shape, &bytes);
    const wmat gu = {a->gate_up, gdt, 2 * F, H, (size_t)bytes};
    shape[0] = H;
    shape[1] = F;
    og_tensor_bytes(a->down_dtype, 2, shape, &bytes);
    const wmat dn = {a->down, ddt, H, F, (size_t)bytes};
    const int64_t listed = a->E < M ? a->E : M;
    if (listed > 65535) return og_set_error(OG_ERR_UNSUPPORTED, "moe_cuda: %lld experts in one step", (long long)listed);
    /* the tensor cores for wide steps (bf16 weights, K a multiple of 8, 16-byte rows) */
    const int64_t row_tiles = (M + kMmaBM - 1) / kMmaBM + listed;
    const bool wide = M >= kMmaMinPairs && row_tiles <= 65535 && og_moe_cuda_get_gemm();
    auto on_mma = [&](const wmat &w, const float *in) {
        return wide && w.dt == 1 && w.K % 8 == 0 && og_cuda::aligned16(w.base) && og_cuda::aligned16(in);
    };
    if (on_mma(gu, a->x))
        grouped_mma_kernel<<<dim3((unsigned)((gu.N + kMmaBN - 1) / kMmaBN), (unsigned)row_tiles), kMmaThreads, 0,
                             st>>>(gu.base, gu.bytes, gu.N, gu.K, a->x, m.row, m.start, m.tiles, a->E, m.gu);
    else
        grouped_products(gu, a->x, m.row, m, listed, a->T, st, m.gu);
    swiglu_pairs_kernel<<<(unsigned)((M * F + 255) / 256), 256, 0, st>>>(m.gu, M, F, m.h);
    if (on_mma(dn, m.h))
        grouped_mma_kernel<<<dim3((unsigned)((dn.N + kMmaBN - 1) / kMmaBN), (unsigned)row_tiles), kMmaThreads, 0,
                             st>>>(dn.base, dn.bytes, dn.N, dn.K, m.h, nullptr, m.start, m.tiles, a->E, m.y);
    else
        grouped_products(dn, m.h, nullptr, m, listed, a->T, st, m.y);
    const int64_t col_blocks = (H + 255) / 256 < 65535 ? (H + 255) / 256 : 65535;
    combine_kernel<<<dim3((unsigned)a->T, (unsigned)col_blocks), 256, 0, st>>>(m.ids, m.w, m.pos, m.y, a->top_k, H, a->shared, a->shared_gate,
                                                   a->out);
    return og_cuda::launched("moe_cuda");
}
