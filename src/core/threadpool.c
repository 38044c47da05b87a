/* A small fork-join thread pool: one parallel-for at a time, the caller
 * works as thread 0, items are handed out by an atomic counter.
 *
 * A decode step runs a few hundred short parallel-fors back to back, so
 * waking sleeping workers through a condition variable each time costs more
 * than the work. Instead a job is published through an atomic counter, and
 * an idle worker spins on it for SPIN_NS before it goes to sleep on a
 * condition variable; the caller waits for the job's end the same way. Idle
 * threads therefore use no CPU once SPIN_NS has passed.
 *
 * The caller waits for the job's items to be finished, not for every worker
 * to check in: a worker that is descheduled (other processes share the
 * cores: an HTTP server's threads, its clients) or still waking up while the
 * caller runs every item itself holds nobody back. For that, the counter
 * `next` holds the job's number in its high bits and the next item in its
 * low bits, and a worker claims an item by a compare-and-swap that succeeds
 * only while its job is the current one. A job's fields live in one of two
 * slots (job number parity): a worker that wakes late reads the fields of a
 * slot that may be rewritten for a later job, but they are atomics and its
 * claim then fails, so it never runs an item of the wrong job; once an item
 * is claimed its job cannot end, so its slot is stable while it runs.
 *
 * Sleep/wake handshake (both sides are seq_cst, so at least one of them sees
 * the other's store): a sleeper, holding mu, adds itself to `sleepers` and
 * then re-reads the counter it waits on; the waker stores the counter and
 * then reads `sleepers`, and if it is non-zero signals under mu. Either the
 * sleeper sees the new value and does not sleep, or the waker sees the
 * sleeper and wakes it (the sleeper holds mu until it is inside the wait). */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <pthread.h>
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

/* `next`: job number above ITEM_BITS, next item below. A job of more items
 * than ITEM_MASK runs as several jobs. */
#define ITEM_BITS 40
#define ITEM_MASK ((UINT64_C(1) << ITEM_BITS) - 1)

typedef struct job_slot {
    _Atomic(og_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_llong count;
} job_slot;

struct og_threadpool {
    int n;                    /* threads including the caller */
    pthread_t *threads;       /* [n - 1] workers              */
    pthread_mutex_t run_lock; /* serializes og_parallel_for   */
    pthread_mutex_t mu;       /* guards the two sleeps        */
    pthread_cond_t wake;      /* workers sleep here           */
    pthread_cond_t done;      /* the caller sleeps here       */
    /* the two counters every item touches, each on a cache line of its own
     * (a claim and a finish of two threads do not contend for one line) */
    char pad0[64];
    atomic_uint_fast64_t next; /* job << ITEM_BITS | next item; a new job number wakes workers */
    char pad1[64];
    atomic_llong finished;    /* items of the current job run to their end */
    char pad2[64];
    atomic_int sleepers;      /* workers asleep on `wake`     */
    atomic_int caller_asleep; /* 1 while the caller sleeps on `done` */
    atomic_bool quit;
    job_slot slot[2];         /* fields of the current and the previous job */
    uint64_t job;             /* the caller's last job number (under run_lock) */
};

typedef struct {
    og_threadpool *p;
    int index;
} worker_arg;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t job_of(uint64_t next) { return next >> ITEM_BITS; }

/* Spins until the job number in `next` differs from seen or SPIN_NS pass;
 * true if it changed. */
static bool spin_for_job(atomic_uint_fast64_t *next, uint64_t seen) {
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (job_of(atomic_load_explicit(next, memory_order_acquire)) != seen) return true;
        OG_CPU_RELAX();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t >= deadline) return false;
        }
    }
}

static bool spin_for_count(atomic_llong *finished, long long count) {
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(finished, memory_order_acquire) == count) return true;
        OG_CPU_RELAX();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t >= deadline) return false;
        }
    }
}

/* Adds done items to the job's finished count, waking the caller if it
 * sleeps on the last of them. */
static void finish_items(og_threadpool *p, long long done, long long count) {
    if (atomic_fetch_add(&p->finished, done) + done == count && /* seq_cst: the handshake */
        atomic_load(&p->caller_asleep)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Runs items of job `job` until none is left or another job is current.
 * The items it ran count as finished when it stops (one add to the shared
 * count per thread and job, not per item): the job cannot end before. */
static void run_items(og_threadpool *p, uint64_t job, int thread) {
    job_slot *s = &p->slot[job & 1];
    uint64_t v = atomic_load_explicit(&p->next, memory_order_acquire);
    long long done = 0, count = 0;
    for (;;) {
        if (job_of(v) != job) break;
        count = atomic_load_explicit(&s->count, memory_order_relaxed);
        if ((long long)(v & ITEM_MASK) >= count) break;
        if (!atomic_compare_exchange_weak_explicit(&p->next, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* v now holds the counter's value: look again */
        /* the item is ours and the job cannot end before it is counted */
        og_task_fn fn = atomic_load_explicit(&s->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&s->ctx, memory_order_relaxed);
        fn(ctx, (int64_t)(v & ITEM_MASK), thread);
        done++;
        v = atomic_load_explicit(&p->next, memory_order_acquire);
    }
    /* count was read while the job was current, after a claim of it */
    if (done > 0) finish_items(p, done, count);
}

static void *worker_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    og_free(arg);
    og_threadpool *p = a.p;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_job(&p->next, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (job_of(atomic_load(&p->next)) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = job_of(atomic_load(&p->next));
        run_items(p, seen, a.index);
    }
    return NULL;
}

/* Publishes a new job (or the quit flag) and wakes any sleeping worker. */
static void publish(og_threadpool *p, uint64_t next) {
    atomic_store(&p->next, next);
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
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->finished, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_asleep, 0);
    atomic_init(&p->quit, false);
    for (int i = 0; i < 2; i++) {
        atomic_init(&p->slot[i].fn, NULL);
        atomic_init(&p->slot[i].ctx, NULL);
        atomic_init(&p->slot[i].count, 0);
    }
    if (n_threads > 1) {
        p->threads = og_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto fail;
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = og_malloc(sizeof *a);
            if (!a) { p->n = i; goto fail; }
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

/* The next job number: never 0 (what workers have seen before any job). */
static uint64_t next_job(og_threadpool *p) {
    p->job = (p->job + 1) & (UINT64_MAX >> ITEM_BITS);
    if (p->job == 0) p->job = 1;
    return p->job;
}

void og_threadpool_destroy(og_threadpool *p) {
    if (!p) return;
    /* The wake-up for quit is a job of no items. A worker that woke for the
     * last real job, found quit unset and then read this job's number would
     * otherwise run items from its slot, which still holds the job two back
     * (whose context may be a dead stack frame). */
    uint64_t job = next_job(p);
    job_slot *s = &p->slot[job & 1];
    atomic_store_explicit(&s->fn, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->ctx, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->count, 0, memory_order_relaxed);
    atomic_store(&p->quit, true);
    publish(p, job << ITEM_BITS);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    og_free(p->threads);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    og_free(p);
}

int og_threadpool_size(const og_threadpool *p) { return p ? p->n : 1; }

void og_parallel_for(og_threadpool *p, int64_t n, og_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1 || (uint64_t)n > ITEM_MASK) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    uint64_t job = next_job(p);
    job_slot *s = &p->slot[job & 1];
    atomic_store_explicit(&s->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&s->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&s->count, n, memory_order_relaxed);
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    publish(p, job << ITEM_BITS); /* releases the slot's fields to the workers */
    run_items(p, job, 0);
    if (!spin_for_count(&p->finished, n)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, 1);
        while (atomic_load(&p->finished) < n) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_asleep, 0);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_lock);
}
