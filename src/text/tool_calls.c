/* Tool calls in a model's output (see tool_calls.h). */
#include "text/tool_calls.h"

#include "core/core.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
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

/* ------------------------------------------------------------ arguments as they stream */

/* Where a call written as the templates write it starts: s[0..n) (after
 * Llama's optional python tag, when tag) is {"name": <string>,
 * "arguments"|"parameters": {  with any whitespace. 1: it is (the name's
 * JSON string at *name_at, *name_len bytes; the arguments' '{' at
 * *args_at); 0: it may still be, with more bytes; -1: it is not. */
static int lit_at(const char *s, size_t n, size_t *i, const char *lit) {
    const size_t k = strlen(lit), have = n - *i < k ? n - *i : k;
    if (memcmp(s + *i, lit, have)) return -1;
    if (have < k) return 0;
    *i += k;
    return 1;
}

static int call_prefix(const char *s, size_t n, bool tag, size_t *name_at, size_t *name_len, size_t *args_at) {
    size_t i = 0;
    int r;
#define OG_WS() \
    do { \
        while (i < n && is_space(s[i])) i++; \
        if (i == n) return 0; \
    } while (0)
    OG_WS();
    if (tag && s[i] == '<') {
        if ((r = lit_at(s, n, &i, PYTHON_TAG)) <= 0) return r;
        OG_WS();
    }
    if (s[i++] != '{') return -1;
    OG_WS();
    if ((r = lit_at(s, n, &i, "\"name\"")) <= 0) return r;
    OG_WS();
    if (s[i++] != ':') return -1;
    OG_WS();
    if (s[i] != '"') return -1;
    const size_t n0 = i;
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    if (i >= n) return 0;
    const size_t n1 = ++i;
    OG_WS();
    if (s[i++] != ',') return -1;
    OG_WS();
    size_t j = i;
    const int a = lit_at(s, n, &i, "\"arguments\""), b = lit_at(s, n, &j, "\"parameters\"");
    if (a < 0 && b < 0) return -1;
    if (a <= 0 && b <= 0) return 0;
    if (b > 0) i = j;
    OG_WS();
    if (s[i++] != ':') return -1;
    OG_WS();
    if (s[i] != '{') return -1;
#undef OG_WS
    /* the name: a JSON string strict parsers read, not empty */
    if (!strict_json(s + n0, n1 - n0)) return -1;
    cJSON *j_name = cJSON_ParseWithLength(s + n0, n1 - n0);
    const bool ok = cJSON_IsString(j_name) && *j_name->valuestring;
    cJSON_Delete(j_name);
    if (!ok) return -1;
    *name_at = n0;
    *name_len = n1 - n0;
    *args_at = i;
    return 1;
}

/* A JSON value checked byte by byte as it arrives (the arguments of a
 * call): where it could end by closing what is open (a safe point), and
 * how. */
enum { J_KEY0, J_KEY, J_KEYSTR, J_COLON, J_VALUE0, J_VALUE, J_STR, J_NUM, J_LIT, J_AFTER };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
#define J_MAX_DEPTH 64

typedef struct jscan {
    char stack[J_MAX_DEPTH];
    int depth, mode, num;
    int esc;           /* in a string: 0, 1 after '\\', 2..5 \u's digits, 6
                          '\\' and 7 'u' of a low surrogate, 8..11 its digits */
    unsigned code;     /* the \u digits so far */
    const char *lit;
    int lit_i;
    size_t safe;       /* out's bytes up to the last safe point */
    bool safe_str;     /* a string is open there */
    char safe_stack[J_MAX_DEPTH];
    int safe_depth;
} jscan;

static bool hex_digit(unsigned char c, unsigned *v) {
    if (c >= '0' && c <= '9') *v = c - '0';
    else if (c >= 'a' && c <= 'f') *v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') *v = c - 'A' + 10;
    else return false;
    return true;
}

/* A string's byte (a key's or a value's); false when it is not JSON. */
static bool jstring(jscan *j, bytes *out, unsigned char c, bool *oom) {
    unsigned v = 0;
    bool ok = true;
    if (j->esc == 0) {
        if (c == '"') j->mode = j->mode == J_KEYSTR ? J_COLON : J_AFTER;
        else if (c == '\\') j->esc = 1;
        if (c < 0x20) { /* a raw control byte: escaped, as strict JSON has it */
            char e[8];
            const char *short_form = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b"
                                   : c == '\f' ? "\\f" : NULL;
            if (short_form) snprintf(e, sizeof e, "%s", short_form);
            else snprintf(e, sizeof e, "\\u%04x", c);
            if (!put(out, e, strlen(e))) *oom = true;
            return true;
        }
    } else if (j->esc == 1) {
        if (c == 'u') {
            j->esc = 2;
            j->code = 0;
        } else {
            ok = strchr("\"\\/bfnrt", c) && c;
            j->esc = 0;
        }
    } else if (j->esc >= 2 && j->esc <= 5) {
        ok = hex_digit(c, &v);
        j->code = j->code * 16 + v;
        if (ok && ++j->esc == 6) {
            if (j->code >= 0xDC00 && j->code <= 0xDFFF) ok = false; /* a low surrogate alone */
            else if (j->code < 0xD800 || j->code > 0xDBFF) j->esc = 0;
        }
    } else if (j->esc == 6 || j->esc == 7) { /* a high surrogate wants its low one */
        ok = c == (j->esc == 6 ? '\\' : 'u');
        if (++j->esc == 8) j->code = 0;
    } else {
        ok = hex_digit(c, &v);
        j->code = j->code * 16 + v;
        if (ok && ++j->esc == 12) {
            ok = j->code >= 0xDC00 && j->code <= 0xDFFF;
            j->esc = 0;
        }
    }
    if (ok && !put(out, (const char *)&c, 1)) *oom = true;
    return ok;
}

static bool jpush(jscan *j, char c) {
    if (j->depth == J_MAX_DEPTH) return false;
    j->stack[j->depth++] = c;
    j->mode = c == '{' ? J_KEY0 : J_VALUE0;
    return true;
}

/* Takes byte c (written to out as it stands, or escaped): 1 the value is
 * complete, 0 more to come, -1 not JSON (out's bytes past the safe point
 * are not part of it), -2 out of memory. */
static int jfeed(jscan *j, bytes *out, unsigned char c) {
    bool oom = false, ok = true, own = false; /* own: jstring wrote c */
    const bool ws = is_space((char)c);
    if (j->mode == J_NUM) { /* a number ends at the first byte not its own */
        const int s = j->num;
        const bool digit = c >= '0' && c <= '9';
        if (digit && s != N_ZERO) j->num = s == N_MINUS ? (c == '0' ? N_ZERO : N_INT) : s == N_DOT ? N_FRAC
                                       : s == N_E || s == N_ESIGN ? N_EXP : s;
        else if (c == '.' && (s == N_ZERO || s == N_INT)) j->num = N_DOT;
        else if ((c == 'e' || c == 'E') && (s == N_ZERO || s == N_INT || s == N_FRAC)) j->num = N_E;
        else if ((c == '+' || c == '-') && s == N_E) j->num = N_ESIGN;
        else if (s == N_ZERO || s == N_INT || s == N_FRAC || s == N_EXP) j->mode = J_AFTER;
        else return -1;
        if (j->mode == J_NUM) return put(out, (const char *)&c, 1) ? 0 : -2;
    }
    switch (j->mode) {
    case J_KEYSTR:
    case J_STR:
        ok = jstring(j, out, c, &oom);
        own = true;
        break;
    case J_LIT:
        ok = c == (unsigned char)j->lit[j->lit_i];
        if (ok && !j->lit[++j->lit_i]) j->mode = J_AFTER;
        break;
    case J_KEY0:
    case J_KEY:
        if (c == '"') j->mode = J_KEYSTR;
        else if (c == '}' && j->mode == J_KEY0) j->depth--, j->mode = J_AFTER;
        else ok = ws;
        break;
    case J_COLON:
        if (c == ':') j->mode = J_VALUE;
        else ok = ws;
        break;
    case J_VALUE0:
    case J_VALUE:
        if (c == '{' || c == '[') ok = jpush(j, (char)c);
        else if (c == ']' && j->mode == J_VALUE0) j->depth--, j->mode = J_AFTER;
        else if (c == '"') j->mode = J_STR, j->esc = 0;
        else if (c == '-' || (c >= '0' && c <= '9'))
            j->mode = J_NUM, j->num = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        else if (c == 't' || c == 'f' || c == 'n')
            j->mode = J_LIT, j->lit = c == 't' ? "true" : c == 'f' ? "false" : "null", j->lit_i = 1;
        else ok = ws;
        break;
    case J_AFTER:
        if (c == ',') j->mode = j->stack[j->depth - 1] == '{' ? J_KEY : J_VALUE;
        else if ((c == '}' || c == ']') && j->stack[j->depth - 1] == (c == '}' ? '{' : '[')) j->depth--;
        else ok = ws;
        break;
    default: break;
    }
    if (!ok) return -1;
    if (!own && !put(out, (const char *)&c, 1)) oom = true;
    if (oom) return -2;
    if (j->depth == 0) {
        j->safe = out->n;
        j->safe_depth = 0;
        return 1;
    }
    /* a safe point: out can end here by closing what is open */
    const bool safe = j->mode == J_KEY0 || j->mode == J_VALUE0 || j->mode == J_AFTER ||
                      (j->mode == J_STR && j->esc == 0) ||
                      (j->mode == J_NUM && (j->num == N_ZERO || j->num == N_INT || j->num == N_FRAC || j->num == N_EXP));
    if (safe) {
        j->safe = out->n;
        j->safe_str = j->mode == J_STR;
        j->safe_depth = j->depth;
        memcpy(j->safe_stack, j->stack, (size_t)j->depth);
    }
    return 0;
}

/* Ends out at the last safe point, closed. */
static bool jclose(const jscan *j, bytes *out) {
    out->n = j->safe;
    if (out->p) out->p[out->n] = 0;
    if (j->safe_str && !put(out, "\"", 1)) return false;
    for (int i = j->safe_depth - 1; i >= 0; i--)
        if (!put(out, j->safe_stack[i] == '{' ? "}" : "]", 1)) return false;
    return true;
}

/* ------------------------------------------------------------ the parser */

/* How the block being read is taken: whole when it ends (as a call or as
 * text), or as a stream of calls. */
enum {
    S_PREFIX, /* a call's start may come */
    S_WHOLE,  /* not written as the templates write calls: whole, at its end */
    S_ARGS,   /* a call's arguments */
    S_TAIL,   /* the rest of a call's object */
    S_SEP,    /* Mistral: after a call, ',' or ']' */
    S_ELEM    /* Mistral: an element after a streamed call, whole */
};

typedef struct piece_rec {
    int call;
    size_t name, text, n; /* offsets into the arena (name: SIZE_MAX for none) */
    bool last;
} piece_rec;

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
    /* the block as a stream */
    int st;
    size_t scan;       /* body's bytes the stream has read */
    bool committed;    /* a call of this block is streamed */
    bool m_started, m_array; /* Mistral: past the array's '[' (or at its one object) */
    jscan js;
    size_t args0;      /* where the streamed call's arguments start in body */
    bytes args;        /* the streamed call's arguments so far */
    size_t sent;       /* of them, given out as pieces */
    char *name;        /* the streamed call's name */
    int tail_depth;
    bool tail_str, tail_esc;
    /* pieces ready to take, their bytes in arena */
    piece_rec *pieces;
    int n_pieces, cap_pieces;
    bytes arena;
    og_tool_piece *out_pieces; /* given out by the last take_pieces */
    int cap_out;
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
    og_free(p->args.p);
    og_free(p->name);
    og_free(p->pieces);
    og_free(p->arena.p);
    og_free(p->out_pieces);
    og_free(p);
}

/* A piece: content (call -1) or a call's (name: its first piece). Adjacent
 * content, and adjacent bytes of one call's arguments, join. */
static bool add_piece(og_tool_parser *p, int call, const char *name, const char *s, size_t n, bool last) {
    piece_rec *prev = p->n_pieces ? &p->pieces[p->n_pieces - 1] : NULL;
    if (prev && prev->call == call && !prev->last && (call < 0 || !name)) {
        /* its text is the arena's last bytes: extend it over the NUL */
        p->arena.n--;
        if (!put(&p->arena, s, n)) return false;
        p->arena.n++;
        prev->n += n;
        prev->last = last;
        return true;
    }
    if (p->n_pieces == p->cap_pieces) {
        int cap = p->cap_pieces ? 2 * p->cap_pieces : 8;
        piece_rec *q = og_realloc(p->pieces, (size_t)cap * sizeof *q);
        if (!q) return false;
        p->pieces = q;
        p->cap_pieces = cap;
    }
    piece_rec r = {.call = call, .name = SIZE_MAX, .n = n, .last = last};
    if (name) {
        r.name = p->arena.n;
        if (!put(&p->arena, name, strlen(name))) return false;
        p->arena.n++; /* keep put's NUL */
    }
    r.text = p->arena.n;
    if (!put(&p->arena, s, n)) return false;
    p->arena.n++;
    p->pieces[p->n_pieces++] = r;
    return true;
}

/* Gives out s[0..n) as content (its leading whitespace dropped right after
 * a call). */
static bool emit(og_tool_parser *p, const char *s, size_t n) {
    if (p->after_call) {
        while (n && is_space(*s)) s++, n--;
        if (!n) return true;
        p->after_call = false;
    }
    if (!n) return true;
    return put(&p->content, s, n) && add_piece(p, -1, NULL, s, n, false);
}

/* A call complete; streamed: its pieces were given out already. */
static bool add_call(og_tool_parser *p, const og_tool_call *c, bool streamed) {
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? 2 * p->cap_calls : 4;
        og_tool_call *q = og_realloc(p->calls, (size_t)cap * sizeof *q);
        if (!q) return false;
        p->calls = q;
        p->cap_calls = cap;
    }
    if (!streamed && !add_piece(p, p->total, c->name, c->arguments, strlen(c->arguments), true)) return false;
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
        if (!add_call(p, &c, false)) {
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
        if (!add_call(p, &calls[i], false)) {
            *oom = true;
            free_calls(calls + i, k - i);
            return false;
        }
    }
    if (!ok) free_calls(calls, k);
    return ok;
}

static void reset_block(og_tool_parser *p) {
    p->gap.n = 0;
    p->body.n = 0;
    if (p->body.p) p->body.p[0] = 0;
    p->inside = false;
    p->st = S_PREFIX;
    p->scan = 0;
    p->committed = p->m_started = p->m_array = false;
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
        if ((calls = body_call(b, k, p->f == OG_TOOL_FORMAT_LLAMA3, &c, &oom)) && !add_call(p, &c, false)) {
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
    reset_block(p);
    return ok;
}

/* The streamed block ends at body[at]: what follows goes back outside
 * (content for Llama 3.1, whose call was the reply). */
static bool end_stream_block(og_tool_parser *p, size_t at) {
    if (!put(&p->pending, p->body.p + at, p->body.n - at)) return false;
    if (p->f == OG_TOOL_FORMAT_LLAMA3) p->plain = true;
    reset_block(p);
    return true;
}

/* The streamed call's arguments since the last piece. */
static bool send_args(og_tool_parser *p, bool last) {
    const size_t upto = last ? p->args.n : p->js.safe;
    if (upto <= p->sent && !last) return true;
    const size_t from = p->sent < upto ? p->sent : upto;
    if (!add_piece(p, p->total, NULL, p->args.p + from, upto - from, last)) return false;
    p->sent = upto;
    return true;
}

/* The streamed call is complete (its arguments closed, or ended and closed
 * at their last safe point). */
static bool call_done(og_tool_parser *p, bool complete) {
    if (!complete && !jclose(&p->js, &p->args)) return false;
    if (!send_args(p, true)) return false;
    og_tool_call c = {.name = p->name, .arguments = og_malloc(p->args.n + 1)};
    if (!c.arguments) return false;
    memcpy(c.arguments, p->args.p, p->args.n);
    c.arguments[p->args.n] = 0;
    if (!add_call(p, &c, true)) {
        og_free(c.arguments);
        return false;
    }
    p->name = NULL;
    p->args.n = 0;
    p->sent = 0;
    return true;
}

/* Bytes of s[0..n) that end inside a UTF-8 sequence (held until it is whole). */
static size_t utf8_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue;
        const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > k ? k : 0;
    }
    return 0;
}

enum { R_WAIT, R_ENDED, R_WHOLE, R_OOM };

/* Reads the block as a stream of calls as far as it can be decided; final:
 * the output ended (nothing more is held). */
static int stream(og_tool_parser *p, bool final) {
    const bool hermes = p->f == OG_TOOL_FORMAT_HERMES, mistral = p->f == OG_TOOL_FORMAT_MISTRAL;
    for (;;) {
        const char *b = p->body.p ? p->body.p : "";
        const size_t n = p->body.n;
        switch (p->st) {
        case S_PREFIX: {
            if (mistral && !p->m_started) { /* the array's '[', or one object */
                size_t i = p->scan;
                while (i < n && is_space(b[i])) i++;
                if (i == n) return final ? R_WHOLE : R_WAIT;
                if (b[i] != '[' && b[i] != '{') return R_WHOLE;
                p->m_started = true;
                p->m_array = b[i] == '[';
                p->scan = p->m_array ? i + 1 : i;
            }
            size_t lim = n;
            long close = -1;
            if (hermes) {
                close = find(&p->body, CLOSE, CLOSE_LEN);
                if (close >= 0) lim = (size_t)close;
            }
            size_t name_at, name_len, args_at;
            const int r = call_prefix(b + p->scan, lim - p->scan, p->f == OG_TOOL_FORMAT_LLAMA3, &name_at, &name_len,
                                      &args_at);
            if (r == 1) {
                cJSON *j = cJSON_ParseWithLength(b + p->scan + name_at, name_len);
                p->name = j ? og_strdup(j->valuestring) : NULL;
                cJSON_Delete(j);
                if (!p->name || !add_piece(p, p->total, p->name, "", 0, false)) return R_OOM;
                memset(&p->js, 0, sizeof p->js);
                p->js.mode = J_VALUE;
                p->args.n = 0;
                p->sent = 0;
                p->scan += args_at;
                p->args0 = p->scan;
                p->committed = true;
                p->gap.n = 0;
                p->st = S_ARGS;
                continue;
            }
            if (r == 0 && close < 0 && !final) return R_WAIT;
            if (!p->committed) return R_WHOLE;
            p->st = S_ELEM; /* Mistral: a later element written otherwise */
            continue;
        }
        case S_ELEM: {
            long k = json_end(b + p->scan, n - p->scan);
            if (k == -1 && !final) return R_WAIT;
            og_tool_call c;
            bool oom = false;
            if (k >= 0 && body_call(b + p->scan, (size_t)k, false, &c, &oom)) {
                if (!add_call(p, &c, false)) {
                    free_calls(&c, 1);
                    return R_OOM;
                }
                p->scan += (size_t)k;
                p->st = S_SEP;
                continue;
            }
            if (oom) return R_OOM;
            /* not a call: the calls end, the rest is content */
            return end_stream_block(p, p->scan) ? R_ENDED : R_OOM;
        }
        case S_ARGS: {
            const size_t avail = final ? n : n - utf8_tail(b, n);
            while (p->scan < avail) {
                if (hermes && b[p->scan] == '<') {
                    const size_t have = n - p->scan;
                    if (have >= CLOSE_LEN && !memcmp(b + p->scan, CLOSE, CLOSE_LEN)) { /* the block ends inside */
                        if (!call_done(p, false)) return R_OOM;
                        return end_stream_block(p, p->scan + CLOSE_LEN) ? R_ENDED : R_OOM;
                    }
                    if (have < CLOSE_LEN && !memcmp(b + p->scan, CLOSE, have) && !final) break;
                }
                const int r = jfeed(&p->js, &p->args, (unsigned char)b[p->scan]);
                if (r == -2) return R_OOM;
                if (r == -1) { /* not JSON: the call ends at its last safe point */
                    if (!call_done(p, false)) return R_OOM;
                    if (hermes) {
                        p->st = S_TAIL;
                        break;
                    }
                    if (mistral) { /* the rest of its element is dropped: its object scanned again from the arguments */
                        p->scan = p->args0;
                        p->st = S_TAIL;
                        p->tail_depth = 1;
                        p->tail_str = p->tail_esc = false;
                        break;
                    }
                    return end_stream_block(p, p->scan) ? R_ENDED : R_OOM;
                }
                p->scan++;
                if (r == 1) {
                    if (!call_done(p, true)) return R_OOM;
                    p->st = S_TAIL;
                    p->tail_depth = 1;
                    p->tail_str = p->tail_esc = false;
                    break;
                }
            }
            if (p->st == S_TAIL) continue;
            if (!send_args(p, false)) return R_OOM;
            if (final) {
                if (!call_done(p, false)) return R_OOM;
                return end_stream_block(p, n) ? R_ENDED : R_OOM;
            }
            return R_WAIT;
        }
        case S_TAIL:
            if (hermes) { /* the rest of the block is dropped */
                long k = find(&p->body, CLOSE, CLOSE_LEN);
                if (k >= (long)p->scan) return end_stream_block(p, (size_t)k + CLOSE_LEN) ? R_ENDED : R_OOM;
                if (final) return end_stream_block(p, n) ? R_ENDED : R_OOM;
                return R_WAIT;
            }
            /* the rest of the call's object */
            for (; p->scan < n && p->tail_depth > 0; p->scan++) {
                const char c = b[p->scan];
                if (p->tail_str) {
                    if (p->tail_esc) p->tail_esc = false;
                    else if (c == '\\') p->tail_esc = true;
                    else if (c == '"') p->tail_str = false;
                } else if (c == '"') {
                    p->tail_str = true;
                } else if (c == '{' || c == '[') {
                    p->tail_depth++;
                } else if (c == '}' || c == ']') {
                    p->tail_depth--;
                }
            }
            if (p->tail_depth > 0) return final ? (end_stream_block(p, n) ? R_ENDED : R_OOM) : R_WAIT;
            if (!mistral || !p->m_array) return end_stream_block(p, p->scan) ? R_ENDED : R_OOM;
            p->st = S_SEP;
            continue;
        case S_SEP:
            while (p->scan < n && is_space(b[p->scan])) p->scan++;
            if (p->scan == n) return final ? (end_stream_block(p, n) ? R_ENDED : R_OOM) : R_WAIT;
            if (b[p->scan] == ',') {
                p->scan++;
                p->st = S_PREFIX;
                continue;
            }
            return end_stream_block(p, p->scan + (b[p->scan] == ']')) ? R_ENDED : R_OOM;
        default: return R_WHOLE;
        }
    }
}

/* Gives out what pending and body can decide now. */
static bool advance(og_tool_parser *p) {
    const char *open = open_marker(p->f);
    const size_t open_len = strlen(open);
    for (;;) {
        if (p->inside && p->st != S_WHOLE) {
            const int r = stream(p, false);
            if (r == R_OOM) return false;
            if (r == R_WAIT) return true;
            if (r == R_WHOLE) p->st = S_WHOLE;
            continue;
        }
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
                continue;
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
        if (!put(&p->content, text, n) || (n && !add_piece(p, -1, NULL, text, n, false)))
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
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
    /* a stream's block decided with what it has; the rest outside again */
    while (p->inside && p->st != S_WHOLE) {
        const int r = stream(p, true);
        if (r == R_OOM) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
        if (r == R_WHOLE || r == R_WAIT) p->st = S_WHOLE;
        if (!p->inside && p->pending.n) {
            p->finished = false;
            bool ok = advance(p);
            p->finished = true;
            if (!ok) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
        }
    }
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

static void forget_pieces(og_tool_parser *p) {
    p->n_pieces = 0;
    p->arena.n = 0;
}

void og_tool_parser_take(og_tool_parser *p, const char **content, size_t *n_content, const og_tool_call **calls,
                         int *n_calls) {
    forget_taken(p);
    forget_pieces(p);
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

og_status og_tool_parser_take_pieces(og_tool_parser *p, const og_tool_piece **pieces, int *n) {
    *pieces = NULL;
    *n = 0;
    if (!p) return OG_OK;
    /* what take would have given is taken too */
    forget_taken(p);
    p->taken = p->calls;
    p->n_taken = p->n_calls;
    p->calls = NULL;
    p->n_calls = p->cap_calls = 0;
    p->content.n = 0;
    if (p->n_pieces > p->cap_out) {
        og_tool_piece *q = og_realloc(p->out_pieces, (size_t)p->n_pieces * sizeof *q);
        if (!q) /* the pieces stay for the next take */
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "tool calls: out of memory");
        p->out_pieces = q;
        p->cap_out = p->n_pieces;
    }
    for (int i = 0; i < p->n_pieces; i++) {
        const piece_rec *r = &p->pieces[i];
        p->out_pieces[i] = (og_tool_piece){.call = r->call,
                                           .name = r->name == SIZE_MAX ? NULL : p->arena.p + r->name,
                                           .text = p->arena.p + r->text,
                                           .n = r->n,
                                           .last = r->last};
    }
    *pieces = p->out_pieces;
    *n = p->n_pieces;
    /* the arena's bytes stay until the next put */
    p->n_pieces = 0;
    p->arena.n = 0;
    return OG_OK;
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
