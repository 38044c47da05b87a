/* offgraph run: generates text from a prompt, streaming it as it comes. */
#include "commands.h"
#include "core/core.h"
#include "generate.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph run [-m <program>] -p <prompt> [-n N] [sampling options] [--stats]\n\n"
               "Continues the prompt (as plain text: no chat template, no special tokens added)\n"
               "and prints the generated text as it is produced, stopping at N tokens or at the\n"
               "model's end-of-sequence token.\n\n"
               "  -p, --prompt <text>      the prompt\n"
               "  --stats                  end with one line of JSON: token counts, speeds, KV bytes\n");
    og_gen_options_usage(f);
}

int og_cmd_run(int argc, char **argv) {
    og_gen_options o;
    og_gen_default_options(&o);
    const char *prompt = NULL;
    bool stats = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = og_gen_parse_option("run", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "offgraph run: %s needs a value\n", a);
                return 2;
            }
            prompt = argv[++i];
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else {
            fprintf(stderr, "offgraph run: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "offgraph run: -p <prompt> is required\n");
        usage(stderr);
        return 2;
    }
    og_gen g;
    int rc = 1;
    int32_t *ids = NULL;
    int64_t n = 0, generated = 0;
    if (!og_gen_open("run", &o, &g)) goto done;
    if (og_tokenizer_encode(g.tok, prompt, strlen(prompt), &ids, &n) != OG_OK) {
        fprintf(stderr, "offgraph run: %s\n", og_last_error());
        goto done;
    }
    if (n == 0) {
        fprintf(stderr, "offgraph run: the prompt is empty (it gives no tokens)\n");
        goto done;
    }
    double t0 = og_time_now();
    if (!og_gen_prefill("run", &g, ids, n, o.max_tokens > 0)) goto done;
    double t1 = og_time_now();
    fwrite(prompt, 1, strlen(prompt), stdout);
    if (!og_gen_decode("run", &g, o.max_tokens, false, stdout, &generated)) goto done;
    double t2 = og_time_now();
    putchar('\n');
    if (stats) {
        og_kv_metrics km;
        if (og_session_metrics(g.session, &km) != OG_OK) {
            fprintf(stderr, "offgraph run: %s\n", og_last_error());
            goto done;
        }
        printf("{\"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"prefill_tokens_per_s\": %.2f, "
               "\"decode_tokens_per_s\": %.2f, \"kv_bytes_allocated\": %lld, \"kv_bytes_live\": %lld, "
               "\"growth_events\": %lld}\n",
               (long long)n, (long long)generated, (double)n / (t1 - t0 > 0 ? t1 - t0 : 1e-9),
               generated ? (double)generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, (long long)km.bytes_allocated,
               (long long)km.bytes_live, (long long)km.growth_count);
    }
    rc = 0;
done:
    og_gen_close(&g);
    og_free(ids);
    return rc;
}
