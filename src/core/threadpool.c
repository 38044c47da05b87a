/* A small fork-join thread pool: one parallel-for at a time, the caller
 * works as thread 0, items are handed out by an atomic counter.
 *
 * A decode step runs a few hundred short parallel-fors back to back, so
 * waking sleeping workers through a condition variable each time costs more
 * than the work. Instead a job is published by bumping an atomic generation
 * counter, and an idle worker spins on it for SPIN_NS before it goes to
 * sleep on the condition variable; the caller waits for the job's end the
 * same way. Idle threads therefore use no CPU once SPIN_NS has passed.
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

struct og_threadpool {
    int n;                    /* threads including the caller */
    pthread_t *threads;       /* [n - 1] workers              */
    pthread_mutex_t run_lock; /* serializes og_parallel_for   */
    pthread_mutex_t mu;       /* guards the two sleeps        */
    pthread_cond_t wake;      /* workers sleep here           */
    pthread_cond_t done;      /* the caller sleeps here       */
    atomic_uint_fast64_t generation; /* bumped for every job (and to quit) */
    atomic_int busy;          /* workers still in the job     */
    atomic_int sleepers;      /* workers asleep on `wake`     */
    atomic_int caller_asleep; /* 1 while the caller sleeps on `done` */
    atomic_bool quit;
    /* the current job, written before the generation is bumped */
    og_task_fn fn;
    void *ctx;
    int64_t count;
    atomic_llong next;
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

/* Spins until *gen differs from seen or SPIN_NS pass; true if it changed. */
static bool spin_for_generation(atomic_uint_fast64_t *gen, uint64_t seen) {
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(gen, memory_order_acquire) != seen) return true;
        OG_CPU_RELAX();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t >= deadline) return false;
        }
    }
}

static bool spin_for_zero(atomic_int *busy) {
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(busy, memory_order_acquire) == 0) return true;
        OG_CPU_RELAX();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t >= deadline) return false;
        }
    }
}

static void run_items(og_threadpool *p, int thread) {
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->count) break;
        p->fn(p->ctx, i, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    og_free(arg);
    og_threadpool *p = a.p;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_generation(&p->generation, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load(&p->generation);
        if (atomic_load(&p->quit)) break;
        run_items(p, a.index);
        if (atomic_fetch_sub(&p->busy, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Publishes a new generation and wakes any sleeping worker. */
static void bump_generation(og_threadpool *p) {
    atomic_fetch_add(&p->generation, 1);
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
    atomic_init(&p->generation, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_asleep, 0);
    atomic_init(&p->quit, false);
    atomic_init(&p->next, 0);
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

void og_threadpool_destroy(og_threadpool *p) {
    if (!p) return;
    atomic_store(&p->quit, true);
    bump_generation(p);
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
    if (!p || p->n == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n - 1);
    bump_generation(p); /* releases the job fields above to the workers */
    run_items(p, 0);
    if (!spin_for_zero(&p->busy)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, 1);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_asleep, 0);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_lock);
}
