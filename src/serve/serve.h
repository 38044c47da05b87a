/* offgraph serve: an OpenAI-compatible HTTP server over one model (the
 * command line's `offgraph serve` only parses its options and runs this).
 *
 * Generation is the library's engine's (include/offgraph.h, "the engine":
 * prompt policy, admission under max_sessions and kv_budget, the wait
 * queue, the prefix cache and the continuous-batching scheduler); the
 * server adapts requests to it. The HTTP side (libmicrohttpd, a thread per
 * connection) parses a request body into an engine request (api.c),
 * submits it, and writes what the engine produces as a response or a
 * stream of server-sent events (http.c); a request the engine's queue has
 * no room for is answered 429 with Retry-After. */
#ifndef OG_SERVE_H
#define OG_SERVE_H

#include "offgraph.h"

#include <stddef.h>
#include <stdint.h>

typedef struct og_serve_params {
    const char *model_path;     /* the program file (required)              */
    const char *model_id;       /* the name clients use; NULL: the file's
                                   base name without its extension          */
    og_model_params model;      /* back end, threads                        */
    og_session_params session;  /* KV dtype                                 */
    int64_t context;            /* most tokens of a session (og_model_set_context);
                                   0: the program's max-context            */
    uint64_t seed;              /* base of the seeds of requests that give
                                   none (og_engine_params.seed); 0: the clock */
    const char *host;           /* address to listen on (default 127.0.0.1) */
    int32_t port;               /* 0 picks a free port (og_server_port)     */
    int32_t max_sessions;       /* requests generating at once; 0 (default):
                                   OG_SERVE_SESSIONS_CUDA on the CUDA back
                                   end, OG_SERVE_SESSIONS_CPU on the CPU   */
    int64_t kv_budget;          /* KV bytes all sessions may hold; 0: no bound */
    int64_t prefix_cache_bytes; /* KV bytes of finished requests' sessions kept
                                   for prefix reuse (default 1 GiB; 0: none);
                                   counted in kv_budget, evicted before a
                                   request waits for memory                 */
    int32_t max_queue;          /* requests waiting to start (default 256)  */
    const char *api_key;        /* NULL: no auth; else Bearer on all but /health */
    size_t max_body;            /* request body limit in bytes (default 1 MiB) */
    int32_t chunk;              /* prompt tokens per step of one request (256) */
    int32_t step_rows;          /* rows (tokens) per step, all requests (512)  */
    double shutdown_grace_s;    /* og_server_stop: time running requests get
                                   to finish before they are cancelled (5)  */
    /* Connections (docs/decisions.md, "Slow and idle clients"). -1 picks
       the default: og_serve_resolve_params says which. */
    int32_t max_connections;    /* open at once (default: 2 x (max_sessions
                                   + max_queue) + 192)                      */
    int32_t max_connections_per_ip; /* open at once from one client address
                                   (default: max_sessions + max_queue + 64;
                                   0: no bound)                             */
    double header_timeout_s;    /* a request's headers must have arrived this
                                   long after the connection opened or the
                                   previous response ended (10); bytes do
                                   not extend it; past it: 408 and close    */
    int64_t min_body_rate;      /* a body must arrive at this many bytes a
                                   second on average, after header_timeout_s
                                   of grace (16 KiB); past it: 408 and close */
    double write_timeout_s;     /* output must reach the client's socket this
                                   long after it was produced (30); past it
                                   the request is cancelled and the
                                   connection closed                        */
    int log_requests;           /* one line per request on stderr           */
    double test_step_delay_s;   /* tests only: a pause after every batched
                                   step, as a slower model would take, so a
                                   test can keep requests running (0)       */
} og_serve_params;

/* The default max_sessions of each back end. */
#define OG_SERVE_SESSIONS_CUDA 256
#define OG_SERVE_SESSIONS_CPU 64

og_serve_params og_serve_default_params(void);
/* Replaces the defaults of p by the values they stand for: max_sessions 0
 * by the back end p->model picks (og_model_params_backend), then the -1
 * connection limits from max_sessions and max_queue. og_server_start does it
 * on its copy; a caller that sizes something by them (the open-file limit)
 * calls it first, after setting p->model. */
void og_serve_resolve_params(og_serve_params *p);

typedef struct og_server og_server;

/* Loads the model and its tokenizer, starts the scheduler and listens. On
 * success *out is owned by the caller: og_server_stop, then
 * og_server_destroy. On failure og_last_error() says why. */
og_status og_server_start(const og_serve_params *p, og_server **out);
/* The port it listens on (the one picked, for port 0). */
int32_t og_server_port(const og_server *s);
/* The model id clients name. Borrowed from s. */
const char *og_server_model_id(const og_server *s);
/* Stops accepting requests (waiting ones get 503), gives running ones
 * shutdown_grace_s to finish, cancels the rest (a stream ends with an error
 * event and [DONE]), then closes every connection. */
void og_server_stop(og_server *s);
/* Stops it if needed and frees everything. NULL is a no-op. */
void og_server_destroy(og_server *s);

#endif /* OG_SERVE_H */
