/* The demo model's golden continuations: greedy decoding with f32 KV
 * storage must reproduce, token for token, what transformers computed
 * (models/kjv-tiny/golden.json, made by scripts/train_demo_model.py). */
#include "harness.h"
#include "kernels/ops.h"
#include "import/export.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <unistd.h>

static int ids_of(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (n < cap) out[n++] = (int32_t)e->valuedouble;
    return n;
}

int main(void) {
    const char *dir = OG_SOURCE_DIR "/models/kjv-tiny";
    char *text = og_test_read_file(OG_SOURCE_DIR "/models/kjv-tiny/golden.json");
    CHECK(text != NULL);
    cJSON *golden = text ? cJSON_Parse(text) : NULL;
    CHECK(golden != NULL);
    char tmp[] = "/tmp/og_golden_XXXXXX";
    if (!golden || !mkdtemp(tmp)) return og_test_finish();
    char path[256];
    snprintf(path, sizeof path, "%s/kjv-tiny.ogp", tmp);
    og_export_options o;
    og_export_default_options(&o);
    CHECK_OK(og_export_hf(dir, path, &o, NULL));
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, NULL, &m));
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(golden, "cases")) {
        if (!m) break;
        int32_t prompt[64], want[128];
        int np = ids_of(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 64);
        int nw = ids_of(cJSON_GetObjectItem(c, "continuation_ids"), want, 128);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "prompt"));
        CHECK_MSG(nw >= 32, "%s: golden has only %d tokens", name, nw);
        og_session_params sp = og_session_default_params();
        sp.kv_dtype = OG_DTYPE_F32;
        og_session *s = NULL;
        CHECK_OK(og_session_create(m, &sp, &s));
        const int64_t V = og_model_vocab_size(m);
        float *logits = malloc(sizeof(float) * (size_t)V);
        og_status st = og_session_eval(s, prompt, np, 0, logits, 0);
        int agree = 0;
        for (int t = 0; st == OG_OK && t < nw; t++) {
            int64_t next = -1;
            st = og_argmax_ref(logits, V, &next);
            if (st != OG_OK || next != want[t]) break;
            agree++;
            int32_t tok = (int32_t)next;
            st = og_session_eval(s, &tok, 1, 0, logits, 0);
        }
        CHECK_OK(st);
        CHECK_MSG(agree == nw, "\"%s\": greedy output agrees with transformers for %d of %d tokens", name, agree, nw);
        fprintf(stderr, "\"%s\": %d/%d tokens as transformers\n", name, agree, nw);
        cases++;
        free(logits);
        og_session_destroy(s);
    }
    CHECK(cases >= 3);
    og_model_destroy(m);
    remove(path);
    rmdir(tmp);
    cJSON_Delete(golden);
    free(text);
    return og_test_finish();
}
