/* q8 and q4 quants (core.h's layout) as exact bf16 pairs, for the
 * tensor-core kernels that multiply quantized weights: integers q with
 * |q| <= 128 are exact in bf16. Internal to src/kernels/cuda. */
#ifndef OG_KERNELS_CUDA_QUANT_PAIRS_CUH
#define OG_KERNELS_CUDA_QUANT_PAIRS_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace og_cuda {

__device__ inline uint32_t bf16_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

/* The bf16 pairs of the four q8 bytes of word v (two's complement): bytes
 * 0, 1 in p01 (byte 0 low), bytes 2, 3 in p23. Each byte q + 128 becomes
 * the low mantissa byte of the f32 2^23 + q + 128, less 2^23 + 128. */
__device__ inline void q8_pairs(uint32_t v, uint32_t &p01, uint32_t &p23) {
    const uint32_t f = v ^ 0x80808080u; /* q + 128 */
    const float m = 8388736.0f;         /* 2^23 + 128 */
    const float e0 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7540)) - m;
    const float e1 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7541)) - m;
    const float e2 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7542)) - m;
    const float e3 = __uint_as_float(__byte_perm(f, 0x4b000000u, 0x7543)) - m;
    p01 = bf16_bits(__floats2bfloat162_rn(e0, e1));
    p23 = bf16_bits(__floats2bfloat162_rn(e2, e3));
}

/* The bf16 pair of the nibbles (stored q + 8) in bits 0..3 and 16..19 of v:
 * the bf16 128 + n (n in its low mantissa bits, exactly) less 136. */
__device__ inline uint32_t q4_pair(uint32_t v) {
    const uint32_t b = (v & 0x000f000fu) | 0x43004300u;
    __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162 *>(&b);
    r = __hsub2(r, __floats2bfloat162_rn(136.0f, 136.0f));
    return bf16_bits(r);
}

} /* namespace og_cuda */

#endif /* OG_KERNELS_CUDA_QUANT_PAIRS_CUH */
