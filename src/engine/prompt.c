/* The one prompt policy of every front end: a request's prompt as the token
 * ids the model is fed. Text is tokenized by the tokenizer's own rule
 * (og_tokenize's OG_TOKENIZE_ADD_SPECIAL: what the post-processor puts
 * around a sequence, e.g. a BOS), special tokens written in it parsed; a
 * chat is rendered by the model's chat template (which writes its own BOS)
 * and tokenized without added tokens, as transformers'
 * apply_chat_template(tokenize=True); token ids are taken as given. */
#include "engine/engine.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <string.h>

#define OG_ENGINE_MAX_TEMPLATE_VARS 16

static og_status encode(const og_engine *e, const char *text, unsigned flags, int32_t **ids, int64_t *n) {
    og_status st = og_tokenize(e->tok, text, strlen(text), flags, ids, n);
    if (st != OG_OK) return og_set_error(st, "cannot tokenize the prompt: %s", og_last_error());
    return OG_OK;
}

/* The template's extra variables: a JSON object of booleans. */
static og_status template_vars(const char *json, og_chat_flag *flags, size_t *n_flags, cJSON **root) {
    *n_flags = 0;
    *root = NULL;
    if (!json) return OG_OK;
    cJSON *j = cJSON_Parse(json);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "the chat template variables must be a JSON object");
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        if (!cJSON_IsBool(k)) {
            og_status st = og_set_error(OG_ERR_INVALID_ARGUMENT,
                                        "chat template variables: only boolean values are supported ('%s' is not one)",
                                        k->string);
            cJSON_Delete(j);
            return st;
        }
        if (*n_flags == OG_ENGINE_MAX_TEMPLATE_VARS) {
            cJSON_Delete(j);
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "more than %d chat template variables",
                                OG_ENGINE_MAX_TEMPLATE_VARS);
        }
        flags[(*n_flags)++] = (og_chat_flag){k->string, cJSON_IsTrue(k)};
    }
    *root = j;
    return OG_OK;
}

static og_status render_chat(const og_engine *e, const og_request_params *p, char **text) {
    if (!e->chat) return og_set_error(e->chat_status, "the model's %s", e->chat_error);
    if (!p->messages_json && (p->n_messages < 1 || !p->messages))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "a chat request needs at least one message");
    for (int32_t i = 0; !p->messages_json && i < p->n_messages; i++)
        if (!p->messages[i].role || !p->messages[i].content)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "message %d has a NULL role or content", (int)i);
    og_chat_flag flags[OG_ENGINE_MAX_TEMPLATE_VARS];
    size_t n_flags = 0;
    cJSON *vars = NULL;
    OG_TRY(template_vars(p->template_vars_json, flags, &n_flags, &vars));
    const int32_t bos = og_tokenizer_bos_id(e->tok);
    const int32_t *eos;
    og_chat_request req = {.messages = p->messages, .n_messages = (size_t)p->n_messages,
                           .add_generation_prompt = p->add_generation_prompt,
                           .bos_token = bos >= 0 ? og_tokenizer_token_text(e->tok, bos) : NULL,
                           .eos_token = og_tokenizer_eos_ids(e->tok, &eos) > 0 ? og_tokenizer_token_text(e->tok, eos[0])
                                                                               : NULL,
                           .flags = flags, .n_flags = n_flags, .messages_json = p->messages_json,
                           .tools_json = p->tools_json};
    og_status st = og_chat_template_render(e->chat, &req, text);
    cJSON_Delete(vars);
    /* the template's own refusal (raise_exception) is the request's fault */
    if (st != OG_OK && st != OG_ERR_OUT_OF_MEMORY) st = og_set_error(OG_ERR_INVALID_ARGUMENT, "%s", og_last_error());
    return st;
}

og_status og_engine_render(const og_engine *e, const og_request_params *p, char **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_render: NULL out");
    *out = NULL;
    if (!e || !p) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_render: NULL argument");
    if (p->kind != OG_PROMPT_CHAT)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_engine_render: a chat request (kind CHAT) only");
    if (!e->tok) return og_set_error(OG_ERR_INVALID_ARGUMENT, "a chat prompt needs an engine with a tokenizer");
    return render_chat(e, p, out);
}

og_status og_engine_prompt(const og_engine *e, const og_request_params *p, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if ((p->kind == OG_PROMPT_TEXT || p->kind == OG_PROMPT_CHAT) && !e->tok)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "a text or chat prompt needs an engine with a tokenizer");
    switch (p->kind) {
    case OG_PROMPT_TEXT:
        if (!p->text) return og_set_error(OG_ERR_INVALID_ARGUMENT, "a text prompt with NULL text");
        OG_TRY(encode(e, p->text, OG_TOKENIZE_PARSE_SPECIAL | (p->add_special ? OG_TOKENIZE_ADD_SPECIAL : 0u), ids, n));
        break;
    case OG_PROMPT_CHAT: {
        char *text = NULL;
        OG_TRY(render_chat(e, p, &text));
        og_status st = encode(e, text, OG_TOKENIZE_PARSE_SPECIAL, ids, n);
        og_free(text);
        OG_TRY(st);
        break;
    }
    case OG_PROMPT_TOKENS:
        if (p->n_tokens < 0 || (p->n_tokens > 0 && !p->tokens))
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "a token prompt with NULL tokens or a negative count");
        for (int64_t i = 0; i < p->n_tokens; i++)
            if (p->tokens[i] < 0 || p->tokens[i] >= e->vocab)
                return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                    "prompt token %lld is %d, outside the model's vocabulary [0, %lld)", (long long)i,
                                    (int)p->tokens[i], (long long)e->vocab);
        if (p->n_tokens > 0) {
            if (!(*ids = og_malloc((size_t)p->n_tokens * sizeof **ids)))
                return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the prompt");
            memcpy(*ids, p->tokens, (size_t)p->n_tokens * sizeof **ids);
            *n = p->n_tokens;
        }
        break;
    default:
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "unknown prompt kind %d", (int)p->kind);
    }
    if (*n == 0) {
        og_free(*ids);
        *ids = NULL;
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "the prompt is empty (it gives no tokens)");
    }
    for (int64_t i = 0; i < *n; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= e->vocab) { /* a tokenizer larger than the model */
            og_status st = og_set_error(OG_ERR_INVALID_ARGUMENT,
                                        "prompt token %lld is %d, outside the model's vocabulary [0, %lld)",
                                        (long long)i, (int)(*ids)[i], (long long)e->vocab);
            og_free(*ids);
            *ids = NULL;
            *n = 0;
            return st;
        }
    return OG_OK;
}
