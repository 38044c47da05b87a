/* Where a CUDA step's device time goes, launch step by launch step (built
 * only with CUDA).
 *
 * OG_CUDA_PROFILE=<file> in the environment (or "-" for standard error)
 * turns it on for every model loaded while it is set. Each step of such a
 * model then runs without graphs (a replay is one unit to the events), one
 * step of the model at a time, and every launch step between two marks is
 * bracketed by CUDA events. When the model is freed, a table per step shape
 * (sessions, rows) is appended to the file: for each label (a product's
 * shape and weight dtype, an op's name) its launches a step, microseconds a
 * step, share of the step, and, for products, the weight bytes it read as
 * GB/s. Kernel times are the device's; what the graphs save (launch gaps)
 * and the host's share of a step are what `offgraph bench` reports beside.
 */
#ifndef OG_EXEC_PROFILE_CUDA_H
#define OG_EXEC_PROFILE_CUDA_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct og_cuda_profile og_cuda_profile;

/* *out = a profile writing to dest ("-": standard error), or NULL when dest
 * is NULL or empty. */
og_status og_cuda_profile_open(const char *dest, og_cuda_profile **out);
/* Appends the tables to the destination and frees p (NULL: no-op). */
void og_cuda_profile_close(og_cuda_profile *p);

/* Starts a step of `sessions` sessions and `rows` rows on `stream` (a
 * cudaStream_t): records the first event. Holds the profile until
 * og_cuda_profile_end, which must follow whatever happens. */
og_status og_cuda_profile_begin(og_cuda_profile *p, void *stream, int32_t sessions, int32_t rows);
/* Charges the device work enqueued on the stream since the previous mark
 * (or the begin) to `label` (copied; truncated at 63 characters), which read
 * `bytes` of weights (0: not a product). */
og_status og_cuda_profile_mark(og_cuda_profile *p, void *stream, const char *label, uint64_t bytes);
/* Ends the step after its stream was synchronized: adds its times to the
 * tables when ok, drops them when the step failed. */
void og_cuda_profile_end(og_cuda_profile *p, bool ok);

#endif
