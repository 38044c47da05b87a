/* Chat templates (see chat_template.h). */
#include "text/chat_template.h"

#include "core/core.h"
#include "text/jinja.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

og_chat_format og_chat_format_detect(const char *t) {
    if (!t) return OG_CHAT_PLAIN;
    if (strstr(t, "<|im_start|>")) return OG_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return OG_CHAT_LLAMA3;
    if (strstr(t, "[INST]") && strstr(t, "[/INST]")) return OG_CHAT_MISTRAL;
    return OG_CHAT_PLAIN;
}

const char *og_chat_format_name(og_chat_format f) {
    switch (f) {
    case OG_CHAT_CHATML: return "chatml";
    case OG_CHAT_LLAMA3: return "llama3";
    case OG_CHAT_MISTRAL: return "mistral";
    case OG_CHAT_PLAIN: break;
    }
    return "plain";
}

const char *og_chat_end_of_turn(og_chat_format f) {
    switch (f) {
    case OG_CHAT_CHATML: return "<|im_end|>";
    case OG_CHAT_LLAMA3: return "<|eot_id|>";
    case OG_CHAT_MISTRAL: return "</s>";
    case OG_CHAT_PLAIN: break;
    }
    return NULL;
}

const char *og_chat_template_end_marker(const char *t) {
    if (!t) return NULL;
    const char *eot = og_chat_end_of_turn(og_chat_format_detect(t));
    if (eot) return eot;
    if (strstr(t, "<end_of_turn>")) return "<end_of_turn>";
    if (strstr(t, "<|end|>")) return "<|end|>";
    return NULL;
}

/* The fallback formats, as templates of the same language. */
static const char *const fallback_text[] = {
    [OG_CHAT_PLAIN] =
        "{% for m in messages %}"
        "{% if m.role == 'assistant' %}{{ m.content }}"
        "{% else %}{% if not loop.first and messages[loop.index0 - 1].role == 'assistant' %}{{ '\\n' }}{% endif %}"
        "{{ m.content ~ '\\n' }}{% endif %}"
        "{% endfor %}",
    [OG_CHAT_CHATML] =
        "{% for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    [OG_CHAT_LLAMA3] =
        "{{ '<|begin_of_text|>' }}"
        "{% for m in messages %}"
        "{{ '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ m.content ~ '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    /* no system turn: the system prompt goes before the first user message */
    [OG_CHAT_MISTRAL] =
        "{{ '<s>' }}{% set ns = namespace(system='') %}"
        "{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.system = ns.system ~ m.content ~ '\\n\\n' %}"
        "{% elif m.role == 'assistant' %}{{ m.content ~ '</s>' }}"
        "{% else %}{{ '[INST] ' ~ ns.system ~ m.content ~ ' [/INST]' }}{% set ns.system = '' %}{% endif %}"
        "{% endfor %}",
};

struct og_chat_template {
    og_jinja *jinja;
    bool own_text;
};

og_status og_chat_template_create(const char *text, og_chat_format fallback, og_chat_template **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_create: NULL argument");
    *out = NULL;
    if ((unsigned)fallback > OG_CHAT_MISTRAL)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_create: unknown fallback format %d", (int)fallback);
    og_chat_template *t = og_calloc(1, sizeof *t);
    if (!t) return og_set_error(OG_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    t->own_text = text != NULL;
    const char *src = text ? text : fallback_text[fallback];
    og_status st = og_jinja_parse(src, strlen(src), &t->jinja);
    if (st != OG_OK) {
        og_set_error(st, "chat template: %s", og_last_error());
        og_free(t);
        return st;
    }
    *out = t;
    return OG_OK;
}

void og_chat_template_destroy(og_chat_template *t) {
    if (!t) return;
    og_jinja_free(t->jinja);
    og_free(t);
}

bool og_chat_template_is_jinja(const og_chat_template *t) { return t && t->own_text; }

og_status og_chat_template_render(const og_chat_template *t, const og_chat_request *req, char **out) {
    if (!t || !req || !out || (req->n_messages && !req->messages))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_render: NULL argument");
    *out = NULL;
    cJSON *given = NULL, *tools = NULL;
    if (req->messages_json) {
        given = cJSON_Parse(req->messages_json);
        bool fine = cJSON_IsArray(given) && cJSON_GetArraySize(given) > 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, given) fine = fine && cJSON_IsObject(m) &&
                                           cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"));
        if (!fine) {
            cJSON_Delete(given);
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_render: the messages JSON must be a "
                                "non-empty array of objects with a string 'role'");
        }
    }
    if (req->tools_json && !cJSON_IsArray(tools = cJSON_Parse(req->tools_json))) {
        cJSON_Delete(given);
        cJSON_Delete(tools);
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_render: the tools JSON must be an array");
    }
    cJSON *vars = cJSON_CreateObject(), *msgs = NULL;
    if (given) {
        if (!vars || !cJSON_AddItemToObject(vars, "messages", given)) cJSON_Delete(given);
        msgs = cJSON_GetObjectItemCaseSensitive(vars, "messages");
    } else {
        msgs = cJSON_AddArrayToObject(vars, "messages");
    }
    bool ok = vars && msgs;
    for (size_t i = 0; ok && !given && i < req->n_messages; i++) {
        const og_chat_message *m = &req->messages[i];
        if (!m->role || !m->content) {
            cJSON_Delete(vars);
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_render: message %zu has no %s", i,
                                m->role ? "content" : "role");
        }
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(msgs, o) && cJSON_AddStringToObject(o, "role", m->role) &&
             cJSON_AddStringToObject(o, "content", m->content);
    }
    /* as transformers: a token the tokenizer does not have is not defined */
    ok = ok && cJSON_AddBoolToObject(vars, "add_generation_prompt", req->add_generation_prompt) &&
         (!req->bos_token || cJSON_AddStringToObject(vars, "bos_token", req->bos_token)) &&
         (!req->eos_token || cJSON_AddStringToObject(vars, "eos_token", req->eos_token)) &&
         (tools ? cJSON_AddItemToObject(vars, "tools", tools) : cJSON_AddNullToObject(vars, "tools") != NULL) &&
         cJSON_AddNullToObject(vars, "documents");
    if (tools && !cJSON_GetObjectItemCaseSensitive(vars, "tools")) cJSON_Delete(tools); /* not attached */
    for (size_t i = 0; ok && i < req->n_flags; i++) {
        if (!req->flags[i].name) {
            cJSON_Delete(vars);
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_template_render: flag %zu has no name", i);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(vars, req->flags[i].name);
        ok = cJSON_AddBoolToObject(vars, req->flags[i].name, req->flags[i].value) != NULL;
    }
    if (!ok) {
        cJSON_Delete(vars);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    }
    og_status st = og_jinja_render(t->jinja, vars, NULL, out, NULL);
    cJSON_Delete(vars);
    if (st != OG_OK) return og_set_error(st, "chat template: %s", og_last_error());
    return OG_OK;
}
