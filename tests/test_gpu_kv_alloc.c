/* KV storage on a CUDA device, with both device allocators: the stream-ordered
 * one (dense layers, growth copies into a larger block) and the
 * virtual-memory one (flat layers packed into one block that grows in
 * place), each also under fault injection.
 *   - a session grows its device blocks while rows written with cudaMemcpy
 *     survive every growth byte for byte, ring rows land at p mod R, and a
 *     failed growth leaves the device rows and pointers as they were; packed,
 *     the flat layers never move, rebinds stays 0, views report the packed
 *     row as row_stride, and a failed first step (ring block, reservation)
 *     leaves the session without storage;
 *   - packed sessions hold at most one granule more than their live bytes
 *     (bytes_allocated <= bytes_live + granularity once the ring is full),
 *     and bytes_allocated is the backed size;
 *   - reserve + resize directly: the address and the contents survive
 *     growing across many granules, shrinking and growing again; a resize
 *     the device cannot back fails with OUT_OF_MEMORY and changes nothing;
 *     misuse is refused;
 *   - packed rows of 8 KiB (k and v of 4 KiB) grown to 32 MiB (16
 *     granules) in steps of 333 tokens, a failure injected at the one
 *     resize of each growth;
 *   - eight sessions on one allocator, stepped in turn, stay disjoint and
 *     keep their own rows, destroyed in an interleaved order.
 * Skipped (77) without CUDA or without a device. */
#include "harness.h"

#ifdef OG_HAVE_CUDA
#include "kv/alloc_cuda.h"
#include "kv/kv.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

/* The small manifest: a flat layer of 32-byte rows and a ring, 256 rows. */
static const og_kv_layer_config k_small_layers[2] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 8},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 8, .n_kv_heads = 1, .head_dim = 16},
};
static const og_kv_config k_small = {
    .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 256,
    .initial_capacity = 4, .max_write = 8, .n_layers = 2, .layers = k_small_layers,
};
/* The large one: flat rows of 8 x 256 bf16 = 4 KiB, up to 4096 rows (16 MiB
 * for each of k and v), so growth spans many granules; a ring beside it. */
static const og_kv_layer_config k_big_layers[2] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 8, .head_dim = 256},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 16, .n_kv_heads = 1, .head_dim = 16},
};
static const og_kv_config k_big = {
    .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 4096,
    .initial_capacity = 4, .max_write = 512, .n_layers = 2, .layers = k_big_layers,
};

static int64_t row_elems(const og_kv_config *cfg, int l) {
    return (int64_t)cfg->layers[l].n_kv_heads * cfg->layers[l].head_dim;
}
static int64_t slot_of(const og_kv_config *cfg, int l, int64_t pos) {
    return cfg->layers[l].policy == OG_KV_RING ? pos % og_kv_layer_slots(cfg, &cfg->layers[l]) : pos;
}
static uint16_t pattern(int salt, int layer, int kv, int64_t pos, int64_t e) {
    return (uint16_t)(salt * 104729 + layer * 7919 + kv * 4099 + pos * 31 + e);
}

static bool cuda_ok(cudaError_t e, const char *what) {
    CHECK_MSG(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* Writes the prepared step's rows into device storage, as a kernel would. */
static void write_step(og_kv_session *s, int32_t T, int salt, cudaStream_t stream) {
    const og_kv_config *cfg = og_kv_session_config(s);
    cuda_ok(cudaStreamSynchronize(stream), "sync after prepare");
    for (int l = 0; l < cfg->n_layers; l++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, l, &v));
        const int64_t n = row_elems(cfg, l), stride = og_kv_layer_view_row_stride(&v);
        uint16_t *row = malloc((size_t)n * sizeof *row);
        for (int64_t p = v.length; p < v.length + T; p++)
            for (int kv = 0; kv < 2; kv++) {
                for (int64_t e = 0; e < n; e++) row[e] = pattern(salt, l, kv, p, e);
                char *base = kv ? v.v : v.k;
                cuda_ok(cudaMemcpy(base + slot_of(cfg, l, p) * stride * 2, row, (size_t)n * 2,
                                   cudaMemcpyHostToDevice),
                        "row to device");
            }
        free(row);
    }
}

/* Reads every committed row back from the device; returns mismatching elements. */
static int64_t verify_rows(const og_kv_session *s, int salt, cudaStream_t stream) {
    const og_kv_config *cfg = og_kv_session_config(s);
    cuda_ok(cudaStreamSynchronize(stream), "sync before read-back");
    int64_t bad = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, l, &v));
        const int64_t n = row_elems(cfg, l), R = og_kv_layer_slots(cfg, &cfg->layers[l]);
        const int64_t lo = cfg->layers[l].policy == OG_KV_RING && v.length > R ? v.length - R : 0;
        const int64_t live = v.length < v.rows ? v.length : v.rows, stride = og_kv_layer_view_row_stride(&v);
        uint16_t *host = malloc((size_t)(live * n) * sizeof *host + 1);
        for (int kv = 0; kv < 2; kv++) {
            /* the layer's n elements of each row, rows `stride` elements apart */
            if (live && !cuda_ok(cudaMemcpy2D(host, (size_t)n * 2, kv ? v.v : v.k, (size_t)stride * 2, (size_t)n * 2,
                                              (size_t)live, cudaMemcpyDeviceToHost),
                                 "read back"))
                bad++;
            for (int64_t p = lo; p < v.length; p++)
                for (int64_t e = 0; e < n; e++) bad += host[slot_of(cfg, l, p) * n + e] != pattern(salt, l, kv, p, e);
        }
        free(host);
    }
    return bad;
}

/* Steps the small manifest to max_capacity; before every growth, a prepare
 * whose second allocation fails must leave everything as it was. */
static void run_session(cudaStream_t stream, bool in_place) {
    og_kv_allocator dev;
    CHECK_OK(in_place ? og_kv_allocator_cuda_vmm(stream, &dev) : og_kv_allocator_cuda(stream, &dev));
    CHECK(!in_place || (dev.reserve && dev.resize)); /* every GPU this runs on manages virtual memory */
    og_kv_fault_state fs = {.inner = dev};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_small, &a, &s));
    if (!s) return;
    /* 3+1+8+5+8+8+2+7 = 42, then 26 steps of 8 = 250, then 6: exactly 256. */
    int32_t widths[35] = {3, 1, 8, 5, 8, 8, 2, 7};
    for (int i = 8; i < 34; i++) widths[i] = 8;
    widths[34] = 6;
    int64_t last_rows = 0, growths = 0;
    og_kv_layer_view first = {0};
    if (in_place) { /* the first step: the ring block, then the reservation */
        for (int fail_at = 1; fail_at <= 2; fail_at++) {
            og_kv_fault_arm(&fs, fail_at);
            CHECK_STATUS(og_kv_session_prepare(s, widths[0]), OG_ERR_OUT_OF_MEMORY);
            og_kv_layer_view v;
            og_kv_metrics m;
            CHECK_OK(og_kv_session_layer_view(s, 0, &v));
            CHECK_OK(og_kv_session_metrics(s, &m));
            CHECK(v.k == NULL && v.rows == 0 && m.bytes_allocated == 0 && m.rows_allocated == 0);
        }
        og_kv_fault_arm(&fs, 0);
    }
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        int32_t T = widths[i];
        og_kv_layer_view before;
        CHECK_OK(og_kv_session_layer_view(s, 0, &before));
        if (before.rows && before.rows < before.length + T) {
            /* This step grows: make its second allocation (or resize) fail first. */
            og_kv_fault_arm(&fs, 2);
            CHECK_STATUS(og_kv_session_prepare(s, T), OG_ERR_OUT_OF_MEMORY);
            og_kv_layer_view after;
            CHECK_OK(og_kv_session_layer_view(s, 0, &after));
            CHECK(after.k == before.k && after.v == before.v && after.rows == before.rows &&
                  after.length == before.length);
            CHECK(verify_rows(s, 0, stream) == 0);
            og_kv_fault_arm(&fs, 0);
        }
        CHECK_OK(og_kv_session_prepare(s, T));
        write_step(s, T, 0, stream);
        CHECK_OK(og_kv_session_commit(s, T));
        int64_t rows = og_kv_session_layer_rows(s, 0);
        if (last_rows && rows != last_rows) growths++;
        last_rows = rows;
        CHECK_MSG(verify_rows(s, 0, stream) == 0, "after step %zu (L=%lld, rows %lld)", i,
                  (long long)og_kv_session_length(s), (long long)rows);
        og_kv_layer_view now;
        CHECK_OK(og_kv_session_layer_view(s, 0, &now));
        if (i == 0) first = now;
        if (in_place) CHECK_MSG(now.k == first.k && now.v == first.v, "step %zu: storage moved", i);
    }
    /* dense flat rows: 4, then 16 (L 4 + 8), 32 (17), 64 (33), 128 (66), 256
     * (130); packed, a granule holds every packed row (64 bytes) of the
     * 256: one reservation backing 16 KiB, never grown */
    CHECK(og_kv_session_length(s) == 256);
    CHECK(og_kv_session_layer_rows(s, 0) == 256 &&
          og_kv_session_layer_rows(s, 1) == og_kv_layer_slots(&k_small, &k_small_layers[1]));
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(growths == (in_place ? 0 : 5) && m.growth_count == (in_place ? 0 : 5) && m.rebinds == (in_place ? 0 : 5));
    if (in_place) {
        og_kv_layer_view f, r;
        CHECK_OK(og_kv_session_layer_view(s, 0, &f));
        CHECK_OK(og_kv_session_layer_view(s, 1, &r));
        CHECK(f.row_stride == 2 * row_elems(&k_small, 0) && (char *)f.v == (char *)f.k + row_elems(&k_small, 0) * 2 &&
              r.row_stride == 0);
        const int64_t ring = 2 * og_kv_layer_slots(&k_small, &k_small_layers[1]) * row_elems(&k_small, 1) * 2;
        CHECK_MSG(m.bytes_allocated == (int64_t)a.granularity + ring && a.granularity == dev.granularity,
                  "bytes_allocated %lld, granularity %zu", (long long)m.bytes_allocated, a.granularity);
    }
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);

    og_kv_layer_view v;
    CHECK_OK(og_kv_session_layer_view(s, 0, &v));
    struct cudaPointerAttributes attr;
    if (cuda_ok(cudaPointerGetAttributes(&attr, v.k), "pointer attributes")) CHECK(attr.type == cudaMemoryTypeDevice);
    og_kv_session_destroy(s);
    cuda_ok(cudaStreamSynchronize(stream), "sync after destroy");
    og_kv_allocator_cuda_release(&dev);
}

/* Fills n bytes at dev + off with a pattern of `salt`; returns false on a CUDA error. */
static bool fill(char *dev, size_t off, size_t n, int salt) {
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)((off + i) * 131 + (size_t)salt);
    bool ok = cuda_ok(cudaMemcpy(dev + off, h, n, cudaMemcpyHostToDevice), "fill");
    free(h);
    return ok;
}
/* Bytes of [0, n) at dev that differ from what fill(dev, 0, n, salt) wrote. */
static size_t differ(const char *dev, size_t n, int salt) {
    unsigned char *h = malloc(n);
    size_t bad = 0;
    if (!cuda_ok(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost), "read back")) bad = n;
    for (size_t i = 0; !bad && i < n; i++) bad += h[i] != (unsigned char)(i * 131 + (size_t)salt);
    free(h);
    return bad;
}

static void test_reserve_resize(cudaStream_t stream) {
    og_test_section("reserve and resize keep the address and the contents");
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_cuda_vmm(stream, &a));
    const size_t g = og_kv_allocator_cuda_granularity(&a);
    CHECK_MSG(a.reserve && a.resize && g > 0 && a.granularity == g, "no growth in place (granularity %zu)", g);
    if (!a.reserve || !g) return;
    void *p = NULL;
    CHECK_OK(a.reserve(a.ctx, 8 * g + 123, 100, &p));
    char *d = p;
    if (!d || !fill(d, 0, g, 1)) goto out;
    CHECK_OK(a.resize(a.ctx, d, 3 * g + 5)); /* one granule -> four */
    CHECK(fill(d, g, 2 * g + 5, 1) && differ(d, 3 * g + 5, 1) == 0);
    CHECK_OK(a.resize(a.ctx, d, 8 * g + 123)); /* up to the reservation (nine granules) */
    CHECK(fill(d, 3 * g + 5, 5 * g + 118, 1) && differ(d, 8 * g + 123, 1) == 0);
    struct cudaPointerAttributes attr;
    if (cuda_ok(cudaPointerGetAttributes(&attr, d + 8 * g), "pointer attributes"))
        CHECK(attr.type == cudaMemoryTypeDevice);
    CHECK_STATUS(a.resize(a.ctx, d, 8 * g + 124), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(a.resize(a.ctx, d, g + 1)); /* shrink: the chunk mapped last goes, [0, 4g) stays */
    CHECK(differ(d, 2 * g, 1) == 0);
    CHECK_OK(a.resize(a.ctx, d, 5 * g)); /* and grow again */
    CHECK(differ(d, 2 * g, 1) == 0 && fill(d, 2 * g, 3 * g, 1) && differ(d, 5 * g, 1) == 0);
    /* work queued on the stream before a shrink finishes before the unmap */
    CHECK(cuda_ok(cudaMemsetAsync(d + 4 * g, 7, g, (cudaStream_t)stream), "memset"));
    CHECK_OK(a.resize(a.ctx, d, 2 * g));
    CHECK(differ(d, 2 * g, 1) == 0);
    a.free(a.ctx, d);

    og_test_section("a resize the device cannot back changes nothing");
    p = NULL;
    CHECK_OK(a.reserve(a.ctx, (size_t)1 << 40, g, &p)); /* a TiB of address space */
    d = p;
    if (d && fill(d, 0, g, 2)) {
        CHECK_STATUS(a.resize(a.ctx, d, (size_t)1 << 39), OG_ERR_OUT_OF_MEMORY); /* 512 GiB of memory */
        CHECK(differ(d, g, 2) == 0);
        CHECK_OK(a.resize(a.ctx, d, 2 * g));
        CHECK(fill(d, g, g, 2) && differ(d, 2 * g, 2) == 0);
        a.free(a.ctx, d);
    }

    og_test_section("misuse is refused");
    void *plain = NULL;
    CHECK_OK(a.alloc(a.ctx, 4096, &plain)); /* a plain block (ring layers) */
    CHECK_STATUS(a.resize(a.ctx, plain, 8192), OG_ERR_INVALID_ARGUMENT);
    a.free(a.ctx, plain);
    p = NULL;
    CHECK_STATUS(a.reserve(a.ctx, 100, 101, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.reserve(a.ctx, 100, 0, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL);
out:
    cuda_ok(cudaStreamSynchronize(stream), "sync");
    og_kv_allocator_cuda_release(&a);
    CHECK(a.ctx == NULL && a.reserve == NULL);
    og_kv_allocator_cuda_release(&a); /* a no-op now */
}

static void test_big_rows(cudaStream_t stream) {
    og_test_section("8 KiB packed rows grown to 32 MiB in place, a failure at every resize");
    og_kv_allocator dev;
    CHECK_OK(og_kv_allocator_cuda_vmm(stream, &dev));
    og_kv_fault_state fs = {.inner = dev};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_big, &a, &s));
    if (!s || !a.reserve) goto out;
    const int64_t g = (int64_t)a.granularity, P = 2 * row_elems(&k_big, 0) * 2; /* packed row bytes */
    const int64_t R = og_kv_layer_slots(&k_big, &k_big_layers[1]), ring = 2 * R * row_elems(&k_big, 1) * 2;
    og_kv_layer_view first = {0};
    int64_t growths = 0;
    /* steps of 333 tokens (the last 100): 13 steps, each but the first and
     * those that fit in the granules backed already grows by one resize */
    for (int step = 0; og_kv_session_length(s) < k_big.max_capacity; step++) {
        const int64_t L = og_kv_session_length(s);
        const int32_t T = (int32_t)(k_big.max_capacity - L < 333 ? k_big.max_capacity - L : 333);
        if (step > 0 && og_kv_session_layer_rows(s, 0) < L + T) {
            og_kv_fault_arm(&fs, 1); /* the one resize */
            CHECK_STATUS(og_kv_session_prepare(s, T), OG_ERR_OUT_OF_MEMORY);
            og_kv_layer_view v;
            CHECK_OK(og_kv_session_layer_view(s, 0, &v));
            CHECK(v.k == first.k && v.v == first.v && v.length == L && v.rows < L + T);
            CHECK_MSG(verify_rows(s, 0, stream) == 0, "step %d: the failed resize changed rows", step);
            og_kv_fault_arm(&fs, 0);
            growths++;
        }
        CHECK_OK(og_kv_session_prepare(s, T));
        write_step(s, T, 0, stream);
        CHECK_OK(og_kv_session_commit(s, T));
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, 0, &v));
        if (step == 0) first = v;
        CHECK_MSG(v.k == first.k && v.v == first.v && v.row_stride * 2 == P, "step %d: storage moved", step);
        CHECK_MSG(verify_rows(s, 0, stream) == 0, "after step %d (rows %lld)", step, (long long)v.rows);
        og_kv_metrics m;
        CHECK_OK(og_kv_session_metrics(s, &m));
        const int64_t Ln = og_kv_session_length(s), want = (Ln * P + g - 1) / g * g;
        CHECK_MSG(m.bytes_allocated == want + ring && v.rows == (want / P < k_big.max_capacity ? want / P : k_big.max_capacity),
                  "L=%lld: bytes_allocated %lld (want %lld + ring %lld), rows %lld", (long long)Ln,
                  (long long)m.bytes_allocated, (long long)want, (long long)ring, (long long)v.rows);
        if (Ln >= R)
            CHECK_MSG(m.bytes_allocated <= m.bytes_live + g, "L=%lld: backed %lld > live %lld + one granule",
                      (long long)Ln, (long long)m.bytes_allocated, (long long)m.bytes_live);
    }
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(m.length == 4096 && og_kv_session_layer_rows(s, 0) == 4096 && growths >= 2 && 4096 * P > 2 * g &&
          m.growth_count == growths &&
          m.rebinds == 0);
out:
    og_kv_session_destroy(s);
    og_kv_allocator_cuda_release(&dev);
}

static void test_many_sessions(cudaStream_t stream) {
    og_test_section("eight sessions on one allocator");
    enum { NS = 8 };
    og_kv_allocator a;
    CHECK_OK(og_kv_allocator_cuda_vmm(stream, &a));
    og_kv_session *s[NS] = {0};
    for (int i = 0; i < NS; i++) CHECK_OK(og_kv_session_create(&k_big, &a, &s[i]));
    /* session i steps 64 * (i + 1) tokens at a time until it holds 2048 */
    for (int round = 0; round < 32; round++)
        for (int i = 0; i < NS; i++) {
            const int32_t T = 64 * (i + 1);
            if (!s[i] || og_kv_session_length(s[i]) + T > 2048) continue;
            CHECK_OK(og_kv_session_prepare(s[i], T));
            write_step(s[i], T, i + 1, stream);
            CHECK_OK(og_kv_session_commit(s[i], T));
        }
    int64_t overlaps = 0;
    for (int i = 0; i < NS; i++) {
        if (!s[i]) continue;
        CHECK_MSG(verify_rows(s[i], i + 1, stream) == 0, "session %d", i);
        og_kv_metrics m;
        CHECK_OK(og_kv_session_metrics(s[i], &m));
        CHECK_MSG(m.rebinds == 0 && m.growth_count >= 1 && m.bytes_allocated <= m.bytes_live + (int64_t)a.granularity,
                  "session %d: %lld rebinds, %lld growths, backed %lld, live %lld", i, (long long)m.rebinds,
                  (long long)m.growth_count, (long long)m.bytes_allocated, (long long)m.bytes_live);
        /* every packed block reserves 32 MiB from its layer's k: no two may overlap */
        og_kv_layer_view vi;
        CHECK_OK(og_kv_session_layer_view(s[i], 0, &vi));
        const size_t span = (size_t)k_big.max_capacity * (size_t)og_kv_layer_view_row_stride(&vi) * 2;
        CHECK((char *)vi.v == (char *)vi.k + row_elems(&k_big, 0) * 2);
        for (int j = 0; j < i; j++) {
            og_kv_layer_view vj;
            if (!s[j]) continue;
            CHECK_OK(og_kv_session_layer_view(s[j], 0, &vj));
            const char *x = vi.k, *y = vj.k;
            overlaps += x < y + span && y < x + span;
        }
    }
    CHECK(overlaps == 0);
    /* destroy the even ones, the rest still hold their rows */
    for (int i = 0; i < NS; i += 2) {
        og_kv_session_destroy(s[i]);
        s[i] = NULL;
    }
    for (int i = 1; i < NS; i += 2)
        if (s[i]) CHECK_MSG(verify_rows(s[i], i + 1, stream) == 0, "session %d after the others went", i);
    for (int i = 1; i < NS; i += 2) og_kv_session_destroy(s[i]);
    og_kv_allocator_cuda_release(&a);
}

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return OG_TEST_SKIP;
    }
    og_test_section("default stream, growth by copy");
    run_session(NULL, false);
    og_test_section("default stream, growth in place");
    run_session(NULL, true);
    cudaStream_t stream;
    if (cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate")) {
        og_test_section("a created stream, growth by copy");
        run_session(stream, false);
        og_test_section("a created stream, growth in place");
        run_session(stream, true);
        test_reserve_resize(stream);
        test_big_rows(stream);
        test_many_sessions(stream);
        cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
    }
    og_kv_allocator a;
    CHECK_STATUS(og_kv_allocator_cuda(NULL, NULL), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_kv_allocator_cuda_vmm(NULL, NULL), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_kv_allocator_cuda(NULL, &a));
    CHECK(og_kv_allocator_cuda_granularity(&a) == 0);
    void *p = NULL;
    CHECK_STATUS(a.alloc(a.ctx, 0, &p), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(a.alloc(a.ctx, (size_t)1 << 62, &p), OG_ERR_OUT_OF_MEMORY);
    CHECK(p == NULL);
    return og_test_finish();
}
#else
#include <stdio.h>
int main(void) {
    printf("built without CUDA: skipped\n");
    return OG_TEST_SKIP;
}
#endif
