/* The special tokens a prompt gets (og_tokenize with OG_TOKENIZE_ADD_SPECIAL)
 * and the ids of a rendered chat (the template rendered by
 * src/model/chat_template.c, tokenized without added special tokens), held to
 * what Hugging Face transformers gives for the same tokenizer.json and
 * tokenizer_config.json: tokenizer(text), tokenizer(text,
 * add_special_tokens=False) and apply_chat_template(tokenize=True,
 * add_generation_prompt=True). The fixture, tests/data/tokenizers/
 * special_tokens.json, is made by tests/fixtures/make_special_token_fixtures.py:
 * every tokenizer of tests/data/hf and tests/data/tokenizers, and variants of
 * their post_processor (TemplateProcessing with a BOS, with an EOS, ByteLevel +
 * TemplateProcessing, BertProcessing, RobertaProcessing) and of the config's
 * add_bos_token / add_eos_token / bos_token. Also the bos and eos ids, and
 * og_tokenizer_stop_ids (eos, then the template's end of turn). Cases
 * transformers loads with a model's own tokenizer class (one that rebuilds
 * the pipeline from the vocabulary) are listed and skipped. */
#include "harness.h"

#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "offgraph.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int same_ids(const int32_t *got, int64_t n, const cJSON *want) {
    if (n != cJSON_GetArraySize(want)) return 0;
    int64_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, want) if (!cJSON_IsNumber(x) || got[i++] != (int32_t)x->valuedouble) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
    fprintf(stderr, "  %s:", what);
    for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

static void print_json_ids(const char *what, const cJSON *arr) {
    fprintf(stderr, "  %s:", what);
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) fprintf(stderr, " %d", (int)x->valuedouble);
    fprintf(stderr, "\n");
}

/* og_tokenize of text with flags, compared with want; counts a mismatch. */
static void check_encode(const og_tokenizer *t, const char *name, const char *text, unsigned flags, const cJSON *want,
                         int *bad) {
    int32_t *ids = NULL;
    int64_t n = 0;
    og_status rc = og_tokenize(t, text, strlen(text), flags, &ids, &n);
    if (rc != OG_OK || !same_ids(ids, n, want)) {
        (*bad)++;
        fprintf(stderr, "%s: og_tokenize(\"%s\", %s) %s\n", name, text,
                flags & OG_TOKENIZE_ADD_SPECIAL ? "ADD_SPECIAL" : "no special added",
                rc ? og_last_error() : "differs from transformers");
        print_ids("got ", ids, n);
        print_json_ids("want", want);
    }
    og_free(ids);
}

/* Renders the case's chat with its template and tokenizes it without added
 * special tokens; compares the text and the ids with transformers'. */
static void check_chat(const og_tokenizer *t, const char *name, const cJSON *chat, int *bad) {
    const cJSON *msgs = cJSON_GetObjectItem(chat, "messages"), *m;
    og_chat_message list[8];
    size_t n = 0;
    cJSON_ArrayForEach(m, msgs) {
        if (n == 8) break;
        list[n++] = (og_chat_message){cJSON_GetObjectItem(m, "role")->valuestring,
                                      cJSON_GetObjectItem(m, "content")->valuestring};
    }
    og_chat_template *tpl = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int64_t nids = 0;
    int32_t bos = og_tokenizer_bos(t), eos = og_tokenizer_eos(t);
    og_chat_request req = {.messages = list, .n_messages = n, .add_generation_prompt = true,
                           .bos_token = bos >= 0 ? og_tokenizer_token_text(t, bos) : NULL,
                           .eos_token = eos >= 0 ? og_tokenizer_token_text(t, eos) : NULL};
    og_status rc = og_chat_template_create(og_tokenizer_chat_template(t), OG_CHAT_PLAIN, &tpl);
    if (rc == OG_OK) rc = og_chat_template_render(tpl, &req, &text);
    const char *want_text = cJSON_GetObjectItem(chat, "text")->valuestring;
    if (rc != OG_OK || strcmp(text, want_text)) {
        (*bad)++;
        fprintf(stderr, "%s: the chat renders %s\n  got:  %s\n  want: %s\n", name, rc ? og_last_error() : "otherwise",
                text ? text : "", want_text);
    } else {
        /* as apply_chat_template(tokenize=True): the template wrote its BOS */
        rc = og_tokenize(t, text, strlen(text), OG_TOKENIZE_PARSE_SPECIAL, &ids, &nids);
        if (rc != OG_OK || !same_ids(ids, nids, cJSON_GetObjectItem(chat, "ids"))) {
            (*bad)++;
            fprintf(stderr, "%s: the chat's ids differ from apply_chat_template(tokenize=True)\n", name);
            print_ids("got ", ids, nids);
            print_json_ids("want", cJSON_GetObjectItem(chat, "ids"));
        }
    }
    og_free(ids);
    og_free(text);
    og_chat_template_destroy(tpl);
}

static int32_t json_id(const cJSON *v) { return cJSON_IsNumber(v) ? (int32_t)v->valuedouble : -1; }

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/special_tokens.json", OG_TEST_DATA_DIR);
    char *text = og_test_read_file(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(root != NULL, "%s is missing or not JSON", path);
    if (!root) return og_test_finish();
    int n_cases = 0, n_encodes = 0, n_chats = 0, n_with_special = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        if (cJSON_GetObjectItem(c, "error")) {
            /* transformers itself refused this one: nothing to compare */
            fprintf(stderr, "%s: skipped (transformers: %s)\n", name, cJSON_GetObjectItem(c, "error")->valuestring);
            continue;
        }
        const cJSON *cls = cJSON_GetObjectItem(c, "class");
        if (cJSON_IsString(cls) && strcmp(cls->valuestring, "TokenizersBackend") &&
            strcmp(cls->valuestring, "PreTrainedTokenizerFast")) {
            /* a model's own class (LlamaTokenizer...) rebuilds the whole
             * pipeline from the vocabulary, not only the special tokens:
             * not what tokenizer.json says, and not followed (decisions.md) */
            fprintf(stderr, "%s: skipped (transformers' %s rebuilds the tokenizer)\n", name, cls->valuestring);
            continue;
        }
        og_test_section(name);
        n_cases++;
        snprintf(path, sizeof path, "%s/%s", OG_SOURCE_DIR, cJSON_GetObjectItem(c, "tokenizer")->valuestring);
        char *tj_text = og_test_read_file(path);
        cJSON *tj = tj_text ? cJSON_Parse(tj_text) : NULL;
        CHECK_MSG(tj != NULL, "%s: %s unreadable", name, path);
        free(tj_text);
        if (!tj) continue;
        const cJSON *post = cJSON_GetObjectItem(c, "post_processor");
        if (post) cJSON_ReplaceItemInObjectCaseSensitive(tj, "post_processor", cJSON_Duplicate(post, 1));
        char *json = cJSON_PrintUnformatted(tj), *cfg = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "config"));
        og_tokenizer *t = NULL;
        og_status rc = og_tokenizer_load_json(json, &t);
        if (rc == OG_OK) rc = og_tokenizer_load_config(t, cfg);
        CHECK_MSG(rc == OG_OK, "%s: the tokenizer does not load: %s", name, og_last_error());
        if (rc != OG_OK) og_tokenizer_destroy(t);
        free(json);
        free(cfg);
        cJSON_Delete(tj);
        if (rc != OG_OK) continue;
        CHECK_MSG(og_tokenizer_bos(t) == json_id(cJSON_GetObjectItem(c, "bos_id")), "%s: bos %d, transformers %d", name,
                  og_tokenizer_bos(t), json_id(cJSON_GetObjectItem(c, "bos_id")));
        CHECK_MSG(og_tokenizer_eos(t) == json_id(cJSON_GetObjectItem(c, "eos_id")), "%s: eos %d, transformers %d", name,
                  og_tokenizer_eos(t), json_id(cJSON_GetObjectItem(c, "eos_id")));
        /* the stops: eos, then the end of turn, each once */
        int32_t stops[8], want[2], nw = 0;
        int32_t ns = og_tokenizer_stop_ids(t, stops, 8);
        if (og_tokenizer_eos(t) >= 0) want[nw++] = og_tokenizer_eos(t);
        if (og_tokenizer_eot(t) >= 0 && og_tokenizer_eot(t) != og_tokenizer_eos(t)) want[nw++] = og_tokenizer_eot(t);
        CHECK_MSG(ns == nw && !memcmp(stops, want, (size_t)nw * sizeof *want), "%s: %d stop ids", name, ns);
        int bad = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(c, "encode")) {
            const char *s = cJSON_GetObjectItem(e, "text")->valuestring;
            const cJSON *ids = cJSON_GetObjectItem(e, "ids"), *plain = cJSON_GetObjectItem(e, "plain");
            check_encode(t, name, s, OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL, ids, &bad);
            check_encode(t, name, s, OG_TOKENIZE_PARSE_SPECIAL, plain, &bad);
            n_with_special += cJSON_GetArraySize(ids) != cJSON_GetArraySize(plain);
            n_encodes++;
        }
        const cJSON *chat = cJSON_GetObjectItem(c, "chat");
        if (chat) {
            check_chat(t, name, chat, &bad);
            n_chats++;
        }
        CHECK_MSG(bad == 0, "%s: %d differences from transformers", name, bad);
        og_tokenizer_destroy(t);
    }
    /* the fixture must exercise the rule: cases that add tokens and chats */
    CHECK_MSG(n_cases >= 30 && n_with_special >= 40 && n_chats >= 3,
              "%d cases, %d texts with special tokens added, %d chats", n_cases, n_with_special, n_chats);
    printf("%d tokenizers, %d texts (%d with special tokens added), %d chats against transformers %s\n", n_cases,
           n_encodes, n_with_special, n_chats, cJSON_GetObjectItem(root, "transformers")->valuestring);
    cJSON_Delete(root);
    free(text);
    return og_test_finish();
}
