/* The inner loops of the fast CPU attention kernel, one table per
 * instruction set. Internal to src/kernels.
 *
 * Letters: D head dim, n keys in a chunk (rows of K and V).
 * K and V rows are f32, kv_stride floats apart (the storage row stride for f32
 * storage, D for rows widened from bf16 into scratch).
 */
#ifndef OG_KERNELS_ATTEND_ISA_H
#define OG_KERNELS_ATTEND_ISA_H

#include "kernels/attend.h"

typedef struct og_attend_ops {
    /* s[j] = scale * (q . K[j]) for j < n.  q [D], K [n, D] at kv_stride, s [n] */
    void (*scores)(const float *q, const float *K, int64_t kv_stride, int32_t D, int32_t n,
                   float scale, float *s);
    /* acc += sum_j p[j] * V[j].  acc [D], V [n, D] at kv_stride, p [n] */
    void (*accumulate)(float *acc, const float *V, int64_t kv_stride, int32_t D, int32_t n,
                       const float *p);
    /* acc *= c.  acc [D] */
    void (*rescale)(float *acc, float c, int32_t D);
    /* dst[j] = f32(src[j]) for j < n rows.  src [n, D] bf16 at src_stride,
     * dst [n, D] f32 contiguous */
    void (*widen)(float *dst, const og_bf16 *src, int64_t src_stride, int32_t D, int32_t n);
} og_attend_ops;

/* NULL when this build has no code for the instruction set or the running
 * CPU lacks it. */
const og_attend_ops *og_attend_ops_avx2(void);
const og_attend_ops *og_attend_ops_avx512(void);

#endif /* OG_KERNELS_ATTEND_ISA_H */
