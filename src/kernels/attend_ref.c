/* update_and_attend: the plain C reference. Written to be obviously correct,
 * not fast: every other back end is tested against it.
 *
 * Letters: T tokens, Hq query heads, Hkv kv heads, G = Hq / Hkv, D head dim,
 * L committed length, R allocated rows, W ring window, S storage row stride
 * in elements (see attend.h; int8 and fp8 rows: bytes, quants then scales,
 * see core/kv_quant.h).
 */
#include "kernels/attend.h"
#include "core/kv_quant.h"

#include <math.h>

/* Physical row of logical position p. */
static int64_t ref_slot(const og_kv_layer_view *kv, int64_t p) {
    return kv->policy == OG_KV_RING ? p % kv->rows : p;
}

/* Element d of kv head h of storage row `row` of base (k or v), in f32. */
static float ref_load(const og_attend_args *a, const void *base, int64_t row, int64_t h, int64_t d) {
    const og_kv_layer_view *kv = &a->kv;
    const int64_t S = og_kv_layer_view_row_stride(kv), D = kv->head_dim;
    if (og_kv_dtype_quantized(kv->dtype))
        return og_kv_row_load(kv->dtype, (const unsigned char *)base + row * S,
                              og_kv_scale_offset(a->kv_part, kv->n_kv_heads, D), D, h, d);
    return og_load_f32(base, kv->dtype, (size_t)(row * S + h * D + d));
}

og_status og_update_and_attend_ref(const og_attend_args *a) {
    og_status st = og_attend_check(a);
    if (st != OG_OK) return st;

    const og_kv_layer_view *kv = &a->kv;
    const int64_t T = a->T, Hq = a->n_heads, Hkv = kv->n_kv_heads, D = kv->head_dim;
    const int64_t G = Hq / Hkv, L = kv->length;
    const int64_t S = og_kv_layer_view_row_stride(kv); /* elements between storage rows */
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);

    /* 1. write every token's k and v: storage [R, Hkv, D], rows S apart */
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = ref_slot(kv, L + t);
        if (og_kv_dtype_quantized(kv->dtype)) { /* quants and scales, row * S bytes in */
            og_kv_quantize_heads(kv->dtype, a->k + t * Hkv * D, Hkv, D, a->kv_part, (unsigned char *)kv->k + row * S);
            og_kv_quantize_heads(kv->dtype, a->v + t * Hkv * D, Hkv, D, a->kv_part, (unsigned char *)kv->v + row * S);
            continue;
        }
        for (int64_t i = 0; i < Hkv * D; i++) {
            og_store_f32(kv->k, kv->dtype, (size_t)(row * S + i), a->k[t * Hkv * D + i]);
            og_store_f32(kv->v, kv->dtype, (size_t)(row * S + i), a->v[t * Hkv * D + i]);
        }
    }

    /* 2. attend: one online softmax per (token, query head) */
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = L + t;
        const int64_t first = kv->policy == OG_KV_RING && p - kv->window + 1 > 0
                                  ? p - kv->window + 1
                                  : 0;
        for (int64_t h = 0; h < Hq; h++) {
            const float *q = a->q + (t * Hq + h) * D; /* [D] */
            float *acc = a->out + (t * Hq + h) * D;   /* [D], the output row */
            const int64_t kvh = h / G;
            float m = -INFINITY, l = 0.0f;
            for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
            for (int64_t j = first; j <= p; j++) {
                const int64_t row = ref_slot(kv, j);
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += q[d] * ref_load(a, kv->k, row, kvh, d);
                s *= scale;
                const float m_new = s > m ? s : m;
                const float c = expf(m - m_new); /* rescales what came before */
                const float e = expf(s - m_new);
                l = l * c + e;
                for (int64_t d = 0; d < D; d++)
                    acc[d] = acc[d] * c + e * ref_load(a, kv->v, row, kvh, d);
                m = m_new;
            }
            for (int64_t d = 0; d < D; d++) acc[d] /= l;
        }
    }
    return OG_OK;
}
