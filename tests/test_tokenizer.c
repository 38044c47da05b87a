/* Tokenizer parity with Hugging Face `tokenizers`: every case of
 * tests/data/tokenizers/<name>/cases.json (made by
 * tests/fixtures/make_tokenizer_fixtures.py) must encode to exactly the
 * same ids and decode to exactly the same text; the streaming decoder must
 * give the same text piece by piece; unsupported files are refused by name. */
#include "harness.h"
#include "core/core.h"
#include "text/tokenizer.h"

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
    og_decode_stream *s = NULL;
    CHECK_OK(og_decode_stream_create(t, &s));
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
    og_tokenizer_destroy(t);
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
    og_decode_stream *s = NULL;
    CHECK_OK(og_decode_stream_create(t, &s));
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
    og_tokenizer_destroy(t);
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
    og_tokenizer_destroy(t);
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
    /* Strip after Fuse beyond one leading character: a stream could not match a whole decode */
    refuses("{" M ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
            "\"Strip\", \"content\": \" \", \"start\": 2, \"stop\": 0}]}}",
            OG_ERR_UNSUPPORTED, "Strip after Fuse");
    refuses("{" M ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
            "\"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 1}]}}",
            OG_ERR_UNSUPPORTED, "Strip after Fuse");
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
    og_tokenizer_destroy(t);
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
    og_tokenizer_destroy(t);
}

/* Unigram against a naive oracle: the best total score over every
 * segmentation of short strings over a small vocabulary with random scores,
 * a character no piece covers ('x' here) costing the lowest score minus 10
 * as unk. Equal totals are common (a + aa, aa + a) and are broken by
 * rounding in the order the sums are formed, so the check is that the ids
 * spell the string and score the best total, not which of the equals. */
typedef struct uni_oracle {
    const char *const *piece;
    const double *score;
    int n;
    double unk_score;
} uni_oracle;

static double uni_best(const uni_oracle *o, const char *s, int n, int i, double *memo) {
    if (i == n) return 0.0;
    if (memo[i] == memo[i]) return memo[i]; /* not NaN: known */
    double best = -1e300;
    int single = 0;
    for (int k = 0; k < o->n; k++) {
        int len = (int)strlen(o->piece[k]);
        if (len > n - i || memcmp(s + i, o->piece[k], (size_t)len)) continue;
        if (len == 1) single = 1;
        double v = o->score[k] + uni_best(o, s, n, i + len, memo);
        if (v > best) best = v;
    }
    if (!single) {
        double v = o->unk_score + uni_best(o, s, n, i + 1, memo);
        if (v > best) best = v;
    }
    return memo[i] = best;
}

static void unigram_oracle(void) {
    og_test_section("Unigram: Viterbi scores the best of every segmentation");
    static const char *const pieces[] = {"<unk>", "a", "b", "c", "ab", "bc", "abc", "ca", "aa", "bca", "cab", "aab"};
    enum { NP = sizeof pieces / sizeof pieces[0] };
    double score[NP];
    og_rng r = og_rng_seed(5);
    char json[4096];
    size_t len = (size_t)snprintf(json, sizeof json, "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [");
    double lowest = 0;
    for (int k = 0; k < NP; k++) {
        score[k] = k == 0 ? -2.5 : -1.0 - (double)(og_rng_next(&r) % 1000000) / 100000.0;
        if (score[k] < lowest) lowest = score[k];
        len += (size_t)snprintf(json + len, sizeof json - len, "%s[\"%s\", %.17g]", k ? ", " : "", pieces[k], score[k]);
    }
    snprintf(json + len, sizeof json - len, "]}}");
    og_tokenizer *t = NULL;
    CHECK_OK(og_tokenizer_load_json(json, &t));
    if (!t) return;
    uni_oracle o = {pieces, score, NP, lowest - 10.0};
    static const char alphabet[] = "abcx";
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        char s[16];
        int n = 1 + (int)(og_rng_next(&r) % 12);
        for (int i = 0; i < n; i++) s[i] = alphabet[og_rng_next(&r) % 4];
        double memo[16];
        for (int i = 0; i < 16; i++) memo[i] = 0.0 / 0.0;
        double want = uni_best(&o, s, n, 0, memo);
        int32_t *got = NULL;
        int64_t ng = 0;
        CHECK_OK(og_tokenizer_encode(t, s, (size_t)n, &got, &ng));
        /* the ids must spell s: a piece, or unk for a run of x */
        double total = 0;
        int pos = 0, ok = 1, prev_unk = 0;
        for (int64_t q = 0; q < ng && ok; q++) {
            if (got[q] == 0) {
                ok = !prev_unk && pos < n && s[pos] == 'x';
                while (pos < n && s[pos] == 'x') pos++, total += o.unk_score;
                prev_unk = 1;
                continue;
            }
            int pl = got[q] > 0 && got[q] < NP ? (int)strlen(pieces[got[q]]) : 0;
            ok = pl && pl <= n - pos && !memcmp(s + pos, pieces[got[q]], (size_t)pl);
            pos += pl;
            total += ok ? score[got[q]] : 0;
            prev_unk = 0;
        }
        ok = ok && pos == n && total > want - 1e-9 && total < want + 1e-9;
        if (!ok && bad++ < 5) fprintf(stderr, "unigram oracle: \"%.*s\": %lld ids scoring %.17g, the best is %.17g\n", n, s,
                                      (long long)ng, total, want);
        og_free(got);
    }
    CHECK_MSG(bad == 0, "Unigram differs from the oracle on %d of 300 strings", bad);
    og_tokenizer_destroy(t);
}

/* Errors that depend on the text: a model without its unknown token. */
static void model_errors(void) {
    og_test_section("Unigram without unk_id, WordPiece without its unk_token: the text that needs them is refused");
    og_tokenizer *t = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenizer_load_json("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}", &t));
    CHECK_OK(og_tokenizer_encode(t, "aa", 2, &ids, &n));
    CHECK(n == 2 && ids[0] == 0 && ids[1] == 0);
    og_free(ids);
    CHECK_STATUS(og_tokenizer_encode(t, "ab", 2, &ids, &n), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "unk_id") != NULL);
    og_tokenizer_destroy(t);
    CHECK_OK(og_tokenizer_load_json("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0, \"##b\": 1}}}", &t));
    CHECK_OK(og_tokenizer_encode(t, "ab", 2, &ids, &n));
    CHECK(n == 2 && ids[0] == 0 && ids[1] == 1);
    og_free(ids);
    CHECK_STATUS(og_tokenizer_encode(t, "ba", 2, &ids, &n), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "unk_token") != NULL);
    og_tokenizer_destroy(t);
    refuses("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"\\u00ff\": 0}}, \"x\": \"\xff\"}", OG_ERR_FORMAT, "UTF-8");
}

int main(void) {
    const char *names[] = {"gpt2-style", "llama-gqa", "llama3-style", "mistral-sw", "qwen2-bias", "qwen3-mixed",
                           "added-flags"};
    /* Unigram and WordPiece models, with added tokens using every flag */
    const char *others[] = {"unigram-metaspace", "unigram-bytefallback", "bert-uncased", "wordpiece-cased",
                            "wordpiece-nfd"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) parity(names[i]);
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) parity(others[i]);
    og_test_section("heap BPE equals the plain merge loop");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) fast_bpe_equals_reference(names[i]);
    stream_holds_partial();
    config_and_lookup();
    unsupported();
    unigram_oracle();
    model_errors();
    return og_test_finish();
}
