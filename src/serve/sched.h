/* The server's inside (serve.h is its face): requests, the scheduler that
 * steps them, and what the HTTP side and the scheduler share. Every field
 * marked "lock" is read and written under og_server.lock only. */
#ifndef OG_SERVE_SCHED_H
#define OG_SERVE_SCHED_H

#include "text/textgen.h"
#include "text/tokenizer.h"
#include "serve/api.h"
#include "serve/serve.h"

#include <pthread.h>
#include <stdbool.h>

#define OG_SERVE_MAX_TOP_LOGPROBS 20
#define OG_SERVE_MAX_STOPS 4
/* Tokens in a prefix cache key block: a chat's system prompt is often
 * shorter than the library's default 64. */
#define OG_SERVE_PREFIX_BLOCK 16

/* One generated token's log-probabilities (requests that ask for them). */
typedef struct og_serve_logprob {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top[OG_SERVE_MAX_TOP_LOGPROBS];
    float top_logprob[OG_SERVE_MAX_TOP_LOGPROBS];
} og_serve_logprob;

typedef enum og_req_state { OG_REQ_WAITING = 0, OG_REQ_RUNNING, OG_REQ_DONE } og_req_state;

typedef struct og_req og_req;
struct og_req {
    /* ---- set by the HTTP side before og_sched_submit, read-only after */
    int32_t *prompt;            /* [n_prompt], owned */
    int64_t n_prompt;
    og_sampler_params sampling;
    int64_t max_tokens;
    char *stops[OG_SERVE_MAX_STOPS]; /* owned */
    int32_t n_stops;
    int32_t stop_ids[8];
    int32_t n_stop_ids;
    int32_t logprobs;           /* -1: none; else top alternatives wanted (0..20) */
    int64_t reserve_bytes;      /* KV bytes admission sets aside for it */

    /* ---- lock */
    pthread_cond_t cond;        /* signalled when output, or the end, comes */
    int refs;                   /* the HTTP side's and the scheduler's */
    og_req_state state;
    bool cancelled;             /* the client left or the server stops */
    char *text;                 /* output not yet taken by the HTTP side */
    size_t n_text, cap_text;
    og_serve_logprob *lps;      /* [n_lps] not yet taken */
    int32_t n_lps, cap_lps;
    int64_t completion_tokens;
    og_finish finish;           /* when DONE without error */
    int http_error;             /* when DONE with an error: its HTTP status */
    char error[256];            /* ... and its message */
    double t_submit, t_first;   /* og_time_now at submit, at the first token */
    double t_pending;           /* og_time_now when the oldest output not yet
                                   taken (text, logprobs, or the end) was
                                   produced; 0: none. The HTTP side's write
                                   deadline reads it */
    double t_sending;           /* the HTTP side's: when the oldest output it
                                   took but the socket has not yet accepted
                                   was produced; 0: none */
    og_req *next_waiting;

    /* ---- the scheduler's own */
    int32_t slot;               /* session slot, -1 */
    og_sampler *sampler;
    og_textgen *tg;
    float *logits;              /* [vocab] when logprobs */
    int64_t fed;                /* prompt tokens fed */
    int64_t reused;             /* prompt tokens a cached prefix gave (set at
                                   admission; the HTTP side reads it under
                                   the lock for usage) */
    int32_t next;               /* the token drawn, to feed next */
};

typedef struct og_serve_slot {
    og_session *session;        /* NULL until first used */
    og_req *owner;              /* NULL: idle */
    int64_t held;               /* KV bytes it holds (after the last step) */
    int64_t live;
} og_serve_slot;

struct MHD_Daemon;
typedef struct og_http_guard og_http_guard;

struct og_server {
    og_serve_params p;
    char *model_path, *model_id, *host, *api_key; /* owned copies */
    og_model *model;
    og_tokenizer *tok;
    og_session *probe;          /* never stepped: KV estimates */
    og_prefix_cache *prefix;    /* finished sessions by their tokens; NULL: off */
    int64_t ctx;                /* max_capacity: the most tokens a session holds */
    int32_t max_write;
    int64_t vocab;
    int32_t *forbidden;         /* ids the tokenizer does not know */
    int32_t n_forbidden;
    int32_t stop_ids[8];        /* what ends a generation: og_tokenizer_stop_ids */
    int32_t n_stop_ids;
    int chat_format;            /* og_chat_format */
    int64_t created;            /* unix time of start */
    og_serve_ctx api;           /* what request parsing needs */
    struct og_chat_template *chat; /* the model's chat template, parsed at start (api.chat); NULL if it did not parse */

    pthread_mutex_t lock;
    pthread_cond_t sched_cond;  /* the scheduler waits on it for work */
    pthread_cond_t idle_cond;   /* signalled when a request finishes */
    pthread_t thread;
    bool thread_started;
    bool stopping;              /* lock: no new requests */
    bool quit;                  /* lock: the scheduler ends */
    og_req **running;           /* lock: [n_running] */
    int32_t n_running;
    og_req *wait_head, *wait_tail; /* lock */
    int32_t n_waiting;
    og_serve_slot *slots;       /* lock: [max_sessions] */
    uint64_t seed_counter;      /* lock */

    /* figures (lock) */
    int64_t prompt_tokens_total, generation_tokens_total;
    int64_t prompt_tokens_reused;  /* prompt tokens taken from the prefix cache */
    int64_t requests_ok, requests_error, requests_cancelled, requests_rejected;
    int64_t steps_total, step_rows_total, step_failures;
    double rate_t[16];          /* samples for the rates: time, totals */
    int64_t rate_prompt[16], rate_gen[16];
    int32_t rate_n, rate_i;

    struct MHD_Daemon *daemon;
    og_http_guard *guard;       /* http.c's: the connections and their deadlines */
    int32_t port;
    int active_responses;       /* lock: responses being written */
    bool stopped;
};

/* What og_sched_submit says. */
typedef enum og_submit {
    OG_SUBMIT_OK = 0,
    OG_SUBMIT_QUEUE_FULL,   /* 429 */
    OG_SUBMIT_STOPPING,     /* 503 */
    OG_SUBMIT_TOO_LARGE     /* 400: needs more KV than the whole budget */
} og_submit;

/* A new request with one reference (the caller's); NULL without memory. */
og_req *og_req_create(void);
/* Drops a reference (lock taken inside); frees on the last. */
void og_req_release(og_server *s, og_req *r);
/* KV bytes a session holding `tokens` tokens may need at most. */
int64_t og_sched_kv_estimate(og_server *s, int64_t tokens);
/* Queues r (taking a reference for the scheduler) and wakes the scheduler.
 * *detail gets a message for OG_SUBMIT_TOO_LARGE. */
og_submit og_sched_submit(og_server *s, og_req *r, char *detail, size_t detail_cap);
/* Marks r cancelled (the client left); the scheduler drops it at its next
 * step and frees its session. */
void og_sched_cancel(og_server *s, og_req *r);
/* Starts and stops the scheduler thread. */
og_status og_sched_start(og_server *s);
void og_sched_stop(og_server *s);
/* Ends every waiting request with 503 (stopping). */
void og_sched_fail_waiting_locked(og_server *s, int http, const char *msg);
/* Cancels every running request with an error (shutdown past the grace). */
void og_sched_cancel_running_locked(og_server *s, const char *msg);
/* Appends the Prometheus text of the figures to a growable buffer;
 * takes the lock. Owned by the caller: og_free. NULL without memory. */
char *og_sched_metrics_text(og_server *s);

/* The HTTP side (http.c). */
og_status og_http_start(og_server *s);
/* Stops accepting connections (open ones go on). */
void og_http_quiesce(og_server *s);
/* Closes every connection and joins the HTTP threads. */
void og_http_stop(og_server *s);
/* The HTTP side's Prometheus figures (connections, deadlines); owned by the
 * caller: og_free. NULL without memory. */
char *og_http_metrics_text(og_server *s);

#endif /* OG_SERVE_SCHED_H */
