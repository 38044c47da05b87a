/* og_textgen, the generation loop's text side (src/model/generate.h), on the
 * demo model's tokenizer: the text given out adds up to the decode of the
 * tokens; a stop token ends it uncounted; max_tokens ends it with "length";
 * a stop string ends it with "stop" and the text cut just before it, even
 * when it spans tokens, and nothing that may begin a stop string is given
 * out before the next tokens decide; og_textgen_end gives out what is held. */
#include "harness.h"
#include "core/core.h"
#include "text/textgen.h"

#include <stdlib.h>
#include <string.h>

static og_tokenizer *tok;

typedef struct run {
    char text[4096];
    size_t n;
    og_finish fin;
    int64_t tokens;
    int pushes;
} run;

/* Pushes the tokens of `text` (then `extra` ids) through a generator. */
static void generate(const char *text, const int32_t *extra, int n_extra, const og_textgen_params *p, run *out) {
    memset(out, 0, sizeof *out);
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenizer_encode(tok, text, strlen(text), &ids, &n));
    og_textgen *g = NULL;
    CHECK_OK(og_textgen_create(tok, p, &g));
    if (!g) return;
    for (int64_t i = 0; i < n + n_extra && out->fin == OG_FINISH_NONE; i++) {
        const char *t;
        size_t k;
        CHECK_OK(og_textgen_push(g, i < n ? ids[i] : extra[i - n], &t, &k, &out->fin));
        CHECK(out->n + k < sizeof out->text);
        memcpy(out->text + out->n, t, k);
        out->n += k;
        out->pushes++;
        /* never give out the start of a stop string that is not yet decided */
        for (int32_t s = 0; s < p->n_stop_strings && out->fin == OG_FINISH_NONE && *p->stop_strings[s]; s++)
            CHECK_MSG(!strstr(out->text, p->stop_strings[s]), "stop string \"%s\" given out", p->stop_strings[s]);
    }
    if (out->fin == OG_FINISH_NONE) {
        const char *t;
        size_t k;
        CHECK_OK(og_textgen_end(g, OG_FINISH_LENGTH, &t, &k));
        memcpy(out->text + out->n, t, k);
        out->n += k;
        out->fin = og_textgen_finish_reason(g);
    } else {
        const char *t;
        size_t k;
        og_finish f;
        CHECK_STATUS(og_textgen_push(g, 5, &t, &k, &f), OG_ERR_STATE);
    }
    out->text[out->n] = 0;
    out->tokens = og_textgen_tokens(g);
    og_textgen_destroy(g);
    og_free(ids);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/kjv-tiny/tokenizer.json", OG_SOURCE_DIR);
    char *json = og_test_read_file(path);
    if (!json || og_tokenizer_load_json(json, &tok) != OG_OK) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    const char *text = "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say.";
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenizer_encode(tok, text, strlen(text), &ids, &n));
    const int32_t eos = 0;
    run r;

    og_test_section("no stops: the text adds up to the decode, ends by og_textgen_end");
    og_textgen_params p = {.max_tokens = 1000};
    generate(text, NULL, 0, &p, &r);
    CHECK_MSG(!strcmp(r.text, text), "\"%s\"", r.text);
    CHECK(r.fin == OG_FINISH_LENGTH && r.tokens == n);

    og_test_section("a stop token ends it, uncounted and unwritten");
    p = (og_textgen_params){.max_tokens = 1000, .stop_ids = &eos, .n_stop_ids = 1};
    int32_t tail[2] = {eos, 7};
    generate(text, tail, 2, &p, &r);
    CHECK(r.fin == OG_FINISH_STOP && r.tokens == n && !strcmp(r.text, text) && r.pushes == n + 1);

    og_test_section("max_tokens ends it with length, that token written");
    p = (og_textgen_params){.max_tokens = 5};
    generate(text, NULL, 0, &p, &r);
    char *five = NULL;
    CHECK_OK(og_tokenizer_decode(tok, ids, 5, &five, NULL));
    CHECK(r.fin == OG_FINISH_LENGTH && r.tokens == 5 && r.pushes == 5 && five && !strcmp(r.text, five));
    og_free(five);
    p = (og_textgen_params){.max_tokens = 0};
    generate(text, NULL, 0, &p, &r);
    CHECK(r.fin == OG_FINISH_LENGTH && r.tokens == 0 && r.n == 0);

    og_test_section("stop strings: cut before the first, across tokens, held until decided");
    const char *stops[] = {"I AM:", "Moses, I", "zzz"};
    for (int k = 0; k < 3; k++) {
        const char *only[2] = {stops[k], ""};
        p = (og_textgen_params){.max_tokens = 1000, .stop_strings = only, .n_stop_strings = 2};
        generate(text, NULL, 0, &p, &r);
        const char *at = strstr(text, stops[k]);
        if (at) {
            CHECK_MSG(r.fin == OG_FINISH_STOP && r.n == (size_t)(at - text) && !strncmp(r.text, text, r.n),
                      "stop \"%s\": \"%s\"", stops[k], r.text);
        } else {
            CHECK(r.fin == OG_FINISH_LENGTH && !strcmp(r.text, text));
        }
    }
    /* the earliest of several wins */
    p = (og_textgen_params){.max_tokens = 1000, .stop_strings = stops, .n_stop_strings = 3};
    generate(text, NULL, 0, &p, &r);
    CHECK(r.fin == OG_FINISH_STOP && r.n == (size_t)(strstr(text, "Moses, I") - text));
    /* a held prefix that never completes is given out at the end */
    const char *never[] = {"say.!"};
    p = (og_textgen_params){.max_tokens = 1000, .stop_strings = never, .n_stop_strings = 1};
    generate(text, NULL, 0, &p, &r);
    CHECK(r.fin == OG_FINISH_LENGTH && !strcmp(r.text, text));
    /* ... and at a stop token */
    p = (og_textgen_params){.max_tokens = 1000, .stop_ids = &eos, .n_stop_ids = 1, .stop_strings = never,
                            .n_stop_strings = 1};
    generate(text, tail, 2, &p, &r);
    CHECK(r.fin == OG_FINISH_STOP && !strcmp(r.text, text));

    og_test_section("refusals");
    og_textgen *g = NULL;
    p = (og_textgen_params){.max_tokens = -1};
    CHECK_STATUS(og_textgen_create(tok, &p, &g), OG_ERR_INVALID_ARGUMENT);
    p = (og_textgen_params){.max_tokens = 1, .n_stop_ids = 1};
    CHECK_STATUS(og_textgen_create(tok, &p, &g), OG_ERR_INVALID_ARGUMENT);
    CHECK(g == NULL);
    CHECK(og_finish_name(OG_FINISH_STOP) && !strcmp(og_finish_name(OG_FINISH_STOP), "stop"));
    CHECK(og_finish_name(OG_FINISH_NONE) == NULL);

    og_free(ids);
    og_tokenizer_destroy(tok);
    free(json);
    return og_test_finish();
}
