/* Forks and saved sessions on the CUDA back end (a Qwen3-shaped program with
 * sliding-window layers):
 *   - a child forked at the full length and at the ring floor, decoding 32
 *     tokens interleaved with its parent decoding 32 others: each gives
 *     what an unforked CUDA session fed the same steps gives (same kernels
 *     on the same rows: equal logits), so neither sees the other's rows;
 *   - a long session (more rows than one VMM granule) forks by mapping the
 *     parent's chunks (bytes_shared > 0) and the child still agrees; the
 *     parent destroyed first leaves the child's rows intact;
 *   - save -> restore on the device -> the next 32 tokens' logits equal the
 *     saved session's own continuation; a file saved on the CPU back end
 *     restores on CUDA (same program) and agrees within the CPU/GPU
 *     tolerance of test_exec_cuda;
 *   - the same fork and save checks over int8 and fp8 sessions (the scales
 *     travel inside the rows). A CPU save restored on CUDA agrees within
 *     5e-2 there: the two back ends' k and v differ in the last bits (as
 *     for bf16), and where that moves a value across a rounding boundary
 *     the stored element moves by a whole quantization step (int8 1/127 of
 *     the head's amax, e4m3 up to 1/16 of the value) instead of bf16's 1/256.
 * Data under $OG_SOURCE_DIR when set, else where the build saw them.
 * Skipped (77) without a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/ops_cuda.h"
#include "import/export.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_NEXT 32

static int64_t g_vocab;
/* KV storage of the sessions the checks create: OG_DTYPE_COUNT, the program's */
static og_dtype g_kv_dtype = OG_DTYPE_COUNT;

static og_session *create(og_model *m) {
    og_session_params sp = og_session_default_params();
    sp.kv_dtype = g_kv_dtype;
    og_session *s = NULL;
    CHECK_OK(og_session_create(m, &sp, &s));
    return s;
}

static og_model *load(const char *path, og_backend b) {
    og_model_params mp = og_model_default_params();
    mp.backend = b;
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, &mp, &m));
    return m;
}

/* Feeds prompt [n] in steps of max_write (no logits). */
static og_session *fed(og_model *m, const int32_t *prompt, int64_t n) {
    og_session *s = create(m);
    if (s && n) CHECK_OK(og_session_eval(s, prompt, n, 0, NULL, 0));
    return s;
}

static void decode(og_session *s, const int32_t *t, int n, float *out) {
    for (int i = 0; i < n; i++) CHECK_OK(og_session_eval(s, &t[i], 1, 0, out + (int64_t)i * g_vocab, 0));
}

static void check_fork(og_model *m, const int32_t *prompt, int64_t n, const int32_t *x, const int32_t *y,
                       bool expect_shared) {
    const size_t bytes = sizeof(float) * N_NEXT * (size_t)g_vocab;
    float *cx = malloc(bytes), *py = malloc(bytes), *fx = malloc(bytes), *fy = malloc(bytes);
    og_session *p = fed(m, prompt, n);
    const int64_t floor = og_kv_session_fork_floor(og_session_kv(p));
    const int64_t points[2] = {n, floor};
    for (int k = 0; k < 2; k++) {
        const int64_t a = points[k];
        char what[96];
        snprintf(what, sizeof what, "cuda fork at %lld of %lld (kv %s)", (long long)a, (long long)n,
                 g_kv_dtype == OG_DTYPE_COUNT ? "of the program" : og_dtype_name(g_kv_dtype));
        og_test_section(what);
        og_session *c = NULL, *q = NULL;
        CHECK_OK(og_session_fork(p, a, &c));
        CHECK_OK(og_session_fork(p, n, &q));
        if (!c || !q) break;
        og_kv_metrics km;
        og_session_metrics(c, &km);
        if (expect_shared) CHECK_MSG(km.bytes_shared > 0, "%s: nothing shared", what);
        for (int t = 0; t < N_NEXT; t++) {
            CHECK_OK(og_session_eval(c, &x[t], 1, 0, cx + (int64_t)t * g_vocab, 0));
            CHECK_OK(og_session_eval(q, &y[t], 1, 0, py + (int64_t)t * g_vocab, 0));
        }
        og_session *fa = create(m);
        const int32_t mw = og_model_kv_config(m)->max_write;
        for (int64_t done = 0; done < a;) {
            const int64_t T = a - done < mw ? a - done : mw;
            CHECK_OK(og_session_eval(fa, prompt + done, T, 0, NULL, 0));
            done += T;
        }
        decode(fa, x, N_NEXT, fx);
        og_session *fp = fed(m, prompt, n);
        decode(fp, y, N_NEXT, fy);
        CHECK_MSG(og_tol_ratio(cx, fx, N_NEXT * (size_t)g_vocab, 1e-4, 1e-4, NULL) <= 1, "%s: the child differs", what);
        CHECK_MSG(og_tol_ratio(py, fy, N_NEXT * (size_t)g_vocab, 1e-4, 1e-4, NULL) <= 1, "%s: the parent differs", what);
        og_session_destroy(fa);
        og_session_destroy(fp);
        og_session_destroy(q);
        og_session_destroy(c);
    }
    /* the parent goes first; a fork of it lives on */
    og_session *c = NULL;
    CHECK_OK(og_session_fork(p, n, &c));
    og_session_destroy(p);
    if (c) {
        decode(c, x, N_NEXT, cx);
        og_session *f = fed(m, prompt, n);
        decode(f, x, N_NEXT, fx);
        CHECK_MSG(og_tol_ratio(cx, fx, N_NEXT * (size_t)g_vocab, 1e-4, 1e-4, NULL) <= 1,
                  "a fork outliving its parent differs");
        og_session_destroy(f);
    }
    og_session_destroy(c);
    free(cx);
    free(py);
    free(fx);
    free(fy);
}

static void check_save(og_model *gpu, og_model *cpu, const int32_t *prompt, int64_t n, const int32_t *x,
                       const char *dir) {
    char what[128];
    snprintf(what, sizeof what, "cuda save -> restore -> 32 tokens; a CPU save restored on CUDA (kv %s)",
             g_kv_dtype == OG_DTYPE_COUNT ? "of the program" : og_dtype_name(g_kv_dtype));
    og_test_section(what);
    const double tol = g_kv_dtype == OG_DTYPE_INT8 || g_kv_dtype == OG_DTYPE_FP8 ? 5e-2 : 2e-2; /* see the top */
    char path[512];
    snprintf(path, sizeof path, "%s/s.ogs", dir);
    const size_t bytes = sizeof(float) * N_NEXT * (size_t)g_vocab;
    float *want = malloc(bytes), *got = malloc(bytes);
    og_session *s = fed(gpu, prompt, n), *r = NULL;
    CHECK_OK(og_session_save(s, path));
    CHECK_OK(og_session_restore(gpu, path, &r));
    if (r) {
        CHECK(og_session_length(r) == n);
        decode(s, x, N_NEXT, want);
        decode(r, x, N_NEXT, got);
        CHECK_MSG(og_tol_ratio(got, want, N_NEXT * (size_t)g_vocab, 1e-4, 1e-4, NULL) <= 1,
                  "logits after a device restore differ");
    }
    og_session_destroy(r);
    og_session_destroy(s);
    /* a CPU save restored on the device */
    og_session *cs = fed(cpu, prompt, n);
    CHECK_OK(og_session_save(cs, path));
    r = NULL;
    CHECK_OK(og_session_restore(gpu, path, &r));
    if (r) {
        decode(cs, x, N_NEXT, want);
        decode(r, x, N_NEXT, got);
        CHECK_MSG(og_tol_ratio(got, want, N_NEXT * (size_t)g_vocab, tol, tol, NULL) <= 1,
                  "a CPU save restored on CUDA differs beyond the CPU/GPU tolerance");
    }
    og_session_destroy(r);
    og_session_destroy(cs);
    remove(path);
    free(want);
    free(got);
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    const char *src = getenv("OG_SOURCE_DIR") ? getenv("OG_SOURCE_DIR") : OG_SOURCE_DIR;
    char dir[] = "/tmp/og_test_fork_cuda_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[512], hf[512];
    snprintf(path, sizeof path, "%s/qwen3.ogp", dir);
    snprintf(hf, sizeof hf, "%s/tests/data/hf/qwen3-mixed", src);
    og_export_options o;
    og_export_default_options(&o);
    o.max_write = 64;
    o.max_context = 32768;
    CHECK_OK(og_export_hf(hf, path, &o, NULL));
    og_model *gpu = load(path, OG_BACKEND_CUDA), *cpu = load(path, OG_BACKEND_CPU);
    if (gpu && cpu) {
        g_vocab = og_model_vocab_size(gpu);
        enum { LONG = 20000 };
        int32_t *prompt = malloc(sizeof(int32_t) * LONG), x[N_NEXT], y[N_NEXT];
        og_rng r = og_rng_seed(21);
        for (int t = 0; t < LONG; t++) prompt[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
        for (int t = 0; t < N_NEXT; t++) {
            x[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
            y[t] = (int32_t)(og_rng_next(&r) % (uint64_t)g_vocab);
        }
        check_fork(gpu, prompt, 70, x, y, false);
        /* more rows than a 2 MiB granule: whole chunks are mapped */
        check_fork(gpu, prompt, LONG, x, y, true);
        check_save(gpu, cpu, prompt, 300, x, dir);
        const og_dtype quant[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
        for (int i = 0; i < 2; i++) {
            g_kv_dtype = quant[i];
            check_fork(gpu, prompt, 70, x, y, false);
            check_save(gpu, cpu, prompt, 300, x, dir);
        }
        g_kv_dtype = OG_DTYPE_COUNT;
        free(prompt);
    }
    og_model_destroy(gpu);
    og_model_destroy(cpu);
    remove(path);
    rmdir(dir);
    return og_test_finish();
}
#endif
