/* What the sub-commands share: option values, files, the options of every
 * command that runs a model, exporting (offgraph export, and -m naming a
 * checkpoint: the export cache), and reading a command's options from its
 * help text (llama.cpp's names, "did you mean"). */
#include "cli.h"

#include "cache/hash.h"
#include "core/core.h"
#include "program/program.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

bool og_cli_int(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi) {
        fprintf(stderr, "offgraph %s: %s expects an integer in [%lld, %lld], got \"%s\"\n", cmd, flag,
                (long long)lo, (long long)hi, value);
        return false;
    }
    *out = v;
    return true;
}

const char *og_cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "offgraph %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

char *og_cli_read_stream(const char *cmd, FILE *f, const char *what, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
        const size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) break;
            buf[n] = 0;
            if (len) *len = n;
            return buf;
        }
    }
    fprintf(stderr, "offgraph %s: cannot read %s\n", cmd, what);
    free(buf);
    return NULL;
}

char *og_cli_read_file(const char *cmd, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "offgraph %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    char *buf = og_cli_read_stream(cmd, f, path, NULL);
    fclose(f);
    return buf;
}

bool og_cli_tokens(const char *cmd, const char *spec, int32_t **ids, int64_t *n) {
    char *text = spec[0] == '@' ? og_cli_read_file(cmd, spec + 1) : strdup(spec);
    if (!text) return false;
    int64_t cap = 64, count = 0;
    int32_t *out = malloc((size_t)cap * sizeof *out);
    const char *p = text;
    bool ok = out != NULL;
    while (ok) {
        while (*p && (isspace((unsigned char)*p) || *p == ',')) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && !isspace((unsigned char)*end) && *end != ',')) {
            fprintf(stderr, "offgraph %s: --tokens: \"%.20s\" (token %lld) is not a token id\n", cmd, p,
                    (long long)count);
            ok = false;
            break;
        }
        if (count == cap) {
            int32_t *no = realloc(out, (size_t)(cap *= 2) * sizeof *out);
            if (!no) { ok = false; break; }
            out = no;
        }
        out[count++] = (int32_t)v;
        p = end;
    }
    free(text);
    if (ok && count == 0) {
        fprintf(stderr, "offgraph %s: --tokens: no token ids in \"%s\"\n", cmd, spec);
        ok = false;
    }
    if (!ok) {
        free(out);
        return false;
    }
    *ids = out;
    *n = count;
    return true;
}

bool og_cli_write_file(const char *cmd, const char *path, const void *data, size_t bytes) {
    size_t n = strlen(path) + 5;
    char *tmp = malloc(n);
    if (!tmp) return false;
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(data, 1, bytes, f) == bytes;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "offgraph %s: cannot write %s: %s\n", cmd, path, strerror(errno));
        remove(tmp);
    }
    free(tmp);
    return ok;
}

bool og_cli_kv_dtype(const char *cmd, const char *value, og_dtype *out) {
    if (!strcmp(value, "bf16")) *out = OG_DTYPE_BF16;
    else if (!strcmp(value, "f32")) *out = OG_DTYPE_F32;
    else if (!strcmp(value, "int8")) *out = OG_DTYPE_INT8;
    else if (!strcmp(value, "fp8")) *out = OG_DTYPE_FP8;
    else {
        fprintf(stderr, "offgraph %s: --kv-dtype expects bf16, f32, int8 or fp8, got \"%s\"\n", cmd, value);
        return false;
    }
    return true;
}

bool og_cli_backend(const char *cmd, const char *value, og_backend *out) {
    if (!strcmp(value, "auto")) *out = OG_BACKEND_AUTO;
    else if (!strcmp(value, "cpu")) *out = OG_BACKEND_CPU;
    else if (!strcmp(value, "cuda")) *out = OG_BACKEND_CUDA;
    else {
        fprintf(stderr, "offgraph %s: --backend expects auto, cpu or cuda, got \"%s\"\n", cmd, value);
        return false;
    }
    return true;
}

/* ---- the options of every command that runs a model ---------------------- */

/* The options og_cli_load_model applies (og_cli_model_opts_default's). */
static const og_cli_model_opts *current_opts;

void og_cli_model_opts_default(og_cli_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = OG_BACKEND_AUTO;
    o->session = og_session_default_params();
    current_opts = o;
}

/* --devices 0,1 (llama.cpp's -dev CUDA0,CUDA1 too): CUDA device ordinals,
 * one a shard; og_model_load checks the count against -tp and repeats. */
static bool parse_devices(const char *cmd, const char *opt, const char *v, og_cli_model_opts *o) {
    o->n_devices = 0;
    for (const char *p = v;;) {
        if (!strncmp(p, "CUDA", 4)) p += 4;
        char *end = NULL;
        const long d = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (d < 0 || d > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "offgraph %s: %s expects CUDA device numbers separated by commas (0,1 or CUDA0,CUDA1), "
                            "got \"%s\"\n", cmd, opt, v);
            return false;
        }
        if (o->n_devices == OG_TENSOR_PARALLEL_MAX) {
            fprintf(stderr, "offgraph %s: %s \"%s\": at most %d devices (one a shard)\n", cmd, opt, v,
                    OG_TENSOR_PARALLEL_MAX);
            return false;
        }
        o->devices[o->n_devices++] = (int)d;
        if (!*end) return true;
        p = end + 1;
    }
}

int og_cli_model_option(const char *cmd, int argc, char **argv, int *i, og_cli_model_opts *o) {
    const char *a = argv[*i], *v;
    int64_t n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) return (o->model = og_cli_value(cmd, argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--kv-dtype"))
        return (v = og_cli_value(cmd, argc, argv, i)) && og_cli_kv_dtype(cmd, v, &o->session.kv_dtype) ? 1 : -1;
    if (!strcmp(a, "--backend"))
        return (v = og_cli_value(cmd, argc, argv, i)) && og_cli_backend(cmd, v, &o->backend) ? 1 : -1;
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        /* -1: llama.cpp's "as many as there are" */
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, -1, 1024, &n)) return -1;
        if (n == 0) {
            fprintf(stderr, "offgraph %s: %s 0: give a number of threads (-1 or leave it out: all)\n", cmd, a);
            return -1;
        }
        o->threads = n < 0 ? 0 : (int)n;
        return 1;
    }
    if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel") || !strcmp(a, "--tensor-parallel-size")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 1, OG_TENSOR_PARALLEL_MAX, &n)) return -1;
        o->tensor_parallel = (int)n;
        return 1;
    }
    if (!strcmp(a, "--devices")) /* llama.cpp's -dev / --device: tools/main.c's aliases */
        return (v = og_cli_value(cmd, argc, argv, i)) && parse_devices(cmd, a, v, o) ? 1 : -1;
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 0, INT32_MAX, &o->ctx)) return -1;
        return 1;
    }
    if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 1, INT32_MAX, &o->batch)) return -1;
        return 1;
    }
    if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers")) {
        if (!(v = og_cli_value(cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "auto")) o->backend = OG_BACKEND_AUTO;
        else if (!strcmp(v, "all")) o->backend = OG_BACKEND_CUDA;
        else if (og_cli_int(cmd, a, v, 0, INT32_MAX, &n)) o->backend = n == 0 ? OG_BACKEND_CPU : OG_BACKEND_CUDA;
        else return -1;
        return 1;
    }
    if (!strcmp(a, "-fa") || !strcmp(a, "--flash-attn")) {
        if (!(v = og_cli_value(cmd, argc, argv, i))) return -1;
        if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto")) {
            fprintf(stderr, "offgraph %s: %s expects on, off or auto, got \"%s\"\n", cmd, a, v);
            return -1;
        }
        if (!strcmp(v, "off"))
            fprintf(stderr, "offgraph %s: note: %s off has no effect: attention is always one fused kernel "
                            "(online softmax)\n", cmd, a);
        return 1;
    }
    if (!strcmp(a, "--weights")) {
        og_export_options eo;
        og_export_default_options(&eo);
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_weights(cmd, v, &eo)) return -1;
        o->weights = v;
        return 1;
    }
    return 0;
}

void og_cli_model_opts_usage(FILE *f) {
    fprintf(f, "  -m, --model <path>       a program file (from offgraph export), or a Hugging Face\n"
               "                           checkpoint folder or a GGUF file: exported once into the\n"
               "                           cache ($XDG_CACHE_HOME/offgraph, else ~/.cache/offgraph)\n"
               "                           and read from there by every later start\n"
               "  --weights <type>         with a checkpoint or GGUF -m: the matrices' type in that\n"
               "                           export, as offgraph export --weights (default: the\n"
               "                           checkpoint's; a GGUF file's as stored)\n"
               "  -c, --ctx-size <N>       most tokens a session holds, up to the program's\n"
               "                           max-context (0, default: that max-context); a checkpoint\n"
               "                           -m is exported to hold N when its default holds less\n"
               "  --kv-dtype <dtype>       KV storage: bf16, f32, int8 or fp8 (default: the program's)\n"
               "  --backend <cpu|cuda|auto> back end (default auto: cuda when a GPU is present)\n"
               "  -ngl, --n-gpu-layers <N> 0: --backend cpu; another number or all: --backend cuda\n"
               "                           (every layer: there is no partial offload); auto: auto\n"
               "  -t, --threads <N>        CPU threads (default, or -1: all)\n"
               "  -tp, --tensor-parallel <N>  cut the model into N shards (1 to 8; default 1):\n"
               "                           heads, MLP columns, experts' columns and vocabulary\n"
               "                           (docs/tensor-parallel.md); the cpu back end runs the\n"
               "                           shards in one process, cuda is not built yet\n"
               "  --devices <i,j,...>      the CUDA devices to run on, one a shard (default: the\n"
               "                           first, device 0); CUDA0,CUDA1 as llama.cpp writes them\n"
               "  -fa, --flash-attn <on|off|auto>  accepted; no effect: attention is always one\n"
               "                           fused kernel (online softmax)\n"
               "  -b, --batch-size <N>     most prompt tokens one step takes: serve's --step-rows,\n"
               "                           bench's --rows; no effect on run and chat (a prompt goes\n"
               "                           in steps of the program's max-write)\n");
}

void og_cli_devices(const og_cli_model_opts *o, og_model_params *mp) {
    mp->n_devices = o ? o->n_devices : 0;
    for (int i = 0; i < mp->n_devices; i++) mp->devices[i] = o->devices[i];
}

og_model *og_cli_load_model(const char *cmd, const char *path, og_backend backend, int threads) {
    const og_cli_model_opts *o = current_opts;
    char *file = og_cli_resolve_model(cmd, path, o ? o->weights : NULL, o ? o->ctx : 0);
    if (!file) return NULL;
    og_model_params mp = og_model_default_params();
    mp.backend = backend;
    mp.n_threads = threads;
    mp.tensor_parallel = o && o->tensor_parallel > 0 ? o->tensor_parallel : 1;
    og_cli_devices(o, &mp);
    og_model *m = NULL;
    og_status st = og_model_load(file, &mp, &m);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph %s: cannot load %s: %s (%s)%s\n", cmd, file, og_last_error(), og_status_str(st),
                st == OG_ERR_FORMAT && !strcmp(file, path)
                    ? "; -m takes a program file, a Hugging Face checkpoint folder or a GGUF file"
                    : "");
        free(file);
        return NULL;
    }
    if (o && o->ctx && og_model_set_context(m, o->ctx) != OG_OK) {
        const bool exported = strcmp(file, path) != 0;
        fprintf(stderr, "offgraph %s: -c %lld is more than the %lld tokens %s holds%s\n", cmd, (long long)o->ctx,
                (long long)og_model_kv_config(m)->max_capacity, path,
                exported ? " (its export's max-context: the checkpoint's max_position_embeddings, at most 32768); "
                           "for more, export it with offgraph export --max-context N (--force-max-context past the "
                           "positions the model was trained for) and give -m that file"
                         : " (its max-context); export the model again with a larger --max-context");
        og_model_destroy(m);
        m = NULL;
    }
    free(file);
    return m;
}

/* ---- exporting ----------------------------------------------------------- */

bool og_cli_is_gguf(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return false;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    bool yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes;
}

bool og_cli_is_checkpoint(const char *path) {
    struct stat sb;
    return (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || og_cli_is_gguf(path);
}

bool og_cli_weights(const char *cmd, const char *val, og_export_options *o) {
    char name[16] = "";
    for (size_t k = 0; val && val[k] && k + 1 < sizeof name; k++) name[k] = (char)tolower((unsigned char)val[k]);
    if (val && og_weight_mix_parse(name, &o->mix) == OG_OK) {
        o->weights = OG_DTYPE_COUNT;
        return true;
    }
    if (!val || strlen(val) >= sizeof name || og_dtype_parse(name, &o->weights) != OG_OK ||
        (o->weights != OG_DTYPE_Q8 && o->weights != OG_DTYPE_Q4 && o->weights != OG_DTYPE_BF16 &&
         o->weights != OG_DTYPE_F32 && o->weights != OG_DTYPE_Q3_K && o->weights != OG_DTYPE_Q4_K &&
         o->weights != OG_DTYPE_Q5_K)) {
        fprintf(stderr,
                "offgraph %s: --weights must be bf16, f32, q8, q4, q3_k, q4_k, q5_k or a k-quant mix "
                "(q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k), got \"%s\"\n",
                cmd, val ? val : "");
        return false;
    }
    o->mix = OG_MIX_NONE;
    return true;
}

typedef struct progress_state {
    double start;
    int last_pct;
    bool draw;       /* stderr is a terminal          */
    int stall_pct;   /* test hook: pause there; -1 never */
} progress_state;

/* The temp file of the export under way, removed when a signal ends it
 * (unlink is async-signal-safe); the signal then does what it would have. */
static char temp_path[PATH_MAX + 8];

static void on_fatal_signal(int sig) {
    if (temp_path[0]) unlink(temp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

static og_status draw_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_state *p = ctx;
    /* OFFGRAPH_TEST_EXPORT_STALL=<pct>: the tests' way to kill an export
     * while its temp file is being written, whatever the machine's speed */
    if (p->stall_pct >= 0 && total && done * 100 / total >= (uint64_t)p->stall_pct) {
        p->stall_pct = -1;
        for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    if (!p->draw) return OG_OK;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct == p->last_pct) return OG_OK;
    p->last_pct = pct;
    char bar[41];
    int fill = pct * 40 / 100;
    for (int i = 0; i < 40; i++) bar[i] = i < fill ? '#' : '.';
    bar[40] = '\0';
    fprintf(stderr, "\r[%s] %3d%%  %.1f / %.1f MB  %.1f s", bar, pct, done / 1e6, total / 1e6,
            og_time_now() - p->start);
    if (done >= total) fputc('\n', stderr);
    return OG_OK;
}

og_status og_cli_export(const char *in, const char *out, og_export_options *o, og_export_summary *s) {
    progress_state ps = {og_time_now(), -1, isatty(STDERR_FILENO), -1};
    const char *stall = getenv("OFFGRAPH_TEST_EXPORT_STALL");
    if (stall && *stall) ps.stall_pct = atoi(stall);
    if (ps.draw || ps.stall_pct >= 0) {
        o->progress = draw_progress;
        o->progress_ctx = &ps;
    }
    if (snprintf(temp_path, sizeof temp_path, "%s" OG_EXPORT_TEMP_SUFFIX, out) >= (int)sizeof temp_path)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "the output path %s is too long", out);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    /* a signal the shell has us ignore (a background job's SIGINT) stays ignored */
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction old[3];
    for (size_t k = 0; k < 3; k++) {
        sigaction(sigs[k], NULL, &old[k]);
        if (old[k].sa_handler != SIG_IGN) sigaction(sigs[k], &sa, NULL);
    }
    og_status rc = og_cli_is_gguf(in) ? og_export_gguf(in, out, o, s) : og_export_hf(in, out, o, s);
    for (size_t k = 0; k < 3; k++) sigaction(sigs[k], &old[k], NULL);
    temp_path[0] = 0;
    o->progress = NULL;
    o->progress_ctx = NULL;
    return rc;
}

/* ---- the export cache ---------------------------------------------------- */

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

/* Hashes what an export reads: the names, sizes and modification times of
 * the folder's files (a Hugging Face cache's snapshot links are followed
 * to their blobs) or of the one GGUF file. False after a message. */
static bool hash_source(const char *cmd, const char *real, bool dir, og_hash *h) {
    struct stat sb;
    if (!dir) {
        if (stat(real, &sb) != 0) {
            fprintf(stderr, "offgraph %s: %s: %s\n", cmd, real, strerror(errno));
            return false;
        }
        int64_t f[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
        og_hash_update(h, f, sizeof f);
        return true;
    }
    struct dirent **names = NULL;
    int n = scandir(real, &names, NULL, by_name);
    if (n < 0) {
        fprintf(stderr, "offgraph %s: cannot list %s: %s\n", cmd, real, strerror(errno));
        return false;
    }
    char file[PATH_MAX];
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' &&
            snprintf(file, sizeof file, "%s/%s", real, names[i]->d_name) < (int)sizeof file && stat(file, &sb) == 0 &&
            S_ISREG(sb.st_mode)) {
            int64_t f[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
            og_hash_update(h, names[i]->d_name, strlen(names[i]->d_name) + 1);
            og_hash_update(h, f, sizeof f);
        }
        free(names[i]);
    }
    free(names);
    return true;
}

/* mkdir -p; false after a message. */
static bool make_dirs(const char *cmd, const char *path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return false;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            const char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "offgraph %s: cannot make the cache folder %s: %s\n", cmd, p, strerror(errno));
                return false;
            }
            if (!(*s = c)) break;
        }
    }
    return true;
}

char *og_cli_resolve_model(const char *cmd, const char *path, const char *weights, int64_t ctx) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "offgraph %s: -m %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    const bool dir = S_ISDIR(sb.st_mode);
    if (!dir && !og_cli_is_gguf(path)) return strdup(path); /* a program (the loader checks it) */
    char real[PATH_MAX], cfg[PATH_MAX + 16];
    if (!realpath(path, real)) {
        fprintf(stderr, "offgraph %s: -m %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    snprintf(cfg, sizeof cfg, "%s/config.json", real);
    if (dir && access(cfg, R_OK) != 0) {
        fprintf(stderr, "offgraph %s: -m %s is a folder without a config.json: neither a program file nor a Hugging "
                        "Face checkpoint (config.json, *.safetensors, tokenizer.json)\n", cmd, path);
        return NULL;
    }
    og_export_options eo;
    og_export_default_options(&eo);
    if (weights && !og_cli_weights(cmd, weights, &eo)) return NULL;
    /* the export's default context is the config's, at most 32768: a longer
     * -c asks an export that holds it (refused past what the model was
     * trained for, as offgraph export refuses it) */
    eo.max_context = ctx > OG_EXPORT_DEFAULT_MAX_CONTEXT ? ctx : 0;
    eo.check_max_context = true;

    og_hash h;
    og_hash_init(&h, 0x6f66666772617068ull);
    const int32_t tag[4] = {1, OG_VERSION_MAJOR, OG_VERSION_MINOR, OG_PROGRAM_FORMAT_VERSION};
    og_hash_update(&h, tag, sizeof tag);
    og_hash_update(&h, real, strlen(real) + 1);
    if (!hash_source(cmd, real, dir, &h)) return NULL;
    const int64_t opt[3] = {(int64_t)eo.weights, (int64_t)eo.mix, eo.max_context};
    og_hash_update(&h, opt, sizeof opt);

    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char folder[PATH_MAX];
    int w = xdg && xdg[0] == '/' ? snprintf(folder, sizeof folder, "%s/offgraph", xdg)
            : home && *home      ? snprintf(folder, sizeof folder, "%s/.cache/offgraph", home)
                                 : -1;
    if (w < 0 || w >= (int)sizeof folder) {
        fprintf(stderr, "offgraph %s: no cache folder for the export of %s: set XDG_CACHE_HOME or HOME, or export it "
                        "(offgraph export %s -o <file>) and give -m that file\n", cmd, path, path);
        return NULL;
    }
    if (!make_dirs(cmd, folder)) return NULL;
    /* the name: the source's, then the key */
    const char *base = strrchr(real, '/');
    base = base && base[1] ? base + 1 : "model";
    char name[80];
    size_t k = 0;
    for (; base[k] && k < 48; k++)
        name[k] = isalnum((unsigned char)base[k]) || base[k] == '-' || base[k] == '_' || base[k] == '.' ? base[k] : '_';
    name[k] = 0;
    if (k > 5 && !strcmp(name + k - 5, ".gguf")) name[k - 5] = 0;
    char *out = malloc(PATH_MAX);
    if (!out) return NULL;
    if (snprintf(out, PATH_MAX, "%s/%s-%016llx.ogp", folder, name, (unsigned long long)og_hash_final(&h)) >= PATH_MAX) {
        fprintf(stderr, "offgraph %s: the cache path is too long\n", cmd);
        free(out);
        return NULL;
    }
    if (access(out, R_OK) == 0) return out;
    /* one export at a time in the cache: another process exporting the same
     * source is waited for, and its program read */
    int lock = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "offgraph %s: waiting for another offgraph exporting into %s\n", cmd, folder);
        flock(lock, LOCK_EX);
    }
    bool ok = true;
    if (access(out, R_OK) != 0) {
        fprintf(stderr, "offgraph %s: exporting %s into the cache, once: %s\n", cmd, path, out);
        const double t0 = og_time_now();
        og_export_summary sum;
        if (og_cli_export(real, out, &eo, &sum) != OG_OK) {
            fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
            ok = false;
        } else {
            fprintf(stderr, "offgraph %s: exported in %.1f s (%.1f MB of weights, max-context %lld); later starts "
                            "read the cache\n",
                    cmd, og_time_now() - t0, sum.weight_bytes / 1e6, (long long)sum.max_context);
        }
    }
    if (lock >= 0) close(lock); /* releases the lock */
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- options from help texts, and suggestions ------------------------------ */

/* Adds an option (once); value: whether it takes one. */
static int add_opt(og_cli_opt *opts, int n, int cap, const char *name, size_t len, bool value) {
    if (len == 0 || len >= sizeof opts[0].name) return n;
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) return n;
    if (n == cap) return n;
    memcpy(opts[n].name, name, len);
    opts[n].name[len] = 0;
    opts[n].value = value;
    return n + 1;
}

static bool is_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

int og_cli_parse_help(const char *help, og_cli_opt *opts, int cap) {
    int n = 0;
    n = add_opt(opts, n, cap, "-h", 2, false);
    n = add_opt(opts, n, cap, "--help", 6, false);
    bool in_usage = false;
    for (const char *line = help; line && *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        const char *p = line;
        int indent = 0;
        while (p < end && *p == ' ') p++, indent++;
        if (!strncmp(p, "usage:", 6)) in_usage = true;
        else if (p == end) in_usage = false;
        if (in_usage) {
            /* "[--stop S]...", "(-p <prompt> | -f <file>)", "[--stats]" */
            for (const char *q = p; q < end;) {
                while (q < end && (*q == ' ' || *q == '[' || *q == '(' || *q == '|')) q++;
                const char *t = q;
                while (q < end && *q != ' ' && *q != ']' && *q != ')') q++;
                if (t[0] != '-' || q - t < 2 || !is_name_char(t[1])) {
                    while (q < end && (*q == ']' || *q == ')' || *q == '.')) q++;
                    continue;
                }
                const char *r = q;
                while (r < end && *r == ' ') r++;
                /* a value follows inside the same bracket: "<x>", "N", "-" */
                const bool value = q < end && *q == ' ' && r < end && *r != '[' && *r != '(' && *r != '|' &&
                                   (*r != '-' || r[1] == ' ' || r[1] == ']' || r[1] == ')');
                n = add_opt(opts, n, cap, t, (size_t)(q - t), value);
            }
        } else if (indent >= 1 && indent <= 4 && p + 1 < end && p[0] == '-' && is_name_char(p[1])) {
            /* "  -m, --model <file>       text" / "  --stats      text" */
            const char *names[4];
            size_t lens[4];
            int k = 0;
            const char *q = p;
            for (;;) {
                const char *t = q;
                while (q < end && *q != ' ' && *q != ',') q++;
                if (k < 4) names[k] = t, lens[k++] = (size_t)(q - t);
                if (q + 2 < end && q[0] == ',' && q[1] == ' ' && q[2] == '-') {
                    q += 2;
                    continue;
                }
                break;
            }
            const bool value = q + 1 < end && q[0] == ' ' && q[1] != ' ';
            for (int j = 0; j < k; j++) n = add_opt(opts, n, cap, names[j], lens[j], value);
        }
        line = *end ? end + 1 : end;
    }
    return n;
}

/* Edit distance (insertions, deletions, substitutions, swaps of neighbours). */
static int distance(const char *a, const char *b) {
    const size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

const char *og_cli_suggest(const char *typed, const char *const *cands, int n) {
    const char *best = NULL;
    int best_d = 99;
    const size_t lt = strlen(typed);
    for (int i = 0; i < n; i++) {
        int d = distance(typed, cands[i]);
        /* a beginning of a long name ("--max-tok") is near it */
        if (lt >= 4 && !strncmp(cands[i], typed, lt)) d = 1;
        if (d < best_d) best_d = d, best = cands[i];
    }
    /* near: a third of the letters typed (at least 1, at most 3) */
    int near = (int)(lt / 3);
    if (near < 1) near = 1;
    if (near > 3) near = 3;
    return best_d <= near ? best : NULL;
}
