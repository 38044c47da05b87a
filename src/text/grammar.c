/* GBNF grammars and the token matcher (text/grammar.h).
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an
 * alternative is a run of elements ended by E_END. An element matches one
 * byte of a set (E_BYTES) or a whole rule (E_REF). Groups, repetitions and
 * classes of non-ASCII code points become rules of their own while parsing,
 * so the matcher only knows bytes and references.
 *
 * The matcher keeps a set of stacks. A stack is a node (pos: the element it
 * waits on, always an E_BYTES; parent: the node to go back to when pos's
 * rule ends, -1 at root), interned so that equal stacks are one id and a
 * set of stacks is a sorted list of ids; the sets are interned too, as
 * states. A state has a lazily filled table of its 256 byte transitions and
 * a lazily computed token mask. */
#include "text/grammar.h"

#include "core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E_END = 0, E_BYTES = 1, E_REF = 2 };

typedef struct gelem {
    int32_t kind, arg; /* E_BYTES: index of its byte set; E_REF: rule id */
} gelem;

struct og_grammar {
    gelem *el;            /* [n_el] every rule's alternatives, end to end */
    int32_t n_el;
    uint32_t (*sets)[8];  /* [n_sets] 256-bit byte sets */
    int32_t n_sets;
    int32_t *alt;         /* [n_alt] start element of each alternative, by rule */
    int32_t *rule_alt;    /* [n_rules + 1] rule r's alternatives: alt[rule_alt[r] .. rule_alt[r+1]) */
    int32_t n_rules, root;
};

/* ================================================================ building */

typedef struct brule {
    char *name;      /* user rules: their name; made rules: parent/kind */
    gelem *el;       /* alternatives, each ended by E_END */
    int32_t n, cap;
    int defined;     /* user rules: where defined; 0 for a reference only */
    size_t ref_at;   /* first reference's offset, for the error */
} brule;

typedef struct parser {
    const char *s;
    size_t n, i;
    brule *r;
    int32_t n_r, cap_r;
    uint32_t (*sets)[8];
    int32_t n_sets, cap_sets;
    int64_t total;   /* elements so far, for the limit */
    int depth;
} parser;

static void where(const parser *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else
            (*col)++;
    }
}

static og_status perr(const parser *p, size_t at, const char *fmt, ...) OG_PRINTF(3, 4);
static og_status perr(const parser *p, size_t at, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p, at, &line, &col);
    return og_set_error(OG_ERR_FORMAT, "grammar: line %d, column %d: %s", line, col, msg);
}

static og_status oom(void) { return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar: out of memory"); }

static og_status rule_push(parser *p, int32_t r, int32_t kind, int32_t arg) {
    if (++p->total > OG_GRAMMAR_MAX_ELEMENTS)
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar: more than %d elements (repetitions included)",
                            OG_GRAMMAR_MAX_ELEMENTS);
    brule *b = &p->r[r];
    if (b->n == b->cap) {
        int32_t cap = b->cap ? b->cap * 2 : 16;
        gelem *e = og_realloc(b->el, (size_t)cap * sizeof *e);
        if (!e) return oom();
        b->el = e;
        b->cap = cap;
    }
    b->el[b->n++] = (gelem){kind, arg};
    return OG_OK;
}

/* A new rule named name (copied); its id in *id. */
static og_status rule_new(parser *p, const char *name, size_t len, int32_t *id) {
    if (p->n_r == p->cap_r) {
        int32_t cap = p->cap_r ? p->cap_r * 2 : 32;
        brule *r = og_realloc(p->r, (size_t)cap * sizeof *r);
        if (!r) return oom();
        p->r = r;
        p->cap_r = cap;
    }
    brule *b = &p->r[p->n_r];
    memset(b, 0, sizeof *b);
    b->name = og_malloc(len + 1);
    if (!b->name) return oom();
    memcpy(b->name, name, len);
    b->name[len] = 0;
    *id = p->n_r++;
    return OG_OK;
}

/* A made rule, named after the rule it serves. */
static og_status rule_made(parser *p, int32_t parent, const char *kind, int32_t *id) {
    char name[160];
    int k = snprintf(name, sizeof name, "%.100s/%s%d", p->r[parent].name, kind, p->n_r);
    return rule_new(p, name, (size_t)(k < (int)sizeof name ? k : (int)sizeof name - 1), id);
}

static og_status set_new(parser *p, const uint32_t bits[8], int32_t *id) {
    for (int32_t k = p->n_sets - 1; k >= 0 && k >= p->n_sets - 8; k--) /* recent duplicates */
        if (!memcmp(p->sets[k], bits, 32)) {
            *id = k;
            return OG_OK;
        }
    if (p->n_sets == p->cap_sets) {
        int32_t cap = p->cap_sets ? p->cap_sets * 2 : 64;
        uint32_t(*s)[8] = og_realloc(p->sets, (size_t)cap * sizeof *s);
        if (!s) return oom();
        p->sets = s;
        p->cap_sets = cap;
    }
    memcpy(p->sets[p->n_sets], bits, 32);
    *id = p->n_sets++;
    return OG_OK;
}

static og_status push_byte_range(parser *p, int32_t r, unsigned lo, unsigned hi) {
    uint32_t bits[8] = {0};
    for (unsigned b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
    int32_t id;
    OG_TRY(set_new(p, bits, &id));
    return rule_push(p, r, E_BYTES, id);
}

static int utf8_encode(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* --- code point ranges -> UTF-8 byte sequences ---
 * A range of code points whose encodings have one length and differ only
 * in their last k continuation bytes (which run over the whole 80..BF) is
 * one sequence of byte ranges; split() cuts any range into such pieces. */
typedef struct seqs {
    unsigned char lo[64][4], hi[64][4];
    int len[64], n;
    uint32_t ascii[8]; /* one-byte pieces, merged into one set */
} seqs;

static int split(seqs *o, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k]) return split(o, lo, lim[k]) || split(o, lim[k] + 1, hi);
    if (lo < 0x80) {
        for (uint32_t c = lo; c <= hi; c++) o->ascii[c >> 5] |= 1u << (c & 31);
        return 0;
    }
    int n = lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int k = 1; k < n; k++) {
        uint32_t m = (1u << (6 * k)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return split(o, lo, lo | m) || split(o, (lo | m) + 1, hi);
            if ((hi & m) != m) return split(o, lo, (hi & ~m) - 1) || split(o, hi & ~m, hi);
        }
    }
    if (o->n == 64) return 1;
    unsigned char a[4], b[4];
    utf8_encode(lo, a);
    utf8_encode(hi, b);
    memcpy(o->lo[o->n], a, 4);
    memcpy(o->hi[o->n], b, 4);
    o->len[o->n++] = n;
    return 0;
}

/* Code points of a class: ranges [lo, hi], negated or not, into the
 * element(s) that match one of them, appended to rule r. Surrogates are
 * never matched. */
static og_status push_class(parser *p, int32_t r, const uint32_t (*rg)[2], int n_rg, int negate, size_t at) {
    /* normalise: the set as sorted disjoint ranges, complemented if asked */
    uint32_t (*v)[2] = og_malloc(((size_t)n_rg + 2) * 2 * sizeof *v);
    if (!v) return oom();
    int nv = 0;
    for (int k = 0; k < n_rg; k++) { /* insertion sort by lo */
        int j = nv++;
        while (j > 0 && v[j - 1][0] > rg[k][0]) {
            v[j][0] = v[j - 1][0];
            v[j][1] = v[j - 1][1];
            j--;
        }
        v[j][0] = rg[k][0];
        v[j][1] = rg[k][1];
    }
    int m = 0;
    for (int k = 0; k < nv; k++) {
        if (m && v[k][0] <= v[m - 1][1] + 1) {
            if (v[k][1] > v[m - 1][1]) v[m - 1][1] = v[k][1];
        } else {
            v[m][0] = v[k][0];
            v[m][1] = v[k][1];
            m++;
        }
    }
    uint32_t (*w)[2] = v + (n_rg + 2); /* the complement, or a copy; surrogates cut out after */
    int nw = 0;
    if (negate) {
        uint32_t next = 0;
        for (int k = 0; k < m; k++) {
            if (v[k][0] > next) {
                w[nw][0] = next;
                w[nw++][1] = v[k][0] - 1;
            }
            next = v[k][1] + 1;
        }
        if (next <= 0x10FFFF) {
            w[nw][0] = next;
            w[nw++][1] = 0x10FFFF;
        }
    } else {
        memcpy(w, v, (size_t)m * sizeof *w);
        nw = m;
    }
    seqs *o = og_calloc(1, sizeof *o);
    if (!o) {
        og_free(v);
        return oom();
    }
    int over = 0;
    for (int k = 0; k < nw && !over; k++) {
        uint32_t lo = w[k][0], hi = w[k][1] > 0x10FFFF ? 0x10FFFF : w[k][1];
        if (lo <= 0xDFFF && hi >= 0xD800) {
            over |= lo < 0xD800 ? split(o, lo, 0xD7FF) : 0;
            over |= hi > 0xDFFF ? split(o, 0xE000, hi) : 0;
        } else
            over |= split(o, lo, hi);
    }
    og_free(v);
    og_status rc = OG_OK;
    if (over) rc = perr(p, at, "character class too complex (more than 64 UTF-8 byte sequences)");
    int has_ascii = 0;
    for (int k = 0; k < 8; k++) has_ascii |= o->ascii[k] != 0;
    if (rc == OG_OK && o->n == 0 && !has_ascii) rc = perr(p, at, "character class matches no character");
    if (rc == OG_OK && o->n == 0) { /* one byte set */
        int32_t id;
        rc = set_new(p, o->ascii, &id);
        if (rc == OG_OK) rc = rule_push(p, r, E_BYTES, id);
    } else if (rc == OG_OK) { /* a rule of alternatives */
        int32_t c;
        rc = rule_made(p, r, "class", &c);
        if (rc == OG_OK && has_ascii) {
            int32_t id;
            rc = set_new(p, o->ascii, &id);
            if (rc == OG_OK) rc = rule_push(p, c, E_BYTES, id);
            if (rc == OG_OK) rc = rule_push(p, c, E_END, 0);
        }
        for (int k = 0; k < o->n && rc == OG_OK; k++) {
            for (int j = 0; j < o->len[k] && rc == OG_OK; j++) rc = push_byte_range(p, c, o->lo[k][j], o->hi[k][j]);
            if (rc == OG_OK) rc = rule_push(p, c, E_END, 0);
        }
        if (rc == OG_OK) rc = rule_push(p, r, E_REF, c);
    }
    og_free(o);
    return rc;
}

/* --- the text --- */

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips spaces, tabs, comments and, when newlines, line ends. */
static void skip_space(parser *p, int newlines) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r') p->i++;
        else if (c == '#')
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        else if (c == '\n' && newlines)
            p->i++;
        else
            break;
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class at p->i: an escape or a UTF-8
 * character, as a code point. */
static og_status read_char(parser *p, uint32_t *cp, const char *what) {
    size_t at = p->i;
    if (p->i >= p->n) return perr(p, at, "unterminated %s", what);
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '\\') {
        if (++p->i >= p->n) return perr(p, at, "unterminated %s", what);
        char e = p->s[p->i++];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
                if (h < 0) return perr(p, p->i, "expected %d hexadecimal digits after \\%c", digits, e);
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return perr(p, at, "\\%c escape U+%X is not a Unicode scalar value", e, v);
            *cp = v;
            return OG_OK;
        }
        switch (e) {
        case 'n': *cp = '\n'; return OG_OK;
        case 'r': *cp = '\r'; return OG_OK;
        case 't': *cp = '\t'; return OG_OK;
        case '0': *cp = 0; return OG_OK;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^':
            *cp = (uint32_t)e;
            return OG_OK;
        default:
            return perr(p, at, "unknown escape \\%c in %s", e, what);
        }
    }
    if (c < 0x80) {
        if (c == '\n') return perr(p, at, "unterminated %s (end of line)", what);
        *cp = c;
        p->i++;
        return OG_OK;
    }
    int len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (c >= 0xF5) len = 0;
    if (!len || p->i + (size_t)len > p->n) return perr(p, at, "invalid UTF-8 in %s", what);
    uint32_t v = len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        unsigned char d = (unsigned char)p->s[p->i + (size_t)k];
        if ((d & 0xC0) != 0x80) return perr(p, at, "invalid UTF-8 in %s", what);
        v = (v << 6) | (d & 0x3F);
    }
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, at, "invalid UTF-8 in %s", what);
    p->i += (size_t)len;
    *cp = v;
    return OG_OK;
}

static og_status find_rule(parser *p, const char *name, size_t len, size_t at, int32_t *id) {
    for (int32_t k = 0; k < p->n_r; k++)
        if (strlen(p->r[k].name) == len && !memcmp(p->r[k].name, name, len)) {
            *id = k;
            return OG_OK;
        }
    OG_TRY(rule_new(p, name, len, id));
    p->r[*id].ref_at = at;
    return OG_OK;
}

static og_status parse_alternates(parser *p, int32_t r, int nested);

/* Copies elements [from, to) of rule src to the end of rule dst. */
static og_status copy_elems(parser *p, int32_t dst, int32_t src, int32_t from, int32_t to) {
    for (int32_t k = from; k < to; k++) OG_TRY(rule_push(p, dst, p->r[src].el[k].kind, p->r[src].el[k].arg));
    return OG_OK;
}

/* Applies a repetition {lo, hi} (hi < 0: no bound) to the last item of rule
 * r, which starts at element `start`. */
static og_status repeat(parser *p, int32_t r, int32_t start, long lo, long hi) {
    /* the item as one element: itself when it is one, else a rule of it */
    gelem item;
    if (p->r[r].n - start == 1)
        item = p->r[r].el[start];
    else {
        int32_t c;
        OG_TRY(rule_made(p, r, "item", &c));
        OG_TRY(copy_elems(p, c, r, start, p->r[r].n));
        OG_TRY(rule_push(p, c, E_END, 0));
        item = (gelem){E_REF, c};
    }
    p->r[r].n = start;
    for (long k = 0; k < lo; k++) OG_TRY(rule_push(p, r, item.kind, item.arg));
    if (hi < 0) { /* star ::= item star | "" */
        int32_t s;
        OG_TRY(rule_made(p, r, "star", &s));
        OG_TRY(rule_push(p, s, item.kind, item.arg));
        OG_TRY(rule_push(p, s, E_REF, s));
        OG_TRY(rule_push(p, s, E_END, 0));
        OG_TRY(rule_push(p, s, E_END, 0));
        return rule_push(p, r, E_REF, s);
    }
    /* opt_1 ::= item | ""; opt_k ::= item opt_(k-1) | "" */
    int32_t prev = -1;
    for (long k = lo; k < hi; k++) {
        int32_t o;
        OG_TRY(rule_made(p, r, "opt", &o));
        OG_TRY(rule_push(p, o, item.kind, item.arg));
        if (prev >= 0) OG_TRY(rule_push(p, o, E_REF, prev));
        OG_TRY(rule_push(p, o, E_END, 0));
        OG_TRY(rule_push(p, o, E_END, 0));
        prev = o;
    }
    return prev >= 0 ? rule_push(p, r, E_REF, prev) : OG_OK;
}

static og_status parse_count(parser *p, long *v) {
    size_t at = p->i;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, at, "expected a number in {m,n}");
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > OG_GRAMMAR_MAX_REPEAT)
            return og_set_error(OG_ERR_UNSUPPORTED, "grammar: repetition count above %d at offset %zu",
                                OG_GRAMMAR_MAX_REPEAT, at);
    }
    *v = x;
    return OG_OK;
}

/* One sequence of items into rule r (not ended). */
static og_status parse_sequence(parser *p, int32_t r, int nested) {
    int32_t last = -1; /* first element of the last item */
    for (;;) {
        skip_space(p, nested);
        if (p->i >= p->n) return OG_OK;
        size_t at = p->i;
        char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            last = p->r[r].n;
            while (p->i < p->n && p->s[p->i] != '"') {
                uint32_t cp;
                OG_TRY(read_char(p, &cp, "string literal"));
                unsigned char b[4];
                int nb = utf8_encode(cp, b);
                for (int k = 0; k < nb; k++) OG_TRY(push_byte_range(p, r, b[k], b[k]));
            }
            if (p->i >= p->n) return perr(p, at, "unterminated string literal");
            p->i++;
            if (p->r[r].n == last) last = -1; /* "" is nothing: no item to repeat */
        } else if (c == '[') {
            p->i++;
            int neg = 0;
            if (p->i < p->n && p->s[p->i] == '^') {
                neg = 1;
                p->i++;
            }
            uint32_t (*rg)[2] = NULL;
            int nrg = 0, cap = 0;
            og_status rc = OG_OK;
            while (rc == OG_OK && p->i < p->n && p->s[p->i] != ']') {
                uint32_t a, b;
                rc = read_char(p, &a, "character class");
                b = a;
                if (rc == OG_OK && p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                    p->i++;
                    size_t rat = p->i;
                    rc = read_char(p, &b, "character class");
                    if (rc == OG_OK && b < a) rc = perr(p, rat, "range end U+%04X before its start U+%04X", b, a);
                }
                if (rc == OG_OK && nrg == cap) {
                    cap = cap ? cap * 2 : 8;
                    if (cap > 4096) rc = perr(p, at, "character class with more than 4096 ranges");
                    uint32_t(*g)[2] = rc ? NULL : og_realloc(rg, (size_t)cap * sizeof *g);
                    if (!g && rc == OG_OK) rc = oom();
                    if (g) rg = g;
                }
                if (rc == OG_OK) {
                    rg[nrg][0] = a;
                    rg[nrg++][1] = b;
                }
            }
            if (rc == OG_OK && p->i >= p->n) rc = perr(p, at, "unterminated character class");
            if (rc == OG_OK && !nrg && !neg) rc = perr(p, at, "empty character class");
            if (rc == OG_OK) {
                p->i++;
                last = p->r[r].n;
                rc = push_class(p, r, (const uint32_t(*)[2])rg, nrg, neg, at);
            }
            og_free(rg);
            OG_TRY(rc);
        } else if (c == '.') {
            p->i++;
            last = p->r[r].n;
            OG_TRY(push_class(p, r, NULL, 0, 1, at));
        } else if (is_name_char(c)) {
            size_t b = p->i;
            while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
            size_t e = p->i;
            skip_space(p, 0);
            if (p->i + 2 < p->n + 0 && !memcmp(p->s + p->i, "::=", 3)) { /* the next rule starts */
                if (nested) return perr(p, b, "expected ')' before the next rule");
                p->i = b;
                return OG_OK;
            }
            int32_t id;
            OG_TRY(find_rule(p, p->s + b, e - b, b, &id));
            last = p->r[r].n;
            OG_TRY(rule_push(p, r, E_REF, id));
            continue; /* the postfix check below needs no space skipping: done */
        } else if (c == '(') {
            if (++p->depth > OG_GRAMMAR_MAX_DEPTH)
                return og_set_error(OG_ERR_UNSUPPORTED, "grammar: parentheses nested deeper than %d",
                                    OG_GRAMMAR_MAX_DEPTH);
            p->i++;
            int32_t g;
            OG_TRY(rule_made(p, r, "group", &g));
            OG_TRY(parse_alternates(p, g, 1));
            skip_space(p, 1);
            if (p->i >= p->n || p->s[p->i] != ')') return perr(p, p->i, "expected ')' to close the '(' at offset %zu", at);
            p->i++;
            p->depth--;
            last = p->r[r].n;
            OG_TRY(rule_push(p, r, E_REF, g));
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return perr(p, at, "'%c' with nothing before it to repeat", c);
            p->i++;
            long lo = 0, hi = -1;
            if (c == '+') lo = 1;
            else if (c == '?') hi = 1;
            else if (c == '{') {
                skip_space(p, 0);
                OG_TRY(parse_count(p, &lo));
                skip_space(p, 0);
                hi = lo;
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    skip_space(p, 0);
                    hi = -1;
                    if (p->i < p->n && p->s[p->i] != '}') {
                        OG_TRY(parse_count(p, &hi));
                        skip_space(p, 0);
                        if (hi < lo) return perr(p, at, "{%ld,%ld}: the maximum is below the minimum", lo, hi);
                    }
                }
                if (p->i >= p->n || p->s[p->i] != '}') return perr(p, p->i, "expected '}' to close the repetition");
                p->i++;
            }
            OG_TRY(repeat(p, r, last, lo, hi));
            last = -1; /* x** is refused: repeat a group instead */
        } else if (c == '|' || c == ')' || c == '\n') {
            return OG_OK;
        } else if (c == '<') {
            return perr(p, at, "token references (<...>) are not supported");
        } else {
            return perr(p, at, "expected a string, a class, a rule name, '(', or a repetition; found '%c'", c);
        }
    }
}

static og_status parse_alternates(parser *p, int32_t r, int nested) {
    for (;;) {
        OG_TRY(parse_sequence(p, r, nested));
        OG_TRY(rule_push(p, r, E_END, 0));
        size_t save = p->i;
        skip_space(p, 1); /* an alternative may continue on the next line after a leading | */
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            skip_space(p, 1);
            continue;
        }
        p->i = save;
        return OG_OK;
    }
}

static og_status parse_rules(parser *p) {
    for (;;) {
        skip_space(p, 1);
        if (p->i >= p->n) return OG_OK;
        size_t at = p->i;
        if (!is_name_char(p->s[p->i])) return perr(p, at, "expected a rule name");
        while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
        size_t e = p->i;
        skip_space(p, 0);
        if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3))
            return perr(p, p->i, "expected '::=' after the rule name \"%.*s\"", (int)(e - at), p->s + at);
        p->i += 3;
        int32_t id;
        OG_TRY(find_rule(p, p->s + at, e - at, at, &id));
        if (p->r[id].defined) {
            int line, col;
            where(p, (size_t)p->r[id].defined - 1, &line, &col);
            return perr(p, at, "rule \"%s\" is already defined at line %d", p->r[id].name, line);
        }
        p->r[id].defined = (int)(at + 1);
        skip_space(p, 1);
        OG_TRY(parse_alternates(p, id, 0));
        skip_space(p, 0);
        if (p->i < p->n && p->s[p->i] != '\n')
            return perr(p, p->i, "expected the end of the line after rule \"%s\", found '%c'", p->r[id].name,
                        p->s[p->i]);
    }
}

/* Left recursion: a rule that can reach itself before matching a byte. */
static og_status check_left_recursion(parser *p, const char *names_src) {
    (void)names_src;
    int32_t n = p->n_r;
    char *nullable = og_calloc((size_t)n, 1);
    int8_t *mark = og_calloc((size_t)n, 1);
    int32_t *stack = og_malloc((size_t)n * 2 * sizeof *stack + 1);
    if (!nullable || !mark || !stack) {
        og_free(nullable);
        og_free(mark);
        og_free(stack);
        return oom();
    }
    for (int changed = 1; changed;) { /* nullable rules: a fixed point */
        changed = 0;
        for (int32_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            int all = 1, found = 0;
            for (int32_t k = 0; k < p->r[r].n && !found; k++) {
                gelem e = p->r[r].el[k];
                if (e.kind == E_END) {
                    found = all;
                    all = 1;
                } else if (e.kind == E_BYTES || !nullable[e.arg])
                    all = 0;
            }
            if (found) {
                nullable[r] = 1;
                changed = 1;
            }
        }
    }
    /* depth-first over "r can start with s" edges; mark 1 = on the path */
    og_status rc = OG_OK;
    for (int32_t s0 = 0; s0 < n && rc == OG_OK; s0++) {
        if (mark[s0]) continue;
        int32_t sp = 0;
        stack[sp++] = s0;
        stack[sp++] = 0; /* (rule, next element to look at) */
        mark[s0] = 1;
        while (sp && rc == OG_OK) {
            int32_t r = stack[sp - 2], k = stack[sp - 1];
            /* find the next left-edge from element k on */
            int32_t next = -1;
            while (k < p->r[r].n) {
                /* element k is at the left of its alternative iff all before it since the last END are nullable */
                int32_t b = k;
                while (b > 0 && p->r[r].el[b - 1].kind != E_END) b--;
                int left = 1;
                for (int32_t j = b; j < k && left; j++)
                    left = p->r[r].el[j].kind == E_REF && nullable[p->r[r].el[j].arg];
                gelem e = p->r[r].el[k++];
                if (left && e.kind == E_REF) {
                    next = e.arg;
                    break;
                }
            }
            stack[sp - 1] = k;
            if (next < 0) {
                mark[r] = 2;
                sp -= 2;
            } else if (mark[next] == 1) {
                rc = og_set_error(OG_ERR_FORMAT, "grammar: left recursion: rule \"%s\" can start with rule \"%s\" "
                                  "before matching any character", p->r[r].name, p->r[next].name);
            } else if (mark[next] == 0) {
                mark[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
            }
        }
    }
    og_free(nullable);
    og_free(mark);
    og_free(stack);
    return rc;
}

void og_grammar_destroy(og_grammar *g) {
    if (!g) return;
    og_free(g->el);
    og_free(g->sets);
    og_free(g->alt);
    og_free(g->rule_alt);
    og_free(g);
}

static og_status build(parser *p, og_grammar **out) {
    int32_t root = -1;
    for (int32_t k = 0; k < p->n_r; k++) {
        if (!strcmp(p->r[k].name, "root")) root = k;
        if (!p->r[k].defined && !strchr(p->r[k].name, '/'))
            return perr(p, p->r[k].ref_at, "rule \"%s\" is used but never defined", p->r[k].name);
    }
    if (root < 0) return og_set_error(OG_ERR_FORMAT, "grammar: no rule named \"root\" (the start rule)");
    OG_TRY(check_left_recursion(p, NULL));
    og_grammar *g = og_calloc(1, sizeof *g);
    if (!g) return oom();
    int64_t n_el = 1, n_alt = 0; /* element 0: an E_END no alternative starts at */
    for (int32_t k = 0; k < p->n_r; k++) {
        n_el += p->r[k].n;
        for (int32_t j = 0; j < p->r[k].n; j++) n_alt += p->r[k].el[j].kind == E_END;
    }
    g->el = og_malloc((size_t)n_el * sizeof *g->el);
    g->alt = og_malloc((size_t)(n_alt + 1) * sizeof *g->alt);
    g->rule_alt = og_malloc(((size_t)p->n_r + 1) * sizeof *g->rule_alt);
    g->sets = og_malloc((size_t)(p->n_sets + 1) * sizeof *g->sets);
    if (!g->el || !g->alt || !g->rule_alt || !g->sets) {
        og_grammar_destroy(g);
        return oom();
    }
    if (p->n_sets) memcpy(g->sets, p->sets, (size_t)p->n_sets * sizeof *g->sets);
    g->n_sets = p->n_sets;
    g->el[0] = (gelem){E_END, 0};
    int32_t e = 1, a = 0;
    for (int32_t k = 0; k < p->n_r; k++) {
        g->rule_alt[k] = a;
        int start = 1;
        for (int32_t j = 0; j < p->r[k].n; j++) {
            if (start) g->alt[a++] = e;
            g->el[e++] = p->r[k].el[j];
            start = p->r[k].el[j].kind == E_END;
        }
    }
    g->rule_alt[p->n_r] = a;
    g->n_el = e;
    g->n_rules = p->n_r;
    g->root = root;
    *out = g;
    return OG_OK;
}

og_status og_grammar_parse(const char *text, size_t len, og_grammar **out) {
    if (!out || (!text && len)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_grammar_parse: NULL argument");
    *out = NULL;
    if (len > OG_GRAMMAR_MAX_TEXT)
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar: %zu bytes of text, more than the limit %d", len,
                            OG_GRAMMAR_MAX_TEXT);
    parser p = {.s = text ? text : "", .n = len};
    og_status rc = parse_rules(&p);
    if (rc == OG_OK) rc = build(&p, out);
    for (int32_t k = 0; k < p.n_r; k++) {
        og_free(p.r[k].name);
        og_free(p.r[k].el);
    }
    og_free(p.r);
    og_free(p.sets);
    return rc;
}

int32_t og_grammar_rule_count(const og_grammar *g) { return g ? g->n_rules : 0; }
int32_t og_grammar_element_count(const og_grammar *g) { return g ? g->n_el : 0; }

/* ================================================================ vocabulary */

struct og_grammar_vocab {
    int64_t n;           /* logits width */
    int64_t *off;        /* [n + 1] token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    uint32_t *eos;       /* [words] bitmap of end ids */
    int32_t *eos_ids, n_eos;
    int64_t words;
    /* the trie, in preorder: node k has byte[k], depth[k] (>= 1), the index
     * past its subtree skip[k], and the tokens ending there
     * tok[tok_off[k] .. tok_off[k+1]) */
    int32_t n_nodes, max_depth;
    uint8_t *tbyte;
    int32_t *tdepth, *tskip, *tok_off, *tok;
};

void og_grammar_vocab_destroy(og_grammar_vocab *v) {
    if (!v) return;
    og_free(v->off);
    og_free(v->bytes);
    og_free(v->eos);
    og_free(v->eos_ids);
    og_free(v->tbyte);
    og_free(v->tdepth);
    og_free(v->tskip);
    og_free(v->tok_off);
    og_free(v->tok);
    og_free(v);
}

int64_t og_grammar_vocab_size(const og_grammar_vocab *v) { return v ? v->n : 0; }

const char *og_grammar_vocab_token(const og_grammar_vocab *v, int32_t id, size_t *len) {
    if (!v || id < 0 || id >= v->n || v->off[id] == v->off[id + 1]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = (size_t)(v->off[id + 1] - v->off[id]);
    return v->bytes + v->off[id];
}

static const og_grammar_vocab *g_sort_vocab; /* qsort has no context argument: set under the build only */

static int tok_cmp(const void *a, const void *b) {
    const og_grammar_vocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Sorting by bytes uses a file-level pointer; builds are serialised. */
#include <pthread.h>
static pthread_mutex_t g_sort_lock = PTHREAD_MUTEX_INITIALIZER;

static og_status vocab_finish(og_grammar_vocab *v, const int32_t *eos, int32_t n_eos) {
    v->words = (v->n + 31) / 32;
    v->eos = og_calloc((size_t)v->words, sizeof *v->eos);
    v->eos_ids = og_malloc(((size_t)n_eos + 1) * sizeof *v->eos_ids);
    int32_t *order = og_malloc((size_t)v->n * sizeof *order);
    if (!v->eos || !v->eos_ids || !order) {
        og_free(order);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar vocabulary: out of memory");
    }
    for (int32_t k = 0; k < n_eos; k++) {
        if (eos[k] < 0 || eos[k] >= v->n) continue;
        if (!(v->eos[eos[k] >> 5] & (1u << (eos[k] & 31)))) v->eos_ids[v->n_eos++] = eos[k];
        v->eos[eos[k] >> 5] |= 1u << (eos[k] & 31);
    }
    int32_t nt = 0;
    for (int64_t i = 0; i < v->n; i++)
        if (v->off[i + 1] > v->off[i] && !(v->eos[i >> 5] & (1u << (i & 31)))) order[nt++] = (int32_t)i;
    pthread_mutex_lock(&g_sort_lock);
    g_sort_vocab = v;
    qsort(order, (size_t)nt, sizeof *order, tok_cmp);
    g_sort_vocab = NULL;
    pthread_mutex_unlock(&g_sort_lock);
    /* nodes: each token adds one per byte past its common prefix with the previous token */
    int64_t nn = 0, max_len = 0;
    for (int32_t k = 0; k < nt; k++) {
        int64_t len = v->off[order[k] + 1] - v->off[order[k]], lcp = 0;
        if (k) {
            int64_t pl = v->off[order[k - 1] + 1] - v->off[order[k - 1]];
            const char *a = v->bytes + v->off[order[k - 1]], *b = v->bytes + v->off[order[k]];
            while (lcp < pl && lcp < len && a[lcp] == b[lcp]) lcp++;
        }
        nn += len - lcp;
        if (len > max_len) max_len = len;
    }
    if (nn >= INT32_MAX || max_len > 65536) {
        og_free(order);
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar vocabulary: too large a trie");
    }
    v->n_nodes = (int32_t)nn;
    v->max_depth = (int32_t)max_len;
    v->tbyte = og_malloc((size_t)nn + 1);
    v->tdepth = og_malloc(((size_t)nn + 1) * sizeof *v->tdepth);
    v->tskip = og_malloc(((size_t)nn + 1) * sizeof *v->tskip);
    v->tok_off = og_malloc(((size_t)nn + 2) * sizeof *v->tok_off);
    v->tok = og_malloc(((size_t)nt + 1) * sizeof *v->tok);
    int32_t *path = og_malloc(((size_t)max_len + 1) * sizeof *path);
    if (!v->tbyte || !v->tdepth || !v->tskip || !v->tok_off || !v->tok || !path) {
        og_free(order);
        og_free(path);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar vocabulary: out of memory");
    }
    /* tokens attach in sorted order to the node of their last byte, so
     * each node's tokens are consecutive in tok[]: count, then offsets */
    memset(v->tok_off, 0, ((size_t)nn + 2) * sizeof *v->tok_off);
    int32_t node = 0;
    for (int32_t k = 0; k < nt; k++) {
        int64_t len = v->off[order[k] + 1] - v->off[order[k]], lcp = 0;
        const char *b = v->bytes + v->off[order[k]];
        if (k) {
            int64_t pl = v->off[order[k - 1] + 1] - v->off[order[k - 1]];
            const char *a = v->bytes + v->off[order[k - 1]];
            while (lcp < pl && lcp < len && a[lcp] == b[lcp]) lcp++;
        }
        for (int64_t d = lcp + 1; d <= len; d++) {
            v->tbyte[node] = (uint8_t)b[d - 1];
            v->tdepth[node] = (int32_t)d;
            path[d] = node++;
        }
        v->tok[k] = order[k];
        v->tok_off[path[len] + 1]++;
    }
    for (int32_t k = 0; k < v->n_nodes; k++) v->tok_off[k + 1] += v->tok_off[k];
    /* skip: the next node at the same depth or shallower */
    int32_t *st = path, sp = 0;
    for (int32_t k = 0; k < v->n_nodes; k++) {
        while (sp && v->tdepth[st[sp - 1]] >= v->tdepth[k]) v->tskip[st[--sp]] = k;
        st[sp++] = k;
    }
    while (sp) v->tskip[st[--sp]] = v->n_nodes;
    og_free(order);
    og_free(path);
    return OG_OK;
}

og_status og_grammar_vocab_create_bytes(const char *const *bytes, const size_t *lens, int64_t n_vocab,
                                        const int32_t *eos, int32_t n_eos, og_grammar_vocab **out) {
    if (!out || n_vocab < 1 || n_vocab > INT32_MAX || (!bytes && n_vocab) || !lens || (n_eos && !eos))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_grammar_vocab_create_bytes: bad argument");
    *out = NULL;
    og_grammar_vocab *v = og_calloc(1, sizeof *v);
    if (!v) return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar vocabulary: out of memory");
    v->n = n_vocab;
    v->off = og_malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    size_t total = 0;
    for (int64_t i = 0; i < n_vocab; i++) total += lens[i];
    v->bytes = og_malloc(total + 1);
    if (!v->off || !v->bytes) {
        og_grammar_vocab_destroy(v);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar vocabulary: out of memory");
    }
    int64_t o = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        v->off[i] = o;
        if (lens[i]) memcpy(v->bytes + o, bytes[i], lens[i]);
        o += (int64_t)lens[i];
    }
    v->off[n_vocab] = o;
    og_status rc = vocab_finish(v, eos, n_eos);
    if (rc != OG_OK) {
        og_grammar_vocab_destroy(v);
        return rc;
    }
    *out = v;
    return OG_OK;
}

og_status og_grammar_vocab_create(const og_tokenizer *tok, int64_t n_vocab, const int32_t *extra_eos,
                                  int32_t n_extra_eos, og_grammar_vocab **out) {
    if (!tok || !out || n_vocab < 1 || n_vocab > INT32_MAX || (n_extra_eos && !extra_eos))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_grammar_vocab_create: bad argument");
    *out = NULL;
    int32_t nt = og_tokenizer_vocab_size(tok);
    char **b = og_calloc((size_t)n_vocab, sizeof *b);
    size_t *l = og_calloc((size_t)n_vocab, sizeof *l);
    int32_t teos[16];
    int32_t n_teos = og_tokenizer_stop_ids(tok, teos, 16);
    if (n_teos > 16) n_teos = 16;
    int32_t *eos = og_malloc(((size_t)n_teos + (size_t)n_extra_eos + 1) * sizeof *eos);
    og_status rc = b && l && eos ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar vocabulary: out of memory");
    for (int64_t i = 0; i < n_vocab && i < nt && rc == OG_OK; i++) {
        if (!og_tokenizer_token_text(tok, (int32_t)i) || og_tokenizer_is_special(tok, (int32_t)i)) continue;
        rc = og_tokenizer_token_bytes(tok, (int32_t)i, &b[i], &l[i]);
    }
    int32_t ne = 0;
    for (int32_t k = 0; k < n_teos && rc == OG_OK; k++) eos[ne++] = teos[k];
    for (int32_t k = 0; k < n_extra_eos && rc == OG_OK; k++) eos[ne++] = extra_eos[k];
    if (rc == OG_OK && !ne)
        rc = og_set_error(OG_ERR_UNSUPPORTED, "grammar vocabulary: the tokenizer has no end-of-sequence token, so a "
                          "constrained output could never end");
    if (rc == OG_OK) rc = og_grammar_vocab_create_bytes((const char *const *)b, l, n_vocab, eos, ne, out);
    for (int64_t i = 0; b && i < n_vocab; i++) og_free(b[i]);
    og_free(b);
    og_free(l);
    og_free(eos);
    return rc;
}

/* ================================================================ matcher */

typedef struct mnode {
    int32_t pos, parent;
} mnode;

typedef struct mstate {
    int64_t off;      /* its nodes: m->pool[off .. off + n), sorted */
    int32_t n;
    uint32_t hash;
    int accept;
    int32_t *trans;   /* [256] next state, T_UNKNOWN, or T_DEAD; NULL until the first */
    uint32_t *mask;   /* [words], NULL until computed */
} mstate;

#define T_UNKNOWN (-2)
#define T_DEAD (-1)
#define M_MAX_NODES (1 << 22)
#define M_MAX_STATES (1 << 18)
#define M_MAX_STACKS (1 << 16)
#define M_MASK_BYTES ((int64_t)64 << 20) /* masks cached per matcher; past it a mask is recomputed each time */

struct og_matcher {
    const og_grammar *g;
    const og_grammar_vocab *v;
    mnode *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *nhash;   /* open addressing: node id + 1, 0 empty */
    uint32_t nhash_cap;
    mstate *states;
    int32_t n_states, cap_states;
    int32_t *shash;
    uint32_t shash_cap;
    int32_t *pool;
    int64_t n_pool, cap_pool;
    int32_t *tmp;     /* the set being built */
    int32_t n_tmp, cap_tmp;
    int tmp_accept;
    int32_t start, cur;
    int finished;
    int64_t masks, mask_bytes;
    uint32_t *scratch_mask;
    int32_t *walk;    /* [max_depth + 1] states along the trie path */
    int32_t **walk_trans; /* [max_depth + 1] their transition tables (NULL: none yet) */
    int64_t seen;     /* tokens of generated[] fed by the constraint hook */
    int failed;
    char err[256];
};

static uint32_t mix(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

static og_status moom(void) { return og_set_error(OG_ERR_OUT_OF_MEMORY, "grammar matcher: out of memory"); }

static og_status nhash_grow(og_matcher *m) {
    uint32_t cap = m->nhash_cap ? m->nhash_cap * 2 : 1024;
    int32_t *h = og_calloc(cap, sizeof *h);
    if (!h) return moom();
    for (int32_t k = 0; k < m->n_nodes; k++) {
        uint32_t i = mix((uint32_t)m->nodes[k].pos * 2654435761u ^ (uint32_t)m->nodes[k].parent) & (cap - 1);
        while (h[i]) i = (i + 1) & (cap - 1);
        h[i] = k + 1;
    }
    og_free(m->nhash);
    m->nhash = h;
    m->nhash_cap = cap;
    return OG_OK;
}

static og_status node_intern(og_matcher *m, int32_t pos, int32_t parent, int32_t *id) {
    if ((uint32_t)m->n_nodes * 2 >= m->nhash_cap) OG_TRY(nhash_grow(m));
    uint32_t i = mix((uint32_t)pos * 2654435761u ^ (uint32_t)parent) & (m->nhash_cap - 1);
    while (m->nhash[i]) {
        const mnode *n = &m->nodes[m->nhash[i] - 1];
        if (n->pos == pos && n->parent == parent) {
            *id = m->nhash[i] - 1;
            return OG_OK;
        }
        i = (i + 1) & (m->nhash_cap - 1);
    }
    if (m->n_nodes >= M_MAX_NODES)
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar matcher: more than %d stack nodes (nesting too deep)",
                            M_MAX_NODES);
    if (m->n_nodes == m->cap_nodes) {
        int32_t cap = m->cap_nodes ? m->cap_nodes * 2 : 1024;
        mnode *nn = og_realloc(m->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return moom();
        m->nodes = nn;
        m->cap_nodes = cap;
    }
    m->nodes[m->n_nodes] = (mnode){pos, parent};
    m->nhash[i] = m->n_nodes + 1;
    *id = m->n_nodes++;
    return OG_OK;
}

static og_status tmp_push(og_matcher *m, int32_t id) {
    if (m->n_tmp >= M_MAX_STACKS)
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar matcher: more than %d stacks alive (the grammar is too "
                            "ambiguous)", M_MAX_STACKS);
    if (m->n_tmp == m->cap_tmp) {
        int32_t cap = m->cap_tmp ? m->cap_tmp * 2 : 256;
        int32_t *t = og_realloc(m->tmp, (size_t)cap * sizeof *t);
        if (!t) return moom();
        m->tmp = t;
        m->cap_tmp = cap;
    }
    m->tmp[m->n_tmp++] = id;
    return OG_OK;
}

/* Every stack that continues from element pos with return node parent,
 * down to the byte elements, into tmp; reaching the end of root sets
 * tmp_accept. Left recursion was refused, so this ends. */
static og_status expand(og_matcher *m, int32_t pos, int32_t parent, int depth) {
    if (depth > 100000) return og_set_error(OG_ERR_UNSUPPORTED, "grammar matcher: expansion too deep");
    const og_grammar *g = m->g;
    for (;;) {
        gelem e = g->el[pos];
        if (e.kind == E_BYTES) {
            int32_t id;
            OG_TRY(node_intern(m, pos, parent, &id));
            return tmp_push(m, id);
        }
        if (e.kind == E_END) {
            if (parent < 0) {
                m->tmp_accept = 1;
                return OG_OK;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        int32_t ret = parent; /* a reference last in its alternative returns where its rule would */
        if (g->el[pos + 1].kind != E_END) OG_TRY(node_intern(m, pos + 1, parent, &ret));
        for (int32_t a = g->rule_alt[e.arg]; a < g->rule_alt[e.arg + 1]; a++)
            OG_TRY(expand(m, g->alt[a], ret, depth + 1));
        return OG_OK;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* tmp (sorted, deduplicated here) as a state id; T_DEAD when empty. */
static og_status state_intern(og_matcher *m, int32_t *id) {
    if (m->n_tmp > 1) {
        qsort(m->tmp, (size_t)m->n_tmp, sizeof *m->tmp, cmp_i32);
        int32_t w = 1;
        for (int32_t k = 1; k < m->n_tmp; k++)
            if (m->tmp[k] != m->tmp[w - 1]) m->tmp[w++] = m->tmp[k];
        m->n_tmp = w;
    }
    if (!m->n_tmp && !m->tmp_accept) {
        *id = T_DEAD;
        return OG_OK;
    }
    uint32_t h = (uint32_t)m->tmp_accept * 0x9E3779B9u;
    for (int32_t k = 0; k < m->n_tmp; k++) h = mix(h ^ (uint32_t)m->tmp[k]) + (uint32_t)k;
    if ((uint32_t)m->n_states * 2 >= m->shash_cap) {
        uint32_t cap = m->shash_cap ? m->shash_cap * 2 : 256;
        int32_t *t = og_calloc(cap, sizeof *t);
        if (!t) return moom();
        for (int32_t k = 0; k < m->n_states; k++) {
            uint32_t i = m->states[k].hash & (cap - 1);
            while (t[i]) i = (i + 1) & (cap - 1);
            t[i] = k + 1;
        }
        og_free(m->shash);
        m->shash = t;
        m->shash_cap = cap;
    }
    uint32_t i = h & (m->shash_cap - 1);
    while (m->shash[i]) {
        const mstate *s = &m->states[m->shash[i] - 1];
        if (s->hash == h && s->n == m->n_tmp && s->accept == m->tmp_accept &&
            !memcmp(m->pool + s->off, m->tmp, (size_t)m->n_tmp * sizeof *m->tmp)) {
            *id = m->shash[i] - 1;
            return OG_OK;
        }
        i = (i + 1) & (m->shash_cap - 1);
    }
    if (m->n_states >= M_MAX_STATES)
        return og_set_error(OG_ERR_UNSUPPORTED, "grammar matcher: more than %d states", M_MAX_STATES);
    if (m->n_states == m->cap_states) {
        int32_t cap = m->cap_states ? m->cap_states * 2 : 64;
        mstate *s = og_realloc(m->states, (size_t)cap * sizeof *s);
        if (!s) return moom();
        m->states = s;
        m->cap_states = cap;
    }
    if (m->n_pool + m->n_tmp > m->cap_pool) {
        int64_t cap = m->cap_pool ? m->cap_pool * 2 : 4096;
        while (cap < m->n_pool + m->n_tmp) cap *= 2;
        int32_t *p = og_realloc(m->pool, (size_t)cap * sizeof *p);
        if (!p) return moom();
        m->pool = p;
        m->cap_pool = cap;
    }
    if (m->n_tmp) memcpy(m->pool + m->n_pool, m->tmp, (size_t)m->n_tmp * sizeof *m->tmp);
    m->states[m->n_states] = (mstate){.off = m->n_pool, .n = m->n_tmp, .hash = h, .accept = m->tmp_accept};
    m->n_pool += m->n_tmp;
    m->shash[i] = m->n_states + 1;
    *id = m->n_states++;
    return OG_OK;
}

/* The state after byte b from state s (T_DEAD when none). */
static og_status step(og_matcher *m, int32_t s, unsigned b, int32_t *out) {
    if (m->states[s].trans && m->states[s].trans[b] != T_UNKNOWN) {
        *out = m->states[s].trans[b];
        return OG_OK;
    }
    if (!m->states[s].trans) {
        int32_t *t = og_malloc(256 * sizeof *t);
        if (!t) return moom();
        for (int k = 0; k < 256; k++) t[k] = T_UNKNOWN;
        m->states[s].trans = t;
    }
    m->n_tmp = 0;
    m->tmp_accept = 0;
    const og_grammar *g = m->g;
    /* same: the bytes that the same nodes take (and the same others refuse)
     * lead to the same state: all of them are filled in at once */
    uint32_t same[8];
    memset(same, 0xFF, sizeof same);
    for (int32_t k = 0; k < m->states[s].n; k++) {
        const mnode nd = m->nodes[m->pool[m->states[s].off + k]];
        const uint32_t *set = g->sets[g->el[nd.pos].arg];
        uint32_t flip = set[b >> 5] & (1u << (b & 31)) ? 0 : 0xFFFFFFFFu;
        for (int w = 0; w < 8; w++) same[w] &= set[w] ^ flip;
        if (!flip) OG_TRY(expand(m, nd.pos + 1, nd.parent, 0));
    }
    int32_t id;
    OG_TRY(state_intern(m, &id));
    int32_t *t = m->states[s].trans;
    for (int w = 0; w < 8; w++)
        for (uint32_t bits = same[w]; bits; bits &= bits - 1) t[w * 32 + __builtin_ctz(bits)] = id;
    t[b] = id;
    *out = id;
    return OG_OK;
}

void og_matcher_destroy(og_matcher *m) {
    if (!m) return;
    for (int32_t k = 0; k < m->n_states; k++) {
        og_free(m->states[k].trans);
        og_free(m->states[k].mask);
    }
    og_free(m->states);
    og_free(m->shash);
    og_free(m->pool);
    og_free(m->nodes);
    og_free(m->nhash);
    og_free(m->tmp);
    og_free(m->scratch_mask);
    og_free(m->walk);
    og_free(m->walk_trans);
    og_free(m);
}

og_status og_matcher_create(const og_grammar *g, const og_grammar_vocab *v, og_matcher **out) {
    if (!g || !v || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_matcher_create: NULL argument");
    *out = NULL;
    og_matcher *m = og_calloc(1, sizeof *m);
    if (!m) return moom();
    m->g = g;
    m->v = v;
    m->walk = og_malloc(((size_t)v->max_depth + 1) * sizeof *m->walk);
    m->walk_trans = og_malloc(((size_t)v->max_depth + 1) * sizeof *m->walk_trans);
    og_status rc = m->walk && m->walk_trans ? OG_OK : moom();
    if (rc == OG_OK) {
        m->n_tmp = 0;
        m->tmp_accept = 0;
        /* the start: root's alternatives, as if referenced from outside */
        for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1] && rc == OG_OK; a++)
            rc = expand(m, g->alt[a], -1, 0);
        if (rc == OG_OK) rc = state_intern(m, &m->start);
        if (rc == OG_OK && m->start == T_DEAD) rc = og_set_error(OG_ERR_FORMAT, "grammar: root matches nothing");
    }
    if (rc != OG_OK) {
        og_matcher_destroy(m);
        return rc;
    }
    m->cur = m->start;
    *out = m;
    return OG_OK;
}

void og_matcher_reset(og_matcher *m) {
    if (!m) return;
    m->cur = m->start;
    m->finished = 0;
    m->seen = 0;
    m->failed = 0;
    m->err[0] = 0;
}

og_status og_matcher_accept_bytes(og_matcher *m, const char *s, size_t n) {
    if (!m || (!s && n)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_matcher_accept_bytes: NULL argument");
    if (m->finished && n) return og_set_error(OG_ERR_INVALID_ARGUMENT, "grammar: the output has already ended");
    int32_t st = m->cur;
    for (size_t k = 0; k < n; k++) {
        int32_t nx;
        OG_TRY(step(m, st, (unsigned char)s[k], &nx));
        if (nx == T_DEAD)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "grammar: byte %zu (0x%02X) of the input does not fit the "
                                "grammar", k, (unsigned char)s[k]);
        st = nx;
    }
    m->cur = st;
    return OG_OK;
}

og_status og_matcher_accept_token(og_matcher *m, int32_t id) {
    if (!m) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_matcher_accept_token: NULL matcher");
    const og_grammar_vocab *v = m->v;
    if (id < 0 || id >= v->n) return og_set_error(OG_ERR_INVALID_ARGUMENT, "grammar: token %d out of range", id);
    if (v->eos[id >> 5] & (1u << (id & 31))) {
        if (m->finished || !m->states[m->cur].accept)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "grammar: end token %d where the grammar cannot end", id);
        m->finished = 1;
        return OG_OK;
    }
    size_t len;
    const char *b = og_grammar_vocab_token(v, id, &len);
    if (!b) return og_set_error(OG_ERR_INVALID_ARGUMENT, "grammar: token %d has no text the grammar can take", id);
    og_status rc = og_matcher_accept_bytes(m, b, len);
    if (rc != OG_OK) return og_set_error(rc, "grammar: token %d: %s", id, og_last_error());
    return OG_OK;
}

bool og_matcher_can_end(const og_matcher *m) { return m && !m->finished && m->states[m->cur].accept; }
bool og_matcher_finished(const og_matcher *m) { return m && m->finished; }

void og_matcher_stats(const og_matcher *m, int64_t *states, int64_t *masks, int64_t *nodes) {
    if (states) *states = m ? m->n_states : 0;
    if (masks) *masks = m ? m->masks : 0;
    if (nodes) *nodes = m ? m->n_nodes : 0;
}

/* The mask of state s into out ([words], cleared here). */
static og_status compute_mask(og_matcher *m, int32_t s, uint32_t *out) {
    const og_grammar_vocab *v = m->v;
    memset(out, 0, (size_t)v->words * sizeof *out);
    if (m->states[s].accept)
        for (int32_t k = 0; k < v->n_eos; k++) out[v->eos_ids[k] >> 5] |= 1u << (v->eos_ids[k] & 31);
    if (!m->states[s].n) return OG_OK; /* only the end is left */
    int32_t *walk = m->walk, **wt = m->walk_trans; /* the states along the path, and their tables */
    walk[0] = s;
    wt[0] = m->states[s].trans;
    for (int32_t k = 0; k < v->n_nodes;) {
        int32_t d = v->tdepth[k], nx = wt[d - 1] ? wt[d - 1][v->tbyte[k]] : T_UNKNOWN;
        if (nx == T_UNKNOWN) {
            OG_TRY(step(m, walk[d - 1], v->tbyte[k], &nx));
            wt[d - 1] = m->states[walk[d - 1]].trans;
        }
        if (nx == T_DEAD) {
            k = v->tskip[k];
            continue;
        }
        walk[d] = nx;
        wt[d] = m->states[nx].trans;
        for (int32_t t = v->tok_off[k]; t < v->tok_off[k + 1]; t++) out[v->tok[t] >> 5] |= 1u << (v->tok[t] & 31);
        k++;
    }
    return OG_OK;
}

const uint32_t *og_matcher_mask(og_matcher *m) {
    if (!m) return NULL;
    const og_grammar_vocab *v = m->v;
    if (m->finished) { /* nothing may follow the end */
        if (!m->scratch_mask && !(m->scratch_mask = og_malloc((size_t)v->words * sizeof(uint32_t)))) {
            moom();
            return NULL;
        }
        memset(m->scratch_mask, 0, (size_t)v->words * sizeof(uint32_t));
        return m->scratch_mask;
    }
    int32_t s = m->cur;
    if (m->states[s].mask) return m->states[s].mask;
    size_t bytes = (size_t)v->words * sizeof(uint32_t);
    uint32_t *mask = NULL;
    if (m->mask_bytes + (int64_t)bytes <= M_MASK_BYTES) mask = og_malloc(bytes);
    else if (!m->scratch_mask)
        mask = m->scratch_mask = og_malloc(bytes);
    else
        mask = m->scratch_mask;
    if (!mask) {
        moom();
        return NULL;
    }
    if (compute_mask(m, s, mask) != OG_OK) {
        if (mask != m->scratch_mask) og_free(mask);
        return NULL;
    }
    m->masks++;
    if (mask != m->scratch_mask) {
        m->states[s].mask = mask;
        m->mask_bytes += (int64_t)bytes;
    }
    return mask;
}

og_status og_matcher_apply(og_matcher *m, float *logits, int64_t n_vocab) {
    if (!m || !logits) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_matcher_apply: NULL argument");
    if (n_vocab != m->v->n)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_matcher_apply: logits of width %lld, vocabulary of %lld",
                            (long long)n_vocab, (long long)m->v->n);
    const uint32_t *mask = og_matcher_mask(m);
    if (!mask) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_matcher_apply: %s", og_last_error());
    for (int64_t w = 0; w < m->v->words; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        int64_t base = w * 32, end = base + 32 < n_vocab ? base + 32 : n_vocab;
        for (int64_t i = base; i < end; i++)
            if (!(bits & (1u << (i - base)))) logits[i] = -INFINITY;
    }
    return OG_OK;
}

const char *og_matcher_error(const og_matcher *m) { return m && m->failed ? m->err : NULL; }

/* The hook's first half: feeds the tokens of generated[] m has not seen
 * (from the start when n is smaller than what it has seen). */
static og_status feed_generated(og_matcher *m, const int32_t *generated, int64_t n) {
    if (n < m->seen) og_matcher_reset(m);
    og_status rc = OG_OK;
    while (!m->failed && m->seen < n && rc == OG_OK) {
        rc = og_matcher_accept_token(m, generated[m->seen]);
        if (rc == OG_OK) m->seen++;
    }
    return rc;
}

static void fail_with_last_error(og_matcher *m) {
    if (m->failed) return;
    m->failed = 1;
    snprintf(m->err, sizeof m->err, "%s", og_last_error());
}

int64_t og_matcher_width(const og_matcher *m) { return m ? m->v->n : 0; }

const uint32_t *og_grammar_constraint_mask(void *ctx, const int32_t *generated, int64_t n, int64_t vocab) {
    og_matcher *m = ctx;
    if (!m || vocab != m->v->n) return NULL;
    og_status rc = feed_generated(m, generated, n);
    const uint32_t *mask = NULL;
    if (rc == OG_OK && !m->failed && !(mask = og_matcher_mask(m))) rc = OG_ERR_OUT_OF_MEMORY;
    if (rc != OG_OK) fail_with_last_error(m);
    return m->failed ? m->v->eos : mask; /* a failure: only an end stays allowed */
}

void og_grammar_constraint(void *ctx, const int32_t *generated, int64_t n, float *logits, int64_t vocab) {
    og_matcher *m = ctx;
    if (!m || !logits) return;
    og_status rc = feed_generated(m, generated, n);
    if (rc == OG_OK && !m->failed) rc = og_matcher_apply(m, logits, vocab);
    if (rc != OG_OK) fail_with_last_error(m);
    if (m->failed) { /* only an end stays allowed */
        for (int64_t i = 0; i < vocab; i++)
            if (i >= m->v->n || !(m->v->eos[i >> 5] & (1u << (i & 31)))) logits[i] = -INFINITY;
    }
}
