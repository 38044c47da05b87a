/* k-quant GGUF files in and out, against llama.cpp's own tools (the files
 * of tests/data/kquant, written by tests/fixtures/make_kquant_fixtures.py
 * with llama-quantize and the gguf Python package):
 *  - import: every matrix of a Q4_K_M, Q5_K_M, Q6_K and Q2_K file becomes a
 *    program tensor of the same type holding the same bytes (copied), and
 *    reads back (og_dequantize_row) as the gguf package dequantizes it (an
 *    FNV-1a hash of every f32 value);
 *  - the mixes: og_weight_mix_dtype gives every matrix of three models (32
 *    layers with rows that fall back; two "70B" cases of 80 layers) the
 *    type `llama-quantize --dry-run` gives it, for all nine k-quant file
 *    types (the tool's q5_0 / q5_1 fallbacks are q8 here, by design);
 *  - export: the checkpoint those files were quantized from (written here
 *    from the same splitmix64 stream as the script) exported with the mix
 *    of each file gives every tensor the bytes of the imported file;
 *  - IQ types and other quantizations are refused by name;
 *  - no_vocab: the program has no tokenizer and says why;
 *  - numerics: the Q4_K_M file kept quantized against the same file
 *    dequantized to f32: prefill logits the same bits (the prefill products
 *    multiply the exactly dequantized weights in the same sgemm calls);
 *    decode (one token a step, x rounded to two int8 terms per 256) within
 *    5e-4 of the logits' scale, and the perplexity of the sequence within
 *    0.01 % (the bound is 0.1 %). */
#include "harness.h"
#include "kquant_fixture.h"
#include "core/core.h"
#include "import/export.h"
#include "import/gguf.h"
#include "import/hf_config.h"
#include "program/program.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static cJSON *g_meta;

static char *data_path(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/kquant/%s", OG_TEST_DATA_DIR, name);
    return buf;
}

static uint64_t fnv1a64(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* The ggml type name of the fixture (lower case) as an offgraph dtype. */
static og_dtype dtype_of(const char *t) {
    static const struct {
        const char *name;
        og_dtype dt;
    } k[] = {{"q2_k", OG_DTYPE_Q2_K}, {"q3_k", OG_DTYPE_Q3_K}, {"q4_k", OG_DTYPE_Q4_K}, {"q5_k", OG_DTYPE_Q5_K},
             {"q6_k", OG_DTYPE_Q6_K}, {"q8_0", OG_DTYPE_Q8},   {"q4_0", OG_DTYPE_Q4},   {"bf16", OG_DTYPE_BF16},
             {"f16", OG_DTYPE_BF16},  {"f32", OG_DTYPE_F32},
             /* the tool's 5-bit fallbacks, which offgraph has not: q8 (weight_mix.c) */
             {"q5_0", OG_DTYPE_Q8},   {"q5_1", OG_DTYPE_Q8}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(t, k[i].name)) return k[i].dt;
    return OG_DTYPE_COUNT;
}

/* The Hugging Face name of a GGUF matrix name; false for others. */
static bool hf_name(const char *g, char *out, size_t cap) {
    if (!strcmp(g, "token_embd.weight")) return snprintf(out, cap, "model.embed_tokens.weight"), true;
    if (!strcmp(g, "output.weight")) return snprintf(out, cap, "lm_head.weight"), true;
    static const struct {
        const char *g, *hf;
    } k[] = {{"attn_q.weight", "self_attn.q_proj.weight"}, {"attn_k.weight", "self_attn.k_proj.weight"},
             {"attn_v.weight", "self_attn.v_proj.weight"}, {"attn_output.weight", "self_attn.o_proj.weight"},
             {"ffn_gate.weight", "mlp.gate_proj.weight"},  {"ffn_up.weight", "mlp.up_proj.weight"},
             {"ffn_down.weight", "mlp.down_proj.weight"}};
    int layer, used = 0;
    if (sscanf(g, "blk.%d.%n", &layer, &used) != 1 || !used) return false;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(g + used, k[i].g)) return snprintf(out, cap, "model.layers.%d.%s", layer, k[i].hf), true;
    return false;
}

static og_program *export_to(const char *src, bool gguf, const og_export_options *o, char *path) {
    strcpy(path, "/tmp/og_kq_XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    og_status rc = gguf ? og_export_gguf(src, path, o, NULL) : og_export_hf(src, path, o, NULL);
    CHECK_MSG(rc == OG_OK, "export %s: %s", src, og_last_error());
    og_program *p = NULL;
    if (rc == OG_OK) CHECK_OK(og_program_open(path, &p));
    return p;
}

/* ---- import ---- */

static void check_import(const char *file) {
    char title[128], gpath[512], ppath[64];
    snprintf(title, sizeof title, "import %s: every matrix copied, read back as the gguf package reads it", file);
    og_test_section(title);
    data_path(file, gpath, sizeof gpath);
    og_program *p = export_to(gpath, true, NULL, ppath);
    og_gguf *g = NULL;
    CHECK_OK(og_gguf_open_file(gpath, &g));
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g_meta, "files"), file);
    CHECK_MSG(cJSON_GetArraySize(tensors) >= 16, "%s: no tensors in meta.json", file);
    int matrices = 0, kq = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tensors) {
        char hf[128];
        if (!p || !g || !hf_name(t->string, hf, sizeof hf)) continue;
        matrices++;
        const char *type = cJSON_GetObjectItemCaseSensitive(t, "type")->valuestring;
        const og_dtype want = dtype_of(type);
        const int32_t i = og_program_find_tensor(p, hf);
        const og_program_tensor *pt = i >= 0 ? og_program_tensor_at(p, i) : NULL;
        CHECK_MSG(pt && pt->dtype == want, "%s: %s is %s, want %s", file, hf, pt ? og_dtype_name(pt->dtype) : "missing",
                  type);
        if (!pt || pt->dtype != want || !og_dtype_is_kquant(want)) continue;
        kq++;
        const og_gguf_tensor *gt = og_gguf_find_tensor(g, t->string);
        CHECK_MSG(gt && gt->nbytes == pt->nbytes && !memcmp(gt->data, pt->data, pt->nbytes),
                  "%s: %s's bytes differ from the file's", file, hf);
        const int64_t N = pt->shape[0], K = pt->shape[1];
        float *row = malloc(sizeof(float) * (size_t)K);
        uint64_t h = 0xCBF29CE484222325ull;
        for (int64_t r = 0; r < N; r++) {
            og_dequantize_row(pt->dtype, pt->data, N, K, r, row);
            h = fnv1a64(row, sizeof(float) * (size_t)K, h);
        }
        free(row);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        const char *ref = cJSON_GetObjectItemCaseSensitive(t, "f32_fnv1a64")->valuestring;
        CHECK_MSG(!strcmp(hex, ref), "%s: %s dequantized hashes to %s, the gguf package's values to %s", file, hf,
                  hex, ref);
    }
    CHECK_MSG(matrices == 16 && kq >= 16, "%s: %d matrices, %d k-quant", file, matrices, kq);
    og_gguf_close(g);
    og_program_close(p);
    unlink(ppath);
}

/* ---- the mixes against llama-quantize --dry-run ---- */

static void check_mix_rules(void) {
    og_test_section("mixes: every matrix the type llama-quantize --dry-run gives it");
    static const char *const mixes[] = {"Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
                                        "Q5_K_M", "Q6_K"};
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(g_meta, "mix_types"), *m;
    int n_models = 0;
    cJSON_ArrayForEach(m, models) {
        n_models++;
        og_hf_config c;
        memset(&c, 0, sizeof c);
        const char *arch = cJSON_GetObjectItemCaseSensitive(m, "arch")->valuestring;
        c.family = !strcmp(arch, "llama") ? OG_HF_LLAMA : !strcmp(arch, "qwen2") ? OG_HF_QWEN2 : OG_HF_QWEN3;
        c.num_hidden_layers = cJSON_GetObjectItemCaseSensitive(m, "layers")->valueint;
        c.hidden_size = cJSON_GetObjectItemCaseSensitive(m, "hidden")->valueint;
        c.intermediate_size = cJSON_GetObjectItemCaseSensitive(m, "intermediate")->valueint;
        c.num_attention_heads = cJSON_GetObjectItemCaseSensitive(m, "heads")->valueint;
        c.num_key_value_heads = cJSON_GetObjectItemCaseSensitive(m, "kv_heads")->valueint;
        c.head_dim = cJSON_GetObjectItemCaseSensitive(m, "head_dim")->valueint;
        c.tie_word_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "tied"));
        const cJSON *names = cJSON_GetObjectItemCaseSensitive(m, "tensors");
        for (size_t x = 0; x < sizeof mixes / sizeof mixes[0]; x++) {
            char lower[16];
            for (size_t k = 0; k <= strlen(mixes[x]); k++)
                lower[k] = (char)(mixes[x][k] >= 'A' && mixes[x][k] <= 'Z' ? mixes[x][k] + 32 : mixes[x][k]);
            og_weight_mix mix;
            CHECK_OK(og_weight_mix_parse(lower, &mix));
            const cJSON *ts = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "types"), mixes[x]);
            char *types = ts ? strdup(ts->valuestring) : NULL, *save = NULL;
            char *tok = types ? strtok_r(types, " ", &save) : NULL;
            int n = 0, bad = 0;
            const cJSON *nm;
            cJSON_ArrayForEach(nm, names) {
                if (!tok) break;
                char hf[128];
                if (hf_name(nm->valuestring, hf, sizeof hf)) {
                    n++;
                    /* rows of the matrix: the hidden size but for o (heads x D) and down (ffn) */
                    int64_t K = c.hidden_size;
                    if (strstr(hf, "o_proj")) K = (int64_t)c.num_attention_heads * c.head_dim;
                    if (strstr(hf, "down_proj")) K = c.intermediate_size;
                    const og_dtype got = og_weight_mix_dtype(mix, &c, hf, K, OG_DTYPE_BF16);
                    if (got != dtype_of(tok) && bad++ < 4)
                        fprintf(stderr, "%s %s: %s is %s, llama-quantize gives %s\n", m->string, mixes[x], hf,
                                og_dtype_name(got), tok);
                }
                tok = strtok_r(NULL, " ", &save);
            }
            CHECK_MSG(bad == 0 && n == cJSON_GetArraySize(names), "%s %s: %d of %d matrices differ", m->string,
                      mixes[x], bad, n);
            free(types);
        }
    }
    CHECK(n_models == 3);
    og_weight_mix mix;
    CHECK_STATUS(og_weight_mix_parse("q4_k_x", &mix), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_weight_mix_parse("as-stored", &mix), OG_ERR_INVALID_ARGUMENT);
}

/* ---- export of the checkpoint: the same bytes as llama-quantize ---- */

static void check_export(const char *ckpt) {
    static const struct {
        const char *file, *mix;
    } k[] = {{"qwen3-kq-Q4_K_M.gguf", "q4_k_m"}, {"qwen3-kq-Q5_K_M.gguf", "q5_k_m"},
             {"qwen3-kq-Q6_K.gguf", "q6_k"},     {"qwen3-kq-Q2_K.gguf", "q2_k"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char title[160], gpath[512], pa[64], pb[64];
        snprintf(title, sizeof title, "export --weights %s of the checkpoint = llama-quantize's %s, byte for byte",
                 k[i].mix, k[i].file);
        og_test_section(title);
        og_export_options o;
        og_export_default_options(&o);
        CHECK_OK(og_weight_mix_parse(k[i].mix, &o.mix));
        og_program *a = export_to(ckpt, false, &o, pa), *b = export_to(data_path(k[i].file, gpath, sizeof gpath), true,
                                                                      NULL, pb);
        int n = 0, bad = 0;
        for (int32_t j = 0; a && b && j < og_program_n_tensors(b); j++) {
            const og_program_tensor *tb = og_program_tensor_at(b, j);
            if (tb->binding != OG_BINDING_WEIGHT) continue;
            const int32_t ia = og_program_find_tensor(a, tb->name);
            const og_program_tensor *ta = ia >= 0 ? og_program_tensor_at(a, ia) : NULL;
            n++;
            if (!ta || ta->dtype != tb->dtype || ta->nbytes != tb->nbytes || memcmp(ta->data, tb->data, ta->nbytes)) {
                if (bad++ < 4)
                    fprintf(stderr, "%s: %s: %s, the file's %s\n", k[i].mix, tb->name,
                            ta ? og_dtype_name(ta->dtype) : "missing", og_dtype_name(tb->dtype));
            }
        }
        CHECK_MSG(n == 25 && bad == 0, "%s: %d of %d tensors differ", k[i].mix, bad, n);
        og_program_close(a), og_program_close(b);
        unlink(pa), unlink(pb);
    }
    og_test_section("export --weights q4_k: every matrix q4_k");
    og_export_options o;
    og_export_default_options(&o);
    o.weights = OG_DTYPE_Q4_K;
    char pa[64];
    og_program *a = export_to(ckpt, false, &o, pa);
    int n = 0;
    for (int32_t j = 0; a && j < og_program_n_tensors(a); j++) {
        const og_program_tensor *t = og_program_tensor_at(a, j);
        if (t->binding != OG_BINDING_WEIGHT || t->rank != 2) continue;
        CHECK(t->dtype == OG_DTYPE_Q4_K);
        n++;
    }
    CHECK(n == 16);
    og_program_close(a);
    unlink(pa);
}

/* ---- refusals ---- */

/* The fixture with blk.0.attn_q.weight's type field set to `type`. */
static void check_refused(uint32_t type, const char *name) {
    char gpath[512];
    size_t n = 0;
    FILE *f = fopen(data_path("qwen3-kq-Q4_K_M.gguf", gpath, sizeof gpath), "rb");
    uint8_t *b = malloc(2 << 20);
    if (f) n = fread(b, 1, 2 << 20, f), fclose(f);
    const char *key = "blk.0.attn_q.weight";
    uint8_t *at = memmem(b, n, key, strlen(key));
    CHECK(at != NULL);
    if (at) { /* name, u32 n_dims (2), u64 ne[2], then the u32 type */
        uint8_t *ty = at + strlen(key) + 4 + 16;
        CHECK(ty[0] == 12); /* q4_K */
        for (int k = 0; k < 4; k++) ty[k] = (uint8_t)(type >> (8 * k));
    }
    char in[] = "/tmp/og_kq_bad_XXXXXX", out[64];
    int fd = mkstemp(in);
    if (fd >= 0) {
        CHECK(write(fd, b, n) == (ssize_t)n);
        close(fd);
    }
    snprintf(out, sizeof out, "%s.ogp", in);
    CHECK_STATUS(og_export_gguf(in, out, NULL, NULL), OG_ERR_UNSUPPORTED);
    char want[128];
    snprintf(want, sizeof want, "tensor \"blk.0.attn_q.weight\" has type %s: not supported", name);
    CHECK_MSG(strstr(og_last_error(), want), "message \"%s\" lacks \"%s\"", og_last_error(), want);
    CHECK(access(out, F_OK) != 0);
    unlink(in);
    free(b);
}

/* ---- numerics ---- */

static void logits_of(const char *path, const int32_t *tok, int n, int chunk, float *out) {
    og_model *m = NULL;
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    CHECK_OK(og_model_load(path, &mp, &m));
    if (!m) return;
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = OG_DTYPE_F32;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    CHECK_OK(og_session_eval(s, tok, n, chunk, out, 1));
    CHECK(og_model_no_tokenizer_reason(m) && strstr(og_model_no_tokenizer_reason(m), "no_vocab"));
    CHECK(og_model_tokenizer_json(m) == NULL);
    og_session_destroy(s);
    og_model_destroy(m);
}

/* Mean negative log-likelihood of tok[i + 1] under row i. */
static double nll(const float *lg, const int32_t *tok, int n, int64_t V) {
    double sum = 0;
    for (int i = 0; i + 1 < n; i++) {
        const float *r = lg + (int64_t)i * V;
        double mx = r[0], z = 0;
        for (int64_t v = 1; v < V; v++) mx = r[v] > mx ? r[v] : mx;
        for (int64_t v = 0; v < V; v++) z += exp((double)r[v] - mx);
        sum += mx + log(z) - r[tok[i + 1]];
    }
    return sum / (n - 1);
}

static void check_numerics(void) {
    og_test_section("Q4_K_M kept quantized vs dequantized to f32: prefill the same bits, decode within x's rounding");
    char gpath[512], pq[64], pf[64];
    data_path("qwen3-kq-Q4_K_M.gguf", gpath, sizeof gpath);
    og_export_options o;
    og_export_default_options(&o);
    o.dtype = OG_DTYPE_F32; /* f32 activations and norms on both sides */
    og_program *a = export_to(gpath, true, &o, pq);
    o.weights = OG_DTYPE_F32;
    og_program *b = export_to(gpath, true, &o, pf);
    og_program_close(a), og_program_close(b);
    enum { N = 96, V = 256 };
    int32_t tok[N];
    uint64_t s = 35;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(og_test_splitmix(&s) % V);
    float *q = malloc(sizeof(float) * N * V), *f = malloc(sizeof(float) * N * V), *qd = malloc(sizeof(float) * N * V),
          *fd = malloc(sizeof(float) * N * V);
    logits_of(pq, tok, N, 0, q);
    logits_of(pf, tok, N, 0, f);
    CHECK_MSG(memcmp(q, f, sizeof(float) * N * V) == 0, "prefill logits differ");
    logits_of(pq, tok, N, 1, qd);
    logits_of(pf, tok, N, 1, fd);
    double worst = 0, scale = 0;
    for (int i = 0; i < N * V; i++) {
        worst = fmax(worst, fabs((double)qd[i] - fd[i]));
        scale = fmax(scale, fabs((double)fd[i]));
    }
    /* measured 5.7e-5 of the scale (x's two int8 terms are off by at most
     * 1/64516 of a block's largest value); 2x margin over 1e-4 would do,
     * 5e-4 leaves room for other summation orders */
    CHECK_MSG(worst <= 5e-4 * scale, "decode: max |logit diff| %g, %g of the scale %g", worst, worst / scale, scale);
    const double pq_nll = nll(qd, tok, N, V), pf_nll = nll(fd, tok, N, V);
    const double ratio = exp(pq_nll) / exp(pf_nll);
    CHECK_MSG(fabs(ratio - 1) <= 1e-4, "decode perplexity %.6f vs %.6f (ratio %.6f)", exp(pq_nll), exp(pf_nll), ratio);
    fprintf(stderr, "decode: max |logit diff| %.3g (%.3g of the scale), perplexity %.4f vs %.4f (%+.4f %%)\n", worst,
            worst / scale, exp(pq_nll), exp(pf_nll), 100 * (ratio - 1));
    free(q), free(f), free(qd), free(fd);
    unlink(pq), unlink(pf);
}

int main(void) {
    char mpath[512];
    char *text = og_test_read_file(data_path("meta.json", mpath, sizeof mpath));
    g_meta = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(g_meta != NULL, "cannot read %s", mpath);
    if (!g_meta) return og_test_finish();
    check_import("qwen3-kq-Q4_K_M.gguf");
    check_import("qwen3-kq-Q5_K_M.gguf");
    check_import("qwen3-kq-Q6_K.gguf");
    check_import("qwen3-kq-Q2_K.gguf");
    check_mix_rules();
    char dir[] = "/tmp/og_kq_ckpt_XXXXXX";
    if (mkdtemp(dir)) {
        CHECK(og_test_write_kq_checkpoint(dir));
        check_export(dir);
        char p[600];
        snprintf(p, sizeof p, "%s/config.json", dir), unlink(p);
        snprintf(p, sizeof p, "%s/model.safetensors", dir), unlink(p);
        rmdir(dir);
    }
    og_test_section("IQ types and other quantizations are refused by name");
    check_refused(23, "iq4_xs");
    check_refused(16, "iq2_xxs");
    check_refused(34, "tq1_0");
    check_numerics();
    cJSON_Delete(g_meta);
    return og_test_finish();
}
