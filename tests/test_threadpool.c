/* The thread pool (src/core/threadpool.c) against a plain count: every item
 * of every parallel-for runs exactly once, on the job it was given to, and
 * no worker runs an item after its job's parallel-for has returned, least of
 * all while the pool shuts down.
 *
 * The last is the fault a CI run once hit: a worker that woke for a job,
 * found the pool still running, and was preempted before it read the job
 * number again, then read the number of the shutdown's wake-up instead and
 * ran "items" of it from a slot still holding a job two back, whose context
 * was a dead stack frame. The pools here have more threads than the machine
 * has cores, so workers are preempted between any two instructions, and
 * each round's last job poisons its context once its parallel-for returns:
 * a stale run is then counted, not just (sometimes) a crash. Before the
 * fix, 60,000 rounds on a 2-core machine counted 5 to 162 stale items in
 * each of three runs. */
#include "harness.h"

#include "core/core.h"

#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

enum { ROUNDS = 40000, JOBS = 6, MAX_ITEMS = 64 };

typedef struct {
    atomic_int alive;            /* cleared when the parallel-for returns */
    atomic_int runs[MAX_ITEMS];  /* times each item ran                  */
} job_ctx;

static atomic_int g_stale; /* items run on a finished job's context */
static atomic_int g_bad_thread;
static int g_threads;

static void task(void *ctx, int64_t item, int thread) {
    job_ctx *c = ctx;
    if (!atomic_load(&c->alive)) atomic_fetch_add(&g_stale, 1);
    if (thread < 0 || thread >= g_threads) atomic_fetch_add(&g_bad_thread, 1);
    atomic_fetch_add(&c->runs[item], 1);
}

int main(void) {
    og_test_section("items run once each, none after its job, none at shutdown");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    g_threads = (int)(cores > 0 ? cores : 1) * 3 + 1;
    static job_ctx ctx[JOBS];
    int wrong_count = 0;
    for (int r = 0; r < ROUNDS; r++) {
        og_threadpool *p = og_threadpool_create(g_threads);
        if (!p) {
            CHECK_MSG(false, "round %d: og_threadpool_create(%d) failed", r, g_threads);
            break;
        }
        for (int j = 0; j < JOBS; j++) {
            job_ctx *c = &ctx[j];
            memset(c, 0, sizeof *c);
            atomic_store(&c->alive, 1);
            int64_t n = 2 + (r * 7 + j * 13) % (MAX_ITEMS - 1);
            og_parallel_for(p, n, task, c);
            atomic_store(&c->alive, 0);
            for (int64_t i = 0; i < MAX_ITEMS; i++)
                wrong_count += atomic_load(&c->runs[i]) != (i < n ? 1 : 0);
        }
        og_threadpool_destroy(p);
    }
    CHECK_MSG(wrong_count == 0, "%d items ran a number of times other than once", wrong_count);
    CHECK_MSG(atomic_load(&g_stale) == 0,
              "%d items ran on a job that had ended (a stale job context)", atomic_load(&g_stale));
    CHECK_MSG(atomic_load(&g_bad_thread) == 0, "%d items got a thread index outside the pool",
              atomic_load(&g_bad_thread));
    return og_test_finish();
}
