/* Quantized weights (q8, q4), the format's reference code in core:
 * og_tensor_bytes sizes and refusals; og_quantize_rows against a naive
 * oracle written here (the scale rule, rounding to nearest, clamping), the
 * q4 nibble layout against bytes worked out by hand; the round trip through
 * og_dequantize_row within half a scale per element; non-finite input and
 * overflowing scales refused naming the row.
 * Letters: N rows, K elements per row (a multiple of the group, 32). */
#include "core/core.h"
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { G = OG_QUANT_GROUP };

/* ---- og_tensor_bytes ---- */

static void test_tensor_bytes(void) {
    og_test_section("og_tensor_bytes");
    int64_t b = -1;
    const int64_t s2[2] = {3, 64}, s3[3] = {2, 3, 5};
    CHECK(og_tensor_bytes(OG_DTYPE_F32, 3, s3, &b) && b == 120);
    CHECK(og_tensor_bytes(OG_DTYPE_BF16, 3, s3, &b) && b == 60);
    CHECK(og_tensor_bytes(OG_DTYPE_INT8, 3, s3, &b) && b == 30);
    CHECK(og_tensor_bytes(OG_DTYPE_FP8, 2, s2, &b) && b == 192);
    /* q8: a byte per element, then a 2-byte scale per group of 32 */
    CHECK(og_tensor_bytes(OG_DTYPE_Q8, 2, s2, &b) && b == 3 * 64 + 3 * 2 * 2);
    /* q4: half a byte per element, then the same scales */
    CHECK(og_tensor_bytes(OG_DTYPE_Q4, 2, s2, &b) && b == 3 * 32 + 3 * 2 * 2);
    const int64_t one[2] = {1, 32};
    CHECK(og_tensor_bytes(OG_DTYPE_Q8, 2, one, &b) && b == 34);
    CHECK(og_tensor_bytes(OG_DTYPE_Q4, 2, one, &b) && b == 18);
    const int64_t big[2] = {151936, 1024}; /* an embedding table of the 0.6B shape */
    CHECK(og_tensor_bytes(OG_DTYPE_Q8, 2, big, &b) && b == 151936LL * 1024 + 151936LL * 32 * 2);
    CHECK(og_tensor_bytes(OG_DTYPE_Q4, 2, big, &b) && b == 151936LL * 512 + 151936LL * 32 * 2);
    CHECK(og_dtype_size(OG_DTYPE_Q8) == 0 && og_dtype_size(OG_DTYPE_Q4) == 0);
    CHECK(og_dtype_size(OG_DTYPE_INT8) == 1 && og_dtype_size(OG_DTYPE_FP8) == 1);

    /* a stack of E matrices: E times one matrix's bytes */
    const int64_t st3[3] = {3, 5, 64}, mat2[2] = {5, 64};
    int64_t b1 = 0;
    CHECK(og_tensor_bytes(OG_DTYPE_Q8, 3, st3, &b) && og_tensor_bytes(OG_DTYPE_Q8, 2, mat2, &b1) && b == 3 * b1);
    CHECK(og_tensor_bytes(OG_DTYPE_Q4, 3, st3, &b) && og_tensor_bytes(OG_DTYPE_Q4, 2, mat2, &b1) && b == 3 * b1);

    /* refusals leave *bytes untouched */
    const int64_t r1[1] = {64}, r4[4] = {2, 2, 2, 64}, r3k48[3] = {2, 2, 48}, k48[2] = {2, 48}, k16[2] = {2, 16},
                  zero[2] = {0, 64}, neg[2] = {-2, 64}, kzero[2] = {2, 0},
                  huge[2] = {INT64_MAX / 32, 64}, s5[5] = {1, 1, 1, 1, 1};
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        b = -7;
        CHECK(!og_tensor_bytes(dt, 1, r1, &b));  /* a quantized tensor is [N, K] or [E, N, K] */
        CHECK(!og_tensor_bytes(dt, 4, r4, &b));
        CHECK(!og_tensor_bytes(dt, 3, r3k48, &b));
        CHECK(!og_tensor_bytes(dt, 2, k48, &b)); /* K not whole groups */
        CHECK(!og_tensor_bytes(dt, 2, k16, &b));
        CHECK(!og_tensor_bytes(dt, 2, zero, &b));
        CHECK(!og_tensor_bytes(dt, 2, neg, &b));
        CHECK(!og_tensor_bytes(dt, 2, kzero, &b));
        CHECK(!og_tensor_bytes(dt, 2, huge, &b)); /* N * K overflows int64 */
        CHECK(!og_tensor_bytes(dt, 2, NULL, &b));
        CHECK_MSG(b == -7, "%s: a refusal wrote %lld", og_dtype_name(dt), (long long)b);
    }
    b = -7;
    CHECK(!og_tensor_bytes(OG_DTYPE_F32, 0, r1, &b));
    CHECK(!og_tensor_bytes(OG_DTYPE_F32, 5, s5, &b));
    CHECK(!og_tensor_bytes(OG_DTYPE_COUNT, 2, s2, &b));
    CHECK(!og_tensor_bytes((og_dtype)-1, 2, s2, &b));
    const int64_t f32_huge[2] = {INT64_MAX / 2, 2}; /* elements fit, bytes do not */
    CHECK(!og_tensor_bytes(OG_DTYPE_F32, 2, f32_huge, &b));
    CHECK(b == -7);
}

/* ---- the oracle ---- */

/* The f16 nearest to v (ties to even), as a float; v finite and below the
 * f16 overflow threshold. Spacing 2^(e-10) for |v| in [2^e, 2^(e+1)),
 * 2^-24 below 2^-14 (subnormals). */
static double f16_nearest(float v) {
    double a = fabs((double)v);
    if (a == 0.0) return (double)v;
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int exp = e - 1 < -14 ? -14 : e - 1;
    double ulp = ldexp(1.0, exp - 10);
    return copysign(nearbyint(a / ulp) * ulp, (double)v); /* a / ulp exact: a power of two */
}

/* One group quantized the way the format states: q8 scale = f16(amax / 127),
 * q4 scale = f16(m / -8) with m the first element of largest magnitude;
 * q = nearest integer to x / scale, clamped to [-127, 127] or [-8, 7]. x / s
 * is taken in double (exact to 2^-52); *ambiguous gets the elements whose
 * x / s lies within 2^-20 (relative) of a half, where a kernel computing it
 * in f32 may round either way. */
static double oracle_group(og_dtype dt, const float *x, int q[G], bool ambiguous[G]) {
    float m = 0.0f;
    for (int j = 0; j < G; j++)
        if (fabsf(x[j]) > fabsf(m)) m = x[j];
    const double s = f16_nearest(dt == OG_DTYPE_Q8 ? fabsf(m) / 127.0f : m / -8.0f);
    const int lo = dt == OG_DTYPE_Q8 ? -127 : -8, hi = dt == OG_DTYPE_Q8 ? 127 : 7;
    for (int j = 0; j < G; j++) {
        const double v = s != 0.0 ? (double)x[j] / s : 0.0;
        double r = nearbyint(v);
        r = r < lo ? lo : r > hi ? hi : r;
        q[j] = (int)r;
        const double frac = fabs(v - floor(v) - 0.5);
        ambiguous[j] = frac <= 0x1p-20 * (fabs(v) > 1.0 ? fabs(v) : 1.0);
    }
    return s;
}

/* Element j of a group as stored: q8 an int8, q4 the nibble the format
 * names (byte j % 16, low nibble for j < 16, high for j >= 16, minus 8). */
static int stored_q(og_dtype dt, const uint8_t *group, int j) {
    if (dt == OG_DTYPE_Q8) return (int8_t)group[j];
    const uint8_t b = group[j % 16];
    return (j < 16 ? b & 15 : b >> 4) - 8;
}

static float f16_value(const uint8_t *p) {
    og_f16 h;
    memcpy(&h, p, sizeof h);
    return og_f32_from_f16(h);
}

/* ---- og_quantize_rows against the oracle, and the round trip ---- */

static void check_random(og_rng *r, og_dtype dt, int64_t N, int64_t K) {
    const int64_t shape[2] = {N, K};
    int64_t bytes = 0;
    CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
    uint8_t *w = malloc((size_t)bytes);
    float *x = malloc(sizeof(float) * (size_t)(N * K));
    float *back = malloc(sizeof(float) * (size_t)K);
    /* groups of very different ranges (1e-6 .. 1e3, one of all zeros) and
     * signs: both scale signs for q4, small scales near the f16 subnormals */
    og_rng_fill(r, x, (size_t)(N * K), -1.0f, 1.0f);
    for (int64_t i = 0; i < N * K; i++) {
        const int64_t g = i / G;
        x[i] *= g % 11 == 5 ? 0.0f : powf(10.0f, (float)(g % 10) - 6.0f);
    }
    CHECK_OK(og_quantize_rows(dt, x, N, K, w));
    const size_t row_q = (size_t)(dt == OG_DTYPE_Q8 ? K : K / 2);
    const size_t gq = dt == OG_DTYPE_Q8 ? G : G / 2;
    const uint8_t *scales = w + (size_t)N * row_q;
    int64_t bad_scale = 0, bad_q = 0, ambiguous_n = 0, bad_trip = 0, bad_deq = 0;
    for (int64_t n = 0; n < N; n++) {
        og_dequantize_row(dt, w, N, K, n, back);
        for (int64_t g = 0; g < K / G; g++) {
            const float *xg = x + n * K + g * G;
            int want[G];
            bool amb[G];
            const double s = oracle_group(dt, xg, want, amb);
            const float got_s = f16_value(scales + 2 * (size_t)(n * (K / G) + g));
            bad_scale += (double)got_s != s;
            const uint8_t *group = w + (size_t)n * row_q + (size_t)g * gq;
            for (int j = 0; j < G; j++) {
                const int q = stored_q(dt, group, j);
                if (q != want[j]) {
                    if (amb[j] && abs(q - want[j]) == 1)
                        ambiguous_n++;
                    else
                        bad_q++;
                }
                /* the dequantizer: scale times the stored q, exactly */
                const float v = back[g * G + j];
                bad_deq += v != got_s * (float)q;
                /* round trip: within half a scale, except q4 elements past
                 * 7.5 scales (opposite in sign to m: clamped to 7, so off by
                 * |x| - 7 |s| <= |m| - 7 |s| <= |s| (1 + 2^-8), the f16
                 * scale being within 2^-11 of |m| / 8). A scale
                 * below 2^-14 is an f16 subnormal, off amax / 127 (m / -8)
                 * by up to 2^-25: the largest elements may then clamp, off
                 * by up to 128 * 2^-25 more (and a scale rounded to 0 leaves
                 * a group of such tiny elements all 0). */
                const double err = fabs((double)v - (double)xg[j]), as = fabs((double)got_s);
                const bool clamped =
                    dt == OG_DTYPE_Q4 && got_s != 0.0f && (double)xg[j] / got_s > 7.5;
                double limit = clamped ? as * (1.0 + 0x1p-8) : as * 0.5 * (1.0 + 0x1p-20);
                if (as < 0x1p-14) limit += 128 * 0x1p-25;
                bad_trip += !(err <= limit);
            }
        }
    }
    CHECK_MSG(bad_scale == 0, "%s [%lld, %lld]: %lld scales differ from the rule",
              og_dtype_name(dt), (long long)N, (long long)K, (long long)bad_scale);
    CHECK_MSG(bad_q == 0, "%s [%lld, %lld]: %lld quants are not the nearest integer",
              og_dtype_name(dt), (long long)N, (long long)K, (long long)bad_q);
    CHECK_MSG(bad_deq == 0, "%s: %lld dequantized elements are not scale * q", og_dtype_name(dt),
              (long long)bad_deq);
    CHECK_MSG(bad_trip == 0, "%s: %lld elements off by more than half a scale", og_dtype_name(dt),
              (long long)bad_trip);
    /* the f32 quotient x / s may round a hair-close half either way; it must be rare */
    CHECK_MSG(ambiguous_n * 10000 <= N * K, "%s: %lld of %lld elements rounded the other way",
              og_dtype_name(dt), (long long)ambiguous_n, (long long)(N * K));
    free(w);
    free(x);
    free(back);
}

/* ---- hand-worked groups ---- */

static void check_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what) {
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (got[i] != want[i]) first = i;
    CHECK_MSG(first == n, "%s: byte %zu is 0x%02x, want 0x%02x", what, first,
              first < n ? got[first] : 0, first < n ? want[first] : 0);
}

static void test_hand(void) {
    og_test_section("hand-worked groups");
    /* q4: v = -8..7 then 7..-8, x = v / 2. m = -4 (first of largest
     * magnitude) -> scale -4 / -8 = 0.5 (f16 0x3800), q = v; byte j holds
     * q_j + 8 = j low and q_{j+16} + 8 = 15 - j high. */
    float x[G];
    for (int j = 0; j < 16; j++) x[j] = 0.5f * (float)(j - 8);
    for (int j = 16; j < 32; j++) x[j] = 0.5f * (float)(7 - (j - 16));
    static const uint8_t q4_want[18] = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87, 0x78,
                                        0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F, 0x00, 0x38};
    uint8_t got[34];
    memset(got, 0xAA, sizeof got);
    CHECK_OK(og_quantize_rows(OG_DTYPE_Q4, x, 1, G, got));
    check_bytes(got, q4_want, sizeof q4_want, "q4 group, m < 0");
    /* the same values negated: m = +4 -> scale 4 / -8 = -0.5 (f16 0xB800),
     * so that m is q = -8 again: the same quants, the scale's sign flipped */
    for (int j = 0; j < G; j++) x[j] = -x[j];
    uint8_t q4_neg[18];
    memcpy(q4_neg, q4_want, sizeof q4_neg);
    q4_neg[17] = 0xB8;
    memset(got, 0xAA, sizeof got);
    CHECK_OK(og_quantize_rows(OG_DTYPE_Q4, x, 1, G, got));
    check_bytes(got, q4_neg, sizeof q4_neg, "q4 group, m > 0");

    /* q4 clamping and ties: m = -1 (element 0; +1 at element 1 comes second)
     * -> scale 0.125; +1 / 0.125 = 8 and 0.9375 / 0.125 = 7.5 (tie, to even
     * 8) clamp to 7; 0.3125 / 0.125 = 2.5 -> 2, -0.4375 -> -3.5 -> -4;
     * elements 16.. stay 0. Bytes: element j low, element j + 16 high. */
    memset(x, 0, sizeof x);
    x[0] = -1.0f, x[1] = 1.0f, x[2] = 0.9375f, x[3] = 0.3125f, x[4] = -0.4375f;
    x[16] = 0.1875f; /* 1.5 -> 2 */
    x[17] = -0.0625f; /* -0.5 -> -0 */
    static const uint8_t clamp_want[18] = {0x0 | 0xA << 4, 0xF | 0x8 << 4, 0xF | 0x8 << 4,
                                           0xA | 0x8 << 4, 0x4 | 0x8 << 4, 0x88, 0x88, 0x88,
                                           0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
                                           0x00, 0x30};
    memset(got, 0xAA, sizeof got);
    CHECK_OK(og_quantize_rows(OG_DTYPE_Q4, x, 1, G, got));
    check_bytes(got, clamp_want, sizeof clamp_want, "q4 clamping and ties");

    /* q8: amax 127 -> scale 1 (f16 0x3C00); ties to even: 2.5 -> 2, 3.5 -> 4,
     * -2.5 -> -2, 0.5 -> 0, -1.5 -> -2; 0.49 -> 0; -127 -> -127 (never -128) */
    memset(x, 0, sizeof x);
    x[0] = 127.0f, x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = 0.5f, x[5] = -1.5f;
    x[6] = 0.49f, x[7] = -127.0f, x[31] = 126.5f; /* 126.5 -> 126 */
    uint8_t q8_want[34] = {0};
    q8_want[0] = 0x7F, q8_want[1] = 2, q8_want[2] = 4, q8_want[3] = 0xFE, q8_want[4] = 0;
    q8_want[5] = 0xFE, q8_want[6] = 0, q8_want[7] = 0x81, q8_want[31] = 126;
    q8_want[32] = 0x00, q8_want[33] = 0x3C;
    memset(got, 0xAA, sizeof got);
    CHECK_OK(og_quantize_rows(OG_DTYPE_Q8, x, 1, G, got));
    check_bytes(got, q8_want, sizeof q8_want, "q8 group");

    /* all zeros: quants 0 (q4 stores 8 in each nibble); scale +0 for both
     * (not the -0 that 0 / -8 would give q4) */
    memset(x, 0, sizeof x);
    memset(got, 0xAA, sizeof got);
    CHECK_OK(og_quantize_rows(OG_DTYPE_Q4, x, 1, G, got));
    uint8_t zeros_q4[18];
    memset(zeros_q4, 0x88, 16);
    zeros_q4[16] = 0x00, zeros_q4[17] = 0x00;
    check_bytes(got, zeros_q4, sizeof zeros_q4, "q4 zero group");
}

/* ---- refusals ---- */

static void test_refusals(void) {
    og_test_section("refusals");
    enum { N = 4, K = 64 };
    float x[N * K];
    uint8_t w[N * K + N * (K / G) * 2];
    for (int i = 0; i < N * K; i++) x[i] = (float)(i % 7) - 3.0f;
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int b = 0; b < 3; b++) {
            x[2 * K + 37] = bad[b];
            CHECK_STATUS(og_quantize_rows(dt, x, N, K, w), OG_ERR_INVALID_ARGUMENT);
            CHECK_MSG(strstr(og_last_error(), "row 2") != NULL, "%s: %s", og_dtype_name(dt),
                      og_last_error());
        }
        x[2 * K + 37] = 1.0f;
        /* a group whose scale overflows f16 (65504 * 127 is past it) */
        x[3 * K + 40] = 1e10f;
        CHECK_STATUS(og_quantize_rows(dt, x, N, K, w), OG_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(og_last_error(), "row 3") != NULL, "%s: %s", og_dtype_name(dt),
                  og_last_error());
        x[3 * K + 40] = 1.0f;
        CHECK_OK(og_quantize_rows(dt, x, N, K, w));
        /* shapes and dtypes the format does not have */
        CHECK_STATUS(og_quantize_rows(dt, x, N, 48, w), OG_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(og_quantize_rows(dt, x, 0, K, w), OG_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(og_quantize_rows(dt, NULL, N, K, w), OG_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(og_quantize_rows(dt, x, N, K, NULL), OG_ERR_INVALID_ARGUMENT);
    }
    CHECK_STATUS(og_quantize_rows(OG_DTYPE_BF16, x, N, K, w), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_quantize_rows(OG_DTYPE_INT8, x, N, K, w), OG_ERR_INVALID_ARGUMENT);
}

int main(void) {
    og_rng r = og_rng_seed(16);
    test_tensor_bytes();
    test_hand();
    og_test_section("og_quantize_rows vs the oracle, round trip");
    static const int64_t Ks[] = {32, 96, 1056};
    for (int dti = 0; dti < 2; dti++)
        for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++)
            check_random(&r, dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8, 67, Ks[k]);
    test_refusals();
    return og_test_finish();
}
