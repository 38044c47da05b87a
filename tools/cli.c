#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

void og_cli_model_opts_default(og_cli_model_opts *o) {
    o->model = NULL;
    o->backend = OG_BACKEND_AUTO;
    o->threads = 0;
    o->session = og_session_default_params();
}

int og_cli_model_option(const char *cmd, int argc, char **argv, int *i, og_cli_model_opts *o) {
    const char *a = argv[*i], *v;
    int64_t n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) return (o->model = og_cli_value(cmd, argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--kv-dtype"))
        return (v = og_cli_value(cmd, argc, argv, i)) && og_cli_kv_dtype(cmd, v, &o->session.kv_dtype) ? 1 : -1;
    if (!strcmp(a, "--backend"))
        return (v = og_cli_value(cmd, argc, argv, i)) && og_cli_backend(cmd, v, &o->backend) ? 1 : -1;
    if (!strcmp(a, "--threads")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 1, 1024, &n)) return -1;
        o->threads = (int)n;
        return 1;
    }
    return 0;
}

void og_cli_model_opts_usage(FILE *f) {
    fprintf(f, "  -m, --model <file>       program file (from offgraph export)\n"
               "  --kv-dtype <dtype>       KV storage: bf16, f32, int8 or fp8 (default: the program's)\n"
               "  --backend <cpu|cuda|auto> back end (default auto: cuda when a GPU is present)\n"
               "  --threads <N>            CPU threads (default: all)\n");
}

og_model *og_cli_load_model(const char *cmd, const char *path, og_backend backend, int threads) {
    og_model_params mp = og_model_default_params();
    mp.backend = backend;
    mp.n_threads = threads;
    og_model *m = NULL;
    og_status st = og_model_load(path, &mp, &m);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph %s: cannot load %s: %s (%s)\n", cmd, path, og_last_error(), og_status_str(st));
        return NULL;
    }
    return m;
}
