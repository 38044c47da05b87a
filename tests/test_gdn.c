/* The hybrid layers' CPU kernels (kernels/gdn.h) against their references:
 * the gated delta rule's fast chunked and recurrent forms against the
 * double-precision recurrent oracle at odd sizes and at token counts around
 * the 64-token chunk edge, a step cut into pieces (the state carried through
 * state_in / state_out) against the whole step, strong and weak decays; the
 * causal convolution with and without a carried state; the gated norm and
 * the sigmoid gate. Outputs are poisoned before every run.
 * Letters as in gdn.h. */
#include "harness.h"
#include "kernels/gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof *(a))

/* ---- gated delta rule ---- */

typedef struct gdn_case {
    int64_t Hk, Hv, Dk, Dv;
    float A_hi; /* A = exp(A_log) drawn from [0.02, A_hi]: how fast heads forget */
} gdn_case;

typedef struct gdn_inputs {
    float *qkv, *a, *b, *A_log, *dt_bias, *state0;
    int64_t T, W;
} gdn_inputs;

static void inputs_make(og_rng *r, const gdn_case *c, int64_t T, gdn_inputs *in) {
    in->T = T;
    in->W = 2 * c->Hk * c->Dk + c->Hv * c->Dv;
    in->qkv = malloc((size_t)(T * in->W) * sizeof(float));
    in->a = malloc((size_t)(T * c->Hv) * sizeof(float));
    in->b = malloc((size_t)(T * c->Hv) * sizeof(float));
    in->A_log = malloc((size_t)c->Hv * sizeof(float));
    in->dt_bias = malloc((size_t)c->Hv * sizeof(float));
    in->state0 = malloc((size_t)(c->Hv * c->Dk * c->Dv) * sizeof(float));
    og_rng_fill(r, in->qkv, (size_t)(T * in->W), -1.0f, 1.0f);
    og_rng_fill(r, in->a, (size_t)(T * c->Hv), -2.0f, 2.0f);
    og_rng_fill(r, in->b, (size_t)(T * c->Hv), -3.0f, 3.0f);
    for (int64_t h = 0; h < c->Hv; h++) {
        in->A_log[h] = logf(og_rng_uniform(r, 0.02f, c->A_hi));
        in->dt_bias[h] = og_rng_uniform(r, -0.5f, 0.5f);
    }
    og_rng_fill(r, in->state0, (size_t)(c->Hv * c->Dk * c->Dv), -0.5f, 0.5f);
}

static void inputs_free(gdn_inputs *in) {
    free(in->qkv), free(in->a), free(in->b), free(in->A_log), free(in->dt_bias), free(in->state0);
}

/* Args for tokens [t0, t0 + T) of in. */
static og_gdn_args args_of(const gdn_case *c, const gdn_inputs *in, int64_t t0, int64_t T, const float *s_in,
                           float *s_out, float *out) {
    return (og_gdn_args){.qkv = in->qkv + t0 * in->W, .a = in->a + t0 * c->Hv, .b = in->b + t0 * c->Hv,
                         .A_log = in->A_log, .dt_bias = in->dt_bias, .A_log_dtype = OG_DTYPE_F32,
                         .dt_bias_dtype = OG_DTYPE_F32, .T = T, .Hk = c->Hk, .Hv = c->Hv, .Dk = c->Dk, .Dv = c->Dv,
                         .state_in = s_in, .state_out = s_out, .out = out + t0 * c->Hv * c->Dv};
}

/* Tolerance: outputs and state entries are O(1) (q, k unit vectors, |v| <=
 * 1, beta < 1, decays <= 1); the f32 forms round every product and sum of
 * Dk or Dv terms (and the chunked form's C x C solve) at 2^-24 relative,
 * errors that the decaying recurrence does not amplify: ~100 roundings of
 * 6e-8 is 6e-6 at most, and 3e-7 is the largest error measured (130
 * tokens, Dk 128). 1e-5 absolute + relative keeps that margin; a term off
 * by 0.1 % already fails it by 30x. */
#define GDN_ATOL 1e-5
#define GDN_RTOL 1e-5

static void test_gdn_forms(og_rng *r) {
    og_test_section("gated_delta_net: chunked and recurrent forms against the double oracle");
    static const gdn_case cases[] = {
        {1, 1, 1, 1, 0.5f}, {2, 4, 16, 24, 0.5f}, {3, 3, 7, 5, 0.5f}, {1, 2, 17, 9, 16.0f}, {2, 2, 128, 128, 0.5f},
    };
    static const int64_t Ts[] = {1, 2, 3, 17, 63, 64, 65, 129, 130};
    for (size_t ci = 0; ci < COUNT(cases); ci++) {
        const gdn_case *c = &cases[ci];
        for (size_t ti = 0; ti < COUNT(Ts); ti++) {
            const int64_t T = Ts[ti];
            if (c->Dk == 128 && T > 65) continue; /* keeps the test short */
            gdn_inputs in;
            inputs_make(r, c, T, &in);
            const size_t on = (size_t)(T * c->Hv * c->Dv), sn = (size_t)(c->Hv * c->Dk * c->Dv);
            float *ref = malloc(on * sizeof(float)), *out = malloc(on * sizeof(float));
            float *sref = malloc(sn * sizeof(float)), *sout = malloc(sn * sizeof(float));
            for (int from_zero = 0; from_zero < 2; from_zero++) {
                const float *s0 = from_zero ? NULL : in.state0;
                og_gdn_args ra = args_of(c, &in, 0, T, s0, sref, ref);
                CHECK_OK(og_gated_delta_net_ref(&ra));
                for (int form = 0; form < 2; form++) {
                    og_poison(out, on);
                    og_poison(sout, sn);
                    og_gdn_args fa = args_of(c, &in, 0, T, s0, sout, out);
                    CHECK_OK(form ? og_gated_delta_net_recurrent_cpu(NULL, &fa) : og_gated_delta_net_cpu(NULL, &fa));
                    const double ro = og_tol_ratio(out, ref, on, GDN_ATOL, GDN_RTOL, NULL);
                    const double rs = og_tol_ratio(sout, sref, sn, GDN_ATOL, GDN_RTOL, NULL);
                    CHECK_MSG(ro <= 1 && rs <= 1,
                              "%s form, Hk %lld Hv %lld Dk %lld Dv %lld, T %lld, %s state: out %.3g, state %.3g",
                              form ? "recurrent" : "fast", (long long)c->Hk, (long long)c->Hv, (long long)c->Dk,
                              (long long)c->Dv, (long long)T, from_zero ? "zero" : "given", ro, rs);
                }
            }
            free(ref), free(out), free(sref), free(sout);
            inputs_free(&in);
        }
    }
}

static void test_gdn_pieces(og_rng *r) {
    og_test_section("gated_delta_net: a step cut into pieces carries the state exactly as one step");
    const gdn_case c = {2, 4, 16, 24, 0.5f};
    const int64_t T = 160;
    static const int64_t cuts[][5] = {{1, 63, 2, 70, 24}, {64, 64, 32, 0, 0}, {100, 60, 0, 0, 0}, {7, 7, 7, 139, 0}};
    gdn_inputs in;
    inputs_make(r, &c, T, &in);
    const size_t on = (size_t)(T * c.Hv * c.Dv), sn = (size_t)(c.Hv * c.Dk * c.Dv);
    float *ref = malloc(on * sizeof(float)), *out = malloc(on * sizeof(float));
    float *sref = malloc(sn * sizeof(float)), *s[2] = {malloc(sn * sizeof(float)), malloc(sn * sizeof(float))};
    og_gdn_args ra = args_of(&c, &in, 0, T, NULL, sref, ref);
    CHECK_OK(og_gated_delta_net_ref(&ra));
    for (size_t k = 0; k < COUNT(cuts); k++) {
        og_poison(out, on);
        int64_t t0 = 0;
        int cur = 0;
        for (int p = 0; p < 5 && cuts[k][p]; p++) {
            og_gdn_args fa = args_of(&c, &in, t0, cuts[k][p], t0 ? s[cur] : NULL, s[cur ^ 1], out);
            CHECK_OK(og_gated_delta_net_cpu(NULL, &fa));
            cur ^= 1; /* the step's commit: the copy it wrote is the state now */
            t0 += cuts[k][p];
        }
        CHECK(t0 == T);
        const double ro = og_tol_ratio(out, ref, on, GDN_ATOL, GDN_RTOL, NULL);
        const double rs = og_tol_ratio(s[cur], sref, sn, GDN_ATOL, GDN_RTOL, NULL);
        CHECK_MSG(ro <= 1 && rs <= 1, "cut %zu: out %.3g, state %.3g", k, ro, rs);
    }
    free(ref), free(out), free(sref), free(s[0]), free(s[1]);
    inputs_free(&in);
}

static void test_gdn_refusals(void) {
    og_test_section("gated_delta_net: refusals");
    float buf[64] = {0}, st[64], out[64];
    og_gdn_args a = {.qkv = buf, .a = buf, .b = buf, .A_log = buf, .dt_bias = buf, .A_log_dtype = OG_DTYPE_F32,
                     .dt_bias_dtype = OG_DTYPE_F32, .T = 1, .Hk = 2, .Hv = 3, .Dk = 2, .Dv = 2, .state_out = st,
                     .out = out};
    CHECK_STATUS(og_gated_delta_net_ref(&a), OG_ERR_INVALID_ARGUMENT); /* Hv % Hk */
    CHECK_STATUS(og_gated_delta_net_cpu(NULL, &a), OG_ERR_INVALID_ARGUMENT);
    a.Hv = 2;
    a.state_in = st; /* in place */
    CHECK_STATUS(og_gated_delta_net_cpu(NULL, &a), OG_ERR_INVALID_ARGUMENT);
    a.state_in = NULL;
    a.A_log_dtype = OG_DTYPE_I32;
    CHECK_STATUS(og_gated_delta_net_cpu(NULL, &a), OG_ERR_UNSUPPORTED);
}

/* ---- causal_conv1d ---- */

static void test_conv(og_rng *r) {
    og_test_section("causal_conv1d: fast against reference, pieces against whole");
    static const int64_t Cs[] = {1, 3, 129, 300}, Ks[] = {2, 4, 5}, Ts[] = {1, 2, 3, 17, 64};
    for (size_t ci = 0; ci < COUNT(Cs); ci++)
        for (size_t ki = 0; ki < COUNT(Ks); ki++)
            for (size_t ti = 0; ti < COUNT(Ts); ti++) {
                const int64_t C = Cs[ci], K = Ks[ki], T = Ts[ti];
                float *x = malloc((size_t)(T * C) * sizeof(float)), *w = malloc((size_t)(C * K) * sizeof(float));
                float *s0 = malloc((size_t)((K - 1) * C) * sizeof(float));
                float *ref = malloc((size_t)(T * C) * sizeof(float)), *out = malloc((size_t)(T * C) * sizeof(float));
                float *sr = malloc((size_t)((K - 1) * C) * sizeof(float)), *so = malloc((size_t)((K - 1) * C) * sizeof(float));
                og_rng_fill(r, x, (size_t)(T * C), -2.0f, 2.0f);
                og_rng_fill(r, w, (size_t)(C * K), -1.0f, 1.0f);
                og_rng_fill(r, s0, (size_t)((K - 1) * C), -2.0f, 2.0f);
                for (int given = 0; given < 2; given++) {
                    CHECK_OK(og_causal_conv1d_ref(x, w, OG_DTYPE_F32, given ? s0 : NULL, sr, T, C, K, ref));
                    og_poison(out, (size_t)(T * C));
                    og_poison(so, (size_t)((K - 1) * C));
                    CHECK_OK(og_causal_conv1d_cpu(NULL, x, w, OG_DTYPE_F32, given ? s0 : NULL, so, T, C, K, out));
                    /* sums of K terms in the same order: equal but for contraction into fused multiply-adds */
                    const double ro = og_tol_ratio(out, ref, (size_t)(T * C), 1e-6, 1e-5, NULL);
                    CHECK_MSG(ro <= 1, "C %lld K %lld T %lld: %.3g", (long long)C, (long long)K, (long long)T, ro);
                    CHECK(memcmp(so, sr, (size_t)((K - 1) * C) * sizeof(float)) == 0);
                }
                /* the state: x's last K - 1 rows, the older state's rows before them when T < K - 1 */
                CHECK_OK(og_causal_conv1d_ref(x, w, OG_DTYPE_F32, s0, sr, T, C, K, ref));
                for (int64_t row = 0; row < K - 1; row++) {
                    const int64_t i = T + row; /* row of [state ; x] */
                    const float *want = i < K - 1 ? s0 + i * C : x + (i - (K - 1)) * C;
                    CHECK(memcmp(sr + row * C, want, (size_t)C * sizeof(float)) == 0);
                }
                /* one step of T against T steps of one token */
                if (T > 1) {
                    float *piece = malloc((size_t)(T * C) * sizeof(float));
                    float *st[2] = {malloc((size_t)((K - 1) * C) * sizeof(float)), malloc((size_t)((K - 1) * C) * sizeof(float))};
                    memcpy(st[0], s0, (size_t)((K - 1) * C) * sizeof(float));
                    CHECK_OK(og_causal_conv1d_cpu(NULL, x, w, OG_DTYPE_F32, s0, so, T, C, K, out));
                    for (int64_t t = 0; t < T; t++)
                        CHECK_OK(og_causal_conv1d_cpu(NULL, x + t * C, w, OG_DTYPE_F32, st[t & 1], st[(t + 1) & 1], 1, C,
                                                      K, piece + t * C));
                    CHECK(og_tol_ratio(piece, out, (size_t)(T * C), 1e-6, 1e-5, NULL) <= 1);
                    CHECK(memcmp(st[T & 1], so, (size_t)((K - 1) * C) * sizeof(float)) == 0);
                    free(piece), free(st[0]), free(st[1]);
                }
                free(x), free(w), free(s0), free(ref), free(out), free(sr), free(so);
            }
    /* hand-checked: K = 2, C = 1, weights (0.5, 2), state 1, x = (1, -1):
     * pre-activations 0.5 * 1 + 2 * 1 = 2.5 and 0.5 * 1 + 2 * -1 = -1.5 */
    const float x[2] = {1, -1}, w[2] = {0.5f, 2}, s0[1] = {1};
    float out[2], so[1];
    CHECK_OK(og_causal_conv1d_cpu(NULL, x, w, OG_DTYPE_F32, s0, so, 2, 1, 2, out));
    CHECK(fabs(out[0] - 2.5 / (1 + exp(-2.5))) < 1e-6 && fabs(out[1] - -1.5 / (1 + exp(1.5))) < 1e-6 && so[0] == -1);
}

/* ---- rms_norm_gated, sigmoid_mul ---- */

static void test_norm_gate(og_rng *r) {
    og_test_section("rms_norm_gated and sigmoid_mul");
    static const int64_t Ts[] = {1, 3, 17}, ns[] = {1, 4}, Ds[] = {1, 24, 129};
    for (size_t a = 0; a < COUNT(Ts); a++)
        for (size_t b = 0; b < COUNT(ns); b++)
            for (size_t d = 0; d < COUNT(Ds); d++) {
                const int64_t T = Ts[a], n = ns[b], D = Ds[d], N = T * n * D;
                float *x = malloc((size_t)N * sizeof(float)), *z = malloc((size_t)N * sizeof(float));
                float *w = malloc((size_t)D * sizeof(float)), *ref = malloc((size_t)N * sizeof(float));
                float *out = malloc((size_t)N * sizeof(float));
                og_rng_fill(r, x, (size_t)N, -3, 3);
                og_rng_fill(r, z, (size_t)N, -3, 3);
                og_rng_fill(r, w, (size_t)D, 0.5f, 1.5f);
                CHECK_OK(og_rms_norm_gated_ref(x, z, w, OG_DTYPE_F32, T, n, D, 1e-6f, ref));
                og_poison(out, (size_t)N);
                CHECK_OK(og_rms_norm_gated_cpu(NULL, x, z, w, OG_DTYPE_F32, T, n, D, 1e-6f, out));
                CHECK(og_tol_ratio(out, ref, (size_t)N, 1e-6, 1e-5, NULL) <= 1);
                /* against the formula in double */
                double worst = 0;
                for (int64_t rr = 0; rr < T * n; rr++) {
                    double ss = 0;
                    for (int64_t i = 0; i < D; i++) ss += (double)x[rr * D + i] * x[rr * D + i];
                    const double inv = 1 / sqrt(ss / (double)D + 1e-6);
                    for (int64_t i = 0; i < D; i++) {
                        const double g = z[rr * D + i], want = w[i] * x[rr * D + i] * inv * g / (1 + exp(-g));
                        const double e = fabs(out[rr * D + i] - want) / (1e-5 + 1e-5 * fabs(want));
                        if (e > worst) worst = e;
                    }
                }
                CHECK_MSG(worst <= 1, "T %lld n %lld D %lld: %.3g", (long long)T, (long long)n, (long long)D, worst);
                CHECK_OK(og_sigmoid_mul_ref(x, z, N, ref));
                og_poison(out, (size_t)N);
                CHECK_OK(og_sigmoid_mul_cpu(NULL, x, z, N, out));
                CHECK(memcmp(out, ref, (size_t)N * sizeof(float)) == 0);
                for (int64_t i = 0; i < N; i++)
                    if (fabs(out[i] - x[i] / (1 + exp(-(double)z[i]))) > 1e-6 * (1 + fabs(x[i]))) {
                        CHECK_MSG(0, "sigmoid_mul element %lld", (long long)i);
                        break;
                    }
                free(x), free(z), free(w), free(ref), free(out);
            }
}

int main(void) {
    og_rng r = og_rng_seed(28);
    test_gdn_forms(&r);
    test_gdn_pieces(&r);
    test_gdn_refusals();
    test_conv(&r);
    test_norm_gate(&r);
    return og_test_finish();
}
