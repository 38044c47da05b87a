/* The CUDA executor end to end on the committed Hugging Face fixtures
 * (tests/data/hf; parity with transformers itself is tests/cli_parity.sh run
 * with --backend cuda by tests/gpu/run.sh):
 *   - CUDA logits agree with the CPU executor's, fed whole, in chunks of 3 and
 *     token by token (f32 KV: 1e-3, the two back ends differ only in
 *     summation order; a wrong row or head moves logits by 1e-1 or more);
 *   - decode with graphs gives bit-identical logits to decode without (the
 *     same kernels, replayed); storage grows in place (virtual memory
 *     management), so decode across three growths of every flat layer
 *     captures once per output kind used and never rebinds, and with graphs
 *     off never captures; the same with the three output kinds interleaved;
 *   - two sessions stepped in turn keep their own graphs: no re-capture;
 *   - og_session_eval_next's device arg-max is the arg-max of the logits;
 *   - og_session_eval_sample (the sampler on the device) draws the same
 *     tokens with graphs as without, and as og_sampler_sample on the host
 *     draws from the logits the CUDA session returns (same seed, each token
 *     fed back), for greedy and sampled parameters; a failed step leaves the
 *     sampler as it was;
 *   - a step wider than the gemv path (cuBLAS) agrees with the CPU too;
 *   - batched steps (og_model_step) of K = 1, 3, 8, 64 sessions at different
 *     lengths, prompt chunks and decode mixed, agree with the CPU back end
 *     stepping each session alone (the tolerance above);
 *   - decode of up to 64 sessions with joins, leaves and growth captures one
 *     graph per batch bucket used (og_model_metrics), never re-captures, and
 *     agrees with the CPU too;
 *   - programs with q8 and q4 weights agree with the CPU back end on the
 *     same program, for every product path (check_quantized);
 *   - what the executor zeroes on the default stream is zero before a step on
 *     its own (non-blocking) stream reads it, however late the default stream
 *     runs (check_scratch_ordered).
 * Data are found under $OG_SOURCE_DIR when set (a machine with a GPU runs the tests
 * from another checkout), else where the build saw them. Skipped (77) without
 * a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "import/export.h"
#include "exec/sample.h"
#include "program/program.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_TOK = 64 };

static int read_tokens(const char *dir, int32_t *ids) {
    char path[1100];
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    long v;
    while (n < N_TOK && fscanf(f, "%ld ,", &v) == 1) ids[n++] = (int32_t)v;
    fclose(f);
    return n;
}

static og_model *load(const char *prog, og_backend b, int graphs) {
    og_model_params p = og_model_default_params();
    p.backend = b;
    p.n_threads = 2;
    p.cuda_graphs = graphs;
    og_model *m = NULL;
    CHECK_OK(og_model_load(prog, &p, &m));
    return m;
}

static og_session *session(og_model *m) {
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = OG_DTYPE_F32;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    return s;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Logits of every position, fed `chunk` tokens per eval call (0 = all). */
static float *run(og_model *m, const int32_t *ids, int n, int chunk, og_kv_metrics *met) {
    const int64_t V = og_model_vocab_size(m);
    float *out = malloc((size_t)(n * V) * sizeof *out);
    og_poison(out, (size_t)(n * V));
    og_session *s = session(m);
    if (!s) return out;
    if (chunk == 0) {
        CHECK_OK(og_session_eval(s, ids, n, 0, out, 1));
    } else {
        for (int i = 0; i < n; i += chunk) {
            int c = n - i < chunk ? n - i : chunk;
            CHECK_OK(og_session_eval(s, ids + i, c, 0, out + (size_t)i * V, 1));
        }
    }
    if (met) og_session_metrics(s, met);
    og_session_destroy(s);
    return out;
}

/* Decodes N_TOK tokens one at a time in two sessions, one of a model with
 * graphs and one without, cycling through the three output kinds (nothing,
 * logits, arg-max token): every logits row and every token agree bit for
 * bit, and across the growths the graphs session captures once per kind. */
static void check_kinds_across_growth(og_model *gpu, og_model *nog, const int32_t *ids, const char *name,
                                      int64_t n_flat) {
    const int64_t V = og_model_vocab_size(gpu);
    og_session *g = session(gpu), *n = session(nog);
    float *lg = malloc((size_t)V * sizeof *lg), *ln = malloc((size_t)V * sizeof *ln);
    int64_t differ = 0;
    for (int t = 0; g && n && t < N_TOK; t++) {
        int32_t next_g = -1, next_n = -2;
        switch (t % 3) {
        case 0:
            CHECK_OK(og_session_eval(g, ids + t, 1, 0, NULL, 0));
            CHECK_OK(og_session_eval(n, ids + t, 1, 0, NULL, 0));
            break;
        case 1:
            CHECK_OK(og_session_eval(g, ids + t, 1, 0, lg, 0));
            CHECK_OK(og_session_eval(n, ids + t, 1, 0, ln, 0));
            differ += memcmp(lg, ln, (size_t)V * sizeof *lg) != 0;
            break;
        default:
            CHECK_OK(og_session_eval_next(g, ids + t, 1, 0, &next_g));
            CHECK_OK(og_session_eval_next(n, ids + t, 1, 0, &next_n));
            differ += next_g != next_n;
        }
    }
    CHECK_MSG(differ == 0, "%s: %lld decode outputs differ with graphs", name, (long long)differ);
    og_kv_metrics mg = {0}, mn = {0};
    if (g) og_session_metrics(g, &mg);
    if (n) og_session_metrics(n, &mn);
    /* graphs belong to the model (one per batch bucket, whatever the output
     * kind): the model-wide count is checked in check_fixture */
    CHECK_MSG(mg.rebinds == 0 && mg.length == N_TOK, "%s, three kinds: %lld rebinds, length %lld", name,
              (long long)mg.rebinds, (long long)mg.length);
    CHECK(mn.graph_captures == 0 && mn.length == N_TOK);
    free(lg), free(ln);
    og_session_destroy(g);
    og_session_destroy(n);
}

enum { N_PROMPT = 8, N_DRAWN = 40 };

/* A prompt, then N_DRAWN tokens each drawn after the last one fed: on the
 * device (og_session_eval_sample), or on the host from the returned logits. */
static void generate(og_model *m, const int32_t *ids, const og_sampler_params *p, bool host, int32_t *out,
                     og_kv_metrics *met) {
    const int64_t V = og_model_vocab_size(m);
    for (int t = 0; t < N_DRAWN; t++) out[t] = -1;
    og_session *s = session(m);
    og_sampler *smp = NULL;
    CHECK_OK(og_sampler_create(p, V, &smp));
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!s || !smp) goto done;
    CHECK_OK(og_sampler_forbid(smp, 2));
    CHECK_OK(og_sampler_forbid(smp, (int32_t)V - 1));
    for (int i = 0; i < N_PROMPT; i++) og_sampler_accept(smp, ids[i]);
    const int32_t *feed = ids;
    int n = N_PROMPT;
    for (int t = 0; t < N_DRAWN; t++) {
        og_status st;
        if (host) {
            st = og_session_eval(s, feed, n, 0, logits, 0);
            if (st == OG_OK) out[t] = og_sampler_sample(smp, logits);
        } else {
            st = og_session_eval_sample(s, feed, n, 0, smp, &out[t]);
        }
        CHECK_MSG(st == OG_OK, "draw %d: %s", t, og_session_last_error(s));
        if (st != OG_OK) break;
        feed = &out[t];
        n = 1;
    }
    if (met) og_session_metrics(s, met);
    if (!host) { /* a failed step spends no draw and adds no token */
        const int32_t bad = (int32_t)V;
        const int32_t *recent;
        int32_t before[64];
        const double u = og_sampler_peek_uniform(smp);
        const int32_t n_recent = og_sampler_recent(smp, &recent); /* repeat_last_n <= 64 here */
        memcpy(before, recent, (size_t)n_recent * sizeof *before);
        int32_t tok = -5;
        CHECK_STATUS(og_session_eval_sample(s, &bad, 1, 0, smp, &tok), OG_ERR_INVALID_ARGUMENT);
        CHECK(tok == -5 && og_sampler_peek_uniform(smp) == u && og_sampler_recent(smp, &recent) == n_recent &&
              !memcmp(before, recent, (size_t)n_recent * sizeof *before));
    }
done:
    free(logits);
    og_sampler_destroy(smp);
    og_session_destroy(s);
}

static void check_sampling(og_model *gpu, og_model *nog, const int32_t *ids, const char *name) {
    og_sampler_params ps[4];
    for (int i = 0; i < 4; i++) ps[i] = og_sampler_default_params();
    ps[0].temperature = 0.9f, ps[0].repeat_penalty = 1.2f, ps[0].repeat_last_n = 16, ps[0].seed = 42;
    ps[1].temperature = 0, ps[1].repeat_penalty = 1.3f;                        /* greedy */
    ps[2].temperature = 1.5f, ps[2].top_k = 0, ps[2].top_p = 1, ps[2].min_p = 0, ps[2].seed = 7; /* every id */
    ps[3].temperature = 1.0f, ps[3].top_k = 2, ps[3].top_p = 0.5f, ps[3].seed = 9;
    for (int i = 0; i < 4; i++) {
        int32_t with[N_DRAWN], without[N_DRAWN], host[N_DRAWN];
        og_kv_metrics mw, mn;
        generate(gpu, ids, &ps[i], false, with, &mw);
        generate(nog, ids, &ps[i], false, without, &mn);
        generate(gpu, ids, &ps[i], true, host, NULL);
        CHECK_MSG(!memcmp(with, without, sizeof with), "%s params %d: device draws with graphs differ from without",
                  name, i);
        int first = 0;
        while (first < N_DRAWN && with[first] == host[first]) first++;
        CHECK_MSG(first == N_DRAWN, "%s params %d: device and host draws part at %d (%d vs %d)", name, i, first,
                  first < N_DRAWN ? with[first] : -1, first < N_DRAWN ? host[first] : -1);
        CHECK_MSG(mn.graph_captures == 0 && mw.rebinds == 0, "%s params %d: %lld captures without graphs, %lld rebinds",
                  name, i, (long long)mn.graph_captures, (long long)mw.rebinds);
    }
}

/* ------------------------------------------------------------ batched steps */

/* Steps each item's twin (a CPU session with the same history) alone, and
 * compares the device's logits with the twin's; returns the worst ratio. */
static double batch_vs_alone(og_model *cpu, og_batch_item *items, og_session **twins, int K, float *want,
                             const char *what, double atol, double rtol) {
    const int64_t V = og_model_vocab_size(cpu);
    double worst = 0;
    for (int k = 0; k < K; k++) {
        /* the twin token by token: the CPU's prefill of a bf16 program rounds
         * activations to bf16, its one-token steps keep f32 as CUDA does */
        og_batch_item t = items[k];
        og_status st = OG_OK;
        for (int j = 0; j < items[k].n_tokens && st == OG_OK; j++) {
            const bool all = items[k].output == OG_OUTPUT_LOGITS_ALL, last = j == items[k].n_tokens - 1;
            og_batch_item one = {.session = twins[k], .tokens = items[k].tokens + j, .n_tokens = 1};
            if (items[k].logits && (all || last)) {
                one.output = OG_OUTPUT_LOGITS;
                one.logits = want + (all ? (size_t)j * (size_t)V : 0);
            }
            st = og_model_step(cpu, &one, 1);
        }
        t.logits = items[k].logits ? want : NULL;
        CHECK_MSG(st == OG_OK, "%s item %d alone on the CPU: %s", what, k, og_last_error());
        if (st != OG_OK || !t.logits) continue;
        const size_t n = (size_t)(t.output == OG_OUTPUT_LOGITS_ALL ? t.n_tokens : 1) * (size_t)V;
        size_t at = 0;
        const double r = og_tol_ratio(items[k].logits, want, n, atol, rtol, &at);
        CHECK_MSG(r <= 1.0, "%s item %d (%d tokens at length %lld): CUDA batch vs CPU alone ratio %.3g at %zu (%g vs %g)",
                  what, k, t.n_tokens, (long long)og_session_length(twins[k]) - t.n_tokens, r, at,
                  (double)items[k].logits[at], (double)want[at]);
        CHECK_MSG(og_session_length(items[k].session) == og_session_length(twins[k]), "%s item %d: length %lld vs %lld",
                  what, k, (long long)og_session_length(items[k].session), (long long)og_session_length(twins[k]));
        if (r > worst) worst = r;
    }
    return worst;
}

enum { BMAX = 64 };

/* CUDA batches of K sessions at different lengths (flat and ring layers;
 * prompt chunks and decode items mixed) against the CPU back end stepped
 * alone, within atol / rtol (f32 KV). */
static void check_batch_sizes(og_model *cpu, og_model *gpu, const int32_t *ids, const char *name, double atol,
                              double rtol) {
    const int64_t V = og_model_vocab_size(cpu);
    const int32_t max_write = og_model_kv_config(cpu)->max_write;
    static const int Ks[] = {1, 3, 8, 64};
    float *lg = malloc((size_t)BMAX * (size_t)max_write * (size_t)V * sizeof *lg);
    float *want = malloc((size_t)max_write * (size_t)V * sizeof *want);
    int32_t *toks = malloc((size_t)BMAX * (size_t)max_write * sizeof *toks);
    for (int ki = 0; ki < 4; ki++) {
        const int K = Ks[ki];
        og_session *g[BMAX] = {0}, *c[BMAX] = {0};
        bool ok = true;
        for (int k = 0; k < K && ok; k++) {
            g[k] = session(gpu);
            c[k] = session(cpu);
            ok = g[k] && c[k];
            /* lengths 0 .. 39: fresh, inside the first rows, past growths and ring wraps */
            const int L = (k * 13 + ki * 5) % 40;
            if (ok && L > 0) {
                CHECK_OK(og_session_eval(g[k], ids, L, 0, NULL, 0));
                CHECK_OK(og_session_eval(c[k], ids, L, 1, NULL, 0)); /* f32 activations, as CUDA */
            }
        }
        double worst = 0;
        char what[160];
        for (int step = 0; ok && step < 4; step++) {
            og_batch_item items[BMAX];
            for (int k = 0; k < K; k++) {
                const int T = (k + step) % 3 == 0 ? 1 + (k + step) % max_write : 1;
                int32_t *t = toks + (size_t)k * (size_t)max_write;
                for (int j = 0; j < T; j++) t[j] = ids[(k * 5 + step * 3 + j) % N_TOK];
                items[k] = (og_batch_item){.session = g[k], .tokens = t, .n_tokens = T,
                                           .output = T > 1 && k % 2 ? OG_OUTPUT_LOGITS_ALL : OG_OUTPUT_LOGITS,
                                           .logits = lg + (size_t)k * (size_t)max_write * (size_t)V};
                og_poison(items[k].logits, (size_t)max_write * (size_t)V);
            }
            snprintf(what, sizeof what, "%s K=%d step %d", name, K, step);
            og_status st = og_model_step(gpu, items, K);
            CHECK_MSG(st == OG_OK, "%s: %s", what, og_last_error());
            if (st != OG_OK) break;
            const double r = batch_vs_alone(cpu, items, c, K, want, what, atol, rtol);
            if (r > worst) worst = r;
        }
        printf("  %s: CUDA batches of %d sessions vs CPU alone: worst %.3g of the tolerance\n", name, K, worst);
        for (int k = 0; k < K; k++) {
            og_session_destroy(g[k]);
            og_session_destroy(c[k]);
        }
    }
    free(lg), free(want), free(toks);
}

/* Bucket b of og_model_metrics holds 2^b sessions: the smallest one that
 * holds K. */
static int bucket_of(int K) {
    int b = 0;
    while ((1 << b) < K) b++;
    return b;
}

/* Decode of 64 sessions with joins (new sessions), leaves and growth (flat
 * layers from 8 rows up): each padded batch size captures its graph once
 * (og_model_metrics: bucket_captures[b] is 1 for every bucket used, 0 for
 * the others) and replays it after; the logits agree with the CPU stepped
 * alone. */
static void check_batch_decode_graphs(const char *prog, og_model *cpu, const int32_t *ids, const char *name) {
    setenv("OG_CUDA_PRODUCTS", "split", 1); /* f32 precision at every width: see check_fixture */
    og_model *gpu = load(prog, OG_BACKEND_CUDA, 1);
    unsetenv("OG_CUDA_PRODUCTS");
    if (!gpu) return;
    const int64_t V = og_model_vocab_size(cpu);
    enum { POOL = 72, STEPS = 40 };
    og_session *g[POOL] = {0}, *c[POOL] = {0};
    int32_t fed[POOL] = {0}; /* tokens fed to the session in the pool slot */
    float *lg = malloc((size_t)BMAX * (size_t)V * sizeof *lg), *want = malloc((size_t)V * sizeof *want);
    int64_t uses[OG_BATCH_BUCKETS] = {0}, rows = 0, steps = 0;
    og_rng r = og_rng_seed(64);
    /* batch sizes: every bucket from 1 to 64, some twice, in no order */
    static const int sizes[STEPS] = {64, 64, 63, 40, 33, 64, 17, 5, 2, 1, 3, 64, 31, 9, 16, 64, 48, 64, 1,  2,
                                     8,  64, 57, 4,  64, 12, 64, 33, 6, 64, 20, 64, 7, 64, 64, 3,  64, 1, 64, 64};
    bool ok = true;
    for (int i = 0; i < POOL && ok; i++) ok = (g[i] = session(gpu)) && (c[i] = session(cpu));
    for (int step = 0; ok && step < STEPS; step++) {
        /* a leave and a join: a session goes, a fresh one takes its slot */
        if (step % 4 == 3) {
            const int i = (int)(og_rng_next(&r) % POOL);
            og_session_destroy(g[i]);
            og_session_destroy(c[i]);
            g[i] = session(gpu);
            c[i] = session(cpu);
            fed[i] = 0;
            if (!g[i] || !c[i]) break;
        }
        /* K of the pool, from a random start: joins and leaves between steps */
        const int K = sizes[step], start = (int)(og_rng_next(&r) % POOL);
        og_batch_item items[BMAX];
        og_session *twins[BMAX];
        for (int k = 0; k < K; k++) {
            const int i = (start + k) % POOL;
            items[k] = (og_batch_item){.session = g[i], .tokens = &ids[(fed[i] + i) % N_TOK], .n_tokens = 1,
                                       .output = OG_OUTPUT_LOGITS, .logits = lg + (size_t)k * (size_t)V};
            og_poison(items[k].logits, (size_t)V);
            twins[k] = c[i];
            fed[i]++;
        }
        char what[160];
        snprintf(what, sizeof what, "%s decode step %d (K=%d)", name, step, K);
        og_status st = og_model_step(gpu, items, K);
        CHECK_MSG(st == OG_OK, "%s: %s", what, og_last_error());
        if (st != OG_OK) break;
        uses[bucket_of(K)]++;
        rows += K;
        steps++;
        batch_vs_alone(cpu, items, twins, K, want, what, 1e-3, 1e-3);
    }
    og_model_metrics mm;
    CHECK_OK(og_model_metrics_get(gpu, &mm));
    int64_t captures = 0;
    for (int b = 0; b < OG_BATCH_BUCKETS; b++) {
        captures += mm.bucket_captures[b];
        CHECK_MSG(mm.bucket_captures[b] <= 1, "%s: bucket %d (%d sessions) captured %lld times (re-captures)", name, b,
                  1 << b, (long long)mm.bucket_captures[b]);
        CHECK_MSG(mm.bucket_captures[b] == (uses[b] > 0), "%s: bucket %d used by %lld steps, captured %lld times", name,
                  b, (long long)uses[b], (long long)mm.bucket_captures[b]);
        CHECK_MSG(mm.bucket_replays[b] >= uses[b] - 1 && mm.bucket_replays[b] <= uses[b],
                  "%s: bucket %d used by %lld steps, replayed %lld times", name, b, (long long)uses[b],
                  (long long)mm.bucket_replays[b]);
    }
    CHECK_MSG(mm.graph_captures == captures, "%s: %lld captures, the buckets count %lld", name,
              (long long)mm.graph_captures, (long long)captures);
    CHECK_MSG(mm.steps == steps && mm.rows == rows, "%s: model metrics %lld steps %lld rows, want %lld %lld", name,
              (long long)mm.steps, (long long)mm.rows, (long long)steps, (long long)rows);
    /* storage grows in place (packed, virtual memory): nothing ever moved */
    int64_t moved = 0;
    for (int i = 0; i < POOL; i++) {
        og_kv_metrics km = {0};
        if (g[i]) og_session_metrics(g[i], &km);
        moved += km.rebinds;
    }
    CHECK_MSG(moved == 0, "%s: %lld rebinds during the decode run", name, (long long)moved);
    printf("  %s: decode of up to 64 sessions, %lld steps: %lld graph captures\n", name, (long long)steps,
           (long long)mm.graph_captures);
    for (int i = 0; i < POOL; i++) {
        og_session_destroy(g[i]);
        og_session_destroy(c[i]);
    }
    free(lg), free(want);
    og_model_destroy(gpu);
}

/* One batch holding sessions of both KV dtypes (f32 and bf16 storage): the
 * sessions whose dtype the batched attention does not serve step alone
 * inside the same step. Each session's logits and arg-max equal its twin's
 * (same dtype) stepped alone on the device, within the CUDA tolerance. */
static void check_mixed_kv_dtypes(og_model *gpu, const int32_t *ids, const char *name) {
    enum { KM = 5, STEPS = 6, L0 = 12 };
    const int64_t V = og_model_vocab_size(gpu);
    og_session *g[KM] = {0}, *t[KM] = {0};
    bool ok = true;
    for (int k = 0; k < KM && ok; k++) {
        og_session_params sp = og_session_default_params();
        sp.kv_dtype = k % 2 ? OG_DTYPE_BF16 : OG_DTYPE_F32;
        ok = og_session_create(gpu, &sp, &g[k]) == OG_OK && og_session_create(gpu, &sp, &t[k]) == OG_OK;
        CHECK_MSG(ok, "%s: session %d: %s", name, k, og_last_error());
        if (ok) {
            CHECK_OK(og_session_eval(g[k], ids + k, L0, 0, NULL, 0));
            CHECK_OK(og_session_eval(t[k], ids + k, L0, 0, NULL, 0));
        }
    }
    float *lg = malloc((size_t)KM * (size_t)V * sizeof *lg), *want = malloc((size_t)V * sizeof *want);
    double worst = 0;
    for (int step = 0; ok && step < STEPS; step++) {
        og_batch_item items[KM];
        int32_t tok[KM];
        for (int k = 0; k < KM; k++) {
            tok[k] = ids[(L0 + k + step * 7) % N_TOK];
            items[k] = (og_batch_item){.session = g[k], .tokens = &tok[k], .n_tokens = 1,
                                       .output = OG_OUTPUT_LOGITS, .logits = lg + (size_t)k * (size_t)V};
        }
        og_status st = og_model_step(gpu, items, KM);
        CHECK_MSG(st == OG_OK, "%s mixed KV dtypes step %d: %s", name, step, og_last_error());
        if (st != OG_OK) break;
        for (int k = 0; k < KM; k++) {
            og_batch_item one = {.session = t[k], .tokens = &tok[k], .n_tokens = 1, .output = OG_OUTPUT_LOGITS,
                                 .logits = want};
            CHECK_OK(og_model_step(gpu, &one, 1));
            size_t at = 0;
            const double r = og_tol_ratio(items[k].logits, want, (size_t)V, 1e-3, 1e-3, &at);
            CHECK_MSG(r <= 1.0, "%s mixed KV dtypes step %d session %d (%s KV): batch vs alone ratio %.3g at %zu", name,
                      step, k, k % 2 ? "bf16" : "f32", r, at);
            if (r > worst) worst = r;
        }
    }
    printf("  %s: a batch of f32-KV and bf16-KV sessions vs each alone: worst %.3g of the tolerance\n", name, worst);
    for (int k = 0; k < KM; k++) og_session_destroy(g[k]), og_session_destroy(t[k]);
    free(lg), free(want);
}

/* Holds the default (legacy) stream: a host function queued there runs
 * this long, and everything queued behind it waits. */
static void CUDART_CB hold_stream(void *arg) { usleep((useconds_t)(uintptr_t)arg); }

/* A step context zeroes its split counters with cudaMemset, which runs on the
 * default (legacy) stream, asynchronously; the steps run on the context's
 * non-blocking stream, which does not wait for the legacy one. With the
 * legacy stream held for 300 ms when the first step creates the context (the
 * zeroing queued behind the hold), the context must wait for its zeroing:
 * the legacy stream is idle when the step returns, and decode with splits of
 * 4 keys (the counters in use from the second key on) over device memory
 * left at 0xff by a freed buffer agrees with the CPU. Before the executor
 * waited, this ordering held only by timing, and failed with other processes
 * sharing the GPU. */
static void check_scratch_ordered(const char *prog, const float *want, const int32_t *ids, const char *name) {
    void *junk = NULL; /* leaves the memory the context allocates next far from zero */
    const size_t junk_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&junk, junk_bytes));
    CK(cudaMemset(junk, 0xff, junk_bytes));
    CK(cudaDeviceSynchronize());
    CK(cudaFree(junk));
    og_model *m = load(prog, OG_BACKEND_CUDA, 0);
    og_session *s = m ? session(m) : NULL;
    if (!s) {
        og_model_destroy(m);
        return;
    }
    const int32_t keys = og_attend_cuda_set_split_keys(4);
    const int64_t V = og_model_vocab_size(m);
    enum { N = 24 };
    float *got = malloc((size_t)N * (size_t)V * sizeof *got);
    og_poison(got, (size_t)N * (size_t)V);
    CK(cudaLaunchHostFunc(0, hold_stream, (void *)(uintptr_t)300000));
    CHECK_OK(og_session_eval(s, ids, 1, 0, got, 1)); /* creates the step context */
    const cudaError_t idle = cudaStreamQuery(0);
    CHECK_MSG(idle == cudaSuccess, "%s: the first step returned with the default stream still busy (%s): the "
              "context's zeroing was not waited for", name, cudaGetErrorName(idle));
    for (int t = 1; t < N; t++) CHECK_OK(og_session_eval(s, ids + t, 1, 0, got + (size_t)t * V, 1));
    size_t worst = 0;
    const double r = og_tol_ratio(got, want, (size_t)N * (size_t)V, 1e-3, 1e-3, &worst);
    CHECK_MSG(r <= 1.0, "%s: decode right after the context was made: ratio %.3g at %zu (%g vs %g)", name, r, worst,
              (double)got[worst], (double)want[worst]);
    og_attend_cuda_set_split_keys(keys);
    CK(cudaDeviceSynchronize());
    free(got);
    og_session_destroy(s);
    og_model_destroy(m);
}

static void check_fixture(const char *src, const char *name) {
    char dir[1024], prog[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/hf/%s", src, name);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(prog, sizeof prog, "%s/og_exec_cuda_%s_%d.ogp", tmp, name, (int)getpid());
    og_test_section(name);
    int32_t ids[N_TOK];
    int n = read_tokens(dir, ids);
    CHECK_MSG(n == N_TOK, "%s: read %d tokens", dir, n);
    if (n != N_TOK) return;
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 8;
    o.initial_capacity = 8; /* decode grows the flat layers: 8 -> 16 -> 32 -> 64 */
    CHECK_OK(og_export_hf(dir, prog, &o, NULL));

    og_model *cpu = load(prog, OG_BACKEND_CPU, 1);
    /* every check up to the wide steps below takes hi + lo products at
     * every width (OG_CUDA_PRODUCTS=split): f32 precision, so a batch's rows
     * match the CPU's f32 one-token steps to 1e-3. A bf16 program's default
     * rounds a batch's activations to bf16 past the gemv's rows; those
     * batches are checked against the bf16-activation bound at the end. */
    setenv("OG_CUDA_PRODUCTS", "split", 1);
    og_model *gpu = load(prog, OG_BACKEND_CUDA, 1);
    og_model *nog = load(prog, OG_BACKEND_CUDA, 0);
    unsetenv("OG_CUDA_PRODUCTS");
    if (!cpu || !gpu || !nog) goto done;
    CHECK(og_model_backend(gpu) == OG_BACKEND_CUDA);
    const int64_t V = og_model_vocab_size(cpu);
    const size_t all = (size_t)N_TOK * (size_t)V;
    /* the CPU reference one token at a time: its prefill of a bf16 program
     * rounds activations to bf16 (as llama.cpp does), its T = 1 steps keep
     * them in f32, which is what the CUDA path computes (hi + lo products) */
    float *want = run(cpu, ids, N_TOK, 1, NULL);
    check_scratch_ordered(prog, want, ids, name);
    const int chunks[] = {0, 3, 1};
    for (int ci = 0; ci < 3; ci++) {
        float *got = run(gpu, ids, N_TOK, chunks[ci], NULL);
        size_t worst = 0;
        double r = og_tol_ratio(got, want, all, 1e-3, 1e-3, &worst);
        CHECK_MSG(r <= 1.0, "%s chunk %d: CUDA vs CPU ratio %.3g at %zu (%g vs %g)", name, chunks[ci], r, worst,
                  (double)got[worst], (double)want[worst]);
        free(got);
    }
    /* decode: graphs against no graphs, token by token */
    og_kv_metrics mg, mn;
    float *with = run(gpu, ids, N_TOK, 1, &mg);
    float *without = run(nog, ids, N_TOK, 1, &mn);
    CHECK_MSG(memcmp(with, without, all * sizeof(float)) == 0, "%s: decode with graphs differs from without", name);
    int64_t n_flat = 0;
    for (int32_t l = 0; l < og_model_kv_config(gpu)->n_layers; l++)
        n_flat += og_model_kv_config(gpu)->layers[l].policy == OG_KV_FLAT;
    /* packed storage grows in place: no rebinds; graphs are the model's */
    CHECK_MSG(mg.rebinds == 0, "%s: %lld rebinds (%lld flat layers)", name, (long long)mg.rebinds, (long long)n_flat);
    CHECK(mn.graph_captures == 0 && mn.rebinds == 0);
    free(with), free(without);
    check_kinds_across_growth(gpu, nog, ids, name, n_flat);

    /* two sessions in turn: prefill both past every growth, then alternate */
    og_session *a = session(gpu), *b = session(gpu);
    if (a && b) {
        CHECK_OK(og_session_eval(a, ids, 40, 0, NULL, 0));
        CHECK_OK(og_session_eval(b, ids, 40, 0, NULL, 0));
        og_kv_metrics ma0, mb0, ma1, mb1;
        float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
        int32_t next = -1;
        for (int t = 40; t < 50; t++) {
            CHECK_OK(og_session_eval(a, ids + t, 1, 0, la, 0));
            CHECK_OK(og_session_eval(b, ids + t, 1, 0, lb, 0));
            if (t == 40) og_session_metrics(a, &ma0), og_session_metrics(b, &mb0);
        }
        CHECK_MSG(memcmp(la, lb, (size_t)V * 4) == 0, "%s: two sessions fed the same differ", name);
        CHECK_OK(og_session_eval_next(a, ids + 50, 1, 0, &next));
        CHECK_OK(og_session_eval(b, ids + 50, 1, 0, lb, 0));
        int64_t best = -1;
        CHECK_OK(og_argmax_ref(lb, V, &best));
        CHECK_MSG(next == best, "%s: device arg-max %d, logits arg-max %lld", name, next, (long long)best);
        og_session_metrics(a, &ma1), og_session_metrics(b, &mb1);
        /* the one-session graph serves both, and every output kind: no capture */
        CHECK_MSG(ma1.graph_captures == ma0.graph_captures && mb1.graph_captures == mb0.graph_captures &&
                      ma1.rebinds == 0 && mb1.rebinds == 0,
                  "%s: sessions in turn re-captured (a %lld -> %lld, b %lld -> %lld)", name,
                  (long long)ma0.graph_captures, (long long)ma1.graph_captures, (long long)mb0.graph_captures,
                  (long long)mb1.graph_captures);
        free(la), free(lb);
    }
    og_session_destroy(a);
    og_session_destroy(b);
    check_sampling(gpu, nog, ids, name);
    check_batch_sizes(cpu, gpu, ids, name, 1e-3, 1e-3);
    check_mixed_kv_dtypes(gpu, ids, name);
    /* every step above of one session decoding replayed the one-session
     * graph, captured once for the model; the batches captured one per bucket */
    og_model_metrics gm, nm;
    CHECK_OK(og_model_metrics_get(gpu, &gm));
    CHECK_OK(og_model_metrics_get(nog, &nm));
    bool once = true;
    for (int bk = 0; bk < OG_BATCH_BUCKETS; bk++) once = once && gm.bucket_captures[bk] <= 1;
    CHECK_MSG(once && gm.bucket_captures[0] == 1 && gm.bucket_replays[0] > N_TOK && nm.graph_captures == 0,
              "%s: graph captures per bucket 1:%lld 2:%lld 4:%lld 8:%lld (replays of 1: %lld), without graphs %lld",
              name, (long long)gm.bucket_captures[0], (long long)gm.bucket_captures[1], (long long)gm.bucket_captures[2],
              (long long)gm.bucket_captures[3], (long long)gm.bucket_replays[0], (long long)nm.graph_captures);
    check_batch_decode_graphs(prog, cpu, ids, name);

    /* steps wider than the gemv path: the whole sequence in one step goes
     * through cuBLAS. With OG_CUDA_PRODUCTS=split the bf16 products take x
     * split into hi + lo (f32 precision): the f32 tolerance against the CPU
     * token by token. By default a bf16 program's one-session step rounds x
     * to bf16, as the CPU's prefill of it does. Against the CPU's prefill
     * (one step of the same program): the products round the same values,
     * except where summation order puts an f32 value on the other side of a
     * bf16 rounding boundary (one input moves by one bf16 step); attention
     * differs by design: the CPU's tile kernel rounds q to bf16 (2^-8
     * relative in every score), the CUDA one keeps q to ~2^-16 (hi + lo),
     * both round the weights P. One q rounding per layer moves the logits by
     * at most 2^-8 x 4.5 ~ 0.018, four layers 0.07; with the flips, 0.1
     * (measured 0.006-0.017, printed below). Against the f32 token-by-token
     * run: the bf16-activation bound of tests/cli_parity.sh (0.32 with f32
     * KV for these fixtures: 17 roundings in series x 2^-8 x logits < 4.5). */
    og_model_destroy(gpu);
    gpu = NULL;
    o.max_write = N_TOK;
    CHECK_OK(og_export_hf(dir, prog, &o, NULL));
    setenv("OG_CUDA_PRODUCTS", "split", 1);
    gpu = load(prog, OG_BACKEND_CUDA, 1);
    unsetenv("OG_CUDA_PRODUCTS");
    if (gpu) {
        float *got = run(gpu, ids, N_TOK, 0, NULL);
        size_t worst = 0;
        double r = og_tol_ratio(got, want, all, 1e-3, 1e-3, &worst);
        CHECK_MSG(r <= 1.0, "%s one %d-token step (hi + lo products): CUDA vs CPU ratio %.3g at %zu (%g vs %g)", name,
                  N_TOK, r, worst, (double)got[worst], (double)want[worst]);
        free(got);
        og_model_destroy(gpu);
    }
    gpu = load(prog, OG_BACKEND_CUDA, 1);
    og_model *cpu_wide = load(prog, OG_BACKEND_CPU, 1);
    og_program *pw = NULL;
    CHECK_OK(og_program_open(prog, &pw));
    const bool bf16_program = pw && og_program_get_model(pw)->activation_dtype == OG_DTYPE_BF16;
    og_program_close(pw);
    if (gpu && cpu_wide) {
        float *got = run(gpu, ids, N_TOK, 0, NULL), *cpu_pre = run(cpu_wide, ids, N_TOK, 0, NULL);
        size_t at_pre = 0, at_one = 0;
        const double r_pre = og_tol_ratio(got, cpu_pre, all, bf16_program ? 0.1 : 1e-3, bf16_program ? 0 : 1e-3,
                                          &at_pre),
                     r_one = og_tol_ratio(got, want, all, bf16_program ? 0.32 : 1e-3, 0, &at_one);
        CHECK_MSG(r_pre <= 1.0, "%s one %d-token step: CUDA vs the CPU's prefill ratio %.3g at %zu (%g vs %g)", name,
                  N_TOK, r_pre, at_pre, (double)got[at_pre], (double)cpu_pre[at_pre]);
        CHECK_MSG(r_one <= 1.0, "%s one %d-token step: CUDA vs CPU token by token ratio %.3g at %zu (%g vs %g)", name,
                  N_TOK, r_one, at_one, (double)got[at_one], (double)want[at_one]);
        printf("  %s one %d-token step, %s products: vs the CPU's prefill max |diff| %.3g, vs token by token %.3g\n",
               name, N_TOK, bf16_program ? "bf16" : "f32", max_abs_diff(got, cpu_pre, all), max_abs_diff(got, want, all));
        free(got), free(cpu_pre);
        /* batches with the default products: a bf16 program's rows past the
         * gemv take bf16(x), so the bound against the CPU's f32 one-token
         * steps is the bf16-activation one above */
        check_batch_sizes(cpu, gpu, ids, name, bf16_program ? 0.32 : 1e-3, bf16_program ? 0 : 1e-3);
    }
    og_model_destroy(cpu_wide);
    free(want);
done:
    og_model_destroy(cpu);
    og_model_destroy(gpu);
    og_model_destroy(nog);
    remove(prog);
}

/* A q8 / q4 program with bf16 activations: the whole step rounds x to bf16 and
 * multiplies it by the weights (as bf16 hi + lo, 2^-16 relative, past 64
 * rows; up to 64, the quants widened to bf16 and scaled a group at a time),
 * on the tensor cores here and on the vector (or tile) units in the CPU's
 * prefill: against the CPU's prefill, the bound of check_fixture's bf16
 * programs (0.1: summation order flipping a bf16 rounding of x, and
 * attention's q rounding on the CPU). */
static void check_quantized_bf16(const char *prog, const char *what, const int32_t *ids) {
    char label[160];
    snprintf(label, sizeof label, "%s, bf16 activations", what);
    og_model *cpu = load(prog, OG_BACKEND_CPU, 1), *gpu = load(prog, OG_BACKEND_CUDA, 1);
    if (cpu && gpu) {
        const size_t all = (size_t)N_TOK * (size_t)og_model_vocab_size(cpu);
        float *want = run(cpu, ids, N_TOK, 0, NULL), *got = run(gpu, ids, N_TOK, 0, NULL);
        size_t at = 0;
        const double r = og_tol_ratio(got, want, all, 0.1, 0, &at);
        CHECK_MSG(r <= 1.0, "%s one %d-token step: CUDA vs the CPU's prefill ratio %.3g at %zu (%g vs %g)", label,
                  N_TOK, r, at, (double)got[at], (double)want[at]);
        printf("  %s one %d-token step: vs the CPU's prefill max |diff| %.3g\n", label, N_TOK,
               max_abs_diff(got, want, all));
        free(want), free(got);
    }
    og_model_destroy(cpu);
    og_model_destroy(gpu);
}

/* A program with q8 or q4 weights (every matrix of the fixture, the
 * embedding table, and with tied embeddings the head that reads it): the
 * CUDA logits agree with the CPU back end's on the same program, fed whole
 * (64 rows: each weight dequantized to f32 panels and SGEMM), in chunks of
 * 20 (the gemv on chunks of 8 rows), 3 and 1 (the gemv and its fused
 * variants, norm prologues included). Same tolerance as the float programs:
 * both back ends multiply by the exact weights scale * q with f32 sums and
 * differ in summation order only. Decode with graphs gives the bits of
 * decode without.
 *
 * Then the same weights in a bf16 program (check_quantized_bf16). */
static void check_quantized(const char *src, const char *name, og_dtype weights) {
    char dir[1024], prog[1024], what[128];
    snprintf(dir, sizeof dir, "%s/tests/data/hf/%s", src, name);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(prog, sizeof prog, "%s/og_exec_cuda_%s_%s_%d.ogp", tmp, name, og_dtype_name(weights), (int)getpid());
    snprintf(what, sizeof what, "%s, %s weights", name, og_dtype_name(weights));
    og_test_section(what);
    int32_t ids[N_TOK];
    if (read_tokens(dir, ids) != N_TOK) {
        CHECK_MSG(false, "%s: no tokens", dir);
        return;
    }
    og_export_options o;
    og_export_default_options(&o);
    o.weights = weights;
    o.dtype = OG_DTYPE_F32; /* f32 activations: the exact-weight products the comment describes */
    o.max_write = N_TOK;
    o.initial_capacity = 8;
    og_export_summary sum;
    CHECK_OK(og_export_hf(dir, prog, &o, &sum));
    CHECK_MSG(sum.weights == weights && sum.n_unquantized == 0, "%s: %d matrices left unquantized", what,
              (int)sum.n_unquantized);
    og_model *cpu = load(prog, OG_BACKEND_CPU, 1);
    og_model *gpu = load(prog, OG_BACKEND_CUDA, 1);
    og_model *nog = load(prog, OG_BACKEND_CUDA, 0);
    if (cpu && gpu && nog) {
        const size_t all = (size_t)N_TOK * (size_t)og_model_vocab_size(cpu);
        float *want = run(cpu, ids, N_TOK, 1, NULL);
        const int chunks[] = {0, 20, 3, 1};
        for (int ci = 0; ci < 4; ci++) {
            float *got = run(gpu, ids, N_TOK, chunks[ci], NULL);
            size_t worst = 0;
            double r = og_tol_ratio(got, want, all, 1e-3, 1e-3, &worst);
            CHECK_MSG(r <= 1.0, "%s chunk %d: CUDA vs CPU ratio %.3g at %zu (%g vs %g)", what, chunks[ci], r, worst,
                      (double)got[worst], (double)want[worst]);
            free(got);
        }
        float *with = run(gpu, ids, N_TOK, 1, NULL), *without = run(nog, ids, N_TOK, 1, NULL);
        CHECK_MSG(memcmp(with, without, all * sizeof(float)) == 0, "%s: decode with graphs differs from without",
                  what);
        free(with), free(without), free(want);
    }
    og_model_destroy(cpu);
    og_model_destroy(gpu);
    og_model_destroy(nog);
    o.dtype = OG_DTYPE_BF16;
    CHECK_OK(og_export_hf(dir, prog, &o, NULL));
    check_quantized_bf16(prog, what, ids);
    /* batches of 1 - 64 sessions (og_gemm_narrow_cuda's q8 / q4 products from 9 rows to 64) against the
     * CPU stepped alone, at the bf16-activation bound of check_fixture's batches; steps of at most 8
     * tokens, as check_fixture's, so that the sessions stay within the fixture's context */
    o.max_write = 8;
    CHECK_OK(og_export_hf(dir, prog, &o, NULL));
    og_model *cpu8 = load(prog, OG_BACKEND_CPU, 1), *gpu8 = load(prog, OG_BACKEND_CUDA, 1);
    if (cpu8 && gpu8) {
        char label[160];
        snprintf(label, sizeof label, "%s, bf16 activations", what);
        check_batch_sizes(cpu8, gpu8, ids, label, 0.32, 0);
    }
    og_model_destroy(cpu8);
    og_model_destroy(gpu8);
    remove(prog);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    const char *src = getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR;
    const char *names[] = {"llama-gqa", "qwen3-mixed", "qwen2-bias", "mistral-sw"};
    for (int i = 0; i < 4; i++) check_fixture(src, names[i]);
    /* fixtures whose matrices are all whole groups of OG_QUANT_GROUP */
    const char *quant_names[] = {"llama-gqa", "qwen3-mixed"};
    for (int i = 0; i < 2; i++) {
        check_quantized(src, quant_names[i], OG_DTYPE_Q8);
        check_quantized(src, quant_names[i], OG_DTYPE_Q4);
    }
    return og_test_finish();
}
#endif
