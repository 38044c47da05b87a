/* Allowed-token masks on batch items (og_batch_item.allowed, a grammar's
 * mask) on the CPU back end; tests/test_mask_cuda.c runs the same checks on
 * the CUDA back end (the masks applied on the device, inside the decode
 * graphs), plus the masking kernel against its C reference.
 *
 * The model is the llama-gqa Hugging Face fixture (tests/data/hf, 448
 * tokens), exported here. Six sessions with different prompts and outputs:
 * ARGMAX under a mask that allows one token, ARGMAX with no mask, SAMPLE
 * (top-k 40) under a mask of about half the tokens, SAMPLE over every token
 * with a repetition penalty under a sparse mask, SAMPLE with a logit bias
 * (the host's sampler on CUDA) under a dense mask, and LOGITS under a mask.
 * Every step draws new masks (and now and then one that allows everything),
 * so the masks change between the steps of one captured graph. Step 0 feeds
 * each session's prompt (2 to 6 tokens, the masked output at its last row),
 * the next STEPS steps decode one token each; every set below is fed the
 * batch's tokens, so the sets stay at the same history.
 *
 * The oracle is computed here from logits the model returns unmasked (an
 * oracle twin stepped with a LOGITS output and no mask): the disallowed
 * logits set to -inf by a loop in this file, then the first maximum
 * (ARGMAX), og_sampler_sample with a sampler of the same parameters and
 * seed (SAMPLE), or the masked row itself (LOGITS). Checked:
 *   1. the batch of six masked items gives the oracle's tokens, and LOGITS
 *      gets the oracle's masked row, bit for bit (oracle twins stepped in a
 *      batch of the same six rows);
 *   2. each session stepped alone with its mask gives its own oracle's
 *      (twins stepped alone), and the batch gives what each session alone
 *      gives: on the CPU bit for bit always (a batch computes each row as
 *      the row alone); on CUDA wherever the batch's unmasked logits and
 *      the session's alone are the same bits (products of a batch may sum
 *      in another order than one row's), and elsewhere within
 *      test_exec_cuda's batch tolerance (1e-3 + 1e-3 |x|, f32 KV);
 *   3. no drawn token is ever one its mask forbids;
 *   4. CUDA: decode replays the graphs captured at the first decode step,
 *      and masks that change between steps add no capture (og_model_metrics);
 *   5. a mask with an output that draws nothing (NONE, LOGITS_ALL) is
 *      refused, naming the item, and nothing steps.
 * The CPU runs it twice: the model whole, and cut into 2 shards (tensor
 * parallel), whose back end delivers the outputs through the same code.
 * Data are found under $OG_SOURCE_DIR when set, else where the build saw
 * them. */
#include "harness.h"

#include "exec/sample.h"
#include "import/export.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef OG_MASK_TEST_CUDA
#ifdef OG_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/sample_cuda.h"
#include "cuda_check.h"
#define MASK_BACKEND OG_BACKEND_CUDA
#define MASK_BACKEND_NAME "cuda"
#endif
#else
#define MASK_BACKEND OG_BACKEND_CPU
#define MASK_BACKEND_NAME "cpu"
#endif

#ifndef MASK_BACKEND
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else

enum { K = 6, STEPS = 12, N_IDS = 64, MAX_WRITE = 8 };
#define NSETS 4 /* the batch under test, its oracle twins (a batch), alone, their oracle twins (alone) */
enum { SET_BATCH = 0, SET_BATCH_ORACLE, SET_ALONE, SET_ALONE_ORACLE };

typedef struct kind {
    og_step_output out;
    int density;        /* percent of the tokens allowed; 0: one token; -1: no mask */
    float temperature;
    int32_t top_k;
    float repeat_penalty;
    bool bias;          /* a logit bias: on CUDA the host draws */
} kind;

static const kind k_kinds[K] = {
    {OG_OUTPUT_ARGMAX, 0, 0, 0, 1.0f, false},
    {OG_OUTPUT_ARGMAX, -1, 0, 0, 1.0f, false},
    {OG_OUTPUT_SAMPLE, 50, 0.9f, 40, 1.0f, false},
    {OG_OUTPUT_SAMPLE, 10, 1.0f, 0, 1.3f, false},
    {OG_OUTPUT_SAMPLE, 80, 0.8f, 20, 1.0f, true},
    {OG_OUTPUT_LOGITS, 30, 0, 0, 1.0f, false},
};

static int64_t g_V, g_W;

static bool allowed_bit(const uint32_t *mask, int64_t i) { return !mask || (mask[i >> 5] >> (i & 31) & 1u); }

/* Session i's mask at step t (NULL: none); about density % of the bits,
 * always at least one; every fifth step of a masked kind allows everything. */
static void make_mask(int i, int t, uint32_t *mask) {
    og_rng r = og_rng_seed(1000003u * (uint64_t)(i + 1) + 7919u * (uint64_t)(t + 1));
    const int d = k_kinds[i].density;
    memset(mask, 0, (size_t)g_W * sizeof *mask);
    if (t % 5 == 4) {
        for (int64_t w = 0; w < g_W; w++) mask[w] = 0xFFFFFFFFu;
        return;
    }
    for (int64_t v = 0; d > 0 && v < g_V; v++)
        if ((int)(og_rng_next(&r) % 100) < d) mask[v >> 5] |= 1u << (v & 31);
    const int64_t one = (int64_t)(og_rng_next(&r) % (uint64_t)g_V);
    mask[one >> 5] |= 1u << (one & 31);
}

static og_sampler *make_sampler(int i) {
    const kind *k = &k_kinds[i];
    if (k->out != OG_OUTPUT_SAMPLE) return NULL;
    og_sampler_params p = og_sampler_default_params();
    p.temperature = k->temperature;
    p.top_k = k->top_k;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    p.repeat_penalty = k->repeat_penalty;
    p.seed = 4242u + (uint64_t)i;
    static const og_logit_bias bias[] = {{3, 2.5f}, {17, -1.0f}, {100, 4.0f}};
    if (k->bias) {
        p.logit_bias = bias;
        p.n_logit_bias = 3;
    }
    og_sampler *s = NULL;
    CHECK_OK(og_sampler_create(&p, g_V, &s));
    return s;
}

/* The oracle: the row masked here, then the first maximum or the draw. */
static int32_t oracle_token(int i, float *row, const uint32_t *mask, og_sampler *s) {
    for (int64_t v = 0; v < g_V; v++)
        if (!allowed_bit(mask, v)) row[v] = -INFINITY;
    if (k_kinds[i].out == OG_OUTPUT_SAMPLE) return og_sampler_sample(s, row);
    int64_t best = 0;
    for (int64_t v = 1; v < g_V; v++)
        if (row[v] > row[best]) best = v;
    return (int32_t)best;
}

typedef struct world {
    og_session *s[NSETS][K];
    og_sampler *smp[NSETS][K];
    float *logits[NSETS][K]; /* [V] */
} world;

static int read_tokens(const char *dir, int32_t *ids) {
    char path[1100];
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    long v;
    while (n < N_IDS && fscanf(f, "%ld ,", &v) == 1) ids[n++] = (int32_t)v;
    fclose(f);
    return n;
}

/* Refusals: a mask with NONE or LOGITS_ALL, nothing stepped. */
static void check_refusals(og_model *m, og_session *s, const int32_t *ids, const uint32_t *mask, float *logits) {
    const int64_t L = og_session_length(s);
    og_batch_item it[1] = {{.session = s, .tokens = ids, .n_tokens = 1, .output = OG_OUTPUT_NONE, .allowed = mask}};
    CHECK_STATUS(og_model_step(m, it, 1), OG_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(og_last_error(), "item 0") && strstr(og_last_error(), "allowed"), "%s", og_last_error());
    it[0].output = OG_OUTPUT_LOGITS_ALL;
    it[0].logits = logits;
    it[0].n_tokens = 2;
    CHECK_STATUS(og_model_step(m, it, 1), OG_ERR_INVALID_ARGUMENT);
    CHECK(og_session_length(s) == L);
}

static void run(const char *prog, const int32_t *ids, int32_t tensor_parallel) {
    og_model_params mp = og_model_default_params();
    mp.backend = MASK_BACKEND;
    mp.n_threads = 2;
    mp.cuda_graphs = 1;
    mp.tensor_parallel = tensor_parallel;
    og_model *m = NULL;
#ifdef OG_MASK_TEST_CUDA
    /* hi + lo products at every width: a batch's rows keep f32 precision and
     * match each session alone within test_exec_cuda's strict batch
     * tolerance (a bf16 program's default rounds a batch's activations to
     * bf16; test_exec_cuda checks that against its own bound) */
    setenv("OG_CUDA_PRODUCTS", "split", 1);
#endif
    CHECK_OK(og_model_load(prog, &mp, &m));
#ifdef OG_MASK_TEST_CUDA
    unsetenv("OG_CUDA_PRODUCTS");
#endif
    if (!m) return;
    g_V = og_model_vocab_size(m);
    g_W = (g_V + 31) / 32;
    world w;
    memset(&w, 0, sizeof w);
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = OG_DTYPE_F32;
    for (int set = 0; set < NSETS; set++)
        for (int i = 0; i < K; i++) {
            CHECK_OK(og_session_create(m, &sp, &w.s[set][i]));
            w.smp[set][i] = make_sampler(i);
            w.logits[set][i] = malloc((size_t)g_V * sizeof(float));
        }
    uint32_t *masks = malloc((size_t)K * (size_t)g_W * sizeof *masks);
    float *row = malloc((size_t)g_V * sizeof *row);
    int32_t next[K];
    int64_t compared_alone = 0, skipped_alone = 0, forbidden_drawn = 0, mismatches = 0;
    double worst_other = 0; /* CUDA: a batch's row furthest from alone, in tolerances */
    og_model_metrics after_first = {0}, now;
    for (int t = 0; t <= STEPS; t++) {
        int32_t T[K];
        const int32_t *tok[K];
        for (int i = 0; i < K; i++) {
            T[i] = t == 0 ? 2 + i % 5 : 1;
            tok[i] = t == 0 ? ids + 7 * i : &next[i];
            make_mask(i, t, masks + (size_t)i * (size_t)g_W);
        }
        const uint32_t *mask_of[K];
        for (int i = 0; i < K; i++) mask_of[i] = k_kinds[i].density < 0 ? NULL : masks + (size_t)i * (size_t)g_W;
        og_batch_item items[NSETS][K];
        for (int set = 0; set < NSETS; set++)
            for (int i = 0; i < K; i++) {
                const bool oracle = set == SET_BATCH_ORACLE || set == SET_ALONE_ORACLE;
                const og_step_output o = oracle ? OG_OUTPUT_LOGITS : k_kinds[i].out;
                og_poison(w.logits[set][i], (size_t)g_V);
                items[set][i] = (og_batch_item){.session = w.s[set][i], .tokens = tok[i], .n_tokens = T[i],
                                                .output = o,
                                                .logits = o == OG_OUTPUT_LOGITS ? w.logits[set][i] : NULL,
                                                .sampler = o == OG_OUTPUT_SAMPLE ? w.smp[set][i] : NULL,
                                                .allowed = oracle ? NULL : mask_of[i],
                                                .token = -1};
            }
        CHECK_OK(og_model_step(m, items[SET_BATCH], K));
        CHECK_OK(og_model_step(m, items[SET_BATCH_ORACLE], K));
        for (int i = 0; i < K; i++) {
            CHECK_OK(og_model_step(m, &items[SET_ALONE][i], 1));
            CHECK_OK(og_model_step(m, &items[SET_ALONE_ORACLE][i], 1));
        }
        for (int i = 0; i < K; i++) {
            const uint32_t *mk = mask_of[i];
            /* the batch's unmasked logits and the session's alone: the same bits? */
            const bool same_logits =
                !memcmp(w.logits[SET_BATCH_ORACLE][i], w.logits[SET_ALONE_ORACLE][i], (size_t)g_V * sizeof(float));
            int32_t want[2], got[2];
            for (int a = 0; a < 2; a++) { /* 0: batch, 1: alone */
                const int set = a ? SET_ALONE : SET_BATCH, oset = a ? SET_ALONE_ORACLE : SET_BATCH_ORACLE;
                memcpy(row, w.logits[oset][i], (size_t)g_V * sizeof *row);
                want[a] = oracle_token(i, row, mk, w.smp[oset][i]);
                if (k_kinds[i].out == OG_OUTPUT_LOGITS) {
                    CHECK_MSG(!memcmp(w.logits[set][i], row, (size_t)g_V * sizeof *row),
                              "step %d session %d (%s): the masked LOGITS row is not the oracle's", t, i,
                              a ? "alone" : "batch");
                    /* the token fed next: the first maximum of the row given */
                    int64_t best = 0;
                    for (int64_t v = 1; v < g_V; v++)
                        if (w.logits[set][i][v] > w.logits[set][i][best]) best = v;
                    got[a] = (int32_t)best;
                } else {
                    got[a] = items[set][i].token;
                }
                forbidden_drawn += got[a] < 0 || got[a] >= g_V || !allowed_bit(mk, got[a]);
                mismatches += got[a] != want[a];
                CHECK_MSG(got[a] == want[a], "step %d session %d (%s): token %d, the oracle's %d", t, i,
                          a ? "alone" : "batch", (int)got[a], (int)want[a]);
            }
#ifdef OG_MASK_TEST_CUDA
            if (!same_logits) {
                /* a batch's products may sum in another order than one
                 * row's: its unmasked logits are the session's alone
                 * within test_exec_cuda's batch tolerance (f32 KV) */
                size_t at = 0;
                const double r = og_tol_ratio(w.logits[SET_BATCH_ORACLE][i], w.logits[SET_ALONE_ORACLE][i],
                                              (size_t)g_V, 1e-3, 1e-3, &at);
                CHECK_MSG(r <= 1.0, "step %d session %d: the batch's logit %zu is %g of the tolerance from alone's", t,
                          i, at, r);
                worst_other = r > worst_other ? r : worst_other;
                skipped_alone++;
            } else
#endif
            {
                CHECK_MSG(same_logits, "step %d session %d: the batch's logits are not the session's alone", t, i);
                CHECK_MSG(got[0] == got[1], "step %d session %d: batch token %d, alone %d", t, i, (int)got[0],
                          (int)got[1]);
                compared_alone++;
            }
            /* every set goes on with the batch's token; a sampler that drew
             * another one is put back in step (the check above failed) */
            next[i] = got[0] >= 0 && got[0] < g_V ? got[0] : 0;
        }
        if (t == 1) CHECK_OK(og_model_metrics_get(m, &after_first));
    }
    CHECK_MSG(forbidden_drawn == 0 && mismatches == 0, "%lld tokens outside their masks, %lld unlike the oracle",
              (long long)forbidden_drawn, (long long)mismatches);
    printf("%s, %d shards: %d steps of %d sessions; batch against alone the same bits %lld times, %lld rows of "
           "other bits (worst %.3g of the tolerance)\n",
           MASK_BACKEND_NAME, tensor_parallel, STEPS + 1, K, (long long)compared_alone, (long long)skipped_alone,
           worst_other);
    /* every row was compared with its session alone: bit for bit, or (CUDA)
     * within the tolerance */
    CHECK_MSG(compared_alone + skipped_alone == (int64_t)(STEPS + 1) * K, "%lld rows compared, %lld of other bits",
              (long long)compared_alone, (long long)skipped_alone);
    CHECK_OK(og_model_metrics_get(m, &now));
#ifdef OG_MASK_TEST_CUDA
    /* the decode steps (1..STEPS) replayed the graphs of bucket 8 (the
     * batches) and bucket 1 (alone) captured at step 1: masks that change
     * re-capture nothing */
    CHECK_MSG(after_first.graph_captures > 0 && now.graph_captures == after_first.graph_captures,
              "graph captures %lld after the first decode step, %lld at the end", (long long)after_first.graph_captures,
              (long long)now.graph_captures);
    CHECK_MSG(now.bucket_replays[3] - after_first.bucket_replays[3] >= 2 * (STEPS - 1),
              "bucket 8 replays: %lld then %lld", (long long)after_first.bucket_replays[3],
              (long long)now.bucket_replays[3]);
    CHECK_MSG(now.bucket_captures[3] == 1 && now.bucket_captures[0] == 1, "captures of buckets 1 and 8: %lld, %lld",
              (long long)now.bucket_captures[0], (long long)now.bucket_captures[3]);
#else
    CHECK(now.graph_captures == 0 && after_first.graph_captures == 0);
#endif
    check_refusals(m, w.s[SET_ALONE][1], ids, masks, w.logits[SET_ALONE][1]);
    for (int set = 0; set < NSETS; set++)
        for (int i = 0; i < K; i++) {
            og_session_destroy(w.s[set][i]);
            og_sampler_destroy(w.smp[set][i]);
            free(w.logits[set][i]);
        }
    free(masks);
    free(row);
    og_model_destroy(m);
}

#ifdef OG_MASK_TEST_CUDA
/* og_mask_logits_cuda against og_logits_mask, on odd widths, rows sharing a
 * mask and rows without one. */
static void check_kernel(void) {
    og_test_section("og_mask_logits_cuda");
    const int64_t widths[] = {1, 31, 33, 448, 1000, 151937};
    enum { B = 5, NM = 3 };
    const int32_t mask_of[B] = {1, 0, 3, 3, 2};
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        const int64_t V = widths[wi], W = (V + 31) / 32;
        og_rng r = og_rng_seed(99 + (uint64_t)V);
        float *x = malloc((size_t)(B * V) * sizeof *x), *want = malloc((size_t)(B * V) * sizeof *want),
              *got = malloc((size_t)(B * V) * sizeof *got);
        uint32_t *masks = malloc((size_t)(NM * W) * sizeof *masks);
        og_rng_fill(&r, x, (size_t)(B * V), -4, 4);
        for (int64_t k = 0; k < NM * W; k++) masks[k] = (uint32_t)og_rng_next(&r);
        memcpy(want, x, (size_t)(B * V) * sizeof *x);
        for (int b = 0; b < B; b++)
            if (mask_of[b] > 0) og_logits_mask(want + b * V, V, masks + (mask_of[b] - 1) * W);
        float *dx;
        uint32_t *dm;
        int32_t *dof;
        CK(cudaMalloc((void **)&dx, (size_t)(B * V) * sizeof *dx));
        CK(cudaMalloc((void **)&dm, (size_t)(NM * W) * sizeof *dm));
        CK(cudaMalloc((void **)&dof, sizeof mask_of));
        CK(cudaMemcpy(dx, x, (size_t)(B * V) * sizeof *x, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dm, masks, (size_t)(NM * W) * sizeof *dm, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dof, mask_of, sizeof mask_of, cudaMemcpyHostToDevice));
        CHECK_OK(og_mask_logits_cuda(NULL, dx, V, B, dof, dm));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dx, (size_t)(B * V) * sizeof *got, cudaMemcpyDeviceToHost));
        CHECK_MSG(!memcmp(got, want, (size_t)(B * V) * sizeof *got), "V = %lld: the device's masked rows differ",
                  (long long)V);
        CK(cudaFree(dx));
        CK(cudaFree(dm));
        CK(cudaFree(dof));
        free(x);
        free(want);
        free(got);
        free(masks);
    }
    CHECK_STATUS(og_mask_logits_cuda(NULL, NULL, 4, 1, NULL, NULL), OG_ERR_INVALID_ARGUMENT);
}
#endif

int main(void) {
#ifdef OG_MASK_TEST_CUDA
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    check_kernel();
#endif
    const char *src = getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR;
    char dir[1024], prog[1100];
    snprintf(dir, sizeof dir, "%s/tests/data/hf/llama-gqa", src);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(prog, sizeof prog, "%s/og_test_mask_%s_%d.ogp", tmp, MASK_BACKEND_NAME, (int)getpid());
    int32_t ids[N_IDS];
    const int n = read_tokens(dir, ids);
    CHECK_MSG(n == N_IDS, "%s: read %d tokens", dir, n);
    if (n != N_IDS) return og_test_finish();
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = MAX_WRITE;
    o.initial_capacity = 8; /* the decode grows the flat layers */
    CHECK_OK(og_export_hf(dir, prog, &o, NULL));
    og_test_section("masked batch items, " MASK_BACKEND_NAME);
    run(prog, ids, 1);
#ifndef OG_MASK_TEST_CUDA
    og_test_section("masked batch items, cpu, 2 shards (tensor parallel)");
    run(prog, ids, 2);
#endif
    unlink(prog);
    return og_test_finish();
}
#endif
