/* bf16 rounding of f32 vectors for the CPU's bf16 kernels (AVX-512).
 * x86 with GCC or Clang only; include after <immintrin.h>. Callers' targets
 * must cover these functions'. */
#ifndef OG_KERNELS_BF16_SPLIT_X86_H
#define OG_KERNELS_BF16_SPLIT_X86_H

/* Sixteen f32 values rounded to bf16 exactly as og_bf16_from_f32 does, each
 * in the low half of its 32-bit lane: round to nearest even by adding 0x7fff
 * plus the lowest kept bit and keeping the top half; a NaN keeps its top half
 * with the quiet bit. Unlike vcvtneps2bf16 it keeps subnormal inputs. */
static inline __attribute__((target("avx512f"))) __m512i og_bf16_lanes16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, quiet);
}

/* Sixteen f32 values as bf16 hi = bf16(v) and lo = bf16(v - hi), both
 * rounded to nearest: hi + lo is v within 2^-16 |v|. The CPU's bf16
 * products of quantized weights split each dequantized weight so
 * (matmul_bf16.c as interleaved pairs, matmul_amx.c as separate tiles). */
static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) __m256i og_split16_bf16(__m512 v,
                                                                                                       __m256i *lo) {
    const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
    return hi;
}

#endif
