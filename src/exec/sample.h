/* Sampling the next token from a row of logits: the API is in offgraph.h
 * (og_sampler_*). This header adds what a sampler on another device needs
 * to reproduce og_sampler_sample's choice (kernels/cuda/sample_cuda.h): the
 * parameters, the recent tokens, the forbidden set and the next uniform
 * draw, and the one call that advances the sampler as og_sampler_sample
 * does once it has chosen. */
#ifndef OG_EXEC_SAMPLE_H
#define OG_EXEC_SAMPLE_H

#include "offgraph.h"

#include <stdbool.h>
#include <stdint.h>

/* The parameters the sampler was created with; borrowed. */
const og_sampler_params *og_sampler_get_params(const og_sampler *s);
/* Width of the logits rows it samples. */
int64_t og_sampler_vocab(const og_sampler *s);
/* The recent tokens the penalty looks at, as a set (ring order, not time
 * order; ids outside [0, vocab) may be there and are skipped): *ids is
 * borrowed, the count is returned. */
int32_t og_sampler_recent(const og_sampler *s, const int32_t **ids);
/* Bitmap of forbidden ids (bit i % 32 of word i / 32, ceil(vocab / 32)
 * words), or NULL when none is forbidden; borrowed. */
const uint32_t *og_sampler_forbidden(const og_sampler *s);
/* The uniform draw in [0, 1) (53 bits) the next non-greedy choice uses, r =
 * u * (mass kept); not consumed. */
double og_sampler_peek_uniform(const og_sampler *s);
/* Whether the sampler uses a step of the chain that only
 * og_sampler_sample applies (logit bias, presence and frequency
 * penalties): a device that draws on its own must hand such a sampler the
 * logits instead. */
bool og_sampler_host_only(const og_sampler *s);
/* Advances the sampler past a choice of token: consumes the draw (when the
 * temperature is > 0), adds the token to the recent history and counts it
 * for the presence and frequency penalties. */
void og_sampler_commit(og_sampler *s, int32_t token);

/* Sets logits[i] = -INFINITY for every i in [0, V) whose bit (i % 32 of
 * word i / 32) is clear in allowed (og_batch_item.allowed): the reference
 * of the device's og_mask_logits_cuda. */
void og_logits_mask(float *logits, int64_t V, const uint32_t *allowed);

#endif /* OG_EXEC_SAMPLE_H */
