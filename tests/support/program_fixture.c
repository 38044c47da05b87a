/* The synthetic program and its broken variants (see program_fixture.h). */
#include "program_fixture.h"

#include "core/core.h"
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const og_kv_layer_config k_layers[2] = {
    {0, OG_KV_FLAT, 0, OG_FIX_KV_HEADS, OG_FIX_HEAD_DIM},
    {1, OG_KV_RING, OG_FIX_WINDOW, OG_FIX_KV_HEADS, OG_FIX_HEAD_DIM},
};

og_kv_config og_fixture_kv_config(int64_t max_capacity) {
    og_kv_config c = {.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16,
                      .max_capacity = max_capacity ? max_capacity : 64, .initial_capacity = 16,
                      .max_write = OG_FIX_MAX_WRITE, .n_model_layers = 2, .n_layers = 2, .layers = k_layers};
    return c;
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* Uniform values in [-1, 1) from the name, times scale, plus offset. */
static void weight_values(const char *name, og_dtype dt, void *dst, size_t nbytes, float scale, float offset) {
    og_rng r = og_rng_seed(hash_name(name));
    size_t es = og_dtype_size(dt), n = nbytes / es;
    for (size_t i = 0; i < n; i++) {
        float x = og_rng_uniform(&r, -1.0f, 1.0f) * scale + offset;
        if (dt == OG_DTYPE_BF16) {
            uint32_t u;
            memcpy(&u, &x, sizeof u);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
        } else {
            memcpy((uint8_t *)dst + 4 * i, &x, 4);
        }
    }
}

void og_fixture_weight_bytes(const char *name, og_dtype dt, void *dst, size_t nbytes) {
    weight_values(name, dt, dst, nbytes, 1.0f, 0.0f);
}

typedef struct fill_ctx {
    const char *name;
    og_dtype dtype;
    int32_t index;
    int32_t fail_at;
    float scale, offset; /* scale 0: og_fixture_weight_bytes */
} fill_ctx;

static og_status fill(void *ctx, void *dst, size_t nbytes) {
    const fill_ctx *c = ctx;
    if (c->index == c->fail_at) return og_set_error(OG_ERR_IO, "fixture: fill of \"%s\" fails on purpose", c->name);
    if (c->scale != 0) weight_values(c->name, c->dtype, dst, nbytes, c->scale, c->offset);
    else og_fixture_weight_bytes(c->name, c->dtype, dst, nbytes);
    return OG_OK;
}

#define MAX_WEIGHTS 32

typedef struct builder {
    og_program_writer *w;
    og_status st;
    fill_ctx ctx[MAX_WEIGHTS];
    char names[MAX_WEIGHTS][48];
    int32_t n, fail_at;
    bool well_scaled;
} builder;

static void weight(builder *b, const char *name, og_dtype dt, int64_t d0, int64_t d1) {
    if (b->st != OG_OK) return;
    int64_t shape[2] = {d0, d1};
    fill_ctx *c = &b->ctx[b->n];
    snprintf(b->names[b->n], sizeof b->names[b->n], "%s", name);
    *c = (fill_ctx){b->names[b->n], dt, b->n + 1, b->fail_at, 0, 0};
    if (b->well_scaled && d1) c->scale = 1.0f / sqrtf((float)d1); /* products keep their inputs' scale */
    else if (b->well_scaled && strstr(name, "norm")) c->scale = 0.25f, c->offset = 1.0f;
    else if (b->well_scaled) c->scale = 0.1f; /* biases */
    b->n++;
    b->st = og_program_writer_add_weight(b->w, name, dt, d1 ? 2 : 1, shape, fill, c);
}

static void instr(builder *b, og_op op, const char *out, const og_op_attrs *a, int n_in, ...) {
    if (b->st != OG_OK) return;
    const char *in[OG_OP_MAX_INPUTS];
    va_list ap;
    va_start(ap, n_in);
    for (int i = 0; i < n_in; i++) in[i] = va_arg(ap, const char *);
    va_end(ap);
    b->st = og_program_writer_add_instr(b->w, op, in, n_in, out, a);
}

og_status og_fixture_write_program(const char *path, const og_fixture_opts *o) {
    og_fixture_opts def = {0};
    if (!o) o = &def;
    builder b = {.fail_at = o->fail_fill_at, .well_scaled = o->well_scaled};
    b.st = og_program_writer_create(path, &b.w);
    if (b.st != OG_OK) return b.st;
    og_program_model m = {
        .family = "llama", .activation_dtype = o->activation_dtype == OG_DTYPE_BF16 ? OG_DTYPE_BF16 : OG_DTYPE_F32, .vocab_size = OG_FIX_VOCAB,
        .hidden_size = OG_FIX_HIDDEN, .intermediate_size = OG_FIX_FFN, .num_hidden_layers = 2,
        .num_attention_heads = OG_FIX_HEADS, .num_key_value_heads = OG_FIX_KV_HEADS,
        .head_dim = OG_FIX_HEAD_DIM, .rms_norm_eps = 1e-5, .tie_word_embeddings = true,
        .rope = {500000.0, OG_ROPE_LLAMA3, 8.0, 1.0, 4.0, 8192}};
    cJSON *extra = cJSON_CreateObject();
    cJSON_AddNumberToObject(extra, "bos_token_id", 1);
    b.st = og_program_writer_set_model(b.w, &m, extra);
    og_kv_config kv = og_fixture_kv_config(o->max_capacity);
    og_kv_layer_config kv_layers[2] = {k_layers[0], k_layers[1]};
    if (o->window > 0) kv_layers[1].window = o->window;
    kv.layers = kv_layers;
    if (o->kv_f32) kv.kv_dtype = OG_DTYPE_F32;
    if (o->kv_quant == OG_DTYPE_INT8 || o->kv_quant == OG_DTYPE_FP8) kv.kv_dtype = o->kv_quant;
    if (o->initial_capacity > 0) kv.initial_capacity = o->initial_capacity;
    if (o->max_write > 0) kv.max_write = o->max_write;
    if (b.st == OG_OK) b.st = og_program_writer_set_kv(b.w, &kv);
    if (b.st == OG_OK && o->with_tokenizer)
        b.st = og_program_writer_set_tokenizer(b.w, "{\"model\": {\"type\": \"BPE\"}, \"note\": \"caf\xc3\xa9\"}",
                                               "{\"bos_token\": \"<s>\"}");
    const int64_t H = OG_FIX_HIDDEN, F = OG_FIX_FFN, QW = OG_FIX_HEADS * OG_FIX_HEAD_DIM,
                  KW = OG_FIX_KV_HEADS * OG_FIX_HEAD_DIM;
    weight(&b, "embed", OG_DTYPE_BF16, OG_FIX_VOCAB, H);
    og_op_attrs norm = {.eps = 1e-5};
    og_op_attrs qnorm = {.eps = 1e-6, .heads = OG_FIX_HEADS};
    og_op_attrs rq = {.heads = OG_FIX_HEADS, .head_dim = OG_FIX_HEAD_DIM, .theta = 500000.0,
                      .rope_type = OG_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0, .original_max_position_embeddings = 8192};
    og_op_attrs rk = rq;
    rk.heads = OG_FIX_KV_HEADS;
    instr(&b, OG_OP_EMBED, "x0", NULL, 2, "tokens", "embed");
    for (int l = 0; l < 2; l++) {
        char n[24][40];
#define NM(i, fmt) (snprintf(n[i], sizeof n[i], fmt, l), n[i])
        weight(&b, NM(0, "l%d.attn_norm"), OG_DTYPE_F32, H, 0);
        weight(&b, NM(1, "l%d.wq"), OG_DTYPE_BF16, QW, H);
        weight(&b, NM(2, "l%d.wk"), OG_DTYPE_BF16, KW, H);
        weight(&b, NM(3, "l%d.wv"), OG_DTYPE_BF16, KW, H);
        /* a bias has its weight's dtype (the validator's rule: the kernels
         * read it as the weight's) */
        weight(&b, NM(4, "l%d.bv"), OG_DTYPE_BF16, KW, 0);
        weight(&b, NM(5, "l%d.q_norm"), OG_DTYPE_F32, OG_FIX_HEAD_DIM, 0);
        weight(&b, NM(6, "l%d.wo"), OG_DTYPE_BF16, H, QW);
        weight(&b, NM(7, "l%d.mlp_norm"), OG_DTYPE_F32, H, 0);
        weight(&b, NM(8, "l%d.gate"), OG_DTYPE_BF16, F, H);
        weight(&b, NM(9, "l%d.up"), OG_DTYPE_BF16, F, H);
        weight(&b, NM(10, "l%d.down"), OG_DTYPE_BF16, H, F);
        og_op_attrs att = {.layer_id = l, .n_heads = OG_FIX_HEADS, .n_kv_heads = OG_FIX_KV_HEADS,
                           .head_dim = OG_FIX_HEAD_DIM, .scale = 0};
        instr(&b, OG_OP_RMS_NORM, NM(11, "l%d.h"), &norm, 2, l ? "l0.out" : "x0", n[0]);
        instr(&b, OG_OP_MATMUL, NM(12, "l%d.q"), NULL, 2, n[11], n[1]);
        instr(&b, OG_OP_MATMUL, NM(13, "l%d.k"), NULL, 2, n[11], n[2]);
        instr(&b, OG_OP_MATMUL, NM(14, "l%d.v"), NULL, 3, n[11], n[3], n[4]);
        instr(&b, OG_OP_HEAD_RMS_NORM, NM(15, "l%d.qn"), &qnorm, 2, n[12], n[5]);
        instr(&b, OG_OP_ROPE, NM(16, "l%d.qr"), &rq, 2, n[15], "positions");
        instr(&b, OG_OP_ROPE, NM(17, "l%d.kr"), &rk, 2, n[13], "positions");
        char kc[16], vc[16];
        snprintf(kc, sizeof kc, "kv.%d.k", l);
        snprintf(vc, sizeof vc, "kv.%d.v", l);
        instr(&b, OG_OP_UPDATE_AND_ATTEND, NM(18, "l%d.attn"), &att, 6, n[16], n[17], n[14], "positions", kc, vc);
        instr(&b, OG_OP_MATMUL, NM(19, "l%d.o"), NULL, 2, n[18], n[6]);
        instr(&b, OG_OP_ADD, NM(20, "l%d.mid"), NULL, 2, l ? "l0.out" : "x0", n[19]);
        instr(&b, OG_OP_RMS_NORM, NM(21, "l%d.h2"), &norm, 2, n[20], n[7]);
        instr(&b, OG_OP_MATMUL, NM(22, "l%d.g"), NULL, 2, n[21], n[8]);
        instr(&b, OG_OP_MATMUL, NM(23, "l%d.u"), NULL, 2, n[21], n[9]);
        instr(&b, OG_OP_SWIGLU, NM(11, "l%d.s"), NULL, 2, n[22], n[23]);
        instr(&b, OG_OP_MATMUL, NM(12, "l%d.d"), NULL, 2, n[11], n[10]);
        instr(&b, OG_OP_ADD, NM(13, "l%d.out"), NULL, 2, n[20], n[12]);
#undef NM
    }
    weight(&b, "final_norm", OG_DTYPE_F32, H, 0);
    instr(&b, OG_OP_RMS_NORM, "xn", &norm, 2, "l1.out", "final_norm");
    instr(&b, OG_OP_MATMUL, "logits", NULL, 2, "xn", "embed");
    if (b.st == OG_OK) b.st = og_program_writer_add_kv_runtime(b.w);
    if (b.st == OG_OK) b.st = og_program_writer_finish(b.w, NULL, NULL);
    if (b.st != OG_OK) og_set_error(b.st, "%s", og_program_writer_last_error(b.w));
    og_program_writer_destroy(b.w);
    return b.st;
}

uint8_t *og_fixture_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) *size = (size_t)n;
    return buf;
}

/* ------------------------------------------------------ broken files */

typedef struct file_parts {
    uint8_t header[OG_PROGRAM_HEADER_SIZE];
    cJSON *root;
    const uint8_t *payload;
    uint64_t payload_bytes;
} file_parts;

static cJSON *item(cJSON *arr, int i) { return cJSON_GetArrayItem(arr, i); }
static cJSON *get(cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static void set_num(cJSON *o, const char *k, double v) { cJSON_ReplaceItemInObjectCaseSensitive(o, k, cJSON_CreateNumber(v)); }
static void set_str(cJSON *o, const char *k, const char *v) { cJSON_ReplaceItemInObjectCaseSensitive(o, k, cJSON_CreateString(v)); }

static cJSON *tensor(file_parts *f, const char *name) {
    cJSON *t;
    cJSON_ArrayForEach(t, get(f->root, "tensors"))
        if (strcmp(get(t, "name")->valuestring, name) == 0) return t;
    return NULL;
}
static cJSON *kv(file_parts *f) { return get(f->root, "kv"); }
static cJSON *layer(file_parts *f, int i) { return item(get(kv(f), "layers"), i); }
static cJSON *ins(file_parts *f, int i) { return item(get(f->root, "instructions"), i); }
static void put_le32(uint8_t *b, uint32_t v) { for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> 8 * i); }

/* Each mutation breaks exactly one rule of a valid file. Instruction 1 is
 * the rms_norm of layer 0 (x0, l0.attn_norm). */
static void m_magic(file_parts *f) { f->header[0] = 'X'; }
static void m_version(file_parts *f) { put_le32(f->header + 8, 2); }
static void m_header(file_parts *f) { put_le32(f->header + 12, 1); }
static void m_manifest_json(file_parts *f) { (void)f; /* handled in build: truncated text */ }
static void m_required(file_parts *f) { cJSON_DeleteItemFromObjectCaseSensitive(get(f->root, "model"), "vocab_size"); }
static void m_field_type(file_parts *f) { set_str(get(f->root, "model"), "hidden_size", "16"); }
static void m_field_value(file_parts *f) { set_str(layer(f, 0), "policy", "sliding"); }
/* a dimension far over this build's limits (program.h), one per field */
static void m_huge_vocab(file_parts *f) { set_num(get(f->root, "model"), "vocab_size", 1099511627776.0); }
static void m_huge_hidden(file_parts *f) { set_num(get(f->root, "model"), "hidden_size", 2147483648.0); }
static void m_huge_ffn(file_parts *f) { set_num(get(f->root, "model"), "intermediate_size", 1099511627776.0); }
static void m_huge_layers(file_parts *f) { set_num(get(f->root, "model"), "num_hidden_layers", 1048576.0); }
static void m_huge_heads(file_parts *f) { set_num(get(f->root, "model"), "num_attention_heads", 2147483647.0); }
static void m_huge_kv_heads(file_parts *f) { set_num(get(f->root, "model"), "num_key_value_heads", 1048576.0); }
static void m_huge_head_dim(file_parts *f) { set_num(get(f->root, "model"), "head_dim", 1073741824.0); }
static void m_name_unique(file_parts *f) { set_str(tensor(f, "l0.wq"), "name", "l0.attn_norm"); }
static void m_dtype(file_parts *f) { set_str(tensor(f, "embed"), "dtype", "f8"); }
static void m_rank(file_parts *f) { cJSON_ReplaceItemInObjectCaseSensitive(tensor(f, "embed"), "shape", cJSON_CreateArray()); }
static void m_positive(file_parts *f) { cJSON_ReplaceItemInArray(get(tensor(f, "embed"), "shape"), 0, cJSON_CreateNumber(0)); }
static void m_overflow(file_parts *f) {
    double big[3] = {4294967296.0, 4294967296.0, 4294967296.0};
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(f, "embed"), "shape", cJSON_CreateDoubleArray(big, 3));
}
/* q8 rows of 16: not a whole group of OG_QUANT_GROUP */
static void m_quant(file_parts *f) { cJSON_ReplaceItemInObjectCaseSensitive(tensor(f, "embed"), "dtype", cJSON_CreateString("q8")); }
/* q4_k rows of 64: whole q8 groups, but not a whole super-block of
 * OG_KQUANT_BLOCK (the k-quants' own block) */
static void m_quant_k(file_parts *f) {
    const double shape[2] = {32, 64};
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(f, "embed"), "dtype", cJSON_CreateString("q4_k"));
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(f, "embed"), "shape", cJSON_CreateDoubleArray(shape, 2));
}
static void m_psize(file_parts *f) { set_num(tensor(f, "embed"), "nbytes", get(tensor(f, "embed"), "nbytes")->valuedouble + 2); }
static void m_pbounds(file_parts *f) {
    set_num(tensor(f, "final_norm"), "offset", (double)((f->payload_bytes + 63) / 64 * 64));
}
static void m_paligned(file_parts *f) { set_num(tensor(f, "l0.wq"), "offset", get(tensor(f, "l0.wq"), "offset")->valuedouble + 4); }
static void m_poverlap(file_parts *f) { set_num(tensor(f, "l0.wq"), "offset", get(tensor(f, "embed"), "offset")->valuedouble); }
static void m_rt_payload(file_parts *f) { cJSON_AddNumberToObject(tensor(f, "kv.1.v"), "offset", 0); }
static void m_rt_layer(file_parts *f) { set_num(tensor(f, "kv.1.k"), "layer_id", 0); }
static void m_has_kv(file_parts *f) {
    cJSON *arr = get(f->root, "tensors");
    for (int i = 0; i < cJSON_GetArraySize(arr); i++)
        if (strcmp(get(item(arr, i), "name")->valuestring, "kv.1.v") == 0) cJSON_DeleteItemFromArray(arr, i);
}
static void m_rt_shape(file_parts *f) { cJSON_ReplaceItemInArray(get(tensor(f, "kv.1.k"), "shape"), 0, cJSON_CreateNumber(64)); }
static void m_layer_id(file_parts *f) { set_num(layer(f, 1), "layer_id", 2); }
static void m_kv_ring(file_parts *f) { set_num(layer(f, 1), "window", 0); }
static void m_kv_flat(file_parts *f) { set_num(layer(f, 0), "window", 3); }
static void m_kv_write(file_parts *f) { set_num(kv(f), "max_write", 0); }
static void m_kv_init(file_parts *f) { set_num(kv(f), "initial_capacity", 65); }
static void m_kv_cap(file_parts *f) { set_num(kv(f), "max_capacity", 0); }
static void m_kv_dtype(file_parts *f) { set_str(kv(f), "kv_dtype", "i32"); }
static void m_kv_version(file_parts *f) { set_num(kv(f), "version", 2); }
static void m_kv_count(file_parts *f) { cJSON_ReplaceItemInObjectCaseSensitive(kv(f), "layers", cJSON_CreateArray()); }
static void m_kv_heads(file_parts *f) { set_num(layer(f, 0), "n_kv_heads", 0); }
static void m_kv_head_dim(file_parts *f) { set_num(layer(f, 1), "head_dim", 0); }
/* Adds kv.states [{layer_id, name, dtype, shape [d0, d1]}]. */
static void add_state(file_parts *f, int layer_id, const char *name, const char *dt, int d0, int d1) {
    cJSON *arr = cJSON_AddArrayToObject(kv(f), "states"), *e = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    cJSON_AddNumberToObject(e, "layer_id", layer_id);
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "dtype", dt);
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(d0));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(d1));
    cJSON_AddItemToObject(e, "shape", shape);
    cJSON_AddItemToArray(arr, e);
}
/* ... and its runtime tensor state.<layer_id>.<name>. */
static void add_state_tensor(file_parts *f, int layer_id, const char *name, int d0, int d1) {
    cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    char tn[48];
    snprintf(tn, sizeof tn, "state.%d.%s", layer_id, name);
    cJSON_AddStringToObject(e, "name", tn);
    cJSON_AddStringToObject(e, "dtype", "f32");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(d0));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(d1));
    cJSON_AddItemToObject(e, "shape", shape);
    cJSON_AddStringToObject(e, "binding", "runtime");
    cJSON_AddNumberToObject(e, "layer_id", layer_id);
    cJSON_AddStringToObject(e, "state", name);
    cJSON_AddItemToArray(get(f->root, "tensors"), e);
}
static void m_state_owner(file_parts *f) { add_state(f, 2, "conv", "f32", 3, 16); }
static void m_state_name(file_parts *f) { add_state(f, 0, "", "f32", 3, 16); }
static void m_state_dtype(file_parts *f) { add_state(f, 0, "conv", "bf16", 3, 16); }
static void m_state_shape(file_parts *f) { add_state(f, 0, "conv", "f32", 3, -16); }
static void m_has_state(file_parts *f) { add_state(f, 0, "conv", "f32", 3, 16); }
static void m_state_used(file_parts *f) {
    add_state(f, 0, "conv", "f32", 3, 16);
    add_state_tensor(f, 0, "conv", 3, 16);
}
static void m_inputs(file_parts *f) { set_str(item(get(f->root, "inputs"), 1), "dtype", "i64"); }
static void m_unknown_op(file_parts *f) { set_str(ins(f, 1), "op", "conv2d"); }
static void m_count(file_parts *f) { cJSON_AddItemToArray(get(ins(f, 0), "in"), cJSON_CreateString("positions")); }
static void m_exists(file_parts *f) { cJSON_ReplaceItemInArray(get(ins(f, 1), "in"), 0, cJSON_CreateString("x9")); }
static void m_shape(file_parts *f) { cJSON_ReplaceItemInArray(get(ins(f, 1), "in"), 1, cJSON_CreateString("l0.wq")); }
static void m_attr(file_parts *f) { set_num(get(ins(f, 1), "attrs"), "eps", 0); }
static void m_value_name(file_parts *f) { set_str(ins(f, 1), "out", "x0"); }
static void m_outputs(file_parts *f) { cJSON_ReplaceItemInArray(get(item(get(f->root, "outputs"), 0), "shape"), 1, cJSON_CreateNumber(31)); }

typedef struct mutation {
    og_broken_case c;
    void (*fn)(file_parts *);
} mutation;

#define R(x) OG_PROGRAM_RULE_##x
#define KV(x) OG_KV_RULE_##x
static const mutation k_mutations[] = {
    {{"magic.ogp", R(MAGIC), KV(NONE)}, m_magic},
    {{"version.ogp", R(VERSION), KV(NONE)}, m_version},
    {{"header.ogp", R(HEADER), KV(NONE)}, m_header},
    {{"manifest_json.ogp", R(MANIFEST_JSON), KV(NONE)}, m_manifest_json},
    {{"required_field.ogp", R(REQUIRED_FIELD), KV(NONE)}, m_required},
    {{"field_type.ogp", R(FIELD_TYPE), KV(NONE)}, m_field_type},
    {{"field_value.ogp", R(FIELD_VALUE), KV(NONE)}, m_field_value},
    {{"model.vocab_size.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_vocab},
    {{"model.hidden_size.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_hidden},
    {{"model.intermediate_size.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_ffn},
    {{"model.num_hidden_layers.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_layers},
    {{"model.num_attention_heads.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_heads},
    {{"model.num_key_value_heads.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_kv_heads},
    {{"model.head_dim.ogp", R(FIELD_VALUE), KV(NONE)}, m_huge_head_dim},
    {{"tensor_name_unique.ogp", R(TENSOR_NAME_UNIQUE), KV(NONE)}, m_name_unique},
    {{"dtype_known.ogp", R(DTYPE_KNOWN), KV(NONE)}, m_dtype},
    {{"shape_rank.ogp", R(SHAPE_RANK), KV(NONE)}, m_rank},
    {{"shape_positive.ogp", R(SHAPE_POSITIVE), KV(NONE)}, m_positive},
    {{"shape_overflow.ogp", R(SHAPE_OVERFLOW), KV(NONE)}, m_overflow},
    {{"quant_shape.ogp", R(QUANT_SHAPE), KV(NONE)}, m_quant},
    {{"quant_shape.q4_k.ogp", R(QUANT_SHAPE), KV(NONE)}, m_quant_k},
    {{"payload_size.ogp", R(PAYLOAD_SIZE), KV(NONE)}, m_psize},
    {{"payload_bounds.ogp", R(PAYLOAD_BOUNDS), KV(NONE)}, m_pbounds},
    {{"payload_aligned.ogp", R(PAYLOAD_ALIGNED), KV(NONE)}, m_paligned},
    {{"payload_overlap.ogp", R(PAYLOAD_OVERLAP), KV(NONE)}, m_poverlap},
    {{"runtime_no_payload.ogp", R(RUNTIME_NO_PAYLOAD), KV(NONE)}, m_rt_payload},
    {{"runtime_matches_layer.ogp", R(RUNTIME_MATCHES_LAYER), KV(NONE)}, m_rt_layer},
    {{"layer_has_kv.ogp", R(LAYER_HAS_KV), KV(NONE)}, m_has_kv},
    {{"runtime_shape.ogp", R(RUNTIME_SHAPE), KV(NONE)}, m_rt_shape},
    {{"layer_id.ogp", R(LAYER_ID), KV(NONE)}, m_layer_id},
    {{"kv_manifest.ring_window.ogp", R(KV_MANIFEST), KV(RING_WINDOW)}, m_kv_ring},
    {{"kv_manifest.flat_window.ogp", R(KV_MANIFEST), KV(FLAT_WINDOW)}, m_kv_flat},
    {{"kv_manifest.max_write.ogp", R(KV_MANIFEST), KV(MAX_WRITE)}, m_kv_write},
    {{"kv_manifest.initial_capacity.ogp", R(KV_MANIFEST), KV(INITIAL_CAPACITY)}, m_kv_init},
    {{"kv_manifest.max_capacity.ogp", R(KV_MANIFEST), KV(MAX_CAPACITY)}, m_kv_cap},
    {{"kv_manifest.kv_dtype.ogp", R(KV_MANIFEST), KV(KV_DTYPE)}, m_kv_dtype},
    {{"kv_manifest.version.ogp", R(KV_MANIFEST), KV(VERSION)}, m_kv_version},
    {{"kv_manifest.layer_count.ogp", R(KV_MANIFEST), KV(LAYER_COUNT)}, m_kv_count},
    {{"kv_manifest.kv_heads.ogp", R(KV_MANIFEST), KV(KV_HEADS)}, m_kv_heads},
    {{"kv_manifest.head_dim.ogp", R(KV_MANIFEST), KV(HEAD_DIM)}, m_kv_head_dim},
    {{"graph_inputs.ogp", R(GRAPH_INPUTS), KV(NONE)}, m_inputs},
    {{"unknown_op.ogp", R(UNKNOWN_OP), KV(NONE)}, m_unknown_op},
    {{"operand_count.ogp", R(OPERAND_COUNT), KV(NONE)}, m_count},
    {{"operand_exists.ogp", R(OPERAND_EXISTS), KV(NONE)}, m_exists},
    {{"operand_shape.ogp", R(OPERAND_SHAPE), KV(NONE)}, m_shape},
    {{"attr_value.ogp", R(ATTR_VALUE), KV(NONE)}, m_attr},
    {{"value_name_unique.ogp", R(VALUE_NAME_UNIQUE), KV(NONE)}, m_value_name},
    {{"graph_outputs.ogp", R(GRAPH_OUTPUTS), KV(NONE)}, m_outputs},
    {{"kv_manifest.state_owner.ogp", R(KV_MANIFEST), KV(STATE_OWNER)}, m_state_owner},
    {{"kv_manifest.state_name.ogp", R(KV_MANIFEST), KV(STATE_NAME)}, m_state_name},
    {{"kv_manifest.state_dtype.ogp", R(KV_MANIFEST), KV(STATE_DTYPE)}, m_state_dtype},
    {{"kv_manifest.state_shape.ogp", R(KV_MANIFEST), KV(STATE_SHAPE)}, m_state_shape},
    {{"layer_has_state.ogp", R(LAYER_HAS_STATE), KV(NONE)}, m_has_state},
    {{"state_used_once.ogp", R(STATE_USED_ONCE), KV(NONE)}, m_state_used},
};
#define N_MUTATIONS ((int)(sizeof k_mutations / sizeof k_mutations[0]))

static og_broken_case g_cases[N_MUTATIONS];

const og_broken_case *og_broken_cases(int *n) {
    for (int i = 0; i < N_MUTATIONS; i++) g_cases[i] = k_mutations[i].c;
    *n = N_MUTATIONS;
    return g_cases;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}
static void put_le64(uint8_t *b, uint64_t v) { for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i); }

og_status og_broken_build(int i, const uint8_t *valid, size_t valid_size, uint8_t **out, size_t *out_size) {
    if (i < 0 || i >= N_MUTATIONS || valid_size < OG_PROGRAM_HEADER_SIZE)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "broken case %d: bad index or input", i);
    file_parts f;
    memcpy(f.header, valid, sizeof f.header);
    uint64_t mlen = le64(valid + 16), poff = le64(valid + 24);
    f.payload_bytes = le64(valid + 32);
    f.payload = valid + poff;
    f.root = cJSON_ParseWithLength((const char *)valid + OG_PROGRAM_HEADER_SIZE, (size_t)mlen);
    if (!f.root) return og_set_error(OG_ERR_FORMAT, "broken case %d: the valid file's manifest does not parse", i);
    k_mutations[i].fn(&f);
    char *text = cJSON_PrintUnformatted(f.root);
    cJSON_Delete(f.root);
    if (!text) return og_set_error(OG_ERR_OUT_OF_MEMORY, "broken case %d: out of memory", i);
    size_t tlen = strlen(text);
    if (k_mutations[i].fn == m_manifest_json) tlen--; /* drop the closing brace */
    uint64_t new_poff = (OG_PROGRAM_HEADER_SIZE + tlen + 63) / 64 * 64;
    size_t total = (size_t)(new_poff + f.payload_bytes);
    uint8_t *buf = calloc(1, total);
    if (!buf) {
        cJSON_free(text);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "broken case %d: out of memory", i);
    }
    memcpy(buf, f.header, sizeof f.header);
    put_le64(buf + 16, tlen);
    put_le64(buf + 24, new_poff);
    memcpy(buf + OG_PROGRAM_HEADER_SIZE, text, tlen);
    memcpy(buf + new_poff, f.payload, (size_t)f.payload_bytes);
    cJSON_free(text);
    *out = buf;
    *out_size = total;
    return OG_OK;
}
