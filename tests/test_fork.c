/* Forks of sessions, on the CPU:
 *   - KV level (og_kv_session_fork), over packed storage (the paged host
 *     allocator, which shares pages) and dense storage (the heap allocator,
 *     which copies), with flat and ring layers: after a fork the parent and
 *     the child each write rows of their own, and every row either reads
 *     back is the one it wrote or the common prefix (a child's writes are
 *     never visible to the parent, and the reverse); forks at 0, at a
 *     granule boundary, mid-granule and at the full length, forks of forks,
 *     either side destroyed or reset first; the shared bytes are the whole
 *     granules below the fork point and the host cost does not depend on
 *     the length; a fork below the ring layers' floor is refused naming the
 *     ring layer; an allocation failure at every allocation of a fork leaves
 *     the parent as it was and no child;
 *   - model level (og_session_fork on a Qwen3-shaped program with sliding
 *     window layers): a child decoding 32 tokens gives the logits of a fresh
 *     session fed the same tokens, bit for bit, and so does the parent
 *     decoding 32 other tokens interleaved with it; dense and packed
 *     storage.
 * Letters: L length, a fork point, P packed row bytes, R ring rows, W window. */
#include "harness.h"
#include "kv/kv.h"
#include "import/export.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HKV 2
#define HD 8
#define ROW_ELEMS (HKV * HD)

static const og_kv_layer_config k_flat_only[2] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .n_kv_heads = HKV, .head_dim = HD},
    {.layer_id = 1, .policy = OG_KV_FLAT, .n_kv_heads = HKV, .head_dim = HD},
};
static const og_kv_layer_config k_mixed[3] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .n_kv_heads = HKV, .head_dim = HD},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 6, .n_kv_heads = HKV, .head_dim = HD},
    {.layer_id = 2, .policy = OG_KV_FLAT, .n_kv_heads = HKV, .head_dim = HD},
};
#define MAX_WRITE 8
#define MAX_LEN 512

static og_kv_config make_cfg(const og_kv_layer_config *layers, int32_t n) {
    return (og_kv_config){.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_F32, .max_capacity = 4096,
                          .initial_capacity = 4, .max_write = MAX_WRITE, .n_model_layers = 3, .n_layers = n,
                          .layers = layers};
}

/* The value of element e of position p's row of layer i, part k (0) or v (1),
 * written by the writer `tag`. Exact in f32. */
static float value(int tag, int i, int part, int64_t p, int e) {
    return (float)(tag * 1000000 + i * 100000 + part * 50000 + (int)p * 16 + e);
}

/* A session and, for every position, the tag of the writer of its row. */
typedef struct tracked {
    og_kv_session *s;
    int tags[MAX_LEN];
} tracked;

/* Writes T rows at L through a prepared step and commits. */
static og_status write_step(tracked *t, int32_t T, int tag) {
    og_status st = og_kv_session_prepare(t->s, T);
    if (st != OG_OK) return st;
    const og_kv_config *cfg = og_kv_session_config(t->s);
    const int64_t L = og_kv_session_length(t->s);
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        og_kv_layer_view v;
        og_kv_session_layer_view(t->s, i, &v);
        const int64_t stride = og_kv_layer_view_row_stride(&v);
        for (int32_t r = 0; r < T; r++) {
            const int64_t p = L + r, slot = v.policy == OG_KV_RING ? p % v.rows : p;
            float *k = (float *)v.k + slot * stride, *vv = (float *)v.v + slot * stride;
            for (int e = 0; e < ROW_ELEMS; e++) {
                k[e] = value(tag, i, 0, p, e);
                vv[e] = value(tag, i, 1, p, e);
            }
        }
    }
    for (int32_t r = 0; r < T; r++) t->tags[L + r] = tag;
    return og_kv_session_commit(t->s, T);
}

static og_status write_n(tracked *t, int64_t n, int tag) {
    og_status st = OG_OK;
    for (int64_t done = 0; done < n && st == OG_OK;) {
        const int32_t T = (int32_t)(n - done < 5 ? n - done : 5); /* steps of 5 */
        st = write_step(t, T, tag);
        done += T;
    }
    return st;
}

/* Every row the session's next step can read holds what its writer wrote:
 * flat [0, L); ring the last W - 1 positions. Returns the number of wrong rows. */
static int verify(const tracked *t, const char *who) {
    const og_kv_config *cfg = og_kv_session_config(t->s);
    const int64_t L = og_kv_session_length(t->s);
    int bad = 0;
    float row[ROW_ELEMS];
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &cfg->layers[i];
        const int64_t from = l->policy == OG_KV_RING ? (L - l->window + 1 > 0 ? L - l->window + 1 : 0) : 0;
        for (int64_t p = from; p < L; p++)
            for (int part = 0; part < 2; part++) {
                og_status st = og_kv_session_rows_to_host(t->s, i, part, p, 1, row);
                int wrong = st != OG_OK;
                for (int e = 0; e < ROW_ELEMS && !wrong; e++) wrong = row[e] != value(t->tags[p], i, part, p, e);
                if (wrong && bad++ < 3)
                    fprintf(stderr, "  %s: layer %d part %d position %lld: %g, want %g (tag %d)\n", who, (int)i, part,
                            (long long)p, (double)row[0], (double)value(t->tags[p], i, part, p, 0), t->tags[p]);
            }
    }
    return bad;
}

static tracked fork_of(tracked *parent, int64_t a, og_status *st) {
    tracked c = {0};
    *st = og_kv_session_fork(parent->s, a, NULL, &c.s);
    memcpy(c.tags, parent->tags, sizeof c.tags);
    return c;
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Fork at a of a parent of length L; both write on; both verified. */
static void fork_case(const og_kv_allocator *alloc, const og_kv_config *cfg, int64_t L, int64_t a, const char *what) {
    tracked p = {0};
    CHECK_OK(og_kv_session_create(cfg, alloc, &p.s));
    CHECK_OK(write_n(&p, L, 1));
    og_status st;
    tracked c = fork_of(&p, a, &st);
    CHECK_MSG(st == OG_OK, "%s: fork at %lld of %lld: %s", what, (long long)a, (long long)L, og_last_error());
    if (st != OG_OK) {
        og_kv_session_destroy(p.s);
        return;
    }
    CHECK(og_kv_session_length(c.s) == a);
    og_kv_metrics pm, cm;
    og_kv_session_metrics(c.s, &cm);
    og_kv_session_metrics(p.s, &pm);
    if (alloc && alloc->share) {
        /* whole granules below a * P are shared */
        og_kv_layer_view v;
        og_kv_session_layer_view(c.s, 0, &v);
        const int64_t P = og_kv_layer_view_row_stride(&v) * 4, g = (int64_t)page_size();
        CHECK_MSG(cm.bytes_shared == a * P / g * g, "%s: shared %lld, want %lld", what, (long long)cm.bytes_shared,
                  (long long)(a * P / g * g));
    } else {
        CHECK(cm.bytes_shared == 0);
    }
    CHECK(pm.bytes_shared == 0);
    CHECK_MSG(verify(&c, "child after fork") == 0, "%s: child rows after fork at %lld", what, (long long)a);
    /* interleaved: each writes 40 rows of its own, in turns */
    for (int k = 0; k < 8; k++) {
        CHECK_OK(write_n(&c, 5, 3));
        CHECK_OK(write_n(&p, 5, 2));
    }
    CHECK_MSG(verify(&p, "parent") == 0, "%s: the parent sees only its own rows (fork at %lld)", what, (long long)a);
    CHECK_MSG(verify(&c, "child") == 0, "%s: the child sees only its own rows (fork at %lld)", what, (long long)a);
    /* a grandchild of the child, then the child's and the parent's ends */
    const int64_t cl = og_kv_session_length(c.s), ga = cl - 3;
    tracked g = fork_of(&c, ga, &st);
    CHECK_OK(st);
    if (st == OG_OK) {
        og_kv_session_destroy(p.s); /* the grandparent goes first */
        p.s = NULL;
        CHECK_OK(write_n(&g, 17, 4));
        og_kv_session_reset(c.s); /* the child starts over: must not touch shared rows */
        memset(c.tags, 0, sizeof c.tags);
        CHECK_OK(write_n(&c, 30, 5));
        CHECK_MSG(verify(&g, "grandchild") == 0, "%s: grandchild after its parents went on", what);
        CHECK_MSG(verify(&c, "child reset") == 0, "%s: child after a reset", what);
        og_kv_session_destroy(g.s);
    }
    og_kv_session_destroy(p.s);
    og_kv_session_destroy(c.s);
}

static void test_kv_forks(const og_kv_allocator *alloc, const char *name) {
    char what[128];
    /* flat only: any fork point. P = 2 layers * 2 parts * 64 bytes = 256:
     * 16 rows a page */
    og_kv_config flat = make_cfg(k_flat_only, 2);
    const int64_t per_page = (int64_t)page_size() / 256;
    const int64_t L = 3 * per_page + 5;
    const int64_t points[] = {0, 1, per_page, 2 * per_page, per_page + per_page / 2 + 1, L - 1, L};
    for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
        snprintf(what, sizeof what, "%s flat fork at %lld of %lld", name, (long long)points[k], (long long)L);
        og_test_section(what);
        fork_case(alloc, &flat, L, points[k], what);
    }
    /* flat and ring: R = 6 + 8 - 1 = 13 */
    og_kv_config mixed = make_cfg(k_mixed, 3);
    const int64_t R = 13;
    for (int64_t a = 0; a <= 11; a += 3) { /* L <= R: any point */
        snprintf(what, sizeof what, "%s ring fork at %lld of 11", name, (long long)a);
        og_test_section(what);
        fork_case(alloc, &mixed, 11, a, what);
    }
    const int64_t L2 = 5 * R + 2, floor = L2 - MAX_WRITE;
    for (int64_t a = floor; a <= L2; a += 3) {
        snprintf(what, sizeof what, "%s ring fork at %lld of %lld", name, (long long)a, (long long)L2);
        og_test_section(what);
        fork_case(alloc, &mixed, L2, a, what);
    }
    snprintf(what, sizeof what, "%s fork below the ring floor is refused", name);
    og_test_section(what);
    tracked p = {0};
    CHECK_OK(og_kv_session_create(&mixed, alloc, &p.s));
    CHECK_OK(write_n(&p, L2, 1));
    CHECK(og_kv_session_fork_floor(p.s) == floor);
    og_kv_session *c = NULL;
    CHECK_STATUS(og_kv_session_fork(p.s, floor - 1, NULL, &c), OG_ERR_UNSUPPORTED);
    CHECK(c == NULL && strstr(og_last_error(), "ring layer 1") != NULL);
    CHECK_STATUS(og_kv_session_fork(p.s, L2 + 1, NULL, &c), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_session_fork(p.s, -1, NULL, &c), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_session_fork(NULL, 0, NULL, &c), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_kv_session_prepare(p.s, 1));
    CHECK_STATUS(og_kv_session_fork(p.s, L2, NULL, &c), OG_ERR_STATE);
    og_kv_session_abort(p.s);
    og_kv_session_destroy(p.s);
}

/* Every allocation of a fork fails in turn: no child, the parent as it was. */
static void test_fork_faults(og_kv_allocator inner, const char *name) {
    char what[128];
    snprintf(what, sizeof what, "%s: a failure at every allocation of a fork", name);
    og_test_section(what);
    og_kv_fault_state fs = {.inner = inner};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    og_kv_config mixed = make_cfg(k_mixed, 3);
    tracked p = {0};
    CHECK_OK(og_kv_session_create(&mixed, &a, &p.s));
    CHECK_OK(write_n(&p, 40, 1));
    int64_t calls = 0;
    for (int64_t at = 1; at < 64; at++) {
        og_kv_fault_arm(&fs, at);
        og_kv_session *c = NULL;
        og_status st = og_kv_session_fork(p.s, 38, NULL, &c);
        if (st == OG_OK) {
            calls = at - 1;
            CHECK(fs.failures == at - 1);
            og_kv_session_destroy(c);
            break;
        }
        CHECK(st == OG_ERR_OUT_OF_MEMORY && c == NULL);
        CHECK(verify(&p, "parent after a failed fork") == 0 && og_kv_session_length(p.s) == 40);
    }
    CHECK_MSG(calls >= 1, "a fork made %lld allocations", (long long)calls);
    og_kv_fault_arm(&fs, 0);
    CHECK_OK(write_n(&p, 10, 1));
    CHECK(verify(&p, "parent") == 0);
    og_kv_session_destroy(p.s);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Host time of a packed fork does not grow with the length: a fork at
 * 32 times the length costs much less than 32 times as much. */
static void test_fork_cost(const og_kv_allocator *alloc) {
    og_test_section("packed fork: host time independent of the length");
    og_kv_config flat = make_cfg(k_flat_only, 2);
    flat.max_capacity = 1 << 16;
    double best[2] = {1e9, 1e9};
    const int64_t lens[2] = {1024, 32768};
    for (int k = 0; k < 2; k++) {
        tracked *p = calloc(1, sizeof *p + sizeof(int) * (size_t)lens[k]);
        og_kv_session *s = NULL;
        CHECK_OK(og_kv_session_create(&flat, alloc, &s));
        for (int64_t L = 0; L < lens[k]; L += MAX_WRITE) {
            CHECK_OK(og_kv_session_prepare(s, MAX_WRITE));
            og_kv_session_commit(s, MAX_WRITE);
        }
        for (int r = 0; r < 20; r++) {
            og_kv_session *c = NULL;
            double t0 = now_s();
            og_status st = og_kv_session_fork(s, lens[k] - 3, NULL, &c);
            double t = now_s() - t0;
            og_kv_session_destroy(c);
            CHECK(st == OG_OK);
            if (t < best[k]) best[k] = t;
        }
        og_kv_session_destroy(s);
        free(p);
    }
    fprintf(stderr, "fork at 1k rows %.1f us, at 32k rows %.1f us (rows of 256 bytes)\n", best[0] * 1e6,
            best[1] * 1e6);
    CHECK_MSG(best[1] < 8 * best[0] + 20e-6, "32k %.1f us vs 1k %.1f us", best[1] * 1e6, best[0] * 1e6);
}

/* ------------------------------------------------------------ model level */

#define N_DECODE 32

static og_status feed_prompt(og_session *s, const int32_t *toks, int64_t n) {
    return og_session_eval(s, toks, n, 0, NULL, 0);
}

/* Decodes toks one at a time, logits of each into out [n, V]. */
static og_status decode(og_session *s, const int32_t *toks, int n, float *out, int64_t V) {
    og_status st = OG_OK;
    for (int t = 0; t < n && st == OG_OK; t++) st = og_session_eval(s, &toks[t], 1, 0, out + t * V, 0);
    return st;
}

/* kv_dtype: the sessions' storage (OG_DTYPE_COUNT: the program's) */
static void test_model_fork(og_model *m, const og_kv_allocator *alloc, og_dtype kv_dtype, const char *name) {
    const int64_t V = og_model_vocab_size(m);
    og_session_params sp = og_session_default_params();
    sp.kv_allocator = alloc;
    sp.kv_dtype = kv_dtype;
    og_rng r = og_rng_seed(11);
    enum { N = 70 };
    int32_t prompt[N], x[N_DECODE], y[N_DECODE];
    for (int t = 0; t < N; t++) prompt[t] = (int32_t)(og_rng_next(&r) % (uint64_t)V);
    for (int t = 0; t < N_DECODE; t++) {
        x[t] = (int32_t)(og_rng_next(&r) % (uint64_t)V);
        y[t] = (int32_t)(og_rng_next(&r) % (uint64_t)V);
    }
    float *cx = malloc(sizeof(float) * N_DECODE * V), *px = malloc(sizeof(float) * N_DECODE * V);
    float *fx = malloc(sizeof(float) * N_DECODE * V), *fy = malloc(sizeof(float) * N_DECODE * V);
    og_session *p = NULL;
    CHECK_OK(og_session_create(m, &sp, &p));
    CHECK_OK(feed_prompt(p, prompt, N));
    const int64_t floor = og_kv_session_fork_floor(og_session_kv(p));
    const int64_t points[] = {N, N - 1, floor};
    for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
        const int64_t a = points[k];
        char what[128];
        snprintf(what, sizeof what, "%s: fork at %lld of %d, then 32 tokens each, bit for bit", name, (long long)a, N);
        og_test_section(what);
        og_session *c = NULL;
        CHECK_OK(og_session_fork(p, a, &c));
        if (!c) continue;
        CHECK(og_session_length(c) == a);
        /* interleaved: child token, parent token */
        og_session *pp = NULL;
        CHECK_OK(og_session_fork(p, N, &pp)); /* the parent's own continuation, kept off p for the next case */
        for (int t = 0; t < N_DECODE; t++) {
            CHECK_OK(og_session_eval(c, &x[t], 1, 0, cx + t * V, 0));
            CHECK_OK(og_session_eval(pp, &y[t], 1, 0, px + t * V, 0));
        }
        /* a fresh session fed the same tokens in the same steps: the
         * prompt's first a tokens in steps of max_write, then x */
        og_session *fa = NULL;
        CHECK_OK(og_session_create(m, &sp, &fa));
        const int32_t mw = og_model_kv_config(m)->max_write;
        for (int64_t done = 0; done < a;) {
            const int64_t T = a - done < mw ? a - done : mw;
            CHECK_OK(og_session_eval(fa, prompt + done, T, 0, NULL, 0));
            done += T;
        }
        CHECK_OK(decode(fa, x, N_DECODE, fx, V));
        CHECK_MSG(!memcmp(cx, fx, sizeof(float) * N_DECODE * V), "%s: the child's logits differ from a fresh session's",
                  what);
        og_session *fp = NULL;
        CHECK_OK(og_session_create(m, &sp, &fp));
        CHECK_OK(feed_prompt(fp, prompt, N));
        CHECK_OK(decode(fp, y, N_DECODE, fy, V));
        CHECK_MSG(!memcmp(px, fy, sizeof(float) * N_DECODE * V),
                  "%s: the parent's continuation differs from a fresh session's", what);
        og_kv_metrics km;
        og_session_metrics(c, &km);
        if (alloc && alloc->share && a > 0) CHECK_MSG(km.bytes_shared > 0, "%s: nothing shared", what);
        og_session_destroy(fa);
        og_session_destroy(fp);
        og_session_destroy(pp);
        og_session_destroy(c);
    }
    og_session *c = NULL;
    CHECK_STATUS(og_session_fork(p, N + 1, &c), OG_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    og_session_destroy(p);
    free(cx);
    free(px);
    free(fx);
    free(fy);
}

int main(void) {
    og_kv_allocator cpu = og_kv_allocator_cpu(), paged;
    const bool have_paged = og_kv_allocator_paged(&paged) == OG_OK;
    test_kv_forks(&cpu, "dense");
    test_fork_faults(cpu, "dense");
    if (have_paged) {
        test_kv_forks(&paged, "packed");
        test_fork_faults(paged, "packed");
        test_fork_cost(&paged);
    }

    char dir[] = "/tmp/og_test_fork_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[512], hf[512];
    snprintf(path, sizeof path, "%s/qwen3.ogp", dir);
    snprintf(hf, sizeof hf, "%s/hf/qwen3-mixed", OG_TEST_DATA_DIR);
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 8;
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, &mp, &m));
    if (m) {
        test_model_fork(m, NULL, OG_DTYPE_COUNT, "model dense");
        if (have_paged) test_model_fork(m, &paged, OG_DTYPE_COUNT, "model packed");
        /* int8 and fp8 storage: a fork copies or maps rows with their scales */
        test_model_fork(m, NULL, OG_DTYPE_INT8, "model dense int8");
        test_model_fork(m, NULL, OG_DTYPE_FP8, "model dense fp8");
        if (have_paged) {
            test_model_fork(m, &paged, OG_DTYPE_INT8, "model packed int8");
            test_model_fork(m, &paged, OG_DTYPE_FP8, "model packed fp8");
        }
    }
    og_model_destroy(m);
    remove(path);
    rmdir(dir);
    if (have_paged) og_kv_allocator_paged_release(&paged);
    return og_test_finish();
}
