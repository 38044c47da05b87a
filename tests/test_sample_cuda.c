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
 *
 * The batched sampler (og_sample_batch_cuda): for B of 1, 3, 17 and 64 rows
 * (V from 7 to 151936), one CUDA graph per B is captured once (the table's
 * upload from pinned memory, the launch, the tokens' copy back) and replayed
 * over several steps; before each replay the host rewrites the table's
 * contents, the logits and the buffers the rows point to (the recent ids
 * alternate between two buffers, so the addresses change too). Every row is
 * a session of its own that lasts a few steps and asks for nothing, the
 * arg-max, or a draw of its own sampler (greedy; temperatures 0.7 to 2.5
 * with top-k 1, 2, 40, 1024, all of V; top-p; min-p; a repetition penalty
 * of 1.3 or 0.7 over 6 or 64 recent tokens; forbidden ids that grow every
 * step), over rows plain, with ties and signed zeros, with huge values and
 * +-inf, or with NaNs (arg-max and greedy rows only: sampling has no order
 * for them). Each token must equal og_argmax_ref's (arg-max rows), -1 (rows
 * asking for nothing, and draws over more candidates than the device keeps,
 * which the host then samples), or og_sampler_sample's over the row, with
 * the device's sampler advanced by the device's token as the executor does.
 * Every row's marks scratch must be zero after every replay. Also the
 * batch's refusals and its rows refused for a missing buffer.
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
#include "kernels/ops.h"
#include "exec/sample.h"

#include "cuda_check.h"
#include <stddef.h>
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

/* ROW_INF and ROW_NAN only in the batch tests. */
enum { ROW_PLAIN, ROW_TIES, ROW_HUGE, ROW_KINDS, ROW_INF = ROW_KINDS, ROW_NAN, ROW_ALL_KINDS };
static const char *const row_names[] = {"plain", "ties", "huge", "inf", "nan"};

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
    if (kind == ROW_INF) { /* +inf once or twice (a tie at the top), -inf a few times */
        const int n_pos = 1 + (int)(og_rng_next(&rng) % 2);
        for (int j = 0; j < 3; j++) x[og_rng_next(&rng) % (uint64_t)V] = -INFINITY;
        for (int j = 0; j < n_pos; j++) x[og_rng_next(&rng) % (uint64_t)V] = INFINITY;
    }
    if (kind == ROW_NAN) { /* some NaNs of both signs; one at id 0 a third of the time; now and then all */
        const uint64_t r = og_rng_next(&rng);
        if (r % 8 == 0) {
            for (int64_t i = 0; i < V; i++) x[i] = NAN;
        } else {
            for (int j = 0; j < 4; j++) x[og_rng_next(&rng) % (uint64_t)V] = j & 1 ? -NAN : NAN;
            if (r % 3 == 0) x[0] = NAN;
        }
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

/* ---- the batched sampler ---- */

enum { BATCH_RECENT_CAP = 64 };

/* One row's session in the batch tests. */
typedef struct bsession {
    int mode;                   /* OG_SAMPLE_ROW_* */
    int kind;                   /* ROW_* of its logits */
    int steps_left;             /* steps before it leaves */
    bool forbid;                /* forbids its row's arg-max every step */
    og_sampler *host, *mirror;  /* SAMPLE: the reference, and the one the device draws for */
} bsession;

static void bsession_end(bsession *x) {
    og_sampler_destroy(x->host);
    og_sampler_destroy(x->mirror);
    *x = (bsession){0};
}

/* The SAMPLE rows' parameters: greedy; temperature with top-k 1, 2, 40,
 * 1024 and all of V; top-p; min-p. */
static const struct {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
} sample_sets[] = {
    {0, 0, 1, 0},          {0, 40, 0.9f, 0.05f},   {0.7f, 1, 1, 0},       {1, 40, 0.95f, 0.05f},
    {0.8f, 40, 1, 0},      {1.3f, 1024, 1, 0},     {1, 1024, 0.9f, 0},    {2.5f, 1024, 0.5f, 0.05f},
    {1, 2, 1, 0.5f},       {0.7f, 0, 0.9f, 0},     {1, 5000, 1, 0.05f},   {1, 40, 1, 0.5f},
};
enum { N_SAMPLE_SETS = sizeof sample_sets / sizeof sample_sets[0] };

/* A new session for a row of V logits. */
static void bsession_start(bsession *x, int64_t V) {
    *x = (bsession){0};
    const uint64_t r = og_rng_next(&rng);
    x->steps_left = 1 + (int)(og_rng_next(&rng) % 4);
    x->mode = r % 10 == 0 ? OG_SAMPLE_ROW_NONE : r % 10 < 3 ? OG_SAMPLE_ROW_ARGMAX : OG_SAMPLE_ROW_SAMPLE;
    if (x->mode != OG_SAMPLE_ROW_SAMPLE) {
        x->kind = (int)(og_rng_next(&rng) % ROW_ALL_KINDS);
        return;
    }
    og_sampler_params p = og_sampler_default_params();
    const int set = (int)(og_rng_next(&rng) % N_SAMPLE_SETS);
    p.temperature = sample_sets[set].temperature;
    p.top_k = sample_sets[set].top_k;
    p.top_p = sample_sets[set].top_p;
    p.min_p = sample_sets[set].min_p;
    const uint64_t pen = og_rng_next(&rng) % 4;
    p.repeat_penalty = pen == 0 ? 1.3f : pen == 1 ? 0.7f : 1.0f;
    p.repeat_last_n = og_rng_next(&rng) % 2 ? 6 : BATCH_RECENT_CAP;
    p.seed = og_rng_next(&rng);
    x->forbid = og_rng_next(&rng) % 3 == 0;
    /* NaNs only where the order is defined: greedy */
    x->kind = (int)(og_rng_next(&rng) % (p.temperature <= 0 ? ROW_ALL_KINDS : ROW_NAN));
    CHECK_OK(og_sampler_create(&p, V, &x->host));
    CHECK_OK(og_sampler_create(&p, V, &x->mirror));
    if (!x->host || !x->mirror) {
        bsession_end(x);
        return;
    }
    /* history: repeats, both ends of the vocabulary, ids outside it */
    const int32_t history[] = {0, (int32_t)(V - 1), 3 % (int32_t)V, 3 % (int32_t)V, -1, (int32_t)V, (int32_t)(V / 2),
                               (int32_t)(og_rng_next(&rng) % (uint64_t)V)};
    for (size_t j = 0; j < sizeof history / sizeof history[0]; j++) {
        og_sampler_accept(x->host, history[j]);
        og_sampler_accept(x->mirror, history[j]);
    }
    if (x->forbid && V > 1) {
        CHECK_OK(og_sampler_forbid(x->host, 1));
        CHECK_OK(og_sampler_forbid(x->mirror, 1));
    }
}

/* Device and pinned buffers for batches of B rows of V logits. */
typedef struct bdev {
    int32_t B;
    int64_t V, W;
    float *logits;              /* [B, V] */
    og_sample_cuda_row *rows;   /* [B] the table */
    og_sample_cuda_row *rows_host; /* [B] pinned, uploaded by the graph */
    int32_t *tokens, *tokens_host; /* [B] device, pinned */
    uint32_t *marks;            /* [B, W] zero between steps */
    uint32_t *forbidden;        /* [B, W] */
    int32_t *recent[2];         /* [B, BATCH_RECENT_CAP] each; steps alternate */
} bdev;

static bdev bdev_make(int32_t B, int64_t V) {
    bdev d = {.B = B, .V = V, .W = (V + 31) / 32};
    CK(cudaMalloc((void **)&d.logits, (size_t)B * (size_t)V * sizeof(float)));
    CK(cudaMalloc((void **)&d.rows, (size_t)B * sizeof *d.rows));
    CK(cudaMallocHost((void **)&d.rows_host, (size_t)B * sizeof *d.rows_host));
    CK(cudaMalloc((void **)&d.tokens, (size_t)B * sizeof(int32_t)));
    CK(cudaMallocHost((void **)&d.tokens_host, (size_t)B * sizeof(int32_t)));
    CK(cudaMalloc((void **)&d.marks, (size_t)B * og_sample_cuda_marks_bytes(V)));
    CK(cudaMemset(d.marks, 0, (size_t)B * og_sample_cuda_marks_bytes(V)));
    CK(cudaMalloc((void **)&d.forbidden, (size_t)B * og_sample_cuda_marks_bytes(V)));
    for (int i = 0; i < 2; i++) CK(cudaMalloc((void **)&d.recent[i], (size_t)B * BATCH_RECENT_CAP * sizeof(int32_t)));
    return d;
}

static void bdev_free(bdev *d) {
    CK(cudaFree(d->logits));
    CK(cudaFree(d->rows));
    CK(cudaFreeHost(d->rows_host));
    CK(cudaFree(d->tokens));
    CK(cudaFreeHost(d->tokens_host));
    CK(cudaFree(d->marks));
    CK(cudaFree(d->forbidden));
    for (int i = 0; i < 2; i++) CK(cudaFree(d->recent[i]));
}

/* Fills row b's descriptor for session x at step `step` (uploading its
 * recent ids and forbidden bitmap); *want_minus1 tells a row the device must
 * refuse (-1). Rows asking for nothing or the arg-max get a step and buffers
 * that a sampling row would refuse, so reading them would show. */
static void fill_descriptor(bdev *d, int32_t b, const bsession *x, int step, bool *want_minus1) {
    og_sample_cuda_row *row = &d->rows_host[b];
    *want_minus1 = x->mode == OG_SAMPLE_ROW_NONE;
    if (x->mode != OG_SAMPLE_ROW_SAMPLE) {
        *row = (og_sample_cuda_row){.mode = x->mode,
                                    .step = {.uniform = 0.5, .temperature = 1, .top_p = 1, .repeat_penalty = 1.3f,
                                             .top_k = 40, .n_recent = 5, .use_forbidden = 1}};
        return;
    }
    const og_sampler_params *p = og_sampler_get_params(x->mirror);
    const int32_t *recent;
    const int32_t n_recent = p->repeat_penalty != 1.0f ? og_sampler_recent(x->mirror, &recent) : 0;
    const uint32_t *forbidden = og_sampler_forbidden(x->mirror);
    *row = (og_sample_cuda_row){
        .mode = OG_SAMPLE_ROW_SAMPLE,
        .step = {.uniform = og_sampler_peek_uniform(x->mirror), .temperature = p->temperature, .top_p = p->top_p,
                 .min_p = p->min_p, .repeat_penalty = p->repeat_penalty, .top_k = p->top_k, .n_recent = n_recent,
                 .use_forbidden = forbidden != NULL}};
    /* buffers the row does not need stay NULL half of the time */
    const bool lend_all = og_rng_next(&rng) & 1;
    if (n_recent > 0 || lend_all) {
        int32_t *dst = d->recent[step & 1] + (size_t)b * BATCH_RECENT_CAP;
        if (n_recent > 0) CK(cudaMemcpy(dst, recent, (size_t)n_recent * sizeof(int32_t), cudaMemcpyHostToDevice));
        row->recent = dst;
        row->marks = d->marks + (size_t)b * (size_t)d->W;
    }
    if (forbidden || lend_all) {
        uint32_t *dst = d->forbidden + (size_t)b * (size_t)d->W;
        if (forbidden) CK(cudaMemcpy(dst, forbidden, (size_t)d->W * sizeof(uint32_t), cudaMemcpyHostToDevice));
        row->forbidden = dst;
    }
    *want_minus1 = !og_sample_cuda_supported(p->temperature, p->top_k, d->V);
}

static int64_t batch_cases, batch_mismatches;

static void test_batch(int32_t B, int64_t V, int steps) {
    char name[96];
    snprintf(name, sizeof name, "batch: B = %d, V = %lld, %d replays of one graph", (int)B, (long long)V, steps);
    og_test_section(name);
    bdev d = bdev_make(B, V);
    bsession *ses = calloc((size_t)B, sizeof *ses);
    float *logits = malloc((size_t)B * (size_t)V * sizeof *logits);
    bool *want_minus1 = calloc((size_t)B, sizeof *want_minus1);
    uint32_t *marks = malloc((size_t)B * og_sample_cuda_marks_bytes(V));
    if (!ses || !logits || !want_minus1 || !marks) {
        CHECK_MSG(false, "out of host memory");
        goto done;
    }
    /* one graph for every step: table upload, the sampler, the tokens back;
     * a blocking stream, so the replay waits for the uploads and the poison
     * written on the default stream */
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemcpyAsync(d.rows, d.rows_host, (size_t)B * sizeof *d.rows, cudaMemcpyHostToDevice, stream));
    CHECK_OK(og_sample_batch_cuda(stream, d.logits, V, B, d.rows, d.tokens));
    CK(cudaMemcpyAsync(d.tokens_host, d.tokens, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const int64_t before = batch_mismatches;
    int counts[3] = {0, 0, 0};
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++) CK(cudaEventCreate(&ev[i]));
    float fastest = INFINITY; /* ms of one replay */
    for (int step = 0; step < steps; step++) {
        for (int32_t b = 0; b < B; b++) {
            bsession *x = &ses[b];
            if (x->steps_left <= 0) {
                bsession_end(x);
                bsession_start(x, V);
            }
            x->steps_left--;
            float *row = logits + (size_t)b * (size_t)V;
            fill_row(row, V, x->kind);
            if (x->mode == OG_SAMPLE_ROW_SAMPLE && x->forbid) { /* this step's arg-max joins the forbidden */
                int64_t best = 0;
                for (int64_t i = 1; i < V; i++) best = row[i] > row[best] ? i : best;
                CHECK_OK(og_sampler_forbid(x->host, (int32_t)best));
                CHECK_OK(og_sampler_forbid(x->mirror, (int32_t)best));
            }
            fill_descriptor(&d, b, x, step, &want_minus1[b]);
            counts[x->mode]++;
        }
        CK(cudaMemcpy(d.logits, logits, (size_t)B * (size_t)V * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemset(d.tokens, 0x7f, (size_t)B * sizeof(int32_t))); /* poison */
        CK(cudaEventRecord(ev[0], stream));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaEventRecord(ev[1], stream));
        CK(cudaStreamSynchronize(stream));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        fastest = ms < fastest ? ms : fastest;
        for (int32_t b = 0; b < B; b++) {
            bsession *x = &ses[b];
            const float *row = logits + (size_t)b * (size_t)V;
            const int32_t got = d.tokens_host[b];
            int32_t want = -1;
            if (x->mode == OG_SAMPLE_ROW_ARGMAX) {
                int64_t best = -1;
                CHECK_OK(og_argmax_ref(row, V, &best));
                want = (int32_t)best;
            } else if (x->mode == OG_SAMPLE_ROW_SAMPLE && !want_minus1[b]) {
                want = og_sampler_sample(x->host, row);
            }
            batch_cases++;
            if (got != want) {
                const og_sample_cuda_step *st = &d.rows_host[b].step;
                if (batch_mismatches++ < 10)
                    fprintf(stderr,
                            "B %d V %lld step %d row %d (mode %d, %s logits): device %d, want %d (temperature %g "
                            "top_k %d top_p %g min_p %g penalty %g, %d recent%s)\n",
                            (int)B, (long long)V, step, (int)b, x->mode, row_names[x->kind], got, want,
                            (double)st->temperature, st->top_k, (double)st->top_p, (double)st->min_p,
                            (double)st->repeat_penalty, st->n_recent, st->use_forbidden ? ", forbidden ids" : "");
                x->steps_left = 0; /* the two samplers' histories part here: a new session */
                continue;
            }
            if (x->mode != OG_SAMPLE_ROW_SAMPLE) continue;
            if (want_minus1[b]) { /* the executor samples these on the host */
                const int32_t a = og_sampler_sample(x->host, row), m = og_sampler_sample(x->mirror, row);
                CHECK(a == m);
            } else {
                og_sampler_commit(x->mirror, got);
            }
        }
        /* every row's scratch is zero again */
        CK(cudaMemcpy(marks, d.marks, (size_t)B * og_sample_cuda_marks_bytes(V), cudaMemcpyDeviceToHost));
        size_t dirty = 0;
        for (size_t w = 0; w < (size_t)B * (size_t)d.W; w++) dirty += marks[w] != 0;
        CHECK_MSG(dirty == 0, "%s, step %d: %zu scratch words left non-zero", name, step, dirty);
    }
    CHECK_MSG(batch_mismatches == before, "%s: %lld rows differ", name, (long long)(batch_mismatches - before));
    fprintf(stderr, "  rows: %d none, %d arg-max, %d sampled; fastest replay %.3f ms\n", counts[0], counts[1],
            counts[2], (double)fastest);
    for (int i = 0; i < 2; i++) CK(cudaEventDestroy(ev[i]));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(stream));
done:
    for (int32_t b = 0; ses && b < B; b++) bsession_end(&ses[b]);
    free(ses);
    free(logits);
    free(want_minus1);
    free(marks);
    bdev_free(&d);
}

static void test_batch_refusals(void) {
    og_test_section("batch: refusals, rows missing a buffer");
    CHECK(sizeof(og_sample_cuda_row) == 72 && offsetof(og_sample_cuda_row, step) == 8 &&
          offsetof(og_sample_cuda_row, recent) == 48 && offsetof(og_sample_cuda_row, forbidden) == 56 &&
          offsetof(og_sample_cuda_row, marks) == 64);
    CHECK(og_sample_cuda_marks_bytes(151936) == 4748 * sizeof(uint32_t));
    CHECK(og_sample_cuda_marks_bytes(32) == sizeof(uint32_t) && og_sample_cuda_marks_bytes(33) == 2 * sizeof(uint32_t));
    CHECK(og_sample_cuda_marks_bytes(0) == 0);
    enum { B = 6 };
    const int64_t V = 4096;
    bdev d = bdev_make(B, V);
    CHECK_STATUS(og_sample_batch_cuda(NULL, NULL, V, B, d.rows, d.tokens), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_batch_cuda(NULL, d.logits, V, B, NULL, d.tokens), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_batch_cuda(NULL, d.logits, V, B, d.rows, NULL), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_batch_cuda(NULL, d.logits, 0, B, d.rows, d.tokens), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_batch_cuda(NULL, d.logits, (int64_t)INT32_MAX + 1, B, d.rows, d.tokens),
                 OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sample_batch_cuda(NULL, d.logits, V, 0, d.rows, d.tokens), OG_ERR_INVALID_ARGUMENT);
    float *logits = malloc((size_t)B * V * sizeof *logits);
    fill_row(logits, B * V, ROW_PLAIN);
    CK(cudaMemcpy(d.logits, logits, (size_t)B * V * sizeof(float), cudaMemcpyHostToDevice));
    const og_sample_cuda_step pen = {.uniform = 0.25, .temperature = 1, .top_p = 1, .repeat_penalty = 1.3f,
                                     .top_k = 40, .n_recent = 3};
    og_sample_cuda_step forb = pen;
    forb.repeat_penalty = 1, forb.use_forbidden = 1;
    uint32_t *marks = d.marks, *forbidden = d.forbidden;
    const int32_t *recent = d.recent[0];
    CK(cudaMemset(d.recent[0], 0, BATCH_RECENT_CAP * sizeof(int32_t)));
    CK(cudaMemset(d.forbidden, 0, og_sample_cuda_marks_bytes(V)));
    /* row 4 draws as this sampler (an empty bitmap forbids nothing) */
    og_sampler_params p = og_sampler_default_params();
    p.temperature = 1, p.top_k = 40, p.top_p = 1, p.min_p = 0, p.repeat_penalty = 1;
    og_sampler *s = NULL;
    CHECK_OK(og_sampler_create(&p, V, &s));
    og_sample_cuda_step own = forb;
    own.uniform = s ? og_sampler_peek_uniform(s) : 0.5;
    d.rows_host[0] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_SAMPLE, .step = pen, .marks = marks};  /* no recent */
    d.rows_host[1] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_SAMPLE, .step = pen, .recent = recent}; /* no marks */
    d.rows_host[2] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_SAMPLE, .step = forb};                  /* no bitmap */
    d.rows_host[3] = (og_sample_cuda_row){.mode = 7};                                                    /* unknown */
    d.rows_host[4] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_SAMPLE, .step = own, .forbidden = forbidden};
    d.rows_host[5] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_ARGMAX};
    CK(cudaMemcpy(d.rows, d.rows_host, B * sizeof *d.rows, cudaMemcpyHostToDevice));
    CK(cudaMemset(d.tokens, 0x7f, B * sizeof(int32_t)));
    CHECK_OK(og_sample_batch_cuda(NULL, d.logits, V, B, d.rows, d.tokens));
    int32_t tok[B];
    CK(cudaMemcpy(tok, d.tokens, sizeof tok, cudaMemcpyDeviceToHost));
    for (int b = 0; b < 4; b++) CHECK_MSG(tok[b] == -1, "row %d: token %d, want -1", b, tok[b]);
    /* the rows beside them are served */
    if (s) {
        const int32_t want = og_sampler_sample(s, logits + 4 * V);
        CHECK_MSG(tok[4] == want, "row 4: token %d, want %d", tok[4], want);
    }
    og_sampler_destroy(s);
    int64_t best = -1;
    CHECK_OK(og_argmax_ref(logits + 5 * V, V, &best));
    CHECK_MSG(tok[5] == best, "row 5: token %d, want %lld", tok[5], (long long)best);
    free(logits);
    bdev_free(&d);
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
    test_batch_refusals();
    if (quick) {
        test_batch(1, 1031, 2);
        test_batch(3, 7, 3);
        test_batch(17, 1031, 2);
    } else {
        const struct {
            int32_t B;
            int64_t V;
            int steps;
        } runs[] = {{1, 151936, 8}, {3, 7, 16}, {3, 4099, 12}, {17, 1031, 12},
                    {17, 151936, 6}, {64, 4096, 8}, {64, 151936, 4}};
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) test_batch(runs[i].B, runs[i].V, runs[i].steps);
    }
    fprintf(stderr, "batch: %lld rows, %lld differ\n", (long long)batch_cases, (long long)batch_mismatches);
    return og_test_finish();
}
#endif
