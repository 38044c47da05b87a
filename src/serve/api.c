/* The OpenAI request bodies: fields, their types and bounds, the prompt
 * (text, token ids, or chat messages through the model's chat format). */
#include "serve/api.h"

#include "core/core.h"
#include "text/chat_template.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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

/* A text prompt's ids. A completion's prompt gets the special tokens the
 * tokenizer's rule adds (og_tokenize's ADD_SPECIAL, as `offgraph run`); a
 * rendered chat gets none (the template writes its own BOS), as
 * transformers' apply_chat_template(tokenize=True). Special tokens written
 * in the text are parsed in both. */
static bool encode(const og_serve_ctx *c, const char *text, bool add_special, og_api_request *q, og_api_error *e,
                   const char *param) {
    int32_t *ids = NULL;
    int64_t n = 0;
    unsigned flags = OG_TOKENIZE_PARSE_SPECIAL | (add_special ? OG_TOKENIZE_ADD_SPECIAL : 0u);
    if (og_tokenize(c->tok, text, strlen(text), flags, &ids, &n) != OG_OK)
        return fail(e, 500, "server_error", NULL, param, "cannot tokenize the prompt: %s", og_last_error());
    q->prompt = ids;
    q->n_prompt = n;
    return true;
}

/* Appends text to a growable string; false without memory. */
static bool cat(char **s, size_t *n, size_t *cap, const char *t) {
    size_t k = strlen(t);
    if (*n + k + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *n + k + 1) nc *= 2;
        char *b = og_realloc(*s, nc);
        if (!b) return false;
        *s = b;
        *cap = nc;
    }
    memcpy(*s + *n, t, k + 1);
    *n += k;
    return true;
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts joined. *out owned by the caller (og_free). */
static bool content_text(const cJSON *msg, int i, char **out, og_api_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *c = field(msg, "content");
    *out = NULL;
    size_t n = 0, cap = 0;
    if (!c) return cat(out, &n, &cap, "") || fail(e, 500, "server_error", NULL, param, "out of memory");
    if (cJSON_IsString(c)) return cat(out, &n, &cap, c->valuestring) || fail(e, 500, "server_error", NULL, param, "out of memory");
    if (!cJSON_IsArray(c)) return BAD(e, param, "'%s' must be a string or an array of text parts", param);
    if (!cat(out, &n, &cap, "")) return fail(e, 500, "server_error", NULL, param, "out of memory");
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            og_free(*out);
            *out = NULL;
            return BAD(e, param, "each part of '%s' must be an object with a 'type'", param);
        }
        if (strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            og_free(*out);
            *out = NULL;
            return BAD(e, param, "'%s': only text parts are supported (this part is '%s')", param, type->valuestring);
        }
        if (!cat(out, &n, &cap, text->valuestring)) return fail(e, 500, "server_error", NULL, param, "out of memory");
    }
    return true;
}

/* The whole conversation rendered with the model's chat template (plain
 * text without one), ending with what opens the assistant's reply. Developer
 * messages are system messages. chat_template_kwargs, when given, holds
 * boolean variables of the template (e.g. {"enable_thinking": false}). A
 * template's own refusal (raise_exception) is a 400 with its message. */
static bool render_chat(const og_serve_ctx *c, const cJSON *messages, const cJSON *kwargs, char **out,
                        og_api_error *e) {
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) < 1)
        return BAD(e, "messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(messages);
    og_chat_flag flags[16];
    size_t n_flags = 0;
    if (kwargs) {
        if (!cJSON_IsObject(kwargs)) return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const cJSON *k;
        cJSON_ArrayForEach(k, kwargs) {
            if (!cJSON_IsBool(k))
                return BAD(e, "chat_template_kwargs", "'chat_template_kwargs': only boolean values are supported "
                           "('%s' is not one)", k->string);
            if (n_flags == sizeof flags / sizeof *flags)
                return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' has more than %zu entries",
                           sizeof flags / sizeof *flags);
            flags[n_flags++] = (og_chat_flag){k->string, cJSON_IsTrue(k)};
        }
    }
    og_chat_message *msgs = og_calloc((size_t)n, sizeof *msgs);
    char **texts = og_calloc((size_t)n, sizeof *texts);
    bool ok = msgs && texts, any_user = false;
    if (!ok) fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!ok) break;
        char param[64];
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            ok = BAD(e, param, "each message must be an object with a string 'role'");
            break;
        }
        if (!(ok = content_text(m, i, &texts[i], e))) break;
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            ok = BAD(e, param, "'%s' is not a role this server knows (system, developer, user, assistant)", r);
            break;
        }
        any_user |= !strcmp(r, "user");
        msgs[i] = (og_chat_message){r, texts[i]};
        i++;
    }
    if (ok && !any_user) ok = BAD(e, "messages", "'messages' has no user message");
    og_chat_template *own = NULL;
    const og_chat_template *t = c->chat;
    if (ok && !t && og_chat_template_create(og_tokenizer_chat_template(c->tok), OG_CHAT_PLAIN, &own) != OG_OK)
        ok = fail(e, 500, "server_error", NULL, NULL, "the model's %s", og_last_error());
    if (!t) t = own;
    if (ok) {
        int32_t bos = og_tokenizer_bos_id(c->tok);
        const int32_t *eos;
        og_chat_request req = {
            .messages = msgs, .n_messages = (size_t)i, .add_generation_prompt = true,
            .bos_token = bos >= 0 ? og_tokenizer_token_text(c->tok, bos) : NULL,
            .eos_token = og_tokenizer_eos_ids(c->tok, &eos) > 0 ? og_tokenizer_token_text(c->tok, eos[0]) : NULL,
            .flags = flags, .n_flags = n_flags};
        og_status st = og_chat_template_render(t, &req, out);
        if (st == OG_ERR_OUT_OF_MEMORY) ok = fail(e, 500, "server_error", NULL, NULL, "out of memory");
        else if (st != OG_OK) ok = BAD(e, "messages", "%s", og_last_error());
    }
    og_chat_template_destroy(own);
    for (int k = 0; texts && k < n; k++) og_free(texts[k]);
    og_free(texts);
    og_free(msgs);
    return ok;
}

/* The prompt of /v1/completions: a string, one string in an array, token
 * ids, or one array of token ids in an array. */
static bool completion_prompt(const og_serve_ctx *c, const cJSON *p, og_api_request *q, og_api_error *e) {
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) return encode(c, p->valuestring, true, q, e, "prompt");
    if (!cJSON_IsArray(p))
        return BAD(e, "prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
    if (cJSON_GetArraySize(p) == 0) return BAD(e, "prompt", "'prompt' is empty");
    int n = cJSON_GetArraySize(p);
    if (!(q->prompt = og_calloc((size_t)n, sizeof *q->prompt))) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= (double)c->vocab)
            return BAD(e, "prompt", "'prompt' (an array) must hold one string or token ids in [0, %lld); element %d is not",
                       (long long)c->vocab, i);
        q->prompt[i++] = (int32_t)t->valuedouble;
    }
    q->n_prompt = n;
    return true;
}

void og_api_request_free(og_api_request *q) {
    og_free(q->prompt);
    for (int32_t i = 0; i < q->n_stops; i++) og_free(q->stops[i]);
    memset(q, 0, sizeof *q);
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
    if (!number(root, "n", 1, 1, true, &v, e)) {
        if (field(root, "n") && cJSON_IsNumber(field(root, "n"))) BAD(e, "n", "only n = 1 is supported");
        goto done;
    }
    double max_tokens = -1;
    if (!number(root, "max_tokens", 0, 1e12, true, &max_tokens, e)) goto done;
    if (chat && !number(root, "max_completion_tokens", 0, 1e12, true, &max_tokens, e)) goto done;
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
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "frequency_penalty" : "presence_penalty";
        v = 0;
        if (!number(root, name, -2, 2, false, &v, e)) goto done;
        if (v != 0) {
            BAD(e, name, "'%s' is not supported (only 0)", name);
            goto done;
        }
    }
    if (!boolean(root, "stream", &q->stream, e)) goto done;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            BAD(e, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (!boolean(so, "include_usage", &q->include_usage, e)) goto done;
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
    if (chat) {
        char *text = NULL;
        if (!render_chat(c, field(root, "messages"), field(root, "chat_template_kwargs"), &text, e)) goto done;
        bool enc = encode(c, text, false, q, e, "messages");
        og_free(text);
        if (!enc) goto done;
    } else if (!completion_prompt(c, field(root, "prompt"), q, e)) {
        goto done;
    }
    const char *pname = chat ? "messages" : "prompt";
    if (q->n_prompt == 0) {
        BAD(e, pname, "the prompt is empty (it gives no tokens)");
        goto done;
    }
    if (q->n_prompt > c->ctx) {
        fail(e, 400, "invalid_request_error", "context_length_exceeded", pname,
             "This model's maximum context length is %lld tokens; the prompt has %lld tokens",
             (long long)c->ctx, (long long)q->n_prompt);
        goto done;
    }
    /* a prompt of n tokens leaves room for ctx - n + 1 more (the last one drawn is never fed) */
    const int64_t room = c->ctx - q->n_prompt + 1;
    q->max_tokens_given = max_tokens >= 0;
    q->max_tokens = max_tokens >= 0 ? (int64_t)max_tokens : chat ? room : (room < 16 ? room : 16);
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) {
        og_free(q->prompt);
        for (int32_t i = 0; i < q->n_stops; i++) og_free(q->stops[i]);
        q->prompt = NULL;
        q->n_stops = 0;
    }
    return ok;
}
