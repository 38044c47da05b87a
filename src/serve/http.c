/* The HTTP side of the server: libmicrohttpd with a thread per connection,
 * the routes, auth, the body limit, responses and server-sent events. A
 * connection's thread waits for its request's output and notices a client
 * that left (the socket reads end-of-file) while it waits. The connection
 * guard (below) gives every connection deadlines that bytes do not extend:
 * for its request's headers, its body, and the output it has not read. */
#include "serve/api.h"
#include "serve/server.h"

#include "text/textgen.h"

#include "core/core.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

/* Appends "data: <json>\n\n" and deletes j. */
static void buf_event(og_strbuf *b, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) {
        b->oom = true;
        return;
    }
    og_strbuf_add(b, "data: ", 6);
    og_strbuf_add(b, s, strlen(s));
    og_strbuf_add(b, "\n\n", 2);
    cJSON_free(s);
}

/* ------------------------------------------------------------ a request's handle */

/* A response's requests (one a choice: n of each prompt, choice p * n + j
 * prompt p's j-th) shared by the response and, while it streams, the
 * connection guard: the last of them to let go destroys them. refs and
 * t_sending under s->lock. */
typedef struct sreq {
    og_request **r;       /* [n]; NULL where not submitted */
    int32_t n;
    og_grammar *grammar;  /* response_format's, and a matcher a choice (its
                             constraint): freed after the requests */
    og_matcher **matcher; /* [n] or NULL */
    int refs;
    double t_sending; /* when the oldest output libmicrohttpd holds for the
                         socket was produced; 0: none */
} sreq;

static void sreq_release(og_server *s, sreq *q) {
    if (!q) return;
    pthread_mutex_lock(&s->lock);
    const bool last = --q->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (!last) return;
    for (int32_t i = 0; q->r && i < q->n; i++) og_request_destroy(q->r[i]);
    for (int32_t i = 0; q->matcher && i < q->n; i++) og_matcher_destroy(q->matcher[i]);
    og_free(q->r);
    og_free(q->matcher);
    og_grammar_destroy(q->grammar);
    og_free(q);
}

static void sreq_cancel(sreq *q) {
    for (int32_t i = 0; q->r && i < q->n; i++) og_request_cancel(q->r[i]); /* a no-op once it ended */
}

/* The output its requests hold that the response has not taken: bytes, and
 * when the oldest of it was produced (0: none). */
static void sreq_backlog(sreq *q, size_t *bytes, double *oldest) {
    *bytes = 0;
    *oldest = 0;
    for (int32_t i = 0; i < q->n; i++) {
        size_t b = 0;
        double t = 0;
        og_request_backlog(q->r[i], &b, &t);
        *bytes += b;
        if (t && (!*oldest || t < *oldest)) *oldest = t;
    }
}

/* ------------------------------------------------------------ the connection guard
 *
 * libmicrohttpd (0.9.75 in Debian 12) bounds the connections, in all and
 * from one address (MHD_OPTION_CONNECTION_LIMIT and _PER_IP_CONNECTION_LIMIT:
 * past either a new connection is closed at once), and closes a connection
 * idle for MHD_OPTION_CONNECTION_TIMEOUT. But every byte read or written
 * restarts that timer, so a client that sends a header line every few
 * seconds, or reads a few bytes now and then, keeps its connection (and its
 * thread: a thread per connection) as long as it likes. The guard adds the
 * deadlines bytes do not extend. It knows every connection (from
 * MHD_OPTION_NOTIFY_CONNECTION) and the phase it is in:
 *
 *   HEADERS    waiting for a request's headers: they must be complete
 *              header_timeout_s after the connection opened or the previous
 *              response ended;
 *   BODY       reading the body: min_body_rate bytes a second on average,
 *              after header_timeout_s of grace;
 *   WORKING    the request is the server's (parsed, queued, generating): no
 *              deadline, the client waits for us;
 *   SENDING    a whole response is queued: the client must have taken it
 *              write_timeout_s later;
 *   STREAMING  a stream: the oldest output not yet written to the socket
 *              must be younger than write_timeout_s, and what the client has
 *              not taken at most OG_HTTP_MAX_UNSENT bytes; past either the
 *              request is cancelled (its session freed at the next step).
 *
 * A thread checks them every OG_HTTP_GUARD_TICK seconds. An expired
 * connection gets a 408 when no response was started on it (the headers
 * or the body were late), then shutdown(2) on its socket: its
 * libmicrohttpd thread reads end-of-file (or fails to write) and closes it
 * the ordinary way. The socket stays open until libmicrohttpd has called
 * NOTIFY_CONNECTION's CLOSED, which takes the connection out of the guard
 * first, so the guard never touches a descriptor reused by another
 * connection. Lock order: guard.mu, then s->lock. */

#define OG_HTTP_GUARD_TICK 0.1
#define OG_HTTP_MAX_UNSENT (1 << 20)
/* SO_SNDBUF of every connection (the kernel doubles it): the output a
 * client that stops reading can leave in the kernel, not its 4 MiB default
 * ceiling, so the write deadline sees the stall early. */
#define OG_HTTP_SNDBUF (64 << 10)

typedef enum guard_phase { GUARD_HEADERS, GUARD_BODY, GUARD_WORKING, GUARD_SENDING, GUARD_STREAMING } guard_phase;

typedef struct guard_conn {
    struct guard_conn *prev, *next;
    int fd;
    guard_phase phase;
    double since;      /* og_time_now when the phase began */
    int64_t received;  /* BODY: body bytes so far */
    bool answered;     /* a response went out on it before: a late next
                          request is closed without a 408 (an idle
                          keep-alive connection has nothing to answer) */
    bool closed;       /* the guard ended it */
    sreq *r;           /* STREAMING: a reference to its request */
} guard_conn;

enum { GUARD_T_HEADERS, GUARD_T_BODY, GUARD_T_WRITE, GUARD_T_UNSENT, GUARD_T_KINDS };
static const char *const guard_t_names[GUARD_T_KINDS] = {"headers", "body", "write", "unsent"};

struct og_http_guard {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    bool started, quit;
    guard_conn *head;
    int64_t open, opened_total;          /* mu */
    int64_t timeouts[GUARD_T_KINDS];     /* mu */
    /* libmicrohttpd's log, one line a message a while (a flood would
       print a line per refused connection) */
    const char *log_fmt[8];
    double log_t[8];
    int64_t log_hidden[8];
};

static void guard_log(void *cls, const char *fmt, va_list ap) {
    og_http_guard *g = cls;
    const double now = og_time_now();
    int64_t hidden = 0;
    pthread_mutex_lock(&g->mu);
    int k = 0;
    for (int i = 0; i < 8; i++) {
        if (g->log_fmt[i] == fmt) {
            k = i;
            break;
        }
        if (g->log_t[i] < g->log_t[k]) k = i; /* else the oldest slot */
    }
    if (g->log_fmt[k] == fmt && now - g->log_t[k] < 10) {
        g->log_hidden[k]++;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    if (g->log_fmt[k] == fmt) hidden = g->log_hidden[k];
    g->log_fmt[k] = fmt;
    g->log_t[k] = now;
    g->log_hidden[k] = 0;
    pthread_mutex_unlock(&g->mu);
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
    if (hidden) fprintf(stderr, "offgraph serve: %s (%lld more in the last 10 s)\n", line, (long long)hidden);
    else fprintf(stderr, "offgraph serve: %s\n", line);
}

/* Ends c: a 408 carrying why (NULL: nothing), then shutdown. mu held. A
 * connection whose client stopped reading is reset when libmicrohttpd
 * closes it (SO_LINGER 0): what it did not read is dropped at once, where a
 * FIN would wait behind it, for a window that never opens. */
static void guard_expire(guard_conn *c, const char *why) {
    if (c->phase == GUARD_SENDING || c->phase == GUARD_STREAMING) {
        struct linger lg = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (why && !c->answered) {
        char body[384], head[256];
        int nb = snprintf(body, sizeof body,
                          "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
                          "\"code\":\"request_timeout\"}}",
                          why);
        if (nb > 0 && (size_t)nb < sizeof body) {
            int nh = snprintf(head, sizeof head,
                              "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
                              "Content-Length: %d\r\n\r\n",
                              nb);
            /* a best effort: the socket buffer is empty (nothing was sent on
               this request), and a client that does not read loses nothing */
            if (nh > 0 && send(c->fd, head, (size_t)nh, MSG_DONTWAIT | MSG_NOSIGNAL) == nh)
                (void)!send(c->fd, body, (size_t)nb, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
    }
    shutdown(c->fd, SHUT_RDWR);
    c->closed = true;
}

static void guard_check(og_server *s, og_http_guard *g, double now) {
    const og_serve_params *p = &s->p;
    for (guard_conn *c = g->head; c; c = c->next) {
        if (c->closed) continue;
        const double age = now - c->since;
        char why[160];
        switch (c->phase) {
        case GUARD_HEADERS:
            if (age <= p->header_timeout_s) break;
            snprintf(why, sizeof why, "the request's headers did not arrive within %g s", p->header_timeout_s);
            guard_expire(c, why);
            g->timeouts[GUARD_T_HEADERS]++;
            break;
        case GUARD_BODY:
            if (age <= p->header_timeout_s + (double)c->received / (double)p->min_body_rate) break;
            snprintf(why, sizeof why, "the request body arrived slower than %lld bytes a second",
                     (long long)p->min_body_rate);
            guard_expire(c, why);
            g->timeouts[GUARD_T_BODY]++;
            break;
        case GUARD_SENDING:
            if (age <= p->write_timeout_s) break;
            guard_expire(c, NULL);
            g->timeouts[GUARD_T_WRITE]++;
            break;
        case GUARD_STREAMING: {
            sreq *q = c->r;
            size_t unsent = 0;
            double oldest = 0;
            sreq_backlog(q, &unsent, &oldest);
            pthread_mutex_lock(&s->lock);
            const double sending = q->t_sending;
            pthread_mutex_unlock(&s->lock);
            if (sending && (!oldest || sending < oldest)) oldest = sending;
            int kind = -1;
            if (unsent > OG_HTTP_MAX_UNSENT) kind = GUARD_T_UNSENT;
            else if (oldest && now - oldest > p->write_timeout_s) kind = GUARD_T_WRITE;
            /* the engine frees its session at its next step (a no-op when it ended) */
            if (kind >= 0) sreq_cancel(q);
            if (kind < 0) break;
            guard_expire(c, NULL);
            g->timeouts[kind]++;
            break;
        }
        case GUARD_WORKING:
            break;
        }
    }
}

static void *guard_main(void *arg) {
    og_server *s = arg;
    og_http_guard *g = s->guard;
    pthread_mutex_lock(&g->mu);
    while (!g->quit) {
        og_cond_wait_until(&g->cond, &g->mu, og_time_now() + OG_HTTP_GUARD_TICK);
        if (!g->quit) guard_check(s, g, og_time_now());
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection joins (in the accepting thread,
 * before its own starts) or leaves (after its thread ended, its socket not
 * yet closed) the guard. */
static void guard_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                         enum MHD_ConnectionNotificationCode code) {
    og_server *s = cls;
    og_http_guard *g = s->guard;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        guard_conn *c = ci ? og_calloc(1, sizeof *c) : NULL;
        *socket_context = c;
        if (!c) { /* it runs unguarded: libmicrohttpd's idle timeout still holds */
            og_log(OG_LOG_WARN, "serve: a connection without its deadlines (out of memory)");
            return;
        }
        c->fd = ci->connect_fd;
        int sndbuf = OG_HTTP_SNDBUF;
        setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        c->phase = GUARD_HEADERS;
        c->since = og_time_now();
        pthread_mutex_lock(&g->mu);
        c->next = g->head;
        if (g->head) g->head->prev = c;
        g->head = c;
        g->open++;
        g->opened_total++;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    guard_conn *c = *socket_context;
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->prev) c->prev->next = c->next;
    else g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    g->open--;
    sreq *r = c->r;
    pthread_mutex_unlock(&g->mu);
    sreq_release(s, r);
    og_free(c);
    *socket_context = NULL;
}

static guard_conn *guard_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Moves c to phase ph (r: STREAMING's request, referenced here). False when
 * the guard has ended the connection: the caller gives up on it. */
static bool guard_enter(og_server *s, guard_conn *c, guard_phase ph, sreq *r) {
    if (!c) return true;
    og_http_guard *g = s->guard;
    if (r) {
        pthread_mutex_lock(&s->lock);
        r->refs++;
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_lock(&g->mu);
    const bool ok = !c->closed;
    sreq *old = c->r;
    c->phase = ph;
    c->since = og_time_now();
    c->received = 0;
    c->r = r;
    pthread_mutex_unlock(&g->mu);
    sreq_release(s, old);
    return ok;
}

/* A response ended (sent, or abandoned): the connection waits for its next
 * request's headers. */
static void guard_response_ended(og_server *s, guard_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&s->guard->mu);
    c->answered = true;
    pthread_mutex_unlock(&s->guard->mu);
    guard_enter(s, c, GUARD_HEADERS, NULL);
}

static bool guard_body_bytes(og_server *s, guard_conn *c, size_t n) {
    if (!c) return true;
    pthread_mutex_lock(&s->guard->mu);
    c->received += (int64_t)n;
    const bool ok = !c->closed;
    pthread_mutex_unlock(&s->guard->mu);
    return ok;
}

static og_status guard_start(og_server *s) {
    og_http_guard *g = og_calloc(1, sizeof *g);
    if (!g) return og_set_error(OG_ERR_OUT_OF_MEMORY, "serve: no memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    s->guard = g;
    if (pthread_create(&g->thread, NULL, guard_main, s) != 0)
        return og_set_error(OG_ERR_BACKEND, "serve: cannot start the connection guard's thread");
    g->started = true;
    return OG_OK;
}

/* After the daemon stopped (every connection has left the guard). */
static void guard_stop(og_server *s) {
    og_http_guard *g = s->guard;
    if (!g) return;
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->quit = true;
        pthread_cond_signal(&g->cond);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
    og_free(g);
    s->guard = NULL;
}

char *og_http_metrics_text(og_server *s) {
    og_http_guard *g = s->guard;
    int64_t open = 0, opened = 0, t[GUARD_T_KINDS] = {0};
    if (g) {
        pthread_mutex_lock(&g->mu);
        open = g->open;
        opened = g->opened_total;
        memcpy(t, g->timeouts, sizeof t);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_lock(&s->lock);
    const int active = s->active_responses;
    pthread_mutex_unlock(&s->lock);
    og_strbuf b = {0};
    char line[512];
    snprintf(line, sizeof line,
             "# HELP offgraph_http_connections Open client connections.\n# TYPE offgraph_http_connections gauge\n"
             "offgraph_http_connections %lld\n"
             "# HELP offgraph_http_connections_total Client connections accepted.\n"
             "# TYPE offgraph_http_connections_total counter\noffgraph_http_connections_total %lld\n",
             (long long)open, (long long)opened);
    og_strbuf_add(&b, line, strlen(line));
    snprintf(line, sizeof line,
             "# HELP offgraph_http_connections_max The --max-connections bound.\n"
             "# TYPE offgraph_http_connections_max gauge\noffgraph_http_connections_max %d\n"
             "# HELP offgraph_http_connections_per_ip_max The --max-connections-per-ip bound (0: none).\n"
             "# TYPE offgraph_http_connections_per_ip_max gauge\noffgraph_http_connections_per_ip_max %d\n",
             (int)s->p.max_connections, (int)s->p.max_connections_per_ip);
    og_strbuf_add(&b, line, strlen(line));
    snprintf(line, sizeof line,
             "# HELP offgraph_http_requests_active Requests whose connection the server is answering.\n"
             "# TYPE offgraph_http_requests_active gauge\noffgraph_http_requests_active %d\n"
             "# HELP offgraph_http_timeouts_total Connections closed by a deadline, by what was late.\n"
             "# TYPE offgraph_http_timeouts_total counter\n",
             active);
    og_strbuf_add(&b, line, strlen(line));
    for (int k = 0; k < GUARD_T_KINDS; k++) {
        snprintf(line, sizeof line, "offgraph_http_timeouts_total{kind=\"%s\"} %lld\n", guard_t_names[k],
                 (long long)t[k]);
        og_strbuf_add(&b, line, strlen(line));
    }
    if (b.oom) {
        og_free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------ requests */

typedef struct conn {
    og_server *s;
    guard_conn *gc; /* its connection in the guard; NULL: unguarded */
    og_strbuf body;
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
    if (ret == MHD_YES) guard_enter(cn->s, cn->gc, GUARD_SENDING, NULL);
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

/* What a choice's request has produced since the last take. */
typedef struct taken {
    og_strbuf text;
    og_token_logprob *lps;
    int32_t n_lps, cap_lps;
    bool done;
    og_finish_reason finish;
    int http_error;        /* done with an error: its HTTP status */
    char error[256];
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens; /* prompt tokens the prefix cache gave */
    double produced;       /* when the oldest of it was produced (0: unknown) */
} taken;

/* The HTTP status of a request the engine ended with an error: memory that
 * ran out may come back, and a shutdown is the server's: 503. */
static int http_status_of(og_status st) {
    return st == OG_ERR_OUT_OF_MEMORY || st == OG_ERR_STATE ? 503 : 500;
}

/* ------------------------------------------------------------ bodies */

/* One choice of a response. */
typedef struct choice_out {
    taken t;             /* the last take */
    bool role_sent;      /* chat streams: its first delta went out */
    int64_t text_offset; /* completions' logprobs */
    og_strbuf all;       /* a whole answer: its text, */
    og_token_logprob *all_lps; /* and its logprobs [n_all_lps] */
    int32_t n_all_lps, cap_all_lps;
    og_tool_parser *tools; /* chat with tools: takes the calls out of its text */
} choice_out;

typedef struct gen {
    og_server *s;
    sreq *q;
    choice_out *ch;      /* [n] */
    int32_t n;           /* choices */
    int32_t per_prompt;  /* the request's n */
    int32_t open;        /* choices not ended */
    int32_t turn;        /* the choice waited on next, round robin */
    int32_t logprobs;    /* what the request asked for */
    struct MHD_Connection *c;
    bool chat, include_usage;
    char id[48];
    int64_t created;
    /* streaming */
    og_strbuf out;
    size_t off;
    double out_t; /* when the oldest output in out was produced */
    bool ended;
    int32_t pending; /* a choice whose take is not formatted yet (-1: none) */
    og_tool_format tool_format;
} gen;

/* Takes what choice k has produced, waiting at most timeout_s. False when
 * it has nothing new. */
static bool take_one(gen *g, int32_t k, double timeout_s) {
    og_request *r = g->q->r[k];
    taken *t = &g->ch[k].t;
    if (t->done) return false; /* its end was taken */
    og_request_output o;
    double oldest = 0;
    og_request_backlog(r, NULL, &oldest);
    og_request_next(r, &o, timeout_s);
    if (!(o.n_text || o.n_logprobs || o.n_tokens || o.finish != OG_FINISH_NONE)) return false;
    t->text.n = 0;
    og_strbuf_add(&t->text, o.text, o.n_text);
    if (o.n_logprobs > t->cap_lps) {
        og_token_logprob *b = og_realloc(t->lps, (size_t)o.n_logprobs * sizeof *b);
        if (!b) t->text.oom = true;
        else {
            t->lps = b;
            t->cap_lps = o.n_logprobs;
        }
    }
    t->n_lps = t->text.oom ? 0 : o.n_logprobs;
    if (t->n_lps) memcpy(t->lps, o.logprobs, (size_t)t->n_lps * sizeof *t->lps);
    t->done = o.finish != OG_FINISH_NONE;
    t->finish = o.finish;
    t->http_error = o.finish == OG_FINISH_ERROR ? http_status_of(o.status) : 0;
    snprintf(t->error, sizeof t->error, "%s", o.error);
    t->prompt_tokens = o.prompt_tokens;
    t->completion_tokens = o.completion_tokens;
    t->cached_tokens = o.reused_tokens;
    t->produced = oldest > 0 ? oldest : og_time_now();
    if (t->done) g->open--;
    return true;
}

/* Waits until a choice that has not ended has output or ends, and takes it:
 * its index, or -1 when the client left (every choice is then cancelled). */
static int32_t take(gen *g) {
    const int32_t n = g->q->n;
    for (;;) {
        for (int32_t i = 0; i < n; i++)
            if (!g->ch[i].t.done && take_one(g, i, 0)) return i;
        int32_t k = g->turn % n;
        for (int32_t i = 0; i < n && g->ch[k].t.done; i++) k = (k + 1) % n;
        g->turn = k + 1;
        if (take_one(g, k, n == 1 ? 0.1 : 0.02)) return k;
        if (client_gone(g->c)) {
            sreq_cancel(g->q);
            return -1;
        }
    }
}

/* usage over every choice, as OpenAI counts n > 1: the prompt tokens of
 * each prompt once, the completion tokens of every choice; the prompt
 * tokens taken from the prefix cache as OpenAI reports cached ones
 * (prompt_tokens_details.cached_tokens). */
static cJSON *usage_json(const gen *g) {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (int32_t k = 0; k < g->q->n; k++) {
        const taken *t = &g->ch[k].t;
        if (k % g->per_prompt == 0) prompt += t->prompt_tokens, cached += t->cached_tokens;
        completion += t->completion_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)cached);
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
static void add_logprobs(gen *g, int32_t idx, cJSON *choice, const og_token_logprob *lps, int32_t n) {
    if (g->logprobs < 0) {
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
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)g->ch[idx].text_offset));
        g->ch[idx].text_offset += (int64_t)k;
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

/* Call i of choice k's reply: its id, unique in the server (the response's
 * id, the choice and the call's place), as the template takes it back
 * (Mistral's: 9 letters and digits). */
static void call_id(const gen *g, int32_t k, int i, char *id, size_t cap) {
    char unique[64];
    const char *rid = strchr(g->id, '-') ? strchr(g->id, '-') + 1 : g->id;
    if (g->n > 1) snprintf(unique, sizeof unique, "call_%.24s%d_%d", rid, (int)k, i);
    else snprintf(unique, sizeof unique, "call_%.24s%d", rid, i);
    if (og_tool_call_id(g->tool_format, unique, id, cap) != OG_OK) snprintf(id, cap, "%s", unique);
}

/* The calls' JSON as OpenAI gives them ({id, type, function: {name,
 * arguments}}). */
static cJSON *tool_calls_json(const gen *g, int32_t k, const og_tool_call *calls, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject(), *f;
        char id[64];
        call_id(g, k, i, id, sizeof id);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", calls[i].name);
        cJSON_AddStringToObject(f, "arguments", calls[i].arguments);
        cJSON_AddItemToArray(a, c);
    }
    return a;
}

/* A chunk of a stream with one delta of call i of choice k, as OpenAI
 * streams calls: the first names it ({index, id, type, function: {name,
 * arguments: ""}}), the next ones bring its arguments' bytes ({index,
 * function: {arguments}}). role: the choice's first delta. */
static cJSON *call_chunk_json(gen *g, int32_t k, int i, const char *name, const char *args, bool role) {
    cJSON *root = envelope(g, true), *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject(),
          *d, *calls, *c, *f;
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", k);
    d = cJSON_AddObjectToObject(ch, "delta");
    if (role) {
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddNullToObject(d, "content");
    }
    calls = cJSON_AddArrayToObject(d, "tool_calls");
    c = cJSON_CreateObject();
    cJSON_AddItemToArray(calls, c);
    cJSON_AddNumberToObject(c, "index", i);
    if (name) {
        char id[64];
        call_id(g, k, i, id, sizeof id);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
    }
    f = cJSON_AddObjectToObject(c, "function");
    if (name) cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    if (g->include_usage) cJSON_AddNullToObject(root, "usage");
    return root;
}

/* Choice k's finish_reason: "tool_calls" when its reply called tools and
 * ended by itself. */
static const char *finish_of(const gen *g, int32_t k) {
    const choice_out *c = &g->ch[k];
    const char *fin = og_finish_name(c->t.finish);
    if (c->tools && og_tool_parser_total_calls(c->tools) > 0 && c->t.finish == OG_FINISH_STOP) return "tool_calls";
    return fin ? fin : "stop";
}

/* One chunk of a stream: choice k's text (and its logprobs), or its finish
 * reason. */
static cJSON *chunk_json(gen *g, int32_t k, const char *text, size_t n, const og_token_logprob *lps, int32_t n_lps,
                         bool role, const char *finish) {
    cJSON *root = envelope(g, true), *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", k);
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
    if (n_lps || !finish) add_logprobs(g, k, ch, lps, n_lps);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    /* as OpenAI streams: usage only when stream_options.include_usage asks,
       null in every chunk but the last, which has no choices (stream_format) */
    if (g->include_usage) cJSON_AddNullToObject(root, "usage");
    return root;
}

static void stream_error(gen *g, int status, const char *msg) {
    og_api_error e = {.status = status, .type = status == 503 ? "service_unavailable" : "server_error"};
    snprintf(e.message, sizeof e.message, "%s", msg);
    buf_event(&g->out, error_json(&e));
}

/* Formats what choice k produced (taken into its t) into g->out; after the
 * last choice's end, the usage chunk (when asked) and [DONE]. A choice that
 * fails ends the stream: an end of its own (finish_reason "error"), then
 * the error object; the other choices are cancelled. */
static void stream_format(gen *g, int32_t k) {
    choice_out *c = &g->ch[k];
    taken *t = &c->t;
    bool role = g->chat && !c->role_sent;
    c->role_sent = true;
    if (c->tools) { /* the text less the calls, and the calls as they come */
        const og_tool_piece *pc = NULL;
        int n_pc = 0;
        bool calls = false;
        if (og_tool_parser_feed(c->tools, t->text.p ? t->text.p : "", t->text.n) != OG_OK ||
            (t->done && og_tool_parser_finish(c->tools) != OG_OK))
            t->text.oom = g->out.oom = true;
        if (og_tool_parser_take_pieces(c->tools, &pc, &n_pc) != OG_OK) t->text.oom = g->out.oom = true;
        t->text.n = 0;
        for (int i = 0; i < n_pc; i++) {
            if (pc[i].call < 0) {
                og_strbuf_add(&t->text, pc[i].text, pc[i].n);
                continue;
            }
            /* the content before the call goes first, with the take's logprobs */
            if (t->text.n || t->n_lps) {
                buf_event(&g->out, chunk_json(g, k, t->text.p ? t->text.p : "", t->text.n, t->lps, t->n_lps, role,
                                              NULL));
                t->text.n = 0;
                t->n_lps = 0;
                role = false;
            }
            if (pc[i].name) buf_event(&g->out, call_chunk_json(g, k, pc[i].call, pc[i].name, "", role));
            if (pc[i].n) buf_event(&g->out, call_chunk_json(g, k, pc[i].call, NULL, pc[i].text, role && !pc[i].name));
            role = false;
            calls = true;
        }
        /* sent (content after a call goes on below), or nothing to send yet */
        if (!t->done && !t->text.n && (calls || (!t->n_lps && !role))) {
            g->out_t = t->produced > 0 ? t->produced : og_time_now();
            return;
        }
    }
    if (t->done && t->http_error) {
        if (t->text.n || t->n_lps) buf_event(&g->out, chunk_json(g, k, t->text.p, t->text.n, t->lps, t->n_lps, role, NULL));
        buf_event(&g->out, chunk_json(g, k, "", 0, NULL, 0, role && !t->text.n && !t->n_lps, "error"));
        stream_error(g, t->http_error, t->error);
        sreq_cancel(g->q);
        og_strbuf_add(&g->out, "data: [DONE]\n\n", 14);
        g->ended = true;
    } else if (t->done) {
        if (t->text.n || t->n_lps || role)
            buf_event(&g->out, chunk_json(g, k, t->text.p ? t->text.p : "", t->text.n, t->lps, t->n_lps, role, NULL));
        buf_event(&g->out, chunk_json(g, k, "", 0, NULL, 0, false, finish_of(g, k)));
        if (g->open == 0) {
            if (g->include_usage) {
                cJSON *root = envelope(g, true);
                cJSON_AddArrayToObject(root, "choices");
                cJSON_AddItemToObject(root, "usage", usage_json(g));
                buf_event(&g->out, root);
            }
            og_strbuf_add(&g->out, "data: [DONE]\n\n", 14);
            g->ended = true;
        }
    } else {
        buf_event(&g->out, chunk_json(g, k, t->text.p ? t->text.p : "", t->text.n, t->lps, t->n_lps, role, NULL));
    }
    g->out_t = t->produced > 0 ? t->produced : og_time_now();
}

/* Tells the guard when the oldest output libmicrohttpd holds for the socket
 * was produced (0: it holds none). */
static void stream_sending(gen *g, double t) {
    pthread_mutex_lock(&g->s->lock);
    g->q->t_sending = t;
    pthread_mutex_unlock(&g->s->lock);
}

/* libmicrohttpd asks for more once it has written what it had to the
 * socket; a client that stops reading stops these calls. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    gen *g = cls;
    (void)pos;
    stream_sending(g, 0);
    for (;;) {
        if (g->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->off < g->out.n) {
            size_t k = g->out.n - g->off < max ? g->out.n - g->off : max;
            memcpy(out, g->out.p + g->off, k);
            g->off += k;
            stream_sending(g, g->out_t);
            return (ssize_t)k;
        }
        g->out.n = g->off = 0;
        if (g->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        int32_t k = g->pending;
        g->pending = -1;
        if (k < 0 && (k = take(g)) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        stream_format(g, k);
    }
}

static void gen_free(gen *g) {
    if (!g) return;
    if (g->q) {
        sreq_cancel(g->q);
        sreq_release(g->s, g->q);
    }
    for (int32_t k = 0; g->ch && k < g->n; k++) {
        og_free(g->ch[k].t.text.p);
        og_free(g->ch[k].t.lps);
        og_free(g->ch[k].all.p);
        og_free(g->ch[k].all_lps);
        og_tool_parser_destroy(g->ch[k].tools);
    }
    og_free(g->ch);
    og_free(g->out.p);
    og_free(g);
}

static void stream_free(void *cls) { gen_free(cls); }

/* The whole answer of a request that does not stream. */
static enum MHD_Result respond_complete(conn *cn, struct MHD_Connection *c, gen *g) {
    bool oom = false;
    while (g->open > 0) {
        const int32_t k = g->pending >= 0 ? g->pending : take(g);
        g->pending = -1;
        if (k < 0) return MHD_NO; /* the client left */
        choice_out *ch = &g->ch[k];
        if (ch->t.text.oom) oom = true;
        og_strbuf_add(&ch->all, ch->t.text.p ? ch->t.text.p : "", ch->t.text.n);
        if (ch->t.n_lps) {
            if (ch->n_all_lps + ch->t.n_lps > ch->cap_all_lps) {
                const int32_t cap = 2 * (ch->n_all_lps + ch->t.n_lps);
                og_token_logprob *b = og_realloc(ch->all_lps, (size_t)cap * sizeof *b);
                if (!b) oom = true;
                else ch->all_lps = b, ch->cap_all_lps = cap;
            }
            if (!oom) {
                memcpy(ch->all_lps + ch->n_all_lps, ch->t.lps, (size_t)ch->t.n_lps * sizeof *ch->all_lps);
                ch->n_all_lps += ch->t.n_lps;
            }
        }
        if (ch->all.oom) oom = true;
        if (ch->t.done && ch->t.http_error) {
            sreq_cancel(g->q); /* one failed: the answer is its error */
            return respond_error(cn, c, ch->t.http_error, ch->t.http_error == 503 ? "service_unavailable" : "server_error",
                                 NULL, NULL, ch->t.error, ch->t.http_error == 503 ? "1" : NULL);
        }
    }
    if (oom) return respond_error(cn, c, 500, "server_error", NULL, NULL, "out of memory", NULL);
    cJSON *root = envelope(g, false), *choices = cJSON_AddArrayToObject(root, "choices");
    for (int32_t k = 0; k < g->q->n; k++) {
        choice_out *ch = &g->ch[k];
        cJSON *one = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, one);
        cJSON_AddNumberToObject(one, "index", k);
        if (g->chat && ch->tools) { /* the text less the calls, and the calls */
            const char *content = NULL;
            size_t n_content = 0;
            const og_tool_call *calls = NULL;
            int n_calls = 0;
            og_status fst = og_tool_parser_feed(ch->tools, ch->all.p ? ch->all.p : "", ch->all.n);
            if (fst == OG_OK) fst = og_tool_parser_finish(ch->tools);
            og_tool_parser_take(ch->tools, &content, &n_content, &calls, &n_calls);
            cJSON *m = cJSON_AddObjectToObject(one, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (fst != OG_OK) cJSON_AddStringToObject(m, "content", ch->all.p ? ch->all.p : ""); /* no memory: as text */
            else if (n_calls && !n_content) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", content);
            if (fst == OG_OK && n_calls)
                cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(g, k, calls, n_calls));
        } else if (g->chat) {
            cJSON *m = cJSON_AddObjectToObject(one, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", ch->all.p ? ch->all.p : "");
        } else {
            cJSON_AddStringToObject(one, "text", ch->all.p ? ch->all.p : "");
        }
        add_logprobs(g, k, one, ch->all_lps, ch->n_all_lps);
        cJSON_AddStringToObject(one, "finish_reason", finish_of(g, k));
    }
    cJSON_AddItemToObject(root, "usage", usage_json(g));
    return respond_json(cn, c, 200, root, NULL);
}

/* ------------------------------------------------------------ endpoints */

/* The answer to an engine's refusal of a submit. */
static enum MHD_Result respond_refused(conn *cn, struct MHD_Connection *c, og_status st, const char *msg, bool chat) {
    const char *pname = chat ? "messages" : "prompt";
    switch (st) {
    case OG_ERR_BUSY:
        return respond_error(cn, c, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL,
                             "the server is at its --max-sessions / --kv-budget and its wait queue is full; "
                             "retry later",
                             "1");
    case OG_ERR_STATE:
        return respond_error(cn, c, 503, "service_unavailable", NULL, NULL, "the server is shutting down", "5");
    case OG_ERR_CAPACITY: /* the prompt past the context, or the request past the whole budget */
        return respond_error(cn, c, 400, "invalid_request_error", "context_length_exceeded",
                             strstr(msg, "max_tokens") ? "max_tokens" : pname, msg, NULL);
    case OG_ERR_INVALID_ARGUMENT: /* an empty prompt, the template's refusal, more choices than sessions */
        return respond_error(cn, c, 400, "invalid_request_error", NULL, strstr(msg, "choices") ? "n" : pname, msg,
                             NULL);
    default:
        return respond_error(cn, c, 500, "server_error", NULL, NULL, msg, NULL);
    }
}

/* 413 for a body past --max-body. */
static enum MHD_Result refuse_too_large(conn *cn, struct MHD_Connection *c) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than the server's limit of %zu bytes", cn->s->p.max_body);
    return respond_error(cn, c, 413, "invalid_request_error", "request_too_large", NULL, msg, NULL);
}

static enum MHD_Result generate(conn *cn, struct MHD_Connection *c, bool chat) {
    og_server *s = cn->s;
    og_api_request q;
    og_api_error e;
    if (!og_api_parse(&s->api, cn->body.p ? cn->body.p : "", cn->body.n, chat, &q, &e))
        return respond_json(cn, c, (unsigned)e.status, error_json(&e), NULL);
    if (q.grammar && !s->gvocab) {
        og_api_request_free(&q);
        return respond_error(cn, c, 400, "invalid_request_error", NULL, "response_format",
                             "'response_format' needs an end-of-sequence token, and this model's tokenizer has none",
                             NULL);
    }
    const int32_t n_prompts = chat ? 1 : q.n_prompts, total = n_prompts * q.n;
    sreq *sq = og_calloc(1, sizeof *sq);
    gen *g = sq ? og_calloc(1, sizeof *g) : NULL;
    if (sq) {
        sq->refs = 1;
        sq->r = og_calloc((size_t)total, sizeof *sq->r);
        sq->matcher = q.grammar ? og_calloc((size_t)total, sizeof *sq->matcher) : NULL;
        sq->grammar = q.grammar; /* response_format: a matcher a choice is its constraint */
        q.grammar = NULL;
    }
    if (g) g->ch = og_calloc((size_t)total, sizeof *g->ch);
    bool oom = !g || !g->ch || !sq->r || (sq->grammar && !sq->matcher);
    for (int32_t k = 0; !oom && sq->grammar && k < total; k++)
        oom = og_matcher_create(sq->grammar, s->gvocab, &sq->matcher[k]) != OG_OK;
    for (int32_t k = 0; !oom && q.tool_format != OG_TOOL_FORMAT_NONE && k < total; k++)
        oom = og_tool_parser_create(q.tool_format, &g->ch[k].tools) != OG_OK;
    if (oom) {
        og_api_request_free(&q);
        for (int32_t k = 0; g && g->ch && k < total; k++) og_tool_parser_destroy(g->ch[k].tools);
        og_free(g ? g->ch : NULL);
        og_free(g);
        if (sq) sq->n = total;
        sreq_release(s, sq);
        return respond_error(cn, c, 500, "server_error", NULL, NULL, "out of memory", NULL);
    }
    sq->n = total;
    og_status st = OG_OK;
    for (int32_t i = 0; i < n_prompts && st == OG_OK; i++) {
        og_request_params rp = og_api_request_params(&q, i);
        if (sq->matcher) rp.constraint = og_grammar_constraint;
        st = og_engine_submit_n(s->engine, &rp, q.n, sq->matcher ? (void *const *)&sq->matcher[i * q.n] : NULL,
                                &sq->r[i * q.n]);
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == OG_OK ? "" : og_last_error());
    const bool stream = q.stream;
    g->s = s;
    g->q = sq;
    g->c = c;
    g->chat = chat;
    g->include_usage = q.include_usage;
    g->tool_format = q.tool_format;
    g->logprobs = q.logprobs;
    g->per_prompt = q.n;
    g->n = g->open = total;
    g->pending = -1;
    og_api_request_free(&q);
    if (st != OG_OK) {
        gen_free(g); /* the choices submitted are cancelled */
        return respond_refused(cn, c, st, msg, chat);
    }
    pthread_mutex_lock(&s->lock);
    uint64_t serial = ++s->serial;
    pthread_mutex_unlock(&s->lock);
    g->created = (int64_t)time(NULL);
    snprintf(g->id, sizeof g->id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)((serial * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)g->created << 20)));
    if (!stream) {
        enum MHD_Result ret = respond_complete(cn, c, g);
        gen_free(g);
        return ret;
    }
    /* The status line waits for the first output: a request that fails
     * before it (no KV memory, a shutdown) is answered with its status. */
    if ((g->pending = take(g)) < 0) {
        gen_free(g);
        return MHD_NO; /* the client left */
    }
    const taken *t0 = &g->ch[g->pending].t;
    if (t0->done && t0->http_error && t0->text.n == 0 && t0->n_lps == 0) {
        const int status = t0->http_error;
        char why[sizeof t0->error];
        snprintf(why, sizeof why, "%s", t0->error);
        gen_free(g);
        return respond_error(cn, c, status, status == 503 ? "service_unavailable" : "server_error", NULL, NULL, why,
                             status == 503 ? "1" : NULL);
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
    if (ret == MHD_YES) guard_enter(s, cn->gc, GUARD_STREAMING, sq);
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

/* The key is compared in time that depends on its length only, never on
 * how much of it a guess has right (nor on the guess's length: every byte of
 * the key is compared, against a zero past the guess's end). */
static bool authorized(const og_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    const size_t n = strlen(h), k = strlen(s->api_key);
    volatile unsigned char diff = (unsigned char)(n != k);
    for (size_t i = 0; i < k; i++) {
        const unsigned char g = i < n ? (unsigned char)h[i] : 0;
        diff |= (unsigned char)(g ^ (unsigned char)s->api_key[i]);
    }
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
        char *text = og_engine_metrics_text(s->engine), *http = og_http_metrics_text(s);
        og_strbuf all = {0};
        if (text && http) {
            og_strbuf_add(&all, text, strlen(text));
            og_strbuf_add(&all, http, strlen(http));
        }
        og_free(text);
        og_free(http);
        if (!all.p || all.oom) {
            og_free(all.p);
            return MHD_NO;
        }
        enum MHD_Result r = respond(cn, c, 200, "text/plain; version=0.0.4", all.p, all.n, NULL);
        og_free(all.p);
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
    (void)version;
    if (!cn) { /* the headers are in: the body's deadline starts */
        guard_conn *gc = guard_of(c);
        if (!guard_enter(s, gc, GUARD_BODY, NULL)) return MHD_NO; /* too late: the guard answered 408 */
        if (!(cn = og_calloc(1, sizeof *cn))) return MHD_NO;
        cn->s = s;
        cn->gc = gc;
        cn->method = method;
        cn->url = url;
        *state = cn;
        pthread_mutex_lock(&s->lock);
        s->active_responses++;
        cn->counted = true;
        pthread_mutex_unlock(&s->lock);
        /* A body past the limit is read and dropped, and answered 413 at
         * its end (below, whatever the endpoint): answered now, the
         * connection would close with the client still sending, and its
         * reset can reach the client before the answer does. One declared
         * far past the limit is answered at once, so that no one makes the
         * server read it. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        const unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > s->p.max_body) cn->too_large = true;
        if (declared / 8 > s->p.max_body) {
            cn->answered = true;
            return refuse_too_large(cn, c);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!guard_body_bytes(s, cn->gc, *upload_size)) return MHD_NO; /* too slow: the guard answered 408 */
        if (cn->answered) { /* refused at the first call: the rest is dropped */
            *upload_size = 0;
            return MHD_YES;
        }
        if (cn->body.n + *upload_size > s->p.max_body) cn->too_large = true;
        if (!cn->too_large) og_strbuf_add(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return cn->body.oom ? MHD_NO : MHD_YES;
    }
    if (cn->answered) return MHD_YES;
    cn->answered = true;
    if (!guard_enter(s, cn->gc, GUARD_WORKING, NULL)) return MHD_NO;
    if (cn->too_large) return refuse_too_large(cn, c); /* the body read and dropped: any endpoint */
    return route(cn, c, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode toe) {
    og_server *s = cls;
    conn *cn = *state;
    (void)toe;
    guard_response_ended(s, guard_of(c));
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
    og_status st = guard_start(s);
    if (st != OG_OK) {
        freeaddrinfo(ai);
        guard_stop(s);
        return st;
    }
    /* A thread per connection (handlers block while their request runs),
     * polled with poll(2): select(2) cannot watch descriptors past 1023. In
     * this mode libmicrohttpd accepts past MHD_OPTION_CONNECTION_LIMIT and
     * closes at once, as it does past the per-address limit. Its idle
     * timeout is only the backstop here: the guard's deadlines come first. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    const double longest = s->p.header_timeout_s > s->p.write_timeout_s ? s->p.header_timeout_s : s->p.write_timeout_s;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, guard_log, s->guard,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, guard_notify, s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)s->p.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                 (unsigned)s->p.max_connections_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)longest + 2, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        guard_stop(s);
        return og_set_error(OG_ERR_IO, "serve: cannot listen on %s port %d (in use, or not an address of this machine)",
                            s->host, (int)s->p.port);
    }
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
    guard_stop(s);
}
