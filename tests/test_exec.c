/* The executor on the CPU, against itself where the reference is another way
 * of running the same program (parity with transformers is cli_parity.sh):
 * - sessions stepping concurrently from several threads give exactly what
 *   they give one after the other (no shared scratch, no shared rows);
 * - a step that fails (a token id outside the vocabulary) leaves the session
 *   at its length, and the session then continues as if it never happened;
 * - the last-row-only logits equal the last row of the all-rows logits;
 * - KV bytes follow what was written, not the declared capacity;
 * - og_session_eval_sample draws what og_sampler_sample draws from the
 *   logits of og_session_eval (same seed, each token fed back), refuses a
 *   sampler of another vocabulary, and a failed step leaves the sampler as
 *   it was;
 * - og_model_set_context bounds new sessions (a write past N refused, the
 *   storage reserved for N rows, the same logits below N), refuses more
 *   than the program declares, and leaves older sessions as they were. */
#include "harness.h"
#include "import/export.h"
#include "exec/sample.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 40
#define N_SESSIONS 3

static og_model *g_model;
static int64_t g_vocab;

typedef struct {
    int32_t tokens[N_TOK];
    float *logits; /* [N_TOK, V] */
    og_status st;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    og_session *s = NULL;
    j->st = og_session_create(g_model, NULL, &s);
    /* one token at a time, then the rest in steps of 5: many small steps
     * interleave with the other threads' */
    for (int t = 0; j->st == OG_OK && t < 10; t++) j->st = og_session_eval(s, &j->tokens[t], 1, 0, j->logits + t * g_vocab, 1);
    if (j->st == OG_OK) j->st = og_session_eval(s, j->tokens + 10, N_TOK - 10, 5, j->logits + 10 * g_vocab, 1);
    og_session_destroy(s);
    return NULL;
}

static void test_concurrent_sessions(void) {
    og_test_section("sessions stepping concurrently from threads");
    og_rng r = og_rng_seed(7);
    job seq[N_SESSIONS], par[N_SESSIONS];
    for (int k = 0; k < N_SESSIONS; k++) {
        for (int t = 0; t < N_TOK; t++) seq[k].tokens[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
        par[k] = seq[k];
        seq[k].logits = malloc(sizeof(float) * N_TOK * g_vocab);
        par[k].logits = malloc(sizeof(float) * N_TOK * g_vocab);
        og_poison(par[k].logits, (size_t)(N_TOK * g_vocab));
        run_job(&seq[k]);
        CHECK_OK(seq[k].st);
    }
    pthread_t th[N_SESSIONS];
    for (int k = 0; k < N_SESSIONS; k++) pthread_create(&th[k], NULL, run_job, &par[k]);
    for (int k = 0; k < N_SESSIONS; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < N_SESSIONS; k++) {
        CHECK_OK(par[k].st);
        CHECK_MSG(!memcmp(seq[k].logits, par[k].logits, sizeof(float) * N_TOK * g_vocab),
                  "session %d: concurrent logits differ from sequential ones", k);
        free(seq[k].logits);
        free(par[k].logits);
    }
}

static void test_failed_step(void) {
    og_test_section("a failed step never advances the session");
    int32_t good[12], bad[3];
    for (int t = 0; t < 12; t++) good[t] = (int32_t)((t * 37 + 5) % g_vocab);
    bad[0] = 1, bad[1] = (int32_t)g_vocab, bad[2] = 2; /* g_vocab is out of range */
    float *a = malloc(sizeof(float) * g_vocab), *b = malloc(sizeof(float) * g_vocab);
    og_session *s = NULL, *clean = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &s));
    CHECK_OK(og_session_create(g_model, NULL, &clean));
    CHECK_OK(og_session_eval(s, good, 6, 0, NULL, 0));
    CHECK_STATUS(og_session_eval(s, bad, 3, 0, a, 0), OG_ERR_INVALID_ARGUMENT);
    CHECK(og_session_length(s) == 6);
    CHECK_MSG(strstr(og_session_last_error(s), "token id") != NULL, "message: %s", og_session_last_error(s));
    CHECK_OK(og_session_eval(s, good + 6, 6, 0, a, 0));
    CHECK_OK(og_session_eval(clean, good, 12, 6, b, 0));
    CHECK(og_session_length(s) == 12);
    CHECK_MSG(!memcmp(a, b, sizeof(float) * g_vocab), "logits after a failed step differ from a clean run");
    og_session_destroy(s);
    og_session_destroy(clean);
    free(a);
    free(b);
}

static void test_last_row(void) {
    og_test_section("last-row logits equal the last row of all-rows logits");
    int32_t toks[9];
    for (int t = 0; t < 9; t++) toks[t] = (int32_t)((t * 11 + 3) % g_vocab);
    float *all = malloc(sizeof(float) * 9 * g_vocab), *last = malloc(sizeof(float) * g_vocab);
    og_poison(last, (size_t)g_vocab);
    og_session *s1 = NULL, *s2 = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &s1));
    CHECK_OK(og_session_create(g_model, NULL, &s2));
    CHECK_OK(og_session_eval(s1, toks, 9, 0, all, 1));
    CHECK_OK(og_session_eval(s2, toks, 9, 0, last, 0));
    /* the tail runs as a 1-row product (GEMV) instead of a 9-row one (sgemm):
     * f32 sums in another order, over K <= 128 terms of logits <= ~5 */
    double ratio = og_tol_ratio(last, all + 8 * g_vocab, (size_t)g_vocab, 1e-4, 1e-4, NULL);
    CHECK_MSG(ratio <= 1, "last-row logits off by %.3g of the tolerance", ratio);
    og_session_destroy(s1);
    og_session_destroy(s2);
    free(all);
    free(last);
}

static void test_eval_sample(void) {
    og_test_section("eval_sample draws what eval + og_sampler_sample draw");
    enum { PROMPT = 6, DRAWN = 24 };
    int32_t prompt[PROMPT];
    for (int t = 0; t < PROMPT; t++) prompt[t] = (int32_t)((t * 29 + 7) % g_vocab);
    og_sampler_params ps[3] = {og_sampler_default_params(), og_sampler_default_params(), og_sampler_default_params()};
    ps[0].seed = 5, ps[0].repeat_penalty = 1.2f, ps[0].repeat_last_n = 8;
    ps[1].temperature = 0;
    ps[2].temperature = 1.3f, ps[2].top_k = 0, ps[2].top_p = 1, ps[2].min_p = 0, ps[2].seed = 11;
    float *logits = malloc(sizeof(float) * g_vocab);
    for (int i = 0; i < 3; i++) {
        og_session *a = NULL, *b = NULL;
        og_sampler *sa = NULL, *sb = NULL;
        CHECK_OK(og_session_create(g_model, NULL, &a));
        CHECK_OK(og_session_create(g_model, NULL, &b));
        CHECK_OK(og_sampler_create(&ps[i], g_vocab, &sa));
        CHECK_OK(og_sampler_create(&ps[i], g_vocab, &sb));
        if (!a || !b || !sa || !sb) break;
        CHECK_OK(og_sampler_forbid(sa, 3));
        CHECK_OK(og_sampler_forbid(sb, 3));
        int32_t ta[DRAWN], tb[DRAWN];
        const int32_t *fa = prompt, *fb = prompt;
        int n = PROMPT, same = 0;
        for (int t = 0; t < DRAWN; t++) {
            ta[t] = tb[t] = -1;
            CHECK_OK(og_session_eval_sample(a, fa, n, 0, sa, &ta[t]));
            CHECK_OK(og_session_eval(b, fb, n, 0, logits, 0));
            tb[t] = og_sampler_sample(sb, logits);
            same += ta[t] == tb[t];
            fa = &ta[t], fb = &tb[t], n = 1;
        }
        CHECK_MSG(same == DRAWN, "params %d: %d of %d draws agree", i, same, DRAWN);
        /* a failed step spends no draw: the two samplers stay in step */
        const int32_t bad = (int32_t)g_vocab;
        int32_t tok = -5;
        CHECK_STATUS(og_session_eval_sample(a, &bad, 1, 0, sa, &tok), OG_ERR_INVALID_ARGUMENT);
        CHECK(tok == -5);
        CHECK_OK(og_session_eval_sample(a, fa, 1, 0, sa, &tok));
        CHECK_OK(og_session_eval(b, fb, 1, 0, logits, 0));
        CHECK(tok == og_sampler_sample(sb, logits));
        og_sampler_destroy(sa);
        og_sampler_destroy(sb);
        og_session_destroy(a);
        og_session_destroy(b);
    }
    og_sampler *other = NULL;
    og_session *s = NULL;
    CHECK_OK(og_sampler_create(&ps[0], g_vocab + 1, &other));
    CHECK_OK(og_session_create(g_model, NULL, &s));
    int32_t tok = -1;
    CHECK_STATUS(og_session_eval_sample(s, prompt, PROMPT, 0, other, &tok), OG_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(og_session_last_error(s), "vocabulary") != NULL, "message: %s", og_session_last_error(s));
    CHECK_STATUS(og_session_eval_sample(s, prompt, PROMPT, 0, NULL, &tok), OG_ERR_INVALID_ARGUMENT);
    CHECK(og_session_length(s) == 0);
    og_sampler_destroy(other);
    og_session_destroy(s);
    free(logits);
}

static void test_kv_bytes(const char *dir) {
    og_test_section("KV bytes follow the tokens written, not max_capacity");
    char path[512];
    snprintf(path, sizeof path, "%s/exec-32k.ogp", dir);
    og_export_options o;
    og_export_default_options(&o);
    o.max_context = 32768;
    o.initial_capacity = 128;
    char hf[512];
    snprintf(hf, sizeof hf, "%s/hf/llama-gqa", OG_TEST_DATA_DIR);
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, NULL, &m));
    if (!m) return;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, NULL, &s));
    int32_t toks[100];
    for (int t = 0; t < 100; t++) toks[t] = t % 300;
    CHECK_OK(og_session_eval(s, toks, 100, 0, NULL, 0));
    og_kv_metrics km;
    CHECK_OK(og_session_metrics(s, &km));
    /* llama-gqa: 2 flat layers, Hkv 2, D 8, bf16: 2 (k,v) * 2 * 8 * 2 bytes = 64 bytes per token per layer */
    const int64_t per_token = 2 * 2 * 8 * 2 * 2;
    CHECK(km.length == 100);
    CHECK_MSG(km.bytes_live == 100 * per_token, "live %lld", (long long)km.bytes_live);
    CHECK_MSG(km.bytes_allocated == 128 * per_token, "allocated %lld (initial capacity 128 rows)",
              (long long)km.bytes_allocated);
    CHECK(km.bytes_allocated < 32768 * per_token / 100);
    fprintf(stderr, "100 tokens at max-context 32768: %lld KV bytes allocated, %lld live, %lld declared\n",
            (long long)km.bytes_allocated, (long long)km.bytes_live, (long long)(32768 * per_token));
    og_session_destroy(s);
    og_model_destroy(m);
    remove(path);
}

static void test_set_context(const char *dir) {
    og_test_section("og_model_set_context: a session's context below the program's");
    char path[512], hf[512];
    snprintf(path, sizeof path, "%s/ctx.ogp", dir);
    snprintf(hf, sizeof hf, "%s/hf/llama-gqa", OG_TEST_DATA_DIR);
    og_export_options o;
    og_export_default_options(&o); /* max-context 128 (max_position_embeddings) */
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, NULL, &m));
    if (!m) return;
    const int64_t V = og_model_vocab_size(m), declared = og_model_kv_config(m)->max_capacity;
    CHECK(declared == 128);
    int32_t toks[64];
    for (int t = 0; t < 64; t++) toks[t] = (t * 37 + 5) % 300;
    float *want = malloc((size_t)(40 * V) * sizeof *want), *got = malloc((size_t)(40 * V) * sizeof *got);
    og_session *before = NULL, *s = NULL;
    CHECK_OK(og_session_create(m, NULL, &before));
    CHECK_OK(og_session_eval(before, toks, 40, 0, want, 1));
    CHECK(og_model_set_context(m, 129) == OG_ERR_INVALID_ARGUMENT);
    CHECK(og_model_set_context(m, -1) == OG_ERR_INVALID_ARGUMENT);
    CHECK(og_model_kv_config(m)->max_capacity == 128);
    CHECK_OK(og_model_set_context(m, 40));
    const og_kv_config *kv = og_model_kv_config(m);
    CHECK(kv->max_capacity == 40 && kv->initial_capacity <= 40 && kv->max_write <= 40);
    CHECK_OK(og_session_create(m, NULL, &s));
    if (s && want && got) {
        CHECK_OK(og_session_eval(s, toks, 40, 0, got, 1));
        CHECK_MSG(!memcmp(got, want, (size_t)(40 * V) * sizeof *got), "the logits below the context differ");
        CHECK(og_session_eval(s, toks + 40, 1, 0, NULL, 0) == OG_ERR_CAPACITY);
        CHECK(og_session_length(s) == 40);
        og_kv_metrics km;
        CHECK_OK(og_session_metrics(s, &km));
        /* 2 flat layers, Hkv 2, D 8, bf16 k and v: 64 bytes a token a layer */
        CHECK_MSG(km.bytes_allocated <= 40 * 2 * 64, "allocated %lld bytes for a context of 40",
                  (long long)km.bytes_allocated);
        /* the session made before keeps the program's context */
        CHECK_OK(og_session_eval(before, toks + 40, 24, 0, NULL, 0));
        CHECK(og_session_length(before) == 64);
    }
    og_session_destroy(s);
    CHECK_OK(og_model_set_context(m, 0));
    CHECK(og_model_kv_config(m)->max_capacity == 128);
    og_session_destroy(before);
    free(want);
    free(got);
    og_model_destroy(m);
    remove(path);
}

int main(void) {
    char dir[] = "/tmp/og_test_exec_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[512], hf[512];
    snprintf(path, sizeof path, "%s/qwen3.ogp", dir);
    snprintf(hf, sizeof hf, "%s/hf/qwen3-mixed", OG_TEST_DATA_DIR);
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 8; /* steps of 5 and 1 stay whole; 40 tokens wrap the window-8 rings */
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.n_threads = 2;
    CHECK_OK(og_model_load(path, &mp, &g_model));
    if (g_model) {
        g_vocab = og_model_vocab_size(g_model);
        test_concurrent_sessions();
        test_failed_step();
        test_last_row();
        test_eval_sample();
    }
    og_model_destroy(g_model);
    remove(path);
    test_kv_bytes(dir);
    test_set_context(dir);
    rmdir(dir);
    return og_test_finish();
}
