/* Saved sessions, on the CPU (a Qwen3-shaped program with sliding-window
 * layers, rings wrapped):
 *   - save -> restore -> the next 32 tokens' logits equal the saved
 *     session's own, bit for bit (memcmp); into dense and packed storage,
 *     from either; an empty session; the saved file holds only live rows;
 *   - the payload checks are XXH3-64 of each layer's bytes (computed here
 *     with libxxhash from the file's own layer table); a version 1 file
 *     (the same bytes with hash.h payload checks, made here from a version
 *     2 one) restores bit for bit; a version 2 file relabelled 1 fails its
 *     checks; one thread or several (OG_SAVE_THREADS) write the same bytes
 *     and restore the same logits, into dense and packed storage;
 *   - every corrupt header field is refused with a message naming it; a
 *     truncated file at many lengths, trailing bytes, a flipped payload byte
 *     (naming the layer), another program, another kv dtype;
 *   - a process saving in a loop, killed with SIGKILL at random moments,
 *     never leaves at the path a file that restore accepts unless it is
 *     complete (the old save or the new one, each giving its own logits),
 *     and leftover temp files are refused unless complete. */
#include "cache/hash.h"
#include "harness.h"
#include "import/export.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define N_NEXT 32
#define SAVE_SEED 0x6f6773657373ull /* docs/program-format.md, saved sessions */
#define N_PROMPT 70

static og_model *g_model;
static int64_t g_vocab;
static int32_t g_prompt[N_PROMPT], g_next[N_NEXT];
static char g_dir[64];
/* KV storage of the sessions fed_session makes: OG_DTYPE_COUNT, the program's */
static og_dtype g_kv_dtype = OG_DTYPE_COUNT;

/* Logits of the first n of g_next fed one token at a time: [n, V]. */
static og_status next_n_logits(og_session *s, float *out, int n) {
    og_status st = OG_OK;
    for (int t = 0; t < n && st == OG_OK; t++) st = og_session_eval(s, &g_next[t], 1, 0, out + t * g_vocab, 0);
    return st;
}

static og_status next_logits(og_session *s, float *out) { return next_n_logits(s, out, N_NEXT); }

/* The kill test compares this many tokens (a whole restore is checked by the round trip). */
#define N_KILL_NEXT 4

static og_session *fed_session(const og_kv_allocator *alloc, int64_t n) {
    og_session_params sp = og_session_default_params();
    sp.kv_allocator = alloc;
    sp.kv_dtype = g_kv_dtype;
    og_session *s = NULL;
    CHECK_OK(og_session_create(g_model, &sp, &s));
    if (s && n) CHECK_OK(og_session_eval(s, g_prompt, n, 0, NULL, 0));
    return s;
}

static int64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

static void test_roundtrip(const og_kv_allocator *from, const og_kv_allocator *into, const char *name) {
    char what[160], path[256];
    snprintf(what, sizeof what, "save -> restore -> 32 tokens bit for bit (%s)", name);
    og_test_section(what);
    snprintf(path, sizeof path, "%s/rt.ogs", g_dir);
    const size_t bytes = sizeof(float) * N_NEXT * (size_t)g_vocab;
    float *want = malloc(bytes), *got = malloc(bytes);
    for (int64_t n = 0; n <= N_PROMPT; n += N_PROMPT / 2) {
        og_session *s = fed_session(from, n);
        CHECK_OK(og_session_save(s, path));
        og_kv_metrics km;
        og_session_metrics(s, &km);
        /* the file: header + one 64-byte entry a layer + the live rows
         * (flat: n; ring: min(n, R)), never the allocated ones */
        const og_kv_config *cfg = og_model_kv_config(g_model);
        const og_dtype dt = g_kv_dtype != OG_DTYPE_COUNT ? g_kv_dtype : cfg->kv_dtype;
        int64_t rows_bytes = 0;
        for (int32_t i = 0; i < cfg->n_layers; i++) {
            const og_kv_layer_config *l = &cfg->layers[i];
            const int64_t R = og_kv_layer_slots(cfg, l), live = l->policy == OG_KV_RING && n > R ? R : n;
            /* int8 / fp8 rows: Hkv * D quants and Hkv f32 scales, padded to 16 bytes */
            const int64_t row = dt == OG_DTYPE_INT8 || dt == OG_DTYPE_FP8
                                    ? ((int64_t)l->n_kv_heads * (l->head_dim + 4) + 15) / 16 * 16
                                                          : (int64_t)l->n_kv_heads * l->head_dim * (int64_t)og_dtype_size(dt);
            rows_bytes += 2 * live * row;
        }
        CHECK_MSG(file_size(path) == 128 + 64 * cfg->n_layers + rows_bytes, "file %lld bytes, want %lld",
                  (long long)file_size(path), (long long)(128 + 64 * cfg->n_layers + rows_bytes));
        og_session *r = NULL;
        if (into) {
            r = fed_session(into, 5); /* a session with a conversation of its own, replaced */
            CHECK_OK(og_session_restore_into(r, path));
        } else {
            CHECK_OK(og_session_restore(g_model, path, &r));
        }
        if (r) {
            CHECK(og_session_length(r) == n);
            og_poison(got, bytes / sizeof(float));
            CHECK_OK(next_logits(s, want));
            CHECK_OK(next_logits(r, got));
            CHECK_MSG(!memcmp(want, got, bytes), "%s: length %lld: logits after restore differ", name, (long long)n);
        }
        og_session_destroy(r);
        og_session_destroy(s);
    }
    remove(path);
    free(want);
    free(got);
}

/* ------------------------------------------------------------ corruption */

/* Restores a copy of `valid` changed by the caller; returns the message. */
static og_status restore_bytes(const unsigned char *b, size_t n, char *msg, size_t cap) {
    char path[256];
    snprintf(path, sizeof path, "%s/bad.ogs", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) return OG_ERR_IO;
    fwrite(b, 1, n, f);
    fclose(f);
    og_session *s = NULL;
    og_status st = og_session_restore(g_model, path, &s);
    snprintf(msg, cap, "%s", og_last_error());
    og_session_destroy(s);
    remove(path);
    return st;
}

static unsigned char *read_whole(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    if (fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void put32(unsigned char *b, uint32_t v) { memcpy(b, &v, 4); }
static void put64(unsigned char *b, uint64_t v) { memcpy(b, &v, 8); }

static void test_corruption(void) {
    og_test_section("corrupt files are refused, naming what is wrong");
    char path[256], msg[1024];
    snprintf(path, sizeof path, "%s/valid.ogs", g_dir);
    og_session *s = fed_session(NULL, N_PROMPT);
    CHECK_OK(og_session_save(s, path));
    og_session_destroy(s);
    size_t n = 0;
    unsigned char *valid = read_whole(path, &n), *b = malloc(n + 16);
    if (!valid) return;
    const og_kv_config *cfg = og_model_kv_config(g_model);
    typedef struct {
        size_t at;
        int width; /* 4 or 8 */
        uint64_t value;
        const char *want; /* in the message */
    } field_case;
    const size_t e0 = 128, e1 = 128 + 64; /* layer 0's and layer 1's entries */
    const field_case cases[] = {
        {0, 8, 0x4141414141414141ull, "magic"},
        {8, 4, 3, "version"},
        {8, 4, 0, "version"},
        {12, 4, 129, "header_bytes"},
        {16, 8, 12345, "manifest hash"},
        {24, 8, 12345, "weights hash"},
        {32, 4, OG_DTYPE_F16, "kv_dtype"},
        {36, 4, (uint64_t)cfg->n_layers + 1, "layers"},
        {40, 4, (uint64_t)cfg->max_write + 1, "max_write"},
        {48, 8, (uint64_t)cfg->max_capacity * 2, "max_capacity"},
        {56, 8, (uint64_t)cfg->max_capacity + 1, "length"},
        {56, 8, N_PROMPT - 1, "disagrees with the length"},
        {64, 8, 1000, "file_bytes"},
        {72, 8, 99, "header checksum"},
        {e0 + 0, 4, 77, "layer_id"},
        {e0 + 4, 4, 7, "policy"},
        {e0 + 8, 4, 1234, "window"},
        {e0 + 12, 4, 99, "n_kv_heads"},
        {e0 + 16, 4, 999, "head_dim"},
        {e1 + 24, 8, 12345, "first position"},
        {e1 + 32, 8, 3, "row count"},
        {e1 + 40, 8, 1 << 20, "payload offset"},
        {e1 + 48, 8, 64, "payload bytes"},
        {e1 + 56, 8, 7, "header checksum"},
        {100, 8, 1, "header checksum"}, /* reserved bytes */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(b, valid, n);
        if (cases[k].width == 4) put32(b + cases[k].at, (uint32_t)cases[k].value);
        else put64(b + cases[k].at, cases[k].value);
        og_status st = restore_bytes(b, n, msg, sizeof msg);
        CHECK_MSG(st == OG_ERR_FORMAT && strstr(msg, cases[k].want), "field at %zu: %s (%s), want \"%s\"", cases[k].at,
                  og_status_str(st), msg, cases[k].want);
    }
    /* truncated anywhere, or longer */
    const size_t cuts[] = {0, 4, 60, 127, 128, 129, e1 + 10, n / 2, n - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        og_status st = restore_bytes(valid, cuts[k], msg, sizeof msg);
        CHECK_MSG(st == OG_ERR_FORMAT && strstr(msg, "truncated"), "cut at %zu: %s (%s)", cuts[k], og_status_str(st),
                  msg);
    }
    memcpy(b, valid, n);
    memset(b + n, 0, 16);
    og_status st = restore_bytes(b, n + 16, msg, sizeof msg);
    CHECK_MSG(st == OG_ERR_FORMAT && strstr(msg, "trailing bytes"), "%s", msg);
    /* a flipped byte in each layer's rows names the layer */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        uint64_t off, bytes;
        memcpy(&off, valid + 128 + 64 * (size_t)i + 40, 8);
        memcpy(&bytes, valid + 128 + 64 * (size_t)i + 48, 8);
        memcpy(b, valid, n);
        b[off + bytes / 2] ^= 0x10;
        st = restore_bytes(b, n, msg, sizeof msg);
        char want[64];
        snprintf(want, sizeof want, "layer %d ", (int)i);
        CHECK_MSG(st == OG_ERR_FORMAT && strstr(msg, want) && strstr(msg, "checksum"), "layer %d: %s", (int)i, msg);
    }
    /* a session of another kv dtype */
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = cfg->kv_dtype == OG_DTYPE_BF16 ? OG_DTYPE_F32 : OG_DTYPE_BF16;
    og_session *other = NULL;
    CHECK_OK(og_session_create(g_model, &sp, &other));
    CHECK_STATUS(og_session_restore_into(other, path), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "kv_dtype") != NULL);
    og_session_destroy(other);
    /* not there */
    og_session *none = NULL;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.ogs", g_dir);
    CHECK_STATUS(og_session_restore(g_model, missing, &none), OG_ERR_IO);
    CHECK(none == NULL);
    remove(path);
    free(valid);
    free(b);
}

/* Writes b [n] to path. */
static void write_whole(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static void test_versions(void) {
    og_test_section("payload checks: XXH3 (version 2); version 1 files (hash.h checks) still restore");
    char path[256], v1path[256];
    snprintf(path, sizeof path, "%s/v2.ogs", g_dir);
    snprintf(v1path, sizeof v1path, "%s/v1.ogs", g_dir);
    og_session *s = fed_session(NULL, N_PROMPT);
    CHECK_OK(og_session_save(s, path));
    const int64_t V = g_vocab;
    float *want = malloc(sizeof(float) * (size_t)(V * N_NEXT)), *got = malloc(sizeof(float) * (size_t)(V * N_NEXT));
    CHECK_OK(next_logits(s, want));
    og_session_destroy(s);
    size_t n = 0;
    unsigned char *b = read_whole(path, &n);
    if (!b || !want || !got) {
        free(b), free(want), free(got);
        return;
    }
    uint32_t version, hbytes;
    int32_t n_layers;
    memcpy(&version, b + 8, 4);
    memcpy(&hbytes, b + 12, 4);
    memcpy(&n_layers, b + 36, 4);
    CHECK_MSG(version == 2, "a save writes version %u", version);
    /* every layer's check is XXH3-64 of its payload; the v1 file gets hash.h's */
    for (int32_t i = 0; i < n_layers; i++) {
        unsigned char *e = b + 128 + 64 * (size_t)i;
        uint64_t off, bytes, check;
        memcpy(&off, e + 40, 8);
        memcpy(&bytes, e + 48, 8);
        memcpy(&check, e + 56, 8);
        CHECK(off + bytes <= n);
        if (off + bytes > n) break;
        CHECK_MSG(check == (uint64_t)XXH3_64bits_withSeed(b + off, bytes, SAVE_SEED), "layer %d's check", (int)i);
        put64(e + 56, og_hash64(b + off, bytes, SAVE_SEED));
    }
    /* relabelled 1 without new checks: every layer fails; with them: restores */
    put32(b + 8, 1);
    put64(b + 72, 0);
    const uint64_t header_check = og_hash64(b, hbytes, SAVE_SEED);
    put64(b + 72, header_check);
    write_whole(v1path, b, n);
    og_session *r = NULL;
    CHECK_OK(og_session_restore(g_model, v1path, &r));
    if (r) {
        CHECK(og_session_length(r) == N_PROMPT);
        CHECK_OK(next_logits(r, got));
        CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)(V * N_NEXT)), "a version 1 file's next logits");
        og_session_destroy(r);
    }
    unsigned char *v2 = read_whole(path, &n);
    if (v2) {
        put32(v2 + 8, 1);
        put64(v2 + 72, 0);
        put64(v2 + 72, og_hash64(v2, hbytes, SAVE_SEED));
        write_whole(v1path, v2, n);
        r = NULL;
        CHECK_STATUS(og_session_restore(g_model, v1path, &r), OG_ERR_FORMAT);
        CHECK(r == NULL && strstr(og_last_error(), "layer 0 ") && strstr(og_last_error(), "checksum"));
        free(v2);
    }
    remove(path);
    remove(v1path);
    free(b);
    free(want);
    free(got);
}

/* Saves with OG_SAVE_THREADS=threads ("" unset) and returns the file's bytes. */
static unsigned char *save_with_threads(og_session *s, const char *path, const char *threads, size_t *n) {
    if (*threads) setenv("OG_SAVE_THREADS", threads, 1);
    else unsetenv("OG_SAVE_THREADS");
    CHECK_OK(og_session_save(s, path));
    unsetenv("OG_SAVE_THREADS");
    return read_whole(path, n);
}

static void test_threads_same_bytes(const og_kv_allocator *paged) {
    og_test_section("one thread or several: the same file, the same restore");
    char path[256];
    snprintf(path, sizeof path, "%s/threads.ogs", g_dir);
    for (int k = 0; k < (paged ? 2 : 1); k++) {
        og_session *s = fed_session(k ? paged : NULL, N_PROMPT);
        size_t n1 = 0, n4 = 0;
        unsigned char *one = save_with_threads(s, path, "1", &n1), *four = save_with_threads(s, path, "4", &n4);
        CHECK_MSG(one && four && n1 == n4 && !memcmp(one, four, n1), "%s storage: the files differ",
                  k ? "packed" : "dense");
        const int64_t V = g_vocab;
        float *want = malloc(sizeof(float) * (size_t)(V * N_NEXT)), *got = malloc(sizeof(float) * (size_t)(V * N_NEXT));
        CHECK_OK(next_logits(s, want));
        for (int t = 0; t < 2 && want && got; t++) {
            setenv("OG_SAVE_THREADS", t ? "4" : "1", 1);
            og_session *r = NULL;
            CHECK_OK(og_session_create(g_model, NULL, &r));
            if (r && k) { /* into packed storage too */
                og_session_destroy(r);
                r = NULL;
                og_session_params sp = og_session_default_params();
                sp.kv_allocator = paged;
                CHECK_OK(og_session_create(g_model, &sp, &r));
            }
            if (r) CHECK_OK(og_session_restore_into(r, path));
            unsetenv("OG_SAVE_THREADS");
            if (r) CHECK_OK(next_logits(r, got));
            CHECK_MSG(r && !memcmp(got, want, sizeof(float) * (size_t)(V * N_NEXT)), "restored with %s thread(s)",
                      t ? "4" : "1");
            og_session_destroy(r);
        }
        free(want);
        free(got);
        free(one);
        free(four);
        og_session_destroy(s);
    }
    remove(path);
}

static void test_other_program(const char *other_path) {
    og_test_section("a file of another program is refused");
    char path[256];
    snprintf(path, sizeof path, "%s/mine.ogs", g_dir);
    og_session *s = fed_session(NULL, 10);
    CHECK_OK(og_session_save(s, path));
    og_session_destroy(s);
    og_model *m = NULL;
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    CHECK_OK(og_model_load(other_path, &mp, &m));
    og_session *r = NULL;
    if (m) {
        CHECK_STATUS(og_session_restore(m, path, &r), OG_ERR_FORMAT);
        CHECK_MSG(strstr(og_last_error(), "another program") != NULL, "%s", og_last_error());
    }
    og_model_destroy(m);
    remove(path);
}

/* ------------------------------------------------------------ kill -9 */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Restores path and compares the next tokens' logits with want_old or
 * want_new (by length). Returns 1 when restore refused it. */
static int check_restorable(const char *path, int64_t n_old, const float *want_old, int64_t n_new,
                            const float *want_new, float *got, bool must_accept) {
    og_session *r = NULL;
    og_status st = og_session_restore(g_model, path, &r);
    if (st != OG_OK) {
        CHECK_MSG(!must_accept, "restore refused %s: %s", path, og_last_error());
        return 1;
    }
    const int64_t n = og_session_length(r);
    CHECK_MSG(n == n_old || n == n_new, "restored length %lld", (long long)n);
    CHECK_OK(next_n_logits(r, got, N_KILL_NEXT));
    CHECK_MSG(!memcmp(got, n == n_old ? want_old : want_new, sizeof(float) * N_KILL_NEXT * (size_t)g_vocab),
              "an accepted file (length %lld) gives other logits", (long long)n);
    og_session_destroy(r);
    return 0;
}

static void test_kill(void) {
    og_test_section("SIGKILL during saves never leaves a torn file that restore accepts");
    char path[256];
    snprintf(path, sizeof path, "%s/kill.ogs", g_dir);
    const size_t bytes = sizeof(float) * N_NEXT * (size_t)g_vocab;
    float *want_old = malloc(bytes), *want_new = malloc(bytes), *got = malloc(bytes);
    const int64_t n_old = 40, n_new = N_PROMPT;
    og_session *old_s = fed_session(NULL, n_old), *new_s = fed_session(NULL, n_new);
    CHECK_OK(og_session_save(old_s, path)); /* the path starts as a complete old save */
    double t0 = now_s();
    CHECK_OK(og_session_save(new_s, path));
    const double save_s = now_s() - t0;
    CHECK_OK(og_session_save(old_s, path));
    {
        og_session *a = fed_session(NULL, n_old), *b = fed_session(NULL, n_new);
        CHECK_OK(next_logits(a, want_old));
        CHECK_OK(next_logits(b, want_new));
        og_session_destroy(a);
        og_session_destroy(b);
    }
    og_rng r = og_rng_seed(99);
    int kills = 0, torn_temps = 0, complete_temps = 0, saw_new = 0;
    for (int it = 0; it < 40; it++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) og_session_save((it & 1) ? new_s : old_s, path);
        }
        CHECK(pid > 0);
        if (pid <= 0) break;
        /* half the kills land in the first 2% of a save (its writes; the
         * rest is mostly fsync), half anywhere in three saves */
        const double u = (double)(og_rng_next(&r) % 1000) / 1000.0;
        const double wait_s = (it & 2) ? save_s * 3 * u : save_s * 0.02 * u;
        struct timespec ts = {(time_t)wait_s, (long)((wait_s - (double)(time_t)wait_s) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        /* the path: always there, always complete */
        check_restorable(path, n_old, want_old, n_new, want_new, got, true);
        og_session *probe = NULL;
        if (og_session_restore(g_model, path, &probe) == OG_OK) saw_new += og_session_length(probe) == n_new;
        og_session_destroy(probe);
        /* leftover temp files: refused unless complete */
        DIR *d = opendir(g_dir);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (!strstr(e->d_name, "kill.ogs.tmp.")) continue;
            char tmp[600];
            snprintf(tmp, sizeof tmp, "%s/%s", g_dir, e->d_name);
            if (check_restorable(tmp, n_old, want_old, n_new, want_new, got, false)) torn_temps++;
            else complete_temps++;
            unlink(tmp);
        }
        if (d) closedir(d);
    }
    fprintf(stderr, "%d kills (a save takes %.2f ms): %d torn temp files refused, %d complete ones, the new save at "
                    "the path %d times\n",
            kills, save_s * 1e3, torn_temps, complete_temps, saw_new);
    CHECK(kills == 40);
    og_session_destroy(old_s);
    og_session_destroy(new_s);
    remove(path);
    free(want_old);
    free(want_new);
    free(got);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/og_test_save_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    char path[512], other[512], hf[512];
    snprintf(path, sizeof path, "%s/qwen3.ogp", g_dir);
    snprintf(other, sizeof other, "%s/llama.ogp", g_dir);
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 8; /* 70 tokens wrap the rings */
    snprintf(hf, sizeof hf, "%s/hf/qwen3-mixed", OG_TEST_DATA_DIR);
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    snprintf(hf, sizeof hf, "%s/hf/llama-gqa", OG_TEST_DATA_DIR);
    CHECK_OK(og_export_hf(hf, other, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    CHECK_OK(og_model_load(path, &mp, &g_model));
    if (g_model) {
        g_vocab = og_model_vocab_size(g_model);
        og_rng r = og_rng_seed(5);
        for (int t = 0; t < N_PROMPT; t++) g_prompt[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
        for (int t = 0; t < N_NEXT; t++) g_next[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
        og_kv_allocator paged;
        const bool have_paged = og_kv_allocator_paged(&paged) == OG_OK;
        test_roundtrip(NULL, NULL, "dense -> new session");
        if (have_paged) {
            test_roundtrip(NULL, &paged, "dense -> packed");
            test_roundtrip(&paged, NULL, "packed -> dense");
            test_roundtrip(&paged, &paged, "packed -> packed");
        }
        /* int8 and fp8 sessions: the scales travel inside the rows */
        const og_dtype quant[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
        for (int i = 0; i < 2; i++) {
            g_kv_dtype = quant[i];
            char name[64];
            snprintf(name, sizeof name, "%s, dense -> new session", og_dtype_name(quant[i]));
            test_roundtrip(NULL, NULL, name);
            if (have_paged) {
                snprintf(name, sizeof name, "%s, packed -> packed", og_dtype_name(quant[i]));
                test_roundtrip(&paged, &paged, name);
                snprintf(name, sizeof name, "%s, packed -> dense", og_dtype_name(quant[i]));
                test_roundtrip(&paged, NULL, name);
            }
        }
        g_kv_dtype = OG_DTYPE_COUNT;
        test_corruption();
        test_versions();
        test_threads_same_bytes(have_paged ? &paged : NULL);
        test_other_program(other);
        test_kill();
        og_model_destroy(g_model);
        if (have_paged) og_kv_allocator_paged_release(&paged);
    }
    remove(path);
    remove(other);
    rmdir(g_dir);
    return og_test_finish();
}
