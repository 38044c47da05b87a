/* Decode products on the tensor cores: out[T, N] = x[T, K] @ W[N, K]^T
 * (+ bias) for T = 1..8 rows of x, the weights (bf16, q8 or q4) streamed
 * from memory once, as the CUDA-core gemv of ops.cu does, but with the
 * products on mma.m16n8k16 (bf16 operands, f32 accumulation): weight rows
 * are the mma's A (16 x 16), the T rows of x its B (16 x 8, columns past T
 * zero), so one instruction takes 16 features x 16 k for every row of x,
 * and a lane's loads are 16 contiguous bytes of one weight row (bf16) rather
 * than one element a row of x needs. x is carried as bf16 hi + lo (hi =
 * bf16(x), lo = bf16(x - hi): x to about 2^-16 relative, the split of
 * og_split_bf16_cuda), so the product is the f32 one up to that and the
 * order of the f32 sums.
 *
 * Letters: T rows of x, K in features, N out features of a part, F ffn width.
 *
 * Work: a block of 8 warps owns one tile of 16 output features of one part
 * (of gate and up at once for the swiglu form) and splits K among its warps:
 * a unit is the 16 rows x 32 k of one tile, warp w takes units w, w + 8, ...
 * and keeps U units of loads in flight (issued before the unit before them
 * is used; the first U before waiting for the previous kernel, since no
 * kernel writes weights). The warps' partial sums meet in shared memory and
 * warp 0 adds them in warp order, adds the bias and stores (or applies
 * silu(gate) * up). Every output's sum is the same sequence of operations
 * whatever T, the part or the form (multi, swiglu, norm prologue) is, so
 * the fused forms give the bits of the plain one, and a row's bits do not
 * depend on the other rows of x.
 *
 * The k order inside a unit: lane (g = lane / 4, c = lane % 4) holds rows g
 * and g + 8 of the tile at 8 k positions of the unit, and the mma's two k16
 * steps take them as its A fragment (row g: k = 2c, 2c + 1, 2c + 8, 2c + 9 of
 * the step; row g + 8 likewise): a permutation of the unit's 32 k, applied
 * to the weights and to x alike, chosen so that each lane's weights are one
 * load:
 *   bf16, q8  step s of lane c: k = 8 c + 4 s + 0..3   (16 bytes / 8 bytes a row)
 *   q4        step s of lane c: k = 4 c + 16 s + 0..3  (byte j of a group holds
 *             k = j (low nibble) and j + 16 (high): lane c's 4 bytes)
 * x's B fragment of lane (g, c) is row g of x at the same k. A q8/q4 unit is
 * one group of OG_QUANT_GROUP (32) weights sharing a scale: its two steps
 * go into a zeroed fragment that is then scaled into the sum (acc += scale
 * * t), as the CUDA-core kernel sums a lane's products before scaling.
 * Integers q become bf16 exactly (|q| <= 128): q4 nibbles n by the bf16
 * 128 + n (its low mantissa bits) less 136, q8 bytes through f32. */
#include "kernels/cuda/gemv_tc.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_pairs.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include <type_traits>

namespace {

using namespace og_cuda;

constexpr int kTile = 16;  /* output features of a block */
constexpr int kUnitK = 32; /* k of a unit */

/* ---- operands ---- */

__device__ inline uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

/* The bf16 pair (x0 low, x1 high) of hi = bf16(x) and lo = bf16(x - hi). */
__device__ inline void split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    hi = bits(h);
    lo = bits(__floats2bfloat162_rn(x0 - hf.x, x1 - hf.y));
}

/* c += A B: A rows g, g + 8 of the tile (a0, a2 row g; a1, a3 row g + 8),
 * B column g (b0, b1). */
__device__ inline void mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* x's B fragments of one unit: [step][b0, b1], hi and lo. */
struct xfrag {
    uint32_t hi[2][2], lo[2][2];
};

__device__ inline uint2 ld_stream8(const void *p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ inline uint32_t ld_stream4(const void *p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
/* A scale's f16 bits: converted where used, so the load stays in flight. */
__device__ inline unsigned short ld_scale(const uint16_t *p) {
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ inline float f16_bits(unsigned short v) { return __half2float(__ushort_as_half(v)); }

/* B bytes global -> shared without registers (cp.async; 16 bytes skip L1). */
template <int B>
__device__ inline void copy_async(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (B == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(B) : "memory");
}
__device__ inline void copies_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void copies_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* ---- weight formats ----
 * Each names where a lane's weights of unit 0 lie (row: the row's weights or
 * quants at the lane's offset, and its scales), the bytes of a unit of one
 * row (kUnitBytes; scales advance by one a unit), what a lane loads of a
 * unit (ld), the k offset of step s in the unit (x_at), and how a unit's
 * loads meet x (dot: acc += the unit's products). Loads take pointers to
 * the unit, so the unrolled loop's addresses are one base and constants. */
struct row_at {
    const uint8_t *q;  /* the row's weights (bf16) or quants (q8, q4), at the lane */
    const uint16_t *s; /* the row's f16 scales, one a group (q8, q4)  */
};

struct fmt_bf16 {
    static constexpr int kUnroll = 6, kUnroll2 = 3; /* units in flight, one matrix / two (128 registers) */
    static constexpr bool kBiasBf16 = true;
    struct ld {
        uint4 a, b; /* rows g, g + 8: k 8 c .. 8 c + 7 */
    };
    static constexpr int kUnitBytes = kUnitK * 2;
    __device__ static row_at row(const void *w, int64_t N, int64_t K, int64_t r, int c) {
        return row_at{static_cast<const uint8_t *>(w) + r * K * 2 + 16 * c, nullptr};
    }
    __device__ static ld load(const uint8_t *qa, const uint8_t *qb, const uint16_t *, const uint16_t *) {
        return ld{ld_stream16(qa), ld_stream16(qb)};
    }
    static constexpr int kLaneBytes = 16; /* a lane's bytes of a unit of one row */
    static constexpr bool kScaled = false;
    __device__ static ld from_ring(const uint8_t *a, const uint8_t *b, unsigned short, unsigned short) {
        return ld{*reinterpret_cast<const uint4 *>(a), *reinterpret_cast<const uint4 *>(b)};
    }
    __device__ static int x_at(int s, int c) { return 8 * c + 4 * s; }
    __device__ static void dot(const ld &l, const xfrag &xf, float acc[4]) {
        mma(acc, l.a.x, l.b.x, l.a.y, l.b.y, xf.hi[0][0], xf.hi[0][1]);
        mma(acc, l.a.x, l.b.x, l.a.y, l.b.y, xf.lo[0][0], xf.lo[0][1]);
        mma(acc, l.a.z, l.b.z, l.a.w, l.b.w, xf.hi[1][0], xf.hi[1][1]);
        mma(acc, l.a.z, l.b.z, l.a.w, l.b.w, xf.lo[1][0], xf.lo[1][1]);
    }
};

struct fmt_q8 {
    static constexpr int kUnroll = 8, kUnroll2 = 3;
    static constexpr bool kBiasBf16 = false;
    struct ld {
        uint2 a, b;               /* rows g, g + 8: quants k 8 c .. 8 c + 7 */
        unsigned short sa, sb;    /* their scales (f16) */
    };
    static constexpr int kUnitBytes = kUnitK;
    __device__ static row_at row(const void *w, int64_t N, int64_t K, int64_t r, int c) {
        const uint8_t *base = static_cast<const uint8_t *>(w);
        return row_at{base + r * K + 8 * c, reinterpret_cast<const uint16_t *>(base + N * K) + r * (K / kUnitK)};
    }
    __device__ static ld load(const uint8_t *qa, const uint8_t *qb, const uint16_t *sa, const uint16_t *sb) {
        return ld{ld_stream8(qa), ld_stream8(qb), ld_scale(sa), ld_scale(sb)};
    }
    static constexpr int kLaneBytes = 8;
    static constexpr bool kScaled = true;
    __device__ static ld from_ring(const uint8_t *a, const uint8_t *b, unsigned short sa, unsigned short sb) {
        return ld{*reinterpret_cast<const uint2 *>(a), *reinterpret_cast<const uint2 *>(b), sa, sb};
    }
    __device__ static int x_at(int s, int c) { return 8 * c + 4 * s; }
    __device__ static void dot(const ld &l, const xfrag &xf, float acc[4]) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        uint32_t a0, a1, a2, a3;
        q8_pairs(l.a.x, a0, a2);
        q8_pairs(l.b.x, a1, a3);
        mma(t, a0, a1, a2, a3, xf.hi[0][0], xf.hi[0][1]);
        mma(t, a0, a1, a2, a3, xf.lo[0][0], xf.lo[0][1]);
        q8_pairs(l.a.y, a0, a2);
        q8_pairs(l.b.y, a1, a3);
        mma(t, a0, a1, a2, a3, xf.hi[1][0], xf.hi[1][1]);
        mma(t, a0, a1, a2, a3, xf.lo[1][0], xf.lo[1][1]);
        const float sa = f16_bits(l.sa), sb = f16_bits(l.sb);
        acc[0] = fmaf(sa, t[0], acc[0]);
        acc[1] = fmaf(sa, t[1], acc[1]);
        acc[2] = fmaf(sb, t[2], acc[2]);
        acc[3] = fmaf(sb, t[3], acc[3]);
    }
};

struct fmt_q4 {
    static constexpr int kUnroll = 12, kUnroll2 = 5;
    static constexpr bool kBiasBf16 = false;
    struct ld {
        uint32_t a, b;            /* rows g, g + 8: bytes 4 c .. 4 c + 3 of the group */
        unsigned short sa, sb;    /* their scales (f16) */
    };
    static constexpr int kUnitBytes = kUnitK / 2;
    __device__ static row_at row(const void *w, int64_t N, int64_t K, int64_t r, int c) {
        const uint8_t *base = static_cast<const uint8_t *>(w);
        return row_at{base + r * (K / 2) + 4 * c,
                      reinterpret_cast<const uint16_t *>(base + N * (K / 2)) + r * (K / kUnitK)};
    }
    __device__ static ld load(const uint8_t *qa, const uint8_t *qb, const uint16_t *sa, const uint16_t *sb) {
        return ld{ld_stream4(qa), ld_stream4(qb), ld_scale(sa), ld_scale(sb)};
    }
    static constexpr int kLaneBytes = 4;
    static constexpr bool kScaled = true;
    __device__ static ld from_ring(const uint8_t *a, const uint8_t *b, unsigned short sa, unsigned short sb) {
        return ld{*reinterpret_cast<const uint32_t *>(a), *reinterpret_cast<const uint32_t *>(b), sa, sb};
    }
    __device__ static int x_at(int s, int c) { return 4 * c + 16 * s; }
    __device__ static void dot(const ld &l, const xfrag &xf, float acc[4]) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        /* bytes 0, 1 and 2, 3 of each row word, each in the low byte of a half */
        const uint32_t a01 = __byte_perm(l.a, 0, 0x4140), a23 = __byte_perm(l.a, 0, 0x4342);
        const uint32_t b01 = __byte_perm(l.b, 0, 0x4140), b23 = __byte_perm(l.b, 0, 0x4342);
        /* step 0: the low nibbles (k = 4 c + 0..3) */
        uint32_t a0 = q4_pair(a01), a2 = q4_pair(a23), a1 = q4_pair(b01), a3 = q4_pair(b23);
        mma(t, a0, a1, a2, a3, xf.hi[0][0], xf.hi[0][1]);
        mma(t, a0, a1, a2, a3, xf.lo[0][0], xf.lo[0][1]);
        /* step 1: the high nibbles (k = 16 + 4 c + 0..3) */
        a0 = q4_pair(a01 >> 4), a2 = q4_pair(a23 >> 4), a1 = q4_pair(b01 >> 4), a3 = q4_pair(b23 >> 4);
        mma(t, a0, a1, a2, a3, xf.hi[1][0], xf.hi[1][1]);
        mma(t, a0, a1, a2, a3, xf.lo[1][0], xf.lo[1][1]);
        const float sa = f16_bits(l.sa), sb = f16_bits(l.sb);
        acc[0] = fmaf(sa, t[0], acc[0]);
        acc[1] = fmaf(sa, t[1], acc[1]);
        acc[2] = fmaf(sb, t[2], acc[2]);
        acc[3] = fmaf(sb, t[3], acc[3]);
    }
};

/* ---- the kernel ---- */

struct tc_norm { /* the add + rms_norm prologue (og_gemv_cuda_norm) */
    const float *a, *b;
    const void *w;
    bool bf16;
    float eps;
    float *sum;
};

struct tc_params {
    const void *w[OG_GEMV_CUDA_MAX_PARTS];
    const void *bias[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1]; /* part i owns tiles first[i] .. first[i + 1] - 1 */
    int n;
    const float *x;
    tc_norm nm;
    int64_t T, K;
    int slots;  /* split kernel: ring slots a warp takes */
    int64_t nl; /* split kernel: units of x a block stages a row */
};

/* Where x comes from: read from memory by each lane as a unit needs it
 * (X_GLOBAL, when the staged copy does not fit), or staged once per block in
 * shared memory as the B fragments themselves (X_STAGED: split into hi and
 * lo and put in each lane's order, so a lane's fragments of a unit are two
 * 16-byte loads and the split is done once a block rather than once a unit),
 * by the add + rms_norm prologue when there is one (X_NORM). */
enum { X_GLOBAL = 0, X_STAGED = 1, X_NORM = 2 };

/* The staged copy: for row t of x, unit u and lane column c, the 8 values of
 * the lane's two steps (k = u * 32 + x_at(s, c) + 0..3, s = 0, 1) as bf16
 * hi, then as bf16 lo, 16 bytes each: [T][units][4] granules of each. */
struct xstage {
    uint4 *hi, *lo;
};

template <class F>
__device__ inline void stage_granule(const xstage &xs, int64_t i, const float v[8]) {
    uint4 h, l;
    split2(v[0], v[1], h.x, l.x);
    split2(v[2], v[3], h.y, l.y);
    split2(v[4], v[5], h.z, l.z);
    split2(v[6], v[7], h.w, l.w);
    xs.hi[i] = h;
    xs.lo[i] = l;
}

/* x (T rows of K) into the staged copy. */
template <class F, int NT>
__device__ void stage_x(const float *x, int64_t T, int64_t K, const xstage &xs) {
    const int64_t units = K / kUnitK, n = T * units * 4;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const int64_t t = i / (units * 4), u = (i / 4) % units;
        const int c = (int)(i & 3);
        const float *xr = x + t * K + u * kUnitK;
        const float4 a = *reinterpret_cast<const float4 *>(xr + F::x_at(0, c));
        const float4 b = *reinterpret_cast<const float4 *>(xr + F::x_at(1, c));
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        stage_granule<F>(xs, i, v);
    }
}

/* x = rms_norm(a + b) into the staged copy, with the bits of
 * add_rms_norm_kernel: that kernel runs 256 threads a row, so each of the NT
 * threads here stands for threads tid, tid + NT, ... of it, sums as it does
 * (in k order, fmaf), and the 8 warp sums are added as block_sum adds them.
 * Block 0 writes sum = a + b. */
template <int NT>
__device__ void norm_scales(const tc_norm &nm, int64_t T, int64_t K, float *rs) {
    constexpr int kNormThreads = 256, kV = kNormThreads / NT;
    __shared__ float part[kNormThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t t = 0; t < T; t++) {
        const int64_t base = t * K;
#pragma unroll
        for (int h = 0; h < kV; h++) {
            float sq = 0.0f;
            for (int64_t i = threadIdx.x + h * NT; i < K; i += kNormThreads) {
                const float v = nm.a[base + i] + nm.b[base + i];
                if (blockIdx.x == 0) nm.sum[base + i] = v;
                sq = fmaf(v, v, sq);
            }
            sq = warp_sum(sq);
            if (lane == 0) part[warp + h * (NT / 32)] = sq;
        }
        __syncthreads();
        if (warp == 0) {
            float v = lane < kNormThreads / 32 ? part[lane] : 0.0f;
            v = warp_sum(v);
            if (lane == 0) rs[t] = 1.0f / sqrtf(v / (float)K + nm.eps);
        }
        __syncthreads();
    }
}

/* The normed x into the staged copy (rs: norm_scales'). */
template <class F>
__device__ inline void stage_normed(const tc_norm &nm, int64_t K, int64_t t, int64_t u, int c, const float *rs,
                                    const xstage &xs, int64_t i) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int64_t k = u * kUnitK + F::x_at(e / 4, c) + (e & 3);
        v[e] = ((nm.a[t * K + k] + nm.b[t * K + k]) * rs[t]) * load_w(nm.w, nm.bf16, k);
    }
    stage_granule<F>(xs, i, v);
}

template <class F, int NT>
__device__ void stage_norm(const tc_norm &nm, int64_t T, int64_t K, const xstage &xs) {
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
    norm_scales<NT>(nm, T, K, rs);
    const int64_t units = K / kUnitK, n = T * units * 4;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const int64_t t = i / (units * 4), u = (i / 4) % units;
        stage_normed<F>(nm, K, t, u, (int)(i & 3), rs, xs, i);
    }
}

/* x's fragments of a unit, read from memory; xu: the lane's row of x at the
 * unit (NULL past T). */
template <class F>
__device__ inline void load_x(const float *xu, int c, xfrag &xf) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xu) v = *reinterpret_cast<const float4 *>(xu + F::x_at(s, c));
        split2(v.x, v.y, xf.hi[s][0], xf.lo[s][0]);
        split2(v.z, v.w, xf.hi[s][1], xf.lo[s][1]);
    }
}

/* The same from the staged copy; i: the lane's granule (< 0 past T). */
__device__ inline void load_x_staged(const xstage &xs, int64_t i, xfrag &xf) {
    uint4 h = make_uint4(0, 0, 0, 0), l = make_uint4(0, 0, 0, 0);
    if (i >= 0) h = xs.hi[i], l = xs.lo[i];
    xf.hi[0][0] = h.x, xf.hi[0][1] = h.y, xf.hi[1][0] = h.z, xf.hi[1][1] = h.w;
    xf.lo[0][0] = l.x, xf.lo[0][1] = l.y, xf.lo[1][0] = l.z, xf.lo[1][1] = l.w;
}

/* Bytes of shared memory the staged copy of T rows of K takes, and the most
 * the register kernel stages (two blocks of 8 warps still fit an SM's 227 KB
 * beside their reduction space). */
constexpr int64_t stage_bytes(int64_t T, int64_t K) { return T * K * 4; }
constexpr int64_t kStageMax = 96 * 1024;

/* The warps' sums of the block's tile meet in shared memory; warp 0 adds
 * them in warp order, adds the bias and stores (NM = 2: silu(gate) * up). */
template <class F, int NM, int W>
__device__ inline void finish(const tc_params &p, int part, int64_t N, int64_t r0, int64_t r1, const float acc[NM][4]) {
    __shared__ float red[W][NM][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane & 3;
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][m][i][lane] = acc[m][i];
    __syncthreads();
    if (warp != 0) return;
    float s[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = red[0][m][i][lane];
#pragma unroll
            for (int w = 1; w < W; w++) v += red[w][m][i][lane];
            s[m][i] = v;
        }
    /* fragment element i: row r0 (i < 2) or r1, token 2 c + (i & 1) */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = i < 2 ? r0 : r1;
        const int64_t t = 2 * c + (i & 1);
        if (r >= N || t >= p.T) continue;
        float v[NM];
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const void *b = p.bias[part + m];
            v[m] = s[m][i] + (b ? load_w(b, F::kBiasBf16, r) : 0.0f);
        }
        if (NM == 1) p.out[part][t * N + r] = v[0];
        else p.out[0][t * N + r] = v[0] / (1.0f + expf(-v[0])) * v[NM - 1];
    }
}

/* NM = 1: the tile of one part; NM = 2: the same tile of gate (part 0) and up
 * (part 1), stored as silu(gate) * up. W warps a block. */
template <class F, int NM, int W, int XM>
__global__ void __launch_bounds__(32 * W, 8 / W * 2) gemv_tc_kernel(tc_params p) {
    constexpr int NT = 32 * W;
    extern __shared__ uint4 stage_mem[];
    constexpr int U = NM == 1 ? F::kUnroll : F::kUnroll2;
    int part = 0;
    if (NM == 1)
        while (part + 1 < p.n && (int64_t)blockIdx.x >= p.first[part + 1]) part++;
    const int64_t tile = blockIdx.x - p.first[part], N = p.N[part], K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t r0 = tile * kTile + g, r1 = r0 + 8;
    /* rows past N read the last one and store nothing; each pointer is at
     * the warp's first unit and moves U units of the block a round */
    const uint8_t *qa[NM], *qb[NM];
    const uint16_t *sa[NM], *sb[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const row_at a = F::row(p.w[part + m], N, K, r0 < N ? r0 : N - 1, c);
        const row_at b = F::row(p.w[part + m], N, K, r1 < N ? r1 : N - 1, c);
        qa[m] = a.q + warp * F::kUnitBytes, qb[m] = b.q + warp * F::kUnitBytes;
        sa[m] = a.s + warp, sb[m] = b.s + warp;
    }
    constexpr int kStep = F::kUnitBytes * W; /* bytes from a warp's unit to its next */
    const int units = (int)(K / kUnitK);
    typename F::ld buf[NM][U];
#pragma unroll
    for (int j = 0; j < U; j++)
        if (warp + j * W < units)
#pragma unroll
            for (int m = 0; m < NM; m++)
                buf[m][j] = F::load(qa[m] + j * kStep, qb[m] + j * kStep, sa[m] + j * W, sb[m] + j * W);
    grid_wait();
    const xstage xs = {stage_mem, stage_mem + p.T * K / 8};
    if (XM == X_STAGED) stage_x<F, NT>(p.x, p.T, K, xs);
    if (XM == X_NORM) stage_norm<F, NT>(p.nm, p.T, K, xs);
    if (XM != X_GLOBAL) __syncthreads();
    /* the lane's row of x at the warp's first unit: a pointer, or a granule */
    const float *xr = XM == X_GLOBAL && g < p.T ? p.x + g * K + warp * kUnitK : nullptr;
    int64_t xi = g < p.T ? ((int64_t)g * units + warp) * 4 + c : -1;
    float acc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    for (int u0 = warp; u0 < units; u0 += U * W) {
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (u0 + j * W >= units) break;
            typename F::ld cur[NM];
#pragma unroll
            for (int m = 0; m < NM; m++) cur[m] = buf[m][j];
            if (u0 + (U + j) * W < units)
#pragma unroll
                for (int m = 0; m < NM; m++)
                    buf[m][j] = F::load(qa[m] + (U + j) * kStep, qb[m] + (U + j) * kStep, sa[m] + (U + j) * W,
                                        sb[m] + (U + j) * W);
            xfrag xf;
            if (XM == X_GLOBAL) load_x<F>(xr ? xr + j * W * kUnitK : nullptr, c, xf);
            else load_x_staged(xs, xi >= 0 ? xi + j * W * 4 : -1, xf);
#pragma unroll
            for (int m = 0; m < NM; m++) F::dot(cur[m], xf, acc[m]);
        }
#pragma unroll
        for (int m = 0; m < NM; m++) {
            qa[m] += U * kStep, qb[m] += U * kStep;
            sa[m] += U * W, sb[m] += U * W;
        }
        if (xr) xr += U * W * kUnitK;
        if (xi >= 0) xi += U * W * 4;
    }
    finish<F, NM, W>(p, part, N, r0, r1, acc);
}

/* The same product with the weights in flight held in shared memory
 * rather than registers: each warp has a ring of S units (a lane's bytes of
 * rows g and g + 8, per matrix) filled by cp.async, so a block keeps its
 * rings' bytes of loads in flight (80 KB, or 56 KB beside a staged x of up
 * to 48 KB; the register kernel's 128-register bound allows 48 KB) at no
 * cost in registers. A lane reads back only what
 * it copied itself, so its own wait_group is the only synchronisation; a
 * slot is refilled after the unit it held has been used. q8/q4 scales (2
 * bytes, below cp.async's 4) stay in a ring of registers. The sums are those
 * of gemv_tc_kernel, unit for unit. */
template <class F, int NM, int W, int RKB>
constexpr int ring_units() {
    /* the scales' register ring (2 NM S registers) stays within 40 */
    constexpr int s = RKB * 1024 / (W * NM * 2 * 32 * F::kLaneBytes), most = F::kScaled ? 20 / NM : 24;
    return s < most ? s : most;
}

/* RKB: the rings' kilobytes a block */
template <class F, int NM, int W, int XM, int RKB>
__global__ void __launch_bounds__(32 * W, 8 / W * 2) gemv_tc_ring_kernel(tc_params p) {
    constexpr int NT = 32 * W, S = ring_units<F, NM, W, RKB>(), LB = F::kLaneBytes;
    constexpr int kWarpRing = S * NM * 2 * 32 * LB;
    extern __shared__ uint4 dyn[];
    int part = 0;
    if (NM == 1)
        while (part + 1 < p.n && (int64_t)blockIdx.x >= p.first[part + 1]) part++;
    const int64_t tile = blockIdx.x - p.first[part], N = p.N[part], K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t r0 = tile * kTile + g, r1 = r0 + 8;
    uint8_t *ring = reinterpret_cast<uint8_t *>(dyn) + warp * kWarpRing + lane * LB;
    /* the lane's bytes of slot j, matrix m, row r (0: g, 1: g + 8) */
    const auto slot = [&](int jj, int m, int r) { return ring + ((jj * NM + m) * 2 + r) * 32 * LB; };
    const uint8_t *qa[NM], *qb[NM];
    const uint16_t *sa[NM], *sb[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const row_at a = F::row(p.w[part + m], N, K, r0 < N ? r0 : N - 1, c);
        const row_at b = F::row(p.w[part + m], N, K, r1 < N ? r1 : N - 1, c);
        qa[m] = a.q + warp * F::kUnitBytes, qb[m] = b.q + warp * F::kUnitBytes;
        sa[m] = a.s + warp, sb[m] = b.s + warp;
    }
    constexpr int kStep = F::kUnitBytes * W;
    const int units = (int)(K / kUnitK);
    unsigned short sca[NM][S], scb[NM][S];
#pragma unroll
    for (int j = 0; j < S; j++) {
        if (warp + j * W < units)
#pragma unroll
            for (int m = 0; m < NM; m++) {
                copy_async<LB>(slot(j, m, 0), qa[m] + j * kStep);
                copy_async<LB>(slot(j, m, 1), qb[m] + j * kStep);
                if (F::kScaled) sca[m][j] = ld_scale(sa[m] + j * W), scb[m][j] = ld_scale(sb[m] + j * W);
            }
        copies_commit(); /* one group a slot, empty or not: the wait below counts them */
    }
    grid_wait();
    const xstage xs = {dyn + W * kWarpRing / 16, dyn + W * kWarpRing / 16 + p.T * K / 8};
    if (XM == X_STAGED) stage_x<F, NT>(p.x, p.T, K, xs);
    if (XM == X_NORM) stage_norm<F, NT>(p.nm, p.T, K, xs);
    if (XM != X_GLOBAL) __syncthreads();
    const float *xr = XM == X_GLOBAL && g < p.T ? p.x + g * K + warp * kUnitK : nullptr;
    int64_t xi = g < p.T ? ((int64_t)g * units + warp) * 4 + c : -1;
    float acc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    for (int u0 = warp; u0 < units; u0 += S * W) {
#pragma unroll
        for (int j = 0; j < S; j++) {
            if (u0 + j * W >= units) break;
            copies_wait<S - 1>(); /* slot j's group is the oldest of S */
            typename F::ld cur[NM];
#pragma unroll
            for (int m = 0; m < NM; m++)
                cur[m] = F::from_ring(slot(j, m, 0), slot(j, m, 1), F::kScaled ? sca[m][j] : 0,
                                      F::kScaled ? scb[m][j] : 0);
            xfrag xf;
            if (XM == X_GLOBAL) load_x<F>(xr ? xr + j * W * kUnitK : nullptr, c, xf);
            else load_x_staged(xs, xi >= 0 ? xi + j * W * 4 : -1, xf);
#pragma unroll
            for (int m = 0; m < NM; m++) F::dot(cur[m], xf, acc[m]);
            /* the slot is free once its values were used (dot read them) */
            if (u0 + (S + j) * W < units)
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    copy_async<LB>(slot(j, m, 0), qa[m] + (S + j) * kStep);
                    copy_async<LB>(slot(j, m, 1), qb[m] + (S + j) * kStep);
                    if (F::kScaled)
                        sca[m][j] = ld_scale(sa[m] + (S + j) * W), scb[m][j] = ld_scale(sb[m] + (S + j) * W);
                }
            copies_commit();
        }
#pragma unroll
        for (int m = 0; m < NM; m++) {
            qa[m] += S * kStep, qb[m] += S * kStep;
            sa[m] += S * W, sb[m] += S * W;
        }
        if (xr) xr += S * W * kUnitK;
        if (xi >= 0) xi += S * W * 4;
    }
    copies_wait<0>();
    finish<F, NM, W>(p, part, N, r0, r1, acc);
}

/* ---- split-K over a cluster (bf16; OG_CUDA_GEMV_SPLIT=1, off by default) ----
 * The products above run one block a tile: the 8B q/k/v, o and down
 * products are a single wave of blocks, whose ramp and tail leave the memory
 * idle (0.68-0.77 of the copy rate against 0.86-0.93 for the many-wave gate/up
 * and head). Here a tile's K is split among S = 1, 2 or 4 blocks of one
 * thread-block cluster, so a launch has S times the blocks, each with 1/S of
 * the bytes and of x to stage, and the blocks' partial sums meet through
 * distributed shared memory: no scratch in global memory, no counters, and
 * nothing a captured graph must reset.
 *
 * The sum does not depend on S: a tile's units (32 k each) belong to 32
 * chains, unit u to chain u % 32, and each chain is summed in unit order in
 * one accumulator; block b of the cluster holds chains b 32 / S .. (b + 1) 32 /
 * S - 1, CW = 32 / (8 S) of them a warp. The cluster's block 0 then adds the
 * 32 chains' values in chain order (read from the other blocks' shared memory),
 * adds the bias and stores (or applies silu(gate) * up). So S may follow the
 * launch's shape (its tile count) and the split kernel still gives every
 * output the same bits whatever S, T, the part or the form is (the fused
 * forms are the plain one's bits, a row's bits do not depend on other rows);
 * those bits differ from the unsplit kernels' (other sums), within the same
 * bound. With the add + rms_norm prologue every block computes the norm's
 * scales over all of K (stage_norm's bits) and stages its chains.
 *
 * A warp's units, in order: n = 0, 1, ... is unit (n / CW) 32 + c0 + n % CW
 * (c0: its first chain), in a ring of `slots` (a multiple of CW, at most R)
 * filled by cp.async as in gemv_tc_ring_kernel; slot j's unit feeds
 * accumulator j % CW. A block's ring is sized to its units (a block of 1/4
 * of a 4096-wide tile takes 32 KB, not 80), so more blocks fit an SM. x is
 * staged (its split fragments) for the block's chains only. */
constexpr int kChains = 32;

template <class F, int NM, int W, int CW>
constexpr int split_slots() {
    return ring_units<F, NM, W, 80>() / CW * CW;
}

/* The block's chains of x into the staged copy: local unit l (of nl a row)
 * is unit (l / kLocal) 32 + rank kLocal + l % kLocal. */
template <class F, int NT>
__device__ void stage_x_split(const float *x, int64_t T, int64_t K, int64_t nl, int kLocal, int rank,
                              const xstage &xs) {
    const int64_t units = K / kUnitK, n = T * nl * 4;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const int64_t t = i / (nl * 4), l = (i / 4) % nl;
        const int64_t u = (l / kLocal) * kChains + rank * kLocal + l % kLocal;
        if (u >= units) continue; /* past K: never read */
        const int c = (int)(i & 3);
        const float *xr = x + t * K + u * kUnitK;
        const float4 a = *reinterpret_cast<const float4 *>(xr + F::x_at(0, c));
        const float4 b = *reinterpret_cast<const float4 *>(xr + F::x_at(1, c));
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        stage_granule<F>(xs, i, v);
    }
}

/* The same for the add + rms_norm prologue: the scales over all of K (the
 * bits of stage_norm), then the block's chains. */
template <class F, int NT>
__device__ void stage_norm_split(const tc_norm &nm, int64_t T, int64_t K, int64_t nl, int kLocal, int rank,
                                 const xstage &xs) {
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
    norm_scales<NT>(nm, T, K, rs);
    const int64_t units = K / kUnitK, n = T * nl * 4;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const int64_t t = i / (nl * 4), l = (i / 4) % nl;
        const int64_t u = (l / kLocal) * kChains + rank * kLocal + l % kLocal;
        if (u < units) stage_normed<F>(nm, K, t, u, (int)(i & 3), rs, xs, i);
    }
}

template <class F, int NM, int W, int XM, int CW>
__global__ void __launch_bounds__(32 * W, CW == 4 || XM == X_NORM ? 2 : CW == 2 ? 3 : 4) gemv_tc_split_kernel(tc_params p) {
    constexpr int S = kChains / (W * CW), kLocal = kChains / S, R = split_slots<F, NM, W, CW>();
    constexpr int NT = 32 * W, LB = F::kLaneBytes;
    static_assert(S * W * CW == kChains && R >= CW, "split shape");
    extern __shared__ uint4 dyn[];
    const int rank = (int)(blockIdx.x % S);
    const int64_t tile_all = blockIdx.x / S;
    int part = 0;
    if (NM == 1)
        while (part + 1 < p.n && tile_all >= p.first[part + 1]) part++;
    const int64_t tile = tile_all - p.first[part], N = p.N[part], K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t r0 = tile * kTile + g, r1 = r0 + 8;
    const int slots = p.slots, wring = slots * NM * 2 * 32 * LB;
    uint8_t *ring = reinterpret_cast<uint8_t *>(dyn) + warp * wring + lane * LB;
    const auto slot = [&](int jj, int m, int r) { return ring + ((jj * NM + m) * 2 + r) * 32 * LB; };
    const int c0 = rank * kLocal + warp * CW; /* the warp's first chain */
    const int units = (int)(K / kUnitK), adv = slots / CW * kChains; /* units from a slot's unit to its refill's */
    const uint8_t *qa[NM], *qb[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        qa[m] = F::row(p.w[part + m], N, K, r0 < N ? r0 : N - 1, c).q;
        qb[m] = F::row(p.w[part + m], N, K, r1 < N ? r1 : N - 1, c).q;
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        const int u = (j / CW) * kChains + c0 + j % CW;
        if (j < slots && u < units)
#pragma unroll
            for (int m = 0; m < NM; m++) {
                copy_async<LB>(slot(j, m, 0), qa[m] + (int64_t)u * F::kUnitBytes);
                copy_async<LB>(slot(j, m, 1), qb[m] + (int64_t)u * F::kUnitBytes);
            }
        copies_commit(); /* R groups a round, empty or not: the waits count them */
    }
    grid_wait();
    const int64_t nl = p.nl;
    const int64_t ring_all = (int64_t)W * wring / 16;
    const xstage xs = {dyn + ring_all, dyn + ring_all + p.T * nl * 4};
    if (XM == X_STAGED) stage_x_split<F, NT>(p.x, p.T, K, nl, kLocal, rank, xs);
    if (XM == X_NORM) stage_norm_split<F, NT>(p.nm, p.T, K, nl, kLocal, rank, xs);
    if (XM != X_GLOBAL) __syncthreads();
    float acc[CW][NM][4];
#pragma unroll
    for (int k = 0; k < CW; k++)
#pragma unroll
        for (int m = 0; m < NM; m++) acc[k][m][0] = acc[k][m][1] = acc[k][m][2] = acc[k][m][3] = 0.0f;
    for (int q0 = 0; q0 * kChains + c0 < units; q0 += slots / CW) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            const int q = q0 + j / CW, u = q * kChains + c0 + j % CW;
            if (j >= slots || u >= units) break;
            copies_wait<R - 1>(); /* slot j's group is the oldest of R */
            typename F::ld cur[NM];
#pragma unroll
            for (int m = 0; m < NM; m++) cur[m] = F::from_ring(slot(j, m, 0), slot(j, m, 1), 0, 0);
            xfrag xf;
            if (XM == X_GLOBAL) load_x<F>(g < p.T ? p.x + g * K + (int64_t)u * kUnitK : nullptr, c, xf);
            else load_x_staged(xs, g < p.T ? ((int64_t)g * nl + q * kLocal + warp * CW + j % CW) * 4 + c : -1, xf);
#pragma unroll
            for (int m = 0; m < NM; m++) F::dot(cur[m], xf, acc[j % CW][m]);
            if (u + adv < units)
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    copy_async<LB>(slot(j, m, 0), qa[m] + (int64_t)(u + adv) * F::kUnitBytes);
                    copy_async<LB>(slot(j, m, 1), qb[m] + (int64_t)(u + adv) * F::kUnitBytes);
                }
            copies_commit();
        }
        for (int e = slots; e < R; e++) copies_commit(); /* keep R groups a round */
    }
    copies_wait<0>();
    __syncthreads(); /* every ring read: the rings hold the chains' values now */
    /* chain values [kLocal][NM][4][32] at the start of the block's rings
     * (they take at most half of them: 512 NM bytes a chain against a ring
     * of 1024 NM bytes a slot, slots >= CW a warp) */
    float *cv = reinterpret_cast<float *>(dyn);
#pragma unroll
    for (int k = 0; k < CW; k++)
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) cv[(((warp * CW + k) * NM + m) * 4 + i) * 32 + lane] = acc[k][m][i];
    namespace cg = cooperative_groups;
    if (S > 1) cg::this_cluster().sync();
    else __syncthreads();
    if (rank == 0 && threadIdx.x < 128) {
        /* thread (i, ln): fragment element i of lane ln of every warp */
        const int i = threadIdx.x >> 5, ln = threadIdx.x & 31;
        float v[NM];
#pragma unroll
        for (int m = 0; m < NM; m++) v[m] = 0.0f;
#pragma unroll 8
        for (int ch = 0; ch < kChains; ch++) {
            const float *src = cv;
            if (S > 1) src = cg::this_cluster().map_shared_rank(cv, ch / kLocal);
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const float e = src[(((ch % kLocal) * NM + m) * 4 + i) * 32 + ln];
                v[m] = ch == 0 ? e : v[m] + e;
            }
        }
        const int64_t r = (i < 2 ? r0 - g : r1 - g) + (ln >> 2); /* the row of lane ln */
        const int64_t t = 2 * (ln & 3) + (i & 1);
        if (r < N && t < p.T) {
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const void *b = p.bias[part + m];
                v[m] += b ? load_w(b, F::kBiasBf16, r) : 0.0f;
            }
            if (NM == 1) p.out[part][t * N + r] = v[0];
            else p.out[0][t * N + r] = v[0] / (1.0f + expf(-v[0])) * v[NM - 1];
        }
    }
    if (S > 1) cg::this_cluster().sync(); /* block 0 has read the others' chains */
}

/* Shared memory of a launch: the ring kernel's rings (RKB > 0; 0 is the
 * register kernel), and the staged x (X_STAGED, X_NORM). */
template <class F, int NM, int W, int RKB>
constexpr int64_t ring_bytes() {
    return RKB ? (int64_t)W * ring_units<F, NM, W, RKB>() * NM * 2 * 32 * F::kLaneBytes : 0;
}

/* Every kernel asks for the most dynamic shared memory it may take once:
 * past 48 KB, dynamic and static together, a launch needs it (the down
 * product of an 8B model stages exactly 48 KB of x beside 4 KB of its own). */
template <class F, int NM, int W, int XM, int RKB>
og_status launch_kernel(const og_gemv_tc_launch *l, const tc_params &p, unsigned blocks) {
    const size_t smem = (size_t)(ring_bytes<F, NM, W, RKB>() + (XM == X_GLOBAL ? 0 : stage_bytes(l->T, l->K)));
    void (*kernel)(tc_params) = gemv_tc_kernel<F, NM, W, XM>;
    if constexpr (RKB > 0) kernel = gemv_tc_ring_kernel<F, NM, W, XM, RKB>;
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(ring_bytes<F, NM, W, RKB>() + kStageMax));
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemv_cuda: %zu bytes of shared memory refused: %s", smem,
                            cudaGetErrorString(allowed));
    }
    launch_pdl_smem(kernel, dim3(blocks), dim3(32 * W), smem, l->stream, p);
    return launched("gemv_cuda");
}

/* Which kernel: OG_CUDA_GEMV=regs keeps the weights in flight in registers
 * (gemv_tc_kernel), the default holds them in shared memory rings. */
bool ring_wanted() {
    static const bool on = [] {
        const char *v = getenv("OG_CUDA_GEMV");
        return !(v && !strcmp(v, "regs"));
    }();
    return on;
}

/* With the rings, x is staged in shared memory when two blocks an SM still
 * fit (x <= 24 KB beside 80 KB of rings, <= 48 KB beside 56 KB; the norm
 * prologue always stages: og_gemv_cuda_norm_fits bounds it); past that it is
 * read from memory a unit at a time, which costs: a unit waits for its x. */
template <class F, int NM, int W>
og_status launch_ring(const og_gemv_tc_launch *l, const tc_params &p, unsigned blocks) {
    const int64_t x = stage_bytes(l->T, l->K);
    if (l->norm) return launch_kernel<F, NM, W, X_NORM, 80>(l, p, blocks);
    if (x <= 24 * 1024) return launch_kernel<F, NM, W, X_STAGED, 80>(l, p, blocks);
    if (x <= 48 * 1024) return launch_kernel<F, NM, W, X_STAGED, 56>(l, p, blocks);
    return launch_kernel<F, NM, W, X_GLOBAL, 80>(l, p, blocks);
}

template <class F, int NM, int W>
og_status launch_regs(const og_gemv_tc_launch *l, const tc_params &p, unsigned blocks) {
    if (l->norm) return launch_kernel<F, NM, W, X_NORM, 0>(l, p, blocks);
    if (stage_bytes(l->T, l->K) <= kStageMax) return launch_kernel<F, NM, W, X_STAGED, 0>(l, p, blocks);
    return launch_kernel<F, NM, W, X_GLOBAL, 0>(l, p, blocks);
}

/* ---- the split kernel's launch ---- */

/* The split kernel's settings: on or off (OG_CUDA_GEMV_SPLIT=1 turns it on),
 * the blocks a tile (OG_CUDA_GEMV_SPLITS=1, 2 or 4; 0: chosen from the
 * shape) and a cap on a block's rings in KB (OG_CUDA_GEMV_SPLIT_RING; 0:
 * none), read once; og_gemv_cuda_set_split overrides them. */
struct split_cfg {
    bool on;
    int splits, ring_kb;
};

int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : 0;
}

split_cfg split_override = {false, 0, 0};
bool split_overridden = false;

split_cfg split_wanted() {
    static const split_cfg env = {env_int("OG_CUDA_GEMV_SPLIT") == 1, env_int("OG_CUDA_GEMV_SPLITS"),
                                  env_int("OG_CUDA_GEMV_SPLIT_RING")};
    return split_overridden ? split_override : env;
}

/* Blocks a tile: 4 while a launch has fewer than 1024 blocks (about 8 an SM
 * of 132: the last wave is a small part of the time), and each block still
 * reads at least 16 KB of weights; 1 for launches of many tiles (the LM head,
 * gate/up of a 32B model) whose single-block tiles already stream well. */
int split_count(int64_t tiles, int64_t K, int NM, int forced) {
    if (forced == 1 || forced == 2 || forced == 4) return forced;
    int s = 1;
    while (s < 4 && tiles * s < 1024 && kTile * (K / (2 * s)) * 2 * NM >= 16 * 1024) s *= 2;
    return s;
}

template <int NM, int XM, int CW>
og_status launch_split_kernel(const og_gemv_tc_launch *l, tc_params p, unsigned blocks, size_t smem) {
    using F = fmt_bf16;
    constexpr int W = 8, S = kChains / (W * CW);
    void (*kernel)(tc_params) = gemv_tc_split_kernel<F, NM, W, XM, CW>;
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemv_cuda: %zu bytes of shared memory refused: %s", smem,
                            cudaGetErrorString(allowed));
    }
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = S;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks * S);
    cfg.blockDim = dim3(32 * W);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = l->stream;
    cfg.attrs = attr;
    cfg.numAttrs = S > 1 ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, p);
    return launched("gemv_cuda");
}

/* x is staged for the block's chains when that and the rings fit twice an
 * SM (104 KB a block), else read from memory a unit at a time. */
template <int NM, int CW>
og_status launch_split_cw(const og_gemv_tc_launch *l, tc_params p, unsigned tiles, int ring_kb) {
    using F = fmt_bf16;
    constexpr int W = 8, S = kChains / (W * CW), R = split_slots<F, NM, W, CW>();
    constexpr int64_t kSlotBytes = (int64_t)NM * 2 * 32 * F::kLaneBytes; /* a warp's slot */
    const int64_t units = p.K / kUnitK, rounds = (units + kChains - 1) / kChains;
    int64_t slots = rounds * CW < R ? rounds * CW : R; /* a warp's units, at most */
    if (ring_kb > 0) {
        const int64_t cap = (int64_t)ring_kb * 1024 / (W * kSlotBytes) / CW * CW;
        slots = cap < slots ? (cap > CW ? cap : CW) : slots;
    }
    p.slots = (int)slots;
    p.nl = rounds * (kChains / S);
    if ((int64_t)tiles * S > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "gemv_cuda: %lld blocks", (long long)tiles * S);
    const int64_t ring = W * slots * kSlotBytes, stage = l->T * p.nl * kUnitK * 4;
    if (l->norm) return launch_split_kernel<NM, X_NORM, CW>(l, p, tiles, (size_t)(ring + stage));
    if (ring + stage <= 104 * 1024) return launch_split_kernel<NM, X_STAGED, CW>(l, p, tiles, (size_t)(ring + stage));
    return launch_split_kernel<NM, X_GLOBAL, CW>(l, p, tiles, (size_t)ring);
}

template <int NM>
og_status launch_split(const og_gemv_tc_launch *l, const tc_params &p, unsigned tiles, const split_cfg &cfg) {
    switch (split_count(tiles, l->K, NM, cfg.splits)) {
    case 1: return launch_split_cw<NM, 4>(l, p, tiles, cfg.ring_kb);
    case 2: return launch_split_cw<NM, 2>(l, p, tiles, cfg.ring_kb);
    default: return launch_split_cw<NM, 1>(l, p, tiles, cfg.ring_kb);
    }
}

/* Blocks of 8 warps: one block keeps 8 x U units in flight (48 KB of bf16
 * weights in registers, 80 KB in the rings), enough to hold most of an SM's
 * share of the bandwidth alone, so the blocks of a last, partial wave do not
 * leave the memory idle. */
template <class F>
og_status launch_fmt(const og_gemv_tc_launch *l, const tc_params &p, unsigned blocks) {
    if constexpr (std::is_same<F, fmt_bf16>::value) {
        const split_cfg cfg = split_wanted();
        if (cfg.on)
            return l->swiglu ? launch_split<2>(l, p, blocks, cfg) : launch_split<1>(l, p, blocks, cfg);
    }
    if (ring_wanted())
        return l->swiglu ? launch_ring<F, 2, 8>(l, p, blocks) : launch_ring<F, 1, 8>(l, p, blocks);
    return l->swiglu ? launch_regs<F, 2, 8>(l, p, blocks) : launch_regs<F, 1, 8>(l, p, blocks);
}

bool tc_wanted() {
    static const bool on = [] {
        const char *v = getenv("OG_CUDA_GEMV");
        return !(v && !strcmp(v, "cores"));
    }();
    return on;
}

} /* namespace */

bool og_gemv_tc_takes(og_dtype dtype, int64_t T, int64_t K, const float *x, const void *const *w, int n_w) {
    if (dtype != OG_DTYPE_BF16 && dtype != OG_DTYPE_Q8 && dtype != OG_DTYPE_Q4) return false;
    /* one row of x by q8/q4 weights: the CUDA-core kernel streams them
     * faster (measured 0.3-0.9 of the copy rate against 0.2-0.35: turning
     * quants into bf16 operands costs more issue slots than the products) */
    if (dtype != OG_DTYPE_BF16 && T == 1) return false;
    if (T < 1 || T > OG_GEMV_CUDA_MAX_T || K < kUnitK || K % kUnitK || !tc_wanted()) return false;
    if (x && !aligned16(x)) return false;
    for (int i = 0; i < n_w; i++)
        if (!aligned16(w[i])) return false;
    return true;
}

og_status og_gemv_tc_run(const og_gemv_tc_launch *l) {
    tc_params p;
    memset(&p, 0, sizeof p);
    const int n = l->swiglu ? 2 : l->n_parts;
    int64_t tiles = 0;
    for (int i = 0; i < n; i++) {
        p.w[i] = l->w[i];
        p.bias[i] = l->bias[i];
        p.out[i] = l->out[i];
        p.N[i] = l->N[i];
        p.first[i] = tiles;
        if (!l->swiglu || i == 0) tiles += (l->N[i] + kTile - 1) / kTile;
    }
    p.first[n] = tiles;
    p.n = l->swiglu ? 1 : n;
    p.x = l->x;
    p.T = l->T;
    p.K = l->K;
    if (l->norm)
        p.nm = tc_norm{l->norm->a, l->norm->b, l->norm->weight, l->norm->weight_dtype == OG_DTYPE_BF16, l->norm->eps,
                       l->norm->sum};
    if (tiles > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "gemv_cuda: %lld tiles", (long long)tiles);
    const unsigned blocks = (unsigned)tiles;
    switch (l->dtype) {
    case OG_DTYPE_BF16: return launch_fmt<fmt_bf16>(l, p, blocks);
    case OG_DTYPE_Q8: return launch_fmt<fmt_q8>(l, p, blocks);
    default: return launch_fmt<fmt_q4>(l, p, blocks);
    }
}

extern "C" void og_gemv_cuda_set_split(int mode, int splits, int ring_kb) {
    split_overridden = mode >= 0;
    split_override = split_cfg{mode == 1, splits, ring_kb};
}
