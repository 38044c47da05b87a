/* Plain C references of the ops in ops.h (one thread, no SIMD), the argument
 * checks both versions share, and the RoPE frequency table.
 * Letters as in ops.h: T tokens, K in features, N out features / row width,
 * V vocabulary, H hidden, F ffn, D head dim, n heads per row. */
#include "kernels/ops_internal.h"

#include <math.h>
#include <stdint.h>

/* ---- argument checks ---- */

og_status og_ops_check_ptr(const void *p, const char *op, const char *name) {
    if (p) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, name);
}

og_status og_ops_check_dim(int64_t value, const char *op, const char *name) {
    if (value >= 1) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %s = %lld, must be >= 1", op, name,
                        (long long)value);
}

og_status og_ops_check_weight_dtype(og_dtype dt, const char *op, const char *name) {
    if (dt == OG_DTYPE_BF16 || dt == OG_DTYPE_F32) return OG_OK;
    return og_set_error(OG_ERR_UNSUPPORTED, "%s: %s dtype %s is not supported (bf16 or f32)",
                        op, name, og_dtype_name(dt));
}

og_status og_ops_check_matrix_dtype(og_dtype dt, const char *op, const char *name) {
    if (dt == OG_DTYPE_BF16 || dt == OG_DTYPE_F32 || og_dtype_is_quantized(dt)) return OG_OK;
    return og_set_error(OG_ERR_UNSUPPORTED,
                        "%s: %s dtype %s is not supported (bf16, f32, q8, q4 or a k-quant)", op,
                        name, og_dtype_name(dt));
}

og_status og_ops_check_matrix_size(og_dtype dt, int64_t rows, int64_t cols, const char *op,
                                   const char *name, size_t *bytes) {
    if (og_dtype_is_quantized(dt) && cols % og_quant_block_elems(dt))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: %s of dtype %s has rows of %lld, not a multiple of %lld", op, name,
                            og_dtype_name(dt), (long long)cols, (long long)og_quant_block_elems(dt));
    const int64_t shape[2] = {rows, cols};
    int64_t total;
    if (!og_tensor_bytes(dt, 2, shape, &total) || (uint64_t)total > SIZE_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %s of %lld x %lld elements overflows",
                            op, name, (long long)rows, (long long)cols);
    *bytes = (size_t)total;
    return OG_OK;
}

og_status og_ops_check_size(int64_t rows, int64_t cols, size_t elem, const char *op,
                            const char *name, size_t *bytes) {
    int64_t count, total;
    if (!og_mul_overflow_i64(rows, cols, &count) ||
        !og_mul_overflow_i64(count, (int64_t)elem, &total) || (uint64_t)total > SIZE_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: %s of %lld x %lld elements overflows",
                            op, name, (long long)rows, (long long)cols);
    *bytes = (size_t)total;
    return OG_OK;
}

static bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

og_status og_ops_check_alias(const void *out, const void *in, size_t bytes, const char *op,
                             const char *in_name) {
    if (out == in || !ranges_overlap(out, bytes, in, bytes)) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT,
                        "%s: out partially overlaps %s (must be the same buffer or disjoint)", op,
                        in_name);
}

og_status og_ops_check_disjoint(const void *out, size_t out_bytes, const void *in,
                                size_t in_bytes, const char *op, const char *in_name) {
    if (!ranges_overlap(out, out_bytes, in, in_bytes)) return OG_OK;
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out overlaps %s", op, in_name);
}

og_status og_ops_check_rms_norm(const char *op, const float *x, const void *weight,
                                og_dtype weight_dtype, int64_t rows, int64_t N, float eps,
                                const float *out) {
    size_t bytes;
    OG_TRY(og_ops_check_ptr(x, op, "x"));
    OG_TRY(og_ops_check_ptr(weight, op, "weight"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_weight_dtype(weight_dtype, op, "weight"));
    OG_TRY(og_ops_check_dim(rows, op, "rows"));
    OG_TRY(og_ops_check_dim(N, op, "row width"));
    if (!(eps >= 0.0f) || isinf(eps))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: eps = %g, must be finite and >= 0", op,
                            (double)eps);
    OG_TRY(og_ops_check_size(rows, N, sizeof(float), op, "x", &bytes));
    return og_ops_check_alias(out, x, bytes, op, "x");
}

og_status og_ops_check_matmul(const float *x, const void *weight, const void *bias,
                              og_dtype weight_dtype, int64_t T, int64_t K, int64_t N,
                              const float *out) {
    const char *op = "matmul";
    size_t x_bytes, w_bytes, out_bytes;
    OG_TRY(og_ops_check_ptr(x, op, "x"));
    OG_TRY(og_ops_check_ptr(weight, op, "weight"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_matrix_dtype(weight_dtype, op, "weight"));
    OG_TRY(og_ops_check_dim(T, op, "T"));
    OG_TRY(og_ops_check_dim(K, op, "K"));
    OG_TRY(og_ops_check_dim(N, op, "N"));
    OG_TRY(og_ops_check_size(T, K, sizeof(float), op, "x", &x_bytes));
    OG_TRY(og_ops_check_matrix_size(weight_dtype, N, K, op, "weight", &w_bytes));
    OG_TRY(og_ops_check_size(T, N, sizeof(float), op, "out", &out_bytes));
    OG_TRY(og_ops_check_disjoint(out, out_bytes, x, x_bytes, op, "x"));
    OG_TRY(og_ops_check_disjoint(out, out_bytes, weight, w_bytes, op, "weight"));
    if (bias) /* N fits: the weight's size did */
        OG_TRY(og_ops_check_disjoint(out, out_bytes, bias,
                                     (size_t)N * og_dtype_size(og_bias_dtype(weight_dtype)), op,
                                     "bias"));
    return OG_OK;
}

og_status og_ops_check_rope(const char *op, const og_rope_table *table, const float *x,
                            const int32_t *positions, int64_t T, int64_t n, const float *out) {
    size_t bytes;
    OG_TRY(og_ops_check_ptr(table, op, "table"));
    OG_TRY(og_ops_check_ptr(x, op, "x"));
    OG_TRY(og_ops_check_ptr(positions, op, "positions"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_dim(T, op, "T"));
    OG_TRY(og_ops_check_dim(n, op, "heads"));
    int32_t D = table->head_dim;
    if (D < 2 || D > OG_ROPE_MAX_HEAD_DIM || D % 2)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: table head_dim %d is not initialised",
                            op, D);
    OG_TRY(og_ops_check_size(T, n * (int64_t)D, sizeof(float), op, "x", &bytes));
    for (int64_t t = 0; t < T; t++)
        if (positions[t] < 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: position %d at index %lld is negative",
                                op, positions[t], (long long)t);
    return og_ops_check_alias(out, x, bytes, op, "x");
}

og_status og_ops_check_embed(const char *op, const int32_t *tokens, int64_t T,
                             const void *table, og_dtype table_dtype, int64_t V, int64_t H,
                             const float *out) {
    size_t table_bytes, out_bytes;
    OG_TRY(og_ops_check_ptr(tokens, op, "tokens"));
    OG_TRY(og_ops_check_ptr(table, op, "table"));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_matrix_dtype(table_dtype, op, "table"));
    OG_TRY(og_ops_check_dim(T, op, "T"));
    OG_TRY(og_ops_check_dim(V, op, "V"));
    OG_TRY(og_ops_check_dim(H, op, "H"));
    OG_TRY(og_ops_check_matrix_size(table_dtype, V, H, op, "table", &table_bytes));
    OG_TRY(og_ops_check_size(T, H, sizeof(float), op, "out", &out_bytes));
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "%s: token id %d at position %lld is outside [0, %lld)", op,
                                tokens[t], (long long)t, (long long)V);
    return og_ops_check_disjoint(out, out_bytes, table, table_bytes, op, "table");
}

og_status og_ops_check_binary(const char *op, const float *a, const char *a_name,
                              const float *b, const char *b_name, int64_t rows, int64_t cols,
                              const float *out) {
    size_t bytes;
    OG_TRY(og_ops_check_ptr(a, op, a_name));
    OG_TRY(og_ops_check_ptr(b, op, b_name));
    OG_TRY(og_ops_check_ptr(out, op, "out"));
    OG_TRY(og_ops_check_dim(rows, op, "rows"));
    OG_TRY(og_ops_check_dim(cols, op, "columns"));
    OG_TRY(og_ops_check_size(rows, cols, sizeof(float), op, a_name, &bytes));
    OG_TRY(og_ops_check_alias(out, a, bytes, op, a_name));
    return og_ops_check_alias(out, b, bytes, op, b_name);
}

/* ---- bf16 <-> f32 ---- */

void og_bf16_to_f32_ref(const og_bf16 *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = og_f32_from_bf16(src[i]);
}

void og_f32_to_bf16_ref(const float *src, og_bf16 *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = og_bf16_from_f32(src[i]);
}

/* ---- embed ---- */

og_status og_embed_ref(const int32_t *tokens, int64_t T, const void *table, og_dtype table_dtype,
                       int64_t V, int64_t H, float *out) {
    OG_TRY(og_ops_check_embed("embed", tokens, T, table, table_dtype, V, H, out));
    for (int64_t t = 0; t < T; t++) {
        if (og_dtype_is_quantized(table_dtype)) {
            og_dequantize_row(table_dtype, table, V, H, tokens[t], out + t * H);
            continue;
        }
        size_t row = (size_t)tokens[t] * (size_t)H;
        for (int64_t h = 0; h < H; h++)
            out[t * H + h] = og_load_f32(table, table_dtype, row + (size_t)h);
    }
    return OG_OK;
}

/* ---- rms_norm ---- */

/* One row: the mean of squares is summed in double and rounded to f32 (torch
 * reduces with a pairwise sum; double is at least as accurate), then
 * x * rsqrt(mean + eps) in f32, then times the weight. */
static void rms_norm_row_ref(const float *x /* [N] */, const void *w /* [N] */, og_dtype wdt,
                             int64_t N, float eps, float *out /* [N] */) {
    double sum = 0.0;
    for (int64_t i = 0; i < N; i++) sum += (double)x[i] * (double)x[i];
    float mean = (float)(sum / (double)N);
    float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < N; i++) out[i] = (x[i] * r) * og_load_f32(w, wdt, (size_t)i);
}

og_status og_rms_norm_ref(const float *x, const void *weight, og_dtype weight_dtype, int64_t T,
                          int64_t N, float eps, float *out) {
    OG_TRY(og_ops_check_rms_norm("rms_norm", x, weight, weight_dtype, T, N, eps, out));
    for (int64_t t = 0; t < T; t++)
        rms_norm_row_ref(x + t * N, weight, weight_dtype, N, eps, out + t * N);
    return OG_OK;
}

og_status og_head_rms_norm_ref(const float *x, const void *weight, og_dtype weight_dtype,
                               int64_t T, int64_t n, int64_t D, float eps, float *out) {
    OG_TRY(og_ops_check_dim(T, "head_rms_norm", "T"));
    OG_TRY(og_ops_check_dim(n, "head_rms_norm", "heads"));
    int64_t rows;
    if (!og_mul_overflow_i64(T, n, &rows))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "head_rms_norm: T x heads overflows");
    OG_TRY(og_ops_check_rms_norm("head_rms_norm", x, weight, weight_dtype, rows, D, eps, out));
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row_ref(x + r * D, weight, weight_dtype, D, eps, out + r * D);
    return OG_OK;
}

/* ---- matmul ---- */

/* Quantized weights: each row dequantized (og_dequantize_row, exact) and
 * then summed as an f32 row is, bias (f32) last. */
static og_status matmul_quant_ref(const float *x, const void *weight, const float *bias,
                                  og_dtype dt, int64_t T, int64_t K, int64_t N, float *out) {
    float *w = og_malloc((size_t)K * sizeof *w); /* [K] row j */
    if (!w)
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "matmul: no memory for a row of %lld weights",
                            (long long)K);
    for (int64_t j = 0; j < N; j++) {
        og_dequantize_row(dt, weight, N, K, j, w);
        for (int64_t t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += x[t * K + k] * w[k];
            if (bias) acc += bias[j];
            out[t * N + j] = acc;
        }
    }
    og_free(w);
    return OG_OK;
}

og_status og_matmul_ref(const float *x, const void *weight, const void *bias,
                        og_dtype weight_dtype, int64_t T, int64_t K, int64_t N, float *out) {
    OG_TRY(og_ops_check_matmul(x, weight, bias, weight_dtype, T, K, N, out));
    if (og_dtype_is_quantized(weight_dtype))
        return matmul_quant_ref(x, weight, bias, weight_dtype, T, K, N, out);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += x[t * K + k] * og_load_f32(weight, weight_dtype, (size_t)(j * K + k));
            if (bias) acc += og_load_f32(bias, weight_dtype, (size_t)j);
            out[t * N + j] = acc;
        }
    }
    return OG_OK;
}

/* ---- rope ---- */

og_status og_rope_table_init(og_rope_table *table, int32_t head_dim, const og_rope_params *p) {
    const char *op = "rope_table_init";
    OG_TRY(og_ops_check_ptr(table, op, "table"));
    OG_TRY(og_ops_check_ptr(p, op, "params"));
    if (head_dim < 2 || head_dim > OG_ROPE_MAX_HEAD_DIM || head_dim % 2)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: head_dim %d must be even and in [2, %d]", op, head_dim,
                            OG_ROPE_MAX_HEAD_DIM);
    if (!(p->theta > 0.0f) || isinf(p->theta))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: theta %g must be finite and > 0", op,
                            (double)p->theta);
    if (p->type != OG_ROPE_DEFAULT && p->type != OG_ROPE_LINEAR && p->type != OG_ROPE_LLAMA3)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: unknown rope type %d", op, (int)p->type);
    if (p->type != OG_ROPE_DEFAULT && (!(p->factor > 0.0f) || isinf(p->factor)))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: factor %g must be finite and > 0", op,
                            (double)p->factor);
    if (p->type == OG_ROPE_LLAMA3 &&
        (!(p->low_freq_factor > 0.0f) || !(p->high_freq_factor > p->low_freq_factor) ||
         isinf(p->high_freq_factor) || p->original_max_position < 1))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "%s: llama3 needs 0 < low_freq_factor (%g) < high_freq_factor (%g) "
                            "and original_max_position_embeddings (%d) >= 1",
                            op, (double)p->low_freq_factor, (double)p->high_freq_factor,
                            p->original_max_position);

    const int32_t rd = p->rotary_dim ? p->rotary_dim : head_dim;
    if (rd < 2 || rd > head_dim || rd % 2)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: rotary_dim %d must be even and in [2, head_dim %d]", op,
                            (int)p->rotary_dim, head_dim);
    memset(table, 0, sizeof *table);
    table->head_dim = head_dim;
    /* _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2).float() / dim)),
     * every operation in f32, with dim the rotary dims; the pairs past them stay 0 */
    int32_t half = rd / 2;
    for (int32_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)rd;
        table->inv_freq[i] = 1.0f / powf(p->theta, e);
    }
    if (p->type == OG_ROPE_LINEAR) {
        for (int32_t i = 0; i < half; i++) table->inv_freq[i] = table->inv_freq[i] / p->factor;
    } else if (p->type == OG_ROPE_LLAMA3) {
        /* _compute_llama3_parameters: Python scalars meet f32 tensors, so each
         * scalar is rounded to f32 and the arithmetic is f32, in this order. */
        double old_ctx = (double)p->original_max_position;
        float low_wavelen = (float)(old_ctx / (double)p->low_freq_factor);
        float high_wavelen = (float)(old_ctx / (double)p->high_freq_factor);
        float two_pi = (float)(2.0 * M_PI);
        float span = (float)((double)p->high_freq_factor - (double)p->low_freq_factor);
        for (int32_t i = 0; i < half; i++) {
            float inv = table->inv_freq[i];
            float wavelen = two_pi / inv;
            float scaled = wavelen > low_wavelen ? inv / p->factor : inv;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = ((float)old_ctx / wavelen - p->low_freq_factor) / span;
                scaled = (1.0f - smooth) * scaled / p->factor + smooth * scaled;
            }
            table->inv_freq[i] = scaled;
        }
    }
    return OG_OK;
}

og_status og_rope_ref(const og_rope_table *table, const float *x, const int32_t *positions,
                      int64_t T, int64_t n, float *out) {
    OG_TRY(og_ops_check_rope("rope", table, x, positions, T, n, out));
    int64_t D = table->head_dim, half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        float pos = (float)positions[t];
        for (int64_t h = 0; h < n; h++) {
            const float *xh = x + (t * n + h) * D; /* [D] */
            float *oh = out + (t * n + h) * D;     /* [D] */
            for (int64_t i = 0; i < half; i++) {
                float angle = pos * table->inv_freq[i];
                float c = cosf(angle), s = sinf(angle);
                float a = xh[i], b = xh[i + half];
                oh[i] = a * c - b * s;
                oh[i + half] = b * c + a * s;
            }
        }
    }
    return OG_OK;
}

/* ---- swiglu, add, argmax ---- */

og_status og_swiglu_ref(const float *gate, const float *up, int64_t T, int64_t F, float *out) {
    OG_TRY(og_ops_check_binary("swiglu", gate, "gate", up, "up", T, F, out));
    for (int64_t i = 0; i < T * F; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return OG_OK;
}

og_status og_add_ref(const float *a, const float *b, int64_t n, float *out) {
    OG_TRY(og_ops_check_binary("add", a, "a", b, "b", 1, n, out));
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return OG_OK;
}

og_status og_argmax_ref(const float *x, int64_t V, int64_t *index) {
    OG_TRY(og_ops_check_ptr(x, "argmax", "x"));
    OG_TRY(og_ops_check_ptr(index, "argmax", "index"));
    OG_TRY(og_ops_check_dim(V, "argmax", "V"));
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(x[i])) {
            best = i;
            break;
        }
        if (x[i] > x[best]) best = i;
    }
    *index = best;
    return OG_OK;
}
