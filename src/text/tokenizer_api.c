/* The tokenizer's public calls (offgraph.h, section tokenizer): thin
 * wrappers over model/tokenizer.h that add the model and file loaders, the
 * encode flags and the special ids. */
#include "text/tokenizer.h"

#include "core/core.h"
#include "text/chat_template.h"
#include "core/textfile.h"

#include <string.h>

/* Loads tokenizer.json text and, when config is non-NULL, the config text;
 * `where` names their origin in a message. */
static og_status load_texts(const char *json, const char *config, const char *where, og_tokenizer **out) {
    og_tokenizer *t = NULL;
    og_status rc = og_tokenizer_load_json(json, &t);
    if (rc == OG_OK && config) rc = og_tokenizer_load_config(t, config);
    if (rc != OG_OK) {
        og_tokenizer_destroy(t);
        return og_set_error(rc, "the tokenizer of %s: %s", where, og_last_error());
    }
    *out = t;
    return OG_OK;
}

og_status og_tokenizer_from_model(const og_model *m, og_tokenizer **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_model: NULL out");
    *out = NULL;
    if (!m) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_model: NULL model");
    const char *json = og_model_tokenizer_json(m);
    if (!json) {
        const char *why = og_model_no_tokenizer_reason(m);
        return og_set_error(OG_ERR_UNSUPPORTED, "og_tokenizer_from_model: the model's program has no tokenizer%s%s "
                            "(export it from a checkpoint folder that has tokenizer.json)", why ? ": " : "",
                            why ? why : "");
    }
    return load_texts(json, og_model_tokenizer_config(m), "the model's program", out);
}

og_status og_tokenizer_from_file(const char *tokenizer_json_path, const char *config_path, og_tokenizer **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_file: NULL out");
    *out = NULL;
    if (!tokenizer_json_path)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_file: NULL tokenizer.json path");
    char *json = NULL, *config = NULL;
    og_status rc = og_read_text_file(tokenizer_json_path, &json, NULL);
    if (rc == OG_OK && config_path) rc = og_read_text_file(config_path, &config, NULL);
    if (rc == OG_OK) rc = load_texts(json, config, tokenizer_json_path, out);
    og_free(json);
    og_free(config);
    return rc;
}

og_status og_tokenize(const og_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                      int64_t *n) {
    if (ids) *ids = NULL;
    if (n) *n = 0;
    if (!t || !ids || !n || (!text && len))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenize: NULL argument");
    if (flags & ~(OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenize: unknown flags 0x%x", flags);
    return og_tokenizer_encode_ex(t, text ? text : "", len, (flags & OG_TOKENIZE_ADD_SPECIAL) != 0,
                                  (flags & OG_TOKENIZE_PARSE_SPECIAL) != 0, ids, n);
}

og_status og_detokenize(const og_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    if (text) *text = NULL;
    if (!t || !text || (!ids && n) || n < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_detokenize: NULL argument or negative count");
    return og_tokenizer_decode(t, ids, n, text, len);
}

og_status og_token_piece(const og_tokenizer *t, int32_t id, char **text, size_t *len) {
    if (text) *text = NULL;
    if (!t || !text) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_token_piece: NULL argument");
    if (!og_tokenizer_token_text(t, id))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_token_piece: id %d is not a token", id);
    return og_tokenizer_decode(t, &id, 1, text, len);
}

int32_t og_tokenizer_bos(const og_tokenizer *t) { return t ? og_tokenizer_bos_id(t) : -1; }

int32_t og_tokenizer_eos(const og_tokenizer *t) {
    const int32_t *eos = NULL;
    return t && og_tokenizer_eos_ids(t, &eos) > 0 ? eos[0] : -1;
}

int32_t og_tokenizer_eot(const og_tokenizer *t) {
    if (!t) return -1;
    const char *eot = og_chat_template_end_marker(og_tokenizer_chat_template(t));
    return eot ? og_tokenizer_token_id(t, eot) : -1;
}

int32_t og_tokenizer_stop_ids(const og_tokenizer *t, int32_t *ids, int32_t cap) {
    if (!t) return 0;
    const int32_t *eos = NULL;
    int32_t n_eos = og_tokenizer_eos_ids(t, &eos), n = 0, all[9];
    for (int32_t i = 0; i < n_eos && n < 8; i++) all[n++] = eos[i];
    int32_t eot = og_tokenizer_eot(t);
    bool seen = false;
    for (int32_t i = 0; i < n; i++) seen |= all[i] == eot;
    if (eot >= 0 && !seen) all[n++] = eot;
    for (int32_t i = 0; i < n && i < cap; i++) ids[i] = all[i];
    return n;
}

