/* Shared by the libFuzzer harnesses tests/fuzz/fuzz_<name>.c. Each defines
 * `int og_fuzz_<name>(const uint8_t *data, size_t size)` (returns 0), which
 * the normal build's test_fuzz_replay runs over tests/fuzz/corpus/<name>/,
 * and ends with OG_FUZZ_ENTRY(og_fuzz_<name>), which becomes libFuzzer's
 * entry point only in the fuzzer build (OG_FUZZ_MAIN). */
#ifndef OG_TEST_FUZZ_H
#define OG_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef OG_FUZZ_MAIN
#define OG_FUZZ_ENTRY(fn) \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fn(data, size); }
#else
#define OG_FUZZ_ENTRY(fn)
#endif

#endif
