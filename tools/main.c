/* offgraph: the command line. The only place in the project that exits.
 *
 * Before a command parses its arguments, main reads them once against the
 * options the command's help text lists (og_cli_parse_help: the help is the
 * one list of what a command takes): llama.cpp's names for options
 * offgraph spells otherwise become offgraph's (-s is --seed, -r --stop,
 * ...), an option no command knows is refused with the nearest one
 * ("did you mean --temp?"), run's words without an option are its prompt,
 * and an installed offgraph finds the demo model under its prefix. */
#include "cli.h"
#include "commands.h"
#include "offgraph.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
    const char *positional; /* the option a bare argument stands for (NULL: the command's own) */
    bool demo_model;        /* without -m it runs the demo model */
} command;

static const command k_commands[] = {
    /* sub-commands register here, one line each */
    {"export", og_cmd_export, "convert a Hugging Face checkpoint into a program file", NULL, false},
    {"inspect", og_cmd_inspect, "validate a program file and show what it holds", NULL, false},
    {"eval", og_cmd_eval, "write the logits of every input position", NULL, false},
    {"perplexity", og_cmd_perplexity, "score how well the model predicts a text", NULL, true},
    {"bench", og_cmd_bench, "prefill and decode speed, KV bytes allocated against live", NULL, false},
    {"demo", og_cmd_demo, "show the KV manager: sessions, growth, metrics", NULL, false},
    {"run", og_cmd_run, "generate text from a prompt, streamed as it comes", "-p", true},
    {"chat", og_cmd_chat, "an interactive conversation in one session", NULL, true},
    {"serve", og_cmd_serve, "an OpenAI-compatible HTTP server with continuous batching", NULL, true},
    {"tokenize", og_cmd_tokenize, "text to token ids, with the model's tokenizer", NULL, true},
    {"detokenize", og_cmd_detokenize, "token ids to text", NULL, true},
    {"version", og_cmd_version, "print the version", NULL, false},
};
#define N_COMMANDS (sizeof k_commands / sizeof k_commands[0])

int og_cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("offgraph %d.%d\n", OG_VERSION_MAJOR, OG_VERSION_MINOR);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: offgraph <command> [options]   (offgraph <command> --help for its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
}

/* ---- options, as each command's help lists them --------------------------- */

/* llama.cpp's spellings of options offgraph names otherwise; each applies
 * to the commands whose help lists its offgraph name. (-c, -t, -ngl, -fa
 * and -b are offgraph's own names too: og_cli_model_option.) */
typedef struct alias {
    const char *names[3]; /* llama.cpp's */
    const char *to;       /* offgraph's  */
} alias;
static const alias k_aliases[] = {
    {{"-s"}, "--seed"},
    {{"--temperature"}, "--temp"},
    {{"-sys", "--system-prompt"}, "--system"},
    {{"-r", "--reverse-prompt"}, "--stop"},
    {{"--predict", "--n-predict"}, "--max-tokens"},
    {{"-np", "--parallel"}, "--max-sessions"},
    {{"--grammar-file"}, "--grammar"},
    {{"-j", "-jf", "--json-schema-file"}, "--json-schema"},
    {{"-dev", "--device"}, "--devices"},
};
#define N_ALIASES (sizeof k_aliases / sizeof k_aliases[0])

#define MAX_OPTS 96
typedef struct optset {
    og_cli_opt opt[MAX_OPTS];
    int n;
    char *help; /* the command's --help text */
} optset;

/* The command's help, as it prints it (its --help writes to stdout, which
 * glibc lets a program point at a memory stream for the call). */
static char *help_of(const command *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) return NULL;
    FILE *saved = stdout;
    char name[32], help[] = "--help";
    snprintf(name, sizeof name, "%s", c->name);
    char *argv[] = {name, help, NULL};
    fflush(stdout);
    stdout = mem;
    c->fn(2, argv);
    stdout = saved;
    fclose(mem);
    return buf;
}

static const og_cli_opt *find_opt(const optset *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->opt[i].name, name)) return &s->opt[i];
    return NULL;
}

static const alias *find_alias(const char *name) {
    for (size_t i = 0; i < N_ALIASES; i++)
        for (int k = 0; k < 3 && k_aliases[i].names[k]; k++)
            if (!strcmp(k_aliases[i].names[k], name)) return &k_aliases[i];
    return NULL;
}

/* The llama.cpp names that apply to the command, after its help. */
static void print_aliases(const command *c, const optset *s) {
    bool any = false;
    for (size_t i = 0; i < N_ALIASES; i++) {
        if (!find_opt(s, k_aliases[i].to)) continue;
        if (!any) printf("\nllama.cpp's names, taken as offgraph's:\n");
        any = true;
        char names[64] = "";
        for (int k = 0; k < 3 && k_aliases[i].names[k]; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                     k_aliases[i].names[k]);
        printf("  %-24s %s\n", names, k_aliases[i].to);
    }
    if (find_opt(s, "-n")) {
        if (!any) printf("\nllama.cpp's names, taken as offgraph's:\n");
        any = true;
        printf("  %-24s %s\n", "-n -1, -n -2", "-n 0 (until the context is full)");
    }
    if (c->positional)
        printf("%sThe words after the options, when %s is not given, are the prompt: offgraph %s [options] "
               "<prompt>.\n", any ? "" : "\n", c->positional, c->name);
}

/* The installed demo model: <prefix>/share/offgraph/kjv-tiny.ogp beside
 * <prefix>/bin/offgraph; NULL when this offgraph is not installed there. */
static const char *installed_demo(void) {
    static char path[PATH_MAX];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    if (snprintf(path, sizeof path, "%s/../share/offgraph/kjv-tiny.ogp", exe) >= (int)sizeof path) return NULL;
    return access(path, R_OK) == 0 ? path : NULL;
}

/* What a command gets: the arguments after prepare_args. */
typedef struct args {
    int argc;
    char **argv;   /* malloc'd; its strings borrowed, static or `joined` */
    char *joined;  /* the words of a positional prompt, joined */
} args;

static bool is_word(const char *a) { return a[0] != '-' || !a[1] || (a[1] >= '0' && a[1] <= '9'); }

/* Reads the arguments against the command's options (see the top of the
 * file) into *out. Returns -1 to go on, else the exit status: --help was
 * printed (0) or an option was refused (2). */
static int prepare_args(const command *c, int argc, char **argv, args *out) {
    optset set = {.n = 0};
    memset(out, 0, sizeof *out);
    set.help = help_of(c);
    if (!set.help) return -1; /* no help: the command parses alone */
    set.n = og_cli_parse_help(set.help, set.opt, MAX_OPTS);
    char **av = calloc((size_t)argc + 4, sizeof *av);
    bool *word = calloc((size_t)argc + 4, sizeof *word);
    char *joined = NULL;
    int rc = -1, n = 0;
    if (!av || !word) goto done;
    av[n++] = argv[0];
    bool has_model = false, has_prompt = false;
    int n_words = 0;
    size_t words_len = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* a word: "-" (standard input), a negative number, anything without '-' */
        if (is_word(a)) {
            n_words++;
            words_len += strlen(a) + 1;
            word[n] = true;
            av[n++] = argv[i];
            continue;
        }
        const og_cli_opt *o = find_opt(&set, a);
        const alias *al = o ? NULL : find_alias(a);
        if (al && !(o = find_opt(&set, al->to))) {
            fprintf(stderr, "offgraph %s: %s is llama.cpp's name of %s, which offgraph %s does not take\n", c->name,
                    a, al->to, c->name);
            rc = 2;
            goto done;
        }
        if (!o) {
            const char *cands[MAX_OPTS + 3 * N_ALIASES];
            int nc = 0;
            for (int k = 0; k < set.n; k++) cands[nc++] = set.opt[k].name;
            for (size_t k = 0; k < N_ALIASES; k++)
                if (find_opt(&set, k_aliases[k].to))
                    for (int j = 0; j < 3 && k_aliases[k].names[j]; j++) cands[nc++] = k_aliases[k].names[j];
            const char *near = og_cli_suggest(a, cands, nc);
            const alias *na = near ? find_alias(near) : NULL;
            fprintf(stderr, "offgraph %s: unknown option \"%s\"", c->name, a);
            if (near) fprintf(stderr, "; did you mean %s%s%s%s?", near, na ? " (" : "", na ? na->to : "", na ? ")" : "");
            fprintf(stderr, "\n(offgraph %s --help lists its options)\n", c->name);
            rc = 2;
            goto done;
        }
        if (!strcmp(o->name, "-h") || !strcmp(o->name, "--help")) {
            fputs(set.help, stdout);
            print_aliases(c, &set);
            rc = 0;
            goto done;
        }
        if (!strcmp(o->name, "-m") || !strcmp(o->name, "--model")) has_model = true;
        if (!strcmp(o->name, "-p") || !strcmp(o->name, "--prompt") || !strcmp(o->name, "-f") ||
            !strcmp(o->name, "--file"))
            has_prompt = true;
        av[n++] = (char *)(al ? al->to : a);
        if (o->value && i + 1 < argc) {
            const char *v = argv[++i];
            /* llama.cpp's -n -1 (no end) and -n -2 (until the context is
             * full) are offgraph's -n 0 */
            if ((!strcmp(o->name, "-n") || !strcmp(o->name, "--max-tokens")) && (!strcmp(v, "-1") || !strcmp(v, "-2")))
                v = "0";
            av[n++] = (char *)v;
        }
    }
    if (c->positional && n_words > 0) {
        if (has_prompt) {
            fprintf(stderr, "offgraph %s: the prompt is given twice: by an option and as the words after the options\n",
                    c->name);
            rc = 2;
            goto done;
        }
        /* the words, wherever they stood, joined by spaces, after -p */
        if (!(joined = malloc(words_len + 1))) goto done;
        size_t at = 0;
        int m = 1;
        for (int k = 1; k < n; k++) {
            if (word[k]) at += (size_t)sprintf(joined + at, "%s%s", at ? " " : "", av[k]);
            else av[m++] = av[k];
        }
        n = m;
        av[n++] = (char *)c->positional;
        av[n++] = joined;
    }
    if (c->demo_model && !has_model && find_opt(&set, "-m")) {
        const char *demo = installed_demo();
        if (demo) {
            av[n++] = (char *)"-m";
            av[n++] = (char *)demo;
        }
    }
    av[n] = NULL;
    *out = (args){n, av, joined};
    av = NULL;
    joined = NULL;
done:
    free(av);
    free(word);
    free(joined);
    free(set.help);
    return rc;
}

/* OpenBLAS's pthread build starts its worker threads when it is loaded,
 * before main, and each takes a 128 MB buffer; where that allocation fails
 * (an address-space limit: ulimit -v) the thread retries forever and exit
 * waits for it, so the process hangs instead of reporting. The library runs
 * BLAS single-threaded anyway (its own pool supplies the parallelism), so
 * when OPENBLAS_NUM_THREADS is unset the tool runs itself again with it set
 * to 1, and OpenBLAS then starts no threads. */
static void blas_without_threads(char **argv) {
    if (getenv("OPENBLAS_NUM_THREADS")) return;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with OpenBLAS's threads */
}

int main(int argc, char **argv) {
    blas_without_threads(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return og_cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const command *c = &k_commands[i];
        if (strcmp(argv[1], c->name)) continue;
        if (c->fn == og_cmd_version) return c->fn(argc - 1, argv + 1);
        args a;
        int rc = prepare_args(c, argc - 1, argv + 1, &a);
        if (rc >= 0) return rc;
        if (!a.argv) return c->fn(argc - 1, argv + 1);
        rc = c->fn(a.argc, a.argv);
        free(a.argv);
        free(a.joined);
        return rc;
    }
    const char *names[N_COMMANDS];
    for (size_t i = 0; i < N_COMMANDS; i++) names[i] = k_commands[i].name;
    const char *near = og_cli_suggest(argv[1], names, (int)N_COMMANDS);
    fprintf(stderr, "offgraph: unknown command \"%s\"%s%s%s\n\n", argv[1], near ? "; did you mean " : "",
            near ? near : "", near ? "?" : "");
    usage(stderr);
    return 2;
}
