/* offgraph perplexity: how well a model predicts a text, scored as
 * llama.cpp's llama-perplexity scores it, so that formats (weights, KV
 * storage) can be compared on the same text. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"
#include "request.h"
#include "core/textfile.h"

#include "kernels/ops.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: offgraph perplexity [-m <program>] (-f <text file> | --tokens <ids|@file>) [options]\n\n"
            "Cuts the tokens into chunks of --ctx tokens; each chunk runs in a fresh session, and the\n"
            "second half of it is scored (each scored token then has at least ctx/2 tokens before it):\n"
            "the negative log-likelihood the model gives the next token, averaged over every scored\n"
            "token of every chunk; perplexity is its exponential. Prints the running perplexity\n"
            "after each chunk on stderr and the result on stdout (with its standard error), as\n"
            "llama.cpp's llama-perplexity does. The text is encoded without special tokens.\n\n"
            "  -f, --file <path>        the text to score\n"
            "  --tokens <ids|@file>     token ids instead of a text (no tokenizer needed)\n"
            "  --ctx <N>                tokens per chunk (default 512, at most the model's context)\n"
            "  --chunks <N>             score at most N chunks (default: all the text holds)\n"
            "  --json                   one line of JSON on stdout instead of the sentence\n"
            "  --top1 <file>            write the most likely next token of every scored position\n"
            "                           (one id a line), to compare formats' top-1 agreement\n"
            "  -m, --model <file>       program file (default: the demo model the build exports)\n");
    og_cli_model_opts_usage(f);
}

/* -log p(target) from one row of logits, in double. */
static double nll(const float *row, int64_t V, int32_t target) {
    double mx = row[0];
    for (int64_t v = 1; v < V; v++)
        if (row[v] > mx) mx = row[v];
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
    return log(sum) + mx - (double)row[target];
}

/* Encodes the text file with the model's tokenizer, no special tokens;
 * *ids as og_cli_tokens gives them (free). */
static bool encode_file(const og_model *m, const char *path, int32_t **ids, int64_t *n) {
    char *text = NULL;
    size_t len = 0;
    og_tokenizer *t = NULL;
    int32_t *got = NULL; /* the library's memory: og_free */
    bool ok = false;
    if (og_read_text_file(path, &text, &len) != OG_OK || og_tokenizer_from_model(m, &t) != OG_OK) {
        fprintf(stderr, "offgraph perplexity: %s\n", og_last_error());
    } else if (og_tokenize(t, text, len, 0, &got, n) != OG_OK) {
        fprintf(stderr, "offgraph perplexity: %s: %s\n", path, og_last_error());
    } else if (*n && !(*ids = malloc((size_t)*n * sizeof **ids))) {
        fprintf(stderr, "offgraph perplexity: no memory for %lld tokens\n", (long long)*n);
    } else {
        if (*n) memcpy(*ids, got, (size_t)*n * sizeof **ids);
        ok = true;
    }
    og_free(got);
    og_tokenizer_destroy(t);
    og_free(text);
    return ok;
}

int og_cmd_perplexity(int argc, char **argv) {
    const char *file = NULL, *tokens = NULL, *top1_path = NULL;
    FILE *top1 = NULL;
    int64_t ctx = 512, max_chunks = INT32_MAX, hits = 0;
    bool json = false;
    og_cli_model_opts mo;
    og_cli_model_opts_default(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = og_cli_model_option("perplexity", argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = og_cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tokens = og_cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = og_cli_value("perplexity", argc, argv, &i)) || !og_cli_int("perplexity", a, v, 4, INT32_MAX, &ctx))
                return 2;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = og_cli_value("perplexity", argc, argv, &i)) ||
                !og_cli_int("perplexity", a, v, 1, INT32_MAX, &max_chunks))
                return 2;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--top1")) {
            if (!(top1_path = og_cli_value("perplexity", argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "offgraph perplexity: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!file == !tokens) {
        fprintf(stderr, "offgraph perplexity: give one of -f and --tokens\n");
        usage(stderr);
        return 2;
    }
    const char *path = mo.model ? mo.model : og_default_model_path;
    if (!path) {
        fprintf(stderr, "offgraph perplexity: no -m given and no default model\n");
        return 2;
    }
    int rc = 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    og_session *s = NULL;
    float *logits = NULL;
    og_model *m = og_cli_load_model("perplexity", path, mo.backend, mo.threads);
    if (!m) goto done;
    if (tokens ? !og_cli_tokens("perplexity", tokens, &ids, &n) : !encode_file(m, file, &ids, &n)) goto done;
    const int64_t V = og_model_vocab_size(m), limit = og_model_kv_config(m)->max_capacity;
    if (ctx > limit) {
        fprintf(stderr, "offgraph perplexity: --ctx %lld is past the model's context of %lld tokens\n",
                (long long)ctx, (long long)limit);
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "offgraph perplexity: token %lld is %d, outside the vocabulary of %lld\n", (long long)i,
                    ids[i], (long long)V);
            goto done;
        }
    int64_t chunks = n / ctx;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) {
        fprintf(stderr, "offgraph perplexity: %lld tokens are fewer than one chunk of --ctx %lld\n", (long long)n,
                (long long)ctx);
        goto done;
    }
    const int64_t first = ctx / 2, rows = ctx - first;
    logits = malloc((size_t)rows * (size_t)V * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "offgraph perplexity: no memory for %lld x %lld logits\n", (long long)rows, (long long)V);
        goto done;
    }
    if (og_session_create(m, &mo.session, &s) != OG_OK) {
        fprintf(stderr, "offgraph perplexity: %s\n", og_last_error());
        goto done;
    }
    if (top1_path && !(top1 = fopen(top1_path, "w"))) {
        fprintf(stderr, "offgraph perplexity: cannot write %s: %s\n", top1_path, strerror(errno));
        goto done;
    }
    double sum = 0, sum2 = 0, t0 = og_time_now();
    int64_t scored = 0;
    for (int64_t c = 0; c < chunks; c++) {
        const int32_t *chunk = ids + c * ctx;
        og_session_reset(s);
        /* the first half only builds the context; the second gives its logits */
        og_status st = og_session_eval(s, chunk, first, 0, NULL, 0);
        if (st == OG_OK) st = og_session_eval(s, chunk + first, rows, 0, logits, 1);
        if (st != OG_OK) {
            fprintf(stderr, "offgraph perplexity: chunk %lld: %s (%s)\n", (long long)c + 1, og_session_last_error(s),
                    og_status_str(st));
            goto done;
        }
        /* row j is position first + j and predicts the token after it */
        for (int64_t j = 0; j + 1 < rows; j++) {
            const float *row = logits + (size_t)j * (size_t)V;
            const double x = nll(row, V, chunk[first + j + 1]);
            int64_t best = 0;
            og_argmax_cpu(row, V, &best);
            hits += best == chunk[first + j + 1];
            if (top1) fprintf(top1, "%lld\n", (long long)best);
            sum += x;
            sum2 += x * x;
            scored++;
        }
        fprintf(stderr, "[%lld]%.4f%s", (long long)c + 1, exp(sum / (double)scored), c + 1 < chunks ? " " : "\n");
    }
    const double mean = sum / (double)scored, ppl = exp(mean);
    const double var = scored > 1 ? (sum2 / (double)scored - mean * mean) * (double)scored / (double)(scored - 1) : 0;
    const double err = ppl * sqrt(var > 0 ? var / (double)scored : 0);
    const double dt = og_time_now() - t0;
    if (json)
        printf("{\"perplexity\": %.6f, \"stderr\": %.6f, \"mean_nll\": %.8f, \"scored_tokens\": %lld, \"chunks\": %lld, "
               "\"ctx\": %lld, \"tokens\": %lld, \"tokens_per_s\": %.1f, \"top1_accuracy\": %.6f}\n",
               ppl, err, mean, (long long)scored, (long long)chunks, (long long)ctx, (long long)n,
               (double)(chunks * ctx) / dt, (double)hits / (double)scored);
    else
        printf("perplexity %.4f +/- %.4f over %lld scored tokens (%lld chunks of %lld tokens, the last %lld of each "
               "scored)\n",
               ppl, err, (long long)scored, (long long)chunks, (long long)ctx, (long long)(rows - 1));
    rc = 0;
    if (top1 && fclose(top1) != 0) {
        fprintf(stderr, "offgraph perplexity: writing %s failed\n", top1_path);
        rc = 1;
    }
    top1 = NULL;
done:
    if (top1) fclose(top1);
    og_session_destroy(s);
    og_model_destroy(m);
    free(logits);
    free(ids);
    return rc;
}
