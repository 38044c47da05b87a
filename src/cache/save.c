/* Sessions saved to files and restored (og_session_save, og_session_restore).
 *
 * The file (every field little-endian, as this machine writes them):
 *   header, 128 bytes:
 *     0  magic "OGKVSES\n"          8  u32 version (2)      12 u32 header_bytes
 *     16 u64 manifest hash          24 u64 weights hash
 *     32 u32 kv_dtype               36 i32 n_layers         40 i32 max_write
 *     44 u32 reserved (0)           48 i64 max_capacity     56 i64 length L
 *     64 u64 file_bytes             72 u64 header check     80..127 zero
 *   one 64-byte entry per manifest layer:
 *     0 i32 layer_id  4 i32 policy  8 i32 window  12 i32 n_kv_heads
 *     16 i32 head_dim 20 u32 0      24 i64 first position  32 i64 rows
 *     40 u64 payload offset  48 u64 payload bytes  56 u64 payload check
 *   payload: per layer, its rows' k [rows, Hkv, D] then v [rows, Hkv, D].
 * Only live rows are written: flat layers positions [0, L), ring layers the
 * last min(L, R) positions (restore puts position p in slot p mod R).
 * header_bytes = 128 + 64 * n_layers. The header check is the hash (hash.h)
 * of the header and the entries with the check field zero; a payload check
 * is XXH3-64 (libxxhash, seeded with SAVE_SEED) of that layer's payload
 * bytes. Version 1 files, which differ only in their payload checks (the
 * hash of hash.h, several times slower), are still read.
 *
 * The program's identity: the manifest hash is the hash of the program
 * file's bytes before the weight payload (header, manifest JSON with the
 * tokenizer, instructions); the weights hash covers every weight tensor's
 * name, dtype, shape and byte count, and its bytes sampled: all of them for
 * tensors up to 64 KiB, else 16 windows of 4 KiB spread evenly from the
 * first byte to the last. It is computed at each save and restore from the
 * mapped program (a few MB read at most).
 *
 * A save writes a temp file <path>.tmp.XXXXXX in the same directory: the
 * payload first, the header last (a torn temp file has no valid header),
 * fsync, rename onto path, fsync of the directory.
 *
 * Speed: rows in this process's memory (CPU sessions) are hashed and
 * written in place, and read in place and hashed, a run of about 1 MiB at a
 * time (one pwrite/pread when the layer's rows are contiguous, of its rows
 * by pwritev/preadv when they are strided, as in packed storage), so each
 * byte is hashed while still in cache and never copied by this code; the
 * layers go to up to 4 threads (OG_SAVE_THREADS), each at the layer's own
 * offset; restore prefaults the pages it reads into. Device rows go through
 * a host buffer (og_kv_session_rows_to_host / _from_host) on one thread. */
#include "cache/cache.h"
#include "cache/hash.h"
#include "exec/exec.h"
#include "kv/kv.h"
#include "program/program.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* the AVX2 / AVX-512 code the CPU has, picked at run time */
#endif

#define SAVE_MAGIC "OGKVSES\n"
#define SAVE_VERSION 2u
#define SAVE_VERSION_STATES 3u /* written when the program has states: version 2 and the state table */
#define SAVE_VERSION_OG_HASH 1u /* payload checks by hash.h: read, no longer written */
#define HDR_BYTES 128
#define ENTRY_BYTES 64
#define HDR_CHECK_AT 72
#define SAVE_SEED 0x6f6773657373ull
#define CHUNK_BYTES ((size_t)4 << 20) /* device rows are moved and hashed through a buffer this big */
#define RUN_BYTES ((size_t)1 << 20)   /* host rows hashed and written (read and hashed) at a time */
#define RUN_IOV 1024                  /* at most this many strided rows a run (<= IOV_MAX) */

typedef struct save_layer {
    int32_t layer_id, policy, window, n_kv_heads, head_dim;
    int64_t first, rows;
    uint64_t offset, bytes, check;
} save_layer;

/* A state's entry: its geometry, where its committed copy is in the file. */
typedef struct save_state {
    int32_t layer_id, dtype, rank;
    int64_t shape[OG_KV_STATE_MAX_RANK];
    uint64_t offset, bytes, check;
} save_state;

typedef struct save_header {
    uint32_t version; /* read from a file; a save writes SAVE_VERSION or SAVE_VERSION_STATES */
    uint64_t manifest_hash, weights_hash;
    uint32_t kv_dtype;
    int32_t n_layers, max_write;
    int64_t max_capacity, length;
    uint64_t file_bytes, check;
    save_layer *layers; /* [n_layers] */
    int32_t n_states;   /* version 3 */
    save_state *states; /* [n_states] */
} save_header;

/* ------------------------------------------------------------ identity */

static void program_identity(const og_program *p, uint64_t *manifest, uint64_t *weights) {
    size_t header_bytes = 0;
    const void *header = og_program_header_bytes(p, &header_bytes);
    *manifest = og_hash64(header, header_bytes, SAVE_SEED);
    og_hash h;
    og_hash_init(&h, SAVE_SEED);
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        if (t->binding != OG_BINDING_WEIGHT) continue;
        og_hash_update(&h, t->name, strlen(t->name) + 1);
        int64_t meta[2 + OG_PROGRAM_MAX_RANK] = {(int64_t)t->dtype, (int64_t)t->nbytes};
        for (int32_t d = 0; d < t->rank; d++) meta[2 + d] = t->shape[d];
        og_hash_update(&h, meta, sizeof meta);
        const unsigned char *b = t->data;
        const size_t n = (size_t)t->nbytes, win = 4096, k = 16;
        if (!b) continue;
        if (n <= k * win) {
            og_hash_update(&h, b, n);
        } else {
            for (size_t j = 0; j < k; j++) og_hash_update(&h, b + (n - win) / (k - 1) * j, win);
        }
    }
    *weights = og_hash_final(&h);
}

/* ------------------------------------------------------------ header bytes */

static void put32(unsigned char *b, uint32_t v) { og_put_le32(b, v); }
static void put64(unsigned char *b, uint64_t v) { og_put_le64(b, v); }

static size_t header_size(int32_t n_entries) { return HDR_BYTES + (size_t)n_entries * ENTRY_BYTES; }

/* Writes h into b [header_size], with its check computed (h->check set). */
static void header_encode(save_header *h, unsigned char *b) {
    const size_t size = header_size(h->n_layers + h->n_states);
    memset(b, 0, size);
    memcpy(b, SAVE_MAGIC, 8);
    put32(b + 8, h->n_states ? SAVE_VERSION_STATES : SAVE_VERSION);
    put32(b + 44, (uint32_t)h->n_states);
    put32(b + 12, (uint32_t)size);
    put64(b + 16, h->manifest_hash);
    put64(b + 24, h->weights_hash);
    put32(b + 32, h->kv_dtype);
    put32(b + 36, (uint32_t)h->n_layers);
    put32(b + 40, (uint32_t)h->max_write);
    put64(b + 48, (uint64_t)h->max_capacity);
    put64(b + 56, (uint64_t)h->length);
    put64(b + 64, h->file_bytes);
    for (int32_t i = 0; i < h->n_layers; i++) {
        unsigned char *e = b + HDR_BYTES + (size_t)i * ENTRY_BYTES;
        const save_layer *l = &h->layers[i];
        put32(e, (uint32_t)l->layer_id);
        put32(e + 4, (uint32_t)l->policy);
        put32(e + 8, (uint32_t)l->window);
        put32(e + 12, (uint32_t)l->n_kv_heads);
        put32(e + 16, (uint32_t)l->head_dim);
        put64(e + 24, (uint64_t)l->first);
        put64(e + 32, (uint64_t)l->rows);
        put64(e + 40, l->offset);
        put64(e + 48, l->bytes);
        put64(e + 56, l->check);
    }
    for (int32_t i = 0; i < h->n_states; i++) {
        unsigned char *e = b + HDR_BYTES + (size_t)(h->n_layers + i) * ENTRY_BYTES;
        const save_state *t = &h->states[i];
        put32(e, (uint32_t)t->layer_id);
        put32(e + 4, (uint32_t)t->dtype);
        put32(e + 8, (uint32_t)t->rank);
        for (int d = 0; d < OG_KV_STATE_MAX_RANK; d++) put64(e + 16 + 8 * d, (uint64_t)t->shape[d]);
        put64(e + 48, t->offset);
        put64(e + 56, t->check);
    }
    h->check = og_hash64(b, size, SAVE_SEED);
    put64(b + HDR_CHECK_AT, h->check);
}

/* ------------------------------------------------------------ geometry */

/* The layers' saved positions and payload places for a session of length L. */
static void plan_layers(const og_kv_config *cfg, int64_t L, save_header *h) {
    uint64_t off = header_size(cfg->n_layers + h->n_states);
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &cfg->layers[i];
        save_layer *s = &h->layers[i];
        const int64_t R = og_kv_layer_slots(cfg, l);
        s->layer_id = l->layer_id;
        s->policy = (int32_t)l->policy;
        s->window = l->window;
        s->n_kv_heads = l->n_kv_heads;
        s->head_dim = l->head_dim;
        s->first = l->policy == OG_KV_RING && L > R ? L - R : 0;
        s->rows = L - s->first;
        s->offset = off;
        s->bytes = 2 * (uint64_t)s->rows * (uint64_t)og_kv_row_bytes(cfg, l);
        off += s->bytes;
    }
    for (int32_t i = 0; i < h->n_states; i++) { /* the committed copy of every state, after the rows */
        const og_kv_state_config *c = &cfg->states[i];
        save_state *t = &h->states[i];
        t->layer_id = c->layer_id;
        t->dtype = (int32_t)c->dtype;
        t->rank = c->rank;
        memset(t->shape, 0, sizeof t->shape);
        memcpy(t->shape, c->shape, (size_t)c->rank * sizeof *c->shape);
        t->offset = off;
        t->bytes = (uint64_t)og_kv_state_bytes(c);
        off += t->bytes;
    }
    h->file_bytes = off;
}

/* Writes (save) or reads and checks (restore) the states' payloads of h:
 * the committed copy of each (zeros at length 0, where a state is zero by
 * definition), through a host buffer. */
static og_status run_states(og_kv_session *kv, save_header *h, bool save, int fd, const char *path) {
    og_status st = OG_OK;
    for (int32_t i = 0; i < h->n_states && st == OG_OK; i++) {
        save_state *t = &h->states[i];
        unsigned char *buf = og_calloc(1, (size_t)t->bytes);
        if (!buf) return og_set_error(OG_ERR_OUT_OF_MEMORY, "saved session: no memory for a state of %llu bytes",
                                      (unsigned long long)t->bytes);
        if (save) {
            if (h->length > 0) st = og_kv_session_state_to_host(kv, i, buf);
            if (st == OG_OK && pwrite(fd, buf, (size_t)t->bytes, (off_t)t->offset) != (ssize_t)t->bytes)
                st = og_set_error(OG_ERR_IO, "og_session_save: writing state %d of %s: %s", (int)i, path, strerror(errno));
            if (st == OG_OK) t->check = XXH3_64bits_withSeed(buf, (size_t)t->bytes, SAVE_SEED);
        } else {
            if (pread(fd, buf, (size_t)t->bytes, (off_t)t->offset) != (ssize_t)t->bytes)
                st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: reading state %d: truncated or unreadable", path,
                                  (int)i);
            else if (XXH3_64bits_withSeed(buf, (size_t)t->bytes, SAVE_SEED) != t->check)
                st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: state %d (layer_id %d): checksum mismatch (it "
                                                 "is corrupt)", path, (int)i, (int)t->layer_id);
            else
                st = og_kv_session_state_from_host(kv, i, buf);
        }
        og_free(buf);
    }
    return st;
}

/* ------------------------------------------------------------ i/o */

static og_status write_all(int fd, const void *buf, size_t n, const char *path) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return og_set_error(errno == ENOSPC ? OG_ERR_IO : OG_ERR_IO, "og_session_save: writing %s: %s", path,
                                w < 0 ? strerror(errno) : "nothing written");
        p += w;
        n -= (size_t)w;
    }
    return OG_OK;
}

/* Reads exactly n bytes; OG_ERR_FORMAT naming truncation at EOF. */
static og_status read_all(int fd, void *buf, size_t n, const char *path, const char *what) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return og_set_error(OG_ERR_IO, "og_session_restore: %s: reading %s: %s", path, what, strerror(errno));
        if (r == 0) return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: truncated: the file ends inside %s", path, what);
        p += r;
        n -= (size_t)r;
    }
    return OG_OK;
}

/* A layer's payload check: XXH3-64 (version 2) or hash.h (version 1). */
typedef struct payload_hash {
    XXH3_state_t *x; /* NULL for version 1 */
    og_hash h;
} payload_hash;

static og_status payload_hash_init(payload_hash *p, uint32_t version) {
    p->x = NULL;
    og_hash_init(&p->h, SAVE_SEED);
    if (version == SAVE_VERSION_OG_HASH) return OG_OK;
    if (!(p->x = XXH3_createState()) || XXH3_64bits_reset_withSeed(p->x, SAVE_SEED) != XXH_OK) {
        XXH3_freeState(p->x);
        p->x = NULL;
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "saved session: no memory for a checksum state");
    }
    return OG_OK;
}

static void payload_hash_update(payload_hash *p, const void *data, size_t n) {
    if (p->x) XXH3_64bits_update(p->x, data, n);
    else og_hash_update(&p->h, data, n);
}

/* The check, and the state freed. */
static uint64_t payload_hash_final(payload_hash *p) {
    uint64_t v = p->x ? (uint64_t)XXH3_64bits_digest(p->x) : og_hash_final(&p->h);
    XXH3_freeState(p->x);
    p->x = NULL;
    return v;
}

/* Moves *iov [*n] past `done` bytes that a pwritev/preadv moved, dropping
 * the entries it finished (and empty ones). */
static void iov_advance(struct iovec **iov, int *n, size_t done) {
    struct iovec *v = *iov;
    for (size_t left = done; left > 0;) {
        const size_t take = left < v->iov_len ? left : v->iov_len;
        v->iov_base = (unsigned char *)v->iov_base + take;
        v->iov_len -= take;
        left -= take;
        if (v->iov_len == 0) v++, (*n)--;
    }
    while (*n > 0 && v->iov_len == 0) v++, (*n)--;
    *iov = v;
}

/* pwritev of every byte of iov [n] at *off (both advanced past what was written). */
static og_status pwritev_all(int fd, struct iovec *iov, int n, uint64_t *off, const char *path) {
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)*off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return og_set_error(OG_ERR_IO, "og_session_save: writing %s: %s", path,
                                w < 0 ? strerror(errno) : "nothing written");
        *off += (uint64_t)w;
        iov_advance(&iov, &n, (size_t)w);
    }
    return OG_OK;
}

/* preadv filling every byte of iov [n] from *off (both advanced); OG_ERR_FORMAT
 * naming truncation at EOF. */
static og_status preadv_all(int fd, struct iovec *iov, int n, uint64_t *off, const char *path, const char *what) {
    while (n > 0) {
        ssize_t r = preadv(fd, iov, n, (off_t)*off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return og_set_error(OG_ERR_IO, "og_session_restore: %s: reading %s: %s", path, what, strerror(errno));
        if (r == 0)
            return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: truncated: the file ends inside %s", path, what);
        *off += (uint64_t)r;
        iov_advance(&iov, &n, (size_t)r);
    }
    return OG_OK;
}

/* The rows of one run of host rows: one iovec when contiguous, one a row
 * when strided. Returns the count. */
static int run_iov(unsigned char *p, size_t pitch, size_t row, int64_t n, struct iovec *iov) {
    if (pitch == row) {
        iov[0] = (struct iovec){p, (size_t)n * row};
        return 1;
    }
    for (int64_t k = 0; k < n; k++) iov[k] = (struct iovec){p + (size_t)k * pitch, row};
    return (int)n;
}

/* Rows of a run: about RUN_BYTES, at most RUN_IOV when strided. */
static int64_t run_rows(size_t row, bool strided) {
    int64_t per = (int64_t)(RUN_BYTES / row);
    if (strided && per > RUN_IOV) per = RUN_IOV;
    return per > 0 ? per : 1;
}

/* The next run of up to *n rows of layer i's part from `first` when they
 * lie in host memory (not across a ring's end): true with *p, *pitch and *n
 * cut to what one run takes; false when the rows are on the device. */
static bool host_run(const og_kv_session *kv, int32_t i, int part, int64_t first, size_t row, int64_t *n,
                     unsigned char **p, size_t *pitch) {
    if (!og_kv_session_rows_in_host(kv, i, part, first, 1, p, pitch)) return false;
    const int64_t per = run_rows(row, *pitch != row);
    if (*n > per) *n = per;
    return og_kv_session_rows_in_host(kv, i, part, first, *n, p, pitch);
}

/* Marks s as in a step (so nothing steps it meanwhile); OG_ERR_STATE if it is. */
static og_status hold(og_session *s, const char *fn) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->stepping, &expected, 1))
        return og_errbuf_set(&s->err, OG_ERR_STATE, "%s: the session is in a step", fn);
    return OG_OK;
}

/* ------------------------------------------------------------ layers in parallel */

/* Layers are independent (each has its own place in the file and its own
 * check), so a save or restore of rows in this process's memory hands them
 * to a few threads: the page cache copies and the hashing of one thread run
 * at a few GB/s, and several scale with the memory. Device rows (through
 * the allocator's to_host / from_host) stay on the calling thread. */

#define SAVE_THREADS 4 /* OG_SAVE_THREADS overrides (1..64) */

typedef struct page_span {
    uintptr_t a, b;
} page_span;

typedef struct layer_jobs {
    og_kv_session *kv;
    save_header *h;
    bool save;
    int fd;
    const char *path;
    int n_workers;
    atomic_int next;   /* the next layer to take */
    atomic_int failed; /* a worker failed: the others stop */
    pthread_mutex_t lock;
    og_status st;      /* the first failure */
    char msg[OG_ERRMSG_CAP];
    page_span *spans;  /* restore: pages the rows go to, merged, for MADV_POPULATE_WRITE */
    int n_spans;
    size_t span_bytes;
} layer_jobs;

typedef struct layer_worker {
    layer_jobs *j;
    int index;
    pthread_t thread;
} layer_worker;

/* Backs this worker's share of the restore's pages before reading into them
 * (one madvise per span rather than a fault every 4 KiB inside read). Best
 * effort: without it the faults only come one by one. */
static void populate_share(const layer_jobs *j, int w) {
#ifdef MADV_POPULATE_WRITE
    if (!j->n_spans) return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t share = j->span_bytes / (size_t)j->n_workers / page * page;
    size_t from = share * (size_t)w, to = w + 1 == j->n_workers ? j->span_bytes : share * (size_t)(w + 1);
    size_t at = 0; /* bytes of the spans before span k */
    for (int k = 0; k < j->n_spans && from < to; k++) {
        const size_t len = j->spans[k].b - j->spans[k].a;
        if (from < at + len) {
            const size_t a = from - at, b = to - at < len ? to - at : len;
            madvise((void *)(j->spans[k].a + a), b - a, MADV_POPULATE_WRITE);
            from = at + b;
        }
        at += len;
    }
#else
    (void)j;
    (void)w;
#endif
}

static int span_cmp(const void *x, const void *y) {
    const page_span *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* The pages every layer's host rows lie in, sorted and merged (packed
 * layers share their pages). Leaves none when memory is short. */
static void restore_spans(layer_jobs *j) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    page_span *sp = og_malloc((size_t)(2 * j->h->n_layers + 1) * sizeof *sp);
    if (!sp) return;
    int n = 0;
    for (int32_t i = 0; i < j->h->n_layers; i++)
        for (int part = 0; part < 2; part++) {
            const save_layer *l = &j->h->layers[i];
            unsigned char *p;
            size_t pitch;
            if (l->rows < 1 || !og_kv_session_rows_in_host(j->kv, i, part, l->first, l->rows, &p, &pitch)) continue;
            const size_t row = (size_t)l->bytes / 2 / (size_t)l->rows;
            sp[n].a = (uintptr_t)p / page * page;
            sp[n].b = ((uintptr_t)p + (size_t)(l->rows - 1) * pitch + row + page - 1) / page * page;
            n++;
        }
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    int m = 0;
    for (int k = 0; k < n; k++) {
        if (m && sp[k].a <= sp[m - 1].b) {
            if (sp[k].b > sp[m - 1].b) sp[m - 1].b = sp[k].b;
        } else {
            sp[m++] = sp[k];
        }
    }
    j->spans = sp;
    j->n_spans = m;
    j->span_bytes = 0;
    for (int k = 0; k < m; k++) j->span_bytes += sp[k].b - sp[k].a;
}

static og_status save_layer_rows(const og_kv_session *kv, int32_t i, save_layer *l, unsigned char **buf,
                                 struct iovec *iov, int fd, const char *path);
static og_status restore_layer_rows(og_kv_session *kv, uint32_t version, int32_t i, const save_layer *l,
                                    unsigned char **buf, struct iovec *iov, int fd, const char *path);

static void *layer_worker_main(void *arg) {
    layer_worker *w = arg;
    layer_jobs *j = w->j;
    struct iovec *iov = og_malloc(RUN_IOV * sizeof *iov);
    unsigned char *buf = NULL;
    og_status st = iov ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "%s: no memory",
                                              j->save ? "og_session_save" : "og_session_restore");
    if (st == OG_OK && !j->save) populate_share(j, w->index);
    while (st == OG_OK && !atomic_load(&j->failed)) {
        const int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->h->n_layers) break;
        st = j->save ? save_layer_rows(j->kv, i, &j->h->layers[i], &buf, iov, j->fd, j->path)
                     : restore_layer_rows(j->kv, j->h->version, i, &j->h->layers[i], &buf, iov, j->fd, j->path);
    }
    if (st != OG_OK) {
        pthread_mutex_lock(&j->lock);
        if (!atomic_load(&j->failed)) {
            j->st = st;
            snprintf(j->msg, sizeof j->msg, "%s", og_last_error());
            atomic_store(&j->failed, 1);
        }
        pthread_mutex_unlock(&j->lock);
    }
    og_free(iov);
    og_free(buf);
    return NULL;
}

/* Saves (or restores) every layer's rows of h, on up to SAVE_THREADS
 * threads when every row is in this process's memory. */
static og_status run_layers(og_kv_session *kv, save_header *h, bool save, int fd, const char *path) {
    layer_jobs j = {.kv = kv, .h = h, .save = save, .fd = fd, .path = path, .st = OG_OK};
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    int n = SAVE_THREADS;
    const char *env = getenv("OG_SAVE_THREADS");
    if (env && atoi(env) >= 1 && atoi(env) <= 64) n = atoi(env);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus >= 1 && n > cpus) n = (int)cpus;
    if (n > h->n_layers) n = h->n_layers > 0 ? h->n_layers : 1;
    for (int32_t i = 0; i < h->n_layers && n > 1; i++) {
        unsigned char *p;
        size_t pitch;
        if (h->layers[i].rows > 0 && !og_kv_session_rows_in_host(kv, i, 0, h->layers[i].first, 1, &p, &pitch))
            n = 1; /* device rows: one thread */
    }
    if (!save) restore_spans(&j);
    pthread_mutex_init(&j.lock, NULL);
    layer_worker *w = og_calloc((size_t)n, sizeof *w);
    int started = 1;
    if (!w) n = 1;
    j.n_workers = n;
    for (int k = 1; w && k < n; k++) {
        w[k] = (layer_worker){.j = &j, .index = k};
        if (pthread_create(&w[k].thread, NULL, layer_worker_main, &w[k]) != 0) break; /* fewer workers */
        started++;
    }
    layer_worker self = {.j = &j, .index = 0};
    layer_worker_main(&self);
    for (int k = 1; k < started; k++) pthread_join(w[k].thread, NULL);
    og_free(w);
    og_free(j.spans);
    pthread_mutex_destroy(&j.lock);
    if (atomic_load(&j.failed)) return og_set_error(j.st, "%s", j.msg);
    return OG_OK;
}

/* ------------------------------------------------------------ save */

/* Hashes and writes the fill bytes gathered in buf at *off; none left. */
static og_status flush_gathered(payload_hash *h, unsigned char *buf, size_t *fill, struct iovec *iov, int fd,
                                uint64_t *off, const char *path) {
    if (!*fill) return OG_OK;
    payload_hash_update(h, buf, *fill);
    iov[0] = (struct iovec){buf, *fill};
    *fill = 0;
    return pwritev_all(fd, iov, 1, off, path);
}

/* Writes layer i's payload (k rows, then v rows) to fd, hashing it: host
 * rows in place, a run at a time, except strided runs (short ones, a page of
 * packed storage each), which are gathered into buf [CHUNK_BYTES], in cache,
 * and written a buffer at a time; device rows through buf. */
static og_status save_layer_rows(const og_kv_session *kv, int32_t i, save_layer *l, unsigned char **buf,
                                 struct iovec *iov, int fd, const char *path) {
    const og_kv_config *cfg = og_kv_session_config(kv);
    uint64_t off = l->offset;
    const size_t row = (size_t)og_kv_row_bytes(cfg, &cfg->layers[i]);
    const int64_t per_buf = (int64_t)(CHUNK_BYTES / row) > 0 ? (int64_t)(CHUNK_BYTES / row) : 1;
    size_t fill = 0; /* bytes gathered in buf, not yet written */
    payload_hash h;
    og_status st = payload_hash_init(&h, SAVE_VERSION);
    if (st == OG_OK && l->rows > 0 && !*buf && !(*buf = og_malloc(CHUNK_BYTES)))
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_save: no memory");
    for (int part = 0; part < 2 && st == OG_OK; part++)
        for (int64_t done = 0; done < l->rows && st == OG_OK;) {
            unsigned char *p;
            size_t pitch;
            int64_t n = l->rows - done;
            bool host = host_run(kv, i, part, l->first + done, row, &n, &p, &pitch);
            if (host && pitch != row && (size_t)n * row <= CHUNK_BYTES) {
                if (fill + (size_t)n * row > CHUNK_BYTES &&
                    (st = flush_gathered(&h, *buf, &fill, iov, fd, &off, path)) != OG_OK)
                    break;
                for (int64_t r = 0; r < n; r++, fill += row) memcpy(*buf + fill, p + (size_t)r * pitch, row);
            } else if ((st = flush_gathered(&h, *buf, &fill, iov, fd, &off, path)) != OG_OK) {
                break;
            } else if (host) {
                const int k = run_iov(p, pitch, row, n, iov);
                for (int j = 0; j < k; j++) payload_hash_update(&h, iov[j].iov_base, iov[j].iov_len);
                st = pwritev_all(fd, iov, k, &off, path);
            } else {
                if (n > per_buf) n = per_buf;
                if ((st = og_kv_session_rows_to_host(kv, i, part, l->first + done, n, *buf)) != OG_OK) break;
                fill = (size_t)n * row;
                st = flush_gathered(&h, *buf, &fill, iov, fd, &off, path);
            }
            done += n;
        }
    if (st == OG_OK) st = flush_gathered(&h, *buf, &fill, iov, fd, &off, path);
    const uint64_t check = payload_hash_final(&h);
    if (st == OG_OK) l->check = check;
    return st;
}

static og_status fsync_dir_of(const char *path) {
    char *copy = og_malloc(strlen(path) + 1);
    if (!copy) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_save: no memory");
    strcpy(copy, path);
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    og_status st = OG_OK;
    if (fd < 0 || fsync(fd) != 0)
        st = og_set_error(OG_ERR_IO, "og_session_save: fsync of the directory %s: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    og_free(copy);
    return st;
}

og_status og_kv_save_file(const og_kv_session *kv, uint64_t manifest_hash, uint64_t weights_hash, const char *path,
                          og_kv_save_times *times) {
    const double t0 = og_time_now();
    const og_kv_config *cfg = og_kv_session_config(kv);
    save_header h = {0};
    h.layers = og_calloc((size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1), sizeof *h.layers);
    h.n_states = cfg->n_states;
    h.states = og_calloc((size_t)(cfg->n_states > 0 ? cfg->n_states : 1), sizeof *h.states);
    const size_t hsize = header_size(cfg->n_layers + cfg->n_states);
    unsigned char *hdr = og_malloc(hsize);
    char *tmp = og_malloc(strlen(path) + 16);
    og_status st = OG_OK;
    int fd = -1;
    if (!h.layers || !h.states || !hdr || !tmp) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_save: no memory");
        goto done;
    }
    h.manifest_hash = manifest_hash;
    h.weights_hash = weights_hash;
    h.kv_dtype = (uint32_t)cfg->kv_dtype;
    h.n_layers = cfg->n_layers;
    h.max_write = cfg->max_write;
    h.max_capacity = cfg->max_capacity;
    h.length = og_kv_session_length(kv);
    plan_layers(cfg, h.length, &h);
    sprintf(tmp, "%s.tmp.XXXXXX", path);
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        st = og_set_error(OG_ERR_IO, "og_session_save: cannot create a temp file %s: %s", tmp, strerror(errno));
        tmp[0] = 0;
        goto done;
    }
    /* the header's place stays zero until every row is written */
    memset(hdr, 0, hsize);
    if ((st = write_all(fd, hdr, hsize, tmp)) != OG_OK) goto done;
    if ((st = run_layers((og_kv_session *)kv, &h, true, fd, tmp)) != OG_OK) goto done;
    if ((st = run_states((og_kv_session *)kv, &h, true, fd, tmp)) != OG_OK) goto done;
    header_encode(&h, hdr);
    if (pwrite(fd, hdr, hsize, 0) != (ssize_t)hsize) {
        st = og_set_error(OG_ERR_IO, "og_session_save: writing the header of %s: %s", tmp, strerror(errno));
        goto done;
    }
    const double t1 = og_time_now();
    if (times) times->write_s = t1 - t0;
    if (fsync(fd) != 0) {
        st = og_set_error(OG_ERR_IO, "og_session_save: fsync of %s: %s", tmp, strerror(errno));
        goto done;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = og_set_error(OG_ERR_IO, "og_session_save: close of %s: %s", tmp, strerror(errno));
        goto done;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = og_set_error(OG_ERR_IO, "og_session_save: rename of %s to %s: %s", tmp, path, strerror(errno));
        goto done;
    }
    tmp[0] = 0; /* renamed: nothing to remove */
    st = fsync_dir_of(path);
    if (times) times->sync_s = og_time_now() - t1;
done:
    if (fd >= 0) close(fd);
    if (tmp && tmp[0]) unlink(tmp);
    og_free(tmp);
    og_free(hdr);
    og_free(h.layers);
    og_free(h.states);
    return st;
}

/* Runs a save or restore of a session's KV storage against path, with the
 * session held (no step may run meanwhile) and the program's identity. */
typedef og_status (*kv_file_fn)(og_kv_session *kv, uint64_t manifest, uint64_t weights, const char *path);
static og_status with_session_file(og_session *s, const char *path, const char *what, kv_file_fn fn) {
    if (!s || !path) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: NULL argument", what);
    og_status st = hold(s, what);
    if (st != OG_OK) return og_set_error(st, "%s", s->err.msg);
    uint64_t manifest, weights;
    program_identity(s->m->prog, &manifest, &weights);
    st = fn(s->kv, manifest, weights, path);
    atomic_store(&s->stepping, 0);
    if (st != OG_OK) {
        char cause[OG_ERRMSG_CAP];
        snprintf(cause, sizeof cause, "%s", og_last_error());
        og_errbuf_set(&s->err, st, "%s", cause);
    }
    return st;
}

static og_status save_kv(og_kv_session *kv, uint64_t manifest, uint64_t weights, const char *path) {
    return og_kv_save_file(kv, manifest, weights, path, NULL);
}

og_status og_session_save(og_session *s, const char *path) {
    return with_session_file(s, path, "og_session_save", save_kv);
}

/* ------------------------------------------------------------ restore */

static uint32_t get32(const unsigned char *b) { return og_le32(b); }
static uint64_t get64(const unsigned char *b) { return og_le64(b); }

/* Reads and checks the header of the file open at fd against model m's
 * program and manifest (kv_dtype: the session's, or OG_DTYPE_COUNT to take
 * the file's if it is bf16 or f32). Fills h (h->layers owned by the caller). */
static og_status read_header(int fd, const char *path, const og_kv_config *cfg, uint64_t manifest, uint64_t weights,
                             og_dtype kv_dtype, save_header *h) {
    unsigned char fixed[HDR_BYTES];
    og_status st = read_all(fd, fixed, HDR_BYTES, path, "the header");
    if (st != OG_OK) return st;
    if (memcmp(fixed, SAVE_MAGIC, 8) != 0)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: bad magic: not a saved offgraph session (or an "
                                           "incomplete save)", path);
    const uint32_t version = get32(fixed + 8);
    if (version != SAVE_VERSION && version != SAVE_VERSION_OG_HASH && version != SAVE_VERSION_STATES)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: version %u is not one this build reads (%u to %u)",
                            path, version, SAVE_VERSION_OG_HASH, SAVE_VERSION_STATES);
    h->version = version;
    h->manifest_hash = get64(fixed + 16);
    h->weights_hash = get64(fixed + 24);
    h->kv_dtype = get32(fixed + 32);
    h->n_layers = (int32_t)get32(fixed + 36);
    h->max_write = (int32_t)get32(fixed + 40);
    h->max_capacity = (int64_t)get64(fixed + 48);
    h->length = (int64_t)get64(fixed + 56);
    h->file_bytes = get64(fixed + 64);
    h->check = get64(fixed + HDR_CHECK_AT);
    h->n_states = version == SAVE_VERSION_STATES ? (int32_t)get32(fixed + 44) : 0;
    if ((version == SAVE_VERSION_STATES) != (cfg->n_states > 0))
        return og_set_error(OG_ERR_FORMAT,
                            "og_session_restore: %s: version %u: a program %s states is saved in version %s", path,
                            version, cfg->n_states > 0 ? "with" : "without", cfg->n_states > 0 ? "3" : "1 or 2");
    if (h->manifest_hash != manifest)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another program: its manifest hash %016llx is not "
                                           "this program's %016llx", path, (unsigned long long)h->manifest_hash,
                            (unsigned long long)manifest);
    if (h->weights_hash != weights)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another program: its weights hash %016llx is not "
                                           "this program's %016llx", path, (unsigned long long)h->weights_hash,
                            (unsigned long long)weights);
    if (h->kv_dtype != (uint32_t)OG_DTYPE_F32 && h->kv_dtype != (uint32_t)OG_DTYPE_BF16 &&
        h->kv_dtype != (uint32_t)OG_DTYPE_INT8 && h->kv_dtype != (uint32_t)OG_DTYPE_FP8)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: kv_dtype %u is not bf16, f32, int8 or fp8",
                            path, h->kv_dtype);
    if (kv_dtype != OG_DTYPE_COUNT && h->kv_dtype != (uint32_t)kv_dtype)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: kv_dtype %s, the session's is %s",
                            path, og_dtype_name((og_dtype)h->kv_dtype), og_dtype_name(kv_dtype));
    if (h->n_layers != cfg->n_layers)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: %d layers, the program has %d",
                            path, (int)h->n_layers, (int)cfg->n_layers);
    if (h->max_write != cfg->max_write)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: max_write %d, the program's is %d",
                            path, (int)h->max_write, (int)cfg->max_write);
    if (h->max_capacity != cfg->max_capacity)
        return og_set_error(OG_ERR_FORMAT,
                            "og_session_restore: %s: another geometry: max_capacity %lld, the program's is %lld", path,
                            (long long)h->max_capacity, (long long)cfg->max_capacity);
    if (h->n_states != cfg->n_states)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: %d states, the program has %d",
                            path, (int)h->n_states, (int)cfg->n_states);
    if (h->length < 0 || h->length > cfg->max_capacity)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: length %lld is outside [0, %lld]", path,
                            (long long)h->length, (long long)cfg->max_capacity);
    const size_t hsize = header_size(h->n_layers + h->n_states);
    if (get32(fixed + 12) != hsize)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: header_bytes %u, want %zu for %d layers and %d states",
                            path, get32(fixed + 12), hsize, (int)h->n_layers, (int)h->n_states);
    unsigned char *all = og_malloc(hsize);
    h->layers = og_calloc((size_t)(h->n_layers > 0 ? h->n_layers : 1), sizeof *h->layers);
    h->states = og_calloc((size_t)(h->n_states > 0 ? h->n_states : 1), sizeof *h->states);
    if (!all || !h->layers || !h->states) {
        og_free(all);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_restore: no memory");
    }
    memcpy(all, fixed, HDR_BYTES);
    st = read_all(fd, all + HDR_BYTES, hsize - HDR_BYTES, path, "the layer table");
    /* the geometry of every layer and state, and where its bytes must be */
    save_header want = {.layers = og_calloc((size_t)(h->n_layers > 0 ? h->n_layers : 1), sizeof *want.layers),
                        .n_states = h->n_states,
                        .states = og_calloc((size_t)(h->n_states > 0 ? h->n_states : 1), sizeof *want.states)};
    if (st == OG_OK && (!want.layers || !want.states))
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_restore: no memory");
    og_kv_config geo = *cfg;
    geo.kv_dtype = (og_dtype)h->kv_dtype;
    if (st == OG_OK) plan_layers(&geo, h->length, &want);
    for (int32_t i = 0; i < h->n_layers && st == OG_OK; i++) {
        const unsigned char *e = all + HDR_BYTES + (size_t)i * ENTRY_BYTES;
        save_layer *l = &h->layers[i];
        const save_layer *w = &want.layers[i];
        l->layer_id = (int32_t)get32(e);
        l->policy = (int32_t)get32(e + 4);
        l->window = (int32_t)get32(e + 8);
        l->n_kv_heads = (int32_t)get32(e + 12);
        l->head_dim = (int32_t)get32(e + 16);
        l->first = (int64_t)get64(e + 24);
        l->rows = (int64_t)get64(e + 32);
        l->offset = get64(e + 40);
        l->bytes = get64(e + 48);
        l->check = get64(e + 56);
        const char *field = l->layer_id != w->layer_id     ? "layer_id"
                            : l->policy != w->policy       ? "policy"
                            : l->window != w->window       ? "window"
                            : l->n_kv_heads != w->n_kv_heads ? "n_kv_heads"
                            : l->head_dim != w->head_dim   ? "head_dim"
                                                           : NULL;
        if (field) {
            st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: layer %d's %s differs from the "
                                             "program's", path, (int)i, field);
            break;
        }
        field = l->first != w->first     ? "first position"
                : l->rows != w->rows     ? "row count"
                : l->offset != w->offset ? "payload offset"
                : l->bytes != w->bytes   ? "payload bytes"
                                         : NULL;
        if (field)
            st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: layer %d (layer_id %d): the %s disagrees with the "
                                             "length %lld", path, (int)i, (int)l->layer_id, field, (long long)h->length);
    }
    for (int32_t i = 0; i < h->n_states && st == OG_OK; i++) {
        const unsigned char *e = all + HDR_BYTES + (size_t)(h->n_layers + i) * ENTRY_BYTES;
        save_state *t = &h->states[i];
        const save_state *w = &want.states[i];
        t->layer_id = (int32_t)get32(e);
        t->dtype = (int32_t)get32(e + 4);
        t->rank = (int32_t)get32(e + 8);
        for (int d = 0; d < OG_KV_STATE_MAX_RANK; d++) t->shape[d] = (int64_t)get64(e + 16 + 8 * d);
        t->offset = get64(e + 48);
        t->check = get64(e + 56);
        t->bytes = w->bytes;
        if (t->layer_id != w->layer_id || t->dtype != w->dtype || t->rank != w->rank ||
            memcmp(t->shape, w->shape, sizeof t->shape))
            st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: another geometry: state %d (layer_id %d) differs "
                                             "from the program's", path, (int)i, (int)t->layer_id);
        else if (t->offset != w->offset)
            st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: state %d (layer_id %d): the payload offset "
                                             "disagrees with the length %lld", path, (int)i, (int)t->layer_id,
                              (long long)h->length);
    }
    if (st == OG_OK && h->file_bytes != want.file_bytes)
        st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: file_bytes %llu disagrees with the layers (%llu)", path,
                          (unsigned long long)h->file_bytes, (unsigned long long)want.file_bytes);
    if (st == OG_OK) {
        put64(all + HDR_CHECK_AT, 0);
        if (og_hash64(all, hsize, SAVE_SEED) != h->check)
            st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: header checksum mismatch (the header is corrupt)",
                              path);
    }
    struct stat sb;
    if (st == OG_OK && fstat(fd, &sb) != 0)
        st = og_set_error(OG_ERR_IO, "og_session_restore: %s: fstat: %s", path, strerror(errno));
    if (st == OG_OK && (uint64_t)sb.st_size != h->file_bytes)
        st = og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: %s: the file has %lld bytes, its header says %llu",
                          path, (uint64_t)sb.st_size < h->file_bytes ? "truncated" : "trailing bytes",
                          (long long)sb.st_size, (unsigned long long)h->file_bytes);
    og_free(want.layers);
    og_free(want.states);
    og_free(all);
    return st;
}

/* Reads layer i's rows into s, checking its payload: host rows read in
 * place, a run at a time, then hashed; device rows through buf. */
static og_status restore_layer_rows(og_kv_session *kv, uint32_t version, int32_t i, const save_layer *l,
                                    unsigned char **buf, struct iovec *iov, int fd, const char *path) {
    const og_kv_config *cfg = og_kv_session_config(kv);
    uint64_t off = l->offset;
    const size_t row = (size_t)og_kv_row_bytes(cfg, &cfg->layers[i]);
    const int64_t per_buf = (int64_t)(CHUNK_BYTES / row) > 0 ? (int64_t)(CHUNK_BYTES / row) : 1;
    payload_hash h;
    og_status st = payload_hash_init(&h, version);
    char what[96];
    snprintf(what, sizeof what, "the rows of layer %d", (int)i);
    for (int part = 0; part < 2 && st == OG_OK; part++)
        for (int64_t done = 0; done < l->rows && st == OG_OK;) {
            unsigned char *p;
            size_t pitch;
            int64_t n = l->rows - done;
            bool host = host_run(kv, i, part, l->first + done, row, &n, &p, &pitch);
            if (host) {
                const int k = run_iov(p, pitch, row, n, iov);
                if ((st = preadv_all(fd, iov, k, &off, path, what)) != OG_OK) break;
                /* readv_all moved the iovecs past their rows: hash them again from the start */
                const int k2 = run_iov(p, pitch, row, n, iov);
                for (int j = 0; j < k2; j++) payload_hash_update(&h, iov[j].iov_base, iov[j].iov_len);
            } else {
                if (n > per_buf) n = per_buf;
                if (!*buf && !(*buf = og_malloc(CHUNK_BYTES))) {
                    st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_session_restore: no memory");
                    break;
                }
                iov[0] = (struct iovec){*buf, (size_t)n * row};
                if ((st = preadv_all(fd, iov, 1, &off, path, what)) != OG_OK) break;
                payload_hash_update(&h, *buf, (size_t)n * row);
                st = og_kv_session_rows_from_host(kv, i, part, l->first + done, n, *buf);
            }
            done += n;
        }
    const uint64_t check = payload_hash_final(&h);
    if (st != OG_OK) return st;
    if (check != l->check)
        return og_set_error(OG_ERR_FORMAT, "og_session_restore: %s: layer %d (layer_id %d): checksum mismatch (its rows "
                                           "are corrupt)", path, (int)i, (int)l->layer_id);
    return OG_OK;
}

og_status og_kv_restore_file(og_kv_session *kv, uint64_t manifest_hash, uint64_t weights_hash, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return og_set_error(OG_ERR_IO, "og_session_restore: cannot open %s: %s", path, strerror(errno));
    save_header h = {0};
    const og_kv_config *cfg = og_kv_session_config(kv);
    og_status st = read_header(fd, path, cfg, manifest_hash, weights_hash, cfg->kv_dtype, &h);
    if (st == OG_OK) og_kv_session_reset(kv);
    if (st == OG_OK && (st = og_kv_session_restore_begin(kv, h.length)) != OG_OK)
        og_set_error(st, "og_session_restore: %s: %s", path, og_kv_session_last_error(kv));
    if (st == OG_OK) st = run_layers(kv, &h, false, fd, path);
    if (st == OG_OK && h.length > 0) st = run_states(kv, &h, false, fd, path);
    if (st == OG_OK) og_kv_session_restore_end(kv, h.length);
    close(fd);
    og_free(h.layers);
    og_free(h.states);
    return st;
}

og_status og_session_restore_into(og_session *s, const char *path) {
    return with_session_file(s, path, "og_session_restore_into", og_kv_restore_file);
}

og_status og_session_restore(og_model *m, const char *path, og_session **out) {
    if (!m || !path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_session_restore: NULL argument");
    *out = NULL;
    /* the file's kv dtype decides the session's */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return og_set_error(OG_ERR_IO, "og_session_restore: cannot open %s: %s", path, strerror(errno));
    save_header h = {0};
    uint64_t manifest, weights;
    program_identity(m->prog, &manifest, &weights);
    og_status st = read_header(fd, path, og_program_kv_config(m->prog), manifest, weights, OG_DTYPE_COUNT, &h);
    close(fd);
    og_free(h.layers);
    og_free(h.states);
    if (st != OG_OK) return st;
    og_session_params p = og_session_default_params();
    p.kv_dtype = (og_dtype)h.kv_dtype;
    og_session *s = NULL;
    if ((st = og_session_create(m, &p, &s)) != OG_OK) return st;
    if ((st = og_session_restore_into(s, path)) != OG_OK) {
        og_session_destroy(s);
        return st;
    }
    *out = s;
    return OG_OK;
}
