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
 * call (any other reply is text; a reply whose object is not written name
 * first is held until it ends, and text after a call is content). A call
 * written name first streams: its arguments are given out as they arrive,
 * checked as JSON byte by byte (og_tool_parser_take_pieces). Templates
 * that read tools and write calls another way are OG_TOOL_FORMAT_OTHER:
 * their calls are not parsed (a server refuses tools for them). */
#ifndef OG_TEXT_TOOL_CALLS_H
#define OG_TEXT_TOOL_CALLS_H

#include "offgraph.h"
#include "text/grammar.h"

#include <stdbool.h>
#include <stddef.h>

/* og_tool_format, og_tool_call and the parser (og_tool_parser_*) are
 * public: include/offgraph.h, section "tool calls". */

/* The format of a chat template's text (NULL: NONE). */
og_tool_format og_tool_format_detect(const char *template_text);

/* og_tool_calls_grammar_text's grammar, parsed. *out: og_grammar_destroy. */
og_status og_tool_calls_grammar(og_tool_format f, const char *tools_json, const char *only_name, bool parallel,
                                og_grammar **out);

#endif /* OG_TEXT_TOOL_CALLS_H */
