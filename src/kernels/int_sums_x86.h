/* Integer lane sums shared by the CPU's integer products (kquant_x86.c,
 * quant_int_x86.c). x86 with GCC or Clang only; include after
 * <immintrin.h>. Callers' targets must cover these functions'. */
#ifndef OG_KERNELS_INT_SUMS_X86_H
#define OG_KERNELS_INT_SUMS_X86_H

#define OG_INT_SUMS_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* The lanes of a and b laid end to end (32), added by twos: lane k is
 * lane 2k + lane 2k + 1 of the pair. */
OG_INT_SUMS_INLINE __m512i og_sum_pairs_512(__m512i a, __m512i b) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

/* Four vectors' lanes (v_i: 16 lanes, each a sum of four elements, in
 * element order 64 i ..) added by fours into 16 lanes of 16 elements, in
 * element order: lane k is the sum of lanes 4k .. 4k + 3 of v0 v1 v2 v3
 * laid end to end. */
OG_INT_SUMS_INLINE __m512i og_sum_by16_512(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    return og_sum_pairs_512(og_sum_pairs_512(v0, v1), og_sum_pairs_512(v2, v3));
}

#undef OG_INT_SUMS_INLINE
#endif
