/* The program instruction set: one table row per op with its name, operand
 * counts, attribute names, and a shape rule.
 *
 * Letters: T = step width (the dynamic leading dimension of every
 * activation), V = vocabulary, H = hidden size, N/K = feature widths,
 * F = intermediate size, Hq/Hkv = query/kv heads, D = head dim.
 *
 *   embed             tokens [T] i32, table [V, H]                -> [T, H]
 *   rms_norm          x [T, N], weight [N]                        -> [T, N]
 *   head_rms_norm     x [T, heads*D], weight [D]                  -> [T, heads*D]
 *   matmul            x [T, K], weight [N, K] (, bias [N])        -> [T, N]
 *   rope              x [T, heads*D], positions [T] i32           -> [T, heads*D]
 *   update_and_attend q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D], positions [T] i32,
 *                     k_cache, v_cache (runtime)                  -> [T, Hq*D]
 *   swiglu            gate [T, F], up [T, F]                      -> [T, F]
 *   add               a [T, N], b [T, N]                          -> [T, N]
 *   causal_conv1d     x [T, C], weight [C, K], state [K-1, C] (runtime state) -> [T, C]
 *   gated_delta_net   qkv [T, 2*Hk*Dk + Hv*Dv], a [T, Hv], b [T, Hv], A_log [Hv],
 *                     dt_bias [Hv], state [Hv, Dk, Dv] (runtime state) -> [T, Hv*Dv]
 *   rms_norm_gated    x [T, heads*D], z [T, heads*D], weight [D]  -> [T, heads*D]
 *   sigmoid_mul       x [T, N], gate [T, N]                       -> [T, N]
 * (Hk/Hv = key/value heads and Dk/Dv their dims in a Gated DeltaNet layer;
 * C its convolution's channels, K its kernel size.)
 *   moe               x [T, H], logits [T, E], gate_up [E, 2F, H], down [E, H, F]
 *                     (, shared [T, H], shared_gate [T, 1])       -> [T, H]
 * (E = experts, F = an expert's intermediate size; see og_op_moe below.)
 */
#ifndef OG_PROGRAM_OPS_H
#define OG_PROGRAM_OPS_H

#include "offgraph.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum og_op {
    OG_OP_EMBED = 0,
    OG_OP_RMS_NORM,
    OG_OP_HEAD_RMS_NORM,
    OG_OP_MATMUL,
    OG_OP_ROPE,
    OG_OP_UPDATE_AND_ATTEND,
    OG_OP_SWIGLU,
    OG_OP_ADD,
    OG_OP_CAUSAL_CONV1D,
    OG_OP_GATED_DELTA_NET,
    OG_OP_RMS_NORM_GATED,
    OG_OP_SIGMOID_MUL,
    OG_OP_MOE,
    OG_OP_COUNT
} og_op;

/* Ops that read and write per-session storage (KV or state): they run per
 * session, on every row of the step, before the tail. */
static inline bool og_op_is_stateful(int op) {
    return op == OG_OP_UPDATE_AND_ATTEND || op == OG_OP_CAUSAL_CONV1D || op == OG_OP_GATED_DELTA_NET;
}

#define OG_OP_MAX_INPUTS 6
/* Limits of this build for a Gated DeltaNet layer's heads and head dims. */
#define OG_MAX_STATE_HEADS 4096
#define OG_MAX_STATE_HEAD_DIM 1024
#define OG_OP_MAX_ATTRS 9

#include "core/rope_type.h"

/* "default", "linear", "llama3"; "unknown" otherwise. */
const char *og_rope_type_name(og_rope_type t);
/* false for an unknown name. */
bool og_rope_type_parse(const char *name, og_rope_type *out);

/* The attributes of every op in one struct; each op uses the fields its
 * table row names (the others stay zero). */
typedef struct og_op_attrs {
    double eps;                    /* rms_norm, head_rms_norm                  */
    int64_t heads;                 /* head_rms_norm, rope                      */
    int64_t head_dim;              /* rope, update_and_attend                  */
    double theta;                  /* rope                                     */
    og_rope_type rope_type;        /* rope                                     */
    double factor;                 /* rope scaling                             */
    double low_freq_factor;        /* rope (llama3)                            */
    double high_freq_factor;       /* rope (llama3)                            */
    int64_t original_max_position_embeddings; /* rope (llama3)                 */
    int64_t layer_id;              /* update_and_attend                        */
    int64_t n_heads;               /* update_and_attend: Hq                    */
    int64_t n_kv_heads;            /* update_and_attend: Hkv                   */
    double scale;                  /* update_and_attend: 0 means 1/sqrt(D)     */
    int64_t rotary_dim;            /* rope (optional): dims of each head that rotate; 0 = head_dim */
    int64_t k_heads, v_heads;      /* gated_delta_net: Hk, Hv (Hv % Hk == 0)    */
    int64_t k_head_dim, v_head_dim;/* gated_delta_net: Dk, Dv                  */
    int64_t top_k;                 /* moe: experts per token, 1..E             */
    int64_t norm_topk_prob;        /* moe: 1 renormalises the top_k weights    */
} og_op_attrs;

/* moe: a mixture-of-experts MLP (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next).
 * logits are the router's [T, E] (a matmul of x by the router weight before
 * it). Per row: p = softmax(logits) in f32; the top_k experts by p (larger
 * first, equal p: the lower expert index first); their weights w = p, or
 * p / sum(p) of the top_k when norm_topk_prob; then
 *   out = sum over the selected e, in increasing e, of
 *         w_e * down[e] @ (silu(gate_up[e][:F] @ x) * (gate_up[e][F:] @ x))
 *         (+ sigmoid(shared_gate) * shared)
 * gate_up holds each expert's gate rows then its up rows (Hugging Face's
 * fused layout); down is [E, H, F]. Both are float (f32, bf16, f16) or
 * quantized (q8, q4: a rank-3 quantized tensor is E matrices one after the
 * other, each laid out as a rank-2 one). shared and shared_gate come
 * together: the shared expert's output and its gate's logit. */

typedef enum og_attr_kind {
    OG_ATTR_INT = 0,   /* an integer-valued JSON number, stored as int64_t */
    OG_ATTR_FLOAT,     /* a JSON number, stored as double                  */
    OG_ATTR_ROPE_TYPE  /* a JSON string naming an og_rope_type             */
} og_attr_kind;

typedef struct og_attr_desc {
    const char *name;   /* JSON key inside "attrs"      */
    og_attr_kind kind;
    size_t offset;      /* offsetof(og_op_attrs, field) */
    bool optional;      /* may be absent (then 0); written only when not 0 */
} og_attr_desc;

/* The shape of an activation or tensor during inference. A dim of
 * OG_DIM_T is the symbolic step width. */
#define OG_DIM_T (-1)
#define OG_SHAPE_MAX_RANK 4
typedef struct og_shape {
    int32_t rank;
    int64_t dim[OG_SHAPE_MAX_RANK];
    og_dtype dtype;
    bool runtime; /* a runtime (KV storage) tensor */
} og_shape;

/* Extra facts the shape rule of update_and_attend needs about its cache
 * operands: the KV-manifest layer each runtime operand belongs to. */
typedef struct og_op_context {
    og_dtype act_dtype;        /* dtype of every instruction output          */
    int64_t cache_layer_id[2]; /* layer_id of the k_cache / v_cache operands */
    int32_t cache_part[2];     /* 0 = k, 1 = v, as declared by the tensors   */
    /* the manifest layer with attrs.layer_id: found, Hkv, D */
    bool layer_found;
    int64_t layer_kv_heads, layer_head_dim;
    /* per operand: the layer_id of the manifest state a runtime operand is,
     * -1 for any other operand */
    int64_t state_layer_id[OG_OP_MAX_INPUTS];
} og_op_context;

typedef struct og_op_info {
    const char *name;
    int32_t min_inputs, max_inputs;
    const char *input_names[OG_OP_MAX_INPUTS]; /* for messages */
    int32_t n_attrs;
    og_attr_desc attrs[OG_OP_MAX_ATTRS];
} og_op_info;

/* The table row of op, NULL when op is out of range. Static. */
const og_op_info *og_op_get(og_op op);
/* Finds an op by name; false when unknown. */
bool og_op_parse(const char *name, og_op *out);

/* Result of a shape rule: which rule failed, so the validator can name it. */
typedef enum og_op_check {
    OG_OP_CHECK_OK = 0,
    OG_OP_CHECK_ATTR,    /* an attribute value is out of range   */
    OG_OP_CHECK_OPERAND  /* an operand's shape/dtype/kind misfits */
} og_op_check;

/* Applies op's shape rule to n_in operand shapes (n_in already within the
 * op's min/max). On success *out is the output shape ([T, N], act dtype).
 * On failure writes a reason (naming the operand) into why[why_cap]. */
og_op_check og_op_infer(og_op op, const og_op_attrs *attrs, const og_shape *in, int32_t n_in,
                        const og_op_context *ctx, og_shape *out, char *why, size_t why_cap);

#endif /* OG_PROGRAM_OPS_H */
