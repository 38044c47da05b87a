/* k-quant products on the CPU (kquant_cpu.h): x's int8 blocks, the plain C
 * GEMV every ISA version is checked against, and the dispatch.
 * Letters as in kquant_cpu.h: K in features, R rows of x, rows weight rows. */
#include "kernels/kquant_cpu.h"

#include <math.h>

enum { QK = OG_KQUANT_BLOCK };

void og_kq_quantize_x(const float *x, int64_t R, int64_t K, og_kq_x *out) {
    const int64_t nb = K / QK;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * K + b * QK;
            og_kq_x *o = &out[r * nb + b];
            float amax = 0;
            bool finite = true;
            for (int i = 0; i < QK; i++) {
                const float a = fabsf(v[i]);
                finite = finite && a <= 3.4028235e38f; /* false for NaN and infinity */
                amax = a > amax ? a : amax;
            }
            if (!finite || amax == 0) {
                o->d = finite ? 0.0f : NAN;
                memset(o->hi, 0, sizeof o->hi);
                memset(o->lo, 0, sizeof o->lo);
                memset(o->sum16, 0, sizeof o->sum16);
                continue;
            }
            const float id = 127.0f / amax;
            o->d = amax / 127.0f;
            for (int j = 0; j < 16; j++) {
                int32_t s = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++) {
                    const float t = v[i] * id; /* x in units of d */
                    int h = (int)nearbyintf(t);
                    h = h > 127 ? 127 : h < -127 ? -127 : h;
                    int l = (int)nearbyintf((t - (float)h) * 254.0f);
                    l = l > 127 ? 127 : l < -127 ? -127 : l;
                    o->hi[i] = (int8_t)h;
                    o->lo[i] = (int8_t)l;
                    s += 254 * h + l;
                }
                o->sum16[j] = s;
            }
        }
    }
}

static float f16_at(const uint8_t *p) { return og_f32_from_f16((og_f16)(p[0] | (p[1] << 8))); }

/* q4_k / q5_k's 6-bit scales and mins (kquant.c has the packing). */
static void unpack_scale_min(const uint8_t *s, int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

/* The integers A and B of one block pair (kquant_cpu.h), the levels read
 * as kquant.c's dequantization reads them. */
static void block_sums(og_dtype dt, const uint8_t *b, const og_kq_x *xb, int64_t *A, int64_t *B) {
    int32_t xv[QK]; /* x in units of u */
    for (int i = 0; i < QK; i++) xv[i] = 254 * xb->hi[i] + xb->lo[i];
    const struct {
        const int32_t *q, *sum16;
    } xs = {xv, xb->sum16}, *x = &xs;
    int64_t a = 0, m = 0;
    switch (dt) {
    case OG_DTYPE_Q2_K:
        for (int i = 0; i < 16; i++) {
            int64_t s = 0;
            for (int e = 16 * i; e < 16 * i + 16; e++)
                s += (int64_t)((b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) * x->q[e];
            a += (int64_t)(b[i] & 15) * s;
            m += (int64_t)(b[i] >> 4) * x->sum16[i];
        }
        break;
    case OG_DTYPE_Q3_K:
        for (int i = 0; i < 16; i++) {
            const uint8_t *sc = b + 96;
            const int lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
            int64_t s = 0;
            for (int e = 16 * i; e < 16 * i + 16; e++) {
                const int v = ((b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) |
                              (((b[e % 32] >> (e / 32)) & 1) << 2);
                s += (int64_t)v * x->q[e];
            }
            a += (int64_t)((lo | (hi << 4)) - 32) * (s - 4 * x->sum16[i]);
        }
        break;
    case OG_DTYPE_Q4_K:
    case OG_DTYPE_Q5_K: {
        int sc[8], mn[8];
        unpack_scale_min(b + 4, sc, mn);
        const uint8_t *qs = b + (dt == OG_DTYPE_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j++) {
            int64_t s = 0;
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
                if (dt == OG_DTYPE_Q5_K) v |= ((b[16 + l] >> j) & 1) << 4;
                s += (int64_t)v * x->q[32 * j + l];
            }
            a += (int64_t)sc[j] * s;
            m += (int64_t)mn[j] * ((int64_t)x->sum16[2 * j] + x->sum16[2 * j + 1]);
        }
        break;
    }
    default: /* q6_k */
        for (int i = 0; i < 16; i++) {
            int64_t s = 0;
            for (int e = 16 * i; e < 16 * i + 16; e++) {
                const int h = e / 128, k = (e / 32) % 4, l = e % 32;
                const int v = ((b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15) |
                              (((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
                s += (int64_t)v * x->q[e];
            }
            a += (int64_t)(int8_t)b[192 + i] * (s - 32 * x->sum16[i]);
        }
        break;
    }
    *A = a;
    *B = m;
}

/* The f16 scales of a block: d (and dmin; 0 for q3_k, q6_k). */
static void block_scales(og_dtype dt, const uint8_t *b, float *d, float *dmin) {
    switch (dt) {
    case OG_DTYPE_Q2_K: *d = f16_at(b + 80), *dmin = f16_at(b + 82); return;
    case OG_DTYPE_Q3_K: *d = f16_at(b + 108), *dmin = 0; return;
    case OG_DTYPE_Q6_K: *d = f16_at(b + 208), *dmin = 0; return;
    default: *d = f16_at(b), *dmin = f16_at(b + 2); return;
    }
}

void og_kq_gemv_scalar(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                       float *out, int64_t ldo) {
    const int64_t nb = K / QK;
    const size_t bb = og_kquant_block_bytes(dt), rb = og_kquant_row_bytes(dt, K);
    for (int64_t r = 0; r < R; r++)
        for (int64_t f = 0; f < rows; f++) {
            float sa = 0, sm = 0;
            for (int64_t k = 0; k < nb; k++) {
                const uint8_t *b = w + (size_t)f * rb + (size_t)k * bb;
                const og_kq_x *xb = &x[r * nb + k];
                int64_t A, B;
                float d, dmin;
                block_sums(dt, b, xb, &A, &B);
                block_scales(dt, b, &d, &dmin);
                const float u = xb->d / 254.0f;
                sa += u * d * (float)A;
                sm += u * dmin * (float)B;
            }
            out[r * ldo + f] = sa - sm;
        }
}

void og_kq_gemv(og_cpu_isa isa, og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K,
                int64_t rows, bool stream, float *out, int64_t ldo) {
    if (isa == OG_CPU_ISA_AVX512 &&
        og_kq_gemv_avx512(dt, x, R, w, K, rows, stream, og_cpu_has_avx512_vnni(), out, ldo))
        return;
    if (isa >= OG_CPU_ISA_AVX2 && og_kq_gemv_avx2(dt, x, R, w, K, rows, stream, out, ldo)) return;
    og_kq_gemv_scalar(dt, x, R, w, K, rows, out, ldo);
}

void og_kq_dequantize(og_cpu_isa isa, og_dtype dt, const uint8_t *w, int64_t K, int64_t rows, float *dst) {
    if (isa == OG_CPU_ISA_AVX512 && og_kq_dequantize_avx512(dt, w, K, rows, dst)) return;
    for (int64_t r = 0; r < rows; r++) og_kquant_dequantize_row(dt, w, K, r, dst + r * K);
}
