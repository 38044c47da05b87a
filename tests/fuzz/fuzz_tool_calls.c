/* libFuzzer harness: the tool-call parser (src/text/tool_calls.c) over
 * arbitrary output text, in the format (Hermes, Mistral, Llama 3.1) and fed
 * whole and in pieces cut where the first byte says, read whole
 * (og_tool_parser_take) and as pieces (og_tool_parser_take_pieces: content
 * and calls as they stream). Whatever the cut and the reading, the content
 * and the calls are the same; every
 * call has a name and arguments that are a JSON object without control
 * bytes (strict parsers refuse them); an output without
 * a call comes back as content byte for byte. The input is also tried as
 * the tools of og_tool_calls_grammar, whose grammars must parse. The body is
 * a plain function that test_fuzz_replay also runs over
 * tests/fuzz/corpus/tool_calls/. */
#include "fuzz.h"
#include "core/core.h"
#include "text/tool_calls.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_tool_calls(const uint8_t *data, size_t size);

typedef struct result {
    char *content;
    size_t n;
    char *calls; /* name \0 arguments \0 ..., n_calls of them */
    size_t n_calls_bytes;
    int n_calls;
} result;

static void append(char **p, size_t *n, const char *s, size_t k) {
    char *q = og_realloc(*p, *n + k + 1);
    if (!q) __builtin_trap(); /* a fuzzer's inputs are small */
    memcpy(q + *n, s, k);
    *n += k;
    q[*n] = 0;
    *p = q;
}

static void take(og_tool_parser *p, result *r) {
    const char *c;
    size_t n;
    const og_tool_call *calls;
    int k;
    og_tool_parser_take(p, &c, &n, &calls, &k);
    append(&r->content, &r->n, c, n);
    for (int i = 0; i < k; i++) {
        if (!calls[i].name || !*calls[i].name || !calls[i].arguments) __builtin_trap();
        for (const char *q = calls[i].arguments; *q; q++) /* JSON as strict parsers read it */
            if ((unsigned char)*q < 0x20 && *q != '\t' && *q != '\n' && *q != '\r') __builtin_trap();
        cJSON *a = cJSON_Parse(calls[i].arguments);
        if (!cJSON_IsObject(a)) __builtin_trap();
        cJSON_Delete(a);
        append(&r->calls, &r->n_calls_bytes, calls[i].name, strlen(calls[i].name) + 1);
        append(&r->calls, &r->n_calls_bytes, calls[i].arguments, strlen(calls[i].arguments) + 1);
        r->n_calls++;
    }
}

/* take_pieces' pieces into r as take gives them: content joined, a call
 * (its name on its first piece only, its arguments joined) when its last
 * piece comes; *args holds the open call's arguments. */
static void take_pieces(og_tool_parser *p, result *r, char **args, size_t *n_args, char **name) {
    const og_tool_piece *pc;
    int k;
    if (og_tool_parser_take_pieces(p, &pc, &k) != OG_OK) return; /* out of memory: nothing taken */
    for (int i = 0; i < k; i++) {
        if (!pc[i].text || pc[i].text[pc[i].n]) __builtin_trap();
        if (pc[i].call < 0) { /* content: the model's bytes, NULs too */
            if (pc[i].name || pc[i].last || *name) __builtin_trap(); /* no content inside a call */
            append(&r->content, &r->n, pc[i].text, pc[i].n);
            continue;
        }
        if (pc[i].call != r->n_calls || !pc[i].name != !!*name || strlen(pc[i].text) != pc[i].n) __builtin_trap();
        if (pc[i].name) {
            *name = og_strdup(pc[i].name);
            *n_args = 0;
            append(args, n_args, "", 0);
        }
        append(args, n_args, pc[i].text, pc[i].n);
        if (pc[i].last) {
            append(&r->calls, &r->n_calls_bytes, *name, strlen(*name) + 1);
            append(&r->calls, &r->n_calls_bytes, *args, *n_args + 1);
            r->n_calls++;
            og_free(*name);
            *name = NULL;
        }
    }
}

/* Parses s[0..n) fed in pieces of `step` bytes (0: whole); read with
 * take_pieces when pieces. */
static result parse_as(og_tool_format f, const char *s, size_t n, size_t step, bool pieces) {
    result r = {0};
    og_tool_parser *p = NULL;
    char *args = NULL, *name = NULL;
    size_t n_args = 0;
    if (og_tool_parser_create(f, &p) != OG_OK) __builtin_trap();
    for (size_t at = 0; at < n;) {
        size_t k = step && n - at > step ? step : n - at;
        if (og_tool_parser_feed(p, s + at, k) != OG_OK) __builtin_trap();
        if (pieces) take_pieces(p, &r, &args, &n_args, &name);
        else take(p, &r);
        at += k;
    }
    if (og_tool_parser_finish(p) != OG_OK) __builtin_trap();
    if (pieces) take_pieces(p, &r, &args, &n_args, &name);
    else take(p, &r);
    if (og_tool_parser_total_calls(p) != r.n_calls || name) __builtin_trap();
    og_free(args);
    og_tool_parser_destroy(p);
    return r;
}

static result parse(og_tool_format f, const char *s, size_t n, size_t step) { return parse_as(f, s, n, step, false); }

static bool same(const result *a, const result *b) {
    return a->n == b->n && (!a->n || !memcmp(a->content, b->content, a->n)) && a->n_calls == b->n_calls &&
           a->n_calls_bytes == b->n_calls_bytes &&
           (!a->n_calls_bytes || !memcmp(a->calls, b->calls, a->n_calls_bytes));
}

static void forget(result *r) {
    og_free(r->content);
    og_free(r->calls);
}

int og_fuzz_tool_calls(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const size_t step = 1 + data[0] % 13;
    static const og_tool_format formats[] = {OG_TOOL_FORMAT_HERMES, OG_TOOL_FORMAT_MISTRAL, OG_TOOL_FORMAT_LLAMA3};
    const og_tool_format f = formats[data[0] / 13 % 3];
    const char *s = (const char *)data + 1;
    const size_t n = size - 1;
    result whole = parse(f, s, n, 0), cut = parse(f, s, n, step), pieces = parse_as(f, s, n, step, true);
    if (!same(&whole, &cut) || !same(&whole, &pieces)) __builtin_trap();
    if (!whole.n_calls && (whole.n != n || (n && memcmp(whole.content, s, n)))) __builtin_trap();
    forget(&whole);
    forget(&cut);
    forget(&pieces);
    /* the input as tools */
    char *text = og_malloc(n + 1);
    if (!text) __builtin_trap();
    memcpy(text, s, n);
    text[n] = 0;
    for (int parallel = 0; parallel < 2; parallel++) {
        og_grammar *g = NULL;
        og_status st = og_tool_calls_grammar(f, text, NULL, parallel, &g);
        if ((st == OG_OK) != (g != NULL)) __builtin_trap();
        og_grammar_destroy(g);
    }
    og_free(text);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_tool_calls)
