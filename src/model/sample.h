/* Sampling the next token from a row of logits.
 *
 * Order of the steps: repetition penalty over the recent tokens; then
 * greedy (temperature <= 0: the arg-max, lowest id on ties), or top-k,
 * softmax of the kept logits at the temperature, top-p (nucleus), min-p
 * (relative to the most likely token), and a draw from what is left. The sampler owns its random state: the same seed,
 * parameters and logits give the same tokens. */
#ifndef OG_MODEL_SAMPLE_H
#define OG_MODEL_SAMPLE_H

#include "offgraph.h"

#include <stdint.h>

typedef struct og_sampler_params {
    float temperature;    /* <= 0: greedy                                    */
    int32_t top_k;        /* keep the k most likely; <= 0: all               */
    float top_p;          /* keep the smallest set with mass >= p; >= 1: all */
    float min_p;          /* drop p < min_p * p_max; <= 0: none              */
    float repeat_penalty; /* > 1 discourages recent tokens; 1: off           */
    int32_t repeat_last_n;/* how many recent tokens the penalty looks at     */
    uint64_t seed;
} og_sampler_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0
 * (off), repeat_last_n 64, seed 0. */
og_sampler_params og_sampler_default_params(void);

typedef struct og_sampler og_sampler;

/* For rows of vocab logits. On success *out is owned by the caller:
 * og_sampler_destroy. Refuses vocab < 1 or a negative top_p/min_p. */
og_status og_sampler_create(const og_sampler_params *p, int64_t vocab, og_sampler **out);
/* NULL is a no-op. */
void og_sampler_destroy(og_sampler *s);
/* Adds a token to the history the repetition penalty looks at (prompt
 * tokens too; og_sampler_sample adds what it returns). */
void og_sampler_accept(og_sampler *s, int32_t token);
/* Forgets the history and reseeds. */
void og_sampler_reset(og_sampler *s);
/* Picks the next token from logits [vocab] (not modified). */
int32_t og_sampler_sample(og_sampler *s, const float *logits);

#endif /* OG_MODEL_SAMPLE_H */
