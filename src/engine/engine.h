/* The engine's inside (include/offgraph.h, "the engine", is its face):
 * requests, the scheduler that steps them, and the prompt policy
 * (prompt.c). Every field marked "lock" is read and written under
 * og_engine.lock only. */
#ifndef OG_ENGINE_ENGINE_H
#define OG_ENGINE_ENGINE_H

#include "text/chat_template.h"
#include "text/grammar.h"
#include "text/textgen.h"
#include "text/tokenizer.h"
#include "offgraph.h"

#include <pthread.h>
#include <stdbool.h>

/* Tokens in a prefix cache key block: a chat's system prompt is often
 * shorter than the library's default 64. */
#define OG_ENGINE_PREFIX_BLOCK 16

typedef enum og_req_state { OG_REQ_WAITING = 0, OG_REQ_RUNNING, OG_REQ_DONE } og_req_state;

struct og_request {
    og_engine *e;
    /* ---- set by og_engine_submit, read-only after */
    int32_t *prompt;            /* [n_prompt], owned */
    int64_t n_prompt;
    og_sampler_params sampling; /* its logit_bias points to bias */
    og_logit_bias *bias;        /* [sampling.n_logit_bias], owned */
    int64_t max_tokens;         /* >= 1: the engine's resolution of the caller's */
    char **stops;               /* [n_stops], owned */
    int32_t n_stops;
    bool ignore_eos;
    int32_t logprobs;           /* -1: none; else top alternatives wanted */
    og_constraint_fn constraint;
    void *constraint_ctx;
    og_session *own;            /* the caller's session (og_request_params.session);
                                   NULL: the slot's */
    og_grammar *grammar;        /* owned: the request's grammar or JSON schema */
    og_matcher *matcher;        /* owned: its position in it (the constraint's ctx) */
    int64_t reserve_bytes;      /* KV bytes admission sets aside for it */

    /* ---- lock */
    pthread_cond_t cond;        /* signalled when output, or the end, comes */
    int refs;                   /* the caller's and the scheduler's */
    og_req_state state;
    bool cancelled;             /* og_request_cancel, or the engine stops */
    bool wake;                  /* new output: its waiter is woken once the
                                   scheduler lets go of the lock */
    og_status kill_status;      /* the engine stops it: OG_ERR_STATE (finish
                                   ERROR); OG_OK: a plain cancel */
    char *text;                 /* output not yet taken by og_request_next */
    size_t n_text, cap_text;
    int32_t *toks;
    int32_t n_toks, cap_toks;
    og_token_logprob *lps;
    int32_t n_lps, cap_lps;
    int64_t completion_tokens;
    og_finish_reason finish;    /* when DONE */
    og_status status;           /* finish ERROR: why */
    char error[256];
    double t_submit, t_first, t_last, t_end;
    double t_pending;           /* when the oldest output not yet taken (text,
                                   tokens, or the end) was produced; 0: none */
    int64_t reused;             /* prompt tokens a cached prefix gave */
    og_kv_metrics kv;           /* its session's, taken as it ended (before the reset) */
    og_request *next_waiting;
    /* n > 1 (og_engine_submit_n): the choices wait and start together; the
     * leader reads the prompt, the followers fork its session at the prompt's
     * end and draw their first tokens from its logits row */
    og_request *leader;         /* a follower's, until the fork; NULL otherwise */
    og_request **followers;     /* the leader's: [n_followers] not yet forked */
    int32_t n_followers;

    /* ---- the caller's: what the last og_request_next gave out */
    char *out_text;
    size_t cap_out_text;
    int32_t *out_toks;
    int32_t cap_out_toks;
    og_token_logprob *out_lps;
    int32_t cap_out_lps;
    bool end_given;

    /* ---- the scheduler's own */
    int32_t slot;               /* session slot, -1 */
    og_sampler *sampler;
    og_textgen *tg;             /* NULL without a tokenizer */
    float *logits;              /* [vocab] when logprobs or a constraint */
    int32_t *gen;               /* [n_gen] the tokens drawn (the constraint's) */
    int32_t n_gen, cap_gen;
    int64_t fed;                /* prompt tokens fed */
    int32_t next;               /* the token drawn, to feed next */
    bool unfed;                 /* own's request: next was given out, not yet fed */
    og_finish_reason final;     /* own's request: how it ends once next is fed */
    bool forked;                /* its prompt's rows are its leader's */
    int32_t first;              /* a follower's first token, and its */
    og_token_logprob first_lp;  /* log-probabilities, drawn before the fork */
};

typedef struct og_engine_slot {
    og_session *session;        /* NULL until first used */
    og_request *owner;          /* NULL: idle */
    int64_t held;               /* KV bytes it holds (after the last step) */
    int64_t live;
} og_engine_slot;

struct og_engine {
    og_engine_params p;
    og_model *model;            /* borrowed */
    og_tokenizer *tok;          /* borrowed; NULL: token prompts only */
    og_session *probe;          /* never stepped: KV estimates */
    og_prefix_cache *prefix;    /* finished prompts by their tokens; NULL: off */
    og_chat_template *chat;     /* the model's chat template; NULL: chat_status says why */
    og_status chat_status;
    char chat_error[256];
    int64_t ctx;                /* max_capacity: the most tokens a session holds */
    int32_t max_write;
    int64_t vocab;
    int64_t budget_tokens;      /* tokens one session reaches under the whole
                                   kv_budget; 0 without a budget */
    int32_t *forbidden;         /* ids the tokenizer does not know */
    int32_t n_forbidden;
    int32_t stop_ids[8];        /* what ends a generation: og_tokenizer_stop_ids */
    int32_t n_stop_ids;
    pthread_mutex_t gvocab_lock;
    og_grammar_vocab *gvocab;   /* gvocab_lock: the vocabulary as grammars see
                                   it, made for the first request with one */

    pthread_mutex_t lock;
    pthread_cond_t sched_cond;  /* the scheduler waits on it for work */
    pthread_cond_t idle_cond;   /* signalled when a request finishes */
    pthread_t thread;
    bool thread_started;
    bool stopping;              /* lock: no new requests */
    bool quit;                  /* lock: the scheduler ends */
    og_request **running;       /* lock: [n_running] */
    int32_t n_running;
    og_request *wait_head, *wait_tail; /* lock */
    int32_t n_waiting;
    og_engine_slot *slots;      /* lock: [max_sessions] */
    int32_t *pick;              /* lock: [max_sessions] slots admission picks */
    uint64_t seed_counter;      /* lock */

    /* figures (lock) */
    int64_t prompt_tokens_total, generation_tokens_total;
    int64_t prompt_tokens_reused;  /* prompt tokens taken from the prefix cache */
    int64_t requests_ok, requests_error, requests_cancelled, requests_rejected;
    int64_t steps_total, step_rows_total, step_failures;
    /* seconds inside og_model_step, and between the end of one step and the
     * start of the next while requests run (the scheduler's own work) */
    double step_seconds, step_gap_seconds;
    double rate_t[16];          /* samples for the rates: time, totals */
    int64_t rate_prompt[16], rate_gen[16];
    int32_t rate_n, rate_i;
};

/* The one prompt policy (prompt.c): p's prompt as token ids of e's model.
 * On success *ids is owned by the caller (og_free) and *n >= 1. Errors as
 * og_engine_submit lists them, og_last_error() naming what is wrong. */
og_status og_engine_prompt(const og_engine *e, const og_request_params *p, int32_t **ids, int64_t *n);

#endif /* OG_ENGINE_ENGINE_H */
