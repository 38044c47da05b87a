/* Per-thread scratch kept between calls (core.h: og_scratch). The set of a
 * thread hangs off a thread-local pointer (so that leak checkers see it as
 * reachable while the thread lives) and a pthread key, whose destructor
 * frees it when the thread exits. */
#include "core.h"

#include <pthread.h>

typedef struct scratch_set {
    void *p[OG_SCRATCH_SLOTS];
    size_t n[OG_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_key_ok;
static _Thread_local scratch_set *t_set;

static void set_free(void *v) {
    scratch_set *s = v;
    for (int i = 0; i < OG_SCRATCH_SLOTS; i++) og_free(s->p[i]);
    og_free(s);
}

static void make_key(void) { g_key_ok = pthread_key_create(&g_key, set_free) == 0; }

void *og_scratch(og_scratch_slot slot, size_t bytes) {
    if ((unsigned)slot >= OG_SCRATCH_SLOTS || bytes == 0) return NULL;
    if (!t_set) {
        pthread_once(&g_once, make_key);
        scratch_set *s = g_key_ok ? og_calloc(1, sizeof *s) : NULL;
        if (!s) return NULL;
        if (pthread_setspecific(g_key, s) != 0) {
            og_free(s);
            return NULL;
        }
        t_set = s;
    }
    scratch_set *s = t_set;
    if (s->n[slot] < bytes) { /* the old contents need not survive */
        og_free(s->p[slot]);
        s->p[slot] = og_malloc(bytes);
        s->n[slot] = s->p[slot] ? bytes : 0;
    }
    return s->p[slot];
}

void og_scratch_release(void) {
    scratch_set *s = t_set;
    if (!s) return;
    for (int i = 0; i < OG_SCRATCH_SLOTS; i++) {
        og_free(s->p[i]);
        s->p[i] = NULL;
        s->n[i] = 0;
    }
}
