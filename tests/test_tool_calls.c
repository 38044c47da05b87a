/* Tool calls (src/text/tool_calls.c, and the tools of src/text/chat_template.c):
 *  - rendering: tests/data/chat_templates/tool_cases.json (made by
 *    tests/fixtures/make_tool_template_fixtures.py with transformers'
 *    apply_chat_template(messages, tools=...)) holds Qwen3, Qwen2.5, Llama
 *    3.1 and Mistral Nemo over conversations with tools, calls and tool
 *    results; each is rendered here and compared byte for byte, refusals
 *    included;
 *  - parsing, against the templates: the assistant turn each template
 *    (Hermes' <tool_call>, Mistral's [TOOL_CALLS], Llama 3.1's JSON) writes
 *    for a message's tool_calls (the reference's text, less the prompt
 *    before it) parses back into those calls and that content;
 *  - parsing, hand-checked: plain text passes byte for byte (markers cut
 *    anywhere, a lone '<'), content around calls, bodies that are not calls
 *    stay text, an unclosed call at the end, arguments as a string, and every
 *    split of the input into two pieces (and byte by byte) gives what the
 *    whole input gives;
 *  - the grammar of tool_choice "required" / a named function, in each
 *    format: it takes the call text the template writes and refuses a wrong
 *    name, a missing required argument, a second call unless parallel. */
#include "harness.h"
#include "core/core.h"
#include "text/chat_template.h"
#include "text/tool_calls.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *str_or_null(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ------------------------------------------------------------ parsing */

typedef struct parsed {
    char content[4096];
    size_t n_content;
    int n_calls;
    char names[8][64];
    char args[8][512];
    int arg_pieces[8]; /* pieces with argument bytes (take_pieces) */
} parsed;

static void take_into(og_tool_parser *p, parsed *r) {
    const char *c;
    size_t n;
    const og_tool_call *calls;
    int k;
    og_tool_parser_take(p, &c, &n, &calls, &k);
    if (r->n_content + n < sizeof r->content) memcpy(r->content + r->n_content, c, n);
    r->n_content += n;
    r->content[r->n_content < sizeof r->content ? r->n_content : sizeof r->content - 1] = 0;
    for (int i = 0; i < k && r->n_calls < 8; i++, r->n_calls++) {
        snprintf(r->names[r->n_calls], sizeof r->names[0], "%s", calls[i].name);
        snprintf(r->args[r->n_calls], sizeof r->args[0], "%s", calls[i].arguments);
    }
}

static og_tool_format g_format = OG_TOOL_FORMAT_HERMES; /* of parse_cut */

/* The pieces a take_pieces gives, into r: content joined, each call's
 * name from its first piece and its arguments joined; a call's pieces
 * come in order, only the first names it, none after its last. */
static void pieces_into(og_tool_parser *p, parsed *r, bool *open_call) {
    const og_tool_piece *pc;
    int k;
    CHECK_OK(og_tool_parser_take_pieces(p, &pc, &k));
    for (int i = 0; i < k; i++) {
        CHECK(pc[i].text && !pc[i].text[pc[i].n]);
        if (pc[i].call < 0) {
            CHECK(!pc[i].name && !pc[i].last);
            if (r->n_content + pc[i].n < sizeof r->content) memcpy(r->content + r->n_content, pc[i].text, pc[i].n);
            r->n_content += pc[i].n;
            r->content[r->n_content < sizeof r->content ? r->n_content : sizeof r->content - 1] = 0;
            continue;
        }
        if (!*open_call) { /* a call's first piece */
            CHECK_MSG(pc[i].call == r->n_calls && pc[i].name, "piece of call %d, %d calls so far, name %s",
                      pc[i].call, r->n_calls, pc[i].name ? pc[i].name : "(none)");
            if (r->n_calls >= 8) return;
            snprintf(r->names[r->n_calls], sizeof r->names[0], "%s", pc[i].name ? pc[i].name : "");
            r->args[r->n_calls][0] = 0;
            r->arg_pieces[r->n_calls] = 0;
            *open_call = true;
        } else {
            CHECK(pc[i].call == r->n_calls && !pc[i].name);
        }
        CHECK(strlen(pc[i].text) == pc[i].n); /* arguments: JSON, no NUL */
        if (r->n_calls >= 8) return;
        char *a = r->args[r->n_calls];
        if (strlen(a) + pc[i].n < sizeof r->args[0]) strncat(a, pc[i].text, pc[i].n);
        r->arg_pieces[r->n_calls] += pc[i].n > 0;
        if (pc[i].last) {
            r->n_calls++;
            *open_call = false;
        }
    }
}

/* Parses text fed in pieces cut at cuts[0..n_cuts) (ascending), read with
 * og_tool_parser_take; a second parser read with take_pieces must give the
 * same (its argument pieces counted in the result). */
static parsed parse_cut(const char *text, const size_t *cuts, int n_cuts) {
    parsed r, q;
    memset(&r, 0, sizeof r);
    memset(&q, 0, sizeof q);
    og_tool_parser *p = NULL, *s = NULL;
    CHECK_OK(og_tool_parser_create(g_format, &p));
    CHECK_OK(og_tool_parser_create(g_format, &s));
    if (!p || !s) return r;
    bool open_call = false;
    size_t at = 0, n = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : n;
        CHECK_OK(og_tool_parser_feed(p, text + at, to - at));
        take_into(p, &r);
        CHECK_OK(og_tool_parser_feed(s, text + at, to - at));
        pieces_into(s, &q, &open_call);
        at = to;
    }
    CHECK_OK(og_tool_parser_finish(p));
    take_into(p, &r);
    CHECK_OK(og_tool_parser_finish(s));
    pieces_into(s, &q, &open_call);
    CHECK_MSG(!open_call, "a call without its last piece");
    CHECK(og_tool_parser_total_calls(p) == r.n_calls);
    bool alike = q.n_content == r.n_content && !strcmp(q.content, r.content) && q.n_calls == r.n_calls;
    for (int i = 0; alike && i < r.n_calls && i < 8; i++)
        alike = !strcmp(q.names[i], r.names[i]) && !strcmp(q.args[i], r.args[i]);
    CHECK_MSG(alike, "the pieces give \"%s\" and %d calls (%s), take \"%s\" and %d calls (%s)", q.content,
              q.n_calls, q.n_calls ? q.args[0] : "", r.content, r.n_calls, r.n_calls ? r.args[0] : "");
    memcpy(r.arg_pieces, q.arg_pieces, sizeof r.arg_pieces);
    og_tool_parser_destroy(p);
    og_tool_parser_destroy(s);
    return r;
}

static bool same(const parsed *a, const parsed *b) {
    if (a->n_content != b->n_content || strcmp(a->content, b->content) || a->n_calls != b->n_calls) return false;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i])) return false;
    return true;
}

/* text parses into content and the calls "name" / "arguments" given in
 * pairs; every split into two pieces, and byte by byte, gives the same. */
static void expect(const char *what, const char *text, const char *content, int n_calls, ...) {
    parsed whole = parse_cut(text, NULL, 0);
    CHECK_MSG(!strcmp(whole.content, content), "%s: content \"%s\", want \"%s\"", what, whole.content, content);
    CHECK_MSG(whole.n_calls == n_calls, "%s: %d calls, want %d", what, whole.n_calls, n_calls);
    va_list ap;
    va_start(ap, n_calls);
    for (int i = 0; i < n_calls; i++) {
        const char *name = va_arg(ap, const char *), *args = va_arg(ap, const char *);
        if (i >= whole.n_calls) continue;
        CHECK_MSG(!strcmp(whole.names[i], name), "%s: call %d is '%s', want '%s'", what, i, whole.names[i], name);
        CHECK_MSG(!strcmp(whole.args[i], args), "%s: call %d arguments %s, want %s", what, i, whole.args[i], args);
    }
    va_end(ap);
    size_t n = strlen(text);
    for (size_t cut = 1; cut < n; cut++) {
        parsed two = parse_cut(text, &cut, 1);
        CHECK_MSG(same(&two, &whole), "%s: cut at %zu gives \"%s\" and %d calls", what, cut, two.content,
                  two.n_calls);
    }
    size_t *cuts = malloc(n * sizeof *cuts);
    for (size_t i = 0; cuts && i + 1 < n; i++) cuts[i] = i + 1;
    if (cuts && n > 1) {
        parsed bytes = parse_cut(text, cuts, (int)(n - 1));
        CHECK_MSG(same(&bytes, &whole), "%s: byte by byte gives \"%s\" and %d calls", what, bytes.content,
                  bytes.n_calls);
    }
    free(cuts);
}

static void hand_checked(void) {
    og_test_section("parsing: hand-checked outputs");
    expect("plain", "Hello there.\n\n", "Hello there.\n\n", 0);
    expect("empty", "", "", 0);
    expect("a lone <", "a < b, <tool and <tool_cal", "a < b, <tool and <tool_cal", 0);
    expect("a closing marker alone", "x </tool_call> y", "x </tool_call> y", 0);
    expect("one call", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
           1, "get_weather", "{\"city\": \"Paris\"}");
    expect("content then a call",
           "Let me look.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}\n</tool_call>\n",
           "Let me look.", 1, "f", "{\"a\": [1, {\"b\": \"}\"}]}");
    expect("two calls and text between",
           "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n  then  \n<tool_call>{\"arguments\":{\"x\":1},"
           "\"name\":\"b\"}</tool_call>",
           "then", 2, "a", "{}", "b", "{\"x\":1}");
    expect("arguments as a string", "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 2}\"}</tool_call>", "", 1,
           "f", "{\"q\": 2}");
    expect("parameters, no arguments", "<tool_call>{\"name\": \"f\", \"parameters\": {\"q\": null}}</tool_call>"
           "<tool_call>{\"name\": \"g\"}</tool_call>", "", 2, "f", "{\"q\": null}", "g", "{}");
    /* what cJSON lets through and strict parsers refuse: a raw newline in a
       string is escaped (cJSON's print), a NUL makes the body text */
    expect("a raw newline in a string", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a\nb\"}}</tool_call>", "",
           1, "f", "{\"s\": \"a\\nb\"}");
    expect("a raw newline, arguments first", "<tool_call>{\"arguments\": {\"s\": \"a\nb\"}, \"name\": \"f\"}</tool_call>",
           "", 1, "f", "{\"s\":\"a\\nb\"}");
    /* arguments that stop being JSON end the call at the last point where
       closing what is open makes them JSON; the rest of the block is
       dropped */
    expect("a control byte", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \x01 1}}</tool_call> ok", "ok", 1, "f",
           "{}");
    expect("broken in an array", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2, tru</tool_call>", "", 1,
           "f", "{\"a\": [1, 2]}");
    expect("a bad escape", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"ab\\q\"}}</tool_call>", "", 1, "f",
           "{\"s\": \"ab\"}");
    expect("a lone low surrogate", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\udc00\"}}</tool_call>", "",
           1, "f", "{\"s\": \"\"}");
    expect("a surrogate pair", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\ud83d\\ude00\"}}</tool_call>",
           "", 1, "f", "{\"s\": \"\\ud83d\\ude00\"}");
    expect("a number cut at its dot", "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": 2.", "", 1, "f",
           "{\"x\": 1, \"y\": 2}");
    expect("a member cut after its comma", "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": {\"y\": \"z\"}, \"w", "",
           1, "f", "{\"x\": {\"y\": \"z\"}}");
    expect("a leading zero", "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [0, 01]}}</tool_call>", "", 1, "f",
           "{\"x\": [0, 0]}");
    expect("the close marker in a string", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a</tool_call>b",
           "b", 1, "f", "{\"s\": \"a\"}");
    expect("a '<' in a string", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a < b </tool\"}}</tool_call>",
           "", 1, "f", "{\"s\": \"a < b </tool\"}");
    expect("a body that is not a call", "x <tool_call>not json</tool_call> y",
           "x <tool_call>not json</tool_call> y", 0);
    expect("a body without a name", "<tool_call>{\"arguments\": {}}</tool_call>",
           "<tool_call>{\"arguments\": {}}</tool_call>", 0);
    expect("unclosed call at the end", "ok\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": \"v\"}}\n", "ok", 1,
           "f", "{\"k\": \"v\"}");
    expect("unclosed text at the end", "ok <tool_call>{\"name\": \"f\", \"argu", "ok <tool_call>{\"name\": \"f\", \"argu",
           0);
    expect("thinking before the call",
           "<think>\nWeather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"\\u00e9\"}}\n</tool_call>",
           "<think>\nWeather.\n</think>", 1, "w", "{\"c\": \"\\u00e9\"}");
    og_test_section("parsing: Mistral's [TOOL_CALLS] and Llama 3.1's JSON");
    g_format = OG_TOOL_FORMAT_MISTRAL;
    expect("mistral a later element not a call",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"arguments\": {\"b\": 1}, \"name\": \"g\"}, 7] x", "7] x",
           2, "f", "{}", "g", "{\"b\": 1}");
    /* arguments that stop being JSON end the call there; the rest of its
       element is dropped (brackets in its strings do not count) and the
       array goes on (offgraph.h, og_tool_parser_take_pieces) */
    expect("mistral broken arguments",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": tru}}, {\"name\": \"g\", \"arguments\": {}}] after",
           "after", 2, "f", "{}", "g", "{}");
    expect("mistral broken in a string",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"s\": \"a\\q}]\"}, \"id\": \"x\"}, {\"name\": \"g\", "
           "\"arguments\": {\"b\": [1]}}]",
           "", 2, "f", "{\"s\": \"a\"}", "g", "{\"b\": [1]}");
    expect("mistral one object broken", "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"a\": 1 2}} x", "x", 1, "f",
           "{\"a\": 1 }");
    expect("mistral plain", "Bonjour [TOOL and [TOOL_CALL", "Bonjour [TOOL and [TOOL_CALL", 0);
    expect("mistral two calls",
           "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"]\"}, \"id\": \"abcdefghi\"}, "
           "{\"name\": \"add\", \"arguments\": {\"a\": 2}}]",
           "", 2, "get_weather", "{\"city\": \"]\"}", "add", "{\"a\": 2}");
    expect("mistral text then a call", "Sure.\n[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}] ok", "Sure.ok", 1, "f",
           "{}");
    expect("mistral one object", "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"x\": [1]}}", "", 1, "f",
           "{\"x\": [1]}");
    expect("mistral not JSON", "a [TOOL_CALLS] nothing", "a [TOOL_CALLS] nothing", 0);
    expect("mistral not calls", "[TOOL_CALLS][1, 2] x", "[TOOL_CALLS][1, 2] x", 0);
    expect("mistral unclosed", "[TOOL_CALLS][{\"name\": \"f\"", "[TOOL_CALLS][{\"name\": \"f\"", 0);
    g_format = OG_TOOL_FORMAT_LLAMA3;
    expect("llama plain", "  Hello {there}", "  Hello {there}", 0);
    expect("llama call", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1, "get_weather",
           "{\"city\": \"Paris\"}");
    expect("llama python tag", "<|python_tag|>{\"name\": \"f\", \"arguments\": {}}\n", "", 1, "f", "{}");
    expect("llama JSON that is not a call", "{\"name\": \"John\", \"age\": 3}", "{\"name\": \"John\", \"age\": 3}", 0);
    /* a call is a call from its arguments' start: what follows is content */
    expect("llama a call and more", "{\"name\": \"f\", \"parameters\": {}} and text", "and text", 1, "f", "{}");
    expect("llama parameters first", "{\"parameters\": {}, \"name\": \"f\"}", "", 1, "f", "{}");
    expect("llama broken", "{\"name\": \"f\", \"parameters\": {\"a\": 1 2}}", "2}}", 1, "f", "{\"a\": 1 }");
    expect("llama a lone tag start", "<|python", "<|python", 0);
    g_format = OG_TOOL_FORMAT_HERMES;
    /* not a parsed format: the text as it is */
    og_tool_parser *p = NULL;
    CHECK_OK(og_tool_parser_create(OG_TOOL_FORMAT_OTHER, &p));
    const char *t = "<tool_call>{\"name\": \"f\"}</tool_call> ";
    CHECK_OK(og_tool_parser_feed(p, t, strlen(t)));
    CHECK_OK(og_tool_parser_finish(p));
    parsed r;
    memset(&r, 0, sizeof r);
    take_into(p, &r);
    CHECK(r.n_calls == 0 && !strcmp(r.content, t));
    og_tool_parser_destroy(p);
    CHECK(og_tool_format_detect(NULL) == OG_TOOL_FORMAT_NONE);
    CHECK(og_tool_format_detect("{{ messages }}") == OG_TOOL_FORMAT_NONE);
}

/* Arguments as they stream: fed as a model's tokens would come (a few
 * bytes at a time), a call's arguments come in more than one piece, the
 * first naming the call, and they join into the call's arguments. */
static void streamed_pieces(void) {
    og_test_section("parsing: arguments in pieces as they arrive");
    static const struct {
        og_tool_format f;
        const char *text, *name, *args;
    } cases[] = {
        {OG_TOOL_FORMAT_HERMES,
         "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
         "\"celsius\", \"days\": [1, 2, 3]}}\n</tool_call>",
         "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\", \"days\": [1, 2, 3]}"},
        {OG_TOOL_FORMAT_MISTRAL,
         "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 40, \"note\": \"sum \\u00e9\"}}]",
         "add", "{\"a\": 2, \"b\": 40, \"note\": \"sum \\u00e9\"}"},
        {OG_TOOL_FORMAT_LLAMA3,
         "<|python_tag|>{\"name\": \"lookup\", \"parameters\": {\"query\": \"the longest river\", \"n\": 3}}",
         "lookup", "{\"query\": \"the longest river\", \"n\": 3}"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        g_format = cases[c].f;
        const char *t = cases[c].text;
        const size_t n = strlen(t);
        size_t cuts[256];
        int k = 0;
        for (size_t at = 3; at < n && k < 256; at += 3) cuts[k++] = at; /* 3-byte "tokens" */
        parsed r = parse_cut(t, cuts, k);
        CHECK_MSG(r.n_calls == 1 && !strcmp(r.names[0], cases[c].name) && !strcmp(r.args[0], cases[c].args),
                  "%s: %d calls, %s %s", og_tool_format_name(cases[c].f), r.n_calls, r.names[0], r.args[0]);
        CHECK_MSG(r.arg_pieces[0] >= 4, "%s: the arguments came in %d pieces", og_tool_format_name(cases[c].f),
                  r.arg_pieces[0]);
    }
    /* the first piece names the call before its arguments are complete */
    og_tool_parser *p = NULL;
    CHECK_OK(og_tool_parser_create(OG_TOOL_FORMAT_HERMES, &p));
    const char *head = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"xy";
    CHECK_OK(og_tool_parser_feed(p, head, strlen(head)));
    const og_tool_piece *pc;
    int k;
    CHECK_OK(og_tool_parser_take_pieces(p, &pc, &k));
    CHECK_MSG(k == 1 && pc[0].call == 0 && pc[0].name && !strcmp(pc[0].name, "f") && !pc[0].last &&
                  !strcmp(pc[0].text, "{\"a\": \"xy"),
              "the first piece: %d pieces, %s", k, k ? pc[0].text : "");
    /* a comma waits for what follows it (a member cut there ends closed) */
    CHECK_OK(og_tool_parser_feed(p, "z\", ", 3));
    CHECK_OK(og_tool_parser_take_pieces(p, &pc, &k));
    CHECK_MSG(k == 1 && !pc[0].name && !strcmp(pc[0].text, "z\""), "after a comma: %d pieces, %s", k, k ? pc[0].text : "");
    CHECK_OK(og_tool_parser_feed(p, " \"b\": 1}}\n</tool_call>", 22));
    CHECK_OK(og_tool_parser_take_pieces(p, &pc, &k));
    CHECK_MSG(k == 1 && !strcmp(pc[0].text, ", \"b\": 1}") && pc[0].last, "the end: %d pieces, %s", k,
              k ? pc[0].text : "");
    CHECK(og_tool_parser_total_calls(p) == 1);
    og_tool_parser_destroy(p);
    g_format = OG_TOOL_FORMAT_HERMES;
}

/* ------------------------------------------------------------ rendering */

static char *render(const og_chat_template *t, const cJSON *c, og_status *st) {
    char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "messages"));
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(c, "tools");
    char *tj = cJSON_IsArray(tools) ? cJSON_PrintUnformatted(tools) : NULL;
    og_chat_request req = {.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")),
                           .bos_token = str_or_null(c, "bos_token"), .eos_token = str_or_null(c, "eos_token"),
                           .messages_json = msgs, .tools_json = tj};
    char *out = NULL;
    *st = og_chat_template_render(t, &req, &out);
    cJSON_free(msgs);
    cJSON_free(tj);
    return out;
}

static const cJSON *find_case(const cJSON *cases, const char *path, const char *conv, bool agp) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        if (!strcmp(str_or_null(c, "template"), path) && !strcmp(str_or_null(c, "conversation"), conv) &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")) == agp)
            return c;
    }
    return NULL;
}

/* The assistant turn a Hermes template wrote for the last message of a
 * conversation (its text less the prompt of the conversation before it,
 * less the end-of-turn marker) parses into that message's calls. */
static int round_trip(const cJSON *cases, const cJSON *c, og_tool_format f) {
    const char *path = str_or_null(c, "template"), *conv = str_or_null(c, "conversation");
    const char *full = str_or_null(c, "expected");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
    const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")) || !full || !cJSON_IsArray(calls))
        return 0;
    const cJSON *pc = find_case(cases, path, "tools_user", true); /* [U1] and tools, the reply's prompt */
    const char *prompt = pc ? str_or_null(pc, "expected") : NULL;
    CHECK_MSG(prompt && !strncmp(full, prompt, strlen(prompt)), "%s %s: the prompt is not a prefix", path, conv);
    if (!prompt || strncmp(full, prompt, strlen(prompt))) return 0;
    char *reply = og_strdup(full + strlen(prompt));
    char *end = strstr(reply, str_or_null(c, "eos_token"));
    CHECK_MSG(end != NULL, "%s %s: no end of turn in \"%s\"", path, conv, reply);
    if (end) *end = 0;
    g_format = f;
    parsed r = parse_cut(reply, NULL, 0);
    g_format = OG_TOOL_FORMAT_HERMES;
    CHECK_MSG(r.n_calls == cJSON_GetArraySize(calls), "%s %s: %d calls in \"%s\"", path, conv, r.n_calls, reply);
    for (int i = 0; i < r.n_calls && i < cJSON_GetArraySize(calls); i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, i), "function");
        CHECK_MSG(!strcmp(r.names[i], str_or_null(fn, "name")), "%s %s: call %d named %s", path, conv, i, r.names[i]);
        cJSON *got = cJSON_Parse(r.args[i]);
        CHECK_MSG(got && cJSON_Compare(got, cJSON_GetObjectItemCaseSensitive(fn, "arguments"), true),
                  "%s %s: call %d arguments %s", path, conv, i, r.args[i]);
        cJSON_Delete(got);
    }
    /* the content: the message's (after Qwen3's empty thinking block), when
       the template wrote it (Llama's and Mistral's write only the calls) */
    const char *want = str_or_null(last, "content");
    size_t nw = strstr(reply, want) ? strlen(want) : 0;
    CHECK_MSG(r.n_content >= nw && !strcmp(r.content + r.n_content - nw, want + strlen(want) - nw),
              "%s %s: content \"%s\", want \"%s\"", path, conv, r.content, want);
    if (!nw) CHECK_MSG(!r.n_content || !strcmp(r.content, "<think>\n\n</think>"), "%s %s: content \"%s\"", path, conv,
                       r.content);
    og_free(reply);
    return 1;
}

static void rendering(void) {
    og_test_section("rendering tools and calls against transformers");
    char path[512];
    snprintf(path, sizeof path, "%s/chat_templates/tool_cases.json", OG_TEST_DATA_DIR);
    char *text = og_test_read_file(path);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!root) return;
    printf("fixtures: %s\n", str_or_null(root, "generator"));
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases"), *c;
    char *loaded = NULL;
    og_chat_template *t = NULL;
    og_tool_format f = OG_TOOL_FORMAT_NONE;
    int n = 0, n_refused = 0, n_round = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *tp = str_or_null(c, "template");
        if (!loaded || strcmp(loaded, tp)) {
            og_chat_template_destroy(t);
            t = NULL;
            free(loaded);
            loaded = strdup(tp);
            char full[1024];
            snprintf(full, sizeof full, "%s/%s", OG_TEST_DATA_DIR, tp);
            char *src = og_test_read_file(full);
            CHECK_MSG(src != NULL, "cannot read %s", full);
            if (src) CHECK_OK(og_chat_template_create(src, OG_CHAT_PLAIN, &t));
            f = og_tool_format_detect(src);
            /* Qwen's write <tool_call>, Llama 3.1's bare JSON, Mistral's [TOOL_CALLS] */
            CHECK_MSG(f == (strstr(tp, "qwen") ? OG_TOOL_FORMAT_HERMES
                            : strstr(tp, "llama") ? OG_TOOL_FORMAT_LLAMA3 : OG_TOOL_FORMAT_MISTRAL),
                      "%s: format %s", tp, og_tool_format_name(f));
            free(src);
        }
        if (!t) continue;
        og_status st;
        char *got = render(t, c, &st);
        const char *want = str_or_null(c, "expected"), *err = str_or_null(c, "error");
        char what[256];
        snprintf(what, sizeof what, "%s %s add_generation_prompt=%d", tp, str_or_null(c, "conversation"),
                 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")));
        if (want) {
            CHECK_MSG(st == OG_OK && got && !strcmp(got, want), "%s: got %s\n\"%s\"\nwant\n\"%s\"", what,
                      st == OG_OK ? "text" : og_last_error(), got ? got : "(none)", want);
        } else {
            CHECK_MSG(st != OG_OK, "%s: rendered, but the reference refused it (%s)", what, err);
            if (st != OG_OK && err)
                CHECK_MSG(strstr(og_last_error(), err) != NULL, "%s: error \"%s\" lacks \"%s\"", what, og_last_error(),
                          err);
            n_refused++;
        }
        og_free(got);
        n++;
        n_round += round_trip(cases, c, f);
    }
    printf("%d cases (%d refused), %d assistant turns parsed back\n", n, n_refused, n_round);
    CHECK(n >= 80 && n_refused >= 4 && n_round >= 15);
    og_chat_template_destroy(t);
    free(loaded);
    cJSON_Delete(root);
}

/* ------------------------------------------------------------ the grammar */

static const char *const TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","
    "\"fahrenheit\"]}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

/* 1: g takes s whole; 0: it refuses a byte; 2: a prefix only. */
static int match(const og_grammar *g, const char *s) {
    static const char *const t[] = {"a"};
    size_t l[] = {1};
    og_grammar_vocab *v = NULL;
    og_grammar_vocab_create_bytes(t, l, 1, NULL, 0, &v);
    og_matcher *m = NULL;
    int r = -1;
    if (v && og_matcher_create(g, v, &m) == OG_OK)
        r = og_matcher_accept_bytes(m, s, strlen(s)) != OG_OK ? 0 : og_matcher_can_end(m) ? 1 : 2;
    og_matcher_destroy(m);
    og_grammar_vocab_destroy(v);
    return r;
}

static void grammar(void) {
    og_test_section("the grammar of required and named calls");
    /* what Qwen's templates write for a call (tests/data/chat_templates/tool_cases.json) */
    const char *weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
                          "\"celsius\"}}\n</tool_call>";
    const char *add = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 40}}\n</tool_call>";
    const char *now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", weather, add);
    og_grammar *any = NULL, *named = NULL, *par = NULL;
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_HERMES, TOOLS, NULL, false, &any));
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_HERMES, TOOLS, "add", false, &named));
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_HERMES, TOOLS, NULL, true, &par));
    if (any && named && par) {
        CHECK(match(any, weather) == 1);
        CHECK(match(any, add) == 1);
        CHECK(match(any, now) == 1);
        CHECK(match(any, two) == 0); /* one call only */
        CHECK(match(par, two) == 1);
        CHECK(match(named, add) == 1);
        CHECK(match(named, weather) == 0);
        CHECK(match(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n</tool_call>") == 0);
        CHECK(match(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"unit\": \"kelvin\"}}") == 0);
        CHECK(match(any, "<tool_call>\n{\"name\": \"nope\"") == 0);
        CHECK(match(any, "Sure! <tool_call>") == 0);
        CHECK(match(any, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>") == 0); /* the template's spacing */
        CHECK(match(any, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1.5") == 0);
        CHECK(match(any, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}") == 2);
        /* what the grammar makes parses back into the call */
        parsed r = parse_cut(two, NULL, 0);
        CHECK(r.n_calls == 2 && !strcmp(r.names[1], "add") && !strcmp(r.args[1], "{\"a\": 2, \"b\": 40}") &&
              r.n_content == 0);
    }
    og_grammar_destroy(any);
    og_grammar_destroy(named);
    og_grammar_destroy(par);
    /* Mistral's and Llama's, as their templates write calls */
    og_grammar *mi = NULL, *mi1 = NULL, *ll = NULL;
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_MISTRAL, TOOLS, NULL, true, &mi));
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_MISTRAL, TOOLS, NULL, false, &mi1));
    CHECK_OK(og_tool_calls_grammar(OG_TOOL_FORMAT_LLAMA3, TOOLS, "get_weather", true, &ll));
    if (mi && mi1 && ll) {
        const char *m2 = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
                         "\"celsius\"}}, {\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 40}}]";
        CHECK(match(mi, m2) == 1);
        CHECK(match(mi1, m2) == 0);
        CHECK(match(mi1, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 40}}]") == 1);
        CHECK(match(ll, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}") == 1);
        CHECK(match(ll, "{\"name\": \"get_weather\", \"arguments\": {") == 0);
        g_format = OG_TOOL_FORMAT_MISTRAL;
        parsed r = parse_cut(m2, NULL, 0);
        g_format = OG_TOOL_FORMAT_HERMES;
        CHECK(r.n_calls == 2 && !strcmp(r.names[0], "get_weather") && r.n_content == 0);
    }
    og_grammar_destroy(mi);
    og_grammar_destroy(mi1);
    og_grammar_destroy(ll);
    og_grammar *g = NULL;
    CHECK_STATUS(og_tool_calls_grammar(OG_TOOL_FORMAT_HERMES, TOOLS, "missing", false, &g), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "missing") != NULL);
    CHECK_STATUS(og_tool_calls_grammar(OG_TOOL_FORMAT_OTHER, TOOLS, NULL, false, &g), OG_ERR_INVALID_ARGUMENT);
    const char *bad = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"^a\"}}}}}]";
    CHECK_STATUS(og_tool_calls_grammar(OG_TOOL_FORMAT_HERMES, bad, NULL, false, &g), OG_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(og_last_error(), "pattern") && strstr(og_last_error(), "'f'"), "%s", og_last_error());
    CHECK(g == NULL);
    /* the public text form: what og_tool_calls_grammar parses, refused alike */
    char *text = NULL;
    CHECK_OK(og_tool_calls_grammar_text(OG_TOOL_FORMAT_HERMES, TOOLS, "add", false, &text));
    if (text) {
        CHECK_MSG(!strncmp(text, "root ::= call\ncall ::= \"<tool_call>\\n\" (", 38), "%s", text);
        CHECK(strstr(text, "add") && !strstr(text, "get_weather"));
        CHECK_OK(og_grammar_parse(text, strlen(text), &g));
        CHECK(match(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 40}}\n</tool_call>") == 1);
        og_grammar_destroy(g);
        og_free(text);
    }
    text = (char *)"untouched";
    CHECK_STATUS(og_tool_calls_grammar_text(OG_TOOL_FORMAT_NONE, TOOLS, NULL, false, &text), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_tool_calls_grammar_text(OG_TOOL_FORMAT_HERMES, "{}", NULL, false, &text), OG_ERR_INVALID_ARGUMENT);
}

/* Call ids: as given, or Mistral's 9 letters and digits (its template
 * raises on any other id), the same for the same input, and apart for
 * different ones. */
static void call_ids(void) {
    char a[64], b[64], small[4];
    CHECK_OK(og_tool_call_id(OG_TOOL_FORMAT_HERMES, "call_abc0", a, sizeof a));
    CHECK(!strcmp(a, "call_abc0"));
    CHECK_STATUS(og_tool_call_id(OG_TOOL_FORMAT_HERMES, "call_abc0", small, sizeof small), OG_ERR_CAPACITY);
    CHECK_OK(og_tool_call_id(OG_TOOL_FORMAT_MISTRAL, "call_abc0", a, sizeof a));
    CHECK_OK(og_tool_call_id(OG_TOOL_FORMAT_MISTRAL, "call_abc1", b, sizeof b));
    CHECK(strlen(a) == 9 && strlen(b) == 9 && strcmp(a, b));
    for (int i = 0; i < 9; i++)
        CHECK((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'z') || (a[i] >= 'A' && a[i] <= 'Z'));
    CHECK_OK(og_tool_call_id(OG_TOOL_FORMAT_MISTRAL, "call_abc1", a, sizeof a));
    CHECK(!strcmp(a, b));
    CHECK_STATUS(og_tool_call_id(OG_TOOL_FORMAT_MISTRAL, "call_abc1", small, sizeof small), OG_ERR_CAPACITY);
    CHECK(og_tokenizer_tool_format(NULL) == OG_TOOL_FORMAT_NONE);
}

int main(void) {
    hand_checked();
    streamed_pieces();
    rendering();
    grammar();
    call_ids();
    return og_test_finish();
}
