/* Shared by the reference and fast versions of the ops in ops.h: argument
 * checks (so both refuse exactly the same inputs) and the ISA-specific inner
 * loops of ops_simd.c. Not part of the public API.
 * Letters as in ops.h. */
#ifndef OG_KERNELS_OPS_INTERNAL_H
#define OG_KERNELS_OPS_INTERNAL_H

#include "kernels/ops.h"

/* ---- argument checks: each sets the error naming op and argument ---- */

/* NULL is refused. */
og_status og_ops_check_ptr(const void *p, const char *op, const char *name);
/* value >= 1. */
og_status og_ops_check_dim(int64_t value, const char *op, const char *name);
/* BF16 or F32. */
og_status og_ops_check_weight_dtype(og_dtype dt, const char *op, const char *name);
/* A matrix of weights (matmul weight, embedding table): BF16, F32, Q8, Q4
 * or a k-quant. */
og_status og_ops_check_matrix_dtype(og_dtype dt, const char *op, const char *name);
/* Bytes of a [rows, cols] matrix of dt (og_tensor_bytes) into *bytes; a
 * quantized one needs cols a multiple of its block (og_quant_block_elems). */
og_status og_ops_check_matrix_size(og_dtype dt, int64_t rows, int64_t cols, const char *op,
                                   const char *name, size_t *bytes);
/* rows * cols * elem bytes fits in size_t; *bytes gets the product. */
og_status og_ops_check_size(int64_t rows, int64_t cols, size_t elem, const char *op,
                            const char *name, size_t *bytes);
/* out and in are the same buffer or do not overlap at all. */
og_status og_ops_check_alias(const void *out, const void *in, size_t bytes, const char *op,
                             const char *in_name);
/* out and in (of in_bytes) do not overlap at all. */
og_status og_ops_check_disjoint(const void *out, size_t out_bytes, const void *in,
                                size_t in_bytes, const char *op, const char *in_name);

/* The checks shared by og_rms_norm_* and og_head_rms_norm_* (rows of N). */
og_status og_ops_check_rms_norm(const char *op, const float *x, const void *weight,
                                og_dtype weight_dtype, int64_t rows, int64_t N, float eps,
                                const float *out);
og_status og_ops_check_matmul(const float *x, const void *weight, const void *bias,
                              og_dtype weight_dtype, int64_t T, int64_t K, int64_t N,
                              const float *out);
og_status og_ops_check_rope(const char *op, const og_rope_table *table, const float *x,
                            const int32_t *positions, int64_t T, int64_t n, const float *out);
og_status og_ops_check_embed(const char *op, const int32_t *tokens, int64_t T,
                             const void *table, og_dtype table_dtype, int64_t V, int64_t H,
                             const float *out);
og_status og_ops_check_binary(const char *op, const float *a, const char *a_name,
                              const float *b, const char *b_name, int64_t rows, int64_t cols,
                              const float *out);

/* ---- SIMD inner loops (ops_simd.c); callers pick them by og_cpu_isa ---- */

/* out[r] = dot(x, w[r]) for r in [0, rows): x [K], w [rows, K] of dt. The
 * AVX-512 loop reads bf16 weights against xp, x split by
 * og_split_even_odd_avx512 (unused for f32). */
void og_gemv_rows_avx512(const float *x /* [K] */, const float *xp /* [K] */, const void *w /* [rows, K] */,
                         og_dtype dt, int64_t K, int64_t rows, float *out /* [rows] */);
void og_gemv_rows_avx2(const float *x /* [K] */, const void *w /* [rows, K] */, og_dtype dt,
                       int64_t K, int64_t rows, float *out /* [rows] */);

/* og_matmul_rows_cpu's AVX-512 inner loop: out[r * ldo + f] for R rows of x
 * and the `rows` weight rows of w, each bit for bit what
 * og_gemv_rows_avx512 gives row r of x on a block of weights holding them.
 * The first rows_eo weight rows (bf16 only; 0 for f32) take the GEMV's
 * even/odd scheme (its groups of 4) and read xp, x split by
 * og_split_even_odd_avx512; the rest take the GEMV's 16-wide scheme (its
 * leftover rows, and every f32 row) and read x. */
void og_matmul_rows_avx512(const float *x /* [R, K] */, const float *xp /* [R, K] */,
                           const void *w /* [rows, K] */, og_dtype dt, int64_t R, int64_t K,
                           int64_t rows, int64_t rows_eo,
                           float *scratch /* [og_matmul_rows_avx512_scratch(K, rows)] */,
                           float *out /* [R, ldo] */, int64_t ldo);
/* Floats of scratch og_matmul_rows_avx512 needs for a block of `rows`
 * weight rows (0: none, scratch may be NULL); long rows of K are swept in
 * chunks, the sums resting in scratch between them. */
size_t og_matmul_rows_avx512_scratch(int64_t K, int64_t rows);
/* xp = x with every whole 32-element chunk split into its 16 even then its
 * 16 odd elements (the order the bf16 GEMV pairs them with the weights);
 * the tail of K (< 32) is copied as is. */
void og_split_even_odd_avx512(const float *x /* [K] */, int64_t K, float *xp /* [K] */);

/* Quantized (q8, q4) weights: `rows` rows of K whose quants start at q
 * (og_quant_row_bytes(dt, K) bytes a row) and whose f16 scales start at s
 * ([rows, K / OG_QUANT_GROUP]; the planes of a block of rows of a [N, K]
 * tensor are apart, see og_quant_scales).
 * gemv: out[r] = dot(x, w[r]). Every row is summed in one order whatever
 * `rows` and its place in the block (group by group: the 32 products of a
 * group into lanes, times the group's scale into the row's sums), so the
 * results do not depend on how N is split into blocks. stream: the weights
 * are read from memory once per token, so the next rows are prefetched into
 * L2 only; else into every cache level. */
void og_gemv_q_rows_avx512(const float *x /* [K] */, const uint8_t *q, const og_f16 *s,
                           og_dtype dt, int64_t K, int64_t rows, bool stream,
                           float *out /* [rows] */);
void og_gemv_q_rows_avx2(const float *x /* [K] */, const uint8_t *q, const og_f16 *s,
                         og_dtype dt, int64_t K, int64_t rows, bool stream,
                         float *out /* [rows] */);
/* og_matmul_rows_cpu's AVX-512 loop for q8/q4 weights: out[r * ldo + f]
 * for R rows of x and the `rows` weight rows at q, s (as above), each bit
 * for bit what og_gemv_q_rows_avx512 gives row r of x; stream as there. */
void og_matmul_rows_q_avx512(const float *x /* [R, K] */, const uint8_t *q, const og_f16 *s,
                             og_dtype dt, int64_t R, int64_t K, int64_t rows, bool stream,
                             float *out /* [R, ldo] */, int64_t ldo);
/* Rows [n0, n0 + rows) of a [N, K] quantized weight (q8, q4 or a k-quant)
 * as f32, exact: og_dequantize_row's values, at the ISA level isa. */
void og_dequantize_rows_cpu(og_cpu_isa isa, og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n0,
                            int64_t rows, float *dst /* [rows, K] */);
/* Rows [n0, n0 + rows) of a q8 / q4 weight as their integers q in bf16
 * (exact: |q| <= 128), ints [rows, K], and their group scales in f32,
 * scales [rows, K / OG_QUANT_GROUP]: element k of row r is
 * scales[r, k / OG_QUANT_GROUP] * ints[r, k], as og_dequantize_row. Needs
 * AVX-512 (og_cpu_isa_active). */
void og_quant_ints_rows_cpu(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n0, int64_t rows,
                            og_bf16 *ints, float *scales);
void og_quant_ints_avx512(const uint8_t *q, og_dtype dt, int64_t K, int64_t rows, og_bf16 *dst /* [rows, K] */);
/* dequantize: dst = the rows as f32, bit for bit og_dequantize_row (each
 * element f32(scale) * q, exact). */
void og_dequantize_rows_avx512(const uint8_t *q, const og_f16 *s, og_dtype dt, int64_t K,
                               int64_t rows, float *dst /* [rows, K] */);
void og_dequantize_rows_avx2(const uint8_t *q, const og_f16 *s, og_dtype dt, int64_t K,
                             int64_t rows, float *dst /* [rows, K] */);

void og_bf16_to_f32_avx512(const og_bf16 *src /* [n] */, float *dst /* [n] */, size_t n);
void og_bf16_to_f32_avx2(const og_bf16 *src /* [n] */, float *dst /* [n] */, size_t n);
void og_f32_to_bf16_avx512(const float *src /* [n] */, og_bf16 *dst /* [n] */, size_t n);
void og_f32_to_bf16_avx2(const float *src /* [n] */, og_bf16 *dst /* [n] */, size_t n);

/* Index of the first maximum of x (the first NaN if there is one). */
int64_t og_argmax_avx512(const float *x /* [V] */, int64_t V);
int64_t og_argmax_avx2(const float *x /* [V] */, int64_t V);

/* Sum of x[i]^2 accumulated in f32 lanes. */
float og_sum_squares_avx512(const float *x /* [N] */, int64_t N);
float og_sum_squares_avx2(const float *x /* [N] */, int64_t N);

#endif /* OG_KERNELS_OPS_INTERNAL_H */
