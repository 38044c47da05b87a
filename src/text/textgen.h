/* The generation loop's text side, shared by `offgraph run`, `chat` and the
 * server: what a drawn token means for the output. It ends generation at a
 * stop token (not part of the text), at a stop string (the text is cut just
 * before it) or after max_tokens tokens, and gives out the text of the
 * tokens as it becomes final: complete UTF-8 (og_decode_stream) that cannot
 * be the start of a stop string (such a tail is held back until the next
 * token decides it).
 *
 * Stepping the model is the caller's: one og_textgen per generation, pushed
 * every token the model draws, in order. */
#ifndef OG_MODEL_GENERATE_H
#define OG_MODEL_GENERATE_H

#include "text/tokenizer.h"
#include "offgraph.h"

#include <stddef.h>
#include <stdint.h>

/* How a generation ends: the public og_finish_reason, of which the text
 * side uses OG_FINISH_NONE (keep going: feed the token and draw the next),
 * OG_FINISH_STOP (a stop token or a stop string ended it) and
 * OG_FINISH_LENGTH (max_tokens tokens were generated, or the caller ended it
 * at the model's context, og_textgen_end). */
typedef og_finish_reason og_finish;

/* "stop", "length" (OpenAI's finish_reason), or NULL for OG_FINISH_NONE. */
const char *og_finish_name(og_finish f);

typedef struct og_textgen_params {
    int64_t max_tokens;               /* >= 0; 0 ends at the first push  */
    const int32_t *stop_ids;          /* [n_stop_ids], copied            */
    int32_t n_stop_ids;
    const char *const *stop_strings;  /* [n_stop_strings], copied; ""s are ignored */
    int32_t n_stop_strings;
} og_textgen_params;

typedef struct og_textgen og_textgen;

/* Borrows tok, which must outlive the generator. On success *out is owned by
 * the caller: og_textgen_destroy. */
og_status og_textgen_create(const og_tokenizer *tok, const og_textgen_params *p, og_textgen **out);
/* NULL is a no-op. */
void og_textgen_destroy(og_textgen *g);

/* Takes the next drawn token. *text (borrowed from g, valid until its next
 * call) gets the text that is now final, possibly empty; *finish says
 * whether generation ended with this token: then the text given includes
 * everything held back (a stop string itself is never given) and further
 * pushes are refused (OG_ERR_STATE). A stop token counts as no generated
 * token; every other token counts, the one that completes a stop string
 * too. */
og_status og_textgen_push(og_textgen *g, int32_t token, const char **text, size_t *len, og_finish *finish);
/* Ends a generation the caller stops for its own reason (the model's
 * context is full, the client left): gives out what is held back, as
 * og_textgen_push does when it finishes, and records `why`. */
og_status og_textgen_end(og_textgen *g, og_finish why, const char **text, size_t *len);
/* Tokens counted so far (see og_textgen_push). */
int64_t og_textgen_tokens(const og_textgen *g);
/* How it ended; OG_FINISH_NONE while it goes on. */
og_finish og_textgen_finish_reason(const og_textgen *g);

#endif /* OG_MODEL_GENERATE_H */
