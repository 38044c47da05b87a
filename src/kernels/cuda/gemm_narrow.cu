/* Products of a narrow batch on the tensor cores: out[T, N] = x[T, K] @
 * W[N, K]^T (+ bias) for 1 <= T <= OG_GEMM_NARROW_CUDA_MAX_T rows of bf16 x
 * and bf16 weights, f32 sums: the batched decode step of 9 to 64 sessions,
 * past the gemv's 8 rows. Such a product is a weight stream with little
 * arithmetic (64 tokens do 128 flops a weight byte, a fifth of what the
 * tensor cores could), so the kernel is built to keep the memory busy:
 *
 * - a block owns a tile of kTileN = 128 output features of one part (q, k
 *   and v of a layer, or gate and up, go in one launch, tiles numbered part
 *   after part) and all T tokens, so x is read once per 128 features (half
 *   a weight byte of x per weight byte at 64 tokens, from L2);
 * - K is split among the S blocks of a thread-block cluster (S = 1 .. 8,
 *   chosen so that the launch has at least a block an SM: the o and down
 *   projections of an 8B model have only 32 tiles), and the S partial tiles
 *   meet in distributed shared memory, added in rank order by the block that
 *   stores each element: no workspace, no atomics, the same bits every run;
 * - each block streams its weights through a kStages-deep ring of 64-k
 *   slices (16 KB of weights and T x 128 bytes of x a slice) by cp.async,
 *   the first slices' weights issued before waiting for the previous kernel
 *   (programmatic dependent launch: no kernel writes weights);
 * - 8 warps as 4 (features) x 2 (tokens): a warp's 32 features x T/2 tokens
 *   are 2 x (T/16) mma.m16n8k16 a k16 step, operands by ldmatrix from rows
 *   whose 16-byte chunks are XOR-swizzled by row so the 8 rows an ldmatrix
 *   phase reads fall in distinct banks.
 *
 * q8 / q4 weights (core.h's layout: quants, then an f16 scale a group of 32)
 * come into the ring as they are stored, with their slice's scales; after
 * the slot lands, the block widens the quants (integers, exact in bf16) to
 * one bf16 tile in the same swizzled layout, and a group's two k16 steps go
 * into a zeroed fragment that is then scaled into the sum (acc += scale *
 * t), as the gemv does: the weights are read from memory once, at a
 * quarter (q4) or half (q8) of bf16's bytes.
 *
 * Numerics: bf16 products, f32 sums; each output's sum runs over its k in
 * an order fixed by K, the part's shape and S, never by T or the other rows
 * of x, so a row's bits do not depend on the batch it is in. The order
 * differs from cuBLAS's and from the gemv's (which keeps f32 x), within the
 * bf16-activation bound of the batched steps. */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant_pairs.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

namespace {

using namespace og_cuda;

constexpr int kTileN = 128;  /* output features of a block */
constexpr int kSliceK = 64;  /* k of a ring slot */
constexpr int kStages = 4;   /* ring slots */
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMinBlockK = 256; /* k a block of a split takes, at least */

struct narrow_params {
    const uint8_t *w[OG_GEMV_CUDA_MAX_PARTS];
    const void *bias[OG_GEMV_CUDA_MAX_PARTS]; /* bf16 beside bf16 weights, f32 beside q8 / q4 */
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1]; /* part i owns tiles first[i] .. first[i + 1] - 1 */
    int n;
    const uint16_t *x;
    int64_t T, K;
};

/* ---- weight formats ----
 * kRow: bytes of a slice of one row as stored (64 k); kQuant: quants with
 * scales, widened in shared memory before the products. */
struct w_bf16 {
    static constexpr int kRow = kSliceK * 2;
    static constexpr bool kQuant = false;
};
struct w_q8 {
    static constexpr int kRow = kSliceK;
    static constexpr bool kQuant = true;
};
struct w_q4 {
    static constexpr int kRow = kSliceK / 2;
    static constexpr bool kQuant = true;
};

/* Byte offset of 16-byte chunk ch of row r in a slot of 128-byte rows. */
__device__ inline uint32_t swz(int r, int ch) { return (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4)); }

__device__ inline void copy16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ inline void copy4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ inline void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void wait_groups() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ inline void ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ inline void ldsm2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ inline void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Shared memory of a block: kStages slots, each the weights of a slice as
 * stored ([128][kRow]: bf16 swizzled, quants plain), their scales ([128][2]
 * f16, quantized formats) and x ([BT][64] bf16, swizzled); for quantized
 * formats one widened bf16 tile [128][64] (swizzled) after the slots. After
 * the loop, the block's partial tile [BT][kTileN + 4] f32 takes their place. */
template <class Q>
constexpr int w_bytes() {
    return kTileN * Q::kRow;
}
template <class Q>
constexpr int scale_bytes() {
    return Q::kQuant ? kTileN * 4 : 0;
}
template <class Q, int NB>
constexpr int slot_bytes() {
    return w_bytes<Q>() + scale_bytes<Q>() + 16 * NB * kSliceK * 2;
}
constexpr int kWide = kTileN * kSliceK * 2; /* the widened tile */
template <class Q, int NB>
constexpr int smem_bytes() {
    return kStages * slot_bytes<Q, NB>() + (Q::kQuant ? kWide : 0);
}

constexpr int kRedLd = kTileN + 4; /* floats a token row of the partial tile */

/* Widens slot's quants (row r, the 32 k of group h a thread) into the bf16
 * tile, four 16-byte chunks of 8 k (quant_pairs.cuh: exact). */
template <class Q>
__device__ inline void widen(const uint8_t *raw, uint8_t *wide, int tid) {
    const int r = tid >> 1, h = tid & 1;
    uint4 o[4];
    if constexpr (std::is_same<Q, w_q8>::value) { /* chunk q: the bytes of words 2 q, 2 q + 1 */
        const uint4 a = *reinterpret_cast<const uint4 *>(raw + r * 64 + h * 32);
        const uint4 b = *reinterpret_cast<const uint4 *>(raw + r * 64 + h * 32 + 16);
        const uint32_t wd[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            q8_pairs(wd[2 * q], o[q].x, o[q].y);
            q8_pairs(wd[2 * q + 1], o[q].z, o[q].w);
        }
    } else { /* byte j holds k = j (low nibble) and j + 16 (high): chunks 0, 1 low of bytes 0..7, 8..15; 2, 3 high */
        const uint4 a = *reinterpret_cast<const uint4 *>(raw + r * 32 + h * 16);
        const uint32_t wd[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int sh = q < 2 ? 0 : 4;
            const uint32_t u = wd[(q & 1) * 2], v = wd[(q & 1) * 2 + 1];
            o[q].x = q4_pair(__byte_perm(u, 0, 0x4140) >> sh);
            o[q].y = q4_pair(__byte_perm(u, 0, 0x4342) >> sh);
            o[q].z = q4_pair(__byte_perm(v, 0, 0x4140) >> sh);
            o[q].w = q4_pair(__byte_perm(v, 0, 0x4342) >> sh);
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) *reinterpret_cast<uint4 *>(wide + swz(r, 4 * h + q)) = o[q];
}

/* NB n8 blocks a warp: the block's BT = 16 NB tokens (T <= BT). */
template <class Q, int NB>
__global__ void __launch_bounds__(kThreads, 2) gemm_narrow_kernel(narrow_params p, int S) {
    constexpr int BT = 16 * NB, WT = BT / 2; /* tokens of the block, of a warp */
    constexpr int kW = w_bytes<Q>(), kX = kW + scale_bytes<Q>(), kSlot = slot_bytes<Q, NB>();
    extern __shared__ __align__(128) uint8_t smem[];
    const int rank = (int)(blockIdx.x % S);
    const int64_t tile_all = blockIdx.x / S;
    int part = 0;
    while (part + 1 < p.n && tile_all >= p.first[part + 1]) part++;
    const int64_t N = p.N[part], K = p.K, T = p.T, f0 = (tile_all - p.first[part]) * kTileN;
    const int64_t kb = (K / S) * rank; /* the block's k range: kb .. kb + K / S - 1 */
    const int slices = (int)(K / S / kSliceK);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);

    /* what a thread copies of a slice (rows past N or T repeat the last):
     * kWc 16-byte chunks of weights (chunk tid + 256 j), one scale pair
     * (threads below 128), x chunks tid + 256 j below BT x 8 */
    constexpr int kChunks = kTileN * Q::kRow / 16, kWc = (kChunks + kThreads - 1) / kThreads, kCr = Q::kRow / 16;
    const uint8_t *wsrc[kWc];
    uint32_t wdst[kWc];
#pragma unroll
    for (int j = 0; j < kWc; j++) {
        const int idx = tid + kThreads * j, r = idx / kCr, ch = idx % kCr;
        const int64_t row = f0 + r < N ? f0 + r : N - 1;
        wsrc[j] = p.w[part] + row * (K / kSliceK) * Q::kRow + kb / kSliceK * Q::kRow + ch * 16;
        wdst[j] = Q::kQuant ? (uint32_t)(r * Q::kRow + ch * 16) : swz(r, ch);
    }
    const uint8_t *ssrc = nullptr; /* the row's two f16 scales of the slice */
    if (Q::kQuant && tid < kTileN) {
        const int64_t row = f0 + tid < N ? f0 + tid : N - 1;
        ssrc = p.w[part] + N * (K / kSliceK) * Q::kRow + (row * (K / 32) + kb / 32) * 2;
    }
    constexpr int kXc = (BT * 8 + kThreads - 1) / kThreads;
    const uint16_t *xsrc[kXc];
    uint32_t xdst[kXc];
#pragma unroll
    for (int j = 0; j < kXc; j++) {
        const int idx = tid + kThreads * j, r = idx >> 3, ch = idx & 7;
        const int64_t t = r < T ? r : T - 1;
        xsrc[j] = p.x + t * K + kb + ch * 8;
        xdst[j] = kX + swz(r, ch);
    }
    const auto fetch_w = [&](int s) {
        const uint32_t slot = base + (uint32_t)((s % kStages) * kSlot);
#pragma unroll
        for (int j = 0; j < kWc; j++)
            if (kChunks % kThreads == 0 || tid + kThreads * j < kChunks) copy16(slot + wdst[j], wsrc[j] + s * Q::kRow);
        if (Q::kQuant && tid < kTileN) copy4(slot + kW + tid * 4, ssrc + s * 4);
    };
    const auto fetch_x = [&](int s) {
        const uint32_t slot = base + (uint32_t)((s % kStages) * kSlot);
#pragma unroll
        for (int j = 0; j < kXc; j++)
            if (tid + kThreads * j < BT * 8) copy16(slot + xdst[j], xsrc[j] + s * kSliceK);
    };

    /* the first slices' weights before the wait; group s holds slice s's x
     * (group 0 also every early weight) */
    for (int s = 0; s < kStages - 1; s++)
        if (s < slices) fetch_w(s);
    grid_wait();
    for (int s = 0; s < kStages - 1; s++) {
        if (s < slices) fetch_x(s);
        commit();
    }

    const int wm = warp & 3, wn = warp >> 2; /* features 32 wm .., tokens WT wn .. */
    const int g = lane >> 2, c = lane & 3;
    float acc[2][NB][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    /* ldmatrix rows of the lane: weights (x4: rows +0..7, +8..15 at k +0, then at k +8),
     * x (x4: tokens +0..7 at k +0, +0..7 at k +8, +8..15 at k +0, +8..15 at k +8) */
    const int a_row = wm * 32 + (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
    const int b_row = wn * WT + (lane & 7) + ((lane >> 4) & 1) * 8, b_hi = (lane >> 3) & 1;

    for (int s = 0; s < slices; s++) {
        wait_groups<kStages - 2>();
        __syncthreads(); /* slice s landed for every thread; slot s - 1 (and the widened tile) are free */
        if (s + kStages - 1 < slices) {
            fetch_w(s + kStages - 1);
            fetch_x(s + kStages - 1);
        }
        commit();
        const uint32_t slot = base + (uint32_t)((s % kStages) * kSlot);
        uint32_t wt = slot; /* the bf16 weight tile */
        if constexpr (Q::kQuant) {
            widen<Q>(smem + (s % kStages) * kSlot, smem + kStages * kSlot, tid);
            __syncthreads();
            wt = base + (uint32_t)(kStages * kSlot);
        }
        float t[2][NB][4]; /* a group's products before its scale (quantized formats) */
#pragma unroll
        for (int kk = 0; kk < kSliceK / 16; kk++) {
            if (Q::kQuant && (kk & 1) == 0)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < NB; j++) t[i][j][0] = t[i][j][1] = t[i][j][2] = t[i][j][3] = 0.0f;
            uint32_t a[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldsm4(wt + swz(a_row + 16 * i, 2 * kk + a_hi), a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < NB; j += 2) {
                uint32_t b0, b1, b2, b3;
                if (NB == 1) {
                    ldsm2(slot + kX + swz(wn * WT + (lane & 7), 2 * kk + b_hi), b0, b1);
                    b2 = b3 = 0;
                } else {
                    ldsm4(slot + kX + swz(b_row + 8 * j, 2 * kk + b_hi), b0, b1, b2, b3);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma(Q::kQuant ? t[i][j] : acc[i][j], a[i], b0, b1);
                    if (j + 1 < NB) mma(Q::kQuant ? t[i][j + 1] : acc[i][j + 1], a[i], b2, b3);
                }
            }
            if (Q::kQuant && (kk & 1) == 1) { /* the group's end: acc += scale * t, rows g and g + 8 */
                const __half *sc = reinterpret_cast<const __half *>(smem + (s % kStages) * kSlot + kW);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = wm * 32 + 16 * i + g;
                    const float s0 = __half2float(sc[r * 2 + (kk >> 1)]), s1 = __half2float(sc[(r + 8) * 2 + (kk >> 1)]);
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        acc[i][j][0] = fmaf(s0, t[i][j][0], acc[i][j][0]);
                        acc[i][j][1] = fmaf(s0, t[i][j][1], acc[i][j][1]);
                        acc[i][j][2] = fmaf(s1, t[i][j][2], acc[i][j][2]);
                        acc[i][j][3] = fmaf(s1, t[i][j][3], acc[i][j][3]);
                    }
                }
            }
        }
    }
    wait_groups<0>();
    __syncthreads(); /* every slot read: the partial tile takes their place */

    /* acc element e of (i, j): feature row 32 wm + 16 i + g (+ 8 for e >= 2),
     * token WT wn + 8 j + 2 c + (e & 1) */
    float *red = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int f = wm * 32 + 16 * i + g + (e >> 1) * 8, tk = wn * WT + 8 * j + 2 * c + (e & 1);
                red[tk * kRedLd + f] = acc[i][j][e];
            }
    namespace cg = cooperative_groups;
    if (S > 1) cg::this_cluster().sync();
    else __syncthreads();
    /* rank r stores groups of 4 elements r, r + S, ... (256 a block) of the
     * tile's rows of 128: the sum of the S partial tiles in rank order (all
     * S loads issued before the first add), plus the bias */
    const int64_t rows = T < BT ? T : BT;
    const void *bias = p.bias[part];
    float *out = p.out[part];
    for (int64_t e = (int64_t)rank * kThreads + tid; e < rows * (kTileN / 4); e += (int64_t)S * kThreads) {
        const int tk = (int)(e / (kTileN / 4)), f = (int)(e % (kTileN / 4)) * 4;
        if (f0 + f >= N) continue;
        const float4 *at = reinterpret_cast<const float4 *>(red + tk * kRedLd + f);
        float4 v = *at;
        if (S > 1) {
            float4 pr[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (r < S) pr[r] = *cg::this_cluster().map_shared_rank(at, r);
            v = pr[0];
#pragma unroll
            for (int r = 1; r < 8; r++)
                if (r < S) v.x += pr[r].x, v.y += pr[r].y, v.z += pr[r].z, v.w += pr[r].w;
        }
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (f0 + f + i < N)
                out[tk * N + f0 + f + i] = bias ? vs[i] + load_w(bias, !Q::kQuant, f0 + f + i) : vs[i];
    }
    if (S > 1) cg::this_cluster().sync(); /* the others' tiles stay until every rank has read them */
}

int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess || v < 1) {
            (void)cudaGetLastError();
            return 132;
        }
        return v;
    }();
    return n;
}

int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Blocks a tile: doubled from 1 while the launch has fewer blocks than SMs
 * and each block keeps at least kMinBlockK of k (OG_CUDA_NARROW_SPLITS = 1,
 * 2, 4 or 8 forces it where K allows). */
int splits_forced = -1; /* og_gemm_narrow_cuda_set_splits; -1: the environment's */

int split_count(int64_t tiles, int64_t K) {
    static const int env = env_int("OG_CUDA_NARROW_SPLITS", 0);
    const int forced = splits_forced >= 0 ? splits_forced : env;
    int s = 1;
    if (forced == 1 || forced == 2 || forced == 4 || forced == 8) {
        while (s < forced && K % (2 * s * kSliceK) == 0) s *= 2;
        return s;
    }
    while (s < 8 && tiles * s < sm_count() && K % (2 * s * kSliceK) == 0 && K / (2 * s) >= kMinBlockK) s *= 2;
    return s;
}

template <class Q, int NB>
og_status launch(cudaStream_t stream, const narrow_params &p, int64_t tiles, int S) {
    void (*kernel)(narrow_params, int) = gemm_narrow_kernel<Q, NB>;
    constexpr int smem = smem_bytes<Q, NB>();
    static const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemm_narrow_cuda: %d bytes of shared memory refused: %s", smem,
                            cudaGetErrorString(allowed));
    }
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = (unsigned)S;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(tiles * S));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = S > 1 ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, p, S);
    return launched("gemm_narrow_cuda");
}

template <class Q>
og_status launch_rows(cudaStream_t stream, const narrow_params &p, int64_t tiles, int S) {
    if (p.T <= 16) return launch<Q, 1>(stream, p, tiles, S);
    if (p.T <= 32) return launch<Q, 2>(stream, p, tiles, S);
    return launch<Q, 4>(stream, p, tiles, S);
}

} /* namespace */

bool og_gemm_narrow_cuda_wanted(og_dtype dtype, const og_gemv_cuda_part *parts, int n_parts) {
    static const int mode = env_int("OG_CUDA_NARROW", -1); /* -1: unset */
    if (mode == 0) return false;
    if (dtype == OG_DTYPE_Q8 || dtype == OG_DTYPE_Q4) return true;
    if (dtype != OG_DTYPE_BF16 || n_parts < 2) return false;
    if (mode == 1) return true;
    for (int i = 0; i < n_parts; i++)
        if (parts[i].N <= OG_GEMM_NARROW_CUDA_THIN) return true;
    return false;
}

void og_gemm_narrow_cuda_set_splits(int splits) { splits_forced = splits; }

bool og_gemm_narrow_cuda_takes(const uint16_t *x, og_dtype dtype, int64_t T, int64_t K,
                               const og_gemv_cuda_part *parts, int n) {
    if (dtype != OG_DTYPE_BF16 && dtype != OG_DTYPE_Q8 && dtype != OG_DTYPE_Q4) return false;
    if (T < 1 || T > OG_GEMM_NARROW_CUDA_MAX_T || K < kSliceK || K % kSliceK || n < 1 ||
        n > OG_GEMV_CUDA_MAX_PARTS || !x || !aligned16(x))
        return false;
    for (int i = 0; i < n; i++)
        if (parts[i].N < 1 || !aligned16(parts[i].weight) || !parts[i].out) return false;
    return true;
}

og_status og_gemm_narrow_cuda(void *stream, const uint16_t *x, og_dtype dtype, int64_t T, int64_t K,
                              const og_gemv_cuda_part *parts, int n) {
    if (!og_gemm_narrow_cuda_takes(x, dtype, T, K, parts, n))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "gemm_narrow_cuda: %s weights (bf16, q8, q4), T = %lld (1 .. %d), K = %lld (a multiple "
                            "of %d), %d parts (1 .. %d), x and weights 16-byte aligned",
                            og_dtype_name(dtype), (long long)T, OG_GEMM_NARROW_CUDA_MAX_T, (long long)K, kSliceK, n,
                            OG_GEMV_CUDA_MAX_PARTS);
    narrow_params p;
    memset(&p, 0, sizeof p);
    p.n = n, p.x = x, p.T = T, p.K = K;
    int64_t tiles = 0;
    for (int i = 0; i < n; i++) {
        p.w[i] = static_cast<const uint8_t *>(parts[i].weight);
        p.bias[i] = parts[i].bias;
        p.out[i] = parts[i].out;
        p.N[i] = parts[i].N;
        p.first[i] = tiles;
        tiles += (parts[i].N + kTileN - 1) / kTileN;
    }
    p.first[n] = tiles;
    const int S = split_count(tiles, K);
    if (tiles * S > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "gemm_narrow_cuda: %lld blocks", (long long)(tiles * S));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case OG_DTYPE_Q8: return launch_rows<w_q8>(st, p, tiles, S);
    case OG_DTYPE_Q4: return launch_rows<w_q4>(st, p, tiles, S);
    default: return launch_rows<w_bf16>(st, p, tiles, S);
    }
}
