/* CUDA kernels for k-quant weights (q2_k .. q6_k: llama.cpp's super-blocks,
 * docs/program-format.md), callable from C. Conventions as ops_cuda.h's:
 * `stream` is a cudaStream_t as void *, pointers are device pointers,
 * arguments are checked on the host before anything is enqueued, launches
 * are checked; nothing allocates. Weights must be 16-byte aligned (a
 * cudaMalloc'd tensor is), x 16-byte aligned, K a multiple of 256.
 *
 * Numerics: f32 x and the exact dequantized weights (the values of
 * og_kquant_dequantize_row, bit for bit), f32 sums. The gemv sums each
 * lane's few products per sub-block, then scales them (d * scale, and
 * less dmin * min times the lane's sum of x); that differs from the
 * reference's sum of x * w by rounding only.
 *
 * Letters: T rows of x, K in features, N out features, V vocabulary, H
 * hidden size. */
#ifndef OG_KERNELS_CUDA_KQUANT_CUDA_H
#define OG_KERNELS_CUDA_KQUANT_CUDA_H

#ifdef __cplusplus
extern "C" { /* core.h has no C++ guard of its own */
#endif

#include "core/core.h"
#include "kernels/cuda/ops_cuda.h" /* og_gemv_cuda_part */

/* Rows of x a k-quant gemv takes in one launch (each weight read once). */
#define OG_KQUANT_GEMV_CUDA_MAX_T 8
/* Products of one x a multi-part launch takes (og_kquant_gemv_int8_multi_cuda). */
#define OG_KQUANT_GEMV_CUDA_MAX_PARTS OG_GEMV_CUDA_MAX_PARTS

/* out = x @ w^T (+ bias), T in [1, OG_KQUANT_GEMV_CUDA_MAX_T]: a warp per
 * output feature, the weights streamed once for all T rows. bias NULL or
 * [N] f32. out must not overlap x. */
og_status og_kquant_gemv_cuda(void *stream, const float *x /* [T, K] */, const void *w /* [N, K] */,
                              const float *bias /* [N] or NULL */, og_dtype dt, int64_t T, int64_t K, int64_t N,
                              float *out /* [T, N] */);

/* The integer gemv (q4_k, q5_k, q6_k): x written first as the CPU's int8
 * terms (og_kq_quantize_x of kquant_cpu.h, bit for bit: hi, lo, the sums by
 * 16 and u), then each unit of 32 weights dotted with them by __dp4a in
 * exact integers, scaled per unit as the CPU scales per block:
 *   out = sum over units of (u d) A - (u dmin) B  (+ bias)
 * So out differs from the CPU's og_kq_gemv (the same x terms) by the f32
 * order of the additions only, and from the exact product of f32 x by x's
 * rounding (kquant_cpu.h: at most amax / 64516 an element of a block).
 * The back end takes it where og_kquant_gemv_cuda_int8_wanted() (unless
 * the environment sets OG_CUDA_KQUANT_GEMV=f32x, read at each call) and
 * og_kquant_gemv_cuda_int8_takes(dt).
 *
 * og_kquant_x_cuda_bytes: bytes of xq for T rows of K (0 if K is not a
 * positive multiple of 256). og_kquant_quantize_x_cuda writes them (T in
 * [1, OG_KQUANT_GEMV_CUDA_MAX_T], x and xq 16-byte aligned); one xq serves
 * every product of that x. */
size_t og_kquant_x_cuda_bytes(int64_t T, int64_t K);
bool og_kquant_gemv_cuda_int8_takes(og_dtype dt);
bool og_kquant_gemv_cuda_int8_wanted(void);
og_status og_kquant_quantize_x_cuda(void *stream, const float *x /* [T, K] */, int64_t T, int64_t K, void *xq);
og_status og_kquant_gemv_int8_cuda(void *stream, const void *xq /* T rows of K */, const void *w /* [N, K] */,
                                   const float *bias /* [N] or NULL */, og_dtype dt, int64_t T, int64_t K, int64_t N,
                                   float *out /* [T, N] */);

/* The integer gemv's variants: 1, the first cut (gemv_dp4a_kernel: a warp
 * takes 2 or 4 output features for the whole of K); 2, the second cut
 * (gemv_v2_kernel: a block of 128 threads splits K for a few output
 * features, the warps' sums added through shared memory, so its sums of
 * unit terms are ordered differently: each lane ceil(K / 32768) terms, 5
 * shuffle levels, 2 levels across the warps; else the same bounds); 3, the
 * streamed one (gemv_stream_kernel: the first cut's lanes and order of
 * sums, so its outputs bit for bit, with a warp's loads kept in flight
 * across its tasks, and several products of one x in one launch).
 * og_kquant_gemv_int8_cuda runs the variant og_kquant_gemv_cuda_variant_for
 * (T, dt, 1) names, og_kquant_gemv_int8_multi_cuda with variant 0 and
 * og_kquant_gemv_x_multi_cuda the one it names for their parts: 3 at 1 or
 * 2 rows for several parts and at one row for q4_k, else 2 at 1 or 2 rows
 * and 1 from 3 rows on (where each was fastest on an H100);
 * OG_CUDA_KQUANT_GEMV=stream, v2 or dp4a makes it 3, 2 or 1 everywhere
 * (read at each call). og_kquant_gemv_int8_variant_cuda runs the variant it is given
 * whatever the environment says (tests, benchmarks). */
int og_kquant_gemv_cuda_variant_for(int64_t T, og_dtype dt, int n_parts);
og_status og_kquant_gemv_int8_variant_cuda(void *stream, int variant, const void *xq /* T rows of K */,
                                           const void *w /* [N, K] */, const float *bias /* [N] or NULL */,
                                           og_dtype dt, int64_t T, int64_t K, int64_t N, float *out /* [T, N] */);

/* The products of one x (its terms xq) by n_parts weights of one k-quant
 * dtype (biases f32 or NULL): with variant 3 (og_kquant_gemv_cuda_variant_for,
 * or variant > 0 given) in one launch, else part by part. variant 0: the
 * environment's choice. */
og_status og_kquant_gemv_int8_multi_cuda(void *stream, int variant, const void *xq /* T rows of K */, og_dtype dt,
                                         int64_t T, int64_t K, const og_gemv_cuda_part *parts, int n_parts);

/* The same products from f32 x: where variant 3 is chosen
 * (og_kquant_gemv_cuda_variant_for(T, dt, n_parts)) and the T rows' terms fit
 * a block's shared memory (T x K / 256 x 592 bytes <= 110 KB: K 12288 up to
 * 3 rows, K 4096 up to 8), one launch whose every block writes the terms for
 * itself (the same terms, so the same outputs); else the terms written into
 * xq (og_kquant_x_cuda_bytes(T, K)) by og_kquant_quantize_x_cuda, then
 * og_kquant_gemv_int8_multi_cuda.
 * With norm (x NULL) the products take the add + rms_norm prologue of
 * og_gemv_norm_multi_cuda: x = rms_norm(a + b) with add_rms_norm_kernel's
 * bits, never written, and sum = a + b written; only where
 * og_kquant_gemv_cuda_norm_takes (the staged, streamed case). */
bool og_kquant_gemv_cuda_norm_takes(og_dtype dt, int64_t T, int64_t K, int n_parts);
og_status og_kquant_gemv_x_multi_cuda(void *stream, const float *x /* [T, K] or NULL */, const og_gemv_cuda_norm *norm,
                                      void *xq, og_dtype dt, int64_t T, int64_t K, const og_gemv_cuda_part *parts,
                                      int n_parts);

/* silu(gate) x up of one x, the gate and up products (parts[0], parts[1]:
 * one width N, their outs unused) in one launch of the streamed gemv: a
 * task takes features of both, and out [T, N] gets og_swiglu_cuda's bits
 * of the outputs og_kquant_gemv_x_multi_cuda would have written. x or the
 * norm prologue as there; only where og_kquant_gemv_cuda_swiglu_takes (the
 * streamed gemv chosen for two parts). */
bool og_kquant_gemv_cuda_swiglu_takes(og_dtype dt, int64_t T, int64_t K);
og_status og_kquant_gemv_x_swiglu_cuda(void *stream, const float *x /* [T, K] or NULL */, const og_gemv_cuda_norm *norm,
                                       void *xq, og_dtype dt, int64_t T, int64_t K, const og_gemv_cuda_part parts[2],
                                       float *out /* [T, N] */);

/* Rows row0 .. row0 + rows - 1 of a [N, K] k-quant weight as f32, bit for
 * bit og_kquant_dequantize_row's: the panel a cuBLAS product of a wide step
 * multiplies. */
og_status og_kquant_dequantize_cuda(void *stream, const void *w /* [N, K] */, og_dtype dt, int64_t N, int64_t K,
                                    int64_t row0, int64_t rows, float *out /* [rows, K] */);
/* The same rows as bf16 hi + lo (og_dequantize_split_cuda, which calls it). */
og_status og_kquant_dequantize_split_cuda(void *stream, const void *w /* [N, K] */, og_dtype dt, int64_t N, int64_t K,
                                          int64_t row0, int64_t rows, uint16_t *hi, uint16_t *lo);

/* out[t] = row tokens[t] of a k-quant table as f32 (og_embed_ref's bits). A
 * token outside [0, V) gives a row of NaN (the host checks ids before). */
og_status og_kquant_embed_cuda(void *stream, const int32_t *tokens /* [T] */, int64_t T, const void *table /* [V, H] */,
                               og_dtype dt, int64_t V, int64_t H, float *out /* [T, H] */);

#ifdef __cplusplus
}
#endif

#endif
