/* libFuzzer harness: the OpenAI request bodies offgraph serve parses
 * (src/serve/api.c) over arbitrary bytes, as a completion and as a chat
 * completion, with a byte-level tokenizer. An accepted request is
 * internally consistent: a prompt within the context and the vocabulary,
 * bounded stops and logprobs, sampling fields within their ranges. The body
 * is a plain function that test_fuzz_replay also runs over
 * tests/fuzz/corpus/http_request/. */
#include "fuzz.h"
#include "core/core.h"
#include "text/tokenizer.h"
#include "serve/api.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int og_fuzz_http_request(const uint8_t *data, size_t size);

/* Byte-level BPE without merges (every byte one token), a ChatML-style end
 * token, and a chat template the renderer can take. */
static const og_tokenizer *tokenizer(void) {
    static og_tokenizer *t;
    static bool tried;
    if (tried) return t;
    tried = true;
    char *json = og_malloc(256 * 16 + 1024);
    if (!json) return NULL;
    size_t n = (size_t)sprintf(json,
                               "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                               "\"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, "
                               "\"added_tokens\": [{\"id\": 256, \"content\": \"<|im_start|>\", \"special\": true}, "
                               "{\"id\": 257, \"content\": \"<|im_end|>\", \"special\": true}], "
                               "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {");
    int id = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + id++;
        if (b == '"' || b == '\\') n += (size_t)sprintf(json + n, "%s\"\\%c\": %d", b ? ", " : "", b, b);
        else n += (size_t)sprintf(json + n, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
    }
    sprintf(json + n, "}}}");
    if (og_tokenizer_load_json(json, &t) != OG_OK) __builtin_trap();
    og_free(json);
    return t;
}

static void check(const og_serve_ctx *c, const og_api_request *q) {
    if (q->n_prompt < 1 || q->n_prompt > c->ctx || !q->prompt) __builtin_trap();
    for (int64_t i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= c->vocab) __builtin_trap();
    if (q->n_stops < 0 || q->n_stops > OG_API_MAX_STOPS) __builtin_trap();
    for (int32_t i = 0; i < q->n_stops; i++)
        if (!q->stops[i]) __builtin_trap();
    if (q->logprobs < -1 || q->logprobs > OG_API_MAX_TOP_LOGPROBS) __builtin_trap();
    if (q->max_tokens < 0 || !(q->sampling.temperature >= 0) || !(q->sampling.top_p >= 0 && q->sampling.top_p <= 1))
        __builtin_trap();
}

int og_fuzz_http_request(const uint8_t *data, size_t size) {
    const og_tokenizer *t = tokenizer();
    if (!t) return 0;
    og_serve_ctx c;
    memset(&c, 0, sizeof c);
    c.tok = t;
    c.model_id = "fuzz-model";
    c.vocab = og_tokenizer_vocab_size(t);
    c.ctx = 64; /* small, so that the prompt-too-long refusal is reached */
    for (int chat = 0; chat < 2; chat++) {
        og_api_request q;
        og_api_error e;
        memset(&q, 0, sizeof q);
        if (og_api_parse(&c, (const char *)data, size, chat, &q, &e)) {
            check(&c, &q);
            og_api_request_free(&q);
        } else if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type) {
            __builtin_trap(); /* every refusal is an error object with a message */
        }
    }
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_http_request)
