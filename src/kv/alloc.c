/* KV storage allocators: the host heap, host pages that grow in place, and
 * a fault-injecting wrapper that makes the n-th allocation (or reservation,
 * or resize) fail so rollback paths can be tested. */
#include "kv/kv.h"

#include <stdatomic.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#define OG_KV_HAVE_PAGED 1
#endif

int64_t og_kv_test_fail_every;
static atomic_llong g_test_allocs;

bool og_kv_test_fault(const char *what, size_t bytes) {
    const int64_t every = og_kv_test_fail_every;
    if (every <= 0) return false;
    /* one in `every` on average, scattered (a hash of the allocation's
       number), so that a step of many allocations sometimes gets through */
    uint64_t x = (uint64_t)atomic_fetch_add(&g_test_allocs, 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    if (x % (uint64_t)every != 0) return false;
    og_set_error(OG_ERR_OUT_OF_MEMORY, "kv fault injection: %s of %zu bytes made to fail (one in %lld)", what, bytes,
                 (long long)every);
    return true;
}

/* The host-heap allocator keeps blocks that sessions free, up to KEEP_BYTES
 * in all, and hands them to the next session that asks for as much (a kept
 * block of at least `bytes` and at most twice that): fresh heap pages cost a
 * page fault each at their first write, and the system takes back what
 * glibc gives up at a free, so each new session's rows faulted in anew. On a
 * 2-core virtual machine (2026-12-07) that was about 7,000 faults and a
 * fifth of a new session's 128-token bf16 prefill (the 0.6B shape: 386 ->
 * 470 tok/s with glibc told to keep its memory). Blocks under KEEP_MIN
 * (a few pages) go back at once. A block carries its size in a header of
 * HEADER bytes (keeping malloc's alignment); a kept block's first bytes
 * after it link the list. Kept blocks hold earlier sessions' rows, which no
 * session reads: a session reads only the rows it wrote. */
enum { HEADER = 64, KEEP_MIN = 64 << 10 };
#define KEEP_BYTES ((size_t)256 << 20)

typedef struct kept_block {
    struct kept_block *next;
} kept_block;

static struct {
    atomic_flag busy;
    kept_block *head;
    size_t bytes;
} g_kept = {ATOMIC_FLAG_INIT, NULL, 0};

static void kept_lock(void) {
    while (atomic_flag_test_and_set_explicit(&g_kept.busy, memory_order_acquire)) {
    }
}
static void kept_unlock(void) { atomic_flag_clear_explicit(&g_kept.busy, memory_order_release); }
static size_t *block_size(void *user) { return (size_t *)(void *)((unsigned char *)user - HEADER); }

/* A kept block of bytes .. 2 bytes (its user pointer), or NULL. */
static void *kept_take(size_t bytes) {
    kept_lock();
    for (kept_block **at = &g_kept.head; *at; at = &(*at)->next) {
        const size_t have = *block_size(*at);
        if (have >= bytes && have / 2 <= bytes) {
            kept_block *b = *at;
            *at = b->next;
            g_kept.bytes -= have;
            kept_unlock();
            return b;
        }
    }
    kept_unlock();
    return NULL;
}

/* Keeps a freed block if there is room; false: free it. */
static bool kept_put(void *user) {
    const size_t have = *block_size(user);
    if (have < KEEP_MIN) return false;
    kept_lock();
    const bool room = g_kept.bytes + have <= KEEP_BYTES;
    if (room) {
        kept_block *b = user;
        b->next = g_kept.head;
        g_kept.head = b;
        g_kept.bytes += have;
    }
    kept_unlock();
    return room;
}

static og_status cpu_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    if (!out || bytes == 0 || bytes > SIZE_MAX - HEADER)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv cpu allocator: %s",
                            !out ? "out is NULL" : bytes ? "allocation too large" : "zero-byte allocation");
    if (og_kv_test_fault("kv cpu allocator: host memory", bytes)) return OG_ERR_OUT_OF_MEMORY;
    void *user = bytes >= KEEP_MIN ? kept_take(bytes) : NULL;
    if (!user) {
        unsigned char *p = og_malloc(HEADER + bytes);
        if (!p)
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv cpu allocator: %zu bytes of host memory unavailable", bytes);
        user = p + HEADER;
        *block_size(user) = bytes;
    }
    *out = user;
    return OG_OK;
}

static void cpu_free(void *ctx, void *ptr) {
    (void)ctx;
    if (ptr && !kept_put(ptr)) og_free(block_size(ptr));
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

/* src_ctx is the fault state of the allocator that made src (same share function). */
static og_status faulty_share(void *ctx, void *src_ctx, void *src, size_t shared_bytes, size_t max_bytes,
                              size_t bytes, void **out) {
    og_kv_fault_state *st = ctx, *sst = src_ctx;
    if (faulty_fails(st, "share", bytes)) return OG_ERR_OUT_OF_MEMORY;
    return st->inner.share(st->inner.ctx, sst->inner.ctx, src, shared_bytes, max_bytes, bytes, out);
}

static og_status faulty_to_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                size_t width, size_t rows) {
    og_kv_fault_state *st = ctx;
    return st->inner.to_host(st->inner.ctx, dst, dst_pitch, src, src_pitch, width, rows);
}

static og_status faulty_from_host(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                  size_t width, size_t rows) {
    og_kv_fault_state *st = ctx;
    return st->inner.from_host(st->inner.ctx, dst, dst_pitch, src, src_pitch, width, rows);
}

og_kv_allocator og_kv_allocator_faulty(og_kv_fault_state *state) {
    og_kv_allocator a = {.alloc = faulty_alloc, .free = faulty_free, .copy = faulty_copy, .ctx = state};
    if (state && state->inner.reserve && state->inner.resize) {
        a.reserve = faulty_reserve;
        a.resize = faulty_resize;
        a.granularity = state->inner.granularity;
        if (state->inner.share) a.share = faulty_share;
    }
    if (state && state->inner.to_host && state->inner.from_host) {
        a.to_host = faulty_to_host;
        a.from_host = faulty_from_host;
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
 * pages, mapped PROT_NONE (no memory, and no commit charge, behind it). Its
 * first `backed` bytes (whole pages) are extents: ranges of the reservation
 * mapped readable and writable, shared, from the start of an anonymous
 * shared-memory file (memfd). The block's own memory is one such file,
 * which grows with the block (the last extent); a block made by share also
 * maps the first pages of the files of the block it shares from, so the
 * same pages appear at both addresses and nothing is copied.
 *
 * Every extent is a prefix [0, len) of its file. A file remembers the
 * lengths of the extents that map it; when one goes (free, or a resize that
 * gives pages back) the file is cut to the longest that remains, which
 * gives the pages past it back to the system, and the last one closes it.
 * Growth allocates the file's new pages (fallocate), so a lack of memory is
 * a status, never a signal at the first touch. A resize that shrinks maps
 * PROT_NONE anonymous memory over what it gives back, so a stray read past a
 * block's backed bytes faults. Plain blocks (alloc) come from the host heap;
 * the list of reservations tells free which is which. */

#ifdef OG_KV_HAVE_PAGED

#include <errno.h>
#include <fcntl.h>

/* An anonymous shared-memory file and the lengths of the extents mapping it.
 * Guarded by paged_files_lock (files are shared across allocators). */
typedef struct paged_file {
    int fd;
    size_t size;  /* bytes the file holds (ftruncate)        */
    size_t *ends; /* [n]: lengths of the extents mapping it  */
    int32_t n, cap;
} paged_file;

static pthread_mutex_t paged_files_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct paged_extent {
    size_t offset, len; /* reservation bytes [offset, offset + len) map file bytes [0, len) */
    paged_file *file;
} paged_extent;

typedef struct paged_block {
    unsigned char *base;
    size_t max_bytes;     /* reserve's max_bytes                        */
    size_t reserved;      /* mapped bytes: max_bytes rounded up to pages */
    size_t backed;        /* accessible bytes from base, whole pages     */
    paged_extent *ext;    /* [n_ext] in address order, covering [0, backed) */
    int32_t n_ext, cap_ext;
    bool own_last;        /* the last extent's file was made by this block and
                             grows with it                                */
    struct paged_block *next;
} paged_block;

typedef struct paged_ctx {
    size_t page;
    pthread_mutex_t lock; /* guards `blocks` and their extents */
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

static og_status paged_errno(int e, const char *what, size_t bytes) {
    return og_set_error(e == ENOMEM || e == ENOSPC || e == EAGAIN ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND,
                        "kv paged allocator: %s of %zu bytes: %s", what, bytes, strerror(e));
}

/* Records one more extent of `len` bytes over f. Caller holds paged_files_lock. */
static bool file_add_end(paged_file *f, size_t len) {
    if (f->n == f->cap) {
        int32_t cap = f->cap ? 2 * f->cap : 4;
        size_t *grown = og_realloc(f->ends, (size_t)cap * sizeof *grown);
        if (!grown) return false;
        f->ends = grown;
        f->cap = cap;
    }
    f->ends[f->n++] = len;
    return true;
}

/* Forgets one extent of `len` bytes over f (and closes f with the last one,
 * or cuts it to the longest extent left). Caller holds paged_files_lock. */
static void file_drop_end(paged_file *f, size_t len) {
    size_t longest = 0;
    bool dropped = false;
    for (int32_t i = 0; i < f->n; i++) {
        if (!dropped && f->ends[i] == len) {
            f->ends[i] = f->ends[--f->n];
            dropped = true;
            i--;
            continue;
        }
        if (f->ends[i] > longest) longest = f->ends[i];
    }
    if (f->n == 0) {
        close(f->fd);
        og_free(f->ends);
        og_free(f);
        return;
    }
    if (longest < f->size && ftruncate(f->fd, (off_t)longest) == 0) f->size = longest;
}

/* Longest extent over f other than one of `len` bytes. Caller holds paged_files_lock. */
static size_t file_longest_other(const paged_file *f, size_t len) {
    size_t longest = 0;
    bool skipped = false;
    for (int32_t i = 0; i < f->n; i++) {
        if (!skipped && f->ends[i] == len) {
            skipped = true;
            continue;
        }
        if (f->ends[i] > longest) longest = f->ends[i];
    }
    return longest;
}

/* Makes the file hold `size` bytes, allocating the pages it adds. */
static og_status file_grow(paged_file *f, size_t size) {
    if (size <= f->size) return OG_OK;
    if (ftruncate(f->fd, (off_t)size) != 0) return paged_errno(errno, "ftruncate", size);
    int e = posix_fallocate(f->fd, (off_t)f->size, (off_t)(size - f->size));
    if (e != 0 && e != EINVAL && e != EOPNOTSUPP) {
        (void)ftruncate(f->fd, (off_t)f->size);
        return paged_errno(e, "fallocate", size - f->size);
    }
    f->size = size;
    return OG_OK;
}

/* Maps [0, len) of f at `at`, readable and writable. */
static og_status map_file(unsigned char *at, paged_file *f, size_t off, size_t len) {
    void *p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, f->fd, (off_t)off);
    if (p == MAP_FAILED) return paged_errno(errno, "mmap of a shared file", len);
    return OG_OK;
}

/* Makes [at, at + len) inaccessible again (part of the reservation). */
static void unmap_range(unsigned char *at, size_t len) {
    if (len && mmap(at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        OG_WARN("kv paged allocator: giving back %zu bytes failed: %s", len, strerror(errno));
}

static bool block_push_extent(paged_block *b, paged_extent e) {
    if (b->n_ext == b->cap_ext) {
        int32_t cap = b->cap_ext ? 2 * b->cap_ext : 4;
        paged_extent *grown = og_realloc(b->ext, (size_t)cap * sizeof *grown);
        if (!grown) return false;
        b->ext = grown;
        b->cap_ext = cap;
    }
    b->ext[b->n_ext++] = e;
    return true;
}

/* Backs b up to `target` bytes (whole pages, above b->backed) from its own
 * file: the last extent grows when it is the block's own and nothing else
 * maps the file past it; otherwise a new file starts. All or nothing. */
static og_status block_grow(paged_block *b, size_t target) {
    const size_t add = target - b->backed;
    pthread_mutex_lock(&paged_files_lock);
    og_status st = OG_OK;
    paged_extent *last = b->n_ext ? &b->ext[b->n_ext - 1] : NULL;
    if (b->own_last && last && file_longest_other(last->file, last->len) <= last->len) {
        paged_file *f = last->file;
        const size_t old_size = f->size;
        for (int32_t i = 0; i < f->n; i++)
            if (f->ends[i] == last->len) {
                f->ends[i] = last->len + add; /* recorded first: the file never shrinks below it */
                break;
            }
        st = file_grow(f, last->len + add);
        if (st == OG_OK) st = map_file(b->base + b->backed, f, last->len, add);
        if (st != OG_OK) {
            for (int32_t i = 0; i < f->n; i++)
                if (f->ends[i] == last->len + add) {
                    f->ends[i] = last->len;
                    break;
                }
            if (f->size > old_size && ftruncate(f->fd, (off_t)old_size) == 0) f->size = old_size;
        } else {
            last->len += add;
        }
        pthread_mutex_unlock(&paged_files_lock);
        if (st == OG_OK) b->backed = target;
        return st;
    }
    paged_file *f = og_calloc(1, sizeof *f);
    if (!f || !file_add_end(f, add)) {
        og_free(f);
        pthread_mutex_unlock(&paged_files_lock);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no host memory");
    }
    f->fd = memfd_create("offgraph-kv", MFD_CLOEXEC);
    if (f->fd < 0) st = paged_errno(errno, "memfd_create", add);
    if (st == OG_OK) st = file_grow(f, add);
    if (st == OG_OK) st = map_file(b->base + b->backed, f, 0, add);
    if (st == OG_OK && !block_push_extent(b, (paged_extent){b->backed, add, f})) {
        unmap_range(b->base + b->backed, add);
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no host memory");
    }
    if (st != OG_OK) {
        if (f->fd >= 0) close(f->fd);
        og_free(f->ends);
        og_free(f);
    } else {
        b->own_last = true;
        b->backed = target;
    }
    pthread_mutex_unlock(&paged_files_lock);
    return st;
}

/* Gives back the pages of b past `keep` bytes (whole pages, below b->backed). */
static void block_shrink(paged_block *b, size_t keep) {
    unmap_range(b->base + keep, b->backed - keep);
    pthread_mutex_lock(&paged_files_lock);
    while (b->n_ext > 0) {
        paged_extent *e = &b->ext[b->n_ext - 1];
        if (e->offset + e->len <= keep) break;
        if (e->offset >= keep) {
            file_drop_end(e->file, e->len);
            b->n_ext--;
            b->own_last = false;
            continue;
        }
        /* cut the extent: record the shorter length, then forget the longer */
        const size_t len = keep - e->offset;
        if (file_add_end(e->file, len)) {
            file_drop_end(e->file, e->len);
            e->len = len;
        } /* else keeps its pages counted until the block goes */
        break;
    }
    pthread_mutex_unlock(&paged_files_lock);
    b->backed = keep;
}

/* Frees a block unlinked from its allocator. */
static void block_destroy(paged_block *b) {
    if (munmap(b->base, b->reserved) != 0) OG_WARN("kv paged allocator: munmap of %zu bytes failed", b->reserved);
    pthread_mutex_lock(&paged_files_lock);
    for (int32_t i = 0; i < b->n_ext; i++) file_drop_end(b->ext[i].file, b->ext[i].len);
    pthread_mutex_unlock(&paged_files_lock);
    og_free(b->ext);
    og_free(b);
}

/* A new reservation of max_bytes with nothing backed. */
static og_status block_new(paged_ctx *c, size_t max_bytes, paged_block **out) {
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
    *out = b;
    return OG_OK;
}

static void block_link(paged_ctx *c, paged_block *b) {
    pthread_mutex_lock(&c->lock);
    b->next = c->blocks;
    c->blocks = b;
    pthread_mutex_unlock(&c->lock);
}

static og_status paged_reserve(void *ctx, size_t max_bytes, size_t bytes, void **out) {
    paged_ctx *c = ctx;
    if (!out || bytes == 0 || bytes > max_bytes || max_bytes > SIZE_MAX - c->page)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv paged allocator: reserve of %zu bytes backing %zu: %s",
                            max_bytes, bytes, !out ? "out is NULL" : "bad sizes");
    if (og_kv_test_fault("kv paged allocator: reserve", bytes)) return OG_ERR_OUT_OF_MEMORY;
    paged_block *b = NULL;
    og_status st = block_new(c, max_bytes, &b);
    if (st != OG_OK) return st;
    st = block_grow(b, page_round(c, bytes));
    if (st != OG_OK) {
        block_destroy(b);
        return st;
    }
    block_link(c, b);
    *out = b->base;
    return OG_OK;
}

static og_status paged_share(void *ctx, void *src_ctx, void *src, size_t shared_bytes, size_t max_bytes, size_t bytes,
                             void **out) {
    paged_ctx *c = ctx, *sc = src_ctx;
    if (!out || !sc || bytes == 0 || bytes > max_bytes || max_bytes > SIZE_MAX - c->page || shared_bytes > bytes ||
        shared_bytes % c->page)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "kv paged allocator: share of %zu bytes into a reserve of %zu backing %zu: %s",
                            shared_bytes, max_bytes, bytes, !out || !sc ? "NULL argument" : "bad sizes");
    paged_block *b = NULL;
    og_status st = block_new(c, max_bytes, &b);
    if (st != OG_OK) return st;
    /* take the source's extents below shared_bytes (their files' ends are
     * recorded while the source cannot change), then map them */
    pthread_mutex_lock(&sc->lock);
    paged_block *s = paged_find(sc, src, NULL);
    if (!s || shared_bytes > s->backed) {
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "kv paged allocator: share of %zu bytes of %p: %s", shared_bytes,
                          src, !s ? "not a reservation of the source allocator" : "more than the source backs");
    } else {
        pthread_mutex_lock(&paged_files_lock);
        for (int32_t i = 0; i < s->n_ext && s->ext[i].offset < shared_bytes && st == OG_OK; i++) {
            const paged_extent *e = &s->ext[i];
            const size_t len = shared_bytes - e->offset < e->len ? shared_bytes - e->offset : e->len;
            if (!file_add_end(e->file, len)) {
                st = og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no host memory");
            } else if (!block_push_extent(b, (paged_extent){e->offset, len, e->file})) {
                file_drop_end(e->file, len);
                st = og_set_error(OG_ERR_OUT_OF_MEMORY, "kv paged allocator: no host memory");
            }
        }
        pthread_mutex_unlock(&paged_files_lock);
    }
    pthread_mutex_unlock(&sc->lock);
    for (int32_t i = 0; i < b->n_ext && st == OG_OK; i++)
        st = map_file(b->base + b->ext[i].offset, b->ext[i].file, 0, b->ext[i].len);
    if (st == OG_OK) {
        b->backed = shared_bytes;
        const size_t target = page_round(c, bytes);
        if (target > b->backed) st = block_grow(b, target);
    }
    if (st != OG_OK) {
        block_destroy(b);
        return st;
    }
    block_link(c, b);
    *out = b->base;
    return OG_OK;
}

static og_status paged_resize(void *ctx, void *ptr, size_t bytes) {
    paged_ctx *c = ctx;
    pthread_mutex_lock(&c->lock);
    paged_block *b = paged_find(c, ptr, NULL);
    og_status st = OG_OK;
    if (!b || bytes == 0 || bytes > b->max_bytes) {
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "kv paged allocator: resize of %p to %zu bytes: %s", ptr, bytes,
                          !b ? "not a reservation of this allocator" : "outside the reservation");
    } else {
        const size_t target = page_round(c, bytes);
        if (target > b->backed && og_kv_test_fault("kv paged allocator: growth", target - b->backed))
            st = OG_ERR_OUT_OF_MEMORY;
        else if (target > b->backed) st = block_grow(b, target);
        else if (target < b->backed) block_shrink(b, target);
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
        cpu_free(NULL, ptr);
        return;
    }
    block_destroy(b);
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
                             .reserve = paged_reserve, .resize = paged_resize, .granularity = c->page,
                             .share = paged_share};
    return OG_OK;
}

void og_kv_allocator_paged_release(og_kv_allocator *a) {
    if (!a || a->free != paged_free) return;
    paged_ctx *c = a->ctx;
    if (c->blocks) OG_WARN("og_kv_allocator_paged_release: reservations still live; unmapping them");
    while (c->blocks) {
        paged_block *b = c->blocks;
        c->blocks = b->next;
        block_destroy(b);
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
