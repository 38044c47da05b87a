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
 * Greedy (temperature <= 0) with NaN logits follows the host's scan too: a
 * NaN at id 0 is chosen, a NaN anywhere else is never chosen. Sampling with
 * a NaN among the values has no defined order on either side.
 *
 * The batched sampler (og_sample_batch_cuda) does the same for B rows of
 * logits in one launch, a cluster of blocks per row; what each row asks for (nothing,
 * the arg-max, or a draw with its own parameters and buffers) is read from a
 * table of og_sample_cuda_row in device memory, so one captured graph per B
 * serves any mix of sessions and choices: the host rewrites the table's
 * contents (and the buffers it points to) before each replay.
 *
 * Letter legend: V vocabulary size, K candidates kept (<= 1024), P the
 * power of two >= K the candidates are sorted in, W = ceil(V / 32) bitmap
 * words, B rows of a batch.
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
 * the kernel leaves it zero again. One launch: launches of one stream must
 * not share marks concurrently. Refuses NULL buffers and V outside
 * [1, INT32_MAX] before enqueuing anything. */
og_status og_sample_cuda(void *stream, const float *logits /* [V] */, int64_t V,
                         const og_sample_cuda_step *step /* [1] */, const int32_t *recent /* [n_recent] */,
                         const uint32_t *forbidden /* [W] */, uint32_t *marks /* [W] */,
                         int32_t *token /* [1] */);

/* ---- the batched sampler ---- */

/* What a row of og_sample_batch_cuda outputs. */
enum {
    OG_SAMPLE_ROW_NONE = 0,   /* no token: writes -1                            */
    OG_SAMPLE_ROW_ARGMAX = 1, /* og_argmax_cuda's index of the raw logits       */
    OG_SAMPLE_ROW_SAMPLE = 2  /* og_sample_cuda's token for step and buffers    */
};

/* One row's descriptor, in device memory (72 bytes, 8-aligned; the layout is
 * the same for C and CUDA). The pointers are device addresses; each may
 * change from one replay to the next. What a SAMPLE row needs:
 *  - recent: [step.n_recent] ids, read when step.repeat_penalty != 1 and
 *    step.n_recent > 0 (as og_sample_cuda's recent);
 *  - forbidden: [W] bitmap, read when step.use_forbidden != 0; rows may share
 *    one (it is only read);
 *  - marks: [W] words of scratch, zero before the launch and left zero, used
 *    when recent is: the row's own (no other row of the launch, nor any
 *    concurrent launch, may use the same words). og_sample_cuda_marks_bytes
 *    gives the size; the executor can keep one [B_max, W] array, zeroed once.
 * A SAMPLE row that needs a buffer it does not name (NULL) gets -1, as does
 * one over the device's limits (og_sample_cuda_supported false). NONE and
 * ARGMAX rows read nothing but mode (ARGMAX ignores step, penalty and
 * forbidden ids: it is the plain arg-max of the logits); an unknown mode
 * gets -1. */
typedef struct og_sample_cuda_row {
    int32_t mode;             /* OG_SAMPLE_ROW_*                     */
    int32_t reserved;         /* unused; write 0                     */
    og_sample_cuda_step step; /* SAMPLE rows: this step's inputs     */
    const int32_t *recent;    /* [step.n_recent] or NULL             */
    const uint32_t *forbidden; /* [W] or NULL                        */
    uint32_t *marks;          /* [W] or NULL, zero between launches  */
} og_sample_cuda_row;

/* Bytes of one row's marks scratch over V logits: ceil(V / 32) words. */
size_t og_sample_cuda_marks_bytes(int64_t V);

/* For each row b < B of logits [B, V] (row b at logits + b * V), writes
 * tokens[b]: -1 for NONE rows (and for rows refused as above), the arg-max
 * for ARGMAX rows (torch.argmax: the first maximum, the first NaN above
 * every number; exactly og_argmax_cuda's), and for SAMPLE rows exactly the
 * token og_sample_cuda gives for that row alone (hence og_sampler_sample's).
 * One launch (a cluster of blocks a row), no allocation, no host synchronization: it can be
 * captured in a graph, and B and the addresses of logits, rows and tokens
 * are the only launch arguments. Rows where og_sample_cuda_supported is
 * false (temperature > 0 keeping more than OG_SAMPLE_CUDA_MAX_K
 * candidates) get -1: for those the executor copies the row's logits back
 * (or keeps them on the device for a later copy) and samples on the host
 * with og_sampler_sample, which also advances the sampler; for every other
 * SAMPLE row it calls og_sampler_commit with the token. Refuses NULL
 * buffers, V outside [1, INT32_MAX] and B < 1 before enqueuing anything. */
og_status og_sample_batch_cuda(void *stream, const float *logits /* [B, V] */, int64_t V, int32_t B,
                               const og_sample_cuda_row *rows /* [B], device */, int32_t *tokens /* [B], device */);

/* ---- the allowed-token masks (og_batch_item.allowed) ---- */

/* For each row b < B of logits [B, V] with mask_of[b] = k > 0: logits[b, i]
 * = -infinity for every i whose bit (i % 32 of word i / 32) is clear in mask
 * k - 1 (masks + (k - 1) * W); rows with mask_of[b] <= 0 and the allowed
 * values are left as they are. Exactly og_logits_mask (exec/sample.h) on
 * each such row. The executor launches it before og_sample_batch_cuda,
 * inside a decode graph: mask_of and masks live at fixed device addresses
 * (B, V and the three addresses are the only launch arguments) and the host
 * rewrites their contents before each replay, so masks that change never
 * re-capture. Rows may share a mask. One launch, no allocation, no host
 * synchronization. Refuses NULL buffers, V outside [1, INT32_MAX] and B < 1
 * before enqueuing anything. */
og_status og_mask_logits_cuda(void *stream, float *logits /* [B, V], device */, int64_t V, int32_t B,
                              const int32_t *mask_of /* [B], device */,
                              const uint32_t *masks /* [max mask_of, W], device */);

#ifdef __cplusplus
}
#endif
#endif /* OG_KERNELS_SAMPLE_CUDA_H */
