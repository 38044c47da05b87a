/* Reference kernels of the hybrid layers (gdn.h): plain loops, one thread,
 * written to be read. The gated delta rule's reference runs the recurrent
 * form in double precision, so that it is an independent oracle for both
 * forms of the fast version (which work in f32). Letters as in gdn.h. */
#include "kernels/gdn.h"
#include "kernels/gdn_internal.h"
#include "kernels/ops_internal.h"

#include <math.h>

/* ---- argument checks shared with gdn_cpu.c ---- */

og_status og_gdn_check_conv(const char *op, const float *x, const void *weight, og_dtype wdt, const float *state_in,
                            const float *state_out, int64_t T, int64_t C, int64_t K, const float *out) {
    OG_TRY(og_ops_check_ptr(x, op, "x"));
    OG_TRY(og_ops_check_ptr(weight, op, "weight"));
    OG_TRY(og_ops_check_ptr(state_out, op, "state_out"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_dim(T, op, "T"));
    OG_TRY(og_ops_check_dim(C, op, "C"));
    OG_TRY(og_ops_check_weight_dtype(wdt, op, "weight"));
    if (K < 2 || K > OG_GDN_MAX_KERNEL)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: kernel size K = %lld must be in [2, %d]", op, (long long)K,
                            OG_GDN_MAX_KERNEL);
    size_t xb, sb;
    OG_TRY(og_ops_check_size(T, C, sizeof(float), op, "x", &xb));
    OG_TRY(og_ops_check_size(K - 1, C, sizeof(float), op, "state", &sb));
    OG_TRY(og_ops_check_disjoint(out, xb, x, xb, op, "x"));
    OG_TRY(og_ops_check_disjoint(state_out, sb, x, xb, op, "x"));
    OG_TRY(og_ops_check_disjoint(state_out, sb, out, xb, op, "out"));
    if (state_in) {
        OG_TRY(og_ops_check_disjoint(state_out, sb, state_in, sb, op, "state_in"));
        OG_TRY(og_ops_check_disjoint(out, xb, state_in, sb, op, "state_in"));
    }
    return OG_OK;
}

og_status og_gdn_check(const char *op, const og_gdn_args *a) {
    OG_TRY(og_ops_check_ptr(a, op, "args"));
    OG_TRY(og_ops_check_ptr(a->qkv, op, "qkv"));
    OG_TRY(og_ops_check_ptr(a->a, op, "a"));
    OG_TRY(og_ops_check_ptr(a->b, op, "b"));
    OG_TRY(og_ops_check_ptr(a->A_log, op, "A_log"));
    OG_TRY(og_ops_check_ptr(a->dt_bias, op, "dt_bias"));
    OG_TRY(og_ops_check_ptr(a->state_out, op, "state_out"));
    OG_TRY(og_ops_check_ptr(a->out, op, "out"));
    OG_TRY(og_ops_check_dim(a->T, op, "T"));
    OG_TRY(og_ops_check_weight_dtype(a->A_log_dtype, op, "A_log"));
    OG_TRY(og_ops_check_weight_dtype(a->dt_bias_dtype, op, "dt_bias"));
    if (a->Hk < 1 || a->Hv < 1 || a->Hv % a->Hk || a->Dk < 1 || a->Dv < 1 || a->Dk > OG_GDN_MAX_HEAD_DIM ||
        a->Dv > OG_GDN_MAX_HEAD_DIM || a->Hv > OG_GDN_MAX_HEADS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: heads Hk %lld, Hv %lld (a multiple of Hk, at most %d) and dims Dk %lld, Dv %lld (1 to "
                            "%d) are out of range",
                            op, (long long)a->Hk, (long long)a->Hv, OG_GDN_MAX_HEADS, (long long)a->Dk,
                            (long long)a->Dv, OG_GDN_MAX_HEAD_DIM);
    size_t sb, ob, ib;
    OG_TRY(og_ops_check_size(a->Hv * a->Dk, a->Dv, sizeof(float), op, "state", &sb));
    OG_TRY(og_ops_check_size(a->T, a->Hv * a->Dv, sizeof(float), op, "out", &ob));
    OG_TRY(og_ops_check_size(a->T, 2 * a->Hk * a->Dk + a->Hv * a->Dv, sizeof(float), op, "qkv", &ib));
    OG_TRY(og_ops_check_disjoint(a->out, ob, a->qkv, ib, op, "qkv"));
    OG_TRY(og_ops_check_disjoint(a->state_out, sb, a->out, ob, op, "out"));
    OG_TRY(og_ops_check_disjoint(a->state_out, sb, a->qkv, ib, op, "qkv"));
    if (a->state_in) OG_TRY(og_ops_check_disjoint(a->state_out, sb, a->state_in, sb, op, "state_in"));
    return OG_OK;
}

og_status og_gdn_check_norm(const char *op, const float *x, const float *z, const void *weight, og_dtype wdt,
                            int64_t T, int64_t n, int64_t D, float eps, const float *out) {
    OG_TRY(og_ops_check_ptr(x, op, "x"));
    OG_TRY(og_ops_check_ptr(z, op, "z"));
    OG_TRY(og_ops_check_ptr(weight, op, "weight"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_dim(T, op, "T"));
    OG_TRY(og_ops_check_dim(n, op, "n"));
    OG_TRY(og_ops_check_dim(D, op, "D"));
    OG_TRY(og_ops_check_weight_dtype(wdt, op, "weight"));
    if (!(eps > 0.0f) || isinf(eps))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps %g must be finite and > 0", op, (double)eps);
    size_t b;
    OG_TRY(og_ops_check_size(T, n * D, sizeof(float), op, "x", &b));
    OG_TRY(og_ops_check_alias(out, x, b, op, "x"));
    OG_TRY(og_ops_check_alias(out, z, b, op, "z"));
    return OG_OK;
}

/* ---- shared scalar functions ---- */

/* Chooses the value torch.nn.functional.softplus gives (threshold 20). */
float og_gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

float og_gdn_decay_log(const og_gdn_args *a, int64_t t, int64_t h) {
    const float A = expf(og_load_f32(a->A_log, a->A_log_dtype, (size_t)h));
    const float dt = og_load_f32(a->dt_bias, a->dt_bias_dtype, (size_t)h);
    return -A * og_gdn_softplus(a->a[t * a->Hv + h] + dt);
}

float og_gdn_beta(const og_gdn_args *a, int64_t t, int64_t h) { return 1.0f / (1.0f + expf(-a->b[t * a->Hv + h])); }

/* ---- causal_conv1d ---- */

og_status og_causal_conv1d_ref(const float *x, const void *weight, og_dtype wdt, const float *state_in,
                               float *state_out, int64_t T, int64_t C, int64_t K, float *out) {
    OG_TRY(og_gdn_check_conv("causal_conv1d", x, weight, wdt, state_in, state_out, T, C, K, out));
    /* xs row i (i in [0, K - 1 + T)): state_in row i, then x row i - (K - 1) */
    float *xs = og_malloc((size_t)(K - 1 + T) * (size_t)C * sizeof *xs);
    if (!xs) return og_set_error(OG_ERR_OUT_OF_MEMORY, "causal_conv1d: no memory");
    for (int64_t i = 0; i < K - 1; i++)
        for (int64_t c = 0; c < C; c++) xs[i * C + c] = state_in ? state_in[i * C + c] : 0.0f;
    memcpy(xs + (K - 1) * C, x, (size_t)(T * C) * sizeof *xs);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) acc += og_load_f32(weight, wdt, (size_t)(c * K + j)) * xs[(t + j) * C + c];
            out[t * C + c] = acc / (1.0f + expf(-acc));
        }
    memcpy(state_out, xs + T * C, (size_t)((K - 1) * C) * sizeof *xs);
    og_free(xs);
    return OG_OK;
}

/* ---- gated_delta_net, recurrent form in double ---- */

og_status og_gated_delta_net_ref(const og_gdn_args *a) {
    OG_TRY(og_gdn_check("gated_delta_net", a));
    const int64_t Hk = a->Hk, Hv = a->Hv, Dk = a->Dk, Dv = a->Dv, T = a->T, W = 2 * Hk * Dk + Hv * Dv;
    double *S = og_malloc((size_t)(Dk * Dv) * sizeof *S); /* [Dk, Dv] one head at a time */
    double *q = og_malloc((size_t)Dk * sizeof *q), *k = og_malloc((size_t)Dk * sizeof *k);
    double *u = og_malloc((size_t)Dv * sizeof *u);
    if (!S || !q || !k || !u) {
        og_free(S), og_free(q), og_free(k), og_free(u);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gated_delta_net: no memory");
    }
    for (int64_t h = 0; h < Hv; h++) {
        const int64_t kh = h / (Hv / Hk);
        for (int64_t i = 0; i < Dk * Dv; i++) S[i] = a->state_in ? a->state_in[h * Dk * Dv + i] : 0.0;
        for (int64_t t = 0; t < T; t++) {
            const float *row = a->qkv + t * W;
            const float *qs = row + kh * Dk, *ks = row + Hk * Dk + kh * Dk, *vs = row + 2 * Hk * Dk + h * Dv;
            double qq = 0, kk = 0;
            for (int64_t i = 0; i < Dk; i++) {
                qq += (double)qs[i] * qs[i];
                kk += (double)ks[i] * ks[i];
            }
            const double qn = 1.0 / sqrt(qq + 1e-6) / sqrt((double)Dk), kn = 1.0 / sqrt(kk + 1e-6);
            for (int64_t i = 0; i < Dk; i++) {
                q[i] = qs[i] * qn;
                k[i] = ks[i] * kn;
            }
            const double A = exp((double)og_load_f32(a->A_log, a->A_log_dtype, (size_t)h));
            const double x = (double)a->a[t * Hv + h] + og_load_f32(a->dt_bias, a->dt_bias_dtype, (size_t)h);
            const double g = -A * (x > 20.0 ? x : log1p(exp(x)));
            const double beta = 1.0 / (1.0 + exp(-(double)a->b[t * Hv + h])), decay = exp(g);
            for (int64_t i = 0; i < Dk * Dv; i++) S[i] *= decay;
            for (int64_t j = 0; j < Dv; j++) {
                double kv = 0;
                for (int64_t i = 0; i < Dk; i++) kv += S[i * Dv + j] * k[i];
                u[j] = beta * (vs[j] - kv);
            }
            for (int64_t i = 0; i < Dk; i++)
                for (int64_t j = 0; j < Dv; j++) S[i * Dv + j] += k[i] * u[j];
            for (int64_t j = 0; j < Dv; j++) {
                double o = 0;
                for (int64_t i = 0; i < Dk; i++) o += S[i * Dv + j] * q[i];
                a->out[t * Hv * Dv + h * Dv + j] = (float)o;
            }
        }
        for (int64_t i = 0; i < Dk * Dv; i++) a->state_out[h * Dk * Dv + i] = (float)S[i];
    }
    og_free(S), og_free(q), og_free(k), og_free(u);
    return OG_OK;
}

/* ---- rms_norm_gated, sigmoid_mul ---- */

og_status og_rms_norm_gated_ref(const float *x, const float *z, const void *weight, og_dtype wdt, int64_t T, int64_t n,
                                int64_t D, float eps, float *out) {
    OG_TRY(og_gdn_check_norm("rms_norm_gated", x, z, weight, wdt, T, n, D, eps, out));
    for (int64_t r = 0; r < T * n; r++) {
        const float *xr = x + r * D, *zr = z + r * D;
        float *o = out + r * D;
        float ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; i++) {
            const float g = zr[i];
            o[i] = og_load_f32(weight, wdt, (size_t)i) * (xr[i] * inv) * (g / (1.0f + expf(-g)));
        }
    }
    return OG_OK;
}

og_status og_sigmoid_mul_ref(const float *x, const float *gate, int64_t n, float *out) {
    OG_TRY(og_ops_check_binary("sigmoid_mul", x, "x", gate, "gate", 1, n, out));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
    return OG_OK;
}
