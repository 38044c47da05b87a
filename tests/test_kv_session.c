/* KV sessions: growth preserving rows byte for byte, exact fill and refusal,
 * all-or-nothing rollback under fault injection at every allocation, the
 * step-transaction state machine, reset, isolation, metrics and the capacity
 * estimate against hand-computed numbers and a budget-limited allocator.
 *
 * The manifest (f32): flat A Hkv=2 D=4 (32 bytes a row), flat B Hkv=1 D=2
 * (8 bytes), ring C W=4 Hkv=1 D=4 (16 bytes); max_write 4 so R = 7;
 * initial_capacity 4, max_capacity 32. With the CPU heap every layer has
 * dense blocks; over an allocator that grows in place the flat layers are
 * packed: a row of A k (32), A v (32), B k (8 + 8 padding), B v (8 + 8) is
 * 96 bytes (24 floats), and the ring's k and v (7 x 16 bytes each) share
 * one 224-byte block. tests/test_kv_packed.c covers packing at length.
 * Last, the host-heap allocator's keeping of freed blocks for later
 * sessions: which come back, and the cap on their total. */
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
/* Elements a view's k (or v) spans: its rows at their stride, the last one
 * only as wide as the layer (a packed row's tail belongs to other layers). */
static int64_t span_elems(const og_kv_layer_view *v, int i) {
    return v->rows ? (v->rows - 1) * og_kv_layer_view_row_stride(v) + row_elems(i) : 0;
}
#define PACK_ROW 96  /* bytes of a packed row (see the top) */
#define RING_BLOCK 224
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
            const int64_t at = slot_of(i, p) * og_kv_layer_view_row_stride(&v);
            for (int64_t e = 0; e < row_elems(i); e++) {
                ((float *)v.k)[at + e] = pattern(i, 0, p, e, salt);
                ((float *)v.v)[at + e] = pattern(i, 1, p, e, salt);
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
        for (int64_t p = lo; p < v.length; p++) {
            const int64_t at = slot_of(i, p) * og_kv_layer_view_row_stride(&v);
            for (int64_t e = 0; e < row_elems(i); e++) {
                bad += ((const float *)v.k)[at + e] != pattern(i, 0, p, e, salt);
                bad += ((const float *)v.v)[at + e] != pattern(i, 1, p, e, salt);
            }
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
        size_t n = (size_t)span_elems(&sn->views[i], i) * sizeof(float);
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
        size_t n = (size_t)span_elems(&sn->views[i], i) * sizeof(float);
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

/* The packed block of s is backed for exactly its rows (the fake allocator
 * has granularity 0: exact), reserved for max_capacity of them, and the ring
 * shares one plain block. */
static void check_backed(inplace_alloc *f, const og_kv_session *s) {
    og_kv_layer_view a, b, c;
    CHECK_OK(og_kv_session_layer_view(s, 0, &a));
    CHECK_OK(og_kv_session_layer_view(s, 1, &b));
    CHECK_OK(og_kv_session_layer_view(s, 2, &c));
    const fake_block *pack = fake_find(f, a.k), *ring = fake_find(f, c.k);
    CHECK_MSG(pack && !pack->plain && pack->backed == (size_t)a.rows * PACK_ROW &&
                  pack->reserved == (size_t)k_cfg.max_capacity * PACK_ROW,
              "packed block: %zu bytes backed of %zu reserved for %lld rows", pack ? pack->backed : 0,
              pack ? pack->reserved : 0, (long long)a.rows);
    CHECK((char *)a.v == (char *)a.k + 32 && (char *)b.k == (char *)a.k + 64 && (char *)b.v == (char *)a.k + 80);
    CHECK(a.row_stride == PACK_ROW / 4 && b.row_stride == PACK_ROW / 4 && c.row_stride == 0);
    CHECK(b.rows == a.rows && c.rows == RING_R);
    CHECK_MSG(ring && ring->plain == RING_BLOCK && (char *)c.v == (char *)c.k + 112, "ring block");
}

/* The layers of s are bound where `first` says. */
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
    og_test_section("packed growth in place: same addresses, same rows, no copies");
    inplace_alloc f = {0};
    og_kv_allocator a = inplace_allocator(&f);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    og_kv_layer_view v0;
    CHECK_OK(og_kv_session_layer_view(s, 0, &v0));
    CHECK(v0.k == NULL && v0.rows == 0 && v0.row_stride == PACK_ROW / 4);
    CHECK_OK(step(s, 3, 0));
    check_rows(s, 3, RING_R); /* exact granularity: exactly the rows needed */
    CHECK(f.reserves == 1 && f.plain_allocs == 1 && f.grows == 0);
    check_backed(&f, s);
    check_metrics(s, 3, 3 + 3 + 7, 3 * PACK_ROW + RING_BLOCK, 2 * 3 * 56, 0, 0, 1);
    og_kv_layer_view first[NL];
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &first[i]));
    /* L: 6, 10, 14, 18, 22, 26, 30, 32: every step grows by one resize */
    const int32_t widths[] = {3, 4, 4, 4, 4, 4, 4, 2};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        CHECK_OK(step(s, widths[w], 0));
        CHECK_MSG(verify_rows(s, 0) == 0, "after step %zu", w);
        CHECK_MSG(same_addresses(s, first), "after step %zu: storage moved", w);
        check_backed(&f, s);
    }
    check_rows(s, 32, RING_R);
    /* growths count per flat layer grown: 8 resizes x 2 layers; no rebind */
    check_metrics(s, 32, 71, 32 * PACK_ROW + RING_BLOCK, 2 * (32 * 40 + 7 * 16), 16, 0, 9);
    CHECK(f.reserves == 1 && f.grows == 8 && f.shrinks == 0 && f.copies == 0 && f.plain_allocs == 1);
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);
    /* reset keeps the block; the next conversation reuses it without growing */
    og_kv_session_reset(s);
    CHECK_OK(step(s, 4, 5));
    CHECK(f.grows == 8 && same_addresses(s, first) && verify_rows(s, 5) == 0);
    og_kv_session_destroy(s);
    CHECK(f.held == 0 && f.bad_calls == 0 && live_blocks(&f) == 0);

    og_kv_allocator half = a;
    half.resize = NULL;
    CHECK_STATUS(og_kv_session_create(&k_cfg, &half, &s), OG_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL && strstr(og_last_error(), "reserve but not resize") != NULL);

    og_test_section("packed growth rounds to the allocator's granularity");
    inplace_alloc g = {0};
    og_kv_allocator ag = inplace_allocator(&g);
    ag.granularity = 1000; /* not a multiple of the row: 10 rows and 40 bytes a granule */
    CHECK_OK(og_kv_session_create(&k_cfg, &ag, &s));
    CHECK_OK(step(s, 3, 1));
    check_rows(s, 10, RING_R);
    const fake_block *pb = g.blocks[0].plain ? &g.blocks[1] : &g.blocks[0];
    CHECK(pb->backed == 1000);
    check_metrics(s, 3, 27, 1000 + RING_BLOCK, 2 * 3 * 56, 0, 0, 1);
    for (int i = 0; i < 2; i++) CHECK_OK(step(s, 4, 1)); /* 11 rows: 2000 bytes, 20 rows */
    check_rows(s, 20, RING_R);
    CHECK(pb->backed == 2000 && g.grows == 1);
    for (int i = 0; i < 5; i++) CHECK_OK(step(s, 4, 1)); /* 23 rows: 3000 bytes, 31 rows; then L = 31 */
    check_rows(s, 31, RING_R);
    CHECK(pb->backed == 3000 && g.grows == 2);
    CHECK_OK(step(s, 1, 1)); /* 32 rows: the reservation's 3072, not 4000 */
    check_rows(s, 32, RING_R);
    CHECK(pb->backed == 32 * PACK_ROW && g.grows == 3 && g.bad_calls == 0);
    /* backed rounds 3072 up to the granule: 4000 */
    check_metrics(s, 32, 71, 4000 + RING_BLOCK, 2 * (32 * 40 + 7 * 16), 6, 0, 9);
    CHECK(verify_rows(s, 1) == 0);
    og_kv_session_destroy(s);
    CHECK(g.held == 0 && live_blocks(&g) == 0);
}

static void test_fault_injection_in_place(void) {
    og_test_section("packed: fault injection at every reserve, resize and alloc");
    inplace_alloc f = {0};
    og_kv_fault_state fs = {.inner = inplace_allocator(&f)};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    CHECK(a.reserve != NULL && a.resize != NULL);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    /* the ring block, then the packed reservation */
    CHECK(fault_every_allocation(s, &fs, 3, 7, &f) == 2);
    check_rows(s, 3, RING_R);
    og_kv_layer_view first[NL];
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &first[i]));
    /* every later growth is one resize; a failed one leaves the block as it was */
    CHECK(fault_every_allocation(s, &fs, 3, 7, &f) == 1);
    CHECK(f.shrinks == 0 && f.grows == 1);
    check_rows(s, 6, RING_R);
    CHECK(fault_every_allocation(s, &fs, 4, 7, &f) == 1);
    CHECK(fault_every_allocation(s, &fs, 4, 7, &f) == 1);
    CHECK(f.shrinks == 0 && f.grows == 3);
    CHECK(og_kv_session_length(s) == 14 && same_addresses(s, first));
    check_rows(s, 14, RING_R);
    check_backed(&f, s);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.growth_count == 6 && m.rebinds == 0 && m.steps == 4);

    og_test_section("packed: a resize the allocator cannot back");
    snapshot sn;
    snap_take(s, &sn);
    f.limit = f.held + PACK_ROW; /* one more row fits, four do not */
    CHECK_STATUS(og_kv_session_prepare(s, 4), OG_ERR_OUT_OF_MEMORY);
    CHECK(strstr(og_kv_session_last_error(s), "resize") != NULL);
    CHECK(snap_same(s, &sn));
    snap_free(&sn);
    check_backed(&f, s);
    CHECK_OK(step(s, 1, 7));
    f.limit = 0;
    CHECK_OK(step(s, 4, 7));
    CHECK(verify_rows(s, 7) == 0 && same_addresses(s, first));
    check_rows(s, 19, RING_R);
    check_backed(&f, s);
    og_kv_session_destroy(s);
    CHECK(f.held == 0 && f.bad_calls == 0 && f.copies == 0 && live_blocks(&f) == 0);
}

static void check_capacity_packed(const og_kv_session *s, int64_t budget, int64_t reach, int64_t fresh) {
    og_kv_capacity c;
    CHECK_OK(og_kv_session_capacity(s, budget, &c));
    CHECK_MSG(c.tokens_reachable == reach && c.fresh_sessions == fresh && c.bytes_per_token == PACK_ROW &&
                  c.fresh_session_bytes == RING_BLOCK + PACK_ROW,
              "budget %lld at L=%lld: reachable %lld (want %lld), fresh %lld (want %lld), per token %lld, fresh bytes %lld",
              (long long)budget, (long long)og_kv_session_length(s), (long long)c.tokens_reachable, (long long)reach,
              (long long)c.fresh_sessions, (long long)fresh, (long long)c.bytes_per_token,
              (long long)c.fresh_session_bytes);
}

static void test_capacity_in_place(void) {
    og_test_section("capacity estimate: packed, no peak, exact rows");
    /* a first step of one token: ring 224 + one packed row 96 = 320 */
    inplace_alloc f = {0};
    og_kv_allocator a = inplace_allocator(&f);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    check_capacity_packed(s, 319, 0, 0);
    check_capacity_packed(s, 320, 1, 1);
    check_capacity_packed(s, 224 + 96 * 7 + 95, 7, 3);
    check_capacity_packed(s, 100000, 32, 312);
    CHECK_OK(step(s, 3, 0));
    CHECK_OK(step(s, 3, 0)); /* L = 6, 6 rows backed */
    check_capacity_packed(s, 0, 0, 0);
    check_capacity_packed(s, 95, 0, 0);
    check_capacity_packed(s, 96 * 5, 5, 1);
    check_capacity_packed(s, 96 * 26, 26, 7);
    check_capacity_packed(s, 96 * 27, 26, 8);
    og_kv_session_destroy(s);

    const int64_t budgets[] = {319, 320, 415, 416, 3295, 3296, 100000};
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

    og_test_section("capacity estimate: packed with a granularity");
    for (int64_t budget = 900; budget <= 4400; budget += 250) {
        inplace_alloc b = {.limit = budget};
        og_kv_allocator ab = inplace_allocator(&b);
        ab.granularity = 1000;
        CHECK_OK(og_kv_session_create(&k_cfg, &ab, &s));
        og_kv_capacity c;
        CHECK_OK(og_kv_session_capacity(s, budget, &c));
        CHECK(c.fresh_session_bytes == RING_BLOCK + 1000);
        /* the fake holds what it is asked: the session asks whole granules
         * (or the reservation's 3072 bytes at the end) */
        int64_t taken = decode_until_refused(s);
        int64_t want = budget < 1224 ? 0 : budget < 2224 ? 10 : budget < 3224 ? 20 : budget < 3296 ? 31 : 32;
        CHECK_MSG(taken == want, "budget %lld: decoded %lld, want %lld", (long long)budget, (long long)taken,
                  (long long)want);
        /* the estimate counts the last granule whole (4000 bytes backed) */
        int64_t est = budget < 1224 ? 0 : budget < 2224 ? 10 : budget < 3224 ? 20 : budget < 4224 ? 31 : 32;
        CHECK_MSG(c.tokens_reachable == est, "budget %lld: estimate %lld, want %lld", (long long)budget,
                  (long long)c.tokens_reachable, (long long)est);
        og_kv_session_destroy(s);
        CHECK(b.held == 0 && b.bad_calls == 0);
    }
}

/* int8 / fp8 sessions: every byte counted is a row's quants (Hkv * D), its
 * Hkv f32 scales and its padding to 16 bytes. */
static void test_quantized_bytes(void) {
    og_test_section("int8 and fp8: bytes counted with the scales");
    const og_dtype dts[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
    for (int i = 0; i < 2; i++) {
        og_kv_config cfg = k_cfg;
        cfg.kv_dtype = dts[i];
        int64_t flat_row = 0, ring_row = 0; /* bytes of one position's k and v, by hand */
        for (int l = 0; l < NL; l++) {
            const int64_t b = 2 * (((int64_t)k_layers[l].n_kv_heads * (k_layers[l].head_dim + 4) + 15) / 16 * 16);
            if (k_layers[l].policy == OG_KV_FLAT) flat_row += b;
            else ring_row += b;
        }
        og_kv_session *s = NULL;
        CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
        if (!s) continue;
        CHECK_OK(og_kv_session_prepare(s, 3));
        CHECK_OK(og_kv_session_commit(s, 3));
        /* dense: flat layers at initial_capacity 4 rows, the ring at R */
        check_metrics(s, 3, 2 * 4 + RING_R, 4 * flat_row + RING_R * ring_row, 3 * (flat_row + ring_row), 0, 0, 1);
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, 0, &v));
        CHECK(v.dtype == dts[i] && og_kv_layer_view_row_stride(&v) == 2 * (4 + 4)); /* 16: no padding */
        CHECK_OK(og_kv_session_layer_view(s, 1, &v));
        CHECK(og_kv_layer_view_row_stride(&v) == 16); /* 1 x (2 + 4) bytes, padded */
        og_kv_session_destroy(s);
    }
}

/* The host-heap allocator keeps freed blocks of 64 KiB and more, up to
 * 256 MiB in all, and hands one back for a request of between half its
 * size and its size; smaller blocks and requests go to the heap. */
static void test_cpu_allocator_keeps(void) {
    og_test_section("host-heap allocator: freed blocks kept for the next session");
    og_kv_allocator a = og_kv_allocator_cpu();
    enum { N = 300, MIB = 1 << 20 };
    unsigned char *p[N], *q[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(a.alloc(a.ctx, MIB, (void **)&p[i]));
        memset(p[i], i, MIB); /* writable to its last byte */
    }
    for (int i = 0; i < N; i++) a.free(a.ctx, p[i]);
    /* 256 of the 300 were kept (the last ones freed went back to the heap) */
    int reused = 0;
    for (int i = 0; i < N; i++) {
        CHECK_OK(a.alloc(a.ctx, MIB - 7 * i, (void **)&q[i]));
        for (int j = 0; j < N; j++) reused += q[i] == p[j];
        q[i][MIB - 7 * i - 1] = 1;
    }
    CHECK_MSG(reused == 256, "%d of %d freed 1 MiB blocks came back", reused, N);
    for (int i = 0; i < N; i++) a.free(a.ctx, q[i]);
    /* q[0..255] (the kept blocks, 1 MiB each) were kept again, filling the
     * cap; the rest went to the heap. Under half of 1 MiB: not one of them */
    unsigned char *r = NULL, *t = NULL;
    CHECK_OK(a.alloc(a.ctx, MIB / 2 - 1, (void **)&r));
    int hits = 0;
    for (int j = 0; j < 256; j++) hits += r == q[j];
    CHECK(hits == 0);
    a.free(a.ctx, r);
    /* small blocks are not kept, and the allocator refuses what it cannot hold */
    CHECK_STATUS(a.alloc(a.ctx, 0, (void **)&t), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.alloc(a.ctx, SIZE_MAX, (void **)&t), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(a.alloc(a.ctx, 100, (void **)&t));
    memset(t, 7, 100);
    a.free(a.ctx, t);
    a.free(a.ctx, NULL);
}

int main(void) {
    test_quantized_bytes();
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
    test_cpu_allocator_keeps();
    return og_test_finish();
}
