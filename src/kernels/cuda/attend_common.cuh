/* What the update_and_attend kernels of src/kernels/cuda share (the contract
 * of DESIGN.md section 2): launch constants, the step's parameters, loads of
 * stored rows (bf16, f32, int8, fp8) and the rounding of this step's rows as
 * storage will hold them, cp.async copies, the storage write of a row's own
 * position, the merge of split-K partials, mma.sync / ldmatrix wrappers, and
 * the launchers each kernel file exports. Internal to src/kernels/cuda.
 *
 * Letters (as in ops_cuda.h):
 *   T    tokens of the step (query rows)      t   one row, at position p = L + t
 *   Hq   query heads                          Hkv key/value heads, G = Hq / Hkv
 *   D    head dim (a power of two, 8..256)    L   committed length before the step
 *   R    allocated rows (flat capacity, ring slots)   W  ring window
 *   S    splits of a row's visible keys       GM  query heads one block serves (<= 8)
 *
 * The kernels, one file each:
 *   attend.cu          split-K on the CUDA cores (decode, and any step over f32
 *                      storage or a head dim the others lack) and the host
 *                      entry points that choose a kernel;
 *   attend_mma.cu      split-K on the tensor cores (decode over bf16 storage);
 *   attend_qmma.cu     split-K on the tensor cores over int8 / fp8 storage;
 *   attend_prefill.cu  the tiled tensor-core kernel (prefill over bf16 storage).
 * Storage rows are RS elements apart (the view's row_stride; Hkv x D when
 * dense): a packed block interleaves other layers' rows, which no kernel
 * touches. int8 and fp8 storage (core/kv_quant.h): a row is Hkv x D quant
 * bytes, then Hkv f32 scales, padded to 16 bytes.
 * Scores are kept in the log2 domain (q is pre-scaled by scale * log2 e), so
 * exp2f stands for exp throughout.
 */
#ifndef OG_KERNELS_CUDA_ATTEND_COMMON_CUH
#define OG_KERNELS_CUDA_ATTEND_COMMON_CUH

#include "kernels/cuda/ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>

extern "C" { /* C headers without a C++ guard of their own */
#include "core/kv_quant.h"
}

namespace og_attend {

constexpr int kThreads = 128; /* threads of an attend block                 */
constexpr int kE = 8;         /* row elements one lane holds (16-byte loads) */
constexpr float kLog2e = 1.4426950408889634f;

constexpr int kWave = 4;          /* attend blocks one SM holds at once (48 KB smem, <= 128 registers each) */
constexpr int kStages = 3;        /* K/V tiles in flight per block                                */
constexpr int kTileBytes = 8192;  /* bytes of a K (or V) tile: 8192 / (D x sizeof(KV)) keys     */
constexpr int kSmem = kStages * 2 * kTileBytes; /* 48 KB: the dynamic limit without an opt-in */
constexpr int kPieces = kTileBytes / 16 / kThreads; /* 16-byte copies per thread per tile */

/* Query heads one block serves for a group of G (the kernel's GM). */
inline int group_heads(int32_t G) { return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8; }

/* Most splits of a row: what the scratch holds for T rows, and no more than
 * fill one wave of kWave blocks per SM over the T x row_blocks (kv head x
 * head chunk) blocks of a split. */
inline int32_t split_cap(int32_t T, int32_t row_blocks, int32_t sm_count) {
    int64_t s = OG_ATTEND_CUDA_SPLIT_ROWS / T;
    if (s > OG_ATTEND_CUDA_MAX_SPLITS) s = OG_ATTEND_CUDA_MAX_SPLITS;
    const int64_t per_split = (int64_t)T * row_blocks;
    const int64_t fill = ((int64_t)kWave * sm_count + per_split - 1) / per_split;
    if (s > fill) s = fill;
    return s < 1 ? 1 : (int32_t)s;
}

/* Splits for a row seeing n >= 1 keys, one per `keys` keys (the launch's
 * split_keys), at most cap, and the keys per split (*chunk). */
__host__ __device__ inline int32_t splits_for(int64_t n, int32_t cap, int32_t keys, int64_t *chunk) {
    int64_t s = (n + keys - 1) / keys;
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

/* One byte of int8 / fp8 storage: the quant alone (its row's scale scales it). */
struct kv_i8 {
    int8_t x;
};
struct kv_e4m3 {
    __nv_fp8_storage_t x;
};
template <typename KV>
struct kv_quant {
    static constexpr bool value = false;
};
template <>
struct kv_quant<kv_i8> {
    static constexpr bool value = true;
};
template <>
struct kv_quant<kv_e4m3> {
    static constexpr bool value = true;
};

/* Elements between dense rows: Hkv x D, or quantized Hkv x (D + 4) bytes
 * padded to 16 (og_kv_dtype_row_bytes). */
template <typename KV>
__host__ __device__ inline int64_t dense_row(int32_t Hkv, int32_t D) {
    constexpr int64_t a = OG_KV_QUANT_ROW_ALIGN;
    return kv_quant<KV>::value ? ((int64_t)Hkv * (D + OG_KV_SCALE_BYTES) + a - 1) / a * a : (int64_t)Hkv * D;
}

/* 8 quants (8 bytes, 8-aligned) as f32, unscaled. */
__device__ inline void load8(const kv_i8 *p, float f[kE]) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = (float)(int8_t)(u.x >> (8 * i));
        f[4 + i] = (float)(int8_t)(u.y >> (8 * i));
    }
}

__device__ inline void load8(const kv_e4m3 *p, float f[kE]) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 4; i++) { /* e4m3 -> f16 -> f32 is exact */
        const __half2_raw h =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const float2 f2 = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        f[2 * i] = f2.x;
        f[2 * i + 1] = f2.y;
    }
}

/* The quant of x / scale as the CPU quantizer (og_kv_quantize_row) takes it:
 * f32 division, int8 clamped to +-127 and rounded to nearest even, e4m3
 * rounded to nearest even and saturated to +-448. */
__device__ inline int8_t quant_i8(float x, float scale) {
    float y = scale > 0.0f ? x / scale : 0.0f;
    y = y > OG_KV_INT8_MAX ? OG_KV_INT8_MAX : y < -OG_KV_INT8_MAX ? -OG_KV_INT8_MAX : y;
    return (int8_t)(y == y ? rintf(y) : 0.0f);
}
__device__ inline __nv_fp8_storage_t quant_e4m3(float x, float scale) {
    const float y = scale > 0.0f ? x / scale : 0.0f;
    return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}
__device__ inline float dequant(kv_i8, float x, float scale) { return (float)quant_i8(x, scale) * scale; }
__device__ inline float dequant(kv_e4m3, float x, float scale) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(quant_e4m3(x, scale), __NV_E4M3);
    return __half2float(*reinterpret_cast<const __half *>(&h)) * scale;
}
__device__ inline float quant_max(kv_i8) { return OG_KV_INT8_MAX; }
__device__ inline float quant_max(kv_e4m3) { return OG_KV_FP8_MAX; }
__device__ inline void store_quant(kv_i8 *p, float x, float scale) { p->x = quant_i8(x, scale); }
__device__ inline void store_quant(kv_e4m3 *p, float x, float scale) { p->x = quant_e4m3(x, scale); }

__device__ inline void store(float *p, float x) { *p = x; }
__device__ inline void store(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }

/* x as storage of type KV holds it. */
__device__ inline float stored(const float *, float x) { return x; }
__device__ inline float stored(const __nv_bfloat16 *, float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* x of a row of this step as storage of type KV will give it back: rounded
 * to bf16, or quantized with the head's scale (amax over the D elements the
 * `lanes` lanes of a worker hold, 8 each) and dequantized. Every lane of the
 * warp takes part (shuffles). */
template <typename KV>
__device__ inline void round_as_stored(float (&f)[kE], int32_t lanes) {
    if constexpr (kv_quant<KV>::value) {
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; e++) amax = fmaxf(amax, fabsf(f[e]));
        for (int o = lanes / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = amax / quant_max(KV{});
#pragma unroll
        for (int e = 0; e < kE; e++) f[e] = dequant(KV{}, f[e], scale);
    } else {
        const KV *as_kv = nullptr; /* selects the rounding of stored() */
#pragma unroll
        for (int e = 0; e < kE; e++) f[e] = stored(as_kv, f[e]);
    }
}

/* Step values every kernel of the launch needs. */
struct attend_params {
    const float *q;     /* [T, Hq, D]  */
    const float *k, *v; /* [T, Hkv, D] */
    float *out;         /* [T, Hq, D]  */
    __nv_bfloat16 *out16; /* [T, Hq, D] out as bf16 too, or NULL (tiled kernel) */
    void *kc, *vc;      /* [R, Hkv, D] storage, rows RS elements apart (single-session launches) */
    const og_attend_cuda_seq *seqs; /* [B] the batched launch's table (row b of q, k, v, out is entry b) */
    unsigned int *counters; /* [SPLIT_ROWS * Hq] finished splits of (t, kv head, head chunk); 0 between steps */
    float *part_acc;    /* [SPLIT_ROWS * Hq, D] */
    float *part_m;      /* [SPLIT_ROWS * Hq]    */
    float *part_l;      /* [SPLIT_ROWS * Hq]    */
    const int64_t *length;
    int64_t L0, R;
    int64_t RS;         /* elements between storage rows (>= Hkv * D) */
    int32_t T, Hq, Hkv, D, G, lanes, chunks, ring, W;
    int32_t gm;         /* query heads one block serves (group_heads(G)); chunks = ceil(G / gm) */
    int32_t max_splits; /* split_cap: the grid's depth */
    int32_t split_keys; /* keys a split takes before another is opened (OG_ATTEND_CUDA_SPLIT_KEYS) */
    float scale_log2;
};

__device__ inline int64_t step_length(const attend_params &p) { return p.length ? *p.length : p.L0; }

/* First key a query at position pos sees. */
__device__ inline int64_t first_key(int32_t ring, int32_t W, int64_t pos) {
    if (!ring) return 0;
    const int64_t lo = pos - W + 1;
    return lo > 0 ? lo : 0;
}
__device__ inline int64_t first_key(const attend_params &p, int64_t pos) { return first_key(p.ring, p.W, pos); }

/* The storage one block reads and writes: a single-session launch's, or one
 * entry of a batched launch's table. */
struct kv_store {
    const unsigned char *k, *v; /* row 0 of the layer */
    int64_t RS;                 /* elements between rows */
    int64_t R;                  /* rows: ring slots (slot = p mod R) */
    int32_t W;                  /* ring window */
};

/* 16 bytes global -> shared without registers (cp.async); fill false
 * writes 16 zero bytes instead of reading src. */
__device__ inline void copy16_async(void *dst, const void *src, bool fill) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(fill ? 16 : 0)
                 : "memory");
}
__device__ inline void copies_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are in flight. */
template <int N>
__device__ inline void copies_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* True when a batched entry's geometry breaks what the planner guarantees
 * (the host cannot look at the table): such an entry is not written and its
 * output rows become NaN. */
template <typename KV>
__device__ inline bool bad_entry(const attend_params &p, const og_attend_cuda_seq &s) {
    const int64_t HD = dense_row<KV>(p.Hkv, p.D); /* a row's own elements */
    const int64_t RS = s.row_stride ? s.row_stride : HD;
    if (s.T != 1 || !s.k || !s.v || s.length < 0 || RS < HD || ((RS * (int64_t)sizeof(KV)) & 15) ||
        (((uintptr_t)s.k | (uintptr_t)s.v) & 15u))
        return true;
    return p.ring ? s.window < 1 || s.rows < s.window : s.window != 0 || s.length >= s.rows;
}

/* Where block (t, ...) of a launch reads and writes: its position, storage
 * and window. BATCH: t is an entry of the table p.seqs (one token at its own
 * length), else a token of one session. */
struct row_geom {
    int64_t L, pos; /* committed length before the step; this row's position */
    kv_store st;
    int32_t W;
};

/* What block_row_status finds for a block. */
enum row_status { kRowGo, kRowPadded, kRowBad };

/* NaN into out rows h0 .. h0 + g_n - 1 of row t (by split 0's block): a bad
 * entry's failure shows. */
__device__ inline void poison_rows(const attend_params &p, int32_t t, int32_t h0, int32_t g_n) {
    if (blockIdx.z == 0)
        for (int32_t i = threadIdx.x; i < g_n * p.D; i += kThreads)
            p.out[((int64_t)t * p.Hq + h0) * p.D + i] = __int_as_float(0x7fc00000);
}

/* Fills g for row t and returns kRowGo, or says why the block has nothing
 * to do: a padded entry, or a bad one (whose out rows the caller poisons).
 * Reads the table and the length alone, which the host writes before the
 * step: nothing an earlier kernel of the stream writes. */
template <typename KV, bool BATCH>
__device__ inline row_status block_row_status(const attend_params &p, int32_t t, row_geom &g) {
    if (BATCH) {
        const og_attend_cuda_seq e = p.seqs[t];
        if (e.T == 0) return kRowPadded; /* nothing read or written */
        if (bad_entry<KV>(p, e)) return kRowBad;
        g.L = e.length, g.pos = g.L;
        g.st.k = static_cast<const unsigned char *>(e.k), g.st.v = static_cast<const unsigned char *>(e.v);
        g.st.RS = e.row_stride ? e.row_stride : dense_row<KV>(p.Hkv, p.D);
        g.st.R = e.rows;
        g.W = e.window;
    } else {
        g.L = step_length(p), g.pos = g.L + t;
        g.st.k = static_cast<const unsigned char *>(p.kc), g.st.v = static_cast<const unsigned char *>(p.vc);
        g.st.RS = p.RS, g.st.R = p.R;
        g.W = p.W;
    }
    return kRowGo;
}

/* Fills g for row t; false when the block has nothing to do (a padded
 * entry, or a bad one, whose out rows h0 .. h0 + g_n - 1 it poisons). */
template <typename KV, bool BATCH>
__device__ inline bool block_row(const attend_params &p, int32_t t, int32_t h0, int32_t g_n, row_geom &g) {
    const row_status s = block_row_status<KV, BATCH>(p, t, g);
    if (s == kRowBad) poison_rows(p, t, h0, g_n);
    return s == kRowGo;
}

/* The block holding a row's own position stores the row's k, v of kv head
 * hk (t: the row of k, v). Every thread of the block calls it (int8 / fp8:
 * warps 0 and 1 write). */
template <typename KV>
__device__ inline void write_own_row(const attend_params &p, const kv_store &st, int64_t pos, int32_t t, int32_t hk) {
    const int32_t D = p.D;
    const int64_t slot = p.ring ? pos % st.R : pos;
    KV *kc = reinterpret_cast<KV *>(const_cast<unsigned char *>(st.k)) + slot * st.RS + (int64_t)hk * D;
    KV *vc = reinterpret_cast<KV *>(const_cast<unsigned char *>(st.v)) + slot * st.RS + (int64_t)hk * D;
    const int64_t src = ((int64_t)t * p.Hkv + hk) * D;
    if constexpr (kv_quant<KV>::value) {
        /* warp 0 writes the k row, warp 1 the v row; the head's amax by lane
         * shuffles (a maximum is exact in any order: the CPU's scale) */
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp < 2) {
            const float *x = (warp ? p.v : p.k) + src;
            KV *dst = warp ? vc : kc;
            float a = 0.0f;
            for (int32_t d = lane; d < D; d += 32) a = fmaxf(a, fabsf(x[d]));
            for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
            const float scale = a / quant_max(KV{});
            for (int32_t d = lane; d < D; d += 32) store_quant(dst + d, x[d], scale);
            if (lane == 0) { /* the scale behind the row's Hkv x D quants */
                unsigned char *r = const_cast<unsigned char *>(warp ? st.v : st.k) + slot * st.RS;
                *reinterpret_cast<float *>(r + (int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES) = scale;
                if (hk == p.Hkv - 1) /* the last head's block zeroes the padding, as the CPU writes it */
                    for (int64_t b = (int64_t)p.Hkv * (D + OG_KV_SCALE_BYTES); b < dense_row<KV>(p.Hkv, D); b++)
                        r[b] = 0;
            }
        }
    } else {
        for (int32_t d = threadIdx.x; d < D; d += kThreads) {
            store(kc + d, p.k[src + d]);
            store(vc + d, p.v[src + d]);
        }
    }
}

/* Steps 3 and 4 of a split-K block, after its NW workers left their
 * partials in shared memory (sm: [NW, GM] maxima, [NW, GM] sums, [NW, GM, D]
 * accumulators; a worker that saw no key has maximum -inf): merges them, and
 * writes the output (S == 1) or the block's partial; the last of the S
 * blocks of (t, kv head, head chunk) merges the S partials into out. */
template <int GM>
__device__ inline void finish_split(const attend_params &p, float *sm, int32_t NW, int32_t g_n, int32_t h0,
                                    int32_t t, int32_t S, int32_t split) {
    const int32_t D = p.D;
    float *sm_m = sm, *sm_l = sm + NW * GM, *sm_acc = sm + 2 * NW * GM;
    const int32_t maxS = p.max_splits;
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
    if (S == 1) return;

    /* 4. the last of the S blocks of (t, kv head, head chunk) to finish merges
     * the S partials by max-rescaling, and sets the counter back to 0 for the
     * next step. Each block's partial writes are fenced before it counts. */
    __threadfence();
    __syncthreads();
    unsigned int *counter = p.counters + (int64_t)t * gridDim.y + blockIdx.y;
    const bool last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(counter, 1u) == (unsigned)(S - 1));
    if (!last) return;
    __threadfence(); /* the other blocks' partials are read after their count */
    if (threadIdx.x == 0) *counter = 0u;
    float *sm_w = sm;               /* [GM, maxS] maxima, then weights exp2(m_s - M) / sum */
    float *sm_s = sm + GM * maxS;   /* [GM, maxS] sums */
    const int64_t base = (int64_t)t * maxS * p.Hq + h0; /* partial of split s, head h0 + g: base + s * Hq + g */
    for (int32_t idx = threadIdx.x; idx < g_n * S; idx += kThreads) {
        const int32_t g = idx / S, s = idx - g * S;
        sm_w[g * maxS + s] = __ldcg(p.part_m + base + (int64_t)s * p.Hq + g);
        sm_s[g * maxS + s] = __ldcg(p.part_l + base + (int64_t)s * p.Hq + g);
    }
    __syncthreads();
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int32_t g = warp; g < g_n; g += kThreads / 32) { /* a warp per head */
        float M = -INFINITY;
        for (int32_t s = lane; s < S; s += 32) M = fmaxf(M, sm_w[g * maxS + s]);
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float sum = 0.0f;
        for (int32_t s = lane; s < S; s += 32) sum = fmaf(sm_s[g * maxS + s], exp2f(sm_w[g * maxS + s] - M), sum);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (int32_t s = lane; s < S; s += 32) sm_w[g * maxS + s] = exp2f(sm_w[g * maxS + s] - M) / sum;
    }
    __syncthreads();
    const int32_t D4 = D / 4;
    for (int32_t idx = threadIdx.x; idx < g_n * D4; idx += kThreads) {
        const int32_t g = idx / D4, d4 = idx - g * D4;
        const float4 *src = reinterpret_cast<const float4 *>(p.part_acc + (base + g) * D) + d4;
        const int64_t stride = (int64_t)p.Hq * D4; /* float4s between splits */
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int32_t s = 0; s < S; s++) {
            const float f = sm_w[g * maxS + s];
            const float4 x = __ldcg(src + s * stride);
            a.x = fmaf(x.x, f, a.x), a.y = fmaf(x.y, f, a.y), a.z = fmaf(x.z, f, a.z), a.w = fmaf(x.w, f, a.w);
        }
        reinterpret_cast<float4 *>(p.out + ((int64_t)t * p.Hq + h0 + g) * D)[d4] = a;
    }
}

/* ---- mma.sync and ldmatrix (the tensor-core kernels) ---- */

/* What the tile loads of one block of the tensor-core split-K kernels need: keys are
 * counted from k0, the block's first key (32-bit: a split holds fewer than
 * 2^31 keys). */
struct mma_keys {
    const unsigned char *kb, *vb; /* head hk of storage row 0 */
    const float *knew, *vnew;     /* head hk of the row of k, v holding position L */
    int64_t k0;                   /* the first key of the split */
    int64_t row_bytes;            /* bytes between storage rows */
    int64_t R;                    /* ring slots (slot = key mod R) */
    int32_t n_stored;             /* keys k0 .. k0 + n_stored - 1 are in storage (< L) */
    int32_t n;                    /* keys of the split: k0 .. k0 + n - 1 */
    int32_t row;                  /* floats between rows of k, v */
    int32_t ring;
    int32_t scale_rel;            /* int8 / fp8: bytes from a row's head hk quants to its f32 k (v) scale */
};

/* 4 bytes global -> shared (cp.async); fill false writes zeros. */
__device__ inline void copy4_async(void *dst, const void *src, bool fill) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(fill ? 4 : 0) : "memory");
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi); /* lo in the low half */
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* c += a b: a 16x16 bf16 (row), b 16x8 bf16 (col), c 16x8 f32. Fragments
 * of lane (g = lane / 4, i = lane % 4): a = rows g, g+8 x cols 2i, 2i+1,
 * 2i+8, 2i+9; b = rows 2i, 2i+1, 2i+8, 2i+9 x col g; c = rows g, g+8 x
 * cols 2i, 2i+1. */
__device__ inline void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 b16 matrices from shared memory: lanes 8m .. 8m+7 give the
 * addresses of rows 0..7 of matrix m (16 bytes each); r[m] is this lane's
 * fragment of matrix m: row lane / 4, cols 2 (lane % 4), +1 (or, TRANS,
 * col lane / 4 of rows 2 (lane % 4), +1). */
template <bool TRANS>
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
}

/* Lets kernel take smem bytes of dynamic shared memory past the default
 * limit of 48 KB: once per device (devices 0..63; done holds the kernel's
 * bits, one static per kernel) and every call on a device past 63. */
template <typename K>
cudaError_t allow_smem(K *kernel, int smem, int dev, std::atomic<unsigned long long> &done) {
    if (smem <= 48 * 1024) return cudaSuccess;
    const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) done.fetch_or(bit);
    return e;
}

/* ---- launchers of the kernel files (errors: cudaGetLastError's) ---- */

/* attend_prefill.cu: this step's k, v rows -> bf16 storage (before the tiled kernel). */
cudaError_t launch_kv_write(const attend_params &p, cudaStream_t st);
/* attend_prefill.cu: the tiled kernel over bf16 storage, D 16 / 32 / 64 / 128. */
cudaError_t launch_tiled(const attend_params &p, cudaStream_t st, int dev);
/* attend_mma.cu: split-K on the tensor cores over storage of dt
 * (og_attend_cuda_decode_mma holds) on grid; batch: a batched launch (the
 * table p.seqs); dev: the current device (shared memory past 48 KB is
 * allowed once per device). */
cudaError_t launch_mma(const attend_params &p, og_dtype dt, dim3 grid, cudaStream_t st, int dev, bool batch);
/* attend_qmma.cu: split-K on the tensor cores over int8 / fp8 storage of dt
 * (D 64 or 128; arguments as launch_mma). */
cudaError_t launch_qmma(const attend_params &p, og_dtype dt, dim3 grid, cudaStream_t st, int dev, bool batch);

} /* namespace og_attend */

#endif /* OG_KERNELS_CUDA_ATTEND_COMMON_CUH */
