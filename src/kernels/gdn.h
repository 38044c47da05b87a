/* CPU kernels of the hybrid (Gated DeltaNet) layers: the causal depthwise
 * convolution with its state, the gated delta rule over a per-session
 * recurrent state, the gated RMS norm, and the sigmoid gate of the gated
 * attention layers.
 *
 * og_<op>_ref is the plain C reference, og_<op>_cpu the fast version
 * (threads from the pool, NULL = the caller only). Both check their
 * arguments the same way and return OG_OK or a status with og_last_error()
 * naming what was wrong; nothing is written on failure.
 *
 * Letter legend:
 *   T   tokens of the step              C   channels of the convolution
 *   K   its kernel size                 Hk  key heads, Dk their dim
 *   Hv  value heads (Hv % Hk == 0; value head h reads key head h / (Hv / Hk))
 *   Dv  value head dim                  n   heads packed in a row, D their dim
 *
 * The math is transformers' (Qwen3.5 / Qwen3-Next, torch_recurrent_gated_
 * delta_rule and torch_chunk_gated_delta_rule), in f32:
 *   per value head h and token t, with q, k the key head's slices of the
 *   convolution's output and v the value head's,
 *     q <- q / sqrt(sum q^2 + 1e-6) / sqrt(Dk),  k <- k / sqrt(sum k^2 + 1e-6)
 *     g  = -exp(A_log[h]) * softplus(a[t][h] + dt_bias[h])   (log of the decay)
 *     beta = sigmoid(b[t][h])
 *     S <- exp(g) * S                      S: [Dk, Dv], the head's state
 *     u  = beta * (v - S^T k)
 *     S <- S + k u^T
 *     out[t][h] = S^T q
 *   softplus(x) = log(1 + exp(x)), or x above 20 (torch's threshold).
 * A state that is NULL on input is zero (a session at length 0). */
#ifndef OG_KERNELS_GDN_H
#define OG_KERNELS_GDN_H

#include "core/core.h"

/* ---- causal_conv1d: depthwise causal convolution, then SiLU ----
 * out[t][c] = silu(sum_j weight[c][j] * xs[t + j][c]), j in [0, K), where xs
 * is the K - 1 rows of state_in (zeros when NULL) followed by the T rows of
 * x; state_out gets the last K - 1 rows of xs (the step's inputs, with the
 * older state before them when T < K - 1). weight is f32 or bf16.
 * out must not overlap x; state_out must not overlap state_in, x or out. */
og_status og_causal_conv1d_ref(const float *x /* [T, C] */, const void *weight /* [C, K] */,
                               og_dtype weight_dtype, const float *state_in /* [K-1, C] or NULL */,
                               float *state_out /* [K-1, C] */, int64_t T, int64_t C, int64_t K,
                               float *out /* [T, C] */);
og_status og_causal_conv1d_cpu(og_threadpool *pool, const float *x /* [T, C] */, const void *weight /* [C, K] */,
                               og_dtype weight_dtype, const float *state_in /* [K-1, C] or NULL */,
                               float *state_out /* [K-1, C] */, int64_t T, int64_t C, int64_t K,
                               float *out /* [T, C] */);

/* ---- gated_delta_net: the gated delta rule of one session's step ---- */
typedef struct og_gdn_args {
    const float *qkv;      /* [T, 2*Hk*Dk + Hv*Dv]: q heads, k heads, v heads */
    const float *a, *b;    /* [T, Hv] each                                    */
    const void *A_log;     /* [Hv] of A_log_dtype (f32 or bf16)               */
    const void *dt_bias;   /* [Hv] of dt_bias_dtype                           */
    og_dtype A_log_dtype, dt_bias_dtype;
    int64_t T, Hk, Hv, Dk, Dv;
    const float *state_in; /* [Hv, Dk, Dv], or NULL: zero                     */
    float *state_out;      /* [Hv, Dk, Dv]: the state after the T tokens      */
    float *out;            /* [T, Hv*Dv]                                      */
} og_gdn_args;

/* The reference: the recurrent form above, token by token, in double
 * precision (an oracle for both forms of the fast version). */
og_status og_gated_delta_net_ref(const og_gdn_args *a);
/* The fast version, threads over value heads. T == 1 takes the recurrent
 * form; T > 1 the chunked form: chunks of OG_GDN_CHUNK tokens (the last
 * one shorter), within a chunk the tokens' updates solved together (a
 * triangular system of the chunk's key products) and the state carried
 * from chunk to chunk; equal to the recurrent form up to f32 rounding.
 * state_out must not overlap state_in; scratch is per thread (og_scratch). */
#define OG_GDN_CHUNK 64
og_status og_gated_delta_net_cpu(og_threadpool *pool, const og_gdn_args *a);
/* The recurrent form for any T (the fast version's T == 1 path). */
og_status og_gated_delta_net_recurrent_cpu(og_threadpool *pool, const og_gdn_args *a);

/* ---- rms_norm_gated: per head of D, norm(x) * weight * silu(z) ----
 * norm(x) = x * rsqrt(mean(x^2) + eps) over the head's D values (the gated
 * norm of a Gated DeltaNet layer: the weight as stored, not 1 + weight).
 * out may equal x or z. */
og_status og_rms_norm_gated_ref(const float *x /* [T, n*D] */, const float *z /* [T, n*D] */,
                                const void *weight /* [D] */, og_dtype weight_dtype, int64_t T, int64_t n,
                                int64_t D, float eps, float *out /* [T, n*D] */);
og_status og_rms_norm_gated_cpu(og_threadpool *pool, const float *x /* [T, n*D] */, const float *z /* [T, n*D] */,
                                const void *weight /* [D] */, og_dtype weight_dtype, int64_t T, int64_t n,
                                int64_t D, float eps, float *out /* [T, n*D] */);

/* ---- sigmoid_mul: out = x * sigmoid(gate) (the gated attention's output
 * gate); out may equal x or gate ---- */
og_status og_sigmoid_mul_ref(const float *x /* [n] */, const float *gate /* [n] */, int64_t n, float *out /* [n] */);
og_status og_sigmoid_mul_cpu(og_threadpool *pool, const float *x /* [n] */, const float *gate /* [n] */, int64_t n,
                             float *out /* [n] */);

#endif /* OG_KERNELS_GDN_H */
