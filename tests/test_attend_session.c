/* update_and_attend over storage owned by KV sessions: growth keeps outputs
 * identical, failed growth leaves a retried step identical, chunking
 * invariance, isolation between sessions, and a too-wide step refused
 * before any write.
 *
 * The whole suite runs over bf16, int8 and fp8 storage (int8 / fp8 rows:
 * quants, a scale per head, padding to 16 bytes: 48 and 32 bytes here), the
 * oracle fed k/v rounded as each stores them.
 *
 * The model: two attention layers, flat layer 0
 * (Hq = 4, Hkv = 2, D = 16) and ring layer 1 (W = 8, Hq = 2, Hkv = 1,
 * D = 16). Letters: T tokens, L length, R ring rows, W window.
 *
 * Tolerance (checks against the oracle, and between chunkings whose f32
 * sums run in different orders): as in test_attend_ref.c, f32 accumulation
 * over <= 128 keys of values in [-1, 1) errs by ~1e-6; atol 2e-5 + rtol 1e-4.
 * Checks between runs of the same kernel on the same data are bitwise. */
#include "attend_seq.h"
#include "harness.h"
#include "kernels/attend.h"
#include "core/kv_quant.h"

#include <stdlib.h>
#include <string.h>

#define ATOL 2e-5
#define RTOL 1e-4
#define NL 2

static const og_kv_layer_config k_layers[NL] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 16},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 8, .n_kv_heads = 1, .head_dim = 16},
};
static const int32_t k_hq[NL] = {4, 2};
static og_dtype g_dt = OG_DTYPE_BF16; /* the storage of this run of the suite */

static og_kv_config make_cfg(int32_t max_write, int64_t max_capacity) {
    og_kv_config c = {.version = OG_KV_MANIFEST_VERSION, .kv_dtype = g_dt,
                      .max_capacity = max_capacity, .initial_capacity = 4,
                      .max_write = max_write, .n_model_layers = NL, .n_layers = NL,
                      .layers = k_layers};
    return c;
}

/* The token inputs of one sequence, per layer, and its outputs [N, Hq, D]. */
typedef struct model_seq {
    og_test_seq seq[NL];
    float *out[NL];
} model_seq;

static void seq_init(model_seq *m, int64_t n, uint64_t seed) {
    og_rng r = og_rng_seed(seed);
    for (int i = 0; i < NL; i++) {
        CHECK(og_test_seq_init(&m->seq[i], k_hq[i], k_layers[i].n_kv_heads,
                               k_layers[i].head_dim, g_dt, n));
        og_test_seq_append(&m->seq[i], &r, (int32_t)n);
        const size_t n_out = (size_t)n * k_hq[i] * k_layers[i].head_dim;
        m->out[i] = malloc(n_out * sizeof(float));
        og_poison(m->out[i], n_out);
    }
}

static void seq_free(model_seq *m) {
    for (int i = 0; i < NL; i++) {
        og_test_seq_free(&m->seq[i]);
        free(m->out[i]);
    }
}

/* Runs the kernel of layer i for tokens pos .. pos+T-1 over view kv. */
static og_status attend_layer(model_seq *m, int i, og_kv_layer_view kv, int64_t pos, int32_t T,
                              og_threadpool *pool) {
    const og_test_seq *s = &m->seq[i];
    og_attend_args a = {.q = s->q + pos * s->Hq * s->D, .k = s->k + pos * s->Hkv * s->D,
                        .v = s->v + pos * s->Hkv * s->D, .out = m->out[i] + pos * s->Hq * s->D,
                        .T = T, .n_heads = s->Hq, .kv = kv};
    og_poison(a.out, (size_t)T * s->Hq * s->D);
    return og_update_and_attend_cpu(&a, pool, NULL);
}

/* One step through a session: prepare, every layer's kernel, commit. */
static og_status session_step(og_kv_session *s, model_seq *m, int32_t T, og_threadpool *pool) {
    const int64_t pos = og_kv_session_length(s);
    og_status st = og_kv_session_prepare(s, T);
    if (st != OG_OK) return st;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view kv;
        st = og_kv_session_layer_view(s, i, &kv);
        if (st == OG_OK) st = attend_layer(m, i, kv, pos, T, pool);
        if (st != OG_OK) {
            og_kv_session_abort(s);
            return st;
        }
    }
    return og_kv_session_commit(s, T);
}

/* Outputs of tokens pos .. pos+T-1 against the oracle; worst ratio. */
static double check_oracle(const model_seq *m, int64_t pos, int32_t T) {
    double worst = 0;
    for (int i = 0; i < NL; i++) {
        const double r = og_test_seq_check(&m->seq[i], pos, T, k_layers[i].window, 0.0f,
                                           m->out[i] + pos * k_hq[i] * k_layers[i].head_dim,
                                           ATOL, RTOL);
        if (!(r <= worst)) worst = r;
    }
    return worst;
}

static bool same_outputs(const model_seq *a, const model_seq *b, int64_t pos, int32_t T) {
    for (int i = 0; i < NL; i++) {
        const size_t off = (size_t)pos * k_hq[i] * k_layers[i].head_dim;
        const size_t n = (size_t)T * k_hq[i] * k_layers[i].head_dim;
        if (memcmp(a->out[i] + off, b->out[i] + off, n * sizeof(float)) != 0) return false;
    }
    return true;
}

/* Storage the size of the largest a session could reach, allocated by hand:
 * the twin that never grows. */
typedef struct fixed_store {
    og_kv_layer_view kv[NL];
} fixed_store;

static void fixed_init(fixed_store *f, const og_kv_config *cfg) {
    for (int i = 0; i < NL; i++) {
        const int64_t rows = og_kv_layer_slots(cfg, &k_layers[i]);
        const size_t bytes =
            (size_t)(rows * og_kv_dtype_row_bytes(g_dt, k_layers[i].n_kv_heads, k_layers[i].head_dim));
        f->kv[i] = (og_kv_layer_view){.layer_id = k_layers[i].layer_id,
                                      .policy = k_layers[i].policy, .dtype = g_dt,
                                      .window = k_layers[i].window,
                                      .n_kv_heads = k_layers[i].n_kv_heads,
                                      .head_dim = k_layers[i].head_dim, .rows = rows,
                                      .k = malloc(bytes), .v = malloc(bytes)};
    }
}

static void fixed_step(fixed_store *f, model_seq *m, int64_t pos, int32_t T, og_threadpool *pool) {
    for (int i = 0; i < NL; i++) {
        f->kv[i].length = pos;
        CHECK_OK(attend_layer(m, i, f->kv[i], pos, T, pool));
    }
}

static void fixed_free(fixed_store *f) {
    for (int i = 0; i < NL; i++) {
        free(f->kv[i].k);
        free(f->kv[i].v);
    }
}

/* Growth 4 -> 8 -> 16 -> 32 and an exact fill; the fifth step's growth is
 * also failed at every allocation first and then retried. */
static void test_growth(og_threadpool *pool) {
    og_test_section("growth keeps outputs; failed growth leaves a retried step identical");
    const og_kv_config cfg = make_cfg(8, 32);
    og_kv_fault_state fs = {.inner = og_kv_allocator_cpu()};
    const og_kv_allocator alloc = og_kv_allocator_faulty(&fs);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, &alloc, &s));
    if (!s) return;
    model_seq grown, twin;
    seq_init(&grown, 32, 11);
    seq_init(&twin, 32, 11);
    fixed_store f;
    fixed_init(&f, &cfg);

    const int32_t widths[] = {3, 1, 4, 5, 8, 3, 8}; /* L: 3 4 8 13 21 24 32 (exact fill) */
    int64_t seen_rows[8] = {0};
    int n_seen = 0;
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
        const int64_t pos = og_kv_session_length(s);
        const int32_t T = widths[k];
        if (k == 4) { /* 13 + 8 = 21 rows: the step grows 16 -> 32 */
            int fail_at;
            for (fail_at = 1; fail_at < 50; fail_at++) {
                og_kv_fault_arm(&fs, fail_at);
                og_status st = og_kv_session_prepare(s, T);
                if (st == OG_OK) {
                    og_kv_session_abort(s);
                    break;
                }
                CHECK_STATUS(st, OG_ERR_OUT_OF_MEMORY);
                CHECK(og_kv_session_length(s) == pos);
                CHECK(og_kv_session_layer_rows(s, 0) == 16);
            }
            CHECK_MSG(fail_at > 1, "the growing step made no allocation");
            og_kv_fault_arm(&fs, 0);
        }
        CHECK_OK(session_step(s, &grown, T, pool));
        fixed_step(&f, &twin, pos, T, pool);
        CHECK_MSG(same_outputs(&grown, &twin, pos, T),
                  "step %zu (L=%lld, T=%d): outputs differ from never-growing storage", k,
                  (long long)pos, T);
        const double ratio = check_oracle(&grown, pos, T);
        CHECK_MSG(ratio <= 1.0, "step %zu: ratio %.3g vs oracle", k, ratio);
        const int64_t rows = og_kv_session_layer_rows(s, 0);
        if (n_seen == 0 || seen_rows[n_seen - 1] != rows) seen_rows[n_seen++] = rows;
    }
    CHECK_MSG(n_seen == 4 && seen_rows[0] == 4 && seen_rows[1] == 8 && seen_rows[2] == 16 &&
                  seen_rows[3] == 32,
              "flat rows went through %d sizes, want 4 8 16 32", n_seen);
    CHECK(og_kv_session_length(s) == 32);
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);

    fixed_free(&f);
    seq_free(&grown);
    seq_free(&twin);
    og_kv_session_destroy(s);
}

/* A 100-token sequence fed in steps of 1, 3, 7 and 100. */
static void test_chunking(og_threadpool *pool) {
    og_test_section("chunking invariance: steps of 1, 3, 7, 100");
    enum { N = 100 };
    const og_kv_config cfg = make_cfg(N, 128);
    model_seq whole;
    seq_init(&whole, N, 23);
    const int32_t chunk[4] = {100, 1, 3, 7};
    for (int c = 0; c < 4; c++) {
        model_seq m;
        seq_init(&m, N, 23);
        og_kv_session *s = NULL;
        CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
        if (!s) break;
        while (og_kv_session_length(s) < N) {
            const int64_t left = N - og_kv_session_length(s);
            CHECK_OK(session_step(s, &m, left < chunk[c] ? (int32_t)left : chunk[c], pool));
        }
        const double ratio = check_oracle(&m, 0, N);
        CHECK_MSG(ratio <= 1.0, "steps of %d: ratio %.3g vs oracle", chunk[c], ratio);
        if (c == 0) {
            for (int i = 0; i < NL; i++)
                memcpy(whole.out[i], m.out[i],
                       (size_t)N * k_hq[i] * k_layers[i].head_dim * sizeof(float));
        } else {
            for (int i = 0; i < NL; i++) {
                const double r = og_tol_ratio(m.out[i], whole.out[i],
                                              (size_t)N * k_hq[i] * k_layers[i].head_dim, ATOL,
                                              RTOL, NULL);
                CHECK_MSG(r <= 1.0, "layer %d, steps of %d vs one step of 100: ratio %.3g", i,
                          chunk[c], r);
            }
        }
        og_kv_session_destroy(s);
        seq_free(&m);
    }
    seq_free(&whole);
}

/* Two sessions on one config: NaN in one's storage never reaches the other. */
static void test_isolation(og_threadpool *pool) {
    og_test_section("isolation between sessions");
    const og_kv_config cfg = make_cfg(8, 32);
    og_kv_session *a = NULL, *b = NULL;
    CHECK_OK(og_kv_session_create(&cfg, NULL, &a));
    CHECK_OK(og_kv_session_create(&cfg, NULL, &b));
    if (!a || !b) return;
    model_seq ma, mb;
    seq_init(&ma, 32, 31);
    seq_init(&mb, 32, 31);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(session_step(a, &ma, 5, pool));
        CHECK_OK(session_step(b, &mb, 5, pool));
    }
    for (int i = 0; i < NL; i++) { /* poison every row a holds (all-ones: NaN bf16, int8 scales and fp8) */
        og_kv_layer_view kv;
        CHECK_OK(og_kv_session_layer_view(a, i, &kv));
        const size_t bytes = (size_t)(kv.rows * og_kv_dtype_row_bytes(kv.dtype, kv.n_kv_heads, kv.head_dim));
        memset(kv.k, 0xff, bytes);
        memset(kv.v, 0xff, bytes);
    }
    CHECK_OK(session_step(b, &mb, 3, pool));
    CHECK_OK(session_step(a, &ma, 3, pool));
    CHECK_MSG(check_oracle(&mb, 0, 13) <= 1.0, "session b's outputs changed");
    CHECK_MSG(isnan(ma.out[0][10 * k_hq[0] * k_layers[0].head_dim]),
              "the poison did not reach session a itself");
    seq_free(&ma);
    seq_free(&mb);
    og_kv_session_destroy(a);
    og_kv_session_destroy(b);
}

/* A step wider than max_write: refused by prepare, and by the kernel on a
 * bound ring view, with storage untouched. */
static void test_too_wide(og_threadpool *pool) {
    og_test_section("step wider than max_write refused before any write");
    const og_kv_config cfg = make_cfg(8, 32);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, NULL, &s));
    if (!s) return;
    model_seq m;
    seq_init(&m, 32, 41);
    CHECK_OK(session_step(s, &m, 6, pool));
    CHECK_STATUS(og_kv_session_prepare(s, 9), OG_ERR_WRITE_TOO_WIDE);
    CHECK(og_kv_session_length(s) == 6);

    CHECK_OK(og_kv_session_prepare(s, 8));
    og_kv_layer_view kv;
    CHECK_OK(og_kv_session_layer_view(s, 1, &kv));
    const size_t bytes = (size_t)(kv.rows * og_kv_dtype_row_bytes(kv.dtype, kv.n_kv_heads, kv.head_dim));
    void *k0 = malloc(bytes), *v0 = malloc(bytes);
    memcpy(k0, kv.k, bytes);
    memcpy(v0, kv.v, bytes);
    CHECK_STATUS(attend_layer(&m, 1, kv, 6, 9, pool), OG_ERR_WRITE_TOO_WIDE);
    CHECK(memcmp(k0, kv.k, bytes) == 0 && memcmp(v0, kv.v, bytes) == 0);
    og_kv_session_abort(s);
    free(k0);
    free(v0);
    seq_free(&m);
    og_kv_session_destroy(s);
}

int main(void) {
    og_threadpool *pool = og_threadpool_create(2);
    CHECK(pool != NULL);
    const og_dtype dts[3] = {OG_DTYPE_BF16, OG_DTYPE_INT8, OG_DTYPE_FP8};
    for (int d = 0; d < 3; d++) {
        g_dt = dts[d];
        fprintf(stderr, "== storage %s\n", og_dtype_name(g_dt));
        test_growth(pool);
        test_chunking(pool);
        test_isolation(pool);
        test_too_wide(pool);
    }
    og_threadpool_destroy(pool);
    return og_test_finish();
}
