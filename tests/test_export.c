/* Export: weights in the program equal the checkpoint's after conversion
 * (checked with a decoder written here, not the library's), the instruction
 * list follows the per-layer recipe of each family, and the KV manifest has
 * the expected flat/ring layers. */
#include "harness.h"
#include "import/export.h"
#include "import/safetensors.h"
#include "program/program.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* IEEE half -> float by the definition (sign, 5-bit exponent, 10-bit mantissa). */
static float ref_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (float)(s ? -v : v);
}
static float ref_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float src_elem(const og_st_tensor *t, size_t i) {
    if (t->dtype == OG_DTYPE_F32) return ((const float *)t->data)[i];
    uint16_t h = ((const uint16_t *)t->data)[i];
    return t->dtype == OG_DTYPE_F16 ? ref_f16(h) : ref_bf16(h);
}

/* Exports dir with opts to a temp file and opens it. */
static og_program *export_open(const char *dir, const og_export_options *o, char *path) {
    strcpy(path, "/tmp/og_export_XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    og_status rc = og_export_hf(dir, path, o, NULL);
    CHECK_MSG(rc == OG_OK, "export %s: %s", dir, og_last_error());
    og_program *p = NULL;
    if (rc == OG_OK) CHECK_OK(og_program_open(path, &p));
    return p;
}

/* Every weight of p equals its checkpoint tensor, element by element. */
static void check_weights(const og_program *p, const char *dir, og_dtype want) {
    og_safetensors *st = NULL;
    CHECK_OK(og_safetensors_open_dir(dir, &st));
    int32_t n = 0, bad = 0;
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        if (t->binding != OG_BINDING_WEIGHT) continue;
        n++;
        const og_st_tensor *s = og_safetensors_find(st, t->name);
        if (!s || t->dtype != want || (int64_t)t->nbytes != s->numel * (int64_t)og_dtype_size(want)) {
            CHECK_MSG(0, "%s: missing in checkpoint or wrong dtype/size", t->name);
            continue;
        }
        for (int64_t k = 0; k < s->numel; k++) {
            float ref = src_elem(s, (size_t)k);
            if (want == OG_DTYPE_BF16) { /* round to nearest even, by hand */
                uint32_t u;
                memcpy(&u, &ref, 4);
                u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
                memcpy(&ref, &u, 4);
            }
            float got = want == OG_DTYPE_F32 ? ((const float *)t->data)[k]
                                             : ref_bf16(((const uint16_t *)t->data)[k]);
            if (memcmp(&got, &ref, 4)) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d weight elements differ from the checkpoint", bad);
    CHECK(n > 0);
    og_safetensors_close(st);
}

static void test_llama_f16(void) {
    og_test_section("f16 sharded llama -> f32 and bf16");
    const char *dir = OG_TEST_DATA_DIR "/hf-synthetic/llama-v4-sharded";
    og_export_options o;
    og_export_default_options(&o);
    char path[64];
    og_program *p = export_open(dir, &o, path);
    if (p) {
        CHECK(og_program_get_model(p)->activation_dtype == OG_DTYPE_F32);
        check_weights(p, dir, OG_DTYPE_F32);
        /* untied: the logits read lm_head */
        const og_program_instr *li = og_program_instr_at(p, og_program_logits_instr(p));
        CHECK(li && li->op == OG_OP_MATMUL && !strcmp(og_program_operand_name(p, li->in[1]), "lm_head.weight"));
        CHECK(og_program_get_model(p)->rope.type == OG_ROPE_LLAMA3);
        CHECK(og_program_tokenizer_json(p) == NULL);
        og_program_close(p);
    }
    unlink(path);
    o.dtype = OG_DTYPE_BF16;
    p = export_open(dir, &o, path);
    if (p) check_weights(p, dir, OG_DTYPE_BF16);
    og_program_close(p);
    unlink(path);
}

static void test_qwen3_recipe(void) {
    og_test_section("qwen3 recipe and manifest");
    const char *dir = OG_TEST_DATA_DIR "/hf/qwen3-mixed";
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 16;
    char path[64];
    og_program *p = export_open(dir, &o, path);
    if (!p) return;
    check_weights(p, dir, OG_DTYPE_BF16);
    static const og_op layer[] = {OG_OP_RMS_NORM, OG_OP_MATMUL, OG_OP_MATMUL, OG_OP_MATMUL, OG_OP_HEAD_RMS_NORM,
                                  OG_OP_HEAD_RMS_NORM, OG_OP_ROPE, OG_OP_ROPE, OG_OP_UPDATE_AND_ATTEND,
                                  OG_OP_MATMUL, OG_OP_ADD, OG_OP_RMS_NORM, OG_OP_MATMUL, OG_OP_MATMUL,
                                  OG_OP_SWIGLU, OG_OP_MATMUL, OG_OP_ADD};
    const int32_t per = (int32_t)(sizeof layer / sizeof layer[0]);
    CHECK(og_program_n_instrs(p) == 1 + 4 * per + 2);
    CHECK(og_program_instr_at(p, 0)->op == OG_OP_EMBED);
    int32_t mismatches = 0;
    for (int32_t l = 0; l < 4; l++)
        for (int32_t k = 0; k < per; k++) {
            const og_program_instr *in = og_program_instr_at(p, 1 + l * per + k);
            if (!in || in->op != layer[k]) mismatches++;
            if (in && in->op == OG_OP_UPDATE_AND_ATTEND)
                CHECK(in->attrs.layer_id == l && in->attrs.n_heads == 4 && in->attrs.n_kv_heads == 2 &&
                      in->attrs.head_dim == 32);
            if (in && in->op == OG_OP_ROPE) CHECK(in->attrs.theta == 1000000.0 && in->attrs.head_dim == 32);
        }
    CHECK_MSG(mismatches == 0, "%d instructions out of the qwen3 recipe", mismatches);
    /* tied: the logits read the embedding table */
    const og_program_instr *li = og_program_instr_at(p, og_program_logits_instr(p));
    CHECK(li && !strcmp(og_program_operand_name(p, li->in[1]), "model.embed_tokens.weight"));
    CHECK(og_program_find_tensor(p, "lm_head.weight") < 0);
    const og_kv_config *kv = og_program_kv_config(p);
    CHECK(kv->n_layers == 4 && kv->max_capacity == 256 && kv->max_write == 16 && kv->initial_capacity == 256);
    CHECK(kv->layers[0].policy == OG_KV_FLAT && kv->layers[3].policy == OG_KV_FLAT);
    CHECK(kv->layers[1].policy == OG_KV_RING && kv->layers[1].window == 8 && kv->layers[2].window == 8);
    int32_t kt = og_program_find_tensor(p, "kv.1.k");
    const og_program_tensor *t = og_program_tensor_at(p, kt);
    CHECK(t && t->binding == OG_BINDING_RUNTIME && t->data == NULL && t->nbytes == 0 && t->shape[0] == 8 + 16 - 1);
    CHECK(og_program_tokenizer_json(p) != NULL && og_program_tokenizer_config(p) != NULL);
    og_program_close(p);
    unlink(path);
}

static void test_qwen2_bias(void) {
    og_test_section("qwen2 q/k/v biases");
    og_export_options o;
    og_export_default_options(&o);
    char path[64];
    og_program *p = export_open(OG_TEST_DATA_DIR "/hf/qwen2-bias", &o, path);
    if (!p) return;
    int32_t with_bias = 0;
    for (int32_t i = 0; i < og_program_n_instrs(p); i++) {
        const og_program_instr *in = og_program_instr_at(p, i);
        if (in->op == OG_OP_MATMUL && in->n_in == 3) with_bias++;
    }
    CHECK(with_bias == 2 * 3); /* q, k, v of 2 layers; never o or the MLP */
    CHECK(og_program_find_tensor(p, "model.layers.1.self_attn.v_proj.bias") >= 0);
    og_program_close(p);
    unlink(path);
}

int main(void) {
    test_llama_f16();
    test_qwen3_recipe();
    test_qwen2_bias();
    return og_test_finish();
}
