/* Quantizing weights to q8 / q4 and reading them back (the layout is at
 * OG_QUANT_GROUP in offgraph.h). This is the reference every quantized
 * kernel is tested against, and what offgraph export writes. The k-quants
 * have their own file (kquant.c); these entry points hand them over. */
#include "core.h"

#include <math.h>

og_status og_quantize_rows(og_dtype dt, const float *src, int64_t N, int64_t K, void *dst) {
    return og_quantize_row_range(dt, src, N, K, 0, N, dst);
}

og_status og_quantize_row_range(og_dtype dt, const float *src, int64_t N, int64_t K, int64_t r0, int64_t r1,
                                void *dst) {
    if (og_dtype_is_kquant(dt)) return og_kquant_quantize_row_range(dt, src, N, K, r0, r1, dst);
    if (!og_dtype_is_quantized(dt) || !src || !dst || N <= 0 || K <= 0 || K % OG_QUANT_GROUP || r0 < 0 ||
        r1 > N || r0 > r1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "quantize: bad arguments (dtype %s, [%lld, %lld], rows %lld..%lld)",
                            og_dtype_name(dt), (long long)N, (long long)K, (long long)r0, (long long)r1);
    const int64_t groups = K / OG_QUANT_GROUP;
    og_f16 *scales = (og_f16 *)((char *)dst + (size_t)N * og_quant_row_bytes(dt, K));
    for (int64_t n = r0; n < r1; n++) {
        uint8_t *q = (uint8_t *)dst + (size_t)n * og_quant_row_bytes(dt, K);
        for (int64_t g = 0; g < groups; g++) {
            const float *x = src + n * K + g * OG_QUANT_GROUP;
            float m = 0.0f; /* the element of largest magnitude, with its sign */
            for (int j = 0; j < OG_QUANT_GROUP; j++) {
                if (!isfinite(x[j]))
                    return og_set_error(OG_ERR_INVALID_ARGUMENT, "quantize: row %lld element %lld is not finite",
                                        (long long)n, (long long)(g * OG_QUANT_GROUP + j));
                if (fabsf(x[j]) > fabsf(m)) m = x[j];
            }
            /* an all-zero group gets +0, not the -0 that 0 / -8 would give */
            const og_f16 s16 = m == 0.0f ? og_f16_from_f32(0.0f)
                                         : og_f16_from_f32(dt == OG_DTYPE_Q8 ? fabsf(m) / 127.0f : m / -8.0f);
            const float s = og_f32_from_f16(s16);
            if (!isfinite(s))
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "quantize: row %lld group %lld: scale overflows f16",
                                    (long long)n, (long long)g);
            scales[n * groups + g] = s16;
            const float lo = dt == OG_DTYPE_Q8 ? -127.0f : -8.0f, hi = dt == OG_DTYPE_Q8 ? 127.0f : 7.0f;
            int v[OG_QUANT_GROUP];
            for (int j = 0; j < OG_QUANT_GROUP; j++) /* x / s as the format states (one f32 division) */
                v[j] = s != 0.0f ? (int)fminf(fmaxf(nearbyintf(x[j] / s), lo), hi) : 0;
            if (dt == OG_DTYPE_Q8) {
                for (int j = 0; j < OG_QUANT_GROUP; j++) q[g * OG_QUANT_GROUP + j] = (uint8_t)(int8_t)v[j];
            } else {
                for (int j = 0; j < OG_QUANT_GROUP / 2; j++)
                    q[g * (OG_QUANT_GROUP / 2) + j] =
                        (uint8_t)((v[j] + 8) | ((v[j + OG_QUANT_GROUP / 2] + 8) << 4));
            }
        }
    }
    return OG_OK;
}

void og_dequantize_row(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n, float *out) {
    if (og_dtype_is_kquant(dt)) {
        og_kquant_dequantize_row(dt, w, K, n, out);
        return;
    }
    const int64_t groups = K / OG_QUANT_GROUP;
    const og_f16 *scales = og_quant_scales(dt, w, N, K) + n * groups;
    const uint8_t *q = (const uint8_t *)w + (size_t)n * og_quant_row_bytes(dt, K);
    for (int64_t g = 0; g < groups; g++) {
        const float s = og_f32_from_f16(scales[g]);
        float *o = out + g * OG_QUANT_GROUP;
        if (dt == OG_DTYPE_Q8) {
            for (int j = 0; j < OG_QUANT_GROUP; j++) o[j] = s * (float)(int8_t)q[g * OG_QUANT_GROUP + j];
        } else {
            const uint8_t *b = q + g * (OG_QUANT_GROUP / 2);
            for (int j = 0; j < OG_QUANT_GROUP / 2; j++) {
                o[j] = s * (float)((int)(b[j] & 15) - 8);
                o[j + OG_QUANT_GROUP / 2] = s * (float)((int)(b[j] >> 4) - 8);
            }
        }
    }
}
