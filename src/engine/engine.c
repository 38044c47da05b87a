/* The engine (include/offgraph.h, "the engine"): requests, admission under
 * max_sessions and kv_budget, the prefix cache, and the continuous-batching
 * scheduler that steps every running request together. */
#include "engine/engine.h"

#include "core/core.h"
#include "exec/exec.h"
#include "exec/sample.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

og_engine_params og_engine_default_params(void) {
    og_engine_params p;
    memset(&p, 0, sizeof p);
    p.session = og_session_default_params();
    p.max_sessions = 64;
    p.max_queue = 256;
    p.kv_budget = 0;
    p.prefix_cache_bytes = og_prefix_cache_default_params().budget_bytes;
    p.chunk = 256;
    p.step_rows = 512;
    return p;
}

og_request_params og_request_default_params(void) {
    og_request_params p;
    memset(&p, 0, sizeof p);
    p.kind = OG_PROMPT_TEXT;
    p.add_special = true;
    p.add_generation_prompt = true;
    p.sampling = og_sampler_default_params();
    p.logprobs = -1;
    return p;
}

/* ------------------------------------------------------------ requests */

static void req_free(og_request *r) {
    og_matcher_destroy(r->matcher);
    og_grammar_destroy(r->grammar);
    og_free(r->prompt);
    og_free(r->bias);
    for (int32_t i = 0; i < r->n_stops; i++) og_free(r->stops[i]);
    og_free(r->stops);
    og_free(r->text);
    og_free(r->toks);
    og_free(r->lps);
    og_free(r->out_text);
    og_free(r->out_toks);
    og_free(r->out_lps);
    og_sampler_destroy(r->sampler);
    og_textgen_destroy(r->tg);
    og_free(r->logits);
    og_free(r->gen);
    og_free(r->followers);
    pthread_cond_destroy(&r->cond);
    og_free(r);
}

static void release_locked(og_request *r) {
    if (--r->refs == 0) req_free(r);
}

/* ------------------------------------------------------------ KV estimates */

/* The smallest budget under which a fresh session reaches `tokens` tokens,
 * by the KV manager's own capacity estimate (growth peaks and allocator
 * rounding included). */
static int64_t kv_estimate(const og_engine *e, int64_t tokens) {
    const og_kv_session *kv = og_session_kv(e->probe);
    og_kv_capacity c;
    if (tokens < 1) tokens = 1;
    int64_t hi = 1 << 20;
    for (;;) {
        if (og_kv_session_capacity(kv, hi, &c) != OG_OK) return INT64_MAX;
        if (c.tokens_reachable >= tokens) break;
        if (hi > INT64_MAX / 4) return INT64_MAX;
        hi *= 2;
    }
    int64_t lo = 0; /* lo does not reach, hi does */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (og_kv_session_capacity(kv, mid, &c) == OG_OK && c.tokens_reachable >= tokens) hi = mid;
        else lo = mid;
    }
    return hi;
}

/* ------------------------------------------------------------ admission */

static int64_t charge_locked(const og_engine *e) {
    int64_t sum = 0;
    for (int32_t i = 0; i < e->p.max_sessions; i++) {
        const og_engine_slot *sl = &e->slots[i];
        int64_t c = sl->held;
        if (sl->owner && sl->owner->reserve_bytes > c) c = sl->owner->reserve_bytes;
        sum += c;
    }
    return sum;
}

static void slot_destroy(og_engine_slot *sl) {
    og_session_destroy(sl->session);
    sl->session = NULL;
    sl->held = sl->live = 0;
}

static void finish_locked(og_engine *e, og_request *r, og_finish_reason why, og_status st, const char *msg);

/* KV bytes the prefix cache's sessions hold (0 without one). */
static int64_t prefix_held(og_engine *e) {
    og_prefix_cache_metrics pm;
    if (!e->prefix || og_prefix_cache_metrics_get(e->prefix, &pm) != OG_OK) return 0;
    return pm.bytes_held;
}

/* Whether r fits the budget in slot k now, evicting idle sessions (their
 * storage) as needed, then prefix cache entries, least recently used first:
 * the cache only ever holds memory no request asked for. */
static bool fits_locked(og_engine *e, og_request *r, int32_t k) {
    if (e->p.kv_budget <= 0) return true;
    for (;;) {
        const og_engine_slot *sl = &e->slots[k];
        int64_t sessions = charge_locked(e) - sl->held + (sl->held > r->reserve_bytes ? sl->held : r->reserve_bytes);
        int64_t cached = prefix_held(e);
        if (sessions + cached <= e->p.kv_budget) return true;
        int32_t victim = -1;
        for (int32_t i = 0; i < e->p.max_sessions; i++)
            if (i != k && !e->slots[i].owner && e->slots[i].session &&
                (victim < 0 || e->slots[i].held > e->slots[victim].held))
                victim = i;
        if (victim < 0 && cached > 0) {
            if (og_prefix_cache_trim(e->prefix, e->p.kv_budget - sessions) < cached) continue;
        }
        if (victim < 0) {
            /* the chosen slot's own storage may be what is in the way */
            if (sl->session && sl->held > r->reserve_bytes) {
                slot_destroy(&e->slots[k]);
                continue;
            }
            return false;
        }
        slot_destroy(&e->slots[victim]);
    }
}

/* r starts from a fork of the cached session sharing the longest prefix
 * with its prompt (when there is one), in place of the slot's session, and
 * feeds only the rest. A failed lookup only means a full prefill.
 *
 * Exactness: a step of one token computes its rows along another path than
 * a wider step (on the CPU, f32 activations against bf16-rounded ones for a
 * bf16 program), so the cache keeps only rows that prompt steps wrote, and
 * at least two prompt tokens are left to feed: then every row the request
 * reads is what a full prefill of its prompt would have written, and greedy
 * output is the same with and without the cache. */
static void reuse_prefix_locked(og_engine *e, og_request *r, og_engine_slot *sl) {
    if (!e->prefix || r->n_prompt < 3) return;
    og_session *f = NULL;
    int64_t reused = 0;
    /* the lookup leaves at least one token of what it is given */
    if (og_prefix_cache_lookup(e->prefix, e->model, r->prompt, r->n_prompt - 1, &f, &reused) != OG_OK) {
        og_log(OG_LOG_WARN, "engine: prefix cache lookup: %s (the prompt is read in full)", og_last_error());
        return;
    }
    if (!f) return;
    slot_destroy(sl);
    sl->session = f;
    og_kv_metrics km;
    if (og_session_metrics(f, &km) == OG_OK) {
        sl->held = km.bytes_allocated;
        sl->live = km.bytes_live;
    }
    r->fed = r->reused = reused;
    e->prompt_tokens_reused += reused;
}

/* Puts into the prefix cache a fork of the session of r's slot holding the
 * rows its prompt steps wrote (reuse_prefix_locked says why not the
 * generated ones); the slot's session itself is reset and stays in the
 * pool. Prompts shorter than a key block are not kept: no lookup could find
 * them. */
static void cache_prompt_rows_locked(og_engine *e, og_request *r, og_engine_slot *sl) {
    if (!e->prefix || !sl->session) return;
    const int64_t L = og_session_length(sl->session);
    const int64_t n = L < r->fed ? L : r->fed;
    if (n < OG_ENGINE_PREFIX_BLOCK) return;
    og_session *cut = NULL;
    if (og_session_fork(sl->session, n, &cut) != OG_OK) {
        og_log(OG_LOG_WARN, "engine: prefix cache: %s", og_last_error());
        return;
    }
    if (og_prefix_cache_put(e->prefix, cut, r->prompt, n) != OG_OK) /* cut is gone either way */
        og_log(OG_LOG_WARN, "engine: prefix cache put: %s", og_last_error());
}

static bool start_locked(og_engine *e, og_request *r, int32_t k) {
    og_engine_slot *sl = &e->slots[k];
    og_status st = OG_OK;
    if (!sl->session && !r->own) st = og_session_create(e->model, &e->p.session, &sl->session);
    if (st == OG_OK) st = og_sampler_create(&r->sampling, e->vocab, &r->sampler);
    for (int32_t i = 0; st == OG_OK && i < e->n_forbidden; i++) st = og_sampler_forbid(r->sampler, e->forbidden[i]);
    if (st == OG_OK) /* the repetition penalty sees the prompt, as it always did in run */
        for (int64_t i = 0; i < r->n_prompt; i++) og_sampler_accept(r->sampler, r->prompt[i]);
    if (st == OG_OK && e->tok) {
        og_textgen_params tp = {.max_tokens = r->max_tokens,
                                .stop_ids = e->stop_ids,
                                .n_stop_ids = r->ignore_eos ? 0 : e->n_stop_ids,
                                .stop_strings = (const char *const *)r->stops,
                                .n_stop_strings = r->n_stops};
        st = og_textgen_create(e->tok, &tp, &r->tg);
    }
    if (st == OG_OK && (r->logprobs >= 0 || r->constraint || r->leader || r->n_followers) &&
        !(r->logits = og_malloc((size_t)e->vocab * sizeof(float))))
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a logits row");
    if (st != OG_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "cannot start the request: %s", og_last_error());
        finish_locked(e, r, OG_FINISH_ERROR, st, msg);
        return false;
    }
    sl->owner = r;
    r->slot = k;
    r->state = OG_REQ_RUNNING;
    r->fed = 0;
    if (r->own) { /* the caller's session takes the slot's place until r ends */
        slot_destroy(sl);
        sl->session = r->own;
        og_kv_metrics km;
        if (og_session_metrics(r->own, &km) == OG_OK) {
            sl->held = km.bytes_allocated;
            sl->live = km.bytes_live;
        }
    } else if (!r->leader)
        reuse_prefix_locked(e, r, sl); /* a follower forks its leader's rows */
    e->running[e->n_running++] = r;
    return true;
}

static void unlink_waiting_locked(og_engine *e, og_request *r) {
    og_request **pp = &e->wait_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next_waiting;
    }
    if (!*pp) return;
    *pp = r->next_waiting;
    if (e->wait_tail == r) e->wait_tail = prev;
    r->next_waiting = NULL;
    e->n_waiting--;
}

/* A slot no request holds (marked ones included), one with a session
 * first; -1 when none. */
static int32_t free_slot_locked(const og_engine *e) {
    int32_t k = -1;
    for (int32_t i = 0; i < e->p.max_sessions; i++) {
        if (e->slots[i].owner) continue;
        if (e->slots[i].session) return i;
        if (k < 0) k = i;
    }
    return k;
}

/* Moves waiting requests to running, first come first served, while a
 * session and the budget allow. The choices of one prompt (n > 1) start
 * together or wait together: each slot is marked as its choice's while the
 * next one's fit is judged, so the budget counts them all. The leader starts
 * last: a follower that cannot start leaves the group, and a leader that
 * cannot start hands its prompt to a follower (finish_locked). */
static void admit_locked(og_engine *e) {
    while (e->wait_head && !e->quit) {
        og_request *r = e->wait_head;
        const int32_t need = 1 + r->n_followers;
        if (e->n_running + need > e->p.max_sessions) return;
        int32_t got = 0;
        bool fit = true;
        for (int32_t m = 0; m < need && fit; m++) {
            og_request *who = m == 0 ? r : r->followers[m - 1];
            const int32_t k = free_slot_locked(e);
            fit = k >= 0 && fits_locked(e, who, k);
            if (fit) {
                e->slots[k].owner = who;
                e->pick[got++] = k;
            }
        }
        for (int32_t m = 0; m < got; m++) e->slots[e->pick[m]].owner = NULL;
        if (!fit) return;
        unlink_waiting_locked(e, r);
        og_request **members = r->followers;
        for (int32_t m = need - 1; m >= 1; m--) start_locked(e, members[m - 1], e->pick[m]);
        start_locked(e, r, e->pick[0]);
    }
}

/* The request's grammar (GBNF text or a JSON schema) and a matcher over the
 * engine's grammar vocabulary (made once, for the first such request): the
 * request's constraint. */
static og_status grammar_of(og_engine *e, og_request *r, const og_request_params *p) {
    if ((p->grammar && p->json_schema) || p->constraint)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_engine_submit: at most one of grammar, json_schema and constraint");
    if (!e->tok)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: a grammar needs an engine with a tokenizer");
    og_status st = p->grammar ? og_grammar_parse(p->grammar, strlen(p->grammar), &r->grammar)
                              : og_grammar_from_json_schema(p->json_schema, strlen(p->json_schema), &r->grammar);
    if (st != OG_OK) return og_set_error(st, "og_engine_submit: %s", og_last_error());
    pthread_mutex_lock(&e->gvocab_lock);
    if (!e->gvocab) st = og_grammar_vocab_create(e->tok, e->vocab, NULL, 0, &e->gvocab);
    pthread_mutex_unlock(&e->gvocab_lock);
    if (st == OG_OK) st = og_matcher_create(r->grammar, e->gvocab, &r->matcher);
    if (st != OG_OK) return og_set_error(st, "og_engine_submit: grammar: %s", og_last_error());
    r->constraint = og_grammar_constraint;
    r->constraint_ctx = r->matcher;
    return OG_OK;
}

static og_status copy_params(og_engine *e, og_request *r, const og_request_params *p) {
    r->sampling = p->sampling;
    r->sampling.logit_bias = NULL;
    r->sampling.n_logit_bias = 0;
    const og_sampler_params *sp = &p->sampling;
    if (sp->n_logit_bias < 0 || (sp->n_logit_bias && !sp->logit_bias))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: logit_bias NULL or a negative count");
    for (int32_t i = 0; i < sp->n_logit_bias; i++)
        if (sp->logit_bias[i].token < 0 || sp->logit_bias[i].token >= e->vocab || !isfinite(sp->logit_bias[i].bias))
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "og_engine_submit: logit_bias %d: token %d outside the vocabulary [0, %lld) or a "
                                "bias that is not finite", (int)i, (int)sp->logit_bias[i].token, (long long)e->vocab);
    if (!isfinite(sp->presence_penalty) || !isfinite(sp->frequency_penalty))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: a presence or frequency penalty is not finite");
    if (sp->n_logit_bias) {
        if (!(r->bias = og_malloc((size_t)sp->n_logit_bias * sizeof *r->bias)))
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
        memcpy(r->bias, sp->logit_bias, (size_t)sp->n_logit_bias * sizeof *r->bias);
        r->sampling.logit_bias = r->bias;
        r->sampling.n_logit_bias = sp->n_logit_bias;
    }
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs;
    r->constraint = p->constraint;
    r->constraint_ctx = p->constraint_ctx;
    r->own = p->session;
    if (r->own && r->own->m != e->model)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: the session is of another model");
    if (p->n_stop < 0 || (p->n_stop && !p->stop))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: stop strings NULL or a negative count");
    if (p->n_stop && !e->tok)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: stop strings need an engine with a tokenizer");
    if (p->n_stop) {
        if (!(r->stops = og_calloc((size_t)p->n_stop, sizeof *r->stops)))
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
        for (int32_t i = 0; i < p->n_stop; i++) {
            if (!p->stop[i]) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: stop string %d is NULL", i);
            if (!*p->stop[i]) continue;
            if (!(r->stops[r->n_stops] = og_strdup(p->stop[i])))
                return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
            r->n_stops++;
        }
    }
    if (p->grammar || p->json_schema) OG_TRY(grammar_of(e, r, p));
    if (p->logprobs < -1 || p->logprobs > OG_MAX_TOP_LOGPROBS)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: logprobs %d is outside [-1, %d]",
                            (int)p->logprobs, OG_MAX_TOP_LOGPROBS);
    if (p->max_tokens < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: max_tokens %lld is negative",
                            (long long)p->max_tokens);
    return OG_OK;
}

/* The budgets, decided here once: the prompt must fit the context; a
 * generation ends where the context is full (the last token drawn is never
 * fed, so a prompt of n tokens leaves room for ctx - n + 1); max_tokens 0
 * asks for as many as that and the whole KV budget allow one request; a
 * request whose prompt and max_tokens need more KV than the whole budget can
 * never run and is refused by name. */
static og_status resolve_budget(og_engine *e, og_request *r, int64_t asked) {
    /* a caller's session: what it holds comes first, and the last token is fed too */
    const int64_t held = r->own ? og_session_length(r->own) : 0;
    if (held + r->n_prompt > e->ctx) {
        if (held)
            return og_set_error(OG_ERR_CAPACITY,
                                "This model's maximum context length is %lld tokens; the session holds %lld tokens "
                                "and the prompt has %lld more",
                                (long long)e->ctx, (long long)held, (long long)r->n_prompt);
        return og_set_error(OG_ERR_CAPACITY,
                            "This model's maximum context length is %lld tokens; the prompt has %lld tokens",
                            (long long)e->ctx, (long long)r->n_prompt);
    }
    const int64_t room = e->ctx - held - r->n_prompt + (r->own ? 0 : 1);
    int64_t max = asked;
    if (max == 0) {
        max = room > 0 ? room : 1; /* none left: the first draw ends it (finish LENGTH) */
        if (e->p.kv_budget > 0 && held + r->n_prompt + max > e->budget_tokens) {
            max = e->budget_tokens - held - r->n_prompt;
            if (max < 1)
                return og_set_error(OG_ERR_CAPACITY,
                                    "the prompt of %lld tokens leaves no room to generate under the whole "
                                    "kv_budget of %lld bytes (a session reaches %lld tokens under it)",
                                    (long long)r->n_prompt, (long long)e->p.kv_budget, (long long)e->budget_tokens);
        }
    }
    r->max_tokens = max;
    int64_t tokens = held + r->n_prompt + max;
    if (tokens > e->ctx || tokens < 0) tokens = e->ctx;
    r->reserve_bytes = kv_estimate(e, tokens);
    if (e->p.kv_budget > 0 && r->reserve_bytes > e->p.kv_budget)
        return og_set_error(OG_ERR_CAPACITY,
                            "the request needs up to %lld bytes of KV cache (%lld prompt tokens + max_tokens %lld), "
                            "more than the whole kv_budget of %lld bytes; lower max_tokens or shorten the prompt",
                            (long long)r->reserve_bytes, (long long)r->n_prompt, (long long)max,
                            (long long)e->p.kv_budget);
    return OG_OK;
}

/* Whether a request not yet ended runs (or waits to run) on the caller's session s. */
static bool session_taken_locked(const og_engine *e, const og_session *s) {
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i]->own == s) return true;
    for (const og_request *w = e->wait_head; w; w = w->next_waiting)
        if (w->own == s) return true;
    return false;
}

static og_request *req_new(og_engine *e) {
    og_request *r = og_calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_cond_init(&r->cond, NULL) != 0) {
        og_free(r);
        return NULL;
    }
    r->e = e;
    r->refs = 1;
    r->slot = -1;
    return r;
}

/* Choice i > 0 of a request: its parameters and the leader's prompt and budget. */
static og_status follower_of(og_engine *e, const og_request *l, const og_request_params *p, int32_t i,
                             og_request *r) {
    OG_TRY(copy_params(e, r, p));
    if (!(r->prompt = og_malloc((size_t)l->n_prompt * sizeof *r->prompt)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit_n: no memory");
    memcpy(r->prompt, l->prompt, (size_t)l->n_prompt * sizeof *r->prompt);
    r->n_prompt = l->n_prompt;
    r->max_tokens = l->max_tokens;
    r->reserve_bytes = l->reserve_bytes;
    /* a seed the caller gave stays choice 0's; each other choice its own */
    if (r->sampling.seed) r->sampling.seed += (uint64_t)i * 0xD1B54A32D192ED03ull;
    return OG_OK;
}

og_status og_engine_submit(og_engine *e, const og_request_params *p, og_request **out) {
    if (out) *out = NULL;
    return og_engine_submit_n(e, p, 1, NULL, out);
}

og_status og_engine_submit_n(og_engine *e, const og_request_params *p, int32_t n, void *const *constraint_ctx,
                             og_request **out) {
    for (int32_t i = 0; out && i < n; i++) out[i] = NULL;
    if (!e || !p || !out || n < 1) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: NULL argument or n < 1");
    if (n > e->p.max_sessions)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_engine_submit_n: %d choices are more than the engine's max_sessions %d: they could "
                            "never run together", (int)n, (int)e->p.max_sessions);
    if (n > 1 && p->session)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit_n: choices cannot share one caller's session");
    og_request **rs = og_calloc((size_t)n, sizeof *rs);
    og_status st = rs ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
    for (int32_t i = 0; st == OG_OK && i < n; i++)
        if (!(rs[i] = req_new(e))) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
    og_request *r = st == OG_OK ? rs[0] : NULL;
    if (st == OG_OK) st = copy_params(e, r, p);
    if (st == OG_OK) st = og_engine_prompt(e, p, &r->prompt, &r->n_prompt);
    /* a caller's session is read only once no request runs on it (below) */
    if (st == OG_OK && !r->own) st = resolve_budget(e, r, p->max_tokens);
    for (int32_t i = 1; st == OG_OK && i < n; i++) st = follower_of(e, r, p, i, rs[i]);
    for (int32_t i = 0; st == OG_OK && constraint_ctx && p->constraint && i < n; i++)
        rs[i]->constraint_ctx = constraint_ctx[i];
    if (st == OG_OK && n > 1 && !(r->followers = og_calloc((size_t)(n - 1), sizeof *r->followers)))
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_submit: no memory");
    pthread_mutex_lock(&e->lock);
    if (st == OG_OK && e->stopping) st = og_set_error(OG_ERR_STATE, "the engine is shutting down");
    if (st == OG_OK && r->own && session_taken_locked(e, r->own))
        st = og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_submit: another request still runs on the session");
    /* no request runs on the caller's session (n is 1): no step writes it
     * while its length is read, which the lock keeps so until r is queued */
    if (st == OG_OK && r->own) st = resolve_budget(e, r, p->max_tokens);
    if (st == OG_OK) {
        const double now = og_time_now();
        for (int32_t i = 0; i < n; i++) {
            og_request *q = rs[i];
            uint64_t serial = ++e->seed_counter;
            if (q->sampling.seed == 0) q->sampling.seed = e->p.seed ^ (serial * 0x9E3779B97F4A7C15ull);
            q->t_submit = now;
            q->state = OG_REQ_WAITING;
            q->refs++; /* the scheduler's */
            if (i > 0) {
                q->leader = r;
                r->followers[r->n_followers++] = q;
            }
        }
        if (e->wait_tail) e->wait_tail->next_waiting = r;
        else e->wait_head = r;
        e->wait_tail = r;
        e->n_waiting++;
        admit_locked(e);
        if (r->state == OG_REQ_WAITING && e->n_waiting > e->p.max_queue) {
            /* past the queue's bound: r (and its group) is the last one in it */
            unlink_waiting_locked(e, r);
            for (int32_t i = 0; i < n; i++) rs[i]->refs--;
            st = og_set_error(OG_ERR_BUSY,
                              "the engine runs max_sessions %d requests or holds its kv_budget, and its wait queue "
                              "(max_queue %d) is full; retry later",
                              (int)e->p.max_sessions, (int)e->p.max_queue);
        }
    }
    if (st != OG_OK) {
        e->requests_rejected += n;
        pthread_mutex_unlock(&e->lock);
        for (int32_t i = 0; rs && i < n; i++)
            if (rs[i]) req_free(rs[i]);
        og_free(rs);
        return st;
    }
    pthread_cond_signal(&e->sched_cond);
    pthread_mutex_unlock(&e->lock);
    memcpy(out, rs, (size_t)n * sizeof *out);
    og_free(rs);
    return OG_OK;
}

/* ------------------------------------------------------------ finishing */

/* A leader ends before its prompt was read: its first follower becomes the
 * leader of the others and reads the prompt itself (it takes r's place in
 * the queue when r waits there). */
static void hand_over_prompt_locked(og_engine *e, og_request *r) {
    og_request *nl = r->followers[0];
    nl->leader = NULL;
    nl->followers = r->followers;
    nl->n_followers = r->n_followers - 1;
    memmove(nl->followers, nl->followers + 1, (size_t)nl->n_followers * sizeof *nl->followers);
    for (int32_t i = 0; i < nl->n_followers; i++) nl->followers[i]->leader = nl;
    r->followers = NULL;
    r->n_followers = 0;
    if (nl->state != OG_REQ_WAITING) {
        if (nl->state == OG_REQ_RUNNING && nl->slot >= 0) reuse_prefix_locked(e, nl, &e->slots[nl->slot]);
        return;
    }
    og_request **pp = &e->wait_head;
    while (*pp && *pp != r) pp = &(*pp)->next_waiting;
    if (*pp) { /* in r's place; r is then out of the queue */
        nl->next_waiting = r->next_waiting;
        *pp = nl;
        if (e->wait_tail == r) e->wait_tail = nl;
        r->next_waiting = NULL;
    } else { /* r left the queue to start: nl goes first */
        nl->next_waiting = e->wait_head;
        e->wait_head = nl;
        if (!e->wait_tail) e->wait_tail = nl;
        e->n_waiting++;
    }
}

/* Ends r: out of the waiting or running list, its session reset and back to
 * the pool. */
static void finish_locked(og_engine *e, og_request *r, og_finish_reason why, og_status st, const char *msg) {
    if (r->leader) { /* a choice still waiting for its leader's prompt leaves the group */
        og_request *l = r->leader;
        for (int32_t i = 0; i < l->n_followers; i++)
            if (l->followers[i] == r) {
                memmove(&l->followers[i], &l->followers[i + 1], (size_t)(l->n_followers - i - 1) * sizeof *l->followers);
                l->n_followers--;
                break;
            }
        r->leader = NULL;
    }
    if (r->n_followers) hand_over_prompt_locked(e, r);
    if (r->state == OG_REQ_WAITING) unlink_waiting_locked(e, r);
    if (r->state == OG_REQ_RUNNING) {
        for (int32_t i = 0; i < e->n_running; i++)
            if (e->running[i] == r) {
                memmove(&e->running[i], &e->running[i + 1], (size_t)(e->n_running - i - 1) * sizeof *e->running);
                e->n_running--;
                break;
            }
    }
    if (r->slot >= 0) {
        /* a request that ended well leaves its prompt's rows to the prefix cache */
        og_engine_slot *sl = &e->slots[r->slot];
        if (og_session_metrics(sl->session, &r->kv) != OG_OK) memset(&r->kv, 0, sizeof r->kv);
        if (r->own) { /* the caller's session goes back to the caller as it is */
            sl->session = NULL;
            sl->held = sl->live = 0;
        } else {
            if (why != OG_FINISH_ERROR && !r->forked) cache_prompt_rows_locked(e, r, sl); /* a fork's are its leader's */
            og_session_reset(sl->session);
            og_kv_metrics km;
            if (og_session_metrics(sl->session, &km) == OG_OK) {
                sl->held = km.bytes_allocated;
                sl->live = km.bytes_live;
            }
        }
        sl->owner = NULL;
        r->slot = -1;
    }
    og_sampler_destroy(r->sampler);
    r->sampler = NULL;
    og_textgen_destroy(r->tg);
    r->tg = NULL;
    og_free(r->logits);
    r->logits = NULL;
    r->state = OG_REQ_DONE;
    r->finish = why;
    r->status = why == OG_FINISH_ERROR ? (st != OG_OK ? st : OG_ERR_BACKEND) : OG_OK;
    r->t_end = og_time_now();
    if (!r->t_pending) r->t_pending = r->t_end; /* the end is output too */
    if (why == OG_FINISH_ERROR) {
        snprintf(r->error, sizeof r->error, "%s", msg ? msg : "error");
        e->requests_error++;
    } else if (why == OG_FINISH_CANCELLED) {
        e->requests_cancelled++;
    } else {
        e->requests_ok++;
    }
    pthread_cond_broadcast(&r->cond);
    pthread_cond_broadcast(&e->idle_cond);
    release_locked(r);
}

static void fail_waiting_locked(og_engine *e, og_status st, const char *msg) {
    while (e->wait_head) finish_locked(e, e->wait_head, OG_FINISH_ERROR, st, msg);
}

static bool grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *b = og_realloc(*p, (size_t)c * size);
    if (!b) return false;
    *p = b;
    *cap = c;
    return true;
}

static bool append_text(og_request *r, const char *t, size_t n) {
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = r->cap_text ? r->cap_text : 256;
        while (cap < r->n_text + n + 1) cap *= 2;
        char *b = og_realloc(r->text, cap);
        if (!b) return false;
        r->text = b;
        r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, t, n);
    r->n_text += n;
    r->text[r->n_text] = 0;
    return true;
}

/* Ends r's generation for the engine's reason (the context is full): what
 * the text generator held back goes out, then r finishes normally. */
static void end_locked(og_engine *e, og_request *r, og_finish_reason why) {
    const char *t;
    size_t n;
    if (r->tg && (og_textgen_end(r->tg, why, &t, &n) != OG_OK || !append_text(r, t, n))) {
        finish_locked(e, r, OG_FINISH_ERROR, OG_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    finish_locked(e, r, r->tg ? og_textgen_finish_reason(r->tg) : why, OG_OK, NULL);
}

/* A caller's session's request is cancelled: the text held back (a stop
 * string's possible start, a character's first bytes) goes out, as the
 * tokens it came from are in the session. */
static bool flush_locked(og_request *r) {
    const char *t;
    size_t n;
    return !r->tg || (og_textgen_end(r->tg, OG_FINISH_STOP, &t, &n) == OG_OK && append_text(r, t, n));
}

/* ------------------------------------------------------------ the step */

/* Whether r's constraint is a grammar (a matcher of the model's vocabulary
 * width) that the step applies as a mask (og_batch_item.allowed: on CUDA on
 * the device, and only the token comes back), rather than the hook on a
 * logits row brought back: a leader's prompt end is not, its followers draw
 * from its raw row. */
static bool masked_by_step(const og_engine *e, const og_request *r, bool prefill) {
    return r->constraint == og_grammar_constraint && og_matcher_width(r->constraint_ctx) == e->vocab &&
           !(prefill && r->n_followers);
}

/* The output of r's row; masked: its grammar's mask goes with the item. */
static og_step_output output_of(const og_engine *e, const og_request *r, bool masked) {
    /* a leader's followers draw their first tokens from its prompt's logits */
    if (r->logprobs >= 0 || (r->constraint && !masked) || r->n_followers) return OG_OUTPUT_LOGITS;
    const og_sampler_params *sp = &r->sampling;
    if (sp->temperature <= 0 && e->n_forbidden == 0 && sp->repeat_penalty == 1.0f && sp->presence_penalty == 0 &&
        sp->frequency_penalty == 0 && sp->n_logit_bias == 0)
        return OG_OUTPUT_ARGMAX;
    return OG_OUTPUT_SAMPLE;
}

/* Log-probabilities of the token and the n_top most likely, from logits. */
static void logprobs_of(const float *logits, int64_t V, int32_t token, int32_t n_top, og_token_logprob *out) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    out->token = token;
    out->logprob = (float)((double)logits[token] - lse);
    out->n_top = 0;
    for (int64_t i = 0; i < V && n_top > 0; i++) { /* insertion into the n_top best, ties: lower id first */
        int32_t k = out->n_top;
        if (k == n_top && !(logits[i] > logits[out->top[k - 1]])) continue;
        if (k < n_top) out->n_top++;
        else k--;
        while (k > 0 && logits[i] > logits[out->top[k - 1]]) {
            out->top[k] = out->top[k - 1];
            k--;
        }
        out->top[k] = (int32_t)i;
    }
    for (int32_t k = 0; k < out->n_top; k++) out->top_logprob[k] = (float)((double)logits[out->top[k]] - lse);
}

/* r drew `token` (lp: its log-probabilities when asked): its text, id and
 * log-probabilities go to the caller. */
static void take_token_locked(og_engine *e, og_request *r, int32_t token, const og_token_logprob *lp) {
    if (r->own && og_session_length(r->own) >= e->ctx) {
        /* a caller's session is full: the token could not be fed, so it is not given out */
        end_locked(e, r, OG_FINISH_LENGTH);
        return;
    }
    const double t_now = og_time_now(); /* the token's time: first, last, pending */
    if (!r->t_first) r->t_first = t_now;
    const int64_t before = r->completion_tokens;
    og_finish_reason fin = OG_FINISH_NONE;
    int64_t now = before + 1;
    if (r->tg) {
        const char *t;
        size_t n;
        if (og_textgen_push(r->tg, token, &t, &n, &fin) != OG_OK || !append_text(r, t, n)) {
            finish_locked(e, r, OG_FINISH_ERROR, OG_ERR_OUT_OF_MEMORY, og_last_error());
            return;
        }
        now = og_textgen_tokens(r->tg);
    } else if (now >= r->max_tokens) {
        fin = OG_FINISH_LENGTH;
    }
    e->generation_tokens_total += now - before;
    r->completion_tokens = now;
    if (now > before) {
        if (!grow((void **)&r->toks, &r->cap_toks, r->n_toks + 1, sizeof *r->toks) ||
            (r->constraint && !grow((void **)&r->gen, &r->cap_gen, r->n_gen + 1, sizeof *r->gen)) ||
            (lp && !grow((void **)&r->lps, &r->cap_lps, r->n_lps + 1, sizeof *r->lps))) {
            finish_locked(e, r, OG_FINISH_ERROR, OG_ERR_OUT_OF_MEMORY, "out of memory");
            return;
        }
        r->toks[r->n_toks++] = token;
        if (r->constraint) r->gen[r->n_gen++] = token;
        if (lp) r->lps[r->n_lps++] = *lp;
        r->unfed = r->own != NULL;
        r->t_last = t_now;
    }
    if (!r->t_pending && (r->n_text || r->n_toks)) r->t_pending = t_now;
    if (fin != OG_FINISH_NONE && r->unfed) {
        /* the caller's session takes the last token too: r ends once it is fed */
        r->final = fin;
        r->next = token;
        pthread_cond_broadcast(&r->cond);
        return;
    }
    if (fin != OG_FINISH_NONE) {
        finish_locked(e, r, fin, OG_OK, NULL);
        return;
    }
    r->next = token;
    r->wake = true; /* after the lock is let go: sched_main */
}

static void note_rate_locked(og_engine *e) {
    double now = og_time_now();
    int32_t last = (e->rate_i + 15) % 16;
    if (e->rate_n && now - e->rate_t[last] < 0.5) return;
    e->rate_t[e->rate_i] = now;
    e->rate_prompt[e->rate_i] = e->prompt_tokens_total;
    e->rate_gen[e->rate_i] = e->generation_tokens_total;
    e->rate_i = (e->rate_i + 1) % 16;
    if (e->rate_n < 16) e->rate_n++;
}

/* The end of a leader's prompt (its session at n_prompt): each follower
 * continues from a fork of it (one prefill for every choice) with the first
 * token it drew. scratch holds max_sessions pointers. */
static void fork_followers_locked(og_engine *e, og_request *r, og_session *s, og_request **scratch) {
    const int32_t n = r->n_followers;
    memcpy(scratch, r->followers, (size_t)n * sizeof *scratch);
    r->n_followers = 0; /* the group is over: each choice runs on its own */
    for (int32_t j = 0; j < n; j++) scratch[j]->leader = NULL;
    for (int32_t j = 0; j < n; j++) {
        og_request *f = scratch[j];
        og_engine_slot *sl = &e->slots[f->slot];
        og_session *fs = NULL;
        og_status st = og_session_fork(s, r->n_prompt, &fs);
        if (st != OG_OK) {
            char msg[256];
            snprintf(msg, sizeof msg, "cannot fork the prompt's session: %s", og_last_error());
            finish_locked(e, f, OG_FINISH_ERROR, st, msg);
            continue;
        }
        slot_destroy(sl);
        sl->session = fs;
        og_kv_metrics km;
        if (og_session_metrics(fs, &km) == OG_OK) {
            sl->held = km.bytes_allocated;
            sl->live = km.bytes_live;
        }
        f->fed = f->n_prompt;
        f->forked = true;
        take_token_locked(e, f, f->first, f->logprobs >= 0 ? &f->first_lp : NULL);
    }
}

typedef struct step_work {
    og_batch_item *items;
    og_request **owner;
    og_status *status;
    char (*why)[160];
    og_token_logprob *lp;
    og_request **wake;
} step_work;

static void *sched_main(void *arg) {
    og_engine *e = arg;
    const int32_t cap = e->p.max_sessions;
    step_work w = {og_calloc((size_t)cap, sizeof *w.items), og_calloc((size_t)cap, sizeof *w.owner),
                   og_calloc((size_t)cap, sizeof *w.status), og_calloc((size_t)cap, sizeof *w.why),
                   og_calloc((size_t)cap, sizeof *w.lp), og_calloc((size_t)cap, sizeof *w.wake)};
    og_request **snap = og_calloc((size_t)cap, sizeof *snap);
    double prev_end = 0; /* when the last step ended, 0 after a wait for work */
    pthread_mutex_lock(&e->lock);
    if (!w.items || !w.owner || !w.status || !w.why || !w.lp || !w.wake || !snap) {
        og_log(OG_LOG_ERROR, "engine: the scheduler has no memory");
        e->quit = true;
    }
    while (!e->quit) {
        admit_locked(e);
        int32_t n_snap = e->n_running;
        memcpy(snap, e->running, (size_t)n_snap * sizeof *snap);
        for (int32_t i = 0; i < n_snap; i++) {
            og_request *r = snap[i];
            if (r->final != OG_FINISH_NONE && !r->unfed && r->kill_status == OG_OK) {
                finish_locked(e, r, r->final, OG_OK, NULL); /* its last token is fed */
            } else if (r->cancelled) {
                if (r->kill_status != OG_OK) {
                    char why[sizeof r->error];
                    snprintf(why, sizeof why, "%s", r->error);
                    finish_locked(e, r, OG_FINISH_ERROR, r->kill_status, why);
                } else if (r->own && r->final == OG_FINISH_NONE && !flush_locked(r)) {
                    finish_locked(e, r, OG_FINISH_ERROR, OG_ERR_OUT_OF_MEMORY, "out of memory");
                } else if (r->unfed) { /* the token given out is fed first */
                    if (r->final == OG_FINISH_NONE) r->final = OG_FINISH_CANCELLED;
                } else finish_locked(e, r, OG_FINISH_CANCELLED, OG_OK, NULL);
            } else if (r->fed == r->n_prompt && og_session_length(e->slots[r->slot].session) + 1 > e->ctx) {
                end_locked(e, r, OG_FINISH_LENGTH); /* the context is full */
            }
        }
        if (e->n_running == 0) {
            prev_end = 0;
            if (!e->wait_head) pthread_cond_wait(&e->sched_cond, &e->lock);
            else {
                /* waiting requests that cannot start (budget): wait for a change */
                og_cond_wait_until(&e->sched_cond, &e->lock, og_time_now() + 0.05);
            }
            continue;
        }
        /* decode rows first, then prompt chunks under the row budget */
        int32_t n = 0, rows = 0, prefills = 0;
        for (int32_t i = 0; i < e->n_running; i++) {
            og_request *r = e->running[i];
            if (r->fed < r->n_prompt) continue;
            /* a caller's session's last token is fed, and nothing drawn after it */
            og_step_output o = r->final != OG_FINISH_NONE ? OG_OUTPUT_NONE : output_of(e, r, masked_by_step(e, r, false));
            w.items[n] = (og_batch_item){.session = e->slots[r->slot].session, .tokens = &r->next, .n_tokens = 1,
                                         .output = o, .logits = o == OG_OUTPUT_LOGITS ? r->logits : NULL,
                                         .sampler = o == OG_OUTPUT_SAMPLE ? r->sampler : NULL};
            w.owner[n++] = r;
            rows++;
        }
        for (int32_t i = 0; i < e->n_running; i++) {
            og_request *r = e->running[i];
            if (r->fed >= r->n_prompt || r->leader) continue; /* a follower forks its leader's prompt */
            int64_t T = r->n_prompt - r->fed, room = e->p.step_rows - rows;
            if (room <= 0 && prefills > 0) break;
            if (room <= 0) room = 32; /* decodes fill the budget: one small chunk still goes, so no prompt starves */
            prefills++;
            if (T > e->p.chunk) T = e->p.chunk;
            if (T > e->max_write) T = e->max_write;
            if (room > 0 && T > room) T = room;
            bool last = r->fed + T == r->n_prompt;
            og_step_output o = last ? output_of(e, r, masked_by_step(e, r, true)) : OG_OUTPUT_NONE;
            w.items[n] = (og_batch_item){.session = e->slots[r->slot].session, .tokens = r->prompt + r->fed,
                                         .n_tokens = (int32_t)T, .output = o,
                                         .logits = o == OG_OUTPUT_LOGITS ? r->logits : NULL,
                                         .sampler = o == OG_OUTPUT_SAMPLE ? r->sampler : NULL};
            w.owner[n++] = r;
            rows += (int32_t)T;
        }
        /* Waiters of the output the last step produced are woken only now,
         * the lock let go: a waiter woken under it would only sleep again on
         * the mutex (two more context switches a token). Running requests
         * stay alive until this thread ends them. */
        int32_t n_wake = 0;
        for (int32_t i = 0; i < e->n_running; i++)
            if (e->running[i]->wake) {
                e->running[i]->wake = false;
                w.wake[n_wake++] = e->running[i];
            }
        pthread_mutex_unlock(&e->lock);
        for (int32_t i = 0; i < n_wake; i++) pthread_cond_broadcast(&w.wake[i]->cond);
        /* the grammars' masks, outside the lock (a state's first mask walks
         * the vocabulary): each matcher is fed what its request drew, and
         * its mask is read by the step before this thread calls it again */
        for (int32_t i = 0; i < n; i++) {
            og_request *r = w.owner[i];
            og_batch_item *it = &w.items[i];
            if (it->output == OG_OUTPUT_NONE || !masked_by_step(e, r, it->tokens != &r->next)) continue;
            it->allowed = og_grammar_constraint_mask(r->constraint_ctx, r->gen, r->n_gen, e->vocab);
            if (!it->allowed) { /* not reached (masked_by_step checked the width): the hook masks the row */
                it->output = OG_OUTPUT_LOGITS;
                it->logits = r->logits;
                it->sampler = NULL;
            }
        }

        /* Outside the lock: the items' requests stay running (only this
         * thread ends them) and their samplers, logits and drawn tokens are
         * this thread's alone. */
        const double t_in = og_time_now();
        og_status st = og_model_step(e->model, w.items, n);
        double t_out = og_time_now();
        if (e->p.test_step_delay_s > 0) {
            struct timespec d = {(time_t)e->p.test_step_delay_s,
                                 (long)((e->p.test_step_delay_s - (double)(time_t)e->p.test_step_delay_s) * 1e9)};
            nanosleep(&d, NULL);
        }
        for (int32_t i = 0; i < n; i++) w.status[i] = st;
        if (st != OG_OK) {
            /* a step is one transaction: find who cannot step by stepping
             * each alone, so that one request's failure stalls no other */
            for (int32_t i = 0; i < n; i++) {
                w.status[i] = n == 1 ? st : og_model_step(e->model, &w.items[i], 1);
                if (w.status[i] != OG_OK) snprintf(w.why[i], sizeof w.why[i], "%s", og_last_error());
            }
            t_out = og_time_now(); /* the steps alone are step time, not the engine's own */
        }
        /* logits rows: the constraint, the draw, the log-probabilities */
        for (int32_t i = 0; i < n; i++) {
            og_request *r = w.owner[i];
            og_batch_item *it = &w.items[i];
            if (w.status[i] != OG_OK || it->output != OG_OUTPUT_LOGITS) continue;
            /* the end of a leader's prompt: each follower draws its first
             * token from a copy of the row (a constraint changes it); the
             * followers list changes only on this thread once they run */
            for (int32_t j = 0; r->n_followers && it->tokens != &r->next && j < r->n_followers; j++) {
                og_request *f = r->followers[j];
                memcpy(f->logits, r->logits, (size_t)e->vocab * sizeof *f->logits);
                if (f->constraint) f->constraint(f->constraint_ctx, f->gen, f->n_gen, f->logits, e->vocab);
                f->first = og_sampler_sample(f->sampler, f->logits);
                if (f->logprobs >= 0) logprobs_of(f->logits, e->vocab, f->first, f->logprobs, &f->first_lp);
            }
            /* a masked row came back masked (og_batch_item.allowed) */
            if (r->constraint && !it->allowed) r->constraint(r->constraint_ctx, r->gen, r->n_gen, r->logits, e->vocab);
            it->token = og_sampler_sample(r->sampler, r->logits);
            if (r->logprobs >= 0) logprobs_of(r->logits, e->vocab, it->token, r->logprobs, &w.lp[i]);
        }

        pthread_mutex_lock(&e->lock);
        e->steps_total++;
        e->step_rows_total += rows;
        e->step_seconds += t_out - t_in;
        if (prev_end > 0) e->step_gap_seconds += t_in - prev_end;
        prev_end = t_out;
        for (int32_t i = 0; i < n; i++) {
            og_request *r = w.owner[i];
            og_batch_item *it = &w.items[i];
            if (w.status[i] != OG_OK) {
                e->step_failures++;
                if (w.status[i] == OG_ERR_CAPACITY) {
                    end_locked(e, r, OG_FINISH_LENGTH);
                } else {
                    /* memory that ran out (the KV cache could not grow) may
                       come back (OG_ERR_OUT_OF_MEMORY); the others in the
                       batch go on */
                    char msg[256];
                    snprintf(msg, sizeof msg, "the model step failed: %s (%s)", w.why[i], og_status_str(w.status[i]));
                    finish_locked(e, r, OG_FINISH_ERROR, w.status[i], msg);
                }
                continue;
            }
            bool prefill = it->tokens != &r->next;
            if (prefill) {
                r->fed += it->n_tokens;
                e->prompt_tokens_total += it->n_tokens;
                /* a hybrid model holds its state only at the session's end:
                 * keep it where the prompt ends, for the prefix cache (or the
                 * caller, whose next prompt may go back there) */
                if (r->fed == r->n_prompt && (e->prefix || r->own)) og_session_checkpoint(it->session);
            } else
                r->unfed = false;
            /* the slot's KV figures (admission, the gauges) after every
             * prompt chunk and every 16th row of a generation: admission
             * counts a running request's reservation, which holds its
             * growth, so figures a few rows old change no decision */
            og_kv_metrics km;
            if ((prefill || og_session_length(it->session) % 16 == 0) &&
                og_session_metrics(it->session, &km) == OG_OK) {
                e->slots[r->slot].held = km.bytes_allocated;
                e->slots[r->slot].live = km.bytes_live;
            }
            if (it->output == OG_OUTPUT_NONE) continue;
            if (prefill && r->n_followers) fork_followers_locked(e, r, it->session, w.wake);
            take_token_locked(e, r, it->token, r->logprobs >= 0 ? &w.lp[i] : NULL);
        }
        note_rate_locked(e);
    }
    /* quitting: whatever is left ends */
    while (e->n_running)
        finish_locked(e, e->running[0], OG_FINISH_ERROR, OG_ERR_STATE, "the engine is shutting down");
    fail_waiting_locked(e, OG_ERR_STATE, "the engine is shutting down");
    pthread_mutex_unlock(&e->lock);
    og_free(w.items);
    og_free(w.owner);
    og_free(w.status);
    og_free(w.why);
    og_free(w.lp);
    og_free(w.wake);
    og_free(snap);
    return NULL;
}

/* ------------------------------------------------------------ life */

void og_engine_stop(og_engine *e, double grace_s) {
    if (!e) return;
    pthread_mutex_lock(&e->lock);
    e->stopping = true;
    fail_waiting_locked(e, OG_ERR_STATE, "the engine is shutting down");
    const double grace_end = og_time_now() + (grace_s > 0 ? grace_s : 0);
    while (e->n_running > 0 && og_time_now() < grace_end) og_cond_wait_until(&e->idle_cond, &e->lock, grace_end);
    if (e->n_running > 0) {
        for (int32_t i = 0; i < e->n_running; i++) {
            og_request *r = e->running[i];
            if (r->kill_status == OG_OK) {
                r->kill_status = OG_ERR_STATE; /* read by the scheduler when it drops r */
                snprintf(r->error, sizeof r->error, "the engine is shutting down");
            }
            r->cancelled = true;
        }
        pthread_cond_signal(&e->sched_cond);
    }
    while (e->n_running > 0 && e->thread_started) og_cond_wait_until(&e->idle_cond, &e->lock, og_time_now() + 0.1);
    pthread_mutex_unlock(&e->lock);
}

void og_engine_destroy(og_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        og_engine_stop(e, 0);
        pthread_mutex_lock(&e->lock);
        e->quit = true;
        pthread_cond_signal(&e->sched_cond);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->thread, NULL);
    }
    if (e->slots)
        for (int32_t i = 0; i < e->p.max_sessions; i++) og_session_destroy(e->slots[i].session);
    og_free(e->slots);
    og_free(e->running);
    og_free(e->pick);
    og_prefix_cache_destroy(e->prefix); /* its sessions go before the model */
    og_session_destroy(e->probe);
    og_free(e->forbidden);
    og_chat_template_destroy(e->chat);
    og_grammar_vocab_destroy(e->gvocab);
    pthread_mutex_destroy(&e->gvocab_lock);
    pthread_cond_destroy(&e->sched_cond);
    pthread_cond_destroy(&e->idle_cond);
    pthread_mutex_destroy(&e->lock);
    og_free(e);
}

og_status og_engine_create(og_model *m, og_tokenizer *tok, const og_engine_params *params, og_engine **out) {
    if (out) *out = NULL;
    if (!m || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_create: NULL model or out");
    og_engine_params p = params ? *params : og_engine_default_params();
    if (p.max_sessions < 1 || p.max_queue < 0 || p.chunk < 1 || p.step_rows < 1 || p.kv_budget < 0 ||
        p.prefix_cache_bytes < 0 || !(p.test_step_delay_s >= 0 && p.test_step_delay_s <= 60))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_engine_create: a parameter is out of range (max_sessions >= 1, max_queue >= 0, "
                            "chunk >= 1, step_rows >= 1, kv_budget >= 0, prefix_cache_bytes >= 0)");
    og_engine *e = og_calloc(1, sizeof *e);
    if (!e) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_create: no memory");
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->gvocab_lock, NULL);
    pthread_cond_init(&e->sched_cond, NULL);
    pthread_cond_init(&e->idle_cond, NULL);
    e->p = p;
    e->model = m;
    e->tok = tok;
    og_status st = OG_OK;
    e->slots = og_calloc((size_t)p.max_sessions, sizeof *e->slots);
    e->running = og_calloc((size_t)p.max_sessions, sizeof *e->running);
    e->pick = og_calloc((size_t)p.max_sessions, sizeof *e->pick);
    if (!e->slots || !e->running || !e->pick) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_create: no memory");
        goto fail;
    }
    const og_kv_config *kv = og_model_kv_config(m);
    e->ctx = kv->max_capacity;
    e->max_write = kv->max_write;
    e->vocab = og_model_vocab_size(m);
    if (!e->p.seed) e->p.seed = (uint64_t)time(NULL) * 0x2545F4914F6CDD1Dull ^ (uint64_t)(uintptr_t)e;
    if (tok) {
        e->n_stop_ids = og_tokenizer_stop_ids(tok, e->stop_ids, 8);
        if (e->n_stop_ids > 8) e->n_stop_ids = 8;
        for (int64_t i = 0; i < e->vocab; i++) {
            if (og_tokenizer_token_text(tok, (int32_t)i)) continue;
            if (!e->forbidden && !(e->forbidden = og_calloc((size_t)e->vocab, sizeof *e->forbidden))) {
                st = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_engine_create: no memory");
                goto fail;
            }
            e->forbidden[e->n_forbidden++] = (int32_t)i;
        }
        /* a template that does not parse is reported by each chat request */
        e->chat_status = og_chat_template_create(og_tokenizer_chat_template(tok), OG_CHAT_PLAIN, &e->chat);
        if (e->chat_status != OG_OK) {
            snprintf(e->chat_error, sizeof e->chat_error, "%s", og_last_error());
            e->chat = NULL;
        }
    }
    if ((st = og_session_create(m, &p.session, &e->probe)) != OG_OK) goto fail;
    if (p.kv_budget > 0) {
        og_kv_capacity c;
        if ((st = og_kv_session_capacity(og_session_kv(e->probe), p.kv_budget, &c)) != OG_OK) goto fail;
        e->budget_tokens = c.tokens_reachable;
    }
    if (p.prefix_cache_bytes > 0) {
        og_prefix_cache_params cp = {.budget_bytes = p.prefix_cache_bytes, .block_tokens = OG_ENGINE_PREFIX_BLOCK};
        if ((st = og_prefix_cache_create(&cp, &e->prefix)) != OG_OK) goto fail;
    }
    if (pthread_create(&e->thread, NULL, sched_main, e) != 0) {
        st = og_set_error(OG_ERR_BACKEND, "og_engine_create: cannot start the scheduler thread: %s", strerror(errno));
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return OG_OK;
fail:
    OG_RETURN_AFTER(st, og_engine_destroy(e));
}

int64_t og_engine_context(const og_engine *e) { return e ? e->ctx : 0; }

/* ------------------------------------------------------------ the caller's side */

og_status og_request_next(og_request *r, og_request_output *out, double timeout_s) {
    if (!r || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_request_next: NULL argument");
    og_engine *e = r->e;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->lock);
    if (r->n_text == 0 && r->n_toks == 0 && r->state != OG_REQ_DONE && timeout_s != 0) {
        const double until = og_time_now() + timeout_s;
        while (r->n_text == 0 && r->n_toks == 0 && r->state != OG_REQ_DONE) {
            if (timeout_s < 0) pthread_cond_wait(&r->cond, &e->lock);
            else if (og_cond_wait_until(&r->cond, &e->lock, until) == ETIMEDOUT) break;
        }
    }
    /* hand the pending buffers over; the caller's old ones take new output */
#define HAND_OVER(pending, cap_pending, given, cap_given) \
    do {                                                  \
        void *p_ = (given);                               \
        int64_t c_ = (int64_t)(cap_given);                \
        (given) = (pending);                              \
        (cap_given) = (cap_pending);                      \
        (pending) = p_;                                   \
        (cap_pending) = c_;                               \
    } while (0)
    HAND_OVER(r->text, r->cap_text, r->out_text, r->cap_out_text);
    HAND_OVER(r->toks, r->cap_toks, r->out_toks, r->cap_out_toks);
    HAND_OVER(r->lps, r->cap_lps, r->out_lps, r->cap_out_lps);
#undef HAND_OVER
    out->text = r->out_text ? r->out_text : "";
    out->n_text = r->n_text;
    r->n_text = 0;
    if (r->text) r->text[0] = 0;
    out->tokens = r->out_toks;
    out->n_tokens = r->n_toks;
    r->n_toks = 0;
    out->logprobs = r->out_lps;
    out->n_logprobs = r->n_lps;
    r->n_lps = 0;
    r->t_pending = 0;
    if (r->state == OG_REQ_DONE) {
        out->finish = r->finish;
        out->status = r->status;
        snprintf(out->error, sizeof out->error, "%s", r->finish == OG_FINISH_ERROR ? r->error : "");
        r->end_given = true;
    }
    out->prompt_tokens = r->n_prompt;
    out->reused_tokens = r->reused;
    out->completion_tokens = r->completion_tokens;
    out->t_submit = r->t_submit;
    out->t_first_token = r->t_first;
    out->t_end = r->t_end;
    out->t_last_token = r->t_last;
    if (r->state == OG_REQ_DONE) out->kv = r->kv;
    else memset(&out->kv, 0, sizeof out->kv);
    pthread_mutex_unlock(&e->lock);
    return OG_OK;
}

static void cancel_locked(og_engine *e, og_request *r) {
    if (r->state == OG_REQ_DONE) return;
    r->cancelled = true;
    if (r->state == OG_REQ_WAITING) finish_locked(e, r, OG_FINISH_CANCELLED, OG_OK, NULL);
    else pthread_cond_signal(&e->sched_cond);
}

void og_request_cancel(og_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->e->lock);
    cancel_locked(r->e, r);
    pthread_mutex_unlock(&r->e->lock);
}

void og_request_backlog(og_request *r, size_t *bytes, double *oldest) {
    if (!r) return;
    pthread_mutex_lock(&r->e->lock);
    if (bytes)
        *bytes = r->n_text + (size_t)r->n_toks * sizeof *r->toks + (size_t)r->n_lps * sizeof *r->lps;
    if (oldest) *oldest = r->t_pending;
    pthread_mutex_unlock(&r->e->lock);
}

void og_request_destroy(og_request *r) {
    if (!r) return;
    og_engine *e = r->e;
    pthread_mutex_lock(&e->lock);
    cancel_locked(e, r);
    /* a caller's session is the caller's again only once r has ended */
    while (r->own && r->state != OG_REQ_DONE) pthread_cond_wait(&r->cond, &e->lock);
    release_locked(r);
    pthread_mutex_unlock(&e->lock);
}

/* ------------------------------------------------------------ metrics */

static void metric(og_strbuf *b, const char *name, const char *type, const char *help, double v) {
    og_strbuf_printf(b, "# HELP offgraph_%s %s\n# TYPE offgraph_%s %s\noffgraph_%s %.17g\n", name, help, name, type, name, v);
}

char *og_engine_metrics_text(og_engine *e) {
    if (!e) return NULL;
    og_strbuf b = {0};
    pthread_mutex_lock(&e->lock);
    int32_t busy = 0, idle = 0;
    int64_t held = 0, live = 0, reserved = 0;
    for (int32_t i = 0; i < e->p.max_sessions; i++) {
        const og_engine_slot *sl = &e->slots[i];
        if (!sl->session) continue;
        if (sl->owner) busy++;
        else idle++;
        held += sl->held;
        live += sl->live;
        if (sl->owner) reserved += sl->owner->reserve_bytes > sl->held ? sl->owner->reserve_bytes : sl->held;
    }
    double prompt_rate = 0, gen_rate = 0, now = og_time_now();
    if (e->rate_n) { /* over the oldest sample of the last 10 s or so */
        int32_t o = e->rate_n < 16 ? 0 : e->rate_i;
        for (int32_t k = 0; k < e->rate_n; k++) {
            int32_t j = (o + k) % 16;
            if (now - e->rate_t[j] <= 10.5 || k == e->rate_n - 1) {
                double dt = now - e->rate_t[j];
                if (dt > 0.25) {
                    prompt_rate = (double)(e->prompt_tokens_total - e->rate_prompt[j]) / dt;
                    gen_rate = (double)(e->generation_tokens_total - e->rate_gen[j]) / dt;
                }
                break;
            }
        }
    }
    metric(&b, "requests_running", "gauge", "Requests generating now.", e->n_running);
    metric(&b, "requests_waiting", "gauge", "Requests waiting for a session or KV budget.", e->n_waiting);
    metric(&b, "sessions_busy", "gauge", "Sessions serving a request.", busy);
    metric(&b, "sessions_idle", "gauge", "Sessions kept in the pool for reuse.", idle);
    metric(&b, "sessions_max", "gauge", "The engine's max_sessions: requests that may generate at once.", e->p.max_sessions);
    metric(&b, "kv_bytes_backed", "gauge", "KV bytes the sessions hold (allocated).", (double)held);
    metric(&b, "kv_bytes_live", "gauge", "KV bytes of the tokens the sessions hold.", (double)live);
    metric(&b, "kv_bytes_reserved", "gauge", "KV bytes set aside for the running requests.", (double)reserved);
    metric(&b, "kv_budget_bytes", "gauge", "The engine's kv_budget: KV bytes all sessions and the prefix cache may hold (0: no bound).", (double)e->p.kv_budget);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens prefilled.", (double)e->prompt_tokens_total);
    metric(&b, "generation_tokens_total", "counter", "Tokens generated.", (double)e->generation_tokens_total);
    og_prefix_cache_metrics pm = {0};
    if (e->prefix) og_prefix_cache_metrics_get(e->prefix, &pm);
    metric(&b, "prefix_cache_lookups_total", "counter", "Requests that looked their prompt up in the prefix cache.",
           (double)pm.lookups);
    metric(&b, "prefix_cache_hits_total", "counter", "Requests that started from a cached prefix.", (double)pm.hits);
    metric(&b, "prompt_tokens_reused_total", "counter", "Prompt tokens taken from the prefix cache, not prefilled.",
           (double)e->prompt_tokens_reused);
    metric(&b, "prefix_cache_bytes_shared_total", "counter",
           "KV bytes the sessions started from the cache shared with it rather than copied.", (double)pm.bytes_shared);
    metric(&b, "prefix_cache_bytes_held", "gauge", "KV bytes the prefix cache's sessions hold (in the budget).",
           (double)pm.bytes_held);
    metric(&b, "prefix_cache_entries", "gauge", "Sessions the prefix cache holds.", (double)pm.entries);
    metric(&b, "prefix_cache_evictions_total", "counter", "Prefix cache entries evicted (its bound or the budget).",
           (double)pm.evictions);
    metric(&b, "prefix_cache_bytes_max", "gauge", "The engine's prefix_cache_bytes: KV bytes the prefix cache may hold (0: no cache).",
           (double)(e->prefix ? e->p.prefix_cache_bytes : 0));
    metric(&b, "prompt_tokens_per_second", "gauge", "Prompt tokens a second, over the last 10 s.", prompt_rate);
    metric(&b, "generation_tokens_per_second", "gauge", "Generated tokens a second, over the last 10 s.", gen_rate);
    metric(&b, "steps_total", "counter", "Batched model steps.", (double)e->steps_total);
    metric(&b, "step_rows_total", "counter", "Tokens those steps advanced.", (double)e->step_rows_total);
    metric(&b, "step_seconds_total", "counter", "Seconds the scheduler spent inside og_model_step.", e->step_seconds);
    metric(&b, "step_gap_seconds_total", "counter",
           "Seconds from the end of one step to the start of the next while requests ran: the scheduler's own "
           "work (admission, grammar masks, sampling rows on the host, bookkeeping, waking streams).",
           e->step_gap_seconds);
    metric(&b, "step_failures_total", "counter", "Requests a failed step ended.", (double)e->step_failures);
    og_strbuf_printf(&b, "# HELP offgraph_requests_total Requests ended, by outcome.\n# TYPE offgraph_requests_total counter\n");
    og_strbuf_printf(&b, "offgraph_requests_total{outcome=\"ok\"} %lld\n", (long long)e->requests_ok);
    og_strbuf_printf(&b, "offgraph_requests_total{outcome=\"error\"} %lld\n", (long long)e->requests_error);
    og_strbuf_printf(&b, "offgraph_requests_total{outcome=\"cancelled\"} %lld\n", (long long)e->requests_cancelled);
    og_strbuf_printf(&b, "offgraph_requests_total{outcome=\"rejected\"} %lld\n", (long long)e->requests_rejected);
    pthread_mutex_unlock(&e->lock);
    if (b.oom || !b.p) {
        og_free(b.p);
        return NULL;
    }
    return b.p;
}
