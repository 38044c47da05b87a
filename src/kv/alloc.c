/* KV storage allocators: the host heap, and a fault-injecting wrapper that
 * makes the n-th allocation (or reservation, or resize) fail so rollback
 * paths can be tested. */
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
    return (og_kv_allocator){.alloc = cpu_alloc, .free = cpu_free, .copy = cpu_copy};
}

/* Counts one allocation call; true when it is the one made to fail. */
static bool faulty_fails(og_kv_fault_state *st, const char *what, size_t bytes) {
    st->alloc_calls++;
    if (st->fail_at <= 0 || st->alloc_calls != st->fail_at) return false;
    st->failures++;
    og_set_error(OG_ERR_OUT_OF_MEMORY, "kv fault injection: allocation %lld (%s of %zu bytes) made to fail",
                 (long long)st->alloc_calls, what, bytes);
    return true;
}

static og_status faulty_alloc(void *ctx, size_t bytes, void **out) {
    og_kv_fault_state *st = ctx;
    if (faulty_fails(st, "alloc", bytes)) return OG_ERR_OUT_OF_MEMORY;
    return st->inner.alloc(st->inner.ctx, bytes, out);
}

static og_status faulty_reserve(void *ctx, size_t max_bytes, size_t bytes, void **out) {
    og_kv_fault_state *st = ctx;
    if (faulty_fails(st, "reserve", bytes)) return OG_ERR_OUT_OF_MEMORY;
    return st->inner.reserve(st->inner.ctx, max_bytes, bytes, out);
}

static og_status faulty_resize(void *ctx, void *ptr, size_t bytes) {
    og_kv_fault_state *st = ctx;
    if (faulty_fails(st, "resize", bytes)) return OG_ERR_OUT_OF_MEMORY;
    return st->inner.resize(st->inner.ctx, ptr, bytes);
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
    og_kv_allocator a = {.alloc = faulty_alloc, .free = faulty_free, .copy = faulty_copy, .ctx = state};
    if (state && state->inner.reserve && state->inner.resize) {
        a.reserve = faulty_reserve;
        a.resize = faulty_resize;
    }
    return a;
}

void og_kv_fault_arm(og_kv_fault_state *state, int64_t fail_at) {
    if (!state) return;
    state->fail_at = fail_at;
    state->alloc_calls = 0;
}
