/* Tool calls in a model's output: which format a chat template teaches its
 * model to write calls in, a parser that takes the calls out of the output
 * (whole, or as it streams), and the grammar of an output that is only
 * calls (OpenAI's tool_choice "required" or a named function).
 *
 * Formats: what a template writes for an assistant message's tool_calls is
 * what its model was trained to write, so the template's text names the
 * format. Parsed here: Hermes' (Qwen 2.5, Qwen 3, Hermes and others)
 *
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 *
 * one block a call, any number of them, text around them being the reply's
 * content; Mistral's (Mistral Nemo and others)
 *
 *   [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
 *
 * a JSON array of calls after the marker (text before it is content); and
 * Llama 3.1's, where a reply that is one JSON object with a "name" and its
 * "parameters" (or "arguments"), after an optional <|python_tag|>, is a
 * call (any other reply is text; the reply is held until it ends when it
 * starts with "{"). Templates that read tools and write calls another way
 * are OG_TOOL_FORMAT_OTHER: their calls are not parsed (a server refuses
 * tools for them). */
#ifndef OG_TEXT_TOOL_CALLS_H
#define OG_TEXT_TOOL_CALLS_H

#include "offgraph.h"
#include "text/grammar.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum og_tool_format {
    OG_TOOL_FORMAT_NONE = 0, /* the template does not read tools              */
    OG_TOOL_FORMAT_HERMES,   /* <tool_call>{"name", "arguments"}</tool_call> */
    OG_TOOL_FORMAT_OTHER,    /* reads tools; its calls are not parsed here    */
    OG_TOOL_FORMAT_MISTRAL,  /* [TOOL_CALLS][{"name", "arguments"}, ...]      */
    OG_TOOL_FORMAT_LLAMA3    /* the whole reply {"name", "parameters"}, maybe
                                after <|python_tag|> (Llama 3.1)            */
} og_tool_format;

/* The format of a chat template's text (NULL: NONE). */
og_tool_format og_tool_format_detect(const char *template_text);
/* "none", "hermes", "other", "mistral", "llama3". */
const char *og_tool_format_name(og_tool_format f);

/* One call: the function's name and its arguments as JSON text (the
 * model's own bytes of the arguments object; "{}" when it gave none). */
typedef struct og_tool_call {
    char *name;
    char *arguments;
} og_tool_call;

/* Takes calls out of an output fed to it piece by piece (any split, even
 * inside a marker or a character). Content is the text outside the calls:
 * when the output holds no call it is the output byte for byte; around
 * calls, the whitespace between content and a call is dropped. A block
 * whose body is not a call (not a JSON object with a string "name", or for
 * Mistral an array of them) stays in the content as the model wrote it; an unclosed block at the end is a
 * call when its body is one. Content is given out as soon as it cannot be
 * the start of a call (a possible marker's first bytes, and whitespace that
 * may precede a call, wait). */
typedef struct og_tool_parser og_tool_parser;

/* For format f (HERMES, MISTRAL, LLAMA3; any other gives a parser that
 * passes the text through as content). Owned by the caller: og_tool_parser_destroy. */
og_status og_tool_parser_create(og_tool_format f, og_tool_parser **out);
void og_tool_parser_destroy(og_tool_parser *p);
/* Feeds n bytes of output. OG_ERR_OUT_OF_MEMORY only. */
og_status og_tool_parser_feed(og_tool_parser *p, const char *text, size_t n);
/* The output ended: what was held back is decided. */
og_status og_tool_parser_finish(og_tool_parser *p);
/* What is ready since the previous take: content (*content NUL-terminated,
 * *n_content bytes) and the calls completed (*calls[0..*n_calls)). Both are
 * borrowed from p until its next call. */
void og_tool_parser_take(og_tool_parser *p, const char **content, size_t *n_content, const og_tool_call **calls,
                         int *n_calls);
/* Calls completed since the parser was created. */
int og_tool_parser_total_calls(const og_tool_parser *p);

/* The grammar of an output that is only tool calls, in format f (HERMES,
 * MISTRAL, LLAMA3; spaced as the templates write calls): one call (one or
 * more when parallel, except LLAMA3), of the function named only_name
 * when it is not NULL, else of any function of tools_json (OpenAI's tools:
 * a JSON array of {"type": "function", "function": {"name", "parameters"}}),
 * its arguments following the function's parameters schema (an object of
 * any members when it has none). A schema the compiler refuses gives its
 * error (OG_ERR_UNSUPPORTED naming the keyword); an unknown only_name or
 * another format, OG_ERR_INVALID_ARGUMENT. *out: og_grammar_destroy. */
og_status og_tool_calls_grammar(og_tool_format f, const char *tools_json, const char *only_name, bool parallel,
                                og_grammar **out);

#endif /* OG_TEXT_TOOL_CALLS_H */
