/* KV sessions: growth preserving rows byte for byte, exact fill and refusal,
 * all-or-nothing rollback under fault injection at every allocation, the
 * step-transaction state machine, reset, isolation, metrics and the capacity
 * estimate against hand-computed numbers and a budget-limited allocator.
 *
 * The manifest (f32): flat A Hkv=2 D=4 (32 bytes a row), flat B Hkv=1 D=2
 * (8 bytes), ring C W=4 Hkv=1 D=4 (16 bytes); max_write 4 so R = 7;
 * initial_capacity 4, max_capacity 32. */
#include "harness.h"
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NL 3
static const og_kv_layer_config k_layers[NL] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 4},
    {.layer_id = 1, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 1, .head_dim = 2},
    {.layer_id = 2, .policy = OG_KV_RING, .window = 4, .n_kv_heads = 1, .head_dim = 4},
};
static const og_kv_config k_cfg = {
    .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_F32, .max_capacity = 32,
    .initial_capacity = 4, .max_write = 4, .n_model_layers = 3, .n_layers = NL, .layers = k_layers,
};
#define RING_R 7

static int64_t row_elems(int i) { return (int64_t)k_layers[i].n_kv_heads * k_layers[i].head_dim; }
static int64_t slot_of(int i, int64_t pos) { return k_layers[i].policy == OG_KV_RING ? pos % RING_R : pos; }
/* The value a kernel writes for element e of position pos (kv 0 = k, 1 = v). */
static float pattern(int layer, int kv, int64_t pos, int64_t e, int salt) {
    return (float)(salt * 1000000 + layer * 100000 + kv * 50000 + pos * 100 + e);
}

/* Writes the prepared step's rows as a kernel would: positions L..L+T-1 at
 * their slots (computed here, not by the planner). */
static void write_step(og_kv_session *s, int32_t T, int salt) {
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        CHECK(v.k && v.v);
        if (!v.k || !v.v) return;
        for (int64_t p = v.length; p < v.length + T; p++) {
            CHECK(slot_of(i, p) < v.rows);
            for (int64_t e = 0; e < row_elems(i); e++) {
                ((float *)v.k)[slot_of(i, p) * row_elems(i) + e] = pattern(i, 0, p, e, salt);
                ((float *)v.v)[slot_of(i, p) * row_elems(i) + e] = pattern(i, 1, p, e, salt);
            }
        }
    }
}

/* Counts committed rows whose contents differ from the pattern (flat: all
 * positions < L; ring: the last min(L, R) positions). */
static int64_t verify_rows(const og_kv_session *s, int salt) {
    int64_t bad = 0;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        int64_t lo = k_layers[i].policy == OG_KV_RING && v.length > RING_R ? v.length - RING_R : 0;
        for (int64_t p = lo; p < v.length; p++)
            for (int64_t e = 0; e < row_elems(i); e++) {
                bad += ((const float *)v.k)[slot_of(i, p) * row_elems(i) + e] != pattern(i, 0, p, e, salt);
                bad += ((const float *)v.v)[slot_of(i, p) * row_elems(i) + e] != pattern(i, 1, p, e, salt);
            }
    }
    return bad;
}

static og_status step(og_kv_session *s, int32_t T, int salt) {
    og_status st = og_kv_session_prepare(s, T);
    if (st != OG_OK) return st;
    write_step(s, T, salt);
    return og_kv_session_commit(s, T);
}

/* Everything observable about a session, for "exactly as it was" checks. */
typedef struct snapshot {
    int64_t length;
    og_kv_metrics m;
    og_kv_layer_view views[NL];
    unsigned char *bytes[NL][2]; /* full allocated k and v blocks */
} snapshot;

static void snap_take(const og_kv_session *s, snapshot *sn) {
    memset(sn, 0, sizeof *sn);
    sn->length = og_kv_session_length(s);
    CHECK_OK(og_kv_session_metrics(s, &sn->m));
    for (int i = 0; i < NL; i++) {
        CHECK_OK(og_kv_session_layer_view(s, i, &sn->views[i]));
        size_t n = (size_t)(sn->views[i].rows * row_elems(i)) * sizeof(float);
        if (!n) continue;
        sn->bytes[i][0] = malloc(n);
        sn->bytes[i][1] = malloc(n);
        memcpy(sn->bytes[i][0], sn->views[i].k, n);
        memcpy(sn->bytes[i][1], sn->views[i].v, n);
    }
}

static bool snap_same(const og_kv_session *s, const snapshot *sn) {
    bool same = og_kv_session_length(s) == sn->length;
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    same = same && m.length == sn->m.length && m.n_layers == sn->m.n_layers &&
           m.rows_allocated == sn->m.rows_allocated && m.bytes_allocated == sn->m.bytes_allocated &&
           m.bytes_live == sn->m.bytes_live && m.growth_count == sn->m.growth_count &&
           m.rebinds == sn->m.rebinds && m.graph_captures == sn->m.graph_captures && m.steps == sn->m.steps;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        same = same && memcmp(&v, &sn->views[i], sizeof v) == 0;
        size_t n = (size_t)(sn->views[i].rows * row_elems(i)) * sizeof(float);
        if (same && n)
            same = memcmp(v.k, sn->bytes[i][0], n) == 0 && memcmp(v.v, sn->bytes[i][1], n) == 0;
    }
    return same;
}

static void snap_free(snapshot *sn) {
    for (int i = 0; i < NL; i++) {
        free(sn->bytes[i][0]);
        free(sn->bytes[i][1]);
    }
}

static void check_metrics(const og_kv_session *s, int64_t length, int64_t rows, int64_t alloc, int64_t live,
                          int64_t growth, int64_t rebinds, int64_t steps) {
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK_MSG(m.length == length && m.n_layers == NL && m.rows_allocated == rows && m.bytes_allocated == alloc &&
                  m.bytes_live == live && m.growth_count == growth && m.rebinds == rebinds && m.steps == steps,
              "metrics at L=%lld: length %lld rows %lld alloc %lld live %lld growth %lld rebinds %lld steps %lld",
              (long long)length, (long long)m.length, (long long)m.rows_allocated, (long long)m.bytes_allocated,
              (long long)m.bytes_live, (long long)m.growth_count, (long long)m.rebinds, (long long)m.steps);
}

static void check_rows(const og_kv_session *s, int64_t flat, int64_t ring) {
    CHECK(og_kv_session_layer_rows(s, 0) == flat);
    CHECK(og_kv_session_layer_rows(s, 1) == flat);
    CHECK(og_kv_session_layer_rows(s, 2) == ring);
}

static void test_growth_and_fill(void) {
    og_test_section("growth 4 -> 8 -> 16 -> 32, exact fill, refusal");
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &s));
    if (!s) return;
    check_rows(s, 0, 0);
    check_metrics(s, 0, 0, 0, 0, 0, 0, 0);
    og_kv_layer_view v;
    CHECK_OK(og_kv_session_layer_view(s, 0, &v));
    CHECK(v.k == NULL && v.v == NULL && v.rows == 0);

    /* Bytes: a row of A+B+C is 32+8+16 = 56, times 2 for k and v. */
    CHECK_OK(step(s, 3, 0));
    check_rows(s, 4, RING_R);
    check_metrics(s, 3, 15, 2 * (4 * 32 + 4 * 8 + 7 * 16), 2 * 3 * 56, 0, 0, 1);
    CHECK(verify_rows(s, 0) == 0);

    CHECK_OK(step(s, 3, 0)); /* L 3 -> 6 needs 6 rows: 4 -> 8 */
    check_rows(s, 8, RING_R);
    check_metrics(s, 6, 23, 2 * (8 * 40 + 7 * 16), 2 * 6 * 56, 2, 1, 2);
    CHECK(verify_rows(s, 0) == 0);

    CHECK_OK(step(s, 4, 0)); /* 10 rows: 8 -> 16; the ring now holds 7 of 10 */
    check_rows(s, 16, RING_R);
    check_metrics(s, 10, 39, 2 * (16 * 40 + 7 * 16), 2 * (10 * 40 + 7 * 16), 4, 2, 3);
    CHECK(verify_rows(s, 0) == 0);

    CHECK_OK(step(s, 4, 0)); /* 14 rows fit in 16: no growth, no rebind */
    check_rows(s, 16, RING_R);
    check_metrics(s, 14, 39, 2 * (16 * 40 + 7 * 16), 2 * (14 * 40 + 7 * 16), 4, 2, 4);

    CHECK_OK(step(s, 4, 0)); /* 18 rows: 16 -> 32 */
    check_rows(s, 32, RING_R);
    check_metrics(s, 18, 71, 2 * (32 * 40 + 7 * 16), 2 * (18 * 40 + 7 * 16), 6, 3, 5);
    CHECK(verify_rows(s, 0) == 0);

    for (int i = 0; i < 3; i++) CHECK_OK(step(s, 4, 0)); /* 30 */
    CHECK_OK(step(s, 2, 0));                              /* exactly 32 = max_capacity */
    CHECK(og_kv_session_length(s) == 32);
    check_rows(s, 32, RING_R);
    check_metrics(s, 32, 71, 2 * (32 * 40 + 7 * 16), 2 * (32 * 40 + 7 * 16), 6, 3, 9);
    CHECK(verify_rows(s, 0) == 0);

    snapshot sn;
    snap_take(s, &sn);
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);
    CHECK_MSG(strstr(og_kv_session_last_error(s), "max_capacity") != NULL, "%s", og_kv_session_last_error(s));
    CHECK_STATUS(og_kv_session_prepare(s, 4), OG_ERR_CAPACITY);
    CHECK_STATUS(og_kv_session_prepare(s, 5), OG_ERR_WRITE_TOO_WIDE);
    CHECK_STATUS(og_kv_session_prepare(s, 0), OG_ERR_INVALID_ARGUMENT);
    CHECK(snap_same(s, &sn));
    CHECK_STATUS(og_kv_session_commit(s, 1), OG_ERR_STATE); /* the refused step is not prepared */
    CHECK(snap_same(s, &sn));
    snap_free(&sn);
    og_kv_session_destroy(s);
}

/* A first step wider than initial_capacity starts at T rows. */
static void test_wide_first_step(void) {
    og_test_section("first step wider than initial_capacity");
    og_kv_layer_config l = {.layer_id = 0, .policy = OG_KV_FLAT, .n_kv_heads = 1, .head_dim = 1};
    og_kv_config cfg = {.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 20,
                        .initial_capacity = 2, .max_write = 6, .n_layers = 1, .layers = &l};
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
    CHECK_OK(og_kv_session_prepare(s, 5));
    CHECK(og_kv_session_layer_rows(s, 0) == 5);
    CHECK_OK(og_kv_session_commit(s, 5));
    CHECK_OK(og_kv_session_prepare(s, 6)); /* 11 rows: 5 -> 10 -> 20 */
    CHECK(og_kv_session_layer_rows(s, 0) == 20);
    CHECK_OK(og_kv_session_commit(s, 6));
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.bytes_allocated == 2 * 20 * 2 && m.bytes_live == 2 * 11 * 2 && m.growth_count == 1);
    og_kv_session_destroy(s);
}

typedef struct inplace_alloc inplace_alloc;
static void check_backed(inplace_alloc *f, const og_kv_session *s);

/* Injects a failure at every allocation of one prepare, checking that the
 * session is unchanged after each (and, over an allocator that grows in
 * place, `f`, that every block is backed for exactly its rows again), then
 * that the step succeeds disarmed. Returns the number of allocations the
 * step makes. */
static int fault_every_allocation(og_kv_session *s, og_kv_fault_state *fs, int32_t T, int salt, inplace_alloc *f) {
    int k;
    for (k = 1; k < 100; k++) {
        snapshot sn;
        snap_take(s, &sn);
        og_kv_fault_arm(fs, k);
        og_status st = og_kv_session_prepare(s, T);
        if (st == OG_OK) {
            og_kv_session_abort(s);
            snap_free(&sn);
            break;
        }
        CHECK_MSG(st == OG_ERR_OUT_OF_MEMORY, "fail_at %d: %s", k, og_status_str(st));
        CHECK_MSG(fs->failures >= 1, "fail_at %d", k);
        CHECK_MSG(strstr(og_kv_session_last_error(s), "fault injection") != NULL, "fail_at %d: %s", k,
                  og_kv_session_last_error(s));
        CHECK_MSG(snap_same(s, &sn), "fail_at %d: session changed", k);
        if (f && og_kv_session_layer_rows(s, 0) > 0) check_backed(f, s);
        CHECK_STATUS(og_kv_session_commit(s, T), OG_ERR_STATE);
        snap_free(&sn);
    }
    og_kv_fault_arm(fs, 0);
    CHECK_OK(step(s, T, salt));
    CHECK(verify_rows(s, salt) == 0);
    return k - 1;
}

static void test_fault_injection(void) {
    og_test_section("fault injection at every allocation");
    og_kv_fault_state fs = {.inner = og_kv_allocator_cpu()};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    /* The first step allocates k and v of all three layers. */
    CHECK(fault_every_allocation(s, &fs, 3, 7, NULL) == 6);
    check_rows(s, 4, RING_R);
    /* Growing 4 -> 8 allocates k and v of the two flat layers. */
    CHECK(fault_every_allocation(s, &fs, 3, 7, NULL) == 4);
    check_rows(s, 8, RING_R);
    /* 6 -> 10 rows: 8 -> 16; keep a ring that has wrapped. */
    CHECK(fault_every_allocation(s, &fs, 4, 7, NULL) == 4);
    /* A step that fits makes no allocation at all. */
    CHECK(fault_every_allocation(s, &fs, 4, 7, NULL) == 0);
    CHECK(og_kv_session_length(s) == 14);
    check_rows(s, 16, RING_R);
    CHECK(verify_rows(s, 7) == 0);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.growth_count == 4 && m.rebinds == 2 && m.steps == 4);
    og_kv_session_destroy(s);

    /* fail_at counts since the last arm. */
    og_kv_fault_state f2 = {.inner = og_kv_allocator_cpu()};
    og_kv_allocator a2 = og_kv_allocator_faulty(&f2);
    void *p[3] = {0};
    og_kv_fault_arm(&f2, 2);
    CHECK_OK(a2.alloc(a2.ctx, 16, &p[0]));
    CHECK_STATUS(a2.alloc(a2.ctx, 16, &p[1]), OG_ERR_OUT_OF_MEMORY);
    CHECK_OK(a2.alloc(a2.ctx, 16, &p[2]));
    CHECK(f2.alloc_calls == 3 && f2.failures == 1 && p[1] == NULL);
    a2.free(a2.ctx, p[0]);
    a2.free(a2.ctx, p[2]);
}

static void test_state_machine(void) {
    og_test_section("commit/abort/prepare ordering");
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &s));
    if (!s) return;
    CHECK_STATUS(og_kv_session_commit(s, 1), OG_ERR_STATE);
    CHECK(strstr(og_kv_session_last_error(s), "no step is prepared") != NULL);
    og_kv_plan plan;
    CHECK_STATUS(og_kv_session_plan(s, 0, &plan), OG_ERR_STATE);

    CHECK_OK(og_kv_session_prepare(s, 2));
    CHECK_STATUS(og_kv_session_prepare(s, 2), OG_ERR_STATE);
    CHECK_STATUS(og_kv_session_commit(s, 3), OG_ERR_STATE);
    CHECK(og_kv_session_length(s) == 0);
    CHECK_OK(og_kv_session_plan(s, 2, &plan)); /* the prepared plan is the planner's */
    CHECK(plan.length == 0 && plan.width == 2 && plan.policy == OG_KV_RING && plan.rows_needed == RING_R);
    CHECK_STATUS(og_kv_session_plan(s, 3, &plan), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_kv_session_commit(s, 2)); /* a wrong T leaves the step prepared */
    CHECK(og_kv_session_length(s) == 2);
    CHECK_STATUS(og_kv_session_commit(s, 2), OG_ERR_STATE);

    CHECK_OK(og_kv_session_prepare(s, 4)); /* 6 rows: grows to 8, kept after abort */
    og_kv_session_abort(s);
    og_kv_session_abort(s); /* no-op */
    CHECK(og_kv_session_length(s) == 2);
    check_rows(s, 8, RING_R);
    CHECK_STATUS(og_kv_session_commit(s, 4), OG_ERR_STATE);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.steps == 1 && m.growth_count == 2 && m.rebinds == 1);

    og_kv_layer_view v;
    CHECK_STATUS(og_kv_session_layer_view(s, -1, &v), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_session_layer_view(s, NL, &v), OG_ERR_INVALID_ARGUMENT);
    CHECK(og_kv_session_layer_rows(s, NL) == -1);
    og_kv_session_note_capture(s);
    og_kv_session_note_capture(s);
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.graph_captures == 2);
    og_kv_session_destroy(s);

    /* The session keeps its own copy of the manifest. */
    og_kv_layer_config mine[NL];
    memcpy(mine, k_layers, sizeof mine);
    og_kv_config cfg = k_cfg;
    cfg.layers = mine;
    CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
    mine[0].head_dim = 99;
    cfg.max_capacity = 1;
    const og_kv_config *own = og_kv_session_config(s);
    CHECK(own && own->max_capacity == 32 && own->layers != mine && own->layers[0].head_dim == 4);
    og_kv_session_destroy(s);

    /* Bad arguments. */
    og_kv_config bad = k_cfg;
    bad.max_write = 0;
    s = NULL;
    CHECK_STATUS(og_kv_session_create(&bad, NULL, &s), OG_ERR_INVALID_CONFIG);
    CHECK(s == NULL);
    og_kv_allocator incomplete = og_kv_allocator_cpu();
    incomplete.copy = NULL;
    CHECK_STATUS(og_kv_session_create(&k_cfg, &incomplete, &s), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_session_prepare(NULL, 1), OG_ERR_INVALID_ARGUMENT);
    og_kv_session_destroy(NULL);
    og_kv_session_reset(NULL);
}

static void test_reset(void) {
    og_test_section("reset keeps storage");
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &s));
    if (!s) return;
    for (int i = 0; i < 3; i++) CHECK_OK(step(s, 4, 1)); /* 12 rows in 16 */
    og_kv_layer_view before[NL], after;
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &before[i]));
    og_kv_session_reset(s);
    CHECK(og_kv_session_length(s) == 0);
    check_rows(s, 16, RING_R);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.length == 0 && m.bytes_live == 0 && m.bytes_allocated == 2 * (16 * 40 + 7 * 16) && m.steps == 3);
    /* The same blocks serve the next conversation: no growth, no rebind. */
    for (int i = 0; i < 4; i++) CHECK_OK(step(s, 4, 2));
    CHECK(verify_rows(s, 2) == 0);
    for (int i = 0; i < NL; i++) {
        CHECK_OK(og_kv_session_layer_view(s, i, &after));
        CHECK(after.k == before[i].k && after.v == before[i].v && after.rows == before[i].rows);
    }
    og_kv_metrics m2;
    CHECK_OK(og_kv_session_metrics(s, &m2));
    CHECK(m2.growth_count == m.growth_count && m2.rebinds == m.rebinds && m2.steps == 7);
    og_kv_session_destroy(s);
}

static void test_isolation(void) {
    og_test_section("two sessions never share storage");
    og_kv_session *a = NULL, *b = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &a));
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &b));
    if (!a || !b) return;
    for (int i = 0; i < 5; i++) {
        CHECK_OK(step(a, 4, 3));
        CHECK_OK(step(b, 3, 4));
        /* Every block of both sessions is disjoint from every other. */
        const char *lo[2 * NL * 2];
        const char *hi[2 * NL * 2];
        int n = 0;
        og_kv_session *ss[2] = {a, b};
        for (int j = 0; j < 2; j++)
            for (int l = 0; l < NL; l++) {
                og_kv_layer_view v;
                CHECK_OK(og_kv_session_layer_view(ss[j], l, &v));
                size_t bytes = (size_t)(v.rows * row_elems(l)) * sizeof(float);
                lo[n] = v.k;
                hi[n++] = (const char *)v.k + bytes;
                lo[n] = v.v;
                hi[n++] = (const char *)v.v + bytes;
            }
        int overlaps = 0;
        for (int x = 0; x < n; x++)
            for (int y = 0; y < x; y++) overlaps += lo[x] < hi[y] && lo[y] < hi[x];
        CHECK(overlaps == 0);
        CHECK(verify_rows(a, 3) == 0);
        CHECK(verify_rows(b, 4) == 0);
    }
    CHECK(og_kv_session_length(a) == 20 && og_kv_session_length(b) == 15);
    og_kv_session_destroy(a);
    CHECK(verify_rows(b, 4) == 0);
    og_kv_session_destroy(b);
}

/* An allocator that refuses to hold more than `limit` bytes at once. */
typedef struct budget_alloc {
    int64_t limit, held;
    void *ptr[32];
    size_t size[32];
} budget_alloc;

static og_status budget_alloc_fn(void *ctx, size_t bytes, void **out) {
    budget_alloc *b = ctx;
    if (b->held + (int64_t)bytes > b->limit) return OG_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < 32; i++)
        if (!b->ptr[i]) {
            b->ptr[i] = *out = malloc(bytes);
            b->size[i] = bytes;
            b->held += (int64_t)bytes;
            return OG_OK;
        }
    return OG_ERR_OUT_OF_MEMORY;
}
static void budget_free_fn(void *ctx, void *p) {
    budget_alloc *b = ctx;
    for (int i = 0; i < 32; i++)
        if (b->ptr[i] == p) {
            b->held -= (int64_t)b->size[i];
            b->ptr[i] = NULL;
            free(p);
        }
}
static og_status budget_copy_fn(void *ctx, void *dst, const void *src, size_t n) {
    (void)ctx;
    memcpy(dst, src, n);
    return OG_OK;
}

/* Steps one token at a time until the session is refused; returns tokens taken. */
static int64_t decode_until_refused(og_kv_session *s) {
    int64_t n = 0;
    while (og_kv_session_prepare(s, 1) == OG_OK) {
        CHECK_OK(og_kv_session_commit(s, 1));
        n++;
    }
    return n;
}

static void check_capacity(const og_kv_session *s, int64_t budget, int64_t reach, int64_t fresh) {
    og_kv_capacity c;
    CHECK_OK(og_kv_session_capacity(s, budget, &c));
    CHECK_MSG(c.tokens_reachable == reach && c.fresh_sessions == fresh && c.bytes_per_token == 80 &&
                  c.fresh_session_bytes == 544,
              "budget %lld at L=%lld: reachable %lld (want %lld), fresh %lld (want %lld), per token %lld, fresh bytes %lld",
              (long long)budget, (long long)og_kv_session_length(s), (long long)c.tokens_reachable, (long long)reach,
              (long long)c.fresh_sessions, (long long)fresh, (long long)c.bytes_per_token,
              (long long)c.fresh_session_bytes);
}

static void test_capacity(void) {
    og_test_section("capacity estimate");
    /* Per token: flat A 2*32 + flat B 2*8 = 80 bytes. A new session's first
     * step: ring 2*7*16 = 224 plus 4 flat rows 320 = 544 bytes.
     * Growth peaks hold the old block and the new one. */
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, NULL, &s));
    if (!s) return;
    check_capacity(s, 10000, 32, 18); /* 10000 / 544 = 18 */
    check_capacity(s, 543, 0, 0);
    /* 544 for the first step leaves 640 = exactly 8 rows: 4 -> 8, not 16. */
    check_capacity(s, 544 + 640, 8, 2);
    check_capacity(s, 544 + 639, 4, 2);
    CHECK_OK(step(s, 3, 0));
    CHECK_OK(step(s, 3, 0)); /* L = 6, 8 flat rows */
    check_capacity(s, 1279, 2, 2);  /* growing to 16 needs 1280 at the peak */
    check_capacity(s, 1280, 10, 2); /* 16 rows; then 32 needs 2560 of the 640 left */
    check_capacity(s, 3199, 10, 5);
    check_capacity(s, 3200, 26, 5); /* 1280, then 3200 - 640 = 2560: 32 rows */
    og_kv_capacity c;
    CHECK_STATUS(og_kv_session_capacity(s, -1, &c), OG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 6; i++) CHECK_OK(step(s, 4, 0)); /* 30 */
    CHECK_OK(step(s, 2, 0));
    check_capacity(s, 1 << 20, 0, (1 << 20) / 544);
    og_kv_session_destroy(s);

    og_test_section("capacity estimate agrees with a budget-limited allocator");
    const int64_t budgets[] = {543, 544, 1183, 1184, 2143, 2144, 4063, 4064, 100000};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        budget_alloc b = {.limit = budgets[i]};
        og_kv_allocator a = {.alloc = budget_alloc_fn, .free = budget_free_fn, .copy = budget_copy_fn, .ctx = &b};
        CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
        CHECK_OK(og_kv_session_capacity(s, budgets[i], &c));
        int64_t taken = decode_until_refused(s);
        CHECK_MSG(taken == c.tokens_reachable, "budget %lld: estimate %lld, decoded %lld", (long long)budgets[i],
                  (long long)c.tokens_reachable, (long long)taken);
        og_kv_session_destroy(s);
        CHECK(b.held == 0);
    }

    og_test_section("capacity of a ring-only session");
    og_kv_layer_config ring = {.layer_id = 0, .policy = OG_KV_RING, .window = 8, .n_kv_heads = 1, .head_dim = 2};
    og_kv_config rc = {.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 1000,
                       .initial_capacity = 1, .max_write = 3, .n_layers = 1, .layers = &ring};
    CHECK_OK(og_kv_session_create(&rc, NULL, &s));
    CHECK_OK(og_kv_session_capacity(s, 39, &c)); /* R = 10 rows of 4 bytes, k and v: 80 */
    CHECK(c.tokens_reachable == 0 && c.fresh_sessions == 0 && c.bytes_per_token == 0 && c.fresh_session_bytes == 80);
    CHECK_OK(og_kv_session_capacity(s, 160, &c));
    CHECK(c.tokens_reachable == 1000 && c.fresh_sessions == 2);
    CHECK_OK(og_kv_session_prepare(s, 3));
    CHECK_OK(og_kv_session_commit(s, 3));
    CHECK_OK(og_kv_session_capacity(s, 0, &c)); /* storage held: the budget is not needed */
    CHECK(c.tokens_reachable == 997);
    og_kv_session_destroy(s);
}

/* ------------------------------------------------ growth in place */

/* A host allocator that grows in place the way the CUDA one does: reserve
 * maps address space nobody may touch (PROT_NONE) and resize makes whole
 * pages of it readable and writable, or gives them back, so a session that
 * touched rows it had not had backed would fault. It checks the session's
 * calls (resize and free only of blocks it handed out, within their
 * reservation), counts them, keeps the bytes each block was asked to back,
 * and holds at most `limit` bytes at once (plain blocks and backed bytes of
 * reservations; 0 = no limit). Plain blocks (ring layers) come from malloc. */
#define FAKE_MAX 32
typedef struct fake_block {
    unsigned char *base;
    size_t reserved, backed, plain; /* plain: bytes of a malloc block, 0 for a reservation */
} fake_block;
struct inplace_alloc {
    fake_block blocks[FAKE_MAX];
    int64_t limit, held;
    int64_t reserves, grows, shrinks, plain_allocs, copies, bad_calls;
    bool fail_shrinks; /* make every shrink fail */
};

static size_t page_round(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

static fake_block *fake_find(inplace_alloc *f, const void *ptr) {
    for (int i = 0; i < FAKE_MAX; i++)
        if (f->blocks[i].base && f->blocks[i].base == ptr) return &f->blocks[i];
    return NULL;
}

static fake_block *fake_free_slot(inplace_alloc *f) {
    for (int i = 0; i < FAKE_MAX; i++)
        if (!f->blocks[i].base) return &f->blocks[i];
    return NULL;
}

static int live_blocks(const inplace_alloc *f) {
    int n = 0;
    for (int i = 0; i < FAKE_MAX; i++) n += f->blocks[i].base != NULL;
    return n;
}

static bool fake_fits(const inplace_alloc *f, size_t more) {
    return !f->limit || f->held + (int64_t)more <= f->limit;
}

static og_status fake_alloc(void *ctx, size_t bytes, void **out) {
    inplace_alloc *f = ctx;
    fake_block *b = fake_free_slot(f);
    if (!b || !fake_fits(f, bytes) || !(b->base = malloc(bytes))) return OG_ERR_OUT_OF_MEMORY;
    b->plain = bytes;
    f->held += (int64_t)bytes;
    f->plain_allocs++;
    *out = b->base;
    return OG_OK;
}

static og_status fake_reserve(void *ctx, size_t max_bytes, size_t bytes, void **out) {
    inplace_alloc *f = ctx;
    if (bytes == 0 || bytes > max_bytes) {
        f->bad_calls++;
        return OG_ERR_INVALID_ARGUMENT;
    }
    fake_block *b = fake_free_slot(f);
    if (!b || !fake_fits(f, bytes)) return OG_ERR_OUT_OF_MEMORY;
    void *p = mmap(NULL, page_round(max_bytes), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return OG_ERR_OUT_OF_MEMORY;
    if (mprotect(p, page_round(bytes), PROT_READ | PROT_WRITE) != 0) {
        munmap(p, page_round(max_bytes));
        return OG_ERR_OUT_OF_MEMORY;
    }
    *b = (fake_block){.base = p, .reserved = max_bytes, .backed = bytes};
    f->held += (int64_t)bytes;
    f->reserves++;
    *out = p;
    return OG_OK;
}

static og_status fake_resize(void *ctx, void *ptr, size_t bytes) {
    inplace_alloc *f = ctx;
    fake_block *b = fake_find(f, ptr);
    if (!b || b->plain || bytes == 0 || bytes > b->reserved) {
        f->bad_calls++;
        return OG_ERR_INVALID_ARGUMENT;
    }
    if (bytes > b->backed) {
        if (!fake_fits(f, bytes - b->backed)) return OG_ERR_OUT_OF_MEMORY;
        if (mprotect(b->base, page_round(bytes), PROT_READ | PROT_WRITE) != 0) return OG_ERR_OUT_OF_MEMORY;
        f->grows++;
    } else if (bytes < b->backed) {
        if (f->fail_shrinks) return og_set_error(OG_ERR_BACKEND, "fake allocator: shrink made to fail");
        /* bytes past the kept ones are lost: poison the kept page's tail, give back whole pages */
        size_t keep = page_round(bytes);
        memset(b->base + bytes, 0xA5, keep - bytes);
        if (page_round(b->backed) > keep) {
            madvise(b->base + keep, page_round(b->backed) - keep, MADV_DONTNEED);
            mprotect(b->base + keep, page_round(b->backed) - keep, PROT_NONE);
        }
        f->shrinks++;
    }
    f->held += (int64_t)bytes - (int64_t)b->backed;
    b->backed = bytes;
    return OG_OK;
}

static void fake_free(void *ctx, void *ptr) {
    inplace_alloc *f = ctx;
    fake_block *b = fake_find(f, ptr);
    if (!b) {
        f->bad_calls++;
        return;
    }
    if (b->plain) {
        free(b->base);
        f->held -= (int64_t)b->plain;
    } else {
        munmap(b->base, page_round(b->reserved));
        f->held -= (int64_t)b->backed;
    }
    *b = (fake_block){0};
}

static og_status fake_copy(void *ctx, void *dst, const void *src, size_t n) {
    inplace_alloc *f = ctx;
    f->copies++;
    memcpy(dst, src, n);
    return OG_OK;
}

static og_kv_allocator inplace_allocator(inplace_alloc *f) {
    return (og_kv_allocator){.alloc = fake_alloc, .free = fake_free, .copy = fake_copy, .ctx = f,
                             .reserve = fake_reserve, .resize = fake_resize};
}

/* Every flat block of s is backed for exactly its rows, every ring block is plain. */
static void check_backed(inplace_alloc *f, const og_kv_session *s) {
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        size_t bytes = (size_t)(v.rows * row_elems(i)) * sizeof(float);
        for (int kv = 0; kv < 2; kv++) {
            const fake_block *b = fake_find(f, kv ? v.v : v.k);
            CHECK_MSG(b != NULL, "layer %d: block not from the allocator", i);
            if (!b) continue;
            if (k_layers[i].policy == OG_KV_RING)
                CHECK_MSG(b->plain == bytes, "layer %d: ring block of %zu bytes", i, b->plain);
            else
                CHECK_MSG(b->backed == bytes && b->reserved == (size_t)k_cfg.max_capacity * bytes / (size_t)v.rows,
                          "layer %d (%lld rows): %zu bytes backed of %zu reserved", i, (long long)v.rows, b->backed,
                          b->reserved);
        }
    }
}

/* The flat layers of s are bound where `first` says. */
static bool same_addresses(const og_kv_session *s, const og_kv_layer_view *first) {
    bool same = true;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        same = same && v.k == first[i].k && v.v == first[i].v;
    }
    return same;
}

static void test_grow_in_place(void) {
    og_test_section("growth in place: same addresses, same rows, no copies");
    inplace_alloc f = {0};
    og_kv_allocator a = inplace_allocator(&f);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    CHECK_OK(step(s, 3, 0));
    check_rows(s, 4, RING_R);
    CHECK(f.reserves == 4 && f.plain_allocs == 2 && f.grows == 0);
    check_backed(&f, s);
    og_kv_layer_view first[NL];
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &first[i]));
    /* L: 6 (8 rows), 10 (16), 14, 18 (32), 22, 26, 30, 32 */
    const int32_t widths[] = {3, 4, 4, 4, 4, 4, 4, 2};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        CHECK_OK(step(s, widths[w], 0));
        CHECK_MSG(verify_rows(s, 0) == 0, "after step %zu", w);
        CHECK_MSG(same_addresses(s, first), "after step %zu: storage moved", w);
        check_backed(&f, s);
    }
    check_rows(s, 32, RING_R);
    /* the same rows, bytes and growths as growth by copy, but no rebind */
    check_metrics(s, 32, 71, 2 * (32 * 40 + 7 * 16), 2 * (32 * 40 + 7 * 16), 6, 0, 9);
    CHECK(f.reserves == 4 && f.grows == 12 && f.shrinks == 0 && f.copies == 0 && f.plain_allocs == 2);
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);
    og_kv_session_destroy(s);
    CHECK(f.held == 0 && f.bad_calls == 0 && live_blocks(&f) == 0);

    og_kv_allocator half = a;
    half.resize = NULL;
    CHECK_STATUS(og_kv_session_create(&k_cfg, &half, &s), OG_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL && strstr(og_last_error(), "reserve but not resize") != NULL);
}

static void test_fault_injection_in_place(void) {
    og_test_section("growth in place: fault injection at every reserve and resize");
    inplace_alloc f = {0};
    og_kv_fault_state fs = {.inner = inplace_allocator(&f)};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    CHECK(a.reserve != NULL && a.resize != NULL);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    /* reserve k, v of both flat layers, allocate k, v of the ring */
    CHECK(fault_every_allocation(s, &fs, 3, 7, &f) == 6);
    check_rows(s, 4, RING_R);
    og_kv_layer_view first[NL];
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &first[i]));
    /* 4 -> 8 resizes k and v of both flat layers; failing the n-th resize
     * grew n - 1 before it and shrinks them back: 1 + 2 + 3 shrinks, and
     * 1 + 2 + 3 + 4 grows with the step that succeeds */
    CHECK(fault_every_allocation(s, &fs, 3, 7, &f) == 4);
    CHECK(f.shrinks == 6 && f.grows == 10);
    check_rows(s, 8, RING_R);
    CHECK(fault_every_allocation(s, &fs, 4, 7, &f) == 4); /* 8 -> 16 */
    CHECK(fault_every_allocation(s, &fs, 4, 7, &f) == 0); /* fits */
    CHECK(f.shrinks == 12 && f.grows == 20);
    CHECK(og_kv_session_length(s) == 14 && same_addresses(s, first));
    check_rows(s, 16, RING_R);
    check_backed(&f, s);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.growth_count == 4 && m.rebinds == 0 && m.steps == 4);

    og_test_section("growth in place: a rollback whose shrink fails");
    /* 18 rows: 16 -> 32; the last resize fails and so does every shrink */
    snapshot sn;
    snap_take(s, &sn);
    og_kv_fault_arm(&fs, 4);
    f.fail_shrinks = true;
    CHECK_STATUS(og_kv_session_prepare(s, 4), OG_ERR_OUT_OF_MEMORY);
    CHECK_MSG(strstr(og_kv_session_last_error(s), "fault injection") != NULL, "the cause is lost: %s",
              og_kv_session_last_error(s));
    CHECK(snap_same(s, &sn));
    snap_free(&sn);
    const fake_block *ak = fake_find(&f, first[0].k);
    CHECK(ak && ak->backed == 32 * 32); /* kept past the layer's 16 rows, harmless */
    f.fail_shrinks = false;
    og_kv_fault_arm(&fs, 0);
    CHECK_OK(step(s, 4, 7));
    CHECK(verify_rows(s, 7) == 0 && same_addresses(s, first));
    check_rows(s, 32, RING_R);
    check_backed(&f, s);
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.growth_count == 6 && m.rebinds == 0);
    og_kv_session_destroy(s);
    CHECK(f.held == 0 && f.bad_calls == 0 && f.copies == 0 && live_blocks(&f) == 0);
}

static void test_capacity_in_place(void) {
    og_test_section("capacity estimate: growth in place has no peak");
    /* first step 544 bytes as before; 4 -> 8 adds 320, 8 -> 16 640, 16 -> 32 1280 */
    inplace_alloc f = {0};
    og_kv_allocator a = inplace_allocator(&f);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    check_capacity(s, 544 + 319, 4, 1);
    check_capacity(s, 544 + 320, 8, 1); /* growth by copy would need 640 here */
    check_capacity(s, 544 + 960, 16, 2);
    check_capacity(s, 544 + 2239, 16, 5);
    check_capacity(s, 544 + 2240, 32, 5);
    og_kv_session_destroy(s);

    const int64_t budgets[] = {543, 544, 863, 864, 1503, 1504, 2783, 2784, 100000};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        inplace_alloc b = {.limit = budgets[i]};
        og_kv_allocator ab = inplace_allocator(&b);
        CHECK_OK(og_kv_session_create(&k_cfg, &ab, &s));
        og_kv_capacity c;
        CHECK_OK(og_kv_session_capacity(s, budgets[i], &c));
        int64_t taken = decode_until_refused(s);
        CHECK_MSG(taken == c.tokens_reachable, "budget %lld: estimate %lld, decoded %lld", (long long)budgets[i],
                  (long long)c.tokens_reachable, (long long)taken);
        og_kv_session_destroy(s);
        CHECK(b.held == 0 && b.bad_calls == 0);
    }
}

int main(void) {
    test_growth_and_fill();
    test_wide_first_step();
    test_fault_injection();
    test_state_machine();
    test_reset();
    test_isolation();
    test_capacity();
    test_grow_in_place();
    test_fault_injection_in_place();
    test_capacity_in_place();
    return og_test_finish();
}
