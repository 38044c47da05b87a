/* Tensor parallel on the CPU (src/exec/shard.c, src/exec/backend_cpu_tp.c):
 * sessions and steps of a sharded model, on the Qwen3.5 fixture
 * (tests/data/hf/qwen35-dense: gated attention, Gated DeltaNet layers with
 * their convolution and recurrent state) and the Llama fixture (GQA),
 * exported as f32 programs and loaded at N = 1, 2, 4 and 8:
 *   - slicing: a q8 and a q4 weight cut on its blocks dequantizes to the same
 *     values as the whole one's rows and columns; a cut off the blocks is
 *     refused by name;
 *   - sessions stepped in one batch (decode rows beside prompt chunks) get
 *     the bits each gets alone on the same sharded model;
 *   - a session saved at N = 2 restores at N = 1, 4 and 8 (one file, one
 *     layout) and continues within the reduction-order bound of
 *     tests/cli_tensor_parallel.sh (2e-3), and at N = 2 bit for bit; a fork
 *     at the end continues bit for bit;
 *   - a step that fails on the last shard after the others wrote their
 *     heads' rows and state (OG_TEST_TP_FAULT) leaves the session as it was:
 *     its length, and the next steps' logits bit for bit those of a session
 *     that never failed;
 *   - int8 / fp8 KV storage: each shard writes its heads' quants and scales
 *     where the unsharded model keeps them (the scales of all heads follow
 *     all quants in a row, core/kv_quant.h) and the padding is zeros: the
 *     first attention layer of the Llama fixture, whose k and v are the same
 *     bits at every N, holds the same bytes at N = 2, 4, 8 as at N = 1, and
 *     every N gives the unsharded logits within the bound.
 * The fixtures are found under OG_SOURCE_DIR or the source tree. */
#include "harness.h"
#include "core/kv_quant.h"
#include "exec/shard.h"
#include "import/export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOUND 2e-3

static char g_src[512];

/* ------------------------------------------------------------ slicing */

static void test_slice(void) {
    og_test_section("slices of quantized weights are their rows and columns, cut on the blocks");
    enum { N = 5, K = 128 };
    og_rng rng = og_rng_seed(7);
    float src[N * K];
    og_rng_fill(&rng, src, N * K, -1, 1);
    const og_dtype dts[2] = {OG_DTYPE_Q8, OG_DTYPE_Q4};
    for (int d = 0; d < 2; d++) {
        int64_t bytes = 0;
        CHECK(og_tensor_bytes(dts[d], 2, (const int64_t[]){N, K}, &bytes));
        void *w = malloc((size_t)bytes);
        CHECK_OK(og_quantize_rows(dts[d], src, N, K, w));
        og_shard_cols rows = {.n = 2, .lo = {0, 3}, .hi = {2, 5}}, cols = {.n = 2, .lo = {0, 96}, .hi = {32, 128}};
        void *slice = NULL;
        CHECK_OK(og_shard_slice_matrix(dts[d], w, N, K, &rows, &cols, &slice, NULL));
        const int64_t srows[4] = {0, 1, 3, 4};
        for (int r = 0; slice && r < 4; r++) {
            float whole[K], part[64];
            og_dequantize_row(dts[d], w, N, K, srows[r], whole);
            og_dequantize_row(dts[d], slice, 4, 64, r, part);
            CHECK_MSG(!memcmp(part, whole, 32 * sizeof(float)) && !memcmp(part + 32, whole + 96, 32 * sizeof(float)),
                      "%s row %lld: the slice's values differ", og_dtype_name(dts[d]), (long long)srows[r]);
        }
        og_free(slice); /* og_shard_slice_matrix allocates with og_malloc */
        og_shard_cols off = {.n = 1, .lo = {16}, .hi = {48}};
        CHECK_STATUS(og_shard_slice_matrix(dts[d], w, N, K, NULL, &off, &slice, NULL), OG_ERR_UNSUPPORTED);
        CHECK(strstr(og_last_error(), "blocks of 32") != NULL);
        free(w);
    }
}

/* ------------------------------------------------------------ models */

typedef struct fixture {
    const char *name;
    char prog[600];
    int32_t *tokens;
    int64_t n;
    int64_t V;
} fixture;

static bool load_tokens(fixture *f) {
    char path[700];
    snprintf(path, sizeof path, "%s/tests/data/hf/%s/tokens.txt", g_src, f->name);
    char *text = og_test_read_file(path);
    if (!text) return false;
    f->tokens = malloc(strlen(text) * sizeof *f->tokens);
    f->n = 0;
    for (char *p = text; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        f->tokens[f->n++] = (int32_t)v;
        p = end;
    }
    free(text);
    return f->n > 0;
}

static og_model *load(const fixture *f, int32_t n_shards) {
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    mp.tensor_parallel = n_shards;
    og_model *m = NULL;
    CHECK_OK(og_model_load(f->prog, &mp, &m));
    return m;
}

static og_session *session_kv(og_model *m, og_dtype kv_dtype) {
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = kv_dtype;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    return s;
}

static og_session *session(og_model *m) { return session_kv(m, OG_DTYPE_F32); }

/* Feeds tokens [from, to) one step each, writing the last step's logits. */
static void feed(og_session *s, const int32_t *tok, int64_t from, int64_t to, float *logits) {
    for (int64_t t = from; t < to; t++) CHECK_OK(og_session_eval(s, tok + t, 1, 1, logits, 0));
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* Three sessions at different lengths in one step (two decode rows and a
 * prompt chunk of 5) against each stepped alone: the same bits. */
static void test_batch(const fixture *f, og_model *m) {
    const int64_t V = f->V, L[3] = {3, 9, 6};
    og_session *b[3], *a[3];
    float *out_b = calloc((size_t)(7 * V), sizeof(float)), *out_a = calloc((size_t)(7 * V), sizeof(float));
    for (int i = 0; i < 3; i++) {
        b[i] = session(m);
        a[i] = session(m);
        if (b[i] && L[i]) CHECK_OK(og_session_eval(b[i], f->tokens, L[i], 4, NULL, 0));
        if (a[i] && L[i]) CHECK_OK(og_session_eval(a[i], f->tokens, L[i], 4, NULL, 0));
    }
    const int32_t T[3] = {1, 1, 5};
    og_batch_item items[3];
    float *lo[3] = {out_b, out_b + V, out_b + 2 * V};
    for (int i = 0; i < 3; i++)
        items[i] = (og_batch_item){.session = b[i], .tokens = f->tokens + L[i], .n_tokens = T[i],
                                   .output = T[i] > 1 ? OG_OUTPUT_LOGITS_ALL : OG_OUTPUT_LOGITS, .logits = lo[i]};
    CHECK_OK(og_model_step(m, items, 3));
    bool same = true;
    for (int i = 0; i < 3; i++) {
        float *alone = out_a + (i == 2 ? 2 * V : i * V);
        CHECK_OK(og_session_eval(a[i], f->tokens + L[i], T[i], T[i], alone, T[i] > 1));
        same = same && !memcmp(alone, lo[i], (size_t)(T[i] * V) * sizeof(float));
    }
    CHECK_MSG(same, "%s: a batch of three sessions differs from each stepped alone", f->name);
    for (int i = 0; i < 3; i++) {
        og_session_destroy(a[i]);
        og_session_destroy(b[i]);
    }
    free(out_a);
    free(out_b);
}

/* Saved at N = 2, restored at every N; a fork at the end. */
static void test_save_fork(const fixture *f, og_model *const *models, const int32_t *shards, int n_models,
                           og_model *m2, const char *dir) {
    const int64_t V = f->V, L = 12, more = 4;
    float *ref = calloc((size_t)V, sizeof(float)), *got = calloc((size_t)V, sizeof(float));
    og_session *s = session(m2);
    CHECK_OK(og_session_eval(s, f->tokens, L, 5, NULL, 0));
    char path[700];
    snprintf(path, sizeof path, "%s/%s.session", dir, f->name);
    CHECK_OK(og_session_save(s, path));
    og_session *child = NULL;
    CHECK_OK(og_session_fork(s, L, &child));
    feed(s, f->tokens, L, L + more, ref); /* the reference: the session that was saved, continued */
    if (child) {
        feed(child, f->tokens, L, L + more, got);
        CHECK_MSG(!memcmp(got, ref, (size_t)V * sizeof(float)), "%s: a fork at the end continued differs", f->name);
    }
    og_session_destroy(child);
    for (int k = 0; k < n_models; k++) {
        og_session *r = NULL;
        CHECK_OK(og_session_restore(models[k], path, &r));
        if (!r) continue;
        CHECK(og_session_length(r) == L);
        feed(r, f->tokens, L, L + more, got);
        const double d = max_diff(got, ref, V);
        if (shards[k] == 2) CHECK_MSG(d == 0, "%s: saved at N = 2, restored at 2: differs by %g", f->name, d);
        else
            CHECK_MSG(d <= BOUND, "%s: saved at N = 2, restored at %d: differs by %g (bound %g)", f->name, shards[k], d,
                      BOUND);
        og_session_destroy(r);
    }
    remove(path);
    og_session_destroy(s);
    free(ref);
    free(got);
}

/* The step after L tokens fails on the last shard (OG_TEST_TP_FAULT, set
 * before the model was loaded: its step 2 is this one); the session keeps
 * its length and its next steps give the never-failed session's bits. */
static void test_fault(const fixture *f, og_model *mf, og_model *m) {
    const int64_t V = f->V, L = 7;
    float *ref = calloc((size_t)(3 * V), sizeof(float)), *got = calloc((size_t)(3 * V), sizeof(float));
    og_session *s = session(mf), *r = session(m);
    CHECK_OK(og_session_eval(s, f->tokens, L, (int32_t)L, NULL, 0)); /* step 1 */
    CHECK_OK(og_session_eval(r, f->tokens, L, (int32_t)L, NULL, 0));
    const og_status st = og_session_eval(s, f->tokens + L, 3, 3, got, 1); /* step 2: fails */
    CHECK_STATUS(st, OG_ERR_BACKEND);
    CHECK(strstr(og_last_error(), "injected") != NULL);
    CHECK(og_session_length(s) == L);
    CHECK_OK(og_session_eval(s, f->tokens + L, 3, 3, got, 1));
    CHECK_OK(og_session_eval(r, f->tokens + L, 3, 3, ref, 1));
    CHECK_MSG(!memcmp(got, ref, (size_t)(3 * V) * sizeof(float)),
              "%s: after a step that failed on one shard the logits differ by %g", f->name, max_diff(got, ref, 3 * V));
    og_session_destroy(s);
    og_session_destroy(r);
    free(ref);
    free(got);
}

/* Rows [0, L) of kv layer 0 of two sessions, k and v, the whole rows'
 * bytes (quants, scales, padding): equal? */
static bool same_rows(const og_session *a, const og_session *b, int64_t L) {
    og_kv_layer_view va, vb;
    CHECK_OK(og_kv_session_layer_view(og_session_kv(a), 0, &va));
    CHECK_OK(og_kv_session_layer_view(og_session_kv(b), 0, &vb));
    const size_t bytes = (size_t)og_kv_dtype_row_bytes(va.dtype, va.n_kv_heads, va.head_dim);
    const int64_t sa = og_kv_layer_view_row_stride(&va), sb = og_kv_layer_view_row_stride(&vb);
    bool same = va.dtype == vb.dtype && va.n_kv_heads == vb.n_kv_heads;
    for (int64_t r = 0; same && r < L; r++)
        same = !memcmp((const char *)va.k + r * sa, (const char *)vb.k + r * sb, bytes) &&
               !memcmp((const char *)va.v + r * sa, (const char *)vb.v + r * sb, bytes);
    return same;
}

/* int8 and fp8 storage: a prompt chunk then single tokens at every N;
 * layer 0's rows byte for byte (first_exact: its k and v are the same bits
 * at every N) and the last logits within the bound. */
static void test_quant_kv(const fixture *f, og_model *const *models, const int32_t *shards, int n_models,
                          bool first_exact) {
    const int64_t V = f->V, L = f->n < 12 ? f->n : 12;
    const og_dtype dts[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
    float *ref = calloc((size_t)V, sizeof(float)), *got = calloc((size_t)V, sizeof(float));
    for (int d = 0; d < 2; d++) {
        og_session *one = session_kv(models[0], dts[d]);
        if (!one) continue;
        CHECK_OK(og_session_eval(one, f->tokens, 5, 5, NULL, 0));
        feed(one, f->tokens, 5, L, ref);
        for (int k = 1; k < n_models; k++) {
            og_session *s = session_kv(models[k], dts[d]);
            if (!s) continue;
            CHECK_OK(og_session_eval(s, f->tokens, 5, 5, NULL, 0));
            feed(s, f->tokens, 5, L, got);
            const double diff = max_diff(got, ref, V);
            CHECK_MSG(diff <= BOUND, "%s, %s storage at N = %d: the logits differ by %g (bound %g)", f->name,
                      og_dtype_name(dts[d]), shards[k], diff, BOUND);
            if (first_exact)
                CHECK_MSG(same_rows(s, one, L), "%s, %s storage at N = %d: layer 0's rows differ from N = 1's",
                          f->name, og_dtype_name(dts[d]), shards[k]);
            og_session_destroy(s);
        }
        og_session_destroy(one);
    }
    free(ref);
    free(got);
}

static void test_fixture(fixture *f, const char *dir) {
    char section[128];
    snprintf(section, sizeof section, "%s: batches, save / restore across N, forks, a failed shard", f->name);
    og_test_section(section);
    if (!load_tokens(f)) {
        CHECK_MSG(0, "cannot read the tokens of %s", f->name);
        return;
    }
    char src[700];
    snprintf(src, sizeof src, "%s/tests/data/hf/%s", g_src, f->name);
    snprintf(f->prog, sizeof f->prog, "%s/%s.ogp", dir, f->name);
    og_export_options o;
    og_export_default_options(&o);
    o.dtype = OG_DTYPE_F32;
    o.max_write = 8;
    o.initial_capacity = 4; /* flat layers grow within the sequence */
    CHECK_OK(og_export_hf(src, f->prog, &o, NULL));
    const int32_t shards[4] = {1, 2, 4, 8};
    og_model *models[4];
    for (int k = 0; k < 4; k++) models[k] = load(f, shards[k]);
    if (models[0] && models[1] && models[2] && models[3]) {
        f->V = og_model_vocab_size(models[1]);
        test_batch(f, models[1]);
        test_batch(f, models[3]);
        test_save_fork(f, models, shards, 4, models[1], dir);
        test_quant_kv(f, models, shards, 4, !strcmp(f->name, "llama-gqa"));
        setenv("OG_TEST_TP_FAULT", "1:2", 1); /* shard 1 of 2, the model's second step */
        og_model *mf = load(f, 2);
        unsetenv("OG_TEST_TP_FAULT");
        if (mf) test_fault(f, mf, models[1]);
        og_model_destroy(mf);
    }
    for (int k = 0; k < 4; k++) og_model_destroy(models[k]);
    remove(f->prog);
    free(f->tokens);
}

int main(void) {
    snprintf(g_src, sizeof g_src, "%s", getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR);
    test_slice();
    char dir[] = "/tmp/og_test_tp_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    fixture fx[2] = {{.name = "qwen35-dense"}, {.name = "llama-gqa"}};
    for (int i = 0; i < 2; i++) test_fixture(&fx[i], dir);
    rmdir(dir);
    return og_test_finish();
}
