/* libFuzzer harness: the GGUF reader and the tokenizer rebuilt from its
 * metadata, over arbitrary bytes. The body is a plain function that
 * test_fuzz_replay also runs over tests/fuzz/corpus/gguf/. */
#include "fuzz.h"
#include "core/core.h"
#include "import/export.h"
#include "import/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_gguf(const uint8_t *data, size_t size);

int og_fuzz_gguf(const uint8_t *data, size_t size) {
    og_gguf *g = NULL;
    if (og_gguf_open_memory(data, size, "fuzz", &g) != OG_OK) return 0;
    /* every accepted byte range must lie inside the input */
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < og_gguf_n_tensors(g); i++) {
        const og_gguf_tensor *t = og_gguf_tensor_at(g, i);
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        if (og_gguf_find_tensor(g, t->name) != t) __builtin_trap();
    }
    for (int64_t i = 0; i < og_gguf_n_kv(g); i++) {
        const og_gguf_kv *kv = og_gguf_kv_at(g, i);
        if (og_gguf_find_kv(g, kv->key) != kv) __builtin_trap();
        if (kv->type == OG_GGUF_STRING && kv->s.len) sink ^= (uint8_t)kv->s.p[kv->s.len - 1];
        if (kv->type == OG_GGUF_ARRAY && kv->elem_type == OG_GGUF_STRING)
            for (uint64_t k = 0; k < kv->count; k++)
                if (kv->strs[k].len) sink ^= (uint8_t)kv->strs[k].p[kv->strs[k].len - 1];
    }
    char *json = NULL, *cfg = NULL;
    if (og_gguf_tokenizer(g, &json, &cfg) == OG_OK) {
        og_free(json);
        og_free(cfg);
    }
    (void)sink;
    og_gguf_close(g);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_gguf)
