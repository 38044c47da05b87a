/* AVX-512 versions of the q8 / q4 integer products (quant_int_cpu.h): x's
 * terms and the GEMV.
 *
 * A chunk of four groups of a weight row unpacks into 64 unsigned levels in
 * the order of x's terms (og_qi_x): A elements 0 - 15 of each group, B
 * elements 16 - 31 (q4: the low and high nibbles of its 64 bytes; q8: the
 * 16-byte halves of its 128, shuffled). vpdpbusd (vpmaddubsw + vpmaddwd by
 * ones without AVX512_VNNI, the same sums) multiplies four levels by four
 * terms into an int32 lane: the hi sums, times 254, are the lo sums'
 * starting value, so each lane holds four elements' n (254 hi + lo). Four
 * chunks' lanes are added by fours into 16 lanes, one a group, less off S:
 * the groups' exact integers I, which go to f32 once, times dw * u into the
 * row's 16 f32 lanes. q8's signed bytes become unsigned levels as q + 128
 * (off 128) with vpdpbusd; without it as |q| with x's terms negated where
 * q < 0 (off 0): vpmaddubsw's pairs of (q + 128) times a term could pass
 * int16, those of |q| cannot (2 * 128 * 127).
 *
 * A row's four chunk sums are added across by fours (og_sum_by16_512) into
 * one lane a group; with several rows of x the same sums are folded two by
 * two as the chunks come, to keep few registers live.
 *
 * Each function carries its own target attribute; quant_int_cpu.c calls
 * them only at the ISA level og_cpu_isa_active allows. */
#include "kernels/quant_int_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/int_sums_x86.h"

#define OG_QI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define OG_QI512V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))
#define OG_INLINE inline __attribute__((always_inline))

enum { QG = OG_QUANT_GROUP };

/* ---- x's terms: the operations of og_qi_quantize_scalar, sixteen lanes at
 * a time (each IEEE operation rounds the same way, so the bits match) ---- */

/* 16 integral floats' int8 values into 16 bytes at p. */
static OG_INLINE OG_QI512 void store_terms(int8_t *p, __m512 v) {
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
}

OG_QI512 void og_qi_quantize_avx512(const float *x, int64_t R, int64_t K, og_qi_x *out) {
    const int64_t G = K / QG, n = og_qi_sets(K);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 big = _mm512_set1_ps(3.4028235e38f), k254 = _mm512_set1_ps(254.0f);
    const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < n; b++) {
            og_qi_x *o = &out[r * n + b];
            memset(o, 0, sizeof *o);
            for (int j = 0; j < 16 && b * 16 + j < G; j++) {
                const float *v = x + r * K + (b * 16 + j) * QG;
                const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
                const __m512 a0 = _mm512_and_ps(v0, absmask), a1 = _mm512_and_ps(v1, absmask);
                if (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) {
                    o->u[j] = NAN; /* a NaN or infinity */
                    continue;
                }
                const float m = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
                if (!(m >= 0x1p-120f)) continue; /* zeros */
                const __m512 id = _mm512_set1_ps(127.0f / m);
                o->u[j] = m / 32258.0f;
                const __m512 t0 = _mm512_mul_ps(v0, id), t1 = _mm512_mul_ps(v1, id);
                const __m512 h0 = _mm512_roundscale_ps(t0, rne), h1 = _mm512_roundscale_ps(t1, rne);
                const __m512 l0 = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t0, h0), k254), rne);
                const __m512 l1 = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t1, h1), k254), rne);
                int8_t *tc = o->t[j / 4][0] + 16 * (j % 4);
                store_terms(tc, h0);
                store_terms(tc + 64, h1);
                store_terms(tc + 128, l0);
                store_terms(tc + 192, l1);
                const __m512i hs = _mm512_add_epi32(_mm512_cvtps_epi32(h0), _mm512_cvtps_epi32(h1));
                const __m512i ls = _mm512_add_epi32(_mm512_cvtps_epi32(l0), _mm512_cvtps_epi32(l1));
                o->s[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(hs, _mm512_set1_epi32(254)), ls));
            }
        }
}

/* ---- the GEMV ---- */

#define OG_QI_NAME(x) x##_512
#define OG_QI_TARGET OG_QI512
#define OG_QI_VNNI 0
#include "kernels/quant_int_x86_row.h"

#define OG_QI_NAME(x) x##_512v
#define OG_QI_TARGET OG_QI512V
#define OG_QI_VNNI 1
#include "kernels/quant_int_x86_row.h"

void og_qi_gemv_avx512(og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s, int64_t K,
                       int64_t rows, bool stream, bool vnni, float *out, int64_t ldo) {
    if (vnni)
        run_512v(dt, x, R, q, s, K, rows, stream, out, ldo);
    else
        run_512(dt, x, R, q, s, K, rows, stream, out, ldo);
}
