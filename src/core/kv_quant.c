/* Quantized KV rows: the e4m3 table, the e4m3 encoder and the reference row
 * quantizer (see kv_quant.h for the layout). */
#include "core/kv_quant.h"

#include <math.h>

/* e4m3 byte x: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0;
 * exponent 0 is subnormal (m * 2^-9), else (8 + m) * 2^(e - 10); 0x7f and
 * 0xff are NaN. Written as constant expressions so the table is built by
 * the compiler. */
#define FP8_E(x) (((x) >> 3) & 15)
#define FP8_M(x) ((x) & 7)
#define FP8_MAG(x) \
    (FP8_E(x) == 0 ? (float)FP8_M(x) * 0x1p-9f : (float)(8 + FP8_M(x)) * (float)(1u << FP8_E(x)) * 0x1p-10f)
#define FP8_VAL(x) (((x) & 0x7f) == 0x7f ? NAN : ((x) & 0x80) ? -FP8_MAG(x) : FP8_MAG(x))
#define FP8_4(b) FP8_VAL(b), FP8_VAL((b) + 1), FP8_VAL((b) + 2), FP8_VAL((b) + 3)
#define FP8_16(b) FP8_4(b), FP8_4((b) + 4), FP8_4((b) + 8), FP8_4((b) + 12)
#define FP8_64(b) FP8_16(b), FP8_16((b) + 16), FP8_16((b) + 32), FP8_16((b) + 48)

const float og_kv_fp8_values[256] = {FP8_64(0), FP8_64(64), FP8_64(128), FP8_64(192)};

uint8_t og_kv_fp8_from_f32(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    if (isnan(x)) return 0x7f;
    const float a = fabsf(x);
    if (a >= OG_KV_FP8_MAX) return sign | 0x7e; /* 448 and above: the largest finite value */
    if (a < 0x1p-6f) /* below the smallest normal: a multiple of 2^-9 (8 of them: the smallest normal) */
        return sign | (uint8_t)rintf(a * 0x1p9f);
    /* a normal f32 of exponent >= -6: keep 3 of its 23 mantissa bits, rounding
     * the 20 dropped ones to nearest even (a carry moves into the exponent) */
    const uint32_t abits = bits & 0x7fffffffu;
    const uint32_t r = (abits + 0x7ffffu + ((abits >> 20) & 1u)) >> 20; /* f32 exponent << 3 | mantissa */
    const uint32_t e = (r >> 3) - 127u + 7u;
    return sign | (uint8_t)((e << 3) | (r & 7u));
}

void og_kv_quantize_heads(og_dtype dt, const float *x, int64_t Hkv, int64_t D, og_kv_row_part part, void *row) {
    uint8_t *qrow = row;
    const int64_t soff = og_kv_scale_offset(part, Hkv, D);
    for (int64_t h = 0; h < Hkv; h++) {
        const float *xh = x + h * D; /* [D] */
        float amax = 0.0f;
        for (int64_t d = 0; d < D; d++) amax = fabsf(xh[d]) > amax ? fabsf(xh[d]) : amax;
        const float scale = amax / (dt == OG_DTYPE_INT8 ? OG_KV_INT8_MAX : OG_KV_FP8_MAX);
        for (int64_t d = 0; d < D; d++) {
            float y = scale > 0.0f ? xh[d] / scale : 0.0f;
            if (dt == OG_DTYPE_INT8) {
                /* |y| <= 127 but for a scale rounded below amax / 127 */
                y = y > OG_KV_INT8_MAX ? OG_KV_INT8_MAX : y < -OG_KV_INT8_MAX ? -OG_KV_INT8_MAX : y;
                qrow[h * D + d] = (uint8_t)(int8_t)(y == y ? rintf(y) : 0.0f);
            } else {
                qrow[h * D + d] = og_kv_fp8_from_f32(y);
            }
        }
        memcpy(qrow + soff + h * OG_KV_SCALE_BYTES, &scale, sizeof scale);
    }
    /* the padding, by the part that holds the row's last head: zeros, never
     * stale bytes */
    const int64_t heads = part.heads ? part.heads : Hkv;
    if (part.head0 + Hkv == heads) {
        const int64_t used = soff + Hkv * OG_KV_SCALE_BYTES, end = og_kv_dtype_row_bytes(dt, heads, D) - part.head0 * D;
        memset(qrow + used, 0, (size_t)(end - used));
    }
}

void og_kv_quantize_row(og_dtype dt, const float *x, int64_t Hkv, int64_t D, void *row) {
    og_kv_quantize_heads(dt, x, Hkv, D, (og_kv_row_part){0, 0}, row);
}
