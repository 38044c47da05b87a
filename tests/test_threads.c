/* One model serving sessions on different threads (CPU back end, or CUDA
 * with the argument `cuda`: tests/gpu/run.sh runs it so), the
 * header's promise, checked so that a ThreadSanitizer build (make
 * test-tsan) sees every shared path: 4 threads each own 2 sessions of one
 * model whose thread pool has 2 workers, and alternate between a batched
 * step of both sessions (og_model_step, arg-max) and one
 * og_session_eval_next per session; a prompt first, then greedy decoding
 * of each session's own previous token. Every session's tokens equal those
 * of the same job run alone on the main thread, for an f32 and a bf16
 * program. Then the same with the threads split over two models loaded
 * from one file, so that steps of two models' per-model state interleave. */
#include "harness.h"
#include "program_fixture.h"

#include "kernels/cuda/ops_cuda.h"
#include "import/export.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TH = 4, STEPS = 24, MAX_WRITE = 5, V = OG_FIX_VOCAB };

typedef struct job {
    og_model *m;
    int id;
    int32_t out[2][STEPS];
    og_status st;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    og_session *s[2] = {0};
    j->st = OG_OK;
    for (int k = 0; k < 2 && j->st == OG_OK; k++) j->st = og_session_create(j->m, NULL, &s[k]);
    int32_t prompt[2][MAX_WRITE];
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < MAX_WRITE; t++) prompt[k][t] = (int32_t)((j->id * 7 + k * 13 + t * 5 + 1) % V);
    /* step 0 feeds a prompt of 2 + id % 4 (session 0) and MAX_WRITE
     * (session 1) tokens; every later step feeds the session's last token */
    const int32_t *in[2] = {prompt[0], prompt[1]};
    int64_t n[2] = {2 + j->id % 4, MAX_WRITE};
    for (int t = 0; t < STEPS && j->st == OG_OK; t++) {
        if (t % 2 == 0) {
            og_batch_item it[2] = {
                {.session = s[0], .tokens = in[0], .n_tokens = (int32_t)n[0], .output = OG_OUTPUT_ARGMAX},
                {.session = s[1], .tokens = in[1], .n_tokens = (int32_t)n[1], .output = OG_OUTPUT_ARGMAX},
            };
            j->st = og_model_step(j->m, it, 2);
            j->out[0][t] = it[0].token;
            j->out[1][t] = it[1].token;
        } else {
            for (int k = 0; k < 2 && j->st == OG_OK; k++)
                j->st = og_session_eval_next(s[k], in[k], n[k], 0, &j->out[k][t]);
        }
        for (int k = 0; k < 2; k++) in[k] = &j->out[k][t], n[k] = 1;
    }
    if (j->st == OG_OK)
        for (int k = 0; k < 2; k++)
            if (og_session_length(s[k]) != (k ? MAX_WRITE : 2 + j->id % 4) + STEPS - 1) j->st = OG_ERR_STATE;
    og_session_destroy(s[0]);
    og_session_destroy(s[1]);
    return NULL;
}

/* Runs the jobs of models m[i % n_models] single-threaded, then on TH
 * threads, and compares. */
static void compare(const char *what, og_model **m, int n_models) {
    static job seq[TH], par[TH];
    for (int i = 0; i < TH; i++) {
        seq[i] = (job){.m = m[i % n_models], .id = i};
        par[i] = seq[i];
        run_job(&seq[i]);
        CHECK_OK(seq[i].st);
    }
    pthread_t th[TH];
    for (int i = 0; i < TH; i++) CHECK(pthread_create(&th[i], NULL, run_job, &par[i]) == 0);
    for (int i = 0; i < TH; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < TH; i++) {
        CHECK_MSG(par[i].st == OG_OK, "%s thread %d: %s", what, i, og_status_str(par[i].st));
        CHECK_MSG(!memcmp(seq[i].out, par[i].out, sizeof seq[i].out),
                  "%s thread %d: tokens differ from the single-threaded run", what, i);
    }
    /* the tokens are not all one id (the check would then be weak) */
    bool varied = false;
    for (int t = 1; t < STEPS; t++) varied = varied || seq[0].out[0][t] != seq[0].out[0][0];
    CHECK_MSG(varied, "%s: thread 0 decodes a single token throughout", what);
}

int main(int argc, char **argv) {
    bool cuda = argc > 1 && !strcmp(argv[1], "cuda");
#ifdef OG_HAVE_CUDA
    const bool device = og_cuda_device_present();
#else
    const bool device = false;
#endif
    if (cuda && !device) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    char dir[] = "/tmp/og_test_threads_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    og_model_params mp = og_model_default_params();
    mp.backend = cuda ? OG_BACKEND_CUDA : OG_BACKEND_CPU;
    mp.n_threads = 2;
    char path[2][600];
    og_model *m[2] = {0}, *twin = NULL;
    /* the CPU runs the synthetic program (head dim 4) as f32 and bf16; the
     * CUDA kernels take head dims from 8, so there two of the Hugging Face
     * fixtures exported small (a flat and a sliding-window model) */
    const char *hf[2] = {"qwen3-mixed", "mistral-sw"};
    for (int p = 0; p < 2; p++) {
        snprintf(path[p], sizeof path[p], "%s/threads_%s.ogp", dir, cuda ? hf[p] : p ? "bf16" : "f32");
        if (cuda) {
            const char *src = getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR;
            char ckpt[512];
            snprintf(ckpt, sizeof ckpt, "%s/tests/data/hf/%s", src, hf[p]);
            og_export_options o;
            og_export_default_options(&o);
            o.max_write = MAX_WRITE;
            o.initial_capacity = 4;
            CHECK_OK(og_export_hf(ckpt, path[p], &o, NULL));
        } else {
            og_fixture_opts o = {.activation_dtype = p ? OG_DTYPE_BF16 : OG_DTYPE_F32, .initial_capacity = 4,
                                 .max_write = MAX_WRITE, .window = 3, .well_scaled = true};
            CHECK_OK(og_fixture_write_program(path[p], &o));
        }
        CHECK_OK(og_model_load(path[p], &mp, &m[p]));
    }
    CHECK_OK(og_model_load(path[0], &mp, &twin));
    if (m[0] && m[1] && twin) {
        og_test_section("4 threads x 2 sessions of one model");
        compare(cuda ? hf[0] : "f32 program", &m[0], 1);
        compare(cuda ? hf[1] : "bf16 program", &m[1], 1);
        og_test_section("4 threads over two models of one file");
        og_model *pair[2] = {m[0], twin};
        compare("two models", pair, 2);
    }
    og_model_destroy(m[0]);
    og_model_destroy(m[1]);
    og_model_destroy(twin);
    for (int p = 0; p < 2; p++) remove(path[p]);
    rmdir(dir);
    return og_test_finish();
}
