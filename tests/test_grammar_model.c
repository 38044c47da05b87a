/* Constrained generation end to end: the demo model (models/kjv-tiny, which
 * knows only the King James Bible) through og_engine with the grammar's
 * constraint hook (or the schema or grammar text in the request, which the
 * engine compiles), greedy and sampled, under JSON schemas and a GBNF
 * grammar, every request submitted at once (batched steps whose rows follow
 * different grammars, a matcher per request). Each output must end by the model's end token (the grammar
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

/* The schemas below are long literals split over lines inside an array
 * initializer, on purpose: clang would take each split for a missing comma. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wstring-concatenation"
#endif

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

typedef struct job {
    og_matcher *m;
    og_request *r;
    char *text;
    og_finish_reason finish;
    int64_t tokens;
} job;

/* Submits one constrained request: with its own matcher as the constraint
 * hook, or (by_engine) with the schema or GBNF text in the request, the
 * engine compiling it and making the matcher. */
static void submit(og_engine *e, const og_grammar *g, const og_grammar_vocab *v, const char *schema,
                   const char *gbnf, bool by_engine, const char *prompt, float temperature, uint64_t seed, job *j) {
    memset(j, 0, sizeof *j);
    og_request_params p = og_request_default_params();
    p.text = prompt;
    p.max_tokens = 700;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    if (by_engine) {
        p.json_schema = schema;
        p.grammar = gbnf;
        CHECK_OK(og_engine_submit(e, &p, &j->r));
        return;
    }
    CHECK_OK(og_matcher_create(g, v, &j->m));
    p.constraint = og_grammar_constraint;
    p.constraint_ctx = j->m;
    if (j->m) CHECK_OK(og_engine_submit(e, &p, &j->r));
}

/* Reads a request to its end, then frees it and its matcher. */
static void collect(job *j) {
    size_t n = 0, cap = 4096;
    j->text = calloc(cap, 1);
    while (j->r && j->text) {
        og_request_output out;
        CHECK_OK(og_request_next(j->r, &out, -1));
        if (n + out.n_text + 1 > cap) {
            cap = (n + out.n_text + 1) * 2;
            j->text = realloc(j->text, cap);
            if (!j->text) break;
        }
        memcpy(j->text + n, out.text, out.n_text);
        n += out.n_text;
        j->text[n] = 0;
        if (out.finish != OG_FINISH_NONE) {
            j->finish = out.finish;
            j->tokens = out.completion_tokens;
            if (out.finish == OG_FINISH_ERROR) fprintf(stderr, "error: %s\n", out.error);
            break;
        }
    }
    og_request_destroy(j->r);
    if (j->m) CHECK_MSG(og_matcher_error(j->m) == NULL, "matcher: %s", og_matcher_error(j->m));
    og_matcher_destroy(j->m);
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
    /* what the engine refuses at submit, by name */
    if (e) {
        og_request_params p = og_request_default_params();
        og_request *r = NULL;
        p.text = "In the beginning";
        p.grammar = k_gbnf;
        p.json_schema = k_schemas[0];
        CHECK(og_engine_submit(e, &p, &r) == OG_ERR_INVALID_ARGUMENT && !r);
        p.json_schema = NULL;
        p.grammar = "root ::= \"a\" (";
        CHECK(og_engine_submit(e, &p, &r) == OG_ERR_FORMAT && !r && strstr(og_last_error(), "line 1"));
        p.grammar = NULL;
        p.json_schema = "{\"type\":\"string\",\"format\":\"email\"}";
        CHECK(og_engine_submit(e, &p, &r) == OG_ERR_UNSUPPORTED && !r && strstr(og_last_error(), "email"));
    }
    /* every request at once, so that the engine's batched steps carry
     * rows of different grammars side by side: per schema greedy from two
     * prompts and sampled with three seeds, and the GBNF grammar greedy and
     * sampled */
    enum { N_SCHEMA = sizeof k_schemas / sizeof *k_schemas, RUNS = 5, GBNF_RUNS = 4 };
    static const char *const prompts[] = {"And the LORD spake unto Moses, saying,", "In the beginning"};
    og_grammar *gs[N_SCHEMA + 1] = {0};
    job jobs[N_SCHEMA * RUNS + GBNF_RUNS];
    int n_jobs = 0, files = 0;
    for (int s = 0; e && s <= N_SCHEMA; s++) {
        if (s < N_SCHEMA) {
            CHECK_OK(og_grammar_from_json_schema(k_schemas[s], strlen(k_schemas[s]), &gs[s]));
            snprintf(path, sizeof path, "%s/%d.schema.json", dir, s);
            write_file(path, k_schemas[s]);
        } else
            CHECK_OK(og_grammar_parse(k_gbnf, strlen(k_gbnf), &gs[s]));
        /* runs 1 and 3 give the engine the schema or grammar text (og_request_params) */
        for (int run = 0; gs[s] && run < (s < N_SCHEMA ? RUNS : GBNF_RUNS); run++)
            submit(e, gs[s], v, s < N_SCHEMA ? k_schemas[s] : NULL, s < N_SCHEMA ? NULL : k_gbnf, run % 2 == 1,
                   prompts[run % 2], run < 2 ? 0.0f : 1.0f, 1000 + (uint64_t)run, &jobs[n_jobs++]);
    }
    for (int k = 0; k < n_jobs; k++) {
        job *j = &jobs[k];
        collect(j);
        int s = k / RUNS, run = k % RUNS;
        if (s < N_SCHEMA) {
            fprintf(stderr, "schema %d run %d (%s): %lld tokens: %s\n", s, run, run < 2 ? "greedy" : "sampled",
                    (long long)j->tokens, j->text ? j->text : "");
            CHECK_MSG(j->finish == OG_FINISH_STOP, "schema %d run %d: finish %d, not the end token", s, run,
                      (int)j->finish);
            snprintf(path, sizeof path, "%s/%d.%d.out.json", dir, s, run);
            write_file(path, j->text ? j->text : "");
            files++;
        } else {
            run = k - N_SCHEMA * RUNS;
            fprintf(stderr, "gbnf run %d: %s\n", run, j->text ? j->text : "");
            CHECK_MSG(j->finish == OG_FINISH_STOP && j->text && gbnf_reader(j->text), "gbnf run %d: \"%s\" (finish %d)",
                      run, j->text ? j->text : "", (int)j->finish);
        }
        free(j->text);
    }
    CHECK(files == N_SCHEMA * RUNS);
    og_engine_destroy(e);
    for (int s = 0; s <= N_SCHEMA; s++) og_grammar_destroy(gs[s]);
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
