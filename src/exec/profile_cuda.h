/* Where a CUDA step's device time goes, launch step by launch step (built
 * only with CUDA).
 *
 * OG_CUDA_PROFILE=<file> in the environment (or "-" for standard error)
 * turns it on for every model loaded while it is set. Each launch step is
 * then followed by a CUDA event, inside the decode graphs too (captured as
 * external event nodes, so that a replay records them), and after each step
 * the time between consecutive events is charged to the label of the work
 * between them. When the model is freed, a table per step shape (sessions,
 * rows) is appended to the file: for each label (a product's K -> N and
 * weight dtype, an op's name) its launches a step, microseconds a step,
 * share of the step, and, for products, the weight bytes it read as GB/s.
 * A label's time is the device's from the end of the work before it to the
 * end of its own: kernels, and any wait of the device for the host between
 * them (a step without graphs launches one by one; a replay does not wait).
 */
#ifndef OG_EXEC_PROFILE_CUDA_H
#define OG_EXEC_PROFILE_CUDA_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* A model's tables. */
typedef struct og_cuda_profile og_cuda_profile;
/* The events and labels of one recording: a step run without a graph, or
 * one decode graph (its capture, then every replay). Owned by a step
 * context: one step at a time uses it. */
typedef struct og_cuda_marks og_cuda_marks;

/* *out = a profile writing to dest ("-": standard error), or NULL when dest
 * is NULL or empty. */
og_status og_cuda_profile_open(const char *dest, og_cuda_profile **out);
/* Appends the tables to the destination and frees p (NULL: no-op). */
void og_cuda_profile_close(og_cuda_profile *p);

/* *mk made (empty) when NULL; then at least `events` events made, since
 * none may be made during a capture. */
og_status og_cuda_marks_reserve(og_cuda_marks **mk, int32_t events);
void og_cuda_marks_free(og_cuda_marks *mk);
/* Starts a new recording: forgets the marks and records the first event on
 * `stream` (a cudaStream_t). */
og_status og_cuda_marks_start(og_cuda_marks *mk, void *stream);
/* Appends a mark: the work enqueued on the stream since the previous one is
 * `label`'s (copied; truncated at 63 characters), which read `bytes` of
 * weights (0: not a product). captured: the stream is capturing a graph
 * (the event becomes a node of it). */
og_status og_cuda_marks_add(og_cuda_marks *mk, void *stream, const char *label, uint64_t bytes, bool captured);
/* Records mark k again (-1: the first event) on the stream, outside any
 * capture: a replay's marks before and after its graph. */
og_status og_cuda_marks_again(og_cuda_marks *mk, void *stream, int32_t k);
/* The marks recorded (the first event not counted). */
int32_t og_cuda_marks_count(const og_cuda_marks *mk);

/* After a step's stream was synchronized: adds the times between mk's
 * events to p's table of steps of `sessions` sessions and `rows` rows. */
void og_cuda_profile_add(og_cuda_profile *p, const og_cuda_marks *mk, int32_t sessions, int32_t rows);

#endif
