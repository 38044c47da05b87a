/* q8 / q4 products on integers (quant_int_cpu.h): x's terms, the plain C
 * GEMV the AVX-512 version is checked against, and the dispatch.
 * Letters as in quant_int_cpu.h: K in features, R rows of x, rows weight
 * rows. */
#include "kernels/quant_int_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { QG = OG_QUANT_GROUP };

/* Where group j (0 - 15) of a set keeps element e's hi term (part 0) or
 * lo term (part 2). */
static size_t term_at(int j, int e, int part) {
    return (size_t)(j / 4) * 256 + (size_t)(part + (e >= 16)) * 64 + (size_t)(16 * (j % 4) + e % 16);
}


void og_qi_quantize_scalar(const float *x, int64_t R, int64_t K, og_qi_x *out) {
    const int64_t G = K / QG, n = og_qi_sets(K);
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < n; b++) {
            og_qi_x *o = &out[r * n + b];
            memset(o, 0, sizeof *o);
            for (int j = 0; j < 16 && b * 16 + j < G; j++) {
                const float *v = x + r * K + (b * 16 + j) * QG;
                float m = 0;
                bool bad = false;
                for (int e = 0; e < QG; e++) {
                    const float a = fabsf(v[e]);
                    bad = bad || !(a <= 3.4028235e38f); /* NaN or infinity */
                    m = a > m ? a : m;
                }
                if (bad || !(m >= 0x1p-120f)) {
                    o->u[j] = bad ? NAN : 0.0f;
                    continue;
                }
                const float id = 127.0f / m;
                o->u[j] = m / 32258.0f; /* 127 * 254 */
                int32_t sum = 0;
                for (int e = 0; e < QG; e++) {
                    const float t = v[e] * id, h = rintf(t); /* |t| <= 127 */
                    const float l = rintf((t - h) * 254.0f);
                    ((int8_t *)o->t)[term_at(j, e, 0)] = (int8_t)h;
                    ((int8_t *)o->t)[term_at(j, e, 2)] = (int8_t)l;
                    sum += 254 * (int32_t)h + (int32_t)l;
                }
                o->s[j] = sum;
            }
        }
}

void og_qi_gemv_scalar(og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s, int64_t K,
                       int64_t rows, float *out, int64_t ldo) {
    const int64_t G = K / QG, n = og_qi_sets(K);
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    for (int64_t r = 0; r < R; r++)
        for (int64_t f = 0; f < rows; f++) {
            float lane[16] = {0};
            for (int64_t g = 0; g < G; g++) {
                const og_qi_x *o = &x[r * n + g / 16];
                const int j = (int)(g % 16);
                const uint8_t *p = q + (size_t)f * rb + (size_t)g * gb;
                int32_t I = 0;
                for (int e = 0; e < QG; e++) {
                    const int qv = dt == OG_DTYPE_Q8 ? (int8_t)p[e]
                                                     : (int)(e < 16 ? p[e] & 15 : p[e - 16] >> 4) - 8;
                    I += qv * (254 * ((const int8_t *)o->t)[term_at(j, e, 0)] + ((const int8_t *)o->t)[term_at(j, e, 2)]);
                }
                const float dwu = og_f32_from_f16(s[f * G + g]) * o->u[j];
                lane[j] = fmaf(dwu, (float)I, lane[j]);
            }
            float sum = 0;
            for (int l = 0; l < 16; l++) sum += lane[l];
            out[r * ldo + f] = sum;
        }
}

/* -1: not yet read from the environment */
static atomic_int g_enabled = -1;

void og_qi_enable(int on) { atomic_store(&g_enabled, on < 0 ? -1 : on != 0); }

bool og_qi_active(og_cpu_isa isa) {
    int on = atomic_load_explicit(&g_enabled, memory_order_relaxed);
    if (on < 0) {
        const char *e = getenv("OG_CPU_QUANT_INT");
        on = e && e[0] == '1';
        atomic_store(&g_enabled, on);
    }
    return on && isa != OG_CPU_ISA_AVX2;
}

void og_qi_quantize(og_cpu_isa isa, const float *x, int64_t R, int64_t K, og_qi_x *out) {
    if (isa == OG_CPU_ISA_AVX512)
        og_qi_quantize_avx512(x, R, K, out);
    else
        og_qi_quantize_scalar(x, R, K, out);
}

void og_qi_gemv(og_cpu_isa isa, og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s,
                int64_t K, int64_t rows, bool stream, float *out, int64_t ldo) {
    if (isa == OG_CPU_ISA_AVX512)
        og_qi_gemv_avx512(dt, x, R, q, s, K, rows, stream, og_cpu_has_avx512_vnni(), out, ldo);
    else
        og_qi_gemv_scalar(dt, x, R, q, s, K, rows, out, ldo);
}
