/* Constrained generation: a grammar the output must follow, and a matcher
 * that says, at each step, which tokens of the vocabulary may come next.
 *
 * Grammars are written in GBNF (the format llama.cpp reads):
 *
 *   root   ::= "{" ws pair ("," ws pair)* "}"     # rules: name ::= alternatives
 *   pair   ::= key ws ":" ws [0-9]+ ws            # sequences, rule references
 *   key    ::= "\"" [a-z_]{1,16} "\""             # literals, classes, {m,n}
 *   ws     ::= [ \t\n]*                           # * + ? ( | ) . and # comments
 *
 * Literals take the escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH
 * \UHHHHHHHH (code points, written as UTF-8); classes [a-z] and [^...] are
 * sets of code points. A rule's sequence ends at the end of its line unless
 * it is inside parentheses or the line ends with `|` or `::=`. The start
 * rule is "root". Refused, with the line and column and what was expected:
 * syntax errors, a rule defined twice, a reference to a rule never
 * defined, left recursion (a rule that can start with itself, directly or
 * through rules that can match nothing), and past the limits below.
 *
 * The matcher works on bytes: every class becomes the UTF-8 byte sequences
 * of its code points, so a token that ends inside a character (byte-level
 * BPE) is judged by its bytes like any other. Its state is the set of
 * pushdown stacks still alive (shared, interned nodes); each state, its
 * transitions on each byte and its token mask are computed once and cached
 * in the matcher, and a mask is a walk of the vocabulary's byte trie that
 * skips every subtree the state cannot enter. */
#ifndef OG_TEXT_GRAMMAR_H
#define OG_TEXT_GRAMMAR_H

#include "offgraph.h"
#include "text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OG_GRAMMAR_MAX_TEXT (1 << 20)     /* bytes of grammar text             */
#define OG_GRAMMAR_MAX_DEPTH 64           /* nested parentheses                */
#define OG_GRAMMAR_MAX_ELEMENTS (1 << 20) /* elements after expansion          */
#define OG_GRAMMAR_MAX_REPEAT 1000        /* m and n of {m,n}                  */

/* A compiled grammar: immutable, may be shared by matchers on any threads. */
typedef struct og_grammar og_grammar;

/* Parses GBNF text (len bytes; it need not be NUL-terminated). On success
 * *out is owned by the caller: og_grammar_destroy. On failure og_last_error()
 * says "grammar: line L, column C: ..." (OG_ERR_FORMAT), or names the limit
 * (OG_ERR_UNSUPPORTED). */
og_status og_grammar_parse(const char *text, size_t len, og_grammar **out);
/* NULL is a no-op. */
void og_grammar_destroy(og_grammar *g);
/* Number of rules (user rules and those made for groups, classes and
 * repetitions) and of elements, for tests and limits. */
int32_t og_grammar_rule_count(const og_grammar *g);
int32_t og_grammar_element_count(const og_grammar *g);

/* JSON schema -> GBNF text (json_schema.c). The subset: type (one or a
 * list), properties, required, additionalProperties (false, true, or a
 * schema when there are no properties), enum, const, items, minItems,
 * maxItems, minLength, maxLength, anyOf, oneOf (branches of distinct
 * types), $ref to "#/$defs/..." or "#/definitions/...", format "uuid";
 * annotations (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly) are ignored; every other
 * keyword and string format is refused naming it and where it is
 * (OG_ERR_UNSUPPORTED). Properties come in the order the schema declares
 * them; an object without additionalProperties gets only its declared
 * properties (a subset of what validates). Whitespace between tokens is
 * nothing, a space, or a newline and at most 20 spaces or tabs, and numbers
 * have at most 16 digits a part, so that output stays finite.
 * *gbnf is owned by the caller: og_free. */
og_status og_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf);
/* The grammar of any JSON value (object_only false) or any JSON object
 * (the json_object mode of OpenAI's response_format), as GBNF text owned by
 * the caller (og_free); NULL when out of memory. */
char *og_json_any_gbnf(bool object_only);
/* The schema's grammar, parsed (og_grammar_destroy). */
og_status og_grammar_from_json_schema(const char *schema, size_t len, og_grammar **out);

/* The vocabulary as the matcher sees it: each token's bytes (the text it
 * adds in the middle of an output), a byte trie over them, and the ids that
 * end the output. Immutable once built; one per tokenizer can serve every
 * matcher. */
typedef struct og_grammar_vocab og_grammar_vocab;

/* From a tokenizer, for logits rows of width n_vocab (the model's, which
 * may exceed the tokenizer's: ids past it are never allowed). Special added
 * tokens are never allowed except the end ids: og_tokenizer_stop_ids (what ends a generation) and
 * extra_eos[0..n_extra_eos); without any end id it is refused
 * (OG_ERR_UNSUPPORTED). Owned by the caller: og_grammar_vocab_destroy. */
og_status og_grammar_vocab_create(const og_tokenizer *tok, int64_t n_vocab, const int32_t *extra_eos,
                                  int32_t n_extra_eos, og_grammar_vocab **out);
/* From explicit byte strings (tests, other tokenizers): token i is
 * bytes[i][0..lens[i]), never allowed when lens[i] == 0. */
og_status og_grammar_vocab_create_bytes(const char *const *bytes, const size_t *lens, int64_t n_vocab,
                                        const int32_t *eos, int32_t n_eos, og_grammar_vocab **out);
void og_grammar_vocab_destroy(og_grammar_vocab *v);
int64_t og_grammar_vocab_size(const og_grammar_vocab *v);
/* Token id's bytes (borrowed) and their count; NULL/0 for ids never allowed. */
const char *og_grammar_vocab_token(const og_grammar_vocab *v, int32_t id, size_t *len);

/* One generation's position in a grammar. Borrows g and v, which must
 * outlive it. Calls on one matcher from one thread at a time. */
typedef struct og_matcher og_matcher;

/* Owned by the caller: og_matcher_destroy. */
og_status og_matcher_create(const og_grammar *g, const og_grammar_vocab *v, og_matcher **out);
void og_matcher_destroy(og_matcher *m);
/* Back to the start of the grammar (caches are kept). */
void og_matcher_reset(og_matcher *m);
/* Feeds bytes. When the grammar cannot take them, OG_ERR_INVALID_ARGUMENT
 * and the state stays where it was. */
og_status og_matcher_accept_bytes(og_matcher *m, const char *s, size_t n);
/* Feeds a token: its bytes, or an end id (allowed only where the grammar
 * can end; the matcher is then finished and takes nothing more). */
og_status og_matcher_accept_token(og_matcher *m, int32_t id);
/* Whether what was fed is a complete match of root. */
bool og_matcher_can_end(const og_matcher *m);
/* Whether an end id was accepted. */
bool og_matcher_finished(const og_matcher *m);
/* The allowed tokens of the current state: a bitmap (bit i % 32 of word
 * i / 32, ceil(n_vocab / 32) words), borrowed from m until its next call;
 * NULL on failure (og_last_error says why: out of memory, a grammar too
 * ambiguous). End ids are set exactly when og_matcher_can_end. */
const uint32_t *og_matcher_mask(og_matcher *m);
/* Sets logits[i] = -INFINITY for every token the mask does not allow. */
og_status og_matcher_apply(og_matcher *m, float *logits, int64_t n_vocab);
/* Counts, for tests and benchmarks: states and masks computed so far. */
void og_matcher_stats(const og_matcher *m, int64_t *states, int64_t *masks, int64_t *nodes);

/* The engine's constraint hook (og_constraint_fn in offgraph.h), with ctx
 * an og_matcher: feeds the tokens of generated[] it has not seen yet (it
 * starts over when n is smaller than what it has seen), then masks logits.
 * If a generated token was not allowed (a caller that sampled around the
 * mask) or the mask cannot be computed, only the end ids stay allowed and
 * og_matcher_error() says what happened. */
void og_grammar_constraint(void *ctx, const int32_t *generated, int64_t n, float *logits, int64_t vocab);
/* The width of the logits rows m masks (its vocabulary's n_vocab); 0 for
 * NULL. */
int64_t og_matcher_width(const og_matcher *m);
/* The same hook as a mask (og_batch_item.allowed), for a step that applies
 * it itself (on the device): feeds generated[] as og_grammar_constraint
 * does, then returns the allowed tokens (og_matcher_mask's bitmap, borrowed
 * from the matcher until its next call); where og_grammar_constraint would
 * leave only the end ids, their bitmap. NULL (nothing fed) when ctx is NULL
 * or vocab is not the matcher's vocabulary width: the caller then masks
 * the logits with og_grammar_constraint. The tokens either call lets
 * through are the same. */
const uint32_t *og_grammar_constraint_mask(void *ctx, const int32_t *generated, int64_t n, int64_t vocab);
/* The adapter's failure, or NULL. Borrowed. */
const char *og_matcher_error(const og_matcher *m);

#endif /* OG_TEXT_GRAMMAR_H */
