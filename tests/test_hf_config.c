/* config.json reader: both dialects give the same values; layer types per
 * transformers' rules; llama3 rope fields; every refusal names the field
 * and its value. Expected values are written by hand from the JSON. */
#include "harness.h"
#include "import/hf_config.h"
#include "program/program.h"

#include <stdio.h>
#include <string.h>

static og_status parse(const char *json, og_hf_config *c) {
    return og_hf_config_parse(json, strlen(json), "cfg.json", c);
}

/* transformers 5 and transformers 4 spellings of one llama 3 model */
static const char *k_llama_v5 =
    "{\"model_type\":\"llama\",\"vocab_size\":128,\"hidden_size\":64,\"intermediate_size\":96,"
    "\"num_hidden_layers\":3,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":8192,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":false,"
    "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,\"factor\":8.0,"
    "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
    "\"dtype\":\"bfloat16\"}";
static const char *k_llama_v4 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128,\"hidden_size\":64,"
    "\"intermediate_size\":96,\"num_hidden_layers\":3,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":8192,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":false,"
    "\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
    "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},\"torch_dtype\":\"bfloat16\"}";

static void test_dialects(void) {
    og_test_section("both dialects");
    og_hf_config a, b;
    CHECK_OK(parse(k_llama_v5, &a));
    CHECK_OK(parse(k_llama_v4, &b));
    const og_hf_config *cs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        const og_hf_config *c = cs[i];
        CHECK(c->family == OG_HF_LLAMA && c->vocab_size == 128 && c->hidden_size == 64);
        CHECK(c->intermediate_size == 96 && c->num_hidden_layers == 3 && c->num_attention_heads == 8);
        CHECK(c->num_key_value_heads == 2 && c->head_dim == 8 && c->rms_norm_eps == 1e-5);
        CHECK(!c->tie_word_embeddings && c->max_position_embeddings == 8192);
        CHECK(!c->qkv_bias && !c->o_bias && !c->mlp_bias && !c->qk_norm);
        CHECK(c->has_dtype && c->dtype == OG_DTYPE_BF16);
        CHECK(c->rope.type == OG_ROPE_LLAMA3 && c->rope.theta == 500000.0 && c->rope.factor == 8.0);
        CHECK(c->rope.low_freq_factor == 1.0 && c->rope.high_freq_factor == 4.0);
        CHECK(c->rope.original_max_position_embeddings == 8192);
        CHECK(c->sliding_window == 0 && !c->layer_sliding[0] && !c->layer_sliding[2]);
    }
    /* defaults: kv heads = heads, head_dim = hidden/heads, theta 10000, no dtype */
    CHECK_OK(parse("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":12,\"intermediate_size\":4,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":3}",
                   &a));
    CHECK(a.num_key_value_heads == 3 && a.head_dim == 4 && a.rope.theta == 10000.0);
    CHECK(a.rope.type == OG_ROPE_DEFAULT && a.rope.factor == 1.0 && !a.has_dtype && a.rms_norm_eps == 1e-6);
    CHECK(a.max_position_embeddings == 2048);
    /* linear rope, transformers 4 "type" spelling */
    CHECK_OK(parse("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":12,\"intermediate_size\":4,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"rope_scaling\":{\"type\":\"linear\","
                   "\"factor\":2.5}}",
                   &a));
    CHECK(a.rope.type == OG_ROPE_LINEAR && a.rope.factor == 2.5);
}

#define SIZES                                                                                      \
    "\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":4,"      \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2"

static void test_layers(void) {
    og_test_section("sliding layers");
    og_hf_config c;
    /* qwen3 with explicit layer_types; head_dim differs from hidden/heads */
    CHECK_OK(parse("{\"model_type\":\"qwen3\"," SIZES ",\"head_dim\":16,\"use_sliding_window\":true,"
                   "\"sliding_window\":8,\"max_window_layers\":0,\"layer_types\":[\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"full_attention\"],\"tie_word_embeddings\":true}",
                   &c));
    CHECK(c.family == OG_HF_QWEN3 && c.qk_norm && !c.qkv_bias && c.head_dim == 16 && c.tie_word_embeddings);
    CHECK(c.sliding_window == 8);
    CHECK(c.layer_sliding[0] == 0 && c.layer_sliding[1] == 1 && c.layer_sliding[2] == 1 && c.layer_sliding[3] == 0);
    /* qwen2 older style: layers >= max_window_layers slide when use_sliding_window */
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," SIZES ",\"use_sliding_window\":true,\"sliding_window\":16,"
                   "\"max_window_layers\":2}",
                   &c));
    CHECK(c.family == OG_HF_QWEN2 && c.qkv_bias && !c.o_bias && c.sliding_window == 16);
    CHECK(c.layer_sliding[0] == 0 && c.layer_sliding[1] == 0 && c.layer_sliding[2] == 1 && c.layer_sliding[3] == 1);
    /* ... and nothing slides when use_sliding_window is false (its default) */
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," SIZES ",\"sliding_window\":16,\"max_window_layers\":2}", &c));
    CHECK(c.sliding_window == 0 && c.layer_sliding[2] == 0 && c.layer_sliding[3] == 0);
    /* mistral: every layer when sliding_window is set, none when null */
    CHECK_OK(parse("{\"model_type\":\"mistral\"," SIZES ",\"sliding_window\":6}", &c));
    CHECK(c.family == OG_HF_MISTRAL && c.sliding_window == 6 && c.layer_sliding[0] && c.layer_sliding[3]);
    CHECK_OK(parse("{\"model_type\":\"mistral\"," SIZES ",\"sliding_window\":null}", &c));
    CHECK(c.sliding_window == 0 && !c.layer_sliding[0] && !c.layer_sliding[3]);
    /* llama never slides */
    CHECK_OK(parse("{\"model_type\":\"llama\"," SIZES ",\"sliding_window\":6}", &c));
    CHECK(c.sliding_window == 0 && !c.layer_sliding[0]);
    /* the committed transformers-4 sharded fixture */
    CHECK_OK(og_hf_config_load(OG_TEST_DATA_DIR "/hf-synthetic/llama-v4-sharded/config.json", &c));
    CHECK(c.dtype == OG_DTYPE_F16 && c.rope.type == OG_ROPE_LLAMA3 && c.rope.original_max_position_embeddings == 64);
}

/* Expects json refused with st and a message naming every needle. */
static void refused(const char *json, og_status st, const char *n1, const char *n2) {
    og_hf_config c;
    og_status got = parse(json, &c);
    const char *m = og_last_error();
    CHECK_MSG(got == st, "got %s want %s (%s) for %s", og_status_str(got), og_status_str(st), m, json);
    CHECK_MSG(strstr(m, "cfg.json") && strstr(m, n1) && (!n2 || strstr(m, n2)), "message \"%s\" lacks %s / %s", m,
              n1, n2 ? n2 : "");
}

static void test_refusals(void) {
    og_test_section("refusals");
    refused("{\"model_type\":\"gpt2\"," SIZES "}", OG_ERR_UNSUPPORTED, "\"model_type\"", "\"gpt2\"");
    refused("{\"architectures\":[\"GPT2LMHeadModel\"]," SIZES "}", OG_ERR_UNSUPPORTED, "\"architectures\"",
            "GPT2LMHeadModel");
    refused("{" SIZES "}", OG_ERR_FORMAT, "\"model_type\"", "\"architectures\"");
    refused("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
            OG_ERR_UNSUPPORTED, "\"rope_scaling.rope_type\"", "\"yarn\"");
    refused("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4}}",
            OG_ERR_UNSUPPORTED, "\"rope_scaling.rope_type\"", "\"dynamic\"");
    refused("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{\"rope_type\":\"longrope\"}}",
            OG_ERR_UNSUPPORTED, "\"rope_parameters.rope_type\"", "\"longrope\"");
    refused("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
            "\"low_freq_factor\":1,\"high_freq_factor\":4}}",
            OG_ERR_FORMAT, "\"rope_scaling.original_max_position_embeddings\"", "missing");
    refused("{\"model_type\":\"llama\"," SIZES ",\"rope_theta\":-1}", OG_ERR_FORMAT, "\"rope_theta\" = -1",
            "positive");
    refused("{\"model_type\":\"llama\"," SIZES ",\"torch_dtype\":\"float8_e4m3\"}", OG_ERR_UNSUPPORTED,
            "\"torch_dtype\"", "\"float8_e4m3\"");
    refused("{\"model_type\":\"llama\"," SIZES ",\"hidden_act\":\"gelu\"}", OG_ERR_UNSUPPORTED, "\"hidden_act\"",
            "\"gelu\"");
    refused("{\"model_type\":\"llama\",\"hidden_size\":32}", OG_ERR_FORMAT, "\"vocab_size\"", "missing");
    refused("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":0}", OG_ERR_FORMAT, "\"hidden_size\" = 0", NULL);
    refused("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
            "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":3}",
            OG_ERR_FORMAT, "\"num_key_value_heads\" = 3", "divide");
    refused("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
            "\"num_hidden_layers\":2.5}", OG_ERR_FORMAT,
            "\"num_hidden_layers\" = 2.5", "integer");
    refused("{\"model_type\":\"qwen3\"," SIZES ",\"layer_types\":[\"full_attention\"]}", OG_ERR_FORMAT,
            "\"layer_types\"", "4 layer types");
    refused("{\"model_type\":\"qwen3\"," SIZES ",\"use_sliding_window\":true,\"sliding_window\":8,"
            "\"layer_types\":[\"full_attention\",\"chunked_attention\",\"full_attention\",\"full_attention\"]}",
            OG_ERR_FORMAT, "\"layer_types[1]\" = \"chunked_attention\"", NULL);
    refused("{\"model_type\":\"qwen3\"," SIZES ",\"sliding_window\":8,\"layer_types\":[\"full_attention\","
            "\"sliding_attention\",\"full_attention\",\"full_attention\"]}",
            OG_ERR_FORMAT, "\"layer_types[1]\"", "no sliding_window");
    refused("{\"model_type\":\"mistral\"," SIZES ",\"sliding_window\":-4}", OG_ERR_FORMAT,
            "\"sliding_window\" = -4", NULL);
    refused("{\"model_type\":\"llama\"," SIZES ",\"tie_word_embeddings\":\"yes\"}", OG_ERR_FORMAT,
            "\"tie_word_embeddings\" = \"yes\"", NULL);
    refused("[1]", OG_ERR_FORMAT, "not a JSON object", NULL);
    refused("{\"model_type\":", OG_ERR_FORMAT, "not valid JSON", NULL);
    og_hf_config c;
    CHECK_STATUS(og_hf_config_load(OG_TEST_DATA_DIR "/hf-synthetic/bad-rope-type/config.json", &c),
                 OG_ERR_UNSUPPORTED);
    CHECK(strstr(og_last_error(), "bad-rope-type/config.json") && strstr(og_last_error(), "\"yarn\""));
}

/* Committed configs (tests/data/hf-synthetic/huge-*) that declare one
 * dimension far over this build's limits: refused at parse, naming the
 * field, so that nothing is ever sized from it. */
static void test_limits(void) {
    og_test_section("dimensions over this build's limits");
    static const struct {
        const char *dir, *field;
        og_status st;
    } cases[] = {
        {"huge-vocab", "\"vocab_size\" = 1099511627776", OG_ERR_FORMAT},
        {"huge-hidden", "\"hidden_size\" = 2147483648", OG_ERR_FORMAT},
        {"huge-intermediate", "\"intermediate_size\"", OG_ERR_FORMAT},
        {"huge-layers", "\"num_hidden_layers\" = 1048576", OG_ERR_UNSUPPORTED},
        {"huge-heads", "\"num_attention_heads\" = 2147483647", OG_ERR_FORMAT},
        {"huge-kv-heads", "\"num_key_value_heads\"", OG_ERR_FORMAT},
        {"huge-head-dim", "\"head_dim\"", OG_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/hf-synthetic/%s/config.json", OG_TEST_DATA_DIR, cases[i].dir);
        og_hf_config c;
        og_status st = og_hf_config_load(path, &c);
        const char *m = og_last_error();
        CHECK_MSG(st == cases[i].st, "%s: got %s want %s (%s)", cases[i].dir, og_status_str(st),
                  og_status_str(cases[i].st), m);
        CHECK_MSG(strstr(m, cases[i].dir) && strstr(m, cases[i].field), "%s: message \"%s\" lacks %s",
                  cases[i].dir, m, cases[i].field);
    }
    /* at the limits: accepted */
    og_hf_config c;
    CHECK_OK(parse("{\"model_type\":\"llama\",\"vocab_size\":16777216,\"hidden_size\":1048576,"
                   "\"intermediate_size\":4194304,\"num_hidden_layers\":1024,\"num_attention_heads\":64,"
                   "\"head_dim\":65536}",
                   &c));
    CHECK(c.vocab_size == OG_MAX_VOCAB && c.hidden_size == OG_MAX_HIDDEN && c.num_hidden_layers == OG_MAX_LAYERS &&
          c.head_dim == OG_MAX_HEAD_DIM);
    /* one over the product of heads and head_dim */
    refused("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
            "\"num_hidden_layers\":2,\"num_attention_heads\":128,\"head_dim\":65536}",
            OG_ERR_FORMAT, "\"num_attention_heads\" = 128", "head_dim");
}

int main(void) {
    test_dialects();
    test_layers();
    test_refusals();
    test_limits();
    return og_test_finish();
}
