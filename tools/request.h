/* What `offgraph run` and `offgraph chat` share around the library's engine
 * (og_engine): their options, the model and tokenizer they load, and the
 * printing of a request's text as it comes. No generation happens here:
 * prompts, stops, sampling and the context limit are the engine's. */
#ifndef OG_TOOLS_REQUEST_H
#define OG_TOOLS_REQUEST_H

#include "cli.h"
#include "offgraph.h"
#include "text/grammar.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The program run and chat use when no -m is given: the demo model the
 * build exports (NULL in a build without it). */
extern const char *const og_default_model_path;

typedef struct og_gen {
    og_model *model;
    og_tokenizer *tok;
    og_engine *engine; /* og_gen_start_engine; NULL: none */
    int64_t max_ctx;   /* the most tokens a session holds (the program's max-context) */
    bool no_special;   /* --no-special: og_gen_encode adds no special tokens */
    /* --grammar / --json-schema: the grammar every reply must follow, and a
     * matcher over it (the requests' constraint); NULL: free text */
    og_grammar *grammar;
    og_grammar_vocab *gvocab;
    og_matcher *matcher;
} og_gen;

/* Options every generating command takes. */
typedef struct og_gen_options {
    og_cli_model_opts run;      /* -m, --backend, --threads, --kv-dtype */
    og_sampler_params sampling;
    int64_t max_tokens;
    bool no_special;            /* --no-special: no BOS or other post-processor tokens */
    const char *grammar;        /* --grammar: a GBNF file (or GBNF text) */
    const char *json_schema;    /* --json-schema: a JSON schema file (or JSON text) */
} og_gen_options;

void og_gen_default_options(og_gen_options *o);
/* If argv[*i] is a model, back-end or sampling option, reads it (advancing
 * *i) and returns 1; 0 if it is none of these; -1 (after a message) when
 * its value is bad. */
int og_gen_parse_option(const char *cmd, int argc, char **argv, int *i, og_gen_options *o);
/* The help text of those options. */
void og_gen_options_usage(FILE *f);

/* Loads the model and its tokenizer (and compiles --grammar or
 * --json-schema, first); prints what is missing or wrong (no -m, no
 * tokenizer in the program, a grammar that does not parse, a schema
 * keyword not supported) and returns false. */
bool og_gen_load(const char *cmd, const og_gen_options *o, og_gen *g);
/* An engine of one request at a time over g's model and tokenizer
 * (o's KV dtype; prefix_cache_bytes 0: no prefix cache). */
bool og_gen_start_engine(const char *cmd, const og_gen_options *o, og_gen *g, int64_t prefix_cache_bytes);
/* A request of o's sampling, max tokens (0: until the context is full) and
 * --no-special; its prompt is the caller's to set. */
og_request_params og_gen_request_params(const og_gen_options *o);
/* Puts g's grammar (if any) on p: a matcher at the grammar's start as its
 * constraint. One request at a time. */
void og_gen_constrain(og_gen *g, og_request_params *p);
/* A request's text as it comes, and how it ended. */
typedef struct og_gen_reply {
    og_request_output last; /* its final output: counts, times, finish reason (no text) */
    char *text;             /* with keep: all the text written (og_free) */
    int32_t *ids;           /* with keep: the tokens generated (og_free) */
    int64_t n_ids;
} og_gen_reply;
/* Writes r's text to out as it comes until it ends; when *interrupt
 * becomes set (a signal handler) the request is cancelled (finish
 * CANCELLED). With keep, out->text and out->ids get what it generated.
 * False (after a message) when the request failed. */
bool og_gen_stream(const char *cmd, og_request *r, FILE *out, volatile sig_atomic_t *interrupt, bool keep,
                   og_gen_reply *reply);
void og_gen_close(og_gen *g);

/* Whether n prompt tokens fit the context (false after a message naming
 * the prompt's tokens, the limit and export --max-context): checked before
 * any step. */
bool og_gen_prompt_fits(const char *cmd, const og_gen *g, int64_t n);
/* Encodes text (special tokens written in it parsed) with, when special
 * and not --no-special, the special tokens the library's rule adds
 * (og_tokenize's OG_TOKENIZE_ADD_SPECIAL: the prompt of run); a rendered
 * chat is encoded without (!special), as transformers' apply_chat_template.
 * *ids owned by the caller (og_free). */
bool og_gen_encode(const char *cmd, const og_gen *g, const char *text, bool special, int32_t **ids, int64_t *n);

#endif
