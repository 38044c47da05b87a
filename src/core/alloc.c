/* Host allocation through replaceable hooks, and checked arithmetic. */
#include "core.h"

#include <stdlib.h>

static void *default_alloc(size_t n, void *u) { (void)u; return malloc(n); }
static void *default_realloc(void *p, size_t n, void *u) { (void)u; return realloc(p, n); }
static void default_free(void *p, void *u) { (void)u; free(p); }

static og_host_allocator g_host = {default_alloc, default_realloc, default_free, NULL};

void og_set_host_allocator(const og_host_allocator *a) {
    g_host.alloc = a && a->alloc ? a->alloc : default_alloc;
    g_host.realloc = a && a->realloc ? a->realloc : default_realloc;
    g_host.free = a && a->free ? a->free : default_free;
    g_host.user = a ? a->user : NULL;
}

void *og_malloc(size_t bytes) { return bytes ? g_host.alloc(bytes, g_host.user) : NULL; }

void *og_calloc(size_t count, size_t size) {
    if (count == 0 || size == 0) return NULL;
    if (count > SIZE_MAX / size) return NULL;
    void *p = og_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void *og_realloc(void *ptr, size_t bytes) { return g_host.realloc(ptr, bytes, g_host.user); }

void og_free(void *ptr) {
    if (ptr) g_host.free(ptr, g_host.user);
}

char *og_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = og_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

bool og_mul_overflow_i64(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

bool og_add_overflow_i64(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}
