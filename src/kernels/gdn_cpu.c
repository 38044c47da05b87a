/* Fast CPU kernels of the hybrid layers (gdn.h). Letters as there; C also
 * names the tokens of one chunk (at most OG_GDN_CHUNK) where it is a size.
 *
 * gated_delta_net runs one task per value head (a head's state, Dk x Dv
 * floats, stays in that thread's caches for the whole step):
 *  - recurrent form (decode): per token two passes over the state, the first
 *    reading S^T k of the decayed state, the second writing the updated
 *    state and reading S^T q from it, the inner loops over Dv contiguous;
 *  - chunked form (prefill): per chunk of C tokens, with G_t the running sum
 *    of the chunk's log decays and S the state before the chunk,
 *      u_t = beta_t (v_t - e^{G_t} S^T k_t) - beta_t sum_{s<t} e^{G_t - G_s} (k_t.k_s) u_s
 *      out_t = e^{G_t} S^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t.k_s) u_s
 *      S <- e^{G_{C-1}} S + sum_t e^{G_{C-1} - G_t} k_t u_t^T
 *    (the triangular system of transformers' chunked form, solved by forward
 *    substitution), so the state is read twice and written once per chunk
 *    instead of per token, and the rest are small products of the chunk's
 *    rows (C x C and C x Dv), held in the thread's scratch.
 * The decays are at most 1 (g <= 0, G falls along the chunk), so no
 * exponential grows. */
#include "kernels/gdn.h"
#include "kernels/gdn_internal.h"
#include "kernels/ops_internal.h"

#include <math.h>

/* ---- causal_conv1d: tasks of CONV_BLOCK channels ---- */

enum { CONV_BLOCK = 128 };

typedef struct conv_job {
    const float *x;
    const void *w;
    og_dtype wdt;
    const float *state_in;
    float *state_out, *out;
    int64_t T, C, K;
} conv_job;

/* Row i of xs (the state's K - 1 rows, then x's T rows), NULL for a zero row. */
static const float *conv_row(const conv_job *j, int64_t i) {
    if (i >= j->K - 1) return j->x + (i - (j->K - 1)) * j->C;
    return j->state_in ? j->state_in + i * j->C : NULL;
}

static void conv_task(void *ctx, int64_t task, int thread) {
    const conv_job *j = ctx;
    const int64_t c0 = task * CONV_BLOCK, n = j->C - c0 < CONV_BLOCK ? j->C - c0 : CONV_BLOCK, K = j->K;
    float w[OG_GDN_MAX_KERNEL][CONV_BLOCK]; /* [K, n]: tap j of channel c0 + c */
    float acc[CONV_BLOCK];
    for (int64_t c = 0; c < n; c++)
        for (int64_t k = 0; k < K; k++) w[k][c] = og_load_f32(j->w, j->wdt, (size_t)((c0 + c) * K + k));
    for (int64_t t = 0; t < j->T; t++) {
        for (int64_t c = 0; c < n; c++) acc[c] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float *r = conv_row(j, t + k);
            if (!r) continue;
            r += c0;
            for (int64_t c = 0; c < n; c++) acc[c] += w[k][c] * r[c];
        }
        float *o = j->out + t * j->C + c0;
        for (int64_t c = 0; c < n; c++) o[c] = acc[c] / (1.0f + expf(-acc[c]));
    }
    for (int64_t r = 0; r < K - 1; r++) {
        const float *src = conv_row(j, j->T + r);
        float *dst = j->state_out + r * j->C + c0;
        if (src) memcpy(dst, src + c0, (size_t)n * sizeof *dst);
        else memset(dst, 0, (size_t)n * sizeof *dst);
    }
}

og_status og_causal_conv1d_cpu(og_threadpool *pool, const float *x, const void *weight, og_dtype wdt,
                               const float *state_in, float *state_out, int64_t T, int64_t C, int64_t K, float *out) {
    OG_TRY(og_gdn_check_conv("causal_conv1d", x, weight, wdt, state_in, state_out, T, C, K, out));
    conv_job j = {x, weight, wdt, state_in, state_out, out, T, C, K};
    og_parallel_for(pool, (C + CONV_BLOCK - 1) / CONV_BLOCK, conv_task, &j);
    return OG_OK;
}

/* ---- gated_delta_net ---- */

typedef struct gdn_job {
    const og_gdn_args *a;
    int64_t W; /* qkv row width */
    bool chunked;
} gdn_job;

/* q and k of token t for value head h: L2-normalized (q also by 1/sqrt(Dk)). */
static void load_qk(const og_gdn_args *a, int64_t W, int64_t t, int64_t h, float *q, float *k) {
    const int64_t Dk = a->Dk, kh = h / (a->Hv / a->Hk);
    const float *row = a->qkv + t * W, *qs = row + kh * Dk, *ks = row + a->Hk * Dk + kh * Dk;
    float qq = 0.0f, kk = 0.0f;
    for (int64_t i = 0; i < Dk; i++) {
        qq += qs[i] * qs[i];
        kk += ks[i] * ks[i];
    }
    const float qn = 1.0f / sqrtf(qq + 1e-6f), kn = 1.0f / sqrtf(kk + 1e-6f), scale = 1.0f / sqrtf((float)Dk);
    for (int64_t i = 0; i < Dk; i++) {
        q[i] = qs[i] * qn * scale;
        k[i] = ks[i] * kn;
    }
}

static const float *value_of(const og_gdn_args *a, int64_t W, int64_t t, int64_t h) {
    return a->qkv + t * W + 2 * a->Hk * a->Dk + h * a->Dv;
}

/* The recurrent form for head h over all T tokens. */
static void recurrent_head(const og_gdn_args *a, int64_t W, int64_t h) {
    const int64_t Dk = a->Dk, Dv = a->Dv;
    float q[OG_GDN_MAX_HEAD_DIM], k[OG_GDN_MAX_HEAD_DIM], u[OG_GDN_MAX_HEAD_DIM];
    const float *S_in = a->state_in ? a->state_in + h * Dk * Dv : NULL;
    float *S = a->state_out + h * Dk * Dv;
    for (int64_t t = 0; t < a->T; t++) {
        load_qk(a, W, t, h, q, k);
        const float e = expf(og_gdn_decay_log(a, t, h)), beta = og_gdn_beta(a, t, h);
        const float *src = t == 0 ? S_in : S; /* NULL: the zero state */
        const float *v = value_of(a, W, t, h);
        for (int64_t j = 0; j < Dv; j++) u[j] = 0.0f;
        if (src)
            for (int64_t i = 0; i < Dk; i++) {
                const float *sr = src + i * Dv, ki = k[i];
                for (int64_t j = 0; j < Dv; j++) u[j] += (sr[j] * e) * ki;
            }
        for (int64_t j = 0; j < Dv; j++) u[j] = (v[j] - u[j]) * beta;
        float *o = a->out + t * a->Hv * Dv + h * Dv;
        for (int64_t j = 0; j < Dv; j++) o[j] = 0.0f;
        for (int64_t i = 0; i < Dk; i++) {
            const float *sr = src ? src + i * Dv : NULL;
            float *dr = S + i * Dv;
            const float ki = k[i], qi = q[i];
            if (sr)
                for (int64_t j = 0; j < Dv; j++) dr[j] = sr[j] * e + ki * u[j];
            else
                for (int64_t j = 0; j < Dv; j++) dr[j] = ki * u[j];
            for (int64_t j = 0; j < Dv; j++) o[j] += dr[j] * qi;
        }
    }
}

/* Floats of a chunked task's scratch. */
static size_t chunk_scratch_floats(const og_gdn_args *a) {
    const size_t C = OG_GDN_CHUNK, Dk = (size_t)a->Dk, Dv = (size_t)a->Dv;
    return 2 * C * Dk + 2 * C + 2 * C * C + 2 * C * Dv;
}

/* The chunked form for head h over all T tokens; false when the thread's
 * scratch cannot be had. */
static bool chunked_head(const og_gdn_args *a, int64_t W, int64_t h) {
    const int64_t Dk = a->Dk, Dv = a->Dv, Cm = OG_GDN_CHUNK;
    float *sc = og_scratch(OG_SCRATCH_ATTEND, chunk_scratch_floats(a) * sizeof(float));
    if (!sc) return false;
    float *Q = sc, *Kc = Q + Cm * Dk;       /* [C, Dk] each */
    float *G = Kc + Cm * Dk, *B = G + Cm;    /* [C] each: running log decay, beta */
    float *KK = B + Cm, *QK = KK + Cm * Cm;  /* [C, C] each */
    float *U = QK + Cm * Cm, *P = U + Cm * Dv; /* [C, Dv] each */
    const float *S_in = a->state_in ? a->state_in + h * Dk * Dv : NULL;
    float *S_out = a->state_out + h * Dk * Dv;
    for (int64_t c0 = 0; c0 < a->T; c0 += Cm) {
        const int64_t n = a->T - c0 < Cm ? a->T - c0 : Cm;
        const float *S = c0 == 0 ? S_in : S_out; /* NULL: the zero state */
        for (int64_t t = 0; t < n; t++) {
            load_qk(a, W, c0 + t, h, Q + t * Dk, Kc + t * Dk);
            G[t] = (t ? G[t - 1] : 0.0f) + og_gdn_decay_log(a, c0 + t, h);
            B[t] = og_gdn_beta(a, c0 + t, h);
        }
        /* U_t = S^T k_t, P_t = S^T q_t: the state read once */
        memset(U, 0, (size_t)(n * Dv) * sizeof *U);
        memset(P, 0, (size_t)(n * Dv) * sizeof *P);
        if (S)
            for (int64_t i = 0; i < Dk; i++) {
                const float *sr = S + i * Dv;
                for (int64_t t = 0; t < n; t++) {
                    const float ki = Kc[t * Dk + i], qi = Q[t * Dk + i];
                    float *ur = U + t * Dv, *pr = P + t * Dv;
                    for (int64_t j = 0; j < Dv; j++) {
                        ur[j] += sr[j] * ki;
                        pr[j] += sr[j] * qi;
                    }
                }
            }
        /* the chunk's key and query products */
        for (int64_t t = 0; t < n; t++)
            for (int64_t s = 0; s <= t; s++) {
                const float *kt = Kc + t * Dk, *ks = Kc + s * Dk, *qt = Q + t * Dk;
                float kk = 0.0f, qk = 0.0f;
                for (int64_t i = 0; i < Dk; i++) {
                    kk += kt[i] * ks[i];
                    qk += qt[i] * ks[i];
                }
                KK[t * Cm + s] = kk;
                QK[t * Cm + s] = qk;
            }
        /* u_t by forward substitution, in place of U */
        for (int64_t t = 0; t < n; t++) {
            float *ut = U + t * Dv;
            const float *v = value_of(a, W, c0 + t, h);
            const float et = expf(G[t]);
            for (int64_t j = 0; j < Dv; j++) ut[j] = v[j] - et * ut[j];
            for (int64_t s = 0; s < t; s++) {
                const float f = expf(G[t] - G[s]) * KK[t * Cm + s];
                const float *us = U + s * Dv;
                for (int64_t j = 0; j < Dv; j++) ut[j] -= f * us[j];
            }
            for (int64_t j = 0; j < Dv; j++) ut[j] *= B[t];
        }
        /* out_t */
        for (int64_t t = 0; t < n; t++) {
            float *o = a->out + (c0 + t) * a->Hv * Dv + h * Dv;
            const float et = expf(G[t]);
            const float *pt = P + t * Dv;
            for (int64_t j = 0; j < Dv; j++) o[j] = et * pt[j];
            for (int64_t s = 0; s <= t; s++) {
                const float f = expf(G[t] - G[s]) * QK[t * Cm + s];
                const float *us = U + s * Dv;
                for (int64_t j = 0; j < Dv; j++) o[j] += f * us[j];
            }
        }
        /* the state after the chunk, row by row (in place when S is S_out) */
        const float eL = expf(G[n - 1]);
        for (int64_t t = 0; t < n; t++) G[t] = expf(G[n - 1] - G[t]); /* G now holds the decays to the end */
        for (int64_t i = 0; i < Dk; i++) {
            const float *sr = S ? S + i * Dv : NULL;
            float *dr = S_out + i * Dv;
            if (sr)
                for (int64_t j = 0; j < Dv; j++) dr[j] = eL * sr[j];
            else
                for (int64_t j = 0; j < Dv; j++) dr[j] = 0.0f;
            for (int64_t t = 0; t < n; t++) {
                const float f = G[t] * Kc[t * Dk + i];
                const float *ut = U + t * Dv;
                for (int64_t j = 0; j < Dv; j++) dr[j] += f * ut[j];
            }
        }
    }
    return true;
}

static void gdn_task(void *ctx, int64_t h, int thread) {
    const gdn_job *j = ctx;
    (void)thread;
    if (!j->chunked || !chunked_head(j->a, j->W, h)) recurrent_head(j->a, j->W, h); /* no scratch: the other form */
}

static og_status gdn_run(og_threadpool *pool, const og_gdn_args *a, bool chunked) {
    OG_TRY(og_gdn_check("gated_delta_net", a));
    gdn_job j = {a, 2 * a->Hk * a->Dk + a->Hv * a->Dv, chunked};
    og_parallel_for(pool, a->Hv, gdn_task, &j);
    return OG_OK;
}

og_status og_gated_delta_net_cpu(og_threadpool *pool, const og_gdn_args *a) {
    return gdn_run(pool, a, a && a->T > 1);
}

og_status og_gated_delta_net_recurrent_cpu(og_threadpool *pool, const og_gdn_args *a) { return gdn_run(pool, a, false); }

/* ---- rms_norm_gated: one task per row ---- */

typedef struct norm_job {
    const float *x, *z;
    const void *w;
    og_dtype wdt;
    int64_t n, D;
    float eps;
    float *out;
} norm_job;

static void norm_task(void *ctx, int64_t t, int thread) {
    const norm_job *j = ctx;
    (void)thread;
    for (int64_t h = 0; h < j->n; h++) {
        const int64_t r = t * j->n + h;
        const float *xr = j->x + r * j->D, *zr = j->z + r * j->D;
        float *o = j->out + r * j->D;
        float ss = 0.0f;
        for (int64_t i = 0; i < j->D; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)j->D + j->eps);
        for (int64_t i = 0; i < j->D; i++) {
            const float g = zr[i];
            o[i] = og_load_f32(j->w, j->wdt, (size_t)i) * (xr[i] * inv) * (g / (1.0f + expf(-g)));
        }
    }
}

og_status og_rms_norm_gated_cpu(og_threadpool *pool, const float *x, const float *z, const void *weight, og_dtype wdt,
                                int64_t T, int64_t n, int64_t D, float eps, float *out) {
    OG_TRY(og_gdn_check_norm("rms_norm_gated", x, z, weight, wdt, T, n, D, eps, out));
    norm_job j = {x, z, weight, wdt, n, D, eps, out};
    og_parallel_for(pool, T, norm_task, &j);
    return OG_OK;
}

/* ---- sigmoid_mul: tasks of SIG_CHUNK elements ---- */

enum { SIG_CHUNK = 16384 };

typedef struct sig_job {
    const float *x, *g;
    int64_t n;
    float *out;
} sig_job;

static void sig_task(void *ctx, int64_t task, int thread) {
    const sig_job *j = ctx;
    (void)thread;
    const int64_t i0 = task * SIG_CHUNK, i1 = i0 + SIG_CHUNK < j->n ? i0 + SIG_CHUNK : j->n;
    for (int64_t i = i0; i < i1; i++) j->out[i] = j->x[i] * (1.0f / (1.0f + expf(-j->g[i])));
}

og_status og_sigmoid_mul_cpu(og_threadpool *pool, const float *x, const float *gate, int64_t n, float *out) {
    OG_TRY(og_ops_check_binary("sigmoid_mul", x, "x", gate, "gate", 1, n, out));
    sig_job j = {x, gate, n, out};
    og_parallel_for(pool, (n + SIG_CHUNK - 1) / SIG_CHUNK, sig_task, &j);
    return OG_OK;
}
