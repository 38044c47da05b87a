/* q8 / q4 decode products on integers (CPU): x as two int8 terms per group
 * of 32, the quants meeting them in exact integer sums. Not part of the
 * public API; ops_cpu.c calls these from og_matmul_cpu and
 * og_matmul_rows_cpu (decode rows) where og_qi_active says so; otherwise
 * the decode products multiply f32 x (ops_simd.c).
 *
 * x is written per group of 32 exactly as the CUDA GEMV writes it
 * (src/kernels/cuda/gemv_q.cu, quantize_group4): with m the group's largest
 * |x|, u = m / (127 * 254), hi = rne(x * 127 / m), lo = rne((x * 127 / m -
 * hi) * 254), so x ~ u (254 hi + lo) within u / 2 = m / 64516; S = the
 * group's sum of 254 hi + lo. A group whose m is below 2^-120 is zeros; one
 * with a NaN or infinity has u = NaN (its products are NaN, as in f32).
 * A weight row's group g then gives the exact integer
 *   I = sum q (254 hi + lo) = sum n (254 hi + lo) - off S
 * (n the stored level: q4's nibble, off 8; q8's byte + 128, off 128, with
 * vpdpbusd; q8 as |q| times x's terms signed by q, off 0, without), and
 * the row's sum takes fma(dw * u, I, lane) into lane g % 16 of 16 f32
 * lanes, summed at the end. The per-group terms are the CUDA kernel's bit
 * for bit; only the order of the f32 sums differs.
 * Against the reference (f32 x times the dequantized weights) a row's error
 * is at most sum over groups of m / 64516 * sum |w| plus f32 rounding
 * (tests/test_quant_int_cpu.c checks that bound).
 *
 * Letters: K in features (a multiple of 32), R rows of x, rows weight rows. */
#ifndef OG_KERNELS_QUANT_INT_CPU_H
#define OG_KERNELS_QUANT_INT_CPU_H

#include "core/core.h"
#include "kernels/cpu_isa.h"

/* 16 groups (512 elements) of one row of x. Chunk c holds groups 4c ..
 * 4c + 3 in the order a q4 chunk's nibbles unpack: t[c][0] the hi terms of
 * elements 0 - 15 of each of its four groups (16 bytes a group), t[c][1]
 * those of elements 16 - 31, t[c][2] and t[c][3] the lo terms likewise.
 * Groups past K are zeros (u = 0, s = 0). */
typedef struct og_qi_x {
    int8_t t[4][4][64];
    float u[16];
    int32_t s[16];
} og_qi_x;

/* og_qi_x sets a row of K features takes. */
static inline int64_t og_qi_sets(int64_t K) { return (K / OG_QUANT_GROUP + 15) / 16; }

/* Whether the q8 / q4 decode products at isa multiply on integers: only
 * when switched on (og_qi_enable; OG_CPU_QUANT_INT=1 in the environment),
 * and then at every level but AVX2. Off by default: on a 2-core AVX-512
 * host (2026-12-07) one session's decode ran 2 - 16 % faster on integers
 * and eight sessions' 6 - 20 % slower (docs/decisions.md), and batched
 * rows must give the bits they get alone, so one choice holds for the
 * whole process. */
bool og_qi_active(og_cpu_isa isa);
/* Switches the integer products on (1) or off (0) for the whole process,
 * or back to the environment's choice (-1). For tests and benchmarks; not
 * while products run. */
void og_qi_enable(int on);

/* x [R, K] into R * og_qi_sets(K) sets, row by row, at isa (the versions
 * give the same bits). */
void og_qi_quantize(og_cpu_isa isa, const float *x, int64_t R, int64_t K, og_qi_x *out);

/* out[r * ldo + f] = dot(x row r, w row f) for f in [0, rows), r in [0, R):
 * q the rows' quants from a row's start (og_quant_row_bytes apart), s their
 * f16 scales (K / 32 a row). At isa (scalar or AVX-512); stream as
 * og_gemv_q_rows_avx512's. Each (r, f) is computed alone in one order
 * whatever R, rows and the block's place. */
void og_qi_gemv(og_cpu_isa isa, og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s,
                int64_t K, int64_t rows, bool stream, float *out, int64_t ldo);

/* The versions behind the two above. The AVX-512 GEMV with vpdpbusd (only
 * where og_cpu_has_avx512_vnni) or without gives the same bits. */
void og_qi_quantize_scalar(const float *x, int64_t R, int64_t K, og_qi_x *out);
void og_qi_quantize_avx512(const float *x, int64_t R, int64_t K, og_qi_x *out);
void og_qi_gemv_scalar(og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s, int64_t K,
                       int64_t rows, float *out, int64_t ldo);
void og_qi_gemv_avx512(og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s, int64_t K,
                       int64_t rows, bool stream, bool vnni, float *out, int64_t ldo);

#endif
