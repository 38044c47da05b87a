/* Tokenizer parity with Hugging Face `tokenizers`: every case of
 * tests/data/tokenizers/<name>/cases.json (made by
 * tests/fixtures/make_tokenizer_fixtures.py) must encode to exactly the
 * same ids and decode to exactly the same text; the streaming decoder must
 * give the same text piece by piece; unsupported files are refused by name. */
#include "harness.h"
#include "core/core.h"
#include "model/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static size_t unhex(const char *h, unsigned char *out) {
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (unsigned char)v;
    }
    return n;
}

static int32_t *json_ids(const cJSON *arr, int64_t *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int64_t i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(arr, (int)i)->valueint;
    return v;
}

/* Decodes ids one at a time through a stream; the pieces joined. */
static char *stream_decode(const og_tokenizer *t, const int32_t *ids, int64_t n) {
    og_decode_stream *s = og_decode_stream_create(t);
    size_t cap = 64, len = 0;
    char *all = malloc(cap);
    for (int64_t i = 0; i <= n; i++) {
        const char *piece;
        size_t pn;
        og_status rc = i < n ? og_decode_stream_push(s, ids[i], &piece, &pn) : og_decode_stream_finish(s, &piece, &pn);
        if (rc != OG_OK) break;
        while (len + pn + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + len, piece, pn);
        len += pn;
    }
    all[len] = 0;
    og_decode_stream_destroy(s);
    return all;
}

static void parity(const char *name) {
    og_test_section(name);
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
    char *json = og_test_read_file(path);
    if (!json) {
        snprintf(path, sizeof path, "%s/hf/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
        json = og_test_read_file(path);
    }
    snprintf(path, sizeof path, "%s/tokenizers/%s/cases.json", OG_TEST_DATA_DIR, name);
    char *cases_text = og_test_read_file(path);
    CHECK_MSG(json && cases_text, "%s: fixture files missing", name);
    if (!json || !cases_text) return;
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json(json, &t));
    cJSON *cases = cJSON_Parse(cases_text);
    CHECK(cases != NULL);
    if (!t || !cases) goto done;

    int enc_bad = 0, dec_bad = 0, stream_bad = 0, n_enc = 0, n_dec = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "encode")) {
        const char *hex = cJSON_GetObjectItem(c, "bytes_hex")->valuestring;
        unsigned char *bytes = malloc(strlen(hex) / 2 + 1);
        size_t nb = unhex(hex, bytes);
        int64_t nwant, ngot = 0;
        int32_t *want = json_ids(cJSON_GetObjectItem(c, "ids"), &nwant), *got = NULL;
        og_status rc = og_tokenizer_encode(t, (const char *)bytes, nb, &got, &ngot);
        if (rc != OG_OK || ngot != nwant || (nwant && memcmp(got, want, (size_t)nwant * sizeof *want))) {
            enc_bad++;
            fprintf(stderr, "%s: encode of %s: got %lld ids [", name, hex, (long long)ngot);
            for (int64_t i = 0; i < ngot; i++) fprintf(stderr, "%s%d", i ? " " : "", got[i]);
            fprintf(stderr, "], want %lld [", (long long)nwant);
            for (int64_t i = 0; i < nwant; i++) fprintf(stderr, "%s%d", i ? " " : "", want[i]);
            fprintf(stderr, "] (%s)\n", rc ? og_last_error() : "ok");
        }
        const char *decoded = cJSON_GetObjectItem(c, "decoded")->valuestring;
        char *text = NULL;
        if (og_tokenizer_decode(t, want, nwant, &text, NULL) != OG_OK || strcmp(text, decoded)) {
            dec_bad++;
            fprintf(stderr, "%s: decode of the ids of %s: got \"%s\", want \"%s\"\n", name, hex, text ? text : "(error)",
                    decoded);
        }
        char *streamed = stream_decode(t, want, nwant);
        if (strcmp(streamed, decoded)) {
            stream_bad++;
            fprintf(stderr, "%s: streamed decode of %s: got \"%s\", want \"%s\"\n", name, hex, streamed, decoded);
        }
        free(streamed);
        og_free(text);
        og_free(got);
        free(want);
        free(bytes);
        n_enc++;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "decode")) {
        int64_t n;
        int32_t *v = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        char *text = NULL;
        if (og_tokenizer_decode(t, v, n, &text, NULL) != OG_OK || strcmp(text, want)) {
            dec_bad++;
            if (dec_bad < 20)
                fprintf(stderr, "%s: decode [%d%s]: got \"%s\", want \"%s\"\n", name, v[0], n > 1 ? " ..." : "",
                        text ? text : "(error)", want);
        }
        og_free(text);
        free(v);
        n_dec++;
    }
    CHECK_MSG(n_enc > 30 && n_dec > 100, "%s: only %d encode and %d decode cases", name, n_enc, n_dec);
    CHECK_MSG(enc_bad == 0, "%s: %d of %d encode cases differ", name, enc_bad, n_enc);
    CHECK_MSG(dec_bad == 0, "%s: %d decode cases differ", name, dec_bad);
    CHECK_MSG(stream_bad == 0, "%s: %d streamed decodes differ", name, stream_bad);
done:
    cJSON_Delete(cases);
    og_tokenizer_free(t);
    free(json);
    free(cases_text);
}

/* The stream holds back a cut character and gives it out whole. */
static void stream_holds_partial(void) {
    og_test_section("stream holds back an incomplete character");
    char path[512];
    snprintf(path, sizeof path, "%s/hf/qwen2-bias/tokenizer.json", OG_TEST_DATA_DIR);
    char *json = og_test_read_file(path);
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json(json, &t));
    int32_t *ids = NULL;
    int64_t n = 0;
    const char *text = "\xF0\x9F\x99\x82"; /* one emoji: several byte-level tokens */
    CHECK_OK(og_tokenizer_encode(t, text, 4, &ids, &n));
    CHECK(n >= 2);
    og_decode_stream *s = og_decode_stream_create(t);
    const char *piece;
    size_t pn;
    for (int64_t i = 0; i + 1 < n; i++) {
        CHECK_OK(og_decode_stream_push(s, ids[i], &piece, &pn));
        CHECK_MSG(pn == 0, "piece %lld gave %zu bytes before the character was complete", (long long)i, pn);
    }
    CHECK_OK(og_decode_stream_push(s, ids[n - 1], &piece, &pn));
    CHECK(pn == 4 && !memcmp(piece, text, 4));
    CHECK_STATUS(og_decode_stream_push(s, 1 << 20, &piece, &pn), OG_ERR_INVALID_ARGUMENT);
    og_decode_stream_destroy(s);
    og_free(ids);
    og_tokenizer_free(t);
    free(json);
}

static void config_and_lookup(void) {
    og_test_section("tokenizer_config: eos, bos, chat template; lookup by text");
    char path[512];
    snprintf(path, sizeof path, "%s/hf/mistral-sw/tokenizer.json", OG_TEST_DATA_DIR);
    char *json = og_test_read_file(path);
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json(json, &t));
    CHECK(og_tokenizer_token_id(t, "</s>") == 2);
    CHECK(og_tokenizer_token_id(t, "no such token") == -1);
    CHECK(og_tokenizer_is_special(t, 1) && !og_tokenizer_is_special(t, 300));
    CHECK_OK(og_tokenizer_load_config(t, "{\"eos_token\": {\"content\": \"</s>\"}, \"bos_token\": \"<s>\","
                                         " \"chat_template\": \"{{ x }}\"}"));
    const int32_t *eos;
    CHECK(og_tokenizer_eos_ids(t, &eos) == 1 && eos[0] == 2);
    CHECK(og_tokenizer_bos_id(t) == 1);
    CHECK(og_tokenizer_chat_template(t) && !strcmp(og_tokenizer_chat_template(t), "{{ x }}"));
    CHECK_STATUS(og_tokenizer_load_config(t, "{\"eos_token\": \"<nope>\"}"), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "<nope>") != NULL);
    og_tokenizer_free(t);
    free(json);
}

static void refuses(const char *json, og_status want, const char *needle) {
    og_tokenizer *t = NULL;
    CHECK_STATUS(og_tokenizer_load_json(json, &t), want);
    CHECK_MSG(strstr(og_last_error(), needle) != NULL, "error \"%s\" does not name \"%s\"", og_last_error(), needle);
    CHECK(t == NULL);
}

static void unsupported(void) {
    og_test_section("unsupported and broken files are refused by name");
#define M "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"
    refuses("[]", OG_ERR_FORMAT, "not a JSON object");
    refuses("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}", OG_ERR_UNSUPPORTED, "WordLevel");
    refuses("{" M ", \"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}}", OG_ERR_UNSUPPORTED,
            "Precompiled");
    refuses("{" M ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}}",
            OG_ERR_UNSUPPORTED, "Digits");
    refuses("{" M ", \"decoder\": {\"type\": \"CTC\"}}", OG_ERR_UNSUPPORTED, "CTC");
    refuses("{" M ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}}", OG_ERR_UNSUPPORTED,
            "regex");
    refuses("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", OG_ERR_FORMAT,
            "merges[0]");
    /* a normalized added token the normalizer erases could never match */
    refuses("{" M ", \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"x\"}, \"content\": \"\"},"
            " \"added_tokens\": [{\"id\": 3, \"content\": \"x\", \"normalized\": true}]}",
            OG_ERR_UNSUPPORTED, "added_tokens[0] \"x\"");
    refuses("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, \"vocab\": [[\"a\", -1.0], [\"b\", -2.0]]}}",
            OG_ERR_FORMAT, "unk_id");
    refuses("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", \"x\"]]}}", OG_ERR_FORMAT, "model.vocab[0]");
    refuses("{\"model\": {\"type\": \"WordPiece\", \"vocab\": [\"a\"]}}", OG_ERR_FORMAT, "vocab");
    /* a minimal file works, and merges apply */
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json("{" M "}", &t));
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenizer_encode(t, "abba", 4, &ids, &n));
    CHECK(n == 3 && ids[0] == 2 && ids[1] == 1 && ids[2] == 0);
    og_free(ids);
    og_tokenizer_free(t);
#undef M
}

/* The heap merge against the plain rescanning loop, on text built to stress
 * it: long words without spaces, runs of one character (overlapping pairs
 * of equal rank), mixed scripts, over every fixture tokenizer. */
static void fast_bpe_equals_reference(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
    char *json = og_test_read_file(path);
    if (!json) {
        snprintf(path, sizeof path, "%s/hf/%s/tokenizer.json", OG_TEST_DATA_DIR, name);
        json = og_test_read_file(path);
    }
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json(json, &t));
    free(json);
    if (!t) return;
    static const char *alphabet[] = {"a", "e", "t", "h", " ", "\n", "1", "é", "漢", "🙂", "aa", "the"};
    og_rng r = og_rng_seed(11);
    char text[4096];
    int mismatches = 0;
    for (int trial = 0; trial < 60; trial++) {
        size_t len = 0;
        int pieces = 1 + (int)(og_rng_next(&r) % 600);
        int run_of_one = trial % 3 == 0; /* "aaaa...": every pair has the same rank */
        for (int k = 0; k < pieces; k++) {
            const char *p = run_of_one ? "a" : alphabet[og_rng_next(&r) % (sizeof alphabet / sizeof alphabet[0])];
            if (trial % 2 && !strcmp(p, " ")) p = "e"; /* odd trials: one long word */
            size_t pn = strlen(p);
            if (len + pn >= sizeof text) break;
            memcpy(text + len, p, pn);
            len += pn;
        }
        int32_t *fast = NULL, *ref = NULL;
        int64_t nf = 0, nr = 0;
        og_tokenizer_use_reference_bpe(t, false);
        CHECK_OK(og_tokenizer_encode(t, text, len, &fast, &nf));
        og_tokenizer_use_reference_bpe(t, true);
        CHECK_OK(og_tokenizer_encode(t, text, len, &ref, &nr));
        if (nf != nr || (nf && memcmp(fast, ref, (size_t)nf * sizeof *fast))) mismatches++;
        og_free(fast);
        og_free(ref);
    }
    CHECK_MSG(mismatches == 0, "%s: heap BPE differs from the reference on %d of 60 texts", name, mismatches);
    og_tokenizer_free(t);
}

int main(void) {
    const char *names[] = {"gpt2-style", "llama-gqa", "llama3-style", "mistral-sw", "qwen2-bias", "qwen3-mixed"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) parity(names[i]);
    og_test_section("heap BPE equals the plain merge loop");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) fast_bpe_equals_reference(names[i]);
    stream_holds_partial();
    config_and_lookup();
    unsupported();
    return og_test_finish();
}
