/* KV storage allocators: the host heap, host pages that grow in place, and
 * a fault-injecting wrapper that makes the n-th allocation (or reservation,
 * or resize) fail so rollback paths can be tested. */
#include "kv/kv.h"

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#define OG_KV_HAVE_PAGED 1
#endif

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
        a.granularity = state->inner.granularity;
    }
    return a;
}

void og_kv_fault_arm(og_kv_fault_state *state, int64_t fail_at) {
    if (!state) return;
    state->fail_at = fail_at;
    state->alloc_calls = 0;
}

/* ------------------------------------------------ host pages, in place
 *
 * A reservation is an anonymous private mapping of max_bytes rounded up to
 * pages, mapped PROT_NONE (no memory, and no commit charge, behind it); its
 * first `backed` bytes (whole pages) are made readable and writable. A
 * resize that grows makes the pages it adds accessible; one that shrinks
 * discards the pages wholly past the bytes kept (MADV_DONTNEED) and makes
 * them inaccessible again, so a stray read past a block's backed bytes
 * faults. Plain blocks (alloc) come from the host heap; the list of
 * reservations tells free which is which. */

#ifdef OG_KV_HAVE_PAGED

typedef struct paged_block {
    unsigned char *base;
    size_t max_bytes; /* reserve's max_bytes                        */
    size_t reserved;  /* mapped bytes: max_bytes rounded up to pages */
    size_t backed;    /* accessible bytes from base, whole pages     */
    struct paged_block *next;
} paged_block;

typedef struct paged_ctx {
    size_t page;
    pthread_mutex_t lock; /* guards `blocks` */
    paged_block *blocks;  /* live reservations */
} paged_ctx;

static size_t page_round(const paged_ctx *c, size_t bytes) { return (bytes + c->page - 1) / c->page * c->page; }

/* The reservation at ptr, or NULL. Caller holds the lock. */
static paged_block *paged_find(paged_ctx *c, const void *ptr, paged_block ***link) {
    for (paged_block **l = &c->blocks; *l; l = &(*l)->next)
        if ((*l)->base == ptr) {
            if (link) *link = l;
            return *l;
        }
    return NULL;
}

/* Makes [from, to) of b readable and writable; on failure leaves it
 * inaccessible again. */
static og_status paged_open(paged_block *b, size_t from, size_t to) {
    if (to <= from) return OG_OK;
    if (mprotect(b->base + from, to - from, PROT_READ | PROT_WRITE) == 0) return OG_OK;
    og_status st = og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: %zu bytes of host memory unavailable",
                                to - from);
    (void)mprotect(b->base + from, to - from, PROT_NONE);
    return st;
}

/* Gives back the pages of [from, to) of b. */
static og_status paged_close(paged_block *b, size_t from, size_t to) {
    if (to <= from) return OG_OK;
    if (madvise(b->base + from, to - from, MADV_DONTNEED) != 0 ||
        mprotect(b->base + from, to - from, PROT_NONE) != 0)
        return og_set_error(OG_ERR_BACKEND, "kv paged allocator: giving back %zu bytes failed", to - from);
    return OG_OK;
}

static og_status paged_reserve(void *ctx, size_t max_bytes, size_t bytes, void **out) {
    paged_ctx *c = ctx;
    if (!out || bytes == 0 || bytes > max_bytes || max_bytes > SIZE_MAX - c->page)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv paged allocator: reserve of %zu bytes backing %zu: %s",
                            max_bytes, bytes, !out ? "out is NULL" : "bad sizes");
    paged_block *b = og_calloc(1, sizeof *b);
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no host memory");
    b->max_bytes = max_bytes;
    b->reserved = page_round(c, max_bytes);
    void *p = mmap(NULL, b->reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        og_free(b);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no address space for %zu bytes", max_bytes);
    }
    b->base = p;
    og_status st = paged_open(b, 0, page_round(c, bytes));
    if (st != OG_OK) {
        munmap(p, b->reserved);
        og_free(b);
        return st;
    }
    b->backed = page_round(c, bytes);
    pthread_mutex_lock(&c->lock);
    b->next = c->blocks;
    c->blocks = b;
    pthread_mutex_unlock(&c->lock);
    *out = p;
    return OG_OK;
}

static og_status paged_resize(void *ctx, void *ptr, size_t bytes) {
    paged_ctx *c = ctx;
    pthread_mutex_lock(&c->lock);
    paged_block *b = paged_find(c, ptr, NULL);
    og_status st;
    if (!b || bytes == 0 || bytes > b->max_bytes) {
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "kv paged allocator: resize of %p to %zu bytes: %s", ptr, bytes,
                          !b ? "not a reservation of this allocator" : "outside the reservation");
    } else {
        const size_t target = page_round(c, bytes);
        st = target > b->backed ? paged_open(b, b->backed, target) : paged_close(b, target, b->backed);
        if (st == OG_OK) b->backed = target;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

static og_status paged_alloc(void *ctx, size_t bytes, void **out) { return cpu_alloc(ctx, bytes, out); }

static void paged_free(void *ctx, void *ptr) {
    paged_ctx *c = ctx;
    if (!ptr) return;
    pthread_mutex_lock(&c->lock);
    paged_block **link = NULL, *b = paged_find(c, ptr, &link);
    if (b) *link = b->next;
    pthread_mutex_unlock(&c->lock);
    if (!b) {
        og_free(ptr);
        return;
    }
    if (munmap(b->base, b->reserved) != 0) OG_WARN("kv paged allocator: munmap of %zu bytes failed", b->reserved);
    og_free(b);
}

og_status og_kv_allocator_paged(og_kv_allocator *out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_allocator_paged: out is NULL");
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return og_set_error(OG_ERR_UNSUPPORTED, "og_kv_allocator_paged: no page size");
    paged_ctx *c = og_calloc(1, sizeof *c);
    if (!c) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_kv_allocator_paged: no host memory");
    c->page = (size_t)page;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        og_free(c);
        return og_set_error(OG_ERR_BACKEND, "og_kv_allocator_paged: pthread_mutex_init failed");
    }
    *out = (og_kv_allocator){.alloc = paged_alloc, .free = paged_free, .copy = cpu_copy, .ctx = c,
                             .reserve = paged_reserve, .resize = paged_resize, .granularity = c->page};
    return OG_OK;
}

void og_kv_allocator_paged_release(og_kv_allocator *a) {
    if (!a || a->free != paged_free) return;
    paged_ctx *c = a->ctx;
    if (c->blocks) OG_WARN("og_kv_allocator_paged_release: reservations still live; unmapping them");
    while (c->blocks) {
        paged_block *b = c->blocks;
        c->blocks = b->next;
        munmap(b->base, b->reserved);
        og_free(b);
    }
    pthread_mutex_destroy(&c->lock);
    og_free(c);
    *a = (og_kv_allocator){0};
}

#else /* no mmap: growth in place is not available on the host */

og_status og_kv_allocator_paged(og_kv_allocator *out) {
    (void)out;
    return og_set_error(OG_ERR_UNSUPPORTED, "og_kv_allocator_paged: this system cannot reserve address space");
}

void og_kv_allocator_paged_release(og_kv_allocator *a) { (void)a; }

#endif
