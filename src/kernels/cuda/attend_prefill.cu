/* update_and_attend on CUDA, prefill: the tiled tensor-core kernel (T > 1,
 * bf16 storage, D in 16..128), two launches:
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
 * Letters and shared pieces: attend_common.cuh.
 */
#include "kernels/cuda/attend_common.cuh"

namespace og_attend {

namespace {

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

/* ---- the tiled tensor-core kernel (prefill over bf16 storage) ---- */

constexpr int kTileRows = 64; /* query rows of a block: 16 per warp */
constexpr int kTileKeys = 64; /* keys of a K/V tile                */

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

} /* namespace */

cudaError_t launch_tiled(const attend_params &p, cudaStream_t st, int dev) {
    switch (p.D) {
    case 16: return launch_tiled_d<16>(p, st, dev);
    case 32: return launch_tiled_d<32>(p, st, dev);
    case 64: return launch_tiled_d<64>(p, st, dev);
    default: return launch_tiled_d<128>(p, st, dev);
    }
}

cudaError_t launch_kv_write(const attend_params &p, cudaStream_t st) {
    const int64_t writes = (int64_t)p.T * p.Hkv * p.D;
    const int wblocks = (int)((writes + 255) / 256 < 4096 ? (writes + 255) / 256 : 4096);
    kv_write_kernel<__nv_bfloat16><<<wblocks, 256, 0, st>>>(p);
    return cudaGetLastError();
}

} /* namespace og_attend */
