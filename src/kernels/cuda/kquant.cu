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
 * Letters as in kquant_cuda.h: T rows of x, K in features, N out features. */
#include "kernels/cuda/kquant_cuda.h"

#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

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
