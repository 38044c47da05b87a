/* offgraph chat: a conversation in one session. Each user turn prefills
 * only its own tokens; the earlier turns and replies stay in the KV cache. */
#include "commands.h"
#include "core/core.h"
#include "generate.h"
#include "model/chat_template.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph chat [-m <program>] [-n N] [sampling options]\n\n"
               "Reads one user message a line from standard input and prints the model's reply,\n"
               "with the chat template of the model (ChatML, Llama-3, Mistral; otherwise plain\n"
               "text). Commands: /reset forgets the conversation, /stats prints one line of JSON\n"
               "about the last turn and the session, /save <file> writes the conversation's KV cache\n"
               "to a file (crash-safe), /load <file> goes on from a saved conversation of the same\n"
               "model, /quit (or Ctrl-D) ends. -n limits one reply.\n\n");
    og_gen_options_usage(f);
}

typedef struct turn_stats {
    int64_t turn, prefill_tokens, generated_tokens;
    double prefill_s, decode_s;
} turn_stats;

static void print_stats(og_gen *g, const turn_stats *t) {
    og_kv_metrics km;
    if (og_session_metrics(g->session, &km) != OG_OK) {
        fprintf(stderr, "offgraph chat: %s\n", og_last_error());
        return;
    }
    printf("{\"turn\": %lld, \"prefill_tokens\": %lld, \"generated_tokens\": %lld, \"session_length\": %lld, "
           "\"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, \"kv_bytes_allocated\": %lld, "
           "\"kv_bytes_live\": %lld, \"growth_events\": %lld}\n",
           (long long)t->turn, (long long)t->prefill_tokens, (long long)t->generated_tokens,
           (long long)og_session_length(g->session), t->prefill_s > 0 ? (double)t->prefill_tokens / t->prefill_s : 0.0,
           t->decode_s > 0 ? (double)t->generated_tokens / t->decode_s : 0.0, (long long)km.bytes_allocated,
           (long long)km.bytes_live, (long long)km.growth_count);
    fflush(stdout);
}

int og_cmd_chat(int argc, char **argv) {
    og_gen_options o;
    og_gen_default_options(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = og_gen_parse_option("chat", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "offgraph chat: unknown option \"%s\"\n", a);
        usage(stderr);
        return 2;
    }
    og_gen g;
    if (!og_gen_open("chat", &o, &g)) {
        og_gen_close(&g);
        return 1;
    }
    og_chat_format fmt = og_chat_format_detect(og_tokenizer_chat_template(g.tok));
    if (fmt == OG_CHAT_PLAIN)
        fprintf(stderr, "offgraph chat: warning: %s; turns are plain text\n",
                og_tokenizer_chat_template(g.tok) ? "the model's chat template is not one offgraph knows"
                                                  : "the model has no chat template");
    og_gen_add_stop(&g, og_chat_end_of_turn(fmt) ? og_tokenizer_token_id(g.tok, og_chat_end_of_turn(fmt)) : -1);
    const bool interactive = isatty(STDIN_FILENO);
    turn_stats last = {0};
    bool first = true;
    int rc = 0;
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (interactive) fputs("> ", stderr);
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) { /* end of input: Ctrl-D */
            if (interactive) fputc('\n', stderr);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/stats")) {
            print_stats(&g, &last);
            continue;
        }
        if (!strncmp(line, "/save ", 6) || !strncmp(line, "/load ", 6)) {
            const char *file = line + 6;
            while (*file == ' ') file++;
            og_session *loaded = NULL;
            og_status st = line[1] == 's' ? og_session_save(g.session, file) : og_session_restore(g.model, file, &loaded);
            if (st != OG_OK) {
                fprintf(stderr, "offgraph chat: %s\n", og_last_error());
                continue;
            }
            if (loaded) { /* the saved conversation replaces this one */
                og_session_destroy(g.session);
                g.session = loaded;
                og_sampler_reset(g.sampler);
                first = og_session_length(loaded) == 0;
                last = (turn_stats){0};
            }
            fprintf(stderr, "offgraph chat: %s %s (%lld tokens)\n", line[1] == 's' ? "saved to" : "loaded", file,
                    (long long)og_session_length(g.session));
            continue;
        }
        if (!strcmp(line, "/reset")) {
            og_session_reset(g.session);
            og_sampler_reset(g.sampler);
            first = true;
            last = (turn_stats){0};
            continue;
        }
        if (!len) continue;
        char *text = NULL;
        int32_t *ids = NULL;
        int64_t n = 0;
        if (og_chat_render_turn(fmt, first, line, &text) != OG_OK ||
            og_tokenizer_encode(g.tok, text, strlen(text), &ids, &n) != OG_OK) {
            fprintf(stderr, "offgraph chat: %s\n", og_last_error());
            og_free(text);
            rc = 1;
            break;
        }
        double t0 = og_time_now();
        bool ok = og_gen_prefill("chat", &g, ids, n, o.max_tokens > 0);
        double t1 = og_time_now();
        int64_t generated = 0;
        ok = ok && og_gen_decode("chat", &g, o.max_tokens, true, stdout, &generated);
        double t2 = og_time_now();
        putchar('\n');
        fflush(stdout);
        og_free(text);
        og_free(ids);
        if (!ok) {
            rc = 1;
            break;
        }
        last = (turn_stats){last.turn + 1, n, generated, t1 - t0, t2 - t1};
        first = false;
    }
    free(line);
    og_gen_close(&g);
    return rc;
}
