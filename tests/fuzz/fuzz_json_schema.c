/* libFuzzer harness: the JSON-schema compiler over arbitrary bytes. A
 * schema it accepts must give a grammar the GBNF parser accepts (the
 * compiler writes only valid grammars). The body is a plain function that
 * test_fuzz_replay also runs over tests/fuzz/corpus/json_schema/. */
#include "fuzz.h"
#include "core/core.h"
#include "text/grammar.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_json_schema(const uint8_t *data, size_t size);

int og_fuzz_json_schema(const uint8_t *data, size_t size) {
    char *gbnf = NULL;
    if (og_json_schema_to_gbnf((const char *)data, size, &gbnf) != OG_OK) {
        if (gbnf) __builtin_trap();
        return 0;
    }
    og_grammar *g = NULL;
    og_status st = og_grammar_parse(gbnf, strlen(gbnf), &g);
    /* repetition bounds past the grammar's limits are refused as such; anything else is a compiler bug */
    if (st != OG_OK && st != OG_ERR_UNSUPPORTED) __builtin_trap();
    og_grammar_destroy(g);
    og_free(gbnf);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_json_schema)
