/* og_scratch (src/core/scratch.c): a slot keeps its buffer between calls
 * while asked for no more, grows when asked for more, holds what was written
 * to it for the caller's use, is the calling thread's own (another thread
 * gets another buffer, and both write theirs at once), and goes away with
 * its thread or og_scratch_release. The last two are leak checks: run under
 * the sanitizer build (make test-sanitize), a set a thread left behind
 * would be reported at exit. */
#include "harness.h"

#include "core/core.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

enum { THREADS = 4, ROUNDS = 50 };

/* Fills slot ACTIVATIONS with the thread's byte and checks it after the
 * others have written theirs; returns the number of wrong bytes. */
static pthread_barrier_t g_barrier;

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    intptr_t wrong = 0;
    for (int r = 0; r < ROUNDS; r++) {
        const size_t n = 4096 + (size_t)(id * 1000 + r * 37);
        unsigned char *p = og_scratch(OG_SCRATCH_ACTIVATIONS, n);
        if (!p) return (void *)(intptr_t)-1;
        memset(p, 0x40 + id, n);
        pthread_barrier_wait(&g_barrier);
        for (size_t i = 0; i < n; i++) wrong += p[i] != 0x40 + id;
        pthread_barrier_wait(&g_barrier);
    }
    return (void *)wrong; /* the thread's set is freed as it exits */
}

int main(void) {
    og_test_section("a slot keeps its buffer, grows, and is the calling thread's own");
    void *a = og_scratch(OG_SCRATCH_PANELS, 1000);
    CHECK(a != NULL && ((uintptr_t)a & 15u) == 0);
    memset(a, 1, 1000);
    CHECK(og_scratch(OG_SCRATCH_PANELS, 1000) == a);
    CHECK(og_scratch(OG_SCRATCH_PANELS, 10) == a); /* less: the same buffer */
    void *b = og_scratch(OG_SCRATCH_ATTEND, 1000);
    CHECK(b != NULL && b != a); /* another slot, another buffer */
    unsigned char *big = og_scratch(OG_SCRATCH_PANELS, 1 << 20);
    CHECK(big != NULL);
    memset(big, 2, 1 << 20); /* all of it is writable */
    CHECK(og_scratch(OG_SCRATCH_PANELS, 1 << 20) == big);
    CHECK(og_scratch(OG_SCRATCH_SLOTS, 16) == NULL && og_scratch(OG_SCRATCH_PANELS, 0) == NULL);

    og_test_section("threads write their own buffers at the same time");
    CHECK(pthread_barrier_init(&g_barrier, NULL, THREADS) == 0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *wrong = NULL;
        pthread_join(t[i], &wrong);
        CHECK_MSG((intptr_t)wrong == 0, "thread %d: %ld bytes of its scratch were not its own (-1: no memory)", i,
                  (long)(intptr_t)wrong);
    }
    pthread_barrier_destroy(&g_barrier);
    CHECK(og_scratch(OG_SCRATCH_PANELS, 1 << 20) == big); /* the main thread's, untouched by theirs */

    og_test_section("og_scratch_release gives the buffers back");
    og_scratch_release();
    unsigned char *again = og_scratch(OG_SCRATCH_PANELS, 64);
    CHECK(again != NULL);
    memset(again, 3, 64);
    og_scratch_release();
    return og_test_finish();
}
