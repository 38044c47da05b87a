/* Tool calls in a model's output (see tool_calls.h). */
#include "text/tool_calls.h"

#include "core/core.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char CLOSE[] = "</tool_call>", PYTHON_TAG[] = "<|python_tag|>";
#define CLOSE_LEN (sizeof CLOSE - 1)

/* The marker that opens calls ("" for Llama 3.1: a call is the whole reply). */
static const char *open_marker(og_tool_format f) {
    return f == OG_TOOL_FORMAT_HERMES ? "<tool_call>" : f == OG_TOOL_FORMAT_MISTRAL ? "[TOOL_CALLS]" : "";
}

og_tool_format og_tool_format_detect(const char *t) {
    if (!t || !strstr(t, "tools")) return OG_TOOL_FORMAT_NONE;
    if (strstr(t, "<tool_call>")) return OG_TOOL_FORMAT_HERMES;
    if (strstr(t, "[TOOL_CALLS]")) return OG_TOOL_FORMAT_MISTRAL;
    if (strstr(t, PYTHON_TAG) || (strstr(t, "ipython") && strstr(t, "\"parameters\": "))) return OG_TOOL_FORMAT_LLAMA3;
    return OG_TOOL_FORMAT_OTHER;
}

og_tool_format og_tokenizer_tool_format(const og_tokenizer *t) {
    return t ? og_tool_format_detect(og_tokenizer_chat_template(t)) : OG_TOOL_FORMAT_NONE;
}

og_status og_tool_call_id(og_tool_format f, const char *unique, char *out, size_t cap) {
    if (!unique || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_call_id: NULL argument");
    if (f == OG_TOOL_FORMAT_MISTRAL) { /* its template takes back only 9 letters and digits */
        static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        if (cap < 10) return og_set_error(OG_ERR_CAPACITY, "og_tool_call_id: %zu bytes hold no id", cap);
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
        for (const char *q = unique; *q; q++) h = (h ^ (unsigned char)*q) * 0x100000001b3ull;
        for (int j = 0; j < 9; j++, h /= 62) out[j] = digits[h % 62];
        out[9] = 0;
        return OG_OK;
    }
    const size_t n = strlen(unique);
    if (n + 1 > cap) return og_set_error(OG_ERR_CAPACITY, "og_tool_call_id: %zu bytes hold no id of %zu", cap, n);
    memcpy(out, unique, n + 1);
    return OG_OK;
}

const char *og_tool_format_name(og_tool_format f) {
    switch (f) {
    case OG_TOOL_FORMAT_HERMES: return "hermes";
    case OG_TOOL_FORMAT_MISTRAL: return "mistral";
    case OG_TOOL_FORMAT_LLAMA3: return "llama3";
    case OG_TOOL_FORMAT_OTHER: return "other";
    case OG_TOOL_FORMAT_NONE: break;
    }
    return "none";
}

/* ------------------------------------------------------------ growable bytes */

typedef struct bytes {
    char *p;
    size_t n, cap;
} bytes;

static bool put(bytes *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = og_realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

/* Drops b's first k bytes. */
static void drop(bytes *b, size_t k) {
    memmove(b->p, b->p + k, b->n - k);
    b->n -= k;
    b->p[b->n] = 0;
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Where needle starts in b (from 0), or -1. */
static long find(const bytes *b, const char *needle, size_t k) {
    if (b->n < k) return -1;
    for (size_t i = 0; i + k <= b->n; i++)
        if (b->p[i] == needle[0] && !memcmp(b->p + i, needle, k)) return (long)i;
    return -1;
}

/* ------------------------------------------------------------ a call's body */

/* The end of the JSON value at s[i] (s[0..n) holds a valid JSON text: cJSON
 * checked it), past its last byte. */
static size_t skip_value(const char *s, size_t n, size_t i) {
    if (s[i] == '"') {
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\') i++;
        return i + 1;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                i = skip_value(s, n, i) - 1;
            } else if (s[i] == '{' || s[i] == '[') {
                depth++;
            } else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return n;
    }
    while (i < n && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') i++;
    return i;
}

/* Where the JSON array or object that b starts with (after whitespace)
 * ends, past its last byte: -1 while it is not complete, -2 when b does not
 * start with one. Brackets are counted, strings skipped; cJSON judges the
 * rest. */
static long json_end(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && is_space(s[i])) i++;
    if (i == n) return -1;
    if (s[i] != '[' && s[i] != '{') return -2;
    int depth = 0;
    for (; i < n; i++) {
        if (s[i] == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            if (i >= n) return -1;
        } else if (s[i] == '{' || s[i] == '[') {
            depth++;
        } else if ((s[i] == '}' || s[i] == ']') && --depth == 0) {
            return (long)i + 1;
        }
    }
    return -1;
}

/* The bytes of the top-level member key of the JSON object text s[0..n)
 * (valid: cJSON parsed it), or false. */
static bool member_span(const char *s, size_t n, const char *key, size_t *at, size_t *len) {
    size_t i = 0;
    while (i < n && s[i] != '{') i++;
    for (i++; i < n;) {
        while (i < n && (is_space(s[i]) || s[i] == ',')) i++;
        if (i >= n || s[i] != '"') return false;
        size_t k0 = i, k1 = skip_value(s, n, i);
        i = k1;
        while (i < n && (is_space(s[i]) || s[i] == ':')) i++;
        size_t v0 = i, v1 = skip_value(s, n, i);
        i = v1;
        /* the raw key: compare without escapes (a key with escapes is not
           "arguments" as written by a model) */
        if (k1 - k0 == strlen(key) + 2 && !memcmp(s + k0 + 1, key, strlen(key))) {
            *at = v0;
            *len = v1 - v0;
            return true;
        }
    }
    return false;
}

/* Whether s[0..n) (JSON that cJSON took) is JSON as strict parsers read
 * it: cJSON lets control bytes through as whitespace (even NUL) and inside
 * strings, JSON.parse and Python's json do not. */
static bool strict_json(const char *s, size_t n) {
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
            else if (c < 0x20) return false;
        } else if (c == '"') {
            in_string = true;
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            return false;
        }
    }
    return true;
}

/* A block's body as a call: a JSON object with a string "name" and
 * "arguments" (or "parameters", as some fine-tunes write) an object, or a
 * string holding one. False when it is not one (then it is text). */
static bool body_call(const char *body, size_t n, bool need_args, og_tool_call *out, bool *oom) {
    memset(out, 0, sizeof *out);
    while (n && is_space(*body)) body++, n--;
    while (n && is_space(body[n - 1])) n--;
    /* NUL and other control bytes where JSON has none: not a call */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)body[i] < 0x20 && body[i] != '\t' && body[i] != '\n' && body[i] != '\r') return false;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    const cJSON *name = j ? cJSON_GetObjectItemCaseSensitive(j, "name") : NULL;
    if (!cJSON_IsObject(j) || end != body + n || !cJSON_IsString(name) || !*name->valuestring) {
        cJSON_Delete(j);
        return false;
    }
    const char *key = "arguments";
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, key = "parameters");
    if (need_args && !cJSON_IsObject(args)) {
        cJSON_Delete(j);
        return false;
    }
    bool ok = true;
    char *text = NULL;
    if (!args || cJSON_IsNull(args)) {
        text = og_strdup("{}");
    } else if (cJSON_IsString(args)) { /* arguments already as JSON text */
        cJSON *inner = cJSON_Parse(args->valuestring);
        ok = cJSON_IsObject(inner);
        if (ok && strict_json(args->valuestring, strlen(args->valuestring))) {
            text = og_strdup(args->valuestring);
        } else if (ok) {
            char *t = cJSON_PrintUnformatted(inner);
            text = t ? og_strdup(t) : NULL;
            cJSON_free(t);
        }
        cJSON_Delete(inner);
    } else if (cJSON_IsObject(args)) {
        size_t at = 0, len = 0;
        if (member_span(body, n, key, &at, &len) && strict_json(body + at, len)) {
            if ((text = og_malloc(len + 1))) {
                memcpy(text, body + at, len);
                text[len] = 0;
            }
        } else { /* a key written with escapes, or a raw newline in a string: cJSON's print */
            char *t = cJSON_PrintUnformatted(args);
            text = t ? og_strdup(t) : NULL;
            cJSON_free(t);
        }
    } else {
        ok = false;
    }
    if (ok) {
        out->name = og_strdup(name->valuestring);
        out->arguments = text;
        text = NULL;
        if (!out->name || !out->arguments) {
            *oom = true;
            og_free(out->name);
            og_free(out->arguments);
            memset(out, 0, sizeof *out);
            ok = false;
        }
    }
    og_free(text);
    cJSON_Delete(j);
    return ok;
}

/* ------------------------------------------------------------ the parser */

struct og_tool_parser {
    og_tool_format f;
    bool inside;       /* after an opening marker */
    bool after_call;   /* content's leading whitespace is dropped */
    bool finished;
    bool plain;        /* LLAMA3: the reply does not start with a call: text */
    bytes pending;     /* outside: text not given out yet */
    bytes body;        /* inside: the block's text so far */
    bytes gap;         /* inside: the whitespace before the block (content
                          again if the block is not a call) */
    bytes content;     /* ready to take */
    og_tool_call *calls; /* ready to take */
    int n_calls, cap_calls;
    int total;
    og_tool_call *taken; /* given out by the last take (freed at the next call) */
    int n_taken;
};

og_status og_tool_parser_create(og_tool_format f, og_tool_parser **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_parser_create: NULL out");
    og_tool_parser *p = og_calloc(1, sizeof *p);
    if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    p->f = f;
    if (!put(&p->content, "", 0)) {
        og_free(p);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    }
    *out = p;
    return OG_OK;
}

static void free_calls(og_tool_call *c, int n) {
    for (int i = 0; i < n; i++) {
        og_free(c[i].name);
        og_free(c[i].arguments);
    }
}

static void forget_taken(og_tool_parser *p) {
    free_calls(p->taken, p->n_taken);
    og_free(p->taken);
    p->taken = NULL;
    p->n_taken = 0;
}

void og_tool_parser_destroy(og_tool_parser *p) {
    if (!p) return;
    forget_taken(p);
    free_calls(p->calls, p->n_calls);
    og_free(p->calls);
    og_free(p->pending.p);
    og_free(p->body.p);
    og_free(p->gap.p);
    og_free(p->content.p);
    og_free(p);
}

/* Gives out s[0..n) as content (its leading whitespace dropped right after
 * a call). */
static bool emit(og_tool_parser *p, const char *s, size_t n) {
    if (p->after_call) {
        while (n && is_space(*s)) s++, n--;
        if (!n) return true;
        p->after_call = false;
    }
    return put(&p->content, s, n);
}

static bool add_call(og_tool_parser *p, const og_tool_call *c) {
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? 2 * p->cap_calls : 4;
        og_tool_call *q = og_realloc(p->calls, (size_t)cap * sizeof *q);
        if (!q) return false;
        p->calls = q;
        p->cap_calls = cap;
    }
    p->calls[p->n_calls++] = *c;
    p->total++;
    p->after_call = true;
    return true;
}

/* Mistral's body: a JSON array of calls (or one call), each element's
 * bytes its own; all calls or none (then false). */
static bool array_calls(og_tool_parser *p, const char *s, size_t n, bool *oom) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    if (n && *s == '{') {
        og_tool_call c;
        if (!body_call(s, n, false, &c, oom)) return false;
        if (!add_call(p, &c)) {
            free_calls(&c, 1);
            *oom = true;
            return false;
        }
        return true;
    }
    cJSON *j = cJSON_ParseWithLength(s, n);
    const bool array = cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0;
    cJSON_Delete(j);
    if (!array) return false;
    og_tool_call calls[64];
    int k = 0;
    bool ok = true;
    for (size_t i = 1; ok && i < n;) { /* past '[' */
        while (i < n && (is_space(s[i]) || s[i] == ',')) i++;
        if (i >= n || s[i] == ']') break;
        size_t e = skip_value(s, n, i);
        ok = k < 64 && body_call(s + i, e - i, false, &calls[k], oom);
        if (ok) k++;
        i = e;
    }
    for (int i = 0; ok && i < k; i++) {
        if (!add_call(p, &calls[i])) {
            *oom = true;
            free_calls(calls + i, k - i);
            return false;
        }
    }
    if (!ok) free_calls(calls, k);
    return ok;
}

/* A block ended (closed, or unclosed at the end): calls, or text. */
static bool end_block(og_tool_parser *p, bool closed) {
    og_tool_call c;
    bool oom = false;
    bool ok = true;
    const char *body = p->body.p ? p->body.p : "", *open = open_marker(p->f);
    size_t n = p->body.n;
    bool calls = false;
    if (p->f == OG_TOOL_FORMAT_MISTRAL) {
        calls = array_calls(p, body, n, &oom);
    } else {
        const char *b = body;
        size_t k = n;
        if (p->f == OG_TOOL_FORMAT_LLAMA3) { /* "<|python_tag|>" may come first */
            while (k && is_space(*b)) b++, k--;
            if (k >= sizeof PYTHON_TAG - 1 && !memcmp(b, PYTHON_TAG, sizeof PYTHON_TAG - 1))
                b += sizeof PYTHON_TAG - 1, k -= sizeof PYTHON_TAG - 1;
        }
        /* Llama's bare JSON: only an object with its arguments is a call */
        if ((calls = body_call(b, k, p->f == OG_TOOL_FORMAT_LLAMA3, &c, &oom)) && !add_call(p, &c)) {
            free_calls(&c, 1);
            ok = false;
        }
    }
    if (oom) {
        ok = false;
    } else if (!calls) { /* not a call: the model's text as it wrote it */
        ok = emit(p, p->gap.p ? p->gap.p : "", p->gap.n) && emit(p, open, strlen(open)) && emit(p, body, n) &&
             (!closed || p->f != OG_TOOL_FORMAT_HERMES || emit(p, CLOSE, CLOSE_LEN));
    }
    p->gap.n = 0;
    p->body.n = 0;
    if (p->body.p) p->body.p[0] = 0;
    p->inside = false;
    return ok;
}

/* Gives out what pending and body can decide now. */
static bool advance(og_tool_parser *p) {
    const char *open = open_marker(p->f);
    const size_t open_len = strlen(open);
    for (;;) {
        if (p->inside && p->f == OG_TOOL_FORMAT_LLAMA3) return true; /* the whole reply, at the end */
        if (p->inside && p->f == OG_TOOL_FORMAT_MISTRAL) {
            long k = json_end(p->body.p ? p->body.p : "", p->body.n);
            if (k == -1) return true;
            if (k == -2) { /* not JSON after the marker: text */
                if (!put(&p->pending, p->body.p, p->body.n)) return false;
                p->body.n = 0;
                if (!end_block(p, false)) return false;
                continue;
            }
            if (!put(&p->pending, p->body.p + k, p->body.n - (size_t)k)) return false;
            p->body.n = (size_t)k;
            p->body.p[k] = 0;
            if (!end_block(p, true)) return false;
            continue;
        }
        if (p->f == OG_TOOL_FORMAT_LLAMA3 && !p->plain) {
            /* a call is the whole reply: it starts with "{" or the python tag */
            size_t i = 0, n = p->pending.n;
            while (i < n && is_space(p->pending.p[i])) i++;
            const size_t tag = sizeof PYTHON_TAG - 1, m = n - i < tag ? n - i : tag;
            if (i < n && (p->pending.p[i] == '{' || (n - i >= tag && !memcmp(p->pending.p + i, PYTHON_TAG, tag)))) {
                if (!put(&p->body, p->pending.p, n)) return false;
                p->pending.n = 0;
                p->inside = true;
                return true;
            }
            if (i == n || !memcmp(p->pending.p + i, PYTHON_TAG, m)) return true; /* not decided yet */
            p->plain = true;
        }
        if (p->f == OG_TOOL_FORMAT_LLAMA3) { /* text */
            if (!emit(p, p->pending.p, p->pending.n)) return false;
            p->pending.n = 0;
            return true;
        }
        if (p->inside) {
            long k = find(&p->body, CLOSE, CLOSE_LEN);
            if (k < 0) return true;
            size_t rest = p->body.n - (size_t)k - CLOSE_LEN;
            /* what follows the block goes back outside */
            if (!put(&p->pending, p->body.p + k + CLOSE_LEN, rest)) return false;
            p->body.n = (size_t)k;
            p->body.p[k] = 0;
            if (!end_block(p, true)) return false;
            continue;
        }
        long k = find(&p->pending, open, open_len);
        if (k >= 0) {
            size_t pre = (size_t)k;
            while (pre && is_space(p->pending.p[pre - 1])) pre--; /* the whitespace before a call */
            if (!emit(p, p->pending.p, pre)) return false;
            p->gap.n = 0;
            if (!put(&p->gap, p->pending.p + pre, (size_t)k - pre)) return false;
            if (!put(&p->body, p->pending.p + k + open_len, p->pending.n - (size_t)k - open_len)) return false;
            p->pending.n = 0;
            p->pending.p[0] = 0;
            p->inside = true;
            continue;
        }
        /* hold back a possible marker's start, and the whitespace before it */
        size_t n = p->pending.n, hold = 0;
        for (size_t h = open_len - 1; h > 0; h--)
            if (h <= n && !memcmp(p->pending.p + n - h, open, h)) {
                hold = h;
                break;
            }
        size_t end = n - hold;
        while (end && is_space(p->pending.p[end - 1])) end--;
        if (end) {
            if (!emit(p, p->pending.p, end)) return false;
            drop(&p->pending, end);
        }
        return true;
    }
}

og_status og_tool_parser_feed(og_tool_parser *p, const char *text, size_t n) {
    if (!p || (!text && n)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_parser_feed: NULL argument");
    if ((p->f != OG_TOOL_FORMAT_HERMES && p->f != OG_TOOL_FORMAT_MISTRAL && p->f != OG_TOOL_FORMAT_LLAMA3) ||
        p->finished) {
        if (!put(&p->content, text, n)) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
        return OG_OK;
    }
    bytes *b = p->inside ? &p->body : &p->pending;
    if (!put(b, text, n) || !advance(p)) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    return OG_OK;
}

og_status og_tool_parser_finish(og_tool_parser *p) {
    if (!p) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_parser_finish: NULL argument");
    if (p->finished) return OG_OK;
    p->finished = true;
    if (p->inside && !end_block(p, false)) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    /* what was held back: all of it when there was no call (the output as
       it is), else without the whitespace around the calls */
    size_t n = p->pending.n;
    if (p->total) {
        while (n && is_space(p->pending.p[n - 1])) n--;
    }
    if (n && !emit(p, p->pending.p, n)) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    p->pending.n = 0;
    return OG_OK;
}

void og_tool_parser_take(og_tool_parser *p, const char **content, size_t *n_content, const og_tool_call **calls,
                         int *n_calls) {
    forget_taken(p);
    /* the content buffer is handed out as it is and starts over at the next
       feed: keep it until then */
    static const char empty[] = "";
    *content = p->content.n ? p->content.p : empty;
    *n_content = p->content.n;
    p->taken = p->calls;
    p->n_taken = p->n_calls;
    p->calls = NULL;
    p->n_calls = p->cap_calls = 0;
    *calls = p->taken;
    *n_calls = p->n_taken;
    p->content.n = 0; /* the bytes stay until the next put */
}

int og_tool_parser_total_calls(const og_tool_parser *p) { return p ? p->total : 0; }

/* ------------------------------------------------------------ the grammar of calls */

typedef struct gtext {
    bytes b;
    bool oom;
} gtext;

static void gadd(gtext *g, const char *fmt, ...) OG_PRINTF(2, 3);
static void gadd(gtext *g, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) {
        g->oom = true;
        return;
    }
    if ((size_t)k < sizeof small) {
        if (!put(&g->b, small, (size_t)k)) g->oom = true;
        return;
    }
    char *big = og_malloc((size_t)k + 1);
    if (!big) {
        g->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    if (!put(&g->b, big, (size_t)k)) g->oom = true;
    og_free(big);
}

static bool gbnf_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Appends GBNF text s with every rule name prefixed (t<i>-name): literals,
 * classes, repetition counts and comments are copied as they are. */
static void add_renamed(gtext *g, const char *s, int i) {
    size_t n = strlen(s);
    for (size_t k = 0; k < n;) {
        char c = s[k];
        size_t start = k;
        if (c == '"' || c == '[') {
            const char end = c == '"' ? '"' : ']';
            for (k++; k < n && s[k] != end; k++)
                if (s[k] == '\\' && k + 1 < n) k++;
            k++;
        } else if (c == '{') {
            while (k < n && s[k] != '}') k++;
            k++;
        } else if (c == '#') {
            while (k < n && s[k] != '\n') k++;
        } else if (gbnf_name_char(c)) {
            while (k < n && gbnf_name_char(s[k])) k++;
            gadd(g, "t%d-", i);
        } else {
            k++;
        }
        if (k > n) k = n;
        if (!put(&g->b, s + start, k - start)) g->oom = true;
    }
}

og_status og_tool_calls_grammar_text(og_tool_format f, const char *tools_json, const char *only_name, bool parallel,
                                     char **out) {
    if (!out || !tools_json) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_calls_grammar_text: NULL argument");
    *out = NULL;
    if (f != OG_TOOL_FORMAT_HERMES && f != OG_TOOL_FORMAT_MISTRAL && f != OG_TOOL_FORMAT_LLAMA3)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "tool calls: no grammar for the %s format", og_tool_format_name(f));
    cJSON *tools = cJSON_Parse(tools_json);
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "tool calls: the tools are not a JSON array");
    }
    gtext g = {0};
    og_status st = OG_OK;
    int n = 0;
    /* the calls as the template writes them: Hermes' blocks a line apart,
       Mistral's array after its marker, Llama's one object */
    if (f == OG_TOOL_FORMAT_HERMES)
        gadd(&g, "root ::= call%s\ncall ::= \"<tool_call>\\n\" (", parallel ? " (\"\\n\" call)*" : "");
    else if (f == OG_TOOL_FORMAT_MISTRAL)
        gadd(&g, "root ::= \"[TOOL_CALLS][\" call%s \"]\"\ncall ::= (", parallel ? " (\", \" call)*" : "");
    else
        gadd(&g, "root ::= call\ncall ::= (");
    const char *args_key = f == OG_TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
    /* a rule per function: its call as a JSON object, "name" then "arguments" */
    bytes rules = {0};
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        i++;
        if (!cJSON_IsString(name)) continue;
        if (only_name && strcmp(only_name, name->valuestring)) continue;
        bool plain = *name->valuestring != 0;
        for (const char *q = name->valuestring; *q; q++)
            plain &= gbnf_name_char(*q) || *q == '.';
        if (!plain) {
            st = og_set_error(OG_ERR_INVALID_ARGUMENT, "tool calls: a function name of letters, digits, '_', '-' "
                              "and '.' only, not '%.64s'", name->valuestring);
            break;
        }
        /* the arguments: the parameters' schema (any object without one) */
        char *text = cJSON_IsObject(params) ? cJSON_PrintUnformatted(params) : og_strdup("{\"type\":\"object\"}");
        if (!text) {
            st = og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
            break;
        }
        char *gbnf = NULL;
        st = og_json_schema_to_gbnf(text, strlen(text), &gbnf);
        if (cJSON_IsObject(params)) cJSON_free(text);
        else og_free(text);
        if (st != OG_OK) {
            st = og_set_error(st, "the parameters of tool '%s': %s", name->valuestring, og_last_error());
            break;
        }
        /* the call as the template writes it: name, then arguments */
        gadd(&g, "%s\"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" t%d-root \"}\"", n ? " | " : "",
             name->valuestring, args_key, i);
        gtext r = {rules, false};
        add_renamed(&r, gbnf, i);
        rules = r.b;
        g.oom |= r.oom;
        og_free(gbnf);
        n++;
    }
    cJSON_Delete(tools);
    if (st == OG_OK && !n)
        st = only_name ? og_set_error(OG_ERR_INVALID_ARGUMENT, "no tool is named '%s'", only_name)
                       : og_set_error(OG_ERR_INVALID_ARGUMENT, "no tool to call");
    if (st == OG_OK) {
        gadd(&g, f == OG_TOOL_FORMAT_HERMES ? ") \"\\n</tool_call>\"\n" : ")\n");
        if (rules.n && !put(&g.b, rules.p, rules.n)) g.oom = true;
        if (g.oom) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
    }
    og_free(rules.p);
    if (st != OG_OK) {
        og_free(g.b.p);
        return st;
    }
    *out = g.b.p;
    return OG_OK;
}

og_status og_tool_calls_grammar(og_tool_format f, const char *tools_json, const char *only_name, bool parallel,
                                og_grammar **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tool_calls_grammar: NULL argument");
    *out = NULL;
    char *text = NULL;
    og_status st = og_tool_calls_grammar_text(f, tools_json, only_name, parallel, &text);
    if (st != OG_OK) return st;
    st = og_grammar_parse(text, strlen(text), out);
    if (st != OG_OK) st = og_set_error(st, "tool calls: the grammar of the calls: %s", og_last_error());
    og_free(text);
    return st;
}
