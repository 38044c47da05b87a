/* offgraph run: generates text from a prompt, streaming it as it comes: one
 * request of the library's engine (og_engine). */
#include "commands.h"
#include "core/core.h"
#include "request.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP_STRINGS 16

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph run [-m <program>] (-p <prompt> | -p - | -f <file>) [-n N] [--stop S]...\n"
               "                    [--grammar F | --json-schema F] [sampling options] [--stats]\n"
               "                    [--show-prompt-ids]\n\n"
               "Continues the prompt (as plain text: no chat template; the special tokens the\n"
               "tokenizer adds, such as BOS, are added unless --no-special, as `offgraph tokenize`\n"
               "and /v1/completions add them) and prints the generated text as it is produced,\n"
               "stopping at N tokens, at the model's end-of-sequence or end-of-turn token, at a\n"
               "--stop string or at the model's context limit (-n 0: generate until it).\n\n"
               "  -p, --prompt <text>      the prompt; - reads it from standard input\n"
               "  -f, --file <file>        read the prompt from a file (as it is, newline included)\n"
               "  --stop <string>          end before this text (never printed); repeatable, up to %d\n"
               "  --stats                  end with one line of JSON on standard error: token counts,\n"
               "                           speeds, KV bytes, finish reason (stop or length)\n"
               "  --show-prompt-ids        first print the token ids the prompt is fed as, one line\n"
               "                           of JSON on standard error ({\"prompt_ids\": [...]})\n",
            MAX_STOP_STRINGS);
    og_gen_options_usage(f);
}

/* All of f (a prompt read from a file or standard input); NULL after a
 * message. */
static char *read_stream(FILE *f, const char *what) {
    size_t len = 0;
    char *buf = og_cli_read_stream("run", f, what, &len);
    if (buf && strlen(buf) != len) {
        fprintf(stderr, "offgraph run: %s holds a NUL byte: not a text prompt\n", what);
        free(buf);
        return NULL;
    }
    return buf;
}

int og_cmd_run(int argc, char **argv) {
    og_gen_options o;
    og_gen_default_options(&o);
    const char *prompt_arg = NULL, *file = NULL;
    const char *stops[MAX_STOP_STRINGS];
    int32_t n_stops = 0;
    bool stats = false, show_ids = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = og_gen_parse_option("run", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(v = og_cli_value("run", argc, argv, &i))) return 2;
            prompt_arg = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(v = og_cli_value("run", argc, argv, &i))) return 2;
            file = v;
        } else if (!strcmp(a, "--stop")) {
            if (!(v = og_cli_value("run", argc, argv, &i))) return 2;
            if (n_stops == MAX_STOP_STRINGS) {
                fprintf(stderr, "offgraph run: more than %d --stop strings\n", MAX_STOP_STRINGS);
                return 2;
            }
            if (*v) stops[n_stops++] = v;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else if (!strcmp(a, "--show-prompt-ids")) {
            show_ids = true;
        } else {
            fprintf(stderr, "offgraph run: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prompt_arg == !file) {
        fprintf(stderr, "offgraph run: %s\n",
                file ? "-p and -f both give the prompt: use one" : "a prompt is required: -p <text>, -p - or -f <file>");
        usage(stderr);
        return 2;
    }
    char *prompt = NULL;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "offgraph run: cannot open %s: %s\n", file, strerror(errno));
            return 1;
        }
        prompt = read_stream(f, file);
        fclose(f);
    } else if (!strcmp(prompt_arg, "-")) {
        prompt = read_stream(stdin, "standard input");
    } else {
        prompt = strdup(prompt_arg);
    }
    if (!prompt) return 1;
    og_gen g;
    int rc = 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    og_request *req = NULL;
    if (!og_gen_load("run", &o, &g)) goto done;
    /* the prompt's ids by the library's rule (og_tokenize: what the engine
     * does to a text prompt), so that --show-prompt-ids shows what is fed */
    if (!og_gen_encode("run", &g, prompt, true, &ids, &n)) goto done;
    if (show_ids) {
        fputs("{\"prompt_ids\": [", stderr);
        for (int64_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", (int)ids[i]);
        fputs("]}\n", stderr);
        fflush(stderr);
    }
    if (n == 0) {
        fprintf(stderr, "offgraph run: the prompt is empty (it gives no tokens)\n");
        goto done;
    }
    if (!og_gen_prompt_fits("run", &g, n)) goto done;
    if (!og_gen_start_engine("run", &o, &g, 0)) goto done;
    og_request_params rp = og_gen_request_params(&o);
    rp.kind = OG_PROMPT_TOKENS;
    rp.tokens = ids;
    rp.n_tokens = n;
    rp.stop = stops;
    rp.n_stop = n_stops;
    og_gen_constrain(&g, &rp);
    if (og_engine_submit(g.engine, &rp, &req) != OG_OK) {
        fprintf(stderr, "offgraph run: %s\n", og_last_error());
        goto done;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    og_gen_reply reply;
    if (!og_gen_stream("run", req, stdout, NULL, false, &reply)) goto done;
    const og_request_output res = reply.last;
    if (g.matcher && og_matcher_error(g.matcher))
        fprintf(stderr, "offgraph run: warning: the grammar: %s\n", og_matcher_error(g.matcher));
    if (g.matcher && res.finish == OG_FINISH_LENGTH)
        fprintf(stderr, "offgraph run: the output reached its token limit before the grammar's end: it is "
                        "incomplete (a larger -n lets it finish)\n");
    putchar('\n');
    fflush(stdout);
    /* the last token drawn is never fed: a prompt of n tokens ends at most
     * max_ctx - n + 1 tokens later */
    const bool context_full = res.finish == OG_FINISH_LENGTH && res.prompt_tokens + res.completion_tokens > g.max_ctx;
    if (context_full)
        fprintf(stderr, "offgraph run: stopped at the model's context limit (%lld tokens)\n", (long long)g.max_ctx);
    if (stats) {
        const double prefill_s = res.t_first_token - res.t_submit, decode_s = res.t_last_token - res.t_first_token;
        const int64_t decoded = res.completion_tokens > 1 ? res.completion_tokens - 1 : 0;
        fprintf(stderr,
                "{\"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"prefill_tokens_per_s\": %.2f, "
                "\"decode_tokens_per_s\": %.2f, \"kv_bytes_allocated\": %lld, \"kv_bytes_live\": %lld, "
                "\"growth_events\": %lld, \"context_limit\": %lld, \"finish_reason\": \"%s\"}\n",
                (long long)res.prompt_tokens, (long long)res.completion_tokens,
                res.t_first_token > 0 ? (double)res.prompt_tokens / (prefill_s > 0 ? prefill_s : 1e-9) : 0.0,
                decoded ? (double)decoded / (decode_s > 0 ? decode_s : 1e-9) : 0.0,
                (long long)res.kv.bytes_allocated, (long long)res.kv.bytes_live, (long long)res.kv.growth_count,
                (long long)g.max_ctx, res.finish == OG_FINISH_STOP ? "stop" : "length");
    }
    rc = 0;
done:
    og_request_destroy(req);
    og_gen_close(&g);
    og_free(ids);
    free(prompt);
    return rc;
}
