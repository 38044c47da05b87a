/* The tool fields of a chat completions body (api.h): tools, tool_choice,
 * parallel_tool_calls, and the messages that carry calls (an assistant's
 * tool_calls) or their results (role "tool"), turned into what the model's
 * chat template reads: transformers' form, each call's arguments an object
 * (OpenAI sends a JSON string; templates read a mapping). */
#include "serve/api.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool bad(og_api_error *e, const char *param, const char *fmt, ...) OG_PRINTF(3, 4);
static bool bad(og_api_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

static bool oom(og_api_error *e) {
    e->status = 500;
    e->type = "server_error";
    e->code = NULL;
    e->param[0] = 0;
    snprintf(e->message, sizeof e->message, "out of memory");
    return false;
}

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* OpenAI's rule for a function's name. */
static bool good_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

bool og_api_tool_message(const cJSON *m, int i, const char *role, const char *content, cJSON *out, bool *tooly,
                         og_api_error *e) {
    char param[96];
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(out, o)) {
        cJSON_Delete(o);
        return oom(e);
    }
    if (!cJSON_AddStringToObject(o, "role", role) || !cJSON_AddStringToObject(o, "content", content)) return oom(e);
    if (!strcmp(role, "tool")) {
        *tooly = true;
        const cJSON *id = field(m, "tool_call_id");
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        if (!cJSON_IsString(id)) return bad(e, param, "a 'tool' message needs a string 'tool_call_id'");
        if (!cJSON_AddStringToObject(o, "tool_call_id", id->valuestring)) return oom(e);
        const cJSON *name = field(m, "name");
        if (cJSON_IsString(name) && !cJSON_AddStringToObject(o, "name", name->valuestring)) return oom(e);
        return true;
    }
    const cJSON *calls = field(m, "tool_calls");
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!calls) return true;
    if (strcmp(role, "assistant")) return bad(e, param, "only an assistant message has 'tool_calls'");
    if (!cJSON_IsArray(calls)) return bad(e, param, "'%s' must be an array", param);
    if (cJSON_GetArraySize(calls) == 0) return true; /* as if absent */
    *tooly = true;
    cJSON *list = cJSON_AddArrayToObject(o, "tool_calls");
    if (!list) return oom(e);
    int k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k++);
        const cJSON *id = field(call, "id"), *type = field(call, "type"), *fn = field(call, "function");
        const cJSON *name = fn ? field(fn, "name") : NULL, *args = fn ? field(fn, "arguments") : NULL;
        if (!cJSON_IsObject(call) || !cJSON_IsObject(fn) || !cJSON_IsString(name))
            return bad(e, param, "'%s' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                       param);
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
            return bad(e, param, "'%s.type' must be \"function\"", param);
        if (id && !cJSON_IsString(id)) return bad(e, param, "'%s.id' must be a string", param);
        cJSON *a = NULL;
        if (!args) a = cJSON_CreateObject();
        else if (cJSON_IsString(args)) a = cJSON_Parse(args->valuestring);
        else if (cJSON_IsObject(args)) a = cJSON_Duplicate(args, true);
        if (!cJSON_IsObject(a)) {
            cJSON_Delete(a);
            return bad(e, param, "'%s.function.arguments' must be a JSON object (as a string)", param);
        }
        cJSON *c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(list, c)) {
            cJSON_Delete(c);
            cJSON_Delete(a);
            return oom(e);
        }
        if (id && !cJSON_AddStringToObject(c, "id", id->valuestring)) {
            cJSON_Delete(a);
            return oom(e);
        }
        cJSON *f = NULL;
        if (!cJSON_AddStringToObject(c, "type", "function") || !(f = cJSON_AddObjectToObject(c, "function")) ||
            !cJSON_AddStringToObject(f, "name", name->valuestring) || !cJSON_AddItemToObject(f, "arguments", a)) {
            cJSON_Delete(a);
            return oom(e);
        }
    }
    return true;
}

bool og_api_tools(const og_serve_ctx *c, const cJSON *root, og_api_request *q, og_api_error *e) {
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    const cJSON *par = field(root, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par)) return bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const bool parallel = !par || cJSON_IsTrue(par);
    /* tool_choice: none, auto, required, or {"type": "function", "function": {"name"}} */
    const char *mode = tools ? "auto" : "none", *only = NULL;
    if (choice) {
        if (cJSON_IsString(choice)) {
            mode = choice->valuestring;
            if (strcmp(mode, "none") && strcmp(mode, "auto") && strcmp(mode, "required"))
                return bad(e, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                           "\"function\": {\"name\"}}, not '%.64s'", mode);
        } else {
            const cJSON *type = cJSON_IsObject(choice) ? field(choice, "type") : NULL;
            const cJSON *fn = cJSON_IsObject(choice) ? field(choice, "function") : NULL;
            const cJSON *name = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
                return bad(e, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                           "\"function\": {\"name\"}}");
            mode = "named";
            only = name->valuestring;
        }
        if (!tools && strcmp(mode, "none"))
            return bad(e, "tool_choice", "'tool_choice' %s needs 'tools'", only ? "naming a function" : mode);
    }
    if (!tools) return true;
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) < 1)
        return bad(e, "tools", "'tools' must be a non-empty array of {\"type\": \"function\", \"function\": {...}}");
    int k = 0;
    bool found = false;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", k++);
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL, *fn = cJSON_IsObject(t) ? field(t, "function") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn))
            return bad(e, "tools", "'%s' must be {\"type\": \"function\", \"function\": {\"name\", \"description\", "
                       "\"parameters\"}}", param);
        const cJSON *name = field(fn, "name"), *desc = field(fn, "description"), *params = field(fn, "parameters");
        if (!cJSON_IsString(name) || !good_name(name->valuestring))
            return bad(e, "tools", "'%s.function.name' must be 1 to 64 letters, digits, '_' or '-'", param);
        if (desc && !cJSON_IsString(desc)) return bad(e, "tools", "'%s.function.description' must be a string", param);
        if (params && !cJSON_IsObject(params))
            return bad(e, "tools", "'%s.function.parameters' must be a JSON schema (an object)", param);
        found |= only && !strcmp(only, name->valuestring);
    }
    if (only && !found) return bad(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", only);
    if (!strcmp(mode, "none")) return true; /* the tools are not shown: the reply is text */
    if (c->tool_format == OG_TOOL_FORMAT_NONE)
        return bad(e, "tools", "this model's chat template does not take tools");
    if (c->tool_format == OG_TOOL_FORMAT_OTHER)
        return bad(e, "tools", "this model's chat template writes tool calls in a format offgraph does not parse "
                   "(it parses Qwen's and Hermes' <tool_call>, Mistral's [TOOL_CALLS] and Llama 3.1's JSON)");
    if (!(q->tools_json = cJSON_PrintUnformatted(tools))) return oom(e);
    q->tool_format = c->tool_format;
    if (!strcmp(mode, "auto")) return true;
    if (q->grammar)
        return bad(e, "tool_choice", "'tool_choice' %s and 'response_format' cannot both constrain the reply",
                   only ? "naming a function" : mode);
    og_status st = og_tool_calls_grammar(q->tool_format, q->tools_json, only, parallel, &q->grammar);
    if (st == OG_ERR_OUT_OF_MEMORY) return oom(e);
    if (st != OG_OK) return bad(e, "tools", "'tools': %s", og_last_error());
    return true;
}
