/* A Jinja renderer for chat templates (see jinja.h).
 *
 * Three parts: a lexer that cuts the source into text and the tokens inside
 * tags, applying Jinja's whitespace rules (trim_blocks, lstrip_blocks, "-"
 * and "+" markers); a recursive-descent parser that builds a tree of nodes;
 * an evaluator that walks it over a small value type. Everything made while
 * parsing or rendering lives in an arena that is freed as a whole, so that
 * an error anywhere unwinds with longjmp and leaks nothing. */
#include "text/jinja.h"

#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define JMAX_DEPTH 200  /* nesting of expressions and blocks at parse */
#define JMAX_CALLS 100  /* nesting of macro calls at render */
#define JMAX_RDEPTH 2000 /* nesting of statements and expressions at render (macros add up) */

/* ---- arena -------------------------------------------------------------- */

typedef struct achunk {
    struct achunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} achunk;

typedef struct arena {
    achunk *head;
    size_t total, limit;
    size_t next; /* the next chunk's size: 4 KiB doubling up to 64 KiB */
} arena;

static void arena_free(arena *a) {
    achunk *c = a->head;
    while (c) {
        achunk *n = c->next;
        og_free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* NULL when out of memory or past the limit. */
static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (!a->head || a->head->cap - a->head->used < n) {
        if (a->next < 4096) a->next = 4096;
        size_t cap = n > a->next ? n : a->next;
        if (a->next < 65536) a->next *= 2;
        if (a->limit && (cap > a->limit || a->total > a->limit - cap)) return NULL;
        achunk *c = og_malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

/* ---- values ------------------------------------------------------------- */

typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_FUNC } jv_type;

/* dict kinds */
enum { JD_DICT, JD_NAMESPACE, JD_LOOP };

/* global functions */
enum { JF_RAISE, JF_NAMESPACE, JF_RANGE, JF_DICT, JF_STRFTIME };

struct jnode;
struct jlist;
struct jdict;

typedef struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;                   /* JV_STR, and JV_UNDEF's name */
        struct jlist *l;
        struct jdict *d;
        struct {
            const struct jnode *m;
            long link; /* where its names are looked up after its own (see frame) */
        } mac;                 /* JV_MACRO */
        int fn;                /* JV_FUNC */
    } u;
} jv;

typedef struct jlist {
    jv *v;
    size_t n, cap;
    bool tuple; /* printed as Python prints a tuple */
} jlist;

typedef struct jdict {
    jv *k, *v;
    size_t n, cap;
    int kind;
} jdict;

/* ---- the tree ----------------------------------------------------------- */

typedef enum {
    /* statements */
    N_BLOCK, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SET_ATTR, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK, N_BREAK, N_CONTINUE,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS, E_BIN, E_AND, E_OR,
    E_COND, E_LIST, E_DICT
} jkind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE,
               OP_GT, OP_GE, OP_IN, OP_NOTIN } jop;

typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

typedef struct jnode {
    jkind kind;
    int line;
    int op;                /* jop; E_TEST: negated; N_SET: number of names */
    jv lit;                /* E_LIT, N_TEXT (a string) */
    jstr name;             /* E_NAME, E_ATTR, E_FILTER, E_TEST, N_SET_ATTR's attribute, N_MACRO */
    struct jnode *a, *b, *c; /* operands, conditions, bodies */
    struct jnode **kids;   /* block statements, arguments, list items, dict keys/values pairs */
    size_t n_kids;
    jstr *names;           /* N_FOR / N_SET targets, E_CALL keyword names (NULL for positional), macro params */
    size_t n_names;
} jnode;

struct og_jinja {
    arena mem;
    jnode *root;
};

/* ---- lexer -------------------------------------------------------------- */

typedef enum { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } ttype;

typedef struct tok {
    ttype t;
    int line;
    const char *p; /* T_TEXT, T_NAME, T_OP: the source; T_STR: the unescaped value */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    arena *mem;
    const char *src;
    size_t len;
    tok *toks;
    size_t n_toks, cap_toks, pos;
    int depth;
    jmp_buf jb;
    og_status st;
    char err[OG_ERRMSG_CAP];
} parser;

/* Writes "template line N: <message>" and the status of a parse or a
 * render that fails (its caller then jumps out). */
static void fail_at(og_status *st, char err[OG_ERRMSG_CAP], og_status code, int line, const char *fmt, va_list ap) {
    char msg[OG_ERRMSG_CAP - 64];
    vsnprintf(msg, sizeof msg, fmt, ap);
    snprintf(err, OG_ERRMSG_CAP, "template line %d: %s", line, msg);
    *st = code;
}

static _Noreturn OG_PRINTF(3, 4) void perr(parser *P, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_at(&P->st, P->err, OG_ERR_FORMAT, line, fmt, ap);
    va_end(ap);
    longjmp(P->jb, 1);
}

static _Noreturn void poom(parser *P) {
    snprintf(P->err, sizeof P->err, "template: out of memory while parsing");
    P->st = OG_ERR_OUT_OF_MEMORY;
    longjmp(P->jb, 1);
}

static void *palloc(parser *P, size_t n) {
    void *p = arena_alloc(P->mem, n);
    if (!p) poom(P);
    memset(p, 0, n);
    return p;
}

static tok *push_tok(parser *P, ttype t, int line) {
    if (P->n_toks == P->cap_toks) {
        size_t cap = P->cap_toks ? P->cap_toks * 2 : 256;
        tok *nt = palloc(P, cap * sizeof *nt);
        if (P->n_toks) memcpy(nt, P->toks, P->n_toks * sizeof *nt);
        P->toks = nt;
        P->cap_toks = cap;
    }
    tok *k = &P->toks[P->n_toks++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    return k;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_lines(const char *p, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += p[i] == '\n';
    return k;
}

/* Appends the UTF-8 encoding of cp. */
static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal from s[*i] (the quote) on, with Python's escapes. */
static void lex_string(parser *P, size_t *i, int line) {
    const char *s = P->src;
    char q = s[*i];
    size_t j = *i + 1;
    while (j < P->len && s[j] != q) j += s[j] == '\\' && j + 1 < P->len ? 2 : 1;
    if (j >= P->len) perr(P, line, "a string literal is not closed");
    char *o = palloc(P, j - *i + 1);
    size_t n = 0;
    for (size_t k = *i + 1; k < j; k++) {
        char c = s[k];
        if (c != '\\') { o[n++] = c; continue; }
        char e = s[++k];
        switch (e) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'v': o[n++] = '\v'; break;
        case 'a': o[n++] = '\a'; break;
        case '0': o[n++] = '\0'; break;
        case '\\': case '\'': case '"': o[n++] = e; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            int d = 0;
            for (; d < digits && k + 1 < j && hexval(s[k + 1]) >= 0; d++) cp = cp * 16 + (uint32_t)hexval(s[++k]);
            if (d < digits || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                perr(P, line, "a bad \\%c escape in a string literal", e);
            n += put_utf8(o + n, cp); /* at most 4 bytes for at least 4 source bytes */
            break;
        }
        default: o[n++] = '\\'; o[n++] = e; break;
        }
    }
    tok *t = push_tok(P, T_STR, line);
    t->p = o;
    t->n = n;
    *i = j + 1;
}

/* The tokens of a tag's inside, from *i up to its end marker; returns with
 * *i after the end marker and whether the marker had a "-". */
static bool lex_tag(parser *P, size_t *i, int *line, bool block) {
    const char *s = P->src;
    int depth = 0;
    for (;;) {
        while (*i < P->len && is_ws(s[*i])) {
            if (s[*i] == '\n') (*line)++;
            (*i)++;
        }
        if (*i >= P->len) perr(P, *line, "a %s tag is not closed", block ? "{%" : "{{");
        size_t k = *i;
        char c = s[k];
        char end0 = block ? '%' : '}';
        if (depth == 0) {
            if (c == '-' && k + 2 < P->len + 0 && s[k + 1] == end0 && s[k + 2] == '}') {
                *i = k + 3;
                return true;
            }
            if (c == end0 && k + 1 < P->len && s[k + 1] == '}') {
                *i = k + 2;
                return false;
            }
        }
        if (c == '\'' || c == '"') {
            lex_string(P, i, *line);
            continue;
        }
        if (is_digit(c)) {
            size_t j = k;
            bool flt = false;
            while (j < P->len && (is_digit(s[j]) || s[j] == '_')) j++;
            /* after a '.', digits are an index (x.0.1), never a fraction */
            bool after_dot = k > 0 && s[k - 1] == '.';
            if (!after_dot && j + 1 < P->len && s[j] == '.' && is_digit(s[j + 1])) {
                flt = true;
                j++;
                while (j < P->len && (is_digit(s[j]) || s[j] == '_')) j++;
            }
            if (!after_dot && j < P->len && (s[j] == 'e' || s[j] == 'E')) {
                size_t e = j + 1;
                if (e < P->len && (s[e] == '+' || s[e] == '-')) e++;
                if (e < P->len && is_digit(s[e])) {
                    flt = true;
                    j = e;
                    while (j < P->len && is_digit(s[j])) j++;
                }
            }
            char buf[64];
            size_t n = 0;
            for (size_t q = k; q < j && n < sizeof buf - 1; q++)
                if (s[q] != '_') buf[n++] = s[q];
            buf[n] = 0;
            tok *t = push_tok(P, flt ? T_FLOAT : T_INT, *line);
            errno = 0;
            if (flt)
                t->f = strtod(buf, NULL);
            else {
                t->i = (int64_t)strtoll(buf, NULL, 10);
                if (errno == ERANGE || j - k >= sizeof buf - 1) perr(P, *line, "the integer %.*s is too large", (int)(j - k), s + k);
            }
            *i = j;
            continue;
        }
        if (is_name0(c)) {
            size_t j = k;
            while (j < P->len && (is_name0(s[j]) || is_digit(s[j]))) j++;
            tok *t = push_tok(P, T_NAME, *line);
            t->p = s + k;
            t->n = j - k;
            *i = j;
            continue;
        }
        static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
        size_t n = 0;
        for (size_t q = 0; q < sizeof two / sizeof *two; q++)
            if (k + 1 < P->len && s[k] == two[q][0] && s[k + 1] == two[q][1]) n = 2;
        if (!n) {
            if (!strchr("+-*/%~()[]{}.,:|=<>", c) || c == 0)
                perr(P, *line, "unexpected character '%c' in a tag", c);
            n = 1;
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
        }
        tok *t = push_tok(P, T_OP, *line);
        t->p = s + k;
        t->n = n;
        *i = k + n;
    }
}

static void lex(parser *P) {
    const char *s = P->src;
    size_t i = 0;
    int line = 1;
    bool line_start = true;
    while (i < P->len) {
        /* the next tag */
        size_t j = i;
        const char *tag = NULL;
        while (j + 1 < P->len) {
            if (s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#')) {
                tag = s + j;
                break;
            }
            j++;
        }
        if (!tag) j = P->len;
        size_t tn = j - i;
        char kind = tag ? tag[1] : 0;
        char sign = tag && j + 2 < P->len ? s[j + 2] : 0;
        if (tag) {
            if (sign == '-') {
                while (tn > 0 && is_ws(s[i + tn - 1])) tn--;
            } else if (sign != '+' && kind != '{') {
                size_t lp = tn;
                while (lp > 0 && s[i + lp - 1] != '\n') lp--;
                if (lp > 0 || line_start) {
                    bool all = lp < tn;
                    for (size_t q = lp; q < tn; q++)
                        if (!is_ws(s[i + q])) all = false;
                    if (all) tn = lp;
                }
            }
        }
        if (tn > 0) {
            tok *t = push_tok(P, T_TEXT, line);
            t->p = s + i;
            t->n = tn;
        }
        line += count_lines(s + i, j - i);
        if (!tag) break;
        i = j + 2 + (sign == '-' || sign == '+');
        bool strip_after;
        int tag_line = line;
        if (kind == '#') {
            size_t e = i;
            while (e + 1 < P->len && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= P->len) perr(P, tag_line, "a comment is not closed");
            strip_after = e > i && s[e - 1] == '-';
            line += count_lines(s + i, e - i);
            i = e + 2;
        } else {
            push_tok(P, kind == '{' ? T_VBEGIN : T_BBEGIN, line);
            strip_after = lex_tag(P, &i, &line, kind == '%');
            push_tok(P, kind == '{' ? T_VEND : T_BEND, line);
        }
        char last = s[i - 1];
        if (strip_after) {
            while (i < P->len && is_ws(s[i])) {
                if (s[i] == '\n') line++;
                last = s[i++];
            }
        } else if (kind != '{' && i < P->len && s[i] == '\n') {
            line++;
            last = s[i++];
        }
        line_start = last == '\n';
    }
    push_tok(P, T_EOF, line);
}

/* ---- parser ------------------------------------------------------------- */

static tok *cur(parser *P) { return &P->toks[P->pos]; }
static tok *peek_at(parser *P, size_t k) {
    size_t q = P->pos + k;
    return &P->toks[q < P->n_toks ? q : P->n_toks - 1];
}
static bool is_op(const tok *t, const char *op) {
    return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}
static bool is_name(const tok *t, const char *nm) {
    return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n);
}
static tok *advance(parser *P) {
    tok *t = cur(P);
    if (P->pos + 1 < P->n_toks) P->pos++;
    return t;
}
static const char *tok_desc(const tok *t, char *buf, size_t cap) {
    switch (t->t) {
    case T_EOF: return "the end of the template";
    case T_TEXT: return "text";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}
static _Noreturn void unexpected(parser *P, const char *want) {
    char b[64];
    perr(P, cur(P)->line, "expected %s, found %s", want, tok_desc(cur(P), b, sizeof b));
}
static void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    advance(P);
}
static jstr expect_name(parser *P) {
    if (cur(P)->t != T_NAME) unexpected(P, "a name");
    tok *t = advance(P);
    return (jstr){t->p, t->n};
}

static jnode *mk(parser *P, jkind k, int line) {
    jnode *n = palloc(P, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

/* growing child arrays while parsing */
typedef struct kidbuf {
    jnode **v;
    jstr *names;
    size_t n, cap;
} kidbuf;

static void kid_push(parser *P, kidbuf *b, jnode *n, jstr name) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4;
        jnode **v = palloc(P, cap * sizeof *v);
        jstr *nm = palloc(P, cap * sizeof *nm);
        if (b->n) {
            memcpy(v, b->v, b->n * sizeof *v);
            memcpy(nm, b->names, b->n * sizeof *nm);
        }
        b->v = v;
        b->names = nm;
        b->cap = cap;
    }
    b->v[b->n] = n;
    b->names[b->n] = name;
    b->n++;
}

static void enter(parser *P) {
    if (++P->depth > JMAX_DEPTH) perr(P, cur(P)->line, "nesting deeper than %d", JMAX_DEPTH);
}

static jnode *parse_expr(parser *P, bool with_cond);
static jnode *parse_unary(parser *P, bool with_filter);

static bool jstr_is(jstr s, const char *z) { return s.n == strlen(z) && !memcmp(s.p, z, s.n); }

/* (args) after the '(' is consumed: positional, then name=value */
static void parse_args(parser *P, jnode *call) {
    kidbuf b = {0};
    while (!is_op(cur(P), ")")) {
        jstr nm = {0};
        if (is_op(cur(P), "*")) { /* f(*list): its items as positional arguments */
            nm = (jstr){advance(P)->p, 1};
        } else if (cur(P)->t == T_NAME && is_op(peek_at(P, 1), "=")) {
            nm = expect_name(P);
            advance(P);
        } else if (b.n && b.names[b.n - 1].p && b.names[b.n - 1].p[0] != '*') {
            perr(P, cur(P)->line, "a positional argument after a keyword argument");
        }
        kid_push(P, &b, parse_expr(P, true), nm);
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    expect_op(P, ")");
    call->kids = b.v;
    call->names = b.names;
    call->n_kids = b.n;
}

static jnode *parse_primary(parser *P) {
    tok *t = cur(P);
    int line = t->line;
    jnode *n;
    enter(P);
    if (t->t == T_NAME) {
        advance(P);
        jstr s = {t->p, t->n};
        n = mk(P, E_LIT, line);
        if (jstr_is(s, "true") || jstr_is(s, "True")) n->lit = (jv){.t = JV_BOOL, .u.b = true};
        else if (jstr_is(s, "false") || jstr_is(s, "False")) n->lit = (jv){.t = JV_BOOL, .u.b = false};
        else if (jstr_is(s, "none") || jstr_is(s, "None")) n->lit = (jv){.t = JV_NONE};
        else {
            n->kind = E_NAME;
            n->name = s;
        }
    } else if (t->t == T_STR) {
        /* adjacent literals join */
        size_t total = 0, k = 0;
        while (peek_at(P, k)->t == T_STR) total += peek_at(P, k++)->n;
        char *o = palloc(P, total + 1);
        size_t at = 0;
        while (cur(P)->t == T_STR) {
            tok *s = advance(P);
            memcpy(o + at, s->p, s->n);
            at += s->n;
        }
        n = mk(P, E_LIT, line);
        n->lit = (jv){.t = JV_STR, .u.s = {o, total}};
    } else if (t->t == T_INT) {
        advance(P);
        n = mk(P, E_LIT, line);
        n->lit = (jv){.t = JV_INT, .u.i = t->i};
    } else if (t->t == T_FLOAT) {
        advance(P);
        n = mk(P, E_LIT, line);
        n->lit = (jv){.t = JV_FLOAT, .u.f = t->f};
    } else if (is_op(t, "(")) {
        advance(P);
        if (is_op(cur(P), ")")) {
            advance(P);
            n = mk(P, E_LIST, line);
            n->op = 1; /* () is an empty tuple */
        } else {
            jnode *first = parse_expr(P, true);
            if (is_op(cur(P), ",")) {
                kidbuf b = {0};
                kid_push(P, &b, first, (jstr){0});
                while (is_op(cur(P), ",")) {
                    advance(P);
                    if (is_op(cur(P), ")")) break;
                    kid_push(P, &b, parse_expr(P, true), (jstr){0});
                }
                n = mk(P, E_LIST, line);
                n->op = 1;
                n->kids = b.v;
                n->n_kids = b.n;
            } else
                n = first;
            expect_op(P, ")");
        }
    } else if (is_op(t, "[")) {
        advance(P);
        kidbuf b = {0};
        while (!is_op(cur(P), "]")) {
            kid_push(P, &b, parse_expr(P, true), (jstr){0});
            if (!is_op(cur(P), ",")) break;
            advance(P);
        }
        expect_op(P, "]");
        n = mk(P, E_LIST, line);
        n->kids = b.v;
        n->n_kids = b.n;
    } else if (is_op(t, "{")) {
        advance(P);
        kidbuf b = {0};
        while (!is_op(cur(P), "}")) {
            kid_push(P, &b, parse_expr(P, true), (jstr){0});
            expect_op(P, ":");
            kid_push(P, &b, parse_expr(P, true), (jstr){0});
            if (!is_op(cur(P), ",")) break;
            advance(P);
        }
        expect_op(P, "}");
        n = mk(P, E_DICT, line);
        n->kids = b.v;
        n->n_kids = b.n;
    } else {
        unexpected(P, "an expression");
    }
    P->depth--;
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, ".")) {
            advance(P);
            jnode *a = mk(P, E_ATTR, t->line);
            a->a = n;
            if (cur(P)->t == T_INT) {
                a->kind = E_ITEM;
                a->b = mk(P, E_LIT, t->line);
                a->b->lit = (jv){.t = JV_INT, .u.i = advance(P)->i};
            } else
                a->name = expect_name(P);
            n = a;
        } else if (is_op(t, "[")) {
            advance(P);
            jnode *parts[3] = {0};
            int colons = 0;
            for (;;) {
                if (is_op(cur(P), ":")) {
                    if (++colons > 2) unexpected(P, "']'");
                    advance(P);
                } else if (is_op(cur(P), "]")) {
                    break;
                } else {
                    if (parts[colons]) unexpected(P, "':' or ']'");
                    parts[colons] = parse_expr(P, true);
                }
            }
            advance(P);
            jnode *a;
            if (colons == 0) {
                if (!parts[0]) perr(P, t->line, "an empty subscript");
                a = mk(P, E_ITEM, t->line);
                a->b = parts[0];
            } else {
                a = mk(P, E_SLICE, t->line);
                a->kids = palloc(P, 3 * sizeof *a->kids);
                memcpy(a->kids, parts, sizeof parts);
                a->n_kids = 3;
            }
            a->a = n;
            n = a;
        } else if (is_op(t, "(")) {
            advance(P);
            jnode *c = mk(P, E_CALL, t->line);
            c->a = n;
            parse_args(P, c);
            n = c;
        } else
            return n;
    }
}

static jnode *parse_filter_expr(parser *P, jnode *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, "|")) {
            advance(P);
            jnode *f = mk(P, E_FILTER, t->line);
            f->a = n;
            f->name = expect_name(P);
            if (is_op(cur(P), "(")) {
                advance(P);
                parse_args(P, f);
            }
            n = f;
        } else if (is_name(t, "is")) {
            advance(P);
            jnode *f = mk(P, E_TEST, t->line);
            f->a = n;
            if (is_name(cur(P), "not")) {
                advance(P);
                f->op = 1;
            }
            /* test names may be keywords: none, true, false, in */
            if (cur(P)->t != T_NAME && !is_op(cur(P), "==") && !is_op(cur(P), "!=") && !is_op(cur(P), "<") &&
                !is_op(cur(P), ">") && !is_op(cur(P), "<=") && !is_op(cur(P), ">="))
                unexpected(P, "a test name");
            tok *nm = advance(P);
            f->name = (jstr){nm->p, nm->n};
            tok *a = cur(P);
            if (is_op(a, "(")) {
                advance(P);
                parse_args(P, f);
            } else if ((a->t == T_NAME || a->t == T_STR || a->t == T_INT || a->t == T_FLOAT || is_op(a, "(") ||
                        is_op(a, "[") || is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and")) {
                jnode *arg = parse_postfix(P, parse_primary(P));
                f->kids = palloc(P, sizeof *f->kids);
                f->kids[0] = arg;
                f->names = palloc(P, sizeof *f->names);
                f->n_kids = 1;
            }
            n = f;
        } else if (is_op(t, "(")) {
            advance(P);
            jnode *c = mk(P, E_CALL, t->line);
            c->a = n;
            parse_args(P, c);
            n = c;
        } else
            return n;
    }
}

static jnode *parse_unary(parser *P, bool with_filter) {
    tok *t = cur(P);
    jnode *n;
    enter(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        advance(P);
        n = mk(P, is_op(t, "-") ? E_NEG : E_POS, t->line);
        n->a = parse_unary(P, false);
    } else
        n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *bin(parser *P, int line, jop op, jnode *a, jnode *b) {
    jnode *n = mk(P, E_BIN, line);
    n->op = (int)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, true);
    while (is_op(cur(P), "**")) {
        int line = advance(P)->line;
        n = bin(P, line, OP_POW, n, parse_unary(P, true));
    }
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    for (;;) {
        tok *t = cur(P);
        jop op;
        if (is_op(t, "*")) op = OP_MUL;
        else if (is_op(t, "/")) op = OP_DIV;
        else if (is_op(t, "//")) op = OP_FLOORDIV;
        else if (is_op(t, "%")) op = OP_MOD;
        else return n;
        advance(P);
        n = bin(P, t->line, op, n, parse_pow(P));
    }
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    while (is_op(cur(P), "~")) {
        int line = advance(P)->line;
        n = bin(P, line, OP_CONCAT, n, parse_math2(P));
    }
    return n;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    for (;;) {
        tok *t = cur(P);
        if (!is_op(t, "+") && !is_op(t, "-")) return n;
        advance(P);
        n = bin(P, t->line, is_op(t, "+") ? OP_ADD : OP_SUB, n, parse_concat(P));
    }
}

static jnode *parse_compare(parser *P) {
    jnode *n = parse_math1(P);
    for (;;) {
        tok *t = cur(P);
        jop op;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek_at(P, 1), "in")) {
            advance(P);
            op = OP_NOTIN;
        } else
            return n;
        advance(P);
        n = bin(P, t->line, op, n, parse_math1(P));
    }
}

static jnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        int line = advance(P)->line;
        enter(P);
        jnode *n = mk(P, E_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (is_name(cur(P), "and")) {
        int line = advance(P)->line;
        jnode *a = mk(P, E_AND, line);
        a->a = n;
        a->b = parse_not(P);
        n = a;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (is_name(cur(P), "or")) {
        int line = advance(P)->line;
        jnode *a = mk(P, E_OR, line);
        a->a = n;
        a->b = parse_and(P);
        n = a;
    }
    return n;
}

static jnode *parse_expr(parser *P, bool with_cond) {
    enter(P);
    jnode *n = parse_or(P);
    if (with_cond) {
        while (is_name(cur(P), "if")) {
            int line = advance(P)->line;
            jnode *c = mk(P, E_COND, line);
            c->a = n;
            c->b = parse_or(P);
            if (is_name(cur(P), "else")) {
                advance(P);
                c->c = parse_expr(P, true);
            }
            n = c;
        }
    }
    P->depth--;
    return n;
}

/* ---- statements ---- */

static void expect_bend(parser *P) {
    if (cur(P)->t != T_BEND) unexpected(P, "'%}'");
    advance(P);
}

/* Whether the next tokens are {% name %} for one of the names (a list
 * ending in NULL). */
static bool at_tag(parser *P, const char *const *names) {
    if (cur(P)->t != T_BBEGIN) return false;
    for (size_t k = 0; names[k]; k++)
        if (is_name(peek_at(P, 1), names[k])) return true;
    return false;
}

static jnode *parse_block(parser *P, const char *const *until, const char *opener, int open_line);

/* A macro's parameters "(name [= default], ...)" into m: names, and their
 * defaults (NULL: none) as kids. */
static void parse_params(parser *P, jnode *m) {
    expect_op(P, "(");
    kidbuf b = {0};
    while (!is_op(cur(P), ")")) {
        jstr pn = expect_name(P);
        jnode *def = NULL;
        if (is_op(cur(P), "=")) {
            advance(P);
            def = parse_expr(P, true);
        }
        kid_push(P, &b, def, pn);
        if (!is_op(cur(P), ",")) break;
        advance(P);
    }
    expect_op(P, ")");
    m->kids = b.v;
    m->names = b.names;
    m->n_kids = m->n_names = b.n;
}

static jnode *parse_tag(parser *P) {
    tok *open = advance(P); /* {% */
    int line = open->line;
    tok *kw = cur(P);
    if (kw->t != T_NAME) unexpected(P, "a statement name");
    advance(P);
    jstr k = {kw->p, kw->n};
    if (jstr_is(k, "if") || jstr_is(k, "elif")) {
        jnode *n = mk(P, N_IF, line);
        n->a = parse_expr(P, true);
        expect_bend(P);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        n->b = parse_block(P, ends, "if", line);
        if (is_name(peek_at(P, 1), "elif")) {
            n->c = mk(P, N_BLOCK, cur(P)->line);
            n->c->kids = palloc(P, sizeof *n->c->kids);
            enter(P);
            n->c->kids[0] = parse_tag(P); /* consumes through endif */
            P->depth--;
            n->c->n_kids = 1;
            return n;
        }
        if (is_name(peek_at(P, 1), "else")) {
            advance(P);
            advance(P);
            expect_bend(P);
            static const char *const end[] = {"endif", NULL};
            n->c = parse_block(P, end, "else", line);
        }
        advance(P);
        advance(P); /* endif */
        expect_bend(P);
        return n;
    }
    if (jstr_is(k, "for")) {
        jnode *n = mk(P, N_FOR, line);
        kidbuf b = {0};
        bool paren = is_op(cur(P), "(");
        if (paren) advance(P);
        for (;;) {
            kid_push(P, &b, NULL, expect_name(P));
            if (!is_op(cur(P), ",")) break;
            advance(P);
        }
        if (paren) expect_op(P, ")");
        n->names = b.names;
        n->n_names = b.n;
        if (!is_name(cur(P), "in")) unexpected(P, "'in'");
        advance(P);
        n->a = parse_expr(P, false);
        if (is_name(cur(P), "if")) {
            advance(P);
            n->b = parse_expr(P, true);
        }
        if (is_name(cur(P), "recursive")) perr(P, line, "recursive loops are not supported");
        expect_bend(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        n->kids = palloc(P, sizeof *n->kids);
        n->kids[0] = parse_block(P, ends, "for", line);
        n->n_kids = 1;
        if (is_name(peek_at(P, 1), "else")) {
            advance(P);
            advance(P);
            expect_bend(P);
            static const char *const end[] = {"endfor", NULL};
            n->c = parse_block(P, end, "for", line);
        }
        advance(P);
        advance(P);
        expect_bend(P);
        return n;
    }
    if (jstr_is(k, "set")) {
        bool paren = is_op(cur(P), "(");
        if (paren) advance(P);
        jstr first = expect_name(P);
        if (!paren && is_op(cur(P), ".")) {
            advance(P);
            jnode *n = mk(P, N_SET_ATTR, line);
            n->names = palloc(P, sizeof *n->names);
            n->names[0] = first;
            n->n_names = 1;
            n->name = expect_name(P);
            expect_op(P, "=");
            n->a = parse_expr(P, true);
            expect_bend(P);
            return n;
        }
        kidbuf b = {0};
        kid_push(P, &b, NULL, first);
        while (is_op(cur(P), ",")) {
            advance(P);
            kid_push(P, &b, NULL, expect_name(P));
        }
        if (paren) expect_op(P, ")");
        if (cur(P)->t == T_BEND && b.n == 1 && !paren) {
            advance(P);
            jnode *n = mk(P, N_SET_BLOCK, line);
            n->names = b.names;
            n->n_names = 1;
            static const char *const end[] = {"endset", NULL};
            n->a = parse_block(P, end, "set", line);
            advance(P);
            advance(P);
            expect_bend(P);
            return n;
        }
        expect_op(P, "=");
        jnode *n = mk(P, N_SET, line);
        n->names = b.names;
        n->n_names = b.n;
        n->a = parse_expr(P, true);
        if (is_op(cur(P), ",")) { /* a, b = 1, 2 */
            kidbuf v = {0};
            kid_push(P, &v, n->a, (jstr){0});
            while (is_op(cur(P), ",")) {
                advance(P);
                kid_push(P, &v, parse_expr(P, true), (jstr){0});
            }
            n->a = mk(P, E_LIST, line);
            n->a->op = 1;
            n->a->kids = v.v;
            n->a->n_kids = v.n;
        }
        expect_bend(P);
        return n;
    }
    if (jstr_is(k, "macro")) {
        jnode *n = mk(P, N_MACRO, line);
        n->name = expect_name(P);
        parse_params(P, n);
        expect_bend(P);
        static const char *const end[] = {"endmacro", NULL};
        n->a = parse_block(P, end, "macro", line);
        advance(P);
        advance(P);
        if (cur(P)->t == T_NAME) advance(P); /* {% endmacro name %} */
        expect_bend(P);
        return n;
    }
    if (jstr_is(k, "call")) { /* {% call [(params)] macro(args) %}body{% endcall %} */
        jnode *n = mk(P, N_CALL_BLOCK, line);
        jnode *body = mk(P, N_MACRO, line); /* the body, as a macro named caller */
        body->name = (jstr){"caller", 6};
        if (is_op(cur(P), "(")) parse_params(P, body);
        n->a = parse_expr(P, true);
        if (n->a->kind != E_CALL) perr(P, line, "{%% call %%} expects a macro call");
        expect_bend(P);
        static const char *const end[] = {"endcall", NULL};
        body->a = parse_block(P, end, "call", line);
        advance(P);
        advance(P);
        expect_bend(P);
        n->b = body;
        return n;
    }
    if (jstr_is(k, "break") || jstr_is(k, "continue")) {
        jnode *n = mk(P, jstr_is(k, "break") ? N_BREAK : N_CONTINUE, line);
        expect_bend(P);
        return n;
    }
    if (jstr_is(k, "generation")) { /* transformers' assistant-mask marker: renders its body */
        expect_bend(P);
        static const char *const end[] = {"endgeneration", NULL};
        jnode *n = parse_block(P, end, "generation", line);
        advance(P);
        advance(P);
        expect_bend(P);
        return n;
    }
    perr(P, line, "unknown or unsupported statement '%.*s'", (int)(k.n > 40 ? 40 : k.n), k.p);
}

static jnode *parse_block(parser *P, const char *const *until, const char *opener, int open_line) {
    kidbuf b = {0};
    int line = cur(P)->line;
    enter(P);
    for (;;) {
        tok *t = cur(P);
        if (t->t == T_EOF) {
            if (!until) break;
        {
            size_t last = 0;
            while (until[last + 1]) last++;
            perr(P, open_line, "'%s' is not closed (expected {%% %s %%})", opener, until[last]);
        }
        }
        if (until && at_tag(P, until)) break;
        if (t->t == T_TEXT) {
            advance(P);
            jnode *n = mk(P, N_TEXT, t->line);
            n->lit = (jv){.t = JV_STR, .u.s = {t->p, t->n}};
            kid_push(P, &b, n, (jstr){0});
        } else if (t->t == T_VBEGIN) {
            advance(P);
            jnode *n = mk(P, N_OUT, t->line);
            n->a = parse_expr(P, true);
            if (cur(P)->t != T_VEND) unexpected(P, "'}}'");
            advance(P);
            kid_push(P, &b, n, (jstr){0});
        } else if (t->t == T_BBEGIN) {
            tok *kw = peek_at(P, 1);
            static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset", "endmacro",
                                                "endgeneration", "endcall", NULL};
            for (size_t q = 0; stray[q]; q++)
                if (is_name(kw, stray[q]))
                    perr(P, kw->line, "unexpected '%s'%s%s", stray[q], opener ? " inside " : "", opener ? opener : "");
            kid_push(P, &b, parse_tag(P), (jstr){0});
        } else {
            unexpected(P, "text or a tag");
        }
    }
    P->depth--;
    jnode *n = mk(P, N_BLOCK, line);
    n->kids = b.v;
    n->n_kids = b.n;
    return n;
}

og_status og_jinja_parse(const char *src, size_t len, og_jinja **out) {
    if (!src || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_jinja_parse: NULL argument");
    *out = NULL;
    og_jinja *t = og_calloc(1, sizeof *t);
    if (!t) return og_set_error(OG_ERR_OUT_OF_MEMORY, "template: out of memory");
    parser *P = og_calloc(1, sizeof *P);
    if (!P) {
        og_free(t);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "template: out of memory");
    }
    P->mem = &t->mem;
    if (setjmp(P->jb)) {
        og_status st = og_set_error(P->st, "%s", P->err);
        arena_free(&t->mem);
        og_free(t);
        og_free(P);
        return st;
    }
    /* newlines as Jinja reads them: \r\n and \r become \n, and one newline
     * at the very end is dropped */
    char *s = palloc(P, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[n++] = src[i];
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    P->src = s;
    P->len = n;
    lex(P);
    t->root = parse_block(P, NULL, NULL, 1);
    og_free(P);
    *out = t;
    return OG_OK;
}

void og_jinja_free(og_jinja *t) {
    if (!t) return;
    arena_free(&t->mem);
    og_free(t);
}

/* ---- evaluation --------------------------------------------------------- */

typedef struct frame {
    jdict *vars;
    /* where lookup goes on after this frame: -1 the frame below; a macro's
     * frame 0 (its arguments, then the top level); a {% call %} body's the
     * frame that was on top where it was written */
    long link;
} frame;

typedef struct render {
    arena mem;
    og_jinja_limits lim;
    uint64_t steps;
    char *out;
    size_t n_out, cap_out;
    frame *frames;
    size_t n_frames, cap_frames;
    int calls;
    int depth;
    int brk; /* 1 break, 2 continue */
    jmp_buf jb;
    og_status st;
    char err[OG_ERRMSG_CAP];
} render;

static _Noreturn OG_PRINTF(3, 4) void rerr(render *R, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_at(&R->st, R->err, OG_ERR_INVALID_ARGUMENT, line, fmt, ap);
    va_end(ap);
    longjmp(R->jb, 1);
}

static _Noreturn void room(render *R) {
    snprintf(R->err, sizeof R->err, "template: rendering needs more than %zu bytes of memory", R->lim.max_memory);
    R->st = OG_ERR_OUT_OF_MEMORY;
    longjmp(R->jb, 1);
}

static void *ralloc(render *R, size_t n) {
    void *p = arena_alloc(&R->mem, n);
    if (!p) room(R);
    return p;
}

static void step(render *R, int line) {
    if (++R->steps > R->lim.max_steps)
        rerr(R, line, "rendering takes more than %llu steps", (unsigned long long)R->lim.max_steps);
}

static jv mkstr(const char *p, size_t n) { return (jv){.t = JV_STR, .u.s = {p, n}}; }
static jv mkint(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
static jv mkbool(bool b) { return (jv){.t = JV_BOOL, .u.b = b}; }
static jv mkfloat(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
static jv mknone(void) { return (jv){.t = JV_NONE}; }
static jv mkundef(jstr name) { return (jv){.t = JV_UNDEF, .u.s = {name.p, name.n}}; }

static jv str_copy(render *R, const char *p, size_t n) {
    char *o = ralloc(R, n + 1);
    if (n) memcpy(o, p, n);
    o[n] = 0;
    return mkstr(o, n);
}

static jlist *list_new(render *R, size_t cap) {
    jlist *l = ralloc(R, sizeof *l);
    l->n = 0;
    l->tuple = false;
    l->cap = cap ? cap : 4;
    if (l->cap > (SIZE_MAX / 2) / sizeof(jv)) room(R);
    l->v = ralloc(R, l->cap * sizeof *l->v);
    return l;
}

static void list_push(render *R, jlist *l, jv v) {
    if (l->n == l->cap) {
        if (l->cap > (SIZE_MAX / 4) / sizeof(jv)) room(R);
        jv *nv = ralloc(R, l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

static jv mklist(jlist *l) { return (jv){.t = JV_LIST, .u.l = l}; }

static jdict *dict_new(render *R, int kind) {
    jdict *d = ralloc(R, sizeof *d);
    d->n = 0;
    d->cap = 4;
    d->kind = kind;
    d->k = ralloc(R, d->cap * sizeof *d->k);
    d->v = ralloc(R, d->cap * sizeof *d->v);
    return d;
}

static bool jv_eq(const jv *a, const jv *b);

static jv *dict_find(const jdict *d, const jv *key) {
    for (size_t i = d->n; i-- > 0;)
        if (jv_eq(&d->k[i], key)) return &d->v[i];
    return NULL;
}

static jv *dict_find_z(const jdict *d, const char *p, size_t n) {
    jv k = mkstr(p, n);
    return dict_find(d, &k);
}

static void dict_set(render *R, jdict *d, jv key, jv val) {
    jv *have = dict_find(d, &key);
    if (have) {
        *have = val;
        return;
    }
    if (d->n == d->cap) {
        if (d->cap > (SIZE_MAX / 4) / sizeof(jv)) room(R);
        jv *nk = ralloc(R, d->cap * 2 * sizeof *nk), *nv = ralloc(R, d->cap * 2 * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

static void dict_set_z(render *R, jdict *d, const char *z, jv val) { dict_set(R, d, mkstr(z, strlen(z)), val); }

static const char *type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "undefined";
    case JV_NONE: return "none";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "string";
    case JV_LIST: return "list";
    case JV_DICT: return v->u.d->kind == JD_NAMESPACE ? "namespace" : v->u.d->kind == JD_LOOP ? "loop" : "dict";
    case JV_MACRO: return "macro";
    case JV_FUNC: return "function";
    }
    return "value";
}

static bool truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n > 0;
    case JV_LIST: return v->u.l->n > 0;
    case JV_DICT: return v->u.d->kind != JD_DICT || v->u.d->n > 0;
    default: return true;
    }
}

static bool is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num_f(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b ? 1.0 : 0.0;
}
static int64_t num_i(const jv *v) { return v->t == JV_INT ? v->u.i : v->t == JV_BOOL ? (int64_t)v->u.b : 0; }

static bool jv_eq_d(const jv *a, const jv *b, int depth);
static bool jv_eq(const jv *a, const jv *b) { return jv_eq_d(a, b, 0); }

/* Values nested deeper than JMAX_DEPTH compare unequal. */
static bool jv_eq_d(const jv *a, const jv *b, int depth) {
    if (depth > JMAX_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a->u.s.n == b->u.s.n && (a->u.s.n == 0 || !memcmp(a->u.s.p, b->u.s.p, a->u.s.n));
    case JV_LIST:
        if (a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jv_eq_d(&a->u.l->v[i], &b->u.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a->u.d == b->u.d) return true;
        if (a->u.d->kind != JD_DICT || b->u.d->kind != JD_DICT || a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jv *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !jv_eq_d(&a->u.d->v[i], o, depth + 1)) return false;
        }
        return true;
    case JV_MACRO: return a->u.mac.m == b->u.mac.m;
    case JV_FUNC: return a->u.fn == b->u.fn;
    default: return false;
    }
}

/* ---- text building ---- */

typedef struct sbuf {
    render *R;
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n + 1) {
            if (cap > SIZE_MAX / 4) room(b->R);
            cap *= 2;
        }
        char *np = ralloc(b->R, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_z(sbuf *b, const char *z) { sb_put(b, z, strlen(z)); }
static void sb_c(sbuf *b, char c) { sb_put(b, &c, 1); }
static jv sb_val(sbuf *b) { return b->n ? mkstr(b->p, b->n) : mkstr("", 0); }

/* Python's repr of a float. */
static void fmt_float(double x, char *buf, size_t cap) {
    if (isnan(x)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(x)) { snprintf(buf, cap, x < 0 ? "-inf" : "inf"); return; }
    char e[40];
    int p;
    for (p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    bool neg = e[0] == '-';
    char digits[24];
    size_t nd = 0;
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (is_digit(*q)) digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    size_t o = 0;
    if (neg) buf[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            buf[o++] = '0';
            buf[o++] = '.';
            for (int z = 0; z < -exp10 - 1; z++) buf[o++] = '0';
            for (size_t d = 0; d < nd; d++) buf[o++] = digits[d];
        } else {
            for (int d = 0; d <= exp10; d++) buf[o++] = (size_t)d < nd ? digits[d] : '0';
            buf[o++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t d = (size_t)exp10 + 1; d < nd; d++) buf[o++] = digits[d];
            else
                buf[o++] = '0';
        }
        buf[o] = 0;
    } else {
        buf[o++] = digits[0];
        if (nd > 1) {
            buf[o++] = '.';
            for (size_t d = 1; d < nd; d++) buf[o++] = digits[d];
        }
        snprintf(buf + o, cap - o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static void repr(sbuf *b, const jv *v, int level);

static void repr_str(sbuf *b, const char *p, size_t n) {
    bool sq = false, dq = false;
    for (size_t i = 0; i < n; i++) {
        sq |= p[i] == '\'';
        dq |= p[i] == '"';
    }
    char q = sq && !dq ? '"' : '\'';
    sb_c(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char t[8];
        if (c == (unsigned char)q || c == '\\') { sb_c(b, '\\'); sb_c(b, (char)c); }
        else if (c == '\n') sb_z(b, "\\n");
        else if (c == '\r') sb_z(b, "\\r");
        else if (c == '\t') sb_z(b, "\\t");
        else if (c < 0x20 || c == 0x7f) { snprintf(t, sizeof t, "\\x%02x", c); sb_z(b, t); }
        else sb_c(b, (char)c);
    }
    sb_c(b, q);
}

/* str(v) */
static void to_text_d(sbuf *b, const jv *v, int level);
static void to_text(sbuf *b, const jv *v) { to_text_d(b, v, 0); }

static void to_text_d(sbuf *b, const jv *v, int level) {
    char t[48];
    switch (v->t) {
    case JV_UNDEF: return;
    case JV_NONE: sb_z(b, "None"); return;
    case JV_BOOL: sb_z(b, v->u.b ? "True" : "False"); return;
    case JV_INT: snprintf(t, sizeof t, "%lld", (long long)v->u.i); sb_z(b, t); return;
    case JV_FLOAT: fmt_float(v->u.f, t, sizeof t); sb_z(b, t); return;
    case JV_STR: sb_put(b, v->u.s.p, v->u.s.n); return;
    default: repr(b, v, level); return;
    }
}

static void repr(sbuf *b, const jv *v, int level) {
    if (level > JMAX_DEPTH) rerr(b->R, 0, "a value nested deeper than %d cannot be printed", JMAX_DEPTH);
    switch (v->t) {
    case JV_STR: repr_str(b, v->u.s.p, v->u.s.n); return;
    case JV_UNDEF: return;
    case JV_LIST:
        sb_c(b, v->u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_z(b, ", ");
            repr(b, &v->u.l->v[i], level + 1);
        }
        if (v->u.l->tuple && v->u.l->n == 1) sb_c(b, ',');
        sb_c(b, v->u.l->tuple ? ')' : ']');
        return;
    case JV_DICT:
        if (v->u.d->kind == JD_NAMESPACE) sb_z(b, "<Namespace ");
        sb_c(b, '{');
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) sb_z(b, ", ");
            repr(b, &v->u.d->k[i], level + 1);
            sb_z(b, ": ");
            repr(b, &v->u.d->v[i], level + 1);
        }
        sb_c(b, '}');
        if (v->u.d->kind == JD_NAMESPACE) sb_c(b, '>');
        return;
    case JV_MACRO: sb_z(b, "<Macro>"); return;
    case JV_FUNC: sb_z(b, "<function>"); return;
    default: to_text_d(b, v, level); return;
    }
}

static jv text_of(render *R, const jv *v) {
    if (v->t == JV_STR) return *v;
    sbuf b = {R, 0, 0, 0};
    to_text(&b, v);
    return sb_val(&b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) */
typedef struct jsonopt {
    int indent;             /* -1: none */
    jv item_sep, key_sep;   /* separators */
    bool ensure_ascii, sort_keys;
} jsonopt;

static int cmp_values(render *R, const jv *a, const jv *b, bool case_sensitive, int line);
static void sort_values(render *R, jv *v, size_t n, const jv *keys, bool reverse, bool case_sensitive, int line);

static void to_json(render *R, sbuf *b, const jv *v, const jsonopt *o, int level, int line) {
    char t[48];
    const int indent = o->indent;
    if (level > JMAX_DEPTH) rerr(R, line, "tojson: a value nested deeper than %d", JMAX_DEPTH);
    switch (v->t) {
    case JV_NONE: sb_z(b, "null"); return;
    case JV_BOOL: sb_z(b, v->u.b ? "true" : "false"); return;
    case JV_INT: snprintf(t, sizeof t, "%lld", (long long)v->u.i); sb_z(b, t); return;
    case JV_FLOAT:
        if (isnan(v->u.f)) sb_z(b, "NaN");
        else if (isinf(v->u.f)) sb_z(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(v->u.f, t, sizeof t); sb_z(b, t); }
        return;
    case JV_STR:
        sb_c(b, '"');
        for (size_t i = 0; i < v->u.s.n; i++) {
            unsigned char c = (unsigned char)v->u.s.p[i];
            if (c == '"') sb_z(b, "\\\"");
            else if (c == '\\') sb_z(b, "\\\\");
            else if (c == '\n') sb_z(b, "\\n");
            else if (c == '\r') sb_z(b, "\\r");
            else if (c == '\t') sb_z(b, "\\t");
            else if (c == '\b') sb_z(b, "\\b");
            else if (c == '\f') sb_z(b, "\\f");
            else if (c < 0x20) { snprintf(t, sizeof t, "\\u%04x", c); sb_z(b, t); }
            else if (c < 0x80 || !o->ensure_ascii) sb_c(b, (char)c);
            else { /* \\uXXXX, as surrogate pairs past the BMP */
                utf8proc_int32_t cp;
                utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)v->u.s.p + i,
                                                      (utf8proc_ssize_t)(v->u.s.n - i), &cp);
                if (k <= 0) { cp = 0xfffd; k = 1; }
                if (cp >= 0x10000) {
                    snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
                } else
                    snprintf(t, sizeof t, "\\u%04x", (unsigned)cp);
                sb_z(b, t);
                i += (size_t)k - 1;
            }
        }
        sb_c(b, '"');
        return;
    case JV_LIST:
    case JV_DICT: {
        bool is_list = v->t == JV_LIST;
        if (!is_list && v->u.d->kind != JD_DICT) break;
        size_t n = is_list ? v->u.l->n : v->u.d->n;
        sb_c(b, is_list ? '[' : '{');
        if (n == 0) {
            sb_c(b, is_list ? ']' : '}');
            return;
        }
        /* the order of a dict's members: as inserted, or by key */
        size_t *order = NULL;
        if (!is_list && o->sort_keys) {
            jv *idx = ralloc(R, n * sizeof *idx);
            for (size_t i = 0; i < n; i++) idx[i] = mkint((int64_t)i);
            sort_values(R, idx, n, v->u.d->k, false, true, line);
            order = ralloc(R, n * sizeof *order);
            for (size_t i = 0; i < n; i++) order[i] = (size_t)idx[i].u.i;
        }
        for (size_t q = 0; q < n; q++) {
            size_t i = order ? order[q] : q;
            if (q) sb_put(b, o->item_sep.u.s.p, o->item_sep.u.s.n);
            if (indent >= 0) {
                sb_c(b, '\n');
                for (int s = 0; s < indent * (level + 1); s++) sb_c(b, ' ');
            }
            if (!is_list) {
                const jv *k = &v->u.d->k[i];
                if (k->t == JV_STR) to_json(R, b, k, o, level + 1, line);
                else if (k->t == JV_INT || k->t == JV_FLOAT || k->t == JV_BOOL || k->t == JV_NONE) {
                    sbuf kb = {R, 0, 0, 0};
                    if (k->t == JV_BOOL) sb_z(&kb, k->u.b ? "true" : "false");
                    else if (k->t == JV_NONE) sb_z(&kb, "null");
                    else to_text(&kb, k);
                    jv ks = sb_val(&kb);
                    to_json(R, b, &ks, o, level + 1, line);
                } else
                    rerr(R, line, "tojson: keys must be strings, not %s", type_name(k));
                sb_put(b, o->key_sep.u.s.p, o->key_sep.u.s.n);
            }
            to_json(R, b, is_list ? &v->u.l->v[i] : &v->u.d->v[i], o, level + 1, line);
        }
        if (indent >= 0) {
            sb_c(b, '\n');
            for (int s = 0; s < indent * level; s++) sb_c(b, ' ');
        }
        sb_c(b, is_list ? ']' : '}');
        return;
    }
    default: break;
    }
    rerr(R, line, "tojson: a %s value is not JSON serializable", type_name(v));
}

/* ---- UTF-8 helpers ---- */

/* Byte offsets of each code point of s, plus the end: (count + 1) entries. */
static size_t *cp_offsets(render *R, const char *p, size_t n, size_t *count) {
    size_t *o = ralloc(R, (n + 1) * sizeof *o);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xc0) != 0x80) o[k++] = i;
    o[k] = n;
    *count = k;
    return o;
}

static size_t cp_count(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}

/* Maps every code point of s through f (utf8proc case mapping); mode 1:
 * capitalize (first upper, rest lower), 2: Jinja's title filter, 3: Python's
 * str.title. */
static jv map_case(render *R, jv s, utf8proc_int32_t (*f)(utf8proc_int32_t), int mode) {
    sbuf b = {R, 0, 0, 0};
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s.u.s.p;
    utf8proc_ssize_t n = (utf8proc_ssize_t)s.u.s.n, i = 0;
    bool word_start = true;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, n - i, &cp);
        if (k <= 0) { /* invalid byte: kept as it is */
            sb_c(&b, (char)p[i]);
            i++;
            continue;
        }
        utf8proc_int32_t m = cp;
        if (mode == 0) m = f(cp);
        else if (mode == 1) m = i == 0 ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        else if (mode == 3) { /* Python's str.title: upper after an uncased character */
            m = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            utf8proc_category_t cat = utf8proc_category(cp);
            word_start = !(cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT);
        } else {
            m = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            /* Jinja's title: words start after spaces, '-', and opening brackets */
            word_start = cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == '\v' ||
                         cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        }
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t e = utf8proc_encode_char(m, enc);
        sb_put(&b, (const char *)enc, (size_t)e);
        i += k;
    }
    return sb_val(&b);
}

static bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

/* Whether the code point at c (l bytes) is one of the nc code points of set. */
static bool in_chars(const char *set, const size_t *co, size_t nc, const char *c, size_t l) {
    for (size_t k = 0; k < nc; k++)
        if (co[k + 1] - co[k] == l && !memcmp(set + co[k], c, l)) return true;
    return false;
}

/* str.strip/lstrip/rstrip with chars (NULL: whitespace); which: 1 left, 2 right, 3 both */
static jv strip(render *R, jv s, const jv *chars, int which) {
    const char *p = s.u.s.p;
    size_t a = 0, e = s.u.s.n;
    if (!chars || chars->t == JV_NONE || chars->t == JV_UNDEF) {
        if (which & 1) while (a < e && py_space((unsigned char)p[a])) a++;
        if (which & 2) while (e > a && py_space((unsigned char)p[e - 1])) e--;
        return mkstr(p + a, e - a);
    }
    /* code points of chars */
    size_t nc;
    size_t *co = cp_offsets(R, chars->u.s.p, chars->u.s.n, &nc);
    size_t ns;
    size_t *so = cp_offsets(R, p, s.u.s.n, &ns);
    size_t ia = 0, ie = ns;
    if (which & 1)
        while (ia < ie && in_chars(chars->u.s.p, co, nc, p + so[ia], so[ia + 1] - so[ia])) ia++;
    if (which & 2)
        while (ie > ia && in_chars(chars->u.s.p, co, nc, p + so[ie - 1], so[ie] - so[ie - 1])) ie--;
    return mkstr(p + so[ia], so[ie] - so[ia]);
}

static bool has_prefix(jv s, jv pre) {
    return pre.t == JV_STR && pre.u.s.n <= s.u.s.n && !memcmp(s.u.s.p, pre.u.s.p, pre.u.s.n);
}
static bool has_suffix(jv s, jv suf) {
    return suf.t == JV_STR && suf.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + s.u.s.n - suf.u.s.n, suf.u.s.p, suf.u.s.n);
}

static const char *find_sub(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static jv split(render *R, jv s, const jv *sep, int64_t maxsplit, int line) {
    jlist *l = list_new(R, 4);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    if (!sep || sep->t == JV_NONE || sep->t == JV_UNDEF) {
        for (;;) {
            while (i < n && py_space((unsigned char)p[i])) i++;
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) { /* the rest, as it is */
                list_push(R, l, mkstr(p + i, n - i));
                break;
            }
            size_t j = i;
            while (j < n && !py_space((unsigned char)p[j])) j++;
            list_push(R, l, mkstr(p + i, j - i));
            i = j;
        }
        return mklist(l);
    }
    if (sep->t != JV_STR) rerr(R, line, "split: the separator must be a string, not %s", type_name(sep));
    if (sep->u.s.n == 0) rerr(R, line, "split: empty separator");
    for (;;) {
        const char *f = maxsplit >= 0 && (int64_t)l->n >= maxsplit ? NULL : find_sub(p + i, n - i, sep->u.s.p, sep->u.s.n);
        if (!f) {
            list_push(R, l, mkstr(p + i, n - i));
            break;
        }
        list_push(R, l, mkstr(p + i, (size_t)(f - (p + i))));
        i = (size_t)(f - p) + sep->u.s.n;
        step(R, line);
    }
    return mklist(l);
}

static jv replace(render *R, jv s, jv old, jv new_, int64_t count, int line) {
    if (old.t != JV_STR || new_.t != JV_STR) rerr(R, line, "replace: arguments must be strings");
    sbuf b = {R, 0, 0, 0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    int64_t done = 0;
    if (old.u.s.n == 0) { /* Python inserts new between every character */
        size_t nc;
        size_t *o = cp_offsets(R, p, n, &nc);
        for (size_t k = 0; k <= nc; k++) {
            if (count < 0 || done < count) {
                sb_put(&b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (k < nc) sb_put(&b, p + o[k], o[k + 1] - o[k]);
        }
        return b.n ? sb_val(&b) : mkstr("", 0);
    }
    while (i <= n) {
        const char *f = count >= 0 && done >= count ? NULL : find_sub(p + i, n - i, old.u.s.p, old.u.s.n);
        if (!f) {
            sb_put(&b, p + i, n - i);
            break;
        }
        sb_put(&b, p + i, (size_t)(f - (p + i)));
        sb_put(&b, new_.u.s.p, new_.u.s.n);
        i = (size_t)(f - p) + old.u.s.n;
        done++;
        step(R, line);
    }
    return b.n ? sb_val(&b) : mkstr("", 0);
}

/* ---- scopes ---- */

static void push_frame(render *R, long link) {
    if (R->n_frames == R->cap_frames) {
        size_t cap = R->cap_frames ? R->cap_frames * 2 : 16;
        frame *nf = ralloc(R, cap * sizeof *nf);
        if (R->n_frames) memcpy(nf, R->frames, R->n_frames * sizeof *nf);
        R->frames = nf;
        R->cap_frames = cap;
    }
    R->frames[R->n_frames].vars = dict_new(R, JD_DICT);
    R->frames[R->n_frames].link = link;
    R->n_frames++;
}

static jv lookup(render *R, jstr name) {
    for (long i = (long)R->n_frames - 1; i >= 0;) {
        jv *v = dict_find_z(R->frames[i].vars, name.p, name.n);
        if (v) return *v;
        long next = R->frames[i].link >= 0 ? R->frames[i].link : i - 1;
        i = next < i ? next : i - 1; /* always downwards */
    }
    static const struct { const char *name; int fn; } globals[] = {
        {"raise_exception", JF_RAISE}, {"namespace", JF_NAMESPACE}, {"range", JF_RANGE},
        {"dict", JF_DICT}, {"strftime_now", JF_STRFTIME}};
    for (size_t g = 0; g < sizeof globals / sizeof *globals; g++)
        if (jstr_is(name, globals[g].name)) return (jv){.t = JV_FUNC, .u.fn = globals[g].fn};
    return mkundef(name);
}

static void assign(render *R, jstr name, jv v) {
    dict_set(R, R->frames[R->n_frames - 1].vars, mkstr(name.p, name.n), v);
}

/* ---- evaluation of expressions ---- */

static jv eval(render *R, const jnode *n);
static void exec(render *R, const jnode *n);

static _Noreturn void undefined_err(render *R, int line, const jv *v) {
    if (v->u.s.n) rerr(R, line, "'%.*s' is undefined", (int)(v->u.s.n > 60 ? 60 : v->u.s.n), v->u.s.p);
    rerr(R, line, "a value is undefined");
}

/* a.name or a[key]: dict members, list and string indices */
static jv get_item(render *R, const jv *obj, const jv *key, int line) {
    switch (obj->t) {
    case JV_UNDEF: undefined_err(R, line, obj);
    case JV_DICT: {
        jv *v = dict_find(obj->u.d, key);
        if (v) return *v;
        break;
    }
    case JV_LIST:
    case JV_STR:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            int64_t i = num_i(key);
            if (obj->t == JV_LIST) {
                int64_t n = (int64_t)obj->u.l->n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) return obj->u.l->v[i];
            } else {
                size_t nc;
                size_t *o = cp_offsets(R, obj->u.s.p, obj->u.s.n, &nc);
                int64_t n = (int64_t)nc;
                if (i < 0) i += n;
                if (i >= 0 && i < n) return mkstr(obj->u.s.p + o[i], o[i + 1] - o[i]);
            }
        }
        break;
    default: break;
    }
    jstr nm = {0};
    if (key->t == JV_STR) nm = (jstr){key->u.s.p, key->u.s.n};
    return mkundef(nm);
}

static int64_t slice_idx(render *R, const jnode *e, int64_t n, int64_t def, int64_t step_, int line) {
    if (!e) return def;
    jv v = eval(R, e);
    if (v.t == JV_NONE) return def;
    if (v.t != JV_INT && v.t != JV_BOOL) rerr(R, line, "slice indices must be integers, not %s", type_name(&v));
    int64_t i = num_i(&v);
    if (i < 0) {
        i += n;
        if (i < 0) i = step_ < 0 ? -1 : 0;
    } else if (i >= n)
        i = step_ < 0 ? n - 1 : n;
    return i;
}

static jv eval_slice(render *R, const jnode *n) {
    jv obj = eval(R, n->a);
    int64_t st = 1;
    if (n->kids[2]) {
        jv s = eval(R, n->kids[2]);
        if (s.t != JV_NONE) {
            if (s.t != JV_INT) rerr(R, n->line, "slice step must be an integer");
            st = s.u.i;
            if (st == 0) rerr(R, n->line, "slice step cannot be zero");
        }
    }
    size_t *off = NULL;
    int64_t len;
    if (obj.t == JV_LIST) len = (int64_t)obj.u.l->n;
    else if (obj.t == JV_STR) {
        size_t nc;
        off = cp_offsets(R, obj.u.s.p, obj.u.s.n, &nc);
        len = (int64_t)nc;
    } else if (obj.t == JV_UNDEF) undefined_err(R, n->line, &obj);
    else rerr(R, n->line, "a %s value cannot be sliced", type_name(&obj));
    int64_t a = slice_idx(R, n->kids[0], len, st < 0 ? len - 1 : 0, st, n->line);
    int64_t e = slice_idx(R, n->kids[1], len, st < 0 ? -1 : len, st, n->line);
    if (obj.t == JV_LIST) {
        jlist *l = list_new(R, 4);
        for (int64_t i = a; st > 0 ? i < e : i > e; i += st) list_push(R, l, obj.u.l->v[i]);
        return mklist(l);
    }
    if (st == 1) return a < e ? mkstr(obj.u.s.p + off[a], off[e] - off[a]) : mkstr("", 0);
    sbuf b = {R, 0, 0, 0};
    for (int64_t i = a; st > 0 ? i < e : i > e; i += st) sb_put(&b, obj.u.s.p + off[i], off[i + 1] - off[i]);
    return sb_val(&b);
}

/* arguments of a call, evaluated */
typedef struct args {
    jv *pos;
    size_t n_pos;
    jstr *kw;
    jv *kwv;
    size_t n_kw;
    int line;
} args;

static args eval_args(render *R, const jnode *call, size_t skip) {
    args a = {0};
    a.line = call->line;
    size_t n = call->n_kids;
    a.pos = ralloc(R, (n + 1) * sizeof *a.pos);
    a.kw = ralloc(R, (n + 1) * sizeof *a.kw);
    a.kwv = ralloc(R, (n + 1) * sizeof *a.kwv);
    for (size_t i = skip; i < n; i++) {
        jv v = eval(R, call->kids[i]);
        if (call->names && call->names[i].n == 1 && call->names[i].p[0] == '*') { /* f(*list) */
            if (v.t != JV_LIST) rerr(R, call->line, "'*' needs a list, not %s", type_name(&v));
            if (v.u.l->n > 64) rerr(R, call->line, "'*' gives more than 64 arguments");
            args b = a;
            b.pos = ralloc(R, (a.n_pos + v.u.l->n + (n - i)) * sizeof *b.pos);
            memcpy(b.pos, a.pos, a.n_pos * sizeof *b.pos);
            memcpy(b.pos + a.n_pos, v.u.l->v, v.u.l->n * sizeof *b.pos);
            b.n_pos += v.u.l->n;
            a = b;
            continue;
        }
        if (call->names && call->names[i].p) {
            a.kw[a.n_kw] = call->names[i];
            a.kwv[a.n_kw++] = v;
        } else
            a.pos[a.n_pos++] = v;
    }
    return a;
}

/* argument i by position, or by keyword name; NULL when absent */
static const jv *arg(const args *a, size_t i, const char *name) {
    if (i < a->n_pos) return &a->pos[i];
    for (size_t k = 0; k < a->n_kw; k++)
        if (jstr_is(a->kw[k], name)) return &a->kwv[k];
    return NULL;
}

static jv need_str(render *R, const jv *v, const char *what, int line) {
    if (!v || v->t != JV_STR) rerr(R, line, "%s expects a string, not %s", what, v ? type_name(v) : "nothing");
    return *v;
}

static int64_t need_int(render *R, const jv *v, const char *what, int line) {
    if (!v || (v->t != JV_INT && v->t != JV_BOOL))
        rerr(R, line, "%s expects an integer, not %s", what, v ? type_name(v) : "nothing");
    return num_i(v);
}

/* the characters argument of strip/lstrip/rstrip/trim: absent, none or a string */
static const jv *chars_arg(render *R, const args *a, const char *what, int line) {
    const jv *c = arg(a, 0, "chars");
    if (c && c->t != JV_NONE && c->t != JV_UNDEF) need_str(R, c, what, line);
    return c;
}

static jv call_value(render *R, const jv *fn, const args *a, int line);
static jv apply_filter(render *R, jstr name, const jv *v, const args *a, int line);
static bool apply_test(render *R, jstr name, const jv *v, const args *a, int line);

static jv str_method(render *R, jv s, jstr m, const args *a, int line, bool *found) {
    *found = true;
    if (jstr_is(m, "strip")) return strip(R, s, chars_arg(R, a, "strip", line), 3);
    if (jstr_is(m, "lstrip")) return strip(R, s, chars_arg(R, a, "lstrip", line), 1);
    if (jstr_is(m, "rstrip")) return strip(R, s, chars_arg(R, a, "rstrip", line), 2);
    if (jstr_is(m, "split")) {
        const jv *mx = arg(a, 1, "maxsplit");
        return split(R, s, arg(a, 0, "sep"), mx ? need_int(R, mx, "split", line) : -1, line);
    }
    if (jstr_is(m, "startswith") || jstr_is(m, "endswith")) {
        const jv *p = arg(a, 0, "prefix");
        if (!p) rerr(R, line, "%.*s expects an argument", (int)m.n, m.p);
        bool start = jstr_is(m, "startswith");
        if (p->t == JV_LIST) {
            for (size_t i = 0; i < p->u.l->n; i++)
                if (start ? has_prefix(s, p->u.l->v[i]) : has_suffix(s, p->u.l->v[i])) return mkbool(true);
            return mkbool(false);
        }
        need_str(R, p, start ? "startswith" : "endswith", line);
        return mkbool(start ? has_prefix(s, *p) : has_suffix(s, *p));
    }
    if (jstr_is(m, "upper")) return map_case(R, s, utf8proc_toupper, 0);
    if (jstr_is(m, "lower")) return map_case(R, s, utf8proc_tolower, 0);
    if (jstr_is(m, "title")) return map_case(R, s, NULL, 3);
    if (jstr_is(m, "capitalize")) return map_case(R, s, NULL, 1);
    if (jstr_is(m, "replace")) {
        const jv *o = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *c = arg(a, 2, "count");
        if (!o || !nw) rerr(R, line, "replace expects two arguments");
        return replace(R, s, *o, *nw, c ? need_int(R, c, "replace", line) : -1, line);
    }
    if (jstr_is(m, "find") || jstr_is(m, "count")) {
        jv sub = need_str(R, arg(a, 0, "sub"), "find", line);
        if (jstr_is(m, "find")) {
            const char *f = find_sub(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
            return mkint(f ? (int64_t)cp_count(s.u.s.p, (size_t)(f - s.u.s.p)) : -1);
        }
        if (sub.u.s.n == 0) return mkint((int64_t)cp_count(s.u.s.p, s.u.s.n) + 1);
        int64_t k = 0;
        size_t i = 0;
        const char *f;
        while ((f = find_sub(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n))) {
            k++;
            i = (size_t)(f - s.u.s.p) + sub.u.s.n;
        }
        return mkint(k);
    }
    if (jstr_is(m, "join")) {
        const jv *it = arg(a, 0, "iterable");
        if (!it || it->t != JV_LIST) rerr(R, line, "join expects a list");
        sbuf b = {R, 0, 0, 0};
        for (size_t i = 0; i < it->u.l->n; i++) {
            if (i) sb_put(&b, s.u.s.p, s.u.s.n);
            need_str(R, &it->u.l->v[i], "str.join", line);
            sb_put(&b, it->u.l->v[i].u.s.p, it->u.l->v[i].u.s.n);
        }
        return sb_val(&b);
    }
    if (jstr_is(m, "isdigit") || jstr_is(m, "isspace") || jstr_is(m, "isalpha")) {
        if (!s.u.s.n) return mkbool(false);
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char c = (unsigned char)s.u.s.p[i];
            bool ok = jstr_is(m, "isdigit") ? is_digit((char)c)
                      : jstr_is(m, "isspace") ? py_space(c)
                                              : (is_name0((char)c) && c != '_');
            if (!ok) return mkbool(false);
        }
        return mkbool(true);
    }
    *found = false;
    return mknone();
}

static jv dict_items(render *R, jdict *d) {
    jlist *l = list_new(R, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jlist *p = list_new(R, 2);
        list_push(R, p, d->k[i]);
        list_push(R, p, d->v[i]);
        p->tuple = true;
        list_push(R, l, mklist(p));
    }
    return mklist(l);
}

static jv eval_call(render *R, const jnode *n) {
    /* methods: obj.name(...) */
    if (n->a->kind == E_ATTR) {
        jv obj = eval(R, n->a->a);
        jstr m = n->a->name;
        args a = eval_args(R, n, 0);
        bool found = false;
        if (obj.t == JV_STR) {
            jv r = str_method(R, obj, m, &a, n->line, &found);
            if (found) return r;
        } else if (obj.t == JV_DICT && obj.u.d->kind == JD_DICT) {
            if (jstr_is(m, "items")) return dict_items(R, obj.u.d);
            if (jstr_is(m, "keys") || jstr_is(m, "values")) {
                jlist *l = list_new(R, obj.u.d->n);
                for (size_t i = 0; i < obj.u.d->n; i++)
                    list_push(R, l, jstr_is(m, "keys") ? obj.u.d->k[i] : obj.u.d->v[i]);
                return mklist(l);
            }
            if (jstr_is(m, "get")) {
                const jv *k = arg(&a, 0, "key"), *d = arg(&a, 1, "default");
                if (!k) rerr(R, n->line, "get expects a key");
                jv *v = dict_find(obj.u.d, k);
                return v ? *v : d ? *d : mknone();
            }
        } else if (obj.t == JV_DICT && obj.u.d->kind == JD_LOOP && jstr_is(m, "cycle")) {
            if (!a.n_pos) rerr(R, n->line, "loop.cycle expects arguments");
            jv *i0 = dict_find_z(obj.u.d, "index0", 6);
            return a.pos[(size_t)i0->u.i % a.n_pos];
        } else if (obj.t == JV_UNDEF)
            undefined_err(R, n->line, &obj);
        jv key = mkstr(m.p, m.n);
        jv fn = get_item(R, &obj, &key, n->line);
        if (fn.t == JV_MACRO || fn.t == JV_FUNC) return call_value(R, &fn, &a, n->line);
        rerr(R, n->line, "a %s value has no method '%.*s'", type_name(&obj), (int)(m.n > 40 ? 40 : m.n), m.p);
    }
    jv fn = eval(R, n->a);
    args a = eval_args(R, n, 0);
    return call_value(R, &fn, &a, n->line);
}

/* caller: the body of a {% call %} block, as a macro value (NULL: none);
 * link: the frame lookup goes on at after the macro's own (0 for a macro,
 * the call site's for a call block's body) */
static jv call_macro(render *R, const jnode *m, const args *a, int line, const jv *caller, long link) {
    if (++R->calls > JMAX_CALLS) rerr(R, line, "macro calls nested deeper than %d", JMAX_CALLS);
    if (a->n_pos > m->n_names)
        rerr(R, line, "macro '%.*s' takes %zu arguments, %zu given", (int)m->name.n, m->name.p, m->n_names, a->n_pos);
    push_frame(R, link);
    if (caller) assign(R, (jstr){"caller", 6}, *caller); /* renders the block where it was written */
    for (size_t i = 0; i < m->n_names; i++) {
        const jv *v = i < a->n_pos ? &a->pos[i] : NULL;
        for (size_t k = 0; !v && k < a->n_kw; k++)
            if (a->kw[k].n == m->names[i].n && !memcmp(a->kw[k].p, m->names[i].p, a->kw[k].n)) v = &a->kwv[k];
        jv val = v ? *v : m->kids[i] ? eval(R, m->kids[i]) : mkundef(m->names[i]);
        assign(R, m->names[i], val);
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->n_names; i++)
            known |= a->kw[k].n == m->names[i].n && !memcmp(a->kw[k].p, m->names[i].p, a->kw[k].n);
        if (!known)
            rerr(R, line, "macro '%.*s' has no argument '%.*s'", (int)m->name.n, m->name.p, (int)a->kw[k].n, a->kw[k].p);
    }
    size_t mark = R->n_out;
    int brk = R->brk;
    R->brk = 0;
    exec(R, m->a);
    R->brk = brk;
    jv r = R->n_out > mark ? str_copy(R, R->out + mark, R->n_out - mark) : mkstr("", 0);
    R->n_out = mark;
    R->n_frames--;
    R->calls--;
    return r;
}

static jv call_value(render *R, const jv *fn, const args *a, int line) {
    if (fn->t == JV_MACRO) return call_macro(R, fn->u.mac.m, a, line, NULL, fn->u.mac.link);
    if (fn->t == JV_UNDEF) undefined_err(R, line, fn);
    if (fn->t != JV_FUNC) rerr(R, line, "a %s value cannot be called", type_name(fn));
    switch (fn->u.fn) {
    case JF_RAISE: {
        const jv *m = arg(a, 0, "message");
        sbuf b = {R, 0, 0, 0};
        if (m) to_text(&b, m);
        snprintf(R->err, sizeof R->err, "template line %d: raise_exception: %.*s", line,
                 (int)(b.n > 400 ? 400 : b.n), b.p ? b.p : "");
        R->st = OG_ERR_INVALID_ARGUMENT;
        longjmp(R->jb, 1);
    }
    case JF_NAMESPACE: {
        jdict *d = dict_new(R, JD_NAMESPACE);
        for (size_t i = 0; i < a->n_pos; i++) {
            if (a->pos[i].t != JV_DICT) rerr(R, line, "namespace() takes a dict or keyword arguments");
            for (size_t k = 0; k < a->pos[i].u.d->n; k++) dict_set(R, d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
        }
        for (size_t k = 0; k < a->n_kw; k++) dict_set(R, d, mkstr(a->kw[k].p, a->kw[k].n), a->kwv[k]);
        return (jv){.t = JV_DICT, .u.d = d};
    }
    case JF_DICT: {
        jdict *d = dict_new(R, JD_DICT);
        for (size_t k = 0; k < a->n_kw; k++) dict_set(R, d, mkstr(a->kw[k].p, a->kw[k].n), a->kwv[k]);
        return (jv){.t = JV_DICT, .u.d = d};
    }
    case JF_RANGE: {
        int64_t lo = 0, hi, st = 1;
        if (a->n_pos == 1) hi = need_int(R, &a->pos[0], "range", line);
        else if (a->n_pos == 2 || a->n_pos == 3) {
            lo = need_int(R, &a->pos[0], "range", line);
            hi = need_int(R, &a->pos[1], "range", line);
            if (a->n_pos == 3) st = need_int(R, &a->pos[2], "range", line);
        } else
            rerr(R, line, "range expects 1 to 3 arguments");
        if (st == 0) rerr(R, line, "range step cannot be zero");
        jlist *l = list_new(R, 4);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
            step(R, line);
            list_push(R, l, mkint(i));
            if ((st > 0 && i > INT64_MAX - st) || (st < 0 && i < INT64_MIN - st)) break;
        }
        return mklist(l);
    }
    case JF_STRFTIME: {
        jv f = need_str(R, arg(a, 0, "format"), "strftime_now", line);
        char fmt[256], buf[512];
        if (f.u.s.n >= sizeof fmt) rerr(R, line, "strftime_now: the format is too long");
        memcpy(fmt, f.u.s.p, f.u.s.n);
        fmt[f.u.s.n] = 0;
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t k = strftime(buf, sizeof buf, fmt, &tmv);
        return str_copy(R, buf, k);
    }
    }
    rerr(R, line, "an unknown function");
}

static jv eval_bin(render *R, const jnode *n) {
    jop op = (jop)n->op;
    jv a = eval(R, n->a), b = eval(R, n->b);
    int line = n->line;
    switch (op) {
    case OP_CONCAT: {
        sbuf s = {R, 0, 0, 0};
        to_text(&s, &a);
        to_text(&s, &b);
        return sb_val(&s);
    }
    case OP_EQ: return mkbool(jv_eq(&a, &b));
    case OP_NE: return mkbool(!jv_eq(&a, &b));
    case OP_IN:
    case OP_NOTIN: {
        bool r;
        if (b.t == JV_STR) {
            if (a.t != JV_STR) rerr(R, line, "'in <string>' needs a string on the left, not %s", type_name(&a));
            r = find_sub(b.u.s.p, b.u.s.n, a.u.s.p, a.u.s.n) != NULL;
        } else if (b.t == JV_LIST) {
            r = false;
            for (size_t i = 0; i < b.u.l->n && !r; i++) r = jv_eq(&a, &b.u.l->v[i]);
        } else if (b.t == JV_DICT) {
            r = dict_find(b.u.d, &a) != NULL;
        } else if (b.t == JV_UNDEF) {
            r = false;
        } else
            rerr(R, line, "'in' needs a string, list or dict on the right, not %s", type_name(&b));
        return mkbool(op == OP_IN ? r : !r);
    }
    default: break;
    }
    if (a.t == JV_UNDEF) undefined_err(R, line, &a);
    if (b.t == JV_UNDEF) undefined_err(R, line, &b);
    if (op >= OP_LT && op <= OP_GE) {
        int c;
        if (is_num(&a) && is_num(&b)) {
            double x = num_f(&a), y = num_f(&b);
            if (a.t != JV_FLOAT && b.t != JV_FLOAT) c = num_i(&a) < num_i(&b) ? -1 : num_i(&a) > num_i(&b);
            else c = x < y ? -1 : x > y ? 1 : 0;
            if (isnan(x) || isnan(y)) return mkbool(false);
        } else if (a.t == JV_STR && b.t == JV_STR) {
            size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
            c = m ? memcmp(a.u.s.p, b.u.s.p, m) : 0;
            if (!c) c = a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        } else
            rerr(R, line, "cannot compare %s with %s", type_name(&a), type_name(&b));
        bool r = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
        return mkbool(r);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        if (!a.u.s.n) return b;
        if (!b.u.s.n) return a;
        char *o = ralloc(R, a.u.s.n + b.u.s.n + 1);
        memcpy(o, a.u.s.p, a.u.s.n);
        memcpy(o + a.u.s.n, b.u.s.p, b.u.s.n);
        o[a.u.s.n + b.u.s.n] = 0;
        return mkstr(o, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jlist *l = list_new(R, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(R, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(R, l, b.u.l->v[i]);
        return mklist(l);
    }
    if (op == OP_MUL && ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))) {
        int64_t k = num_i(&b);
        if (a.t == JV_STR) {
            sbuf s = {R, 0, 0, 0};
            for (int64_t i = 0; i < k; i++) {
                step(R, line);
                sb_put(&s, a.u.s.p, a.u.s.n);
            }
            return sb_val(&s);
        }
        jlist *l = list_new(R, 4);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < a.u.l->n; j++) {
                step(R, line);
                list_push(R, l, a.u.l->v[j]);
            }
        return mklist(l);
    }
    if (!is_num(&a) || !is_num(&b)) {
        static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
        rerr(R, line, "unsupported operand types for %s: %s and %s", names[op], type_name(&a), type_name(&b));
    }
    if (a.t != JV_FLOAT && b.t != JV_FLOAT && op != OP_DIV) {
        int64_t x = num_i(&a), y = num_i(&b), r;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; return mkint(r);
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; return mkint(r);
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; return mkint(r);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) rerr(R, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return mkint(op == OP_FLOORDIV ? q : m);
        }
        case OP_POW: {
            if (y < 0) return mkfloat(pow((double)x, (double)y));
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r)) goto overflow;
                if (r == 0 || r == 1) break;
            }
            if (r == -1 || (r == 1 && x == -1)) r = (y % 2) ? -1 : 1;
            return mkint(r);
        }
        default: break;
        }
    }
    {
        double x = num_f(&a), y = num_f(&b);
        switch (op) {
        case OP_ADD: return mkfloat(x + y);
        case OP_SUB: return mkfloat(x - y);
        case OP_MUL: return mkfloat(x * y);
        case OP_DIV:
            if (y == 0) rerr(R, line, "division by zero");
            return mkfloat(x / y);
        case OP_FLOORDIV:
            if (y == 0) rerr(R, line, "float floor division by zero");
            return mkfloat(floor(x / y));
        case OP_MOD: {
            if (y == 0) rerr(R, line, "float modulo by zero");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return mkfloat(m);
        }
        case OP_POW: return mkfloat(pow(x, y));
        default: break;
        }
    }
overflow:
    rerr(R, line, "integer overflow");
}

static jv eval_node(render *R, const jnode *n);

static jv eval(render *R, const jnode *n) {
    if (++R->depth > JMAX_RDEPTH) rerr(R, n->line, "rendering nests deeper than %d", JMAX_RDEPTH);
    jv v = eval_node(R, n);
    R->depth--;
    return v;
}

static jv eval_node(render *R, const jnode *n) {
    step(R, n->line);
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(R, n->name);
    case E_ATTR: {
        jv obj = eval(R, n->a);
        jv key = mkstr(n->name.p, n->name.n);
        return get_item(R, &obj, &key, n->line);
    }
    case E_ITEM: {
        jv obj = eval(R, n->a);
        jv key = eval(R, n->b);
        return get_item(R, &obj, &key, n->line);
    }
    case E_SLICE: return eval_slice(R, n);
    case E_CALL: return eval_call(R, n);
    case E_FILTER: {
        jv v = eval(R, n->a);
        args a = eval_args(R, n, 0);
        return apply_filter(R, n->name, &v, &a, n->line);
    }
    case E_TEST: {
        jv v = eval(R, n->a);
        args a = eval_args(R, n, 0);
        bool r = apply_test(R, n->name, &v, &a, n->line);
        return mkbool(n->op ? !r : r);
    }
    case E_NOT: {
        jv v = eval(R, n->a);
        return mkbool(!truthy(&v));
    }
    case E_NEG:
    case E_POS: {
        jv v = eval(R, n->a);
        if (v.t == JV_FLOAT) return mkfloat(n->kind == E_NEG ? -v.u.f : v.u.f);
        if (v.t == JV_INT || v.t == JV_BOOL) {
            int64_t i = num_i(&v);
            if (n->kind == E_NEG && i == INT64_MIN) rerr(R, n->line, "integer overflow");
            return mkint(n->kind == E_NEG ? -i : i);
        }
        if (v.t == JV_UNDEF) undefined_err(R, n->line, &v);
        rerr(R, n->line, "bad operand type for unary %c: %s", n->kind == E_NEG ? '-' : '+', type_name(&v));
    }
    case E_BIN: return eval_bin(R, n);
    case E_AND: {
        jv a = eval(R, n->a);
        return truthy(&a) ? eval(R, n->b) : a;
    }
    case E_OR: {
        jv a = eval(R, n->a);
        return truthy(&a) ? a : eval(R, n->b);
    }
    case E_COND: {
        jv c = eval(R, n->b);
        if (truthy(&c)) return eval(R, n->a);
        return n->c ? eval(R, n->c) : mkundef((jstr){0});
    }
    case E_LIST: {
        jlist *l = list_new(R, n->n_kids);
        for (size_t i = 0; i < n->n_kids; i++) list_push(R, l, eval(R, n->kids[i]));
        l->tuple = n->op == 1;
        return mklist(l);
    }
    case E_DICT: {
        jdict *d = dict_new(R, JD_DICT);
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            jv k = eval(R, n->kids[i]);
            dict_set(R, d, k, eval(R, n->kids[i + 1]));
        }
        return (jv){.t = JV_DICT, .u.d = d};
    }
    default: break;
    }
    rerr(R, n->line, "internal error: not an expression");
}

/* ---- filters and tests ---- */

/* The items of an iterable (list; string: characters; dict: keys). */
static jlist *iter_items(render *R, const jv *v, int line, const char *what) {
    if (v->t == JV_LIST) return v->u.l;
    jlist *l = list_new(R, 4);
    if (v->t == JV_UNDEF) return l;
    if (v->t == JV_STR) {
        size_t nc;
        size_t *o = cp_offsets(R, v->u.s.p, v->u.s.n, &nc);
        for (size_t i = 0; i < nc; i++) list_push(R, l, mkstr(v->u.s.p + o[i], o[i + 1] - o[i]));
        return l;
    }
    if (v->t == JV_DICT && v->u.d->kind == JD_DICT) {
        for (size_t i = 0; i < v->u.d->n; i++) list_push(R, l, v->u.d->k[i]);
        return l;
    }
    rerr(R, line, "%s: a %s value is not iterable", what, type_name(v));
}

/* attribute path "a.b" of v */
static jv attr_path(render *R, const jv *v, jv path, int line) {
    jv cur_ = *v;
    size_t i = 0;
    while (i <= path.u.s.n) {
        size_t j = i;
        while (j < path.u.s.n && path.u.s.p[j] != '.') j++;
        jv key = mkstr(path.u.s.p + i, j - i);
        bool digits = j > i;
        for (size_t q = i; q < j; q++) digits &= is_digit(path.u.s.p[q]);
        if (digits && cur_.t == JV_LIST) key = mkint(strtoll(path.u.s.p + i, NULL, 10));
        if (cur_.t == JV_UNDEF) return cur_;
        cur_ = get_item(R, &cur_, &key, line);
        i = j + 1;
    }
    return cur_;
}

/* Python's ordering of two values (numbers, strings, None before nothing
 * else is an error); strings lowered first unless case_sensitive. */
static int cmp_values(render *R, const jv *a, const jv *b, bool case_sensitive, int line) {
    step(R, line);
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) return num_i(a) < num_i(b) ? -1 : num_i(a) > num_i(b);
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        jv x = *a, y = *b;
        if (!case_sensitive) {
            x = map_case(R, x, utf8proc_tolower, 0);
            y = map_case(R, y, utf8proc_tolower, 0);
        }
        size_t m = x.u.s.n < y.u.s.n ? x.u.s.n : y.u.s.n;
        int c = m ? memcmp(x.u.s.p, y.u.s.p, m) : 0;
        return c ? (c < 0 ? -1 : 1) : x.u.s.n < y.u.s.n ? -1 : x.u.s.n > y.u.s.n;
    }
    if (a->t == b->t && (a->t == JV_NONE || a->t == JV_UNDEF)) return 0;
    rerr(R, line, "cannot order %s and %s", type_name(a), type_name(b));
}

/* Sorts idx[n] (integer positions) by keys[position], stably (merge sort). */
static void sort_values(render *R, jv *idx, size_t n, const jv *keys, bool reverse, bool case_sensitive, int line) {
    if (n < 2) return;
    jv *tmp = ralloc(R, n * sizeof *tmp);
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = cmp_values(R, &keys[idx[j].u.i], &keys[idx[i].u.i], case_sensitive, line);
                /* take from the right only when strictly before: stable */
                tmp[k++] = (reverse ? c > 0 : c < 0) ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

static jv apply_filter(render *R, jstr name, const jv *v, const args *a, int line) {
#define F(z) jstr_is(name, z)
    if (F("safe") || (F("string") && v->t == JV_STR)) return *v;
    if (F("string")) return text_of(R, v);
    if (F("trim")) {
        jv s = text_of(R, v);
        return strip(R, s, chars_arg(R, a, "trim", line), 3);
    }
    if (F("length") || F("count")) {
        switch (v->t) {
        case JV_STR: return mkint((int64_t)cp_count(v->u.s.p, v->u.s.n));
        case JV_LIST: return mkint((int64_t)v->u.l->n);
        case JV_DICT: return mkint((int64_t)v->u.d->n);
        case JV_UNDEF: return mkint(0);
        default: rerr(R, line, "length: a %s value has no length", type_name(v));
        }
    }
    if (F("tojson")) { /* transformers': json.dumps(x, ensure_ascii, indent, separators, sort_keys) */
        const jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
                 *sk = arg(a, 3, "sort_keys");
        jsonopt o = {.indent = -1, .ensure_ascii = ea && truthy(ea), .sort_keys = sk && truthy(sk)};
        if (ind && ind->t != JV_NONE) {
            o.indent = (int)need_int(R, ind, "tojson indent", line);
            if (o.indent < 0) o.indent = 0;
            if (o.indent > 64) rerr(R, line, "tojson: indent above 64");
        }
        o.item_sep = o.indent >= 0 ? mkstr(",", 1) : mkstr(", ", 2);
        o.key_sep = mkstr(": ", 2);
        if (sep && sep->t != JV_NONE) {
            if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
                rerr(R, line, "tojson: separators must be two strings");
            o.item_sep = sep->u.l->v[0];
            o.key_sep = sep->u.l->v[1];
        }
        sbuf b = {R, 0, 0, 0};
        to_json(R, &b, v, &o, 0, line);
        return sb_val(&b);
    }
    if (F("sort")) { /* sort(reverse=false, case_sensitive=false, attribute=none) */
        const jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *at = arg(a, 2, "attribute");
        jlist *src = iter_items(R, v, line, "sort");
        jlist *l = list_new(R, src->n);
        for (size_t i = 0; i < src->n; i++) list_push(R, l, src->v[i]);
        jv *keys = l->v;
        if (at && at->t != JV_NONE) {
            jv path = need_str(R, at, "sort attribute", line);
            keys = ralloc(R, (l->n + 1) * sizeof *keys);
            for (size_t i = 0; i < l->n; i++) keys[i] = attr_path(R, &l->v[i], path, line);
        }
        jv *idx = ralloc(R, (l->n + 1) * sizeof *idx);
        for (size_t i = 0; i < l->n; i++) idx[i] = mkint((int64_t)i);
        sort_values(R, idx, l->n, keys, rev && truthy(rev), cs && truthy(cs), line);
        jlist *out = list_new(R, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(R, out, l->v[idx[i].u.i]);
        return mklist(out);
    }
    if (F("dictsort")) { /* dictsort(case_sensitive=false, by='key', reverse=false) */
        const jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
        if (v->t != JV_DICT) rerr(R, line, "dictsort: expects a dict, not %s", type_name(v));
        bool by_value = by && by->t == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5);
        jv items = dict_items(R, v->u.d);
        jlist *l = items.u.l;
        jv *keys = ralloc(R, (l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < l->n; i++) keys[i] = l->v[i].u.l->v[by_value ? 1 : 0];
        jv *idx = ralloc(R, (l->n + 1) * sizeof *idx);
        for (size_t i = 0; i < l->n; i++) idx[i] = mkint((int64_t)i);
        sort_values(R, idx, l->n, keys, rev && truthy(rev), cs && truthy(cs), line);
        jlist *out = list_new(R, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(R, out, l->v[idx[i].u.i]);
        return mklist(out);
    }
    if (F("first") || F("last")) {
        if (v->t == JV_STR && v->u.s.n) {
            size_t nc;
            size_t *o = cp_offsets(R, v->u.s.p, v->u.s.n, &nc);
            size_t i = F("first") ? 0 : nc - 1;
            return mkstr(v->u.s.p + o[i], o[i + 1] - o[i]);
        }
        jlist *l = iter_items(R, v, line, "first");
        if (!l->n) return mkundef((jstr){0});
        return F("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (F("join")) {
        const jv *sep = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        jlist *l = iter_items(R, v, line, "join");
        sbuf b = {R, 0, 0, 0};
        for (size_t i = 0; i < l->n; i++) {
            if (i && sep) to_text(&b, sep);
            jv item = at ? attr_path(R, &l->v[i], need_str(R, at, "join attribute", line), line) : l->v[i];
            to_text(&b, &item);
        }
        return sb_val(&b);
    }
    if (F("default") || F("d")) {
        const jv *dv = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        bool use = v->t == JV_UNDEF || (boolean && truthy(boolean) && !truthy(v));
        if (use) return dv ? *dv : mkstr("", 0);
        return *v;
    }
    if (F("upper") || F("lower") || F("capitalize") || F("title")) {
        jv s = text_of(R, v);
        if (F("upper")) return map_case(R, s, utf8proc_toupper, 0);
        if (F("lower")) return map_case(R, s, utf8proc_tolower, 0);
        return map_case(R, s, NULL, F("capitalize") ? 1 : 2);
    }
    if (F("replace")) {
        jv s = text_of(R, v);
        const jv *o = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *c = arg(a, 2, "count");
        if (!o || !nw) rerr(R, line, "replace expects two arguments");
        return replace(R, s, text_of(R, o), text_of(R, nw), c && c->t != JV_NONE ? need_int(R, c, "replace", line) : -1, line);
    }
    if (F("list")) {
        jlist *src = iter_items(R, v, line, "list");
        jlist *l = list_new(R, src->n);
        for (size_t i = 0; i < src->n; i++) list_push(R, l, src->v[i]);
        return mklist(l);
    }
    if (F("reverse")) {
        if (v->t == JV_STR) {
            size_t nc;
            size_t *o = cp_offsets(R, v->u.s.p, v->u.s.n, &nc);
            sbuf b = {R, 0, 0, 0};
            for (size_t i = nc; i-- > 0;) sb_put(&b, v->u.s.p + o[i], o[i + 1] - o[i]);
            return sb_val(&b);
        }
        jlist *src = iter_items(R, v, line, "reverse");
        jlist *l = list_new(R, src->n);
        for (size_t i = src->n; i-- > 0;) list_push(R, l, src->v[i]);
        return mklist(l);
    }
    if (F("items")) {
        if (v->t == JV_UNDEF) return mklist(list_new(R, 1));
        if (v->t != JV_DICT) rerr(R, line, "items: expects a dict, not %s", type_name(v));
        return dict_items(R, v->u.d);
    }
    if (F("int")) {
        const jv *dv = arg(a, 0, "default");
        jv def = dv ? *dv : mkint(0);
        if (v->t == JV_INT) return *v;
        if (v->t == JV_BOOL) return mkint(v->u.b);
        if (v->t == JV_FLOAT) {
            if (!isfinite(v->u.f) || fabs(v->u.f) >= 9.2e18) return def;
            return mkint((int64_t)v->u.f);
        }
        if (v->t == JV_STR) {
            char buf[64];
            size_t n = v->u.s.n < sizeof buf - 1 ? v->u.s.n : sizeof buf - 1;
            memcpy(buf, v->u.s.p, n);
            buf[n] = 0;
            char *end;
            errno = 0;
            long long x = strtoll(buf, &end, 10);
            while (*end && py_space((unsigned char)*end)) end++;
            if (!errno && end != buf && !*end && n == v->u.s.n) return mkint(x);
            double f = strtod(buf, &end);
            while (*end && py_space((unsigned char)*end)) end++;
            if (end != buf && !*end && isfinite(f) && fabs(f) < 9.2e18 && n == v->u.s.n) return mkint((int64_t)f);
        }
        return def;
    }
    if (F("float")) {
        const jv *dv = arg(a, 0, "default");
        if (is_num(v)) return mkfloat(num_f(v));
        if (v->t == JV_STR) {
            char buf[64];
            size_t n = v->u.s.n < sizeof buf - 1 ? v->u.s.n : sizeof buf - 1;
            memcpy(buf, v->u.s.p, n);
            buf[n] = 0;
            char *end;
            double f = strtod(buf, &end);
            if (end != buf && !*end && n == v->u.s.n) return mkfloat(f);
        }
        return dv ? *dv : mkfloat(0.0);
    }
    if (F("abs")) {
        if (v->t == JV_FLOAT) return mkfloat(fabs(v->u.f));
        if (v->t == JV_INT && v->u.i != INT64_MIN) return mkint(v->u.i < 0 ? -v->u.i : v->u.i);
        rerr(R, line, "abs: expects a number, not %s", type_name(v));
    }
    if (F("map")) {
        jlist *src = iter_items(R, v, line, "map");
        jlist *l = list_new(R, src->n);
        const jv *at = NULL;
        for (size_t k = 0; k < a->n_kw; k++)
            if (jstr_is(a->kw[k], "attribute")) at = &a->kwv[k];
        if (at) {
            const jv *dv = NULL;
            for (size_t k = 0; k < a->n_kw; k++)
                if (jstr_is(a->kw[k], "default")) dv = &a->kwv[k];
            jv path = need_str(R, at, "map attribute", line);
            for (size_t i = 0; i < src->n; i++) {
                jv x = attr_path(R, &src->v[i], path, line);
                list_push(R, l, x.t == JV_UNDEF && dv ? *dv : x);
            }
            return mklist(l);
        }
        if (!a->n_pos) rerr(R, line, "map expects a filter name or attribute=");
        jv fname = need_str(R, &a->pos[0], "map", line);
        args rest = *a;
        rest.pos++;
        rest.n_pos--;
        for (size_t i = 0; i < src->n; i++)
            list_push(R, l, apply_filter(R, (jstr){fname.u.s.p, fname.u.s.n}, &src->v[i], &rest, line));
        return mklist(l);
    }
    if (F("selectattr") || F("rejectattr") || F("select") || F("reject")) {
        bool by_attr = F("selectattr") || F("rejectattr");
        bool keep = F("selectattr") || F("select");
        jlist *src = iter_items(R, v, line, "select");
        jlist *l = list_new(R, src->n);
        size_t k0 = by_attr ? 1 : 0;
        jv path = mkstr("", 0);
        if (by_attr) path = need_str(R, a->n_pos ? &a->pos[0] : NULL, "selectattr", line);
        jv tname = mkstr("", 0);
        bool has_test = a->n_pos > k0;
        if (has_test) tname = need_str(R, &a->pos[k0], "select test", line);
        args rest = *a;
        rest.pos += has_test ? k0 + 1 : k0;
        rest.n_pos -= has_test ? k0 + 1 : k0;
        for (size_t i = 0; i < src->n; i++) {
            jv x = by_attr ? attr_path(R, &src->v[i], path, line) : src->v[i];
            bool r = has_test ? apply_test(R, (jstr){tname.u.s.p, tname.u.s.n}, &x, &rest, line) : truthy(&x);
            if (r == keep) list_push(R, l, src->v[i]);
        }
        return mklist(l);
    }
    if (F("unique")) {
        jlist *src = iter_items(R, v, line, "unique");
        jlist *l = list_new(R, src->n);
        for (size_t i = 0; i < src->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < l->n && !seen; j++) {
                step(R, line);
                seen = jv_eq(&l->v[j], &src->v[i]);
            }
            if (!seen) list_push(R, l, src->v[i]);
        }
        return mklist(l);
    }
    if (F("indent")) {
        jv s = text_of(R, v);
        const jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
        sbuf pad = {R, 0, 0, 0};
        if (w && w->t == JV_STR) sb_put(&pad, w->u.s.p, w->u.s.n);
        else {
            int64_t k = w ? need_int(R, w, "indent", line) : 4;
            for (int64_t i = 0; i < k && i < 256; i++) sb_c(&pad, ' ');
        }
        sbuf b = {R, 0, 0, 0};
        size_t i = 0;
        bool first_line = true;
        while (i <= s.u.s.n) {
            size_t j = i;
            while (j < s.u.s.n && s.u.s.p[j] != '\n') j++;
            bool empty = j == i;
            if ((first_line ? (first && truthy(first)) : true) && (!empty || (blank && truthy(blank))) && pad.n)
                sb_put(&b, pad.p, pad.n);
            sb_put(&b, s.u.s.p + i, j - i);
            if (j < s.u.s.n) sb_c(&b, '\n');
            first_line = false;
            i = j + 1;
        }
        return sb_val(&b);
    }
#undef F
    rerr(R, line, "unknown filter '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
}

static bool apply_test(render *R, jstr name, const jv *v, const args *a, int line) {
#define T(z) jstr_is(name, z)
    const jv *x = arg(a, 0, "value");
    if (T("defined")) return v->t != JV_UNDEF;
    if (T("undefined")) return v->t == JV_UNDEF;
    if (T("none")) return v->t == JV_NONE;
    if (T("string")) return v->t == JV_STR;
    if (T("number")) return is_num(v);
    if (T("integer")) return v->t == JV_INT;
    if (T("float")) return v->t == JV_FLOAT;
    if (T("boolean")) return v->t == JV_BOOL;
    if (T("true")) return v->t == JV_BOOL && v->u.b;
    if (T("false")) return v->t == JV_BOOL && !v->u.b;
    if (T("mapping")) return v->t == JV_DICT && v->u.d->kind == JD_DICT;
    if (T("iterable")) return v->t == JV_STR || v->t == JV_LIST || (v->t == JV_DICT && v->u.d->kind == JD_DICT) || v->t == JV_UNDEF;
    if (T("sequence")) return v->t == JV_STR || v->t == JV_LIST || (v->t == JV_DICT && v->u.d->kind == JD_DICT);
    if (T("callable")) return v->t == JV_MACRO || v->t == JV_FUNC;
    if (T("odd") || T("even")) {
        int64_t i = need_int(R, v, T("odd") ? "odd" : "even", line);
        return T("odd") ? (i % 2 != 0) : (i % 2 == 0);
    }
    if (T("divisibleby")) {
        int64_t i = need_int(R, v, "divisibleby", line), d = need_int(R, x, "divisibleby", line);
        if (d == 0) rerr(R, line, "divisibleby 0");
        return d == -1 || i % d == 0;
    }
    if (T("lower") || T("upper")) {
        if (v->t != JV_STR) return false;
        jv m = map_case(R, *v, T("lower") ? utf8proc_tolower : utf8proc_toupper, 0);
        return jv_eq(&m, v);
    }
    if (T("sameas")) {
        if (!x) rerr(R, line, "sameas expects a value");
        if (v->t != x->t) return false;
        if (v->t == JV_LIST) return v->u.l == x->u.l;
        if (v->t == JV_DICT) return v->u.d == x->u.d;
        return jv_eq(v, x);
    }
    if (T("eq") || T("equalto") || T("==") || T("ne") || T("!=") || T("lt") || T("<") || T("le") || T("<=") ||
        T("gt") || T(">") || T("ge") || T(">=") || T("in")) {
        if (!x) rerr(R, line, "the test '%.*s' expects a value", (int)name.n, name.p);
        jop op = T("eq") || T("equalto") || T("==") ? OP_EQ
                 : T("ne") || T("!=")               ? OP_NE
                 : T("lt") || T("<")                ? OP_LT
                 : T("le") || T("<=")               ? OP_LE
                 : T("gt") || T(">")                ? OP_GT
                 : T("ge") || T(">=")               ? OP_GE
                                                    : OP_IN;
        /* evaluate through a tiny tree of literals */
        jnode la = {.kind = E_LIT, .line = line, .lit = *v}, lb = {.kind = E_LIT, .line = line, .lit = *x};
        jnode b = {.kind = E_BIN, .line = line, .op = (int)op, .a = &la, .b = &lb};
        jv r = eval_bin(R, &b);
        return truthy(&r);
    }
#undef T
    rerr(R, line, "unknown test '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
}

/* ---- statements ---- */

static void emit(render *R, const char *p, size_t n, int line) {
    if (!n) return;
    if (n > R->lim.max_output || R->n_out > R->lim.max_output - n)
        rerr(R, line, "the output is longer than %zu bytes", R->lim.max_output);
    if (R->cap_out - R->n_out < n + 1) {
        size_t cap = R->cap_out ? R->cap_out : 4096;
        while (cap - R->n_out < n + 1) cap *= 2;
        char *o = og_realloc(R->out, cap);
        if (!o) room(R);
        R->out = o;
        R->cap_out = cap;
    }
    memcpy(R->out + R->n_out, p, n);
    R->n_out += n;
}

static void exec_for(render *R, const jnode *n) {
    jv it = eval(R, n->a);
    jlist *items;
    if (it.t == JV_DICT && it.u.d->kind == JD_DICT) items = iter_items(R, &it, n->line, "for");
    else if (it.t == JV_LIST || it.t == JV_STR || it.t == JV_UNDEF) items = iter_items(R, &it, n->line, "for");
    else if (it.t == JV_NONE) rerr(R, n->line, "'NoneType' object is not iterable");
    else rerr(R, n->line, "a %s value is not iterable", type_name(&it));
    /* the loop's own filter runs first, with the loop variables bound */
    if (n->b) {
        jlist *kept = list_new(R, items->n);
        for (size_t i = 0; i < items->n; i++) {
            push_frame(R, -1);
            if (n->n_names == 1) assign(R, n->names[0], items->v[i]);
            else {
                jv x = items->v[i];
                for (size_t k = 0; k < n->n_names; k++)
                    assign(R, n->names[k], x.t == JV_LIST && k < x.u.l->n ? x.u.l->v[k] : mkundef(n->names[k]));
            }
            jv c = eval(R, n->b);
            R->n_frames--;
            if (truthy(&c)) list_push(R, kept, items->v[i]);
        }
        items = kept;
    }
    size_t len = items->n;
    for (size_t i = 0; i < len; i++) {
        step(R, n->line);
        push_frame(R, -1);
        jv x = items->v[i];
        if (n->n_names == 1) assign(R, n->names[0], x);
        else {
            size_t have = x.t == JV_LIST ? x.u.l->n : 0;
            if (have != n->n_names)
                rerr(R, n->line, "cannot unpack %zu values into %zu names", have, n->n_names);
            for (size_t k = 0; k < n->n_names; k++) assign(R, n->names[k], x.u.l->v[k]);
        }
        jdict *loop = dict_new(R, JD_LOOP);
        dict_set_z(R, loop, "index", mkint((int64_t)i + 1));
        dict_set_z(R, loop, "index0", mkint((int64_t)i));
        dict_set_z(R, loop, "revindex", mkint((int64_t)(len - i)));
        dict_set_z(R, loop, "revindex0", mkint((int64_t)(len - i - 1)));
        dict_set_z(R, loop, "first", mkbool(i == 0));
        dict_set_z(R, loop, "last", mkbool(i + 1 == len));
        dict_set_z(R, loop, "length", mkint((int64_t)len));
        dict_set_z(R, loop, "depth", mkint(1));
        dict_set_z(R, loop, "depth0", mkint(0));
        if (i > 0) dict_set_z(R, loop, "previtem", items->v[i - 1]);
        if (i + 1 < len) dict_set_z(R, loop, "nextitem", items->v[i + 1]);
        assign(R, (jstr){"loop", 4}, (jv){.t = JV_DICT, .u.d = loop});
        exec(R, n->kids[0]);
        R->n_frames--;
        if (R->brk == 1) {
            R->brk = 0;
            break;
        }
        R->brk = 0;
    }
    if (len == 0 && n->c) exec(R, n->c);
}

static void exec_node(render *R, const jnode *n);

static void exec(render *R, const jnode *n) {
    if (++R->depth > JMAX_RDEPTH) rerr(R, n->line, "rendering nests deeper than %d", JMAX_RDEPTH);
    exec_node(R, n);
    R->depth--;
}

static void exec_node(render *R, const jnode *n) {
    step(R, n->line);
    switch (n->kind) {
    case N_BLOCK:
        for (size_t i = 0; i < n->n_kids && !R->brk; i++) exec(R, n->kids[i]);
        return;
    case N_TEXT: emit(R, n->lit.u.s.p, n->lit.u.s.n, n->line); return;
    case N_OUT: {
        jv v = eval(R, n->a);
        if (v.t == JV_STR) emit(R, v.u.s.p, v.u.s.n, n->line);
        else {
            jv s = text_of(R, &v);
            emit(R, s.u.s.p, s.u.s.n, n->line);
        }
        return;
    }
    case N_IF: {
        jv c = eval(R, n->a);
        if (truthy(&c)) exec(R, n->b);
        else if (n->c) exec(R, n->c);
        return;
    }
    case N_FOR: exec_for(R, n); return;
    case N_SET: {
        jv v = eval(R, n->a);
        if (n->n_names == 1) {
            assign(R, n->names[0], v);
            return;
        }
        if (v.t != JV_LIST || v.u.l->n != n->n_names)
            rerr(R, n->line, "cannot unpack a %s into %zu names", type_name(&v), n->n_names);
        for (size_t k = 0; k < n->n_names; k++) assign(R, n->names[k], v.u.l->v[k]);
        return;
    }
    case N_SET_ATTR: {
        jv ns = lookup(R, n->names[0]);
        if (ns.t != JV_DICT || ns.u.d->kind != JD_NAMESPACE)
            rerr(R, n->line, "cannot set attribute '%.*s' of '%.*s': not a namespace", (int)n->name.n, n->name.p,
                 (int)n->names[0].n, n->names[0].p);
        dict_set(R, ns.u.d, mkstr(n->name.p, n->name.n), eval(R, n->a));
        return;
    }
    case N_SET_BLOCK: {
        size_t mark = R->n_out;
        exec(R, n->a);
        jv s = R->n_out > mark ? str_copy(R, R->out + mark, R->n_out - mark) : mkstr("", 0);
        R->n_out = mark;
        assign(R, n->names[0], s);
        return;
    }
    case N_MACRO: assign(R, n->name, (jv){.t = JV_MACRO, .u.mac = {n, 0}}); return;
    case N_CALL_BLOCK: {
        jv fn = eval(R, n->a->a);
        if (fn.t != JV_MACRO) rerr(R, n->line, "{%% call %%} expects a macro, not %s", type_name(&fn));
        args a = eval_args(R, n->a, 0);
        /* the body sees its own arguments, then what is seen here */
        jv body = {.t = JV_MACRO, .u.mac = {n->b, (long)R->n_frames - 1}};
        jv out = call_macro(R, fn.u.mac.m, &a, n->line, &body, fn.u.mac.link);
        emit(R, out.u.s.p, out.u.s.n, n->line);
        return;
    }
    case N_BREAK:
    case N_CONTINUE: {
        /* only inside a loop: a loop frame is above the top level */
        if (R->n_frames <= 1 || R->frames[R->n_frames - 1].link >= 0)
            rerr(R, n->line, "'%s' outside a loop", n->kind == N_BREAK ? "break" : "continue");
        R->brk = n->kind == N_BREAK ? 1 : 2;
        return;
    }
    default: break;
    }
    rerr(R, n->line, "internal error: not a statement");
}

/* ---- entry point ---- */

static jv from_json(render *R, const cJSON *j, int level) {
    if (level > JMAX_DEPTH) rerr(R, 0, "a variable nested deeper than %d", JMAX_DEPTH);
    if (cJSON_IsNull(j)) return mknone();
    if (cJSON_IsBool(j)) return mkbool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (isfinite(d) && d == floor(d) && fabs(d) < 9.0e15) return mkint((int64_t)d);
        return mkfloat(d);
    }
    if (cJSON_IsString(j)) return mkstr(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        jlist *l = list_new(R, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next) list_push(R, l, from_json(R, c, level + 1));
        return mklist(l);
    }
    if (cJSON_IsObject(j)) {
        jdict *d = dict_new(R, JD_DICT);
        for (const cJSON *c = j->child; c; c = c->next)
            if (c->string) dict_set(R, d, mkstr(c->string, strlen(c->string)), from_json(R, c, level + 1));
        return (jv){.t = JV_DICT, .u.d = d};
    }
    return mkundef((jstr){0});
}

og_jinja_limits og_jinja_default_limits(void) {
    return (og_jinja_limits){.max_output = (size_t)16 << 20, .max_memory = (size_t)256 << 20, .max_steps = 50000000};
}

og_status og_jinja_render(const og_jinja *t, const cJSON *vars, const og_jinja_limits *limits, char **out,
                          size_t *out_len) {
    if (!t || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_jinja_render: NULL argument");
    if (vars && !cJSON_IsObject(vars))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_jinja_render: the variables must be a JSON object");
    *out = NULL;
    if (out_len) *out_len = 0;
    render *R = og_calloc(1, sizeof *R);
    if (!R) return og_set_error(OG_ERR_OUT_OF_MEMORY, "template: out of memory");
    R->lim = limits ? *limits : og_jinja_default_limits();
    R->mem.limit = R->lim.max_memory;
    if (setjmp(R->jb)) {
        og_status st = og_set_error(R->st, "%s", R->err);
        og_free(R->out);
        arena_free(&R->mem);
        og_free(R);
        return st;
    }
    push_frame(R, -1);
    if (vars)
        for (const cJSON *c = vars->child; c; c = c->next)
            if (c->string) dict_set(R, R->frames[0].vars, mkstr(c->string, strlen(c->string)), from_json(R, c, 0));
    exec(R, t->root);
    if (!R->out) {
        R->out = og_malloc(1);
        if (!R->out) room(R);
    }
    R->out[R->n_out] = 0;
    *out = R->out;
    if (out_len) *out_len = R->n_out;
    arena_free(&R->mem);
    og_free(R);
    return OG_OK;
}
