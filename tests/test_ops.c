/* The ops other than matmul: each reference against an independent check
 * (double-precision formulas, hand-computed values, bit patterns) and each
 * fast version against its reference at every ISA level, odd sizes, fresh
 * random inputs, poisoned outputs.
 * Letters: T tokens, N row width, V vocabulary, H hidden, F ffn, D head
 * dim, n heads per row. */
#include "harness.h"
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

static const double U = 0x1p-24; /* f32 unit roundoff */
static const int64_t Ts[] = {1, 3, 7, 17, 129};
static const int64_t Ns[] = {1, 3, 17, 129, 257, 1000};
#define COUNT(a) (sizeof(a) / sizeof *(a))

#define FOR_EACH_ISA(isa) for (int isa = og_cpu_isa_detect(); isa >= OG_CPU_ISA_SCALAR; isa--)

static bool bits_equal_f32(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ---- bf16 <-> f32 ---- */

static void test_convert(og_rng *r) {
    og_test_section("bf16 <-> f32 buffers");
    /* hand-checked rounding: ties go to the even neighbour */
    static const uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                                  0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                                  0x00000001u, 0x7f7fffffu};
    static const og_bf16 want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80,
                                   0xff80, 0x7fc0, 0x7fc0, 0x0000, 0x7f80};
    float f[COUNT(in)];
    og_bf16 h[COUNT(in)];
    memcpy(f, in, sizeof f);
    og_f32_to_bf16_ref(f, h, COUNT(in));
    CHECK(memcmp(h, want, sizeof h) == 0);

    /* every bf16 pattern widens to the same bits as the shift definition */
    size_t n_all = 65536;
    og_bf16 *all = malloc(n_all * sizeof *all);
    uint32_t *wide_want = malloc(n_all * sizeof *wide_want);
    float *wide = malloc(n_all * sizeof *wide);
    for (size_t i = 0; i < n_all; i++) {
        all[i] = (og_bf16)i;
        wide_want[i] = (uint32_t)i << 16;
    }
    og_bf16_to_f32_ref(all, wide, n_all);
    CHECK(memcmp(wide, wide_want, n_all * sizeof *wide) == 0);
    FOR_EACH_ISA(isa) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        for (size_t n = 1; n <= 70; n += 3) {
            og_poison(wide, n_all);
            og_bf16_to_f32_cpu(all + 900 * n, wide, n);
            CHECK(memcmp(wide, wide_want + 900 * n, n * sizeof *wide) == 0);
            CHECK(isnan(wide[n]));
        }
        og_bf16_to_f32_cpu(all, wide, n_all);
        CHECK_MSG(memcmp(wide, wide_want, n_all * sizeof *wide) == 0, "widen all (%s)",
                  og_cpu_isa_name((og_cpu_isa)isa));
    }

    /* narrowing: random bit patterns (NaNs, infinities, subnormals, ties) */
    size_t n = 100003;
    uint32_t *bits = malloc(n * sizeof *bits);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)og_rng_next(r);
        if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u; /* exact tie */
        if (i % 16 == 3) u |= 0x7f800000u;               /* inf or NaN */
        if (i % 16 == 5) u &= 0x807fffffu;               /* subnormal */
        bits[i] = u;
    }
    og_bf16 *hr = malloc(n * sizeof *hr), *hf = malloc((n + 1) * sizeof *hf);
    og_f32_to_bf16_ref((const float *)bits, hr, n);
    FOR_EACH_ISA(isa) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        for (size_t len = 1; len <= 40; len++) {
            hf[len] = 0xdead;
            og_f32_to_bf16_cpu((const float *)bits + 7 * len, hf, len);
            CHECK(memcmp(hf, hr + 7 * len, len * sizeof *hf) == 0 && hf[len] == 0xdead);
        }
        og_f32_to_bf16_cpu((const float *)bits, hf, n);
        CHECK_MSG(memcmp(hf, hr, n * sizeof *hf) == 0, "narrow (%s)",
                  og_cpu_isa_name((og_cpu_isa)isa));
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
    free(all);
    free(wide_want);
    free(wide);
    free(bits);
    free(hr);
    free(hf);
}

/* ---- embed ---- */

static void test_embed(og_threadpool *pool, og_rng *r) {
    og_test_section("embed");
    int64_t V = 1000, H = 129, T = 17;
    for (int dti = 0; dti < 2; dti++) {
        og_dtype dt = dti ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        void *table = malloc(og_dtype_size(dt) * (size_t)(V * H));
        for (int64_t i = 0; i < V * H; i++)
            og_store_f32(table, dt, (size_t)i, og_rng_uniform(r, -3.0f, 3.0f));
        int32_t tokens[17];
        for (int64_t t = 0; t < T; t++) tokens[t] = (int32_t)(og_rng_next(r) % (uint64_t)V);
        tokens[0] = 0;
        tokens[1] = (int32_t)V - 1;
        float ref[17 * 129], fast[17 * 129];
        og_poison(ref, COUNT(ref));
        CHECK_OK(og_embed_ref(tokens, T, table, dt, V, H, ref));
        bool rows_ok = true; /* each row is the table row, widened exactly */
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                rows_ok &= ref[t * H + h] ==
                           og_load_f32(table, dt, (size_t)(tokens[t] * H + h));
        CHECK(rows_ok);
        FOR_EACH_ISA(isa) {
            og_cpu_isa_limit((og_cpu_isa)isa);
            og_poison(fast, COUNT(fast));
            CHECK_OK(og_embed_cpu(pool, tokens, T, table, dt, V, H, fast));
            CHECK(bits_equal_f32(fast, ref, COUNT(ref)));
        }
        og_cpu_isa_limit(OG_CPU_ISA_AVX512);
        /* an id out of range is refused, naming id and position, nothing written */
        tokens[5] = (int32_t)V;
        og_poison(fast, COUNT(fast));
        CHECK_STATUS(og_embed_cpu(pool, tokens, T, table, dt, V, H, fast),
                     OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "token id 1000 at position 5") != NULL);
        CHECK(isnan(fast[0]));
        tokens[5] = -7;
        CHECK_STATUS(og_embed_ref(tokens, T, table, dt, V, H, fast), OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "token id -7 at position 5") != NULL);
        CHECK(isnan(fast[0]));
        free(table);
    }
    float out[4];
    int32_t tok = 0;
    og_f16 f16_table[4] = {0};
    CHECK_STATUS(og_embed_cpu(pool, &tok, 1, f16_table, OG_DTYPE_F16, 1, 4, out),
                 OG_ERR_UNSUPPORTED);
}

/* Quantized tables: each row is the reference dequantizer's row
 * (og_dequantize_row), bit for bit, at every level (f32(scale) * q is exact,
 * so there is one right answer). H of one group, of an odd number of groups
 * (the SIMD dequantizers' chunks of 8 and 16 groups end early) and of many. */
static void test_embed_quant(og_threadpool *pool, og_rng *r) {
    og_test_section("embed, q8 and q4 tables");
    static const int64_t Hs[] = {32, 96, 1056};
    const int64_t V = 300, T = 17;
    for (int dti = 0; dti < 2; dti++) {
        const og_dtype dt = dti ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
        for (size_t hi = 0; hi < COUNT(Hs); hi++) {
            const int64_t H = Hs[hi], shape[2] = {V, H};
            int64_t bytes = 0;
            CHECK(og_tensor_bytes(dt, 2, shape, &bytes));
            void *table = malloc((size_t)bytes);
            float *src = malloc(sizeof(float) * (size_t)(V * H));
            float *want = malloc(sizeof(float) * (size_t)(T * H));
            float *got = malloc(sizeof(float) * (size_t)(T * H));
            og_rng_fill(r, src, (size_t)(V * H), -3.0f, 3.0f);
            CHECK_OK(og_quantize_rows(dt, src, V, H, table));
            int32_t tokens[17];
            for (int64_t t = 0; t < T; t++) tokens[t] = (int32_t)(og_rng_next(r) % (uint64_t)V);
            tokens[0] = 0;
            tokens[1] = (int32_t)V - 1;
            tokens[2] = tokens[3]; /* a repeated id */
            for (int64_t t = 0; t < T; t++)
                og_dequantize_row(dt, table, V, H, tokens[t], want + t * H);
            og_poison(got, (size_t)(T * H));
            CHECK_OK(og_embed_ref(tokens, T, table, dt, V, H, got));
            CHECK(bits_equal_f32(got, want, (size_t)(T * H)));
            FOR_EACH_ISA(isa) {
                og_cpu_isa_limit((og_cpu_isa)isa);
                og_poison(got, (size_t)(T * H));
                CHECK_OK(og_embed_cpu(pool, tokens, T, table, dt, V, H, got));
                CHECK_MSG(bits_equal_f32(got, want, (size_t)(T * H)), "embed %s H=%lld at %s",
                          og_dtype_name(dt), (long long)H, og_cpu_isa_name((og_cpu_isa)isa));
            }
            og_cpu_isa_limit(OG_CPU_ISA_AVX512);
            /* an id out of range is still refused before anything is written */
            tokens[4] = (int32_t)V;
            og_poison(got, (size_t)(T * H));
            CHECK_STATUS(og_embed_cpu(pool, tokens, T, table, dt, V, H, got),
                         OG_ERR_INVALID_ARGUMENT);
            CHECK(isnan(got[0]));
            free(table);
            free(src);
            free(want);
            free(got);
        }
        /* rows that are not whole groups are refused */
        float out[48];
        uint8_t table[64] = {0};
        int32_t tok = 0;
        CHECK_STATUS(og_embed_cpu(pool, &tok, 1, table, dt, 1, 48, out), OG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(og_last_error(), "not a multiple of 32") != NULL);
        CHECK_STATUS(og_embed_ref(&tok, 1, table, dt, 1, 16, out), OG_ERR_INVALID_ARGUMENT);
    }
}

/* ---- rms_norm ---- */

/* Double-precision LlamaRMSNorm of one row (weights as their exact f32). */
static void rms_double(const float *x, const float *w, int64_t N, float eps, double *out) {
    double s = 0;
    for (int64_t i = 0; i < N; i++) s += (double)x[i] * x[i];
    double r = 1.0 / sqrt(s / (double)N + (double)eps);
    for (int64_t i = 0; i < N; i++) out[i] = (double)x[i] * r * (double)w[i];
}

static void test_rms_norm(og_threadpool *pool, og_rng *r) {
    og_test_section("rms_norm");
    const float eps = 1e-6f;
    for (int dti = 0; dti < 2; dti++) {
        og_dtype dt = dti ? OG_DTYPE_F32 : OG_DTYPE_BF16;
        for (size_t a = 0; a < COUNT(Ts); a++)
            for (size_t b = 0; b < COUNT(Ns); b++) {
                int64_t T = Ts[a], N = Ns[b];
                size_t tn = (size_t)(T * N);
                float *x = malloc(tn * sizeof *x), *ref = malloc(tn * sizeof *ref),
                      *fast = malloc(tn * sizeof *fast), *w_exact = malloc((size_t)N * 4);
                double *d = malloc(tn * sizeof *d);
                void *w = malloc(og_dtype_size(dt) * (size_t)N);
                og_rng_fill(r, x, tn, -4.0f, 4.0f);
                for (int64_t i = 0; i < N; i++) {
                    og_store_f32(w, dt, (size_t)i, og_rng_uniform(r, 0.5f, 2.0f));
                    w_exact[i] = og_load_f32(w, dt, (size_t)i);
                }
                for (int64_t t = 0; t < T; t++) rms_double(x + t * N, w_exact, N, eps, d + t * N);
                og_poison(ref, tn);
                CHECK_OK(og_rms_norm_ref(x, w, dt, T, N, eps, ref));
                /* ref: the mean is exact to one rounding; rsqrt, the adds and the two
                 * products add a few more: 8 u relative is ample, a real bug is O(1). */
                double rr = og_tol_ratio_d(ref, d, tn, 1e-30, 8 * U, NULL);
                CHECK_MSG(rr <= 1, "rms_norm ref vs double T=%lld N=%lld: %.3g", (long long)T,
                          (long long)N, rr);
                FOR_EACH_ISA(isa) {
                    og_cpu_isa_limit((og_cpu_isa)isa);
                    og_poison(fast, tn);
                    CHECK_OK(og_rms_norm_cpu(a % 2 ? pool : NULL, x, w, dt, T, N, eps, fast));
                    /* fast sums squares in f32 lanes: relative error <= (N/8 + 8) u in
                     * the mean, halved by the square root, plus the ref's 8 u. */
                    double tol = ((double)N / 16 + 4 + 8) * U;
                    double fr = og_tol_ratio(fast, ref, tn, 1e-30, tol, NULL);
                    CHECK_MSG(fr <= 1, "rms_norm fast(%s) T=%lld N=%lld: %.3g",
                              og_cpu_isa_name((og_cpu_isa)isa), (long long)T, (long long)N, fr);
                }
                og_cpu_isa_limit(OG_CPU_ISA_AVX512);
                /* in place gives the same result */
                memcpy(fast, x, tn * sizeof *x);
                CHECK_OK(og_rms_norm_cpu(pool, fast, w, dt, T, N, eps, fast));
                CHECK(og_tol_ratio(fast, ref, tn, 1e-30, ((double)N / 16 + 12) * U, NULL) <= 1);
                free(x);
                free(ref);
                free(fast);
                free(w_exact);
                free(d);
                free(w);
            }
    }
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[4] = {1, 1, 1, 1};
    CHECK_STATUS(og_rms_norm_cpu(pool, buf, w, OG_DTYPE_F32, 1, 4, eps, buf + 2),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_rms_norm_ref(buf, w, OG_DTYPE_F32, 1, 4, -1.0f, buf + 4),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_rms_norm_ref(buf, NULL, OG_DTYPE_F32, 1, 4, eps, buf + 4),
                 OG_ERR_INVALID_ARGUMENT);
}

static void test_head_rms_norm(og_threadpool *pool, og_rng *r) {
    og_test_section("head_rms_norm");
    const float eps = 1e-6f;
    static const int64_t Ds[] = {1, 3, 64, 128};
    static const int64_t heads[] = {1, 3, 16};
    for (size_t a = 0; a < COUNT(Ts); a++)
        for (size_t b = 0; b < COUNT(Ds); b++)
            for (size_t c = 0; c < COUNT(heads); c++) {
                int64_t T = Ts[a], D = Ds[b], n = heads[c];
                size_t len = (size_t)(T * n * D);
                float *x = malloc(len * 4), *ref = malloc(len * 4), *fast = malloc(len * 4);
                double *d = malloc(len * sizeof *d);
                og_bf16 *w = malloc((size_t)D * 2);
                float *w_exact = malloc((size_t)D * 4);
                og_rng_fill(r, x, len, -3.0f, 3.0f);
                for (int64_t i = 0; i < D; i++) {
                    w[i] = og_bf16_from_f32(og_rng_uniform(r, 0.5f, 2.0f));
                    w_exact[i] = og_f32_from_bf16(w[i]);
                }
                for (int64_t h = 0; h < T * n; h++) rms_double(x + h * D, w_exact, D, eps, d + h * D);
                og_poison(ref, len);
                CHECK_OK(og_head_rms_norm_ref(x, w, OG_DTYPE_BF16, T, n, D, eps, ref));
                CHECK(og_tol_ratio_d(ref, d, len, 1e-30, 8 * U, NULL) <= 1);
                FOR_EACH_ISA(isa) {
                    og_cpu_isa_limit((og_cpu_isa)isa);
                    og_poison(fast, len);
                    CHECK_OK(og_head_rms_norm_cpu(pool, x, w, OG_DTYPE_BF16, T, n, D, eps, fast));
                    double tol = ((double)D / 16 + 12) * U;
                    CHECK(og_tol_ratio(fast, ref, len, 1e-30, tol, NULL) <= 1);
                }
                og_cpu_isa_limit(OG_CPU_ISA_AVX512);
                free(x);
                free(ref);
                free(fast);
                free(d);
                free(w);
                free(w_exact);
            }
}

/* ---- rope ---- */

static void test_rope_table(void) {
    og_test_section("rope tables");
    og_rope_table t;
    /* default, Qwen3 theta 1e6, D 128: inv_freq[i] = 1e6^(-i/64) */
    og_rope_params p = {.type = OG_ROPE_DEFAULT, .theta = 1e6f};
    CHECK_OK(og_rope_table_init(&t, 128, &p));
    double worst = 0;
    for (int i = 0; i < 64; i++) {
        double want = pow(1e6, -(double)i / 64.0);
        double rel = fabs(t.inv_freq[i] - want) / want;
        if (rel > worst) worst = rel;
    }
    CHECK_MSG(worst <= 4 * U, "default inv_freq off by %.3g relative", worst);

    /* Llama 3.1: theta 500000, D 128, factor 8, low 1, high 4, original 8192.
     * inv = 500000^(-i/64), wavelen = 2 pi / inv; high/low wavelen 2048 / 8192.
     *  i = 20: inv = 0.016560440, wavelen 379.4 < 2048      -> unchanged
     *  i = 29: inv = 0.0026160993, wavelen 2401.74, smooth = (8192/2401.74 - 1)/3
     *          = 0.80363, inv * ((1 - 0.80363)/8 + 0.80363) = 0.0021665708
     *  i = 30: inv = 0.0021311195, wavelen 2948.30, smooth 0.59284
     *          -> inv * 0.64374 = 0.0013718936
     *  i = 34: inv = 0.00093847387, wavelen 6695.1, smooth 0.074535
     *          -> inv * 0.19021 = 0.00017850781
     *  i = 35: inv = 0.00076449699, wavelen 8218.7 > 8192   -> inv / 8 = 9.5562124e-05
     *  i = 63: inv = 2.4551408e-06                          -> / 8 = 3.0689260e-07 */
    og_rope_params l3 = {.type = OG_ROPE_LLAMA3, .theta = 500000.0f, .factor = 8.0f,
                         .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                         .original_max_position = 8192};
    CHECK_OK(og_rope_table_init(&t, 128, &l3));
    static const int idx[] = {0, 20, 29, 30, 34, 35, 63};
    static const double want[] = {1.0, 0.016560440, 0.0021665708, 0.0013718936,
                                  0.00017850781, 9.5562124e-05, 3.0689260e-07};
    for (size_t k = 0; k < COUNT(idx); k++) {
        double rel = fabs(t.inv_freq[idx[k]] - want[k]) / want[k];
        CHECK_MSG(rel <= 2e-7 + 8 * U, "llama3 inv_freq[%d] = %.9g, want %.9g", idx[k],
                  (double)t.inv_freq[idx[k]], want[k]);
    }
    og_rope_params lin = {.type = OG_ROPE_LINEAR, .theta = 10000.0f, .factor = 4.0f};
    CHECK_OK(og_rope_table_init(&t, 64, &lin));
    CHECK(fabs(t.inv_freq[1] - pow(10000.0, -2.0 / 64) / 4) <= 4 * U * t.inv_freq[1]);

    CHECK_STATUS(og_rope_table_init(&t, 127, &p), OG_ERR_INVALID_ARGUMENT);
    og_rope_params bad = l3;
    bad.high_freq_factor = 0.5f;
    CHECK_STATUS(og_rope_table_init(&t, 128, &bad), OG_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.type = (og_rope_type)9;
    CHECK_STATUS(og_rope_table_init(&t, 128, &bad), OG_ERR_UNSUPPORTED);
}

static void test_rope(og_threadpool *pool, og_rng *r) {
    og_test_section("rope");
    static const int32_t Ds[] = {2, 6, 64, 128};
    static const int64_t heads[] = {1, 3, 16};
    const double theta = 10000.0;
    og_rope_params p = {.type = OG_ROPE_DEFAULT, .theta = (float)theta};
    for (size_t a = 0; a < COUNT(Ts); a++)
        for (size_t b = 0; b < COUNT(Ds); b++)
            for (size_t c = 0; c < COUNT(heads); c++) {
                int64_t T = Ts[a], n = heads[c];
                int32_t D = Ds[b];
                og_rope_table table;
                CHECK_OK(og_rope_table_init(&table, D, &p));
                size_t len = (size_t)(T * n * D);
                float *x = malloc(len * 4), *ref = malloc(len * 4), *fast = malloc(len * 4);
                double *tol = malloc(len * sizeof *tol), *d = malloc(len * sizeof *d);
                int32_t *pos = malloc((size_t)T * sizeof *pos);
                og_rng_fill(r, x, len, -2.0f, 2.0f);
                for (int64_t t = 0; t < T; t++)
                    pos[t] = t == 0 ? 0 : (int32_t)(og_rng_next(r) % 40000);
                /* the direct formula in double; the f32 path rounds the inverse
                 * frequency (~2 u) and the angle (u), so its angle is off by about
                 * 4 u |angle|, plus a few u of cos/sin and the final products */
                for (int64_t t = 0; t < T; t++)
                    for (int64_t h = 0; h < n; h++)
                        for (int32_t i = 0; i < D / 2; i++) {
                            size_t o = (size_t)((t * n + h) * D);
                            double angle = pos[t] * pow(theta, -2.0 * i / D);
                            double xa = x[o + i], xb = x[o + i + D / 2];
                            d[o + i] = xa * cos(angle) - xb * sin(angle);
                            d[o + i + D / 2] = xb * cos(angle) + xa * sin(angle);
                            double e = (fabs(xa) + fabs(xb)) * (angle * 6 * U + 6 * U);
                            tol[o + i] = tol[o + i + D / 2] = e + 1e-30;
                        }
                og_poison(ref, len);
                CHECK_OK(og_rope_ref(&table, x, pos, T, n, ref));
                double worst = 0;
                for (size_t i = 0; i < len; i++) {
                    double q = isnan(ref[i]) ? INFINITY : fabs(ref[i] - d[i]) / tol[i];
                    if (q > worst) worst = q;
                }
                CHECK_MSG(worst <= 1, "rope ref vs double T=%lld D=%d n=%lld: %.3g",
                          (long long)T, D, (long long)n, worst);
                FOR_EACH_ISA(isa) {
                    og_cpu_isa_limit((og_cpu_isa)isa);
                    og_poison(fast, len);
                    CHECK_OK(og_rope_cpu(pool, &table, x, pos, T, n, fast));
                    /* same f32 operations in the same order */
                    CHECK(og_tol_ratio(fast, ref, len, 1e-30, 2 * U, NULL) <= 1);
                }
                og_cpu_isa_limit(OG_CPU_ISA_AVX512);
                memcpy(fast, x, len * 4); /* in place */
                CHECK_OK(og_rope_cpu(pool, &table, fast, pos, T, n, fast));
                CHECK(og_tol_ratio(fast, ref, len, 1e-30, 2 * U, NULL) <= 1);
                free(x);
                free(ref);
                free(fast);
                free(tol);
                free(d);
                free(pos);
            }
    og_rope_table table;
    CHECK_OK(og_rope_table_init(&table, 4, &p));
    float x[8] = {0}, out[8];
    int32_t pos[2] = {3, -1};
    CHECK_STATUS(og_rope_ref(&table, x, pos, 2, 1, out), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "position -1 at index 1") != NULL);
}

/* ---- swiglu, add ---- */

static void test_swiglu_add(og_threadpool *pool, og_rng *r) {
    og_test_section("swiglu and add");
    static const int64_t Fs[] = {1, 3, 17, 129, 1000, 3072};
    for (size_t a = 0; a < COUNT(Ts); a++)
        for (size_t b = 0; b < COUNT(Fs); b++) {
            int64_t T = Ts[a], F = Fs[b];
            size_t len = (size_t)(T * F);
            float *g = malloc(len * 4), *u = malloc(len * 4), *ref = malloc(len * 4),
                  *fast = malloc(len * 4);
            og_rng_fill(r, g, len, -20.0f, 20.0f);
            og_rng_fill(r, u, len, -3.0f, 3.0f);
            og_poison(ref, len);
            CHECK_OK(og_swiglu_ref(g, u, T, F, ref));
            double worst = 0; /* double silu: expf, 1 +, divide, multiply: <= 5 u */
            for (size_t i = 0; i < len; i++) {
                double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                double q = isnan(ref[i]) ? INFINITY : fabs(ref[i] - want) / (6 * U * fabs(want) + 1e-37);
                if (q > worst) worst = q;
            }
            CHECK_MSG(worst <= 1, "swiglu ref vs double T=%lld F=%lld: %.3g", (long long)T,
                      (long long)F, worst);
            og_poison(fast, len);
            CHECK_OK(og_swiglu_cpu(pool, g, u, T, F, fast));
            CHECK(og_tol_ratio(fast, ref, len, 1e-37, 2 * U, NULL) <= 1);
            memcpy(fast, g, len * 4); /* out == gate */
            CHECK_OK(og_swiglu_cpu(pool, fast, u, T, F, fast));
            CHECK(og_tol_ratio(fast, ref, len, 1e-37, 2 * U, NULL) <= 1);

            /* add: one f32 rounding of the exact sum, so exact against double */
            og_poison(ref, len);
            CHECK_OK(og_add_ref(g, u, (int64_t)len, ref));
            bool exact = true;
            for (size_t i = 0; i < len; i++) exact &= ref[i] == (float)((double)g[i] + u[i]);
            CHECK(exact);
            og_poison(fast, len);
            CHECK_OK(og_add_cpu(pool, g, u, (int64_t)len, fast));
            CHECK(bits_equal_f32(fast, ref, len));
            CHECK_OK(og_add_cpu(pool, g, u, (int64_t)len, u)); /* out == b */
            CHECK(bits_equal_f32(u, ref, len));
            free(g);
            free(u);
            free(ref);
            free(fast);
        }
    float buf[8] = {0};
    CHECK_STATUS(og_add_cpu(pool, buf, buf + 4, 4, buf + 1), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_swiglu_ref(buf, buf, 0, 4, buf), OG_ERR_INVALID_ARGUMENT);
}

/* ---- argmax ---- */

static void argmax_all(const float *x, int64_t V, int64_t want, const char *what) {
    int64_t got = -1;
    CHECK_OK(og_argmax_ref(x, V, &got));
    CHECK_MSG(got == want, "argmax ref %s: %lld, want %lld", what, (long long)got,
              (long long)want);
    FOR_EACH_ISA(isa) {
        og_cpu_isa_limit((og_cpu_isa)isa);
        got = -1;
        CHECK_OK(og_argmax_cpu(x, V, &got));
        CHECK_MSG(got == want, "argmax %s %s: %lld, want %lld", og_cpu_isa_name((og_cpu_isa)isa),
                  what, (long long)got, (long long)want);
    }
    og_cpu_isa_limit(OG_CPU_ISA_AVX512);
}

static void test_argmax(og_rng *r) {
    og_test_section("argmax");
    int64_t V = 151936;
    float *x = malloc((size_t)V * 4);
    og_rng_fill(r, x, (size_t)V, -10.0f, 10.0f);
    x[V - 1] = 50.0f;
    argmax_all(x, V, V - 1, "max last");
    x[900] = 50.0f;
    x[5] = 50.0f;
    argmax_all(x, V, 5, "tie -> first");
    x[777] = NAN;
    x[99999] = NAN;
    argmax_all(x, V, 777, "first NaN");
    for (int64_t i = 0; i < 37; i++) x[i] = -INFINITY;
    argmax_all(x, 37, 0, "all -inf");
    x[0] = -0.0f;
    x[1] = 0.0f;
    argmax_all(x, 2, 0, "-0 == +0");
    /* random odd lengths: the maximum found by a plain scan */
    for (int64_t n = 1; n < 300; n += 7) {
        og_rng_fill(r, x, (size_t)n, -1.0f, 1.0f);
        int64_t want = 0;
        for (int64_t i = 1; i < n; i++)
            if (x[i] > x[want]) want = i;
        argmax_all(x, n, want, "random");
    }
    int64_t idx;
    CHECK_STATUS(og_argmax_cpu(x, 0, &idx), OG_ERR_INVALID_ARGUMENT);
    free(x);
}

int main(void) {
    og_threadpool *pool = og_threadpool_create(2);
    CHECK(pool != NULL);
    og_rng r = og_rng_seed(2024);
    test_convert(&r);
    test_embed(pool, &r);
    test_embed_quant(pool, &r);
    test_rms_norm(pool, &r);
    test_head_rms_norm(pool, &r);
    test_rope_table();
    test_rope(pool, &r);
    test_swiglu_add(pool, &r);
    test_argmax(&r);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
