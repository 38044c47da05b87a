/* Shared by gdn_ref.c and gdn_cpu.c: argument checks (so both refuse the
 * same inputs), limits, and the per-token scalars of the gated delta rule.
 * Not part of any API. Letters as in gdn.h. */
#ifndef OG_KERNELS_GDN_INTERNAL_H
#define OG_KERNELS_GDN_INTERNAL_H

#include "kernels/gdn.h"

#define OG_GDN_MAX_KERNEL 64     /* convolution kernel size */
#define OG_GDN_MAX_HEAD_DIM 1024 /* Dk, Dv (program/ops.h's OG_MAX_STATE_HEAD_DIM) */
#define OG_GDN_MAX_HEADS 4096    /* Hv (OG_MAX_STATE_HEADS) */

og_status og_gdn_check_conv(const char *op, const float *x, const void *weight, og_dtype wdt, const float *state_in,
                            const float *state_out, int64_t T, int64_t C, int64_t K, const float *out);
og_status og_gdn_check(const char *op, const og_gdn_args *a);
og_status og_gdn_check_norm(const char *op, const float *x, const float *z, const void *weight, og_dtype wdt,
                            int64_t T, int64_t n, int64_t D, float eps, const float *out);

/* torch's softplus (threshold 20) in f32. */
float og_gdn_softplus(float x);
/* g of token t, value head h: -exp(A_log[h]) * softplus(a[t][h] + dt_bias[h]), in f32. */
float og_gdn_decay_log(const og_gdn_args *a, int64_t t, int64_t h);
/* beta of token t, value head h: sigmoid(b[t][h]), in f32. */
float og_gdn_beta(const og_gdn_args *a, int64_t t, int64_t h);

#endif
