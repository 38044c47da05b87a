/* The op table and the shape rule of every op (letters as in ops.h:
 * T step width, V vocab, H hidden, N/K widths, F intermediate,
 * Hq/Hkv heads, D head dim). */
#include "program/ops.h"
#include "core/core.h"

#include <stdio.h>
#include <string.h>

#define A(field, kind) {#field, kind, offsetof(og_op_attrs, field), false}
#define OPT(field, kind) {#field, kind, offsetof(og_op_attrs, field), true}

static const og_op_info k_ops[OG_OP_COUNT] = {
    [OG_OP_EMBED] = {"embed", 2, 2, {"tokens", "table"}, 0, {{0}}},
    [OG_OP_RMS_NORM] = {"rms_norm", 2, 2, {"x", "weight"}, 1, {A(eps, OG_ATTR_FLOAT)}},
    [OG_OP_HEAD_RMS_NORM] = {"head_rms_norm", 2, 2, {"x", "weight"}, 2,
                             {A(heads, OG_ATTR_INT), A(eps, OG_ATTR_FLOAT)}},
    [OG_OP_MATMUL] = {"matmul", 2, 3, {"x", "weight", "bias"}, 0, {{0}}},
    [OG_OP_ROPE] = {"rope", 2, 2, {"x", "positions"}, 9,
                    {A(heads, OG_ATTR_INT), A(head_dim, OG_ATTR_INT), A(theta, OG_ATTR_FLOAT),
                     {"type", OG_ATTR_ROPE_TYPE, offsetof(og_op_attrs, rope_type), false},
                     A(factor, OG_ATTR_FLOAT), A(low_freq_factor, OG_ATTR_FLOAT),
                     A(high_freq_factor, OG_ATTR_FLOAT),
                     A(original_max_position_embeddings, OG_ATTR_INT), OPT(rotary_dim, OG_ATTR_INT)}},
    [OG_OP_UPDATE_AND_ATTEND] = {"update_and_attend", 6, 6,
                                 {"q", "k", "v", "positions", "k_cache", "v_cache"}, 5,
                                 {A(layer_id, OG_ATTR_INT), A(n_heads, OG_ATTR_INT),
                                  A(n_kv_heads, OG_ATTR_INT), A(head_dim, OG_ATTR_INT),
                                  A(scale, OG_ATTR_FLOAT)}},
    [OG_OP_SWIGLU] = {"swiglu", 2, 2, {"gate", "up"}, 0, {{0}}},
    [OG_OP_ADD] = {"add", 2, 2, {"a", "b"}, 0, {{0}}},
    [OG_OP_CAUSAL_CONV1D] = {"causal_conv1d", 3, 3, {"x", "weight", "state"}, 1, {A(layer_id, OG_ATTR_INT)}},
    [OG_OP_GATED_DELTA_NET] = {"gated_delta_net", 6, 6, {"qkv", "a", "b", "A_log", "dt_bias", "state"}, 5,
                               {A(layer_id, OG_ATTR_INT), A(k_heads, OG_ATTR_INT), A(v_heads, OG_ATTR_INT),
                                A(k_head_dim, OG_ATTR_INT), A(v_head_dim, OG_ATTR_INT)}},
    [OG_OP_RMS_NORM_GATED] = {"rms_norm_gated", 3, 3, {"x", "z", "weight"}, 2,
                              {A(heads, OG_ATTR_INT), A(eps, OG_ATTR_FLOAT)}},
    [OG_OP_SIGMOID_MUL] = {"sigmoid_mul", 2, 2, {"x", "gate"}, 0, {{0}}},
};

static const char *const k_rope_names[OG_ROPE_TYPE_COUNT] = {
    [OG_ROPE_DEFAULT] = "default", [OG_ROPE_LINEAR] = "linear", [OG_ROPE_LLAMA3] = "llama3"};

const char *og_rope_type_name(og_rope_type t) {
    return (unsigned)t < OG_ROPE_TYPE_COUNT ? k_rope_names[t] : "unknown";
}

bool og_rope_type_parse(const char *name, og_rope_type *out) {
    for (int i = 0; name && i < OG_ROPE_TYPE_COUNT; i++) {
        if (strcmp(name, k_rope_names[i]) == 0) {
            *out = (og_rope_type)i;
            return true;
        }
    }
    return false;
}

const og_op_info *og_op_get(og_op op) { return (unsigned)op < OG_OP_COUNT ? &k_ops[op] : NULL; }

bool og_op_parse(const char *name, og_op *out) {
    for (int i = 0; name && i < OG_OP_COUNT; i++) {
        if (strcmp(name, k_ops[i].name) == 0) {
            *out = (og_op)i;
            return true;
        }
    }
    return false;
}

static bool is_float(og_dtype dt) {
    return dt == OG_DTYPE_F32 || dt == OG_DTYPE_BF16 || dt == OG_DTYPE_F16;
}

/* An activation [T, n] of a float dtype; *n gets its width. */
static bool is_act(const og_shape *s, int64_t *n) {
    if (s->runtime || s->rank != 2 || s->dim[0] != OG_DIM_T || s->dim[1] <= 0 || !is_float(s->dtype))
        return false;
    *n = s->dim[1];
    return true;
}

/* A [T] i32 activation (tokens or positions). */
static bool is_index_vec(const og_shape *s) {
    return !s->runtime && s->rank == 1 && s->dim[0] == OG_DIM_T && s->dtype == OG_DTYPE_I32;
}

/* A static float weight of the given rank (dims must all be > 0). */
static bool is_weight(const og_shape *s, int32_t rank) {
    if (s->runtime || s->rank != rank || !is_float(s->dtype)) return false;
    for (int i = 0; i < rank; i++)
        if (s->dim[i] <= 0) return false;
    return true;
}

/* A static [rows, cols] matrix of a float or quantized dtype (embedding
 * tables and matmul weights may be quantized). */
static bool is_matrix(const og_shape *s) {
    if (s->runtime || s->rank != 2 || s->dim[0] <= 0 || s->dim[1] <= 0) return false;
    return is_float(s->dtype) || og_dtype_is_quantized(s->dtype);
}

#define FAIL(kind, ...) (snprintf(why, why_cap, __VA_ARGS__), (kind))

/* Operand k is the runtime state of layer_id with exactly this f32 shape. */
static bool is_state(const og_shape *s, const og_op_context *ctx, int k, int64_t layer_id, int32_t rank,
                     const int64_t *dims) {
    if (!s->runtime || ctx->state_layer_id[k] != layer_id || s->rank != rank || s->dtype != OG_DTYPE_F32) return false;
    for (int32_t d = 0; d < rank; d++)
        if (s->dim[d] != dims[d]) return false;
    return true;
}

og_op_check og_op_infer(og_op op, const og_op_attrs *a, const og_shape *in, int32_t n_in,
                        const og_op_context *ctx, og_shape *out, char *why, size_t why_cap) {
    const og_op_info *info = og_op_get(op);
    int64_t n = 0, m = 0, width = 0;
    if (!info) return FAIL(OG_OP_CHECK_ATTR, "unknown op %d", (int)op);
    switch (op) {
    case OG_OP_EMBED:
        if (!is_index_vec(&in[0])) return FAIL(OG_OP_CHECK_OPERAND, "tokens must be [T] i32");
        if (!is_matrix(&in[1])) return FAIL(OG_OP_CHECK_OPERAND, "table must be a [V, H] float or quantized weight");
        width = in[1].dim[1];
        break;
    case OG_OP_RMS_NORM:
        if (!(a->eps > 0)) return FAIL(OG_OP_CHECK_ATTR, "eps must be > 0");
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, N] float activation");
        if (!is_weight(&in[1], 1) || in[1].dim[0] != n)
            return FAIL(OG_OP_CHECK_OPERAND, "weight must be [%lld] (N of x)", (long long)n);
        width = n;
        break;
    case OG_OP_HEAD_RMS_NORM:
        if (!(a->eps > 0)) return FAIL(OG_OP_CHECK_ATTR, "eps must be > 0");
        if (a->heads <= 0) return FAIL(OG_OP_CHECK_ATTR, "heads must be > 0");
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, heads*D] float activation");
        if (!is_weight(&in[1], 1) || in[1].dim[0] > n / a->heads || in[1].dim[0] * a->heads != n)
            return FAIL(OG_OP_CHECK_OPERAND, "weight must be [D] with heads*D == %lld", (long long)n);
        width = n;
        break;
    case OG_OP_MATMUL:
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, K] float activation");
        if (!is_matrix(&in[1]) || in[1].dim[1] != n)
            return FAIL(OG_OP_CHECK_OPERAND, "weight must be [N, K] with K == %lld", (long long)n);
        width = in[1].dim[0];
        /* the kernels read the bias in og_bias_dtype of the weight's dtype */
        if (n_in == 3 && (!is_weight(&in[2], 1) || in[2].dim[0] != width || in[2].dtype != og_bias_dtype(in[1].dtype)))
            return FAIL(OG_OP_CHECK_OPERAND, "bias must be [%lld] (N of weight) of dtype %s", (long long)width,
                        og_dtype_name(og_bias_dtype(in[1].dtype)));
        break;
    case OG_OP_ROPE:
        if (a->heads <= 0 || a->head_dim <= 0 || a->head_dim % 2 != 0)
            return FAIL(OG_OP_CHECK_ATTR, "heads must be > 0 and head_dim even and > 0");
        if (!(a->theta > 0) || !(a->factor > 0)) return FAIL(OG_OP_CHECK_ATTR, "theta and factor must be > 0");
        if (a->rope_type == OG_ROPE_LLAMA3 &&
            (!(a->low_freq_factor > 0) || !(a->high_freq_factor > a->low_freq_factor) ||
             a->original_max_position_embeddings <= 0))
            return FAIL(OG_OP_CHECK_ATTR, "llama3 rope needs 0 < low_freq_factor < high_freq_factor "
                                          "and original_max_position_embeddings > 0");
        if (!is_act(&in[0], &n) || a->heads > n / a->head_dim || a->heads * a->head_dim != n)
            return FAIL(OG_OP_CHECK_OPERAND, "x must be [T, heads*head_dim] with heads %lld, head_dim %lld",
                        (long long)a->heads, (long long)a->head_dim);
        if (!is_index_vec(&in[1])) return FAIL(OG_OP_CHECK_OPERAND, "positions must be [T] i32");
        if (a->rotary_dim < 0 || a->rotary_dim > a->head_dim || a->rotary_dim % 2 != 0)
            return FAIL(OG_OP_CHECK_ATTR, "rotary_dim %lld must be even and in [0, head_dim %lld] (0: all of it)",
                        (long long)a->rotary_dim, (long long)a->head_dim);
        width = n;
        break;
    case OG_OP_CAUSAL_CONV1D: {
        if (a->layer_id < 0) return FAIL(OG_OP_CHECK_ATTR, "layer_id must be >= 0");
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, C] float activation");
        if (!is_weight(&in[1], 2) || in[1].dim[0] != n || in[1].dim[1] < 2)
            return FAIL(OG_OP_CHECK_OPERAND, "weight must be a float [C, K] with C == %lld and kernel K >= 2", (long long)n);
        const int64_t dims[2] = {in[1].dim[1] - 1, n};
        if (!is_state(&in[2], ctx, 2, a->layer_id, 2, dims))
            return FAIL(OG_OP_CHECK_OPERAND, "state must be a runtime state of layer %lld, f32 [%lld, %lld] (K - 1, C)",
                        (long long)a->layer_id, (long long)dims[0], (long long)dims[1]);
        width = n;
        break;
    }
    case OG_OP_GATED_DELTA_NET: {
        if (a->layer_id < 0 || a->k_heads <= 0 || a->v_heads <= 0 || a->k_head_dim <= 0 || a->v_head_dim <= 0 ||
            a->v_heads % a->k_heads != 0 || a->k_heads > OG_MAX_STATE_HEADS || a->v_heads > OG_MAX_STATE_HEADS ||
            a->k_head_dim > OG_MAX_STATE_HEAD_DIM || a->v_head_dim > OG_MAX_STATE_HEAD_DIM)
            return FAIL(OG_OP_CHECK_ATTR,
                        "need layer_id >= 0, k_heads and v_heads in [1, %d] with v_heads %% k_heads == 0, and head "
                        "dims in [1, %d]",
                        OG_MAX_STATE_HEADS, OG_MAX_STATE_HEAD_DIM);
        const int64_t qkv = 2 * a->k_heads * a->k_head_dim + a->v_heads * a->v_head_dim;
        if (!is_act(&in[0], &n) || n != qkv)
            return FAIL(OG_OP_CHECK_OPERAND, "qkv must be [T, %lld] (2 * k_heads * k_head_dim + v_heads * v_head_dim)",
                        (long long)qkv);
        for (int k = 1; k <= 2; k++)
            if (!is_act(&in[k], &m) || m != a->v_heads)
                return FAIL(OG_OP_CHECK_OPERAND, "%s must be [T, %lld] (v_heads)", info->input_names[k],
                            (long long)a->v_heads);
        for (int k = 3; k <= 4; k++)
            if (!is_weight(&in[k], 1) || in[k].dim[0] != a->v_heads)
                return FAIL(OG_OP_CHECK_OPERAND, "%s must be a float [%lld] (v_heads)", info->input_names[k],
                            (long long)a->v_heads);
        const int64_t dims[3] = {a->v_heads, a->k_head_dim, a->v_head_dim};
        if (!is_state(&in[5], ctx, 5, a->layer_id, 3, dims))
            return FAIL(OG_OP_CHECK_OPERAND, "state must be a runtime state of layer %lld, f32 [%lld, %lld, %lld] "
                                             "(v_heads, k_head_dim, v_head_dim)",
                        (long long)a->layer_id, (long long)dims[0], (long long)dims[1], (long long)dims[2]);
        width = a->v_heads * a->v_head_dim;
        break;
    }
    case OG_OP_RMS_NORM_GATED:
        if (!(a->eps > 0)) return FAIL(OG_OP_CHECK_ATTR, "eps must be > 0");
        if (a->heads <= 0) return FAIL(OG_OP_CHECK_ATTR, "heads must be > 0");
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, heads*D] float activation");
        if (!is_act(&in[1], &m) || m != n) return FAIL(OG_OP_CHECK_OPERAND, "z must be [T, %lld] like x", (long long)n);
        if (!is_weight(&in[2], 1) || in[2].dim[0] > n / a->heads || in[2].dim[0] * a->heads != n)
            return FAIL(OG_OP_CHECK_OPERAND, "weight must be [D] with heads*D == %lld", (long long)n);
        width = n;
        break;
    case OG_OP_SIGMOID_MUL:
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "x must be a [T, N] float activation");
        if (!is_act(&in[1], &m) || m != n) return FAIL(OG_OP_CHECK_OPERAND, "gate must be [T, %lld] like x", (long long)n);
        width = n;
        break;
    case OG_OP_UPDATE_AND_ATTEND: {
        if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->head_dim <= 0 || a->n_heads % a->n_kv_heads != 0)
            return FAIL(OG_OP_CHECK_ATTR, "need n_heads, n_kv_heads, head_dim > 0 and n_heads %% n_kv_heads == 0");
        if (!(a->scale >= 0)) return FAIL(OG_OP_CHECK_ATTR, "scale must be >= 0 (0 means 1/sqrt(head_dim))");
        if (!ctx->layer_found)
            return FAIL(OG_OP_CHECK_ATTR, "layer_id %lld is not a KV-manifest layer", (long long)a->layer_id);
        if (ctx->layer_kv_heads != a->n_kv_heads || ctx->layer_head_dim != a->head_dim)
            return FAIL(OG_OP_CHECK_ATTR, "n_kv_heads/head_dim %lld/%lld disagree with the KV manifest (%lld/%lld)",
                        (long long)a->n_kv_heads, (long long)a->head_dim, (long long)ctx->layer_kv_heads,
                        (long long)ctx->layer_head_dim);
        if (a->n_heads > INT32_MAX / a->head_dim || a->n_kv_heads > INT32_MAX / a->head_dim)
            return FAIL(OG_OP_CHECK_ATTR, "heads * head_dim too large");
        int64_t q_w = a->n_heads * a->head_dim, kv_w = a->n_kv_heads * a->head_dim;
        if (!is_act(&in[0], &n) || n != q_w)
            return FAIL(OG_OP_CHECK_OPERAND, "q must be [T, %lld]", (long long)q_w);
        if (!is_act(&in[1], &n) || n != kv_w)
            return FAIL(OG_OP_CHECK_OPERAND, "k must be [T, %lld]", (long long)kv_w);
        if (!is_act(&in[2], &m) || m != kv_w)
            return FAIL(OG_OP_CHECK_OPERAND, "v must be [T, %lld]", (long long)kv_w);
        if (!is_index_vec(&in[3])) return FAIL(OG_OP_CHECK_OPERAND, "positions must be [T] i32");
        for (int c = 0; c < 2; c++) {
            if (!in[4 + c].runtime || ctx->cache_layer_id[c] != a->layer_id || ctx->cache_part[c] != c)
                return FAIL(OG_OP_CHECK_OPERAND, "%s must be the runtime %s tensor of layer %lld",
                            info->input_names[4 + c], c ? "v" : "k", (long long)a->layer_id);
        }
        width = q_w;
        break;
    }
    case OG_OP_SWIGLU:
    case OG_OP_ADD:
        if (!is_act(&in[0], &n)) return FAIL(OG_OP_CHECK_OPERAND, "%s must be a [T, N] float activation", info->input_names[0]);
        if (!is_act(&in[1], &m) || m != n)
            return FAIL(OG_OP_CHECK_OPERAND, "%s must be [T, %lld] like %s", info->input_names[1], (long long)n,
                        info->input_names[0]);
        width = n;
        break;
    case OG_OP_COUNT:
        return FAIL(OG_OP_CHECK_ATTR, "unknown op");
    }
    memset(out, 0, sizeof *out);
    out->rank = 2;
    out->dim[0] = OG_DIM_T;
    out->dim[1] = width;
    out->dtype = ctx->act_dtype;
    return OG_OP_CHECK_OK;
}
