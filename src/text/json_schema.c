/* JSON schema -> GBNF (text/grammar.h): each schema becomes a rule named
 * s<N>; the JSON primitives are fixed rules written once at the end, when
 * used. Keywords are checked against one list: what constrains is
 * compiled, what only annotates is skipped, anything else is refused by
 * name with the schema's location (a JSON pointer). */
#include "text/grammar.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) OG_PRINTF(2, 3);
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *q = og_realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* Offset of the first byte that is not part of well-formed UTF-8, or len. */
static size_t utf8_valid_prefix(const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!n || i + n > len) return i;
        for (size_t k = 1; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return i;
        i += n;
    }
    return len;
}

/* The primitives: each rule's GBNF, written when used. */
enum { P_WS, P_STRING, P_CHAR, P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL, P_VALUE, P_OBJECT, P_ARRAY, P_UUID, P_HEX,
       P_COUNT };
static const char *const k_prim_name[P_COUNT] = {"ws", "string", "char", "number", "integer", "boolean",
                                                  "null", "value", "object", "array", "uuid", "hex"};
static const char *const k_prim_rule[P_COUNT] = {
    "ws ::= (\" \" | \"\\n\" [ \\t]{0,20})?",
    "string ::= \"\\\"\" char* \"\\\"\"",
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})",
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?",
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})",
    "boolean ::= \"true\" | \"false\"",
    "null ::= \"null\"",
    "value ::= object | array | string | number | boolean | null",
    "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? \"}\"",
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"",
    "uuid ::= \"\\\"\" hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12} \"\\\"\"",
    "hex ::= [0-9a-fA-F]",
};
/* what each primitive uses */
static const int k_prim_deps[P_COUNT][4] = {
    [P_STRING] = {P_CHAR, -1}, [P_NUMBER] = {P_INTEGER, -1},
    [P_VALUE] = {P_OBJECT, P_ARRAY, P_STRING, P_NUMBER},
    [P_OBJECT] = {P_WS, P_STRING, P_VALUE, -1}, [P_ARRAY] = {P_WS, P_VALUE, -1}, [P_UUID] = {P_HEX, -1},
    [P_WS] = {-1}, [P_CHAR] = {-1}, [P_INTEGER] = {-1}, [P_BOOLEAN] = {-1}, [P_NULL] = {-1}, [P_HEX] = {-1},
};

#define MAX_DEPTH 64
#define MAX_DEFS 256

typedef struct jctx {
    sbuf out;
    int used[P_COUNT];
    int n_rules;
    const cJSON *doc;
    /* $ref targets already given a rule: pointer -> name */
    const cJSON *def[MAX_DEFS];
    int def_rule[MAX_DEFS];
    int n_def;
    const char *def_ref[MAX_DEFS]; /* the $ref that named each */
    /* $refs reached before any text is matched: left[a][b] when the rule
       of a starts with the rule of b (a $ref at its start, maybe in a
       branch of anyOf / oneOf); a cycle of them matches nothing before it
       comes back (a left-recursive grammar), refused as it closes */
    unsigned char (*left)[MAX_DEFS];
    int left_owner; /* the definition whose start is being compiled (-1: none) */
    char path[512];
    int depth;
    int bad_utf8; /* a literal whose text (escapes decoded) is not UTF-8 */
} jctx;

static void use(jctx *c, int p) {
    if (c->used[p]) return;
    c->used[p] = 1;
    if (p == P_VALUE) {
        use(c, P_BOOLEAN);
        use(c, P_NULL);
    }
    for (int k = 0; k < 4 && k_prim_deps[p][k] >= 0; k++) {
        if (k && !k_prim_deps[p][k]) break;
        use(c, k_prim_deps[p][k]);
    }
}

static og_status refuse(const jctx *c, const char *fmt, ...) OG_PRINTF(2, 3);
static og_status refuse(const jctx *c, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return og_set_error(OG_ERR_UNSUPPORTED, "json schema: at \"%s\": %s", c->path[0] ? c->path : "#", msg);
}

static og_status bad(const jctx *c, const char *fmt, ...) OG_PRINTF(2, 3);
static og_status bad(const jctx *c, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return og_set_error(OG_ERR_FORMAT, "json schema: at \"%s\": %s", c->path[0] ? c->path : "#", msg);
}

/* Writes a JSON text as a GBNF string literal (the JSON text's bytes). */
static void literal(jctx *c, const char *s) {
    if (utf8_valid_prefix((const unsigned char *)s, strlen(s)) < strlen(s)) c->bad_utf8 = 1;
    sb_add(&c->out, "\"");
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        if (*q == '"' || *q == '\\') sb_add(&c->out, "\\%c", *q);
        else if (*q < 0x20)
            sb_add(&c->out, "\\x%02X", *q);
        else
            sb_add(&c->out, "%c", *q);
    }
    sb_add(&c->out, "\"");
}

static og_status value_literal(jctx *c, const cJSON *v) {
    char *j = cJSON_PrintUnformatted(v);
    if (!j) return og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
    literal(c, j);
    cJSON_free(j);
    return OG_OK;
}

static og_status compile(jctx *c, const cJSON *s, char *name, size_t cap);

/* Compiles s as a sub-schema at path + "/" + key (restored after). */
static og_status sub(jctx *c, const cJSON *s, const char *key, char *name, size_t cap) {
    size_t keep = strlen(c->path);
    snprintf(c->path + keep, sizeof c->path - keep, "/%s", key);
    og_status rc = compile(c, s, name, cap);
    c->path[keep] = 0;
    return rc;
}

/* sub, for a sub-schema that comes after text its schema matches first
 * (an array's items, an object's members): a $ref there starts no rule. */
static og_status sub_inside(jctx *c, const cJSON *s, const char *key, char *name, size_t cap) {
    const int keep = c->left_owner;
    c->left_owner = -1;
    og_status rc = sub(c, s, key, name, cap);
    c->left_owner = keep;
    return rc;
}

/* A path of left[] edges from `from` to `to`, written into msg (" -> " and
 * the $ref of each step); false when there is none. */
static bool left_path(const jctx *c, int from, int to, unsigned char *seen, char *msg, size_t cap) {
    seen[from] = 1;
    for (int i = 0; i < c->n_def; i++) {
        if (!c->left[from][i] || (seen[i] && i != to)) continue;
        const size_t n = strlen(msg);
        snprintf(msg + n, cap - n, " -> %s", c->def_ref[i]);
        if (i == to || left_path(c, i, to, seen, msg, cap)) return true;
        msg[n] = 0;
    }
    return false;
}

/* A $ref to definition `to` reached at the start of definition
 * c->left_owner's rule: refused, naming the cycle, when `to`'s rule comes
 * back there before any text is matched. */
static og_status left_ref(jctx *c, int to) {
    const int from = c->left_owner;
    if (from < 0) return OG_OK;
    if (!c->left && !(c->left = og_calloc(MAX_DEFS, sizeof *c->left)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
    c->left[from][to] = 1;
    unsigned char seen[MAX_DEFS] = {0};
    char msg[1024] = "";
    if (to != from && !left_path(c, to, from, seen, msg, sizeof msg)) return OG_OK;
    return og_set_error(OG_ERR_UNSUPPORTED, "json schema: a $ref cycle that matches nothing before it comes back: "
                        "%s -> %s%s", c->def_ref[from], c->def_ref[to], msg);
}

static int new_rule(jctx *c) { return ++c->n_rules; }

static const char *const k_annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                            "definitions"};
static const char *const k_handled[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                        "items", "minItems", "maxItems", "minLength", "maxLength", "anyOf",
                                        "oneOf", "$ref", "format"};

static int in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i])) return 1;
    return 0;
}

static og_status get_count(jctx *c, const cJSON *s, const char *key, long dflt, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v) return OG_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return bad(c, "\"%s\" must be a non-negative integer", key);
    if (v->valuedouble > OG_GRAMMAR_MAX_REPEAT)
        return refuse(c, "\"%s\": %g is above the limit %d", key, v->valuedouble, OG_GRAMMAR_MAX_REPEAT);
    *out = (long)v->valuedouble;
    return OG_OK;
}

static og_status compile_string(jctx *c, const cJSON *s, char *name, size_t cap) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        if (!cJSON_IsString(f)) return bad(c, "\"format\" must be a string");
        if (strcmp(f->valuestring, "uuid"))
            return refuse(c, "string format \"%s\" is not supported (supported: uuid)", f->valuestring);
        use(c, P_UUID);
        snprintf(name, cap, "uuid");
        return OG_OK;
    }
    long lo, hi;
    OG_TRY(get_count(c, s, "minLength", 0, &lo));
    OG_TRY(get_count(c, s, "maxLength", -1, &hi));
    use(c, P_STRING);
    if (lo == 0 && hi < 0) {
        snprintf(name, cap, "string");
        return OG_OK;
    }
    if (hi >= 0 && hi < lo) return bad(c, "maxLength %ld is below minLength %ld", hi, lo);
    int r = new_rule(c);
    if (hi < 0) sb_add(&c->out, "s%d ::= \"\\\"\" char{%ld,} \"\\\"\"\n", r, lo);
    else
        sb_add(&c->out, "s%d ::= \"\\\"\" char{%ld,%ld} \"\\\"\"\n", r, lo, hi);
    snprintf(name, cap, "s%d", r);
    return OG_OK;
}

static og_status compile_array(jctx *c, const cJSON *s, char *name, size_t cap) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    char item[32] = "value";
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return bad(c, "\"items\" must be a schema (arrays of schemas: prefixItems, not supported)");
    if (items) OG_TRY(sub_inside(c, items, "items", item, sizeof item));
    else
        use(c, P_VALUE);
    long lo, hi;
    OG_TRY(get_count(c, s, "minItems", 0, &lo));
    OG_TRY(get_count(c, s, "maxItems", -1, &hi));
    if (hi >= 0 && hi < lo) return bad(c, "maxItems %ld is below minItems %ld", hi, lo);
    use(c, P_WS);
    int r = new_rule(c);
    sb_add(&c->out, "s%d ::= \"[\" ws ", r);
    if (hi == 0) sb_add(&c->out, "\"]\"\n");
    else {
        /* item ws ("," ws item ws){lo-1, hi-1}, optional as a whole when lo == 0 */
        long rlo = lo ? lo - 1 : 0, rhi = hi < 0 ? -1 : hi - 1;
        sb_add(&c->out, "%s%s ws (\",\" ws %s ws)", lo ? "" : "(", item, item);
        if (rhi < 0) sb_add(&c->out, "{%ld,}", rlo);
        else
            sb_add(&c->out, "{%ld,%ld}", rlo, rhi);
        sb_add(&c->out, "%s \"]\"\n", lo ? "" : ")?");
    }
    snprintf(name, cap, "s%d", r);
    return OG_OK;
}

static og_status compile_object(jctx *c, const cJSON *s, char *name, size_t cap) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return bad(c, "\"properties\" must be an object");
    if (req && !cJSON_IsArray(req)) return bad(c, "\"required\" must be an array of names");
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return bad(c, "\"additionalProperties\" must be a boolean or a schema");
    const cJSON *e;
    cJSON_ArrayForEach(e, req) if (!cJSON_IsString(e)) return bad(c, "\"required\" must be an array of names");
    int n_props = props ? cJSON_GetArraySize(props) : 0, n_extra_req = 0;
    cJSON_ArrayForEach(e, req) if (!props || !cJSON_GetObjectItemCaseSensitive(props, e->valuestring)) n_extra_req++;
    use(c, P_WS);
    if (!n_props && !n_extra_req) {
        if (cJSON_IsFalse(add)) {
            int r = new_rule(c);
            sb_add(&c->out, "s%d ::= \"{\" ws \"}\"\n", r);
            snprintf(name, cap, "s%d", r);
            return OG_OK;
        }
        if (!add || cJSON_IsTrue(add)) {
            use(c, P_OBJECT);
            snprintf(name, cap, "object");
            return OG_OK;
        }
        char val[32];
        OG_TRY(sub_inside(c, add, "additionalProperties", val, sizeof val));
        use(c, P_STRING);
        int r = new_rule(c);
        sb_add(&c->out, "s%d ::= \"{\" ws (string ws \":\" ws %s ws (\",\" ws string ws \":\" ws %s ws)*)? \"}\"\n", r,
               val, val);
        snprintf(name, cap, "s%d", r);
        return OG_OK;
    }
    if (add && !cJSON_IsBool(add))
        return refuse(c, "\"additionalProperties\" as a schema next to \"properties\" is not supported");
    /* the members, in order: kv rules, and whether each is required */
    int n = n_props + n_extra_req;
    if (n > 1000) return refuse(c, "more than 1000 properties");
    int *kv = og_malloc((size_t)n * sizeof *kv);
    char *reqd = og_calloc((size_t)n, 1);
    if (!kv || !reqd) {
        og_free(kv);
        og_free(reqd);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
    }
    og_status rc = OG_OK;
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        if (rc != OG_OK) break;
        char val[32], key[600];
        size_t keep = strlen(c->path);
        snprintf(c->path + keep, sizeof c->path - keep, "/properties");
        rc = sub_inside(c, p, p->string, val, sizeof val);
        c->path[keep] = 0;
        if (rc != OG_OK) break;
        cJSON *ks = cJSON_CreateString(p->string);
        char *kj = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kj) {
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
            break;
        }
        snprintf(key, sizeof key, "%s", kj);
        cJSON_free(kj);
        kv[k] = new_rule(c);
        sb_add(&c->out, "s%d ::= ", kv[k]);
        literal(c, key);
        sb_add(&c->out, " ws \":\" ws %s ws\n", val);
        const cJSON *q;
        cJSON_ArrayForEach(q, req) if (!strcmp(q->valuestring, p->string)) reqd[k] = 1;
        k++;
    }
    cJSON_ArrayForEach(e, req) { /* required names without a schema: any value */
        if (rc != OG_OK || (props && cJSON_GetObjectItemCaseSensitive(props, e->valuestring))) continue;
        use(c, P_VALUE);
        cJSON *ks = cJSON_CreateString(e->valuestring);
        char *kj = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kj) {
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
            break;
        }
        kv[k] = new_rule(c);
        sb_add(&c->out, "s%d ::= ", kv[k]);
        literal(c, kj);
        cJSON_free(kj);
        sb_add(&c->out, " ws \":\" ws value ws\n");
        reqd[k++] = 1;
    }
    if (rc == OG_OK) {
        /* A(i): members i.. with none written yet; the rest after a comma is a plain sequence */
        int base = c->n_rules;
        c->n_rules += n + 1;
        for (int i = 0; i < n; i++) {
            sb_add(&c->out, "s%d ::= s%d", base + 1 + i, kv[i]);
            for (int j = i + 1; j < n; j++) sb_add(&c->out, reqd[j] ? " \",\" ws s%d" : " (\",\" ws s%d)?", kv[j]);
            if (!reqd[i]) sb_add(&c->out, " | s%d", base + 2 + i);
            sb_add(&c->out, "\n");
        }
        sb_add(&c->out, "s%d ::= \"\"\n", base + 1 + n); /* A(n): nothing */
        int r = new_rule(c);
        sb_add(&c->out, "s%d ::= \"{\" ws s%d \"}\"\n", r, base + 1);
        snprintf(name, cap, "s%d", r);
    }
    og_free(kv);
    og_free(reqd);
    return rc;
}

static og_status compile_type(jctx *c, const cJSON *s, const char *t, char *name, size_t cap) {
    if (!strcmp(t, "string")) return compile_string(c, s, name, cap);
    if (!strcmp(t, "array")) return compile_array(c, s, name, cap);
    if (!strcmp(t, "object")) return compile_object(c, s, name, cap);
    int p = !strcmp(t, "number") ? P_NUMBER : !strcmp(t, "integer") ? P_INTEGER : !strcmp(t, "boolean") ? P_BOOLEAN
          : !strcmp(t, "null") ? P_NULL : -1;
    if (p < 0) return bad(c, "unknown type \"%s\"", t);
    use(c, p);
    snprintf(name, cap, "%s", k_prim_name[p]);
    return OG_OK;
}

/* The type a branch of oneOf is limited to, or NULL. */
static const char *branch_type(const cJSON *b) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static og_status resolve_ref(jctx *c, const char *ref, const cJSON **target) {
    const char *rest = NULL;
    const cJSON *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) {
        defs = cJSON_GetObjectItemCaseSensitive(c->doc, "$defs");
        rest = ref + 8;
    } else if (!strncmp(ref, "#/definitions/", 14)) {
        defs = cJSON_GetObjectItemCaseSensitive(c->doc, "definitions");
        rest = ref + 14;
    } else if (!strcmp(ref, "#")) {
        *target = c->doc;
        return OG_OK;
    } else
        return refuse(c, "\"$ref\": \"%s\" (only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\")", ref);
    if (strchr(rest, '/') || strchr(rest, '~'))
        return refuse(c, "\"$ref\": \"%s\" (a nested or escaped pointer)", ref);
    const cJSON *t = defs ? cJSON_GetObjectItemCaseSensitive(defs, rest) : NULL;
    if (!t) return bad(c, "\"$ref\": \"%s\" names no definition", ref);
    *target = t;
    return OG_OK;
}

static og_status compile(jctx *c, const cJSON *s, char *name, size_t cap) {
    if (cJSON_IsTrue(s)) {
        use(c, P_VALUE);
        snprintf(name, cap, "value");
        return OG_OK;
    }
    if (cJSON_IsFalse(s)) return refuse(c, "the schema false (nothing validates)");
    if (!cJSON_IsObject(s)) return bad(c, "a schema must be an object or a boolean");
    if (++c->depth > MAX_DEPTH) return refuse(c, "schemas nested deeper than %d", MAX_DEPTH);
    og_status rc = OG_OK;
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (in_list(k->string, k_handled, sizeof k_handled / sizeof *k_handled) ||
            in_list(k->string, k_annotations, sizeof k_annotations / sizeof *k_annotations))
            continue;
        rc = refuse(c, "keyword \"%s\" is not supported", k->string);
        break;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (rc == OG_OK && ref) {
        if (!cJSON_IsString(ref)) rc = bad(c, "\"$ref\" must be a string");
        const cJSON *t = NULL;
        if (rc == OG_OK) rc = resolve_ref(c, ref->valuestring, &t);
        int slot = -1;
        for (int i = 0; rc == OG_OK && i < c->n_def; i++)
            if (c->def[i] == t) slot = i;
        if (rc == OG_OK && slot < 0) { /* a rule for the target, named before it is compiled: recursion works */
            if (c->n_def == MAX_DEFS) rc = refuse(c, "more than %d referenced definitions", MAX_DEFS);
            else {
                slot = c->n_def++;
                c->def[slot] = t;
                c->def_ref[slot] = ref->valuestring;
                c->def_rule[slot] = new_rule(c);
                rc = left_ref(c, slot);
                char inner[32], saved[sizeof c->path];
                memcpy(saved, c->path, sizeof saved);
                snprintf(c->path, sizeof c->path, "%s", ref->valuestring);
                const int owner = c->left_owner;
                c->left_owner = slot; /* the start of its rule */
                if (rc == OG_OK) rc = compile(c, t, inner, sizeof inner);
                c->left_owner = owner;
                memcpy(c->path, saved, sizeof saved);
                if (rc == OG_OK) sb_add(&c->out, "s%d ::= %s\n", c->def_rule[slot], inner);
            }
        } else if (rc == OG_OK) {
            rc = left_ref(c, slot);
        }
        if (rc == OG_OK && cJSON_GetArraySize(s) > 1) {
            const cJSON *o;
            cJSON_ArrayForEach(o, s) if (strcmp(o->string, "$ref") && !in_list(o->string, k_annotations, 12)) {
                rc = refuse(c, "keyword \"%s\" next to \"$ref\" is not supported", o->string);
                break;
            }
        }
        if (rc == OG_OK) snprintf(name, cap, "s%d", c->def_rule[slot]);
    } else if (rc == OG_OK && (en || cn)) {
        if (en && (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))) rc = bad(c, "\"enum\" must be a non-empty array");
        int r = new_rule(c);
        sb_add(&c->out, "s%d ::= ", r);
        if (cn) rc = value_literal(c, cn);
        else {
            const cJSON *v;
            int first = 1;
            cJSON_ArrayForEach(v, en) {
                if (rc != OG_OK) break;
                if (!first) sb_add(&c->out, " | ");
                first = 0;
                rc = value_literal(c, v);
            }
        }
        sb_add(&c->out, "\n");
        snprintf(name, cap, "s%d", r);
    } else if (rc == OG_OK && (any || one)) {
        const cJSON *list = any ? any : one;
        if (any && one) rc = refuse(c, "\"anyOf\" and \"oneOf\" together");
        else if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list))
            rc = bad(c, "\"%s\" must be a non-empty array", any ? "anyOf" : "oneOf");
        if (rc == OG_OK && type) rc = refuse(c, "\"type\" next to \"%s\"", any ? "anyOf" : "oneOf");
        if (rc == OG_OK && one) { /* exactly one branch must match: only branches of distinct types */
            const cJSON *a, *b;
            int i = 0;
            cJSON_ArrayForEach(a, list) {
                int j = 0;
                const char *ta = branch_type(a);
                cJSON_ArrayForEach(b, list) {
                    const char *tb = branch_type(b);
                    if (j > i && rc == OG_OK &&
                        (!ta || !tb || !strcmp(ta, tb) || (!strcmp(ta, "integer") && !strcmp(tb, "number")) ||
                         (!strcmp(ta, "number") && !strcmp(tb, "integer"))))
                        rc = refuse(c, "\"oneOf\" whose branches may overlap (supported: branches of distinct "
                                    "\"type\"s)");
                    j++;
                }
                i++;
            }
        }
        char (*names)[32] = NULL;
        int nb = rc == OG_OK ? cJSON_GetArraySize(list) : 0;
        if (nb && !(names = og_malloc((size_t)nb * sizeof *names)))
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
        int i = 0;
        const cJSON *b;
        cJSON_ArrayForEach(b, list) {
            if (rc != OG_OK) break;
            char key[48];
            snprintf(key, sizeof key, "%s/%d", any ? "anyOf" : "oneOf", i);
            rc = sub(c, b, key, names[i], sizeof names[i]);
            i++;
        }
        if (rc == OG_OK) {
            int r = new_rule(c);
            sb_add(&c->out, "s%d ::= ", r);
            for (int j = 0; j < nb; j++) sb_add(&c->out, "%s%s", j ? " | " : "", names[j]);
            sb_add(&c->out, "\n");
            snprintf(name, cap, "s%d", r);
        }
        og_free(names);
    } else if (rc == OG_OK && cJSON_IsArray(type)) {
        int nb = cJSON_GetArraySize(type);
        if (!nb) rc = bad(c, "\"type\" must not be an empty list");
        char (*names)[32] = nb ? og_malloc((size_t)nb * sizeof *names) : NULL;
        if (nb && !names) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
        int i = 0, has_int = 0, has_num = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (rc != OG_OK) break;
            if (!cJSON_IsString(t)) rc = bad(c, "\"type\" list entries must be strings");
            else {
                has_int |= !strcmp(t->valuestring, "integer");
                has_num |= !strcmp(t->valuestring, "number");
                rc = compile_type(c, s, t->valuestring, names[i++], sizeof names[0]);
            }
        }
        (void)has_int;
        (void)has_num;
        if (rc == OG_OK) {
            int r = new_rule(c);
            sb_add(&c->out, "s%d ::= ", r);
            for (int j = 0; j < nb; j++) sb_add(&c->out, "%s%s", j ? " | " : "", names[j]);
            sb_add(&c->out, "\n");
            snprintf(name, cap, "s%d", r);
        }
        og_free(names);
    } else if (rc == OG_OK && type) {
        if (!cJSON_IsString(type)) rc = bad(c, "\"type\" must be a string or a list of strings");
        else
            rc = compile_type(c, s, type->valuestring, name, cap);
    } else if (rc == OG_OK) { /* no type: what the keywords say, or anything */
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            rc = compile_object(c, s, name, cap);
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            rc = compile_array(c, s, name, cap);
        else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxLength") || cJSON_GetObjectItemCaseSensitive(s, "format"))
            rc = compile_string(c, s, name, cap);
        else {
            use(c, P_VALUE);
            snprintf(name, cap, "value");
        }
    }
    /* keywords of another type than the one compiled would be ignored: refuse them */
    if (rc == OG_OK && type && cJSON_IsString(type) && !ref && !en && !cn) {
        static const char *const by_type[][4] = {{"object", "properties", "required", "additionalProperties"},
                                                 {"array", "items", "minItems", "maxItems"},
                                                 {"string", "minLength", "maxLength", "format"}};
        for (int t = 0; t < 3 && rc == OG_OK; t++) {
            if (!strcmp(type->valuestring, by_type[t][0])) continue;
            for (int j = 1; j < 4 && rc == OG_OK; j++)
                if (cJSON_GetObjectItemCaseSensitive(s, by_type[t][j]))
                    rc = refuse(c, "keyword \"%s\" with \"type\": \"%s\"", by_type[t][j], type->valuestring);
        }
    }
    c->depth--;
    return rc;
}

og_status og_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf) {
    if (!gbnf || (!schema && len)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_json_schema_to_gbnf: NULL argument");
    *gbnf = NULL;
    size_t ok = utf8_valid_prefix((const unsigned char *)(schema ? schema : ""), len);
    if (ok < len) return og_set_error(OG_ERR_FORMAT, "json schema: not valid UTF-8 (byte %zu)", ok);
    cJSON *doc = cJSON_ParseWithLength(schema ? schema : "", len);
    if (!doc) return og_set_error(OG_ERR_FORMAT, "json schema: not valid JSON");
    jctx *c = og_calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(doc);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
    }
    c->doc = doc;
    c->left_owner = -1;
    char root[32];
    og_status rc = compile(c, doc, root, sizeof root);
    if (rc == OG_OK && c->bad_utf8)
        rc = og_set_error(OG_ERR_FORMAT, "json schema: a string that is not valid UTF-8 once its escapes are read "
                          "(a lone surrogate?)");
    if (rc == OG_OK) {
        sb_add(&c->out, "root ::= %s\n", root);
        for (int p = 0; p < P_COUNT; p++)
            if (c->used[p]) sb_add(&c->out, "%s\n", k_prim_rule[p]);
        if (c->out.oom) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "json schema: out of memory");
    }
    if (rc == OG_OK) *gbnf = c->out.p;
    else
        og_free(c->out.p);
    og_free(c->left);
    og_free(c);
    cJSON_Delete(doc);
    return rc;
}

char *og_json_any_gbnf(bool object_only) {
    jctx c = {0};
    use(&c, object_only ? P_OBJECT : P_VALUE);
    sb_add(&c.out, "root ::= %s\n", object_only ? "object" : "value");
    for (int p = 0; p < P_COUNT; p++)
        if (c.used[p]) sb_add(&c.out, "%s\n", k_prim_rule[p]);
    if (c.out.oom) {
        og_free(c.out.p);
        return NULL;
    }
    return c.out.p;
}

og_status og_grammar_from_json_schema(const char *schema, size_t len, og_grammar **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_grammar_from_json_schema: NULL out");
    *out = NULL;
    char *g = NULL;
    OG_TRY(og_json_schema_to_gbnf(schema, len, &g));
    og_status rc = og_grammar_parse(g, strlen(g), out);
    if (rc != OG_OK) rc = og_set_error(rc, "json schema: its grammar: %s", og_last_error());
    og_free(g);
    return rc;
}
