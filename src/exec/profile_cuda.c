/* Device time by launch step (profile_cuda.h). */
#include "exec/profile_cuda.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LABEL_CHARS 64

/* One label's sums over the steps of one shape. */
typedef struct entry {
    int32_t sessions, rows;
    char label[LABEL_CHARS];
    double launches, seconds; /* summed over steps */
    uint64_t bytes;           /* summed over steps */
} entry;

/* The steps of one shape. */
typedef struct shape {
    int32_t sessions, rows;
    int64_t steps;
    double seconds;
} shape;

/* A mark of the step in flight. */
typedef struct mark {
    char label[LABEL_CHARS];
    uint64_t bytes;
} mark;

struct og_cuda_profile {
    char *dest;
    pthread_mutex_t lock; /* held from begin to end */
    cudaEvent_t *events;  /* [n_events]: events[0] the begin, events[k + 1] mark k */
    int32_t n_events;
    mark *marks; /* [n_events - 1] */
    int32_t n_marks, sessions, rows;
    entry *entries;
    int32_t n_entries, cap_entries;
    shape *shapes;
    int32_t n_shapes, cap_shapes;
};

static og_status cuda_fail(cudaError_t e, const char *what) {
    return og_set_error(OG_ERR_BACKEND, "profile: %s: %s", what, cudaGetErrorString(e));
}

og_status og_cuda_profile_open(const char *dest, og_cuda_profile **out) {
    *out = NULL;
    if (!dest || !*dest) return OG_OK;
    og_cuda_profile *p = og_calloc(1, sizeof *p);
    if (!p || !(p->dest = og_strdup(dest))) {
        og_free(p);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    }
    pthread_mutex_init(&p->lock, NULL);
    *out = p;
    return OG_OK;
}

/* The event for mark k (k = -1: the begin), made on first use. */
static og_status event_at(og_cuda_profile *p, int32_t k, cudaEvent_t *ev) {
    const int32_t i = k + 1;
    if (i >= p->n_events) {
        const int32_t n = i < 64 ? 64 : 2 * i;
        cudaEvent_t *e = og_realloc(p->events, (size_t)n * sizeof *e);
        if (!e) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
        p->events = e;
        mark *m = og_realloc(p->marks, (size_t)n * sizeof *m);
        if (!m) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
        p->marks = m;
        for (; p->n_events < n; p->n_events++) {
            const cudaError_t err = cudaEventCreate(&p->events[p->n_events]);
            if (err != cudaSuccess) return cuda_fail(err, "cudaEventCreate");
        }
    }
    *ev = p->events[i];
    return OG_OK;
}

og_status og_cuda_profile_begin(og_cuda_profile *p, void *stream, int32_t sessions, int32_t rows) {
    pthread_mutex_lock(&p->lock);
    p->n_marks = 0;
    p->sessions = sessions;
    p->rows = rows;
    cudaEvent_t ev;
    OG_TRY(event_at(p, -1, &ev));
    const cudaError_t e = cudaEventRecord(ev, (cudaStream_t)stream);
    return e == cudaSuccess ? OG_OK : cuda_fail(e, "cudaEventRecord");
}

og_status og_cuda_profile_mark(og_cuda_profile *p, void *stream, const char *label, uint64_t bytes) {
    cudaEvent_t ev;
    OG_TRY(event_at(p, p->n_marks, &ev));
    mark *m = &p->marks[p->n_marks];
    snprintf(m->label, sizeof m->label, "%s", label);
    m->bytes = bytes;
    const cudaError_t e = cudaEventRecord(ev, (cudaStream_t)stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventRecord");
    p->n_marks++;
    return OG_OK;
}

static void *grow(void *a, int32_t n, int32_t *cap, size_t size) {
    if (n < *cap) return a;
    const int32_t c = *cap ? 2 * *cap : 64;
    void *b = og_realloc(a, (size_t)c * size);
    if (b) *cap = c;
    return b;
}

/* Adds the step's marks to the tables (a failed growth drops the rest). */
static void add_step(og_cuda_profile *p) {
    shape *s = NULL;
    for (int32_t i = 0; i < p->n_shapes && !s; i++)
        if (p->shapes[i].sessions == p->sessions && p->shapes[i].rows == p->rows) s = &p->shapes[i];
    if (!s) {
        shape *a = grow(p->shapes, p->n_shapes, &p->cap_shapes, sizeof *a);
        if (!a) return;
        p->shapes = a;
        s = &a[p->n_shapes++];
        *s = (shape){.sessions = p->sessions, .rows = p->rows};
    }
    s->steps++;
    for (int32_t k = 0; k < p->n_marks; k++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->events[k], p->events[k + 1]) != cudaSuccess) ms = 0;
        s->seconds += ms * 1e-3;
        const mark *m = &p->marks[k];
        entry *e = NULL;
        for (int32_t i = 0; i < p->n_entries && !e; i++) {
            entry *c = &p->entries[i];
            if (c->sessions == p->sessions && c->rows == p->rows && !strcmp(c->label, m->label)) e = c;
        }
        if (!e) {
            entry *a = grow(p->entries, p->n_entries, &p->cap_entries, sizeof *a);
            if (!a) return;
            p->entries = a;
            e = &a[p->n_entries++];
            *e = (entry){.sessions = p->sessions, .rows = p->rows};
            snprintf(e->label, sizeof e->label, "%s", m->label);
        }
        e->launches += 1;
        e->seconds += ms * 1e-3;
        e->bytes += m->bytes;
    }
}

void og_cuda_profile_end(og_cuda_profile *p, bool ok) {
    if (ok) add_step(p);
    pthread_mutex_unlock(&p->lock);
}

static int by_seconds(const void *a, const void *b) {
    const double x = ((const entry *)a)->seconds, y = ((const entry *)b)->seconds;
    return (x < y) - (x > y);
}

static void write_tables(og_cuda_profile *p, FILE *f) {
    qsort(p->entries, (size_t)p->n_entries, sizeof *p->entries, by_seconds);
    for (int32_t i = 0; i < p->n_shapes; i++) {
        const shape *s = &p->shapes[i];
        const double n = (double)s->steps;
        fprintf(f, "# CUDA device time: %lld step%s of %d session%s, %d row%s: %.1f us a step\n", (long long)s->steps,
                s->steps == 1 ? "" : "s", s->sessions, s->sessions == 1 ? "" : "s", s->rows, s->rows == 1 ? "" : "s",
                s->seconds / n * 1e6);
        fprintf(f, "%-52s %9s %10s %7s %8s\n", "launch step", "per step", "us a step", "share", "GB/s");
        for (int32_t k = 0; k < p->n_entries; k++) {
            const entry *e = &p->entries[k];
            if (e->sessions != s->sessions || e->rows != s->rows) continue;
            char gbs[16] = "-";
            if (e->bytes && e->seconds > 0) snprintf(gbs, sizeof gbs, "%.0f", (double)e->bytes / e->seconds * 1e-9);
            fprintf(f, "%-52s %9.1f %10.1f %6.1f%% %8s\n", e->label, e->launches / n, e->seconds / n * 1e6,
                    s->seconds > 0 ? 100 * e->seconds / s->seconds : 0.0, gbs);
        }
        fprintf(f, "\n");
    }
}

void og_cuda_profile_close(og_cuda_profile *p) {
    if (!p) return;
    if (p->n_shapes > 0) {
        const bool err = !strcmp(p->dest, "-");
        FILE *f = err ? stderr : fopen(p->dest, "a");
        if (f) {
            write_tables(p, f);
            if (!err) fclose(f);
        } else {
            OG_WARN("OG_CUDA_PROFILE=%s: cannot open it to append the profile", p->dest);
        }
    }
    for (int32_t i = 0; i < p->n_events; i++) cudaEventDestroy(p->events[i]);
    pthread_mutex_destroy(&p->lock);
    og_free(p->events);
    og_free(p->marks);
    og_free(p->entries);
    og_free(p->shapes);
    og_free(p->dest);
    og_free(p);
}
