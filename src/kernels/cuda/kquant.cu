/* CUDA kernels for k-quant weights (kquant_cuda.h): the decode gemv (1 to 8
 * rows of x), the dequantization of prefill panels and the embedding
 * lookup. Block layouts: docs/program-format.md (and src/core/kquant.c,
 * the reference these reproduce).
 *
 * The gemv gives a warp to an output feature and walks its row a block of
 * 256 at a time, each lane reading a contiguous piece of the block's levels
 * (q4_k, q5_k: 4 bytes of the 128 of nibbles, so a warp reads them as one
 * 128-byte line; q6_k, whose 210-byte blocks are only 2-byte aligned: 2
 * bytes of each of its level arrays) and the x values they meet (float4 /
 * float2 loads). Per sub-block a lane sums its products x * level and its
 * x, then adds (d * scale) * that - (dmin * min) * its x sum; lanes are
 * summed at the end (warp_sum). q2_k and q3_k lanes take 8 consecutive
 * elements each and multiply the dequantized values.
 *
 * The integer gemv (q4_k, q5_k, q6_k; the back end's default, OG_CUDA_KQUANT_GEMV=f32x
 * keeps the f32-x gemv) first writes x as the CPU's int8 terms (quantize_x_kernel), then
 * dots them with the weights' level bytes by __dp4a: see below. Its second cut
 * (gemv_v2_kernel, OG_CUDA_KQUANT_GEMV=v2, off by default) splits K across a
 * block instead of giving a warp whole rows.
 *
 * Letters as in kquant_cuda.h: T rows of x, K in features, N out features. */
#include "kernels/cuda/kquant_cuda.h"

#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

using namespace og_cuda;

constexpr int QK = OG_KQUANT_BLOCK;
constexpr int WARPS = 4; /* output features a block of 128 threads */

__device__ __forceinline__ float f16_at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ int block_bytes(og_dtype dt) {
    return dt == OG_DTYPE_Q2_K ? 84 : dt == OG_DTYPE_Q3_K ? 110 : dt == OG_DTYPE_Q4_K ? 144 : dt == OG_DTYPE_Q5_K ? 176 : 210;
}

/* q4_k / q5_k: scale and min of sub-block j from the 12 packed bytes. */
__device__ __forceinline__ void scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element e of block b as f32, in the reference's operations (kquant.c):
 * the level product is exact, so a contracted multiply-subtract gives the
 * same bits as the reference's subtraction; q3_k and q6_k multiply twice. */
template <og_dtype DT> __device__ __forceinline__ float elem(const uint8_t *b, int e) {
    const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
    if (DT == OG_DTYPE_Q2_K) {
        const int sb = b[e >> 4];
        const float dl = f16_at(b + 80) * (float)(sb & 15), ml = f16_at(b + 82) * (float)(sb >> 4);
        return dl * (float)((b[16 + 32 * h + l] >> (2 * s)) & 3) - ml;
    } else if (DT == OG_DTYPE_Q3_K) {
        const uint8_t *sc = b + 96;
        const int i = e >> 4;
        const int lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4, hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        const float dl = f16_at(b + 108) * (float)((lo | (hi << 4)) - 32);
        const int q = ((b[32 + 32 * h + l] >> (2 * s)) & 3) - (((b[l] >> (e >> 5)) & 1) ? 0 : 4);
        return dl * (float)q;
    } else if (DT == OG_DTYPE_Q4_K || DT == OG_DTYPE_Q5_K) {
        const int j = e >> 5;
        int sc, m;
        scale_min(b + 4, j, &sc, &m);
        const float dl = f16_at(b) * (float)sc, ml = f16_at(b + 2) * (float)m;
        const uint8_t *qs = b + (DT == OG_DTYPE_Q4_K ? 16 : 48);
        int q = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
        if (DT == OG_DTYPE_Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
        return dl * (float)q - ml;
    } else {
        const int lo = (b[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 3;
        const float dl = f16_at(b + 208) * (float)(int8_t)b[192 + (e >> 4)];
        return dl * (float)((lo | (hi << 4)) - 32);
    }
}

/* ---- gemv ---- */

template <og_dtype DT, int T>
__global__ void __launch_bounds__(32 * WARPS) gemv_kernel(const float *__restrict__ x, const uint8_t *__restrict__ w,
                                                          const float *__restrict__ bias, int64_t K, int64_t N,
                                                          float *__restrict__ out) {
    grid_wait();
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const int bb = block_bytes(DT);
    const int64_t nb = K / QK;
    const uint8_t *row = w + n * nb * bb;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = row + k * bb;
        const float *xk = x + k * QK;
        if (DT == OG_DTYPE_Q4_K || DT == OG_DTYPE_Q5_K) {
            /* lane: bytes 4 (lane % 8) .. +3 of the 32 of run c = lane / 8:
             * elements l .. l + 3 of sub-blocks 2c (low nibbles) and 2c + 1 */
            const int c = lane >> 3, l = 4 * (lane & 7);
            const uint8_t *qs = b + (DT == OG_DTYPE_Q4_K ? 16 : 48);
            const uint32_t q = *reinterpret_cast<const uint32_t *>(qs + 32 * c + l);
            uint32_t qh = 0;
            if (DT == OG_DTYPE_Q5_K) qh = *reinterpret_cast<const uint32_t *>(b + 16 + l);
            int sa, ma, sb, mb;
            scale_min(b + 4, 2 * c, &sa, &ma);
            scale_min(b + 4, 2 * c + 1, &sb, &mb);
            const float d = f16_at(b), dmin = f16_at(b + 2);
            const float da = d * (float)sa, db = d * (float)sb, mina = dmin * (float)ma, minb = dmin * (float)mb;
            float la[4], lb[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int va = (q >> (8 * j)) & 15, vb = (q >> (8 * j + 4)) & 15;
                if (DT == OG_DTYPE_Q5_K) {
                    va |= ((qh >> (8 * j + 2 * c)) & 1) << 4;
                    vb |= ((qh >> (8 * j + 2 * c + 1)) & 1) << 4;
                }
                la[j] = (float)va;
                lb[j] = (float)vb;
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float4 xa = *reinterpret_cast<const float4 *>(xk + t * K + 64 * c + l);
                const float4 xb = *reinterpret_cast<const float4 *>(xk + t * K + 64 * c + 32 + l);
                const float sa_ = xa.x * la[0] + xa.y * la[1] + xa.z * la[2] + xa.w * la[3];
                const float sb_ = xb.x * lb[0] + xb.y * lb[1] + xb.z * lb[2] + xb.w * lb[3];
                const float xs_a = (xa.x + xa.y) + (xa.z + xa.w), xs_b = (xb.x + xb.y) + (xb.z + xb.w);
                acc[t] += da * sa_ - mina * xs_a + (db * sb_ - minb * xs_b);
            }
        } else if (DT == OG_DTYPE_Q6_K) {
            /* lane: half h = lane / 16, positions l, l + 1 (l = 2 (lane % 16))
             * of its 4 runs of 32 */
            const int h = lane >> 4, l = 2 * (lane & 15);
            const float d = f16_at(b + 208);
            const unsigned lo0 = *reinterpret_cast<const uint16_t *>(b + 64 * h + l);
            const unsigned lo1 = *reinterpret_cast<const uint16_t *>(b + 64 * h + 32 + l);
            const unsigned hq = *reinterpret_cast<const uint16_t *>(b + 128 + 32 * h + l);
            float lv[4][2], dl[4];
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const unsigned lo = (s & 1) ? lo1 : lo0;
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int v = ((lo >> (8 * p + 4 * (s >> 1))) & 15) | (((hq >> (8 * p + 2 * s)) & 3) << 4);
                    lv[s][p] = (float)(v - 32);
                }
                dl[s] = d * (float)(int8_t)b[192 + 8 * h + 2 * s + (l >> 4)];
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                float sum = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const float2 xv = *reinterpret_cast<const float2 *>(xk + t * K + 128 * h + 32 * s + l);
                    sum += dl[s] * (xv.x * lv[s][0] + xv.y * lv[s][1]);
                }
                acc[t] += sum;
            }
        } else { /* q2_k, q3_k: 8 consecutive elements a lane, dequantized */
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = elem<DT>(b, 8 * lane + i);
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float4 x0 = *reinterpret_cast<const float4 *>(xk + t * K + 8 * lane);
                const float4 x1 = *reinterpret_cast<const float4 *>(xk + t * K + 8 * lane + 4);
                acc[t] += ((x0.x * v[0] + x0.y * v[1]) + (x0.z * v[2] + x0.w * v[3])) +
                          ((x1.x * v[4] + x1.y * v[5]) + (x1.z * v[6] + x1.w * v[7]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) out[t * N + n] = s + (bias ? bias[n] : 0.0f);
    }
}

template <og_dtype DT>
og_status gemv_t(cudaStream_t st, const float *x, const uint8_t *w, const float *bias, int64_t T, int64_t K, int64_t N,
                 float *out) {
    const dim3 grid((unsigned)((N + WARPS - 1) / WARPS)), block(32 * WARPS);
    switch (T) {
    case 1: launch_pdl(gemv_kernel<DT, 1>, grid, block, st, x, w, bias, K, N, out); break;
    case 2: launch_pdl(gemv_kernel<DT, 2>, grid, block, st, x, w, bias, K, N, out); break;
    case 3: launch_pdl(gemv_kernel<DT, 3>, grid, block, st, x, w, bias, K, N, out); break;
    case 4: launch_pdl(gemv_kernel<DT, 4>, grid, block, st, x, w, bias, K, N, out); break;
    case 5: launch_pdl(gemv_kernel<DT, 5>, grid, block, st, x, w, bias, K, N, out); break;
    case 6: launch_pdl(gemv_kernel<DT, 6>, grid, block, st, x, w, bias, K, N, out); break;
    case 7: launch_pdl(gemv_kernel<DT, 7>, grid, block, st, x, w, bias, K, N, out); break;
    default: launch_pdl(gemv_kernel<DT, 8>, grid, block, st, x, w, bias, K, N, out); break;
    }
    return launched("kquant_gemv_cuda");
}

/* ---- x in two int8 terms and the integer gemv (q4_k, q5_k, q6_k) ----
 *
 * quantize_x_kernel writes each super-block of a row of x as og_kq_quantize_x
 * does on the CPU (kquant_cpu.h): hi, lo with x ~ u (254 hi + lo), the sums
 * of 254 hi + lo by 16 elements, and u = (amax / 127) / 254; the same f32
 * operations in the same order (IEEE division, a product, round to nearest
 * even), so the terms are the CPU's bit for bit. A warp takes a block, a
 * lane 8 elements. */

struct xq_block { /* og_kquant_x_cuda_bytes: one of these a row and block */
    int8_t hi[QK];
    int8_t lo[QK];
    int32_t sum16[QK / 16];
    float u;
    float pad[3];
};
static_assert(sizeof(xq_block) == 592, "xq_block: 16-byte multiple");

/* Where chunk c (elements 16 c .. 16 c + 15) of x's 256 terms sits in hi
 * and in lo: bits c0 | (c1 ^ c2) << 1 | c3 << 2 | c2 << 3. The 8 lanes of a
 * quarter warp read the 8 units of one block at once (16 bytes each, from
 * hi then lo): chunks {0,1,4,5,8,9,12,13} then {2,3,6,7,10,11,14,15} for
 * q4_k / q5_k, {0,1,2,3,8,9,10,11} then {4,...,7,12,...,15} for q6_k. In
 * order two of each set fall on the same 16-byte bank group (c mod 8) and
 * every read takes two passes; placed so, each set covers the 8 groups. */
__host__ __device__ constexpr int chunk_at(int c) {
    return (c & 1) | (((c >> 1) ^ (c >> 2)) & 1) << 1 | ((c >> 3) & 1) << 2 | ((c >> 2) & 1) << 3;
}
/* every set of 8 chunks a quarter warp reads on 8 distinct bank groups */
constexpr bool chunk_sets_spread() {
    const int sets[4][8] = {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15},
                            {0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}};
    for (int s = 0; s < 4; s++) {
        int seen = 0;
        for (int i = 0; i < 8; i++) seen |= 1 << (chunk_at(sets[s][i]) & 7);
        if (seen != 255) return false;
    }
    int all = 0;
    for (int c = 0; c < 16; c++) all |= 1 << chunk_at(c);
    return all == 0xffff; /* and a permutation */
}
static_assert(chunk_sets_spread(), "chunk_at: a permutation, a quarter warp's reads on 8 bank groups");

/* The terms of one block of 256 elements of x, 8 a lane (e: elements 8
 * lane .. 8 lane + 7), into q. Every lane of the warp calls it (shuffles). */
__device__ __forceinline__ void quantize_block(const float e[8], xq_block *q, int lane) {
    const int at = 16 * chunk_at(lane >> 1) + 8 * (lane & 1); /* the lane's 8 terms, in hi and in lo */
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float a = fabsf(e[j]);
        finite = finite && a <= 3.4028235e38f; /* false for NaN and infinity */
        amax = a > amax ? a : amax;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __all_sync(0xffffffffu, finite);
    if (!finite || amax == 0.0f) {
        *reinterpret_cast<uint2 *>(q->hi + at) = make_uint2(0, 0);
        *reinterpret_cast<uint2 *>(q->lo + at) = make_uint2(0, 0);
        if (lane < 16) q->sum16[lane] = 0;
        if (lane == 0) q->u = finite ? 0.0f : NAN;
        return;
    }
    const float id = __fdiv_rn(127.0f, amax);
    uint32_t hw[2] = {0, 0}, lw[2] = {0, 0};
    int32_t s = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float tq = __fmul_rn(e[j], id); /* x in units of d */
        int h = __float2int_rn(tq);
        h = h > 127 ? 127 : h < -127 ? -127 : h;
        int l = __float2int_rn(__fmul_rn(__fsub_rn(tq, (float)h), 254.0f));
        l = l > 127 ? 127 : l < -127 ? -127 : l;
        hw[j >> 2] |= (uint32_t)(h & 255) << (8 * (j & 3));
        lw[j >> 2] |= (uint32_t)(l & 255) << (8 * (j & 3));
        s += 254 * h + l;
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    *reinterpret_cast<uint2 *>(q->hi + at) = make_uint2(hw[0], hw[1]);
    *reinterpret_cast<uint2 *>(q->lo + at) = make_uint2(lw[0], lw[1]);
    if (!(lane & 1)) q->sum16[lane >> 1] = s;
    if (lane == 0) q->u = __fdiv_rn(__fdiv_rn(amax, 127.0f), 254.0f);
}

__device__ __forceinline__ void load8(const float *v, float e[8]) {
    const float4 v0 = *reinterpret_cast<const float4 *>(v), v1 = *reinterpret_cast<const float4 *>(v + 4);
    e[0] = v0.x, e[1] = v0.y, e[2] = v0.z, e[3] = v0.w, e[4] = v1.x, e[5] = v1.y, e[6] = v1.z, e[7] = v1.w;
}

__global__ void __launch_bounds__(128) quantize_x_kernel(const float *__restrict__ x, int64_t K, int64_t blocks,
                                                         xq_block *__restrict__ out) {
    grid_wait();
    const int lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (i >= blocks) return;
    const int64_t nb = K / QK, t = i / nb, b = i % nb;
    float e[8];
    load8(x + t * K + b * QK + 8 * lane, e);
    quantize_block(e, out + i, lane);
}

/* The integer gemv. A weight block of 256 is cut into 8 units of 32
 * elements: two runs of 16 (q4_k, q5_k: 16 bytes of nibbles, the low ones
 * run 1 in sub-block 2c, the high ones run 2 in sub-block 2c + 1, 32
 * elements further; q6_k: 16 bytes of its low nibbles, runs 64 elements
 * apart, with the 16 bytes of high bits they share). A warp takes R output
 * features; lanes 8 g .. 8 g + 7 take the 8 units of block 4 i + g of each
 * of the R rows, all loads of a round issued before any product (R x 2 or
 * 3 vectors of 16 bytes a lane in flight). Each x row's terms for the
 * unit (4 vectors of 16 bytes) are read once for the R rows. Per run the
 * level bytes meet hi and lo in __dp4a sums (exact int32); a unit's
 *   A = sc1 (254 s1hi + s1lo) + sc2 (254 s2hi + s2lo)   (q6_k: less 32 x sums)
 *   B = m1 sum16(run 1) + m2 sum16(run 2)                (q4_k, q5_k)
 * are the CPU's block integers restricted to the unit, exact; the unit adds
 * (u d) A - (u dmin) B to its lane's f32 sum, lanes summed at the end. So
 * the result is the CPU's og_kq_gemv but for the f32 order of the additions
 * (8 integer partials a block converted to f32 instead of one). */

template <og_dtype DT> struct unit_w {
    int32_t l1[4], l2[4]; /* level bytes of runs 1 and 2 */
    int sc1, sc2, m1, m2;
    float d, dmin;
};

/* One unit of R weight rows against one row of x's terms (both integer
 * gemvs): the exact integer sums of the comment above, then each row's f32
 * term added to acc[r]. e1: the unit's first element in the block. */
template <og_dtype DT, int R>
__device__ __forceinline__ void unit_rows(const xq_block *xb, int e1, const unit_w<DT> (&cu)[R], float *acc) {
    const int span = DT == OG_DTYPE_Q6_K ? 64 : 32; /* run 2 starts span elements after run 1 */
    const int c1 = 16 * chunk_at(e1 >> 4), c2 = 16 * chunk_at((e1 + span) >> 4);
    const uint4 h1 = *reinterpret_cast<const uint4 *>(xb->hi + c1);
    const uint4 h2 = *reinterpret_cast<const uint4 *>(xb->hi + c2);
    const uint4 o1 = *reinterpret_cast<const uint4 *>(xb->lo + c1);
    const uint4 o2 = *reinterpret_cast<const uint4 *>(xb->lo + c2);
    const int32_t x1 = xb->sum16[e1 >> 4], x2 = xb->sum16[(e1 + span) >> 4];
    const float u = xb->u;
    const int hv1[4] = {(int)h1.x, (int)h1.y, (int)h1.z, (int)h1.w};
    const int hv2[4] = {(int)h2.x, (int)h2.y, (int)h2.z, (int)h2.w};
    const int lv1[4] = {(int)o1.x, (int)o1.y, (int)o1.z, (int)o1.w};
    const int lv2[4] = {(int)o2.x, (int)o2.y, (int)o2.z, (int)o2.w};
#pragma unroll
    for (int r = 0; r < R; r++) {
        int a1 = 0, b1 = 0, a2 = 0, b2 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a1 = __dp4a(cu[r].l1[k], hv1[k], a1);
            b1 = __dp4a(cu[r].l1[k], lv1[k], b1);
            a2 = __dp4a(cu[r].l2[k], hv2[k], a2);
            b2 = __dp4a(cu[r].l2[k], lv2[k], b2);
        }
        const int32_t s1 = 254 * a1 + b1, s2 = 254 * a2 + b2; /* |s| <= 63 * 32385 * 16 */
        if (DT == OG_DTYPE_Q6_K) {
            const int64_t A = (int64_t)cu[r].sc1 * (s1 - 32 * x1) + (int64_t)cu[r].sc2 * (s2 - 32 * x2);
            acc[r] += (u * cu[r].d) * (float)A;
        } else { /* |A| <= 2 * 63 * 31 * 32385 * 16 < 2^31 */
            const int32_t A = cu[r].sc1 * s1 + cu[r].sc2 * s2, B = cu[r].m1 * x1 + cu[r].m2 * x2;
            acc[r] += (u * cu[r].d) * (float)A - (u * cu[r].dmin) * (float)B;
        }
    }
}

/* q4_k / q5_k scales and mins of sub-blocks 2c and 2c + 1 (unit pair c)
 * from the packed words of bytes 4..15 of the block (s[0..3], s[4..7],
 * s[8..11]): scale_min's bytes for all eight sub-blocks at once, a byte
 * each (0..3 from the low 6 bits of s0 and s1; 4..7 from the nibbles of s2
 * with the top 2 bits of s0 and s1 above them), then the pair's two. */
__device__ __forceinline__ void scale_min_pair(const uint32_t s[3], int c, int *sc1, int *sc2, int *m1, int *m2) {
    const uint32_t sc = c < 2 ? s[0] & 0x3F3F3F3Fu : (s[2] & 0x0F0F0F0Fu) | ((s[0] >> 2) & 0x30303030u);
    const uint32_t m = c < 2 ? s[1] & 0x3F3F3F3Fu : ((s[2] >> 4) & 0x0F0F0F0Fu) | ((s[1] >> 2) & 0x30303030u);
    const int at = 16 * (c & 1);
    *sc1 = (int)((sc >> at) & 255u), *sc2 = (int)((sc >> (at + 8)) & 255u);
    *m1 = (int)((m >> at) & 255u), *m2 = (int)((m >> (at + 8)) & 255u);
}

/* A unit's bytes as loaded, before decoding (kept raw so that a stream of
 * loads can be in flight while earlier units are summed):
 *  - q4_k / q5_k: hd = bytes 0..15 of the block (d, dmin, the 12 scale
 *    bytes), q = the unit's 16 bytes of nibbles, h = q5_k's 16 bytes of
 *    fifth bits;
 *  - q6_k (210-byte blocks, 2-byte aligned): q and h = the 5 aligned words
 *    around the unit's 16 bytes of low nibbles and of high bits, sh = how far
 *    to shift them (0 or 16 bits), hd.x = d | scale 1 << 16 | scale 2 << 24. */
struct unit_raw {
    uint4 hd;
    uint32_t q[5], h[5];
    unsigned sh;
};

/* The 5 aligned words from p rounded down to 4 (p 2-byte aligned) and the
 * shift that brings p's 16 bytes into place (a funnel shift). When p is
 * 4-byte aligned the fifth word (p + 16 .. p + 19) is read and unused;
 * callers keep it inside the block. When it is not, the first word starts
 * 2 bytes before p, inside the previous block (a block 2 mod 4 is never the
 * first of the tensor, whose base is 16-byte aligned). */
__device__ __forceinline__ unsigned ld_words5(const uint8_t *p, uint32_t v[5]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t *wp = reinterpret_cast<const uint32_t *>(a & ~static_cast<uintptr_t>(3));
#pragma unroll
    for (int k = 0; k < 5; k++) v[k] = __ldg(wp + k);
    return static_cast<unsigned>(a & 3u) * 8u; /* 0 or 16 */
}

/* Unit p of block b, raw. q6_k's bytes read stay in block b: ql + 16 + 4 <=
 * b + 132, qh + 16 + 4 <= b + 196 of 210. */
template <og_dtype DT> __device__ __forceinline__ void load_raw(const uint8_t *b, int p, unit_raw &r) {
    if (DT == OG_DTYPE_Q4_K || DT == OG_DTYPE_Q5_K) {
        const int c = p >> 1, l0 = 16 * (p & 1);
        r.hd = __ldg(reinterpret_cast<const uint4 *>(b));
        /* the levels are read once (ld_stream16: past L1); the header, which
           the block's 8 lanes share, through it */
        const uint4 q = ld_stream16(b + (DT == OG_DTYPE_Q4_K ? 16 : 48) + 32 * c + l0);
        r.q[0] = q.x, r.q[1] = q.y, r.q[2] = q.z, r.q[3] = q.w;
        if (DT == OG_DTYPE_Q5_K) {
            const uint4 h = __ldg(reinterpret_cast<const uint4 *>(b + 16 + l0)); /* fifth bits: 4 lanes share them */
            r.h[0] = h.x, r.h[1] = h.y, r.h[2] = h.z, r.h[3] = h.w;
        }
    } else { /* q6_k */
        const int h = p >> 2, j0 = 16 * (p & 3), e1 = 128 * h + j0;
        r.sh = ld_words5(b + 64 * h + j0, r.q);
        (void)ld_words5(b + 128 + 32 * h + (j0 & 31), r.h); /* the same shift: both offsets are even */
        r.hd.x = (uint32_t)__ldg(reinterpret_cast<const unsigned short *>(b + 208)) |
                 (uint32_t)__ldg(b + 192 + (e1 >> 4)) << 16 | (uint32_t)__ldg(b + 192 + ((e1 + 64) >> 4)) << 24;
    }
}

/* The levels, scales and mins of unit p from its raw bytes. */
template <og_dtype DT> __device__ __forceinline__ void decode_unit(const unit_raw &r, int p, unit_w<DT> &u) {
    if (DT == OG_DTYPE_Q4_K || DT == OG_DTYPE_Q5_K) {
        const int c = p >> 1;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u.l1[k] = (int32_t)(r.q[k] & 0x0F0F0F0Fu);
            u.l2[k] = (int32_t)((r.q[k] >> 4) & 0x0F0F0F0Fu);
            if (DT == OG_DTYPE_Q5_K) {
                u.l1[k] |= (int32_t)(((r.h[k] >> (2 * c)) & 0x01010101u) << 4);
                u.l2[k] |= (int32_t)(((r.h[k] >> (2 * c + 1)) & 0x01010101u) << 4);
            }
        }
        const uint32_t s[3] = {r.hd.y, r.hd.z, r.hd.w};
        scale_min_pair(s, c, &u.sc1, &u.sc2, &u.m1, &u.m2);
        u.d = __half2float(__ushort_as_half((unsigned short)(r.hd.x & 0xffffu)));
        u.dmin = __half2float(__ushort_as_half((unsigned short)(r.hd.x >> 16)));
    } else {
        const int k1 = (16 * (p & 3)) >> 5;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t lw = __funnelshift_r(r.q[k], r.q[k + 1], r.sh), hw = __funnelshift_r(r.h[k], r.h[k + 1], r.sh);
            u.l1[k] = (int32_t)((lw & 0x0F0F0F0Fu) | (((hw >> (2 * k1)) & 0x03030303u) << 4));
            u.l2[k] = (int32_t)(((lw >> 4) & 0x0F0F0F0Fu) | (((hw >> (2 * k1 + 4)) & 0x03030303u) << 4));
        }
        u.sc1 = (int8_t)(r.hd.x >> 16);
        u.sc2 = (int8_t)(r.hd.x >> 24);
        u.m1 = u.m2 = 0;
        u.d = __half2float(__ushort_as_half((unsigned short)(r.hd.x & 0xffffu)));
        u.dmin = 0.0f;
    }
}

template <og_dtype DT> __device__ __forceinline__ void load_unit(const uint8_t *b, int p, unit_w<DT> &u) {
    unit_raw r;
    load_raw<DT>(b, p, r);
    decode_unit<DT>(r, p, u);
}

template <og_dtype DT, int T, int R>
__global__ void __launch_bounds__(32 * WARPS) gemv_dp4a_kernel(const xq_block *__restrict__ xq,
                                                               const uint8_t *__restrict__ w,
                                                               const float *__restrict__ bias, int64_t nb, int64_t N,
                                                               float *__restrict__ out) {
    const int lane = threadIdx.x & 31, p = lane & 7;
    const int64_t n0 = ((int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
    if (n0 >= N) {
        grid_wait();
        return;
    }
    const int bb = block_bytes(DT);
    const int e1 = DT == OG_DTYPE_Q6_K ? 128 * (p >> 2) + 16 * (p & 3) : 64 * (p >> 1) + 16 * (p & 1);
    const uint8_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = w + (n0 + r < N ? n0 + r : N - 1) * nb * bb;
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[t][r] = 0.0f;
    /* The weights are read-only: the first round's loads are issued before
     * grid_wait, so they overlap the kernel before (x's quantization). With
     * 2 rows a warp (few registers) the next round's loads are issued before
     * this round's products; with 4 after them. */
    constexpr bool ahead = R == 2;
    unit_w<DT> wu[R];
    int64_t kb = lane >> 3;
    if (kb < nb) {
#pragma unroll
        for (int r = 0; r < R; r++) load_unit<DT>(rows[r] + kb * bb, p, wu[r]);
    }
    grid_wait();
    for (; kb < nb; kb += 4) {
        unit_w<DT> cu[R];
#pragma unroll
        for (int r = 0; r < R; r++) cu[r] = wu[r];
        if (ahead && kb + 4 < nb) {
#pragma unroll
            for (int r = 0; r < R; r++) load_unit<DT>(rows[r] + (kb + 4) * bb, p, wu[r]);
        }
#pragma unroll
        for (int t = 0; t < T; t++) unit_rows<DT, R>(xq + t * nb + kb, e1, cu, acc[t]);
        if (!ahead && kb + 4 < nb) {
#pragma unroll
            for (int r = 0; r < R; r++) load_unit<DT>(rows[r] + (kb + 4) * bb, p, wu[r]);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum(acc[t][r]);
            if (lane == 0 && n0 + r < N) out[t * N + n0 + r] = s + (bias ? bias[n0 + r] : 0.0f);
        }
}

/* Output features a warp: enough rows to read each unit of x once for
 * several weights (x's terms are 4x a unit's weight bytes a row of x). */
template <int T> constexpr int rows_per_warp() { return T <= 2 ? 2 : 4; }

template <og_dtype DT, int T>
void launch_dp4a(cudaStream_t st, const xq_block *xq, const uint8_t *w, const float *bias, int64_t nb, int64_t N,
                 float *out) {
    constexpr int R = rows_per_warp<T>();
    const dim3 grid((unsigned)((N + WARPS * R - 1) / (WARPS * R))), block(32 * WARPS);
    launch_pdl(gemv_dp4a_kernel<DT, T, R>, grid, block, st, xq, w, bias, nb, N, out);
}

template <og_dtype DT>
void gemv_dp4a_t(cudaStream_t st, const xq_block *xq, const uint8_t *w, const float *bias, int64_t T, int64_t nb,
                 int64_t N, float *out) {
    switch (T) {
    case 1: launch_dp4a<DT, 1>(st, xq, w, bias, nb, N, out); break;
    case 2: launch_dp4a<DT, 2>(st, xq, w, bias, nb, N, out); break;
    case 3: launch_dp4a<DT, 3>(st, xq, w, bias, nb, N, out); break;
    case 4: launch_dp4a<DT, 4>(st, xq, w, bias, nb, N, out); break;
    case 5: launch_dp4a<DT, 5>(st, xq, w, bias, nb, N, out); break;
    case 6: launch_dp4a<DT, 6>(st, xq, w, bias, nb, N, out); break;
    case 7: launch_dp4a<DT, 7>(st, xq, w, bias, nb, N, out); break;
    default: launch_dp4a<DT, 8>(st, xq, w, bias, nb, N, out); break;
    }
}

/* ---- the integer gemv, v2 (OG_CUDA_KQUANT_GEMV=v2) ----
 *
 * The same units and the same per-unit arithmetic as gemv_dp4a_kernel (so
 * the same integers A and B and the same f32 term a unit adds), cut
 * differently to keep more weight bytes in flight per SM:
 *  - a block of 128 threads takes R output features and splits K among its
 *    threads: thread i takes units i, i + 128, ... of each of the R rows (8
 *    units a block of 256, so a warp's 32 units are 4 consecutive blocks,
 *    one contiguous run of weight bytes; at K = 4096 a whole row is one
 *    unit a thread). All R rows' loads of a unit are issued together and
 *    the first ones before grid_wait (they overlap the quantization of x).
 *  - nothing is held across units (no loaded-ahead copy), which keeps the
 *    registers at what the launch bounds ask and the blocks per SM high:
 *    the bytes in flight come from many resident blocks, not from deep
 *    per-warp pipelines.
 *  - q6_k's level arrays (210-byte blocks, 2-byte aligned) are read as
 *    4-byte words from the aligned address below them and shifted into
 *    place (load_raw: 5 loads for 16 bytes instead of 8 two-byte ones; the
 *    first cut reads them so too).
 *  - sums: each lane's units, then warp_sum (5 levels), then the 4 warps'
 *    sums in a tree of 2 levels through shared memory, then the bias. */

constexpr int V2_THREADS = 128;

/* Blocks an SM the launch bounds ask for (so registers a thread: 65536 /
 * (128 x this)): as many as the decoded units, accumulators and a unit of x
 * fit without spilling (ptxas -v: 1 row 48-64 registers, 4 rows ~90 at
 * T = 1; T >= 3 ~150-168). */
template <int T, int R> constexpr int v2_min_blocks() {
    return T == 1 ? (R == 4 ? 5 : 6) : T == 2 ? (R == 4 ? 4 : 6) : 3;
}

template <og_dtype DT, int T, int R>
__global__ void __launch_bounds__(V2_THREADS, (v2_min_blocks<T, R>()))
    gemv_v2_kernel(const xq_block *__restrict__ xq, const uint8_t *__restrict__ w, const float *__restrict__ bias,
                   int64_t nb, int64_t N, float *__restrict__ out) {
    __shared__ float part[V2_THREADS / 32][T * R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t n0 = (int64_t)blockIdx.x * R;
    const int bb = block_bytes(DT);
    const int64_t units = nb * 8;
    const uint8_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = w + (n0 + r < N ? n0 + r : N - 1) * nb * bb;
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[t][r] = 0.0f;
    int64_t j = tid;
    unit_w<DT> cu[R];
    if (j < units) {
#pragma unroll
        for (int r = 0; r < R; r++) load_unit<DT>(rows[r] + (j >> 3) * bb, (int)(j & 7), cu[r]);
    }
    grid_wait(); /* the weights are read-only: the first unit's loads overlap the kernel before */
    while (j < units) {
        const int64_t kb = j >> 3;
        const int p = (int)(j & 7);
        const int e1 = DT == OG_DTYPE_Q6_K ? 128 * (p >> 2) + 16 * (p & 3) : 64 * (p >> 1) + 16 * (p & 1);
#pragma unroll
        for (int t = 0; t < T; t++) unit_rows<DT, R>(xq + t * nb + kb, e1, cu, acc[t]);
        j += V2_THREADS;
        if (j < units) {
#pragma unroll
            for (int r = 0; r < R; r++) load_unit<DT>(rows[r] + (j >> 3) * bb, (int)(j & 7), cu[r]);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum(acc[t][r]);
            if (lane == 0) part[warp][t * R + r] = s;
        }
    __syncthreads();
    if (tid < T * R) {
        const int t = tid / R, r = tid % R;
        const int64_t n = n0 + r;
        if (n < N)
            out[t * N + n] = ((part[0][tid] + part[1][tid]) + (part[2][tid] + part[3][tid])) + (bias ? bias[n] : 0.0f);
    }
}

/* Output features a block: 4, so that a unit of x (4x a unit's weight
 * bytes a row of x, read from L1) serves 4 weights and a thread has 4 units
 * of weights in flight, as long as that leaves about a wave of blocks (6 an
 * SM: the launch bounds' minimum at T <= 2); else 2, else 1 (q/k/v's 1024
 * rows: more, smaller blocks in flight). */
template <og_dtype DT, int T, int R>
void launch_v2_rows(cudaStream_t st, const xq_block *xq, const uint8_t *w, const float *bias, int64_t nb, int64_t N,
                    float *out) {
    launch_pdl(gemv_v2_kernel<DT, T, R>, dim3((unsigned)((N + R - 1) / R)), dim3(V2_THREADS), st, xq, w, bias, nb, N,
               out);
}

int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v < 1)
            return 132;
        return v;
    }();
    return n;
}

template <og_dtype DT, int T>
void launch_v2(cudaStream_t st, const xq_block *xq, const uint8_t *w, const float *bias, int64_t nb, int64_t N,
               float *out) {
    const int64_t wave = (int64_t)sm_count() * 6;
    if (N >= 4 * wave) launch_v2_rows<DT, T, 4>(st, xq, w, bias, nb, N, out);
    else if (N >= 2 * wave) launch_v2_rows<DT, T, 2>(st, xq, w, bias, nb, N, out);
    else launch_v2_rows<DT, T, 1>(st, xq, w, bias, nb, N, out);
}

template <og_dtype DT>
void gemv_v2_t(cudaStream_t st, const xq_block *xq, const uint8_t *w, const float *bias, int64_t T, int64_t nb,
               int64_t N, float *out) {
    switch (T) {
    case 1: launch_v2<DT, 1>(st, xq, w, bias, nb, N, out); break;
    case 2: launch_v2<DT, 2>(st, xq, w, bias, nb, N, out); break;
    case 3: launch_v2<DT, 3>(st, xq, w, bias, nb, N, out); break;
    case 4: launch_v2<DT, 4>(st, xq, w, bias, nb, N, out); break;
    case 5: launch_v2<DT, 5>(st, xq, w, bias, nb, N, out); break;
    case 6: launch_v2<DT, 6>(st, xq, w, bias, nb, N, out); break;
    case 7: launch_v2<DT, 7>(st, xq, w, bias, nb, N, out); break;
    default: launch_v2<DT, 8>(st, xq, w, bias, nb, N, out); break;
    }
}

/* ---- the integer gemv, streamed (variant 3; og_kquant_gemv_cuda_variant_for chooses) ----
 *
 * The same units, integers and per-unit f32 terms as gemv_dp4a_kernel, and
 * the same lanes: lane 8 g + p takes unit p of blocks g, g + 4, g + 8, ...
 * of a row, adds its terms to its own sum in that order, and the lanes'
 * sums meet by warp_sum. So its outputs are the first cut's bit for bit.
 * What changes is how the loads are kept in flight (gemv_q.cu's design,
 * whose q8 / q4 products went from 0.3-0.6 to 0.65-1.0 of the copy rate):
 *  - a warp's tasks are R output features each (R = 4, 2 or 1 as the
 *    product fills the device); it walks a task's rows in steps of 4
 *    blocks, and its loads run S_INFLIGHT / R steps ahead of its sums as
 *    one stream over all its tasks, so the next task's first steps are in
 *    flight while this one's last are summed; the first are issued before
 *    grid_wait (weights are never written by the kernel before);
 *  - the loads are kept raw (unit_raw) and decoded when summed;
 *  - a grid of at most two blocks of 8 warps an SM (launch bounds: 128
 *    registers), every warp the same number of tasks within one;
 *  - several parts of one input (the q, k, v projections) in one launch:
 *    part i owns tasks first[i] .. first[i + 1] - 1;
 *  - gate and up with the swiglu after them (sw set): a task is R / 2
 *    features of gate and the same R / 2 of up (R 2 or 4), and writes
 *    silu(gate) x up with swiglu_kernel's operations on the very values the
 *    two products would have written, so the same bits, one launch less. */

constexpr int S_WARPS = 8, S_THREADS = 32 * S_WARPS;
/* Row steps in flight a lane (R rows x steps ahead; q4_k's raw unit is 8
 * registers, q5_k's and q6_k's 12). Measured on an H100: q4_k lanes holding
 * one header word each (gathered by shuffles before decoding) with 8 steps
 * in flight were slower (gate/up 0.59 -> 0.53 of the copy rate, head 0.68
 * -> 0.61). */
constexpr int S_INFLIGHT = 4;

struct stream_params {
    const uint8_t *w[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    const float *bias[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    float *out[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    int64_t N[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    int64_t first[OG_KQUANT_GEMV_CUDA_MAX_PARTS + 1];
    int n;
    int64_t tasks;
    float *sw; /* gate / up: silu(out 0) x out 1 here instead of the two outputs */
    const xq_block *xq; /* x's terms, or NULL: the kernel writes them from x or the norm */
    const float *x;
    /* the add + rms_norm prologue (og_gemv_cuda_norm) when nm_a is set */
    const float *nm_a, *nm_b;
    const void *nm_w;
    bool nm_bf16;
    float nm_eps;
    float *nm_sum;
    int64_t nb, T;
};

/* Where the streamed gemv's x terms come from: p.xq (written by
 * quantize_x_kernel), p.x, or rms_norm(a + b) (the prologue); the last two
 * staged by every block in its shared memory. */
enum { X_GLOBAL, X_STAGE, X_NORM };

/* x's terms staged in shared memory by each block: up to 110 KB, so that two
 * blocks fit an SM (228 KB, 1 KB of it reserved a block). */
constexpr int64_t S_STAGE_MAX = 110 * 1024;
inline int64_t stage_bytes(int64_t T, int64_t nb) { return T * nb * (int64_t)sizeof(xq_block); }

/* The terms of the T rows of x (X_STAGE) or of rms_norm(a + b) (X_NORM,
 * rs: each row's 1 / rms) into sx (T x nb blocks), a warp a block of 256,
 * the loads of two blocks a warp issued together. The normed values are
 * add_rms_norm_kernel's bits: ((a + b) * rs) * w. */
template <int X>
__device__ __forceinline__ void stage_x(const stream_params &p, const float *rs, xq_block *sx, int warp, int lane) {
    const int64_t nb = p.nb, K = nb * QK, blocks = p.T * nb;
    for (int64_t i0 = warp; i0 < blocks; i0 += 2 * S_WARPS) {
        float e[2][8];
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int64_t i = i0 + b * S_WARPS, at = (i / nb) * K + (i % nb) * QK + 8 * lane;
            if (i >= blocks) continue;
            if (X == X_NORM) {
                float f[8];
                load8(p.nm_a + at, e[b]);
                load8(p.nm_b + at, f);
                const float r = rs[i / nb];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    e[b][j] = ((e[b][j] + f[j]) * r) * load_w(p.nm_w, p.nm_bf16, at - (i / nb) * K + j);
            } else {
                load8(p.x + at, e[b]);
            }
        }
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int64_t i = i0 + b * S_WARPS;
            if (i < blocks) quantize_block(e[b], sx + i, lane);
        }
    }
}

/* Each row's 1 / rms of a + b into rs, in add_rms_norm_kernel's order (256
 * threads, thread i summing elements i, i + 256, ... by fmaf, then
 * block_sum); block 0 writes the sums a + b. */
__device__ __forceinline__ void norm_scales(const stream_params &p, float *rs) {
    const int64_t K = p.nb * QK;
    for (int64_t t = 0; t < p.T; t++) {
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < K; i += S_THREADS) {
            const float v = p.nm_a[t * K + i] + p.nm_b[t * K + i];
            if (blockIdx.x == 0) p.nm_sum[t * K + i] = v;
            s = fmaf(v, v, s);
        }
        const float r = 1.0f / sqrtf(block_sum(s) / (float)K + p.nm_eps);
        if (threadIdx.x == 0) rs[t] = r;
    }
}

/* The part of a task and its first feature (R features a task). */
template <int R> __device__ __forceinline__ int stream_part(const stream_params &p, int64_t task, int64_t *n0) {
    if (p.sw) { /* features n0 .. n0 + R / 2 - 1 of both parts */
        *n0 = task * (R > 1 ? R / 2 : 1);
        return 0;
    }
    int part = 0;
    while (part + 1 < p.n && task >= p.first[part + 1]) part++;
    *n0 = (task - p.first[part]) * R;
    return part;
}

/* A warp's stream of unit loads: task by task (every stride-th), step by
 * step (4 blocks), the R rows of the task at each step. */
template <og_dtype DT, int R> struct stream_loader {
    int64_t task;
    int64_t step;
    const uint8_t *row[R];

    __device__ void seek(const stream_params &p, int bb) {
        int64_t n0;
        const int part = stream_part<R>(p, task, &n0);
        const int64_t N = p.N[part];
        constexpr int H = R > 1 ? R / 2 : 1;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t n = p.sw ? n0 + r % H : n0 + r; /* sw: rows of gate, then the same of up */
            row[r] = p.w[p.sw ? r / H : part] + (n < N ? n : N - 1) * p.nb * bb;
        }
    }
    /* Loads the next step's units into u (when the lane's block is in the
     * row) and moves on. */
    __device__ void issue(const stream_params &p, int64_t ntasks, int64_t stride, int64_t steps, int bb, int lane,
                          unit_raw u[R]) {
        if (task >= ntasks) return;
        const int64_t kb = 4 * step + (lane >> 3);
        if (kb < p.nb)
#pragma unroll
            for (int r = 0; r < R; r++) load_raw<DT>(row[r] + kb * bb, lane & 7, u[r]);
        if (++step == steps) {
            step = 0;
            task += stride;
            if (task < ntasks) seek(p, bb);
        }
    }
};

/* MT: rows of x the accumulators are sized for (T <= MT). X: where x's
 * terms come from (X_GLOBAL: p.xq; else every block writes them into its
 * shared memory as quantize_x_kernel would). */
template <og_dtype DT, int R, int MT, int X>
__global__ void __launch_bounds__(S_THREADS, 2) gemv_stream_kernel(stream_params p) {
    extern __shared__ uint4 smem_kq[];
    constexpr int U = S_INFLIGHT / R; /* steps in flight */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, up = lane & 7;
    const int bb = block_bytes(DT);
    const int e1 = DT == OG_DTYPE_Q6_K ? 128 * (up >> 2) + 16 * (up & 3) : 64 * (up >> 1) + 16 * (up & 1);
    const int64_t nb = p.nb, T = p.T, steps = (nb + 3) / 4;
    const int64_t ntasks = p.tasks, stride = (int64_t)gridDim.x * S_WARPS;
    int64_t task = (int64_t)warp * gridDim.x + blockIdx.x;
    stream_loader<DT, R> ld;
    ld.task = task, ld.step = 0;
    if (task < ntasks) ld.seek(p, bb);
    unit_raw buf[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) ld.issue(p, ntasks, stride, steps, bb, lane, buf[u]);
    grid_wait();
    const xq_block *xq = p.xq;
    if (X != X_GLOBAL) {
        __shared__ float rs[OG_KQUANT_GEMV_CUDA_MAX_T];
        if (X == X_NORM) {
            norm_scales(p, rs);
            __syncthreads();
        }
        xq_block *sx = reinterpret_cast<xq_block *>(smem_kq);
        stage_x<X>(p, rs, sx, warp, lane);
        __syncthreads();
        xq = sx;
    }
    float acc[MT][R];
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[t][r] = 0.0f;
    int64_t st = 0;
    while (task < ntasks) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            unit_raw cur[R];
#pragma unroll
            for (int r = 0; r < R; r++) cur[r] = buf[u][r];
            ld.issue(p, ntasks, stride, steps, bb, lane, buf[u]);
            const int64_t kb = 4 * st + (lane >> 3);
            if (kb < nb) {
                unit_w<DT> cu[R];
#pragma unroll
                for (int r = 0; r < R; r++) decode_unit<DT>(cur[r], up, cu[r]);
#pragma unroll
                for (int t = 0; t < MT; t++)
                    if (t < T) unit_rows<DT, R>(xq + t * nb + kb, e1, cu, acc[t]);
            }
            if (++st < steps) continue;
            /* the task's last step: its outputs */
            int64_t n0;
            const int part = stream_part<R>(p, task, &n0);
            const int64_t N = p.N[part];
            if constexpr (R > 1) {
                if (p.sw) {
                    constexpr int H = R / 2;
#pragma unroll
                    for (int t = 0; t < MT; t++)
#pragma unroll
                        for (int r = 0; r < H; r++) {
                            if (t < T) {
                                const float sg = warp_sum(acc[t][r]), su = warp_sum(acc[t][r + H]);
                                const int64_t n = n0 + r;
                                if (lane == 0 && n < N) {
                                    /* the outputs the products would write, then swiglu_kernel's operations */
                                    const float g = sg + (p.bias[0] ? p.bias[0][n] : 0.0f);
                                    const float u = su + (p.bias[1] ? p.bias[1][n] : 0.0f);
                                    p.sw[t * N + n] = g / (1.0f + expf(-g)) * u;
                                }
                            }
                            acc[t][r] = acc[t][r + H] = 0.0f;
                        }
                    st = 0;
                    task += stride;
                    if (task >= ntasks) break;
                    continue;
                }
            }
#pragma unroll
            for (int t = 0; t < MT; t++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (t < T) {
                        const float s = warp_sum(acc[t][r]);
                        const int64_t n = n0 + r;
                        if (lane == 0 && n < N) p.out[part][t * N + n] = s + (p.bias[part] ? p.bias[part][n] : 0.0f);
                    }
                    acc[t][r] = 0.0f;
                }
            st = 0;
            task += stride;
            if (task >= ntasks) break;
        }
    }
}

/* The grid: as few blocks as give every warp the same number of tasks
 * within one, two blocks an SM at most, at least one an SM while tasks
 * last. */
template <og_dtype DT, int R, int MT> og_status launch_stream(cudaStream_t st, stream_params &p, const int64_t *N, int n) {
    int64_t tasks = 0;
    for (int i = 0; i < n; i++) {
        p.first[i] = tasks;
        tasks += (N[i] + R - 1) / R;
    }
    p.first[n] = tasks;
    constexpr int H = R > 1 ? R / 2 : 1;
    if (p.sw) tasks = (N[0] + H - 1) / H; /* R / 2 features of both parts a task (R >= 2 here) */
    p.tasks = tasks;
    const int64_t sms = sm_count(), warps_max = sms * 2 * S_WARPS;
    const int64_t each = (tasks + warps_max - 1) / warps_max;
    int64_t blocks = ((tasks + each - 1) / each + S_WARPS - 1) / S_WARPS;
    if (blocks < sms) blocks = tasks < sms ? tasks : sms;
    if (!p.xq) {
        void (*staged)(stream_params) = gemv_stream_kernel<DT, R, MT, X_STAGE>;
        void (*normed)(stream_params) = gemv_stream_kernel<DT, R, MT, X_NORM>;
        constexpr cudaFuncAttribute smem_max = cudaFuncAttributeMaxDynamicSharedMemorySize;
        static const cudaError_t allowed = [&] {
            const cudaError_t e = cudaFuncSetAttribute(staged, smem_max, (int)S_STAGE_MAX);
            return e != cudaSuccess ? e : cudaFuncSetAttribute(normed, smem_max, (int)S_STAGE_MAX);
        }();
        void (*kernel)(stream_params) = p.nm_a ? normed : staged;
        if (allowed != cudaSuccess) {
            (void)cudaGetLastError();
            return og_set_error(OG_ERR_BACKEND, "kquant_gemv_cuda: %lld bytes of shared memory refused: %s",
                                (long long)S_STAGE_MAX, cudaGetErrorString(allowed));
        }
        launch_pdl_smem(kernel, dim3((unsigned)blocks), dim3(S_THREADS), (size_t)stage_bytes(p.T, p.nb), st, p);
    } else {
        launch_pdl(gemv_stream_kernel<DT, R, MT, X_GLOBAL>, dim3((unsigned)blocks), dim3(S_THREADS), st, p);
    }
    return OG_OK;
}

/* Rows a task: 4 where every warp of two blocks an SM still gets two tasks
 * or more (x's terms then serve 4 weight rows; q4_k at one row of x only,
 * where that fits 128 registers without spilling), 2 where it gets one,
 * else 1 (a small product's rows spread over every warp). */
/* OG_CUDA_KQUANT_ROWS=1|2|4: the rows a task whatever the product's size
 * (4 only where the rule below may take it, else 2; the swiglu pairs 2 at
 * least), to measure the rule; 0 when unset. Read at each call. */
int forced_rows() {
    const char *e = getenv("OG_CUDA_KQUANT_ROWS");
    const int v = e ? atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 ? v : 0;
}

template <og_dtype DT, int MT> og_status stream_rows(cudaStream_t st, stream_params &p, const int64_t *N, int n) {
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += N[i];
    const int64_t warps = (int64_t)sm_count() * 2 * S_WARPS;
    const int forced = forced_rows();
    if constexpr (DT == OG_DTYPE_Q4_K && MT == 1) {
        if (forced == 4 || (!forced && rows >= 8 * warps)) return launch_stream<DT, 4, MT>(st, p, N, n);
    }
    /* sw: gate and up rows pair up, 2 a task at least */
    if (forced >= 2 || (!forced && rows >= 2 * warps) || p.sw) return launch_stream<DT, 2, MT>(st, p, N, n);
    return launch_stream<DT, 1, MT>(st, p, N, n);
}

template <og_dtype DT> og_status gemv_stream_t(cudaStream_t st, stream_params &p, const int64_t *N, int n) {
    if (p.T == 1) return stream_rows<DT, 1>(st, p, N, n);
    if (p.T == 2) return stream_rows<DT, 2>(st, p, N, n);
    return stream_rows<DT, OG_KQUANT_GEMV_CUDA_MAX_T>(st, p, N, n);
}

/* ---- dequantization and embedding: a thread per element ---- */

template <og_dtype DT>
__global__ void dequant_kernel(const uint8_t *__restrict__ w, int64_t K, int64_t row0, int64_t count,
                               float *__restrict__ out) {
    grid_wait();
    const int bb = block_bytes(DT);
    const int64_t nb = K / QK;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = row0 + i / K, k = i % K;
        out[i] = elem<DT>(w + (r * nb + k / QK) * bb, (int)(k % QK));
    }
}

/* Row row0 + blockIdx.y as bf16 hi + lo (og_split8_bf16), 8 elements a
 * thread: no 64-bit division per element. */
template <og_dtype DT>
__global__ void dequant_split_kernel(const uint8_t *__restrict__ w, int64_t K, int64_t row0, __nv_bfloat16 *hi,
                                     __nv_bfloat16 *lo) {
    grid_wait();
    const int bb = block_bytes(DT);
    const int64_t nb = K / QK, r = blockIdx.y;
    const uint8_t *row = w + (row0 + r) * nb * bb;
    for (int64_t k = 8 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); k < K; k += 8 * (int64_t)gridDim.x * blockDim.x) {
        const uint8_t *b = row + (k / QK) * bb; /* K and QK powers of two apart: shifts */
        const int e = (int)(k % QK);
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = elem<DT>(b, e + j);
        og_split8_bf16(v, hi + r * K + k, lo + r * K + k);
    }
}

template <og_dtype DT>
__global__ void embed_kernel(const int32_t *__restrict__ tokens, const uint8_t *__restrict__ table, int64_t V,
                             int64_t H, float *__restrict__ out) {
    grid_wait();
    const int64_t t = blockIdx.x, id = tokens[t];
    const int bb = block_bytes(DT);
    const int64_t nb = H / QK;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
        out[t * H + h] = id >= 0 && id < V ? elem<DT>(table + (id * nb + h / QK) * bb, (int)(h % QK)) : NAN;
}

og_status check(const char *op, const void *w, og_dtype dt, int64_t rows, int64_t K) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: weight is NULL", op);
    if (!og_dtype_is_kquant(dt))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: weight dtype %s is not a k-quant", op, og_dtype_name(dt));
    if (rows < 1 || K < 1 || K % QK || rows > INT64_MAX / K)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a %s weight of [%lld, %lld]: K must be a multiple of %d", op,
                            og_dtype_name(dt), (long long)rows, (long long)K, QK);
    if (!aligned16(w)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: the weight must be 16-byte aligned", op);
    return OG_OK;
}

} /* namespace */

#define OG_KQ_DISPATCH(dt, CALL)                                                                                       \
    switch (dt) {                                                                                                      \
    case OG_DTYPE_Q2_K: CALL(OG_DTYPE_Q2_K); break;                                                                    \
    case OG_DTYPE_Q3_K: CALL(OG_DTYPE_Q3_K); break;                                                                    \
    case OG_DTYPE_Q4_K: CALL(OG_DTYPE_Q4_K); break;                                                                    \
    case OG_DTYPE_Q5_K: CALL(OG_DTYPE_Q5_K); break;                                                                    \
    default: CALL(OG_DTYPE_Q6_K); break;                                                                               \
    }

extern "C" og_status og_kquant_gemv_cuda(void *stream, const float *x, const void *w, const float *bias, og_dtype dt,
                                         int64_t T, int64_t K, int64_t N, float *out) {
    const char *op = "kquant_gemv_cuda";
    og_status rc = check(op, w, dt, N, K);
    if (rc != OG_OK) return rc;
    if (T < 1 || T > OG_KQUANT_GEMV_CUDA_MAX_T)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows (1 to %d)", op, (long long)T,
                            OG_KQUANT_GEMV_CUDA_MAX_T);
    if (!x || !out || !aligned16(x))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x or out is NULL, or x is not 16-byte aligned", op);
    if ((N + WARPS - 1) / WARPS > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: N = %lld", op, (long long)N);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
#define OG_KQ_GEMV(DT) rc = gemv_t<DT>(st, x, wb, bias, T, K, N, out)
    OG_KQ_DISPATCH(dt, OG_KQ_GEMV)
#undef OG_KQ_GEMV
    return rc;
}

extern "C" og_status og_kquant_dequantize_cuda(void *stream, const void *w, og_dtype dt, int64_t N, int64_t K,
                                               int64_t row0, int64_t rows, float *out) {
    const char *op = "kquant_dequantize_cuda";
    og_status rc = check(op, w, dt, N, K);
    if (rc != OG_OK) return rc;
    if (!out || row0 < 0 || rows < 1 || row0 + rows > N)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: rows %lld..%lld of %lld, or out is NULL", op, (long long)row0,
                            (long long)(row0 + rows), (long long)N);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const int64_t count = rows * K;
    const int64_t want = (count + 255) / 256;
    const dim3 grid((unsigned)(want < 65536 ? want : 65536)), block(256);
#define OG_KQ_DEQ(DT) launch_pdl(dequant_kernel<DT>, grid, block, st, wb, K, row0, count, out)
    OG_KQ_DISPATCH(dt, OG_KQ_DEQ)
#undef OG_KQ_DEQ
    return launched(op);
}

extern "C" og_status og_kquant_dequantize_split_cuda(void *stream, const void *w, og_dtype dt, int64_t N, int64_t K,
                                                     int64_t row0, int64_t rows, uint16_t *hi, uint16_t *lo) {
    const char *op = "kquant_dequantize_split_cuda";
    og_status rc = check(op, w, dt, N, K);
    if (rc != OG_OK) return rc;
    if (!hi || !lo || row0 < 0 || rows < 1 || rows > 65535 || row0 + rows > N)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: rows %lld..%lld of %lld (at most 65535 a call), or hi or lo is NULL",
                            op, (long long)row0, (long long)(row0 + rows), (long long)N);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const int64_t per_row = (K / 8 + 127) / 128;
    const dim3 grid((unsigned)per_row, (unsigned)rows), block(128);
    __nv_bfloat16 *h = reinterpret_cast<__nv_bfloat16 *>(hi), *l = reinterpret_cast<__nv_bfloat16 *>(lo);
#define OG_KQ_DEQ(DT) launch_pdl(dequant_split_kernel<DT>, grid, block, st, wb, K, row0, h, l)
    OG_KQ_DISPATCH(dt, OG_KQ_DEQ)
#undef OG_KQ_DEQ
    return launched(op);
}

extern "C" og_status og_kquant_embed_cuda(void *stream, const int32_t *tokens, int64_t T, const void *table,
                                          og_dtype dt, int64_t V, int64_t H, float *out) {
    const char *op = "kquant_embed_cuda";
    og_status rc = check(op, table, dt, V, H);
    if (rc != OG_OK) return rc;
    if (!tokens || !out || T < 1 || T > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld, or tokens or out is NULL", op, (long long)T);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint8_t *tb = static_cast<const uint8_t *>(table);
#define OG_KQ_EMB(DT) launch_pdl(embed_kernel<DT>, dim3((unsigned)T), dim3(256), st, tokens, tb, V, H, out)
    OG_KQ_DISPATCH(dt, OG_KQ_EMB)
#undef OG_KQ_EMB
    return launched(op);
}


extern "C" size_t og_kquant_x_cuda_bytes(int64_t T, int64_t K) {
    if (T < 1 || K < QK || K % QK) return 0;
    return (size_t)T * (size_t)(K / QK) * sizeof(xq_block);
}

extern "C" bool og_kquant_gemv_cuda_int8_takes(og_dtype dt) {
    return dt == OG_DTYPE_Q4_K || dt == OG_DTYPE_Q5_K || dt == OG_DTYPE_Q6_K;
}

extern "C" bool og_kquant_gemv_cuda_int8_wanted(void) {
    const char *v = getenv("OG_CUDA_KQUANT_GEMV");
    return !v || strcmp(v, "f32x") != 0; /* the default since it passed on an H200, 1.3-2.3x faster */
}

extern "C" og_status og_kquant_quantize_x_cuda(void *stream, const float *x, int64_t T, int64_t K, void *xq) {
    const char *op = "kquant_quantize_x_cuda";
    if (!x || !xq || !aligned16(x) || !aligned16(xq))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: x or xq is NULL or not 16-byte aligned", op);
    if (T < 1 || T > OG_KQUANT_GEMV_CUDA_MAX_T || K < QK || K % QK || K / QK > INT32_MAX / 8)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld, K = %lld (a multiple of %d)", op, (long long)T,
                            (long long)K, QK);
    const int64_t blocks = T * (K / QK);
    launch_pdl(quantize_x_kernel, dim3((unsigned)((blocks + 3) / 4)), dim3(128), static_cast<cudaStream_t>(stream), x,
               K, blocks, static_cast<xq_block *>(xq));
    return launched(op);
}

extern "C" int og_kquant_gemv_cuda_variant_for(int64_t T, og_dtype dt, int n_parts) {
    const char *v = getenv("OG_CUDA_KQUANT_GEMV");
    if (v && strcmp(v, "stream") == 0) return 3;
    if (v && strcmp(v, "v2") == 0) return 2;
    if (v && strcmp(v, "dp4a") == 0) return 1;
    /* measured on an H100 (bench_kquant_cuda, 8B products; bench/gpu/notes.md,
       "The streamed k-quant GEMV"): the streamed one wins where one launch
       serves several parts without a launch to write x's terms (q, k, v;
       gate and up) and on every q4_k product at one row; v2 (the second
       cut) elsewhere at 1 and 2 rows, the first cut from 3 rows on */
    if (T <= 2 && (n_parts > 1 || (T == 1 && dt == OG_DTYPE_Q4_K))) return 3;
    return T <= 2 ? 2 : 1;
}

/* The checks every integer gemv entry makes of a product. */
static og_status check_int8(const char *op, const void *xq, const void *w, const float *out, og_dtype dt, int64_t T,
                            int64_t K, int64_t N) {
    og_status rc = check(op, w, dt, N, K);
    if (rc != OG_OK) return rc;
    if (!og_kquant_gemv_cuda_int8_takes(dt))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: no integer gemv for %s (q4_k, q5_k, q6_k)", op,
                            og_dtype_name(dt));
    if (T < 1 || T > OG_KQUANT_GEMV_CUDA_MAX_T)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %lld rows (1 to %d)", op, (long long)T,
                            OG_KQUANT_GEMV_CUDA_MAX_T);
    if (!xq || !out || !aligned16(xq))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: xq or out is NULL, or xq is not 16-byte aligned", op);
    if (N > INT32_MAX) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: N = %lld", op, (long long)N);
    return OG_OK;
}

/* Variant 3 over n parts (checked): from x's terms xq, or with xq NULL
 * from x, each block writing the terms (they fit S_STAGE_MAX). */
static og_status gemv_stream(const char *op, cudaStream_t st, const void *xq, const float *x, og_dtype dt, int64_t T,
                             int64_t K, const og_gemv_cuda_part *parts, int n, const og_gemv_cuda_norm *norm = NULL,
                             float *sw = NULL) {
    stream_params p;
    memset(&p, 0, sizeof p);
    p.sw = sw;
    if (norm) {
        p.nm_a = norm->a, p.nm_b = norm->b, p.nm_w = norm->weight, p.nm_bf16 = norm->weight_dtype == OG_DTYPE_BF16;
        p.nm_eps = norm->eps, p.nm_sum = norm->sum;
    }
    int64_t N[OG_KQUANT_GEMV_CUDA_MAX_PARTS];
    for (int i = 0; i < n; i++) {
        p.w[i] = static_cast<const uint8_t *>(parts[i].weight);
        p.bias[i] = static_cast<const float *>(parts[i].bias);
        p.out[i] = parts[i].out;
        N[i] = p.N[i] = parts[i].N;
    }
    p.n = n;
    p.xq = static_cast<const xq_block *>(xq);
    p.x = x;
    p.nb = K / QK;
    p.T = T;
    og_status rc;
    switch (dt) {
    case OG_DTYPE_Q4_K: rc = gemv_stream_t<OG_DTYPE_Q4_K>(st, p, N, n); break;
    case OG_DTYPE_Q5_K: rc = gemv_stream_t<OG_DTYPE_Q5_K>(st, p, N, n); break;
    default: rc = gemv_stream_t<OG_DTYPE_Q6_K>(st, p, N, n); break;
    }
    return rc != OG_OK ? rc : launched(op);
}

static og_status gemv_int8(const char *op, int variant, const void *xq, const void *w, const float *bias,
                           og_dtype dt, int64_t T, int64_t K, int64_t N, float *out, void *stream) {
    og_status rc = check_int8(op, xq, w, out, dt, T, K, N);
    if (rc != OG_OK) return rc;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (variant == 3) {
        const og_gemv_cuda_part part = {w, bias, N, out};
        return gemv_stream(op, st, xq, NULL, dt, T, K, &part, 1);
    }
    const xq_block *xb = static_cast<const xq_block *>(xq);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const int64_t nb = K / QK;
    if (variant == 2) {
        switch (dt) {
        case OG_DTYPE_Q4_K: gemv_v2_t<OG_DTYPE_Q4_K>(st, xb, wb, bias, T, nb, N, out); break;
        case OG_DTYPE_Q5_K: gemv_v2_t<OG_DTYPE_Q5_K>(st, xb, wb, bias, T, nb, N, out); break;
        default: gemv_v2_t<OG_DTYPE_Q6_K>(st, xb, wb, bias, T, nb, N, out); break;
        }
        return launched(op);
    }
    switch (dt) {
    case OG_DTYPE_Q4_K: gemv_dp4a_t<OG_DTYPE_Q4_K>(st, xb, wb, bias, T, nb, N, out); break;
    case OG_DTYPE_Q5_K: gemv_dp4a_t<OG_DTYPE_Q5_K>(st, xb, wb, bias, T, nb, N, out); break;
    default: gemv_dp4a_t<OG_DTYPE_Q6_K>(st, xb, wb, bias, T, nb, N, out); break;
    }
    return launched(op);
}

extern "C" og_status og_kquant_gemv_int8_cuda(void *stream, const void *xq, const void *w, const float *bias,
                                              og_dtype dt, int64_t T, int64_t K, int64_t N, float *out) {
    return gemv_int8("kquant_gemv_int8_cuda", og_kquant_gemv_cuda_variant_for(T, dt, 1), xq, w, bias, dt, T, K, N,
                     out, stream);
}

extern "C" og_status og_kquant_gemv_int8_variant_cuda(void *stream, int variant, const void *xq, const void *w,
                                                      const float *bias, og_dtype dt, int64_t T, int64_t K, int64_t N,
                                                      float *out) {
    if (variant < 1 || variant > 3)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kquant_gemv_int8_variant_cuda: variant %d (1, 2 or 3)", variant);
    return gemv_int8("kquant_gemv_int8_variant_cuda", variant, xq, w, bias, dt, T, K, N, out, stream);
}

extern "C" og_status og_kquant_gemv_int8_multi_cuda(void *stream, int variant, const void *xq, og_dtype dt, int64_t T,
                                                    int64_t K, const og_gemv_cuda_part *parts, int n) {
    const char *op = "kquant_gemv_int8_multi_cuda";
    if (variant < 0 || variant > 3 || !parts || n < 1 || n > OG_KQUANT_GEMV_CUDA_MAX_PARTS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: variant %d (0 to 3), %d parts (1 to %d)", op, variant, n,
                            OG_KQUANT_GEMV_CUDA_MAX_PARTS);
    const int v = variant ? variant : og_kquant_gemv_cuda_variant_for(T, dt, n);
    for (int i = 0; i < n; i++) {
        og_status rc = check_int8(op, xq, parts[i].weight, parts[i].out, dt, T, K, parts[i].N);
        if (rc != OG_OK) return rc;
        if (v != 3) {
            rc = gemv_int8(op, v, xq, parts[i].weight, static_cast<const float *>(parts[i].bias), dt, T, K, parts[i].N,
                           parts[i].out, stream);
            if (rc != OG_OK) return rc;
        }
    }
    return v == 3 ? gemv_stream(op, static_cast<cudaStream_t>(stream), xq, NULL, dt, T, K, parts, n) : OG_OK;
}

/* Whether the streamed gemv runs from x's rows (or the norm's) staged in
 * shared memory: variant 3 chosen and the terms fit. */
static bool stages(int variant, int64_t T, int64_t K) {
    return variant == 3 && K >= QK && K % QK == 0 && T >= 1 && T <= OG_KQUANT_GEMV_CUDA_MAX_T &&
           stage_bytes(T, K / QK) <= S_STAGE_MAX;
}

extern "C" bool og_kquant_gemv_cuda_norm_takes(og_dtype dt, int64_t T, int64_t K, int n_parts) {
    return og_kquant_gemv_cuda_int8_takes(dt) && og_kquant_gemv_cuda_int8_wanted() &&
           stages(og_kquant_gemv_cuda_variant_for(T, dt, n_parts), T, K);
}

/* og_kquant_gemv_x_multi_cuda, and with sw the gate / up pair whose swiglu
 * it writes (og_kquant_gemv_x_swiglu_cuda). */
static og_status x_multi(const char *op, void *stream, const float *x, const og_gemv_cuda_norm *norm, void *xq,
                         og_dtype dt, int64_t T, int64_t K, const og_gemv_cuda_part *parts, int n, float *sw) {
    if (!parts || n < 1 || n > OG_KQUANT_GEMV_CUDA_MAX_PARTS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %d parts (1 to %d)", op, n, OG_KQUANT_GEMV_CUDA_MAX_PARTS);
    if (norm ? x || !norm->a || !norm->b || !norm->weight || !norm->sum || !aligned16(norm->a) || !aligned16(norm->b) ||
                   (norm->weight_dtype != OG_DTYPE_F32 && norm->weight_dtype != OG_DTYPE_BF16)
             : !x || !aligned16(x))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: give x (16-byte aligned) or a norm prologue (a, b 16-byte aligned, an f32 or bf16 "
                            "weight, sum), not both",
                            op);
    if (norm && !og_kquant_gemv_cuda_norm_takes(dt, T, K, n))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: no norm prologue for %d %s parts of %lld x %lld", op, n,
                            og_dtype_name(dt), (long long)T, (long long)K);
    if (sw && (n != 2 || parts[0].N != parts[1].N || !og_kquant_gemv_cuda_swiglu_takes(dt, T, K)))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: gate and up of one width, where og_kquant_gemv_cuda_swiglu_takes (%s, %lld x %lld)",
                            op, og_dtype_name(dt), (long long)T, (long long)K);
    const int v = og_kquant_gemv_cuda_variant_for(T, dt, n); /* the environment read once a call */
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (norm || stages(v, T, K)) {
        const void *from = norm ? (const void *)norm->a : (const void *)x;
        for (int i = 0; i < n; i++) {
            /* x (or a) stands in for xq: the checks of xq (non-NULL, aligned) hold for it */
            og_status rc = check_int8(op, from, parts[i].weight, sw ? sw : parts[i].out, dt, T, K, parts[i].N);
            if (rc != OG_OK) return rc;
        }
        return gemv_stream(op, st, NULL, x, dt, T, K, parts, n, norm, sw);
    }
    og_status rc = og_kquant_quantize_x_cuda(stream, x, T, K, xq);
    if (rc != OG_OK || !sw) return rc != OG_OK ? rc : og_kquant_gemv_int8_multi_cuda(stream, v, xq, dt, T, K, parts, n);
    for (int i = 0; i < n; i++) {
        rc = check_int8(op, xq, parts[i].weight, sw, dt, T, K, parts[i].N);
        if (rc != OG_OK) return rc;
    }
    return gemv_stream(op, st, xq, NULL, dt, T, K, parts, n, NULL, sw);
}

extern "C" og_status og_kquant_gemv_x_multi_cuda(void *stream, const float *x, const og_gemv_cuda_norm *norm, void *xq,
                                                og_dtype dt, int64_t T, int64_t K, const og_gemv_cuda_part *parts,
                                                int n) {
    return x_multi("kquant_gemv_x_multi_cuda", stream, x, norm, xq, dt, T, K, parts, n, NULL);
}

extern "C" bool og_kquant_gemv_cuda_swiglu_takes(og_dtype dt, int64_t T, int64_t K) {
    return og_kquant_gemv_cuda_int8_takes(dt) && og_kquant_gemv_cuda_int8_wanted() && K >= QK && K % QK == 0 &&
           T >= 1 && T <= OG_KQUANT_GEMV_CUDA_MAX_T && og_kquant_gemv_cuda_variant_for(T, dt, 2) == 3;
}

extern "C" og_status og_kquant_gemv_x_swiglu_cuda(void *stream, const float *x, const og_gemv_cuda_norm *norm, void *xq,
                                                 og_dtype dt, int64_t T, int64_t K, const og_gemv_cuda_part parts[2],
                                                 float *out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kquant_gemv_x_swiglu_cuda: out is NULL");
    return x_multi("kquant_gemv_x_swiglu_cuda", stream, x, norm, xq, dt, T, K, parts, 2, out);
}
