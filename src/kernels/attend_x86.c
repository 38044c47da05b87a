/* The inner loops of the fast CPU attention kernel for x86-64: AVX2 + FMA
 * and AVX-512F. Each function carries its own target attribute, so the build
 * needs no -march flag; og_attend_ops_* hand a table out only when the
 * running CPU has the instructions.
 *
 * Letters: D head dim, n keys in a chunk. K and V rows are kv_stride floats
 * apart; q and acc are one head's [D] row.
 */
#include "kernels/attend_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

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

static const og_attend_ops g_ops_avx512 = {
    scores_avx512, accumulate_avx512, rescale_avx512, widen_avx512,
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

static const og_attend_ops g_ops_avx2 = {
    scores_avx2, accumulate_avx2, rescale_avx2, widen_avx2,
};

const og_attend_ops *og_attend_ops_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &g_ops_avx2 : NULL;
}

#else /* not x86-64 with GCC-style intrinsics: the scalar loops serve */

const og_attend_ops *og_attend_ops_avx2(void) { return NULL; }
const og_attend_ops *og_attend_ops_avx512(void) { return NULL; }

#endif
