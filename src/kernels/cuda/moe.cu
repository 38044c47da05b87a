/* The moe instruction on the GPU (moe_cuda.h): routing, grouping of the
 * (row, expert) pairs by expert on the device, grouped products over a
 * device-side expert list, SwiGLU, and the per-row weighted sum.
 * Letters as moe_cuda.h. */
#include "kernels/cuda/moe_cuda.h"

#include "kernels/cuda/common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

constexpr int kMaxTopK = 64;
constexpr int kRouteThreads = 256;
constexpr int kGroupThreads = 1024;
constexpr int kWarps = 8;         /* warps of a product block */
constexpr int kFeatPerWarp = 4;   /* output features of a warp */
constexpr int kPairChunk = 8;     /* pairs a lane sums at once */

/* Pieces of the scratch, in order (each 16-byte aligned). */
struct scratch_map {
    int32_t *ids;      /* [M] experts of each pair, rank order per row */
    float *w;          /* [M] their weights                             */
    int32_t *pos;      /* [M] each pair's place in the grouped order    */
    int32_t *row;      /* [M] the row of each grouped place             */
    int32_t *start;    /* [E + 1] first grouped place of each expert    */
    int32_t *cursor;   /* [E] placement counters                        */
    int32_t *list;     /* [E] the experts some pair picked, increasing   */
    int32_t *n_list;   /* [1] their number                              */
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
    const size_t sizes[11] = {M * 4, M * 4, M * 4, M * 4, ((size_t)E + 1) * 4, (size_t)E * 4, (size_t)E * 4, 16,
                              M * (size_t)(2 * F) * 4, M * (size_t)F * 4, M * (size_t)H * 4};
    size_t off = 0;
    void **dst[11] = {(void **)&m->ids, (void **)&m->w, (void **)&m->pos, (void **)&m->row, (void **)&m->start,
                      (void **)&m->cursor, (void **)&m->list, (void **)&m->n_list, (void **)&m->gu, (void **)&m->h,
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

/* 1. One block per row: p = softmax(logits), then k rounds of a block
 * arg-max over the experts not yet taken (equal p: the lower index). */
__global__ void route_kernel(const float *logits, int64_t E, int32_t k, bool norm, int32_t *ids, float *w) {
    extern __shared__ float p[]; /* [E] */
    __shared__ float best_v[32];
    __shared__ int32_t best_i[32];
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
    for (int32_t j = 0; j < k; j++) {
        float bv = -1.0f;
        int32_t bi = 0x7fffffff;
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
            if (p[e] < 0.0f) continue; /* taken */
            if (p[e] > bv || (p[e] == bv && e < bi)) bv = p[e], bi = (int32_t)e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if ((threadIdx.x & 31) == 0) best_v[threadIdx.x >> 5] = bv, best_i[threadIdx.x >> 5] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = best_v[0];
            int32_t i = best_i[0];
            for (int q = 1; q < (int)(blockDim.x >> 5); q++)
                if (best_v[q] > v || (best_v[q] == v && best_i[q] < i)) v = best_v[q], i = best_i[q];
            taken[j] = i;
            taken_p[j] = v;
            p[i] = -1.0f;
        }
        __syncthreads();
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
 * list of picked experts in increasing index, and each pair's place. */
__global__ void group_kernel(const int32_t *ids, int64_t M, int64_t E, int32_t *start, int32_t *cursor,
                             int32_t *list, int32_t *n_list, int32_t *pos, int32_t *row, int32_t k) {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) atomicAdd(&cursor[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t acc = 0, n = 0;
        for (int64_t e = 0; e < E; e++) {
            start[e] = acc;
            if (cursor[e] > 0) list[n++] = (int32_t)e;
            acc += cursor[e];
            cursor[e] = start[e];
        }
        start[E] = acc;
        *n_list = n;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        const int32_t at = atomicAdd(&cursor[ids[i]], 1);
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

/* 4. h = silu(gate) * up for every pair: gu [M, 2F] -> h [M, F]. */
__global__ void swiglu_pairs_kernel(const float *gu, int64_t M, int64_t F, float *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * F) return;
    const int64_t q = i / F, c = i % F;
    const float g = gu[q * 2 * F + c], u = gu[q * 2 * F + F + c];
    h[i] = g / (1.0f + expf(-g)) * u;
}

/* 6. One block per row: its experts in increasing index, weighted, summed
 * from zero; then the gated shared expert. */
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
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
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

} /* namespace */

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
    group_kernel<<<1, kGroupThreads, 0, st>>>(m.ids, M, a->E, m.start, m.cursor, m.list, m.n_list, m.pos, m.row,
                                              a->top_k);
    int64_t shape[2] = {2 * F, H}, bytes = 0;
    og_tensor_bytes(a->gate_up_dtype, 2, shape, &bytes);
    const wmat gu = {a->gate_up, gdt, 2 * F, H, (size_t)bytes};
    shape[0] = H;
    shape[1] = F;
    og_tensor_bytes(a->down_dtype, 2, shape, &bytes);
    const wmat dn = {a->down, ddt, H, F, (size_t)bytes};
    const int64_t listed = a->E < M ? a->E : M, feat = (int64_t)kWarps * kFeatPerWarp;
    if (listed > 65535) return og_set_error(OG_ERR_UNSUPPORTED, "moe_cuda: %lld experts in one step", (long long)listed);
    grouped_kernel<<<dim3((unsigned)((2 * F + feat - 1) / feat), (unsigned)listed), kWarps * 32, 0, st>>>(
        gu, a->x, m.row, m.list, m.n_list, m.start, m.gu);
    swiglu_pairs_kernel<<<(unsigned)((M * F + 255) / 256), 256, 0, st>>>(m.gu, M, F, m.h);
    grouped_kernel<<<dim3((unsigned)((H + feat - 1) / feat), (unsigned)listed), kWarps * 32, 0, st>>>(
        dn, m.h, nullptr, m.list, m.n_list, m.start, m.y);
    combine_kernel<<<(unsigned)a->T, 256, 0, st>>>(m.ids, m.w, m.pos, m.y, a->top_k, H, a->shared, a->shared_gate,
                                                   a->out);
    return og_cuda::launched("moe_cuda");
}
