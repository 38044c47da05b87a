/* libFuzzer harness: the config.json reader over arbitrary bytes. The body is
 * a plain function that test_fuzz_replay also runs over tests/fuzz/corpus/config/. */
#include "fuzz.h"
#include "import/hf_config.h"

#include <stddef.h>
#include <stdint.h>

int og_fuzz_config(const uint8_t *data, size_t size);

int og_fuzz_config(const uint8_t *data, size_t size) {
    og_hf_config c;
    if (og_hf_config_parse((const char *)data, size, "fuzz", &c) != OG_OK) return 0;
    /* an accepted config is internally consistent */
    if (c.num_hidden_layers < 1 || c.num_hidden_layers > OG_HF_MAX_LAYERS || c.head_dim < 1 ||
        c.num_attention_heads % c.num_key_value_heads != 0)
        __builtin_trap();
    for (int32_t i = 0; i < c.num_hidden_layers; i++)
        if (c.layer_sliding[i] && c.sliding_window < 1) __builtin_trap();
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_config)
