/* GGUF import.
 *
 * Reader: a file built byte by byte here (every value type, arrays,
 * alignment, offsets) reads back as written, and each malformed variant of
 * it (and every truncation) is refused naming the problem.
 * Parity: tests/data/gguf/ holds GGUF files written from the Hugging Face
 * fixtures by the gguf package (tests/fixtures/make_gguf_fixtures.py). The
 * GGUF and the checkpoint export to programs whose weights are the same
 * bits (f32, bf16), within f16 rounding (f16) or equal to the gguf package's
 * own dequantization (q8_0), and whose logits over the fixture's 64 tokens
 * are the same bits (f32, bf16) or within a stated bound (f16, q8_0). The
 * tokenizer rebuilt from the metadata encodes the parity cases of
 * tests/data/tokenizers/ as Hugging Face tokenizers did.
 * Exporter refusals: a small model GGUF built here, altered one way at a
 * time. */
#include "harness.h"
#include "kernels/moe.h"
#include "core/core.h"
#include "kernels/ops.h"
#include "import/export.h"
#include "import/gguf.h"
#include "import/hf_config.h"
#include "import/safetensors.h"
#include "text/tokenizer.h"
#include "program/program.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ a byte builder */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static void put(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void u8(gb *b, uint8_t v) { put(b, &v, 1); }
static void u32(gb *b, uint32_t v) { put(b, &v, 4); } /* the test machine is little-endian */
static void u64(gb *b, uint64_t v) { put(b, &v, 8); }
static void str(gb *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad_to(gb *b, size_t align) {
    while (b->n % align) u8(b, 0);
}

/* ------------------------------------------------------------ reader */

enum {
    V_OK, V_MAGIC, V_VERSION1, V_BIG_ENDIAN, V_KV_COUNT, V_TENSOR_COUNT, V_STR_LEN, V_ARRAY_COUNT, V_VALUE_TYPE,
    V_NESTED, V_BOOL, V_DUP_KEY, V_NDIMS, V_NE_ZERO, V_NE_OVERFLOW, V_GGML_TYPE, V_BLOCK, V_MISALIGNED, V_PAST_END,
    V_OVERLAP, V_DUP_TENSOR, V_ALIGN_POW2, V_ALIGN_TYPE, V_COUNT
};

/* The reference file, or one variant of it. 14 key/values, 2 tensors:
 * "a" f32 ne [4, 2] at 0, "b" q8_0 ne [32] at 64; alignment 64. */
static void build_reader_file(gb *b, int v) {
    b->n = 0;
    put(b, v == V_MAGIC ? "GGUX" : "GGUF", 4);
    u32(b, v == V_VERSION1 ? 1 : v == V_BIG_ENDIAN ? 0x03000000u : 3);
    u64(b, v == V_TENSOR_COUNT ? (1ull << 40) : 2);
    u64(b, v == V_KV_COUNT ? (1ull << 40) : 15);
    str(b, "t.u8"), u32(b, OG_GGUF_U8), u8(b, 200);
    str(b, "t.i8"), u32(b, OG_GGUF_I8), u8(b, (uint8_t)-5);
    str(b, "t.u16"), u32(b, OG_GGUF_U16), put(b, &(uint16_t){60000}, 2);
    str(b, "t.i16"), u32(b, OG_GGUF_I16), put(b, &(int16_t){-300}, 2);
    str(b, v == V_DUP_KEY ? "t.u8" : "t.u32"), u32(b, OG_GGUF_U32), u32(b, 4000000000u);
    str(b, "t.i32"), u32(b, v == V_VALUE_TYPE ? 13 : OG_GGUF_I32), u32(b, (uint32_t)-7);
    str(b, "t.f32"), u32(b, OG_GGUF_F32), put(b, &(float){1.5f}, 4);
    str(b, "t.bool"), u32(b, OG_GGUF_BOOL), u8(b, v == V_BOOL ? 2 : 1);
    str(b, "t.str"), u32(b, OG_GGUF_STRING);
    if (v == V_STR_LEN) u64(b, 1ull << 50), put(b, "x", 1);
    else str(b, "h\xc3\xa9llo");
    str(b, "t.u64"), u32(b, OG_GGUF_U64), u64(b, 1ull << 60);
    str(b, "t.i64"), u32(b, OG_GGUF_I64), u64(b, (uint64_t)-(1ll << 50));
    str(b, "t.f64"), u32(b, OG_GGUF_F64), put(b, &(double){-2.25}, 8);
    str(b, "t.ai32"), u32(b, OG_GGUF_ARRAY), u32(b, v == V_NESTED ? OG_GGUF_ARRAY : OG_GGUF_I32);
    u64(b, v == V_ARRAY_COUNT ? (1ull << 61) : 3), u32(b, 1), u32(b, 2), u32(b, 3);
    str(b, "t.astr"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_STRING), u64(b, 2), str(b, "a"), str(b, "bc");
    str(b, "general.alignment");
    if (v == V_ALIGN_TYPE) u32(b, OG_GGUF_U64), u64(b, 64);
    else u32(b, OG_GGUF_U32), u32(b, v == V_ALIGN_POW2 ? 48 : 64);
    /* tensor "a" */
    str(b, "a"), u32(b, v == V_NDIMS ? 5 : 2);
    u64(b, v == V_NE_ZERO ? 0 : v == V_NE_OVERFLOW ? (1ull << 40) : 4), u64(b, v == V_NE_OVERFLOW ? (1ull << 40) : 2);
    if (v == V_NDIMS) u64(b, 1), u64(b, 1), u64(b, 1);
    u32(b, v == V_GGML_TYPE ? 99 : OG_GGML_F32), u64(b, v == V_MISALIGNED ? 4 : 0);
    /* tensor "b" */
    str(b, v == V_DUP_TENSOR ? "a" : "b"), u32(b, 1), u64(b, v == V_BLOCK ? 33 : 32), u32(b, OG_GGML_Q8_0);
    u64(b, v == V_PAST_END ? 1u << 20 : v == V_OVERLAP ? 0 : 64);
    pad_to(b, 64);
    for (int i = 0; i < 8; i++) put(b, &(float){(float)i + 0.5f}, 4);
    pad_to(b, 64);
    put(b, &(uint16_t){0x3c00}, 2); /* scale 1.0 */
    for (int i = 0; i < 32; i++) u8(b, (uint8_t)(i - 16));
}

static void reader_reads_back(void) {
    og_test_section("reader: every value type, arrays, alignment, tensors");
    gb b = {0};
    build_reader_file(&b, V_OK);
    og_gguf *g = NULL;
    CHECK_OK(og_gguf_open_memory(b.p, b.n, "built", &g));
    if (!g) return;
    CHECK(og_gguf_version(g) == 3 && og_gguf_alignment(g) == 64 && og_gguf_n_kv(g) == 15);
    int64_t i;
    double f;
    bool bo;
    char *s = NULL;
    CHECK_OK(og_gguf_get_int(g, "t.u8", true, 0, 1000, &i, NULL)); CHECK(i == 200);
    CHECK_OK(og_gguf_get_int(g, "t.i8", true, -10, 0, &i, NULL)); CHECK(i == -5);
    CHECK_OK(og_gguf_get_int(g, "t.u16", true, 0, 70000, &i, NULL)); CHECK(i == 60000);
    CHECK_OK(og_gguf_get_int(g, "t.i16", true, -1000, 0, &i, NULL)); CHECK(i == -300);
    CHECK_OK(og_gguf_get_int(g, "t.u32", true, 0, INT64_MAX, &i, NULL)); CHECK(i == 4000000000ll);
    CHECK_OK(og_gguf_get_int(g, "t.i32", true, -10, 10, &i, NULL)); CHECK(i == -7);
    CHECK_OK(og_gguf_get_int(g, "t.u64", true, 0, INT64_MAX, &i, NULL)); CHECK(i == 1ll << 60);
    CHECK_OK(og_gguf_get_int(g, "t.i64", true, INT64_MIN, 0, &i, NULL)); CHECK(i == -(1ll << 50));
    CHECK_OK(og_gguf_get_float(g, "t.f32", true, &f, NULL)); CHECK(f == 1.5);
    CHECK_OK(og_gguf_get_float(g, "t.f64", true, &f, NULL)); CHECK(f == -2.25);
    CHECK_OK(og_gguf_get_bool(g, "t.bool", true, &bo, NULL)); CHECK(bo);
    CHECK_OK(og_gguf_get_str(g, "t.str", true, &s, NULL)); CHECK(s && !strcmp(s, "h\xc3\xa9llo"));
    og_free(s);
    /* range, type and presence are checked, naming the key */
    CHECK_STATUS(og_gguf_get_int(g, "t.u8", true, 0, 100, &i, NULL), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "\"t.u8\" = 200") != NULL);
    CHECK_STATUS(og_gguf_get_int(g, "t.str", true, 0, 100, &i, NULL), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "\"t.str\" has type string") != NULL);
    CHECK_STATUS(og_gguf_get_int(g, "t.none", true, 0, 100, &i, NULL), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "required key \"t.none\"") != NULL);
    bool found = true;
    i = 42;
    CHECK_OK(og_gguf_get_int(g, "t.none", false, 0, 100, &i, &found)); CHECK(!found && i == 42);
    const og_gguf_kv *a = og_gguf_find_kv(g, "t.ai32");
    CHECK(a && a->type == OG_GGUF_ARRAY && a->elem_type == OG_GGUF_I32 && a->count == 3);
    if (a) {
        int32_t e[3];
        memcpy(e, a->elems, sizeof e);
        CHECK(e[0] == 1 && e[1] == 2 && e[2] == 3);
    }
    const og_gguf_kv *as = og_gguf_find_kv(g, "t.astr");
    CHECK(as && as->count == 2 && as->strs[1].len == 2 && !memcmp(as->strs[1].p, "bc", 2));
    const og_gguf_tensor *ta = og_gguf_find_tensor(g, "a"), *tb = og_gguf_find_tensor(g, "b");
    CHECK(ta && ta->n_dims == 2 && ta->ne[0] == 4 && ta->ne[1] == 2 && ta->numel == 8 && ta->nbytes == 32);
    CHECK(tb && tb->type == OG_GGML_Q8_0 && tb->numel == 32 && tb->nbytes == 34);
    if (ta && tb) {
        CHECK(((const float *)ta->data)[7] == 7.5f);
        CHECK((size_t)((const uint8_t *)ta->data - b.p) % 64 == 0);
        CHECK((const uint8_t *)tb->data - (const uint8_t *)ta->data == 64);
        CHECK(((const int8_t *)tb->data)[2] == -16);
    }
    CHECK(!strcmp(og_ggml_type_name(12), "q4_K") && og_ggml_type_name(99) == NULL);
    og_gguf_close(g);
    free(b.p);
}

static void reader_refuses(void) {
    og_test_section("reader: malformed files are refused, naming the problem");
    static const struct {
        int v;
        og_status st;
        const char *needle;
    } cases[] = {
        {V_MAGIC, OG_ERR_FORMAT, "no \"GGUF\" magic"},
        {V_VERSION1, OG_ERR_UNSUPPORTED, "\"version\" = 1"},
        {V_BIG_ENDIAN, OG_ERR_UNSUPPORTED, "big-endian"},
        {V_KV_COUNT, OG_ERR_FORMAT, "\"metadata_kv_count\" = 1099511627776"},
        {V_TENSOR_COUNT, OG_ERR_FORMAT, "\"tensor_count\" = 1099511627776"},
        {V_STR_LEN, OG_ERR_FORMAT, "t.str at byte"},
        {V_ARRAY_COUNT, OG_ERR_FORMAT, "\"t.ai32\": array of 2305843009213693952 i32 elements does not fit"},
        {V_VALUE_TYPE, OG_ERR_FORMAT, "\"t.i32\": unknown value type 13"},
        {V_NESTED, OG_ERR_UNSUPPORTED, "\"t.ai32\": arrays of arrays"},
        {V_BOOL, OG_ERR_FORMAT, "\"t.bool\": bool value 2"},
        {V_DUP_KEY, OG_ERR_FORMAT, "key \"t.u8\" is given twice"},
        {V_NDIMS, OG_ERR_FORMAT, "tensor \"a\": n_dims 5"},
        {V_NE_ZERO, OG_ERR_FORMAT, "tensor \"a\": ne[0] = 0"},
        {V_NE_OVERFLOW, OG_ERR_FORMAT, "tensor \"a\": ne[1] = 1099511627776: zero, or too many"},
        {V_GGML_TYPE, OG_ERR_FORMAT, "tensor \"a\": unknown ggml type 99"},
        {V_BLOCK, OG_ERR_FORMAT, "tensor \"b\": ne[0] = 33 is not a multiple of the q8_0 block of 32"},
        {V_MISALIGNED, OG_ERR_FORMAT, "tensor \"a\": offset 4 is not a multiple of the alignment 64"},
        {V_PAST_END, OG_ERR_FORMAT, "tensor \"b\": bytes [1048576, +34)"},
        {V_OVERLAP, OG_ERR_FORMAT, "tensors \"a\" and \"b\" overlap"},
        {V_DUP_TENSOR, OG_ERR_FORMAT, "tensor \"a\" is given twice"},
        {V_ALIGN_POW2, OG_ERR_FORMAT, "\"general.alignment\" = 48: not a power of two"},
        {V_ALIGN_TYPE, OG_ERR_FORMAT, "\"general.alignment\" has type u64"},
    };
    gb b = {0};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        build_reader_file(&b, cases[k].v);
        og_gguf *g = NULL;
        og_status rc = og_gguf_open_memory(b.p, b.n, "bad", &g);
        CHECK_MSG(rc == cases[k].st && strstr(og_last_error(), cases[k].needle),
                  "variant %d: got %s \"%s\", want %s naming \"%s\"", cases[k].v, og_status_str(rc),
                  rc ? og_last_error() : "", og_status_str(cases[k].st), cases[k].needle);
        CHECK(g == NULL);
        og_gguf_close(g);
    }
    /* every truncation of the good file: refused, never read past the end
     * (a heap copy of exactly that many bytes, so ASan sees any overrun) */
    build_reader_file(&b, V_OK);
    int accepted = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, b.p, n);
        og_gguf *g = NULL;
        if (og_gguf_open_memory(cut, n, "cut", &g) == OG_OK) accepted++;
        og_gguf_close(g);
        free(cut);
    }
    CHECK_MSG(accepted == 0, "%d truncations of the file were accepted", accepted);
    free(b.p);
}

/* ------------------------------------------------------------ parity */

static og_program *export_open(bool gguf, const char *src, og_dtype dtype, og_dtype weights, char *path,
                               og_export_summary *sum) {
    strcpy(path, "/tmp/og_gguf_XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    og_export_options o;
    og_export_default_options(&o);
    o.dtype = dtype;
    o.weights = weights;
    og_status rc = gguf ? og_export_gguf(src, path, &o, sum) : og_export_hf(src, path, &o, sum);
    CHECK_MSG(rc == OG_OK, "export %s: %s", src, og_last_error());
    og_program *p = NULL;
    if (rc == OG_OK) CHECK_OK(og_program_open(path, &p));
    return p;
}

static float elem(const og_program_tensor *t, int64_t k) {
    if (og_dtype_is_quantized(t->dtype)) { /* one element of a quantized matrix, by the reference */
        const int64_t K = t->shape[1];
        float *row = malloc(sizeof(float) * (size_t)K), x;
        og_dequantize_row(t->dtype, t->data, t->shape[0], K, k / K, row);
        x = row[k % K];
        free(row);
        return x;
    }
    return og_load_f32(t->data, t->dtype, (size_t)k);
}

/* An expert stack [E, N, K] (moe) of a GGUF import against the gguf
 * package's dequantization of each expert's pieces: gate_up_proj is
 * experts.<e>.gate_proj then up_proj, down_proj experts.<e>.down_proj.
 * Returns the rows that differ. */
static int32_t compare_stack(const og_program_tensor *t, const og_safetensors *ref, og_dtype qt, const char *what) {
    const int64_t E = t->shape[0], N = t->shape[1], K = t->shape[2];
    const bool gu = strstr(t->name, "gate_up_proj") != NULL;
    const size_t plen = strlen(t->name) - strlen(gu ? "gate_up_proj" : "down_proj");
    int32_t bad = 0;
    CHECK_MSG(t->dtype == qt, "%s: %s is %s, not %s", what, t->name, og_dtype_name(t->dtype), og_dtype_name(qt));
    if (t->dtype != qt) return 1;
    float *row = malloc(sizeof(float) * (size_t)K);
    for (int64_t e = 0; e < E; e++) {
        const void *m = og_moe_expert(t->data, qt, e, N, K);
        for (int64_t r = 0; r < N; r++) {
            char name[256];
            const char *piece = gu ? (r < N / 2 ? "gate_proj" : "up_proj") : "down_proj";
            snprintf(name, sizeof name, "%.*s%lld.%s.weight", (int)plen, t->name, (long long)e, piece);
            const og_st_tensor *rt = og_safetensors_find(ref, name);
            const int64_t rr = gu && r >= N / 2 ? r - N / 2 : r;
            og_dequantize_row(qt, m, N, K, r, row);
            if ((!rt || memcmp(row, (const float *)rt->data + rr * K, sizeof(float) * (size_t)K)) && bad++ < 3)
                fprintf(stderr, "%s: %s expert %lld row %lld differs from %s\n", what, t->name, (long long)e,
                        (long long)r, name);
        }
    }
    free(row);
    return bad;
}

/* A GGUF q8_0 / q4_0 file imported as q8 / q4 (qt): every matrix is qt and
 * reads back as the gguf package's own dequantization (ref), bit for bit. */
static void compare_quantized(const og_program *a, const og_safetensors *ref, og_dtype qt, const char *what) {
    int32_t n = 0, bad = 0;
    for (int32_t i = 0; i < og_program_n_tensors(a); i++) {
        const og_program_tensor *t = og_program_tensor_at(a, i);
        if (t->binding == OG_BINDING_WEIGHT && t->rank == 3) { /* an expert stack: per expert, its pieces */
            bad += compare_stack(t, ref, qt, what);
            n++;
            continue;
        }
        if (t->binding != OG_BINDING_WEIGHT || t->rank != 2) continue;
        if (strstr(t->name, ".mlp.gate.weight")) continue; /* a router: kept float by design */
        const og_st_tensor *r = og_safetensors_find(ref, t->name);
        CHECK_MSG(t->dtype == qt && r && r->numel == t->shape[0] * t->shape[1], "%s: %s is %s, not %s of "
                  "the reference's shape", what, t->name, og_dtype_name(t->dtype), og_dtype_name(qt));
        if (t->dtype != qt || !r || r->numel != t->shape[0] * t->shape[1]) continue;
        n++;
        float *row = malloc(sizeof(float) * (size_t)t->shape[1]);
        for (int64_t rr = 0; rr < t->shape[0]; rr++) {
            og_dequantize_row(t->dtype, t->data, t->shape[0], t->shape[1], rr, row);
            if (memcmp(row, (const float *)r->data + rr * t->shape[1], sizeof(float) * (size_t)t->shape[1]) &&
                bad++ < 5)
                fprintf(stderr, "%s: %s row %lld differs from the gguf package's dequantization\n", what, t->name,
                        (long long)rr);
        }
        free(row);
    }
    CHECK_MSG(n >= 8 && bad == 0, "%s: %d %s matrices, %d rows differ", what, n, og_dtype_name(qt), bad);
}

/* Weights of a (GGUF) against b (HF) and, for q8_0, against ref (the gguf
 * package's dequantization): mode 0 same bits; 1 within f16 rounding. */
/* The name a GGUF import gives the weight the checkpoint's export names
 * name: a qwen3next file stores Qwen3-Next's fused linear-layer projections
 * split, as Qwen3.5 names them (src/import/export_gguf.c). */
static const char *gguf_weight_name(const char *name, char *buf, size_t cap) {
    static const char *const map[][2] = {{".in_proj_qkvz.weight.qkv", ".in_proj_qkv.weight"},
                                         {".in_proj_qkvz.weight.z", ".in_proj_z.weight"},
                                         {".in_proj_ba.weight.b", ".in_proj_b.weight"},
                                         {".in_proj_ba.weight.a", ".in_proj_a.weight"}};
    const size_t n = strlen(name);
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        const size_t m = strlen(map[k][0]);
        if (n > m && !strcmp(name + n - m, map[k][0])) {
            snprintf(buf, cap, "%.*s%s", (int)(n - m), name, map[k][1]);
            return buf;
        }
    }
    return name;
}

/* mode 0: the same bits; 1: within half an f16 ulp (an f16 file); 2: the
 * same bits but A_log, which a qwen3next file stores as -exp(A_log) and
 * the import takes the log of: within 2 f32 ulps (measured 1). */
static void compare_weights(const og_program *a, const og_program *b, const og_safetensors *ref, int mode,
                            const char *what) {
    int32_t n = 0, bad = 0, missing = 0;
    for (int32_t i = 0; i < og_program_n_tensors(b); i++) {
        const og_program_tensor *tb = og_program_tensor_at(b, i);
        if (tb->binding != OG_BINDING_WEIGHT) continue;
        char buf[256];
        int32_t j = og_program_find_tensor(a, gguf_weight_name(tb->name, buf, sizeof buf));
        const og_program_tensor *ta = j >= 0 ? og_program_tensor_at(a, j) : NULL;
        if (!ta || ta->nbytes != tb->nbytes || ta->dtype != tb->dtype || ta->rank != tb->rank ||
            memcmp(ta->shape, tb->shape, sizeof ta->shape)) {
            missing++;
            fprintf(stderr, "%s: %s missing or of another dtype/shape\n", what, tb->name);
            continue;
        }
        n++;
        const og_st_tensor *r = ref ? og_safetensors_find(ref, tb->name) : NULL;
        int64_t numel = (int64_t)(tb->nbytes / og_dtype_size(tb->dtype));
        const size_t len = strlen(tb->name);
        const bool a_log = mode == 2 && len > 6 && !strcmp(tb->name + len - 6, ".A_log");
        for (int64_t k = 0; k < numel; k++) {
            float x = elem(ta, k), y = elem(tb, k);
            bool ok;
            if (r) ok = memcmp(&x, &((const float *)r->data)[k], 4) == 0; /* f32 export of q8_0 */
            else if (a_log) ok = fabsf(x - y) <= ldexpf(fabsf(y), -22);
            else if (mode == 0 || mode == 2) ok = memcmp(&x, &y, 4) == 0;
            else ok = fabsf(x - y) <= ldexpf(fabsf(y), -11) + ldexpf(1.0f, -25); /* half an f16 ulp */
            if (!ok && bad++ < 5) fprintf(stderr, "%s: %s[%lld] = %.9g, want %.9g\n", what, tb->name, (long long)k, x,
                                          r ? ((const float *)r->data)[k] : y);
        }
    }
    CHECK_MSG(missing == 0 && n > 5, "%s: %d weights compared, %d missing", what, n, missing);
    CHECK_MSG(bad == 0, "%s: %d weight elements differ", what, bad);
}

/* Logits of the fixture's tokens, every position, f32 KV. */
static float *run_logits(const char *path, const int32_t *tok, int n, int64_t *V) {
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, NULL, &m));
    if (!m) return NULL;
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = OG_DTYPE_F32;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    *V = og_model_vocab_size(m);
    float *lg = malloc(sizeof(float) * (size_t)(*V * n));
    CHECK_OK(og_session_eval(s, tok, n, 0, lg, 1));
    og_session_destroy(s);
    og_model_destroy(m);
    return lg;
}

static int read_tokens(const char *hf_dir, int32_t *tok, int cap);

/* A quantized file kept quantized against the same file dequantized to f32
 * (exactly the same weight values): only the kernels' summation differs, so
 * the logits agree to float rounding, far tighter than against the
 * checkpoint. */
static void quant_vs_dequantized(const char *file, const char *hf) {
    char title[160], gpath[512], hdir[512], qa[64], fa[64];
    snprintf(title, sizeof title, "%s kept quantized vs dequantized to f32: the same logits", file);
    og_test_section(title);
    snprintf(gpath, sizeof gpath, "%s/gguf/%s", OG_TEST_DATA_DIR, file);
    snprintf(hdir, sizeof hdir, "%s/hf/%s", OG_TEST_DATA_DIR, hf);
    og_export_summary s1, s2;
    og_program *pq = export_open(true, gpath, OG_DTYPE_F32, OG_DTYPE_COUNT, qa, &s1);
    og_program *pf = export_open(true, gpath, OG_DTYPE_F32, OG_DTYPE_F32, fa, &s2);
    og_program_close(pq), og_program_close(pf);
    int32_t tok[128];
    const int n = read_tokens(hdir, tok, 128);
    int64_t V = 0, V2 = 0;
    float *lq = run_logits(qa, tok, n, &V), *lf = run_logits(fa, tok, n, &V2);
    CHECK(lq && lf && V == V2 && s1.weights != OG_DTYPE_F32 && s2.weights == OG_DTYPE_F32);
    double worst = 0;
    for (int64_t i = 0; lq && lf && V == V2 && i < V * n; i++) {
        const double d = fabs((double)lq[i] - lf[i]);
        if (!(d <= worst)) worst = d;
    }
    CHECK_MSG(worst <= 1e-3, "%s: max |logit diff| %g over 1e-3", title, worst);
    fprintf(stderr, "%s: max |logit diff| %g\n", title, worst);
    free(lq), free(lf);
    remove(qa), remove(fa);
}

static int read_tokens(const char *hf_dir, int32_t *tok, int cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokens.txt", hf_dir);
    char *text = og_test_read_file(path);
    int n = 0;
    for (char *p = text; p && *p && n < cap;) {
        tok[n++] = (int32_t)strtol(p, &p, 10);
        while (*p == ',' || *p == '\n' || *p == ' ') p++;
    }
    free(text);
    return n;
}

/* gguf file vs checkpoint: weights, then logits. bound < 0: same bits;
 * otherwise max |difference| allowed (and the greedy tokens must agree). */
#define Q4_BOUND 2.0 /* measured 1.73 (see the parity lines' output) */

static void parity(const char *file, const char *hf, og_dtype dtype, og_dtype weights, int mode, double bound,
                   og_dtype quant) {
    const bool q8 = quant != OG_DTYPE_COUNT; /* a quantized file (q8_0 as q8, q4_0 as q4) */
    char title[160], gpath[512], hdir[512], ga[64], ha[64];
    const bool as_q8 = q8 && weights == OG_DTYPE_COUNT; /* the default: the file's blocks stay quantized */
    snprintf(title, sizeof title, "parity: %s vs hf/%s as %s, weights %s", file, hf, og_dtype_name(dtype),
             as_q8 ? (quant == OG_DTYPE_Q8 ? "as stored (q8)" : "as stored (q4)") : og_dtype_name(weights));
    og_test_section(title);
    snprintf(gpath, sizeof gpath, "%s/gguf/%s", OG_TEST_DATA_DIR, file);
    snprintf(hdir, sizeof hdir, "%s/hf/%s", OG_TEST_DATA_DIR, hf);
    og_export_summary gs, hs;
    /* the checkpoint side stays float: the oracle */
    og_program *pg = export_open(true, gpath, dtype, weights, ga, &gs),
               *ph = export_open(false, hdir, dtype, dtype, ha, &hs);
    og_safetensors *ref = NULL;
    if (q8 && (dtype == OG_DTYPE_F32 || as_q8)) {
        char rpath[512];
        snprintf(rpath, sizeof rpath, "%s/gguf/%.*s.ref.safetensors", OG_TEST_DATA_DIR, (int)(strlen(file) - 5), file);
        CHECK_OK(og_safetensors_open_file(rpath, &ref));
    }
    if (pg && ph) {
        CHECK(gs.n_params == hs.n_params && gs.n_layers == hs.n_layers && gs.n_ring_layers == hs.n_ring_layers &&
              gs.max_context == hs.max_context && gs.trained_context == hs.trained_context && gs.has_tokenizer);
        /* same recipe: the same instructions, in order, with the same attributes */
        bool same = og_program_n_instrs(pg) == og_program_n_instrs(ph);
        for (int32_t i = 0; same && i < og_program_n_instrs(pg); i++) {
            const og_program_instr *x = og_program_instr_at(pg, i), *y = og_program_instr_at(ph, i);
            const og_op_attrs *p = &x->attrs, *q = &y->attrs;
            same = x->op == y->op && x->n_in == y->n_in && !strcmp(x->out, y->out) && p->eps == q->eps &&
                   p->heads == q->heads && p->head_dim == q->head_dim && p->theta == q->theta &&
                   p->rope_type == q->rope_type && p->factor == q->factor && p->low_freq_factor == q->low_freq_factor &&
                   p->high_freq_factor == q->high_freq_factor &&
                   p->original_max_position_embeddings == q->original_max_position_embeddings &&
                   p->layer_id == q->layer_id && p->n_heads == q->n_heads && p->n_kv_heads == q->n_kv_heads &&
                   p->scale == q->scale;
            if (!same) fprintf(stderr, "%s: instruction %d (%s) differs\n", title, i, x->out);
        }
        CHECK_MSG(same, "%s: the instruction lists differ", title);
        if (as_q8) compare_quantized(pg, ref, quant, title);
        else if (!q8 || ref) compare_weights(pg, ph, ref, mode, title);
        int32_t tok[128];
        int n = read_tokens(hdir, tok, 128);
        int64_t V = 0, V2 = 0;
        og_program_close(pg), og_program_close(ph);
        pg = ph = NULL;
        float *lg = run_logits(ga, tok, n, &V), *lh = run_logits(ha, tok, n, &V2);
        if (lg && lh && V == V2 && n >= 64) {
            double worst = 0;
            int argmax_diff = 0, close_calls = 0;
            for (int t = 0; t < n; t++) {
                int64_t a = 0, b = 0;
                og_argmax_ref(lg + t * V, V, &a);
                og_argmax_ref(lh + t * V, V, &b);
                if (a != b) { /* allowed only where the HF export's top two are within 2 x bound */
                    float top = lh[t * V + b], second = -INFINITY;
                    for (int64_t k = 0; k < V; k++)
                        if (k != b && lh[t * V + k] > second) second = lh[t * V + k];
                    if (bound >= 0 && top - second <= 2 * bound) close_calls++;
                    else argmax_diff++;
                }
                for (int64_t k = 0; k < V; k++) {
                    double d = fabs((double)lg[t * V + k] - lh[t * V + k]);
                    if (!(d <= worst)) worst = d;
                }
            }
            if (bound < 0) {
                CHECK_MSG(memcmp(lg, lh, sizeof(float) * (size_t)(V * n)) == 0,
                          "%s: logits differ (max |diff| %g)", title, worst);
            } else {
                CHECK_MSG(worst <= bound, "%s: max |logit diff| %g over the bound %g", title, worst, bound);
                CHECK_MSG(argmax_diff == 0, "%s: greedy token differs at %d of 64 positions whose top-2 gap is "
                          "over twice the bound", title, argmax_diff);
            }
            fprintf(stderr, "%s: max |logit diff| %g; greedy differs at %d of %d positions (top-2 gap within 2 x "
                    "bound), %d others\n", title, worst, close_calls, n, argmax_diff);
        } else {
            CHECK_MSG(0, "%s: no logits to compare", title);
        }
        free(lg), free(lh);
    }
    og_program_close(pg), og_program_close(ph);
    og_safetensors_close(ref);
    remove(ga), remove(ha);
}

/* The fixtures as the gguf package wrote them: the hyperparameters of the
 * Hugging Face config.json they came from, reversed dims, alignment. */
static void fixture_metadata(const char *file, const char *hf, uint64_t alignment, int32_t n_tensors) {
    char title[160], path[512];
    snprintf(title, sizeof title, "reader: %s has hf/%s's hyperparameters", file, hf);
    og_test_section(title);
    snprintf(path, sizeof path, "%s/gguf/%s", OG_TEST_DATA_DIR, file);
    og_gguf *g = NULL;
    CHECK_OK(og_gguf_open_file(path, &g));
    og_hf_config *c = malloc(sizeof *c);
    snprintf(path, sizeof path, "%s/hf/%s/config.json", OG_TEST_DATA_DIR, hf);
    CHECK_OK(og_hf_config_load(path, c));
    if (g) {
        const char *arch = og_hf_family_name(c->family);
        char key[96];
        int64_t v = -1;
        CHECK(og_gguf_version(g) == 3 && og_gguf_alignment(g) == alignment && og_gguf_n_tensors(g) == n_tensors);
        snprintf(key, sizeof key, "%s.block_count", arch);
        CHECK(og_gguf_get_int(g, key, true, 0, 1 << 20, &v, NULL) == OG_OK && v == c->num_hidden_layers);
        snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
        CHECK(og_gguf_get_int(g, key, true, 0, 1 << 20, &v, NULL) == OG_OK && v == c->num_key_value_heads);
        snprintf(key, sizeof key, "%s.context_length", arch);
        CHECK(og_gguf_get_int(g, key, true, 0, 1 << 30, &v, NULL) == OG_OK && v == c->max_position_embeddings);
        const og_gguf_tensor *t = og_gguf_find_tensor(g, "blk.0.ffn_down.weight");
        CHECK(t && t->n_dims == 2 && t->ne[0] == c->intermediate_size && t->ne[1] == c->hidden_size);
        t = og_gguf_find_tensor(g, "token_embd.weight");
        CHECK(t && t->ne[0] == c->hidden_size && t->ne[1] == c->vocab_size);
        const og_gguf_kv *tok = og_gguf_find_kv(g, "tokenizer.ggml.tokens");
        CHECK(tok && tok->count == (uint64_t)c->vocab_size);
    }
    free(c);
    og_gguf_close(g);
}

/* ------------------------------------------------------------ tokenizer */

static int32_t *json_ids(const cJSON *arr, int64_t *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) v[i++] = (int32_t)e->valuedouble;
    return v;
}

static size_t unhex(const char *h, unsigned char *out) {
    size_t n = 0;
    for (; h[0] && h[1]; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (unsigned char)v;
    }
    return n;
}

/* cases_name: tests/data/tokenizers/<name>/cases.json, or a path under
 * tests/data ending in .json.
 * hf_metaspace: the file is a SentencePiece vocabulary made from a
 * tokenizer.json (mistral-sw) whose Hugging Face form differs from
 * SentencePiece in three known ways, so those cases are checked in
 * SentencePiece's terms (the SentencePiece library's own oracle,
 * spm-bpe-cases.json, holds the rebuilt tokenizer to every case exactly):
 *  - it registers its <0xNN> byte pieces as added special tokens (the
 *    tokenizers library's trainer did), so Hugging Face matches "<0x41>"
 *    written in text as one token. A SentencePiece vocabulary never does,
 *    so only what follows the byte token must agree: the ids after the
 *    oracle's first one end ours, and our first one is not the byte token;
 *  - its Metaspace (prepend_scheme "first") puts no U+2581 before a text
 *    that starts with a space; SentencePiece always puts its dummy prefix,
 *    so ours is the oracle's ids after one more U+2581 piece (no piece has
 *    U+2581 inside, so the words merge apart);
 *  - it puts none after a special token written in the text either;
 *    SentencePiece (and llama.cpp) do: "<s> and </s> and <unk>", oracle
 *    [<s>, \u2581and, \u2581, </s>, \u2581and, \u2581, <unk>], is worked by hand as
 *    [<s>, \u2581, \u2581and, \u2581, </s>, \u2581, \u2581and, \u2581, <unk>] (" and " after
 *    <s> becomes "\u2581\u2581and\u2581"; nothing follows <unk>). */
static void tokenizer_parity(const char *file, const char *cases_name, const char *eos, bool hf_metaspace) {
    char title[160], path[512];
    snprintf(title, sizeof title, "tokenizer: %s vs %s", file, cases_name);
    og_test_section(title);
    snprintf(path, sizeof path, "%s/gguf/%s", OG_TEST_DATA_DIR, file);
    og_gguf *g = NULL;
    CHECK_OK(og_gguf_open_file(path, &g));
    char *json = NULL, *cfg = NULL;
    if (g) CHECK_OK(og_gguf_tokenizer(g, &json, &cfg));
    og_tokenizer *t = NULL;
    if (json) CHECK_OK(og_tokenizer_load_json(json, &t));
    if (t) CHECK_OK(og_tokenizer_load_config(t, cfg));
    if (strstr(cases_name, ".json")) snprintf(path, sizeof path, "%s/%s", OG_TEST_DATA_DIR, cases_name);
    else snprintf(path, sizeof path, "%s/tokenizers/%s/cases.json", OG_TEST_DATA_DIR, cases_name);
    char *text = og_test_read_file(path);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    CHECK(cases != NULL);
    int n_enc = 0, enc_bad = 0, n_dec = 0, dec_bad = 0, n_byte_text = 0, n_space_first = 0;
    if (t && cases) {
        const int32_t *eos_ids = NULL;
        CHECK(og_tokenizer_eos_ids(t, &eos_ids) == 1 && eos_ids && eos_ids[0] == og_tokenizer_token_id(t, eos));
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "encode")) {
            const char *hex = cJSON_GetObjectItem(c, "bytes_hex")->valuestring;
            unsigned char *bytes = malloc(strlen(hex) / 2 + 1);
            size_t nb = unhex(hex, bytes);
            int64_t nwant, ngot = 0;
            int32_t *want = json_ids(cJSON_GetObjectItem(c, "ids"), &nwant), *got = NULL;
            og_status rc = og_tokenizer_encode(t, (const char *)bytes, nb, &got, &ngot);
            if (hf_metaspace && ((nb && bytes[0] == ' ') || (nb >= 3 && !memcmp(bytes, "<s>", 3)))) {
                const int32_t space = og_tokenizer_token_id(t, "\xE2\x96\x81");
                int32_t *w = malloc(sizeof *w * (size_t)(2 * nwant + 1));
                int64_t nw = 0;
                n_space_first++;
                if (bytes[0] == ' ') {
                    w[nw++] = space;
                    for (int64_t k = 0; k < nwant; k++) w[nw++] = want[k];
                } else { /* after each special token but the last, one more U+2581 */
                    for (int64_t k = 0; k < nwant; k++) {
                        w[nw++] = want[k];
                        if (k + 1 < nwant && want[k] < 3) w[nw++] = space;
                    }
                }
                if (rc != OG_OK || ngot != nw || memcmp(got, w, (size_t)nw * sizeof *w))
                    if (enc_bad++ < 5) fprintf(stderr, "%s: encode of %s: not the oracle's with SentencePiece's U+2581\n", title, hex);
                free(w);
            } else if (hf_metaspace && nb >= 6 && !memcmp(bytes, "<0x", 3) && bytes[5] == '>' && rc == OG_OK && nwant > 1) {
                n_byte_text++;
                if (ngot < nwant || got[0] == want[0] ||
                    memcmp(got + ngot - (nwant - 1), want + 1, (size_t)(nwant - 1) * sizeof *want))
                    if (enc_bad++ < 5) fprintf(stderr, "%s: encode of %s: the text after the byte piece differs\n", title, hex);
            } else if (rc != OG_OK || ngot != nwant || (nwant && memcmp(got, want, (size_t)nwant * sizeof *want))) {
                if (enc_bad++ < 5) fprintf(stderr, "%s: encode of %s differs (%s)\n", title, hex, rc ? og_last_error() : "ok");
            }
            og_free(got);
            free(want);
            free(bytes);
            n_enc++;
        }
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "decode")) {
            int64_t n;
            int32_t *v = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
            char *out = NULL;
            if (og_tokenizer_decode(t, v, n, &out, NULL) != OG_OK ||
                strcmp(out, cJSON_GetObjectItem(c, "text")->valuestring)) {
                if (dec_bad++ < 5)
                    fprintf(stderr, "%s: decode of %lld ids (first %d) gives \"%s\", want \"%s\"\n", title, (long long)n,
                            n ? v[0] : -1, out ? out : "", cJSON_GetObjectItem(c, "text")->valuestring);
            }
            og_free(out);
            free(v);
            n_dec++;
        }
    }
    CHECK_MSG(n_enc > 30 && n_dec > 100, "%s: only %d encode and %d decode cases", title, n_enc, n_dec);
    CHECK_MSG(enc_bad == 0, "%s: %d of %d encodes differ", title, enc_bad, n_enc);
    CHECK_MSG(n_byte_text == (hf_metaspace ? 1 : 0), "%s: %d cases start with a byte piece's text", title, n_byte_text);
    CHECK_MSG(n_space_first == (hf_metaspace ? 4 : 0), "%s: %d cases start with a space or <s>", title, n_space_first);
    CHECK_MSG(dec_bad == 0, "%s: %d of %d decodes differ", title, dec_bad, n_dec);
    cJSON_Delete(cases);
    free(text);
    og_tokenizer_destroy(t);
    og_free(json);
    og_free(cfg);
    og_gguf_close(g);
}

/* ------------------------------------------------------------ exporter refusals */

enum {
    M_OK, M_ARCH, M_Q4 /* a type the exporter does not read */, M_MISSING, M_SHAPE, M_EXTRA, M_SPM, M_PRE, M_ROPE, M_HEADS, M_NO_CTX,
    M_VOCAB, M_SPM_OK /* a SentencePiece vocabulary with its scores: exported */, M_COUNT
};

/* A llama GGUF of hidden 4, ffn 4, 1 layer, 2 heads / 1 KV head (head dim
 * 2), vocab 4, f32 weights, a 4-token byte-level vocabulary (one control
 * token, the eos); or one variant of it. */
static void build_model(gb *b, int v) {
    static const char *const names[] = {"token_embd.weight",       "output_norm.weight",     "blk.0.attn_norm.weight",
                                        "blk.0.attn_q.weight",     "blk.0.attn_k.weight",    "blk.0.attn_v.weight",
                                        "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",
                                        "blk.0.ffn_up.weight",     "blk.0.ffn_down.weight",  "blk.0.extra.weight"};
    static const int64_t ne[][2] = {{4, 4}, {4, 1}, {4, 1}, {4, 4}, {4, 2}, {4, 2}, {4, 4}, {4, 1}, {4, 4}, {4, 4}, {4, 4}, {4, 1}};
    int nt = v == M_EXTRA ? 12 : v == M_MISSING ? 10 : 11;
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, 3);
    u64(b, (uint64_t)nt);
    u64(b, v == M_NO_CTX ? 16 : v == M_SPM || v == M_SPM_OK ? 18 : 17);
    str(b, "general.architecture"), u32(b, OG_GGUF_STRING), str(b, v == M_ARCH ? "gpt2" : "llama");
    str(b, "llama.block_count"), u32(b, OG_GGUF_U32), u32(b, 1);
    str(b, "llama.embedding_length"), u32(b, OG_GGUF_U32), u32(b, 4);
    str(b, "llama.feed_forward_length"), u32(b, OG_GGUF_U32), u32(b, 4);
    str(b, "llama.attention.head_count"), u32(b, OG_GGUF_U32), u32(b, 2);
    str(b, "llama.attention.head_count_kv"), u32(b, OG_GGUF_U32), u32(b, v == M_HEADS ? 3 : 1);
    if (v != M_NO_CTX) str(b, "llama.context_length"), u32(b, OG_GGUF_U32), u32(b, 64);
    str(b, "llama.rope.scaling.type"), u32(b, OG_GGUF_STRING), str(b, v == M_ROPE ? "yarn" : "none");
    str(b, "llama.attention.layer_norm_rms_epsilon"), u32(b, OG_GGUF_F32), put(b, &(float){1e-5f}, 4);
    str(b, "tokenizer.ggml.model"), u32(b, OG_GGUF_STRING), str(b, v == M_SPM || v == M_SPM_OK ? "llama" : "gpt2");
    str(b, "tokenizer.ggml.pre"), u32(b, OG_GGUF_STRING), str(b, v == M_PRE ? "falcon" : "gpt-2");
    str(b, "tokenizer.ggml.tokens"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_STRING), u64(b, v == M_VOCAB ? 5 : 4);
    str(b, "a"), str(b, "b"), str(b, "ab"), str(b, "<e>");
    if (v == M_VOCAB) str(b, "abab");
    str(b, "tokenizer.ggml.token_type"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_I32), u64(b, v == M_VOCAB ? 5 : 4);
    u32(b, 1), u32(b, 1), u32(b, 1), u32(b, 3);
    if (v == M_VOCAB) u32(b, 1);
    str(b, "tokenizer.ggml.merges"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_STRING), u64(b, 1), str(b, "a b");
    if (v == M_SPM || v == M_SPM_OK) { /* M_SPM: 3 scores for 4 tokens */
        const int ns = v == M_SPM ? 3 : 4;
        str(b, "tokenizer.ggml.scores"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_F32), u64(b, (uint64_t)ns);
        for (int k = 0; k < ns; k++) put(b, &(float){-1.0f * (float)k}, 4);
    }
    str(b, "tokenizer.ggml.eos_token_id"), u32(b, OG_GGUF_U32), u32(b, 3);
    str(b, "tokenizer.ggml.bos_token_id"), u32(b, OG_GGUF_U32), u32(b, 0);
    str(b, "tokenizer.ggml.add_bos_token"), u32(b, OG_GGUF_BOOL), u8(b, 1);
    uint64_t off = 0;
    for (int i = 0, k = 0; k < nt; i++) {
        if (v == M_MISSING && i == 9) continue; /* no ffn_up */
        bool one_d = ne[i][1] == 1;
        str(b, names[i]), u32(b, one_d ? 1 : 2), u64(b, (uint64_t)(v == M_SHAPE && i == 8 ? 8 : ne[i][0]));
        if (!one_d) u64(b, (uint64_t)ne[i][1]);
        u32(b, v == M_Q4 && i == 9 ? 24 : OG_GGML_F32), u64(b, off);
        off += 128;
        k++;
    }
    pad_to(b, 32);
    for (int k = 0; k < nt; k++)
        for (int e = 0; e < 32; e++) put(b, &(float){0.01f * (float)(e + k)}, 4);
}

static void exporter_refuses(void) {
    og_test_section("exporter: unsupported or inconsistent GGUF models are refused by name");
    static const struct {
        int v;
        og_status st;
        const char *needle;
    } cases[] = {
        {M_ARCH, OG_ERR_UNSUPPORTED, "\"general.architecture\" = \"gpt2\": not supported"},
        {M_Q4, OG_ERR_UNSUPPORTED, "tensor \"blk.0.ffn_up.weight\" has type i8: not supported (f32, f16, bf16, q8_0, q4_0, q2_K, q3_K, q4_K, q5_K, q6_K)"},
        {M_MISSING, OG_ERR_FORMAT, "tensor \"blk.0.ffn_up.weight\" is missing"},
        {M_SHAPE, OG_ERR_FORMAT, "tensor \"blk.0.ffn_gate.weight\" has ne [8, 4, 1, 1], the metadata implies [4, 4]"},
        {M_EXTRA, OG_ERR_UNSUPPORTED, "tensor \"blk.0.extra.weight\" is not part of a llama model"},
        {M_SPM, OG_ERR_FORMAT, "\"tokenizer.ggml.scores\" must be an array of f32, one per token (4 tokens, scores has 3)"},
        {M_PRE, OG_ERR_UNSUPPORTED, "\"tokenizer.ggml.pre\" = \"falcon\": pre-tokenizer not supported"},
        {M_ROPE, OG_ERR_UNSUPPORTED, "\"llama.rope.scaling.type\" = \"yarn\": not supported"},
        {M_HEADS, OG_ERR_FORMAT, "head_count_kv\" = 3: must divide head_count 2"},
        {M_NO_CTX, OG_ERR_FORMAT, "required key \"llama.context_length\" is missing"},
        {M_VOCAB, OG_ERR_FORMAT, "5 tokens, more than the 4 rows of token_embd.weight"},
    };
    char dir[] = "/tmp/og_gguf_bad_XXXXXX";
    if (!mkdtemp(dir)) return;
    char in[256], out[256];
    snprintf(in, sizeof in, "%s/m.gguf", dir);
    snprintf(out, sizeof out, "%s/m.ogp", dir);
    gb b = {0};
    for (int k = -2; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        build_model(&b, k == -2 ? M_OK : k == -1 ? M_SPM_OK : cases[k].v);
        FILE *f = fopen(in, "wb");
        fwrite(b.p, 1, b.n, f);
        fclose(f);
        og_status rc = og_export_gguf(in, out, NULL, NULL);
        if (k < 0) {
            CHECK_MSG(rc == OG_OK, "the unaltered model (%s vocabulary): %s", k == -2 ? "gpt2" : "llama",
                      og_last_error());
            remove(out);
            continue;
        }
        CHECK_MSG(rc == cases[k].st && strstr(og_last_error(), cases[k].needle),
                  "variant %d: got %s \"%s\", want %s naming \"%s\"", cases[k].v, og_status_str(rc),
                  rc ? og_last_error() : "", og_status_str(cases[k].st), cases[k].needle);
        CHECK_MSG(access(out, F_OK) != 0, "variant %d left an output file", cases[k].v);
    }
    free(b.p);
    remove(in), remove(out);
    rmdir(dir);
}

/* add_bos_token: the rebuilt tokenizer adds BOS when asked for special
 * tokens, and the config says so. */
static void tokenizer_adds_bos(void) {
    og_test_section("tokenizer: add_bos_token becomes a post-processor");
    gb b = {0};
    build_model(&b, M_OK);
    og_gguf *g = NULL;
    CHECK_OK(og_gguf_open_memory(b.p, b.n, "built", &g));
    char *json = NULL, *cfg = NULL;
    if (g) CHECK_OK(og_gguf_tokenizer(g, &json, &cfg));
    og_tokenizer *t = NULL;
    if (json) CHECK_OK(og_tokenizer_load_json(json, &t));
    if (t) {
        CHECK_OK(og_tokenizer_load_config(t, cfg));
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(og_tokenizer_encode_ex(t, "ab", 2, 1, 1, &ids, &n));
        CHECK_MSG(n == 2 && ids[0] == 0 && ids[1] == 2, "with special tokens: %lld ids", (long long)n);
        og_free(ids);
        CHECK_OK(og_tokenizer_encode_ex(t, "ab", 2, 0, 1, &ids, &n));
        CHECK(n == 1 && ids[0] == 2);
        og_free(ids);
        CHECK(og_tokenizer_bos_id(t) == 0);
        CHECK(cfg && strstr(cfg, "\"add_bos_token\":true"));
    }
    og_tokenizer_destroy(t);
    og_free(json);
    og_free(cfg);
    og_gguf_close(g);
    free(b.p);
}

/* A SentencePiece ("llama") vocabulary built by hand, vocab only:
 *
 *   id  piece   type     score (variant 0)  (variant 1)
 *    0  <unk>   unknown   0
 *    1  <s>     control   0
 *    2  </s>    control   0
 *    3  \u2581  normal  -10
 *    4  a       normal  -11
 *    5  b       normal  -12
 *    6  c       normal  -13
 *    7  ab      normal   -2                 -1
 *    8  bc      normal   -1                 -2
 *    9  \u2581a normal   -3
 *   10  <0x64>  byte      0                  ("d")
 *
 * Merges (normal piece = two normal pieces), best score first: variant 0
 * b+c, a+b, \u2581+a; variant 1 a+b, b+c, \u2581+a. Worked by hand:
 *   "abc" -> "\u2581abc" = \u2581 a b c. Variant 0: b+c (-1) beats a+b (-2) and
 *   \u2581+a (-3): \u2581 a bc; then \u2581+a: [\u2581a, bc] = [9, 8]. Variant 1: a+b
 *   first: \u2581 ab c; \u2581ab and abc are no pieces: [3, 7, 6].
 *   "abd" (variant 0): d is no piece, its byte piece <0x64>; a+b, then
 *   \u2581+ab is no piece: [3, 7, 10].
 *   "<s>abc": the control token, then "abc" with a space in front (as
 *   after every special token, as SentencePiece puts its dummy prefix on
 *   each piece of text): \u2581 ab c, [1, 3, 7, 6] in variant 1.
 *   " abc" (variant 1): the prefix even before a space: \u2581 \u2581 ab c,
 *   [3, 3, 7, 6].
 *   Variant 2 is variant 0 with add_space_prefix false: "abc" = a b c, b+c,
 *   and a+bc is no piece: [4, 8]; decoding keeps a leading space.
 * With nscores != 11 the scores array is that long (a malformed file);
 * variant 3 gives "b" the score -12.5 (a Unigram model's kind of score). */
static void build_spm_vocab(gb *b, int variant, int nscores, bool charsmap) {
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc",
                                         ("\xE2\x96\x81" "a"), "<0x64>"};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6};
    float scores[] = {0, 0, 0, -10, -11, -12, -13, -2, -1, -3, 0};
    if (variant == 1) scores[7] = -1, scores[8] = -2;
    if (variant == 3) scores[5] = -12.5f;
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, 3);
    u64(b, 0);
    u64(b, 7 + (charsmap ? 1 : 0) + (variant == 2 ? 1 : 0));
    str(b, "general.architecture"), u32(b, OG_GGUF_STRING), str(b, "llama");
    str(b, "tokenizer.ggml.model"), u32(b, OG_GGUF_STRING), str(b, "llama");
    str(b, "tokenizer.ggml.tokens"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_STRING), u64(b, 11);
    for (int i = 0; i < 11; i++) str(b, pieces[i]);
    str(b, "tokenizer.ggml.token_type"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_I32), u64(b, 11);
    for (int i = 0; i < 11; i++) u32(b, (uint32_t)types[i]);
    str(b, "tokenizer.ggml.scores"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_F32), u64(b, (uint64_t)nscores);
    for (int i = 0; i < nscores; i++) put(b, &scores[i % 11], 4);
    str(b, "tokenizer.ggml.bos_token_id"), u32(b, OG_GGUF_U32), u32(b, 1);
    str(b, "tokenizer.ggml.eos_token_id"), u32(b, OG_GGUF_U32), u32(b, 2);
    if (variant == 2) str(b, "tokenizer.ggml.add_space_prefix"), u32(b, OG_GGUF_BOOL), u8(b, 0);
    if (charsmap) str(b, "tokenizer.ggml.precompiled_charsmap"), u32(b, OG_GGUF_ARRAY), u32(b, OG_GGUF_U8), u64(b, 2), u8(b, 1), u8(b, 2);
}

static void spm_expect(og_tokenizer *t, const char *text, const int32_t *want, int64_t nwant, const char *what) {
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenizer_encode(t, text, strlen(text), &ids, &n));
    bool same = n == nwant && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
    CHECK_MSG(same, "%s: \"%s\" gives %lld ids, first %d", what, text, (long long)n, n ? ids[0] : -1);
    og_free(ids);
}

static void spm_tokenizer_by_scores(void) {
    og_test_section("tokenizer: a SentencePiece vocabulary's merges follow its scores");
    gb b = {0};
    for (int variant = 0; variant < 3; variant++) {
        build_spm_vocab(&b, variant, 11, false);
        og_gguf *g = NULL;
        CHECK_OK(og_gguf_open_memory(b.p, b.n, "built", &g));
        char *json = NULL, *cfg = NULL;
        if (g) CHECK_OK(og_gguf_tokenizer(g, &json, &cfg));
        og_tokenizer *t = NULL;
        if (json) CHECK_OK(og_tokenizer_load_json(json, &t));
        if (t) CHECK_OK(og_tokenizer_load_config(t, cfg));
        if (t && variant == 0) {
            CHECK_MSG(strstr(json, "\"merges\":[[\"b\",\"c\"],[\"a\",\"b\"],[\"\xE2\x96\x81\",\"a\"]]"),
                      "the merges, best score first: %s", strstr(json, "\"merges\""));
            spm_expect(t, "abc", (const int32_t[]){9, 8}, 2, "b+c before a+b");
            spm_expect(t, "abd", (const int32_t[]){3, 7, 10}, 3, "byte fallback");
            spm_expect(t, "", NULL, 0, "empty");
            char *out = NULL;
            CHECK_OK(og_tokenizer_decode(t, (const int32_t[]){3, 7, 10, 3, 9}, 5, &out, NULL));
            CHECK_MSG(out && !strcmp(out, "abd  a"), "decode: \"%s\"", out ? out : "");
            og_free(out);
            /* no add_bos_token key: bos added, as llama.cpp does */
            int32_t *ids = NULL;
            int64_t n = 0;
            CHECK_OK(og_tokenizer_encode_ex(t, "abc", 3, 1, 1, &ids, &n));
            CHECK_MSG(n == 3 && ids[0] == 1 && ids[1] == 9 && ids[2] == 8, "with special tokens: %lld ids", (long long)n);
            og_free(ids);
        }
        if (t && variant == 1) {
            spm_expect(t, "abc", (const int32_t[]){3, 7, 6}, 3, "a+b before b+c");
            spm_expect(t, "<s>abc", (const int32_t[]){1, 3, 7, 6}, 4, "control token, then the space prefix");
            spm_expect(t, " abc", (const int32_t[]){3, 3, 7, 6}, 4, "the space prefix before a space");
            spm_expect(t, "<unk>", (const int32_t[]){0}, 1, "the unknown piece matched in text");
        }
        if (t && variant == 2) {
            spm_expect(t, "abc", (const int32_t[]){4, 8}, 2, "no space prefix");
            char *out = NULL;
            CHECK_OK(og_tokenizer_decode(t, (const int32_t[]){3, 4}, 2, &out, NULL));
            CHECK_MSG(out && !strcmp(out, " a"), "decode without a space prefix: \"%s\"", out ? out : "");
            og_free(out);
        }
        og_tokenizer_destroy(t);
        og_free(json);
        og_free(cfg);
        og_gguf_close(g);
    }
    /* malformed or not representable: refused by name */
    static const struct {
        int variant, nscores;
        bool charsmap;
        og_status st;
        const char *needle;
    } bad[] = {{0, 10, false, OG_ERR_FORMAT, "\"tokenizer.ggml.scores\" must be an array of f32, one per token (11 tokens, scores has 10)"},
               {0, 12, false, OG_ERR_FORMAT, "(11 tokens, scores has 12)"},
               {0, 11, true, OG_ERR_UNSUPPORTED, "\"tokenizer.ggml.precompiled_charsmap\": a SentencePiece normalization table"},
               {3, 11, false, OG_ERR_UNSUPPORTED, "\"tokenizer.ggml.scores\"[5] = -12.5 is not a whole number: the scores look like a SentencePiece Unigram"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        build_spm_vocab(&b, bad[k].variant, bad[k].nscores, bad[k].charsmap);
        og_gguf *g = NULL;
        CHECK_OK(og_gguf_open_memory(b.p, b.n, "built", &g));
        char *json = NULL, *cfg = NULL;
        og_status rc = g ? og_gguf_tokenizer(g, &json, &cfg) : OG_OK;
        CHECK_MSG(rc == bad[k].st && strstr(og_last_error(), bad[k].needle), "case %zu: got %s \"%s\"", k,
                  og_status_str(rc), rc ? og_last_error() : "");
        CHECK(json == NULL && cfg == NULL);
        og_gguf_close(g);
    }
    free(b.p);
}

int main(void) {
    reader_reads_back();
    reader_refuses();
    exporter_refuses();
    tokenizer_adds_bos();
    spm_tokenizer_by_scores();
    fixture_metadata("llama-gqa-f32.gguf", "llama-gqa", 32, 3 + 2 * 9 + 1);
    fixture_metadata("qwen2-bias-f16.gguf", "qwen2-bias", 64, 2 + 2 * 12);
    fixture_metadata("qwen3-mixed-bf16.gguf", "qwen3-mixed", 32, 2 + 4 * 11);
    parity("llama-gqa-f32.gguf", "llama-gqa", OG_DTYPE_F32, OG_DTYPE_F32, 0, -1, OG_DTYPE_COUNT);
    parity("llama-gqa-f32.gguf", "llama-gqa", OG_DTYPE_BF16, OG_DTYPE_BF16, 0, -1, OG_DTYPE_COUNT);
    parity("qwen3-mixed-bf16.gguf", "qwen3-mixed", OG_DTYPE_BF16, OG_DTYPE_BF16, 0, -1, OG_DTYPE_COUNT);
    parity("qwen3-mixed-bf16.gguf", "qwen3-mixed", OG_DTYPE_F32, OG_DTYPE_F32, 0, -1, OG_DTYPE_COUNT);
    parity("qwen2-bias-f16.gguf", "qwen2-bias", OG_DTYPE_F32, OG_DTYPE_F32, 1, 1e-3, OG_DTYPE_COUNT);
    /* q8_0 dequantized: weights within scale/2 of the checkpoint's (max
     * 0.0021 here); the logits measured within 0.12 of the checkpoint
     * export's. Imported as q8 (the default for a q8_0 file): the same
     * numbers, kept in 8 bits. */
    parity("llama-gqa-q8_0.gguf", "llama-gqa", OG_DTYPE_F32, OG_DTYPE_F32, 0, 0.25, OG_DTYPE_Q8);
    parity("llama-gqa-q8_0.gguf", "llama-gqa", OG_DTYPE_BF16, OG_DTYPE_BF16, 0, 0.25, OG_DTYPE_Q8);
    parity("llama-gqa-q8_0.gguf", "llama-gqa", OG_DTYPE_F32, OG_DTYPE_COUNT, 0, 0.25, OG_DTYPE_Q8);
    /* q4_0 (made by the gguf package's quantizer, tests/data/gguf/meta.json):
     * dequantized to f32 it is the package's values exactly, kept as q4 the
     * same numbers; the logits are further from the checkpoint's (weights
     * off by up to 0.043 here) */
    parity("llama-gqa-q4_0.gguf", "llama-gqa", OG_DTYPE_F32, OG_DTYPE_F32, 0, Q4_BOUND, OG_DTYPE_Q4);
    parity("llama-gqa-q4_0.gguf", "llama-gqa", OG_DTYPE_F32, OG_DTYPE_COUNT, 0, Q4_BOUND, OG_DTYPE_Q4);
    /* qwen3moe (tests/data/hf/qwen3-moe: experts stacked into ffn_*_exps, a
     * dense layer 2, the router in f32): the same program as the checkpoint's
     * export, the same logits bits from the bf16 file; q8_0 / q4_0 experts
     * kept as q8 / q4 stacks read back as the gguf package's values (the
     * weight check of parity) and give the logits of the same file
     * dequantized to f32 (quant_vs_dequantized). Against the float
     * checkpoint the quantized model's logits move by O(1) (measured 1.25
     * for q8_0, 4.38 for q4_0): quantized attention moves the router's
     * inputs, and routing decisions 0.02 apart (meta.json router_min_gap)
     * flip to other experts; the bound 5 only guards against garbage */
    parity("qwen3-moe-bf16.gguf", "qwen3-moe", OG_DTYPE_BF16, OG_DTYPE_BF16, 0, -1, OG_DTYPE_COUNT);
    parity("qwen3-moe-bf16.gguf", "qwen3-moe", OG_DTYPE_F32, OG_DTYPE_F32, 0, -1, OG_DTYPE_COUNT);
    parity("qwen3-moe-q8_0.gguf", "qwen3-moe", OG_DTYPE_F32, OG_DTYPE_COUNT, 0, 5.0, OG_DTYPE_Q8);
    parity("qwen3-moe-q4_0.gguf", "qwen3-moe", OG_DTYPE_F32, OG_DTYPE_COUNT, 0, 5.0, OG_DTYPE_Q4);
    quant_vs_dequantized("qwen3-moe-q8_0.gguf", "qwen3-moe");
    quant_vs_dequantized("qwen3-moe-q4_0.gguf", "qwen3-moe");
    /* qwen3next (tests/data/hf/qwen3next, Gated DeltaNet layers and experts
     * with a shared one): the converter's changes put back. Every weight is
     * the checkpoint export's bits but A_log (stored as -exp(A_log), whose
     * log comes back within an ulp), so the logits differ only by that
     * (measured 9.9e-6 of |logits| up to 4.6; 0.015 in bf16 activations,
     * where a rounding flip carries it further) */
    parity("qwen3next-bf16.gguf", "qwen3next", OG_DTYPE_F32, OG_DTYPE_F32, 2, 1e-4, OG_DTYPE_COUNT);
    parity("qwen3next-bf16.gguf", "qwen3next", OG_DTYPE_BF16, OG_DTYPE_BF16, 2, 1e-1, OG_DTYPE_COUNT);
    /* its q8_0 file: every matrix kept as q8 (ssm_ba's rows gathered into
     * in_proj_b / in_proj_a block row by block row) gives the logits of
     * the same file dequantized */
    quant_vs_dequantized("qwen3next-q8_0.gguf", "qwen3next");
    quant_vs_dequantized("llama-gqa-q8_0.gguf", "llama-gqa");
    quant_vs_dequantized("llama-gqa-q4_0.gguf", "llama-gqa");
    tokenizer_parity("llama-gqa-f32.gguf", "llama-gqa", "<|endoftext|>", false);
    tokenizer_parity("qwen2-bias-f16.gguf", "qwen2-bias", "<|endoftext|>", false);
    tokenizer_parity("qwen3-mixed-bf16.gguf", "qwen3-mixed", "<|endoftext|>", false);
    tokenizer_parity("llama3-style-vocab.gguf", "llama3-style", "<|end_of_text|>", false);
    /* SentencePiece: merges derived from the scores, checked against the
     * Hugging Face tokenizer the vocabulary was written from */
    tokenizer_parity("mistral-sw-spm-vocab.gguf", "mistral-sw", "</s>", true);
    /* SentencePiece BPE trained by the sentencepiece library, whose own
     * encodings are the oracle (tests/fixtures/make_spm_gguf_fixture.py) */
    tokenizer_parity("spm-bpe-vocab.gguf", "gguf/spm-bpe-cases.json", "</s>", false);
    return og_test_finish();
}
