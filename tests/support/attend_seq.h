/* A sequence for attention tests: the whole q/k/v history of one session's
 * tokens, so that every step can be checked against the double-precision
 * oracle over everything written so far.
 *
 * Letters: Hq query heads, Hkv kv heads, D head dim, N positions held.
 */
#ifndef OG_TEST_ATTEND_SEQ_H
#define OG_TEST_ATTEND_SEQ_H

#include "harness.h"

typedef struct og_test_seq {
    int32_t Hq, Hkv, D;
    og_dtype dtype;   /* storage dtype: bf16, int8 and fp8 history is kept rounded (the oracle's rounding) */
    int64_t cap;      /* positions the history can hold */
    int64_t n;        /* positions appended so far */
    float *q;         /* [cap, Hq, D]  queries as given */
    float *k, *v;     /* [cap, Hkv, D] keys/values as given to the kernel */
    float *ks, *vs;   /* [cap, Hkv, D] the same as storage keeps them */
} og_test_seq;

/* Returns false when memory runs out. Free with og_test_seq_free. */
bool og_test_seq_init(og_test_seq *s, int32_t Hq, int32_t Hkv, int32_t D, og_dtype dtype,
                      int64_t cap);
void og_test_seq_free(og_test_seq *s);

/* Appends T tokens of uniform values in [-1, 1); the step's inputs are then
 * s->q + pos * Hq * D etc. with pos = s->n - T. Returns pos. */
int64_t og_test_seq_append(og_test_seq *s, og_rng *r, int32_t T);

/* Largest tolerance ratio (og_tol_ratio_d) of out [T, Hq, D], the outputs of
 * the tokens at positions pos .. pos+T-1 (all appended), against the oracle
 * over history 0 .. pos+T-1 with window W (0 = flat). */
double og_test_seq_check(const og_test_seq *s, int64_t pos, int32_t T, int32_t W, float scale,
                         const float *out, double atol, double rtol);

/* Fills rows 0 .. L-1 of int8 / fp8 k and v storage (rows of RB bytes, Hkv
 * heads of D quants, then Hkv f32 scales) so that together they hold every
 * byte value (fp8's NaN codes replaced by zeros), with scales that make |k|
 * up to about 1 and |v| up to about 2: the kernels' decoding of every stored
 * quant is then checked against the reference's. */
void og_test_fill_every_quant(og_dtype dt, unsigned char *k, unsigned char *v, int64_t L, int32_t Hkv,
                              int32_t D, int64_t RB);

/* Bytes of one of a layer view's k or v storage (rows x row stride: padded
 * and quantized rows included). */
size_t og_test_kv_bytes(const og_kv_layer_view *kv);
/* A copy of the view with storage of its own (the same bytes); free with
 * og_test_kv_free. */
og_kv_layer_view og_test_kv_clone(const og_kv_layer_view *src);
void og_test_kv_free(og_kv_layer_view *kv);

#endif
