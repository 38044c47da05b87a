/* The Qwen3 checkpoint tests/data/kquant's GGUF files were quantized from
 * (tests/fixtures/make_kquant_fixtures.py has the recipe: hidden 256, ffn
 * 512, 2 layers, 4 / 2 heads of 64, vocabulary 256, untied, bf16 weights
 * from splitmix64), written by the tests that need it, byte for byte what
 * the script writes. */
#ifndef OG_TEST_KQUANT_FIXTURE_H
#define OG_TEST_KQUANT_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

/* splitmix64: the next value of the stream at *s. */
uint64_t og_test_splitmix(uint64_t *s);
/* config.json and model.safetensors into the folder dir; false on an I/O error. */
bool og_test_write_kq_checkpoint(const char *dir);

#endif
