/* offgraph tokenize / detokenize: text to token ids and back, with the
 * tokenizer a program embeds (the demo model's by default) or a
 * tokenizer.json, through the public tokenizer calls of offgraph.h. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"
#include "text/tokenizer.h"
#include "program/program.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef OG_DEFAULT_PROGRAM
#define OG_DEFAULT_PROGRAM "kjv-tiny.ogp"
#endif

static void source_usage(FILE *f) {
    fprintf(f, "  -m, --model FILE        the program whose tokenizer to use (default: the demo model,\n"
               "                          " OG_DEFAULT_PROGRAM ")\n"
               "  --tokenizer FILE        a tokenizer.json instead of a program's\n"
               "  --tokenizer-config FILE its tokenizer_config.json (bos, eos, chat template)\n"
               "  -h, --help              this help\n");
}

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: offgraph tokenize [-p TEXT] [options]\n\n"
               "Encodes TEXT (or all of standard input when -p is not given) and prints its token\n"
               "ids, separated by spaces, on one line. Special tokens written in the text (e.g.\n"
               "<|im_end|>) become their ids, and the special tokens a prompt gets (e.g. a bos\n"
               "token: what tokenizer.json's post_processor adds) are added, as transformers'\n"
               "tokenizer(text) does.\n\n"
               "  -p, --prompt TEXT       the text (default: standard input, read to its end)\n"
               "  --ids                   print the ids as a list: [1, 2, 3]\n"
               "  --show-pieces           print one token a line: its id and its text\n"
               "  --show-count            print the number of tokens after them\n"
               "  --no-special            add no special tokens around the text\n"
               "  --no-parse-special      special tokens written in the text are plain text\n");
    source_usage(f);
}

static void detokenize_usage(FILE *f) {
    fprintf(f, "usage: offgraph detokenize [IDS...] [options]\n\n"
               "Decodes token ids (separated by spaces or commas, brackets allowed, so that the output\n"
               "of `offgraph tokenize --ids` reads back; @FILE reads them from a file; standard input\n"
               "when none are given) and prints the text, special tokens kept, and a newline.\n\n");
    source_usage(f);
}

typedef struct source {
    const char *model, *tokenizer, *config;
} source;

/* 1: argv[*i] was a source option (read); 0: not one; -1: a bad value. */
static int source_option(const char *cmd, int argc, char **argv, int *i, source *s) {
    const char *a = argv[*i];
    const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model") ? &s->model
                       : !strcmp(a, "--tokenizer")               ? &s->tokenizer
                       : !strcmp(a, "--tokenizer-config")        ? &s->config
                                                                 : NULL;
    if (!dst) return 0;
    return (*dst = og_cli_value(cmd, argc, argv, i)) ? 1 : -1;
}

static og_tokenizer *open_tokenizer(const char *cmd, const source *s) {
    og_tokenizer *t = NULL;
    if (s->tokenizer) {
        if (og_tokenizer_from_file(s->tokenizer, s->config, &t) != OG_OK)
            fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return t;
    }
    if (s->config) {
        fprintf(stderr, "offgraph %s: --tokenizer-config goes with --tokenizer\n", cmd);
        return NULL;
    }
    /* The program's tokenizer texts, without loading its weights. */
    const char *path = s->model ? s->model : OG_DEFAULT_PROGRAM;
    og_program *p = NULL;
    if (og_program_open(path, &p) != OG_OK) {
        fprintf(stderr, "offgraph %s: %s: %s\n", cmd, path, og_last_error());
        return NULL;
    }
    const char *json = og_program_tokenizer_json(p);
    if (!json)
        fprintf(stderr, "offgraph %s: %s has no tokenizer: export it from a checkpoint folder that has tokenizer.json\n",
                cmd, path);
    else if (og_tokenizer_load_json(json, &t) != OG_OK ||
             og_tokenizer_load_config(t, og_program_tokenizer_config(p)) != OG_OK) {
        fprintf(stderr, "offgraph %s: the tokenizer of %s: %s\n", cmd, path, og_last_error());
        og_tokenizer_destroy(t);
        t = NULL;
    }
    og_program_close(p);
    return t;
}

int og_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *prompt = NULL;
    source src = {0};
    bool ids_list = false, pieces = false, count = false;
    unsigned flags = OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = source_option(cmd, argc, argv, &i, &src);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = og_cli_value(cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            ids_list = true;
        } else if (!strcmp(a, "--show-pieces")) {
            pieces = true;
        } else if (!strcmp(a, "--show-count")) {
            count = true;
        } else if (!strcmp(a, "--no-special")) {
            flags &= ~OG_TOKENIZE_ADD_SPECIAL;
        } else if (!strcmp(a, "--no-parse-special")) {
            flags &= ~OG_TOKENIZE_PARSE_SPECIAL;
        } else {
            fprintf(stderr, "offgraph %s: unknown option '%s'\n", cmd, a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (ids_list && pieces) {
        fprintf(stderr, "offgraph %s: --ids and --show-pieces exclude each other\n", cmd);
        return 2;
    }
    og_tokenizer *t = open_tokenizer(cmd, &src);
    if (!t) return 1;
    size_t len = prompt ? strlen(prompt) : 0;
    char *input = prompt ? NULL : og_cli_read_stream(cmd, stdin, "standard input", &len);
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = 1;
    if ((prompt || input) && og_tokenize(t, prompt ? prompt : input, len, flags, &ids, &n) != OG_OK)
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
    else if (prompt || input) {
        rc = 0;
        if (ids_list) putchar('[');
        for (int64_t i = 0; i < n && rc == 0; i++) {
            if (!pieces) {
                printf(ids_list ? "%s%d" : "%s%d", i ? (ids_list ? ", " : " ") : "", ids[i]);
                continue;
            }
            char *piece = NULL;
            if (og_token_piece(t, ids[i], &piece, NULL) != OG_OK) {
                fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
                rc = 1;
            } else
                printf("%6d -> '%s'\n", ids[i], piece);
            og_free(piece);
        }
        if (ids_list) putchar(']');
        if (!pieces) putchar('\n');
        if (count) printf("Total number of tokens: %lld\n", (long long)n);
    }
    og_free(ids);
    free(input);
    og_tokenizer_destroy(t);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "offgraph %s: cannot write standard output\n", cmd);
        rc = 1;
    }
    return rc;
}

int og_cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize";
    source src = {0};
    char *spec = NULL; /* the ids given as arguments, joined */
    size_t spec_len = 0;
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = source_option(cmd, argc, argv, &i, &src);
        if (r < 0) goto out;
        if (r) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            detokenize_usage(stdout);
            rc = 0;
            goto out;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "offgraph %s: unknown option '%s'\n", cmd, a);
            detokenize_usage(stderr);
            goto out;
        }
        size_t al = strlen(a);
        char *ns = realloc(spec, spec_len + al + 2);
        if (!ns) goto out;
        spec = ns;
        memcpy(spec + spec_len, a, al);
        spec_len += al;
        spec[spec_len++] = ' ';
        spec[spec_len] = 0;
    }
    rc = 1;
    if (!spec && !(spec = og_cli_read_stream(cmd, stdin, "standard input", &spec_len))) goto out;
    if (spec[0] != '@')
        for (char *p = spec; *p; p++)
            if (*p == '[' || *p == ']') *p = ' ';
    if (spec[0] == '@') /* one @FILE argument: og_cli_tokens reads it */
        for (char *p = spec + spec_len; p > spec && p[-1] == ' ';) *--p = 0;
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!og_cli_tokens(cmd, spec, &ids, &n)) goto out;
    og_tokenizer *t = open_tokenizer(cmd, &src);
    char *text = NULL;
    size_t len = 0;
    if (t && og_detokenize(t, ids, n, &text, &len) != OG_OK)
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
    else if (t) {
        fwrite(text, 1, len, stdout);
        putchar('\n');
        rc = fflush(stdout) == 0 ? 0 : 1;
    }
    og_free(text);
    og_tokenizer_destroy(t);
    free(ids);
out:
    free(spec);
    return rc;
}
