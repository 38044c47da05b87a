/* Quantized KV rows (kv_dtype int8 and fp8): the layout, the reference
 * quantizer and the decoders every update_and_attend back end shares.
 *
 * Letters: Hkv kv heads, D head dim.
 *
 * One row (one position of one layer's k or v) of int8 or fp8 storage is
 * Hkv * D quant bytes, head-major like a bf16 row, then Hkv f32 scales (one
 * per head of this token; native byte order, at byte Hkv * D of the row,
 * read with memcpy: nothing aligns them to 4 when Hkv * D is odd), then
 * zeros up to a multiple of 16 bytes, so that dense rows start on 16-byte
 * boundaries as the GPU kernel's 16-byte copies need (none for Hkv % 4 == 0
 * and D % 4 == 0, e.g. 8 heads of 128):
 *     [Hkv, D] quants | [Hkv] f32 scales | 0..15 zero bytes
 *                                    round_up(Hkv * (D + 4), 16) bytes
 * element d of head h = decode(quant[h][d]) * scale[h], in f32.
 *   int8: quant = round_half_even(x / scale) in [-127, 127], scale = amax / 127
 *   fp8:  quant = e4m3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits;
 *         no infinities, 0x7f / 0xff NaN, largest finite 448) of x / scale,
 *         rounded to nearest even and saturated to +-448, scale = amax / 448
 * where amax is the largest |x| of the token's head and both divisions are
 * f32. A head of zeros has scale 0 and quants 0. Keeping the scales inside
 * the row lets every path that moves rows as bytes (growth, rings, fork,
 * save and restore, packed storage, the prefix cache) carry them unchanged.
 */
#ifndef OG_CORE_KV_QUANT_H
#define OG_CORE_KV_QUANT_H

#include "core/core.h"

#include <string.h>

/* Bytes of one head's scale at the end of a quantized row. */
#define OG_KV_SCALE_BYTES 4
/* Largest quant magnitudes: int8 and e4m3. */
#define OG_KV_INT8_MAX 127.0f
#define OG_KV_FP8_MAX 448.0f

/* True for the kv dtypes stored as quants and per-head scales. */
static inline bool og_kv_dtype_quantized(og_dtype dt) { return dt == OG_DTYPE_INT8 || dt == OG_DTYPE_FP8; }

/* Rows of int8 / fp8 storage are padded to a multiple of this (bytes). */
#define OG_KV_QUANT_ROW_ALIGN 16

/* Bytes of one storage row of Hkv heads of D: Hkv * D * size for bf16 and
 * f32, round_up(Hkv * (D + 4), 16) for int8 and fp8. */
static inline int64_t og_kv_dtype_row_bytes(og_dtype dt, int64_t Hkv, int64_t D) {
    if (!og_kv_dtype_quantized(dt)) return Hkv * D * (int64_t)og_dtype_size(dt);
    const int64_t a = OG_KV_QUANT_ROW_ALIGN;
    return (Hkv * (D + OG_KV_SCALE_BYTES) + a - 1) / a * a;
}

/* e4m3 value of every byte (0x7f and 0xff are NaN). */
extern const float og_kv_fp8_values[256];

static inline float og_kv_fp8_to_f32(uint8_t x) { return og_kv_fp8_values[x]; }
/* The e4m3 byte nearest x (ties to even), saturated to +-448; NaN -> 0x7f. */
uint8_t og_kv_fp8_from_f32(float x);

/* Where a view's Hkv heads lie in a storage row: the whole row (heads 0),
 * or heads [head0, head0 + Hkv) of a row of `heads` (a tensor-parallel
 * shard's kv heads, exec/backend_cpu_tp.c). A view row starts at its first
 * head's quants, head0 * D bytes into the storage row. */
typedef struct og_kv_row_part {
    int64_t heads; /* heads of the storage row; 0: the view's own Hkv */
    int64_t head0; /* the view's first head in it                     */
} og_kv_row_part;

/* Bytes from a view row's start to the scale of its head 0. */
static inline int64_t og_kv_scale_offset(og_kv_row_part part, int64_t Hkv, int64_t D) {
    const int64_t heads = part.heads ? part.heads : Hkv;
    return (heads - part.head0) * D + part.head0 * OG_KV_SCALE_BYTES;
}

/* Scale of head h of a quantized view row whose head 0 scale is soff
 * bytes in (og_kv_scale_offset). */
static inline float og_kv_row_scale_at(const void *row, int64_t soff, int64_t h) {
    float s;
    memcpy(&s, (const unsigned char *)row + soff + h * OG_KV_SCALE_BYTES, sizeof s);
    return s;
}

/* Quantizes x [Hkv, D] into the view row `row` of dt (int8 or fp8) as
 * above: the heads' quants and scales, and the row's padding when the part
 * holds its last head. The other heads' bytes are left as they are. */
void og_kv_quantize_heads(og_dtype dt, const float *x, int64_t Hkv, int64_t D, og_kv_row_part part, void *row);

/* Quantizes x [Hkv, D] into one whole row of dt, padding included
 * (og_kv_dtype_row_bytes bytes written). */
void og_kv_quantize_row(og_dtype dt, const float *x, int64_t Hkv, int64_t D, void *row);

/* Element d of head h of a quantized view row of dt, in f32 (soff:
 * og_kv_scale_offset). */
static inline float og_kv_row_load(og_dtype dt, const void *row, int64_t soff, int64_t D, int64_t h, int64_t d) {
    const uint8_t q = ((const uint8_t *)row)[h * D + d];
    const float x = dt == OG_DTYPE_INT8 ? (float)(int8_t)q : og_kv_fp8_to_f32(q);
    return x * og_kv_row_scale_at(row, soff, h);
}

#endif /* OG_CORE_KV_QUANT_H */
