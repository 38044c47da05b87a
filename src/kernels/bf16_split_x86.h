/* Sixteen f32 values as bf16 hi = bf16(v) and lo = bf16(v - hi), both
 * rounded to nearest: hi + lo is v within 2^-16 |v|. The CPU's bf16
 * products of quantized weights split each dequantized weight so
 * (matmul_bf16.c as interleaved pairs, matmul_amx.c as separate tiles).
 * x86 with GCC or Clang only; include after <immintrin.h>. Callers' targets
 * must cover this function's. */
#ifndef OG_KERNELS_BF16_SPLIT_X86_H
#define OG_KERNELS_BF16_SPLIT_X86_H

static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) __m256i og_split16_bf16(__m512 v,
                                                                                                       __m256i *lo) {
    const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
    return hi;
}

#endif
