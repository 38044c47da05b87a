/* A small fork-join thread pool: parallel-fors from any number of threads at
 * once, the caller of each working as its thread 0, items handed out by an
 * atomic counter.
 *
 * Jobs. A job lives in one of the pool's MAX_JOBS records, not on its
 * caller's stack, and its caller owns the record from publishing the job to
 * retiring it. Callers of one pool run their jobs side by side: each takes a
 * free record, publishes its job there and runs its items; the workers take
 * items of whichever jobs are published. Every job has a 64-bit generation
 * from one pool-wide counter (no wrap in the life of a process), which is
 * what a record's `gen` holds while the job is published (0 otherwise).
 *
 * A worker may use a record only inside a "visit": it reads gen (a job),
 * adds itself to the record's `users`, and reads gen again; only if it is
 * still the same job does it read the job's fields and claim items. A caller
 * takes a record only when it is unowned and has no users, so a visit never
 * sees a record rewritten under it, and a worker that read the generation of
 * a job before it was retired sees another value on its second read (0 or a
 * later generation, never the same), so it never runs an item of a job it did
 * not check. The caller waits for its job's items to be finished, not for
 * the workers' visits to end: a worker that is descheduled (other processes
 * share the cores: an HTTP server's threads, its clients) holds no caller
 * back, only the record it visits, which the next caller passes over.
 *
 * A caller that finds no free record (more than MAX_JOBS jobs at once), and
 * a parallel-for called from inside an item of the same pool (by a worker or
 * by a caller running its items), run their items on the calling thread, in
 * order, as thread 0: nested calls never wait for threads that are waiting
 * for them.
 *
 * A decode step runs a few hundred short parallel-fors back to back, so
 * waking sleeping workers through a condition variable each time costs more
 * than the work. Instead a new job bumps the pool's `epoch`, and an idle
 * worker spins on it for SPIN_NS before it goes to sleep on a condition
 * variable; a caller waits for its job's end the same way. Spinning yields
 * the core after its first microseconds (spin_on), and idle threads use no
 * CPU once SPIN_NS has passed.
 *
 * Sleep/wake handshake (both sides are seq_cst, so at least one of them sees
 * the other's store): a sleeper, holding mu, adds itself to `sleepers` (or
 * sets its record's `owner_asleep`) and then re-reads the counter it waits
 * on; the waker stores the counter and then reads `sleepers` (or
 * `owner_asleep`), and if it is set signals under mu. Either the sleeper sees
 * the new value and does not sleep, or the waker sees the sleeper and wakes
 * it (the sleeper holds mu until it is inside the wait). */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OG_CPU_RELAX() _mm_pause()
#else
#define OG_CPU_RELAX() ((void)0)
#endif

/* How long a thread spins on a counter before sleeping. */
#define SPIN_NS 200000
/* Jobs that can be published at once; a caller past them runs its items
 * alone. */
#define MAX_JOBS 16

void (*og_threadpool_test_delay)(int window);
/* A window of the protocol where a thread being preempted matters to its
 * correctness: tests (test_threadpool) set og_threadpool_test_delay to sleep
 * there at random. */
#define WINDOW(w)                                                                                                     \
    do {                                                                                                              \
        void (*delay_)(int) = og_threadpool_test_delay;                                                               \
        if (delay_) delay_(w);                                                                                        \
    } while (0)

typedef struct job {
    atomic_uint_fast64_t gen; /* the job's generation while published; 0: none */
    atomic_int users;         /* workers visiting (they may read the fields)    */
    atomic_bool owned;        /* a caller holds the record                      */
    atomic_int owner_asleep;  /* 1 while the caller sleeps on the pool's done   */
    /* the job: written by its caller before gen is published */
    _Atomic(og_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_llong count;
    /* the two counters every item touches, each on a cache line of its own */
    char pad0[64];
    atomic_llong next;     /* the next item to claim                  */
    char pad1[64];
    atomic_llong finished; /* items run to their end                  */
    char pad2[64];
} job;

struct og_threadpool {
    int n;                    /* threads including a caller */
    pthread_t *threads;       /* [n - 1] workers            */
    pthread_mutex_t mu;       /* guards the sleeps          */
    pthread_cond_t wake;      /* workers sleep here         */
    pthread_cond_t done;      /* callers sleep here         */
    char pad0[64];
    atomic_uint_fast64_t epoch; /* bumped by every publish; workers wait on it */
    char pad1[64];
    atomic_uint_fast64_t gens;  /* the last generation given out              */
    atomic_int sleepers;        /* workers asleep on `wake`                   */
    atomic_bool quit;
    job jobs[MAX_JOBS];
};

typedef struct {
    og_threadpool *p;
    int index;
} worker_arg;

/* The pool whose items this thread is running (as a worker, or as a caller
 * inside og_parallel_for): a parallel-for on it from here is nested. */
static _Thread_local og_threadpool *tl_inside;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One look of a spin-wait: a pause for the first 256 looks (a few
 * microseconds), then a sched_yield each, so that a waiter gives its core to
 * a thread it may be waiting for when threads outnumber cores (callers of
 * one pool, other processes). False once SPIN_NS have passed. */
static bool spin_on(unsigned i, int64_t *deadline) {
    if (i < 256) {
        OG_CPU_RELAX();
        return true;
    }
    sched_yield();
    if ((i & 15) == 0) {
        const int64_t t = now_ns();
        if (*deadline == 0) *deadline = t + SPIN_NS;
        else if (t >= *deadline) return false;
    }
    return true;
}

/* Spins until *v differs from seen or SPIN_NS pass; true if it changed. */
static bool spin_while_u64(atomic_uint_fast64_t *v, uint64_t seen) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != seen) return true;
        if (!spin_on(i, &deadline)) return false;
    }
}

static bool spin_for_count(atomic_llong *finished, long long count) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(finished, memory_order_acquire) == count) return true;
        if (!spin_on(i, &deadline)) return false;
    }
}

/* Claims and runs items of job j until none is left. The items it ran count
 * as finished when it stops (one add to the shared count per visit, not per
 * item): the job cannot end before. True if it ran any. */
static bool run_items(og_threadpool *p, job *j, int thread) {
    const long long count = atomic_load_explicit(&j->count, memory_order_relaxed);
    const og_task_fn fn = atomic_load_explicit(&j->fn, memory_order_relaxed);
    void *const ctx = atomic_load_explicit(&j->ctx, memory_order_relaxed);
    long long done = 0;
    for (;;) {
        WINDOW(1);
        const long long i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= count) break;
        fn(ctx, (int64_t)i, thread);
        done++;
    }
    if (done == 0) return false;
    WINDOW(2);
    if (atomic_fetch_add(&j->finished, done) + done == count && /* seq_cst: the handshake */
        atomic_load(&j->owner_asleep)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    return true;
}

/* A worker's visit to record j (see the header comment). */
static bool visit(og_threadpool *p, job *j, int thread) {
    const uint64_t g = atomic_load(&j->gen);
    if (g == 0) return false;
    WINDOW(3);
    atomic_fetch_add(&j->users, 1);
    bool ran = false;
    if (atomic_load(&j->gen) == g) ran = run_items(p, j, thread);
    WINDOW(4);
    atomic_fetch_sub(&j->users, 1);
    return ran;
}

static void *worker_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    og_free(arg);
    og_threadpool *p = a.p;
    tl_inside = p;
    for (;;) {
        const uint64_t e = atomic_load(&p->epoch);
        if (atomic_load(&p->quit)) break;
        bool ran = false;
        for (int k = 0; k < MAX_JOBS; k++) ran |= visit(p, &p->jobs[(a.index + k) % MAX_JOBS], a.index);
        if (ran) continue; /* look again: more may have come while it ran */
        if (!spin_while_u64(&p->epoch, e)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->epoch) == e && !atomic_load(&p->quit)) pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Tells the workers something changed (a job, or quit) and wakes any that
 * sleeps. */
static void bump_epoch(og_threadpool *p) {
    atomic_fetch_add(&p->epoch, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
}

og_threadpool *og_threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    og_threadpool *p = og_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->epoch, 0);
    atomic_init(&p->gens, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, false);
    for (int i = 0; i < MAX_JOBS; i++) {
        job *j = &p->jobs[i];
        atomic_init(&j->gen, 0);
        atomic_init(&j->users, 0);
        atomic_init(&j->owned, false);
        atomic_init(&j->owner_asleep, 0);
        atomic_init(&j->fn, NULL);
        atomic_init(&j->ctx, NULL);
        atomic_init(&j->count, 0);
        atomic_init(&j->next, 0);
        atomic_init(&j->finished, 0);
    }
    if (n_threads > 1) {
        p->threads = og_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto fail;
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = og_malloc(sizeof *a);
            if (!a) {
                p->n = i;
                goto fail;
            }
            a->p = p;
            a->index = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
                og_free(a);
                p->n = i;
                goto fail;
            }
        }
    }
    return p;
fail:
    og_threadpool_destroy(p);
    return NULL;
}

void og_threadpool_destroy(og_threadpool *p) {
    if (!p) return;
    /* no job is published (every parallel-for has returned): workers find
       nothing more to visit, see quit and leave */
    WINDOW(5);
    atomic_store(&p->quit, true);
    bump_epoch(p);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    og_free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    og_free(p);
}

int og_threadpool_size(const og_threadpool *p) { return p ? p->n : 1; }

/* A free record (unowned, unvisited), now owned; NULL when none is. */
static job *acquire(og_threadpool *p) {
    for (int i = 0; i < MAX_JOBS; i++) {
        job *j = &p->jobs[i];
        bool was = false;
        if (atomic_load_explicit(&j->owned, memory_order_relaxed) ||
            !atomic_compare_exchange_strong(&j->owned, &was, true))
            continue;
        if (atomic_load(&j->users) == 0) return j;
        atomic_store(&j->owned, false); /* a late visit of its last job: another */
    }
    return NULL;
}

void og_parallel_for(og_threadpool *p, int64_t n, og_task_fn fn, void *ctx) {
    if (n <= 0) return;
    job *j = NULL;
    if (!p || p->n == 1 || n == 1 || tl_inside == p || !(j = acquire(p))) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    atomic_store_explicit(&j->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&j->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&j->count, n, memory_order_relaxed);
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    atomic_store_explicit(&j->finished, 0, memory_order_relaxed);
    const uint64_t g = atomic_fetch_add(&p->gens, 1) + 1;
    WINDOW(6);
    atomic_store(&j->gen, g); /* publishes the fields to the visits */
    bump_epoch(p);
    og_threadpool *const outer = tl_inside; /* another pool's item may call this one */
    tl_inside = p;
    run_items(p, j, 0);
    tl_inside = outer;
    if (!spin_for_count(&j->finished, n)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&j->owner_asleep, 1);
        while (atomic_load(&j->finished) < n) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&j->owner_asleep, 0);
        pthread_mutex_unlock(&p->mu);
    }
    WINDOW(7);
    atomic_store(&j->gen, 0);
    atomic_store(&j->owned, false);
}
