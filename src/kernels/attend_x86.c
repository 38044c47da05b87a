/* The inner loops of the fast CPU attention kernel for x86-64: AVX2 + FMA
 * and AVX-512F. Each function carries its own target attribute, so the build
 * needs no -march flag; og_attend_ops_* hand a table out only when the
 * running CPU has the instructions.
 *
 * Letters: D head dim, n keys in a chunk. K and V rows are kv_stride floats
 * apart; q and acc are one head's [D] row.
 */
#include "kernels/attend_isa.h"
#include "core/kv_quant.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ AVX-512F */

#define OG_AVX512 __attribute__((target("avx512f")))

/* Lanes [0, r) of a 16-lane vector, r in [0, 16). */
OG_AVX512 static inline __mmask16 tail16(int32_t r) { return (__mmask16)((1u << r) - 1u); }

OG_AVX512 static void scores_avx512(const float *q, const float *K, int64_t ks, int32_t D,
                                    int32_t n, float scale, float *s) {
    const int32_t Dv = D & ~15;
    const __mmask16 tm = tail16(D & 15);
    int32_t j = 0;
    /* four keys at a time: four independent FMA chains share each q load */
    for (; j + 4 <= n; j += 4) {
        const float *k0 = K + j * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int32_t d = 0; d < Dv; d += 16) {
            const __m512 qv = _mm512_loadu_ps(q + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k2 + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k3 + d), a3);
        }
        if (tm) {
            const __m512 qv = _mm512_maskz_loadu_ps(tm, q + Dv);
            a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, k0 + Dv), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, k1 + Dv), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, k2 + Dv), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, k3 + Dv), a3);
        }
        s[j] = scale * _mm512_reduce_add_ps(a0);
        s[j + 1] = scale * _mm512_reduce_add_ps(a1);
        s[j + 2] = scale * _mm512_reduce_add_ps(a2);
        s[j + 3] = scale * _mm512_reduce_add_ps(a3);
    }
    for (; j < n; j++) {
        const float *k0 = K + j * ks;
        __m512 a0 = _mm512_setzero_ps();
        for (int32_t d = 0; d < Dv; d += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k0 + d), a0);
        if (tm)
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, q + Dv),
                                 _mm512_maskz_loadu_ps(tm, k0 + Dv), a0);
        s[j] = scale * _mm512_reduce_add_ps(a0);
    }
}

OG_AVX512 static void accumulate_avx512(float *acc, const float *V, int64_t ks, int32_t D,
                                        int32_t n, const float *p) {
    const int32_t Dv = D & ~15;
    int32_t d = 0;
    /* 64 columns at a time: four independent chains over the keys */
    for (; d + 64 <= Dv; d += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + d), a1 = _mm512_loadu_ps(acc + d + 16);
        __m512 a2 = _mm512_loadu_ps(acc + d + 32), a3 = _mm512_loadu_ps(acc + d + 48);
        for (int32_t j = 0; j < n; j++) {
            const float *vj = V + j * ks + d;
            const __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
            a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
            a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
            a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
        }
        _mm512_storeu_ps(acc + d, a0);
        _mm512_storeu_ps(acc + d + 16, a1);
        _mm512_storeu_ps(acc + d + 32, a2);
        _mm512_storeu_ps(acc + d + 48, a3);
    }
    for (; d < Dv; d += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + d);
        for (int32_t j = 0; j < n; j++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(V + j * ks + d), a0);
        _mm512_storeu_ps(acc + d, a0);
    }
    const __mmask16 tm = tail16(D & 15);
    if (tm) {
        __m512 a0 = _mm512_maskz_loadu_ps(tm, acc + Dv);
        for (int32_t j = 0; j < n; j++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),
                                 _mm512_maskz_loadu_ps(tm, V + j * ks + Dv), a0);
        _mm512_mask_storeu_ps(acc + Dv, tm, a0);
    }
}

OG_AVX512 static void rescale_avx512(float *acc, float c, int32_t D) {
    const int32_t Dv = D & ~15;
    const __m512 cv = _mm512_set1_ps(c);
    for (int32_t d = 0; d < Dv; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_mul_ps(cv, _mm512_loadu_ps(acc + d)));
    const __mmask16 tm = tail16(D & 15);
    if (tm)
        _mm512_mask_storeu_ps(acc + Dv, tm,
                              _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(tm, acc + Dv)));
}

OG_AVX512 static void widen_avx512(float *dst, const og_bf16 *src, int64_t ss, int32_t D,
                                   int32_t n) {
    const int32_t Dv = D & ~15;
    for (int32_t j = 0; j < n; j++) {
        const og_bf16 *sj = src + j * ss;
        float *dj = dst + (int64_t)j * D;
        for (int32_t d = 0; d < Dv; d += 16) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(sj + d));
            const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
            _mm512_storeu_ps(dj + d, _mm512_castsi512_ps(w));
        }
        for (int32_t d = Dv; d < D; d++) dj[d] = og_f32_from_bf16(sj[d]);
    }
}

/* e^x for x <= 0 (x = -inf or below -87 gives 0): x = n ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (truncation below
 * 0.35^7/7! = 1.3e-7 relative, about one f32 ulp), times 2^n by scalef. */
OG_AVX512 static inline __m512 exp_nonpos_avx512(__m512 x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x); /* ln2, high bits */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);     /* ln2, low bits  */
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
}

/* r[i] = sum of the lanes of v[i], for 16 vectors. Pairs are added within
 * 128-bit lanes, then the four 128-bit lanes of each group of four are
 * folded: 30 shuffles and 15 adds instead of 16 full reductions. */
OG_AVX512 static inline __m512 hsum16x16_avx512(const __m512 v[16]) {
    __m512 u[4];
    for (int g = 0; g < 4; g++) {
        const __m512 *w = v + 4 * g;
        const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]),
                                         _mm512_unpackhi_ps(w[0], w[1]));
        const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]),
                                         _mm512_unpackhi_ps(w[2], w[3]));
        /* per 128-bit lane: partial sums of w0, w1, w2, w3 */
        u[g] = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    /* fold 128-bit lanes: w01 = [u0 L0+L2, u0 L1+L3, u1 L0+L2, u1 L1+L3] */
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* bf16 pairs: a 64-byte load holds elements 2i (low half) and 2i+1 (high
 * half) of 32; each widens by a shift or a mask (bf16 is the top of an f32). */
OG_AVX512 static inline __m512 bf16_even(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
OG_AVX512 static inline __m512 bf16_odd(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u)));
}

/* The index vectors that split 32 floats (two vectors) into even and odd
 * elements, and merge them back. */
#define EVEN_IDX _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define ODD_IDX _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)
#define LO_IDX _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define HI_IDX _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)

/* Scores of up to two heads (nh = 1 or 2, a constant at each call) over
 * n keys, 16 keys per block: s_h[j] = scale * (q_h . K[j]). Each 64-byte
 * load of a key serves both heads; q_h is given split into its even and
 * odd elements, qs[h] = [qe (D/2) | qo (D/2)]. */
static inline __attribute__((always_inline)) OG_AVX512 void
scores_bf16_avx512(int nh, const float *const qs[2], const og_bf16 *K, int64_t ks, int32_t D,
                   int32_t n, int64_t pf, float scale, float *const sh[2]) {
    const int32_t half = D / 2;
    for (int32_t j0 = 0; j0 < n; j0 += 16) {
        const int32_t nk = n - j0 < 16 ? n - j0 : 16;
        __m512 a0[16], a1[16]; /* per key: lane partial sums of q_h . K[j0 + i] */
        for (int32_t i = 0; i < 16; i++) {
            __m512 e0 = _mm512_setzero_ps(), o0 = e0, e1 = e0, o1 = e0;
            if (i < nk) {
                const og_bf16 *k = K + (j0 + i) * ks; /* [D] */
                for (int32_t d = 0; d < D; d += 32) {
                    _mm_prefetch((const char *)(k + d + pf), _MM_HINT_T1);
                    const __m512i kp = _mm512_loadu_si512((const void *)(k + d));
                    const __m512 ke = bf16_even(kp), ko = bf16_odd(kp);
                    e0 = _mm512_fmadd_ps(ke, _mm512_loadu_ps(qs[0] + d / 2), e0);
                    o0 = _mm512_fmadd_ps(ko, _mm512_loadu_ps(qs[0] + half + d / 2), o0);
                    if (nh == 2) {
                        e1 = _mm512_fmadd_ps(ke, _mm512_loadu_ps(qs[1] + d / 2), e1);
                        o1 = _mm512_fmadd_ps(ko, _mm512_loadu_ps(qs[1] + half + d / 2), o1);
                    }
                }
            }
            a0[i] = _mm512_add_ps(e0, o0);
            a1[i] = _mm512_add_ps(e1, o1);
        }
        const __mmask16 tm = nk == 16 ? (__mmask16)0xffff : tail16(nk);
        const __m512 sc = _mm512_set1_ps(scale);
        _mm512_mask_storeu_ps(sh[0] + j0, tm, _mm512_mul_ps(sc, hsum16x16_avx512(a0)));
        if (nh == 2)
            _mm512_mask_storeu_ps(sh[1] + j0, tm, _mm512_mul_ps(sc, hsum16x16_avx512(a1)));
    }
}

/* acc_h += sum_j p_h[j] V[j] for up to two heads (nh as above), 32 columns
 * at a time kept split even/odd in registers; each load of V serves both. */
static inline __attribute__((always_inline)) OG_AVX512 void
accumulate_bf16_avx512(int nh, float *const acc[2], const og_bf16 *V, int64_t ks, int32_t D,
                       int32_t n, int64_t pf, const float *const p[2]) {
    for (int32_t d = 0; d < D; d += 32) {
        __m512 e0 = _mm512_permutex2var_ps(_mm512_loadu_ps(acc[0] + d), EVEN_IDX,
                                           _mm512_loadu_ps(acc[0] + d + 16));
        __m512 o0 = _mm512_permutex2var_ps(_mm512_loadu_ps(acc[0] + d), ODD_IDX,
                                           _mm512_loadu_ps(acc[0] + d + 16));
        __m512 e1 = _mm512_setzero_ps(), o1 = e1;
        if (nh == 2) {
            e1 = _mm512_permutex2var_ps(_mm512_loadu_ps(acc[1] + d), EVEN_IDX,
                                        _mm512_loadu_ps(acc[1] + d + 16));
            o1 = _mm512_permutex2var_ps(_mm512_loadu_ps(acc[1] + d), ODD_IDX,
                                        _mm512_loadu_ps(acc[1] + d + 16));
        }
        for (int32_t j = 0; j < n; j++) {
            _mm_prefetch((const char *)(V + j * ks + d + pf), _MM_HINT_T1);
            const __m512i vp = _mm512_loadu_si512((const void *)(V + j * ks + d));
            const __m512 ve = bf16_even(vp), vo = bf16_odd(vp);
            const __m512 p0 = _mm512_set1_ps(p[0][j]);
            e0 = _mm512_fmadd_ps(p0, ve, e0);
            o0 = _mm512_fmadd_ps(p0, vo, o0);
            if (nh == 2) {
                const __m512 p1 = _mm512_set1_ps(p[1][j]);
                e1 = _mm512_fmadd_ps(p1, ve, e1);
                o1 = _mm512_fmadd_ps(p1, vo, o1);
            }
        }
        _mm512_storeu_ps(acc[0] + d, _mm512_permutex2var_ps(e0, LO_IDX, o0));
        _mm512_storeu_ps(acc[0] + d + 16, _mm512_permutex2var_ps(e0, HI_IDX, o0));
        if (nh == 2) {
            _mm512_storeu_ps(acc[1] + d, _mm512_permutex2var_ps(e1, LO_IDX, o1));
            _mm512_storeu_ps(acc[1] + d + 16, _mm512_permutex2var_ps(e1, HI_IDX, o1));
        }
    }
}

/* The online-softmax step of one head over the scores s [n]: new running
 * max, l and acc [D] rescaled, s replaced by the probabilities. */
OG_AVX512 static void softmax_bf16_avx512(float *s, int32_t n, int32_t D, float *m, float *l,
                                          float *acc) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
    if (j < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tail16(n - j), s + j));
    const float cmax = _mm512_reduce_max_ps(mx);
    if (cmax > *m) {
        if (*m != -INFINITY) {
            const float r = expf(*m - cmax);
            *l *= r;
            rescale_avx512(acc, r, D);
        }
        *m = cmax;
    }
    const __m512 mv = _mm512_set1_ps(*m);
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < n; j += 16) {
        const __mmask16 tm = n - j >= 16 ? (__mmask16)0xffff : tail16(n - j);
        const __m512 p = _mm512_maskz_mov_ps(
            tm, exp_nonpos_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + j), mv)));
        sum = _mm512_add_ps(sum, p);
        _mm512_mask_storeu_ps(s + j, tm, p);
    }
    *l += _mm512_reduce_add_ps(sum);
}

/* Heads h0 and h0 + 1 (nh = 2) or h0 alone (nh = 1) of the fused update. */
static inline __attribute__((always_inline)) OG_AVX512 void
update_heads_avx512(int nh, int32_t h0, const float *q, const og_bf16 *K, const og_bf16 *V,
                    int64_t ks, int32_t D, int32_t n, int64_t pf, float scale, float *m,
                    float *l, float *acc, float *s, float *qs_mem) {
    float *qs[2], *sh[2], *ah[2];
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (int64_t)(h0 + h) * D; /* [D] */
        qs[h] = qs_mem + (int64_t)h * D;            /* [D/2 even | D/2 odd] */
        for (int32_t d = 0; d < D; d += 32) {
            const __m512 x0 = _mm512_loadu_ps(qh + d), x1 = _mm512_loadu_ps(qh + d + 16);
            _mm512_storeu_ps(qs[h] + d / 2, _mm512_permutex2var_ps(x0, EVEN_IDX, x1));
            _mm512_storeu_ps(qs[h] + D / 2 + d / 2, _mm512_permutex2var_ps(x0, ODD_IDX, x1));
        }
        sh[h] = s + (int64_t)h * n;
        ah[h] = acc + (int64_t)(h0 + h) * D;
    }
    if (nh == 1) qs[1] = qs[0], sh[1] = sh[0], ah[1] = ah[0]; /* never used */
    /* only the first pair of heads prefetches: the others find the lines */
    const int64_t pf_here = h0 == 0 ? pf : 0;
    scores_bf16_avx512(nh, (const float *const *)qs, K, ks, D, n, pf_here, scale, sh);
    for (int h = 0; h < nh; h++) softmax_bf16_avx512(sh[h], n, D, &m[h0 + h], &l[h0 + h], ah[h]);
    accumulate_bf16_avx512(nh, ah, V, ks, D, n, pf_here, (const float *const *)sh);
}

OG_AVX512 static void update_bf16_avx512(const float *q, int32_t G, const og_bf16 *K,
                                         const og_bf16 *V, int64_t ks, int32_t D, int32_t n,
                                         int64_t pf, float scale, float *m, float *l, float *acc,
                                         float *s) {
    float qs[OG_ATTEND_FUSED_MAX_D * 2]; /* [2, D]: two heads' q split even/odd */
    int32_t h = 0;
    for (; h + 2 <= G; h += 2) update_heads_avx512(2, h, q, K, V, ks, D, n, pf, scale, m, l, acc, s, qs);
    if (h < G) update_heads_avx512(1, h, q, K, V, ks, D, n, pf, scale, m, l, acc, s, qs);
}

/* ---- the fused update over int8 / fp8 rows (core/kv_quant.h) ---- */

/* 16 quants as f32, unscaled: int8 sign-extended; e4m3 from its bits (a
 * normal magnitude m (8..126) is the f32 of bits m << 20 times 2^120, a
 * subnormal one m (0..7) times 2^-9, 0x7f NaN as og_kv_fp8_values has it;
 * the normal path never sees a denormal operand). */
OG_AVX512 static inline __m512 quant16_avx512(const uint8_t *p, int fp8) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    if (!fp8) return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 24), 24));
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
    const __m512i mn = _mm512_max_epu32(mag, _mm512_set1_epi32(8));
    const __m512 normal = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mn, 20)), _mm512_set1_ps(0x1p120f));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
    __m512 v = _mm512_mask_blend_ps(_mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8)), normal, sub);
    v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), v, _mm512_set1_ps(NAN));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

/* Scale of key j of the head: soff bytes past its quants. */
static inline float quant_scale(const uint8_t *K, int64_t ks, int64_t soff, int32_t j) {
    float x;
    memcpy(&x, K + j * ks + soff, sizeof x);
    return x;
}

/* Scores of up to two heads (nh = 1 or 2) over n quantized keys, 16 keys a
 * block: s_h[j] = scale * kscale_j * (q_h . kq_j). Each conversion of a key
 * serves both heads. */
static inline __attribute__((always_inline)) OG_AVX512 void
scores_q_avx512(int nh, const float *const qh[2], const uint8_t *K, int64_t ks, int64_t soff, int fp8,
                int32_t D, int32_t n, int64_t pf, float scale, float *const sh[2]) {
    for (int32_t j0 = 0; j0 < n; j0 += 16) {
        const int32_t nk = n - j0 < 16 ? n - j0 : 16;
        __m512 a0[16], a1[16]; /* per key: lane partial sums of q_h . kq */
        float ksc[16];
        for (int32_t i = 0; i < 16; i++) {
            __m512 x0 = _mm512_setzero_ps(), x1 = x0;
            ksc[i] = 0.0f;
            if (i < nk) {
                const uint8_t *k = K + (j0 + i) * ks; /* [D] quants */
                _mm_prefetch((const char *)(k + soff + pf), _MM_HINT_T1);
                for (int32_t d = 0; d < D; d += 16) {
                    if ((d & 63) == 0) _mm_prefetch((const char *)(k + d + pf), _MM_HINT_T1);
                    const __m512 kf = quant16_avx512(k + d, fp8);
                    x0 = _mm512_fmadd_ps(kf, _mm512_loadu_ps(qh[0] + d), x0);
                    if (nh == 2) x1 = _mm512_fmadd_ps(kf, _mm512_loadu_ps(qh[1] + d), x1);
                }
                ksc[i] = scale * quant_scale(K, ks, soff, j0 + i);
            }
            a0[i] = x0;
            a1[i] = x1;
        }
        const __mmask16 tm = nk == 16 ? (__mmask16)0xffff : tail16(nk);
        const __m512 sc = _mm512_loadu_ps(ksc);
        _mm512_mask_storeu_ps(sh[0] + j0, tm, _mm512_mul_ps(sc, hsum16x16_avx512(a0)));
        if (nh == 2) _mm512_mask_storeu_ps(sh[1] + j0, tm, _mm512_mul_ps(sc, hsum16x16_avx512(a1)));
    }
}

/* acc_h += sum_j w_h[j] vq_j for up to two heads, w_h[j] the weight times
 * the key's v scale; 64 columns at a time in registers, the tail 16. */
static inline __attribute__((always_inline)) OG_AVX512 void
accumulate_q_avx512(int nh, float *const acc[2], const uint8_t *V, int64_t ks, int fp8, int32_t D, int32_t n,
                    int64_t pf, const float *const w[2]) {
    int32_t d = 0;
    for (; d + 64 <= D; d += 64) {
        __m512 a[2][4];
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < 4; c++) a[h][c] = _mm512_loadu_ps(acc[h] + d + 16 * c);
        for (int32_t j = 0; j < n; j++) {
            const uint8_t *v = V + j * ks + d;
            _mm_prefetch((const char *)(v + pf), _MM_HINT_T1);
            const __m512 w0 = _mm512_set1_ps(w[0][j]), w1 = _mm512_set1_ps(w[nh - 1][j]);
            for (int c = 0; c < 4; c++) {
                const __m512 vf = quant16_avx512(v + 16 * c, fp8);
                a[0][c] = _mm512_fmadd_ps(w0, vf, a[0][c]);
                if (nh == 2) a[1][c] = _mm512_fmadd_ps(w1, vf, a[1][c]);
            }
        }
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[h] + d + 16 * c, a[h][c]);
    }
    for (; d < D; d += 16) {
        __m512 a0 = _mm512_loadu_ps(acc[0] + d), a1 = _mm512_loadu_ps(acc[nh - 1] + d);
        for (int32_t j = 0; j < n; j++) {
            const __m512 vf = quant16_avx512(V + j * ks + d, fp8);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[0][j]), vf, a0);
            if (nh == 2) a1 = _mm512_fmadd_ps(_mm512_set1_ps(w[1][j]), vf, a1);
        }
        _mm512_storeu_ps(acc[0] + d, a0);
        if (nh == 2) _mm512_storeu_ps(acc[1] + d, a1);
    }
}

/* Heads h0 and h0 + 1 (nh = 2) or h0 alone (nh = 1) of the fused quantized
 * update. */
static inline __attribute__((always_inline)) OG_AVX512 void
update_q_heads_avx512(int nh, int32_t h0, const float *q, const uint8_t *K, const uint8_t *V, int64_t ks,
                      int64_t soff, int fp8, int32_t D, int32_t n, int64_t pf, float scale, float *m, float *l,
                      float *acc, float *s) {
    const float *qh[2];
    float *sh[2], *ah[2];
    for (int h = 0; h < 2; h++) {
        const int32_t x = h0 + (h < nh ? h : 0); /* nh == 1: the second is never used */
        qh[h] = q + (int64_t)x * D;
        sh[h] = s + (int64_t)(h < nh ? h : 0) * n;
        ah[h] = acc + (int64_t)x * D;
    }
    const int64_t pf_here = h0 == 0 ? pf : 0; /* the first pair of heads prefetches */
    scores_q_avx512(nh, qh, K, ks, soff, fp8, D, n, pf_here, scale, sh);
    for (int h = 0; h < nh; h++) {
        softmax_bf16_avx512(sh[h], n, D, &m[h0 + h], &l[h0 + h], ah[h]); /* dtype-blind: scores in, weights out */
        for (int32_t j = 0; j < n; j++) sh[h][j] *= quant_scale(V, ks, soff, j); /* l has the weights already */
    }
    accumulate_q_avx512(nh, ah, V, ks, fp8, D, n, pf_here, (const float *const *)sh);
}

OG_AVX512 static void update_q8_avx512(const float *q, int32_t G, const uint8_t *K, const uint8_t *V, int64_t ks,
                                       int64_t soff, int fp8, int32_t D, int32_t n, int64_t pf, float scale, float *m,
                                       float *l, float *acc, float *s) {
    int32_t h = 0;
    for (; h + 2 <= G; h += 2) update_q_heads_avx512(2, h, q, K, V, ks, soff, fp8, D, n, pf, scale, m, l, acc, s);
    if (h < G) update_q_heads_avx512(1, h, q, K, V, ks, soff, fp8, D, n, pf, scale, m, l, acc, s);
}

/* int8 / fp8 quants of one head times its scale: 16 at a time (fp8 through
 * a gather from the e4m3 table), the same f32 products as the reference. */
OG_AVX512 static void widen_i8_avx512(float *dst, const uint8_t *src, float scale, int32_t D) {
    const __m512 s = _mm512_set1_ps(scale);
    int32_t d = 0;
    for (; d + 16 <= D; d += 16) {
        const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + d)));
        _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_cvtepi32_ps(x), s));
    }
    for (; d < D; d++) dst[d] = (float)(int8_t)src[d] * scale;
}

OG_AVX512 static void widen_fp8_avx512(float *dst, const uint8_t *src, float scale, int32_t D) {
    const __m512 s = _mm512_set1_ps(scale);
    int32_t d = 0;
    for (; d + 16 <= D; d += 16) {
        const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + d)));
        _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_i32gather_ps(i, og_kv_fp8_values, 4), s));
    }
    for (; d < D; d++) dst[d] = og_kv_fp8_values[src[d]] * scale;
}

static const og_attend_ops g_ops_avx512 = {
    scores_avx512, accumulate_avx512, rescale_avx512, widen_avx512, update_bf16_avx512,
    widen_i8_avx512, widen_fp8_avx512, update_q8_avx512,
};

const og_attend_ops *og_attend_ops_avx512(void) {
    return __builtin_cpu_supports("avx512f") ? &g_ops_avx512 : NULL;
}

/* ------------------------------------------------------------ AVX2 + FMA */

#define OG_AVX2 __attribute__((target("avx2,fma")))

/* Lanes [0, r) of an 8-lane mask for maskload/maskstore, r in [0, 8). */
OG_AVX2 static inline __m256i tail8(int32_t r) {
    static const int32_t k_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(k_lanes + 8 - r));
}

OG_AVX2 static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

OG_AVX2 static void scores_avx2(const float *q, const float *K, int64_t ks, int32_t D,
                                int32_t n, float scale, float *s) {
    const int32_t Dv = D & ~7, rem = D & 7;
    const __m256i tm = tail8(rem);
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = K + j * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int32_t d = 0; d < Dv; d += 8) {
            const __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
        }
        if (rem) {
            const __m256 qv = _mm256_maskload_ps(q + Dv, tm);
            a0 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k0 + Dv, tm), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k1 + Dv, tm), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k2 + Dv, tm), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k3 + Dv, tm), a3);
        }
        s[j] = scale * hsum8(a0);
        s[j + 1] = scale * hsum8(a1);
        s[j + 2] = scale * hsum8(a2);
        s[j + 3] = scale * hsum8(a3);
    }
    for (; j < n; j++) {
        const float *k0 = K + j * ks;
        __m256 a0 = _mm256_setzero_ps();
        for (int32_t d = 0; d < Dv; d += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k0 + d), a0);
        if (rem)
            a0 = _mm256_fmadd_ps(_mm256_maskload_ps(q + Dv, tm), _mm256_maskload_ps(k0 + Dv, tm),
                                 a0);
        s[j] = scale * hsum8(a0);
    }
}

OG_AVX2 static void accumulate_avx2(float *acc, const float *V, int64_t ks, int32_t D,
                                    int32_t n, const float *p) {
    const int32_t Dv = D & ~7, rem = D & 7;
    int32_t d = 0;
    for (; d + 32 <= Dv; d += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
        __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
        for (int32_t j = 0; j < n; j++) {
            const float *vj = V + j * ks + d;
            const __m256 pj = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d < Dv; d += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        for (int32_t j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(V + j * ks + d), a0);
        _mm256_storeu_ps(acc + d, a0);
    }
    if (rem) {
        const __m256i tm = tail8(rem);
        __m256 a0 = _mm256_maskload_ps(acc + Dv, tm);
        for (int32_t j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_maskload_ps(V + j * ks + Dv, tm),
                                 a0);
        _mm256_maskstore_ps(acc + Dv, tm, a0);
    }
}

OG_AVX2 static void rescale_avx2(float *acc, float c, int32_t D) {
    const int32_t Dv = D & ~7;
    const __m256 cv = _mm256_set1_ps(c);
    for (int32_t d = 0; d < Dv; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d)));
    for (int32_t d = Dv; d < D; d++) acc[d] *= c;
}

OG_AVX2 static void widen_avx2(float *dst, const og_bf16 *src, int64_t ss, int32_t D,
                               int32_t n) {
    const int32_t Dv = D & ~7;
    for (int32_t j = 0; j < n; j++) {
        const og_bf16 *sj = src + j * ss;
        float *dj = dst + (int64_t)j * D;
        for (int32_t d = 0; d < Dv; d += 8) {
            const __m128i h = _mm_loadu_si128((const __m128i *)(sj + d));
            const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(dj + d, _mm256_castsi256_ps(w));
        }
        for (int32_t d = Dv; d < D; d++) dj[d] = og_f32_from_bf16(sj[d]);
    }
}

/* int8 / fp8 quants of one head times its scale, 8 at a time (as the
 * AVX-512 versions). */
OG_AVX2 static void widen_i8_avx2(float *dst, const uint8_t *src, float scale, int32_t D) {
    const __m256 s = _mm256_set1_ps(scale);
    int32_t d = 0;
    for (; d + 8 <= D; d += 8) {
        const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + d)));
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_cvtepi32_ps(x), s));
    }
    for (; d < D; d++) dst[d] = (float)(int8_t)src[d] * scale;
}

OG_AVX2 static void widen_fp8_avx2(float *dst, const uint8_t *src, float scale, int32_t D) {
    const __m256 s = _mm256_set1_ps(scale);
    int32_t d = 0;
    for (; d + 8 <= D; d += 8) {
        const __m256i i = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + d)));
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_i32gather_ps(og_kv_fp8_values, i, 4), s));
    }
    for (; d < D; d++) dst[d] = og_kv_fp8_values[src[d]] * scale;
}

static const og_attend_ops g_ops_avx2 = {
    scores_avx2, accumulate_avx2, rescale_avx2, widen_avx2, NULL, widen_i8_avx2, widen_fp8_avx2, NULL,
};

const og_attend_ops *og_attend_ops_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &g_ops_avx2 : NULL;
}

#else /* not x86-64 with GCC-style intrinsics: the scalar loops serve */

const og_attend_ops *og_attend_ops_avx2(void) { return NULL; }
const og_attend_ops *og_attend_ops_avx512(void) { return NULL; }

#endif
