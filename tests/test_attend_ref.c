/* The update_and_attend reference against the double-precision oracle:
 * flat and ring layers, GQA, bf16 and f32 storage, steps that wrap the ring,
 * and refusals that must leave storage and outputs untouched.
 *
 * Letters: T tokens, Hq/Hkv heads, D head dim, L length, R rows, W window.
 *
 * Tolerance: the reference accumulates q.k over D terms and p.v over up to a
 * few hundred keys in f32 (unit roundoff 6e-8) on values in [-1, 1); outputs
 * are convex combinations of v, so |out| <= 1 and the accumulated error stays
 * near 1e-6. atol 2e-5 + rtol 1e-4 leaves a 10x margin, while a wrong mask
 * (one key too many or too few out of hundreds) moves outputs by > 1e-3.
 * bf16 storage is compared against an oracle fed the same bf16-rounded k/v,
 * so the same tolerance holds, and int8 / fp8 storage against an oracle fed
 * k/v rounded as those hold them (oracle.c, from the definition).
 *
 * int8 / fp8 against f32 storage (the error quantization adds): per query
 * head, with k^ and v^ the rounded keys and values, the scores move by at
 * most delta = max_j |scale q.(k_j - k^_j)|, so every softmax weight moves
 * by a factor within e^(+-2 delta) and an output by at most
 * (e^(2 delta) - 1) max|v^| + max|v - v^|; delta is computed from the
 * inputs, and the f32 slack above (atol) is added. */
#include "attend_seq.h"
#include "harness.h"
#include "kernels/attend.h"
#include "core/kv_quant.h"
#include "oracle.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

#define ATOL 2e-5
#define RTOL 1e-4

/* Storage for one layer: [rows, Hkv, D] k and v, filled with NaNs so that a
 * row read before it is written shows in the outputs. */
static og_kv_layer_view make_layer(og_kv_policy policy, og_dtype dt, int32_t W, int32_t Hkv,
                                   int32_t D, int64_t rows) {
    og_kv_layer_view kv = {.layer_id = 3, .policy = policy, .dtype = dt, .window = W,
                           .n_kv_heads = Hkv, .head_dim = D, .rows = rows};
    const size_t bytes = (size_t)(rows * og_kv_dtype_row_bytes(dt, Hkv, D));
    kv.k = malloc(bytes);
    kv.v = malloc(bytes);
    memset(kv.k, 0xff, bytes); /* all-ones bits: NaN in f32 and bf16 */
    memset(kv.v, 0xff, bytes);
    return kv;
}

static void free_layer(og_kv_layer_view *kv) {
    free(kv->k);
    free(kv->v);
}

/* One step of T new tokens through the reference, checked against the
 * oracle over the whole history. Returns the worst tolerance ratio. */
static double step(og_test_seq *s, og_kv_layer_view *kv, og_rng *r, int32_t T, float scale,
                   bool with_positions) {
    const int64_t pos = og_test_seq_append(s, r, T);
    int32_t *positions = malloc((size_t)T * sizeof *positions);
    float *out = malloc((size_t)T * s->Hq * s->D * sizeof(float));
    for (int32_t t = 0; t < T; t++) positions[t] = (int32_t)(pos + t);
    og_poison(out, (size_t)T * s->Hq * s->D);
    kv->length = pos;
    og_attend_args a = {.q = s->q + pos * s->Hq * s->D, .k = s->k + pos * s->Hkv * s->D,
                        .v = s->v + pos * s->Hkv * s->D, .positions = with_positions ? positions : NULL,
                        .out = out, .T = T, .n_heads = s->Hq, .scale = scale, .kv = *kv};
    double ratio = INFINITY;
    og_status st = og_update_and_attend_ref(&a);
    CHECK_STATUS(st, OG_OK);
    if (st == OG_OK)
        ratio = og_test_seq_check(s, pos, T, kv->policy == OG_KV_RING ? kv->window : 0, scale, out,
                                  ATOL, RTOL);
    free(positions);
    free(out);
    return ratio;
}

static void flat_case(og_dtype dt, int32_t Hq, int32_t Hkv, int32_t D, float scale) {
    char name[96];
    snprintf(name, sizeof name, "flat %s Hq=%d Hkv=%d D=%d", og_dtype_name(dt), Hq, Hkv, D);
    og_test_section(name);
    og_rng r = og_rng_seed((uint64_t)(Hq * 1000 + Hkv * 100 + D + dt));
    og_test_seq s;
    CHECK(og_test_seq_init(&s, Hq, Hkv, D, dt, 32));
    og_kv_layer_view kv = make_layer(OG_KV_FLAT, dt, 0, Hkv, D, 32);
    /* two prefill steps, then decodes */
    const int32_t steps[] = {5, 9, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const double ratio = step(&s, &kv, &r, steps[i], scale, i % 2 == 0);
        CHECK_MSG(ratio <= 1.0, "%s step %zu (T=%d): ratio %.3g", name, i, steps[i], ratio);
    }
    free_layer(&kv);
    og_test_seq_free(&s);
}

/* Ring W = 16, max_write = 32, so R = 47. */
static void ring_case(og_dtype dt) {
    enum { W = 16, MAX_WRITE = 32, R = W + MAX_WRITE - 1, HQ = 4, HKV = 2, D = 32 };
    char name[64];
    snprintf(name, sizeof name, "ring %s W=%d R=%d", og_dtype_name(dt), W, R);
    og_test_section(name);
    og_rng r = og_rng_seed(4700u + dt);
    og_test_seq s;
    CHECK(og_test_seq_init(&s, HQ, HKV, D, dt, 400));
    og_kv_layer_view kv = make_layer(OG_KV_RING, dt, W, HKV, D, R);
    /* 10: no wrap yet; 20: fills to 30; 32 (max_write) at L=30 writes slots
     * 30..46 then 0..14, straddling the wrap; 1, 7; another max_write step at
     * L=70 (slots 23..46, 0..7); then decodes through several more wraps */
    const int32_t steps[] = {10, 20, MAX_WRITE, 1, 7, MAX_WRITE, 5};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const double ratio = step(&s, &kv, &r, steps[i], 0.5f, i % 2 == 1);
        CHECK_MSG(ratio <= 1.0, "%s step %zu (T=%d at L=%lld): ratio %.3g", name, i, steps[i],
                  (long long)(s.n - steps[i]), ratio);
    }
    double worst = 0;
    while (s.n < 400) {
        const double ratio = step(&s, &kv, &r, 1, 0.5f, true);
        if (!(ratio <= worst)) worst = ratio;
    }
    CHECK_MSG(worst <= 1.0, "%s decodes up to L=400 (%lld wraps): worst ratio %.3g", name,
              (long long)(s.n / R), worst);
    free_layer(&kv);
    og_test_seq_free(&s);
}

/* ---- int8 and fp8 ---- */

/* e4m3 magnitude of code c in 0..0x7e, from the definition. */
static double e4m3_def(int c) {
    return (c >> 3) == 0 ? ldexp(c & 7, -9) : ldexp(1.0 + (c & 7) / 8.0, (c >> 3) - 7);
}

/* The e4m3 code of |y| by search: nearest, ties to the even code, 448 beyond. */
static int e4m3_search(double a) {
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double db = fabs(a - e4m3_def(best)), dc = fabs(a - e4m3_def(c));
        if (dc < db || (dc == db && (best & 1))) best = c;
    }
    return best;
}

/* The e4m3 table and encoder against the definition: every code, every
 * midpoint between neighbours (ties to even), saturation, and random values
 * over the whole range. */
static void fp8_codec(void) {
    og_test_section("fp8 e4m3 encode / decode");
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        const float got = og_kv_fp8_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            bad += !isnan(got);
            continue;
        }
        const double want = (c & 0x80) ? -e4m3_def(c & 0x7f) : e4m3_def(c & 0x7f);
        bad += (double)got != want || (signbit(got) != 0) != ((c & 0x80) != 0);
        bad += og_kv_fp8_from_f32(got) != c; /* every value encodes to its own code */
    }
    CHECK_MSG(bad == 0, "%d codes decode or re-encode wrongly", bad);
    bad = 0;
    for (int c = 0; c < 0x7e; c++) { /* the midpoint of c and c + 1 goes to the even one */
        const float mid = (float)((e4m3_def(c) + e4m3_def(c + 1)) / 2);
        const int want = (c & 1) ? c + 1 : c;
        bad += og_kv_fp8_from_f32(mid) != want || og_kv_fp8_from_f32(-mid) != (0x80 | want);
    }
    CHECK_MSG(bad == 0, "%d midpoints do not round to even", bad);
    CHECK(og_kv_fp8_from_f32(448.0f) == 0x7e && og_kv_fp8_from_f32(463.9f) == 0x7e &&
          og_kv_fp8_from_f32(1e30f) == 0x7e && og_kv_fp8_from_f32(-INFINITY) == 0xfe);
    CHECK(og_kv_fp8_from_f32(0x1p-10f) == 0x00 && og_kv_fp8_from_f32(0x1.000002p-10f) == 0x01);
    og_rng r = og_rng_seed(448);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float y;
        og_rng_fill(&r, &y, 1, -1.0f, 1.0f);
        y = ldexpf(y, (int)(og_rng_next(&r) % 24) - 14); /* 2^-15 .. 2^9 */
        const int want = e4m3_search(fabs((double)y)) | (y < 0 ? 0x80 : 0);
        if (og_kv_fp8_from_f32(y) != want && bad++ < 5)
            fprintf(stderr, "  %a encodes to 0x%02x, want 0x%02x\n", (double)y, og_kv_fp8_from_f32(y), want);
    }
    CHECK_MSG(bad == 0, "%d of 200000 random values encode wrongly", bad);
}

/* The reference over int8 or fp8 storage against the same steps over f32
 * storage, within the bound of the header comment, for each output. */
static void quant_vs_f32(og_dtype dt, int32_t Hq, int32_t Hkv, int32_t D) {
    enum { N = 48 };
    char name[96];
    snprintf(name, sizeof name, "%s against f32 storage Hq=%d Hkv=%d D=%d", og_dtype_name(dt), Hq, Hkv, D);
    og_test_section(name);
    og_rng r = og_rng_seed((uint64_t)(7000 + dt * 100 + D));
    og_test_seq s;
    CHECK(og_test_seq_init(&s, Hq, Hkv, D, OG_DTYPE_F32, N));
    og_test_seq_append(&s, &r, N);
    const size_t nkv = (size_t)N * Hkv * D, nout = (size_t)N * Hq * D;
    float *kq = malloc(nkv * sizeof(float)), *vq = malloc(nkv * sizeof(float));
    float *want = malloc(nout * sizeof(float)), *got = malloc(nout * sizeof(float));
    memcpy(kq, s.k, nkv * sizeof(float));
    memcpy(vq, s.v, nkv * sizeof(float));
    og_oracle_round_kv(dt == OG_DTYPE_FP8, kq, N, Hkv, D);
    og_oracle_round_kv(dt == OG_DTYPE_FP8, vq, N, Hkv, D);
    og_kv_layer_view f = make_layer(OG_KV_FLAT, OG_DTYPE_F32, 0, Hkv, D, N);
    og_kv_layer_view qs = make_layer(OG_KV_FLAT, dt, 0, Hkv, D, N);
    const int32_t steps[] = {20, 7, 1, 1, 19};
    int64_t pos = 0;
    double worst = 0, mean_err = 0, mean_bound = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; pos += steps[i++]) {
        const int32_t T = steps[i];
        f.length = qs.length = pos;
        og_attend_args a = {.q = s.q + pos * Hq * D, .k = s.k + pos * Hkv * D, .v = s.v + pos * Hkv * D,
                            .out = want, .T = T, .n_heads = Hq, .kv = f};
        CHECK_OK(og_update_and_attend_ref(&a));
        a.kv = qs;
        a.out = got;
        CHECK_OK(og_update_and_attend_ref(&a));
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < Hq; h++) {
                const int32_t g = h / (Hq / Hkv);
                const float *q = s.q + ((pos + t) * Hq + h) * D;
                double delta = 0, vmax = 0, dv = 0;
                for (int64_t j = 0; j <= pos + t; j++) {
                    const size_t row = (size_t)(j * Hkv + g) * D;
                    double dot = 0;
                    for (int32_t d = 0; d < D; d++) {
                        dot += (double)q[d] * ((double)s.k[row + d] - kq[row + d]);
                        vmax = fmax(vmax, fabs((double)vq[row + d]));
                        dv = fmax(dv, fabs((double)s.v[row + d] - vq[row + d]));
                    }
                    delta = fmax(delta, fabs(dot) / sqrt((double)D));
                }
                const double bound = expm1(2 * delta) * vmax + dv + ATOL;
                for (int32_t d = 0; d < D; d++) {
                    const size_t o = ((size_t)t * Hq + h) * D + d;
                    const double err = fabs((double)got[o] - want[o]);
                    worst = fmax(worst, err / bound);
                    mean_err += err;
                    mean_bound += bound;
                }
            }
    }
    CHECK_MSG(worst <= 1.0, "%s: an output is %.3g of its bound", name, worst);
    fprintf(stderr, "  mean |error| %.3g, mean bound %.3g\n", mean_err / (double)(N * Hq * D),
            mean_bound / (double)(N * Hq * D));
    free_layer(&f);
    free_layer(&qs);
    free(kq);
    free(vq);
    free(want);
    free(got);
    og_test_seq_free(&s);
}

/* ---- refusals: each leaves storage and outputs exactly as they were ---- */

typedef og_status (*kernel_fn)(const og_attend_args *a);
static og_status run_cpu(const og_attend_args *a) { return og_update_and_attend_cpu(a, NULL, NULL); }

static void expect_refusal(const char *what, kernel_fn fn, og_attend_args a, og_status want,
                           const char *keyword) {
    const og_kv_layer_view *kv = &a.kv;
    const size_t kv_bytes = (size_t)kv->rows * kv->n_kv_heads * kv->head_dim *
                            (og_dtype_size(kv->dtype) ? og_dtype_size(kv->dtype) : 2);
    const size_t out_bytes = (size_t)a.T * a.n_heads * kv->head_dim * sizeof(float);
    void *k0 = kv->k ? malloc(kv_bytes) : NULL, *v0 = malloc(kv_bytes), *o0 = malloc(out_bytes);
    if (kv->k) memcpy(k0, kv->k, kv_bytes);
    memcpy(v0, kv->v, kv_bytes);
    memcpy(o0, a.out, out_bytes);
    og_status st = fn(&a);
    CHECK_MSG(st == want, "%s: got %s, want %s (%s)", what, og_status_str(st),
              og_status_str(want), og_last_error());
    CHECK_MSG(strstr(og_last_error(), keyword) != NULL, "%s: message '%s' lacks '%s'", what,
              og_last_error(), keyword);
    CHECK_MSG(!kv->k || memcmp(k0, kv->k, kv_bytes) == 0, "%s: k storage changed", what);
    CHECK_MSG(memcmp(v0, kv->v, kv_bytes) == 0, "%s: v storage changed", what);
    CHECK_MSG(memcmp(o0, a.out, out_bytes) == 0, "%s: outputs changed", what);
    free(k0);
    free(v0);
    free(o0);
}

static void refusals(const char *kernel, kernel_fn fn) {
    char name[64];
    snprintf(name, sizeof name, "refusals (%s)", kernel);
    og_test_section(name);
    enum { HQ = 4, HKV = 2, D = 8, T_MAX = 40 };
    og_rng r = og_rng_seed(99);
    float q[T_MAX * HQ * D], k[T_MAX * HKV * D], v[T_MAX * HKV * D], out[T_MAX * HQ * D];
    og_rng_fill(&r, q, sizeof q / sizeof q[0], -1, 1);
    og_rng_fill(&r, k, sizeof k / sizeof k[0], -1, 1);
    og_rng_fill(&r, v, sizeof v / sizeof v[0], -1, 1);
    og_poison(out, sizeof out / sizeof out[0]);

    og_kv_layer_view flat = make_layer(OG_KV_FLAT, OG_DTYPE_BF16, 0, HKV, D, 8);
    for (size_t i = 0; i < 8 * HKV * D; i++) {
        ((og_bf16 *)flat.k)[i] = (og_bf16)og_rng_next(&r);
        ((og_bf16 *)flat.v)[i] = (og_bf16)og_rng_next(&r);
    }
    flat.length = 4;
    const og_attend_args base = {.q = q, .k = k, .v = v, .out = out, .T = 2, .n_heads = HQ,
                                 .kv = flat};

    og_attend_args a = base;
    const int32_t off_by_one[2] = {5, 6}; /* L = 4 makes them 4, 5 */
    a.positions = off_by_one;
    expect_refusal("positions off by one", fn, a, OG_ERR_POSITION, "positions[0]");
    const int32_t second_wrong[2] = {4, 4};
    a.positions = second_wrong;
    expect_refusal("second position wrong", fn, a, OG_ERR_POSITION, "positions[1]");

    a = base;
    a.kv.k = NULL;
    expect_refusal("unbound k", fn, a, OG_ERR_UNBOUND, "unbound");

    a = base;
    a.T = 5; /* L = 4: positions 4..8, past 8 rows */
    expect_refusal("flat write past rows", fn, a, OG_ERR_CAPACITY, "past");
    a.T = 4; /* exactly fills: accepted (checked without running it) */
    CHECK_OK(og_attend_check(&a));

    a = base;
    a.n_heads = 3; /* 3 % 2 != 0 */
    expect_refusal("Hq not a multiple of Hkv", fn, a, OG_ERR_INVALID_ARGUMENT, "multiple");

    a = base;
    a.kv.dtype = (og_dtype)77;
    expect_refusal("unknown dtype", fn, a, OG_ERR_INVALID_ARGUMENT, "dtype");
    a.kv.dtype = OG_DTYPE_F16;
    expect_refusal("f16 storage", fn, a, OG_ERR_UNSUPPORTED, "f16");
    /* int8 rows of these 2 heads of 8 take 2 * (8 + 4) = 24 bytes, padded to
     * 32: strides of 16 (what 2 * 8 elements would be) and 24 are refused,
     * 32 is not */
    a = base;
    a.kv.dtype = OG_DTYPE_INT8;
    a.kv.rows = 4; /* 4 rows of 32 bytes fit the 8 x 16 x 2 bytes held */
    a.kv.length = 0;
    a.kv.row_stride = 16;
    expect_refusal("int8 row stride 16", fn, a, OG_ERR_INVALID_ARGUMENT, "row stride");
    a.kv.row_stride = 24;
    expect_refusal("int8 row stride without the padding", fn, a, OG_ERR_INVALID_ARGUMENT, "row stride");
    a.kv.row_stride = 32;
    CHECK_OK(og_attend_check(&a));

    /* ring W = 16, max_write = 32: R = 47; a 33-token step is too wide */
    og_kv_layer_view ring = make_layer(OG_KV_RING, OG_DTYPE_F32, 16, HKV, D, 47);
    memset(ring.k, 0x11, 47 * HKV * D * sizeof(float));
    memset(ring.v, 0x22, 47 * HKV * D * sizeof(float));
    ring.length = 100;
    a = base;
    a.kv = ring;
    a.T = 33;
    expect_refusal("ring step wider than max_write", fn, a, OG_ERR_WRITE_TOO_WIDE, "max_write");
    a.T = 32;
    CHECK_OK(og_attend_check(&a));
    a.kv.window = 48; /* W > R */
    expect_refusal("ring window above rows", fn, a, OG_ERR_INVALID_ARGUMENT, "window");

    free_layer(&ring);
    free_layer(&flat);
}

int main(void) {
    flat_case(OG_DTYPE_F32, 4, 4, 32, 0.0f);
    flat_case(OG_DTYPE_BF16, 4, 4, 32, 0.0f);
    flat_case(OG_DTYPE_F32, 6, 2, 48, 0.4f);
    flat_case(OG_DTYPE_BF16, 6, 2, 48, 0.0f);
    flat_case(OG_DTYPE_F32, 8, 1, 16, 0.0f);
    flat_case(OG_DTYPE_BF16, 8, 1, 16, 0.7f);
    ring_case(OG_DTYPE_F32);
    ring_case(OG_DTYPE_BF16);
    flat_case(OG_DTYPE_INT8, 6, 2, 48, 0.0f);
    flat_case(OG_DTYPE_FP8, 8, 1, 16, 0.7f);
    flat_case(OG_DTYPE_INT8, 4, 4, 7, 0.0f);
    ring_case(OG_DTYPE_INT8);
    ring_case(OG_DTYPE_FP8);
    fp8_codec();
    quant_vs_f32(OG_DTYPE_INT8, 8, 2, 64);
    quant_vs_f32(OG_DTYPE_FP8, 8, 2, 64);
    quant_vs_f32(OG_DTYPE_INT8, 4, 4, 128);
    quant_vs_f32(OG_DTYPE_FP8, 6, 3, 32);
    refusals("reference", og_update_and_attend_ref);
    refusals("cpu", run_cpu);
    return og_test_finish();
}
