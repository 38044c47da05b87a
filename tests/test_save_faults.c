/* A session save that runs out of room fails alone, under load: while two
 * threads decode sessions of the same model (each token checked against a
 * run of its own on one thread), the main thread decodes a session and saves
 * it again and again, every other save onto a file system that is "full"
 * past a size the save needs: RLIMIT_FSIZE below the new file's size (a
 * write past it fails with EFBIG, SIGXFSZ ignored), which stands in for a
 * full disk without privileges. 100 failed saves: each is OG_ERR_IO naming
 * the write, leaves the previous save's file byte for byte and no temp file
 * in the folder, and leaves the session as it was (its next tokens are the
 * reference's); each save between them restores to a session that gives the
 * same next tokens; the other threads' tokens never differ from their
 * references. The demo model (the build's kjv-tiny.ogp); skipped without
 * it. */
#include "harness.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

enum { FAULTS = 100, STEP = 8, REF_TOKENS = 900, PROMPT = 12 };

static og_model *g_model;
static int32_t g_ref[3][REF_TOKENS + 1]; /* greedy tokens after each prompt, one thread */
static atomic_int g_stop, g_wrong, g_load_tokens;

static void prompt_of(int k, int32_t *p) {
    for (int i = 0; i < PROMPT; i++) p[i] = 40 + 97 * k + 13 * i;
}

/* Feeds the prompt of k and decodes n tokens into out. */
static og_status decode(og_session *s, int k, int n, int32_t *out) {
    int32_t p[PROMPT], tok = 0;
    prompt_of(k, p);
    og_session_reset(s);
    og_status st = og_session_eval_next(s, p, PROMPT, 0, &tok);
    for (int i = 0; i < n && st == OG_OK; i++) {
        out[i] = tok;
        st = og_session_eval_next(s, &tok, 1, 0, &tok);
    }
    return st;
}

static void *load_main(void *arg) {
    const int k = (int)(intptr_t)arg;
    og_session *s = NULL;
    if (og_session_create(g_model, NULL, &s) != OG_OK) {
        atomic_fetch_add(&g_wrong, 1);
        return NULL;
    }
    int32_t p[PROMPT], tok = 0;
    prompt_of(k, p);
    while (!atomic_load(&g_stop)) {
        og_session_reset(s);
        og_status st = og_session_eval_next(s, p, PROMPT, 0, &tok);
        for (int i = 0; i < REF_TOKENS && st == OG_OK && !atomic_load(&g_stop); i++) {
            if (tok != g_ref[k][i]) {
                atomic_fetch_add(&g_wrong, 1);
                break;
            }
            st = og_session_eval_next(s, &tok, 1, 0, &tok);
            atomic_fetch_add(&g_load_tokens, 1);
        }
        if (st != OG_OK) atomic_fetch_add(&g_wrong, 1);
    }
    og_session_destroy(s);
    return NULL;
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(size > 0 ? (size_t)size : 1);
    *n = b && size > 0 ? fread(b, 1, (size_t)size, f) : 0;
    fclose(f);
    return b;
}

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void set_fsize(rlim_t limit) {
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = limit;
    setrlimit(RLIMIT_FSIZE, &rl);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/kjv-tiny.ogp", OG_BINARY_DIR);
    if (access(path, R_OK) != 0) {
        printf("no %s (built by the demo_program target): skipped\n", path);
        return 77;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_max != RLIM_INFINITY) {
        printf("RLIMIT_FSIZE has a hard limit here: skipped\n");
        return 77;
    }
    signal(SIGXFSZ, SIG_IGN);
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    CHECK_OK(og_model_load(path, &mp, &g_model));
    if (!g_model) return og_test_finish();

    og_test_section("references, one thread");
    og_session *s = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &s));
    for (int k = 0; k < 3; k++) CHECK_OK(decode(s, k, REF_TOKENS + 1, g_ref[k]));

    og_test_section("100 saves onto a full file system under load: each fails alone");
    char dir[] = "/tmp/og_save_faults_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char file[600];
    snprintf(file, sizeof file, "%s/session.ogs", dir);
    pthread_t load[2];
    for (int k = 1; k <= 2; k++) pthread_create(&load[k - 1], NULL, load_main, (void *)(intptr_t)k);

    int32_t p[PROMPT], tok = 0;
    prompt_of(0, p);
    og_session_reset(s);
    CHECK_OK(og_session_eval_next(s, p, PROMPT, 0, &tok));
    int pos = 0, good_pos = -1; /* tokens fed after the prompt (tok is g_ref[0][pos]); at the last good save */
    unsigned char *good = NULL;
    size_t good_n = 0;
    int faults = 0, saves = 0, wrong_io = 0, changed = 0, temp_left = 0, diverged = 0, restore_wrong = 0;
    unsigned seed = 12345;
    while (faults < FAULTS) {
        /* decode STEP more tokens (from the start again near the context's end) */
        if (pos + STEP >= REF_TOKENS) {
            og_session_reset(s);
            CHECK_OK(og_session_eval_next(s, p, PROMPT, 0, &tok));
            pos = 0;
            good_pos = 2 * REF_TOKENS; /* shorter now: the next save succeeds */
        }
        for (int i = 0; i < STEP; i++, pos++) {
            if (tok != g_ref[0][pos]) diverged++;
            CHECK_OK(og_session_eval_next(s, &tok, 1, 0, &tok));
        }
        if (!good || pos <= good_pos || (saves + faults) % 2 == 0) { /* a save that succeeds */
            set_fsize(RLIM_INFINITY);
            CHECK_OK(og_session_save(s, file));
            saves++;
            free(good);
            good = read_all(file, &good_n);
            good_pos = pos;
            og_session *r = NULL;
            int32_t next = 0;
            if (og_session_restore(g_model, file, &r) == OG_OK && og_session_eval_next(r, &tok, 1, 0, &next) == OG_OK) {
                if (next != g_ref[0][pos + 1]) restore_wrong++;
            } else {
                restore_wrong++;
            }
            og_session_destroy(r);
            continue;
        }
        /* the file system is full past a size below what this save needs
           (the session has grown since the last save) */
        seed = seed * 1103515245u + 12345u;
        const rlim_t limit = (rlim_t)(good_n / 4 + (seed >> 8) % (good_n / 2));
        set_fsize(limit);
        og_status st = og_session_save(s, file);
        set_fsize(RLIM_INFINITY);
        faults++;
        if (st != OG_ERR_IO || !strstr(og_last_error(), "og_session_save")) wrong_io++;
        size_t now_n = 0;
        unsigned char *now = read_all(file, &now_n);
        if (!now || now_n != good_n || memcmp(now, good, good_n) != 0) changed++;
        free(now);
        if (entries(dir) != 1) temp_left++;
    }
    atomic_store(&g_stop, 1);
    for (int k = 0; k < 2; k++) pthread_join(load[k], NULL);
    /* the session goes on as if no save had failed */
    for (int i = 0; i < STEP && pos < REF_TOKENS; i++, pos++) {
        if (tok != g_ref[0][pos]) diverged++;
        CHECK_OK(og_session_eval_next(s, &tok, 1, 0, &tok));
    }
    printf("%d saves failed (file system full), %d succeeded, while two threads decoded %d tokens\n", faults, saves,
           atomic_load(&g_load_tokens));
    CHECK_MSG(wrong_io == 0, "%d failed saves were not OG_ERR_IO", wrong_io);
    CHECK_MSG(changed == 0, "%d failed saves changed the previous file", changed);
    CHECK_MSG(temp_left == 0, "%d failed saves left a temp file", temp_left);
    CHECK_MSG(diverged == 0, "the saved session's tokens differed from the reference %d times", diverged);
    CHECK_MSG(restore_wrong == 0, "%d good saves did not restore to the session's next token", restore_wrong);
    CHECK_MSG(atomic_load(&g_wrong) == 0, "the other threads' tokens differed from their references %d times",
              atomic_load(&g_wrong));
    CHECK_MSG(atomic_load(&g_load_tokens) > 0, "the other threads decoded nothing");
    unlink(file);
    rmdir(dir);
    free(good);
    og_session_destroy(s);
    og_model_destroy(g_model);
    return og_test_finish();
}
