/* A growable string (core.h, og_strbuf): what the engine's metrics text,
 * the server's responses and its request parsing build piece by piece. */
#include "core.h"

#include <stdio.h>

static bool reserve(og_strbuf *b, size_t more) {
    if (b->oom) return false;
    if (b->n + more + 1 <= b->cap) return true;
    if (more > SIZE_MAX / 2 - b->n) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = og_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void og_strbuf_add(og_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void og_strbuf_printf(og_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = true;
        return;
    }
    if (!reserve(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}
