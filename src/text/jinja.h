/* A Jinja renderer for chat templates: the subset of Jinja2 that Hugging
 * Face chat templates use, rendered the way transformers renders them
 * (trim_blocks and lstrip_blocks on, loop controls, a tojson filter that is
 * json.dumps with ensure_ascii=False, raise_exception and namespace).
 *
 * A template is parsed once into a tree (og_jinja_parse) and rendered any
 * number of times against variables given as a JSON object (og_jinja_render).
 * Both are bounded: nesting depth at parse, and output bytes, memory and
 * evaluation steps at render, so that any input ends with a result or an
 * error. Errors name the template line and what was wrong; raise_exception
 * gives OG_ERR_INVALID_ARGUMENT with the template's own message. */
#ifndef OG_TEXT_JINJA_H
#define OG_TEXT_JINJA_H

#include "offgraph.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

typedef struct og_jinja og_jinja;

typedef struct og_jinja_limits {
    size_t max_output;   /* bytes of rendered text                  */
    size_t max_memory;   /* bytes of values made while rendering    */
    uint64_t max_steps;  /* expressions and statements evaluated    */
} og_jinja_limits;

/* 16 MiB of output, 256 MiB of values, 50 million steps. */
og_jinja_limits og_jinja_default_limits(void);

/* Parses len bytes of template text. A syntax error gives OG_ERR_FORMAT
 * naming the line. *out is owned by the caller: og_jinja_free. */
og_status og_jinja_parse(const char *src, size_t len, og_jinja **out);
void og_jinja_free(og_jinja *t);

/* Renders t with the members of the JSON object vars as its variables
 * (NULL: none), and the globals raise_exception, namespace, range, dict
 * and strftime_now. limits NULL: og_jinja_default_limits. *out is
 * NUL-terminated, owned by the caller: og_free; *out_len (if non-NULL) is its
 * length. On an error nothing is returned. */
og_status og_jinja_render(const og_jinja *t, const cJSON *vars, const og_jinja_limits *limits, char **out,
                          size_t *out_len);

#endif /* OG_TEXT_JINJA_H */
