/* Attention test sequences: see attend_seq.h. */
#include "attend_seq.h"

#include "oracle.h"

#include <stdlib.h>
#include <string.h>

bool og_test_seq_init(og_test_seq *s, int32_t Hq, int32_t Hkv, int32_t D, og_dtype dtype,
                      int64_t cap) {
    memset(s, 0, sizeof *s);
    s->Hq = Hq;
    s->Hkv = Hkv;
    s->D = D;
    s->dtype = dtype;
    s->cap = cap;
    const size_t nq = (size_t)cap * Hq * D, nkv = (size_t)cap * Hkv * D;
    s->q = malloc(nq * sizeof(float));
    s->k = malloc(nkv * sizeof(float));
    s->v = malloc(nkv * sizeof(float));
    s->ks = malloc(nkv * sizeof(float));
    s->vs = malloc(nkv * sizeof(float));
    if (!s->q || !s->k || !s->v || !s->ks || !s->vs) {
        og_test_seq_free(s);
        return false;
    }
    return true;
}

void og_test_seq_free(og_test_seq *s) {
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->ks);
    free(s->vs);
    memset(s, 0, sizeof *s);
}

int64_t og_test_seq_append(og_test_seq *s, og_rng *r, int32_t T) {
    const int64_t pos = s->n;
    const size_t kv0 = (size_t)pos * s->Hkv * s->D, nkv = (size_t)T * s->Hkv * s->D;
    og_rng_fill(r, s->q + (size_t)pos * s->Hq * s->D, (size_t)T * s->Hq * s->D, -1.0f, 1.0f);
    og_rng_fill(r, s->k + kv0, nkv, -1.0f, 1.0f);
    og_rng_fill(r, s->v + kv0, nkv, -1.0f, 1.0f);
    memcpy(s->ks + kv0, s->k + kv0, nkv * sizeof(float));
    memcpy(s->vs + kv0, s->v + kv0, nkv * sizeof(float));
    if (s->dtype == OG_DTYPE_BF16) {
        og_oracle_round_bf16(s->ks + kv0, nkv);
        og_oracle_round_bf16(s->vs + kv0, nkv);
    } else if (s->dtype == OG_DTYPE_INT8 || s->dtype == OG_DTYPE_FP8) {
        og_oracle_round_kv(s->dtype == OG_DTYPE_FP8, s->ks + kv0, (size_t)T, s->Hkv, s->D);
        og_oracle_round_kv(s->dtype == OG_DTYPE_FP8, s->vs + kv0, (size_t)T, s->Hkv, s->D);
    }
    s->n += T;
    return pos;
}

double og_test_seq_check(const og_test_seq *s, int64_t pos, int32_t T, int32_t W, float scale,
                         const float *out, double atol, double rtol) {
    if (pos < 0 || pos + T > s->n) return INFINITY;
    const size_t n_out = (size_t)T * s->Hq * s->D;
    double *want = malloc(n_out * sizeof *want);
    if (!want) return INFINITY;
    og_oracle_attention(s->q + (size_t)pos * s->Hq * s->D, s->ks, s->vs, pos + T, pos, T, s->Hq,
                        s->Hkv, s->D, W, scale, want);
    size_t worst = 0;
    const double ratio = og_tol_ratio_d(out, want, n_out, atol, rtol, &worst);
    if (!(ratio <= 1.0))
        fprintf(stderr, "  step at %lld (T=%d): worst element %zu got %.9g want %.9g (ratio %.3g)\n",
                (long long)pos, T, worst, (double)out[worst], want[worst], ratio);
    free(want);
    return ratio;
}

void og_test_fill_every_quant(og_dtype dt, unsigned char *k, unsigned char *v, int64_t L, int32_t Hkv,
                              int32_t D, int64_t RB) {
    for (int64_t j = 0; j < L; j++)
        for (int64_t h = 0; h < Hkv; h++) {
            for (int64_t d = 0; d < D; d++) {
                unsigned b = (unsigned)((j * Hkv + h) * D + d) & 0xff, bv = (b + 77u) & 0xff;
                if (dt == OG_DTYPE_FP8 && (b & 0x7f) == 0x7f) b = 0x80; /* NaN codes: -0 instead */
                if (dt == OG_DTYPE_FP8 && (bv & 0x7f) == 0x7f) bv = 0x00;
                k[j * RB + h * D + d] = (unsigned char)b;
                v[j * RB + h * D + d] = (unsigned char)bv;
            }
            const float max = dt == OG_DTYPE_INT8 ? 128.0f : 448.0f;
            const float ks = (h ? 0.5f : 1.0f) / max, vs = (h ? 2.0f : 0.25f) / max;
            memcpy(k + j * RB + (int64_t)Hkv * D + 4 * h, &ks, 4);
            memcpy(v + j * RB + (int64_t)Hkv * D + 4 * h, &vs, 4);
        }
}

size_t og_test_kv_bytes(const og_kv_layer_view *kv) {
    return (size_t)(kv->rows * og_kv_layer_view_row_stride(kv)) * og_dtype_size(kv->dtype);
}

og_kv_layer_view og_test_kv_clone(const og_kv_layer_view *src) {
    og_kv_layer_view kv = *src;
    const size_t n = og_test_kv_bytes(src);
    kv.k = malloc(n);
    kv.v = malloc(n);
    if (kv.k && kv.v) {
        memcpy(kv.k, src->k, n);
        memcpy(kv.v, src->v, n);
    }
    return kv;
}

void og_test_kv_free(og_kv_layer_view *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}
