/* Fork, save and restore of a KV session shaped like Qwen3-0.6B's (28 flat
 * layers, 8 kv heads of 128, bf16: 112 KiB a token), on the host.
 *
 *   fork:    og_kv_session_fork at L - 3 of a session of L tokens (packed:
 *            the paged allocator, which shares pages; dense: the heap, which
 *            copies); host time, best and median of repeats; and the child's
 *            first pass over its rows (page faults of the shared mapping).
 *   save:    og_session_save's file format (temp file, fsync, rename,
 *            directory fsync) of L tokens, GB/s of live rows: the whole
 *            save, and its hashing and writing into the page cache alone
 *            (what comes before fsync, whose time is the disk's).
 *   restore: from the page cache (the file just written) into a new
 *            session of the same storage, GB/s.
 *   peer:    the same bytes written into the page cache of a new file in the
 *            same folder by one write() a MiB from one buffer, without a hash
 *            or fsync: what a save that serializes a state buffer and
 *            fwrite()s it gets from the kernel at best (llama.cpp's slot
 *            save does that). Measured beside each save, best of 3, and the
 *            save's page-cache rate given as a ratio of it.
 * Save and restore run on packed storage (the paged allocator: every row
 * strided) and on dense storage (the heap, what CPU sessions use: each
 * layer's rows contiguous).
 *
 * Usage: bench_fork [dir for the files (default /tmp)] [lengths...] */
#include "cache/cache.h"
#include "kv/kv.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N_LAYERS 28

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static og_kv_layer_config g_layers[N_LAYERS];

static og_kv_config qwen3_cfg(void) {
    for (int i = 0; i < N_LAYERS; i++)
        g_layers[i] = (og_kv_layer_config){.layer_id = i, .policy = OG_KV_FLAT, .n_kv_heads = 8, .head_dim = 128};
    return (og_kv_config){.version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 40960,
                          .initial_capacity = 256, .max_write = 512, .n_model_layers = N_LAYERS,
                          .n_layers = N_LAYERS, .layers = g_layers};
}

/* A session of L tokens whose rows hold bytes (written through the views). */
static og_kv_session *filled(const og_kv_config *cfg, const og_kv_allocator *a, int64_t L) {
    og_kv_session *s = NULL;
    if (og_kv_session_create(cfg, a, &s) != OG_OK) return NULL;
    for (int64_t done = 0; done < L;) {
        const int32_t T = (int32_t)(L - done < cfg->max_write ? L - done : cfg->max_write);
        if (og_kv_session_prepare(s, T) != OG_OK) {
            og_kv_session_destroy(s);
            return NULL;
        }
        for (int32_t i = 0; i < cfg->n_layers; i++) {
            og_kv_layer_view v;
            og_kv_session_layer_view(s, i, &v);
            const size_t stride = (size_t)og_kv_layer_view_row_stride(&v) * 2, row = 8 * 128 * 2;
            for (int32_t t = 0; t < T; t++) {
                memset((char *)v.k + (size_t)(done + t) * stride, (int)(done + t + i) & 0xff, row);
                memset((char *)v.v + (size_t)(done + t) * stride, (int)(done + t + 2 * i) & 0xff, row);
            }
        }
        og_kv_session_commit(s, T);
        done += T;
    }
    return s;
}

/* Sum of one byte a page of every layer's rows: touches every page. */
static uint64_t touch(const og_kv_session *s) {
    uint64_t sum = 0;
    og_kv_layer_view v;
    og_kv_session_layer_view(s, 0, &v);
    const size_t stride = (size_t)og_kv_layer_view_row_stride(&v) * 2;
    const unsigned char *base = v.k;
    const size_t bytes = (size_t)og_kv_session_length(s) * stride;
    for (size_t off = 0; off < bytes; off += 4096) sum += base[off];
    return sum;
}

static void bench_fork(const og_kv_config *cfg, const og_kv_allocator *a, const char *name, int64_t L) {
    og_kv_session *p = filled(cfg, a, L);
    if (!p) {
        fprintf(stderr, "bench_fork: %s: %s\n", name, og_last_error());
        return;
    }
    enum { REPS = 31 };
    double t[REPS];
    double first_touch = 0;
    for (int r = 0; r < REPS; r++) {
        og_kv_session *c = NULL;
        const double t0 = now_s();
        og_status st = og_kv_session_fork(p, L - 3, NULL, &c);
        t[r] = now_s() - t0;
        if (st != OG_OK) {
            fprintf(stderr, "bench_fork: fork: %s\n", og_last_error());
            break;
        }
        if (r == 0 && a->share) {
            const double t1 = now_s();
            volatile uint64_t sink = touch(c);
            (void)sink;
            first_touch = now_s() - t1;
        }
        og_kv_session_destroy(c);
    }
    qsort(t, REPS, sizeof t[0], cmp_d);
    og_kv_metrics km;
    og_kv_session_metrics(p, &km);
    printf("fork %-6s L=%6lld (%7.1f MiB live): best %9.1f us, median %9.1f us", name, (long long)L,
           (double)km.bytes_live / (1 << 20), t[0] * 1e6, t[REPS / 2] * 1e6);
    if (a->share) printf(", child's first pass over its rows %.1f ms", first_touch * 1e3);
    printf("\n");
    og_kv_session_destroy(p);
}

/* Seconds to write bytes from one buffer into a new file in dir's page
 * cache, one MiB a write(), best of 3; a negative value on failure. */
static double plain_write_s(const char *dir, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/bench_fork.plain", dir);
    unsigned char *buf = malloc(bytes);
    if (!buf) return -1;
    for (size_t i = 0; i < bytes; i += 4096) buf[i] = (unsigned char)i; /* backed, as the KV rows are */
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) break;
        const double t0 = now_s();
        size_t done = 0;
        while (done < bytes) {
            const size_t n = bytes - done < ((size_t)1 << 20) ? bytes - done : (size_t)1 << 20;
            const ssize_t w = write(fd, buf + done, n);
            if (w <= 0) break;
            done += (size_t)w;
        }
        const double t = now_s() - t0;
        close(fd);
        unlink(path);
        if (done == bytes && t < best) best = t;
    }
    free(buf);
    return best < 1e9 ? best : -1;
}

static void bench_save(const og_kv_config *cfg, const og_kv_allocator *a, const char *name, const char *dir,
                       int64_t L) {
    og_kv_session *s = filled(cfg, a, L), *r = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/bench_fork.ogs", dir);
    if (!s || og_kv_session_create(cfg, a, &r) != OG_OK) {
        fprintf(stderr, "bench_fork: %s\n", og_last_error());
        og_kv_session_destroy(s);
        return;
    }
    og_kv_metrics km;
    og_kv_session_metrics(s, &km);
    const double gb = (double)km.bytes_live / 1e9;
    double best_save = 1e9, best_restore = 1e9, best_write = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        og_kv_save_times times = {0};
        og_status st = og_kv_save_file(s, 1, 2, path, &times);
        const double ts = now_s() - t0;
        if (times.write_s < best_write) best_write = times.write_s;
        if (st != OG_OK) {
            fprintf(stderr, "bench_fork: save: %s\n", og_last_error());
            break;
        }
        t0 = now_s();
        st = og_kv_restore_file(r, 1, 2, path);
        const double tr = now_s() - t0;
        if (st != OG_OK) {
            fprintf(stderr, "bench_fork: restore: %s\n", og_last_error());
            break;
        }
        og_kv_session_reset(r);
        if (ts < best_save) best_save = ts;
        if (tr < best_restore) best_restore = tr;
    }
    const double plain = plain_write_s(dir, (size_t)km.bytes_live);
    printf("save %-6s L=%6lld (%7.3f GB live): %7.1f ms, %5.2f GB/s (temp file, fsync, rename, dir fsync), of which "
           "hashing and writing to the page cache %7.1f ms, %5.2f GB/s; restore from page cache %7.1f ms, %5.2f GB/s\n",
           name, (long long)L, gb, best_save * 1e3, gb / best_save, best_write * 1e3, gb / best_write,
           best_restore * 1e3, gb / best_restore);
    if (plain > 0)
        printf("peer %-6s L=%6lld: one buffer written by one thread into the page cache %7.1f ms, %5.2f GB/s; "
               "save's page-cache part is %.2fx of it\n",
               name, (long long)L, plain * 1e3, gb / plain, plain / best_write);
    remove(path);
    og_kv_session_destroy(s);
    og_kv_session_destroy(r);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    int64_t lens[8] = {1024, 8192, 32768};
    int n_lens = 3;
    if (argc > 2) {
        n_lens = 0;
        for (int i = 2; i < argc && n_lens < 8; i++) lens[n_lens++] = atoll(argv[i]);
    }
    og_kv_config cfg = qwen3_cfg();
    og_kv_allocator paged, heap = og_kv_allocator_cpu();
    if (og_kv_allocator_paged(&paged) != OG_OK) {
        fprintf(stderr, "bench_fork: %s\n", og_last_error());
        return 1;
    }
    printf("Qwen3-0.6B KV geometry: %d flat layers, 8 kv heads x 128, bf16 (%d bytes a token)\n", N_LAYERS,
           N_LAYERS * 2 * 8 * 128 * 2);
    for (int i = 0; i < n_lens; i++) bench_fork(&cfg, &paged, "packed", lens[i]);
    for (int i = 0; i < n_lens; i++)
        if (lens[i] <= 8192) bench_fork(&cfg, &heap, "dense", lens[i]);
    for (int i = 0; i < n_lens; i++) bench_save(&cfg, &paged, "packed", dir, lens[i]);
    for (int i = 0; i < n_lens; i++) bench_save(&cfg, &heap, "dense", dir, lens[i]);
    og_kv_allocator_paged_release(&paged);
    return 0;
}
