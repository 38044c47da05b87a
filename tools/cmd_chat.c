/* offgraph chat: a conversation in one session. Each user turn prefills
 * only its own tokens; the earlier turns and replies stay in the KV cache.
 * When the conversation reaches the model's context limit it stops there
 * (--context-policy stop) or drops its oldest turns, keeping the system
 * prompt, and reads what is left again (drop). */
#include "commands.h"
#include "core/core.h"
#include "generate.h"
#include "model/chat_template.h"

#include <errno.h>
#include <histedit.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph chat [-m <program>] [--system <text>] [--context-policy stop|drop] [-n N]\n"
               "                     [sampling options]\n\n"
               "Reads user messages from standard input (with line editing and history on a\n"
               "terminal; a line ending in \\ goes on on the next line) and prints the model's\n"
               "replies, with the chat template of the model (ChatML, Llama-3, Mistral; otherwise\n"
               "plain text). Ctrl-C stops a reply; Ctrl-C twice at the prompt (or Ctrl-D) ends.\n"
               "Type /help for the commands. -n limits one reply.\n\n"
               "  --system <text>          the system prompt\n"
               "  --context-policy P       at the model's context limit: stop (default) refuses\n"
               "                           further turns until /reset; drop forgets the oldest\n"
               "                           turns (never the system prompt) and reads the rest again\n");
    og_gen_options_usage(f);
}

static void commands_help(FILE *f) {
    fputs("commands:\n"
          "  /help             this list\n"
          "  /system <text>    set the system prompt (without text: none) and start over\n"
          "  /reset            forget the conversation (the system prompt stays)\n"
          "  /stats            one line of JSON about the last turn and the session\n"
          "  /save <file>      write the conversation's KV cache to a file (crash-safe)\n"
          "  /load <file>      go on from a saved conversation of the same model\n"
          "  /quit, /exit      end (so does Ctrl-D)\n"
          "a line ending in \\ goes on on the next line; //text sends \"/text\" to the model\n",
          f);
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
           "\"context_limit\": %lld, \"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, "
           "\"kv_bytes_allocated\": %lld, \"kv_bytes_live\": %lld, \"growth_events\": %lld}\n",
           (long long)t->turn, (long long)t->prefill_tokens, (long long)t->generated_tokens,
           (long long)og_session_length(g->session), (long long)g->max_ctx,
           t->prefill_s > 0 ? (double)t->prefill_tokens / t->prefill_s : 0.0,
           t->decode_s > 0 ? (double)t->generated_tokens / t->decode_s : 0.0, (long long)km.bytes_allocated,
           (long long)km.bytes_live, (long long)km.growth_count);
    fflush(stdout);
}

/* ---- Ctrl-C ---------------------------------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* ---- input: libedit on a terminal, plain lines otherwise ------------------- */

typedef enum { IN_LINE, IN_EOF, IN_INTERRUPT } input_kind;

typedef struct input {
    EditLine *el; /* NULL when stdin is not a terminal */
    History *hist;
    char *line;   /* the last line, without its newline */
    size_t cap;
} input;

static const char *current_prompt = "> ";
static char *prompt_fn(EditLine *el) {
    (void)el;
    return (char *)current_prompt;
}

/* libedit's character reader, but one that a Ctrl-C always ends: it waits
 * for input 100 ms at a time and looks at the flag in between, so that a
 * signal that lands before the read starts (while the prompt is drawn) is
 * not lost. Returns 1 with a character, 0 at end of input, -1 (errno EINTR)
 * on Ctrl-C. */
static int read_char(EditLine *el, wchar_t *wc) {
    (void)el;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    for (;;) {
        if (interrupted) {
            errno = EINTR;
            return -1;
        }
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        char ch;
        ssize_t k = read(STDIN_FILENO, &ch, 1);
        if (k == 0) return 0;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -1;
        }
        size_t m = mbrtowc(wc, &ch, 1, &st);
        if (m == (size_t)-2) continue; /* more bytes of one character */
        if (m == (size_t)-1) {          /* not a character here: the byte as it is */
            memset(&st, 0, sizeof st);
            *wc = (wchar_t)(unsigned char)ch;
        }
        return 1;
    }
}

static void input_open(input *in, const char *prog) {
    memset(in, 0, sizeof *in);
    if (!isatty(STDIN_FILENO)) return;
    setlocale(LC_CTYPE, ""); /* UTF-8 input where the terminal's locale says so */
    in->el = el_init(prog, stdin, stderr, stderr);
    in->hist = history_init();
    if (!in->el || !in->hist) {
        if (in->el) el_end(in->el);
        if (in->hist) history_end(in->hist);
        in->el = NULL;
        in->hist = NULL;
        return;
    }
    HistEvent ev;
    history(in->hist, &ev, H_SETSIZE, 1000);
    history(in->hist, &ev, H_SETUNIQUE, 1);
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_PROMPT, prompt_fn);
    el_set(in->el, EL_HIST, history, in->hist);
    el_set(in->el, EL_GETCFN, read_char);
    el_source(in->el, NULL); /* ~/.editrc, as other libedit programs */
}

static void input_close(input *in) {
    if (in->el) el_end(in->el);
    if (in->hist) history_end(in->hist);
    free(in->line);
}

static bool set_line(input *in, const char *s, size_t n) {
    if (n + 1 > in->cap) {
        char *p = realloc(in->line, n + 1);
        if (!p) return false;
        in->line = p;
        in->cap = n + 1;
    }
    memcpy(in->line, s, n);
    in->line[n] = 0;
    return true;
}

/* One line of input. */
static input_kind input_read(input *in, const char *prompt) {
    size_t n;
    if (in->el) {
        current_prompt = prompt;
        int count = 0;
        errno = 0;
        const char *s = el_gets(in->el, &count);
        if (!s || count <= 0) {
            if (interrupted || errno == EINTR) {
                interrupted = 0; /* this Ctrl-C is used up; the next one counts anew */
                el_reset(in->el);
                fputc('\n', stderr);
                return IN_INTERRUPT;
            }
            fputc('\n', stderr);
            return IN_EOF;
        }
        n = (size_t)count;
        if (!set_line(in, s, n)) return IN_EOF;
    } else {
        errno = 0;
        ssize_t len = getline(&in->line, &in->cap, stdin);
        if (len < 0) {
            if (errno == EINTR && interrupted) {
                interrupted = 0;
                clearerr(stdin);
                return IN_INTERRUPT;
            }
            return IN_EOF;
        }
        n = (size_t)len;
    }
    while (n > 0 && (in->line[n - 1] == '\n' || in->line[n - 1] == '\r')) in->line[--n] = 0;
    return IN_LINE;
}

/* One message: lines ending in a backslash go on on the next line. */
static input_kind read_message(input *in, char **msg) {
    size_t len = 0;
    *msg = NULL;
    for (const char *prompt = "> ";; prompt = "... ") {
        input_kind k = input_read(in, prompt);
        if (k != IN_LINE) {
            free(*msg);
            *msg = NULL;
            return k;
        }
        size_t n = strlen(in->line);
        bool more = n > 0 && in->line[n - 1] == '\\';
        if (more) n--;
        char *p = realloc(*msg, len + n + 2);
        if (!p) {
            free(*msg);
            *msg = NULL;
            return IN_EOF;
        }
        *msg = p;
        memcpy(*msg + len, in->line, n);
        len += n;
        if (more) (*msg)[len++] = '\n';
        (*msg)[len] = 0;
        if (!more) break;
    }
    if (in->el && len) {
        HistEvent ev;
        history(in->hist, &ev, H_ENTER, *msg);
    }
    return IN_LINE;
}

/* ---- the conversation, as text, for re-reading after a drop ----------------- */

typedef struct chat_turn {
    char *user, *reply;
} chat_turn;

typedef struct conversation {
    og_chat_format fmt;
    char *system;      /* NULL: none */
    chat_turn *turns;  /* what the session holds, oldest first */
    int32_t n, cap;
} conversation;

static void conv_clear(conversation *c) {
    for (int32_t i = 0; i < c->n; i++) {
        free(c->turns[i].user);
        og_free(c->turns[i].reply);
    }
    c->n = 0;
}

static void conv_drop(conversation *c, int32_t k) {
    for (int32_t i = 0; i < k; i++) {
        free(c->turns[i].user);
        og_free(c->turns[i].reply);
    }
    memmove(c->turns, c->turns + k, (size_t)(c->n - k) * sizeof *c->turns);
    c->n -= k;
}

/* Appends s to a growing string; false when out of memory. */
static bool cat(char **out, size_t *len, const char *s) {
    size_t n = strlen(s);
    char *p = realloc(*out, *len + n + 1);
    if (!p) return false;
    memcpy(p + *len, s, n + 1);
    *out = p;
    *len += n;
    return true;
}

/* The text of a user turn: with first, the start of the conversation and
 * the system prompt. Owned by the caller: free. */
static char *render_user(const conversation *c, bool first, const char *user) {
    char *t = NULL, *out = NULL;
    size_t len = 0;
    const char *sys = first ? c->system : NULL;
    bool ok = true;
    if (sys && c->fmt == OG_CHAT_MISTRAL) { /* Mistral's template puts it before the first message */
        size_t n = strlen(sys) + strlen(user) + 3;
        char *u = malloc(n);
        if (!u) return NULL;
        snprintf(u, n, "%s\n\n%s", sys, user);
        ok = og_chat_render_turn(c->fmt, 1, u, &t) == OG_OK;
        free(u);
        sys = NULL;
    } else
        ok = og_chat_render_turn(c->fmt, first, user, &t) == OG_OK;
    if (!ok) return NULL;
    const char *rest = t;
    if (sys) {
        switch (c->fmt) {
        case OG_CHAT_CHATML:
            ok = cat(&out, &len, "<|im_start|>system\n") && cat(&out, &len, sys) && cat(&out, &len, "<|im_end|>\n");
            break;
        case OG_CHAT_LLAMA3: {
            const char *bot = "<|begin_of_text|>";
            if (!strncmp(rest, bot, strlen(bot))) rest += strlen(bot);
            ok = cat(&out, &len, bot) && cat(&out, &len, "<|start_header_id|>system<|end_header_id|>\n\n") &&
                 cat(&out, &len, sys) && cat(&out, &len, "<|eot_id|>");
            break;
        }
        default:
            ok = cat(&out, &len, sys) && cat(&out, &len, "\n");
            break;
        }
    }
    ok = ok && cat(&out, &len, rest);
    og_free(t);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

/* The whole conversation from turn `from` on, then the new user message. */
static char *render_from(const conversation *c, int32_t from, const char *user) {
    char *out = NULL;
    size_t len = 0;
    for (int32_t i = from; i <= c->n; i++) {
        char *u = render_user(c, i == from, i < c->n ? c->turns[i].user : user);
        bool ok = u && cat(&out, &len, u) && (i == c->n || cat(&out, &len, c->turns[i].reply));
        free(u);
        if (!ok) {
            free(out);
            return NULL;
        }
    }
    return out;
}

/* ---- the command ------------------------------------------------------------ */

typedef enum { POLICY_STOP, POLICY_DROP } context_policy;

int og_cmd_chat(int argc, char **argv) {
    og_gen_options o;
    og_gen_default_options(&o);
    const char *system = NULL;
    context_policy policy = POLICY_STOP;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = og_gen_parse_option("chat", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--system")) {
            if (!(v = og_cli_value("chat", argc, argv, &i))) return 2;
            system = v;
        } else if (!strcmp(a, "--context-policy")) {
            if (!(v = og_cli_value("chat", argc, argv, &i))) return 2;
            if (!strcmp(v, "stop")) policy = POLICY_STOP;
            else if (!strcmp(v, "drop")) policy = POLICY_DROP;
            else {
                fprintf(stderr, "offgraph chat: --context-policy expects stop or drop, got \"%s\"\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "offgraph chat: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    og_gen g;
    if (!og_gen_open("chat", &o, &g)) {
        og_gen_close(&g);
        return 1;
    }
    conversation conv = {.fmt = og_chat_format_detect(og_tokenizer_chat_template(g.tok))};
    if (system && *system) conv.system = strdup(system);
    if (conv.fmt == OG_CHAT_PLAIN)
        fprintf(stderr, "offgraph chat: warning: %s; turns are plain text\n",
                og_tokenizer_chat_template(g.tok) ? "the model's chat template is not one offgraph knows"
                                                  : "the model has no chat template");
    og_gen_add_stop(&g, og_chat_end_of_turn(conv.fmt) ? og_tokenizer_token_id(g.tok, og_chat_end_of_turn(conv.fmt))
                                                      : -1);
    /* Ctrl-C: no SA_RESTART, so that a read waiting at the prompt returns */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    g.interrupt = &interrupted;
    input in;
    input_open(&in, argv[0]);
    if (in.el) fprintf(stderr, "offgraph chat: /help lists the commands; Ctrl-C stops a reply, Ctrl-D ends\n");
    turn_stats last = {0};
    int rc = 0;
    bool interrupted_at_prompt = false;
    const int64_t reserve = o.max_tokens < g.max_ctx / 4 ? (o.max_tokens > 1 ? o.max_tokens : 1) : g.max_ctx / 4 + 1;
    for (;;) {
        char *msg = NULL;
        input_kind k = read_message(&in, &msg);
        if (k == IN_EOF) break;
        if (k == IN_INTERRUPT) {
            if (interrupted_at_prompt) break;
            interrupted_at_prompt = true;
            fprintf(stderr, "offgraph chat: Ctrl-C again (or Ctrl-D, /quit) ends\n");
            continue;
        }
        interrupted_at_prompt = false;
        char *line = msg;
        if (line[0] == '/' && line[1] != '/') {
            const char *arg = line + strcspn(line, " ");
            size_t cmd_len = (size_t)(arg - line);
            while (*arg == ' ') arg++;
#define IS(name) (cmd_len == strlen(name) && !strncmp(line, name, cmd_len))
            bool quit = false;
            if (IS("/quit") || IS("/exit")) {
                quit = true;
            } else if (IS("/help")) {
                commands_help(stderr);
            } else if (IS("/stats")) {
                print_stats(&g, &last);
            } else if ((IS("/save") || IS("/load")) && *arg) {
                og_session *loaded = NULL;
                og_status st =
                    line[1] == 's' ? og_session_save(g.session, arg) : og_session_restore(g.model, arg, &loaded);
                if (st != OG_OK) {
                    fprintf(stderr, "offgraph chat: %s\n", og_last_error());
                } else {
                    if (loaded) { /* the saved conversation replaces this one (its text is not saved) */
                        og_session_destroy(g.session);
                        g.session = loaded;
                        og_sampler_reset(g.sampler);
                        conv_clear(&conv);
                        last = (turn_stats){0};
                    }
                    fprintf(stderr, "offgraph chat: %s %s (%lld tokens)\n", line[1] == 's' ? "saved to" : "loaded",
                            arg, (long long)og_session_length(g.session));
                }
            } else if (IS("/reset") || IS("/system")) {
                if (IS("/system")) {
                    free(conv.system);
                    conv.system = *arg ? strdup(arg) : NULL;
                    fprintf(stderr, "offgraph chat: %s; the conversation starts over\n",
                            conv.system ? "system prompt set" : "no system prompt");
                }
                og_session_reset(g.session);
                og_sampler_reset(g.sampler);
                conv_clear(&conv);
                last = (turn_stats){0};
            } else {
                fprintf(stderr,
                        "offgraph chat: unknown command %.*s (not sent to the model): /help lists the commands; "
                        "start a message with // to send a leading /\n",
                        (int)cmd_len, line);
            }
#undef IS
            free(msg);
            if (quit) break;
            continue;
        }
        if (line[0] == '/') line++; /* "//text" sends "/text" */
        if (!*line) {
            free(msg);
            continue;
        }
        /* the new turn, alone after what the session holds */
        const bool first = og_session_length(g.session) == 0;
        int32_t *ids = NULL;
        int64_t n = 0;
        char *text = render_user(&conv, first, line);
        bool ok = text && og_gen_encode("chat", &g, text, false, &ids, &n);
        free(text);
        if (!ok) {
            free(msg);
            rc = 1;
            break;
        }
        const int64_t held = og_session_length(g.session);
        bool refill = false;
        if (held + n + (policy == POLICY_DROP ? reserve : 1) > g.max_ctx) {
            if (policy == POLICY_STOP || first) {
                if (first) og_gen_prompt_fits("chat", &g, n);
                if (!first || n <= g.max_ctx)
                    fprintf(stderr,
                            "offgraph chat: the conversation is full: it holds %lld tokens, this turn needs %lld "
                            "more and the context limit is %lld. /reset starts over (--context-policy drop "
                            "forgets the oldest turns instead)\n",
                            (long long)held, (long long)n, (long long)g.max_ctx);
                og_free(ids);
                free(msg);
                continue;
            }
            /* drop: the oldest turns go until the rest and a reply fit */
            int32_t from = 0;
            for (; from <= conv.n; from++) {
                char *all = render_from(&conv, from, line);
                int32_t *all_ids = NULL;
                int64_t m = 0;
                ok = all && og_gen_encode("chat", &g, all, false, &all_ids, &m);
                free(all);
                if (!ok) break;
                if (m + reserve <= g.max_ctx || (from == conv.n && m + 1 <= g.max_ctx)) {
                    og_free(ids);
                    ids = all_ids;
                    n = m;
                    refill = true;
                    break;
                }
                og_free(all_ids);
            }
            if (!ok || !refill) {
                if (ok) og_gen_prompt_fits("chat", &g, n);
                og_free(ids);
                free(msg);
                if (!ok) {
                    rc = 1;
                    break;
                }
                continue;
            }
            fprintf(stderr,
                    "offgraph chat: the context limit (%lld tokens) is near: forgot the %d oldest turn%s%s and "
                    "read the remaining %lld tokens again\n",
                    (long long)g.max_ctx, from, from == 1 ? "" : "s", conv.system ? " (the system prompt kept)" : "",
                    (long long)n);
            conv_drop(&conv, from);
            og_session_reset(g.session);
        }
        double t0 = og_time_now();
        ok = og_gen_prefill("chat", &g, ids, n, o.max_tokens > 0);
        double t1 = og_time_now();
        og_gen_result res = {0};
        ok = ok && og_gen_decode("chat", &g, o.max_tokens, true, stdout, true, &res);
        double t2 = og_time_now();
        putchar('\n');
        fflush(stdout);
        og_free(ids);
        if (!ok) {
            og_free(res.text);
            free(msg);
            rc = 1;
            break;
        }
        if (res.interrupted) {
            interrupted = 0;
            fprintf(stderr, "offgraph chat: reply stopped (Ctrl-C)\n");
        }
        if (res.context_full)
            fprintf(stderr, "offgraph chat: the reply reached the context limit (%lld tokens)%s\n",
                    (long long)g.max_ctx,
                    policy == POLICY_STOP ? ": /reset starts over" : "; the next turn forgets the oldest ones");
        if (conv.n == conv.cap) {
            int32_t nc = conv.cap ? conv.cap * 2 : 16;
            chat_turn *p = realloc(conv.turns, (size_t)nc * sizeof *p);
            if (p) {
                conv.turns = p;
                conv.cap = nc;
            }
        }
        if (conv.n < conv.cap) {
            conv.turns[conv.n].user = strdup(line);
            conv.turns[conv.n].reply = res.text;
            if (conv.turns[conv.n].user) conv.n++;
            else og_free(res.text);
        } else
            og_free(res.text);
        free(msg);
        last = (turn_stats){last.turn + 1, n, res.generated, t1 - t0, t2 - t1};
    }
    input_close(&in);
    sigaction(SIGINT, &old_sa, NULL);
    conv_clear(&conv);
    free(conv.turns);
    free(conv.system);
    og_gen_close(&g);
    return rc;
}
