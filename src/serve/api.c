/* The OpenAI request bodies: fields, their types and bounds, and the
 * prompt as the body gives it (text, token ids, or chat messages); the
 * engine turns it into tokens (og_engine_submit). */
#include "serve/api.h"

#include "core/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool fail(og_api_error *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) OG_PRINTF(6, 7);
static bool fail(og_api_error *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(e, param, ...) fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* A field that is absent or null counts as absent. */
static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* A number in [lo, hi] (an integer when integer): false with e set when it
 * is there but wrong; *out untouched when absent. */
static bool number(const cJSON *root, const char *name, double lo, double hi, bool integer, double *out,
                   og_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return true;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
        return BAD(e, name, "'%s' must be %s", name, integer ? "an integer" : "a number");
    double v = f->valuedouble;
    if (integer && v != floor(v)) return BAD(e, name, "'%s' must be an integer, not %g", name, v);
    if (v < lo || v > hi) return BAD(e, name, "'%s' must be in [%g, %g], not %g", name, lo, hi, v);
    *out = v;
    return true;
}

static bool boolean(const cJSON *root, const char *name, bool *out, og_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return true;
    if (!cJSON_IsBool(f)) return BAD(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return true;
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts joined. *out owned by the caller (og_free). */
static bool content_text(const cJSON *msg, int i, char **out, og_api_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *c = field(msg, "content");
    *out = NULL;
    og_strbuf b = {0};
    og_strbuf_add(&b, "", 0);
    if (c && cJSON_IsString(c)) {
        og_strbuf_add(&b, c->valuestring, strlen(c->valuestring));
    } else if (c && !cJSON_IsArray(c)) {
        og_free(b.p);
        return BAD(e, param, "'%s' must be a string or an array of text parts", param);
    } else if (c) {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                og_free(b.p);
                return BAD(e, param, "each part of '%s' must be an object with a 'type'", param);
            }
            if (strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                og_free(b.p);
                return BAD(e, param, "'%s': only text parts are supported (this part is '%s')", param,
                           type->valuestring);
            }
            og_strbuf_add(&b, text->valuestring, strlen(text->valuestring));
        }
    }
    if (b.oom) {
        og_free(b.p);
        return fail(e, 500, "server_error", NULL, param, "out of memory");
    }
    *out = b.p;
    return true;
}

/* The conversation's messages, for the model's chat template (the engine
 * renders it). Developer messages are system messages. chat_template_kwargs,
 * when given, holds boolean variables of the template (e.g.
 * {"enable_thinking": false}); it goes to the engine as JSON. */
static bool chat_messages(const cJSON *messages, const cJSON *kwargs, og_api_request *q, og_api_error *e) {
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) < 1)
        return BAD(e, "messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(messages);
    if (kwargs) {
        if (!cJSON_IsObject(kwargs)) return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const cJSON *k;
        int n_flags = 0;
        cJSON_ArrayForEach(k, kwargs) {
            if (!cJSON_IsBool(k))
                return BAD(e, "chat_template_kwargs", "'chat_template_kwargs': only boolean values are supported "
                           "('%s' is not one)", k->string);
            if (++n_flags > 16)
                return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' has more than %d entries", 16);
        }
        if (!(q->template_vars_json = cJSON_PrintUnformatted(kwargs)))
            return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!(q->messages = og_calloc((size_t)n, sizeof *q->messages)))
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    bool any_user = false, tooly = false;
    cJSON *full = cJSON_CreateArray(); /* the messages as the template reads them */
    if (!full) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            cJSON_Delete(full);
            return BAD(e, param, "each message must be an object with a string 'role'");
        }
        const char *r = role->valuestring;
        static const char *const roles[] = {"system", "user", "assistant", "tool"};
        const char *known = NULL;
        if (!strcmp(r, "developer")) known = roles[0];
        for (int k = 0; k < 4 && !known; k++)
            if (!strcmp(r, roles[k])) known = roles[k];
        if (!known) {
            cJSON_Delete(full);
            return BAD(e, param, "'%s' is not a role this server knows (system, developer, user, assistant, tool)", r);
        }
        char *text = NULL;
        if (!content_text(m, i, &text, e)) {
            cJSON_Delete(full);
            return false;
        }
        any_user |= known == roles[1];
        q->messages[i] = (og_chat_message){known, text};
        q->n_messages = ++i;
        if (!og_api_tool_message(m, i - 1, known, text, full, &tooly, e)) {
            cJSON_Delete(full);
            return false;
        }
    }
    if (tooly && !(q->messages_json = cJSON_PrintUnformatted(full))) {
        cJSON_Delete(full);
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    cJSON_Delete(full);
    if (!any_user) return BAD(e, "messages", "'messages' has no user message");
    return true;
}

/* One prompt: a string, or token ids (an array of numbers). */
static bool one_prompt(const og_serve_ctx *c, const cJSON *p, og_api_prompt *out, og_api_error *e) {
    if (cJSON_IsString(p))
        return (out->text = og_strdup(p->valuestring)) || fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const int n = cJSON_GetArraySize(p);
    if (n == 0) return BAD(e, "prompt", "'prompt' is empty");
    if (!(out->tokens = og_calloc((size_t)n, sizeof *out->tokens)))
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= (double)c->vocab)
            return BAD(e, "prompt", "'prompt': token ids must be integers in [0, %lld); element %d is not",
                       (long long)c->vocab, i);
        out->tokens[i++] = (int32_t)t->valuedouble;
    }
    out->n_tokens = n;
    return true;
}

/* The prompt of /v1/completions: a string, token ids, or an array of
 * prompts (strings or arrays of token ids), each of which gets n choices. */
static bool completion_prompt(const og_serve_ctx *c, const cJSON *p, og_api_request *q, og_api_error *e) {
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    if (!cJSON_IsString(p) && !cJSON_IsArray(p))
        return BAD(e, "prompt", "'prompt' must be a string, token ids, or an array of strings or of token id arrays");
    const bool many = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0));
    const int n = many ? cJSON_GetArraySize(p) : 1;
    if (n > OG_API_MAX_PROMPTS) return BAD(e, "prompt", "'prompt' holds at most %d prompts", OG_API_MAX_PROMPTS);
    if (!(q->prompts = og_calloc((size_t)n, sizeof *q->prompts)))
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!many) {
        q->n_prompts = 1;
        return one_prompt(c, p, &q->prompts[0], e);
    }
    const cJSON *one;
    cJSON_ArrayForEach(one, p) {
        if (!cJSON_IsString(one) && !cJSON_IsArray(one))
            return BAD(e, "prompt", "'prompt' (an array of prompts): element %d is neither a string nor token ids",
                       (int)q->n_prompts);
        if (!one_prompt(c, one, &q->prompts[q->n_prompts++], e)) return false;
    }
    return true;
}

void og_api_request_free(og_api_request *q) {
    for (int32_t i = 0; q->prompts && i < q->n_prompts; i++) {
        og_free(q->prompts[i].text);
        og_free(q->prompts[i].tokens);
    }
    og_free(q->prompts);
    for (int32_t i = 0; q->messages && i < q->n_messages; i++) og_free((char *)q->messages[i].content);
    og_free(q->messages);
    cJSON_free(q->template_vars_json);
    for (int32_t i = 0; i < q->n_stops; i++) og_free(q->stops[i]);
    og_grammar_destroy(q->grammar);
    og_free(q->bias);
    cJSON_free(q->messages_json);
    cJSON_free(q->tools_json);
    memset(q, 0, sizeof *q);
}

og_request_params og_api_request_params(const og_api_request *q, int32_t i) {
    og_request_params p = og_request_default_params();
    const og_api_prompt *one = !q->chat && i >= 0 && i < q->n_prompts ? &q->prompts[i] : NULL;
    if (q->chat) {
        p.kind = OG_PROMPT_CHAT;
        p.messages = q->messages;
        p.n_messages = q->n_messages;
        p.template_vars_json = q->template_vars_json;
        p.messages_json = q->messages_json;
        p.tools_json = q->tools_json;
    } else if (one && one->text) {
        p.kind = OG_PROMPT_TEXT;
        p.text = one->text;
        p.add_special = true; /* the tokenizer's rule, as offgraph run */
    } else if (one) {
        p.kind = OG_PROMPT_TOKENS;
        p.tokens = one->tokens;
        p.n_tokens = one->n_tokens;
    }
    p.sampling = q->sampling;
    p.sampling.logit_bias = q->bias;
    p.sampling.n_logit_bias = q->n_bias;
    /* the engine picks a seed for 0: a request that asks for seed 0 gets a
     * fixed one of its own, so that it repeats */
    if (q->has_seed && p.sampling.seed == 0) p.sampling.seed = 0x9E3779B97F4A7C15ull;
    if (!q->has_seed) p.sampling.seed = 0;
    p.max_tokens = q->max_tokens;
    p.stop = (const char *const *)q->stops;
    p.n_stop = q->n_stops;
    p.ignore_eos = q->ignore_eos;
    p.logprobs = q->logprobs;
    return p;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...}, at most
 * OG_API_MAX_LOGIT_BIAS entries (OpenAI's bound). */
static bool logit_bias(const og_serve_ctx *c, const cJSON *lb, og_api_request *q, og_api_error *e) {
    if (!lb) return true;
    if (!cJSON_IsObject(lb)) return BAD(e, "logit_bias", "'logit_bias' must be an object of token ids and biases");
    const int n = cJSON_GetArraySize(lb);
    if (n > OG_API_MAX_LOGIT_BIAS)
        return BAD(e, "logit_bias", "'logit_bias' holds at most %d tokens", OG_API_MAX_LOGIT_BIAS);
    if (n == 0) return true;
    if (!(q->bias = og_calloc((size_t)n, sizeof *q->bias))) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *b;
    cJSON_ArrayForEach(b, lb) {
        char *end = NULL;
        const long long id = strtoll(b->string, &end, 10);
        if (!*b->string || *end || id < 0 || id >= c->vocab)
            return BAD(e, "logit_bias", "'logit_bias': the key '%.40s' is not a token id in [0, %lld)", b->string,
                       (long long)c->vocab);
        if (!cJSON_IsNumber(b) || !isfinite(b->valuedouble) || b->valuedouble < -100 || b->valuedouble > 100)
            return BAD(e, "logit_bias", "'logit_bias': the bias of token %lld must be a number in [-100, 100]", id);
        q->bias[q->n_bias++] = (og_logit_bias){(int32_t)id, (float)b->valuedouble};
    }
    return true;
}

/* response_format: {"type": "text"}, {"type": "json_object"} (any JSON
 * object) or {"type": "json_schema", "json_schema": {"name", "schema",
 * "strict", "description"}}: the grammar the output must follow. A schema
 * the compiler refuses (a keyword or string format it does not support) is
 * a 400 naming it. */
static bool response_format(const cJSON *rf, og_api_request *q, og_api_error *e) {
    if (!rf) return true;
    const cJSON *type = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
    if (!cJSON_IsString(type))
        return BAD(e, "response_format", "'response_format' must be an object with a 'type' (text, json_object, "
                   "json_schema)");
    og_status st = OG_OK;
    if (!strcmp(type->valuestring, "text")) return true;
    if (!strcmp(type->valuestring, "json_object")) {
        char *g = og_json_any_gbnf(true);
        if (!g) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        st = og_grammar_parse(g, strlen(g), &q->grammar);
        og_free(g);
    } else if (!strcmp(type->valuestring, "json_schema")) {
        const cJSON *js = field(rf, "json_schema");
        const cJSON *schema = cJSON_IsObject(js) ? field(js, "schema") : NULL;
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
            return BAD(e, "response_format", "'response_format.json_schema.schema' must be a JSON schema (an object)");
        char *text = cJSON_PrintUnformatted(schema);
        if (!text) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        st = og_grammar_from_json_schema(text, strlen(text), &q->grammar);
        cJSON_free(text);
    } else {
        return BAD(e, "response_format", "'response_format.type' must be text, json_object or json_schema, not '%s'",
                   type->valuestring);
    }
    if (st == OG_ERR_OUT_OF_MEMORY) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (st != OG_OK) return BAD(e, "response_format", "'response_format': %s", og_last_error());
    return true;
}

/* The body's fields. Every top-level field is one this server reads, or a
 * 400 naming it: a field OpenAI defines that offgraph does not implement
 * (the request would otherwise be answered as if it had not been sent), or
 * one that neither defines. Fields that are implemented for some values
 * only (n, best_of, echo, suffix, modalities, store, service_tier) are
 * checked where they are read. */
enum { IN_CHAT = 1, IN_COMPLETIONS = 2, IN_BOTH = 3 };
static const struct {
    const char *name;
    int in;
} known_fields[] = {
    {"model", IN_BOTH}, {"max_tokens", IN_BOTH}, {"temperature", IN_BOTH}, {"top_p", IN_BOTH},
    {"seed", IN_BOTH}, {"presence_penalty", IN_BOTH}, {"frequency_penalty", IN_BOTH}, {"logit_bias", IN_BOTH},
    {"logprobs", IN_BOTH}, {"n", IN_BOTH}, {"stop", IN_BOTH}, {"stream", IN_BOTH}, {"stream_options", IN_BOTH},
    {"response_format", IN_BOTH}, {"service_tier", IN_BOTH},
    /* no effect on the output, as at OpenAI: who asks, and what for */
    {"user", IN_BOTH}, {"metadata", IN_CHAT}, {"safety_identifier", IN_CHAT}, {"prompt_cache_key", IN_CHAT},
    {"store", IN_CHAT}, {"modalities", IN_CHAT},
    {"messages", IN_CHAT}, {"max_completion_tokens", IN_CHAT}, {"top_logprobs", IN_CHAT},
    {"prompt", IN_COMPLETIONS}, {"echo", IN_COMPLETIONS}, {"best_of", IN_COMPLETIONS}, {"suffix", IN_COMPLETIONS},
    /* tool calls (api_tools.c) */
    {"tools", IN_CHAT}, {"tool_choice", IN_CHAT}, {"parallel_tool_calls", IN_CHAT},
    /* extensions (llama.cpp's and vLLM's) */
    {"top_k", IN_BOTH}, {"min_p", IN_BOTH}, {"ignore_eos", IN_BOTH}, {"chat_template_kwargs", IN_CHAT},
};
static const struct {
    const char *name;
    const char *what;
} refused_fields[] = {
    {"audio", "audio output"},
    {"prediction", "predicted outputs"},
    {"reasoning_effort", "reasoning effort"},
    {"verbosity", "verbosity"},
    {"web_search_options", "web search"},
    {"functions", "the deprecated functions API (tools replaces it)"},
    {"function_call", "the deprecated functions API (tool_choice replaces it)"},
};

static bool known_fields_only(const cJSON *root, bool chat, og_api_error *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        bool known = false;
        for (size_t i = 0; i < sizeof known_fields / sizeof *known_fields && !known; i++)
            known = !strcmp(f->string, known_fields[i].name) && (known_fields[i].in & (chat ? IN_CHAT : IN_COMPLETIONS));
        if (known) continue;
        char name[48];
        snprintf(name, sizeof name, "%s", f->string);
        for (size_t i = 0; i < sizeof refused_fields / sizeof *refused_fields; i++)
            if (!strcmp(f->string, refused_fields[i].name))
                return BAD(e, name, "'%s' is not supported: offgraph does not implement %s", name, refused_fields[i].what);
        return BAD(e, name, "'%s' is not a parameter of %s that offgraph knows", name,
                   chat ? "/v1/chat/completions" : "/v1/completions");
    }
    return true;
}

/* A field accepted for the values that change nothing here: any string
 * (allowed NULL), or one of the strings of allowed (NULL-terminated). */
static bool inert_string(const cJSON *root, const char *name, const char *const *allowed, og_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return true;
    if (!cJSON_IsString(f)) return BAD(e, name, "'%s' must be a string", name);
    if (!allowed) return true;
    for (int i = 0; allowed[i]; i++)
        if (!strcmp(f->valuestring, allowed[i])) return true;
    return BAD(e, name, "'%s' \"%.64s\" is not supported (only \"%s\")", name, f->valuestring, allowed[0]);
}

/* user, metadata, store, modalities, service_tier, ... : accepted where they
 * change nothing in the answer, a 400 naming them where they would. */
static bool inert_fields(const cJSON *root, bool chat, og_api_error *e) {
    static const char *const tiers[] = {"auto", "default", NULL};
    if (!inert_string(root, "user", NULL, e) || !inert_string(root, "service_tier", tiers, e)) return false;
    if (!chat) return true;
    if (!inert_string(root, "safety_identifier", NULL, e) || !inert_string(root, "prompt_cache_key", NULL, e))
        return false;
    const cJSON *f = field(root, "metadata");
    if (f && !cJSON_IsObject(f)) return BAD(e, "metadata", "'metadata' must be an object");
    f = field(root, "store");
    if (f && !cJSON_IsBool(f)) return BAD(e, "store", "'store' must be a boolean");
    if (f && cJSON_IsTrue(f)) return BAD(e, "store", "'store': true is not supported (offgraph stores no completions)");
    f = field(root, "modalities");
    if (f) {
        const cJSON *m = cJSON_IsArray(f) && cJSON_GetArraySize(f) == 1 ? cJSON_GetArrayItem(f, 0) : NULL;
        if (!cJSON_IsString(m) || strcmp(m->valuestring, "text"))
            return BAD(e, "modalities", "'modalities' is not supported beyond [\"text\"]");
    }
    return true;
}

bool og_api_parse(const og_serve_ctx *c, const char *body, size_t len, bool chat, og_api_request *q,
                  og_api_error *e) {
    memset(q, 0, sizeof *q);
    memset(e, 0, sizeof *e);
    q->logprobs = -1;
    q->sampling = og_sampler_default_params();
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return BAD(e, NULL, "the body is not valid JSON (near byte %ld)",
                          cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - body) : 0L);
    bool ok = false;
    if (!cJSON_IsObject(root)) {
        BAD(e, NULL, "the body must be a JSON object");
        goto done;
    }
    if (!known_fields_only(root, chat, e) || !inert_fields(root, chat, e)) goto done;
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) {
        BAD(e, "model", "'model' must be a string");
        goto done;
    }
    if (model && strcmp(model->valuestring, c->model_id)) {
        fail(e, 404, "invalid_request_error", "model_not_found", "model",
             "The model '%s' does not exist; this server serves '%s'", model->valuestring, c->model_id);
        goto done;
    }
    double v;
    v = 1;
    if (!number(root, "n", 1, OG_API_MAX_N, true, &v, e)) goto done;
    q->n = (int32_t)v;
    v = q->n;
    if (!chat && !number(root, "best_of", 1, OG_API_MAX_N, true, &v, e)) goto done;
    if (v != q->n) {
        BAD(e, "best_of", "'best_of' other than n is not supported (offgraph returns every choice it generates)");
        goto done;
    }
    const cJSON *suffix = chat ? NULL : field(root, "suffix");
    if (suffix && (!cJSON_IsString(suffix) || *suffix->valuestring)) {
        BAD(e, "suffix", "'suffix' is not supported (no insertion: the completion follows the prompt)");
        goto done;
    }
    double max_tokens = -1;
    if (!number(root, "max_tokens", 1, 1e12, true, &max_tokens, e)) goto done;
    if (chat && !number(root, "max_completion_tokens", 1, 1e12, true, &max_tokens, e)) goto done;
    v = q->sampling.temperature;
    if (!number(root, "temperature", 0, 2, false, &v, e)) goto done;
    q->sampling.temperature = (float)v;
    v = q->sampling.top_p;
    if (!number(root, "top_p", 0, 1, false, &v, e)) goto done;
    if (v <= 0) {
        BAD(e, "top_p", "'top_p' must be above 0");
        goto done;
    }
    q->sampling.top_p = (float)v;
    v = q->sampling.top_k;
    if (!number(root, "top_k", -1, 1e9, true, &v, e)) goto done;
    q->sampling.top_k = v < 0 ? 0 : (int32_t)v;
    v = q->sampling.min_p;
    if (!number(root, "min_p", 0, 1, false, &v, e)) goto done;
    q->sampling.min_p = (float)v;
    v = -1;
    if (!number(root, "seed", -9.2e18, 9.2e18, true, &v, e)) goto done;
    q->has_seed = field(root, "seed") != NULL;
    if (q->has_seed) q->sampling.seed = (uint64_t)(int64_t)v;
    v = 0;
    if (!number(root, "presence_penalty", -2, 2, false, &v, e)) goto done;
    q->sampling.presence_penalty = (float)v;
    v = 0;
    if (!number(root, "frequency_penalty", -2, 2, false, &v, e)) goto done;
    q->sampling.frequency_penalty = (float)v;
    if (!logit_bias(c, field(root, "logit_bias"), q, e)) goto done;
    if (!boolean(root, "stream", &q->stream, e)) goto done;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            BAD(e, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (!q->stream) {
            BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto done;
        }
        if (!boolean(so, "include_usage", &q->include_usage, e)) goto done;
        bool obfuscation = false; /* padding against length side channels: none here */
        if (!boolean(so, "include_obfuscation", &obfuscation, e)) goto done;
        for (const cJSON *k = so->child; k; k = k->next)
            if (strcmp(k->string, "include_usage") && strcmp(k->string, "include_obfuscation")) {
                BAD(e, "stream_options", "'stream_options.%.40s' is not an option offgraph knows", k->string);
                goto done;
            }
    }
    if (!boolean(root, "ignore_eos", &q->ignore_eos, e)) goto done;
    bool echo = false;
    if (!chat && !boolean(root, "echo", &echo, e)) goto done;
    if (echo) {
        BAD(e, "echo", "'echo' is not supported");
        goto done;
    }
    const cJSON *stop = field(root, "stop");
    if (stop) {
        const cJSON *one = stop;
        if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) > OG_API_MAX_STOPS) {
            BAD(e, "stop", "'stop' holds at most %d strings", OG_API_MAX_STOPS);
            goto done;
        }
        if (!cJSON_IsString(stop) && !cJSON_IsArray(stop)) {
            BAD(e, "stop", "'stop' must be a string or an array of strings");
            goto done;
        }
        int k = 0;
        for (one = cJSON_IsString(stop) ? stop : stop->child; one; one = cJSON_IsString(stop) ? NULL : one->next, k++) {
            if (!cJSON_IsString(one)) {
                BAD(e, "stop", "'stop' must be a string or an array of strings");
                goto done;
            }
            if (!*one->valuestring) continue;
            if (!(q->stops[q->n_stops] = og_strdup(one->valuestring))) {
                fail(e, 500, "server_error", NULL, NULL, "out of memory");
                goto done;
            }
            q->n_stops++;
        }
    }
    /* logprobs: an integer (completions), or a boolean plus top_logprobs (chat) */
    if (chat) {
        bool lp = false;
        if (!boolean(root, "logprobs", &lp, e)) goto done;
        v = 0;
        if (!number(root, "top_logprobs", 0, OG_API_MAX_TOP_LOGPROBS, true, &v, e)) goto done;
        if (field(root, "top_logprobs") && !lp) {
            BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto done;
        }
        if (lp) q->logprobs = (int32_t)v;
    } else {
        v = -1;
        if (!number(root, "logprobs", 0, OG_API_MAX_TOP_LOGPROBS, true, &v, e)) goto done;
        q->logprobs = (int32_t)v;
    }
    if (!response_format(field(root, "response_format"), q, e)) goto done;
    q->chat = chat;
    if (chat) {
        if (!chat_messages(field(root, "messages"), field(root, "chat_template_kwargs"), q, e)) goto done;
        if (!og_api_tools(c, root, q, e)) goto done;
    } else if (!completion_prompt(c, field(root, "prompt"), q, e)) {
        goto done;
    }
    /* absent: 16 tokens for a completion (OpenAI's default), to the end of
       the context (the engine's 0) for a chat */
    if (!chat && (int64_t)q->n * q->n_prompts > OG_API_MAX_N) {
        BAD(e, "n", "n (%d) times the %d prompts is more than %d choices", (int)q->n, (int)q->n_prompts, OG_API_MAX_N);
        goto done;
    }
    q->max_tokens_given = max_tokens >= 0;
    q->max_tokens = max_tokens >= 0 ? (int64_t)max_tokens : chat ? 0 : 16;
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) og_api_request_free(q);
    return ok;
}
