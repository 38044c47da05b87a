/* Per-session state (the third storage kind) and the hybrid model on the CPU:
 *   - KV level: a session over a manifest of states holds two copies of
 *     each; a prepared step writes the other copy and its commit swaps them,
 *     a rollback or abort leaves the committed state as it was whatever the
 *     step wrote; checkpoints; forks at 0, at the end and at the checkpoint
 *     copy the state and any other length is refused naming the state's
 *     layer; a child's writes never reach the parent; metrics; allocation
 *     failures at create, checkpoint and fork leave nothing half-made;
 *   - model level, on the Qwen3.5 fixture (tests/data/hf/qwen35-dense)
 *     exported as an f32 program: a fork at the end continued gives the
 *     logits of the session that was never forked, bit for bit, and so does
 *     a fork at a checkpoint; a save restored continues the same; a prefix
 *     cache hit (at an entry's end, and at its checkpoint) gives the logits
 *     of a cold prefill to f32 rounding (its steps cut the prompt elsewhere);
 *     sessions stepped in one batch (a decode row beside a prompt chunk) get
 *     the bits they get alone; a batch refused for one session's capacity,
 *     and a step whose KV growth fails (fault-injecting allocator), leave
 *     every state bit as it was: the next steps give the reference's logits.
 * With the argument "cuda" (tests/gpu/run.sh) the model level runs on the
 * CUDA back end (skipped, 77, without a device): forks, checkpoints and
 * saves bit for bit as on the CPU; a batch and a prefix hit to f32 rounding
 * (the back end's batched products sum in another order); the
 * fault-injecting allocator is the CPU's only. The fixture is found under
 * OG_SOURCE_DIR (environment) or the source tree this was built from.
 * Letters: L length, T step width, V vocabulary. */
#include "harness.h"
#include "kv/kv.h"
#include "import/export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- KV level */

static const og_kv_layer_config k_layer = {.layer_id = 2, .policy = OG_KV_FLAT, .n_kv_heads = 1, .head_dim = 4};
static const og_kv_state_config k_states[2] = {
    {.layer_id = 0, .name = "conv", .dtype = OG_DTYPE_F32, .rank = 2, .shape = {3, 5}},
    {.layer_id = 0, .name = "recurrent", .dtype = OG_DTYPE_F32, .rank = 3, .shape = {2, 3, 4}},
};

static og_kv_config states_cfg(int32_t n_layers) {
    return (og_kv_config){.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_F32, .max_capacity = 64,
                          .initial_capacity = 4, .max_write = 8, .n_model_layers = 3, .n_layers = n_layers,
                          .layers = n_layers ? &k_layer : NULL, .n_states = 2, .states = k_states};
}

/* Fills the copy a prepared step writes with a pattern of tag. */
static void write_states(og_kv_session *s, float tag) {
    for (int32_t i = 0; i < 2; i++) {
        og_kv_state_view v;
        CHECK_OK(og_kv_session_state_view(s, i, &v));
        float *w = v.write;
        for (int64_t e = 0; e < v.bytes / 4; e++) w[e] = tag + (float)(i * 100 + e);
    }
}

/* True when the committed copy holds tag's pattern. */
static bool holds(const og_kv_session *s, float tag) {
    for (int32_t i = 0; i < 2; i++) {
        og_kv_state_view v;
        if (og_kv_session_state_view(s, i, &v) != OG_OK) return false;
        const float *r = v.read;
        for (int64_t e = 0; e < v.bytes / 4; e++)
            if (r[e] != tag + (float)(i * 100 + e)) return false;
    }
    return true;
}

/* A step of T that writes tag's pattern, committed. */
static void step(og_kv_session *s, int32_t T, float tag) {
    CHECK_OK(og_kv_session_prepare(s, T));
    write_states(s, tag);
    CHECK_OK(og_kv_session_commit(s, T));
}

static void test_kv_states(void) {
    og_test_section("kv: two copies of every state, swapped by commit, kept by rollback and abort");
    for (int32_t nl = 0; nl <= 1; nl++) {
        og_kv_config cfg = states_cfg(nl);
        og_kv_session *s = NULL;
        CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
        if (!s) return;
        og_kv_state_view v0, v1;
        CHECK_OK(og_kv_session_state_view(s, 0, &v0));
        CHECK_OK(og_kv_session_state_view(s, 1, &v1));
        CHECK(v0.bytes == 3 * 5 * 4 && v1.bytes == 2 * 3 * 4 * 4 && v0.rank == 2 && v1.shape[2] == 4);
        CHECK(!strcmp(v1.name, "recurrent") && v1.layer_id == 0 && v0.read != v0.write);
        CHECK_STATUS(og_kv_session_state_view(s, 2, &v0), OG_ERR_INVALID_ARGUMENT);
        og_kv_metrics km;
        CHECK_OK(og_kv_session_metrics(s, &km));
        /* each state starts on 256 bytes: two halves of 256 + 256 */
        CHECK_MSG(km.n_states == 2 && km.bytes_state == 2 * 512 && km.bytes_allocated >= km.bytes_state,
                  "n_states %d, bytes_state %lld", (int)km.n_states, (long long)km.bytes_state);
        CHECK(km.bytes_live == 0);
        step(s, 3, 1000.0f);
        CHECK(holds(s, 1000.0f));
        CHECK_OK(og_kv_session_metrics(s, &km));
        CHECK(km.bytes_live >= 512);
        /* a rolled-back step wrote garbage into the other copy: nothing changed */
        CHECK_OK(og_kv_session_prepare(s, 2));
        write_states(s, -7.0f);
        og_kv_session_rollback(s);
        CHECK(holds(s, 1000.0f) && og_kv_session_length(s) == 3);
        CHECK_OK(og_kv_session_prepare(s, 2));
        write_states(s, -8.0f);
        og_kv_session_abort(s);
        CHECK(holds(s, 1000.0f) && og_kv_session_length(s) == 3);
        step(s, 2, 2000.0f);
        CHECK(holds(s, 2000.0f) && og_kv_session_length(s) == 5);

        og_test_section("kv: checkpoints and forks of states");
        CHECK(og_kv_session_checkpoint_length(s) == -1);
        CHECK(og_kv_session_fork_point(s, 4) == 0 && og_kv_session_fork_point(s, 5) == 5);
        CHECK_OK(og_kv_session_checkpoint(s)); /* at 5 */
        CHECK(og_kv_session_checkpoint_length(s) == 5);
        CHECK_OK(og_kv_session_metrics(s, &km));
        CHECK(km.bytes_state == 3 * 512);
        step(s, 4, 3000.0f);
        CHECK(og_kv_session_fork_point(s, 8) == 5 && og_kv_session_fork_point(s, 100) == 9);
        og_kv_session *c = NULL;
        CHECK_STATUS(og_kv_session_fork(s, 7, NULL, &c), OG_ERR_UNSUPPORTED);
        CHECK_MSG(c == NULL && strstr(og_last_error(), "layer_id 0") && strstr(og_last_error(), "checkpoint"),
                  "message: %s", og_last_error());
        CHECK_OK(og_kv_session_fork(s, 5, NULL, &c)); /* the checkpoint */
        CHECK(c && holds(c, 2000.0f) && og_kv_session_length(c) == 5);
        og_kv_session_destroy(c);
        CHECK_OK(og_kv_session_fork(s, 9, NULL, &c)); /* the end */
        CHECK(c && holds(c, 3000.0f));
        step(c, 1, 4000.0f); /* the child's writes stay its own */
        CHECK(holds(c, 4000.0f) && holds(s, 3000.0f));
        step(s, 1, 5000.0f);
        CHECK(holds(c, 4000.0f) && holds(s, 5000.0f));
        og_kv_session_destroy(c);
        CHECK_OK(og_kv_session_fork(s, 0, NULL, &c)); /* an empty child: its state is zero by definition */
        CHECK(c && og_kv_session_length(c) == 0 && og_kv_session_checkpoint_length(c) == -1);
        og_kv_session_destroy(c);
        CHECK_OK(og_kv_session_prepare(s, 1));
        CHECK_STATUS(og_kv_session_checkpoint(s), OG_ERR_STATE);
        og_kv_session_abort(s);
        og_kv_session_reset(s);
        CHECK(og_kv_session_checkpoint_length(s) == -1 && og_kv_session_fork_point(s, 10) == 0);
        og_kv_session_destroy(s);
    }

    og_test_section("kv: allocation failures at create, checkpoint and fork leave nothing half-made");
    og_kv_fault_state fs = {.inner = og_kv_allocator_cpu()};
    og_kv_allocator fa = og_kv_allocator_faulty(&fs);
    og_kv_config cfg = states_cfg(1);
    og_kv_session *s = NULL;
    og_kv_fault_arm(&fs, 1);
    CHECK_STATUS(og_kv_session_create(&cfg, &fa, &s), OG_ERR_OUT_OF_MEMORY);
    CHECK(s == NULL);
    og_kv_fault_arm(&fs, 0);
    CHECK_OK(og_kv_session_create(&cfg, &fa, &s));
    if (!s) return;
    step(s, 2, 100.0f);
    CHECK_OK(og_kv_session_checkpoint(s));
    step(s, 2, 200.0f);
    og_kv_fault_arm(&fs, 1); /* the checkpoint's copy exists: nothing to allocate, it is replaced */
    CHECK_OK(og_kv_session_checkpoint(s));
    CHECK(og_kv_session_checkpoint_length(s) == 4);
    for (int64_t at = 1; at <= 4; at++) { /* every allocation of a fork at the end fails in turn */
        og_kv_fault_arm(&fs, at);
        og_kv_session *c = NULL;
        const og_status st = og_kv_session_fork(s, 4, &fa, &c);
        if (st == OG_OK) {
            CHECK(holds(c, 200.0f));
            og_kv_session_destroy(c);
            break;
        }
        CHECK(st == OG_ERR_OUT_OF_MEMORY && c == NULL && holds(s, 200.0f) && og_kv_session_length(s) == 4);
    }
    og_kv_fault_arm(&fs, 0);
    og_kv_session_destroy(s);
    CHECK_OK(og_kv_session_create(&cfg, &fa, &s));
    step(s, 1, 300.0f);
    og_kv_fault_arm(&fs, 1); /* the first checkpoint allocates its copy */
    CHECK_STATUS(og_kv_session_checkpoint(s), OG_ERR_OUT_OF_MEMORY);
    CHECK(og_kv_session_checkpoint_length(s) == -1 && holds(s, 300.0f));
    og_kv_fault_arm(&fs, 0);
    og_kv_session_destroy(s);
}

/* ------------------------------------------------------------- model level */

#define SEQ 160
#define CHUNK 32

static int32_t g_tokens[SEQ];
static bool g_cuda;
static char g_fixture[1024]; /* the checkpoint folder */
static int64_t g_vocab;
static float *g_ref; /* [SEQ, V]: one session fed everything in steps of CHUNK */

static bool load_tokens(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/tokens.txt", g_fixture);
    char *text = og_test_read_file(path);
    if (!text) return false;
    int n = 0;
    for (char *p = text; *p && n < SEQ;) {
        g_tokens[n++] = (int32_t)strtol(p, &p, 10);
        while (*p == ',' || *p == '\n') p++;
    }
    free(text);
    return n == SEQ;
}

/* Feeds tokens [from, to) in steps of chunk; logits of every row into out
 * rows [from, to) (out may be NULL). */
static og_status feed(og_session *s, int64_t from, int64_t to, int32_t chunk, float *out) {
    return og_session_eval(s, g_tokens + from, to - from, chunk, out ? out + from * g_vocab : NULL, 1);
}

static bool rows_equal(const float *a, const float *b, int64_t from, int64_t to) {
    return !memcmp(a + from * g_vocab, b + from * g_vocab, (size_t)((to - from) * g_vocab) * sizeof(float));
}

static double rows_ratio(const float *a, const float *b, int64_t from, int64_t to) {
    return og_tol_ratio(a + from * g_vocab, b + from * g_vocab, (size_t)((to - from) * g_vocab), 1e-4, 1e-4, NULL);
}

static void test_model(og_model *m, const char *dir) {
    float *got = calloc((size_t)(SEQ * g_vocab), sizeof(float));
    og_session *r = NULL, *a = NULL, *c = NULL, *d = NULL;
    CHECK_OK(og_session_create(m, NULL, &r));
    CHECK_OK(feed(r, 0, SEQ, CHUNK, g_ref));

    og_test_section("model: a fork at the end, continued, is the session never forked");
    CHECK_OK(og_session_create(m, NULL, &a));
    CHECK_OK(feed(a, 0, 96, CHUNK, NULL));
    CHECK_OK(og_session_fork(a, 96, &c));
    CHECK_OK(feed(c, 96, SEQ, CHUNK, got));
    CHECK(rows_equal(got, g_ref, 96, SEQ));
    memset(got, 0, (size_t)(SEQ * g_vocab) * sizeof(float));
    CHECK_OK(feed(a, 96, SEQ, CHUNK, got)); /* the parent too, after its child ran */
    CHECK(rows_equal(got, g_ref, 96, SEQ));
    og_session_destroy(c);
    c = NULL;

    og_test_section("model: forks elsewhere are refused, except at a checkpoint");
    CHECK_OK(og_session_create(m, NULL, &d));
    CHECK_OK(feed(d, 0, 64, CHUNK, NULL));
    CHECK_OK(og_session_checkpoint(d));
    CHECK_OK(feed(d, 64, 100, 36, NULL));
    CHECK(og_session_fork_point(d, 99) == 64 && og_session_fork_point(d, 100) == 100);
    CHECK_STATUS(og_session_fork(d, 80, &c), OG_ERR_UNSUPPORTED);
    CHECK(c == NULL && strstr(og_last_error(), "state"));
    CHECK_OK(og_session_fork(d, 64, &c));
    CHECK_OK(feed(c, 64, SEQ, CHUNK, got));
    CHECK(rows_equal(got, g_ref, 64, SEQ));
    og_session_destroy(c);
    c = NULL;

    og_test_section("model: a saved session restored continues as the original");
    char path[512];
    snprintf(path, sizeof path, "%s/session.ogs", dir);
    og_session_destroy(a);
    a = NULL;
    CHECK_OK(og_session_create(m, NULL, &a));
    CHECK_OK(feed(a, 0, 96, CHUNK, NULL));
    CHECK_OK(og_session_save(a, path));
    og_session *s = NULL;
    CHECK_OK(og_session_restore(m, path, &s));
    if (s) {
        CHECK(og_session_length(s) == 96);
        CHECK_OK(feed(s, 96, SEQ, CHUNK, got));
        CHECK(rows_equal(got, g_ref, 96, SEQ));
        og_session_destroy(s);
        s = NULL;
    }
    /* a flipped byte in the last state's payload (the file's last bytes) */
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, -5, SEEK_END);
        int ch = fgetc(f);
        fseek(f, -5, SEEK_END);
        fputc(ch ^ 0x40, f);
        fclose(f);
    }
    CHECK_STATUS(og_session_restore(m, path, &s), OG_ERR_FORMAT);
    CHECK_MSG(s == NULL && strstr(og_last_error(), "state"), "message: %s", og_last_error());
    remove(path);
    /* a session of length 0 saves and restores too */
    og_session *e = NULL;
    CHECK_OK(og_session_create(m, NULL, &e));
    CHECK_OK(og_session_save(e, path));
    CHECK_OK(og_session_restore(m, path, &s));
    if (s) {
        CHECK_OK(feed(s, 0, SEQ, CHUNK, got));
        CHECK(rows_equal(got, g_ref, 0, SEQ));
        og_session_destroy(s);
    }
    og_session_destroy(e);
    remove(path);

    og_test_section("model: prefix cache hits at an entry's end and at its checkpoint equal a cold prefill");
    og_prefix_cache_params pp = og_prefix_cache_default_params();
    pp.block_tokens = 16;
    og_prefix_cache *pc = NULL;
    CHECK_OK(og_prefix_cache_create(&pp, &pc));
    og_session *cut = NULL;
    CHECK_OK(og_session_fork(a, 96, &cut));
    CHECK_OK(og_prefix_cache_put(pc, cut, g_tokens, 96));
    og_session *hit = NULL;
    int64_t reused = 0;
    CHECK_OK(og_prefix_cache_lookup(pc, m, g_tokens, SEQ, &hit, &reused));
    CHECK_MSG(hit && reused == 96, "reused %lld", (long long)reused);
    if (hit) {
        CHECK_OK(feed(hit, reused, SEQ, CHUNK, got));
        CHECK_MSG(rows_ratio(got, g_ref, 96, SEQ) <= 1, "%.3g", rows_ratio(got, g_ref, 96, SEQ));
        og_session_destroy(hit);
        hit = NULL;
    }
    og_prefix_cache_clear(pc);
    /* an entry whose tokens leave the prompt at 72, with a checkpoint at 64 */
    int32_t other[80];
    memcpy(other, g_tokens, sizeof other);
    for (int i = 72; i < 80; i++) other[i] = (g_tokens[i] + 1) % (int32_t)g_vocab;
    og_session *o = NULL;
    CHECK_OK(og_session_create(m, NULL, &o));
    CHECK_OK(og_session_eval(o, other, 64, CHUNK, NULL, 0));
    CHECK_OK(og_session_checkpoint(o));
    CHECK_OK(og_session_eval(o, other + 64, 16, CHUNK, NULL, 0));
    CHECK_OK(og_prefix_cache_put(pc, o, other, 80));
    CHECK_OK(og_prefix_cache_lookup(pc, m, g_tokens, SEQ, &hit, &reused));
    CHECK_MSG(hit && reused == 64, "reused %lld (the checkpoint is at 64, the common prefix 72)", (long long)reused);
    if (hit) {
        CHECK_OK(feed(hit, reused, SEQ, CHUNK, got));
        CHECK_MSG(rows_ratio(got, g_ref, 64, SEQ) <= 1, "%.3g", rows_ratio(got, g_ref, 64, SEQ));
        og_session_destroy(hit);
    }
    og_prefix_cache_destroy(pc);

    og_test_section("model: sessions in one batch get the bits they get alone");
    /* p1 at 96 decodes one token while p2 reads a prompt chunk of 20 from 0 */
    og_session *p1 = NULL, *p2 = NULL;
    CHECK_OK(og_session_fork(d, 64, &p1));
    CHECK_OK(feed(p1, 64, 96, CHUNK, NULL));
    CHECK_OK(og_session_create(m, NULL, &p2));
    float *l1 = malloc((size_t)g_vocab * sizeof(float)), *l2 = malloc((size_t)(20 * g_vocab) * sizeof(float));
    og_batch_item items[2] = {
        {.session = p1, .tokens = g_tokens + 96, .n_tokens = 1, .output = OG_OUTPUT_LOGITS, .logits = l1},
        {.session = p2, .tokens = g_tokens, .n_tokens = 20, .output = OG_OUTPUT_LOGITS_ALL, .logits = l2},
    };
    CHECK_OK(og_model_step(m, items, 2));
    og_session *q1 = NULL, *q2 = NULL;
    CHECK_OK(og_session_fork(d, 64, &q1));
    CHECK_OK(feed(q1, 64, 96, CHUNK, NULL));
    CHECK_OK(og_session_create(m, NULL, &q2));
    float *k1 = malloc((size_t)g_vocab * sizeof(float)), *k2 = malloc((size_t)(20 * g_vocab) * sizeof(float));
    CHECK_OK(og_session_eval(q1, g_tokens + 96, 1, 0, k1, 0));
    CHECK_OK(og_session_eval(q2, g_tokens, 20, 0, k2, 1));
    if (g_cuda) { /* the batched products sum in another order than a session's alone */
        CHECK(og_tol_ratio(l1, k1, (size_t)g_vocab, 1e-4, 1e-4, NULL) <= 1);
        CHECK(og_tol_ratio(l2, k2, (size_t)(20 * g_vocab), 1e-4, 1e-4, NULL) <= 1);
    } else {
        CHECK(!memcmp(l1, k1, (size_t)g_vocab * sizeof(float)));
        CHECK(!memcmp(l2, k2, (size_t)(20 * g_vocab) * sizeof(float)));
    }

    og_test_section("model: a refused batch and a failed KV growth leave every state as it was");
    /* p2 cannot take 3 tokens past max_capacity: nobody moves */
    const int64_t cap = og_model_kv_config(m)->max_capacity;
    og_session *full = NULL;
    CHECK_OK(og_session_create(m, NULL, &full));
    int32_t *fill = calloc((size_t)cap, sizeof *fill);
    for (int64_t i = 0; i < cap; i++) fill[i] = g_tokens[i % SEQ];
    CHECK_OK(og_session_eval(full, fill, cap - 2, 0, NULL, 0));
    og_batch_item bad[2] = {
        {.session = p1, .tokens = g_tokens + 97, .n_tokens = 3, .output = OG_OUTPUT_NONE},
        {.session = full, .tokens = fill, .n_tokens = 3, .output = OG_OUTPUT_NONE},
    };
    CHECK_STATUS(og_model_step(m, bad, 2), OG_ERR_CAPACITY);
    CHECK(og_session_length(p1) == 97);
    CHECK_OK(feed(p1, 97, SEQ, CHUNK, got));
    /* the same history without the refused step */
    float *got2 = calloc((size_t)(SEQ * g_vocab), sizeof(float));
    og_session *z = NULL;
    CHECK_OK(og_session_fork(d, 64, &z));
    CHECK_OK(feed(z, 64, 96, CHUNK, NULL));
    CHECK_OK(og_session_eval(z, g_tokens + 96, 1, 0, NULL, 0));
    CHECK_OK(feed(z, 97, SEQ, CHUNK, got2));
    CHECK(g_cuda ? rows_ratio(got, got2, 97, SEQ) <= 1 : rows_equal(got, got2, 97, SEQ));
    /* a session over the fault-injecting allocator: its growth past the
     * first rows fails (KV only; the states were allocated at create) */
    og_kv_fault_state fs = {.inner = og_kv_allocator_cpu()};
    og_kv_allocator fa = og_kv_allocator_faulty(&fs);
    og_session_params sp = og_session_default_params();
    sp.kv_allocator = &fa;
    og_session *g = NULL;
    if (!g_cuda) CHECK_OK(og_session_create(m, &sp, &g));
    if (g) {
        CHECK_OK(feed(g, 0, 32, CHUNK, NULL));
        og_kv_fault_arm(&fs, 1); /* the next allocation: the flat layer's growth */
        const og_status st = feed(g, 32, SEQ, 0, NULL);
        CHECK_MSG(st == OG_ERR_OUT_OF_MEMORY, "status %s", og_status_str(st));
        CHECK(fs.failures >= 1 && og_session_length(g) >= 32);
        og_kv_fault_arm(&fs, 0);
        /* the session goes on from where its last committed step left it */
        const int64_t L = og_session_length(g);
        memset(got, 0, (size_t)(SEQ * g_vocab) * sizeof(float));
        if (L < SEQ) {
            CHECK_OK(feed(g, L, SEQ, CHUNK, got));
            og_session *h = NULL;
            CHECK_OK(og_session_create(m, NULL, &h));
            CHECK_OK(feed(h, 0, L, 0, NULL));
            CHECK_OK(feed(h, L, SEQ, CHUNK, got2));
            CHECK(rows_equal(got, got2, L, SEQ));
            og_session_destroy(h);
        }
        og_session_destroy(g);
    }
    free(fill), free(l1), free(l2), free(k1), free(k2), free(got), free(got2);
    og_session_destroy(full);
    og_session_destroy(p1), og_session_destroy(p2), og_session_destroy(q1), og_session_destroy(q2);
    og_session_destroy(z);
    og_session_destroy(r), og_session_destroy(a), og_session_destroy(d);
}

/* A copy of the fixture whose image placeholder (image_token_id) falls
 * inside the vocabulary: its program refuses that token by name. */
static void test_vision_refused(const char *dir) {
    og_test_section("model: a vision checkpoint's image placeholder is refused by name");
    char cdir[600], path[1200], ogp[700];
    snprintf(cdir, sizeof cdir, "%s/vision", dir);
    if (mkdir(cdir, 0700) != 0) return;
    static const char *const files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        char from[1200];
        snprintf(from, sizeof from, "%s/%s", g_fixture, files[i]);
        snprintf(path, sizeof path, "%s/%s", cdir, files[i]);
        CHECK(symlink(from, path) == 0);
    }
    snprintf(path, sizeof path, "%s/config.json", g_fixture);
    char *cfg = og_test_read_file(path), *at = cfg ? strstr(cfg, "\"image_token_id\": 248056") : NULL;
    CHECK(at != NULL);
    if (at) memcpy(at, "\"image_token_id\":    440", strlen("\"image_token_id\":    440"));
    snprintf(path, sizeof path, "%s/config.json", cdir);
    FILE *f = fopen(path, "w");
    if (f && cfg) fputs(cfg, f);
    if (f) fclose(f);
    free(cfg);
    snprintf(ogp, sizeof ogp, "%s/vision.ogp", dir);
    CHECK_OK(og_export_hf(cdir, ogp, NULL, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    og_model *m = NULL;
    CHECK_OK(og_model_load(ogp, &mp, &m));
    og_session *s = NULL;
    if (m) CHECK_OK(og_session_create(m, NULL, &s));
    if (s) {
        const int32_t ok[2] = {5, 6}, bad[3] = {5, 440, 6};
        CHECK_OK(og_session_eval(s, ok, 2, 0, NULL, 0));
        CHECK_STATUS(og_session_eval(s, bad, 3, 0, NULL, 0), OG_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(og_session_last_error(s), "440") && strstr(og_session_last_error(s), "vision"), "message: %s",
                  og_session_last_error(s));
        CHECK(og_session_length(s) == 2);
    }
    og_session_destroy(s);
    og_model_destroy(m);
    remove(ogp);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", cdir, files[i]);
        remove(path);
    }
    snprintf(path, sizeof path, "%s/config.json", cdir);
    remove(path);
    rmdir(cdir);
}

int main(int argc, char **argv) {
    g_cuda = argc > 1 && !strcmp(argv[1], "cuda");
    const char *src = getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR;
    snprintf(g_fixture, sizeof g_fixture, "%s/tests/data/hf/qwen35-dense", src);
    if (g_cuda) {
        og_model_params probe = og_model_default_params();
        probe.backend = OG_BACKEND_CUDA;
        og_model *none = NULL;
        if (og_model_load("/nonexistent.ogp", &probe, &none) == OG_ERR_UNSUPPORTED) {
            printf("skipped: built without CUDA\n");
            return OG_TEST_SKIP;
        }
    } else {
        test_kv_states();
    }
    if (!load_tokens()) {
        CHECK_MSG(0, "cannot read %s/tokens.txt", g_fixture);
        return og_test_finish();
    }
    char dir[] = "/tmp/og_test_hybrid_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[512];
    snprintf(path, sizeof path, "%s/qwen35.ogp", dir);
    og_export_options o;
    og_export_default_options(&o);
    o.dtype = OG_DTYPE_F32;
    o.max_write = 64;
    o.initial_capacity = 16; /* flat layers grow within the sequence (the fault injection's allocations) */
    CHECK_OK(og_export_hf(g_fixture, path, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = g_cuda ? OG_BACKEND_CUDA : OG_BACKEND_CPU;
    mp.n_threads = 2;
    og_model *m = NULL;
    og_status st = og_model_load(path, &mp, &m);
    if (g_cuda && st == OG_ERR_NO_DEVICE) {
        printf("skipped: no CUDA device\n");
        remove(path);
        rmdir(dir);
        return OG_TEST_SKIP;
    }
    CHECK_OK(st);
    if (m) {
        g_vocab = og_model_vocab_size(m);
        g_ref = calloc((size_t)(SEQ * g_vocab), sizeof(float));
        test_model(m, dir);
        free(g_ref);
    }
    og_model_destroy(m);
    if (!g_cuda) test_vision_refused(dir);
    remove(path);
    rmdir(dir);
    return og_test_finish();
}
