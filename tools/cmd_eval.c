/* offgraph eval: the logits of every input position, for parity checks. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: offgraph eval -m <program> --tokens <ids|@file> --logits-out <file> [options]\n\n"
            "Runs the token ids through one session and writes the float32 little-endian\n"
            "logits of every input position, row after row (T x vocab).\n\n"
            "  --tokens <ids|@file>     token ids, separated by commas or whitespace, inline or in a file\n"
            "  --logits-out <file>      where to write the logits\n"
            "  --chunk <N>              feed N tokens per step (default: all at once; steps never\n"
            "                           exceed the program's max_write)\n");
    og_cli_model_opts_usage(f);
}

int og_cmd_eval(int argc, char **argv) {
    const char *tokens = NULL, *out = NULL;
    int64_t chunk = 0;
    og_cli_model_opts mo;
    og_cli_model_opts_default(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = og_cli_model_option("eval", argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tokens = og_cli_value("eval", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--logits-out")) {
            if (!(out = og_cli_value("eval", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = og_cli_value("eval", argc, argv, &i)) || !og_cli_int("eval", a, v, 1, INT32_MAX, &chunk)) return 2;
        } else {
            fprintf(stderr, "offgraph eval: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!mo.model || !tokens || !out) {
        fprintf(stderr, "offgraph eval: -m, --tokens and --logits-out are required\n");
        usage(stderr);
        return 2;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!og_cli_tokens("eval", tokens, &ids, &n)) return 2;
    int rc = 1;
    og_session *s = NULL;
    float *logits = NULL;
    og_model *m = og_cli_load_model("eval", mo.model, mo.backend, mo.threads);
    if (!m) goto done;
    const int64_t V = og_model_vocab_size(m);
    logits = malloc((size_t)(n * V) * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "offgraph eval: no memory for %lld x %lld logits\n", (long long)n, (long long)V);
        goto done;
    }
    og_status st = og_session_create(m, &mo.session, &s);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph eval: %s\n", og_last_error());
        goto done;
    }
    double t0 = og_time_now();
    st = og_session_eval(s, ids, n, (int32_t)chunk, logits, 1);
    double dt = og_time_now() - t0;
    if (st != OG_OK) {
        fprintf(stderr, "offgraph eval: %s (%s)\n", og_session_last_error(s), og_status_str(st));
        goto done;
    }
    if (!og_cli_write_file("eval", out, logits, (size_t)(n * V) * sizeof *logits)) goto done;
    fprintf(stderr, "offgraph eval: %lld tokens, %.1f tokens/s, logits %lld x %lld -> %s\n", (long long)n,
            (double)n / dt, (long long)n, (long long)V, out);
    rc = 0;
done:
    og_session_destroy(s);
    og_model_destroy(m);
    free(logits);
    free(ids);
    return rc;
}
