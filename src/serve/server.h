/* The server's inside (serve.h is its face): the model, its tokenizer and
 * the engine that generates (include/offgraph.h, "the engine": admission,
 * budgets, the prefix cache and the scheduler are the engine's), and what
 * the HTTP side keeps. Fields marked "lock" are read and written under
 * og_server.lock only. */
#ifndef OG_SERVE_SERVER_H
#define OG_SERVE_SERVER_H

#include "text/tokenizer.h"
#include "serve/api.h"
#include "serve/serve.h"

#include <pthread.h>
#include <stdbool.h>

struct MHD_Daemon;
typedef struct og_http_guard og_http_guard;

struct og_server {
    og_serve_params p;
    char *model_path, *model_id, *host, *api_key; /* owned copies */
    og_model *model;
    og_tokenizer *tok;
    og_engine *engine;
    og_grammar_vocab *gvocab;   /* the vocabulary as grammars see it; NULL: the
                                   tokenizer has no end token (no response_format) */
    int64_t ctx;                /* the most tokens a session holds */
    int64_t created;            /* unix time of start */
    og_serve_ctx api;           /* what request parsing needs */

    pthread_mutex_t lock;
    pthread_cond_t idle_cond;   /* signalled when a response ends */
    bool stopping;              /* lock: /health says so */
    uint64_t serial;            /* lock: response ids */
    int active_responses;       /* lock: responses being written */

    struct MHD_Daemon *daemon;
    og_http_guard *guard;       /* http.c's: the connections and their deadlines */
    int32_t port;
    bool stopped;
};

/* The HTTP side (http.c). */
og_status og_http_start(og_server *s);
/* Stops accepting connections (open ones go on). */
void og_http_quiesce(og_server *s);
/* Closes every connection and joins the HTTP threads. */
void og_http_stop(og_server *s);
/* The HTTP side's Prometheus figures (connections, deadlines); owned by the
 * caller: og_free. NULL without memory. */
char *og_http_metrics_text(og_server *s);

#endif /* OG_SERVE_SERVER_H */
