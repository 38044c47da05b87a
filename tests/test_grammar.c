/* text/grammar.h without a model: GBNF parsing (hand-written expectations
 * of what each grammar accepts and refuses, and of its error messages), the
 * JSON-schema compiler (documents accepted or refused as the schema says;
 * keywords refused by name), and the token masks against a naive oracle
 * that feeds every token's bytes to a fresh matcher. */
#include "harness.h"
#include "text/grammar.h"

#include "core/core.h"

#include <stdlib.h>
#include <string.h>

static og_grammar_vocab *tiny_vocab(void) {
    static const char *const t[] = {"a"};
    size_t l[] = {1};
    og_grammar_vocab *v = NULL;
    og_grammar_vocab_create_bytes(t, l, 1, NULL, 0, &v);
    return v;
}

/* 1: the grammar takes s whole; 0: it refuses a byte; 2: a prefix, not complete. */
static int match(const og_grammar *g, const char *s) {
    og_grammar_vocab *v = tiny_vocab();
    og_matcher *m = NULL;
    int r = -1;
    if (og_matcher_create(g, v, &m) == OG_OK) {
        if (og_matcher_accept_bytes(m, s, strlen(s)) != OG_OK) r = 0;
        else
            r = og_matcher_can_end(m) ? 1 : 2;
    }
    og_matcher_destroy(m);
    og_grammar_vocab_destroy(v);
    return r;
}

static og_grammar *parse(const char *text) {
    og_grammar *g = NULL;
    og_status st = og_grammar_parse(text, strlen(text), &g);
    CHECK_MSG(st == OG_OK, "parse failed: %s\n%s", og_last_error(), text);
    return g;
}

/* Each case: a grammar, then inputs with what match() must say. */
typedef struct mcase {
    const char *grammar;
    struct {
        const char *in;
        int want;
    } in[8];
} mcase;

static const mcase k_cases[] = {
    {"root ::= \"ab\" | \"cd\"", {{"ab", 1}, {"cd", 1}, {"a", 2}, {"ac", 0}, {"abc", 0}, {"", 2}}},
    {"root ::= [a-c]+ \"!\"", {{"a!", 1}, {"abcab!", 1}, {"!", 0}, {"ad", 0}, {"abc", 2}}},
    {"root ::= \"x\"* # comment\n", {{"", 1}, {"xxxx", 1}, {"xy", 0}}},
    {"root ::= \"x\"? \"y\"", {{"y", 1}, {"xy", 1}, {"xxy", 0}}},
    {"root ::= \"a\"{2,3}", {{"a", 2}, {"aa", 1}, {"aaa", 1}, {"aaaa", 0}}},
    {"root ::= \"a\"{2}", {{"aa", 1}, {"aaa", 0}}},
    {"root ::= \"a\"{2,}", {{"a", 2}, {"aa", 1}, {"aaaaaaa", 1}}},
    {"root ::= (\"ab\" | \"c\"){0,2} \"$\"", {{"$", 1}, {"abc$", 1}, {"cab$", 1}, {"ccc$", 0}}},
    {"root ::= [^\"\\\\]* \"\\\"\"", {{"hello\"", 1}, {"h\\", 0}, {"\xc3\xa9\xe2\x82\xac\"", 1}}},
    {"root ::= [\\u00e9]", {{"\xc3\xa9", 1}, {"\xc3", 2}, {"\xc3\xa8", 0}, {"e", 0}}},
    {"root ::= [\\u0080-\\U0010FFFF]", {{"\xc2\x80", 1}, {"\xf4\x8f\xbf\xbf", 1}, {"\xed\xa0\x80", 0}, {"\x7f", 0}}},
    {"root ::= .", {{"\xf0\x9f\x98\x80", 1}, {"\xc0\x80", 0}, {"\xe0\x80\x80", 0}, {"z", 1}}},
    {"root ::= \"\\x41\\n\\t\\u00e9\\\"\"", {{"A\n\t\xc3\xa9\"", 1}}},
    {"root ::= item (\",\" item)*\nitem ::= [0-9]+", {{"1,22,333", 1}, {"1,", 2}, {",1", 0}}},
    {"root ::= a b\na ::= \"x\" | \"\"\nb ::= \"y\"", {{"y", 1}, {"xy", 1}, {"x", 2}}},
    {"root ::= \"(\" root \")\" | \"\"", {{"", 1}, {"(())", 1}, {"(()", 2}, {")", 0}}},
    {"root ::=\n  \"a\"\n  | \"b\"\n\nother ::= \"c\"", {{"a", 1}, {"b", 1}, {"c", 0}}},
    {"root ::= (\n  \"a\"\n  \"b\"\n)", {{"ab", 1}}},
    {"root ::= [a-z-]+", {{"a-b", 1}, {"A", 0}}},
    {"root ::= [\\]\\[]", {{"]", 1}, {"[", 1}, {"a", 0}}},
};

static void test_match(void) {
    og_test_section("what grammars accept");
    for (size_t k = 0; k < sizeof k_cases / sizeof *k_cases; k++) {
        og_grammar *g = parse(k_cases[k].grammar);
        if (!g) continue;
        for (int i = 0; i < 8 && k_cases[k].in[i].in; i++) {
            int got = match(g, k_cases[k].in[i].in);
            CHECK_MSG(got == k_cases[k].in[i].want, "grammar %s on \"%s\": %d, want %d", k_cases[k].grammar,
                      k_cases[k].in[i].in, got, k_cases[k].in[i].want);
        }
        og_grammar_destroy(g);
    }
}

/* Refused grammars: the error must carry these words. */
static const struct {
    const char *grammar, *want;
} k_errors[] = {
    {"root ::= \"a", "line 1, column 10: unterminated string literal"},
    {"root ::= foo", "line 1, column 10: rule \"foo\" is used but never defined"},
    {"other ::= \"a\"", "no rule named \"root\""},
    {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule \"root\" is already defined at line 1"},
    {"root = \"a\"", "line 1, column 6: expected '::='"},
    {"root ::= (\"a\"", "expected ')'"},
    {"root ::= [a-", "unterminated character class"},
    {"root ::= [z-a]", "before its start"},
    {"root ::= *", "'*' with nothing before it"},
    {"root ::= \"a\"{3,2}", "below the minimum"},
    {"root ::= \"a\"{2", "expected '}'"},
    {"root ::= root \"a\"", "left recursion: rule \"root\""},
    {"root ::= a\na ::= b \"x\"\nb ::= \"\" | root", "left recursion"},
    {"root ::= \"\\q\"", "unknown escape \\q"},
    {"root ::= \"a\" @", "found '@'"},
    {"root ::= <[12]>", "token references"},
    {"root ::= \"a\"{1001}", "above 1000"},
    {"root ::= \"\\ud800\"", "not a Unicode scalar value"},
    {"root ::= []", "empty character class"},
};

static void test_errors(void) {
    og_test_section("refused grammars name line, column and what was expected");
    for (size_t k = 0; k < sizeof k_errors / sizeof *k_errors; k++) {
        og_grammar *g = NULL;
        og_status st = og_grammar_parse(k_errors[k].grammar, strlen(k_errors[k].grammar), &g);
        CHECK_MSG(st != OG_OK && !g, "%s: accepted", k_errors[k].grammar);
        CHECK_MSG(strstr(og_last_error(), k_errors[k].want), "%s: error \"%s\", want \"%s\"", k_errors[k].grammar,
                  og_last_error(), k_errors[k].want);
        og_grammar_destroy(g);
    }
    /* depth limit */
    char deep[400];
    int n = 0;
    n += snprintf(deep + n, sizeof deep - (size_t)n, "root ::= ");
    for (int i = 0; i < 70; i++) deep[n++] = '(';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    for (int i = 0; i < 70; i++) deep[n++] = ')';
    deep[n] = 0;
    og_grammar *g = NULL;
    CHECK_STATUS(og_grammar_parse(deep, strlen(deep), &g), OG_ERR_UNSUPPORTED);
    CHECK(strstr(og_last_error(), "nested deeper"));
}

/* Schemas and documents: whether each document is in the schema's grammar. */
static const struct {
    const char *schema;
    struct {
        const char *doc;
        int want;
    } in[8];
} k_schemas[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
     "\"required\":[\"a\"],\"additionalProperties\":false}",
     {{"{\"a\":1}", 1}, {"{\"a\":-12,\"b\":\"x\"}", 1}, {"{ \"a\" : 0 , \"b\" : \"\" }", 1}, {"{\"b\":\"x\"}", 0},
      {"{\"a\":1.5}", 0}, {"{\"a\":01}", 0}, {"{\"a\":1,\"c\":2}", 0}}},
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"},\"y\":{\"type\":\"null\"},"
     "\"z\":{\"type\":\"number\"}}}",
     {{"{}", 1}, {"{\"y\":null}", 1}, {"{\"x\":true,\"z\":1e5}", 1}, {"{\"z\":-0.25,\"x\":false}", 0},
      {"{,\"y\":null}", 0}}},
    {"{\"enum\":[\"red\",\"green\",3,null,{\"k\":[1]}]}",
     {{"\"red\"", 1}, {"\"green\"", 1}, {"3", 1}, {"null", 1}, {"{\"k\":[1]}", 1}, {"\"blue\"", 0}}},
    {"{\"const\":\"a\\\"b\"}", {{"\"a\\\"b\"", 1}, {"\"ab\"", 0}}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     {{"[1]", 1}, {"[1, 2,3]", 1}, {"[]", 0}, {"[1,2,3,4]", 0}, {"[\"a\"]", 0}}},
    {"{\"type\":\"array\",\"maxItems\":2}", {{"[]", 1}, {"[1,\"a\"]", 1}, {"[{},[],3]", 0}}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {{"\"ab\"", 1}, {"\"\\n\\u00e9x\"", 1}, {"\"a\"", 0}, {"\"abcd\"", 0}}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]}",
     {{"5", 1}, {"[true,false]", 1}, {"\"5\"", 0}}},
    {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", {{"\"s\"", 1}, {"null", 1}, {"1", 0}}},
    {"{\"type\":[\"string\",\"integer\"]}", {{"\"s\"", 1}, {"7", 1}, {"true", 0}}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
     "\"$ref\":\"#/$defs/node\"}",
     {{"{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", 1}, {"{\"v\":1}", 0}}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}",
     {{"\"123e4567-e89b-12d3-a456-426614174000\"", 1}, {"\"123e4567\"", 0}}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {{"{\"q\":1,\"r\":2}", 1}, {"{\"q\":\"s\"}", 0}}},
    {"{\"type\":\"object\",\"required\":[\"id\"]}", {{"{\"id\":[1,{}]}", 1}, {"{}", 0}}},
    {"{\"title\":\"any\",\"description\":\"d\"}", {{"[1,{\"a\":null}]", 1}, {"tru", 2}}},
    /* the root referenced from a member, and one definition at two starts:
       no cycle before text */
    {"{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#\"}}}", {{"{\"c\":{\"c\":{}}}", 1}, {"{\"c\":1}", 0}}},
    {"{\"$defs\":{\"s\":{\"type\":\"string\"}},\"anyOf\":[{\"$ref\":\"#/$defs/s\"},{\"type\":\"array\","
     "\"items\":{\"anyOf\":[{\"$ref\":\"#/$defs/s\"},{\"$ref\":\"#\"}]}}]}",
     {{"\"a\"", 1}, {"[\"a\",[[\"b\"]]]", 1}, {"[1]", 0}}},
};

static void test_schema(void) {
    og_test_section("JSON schema -> grammar");
    for (size_t k = 0; k < sizeof k_schemas / sizeof *k_schemas; k++) {
        og_grammar *g = NULL;
        og_status st = og_grammar_from_json_schema(k_schemas[k].schema, strlen(k_schemas[k].schema), &g);
        CHECK_MSG(st == OG_OK, "%s: %s", k_schemas[k].schema, og_last_error());
        if (!g) continue;
        for (int i = 0; i < 8 && k_schemas[k].in[i].doc; i++) {
            int got = match(g, k_schemas[k].in[i].doc);
            if (k_schemas[k].in[i].want == 0) got = got == 2 ? 0 : got; /* incomplete also counts as refused */
            CHECK_MSG(got == k_schemas[k].in[i].want, "schema %s on %s: %d, want %d", k_schemas[k].schema,
                      k_schemas[k].in[i].doc, got, k_schemas[k].in[i].want);
        }
        og_grammar_destroy(g);
    }
    static const struct {
        const char *schema, *want;
    } refused[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a$\"}", "keyword \"pattern\" is not supported"},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "string format \"date-time\" is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":3}}}",
         "at \"/properties/n\": keyword \"minimum\" is not supported"},
        {"{\"allOf\":[{}]}", "keyword \"allOf\""},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "may overlap"},
        {"{\"$ref\":\"http://x/y\"}", "\"$ref\": \"http://x/y\""},
        {"{\"type\":\"integer\",\"maxLength\":3}", "keyword \"maxLength\" with \"type\": \"integer\""},
        {"{\"type\":\"array\",\"items\":[{}]}", "prefixItems"},
        {"false", "the schema false"},
        {"{\"type\":\"objekt\"}", "unknown type \"objekt\""},
        {"{", "not valid JSON"},
        /* $ref cycles that match nothing before they come back (a grammar
           that starts with itself): refused, the cycle named */
        {"{\"$ref\":\"#\"}", "a $ref cycle that matches nothing before it comes back: # -> #"},
        {"{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/b\"},{\"type\":\"null\"}]},\"b\":{\"anyOf\":[{\"type\":"
         "\"string\"},{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
         "a $ref cycle that matches nothing before it comes back: #/$defs/b -> #/$defs/a -> #/$defs/b"},
        /* b is compiled first inside a's member (after text), then reached
           again at a's start */
        {"{\"$defs\":{\"a\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/b\"}}},"
         "{\"$ref\":\"#/$defs/b\"}]},\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
         "\"$ref\":\"#/$defs/a\"}",
         "a $ref cycle that matches nothing before it comes back: #/$defs/a -> #/$defs/b -> #/$defs/a"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/c\"},\"c\":{\"anyOf\":[{\"$ref\":"
         "\"#\"}]}},\"$ref\":\"#/$defs/a\"}",
         "a $ref cycle that matches nothing before it comes back: # -> #/$defs/a -> #/$defs/b -> #/$defs/c -> #"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        char *gbnf = NULL;
        og_status st = og_json_schema_to_gbnf(refused[k].schema, strlen(refused[k].schema), &gbnf);
        CHECK_MSG(st != OG_OK && !gbnf, "%s accepted", refused[k].schema);
        CHECK_MSG(strstr(og_last_error(), refused[k].want), "%s: \"%s\", want \"%s\"", refused[k].schema,
                  og_last_error(), refused[k].want);
        og_free(gbnf);
    }
    /* json_object mode */
    char *any = og_json_any_gbnf(true);
    CHECK(any != NULL);
    og_grammar *g = any ? parse(any) : NULL;
    if (g) {
        CHECK(match(g, "{\"a\": [1, 2.5e-3, \"\\u00e9\", true, null, {}]}") == 1);
        CHECK(match(g, "[1]") == 0);
        CHECK(match(g, "{\"a\" 1}") == 0);
    }
    og_grammar_destroy(g);
    og_free(any);
}

/* The masks against the oracle: a token is allowed iff a matcher in the same
 * state takes all its bytes (the end ids iff the grammar can end). */
static void test_masks(void) {
    og_test_section("token masks agree with feeding each token");
    /* a vocabulary with prefixes, duplicates, UTF-8 pieces and an end id */
    static const char *const toks[] = {"",  "{",     "\"",   "\"a",  "a",    "ab",     "abc", " ",   ":",  "1",
                                       "12", "}",    "\",",  "\xc3", "\xa9", "\xc3\xa9", "a",   "\"}", "true", ",",
                                       "tr", "ue",   "null", "\": ", "-",    "0.",     "5",   "[",   "]",  "x",
                                       "b",  "c",    "f",    "l",    "s",    "e",      "n",   "u",   "r",  "t"};
    const int32_t V = (int32_t)(sizeof toks / sizeof *toks);
    size_t lens[64];
    for (int32_t i = 0; i < V; i++) lens[i] = strlen(toks[i]);
    const int32_t eos = 0; /* token 0 has no bytes: the end */
    og_grammar_vocab *v = NULL;
    CHECK_OK(og_grammar_vocab_create_bytes(toks, lens, V, &eos, 1, &v));
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"array\","
                         "\"items\":{\"type\":\"number\"}},\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\"]}";
    og_grammar *g = NULL;
    CHECK_OK(og_grammar_from_json_schema(schema, strlen(schema), &g));
    if (!v || !g) return;
    og_matcher *m = NULL, *o = NULL;
    CHECK_OK(og_matcher_create(g, v, &m));
    CHECK_OK(og_matcher_create(g, v, &o));
    og_rng r = og_rng_seed(7);
    char fed[4096];
    size_t n_fed = 0;
    int steps = 0, checked = 0;
    for (int run = 0; run < 40 && m; run++) {
        og_matcher_reset(m);
        n_fed = 0;
        for (int t = 0; t < 60; t++) {
            const uint32_t *mask = og_matcher_mask(m);
            CHECK(mask != NULL);
            if (!mask) break;
            int32_t allowed[64], na = 0;
            for (int32_t i = 0; i < V; i++) {
                int want;
                if (i == eos) want = og_matcher_can_end(m);
                else {
                    og_matcher_reset(o);
                    want = og_matcher_accept_bytes(o, fed, n_fed) == OG_OK &&
                           og_matcher_accept_bytes(o, toks[i], lens[i]) == OG_OK;
                }
                int got = (mask[i >> 5] >> (i & 31)) & 1;
                CHECK_MSG(got == want, "after \"%.*s\": token %d \"%s\" mask %d, oracle %d", (int)n_fed, fed, i, toks[i],
                          got, want);
                checked++;
                if (got) allowed[na++] = i;
            }
            CHECK_MSG(na > 0, "after \"%.*s\": nothing allowed", (int)n_fed, fed);
            if (!na) break;
            int32_t pick = allowed[og_rng_next(&r) % (uint64_t)na];
            CHECK_OK(og_matcher_accept_token(m, pick));
            steps++;
            if (pick == eos) {
                CHECK(og_matcher_finished(m));
                break;
            }
            memcpy(fed + n_fed, toks[pick], lens[pick]);
            n_fed += lens[pick];
        }
    }
    fprintf(stderr, "%d steps, %d mask bits checked\n", steps, checked);
    CHECK(checked > 1000);
    /* a token that does not fit is refused and leaves the state as it was */
    og_matcher_reset(m);
    CHECK_STATUS(og_matcher_accept_token(m, 29 /* "x" */), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_matcher_accept_token(m, eos), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_matcher_accept_token(m, 1 /* "{" */));
    /* the constraint hook: masks logits, and starts over when given fewer tokens */
    float logits[64];
    int32_t gen[2] = {1, 2}; /* {" */
    for (int i = 0; i < V; i++) logits[i] = 1.0f;
    og_matcher_reset(m);
    og_grammar_constraint(m, gen, 2, logits, V);
    CHECK(og_matcher_error(m) == NULL);
    CHECK(logits[4] == 1.0f && isinf(logits[1]) && isinf(logits[eos])); /* a: yes; {: no; end: no */
    for (int i = 0; i < V; i++) logits[i] = 1.0f;
    og_grammar_constraint(m, gen, 0, logits, V);
    CHECK(logits[1] == 1.0f && isinf(logits[4]));
    int32_t badgen[1] = {29};
    for (int i = 0; i < V; i++) logits[i] = 1.0f;
    og_grammar_constraint(m, badgen, 1, logits, V);
    CHECK(og_matcher_error(m) != NULL);
    CHECK(logits[eos] == 1.0f && isinf(logits[1]));
    og_matcher_destroy(m);
    og_matcher_destroy(o);
    og_grammar_destroy(g);
    og_grammar_vocab_destroy(v);
}

int main(void) {
    test_match();
    test_errors();
    test_schema();
    test_masks();
    return og_test_finish();
}
