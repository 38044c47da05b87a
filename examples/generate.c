/* A program that uses offgraph as a library: it loads a model, tokenizes a
 * prompt with the model's own tokenizer, reads the prompt once into a
 * session, forks a second session from it, and continues the prompt in
 * both: greedily in the first, by sampling in the second. Each reply is
 * decoded as it is generated and printed as soon as its text is complete.
 *
 *   usage: generate MODEL.ogp [PROMPT] [MAX_TOKENS]
 *
 * Build against an installed offgraph:
 *   cc generate.c $(pkg-config --cflags --libs offgraph) -o generate
 * or with CMake: find_package(offgraph) and link offgraph::offgraph. */
#include <offgraph.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "generate: %s: %s\n", what, og_last_error());
    return 1;
}

/* Feeds `first` to s and then every token it draws, up to max_tokens or an
 * end token, printing the text as it completes. */
static int continue_session(og_session *s, const og_tokenizer *tok, og_sampler *sampler, int32_t first,
                            int max_tokens) {
    og_decode_stream *stream = NULL;
    if (og_decode_stream_create(tok, &stream) != OG_OK) return fail("decode stream");
    const char *text;
    size_t len;
    int32_t token = first;
    int rc = 0;
    int32_t stops[8]; /* what ends a generation: eos and the chat's end of turn */
    int32_t n_stops = og_tokenizer_stop_ids(tok, stops, 8);
    if (n_stops > 8) n_stops = 8;
    for (int i = 0; i < max_tokens; i++) {
        int32_t next;
        if (og_session_eval_sample(s, &token, 1, 0, sampler, &next) != OG_OK) {
            fprintf(stderr, "generate: step: %s\n", og_session_last_error(s));
            rc = 1;
            break;
        }
        int stop = 0;
        for (int32_t k = 0; k < n_stops; k++) stop |= next == stops[k];
        if (stop) break;
        if (og_decode_stream_push(stream, next, &text, &len) != OG_OK) {
            rc = fail("decode");
            break;
        }
        fwrite(text, 1, len, stdout); /* text is borrowed from the stream until its next call */
        fflush(stdout);
        token = next;
    }
    if (rc == 0 && og_decode_stream_finish(stream, &text, &len) == OG_OK) fwrite(text, 1, len, stdout);
    putchar('\n');
    og_decode_stream_destroy(stream);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: generate MODEL.ogp [PROMPT] [MAX_TOKENS]\n");
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "In the beginning";
    int max_tokens = argc > 3 ? atoi(argv[3]) : 32;

    og_model *model = NULL;
    og_tokenizer *tok = NULL;
    og_session *first = NULL, *second = NULL;
    og_sampler *greedy = NULL, *sampled = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = 1;

    if (og_model_load(argv[1], NULL, &model) != OG_OK) {
        rc = fail(argv[1]);
        goto out;
    }
    if (og_tokenizer_from_model(model, &tok) != OG_OK) {
        rc = fail("tokenizer");
        goto out;
    }
    /* As Hugging Face's encode(prompt): special tokens added (e.g. a bos)
     * and those written in the prompt recognised. */
    if (og_tokenize(tok, prompt, strlen(prompt), OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL, &ids, &n) !=
        OG_OK) {
        rc = fail("tokenize");
        goto out;
    }
    if (n == 0) {
        fprintf(stderr, "generate: the prompt has no tokens\n");
        goto out;
    }
    printf("prompt: %lld tokens\n", (long long)n);

    og_sampler_params gp = og_sampler_default_params();
    gp.temperature = 0; /* greedy */
    og_sampler_params sp = og_sampler_default_params();
    sp.seed = 1;
    if (og_sampler_create(&gp, og_model_vocab_size(model), &greedy) != OG_OK ||
        og_sampler_create(&sp, og_model_vocab_size(model), &sampled) != OG_OK) {
        rc = fail("sampler");
        goto out;
    }
    /* The prompt but its last token goes into the first session; the second
     * starts as a fork of it (sharing those rows rather than recomputing
     * them); each then feeds the last prompt token and goes its own way. */
    if (og_session_create(model, NULL, &first) != OG_OK) {
        rc = fail("session");
        goto out;
    }
    if (n > 1 && og_session_eval(first, ids, n - 1, 0, NULL, 0) != OG_OK) {
        fprintf(stderr, "generate: prompt: %s\n", og_session_last_error(first));
        goto out;
    }
    if (og_session_fork(first, n - 1, &second) != OG_OK) {
        rc = fail("fork");
        goto out;
    }
    printf("--- session 1 (greedy)\n");
    if (continue_session(first, tok, greedy, ids[n - 1], max_tokens)) goto out;
    printf("--- session 2 (sampled, seed 1)\n");
    if (continue_session(second, tok, sampled, ids[n - 1], max_tokens)) goto out;
    rc = 0;
out:
    og_free(ids);
    og_sampler_destroy(greedy);
    og_sampler_destroy(sampled);
    og_session_destroy(second); /* every session before the model */
    og_session_destroy(first);
    og_tokenizer_destroy(tok);
    og_model_destroy(model);
    return rc;
}
