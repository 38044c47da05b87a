/* Threads stepping sessions of one CPU model at once, against one thread
 * stepping one session: what a model's thread pool gives callers that share
 * it. Each thread decodes its own session greedily, one token a call
 * (og_session_eval_next), after a short prompt; the model's pool has
 * --threads workers (the callers take part in their own calls).
 *
 *   bench_threads <program.ogp> [--threads N (2)] [--callers K (2)] [--tokens T (400)] [--reps R (7)]
 *
 * Prints tokens/s of one caller and of K callers together (every caller's
 * tokens), best and median of R alternating runs, and their ratio. Target
 * (the reliability issue): 2 callers at >= 1.6x one caller's rate on 2
 * cores. */
#include "offgraph.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_CALLERS = 16, PROMPT = 8 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    og_session *s;
    int tokens;
    og_status st;
    pthread_barrier_t *go;
} caller;

static void *decode(void *arg) {
    caller *c = arg;
    int32_t prompt[PROMPT], tok = 0;
    for (int i = 0; i < PROMPT; i++) prompt[i] = 17 + 31 * i;
    og_session_reset(c->s);
    c->st = og_session_eval_next(c->s, prompt, PROMPT, 0, &tok);
    if (c->go) pthread_barrier_wait(c->go);
    for (int i = 0; i < c->tokens && c->st == OG_OK; i++) c->st = og_session_eval_next(c->s, &tok, 1, 0, &tok);
    return NULL;
}

/* Tokens a second of k callers decoding at once (all of their tokens). */
static double run(og_session **s, int k, int tokens) {
    caller c[MAX_CALLERS];
    pthread_t t[MAX_CALLERS];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)k + 1);
    for (int i = 0; i < k; i++) {
        c[i] = (caller){s[i], tokens, OG_OK, &go};
        pthread_create(&t[i], NULL, decode, &c[i]);
    }
    pthread_barrier_wait(&go); /* every prompt is in */
    const double t0 = now();
    for (int i = 0; i < k; i++) pthread_join(t[i], NULL);
    const double dt = now() - t0;
    pthread_barrier_destroy(&go);
    for (int i = 0; i < k; i++)
        if (c[i].st != OG_OK) {
            fprintf(stderr, "bench_threads: a step failed: %s\n", og_last_error());
            exit(1);
        }
    return (double)k * tokens / dt;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_threads <program.ogp> [--threads N] [--callers K] [--tokens T] [--reps R]\n");
        return 2;
    }
    int threads = 2, callers = 2, tokens = 400, reps = 7;
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--callers")) callers = v;
        else if (!strcmp(argv[i], "--tokens")) tokens = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
    }
    if (callers < 1 || callers > MAX_CALLERS || tokens < 1 || reps < 1 || reps > 100) return 2;
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = threads;
    og_model *m = NULL;
    if (og_model_load(argv[1], &mp, &m) != OG_OK) {
        fprintf(stderr, "bench_threads: %s\n", og_last_error());
        return 1;
    }
    og_session *s[MAX_CALLERS] = {0};
    for (int i = 0; i < callers; i++)
        if (og_session_create(m, NULL, &s[i]) != OG_OK) {
            fprintf(stderr, "bench_threads: %s\n", og_last_error());
            return 1;
        }
    run(s, 1, tokens / 4); /* warm-up: storage grown, pages touched, caches */
    run(s, callers, tokens / 4);
    double one[100], many[100];
    for (int r = 0; r < reps; r++) {
        one[r] = run(s, 1, tokens);
        many[r] = run(s, callers, tokens);
    }
    qsort(one, (size_t)reps, sizeof *one, cmp);
    qsort(many, (size_t)reps, sizeof *many, cmp);
    printf("%s, a pool of %d threads, %d tokens a caller, %d runs each\n", argv[1], threads, tokens, reps);
    printf("1 caller:  %8.1f tok/s best, %8.1f median\n", one[reps - 1], one[reps / 2]);
    printf("%d callers: %8.1f tok/s best, %8.1f median (all callers' tokens)\n", callers, many[reps - 1],
           many[reps / 2]);
    printf("ratio: %.2fx best, %.2fx median\n", many[reps - 1] / one[reps - 1], many[reps / 2] / one[reps / 2]);
    for (int i = 0; i < callers; i++) og_session_destroy(s[i]);
    og_model_destroy(m);
    return 0;
}
