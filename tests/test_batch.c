/* The batched step (og_model_step) on the CPU back end, over the synthetic
 * program of tests/support (layer 0 flat, layer 1 a ring of window 3; steps
 * of at most 5 tokens; flat layers start at 4 rows, so steps cross storage
 * growth and the ring wraps after 7 slots), f32 and bf16 programs, f32 and
 * bf16 KV, dense storage (the heap) and packed storage (host pages that grow
 * in place):
 *  1. batched equals alone, bit for bit: batches of K = 1, 2, 3, 5, 8
 *     sessions at different lengths, mixing decode items and prompt chunks
 *     and every output kind, against twin sessions (same history) each
 *     stepped alone; 40 steps of random joins, leaves, new sessions and
 *     resets: logits, tokens, lengths, metrics and the committed KV rows of
 *     every layer agree byte for byte;
 *  2. against a reference: the same sessions fed token by token
 *     (og_session_eval, chunk 1), within a tolerance set by the dtypes;
 *  3. all or nothing: every allocation a batch makes is made to fail in
 *     turn (one fault state per session, and one shared by all): the batch
 *     returns OG_ERR_OUT_OF_MEMORY naming the item, and no session's length,
 *     metrics, storage addresses or committed rows change, no logits are
 *     written, no sampler moves; the same batch then succeeds and matches
 *     the twins. A session at max_capacity fails a batch with
 *     OG_ERR_CAPACITY the same way. Both again with the sessions prepared
 *     on the model's threads (a fault state per session);
 *  4. refusals, each naming the item, with nothing changed;
 *  5. threads: 4 threads each stepping their own 2 sessions of one model
 *     give the tokens of a single-threaded run. */
#include "harness.h"
#include "program_fixture.h"

#include "exec/exec.h"
#include "exec/sample.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Geometry of the programs written here (see og_fixture_opts). */
enum {
    MAX_WRITE = 5,
    INIT_CAP = 4,
    WINDOW = 3,
    RING_R = WINDOW + MAX_WRITE - 1, /* 7 ring slots */
    MAX_CAP = 256,
    V = OG_FIX_VOCAB,
};

static og_model *g_prog[2];  /* [0] f32 activations, [1] bf16 activations */
static og_model *g_other;    /* another model (of the f32 program)       */
static og_kv_allocator g_paged;
static bool g_have_paged;

typedef struct variant {
    const char *name;
    int prog;       /* index into g_prog */
    og_dtype kv;    /* the sessions' kv dtype */
    bool paged;     /* packed storage over host pages */
} variant;

static const variant k_variants[] = {
    {"f32 program, f32 kv, dense", 0, OG_DTYPE_F32, false},
    {"f32 program, bf16 kv, dense", 0, OG_DTYPE_BF16, false},
    {"bf16 program, bf16 kv, dense", 1, OG_DTYPE_BF16, false},
    {"bf16 program, f32 kv, packed", 1, OG_DTYPE_F32, true},
    {"f32 program, bf16 kv, packed", 0, OG_DTYPE_BF16, true},
};
#define N_VARIANTS ((int)(sizeof k_variants / sizeof k_variants[0]))

/* A session of the variant; alloc overrides its storage when non-NULL. */
static og_session *new_session(const variant *v, const og_kv_allocator *alloc) {
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = v->kv;
    sp.kv_allocator = alloc ? alloc : v->paged ? &g_paged : NULL;
    og_session *s = NULL;
    CHECK_OK(og_session_create(g_prog[v->prog], &sp, &s));
    return s;
}

static int32_t rnd(og_rng *r, int32_t n) { return (int32_t)(og_rng_next(r) % (uint64_t)n); }

static void rnd_tokens(og_rng *r, int32_t *t, int n) {
    for (int i = 0; i < n; i++) t[i] = rnd(r, V);
}

static og_sampler_params sampler_params(int kind, uint64_t seed) {
    og_sampler_params p = og_sampler_default_params();
    p.seed = seed;
    switch (kind % 4) {
    case 0: p.temperature = 0; break; /* greedy */
    case 1: p.temperature = 0.9f, p.top_k = 8, p.repeat_penalty = 1.2f, p.repeat_last_n = 6; break;
    case 2: p.temperature = 1.4f, p.top_k = 0, p.top_p = 1, p.min_p = 0; break; /* every id */
    default: p.temperature = 1.0f, p.top_k = 3, p.top_p = 0.7f; break;
    }
    return p;
}

static og_sampler *new_sampler(int kind, uint64_t seed) {
    og_sampler_params p = sampler_params(kind, seed);
    og_sampler *s = NULL;
    CHECK_OK(og_sampler_create(&p, V, &s));
    return s;
}

/* ------------------------------------------------------------ snapshots */

/* Committed rows of every layer: flat rows 0 .. L-1, ring slots of the last
 * min(L, R) positions, in position order; *n gets the byte count. */
static uint8_t *committed_rows(const og_session *s, size_t *n) {
    const og_kv_session *kv = og_session_kv(s);
    const og_kv_config *cfg = og_model_kv_config(g_prog[0]);
    size_t total = 0, cap = 0;
    uint8_t *out = NULL;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        og_kv_layer_view v;
        if (og_kv_session_layer_view(kv, i, &v) != OG_OK) continue;
        const size_t es = og_dtype_size(v.dtype), row = (size_t)v.n_kv_heads * (size_t)v.head_dim * es;
        const size_t stride = (size_t)og_kv_layer_view_row_stride(&v) * es;
        const int64_t first = v.policy == OG_KV_RING && v.length > v.rows ? v.length - v.rows : 0;
        for (int64_t p = first; p < v.length; p++) {
            const int64_t slot = v.policy == OG_KV_RING ? p % v.rows : p;
            if (total + 2 * row > cap) {
                cap = (total + 2 * row) * 2;
                out = realloc(out, cap);
            }
            memcpy(out + total, (const uint8_t *)v.k + (size_t)slot * stride, row);
            memcpy(out + total + row, (const uint8_t *)v.v + (size_t)slot * stride, row);
            total += 2 * row;
        }
    }
    *n = total;
    return out;
}

typedef struct snap {
    int64_t length;
    og_kv_metrics met;
    void *k[2], *v[2];
    int64_t rows[2];
    uint8_t *bytes;
    size_t n;
} snap;

static void snap_take(const og_session *s, snap *o) {
    memset(o, 0, sizeof *o);
    o->length = og_session_length(s);
    og_session_metrics(s, &o->met);
    for (int32_t i = 0; i < 2; i++) {
        og_kv_layer_view v;
        og_kv_session_layer_view(og_session_kv(s), i, &v);
        o->k[i] = v.k, o->v[i] = v.v, o->rows[i] = v.rows;
    }
    o->bytes = committed_rows(s, &o->n);
}

/* True when s is as it was at the snapshot; why says what differs. */
static bool snap_same(const og_session *s, const snap *o, char *why, size_t cap) {
    snap now;
    snap_take(s, &now);
    bool same = true;
#define DIFF(cond, ...)                                                                                                \
    if (same && (cond)) {                                                                                              \
        snprintf(why, cap, __VA_ARGS__);                                                                               \
        same = false;                                                                                                  \
    }
    DIFF(now.length != o->length, "length %lld -> %lld", (long long)o->length, (long long)now.length);
    for (int i = 0; i < 2; i++) {
        DIFF(now.k[i] != o->k[i] || now.v[i] != o->v[i], "layer %d storage moved (k %p -> %p)", i, o->k[i], now.k[i]);
        DIFF(now.rows[i] != o->rows[i], "layer %d rows %lld -> %lld", i, (long long)o->rows[i], (long long)now.rows[i]);
    }
    DIFF(now.met.rows_allocated != o->met.rows_allocated, "rows_allocated %lld -> %lld",
         (long long)o->met.rows_allocated, (long long)now.met.rows_allocated);
    DIFF(now.met.bytes_allocated != o->met.bytes_allocated, "bytes_allocated %lld -> %lld",
         (long long)o->met.bytes_allocated, (long long)now.met.bytes_allocated);
    DIFF(now.met.bytes_live != o->met.bytes_live, "bytes_live changed");
    DIFF(now.met.growth_count != o->met.growth_count, "growth_count %lld -> %lld", (long long)o->met.growth_count,
         (long long)now.met.growth_count);
    DIFF(now.met.rebinds != o->met.rebinds, "rebinds %lld -> %lld", (long long)o->met.rebinds,
         (long long)now.met.rebinds);
    DIFF(now.met.steps != o->met.steps, "steps changed");
    DIFF(now.met.graph_captures != o->met.graph_captures, "graph_captures changed");
    DIFF(now.n != o->n || (o->n && memcmp(now.bytes, o->bytes, o->n)), "committed rows differ");
#undef DIFF
    free(now.bytes);
    return same;
}

/* A sampler's state as far as the next draw can tell: its next uniform and
 * its recent tokens. */
typedef struct sampler_snap {
    double u;
    int32_t n;
    int32_t recent[64];
} sampler_snap;

static void sampler_take(const og_sampler *s, sampler_snap *o) {
    const int32_t *ids;
    o->u = og_sampler_peek_uniform(s);
    o->n = og_sampler_recent(s, &ids);
    if (o->n > 64) o->n = 64;
    memcpy(o->recent, ids, (size_t)o->n * sizeof *ids);
}

static bool sampler_same(const og_sampler *s, const sampler_snap *o) {
    sampler_snap now;
    sampler_take(s, &now);
    return now.u == o->u && now.n == o->n && !memcmp(now.recent, o->recent, (size_t)o->n * sizeof *o->recent);
}

static bool all_poisoned(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] == x[i]) return false; /* og_poison writes NaNs */
    return true;
}

static size_t logits_floats(const og_batch_item *it) {
    return it->output == OG_OUTPUT_LOGITS_ALL ? (size_t)it->n_tokens * V : it->output == OG_OUTPUT_LOGITS ? V : 0;
}

/* ------------------------------------------------------------ 1. batched equals alone */

enum { POOL_MAX = 10, HIST_MAX = 512 };

typedef struct pair {
    og_session *b, *t;     /* stepped in batches / alone */
    og_sampler *sb, *st;   /* equal parameters and seed   */
} pair;

static void pair_new(pair *p, const variant *v, og_rng *r, int64_t history) {
    p->b = new_session(v, NULL);
    p->t = new_session(v, NULL);
    const int kind = rnd(r, 4);
    const uint64_t seed = og_rng_next(r);
    p->sb = new_sampler(kind, seed);
    p->st = new_sampler(kind, seed);
    if (!p->b || !p->t || history == 0) return;
    int32_t toks[HIST_MAX];
    rnd_tokens(r, toks, (int)history);
    /* the same history the same way: steps of the program's max_write */
    CHECK_OK(og_session_eval(p->b, toks, history, 0, NULL, 0));
    CHECK_OK(og_session_eval(p->t, toks, history, 0, NULL, 0));
}

static void pair_free(pair *p) {
    og_session_destroy(p->b);
    og_session_destroy(p->t);
    og_sampler_destroy(p->sb);
    og_sampler_destroy(p->st);
    memset(p, 0, sizeof *p);
}

/* Compares a batched session with its twin: length, metrics, committed rows. */
static bool pair_same(const pair *p, char *why, size_t cap) {
    snap a, b;
    snap_take(p->b, &a);
    snap_take(p->t, &b);
    bool same = true;
    if (a.length != b.length) {
        snprintf(why, cap, "length %lld, alone %lld", (long long)a.length, (long long)b.length);
        same = false;
    } else if (a.met.rows_allocated != b.met.rows_allocated || a.met.growth_count != b.met.growth_count ||
               a.met.steps != b.met.steps || a.met.bytes_allocated != b.met.bytes_allocated) {
        snprintf(why, cap, "metrics differ (rows %lld/%lld, growths %lld/%lld, steps %lld/%lld)",
                 (long long)a.met.rows_allocated, (long long)b.met.rows_allocated, (long long)a.met.growth_count,
                 (long long)b.met.growth_count, (long long)a.met.steps, (long long)b.met.steps);
        same = false;
    } else if (a.n != b.n || (a.n && memcmp(a.bytes, b.bytes, a.n))) {
        snprintf(why, cap, "committed KV rows differ (%zu vs %zu bytes)", a.n, b.n);
        same = false;
    }
    free(a.bytes);
    free(b.bytes);
    return same;
}

/* One random item for session s (tokens into toks, logits into lg). */
static og_batch_item random_item(og_rng *r, og_session *s, og_sampler *smp, int32_t *toks, float *lg) {
    og_batch_item it = {.session = s, .tokens = toks, .logits = lg};
    it.n_tokens = rnd(r, 2) ? 1 : 2 + rnd(r, MAX_WRITE - 1);
    rnd_tokens(r, toks, it.n_tokens);
    it.output = (og_step_output)rnd(r, OG_OUTPUT_COUNT);
    if (it.output == OG_OUTPUT_SAMPLE) it.sampler = smp;
    if (it.output != OG_OUTPUT_LOGITS && it.output != OG_OUTPUT_LOGITS_ALL) it.logits = NULL;
    it.token = -7;
    return it;
}

static void check_batched_equals_alone(const variant *v, int K, uint64_t seed) {
    og_model *m = g_prog[v->prog];
    og_rng r = og_rng_seed(seed);
    const int P = K + 2;
    pair pool[POOL_MAX] = {{0}};
    /* fresh, at the initial capacity, past the ring's wrap, long */
    static const int64_t start[] = {0, 9, INIT_CAP, 1, 31, 60, 17, 0, 8, 3};
    for (int i = 0; i < P; i++) pair_new(&pool[i], v, &r, start[i]);
    static int32_t toks[POOL_MAX][MAX_WRITE];
    static float lg_b[POOL_MAX][MAX_WRITE * V], lg_t[MAX_WRITE * V];
    int64_t mismatches = 0, steps_ok = 0, mixed = 0;
    char why[256];
    for (int step = 0; step < 40 && !mismatches; step++) {
        /* leaves, joins and resets between steps */
        if (step > 0 && rnd(&r, 4) == 0) {
            int i = rnd(&r, P);
            if (rnd(&r, 2)) {
                og_session_reset(pool[i].b);
                og_session_reset(pool[i].t);
            } else {
                pair_free(&pool[i]);
                pair_new(&pool[i], v, &r, rnd(&r, 12));
            }
        }
        int order[POOL_MAX];
        for (int i = 0; i < P; i++) order[i] = i;
        for (int i = P - 1; i > 0; i--) {
            int j = rnd(&r, i + 1), x = order[i];
            order[i] = order[j], order[j] = x;
        }
        og_batch_item items[POOL_MAX];
        int n = 0, n_rows = 0, decode = 0;
        for (int k = 0; k < K; k++) {
            pair *p = &pool[order[k]];
            items[n] = random_item(&r, p->b, p->sb, toks[k], lg_b[k]);
            if (og_session_length(p->b) + items[n].n_tokens > MAX_CAP) {
                og_session_reset(p->b);
                og_session_reset(p->t);
            }
            og_poison(lg_b[k], (size_t)MAX_WRITE * V);
            n_rows += items[n].n_tokens;
            decode += items[n].n_tokens == 1;
            n++;
        }
        mixed += decode > 0 && decode < n;
        og_model_metrics m0, m1;
        og_model_metrics_get(m, &m0);
        og_status st = og_model_step(m, items, n);
        og_model_metrics_get(m, &m1);
        CHECK_MSG(st == OG_OK, "%s K=%d step %d: %s", v->name, K, step, og_last_error());
        if (st != OG_OK) break;
        CHECK_MSG(m1.steps == m0.steps + 1 && m1.rows == m0.rows + n_rows,
                  "%s K=%d step %d: model metrics steps +%lld rows +%lld, want +1 +%d", v->name, K, step,
                  (long long)(m1.steps - m0.steps), (long long)(m1.rows - m0.rows), n_rows);
        /* the step's phases: the CPU computes in submit and never waits */
        CHECK_MSG(m1.prepare_seconds >= m0.prepare_seconds && m1.submit_seconds > m0.submit_seconds &&
                      m1.wait_seconds == 0 && m1.finish_seconds >= m0.finish_seconds,
                  "%s K=%d step %d: phases prepare %g submit %g wait %g finish %g", v->name, K, step,
                  m1.prepare_seconds, m1.submit_seconds, m1.wait_seconds, m1.finish_seconds);
        steps_ok++;
        /* the twins, each alone */
        for (int k = 0; k < n; k++) {
            pair *p = &pool[order[k]];
            og_batch_item t = items[k];
            t.session = p->t;
            t.sampler = t.output == OG_OUTPUT_SAMPLE ? p->st : NULL;
            t.logits = items[k].logits ? lg_t : NULL;
            t.token = -7;
            og_poison(lg_t, (size_t)MAX_WRITE * V);
            st = og_model_step(m, &t, 1);
            CHECK_MSG(st == OG_OK, "%s K=%d step %d item %d alone: %s", v->name, K, step, k, og_last_error());
            const size_t nl = logits_floats(&items[k]);
            bool same = st == OG_OK;
            if (same && nl && memcmp(items[k].logits, t.logits, nl * sizeof(float))) {
                snprintf(why, sizeof why, "logits differ (output %d, %d tokens)", (int)t.output, t.n_tokens);
                same = false;
            }
            if (same && (t.output == OG_OUTPUT_ARGMAX || t.output == OG_OUTPUT_SAMPLE) && t.token != items[k].token) {
                snprintf(why, sizeof why, "token %d, alone %d (output %d)", items[k].token, t.token, (int)t.output);
                same = false;
            }
            if (same && nl && all_poisoned(items[k].logits, nl)) {
                snprintf(why, sizeof why, "logits not written");
                same = false;
            }
            if (same) same = pair_same(p, why, sizeof why);
            CHECK_MSG(same, "%s K=%d step %d item %d (session %d, length %lld): %s", v->name, K, step, k, order[k],
                      (long long)og_session_length(p->t), why);
            mismatches += !same;
        }
    }
    CHECK_MSG(steps_ok == 40, "%s K=%d: %lld of 40 steps ran", v->name, K, (long long)steps_ok);
    if (K > 1) CHECK_MSG(mixed > 0, "%s K=%d: no batch mixed decode items and prompt chunks", v->name, K);
    for (int i = 0; i < P; i++) pair_free(&pool[i]);
}

static void test_batched_equals_alone(void) {
    og_test_section("1. batched equals alone, bit for bit");
    static const int Ks[] = {1, 2, 3, 5, 8};
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        if (k_variants[vi].paged && !g_have_paged) continue;
        for (int ki = 0; ki < 5; ki++) check_batched_equals_alone(&k_variants[vi], Ks[ki], 1000u * (uint64_t)vi + (uint64_t)ki + 1);
    }
}

/* ------------------------------------------------------------ 2. against the reference */

static void check_reference(const variant *v, double atol, double rtol) {
    og_model *m = g_prog[v->prog];
    enum { K = 4, STEPS = 24 };
    og_rng r = og_rng_seed(77 + (uint64_t)v->prog * 5 + (uint64_t)v->kv);
    og_session *b[K], *ref[K];
    for (int k = 0; k < K; k++) {
        b[k] = new_session(v, NULL);
        ref[k] = new_session(v, NULL);
        if (!b[k] || !ref[k]) return;
    }
    static int32_t toks[K][MAX_WRITE];
    static float lg[K][MAX_WRITE * V], want[MAX_WRITE * V];
    double worst = 0, worst_err = 0;
    int64_t rows = 0;
    for (int step = 0; step < STEPS; step++) {
        og_batch_item items[K];
        for (int k = 0; k < K; k++) {
            items[k] = (og_batch_item){.session = b[k], .tokens = toks[k], .logits = lg[k]};
            /* session k starts with prompt chunks; later mostly decode */
            items[k].n_tokens = step < k + 2 || rnd(&r, 3) == 0 ? 1 + rnd(&r, MAX_WRITE) : 1;
            items[k].output = rnd(&r, 2) ? OG_OUTPUT_LOGITS_ALL : OG_OUTPUT_LOGITS;
            rnd_tokens(&r, toks[k], items[k].n_tokens);
        }
        CHECK_OK(og_model_step(m, items, K));
        for (int k = 0; k < K; k++) {
            const og_batch_item *it = &items[k];
            CHECK_OK(og_session_eval(ref[k], it->tokens, it->n_tokens, 1, want, 1));
            const bool all = it->output == OG_OUTPUT_LOGITS_ALL;
            const float *w = all ? want : want + (size_t)(it->n_tokens - 1) * V;
            const size_t n = (all ? (size_t)it->n_tokens : 1) * V;
            size_t at = 0;
            const double ratio = og_tol_ratio(it->logits, w, n, atol, rtol, &at);
            if (ratio > worst) worst = ratio;
            for (size_t i = 0; i < n; i++) {
                const double err = fabs((double)it->logits[i] - (double)w[i]);
                if (err > worst_err) worst_err = err;
            }
            CHECK_MSG(ratio <= 1, "%s step %d session %d (%d tokens at %lld): %.3g of the tolerance at %zu (%g vs %g)",
                      v->name, step, k, it->n_tokens, (long long)og_session_length(b[k]) - it->n_tokens, ratio, at,
                      (double)it->logits[at], (double)w[at]);
            rows += (int64_t)(n / V);
        }
    }
    printf("  %s: %lld rows against the token-by-token reference, worst %.3g of the tolerance (|err| %.3g)\n", v->name,
           (long long)rows, worst, worst_err);
    for (int k = 0; k < K; k++) {
        og_session_destroy(b[k]);
        og_session_destroy(ref[k]);
    }
}

static void test_reference(void) {
    og_test_section("2. batched logits against token-by-token steps");
    /* f32 program, f32 KV: the only difference is the order of the f32 sums
     * of a product over T rows (blocked) against one row (a dot product per
     * output), over K <= 24 terms, through 2 layers: logits of |z| <~ 2
     * agree to a few ulps of f32 times the depth (~1e-6 seen); 1e-5 leaves
     * room and still sees a wrong row or position (>= 1e-2). */
    check_reference(&k_variants[0], 1e-5, 1e-5);
    /* f32 program, bf16 KV: the same sums, but a k or v that differs in its
     * last f32 bits may round to the neighbouring bf16 (2^-8 relative) when
     * stored; one such element moves a score by |q| * 2^-8 * |k| <~ 1e-2
     * and a logit by less: 2e-3 absolute and relative. */
    check_reference(&k_variants[1], 2e-3, 2e-3);
    /* bf16 program: a prompt chunk rounds every product's input activations
     * to bf16 (up to 2^-8 relative per rounding, ~10 roundings deep),
     * decode keeps them in f32: logits differ by ~2e-2 of their scale at
     * most in the rare worst case; 5e-2 absolute and relative. */
    check_reference(&k_variants[2], 5e-2, 5e-2);
}

/* ------------------------------------------------------------ 3. all or nothing
 *
 * When item j of a batch fails to prepare (an allocation, or
 * OG_ERR_CAPACITY), the sessions of items 0 .. j-1 were already prepared:
 * og_model_step rolls each back (og_kv_session_rollback), storage included,
 * so that "no session advances or changes" (DESIGN.md section 7): a fresh
 * session gives back its first storage, a dense flat layer that grew keeps
 * its old block, addresses, rows_allocated, bytes_allocated, growth_count and
 * rebinds, a packed block is backed no further. The checks below compare
 * every session with a twin stepped without faults, after every fault the
 * batch can meet; an earlier version of og_model_step only aborted the
 * prepared sessions (keeping what they had grown) and failed them. */

enum { FK = 6 };

/* The batch of the fault tests: a fresh session (first allocations), one at
 * the initial capacity (dense: a growth), one past the ring's wrap, one
 * about to cross 160 rows (dense, whose rows went 5, 10, ..., 160: a
 * growth), one in the middle, one about to cross 128 rows (packed: one more
 * page of 4 KiB); every output kind. */
static const int64_t k_fault_len[FK] = {0, INIT_CAP, 9, 158, 15, 125};
static const int32_t k_fault_T[FK] = {3, 2, 1, 5, 1, 5};
static const og_step_output k_fault_out[FK] = {OG_OUTPUT_LOGITS, OG_OUTPUT_LOGITS_ALL, OG_OUTPUT_SAMPLE,
                                               OG_OUTPUT_ARGMAX, OG_OUTPUT_NONE,    OG_OUTPUT_SAMPLE};

typedef struct fault_set {
    og_kv_fault_state st[FK]; /* per session, or [0] shared */
    og_kv_allocator alloc[FK];
    og_session *s[FK];
    og_sampler *smp[FK];
    og_batch_item items[FK];
    float lg[FK][MAX_WRITE * V];
} fault_set;

/* Sessions with the fault batch's history (no faults armed), items ready. */
static void fault_set_build(fault_set *f, const variant *v, bool shared, const int32_t *hist,
                            int32_t toks[FK][MAX_WRITE]) {
    memset(f, 0, sizeof *f);
    for (int k = 0; k < FK; k++) {
        og_kv_fault_state *st = &f->st[shared ? 0 : k];
        if (!shared || k == 0) st->inner = v->paged ? g_paged : og_kv_allocator_cpu();
        f->alloc[k] = og_kv_allocator_faulty(st);
        f->s[k] = new_session(v, &f->alloc[k]);
        f->smp[k] = new_sampler(1 + k, 99);
        if (!f->s[k]) continue;
        if (k_fault_len[k]) CHECK_OK(og_session_eval(f->s[k], hist, k_fault_len[k], 0, NULL, 0));
        for (int t = 0; t < k_fault_len[k]; t++) og_sampler_accept(f->smp[k], hist[t]);
        f->items[k] = (og_batch_item){.session = f->s[k], .tokens = toks[k], .n_tokens = k_fault_T[k],
                                      .output = k_fault_out[k], .token = -7};
        if (k_fault_out[k] == OG_OUTPUT_LOGITS || k_fault_out[k] == OG_OUTPUT_LOGITS_ALL) f->items[k].logits = f->lg[k];
        if (k_fault_out[k] == OG_OUTPUT_SAMPLE) f->items[k].sampler = f->smp[k];
        og_poison(f->lg[k], (size_t)MAX_WRITE * V);
    }
    for (int k = 0; k < FK; k++) og_kv_fault_arm(&f->st[k], 0);
}

static void fault_set_free(fault_set *f) {
    for (int k = 0; k < FK; k++) {
        og_session_destroy(f->s[k]);
        og_sampler_destroy(f->smp[k]);
    }
}

/* The outputs of a successful batch match the twins'. */
static bool fault_outputs_same(const fault_set *got, const fault_set *want, char *why, size_t cap) {
    for (int k = 0; k < FK; k++) {
        const size_t nl = logits_floats(&got->items[k]);
        if (nl && memcmp(got->lg[k], want->lg[k], nl * sizeof(float))) {
            snprintf(why, cap, "item %d: logits differ from the twin's", k);
            return false;
        }
        if ((k_fault_out[k] == OG_OUTPUT_ARGMAX || k_fault_out[k] == OG_OUTPUT_SAMPLE) &&
            got->items[k].token != want->items[k].token) {
            snprintf(why, cap, "item %d: token %d, twin %d", k, got->items[k].token, want->items[k].token);
            return false;
        }
        pair p = {.b = got->s[k], .t = want->s[k]};
        char w2[200];
        if (!pair_same(&p, w2, sizeof w2)) {
            snprintf(why, cap, "item %d: %s", k, w2);
            return false;
        }
    }
    return true;
}

static void check_faults(const variant *v, bool shared) {
    og_model *m = g_prog[v->prog];
    og_rng r = og_rng_seed(4242);
    int32_t hist[160];
    static int32_t toks[FK][MAX_WRITE];
    rnd_tokens(&r, hist, 160);
    for (int k = 0; k < FK; k++) rnd_tokens(&r, toks[k], MAX_WRITE);
    const char *mode = shared ? "one shared fault state" : "a fault state per session";

    /* the twins: each session stepped alone, without faults, counting the
     * allocations each state sees */
    static fault_set twin, f;
    fault_set_build(&twin, v, shared, hist, toks);
    int64_t count[FK] = {0};
    for (int k = 0; k < FK; k++) {
        CHECK_OK(og_model_step(m, &twin.items[k], 1));
        count[shared ? 0 : k] = twin.st[shared ? 0 : k].alloc_calls;
    }
    int64_t total = 0;
    for (int k = 0; k < FK; k++) total += count[k];
    CHECK_MSG(total >= 3, "%s, %s: the batch makes only %lld allocations", v->name, mode, (long long)total);

    /* the batch without faults counts the same allocations */
    fault_set_build(&f, v, shared, hist, toks);
    CHECK_OK(og_model_step(m, f.items, FK));
    for (int k = 0; k < FK; k++)
        CHECK_MSG(f.st[k].alloc_calls == count[k], "%s, %s: state %d saw %lld allocations in the batch, %lld alone",
                  v->name, mode, k, (long long)f.st[k].alloc_calls, (long long)count[k]);
    char why[256];
    CHECK_MSG(fault_outputs_same(&f, &twin, why, sizeof why), "%s, %s, no fault: %s", v->name, mode, why);
    fault_set_free(&f);

    int64_t cases = 0, bad = 0;
    for (int sk = 0; sk < FK; sk++) {
        for (int64_t n = 1; n <= count[sk]; n++) {
            fault_set_build(&f, v, shared, hist, toks);
            snap before[FK];
            sampler_snap sb[FK];
            for (int k = 0; k < FK; k++) {
                snap_take(f.s[k], &before[k]);
                sampler_take(f.smp[k], &sb[k]);
            }
            og_model_metrics m0, m1;
            og_model_metrics_get(m, &m0);
            og_kv_fault_arm(&f.st[sk], n);
            og_status st = og_model_step(m, f.items, FK);
            og_model_metrics_get(m, &m1);
            char msg[400];
            snprintf(msg, sizeof msg, "%s", og_last_error());
            cases++;
            bool ok = true;
            char w[1024] = "";
            if (st != OG_ERR_OUT_OF_MEMORY) {
                snprintf(w, sizeof w, "status %s, want out_of_memory (%s)", og_status_str(st), msg);
                ok = false;
            }
            if (ok && f.st[sk].failures != 1) {
                snprintf(w, sizeof w, "the fault state refused %lld allocations", (long long)f.st[sk].failures);
                ok = false;
            }
            if (ok && !strstr(msg, "item ")) {
                snprintf(w, sizeof w, "the message names no item: %s", msg);
                ok = false;
            }
            if (ok && !shared) {
                char name[32];
                snprintf(name, sizeof name, "item %d", sk);
                if (!strstr(msg, name)) {
                    snprintf(w, sizeof w, "the message does not name %s: %s", name, msg);
                    ok = false;
                }
            }
            if (ok && (m1.steps != m0.steps || m1.rows != m0.rows)) {
                snprintf(w, sizeof w, "the model counted a failed step");
                ok = false;
            }
            /* every session that changed, by item */
            for (int k = 0; ok && k < FK; k++) {
                char w2[256];
                if (!snap_same(f.s[k], &before[k], w2, sizeof w2)) {
                    const size_t used = strlen(w);
                    snprintf(w + used, sizeof w - used, "%ssession of item %d (length %lld) changed: %s",
                             used ? "; " : "", k, (long long)k_fault_len[k], w2);
                }
            }
            if (w[0]) ok = false;
            for (int k = 0; ok && k < FK; k++) {
                if (!all_poisoned(f.lg[k], (size_t)MAX_WRITE * V)) {
                    snprintf(w, sizeof w, "item %d: logits written by a failed step", k);
                    ok = false;
                } else if (!sampler_same(f.smp[k], &sb[k])) {
                    snprintf(w, sizeof w, "item %d: the sampler moved", k);
                    ok = false;
                } else if (f.items[k].token != -7) {
                    snprintf(w, sizeof w, "item %d: token written (%d)", k, f.items[k].token);
                    ok = false;
                }
            }
            /* the same batch without faults */
            og_kv_fault_arm(&f.st[sk], 0);
            st = og_model_step(m, f.items, FK);
            if (ok && st != OG_OK) {
                snprintf(w, sizeof w, "the batch without faults then fails: %s", og_last_error());
                ok = false;
            }
            if (ok && !fault_outputs_same(&f, &twin, w, sizeof w)) ok = false;
            CHECK_MSG(ok, "%s, %s: allocation %lld of state %d made to fail: %s", v->name, mode, (long long)n, sk, w);
            bad += !ok;
            for (int k = 0; k < FK; k++) free(before[k].bytes);
            fault_set_free(&f);
        }
    }
    printf("  %s, %s: %lld allocations made to fail in turn, %lld cases wrong\n", v->name, mode, (long long)cases,
           (long long)bad);
    fault_set_free(&twin);
}

static void check_capacity(const variant *v) {
    og_model *m = g_prog[v->prog];
    og_rng r = og_rng_seed(31337);
    enum { CK = 4 };
    static int32_t hist[MAX_CAP];
    rnd_tokens(&r, hist, MAX_CAP);
    /* a fresh session first (it would allocate), a growing one, the full
     * one, a decode one after it */
    const int64_t len[CK] = {0, INIT_CAP, MAX_CAP - 2, 9};
    const int32_t T[CK] = {2, 3, 3, 1};
    og_session *s[CK];
    og_sampler *smp = new_sampler(2, 5);
    int32_t toks[CK][MAX_WRITE];
    float lg[CK][MAX_WRITE * V];
    og_batch_item items[CK];
    snap before[CK];
    sampler_snap sb;
    for (int k = 0; k < CK; k++) {
        s[k] = new_session(v, NULL);
        if (!s[k]) return;
        if (len[k]) CHECK_OK(og_session_eval(s[k], hist, len[k], 0, NULL, 0));
        rnd_tokens(&r, toks[k], MAX_WRITE);
        og_poison(lg[k], (size_t)MAX_WRITE * V);
        items[k] = (og_batch_item){.session = s[k], .tokens = toks[k], .n_tokens = T[k], .token = -7,
                                   .output = k == 3 ? OG_OUTPUT_SAMPLE : OG_OUTPUT_LOGITS_ALL,
                                   .logits = k == 3 ? NULL : lg[k], .sampler = k == 3 ? smp : NULL};
        snap_take(s[k], &before[k]);
    }
    sampler_take(smp, &sb);
    og_status st = og_model_step(m, items, CK);
    CHECK_MSG(st == OG_ERR_CAPACITY, "%s: a batch with a full session returned %s (%s)", v->name, og_status_str(st),
              og_last_error());
    CHECK_MSG(strstr(og_last_error(), "item 2") != NULL, "%s: the message does not name item 2: %s", v->name,
              og_last_error());
    for (int k = 0; k < CK; k++) {
        char w[256];
        CHECK_MSG(snap_same(s[k], &before[k], w, sizeof w), "%s: capacity refusal changed the session of item %d: %s",
                  v->name, k, w);
        CHECK_MSG(all_poisoned(lg[k], (size_t)MAX_WRITE * V), "%s: capacity refusal wrote logits of item %d", v->name, k);
        CHECK(items[k].token == -7);
        free(before[k].bytes);
    }
    CHECK_MSG(sampler_same(smp, &sb), "%s: capacity refusal moved the sampler", v->name);
    /* without the full session the rest steps */
    items[2] = items[3];
    CHECK_OK(og_model_step(m, items, CK - 1));
    for (int k = 0; k < CK; k++) og_session_destroy(s[k]);
    og_sampler_destroy(smp);
}

static void test_all_or_nothing(void) {
    og_test_section("3. a batch is all or nothing");
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        const variant *v = &k_variants[vi];
        if (v->paged && !g_have_paged) continue;
        check_faults(v, false);
        check_faults(v, true);
        check_capacity(v);
    }
    /* the same with the sessions prepared on the model's threads, as steps
     * of many sessions are (exec.c, prepare_all); a fault state per session,
     * since a shared one would be counted from two threads at once */
    int32_t found[2];
    for (int p = 0; p < 2; p++) {
        found[p] = g_prog[p]->prepare_parallel_min;
        g_prog[p]->prepare_parallel_min = 2;
    }
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        const variant *v = &k_variants[vi];
        if (v->paged && !g_have_paged) continue;
        check_faults(v, false);
        check_capacity(v);
    }
    for (int p = 0; p < 2; p++) g_prog[p]->prepare_parallel_min = found[p];
}

/* ------------------------------------------------------------ 4. refusals */

enum { RK = 3 };

typedef struct refusal_set {
    og_session *s[RK];
    og_sampler *smp[RK];
    int32_t toks[RK][MAX_WRITE];
    float lg[RK][MAX_WRITE * V];
    og_batch_item items[RK];
    snap before[RK];
    sampler_snap sb[RK];
    og_model_metrics mm;
} refusal_set;

static void refusal_items(refusal_set *f) {
    for (int k = 0; k < RK; k++) {
        og_poison(f->lg[k], (size_t)MAX_WRITE * V);
        f->items[k] = (og_batch_item){.session = f->s[k], .tokens = f->toks[k], .n_tokens = k == 1 ? 1 : 3,
                                      .output = (og_step_output)(k + 1), .logits = f->lg[k], .token = -7};
        if (k == 2) f->items[k].output = OG_OUTPUT_SAMPLE, f->items[k].sampler = f->smp[k], f->items[k].logits = NULL;
        for (int t = 0; t < MAX_WRITE; t++) f->toks[k][t] = (int32_t)((k * 7 + t * 3) % V);
    }
}

/* Runs the (broken) items: the status, a message naming `name`, nothing changed. */
static void refused(refusal_set *f, og_model *m, og_batch_item *items, int32_t n, og_status want, const char *name,
                    const char *what) {
    for (int k = 0; k < RK; k++) {
        snap_take(f->s[k], &f->before[k]);
        sampler_take(f->smp[k], &f->sb[k]);
    }
    og_model_metrics_get(m, &f->mm);
    og_status st = og_model_step(m, items, n);
    CHECK_MSG(st == want, "%s: status %s, want %s (%s)", what, og_status_str(st), og_status_str(want), og_last_error());
    CHECK_MSG(strstr(og_last_error(), name) != NULL, "%s: the message does not name \"%s\": %s", what, name,
              og_last_error());
    og_model_metrics mm;
    og_model_metrics_get(m, &mm);
    CHECK_MSG(mm.steps == f->mm.steps && mm.rows == f->mm.rows, "%s: the model counted a refused step", what);
    for (int k = 0; k < RK; k++) {
        char w[256];
        CHECK_MSG(snap_same(f->s[k], &f->before[k], w, sizeof w), "%s: session %d changed: %s", what, k, w);
        CHECK_MSG(all_poisoned(f->lg[k], (size_t)MAX_WRITE * V), "%s: logits of session %d written", what, k);
        CHECK_MSG(sampler_same(f->smp[k], &f->sb[k]), "%s: sampler %d moved", what, k);
        CHECK_MSG(f->items[k].token == -7, "%s: token of item %d written", what, k);
        CHECK_MSG(atomic_load(&f->s[k]->stepping) == 0 || (k == 2 && !strcmp(what, "a session already stepping")),
                  "%s: session %d left marked as stepping", what, k);
        free(f->before[k].bytes);
    }
    refusal_items(f);
}

static void test_refusals(void) {
    og_test_section("4. refusals name the item and change nothing");
    const variant *v = &k_variants[0];
    og_model *m = g_prog[v->prog];
    static refusal_set f;
    int32_t hist[12];
    for (int t = 0; t < 12; t++) hist[t] = (int32_t)((t * 5 + 1) % V);
    for (int k = 0; k < RK; k++) {
        f.s[k] = new_session(v, NULL);
        f.smp[k] = new_sampler(k + 1, 3);
        if (!f.s[k] || !f.smp[k]) return;
        if (k) CHECK_OK(og_session_eval(f.s[k], hist, 4 * k, 0, NULL, 0));
    }
    og_session *foreign = NULL;
    og_sampler *wide = NULL;
    CHECK_OK(og_session_create(g_other, NULL, &foreign));
    og_sampler_params sp = sampler_params(1, 3);
    CHECK_OK(og_sampler_create(&sp, V + 3, &wide));
    refusal_items(&f);
    og_batch_item *it = f.items;

    refused(&f, m, it, 0, OG_ERR_INVALID_ARGUMENT, "no items", "n_items 0");
    refused(&f, m, it, -1, OG_ERR_INVALID_ARGUMENT, "no items", "n_items -1");
    refused(&f, m, NULL, 2, OG_ERR_INVALID_ARGUMENT, "og_model_step", "items NULL");
    it[1].session = NULL;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 1", "a NULL session");
    it[2].tokens = NULL;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 2", "NULL tokens");
    it[0].n_tokens = 0;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 0", "n_tokens 0");
    it[2].n_tokens = -3;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 2", "n_tokens -3");
    it[1].n_tokens = MAX_WRITE + 1;
    refused(&f, m, it, RK, OG_ERR_WRITE_TOO_WIDE, "item 1", "n_tokens > max_write");
    f.toks[2][1] = V;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 2", "a token id = vocab");
    f.toks[0][2] = -1;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 0", "a token id < 0");
    if (foreign) {
        it[1].session = foreign;
        refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 1", "a session of another model");
        CHECK(og_session_length(foreign) == 0);
    }
    it[2].session = it[0].session;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "items 0 and 2", "the same session twice");
    it[0].output = OG_OUTPUT_SAMPLE;
    it[0].sampler = it[2].sampler;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "items 0 and 2", "two items sharing one sampler");
    it[0].logits = NULL;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 0", "LOGITS with logits NULL");
    it[1].output = OG_OUTPUT_LOGITS_ALL;
    it[1].logits = NULL;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 1", "LOGITS_ALL with logits NULL");
    it[2].sampler = NULL;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 2", "SAMPLE without a sampler");
    it[2].sampler = wide;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 2", "SAMPLE with a sampler of another vocabulary");
    it[1].output = (og_step_output)OG_OUTPUT_COUNT;
    refused(&f, m, it, RK, OG_ERR_INVALID_ARGUMENT, "item 1", "an unknown output");
    /* another thread's step holds session 2: refused, and the flag it set
     * is still set afterwards (only the stepping thread clears it) */
    atomic_store(&f.s[2]->stepping, 1);
    refused(&f, m, it, RK, OG_ERR_STATE, "item 2", "a session already stepping");
    CHECK_MSG(atomic_load(&f.s[2]->stepping) == 1, "a refused step cleared another thread's stepping flag");
    CHECK(atomic_load(&f.s[0]->stepping) == 0 && atomic_load(&f.s[1]->stepping) == 0);
    atomic_store(&f.s[2]->stepping, 0);
    /* and the unbroken batch steps */
    CHECK_OK(og_model_step(m, it, RK));
    for (int k = 0; k < RK; k++) CHECK(og_session_length(f.s[k]) == (k ? 4 * k : 0) + it[k].n_tokens);
    for (int k = 0; k < RK; k++) {
        og_session_destroy(f.s[k]);
        og_sampler_destroy(f.smp[k]);
    }
    og_session_destroy(foreign);
    og_sampler_destroy(wide);
}

/* ------------------------------------------------------------ 5. threads */

enum { TH = 4, TH_STEPS = 50 };

typedef struct th_job {
    og_model *m;
    int id;
    int32_t out[2][TH_STEPS];
    og_status st;
} th_job;

static void *th_run(void *arg) {
    th_job *j = arg;
    og_session *s[2] = {0};
    /* no CHECK here: the harness's counters belong to the main thread */
    og_sampler_params sp = sampler_params(2, (uint64_t)j->id + 10);
    og_sampler *smp = NULL;
    j->st = og_sampler_create(&sp, V, &smp);
    for (int k = 0; k < 2 && j->st == OG_OK; k++) j->st = og_session_create(j->m, NULL, &s[k]);
    int32_t prompt[2][MAX_WRITE];
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < MAX_WRITE; t++) prompt[k][t] = (int32_t)((j->id * 11 + k * 5 + t * 3) % V);
    /* a prompt chunk each, then decode: session 0 arg-max, session 1 sampled */
    og_batch_item it[2] = {
        {.session = s[0], .tokens = prompt[0], .n_tokens = 2 + j->id % 4, .output = OG_OUTPUT_ARGMAX},
        {.session = s[1], .tokens = prompt[1], .n_tokens = MAX_WRITE, .output = OG_OUTPUT_SAMPLE, .sampler = smp},
    };
    for (int t = 0; t < TH_STEPS && j->st == OG_OK; t++) {
        j->st = og_model_step(j->m, it, 2);
        j->out[0][t] = it[0].token;
        j->out[1][t] = it[1].token;
        it[0].tokens = &j->out[0][t], it[0].n_tokens = 1;
        it[1].tokens = &j->out[1][t], it[1].n_tokens = 1;
    }
    og_session_destroy(s[0]);
    og_session_destroy(s[1]);
    og_sampler_destroy(smp);
    return NULL;
}

static void test_threads(void) {
    og_test_section("5. threads stepping their own sessions");
    for (int p = 0; p < 2; p++) {
        static th_job seq[TH], par[TH];
        for (int i = 0; i < TH; i++) {
            seq[i] = (th_job){.m = g_prog[p], .id = i};
            par[i] = seq[i];
            th_run(&seq[i]);
            CHECK_OK(seq[i].st);
        }
        pthread_t th[TH];
        for (int i = 0; i < TH; i++) CHECK(pthread_create(&th[i], NULL, th_run, &par[i]) == 0);
        for (int i = 0; i < TH; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < TH; i++) {
            CHECK_OK(par[i].st);
            CHECK_MSG(!memcmp(seq[i].out, par[i].out, sizeof seq[i].out),
                      "program %d thread %d: tokens differ from the single-threaded run", p, i);
        }
    }
}

/* ------------------------------------------------------------ main */

int main(void) {
    char dir[] = "/tmp/og_test_batch_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[2][600];
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    for (int p = 0; p < 2; p++) {
        snprintf(path[p], sizeof path[p], "%s/batch_%s.ogp", dir, p ? "bf16" : "f32");
        og_fixture_opts o = {.max_capacity = MAX_CAP, .activation_dtype = p ? OG_DTYPE_BF16 : OG_DTYPE_F32,
                             .initial_capacity = INIT_CAP, .max_write = MAX_WRITE, .window = WINDOW,
                             .well_scaled = true};
        CHECK_OK(og_fixture_write_program(path[p], &o));
        CHECK_OK(og_model_load(path[p], &mp, &g_prog[p]));
    }
    CHECK_OK(og_model_load(path[0], &mp, &g_other));
    og_status st = og_kv_allocator_paged(&g_paged);
    g_have_paged = st == OG_OK;
    if (!g_have_paged) printf("no paged allocator here (%s): packed variants skipped\n", og_status_str(st));
    if (g_prog[0] && g_prog[1] && g_other) {
        const og_kv_config *kc = og_model_kv_config(g_prog[0]);
        CHECK(kc->max_write == MAX_WRITE && kc->initial_capacity == INIT_CAP && kc->layers[1].window == WINDOW &&
              kc->layers[0].policy == OG_KV_FLAT && kc->layers[1].policy == OG_KV_RING &&
              og_kv_layer_slots(kc, &kc->layers[1]) == RING_R && og_model_vocab_size(g_prog[0]) == V);
        test_batched_equals_alone();
        test_reference();
        test_all_or_nothing();
        test_refusals();
        test_threads();
    }
    og_model_destroy(g_prog[0]);
    og_model_destroy(g_prog[1]);
    og_model_destroy(g_other);
    if (g_have_paged) og_kv_allocator_paged_release(&g_paged);
    for (int p = 0; p < 2; p++) remove(path[p]);
    rmdir(dir);
    return og_test_finish();
}
