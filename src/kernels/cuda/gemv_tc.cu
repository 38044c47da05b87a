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

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

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

/* Streamed weights: read once, so they skip L1. */
__device__ inline uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
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

/* The bf16 pairs of the four q8 bytes of word v (two's complement). */
__device__ inline void q8_pairs(uint32_t v, uint32_t &p01, uint32_t &p23) {
    const uint32_t f = v ^ 0x80808080u; /* q + 128 */
    const float m = 8388736.0f;         /* 2^23 + 128 */
    const float e0 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7540)) - m;
    const float e1 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7541)) - m;
    const float e2 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7542)) - m;
    const float e3 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7543)) - m;
    p01 = bits(__floats2bfloat162_rn(e0, e1));
    p23 = bits(__floats2bfloat162_rn(e2, e3));
}

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

/* The bf16 pair of the nibbles (stored q + 8) in bits 0..3 and 16..19 of v. */
__device__ inline uint32_t q4_pair(uint32_t v) {
    const uint32_t b = (v & 0x000f000fu) | 0x43004300u; /* bf16 128 + n, exactly */
    __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162 *>(&b);
    r = __hsub2(r, __floats2bfloat162_rn(136.0f, 136.0f));
    return bits(r);
}

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
template <class F, int NT>
__device__ void stage_norm(const tc_norm &nm, int64_t T, int64_t K, const xstage &xs) {
    constexpr int kNormThreads = 256, kV = kNormThreads / NT;
    __shared__ float part[kNormThreads / 32];
    __shared__ float rs[OG_GEMV_CUDA_MAX_T];
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
    const int64_t units = K / kUnitK, n = T * units * 4;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const int64_t t = i / (units * 4), u = (i / 4) % units;
        const int c = (int)(i & 3);
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int64_t k = u * kUnitK + F::x_at(e / 4, c) + (e & 3);
            v[e] = ((nm.a[t * K + k] + nm.b[t * K + k]) * rs[t]) * load_w(nm.w, nm.bf16, k);
        }
        stage_granule<F>(xs, i, v);
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

/* Blocks of 8 warps: one block keeps 8 x U units in flight (48 KB of bf16
 * weights in registers, 80 KB in the rings), enough to hold most of an SM's
 * share of the bandwidth alone, so the blocks of a last, partial wave do not
 * leave the memory idle. */
template <class F>
og_status launch_fmt(const og_gemv_tc_launch *l, const tc_params &p, unsigned blocks) {
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
