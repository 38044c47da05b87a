/* update_and_attend on CUDA: the contract of DESIGN.md section 2.
 *
 * Letters (as in ops_cuda.h):
 *   T    tokens of the step (query rows)      t   one row, at position p = L + t
 *   Hq   query heads                          Hkv key/value heads, G = Hq / Hkv
 *   D    head dim (a power of two, 8..256)    L   committed length before the step
 *   R    allocated rows (flat capacity, ring slots)   W  ring window
 *   S    splits of a row's visible keys       GM  query heads one block serves (<= 8)
 *
 * Three launches on the stream:
 *   1. kv_write: this step's k, v -> storage rows (flat p, ring p mod R).
 *   2. attend:   grid (T, Hkv x head chunks, most splits). A block reads the
 *      keys and values of one kv head in one split of one row once, for the
 *      GM query heads it serves. Its 128 threads form workers of D/8 lanes;
 *      a worker owns a key at a time (each lane 8 of its D elements, 16-byte
 *      loads), reduces the G dot products across its lanes by shuffles and
 *      keeps an online softmax (max, sum, acc) per query head in registers.
 *      The workers' partials are merged in shared memory by max-rescaling;
 *      a row with one split writes its output, otherwise the block writes a
 *      partial (max, sum, acc) per query head to scratch.
 *   3. merge:    rows with S > 1 merge their S partials by max-rescaling.
 * Scores are kept in the log2 domain (q is pre-scaled by scale * log2 e), so
 * exp2f stands for exp throughout.
 */
#include "kernels/cuda/ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int kThreads = 128; /* threads of an attend block                 */
constexpr int kE = 8;         /* row elements one lane holds (16-byte loads) */
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ inline int32_t max_splits(int32_t T) {
    int32_t s = OG_ATTEND_CUDA_SPLIT_ROWS / T;
    if (s < 1) s = 1;
    return s > OG_ATTEND_CUDA_MAX_SPLITS ? OG_ATTEND_CUDA_MAX_SPLITS : s;
}

/* Splits for a row seeing n >= 1 keys, and the keys per split (*chunk). */
__host__ __device__ inline int32_t splits_for(int64_t n, int32_t T, int64_t *chunk) {
    int64_t s = (n + OG_ATTEND_CUDA_SPLIT_KEYS - 1) / OG_ATTEND_CUDA_SPLIT_KEYS;
    const int64_t cap = max_splits(T);
    if (s > cap) s = cap;
    if (s < 1) s = 1;
    const int64_t c = (n + s - 1) / s;
    *chunk = c;
    return (int32_t)((n + c - 1) / c); /* no split is left empty */
}

__device__ inline void load8(const float *p, float f[kE]) {
    const float4 a = reinterpret_cast<const float4 *>(p)[0];
    const float4 b = reinterpret_cast<const float4 *>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

__device__ inline void load8(const __nv_bfloat16 *p, float f[kE]) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ inline void store(float *p, float x) { *p = x; }
__device__ inline void store(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }

/* Step values every kernel of the launch needs. */
struct attend_params {
    const float *q;     /* [T, Hq, D]  */
    const float *k, *v; /* [T, Hkv, D] */
    float *out;         /* [T, Hq, D]  */
    void *kc, *vc;      /* [R, Hkv, D] storage */
    float *part_acc;    /* [SPLIT_ROWS * Hq, D] */
    float *part_m;      /* [SPLIT_ROWS * Hq]    */
    float *part_l;      /* [SPLIT_ROWS * Hq]    */
    const int64_t *length;
    int64_t L0, R;
    int32_t T, Hq, Hkv, D, G, lanes, chunks, ring, W;
    float scale_log2;
};

__device__ inline int64_t step_length(const attend_params &p) { return p.length ? *p.length : p.L0; }

/* First key a query at position pos sees. */
__device__ inline int64_t first_key(const attend_params &p, int64_t pos) {
    if (!p.ring) return 0;
    const int64_t lo = pos - p.W + 1;
    return lo > 0 ? lo : 0;
}

template <typename KV>
__global__ void kv_write_kernel(attend_params p) {
    const int64_t L = step_length(p);
    const int64_t HD = (int64_t)p.Hkv * p.D;
    const int64_t total = (int64_t)p.T * HD;
    KV *kc = static_cast<KV *>(p.kc), *vc = static_cast<KV *>(p.vc);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / HD, e = i - t * HD;
        const int64_t pos = L + t;
        const int64_t slot = p.ring ? pos % p.R : pos;
        store(kc + slot * HD + e, p.k[i]);
        store(vc + slot * HD + e, p.v[i]);
    }
}

template <typename KV, int GM>
__global__ void __launch_bounds__(kThreads) attend_kernel(attend_params p) {
    const int32_t t = blockIdx.x;
    const int32_t hk = blockIdx.y / p.chunks, chunk_i = blockIdx.y % p.chunks;
    const int32_t h0 = hk * p.G + chunk_i * GM;
    const int32_t g_n = min(GM, p.G - chunk_i * GM);
    const int64_t pos = step_length(p) + t;
    const int64_t lo = first_key(p, pos);
    int64_t chunk;
    const int32_t S = splits_for(pos - lo + 1, p.T, &chunk);
    const int32_t split = blockIdx.z;
    if (split >= S) return; /* the whole block leaves: no barrier is skipped */
    const int64_t k0 = lo + split * chunk;
    const int64_t k1 = min(k0 + chunk, pos + 1);

    const int32_t lanes = p.lanes, D = p.D;
    const int32_t worker = threadIdx.x / lanes, li = threadIdx.x % lanes;
    const int32_t NW = kThreads / lanes;

    float q[GM][kE], m[GM], l[GM], acc[GM][kE];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g < g_n) {
            load8(p.q + ((int64_t)t * p.Hq + h0 + g) * D + li * kE, q[g]);
#pragma unroll
            for (int e = 0; e < kE; e++) q[g][e] *= p.scale_log2;
        } else {
#pragma unroll
            for (int e = 0; e < kE; e++) q[g][e] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] = 0.0f;
    }

    const int64_t row = (int64_t)p.Hkv * D; /* elements between storage rows */
    const KV *kb = static_cast<const KV *>(p.kc) + (int64_t)hk * D + li * kE;
    const KV *vb = static_cast<const KV *>(p.vc) + (int64_t)hk * D + li * kE;
    const int64_t n_it = (k1 - k0 + NW - 1) / NW; /* the same for every thread */
    for (int64_t it = 0; it < n_it; it++) {
        const int64_t j = k0 + it * NW + worker;
        const bool valid = j < k1;
        const int64_t slot = p.ring ? j % p.R : j;
        float kf[kE], vf[kE], s[GM];
        if (valid) {
            load8(kb + slot * row, kf);
            load8(vb + slot * row, vf);
        } else {
#pragma unroll
            for (int e = 0; e < kE; e++) kf[e] = vf[e] = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < kE; e++) d = fmaf(q[g][e], kf[e], d);
            s[g] = d;
        }
        for (int o = lanes / 2; o > 0; o >>= 1) {
#pragma unroll
            for (int g = 0; g < GM; g++) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
        }
        if (valid) {
#pragma unroll
            for (int g = 0; g < GM; g++) {
                const float mn = fmaxf(m[g], s[g]);
                const float c = exp2f(m[g] - mn);
                const float w = exp2f(s[g] - mn);
                l[g] = l[g] * c + w;
#pragma unroll
                for (int e = 0; e < kE; e++) acc[g][e] = fmaf(acc[g][e], c, w * vf[e]);
                m[g] = mn;
            }
        }
    }

    /* merge the workers: [NW, GM] maxima and sums, [NW, GM, D] accumulators */
    extern __shared__ float sm[];
    float *sm_m = sm, *sm_l = sm + NW * GM, *sm_acc = sm + 2 * NW * GM;
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (li == 0) {
            sm_m[worker * GM + g] = m[g];
            sm_l[worker * GM + g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < kE; e++) sm_acc[(worker * GM + g) * D + li * kE + e] = acc[g][e];
    }
    __syncthreads();
    const int32_t maxS = max_splits(p.T);
    for (int32_t idx = threadIdx.x; idx < g_n * D; idx += kThreads) {
        const int32_t g = idx / D, d = idx - g * D;
        float M = -INFINITY;
        for (int32_t w = 0; w < NW; w++) M = fmaxf(M, sm_m[w * GM + g]);
        float sum = 0.0f, a = 0.0f;
        for (int32_t w = 0; w < NW; w++) {
            const float mw = sm_m[w * GM + g];
            if (mw == -INFINITY) continue; /* a worker that saw no key */
            const float f = exp2f(mw - M);
            sum = fmaf(sm_l[w * GM + g], f, sum);
            a = fmaf(sm_acc[(w * GM + g) * D + d], f, a);
        }
        const int32_t h = h0 + g;
        if (S == 1) {
            p.out[((int64_t)t * p.Hq + h) * D + d] = a / sum;
        } else {
            const int64_t pi = ((int64_t)t * maxS + split) * p.Hq + h;
            p.part_acc[pi * D + d] = a;
            if (d == 0) {
                p.part_m[pi] = M;
                p.part_l[pi] = sum;
            }
        }
    }
}

/* grid (T, Hq), D threads: rows with S > 1 merge their partials. */
__global__ void merge_kernel(attend_params p) {
    const int32_t t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int64_t pos = step_length(p) + t;
    int64_t chunk;
    const int32_t S = splits_for(pos - first_key(p, pos) + 1, p.T, &chunk);
    if (S == 1) return;
    const int32_t maxS = max_splits(p.T);
    const int64_t base = (int64_t)t * maxS * p.Hq + h; /* partial of split s: base + s * Hq */
    float M = -INFINITY;
    for (int32_t s = 0; s < S; s++) M = fmaxf(M, p.part_m[base + (int64_t)s * p.Hq]);
    float sum = 0.0f, a = 0.0f;
    for (int32_t s = 0; s < S; s++) {
        const int64_t pi = base + (int64_t)s * p.Hq;
        const float f = exp2f(p.part_m[pi] - M);
        sum = fmaf(p.part_l[pi], f, sum);
        a = fmaf(p.part_acc[pi * p.D + d], f, a);
    }
    p.out[((int64_t)t * p.Hq + h) * p.D + d] = a / sum;
}

template <typename KV>
cudaError_t launch_attend(const attend_params &p, int gm, dim3 grid, cudaStream_t st) {
    const size_t smem = (size_t)(kThreads / p.lanes) * gm * (2 + p.D) * sizeof(float);
    switch (gm) {
    case 1: attend_kernel<KV, 1><<<grid, kThreads, smem, st>>>(p); break;
    case 2: attend_kernel<KV, 2><<<grid, kThreads, smem, st>>>(p); break;
    case 4: attend_kernel<KV, 4><<<grid, kThreads, smem, st>>>(p); break;
    default: attend_kernel<KV, 8><<<grid, kThreads, smem, st>>>(p); break;
    }
    return cudaGetLastError();
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

og_status launch_failed(const char *what, cudaError_t e) {
    return og_set_error(OG_ERR_BACKEND, "update_and_attend_cuda: %s launch: %s (%s)", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

} /* namespace */

extern "C" int32_t og_attend_cuda_max_splits(int32_t T) { return T < 1 ? 1 : max_splits(T); }

extern "C" int64_t og_attend_cuda_scratch_floats(int32_t n_heads, int32_t head_dim) {
    return (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * n_heads * (head_dim + 2);
}

extern "C" int32_t og_attend_cuda_splits(int64_t n, int32_t T) {
    int64_t chunk;
    return n < 1 || T < 1 ? 1 : splits_for(n, T, &chunk);
}

extern "C" og_status og_update_and_attend_cuda(void *stream, const og_attend_cuda_args *a) {
    const char *op = "update_and_attend_cuda";
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
    const og_kv_layer_view *kv = &a->kv;
    if (!a->q || !a->k || !a->v || !a->out)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: q, k, v or out is NULL", op);
    if (!kv->k || !kv->v) return og_set_error(OG_ERR_UNBOUND, "%s: layer %d storage is unbound", op, kv->layer_id);
    if (a->T < 1 || a->n_heads < 1 || kv->n_kv_heads < 1 || a->n_heads % kv->n_kv_heads)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %d, Hq = %d, Hkv = %d (need >= 1 and Hq %% Hkv == 0)", op,
                            a->T, a->n_heads, kv->n_kv_heads);
    const int32_t D = kv->head_dim;
    if (D < 8 || D > 256 || (D & (D - 1)))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d is not a power of two in [8, 256]", op, D);
    if (kv->dtype != OG_DTYPE_BF16 && kv->dtype != OG_DTYPE_F32)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: storage dtype %s (bf16 or f32)", op, og_dtype_name(kv->dtype));
    if (!isfinite(a->scale)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: scale is not finite", op);
    if (kv->length < 0) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: length %lld < 0", op, (long long)kv->length);
    if (kv->policy == OG_KV_FLAT) {
        if (kv->window != 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: flat layer %d with window %d", op, kv->layer_id,
                                kv->window);
        if (kv->length + a->T > kv->rows)
            return og_set_error(OG_ERR_CAPACITY, "%s: flat layer %d: %lld + %d tokens past %lld rows", op,
                                kv->layer_id, (long long)kv->length, a->T, (long long)kv->rows);
    } else if (kv->policy == OG_KV_RING) {
        if (kv->window < 1 || kv->rows < kv->window)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: ring layer %d: window %d, %lld slots", op, kv->layer_id,
                                kv->window, (long long)kv->rows);
        if (a->T > kv->rows - kv->window + 1)
            return og_set_error(OG_ERR_WRITE_TOO_WIDE, "%s: ring layer %d: %d tokens, at most %lld per step", op,
                                kv->layer_id, a->T, (long long)(kv->rows - kv->window + 1));
    } else {
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", op, (int)kv->policy);
    }
    const int32_t maxS = max_splits(a->T);
    if (maxS > 1 && !a->partials) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: partials scratch is NULL", op);
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) || !aligned16(kv->k) ||
        !aligned16(kv->v) || !aligned16(a->partials))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is not 16-byte aligned", op);

    attend_params p;
    p.q = a->q, p.k = a->k, p.v = a->v, p.out = a->out;
    p.kc = kv->k, p.vc = kv->v;
    const int64_t P = (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * a->n_heads;
    p.part_acc = a->partials;
    p.part_m = a->partials ? a->partials + P * D : NULL;
    p.part_l = a->partials ? a->partials + P * (D + 1) : NULL;
    p.length = a->length;
    p.L0 = kv->length, p.R = kv->rows;
    p.T = a->T, p.Hq = a->n_heads, p.Hkv = kv->n_kv_heads, p.D = D;
    p.G = a->n_heads / kv->n_kv_heads;
    p.lanes = D / kE;
    p.ring = kv->policy == OG_KV_RING;
    p.W = kv->window;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = scale * kLog2e;
    const int gm = p.G <= 1 ? 1 : p.G <= 2 ? 2 : p.G <= 4 ? 4 : 8;
    p.chunks = (p.G + gm - 1) / gm;
    if ((int64_t)p.Hkv * p.chunks > 65535)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: %d kv heads x %d head chunks exceed the grid", op, p.Hkv,
                            p.chunks);

    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const bool bf16 = kv->dtype == OG_DTYPE_BF16;
    const int64_t writes = (int64_t)a->T * p.Hkv * D;
    const int wblocks = (int)((writes + 255) / 256 < 4096 ? (writes + 255) / 256 : 4096);
    if (bf16) kv_write_kernel<__nv_bfloat16><<<wblocks, 256, 0, st>>>(p);
    else kv_write_kernel<float><<<wblocks, 256, 0, st>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return launch_failed("kv_write", e);

    const dim3 grid((unsigned)a->T, (unsigned)(p.Hkv * p.chunks), (unsigned)maxS);
    e = bf16 ? launch_attend<__nv_bfloat16>(p, gm, grid, st) : launch_attend<float>(p, gm, grid, st);
    if (e != cudaSuccess) return launch_failed("attend", e);
    if (maxS > 1) {
        merge_kernel<<<dim3((unsigned)a->T, (unsigned)a->n_heads), (unsigned)D, 0, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return launch_failed("merge", e);
    }
    return OG_OK;
}
