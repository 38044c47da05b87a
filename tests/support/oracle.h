/* A naive attention oracle for the tests, in double precision, written from
 * the definition and sharing no code with src/kernels.
 *
 * Letters: T query tokens, Hq query heads, Hkv kv heads, D head dim,
 * N positions of history (keys 0 .. N-1), W window (0 = full causal).
 */
#ifndef OG_TEST_ORACLE_H
#define OG_TEST_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Softmax attention of T queries at positions pos0 .. pos0+T-1 over the
 * whole history, with explicit masks: the query at p sees key j when
 * j <= p and (W == 0 or j > p - W). Query head h reads kv head
 * h / (Hq / Hkv). scale 0 means 1/sqrt(D). Scores, the softmax (two passes:
 * max, then exp and sum) and the weighted sums are all in double.
 *   q      [T, Hq, D]
 *   k, v   [N, Hkv, D]   N >= pos0 + T; position j is row j
 *   out    [T, Hq, D]    written */
void og_oracle_attention(const float *q, const float *k, const float *v, int64_t N,
                         int64_t pos0, int32_t T, int32_t Hq, int32_t Hkv, int32_t D,
                         int32_t W, double scale, double *out);

/* Rounds x[0..n) in place to the nearest bf16 value (ties to even), as bf16
 * storage keeps it, so that tests can feed the oracle what storage holds. */
void og_oracle_round_bf16(float *x, size_t n);

/* Rounds x [rows, Hkv, D] in place to what int8 (fp8 false) or fp8 e4m3
 * (fp8 true) KV storage gives back, from the definition: per row and head,
 * scale = amax / 127 (int8) or amax / 448 (e4m3) in f32, y = x / scale in
 * f32, q the integer in [-127, 127] (int8) or the finite e4m3 value (found
 * by searching all of them; +-448 beyond) nearest y, ties to even, and x
 * becomes f32(q) * scale. */
void og_oracle_round_kv(bool fp8, float *x, size_t rows, int32_t Hkv, int32_t D);

#endif
