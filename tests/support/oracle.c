/* The naive attention oracle: see oracle.h. */
#include "oracle.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

void og_oracle_attention(const float *q, const float *k, const float *v, int64_t N,
                         int64_t pos0, int32_t T, int32_t Hq, int32_t Hkv, int32_t D,
                         int32_t W, double scale, double *out) {
    const int32_t group = Hq / Hkv;
    if (scale == 0.0) scale = 1.0 / sqrt((double)D);
    double *w = malloc((size_t)N * sizeof *w); /* [N] scores, then weights */
    if (!w) abort(); /* test support only */
    for (int32_t t = 0; t < T; t++) {
        const int64_t p = pos0 + t;
        for (int32_t h = 0; h < Hq; h++) {
            const int32_t kh = h / group;
            const float *qh = q + ((int64_t)t * Hq + h) * D;
            double mx = -INFINITY;
            for (int64_t j = 0; j < N; j++) {
                const int visible = j <= p && (W == 0 || j > p - W);
                if (!visible) {
                    w[j] = -INFINITY;
                    continue;
                }
                const float *kj = k + (j * Hkv + kh) * D;
                double dot = 0;
                for (int32_t d = 0; d < D; d++) dot += (double)qh[d] * (double)kj[d];
                w[j] = dot * scale;
                if (w[j] > mx) mx = w[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < N; j++) {
                w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
                sum += w[j];
            }
            double *o = out + ((int64_t)t * Hq + h) * D;
            for (int32_t d = 0; d < D; d++) o[d] = 0;
            for (int64_t j = 0; j < N; j++) {
                if (w[j] == 0.0) continue;
                const float *vj = v + (j * Hkv + kh) * D;
                for (int32_t d = 0; d < D; d++) o[d] += w[j] / sum * (double)vj[d];
            }
        }
    }
    free(w);
}

/* bf16 keeps 8 significant bits over the f32 exponent range; below FLT_MIN
 * its values are the multiples of 2^-133. Computed in double with the
 * current (round-to-nearest-even) rounding mode, not by bit tricks. */
void og_oracle_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double a = x[i];
        if (!isfinite(a) || a == 0.0) continue;
        if (fabs(a) < FLT_MIN) {
            x[i] = (float)(nearbyint(ldexp(a, 133)) * ldexp(1.0, -133));
            continue;
        }
        int e;
        const double m = frexp(a, &e); /* a = m * 2^e, 0.5 <= |m| < 1 */
        x[i] = (float)ldexp(nearbyint(ldexp(m, 8)), e - 8);
    }
}

/* Nearest of a and b to y, ties to the one whose code is even (for e4m3, the
 * code's low bit is the mantissa's). */
static int nearer_code(double y, int ca, double a, int cb, double b) {
    const double da = fabs(y - a), db = fabs(y - b);
    if (da != db) return da < db ? ca : cb;
    return (ca & 1) ? cb : ca;
}

/* e4m3 magnitude of code c in 0..0x7e, from the definition. */
static double e4m3_value(int c) {
    const int e = c >> 3, m = c & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
}

void og_oracle_round_kv(bool fp8, float *x, size_t rows, int32_t Hkv, int32_t D) {
    for (size_t i = 0; i < rows * (size_t)Hkv; i++) {
        float *xh = x + i * (size_t)D; /* one token's head */
        float amax = 0.0f;
        for (int32_t d = 0; d < D; d++) amax = fmaxf(amax, fabsf(xh[d]));
        const float scale = amax / (fp8 ? 448.0f : 127.0f);
        for (int32_t d = 0; d < D; d++) {
            if (scale == 0.0f) {
                xh[d] = 0.0f * xh[d]; /* a head of zeros stays zeros */
                continue;
            }
            const float y = xh[d] / scale;
            double q;
            if (!fp8) {
                const double lo = floor(y), dlo = y - lo, dhi = lo + 1.0 - y;
                q = dlo < dhi ? lo : dhi < dlo ? lo + 1.0 : fmod(lo, 2.0) == 0.0 ? lo : lo + 1.0;
                q = fmin(127.0, fmax(-127.0, q));
            } else {
                /* every finite e4m3 magnitude: the nearest, by search */
                const double a = fabs((double)y);
                int best = 0;
                for (int c = 1; c <= 0x7e; c++)
                    best = nearer_code(a, best, e4m3_value(best), c, e4m3_value(c));
                q = copysign(e4m3_value(best), (double)y);
            }
            xh[d] = (float)q * scale;
        }
    }
}
