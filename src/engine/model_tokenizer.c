/* og_tokenizer_from_model (offgraph.h): the tokenizer a loaded model's
 * program embeds. It joins the two halves of the library the engine joins:
 * the model (src/exec/) and text (src/text/, which knows no model). */
#include "text/tokenizer.h"

#include "core/core.h"
#include "offgraph.h"

og_status og_tokenizer_from_model(const og_model *m, og_tokenizer **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_model: NULL out");
    *out = NULL;
    if (!m) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_tokenizer_from_model: NULL model");
    const char *json = og_model_tokenizer_json(m);
    if (!json) {
        const char *why = og_model_no_tokenizer_reason(m);
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "og_tokenizer_from_model: the model's program has no tokenizer%s%s (export it from a "
                            "checkpoint folder that has tokenizer.json, or from a GGUF file with a vocabulary)",
                            why ? ": " : "", why ? why : "");
    }
    return og_tokenizer_from_texts(json, og_model_tokenizer_config(m), "the model's program", out);
}
