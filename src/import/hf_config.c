/* config.json reader for llama, mistral, qwen2, qwen3, qwen3_5 and qwen3_moe checkpoints. */
#include "import/hf_config.h"

#include "core/core.h"
#include "core/textfile.h"
#include "program/program.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

static const char *const k_family_names[OG_HF_FAMILY_COUNT] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_5",
                                                                "qwen3_moe", "qwen3_5_moe", "qwen3_next"};
static const char *const k_architectures[OG_HF_FAMILY_COUNT] = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"};
/* Other names of a family: the text model's model_type, and the
 * conditional-generation (vision + text) checkpoint's architecture. */
static const struct {
    const char *name;
    og_hf_family family;
} k_aliases[] = {{"qwen3_5_text", OG_HF_QWEN3_5},
                 {"Qwen3_5ForConditionalGeneration", OG_HF_QWEN3_5},
                 {"qwen3_5_moe_text", OG_HF_QWEN3_5_MOE},
                 {"Qwen3_5MoeForConditionalGeneration", OG_HF_QWEN3_5_MOE}};

const char *og_hf_family_name(og_hf_family f) {
    return (unsigned)f < OG_HF_FAMILY_COUNT ? k_family_names[f] : "unknown";
}

/* Parsing context: where messages point. */
typedef struct ctx {
    const char *origin;
    const cJSON *root;
} ctx;

/* The JSON text of a value, shortened to fit buf. */
static const char *show(const cJSON *v, char *buf, size_t cap) {
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    snprintf(buf, cap, "%s", s ? s : "?");
    if (s) cJSON_free(s);
    if (strlen(buf) == cap - 1 && cap > 4) memcpy(buf + cap - 4, "...", 4);
    return buf;
}

static og_status bad(const ctx *c, og_status st, const char *field, const cJSON *v, const char *why) {
    char buf[96];
    return og_set_error(st, "%s: field \"%s\" = %s: %s", c->origin, field, show(v, buf, sizeof buf), why);
}

/* A present, non-null item of obj, or NULL. */
static const cJSON *item(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Integer field in [lo, hi]; when absent, def (or an error if required). */
static og_status get_int(const ctx *c, const cJSON *obj, const char *key, const char *field, bool required,
                         int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = item(obj, key);
    if (!v) {
        if (required) return og_set_error(OG_ERR_FORMAT, "%s: required field \"%s\" is missing", c->origin, field);
        *out = def;
        return OG_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi) {
        char why[96];
        snprintf(why, sizeof why, "must be an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return bad(c, OG_ERR_FORMAT, field, v, why);
    }
    *out = (int64_t)v->valuedouble;
    return OG_OK;
}

static og_status get_i32(const ctx *c, const char *key, bool required, int64_t def, int64_t hi, int32_t *out) {
    int64_t v;
    og_status rc = get_int(c, c->root, key, key, required, def, 1, hi, &v);
    if (rc == OG_OK) *out = (int32_t)v;
    return rc;
}

/* Positive finite number field; def when absent. */
static og_status get_pos_double(const ctx *c, const cJSON *obj, const char *key, const char *field,
                                bool required, double def, double *out) {
    const cJSON *v = item(obj, key);
    if (!v) {
        if (required) return og_set_error(OG_ERR_FORMAT, "%s: required field \"%s\" is missing", c->origin, field);
        *out = def;
        return OG_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0.0)
        return bad(c, OG_ERR_FORMAT, field, v, "must be a positive number");
    *out = v->valuedouble;
    return OG_OK;
}

static og_status get_bool(const ctx *c, const char *key, bool def, bool *out) {
    const cJSON *v = item(c->root, key);
    if (!v) {
        *out = def;
        return OG_OK;
    }
    if (!cJSON_IsBool(v)) return bad(c, OG_ERR_FORMAT, key, v, "must be true or false");
    *out = cJSON_IsTrue(v);
    return OG_OK;
}

static og_status parse_family(const ctx *c, og_hf_family *out) {
    const cJSON *mt = item(c->root, "model_type");
    if (mt) {
        if (!cJSON_IsString(mt)) return bad(c, OG_ERR_FORMAT, "model_type", mt, "must be a string");
        for (int f = 0; f < OG_HF_FAMILY_COUNT; f++)
            if (!strcmp(mt->valuestring, k_family_names[f])) {
                *out = (og_hf_family)f;
                return OG_OK;
            }
        for (size_t i = 0; i < sizeof k_aliases / sizeof k_aliases[0]; i++)
            if (!strcmp(mt->valuestring, k_aliases[i].name)) {
                *out = k_aliases[i].family;
                return OG_OK;
            }
        return bad(c, OG_ERR_UNSUPPORTED, "model_type", mt,
                   "not supported (llama, mistral, qwen2, qwen3, qwen3_5 / qwen3_5_text, qwen3_moe, qwen3_5_moe / qwen3_5_moe_text, qwen3_next)");
    }
    const cJSON *arch = item(c->root, "architectures");
    if (!arch)
        return og_set_error(OG_ERR_FORMAT, "%s: neither \"model_type\" nor \"architectures\" is given", c->origin);
    const cJSON *a0 = cJSON_IsArray(arch) ? arch->child : NULL;
    if (!a0 || !cJSON_IsString(a0)) return bad(c, OG_ERR_FORMAT, "architectures", arch, "must be a list of names");
    for (int f = 0; f < OG_HF_FAMILY_COUNT; f++)
        if (!strcmp(a0->valuestring, k_architectures[f])) {
            *out = (og_hf_family)f;
            return OG_OK;
        }
    for (size_t i = 0; i < sizeof k_aliases / sizeof k_aliases[0]; i++)
        if (!strcmp(a0->valuestring, k_aliases[i].name)) {
            *out = k_aliases[i].family;
            return OG_OK;
        }
    return bad(c, OG_ERR_UNSUPPORTED, "architectures", arch,
               "not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
               "Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM)");
}

/* Rope: transformers 5 "rope_parameters" when present, else the
 * transformers 4 "rope_theta" + "rope_scaling". */
static og_status parse_rope(const ctx *c, og_hf_rope *rope) {
    const cJSON *params = item(c->root, "rope_parameters");
    const char *group = params ? "rope_parameters" : "rope_scaling";
    const cJSON *scaling = params ? params : item(c->root, "rope_scaling");
    char field[64];
    og_status rc;
    memset(rope, 0, sizeof *rope);
    rope->type = OG_ROPE_DEFAULT;
    rope->factor = 1.0;
    if (params) {
        if (!cJSON_IsObject(params)) return bad(c, OG_ERR_FORMAT, "rope_parameters", params, "must be an object");
        rc = get_pos_double(c, params, "rope_theta", "rope_parameters.rope_theta", false, 10000.0, &rope->theta);
    } else {
        rc = get_pos_double(c, c->root, "rope_theta", "rope_theta", false, 10000.0, &rope->theta);
    }
    if (rc != OG_OK) return rc;
    if (!scaling) return OG_OK;
    if (!cJSON_IsObject(scaling)) return bad(c, OG_ERR_FORMAT, group, scaling, "must be an object or null");
    const char *key = "rope_type";
    const cJSON *t = item(scaling, key);
    if (!t && !params) t = item(scaling, key = "type");
    snprintf(field, sizeof field, "%s.%s", group, key);
    if (!t) {
        if (params) return OG_OK; /* rope_parameters without a type: default */
        return og_set_error(OG_ERR_FORMAT, "%s: required field \"rope_scaling.rope_type\" is missing", c->origin);
    }
    if (!cJSON_IsString(t)) return bad(c, OG_ERR_FORMAT, field, t, "must be a string");
    if (!strcmp(t->valuestring, "default")) return OG_OK;
    bool linear = !strcmp(t->valuestring, "linear");
    if (!linear && strcmp(t->valuestring, "llama3"))
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "%s: field \"%s.rope_type\" = \"%s\": not supported (default, linear, llama3)",
                            c->origin, group, t->valuestring);
    rope->type = linear ? OG_ROPE_LINEAR : OG_ROPE_LLAMA3;
    static const char *const names[3] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *dst[3] = {&rope->factor, &rope->low_freq_factor, &rope->high_freq_factor};
    for (int i = 0; i < (linear ? 1 : 3); i++) {
        snprintf(field, sizeof field, "%s.%s", group, names[i]);
        if ((rc = get_pos_double(c, scaling, names[i], field, true, 0.0, dst[i])) != OG_OK) return rc;
    }
    if (linear) return OG_OK;
    snprintf(field, sizeof field, "%s.original_max_position_embeddings", group);
    if ((rc = get_int(c, scaling, "original_max_position_embeddings", field, true, 0, 1, INT32_MAX,
                      &rope->original_max_position_embeddings)) != OG_OK)
        return rc;
    if (rope->high_freq_factor <= rope->low_freq_factor) {
        snprintf(field, sizeof field, "%s.high_freq_factor", group);
        return bad(c, OG_ERR_FORMAT, field, item(scaling, "high_freq_factor"), "must exceed low_freq_factor");
    }
    return OG_OK;
}

static og_status parse_dtype(const ctx *c, og_hf_config *cfg) {
    const char *key = "dtype";
    const cJSON *v = item(c->root, key);
    if (!v) v = item(c->root, key = "torch_dtype");
    if (!v) return OG_OK;
    if (!cJSON_IsString(v)) return bad(c, OG_ERR_FORMAT, key, v, "must be a string");
    static const struct {
        const char *name;
        og_dtype dt;
    } names[] = {{"bfloat16", OG_DTYPE_BF16}, {"float16", OG_DTYPE_F16}, {"float32", OG_DTYPE_F32}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v->valuestring, names[i].name)) {
            cfg->has_dtype = true;
            cfg->dtype = names[i].dt;
            return OG_OK;
        }
    return bad(c, OG_ERR_UNSUPPORTED, key, v, "not supported (bfloat16, float16, float32)");
}

/* Which layers use a sliding window, following transformers: an explicit
 * "layer_types" list wins; otherwise mistral slides every layer when
 * sliding_window is set, and qwen2/qwen3 slide layers >= max_window_layers
 * when use_sliding_window is true. llama never slides. */
static og_status parse_sliding(const ctx *c, og_hf_config *cfg) {
    og_status rc;
    int64_t window = 0;
    bool family_slides = cfg->family != OG_HF_LLAMA;
    bool use = cfg->family == OG_HF_MISTRAL;
    if (cfg->family == OG_HF_QWEN2 || cfg->family == OG_HF_QWEN3 || cfg->family == OG_HF_QWEN3_MOE)
        if ((rc = get_bool(c, "use_sliding_window", false, &use)) != OG_OK) return rc;
    if (family_slides) {
        /* absent: the class default 4096; null: no window */
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window");
        if (!sw || !cJSON_IsNull(sw))
            if ((rc = get_int(c, c->root, "sliding_window", "sliding_window", false, 4096, 1, INT32_MAX,
                              &window)) != OG_OK)
                return rc;
        if (!use) window = 0;
    }
    cfg->sliding_window = (int32_t)window;
    const int32_t n = cfg->num_hidden_layers;
    const cJSON *lt = item(c->root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n) {
            char why[64];
            snprintf(why, sizeof why, "must be a list of %d layer types", n);
            return bad(c, OG_ERR_FORMAT, "layer_types", lt, why);
        }
        int32_t i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            char field[32];
            snprintf(field, sizeof field, "layer_types[%d]", i);
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")) {
                cfg->layer_sliding[i] = 0;
            } else if (cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")) {
                if (window == 0)
                    return bad(c, OG_ERR_FORMAT, field, e,
                               "a sliding layer, but no sliding_window is in effect (null, or "
                               "use_sliding_window false)");
                cfg->layer_sliding[i] = 1;
            } else {
                return bad(c, OG_ERR_FORMAT, field, e, "must be \"full_attention\" or \"sliding_attention\"");
            }
        }
        return OG_OK;
    }
    int64_t first_sliding = 0;
    if ((cfg->family == OG_HF_QWEN2 || cfg->family == OG_HF_QWEN3 || cfg->family == OG_HF_QWEN3_MOE) &&
        (rc = get_int(c, c->root, "max_window_layers", "max_window_layers", false, 28, 0, INT32_MAX,
                      &first_sliding)) != OG_OK)
        return rc;
    for (int32_t i = 0; i < n; i++) cfg->layer_sliding[i] = window > 0 && i >= first_sliding;
    return OG_OK;
}

/* The expert layers, following transformers' Qwen3-MoE / Qwen3-Next: layer
 * i is sparse when it is not in mlp_only_layers and (i + 1) is a multiple
 * of decoder_sparse_step; the rest keep a dense MLP. Missing fields take
 * the Qwen3MoeConfig defaults (128 experts, top 8, moe_intermediate_size
 * 768, norm_topk_prob false, step 1, no mlp_only_layers);
 * shared_expert_intermediate_size (Qwen3.5-MoE, Qwen3-Next) is 0 when
 * absent. Hybrid families call this too (Qwen3.5-MoE always renormalises:
 * it sets norm_topk_prob after). */
static og_status parse_moe(const ctx *c, og_hf_config *cfg) {
    og_status rc;
    int64_t step = 1, shared = 0;
    /* transformers 5 writes num_local_experts (its attribute map's name) */
    const char *ne = item(c->root, "num_experts") || !item(c->root, "num_local_experts") ? "num_experts" : "num_local_experts";
    if ((rc = get_i32(c, ne, false, 128, OG_MAX_EXPERTS, &cfg->num_experts)) ||
        (rc = get_i32(c, "num_experts_per_tok", false, 8, cfg->num_experts, &cfg->num_experts_per_tok)) ||
        (rc = get_int(c, c->root, "moe_intermediate_size", "moe_intermediate_size", false, 768, 1,
                      OG_MAX_INTERMEDIATE, &cfg->moe_intermediate_size)) ||
        (rc = get_int(c, c->root, "shared_expert_intermediate_size", "shared_expert_intermediate_size", false, 0, 0,
                      OG_MAX_INTERMEDIATE, &shared)) ||
        (rc = get_int(c, c->root, "decoder_sparse_step", "decoder_sparse_step", false, 1, 1, INT32_MAX, &step)) ||
        (rc = get_bool(c, "norm_topk_prob", false, &cfg->norm_topk_prob)))
        return rc;
    if (cfg->num_experts_per_tok > 64)
        return bad(c, OG_ERR_UNSUPPORTED, "num_experts_per_tok", item(c->root, "num_experts_per_tok"),
                   "more experts per token than this build supports (64)");
    cfg->shared_expert_intermediate_size = shared;
    const int32_t n = cfg->num_hidden_layers;
    for (int32_t i = 0; i < n; i++) cfg->layer_moe[i] = (i + 1) % step == 0;
    const cJSON *only = item(c->root, "mlp_only_layers");
    if (only) {
        if (!cJSON_IsArray(only)) return bad(c, OG_ERR_FORMAT, "mlp_only_layers", only, "must be a list of layer indices");
        for (const cJSON *e = only->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                e->valuedouble >= n) {
                char why[64];
                snprintf(why, sizeof why, "must hold layer indices in [0, %d)", n);
                return bad(c, OG_ERR_FORMAT, "mlp_only_layers", only, why);
            }
            cfg->layer_moe[(int32_t)e->valuedouble] = 0;
        }
    }
    cfg->n_moe_layers = 0;
    for (int32_t i = 0; i < n; i++) cfg->n_moe_layers += cfg->layer_moe[i];
    return OG_OK;
}

/* The hybrid families' layers and Gated DeltaNet geometry, following
 * transformers: an explicit "layer_types" of "linear_attention" and
 * "full_attention" wins; otherwise every full_attention_interval-th layer
 * (default 4) is full attention. Sizes default to the config class's. */
static og_status parse_hybrid(const ctx *c, og_hf_config *cfg) {
    og_status rc;
    const int32_t n = cfg->num_hidden_layers;
    const cJSON *lt = item(c->root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n) {
            char why[64];
            snprintf(why, sizeof why, "must be a list of %d layer types", n);
            return bad(c, OG_ERR_FORMAT, "layer_types", lt, why);
        }
        int32_t i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            char field[32];
            snprintf(field, sizeof field, "layer_types[%d]", i);
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "linear_attention"))
                cfg->layer_linear[i] = 1;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention"))
                cfg->layer_linear[i] = 0;
            else
                return bad(c, OG_ERR_UNSUPPORTED, field, e, "must be \"linear_attention\" or \"full_attention\"");
        }
    } else {
        int64_t every = 4;
        if ((rc = get_int(c, c->root, "full_attention_interval", "full_attention_interval", false, 4, 1, INT32_MAX,
                          &every)))
            return rc;
        for (int32_t i = 0; i < n; i++) cfg->layer_linear[i] = (i + 1) % every != 0;
    }
    for (int32_t i = 0; i < n; i++) cfg->n_linear_layers += cfg->layer_linear[i];
    if ((rc = get_i32(c, "linear_conv_kernel_dim", false, 4, 64, &cfg->linear_conv_kernel)) ||
        (rc = get_i32(c, "linear_key_head_dim", false, 128, OG_MAX_STATE_HEAD_DIM, &cfg->linear_k_head_dim)) ||
        (rc = get_i32(c, "linear_value_head_dim", false, 128, OG_MAX_STATE_HEAD_DIM, &cfg->linear_v_head_dim)) ||
        (rc = get_i32(c, "linear_num_key_heads", false, 16, OG_MAX_STATE_HEADS, &cfg->linear_k_heads)) ||
        (rc = get_i32(c, "linear_num_value_heads", false, 32, OG_MAX_STATE_HEADS, &cfg->linear_v_heads)))
        return rc;
    if (cfg->linear_conv_kernel < 2)
        return bad(c, OG_ERR_FORMAT, "linear_conv_kernel_dim", item(c->root, "linear_conv_kernel_dim"), "must be >= 2");
    if (cfg->linear_v_heads % cfg->linear_k_heads)
        return bad(c, OG_ERR_FORMAT, "linear_num_value_heads", item(c->root, "linear_num_value_heads"),
                   "must be a multiple of linear_num_key_heads");
    /* partial rotary embeddings: rope_parameters' partial_rotary_factor, or
     * the top-level one (transformers 4), 0.25 by default */
    const cJSON *params = item(c->root, "rope_parameters");
    const cJSON *prf = params && cJSON_IsObject(params) ? item(params, "partial_rotary_factor") : NULL;
    const char *prf_field = prf ? "rope_parameters.partial_rotary_factor" : "partial_rotary_factor";
    if (!prf) prf = item(c->root, "partial_rotary_factor");
    double factor = 0.25;
    if (prf) {
        if (!cJSON_IsNumber(prf) || !(prf->valuedouble > 0) || prf->valuedouble > 1)
            return bad(c, OG_ERR_FORMAT, prf_field, prf, "must be a number in (0, 1]");
        factor = prf->valuedouble;
    }
    cfg->rotary_dim = (int32_t)(cfg->head_dim * factor); /* transformers: int(head_dim * factor) */
    if (cfg->rotary_dim < 2 || cfg->rotary_dim % 2)
        return bad(c, OG_ERR_FORMAT, prf_field, prf, "gives an odd or empty rotary dimension (head_dim x factor)");
    int64_t mtp = 0;
    if ((rc = get_int(c, c->root, "mtp_num_hidden_layers", "mtp_num_hidden_layers", false, 0, 0, INT32_MAX, &mtp)))
        return rc;
    cfg->mtp_layers = (int32_t)mtp;
    cfg->norm_plus_one = true;
    cfg->attn_output_gate = true;
    cfg->qk_norm = true;
    return OG_OK;
}

static og_status parse_root(const ctx *c, og_hf_config *cfg) {
    og_status rc;
    memset(cfg, 0, sizeof *cfg);
    if ((rc = parse_family(c, &cfg->family)) != OG_OK) return rc;
    const cJSON *act = item(c->root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return bad(c, OG_ERR_UNSUPPORTED, "hidden_act", act, "not supported (silu)");
    int64_t v;
    /* dimensions within this build's limits (program/program.h), checked
     * before anything is sized from them */
    if ((rc = get_int(c, c->root, "vocab_size", "vocab_size", true, 0, 1, OG_MAX_VOCAB, &cfg->vocab_size)) ||
        (rc = get_int(c, c->root, "hidden_size", "hidden_size", true, 0, 1, OG_MAX_HIDDEN, &cfg->hidden_size)) ||
        /* qwen3_moe: only its dense layers use it (the class default 6144) */
        (rc = get_int(c, c->root, "intermediate_size", "intermediate_size",
                      cfg->family != OG_HF_QWEN3_MOE && cfg->family != OG_HF_QWEN3_5_MOE &&
                          cfg->family != OG_HF_QWEN3_NEXT,
                      6144, 1,
                      OG_MAX_INTERMEDIATE, &cfg->intermediate_size)) ||
        (rc = get_i32(c, "num_hidden_layers", true, 0, INT32_MAX, &cfg->num_hidden_layers)))
        return rc;
    if (cfg->num_hidden_layers > OG_HF_MAX_LAYERS)
        return bad(c, OG_ERR_UNSUPPORTED, "num_hidden_layers", item(c->root, "num_hidden_layers"),
                   "more layers than this build supports (1024)");
    if ((rc = get_i32(c, "num_attention_heads", true, 0, OG_MAX_HEADS, &cfg->num_attention_heads)) ||
        (rc = get_i32(c, "num_key_value_heads", false, cfg->num_attention_heads, OG_MAX_HEADS,
                      &cfg->num_key_value_heads)))
        return rc;
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return bad(c, OG_ERR_FORMAT, "num_key_value_heads", item(c->root, "num_key_value_heads"),
                   "must divide num_attention_heads");
    const cJSON *hd = item(c->root, "head_dim");
    if (!hd && cfg->hidden_size % cfg->num_attention_heads)
        return bad(c, OG_ERR_FORMAT, "num_attention_heads", item(c->root, "num_attention_heads"),
                   "must divide hidden_size when head_dim is not given");
    if ((rc = get_i32(c, "head_dim", false, cfg->hidden_size / cfg->num_attention_heads, OG_MAX_HEAD_DIM,
                      &cfg->head_dim)))
        return rc;
    if (cfg->head_dim > OG_MAX_HEAD_DIM) /* only when derived: a given head_dim is bounded above */
        return bad(c, OG_ERR_FORMAT, "num_attention_heads", item(c->root, "num_attention_heads"),
                   "gives hidden_size / num_attention_heads over this build's head_dim limit 65536");
    if ((int64_t)cfg->num_attention_heads * cfg->head_dim > OG_MAX_ATTN_WIDTH) {
        char why[96];
        snprintf(why, sizeof why, "times head_dim %d is over this build's limit %lld", cfg->head_dim,
                 (long long)OG_MAX_ATTN_WIDTH);
        return bad(c, OG_ERR_FORMAT, "num_attention_heads", item(c->root, "num_attention_heads"), why);
    }
    if (cfg->head_dim % 2) return bad(c, OG_ERR_FORMAT, "head_dim", hd, "must be even for rotary embeddings");
    if ((rc = get_pos_double(c, c->root, "rms_norm_eps", "rms_norm_eps", false, 1e-6, &cfg->rms_norm_eps)) ||
        (rc = get_bool(c, "tie_word_embeddings", false, &cfg->tie_word_embeddings)))
        return rc;
    static const int64_t default_max_pos[OG_HF_FAMILY_COUNT] = {2048, 131072, 32768, 32768, 32768, 32768, 32768, 32768};
    if ((rc = get_int(c, c->root, "max_position_embeddings", "max_position_embeddings", false,
                      default_max_pos[cfg->family], 1, INT32_MAX, &v)))
        return rc;
    cfg->max_position_embeddings = v;
    bool attention_bias = false;
    if (cfg->family != OG_HF_MISTRAL && cfg->family != OG_HF_QWEN2 &&
        (rc = get_bool(c, "attention_bias", false, &attention_bias)))
        return rc;
    cfg->qkv_bias = attention_bias || cfg->family == OG_HF_QWEN2;
    cfg->o_bias = attention_bias;
    if (cfg->family == OG_HF_LLAMA && (rc = get_bool(c, "mlp_bias", false, &cfg->mlp_bias))) return rc;
    cfg->qk_norm = cfg->family == OG_HF_QWEN3 || cfg->family == OG_HF_QWEN3_MOE;
    if ((rc = parse_rope(c, &cfg->rope)) || (rc = parse_dtype(c, cfg))) return rc;
    cfg->rotary_dim = cfg->head_dim;
    if ((rc = og_hf_is_hybrid(cfg->family) ? parse_hybrid(c, cfg) : parse_sliding(c, cfg))) return rc;
    if (cfg->family == OG_HF_QWEN3_MOE || cfg->family == OG_HF_QWEN3_NEXT) return parse_moe(c, cfg);
    if (cfg->family == OG_HF_QWEN3_5_MOE) { /* every layer sparse; its router always renormalises the top k */
        if ((rc = parse_moe(c, cfg))) return rc;
        cfg->norm_topk_prob = true;
    }
    return OG_OK;
}

og_status og_hf_config_parse(const char *text, size_t len, const char *origin, og_hf_config *out) {
    if (!out || (!text && len)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "hf config: NULL argument");
    if (!origin) origin = "config.json";
    cJSON *root = cJSON_ParseWithLength(text ? text : "", len);
    if (!root) return og_set_error(OG_ERR_FORMAT, "%s: not valid JSON", origin);
    og_status rc;
    if (!cJSON_IsObject(root)) {
        rc = og_set_error(OG_ERR_FORMAT, "%s: not a JSON object", origin);
    } else {
        ctx c = {origin, root};
        og_hf_family family;
        const cJSON *nested = item(root, "text_config");
        if (nested && cJSON_IsObject(nested) && parse_family(&c, &family) == OG_OK && og_hf_is_hybrid(family)) {
            /* a vision + text checkpoint: the text model's config is nested;
             * what it lacks the outer config may say (tie_word_embeddings, dtype) */
            char inner[512];
            snprintf(inner, sizeof inner, "%s (text_config)", origin);
            ctx tc = {inner, nested};
            rc = parse_root(&tc, out);
            if (rc == OG_OK) {
                out->nested_text = true;
                static const char *const vision[4] = {"image_token_id", "video_token_id", "vision_start_token_id",
                                                      "vision_end_token_id"};
                for (int i = 0; i < 4 && rc == OG_OK; i++) {
                    int64_t id = -1;
                    rc = get_int(&c, root, vision[i], vision[i], false, -1, 0, OG_MAX_VOCAB, &id);
                    if (rc == OG_OK && id >= 0 && id < out->vocab_size) out->vision_tokens[out->n_vision_tokens++] = id;
                }
                if (!item(nested, "tie_word_embeddings")) rc = get_bool(&c, "tie_word_embeddings", false, &out->tie_word_embeddings);
                if (rc == OG_OK && !out->has_dtype) rc = parse_dtype(&c, out);
            }
        } else {
            rc = parse_root(&c, out);
        }
    }
    cJSON_Delete(root);
    return rc;
}

og_status og_hf_config_load(const char *path, og_hf_config *out) {
    char *text = NULL;
    size_t len = 0;
    og_status rc = og_read_text_file(path, &text, &len);
    if (rc != OG_OK) return rc;
    rc = og_hf_config_parse(text, len, path, out);
    og_free(text);
    return rc;
}
