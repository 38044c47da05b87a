/* The inner loops of the fast CPU attention kernel, one table per
 * instruction set. Internal to src/kernels.
 *
 * Letters: D head dim, n keys in a chunk (rows of K and V).
 * K and V rows are f32, kv_stride floats apart (the storage row stride,
 * og_kv_layer_view_row_stride, for f32 storage; D for rows widened from bf16
 * into scratch); bf16 rows read in place are kv_stride elements apart.
 */
#ifndef OG_KERNELS_ATTEND_ISA_H
#define OG_KERNELS_ATTEND_ISA_H

#include "kernels/attend.h"

/* Largest head dim of the fused bf16 update (its split copy of q is on the
 * stack). */
#define OG_ATTEND_FUSED_MAX_D 512

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
    /* The whole online-softmax update of the G query heads of one kv head
     * over n keys of bf16 storage, read in place (no widening scratch):
     * scores, running max m and sum l, acc rescaled and accumulated, as
     * softmax_update in attend_cpu.c does per head. NULL when the table has
     * none; only for D % 32 == 0 and D <= OG_ATTEND_FUSED_MAX_D.
     * Each line of K and V read is matched by a prefetch (into L2) of the line
     * pf elements further on (0: the same line, i.e. none), so that the next
     * chunk's rows arrive while this one is computed.
     * q [G, D], K/V [n, D] bf16 at kv_stride, m [G], l [G], acc [G, D],
     * s [2, n] scratch. */
    void (*update_bf16)(const float *q, int32_t G, const og_bf16 *K, const og_bf16 *V,
                        int64_t kv_stride, int32_t D, int32_t n, int64_t pf, float scale,
                        float *m, float *l, float *acc, float *s);
    /* dst[d] = decode(src[d]) * scale for d < D, one head of one int8 (two's
     * complement) or fp8 (e4m3, og_kv_fp8_values) row: the f32 product the
     * reference takes.  src [D] quants, dst [D] */
    void (*widen_i8)(float *dst, const uint8_t *src, float scale, int32_t D);
    void (*widen_fp8)(float *dst, const uint8_t *src, float scale, int32_t D);
    /* update_bf16 over int8 (fp8 0) or e4m3 (fp8 1) rows read in place: K
     * and V point at the head's D quants of the first key, rows kv_stride
     * bytes apart, each key's f32 scale soff bytes past its quants (read
     * with memcpy); scores are scale * kscale * (q . kq) and values enter as
     * (weight * vscale) * vq. NULL when the table has none; only for
     * D % 16 == 0 and D <= OG_ATTEND_FUSED_MAX_D. pf as update_bf16's, in
     * bytes. q [G, D], m [G], l [G], acc [G, D], s [2, n] scratch. */
    void (*update_q8)(const float *q, int32_t G, const uint8_t *K, const uint8_t *V, int64_t kv_stride,
                      int64_t soff, int fp8, int32_t D, int32_t n, int64_t pf, float scale, float *m, float *l,
                      float *acc, float *s);
} og_attend_ops;

/* NULL when this build has no code for the instruction set or the running
 * CPU lacks it. */
const og_attend_ops *og_attend_ops_avx2(void);
const og_attend_ops *og_attend_ops_avx512(void);

#endif /* OG_KERNELS_ATTEND_ISA_H */
