/* libFuzzer harness: the tokenizer over arbitrary bytes. The input is split
 * at its first NUL: the part before is loaded as tokenizer.json; the part
 * after (or, without a NUL, the whole input) is text to encode with it and
 * with a built-in byte-level tokenizer. Encoded ids must decode, and the
 * byte-level round trip must give back the text (invalid UTF-8 replaced).
 * The body is a plain function that test_fuzz_replay also runs over
 * tests/fuzz/corpus/tokenizer/. */
#include "fuzz.h"
#include "core/core.h"
#include "text/tokenizer.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int og_fuzz_tokenizer(const uint8_t *data, size_t size);

/* Byte-level BPE with the Llama-3 split regex, a few merges and one special
 * token: every byte is in the vocabulary, so decode(encode(x)) == x for
 * valid UTF-8. */
static const char k_byte_level[] =
    "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+"
    "|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    " \"behavior\": \"Isolated\", \"invert\": false},"
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    " \"normalizer\": {\"type\": \"NFC\"}, \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"added_tokens\": [{\"id\": 256, \"content\": \"<|end|>\", \"special\": true}],"
    " \"model\": {\"type\": \"BPE\", \"merges\": [\"\\u0120 t\", \"h e\", \"\\u0120t he\"], \"vocab\": {";

static og_tokenizer *byte_level(void) {
    static og_tokenizer *t;
    if (t) return t;
    /* the vocabulary: the 256 byte characters, then the merges' results */
    char *json = og_malloc(sizeof k_byte_level + 256 * 24 + 128);
    if (!json) return NULL;
    size_t n = (size_t)sprintf(json, "%s", k_byte_level);
    int id = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + id++;
        if (b == '"' || b == '\\') n += (size_t)sprintf(json + n, "\"\\%c\": %d, ", b, b + 1000);
        else n += (size_t)sprintf(json + n, "\"\\u%04x\": %d, ", cp, b + 1000);
    }
    sprintf(json + n, "\"\\u0120t\": 1300, \"he\": 1301, \"\\u0120the\": 1302}}}");
    if (og_tokenizer_load_json(json, &t) != OG_OK) __builtin_trap();
    og_free(json);
    return t;
}

/* Encodes, decodes whole and streamed; returns the decoded text (og_free). */
static char *round_trip(const og_tokenizer *t, const char *text, size_t len, size_t *out_len) {
    int32_t *ids = NULL;
    int64_t n = 0;
    char *back = NULL;
    if (og_tokenizer_encode(t, text, len, &ids, &n) != OG_OK) return NULL;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= og_tokenizer_vocab_size(t)) __builtin_trap();
    if (og_tokenizer_decode(t, ids, n, &back, out_len) != OG_OK) __builtin_trap();
    og_decode_stream *s = NULL;
    if (og_decode_stream_create(t, &s) != OG_OK) s = NULL;
    const char *piece;
    size_t pn, streamed = 0;
    for (int64_t i = 0; s && i <= n; i++) {
        if ((i < n ? og_decode_stream_push(s, ids[i], &piece, &pn) : og_decode_stream_finish(s, &piece, &pn)) != OG_OK)
            __builtin_trap();
        streamed += pn;
    }
    if (s && streamed != *out_len) __builtin_trap(); /* the stream gives out the same text */
    og_decode_stream_destroy(s);
    og_free(ids);
    return back;
}

int og_fuzz_tokenizer(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const char *text = (const char *)data;
    size_t len = size;
    if (nul) {
        char *json = og_malloc((size_t)(nul - data) + 1);
        if (!json) return 0;
        memcpy(json, data, (size_t)(nul - data));
        json[nul - data] = 0;
        og_tokenizer *t = NULL;
        if (og_tokenizer_load_json(json, &t) == OG_OK) {
            size_t n;
            og_free(round_trip(t, (const char *)nul + 1, size - (size_t)(nul - data) - 1, &n));
            og_tokenizer_destroy(t);
        }
        og_free(json);
        text = (const char *)nul + 1;
        len = size - (size_t)(nul - data) - 1;
    }
    og_tokenizer *bl = byte_level();
    size_t n;
    char *back = bl ? round_trip(bl, text, len, &n) : NULL;
    if (back) {
        /* valid UTF-8 comes back as it was, after NFC (ASCII only to keep the
         * oracle simple: NFC leaves ASCII alone) */
        int ascii = 1;
        for (size_t i = 0; i < len && ascii; i++) ascii = (unsigned char)text[i] < 0x80;
        if (ascii && (n != len || memcmp(back, text, len))) __builtin_trap();
    }
    og_free(back);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_tokenizer)
