/* KV storage on a CUDA device: a session grows its device blocks while rows
 * written with cudaMemcpy survive every growth byte for byte, ring rows land
 * at p mod R, and a failed growth (fault injection around the device
 * allocator) leaves the device rows and pointers as they were.
 * Skipped (77) without CUDA or without a device. */
#include "harness.h"

#ifdef OG_HAVE_CUDA
#include "kv/alloc_cuda.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#define NL 2
#define RING_R (8 + 8 - 1)
static const og_kv_layer_config k_layers[NL] = {
    {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 8},
    {.layer_id = 1, .policy = OG_KV_RING, .window = 8, .n_kv_heads = 1, .head_dim = 16},
};
static const og_kv_config k_cfg = {
    .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 256,
    .initial_capacity = 4, .max_write = 8, .n_layers = NL, .layers = k_layers,
};
enum { ROW_ELEMS = 16 }; /* Hkv * D of both layers */

static uint16_t pattern(int layer, int kv, int64_t pos, int e) {
    return (uint16_t)(layer * 7919 + kv * 4099 + pos * 31 + e);
}
static int64_t slot_of(int layer, int64_t pos) { return k_layers[layer].policy == OG_KV_RING ? pos % RING_R : pos; }

static bool cuda_ok(cudaError_t e, const char *what) {
    CHECK_MSG(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* Writes the prepared step's rows into device storage, as a kernel would. */
static void write_step(og_kv_session *s, int32_t T, cudaStream_t stream) {
    cuda_ok(cudaStreamSynchronize(stream), "sync after prepare");
    uint16_t row[ROW_ELEMS];
    for (int l = 0; l < NL; l++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, l, &v));
        for (int64_t p = v.length; p < v.length + T; p++)
            for (int kv = 0; kv < 2; kv++) {
                for (int e = 0; e < ROW_ELEMS; e++) row[e] = pattern(l, kv, p, e);
                char *base = kv ? v.v : v.k;
                cuda_ok(cudaMemcpy(base + slot_of(l, p) * sizeof row, row, sizeof row, cudaMemcpyHostToDevice),
                        "row to device");
            }
    }
}

/* Reads every committed row back from the device; returns mismatching elements. */
static int64_t verify_rows(const og_kv_session *s, cudaStream_t stream) {
    cuda_ok(cudaStreamSynchronize(stream), "sync before read-back");
    int64_t bad = 0;
    for (int l = 0; l < NL; l++) {
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s, l, &v));
        size_t n = (size_t)v.rows * ROW_ELEMS;
        uint16_t *host = malloc(n * sizeof *host);
        int64_t lo = k_layers[l].policy == OG_KV_RING && v.length > RING_R ? v.length - RING_R : 0;
        for (int kv = 0; kv < 2; kv++) {
            if (!cuda_ok(cudaMemcpy(host, kv ? v.v : v.k, n * sizeof *host, cudaMemcpyDeviceToHost), "read back"))
                bad++;
            for (int64_t p = lo; p < v.length; p++)
                for (int e = 0; e < ROW_ELEMS; e++) bad += host[slot_of(l, p) * ROW_ELEMS + e] != pattern(l, kv, p, e);
        }
        free(host);
    }
    return bad;
}

static void run_session(cudaStream_t stream) {
    og_kv_allocator dev;
    CHECK_OK(og_kv_allocator_cuda(stream, &dev));
    og_kv_fault_state fs = {.inner = dev};
    og_kv_allocator a = og_kv_allocator_faulty(&fs);
    og_kv_session *s = NULL;
    CHECK_OK(og_kv_session_create(&k_cfg, &a, &s));
    if (!s) return;
    /* 3+1+8+5+8+8+2+7 = 42, then 26 steps of 8 = 250, then 6: exactly 256. */
    int32_t widths[35] = {3, 1, 8, 5, 8, 8, 2, 7};
    for (int i = 8; i < 34; i++) widths[i] = 8;
    widths[34] = 6;
    int64_t last_rows = 0, growths = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        int32_t T = widths[i];
        og_kv_layer_view before;
        CHECK_OK(og_kv_session_layer_view(s, 0, &before));
        if (before.rows && before.rows < before.length + T) {
            /* This step grows: make its second allocation fail first. */
            og_kv_fault_arm(&fs, 2);
            CHECK_STATUS(og_kv_session_prepare(s, T), OG_ERR_OUT_OF_MEMORY);
            og_kv_layer_view after;
            CHECK_OK(og_kv_session_layer_view(s, 0, &after));
            CHECK(after.k == before.k && after.v == before.v && after.rows == before.rows &&
                  after.length == before.length);
            CHECK(verify_rows(s, stream) == 0);
            og_kv_fault_arm(&fs, 0);
        }
        CHECK_OK(og_kv_session_prepare(s, T));
        write_step(s, T, stream);
        CHECK_OK(og_kv_session_commit(s, T));
        int64_t rows = og_kv_session_layer_rows(s, 0);
        if (last_rows && rows != last_rows) growths++;
        last_rows = rows;
        CHECK_MSG(verify_rows(s, stream) == 0, "after step %zu (L=%lld, rows %lld)", i,
                  (long long)og_kv_session_length(s), (long long)rows);
    }
    /* flat rows: 4, then 16 (L 4 + 8), 32 (17), 64 (33), 128 (66), 256 (130) */
    CHECK(og_kv_session_length(s) == 256);
    CHECK(og_kv_session_layer_rows(s, 0) == 256 && og_kv_session_layer_rows(s, 1) == RING_R);
    og_kv_metrics m;
    CHECK_OK(og_kv_session_metrics(s, &m));
    CHECK(growths == 5 && m.growth_count == 5 && m.rebinds == 5);
    CHECK_STATUS(og_kv_session_prepare(s, 1), OG_ERR_CAPACITY);

    og_kv_layer_view v;
    CHECK_OK(og_kv_session_layer_view(s, 0, &v));
    struct cudaPointerAttributes attr;
    if (cuda_ok(cudaPointerGetAttributes(&attr, v.k), "pointer attributes")) CHECK(attr.type == cudaMemoryTypeDevice);
    og_kv_session_destroy(s);
    cuda_ok(cudaStreamSynchronize(stream), "sync after destroy");
}

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return OG_TEST_SKIP;
    }
    og_test_section("default stream");
    run_session(NULL);
    og_test_section("a created stream");
    cudaStream_t stream;
    if (cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate")) {
        run_session(stream);
        cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
    }
    og_kv_allocator a;
    CHECK_STATUS(og_kv_allocator_cuda(NULL, NULL), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_kv_allocator_cuda(NULL, &a));
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
