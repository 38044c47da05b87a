/* The tokenizer of the public API (offgraph.h): og_tokenize equals the
 * Hugging Face parity fixtures of tests/data/tokenizers, og_detokenize gives
 * the fixtures' text back, the decode stream gives what a whole decode gives
 * (for every fixture and for characters cut into single bytes), holds back
 * only incomplete characters, and costs time linear in its tokens; special
 * ids, the loaders' refusals and the model loader. Only offgraph.h is used
 * by the code under test. */
#include "harness.h"

#include "offgraph.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static size_t unhex(const char *hex, unsigned char *out) {
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (unsigned char)v;
    }
    return n;
}

static int32_t *json_ids(const cJSON *arr, int64_t *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    int64_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) v[i++] = (int32_t)x->valuedouble;
    return v;
}

/* Pushes ids through a new stream; the pieces joined (malloc'd), or NULL
 * when a call fails. */
static char *stream_all(const og_tokenizer *t, const int32_t *ids, int64_t n, size_t *out_len) {
    og_decode_stream *s = NULL;
    if (og_decode_stream_create(t, &s) != OG_OK) return NULL;
    size_t cap = 64, len = 0;
    char *all = malloc(cap);
    for (int64_t i = 0; i <= n && all; i++) {
        const char *piece;
        size_t pn;
        og_status rc = i < n ? og_decode_stream_push(s, ids[i], &piece, &pn) : og_decode_stream_finish(s, &piece, &pn);
        if (rc != OG_OK || piece[pn] != 0) {
            free(all);
            all = NULL;
            break;
        }
        while (len + pn + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + len, piece, pn);
        len += pn;
    }
    if (all) all[len] = 0;
    if (out_len) *out_len = len;
    og_decode_stream_destroy(s);
    return all;
}

static og_tokenizer *open_fixture(const char *name, int with_config) {
    char json[512], cfg[512];
    snprintf(json, sizeof json, "%s/tokenizers/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
    if (access(json, R_OK) != 0) snprintf(json, sizeof json, "%s/hf/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
    snprintf(cfg, sizeof cfg, "%s/hf/%s/tokenizer_config.json", OG_TEST_DATA_DIR, name);
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_from_file(json, with_config && access(cfg, R_OK) == 0 ? cfg : NULL, &t));
    return t;
}

static void parity(const char *name) {
    og_test_section(name);
    og_tokenizer *t = open_fixture(name, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s/cases.json", OG_TEST_DATA_DIR, name);
    char *cases_text = og_test_read_file(path);
    cJSON *cases = cases_text ? cJSON_Parse(cases_text) : NULL;
    CHECK_MSG(t && cases, "%s: fixture missing", name);
    if (!t || !cases) goto done;
    int enc_bad = 0, add_bad = 0, dec_bad = 0, stream_bad = 0, n_enc = 0, n_dec = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "encode")) {
        const char *hex = cJSON_GetObjectItem(c, "bytes_hex")->valuestring;
        unsigned char *bytes = malloc(strlen(hex) / 2 + 1);
        size_t nb = unhex(hex, bytes);
        int64_t nwant, ngot = -1, nadd = -1;
        int32_t *want = json_ids(cJSON_GetObjectItem(c, "ids"), &nwant), *got = NULL, *added = NULL;
        /* the fixtures encode without added special tokens, matching those in the text */
        og_status rc = og_tokenize(t, (const char *)bytes, nb, OG_TOKENIZE_PARSE_SPECIAL, &got, &ngot);
        if (rc != OG_OK || ngot != nwant || (nwant && memcmp(got, want, (size_t)nwant * sizeof *want))) {
            enc_bad++;
            fprintf(stderr, "%s: og_tokenize of %s: %lld ids, want %lld (%s)\n", name, hex, (long long)ngot,
                    (long long)nwant, rc ? og_last_error() : "ok");
        }
        /* these post-processors add nothing around a text */
        rc = og_tokenize(t, (const char *)bytes, nb, OG_TOKENIZE_PARSE_SPECIAL | OG_TOKENIZE_ADD_SPECIAL, &added, &nadd);
        if (rc != OG_OK || nadd != nwant || (nwant && memcmp(added, want, (size_t)nwant * sizeof *want))) add_bad++;
        const char *decoded = cJSON_GetObjectItem(c, "decoded")->valuestring;
        char *text = NULL;
        size_t tl = 0;
        if (og_detokenize(t, want, nwant, &text, &tl) != OG_OK || strcmp(text, decoded) || tl != strlen(decoded)) {
            dec_bad++;
            fprintf(stderr, "%s: og_detokenize of the ids of %s: \"%s\", want \"%s\"\n", name, hex,
                    text ? text : "(error)", decoded);
        }
        char *streamed = stream_all(t, want, nwant, NULL);
        if (!streamed || strcmp(streamed, decoded)) {
            stream_bad++;
            fprintf(stderr, "%s: streamed decode of %s: \"%s\", want \"%s\"\n", name, hex, streamed ? streamed : "(error)",
                    decoded);
        }
        free(streamed);
        og_free(text);
        og_free(got);
        og_free(added);
        free(want);
        free(bytes);
        n_enc++;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "decode")) {
        int64_t n;
        int32_t *v = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        char *text = NULL;
        size_t tl = 0, sl = 0;
        if (og_detokenize(t, v, n, &text, &tl) != OG_OK || strcmp(text, want)) dec_bad++;
        /* the stream gives what the whole decode gives, cut characters (and NUL bytes) included */
        char *streamed = stream_all(t, v, n, &sl);
        if (!streamed || !text || sl != tl || memcmp(streamed, text, tl)) {
            stream_bad++;
            if (stream_bad < 10)
                fprintf(stderr, "%s: streamed decode [%d%s]: \"%s\", decode \"%s\"\n", name, v[0], n > 1 ? " ..." : "",
                        streamed ? streamed : "(error)", text ? text : "(error)");
        }
        free(streamed);
        og_free(text);
        free(v);
        n_dec++;
    }
    CHECK_MSG(n_enc > 30 && n_dec > 100, "%s: only %d encode and %d decode cases", name, n_enc, n_dec);
    CHECK_MSG(enc_bad == 0, "%s: %d of %d encodes differ", name, enc_bad, n_enc);
    CHECK_MSG(add_bad == 0, "%s: %d encodes with special tokens added differ", name, add_bad);
    CHECK_MSG(dec_bad == 0, "%s: %d decodes differ", name, dec_bad);
    CHECK_MSG(stream_bad == 0, "%s: %d streamed decodes differ", name, stream_bad);
done:
    cJSON_Delete(cases);
    free(cases_text);
    og_tokenizer_destroy(t);
}

/* The id of the token holding byte b alone: "<0xHH>" with byte fallback,
 * else the byte-level alphabet's character for b (GPT-2's table: printable
 * Latin-1 bytes stand for themselves, the others for 256, 257, ... in
 * order). */
static int32_t byte_token(const og_tokenizer *t, unsigned b) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    int32_t id = og_tokenizer_token_id(t, name);
    if (id >= 0) return id;
    unsigned cp = b, extra = 0;
    for (unsigned x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
        if (!printable && x == b) cp = 256 + extra;
        if (!printable) extra++;
    }
    char u[4] = {0};
    if (cp < 0x80) u[0] = (char)cp;
    else {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
    }
    return og_tokenizer_token_id(t, u);
}

/* Characters fed a byte at a time: nothing comes out until a character is
 * complete, then all of it; the pieces join to the whole decode. */
static void byte_split(const char *name) {
    og_tokenizer *t = open_fixture(name, 0);
    if (!t) return;
    const char *text = "a\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!";
    size_t n = strlen(text);
    int32_t ids[64];
    for (size_t i = 0; i < n; i++) {
        ids[i] = byte_token(t, (unsigned char)text[i]);
        CHECK_MSG(ids[i] >= 0, "%s: no token for byte 0x%02x", name, (unsigned char)text[i]);
        if (ids[i] < 0) goto done;
    }
    char *whole = NULL;
    CHECK_OK(og_detokenize(t, ids, (int64_t)n, &whole, NULL));
    char *streamed = stream_all(t, ids, (int64_t)n, NULL);
    CHECK_MSG(whole && streamed && !strcmp(whole, streamed), "%s: byte-split stream \"%s\", decode \"%s\"", name,
              streamed ? streamed : "(error)", whole ? whole : "(error)");
    /* with byte fallback the first token loses its leading space in a whole decode; compare the rest */
    CHECK_MSG(whole && strstr(text, whole + (whole[0] == ' ')) != NULL, "%s: decode \"%s\"", name, whole ? whole : "");
    free(streamed);
    og_free(whole);
    /* what each push gives: the emoji's four bytes give "", "", "", then all four */
    og_decode_stream *s = NULL;
    CHECK_OK(og_decode_stream_create(t, &s));
    const char *piece;
    size_t pn;
    int held_ok = 1;
    for (size_t i = 0; i < n; i++) {
        CHECK_OK(og_decode_stream_push(s, ids[i], &piece, &pn));
        unsigned char c = (unsigned char)text[i];
        int last_of_char = i + 1 == n || ((unsigned char)text[i + 1] & 0xC0) != 0x80;
        if (!last_of_char && pn != 0) held_ok = 0;
        if (last_of_char && c >= 0x80 && pn < 2) held_ok = 0;
    }
    CHECK_MSG(held_ok, "%s: a piece gave out part of a character", name);
    CHECK_OK(og_decode_stream_finish(s, &piece, &pn));
    CHECK(pn == 0);
    /* an incomplete character at the end comes out as U+FFFD at finish */
    CHECK_OK(og_decode_stream_push(s, ids[4], &piece, &pn)); /* 0xE4: starts a CJK character */
    CHECK(pn == 0);
    CHECK_OK(og_decode_stream_finish(s, &piece, &pn));
    CHECK_MSG(pn == 3 && !memcmp(piece, "\xEF\xBF\xBD", 3), "%s: finish gave \"%s\"", name, piece);
    /* a bad id changes nothing */
    CHECK_STATUS(og_decode_stream_push(s, og_tokenizer_vocab_size(t) + 5, &piece, &pn), OG_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(og_last_error(), "is not a token") != NULL, "%s", og_last_error());
    og_decode_stream_destroy(s);
done:
    og_tokenizer_destroy(t);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Streams n tokens that are all the lead byte 0xE4: the text always ends in
 * the start of a character (each earlier one is ill-formed: U+FFFD). The
 * seconds it took; the pieces checked against the whole decode. */
static double time_stream(const og_tokenizer *t, int32_t lead, int64_t n, int check) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) ids[i] = lead;
    double t0 = now_s();
    size_t len = 0;
    char *streamed = stream_all(t, ids, n, &len);
    double dt = now_s() - t0;
    CHECK(streamed != NULL && len == 3 * (size_t)n);
    if (check) {
        char *whole = NULL;
        CHECK_OK(og_detokenize(t, ids, n, &whole, NULL));
        CHECK(whole && streamed && !strcmp(whole, streamed));
        og_free(whole);
    }
    free(streamed);
    free(ids);
    return dt;
}

static void linear(void) {
    og_test_section("the stream is linear while its text ends mid-character");
    og_tokenizer *t = open_fixture("qwen2-bias", 0);
    if (!t) return;
    int32_t lead = byte_token(t, 0xE4);
    CHECK(lead >= 0);
    double small = 1e9;
    for (int r = 0; r < 3; r++) {
        double d = time_stream(t, lead, 2000, r == 0);
        if (d < small) small = d;
    }
    double big = time_stream(t, lead, 20000, 1);
    /* linear: about 10x; quadratic: about 100x. The floor absorbs timer noise. */
    double bound = 30.0 * small + 0.05;
    printf("2,000 tokens %.4f s, 20,000 tokens %.4f s (bound %.4f s)\n", small, big, bound);
    CHECK_MSG(big < bound, "20,000 tokens took %.3f s, 2,000 took %.3f s: not linear", big, small);
    og_tokenizer_destroy(t);
}

/* Writes text to a temp file; its path (static buffer). */
static const char *temp_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/og_tok_api_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void special_ids(void) {
    og_test_section("special ids, flags, pieces");
    og_tokenizer *t = open_fixture("mistral-sw", 1);
    if (t) {
        CHECK(og_tokenizer_bos(t) == og_tokenizer_token_id(t, "<s>") && og_tokenizer_bos(t) >= 0);
        CHECK(og_tokenizer_eos(t) == og_tokenizer_token_id(t, "</s>") && og_tokenizer_eos(t) >= 0);
        CHECK(og_tokenizer_eot(t) == -1); /* no chat template */
        CHECK(og_tokenizer_is_special(t, og_tokenizer_bos(t)));
        CHECK(og_tokenizer_vocab_size(t) > og_tokenizer_eos(t));
    }
    og_tokenizer_destroy(t);

    char json[512];
    snprintf(json, sizeof json, "%s/hf/qwen2-bias/tokenizer.json", OG_TEST_DATA_DIR);
    const char *cfg = temp_file("{\"eos_token\": \"<|endoftext|>\", \"bos_token\": null, \"chat_template\": "
                                "\"{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n"
                                "{% endfor %}\"}");
    CHECK(cfg != NULL);
    t = NULL;
    CHECK_OK(og_tokenizer_from_file(json, cfg, &t));
    if (cfg) unlink(cfg);
    if (t) {
        CHECK(og_tokenizer_bos(t) == -1);
        CHECK(og_tokenizer_eos(t) == 0);
        CHECK(og_tokenizer_eot(t) == og_tokenizer_token_id(t, "<|im_end|>") && og_tokenizer_eot(t) == 2);
        /* special tokens in the text: ids with PARSE_SPECIAL, plain text without */
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(og_tokenize(t, "hi<|im_end|>", 12, OG_TOKENIZE_PARSE_SPECIAL, &ids, &n));
        CHECK(n >= 2 && ids[n - 1] == 2);
        og_free(ids);
        CHECK_OK(og_tokenize(t, "hi<|im_end|>", 12, 0, &ids, &n));
        int has = 0;
        for (int64_t i = 0; i < n; i++) has |= ids[i] == 2;
        CHECK(n > 3 && !has);
        char *back = NULL;
        CHECK_OK(og_detokenize(t, ids, n, &back, NULL));
        CHECK(back && !strcmp(back, "hi<|im_end|>"));
        og_free(back);
        og_free(ids);
        /* pieces: stored form and decoded form */
        int32_t the = og_tokenizer_token_id(t, "\xC4\xA0the");
        if (the >= 0) {
            char *p = NULL;
            CHECK_OK(og_token_piece(t, the, &p, NULL));
            CHECK(p && !strcmp(p, " the"));
            CHECK(!strcmp(og_tokenizer_token_text(t, the), "\xC4\xA0the"));
            og_free(p);
        }
        char *p = NULL;
        CHECK_STATUS(og_token_piece(t, -1, &p, NULL), OG_ERR_INVALID_ARGUMENT);
        CHECK(p == NULL && og_tokenizer_token_text(t, -1) == NULL);
        CHECK_STATUS(og_tokenize(t, "x", 1, 0x80, &ids, &n), OG_ERR_INVALID_ARGUMENT);
        CHECK(ids == NULL && n == 0);
        int32_t bad[2] = {5, 1 << 30};
        CHECK_STATUS(og_detokenize(t, bad, 2, &back, NULL), OG_ERR_INVALID_ARGUMENT);
        CHECK(back == NULL && strstr(og_last_error(), "at 1") != NULL);
        CHECK_OK(og_tokenize(t, NULL, 0, 0, &ids, &n));
        CHECK(n == 0 && ids == NULL);
    }
    og_tokenizer_destroy(t);

    /* a post-processor that adds a bos token */
    const char *tj = temp_file("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
                               " \"added_tokens\": [{\"id\": 2, \"content\": \"<s>\", \"special\": true}],"
                               " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\":"
                               " {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
                               " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [2], \"tokens\": [\"<s>\"]}}}}");
    t = NULL;
    CHECK_OK(og_tokenizer_from_file(tj, NULL, &t));
    if (tj) unlink(tj);
    if (t) {
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(og_tokenize(t, "ab", 2, OG_TOKENIZE_ADD_SPECIAL, &ids, &n));
        CHECK(n == 3 && ids[0] == 2 && ids[1] == 0 && ids[2] == 1);
        og_free(ids);
        CHECK_OK(og_tokenize(t, "ab", 2, 0, &ids, &n));
        CHECK(n == 2 && ids[0] == 0);
        og_free(ids);
    }
    og_tokenizer_destroy(t);
}

static void loaders(void) {
    og_test_section("loaders: refusals by name, the model's tokenizer");
    og_tokenizer *t = (og_tokenizer *)1;
    CHECK_STATUS(og_tokenizer_from_file("/nonexistent/tokenizer.json", NULL, &t), OG_ERR_IO);
    CHECK(t == NULL && strstr(og_last_error(), "/nonexistent/tokenizer.json") != NULL);
    const char *bad = temp_file("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}");
    CHECK_STATUS(og_tokenizer_from_file(bad, NULL, &t), OG_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(og_last_error(), "WordLevel") != NULL, "%s", og_last_error());
    if (bad) unlink(bad);
    CHECK_STATUS(og_tokenizer_from_file(NULL, NULL, &t), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_tokenizer_from_model(NULL, &t), OG_ERR_INVALID_ARGUMENT);
    og_tokenizer_destroy(NULL);
    og_decode_stream_destroy(NULL);
    og_free(NULL);
    og_decode_stream *s = NULL;
    CHECK_STATUS(og_decode_stream_create(NULL, &s), OG_ERR_INVALID_ARGUMENT);

    og_model *m = NULL;
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    if (og_model_load(OG_BINARY_DIR "/kjv-tiny.ogp", &mp, &m) != OG_OK) {
        CHECK_MSG(0, "the demo model: %s", og_last_error());
        return;
    }
    t = NULL;
    CHECK_OK(og_tokenizer_from_model(m, &t));
    og_model_destroy(m); /* the tokenizer does not borrow the model */
    if (t) {
        CHECK(og_tokenizer_eos(t) == og_tokenizer_token_id(t, "<|endoftext|>"));
        const char *text = "In the beginning God created the heaven and the earth.";
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(og_tokenize(t, text, strlen(text), OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL, &ids, &n));
        char *back = NULL;
        CHECK_OK(og_detokenize(t, ids, n, &back, NULL));
        CHECK(back && !strcmp(back, text));
        og_free(back);
        og_free(ids);
    }
    og_tokenizer_destroy(t);
}

int main(void) {
    const char *names[] = {"gpt2-style", "llama-gqa", "llama3-style", "mistral-sw", "qwen2-bias", "qwen3-mixed"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) parity(names[i]);
    og_test_section("characters fed a byte at a time");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) byte_split(names[i]);
    linear();
    special_ids();
    loaders();
    return og_test_finish();
}
