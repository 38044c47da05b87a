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

struct og_cuda_profile {
    char *dest;
    pthread_mutex_t lock; /* over the tables: contexts add steps from their threads */
    entry *entries;
    int32_t n_entries, cap_entries;
    shape *shapes;
    int32_t n_shapes, cap_shapes;
};

/* A mark: the work before its event is its label's. */
typedef struct mark {
    char label[LABEL_CHARS];
    uint64_t bytes;
} mark;

struct og_cuda_marks {
    cudaEvent_t *events; /* [n_events]: events[0] the start, events[k + 1] mark k's */
    mark *marks;         /* [n_events - 1] */
    int32_t n_events, n_marks;
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

og_status og_cuda_marks_reserve(og_cuda_marks **mkp, int32_t events) {
    if (!*mkp && !(*mkp = og_calloc(1, sizeof **mkp))) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    og_cuda_marks *mk = *mkp;
    if (events + 1 <= mk->n_events) return OG_OK;
    const int32_t n = events + 1;
    cudaEvent_t *e = og_realloc(mk->events, (size_t)n * sizeof *e);
    if (!e) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    mk->events = e;
    mark *m = og_realloc(mk->marks, (size_t)n * sizeof *m);
    if (!m) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    mk->marks = m;
    for (; mk->n_events < n; mk->n_events++) {
        const cudaError_t err = cudaEventCreate(&mk->events[mk->n_events]);
        if (err != cudaSuccess) return cuda_fail(err, "cudaEventCreate");
    }
    return OG_OK;
}

void og_cuda_marks_free(og_cuda_marks *mk) {
    if (!mk) return;
    for (int32_t i = 0; i < mk->n_events; i++) cudaEventDestroy(mk->events[i]);
    og_free(mk->events);
    og_free(mk->marks);
    og_free(mk);
}

og_status og_cuda_marks_start(og_cuda_marks *mk, void *stream) {
    mk->n_marks = 0;
    return og_cuda_marks_again(mk, stream, -1);
}

og_status og_cuda_marks_add(og_cuda_marks *mk, void *stream, const char *label, uint64_t bytes, bool captured) {
    if (mk->n_marks + 1 >= mk->n_events)
        return og_set_error(OG_ERR_BACKEND, "profile: more marks in a step than the %d reserved", mk->n_events - 1);
    mark *m = &mk->marks[mk->n_marks];
    snprintf(m->label, sizeof m->label, "%s", label);
    m->bytes = bytes;
    const cudaEvent_t ev = mk->events[mk->n_marks + 1];
    const cudaError_t e = captured ? cudaEventRecordWithFlags(ev, (cudaStream_t)stream, cudaEventRecordExternal)
                                   : cudaEventRecord(ev, (cudaStream_t)stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventRecord");
    mk->n_marks++;
    return OG_OK;
}

og_status og_cuda_marks_again(og_cuda_marks *mk, void *stream, int32_t k) {
    if (k < -1 || k >= mk->n_marks || mk->n_events == 0)
        return og_set_error(OG_ERR_BACKEND, "profile: no mark %d to record again", (int)k);
    const cudaError_t e = cudaEventRecord(mk->events[k + 1], (cudaStream_t)stream);
    return e == cudaSuccess ? OG_OK : cuda_fail(e, "cudaEventRecord");
}

int32_t og_cuda_marks_count(const og_cuda_marks *mk) { return mk->n_marks; }

static void *grow(void *a, int32_t n, int32_t *cap, size_t size) {
    if (n < *cap) return a;
    const int32_t c = *cap ? 2 * *cap : 64;
    void *b = og_realloc(a, (size_t)c * size);
    if (b) *cap = c;
    return b;
}

/* Adds mk's times to the tables (a failed growth drops the rest). */
static void add_step(og_cuda_profile *p, const og_cuda_marks *mk, int32_t sessions, int32_t rows) {
    shape *s = NULL;
    for (int32_t i = 0; i < p->n_shapes && !s; i++)
        if (p->shapes[i].sessions == sessions && p->shapes[i].rows == rows) s = &p->shapes[i];
    if (!s) {
        shape *a = grow(p->shapes, p->n_shapes, &p->cap_shapes, sizeof *a);
        if (!a) return;
        p->shapes = a;
        s = &a[p->n_shapes++];
        *s = (shape){.sessions = sessions, .rows = rows};
    }
    s->steps++;
    for (int32_t k = 0; k < mk->n_marks; k++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, mk->events[k], mk->events[k + 1]) != cudaSuccess) ms = 0;
        s->seconds += ms * 1e-3;
        const mark *m = &mk->marks[k];
        entry *e = NULL;
        for (int32_t i = 0; i < p->n_entries && !e; i++) {
            entry *c = &p->entries[i];
            if (c->sessions == sessions && c->rows == rows && !strcmp(c->label, m->label)) e = c;
        }
        if (!e) {
            entry *a = grow(p->entries, p->n_entries, &p->cap_entries, sizeof *a);
            if (!a) return;
            p->entries = a;
            e = &a[p->n_entries++];
            *e = (entry){.sessions = sessions, .rows = rows};
            snprintf(e->label, sizeof e->label, "%s", m->label);
        }
        e->launches += 1;
        e->seconds += ms * 1e-3;
        e->bytes += m->bytes;
    }
}

void og_cuda_profile_add(og_cuda_profile *p, const og_cuda_marks *mk, int32_t sessions, int32_t rows) {
    pthread_mutex_lock(&p->lock);
    add_step(p, mk, sessions, rows);
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
    pthread_mutex_destroy(&p->lock);
    og_free(p->entries);
    og_free(p->shapes);
    og_free(p->dest);
    og_free(p);
}
