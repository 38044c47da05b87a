/* libFuzzer harness: the OpenAI request bodies offgraph serve parses
 * (src/serve/api.c) over arbitrary bytes, as a completion and as a chat
 * completion. An accepted request is internally consistent: exactly one
 * prompt form (text, token ids within the vocabulary, or chat messages with
 * known roles and their template variables as a JSON object), bounded stops
 * and logprobs, sampling fields within their ranges, tools and the
 * messages the template reads as JSON arrays, and the engine's
 * request made of it says the same. The body is a plain function that
 * test_fuzz_replay also runs over tests/fuzz/corpus/http_request/. */
#include "fuzz.h"
#include "core/core.h"
#include "serve/api.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int og_fuzz_http_request(const uint8_t *data, size_t size);

static void check(const og_serve_ctx *c, const og_api_request *q, bool chat) {
    const int forms = (q->text != NULL) + (q->tokens != NULL) + (q->messages != NULL);
    if (forms != 1 || q->chat != chat || (chat && !q->messages)) __builtin_trap();
    if (q->tokens && q->n_tokens < 1) __builtin_trap();
    for (int64_t i = 0; q->tokens && i < q->n_tokens; i++)
        if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab) __builtin_trap();
    bool user = false;
    for (int32_t i = 0; q->messages && i < q->n_messages; i++) {
        const char *r = q->messages[i].role;
        if (!r || !q->messages[i].content ||
            (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")))
            __builtin_trap();
        user |= !strcmp(r, "user");
    }
    if (q->messages && (q->n_messages < 1 || !user)) __builtin_trap();
    if (q->template_vars_json) {
        cJSON *j = cJSON_Parse(q->template_vars_json);
        if (!cJSON_IsObject(j)) __builtin_trap();
        cJSON_Delete(j);
    }
    /* tools: shown only as an array to a template that parses calls; the
       messages the template reads, an array of objects with roles */
    if (q->tools_json) {
        cJSON *j = cJSON_Parse(q->tools_json);
        if (!cJSON_IsArray(j) || q->tool_format != c->tool_format || !chat) __builtin_trap();
        cJSON_Delete(j);
    } else if (q->tool_format != OG_TOOL_FORMAT_NONE) {
        __builtin_trap();
    }
    if (q->messages_json) {
        cJSON *j = cJSON_Parse(q->messages_json);
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != q->n_messages) __builtin_trap();
        cJSON_Delete(j);
    }
    if (q->n_stops < 0 || q->n_stops > OG_API_MAX_STOPS) __builtin_trap();
    for (int32_t i = 0; i < q->n_stops; i++)
        if (!q->stops[i] || !*q->stops[i]) __builtin_trap();
    if (q->logprobs < -1 || q->logprobs > OG_API_MAX_TOP_LOGPROBS) __builtin_trap();
    if (q->max_tokens < 0 || (q->max_tokens_given && q->max_tokens < 1) || !(q->sampling.temperature >= 0) ||
        !(q->sampling.top_p > 0 && q->sampling.top_p <= 1))
        __builtin_trap();
    og_request_params p = og_api_request_params(q);
    if (p.kind != (chat ? OG_PROMPT_CHAT : q->text ? OG_PROMPT_TEXT : OG_PROMPT_TOKENS) ||
        p.max_tokens != q->max_tokens || p.n_stop != q->n_stops || p.logprobs != q->logprobs ||
        (q->has_seed && p.sampling.seed == 0) || (!q->has_seed && p.sampling.seed != 0))
        __builtin_trap();
}

int og_fuzz_http_request(const uint8_t *data, size_t size) {
    og_serve_ctx c = {.model_id = "fuzz-model", .vocab = 258, .tool_format = OG_TOOL_FORMAT_HERMES};
    for (int chat = 0; chat < 2; chat++) {
        og_api_request q;
        og_api_error e;
        memset(&q, 0, sizeof q);
        if (og_api_parse(&c, (const char *)data, size, chat, &q, &e)) {
            check(&c, &q, chat);
            og_api_request_free(&q);
        } else if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type) {
            __builtin_trap(); /* every refusal is an error object with a message */
        }
    }
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_http_request)
