/* Packed KV storage over the paged host allocator (growth in place, page
 * granularity), on a machine without a GPU:
 *   - layout: one block for the flat layers, row p = k and v of every flat
 *     layer in manifest order, each part on a 16-byte boundary; views report
 *     the packed row's width as row_stride; rings dense in one block;
 *   - growth across many pages to max_capacity: addresses never move, rows
 *     are the whole rows of the backed pages, bytes_allocated is the backed
 *     size, at most one page over the live rows when no row is padded;
 *   - fault injection at every allocation of a prepare, across many
 *     growths: the bytes of every committed row of every layer, the views,
 *     the metrics and the length are as they were;
 *   - og_update_and_attend_ref and og_update_and_attend_cpu (every
 *     instruction set this CPU has, with and without a pool) give the same
 *     outputs over packed storage as over dense storage, bit for bit (the
 *     same kernel runs the same arithmetic in the same order; only the
 *     addresses differ), and write only their own layer's parts of the
 *     step's rows: every other byte of the packed block is poisoned before
 *     and compared after each call, and a read of a poisoned byte would turn
 *     the outputs into NaN.
 *
 * The manifest: flat 0 (Hkv 2, D 64), flat 1 (Hkv 1, D 3: padded),
 * ring 2 (W 5, Hkv 2, D 8), flat 3 (Hkv 4, D 32), ring 4 (W 9, Hkv 1,
 * D 24); max_write 8. Letters: T tokens, L length, P packed row bytes,
 * R ring rows, W window. */
#include "harness.h"
#include "kernels/attend.h"
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NL 5
static const og_kv_layer_config k_layers[NL] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 64},
    {.layer_id = 1, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 1, .head_dim = 3},
    {.layer_id = 2, .policy = OG_KV_RING, .window = 5, .n_kv_heads = 2, .head_dim = 8},
    {.layer_id = 3, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 4, .head_dim = 32},
    {.layer_id = 4, .policy = OG_KV_RING, .window = 9, .n_kv_heads = 1, .head_dim = 24},
};
#define MAX_WRITE 8

static og_kv_config make_cfg(og_dtype dt, int64_t max_capacity) {
    return (og_kv_config){.version = OG_KV_MANIFEST_VERSION, .kv_dtype = dt, .max_capacity = max_capacity,
                          .initial_capacity = 4, .max_write = MAX_WRITE, .n_model_layers = NL, .n_layers = NL,
                          .layers = k_layers};
}

static int64_t align16(int64_t b) { return (b + 15) / 16 * 16; }
static int64_t elems(const og_kv_config *c, int i) {
    return (int64_t)c->layers[i].n_kv_heads * c->layers[i].head_dim;
}
static int64_t esize(const og_kv_config *c) { return (int64_t)og_dtype_size(c->kv_dtype); }
static bool is_ring(const og_kv_config *c, int i) { return c->layers[i].policy == OG_KV_RING; }
static int64_t ring_rows(const og_kv_config *c, int i) { return og_kv_layer_slots(c, &c->layers[i]); }

/* The layout, computed here from the documented rule. */
typedef struct layout {
    int64_t P;           /* packed row bytes        */
    int64_t off[NL][2];  /* flat: byte offset of k and v in the packed row */
    int64_t ring_bytes;  /* the ring block          */
} layout;

static layout layout_of(const og_kv_config *c) {
    layout lo = {0};
    for (int i = 0; i < c->n_layers; i++) {
        const int64_t part = elems(c, i) * esize(c);
        if (is_ring(c, i)) {
            lo.ring_bytes += 2 * align16(ring_rows(c, i) * part);
        } else {
            lo.off[i][0] = lo.P;
            lo.off[i][1] = lo.P + align16(part);
            lo.P += 2 * align16(part);
        }
    }
    return lo;
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }
static int64_t round_page(int64_t b) { return (b + (int64_t)page_size() - 1) / (int64_t)page_size() * (int64_t)page_size(); }

/* The pattern byte `b` of element e of position pos (kv 0 = k, 1 = v). */
static unsigned char pattern(int salt, int layer, int kv, int64_t pos, int64_t e, int64_t b) {
    return (unsigned char)(salt * 131 + layer * 37 + kv * 17 + pos * 7 + e * 3 + b + 1);
}

static int64_t slot_of(const og_kv_config *c, int i, int64_t pos) {
    return is_ring(c, i) ? pos % ring_rows(c, i) : pos;
}

/* The bytes of position pos's k (kv 0) or v row of layer i. */
static unsigned char *row_at(const og_kv_layer_view *v, const og_kv_config *c, int i, int kv, int64_t pos) {
    return (unsigned char *)(kv ? v->v : v->k) + slot_of(c, i, pos) * og_kv_layer_view_row_stride(v) * esize(c);
}

/* Writes the prepared step's rows as a kernel would. */
static void write_step(og_kv_session *s, const og_kv_config *c, int32_t T, int salt) {
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        for (int64_t p = v.length; p < v.length + T; p++)
            for (int kv = 0; kv < 2; kv++) {
                unsigned char *r = row_at(&v, c, i, kv, p);
                for (int64_t e = 0; e < elems(c, i); e++)
                    for (int64_t b = 0; b < esize(c); b++) r[e * esize(c) + b] = pattern(salt, i, kv, p, e, b);
            }
    }
}

/* Committed rows whose bytes differ from the pattern. */
static int64_t verify_rows(const og_kv_session *s, const og_kv_config *c, int salt) {
    int64_t bad = 0;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        const int64_t lo = is_ring(c, i) && v.length > ring_rows(c, i) ? v.length - ring_rows(c, i) : 0;
        for (int64_t p = lo; p < v.length; p++)
            for (int kv = 0; kv < 2; kv++) {
                const unsigned char *r = row_at(&v, c, i, kv, p);
                for (int64_t e = 0; e < elems(c, i); e++)
                    for (int64_t b = 0; b < esize(c); b++) bad += r[e * esize(c) + b] != pattern(salt, i, kv, p, e, b);
            }
    }
    return bad;
}

static og_status step(og_kv_session *s, const og_kv_config *c, int32_t T, int salt) {
    og_status st = og_kv_session_prepare(s, T);
    if (st != OG_OK) return st;
    write_step(s, c, T, salt);
    return og_kv_session_commit(s, T);
}

/* Checks the packed layout of s at its length against the documented rule. */
static void check_layout(const og_kv_session *s, const og_kv_config *c, const layout *lo, size_t granule) {
    og_kv_layer_view v[NL];
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &v[i]));
    const int64_t L = og_kv_session_length(s);
    const int64_t asked = round_page(L * lo->P) < c->max_capacity * lo->P ? round_page(L * lo->P)
                                                                           : c->max_capacity * lo->P;
    int64_t rows = asked / lo->P;
    if (rows > c->max_capacity) rows = c->max_capacity;
    const unsigned char *base = v[0].k;
    for (int i = 0; i < NL; i++) {
        if (is_ring(c, i)) {
            CHECK_MSG(v[i].row_stride == 0 && v[i].rows == ring_rows(c, i), "ring %d: stride %lld rows %lld", i,
                      (long long)v[i].row_stride, (long long)v[i].rows);
            continue;
        }
        CHECK_MSG(v[i].row_stride * esize(c) == lo->P && v[i].rows == rows &&
                      (const unsigned char *)v[i].k == base + lo->off[i][0] &&
                      (const unsigned char *)v[i].v == base + lo->off[i][1],
                  "flat %d at L=%lld: stride %lld (want %lld), rows %lld (want %lld), k +%td v +%td", i, (long long)L,
                  (long long)v[i].row_stride, (long long)(lo->P / esize(c)), (long long)v[i].rows, (long long)rows,
                  (const unsigned char *)v[i].k - base, (const unsigned char *)v[i].v - base);
    }
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    const int64_t held = (int64_t)((size_t)(asked + (int64_t)granule - 1) / granule * granule);
    CHECK_MSG(m.bytes_allocated == held + lo->ring_bytes && m.bytes_allocated - lo->ring_bytes >= L * lo->P &&
                  m.bytes_allocated - lo->ring_bytes < L * lo->P + (int64_t)granule,
              "L=%lld: bytes_allocated %lld, want %lld (+ ring %lld)", (long long)L, (long long)m.bytes_allocated,
              (long long)held, (long long)lo->ring_bytes);
}

static void test_growth(og_dtype dt) {
    char name[96];
    snprintf(name, sizeof name, "packed growth over pages to max_capacity (%s)", og_dtype_name(dt));
    og_test_section(name);
    const og_kv_config cfg = make_cfg(dt, 1500);
    const layout lo = layout_of(&cfg);
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_paged(&a));
    CHECK(a.granularity == page_size() && a.reserve && a.resize);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, &a, &s));
    if (!s) return;
    og_rng rng = og_rng_seed(11 + (uint64_t)dt);
    og_kv_layer_view first[NL];
    int64_t resizes = 0, last_rows = 0, n = 0;
    while (og_kv_session_length(s) < cfg.max_capacity) {
        int32_t T = 1 + (int32_t)(og_rng_next(&rng) % MAX_WRITE);
        if (T > cfg.max_capacity - og_kv_session_length(s)) T = (int32_t)(cfg.max_capacity - og_kv_session_length(s));
        CHECK_OK(step(s, &cfg, T, 3));
        if (n++ == 0)
            for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &first[i]));
        int64_t rows = og_kv_session_layer_rows(s, 0);
        if (last_rows && rows != last_rows) resizes++;
        last_rows = rows;
        check_layout(s, &cfg, &lo, page_size());
        bool same = true;
        for (int i = 0; i < NL; i++) {
            og_kv_layer_view v;
            CHECK_OK(og_kv_session_layer_view(s, i, &v));
            same = same && v.k == first[i].k && v.v == first[i].v;
        }
        CHECK_MSG(same, "L=%lld: storage moved", (long long)og_kv_session_length(s));
        if (n % 37 == 0) CHECK_MSG(verify_rows(s, &cfg, 3) == 0, "L=%lld", (long long)og_kv_session_length(s));
    }
    CHECK(verify_rows(s, &cfg, 3) == 0);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK_MSG(resizes > 100 && m.growth_count == 3 * resizes && m.rebinds == 0, "resizes %lld growth %lld",
              (long long)resizes, (long long)m.growth_count);
    CHECK(m.rows_allocated == 3 * cfg.max_capacity + ring_rows(&cfg, 2) + ring_rows(&cfg, 4));
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);
    og_kv_capacity cap;
    CHECK_OK(og_kv_session_capacity(s, 0, &cap));
    CHECK(cap.tokens_reachable == 0 && cap.bytes_per_token == lo.P);
    og_kv_session_destroy(s);
    og_kv_allocator_paged_release(&a);
    CHECK(a.alloc == NULL);
}

/* Flat layers only, rows that need no padding: backed <= live + one page. */
static void test_bound(void) {
    og_test_section("backed bytes <= live bytes + one granule");
    static const og_kv_layer_config flat[3] = {
        {.layer_id = 0, .policy = OG_KV_FLAT, .n_kv_heads = 8, .head_dim = 128},
        {.layer_id = 1, .policy = OG_KV_FLAT, .n_kv_heads = 1, .head_dim = 8},
        {.layer_id = 2, .policy = OG_KV_FLAT, .n_kv_heads = 2, .head_dim = 64},
    };
    const og_kv_config cfg = {.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 3000,
                              .initial_capacity = 16, .max_write = 64, .n_layers = 3, .layers = flat};
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_paged(&a));
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, &a, &s));
    if (!s) return;
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.bytes_allocated == 0); /* nothing before the first step */
    og_rng rng = og_rng_seed(5);
    int64_t worst = 0;
    while (og_kv_session_length(s) < cfg.max_capacity) {
        int32_t T = og_rng_next(&rng) % 4 ? 1 : 1 + (int32_t)(og_rng_next(&rng) % 64);
        if (T > cfg.max_capacity - og_kv_session_length(s)) T = (int32_t)(cfg.max_capacity - og_kv_session_length(s));
        CHECK_OK(og_kv_session_prepare(s, T));
        CHECK_OK(og_kv_session_commit(s, T));
        CHECK_OK(og_kv_session_metrics(s, &m));
        CHECK_MSG(m.bytes_allocated >= m.bytes_live && m.bytes_allocated <= m.bytes_live + (int64_t)a.granularity,
                  "L=%lld: backed %lld, live %lld", (long long)m.length, (long long)m.bytes_allocated,
                  (long long)m.bytes_live);
        if (m.bytes_allocated - m.bytes_live > worst) worst = m.bytes_allocated - m.bytes_live;
    }
    CHECK(worst > 0 && worst < (int64_t)a.granularity);
    og_kv_session_destroy(s);
    og_kv_allocator_paged_release(&a);
}

/* Every committed row of every layer, the views, the metrics and L. */
typedef struct snapshot {
    int64_t length;
    og_kv_metrics m;
    og_kv_layer_view views[NL];
    unsigned char *rows; /* the committed rows' bytes, layer by layer, k then v */
    size_t n;
} snapshot;

static size_t snap_rows(const og_kv_session *s, const og_kv_config *c, unsigned char *out) {
    size_t n = 0;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        const int64_t lo = is_ring(c, i) && v.length > ring_rows(c, i) ? v.length - ring_rows(c, i) : 0;
        const size_t bytes = (size_t)(elems(c, i) * esize(c));
        for (int64_t p = lo; p < v.length; p++)
            for (int kv = 0; kv < 2; kv++) {
                if (out) memcpy(out + n, row_at(&v, c, i, kv, p), bytes);
                n += bytes;
            }
    }
    return n;
}

static void snap_take(const og_kv_session *s, const og_kv_config *c, snapshot *sn) {
    sn->length = og_kv_session_length(s);
    CHECK_OK(og_kv_session_metrics(s, &sn->m));
    for (int i = 0; i < NL; i++) CHECK_OK(og_kv_session_layer_view(s, i, &sn->views[i]));
    sn->n = snap_rows(s, c, NULL);
    sn->rows = malloc(sn->n + 1);
    snap_rows(s, c, sn->rows);
}

static bool snap_same(const og_kv_session *s, const og_kv_config *c, const snapshot *sn) {
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    bool same = og_kv_session_length(s) == sn->length && m.length == sn->m.length &&
                m.rows_allocated == sn->m.rows_allocated && m.bytes_allocated == sn->m.bytes_allocated &&
                m.bytes_live == sn->m.bytes_live && m.growth_count == sn->m.growth_count &&
                m.rebinds == sn->m.rebinds && m.steps == sn->m.steps;
    for (int i = 0; i < NL; i++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        same = same && memcmp(&v, &sn->views[i], sizeof v) == 0;
    }
    if (!same) return false;
    unsigned char *now = malloc(sn->n + 1);
    same = snap_rows(s, c, now) == sn->n && memcmp(now, sn->rows, sn->n) == 0;
    free(now);
    return same;
}

static void test_faults(og_dtype dt) {
    char name[96];
    snprintf(name, sizeof name, "packed: fault injection at every allocation of every prepare (%s)",
             og_dtype_name(dt));
    og_test_section(name);
    const og_kv_config cfg = make_cfg(dt, 700);
    og_kv_fault_state fs = {0};
    CHECK_OK(og_kv_allocator_paged(&fs.inner));
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    CHECK(a.granularity == page_size());
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&cfg, &a, &s));
    if (!s) return;
    og_rng rng = og_rng_seed(23 + (uint64_t)dt);
    int64_t prepares = 0, growths = 0, failures = 0;
    while (og_kv_session_length(s) < cfg.max_capacity) {
        int32_t T = 1 + (int32_t)(og_rng_next(&rng) % MAX_WRITE);
        if (T > cfg.max_capacity - og_kv_session_length(s)) T = (int32_t)(cfg.max_capacity - og_kv_session_length(s));
        int k;
        for (k = 1; k < 10; k++) {
            snapshot sn;
            snap_take(s, &cfg, &sn);
            og_kv_fault_arm(&fs, k);
            og_status st = og_kv_session_prepare(s, T);
            if (st == OG_OK) {
                og_kv_session_abort(s);
                free(sn.rows);
                break;
            }
            failures++;
            CHECK_MSG(st == OG_ERR_OUT_OF_MEMORY, "L=%lld fail_at %d: %s", (long long)og_kv_session_length(s), k,
                      og_status_str(st));
            CHECK_MSG(strstr(og_kv_session_last_error(s), "fault injection") != NULL, "%s",
                      og_kv_session_last_error(s));
            CHECK_MSG(snap_same(s, &cfg, &sn), "L=%lld fail_at %d: the session changed",
                      (long long)og_kv_session_length(s), k);
            CHECK_STATUS(og_kv_session_commit(s, T), OG_ERR_STATE);
            free(sn.rows);
        }
        /* the first prepare takes the ring block and reserves; a growth resizes once */
        CHECK_MSG(prepares == 0 ? k - 1 == 2 : k - 1 <= 1, "L=%lld: %d allocations", (long long)og_kv_session_length(s),
                  k - 1);
        growths += prepares > 0 && k - 1 == 1;
        prepares++;
        og_kv_fault_arm(&fs, 0);
        CHECK_OK(step(s, &cfg, T, 9));
    }
    CHECK(verify_rows(s, &cfg, 9) == 0);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK_MSG(growths > 50 && m.growth_count == 3 * growths && m.rebinds == 0, "growths %lld, growth_count %lld",
              (long long)growths, (long long)m.growth_count);
    CHECK(fs.failures == failures);
    og_kv_session_destroy(s);
    og_kv_allocator_paged_release(&fs.inner);
}

/* ------------------------------------------------------------ kernels */

typedef enum kernel { K_REF, K_SCALAR, K_AVX2, K_AVX512, K_COUNT } kernel;

static og_status run_kernel(kernel k, const og_attend_args *a, og_threadpool *pool) {
    switch (k) {
    case K_REF: return og_update_and_attend_ref(a);
    case K_SCALAR: return og_update_and_attend_cpu_isa(a, pool, OG_CPU_ISA_SCALAR, NULL);
    case K_AVX2: return og_update_and_attend_cpu_isa(a, pool, OG_CPU_ISA_AVX2, NULL);
    default: return og_update_and_attend_cpu_isa(a, pool, OG_CPU_ISA_AVX512, NULL);
    }
}

static bool kernel_available(kernel k) {
    return k == K_REF || k == K_SCALAR || (k == K_AVX2 && og_cpu_isa_supported(OG_CPU_ISA_AVX2)) ||
           (k == K_AVX512 && og_cpu_isa_supported(OG_CPU_ISA_AVX512));
}

/* Poisons (0xFF bytes: NaN in f32 and bf16) every byte of the packed block
 * that is not a committed row part of a flat layer: row padding, and every
 * row from L on. The block starts at flat layer 0's k. */
static void poison_pack(const og_kv_session *s, const og_kv_config *c, const layout *lo) {
    og_kv_layer_view v;
    CHECK_OK(og_kv_session_layer_view(s, 0, &v));
    unsigned char *base = v.k;
    for (int64_t r = 0; r < v.rows; r++) {
        unsigned char *row = base + r * lo->P;
        if (r >= v.length) {
            memset(row, 0xFF, (size_t)lo->P);
            continue;
        }
        for (int i = 0; i < NL; i++) {
            if (is_ring(c, i)) continue;
            const int64_t part = elems(c, i) * esize(c);
            for (int kv = 0; kv < 2; kv++)
                memset(row + lo->off[i][kv] + part, 0xFF, (size_t)(align16(part) - part));
        }
    }
}

/* Dense storage: every flat row from L on poisoned. */
static void poison_dense(const og_kv_session *s, const og_kv_config *c) {
    for (int i = 0; i < NL; i++) {
        if (is_ring(c, i)) continue;
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, i, &v));
        const size_t part = (size_t)(elems(c, i) * esize(c));
        memset((unsigned char *)v.k + v.length * part, 0xFF, (size_t)(v.rows - v.length) * part);
        memset((unsigned char *)v.v + v.length * part, 0xFF, (size_t)(v.rows - v.length) * part);
    }
}

/* True when byte `at` of the packed block lies in layer i's k or v part of
 * a row in [r0, r1). */
static bool owned(const layout *lo, const og_kv_config *c, int i, int64_t at, int64_t r0, int64_t r1) {
    const int64_t r = at / lo->P, in = at % lo->P, part = elems(c, i) * esize(c);
    if (r < r0 || r >= r1) return false;
    return (in >= lo->off[i][0] && in < lo->off[i][0] + part) || (in >= lo->off[i][1] && in < lo->off[i][1] + part);
}

static void test_kernels(og_dtype dt) {
    char name[96];
    snprintf(name, sizeof name, "kernels over packed storage equal dense storage (%s)", og_dtype_name(dt));
    og_test_section(name);
    const og_kv_config cfg = make_cfg(dt, 400);
    const layout lo = layout_of(&cfg);
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_paged(&a));
    og_kv_session *dense = NULL, *packed = NULL;
    CHECK_OK(og_kv_session_create(&cfg, NULL, &dense));
    CHECK_OK(og_kv_session_create(&cfg, &a, &packed));
    og_threadpool *pool = og_threadpool_create(3);
    if (!dense || !packed || !pool) return;
    og_rng rng = og_rng_seed(77 + (uint64_t)dt);
    const int64_t maxe = 128; /* largest Hkv * D */
    float *q = malloc(sizeof(float) * MAX_WRITE * 2 * maxe), *k = malloc(sizeof(float) * MAX_WRITE * maxe);
    float *v = malloc(sizeof(float) * MAX_WRITE * maxe);
    float *out_d = malloc(sizeof(float) * MAX_WRITE * 2 * maxe), *out_p = malloc(sizeof(float) * MAX_WRITE * 2 * maxe);
    unsigned char *before = NULL;
    int64_t n_step = 0, checked = 0;
    /* prefill to past the split-K threshold, then decode steps for every kernel */
    while (og_kv_session_length(packed) + MAX_WRITE <= cfg.max_capacity) {
        const int64_t L = og_kv_session_length(packed);
        const int32_t T = L < 300 ? 1 + (int32_t)(og_rng_next(&rng) % MAX_WRITE) : 1;
        CHECK_OK(og_kv_session_prepare(dense, T));
        CHECK_OK(og_kv_session_prepare(packed, T));
        poison_dense(dense, &cfg);
        poison_pack(packed, &cfg, &lo);
        og_kv_layer_view pv0;
        CHECK_OK(og_kv_session_layer_view(packed, 0, &pv0));
        const size_t block = (size_t)(pv0.rows * lo.P);
        before = realloc(before, block);
        for (int i = 0; i < NL; i++) {
            kernel kn = (kernel)((n_step + i) % K_COUNT);
            while (!kernel_available(kn)) kn = (kernel)((kn + 1) % K_COUNT);
            og_threadpool *tp = (n_step / K_COUNT) % 2 ? pool : NULL;
            const int32_t Hq = 2 * cfg.layers[i].n_kv_heads;
            const int64_t E = elems(&cfg, i), D = cfg.layers[i].head_dim;
            og_rng_fill(&rng, q, (size_t)(T * Hq * D), -1.0f, 1.0f);
            og_rng_fill(&rng, k, (size_t)(T * E), -1.0f, 1.0f);
            og_rng_fill(&rng, v, (size_t)(T * E), -1.0f, 1.0f);
            og_attend_args ad = {.q = q, .k = k, .v = v, .out = out_d, .T = T, .n_heads = Hq};
            og_attend_args ap = ad;
            ap.out = out_p;
            CHECK_OK(og_kv_session_layer_view(dense, i, &ad.kv));
            CHECK_OK(og_kv_session_layer_view(packed, i, &ap.kv));
            og_poison(out_d, (size_t)(T * Hq * D));
            og_poison(out_p, (size_t)(T * Hq * D));
            memcpy(before, pv0.k, block);
            CHECK_OK(run_kernel(kn, &ad, tp));
            CHECK_OK(run_kernel(kn, &ap, tp));
            bool finite = true;
            for (int64_t x = 0; x < T * Hq * D; x++) finite = finite && isfinite(out_p[x]);
            CHECK_MSG(finite && memcmp(out_d, out_p, sizeof(float) * (size_t)(T * Hq * D)) == 0,
                      "layer %d, kernel %d, L=%lld T=%d: packed outputs differ from dense", i, (int)kn, (long long)L,
                      (int)T);
            /* the packed block: only layer i's parts of rows L .. L+T-1 changed (flat),
             * nothing at all (ring) */
            const unsigned char *now = pv0.k;
            int64_t stray = 0, first_stray = -1;
            for (int64_t at = 0; at < (int64_t)block; at++) {
                const bool mine = !is_ring(&cfg, i) && owned(&lo, &cfg, i, at, L, L + T);
                if (!mine && now[at] != before[at]) {
                    if (first_stray < 0) first_stray = at;
                    stray++;
                }
            }
            CHECK_MSG(stray == 0, "layer %d, kernel %d, L=%lld: %lld bytes of other layers changed (first at %lld)", i,
                      (int)kn, (long long)L, (long long)stray, (long long)first_stray);
            /* what it wrote equals what the dense run wrote */
            bool rows_same = true;
            for (int64_t p = L; p < L + T; p++)
                for (int kvp = 0; kvp < 2; kvp++)
                    rows_same = rows_same && memcmp(row_at(&ad.kv, &cfg, i, kvp, p), row_at(&ap.kv, &cfg, i, kvp, p),
                                                    (size_t)(E * esize(&cfg))) == 0;
            CHECK_MSG(rows_same, "layer %d, kernel %d, L=%lld: written rows differ", i, (int)kn, (long long)L);
            checked++;
        }
        CHECK_OK(og_kv_session_commit(dense, T));
        CHECK_OK(og_kv_session_commit(packed, T));
        n_step++;
    }
    CHECK_MSG(og_kv_session_length(packed) > 300 && checked > 200, "L %lld, %lld calls",
              (long long)og_kv_session_length(packed), (long long)checked);

    og_test_section("og_attend_check: row stride bounds");
    og_attend_args bad = {.q = q, .k = k, .v = v, .out = out_p, .T = 1, .n_heads = 4};
    CHECK_OK(og_kv_session_prepare(packed, 1));
    CHECK_OK(og_kv_session_layer_view(packed, 0, &bad.kv));
    CHECK_OK(og_attend_check(&bad));
    bad.kv.row_stride = elems(&cfg, 0) - 1;
    CHECK_STATUS(og_attend_check(&bad), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "row stride") != NULL);
    bad.kv.row_stride = -1;
    CHECK_STATUS(og_attend_check(&bad), OG_ERR_INVALID_ARGUMENT);
    bad.kv.row_stride = INT64_MAX / 2;
    CHECK_STATUS(og_attend_check(&bad), OG_ERR_INVALID_ARGUMENT);
    og_kv_session_abort(packed);

    free(q), free(k), free(v), free(out_d), free(out_p), free(before);
    og_threadpool_destroy(pool);
    og_kv_session_destroy(dense);
    og_kv_session_destroy(packed);
    og_kv_allocator_paged_release(&a);
}

static void test_paged_allocator(void) {
    og_test_section("paged allocator: reserve, resize, free, misuse");
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_paged(&a));
    const size_t pg = a.granularity;
    unsigned char *p = NULL, *h = NULL;
    CHECK_OK(a.reserve(a.ctx, 100 * pg, 1, (void **)&p));
    memset(p, 1, pg); /* the first page is backed */
    CHECK_OK(a.resize(a.ctx, p, 40 * pg + 3));
    memset(p + pg, 2, 40 * pg); /* 41 pages backed */
    CHECK(p[0] == 1 && p[41 * pg - 1] == 2);
    CHECK_OK(a.resize(a.ctx, p, 2 * pg)); /* keep two pages */
    CHECK(p[0] == 1 && p[2 * pg - 1] == 2);
    CHECK_OK(a.resize(a.ctx, p, 100 * pg));
    CHECK(p[0] == 1 && p[2 * pg] == 0 && p[100 * pg - 1] == 0); /* given-back pages come back zeroed */
    CHECK_STATUS(a.resize(a.ctx, p, 100 * pg + 1), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.resize(a.ctx, p, 0), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.resize(a.ctx, p + pg, pg), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.reserve(a.ctx, pg, 2 * pg, (void **)&h), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(a.alloc(a.ctx, 100, (void **)&h)); /* a heap block */
    CHECK_OK(a.copy(a.ctx, h, p, 100));
    CHECK(h[0] == 1);
    CHECK_STATUS(a.resize(a.ctx, h, 50), OG_ERR_INVALID_ARGUMENT);
    a.free(a.ctx, h);
    a.free(a.ctx, p);
    a.free(a.ctx, NULL);
    CHECK_OK(a.reserve(a.ctx, 3 * pg, pg, (void **)&p)); /* left for release to unmap */
    og_kv_allocator_paged_release(&a);
    og_kv_allocator_paged_release(&a); /* zeroed: a no-op */
    og_kv_allocator cpu = og_kv_allocator_cpu();
    og_kv_allocator_paged_release(&cpu); /* not paged: a no-op */
    CHECK(cpu.alloc != NULL && cpu.granularity == 0);
    CHECK_STATUS(og_kv_allocator_paged(NULL), OG_ERR_INVALID_ARGUMENT);
}

int main(void) {
    test_paged_allocator();
    test_growth(OG_DTYPE_BF16);
    test_growth(OG_DTYPE_F32);
    test_bound();
    test_faults(OG_DTYPE_BF16);
    test_faults(OG_DTYPE_F32);
    test_kernels(OG_DTYPE_BF16);
    test_kernels(OG_DTYPE_F32);
    return og_test_finish();
}
