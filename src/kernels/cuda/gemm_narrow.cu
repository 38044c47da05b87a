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
 * Numerics: bf16 products, f32 sums; each output's sum runs over its k in
 * an order fixed by K, the part's shape and S, never by T or the other rows
 * of x, so a row's bits do not depend on the batch it is in. The order
 * differs from cuBLAS's and from the gemv's (which keeps f32 x), within the
 * bf16-activation bound of the batched steps. */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/common.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

namespace {

using namespace og_cuda;

constexpr int kTileN = 128;  /* output features of a block */
constexpr int kSliceK = 64;  /* k of a ring slot */
constexpr int kStages = 4;   /* ring slots */
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMinBlockK = 256; /* k a block of a split takes, at least */

struct narrow_params {
    const uint16_t *w[OG_GEMV_CUDA_MAX_PARTS];
    const uint16_t *bias[OG_GEMV_CUDA_MAX_PARTS];
    float *out[OG_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_GEMV_CUDA_MAX_PARTS + 1]; /* part i owns tiles first[i] .. first[i + 1] - 1 */
    int n;
    const uint16_t *x;
    int64_t T, K;
};

/* Byte offset of 16-byte chunk ch of row r in a slot of 128-byte rows. */
__device__ inline uint32_t swz(int r, int ch) { return (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4)); }

__device__ inline void copy16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
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

/* Shared memory of a block: kStages slots of weights [128][64] then of x
 * [BT][64]; after the loop, the block's partial tile [BT][kTileN + 4] f32. */
template <int NB>
constexpr int slot_bytes() {
    return kTileN * kSliceK * 2 + 16 * NB * kSliceK * 2;
}
template <int NB>
constexpr int smem_bytes() {
    return kStages * slot_bytes<NB>();
}
constexpr int kRedLd = kTileN + 4; /* floats a token row of the partial tile */

/* NB n8 blocks a warp: the block's BT = 16 NB tokens (T <= BT). */
template <int NB>
__global__ void __launch_bounds__(kThreads, 2) gemm_narrow_kernel(narrow_params p, int S) {
    constexpr int BT = 16 * NB, WT = BT / 2; /* tokens of the block, of a warp */
    constexpr int kW = kTileN * kSliceK * 2;  /* weight bytes of a slot */
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

    /* what a thread copies of a slice: weight chunks tid + 256 j (4), x
     * chunks tid + 256 j below BT x 8; rows past N or T repeat the last */
    const uint16_t *wsrc[4];
    uint32_t wdst[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int idx = tid + kThreads * j, r = idx >> 3, ch = idx & 7;
        const int64_t row = f0 + r < N ? f0 + r : N - 1;
        wsrc[j] = p.w[part] + row * K + kb + ch * 8;
        wdst[j] = swz(r, ch);
    }
    constexpr int kXc = (BT * 8 + kThreads - 1) / kThreads;
    const uint16_t *xsrc[kXc];
    uint32_t xdst[kXc];
#pragma unroll
    for (int j = 0; j < kXc; j++) {
        const int idx = tid + kThreads * j, r = idx >> 3, ch = idx & 7;
        const int64_t t = r < T ? r : T - 1;
        xsrc[j] = p.x + t * K + kb + ch * 8;
        xdst[j] = kW + swz(r, ch);
    }
    const auto load_w = [&](int s) {
        const uint32_t slot = base + (uint32_t)((s % kStages) * slot_bytes<NB>());
#pragma unroll
        for (int j = 0; j < 4; j++) copy16(slot + wdst[j], wsrc[j] + s * kSliceK);
    };
    const auto load_x = [&](int s) {
        const uint32_t slot = base + (uint32_t)((s % kStages) * slot_bytes<NB>());
#pragma unroll
        for (int j = 0; j < kXc; j++)
            if (tid + kThreads * j < BT * 8) copy16(slot + xdst[j], xsrc[j] + s * kSliceK);
    };

    /* the first slices' weights before the wait; group s holds slice s's x
     * (group 0 also every early weight) */
    for (int s = 0; s < kStages - 1; s++)
        if (s < slices) load_w(s);
    grid_wait();
    for (int s = 0; s < kStages - 1; s++) {
        if (s < slices) load_x(s);
        commit();
    }

    const int wm = warp & 3, wn = warp >> 2; /* features 32 wm .., tokens WT wn .. */
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
        __syncthreads(); /* slice s landed for every thread; slot s - 1 is free */
        if (s + kStages - 1 < slices) {
            load_w(s + kStages - 1);
            load_x(s + kStages - 1);
        }
        commit();
        const uint32_t slot = base + (uint32_t)((s % kStages) * slot_bytes<NB>());
#pragma unroll
        for (int kk = 0; kk < kSliceK / 16; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldsm4(slot + swz(a_row + 16 * i, 2 * kk + a_hi), a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < NB; j += 2) {
                uint32_t b0, b1, b2, b3;
                if (NB == 1) {
                    ldsm2(slot + kW + swz(wn * WT + (lane & 7), 2 * kk + b_hi), b0, b1);
                    b2 = b3 = 0;
                } else {
                    ldsm4(slot + kW + swz(b_row + 8 * j, 2 * kk + b_hi), b0, b1, b2, b3);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma(acc[i][j], a[i], b0, b1);
                    if (j + 1 < NB) mma(acc[i][j + 1], a[i], b2, b3);
                }
            }
        }
    }
    wait_groups<0>();
    __syncthreads(); /* every slot read: the partial tile takes their place */

    /* acc element e of (i, j): feature row 32 wm + 16 i + g (+ 8 for e >= 2),
     * token WT wn + 8 j + 2 c + (e & 1) */
    float *red = reinterpret_cast<float *>(smem);
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int f = wm * 32 + 16 * i + g + (e >> 1) * 8, t = wn * WT + 8 * j + 2 * c + (e & 1);
                red[t * kRedLd + f] = acc[i][j][e];
            }
    namespace cg = cooperative_groups;
    if (S > 1) cg::this_cluster().sync();
    else __syncthreads();
    /* rank r stores elements r, r + S, ... of the tile's rows of 128: the
     * sum of the S partial tiles in rank order, plus the bias */
    const int64_t rows = T < BT ? T : BT;
    const uint16_t *bias = p.bias[part];
    float *out = p.out[part];
    for (int64_t e = (int64_t)rank * kThreads + tid; e < rows * kTileN; e += (int64_t)S * kThreads) {
        const int t = (int)(e / kTileN), f = (int)(e % kTileN);
        if (f0 + f >= N) continue;
        float *at = red + t * kRedLd + f, v = *at;
        if (S > 1) {
            v = *cg::this_cluster().map_shared_rank(at, 0);
            for (int r = 1; r < S; r++) v += *cg::this_cluster().map_shared_rank(at, r);
        }
        if (bias) v += __bfloat162float(__ushort_as_bfloat16(bias[f0 + f]));
        out[t * N + f0 + f] = v;
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

template <int NB>
og_status launch(cudaStream_t stream, const narrow_params &p, int64_t tiles, int S) {
    void (*kernel)(narrow_params, int) = gemm_narrow_kernel<NB>;
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<NB>());
    if (allowed != cudaSuccess) {
        (void)cudaGetLastError();
        return og_set_error(OG_ERR_BACKEND, "gemm_narrow_cuda: %d bytes of shared memory refused: %s",
                            smem_bytes<NB>(), cudaGetErrorString(allowed));
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
    cfg.dynamicSmemBytes = smem_bytes<NB>();
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = S > 1 ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, p, S);
    return launched("gemm_narrow_cuda");
}

} /* namespace */

bool og_gemm_narrow_cuda_wanted(void) {
    static const bool on = env_int("OG_CUDA_NARROW", 1) != 0;
    return on;
}

void og_gemm_narrow_cuda_set_splits(int splits) { splits_forced = splits; }

bool og_gemm_narrow_cuda_takes(const uint16_t *x, int64_t T, int64_t K, const og_gemv_cuda_part *parts, int n) {
    if (T < 1 || T > OG_GEMM_NARROW_CUDA_MAX_T || K < kSliceK || K % kSliceK || n < 1 ||
        n > OG_GEMV_CUDA_MAX_PARTS || !aligned16(x))
        return false;
    for (int i = 0; i < n; i++)
        if (parts[i].N < 1 || !aligned16(parts[i].weight) || !parts[i].out) return false;
    return true;
}

og_status og_gemm_narrow_cuda(void *stream, const uint16_t *x, int64_t T, int64_t K, const og_gemv_cuda_part *parts,
                              int n) {
    if (!og_gemm_narrow_cuda_takes(x, T, K, parts, n))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "gemm_narrow_cuda: T = %lld (1 .. %d), K = %lld (a multiple of %d), %d parts (1 .. %d), "
                            "x and weights 16-byte aligned",
                            (long long)T, OG_GEMM_NARROW_CUDA_MAX_T, (long long)K, kSliceK, n, OG_GEMV_CUDA_MAX_PARTS);
    narrow_params p;
    memset(&p, 0, sizeof p);
    p.n = n, p.x = x, p.T = T, p.K = K;
    int64_t tiles = 0;
    for (int i = 0; i < n; i++) {
        p.w[i] = static_cast<const uint16_t *>(parts[i].weight);
        p.bias[i] = static_cast<const uint16_t *>(parts[i].bias);
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
    if (T <= 16) return launch<1>(st, p, tiles, S);
    if (T <= 32) return launch<2>(st, p, tiles, S);
    return launch<4>(st, p, tiles, S);
}
