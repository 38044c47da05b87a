/* The tokenizer (see tokenizer.h): tokenizer.json → a pipeline of
 * added-token split → normalizer → pre-tokenizer → BPE, and ids → token
 * strings → decoder chain. Behaviour follows Hugging Face `tokenizers`; the
 * parity tests compare against its output. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TOK_ERR(st, ...) og_set_error(st, "tokenizer.json: " __VA_ARGS__)

/* ------------------------------------------------------------ byte buffers */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static og_status buf_put(buf *b, const void *src, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = og_realloc(b->p, cap);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0;
    return OG_OK;
}

static og_status buf_putc(buf *b, char c) { return buf_put(b, &c, 1); }

/* Appends the UTF-8 encoding of code point cp. */
static og_status buf_put_cp(buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(b, u, n);
}

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when it is not
 * one; *bad gets the length of its maximal ill-formed subpart then (>= 1). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *bad = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    for (size_t k = 1; k <= need; k++) {
        unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
        if (k >= n || s[k] < min || s[k] > max) {
            *bad = k;
            return 0;
        }
    }
    return need + 1;
}

/* Appends s[0..n) with each maximal ill-formed subpart replaced by U+FFFD. */
static og_status buf_put_lossy(buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    og_status rc = OG_OK;
    while (i < n && rc == OG_OK) {
        size_t bad, len = utf8_seq(u + i, n - i, &bad);
        if (len) {
            i += len;
            run += len;
            continue;
        }
        rc = buf_put(b, s + i - run, run);
        if (rc == OG_OK) rc = buf_put_cp(b, 0xFFFD);
        i += bad;
        run = 0;
    }
    return rc == OG_OK ? buf_put(b, s + n - run, run) : rc;
}

/* Decodes the code point at s (valid UTF-8); *len gets its length. */
static uint32_t utf8_cp(const unsigned char *s, size_t *len) {
    if (s[0] < 0x80) return *len = 1, s[0];
    if (s[0] < 0xE0) return *len = 2, ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (s[0] < 0xF0)
        return *len = 3, ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return *len = 4, ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                     ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* Length of the UTF-8 character starting with byte c (1 for a stray byte). */
static size_t utf8_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* ------------------------------------------------------------ character classes
 * As Hugging Face `tokenizers` (Rust) sees them; categories come from
 * utf8proc, whose Unicode version may differ from Rust's for characters
 * assigned recently. */

/* Rust's char::is_whitespace, regex \s: the White_Space property. */
static int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c); }

static int is_mark(uint32_t c) {
    utf8proc_category_t k = category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

/* Regex \w in Rust (Unicode): Alphabetic, marks, decimal digits, connector
 * punctuation, Join_Control. Alphabetic is the letters, letter numbers and
 * Other_Alphabetic, whose members outside the marks are the circled and
 * squared Latin letters below. */
static int is_word_char(uint32_t c) {
    switch (category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
               (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
    }
}

/* BertNormalizer's control characters: category C* except tab, LF, CR. */
static int is_bert_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    utf8proc_category_t k = category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

static int is_chinese_char(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* BertPreTokenizer's punctuation: ASCII punctuation (symbols included) or
 * category P*. */
static int is_bert_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E);
    utf8proc_category_t k = category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* Rust's char::to_lowercase: the simple mapping, except U+0130, whose
 * lowercase is two characters. */
static og_status put_lower(buf *b, uint32_t c);

/* ------------------------------------------------------------ hash maps */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Token text → id, over the tokenizer's id → text table. */
typedef struct str_map {
    int32_t *slot; /* [cap] id or -1 */
    size_t cap;
} str_map;

typedef struct pair_entry {
    uint64_t key; /* left << 32 | right; UINT64_MAX when empty */
    int32_t rank, merged;
} pair_entry;

typedef struct pair_map {
    pair_entry *slot; /* [cap] */
    size_t cap;
} pair_map;

/* ------------------------------------------------------------ the pipeline */

typedef enum {
    NORM_NFC,
    NORM_NFKC,
    NORM_NFD,
    NORM_NFKD,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_LOWERCASE,
    NORM_STRIP,
    NORM_STRIP_ACCENTS,
    NORM_BERT
} norm_kind;
typedef struct norm_op {
    norm_kind kind;
    char *a, *b; /* prepend text; replace pattern and content */
    /* Strip: left, right; BertNormalizer: clean_text, chinese chars, strip
     * accents, lowercase */
    int left, right, clean, chinese, accents, lower;
} norm_op;

typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT } split_behavior;
typedef enum { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE, PRE_BERT, PRE_WHITESPACE_SPLIT, PRE_WHITESPACE } pre_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;
typedef struct pre_op {
    pre_kind kind;
    int add_prefix_space, use_regex, split;
    prepend_scheme prepend;
    split_behavior behavior;
    pcre2_code *re; /* Split with a Regex pattern, ByteLevel with use_regex */
    char *literal;  /* Split with a String pattern; Metaspace replacement */
} pre_op;

typedef enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_WORDPIECE } dec_kind;
typedef struct dec_op {
    dec_kind kind;
    char *a, *b; /* replace pattern/content; metaspace/strip character; wordpiece prefix */
    int start, stop, cleanup;
    prepend_scheme prepend;
} dec_op;

typedef struct added_token {
    char *text;      /* the content (borrowed from the id table) */
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
    char *pat;       /* what is matched: the content, or for a normalized
                      * token the content through the normalizer (owned) */
    size_t pat_len;
} added_token;

/* Added tokens matched in one pass (those matched in the raw text, or those
 * matched in normalized text): leftmost match, longest at that position. */
typedef struct added_set {
    int32_t *by_byte[256]; /* indexes into added, longest pattern first */
    int32_t n_by_byte[256];
} added_set;

typedef enum { MODEL_BPE, MODEL_UNIGRAM, MODEL_WORDPIECE } model_kind;

/* A byte trie over the Unigram pieces: node, byte -> child in a hash table. */
typedef struct trie {
    uint64_t *key;  /* [cap] node << 8 | byte; UINT64_MAX when empty */
    int32_t *child; /* [cap] */
    size_t cap;
    int32_t *term;  /* [n_nodes] the piece that ends here, or -1 */
    int32_t n_nodes;
} trie;

struct og_tokenizer {
    char **text;       /* [n_ids] token text by id (NULL for a hole) */
    int32_t n_ids;
    str_map vocab;     /* model vocabulary */
    pair_map merges;
    added_token *added; /* [n_added], longest first */
    int32_t n_added;
    added_set added_raw, added_norm; /* not normalized / normalized tokens */
    /* normalized added tokens whose normalized form differs from their
     * content decode as that form (as HF 0.23 does): their ids, ascending,
     * and indexes into added */
    int32_t *norm_dec_id, *norm_dec_tok;
    int32_t n_norm_dec;
    model_kind model;
    int32_t unk, byte_id[256];
    int byte_fallback, fuse_unk, ignore_merges;
    /* Unigram: score by id, the lowest score, the pieces' trie */
    double *score, min_score;
    trie pieces;
    /* WordPiece */
    char *wp_prefix;
    int64_t wp_max_chars;
    bool reference_bpe; /* og_tokenizer_use_reference_bpe */
    norm_op *norm;
    int n_norm;
    pre_op *pre;
    int n_pre;
    dec_op *dec;
    int n_dec; /* -1: no decoder */
    int32_t *eos;
    int32_t n_eos, bos;
    char *chat_template;
    /* post_processor: ids added before and after a single sequence when
     * special tokens are added; post_unsupported names a post-processor
     * that adds tokens in a way this tokenizer does not follow */
    int32_t post_pre[8], post_suf[8];
    int n_post_pre, n_post_suf;
    char post_unsupported[64];
};

static int32_t map_get(const og_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab.cap) return -1;
    size_t mask = t->vocab.cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab.slot[i];
        if (id < 0) return -1;
        if (strlen(t->text[id]) == n && !memcmp(t->text[id], s, n)) return id;
    }
}

static void map_put(og_tokenizer *t, int32_t id) {
    size_t mask = t->vocab.cap - 1, n = strlen(t->text[id]);
    size_t i = hash_bytes(t->text[id], n) & mask;
    while (t->vocab.slot[i] >= 0) i = (i + 1) & mask;
    t->vocab.slot[i] = id;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static const pair_entry *pair_get(const og_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges.cap) return NULL;
    uint64_t k = pair_key(a, b);
    size_t mask = t->merges.cap - 1;
    for (size_t i = (k * 0x9E3779B97F4A7C15ull >> 17) & mask;; i = (i + 1) & mask) {
        if (t->merges.slot[i].key == k) return &t->merges.slot[i];
        if (t->merges.slot[i].key == UINT64_MAX) return NULL;
    }
}

/* GPT-2's byte ↔ printable character table. */
static uint32_t k_byte_cp[256];
static int16_t k_cp_byte[324];
static void byte_table_init(void) {
    if (k_byte_cp[0]) return;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        k_byte_cp[b] = printable ? (uint32_t)b : next++;
    }
    for (int i = 0; i < 324; i++) k_cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) k_cp_byte[k_byte_cp[b]] = (int16_t)b;
}

static const char k_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------ loading */

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int json_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static og_status dup(const char *s, char **out) {
    *out = og_strdup(s);
    return *out ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
}

/* A {"String": s} or {"Regex": r} pattern object. */
static og_status load_pattern(const cJSON *o, const char *where, char **literal, pcre2_code **re) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s = json_str(pat, "String"), *r = json_str(pat, "Regex");
    if (s) return dup(s, literal);
    if (!r || !re) return TOK_ERR(OG_ERR_UNSUPPORTED, "%s: pattern must be %s", where, re ? "{\"String\"} or {\"Regex\"}" : "{\"String\"}");
    int err;
    PCRE2_SIZE off;
    *re = pcre2_compile((PCRE2_SPTR)r, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return TOK_ERR(OG_ERR_UNSUPPORTED, "%s: regex does not compile at offset %zu: %s", where, (size_t)off, (char *)msg);
    }
    return OG_OK;
}

static og_status parse_prepend(const cJSON *o, const char *where, prepend_scheme *out) {
    const char *s = json_str(o, "prepend_scheme");
    if (!s) {
        *out = json_bool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
        return OG_OK;
    }
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else return TOK_ERR(OG_ERR_UNSUPPORTED, "%s: prepend_scheme \"%s\"", where, s);
    return OG_OK;
}

/* Flattens a {"type": "Sequence", key: [...]} tree into items. */
static og_status flatten(const cJSON *o, const char *key, const cJSON ***items, int *n, const char *where) {
    const char *type = json_str(o, "type");
    if (!type) return TOK_ERR(OG_ERR_FORMAT, "%s has no \"type\"", where);
    if (strcmp(type, "Sequence")) {
        const cJSON **p = og_realloc(*items, (size_t)(*n + 1) * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        *items = p;
        p[(*n)++] = o;
        return OG_OK;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, key), *it;
    if (!cJSON_IsArray(arr)) return TOK_ERR(OG_ERR_FORMAT, "%s Sequence has no \"%s\" array", where, key);
    cJSON_ArrayForEach(it, arr) {
        og_status rc = flatten(it, key, items, n, where);
        if (rc) return rc;
    }
    return OG_OK;
}

static og_status load_normalizer(og_tokenizer *t, const cJSON *o) {
    const cJSON **items = NULL;
    int n = 0;
    og_status rc = flatten(o, "normalizers", &items, &n, "normalizer");
    if (rc == OG_OK && n && !(t->norm = og_calloc((size_t)n, sizeof *t->norm)))
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int i = 0; i < n && rc == OG_OK; i++, t->n_norm++) {
        const char *type = json_str(items[i], "type");
        norm_op *op = &t->norm[i];
        if (!strcmp(type, "NFC")) op->kind = NORM_NFC;
        else if (!strcmp(type, "NFKC")) op->kind = NORM_NFKC;
        else if (!strcmp(type, "NFD")) op->kind = NORM_NFD;
        else if (!strcmp(type, "NFKD")) op->kind = NORM_NFKD;
        else if (!strcmp(type, "Lowercase")) op->kind = NORM_LOWERCASE;
        else if (!strcmp(type, "StripAccents")) op->kind = NORM_STRIP_ACCENTS;
        else if (!strcmp(type, "Strip")) {
            op->kind = NORM_STRIP;
            op->left = json_bool(items[i], "strip_left", 1);
            op->right = json_bool(items[i], "strip_right", 1);
        } else if (!strcmp(type, "BertNormalizer")) {
            op->kind = NORM_BERT;
            op->clean = json_bool(items[i], "clean_text", 1);
            op->chinese = json_bool(items[i], "handle_chinese_chars", 1);
            op->lower = json_bool(items[i], "lowercase", 1);
            /* strip_accents null follows lowercase */
            op->accents = json_bool(items[i], "strip_accents", op->lower);
        }
        else if (!strcmp(type, "Prepend")) {
            op->kind = NORM_PREPEND;
            const char *p = json_str(items[i], "prepend");
            rc = p ? dup(p, &op->a) : TOK_ERR(OG_ERR_FORMAT, "normalizer Prepend has no \"prepend\"");
        } else if (!strcmp(type, "Replace")) {
            op->kind = NORM_REPLACE;
            const char *c = json_str(items[i], "content");
            rc = load_pattern(items[i], "normalizer Replace", &op->a, NULL);
            if (rc == OG_OK) rc = c ? dup(c, &op->b) : TOK_ERR(OG_ERR_FORMAT, "normalizer Replace has no \"content\"");
        } else
            rc = TOK_ERR(OG_ERR_UNSUPPORTED, "normalizer type \"%s\" is not supported", type);
    }
    og_free(items);
    return rc;
}

static og_status load_pre_tokenizer(og_tokenizer *t, const cJSON *o) {
    const cJSON **items = NULL;
    int n = 0;
    og_status rc = flatten(o, "pretokenizers", &items, &n, "pre_tokenizer");
    if (rc == OG_OK && n && !(t->pre = og_calloc((size_t)n, sizeof *t->pre)))
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int i = 0; i < n && rc == OG_OK; i++, t->n_pre++) {
        const cJSON *it = items[i];
        const char *type = json_str(it, "type");
        pre_op *op = &t->pre[i];
        if (!strcmp(type, "ByteLevel")) {
            op->kind = PRE_BYTELEVEL;
            op->add_prefix_space = json_bool(it, "add_prefix_space", 1);
            op->use_regex = json_bool(it, "use_regex", 1);
            if (op->use_regex) {
                int err;
                PCRE2_SIZE off;
                op->re = pcre2_compile((PCRE2_SPTR)k_gpt2_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                       &err, &off, NULL);
                if (!op->re) rc = og_set_error(OG_ERR_UNSUPPORTED, "tokenizer: PCRE2 lacks Unicode support");
            }
        } else if (!strcmp(type, "Split")) {
            op->kind = PRE_SPLIT;
            const char *b = json_str(it, "behavior");
            if (json_bool(it, "invert", 0)) rc = TOK_ERR(OG_ERR_UNSUPPORTED, "pre_tokenizer Split with invert=true");
            else if (!b || !strcmp(b, "Isolated")) op->behavior = SPLIT_ISOLATED;
            else if (!strcmp(b, "Removed")) op->behavior = SPLIT_REMOVED;
            else if (!strcmp(b, "MergedWithPrevious")) op->behavior = SPLIT_MERGED_PREV;
            else if (!strcmp(b, "MergedWithNext")) op->behavior = SPLIT_MERGED_NEXT;
            else rc = TOK_ERR(OG_ERR_UNSUPPORTED, "pre_tokenizer Split behavior \"%s\"", b);
            if (rc == OG_OK) rc = load_pattern(it, "pre_tokenizer Split", &op->literal, &op->re);
        } else if (!strcmp(type, "Metaspace")) {
            op->kind = PRE_METASPACE;
            const char *r = json_str(it, "replacement");
            op->split = json_bool(it, "split", 1);
            rc = parse_prepend(it, "pre_tokenizer Metaspace", &op->prepend);
            if (rc == OG_OK) rc = dup(r ? r : "\xE2\x96\x81", &op->literal);
        } else if (!strcmp(type, "BertPreTokenizer")) op->kind = PRE_BERT;
        else if (!strcmp(type, "WhitespaceSplit")) op->kind = PRE_WHITESPACE_SPLIT;
        else if (!strcmp(type, "Whitespace")) op->kind = PRE_WHITESPACE;
        else
            rc = TOK_ERR(OG_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", type);
    }
    og_free(items);
    return rc;
}

static og_status load_decoder(og_tokenizer *t, const cJSON *o) {
    const cJSON **items = NULL;
    int n = 0;
    og_status rc = flatten(o, "decoders", &items, &n, "decoder");
    if (rc == OG_OK && n && !(t->dec = og_calloc((size_t)n, sizeof *t->dec)))
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int i = 0; i < n && rc == OG_OK; i++, t->n_dec++) {
        const cJSON *it = items[i];
        const char *type = json_str(it, "type");
        dec_op *op = &t->dec[i];
        if (!strcmp(type, "ByteLevel")) op->kind = DEC_BYTELEVEL;
        else if (!strcmp(type, "ByteFallback")) op->kind = DEC_BYTEFALLBACK;
        else if (!strcmp(type, "Fuse")) op->kind = DEC_FUSE;
        else if (!strcmp(type, "Metaspace")) {
            op->kind = DEC_METASPACE;
            const char *r = json_str(it, "replacement");
            rc = parse_prepend(it, "decoder Metaspace", &op->prepend);
            if (rc == OG_OK) rc = dup(r ? r : "\xE2\x96\x81", &op->a);
        } else if (!strcmp(type, "Replace")) {
            op->kind = DEC_REPLACE;
            const char *c = json_str(it, "content");
            rc = load_pattern(it, "decoder Replace", &op->a, NULL);
            if (rc == OG_OK) rc = c ? dup(c, &op->b) : TOK_ERR(OG_ERR_FORMAT, "decoder Replace has no \"content\"");
        } else if (!strcmp(type, "Strip")) {
            op->kind = DEC_STRIP;
            const char *c = json_str(it, "content");
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "start"),
                        *e = cJSON_GetObjectItemCaseSensitive(it, "stop");
            if (!c || !cJSON_IsNumber(s) || !cJSON_IsNumber(e) || s->valuedouble < 0 || e->valuedouble < 0 ||
                s->valuedouble > 1e6 || e->valuedouble > 1e6)
                rc = TOK_ERR(OG_ERR_FORMAT, "decoder Strip needs \"content\", \"start\" and \"stop\"");
            else {
                op->start = s->valueint;
                op->stop = e->valueint;
                rc = dup(c, &op->a);
            }
            /* After Fuse (or ByteLevel, which joins the tokens too) Strip
             * acts on the whole text: a stream cannot know where the text
             * ends (stop) nor strip more than the one leading character its
             * context repeats (start), so its text would differ from a whole
             * decode. Published tokenizers strip one leading space. */
            bool joined = false;
            for (int j = 0; j < i; j++) joined = joined || t->dec[j].kind == DEC_FUSE || t->dec[j].kind == DEC_BYTELEVEL;
            if (rc == OG_OK && joined && (op->start > 1 || op->stop > 0))
                rc = TOK_ERR(OG_ERR_UNSUPPORTED,
                             "decoder Strip after Fuse with start %d, stop %d (only start 0 or 1 and stop 0)",
                             op->start, op->stop);
        } else if (!strcmp(type, "WordPiece")) {
            op->kind = DEC_WORDPIECE;
            const char *p = json_str(it, "prefix");
            op->cleanup = json_bool(it, "cleanup", 1);
            rc = dup(p ? p : "##", &op->a);
        } else
            rc = TOK_ERR(OG_ERR_UNSUPPORTED, "decoder type \"%s\" is not supported", type);
    }
    og_free(items);
    return rc;
}

/* Sets text[id]; the id table grows as needed. */
static og_status set_token(og_tokenizer *t, int64_t id, const char *s, const char *where) {
    if (id < 0 || id > (1 << 24)) return TOK_ERR(OG_ERR_FORMAT, "%s: id %lld out of range", where, (long long)id);
    if (id >= t->n_ids) {
        int32_t n = t->n_ids ? t->n_ids : 256;
        while (n <= id) n *= 2;
        char **p = og_realloc(t->text, (size_t)n * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        memset(p + t->n_ids, 0, (size_t)(n - t->n_ids) * sizeof *p);
        t->text = p;
        t->n_ids = n;
    }
    if (t->text[id] && strcmp(t->text[id], s))
        return TOK_ERR(OG_ERR_FORMAT, "%s: id %lld is both \"%s\" and \"%s\"", where, (long long)id, t->text[id], s);
    if (!t->text[id]) return dup(s, &t->text[id]);
    return OG_OK;
}

/* Sizes the vocabulary map for n entries. */
static og_status map_init(og_tokenizer *t, size_t n) {
    t->vocab.cap = 16;
    while (t->vocab.cap < n * 2) t->vocab.cap *= 2;
    if (!(t->vocab.slot = og_malloc(t->vocab.cap * sizeof *t->vocab.slot)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    memset(t->vocab.slot, 0xff, t->vocab.cap * sizeof *t->vocab.slot);
    return OG_OK;
}

/* The byte tokens <0x00>..<0xFF> of the vocabulary (-1 where absent). */
static void find_byte_tokens(og_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = map_get(t, name, 6);
    }
}

static int32_t trie_child(const trie *tr, int32_t node, unsigned char c) {
    uint64_t k = ((uint64_t)node << 8) | c;
    size_t mask = tr->cap - 1;
    for (size_t i = (k * 0x9E3779B97F4A7C15ull >> 17) & mask;; i = (i + 1) & mask) {
        if (tr->key[i] == k) return tr->child[i];
        if (tr->key[i] == UINT64_MAX) return -1;
    }
}

/* Builds the trie of the entries text[0..n) (total_bytes of text in all);
 * an entry's node holds the id the vocabulary map gives its text (so an
 * entry given twice ends where the map says). */
static og_status trie_build(og_tokenizer *t, int32_t n, size_t total_bytes) {
    trie *tr = &t->pieces;
    tr->cap = 16;
    while (tr->cap < total_bytes * 2 + 2) tr->cap *= 2;
    tr->key = og_malloc(tr->cap * sizeof *tr->key);
    tr->child = og_malloc(tr->cap * sizeof *tr->child);
    tr->term = og_malloc((total_bytes + 1) * sizeof *tr->term);
    if (!tr->key || !tr->child || !tr->term) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    memset(tr->key, 0xff, tr->cap * sizeof *tr->key);
    tr->term[0] = -1;
    tr->n_nodes = 1;
    for (int32_t id = 0; id < n; id++) {
        const unsigned char *p = (const unsigned char *)t->text[id];
        if (!p) continue;
        int32_t node = 0;
        for (; *p; p++) {
            int32_t c = trie_child(tr, node, *p);
            if (c < 0) {
                uint64_t k = ((uint64_t)node << 8) | *p;
                size_t mask = tr->cap - 1, i = (k * 0x9E3779B97F4A7C15ull >> 17) & mask;
                while (tr->key[i] != UINT64_MAX) i = (i + 1) & mask;
                c = tr->n_nodes++;
                tr->key[i] = k;
                tr->child[i] = c;
                tr->term[c] = -1;
            }
            node = c;
        }
        if (node) tr->term[node] = map_get(t, t->text[id], (size_t)(p - (const unsigned char *)t->text[id]));
        /* (the empty entry matches nothing) */
    }
    return OG_OK;
}

/* model.type "Unigram": "vocab" [[piece, score], ...] (the id is the index),
 * "unk_id", "byte_fallback". */
static og_status load_unigram(og_tokenizer *t, const cJSON *m) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id"),
                *it;
    if (!cJSON_IsArray(vocab)) return TOK_ERR(OG_ERR_FORMAT, "model (Unigram) has no \"vocab\" array");
    int n = cJSON_GetArraySize(vocab);
    t->byte_fallback = json_bool(m, "byte_fallback", 0);
    t->unk = -1;
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsNumber(unk) || unk->valuedouble < 0 || unk->valuedouble >= n || unk->valuedouble != (int)unk->valuedouble)
            return TOK_ERR(OG_ERR_FORMAT, "model.unk_id is not the index of a piece of model.vocab (%d pieces)", n);
        t->unk = (int32_t)unk->valuedouble;
    }
    if (n > (1 << 24)) return TOK_ERR(OG_ERR_FORMAT, "model.vocab has %d pieces (at most 2^24)", n);
    if (n && !(t->score = og_malloc((size_t)n * sizeof *t->score)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->min_score = INFINITY;
    size_t total = 0;
    int32_t id = 0;
    cJSON_ArrayForEach(it, vocab) {
        const cJSON *piece = cJSON_GetArrayItem(it, 0), *score = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsString(piece) || !cJSON_IsNumber(score))
            return TOK_ERR(OG_ERR_FORMAT, "model.vocab[%d] is not [\"piece\", score]", id);
        OG_TRY(set_token(t, id, piece->valuestring, "model.vocab"));
        t->score[id] = score->valuedouble;
        if (score->valuedouble < t->min_score) t->min_score = score->valuedouble;
        total += strlen(piece->valuestring);
        id++;
    }
    OG_TRY(map_init(t, (size_t)n));
    for (int32_t i = n - 1; i >= 0; i--) /* the last of a repeated piece wins */
        if (map_get(t, t->text[i], strlen(t->text[i])) < 0) map_put(t, i);
    find_byte_tokens(t);
    return trie_build(t, n, total);
}

/* model.type "WordPiece": "vocab" {token: id}, "unk_token",
 * "continuing_subword_prefix", "max_input_chars_per_word". */
static og_status load_wordpiece(og_tokenizer *t, const cJSON *m) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *it,
                *maxc = cJSON_GetObjectItemCaseSensitive(m, "max_input_chars_per_word");
    if (!cJSON_IsObject(vocab)) return TOK_ERR(OG_ERR_FORMAT, "model (WordPiece) has no \"vocab\" object");
    const char *unk = json_str(m, "unk_token"), *prefix = json_str(m, "continuing_subword_prefix");
    t->wp_max_chars = 100;
    if (maxc && !cJSON_IsNull(maxc)) {
        if (!cJSON_IsNumber(maxc) || maxc->valuedouble < 0)
            return TOK_ERR(OG_ERR_FORMAT, "model.max_input_chars_per_word is not a count");
        t->wp_max_chars = maxc->valuedouble > 1e15 ? (int64_t)1e15 : (int64_t)maxc->valuedouble;
    }
    OG_TRY(dup(prefix ? prefix : "##", &t->wp_prefix));
    int n = cJSON_GetArraySize(vocab);
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it)) return TOK_ERR(OG_ERR_FORMAT, "model.vocab[\"%s\"] is not a number", it->string);
        OG_TRY(set_token(t, (int64_t)it->valuedouble, it->string, "model.vocab"));
    }
    OG_TRY(map_init(t, (size_t)n));
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = (int32_t)it->valuedouble;
        if (map_get(t, it->string, strlen(it->string)) < 0) map_put(t, id);
    }
    /* a missing unk token is an error only when a word needs it, as in HF */
    const char *u = unk ? unk : "[UNK]";
    t->unk = map_get(t, u, strlen(u));
    size_t total = 0;
    for (int32_t id = 0; id < t->n_ids; id++) total += t->text[id] ? strlen(t->text[id]) : 0;
    return trie_build(t, t->n_ids, total);
}

static og_status load_bpe(og_tokenizer *t, const cJSON *m);

static og_status load_model(og_tokenizer *t, const cJSON *m) {
    const char *type = json_str(m, "type");
    if (type && !strcmp(type, "BPE")) {
        t->model = MODEL_BPE;
        return load_bpe(t, m);
    }
    if (type && !strcmp(type, "Unigram")) {
        t->model = MODEL_UNIGRAM;
        return load_unigram(t, m);
    }
    if (type && !strcmp(type, "WordPiece")) {
        t->model = MODEL_WORDPIECE;
        return load_wordpiece(t, m);
    }
    return TOK_ERR(OG_ERR_UNSUPPORTED, "model type \"%s\" is not supported (BPE, Unigram and WordPiece are)",
                   type ? type : "(none)");
}

static og_status load_bpe(og_tokenizer *t, const cJSON *m) {
    const char *cont = json_str(m, "continuing_subword_prefix"), *eow = json_str(m, "end_of_word_suffix");
    if ((cont && *cont) || (eow && *eow))
        return TOK_ERR(OG_ERR_UNSUPPORTED, "model: continuing_subword_prefix / end_of_word_suffix are not supported");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return TOK_ERR(OG_ERR_UNSUPPORTED, "model: BPE dropout is not supported");
    t->byte_fallback = json_bool(m, "byte_fallback", 0);
    t->fuse_unk = json_bool(m, "fuse_unk", 0);
    t->ignore_merges = json_bool(m, "ignore_merges", 0);

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *it;
    if (!cJSON_IsObject(vocab)) return TOK_ERR(OG_ERR_FORMAT, "model has no \"vocab\" object");
    int n = cJSON_GetArraySize(vocab);
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it)) return TOK_ERR(OG_ERR_FORMAT, "model.vocab[\"%s\"] is not a number", it->string);
        og_status rc = set_token(t, (int64_t)it->valuedouble, it->string, "model.vocab");
        if (rc) return rc;
    }
    OG_TRY(map_init(t, (size_t)n));
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = (int32_t)it->valuedouble;
        if (map_get(t, it->string, strlen(it->string)) < 0) map_put(t, id);
    }

    const char *unk = json_str(m, "unk_token");
    t->unk = unk ? map_get(t, unk, strlen(unk)) : -1;
    if (unk && t->unk < 0) return TOK_ERR(OG_ERR_FORMAT, "model.unk_token \"%s\" is not in the vocabulary", unk);
    find_byte_tokens(t);

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsArray(merges)) return TOK_ERR(OG_ERR_FORMAT, "model has no \"merges\" array");
    int nm = cJSON_GetArraySize(merges);
    t->merges.cap = 16;
    while (t->merges.cap < (size_t)nm * 2) t->merges.cap *= 2;
    if (!(t->merges.slot = og_malloc(t->merges.cap * sizeof *t->merges.slot)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (size_t i = 0; i < t->merges.cap; i++) t->merges.slot[i].key = UINT64_MAX;
    int32_t rank = 0;
    buf joined = {0};
    og_status rc = OG_OK;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
            cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else if (cJSON_IsString(it) && strchr(it->valuestring, ' ')) {
            a = it->valuestring;
            b = strchr(a, ' ') + 1;
            na = (size_t)(b - 1 - a);
            nb = strlen(b);
        } else {
            rc = TOK_ERR(OG_ERR_FORMAT, "model.merges[%d] is neither [\"a\", \"b\"] nor \"a b\"", rank);
            break;
        }
        int32_t ia = map_get(t, a, na), ib = map_get(t, b, nb);
        joined.n = 0;
        if ((rc = buf_put(&joined, a, na)) || (rc = buf_put(&joined, b, nb))) break;
        int32_t im = map_get(t, joined.p, joined.n);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = TOK_ERR(OG_ERR_FORMAT, "model.merges[%d] (\"%.*s\" \"%.*s\") uses a token not in the vocabulary",
                         rank, (int)na, a, (int)nb, b);
            break;
        }
        uint64_t k = pair_key(ia, ib);
        size_t mask = t->merges.cap - 1, i = (k * 0x9E3779B97F4A7C15ull >> 17) & mask;
        while (t->merges.slot[i].key != UINT64_MAX && t->merges.slot[i].key != k) i = (i + 1) & mask;
        if (t->merges.slot[i].key == UINT64_MAX) /* the first (lowest) rank wins */
            t->merges.slot[i] = (pair_entry){k, rank, im};
        rank++;
    }
    og_free(joined.p);
    return rc;
}

static int added_cmp(const void *a, const void *b) {
    const added_token *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

static og_status normalize(const og_tokenizer *t, buf *b);

/* Indexes the added tokens (normalized or not) by their pattern's first
 * byte, longest pattern first. */
static og_status added_set_build(og_tokenizer *t, added_set *set, int normalized) {
    for (int32_t k = 0; k < t->n_added; k++) {
        const added_token *a = &t->added[k];
        if (a->normalized != normalized) continue;
        unsigned char c = (unsigned char)a->pat[0];
        int32_t *p = og_realloc(set->by_byte[c], (size_t)(set->n_by_byte[c] + 1) * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        set->by_byte[c] = p;
        int32_t j = set->n_by_byte[c]++;
        while (j > 0 && t->added[p[j - 1]].pat_len < a->pat_len) { /* insertion: longest first, stable */
            p[j] = p[j - 1];
            j--;
        }
        p[j] = k;
    }
    return OG_OK;
}

/* "added_tokens": [{"id", "content", "special", "lstrip", "rstrip",
 * "single_word", "normalized"}]. A normalized token is matched after the
 * normalizer, as its content through the normalizer. */
static og_status load_added(og_tokenizer *t, const cJSON *arr) {
    if (!arr || cJSON_IsNull(arr)) return OG_OK;
    if (!cJSON_IsArray(arr)) return TOK_ERR(OG_ERR_FORMAT, "\"added_tokens\" is not an array");
    int n = cJSON_GetArraySize(arr);
    if (n && !(t->added = og_calloc((size_t)n, sizeof *t->added)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *content = json_str(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        int k = t->n_added;
        if (!content || !*content || !cJSON_IsNumber(id))
            return TOK_ERR(OG_ERR_FORMAT, "added_tokens[%d] needs a non-empty \"content\" and an \"id\"", k);
        OG_TRY(set_token(t, (int64_t)id->valuedouble, content, "added_tokens"));
        int special = json_bool(it, "special", 0);
        added_token *a = &t->added[k];
        *a = (added_token){t->text[(int64_t)id->valuedouble], strlen(content), (int32_t)id->valuedouble, special,
                           json_bool(it, "lstrip", 0), json_bool(it, "rstrip", 0), json_bool(it, "single_word", 0),
                           json_bool(it, "normalized", !special), NULL, 0};
        t->n_added++;
        buf pat = {0};
        og_status rc = buf_put(&pat, content, a->len);
        if (rc == OG_OK && a->normalized) rc = normalize(t, &pat);
        a->pat = pat.p;
        a->pat_len = pat.n;
        if (rc != OG_OK) return rc;
        if (!a->pat_len)
            return TOK_ERR(OG_ERR_UNSUPPORTED, "added_tokens[%d] \"%s\" is normalized and the normalizer leaves nothing of it", k,
                           content);
    }
    if (t->n_added) qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    for (int32_t k = 0; k < t->n_added; k++) {
        const added_token *a = &t->added[k];
        if (!a->normalized || (a->pat_len == a->len && !memcmp(a->pat, a->text, a->len))) continue;
        if (!t->norm_dec_id) {
            t->norm_dec_id = og_malloc((size_t)t->n_added * sizeof *t->norm_dec_id);
            t->norm_dec_tok = og_malloc((size_t)t->n_added * sizeof *t->norm_dec_tok);
            if (!t->norm_dec_id || !t->norm_dec_tok) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        }
        int32_t j = t->n_norm_dec++; /* insertion by id */
        while (j > 0 && t->norm_dec_id[j - 1] > a->id) {
            t->norm_dec_id[j] = t->norm_dec_id[j - 1];
            t->norm_dec_tok[j] = t->norm_dec_tok[j - 1];
            j--;
        }
        t->norm_dec_id[j] = a->id;
        t->norm_dec_tok[j] = k;
    }
    OG_TRY(added_set_build(t, &t->added_raw, 0));
    return added_set_build(t, &t->added_norm, 1);
}

/* A processor that puts pre[0..n_pre) before and suf[0..n_suf) after what
 * the processors before it made: wraps the ids collected so far. */
static og_status wrap_post(og_tokenizer *t, const int32_t *pre, int n_pre, const int32_t *suf, int n_suf,
                           const char *type) {
    if (t->n_post_pre + n_pre > 8 || t->n_post_suf + n_suf > 8)
        return TOK_ERR(OG_ERR_UNSUPPORTED, "post_processor %s: more than 8 special tokens on a side", type);
    memmove(t->post_pre + n_pre, t->post_pre, (size_t)t->n_post_pre * sizeof *pre);
    memcpy(t->post_pre, pre, (size_t)n_pre * sizeof *pre);
    t->n_post_pre += n_pre;
    memcpy(t->post_suf + t->n_post_suf, suf, (size_t)n_suf * sizeof *suf);
    t->n_post_suf += n_suf;
    return OG_OK;
}

/* TemplateProcessing's "single" template: the ids of its special tokens
 * before and after sequence A. */
static og_status load_template(og_tokenizer *t, const cJSON *o) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"),
                *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens"), *it;
    if (!cJSON_IsArray(single)) return TOK_ERR(OG_ERR_FORMAT, "post_processor TemplateProcessing has no \"single\" list");
    int32_t pre[8], suf[8];
    int n_pre = 0, n_suf = 0, seen_a = 0;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const char *name = json_str(sp, "id");
        if (!name) return TOK_ERR(OG_ERR_FORMAT, "post_processor TemplateProcessing: an entry of \"single\" is neither Sequence nor SpecialToken");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name), "ids"), *v;
        if (!cJSON_IsArray(ids))
            return TOK_ERR(OG_ERR_FORMAT, "post_processor TemplateProcessing: special token \"%s\" has no ids", name);
        cJSON_ArrayForEach(v, ids) {
            int *n = seen_a ? &n_suf : &n_pre;
            int32_t *dst = seen_a ? suf : pre;
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX)
                return TOK_ERR(OG_ERR_FORMAT, "post_processor TemplateProcessing: special token \"%s\" has a bad id", name);
            if (*n == 8) return TOK_ERR(OG_ERR_UNSUPPORTED, "post_processor TemplateProcessing adds more than 8 tokens on a side");
            dst[(*n)++] = (int32_t)v->valuedouble;
        }
    }
    return wrap_post(t, pre, n_pre, suf, n_suf, "TemplateProcessing");
}

/* BertProcessing / RobertaProcessing: {"sep": [text, id], "cls": [text, id]};
 * a single sequence becomes cls A sep. */
static og_status load_cls_sep(og_tokenizer *t, const cJSON *o, const char *type) {
    int32_t id[2];
    static const char *const keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, keys[k]), 1);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX)
            return TOK_ERR(OG_ERR_FORMAT, "post_processor %s: \"%s\" is not a [text, id] pair", type, keys[k]);
        id[k] = (int32_t)v->valuedouble;
    }
    return wrap_post(t, &id[0], 1, &id[1], 1, type);
}

static og_status load_post_processor(og_tokenizer *t, const cJSON *o) {
    const char *type = json_str(o, "type");
    if (!type) return TOK_ERR(OG_ERR_FORMAT, "post_processor has no type");
    if (!strcmp(type, "TemplateProcessing")) return load_template(t, o);
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) return load_cls_sep(t, o, type);
    if (!strcmp(type, "ByteLevel")) return OG_OK; /* offsets only: adds no token */
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "processors")) OG_TRY(load_post_processor(t, it));
        return OG_OK;
    }
    /* loaded, but encoding with special tokens added is refused by name */
    snprintf(t->post_unsupported, sizeof t->post_unsupported, "%s", type);
    return OG_OK;
}

og_status og_tokenizer_load_json(const char *json, og_tokenizer **out) {
    if (!json || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_load_json: NULL argument");
    *out = NULL;
    byte_table_init();
    /* every string must be valid UTF-8, as JSON (and HF's reader) requires:
     * token texts, patterns and normalizer text are worked on as characters */
    const unsigned char *u = (const unsigned char *)json;
    for (size_t i = 0, n = strlen(json), bad; i < n;) {
        size_t l = utf8_seq(u + i, n - i, &bad);
        if (!l) return TOK_ERR(OG_ERR_FORMAT, "not valid UTF-8 (at byte %zu)", i);
        i += l;
    }
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return TOK_ERR(OG_ERR_FORMAT, "not a JSON object");
    }
    og_tokenizer *t = og_calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    t->bos = -1;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder"),
                *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    og_status rc = OG_OK;
    if (!cJSON_IsObject(model)) rc = TOK_ERR(OG_ERR_FORMAT, "no \"model\" object");
    if (rc == OG_OK) rc = load_model(t, model);
    if (rc == OG_OK && cJSON_IsObject(norm)) rc = load_normalizer(t, norm);
    if (rc == OG_OK && cJSON_IsObject(pre)) rc = load_pre_tokenizer(t, pre);
    if (rc == OG_OK && cJSON_IsObject(dec)) rc = load_decoder(t, dec);
    else t->n_dec = -1;
    if (rc == OG_OK) rc = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (rc == OG_OK && cJSON_IsObject(post)) rc = load_post_processor(t, post);
    cJSON_Delete(root);
    if (rc != OG_OK) {
        og_tokenizer_destroy(t);
        return rc;
    }
    /* the id table ends at the largest id in use */
    while (t->n_ids > 0 && !t->text[t->n_ids - 1]) t->n_ids--;
    for (int i = 0; i < t->n_post_pre + t->n_post_suf; i++) {
        int32_t id = i < t->n_post_pre ? t->post_pre[i] : t->post_suf[i - t->n_post_pre];
        if (id >= t->n_ids || !t->text[id]) {
            og_tokenizer_destroy(t);
            return TOK_ERR(OG_ERR_FORMAT, "post_processor adds id %d, which is not a token", id);
        }
    }
    *out = t;
    return OG_OK;
}

void og_tokenizer_destroy(og_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_ids; i++) og_free(t->text[i]);
    og_free(t->text);
    og_free(t->vocab.slot);
    og_free(t->merges.slot);
    for (int32_t i = 0; i < t->n_added; i++) og_free(t->added[i].pat);
    og_free(t->added);
    for (int c = 0; c < 256; c++) {
        og_free(t->added_raw.by_byte[c]);
        og_free(t->added_norm.by_byte[c]);
    }
    og_free(t->norm_dec_id);
    og_free(t->norm_dec_tok);
    og_free(t->score);
    og_free(t->pieces.key);
    og_free(t->pieces.child);
    og_free(t->pieces.term);
    og_free(t->wp_prefix);
    for (int i = 0; i < t->n_norm; i++) {
        og_free(t->norm[i].a);
        og_free(t->norm[i].b);
    }
    og_free(t->norm);
    for (int i = 0; i < t->n_pre; i++) {
        pcre2_code_free(t->pre[i].re);
        og_free(t->pre[i].literal);
    }
    og_free(t->pre);
    for (int i = 0; i < t->n_dec; i++) {
        og_free(t->dec[i].a);
        og_free(t->dec[i].b);
    }
    og_free(t->dec);
    og_free(t->eos);
    og_free(t->chat_template);
    og_free(t);
}

/* A token named in tokenizer_config.json: "text" or {"content": "text"}. */
static og_status config_token(og_tokenizer *t, const cJSON *cfg, const char *key, int32_t *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : json_str(v, "content");
    *id = -1;
    if (!s) return OG_OK;
    *id = og_tokenizer_token_id(t, s);
    if (*id < 0)
        return og_set_error(OG_ERR_FORMAT, "tokenizer_config.json: %s \"%s\" is not a token of tokenizer.json", key, s);
    return OG_OK;
}

og_status og_tokenizer_load_config(og_tokenizer *t, const char *config_json) {
    if (!t) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_load_config: NULL tokenizer");
    if (!config_json || !*config_json) return OG_OK;
    cJSON *cfg = cJSON_Parse(config_json);
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return og_set_error(OG_ERR_FORMAT, "tokenizer_config.json: not a JSON object");
    }
    int32_t eos, bos;
    og_status rc = config_token(t, cfg, "eos_token", &eos);
    if (rc == OG_OK) rc = config_token(t, cfg, "bos_token", &bos);
    if (rc == OG_OK && eos >= 0) rc = og_tokenizer_add_eos(t, eos);
    if (rc == OG_OK) t->bos = bos;
    /* add_bos_token / add_eos_token are not read: the special tokens a
     * prompt gets are tokenizer.json's post_processor's alone, as
     * transformers 5 gives them (docs/decisions.md) */
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *it;
    const char *text = cJSON_IsString(tpl) ? tpl->valuestring : NULL;
    if (cJSON_IsArray(tpl)) /* [{"name": "default", "template": ...}, ...] */
        cJSON_ArrayForEach(it, tpl) {
            const char *name = json_str(it, "name");
            if (name && !strcmp(name, "default")) text = json_str(it, "template");
        }
    if (rc == OG_OK && text) {
        og_free(t->chat_template);
        rc = dup(text, &t->chat_template);
    }
    cJSON_Delete(cfg);
    return rc;
}

int32_t og_tokenizer_vocab_size(const og_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t og_tokenizer_token_id(const og_tokenizer *t, const char *text) {
    if (!t || !text) return -1;
    for (int32_t i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].text, text)) return t->added[i].id;
    return map_get(t, text, strlen(text));
}

const char *og_tokenizer_token_text(const og_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids ? t->text[id] : NULL;
}

int og_tokenizer_is_special(const og_tokenizer *t, int32_t id) {
    for (int32_t i = 0; t && i < t->n_added; i++)
        if (t->added[i].id == id) return t->added[i].special;
    return 0;
}

int32_t og_tokenizer_eos_ids(const og_tokenizer *t, const int32_t **ids) {
    *ids = t->eos;
    return t->n_eos;
}

og_status og_tokenizer_add_eos(og_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids) return og_set_error(OG_ERR_INVALID_ARGUMENT, "eos id %d is not a token", id);
    for (int32_t i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return OG_OK;
    int32_t *p = og_realloc(t->eos, (size_t)(t->n_eos + 1) * sizeof *p);
    if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->eos = p;
    p[t->n_eos++] = id;
    return OG_OK;
}

int32_t og_tokenizer_bos_id(const og_tokenizer *t) { return t->bos; }
const char *og_tokenizer_chat_template(const og_tokenizer *t) { return t->chat_template; }

/* ------------------------------------------------------------ encoding */

/* A piece of text on its way through the pre-tokenizers. */
typedef struct piece {
    size_t off, len; /* in the owning pieces' arena */
    int at_start;    /* begins at offset 0 of the original input */
} piece;

typedef struct pieces {
    buf arena;
    piece *p;
    size_t n, cap;
} pieces;

static og_status pieces_add(pieces *ps, const char *s, size_t len, int at_start) {
    if (!len) return OG_OK;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        piece *p = og_realloc(ps->p, cap * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        ps->p = p;
        ps->cap = cap;
    }
    ps->p[ps->n++] = (piece){ps->arena.n, len, at_start};
    return buf_put(&ps->arena, s, len);
}

static void pieces_free(pieces *ps) {
    og_free(ps->arena.p);
    og_free(ps->p);
}

/* Appends every occurrence of literal lit (or every match of re) in s as
 * [start, end) pairs to *m. */
static og_status find_matches(const pre_op *op, const char *lit, const char *s, size_t n, size_t **m, size_t *nm) {
    size_t cap = 0, pos = 0;
    pcre2_match_data *md = op && op->re ? pcre2_match_data_create_from_pattern(op->re, NULL) : NULL;
    if (op && op->re && !md) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    size_t litn = lit ? strlen(lit) : 0;
    og_status rc = OG_OK;
    *nm = 0;
    while (pos < n) {
        size_t ms, me;
        if (md) {
            int r = pcre2_match(op->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (r == PCRE2_ERROR_NOMATCH) break;
            if (r < 0) {
                rc = og_set_error(OG_ERR_UNSUPPORTED, "tokenizer: regex match failed (PCRE2 error %d)", r);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        } else {
            const char *f = memmem(s + pos, n - pos, lit, litn);
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + litn;
        }
        if (me == ms) { /* an empty match splits nothing */
            pos = ms + utf8_len((unsigned char)s[ms]);
            continue;
        }
        if (*nm + 2 > cap) {
            cap = cap ? cap * 2 : 32;
            size_t *p = og_realloc(*m, cap * sizeof *p);
            if (!p) {
                rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
                break;
            }
            *m = p;
        }
        (*m)[(*nm)++] = ms;
        (*m)[(*nm)++] = me;
        pos = me;
    }
    pcre2_match_data_free(md);
    return rc;
}

/* Splits piece s (at_start as given) at the matches m into out. */
static og_status split_piece(pieces *out, const char *s, size_t n, int at_start, const size_t *m, size_t nm,
                             split_behavior b) {
    size_t prev = 0;
    og_status rc = OG_OK;
    for (size_t i = 0; i < nm && rc == OG_OK; i += 2) {
        size_t ms = m[i], me = m[i + 1];
        switch (b) {
        case SPLIT_ISOLATED:
            rc = pieces_add(out, s + prev, ms - prev, at_start && prev == 0);
            if (rc == OG_OK) rc = pieces_add(out, s + ms, me - ms, at_start && ms == 0);
            prev = me;
            break;
        case SPLIT_REMOVED:
            rc = pieces_add(out, s + prev, ms - prev, at_start && prev == 0);
            prev = me;
            break;
        case SPLIT_MERGED_PREV:
            rc = pieces_add(out, s + prev, me - prev, at_start && prev == 0);
            prev = me;
            break;
        case SPLIT_MERGED_NEXT:
            rc = pieces_add(out, s + prev, ms - prev, at_start && prev == 0);
            prev = ms;
            break;
        }
    }
    return rc == OG_OK ? pieces_add(out, s + prev, n - prev, at_start && prev == 0) : rc;
}

/* Runs one pre-tokenizer over every piece of *ps. */
static og_status pre_apply(const pre_op *op, pieces *ps) {
    pieces out = {0};
    buf tmp = {0};
    size_t *m = NULL, nm = 0;
    og_status rc = OG_OK;
    for (size_t i = 0; i < ps->n && rc == OG_OK; i++) {
        const char *s = ps->arena.p + ps->p[i].off;
        size_t n = ps->p[i].len;
        int at_start = ps->p[i].at_start;
        tmp.n = 0;
        if (op->kind == PRE_BYTELEVEL) {
            if (op->add_prefix_space && s[0] != ' ') rc = buf_putc(&tmp, ' ');
            if (rc == OG_OK) rc = buf_put(&tmp, s, n);
            if (rc == OG_OK && op->use_regex) rc = find_matches(op, NULL, tmp.p, tmp.n, &m, &nm);
            else nm = 0;
            if (rc != OG_OK) break;
            /* split, then map each byte of each part to its printable character */
            size_t mark = out.n;
            if (op->use_regex) rc = split_piece(&out, tmp.p, tmp.n, at_start, m, nm, SPLIT_ISOLATED);
            else rc = pieces_add(&out, tmp.p, tmp.n, at_start);
            for (size_t k = mark; k < out.n && rc == OG_OK; k++) {
                buf mapped = {0};
                const unsigned char *u = (const unsigned char *)out.arena.p + out.p[k].off;
                for (size_t j = 0; j < out.p[k].len && rc == OG_OK; j++) rc = buf_put_cp(&mapped, k_byte_cp[u[j]]);
                if (rc == OG_OK) {
                    out.p[k].off = out.arena.n;
                    out.p[k].len = mapped.n;
                    rc = buf_put(&out.arena, mapped.p, mapped.n);
                }
                og_free(mapped.p);
            }
        } else if (op->kind == PRE_SPLIT) {
            rc = find_matches(op, op->literal, s, n, &m, &nm);
            if (rc == OG_OK) rc = split_piece(&out, s, n, at_start, m, nm, op->behavior);
        } else if (op->kind == PRE_BERT || op->kind == PRE_WHITESPACE_SPLIT) {
            /* whitespace removed; for BERT each punctuation character alone */
            const unsigned char *u = (const unsigned char *)s;
            size_t word = 0, cl;
            for (size_t j = 0; j < n && rc == OG_OK; j += cl) {
                uint32_t c = utf8_cp(u + j, &cl);
                int white = is_white_space(c), punct = !white && op->kind == PRE_BERT && is_bert_punct(c);
                if (!white && !punct) continue;
                rc = pieces_add(&out, s + word, j - word, at_start && word == 0);
                if (rc == OG_OK && punct) rc = pieces_add(&out, s + j, cl, at_start && j == 0);
                word = j + cl;
            }
            if (rc == OG_OK) rc = pieces_add(&out, s + word, n - word, at_start && word == 0);
        } else if (op->kind == PRE_WHITESPACE) {
            /* the matches of \w+|[^\w\s]+: runs of word characters, runs of
             * other characters that are not whitespace; whitespace removed */
            const unsigned char *u = (const unsigned char *)s;
            size_t run = 0, cl;
            int kind = 0; /* of the current run: 0 none, 1 word, 2 other */
            for (size_t j = 0; j < n && rc == OG_OK; j += cl) {
                uint32_t c = utf8_cp(u + j, &cl);
                int k = is_word_char(c) ? 1 : is_white_space(c) ? 0 : 2;
                if (k == kind) continue;
                if (kind) rc = pieces_add(&out, s + run, j - run, at_start && run == 0);
                kind = k;
                run = j;
            }
            if (rc == OG_OK && kind) rc = pieces_add(&out, s + run, n - run, at_start && run == 0);
        } else { /* PRE_METASPACE */
            const char *rep = op->literal;
            size_t rn = strlen(rep);
            int starts = n >= rn && !memcmp(s, rep, rn);
            /* a leading space becomes the replacement too */
            if (!starts && s[0] == ' ' && rn) starts = 1;
            if (!starts && (op->prepend == PREPEND_ALWAYS || (op->prepend == PREPEND_FIRST && at_start)))
                rc = buf_put(&tmp, rep, rn);
            for (size_t j = 0; j < n && rc == OG_OK; j++)
                rc = s[j] == ' ' ? buf_put(&tmp, rep, rn) : buf_putc(&tmp, s[j]);
            if (rc != OG_OK) break;
            if (op->split) {
                rc = find_matches(NULL, rep, tmp.p, tmp.n, &m, &nm);
                if (rc == OG_OK) rc = split_piece(&out, tmp.p, tmp.n, at_start, m, nm, SPLIT_MERGED_NEXT);
            } else
                rc = pieces_add(&out, tmp.p, tmp.n, at_start);
        }
    }
    og_free(tmp.p);
    og_free(m);
    if (rc != OG_OK) {
        pieces_free(&out);
        return rc;
    }
    pieces_free(ps);
    *ps = out;
    return OG_OK;
}

/* Replaces every occurrence of pat in b by rep. */
static og_status replace_all(buf *b, const char *pat, const char *rep) {
    size_t pn = strlen(pat), rn = strlen(rep), pos = 0;
    if (!pn || !b->n) return OG_OK;
    buf out = {0};
    og_status rc = OG_OK;
    while (rc == OG_OK) {
        const char *f = memmem(b->p + pos, b->n - pos, pat, pn);
        size_t end = f ? (size_t)(f - b->p) : b->n;
        rc = buf_put(&out, b->p + pos, end - pos);
        if (!f) break;
        if (rc == OG_OK) rc = buf_put(&out, rep, rn);
        pos = end + pn;
    }
    if (rc != OG_OK) {
        og_free(out.p);
        return rc;
    }
    og_free(b->p);
    *b = out;
    if (!b->p) return buf_put(b, "", 0);
    return OG_OK;
}

static og_status put_lower(buf *b, uint32_t c) {
    if (c == 0x130) return buf_put(b, "i\xCC\x87", 3);
    return buf_put_cp(b, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
}

/* One of the Unicode normal forms (utf8proc options), in place. */
static og_status unicode_form(buf *b, int opt) {
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)b->p, (utf8proc_ssize_t)b->n, &res, UTF8PROC_STABLE | opt);
    if (n < 0) return og_set_error(OG_ERR_INVALID_ARGUMENT, "tokenizer: normalization failed: %s", utf8proc_errmsg(n));
    b->n = 0;
    og_status rc = buf_put(b, res, (size_t)n);
    free(res);
    return rc;
}

/* The code-point-wise normalizers (Lowercase, Strip, StripAccents,
 * BertNormalizer's steps) from b into out. b is valid UTF-8. */
static og_status map_chars(const norm_op *op, int step, const buf *b, buf *out) {
    const unsigned char *u = (const unsigned char *)b->p;
    size_t a = 0, e = b->n, cl;
    og_status rc = OG_OK;
    if (op->kind == NORM_STRIP) { /* White_Space at either end */
        while (op->left && a < e && is_white_space(utf8_cp(u + a, &cl))) a += cl;
        while (op->right && e > a) {
            size_t s = e - 1;
            while (s > a && (u[s] & 0xC0) == 0x80) s--;
            if (!is_white_space(utf8_cp(u + s, &cl))) break;
            e = s;
        }
        return buf_put(out, b->p + a, e - a);
    }
    for (size_t i = a; i < e && rc == OG_OK; i += cl) {
        uint32_t c = utf8_cp(u + i, &cl);
        if (op->kind == NORM_LOWERCASE || (op->kind == NORM_BERT && step == 3)) rc = put_lower(out, c);
        else if (op->kind == NORM_STRIP_ACCENTS) {
            if (!is_mark(c)) rc = buf_put(out, b->p + i, cl);
        } else if (step == 0) { /* clean text: drop NUL, U+FFFD and controls; whitespace becomes a space */
            if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
            rc = is_white_space(c) ? buf_putc(out, ' ') : buf_put(out, b->p + i, cl);
        } else if (step == 1) { /* a space either side of CJK ideographs */
            if (is_chinese_char(c)) {
                rc = buf_putc(out, ' ');
                if (rc == OG_OK) rc = buf_put(out, b->p + i, cl);
                if (rc == OG_OK) rc = buf_putc(out, ' ');
            } else
                rc = buf_put(out, b->p + i, cl);
        } else { /* step 2, after NFD: drop nonspacing marks */
            if (category(c) != UTF8PROC_CATEGORY_MN) rc = buf_put(out, b->p + i, cl);
        }
    }
    return rc;
}

/* Runs map_chars into a new buffer that replaces *b. */
static og_status map_in_place(const norm_op *op, int step, buf *b) {
    buf out = {0};
    og_status rc = buf_put(&out, "", 0);
    if (rc == OG_OK) rc = map_chars(op, step, b, &out);
    if (rc != OG_OK) {
        og_free(out.p);
        return rc;
    }
    og_free(b->p);
    *b = out;
    return OG_OK;
}

static og_status normalize(const og_tokenizer *t, buf *b) {
    og_status rc = OG_OK;
    for (int i = 0; i < t->n_norm && rc == OG_OK && b->n; i++) {
        const norm_op *op = &t->norm[i];
        if (op->kind == NORM_NFC || op->kind == NORM_NFKC || op->kind == NORM_NFD || op->kind == NORM_NFKD) {
            int opt = op->kind == NORM_NFC || op->kind == NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
            if (op->kind == NORM_NFKC || op->kind == NORM_NFKD) opt |= UTF8PROC_COMPAT;
            rc = unicode_form(b, opt);
        } else if (op->kind == NORM_LOWERCASE || op->kind == NORM_STRIP || op->kind == NORM_STRIP_ACCENTS) {
            rc = map_in_place(op, 0, b);
        } else if (op->kind == NORM_BERT) {
            if (op->clean) rc = map_in_place(op, 0, b);
            if (rc == OG_OK && op->chinese) rc = map_in_place(op, 1, b);
            if (rc == OG_OK && op->accents) rc = unicode_form(b, UTF8PROC_DECOMPOSE);
            if (rc == OG_OK && op->accents) rc = map_in_place(op, 2, b);
            if (rc == OG_OK && op->lower) rc = map_in_place(op, 3, b);
        } else if (op->kind == NORM_PREPEND) {
            buf out = {0};
            rc = buf_put(&out, op->a, strlen(op->a));
            if (rc == OG_OK) rc = buf_put(&out, b->p, b->n);
            og_free(b->p);
            *b = out;
        } else
            rc = replace_all(b, op->a, op->b);
    }
    return rc;
}

typedef struct ids {
    int32_t *p;
    int64_t n, cap;
} ids;

static og_status ids_push(ids *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = og_realloc(v->p, (size_t)cap * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return OG_OK;
}

/* A candidate merge of the symbols at left and right (= next[left]), which
 * held ids a and b when it was queued. */
typedef struct merge_cand {
    int32_t rank;
    int64_t left, right;
    int32_t a, b;
} merge_cand;

/* Lowest rank first; the leftmost pair on ties (left indexes keep the
 * symbols' order, merged symbols keep their left index). */
static bool cand_before(const merge_cand *x, const merge_cand *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->left < y->left;
}

static void heap_push(merge_cand *h, int64_t *n, merge_cand c) {
    int64_t i = (*n)++;
    while (i > 0 && cand_before(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, int64_t *n) {
    merge_cand top = h[0], last = h[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Applies merges to sym until no adjacent pair has one: always the
 * lowest-ranked pair, the leftmost on ties, as Hugging Face BPE does. A heap
 * of candidate pairs over a linked list of symbols makes this O(n log n) in
 * the word's length (a rescan per merge would be quadratic, which a long
 * run of text without spaces turns into minutes). */
static og_status bpe_merge(const og_tokenizer *t, ids *sym) {
    const int64_t n = sym->n;
    int64_t *next = og_malloc((size_t)n * sizeof *next), *prev = og_malloc((size_t)n * sizeof *prev);
    merge_cand *heap = og_malloc((size_t)(2 * n) * sizeof *heap); /* each merge queues at most 2 */
    if (!next || !prev || !heap) {
        og_free(next), og_free(prev), og_free(heap);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    int64_t hn = 0;
    int32_t *id = sym->p;
    for (int64_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? i + 1 : -1;
        prev[i] = i - 1;
        const pair_entry *e = i + 1 < n ? pair_get(t, id[i], id[i + 1]) : NULL;
        if (e) heap_push(heap, &hn, (merge_cand){e->rank, i, i + 1, id[i], id[i + 1]});
    }
    while (hn > 0) {
        merge_cand c = heap_pop(heap, &hn);
        /* stale: a neighbour was merged away or changed since it was queued */
        if (id[c.left] != c.a || next[c.left] != c.right || id[c.right] != c.b) continue;
        id[c.left] = pair_get(t, c.a, c.b)->merged;
        id[c.right] = -1; /* removed */
        next[c.left] = next[c.right];
        if (next[c.right] >= 0) prev[next[c.right]] = c.left;
        const pair_entry *e;
        if (prev[c.left] >= 0 && (e = pair_get(t, id[prev[c.left]], id[c.left])))
            heap_push(heap, &hn, (merge_cand){e->rank, prev[c.left], c.left, id[prev[c.left]], id[c.left]});
        if (next[c.left] >= 0 && (e = pair_get(t, id[c.left], id[next[c.left]])))
            heap_push(heap, &hn, (merge_cand){e->rank, c.left, next[c.left], id[c.left], id[next[c.left]]});
    }
    int64_t m = 0;
    for (int64_t i = 0; i >= 0 && i < n; i = next[i]) id[m++] = id[i];
    sym->n = m;
    og_free(next), og_free(prev), og_free(heap);
    return OG_OK;
}

/* The plain merge loop the heap version is tested against: rescan every
 * adjacent pair, merge the lowest-ranked (leftmost on ties), repeat. */
static void bpe_merge_ref(const og_tokenizer *t, ids *sym) {
    while (sym->n > 1) {
        int64_t best = -1;
        const pair_entry *bp = NULL;
        for (int64_t i = 0; i + 1 < sym->n; i++) {
            const pair_entry *e = pair_get(t, sym->p[i], sym->p[i + 1]);
            if (e && (!bp || e->rank < bp->rank)) {
                bp = e;
                best = i;
            }
        }
        if (!bp) break;
        sym->p[best] = bp->merged;
        memmove(sym->p + best + 1, sym->p + best + 2, (size_t)(sym->n - best - 2) * sizeof *sym->p);
        sym->n--;
    }
}

void og_tokenizer_use_reference_bpe(og_tokenizer *t, bool on) { t->reference_bpe = on; }

/* BPE over one pre-tokenized word. */
static og_status bpe_word(const og_tokenizer *t, const char *s, size_t n, ids *out) {
    if (t->ignore_merges) {
        int32_t id = map_get(t, s, n);
        if (id >= 0) return ids_push(out, id);
    }
    ids sym = {0};
    og_status rc = OG_OK;
    int last_unk = 0;
    for (size_t i = 0; i < n && rc == OG_OK;) {
        size_t cl = utf8_len((unsigned char)s[i]);
        if (cl > n - i) cl = n - i;
        int32_t id = map_get(t, s + i, cl);
        if (id >= 0) {
            rc = ids_push(&sym, id);
            last_unk = 0;
        } else {
            int all = t->byte_fallback;
            for (size_t k = 0; k < cl && all; k++) all = t->byte_id[(unsigned char)s[i + k]] >= 0;
            if (all) {
                for (size_t k = 0; k < cl && rc == OG_OK; k++) rc = ids_push(&sym, t->byte_id[(unsigned char)s[i + k]]);
                last_unk = 0;
            } else if (t->unk >= 0) {
                if (!(t->fuse_unk && last_unk)) rc = ids_push(&sym, t->unk);
                last_unk = 1;
            }
        }
        i += cl;
    }
    if (rc == OG_OK && sym.n > 1) {
        if (t->reference_bpe) bpe_merge_ref(t, &sym);
        else rc = bpe_merge(t, &sym);
    }
    for (int64_t i = 0; i < sym.n && rc == OG_OK; i++) rc = ids_push(out, sym.p[i]);
    og_free(sym.p);
    return rc;
}

/* Pushes the id of piece s[0..n) of a Unigram path: the piece, or its
 * bytes' <0xXX> tokens under byte_fallback, or unk. */
static og_status unigram_push(const og_tokenizer *t, const char *s, size_t n, ids *out) {
    int32_t id = map_get(t, s, n);
    if (id >= 0) return ids_push(out, id);
    int all = t->byte_fallback;
    for (size_t k = 0; k < n && all; k++) all = t->byte_id[(unsigned char)s[k]] >= 0;
    og_status rc = OG_OK;
    for (size_t k = 0; all && k < n && rc == OG_OK; k++) rc = ids_push(out, t->byte_id[(unsigned char)s[k]]);
    if (all) return rc;
    if (t->unk < 0) return og_set_error(OG_ERR_INVALID_ARGUMENT, "tokenizer: \"%.*s\" is not in the Unigram vocabulary and the model has no unk_id", (int)n, s);
    return ids_push(out, t->unk);
}

/* Unigram over one pre-tokenized piece: the path of pieces with the highest
 * total score (Viterbi over the byte positions where characters start), a
 * character no piece starts with costing the lowest score minus 10 as unk;
 * ties keep the first candidate (shorter pieces are tried first); runs of
 * unk are fused into one piece. As Hugging Face's optimized encode. */
static og_status unigram_word(const og_tokenizer *t, const char *s, size_t n, ids *out) {
    if (!n) return OG_OK;
    double *best = og_malloc((n + 1) * sizeof *best);
    int64_t *from = og_malloc((n + 1) * sizeof *from);
    int32_t *node_id = og_malloc((n + 1) * sizeof *node_id);
    og_status rc = OG_OK;
    if (!best || !from || !node_id) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    const double unk_score = t->min_score - 10.0;
    for (size_t i = 0; i <= n && rc == OG_OK; i++) {
        best[i] = 0.0;
        from[i] = -1;
        node_id[i] = 0;
    }
    const trie *tr = &t->pieces;
    for (size_t pos = 0; pos < n && rc == OG_OK;) {
        size_t mblen = utf8_len((unsigned char)s[pos]);
        if (mblen > n - pos) mblen = n - pos;
        double here = best[pos];
        int single = 0;
        int32_t node = 0;
        for (size_t k = pos; k < n && tr->n_nodes; k++) {
            if ((node = trie_child(tr, node, (unsigned char)s[k])) < 0) break;
            int32_t id = tr->term[node];
            if (id < 0) continue;
            size_t end = k + 1;
            double cand = t->score[id] + here;
            if (from[end] < 0 || cand > best[end]) {
                best[end] = cand;
                from[end] = (int64_t)pos;
                node_id[end] = id;
            }
            if (end - pos == mblen) single = 1;
        }
        if (!single) {
            size_t end = pos + mblen;
            double cand = unk_score + here;
            if (t->unk < 0)
                rc = og_set_error(OG_ERR_INVALID_ARGUMENT,
                                  "tokenizer: no Unigram piece covers the character at byte %zu of \"%.*s\" and the model has no unk_id",
                                  pos, (int)(n > 64 ? 64 : n), s);
            else if (from[end] < 0 || cand > best[end]) {
                best[end] = cand;
                from[end] = (int64_t)pos;
                node_id[end] = t->unk;
            }
        }
        pos += mblen;
    }
    /* back from the end: the path's pieces in reverse, consecutive unk
     * pieces fused into one (their ranges are adjacent); cut[k] is the end
     * of the k-th piece from the end, its start is from[cut[k]] */
    size_t *cut = rc == OG_OK ? og_malloc((n + 1) * sizeof *cut) : NULL;
    size_t nc = 0;
    if (rc == OG_OK && !cut) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (size_t end = n, prev_unk = 0; rc == OG_OK && end > 0;) {
        size_t start = (size_t)from[end];
        int unk = t->unk >= 0 && node_id[end] == t->unk;
        if (unk && prev_unk) from[cut[nc - 1]] = (int64_t)start;
        else cut[nc++] = end;
        prev_unk = (size_t)unk;
        end = start;
    }
    for (size_t k = nc; k-- > 0 && rc == OG_OK;) rc = unigram_push(t, s + from[cut[k]], cut[k] - (size_t)from[cut[k]], out);
    og_free(cut);
    og_free(best);
    og_free(from);
    og_free(node_id);
    return rc;
}

/* WordPiece over one pre-tokenized word: longest vocabulary entry first,
 * continuations with the prefix; a word with a part no entry covers, or
 * longer than max_input_chars_per_word characters, is unk. The longest entry
 * is found by walking the vocabulary's trie (the prefix, then the word), so
 * a word costs its length times the longest entry, not that squared. */
static og_status wordpiece_word(const og_tokenizer *t, const char *s, size_t n, ids *out) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    int64_t mark = out->n;
    const trie *tr = &t->pieces;
    int32_t after_prefix = 0; /* the node after the prefix, -1 when no entry starts with it */
    for (const unsigned char *p = (const unsigned char *)t->wp_prefix; *p && after_prefix >= 0; p++)
        after_prefix = tr->n_nodes ? trie_child(tr, after_prefix, *p) : -1;
    og_status rc = OG_OK;
    int bad = (int64_t)chars > t->wp_max_chars;
    for (size_t start = 0; start < n && !bad && rc == OG_OK;) {
        int32_t node = start ? after_prefix : 0, id = -1;
        size_t end = start;
        for (size_t k = start; k < n && node >= 0 && tr->n_nodes; k++) {
            if ((node = trie_child(tr, node, (unsigned char)s[k])) < 0) break;
            if (tr->term[node] >= 0) { /* an entry ends here (always at a character end) */
                id = tr->term[node];
                end = k + 1;
            }
        }
        if (id < 0) bad = 1;
        else {
            rc = ids_push(out, id);
            start = end;
        }
    }
    if (rc != OG_OK || !bad) return rc;
    out->n = mark;
    if (t->unk < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "tokenizer: WordPiece needs its unk_token for \"%.*s\" but the vocabulary lacks it",
                            (int)(n > 64 ? 64 : n), s);
    return ids_push(out, t->unk);
}

/* Pre-tokenizes and encodes with the model one stretch of normalized text
 * between added tokens. */
static og_status encode_piece(const og_tokenizer *t, const char *s, size_t n, int at_start, ids *out) {
    pieces ps = {0};
    og_status rc = pieces_add(&ps, s, n, at_start);
    for (int i = 0; i < t->n_pre && rc == OG_OK; i++) rc = pre_apply(&t->pre[i], &ps);
    for (size_t i = 0; i < ps.n && rc == OG_OK; i++) {
        const char *w = ps.arena.p + ps.p[i].off;
        size_t wn = ps.p[i].len;
        rc = t->model == MODEL_UNIGRAM     ? unigram_word(t, w, wn, out)
             : t->model == MODEL_WORDPIECE ? wordpiece_word(t, w, wn, out)
                                           : bpe_word(t, w, wn, out);
    }
    pieces_free(&ps);
    return rc;
}

/* A stretch of text, or an added token, found by added_split. */
typedef struct span {
    size_t start, stop;
    int32_t tok; /* index into t->added, or -1 for text */
} span;

typedef struct spans {
    span *p;
    size_t n, cap;
} spans;

static og_status spans_push(spans *v, size_t start, size_t stop, int32_t tok) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        span *p = og_realloc(v->p, cap * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (span){start, stop, tok};
    return OG_OK;
}

/* The code point that ends s[0..n) (n > 0, valid UTF-8). */
static uint32_t last_cp(const unsigned char *s, size_t n) {
    size_t i = n - 1, cl;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    return utf8_cp(s + i, &cl);
}

/* Splits s[0..n) at the added tokens of one set as Hugging Face's
 * AddedVocabulary does: the leftmost match, longest there, the search going
 * on after it; a special token when !parse_special, or a single_word token
 * with a word character (regex \w) touching either side, is passed over as
 * text; lstrip takes the whitespace before the token (not past the previous
 * match), rstrip the whitespace after it. */
static og_status added_split(const og_tokenizer *t, const added_set *set, const char *s, size_t n, int parse_special,
                             spans *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t start_offset = 0, cl;
    out->n = 0;
    og_status rc = OG_OK;
    for (size_t pos = 0; pos < n && rc == OG_OK;) {
        const int32_t *cand = set->by_byte[u[pos]];
        int32_t hit = -1;
        for (int32_t k = 0; k < set->n_by_byte[u[pos]] && hit < 0; k++) {
            const added_token *a = &t->added[cand[k]];
            if (a->pat_len <= n - pos && !memcmp(s + pos, a->pat, a->pat_len)) hit = cand[k];
        }
        if (hit < 0) {
            pos++;
            continue;
        }
        const added_token *a = &t->added[hit];
        size_t start = pos, stop = pos + a->pat_len;
        pos = stop;
        if (a->special && !parse_special) continue;
        if (a->single_word && ((start > 0 && is_word_char(last_cp(u, start))) ||
                               (stop < n && is_word_char(utf8_cp(u + stop, &cl)))))
            continue;
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0 && is_white_space(last_cp(u, ns))) {
                size_t back = ns - 1;
                while (back > 0 && (u[back] & 0xC0) == 0x80) back--;
                ns = back;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            while (stop < n && is_white_space(utf8_cp(u + stop, &cl))) stop += cl;
        if (start_offset < start) rc = spans_push(out, start_offset, start, -1);
        if (rc == OG_OK) rc = spans_push(out, start, stop, hit);
        start_offset = stop;
    }
    if (rc == OG_OK && start_offset != n) rc = spans_push(out, start_offset, n, -1);
    return rc;
}

og_status og_tokenizer_encode(const og_tokenizer *t, const char *text, size_t len, int32_t **out, int64_t *n) {
    return og_tokenizer_encode_ex(t, text, len, 0, 1, out, n);
}

/* Added tokens that are not normalized are split off the raw text first;
 * each stretch between them is normalized, split at the normalized added
 * tokens, and each stretch left is pre-tokenized and given to the model. */
og_status og_tokenizer_encode_ex(const og_tokenizer *t, const char *text, size_t len, int add_special,
                                 int parse_special, int32_t **out, int64_t *n) {
    if (!t || (!text && len) || !out || !n)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_encode: NULL argument");
    *out = NULL;
    *n = 0;
    if (add_special && t->post_unsupported[0])
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "tokenizer.json: post_processor %s is not supported: encode without special tokens added",
                            t->post_unsupported);
    buf clean = {0}, norm = {0};
    ids v = {0};
    spans raw = {0}, inner = {0};
    og_status rc = buf_put(&clean, "", 0);
    if (rc == OG_OK) rc = buf_put_lossy(&clean, text, len);
    for (int i = 0; add_special && i < t->n_post_pre && rc == OG_OK; i++) rc = ids_push(&v, t->post_pre[i]);
    if (rc == OG_OK) rc = added_split(t, &t->added_raw, clean.p, clean.n, parse_special, &raw);
    for (size_t i = 0; i < raw.n && rc == OG_OK; i++) {
        const span *r = &raw.p[i];
        if (r->tok >= 0) {
            rc = ids_push(&v, t->added[r->tok].id);
            continue;
        }
        if (r->stop <= r->start) continue;
        norm.n = 0;
        rc = buf_put(&norm, clean.p + r->start, r->stop - r->start);
        if (rc == OG_OK) rc = normalize(t, &norm);
        if (rc == OG_OK) rc = added_split(t, &t->added_norm, norm.p, norm.n, parse_special, &inner);
        for (size_t k = 0; k < inner.n && rc == OG_OK; k++) {
            const span *q = &inner.p[k];
            if (q->tok >= 0) rc = ids_push(&v, t->added[q->tok].id);
            else if (q->stop > q->start)
                rc = encode_piece(t, norm.p + q->start, q->stop - q->start, r->start == 0 && q->start == 0, &v);
        }
    }
    for (int i = 0; add_special && i < t->n_post_suf && rc == OG_OK; i++) rc = ids_push(&v, t->post_suf[i]);
    og_free(clean.p);
    og_free(norm.p);
    og_free(raw.p);
    og_free(inner.p);
    if (rc != OG_OK) {
        og_free(v.p);
        return rc;
    }
    *out = v.p;
    *n = v.n;
    return OG_OK;
}

/* ------------------------------------------------------------ decoding */

/* A list of strings kept end to end in one arena: string i is
 * arena[off[i], off[i + 1]). Decoding reuses two of these (and two byte
 * buffers) from a scratch, so that a decode allocates nothing once the
 * scratch has grown to its size: a stream decodes a small window per token,
 * and per-token allocations dominated its cost. */
typedef struct strlist {
    buf arena;
    size_t *off; /* [cap]; off[0] == 0 */
    size_t n, cap;
} strlist;

static const char *sl_str(const strlist *l, size_t i) { return l->arena.p + l->off[i]; }
static size_t sl_len(const strlist *l, size_t i) { return l->off[i + 1] - l->off[i]; }

static void strlist_free(strlist *l) {
    og_free(l->arena.p);
    og_free(l->off);
    *l = (strlist){0};
}

static og_status strlist_reset(strlist *l) {
    l->n = 0;
    l->arena.n = 0;
    if (!l->off) {
        l->cap = 16;
        if (!(l->off = og_malloc(l->cap * sizeof *l->off)))
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    l->off[0] = 0;
    return buf_put(&l->arena, "", 0);
}

/* Ends string n at the arena's current end (what was appended since the
 * previous string ended). */
static og_status strlist_close(strlist *l) {
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap * 2;
        size_t *p = og_realloc(l->off, cap * sizeof *p);
        if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        l->off = p;
        l->cap = cap;
    }
    l->off[++l->n] = l->arena.n;
    return OG_OK;
}

static og_status strlist_add(strlist *l, const char *s, size_t n) {
    og_status rc = buf_put(&l->arena, s, n);
    return rc == OG_OK ? strlist_close(l) : rc;
}

/* Appends s[0..n) to dst with every occurrence of pat replaced by rep
 * (left to right, not overlapping). */
static og_status replace_into(buf *dst, const char *s, size_t n, const char *pat, const char *rep) {
    size_t pn = strlen(pat), rn = strlen(rep), pos = 0;
    og_status rc = OG_OK;
    while (rc == OG_OK && pn) {
        const char *f = memmem(s + pos, n - pos, pat, pn);
        if (!f) break;
        rc = buf_put(dst, s + pos, (size_t)(f - s) - pos);
        if (rc == OG_OK) rc = buf_put(dst, rep, rn);
        pos = (size_t)(f - s) + pn;
    }
    return rc == OG_OK ? buf_put(dst, s + pos, n - pos) : rc;
}

typedef struct dec_scratch {
    strlist l[2];
    buf acc, tmp;
} dec_scratch;

static void dec_scratch_free(dec_scratch *sc) {
    strlist_free(&sc->l[0]);
    strlist_free(&sc->l[1]);
    og_free(sc->acc.p);
    og_free(sc->tmp.p);
}

/* Parses "<0xHH>"; -1 when s is not a byte token. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The WordPiece decoder's cleanup, in its order (each a plain replace). */
static const char *const k_wp_cleanup[][2] = {
    {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},           {" n't", "n't"},
    {" 'm", "'m"},   {" do not", " don't"},         {" 's", "'s"}, {" 've", "'ve"},        {" 're", "'re"},
};

/* One decoder over the strings of *in, into *out (reset first).
 * raw: the bytes as decoded, without making them valid UTF-8 (ByteLevel's
 * lossy step, ByteFallback's U+FFFD per byte of a bad run): what the stream
 * works on, replacing ill-formed bytes itself once they are complete. */
static og_status dec_apply(const dec_op *op, const strlist *in, strlist *out, dec_scratch *sc, int raw) {
    buf *acc = &sc->acc;
    og_status rc = strlist_reset(out);
    acc->n = 0;
    switch (op->kind) {
    case DEC_BYTELEVEL: /* every character back to its byte; tokens with others stay as they are */
        for (size_t i = 0; i < in->n && rc == OG_OK; i++) {
            const unsigned char *u = (const unsigned char *)sl_str(in, i);
            size_t mark = acc->n, j = 0, n = sl_len(in, i);
            int mapped = 1;
            while (j < n && rc == OG_OK) {
                size_t cl;
                uint32_t cp = utf8_cp(u + j, &cl);
                if (cp >= 324 || k_cp_byte[cp] < 0) {
                    mapped = 0;
                    break;
                }
                rc = buf_putc(acc, (char)k_cp_byte[cp]);
                j += cl;
            }
            if (!mapped) {
                acc->n = mark;
                rc = buf_put(acc, sl_str(in, i), n);
            }
        }
        if (rc == OG_OK && raw) rc = buf_put(&out->arena, acc->p ? acc->p : "", acc->n);
        else if (rc == OG_OK) rc = buf_put_lossy(&out->arena, acc->p ? acc->p : "", acc->n);
        if (rc == OG_OK) rc = strlist_close(out);
        break;
    case DEC_FUSE: /* the strings lie end to end already */
        rc = strlist_add(out, in->arena.p, in->arena.n);
        break;
    case DEC_BYTEFALLBACK:
        for (size_t i = 0; i <= in->n && rc == OG_OK; i++) {
            int b = i < in->n ? byte_token(sl_str(in, i), sl_len(in, i)) : -1;
            if (b >= 0) {
                rc = buf_putc(acc, (char)b);
                continue;
            }
            if (acc->n) { /* a run of byte tokens: its text, or one U+FFFD per byte */
                size_t bad;
                int ok = 1;
                for (size_t j = 0; j < acc->n && ok && !raw;) {
                    size_t l = utf8_seq((const unsigned char *)acc->p + j, acc->n - j, &bad);
                    ok = l > 0;
                    j += l;
                }
                if (ok) rc = strlist_add(out, acc->p, acc->n);
                for (size_t j = 0; !ok && j < acc->n && rc == OG_OK; j++) rc = strlist_add(out, "\xEF\xBF\xBD", 3);
                acc->n = 0;
            }
            if (i < in->n && rc == OG_OK) rc = strlist_add(out, sl_str(in, i), sl_len(in, i));
        }
        break;
    case DEC_REPLACE:
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n && rc == OG_OK; i++) {
            /* Metaspace: the first token loses its replacement characters */
            const char *rep = op->kind == DEC_REPLACE ? op->b : i == 0 && op->prepend != PREPEND_NEVER ? "" : " ";
            rc = replace_into(&out->arena, sl_str(in, i), sl_len(in, i), op->a, rep);
            if (rc == OG_OK) rc = strlist_close(out);
        }
        break;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n && rc == OG_OK; i++) {
            const char *s = sl_str(in, i);
            size_t n = sl_len(in, i), cn = strlen(op->a), a = 0, e = n;
            for (int k = 0; k < op->start && cn && e - a >= cn && !memcmp(s + a, op->a, cn); k++) a += cn;
            for (int k = 0; k < op->stop && cn && e - a >= cn && !memcmp(s + e - cn, op->a, cn); k++) e -= cn;
            rc = strlist_add(out, s + a, e - a);
        }
        break;
    case DEC_WORDPIECE:
        for (size_t i = 0; i < in->n && rc == OG_OK; i++) {
            const char *s = sl_str(in, i);
            size_t n = sl_len(in, i), pn = strlen(op->a);
            acc->n = 0;
            if (i && n >= pn && !memcmp(s, op->a, pn)) rc = buf_put(acc, s + pn, n - pn);
            else if (i) {
                rc = buf_putc(acc, ' ');
                if (rc == OG_OK) rc = buf_put(acc, s, n);
            } else
                rc = buf_put(acc, s, n);
            for (size_t k = 0; op->cleanup && k < sizeof k_wp_cleanup / sizeof *k_wp_cleanup && rc == OG_OK; k++) {
                if (!memmem(acc->p, acc->n, k_wp_cleanup[k][0], strlen(k_wp_cleanup[k][0]))) continue;
                sc->tmp.n = 0;
                rc = replace_into(&sc->tmp, acc->p, acc->n, k_wp_cleanup[k][0], k_wp_cleanup[k][1]);
                buf swap = *acc;
                *acc = sc->tmp;
                sc->tmp = swap;
            }
            if (rc == OG_OK) rc = strlist_add(out, acc->p ? acc->p : "", acc->n);
        }
        break;
    }
    return rc;
}

/* Decodes n ids into out (reset first), through the decoder chain. */
static og_status decode_ids(const og_tokenizer *t, const int32_t *ids_in, int64_t n, int raw, dec_scratch *sc,
                            buf *out) {
    out->n = 0;
    og_status rc = buf_put(out, "", 0);
    strlist *in = &sc->l[0], *next = &sc->l[1];
    if (rc == OG_OK) rc = strlist_reset(in);
    for (int64_t i = 0; i < n && rc == OG_OK; i++) {
        int32_t id = ids_in[i];
        if (id < 0 || id >= t->n_ids || !t->text[id])
            rc = og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_decode: id %d (at %lld) is not a token", id,
                              (long long)i);
        else {
            const char *txt = t->text[id];
            size_t len = 0;
            int32_t lo = 0, hi = t->n_norm_dec; /* a normalized added token decodes as its normalized form */
            while (lo < hi) {
                int32_t mid = (lo + hi) / 2;
                if (t->norm_dec_id[mid] < id) lo = mid + 1;
                else hi = mid;
            }
            if (lo < t->n_norm_dec && t->norm_dec_id[lo] == id) {
                txt = t->added[t->norm_dec_tok[lo]].pat;
                len = t->added[t->norm_dec_tok[lo]].pat_len;
            } else
                len = strlen(txt);
            rc = strlist_add(in, txt, len);
        }
    }
    for (int i = 0; i < t->n_dec && rc == OG_OK; i++) {
        rc = dec_apply(&t->dec[i], in, next, sc, raw);
        strlist *swap = in;
        in = next;
        next = swap;
    }
    for (size_t i = 0; i < in->n && rc == OG_OK; i++) {
        if (t->n_dec < 0 && i) rc = buf_putc(out, ' ');
        if (rc == OG_OK) rc = buf_put(out, sl_str(in, i), sl_len(in, i));
    }
    return rc;
}

og_status og_tokenizer_decode(const og_tokenizer *t, const int32_t *ids_in, int64_t n, char **text, size_t *len) {
    if (!t || (!ids_in && n) || n < 0 || !text)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_decode: NULL argument");
    *text = NULL;
    dec_scratch sc = {0};
    buf out = {0};
    og_status rc = decode_ids(t, ids_in, n, 0, &sc, &out);
    dec_scratch_free(&sc);
    if (rc != OG_OK) {
        og_free(out.p);
        return rc;
    }
    *text = out.p;
    if (len) *len = out.n;
    return OG_OK;
}

og_status og_tokenizer_token_bytes(const og_tokenizer *t, int32_t id, char **bytes, size_t *len) {
    if (!t || !bytes || !len) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_token_bytes: NULL argument");
    *bytes = NULL;
    *len = 0;
    if (id < 0 || id >= t->n_ids || !t->text[id])
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_token_bytes: id %d is not a token", id);
    /* the context: the first plain token that decodes to something */
    int32_t ctx = -1;
    dec_scratch sc = {0};
    buf before = {0}, after = {0};
    og_status rc = OG_OK;
    for (int32_t k = 0; k < t->n_ids && ctx < 0 && rc == OG_OK; k++) {
        if (!t->text[k] || og_tokenizer_is_special(t, k)) continue;
        rc = decode_ids(t, &k, 1, 1, &sc, &before);
        if (rc == OG_OK && before.n) ctx = k;
    }
    int32_t two[2] = {ctx, id};
    if (rc == OG_OK && ctx < 0) before.n = 0;
    if (rc == OG_OK) rc = decode_ids(t, ctx < 0 ? &two[1] : two, ctx < 0 ? 1 : 2, 1, &sc, &after);
    if (rc == OG_OK && after.n > before.n) {
        size_t n = after.n - before.n;
        *bytes = og_malloc(n);
        if (!*bytes) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "og_tokenizer_token_bytes: out of memory");
        else {
            memcpy(*bytes, after.p + before.n, n);
            *len = n;
        }
    }
    dec_scratch_free(&sc);
    og_free(before.p);
    og_free(after.p);
    return rc;
}

/* ------------------------------------------------------------ streaming */

/* Each token's bytes are found by decoding it after its context (the last
 * tokens that gave bytes, at most STREAM_CONTEXT of them: decoders that look
 * at the first token, Metaspace and Strip, then treat it as a full decode
 * would) and taking what it adds. The bytes wait in `pend` until they are
 * complete UTF-8: only a tail that is the start of a well-formed character
 * (at most 3 bytes) is held back, everything before it goes out with its
 * ill-formed subparts replaced by U+FFFD as a full decode replaces them.
 * Each push costs the decode of a bounded window, so a stream is linear in
 * its tokens, whatever its text ends in. */
#define STREAM_CONTEXT 16
#define STREAM_ONE_CACHE 256

struct og_decode_stream {
    const og_tokenizer *t;
    ids v;              /* the context and the newest token */
    int64_t read;       /* v[0..read) is the context */
    buf pend;           /* decoded bytes not given out yet */
    buf out;            /* the last text given out */
    buf before, after;  /* decodes of the context, and of it with the newest token */
    dec_scratch sc;
    /* the length of the decode of a context of one token, by id (direct
     * mapped; -1 when empty): the common context, whose decode would
     * otherwise be half of every push's work */
    int32_t one_id[STREAM_ONE_CACHE];
    size_t one_len[STREAM_ONE_CACHE];
};

og_status og_decode_stream_create(const og_tokenizer *t, og_decode_stream **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_decode_stream_create: NULL out");
    *out = NULL;
    if (!t) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_decode_stream_create: NULL tokenizer");
    og_decode_stream *s = og_calloc(1, sizeof *s);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_decode_stream_create: out of memory");
    s->t = t;
    for (int i = 0; i < STREAM_ONE_CACHE; i++) s->one_id[i] = -1;
    *out = s;
    return OG_OK;
}

void og_decode_stream_destroy(og_decode_stream *s) {
    if (!s) return;
    og_free(s->v.p);
    og_free(s->pend.p);
    og_free(s->out.p);
    og_free(s->before.p);
    og_free(s->after.p);
    dec_scratch_free(&s->sc);
    og_free(s);
}

/* Length of the tail of p[0..n) that is an incomplete but so far
 * well-formed UTF-8 character (0 when there is none). */
static size_t incomplete_tail(const unsigned char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = p[n - back];
        if (c >= 0x80 && c < 0xC0) continue; /* a continuation byte: look further back */
        size_t bad;
        if (c < 0xC2 || c > 0xF4 || utf8_seq(p + n - back, back, &bad)) return 0;
        return bad == back ? back : 0; /* ran out of bytes rather than into a bad one */
    }
    return 0;
}

/* Moves the complete part of pend (all of it when `all`) to out. */
static og_status stream_emit(og_decode_stream *s, int all, const char **text, size_t *len) {
    size_t keep = all ? 0 : incomplete_tail((const unsigned char *)s->pend.p, s->pend.n);
    s->out.n = 0;
    og_status rc = buf_put(&s->out, "", 0);
    if (rc == OG_OK) rc = buf_put_lossy(&s->out, s->pend.p ? s->pend.p : "", s->pend.n - keep);
    if (rc != OG_OK) return rc;
    if (keep) memmove(s->pend.p, s->pend.p + s->pend.n - keep, keep);
    s->pend.n = keep;
    *text = s->out.p;
    *len = s->out.n;
    return OG_OK;
}

og_status og_decode_stream_push(og_decode_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_decode_stream_push: NULL argument");
    *text = "";
    *len = 0;
    const og_tokenizer *t = s->t;
    if (id < 0 || id >= t->n_ids || !t->text[id])
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_decode_stream_push: id %d is not a token", id);
    og_status rc = ids_push(&s->v, id);
    if (rc) return rc;
    size_t nb = 0, slot = s->read == 1 ? (size_t)s->v.p[0] % STREAM_ONE_CACHE : 0;
    if (s->read == 1 && s->one_id[slot] == s->v.p[0]) nb = s->one_len[slot];
    else if (s->read > 0) {
        rc = decode_ids(t, s->v.p, s->read, 1, &s->sc, &s->before);
        nb = s->before.n;
        if (rc == OG_OK && s->read == 1) {
            s->one_id[slot] = s->v.p[0];
            s->one_len[slot] = nb;
        }
    }
    if (rc == OG_OK) rc = decode_ids(t, s->v.p, s->v.n, 1, &s->sc, &s->after);
    size_t na = s->after.n;
    if (rc == OG_OK && na > nb) rc = buf_put(&s->pend, s->after.p + nb, na - nb);
    if (rc != OG_OK) {
        s->v.n--; /* the token is not kept */
        return rc;
    }
    if (na > nb) { /* the newest token gave bytes: it alone is the next context */
        s->v.p[0] = s->v.p[s->v.n - 1];
        s->v.n = 1;
    } else if (s->v.n > STREAM_CONTEXT) { /* tokens without text: keep the last few */
        memmove(s->v.p, s->v.p + s->v.n - STREAM_CONTEXT, STREAM_CONTEXT * sizeof *s->v.p);
        s->v.n = STREAM_CONTEXT;
    }
    s->read = s->v.n;
    return stream_emit(s, 0, text, len);
}

og_status og_decode_stream_finish(og_decode_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_decode_stream_finish: NULL argument");
    *text = "";
    *len = 0;
    og_status rc = stream_emit(s, 1, text, len);
    s->v.n = s->read = 0;
    s->pend.n = 0;
    return rc;
}
