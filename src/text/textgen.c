/* The generation loop's text side (see textgen.h). */
#include "text/textgen.h"

#include "core/core.h"

#include <string.h>

struct og_textgen {
    og_decode_stream *stream; /* owned */
    int64_t max_tokens, tokens;
    int32_t *stop_ids;        /* [n_stop_ids], owned */
    int32_t n_stop_ids;
    char **stops;             /* [n_stops], owned, non-empty */
    int32_t n_stops;
    char *held;               /* text decoded but not given out: a tail that may start a stop string */
    size_t n_held, cap_held;
    char *out;                /* what the last call gave out */
    size_t cap_out;
    og_finish finish;
};

const char *og_finish_name(og_finish f) {
    switch (f) {
    case OG_FINISH_STOP: return "stop";
    case OG_FINISH_LENGTH: return "length";
    case OG_FINISH_CANCELLED: return "cancelled";
    case OG_FINISH_ERROR: return "error";
    case OG_FINISH_NONE: break;
    }
    return NULL;
}

void og_textgen_destroy(og_textgen *g) {
    if (!g) return;
    og_decode_stream_destroy(g->stream);
    og_free(g->stop_ids);
    for (int32_t i = 0; i < g->n_stops; i++) og_free(g->stops[i]);
    og_free(g->stops);
    og_free(g->held);
    og_free(g->out);
    og_free(g);
}

og_status og_textgen_create(const og_tokenizer *tok, const og_textgen_params *p, og_textgen **out) {
    if (!tok || !p || !out || p->max_tokens < 0 || p->n_stop_ids < 0 || p->n_stop_strings < 0 ||
        (p->n_stop_ids && !p->stop_ids) || (p->n_stop_strings && !p->stop_strings))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_textgen_create: a NULL or negative argument");
    og_textgen *g = og_calloc(1, sizeof *g);
    if (!g) goto oom;
    if (og_decode_stream_create(tok, &g->stream) != OG_OK) goto oom;
    g->max_tokens = p->max_tokens;
    if (p->n_stop_ids) {
        if (!(g->stop_ids = og_calloc((size_t)p->n_stop_ids, sizeof *g->stop_ids))) goto oom;
        memcpy(g->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *g->stop_ids);
        g->n_stop_ids = p->n_stop_ids;
    }
    if (p->n_stop_strings) {
        if (!(g->stops = og_calloc((size_t)p->n_stop_strings, sizeof *g->stops))) goto oom;
        for (int32_t i = 0; i < p->n_stop_strings; i++) {
            if (!p->stop_strings[i]) {
                og_textgen_destroy(g);
                return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_textgen_create: stop string %d is NULL", i);
            }
            if (!*p->stop_strings[i]) continue;
            if (!(g->stops[g->n_stops] = og_strdup(p->stop_strings[i]))) goto oom;
            g->n_stops++;
        }
    }
    *out = g;
    return OG_OK;
oom:
    og_textgen_destroy(g);
    return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_textgen_create: out of memory");
}

static og_status reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return OG_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    char *b = og_realloc(*buf, n);
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_textgen: out of memory");
    *buf = b;
    *cap = n;
    return OG_OK;
}

/* Moves the first n held bytes to the output (after what is there). */
static og_status give(og_textgen *g, size_t n, size_t *len) {
    OG_TRY(reserve(&g->out, &g->cap_out, *len + n + 1));
    memcpy(g->out + *len, g->held, n);
    *len += n;
    g->out[*len] = 0;
    memmove(g->held, g->held + n, g->n_held - n);
    g->n_held -= n;
    return OG_OK;
}

/* The earliest stop string in the held text: its offset, or -1. */
static int64_t find_stop(const og_textgen *g) {
    int64_t best = -1;
    for (int32_t i = 0; i < g->n_stops; i++) {
        size_t k = strlen(g->stops[i]);
        for (size_t at = 0; at + k <= g->n_held && (best < 0 || (int64_t)at < best); at++)
            if (!memcmp(g->held + at, g->stops[i], k)) {
                best = (int64_t)at;
                break;
            }
    }
    return best;
}

/* Length of the longest tail of the held text that is a proper prefix of a
 * stop string (it may become one with the next tokens). */
static size_t stop_prefix_tail(const og_textgen *g) {
    size_t best = 0;
    for (int32_t i = 0; i < g->n_stops; i++) {
        size_t k = strlen(g->stops[i]);
        for (size_t t = (k - 1 < g->n_held ? k - 1 : g->n_held); t > best; t--)
            if (!memcmp(g->held + g->n_held - t, g->stops[i], t)) {
                best = t;
                break;
            }
    }
    return best;
}

/* Appends decoded text to the held text and gives out what is final. */
static og_status take_text(og_textgen *g, const char *t, size_t n, bool last, size_t *len) {
    OG_TRY(reserve(&g->held, &g->cap_held, g->n_held + n + 1));
    memcpy(g->held + g->n_held, t, n);
    g->n_held += n;
    int64_t at = find_stop(g);
    if (at >= 0) {
        OG_TRY(give(g, (size_t)at, len));
        g->n_held = 0;
        g->finish = OG_FINISH_STOP;
        return OG_OK;
    }
    return give(g, last ? g->n_held : g->n_held - stop_prefix_tail(g), len);
}

static og_status finish_text(og_textgen *g, og_finish why, size_t *len) {
    const char *t;
    size_t n;
    OG_TRY(og_decode_stream_finish(g->stream, &t, &n));
    OG_TRY(take_text(g, t, n, true, len));
    if (g->finish == OG_FINISH_NONE) g->finish = why;
    return OG_OK;
}

og_status og_textgen_push(og_textgen *g, int32_t token, const char **text, size_t *len, og_finish *finish) {
    if (!g || !text || !len || !finish) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_textgen_push: NULL argument");
    *text = "";
    *len = 0;
    *finish = g->finish;
    if (g->finish != OG_FINISH_NONE) return og_set_error(OG_ERR_STATE, "og_textgen_push: the generation has ended");
    OG_TRY(reserve(&g->out, &g->cap_out, 1));
    g->out[0] = 0;
    size_t n_out = 0;
    bool stop = g->tokens >= g->max_tokens;
    for (int32_t k = 0; k < g->n_stop_ids && !stop; k++) stop = token == g->stop_ids[k];
    if (stop) {
        OG_TRY(finish_text(g, g->tokens >= g->max_tokens ? OG_FINISH_LENGTH : OG_FINISH_STOP, &n_out));
    } else {
        const char *t;
        size_t n;
        OG_TRY(og_decode_stream_push(g->stream, token, &t, &n));
        g->tokens++;
        OG_TRY(take_text(g, t, n, false, &n_out));
        if (g->finish == OG_FINISH_NONE && g->tokens >= g->max_tokens) OG_TRY(finish_text(g, OG_FINISH_LENGTH, &n_out));
    }
    *text = g->out;
    *len = n_out;
    *finish = g->finish;
    return OG_OK;
}

og_status og_textgen_end(og_textgen *g, og_finish why, const char **text, size_t *len) {
    if (!g || !text || !len) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_textgen_end: NULL argument");
    *text = "";
    *len = 0;
    if (g->finish != OG_FINISH_NONE) return OG_OK;
    OG_TRY(reserve(&g->out, &g->cap_out, 1));
    g->out[0] = 0;
    size_t n_out = 0;
    OG_TRY(finish_text(g, why == OG_FINISH_NONE ? OG_FINISH_STOP : why, &n_out));
    *text = g->out;
    *len = n_out;
    return OG_OK;
}

int64_t og_textgen_tokens(const og_textgen *g) { return g ? g->tokens : 0; }
og_finish og_textgen_finish_reason(const og_textgen *g) { return g ? g->finish : OG_FINISH_NONE; }
