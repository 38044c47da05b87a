/* libFuzzer harness: the OpenAI request bodies offgraph serve parses
 * (src/serve/api.c) over arbitrary bytes, as a completion and as a chat
 * completion. An accepted request is internally consistent: prompts
 * (texts or token ids within the vocabulary, a bounded number of them and
 * of choices) or chat messages with known roles and their template
 * variables as a JSON object, logit biases within the vocabulary, bounded
 * stops and logprobs, sampling fields within their ranges, tools and the
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
    if ((q->n_prompts > 0) == (q->messages != NULL) || q->chat != chat || (chat && !q->messages)) __builtin_trap();
    if (q->n < 1 || q->n > OG_API_MAX_N || q->n_prompts > OG_API_MAX_PROMPTS ||
        (!chat && q->n * q->n_prompts > OG_API_MAX_N))
        __builtin_trap();
    for (int32_t k = 0; k < q->n_prompts; k++) {
        const og_api_prompt *one = &q->prompts[k];
        if ((one->text != NULL) == (one->tokens != NULL) || (one->tokens && one->n_tokens < 1)) __builtin_trap();
        for (int64_t i = 0; one->tokens && i < one->n_tokens; i++)
            if (one->tokens[i] < 0 || one->tokens[i] >= c->vocab) __builtin_trap();
    }
    for (int32_t i = 0; i < q->n_bias; i++)
        if (q->bias[i].token < 0 || q->bias[i].token >= c->vocab || !(q->bias[i].bias >= -100 && q->bias[i].bias <= 100))
            __builtin_trap();
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
    og_request_params p = og_api_request_params(q, 0);
    if (p.kind != (chat ? OG_PROMPT_CHAT : q->prompts[0].text ? OG_PROMPT_TEXT : OG_PROMPT_TOKENS) ||
        p.sampling.n_logit_bias != q->n_bias ||
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
