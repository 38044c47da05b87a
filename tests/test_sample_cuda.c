/* The device sampler (kernels/cuda/sample_cuda.h) against og_sampler_sample:
 * for random logits rows (V of 1, 7, 4096 and 151936; plain, with many ties
 * and signed zeros, with a few huge values and -inf) and a grid of
 * parameters (temperature 0, 0.7, 1, 2.5; top_k 1, 2, 40, 1024; top_p 0.5,
 * 0.9, 1; min_p 0, 0.05, 0.5; repetition penalty off or 1.3 over the last 6
 * tokens, whose history holds repeats, ids 0 and V-1 and ids outside the
 * vocabulary; some ids forbidden), the device's token must equal the host's,
 * over successive draws of two samplers created alike: one samples on the
 * host, the other only lends its state to the device (draw, recent tokens,
 * forbidden set) and is advanced with the device's token.
 * Also: the scratch marks are zero after every run, the host-side refusals,
 * and which parameters the device serves.
 * OG_CUDA_TEST_QUICK=1 (compute-sanitizer runs) samples fewer cases.
 * Skipped (77) without a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/sample_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "model/sample.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>

enum { RECENT_CAP = 6, DRAWS = 4 };

static og_rng rng;
static bool quick;

/* Device buffers for rows of up to V logits. */
typedef struct dev {
    float *logits;             /* [V] */
    unsigned char *block;      /* og_sample_cuda_step, then recent [RECENT_CAP] */
    uint32_t *forbidden, *marks; /* [W] */
    int32_t *token;            /* [1] */
    int64_t V;
} dev;

static dev dev_make(int64_t V) {
    dev d = {.V = V};
    const size_t words = (size_t)(V + 31) / 32;
    CK(cudaMalloc((void **)&d.logits, (size_t)V * sizeof(float)));
    CK(cudaMalloc((void **)&d.block, sizeof(og_sample_cuda_step) + RECENT_CAP * sizeof(int32_t)));
    CK(cudaMalloc((void **)&d.forbidden, words * sizeof(uint32_t)));
    CK(cudaMalloc((void **)&d.marks, words * sizeof(uint32_t)));
    CK(cudaMemset(d.marks, 0, words * sizeof(uint32_t)));
    CK(cudaMalloc((void **)&d.token, sizeof(int32_t)));
    return d;
}

static void dev_free(dev *d) {
    CK(cudaFree(d->logits));
    CK(cudaFree(d->block));
    CK(cudaFree(d->forbidden));
    CK(cudaFree(d->marks));
    CK(cudaFree(d->token));
}

/* One draw on the device from the state of s (which is then advanced with
 * the token, as the executor does); the logits are already uploaded. */
static int32_t device_draw(dev *d, og_sampler *s) {
    const og_sampler_params *p = og_sampler_get_params(s);
    unsigned char host[sizeof(og_sample_cuda_step) + RECENT_CAP * sizeof(int32_t)];
    const int32_t *recent;
    const int32_t n_recent = p->repeat_penalty != 1.0f ? og_sampler_recent(s, &recent) : 0;
    const uint32_t *forbidden = og_sampler_forbidden(s);
    og_sample_cuda_step step = {.uniform = og_sampler_peek_uniform(s), .temperature = p->temperature,
                                .top_p = p->top_p, .min_p = p->min_p, .repeat_penalty = p->repeat_penalty,
                                .top_k = p->top_k, .n_recent = n_recent, .use_forbidden = forbidden != NULL};
    memcpy(host, &step, sizeof step);
    if (n_recent) memcpy(host + sizeof step, recent, (size_t)n_recent * sizeof(int32_t));
    CK(cudaMemcpy(d->block, host, sizeof host, cudaMemcpyHostToDevice));
    if (forbidden)
        CK(cudaMemcpy(d->forbidden, forbidden, (size_t)(d->V + 31) / 32 * sizeof(uint32_t), cudaMemcpyHostToDevice));
    const int32_t poison = -7;
    CK(cudaMemcpy(d->token, &poison, sizeof poison, cudaMemcpyHostToDevice));
    CHECK_OK(og_sample_cuda(NULL, d->logits, d->V, (const og_sample_cuda_step *)(void *)d->block,
                            (const int32_t *)(void *)(d->block + sizeof step), d->forbidden, d->marks, d->token));
    int32_t tok = -1;
    CK(cudaMemcpy(&tok, d->token, sizeof tok, cudaMemcpyDeviceToHost));
    if (tok >= 0 && tok < d->V) og_sampler_commit(s, tok);
    return tok;
}

enum { ROW_PLAIN, ROW_TIES, ROW_HUGE, ROW_KINDS };
static const char *const row_names[] = {"plain", "ties", "huge"};

static void fill_row(float *x, int64_t V, int kind) {
    og_rng_fill(&rng, x, (size_t)V, -6, 6);
    if (kind == ROW_TIES) /* a few levels: long runs of equal logits, +0 and -0 among them */
        for (int64_t i = 0; i < V; i++) {
            x[i] = (float)((int)(x[i] * 0.5f)) * 0.75f;
            if (x[i] == 0 && (og_rng_next(&rng) & 1)) x[i] = -0.0f;
        }
    if (kind == ROW_HUGE) {
        const float huge[] = {3e38f, -3e38f, 1e30f, -1e30f, 1e20f, -INFINITY, 3e38f};
        for (size_t j = 0; j < sizeof huge / sizeof huge[0]; j++) x[og_rng_next(&rng) % (uint64_t)V] = huge[j];
    }
}

static int64_t cases, mismatches;

static void check_params(dev *d, const float *row, const og_sampler_params *p, bool forbid, const char *what) {
    const int64_t V = d->V;
    og_sampler *host = NULL, *mirror = NULL;
    CHECK_OK(og_sampler_create(p, V, &host));
    CHECK_OK(og_sampler_create(p, V, &mirror));
    if (!host || !mirror) goto done;
    /* history: repeats, both ends of the vocabulary, ids outside it */
    const int32_t history[] = {0, (int32_t)(V - 1), 3 % (int32_t)V, 3 % (int32_t)V, -1, (int32_t)V, (int32_t)(V / 2)};
    for (size_t j = 0; j < sizeof history / sizeof history[0]; j++) {
        og_sampler_accept(host, history[j]);
        og_sampler_accept(mirror, history[j]);
    }
    if (forbid && V > 1) { /* the row's arg-max and id 1 */
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++) best = row[i] > row[best] ? i : best;
        CHECK_OK(og_sampler_forbid(host, (int32_t)best));
        CHECK_OK(og_sampler_forbid(mirror, (int32_t)best));
        CHECK_OK(og_sampler_forbid(host, 1));
        CHECK_OK(og_sampler_forbid(mirror, 1));
    }
    for (int k = 0; k < DRAWS; k++) {
        const int32_t want = og_sampler_sample(host, row);
        const int32_t got = device_draw(d, mirror);
        cases++;
        if (got != want && mismatches++ < 10)
            fprintf(stderr,
                    "%s V %lld draw %d: device %d, host %d (temperature %g top_k %d top_p %g min_p %g penalty %g%s)\n",
                    what, (long long)V, k, got, want, (double)p->temperature, p->top_k, (double)p->top_p,
                    (double)p->min_p, (double)p->repeat_penalty, forbid ? ", forbidden ids" : "");
        if (got != want) break; /* the two samplers' histories part here */
    }
done:
    og_sampler_destroy(host);
    og_sampler_destroy(mirror);
}

static void test_grid(int64_t V) {
    char name[64];
    snprintf(name, sizeof name, "V = %lld", (long long)V);
    og_test_section(name);
    const float temps[] = {0, 0.7f, 1, 2.5f}, top_ps[] = {0.5f, 0.9f, 1}, min_ps[] = {0, 0.05f, 0.5f};
    const float penalties[] = {1, 1.3f};
    const int32_t top_ks[] = {1, 2, 40, 1024};
    /* every combination for small rows; a random share for the large ones */
    const uint64_t keep_in = V > 10000 ? (quick ? 144 : 8) : V > 100 ? (quick ? 48 : 1) : quick ? 12 : 1;
    dev d = dev_make(V);
    float *row = malloc((size_t)V * sizeof *row);
    const int64_t before = mismatches;
    for (int kind = 0; kind < ROW_KINDS; kind++) {
        fill_row(row, V, kind);
        CK(cudaMemcpy(d.logits, row, (size_t)V * sizeof(float), cudaMemcpyHostToDevice));
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 3; c++)
                    for (int e = 0; e < 3; e++)
                        for (int f = 0; f < 2; f++) {
                            if (og_rng_next(&rng) % keep_in) continue;
                            og_sampler_params p = og_sampler_default_params();
                            p.temperature = temps[a];
                            p.top_k = top_ks[b];
                            p.top_p = top_ps[c];
                            p.min_p = min_ps[e];
                            p.repeat_penalty = penalties[f];
                            p.repeat_last_n = RECENT_CAP;
                            p.seed = og_rng_next(&rng);
                            check_params(&d, row, &p, (a + b + c + e + f) % 3 == 0, row_names[kind]);
                        }
    }
    /* greedy needs no top-k: every id is a candidate */
    og_sampler_params p = og_sampler_default_params();
    p.temperature = 0;
    p.top_k = 0;
    fill_row(row, V, ROW_TIES);
    CK(cudaMemcpy(d.logits, row, (size_t)V * sizeof(float), cudaMemcpyHostToDevice));
    check_params(&d, row, &p, true, "greedy, top_k 0");
    CHECK_MSG(mismatches == before, "%s: %lld of %lld cases differ", name, (long long)(mismatches - before),
              (long long)cases);
    /* the kernel leaves its scratch as it found it */
    const size_t words = (size_t)(V + 31) / 32;
    uint32_t *marks = malloc(words * sizeof *marks);
    CK(cudaMemcpy(marks, d.marks, words * sizeof *marks, cudaMemcpyDeviceToHost));
    size_t dirty = 0;
    for (size_t w = 0; w < words; w++) dirty += marks[w] != 0;
    CHECK_MSG(dirty == 0, "%s: %zu scratch words left non-zero", name, dirty);
    free(marks);
    free(row);
    dev_free(&d);
}

static void test_limits(void) {
    og_test_section("what the device serves, and refusals");
    CHECK(og_sample_cuda_supported(0, 0, 151936));        /* greedy: any top_k */
    CHECK(og_sample_cuda_supported(0.8f, 1024, 151936));
    CHECK(!og_sample_cuda_supported(0.8f, 1025, 151936));
    CHECK(!og_sample_cuda_supported(0.8f, 0, 4096));      /* all of 4096 */
    CHECK(og_sample_cuda_supported(0.8f, 0, 1024));       /* all of 1024 */
    CHECK(og_sample_cuda_supported(0.8f, 5000, 7));       /* k = V = 7 */
    dev d = dev_make(4096);
    const og_sample_cuda_step *step = (const og_sample_cuda_step *)(void *)d.block;
    const int32_t *recent = (const int32_t *)(void *)(d.block + sizeof *step);
    CHECK_STATUS(og_sample_cuda(NULL, NULL, 4096, step, recent, d.forbidden, d.marks, d.token),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_cuda(NULL, d.logits, 0, step, recent, d.forbidden, d.marks, d.token),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_cuda(NULL, d.logits, 4096, step, recent, d.forbidden, NULL, d.token),
                 OG_ERR_INVALID_ARGUMENT);
    /* more candidates than the device keeps: -1, never a token */
    og_sample_cuda_step big = {.uniform = 0.5, .temperature = 1, .top_p = 1, .repeat_penalty = 1, .top_k = 0};
    float *row = malloc(4096 * sizeof *row);
    fill_row(row, 4096, ROW_PLAIN);
    CK(cudaMemcpy(d.logits, row, sizeof(float) * 4096, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.block, &big, sizeof big, cudaMemcpyHostToDevice));
    CHECK_OK(og_sample_cuda(NULL, d.logits, 4096, step, recent, d.forbidden, d.marks, d.token));
    int32_t tok = 0;
    CK(cudaMemcpy(&tok, d.token, sizeof tok, cudaMemcpyDeviceToHost));
    CHECK_MSG(tok == -1, "top_k 0 over 4096: token %d, want -1", tok);
    free(row);
    dev_free(&d);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    quick = getenv("OG_CUDA_TEST_QUICK") != NULL;
    rng = og_rng_seed(2024);
    const int64_t Vs[] = {1, 7, 4096, 151936};
    for (size_t i = 0; i < sizeof Vs / sizeof Vs[0]; i++) test_grid(Vs[i]);
    test_limits();
    fprintf(stderr, "%lld cases, %lld differ\n", (long long)cases, (long long)mismatches);
    return og_test_finish();
}
#endif
