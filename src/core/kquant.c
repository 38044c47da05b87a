/* The k-quant weight formats (q2_k, q3_k, q4_k, q5_k, q6_k): reading a
 * super-block back as f32, and writing one from f32.
 *
 * The block layouts are llama.cpp's (docs/program-format.md gives them byte
 * by byte). Reading follows the gguf Python package's dequantization: the
 * same f32 operations in the same order, so every element is the same bits
 * (test_kquant checks this against values the package computed). Writing
 * follows llama-quantize without an importance matrix: for each sub-block a
 * search for the scale (and min) that fits it best, then the sub-block
 * scales quantized against the super-block's f16 scale, then every element
 * rounded against its stored scale. Each step uses the f32 operations of
 * that tool in the same order (no fused multiply-add, no reassociation: this
 * file is built for plain x86-64 and ISO C, where the compiler contracts
 * nothing), so the bytes equal the ones it writes for the same input
 * (test_kquant, against blocks llama.cpp quantized).
 *
 * Letters: K elements per row (a multiple of 256), n a row. A super-block
 * ("block") is 256 elements; a sub-block 16 (q2_k, q3_k, q6_k) or 32 (q4_k,
 * q5_k) of them with its own scale. */
#include "core.h"

#include <math.h>

enum { QK = OG_KQUANT_BLOCK };

/* Byte offsets of each block's fields. */
enum {
    Q2_SCALES = 0, Q2_QS = 16, Q2_D = 80, Q2_DMIN = 82,           /* 84 bytes  */
    Q3_HMASK = 0, Q3_QS = 32, Q3_SCALES = 96, Q3_D = 108,         /* 110 bytes */
    Q4_D = 0, Q4_DMIN = 2, Q4_SCALES = 4, Q4_QS = 16,             /* 144 bytes */
    Q5_D = 0, Q5_DMIN = 2, Q5_SCALES = 4, Q5_QH = 16, Q5_QS = 48, /* 176 bytes */
    Q6_QL = 0, Q6_QH = 128, Q6_SCALES = 192, Q6_D = 208,          /* 210 bytes */
};

static float f16_at(const uint8_t *p) {
    return og_f32_from_f16((og_f16)(p[0] | (p[1] << 8)));
}
static void put_f16(uint8_t *p, float v) {
    const og_f16 h = og_f16_from_f32(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* q4_k / q5_k: the 6-bit scale and min of sub-block j (0..7) from the 12
 * packed bytes: bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7
 * mins 0-3; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and
 * mins 4-7 (high nibble), whose top 2 bits are the top 2 bits of bytes 0-3
 * (scales) and 4-7 (mins). */
static void scale_min_6bit(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* q3_k: the signed 6-bit scale of sub-block i (0..15): its low 4 bits are
 * nibble i % 8 of bytes 0-7 (low nibbles first), its high 2 bits the
 * 2-bit field i / 4 of byte 8 + i % 4; stored with an offset of 32. */
static int scale_q3(const uint8_t *s, int i) {
    const int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ------------------------------------------------------------ reading */

static void dequant_q2_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + Q2_D), dmin = f16_at(b + Q2_DMIN);
    float dl[16], ml[16];
    for (int i = 0; i < 16; i++) {
        dl[i] = d * (float)(b[Q2_SCALES + i] & 15);
        ml[i] = dmin * (float)(b[Q2_SCALES + i] >> 4);
    }
    /* element 128 h + 32 s + l is bits 2s..2s+1 of qs[32 h + l] */
    for (int e = 0; e < QK; e++) {
        const int h = e / 128, s = (e / 32) % 4, l = e % 32;
        const int q = (b[Q2_QS + 32 * h + l] >> (2 * s)) & 3;
        y[e] = dl[e / 16] * (float)q - ml[e / 16];
    }
}

static void dequant_q3_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + Q3_D);
    float dl[16];
    for (int i = 0; i < 16; i++) dl[i] = d * (float)scale_q3(b + Q3_SCALES, i);
    /* low 2 bits as q2_k's; the third bit is bit e / 32 of hmask[e % 32],
     * and a clear bit means the value is 4 lower */
    for (int e = 0; e < QK; e++) {
        const int h = e / 128, s = (e / 32) % 4, l = e % 32;
        const int lo = (b[Q3_QS + 32 * h + l] >> (2 * s)) & 3;
        const int hbit = (b[Q3_HMASK + l] >> (e / 32)) & 1;
        y[e] = dl[e / 16] * (float)(lo - (hbit ? 0 : 4));
    }
}

static void dequant_q4_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + Q4_D), dmin = f16_at(b + Q4_DMIN);
    /* sub-block j is the low (j even) or high (j odd) nibbles of the 32
     * bytes qs[32 (j / 2) ..] */
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_6bit(b + Q4_SCALES, j, &sc, &m);
        const float dl = d * (float)sc, ml = dmin * (float)m;
        const uint8_t *q = b + Q4_QS + 32 * (j / 2);
        for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)((q[l] >> (4 * (j & 1))) & 15) - ml;
    }
}

static void dequant_q5_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + Q5_D), dmin = f16_at(b + Q5_DMIN);
    /* low 4 bits as q4_k's; the fifth is bit j of qh[l] */
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_6bit(b + Q5_SCALES, j, &sc, &m);
        const float dl = d * (float)sc, ml = dmin * (float)m;
        const uint8_t *q = b + Q5_QS + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> (4 * (j & 1))) & 15) | (((b[Q5_QH + l] >> j) & 1) << 4);
            y[32 * j + l] = dl * (float)v - ml;
        }
    }
}

static void dequant_q6_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + Q6_D);
    /* each half h of the block (128 elements) has 64 bytes of ql and 32 of
     * qh; its 32-element run i (0..3) is the low (i < 2) or high nibbles of
     * ql[64 h + 32 (i % 2) ..] and bits 2i..2i+1 of qh[32 h ..]; values
     * are stored with an offset of 32 */
    for (int e = 0; e < QK; e++) {
        const int h = e / 128, i = (e / 32) % 4, l = e % 32;
        const int lo = (b[Q6_QL + 64 * h + 32 * (i % 2) + l] >> (4 * (i / 2))) & 15;
        const int hi = (b[Q6_QH + 32 * h + l] >> (2 * i)) & 3;
        const float dl = d * (float)(int8_t)b[Q6_SCALES + e / 16];
        y[e] = dl * (float)((lo | (hi << 4)) - 32);
    }
}

void og_kquant_dequantize_row(og_dtype dt, const void *w, int64_t K, int64_t n, float *out) {
    const size_t bb = og_kquant_block_bytes(dt);
    const uint8_t *row = (const uint8_t *)w + (size_t)n * og_kquant_row_bytes(dt, K);
    for (int64_t blk = 0; blk < K / QK; blk++) {
        const uint8_t *b = row + (size_t)blk * bb;
        float *y = out + blk * QK;
        switch (dt) {
        case OG_DTYPE_Q2_K: dequant_q2_k(b, y); break;
        case OG_DTYPE_Q3_K: dequant_q3_k(b, y); break;
        case OG_DTYPE_Q4_K: dequant_q4_k(b, y); break;
        case OG_DTYPE_Q5_K: dequant_q5_k(b, y); break;
        case OG_DTYPE_Q6_K: dequant_q6_k(b, y); break;
        default: return;
        }
    }
}

/* ------------------------------------------------------------ writing */

/* Round to the nearest integer, ties to even, by adding 1.5 * 2^23 (which
 * leaves the integer in the low mantissa bits): exact for |v| < 2^22; for
 * larger values (or NaN) it gives what that addition gives, as the tool
 * being matched does, and the callers clamp. */
static int round_int(float v) {
    const float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

/* A sub-block whose largest magnitude is below this is all zero. */
#define TINY 1e-15f

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Asymmetric fit (q2_k, q4_k, q5_k): x ~ scale * L + min with L in
 * [0, nmax] and min <= 0, weighted by w. Starts from the range of x, then
 * tries nstep + 1 other inverse scales (nmax + rmin + rdelta * i over the
 * range), solving the weighted least squares for scale and min at each
 * rounding and keeping the one of least weighted error (absolute when
 * mad, else squared). Returns the scale; *neg_min = -min. aux: [n]. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, uint8_t *aux,
                           float rmin, float rdelta, int nstep, bool mad) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        const float wi = w[i];
        sum_w += wi;
        sum_x += wi * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -lo;
        return 0.f;
    }
    float iscale = (float)nmax / (hi - lo);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_int(iscale * (x[i] - lo)), 0, nmax);
        float diff = scale * (float)L[i] + lo - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    if (nstep < 1) {
        *neg_min = -lo;
        return scale;
    }
    for (int step = 0; step <= nstep; step++) {
        iscale = (rmin + rdelta * (float)step + (float)nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_int(iscale * (x[i] - lo)), 0, nmax);
            aux[i] = (uint8_t)l;
            const float wi = w[i];
            sum_l += wi * (float)l;
            sum_l2 += wi * (float)l * (float)l;
            sum_xl += wi * (float)l * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float s = (sum_w * sum_xl - sum_x * sum_l) / det;
            float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (m > 0) {
                m = 0;
                s = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = s * (float)aux[i] + m - x[i];
                diff = mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best) {
                for (int i = 0; i < n; i++) L[i] = aux[i];
                best = err;
                scale = s;
                lo = m;
            }
        }
    }
    *neg_min = -lo;
    return scale;
}

/* Symmetric fit (q6_k): x ~ scale * l with l in [-nmax, nmax - 1], the
 * element of largest magnitude at -nmax; then 18 nearby inverse scales,
 * each solved in weighted least squares (weights x^2), the best kept.
 * L gets l + nmax. Returns the scale. */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, top = 0;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            top = x[i];
        }
    }
    if (amax < TINY) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = (float)-nmax / top;
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sum_lx += w * x[i] * (float)l;
        sum_l2 += w * (float)l * (float)l;
    }
    float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
    float best = scale * sum_lx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)step) / top;
        sum_lx = sum_l2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sum_lx += w * x[i] * (float)l;
            sum_l2 += w * (float)l * (float)l;
        }
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(round_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* Symmetric fit with coordinate descent (q3_k): l in [-nmax, nmax - 1]
 * from the largest magnitude, then up to 5 passes moving single elements
 * to the level that improves the weighted (x^2) fit. L gets l + nmax.
 * Returns the scale. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, top = 0;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            top = x[i];
        }
    }
    if (amax < TINY) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = (float)-nmax / top;
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sum_lx += w * x[i] * (float)l;
        sum_l2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sum_lx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = sum_l2 - w * (float)L[i] * (float)L[i];
                const int l = clampi(round_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (l != L[i]) {
                    slx += w * x[i] * (float)l;
                    sl2 += w * (float)l * (float)l;
                    if (sl2 > 0 && slx * slx * sum_l2 > sum_lx * sum_lx * sl2) {
                        L[i] = (int8_t)l;
                        sum_lx = slx;
                        sum_l2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
}

static void quant_q2_k(const float *x, uint8_t *b) {
    uint8_t L[QK], aux[16];
    float w[16], scales[16], mins[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], aux, -0.5f, 0.1f, 15, true);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    uint8_t *sc = b + Q2_SCALES;
    if (max_scale > 0) {
        const float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++) sc[j] = (uint8_t)round_int(iscale * scales[j]);
        put_f16(b + Q2_D, max_scale / 15.f);
    } else {
        for (int j = 0; j < 16; j++) sc[j] = 0;
        put_f16(b + Q2_D, 0.f);
    }
    if (max_min > 0) {
        const float iscale = 15.f / max_min;
        for (int j = 0; j < 16; j++) sc[j] = (uint8_t)(sc[j] | (round_int(iscale * mins[j]) << 4));
        put_f16(b + Q2_DMIN, max_min / 15.f);
    } else {
        put_f16(b + Q2_DMIN, 0.f);
    }
    /* each element against its stored scale and min; a sub-block of scale
     * 0 keeps the levels of its fit */
    const float d = f16_at(b + Q2_D), dmin = f16_at(b + Q2_DMIN);
    for (int j = 0; j < 16; j++) {
        const float dl = d * (float)(sc[j] & 15);
        if (dl == 0) continue;
        const float ml = dmin * (float)(sc[j] >> 4);
        for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)clampi(round_int((x[16 * j + l] + ml) / dl), 0, 3);
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = L + 128 * h + l;
            b[Q2_QS + 32 * h + l] = (uint8_t)(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
        }
}

static void quant_q3_k(const float *x, uint8_t *b) {
    int8_t L[QK];
    float scales[16];
    float amax = 0, max_scale = 0;
    for (int j = 0; j < 16; j++) {
        scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
        const float a = fabsf(scales[j]);
        if (a > amax) {
            amax = a;
            max_scale = scales[j];
        }
    }
    uint8_t *sc = b + Q3_SCALES;
    memset(sc, 0, 12);
    if (max_scale != 0) {
        const float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; j++) {
            int v = (int8_t)round_int(iscale * scales[j]);
            v = clampi(v, -32, 31) + 32;
            if (j < 8) sc[j] = (uint8_t)(v & 15);
            else sc[j - 8] = (uint8_t)(sc[j - 8] | ((v & 15) << 4));
            sc[8 + j % 4] = (uint8_t)(sc[8 + j % 4] | ((v >> 4) << (2 * (j / 4))));
        }
        put_f16(b + Q3_D, 1 / iscale);
    } else {
        put_f16(b + Q3_D, 0.f);
    }
    const float d = f16_at(b + Q3_D);
    for (int j = 0; j < 16; j++) {
        const float dl = d * (float)scale_q3(sc, j);
        if (dl == 0) continue;
        for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(clampi(round_int(x[16 * j + l] / dl), -4, 3) + 4);
    }
    /* the third bit of element e into bit e / 32 of hmask[e % 32] */
    uint8_t *hm = b + Q3_HMASK;
    memset(hm, 0, 32);
    for (int e = 0; e < QK; e++)
        if (L[e] > 3) {
            hm[e % 32] = (uint8_t)(hm[e % 32] | (1 << (e / 32)));
            L[e] = (int8_t)(L[e] - 4);
        }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *v = L + 128 * h + l;
            b[Q3_QS + 32 * h + l] = (uint8_t)(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
        }
}

/* q4_k and q5_k: 8 sub-blocks of 32 with 6-bit scales and mins; levels
 * 0..nmax (15 or 31). L gets every element's level. */
static void quant_scale_min_block(const float *x, int nmax, float rmin, int nstep, uint8_t *d16, uint8_t *dmin16,
                                  uint8_t *packed, uint8_t *L) {
    uint8_t aux[32];
    float w[32], scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xj[l]);
        scales[j] = fit_scale_min(32, nmax, xj, w, L + 32 * j, &mins[j], aux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)round_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
            packed[j - 4] = (uint8_t)(packed[j - 4] | ((ls >> 4) << 6));
            packed[j] = (uint8_t)(packed[j] | ((lm >> 4) << 6));
        }
    }
    put_f16(d16, max_scale / 63.f);
    put_f16(dmin16, max_min / 63.f);
    const float d = f16_at(d16), dmin = f16_at(dmin16);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_6bit(packed, j, &sc, &m);
        const float dl = d * (float)sc;
        if (dl == 0) continue;
        const float ml = dmin * (float)m;
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(round_int((x[32 * j + l] + ml) / dl), 0, nmax);
    }
}

static void quant_q4_k(const float *x, uint8_t *b) {
    uint8_t L[QK];
    quant_scale_min_block(x, 15, -1.f, 20, b + Q4_D, b + Q4_DMIN, b + Q4_SCALES, L);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) b[Q4_QS + 32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

static void quant_q5_k(const float *x, uint8_t *b) {
    uint8_t L[QK];
    quant_scale_min_block(x, 31, -0.5f, 15, b + Q5_D, b + Q5_DMIN, b + Q5_SCALES, L);
    uint8_t *qh = b + Q5_QH;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
            if (lo > 15) {
                lo -= 16;
                qh[l] = (uint8_t)(qh[l] | (1 << (2 * c)));
            }
            if (hi > 15) {
                hi -= 16;
                qh[l] = (uint8_t)(qh[l] | (1 << (2 * c + 1)));
            }
            b[Q5_QS + 32 * c + l] = (uint8_t)(lo | (hi << 4));
        }
}

static void quant_q6_k(const float *x, uint8_t *b) {
    int8_t L[QK];
    float scales[16];
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; j++) {
        scales[j] = fit_scale_sym(16, 32, x + 16 * j, L + 16 * j);
        const float a = fabsf(scales[j]);
        if (a > max_abs) {
            max_abs = a;
            max_scale = scales[j];
        }
    }
    if (max_abs < TINY) { /* an all-zero block */
        memset(b, 0, 210);
        put_f16(b + Q6_D, 0.f);
        return;
    }
    const float iscale = -128.f / max_scale;
    put_f16(b + Q6_D, 1 / iscale);
    int8_t *sc = (int8_t *)(b + Q6_SCALES);
    for (int j = 0; j < 16; j++) {
        const int v = round_int(iscale * scales[j]);
        sc[j] = (int8_t)(v < 127 ? v : 127);
    }
    const float d = f16_at(b + Q6_D);
    for (int j = 0; j < 16; j++) {
        const float dl = d * (float)sc[j];
        if (dl == 0) continue;
        for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(clampi(round_int(x[16 * j + l] / dl), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *v = L + 128 * h + l;
            b[Q6_QL + 64 * h + l] = (uint8_t)((v[0] & 15) | ((v[64] & 15) << 4));
            b[Q6_QL + 64 * h + 32 + l] = (uint8_t)((v[32] & 15) | ((v[96] & 15) << 4));
            b[Q6_QH + 32 * h + l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
        }
}

og_status og_kquant_quantize_rows(og_dtype dt, const float *src, int64_t N, int64_t K, void *dst) {
    return og_kquant_quantize_row_range(dt, src, N, K, 0, N, dst);
}

og_status og_kquant_quantize_row_range(og_dtype dt, const float *src, int64_t N, int64_t K, int64_t r0, int64_t r1,
                                       void *dst) {
    if (!og_dtype_is_kquant(dt) || !src || !dst || N <= 0 || K <= 0 || K % QK || r0 < 0 || r1 > N || r0 > r1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "quantize: bad arguments (dtype %s, [%lld, %lld], rows %lld..%lld)",
                            og_dtype_name(dt), (long long)N, (long long)K, (long long)r0, (long long)r1);
    const size_t bb = og_kquant_block_bytes(dt);
    for (int64_t n = r0; n < r1; n++) {
        for (int64_t k = 0; k < K; k++)
            if (!isfinite(src[n * K + k]))
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "quantize: row %lld element %lld is not finite",
                                    (long long)n, (long long)k);
        uint8_t *row = (uint8_t *)dst + (size_t)n * og_kquant_row_bytes(dt, K);
        for (int64_t blk = 0; blk < K / QK; blk++) {
            const float *x = src + n * K + blk * QK;
            uint8_t *b = row + (size_t)blk * bb;
            switch (dt) {
            case OG_DTYPE_Q2_K: quant_q2_k(x, b); break;
            case OG_DTYPE_Q3_K: quant_q3_k(x, b); break;
            case OG_DTYPE_Q4_K: quant_q4_k(x, b); break;
            case OG_DTYPE_Q5_K: quant_q5_k(x, b); break;
            default: quant_q6_k(x, b); break;
            }
        }
    }
    return OG_OK;
}
