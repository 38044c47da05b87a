/* KV storage allocators: the host heap, and a fault-injecting wrapper that
 * makes the n-th allocation fail so rollback paths can be tested. */
#include "kv/kv.h"

static og_status cpu_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    if (!out || bytes == 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cpu allocator: %s",
                            out ? "zero-byte allocation" : "out is NULL");
    void *p = og_malloc(bytes);
    if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cpu allocator: %zu bytes of host memory unavailable", bytes);
    *out = p;
    return OG_OK;
}

static void cpu_free(void *ctx, void *ptr) {
    (void)ctx;
    og_free(ptr);
}

static og_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes == 0) return OG_OK;
    if (!dst || !src) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cpu allocator: copy with a NULL pointer");
    memcpy(dst, src, bytes);
    return OG_OK;
}

og_kv_allocator og_kv_allocator_cpu(void) {
    return (og_kv_allocator){cpu_alloc, cpu_free, cpu_copy, NULL};
}

static og_status faulty_alloc(void *ctx, size_t bytes, void **out) {
    og_kv_fault_state *st = ctx;
    st->alloc_calls++;
    if (st->fail_at > 0 && st->alloc_calls == st->fail_at) {
        st->failures++;
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv fault injection: allocation %lld (%zu bytes) made to fail",
                            (long long)st->alloc_calls, bytes);
    }
    return st->inner.alloc(st->inner.ctx, bytes, out);
}

static void faulty_free(void *ctx, void *ptr) {
    og_kv_fault_state *st = ctx;
    st->inner.free(st->inner.ctx, ptr);
}

static og_status faulty_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    og_kv_fault_state *st = ctx;
    return st->inner.copy(st->inner.ctx, dst, src, bytes);
}

og_kv_allocator og_kv_allocator_faulty(og_kv_fault_state *state) {
    return (og_kv_allocator){faulty_alloc, faulty_free, faulty_copy, state};
}

void og_kv_fault_arm(og_kv_fault_state *state, int64_t fail_at) {
    if (!state) return;
    state->fail_at = fail_at;
    state->alloc_calls = 0;
}
