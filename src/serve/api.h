/* The OpenAI request bodies the server takes (/v1/completions and
 * /v1/chat/completions), parsed and checked into what a request needs, and
 * the error object every refusal is answered with. */
#ifndef OG_SERVE_API_H
#define OG_SERVE_API_H

#include "offgraph.h"
#include "text/grammar.h"
#include "text/tool_calls.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OG_API_MAX_STOPS 4
#define OG_API_MAX_TOP_LOGPROBS 20
#define OG_API_MAX_LOGIT_BIAS 300
#define OG_API_MAX_N 128        /* OpenAI's bound on n */
#define OG_API_MAX_PROMPTS 64   /* prompts in one /v1/completions body */

/* What parsing needs to know of the served model. */
typedef struct og_serve_ctx {
    const char *model_id;
    int64_t vocab;    /* token ids of a prompt are in [0, vocab) */
    og_tool_format tool_format; /* the chat template's: tools are refused
                                   when it is NONE or OTHER */
} og_serve_ctx;

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
typedef struct og_api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL or e.g. "model_not_found" */
    char param[64];   /* "" when none */
    char message[512];
} og_api_error;

/* One prompt of /v1/completions: a text or token ids. */
typedef struct og_api_prompt {
    char *text;                 /* owned, or NULL */
    int32_t *tokens;            /* owned, or NULL */
    int64_t n_tokens;
} og_api_prompt;

/* A request as the body gives it; the prompt is the engine's to turn into
 * tokens (og_engine_submit: the one prompt policy). */
typedef struct og_api_request {
    bool chat;                  /* /v1/chat/completions */
    og_api_prompt *prompts;     /* completions: [n_prompts] (owned): OpenAI's
                                   prompt array gives several */
    int32_t n_prompts;
    int32_t n;                  /* choices of each prompt (1..OG_API_MAX_N) */
    og_chat_message *messages;  /* chat: [n_messages]; roles static, contents owned */
    int32_t n_messages;
    char *template_vars_json;   /* chat: chat_template_kwargs as JSON (owned), or NULL */
    og_sampler_params sampling; /* the library's defaults where a field is absent
                                   (its logit_bias is set from bias by
                                   og_api_request_params) */
    og_logit_bias *bias;        /* logit_bias: [n_bias] (owned), or NULL */
    int32_t n_bias;
    bool has_seed;
    int64_t max_tokens;         /* given, or the default (16; chat: 0, to the context) */
    bool max_tokens_given;
    char *stops[OG_API_MAX_STOPS]; /* owned */
    int32_t n_stops;
    int32_t logprobs;           /* -1: none; else top alternatives (0..20) */
    bool stream, include_usage;
    bool ignore_eos;            /* generate past the end-of-sequence tokens
                                   (vLLM's and llama.cpp's extension) */
    og_grammar *grammar;        /* response_format json_object / json_schema, or
                                   tool_choice required / a named function:
                                   what the output must follow (owned), or NULL */
    char *messages_json;        /* chat with tool calls or results: the messages
                                   as the template reads them (owned), or NULL */
    char *tools_json;           /* tools shown to the template (owned), or NULL */
    og_tool_format tool_format; /* how calls are taken out of the reply: the
                                   template's when tools are shown, else NONE */
} og_api_request;

/* Parses a body. False with *e set (400 for bad input, 404 for an unknown
 * model, 500 when out of memory); *q then holds nothing. */
bool og_api_parse(const og_serve_ctx *c, const char *body, size_t len, bool chat, og_api_request *q,
                  og_api_error *e);
/* The engine's request for prompt i of q (chat: 0), borrowing q's strings
 * and arrays; each of its q->n choices is one (og_engine_submit_n). */
og_request_params og_api_request_params(const og_api_request *q, int32_t i);
void og_api_request_free(og_api_request *q);

/* api_tools.c: tools, tool_choice and parallel_tool_calls of a chat body
 * into q (tools_json, tool_format, and the grammar of required / named
 * calls); after response_format. False with *e set. */
bool og_api_tools(const og_serve_ctx *c, const cJSON *root, og_api_request *q, og_api_error *e);
/* Message i (role already checked, content its text) as the template reads
 * it, appended to the array out: tool_call_id of a "tool" message, the
 * tool_calls of an assistant's (arguments parsed into objects). *tooly is
 * set when it has either. False with *e set. */
bool og_api_tool_message(const cJSON *m, int i, const char *role, const char *content, cJSON *out, bool *tooly,
                         og_api_error *e);

#endif /* OG_SERVE_API_H */
