/* Which dtype each matrix of an export gets under a weight mix (export.h:
 * og_weight_mix): the k-quant file types of llama.cpp's llama-quantize
 * (Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K), whose choice per tensor is
 * written here from what that tool does for a dense model without an
 * importance matrix, so that an export of a checkpoint and llama-quantize
 * of the same checkpoint give the same type to every tensor (and, the
 * quantizer being the same, the same bytes).
 *
 * The rules, by role (docs/program-format.md has the table):
 *  - the output head (lm_head, or the embedding table when tied): q6_k;
 *  - attn_v (v_proj) and ffn_down (down_proj) of some layers take more
 *    bits: "more bits" are layers i < n/8, i >= 7n/8 and every third layer
 *    between (i - n/8) % 3 == 2;
 *  - attn_output (o_proj) of the q2_k and q3_k mixes take more bits;
 *  - every other matrix takes the mix's type.
 * A matrix whose rows are not whole super-blocks of 256 falls back as the
 * tool falls back: q2_k and q3_k to q4 (its q4_0), q6_k to q8 (q8_0), and
 * q4_k and q5_k to q8 where the tool takes q5_0 / q5_1, which offgraph does
 * not have; rows not whole groups of 32 stay in the program's dtype. The q8
 * and q4 quantizer is offgraph's own, so those fallbacks are not the
 * tool's bytes. */
#include "core/core.h"
#include "import/export.h"

#include <stdio.h>
#include <string.h>

static const char *const k_names[OG_MIX_COUNT] = {
    [OG_MIX_NONE] = "none",     [OG_MIX_AS_STORED] = "as-stored", [OG_MIX_Q2_K] = "q2_k",
    [OG_MIX_Q3_K_S] = "q3_k_s", [OG_MIX_Q3_K_M] = "q3_k_m",       [OG_MIX_Q3_K_L] = "q3_k_l",
    [OG_MIX_Q4_K_S] = "q4_k_s", [OG_MIX_Q4_K_M] = "q4_k_m",       [OG_MIX_Q5_K_S] = "q5_k_s",
    [OG_MIX_Q5_K_M] = "q5_k_m", [OG_MIX_Q6_K] = "q6_k",
};

const char *og_weight_mix_name(og_weight_mix mix) {
    return (unsigned)mix < OG_MIX_COUNT ? k_names[mix] : "unknown";
}

og_status og_weight_mix_parse(const char *name, og_weight_mix *out) {
    for (int i = OG_MIX_Q2_K; name && i < OG_MIX_COUNT; i++)
        if (!strcmp(name, k_names[i])) {
            *out = (og_weight_mix)i;
            return OG_OK;
        }
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "weight mix \"%s\" is not one of q2_k, q3_k_s, q3_k_m, q3_k_l, "
                        "q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k", name ? name : "");
}

og_dtype og_weight_mix_default(og_weight_mix mix) {
    switch (mix) {
    case OG_MIX_Q2_K: return OG_DTYPE_Q2_K;
    case OG_MIX_Q3_K_S:
    case OG_MIX_Q3_K_M:
    case OG_MIX_Q3_K_L: return OG_DTYPE_Q3_K;
    case OG_MIX_Q4_K_S:
    case OG_MIX_Q4_K_M: return OG_DTYPE_Q4_K;
    case OG_MIX_Q5_K_S:
    case OG_MIX_Q5_K_M: return OG_DTYPE_Q5_K;
    case OG_MIX_Q6_K: return OG_DTYPE_Q6_K;
    default: return OG_DTYPE_COUNT;
    }
}

typedef enum { ROLE_OTHER, ROLE_EMBED, ROLE_HEAD, ROLE_Q, ROLE_K, ROLE_V, ROLE_O, ROLE_GATE, ROLE_UP, ROLE_DOWN } role;

/* The role and layer of a matrix by its Hugging Face name. */
static role role_of(const char *name, bool tied, int *layer) {
    *layer = -1;
    if (!strcmp(name, "lm_head.weight")) return ROLE_HEAD;
    if (!strcmp(name, "model.embed_tokens.weight")) return tied ? ROLE_HEAD : ROLE_EMBED;
    static const struct {
        const char *suffix;
        role r;
    } k[] = {{"self_attn.q_proj.weight", ROLE_Q}, {"self_attn.k_proj.weight", ROLE_K},
             {"self_attn.v_proj.weight", ROLE_V}, {"self_attn.o_proj.weight", ROLE_O},
             {"mlp.gate_proj.weight", ROLE_GATE}, {"mlp.up_proj.weight", ROLE_UP},
             {"mlp.down_proj.weight", ROLE_DOWN}};
    int i, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &i, &used) != 1 || used == 0) return ROLE_OTHER;
    for (size_t j = 0; j < sizeof k / sizeof k[0]; j++)
        if (!strcmp(name + used, k[j].suffix)) {
            *layer = i;
            return k[j].r;
        }
    return ROLE_OTHER;
}

static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

og_dtype og_weight_mix_dtype(og_weight_mix mix, const og_hf_config *c, const char *name, int64_t K,
                             og_dtype float_dtype) {
    const og_dtype base = og_weight_mix_default(mix);
    if (base == OG_DTYPE_COUNT) return float_dtype;
    int i;
    const role r = role_of(name, c->tie_word_embeddings, &i);
    const int n = c->num_hidden_layers;
    og_dtype t = base;
    if (r == ROLE_HEAD) {
        t = K % OG_KQUANT_BLOCK ? OG_DTYPE_Q8 : OG_DTYPE_Q6_K;
    } else if (r == ROLE_V) {
        const int64_t gqa = c->num_key_value_heads > 0 ? c->num_attention_heads / c->num_key_value_heads : 1;
        switch (mix) {
        case OG_MIX_Q2_K: t = gqa >= 4 ? OG_DTYPE_Q4_K : OG_DTYPE_Q3_K; break;
        case OG_MIX_Q3_K_M: t = i < 2 ? OG_DTYPE_Q5_K : OG_DTYPE_Q4_K; break;
        case OG_MIX_Q3_K_L: t = OG_DTYPE_Q5_K; break;
        case OG_MIX_Q4_K_M:
        case OG_MIX_Q5_K_M:
            if (more_bits(i, n)) t = OG_DTYPE_Q6_K;
            break;
        case OG_MIX_Q4_K_S:
            if (i < 4) t = OG_DTYPE_Q5_K;
            break;
        default: break;
        }
        /* the tool's "70B" (a Llama of 80 layers with grouped KV heads, any
         * Qwen2 of 80 layers): v shared by several query heads is worth
         * more bits */
        const bool is_70b = n == 80 && (c->family == OG_HF_QWEN2 ||
                                        ((c->family == OG_HF_LLAMA || c->family == OG_HF_MISTRAL) &&
                                         c->num_attention_heads != c->num_key_value_heads));
        if (is_70b && (t == OG_DTYPE_Q3_K || t == OG_DTYPE_Q4_K)) t = OG_DTYPE_Q5_K;
    } else if (r == ROLE_DOWN) {
        switch (mix) {
        case OG_MIX_Q2_K: t = OG_DTYPE_Q3_K; break;
        case OG_MIX_Q3_K_M: t = i < n / 16 ? OG_DTYPE_Q5_K : OG_DTYPE_Q4_K; break;
        case OG_MIX_Q3_K_L: t = OG_DTYPE_Q5_K; break;
        case OG_MIX_Q4_K_M:
        case OG_MIX_Q5_K_M:
            if (more_bits(i, n)) t = OG_DTYPE_Q6_K;
            break;
        case OG_MIX_Q4_K_S:
            if (i < n / 8) t = OG_DTYPE_Q5_K;
            break;
        default: break;
        }
    } else if (r == ROLE_O) {
        if (mix == OG_MIX_Q2_K) t = OG_DTYPE_Q3_K;
        else if (mix == OG_MIX_Q3_K_M) t = OG_DTYPE_Q4_K;
        else if (mix == OG_MIX_Q3_K_L) t = OG_DTYPE_Q5_K;
    }
    return og_kquant_fallback(t, K, float_dtype);
}

og_dtype og_kquant_fallback(og_dtype t, int64_t K, og_dtype float_dtype) {
    if (!og_dtype_is_quantized(t) || K % og_quant_block_elems(t) == 0) return t;
    if (og_dtype_is_kquant(t)) t = t == OG_DTYPE_Q2_K || t == OG_DTYPE_Q3_K ? OG_DTYPE_Q4 : OG_DTYPE_Q8;
    return K % OG_QUANT_GROUP ? float_dtype : t;
}
