/* Chat formats: the families whose chat template offgraph recognises, and
 * the text of each turn. A conversation is rendered one user turn at a
 * time, so that a session prefills only the new turn: the earlier turns and
 * replies are already in its KV cache. */
#ifndef OG_MODEL_CHAT_TEMPLATE_H
#define OG_MODEL_CHAT_TEMPLATE_H

#include "offgraph.h"

typedef enum og_chat_format {
    OG_CHAT_PLAIN = 0, /* no template recognised: the text as it is, one turn a line */
    OG_CHAT_CHATML,    /* <|im_start|>role\n ... <|im_end|> (Qwen and others)     */
    OG_CHAT_LLAMA3,    /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    OG_CHAT_MISTRAL    /* <s>[INST] ... [/INST] reply</s>                         */
} og_chat_format;

/* Recognises the family from a chat template's text (a Jinja template as
 * found in tokenizer_config.json or chat_template.jinja); NULL or an
 * unknown template gives OG_CHAT_PLAIN. */
og_chat_format og_chat_format_detect(const char *template_text);
/* "plain", "chatml", "llama3", "mistral". */
const char *og_chat_format_name(og_chat_format f);

/* The text of one user turn: for a turn after the first, what closes the
 * assistant's previous reply; then the user's message and what opens the
 * assistant's reply. *out is owned by the caller: og_free. */
og_status og_chat_render_turn(og_chat_format f, int first_turn, const char *user, char **out);

/* The text of the token that ends an assistant reply ("<|im_end|>",
 * "<|eot_id|>", "</s>"), or NULL for plain text. */
const char *og_chat_end_of_turn(og_chat_format f);

#endif /* OG_MODEL_CHAT_TEMPLATE_H */
