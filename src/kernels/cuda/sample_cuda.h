/* The sampler of og_sampler_sample on the device, so that a decode step
 * copies back only the token.
 *
 * og_sample_cuda chooses exactly the token og_sampler_sample chooses for the
 * same logits, parameters, recent tokens, forbidden set and uniform draw:
 * forbidden ids count as -infinity; the repetition penalty divides a positive
 * recent logit by the penalty and multiplies a negative one (each id once);
 * greedy is the arg-max (lowest id on ties); otherwise the k best by (logit
 * descending, lower id first) are kept and sorted, and one thread does the
 * softmax at the temperature (double sums, float probabilities), top-p,
 * min-p and the cumulative scan against r = uniform * mass, in the CPU's
 * order and precision. The one difference the two sides may have is exp:
 * the device's and the C library's double exp can differ in the last bit,
 * which changes a float probability only when it lies that close to a float
 * rounding boundary (about one value in 2^29). NaN logits have no defined
 * order on either side.
 *
 * Everything that changes from one step to the next (the draw, the recent
 * tokens and their count, the parameters) is read from device memory that
 * the host writes before the step (og_sample_cuda_step), never from launch
 * arguments, so a captured graph serves every step.
 *
 * What the device does not do: keep more than OG_SAMPLE_CUDA_MAX_K
 * candidates (temperature > 0 with top_k <= 0 or top_k > 1024, over a
 * vocabulary of more than 1024). og_sample_cuda_supported says which; for
 * those the executor copies the logits back and samples on the host.
 *
 * Letter legend: V vocabulary size, K candidates kept (<= 1024), P the
 * power of two >= K the candidates are sorted in, W = ceil(V / 32) bitmap
 * words.
 */
#ifndef OG_KERNELS_SAMPLE_CUDA_H
#define OG_KERNELS_SAMPLE_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/core.h"

#define OG_SAMPLE_CUDA_MAX_K 1024

/* One step's sampler inputs, in device memory. */
typedef struct og_sample_cuda_step {
    double uniform;        /* the draw in [0, 1) (og_sampler_peek_uniform)   */
    float temperature;     /* the og_sampler_params fields, as given         */
    float top_p, min_p, repeat_penalty;
    int32_t top_k;
    int32_t n_recent;      /* ids in recent[]; 0 when the penalty is off     */
    int32_t use_forbidden; /* 1: the forbidden bitmap rules ids out          */
} og_sample_cuda_step;

/* True when og_sample_cuda serves these parameters over V logits:
 * temperature <= 0, or at most OG_SAMPLE_CUDA_MAX_K candidates kept (top_k
 * when 0 < top_k < V, else V). */
bool og_sample_cuda_supported(float temperature, int32_t top_k, int64_t V);

/* Writes the chosen id to *token, or -1 when the step asks for more than
 * OG_SAMPLE_CUDA_MAX_K candidates (the host checks og_sample_cuda_supported
 * first). marks is scratch of W words that must be zero before the launch;
 * the kernel leaves it zero again. One block: launches of one stream must
 * not share marks concurrently. Refuses NULL buffers and V outside
 * [1, INT32_MAX] before enqueuing anything. */
og_status og_sample_cuda(void *stream, const float *logits /* [V] */, int64_t V,
                         const og_sample_cuda_step *step /* [1] */, const int32_t *recent /* [n_recent] */,
                         const uint32_t *forbidden /* [W] */, uint32_t *marks /* [W] */,
                         int32_t *token /* [1] */);

#ifdef __cplusplus
}
#endif
#endif /* OG_KERNELS_SAMPLE_CUDA_H */
