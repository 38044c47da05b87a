/* config.json of Hugging Face checkpoints for the llama, mistral, qwen2,
 * qwen3, the hybrid qwen3_5 (qwen3_5_text) and qwen3_moe families, in both dialects:
 *   transformers 5: "rope_parameters" {rope_theta, rope_type, scaling fields}, "dtype";
 *   transformers 4: top-level "rope_theta", "rope_scaling" {rope_type | type,
 *                   factor, low_freq_factor, high_freq_factor,
 *                   original_max_position_embeddings}, "torch_dtype".
 * Missing optional fields take the transformers class defaults of the
 * family. Every refusal names the file, the field and its value. */
#ifndef OG_IMPORT_HF_CONFIG_H
#define OG_IMPORT_HF_CONFIG_H

#include "offgraph.h"
#include "program/ops.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OG_HF_MAX_LAYERS 1024

typedef enum og_hf_family {
    OG_HF_LLAMA = 0,
    OG_HF_MISTRAL,
    OG_HF_QWEN2,
    OG_HF_QWEN3,
    /* hybrid: Gated DeltaNet (linear attention) layers beside gated full
     * attention ones, (1 + w) RMS norms, partial rotary embeddings */
    OG_HF_QWEN3_5,
    OG_HF_QWEN3_MOE, /* qwen3 attention, mixture-of-experts MLPs */
    OG_HF_QWEN3_5_MOE, /* hybrid (as qwen3_5), every MLP experts with a gated shared expert */
    OG_HF_QWEN3_NEXT,  /* hybrid, fused in_proj_qkvz / in_proj_ba projections, expert MLPs */
    OG_HF_FAMILY_COUNT
} og_hf_family;

/* Rope: default, linear (factor) or llama3 (every field). Fields a type
 * does not use are 0, except factor, which is 1 when unscaled. */
typedef struct og_hf_rope {
    og_rope_type type;
    double theta;
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int64_t original_max_position_embeddings;
} og_hf_rope;

typedef struct og_hf_config {
    og_hf_family family;
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads; /* default: num_attention_heads          */
    int32_t head_dim;            /* default: hidden_size / heads           */
    double rms_norm_eps;
    bool tie_word_embeddings;
    int64_t max_position_embeddings;
    bool qkv_bias;  /* q/k/v projections carry a bias (qwen2 always)      */
    bool o_bias;    /* o projection carries a bias (attention_bias)       */
    bool mlp_bias;  /* gate/up/down carry a bias (llama mlp_bias)         */
    bool qk_norm;   /* per-head RMS norm of q and k (qwen3)               */
    og_hf_rope rope;
    bool has_dtype; /* "dtype" / "torch_dtype" was given                  */
    og_dtype dtype; /* f32, bf16 or f16 when has_dtype                    */
    int32_t sliding_window; /* W of the sliding layers; 0 when none is    */
    uint8_t layer_sliding[OG_HF_MAX_LAYERS]; /* 1: layer i uses the window */
    /* hybrid families (og_hf_is_hybrid) */
    uint8_t layer_linear[OG_HF_MAX_LAYERS]; /* 1: layer i is a Gated DeltaNet layer */
    int32_t n_linear_layers;
    int32_t linear_conv_kernel;  /* linear_conv_kernel_dim                */
    int32_t linear_k_heads, linear_v_heads;       /* linear_num_key/value_heads */
    int32_t linear_k_head_dim, linear_v_head_dim; /* linear_key/value_head_dim  */
    int32_t rotary_dim;     /* head_dim * partial_rotary_factor; head_dim when not partial */
    bool norm_plus_one;     /* RMS norms scale by (1 + w) (the gated norm of a linear layer excepted) */
    bool attn_output_gate;  /* q_proj holds each head's query and its sigmoid output gate */
    /* qwen3_next whose linear layers' projections come split as Qwen3.5
     * stores them (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a): a GGUF
     * qwen3next file, whose converter splits in_proj_qkvz */
    bool split_in_proj;
    int32_t mtp_layers;     /* multi-token prediction layers (mtp_num_hidden_layers), not exported */
    bool nested_text;       /* config.json nests the text model's config in "text_config" */
    /* a vision + text checkpoint's placeholder tokens (image, video, vision
     * start and end): the text model alone cannot take them */
    int32_t n_vision_tokens;
    int64_t vision_tokens[4];
    /* mixture of experts (og_hf_parse_moe): layer i's MLP is num_experts
     * experts of moe_intermediate_size, top num_experts_per_tok, when
     * layer_moe[i]; a dense MLP of intermediate_size otherwise */
    int32_t num_experts;            /* 0: no expert layers                */
    int32_t num_experts_per_tok;
    int64_t moe_intermediate_size;
    int64_t shared_expert_intermediate_size; /* 0: no shared expert       */
    bool norm_topk_prob;            /* renormalise the top-k weights      */
    int32_t n_moe_layers;
    uint8_t layer_moe[OG_HF_MAX_LAYERS];
} og_hf_config;

/* True for the families with Gated DeltaNet layers. */
static inline bool og_hf_is_hybrid(og_hf_family f) {
    return f == OG_HF_QWEN3_5 || f == OG_HF_QWEN3_5_MOE || f == OG_HF_QWEN3_NEXT;
}

/* Parses config.json text (len bytes, need not be NUL-terminated). origin
 * names the text in messages. OG_ERR_FORMAT for malformed or inconsistent
 * fields, OG_ERR_UNSUPPORTED for a valid but unsupported model_type, rope
 * type (only default, linear and llama3 are supported), hidden_act or dtype. */
og_status og_hf_config_parse(const char *text, size_t len, const char *origin, og_hf_config *out);

/* Reads and parses a config.json file. */
og_status og_hf_config_load(const char *path, og_hf_config *out);

/* "llama", "mistral", "qwen2", "qwen3", "qwen3_5", "qwen3_moe"; "unknown" otherwise. Static. */
const char *og_hf_family_name(og_hf_family f);

#endif
