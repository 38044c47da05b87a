/* What a grammar adds to a decode step: the demo model (or the program
 * given) decodes greedily, free and under a JSON schema, one token a step;
 * the constrained run times the constraint hook (feed the last token,
 * mask the logits) apart from the model's step. A fresh matcher pays for
 * every state's mask once (cold); a second request on the same matcher
 * finds them cached (warm).
 *
 * usage: bench_grammar PROGRAM [TOKENS] [THREADS] [SCHEMA_FILE]
 *   PROGRAM   an exported program with its tokenizer (build/kjv-tiny.ogp)
 *   TOKENS    tokens per run (256)
 * OG_BACKEND=cuda runs the model on the GPU (the mask then applies inside
 * the captured decode graph); the default is the CPU.
 * Prints the mean model step, the mean hook cost cold and warm, and their
 * ratios; then whole greedy decode steps (og_model_step) free and
 * constrained by the two paths a mask can take: a LOGITS row masked by the
 * hook on the host (before masks went on batch items), and the mask on the
 * batch item (og_batch_item.allowed, the engine's path), as the per-token
 * cost and its excess over the free step. */
#include "core/core.h"
#include "core/textfile.h"
#include "text/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *k_default_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},"
    "\"maxItems\":8},\"ok\":{\"type\":\"boolean\"},\"place\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":30},\"x\":{\"type\":\"number\"}},\"required\":[\"city\",\"x\"]}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\",\"place\"],\"additionalProperties\":false}";

static int32_t argmax(const float *l, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = (int32_t)i;
    return b;
}

/* Whole decode steps (og_model_step, one session, greedy), up to n tokens
 * after the prompt: FREE (an ARGMAX output), HOOK (the path before masks
 * went on batch items: a LOGITS output, og_grammar_constraint on the row,
 * the arg-max on the host) or MASK (og_grammar_constraint_mask, then an
 * ARGMAX output with the mask as its allowed tokens: the engine's path).
 * The seconds per token, the mask's computation included, go to *t_step. */
enum { PATH_FREE, PATH_HOOK, PATH_MASK };
static int run_steps(og_model *m, const int32_t *prompt, int64_t np, int n, og_matcher *mt, int path, double *t_step,
                     const int32_t *end_ids, int n_end) {
    og_session *s = NULL;
    const int64_t V = og_model_vocab_size(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!logits || !gen || og_session_create(m, NULL, &s) != OG_OK) {
        fprintf(stderr, "session: %s\n", og_last_error());
        exit(1);
    }
    if (mt) og_matcher_reset(mt);
    int32_t tok = 0;
    if (og_session_eval(s, prompt, np - 1, 0, NULL, 0) != OG_OK) {
        fprintf(stderr, "prefill: %s\n", og_last_error());
        exit(1);
    }
    tok = prompt[np - 1];
    int k = 0;
    double t0 = og_time_now();
    for (; k < n; k++) {
        og_batch_item it = {.session = s, .tokens = &tok, .n_tokens = 1, .output = OG_OUTPUT_ARGMAX};
        if (path == PATH_HOOK) {
            it.output = OG_OUTPUT_LOGITS;
            it.logits = logits;
        }
        if (path == PATH_MASK) it.allowed = og_grammar_constraint_mask(mt, gen, k, V);
        if (og_model_step(m, &it, 1) != OG_OK) break; /* the context is full */
        if (path == PATH_HOOK) {
            og_grammar_constraint(mt, gen, k, logits, V);
            it.token = argmax(logits, V);
        }
        int end = 0;
        for (int e = 0; e < n_end; e++) end |= it.token == end_ids[e];
        if (end && path != PATH_FREE) {
            k++;
            break; /* the grammar is complete */
        }
        gen[k] = tok = it.token;
    }
    *t_step = (og_time_now() - t0) / (k > 0 ? k : 1);
    og_session_destroy(s);
    free(logits);
    free(gen);
    return k;
}

/* One greedy run of up to n tokens; hook NULL: free. Returns tokens made;
 * *t_model and *t_hook get the seconds spent in each. */
static int run(og_model *m, const int32_t *prompt, int64_t np, int n, og_matcher *hook, double *t_model,
               double *t_hook, int32_t *end_ids, int n_end) {
    og_session *s = NULL;
    int64_t V = og_model_vocab_size(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(n + 1));
    *t_model = *t_hook = 0;
    if (!logits || !gen || og_session_create(m, NULL, &s) != OG_OK) {
        fprintf(stderr, "session: %s\n", og_last_error());
        exit(1);
    }
    double t0 = og_time_now();
    if (og_session_eval(s, prompt, np, 0, logits, 0) != OG_OK) {
        fprintf(stderr, "prefill: %s\n", og_last_error());
        exit(1);
    }
    (void)t0;
    int k = 0;
    for (; k < n; k++) {
        double a = og_time_now();
        if (hook) og_grammar_constraint(hook, gen, k, logits, V);
        double b = og_time_now();
        *t_hook += b - a;
        int32_t tok = argmax(logits, V);
        int end = 0;
        for (int e = 0; e < n_end; e++) end |= tok == end_ids[e];
        if (end && hook) break; /* the grammar is complete */
        gen[k] = tok;
        a = og_time_now();
        if (og_session_eval(s, &tok, 1, 0, logits, 0) != OG_OK) break; /* the context is full */
        *t_model += og_time_now() - a;
    }
    og_session_destroy(s);
    free(logits);
    free(gen);
    return k;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PROGRAM [TOKENS] [THREADS] [SCHEMA_FILE]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 256;
    og_model_params mp = og_model_default_params();
    const char *be = getenv("OG_BACKEND");
    mp.backend = OG_BACKEND_CPU;
    if (be && !strcmp(be, "cuda")) mp.backend = OG_BACKEND_CUDA;
    else if (be && *be && strcmp(be, "cpu")) {
        fprintf(stderr, "OG_BACKEND=%s: expected cpu or cuda\n", be);
        return 2;
    }
    mp.n_threads = argc > 3 ? atoi(argv[3]) : 1;
    char *schema = NULL;
    if (argc > 4 && og_read_text_file(argv[4], &schema, NULL) != OG_OK) {
        fprintf(stderr, "%s\n", og_last_error());
        return 1;
    }
    og_model *m = NULL;
    og_tokenizer *tok = NULL;
    if (og_model_load(argv[1], &mp, &m) != OG_OK || og_tokenizer_from_model(m, &tok) != OG_OK) {
        fprintf(stderr, "%s\n", og_last_error());
        return 1;
    }
    int64_t V = og_model_vocab_size(m);
    double t = og_time_now();
    og_grammar_vocab *v = NULL;
    og_grammar *g = NULL;
    const char *sc = schema ? schema : k_default_schema;
    if (og_grammar_vocab_create(tok, V, NULL, 0, &v) != OG_OK || og_grammar_from_json_schema(sc, strlen(sc), &g) != OG_OK) {
        fprintf(stderr, "%s\n", og_last_error());
        return 1;
    }
    double t_vocab = og_time_now() - t;
    int32_t end_ids[16];
    int n_end = og_tokenizer_stop_ids(tok, end_ids, 16);
    int32_t *prompt = NULL;
    int64_t np = 0;
    const char *text = "And the LORD spake unto Moses, saying,";
    if (og_tokenize(tok, text, strlen(text), OG_TOKENIZE_ADD_SPECIAL, &prompt, &np) != OG_OK) return 1;
    og_matcher *mt = NULL;
    if (og_matcher_create(g, v, &mt) != OG_OK) return 1;
    double fm, fh, cm, ch, wm, wh;
    run(m, prompt, np, 8, NULL, &fm, &fh, end_ids, n_end); /* warm the model up */
    int nf = run(m, prompt, np, n, NULL, &fm, &fh, end_ids, n_end);
    int nc = run(m, prompt, np, n, mt, &cm, &ch, end_ids, n_end);
    int64_t states, masks, nodes;
    og_matcher_stats(mt, &states, &masks, &nodes);
    og_matcher_reset(mt);
    int nw = run(m, prompt, np, n, mt, &wm, &wh, end_ids, n_end);
    printf("vocabulary %lld tokens, trie built in %.1f ms; %lld states, %lld masks computed in the cold run\n",
           (long long)V, t_vocab * 1e3, (long long)states, (long long)masks);
    printf("free:        %4d tokens, model step %8.1f us\n", nf, fm / nf * 1e6);
    printf("cold matcher: %4d tokens, model step %8.1f us, hook %7.1f us/step (%.1f %% of the free step)\n", nc,
           cm / nc * 1e6, ch / nc * 1e6, 100.0 * (ch / nc) / (fm / nf));
    printf("warm matcher: %4d tokens, model step %8.1f us, hook %7.1f us/step (%.1f %% of the free step)\n", nw,
           wm / nw * 1e6, wh / nw * 1e6, 100.0 * (wh / nw) / (fm / nf));
    /* whole steps: the constrained step's cost against a free one, by the
     * path the mask takes (each run's matcher warm: the cold cost is above);
     * the best of five rounds of each, the paths interleaved, the free run
     * as long as the constrained ones (its steps at the same lengths) */
    double best[3] = {1e30, 1e30, 1e30};
    int made[3] = {0, 0, 0};
    for (int round = 0; round < 5; round++)
        for (int path = 2; path >= 0; path--) {
            double t_step;
            made[path] = run_steps(m, prompt, np, path == PATH_FREE ? made[PATH_MASK] : n,
                                   path == PATH_FREE ? NULL : mt, path, &t_step, end_ids, n_end);
            if (t_step < best[path]) best[path] = t_step;
        }
    printf("whole steps: free %8.1f us (%d tokens); logits + hook %8.1f us (%d tokens, %+.1f %%); "
           "mask on the item %8.1f us (%d tokens, %+.1f %%)\n",
           best[PATH_FREE] * 1e6, made[PATH_FREE], best[PATH_HOOK] * 1e6, made[PATH_HOOK],
           100.0 * (best[PATH_HOOK] / best[PATH_FREE] - 1), best[PATH_MASK] * 1e6, made[PATH_MASK],
           100.0 * (best[PATH_MASK] / best[PATH_FREE] - 1));
    og_free(prompt);
    og_matcher_destroy(mt);
    og_grammar_destroy(g);
    og_grammar_vocab_destroy(v);
    og_tokenizer_destroy(tok);
    og_model_destroy(m);
    og_free(schema);
    return 0;
}
