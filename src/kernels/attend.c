/* Argument validation shared by every update_and_attend back end.
 *
 * Letters: T tokens, Hq query heads, Hkv kv heads, D head dim, L committed
 * length, R allocated rows, W ring window (see attend.h). Storage rows are
 * og_kv_layer_view_row_stride(kv) elements apart: the R rows span
 * R * stride elements from kv.k (and kv.v), of which each row's first
 * Hkv * D are the layer's (int8 and fp8: its first round_up(Hkv * (D + 4),
 * 16) bytes, quants, scales, padding; see core/kv_quant.h).
 */
#include "kernels/attend.h"
#include "core/kv_quant.h"

#include <math.h>

og_status og_attend_check(const og_attend_args *a) {
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "update_and_attend: args is NULL");
    const og_kv_layer_view *kv = &a->kv;
    const int32_t layer = kv->layer_id;
    if (!kv->k || !kv->v)
        return og_set_error(OG_ERR_UNBOUND,
                            "update_and_attend: layer %d: KV storage is unbound (k %s, v %s)",
                            layer, kv->k ? "bound" : "NULL", kv->v ? "bound" : "NULL");
    if (!a->q || !a->k || !a->v || !a->out)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: NULL %s buffer", layer,
                            !a->q ? "q" : !a->k ? "k" : !a->v ? "v" : "out");
    if (a->T < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: T = %d, need at least 1 token",
                            layer, a->T);
    if (a->n_heads < 1 || kv->n_kv_heads < 1 || kv->head_dim < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: Hq = %d, Hkv = %d, D = %d must all "
                            "be positive",
                            layer, a->n_heads, kv->n_kv_heads, kv->head_dim);
    if (a->n_heads % kv->n_kv_heads != 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: Hq = %d is not a multiple of Hkv = %d",
                            layer, a->n_heads, kv->n_kv_heads);
    if ((unsigned)kv->dtype >= OG_DTYPE_COUNT)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: unknown storage dtype %d", layer,
                            (int)kv->dtype);
    if (kv->dtype != OG_DTYPE_BF16 && kv->dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(kv->dtype))
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "update_and_attend: layer %d: storage dtype %s, need bf16, f32, int8 or fp8",
                            layer, og_dtype_name(kv->dtype));
    if (!isfinite(a->scale))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: scale %g is not finite", layer,
                            (double)a->scale);
    if (kv->length < 0 || kv->rows < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: length %lld, rows %lld (need L >= 0, "
                            "R >= 1)",
                            layer, (long long)kv->length, (long long)kv->rows);
    const og_kv_row_part part = a->kv_part;
    if (part.heads != 0 || part.head0 != 0) {
        if (!og_kv_dtype_quantized(kv->dtype) || part.head0 < 0 || part.heads < part.head0 + kv->n_kv_heads ||
            kv->row_stride == 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "update_and_attend: layer %d: heads %lld..%lld of rows of %lld heads (a part needs "
                                "int8 / fp8 storage, whole heads and the storage's row stride)",
                                layer, (long long)part.head0, (long long)(part.head0 + kv->n_kv_heads),
                                (long long)part.heads);
    }
    /* a row's own elements from the view's start: Hkv * D, or its bytes
     * quantized (core/kv_quant.h; for a part, up to the storage row's end) */
    const int64_t row_elems =
        !og_kv_dtype_quantized(kv->dtype) ? (int64_t)kv->n_kv_heads * kv->head_dim
        : part.heads ? og_kv_dtype_row_bytes(kv->dtype, part.heads, kv->head_dim) - part.head0 * kv->head_dim
                     : og_kv_dtype_row_bytes(kv->dtype, kv->n_kv_heads, kv->head_dim);
    if (kv->row_stride != 0 && kv->row_stride < row_elems)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: row stride %lld elements is below a row's "
                            "%lld (0 means dense)",
                            layer, (long long)kv->row_stride, (long long)row_elems);
    int64_t bytes; /* og_mul_overflow_i64 returns false on overflow */
    if (!og_mul_overflow_i64(kv->rows, og_kv_layer_view_row_stride(kv), &bytes) ||
        !og_mul_overflow_i64(bytes, 4, &bytes) ||
        !og_mul_overflow_i64((int64_t)a->T * a->n_heads, (int64_t)kv->head_dim * 4, &bytes))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: buffer sizes overflow", layer);

    const int64_t L = kv->length;
    if (a->positions) {
        for (int32_t t = 0; t < a->T; t++) {
            if ((int64_t)a->positions[t] != L + t)
                return og_set_error(OG_ERR_POSITION,
                                    "update_and_attend: layer %d: positions[%d] = %d, but the "
                                    "committed length %lld makes it %lld",
                                    layer, t, a->positions[t], (long long)L, (long long)(L + t));
        }
    }
    switch (kv->policy) {
    case OG_KV_FLAT:
        if (kv->window != 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "update_and_attend: layer %d: flat layer with window %d (must "
                                "be 0)",
                                layer, kv->window);
        if (L > kv->rows - a->T)
            return og_set_error(OG_ERR_CAPACITY,
                                "update_and_attend: layer %d: flat write of positions "
                                "%lld..%lld past the %lld allocated rows",
                                layer, (long long)L, (long long)(L + a->T - 1),
                                (long long)kv->rows);
        break;
    case OG_KV_RING:
        if (kv->window < 1 || kv->rows < kv->window)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "update_and_attend: layer %d: ring with window %d over %lld "
                                "rows (need 1 <= W <= R)",
                                layer, kv->window, (long long)kv->rows);
        if (a->T > kv->rows - kv->window + 1)
            return og_set_error(OG_ERR_WRITE_TOO_WIDE,
                                "update_and_attend: layer %d: ring step of %d tokens, but R = "
                                "%lld slots and W = %d allow at most %lld (max_write)",
                                layer, a->T, (long long)kv->rows, kv->window,
                                (long long)(kv->rows - kv->window + 1));
        break;
    default:
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "update_and_attend: layer %d: unknown policy %d", layer,
                            (int)kv->policy);
    }
    return OG_OK;
}
