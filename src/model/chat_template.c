/* Chat formats (see chat_template.h). */
#include "model/chat_template.h"

#include "core/core.h"

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

og_status og_chat_render_turn(og_chat_format f, int first_turn, const char *user, char **out) {
    if (!user || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_chat_render_turn: NULL argument");
    /* printf formats: the close of the previous reply (later turns), or the
     * start of the conversation (first turn); then the turn around %s */
    const char *open = "", *turn = "%s\n";
    switch (f) {
    case OG_CHAT_CHATML:
        open = first_turn ? "" : "<|im_end|>\n";
        turn = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n";
        break;
    case OG_CHAT_LLAMA3:
        open = first_turn ? "<|begin_of_text|>" : "<|eot_id|>";
        turn = "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
    case OG_CHAT_MISTRAL:
        open = first_turn ? "<s>" : "</s>";
        turn = "[INST] %s [/INST]";
        break;
    case OG_CHAT_PLAIN:
        open = first_turn ? "" : "\n";
        break;
    }
    size_t n = strlen(open) + strlen(turn) + strlen(user) + 1;
    char *s = og_malloc(n);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "chat: out of memory");
    size_t k = (size_t)snprintf(s, n, "%s", open);
    snprintf(s + k, n - k, turn, user);
    *out = s;
    return OG_OK;
}
