/* The prefix cache, on the CPU:
 *   - a multi-turn conversation: each turn's prompt (the conversation so far
 *     plus the new message) starts from a fork of the last turn's session;
 *     only the new tokens are fed, and the logits equal a fresh session's
 *     fed the whole prompt, bit for bit; metrics count hits, tokens reused
 *     and bytes shared (packed storage);
 *   - a prompt sharing a prefix mid-entry reuses exactly the common whole
 *     and partial blocks (flat layers fork anywhere), and less than one
 *     block is a miss; ring layers refuse a prefix below their fork floor
 *     (a miss, not an error); at most n - 1 tokens are reused;
 *   - an entry that a longer one stands in for is dropped; LRU eviction
 *     under the budget; an entry larger than the budget is not kept;
 *     another model's entries are never used; misuse refused, the session
 *     destroyed. */
#include "harness.h"
#include "import/export.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B 16 /* tokens a key block */

static int64_t g_vocab; /* token ids are drawn below the smaller vocabulary of the two models */

static void random_tokens(og_rng *r, int32_t *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(og_rng_next(r) % (uint64_t)g_vocab);
}

/* Logits of the last token of prompt [n] from a fresh session fed it whole. */
static void fresh_logits(og_model *m, const og_kv_allocator *a, const int32_t *prompt, int64_t n, float *out) {
    og_session_params sp = og_session_default_params();
    sp.kv_allocator = a;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    CHECK_OK(og_session_eval(s, prompt, n, 0, out, 0));
    og_session_destroy(s);
}

static void test_conversation(og_model *m, const og_kv_allocator *a, const char *name) {
    char what[128];
    snprintf(what, sizeof what, "%s: a conversation reuses each turn's prefix", name);
    og_test_section(what);
    og_prefix_cache_params cp = og_prefix_cache_default_params();
    cp.block_tokens = B;
    og_prefix_cache *c = NULL;
    CHECK_OK(og_prefix_cache_create(&cp, &c));
    og_session_params sp = og_session_default_params();
    sp.kv_allocator = a;
    og_rng r = og_rng_seed(3);
    int32_t conv[400];
    int64_t n = 0, fed = 0, reused_total = 0;
    const int64_t V = og_model_vocab_size(m);
    float *got = malloc(sizeof(float) * (size_t)V), *want = malloc(sizeof(float) * (size_t)V);
    /* the reference: one session that is never forked, fed in the very same
     * steps (each turn's new tokens, then the reply one token at a time), so
     * its rows are the same arithmetic as the cached ones' */
    og_session *ref = NULL;
    CHECK_OK(og_session_create(m, &sp, &ref));
    for (int turn = 0; turn < 5 && ref; turn++) {
        const int64_t msg = 20 + 7 * turn, reply = 9;
        random_tokens(&r, conv + n, msg);
        n += msg;
        og_session *s = NULL;
        int64_t reused = 0;
        CHECK_OK(og_prefix_cache_lookup(c, m, conv, n, &s, &reused));
        if (turn == 0) CHECK(s == NULL && reused == 0);
        else CHECK_MSG(s && reused == n - msg, "turn %d: reused %lld, want %lld", turn, (long long)reused, (long long)(n - msg));
        if (!s) CHECK_OK(og_session_create(m, &sp, &s));
        if (!s) break;
        CHECK(og_session_length(s) == reused);
        CHECK_OK(og_session_eval(s, conv + reused, n - reused, 0, got, 0));
        CHECK_OK(og_session_eval(ref, conv + n - msg, msg, 0, want, 0));
        fed += n - reused;
        reused_total += reused;
        CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)V), "turn %d: logits differ from the unforked session's",
                  turn);
        /* the reply, fed token by token as a decode would */
        random_tokens(&r, conv + n, reply);
        for (int64_t t = 0; t < reply; t++) {
            CHECK_OK(og_session_eval(s, conv + n + t, 1, 0, NULL, 0));
            CHECK_OK(og_session_eval(ref, conv + n + t, 1, 0, NULL, 0));
        }
        n += reply;
        CHECK_OK(og_prefix_cache_put(c, s, conv, n));
    }
    og_session_destroy(ref);
    og_prefix_cache_metrics pm;
    CHECK_OK(og_prefix_cache_metrics_get(c, &pm));
    CHECK(pm.lookups == 5 && pm.hits == 4 && pm.tokens_reused == reused_total && pm.puts == 5);
    /* flat layers: each turn's entry stands in for the last; ring layers
     * cannot fork far below their length, so every turn's entry stays */
    int32_t n_ring = 0;
    for (int32_t i = 0; i < og_model_kv_config(m)->n_layers; i++) n_ring += og_model_kv_config(m)->layers[i].policy == OG_KV_RING;
    CHECK_MSG(pm.entries == (n_ring ? 5 : 1), "%lld entries", (long long)pm.entries);
    if (a && a->share) CHECK(pm.bytes_shared > 0);
    fprintf(stderr, "%s: %lld prompt tokens fed of %lld (%lld reused), %lld KV bytes shared\n", name, (long long)fed,
            (long long)(fed + reused_total), (long long)reused_total, (long long)pm.bytes_shared);
    og_prefix_cache_destroy(c);
    free(got);
    free(want);
}

static og_session *fed(og_model *m, const int32_t *t, int64_t n) {
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, NULL, &s));
    if (s && n) CHECK_OK(og_session_eval(s, t, n, 0, NULL, 0));
    return s;
}

/* Flat layers only: a fork anywhere. */
static void test_partial_and_eviction(og_model *flat, og_model *ring) {
    og_test_section("prefixes mid-entry, blocks, floors, eviction, misuse");
    og_prefix_cache_params cp = {.budget_bytes = 1 << 30, .block_tokens = B};
    og_prefix_cache *c = NULL;
    CHECK_OK(og_prefix_cache_create(&cp, &c));
    og_rng r = og_rng_seed(8);
    int32_t a[100], p[100];
    random_tokens(&r, a, 100);
    CHECK_OK(og_prefix_cache_put(c, fed(flat, a, 100), a, 100));
    /* shares 2 blocks and 5 tokens */
    memcpy(p, a, sizeof p);
    p[2 * B + 5] = (a[2 * B + 5] + 1) % (int32_t)g_vocab;
    og_session *s = NULL;
    int64_t reused = 0;
    CHECK_OK(og_prefix_cache_lookup(c, flat, p, 60, &s, &reused));
    CHECK_MSG(s && reused == 2 * B + 5, "reused %lld", (long long)reused);
    const int64_t V = og_model_vocab_size(flat);
    float *got = malloc(sizeof(float) * (size_t)V), *want = malloc(sizeof(float) * (size_t)V);
    if (s) {
        CHECK_OK(og_session_eval(s, p + reused, 60 - reused, 0, got, 0));
        fresh_logits(flat, NULL, p, 60, want);
        CHECK(!memcmp(got, want, sizeof(float) * (size_t)V));
    }
    free(got);
    free(want);
    og_session_destroy(s);
    /* less than a block in common: a miss */
    p[B - 1] = (a[B - 1] + 1) % (int32_t)g_vocab;
    CHECK_OK(og_prefix_cache_lookup(c, flat, p, 60, &s, &reused));
    CHECK(s == NULL && reused == 0);
    /* the whole entry: at most n - 1 reused */
    CHECK_OK(og_prefix_cache_lookup(c, flat, a, 100, &s, &reused));
    CHECK(s && reused == 99);
    og_session_destroy(s);
    /* another model never uses it */
    CHECK_OK(og_prefix_cache_lookup(c, ring, a, 100, &s, &reused));
    CHECK(s == NULL && reused == 0);

    /* a ring model's entry of 100 tokens: its floor is 100 - max_write */
    CHECK_OK(og_prefix_cache_put(c, fed(ring, a, 100), a, 100));
    memcpy(p, a, sizeof p);
    p[50] = (a[50] + 1) % (int32_t)g_vocab;
    CHECK_OK(og_prefix_cache_lookup(c, ring, p, 100, &s, &reused));
    CHECK_MSG(s == NULL && reused == 0, "a prefix below the ring floor is a miss (%lld)", (long long)reused);
    int32_t longer[120];
    memcpy(longer, a, sizeof a);
    random_tokens(&r, longer + 100, 20);
    CHECK_OK(og_prefix_cache_lookup(c, ring, longer, 120, &s, &reused));
    CHECK(s && reused == 100);
    og_session_destroy(s);

    /* eviction: budget for about two flat entries of 100 tokens */
    og_prefix_cache_metrics pm;
    CHECK_OK(og_prefix_cache_metrics_get(c, &pm));
    og_prefix_cache_destroy(c);
    og_session *probe = fed(flat, a, 100);
    og_kv_metrics km;
    og_session_metrics(probe, &km);
    og_session_destroy(probe);
    cp.budget_bytes = 2 * km.bytes_allocated + km.bytes_allocated / 2;
    CHECK_OK(og_prefix_cache_create(&cp, &c));
    int32_t t3[3][100];
    for (int k = 0; k < 3; k++) {
        random_tokens(&r, t3[k], 100);
        CHECK_OK(og_prefix_cache_put(c, fed(flat, t3[k], 100), t3[k], 100));
        if (k == 1) { /* touch the first: the second becomes least recent */
            CHECK_OK(og_prefix_cache_lookup(c, flat, t3[0], 50, &s, &reused));
            CHECK(s && reused == 49);
            og_session_destroy(s);
        }
    }
    CHECK_OK(og_prefix_cache_metrics_get(c, &pm));
    CHECK_MSG(pm.entries == 2 && pm.evictions == 1 && pm.bytes_held <= cp.budget_bytes, "%lld entries, %lld evicted",
              (long long)pm.entries, (long long)pm.evictions);
    CHECK_OK(og_prefix_cache_lookup(c, flat, t3[1], 60, &s, &reused));
    CHECK(s == NULL); /* evicted */
    CHECK_OK(og_prefix_cache_lookup(c, flat, t3[0], 60, &s, &reused));
    CHECK(s != NULL);
    og_session_destroy(s);
    /* trim (a server wanting the memory back): t3[2] is least recent now */
    CHECK(og_prefix_cache_trim(c, pm.bytes_held) == pm.bytes_held);
    const int64_t left = og_prefix_cache_trim(c, pm.bytes_held - 1);
    og_prefix_cache_metrics pt;
    CHECK_OK(og_prefix_cache_metrics_get(c, &pt));
    CHECK_MSG(pt.entries == 1 && pt.evictions == 2 && left == pt.bytes_held && left < pm.bytes_held,
              "trim: %lld entries, %lld evicted, %lld bytes left", (long long)pt.entries, (long long)pt.evictions,
              (long long)left);
    CHECK_OK(og_prefix_cache_lookup(c, flat, t3[2], 60, &s, &reused));
    CHECK(s == NULL); /* trimmed */
    CHECK_OK(og_prefix_cache_lookup(c, flat, t3[0], 60, &s, &reused));
    CHECK(s != NULL && reused == 59);
    og_session_destroy(s);
    CHECK(og_prefix_cache_trim(c, -5) == 0 && og_prefix_cache_trim(NULL, 0) == 0);
    og_prefix_cache_clear(c);
    CHECK_OK(og_prefix_cache_metrics_get(c, &pm));
    CHECK(pm.entries == 0 && pm.bytes_held == 0);
    /* an entry bigger than the budget */
    og_prefix_cache_destroy(c);
    cp.budget_bytes = 1;
    CHECK_OK(og_prefix_cache_create(&cp, &c));
    CHECK_OK(og_prefix_cache_put(c, fed(flat, a, 100), a, 100));
    CHECK_OK(og_prefix_cache_metrics_get(c, &pm));
    CHECK(pm.entries == 0 && pm.evictions == 1);
    /* misuse: the session is destroyed all the same (the sanitizers see no leak) */
    CHECK_STATUS(og_prefix_cache_put(c, fed(flat, a, 10), a, 9), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_prefix_cache_put(NULL, fed(flat, a, 10), a, 10), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_prefix_cache_lookup(c, flat, a, 10, NULL, &reused), OG_ERR_INVALID_ARGUMENT);
    og_prefix_cache_params bad = {.budget_bytes = -1, .block_tokens = 4};
    og_prefix_cache *none = NULL;
    CHECK_STATUS(og_prefix_cache_create(&bad, &none), OG_ERR_INVALID_ARGUMENT);
    bad = (og_prefix_cache_params){.budget_bytes = 1, .block_tokens = 0};
    CHECK_STATUS(og_prefix_cache_create(&bad, &none), OG_ERR_INVALID_ARGUMENT);
    og_prefix_cache_destroy(c);
    og_prefix_cache_destroy(NULL);
}

static og_model *load(const char *dir, const char *hf_name, const char *file) {
    char path[512], hf[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(hf, sizeof hf, "%s/hf/%s", OG_TEST_DATA_DIR, hf_name);
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 8;
    o.max_context = 1024;
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, &mp, &m));
    remove(path);
    return m;
}

int main(void) {
    char dir[] = "/tmp/og_test_prefix_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    og_model *ring = load(dir, "qwen3-mixed", "qwen3.ogp"), *flat = load(dir, "llama-gqa", "llama.ogp");
    if (ring && flat) {
        g_vocab = og_model_vocab_size(ring) < og_model_vocab_size(flat) ? og_model_vocab_size(ring)
                                                                         : og_model_vocab_size(flat);
        og_kv_allocator paged;
        const bool have_paged = og_kv_allocator_paged(&paged) == OG_OK;
        test_conversation(ring, NULL, "ring model, dense");
        if (have_paged) test_conversation(ring, &paged, "ring model, packed");
        test_conversation(flat, NULL, "flat model, dense");
        test_partial_and_eviction(flat, ring);
        if (have_paged) og_kv_allocator_paged_release(&paged);
    }
    og_model_destroy(ring);
    og_model_destroy(flat);
    rmdir(dir);
    return og_test_finish();
}
