/* The thread pool (src/core/threadpool.c) against a plain count: every item
 * of every parallel-for runs exactly once, on the job it was given to, with
 * a thread index no other item of its job holds at that moment, and no
 * worker runs an item after its job's parallel-for has returned, least of
 * all while the pool shuts down; callers of one pool run side by side (a
 * job whose items wait for another caller's items ends), and a parallel-for
 * called from inside an item of the same pool ends.
 *
 * The stale-item check is the fault a CI run once hit: a worker that woke
 * for a job, found the pool still running, and was preempted before it read
 * the job number again, then read the number of the shutdown's wake-up
 * instead and ran "items" of it from a slot still holding a job two back,
 * whose context was a dead stack frame. The pools here have more threads
 * than the machine has cores, so workers are preempted between any two
 * instructions, and each job poisons its context once its parallel-for
 * returns: a stale run is then counted, not just (sometimes) a crash.
 * Before that fix, 60,000 rounds on a 2-core machine counted 5 to 162 stale
 * items in each of three runs. Every part runs twice: as it is, and with
 * og_threadpool_test_delay sleeping or yielding at random at each window of
 * the pool's protocol (claim, finish, visit, retire, destroy), so that the
 * interleavings a busy machine makes rarely are made often. */
#include "harness.h"

#include "core/core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { JOBS = 6, MAX_ITEMS = 64, MAX_THREADS = 64, CALLERS = 4 };

typedef struct {
    atomic_int alive;                /* cleared when the parallel-for returns */
    atomic_int runs[MAX_ITEMS];      /* times each item ran                  */
    atomic_int busy[MAX_THREADS];    /* items running now with each index    */
    /* nested: items that call a parallel-for of their own */
    og_threadpool *pool;
    int nested;
} job_ctx;

static atomic_int g_stale;        /* items run on a finished job's context */
static atomic_int g_bad_thread;   /* indices outside [0, size)             */
static atomic_int g_shared_index; /* two items of a job at once with one index */
static int g_threads;

/* ------------------------------------------------------------ the delays */

static _Thread_local uint64_t tl_rng;
static atomic_int g_delays;

static void random_delay(int window) {
    if (!tl_rng) tl_rng = (uint64_t)(uintptr_t)&tl_rng * 0x9E3779B97F4A7C15ull | 1;
    tl_rng ^= tl_rng << 13;
    tl_rng ^= tl_rng >> 7;
    tl_rng ^= tl_rng << 17;
    const unsigned r = (unsigned)(tl_rng >> 40) % 64;
    (void)window;
    if (r < 2) { /* a preemption */
        struct timespec ts = {0, (long)(tl_rng % 200000)};
        nanosleep(&ts, NULL);
        atomic_fetch_add(&g_delays, 1);
    } else if (r < 8) {
        sched_yield();
    }
}

/* ------------------------------------------------------------ items */

static void task(void *ctx, int64_t item, int thread);

static void nested_task(void *ctx, int64_t item, int thread) {
    job_ctx *c = ctx;
    if (thread < 0 || thread >= g_threads) atomic_fetch_add(&g_bad_thread, 1);
    atomic_fetch_add(&c->runs[item], 1);
}

static void task(void *ctx, int64_t item, int thread) {
    job_ctx *c = ctx;
    if (!atomic_load(&c->alive)) atomic_fetch_add(&g_stale, 1);
    if (thread < 0 || thread >= g_threads) {
        atomic_fetch_add(&g_bad_thread, 1);
        thread = 0;
    }
    if (atomic_fetch_add(&c->busy[thread], 1) != 0) atomic_fetch_add(&g_shared_index, 1);
    atomic_fetch_add(&c->runs[item], 1);
    if (c->nested) { /* a parallel-for of the same pool from inside an item */
        static _Thread_local job_ctx inner;
        memset(&inner, 0, sizeof inner);
        og_parallel_for(c->pool, 5, nested_task, &inner);
        int wrong = 0;
        for (int i = 0; i < MAX_ITEMS; i++) wrong += atomic_load(&inner.runs[i]) != (i < 5 ? 1 : 0);
        if (wrong) atomic_fetch_add(&g_stale, 1000);
    }
    atomic_fetch_sub(&c->busy[thread], 1);
}

static int run_job(og_threadpool *p, job_ctx *c, int64_t n, int nested) {
    memset(c, 0, sizeof *c);
    c->pool = p;
    c->nested = nested;
    atomic_store(&c->alive, 1);
    og_parallel_for(p, n, task, c);
    atomic_store(&c->alive, 0);
    int wrong = 0;
    for (int64_t i = 0; i < MAX_ITEMS; i++) wrong += atomic_load(&c->runs[i]) != (i < n ? 1 : 0);
    return wrong;
}

/* ------------------------------------------------------------ parts */

/* Pools made, used by one caller and destroyed, many times. */
static int rounds_one_caller(int rounds) {
    static job_ctx ctx[JOBS];
    int wrong = 0;
    for (int r = 0; r < rounds; r++) {
        og_threadpool *p = og_threadpool_create(g_threads);
        if (!p) {
            CHECK_MSG(false, "round %d: og_threadpool_create(%d) failed", r, g_threads);
            break;
        }
        for (int j = 0; j < JOBS; j++) wrong += run_job(p, &ctx[j], 2 + (r * 7 + j * 13) % (MAX_ITEMS - 1), 0);
        og_threadpool_destroy(p);
    }
    return wrong;
}

typedef struct {
    og_threadpool *p;
    int rounds, nested, wrong;
} caller_arg;

static void *caller_main(void *arg) {
    caller_arg *a = arg;
    job_ctx *c = og_calloc(1, sizeof *c);
    for (int r = 0; c && r < a->rounds; r++) a->wrong += run_job(a->p, c, 2 + (r * 11) % (MAX_ITEMS - 1), a->nested);
    og_free(c);
    return NULL;
}

/* CALLERS threads on one pool at once, with nested calls or without. */
static int rounds_many_callers(int rounds, int nested) {
    og_threadpool *p = og_threadpool_create(g_threads);
    if (!p) return 1;
    pthread_t t[CALLERS];
    caller_arg a[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        a[i] = (caller_arg){p, rounds, nested, 0};
        pthread_create(&t[i], NULL, caller_main, &a[i]);
    }
    int wrong = 0;
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(t[i], NULL);
        wrong += a[i].wrong;
    }
    og_threadpool_destroy(p);
    return wrong;
}

/* Two callers whose items each wait for an item of the other's job: it ends
 * only if the two jobs run at once (a pool that runs one caller's job at a
 * time leaves the first waiting). A wait gives up after 10 s. */
typedef struct {
    atomic_int started[2];
    atomic_int timed_out;
} meet_ctx;

typedef struct {
    meet_ctx *m;
    int side;
} meet_item;

static void meet_task(void *ctx, int64_t item, int thread) {
    const meet_item *mi = ctx;
    (void)item;
    (void)thread;
    atomic_store(&mi->m->started[mi->side], 1);
    const int64_t t0 = (int64_t)time(NULL);
    while (!atomic_load(&mi->m->started[1 - mi->side])) {
        if ((int64_t)time(NULL) - t0 > 10) {
            atomic_store(&mi->m->timed_out, 1);
            return;
        }
        sched_yield();
    }
}

typedef struct {
    og_threadpool *p;
    meet_item mi;
} meet_arg;

static void *meet_main(void *arg) {
    meet_arg *a = arg;
    og_parallel_for(a->p, 4, meet_task, &a->mi);
    return NULL;
}

static bool callers_meet(void) {
    og_threadpool *p = og_threadpool_create(2); /* one worker: each caller runs its own items too */
    if (!p) return false;
    meet_ctx m;
    memset(&m, 0, sizeof m);
    meet_arg a[2] = {{p, {&m, 0}}, {p, {&m, 1}}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, meet_main, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    og_threadpool_destroy(p);
    return !atomic_load(&m.timed_out);
}

static void run_parts(const char *how, int one, int many, int nested, int meets) {
    char name[160];
    snprintf(name, sizeof name, "%s: items run once each, none after its job, none at shutdown", how);
    og_test_section(name);
    int wrong = rounds_one_caller(one);
    CHECK_MSG(wrong == 0, "%d items ran a number of times other than once", wrong);

    snprintf(name, sizeof name, "%s: %d callers on one pool at once", how, CALLERS);
    og_test_section(name);
    wrong = rounds_many_callers(many, 0);
    CHECK_MSG(wrong == 0, "%d items ran a number of times other than once", wrong);

    snprintf(name, sizeof name, "%s: a parallel-for from inside an item of the same pool", how);
    og_test_section(name);
    wrong = rounds_many_callers(nested, 1);
    CHECK_MSG(wrong == 0, "%d items ran a number of times other than once", wrong);

    snprintf(name, sizeof name, "%s: two callers' jobs run at once", how);
    og_test_section(name);
    for (int i = 0; i < meets; i++)
        if (!callers_meet()) {
            CHECK_MSG(false, "round %d: a job's items waited 10 s for another caller's job to start", i);
            break;
        }

    CHECK_MSG(atomic_load(&g_stale) == 0, "%d items ran on a job that had ended (a stale job context)",
              atomic_load(&g_stale));
    CHECK_MSG(atomic_load(&g_bad_thread) == 0, "%d items got a thread index outside the pool",
              atomic_load(&g_bad_thread));
    CHECK_MSG(atomic_load(&g_shared_index) == 0, "%d items ran while another item of their job had their index",
              atomic_load(&g_shared_index));
}

int main(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    g_threads = (int)(cores > 0 ? cores : 1) * 3 + 1;
    if (g_threads > MAX_THREADS) g_threads = MAX_THREADS;
    /* rounds of each part: a pool made and destroyed each round of the
       first; fewer under the sanitizers (ten times slower; make test-tsan
       runs it) and with the delays */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    const int scale = 1;
#else
    const int scale = 4;
#endif
    run_parts("as it is", 500 * scale, 250 * scale, 25 * scale, 3 * scale);
    og_threadpool_test_delay = random_delay;
    run_parts("with random delays", 400 * scale, 200 * scale, 20 * scale, 2 * scale);
    og_threadpool_test_delay = NULL;
    CHECK_MSG(atomic_load(&g_delays) > 100, "only %d delays were injected", atomic_load(&g_delays));
    return og_test_finish();
}
