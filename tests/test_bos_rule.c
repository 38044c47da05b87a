/* The BOS / EOS rule of og_tokenize(OG_TOKENIZE_ADD_SPECIAL), from the
 * definitions of the formats: tokenizer.json's post_processor puts its special
 * tokens around a single sequence (TemplateProcessing: the SpecialToken
 * entries before and after $A, by the ids of its special_tokens map;
 * BertProcessing and RobertaProcessing: cls $A sep; ByteLevel: nothing; a
 * Sequence applies each in turn, so a later one wraps what the earlier made);
 * tokenizer_config.json's add_bos_token and add_eos_token change nothing, as
 * in transformers 5. Every expected list here is
 * written out from those definitions and the fixtures' ids (mistral-sw: <s> 1,
 * </s> 2; bert-uncased: [CLS] 2, [SEP] 3, [MASK] 4); the text's own ids come
 * from og_tokenize without special tokens, which test_tokenizer_api holds to
 * Hugging Face's. tests/test_special_tokens.c holds the same rule to
 * transformers' own output. */
#include "harness.h"

#include "text/tokenizer.h"
#include "offgraph.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const TEXT = "Hello, world!";
static const int32_t NONE[1] = {0}; /* no ids (memcmp must not get NULL) */

#define TPL(single, specials)                                                                                      \
    "{\"type\":\"TemplateProcessing\",\"single\":[" single "],\"pair\":[],\"special_tokens\":{" specials "}}"
#define SPECIAL(x) "{\"SpecialToken\":{\"id\":\"" x "\",\"type_id\":0}}"
#define SEQ_A "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}"
#define IDS(x, id) "\"" x "\":{\"id\":\"" x "\",\"ids\":[" #id "],\"tokens\":[\"" x "\"]}"

/* Loads fixture `dir`'s tokenizer.json with its post_processor replaced by
 * post (NULL: kept; "null": removed) and config as tokenizer_config.json
 * (NULL: none); encodes TEXT with and without special tokens and checks
 * that the first is pre + the second + suf (n_pre / n_suf ids; n_pre -1:
 * the load or the encode must fail with OG_ERR_UNSUPPORTED). */
static void rule(const char *name, const char *dir, const char *post, const char *config, const int32_t *pre,
                 int n_pre, const int32_t *suf, int n_suf) {
    og_test_section(name);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", OG_TEST_DATA_DIR, dir);
    char *text = og_test_read_file(path);
    cJSON *tj = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(tj != NULL, "%s unreadable", path);
    if (!tj) return;
    if (post) cJSON_ReplaceItemInObjectCaseSensitive(tj, "post_processor", cJSON_Parse(post));
    char *json = cJSON_PrintUnformatted(tj);
    cJSON_Delete(tj);
    og_tokenizer *t = NULL;
    og_status rc = og_tokenizer_load_json(json, &t);
    free(json);
    if (rc == OG_OK && config) rc = og_tokenizer_load_config(t, config);
    int32_t *plain = NULL, *with = NULL;
    int64_t np = 0, nw = 0;
    if (rc == OG_OK) rc = og_tokenize(t, TEXT, strlen(TEXT), OG_TOKENIZE_PARSE_SPECIAL, &plain, &np);
    if (rc == OG_OK)
        rc = og_tokenize(t, TEXT, strlen(TEXT), OG_TOKENIZE_PARSE_SPECIAL | OG_TOKENIZE_ADD_SPECIAL, &with, &nw);
    if (n_pre < 0) {
        CHECK_MSG(rc == OG_ERR_UNSUPPORTED, "%s: %s, want OG_ERR_UNSUPPORTED", name, og_status_str(rc));
    } else {
        CHECK_MSG(rc == OG_OK, "%s: %s", name, og_last_error());
        int ok = rc == OG_OK && np > 0 && nw == np + n_pre + n_suf &&
                 !memcmp(with, pre, (size_t)n_pre * sizeof *pre) &&
                 !memcmp(with + n_pre, plain, (size_t)np * sizeof *plain) &&
                 !memcmp(with + n_pre + np, suf, (size_t)n_suf * sizeof *suf);
        CHECK_MSG(ok, "%s: %lld ids with special tokens, %lld without; want %d before and %d after", name,
                  (long long)nw, (long long)np, n_pre, n_suf);
        /* an empty text gets them too */
        int32_t *e = NULL;
        int64_t ne = 0;
        rc = og_tokenize(t, "", 0, OG_TOKENIZE_PARSE_SPECIAL | OG_TOKENIZE_ADD_SPECIAL, &e, &ne);
        CHECK_MSG(rc == OG_OK && ne == n_pre + n_suf &&
                      (!ne || (!memcmp(e, pre, (size_t)n_pre * sizeof *pre) &&
                               !memcmp(e + n_pre, suf, (size_t)n_suf * sizeof *suf))),
                  "%s: the empty text gave %lld ids", name, (long long)ne);
        og_free(e);
    }
    og_free(plain);
    og_free(with);
    og_tokenizer_destroy(t);
}

int main(void) {
    const int32_t BOS[] = {1}, EOS[] = {2}, CLS[] = {2}, SEP[] = {3}, CLS_MASK[] = {2, 4}, SEP_SEP[] = {3, 3};
    const char *bos_tpl = TPL(SPECIAL("<s>") "," SEQ_A, IDS("<s>", 1));
    const char *eos_tpl = TPL(SEQ_A "," SPECIAL("</s>"), IDS("</s>", 2));
    const char *cfg = "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";

    /* the file's post_processor alone */
    rule("shipped: adds nothing", "hf/mistral-sw", NULL, NULL, NONE, 0, NONE, 0);
    rule("no post_processor", "hf/mistral-sw", "null", cfg, NONE, 0, NONE, 0);
    rule("TemplateProcessing <s> $A (Llama 2, Mistral)", "hf/mistral-sw", bos_tpl, cfg, BOS, 1, NONE, 0);
    rule("TemplateProcessing $A </s>", "hf/mistral-sw", eos_tpl, NULL, NONE, 0, EOS, 1);
    rule("ByteLevel + TemplateProcessing (Llama 3)", "hf/mistral-sw",
         "{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
         "\"trim_offsets\":false,\"use_regex\":true},"
         TPL(SPECIAL("<s>") "," SEQ_A, IDS("<s>", 1)) "]}",
         cfg, BOS, 1, NONE, 0);
    rule("BertProcessing: cls $A sep", "tokenizers/bert-uncased",
         "{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]}", NULL, CLS, 1, SEP, 1);
    rule("RobertaProcessing: cls $A sep", "tokenizers/bert-uncased",
         "{\"type\":\"RobertaProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2],\"trim_offsets\":true,"
         "\"add_prefix_space\":true}",
         NULL, CLS, 1, SEP, 1);
    /* a Sequence: the second processor wraps what the first made */
    rule("Sequence of two templates", "tokenizers/bert-uncased",
         "{\"type\":\"Sequence\",\"processors\":["
         TPL(SPECIAL("[MASK]") "," SEQ_A "," SPECIAL("[SEP]"), IDS("[MASK]", 4) "," IDS("[SEP]", 3)) ","
         TPL(SPECIAL("[CLS]") "," SEQ_A "," SPECIAL("[SEP]"), IDS("[CLS]", 2) "," IDS("[SEP]", 3)) "]}",
         NULL, CLS_MASK, 2, SEP_SEP, 2);
    rule("an unknown post_processor", "hf/mistral-sw", "{\"type\":\"SomethingElse\"}", NULL, NONE, -1, NONE, 0);

    /* tokenizer_config.json's add_bos_token / add_eos_token change nothing
     * (transformers 5.17 gives the same: tests/test_special_tokens.c) */
    rule("add_bos_token true, no post_processor tokens", "hf/mistral-sw", NULL,
         "{\"bos_token\":\"<s>\",\"add_bos_token\":true}", NONE, 0, NONE, 0);
    rule("add_bos_token true, the file's BOS: one BOS", "hf/mistral-sw", bos_tpl,
         "{\"bos_token\":\"<s>\",\"add_bos_token\":true}", BOS, 1, NONE, 0);
    rule("add_bos_token false keeps the file's BOS", "hf/mistral-sw", bos_tpl,
         "{\"bos_token\":\"<s>\",\"add_bos_token\":false}", BOS, 1, NONE, 0);
    rule("add_eos_token true adds no EOS", "hf/mistral-sw", bos_tpl,
         "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_eos_token\":true}", BOS, 1, NONE, 0);
    rule("the file's BOS without a bos_token in the config", "hf/mistral-sw", bos_tpl, "{\"eos_token\":\"</s>\"}",
         BOS, 1, NONE, 0);
    rule("BertProcessing kept with add_bos_token false", "tokenizers/bert-uncased",
         "{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]}", "{\"add_bos_token\":false}",
         CLS, 1, SEP, 1);
    rule("an unknown post_processor, whatever the config says", "hf/mistral-sw", "{\"type\":\"SomethingElse\"}",
         "{\"bos_token\":\"<s>\",\"add_bos_token\":true}", NONE, -1, NONE, 0);

    /* the stop ids: eos, then the template's end of turn, once each */
    og_test_section("stop ids");
    og_tokenizer *t = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/qwen2-bias/tokenizer.json", OG_TEST_DATA_DIR);
    char *json = og_test_read_file(path);
    snprintf(path, sizeof path, "%s/hf/qwen2-bias/chat_template.jinja", OG_TEST_DATA_DIR);
    char *tpl = og_test_read_file(path);
    CHECK_OK(og_tokenizer_load_json(json, &t));
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "eos_token", "<|endoftext|>");
    cJSON_AddStringToObject(c, "chat_template", tpl);
    char *ctext = cJSON_PrintUnformatted(c);
    CHECK_OK(og_tokenizer_load_config(t, ctext));
    int32_t ids[4] = {-1, -1, -1, -1};
    /* <|endoftext|> 0, <|im_end|> 2 (tests/data/hf/qwen2-bias/tokenizer.json) */
    CHECK(og_tokenizer_stop_ids(t, ids, 4) == 2 && ids[0] == 0 && ids[1] == 2);
    CHECK(og_tokenizer_stop_ids(t, ids, 1) == 2 && ids[0] == 0 && ids[1] == 2);
    CHECK(og_tokenizer_stop_ids(t, NULL, 0) == 2);
    CHECK(og_tokenizer_stop_ids(NULL, ids, 4) == 0);
    og_tokenizer_destroy(t);
    t = NULL;
    /* an eos that is the end of turn too counts once */
    cJSON_ReplaceItemInObjectCaseSensitive(c, "eos_token", cJSON_CreateString("<|im_end|>"));
    free(ctext);
    ctext = cJSON_PrintUnformatted(c);
    CHECK_OK(og_tokenizer_load_json(json, &t));
    CHECK_OK(og_tokenizer_load_config(t, ctext));
    CHECK(og_tokenizer_stop_ids(t, ids, 4) == 1 && ids[0] == 2);
    og_tokenizer_destroy(t);
    free(ctext);
    cJSON_Delete(c);
    free(json);
    free(tpl);
    return og_test_finish();
}
