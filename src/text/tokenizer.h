/* The tokenizer: Hugging Face tokenizer.json files with a BPE, Unigram or
 * WordPiece model.
 *
 * Supported (anything else is refused with a message naming it):
 *   normalizer     NFC, NFKC, NFD, NFKD, Lowercase, Strip, StripAccents,
 *                  BertNormalizer, Prepend, Replace (string pattern), Sequence
 *                  (Precompiled is refused)
 *   pre_tokenizer  ByteLevel, Split (regex or string, behaviour Isolated),
 *                  Metaspace, BertPreTokenizer, WhitespaceSplit, Whitespace,
 *                  Sequence
 *   model          BPE (byte_fallback, unk_token, ignore_merges; merges as
 *                  ["a", "b"] pairs or "a b" strings); Unigram (vocab of
 *                  [piece, score], unk_id, byte_fallback; Viterbi as HF's
 *                  optimized encode, unk runs fused); WordPiece (unk_token,
 *                  continuing_subword_prefix, max_input_chars_per_word)
 *   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 *                  WordPiece, Sequence (no decoder: tokens joined by spaces)
 *   added_tokens   as HF's AddedVocabulary: those not normalized matched in
 *                  the raw text, then those normalized in each stretch after
 *                  the normalizer (as their content normalized); leftmost,
 *                  longest there; single_word, lstrip and rstrip honoured; a
 *                  normalized token decodes as its normalized form
 *
 * The file must be valid UTF-8. Input text that is not valid UTF-8 has each
 * maximal ill-formed subpart replaced by U+FFFD (what Python's
 * errors="replace" does). Character classes (whitespace, punctuation,
 * controls, marks, \w) come from utf8proc's Unicode tables, which may differ
 * from the Rust crates HF uses for characters assigned recently. */
#ifndef OG_TEXT_TOKENIZER_H
#define OG_TEXT_TOKENIZER_H

#include "offgraph.h"

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

typedef struct og_tokenizer og_tokenizer;

/* Parses tokenizer.json text. On success *out is owned by the caller:
 * og_tokenizer_destroy. On failure og_last_error() names what in the file is
 * wrong or unsupported. */
og_status og_tokenizer_load_json(const char *json, og_tokenizer **out);
/* NULL is a no-op. */
void og_tokenizer_destroy(og_tokenizer *t);

/* Reads eos/bos tokens and the chat template from tokenizer_config.json
 * text (NULL or "" leaves them unset). eos_token / bos_token may be a
 * string or {"content": ...}; the tokens must exist. */
og_status og_tokenizer_load_config(og_tokenizer *t, const char *config_json);
/* Both of the above: tokenizer.json text and, when config_json is non-NULL,
 * tokenizer_config.json text; `where` names their origin in the message of a
 * failure. On success *out is owned by the caller: og_tokenizer_destroy. */
og_status og_tokenizer_from_texts(const char *json, const char *config_json, const char *where, og_tokenizer **out);

/* One past the largest id (vocabulary and added tokens). */
int32_t og_tokenizer_vocab_size(const og_tokenizer *t);
/* For tests: merge with the plain quadratic loop the fast (heap) merge is
 * checked against. Not thread-safe against concurrent encodes. */
void og_tokenizer_use_reference_bpe(og_tokenizer *t, bool on);

/* Encodes len bytes of text (no special tokens are added; special tokens
 * written in the text are matched). *ids is owned by the caller: og_free
 * (NULL when *n == 0). */
og_status og_tokenizer_encode(const og_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              int64_t *n);

/* The same, with the post_processor's special tokens added around the text
 * when add_special (OG_ERR_UNSUPPORTED for a post_processor this tokenizer
 * does not follow), and special added tokens written in the text matched
 * only when parse_special (otherwise they are encoded as plain text). */
og_status og_tokenizer_encode_ex(const og_tokenizer *t, const char *text, size_t len, int add_special,
                                 int parse_special, int32_t **ids, int64_t *n);

/* Decodes n ids (special tokens kept) into NUL-terminated UTF-8. *text is
 * owned by the caller: og_free; *len (if non-NULL) gets its length. An id
 * out of range is OG_ERR_INVALID_ARGUMENT. */
og_status og_tokenizer_decode(const og_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                              size_t *len);

/* The id of the token whose text is exactly `text` (added tokens first,
 * then the vocabulary), or -1. */
int32_t og_tokenizer_token_id(const og_tokenizer *t, const char *text);
/* The token's text as stored in the file, or NULL; borrowed from t. */
const char *og_tokenizer_token_text(const og_tokenizer *t, int32_t id);
/* Whether id is an added token marked special. */
int og_tokenizer_is_special(const og_tokenizer *t, int32_t id);

/* End-of-sequence ids: the config's eos_token, plus any added with
 * og_tokenizer_add_eos. *ids is borrowed from t. */
int32_t og_tokenizer_eos_ids(const og_tokenizer *t, const int32_t **ids);
og_status og_tokenizer_add_eos(og_tokenizer *t, int32_t id);
/* The config's bos token id, or -1. */
int32_t og_tokenizer_bos_id(const og_tokenizer *t);
/* The config's chat_template text, or NULL; borrowed from t. */
const char *og_tokenizer_chat_template(const og_tokenizer *t);

/* The bytes token id adds to a text it follows (decoded raw, after a plain
 * context token, so that decoders that treat the first token apart, as
 * Metaspace and Strip do, see it in the middle): what constrained
 * generation matches. Bytes that are not valid UTF-8 alone (a piece of a
 * character) are given as they are. *bytes is owned by the caller: og_free
 * (NULL when *len == 0). */
og_status og_tokenizer_token_bytes(const og_tokenizer *t, int32_t id, char **bytes, size_t *len);

/* Streaming decode: text is given out as soon as it is complete, and a tail
 * that decodes to an incomplete UTF-8 character (U+FFFD) is held back until
 * the next token completes it or og_decode_stream_finish. */
typedef struct og_decode_stream og_decode_stream;
/* og_decode_stream_create (offgraph.h) borrows t, which must outlive the
 * stream; the caller owns it: og_decode_stream_destroy. */
void og_decode_stream_destroy(og_decode_stream *s);
/* Adds one token. *text (borrowed from s, valid until the next call) gets
 * the newly complete text, possibly empty. */
og_status og_decode_stream_push(og_decode_stream *s, int32_t id, const char **text, size_t *len);
/* Gives out whatever is held back (as decoded, U+FFFD included) and starts
 * over. */
og_status og_decode_stream_finish(og_decode_stream *s, const char **text, size_t *len);

#endif /* OG_TEXT_TOKENIZER_H */
