/* The KV planner against hand-computed runs (flat and ring W=16,
 * max_write=32, R=47), its refusals, and a brute-force oracle over many
 * (L, T) that walks positions one by one. */
#include "harness.h"
#include "kv/plan.h"

#include <string.h>

static const og_kv_layer_config k_flat = {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 1, .head_dim = 4};
static const og_kv_layer_config k_ring = {.layer_id = 1, .policy = OG_KV_RING, .window = 16, .n_kv_heads = 1, .head_dim = 4};
static const og_kv_layer_config k_layers[2] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 1, .head_dim = 4},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 16, .n_kv_heads = 1, .head_dim = 4},
};
static const og_kv_config k_cfg = {
    .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_F32, .max_capacity = 100,
    .initial_capacity = 4, .max_write = 32, .n_layers = 2, .layers = k_layers,
};

typedef struct want {
    int n;
    og_kv_run runs[2];
} want;

static bool runs_equal(int n, const og_kv_run *got, want w) {
    if (n != w.n) return false;
    for (int i = 0; i < n; i++)
        if (got[i].slot != w.runs[i].slot || got[i].pos != w.runs[i].pos || got[i].count != w.runs[i].count)
            return false;
    return true;
}

static void print_runs(const char *what, int n, const og_kv_run *r) {
    fprintf(stderr, "   %s:", what);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " {slot %lld, pos %lld, count %lld}", (long long)r[i].slot, (long long)r[i].pos,
                (long long)r[i].count);
    fputc('\n', stderr);
}

static void check_plan(const og_kv_layer_config *l, int64_t L, int32_t T, want w_write, want w_read) {
    og_kv_plan p;
    og_status st = og_kv_plan_layer(&k_cfg, l, L, T, &p);
    CHECK_MSG(st == OG_OK, "plan L=%lld T=%d: %s", (long long)L, (int)T, og_last_error());
    if (st != OG_OK) return;
    bool ok_w = runs_equal(p.n_write, p.write, w_write), ok_r = runs_equal(p.n_read, p.read, w_read);
    CHECK_MSG(ok_w, "%s plan L=%lld T=%d: write runs differ", l->policy == OG_KV_RING ? "ring" : "flat",
              (long long)L, (int)T);
    CHECK_MSG(ok_r, "%s plan L=%lld T=%d: read runs differ", l->policy == OG_KV_RING ? "ring" : "flat",
              (long long)L, (int)T);
    if (!ok_w) print_runs("write", p.n_write, p.write);
    if (!ok_r) print_runs("read", p.n_read, p.read);
    CHECK(p.length == L && p.width == T && p.policy == l->policy);
    CHECK(p.rows_needed == (l->policy == OG_KV_RING ? 47 : L + T));
    CHECK(p.slots == (l->policy == OG_KV_RING ? 47 : 100));
}

#define RUNS1(s, p, c) ((want){1, {{s, p, c}}})
#define RUNS2(s0, p0, c0, s1, p1, c1) ((want){2, {{s0, p0, c0}, {s1, p1, c1}}})

static void test_flat(void) {
    og_test_section("flat plans");
    check_plan(&k_flat, 0, 1, RUNS1(0, 0, 1), RUNS1(0, 0, 1));
    check_plan(&k_flat, 0, 5, RUNS1(0, 0, 5), RUNS1(0, 0, 5));
    check_plan(&k_flat, 7, 3, RUNS1(7, 7, 3), RUNS1(0, 0, 10));
    check_plan(&k_flat, 68, 32, RUNS1(68, 68, 32), RUNS1(0, 0, 100)); /* exactly to max_capacity */
    check_plan(&k_flat, 99, 1, RUNS1(99, 99, 1), RUNS1(0, 0, 100));
}

static void test_ring(void) {
    og_test_section("ring plans, W=16 max_write=32 R=47");
    CHECK(og_kv_layer_slots(&k_cfg, &k_ring) == 47);
    /* Early: the window is clipped at position 0. */
    check_plan(&k_ring, 0, 5, RUNS1(0, 0, 5), RUNS1(0, 0, 5));
    check_plan(&k_ring, 10, 1, RUNS1(10, 10, 1), RUNS1(0, 0, 11));
    /* A max_write step ending exactly at slot R-1: every slot read, no wrap. */
    check_plan(&k_ring, 15, 32, RUNS1(15, 15, 32), RUNS1(0, 0, 47));
    /* A max_write step straddling the wrap: reads cover all R slots, in two runs. */
    check_plan(&k_ring, 30, 32, RUNS2(30, 30, 17, 0, 47, 15), RUNS2(15, 15, 32, 0, 47, 15));
    /* Write wraps; window starts at 40 - 16 + 1 = 25. */
    check_plan(&k_ring, 40, 10, RUNS2(40, 40, 7, 0, 47, 3), RUNS2(25, 25, 22, 0, 47, 3));
    /* First position of the second lap. */
    check_plan(&k_ring, 47, 1, RUNS1(0, 47, 1), RUNS2(32, 32, 15, 0, 47, 1));
    /* After many wraps: 1000 mod 47 = 13, 985 mod 47 = 45. */
    check_plan(&k_ring, 1000, 1, RUNS1(13, 1000, 1), RUNS2(45, 985, 2, 0, 987, 14));
    check_plan(&k_ring, 1000, 32, RUNS1(13, 1000, 32), RUNS2(45, 985, 2, 0, 987, 45));
    /* A ring layer alone is not bound by max_capacity (the session is). */
    check_plan(&k_ring, 470, 3, RUNS1(0, 470, 3), RUNS2(32, 455, 15, 0, 470, 3));
}

static void test_refusals(void) {
    og_test_section("refusals leave the plan untouched");
    og_kv_plan p, before;
    memset(&p, 0x5a, sizeof p);
    before = p;
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, 0, 33, &p), OG_ERR_WRITE_TOO_WIDE);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_ring, 0, 33, &p), OG_ERR_WRITE_TOO_WIDE);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, 0, 0, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_ring, 5, -1, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, -1, 1, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, 69, 32, &p), OG_ERR_CAPACITY); /* one past */
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, 100, 1, &p), OG_ERR_CAPACITY);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, INT64_MAX, 1, &p), OG_ERR_CAPACITY);
    CHECK(memcmp(&p, &before, sizeof p) == 0);
    CHECK_STATUS(og_kv_plan_layer(&k_cfg, &k_flat, 0, 1, NULL), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_kv_plan_layer(&k_cfg, &k_flat, 68, 32, &p));
}

/* Expands runs into a position -> slot list, checking each run is contiguous
 * in both slots and positions and within the slot space. */
static int64_t expand(int n, const og_kv_run *runs, int64_t slots, int64_t *pos, int64_t *slot, int64_t cap) {
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        CHECK(runs[i].count >= 1);
        CHECK(runs[i].slot >= 0 && runs[i].slot + runs[i].count <= slots);
        for (int64_t j = 0; j < runs[i].count && k < cap; j++, k++) {
            pos[k] = runs[i].pos + j;
            slot[k] = runs[i].slot + j;
        }
    }
    return k;
}

static void test_oracle(void) {
    og_test_section("oracle: positions walked one by one");
    enum { CAP = 256 };
    int64_t pos[CAP], slot[CAP];
    int bad = 0;
    for (int li = 0; li < 2; li++) {
        const og_kv_layer_config *l = &k_layers[li];
        int ring = l->policy == OG_KV_RING;
        for (int64_t L = 0; L <= 300; L++) {
            for (int32_t T = 1; T <= 32; T++) {
                og_kv_plan p;
                og_status st = og_kv_plan_layer(&k_cfg, l, L, T, &p);
                if (!ring && L + T > 100) {
                    bad += st != OG_ERR_CAPACITY;
                    continue;
                }
                if (st != OG_OK) {
                    bad++;
                    continue;
                }
                /* writes: positions L .. L+T-1 in order, slot p (flat) or p mod 47 (ring) */
                int64_t n = expand(p.n_write, p.write, p.slots, pos, slot, CAP);
                bad += n != T;
                for (int64_t k = 0; k < n; k++)
                    bad += pos[k] != L + k || slot[k] != (ring ? pos[k] % 47 : pos[k]);
                /* reads: every key any query sees, each once, in order */
                int64_t lo = ring ? (L - 16 + 1 > 0 ? L - 16 + 1 : 0) : 0;
                n = expand(p.n_read, p.read, p.slots, pos, slot, CAP);
                bad += n != L + T - lo;
                for (int64_t k = 0; k < n; k++) {
                    bad += pos[k] != lo + k || slot[k] != (ring ? pos[k] % 47 : pos[k]);
                    /* no two visible keys share a slot */
                    for (int64_t m = 0; m < k; m++) bad += slot[m] == slot[k];
                }
            }
        }
    }
    CHECK_MSG(bad == 0, "%d mismatches", bad);
}

int main(void) {
    test_flat();
    test_ring();
    test_refusals();
    test_oracle();
    return og_test_finish();
}
