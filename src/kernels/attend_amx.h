/* Attention of wide steps over bf16 storage on AMX tiles: the products
 * S = Q K^T and O += P V by TDPBF16PS (bf16 operands, products exact in f32,
 * f32 accumulation), the online softmax per query row in f32 with AVX-512.
 * Internal to src/kernels: og_update_and_attend_cpu (attend_cpu.c) takes this
 * path for a step that og_attend_amx_usable accepts, after writing the
 * step's k and v into storage as for any other step.
 *
 * What differs from the vector kernel: each query row is rounded to bf16
 * before its scores, and the softmax weights p = exp(s - m) are rounded to
 * bf16 before they multiply the values (l sums the rounded weights, so the
 * output stays a convex combination of the values); tests/test_attend_amx.c
 * bounds the difference this makes.
 *
 * Letters: T tokens, Hq / Hkv heads, G = Hq / Hkv, D head dim. */
#ifndef OG_KERNELS_ATTEND_AMX_H
#define OG_KERNELS_ATTEND_AMX_H

#include "kernels/attend.h"

#include <stdbool.h>
#include <stddef.h>

/* The tile path takes a step only when it has at least this many query rows
 * per kv head (T * G): fewer fill the 32-row tile blocks poorly, and the
 * keys are packed once per call for all rows (decode stays on the vector
 * kernel, with its split-K). */
#define OG_ATTEND_AMX_MIN_ROWS 32
/* ... and at most this many visible keys per such row: the keys are packed
 * into a buffer taken for the call (written, then read by every item), which
 * few rows do not repay over a long history. Attention alone, one thread,
 * 16 / 8 heads of 128: 32 rows over 2000 keys 1.9x the vector kernel, over
 * 8000 1.2x, over 30000 0.7x; 128 rows over 30000 1.5x. */
#define OG_ATTEND_AMX_KEYS_PER_ROW 256
/* Head dims the tile path takes: multiples of 32 (one tile row of bf16) up
 * to this. */
#define OG_ATTEND_AMX_MAX_D 256
/* Most bytes of packed keys and values (all kv heads, the step's visible
 * keys) one call may take; longer histories stay on the vector kernel. */
#define OG_ATTEND_AMX_MAX_PACK ((size_t)512 << 20)

/* True when the tile path can take the step a (already through
 * og_attend_check): AMX usable here (og_cpu_has_amx_bf16, so OG_CPU_AMX=0
 * turns this off too), the environment does not say OG_CPU_AMX_ATTEND=0,
 * og_attend_amx_allow has not turned it off, bf16 storage, D a multiple of
 * 32 up to OG_ATTEND_AMX_MAX_D, T * G >= OG_ATTEND_AMX_MIN_ROWS, the
 * visible keys at most T * G * OG_ATTEND_AMX_KEYS_PER_ROW and the packed
 * keys within OG_ATTEND_AMX_MAX_PACK. */
bool og_attend_amx_usable(const og_attend_args *a);
/* Tests and benchmarks: false keeps the tile path off (process-wide) so the
 * vector kernel can be checked or measured beside it. */
void og_attend_amx_allow(bool allow);

/* Bytes of scratch og_attend_amx_run needs for a with n_threads threads. */
size_t og_attend_amx_scratch_bytes(const og_attend_args *a, int n_threads);
/* Attends step a (og_attend_amx_usable true) whose k and v rows are already
 * in storage, into a->out; scratch holds og_attend_amx_scratch_bytes(a,
 * og_threadpool_size(pool)) bytes. */
void og_attend_amx_run(const og_attend_args *a, og_threadpool *pool, void *scratch);

#endif /* OG_KERNELS_ATTEND_AMX_H */
