/* The HTTP side of the server: libmicrohttpd with a thread per connection,
 * the routes, auth, the body limit, responses and server-sent events. A
 * connection's thread waits for its request's output and notices a client
 * that left (the socket reads end-of-file) while it waits. */
#include "serve/api.h"
#include "serve/sched.h"

#include "core/core.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

typedef struct buf {
    char *p;
    size_t n, cap;
    bool oom;
} buf;

static void buf_add(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = og_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Appends "data: <json>\n\n" and deletes j. */
static void buf_event(buf *b, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) {
        b->oom = true;
        return;
    }
    buf_add(b, "data: ", 6);
    buf_add(b, s, strlen(s));
    buf_add(b, "\n\n", 2);
    cJSON_free(s);
}

typedef struct conn {
    og_server *s;
    buf body;
    bool too_large;
    bool counted;  /* in s->active_responses */
    bool answered; /* a response is queued */
    const char *method, *url;
} conn;

static enum MHD_Result respond(conn *cn, struct MHD_Connection *c, unsigned status, const char *ctype,
                               const char *body, size_t n, const char *retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(resp, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    if (cn->s->p.log_requests) fprintf(stderr, "offgraph serve: %s %s %u\n", cn->method, cn->url, status);
    return ret;
}

static cJSON *error_json(const og_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return root;
}

static enum MHD_Result respond_json(conn *cn, struct MHD_Connection *c, unsigned status, cJSON *j,
                                    const char *retry_after) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    enum MHD_Result r = respond(cn, c, status, "application/json", s, strlen(s), retry_after);
    cJSON_free(s);
    return r;
}

static enum MHD_Result respond_error(conn *cn, struct MHD_Connection *c, int status, const char *type,
                                     const char *code, const char *param, const char *msg, const char *retry_after) {
    og_api_error e = {.status = status, .type = type, .code = code};
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    snprintf(e.message, sizeof e.message, "%s", msg);
    return respond_json(cn, c, (unsigned)status, error_json(&e), retry_after);
}

/* True when the client closed its side (or the socket failed). */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    if (pfd.revents & (POLLIN | POLLRDHUP)) {
        char ch;
        ssize_t k = recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0;
    }
    return false;
}

/* Waits until r has output or has ended. False when the client left: r is
 * then cancelled. */
static bool wait_output(og_server *s, og_req *r, struct MHD_Connection *c) {
    pthread_mutex_lock(&s->lock);
    while (r->n_text == 0 && r->n_lps == 0 && r->state != OG_REQ_DONE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        if (pthread_cond_timedwait(&r->cond, &s->lock, &ts) != 0) {
            pthread_mutex_unlock(&s->lock);
            if (client_gone(c)) {
                og_sched_cancel(s, r);
                return false;
            }
            pthread_mutex_lock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return true;
}

/* What a request has produced since the last take. */
typedef struct taken {
    buf text;
    og_serve_logprob *lps;
    int32_t n_lps;
    bool done;
    og_finish finish;
    int http_error;
    char error[256];
    int64_t completion_tokens;
    int64_t cached_tokens; /* prompt tokens the prefix cache gave */
} taken;

static void take(og_server *s, og_req *r, taken *t) {
    pthread_mutex_lock(&s->lock);
    t->text.n = 0;
    buf_add(&t->text, r->text ? r->text : "", r->n_text);
    r->n_text = 0;
    og_free(t->lps);
    t->lps = r->lps;
    t->n_lps = r->n_lps;
    r->lps = NULL;
    r->n_lps = r->cap_lps = 0;
    t->done = r->state == OG_REQ_DONE;
    t->finish = r->finish;
    t->http_error = r->http_error;
    snprintf(t->error, sizeof t->error, "%s", r->error);
    t->completion_tokens = r->completion_tokens;
    t->cached_tokens = r->reused; /* set at admission, under the lock */
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ bodies */

typedef struct gen {
    og_server *s;
    og_req *r;
    struct MHD_Connection *c;
    bool chat, include_usage;
    char id[48];
    int64_t created;
    int64_t n_prompt;
    int64_t text_offset; /* completions' logprobs */
    /* streaming */
    buf out;
    size_t off;
    bool started, ended;
    taken t;
} gen;

/* usage, with the prompt tokens taken from the prefix cache as OpenAI
 * reports cached ones (prompt_tokens_details.cached_tokens). */
static cJSON *usage_json(int64_t prompt, const taken *t) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)t->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + t->completion_tokens));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens",
                            (double)t->cached_tokens);
    return u;
}

static cJSON *bytes_json(const char *t, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)t[i]));
    return a;
}

/* The text of one token (for logprobs); owned by the caller (og_free). */
static char *token_text(const og_server *s, int32_t id, size_t *n) {
    char *t = NULL;
    if (og_tokenizer_decode(s->tok, &id, 1, &t, n) != OG_OK) {
        *n = 0;
        return og_strdup("");
    }
    return t;
}

/* logprobs of the tokens of one chunk, in the endpoint's form; NULL adds null. */
static void add_logprobs(gen *g, cJSON *choice, const og_serve_logprob *lps, int32_t n) {
    if (g->r->logprobs < 0) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    cJSON *lp = cJSON_AddObjectToObject(choice, "logprobs");
    if (g->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int32_t i = 0; i < n; i++) {
            size_t k;
            char *t = token_text(g->s, lps[i].token, &k);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", t ? t : "");
            cJSON_AddNumberToObject(e, "logprob", lps[i].logprob);
            cJSON_AddItemToObject(e, "bytes", bytes_json(t ? t : "", t ? k : 0));
            og_free(t);
            cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int32_t j = 0; j < lps[i].n_top; j++) {
                char *tt = token_text(g->s, lps[i].top[j], &k);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "token", tt ? tt : "");
                cJSON_AddNumberToObject(o, "logprob", lps[i].top_logprob[j]);
                cJSON_AddItemToObject(o, "bytes", bytes_json(tt ? tt : "", tt ? k : 0));
                og_free(tt);
                cJSON_AddItemToArray(top, o);
            }
            cJSON_AddItemToArray(content, e);
        }
        return;
    }
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs"),
          *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
    for (int32_t i = 0; i < n; i++) {
        size_t k;
        char *t = token_text(g->s, lps[i].token, &k);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(t ? t : ""));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(lps[i].logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)g->text_offset));
        g->text_offset += (int64_t)k;
        og_free(t);
        cJSON *o = cJSON_CreateObject();
        for (int32_t j = 0; j < lps[i].n_top; j++) {
            char *tt = token_text(g->s, lps[i].top[j], &k);
            if (!cJSON_GetObjectItemCaseSensitive(o, tt ? tt : ""))
                cJSON_AddNumberToObject(o, tt ? tt : "", lps[i].top_logprob[j]);
            og_free(tt);
        }
        cJSON_AddItemToArray(top, o);
    }
}

static cJSON *envelope(const gen *g, bool chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", g->id);
    cJSON_AddStringToObject(root, "object",
                            g->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)g->created);
    cJSON_AddStringToObject(root, "model", g->s->model_id);
    cJSON_AddStringToObject(root, "system_fingerprint", "offgraph");
    return root;
}

/* One chunk of a stream: text (and its logprobs), or the last one with the
 * finish reason and usage. */
static cJSON *chunk_json(gen *g, const char *text, size_t n, const og_serve_logprob *lps, int32_t n_lps,
                         bool role, const char *finish) {
    cJSON *root = envelope(g, true), *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    char *t = og_malloc(n + 1);
    if (t) {
        memcpy(t, text, n);
        t[n] = 0;
    }
    if (g->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (!finish || n) cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(ch, "text", t ? t : "");
    }
    og_free(t);
    if (n_lps || !finish) add_logprobs(g, ch, lps, n_lps);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (finish) cJSON_AddItemToObject(root, "usage", usage_json(g->n_prompt, &g->t));
    return root;
}

static void stream_error(gen *g, int status, const char *msg) {
    og_api_error e = {.status = status, .type = status == 503 ? "service_unavailable" : "server_error"};
    snprintf(e.message, sizeof e.message, "%s", msg);
    buf_event(&g->out, error_json(&e));
}

/* Formats what the request produced since the last call into g->out. */
static void stream_format(gen *g) {
    taken *t = &g->t;
    take(g->s, g->r, t);
    bool role = g->chat && !g->started;
    g->started = true;
    if (t->done && t->http_error) {
        if (t->text.n || t->n_lps) buf_event(&g->out, chunk_json(g, t->text.p, t->text.n, t->lps, t->n_lps, role, NULL));
        stream_error(g, t->http_error, t->error);
    } else if (t->done) {
        if (t->text.n || t->n_lps || role)
            buf_event(&g->out, chunk_json(g, t->text.p ? t->text.p : "", t->text.n, t->lps, t->n_lps, role, NULL));
        const char *fin = og_finish_name(t->finish);
        buf_event(&g->out, chunk_json(g, "", 0, NULL, 0, false, fin ? fin : "stop"));
        if (g->include_usage) {
            cJSON *root = envelope(g, true);
            cJSON_AddArrayToObject(root, "choices");
            cJSON_AddItemToObject(root, "usage", usage_json(g->n_prompt, t));
            buf_event(&g->out, root);
        }
    } else {
        buf_event(&g->out, chunk_json(g, t->text.p ? t->text.p : "", t->text.n, t->lps, t->n_lps, role, NULL));
    }
    if (t->done) {
        buf_add(&g->out, "data: [DONE]\n\n", 14);
        g->ended = true;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    gen *g = cls;
    for (;;) {
        if (g->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->off < g->out.n) {
            size_t k = g->out.n - g->off < max ? g->out.n - g->off : max;
            memcpy(out, g->out.p + g->off, k);
            g->off += k;
            return (ssize_t)k;
        }
        g->out.n = g->off = 0;
        if (g->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        /* the role chunk of a chat stream goes out at once */
        if ((g->started || !g->chat) && !wait_output(g->s, g->r, g->c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        stream_format(g);
    }
}

static void gen_free(gen *g) {
    if (!g) return;
    if (g->r) {
        og_sched_cancel(g->s, g->r); /* a no-op when it is done */
        og_req_release(g->s, g->r);
    }
    og_free(g->out.p);
    og_free(g->t.text.p);
    og_free(g->t.lps);
    og_free(g);
}

static void stream_free(void *cls) { gen_free(cls); }

/* The whole answer of a request that does not stream. */
static enum MHD_Result respond_complete(conn *cn, struct MHD_Connection *c, gen *g) {
    buf text = {0};
    og_serve_logprob *lps = NULL;
    int32_t n_lps = 0, cap_lps = 0;
    for (;;) {
        if (!wait_output(g->s, g->r, c)) {
            og_free(text.p);
            og_free(lps);
            return MHD_NO; /* the client left */
        }
        take(g->s, g->r, &g->t);
        buf_add(&text, g->t.text.p ? g->t.text.p : "", g->t.text.n);
        if (g->t.n_lps) {
            if (n_lps + g->t.n_lps > cap_lps) {
                cap_lps = 2 * (n_lps + g->t.n_lps);
                og_serve_logprob *b = og_realloc(lps, (size_t)cap_lps * sizeof *b);
                if (!b) text.oom = true;
                else lps = b;
            }
            if (!text.oom) memcpy(lps + n_lps, g->t.lps, (size_t)g->t.n_lps * sizeof *lps);
            if (!text.oom) n_lps += g->t.n_lps;
        }
        if (g->t.done) break;
    }
    enum MHD_Result ret;
    if (text.oom) {
        ret = respond_error(cn, c, 500, "server_error", NULL, NULL, "out of memory", NULL);
    } else if (g->t.http_error) {
        ret = respond_error(cn, c, g->t.http_error, g->t.http_error == 503 ? "service_unavailable" : "server_error",
                            NULL, NULL, g->t.error, NULL);
    } else {
        cJSON *root = envelope(g, false), *choices = cJSON_AddArrayToObject(root, "choices"),
              *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", 0);
        if (g->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
        } else {
            cJSON_AddStringToObject(ch, "text", text.p ? text.p : "");
        }
        add_logprobs(g, ch, lps, n_lps);
        const char *fin = og_finish_name(g->t.finish);
        cJSON_AddStringToObject(ch, "finish_reason", fin ? fin : "stop");
        cJSON_AddItemToObject(root, "usage", usage_json(g->n_prompt, &g->t));
        ret = respond_json(cn, c, 200, root, NULL);
    }
    og_free(text.p);
    og_free(lps);
    return ret;
}

/* ------------------------------------------------------------ endpoints */

static enum MHD_Result generate(conn *cn, struct MHD_Connection *c, bool chat) {
    og_server *s = cn->s;
    if (cn->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than the server's limit of %zu bytes", s->p.max_body);
        return respond_error(cn, c, 413, "invalid_request_error", "request_too_large", NULL, msg, NULL);
    }
    og_api_request q;
    og_api_error e;
    if (!og_api_parse(&s->api, cn->body.p ? cn->body.p : "", cn->body.n, chat, &q, &e))
        return respond_json(cn, c, (unsigned)e.status, error_json(&e), NULL);
    og_req *r = og_req_create();
    if (!r) {
        og_api_request_free(&q);
        return respond_error(cn, c, 500, "server_error", NULL, NULL, "out of memory", NULL);
    }
    r->prompt = q.prompt;
    r->n_prompt = q.n_prompt;
    q.prompt = NULL;
    r->sampling = q.sampling;
    r->max_tokens = q.max_tokens;
    for (int32_t i = 0; i < q.n_stops; i++) r->stops[i] = q.stops[i];
    r->n_stops = q.n_stops;
    q.n_stops = 0;
    r->logprobs = q.logprobs;
    for (int32_t i = 0; i < s->n_eos && r->n_stop_ids < 8; i++) r->stop_ids[r->n_stop_ids++] = s->eos[i];
    if (chat && s->end_of_turn >= 0 && r->n_stop_ids < 8) r->stop_ids[r->n_stop_ids++] = s->end_of_turn;
    pthread_mutex_lock(&s->lock);
    uint64_t serial = ++s->seed_counter;
    pthread_mutex_unlock(&s->lock);
    if (!q.has_seed) r->sampling.seed = ((uint64_t)time(NULL) << 20) ^ (serial * 0x9E3779B97F4A7C15ull);
    /* a request with no max_tokens gets what the budget allows it alone */
    if (!q.max_tokens_given && s->p.kv_budget > 0) {
        while (r->max_tokens > 1 && og_sched_kv_estimate(s, r->n_prompt + r->max_tokens) > s->p.kv_budget)
            r->max_tokens /= 2;
    }
    const bool stream = q.stream, include_usage = q.include_usage;
    og_api_request_free(&q);

    char detail[512] = "";
    og_submit sub = og_sched_submit(s, r, detail, sizeof detail);
    if (sub != OG_SUBMIT_OK) {
        og_req_release(s, r);
        if (sub == OG_SUBMIT_QUEUE_FULL)
            return respond_error(cn, c, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL,
                                 "the server is at its --max-sessions / --kv-budget and its wait queue is full; "
                                 "retry later",
                                 "1");
        if (sub == OG_SUBMIT_STOPPING)
            return respond_error(cn, c, 503, "service_unavailable", NULL, NULL, "the server is shutting down", "5");
        return respond_error(cn, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens", detail, NULL);
    }
    gen *g = og_calloc(1, sizeof *g);
    if (!g) {
        og_sched_cancel(s, r);
        og_req_release(s, r);
        return respond_error(cn, c, 500, "server_error", NULL, NULL, "out of memory", NULL);
    }
    g->s = s;
    g->r = r;
    g->c = c;
    g->chat = chat;
    g->include_usage = include_usage;
    g->created = (int64_t)time(NULL);
    g->n_prompt = r->n_prompt;
    snprintf(g->id, sizeof g->id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(r->sampling.seed ^ (serial << 40) ^ (uint64_t)g->created));
    if (!stream) {
        enum MHD_Result ret = respond_complete(cn, c, g);
        gen_free(g);
        return ret;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, g, stream_free);
    if (!resp) {
        gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    if (s->p.log_requests) fprintf(stderr, "offgraph serve: %s %s 200 (stream)\n", cn->method, cn->url);
    return ret;
}

static enum MHD_Result models(conn *cn, struct MHD_Connection *c, const char *one) {
    og_server *s = cn->s;
    if (one && strcmp(one, s->model_id)) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", one);
        return respond_error(cn, c, 404, "invalid_request_error", "model_not_found", "model", msg, NULL);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "offgraph");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->ctx);
    if (one) return respond_json(cn, c, 200, m, NULL);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    return respond_json(cn, c, 200, root, NULL);
}

static bool authorized(const og_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h), k = strlen(s->api_key);
    unsigned char diff = (unsigned char)(n != k);
    for (size_t i = 0; i < n && i < k; i++) diff |= (unsigned char)(h[i] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result route(conn *cn, struct MHD_Connection *c, const char *url, const char *method) {
    og_server *s = cn->s;
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strncmp(url, "/v1/", 4)) url += 3; /* /v1/x and /x are the same */
    if (!strcmp(url, "/health")) {
        if (!get) goto not_allowed;
        pthread_mutex_lock(&s->lock);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        static const char ok[] = "{\"status\":\"ok\"}", down[] = "{\"status\":\"shutting down\"}";
        return stopping ? respond(cn, c, 503, "application/json", down, sizeof down - 1, NULL)
                        : respond(cn, c, 200, "application/json", ok, sizeof ok - 1, NULL);
    }
    if (!authorized(s, c))
        return respond_error(cn, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                             "a valid API key is required: send 'Authorization: Bearer <key>'", NULL);
    if (!strcmp(url, "/metrics")) {
        if (!get) goto not_allowed;
        char *text = og_sched_metrics_text(s);
        if (!text) return MHD_NO;
        enum MHD_Result r = respond(cn, c, 200, "text/plain; version=0.0.4", text, strlen(text), NULL);
        og_free(text);
        return r;
    }
    if (!strcmp(url, "/models")) {
        if (!get) goto not_allowed;
        return models(cn, c, NULL);
    }
    if (!strncmp(url, "/models/", 8)) {
        if (!get) goto not_allowed;
        return models(cn, c, url + 8);
    }
    if (!strcmp(url, "/completions") || !strcmp(url, "/chat/completions")) {
        if (!post) goto not_allowed;
        return generate(cn, c, !strcmp(url, "/chat/completions"));
    }
    {
        char msg[300];
        snprintf(msg, sizeof msg, "no such endpoint: %.200s %.60s", method, url);
        return respond_error(cn, c, 404, "invalid_request_error", "not_found", NULL, msg, NULL);
    }
not_allowed: {
    char msg[300];
    snprintf(msg, sizeof msg, "method %.30s is not allowed on %.200s", method, url);
    return respond_error(cn, c, 405, "invalid_request_error", "method_not_allowed", NULL, msg, NULL);
}
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **state) {
    og_server *s = cls;
    conn *cn = *state;
    if (!cn) {
        if (!(cn = og_calloc(1, sizeof *cn))) return MHD_NO;
        cn->s = s;
        cn->method = method;
        cn->url = url;
        *state = cn;
        pthread_mutex_lock(&s->lock);
        s->active_responses++;
        cn->counted = true;
        pthread_mutex_unlock(&s->lock);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) {
            cn->too_large = cn->answered = true;
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than the server's limit of %zu bytes", s->p.max_body);
            return respond_error(cn, c, 413, "invalid_request_error", "request_too_large", NULL, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (cn->answered) { /* refused at the first call: the rest is dropped */
            *upload_size = 0;
            return MHD_YES;
        }
        if (cn->body.n + *upload_size > s->p.max_body) cn->too_large = true;
        if (!cn->too_large) buf_add(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return cn->body.oom ? MHD_NO : MHD_YES;
    }
    if (cn->answered) return MHD_YES;
    cn->answered = true;
    return route(cn, c, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode toe) {
    og_server *s = cls;
    conn *cn = *state;
    if (!cn) return;
    if (cn->counted) {
        pthread_mutex_lock(&s->lock);
        s->active_responses--;
        pthread_cond_broadcast(&s->idle_cond);
        pthread_mutex_unlock(&s->lock);
    }
    og_free(cn->body.p);
    og_free(cn);
    *state = NULL;
}

/* ------------------------------------------------------------ the daemon */

og_status og_http_start(og_server *s) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", (int)s->p.port);
    int rc = getaddrinfo(s->host, port, &hints, &ai);
    if (rc != 0 || !ai) return og_set_error(OG_ERR_INVALID_ARGUMENT, "serve: cannot resolve --host %s: %s", s->host, gai_strerror(rc));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)s->p.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                                 MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return og_set_error(OG_ERR_IO, "serve: cannot listen on %s port %d (in use, or not an address of this machine)",
                            s->host, (int)s->p.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    return OG_OK;
}

void og_http_quiesce(og_server *s) {
    if (!s->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void og_http_stop(og_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
