/* Constrained generation end to end: the demo model (models/kjv-tiny, which
 * knows only the King James Bible) through og_engine with the grammar's
 * constraint hook, greedy and sampled, under JSON schemas and a GBNF
 * grammar. Each output must end by the model's end token (the grammar
 * complete), parse, and validate against its schema by a published
 * validator: the outputs and schemas are written to a folder and
 * tests/grammar/validate.py checks them with Debian's python3-jsonschema. The GBNF
 * output is checked by a plain C reader of its language written here. */
#include "harness.h"

#include "core/core.h"
#include "import/export.h"
#include "text/grammar.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const k_schemas[] = {
    /* a record: required and optional properties, enum, bounded strings and arrays */
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":24},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tribe\":{\"enum\":[\"Judah\",\"Levi\",\"Benjamin\"]},"
    "\"faithful\":{\"type\":\"boolean\"},"
    "\"sons\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"minItems\":1,\"maxItems\":3},"
    "\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":16}},"
    "\"required\":[\"name\",\"age\",\"tribe\",\"sons\"],\"additionalProperties\":false}",
    /* nesting, anyOf, a number, $defs */
    "{\"$defs\":{\"place\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":20},"
    "\"x\":{\"type\":\"number\"}},\"required\":[\"city\",\"x\"],\"additionalProperties\":false}},"
    "\"type\":\"object\",\"properties\":{\"from\":{\"$ref\":\"#/$defs/place\"},"
    "\"to\":{\"anyOf\":[{\"$ref\":\"#/$defs/place\"},{\"type\":\"null\"}]},"
    "\"days\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":4}},"
    "\"required\":[\"from\",\"to\",\"days\"],\"additionalProperties\":false}",
    /* a top-level array of constants and short strings */
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"const\":\"amen\"},{\"type\":\"string\",\"maxLength\":8}]},"
    "\"minItems\":2,\"maxItems\":5}",
};

/* A GBNF grammar, and a plain reader of its language: "A:" then 1..3
 * comma-separated words of 1..8 lowercase letters, then "." */
static const char *k_gbnf = "root ::= [A-Z] \": \" word (\", \" word){0,2} \".\"\nword ::= [a-z]{1,8}\n";

static int gbnf_reader(const char *s) {
    if (!(*s >= 'A' && *s <= 'Z')) return 0;
    s++;
    if (strncmp(s, ": ", 2)) return 0;
    s += 2;
    for (int w = 0; w < 3; w++) {
        int n = 0;
        while (*s >= 'a' && *s <= 'z') s++, n++;
        if (n < 1 || n > 8) return 0;
        if (*s == '.') return !s[1];
        if (w == 2 || strncmp(s, ", ", 2)) return 0;
        s += 2;
    }
    return 0;
}

typedef struct outcome {
    char *text;
    og_finish_reason finish;
    int64_t tokens;
} outcome;

static outcome generate(og_engine *e, const og_grammar *g, const og_grammar_vocab *v, const char *prompt,
                        float temperature, uint64_t seed) {
    outcome o = {0};
    og_matcher *m = NULL;
    CHECK_OK(og_matcher_create(g, v, &m));
    og_request_params p = og_request_default_params();
    p.text = prompt;
    p.max_tokens = 700;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.constraint = og_grammar_constraint;
    p.constraint_ctx = m;
    og_request *r = NULL;
    CHECK_OK(og_engine_submit(e, &p, &r));
    size_t n = 0, cap = 4096;
    o.text = calloc(cap, 1);
    while (r && o.text) {
        og_request_output out;
        CHECK_OK(og_request_next(r, &out, -1));
        if (n + out.n_text + 1 > cap) {
            cap = (n + out.n_text + 1) * 2;
            o.text = realloc(o.text, cap);
        }
        memcpy(o.text + n, out.text, out.n_text);
        n += out.n_text;
        o.text[n] = 0;
        if (out.finish != OG_FINISH_NONE) {
            o.finish = out.finish;
            o.tokens = out.completion_tokens;
            if (out.finish == OG_FINISH_ERROR) fprintf(stderr, "error: %s\n", out.error);
            break;
        }
    }
    og_request_destroy(r);
    CHECK_MSG(og_matcher_error(m) == NULL, "matcher: %s", og_matcher_error(m));
    og_matcher_destroy(m);
    return o;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int main(void) {
    char dir[] = "/tmp/og_test_grammar_XXXXXX", path[600];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/kjv.ogp", dir);
    og_export_options eo;
    og_export_default_options(&eo);
    CHECK_OK(og_export_hf(OG_SOURCE_DIR "/models/kjv-tiny", path, &eo, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    og_model *model = NULL;
    og_tokenizer *tok = NULL;
    CHECK_OK(og_model_load(path, &mp, &model));
    remove(path);
    if (model) CHECK_OK(og_tokenizer_from_model(model, &tok));
    og_grammar_vocab *v = NULL;
    if (tok) CHECK_OK(og_grammar_vocab_create(tok, og_model_vocab_size(model), NULL, 0, &v));
    og_engine_params ep = og_engine_default_params();
    og_engine *e = NULL;
    if (v) CHECK_OK(og_engine_create(model, tok, &ep, &e));
    int files = 0;
    static const char *const prompts[] = {"And the LORD spake unto Moses, saying,", "In the beginning"};
    for (size_t s = 0; e && s < sizeof k_schemas / sizeof *k_schemas; s++) {
        og_grammar *g = NULL;
        CHECK_OK(og_grammar_from_json_schema(k_schemas[s], strlen(k_schemas[s]), &g));
        if (!g) continue;
        snprintf(path, sizeof path, "%s/%zu.schema.json", dir, s);
        write_file(path, k_schemas[s]);
        /* greedy from two prompts, then sampled with three seeds */
        for (int run = 0; run < 5; run++) {
            outcome o = generate(e, g, v, prompts[run % 2], run < 2 ? 0.0f : 1.0f, 1000 + (uint64_t)run);
            fprintf(stderr, "schema %zu run %d (%s): %lld tokens: %s\n", s, run, run < 2 ? "greedy" : "sampled",
                    (long long)o.tokens, o.text ? o.text : "");
            CHECK_MSG(o.finish == OG_FINISH_STOP, "schema %zu run %d: finish %d, not the end token", s, run,
                      (int)o.finish);
            snprintf(path, sizeof path, "%s/%zu.%d.out.json", dir, s, run);
            write_file(path, o.text ? o.text : "");
            files++;
            free(o.text);
        }
        og_grammar_destroy(g);
    }
    /* a GBNF grammar, sampled: the reader agrees */
    og_grammar *g = NULL;
    CHECK_OK(og_grammar_parse(k_gbnf, strlen(k_gbnf), &g));
    for (int run = 0; e && g && run < 4; run++) {
        outcome o = generate(e, g, v, prompts[run % 2], run ? 0.9f : 0.0f, 77 + (uint64_t)run);
        fprintf(stderr, "gbnf run %d: %s\n", run, o.text ? o.text : "");
        CHECK_MSG(o.finish == OG_FINISH_STOP && o.text && gbnf_reader(o.text), "gbnf run %d: \"%s\" (finish %d)", run,
                  o.text ? o.text : "", (int)o.finish);
        free(o.text);
    }
    og_grammar_destroy(g);
    og_engine_destroy(e);
    /* the published validator over every output */
    char cmd[1400];
    /* Debian's python3 and python3-jsonschema (scripts/install-deps.sh), not another python3 on the PATH */
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    snprintf(cmd, sizeof cmd, "%s %s/tests/grammar/validate.py %s", py, OG_SOURCE_DIR, dir);
    int rc = files ? system(cmd) : -1;
    CHECK_MSG(rc == 0, "%s: exit status %d", cmd, rc);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    og_grammar_vocab_destroy(v);
    og_tokenizer_destroy(tok);
    og_model_destroy(model);
    return og_test_finish();
}
