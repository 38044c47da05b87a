/* The scheduler: admission under --max-sessions and --kv-budget, and the
 * loop that steps every running request together (see serve.h). */
#include "serve/sched.h"

#include "core/core.h"
#include "exec/sample.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ requests */

og_req *og_req_create(void) {
    og_req *r = og_calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_cond_init(&r->cond, NULL) != 0) {
        og_free(r);
        return NULL;
    }
    r->refs = 1;
    r->slot = -1;
    r->logprobs = -1;
    return r;
}

static void req_free(og_req *r) {
    og_free(r->prompt);
    for (int32_t i = 0; i < r->n_stops; i++) og_free(r->stops[i]);
    og_free(r->text);
    og_free(r->lps);
    og_sampler_destroy(r->sampler);
    og_textgen_destroy(r->tg);
    og_free(r->logits);
    pthread_cond_destroy(&r->cond);
    og_free(r);
}

static void release_locked(og_req *r) {
    if (--r->refs == 0) req_free(r);
}

void og_req_release(og_server *s, og_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->lock);
    release_locked(r);
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ KV estimates */

/* The smallest budget under which a fresh session reaches `tokens` tokens,
 * by the KV manager's own capacity estimate (growth peaks and allocator
 * rounding included). */
int64_t og_sched_kv_estimate(og_server *s, int64_t tokens) {
    const og_kv_session *kv = og_session_kv(s->probe);
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

static int64_t charge_locked(const og_server *s) {
    int64_t sum = 0;
    for (int32_t i = 0; i < s->p.max_sessions; i++) {
        const og_serve_slot *sl = &s->slots[i];
        int64_t c = sl->held;
        if (sl->owner && sl->owner->reserve_bytes > c) c = sl->owner->reserve_bytes;
        sum += c;
    }
    return sum;
}

static void slot_destroy(og_serve_slot *sl) {
    og_session_destroy(sl->session);
    sl->session = NULL;
    sl->held = sl->live = 0;
}

static void finish_locked(og_server *s, og_req *r, int http_error, const char *msg);

/* KV bytes the prefix cache's sessions hold (0 without one). */
static int64_t prefix_held(og_server *s) {
    og_prefix_cache_metrics pm;
    if (!s->prefix || og_prefix_cache_metrics_get(s->prefix, &pm) != OG_OK) return 0;
    return pm.bytes_held;
}

/* Whether r fits the budget in slot k now, evicting idle sessions (their
 * storage) as needed, then prefix cache entries, least recently used first:
 * the cache only ever holds memory no request asked for. */
static bool fits_locked(og_server *s, og_req *r, int32_t k) {
    if (s->p.kv_budget <= 0) return true;
    for (;;) {
        const og_serve_slot *sl = &s->slots[k];
        int64_t sessions = charge_locked(s) - sl->held + (sl->held > r->reserve_bytes ? sl->held : r->reserve_bytes);
        int64_t cached = prefix_held(s);
        if (sessions + cached <= s->p.kv_budget) return true;
        int32_t victim = -1;
        for (int32_t i = 0; i < s->p.max_sessions; i++)
            if (i != k && !s->slots[i].owner && s->slots[i].session &&
                (victim < 0 || s->slots[i].held > s->slots[victim].held))
                victim = i;
        if (victim < 0 && cached > 0) {
            if (og_prefix_cache_trim(s->prefix, s->p.kv_budget - sessions) < cached) continue;
        }
        if (victim < 0) {
            /* the chosen slot's own storage may be what is in the way */
            if (sl->session && sl->held > r->reserve_bytes) {
                slot_destroy(&s->slots[k]);
                continue;
            }
            return false;
        }
        slot_destroy(&s->slots[victim]);
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
static void reuse_prefix_locked(og_server *s, og_req *r, og_serve_slot *sl) {
    if (!s->prefix || r->n_prompt < 3) return;
    og_session *f = NULL;
    int64_t reused = 0;
    /* the lookup leaves at least one token of what it is given */
    if (og_prefix_cache_lookup(s->prefix, s->model, r->prompt, r->n_prompt - 1, &f, &reused) != OG_OK) {
        og_log(OG_LOG_WARN, "serve: prefix cache lookup: %s (the prompt is read in full)", og_last_error());
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
    s->prompt_tokens_reused += reused;
}

/* Puts into the prefix cache a fork of the session of r's slot holding the
 * rows its prompt steps wrote (reuse_prefix_locked says why not the
 * generated ones); the slot's session itself is reset and stays in the
 * pool. Prompts shorter than a key block are not kept: no lookup could find
 * them. */
static void cache_prompt_rows_locked(og_server *s, og_req *r, og_serve_slot *sl) {
    if (!s->prefix || !sl->session) return;
    const int64_t L = og_session_length(sl->session);
    const int64_t n = L < r->fed ? L : r->fed;
    if (n < OG_SERVE_PREFIX_BLOCK) return;
    og_session *cut = NULL;
    if (og_session_fork(sl->session, n, &cut) != OG_OK) {
        og_log(OG_LOG_WARN, "serve: prefix cache: %s", og_last_error());
        return;
    }
    if (og_prefix_cache_put(s->prefix, cut, r->prompt, n) != OG_OK) /* cut is gone either way */
        og_log(OG_LOG_WARN, "serve: prefix cache put: %s", og_last_error());
}

static bool start_locked(og_server *s, og_req *r, int32_t k) {
    og_serve_slot *sl = &s->slots[k];
    og_status st = OG_OK;
    if (!sl->session) st = og_session_create(s->model, &s->p.session, &sl->session);
    if (st == OG_OK) st = og_sampler_create(&r->sampling, s->vocab, &r->sampler);
    for (int32_t i = 0; st == OG_OK && i < s->n_forbidden; i++) st = og_sampler_forbid(r->sampler, s->forbidden[i]);
    if (st == OG_OK) {
        og_textgen_params tp = {.max_tokens = r->max_tokens,
                                .stop_ids = r->stop_ids,
                                .n_stop_ids = r->n_stop_ids,
                                .stop_strings = (const char *const *)r->stops,
                                .n_stop_strings = r->n_stops};
        st = og_textgen_create(s->tok, &tp, &r->tg);
    }
    if (st == OG_OK && r->logprobs >= 0 && !(r->logits = og_malloc((size_t)s->vocab * sizeof(float))))
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a logits row");
    if (st != OG_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "cannot start the request: %s", og_last_error());
        finish_locked(s, r, 500, msg);
        return false;
    }
    sl->owner = r;
    r->slot = k;
    r->state = OG_REQ_RUNNING;
    r->fed = 0;
    reuse_prefix_locked(s, r, sl);
    s->running[s->n_running++] = r;
    return true;
}

static og_req *pop_waiting_locked(og_server *s) {
    og_req *r = s->wait_head;
    if (!r) return NULL;
    s->wait_head = r->next_waiting;
    if (!s->wait_head) s->wait_tail = NULL;
    r->next_waiting = NULL;
    s->n_waiting--;
    return r;
}

/* Moves waiting requests to running, first come first served, while a
 * session and the budget allow. */
static void admit_locked(og_server *s) {
    while (s->wait_head && s->n_running < s->p.max_sessions && !s->quit) {
        og_req *r = s->wait_head;
        if (r->cancelled) {
            pop_waiting_locked(s);
            finish_locked(s, r, 0, NULL);
            continue;
        }
        int32_t k = -1;
        for (int32_t i = 0; i < s->p.max_sessions; i++) {
            if (s->slots[i].owner) continue;
            if (s->slots[i].session) {
                k = i;
                break;
            }
            if (k < 0) k = i;
        }
        if (k < 0 || !fits_locked(s, r, k)) return;
        pop_waiting_locked(s);
        start_locked(s, r, k);
    }
}

og_submit og_sched_submit(og_server *s, og_req *r, char *detail, size_t detail_cap) {
    int64_t tokens = r->n_prompt + r->max_tokens;
    if (tokens > s->ctx) tokens = s->ctx;
    r->reserve_bytes = og_sched_kv_estimate(s, tokens);
    pthread_mutex_lock(&s->lock);
    og_submit res = OG_SUBMIT_OK;
    if (s->stopping) res = OG_SUBMIT_STOPPING;
    else if (s->p.kv_budget > 0 && r->reserve_bytes > s->p.kv_budget) {
        snprintf(detail, detail_cap,
                 "the request needs up to %lld bytes of KV cache (%lld prompt tokens + max_tokens %lld), more than "
                 "the server's whole --kv-budget of %lld bytes; lower max_tokens or shorten the prompt",
                 (long long)r->reserve_bytes, (long long)r->n_prompt, (long long)r->max_tokens,
                 (long long)s->p.kv_budget);
        res = OG_SUBMIT_TOO_LARGE;
    }
    if (res == OG_SUBMIT_OK) {
        r->t_submit = og_time_now();
        r->state = OG_REQ_WAITING;
        r->refs++;
        if (s->wait_tail) s->wait_tail->next_waiting = r;
        else s->wait_head = r;
        s->wait_tail = r;
        s->n_waiting++;
        admit_locked(s);
        if (r->state == OG_REQ_WAITING && s->n_waiting > s->p.max_queue) {
            /* past the queue's bound: r is the last one in it */
            og_req **pp = &s->wait_head, *prev = NULL;
            while (*pp != r) {
                prev = *pp;
                pp = &(*pp)->next_waiting;
            }
            *pp = r->next_waiting;
            if (s->wait_tail == r) s->wait_tail = prev;
            s->n_waiting--;
            r->state = OG_REQ_DONE;
            r->refs--;
            res = OG_SUBMIT_QUEUE_FULL;
        }
    }
    if (res != OG_SUBMIT_OK) s->requests_rejected++;
    else pthread_cond_signal(&s->sched_cond);
    pthread_mutex_unlock(&s->lock);
    return res;
}

void og_sched_cancel(og_server *s, og_req *r) {
    pthread_mutex_lock(&s->lock);
    if (r->state != OG_REQ_DONE) {
        r->cancelled = true;
        pthread_cond_signal(&s->sched_cond);
    }
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ finishing */

/* Ends r: out of the running list, its session reset and back to the pool;
 * http_error 0 is a normal end (r->finish says how), else an error. */
static void finish_locked(og_server *s, og_req *r, int http_error, const char *msg) {
    if (r->state == OG_REQ_RUNNING) {
        for (int32_t i = 0; i < s->n_running; i++)
            if (s->running[i] == r) {
                memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
                s->n_running--;
                break;
            }
    }
    if (r->slot >= 0) {
        /* a request that ended well leaves its prompt's rows to the prefix cache */
        og_serve_slot *sl = &s->slots[r->slot];
        if (!http_error) cache_prompt_rows_locked(s, r, sl);
        og_session_reset(sl->session);
        og_kv_metrics km;
        if (og_session_metrics(sl->session, &km) == OG_OK) {
            sl->held = km.bytes_allocated;
            sl->live = km.bytes_live;
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
    if (!r->t_pending) r->t_pending = og_time_now(); /* the end is output too */
    if (http_error) {
        r->http_error = http_error;
        snprintf(r->error, sizeof r->error, "%s", msg ? msg : "error");
        s->requests_error++;
    } else if (r->cancelled) {
        s->requests_cancelled++;
    } else {
        s->requests_ok++;
    }
    pthread_cond_broadcast(&r->cond);
    pthread_cond_broadcast(&s->idle_cond);
    release_locked(r);
}

void og_sched_fail_waiting_locked(og_server *s, int http, const char *msg) {
    og_req *r;
    while ((r = pop_waiting_locked(s))) finish_locked(s, r, http, msg);
}

void og_sched_cancel_running_locked(og_server *s, const char *msg) {
    for (int32_t i = 0; i < s->n_running; i++) {
        og_req *r = s->running[i];
        if (!r->http_error) {
            r->http_error = 503; /* read by the scheduler when it drops r */
            snprintf(r->error, sizeof r->error, "%s", msg);
        }
        r->cancelled = true;
    }
    pthread_cond_signal(&s->sched_cond);
}

static bool append_text(og_req *r, const char *t, size_t n) {
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

/* Ends r's generation for the caller's reason (context full): what the
 * text generator held back goes out, then r finishes normally. */
static void end_locked(og_server *s, og_req *r, og_finish why) {
    const char *t;
    size_t n;
    if (og_textgen_end(r->tg, why, &t, &n) != OG_OK || !append_text(r, t, n)) {
        finish_locked(s, r, 500, "out of memory");
        return;
    }
    r->finish = og_textgen_finish_reason(r->tg);
    finish_locked(s, r, 0, NULL);
}

/* ------------------------------------------------------------ the step */

static og_step_output output_of(const og_server *s, const og_req *r) {
    if (r->logprobs >= 0) return OG_OUTPUT_LOGITS;
    if (r->sampling.temperature <= 0 && s->n_forbidden == 0 && r->sampling.repeat_penalty == 1.0f)
        return OG_OUTPUT_ARGMAX;
    return OG_OUTPUT_SAMPLE;
}

/* Log-probabilities of the token and the n_top most likely, from raw logits. */
static void logprobs_of(const float *logits, int64_t V, int32_t token, int32_t n_top, og_serve_logprob *out) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    out->token = token;
    out->logprob = (float)((double)logits[token] - lse);
    out->n_top = 0;
    for (int64_t i = 0; i < V; i++) { /* insertion into the n_top best, ties: lower id first */
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

/* r drew `token`: its text (and log-probabilities) go to the HTTP side. */
static void take_token_locked(og_server *s, og_req *r, int32_t token) {
    if (!r->t_first) r->t_first = og_time_now();
    og_serve_logprob lp;
    if (r->logprobs >= 0) logprobs_of(r->logits, s->vocab, token, r->logprobs, &lp);
    const int64_t before = og_textgen_tokens(r->tg);
    const char *t;
    size_t n;
    og_finish fin;
    if (og_textgen_push(r->tg, token, &t, &n, &fin) != OG_OK || !append_text(r, t, n)) {
        finish_locked(s, r, 500, og_last_error());
        return;
    }
    const int64_t now = og_textgen_tokens(r->tg);
    s->generation_tokens_total += now - before;
    r->completion_tokens = now;
    if (r->logprobs >= 0 && now > before) {
        if (r->n_lps == r->cap_lps) {
            int32_t cap = r->cap_lps ? 2 * r->cap_lps : 16;
            og_serve_logprob *b = og_realloc(r->lps, (size_t)cap * sizeof *b);
            if (!b) {
                finish_locked(s, r, 500, "out of memory");
                return;
            }
            r->lps = b;
            r->cap_lps = cap;
        }
        r->lps[r->n_lps++] = lp;
    }
    if (!r->t_pending && (r->n_text || r->n_lps)) r->t_pending = og_time_now();
    if (fin != OG_FINISH_NONE) {
        r->finish = fin;
        finish_locked(s, r, 0, NULL);
        return;
    }
    r->next = token;
    pthread_cond_broadcast(&r->cond);
}

static void note_rate_locked(og_server *s) {
    double now = og_time_now();
    int32_t last = (s->rate_i + 15) % 16;
    if (s->rate_n && now - s->rate_t[last] < 0.5) return;
    s->rate_t[s->rate_i] = now;
    s->rate_prompt[s->rate_i] = s->prompt_tokens_total;
    s->rate_gen[s->rate_i] = s->generation_tokens_total;
    s->rate_i = (s->rate_i + 1) % 16;
    if (s->rate_n < 16) s->rate_n++;
}

typedef struct step_work {
    og_batch_item *items;
    og_req **owner;
    og_status *status;
    char (*why)[160];
} step_work;

static void *sched_main(void *arg) {
    og_server *s = arg;
    const int32_t cap = s->p.max_sessions;
    step_work w = {og_calloc((size_t)cap, sizeof *w.items), og_calloc((size_t)cap, sizeof *w.owner),
                   og_calloc((size_t)cap, sizeof *w.status), og_calloc((size_t)cap, sizeof *w.why)};
    og_req **snap = og_calloc((size_t)cap, sizeof *snap);
    pthread_mutex_lock(&s->lock);
    if (!w.items || !w.owner || !w.status || !w.why || !snap) {
        og_log(OG_LOG_ERROR, "serve: the scheduler has no memory");
        s->quit = true;
    }
    while (!s->quit) {
        admit_locked(s);
        int32_t n_snap = s->n_running;
        memcpy(snap, s->running, (size_t)n_snap * sizeof *snap);
        for (int32_t i = 0; i < n_snap; i++) {
            og_req *r = snap[i];
            if (r->cancelled) {
                int http = r->http_error;
                char why[sizeof r->error];
                snprintf(why, sizeof why, "%s", r->error);
                r->http_error = 0;
                finish_locked(s, r, http, http ? why : NULL);
            } else if (r->fed == r->n_prompt && og_session_length(s->slots[r->slot].session) + 1 > s->ctx) {
                end_locked(s, r, OG_FINISH_LENGTH); /* the context is full */
            }
        }
        if (s->n_running == 0) {
            if (!s->wait_head) pthread_cond_wait(&s->sched_cond, &s->lock);
            else if (s->n_running == 0) {
                /* waiting requests that cannot start (budget): wait for a change */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000 * 1000;
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&s->sched_cond, &s->lock, &ts);
            }
            continue;
        }
        /* decode rows first, then prompt chunks under the row budget */
        int32_t n = 0, rows = 0, prefills = 0;
        for (int32_t i = 0; i < s->n_running; i++) {
            og_req *r = s->running[i];
            if (r->fed < r->n_prompt) continue;
            og_step_output o = output_of(s, r);
            w.items[n] = (og_batch_item){.session = s->slots[r->slot].session, .tokens = &r->next, .n_tokens = 1,
                                         .output = o, .logits = o == OG_OUTPUT_LOGITS ? r->logits : NULL,
                                         .sampler = o == OG_OUTPUT_SAMPLE ? r->sampler : NULL};
            w.owner[n++] = r;
            rows++;
        }
        for (int32_t i = 0; i < s->n_running; i++) {
            og_req *r = s->running[i];
            if (r->fed >= r->n_prompt) continue;
            int64_t T = r->n_prompt - r->fed, room = s->p.step_rows - rows;
            if (room <= 0 && prefills > 0) break;
            if (room <= 0) room = 32; /* decodes fill the budget: one small chunk still goes, so no prompt starves */
            prefills++;
            if (T > s->p.chunk) T = s->p.chunk;
            if (T > s->max_write) T = s->max_write;
            if (room > 0 && T > room) T = room;
            bool last = r->fed + T == r->n_prompt;
            og_step_output o = last ? output_of(s, r) : OG_OUTPUT_NONE;
            w.items[n] = (og_batch_item){.session = s->slots[r->slot].session, .tokens = r->prompt + r->fed,
                                         .n_tokens = (int32_t)T, .output = o,
                                         .logits = o == OG_OUTPUT_LOGITS ? r->logits : NULL,
                                         .sampler = o == OG_OUTPUT_SAMPLE ? r->sampler : NULL};
            w.owner[n++] = r;
            rows += (int32_t)T;
        }
        pthread_mutex_unlock(&s->lock);

        og_status st = og_model_step(s->model, w.items, n);
        if (s->p.test_step_delay_s > 0) {
            struct timespec d = {(time_t)s->p.test_step_delay_s,
                                 (long)((s->p.test_step_delay_s - (double)(time_t)s->p.test_step_delay_s) * 1e9)};
            nanosleep(&d, NULL);
        }
        for (int32_t i = 0; i < n; i++) w.status[i] = st;
        if (st != OG_OK) {
            /* a step is one transaction: find who cannot step by stepping
             * each alone, so that one request's failure stalls no other */
            for (int32_t i = 0; i < n; i++) {
                w.status[i] = n == 1 ? st : og_model_step(s->model, &w.items[i], 1);
                if (w.status[i] != OG_OK) snprintf(w.why[i], sizeof w.why[i], "%s", og_last_error());
            }
        }

        pthread_mutex_lock(&s->lock);
        s->steps_total++;
        s->step_rows_total += rows;
        for (int32_t i = 0; i < n; i++) {
            og_req *r = w.owner[i];
            og_batch_item *it = &w.items[i];
            if (w.status[i] != OG_OK) {
                s->step_failures++;
                if (w.status[i] == OG_ERR_CAPACITY) {
                    end_locked(s, r, OG_FINISH_LENGTH);
                } else {
                    /* memory that ran out (the KV cache could not grow) may
                       come back: 503, the others in the batch go on */
                    char msg[256];
                    snprintf(msg, sizeof msg, "the model step failed: %s (%s)", w.why[i], og_status_str(w.status[i]));
                    finish_locked(s, r, w.status[i] == OG_ERR_OUT_OF_MEMORY ? 503 : 500, msg);
                }
                continue;
            }
            bool prefill = it->tokens != &r->next;
            if (prefill) {
                r->fed += it->n_tokens;
                s->prompt_tokens_total += it->n_tokens;
                /* a hybrid model holds its state only at the session's end:
                 * keep it where the prompt ends, for the prefix cache */
                if (r->fed == r->n_prompt && s->prefix) og_session_checkpoint(it->session);
            }
            og_kv_metrics km;
            if (og_session_metrics(it->session, &km) == OG_OK) {
                s->slots[r->slot].held = km.bytes_allocated;
                s->slots[r->slot].live = km.bytes_live;
            }
            if (it->output == OG_OUTPUT_NONE) continue;
            int32_t token = it->token;
            if (it->output == OG_OUTPUT_LOGITS) token = og_sampler_sample(r->sampler, r->logits);
            take_token_locked(s, r, token);
        }
        note_rate_locked(s);
    }
    /* quitting: whatever is left ends (og_server_stop cancelled it) */
    while (s->n_running) finish_locked(s, s->running[0], 503, "the server is shutting down");
    og_sched_fail_waiting_locked(s, 503, "the server is shutting down");
    pthread_mutex_unlock(&s->lock);
    og_free(w.items);
    og_free(w.owner);
    og_free(w.status);
    og_free(w.why);
    og_free(snap);
    return NULL;
}

og_status og_sched_start(og_server *s) {
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return og_set_error(OG_ERR_BACKEND, "serve: cannot start the scheduler thread: %s", strerror(errno));
    s->thread_started = true;
    return OG_OK;
}

void og_sched_stop(og_server *s) {
    if (!s->thread_started) return;
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    pthread_cond_signal(&s->sched_cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    s->thread_started = false;
}

/* ------------------------------------------------------------ /metrics */

typedef struct textbuf {
    char *p;
    size_t n, cap;
    bool oom;
} textbuf;

static void tb_printf(textbuf *b, const char *fmt, ...) OG_PRINTF(2, 3);
static void tb_printf(textbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k;
        char *p = og_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void metric(textbuf *b, const char *name, const char *type, const char *help, double v) {
    tb_printf(b, "# HELP offgraph_%s %s\n# TYPE offgraph_%s %s\noffgraph_%s %.17g\n", name, help, name, type, name, v);
}

char *og_sched_metrics_text(og_server *s) {
    textbuf b = {og_malloc(4096), 0, 4096, false};
    if (!b.p) return NULL;
    pthread_mutex_lock(&s->lock);
    int32_t busy = 0, idle = 0;
    int64_t held = 0, live = 0, reserved = 0;
    for (int32_t i = 0; i < s->p.max_sessions; i++) {
        const og_serve_slot *sl = &s->slots[i];
        if (!sl->session) continue;
        if (sl->owner) busy++;
        else idle++;
        held += sl->held;
        live += sl->live;
        if (sl->owner) reserved += sl->owner->reserve_bytes > sl->held ? sl->owner->reserve_bytes : sl->held;
    }
    double prompt_rate = 0, gen_rate = 0, now = og_time_now();
    if (s->rate_n) { /* over the oldest sample of the last 10 s or so */
        int32_t o = s->rate_n < 16 ? 0 : s->rate_i;
        for (int32_t k = 0; k < s->rate_n; k++) {
            int32_t j = (o + k) % 16;
            if (now - s->rate_t[j] <= 10.5 || k == s->rate_n - 1) {
                double dt = now - s->rate_t[j];
                if (dt > 0.25) {
                    prompt_rate = (double)(s->prompt_tokens_total - s->rate_prompt[j]) / dt;
                    gen_rate = (double)(s->generation_tokens_total - s->rate_gen[j]) / dt;
                }
                break;
            }
        }
    }
    metric(&b, "requests_running", "gauge", "Requests generating now.", s->n_running);
    metric(&b, "requests_waiting", "gauge", "Requests waiting for a session or KV budget.", s->n_waiting);
    metric(&b, "sessions_busy", "gauge", "Sessions serving a request.", busy);
    metric(&b, "sessions_idle", "gauge", "Sessions kept in the pool for reuse.", idle);
    metric(&b, "sessions_max", "gauge", "The --max-sessions bound.", s->p.max_sessions);
    metric(&b, "kv_bytes_backed", "gauge", "KV bytes the sessions hold (allocated).", (double)held);
    metric(&b, "kv_bytes_live", "gauge", "KV bytes of the tokens the sessions hold.", (double)live);
    metric(&b, "kv_bytes_reserved", "gauge", "KV bytes set aside for the running requests.", (double)reserved);
    metric(&b, "kv_budget_bytes", "gauge", "The --kv-budget bound (0: none).", (double)s->p.kv_budget);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens prefilled.", (double)s->prompt_tokens_total);
    metric(&b, "generation_tokens_total", "counter", "Tokens generated.", (double)s->generation_tokens_total);
    og_prefix_cache_metrics pm = {0};
    if (s->prefix) og_prefix_cache_metrics_get(s->prefix, &pm);
    metric(&b, "prefix_cache_lookups_total", "counter", "Requests that looked their prompt up in the prefix cache.",
           (double)pm.lookups);
    metric(&b, "prefix_cache_hits_total", "counter", "Requests that started from a cached prefix.", (double)pm.hits);
    metric(&b, "prompt_tokens_reused_total", "counter", "Prompt tokens taken from the prefix cache, not prefilled.",
           (double)s->prompt_tokens_reused);
    metric(&b, "prefix_cache_bytes_shared_total", "counter",
           "KV bytes the sessions started from the cache shared with it rather than copied.", (double)pm.bytes_shared);
    metric(&b, "prefix_cache_bytes_held", "gauge", "KV bytes the prefix cache's sessions hold (in the budget).",
           (double)pm.bytes_held);
    metric(&b, "prefix_cache_entries", "gauge", "Sessions the prefix cache holds.", (double)pm.entries);
    metric(&b, "prefix_cache_evictions_total", "counter", "Prefix cache entries evicted (its bound or the budget).",
           (double)pm.evictions);
    metric(&b, "prefix_cache_bytes_max", "gauge", "The --prefix-cache-bytes bound (0: no cache).",
           (double)(s->prefix ? s->p.prefix_cache_bytes : 0));
    metric(&b, "prompt_tokens_per_second", "gauge", "Prompt tokens a second, over the last 10 s.", prompt_rate);
    metric(&b, "generation_tokens_per_second", "gauge", "Generated tokens a second, over the last 10 s.", gen_rate);
    metric(&b, "steps_total", "counter", "Batched model steps.", (double)s->steps_total);
    metric(&b, "step_rows_total", "counter", "Tokens those steps advanced.", (double)s->step_rows_total);
    metric(&b, "step_failures_total", "counter", "Requests a failed step ended.", (double)s->step_failures);
    tb_printf(&b, "# HELP offgraph_requests_total Requests ended, by outcome.\n# TYPE offgraph_requests_total counter\n");
    tb_printf(&b, "offgraph_requests_total{outcome=\"ok\"} %lld\n", (long long)s->requests_ok);
    tb_printf(&b, "offgraph_requests_total{outcome=\"error\"} %lld\n", (long long)s->requests_error);
    tb_printf(&b, "offgraph_requests_total{outcome=\"cancelled\"} %lld\n", (long long)s->requests_cancelled);
    tb_printf(&b, "offgraph_requests_total{outcome=\"rejected\"} %lld\n", (long long)s->requests_rejected);
    pthread_mutex_unlock(&s->lock);
    if (b.oom) {
        og_free(b.p);
        return NULL;
    }
    return b.p;
}
