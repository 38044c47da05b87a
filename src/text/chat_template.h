/* Chat templates: a conversation rendered to the text a model was trained
 * on. A checkpoint's Jinja chat_template (tokenizer_config.json or
 * chat_template.jinja) is rendered as written, by src/text/jinja.c, with
 * the variables transformers' apply_chat_template gives it (messages,
 * add_generation_prompt, bos_token, eos_token, tools (none unless given),
 * documents as none, and the caller's extra flags such as enable_thinking). A program without a
 * template falls back to one of three formats written here (ChatML, Llama 3,
 * Mistral) or to plain text.
 *
 * A conversation is always rendered whole; a session is fed what the new
 * text adds to what it already holds (see docs/decisions.md). */
#ifndef OG_TEXT_CHAT_TEMPLATE_H
#define OG_TEXT_CHAT_TEMPLATE_H

#include "offgraph.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum og_chat_format {
    OG_CHAT_PLAIN = 0, /* no template recognised: the text as it is, one turn a line */
    OG_CHAT_CHATML,    /* <|im_start|>role\n ... <|im_end|> (Qwen and others)     */
    OG_CHAT_LLAMA3,    /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    OG_CHAT_MISTRAL    /* <s>[INST] ... [/INST] reply</s>                         */
} og_chat_format;

/* Recognises the family from a chat template's text by its markers; NULL or
 * an unknown template gives OG_CHAT_PLAIN. Used for the end-of-turn token. */
og_chat_format og_chat_format_detect(const char *template_text);
/* "plain", "chatml", "llama3", "mistral". */
const char *og_chat_format_name(og_chat_format f);

/* The text of the token that ends an assistant reply ("<|im_end|>",
 * "<|eot_id|>", "</s>"), or NULL for plain text. */
const char *og_chat_end_of_turn(og_chat_format f);

/* The text of the token that ends an assistant turn in a template, by the
 * markers of the families offgraph knows (those of og_chat_end_of_turn, and
 * Gemma's "<end_of_turn>", Phi-3's "<|end|>"); NULL when none is found. */
const char *og_chat_template_end_marker(const char *template_text);

/* og_chat_message (role, content) is the public header's. */

/* An extra boolean variable of the template, e.g. {"enable_thinking", false}. */
typedef struct og_chat_flag {
    const char *name;
    bool value;
} og_chat_flag;

typedef struct og_chat_request {
    const og_chat_message *messages;
    size_t n_messages;
    bool add_generation_prompt; /* end with what opens the assistant's reply */
    const char *bos_token;      /* NULL: not defined (prints as "") */
    const char *eos_token;      /* NULL: not defined */
    const og_chat_flag *flags;
    size_t n_flags;
    const char *messages_json;  /* instead of messages: a JSON array of message
                                   objects, given to the template as they are
                                   (role, content, tool_calls, tool_call_id...) */
    const char *tools_json;     /* the template's tools: a JSON array; NULL: none */
} og_chat_request;

typedef struct og_chat_template og_chat_template;

/* A template from its Jinja text; NULL text gives the fallback format (the
 * family's own layout, or plain text). A template that does not parse is
 * refused (OG_ERR_FORMAT naming the line). *out is owned by the caller:
 * og_chat_template_destroy. */
og_status og_chat_template_create(const char *text, og_chat_format fallback, og_chat_template **out);
void og_chat_template_destroy(og_chat_template *t);
/* Whether t renders a checkpoint's own template (not a fallback). */
bool og_chat_template_is_jinja(const og_chat_template *t);

/* Renders a conversation. messages_json, when given, must be an array of
 * objects each with a string "role"; tools_json an array. An error of the template (raise_exception, e.g.
 * roles that do not alternate) gives OG_ERR_INVALID_ARGUMENT with its
 * message. *out is NUL-terminated, owned by the caller: og_free. */
og_status og_chat_template_render(const og_chat_template *t, const og_chat_request *req, char **out);

#endif /* OG_TEXT_CHAT_TEMPLATE_H */
