/* libFuzzer harness: the Jinja chat-template renderer (src/text/jinja.c)
 * over arbitrary template text, rendered against a fixed conversation with
 * small limits, so that every input ends with a text or an error: never a
 * crash, a hang or unbounded memory. The body is a plain function that
 * test_fuzz_replay also runs over tests/fuzz/corpus/chat_template/. */
#include "fuzz.h"
#include "core/core.h"
#include "text/jinja.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_chat_template(const uint8_t *data, size_t size);

static const char *const k_vars =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hello, how are you?\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhmm\\n</think>\\n\\nFine, thanks.\"},"
    " {\"role\": \"user\", \"content\": \"  \\u00c9cris en \\u65e5\\u672c\\u8a9e  \"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"tools\": null, \"documents\": null, \"enable_thinking\": false,"
    " \"extra\": {\"n\": 3, \"f\": 1.5, \"l\": [1, \"two\", null, false]}}";

int og_fuzz_chat_template(const uint8_t *data, size_t size) {
    og_jinja *t = NULL;
    if (og_jinja_parse((const char *)data, size, &t) != OG_OK) return 0;
    cJSON *vars = cJSON_Parse(k_vars);
    og_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 200000};
    char *out = NULL;
    size_t n = 0;
    if (og_jinja_render(t, vars, &lim, &out, &n) == OG_OK) {
        /* what comes back is a string of the length given, within the limit */
        if (!out || n > lim.max_output || strlen(out) > n) __builtin_trap();
        og_free(out);
    } else if (out) {
        __builtin_trap();
    }
    cJSON_Delete(vars);
    og_jinja_free(t);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_chat_template)
