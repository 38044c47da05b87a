/* Chat templates rendered by src/model/jinja.c against what Hugging Face
 * transformers' apply_chat_template(tokenize=False) renders:
 * tests/data/chat_templates/cases.json, made by
 * tests/fixtures/make_chat_template_fixtures.py, holds published templates
 * (Qwen2.5, Qwen3 with enable_thinking, Llama 3.1, Mistral, Gemma, Phi-3,
 * ...) over several conversations, conversations the templates refuse with
 * raise_exception, and small templates for each part of the language. Also:
 * the fallback formats (ChatML against the same fixtures, the others against
 * hand-written text), syntax errors naming their line, and the render
 * limits. */
#include "harness.h"
#include "core/core.h"
#include "text/chat_template.h"
#include "text/jinja.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *str_or_null(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Renders one fixture case with t; returns the text (og_free) or NULL. */
static char *render_case(const og_chat_template *t, const cJSON *c, og_status *st) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
    const cJSON *flags = cJSON_GetObjectItemCaseSensitive(c, "flags");
    og_chat_message m[16];
    og_chat_flag f[8];
    size_t nm = 0, nf = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, msgs) {
        if (nm < 16) m[nm++] = (og_chat_message){str_or_null(x, "role"), str_or_null(x, "content")};
    }
    cJSON_ArrayForEach(x, flags) {
        if (nf < 8) f[nf++] = (og_chat_flag){x->string, cJSON_IsTrue(x)};
    }
    og_chat_request req = {.messages = m, .n_messages = nm,
                           .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")),
                           .bos_token = str_or_null(c, "bos_token"), .eos_token = str_or_null(c, "eos_token"),
                           .flags = f, .n_flags = nf};
    char *out = NULL;
    *st = og_chat_template_render(t, &req, &out);
    return out;
}

static void check_case(const char *what, const cJSON *c, og_status st, const char *got) {
    const char *want = str_or_null(c, "expected"), *err = str_or_null(c, "error");
    const char *etype = str_or_null(c, "error_type");
    if (want) {
        CHECK_MSG(st == OG_OK && got && !strcmp(got, want), "%s: got %s\n\"%s\"\nwant\n\"%s\"", what,
                  st == OG_OK ? "text" : og_last_error(), got ? got : "(none)", want);
    } else {
        CHECK_MSG(st != OG_OK, "%s: rendered \"%s\", but the reference refused it (%s)", what, got ? got : "", err);
        /* raise_exception's message comes through */
        if (st != OG_OK && etype && !strcmp(etype, "TemplateError") && err)
            CHECK_MSG(strstr(og_last_error(), err) != NULL, "%s: error \"%s\" does not carry \"%s\"", what,
                      og_last_error(), err);
    }
}

static void fixture_cases(const cJSON *cases) {
    og_test_section("published templates against transformers");
    char *loaded_path = NULL;
    og_chat_template *t = NULL, *chatml = NULL;
    CHECK_OK(og_chat_template_create(NULL, OG_CHAT_CHATML, &chatml));
    int n = 0, n_chatml = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *path = str_or_null(c, "template");
        if (!path) continue;
        if (!loaded_path || strcmp(loaded_path, path)) {
            og_chat_template_destroy(t);
            t = NULL;
            free(loaded_path);
            loaded_path = strdup(path);
            char full[1024];
            snprintf(full, sizeof full, "%s/%s", OG_TEST_DATA_DIR, path);
            char *text = og_test_read_file(full);
            CHECK_MSG(text != NULL, "cannot read %s", full);
            if (text) {
                CHECK_OK(og_chat_template_create(text, OG_CHAT_PLAIN, &t));
                CHECK(og_chat_template_is_jinja(t));
            }
            free(text);
        }
        if (!t) continue;
        char what[256];
        const cJSON *flags = cJSON_GetObjectItemCaseSensitive(c, "flags");
        char *fl = cJSON_PrintUnformatted(flags);
        snprintf(what, sizeof what, "%s %s add_generation_prompt=%d %s", path, str_or_null(c, "conversation"),
                 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")), fl ? fl : "");
        free(fl);
        og_status st;
        char *got = render_case(t, c, &st);
        check_case(what, c, st, got);
        og_free(got);
        n++;
        /* the ChatML fallback writes what the plain ChatML template writes */
        if (!strcmp(path, "hf/qwen2-bias/chat_template.jinja")) {
            got = render_case(chatml, c, &st);
            snprintf(what, sizeof what, "chatml fallback %s", str_or_null(c, "conversation"));
            check_case(what, c, st, got);
            og_free(got);
            n_chatml++;
        }
    }
    printf("%d template cases, %d through the ChatML fallback\n", n, n_chatml);
    CHECK(n >= 150 && n_chatml >= 10);
    og_chat_template_destroy(t);
    og_chat_template_destroy(chatml);
    free(loaded_path);
}

static void feature_cases(const cJSON *features) {
    og_test_section("language features against transformers");
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, features) {
        const char *name = str_or_null(c, "name"), *src = str_or_null(c, "template_text");
        og_jinja *j = NULL;
        og_status st = og_jinja_parse(src, strlen(src), &j);
        char *got = NULL;
        if (st == OG_OK) st = og_jinja_render(j, cJSON_GetObjectItemCaseSensitive(c, "vars"), NULL, &got, NULL);
        check_case(name, c, st, got);
        og_free(got);
        og_jinja_free(j);
        n++;
    }
    printf("%d feature cases\n", n);
    CHECK(n >= 25);
}

static void expect_fallback(og_chat_format f, const og_chat_message *m, size_t n, bool agp, const char *want) {
    og_chat_template *t = NULL;
    CHECK_OK(og_chat_template_create(NULL, f, &t));
    CHECK(!og_chat_template_is_jinja(t));
    og_chat_request req = {.messages = m, .n_messages = n, .add_generation_prompt = agp};
    char *got = NULL;
    CHECK_OK(og_chat_template_render(t, &req, &got));
    CHECK_MSG(got && !strcmp(got, want), "%s fallback: got \"%s\", want \"%s\"", og_chat_format_name(f),
              got ? got : "(null)", want);
    og_free(got);
    og_chat_template_destroy(t);
}

static void fallbacks(void) {
    og_test_section("fallback formats (hand-written expectations)");
    const og_chat_message conv[] = {{"system", "Be brief."}, {"user", "hi"}, {"assistant", "hello"},
                                    {"user", "100% %s"}};
    expect_fallback(OG_CHAT_LLAMA3, conv, 4, true,
                    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\n100% %s<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_fallback(OG_CHAT_MISTRAL, conv, 4, true, "<s>[INST] Be brief.\n\nhi [/INST]hello</s>[INST] 100% %s [/INST]");
    expect_fallback(OG_CHAT_PLAIN, conv, 4, true, "Be brief.\nhi\nhello\n100% %s\n");
    expect_fallback(OG_CHAT_PLAIN, conv + 1, 1, true, "hi\n");
    expect_fallback(OG_CHAT_CHATML, conv + 1, 2, false,
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n");
}

static void detect(void) {
    og_test_section("end-of-turn markers");
    char path[512];
    snprintf(path, sizeof path, "%s/hf/qwen2-bias/chat_template.jinja", OG_TEST_DATA_DIR);
    char *tpl = og_test_read_file(path);
    CHECK(tpl && og_chat_format_detect(tpl) == OG_CHAT_CHATML);
    CHECK(tpl && !strcmp(og_chat_template_end_marker(tpl), "<|im_end|>"));
    free(tpl);
    struct { const char *file, *marker; } known[] = {
        {"llama-3.1", "<|eot_id|>"}, {"mistral-instruct-v0.1", "</s>"}, {"gemma", "<end_of_turn>"},
        {"phi-3", "<|end|>"}, {"qwen3", "<|im_end|>"}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        snprintf(path, sizeof path, "%s/chat_templates/%s.jinja", OG_TEST_DATA_DIR, known[i].file);
        tpl = og_test_read_file(path);
        const char *m = tpl ? og_chat_template_end_marker(tpl) : NULL;
        CHECK_MSG(m && !strcmp(m, known[i].marker), "%s: marker %s, want %s", known[i].file, m ? m : "(none)",
                  known[i].marker);
        free(tpl);
    }
    CHECK(og_chat_template_end_marker("{% for m in messages %}### {{ m['role'] }}{% endfor %}") == NULL);
    CHECK(og_chat_format_detect(NULL) == OG_CHAT_PLAIN);
}

static void expect_parse_error(const char *src, const char *needle) {
    og_jinja *j = NULL;
    og_status st = og_jinja_parse(src, strlen(src), &j);
    CHECK_MSG(st == OG_ERR_FORMAT && strstr(og_last_error(), needle), "parse of \"%s\": %s (%s), want \"%s\"", src,
              og_status_str(st), og_last_error(), needle);
    og_jinja_free(j);
}

static void expect_render_error(const char *src, const og_jinja_limits *lim, const char *needle) {
    og_jinja *j = NULL;
    char *out = NULL;
    CHECK_OK(og_jinja_parse(src, strlen(src), &j));
    og_status st = j ? og_jinja_render(j, NULL, lim, &out, NULL) : OG_ERR_FORMAT;
    CHECK_MSG(st != OG_OK && strstr(og_last_error(), needle), "render of \"%.60s\": %s (%s), want \"%s\"", src,
              og_status_str(st), og_last_error(), needle);
    CHECK(out == NULL);
    og_jinja_free(j);
}

static void errors_and_limits(void) {
    og_test_section("errors name the line; limits hold");
    expect_parse_error("a\nb\n{% if x %}\nno end", "line 3: 'if' is not closed (expected {% endif %})");
    expect_parse_error("{% for x in y %}{% endif %}", "line 1: unexpected 'endif' inside for");
    expect_parse_error("\n\n{{ 1 + }}", "line 3: expected an expression");
    expect_parse_error("{{ 'abc }}", "a string literal is not closed");
    expect_parse_error("{% frobnicate %}", "unknown or unsupported statement 'frobnicate'");
    expect_parse_error("{# open comment", "a comment is not closed");
    expect_parse_error("x {{ a", "a {{ tag is not closed");
    /* nesting past the parser's bound is refused, not a stack overflow */
    size_t deep = 5000;
    char *s = malloc(deep * 2 + 16);
    size_t k = 0;
    k += (size_t)sprintf(s, "{{ ");
    for (size_t i = 0; i < deep; i++) s[k++] = '(';
    s[k++] = '1';
    for (size_t i = 0; i < deep; i++) s[k++] = ')';
    strcpy(s + k, " }}");
    expect_parse_error(s, "nesting deeper than");
    free(s);

    expect_render_error("\n{{ raise_exception('no system role') }}", NULL, "line 2: raise_exception: no system role");
    expect_render_error("{{ messages[0].content }}", NULL, "undefined");
    expect_render_error("{% for x in 5 %}{% endfor %}", NULL, "not iterable");
    expect_render_error("{{ 1 // 0 }}", NULL, "by zero");
    expect_render_error("{% break %}", NULL, "outside a loop");
    og_jinja_limits lim = og_jinja_default_limits();
    lim.max_output = 1000;
    expect_render_error("{% for i in range(2000) %}x{% endfor %}", &lim, "output is longer than 1000 bytes");
    lim = og_jinja_default_limits();
    lim.max_steps = 100000;
    expect_render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", &lim,
                        "more than 100000 steps");
    lim = og_jinja_default_limits();
    lim.max_memory = 1 << 20;
    expect_render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                        &lim, "memory");
    expect_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "macro calls nested deeper");
    /* a render with NULL variables, and one refused for non-object variables */
    og_jinja *j = NULL;
    char *out = NULL;
    size_t n = 0;
    CHECK_OK(og_jinja_parse("x{{ y }}z\n", 10, &j));
    CHECK_OK(og_jinja_render(j, NULL, NULL, &out, &n));
    CHECK(out && !strcmp(out, "xz") && n == 2); /* one trailing newline is dropped, as Jinja does */
    og_free(out);
    cJSON *arr = cJSON_CreateArray();
    CHECK_STATUS(og_jinja_render(j, arr, NULL, &out, NULL), OG_ERR_INVALID_ARGUMENT);
    cJSON_Delete(arr);
    og_jinja_free(j);
    /* a template that does not parse is refused by the chat API too */
    og_chat_template *t = NULL;
    CHECK_STATUS(og_chat_template_create("{% if %}", OG_CHAT_PLAIN, &t), OG_ERR_FORMAT);
    CHECK(t == NULL);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat_templates/cases.json", OG_TEST_DATA_DIR);
    char *text = og_test_read_file(path);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(root != NULL, "%s is not JSON", path);
    if (root) {
        const char *gen = str_or_null(root, "generator");
        printf("fixtures: %s\n", gen ? gen : "(unknown)");
        fixture_cases(cJSON_GetObjectItemCaseSensitive(root, "cases"));
        feature_cases(cJSON_GetObjectItemCaseSensitive(root, "features"));
    }
    cJSON_Delete(root);
    free(text);
    fallbacks();
    detect();
    errors_and_limits();
    return og_test_finish();
}
