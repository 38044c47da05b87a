/* offgraph chat: a conversation in one session. Every turn renders the whole
 * conversation with the model's chat template (src/text/chat_template.h)
 * and feeds the session only what it does not hold yet: the tokens past
 * the longest prefix the new text shares with the session's, as a request
 * of the library's engine that goes on in the session (its reply stays in
 * it; og_request_params.session). Where the
 * template rewrote an earlier turn (Qwen3 drops the thinking of past
 * replies) the session is forked back to that prefix first. When the
 * conversation reaches the model's context limit it stops there
 * (--context-policy stop) or drops its oldest turns, keeping the system
 * prompt, and reads what is left again (drop). */
#include "commands.h"
#include "core/core.h"
#include "request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>

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
               "                     [--chat-flag NAME=true|false] [--grammar F | --json-schema F]\n"
               "                     [sampling options]\n\n"
               "Reads user messages from standard input (with line editing and history on a\n"
               "terminal; a line ending in \\ goes on on the next line) and prints the model's\n"
               "replies, with the model's own chat template (plain text when it has none).\n"
               "Ctrl-C stops a reply; Ctrl-C twice at the prompt (or Ctrl-D) ends.\n"
               "Type /help for the commands. -n limits one reply (0: until the context is full).\n\n"
               "  --system <text>          the system prompt\n"
               "  --context-policy P       at the model's context limit: stop (default) refuses\n"
               "                           further turns until /reset; drop forgets the oldest\n"
               "                           turns (never the system prompt) and reads the rest again\n"
               "  --chat-flag NAME=BOOL    a variable of the chat template, e.g. enable_thinking=false\n"
               "                           (up to 8)\n");
    og_gen_options_usage(f);
}

static void commands_help(FILE *f) {
    fputs("commands:\n"
          "  /help             this list\n"
          "  /system <text>    set the system prompt (without text: none) and start over\n"
          "  /reset            forget the conversation (the system prompt stays)\n"
          "  /stats            one line of JSON about the last turn and the session\n"
          "  /save <file>      write the conversation (KV cache; its text to <file>.chat.json), crash-safe\n"
          "  /load <file>      go on from a saved conversation of the same model\n"
          "  /quit, /exit      end (so does Ctrl-D)\n"
          "a line ending in \\ goes on on the next line; //text sends \"/text\" to the model\n",
          f);
}

typedef struct turn_stats {
    int64_t turn, reused_tokens, prefill_tokens, generated_tokens;
    double prefill_s, decode_s;
} turn_stats;

static void print_stats(const og_gen *g, og_session *s, const turn_stats *t) {
    og_kv_metrics km;
    if (og_session_metrics(s, &km) != OG_OK) {
        fprintf(stderr, "offgraph chat: %s\n", og_last_error());
        return;
    }
    printf("{\"turn\": %lld, \"prefill_tokens\": %lld, \"generated_tokens\": %lld, \"session_length\": %lld, "
           "\"context_limit\": %lld, \"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, "
           "\"kv_bytes_allocated\": %lld, \"kv_bytes_live\": %lld, \"growth_events\": %lld, \"reused_tokens\": %lld}\n",
           (long long)t->turn, (long long)t->prefill_tokens, (long long)t->generated_tokens,
           (long long)og_session_length(s), (long long)g->max_ctx,
           t->prefill_s > 0 ? (double)t->prefill_tokens / t->prefill_s : 0.0,
           t->decode_s > 0 && t->generated_tokens > 1 ? (double)(t->generated_tokens - 1) / t->decode_s : 0.0,
           (long long)km.bytes_allocated,
           (long long)km.bytes_live, (long long)km.growth_count, (long long)t->reused_tokens);
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

/* ---- the conversation, rendered whole ----------------------------------- */

typedef struct chat_turn {
    char *user, *reply;
} chat_turn;

typedef struct conversation {
    og_chat_template *tpl;
    const char *bos, *eos; /* the tokenizer's, as the template sees them (NULL: none) */
    og_chat_flag flags[8]; /* --chat-flag */
    size_t n_flags;
    char *system;          /* NULL: none */
    chat_turn *turns;      /* what the session holds, oldest first */
    int32_t n, cap;
    /* the tokens the session holds, after `opaque` tokens it holds but
     * whose text is unknown (a conversation loaded with /load) */
    int32_t *held;
    int64_t n_held, cap_held, opaque;
} conversation;

static void conv_clear(conversation *c) {
    for (int32_t i = 0; i < c->n; i++) {
        free(c->turns[i].user);
        og_free(c->turns[i].reply);
    }
    c->n = 0;
    c->n_held = 0;
    c->opaque = 0;
}

static void conv_drop(conversation *c, int32_t k) {
    for (int32_t i = 0; i < k; i++) {
        free(c->turns[i].user);
        og_free(c->turns[i].reply);
    }
    memmove(c->turns, c->turns + k, (size_t)(c->n - k) * sizeof *c->turns);
    c->n -= k;
}

static bool held_append(conversation *c, const int32_t *ids, int64_t n) {
    if (c->n_held + n > c->cap_held) {
        int64_t cap = (c->n_held + n) * 2;
        int32_t *p = realloc(c->held, (size_t)cap * sizeof *p);
        if (!p) return false;
        c->held = p;
        c->cap_held = cap;
    }
    memcpy(c->held + c->n_held, ids, (size_t)n * sizeof *ids);
    c->n_held += n;
    return true;
}

/* The conversation from turn `from` on (after the system prompt), then the
 * new user message, rendered with what opens the assistant's reply. Owned by
 * the caller: og_free; NULL after a message. */
static char *render_from(const conversation *c, int32_t from, const char *user) {
    size_t n = 0, cap = (size_t)(c->n - from) * 2 + 2;
    og_chat_message *m = malloc(cap * sizeof *m);
    if (!m) return NULL;
    /* after /load the loaded text comes first: it holds the start of the
     * conversation and its system prompt */
    if (c->system && !c->opaque) m[n++] = (og_chat_message){"system", c->system};
    for (int32_t i = from; i < c->n; i++) {
        m[n++] = (og_chat_message){"user", c->turns[i].user};
        m[n++] = (og_chat_message){"assistant", c->turns[i].reply};
    }
    m[n++] = (og_chat_message){"user", user};
    og_chat_request req = {.messages = m, .n_messages = n, .add_generation_prompt = true,
                           .bos_token = c->opaque ? NULL : c->bos,
                           .eos_token = c->eos, .flags = c->flags, .n_flags = c->n_flags};
    char *out = NULL;
    if (og_chat_template_render(c->tpl, &req, &out) != OG_OK)
        fprintf(stderr, "offgraph chat: %s\n", og_last_error());
    free(m);
    return out;
}

/* How much of ids (the whole conversation's tokens) the session already
 * holds after its opaque tokens: the longest common prefix, less one so that
 * at least one token is fed (its step draws the reply's first token). */
static int64_t held_prefix(const conversation *c, const int32_t *ids, int64_t n) {
    int64_t k = 0;
    while (k < c->n_held && k < n && c->held[k] == ids[k]) k++;
    return k < n ? k : n - 1;
}

/* ---- the conversation's text beside a saved session -------------------------
 * /save writes <file>.chat.json beside the session file: the system prompt,
 * the turns, and the tokens the session holds, so that /load goes on
 * rendering the whole conversation with the template (and a later turn feeds
 * only what is new, as in the session that saved it). Written to a temp file
 * and renamed; a session file without it (or with one that does not match
 * the session's length) loads as an opaque prefix of tokens. */

static char *text_path(const char *file) {
    char *p = malloc(strlen(file) + sizeof ".chat.json");
    if (p) sprintf(p, "%s.chat.json", file);
    return p;
}

static bool conv_save_text(const conversation *c, const char *file) {
    cJSON *o = cJSON_CreateObject();
    cJSON *turns = o ? cJSON_AddArrayToObject(o, "turns") : NULL, *held = o ? cJSON_AddArrayToObject(o, "held") : NULL;
    bool ok = turns && held &&
              (c->system ? cJSON_AddStringToObject(o, "system", c->system) : cJSON_AddNullToObject(o, "system")) &&
              cJSON_AddNumberToObject(o, "opaque", (double)c->opaque);
    for (int32_t i = 0; ok && i < c->n; i++) {
        cJSON *t = cJSON_CreateObject();
        ok = t && cJSON_AddItemToArray(turns, t) && cJSON_AddStringToObject(t, "user", c->turns[i].user) &&
             cJSON_AddStringToObject(t, "reply", c->turns[i].reply ? c->turns[i].reply : "");
    }
    for (int64_t i = 0; ok && i < c->n_held; i++) {
        cJSON *v = cJSON_CreateNumber(c->held[i]);
        ok = v && cJSON_AddItemToArray(held, v);
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    char *path = text_path(file), *tmp = path ? malloc(strlen(path) + 8) : NULL;
    ok = text && tmp;
    if (ok) {
        sprintf(tmp, "%s.XXXXXX", path);
        int fd = mkstemp(tmp);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f && fd >= 0) close(fd);
        ok = f && fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (f && fclose(f) != 0) ok = false;
        if (ok) ok = rename(tmp, path) == 0;
        if (!ok && fd >= 0) unlink(tmp);
    }
    if (!ok)
        fprintf(stderr, "offgraph chat: warning: the conversation's text was not written beside it (%s): /load "
                        "will keep its tokens as they are\n", path ? path : file);
    free(tmp);
    free(path);
    cJSON_free(text);
    return ok;
}

/* Reads <file>.chat.json into c when it describes a session of `length`
 * tokens; false (c untouched) otherwise. */
static bool conv_load_text(conversation *c, const char *file, int64_t length) {
    char *path = text_path(file);
    char *text = path && access(path, R_OK) == 0 ? og_cli_read_file("chat", path) : NULL;
    free(path);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(o, "system"), *op = cJSON_GetObjectItemCaseSensitive(o, "opaque"),
                *turns = cJSON_GetObjectItemCaseSensitive(o, "turns"), *held = cJSON_GetObjectItemCaseSensitive(o, "held"),
                *it;
    bool ok = o && (cJSON_IsString(sys) || cJSON_IsNull(sys)) && cJSON_IsNumber(op) && op->valuedouble >= 0 &&
              cJSON_IsArray(turns) && cJSON_IsArray(held) &&
              (int64_t)op->valuedouble + cJSON_GetArraySize(held) == length;
    cJSON_ArrayForEach(it, held) ok = ok && cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < INT32_MAX;
    cJSON_ArrayForEach(it, turns) ok = ok && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "user")) &&
                                       cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "reply"));
    const int32_t n_turns = ok ? cJSON_GetArraySize(turns) : 0;
    chat_turn *t = ok && n_turns ? calloc((size_t)n_turns, sizeof *t) : NULL;
    ok = ok && (t || !n_turns);
    int32_t k = 0;
    cJSON_ArrayForEach(it, turns) {
        if (!ok) break;
        const char *u = cJSON_GetObjectItemCaseSensitive(it, "user")->valuestring,
                   *r = cJSON_GetObjectItemCaseSensitive(it, "reply")->valuestring;
        t[k].user = strdup(u);
        t[k].reply = og_malloc(strlen(r) + 1);
        if (t[k].reply) strcpy(t[k].reply, r);
        ok = t[k].user && t[k].reply;
        k++;
    }
    char *system = ok && cJSON_IsString(sys) ? strdup(sys->valuestring) : NULL;
    ok = ok && (system || !cJSON_IsString(sys));
    if (ok) {
        conv_clear(c);
        c->opaque = (int64_t)op->valuedouble;
        cJSON_ArrayForEach(it, held) {
            const int32_t id = (int32_t)it->valuedouble;
            if (!(ok = held_append(c, &id, 1))) break;
        }
    }
    if (ok) {
        free(c->system);
        c->system = system;
        free(c->turns);
        c->turns = t;
        c->n = c->cap = n_turns;
        t = NULL;
    } else {
        free(system);
        if (c->n_held) conv_clear(c);
    }
    for (int32_t i = 0; t && i < k; i++) {
        free(t[i].user);
        og_free(t[i].reply);
    }
    free(t);
    cJSON_Delete(o);
    return ok;
}

/* ---- prefix reuse across conversations --------------------------------------
 * Before a conversation is forgotten (/reset, /system, --context-policy drop),
 * a fork of its session goes into a prefix cache with the tokens it holds;
 * a conversation that starts again empty takes the longest cached prefix of
 * its first turn (the system prompt, often more) instead of reading it again. */

static void park_session(og_prefix_cache *pc, og_session *s, const conversation *c) {
    if (!pc || c->opaque || c->n_held < 2 || c->n_held != og_session_length(s)) return;
    og_session *copy = NULL;
    if (og_session_fork(s, c->n_held, &copy) == OG_OK) og_prefix_cache_put(pc, copy, c->held, c->n_held);
}

/* In an empty session: the longest cached prefix of ids [n] becomes the
 * session (and what the conversation holds). At least two tokens are left
 * to read: a step of one token computes along another path than a wider
 * one, so a conversation started again from the cache reads its first turn
 * as a fresh process does, and replies the same. */
static void reuse_parked(og_prefix_cache *pc, og_model *m, og_session **s, conversation *c, const int32_t *ids,
                         int64_t n) {
    og_session *f = NULL;
    int64_t reused = 0;
    if (!pc || n < 3 || og_session_length(*s) != 0 || c->opaque ||
        og_prefix_cache_lookup(pc, m, ids, n - 1, &f, &reused) != OG_OK || !f)
        return;
    c->n_held = 0;
    if (!held_append(c, ids, reused)) {
        og_session_destroy(f);
        return;
    }
    og_session_destroy(*s);
    *s = f;
}

/* ---- the command ------------------------------------------------------------ */

typedef enum { POLICY_STOP, POLICY_DROP } context_policy;

int og_cmd_chat(int argc, char **argv) {
    og_gen_options o;
    og_gen_default_options(&o);
    const char *system = NULL;
    context_policy policy = POLICY_STOP;
    og_chat_flag flags[8];
    const char *flag_names[8];
    size_t n_flags = 0;
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
        } else if (!strcmp(a, "--chat-flag")) {
            if (!(v = og_cli_value("chat", argc, argv, &i))) return 2;
            const char *eq = strchr(v, '=');
            bool val = eq && (!strcmp(eq + 1, "true") || !strcmp(eq + 1, "1"));
            if (!eq || eq == v || (!val && strcmp(eq + 1, "false") && strcmp(eq + 1, "0"))) {
                fprintf(stderr, "offgraph chat: --chat-flag expects NAME=true or NAME=false, got \"%s\"\n", v);
                return 2;
            }
            if (n_flags == sizeof flags / sizeof *flags) {
                fprintf(stderr, "offgraph chat: at most %zu --chat-flag options\n", sizeof flags / sizeof *flags);
                return 2;
            }
            flag_names[n_flags] = v;
            flags[n_flags++] = (og_chat_flag){NULL, val};
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
    /* the conversation's KV is this session of chat's own: each turn is a
     * request of the engine that goes on in it (og_request_params.session),
     * so that /save, /load and the prefix reuse below reach it */
    og_gen g;
    og_session *session = NULL;
    bool started = og_gen_load("chat", &o, &g) && og_gen_start_engine("chat", &o, &g, 0);
    if (started && og_session_create(g.model, &o.run.session, &session) != OG_OK) {
        fprintf(stderr, "offgraph chat: %s\n", og_last_error());
        started = false;
    }
    if (!started) {
        og_gen_close(&g);
        return 1;
    }
    const char *tpl_text = og_tokenizer_chat_template(g.tok);
    conversation conv = {0};
    if (og_chat_template_create(tpl_text, OG_CHAT_PLAIN, &conv.tpl) != OG_OK) {
        fprintf(stderr, "offgraph chat: the model's %s\n", og_last_error());
        og_gen_close(&g);
        return 1;
    }
    /* the flags' names, without "=value", as the template sees them */
    char *names = NULL;
    size_t names_len = 0;
    for (size_t k = 0; k < n_flags; k++) names_len += strlen(flag_names[k]) + 1;
    if (n_flags && !(names = malloc(names_len))) {
        og_chat_template_destroy(conv.tpl);
        og_gen_close(&g);
        return 1;
    }
    for (size_t k = 0, at = 0; k < n_flags; k++) {
        size_t len = (size_t)(strchr(flag_names[k], '=') - flag_names[k]);
        memcpy(names + at, flag_names[k], len);
        names[at + len] = 0;
        conv.flags[k] = (og_chat_flag){names + at, flags[k].value};
        at += len + 1;
    }
    conv.n_flags = n_flags;
    int32_t bos = og_tokenizer_bos_id(g.tok);
    const int32_t *eos_ids;
    conv.bos = bos >= 0 ? og_tokenizer_token_text(g.tok, bos) : NULL;
    conv.eos = og_tokenizer_eos_ids(g.tok, &eos_ids) > 0 ? og_tokenizer_token_text(g.tok, eos_ids[0]) : NULL;
    if (system && *system) conv.system = strdup(system);
    if (!tpl_text) fprintf(stderr, "offgraph chat: warning: the model has no chat template; turns are plain text\n");
    /* the end of a reply (the template's end-of-turn token) is one of the
     * engine's stop ids (og_tokenizer_stop_ids) */
    /* Ctrl-C: no SA_RESTART, so that a read waiting at the prompt returns */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    input in;
    input_open(&in, argv[0]);
    if (in.el) fprintf(stderr, "offgraph chat: /help lists the commands; Ctrl-C stops a reply, Ctrl-D ends\n");
    turn_stats last = {0};
    int rc = 0;
    bool interrupted_at_prompt = false;
    uint64_t requests = 0;
    const int64_t reserve = o.max_tokens < g.max_ctx / 4 ? (o.max_tokens > 1 ? o.max_tokens : 1) : g.max_ctx / 4 + 1;
    og_prefix_cache_params pcp = og_prefix_cache_default_params();
    pcp.block_tokens = 16;
    og_prefix_cache *pc = NULL;
    if (og_prefix_cache_create(&pcp, &pc) != OG_OK) pc = NULL; /* no reuse across conversations, that is all */
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
                print_stats(&g, session, &last);
            } else if ((IS("/save") || IS("/load")) && *arg) {
                og_session *loaded = NULL;
                og_status st =
                    line[1] == 's' ? og_session_save(session, arg) : og_session_restore(g.model, arg, &loaded);
                if (st != OG_OK) {
                    fprintf(stderr, "offgraph chat: %s\n", og_last_error());
                } else {
                    if (!loaded) conv_save_text(&conv, arg);
                    if (loaded) { /* the saved conversation replaces this one */
                        og_session_destroy(session);
                        session = loaded;
                        conv_clear(&conv);
                        if (!conv_load_text(&conv, arg, og_session_length(session))) {
                            conv.opaque = og_session_length(session);
                            fprintf(stderr, "offgraph chat: no conversation text beside %s: its tokens are kept as "
                                            "they are, and the template renders only what follows\n", arg);
                        }
                        last = (turn_stats){.turn = conv.n}; /* turns count on from the saved ones */
                    }
                    fprintf(stderr, "offgraph chat: %s %s (%lld tokens)\n", line[1] == 's' ? "saved to" : "loaded",
                            arg, (long long)og_session_length(session));
                }
            } else if (IS("/reset") || IS("/system")) {
                if (IS("/system")) {
                    free(conv.system);
                    conv.system = *arg ? strdup(arg) : NULL;
                    fprintf(stderr, "offgraph chat: %s; the conversation starts over\n",
                            conv.system ? "system prompt set" : "no system prompt");
                }
                park_session(pc, session, &conv);
                og_session_reset(session);
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
        /* the whole conversation, rendered; the session is fed only what it
         * does not hold yet */
        const bool first = og_session_length(session) == 0;
        int32_t *ids = NULL;
        int64_t n = 0;
        char *text = render_from(&conv, 0, line);
        if (!text) { /* the template refused the conversation (said above) */
            free(msg);
            continue;
        }
        bool ok = og_gen_encode("chat", &g, text, false, &ids, &n);
        og_free(text);
        if (!ok) {
            free(msg);
            rc = 1;
            break;
        }
        if (n == 0) {
            fprintf(stderr, "offgraph chat: the chat template rendered nothing for this turn\n");
            og_free(ids);
            free(msg);
            continue;
        }
        reuse_parked(pc, g.model, &session, &conv, ids, n);
        const int64_t held = og_session_length(session);
        int64_t keep = held_prefix(&conv, ids, n);
        bool refill = false;
        if (conv.opaque + n + (policy == POLICY_DROP ? reserve : 1) > g.max_ctx) {
            if (policy == POLICY_STOP || first) {
                if (first) og_gen_prompt_fits("chat", &g, n);
                if (!first || n <= g.max_ctx)
                    fprintf(stderr,
                            "offgraph chat: the conversation is full: it holds %lld tokens, this turn needs %lld "
                            "more and the context limit is %lld. /reset starts over (--context-policy drop "
                            "forgets the oldest turns instead)\n",
                            (long long)held, (long long)(conv.opaque + n - held), (long long)g.max_ctx);
                og_free(ids);
                free(msg);
                continue;
            }
            /* drop: the oldest turns go until the rest and a reply fit (a
             * loaded conversation's unknown text goes first) */
            conv.opaque = 0;
            int32_t from = 0;
            for (; from <= conv.n; from++) {
                char *all = render_from(&conv, from, line);
                int32_t *all_ids = NULL;
                int64_t m = 0;
                ok = all && og_gen_encode("chat", &g, all, false, &all_ids, &m);
                og_free(all);
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
            park_session(pc, session, &conv);
            og_session_reset(session);
            conv.n_held = 0;
            reuse_parked(pc, g.model, &session, &conv, ids, n);
            keep = held_prefix(&conv, ids, n);
        } else if (conv.opaque + keep < held) {
            /* the template rewrote what the session holds past the shared
             * prefix (or the reply's text reads as other tokens): go back to
             * the prefix, sharing its rows */
            og_session *child = NULL;
            /* a hybrid model's session can go back only to its checkpoint
             * (taken where the last prompt ended), not to any length */
            const int64_t at = og_session_fork_point(session, conv.opaque + keep);
            if (at >= conv.opaque && og_session_fork(session, at, &child) == OG_OK) {
                og_session_destroy(session);
                session = child;
                keep = at - conv.opaque;
            } else { /* e.g. below a sliding window's floor: read it all again */
                og_session_reset(session);
                keep = 0;
                conv.opaque = 0;
            }
            conv.n_held = keep;
        }
        const int64_t reused = conv.opaque + keep;
        const int32_t *fresh = ids + keep;
        n -= keep;
        /* the turn: a request of the engine that goes on in the session
         * with only what it does not hold; the reply stays in it */
        og_request_params rp = og_gen_request_params(&o);
        rp.kind = OG_PROMPT_TOKENS;
        rp.tokens = fresh;
        rp.n_tokens = n;
        rp.session = session;
        og_gen_constrain(&g, &rp);
        rp.sampling.seed = o.sampling.seed + (uint64_t)++requests; /* each turn draws afresh, a --seed repeats them */
        if (!rp.sampling.seed) rp.sampling.seed = 1;
        const int64_t before = og_session_length(session);
        og_request *req = NULL;
        og_gen_reply res = {0};
        ok = og_engine_submit(g.engine, &rp, &req) == OG_OK;
        if (!ok) fprintf(stderr, "offgraph chat: %s\n", og_last_error());
        ok = ok && og_gen_stream("chat", req, stdout, &interrupted, true, &res);
        og_request_destroy(req); /* the session is chat's again */
        /* what the session took: the turn's tokens (fewer only when Ctrl-C
         * came before it read them all) and every token of the reply */
        const int64_t took = og_session_length(session) - before;
        ok = ok && held_append(&conv, fresh, took < n ? took : n) && (took < n || held_append(&conv, res.ids, res.n_ids));
        og_free(res.ids);
        putchar('\n');
        fflush(stdout);
        og_free(ids);
        if (!ok) {
            og_free(res.text);
            free(msg);
            rc = 1;
            break;
        }
        const og_request_output *out = &res.last;
        if (g.matcher && og_matcher_error(g.matcher))
            fprintf(stderr, "offgraph chat: warning: the grammar: %s\n", og_matcher_error(g.matcher));
        if (g.matcher && out->finish == OG_FINISH_LENGTH)
            fprintf(stderr, "offgraph chat: the reply reached its token limit before the grammar's end: it is "
                            "incomplete (a larger -n lets it finish)\n");
        if (out->finish == OG_FINISH_CANCELLED) {
            interrupted = 0;
            fprintf(stderr, "offgraph chat: reply stopped (Ctrl-C)\n");
        }
        if (out->finish == OG_FINISH_LENGTH && og_session_length(session) >= g.max_ctx)
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
        /* decode: the tokens after the first over the time between them */
        const double t_first = out->t_first_token > 0 ? out->t_first_token : out->t_end;
        const double t_last = out->t_last_token > 0 ? out->t_last_token : t_first;
        last = (turn_stats){last.turn + 1, reused, n, out->completion_tokens, t_first - out->t_submit,
                            t_last - t_first};
    }
    input_close(&in);
    sigaction(SIGINT, &old_sa, NULL);
    og_prefix_cache_destroy(pc); /* its sessions before the model */
    og_session_destroy(session);
    conv_clear(&conv);
    free(conv.turns);
    free(conv.system);
    free(conv.held);
    free(names);
    og_chat_template_destroy(conv.tpl);
    og_gen_close(&g);
    return rc;
}
