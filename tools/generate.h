/* Text generation shared by `offgraph run` and `offgraph chat`: a model, its
 * tokenizer, one session and a sampler; prefill, then decode token by token
 * with the text streamed out as it becomes complete. */
#ifndef OG_TOOLS_GENERATE_H
#define OG_TOOLS_GENERATE_H

#include "cli.h"
#include "text/textgen.h"
#include "exec/sample.h"
#include "text/tokenizer.h"
#include "offgraph.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The program run and chat use when no -m is given: the demo model the
 * build exports (NULL in a build without it). */
extern const char *const og_default_model_path;

typedef struct og_gen {
    og_model *model;
    og_engine *engine; /* og_gen_start_engine; NULL: none */
    og_session *session;
    og_tokenizer *tok;
    og_sampler *sampler;
    int32_t next;    /* the token drawn after the last position fed */
    int64_t vocab;
    int32_t stop[8]; /* tokens that end generation */
    int32_t n_stop;
    int64_t max_ctx; /* the most tokens a session holds (the program's max-context) */
    bool no_special; /* --no-special: og_gen_encode adds no special tokens */
    const char *const *stop_strings; /* ends generation, never written */
    int32_t n_stop_strings;
    /* when set (by a signal handler), og_gen_decode ends the reply at the
     * next token; NULL: never */
    volatile sig_atomic_t *interrupt;
} og_gen;

/* Options every generating command takes. */
typedef struct og_gen_options {
    og_cli_model_opts run;      /* -m, --backend, --threads, --kv-dtype */
    og_sampler_params sampling;
    int64_t max_tokens;
    bool no_special;            /* --no-special: no BOS or other post-processor tokens */
} og_gen_options;

void og_gen_default_options(og_gen_options *o);
/* If argv[*i] is a model, back-end or sampling option, reads it (advancing
 * *i) and returns 1; 0 if it is none of these; -1 (after a message) when
 * its value is bad. */
int og_gen_parse_option(const char *cmd, int argc, char **argv, int *i, og_gen_options *o);
/* The help text of those options. */
void og_gen_options_usage(FILE *f);

/* Loads the model and its tokenizer and makes a session and a sampler that
 * never draws an id the tokenizer does not know (a model's vocabulary is
 * often padded); prints what is missing (no -m, no tokenizer in the
 * program) and returns false. */
bool og_gen_open(const char *cmd, const og_gen_options *o, og_gen *g);
/* As og_gen_open without the session and the sampler (the model, its
 * tokenizer, stop ids and context): what og_gen_start_engine needs. */
bool og_gen_load(const char *cmd, const og_gen_options *o, og_gen *g);
/* An engine of one request at a time over g's model and tokenizer
 * (o's KV dtype; prefix_cache_bytes 0: no prefix cache). */
bool og_gen_start_engine(const char *cmd, const og_gen_options *o, og_gen *g, int64_t prefix_cache_bytes);
/* A request of o's sampling, max tokens (0: until the context is full) and
 * --no-special; its prompt is the caller's to set. */
og_request_params og_gen_request_params(const og_gen_options *o);
/* Writes r's text to out as it comes until it ends; *last gets its final
 * output (counts, times, finish reason; no text). When *interrupt becomes
 * set (a signal handler) the request is cancelled (finish CANCELLED). With
 * text, *text gets all the text written (og_free). False (after a message)
 * when the request failed. */
bool og_gen_stream(const char *cmd, og_request *r, FILE *out, volatile sig_atomic_t *interrupt,
                   og_request_output *last, char **text);
void og_gen_close(og_gen *g);
/* Adds a stop token (ignored when the table is full or id < 0). */
void og_gen_add_stop(og_gen *g, int32_t id);

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

/* Feeds n prompt tokens and, when draw (og_gen_decode will generate at
 * least one token), draws the token that follows them. */
bool og_gen_prefill(const char *cmd, og_gen *g, const int32_t *ids, int64_t n, bool draw);
/* How a generation ended. */
typedef struct og_gen_result {
    int64_t generated;  /* tokens written                                    */
    og_finish finish;   /* stop (token, string, interrupt) or length         */
    bool context_full;  /* it ended because the session reached max_ctx      */
    bool interrupted;   /* *g->interrupt ended it                            */
    char *text;         /* when asked: the text written (og_free)            */
    int32_t *ids;       /* when text is asked: the tokens fed to the session (og_free) */
    int64_t n_ids;
} og_gen_result;

/* Generates up to max tokens, writing their text to out as it completes
 * (og_textgen: the library's generation loop), until a stop token (not
 * written, not fed), a stop string (g->stop_strings; cut, never written),
 * the context limit (finish length: the session cannot take another
 * token) or an interrupt. Each written token is fed to
 * the session, which draws the next one (og_session_eval_sample: on a GPU
 * only the token comes back), the last one only when feed_last (chat keeps
 * its reply in the cache; run does not need it). With keep_text, r->text
 * gets the text written. */
bool og_gen_decode(const char *cmd, og_gen *g, int64_t max, bool feed_last, FILE *out, bool keep_text,
                   og_gen_result *r);

#endif
