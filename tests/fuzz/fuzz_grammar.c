/* libFuzzer harness: the GBNF parser over arbitrary bytes, then, for a
 * grammar it accepts, a matcher fed the same bytes one at a time with its
 * mask over a small vocabulary checked against feeding each token (the
 * mask and the byte transitions must agree). The body is a plain function
 * that test_fuzz_replay also runs over tests/fuzz/corpus/grammar/. */
#include "fuzz.h"
#include "text/grammar.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int og_fuzz_grammar(const uint8_t *data, size_t size);

int og_fuzz_grammar(const uint8_t *data, size_t size) {
    og_grammar *g = NULL;
    if (og_grammar_parse((const char *)data, size, &g) != OG_OK) {
        if (g) __builtin_trap(); /* a refusal leaves nothing behind */
        return 0;
    }
    static const char *const toks[] = {"", "a", "ab", "\"", " ", "{", "}", "0", "\xc3", "\xa9", "\xc3\xa9", "x", "\n"};
    enum { V = sizeof toks / sizeof *toks };
    size_t lens[V];
    for (int i = 0; i < V; i++) lens[i] = strlen(toks[i]);
    int32_t eos = 0;
    og_grammar_vocab *v = NULL;
    og_matcher *m = NULL, *o = NULL;
    if (og_grammar_vocab_create_bytes(toks, lens, V, &eos, 1, &v) != OG_OK ||
        og_matcher_create(g, v, &m) != OG_OK || og_matcher_create(g, v, &o) != OG_OK)
        goto done;
    /* walk: at each step the mask must agree with a second matcher fed the
     * same prefix and then the token; take the first allowed token */
    char fed[256];
    size_t n_fed = 0;
    for (int step = 0; step < 16; step++) {
        const uint32_t *mask = og_matcher_mask(m);
        if (!mask) break;
        int pick = -1;
        for (int32_t i = 0; i < V; i++) {
            int got = (mask[0] >> i) & 1, want;
            if (i == eos) want = og_matcher_can_end(m);
            else {
                og_matcher_reset(o);
                want = og_matcher_accept_bytes(o, fed, n_fed) == OG_OK &&
                       og_matcher_accept_bytes(o, toks[i], lens[i]) == OG_OK;
            }
            if (got != want) __builtin_trap();
            if (got && i != eos && pick < 0 && n_fed + lens[i] < sizeof fed) pick = i;
        }
        if (pick < 0 || og_matcher_accept_token(m, pick) != OG_OK) break;
        memcpy(fed + n_fed, toks[pick], lens[pick]);
        n_fed += lens[pick];
    }
done:
    og_matcher_destroy(m);
    og_matcher_destroy(o);
    og_grammar_vocab_destroy(v);
    og_grammar_destroy(g);
    return 0;
}

OG_FUZZ_ENTRY(og_fuzz_grammar)
