/* A small fork-join thread pool: one parallel-for at a time, the caller
 * works as thread 0, items are handed out by an atomic counter. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

struct og_threadpool {
    int n;                   /* threads including the caller */
    pthread_t *threads;      /* [n - 1] workers              */
    pthread_mutex_t run_lock; /* serializes og_parallel_for   */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;     /* bumped for every job         */
    int busy;                /* workers still in the job     */
    bool quit;
    /* the current job */
    og_task_fn fn;
    void *ctx;
    int64_t count;
    atomic_llong next;
};

typedef struct {
    og_threadpool *p;
    int index;
} worker_arg;

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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_items(p, a.index);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
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
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_lock);
}

static og_threadpool *g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static void make_default(void) { g_default = og_threadpool_create(0); }

og_threadpool *og_threadpool_default(void) {
    pthread_once(&g_default_once, make_default);
    return g_default;
}
