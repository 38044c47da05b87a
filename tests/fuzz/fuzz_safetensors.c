/* libFuzzer harness: the safetensors header parser over arbitrary bytes.
 * The body is a plain function that test_fuzz_replay also runs over tests/fuzz/corpus/safetensors/. */
#include "fuzz.h"
#include "import/safetensors.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_safetensors(const uint8_t *data, size_t size);

int og_fuzz_safetensors(const uint8_t *data, size_t size) {
    og_safetensors *st = NULL;
    if (og_safetensors_open_memory(data, size, "fuzz", &st) != OG_OK) return 0;
    /* touch every accepted tensor's bytes: they must lie inside the input */
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < og_safetensors_count(st); i++) {
        const og_st_tensor *t = og_safetensors_at(st, i);
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        if (og_safetensors_find(st, t->name) != t) __builtin_trap();
    }
    (void)sink;
    og_safetensors_close(st);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_safetensors)
