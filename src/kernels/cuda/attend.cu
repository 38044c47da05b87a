/* update_and_attend on CUDA: the contract of DESIGN.md section 2.
 *
 * Letters (as in ops_cuda.h):
 *   T    tokens of the step (query rows)      t   one row, at position p = L + t
 *   Hq   query heads                          Hkv key/value heads, G = Hq / Hkv
 *   D    head dim (a power of two, 8..256)    L   committed length before the step
 *   R    allocated rows (flat capacity, ring slots)   W  ring window
 *   S    splits of a row's visible keys       GM  query heads one block serves (<= 8)
 *
 * Two paths:
 *   split-K (decode, and any step over f32 storage or a head dim the tiled
 *   kernel lacks), one launch, grid (T, Hkv x head chunks, most splits).
 *   A block reads the keys and values of one kv head in one split of one
 *   row once, for the GM query heads it serves. Stored keys come through a
 *   pipeline of kStages tiles in shared memory (cp.async: each thread has
 *   8 16-byte copies per tile in flight, two tiles ahead of the one being
 *   consumed). Its 128 threads form workers of D/8 lanes; a worker takes
 *   8 / sizeof(KV) keys of each tile (each lane 8 of its D elements), reduces
 *   the dot products across its lanes by shuffles and keeps an online
 *   softmax (max, sum, acc) per query head in registers. Keys of this step
 *   (positions >= L) are read from k, v themselves (rounded as storage
 *   rounds them), and the block holding a row's own position writes that
 *   row's k, v to storage: no separate write launch, and no block reads a
 *   row another block writes. The workers' partials are merged in shared
 *   memory by max-rescaling; a row with one split writes its output,
 *   otherwise the block writes a partial (max, sum, acc) per query head to
 *   scratch and counts itself done; the last of the S blocks merges the S
 *   partials and sets the counter back to 0.
 *   tiled (prefill, T > 1, bf16 storage, D in 16..128), two launches:
 *   1. kv_write: this step's k, v -> storage rows (flat p, ring p mod R).
 *   2. tiled attend on the tensor cores (mma.sync m16n8k16 bf16, f32
 *      accumulation), flash-attention style: grid (query tiles, Hkv). The
 *      T x G query rows of one kv head (row r = token r / G, head r % G of
 *      the group) are cut into tiles of 64, 16 per warp, so the G heads of a
 *      group share every K/V tile load. Per 64-key tile: S = Q K^T with q
 *      split into bf16 hi + lo (q keeps ~2^-16 of its precision; k is exact
 *      bf16), causal / window mask, online softmax in f32 on the registers
 *      of the accumulators (the mask only on tiles at the edge of a lane's
 *      rows), then P (rounded to bf16) x V into f32 O.
 *      The row sums use the unrounded p, so each output is off by at most
 *      2^-8 max|v| from the exact mix of its values (bf16 rounds by up to 2^-8).
 *      Tiles come in two stages by cp.async (tile i + 1 is copied while tile
 *      i is used), the mma operands by ldmatrix (K as stored, V transposed).
 *      A block's 4 warps alone keep an SM busy: splitting a step's keys over
 *      more blocks (partials merged after) measured no faster at 4096 tokens
 *      and 5 % faster at 32768, not worth its merge launch and scratch.
 *   split-K on the tensor cores (mma_attend_kernel; bf16 storage, D 64 or
 *   128; the default, OG_CUDA_ATTEND=simt or og_attend_cuda_set_decode
 *   select the CUDA-core kernel instead): the
 *   split-K kernel's grid, splits, partials, merge and storage write, with
 *   a block's gm <= 8 query heads as the M rows of mma.sync: row g holds
 *   head g's q as bf16 hi, row g + 8 its bf16 lo, so one m16n8k16 gives both
 *   halves of every score; the 4 warps each take a quarter of every tile's
 *   keys (ldmatrix from a swizzled tile), and P V runs per 8 keys with
 *   m16n8k8, P's rows g and g + 8 again hi and lo. q and p both keep ~2^-16
 *   of their precision. The step's own keys are written into the tiles
 *   (rounded to bf16 as stored), so every key takes the same path. int8 /
 *   fp8 storage (kMmaQuant): stages of quants and scales (half the bytes of
 *   a bf16 stage), widened to bf16 tiles after each tile's barrier (the
 *   quants are bf16 values), scales folded into score and weight as the
 *   CUDA-core kernel folds them.
 * Storage rows are RS elements apart (the view's row_stride; Hkv x D when
 * dense): a packed block interleaves other layers' rows, which no kernel
 * touches. RS is a runtime value in every path, as Hkv x D was before.
 * batched decode (og_update_and_attend_batch_cuda): the split-K kernel with
 *   blockIdx.x an entry b of a device table (og_attend_cuda_seq) instead of
 *   a token: the block reads its entry's storage bases, row stride, length,
 *   rows and window when it starts, so a graph captured once per batch size
 *   follows whatever the host wrote to the table before the replay. Grid
 *   (B, Hkv x head chunks, depth): depth is the most splits any entry may
 *   use (from max_keys, capped where B x row blocks fill one wave of kWave
 *   blocks per SM); each entry splits its own live keys (splits_for) and
 *   blocks past its split count, and every block of a padded entry (T = 0),
 *   leave at once. Split counters and partials are indexed by entry as they
 *   are by token in a single-session launch.
 * int8 and fp8 storage (attend_quant.h: a row is Hkv x D quant bytes, then
 *   Hkv f32 scales) runs the split-K kernel, prefill included: tiles carry
 *   the quants (D bytes a key), a worker reads its keys' k and v scales
 *   from the row tails in global memory (one word per key, L2-resident)
 *   and folds them into the score (q . k_quant x k scale) and the weight of
 *   the value (p x v scale); a worker's 8 keys of a tile go 4 at a time
 *   (8 scores per head beside q and acc of 4 heads would spill). The step's own keys are rounded as the row
 *   write rounds them (amax over the head by shuffles across the worker's
 *   lanes), and the row is written with the same f32 divisions and round-
 *   to-nearest-even conversions (rintf, __nv_cvt_float_to_fp8 satfinite) as
 *   the CPU quantizer, so the bytes stored match the CPU's.
 * Scores are kept in the log2 domain (q is pre-scaled by scale * log2 e), so
 * exp2f stands for exp throughout.
 */
#include "kernels/cuda/ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

extern "C" { /* C headers without a C++ guard of their own */
#include "kernels/attend_quant.h"
}

namespace {

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
int32_t split_cap(int32_t T, int32_t row_blocks, int32_t sm_count) {
    int64_t s = OG_ATTEND_CUDA_SPLIT_ROWS / T;
    if (s > OG_ATTEND_CUDA_MAX_SPLITS) s = OG_ATTEND_CUDA_MAX_SPLITS;
    const int64_t per_split = (int64_t)T * row_blocks;
    const int64_t fill = ((int64_t)kWave * sm_count + per_split - 1) / per_split;
    if (s > fill) s = fill;
    return s < 1 ? 1 : (int32_t)s;
}

/* Splits for a row seeing n >= 1 keys, at most cap, and the keys per split (*chunk). */
__host__ __device__ inline int32_t splits_for(int64_t n, int32_t cap, int64_t *chunk) {
    int64_t s = (n + OG_ATTEND_CUDA_SPLIT_KEYS - 1) / OG_ATTEND_CUDA_SPLIT_KEYS;
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
        store(kc + slot * p.RS + e, p.k[i]);
        store(vc + slot * p.RS + e, p.v[i]);
    }
}

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

/* Starts copying the storage rows of keys j0 .. j0 + KT - 1 of kv head hk
 * into a K tile and a V tile ([KT, D] of KV each, KT = kTileBytes / (D x
 * sizeof(KV))); rows of keys at or past `end` are zero-filled. */
template <typename KV>
__device__ inline void tile_load(const attend_params &p, const kv_store &st, int32_t hk, int64_t j0, int64_t end,
                                 unsigned char *kt, unsigned char *vt) {
    const int32_t piece_shift = __ffs(p.D * (int)sizeof(KV) / 16) - 1; /* log2 of the 16-byte pieces of a row */
    const int64_t row_bytes = st.RS * (int64_t)sizeof(KV);
    const unsigned char *kb = st.k + (int64_t)hk * p.D * (int64_t)sizeof(KV);
    const unsigned char *vb = st.v + (int64_t)hk * p.D * (int64_t)sizeof(KV);
#pragma unroll
    for (int i = 0; i < kPieces; i++) {
        const int c = threadIdx.x + i * kThreads; /* piece c: row c >> shift, 16 bytes at (c & mask) * 16 */
        const int64_t j = j0 + (c >> piece_shift);
        const bool ok = j < end;
        const int64_t slot = ok ? (p.ring ? j % st.R : j) : 0;
        const int64_t off = slot * row_bytes + (int64_t)(c & ((1 << piece_shift) - 1)) * 16;
        copy16_async(kt + c * 16, kb + off, ok);
        copy16_async(vt + c * 16, vb + off, ok);
    }
}

/* Sums every score across the lanes of its worker. */
template <int NK, int GM>
__device__ inline void lane_sum(float (&s)[NK][GM], int32_t lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < NK; u++)
#pragma unroll
            for (int g = 0; g < GM; g++) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], o);
    }
}

/* Folds NK scores per query head (log2 domain, -inf where there is no key)
 * into the running maximum m and sum l, rescales acc, and turns the scores
 * into the weights of their values. */
template <int NK, int GM>
__device__ inline void softmax_step(float (&s)[NK][GM], float (&m)[GM], float (&l)[GM], float (&acc)[GM][kE]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        float mx = m[g];
#pragma unroll
        for (int u = 0; u < NK; u++) mx = fmaxf(mx, s[u][g]);
        const float base = mx == -INFINITY ? 0.0f : mx; /* no key yet: every weight is exp2(-inf) = 0 */
        const float c = exp2f(m[g] - base);
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < NK; u++) {
            s[u][g] = exp2f(s[u][g] - base);
            sum += s[u][g];
        }
        l[g] = fmaf(l[g], c, sum);
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] *= c;
        m[g] = mx;
    }
}

template <int GM>
__device__ inline void dot_heads(const float (&q)[GM][kE], const float (&kf)[kE], float (&s)[GM]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; e++) d = fmaf(q[g][e], kf[e], d);
        s[g] = d;
    }
}

template <int GM>
__device__ inline void add_values(const float (&w)[GM], const float (&vf)[kE], float (&acc)[GM][kE]) {
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] = fmaf(w[g], vf[e], acc[g][e]);
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

/* Fills g for row t; false when the block has nothing to do (a padded
 * entry, or a bad one, whose out rows h0 .. h0 + g_n - 1 it poisons). */
template <typename KV, bool BATCH>
__device__ inline bool block_row(const attend_params &p, int32_t t, int32_t h0, int32_t g_n, row_geom &g) {
    if (BATCH) {
        const og_attend_cuda_seq e = p.seqs[t];
        if (e.T == 0) return false; /* a padded entry: nothing read or written */
        if (bad_entry<KV>(p, e)) {
            if (blockIdx.z == 0)
                for (int32_t i = threadIdx.x; i < g_n * p.D; i += kThreads)
                    p.out[((int64_t)t * p.Hq + h0) * p.D + i] = __int_as_float(0x7fc00000);
            return false;
        }
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
    return true;
}

/* The block holding a row's own position stores the row's k, v of kv head
 * hk (t: the row of k, v). */
template <typename KV>
__device__ inline void write_own_row(const attend_params &p, const kv_store &st, int64_t pos, int32_t t, int32_t hk) {
    const int32_t D = p.D;
    const int64_t slot = p.ring ? pos % st.R : pos;
    KV *kc = reinterpret_cast<KV *>(const_cast<unsigned char *>(st.k)) + slot * st.RS + (int64_t)hk * D;
    KV *vc = reinterpret_cast<KV *>(const_cast<unsigned char *>(st.v)) + slot * st.RS + (int64_t)hk * D;
    const int64_t src = ((int64_t)t * p.Hkv + hk) * D;
    if constexpr (kv_quant<KV>::value) {
        /* every thread takes the head's amax (D loads, L1-resident) */
        float ka = 0.0f, va = 0.0f;
        for (int32_t d = 0; d < D; d++) {
            ka = fmaxf(ka, fabsf(p.k[src + d]));
            va = fmaxf(va, fabsf(p.v[src + d]));
        }
        const float kscale = ka / quant_max(KV{}), vscale = va / quant_max(KV{});
        for (int32_t d = threadIdx.x; d < D; d += kThreads) {
            store_quant(kc + d, p.k[src + d], kscale);
            store_quant(vc + d, p.v[src + d], vscale);
        }
        if (threadIdx.x == 0) { /* the scales behind the row's Hkv x D quants */
            unsigned char *kr = const_cast<unsigned char *>(st.k) + slot * st.RS;
            unsigned char *vr = const_cast<unsigned char *>(st.v) + slot * st.RS;
            const int64_t tail = (int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES;
            *reinterpret_cast<float *>(kr + tail) = kscale;
            *reinterpret_cast<float *>(vr + tail) = vscale;
            if (hk == p.Hkv - 1) /* the last head's block zeroes the padding, as the CPU writes it */
                for (int64_t b = (int64_t)p.Hkv * (D + OG_KV_SCALE_BYTES); b < dense_row<KV>(p.Hkv, D); b++)
                    kr[b] = vr[b] = 0;
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

/* GM 8 holds twice the registers (q and acc of 8 heads): it runs half as many
 * blocks per SM rather than spill. BATCH: blockIdx.x is an entry of the
 * table p.seqs (one token at its own length), else a token of one session. */
template <typename KV, int GM, bool BATCH>
__global__ void __launch_bounds__(kThreads, GM > 4 ? kWave / 2 : kWave) attend_kernel(attend_params p) {
    constexpr int KPW = 8 / (int)sizeof(KV); /* keys of a tile per worker: KT / NW = 8 / sizeof(KV) */
    const int32_t hk = blockIdx.y / p.chunks, chunk_i = blockIdx.y % p.chunks;
    const int32_t h0 = hk * p.G + chunk_i * GM;
    const int32_t g_n = min(GM, p.G - chunk_i * GM);
    /* t: the row of q, k, v, out (and of the split counters and partials);
     * the step's keys of this row's session start at row t - (pos - L) */
    const int32_t t = blockIdx.x;
    row_geom rg;
    if (!block_row<KV, BATCH>(p, t, h0, g_n, rg)) return;
    const int64_t L = rg.L, pos = rg.pos;
    const kv_store &st = rg.st;
    const int32_t W = rg.W;
    const int64_t lo = first_key(p.ring, W, pos);
    int64_t chunk;
    const int32_t S = splits_for(pos - lo + 1, p.max_splits, &chunk);
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

    /* 1. stored keys k0 .. ks-1 through a pipeline of kStages K/V tiles:
     * tile i lands in buffer i % kStages while tiles i+1, i+2 are in flight. */
    extern __shared__ __align__(16) unsigned char smem[];
    const int32_t KT = kTileBytes / (D * (int32_t)sizeof(KV));
    const int64_t ks = min(k1, L);
    const int64_t n_tiles = ks > k0 ? (ks - k0 + KT - 1) / KT : 0;
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) {
        if (i < n_tiles) tile_load<KV>(p, st, hk, k0 + (int64_t)i * KT, ks, smem + 2 * i * kTileBytes,
                                       smem + (2 * i + 1) * kTileBytes);
        copies_commit(); /* an empty group where there is no tile keeps the count per tile */
    }
    for (int64_t i = 0; i < n_tiles; i++) {
        copies_wait<kStages - 2>(); /* this thread's pieces of tile i are in */
        __syncthreads();            /* everyone's are, and tile i - 1 is consumed */
        const int64_t next = i + kStages - 1;
        if (next < n_tiles) {
            const int b = (int)(next % kStages);
            tile_load<KV>(p, st, hk, k0 + next * KT, ks, smem + 2 * b * kTileBytes, smem + (2 * b + 1) * kTileBytes);
        }
        copies_commit();
        const int b = (int)(i % kStages);
        const KV *kt = reinterpret_cast<const KV *>(smem + 2 * b * kTileBytes) + li * kE;
        const KV *vt = reinterpret_cast<const KV *>(smem + (2 * b + 1) * kTileBytes) + li * kE;
        const int64_t j0 = k0 + i * KT;
        /* the worker's KPW keys of the tile, KH at a time: one byte a quant
         * makes KPW 8, and scores of 8 keys beside q and acc of 4 heads
         * would spill at GM 4; halves cost one more rescale of acc */
        constexpr int KH = KPW > 4 ? 4 : KPW;
#pragma unroll
        for (int h0 = 0; h0 < KPW; h0 += KH) {
            float s[KH][GM];
            float ksc[KH], vsc[KH]; /* quantized storage: the keys' k and v scales of head hk (not in the tiles) */
            if constexpr (kv_quant<KV>::value) {
                const int64_t tail = (int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES; /* bytes into a row */
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    const int64_t j = j0 + worker + (h0 + u) * NW;
                    ksc[u] = vsc[u] = 0.0f;
                    if (j < ks) {
                        const int64_t at = (p.ring ? j % st.R : j) * st.RS + tail;
                        ksc[u] = *reinterpret_cast<const float *>(st.k + at);
                        vsc[u] = *reinterpret_cast<const float *>(st.v + at);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < KH; u++) {
                float kf[kE];
                load8(kt + (int64_t)(worker + (h0 + u) * NW) * D, kf);
                dot_heads<GM>(q, kf, s[u]);
            }
            lane_sum<KH, GM>(s, lanes);
#pragma unroll
            for (int u = 0; u < KH; u++) {
                if (j0 + worker + (h0 + u) * NW >= ks) {
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] = -INFINITY;
                } else if constexpr (kv_quant<KV>::value) { /* q . (k quants) x k scale */
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] *= ksc[u];
                }
            }
            softmax_step<KH, GM>(s, m, l, acc);
#pragma unroll
            for (int u = 0; u < KH; u++) { /* rows past ks are zeros with weight 0 */
                float vf[kE];
                load8(vt + (int64_t)(worker + (h0 + u) * NW) * D, vf);
                if constexpr (kv_quant<KV>::value) { /* the weight times the v scale: p x (v quants x v scale) */
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] *= vsc[u];
                }
                add_values<GM>(s[u], vf, acc);
            }
        }
    }
    copies_wait<0>();

    /* 2. keys of this step (positions >= L): from k, v as storage will hold them */
    const int64_t row = (int64_t)p.Hkv * D; /* elements between rows of k, v */
    const int64_t kn0 = max(k0, L);
    const int64_t row0 = t - (pos - L);      /* the row of k, v holding position L */
    const float *knew = p.k + row0 * row + (int64_t)hk * D + li * kE;
    const float *vnew = p.v + row0 * row + (int64_t)hk * D + li * kE;
    for (int64_t j_base = kn0; j_base < k1; j_base += NW) { /* the same trip count for every thread */
        const int64_t j = j_base + worker;
        const bool valid = j < k1;
        float kf[kE], vf[kE], s[1][GM];
        if (valid) {
            load8(knew + (j - L) * row, kf);
            load8(vnew + (j - L) * row, vf);
        } else {
#pragma unroll
            for (int e = 0; e < kE; e++) kf[e] = vf[e] = 0.0f;
        }
        round_as_stored<KV>(kf, lanes);
        round_as_stored<KV>(vf, lanes);
        dot_heads<GM>(q, kf, s[0]);
        lane_sum<1, GM>(s, lanes);
        if (!valid) {
#pragma unroll
            for (int g = 0; g < GM; g++) s[0][g] = -INFINITY;
        }
        softmax_step<1, GM>(s, m, l, acc);
        add_values<GM>(s[0], vf, acc);
    }

    /* the block holding the row's own position stores its k, v */
    if (split == S - 1 && chunk_i == 0) write_own_row<KV>(p, st, pos, t, hk);

    /* 3. merge the workers in shared memory (the tiles are consumed):
     * [NW, GM] maxima and sums, [NW, GM, D] accumulators */
    __syncthreads();
    float *sm = reinterpret_cast<float *>(smem);
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
    finish_split<GM>(p, sm, NW, g_n, h0, t, S, split);
}

/* ---- the tiled tensor-core kernel (prefill over bf16 storage) ---- */

constexpr int kTileRows = 64; /* query rows of a block: 16 per warp */
constexpr int kTileKeys = 64; /* keys of a K/V tile                */

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

/* Starts copying the storage rows of keys j0 .. j0 + 63 of a kv head (kc,
 * vc: its first element in row 0) into a K and a V tile of tiled_attend_kernel
 * ([64 keys, D + 8] bf16: the padding keeps the 8 rows an ldmatrix reads in
 * different banks), one commit group; keys past j_hi are zero-filled. */
template <int D>
__device__ inline void tiled_load(const attend_params &p, const uint16_t *kc, const uint16_t *vc, int64_t j0,
                                  int64_t j_hi, uint16_t *ks, uint16_t *vs) {
    constexpr int LD = D + 8, CH = D / 8; /* 16-byte pieces of a key row */
    constexpr int N = kTileKeys * CH / kThreads;
    static_assert(N >= 1 && kTileKeys * CH % kThreads == 0, "whole pieces for every thread");
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int c = threadIdx.x + i * kThreads, kr = c / CH, cc = c % CH;
        const int64_t j = j0 + kr;
        const bool ok = j <= j_hi; /* zeros past j_hi: 0 x p stays 0 */
        const int64_t slot = ok ? (p.ring ? j % p.R : j) : 0;
        copy16_async(ks + kr * LD + cc * 8, kc + slot * p.RS + cc * 8, ok);
        copy16_async(vs + kr * LD + cc * 8, vc + slot * p.RS + cc * 8, ok);
    }
    copies_commit();
}

/* Dynamic shared memory of tiled_attend_kernel<D>: two stages of a K and a V tile. */
constexpr int tiled_smem_bytes(int D) { return 2 * 2 * kTileKeys * (D + 8) * 2; }

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

template <int D>
__global__ void __launch_bounds__(kThreads) tiled_attend_kernel(attend_params p) {
    constexpr int KC = D / 16;        /* k chunks of q . k         */
    constexpr int ND = D / 8;         /* n tiles of the output     */
    constexpr int NS = kTileKeys / 8; /* n tiles of a score tile   */
    constexpr int LD = D + 8;         /* padded smem row: no bank conflicts on fragment loads */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, ti = lane & 3;
    const int32_t hk = blockIdx.y;
    const int64_t L = step_length(p);
    const int64_t rows = (int64_t)p.T * p.G; /* query rows of this kv head */
    const int64_t r0 = (int64_t)blockIdx.x * kTileRows;

    /* this lane's two rows: r0 + 16 warp + gr (+ 8) */
    int64_t first[2], last[2], off[2];
    bool live[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t r = r0 + warp * 16 + gr + 8 * i;
        live[i] = r < rows;
        const int64_t rc = live[i] ? r : rows - 1;
        const int64_t t = rc / p.G, h = (int64_t)hk * p.G + rc % p.G;
        last[i] = L + t;
        first[i] = first_key(p, last[i]);
        off[i] = (t * p.Hq + h) * D; /* of q and out */
    }

    /* q fragments, pre-scaled, as bf16 hi + lo */
    uint32_t qh[KC][4], ql[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int i = f & 1, col = kc * 16 + 2 * ti + (f >> 1) * 8;
            const float2 x = *reinterpret_cast<const float2 *>(p.q + off[i] + col);
            const float a = x.x * p.scale_log2, b = x.y * p.scale_log2;
            const float ah = __bfloat162float(__float2bfloat16_rn(a)), bh = __bfloat162float(__float2bfloat16_rn(b));
            qh[kc][f] = pack_bf16(ah, bh);
            ql[kc][f] = pack_bf16(a - ah, b - bh);
        }
    }

    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    /* keys the block's rows see: from the first row's first key to the last row's position */
    const int64_t r_last = min(r0 + kTileRows, rows) - 1;
    const int64_t j_lo = first_key(p, L + r0 / p.G), j_hi = L + r_last / p.G;
    const uint16_t *kc = static_cast<const uint16_t *>(p.kc) + (int64_t)hk * D;
    const uint16_t *vc = static_cast<const uint16_t *>(p.vc) + (int64_t)hk * D;

    /* tiles j_lo .. j_hi in two stages: the next tile's copies are in flight while this one is used */
    extern __shared__ __align__(16) unsigned char tiled_smem[];
    uint16_t *const tiles = reinterpret_cast<uint16_t *>(tiled_smem); /* [2 stages][K, V][64 keys, LD] */
    const int64_t n_tiles = (j_hi - j_lo) / kTileKeys + 1; /* j_hi >= j_lo: every block has a live row */
    tiled_load<D>(p, kc, vc, j_lo, j_hi, tiles, tiles + kTileKeys * LD);
    for (int64_t it = 0; it < n_tiles; it++) {
        const int64_t j0 = j_lo + it * kTileKeys;
        const uint16_t *ks = tiles + (it & 1) * 2 * kTileKeys * LD, *vs = ks + kTileKeys * LD;
        if (it + 1 < n_tiles) {
            uint16_t *nk = tiles + ((it + 1) & 1) * 2 * kTileKeys * LD;
            tiled_load<D>(p, kc, vc, j0 + kTileKeys, j_hi, nk, nk + kTileKeys * LD);
            copies_wait<1>(); /* this thread's copies of tile it are in */
        } else {
            copies_wait<0>();
        }
        __syncthreads(); /* and every thread's */

        /* scores of this lane: s[n][0..1] row gr, s[n][2..3] row gr + 8, keys j0 + 8n + 2ti (+1) */
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kc2 = 0; kc2 < KC; kc2++) {
#pragma unroll
            for (int n = 0; n < NS; n += 2) { /* keys 8n .. 8n + 15: b0, b1 of n, then of n + 1 */
                uint32_t b[4];
                ldmatrix_x4<false>(b, ks + (8 * n + 8 * (lane >> 4) + (lane & 7)) * LD + kc2 * 16 + 8 * ((lane >> 3) & 1));
                mma_bf16(s[n], qh[kc2], b[0], b[1]);
                mma_bf16(s[n], ql[kc2], b[0], b[1]);
                mma_bf16(s[n + 1], qh[kc2], b[2], b[3]);
                mma_bf16(s[n + 1], ql[kc2], b[2], b[3]);
            }
        }
        /* this lane's rows see keys j0 + lo[i] .. j0 + hi[i] of the tile
         * (clamped to -1 .. 64); a tile inside both ranges needs no mask */
        int lo[2], hi[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            lo[i] = (int)max((int64_t)-1, min(first[i] - j0, (int64_t)kTileKeys));
            hi[i] = (int)max((int64_t)-1, min(last[i] - j0, (int64_t)kTileKeys));
        }
        if (lo[0] > 0 || lo[1] > 0 || hi[0] < kTileKeys - 1 || hi[1] < kTileKeys - 1) {
#pragma unroll
            for (int n = 0; n < NS; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1, c = n * 8 + 2 * ti + (e & 1);
                    if (c < lo[i] || c > hi[i]) s[n][e] = -INFINITY;
                }
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
        float base[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float mn = fmaxf(m[i], mx[i]);
            base[i] = mn == -INFINITY ? 0.0f : mn; /* a row that has seen no key yet */
            const float c = exp2f(m[i] - base[i]);
            m[i] = mn;
            l[i] *= c;
#pragma unroll
            for (int n = 0; n < ND; n++) o[n][2 * i] *= c, o[n][2 * i + 1] *= c;
        }
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float pe = exp2f(s[n][e] - base[e >> 1]);
                s[n][e] = pe;
                l[e >> 1] += pe;
            }
        }
        /* O += P V: the score accumulators of keys 16kk..16kk+15 are the A fragment */
#pragma unroll
        for (int kk = 0; kk < kTileKeys / 16; kk++) {
            const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < ND; n += 2) { /* columns 8n .. 8n + 15: b0, b1 of n, then of n + 1 */
                uint32_t b[4];
                ldmatrix_x4<true>(b, vs + (kk * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * n + 8 * (lane >> 4));
                mma_bf16(o[n], a, b[0], b[1]);
                mma_bf16(o[n + 1], a, b[2], b[3]);
            }
        }
        __syncthreads(); /* the stage is read: the copies of tile it + 2 may overwrite it */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        if (!live[i]) continue;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int n = 0; n < ND; n++) {
            const float2 r = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
            *reinterpret_cast<float2 *>(p.out + off[i] + n * 8 + 2 * ti) = r;
            if (p.out16) *reinterpret_cast<__nv_bfloat162 *>(p.out16 + off[i] + n * 8 + 2 * ti) = __float22bfloat162_rn(r);
        }
    }
}

/* ---- the split-K kernel on the tensor cores (decode over bf16 storage, D 64 / 128) ---- */

constexpr int kMmaWarps = kThreads / 32;

/* d = a b for a 16x8 bf16 (row), b 8x8 bf16 (col), then c += rows g and
 * g + 8 of d (one head: the products of its hi and lo weights). Fragments
 * of lane (g = lane / 4, i = lane % 4): a = rows g (a0), g+8 (a1) x cols
 * 2i, 2i+1; b = rows 2i, 2i+1 x col g; c = cols 2i, 2i+1 of the sum. The
 * rows g + 8 pass through registers that die at once (not 2 more
 * accumulators per 8 columns). */
__device__ inline void mma_bf16_k8_fold(float (&c)[2], uint32_t a0, uint32_t a1, uint32_t b) {
    float d2, d3;
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%7,%7};\n"
                 : "+f"(c[0]), "+f"(c[1]), "=f"(d2), "=f"(d3)
                 : "r"(a0), "r"(a1), "r"(b), "f"(0.0f));
    c[0] += d2;
    c[1] += d3;
}

/* Byte offset in a tile ([KT keys, D] bf16, rows 2D bytes) of 16-byte chunk
 * ch of key row r. The chunks of a row are permuted by r mod 8, so the same
 * chunk of 8 consecutive rows lies in 8 different groups of 4 banks (D of 64
 * or more: 8 or more chunks a row): ldmatrix reads and cp.async writes
 * without bank conflicts. */
template <int D>
__device__ inline int swizzled(int r, int ch) {
    return r * (2 * D) + ((ch ^ (r & 7)) << 4);
}

/* What the tile loads of one block of mma_attend_kernel need: keys are
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

/* Starts filling a K and a V tile with keys k0 + jr .. k0 + jr + KT - 1:
 * stored keys by cp.async from storage, keys of this step from k, v rounded
 * to bf16 as the storage write rounds them (plain stores: the barrier before
 * the tile is read orders them), keys past the split as zeros. */
template <int D>
__device__ inline void mma_tile_load(const mma_keys &q, int32_t jr, unsigned char *kt, unsigned char *vt) {
    constexpr int CH = D / 8;                  /* 16-byte chunks of a key row */
    constexpr int KT = kTileBytes / (2 * D);
    constexpr int RSTEP = kThreads / CH;       /* a thread's pieces: rows r0, r0 + RSTEP, ..., chunk ch */
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    /* the slot of tile row 0; row r's is first + r, less R once past it (a
     * split's keys lie in one window: fewer than R) */
    int64_t first = q.k0 + jr;
    if (q.ring) first %= q.R;
#pragma unroll
    for (int i = 0; i < kPieces; i++) {
        const int r = r0 + i * RSTEP;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) { /* a stored key, or zeros */
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = (ok ? slot * q.row_bytes : 0) + ch * 16;
            const int o = swizzled<D>(r, ch);
            copy16_async(kt + o, q.kb + off, ok);
            copy16_async(vt + o, q.vb + off, ok);
        }
    }
    if (jr + KT > q.n_stored && q.n_stored < q.n) { /* the tile holds keys of this step (the same for every thread) */
#pragma unroll 1
        for (int i = 0; i < kPieces; i++) {
            const int r = r0 + i * RSTEP;
            const int32_t j = jr + r;
            if (j < q.n_stored || j >= q.n) continue;
            const int64_t at = (int64_t)(j - q.n_stored) * q.row + ch * kE;
            float kf[kE], vf[kE];
            load8(q.knew + at, kf);
            load8(q.vnew + at, vf);
            const int o = swizzled<D>(r, ch);
            *reinterpret_cast<uint4 *>(kt + o) = make_uint4(pack_bf16(kf[0], kf[1]), pack_bf16(kf[2], kf[3]),
                                                            pack_bf16(kf[4], kf[5]), pack_bf16(kf[6], kf[7]));
            *reinterpret_cast<uint4 *>(vt + o) = make_uint4(pack_bf16(vf[0], vf[1]), pack_bf16(vf[2], vf[3]),
                                                            pack_bf16(vf[4], vf[5]), pack_bf16(vf[6], vf[7]));
        }
    }
}

/* 4 bytes global -> shared (cp.async); fill false writes zeros. */
__device__ inline void copy4_async(void *dst, const void *src, bool fill) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(fill ? 4 : 0) : "memory");
}

/* int8 / fp8 storage on the tensor cores. A stage holds the tile's quants
 * as stored ([KT, D] bytes for K and for V: the keys of a bf16 tile, half
 * the bytes) and their f32 k and v scales ([KT] each); after the barrier
 * that opens a tile its quants are widened to bf16 (exact: int8 and e4m3
 * values are bf16 values) into one K and one V tile laid out as the bf16
 * kernel's, which the same ldmatrix / mma code reads. The scales are folded
 * in as the CUDA-core kernel folds them: score = (q . quants) x k scale,
 * weight = p x v scale. Byte offsets of shared memory: */
template <int D>
struct mma_quant_smem {
    static constexpr int KT = kTileBytes / (2 * D);             /* keys of a tile */
    static constexpr int tile = KT * D;                          /* quant bytes of a K (V) tile: 4 KB */
    static constexpr int scales = 2 * kStages * tile;            /* [stage][K, V][KT] f32 */
    static constexpr int wide = scales + 2 * kStages * KT * 4;   /* the bf16 K tile, then the V tile */
    static constexpr int q = wide + 2 * kTileBytes;              /* the q tile (D 128) */
    static constexpr int total = q + (D > 64 ? 16 * D * 2 : 0);
    static_assert(wide % 16 == 0 && total <= 48 * 1024, "quantized tiles fit the default shared memory");
};

/* Starts filling stage (kt, vt: quants; ksc, vsc: scales) with keys k0 + jr
 * .. k0 + jr + KT - 1: stored keys by cp.async (quants and scales), keys of
 * this step quantized here exactly as the row write quantizes them (amax of
 * the head over a warp, f32 division, the same conversions), keys past the
 * split as zeros. */
template <typename KV, int D>
__device__ inline void mma_quant_tile_load(const mma_keys &q, int32_t jr, unsigned char *kt, unsigned char *vt,
                                           float *ksc, float *vsc) {
    constexpr int CH = D / 16;            /* 16-byte pieces of a row of quants */
    constexpr int KT = kTileBytes / (2 * D);
    constexpr int RSTEP = kThreads / CH;  /* a thread's pieces: rows r0, r0 + RSTEP, piece ch */
    constexpr int NP = KT * CH / kThreads; /* 2 */
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    int64_t first = q.k0 + jr;
    if (q.ring) first %= q.R;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int r = r0 + i * RSTEP;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) {
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = (ok ? slot * q.row_bytes : 0) + ch * 16;
            copy16_async(kt + r * D + ch * 16, q.kb + off, ok);
            copy16_async(vt + r * D + ch * 16, q.vb + off, ok);
        }
    }
    if (threadIdx.x < KT) { /* the scales: one key a thread */
        const int r = threadIdx.x;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) {
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = ok ? slot * q.row_bytes + q.scale_rel : 0;
            copy4_async(ksc + r, q.kb + off, ok);
            copy4_async(vsc + r, q.vb + off, ok);
        }
    }
    if (jr + KT > q.n_stored && q.n_stored < q.n) { /* keys of this step: a warp a key (the same for every thread) */
        constexpr int PER = D / 32;                  /* elements a lane: 4 or 2 */
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int r_lo = q.n_stored > jr ? q.n_stored - jr : 0, r_hi = q.n - jr < KT ? q.n - jr : KT;
        for (int r = r_lo + warp; r < r_hi; r += kMmaWarps) {
            const int64_t at = (int64_t)(jr + r - q.n_stored) * q.row + lane * PER;
            float kf[PER], vf[PER], ka = 0.0f, va = 0.0f;
#pragma unroll
            for (int e = 0; e < PER; e++) {
                kf[e] = q.knew[at + e], vf[e] = q.vnew[at + e];
                ka = fmaxf(ka, fabsf(kf[e])), va = fmaxf(va, fabsf(vf[e]));
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                ka = fmaxf(ka, __shfl_xor_sync(0xffffffffu, ka, o));
                va = fmaxf(va, __shfl_xor_sync(0xffffffffu, va, o));
            }
            const float kscale = ka / quant_max(KV{}), vscale = va / quant_max(KV{});
            KV *kd = reinterpret_cast<KV *>(kt + r * D + lane * PER), *vd = reinterpret_cast<KV *>(vt + r * D + lane * PER);
#pragma unroll
            for (int e = 0; e < PER; e++) {
                store_quant(kd + e, kf[e], kscale);
                store_quant(vd + e, vf[e], vscale);
            }
            if (lane == 0) ksc[r] = kscale, vsc[r] = vscale;
        }
    }
}

/* The quants of a stage (kq, vq) as bf16 into the tiles kw, vw (swizzled
 * as mma_tile_load lays them out). */
template <typename KV, int D>
__device__ inline void mma_quant_widen(const unsigned char *kq, const unsigned char *vq, unsigned char *kw,
                                       unsigned char *vw) {
    constexpr int CH = D / 16;
    constexpr int KT = kTileBytes / (2 * D);
#pragma unroll
    for (int c = threadIdx.x; c < KT * CH; c += kThreads) {
        const int r = c / CH, pc = c % CH;
#pragma unroll
        for (int half = 0; half < 2; half++) { /* quants 8 half .. 8 half + 7 of the piece: bf16 chunk 2 pc + half */
            float kf[kE], vf[kE];
            load8(reinterpret_cast<const KV *>(kq + r * D + pc * 16 + half * 8), kf);
            load8(reinterpret_cast<const KV *>(vq + r * D + pc * 16 + half * 8), vf);
            const int o = swizzled<D>(r, 2 * pc + half);
            *reinterpret_cast<uint4 *>(kw + o) = make_uint4(pack_bf16(kf[0], kf[1]), pack_bf16(kf[2], kf[3]),
                                                            pack_bf16(kf[4], kf[5]), pack_bf16(kf[6], kf[7]));
            *reinterpret_cast<uint4 *>(vw + o) = make_uint4(pack_bf16(vf[0], vf[1]), pack_bf16(vf[2], vf[3]),
                                                            pack_bf16(vf[4], vf[5]), pack_bf16(vf[6], vf[7]));
        }
    }
}

/* q in shared memory rather than 32 registers a lane (D 128: q and O in
 * registers beside the loop's addresses pass the 128 that 4 blocks an SM
 * leave a thread). */
constexpr bool mma_q_shared(int D) { return D > 64; }
constexpr int mma_smem(int D) { return kSmem + (mma_q_shared(D) ? 16 * D * 2 : 0); }

template <typename KV, int D, bool BATCH>
__global__ void __launch_bounds__(kThreads, kWave) mma_attend_kernel(attend_params p) {
    constexpr bool QS = mma_q_shared(D);
    constexpr bool QUANT = kv_quant<KV>::value; /* int8 / fp8: quant stages, widened to bf16 tiles */
    using QM = mma_quant_smem<D>;
    constexpr int KT = kTileBytes / (2 * D); /* keys of a tile: 32 (D 128), 64 (D 64) */
    constexpr int KPW = KT / kMmaWarps;       /* keys of a tile per warp: 8, 16 */
    constexpr int NT = KPW / 8;               /* 8-key groups per warp and tile */
    constexpr int KC = D / 16;                /* k steps of q . k */
    constexpr int ND = D / 8;                 /* n tiles of the output */
    static_assert(KPW % 8 == 0 && D % 32 == 0 && D / 8 >= 8, "tile geometry");
    const int32_t hk = blockIdx.y / p.chunks, chunk_i = blockIdx.y % p.chunks;
    const int32_t h0 = hk * p.G + chunk_i * p.gm;
    const int32_t g_n = min(p.gm, p.G - chunk_i * p.gm);
    const int32_t t = blockIdx.x;
    row_geom rg;
    if (!block_row<KV, BATCH>(p, t, h0, g_n, rg)) return;
    const int64_t L = rg.L, pos = rg.pos;
    const int64_t lo = first_key(p.ring, rg.W, pos);
    int64_t chunk;
    const int32_t S = splits_for(pos - lo + 1, p.max_splits, &chunk);
    const int32_t split = blockIdx.z;
    if (split >= S) return; /* the whole block leaves: no barrier is skipped */
    const int64_t k0 = lo + split * chunk;
    const int64_t k1 = min(k0 + chunk, pos + 1); /* k0 < k1: no split is empty */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, ti = lane & 3;

    extern __shared__ __align__(16) unsigned char smem[];

    /* O of head gr, columns 8n + 2ti (+1) */
    float o[ND][2];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* m: the same in the 4 lanes of head gr; l: this lane's keys */

    mma_keys ks;
    {
        const int64_t row = (int64_t)p.Hkv * D; /* floats between rows of k, v */
        const int64_t row0 = t - (pos - L);     /* the row of k, v holding position L */
        ks.kb = rg.st.k + (int64_t)hk * D * (int64_t)sizeof(KV), ks.vb = rg.st.v + (int64_t)hk * D * (int64_t)sizeof(KV);
        ks.knew = p.k + row0 * row + (int64_t)hk * D, ks.vnew = p.v + row0 * row + (int64_t)hk * D;
        ks.k0 = k0;
        ks.row_bytes = rg.st.RS * (int64_t)sizeof(KV);
        ks.scale_rel = (int32_t)((int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES - (int64_t)hk * D);
        ks.R = rg.st.R;
        ks.n = (int32_t)(k1 - k0);
        ks.n_stored = (int32_t)(L <= k0 ? 0 : L >= k1 ? k1 - k0 : L - k0);
        ks.row = (int32_t)row;
        ks.ring = p.ring;
        /* key k0 + j of this step (j >= n_stored) is row row0 + (k0 + j - L) of k, v */
        if (k0 > L) ks.knew += (k0 - L) * row, ks.vnew += (k0 - L) * row;
    }
    const int32_t n_tiles = (ks.n + KT - 1) / KT;
    /* stage b: bf16 tiles at 2b, 2b + 1 x kTileBytes; quantized: quants at
     * 2b, 2b + 1 x QM::tile and scales at QM::scales + [2b, 2b + 1] x KT f32 */
    auto load_stage = [&](const mma_keys &q, int32_t jr, int b) {
        if constexpr (QUANT) {
            float *sc0 = reinterpret_cast<float *>(smem + QM::scales) + 2 * b * KT;
            mma_quant_tile_load<KV, D>(q, jr, smem + 2 * b * QM::tile, smem + (2 * b + 1) * QM::tile, sc0, sc0 + KT);
        } else {
            mma_tile_load<D>(q, jr, smem + 2 * b * kTileBytes, smem + (2 * b + 1) * kTileBytes);
        }
    };
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) {
        if (i < n_tiles) load_stage(ks, i * KT, i);
        copies_commit();
    }

    /* (after the first tiles are asked for: q's latency hides behind theirs)
     * A fragments of q: rows gr (hi) and gr + 8 (lo) of head h0 + gr, or
     * zeros past g_n; in registers, or (QS) a [16, D] bf16 tile in shared
     * memory past the K/V tiles that every k step reads by ldmatrix */
    unsigned char *qs = smem + (QUANT ? QM::q : kSmem);
    uint32_t qa[QS ? 1 : KC][4];
    if (!QS || warp == 0) { /* QS: warp 0 writes the tile, read after the barrier that opens the first tile */
        const bool live = gr < g_n;
        const float *qp = p.q + ((int64_t)t * p.Hq + h0 + (live ? gr : 0)) * D;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int col = kc * 16 + half * 8 + 2 * ti;
                float2 x = make_float2(0.0f, 0.0f);
                if (live) x = *reinterpret_cast<const float2 *>(qp + col);
                const float a = x.x * p.scale_log2, b = x.y * p.scale_log2;
                const float ah = __bfloat162float(__float2bfloat16_rn(a)), bh = __bfloat162float(__float2bfloat16_rn(b));
                const uint32_t hi = pack_bf16(ah, bh), lo = pack_bf16(a - ah, b - bh);
                if constexpr (QS) {
                    *reinterpret_cast<uint32_t *>(qs + swizzled<D>(gr, 2 * kc + half) + 4 * ti) = hi;
                    *reinterpret_cast<uint32_t *>(qs + swizzled<D>(gr + 8, 2 * kc + half) + 4 * ti) = lo;
                } else {
                    qa[QS ? 0 : kc][2 * half] = hi;     /* a0 / a2: row gr */
                    qa[QS ? 0 : kc][2 * half + 1] = lo; /* a1 / a3: row gr + 8 */
                }
            }
        }
    }
    /* ldmatrix rows of the q tile: lanes 0-7 rows 0-7 (a0), 8-15 rows 8-15
     * (a1), 16-23 rows 0-7 of the next chunk (a2), 24-31 rows 8-15 (a3) */
    const int q_row = (lane & 7) + (lane & 8), q_ch = lane >> 4;

    for (int32_t i = 0; i < n_tiles; i++) {
        copies_wait<kStages - 2>(); /* this thread's pieces of tile i are in */
        __syncthreads();            /* everyone's are (and their plain stores), and tile i - 1 is consumed */
        const int32_t next = i + kStages - 1;
        if (next < n_tiles) load_stage(ks, next * KT, next % kStages);
        copies_commit();
        const int b = i % kStages;
        const unsigned char *kt = smem + 2 * b * kTileBytes, *vt = smem + (2 * b + 1) * kTileBytes;
        const float *ksc = nullptr, *vsc = nullptr; /* QUANT: the stage's scales */
        if constexpr (QUANT) {
            kt = smem + QM::wide, vt = smem + QM::wide + kTileBytes;
            ksc = reinterpret_cast<const float *>(smem + QM::scales) + 2 * b * KT, vsc = ksc + KT;
            /* the bf16 tiles were last read before the barrier above */
            mma_quant_widen<KV, D>(smem + 2 * b * QM::tile, smem + (2 * b + 1) * QM::tile, smem + QM::wide,
                                   smem + QM::wide + kTileBytes);
            __syncthreads();
        }
        const int rw = warp * KPW;               /* this warp's first row in the tile */
        const int32_t live = ks.n - i * KT - rw; /* keys of its rows inside the split (may be <= 0) */

        /* S = Q K^T over the warp's keys: s[nt] rows gr, gr + 8 x tile rows rw + 8 nt + 2 ti (+1) */
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const int r = rw + nt * 8 + (lane & 7);
#pragma unroll
            for (int c4 = 0; c4 < KC / 2; c4++) { /* chunks 4 c4 .. 4 c4 + 3: k steps 2 c4, 2 c4 + 1 */
                uint32_t kb[4];
                ldmatrix_x4<false>(kb, kt + swizzled<D>(r, 4 * c4 + (lane >> 3)));
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int kc = 2 * c4 + u;
                    uint32_t a[4];
                    if constexpr (QS) {
                        ldmatrix_x4<false>(a, qs + swizzled<D>(q_row, 2 * kc + q_ch));
                    } else {
#pragma unroll
                        for (int f = 0; f < 4; f++) a[f] = qa[QS ? 0 : kc][f];
                    }
                    mma_bf16(s[nt], a, kb[2 * u], kb[2 * u + 1]);
                }
            }
        }
        /* scores of head gr (hi row + lo row), -inf past k1; online softmax */
        float sc[NT][2], mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float x = s[nt][e] + s[nt][2 + e];
                if constexpr (QUANT) x *= ksc[rw + nt * 8 + 2 * ti + e]; /* q . (k quants) x k scale */
                sc[nt][e] = nt * 8 + 2 * ti + e < live ? x : -INFINITY;
                mx = fmaxf(mx, sc[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx);
        const float base = mn == -INFINITY ? 0.0f : mn; /* no key yet: every weight is exp2(-inf) = 0 */
        const float cr = exp2f(m - base);
        m = mn;
        l *= cr;
#pragma unroll
        for (int n = 0; n < ND; n++) o[n][0] *= cr, o[n][1] *= cr;

        /* O += P V, 8 keys at a time: P rows gr = bf16(p), gr + 8 = bf16(p - bf16(p)) */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float p0 = exp2f(sc[nt][0] - base), p1 = exp2f(sc[nt][1] - base);
            l += p0 + p1;
            if constexpr (QUANT) { /* the weight of the value quants: p x v scale */
                p0 *= vsc[rw + nt * 8 + 2 * ti];
                p1 *= vsc[rw + nt * 8 + 2 * ti + 1];
            }
            const float h0f = __bfloat162float(__float2bfloat16_rn(p0)), h1f = __bfloat162float(__float2bfloat16_rn(p1));
            const uint32_t a0 = pack_bf16(h0f, h1f), a1 = pack_bf16(p0 - h0f, p1 - h1f);
            const int r = rw + nt * 8 + (lane & 7);
#pragma unroll
            for (int c4 = 0; c4 < ND / 4; c4++) { /* chunks 4 c4 .. 4 c4 + 3: n tiles of O */
                uint32_t vb[4];
                ldmatrix_x4<true>(vb, vt + swizzled<D>(r, 4 * c4 + (lane >> 3)));
#pragma unroll
                for (int u = 0; u < 4; u++) mma_bf16_k8_fold(o[4 * c4 + u], a0, a1, vb[u]);
            }
        }
    }
    copies_wait<0>();

    if (split == S - 1 && chunk_i == 0) write_own_row<KV>(p, rg.st, pos, t, hk);

    /* 3. the 4 warps' partials to shared memory (the tiles are consumed), as
     * finish_split reads them: [4, 8] maxima, [4, 8] sums, [4, 8, D] accumulators */
    __syncthreads();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *sm = reinterpret_cast<float *>(smem);
    float *sm_m = sm, *sm_l = sm + kMmaWarps * 8, *sm_acc = sm + 2 * kMmaWarps * 8;
    if (ti == 0) {
        sm_m[warp * 8 + gr] = m;
        sm_l[warp * 8 + gr] = l;
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2 *>(sm_acc + (warp * 8 + gr) * D + n * 8 + 2 * ti) =
            make_float2(o[n][0], o[n][1]);
    __syncthreads();
    finish_split<8>(p, sm, kMmaWarps, g_n, h0, t, S, split);
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

template <typename KV, int D, bool BATCH>
cudaError_t launch_mma_d(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    constexpr int smem = kv_quant<KV>::value ? mma_quant_smem<D>::total : mma_smem(D);
    static std::atomic<unsigned long long> done{0};
    const cudaError_t e = allow_smem(mma_attend_kernel<KV, D, BATCH>, smem, dev, done);
    if (e != cudaSuccess) return e;
    mma_attend_kernel<KV, D, BATCH><<<grid, kThreads, smem, st>>>(p);
    return cudaGetLastError();
}

template <typename KV, bool BATCH>
cudaError_t launch_mma_kv(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    return p.D == 64 ? launch_mma_d<KV, 64, BATCH>(p, grid, st, dev) : launch_mma_d<KV, 128, BATCH>(p, grid, st, dev);
}

/* dt: the storage (og_attend_cuda_decode_mma holds); dev: the current device
 * (the attribute above is set per device) */
template <bool BATCH>
cudaError_t launch_mma(const attend_params &p, og_dtype dt, dim3 grid, cudaStream_t st, int dev) {
    switch (dt) {
    case OG_DTYPE_INT8: return launch_mma_kv<kv_i8, BATCH>(p, grid, st, dev);
    case OG_DTYPE_FP8: return launch_mma_kv<kv_e4m3, BATCH>(p, grid, st, dev);
    default: return launch_mma_kv<__nv_bfloat16, BATCH>(p, grid, st, dev);
    }
}

template <int D>
cudaError_t launch_tiled_d(const attend_params &p, cudaStream_t st, int dev) {
    constexpr int smem = tiled_smem_bytes(D);
    static std::atomic<unsigned long long> done{0};
    const cudaError_t e = allow_smem(tiled_attend_kernel<D>, smem, dev, done);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)(((int64_t)p.T * p.G + kTileRows - 1) / kTileRows), (unsigned)p.Hkv);
    tiled_attend_kernel<D><<<grid, kThreads, smem, st>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_tiled(const attend_params &p, cudaStream_t st, int dev) {
    switch (p.D) {
    case 16: return launch_tiled_d<16>(p, st, dev);
    case 32: return launch_tiled_d<32>(p, st, dev);
    case 64: return launch_tiled_d<64>(p, st, dev);
    default: return launch_tiled_d<128>(p, st, dev);
    }
}

template <typename KV, bool BATCH>
cudaError_t launch_attend(const attend_params &p, int gm, dim3 grid, cudaStream_t st) {
    switch (gm) {
    case 1: attend_kernel<KV, 1, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    case 2: attend_kernel<KV, 2, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    case 4: attend_kernel<KV, 4, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    default: attend_kernel<KV, 8, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    }
    return cudaGetLastError();
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

og_status launch_failed(const char *what, cudaError_t e) {
    return og_set_error(OG_ERR_BACKEND, "update_and_attend_cuda: %s launch: %s (%s)", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

} /* namespace */

/* The decode kernel choice: -1 until the first call reads OG_CUDA_ATTEND. */
static std::atomic<int> g_decode{-1};

extern "C" og_attend_cuda_decode og_attend_cuda_get_decode(void) {
    int d = g_decode.load(std::memory_order_relaxed);
    if (d < 0) {
        const char *env = getenv("OG_CUDA_ATTEND");
        /* the tensor-core kernel by default (faster at every history measured:
         * bench_attend_cuda, 4k 21.4 -> 16.4 us, 128k 174 -> 139 us);
         * OG_CUDA_ATTEND=simt keeps the CUDA-core kernel */
        d = env && !strcmp(env, "simt") ? OG_ATTEND_CUDA_SIMT : OG_ATTEND_CUDA_MMA;
        int expect = -1;
        if (!g_decode.compare_exchange_strong(expect, d)) d = expect; /* another thread read it first */
    }
    return (og_attend_cuda_decode)d;
}

extern "C" og_attend_cuda_decode og_attend_cuda_set_decode(og_attend_cuda_decode d) {
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    g_decode.store(d == OG_ATTEND_CUDA_MMA ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
    return prev;
}

/* int8 / fp8 storage on the tensor cores too (false: bf16 alone, unless
 * the environment sets OG_CUDA_ATTEND_QUANT=1: the quantized variant has
 * not run on a GPU yet, and a run of the tests with and one without it keep
 * a fault of it from hiding the bf16 results). */
static constexpr bool kMmaQuant = false;

static bool mma_quant(void) {
    static std::atomic<int> on{-1};
    int v = on.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("OG_CUDA_ATTEND_QUANT");
        v = kMmaQuant || (env && !strcmp(env, "1"));
        on.store(v, std::memory_order_relaxed);
    }
    return v != 0;
}

extern "C" bool og_attend_cuda_decode_mma(og_dtype kv_dtype, int32_t head_dim) {
    const bool dt = kv_dtype == OG_DTYPE_BF16 || (og_kv_dtype_quantized(kv_dtype) && mma_quant());
    return dt && (head_dim == 64 || head_dim == 128);
}

/* True when a split-K step over storage of dt with heads of D runs on the tensor cores. */
static bool decode_on_mma(og_dtype dt, int32_t D) {
    return og_attend_cuda_get_decode() == OG_ATTEND_CUDA_MMA && og_attend_cuda_decode_mma(dt, D);
}

/* Blocks of one split of one row: kv heads x head chunks. */
static int32_t row_blocks(int32_t n_heads, int32_t n_kv_heads) {
    const int32_t G = n_heads / n_kv_heads, gm = group_heads(G);
    return n_kv_heads * ((G + gm - 1) / gm);
}

extern "C" int32_t og_attend_cuda_max_splits(int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count) {
    if (T < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || sm_count < 1) return 1;
    return split_cap(T, row_blocks(n_heads, n_kv_heads), sm_count);
}

extern "C" int64_t og_attend_cuda_scratch_floats(int32_t n_heads, int32_t head_dim) {
    return (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * n_heads * (head_dim + 3);
}

extern "C" bool og_attend_cuda_tiled(int32_t T, og_dtype kv_dtype, int32_t head_dim) {
    return T > 1 && kv_dtype == OG_DTYPE_BF16 && (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128);
}

extern "C" int32_t og_attend_cuda_splits(int64_t n, int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count) {
    int64_t chunk;
    return n < 1 ? 1 : splits_for(n, og_attend_cuda_max_splits(T, n_heads, n_kv_heads, sm_count), &chunk);
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
    if (kv->dtype != OG_DTYPE_BF16 && kv->dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(kv->dtype))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: storage dtype %s (bf16, f32, int8 or fp8)", op,
                            og_dtype_name(kv->dtype));
    if (og_kv_dtype_quantized(kv->dtype) && D < 16) /* a tile row of D quants is at least one 16-byte piece */
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d over %s storage (need >= 16)", op, D,
                            og_dtype_name(kv->dtype));
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
    /* a row's own elements: Hkv * D, or Hkv * (D + 4) bytes quantized (quants, then scales) */
    const int64_t HD = og_kv_dtype_quantized(kv->dtype) ? og_kv_dtype_row_bytes(kv->dtype, kv->n_kv_heads, D)
                                                        : (int64_t)kv->n_kv_heads * D;
    const int64_t RS = kv->row_stride ? kv->row_stride : HD;
    if (RS < HD)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: layer %d: row stride %lld below a row's %lld", op,
                            kv->layer_id, (long long)RS, (long long)HD);
    if ((RS * (int64_t)og_dtype_size(kv->dtype)) % 16)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: layer %d: row stride %lld is not a multiple of 16 bytes",
                            op, kv->layer_id, (long long)RS);
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) || !aligned16(kv->k) ||
        !aligned16(kv->v) || !aligned16(a->partials))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is not 16-byte aligned", op);

    const bool tiled = og_attend_cuda_tiled(a->T, kv->dtype, D) && !a->split_k;
    if (a->out_bf16 && (!tiled || !aligned16(a->out_bf16)))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out_bf16 needs the tiled kernel and 16-byte alignment", op);
    attend_params p;
    p.q = a->q, p.k = a->k, p.v = a->v, p.out = a->out;
    p.out16 = reinterpret_cast<__nv_bfloat16 *>(a->out_bf16);
    p.kc = kv->k, p.vc = kv->v;
    p.seqs = nullptr;
    p.RS = RS;
    const int64_t P = (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * a->n_heads;
    p.counters = reinterpret_cast<unsigned int *>(a->partials);
    p.part_acc = a->partials ? a->partials + P : NULL;
    p.part_m = a->partials ? a->partials + P * (D + 1) : NULL;
    p.part_l = a->partials ? a->partials + P * (D + 2) : NULL;
    p.length = a->length;
    p.L0 = kv->length, p.R = kv->rows;
    p.T = a->T, p.Hq = a->n_heads, p.Hkv = kv->n_kv_heads, p.D = D;
    p.G = a->n_heads / kv->n_kv_heads;
    p.lanes = D / kE;
    p.ring = kv->policy == OG_KV_RING;
    p.W = kv->window;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = scale * kLog2e;
    const int gm = group_heads(p.G);
    p.gm = gm;
    p.chunks = (p.G + gm - 1) / gm;
    if ((int64_t)p.Hkv * p.chunks > 65535)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: %d kv heads x %d head chunks exceed the grid", op, p.Hkv,
                            p.chunks);
    int dev = 0, sm_count = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return og_set_error(OG_ERR_BACKEND, "%s: SM count of the device: %s", op, cudaGetErrorString(e));
    const int32_t maxS = split_cap(a->T, p.Hkv * p.chunks, sm_count);
    if (maxS > 1 && !a->partials) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: partials scratch is NULL", op);
    p.max_splits = maxS;

    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const bool bf16 = kv->dtype == OG_DTYPE_BF16;
    if (tiled) {
        const int64_t writes = (int64_t)a->T * p.Hkv * D;
        const int wblocks = (int)((writes + 255) / 256 < 4096 ? (writes + 255) / 256 : 4096);
        kv_write_kernel<__nv_bfloat16><<<wblocks, 256, 0, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return launch_failed("kv_write", e);
        if ((e = launch_tiled(p, st, dev)) != cudaSuccess) return launch_failed("tiled attend", e);
        return OG_OK;
    }

    const dim3 grid((unsigned)a->T, (unsigned)(p.Hkv * p.chunks), (unsigned)maxS);
    if (decode_on_mma(kv->dtype, D)) {
        e = launch_mma<false>(p, kv->dtype, grid, st, dev);
        if (e != cudaSuccess) return launch_failed("attend (tensor cores)", e);
        return OG_OK;
    }
    switch (kv->dtype) {
    case OG_DTYPE_INT8: e = launch_attend<kv_i8, false>(p, gm, grid, st); break;
    case OG_DTYPE_FP8: e = launch_attend<kv_e4m3, false>(p, gm, grid, st); break;
    default:
        e = bf16 ? launch_attend<__nv_bfloat16, false>(p, gm, grid, st) : launch_attend<float, false>(p, gm, grid, st);
    }
    if (e != cudaSuccess) return launch_failed("attend", e);
    return OG_OK;
}

/* ---- batched decode ---- */

namespace {

/* The scratch bound holds for devices of up to this many SMs; a larger one
 * plans as if it had this many (still about a wave). */
constexpr int32_t kMaxSMs = 256;

/* Grid depth of a batched call: splits of the longest entry there may be,
 * capped where B x row_blocks blocks per split already fill a wave. */
int32_t batch_split_cap(int32_t B, int32_t rb, int64_t max_keys, int32_t sm_count) {
    int64_t s = (max_keys + OG_ATTEND_CUDA_SPLIT_KEYS - 1) / OG_ATTEND_CUDA_SPLIT_KEYS;
    if (s > OG_ATTEND_CUDA_MAX_SPLITS) s = OG_ATTEND_CUDA_MAX_SPLITS;
    const int64_t sms = sm_count < kMaxSMs ? sm_count : kMaxSMs;
    const int64_t per_split = (int64_t)B * rb;
    const int64_t fill = ((int64_t)kWave * sms + per_split - 1) / per_split;
    if (s > fill) s = fill;
    return s < 1 ? 1 : (int32_t)s;
}

/* Split counters at the head of the scratch, rounded to whole float4s. */
int64_t batch_counter_floats(int32_t B, int32_t n_heads) { return ((int64_t)B * n_heads + 3) / 4 * 4; }

} /* namespace */

extern "C" int32_t og_attend_batch_cuda_max_splits(int32_t B, int32_t n_heads, int32_t n_kv_heads, int64_t max_keys,
                                                   int32_t sm_count) {
    if (B < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || sm_count < 1 || max_keys < 1) return 1;
    return batch_split_cap(B, row_blocks(n_heads, n_kv_heads), max_keys, sm_count);
}

extern "C" int64_t og_attend_batch_cuda_scratch_floats(int32_t B, int32_t n_heads, int32_t head_dim,
                                                       int64_t max_keys) {
    if (B < 1 || n_heads < 1 || head_dim < 1 || max_keys < 1) return 0;
    const int64_t S = batch_split_cap(B, 1, max_keys, kMaxSMs); /* row_blocks >= 1: the most any Hkv needs */
    return batch_counter_floats(B, n_heads) + (int64_t)B * S * n_heads * (head_dim + 2);
}

extern "C" og_status og_update_and_attend_batch_cuda(void *stream, const og_attend_batch_cuda_args *a) {
    const char *op = "update_and_attend_batch_cuda";
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
    if (!a->q || !a->k || !a->v || !a->out || !a->seqs)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: q, k, v, out or seqs is NULL", op);
    if (a->B < 1 || a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: B = %d, Hq = %d, Hkv = %d (need >= 1 and Hq %% Hkv == 0)",
                            op, a->B, a->n_heads, a->n_kv_heads);
    const int32_t D = a->head_dim;
    if (D < 8 || D > 256 || (D & (D - 1)))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d is not a power of two in [8, 256]", op, D);
    if (a->kv_dtype != OG_DTYPE_BF16 && a->kv_dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(a->kv_dtype))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: storage dtype %s (bf16, f32, int8 or fp8)", op,
                            og_dtype_name(a->kv_dtype));
    if (og_kv_dtype_quantized(a->kv_dtype) && D < 16)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d over %s storage (need >= 16)", op, D,
                            og_dtype_name(a->kv_dtype));
    if (a->policy != OG_KV_FLAT && a->policy != OG_KV_RING)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", op, (int)a->policy);
    if (!isfinite(a->scale)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: scale is not finite", op);
    if (a->max_keys < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: max_keys %lld < 1", op, (long long)a->max_keys);
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) || !aligned16(a->partials) ||
        ((uintptr_t)a->seqs & 7u))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is not aligned (16 bytes; seqs 8)", op);

    attend_params p = {};
    p.q = a->q, p.k = a->k, p.v = a->v, p.out = a->out;
    p.seqs = a->seqs;
    p.T = a->B, p.Hq = a->n_heads, p.Hkv = a->n_kv_heads, p.D = D;
    p.G = a->n_heads / a->n_kv_heads;
    p.lanes = D / kE;
    p.ring = a->policy == OG_KV_RING;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = scale * kLog2e;
    const int gm = group_heads(p.G);
    p.gm = gm;
    p.chunks = (p.G + gm - 1) / gm;
    if ((int64_t)p.Hkv * p.chunks > 65535)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: %d kv heads x %d head chunks exceed the grid", op, p.Hkv,
                            p.chunks);
    int dev = 0, sm_count = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return og_set_error(OG_ERR_BACKEND, "%s: SM count of the device: %s", op, cudaGetErrorString(e));
    const int32_t maxS = batch_split_cap(a->B, p.Hkv * p.chunks, a->max_keys, sm_count);
    if (maxS > 1 && !a->partials) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: partials scratch is NULL", op);
    p.max_splits = maxS;
    if (a->partials) {
        const int64_t C = batch_counter_floats(a->B, a->n_heads), P = (int64_t)a->B * maxS * a->n_heads;
        p.counters = reinterpret_cast<unsigned int *>(a->partials);
        p.part_acc = a->partials + C;
        p.part_m = a->partials + C + P * D;
        p.part_l = a->partials + C + P * (D + 1);
    }
    const dim3 grid((unsigned)a->B, (unsigned)(p.Hkv * p.chunks), (unsigned)maxS);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (decode_on_mma(a->kv_dtype, D)) {
        e = launch_mma<true>(p, a->kv_dtype, grid, st, dev);
    } else {
        switch (a->kv_dtype) {
        case OG_DTYPE_INT8: e = launch_attend<kv_i8, true>(p, gm, grid, st); break;
        case OG_DTYPE_FP8: e = launch_attend<kv_e4m3, true>(p, gm, grid, st); break;
        case OG_DTYPE_BF16: e = launch_attend<__nv_bfloat16, true>(p, gm, grid, st); break;
        default: e = launch_attend<float, true>(p, gm, grid, st);
        }
    }
    if (e != cudaSuccess) return og_set_error(OG_ERR_BACKEND, "%s: attend launch: %s (%s)", op, cudaGetErrorName(e),
                                              cudaGetErrorString(e));
    return OG_OK;
}
