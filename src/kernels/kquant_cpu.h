/* CPU products with k-quant weights (q2_k .. q6_k, the layouts of
 * docs/program-format.md): the decode GEMV and the dequantization the
 * prefill products multiply with. Not part of the public API; ops_cpu.c
 * calls these from og_embed_cpu, og_matmul_cpu and og_matmul_rows_cpu.
 *
 * The GEMV multiplies integers: each row of x is first written per
 * super-block of 256 as two int8 terms with one f32 scale (og_kq_x):
 *   x ~ u (254 hi + lo),  u = d / 254,  d = amax / 127,
 * hi the nearest integer to x / d and lo the nearest to the rest in 254ths
 * of d, so an element is off by at most d / 508 = amax / 64516 (with one
 * int8 term, as llama.cpp's q8_K, it is d / 2: 254 times more, which moved
 * the perplexity of the decode path by 0.14 % on the k-quant fixture).
 * Every weight row's integer levels then meet hi and lo in exact integer
 * sums per sub-block, scaled by the sub-block's integer scale, and a
 * block's total is multiplied by the f32 scales:
 *   block = (u d_w) A - (u dmin_w) B
 * with A = sum over sub-blocks of scale * sum(level * (254 hi + lo))
 * (levels less their offset: q6_k 32, q3_k 4) and B = sum of min *
 * sum(254 hi + lo) (q2_k, q4_k, q5_k). The only approximation against the
 * reference (the dequantized weights times f32 x) is x's rounding: a row's
 * error is at most sum over blocks of d / 508 * sum |w| plus f32 rounding
 * (tests/test_kquant_cpu.c checks that bound). The integer sums are exact
 * at every ISA, so the versions differ only in the f32 order in which the
 * blocks' totals are added.
 *
 * Letters: K in features (a multiple of 256), R rows of x, rows: weight
 * rows (output features) of a block of the weight. */
#ifndef OG_KERNELS_KQUANT_CPU_H
#define OG_KERNELS_KQUANT_CPU_H

#include "core/core.h"
#include "kernels/cpu_isa.h"

/* One super-block of x: u (254 hi[i] + lo[i]) ~ x[i] with u = d / 254;
 * sum16[j] = sum of 254 hi + lo over elements 16 j .. 16 j + 15 (the terms
 * the mins and level offsets take). */
typedef struct og_kq_x {
    float d;
    int32_t sum16[16];
    int8_t hi[OG_KQUANT_BLOCK];
    int8_t lo[OG_KQUANT_BLOCK];
} og_kq_x;

/* x [R, K] as R * K / 256 blocks, row by row. A block of zeros has d = 0;
 * one with a NaN or infinity has d = NaN (the products then give NaN, as
 * f32 arithmetic would). */
void og_kq_quantize_x(const float *x /* [R, K] */, int64_t R, int64_t K, og_kq_x *out /* [R * K / 256] */);

/* out[r * ldo + f] = dot(x row r, w row f) for f in [0, rows), r in
 * [0, R): w is `rows` rows of K (og_kquant_row_bytes each) from a row's
 * start, x the og_kq_quantize_x blocks of R rows. At isa (scalar, AVX2,
 * AVX-512); stream as og_gemv_q_rows_avx512's (prefetch the weights into
 * L2 only). Every (r, f) is computed alone in one order whatever R, rows
 * and the block's place: the bits do not depend on how N or R is split. */
void og_kq_gemv(og_cpu_isa isa, og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K,
                int64_t rows, bool stream, float *out, int64_t ldo);

/* dst = rows of w as f32, bit for bit og_kquant_dequantize_row. */
void og_kq_dequantize(og_cpu_isa isa, og_dtype dt, const uint8_t *w, int64_t K, int64_t rows,
                      float *dst /* [rows, K] */);

/* The ISA versions behind the two above (kquant_x86.c); false when that
 * dtype has no version at that ISA (the caller then takes the scalar one).
 * vnni: with vpdpbusd (only where og_cpu_has_avx512_vnni) or without; the
 * two give the same bits. */
bool og_kq_gemv_avx512(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                       bool stream, bool vnni, float *out, int64_t ldo);
bool og_kq_gemv_avx2(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                     bool stream, float *out, int64_t ldo);
bool og_kq_dequantize_avx512(og_dtype dt, const uint8_t *w, int64_t K, int64_t rows, float *dst);

/* The plain C GEMV (the oracle of the ISA versions: the same integer sums,
 * each row's block totals added in order). */
void og_kq_gemv_scalar(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                       float *out, int64_t ldo);

#endif
