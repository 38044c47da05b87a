/* update_and_attend on the CPU: the contract of DESIGN.md section 2.
 *
 * Letters:
 *   T    tokens in this step (query rows)
 *   Hq   query heads (n_heads)
 *   Hkv  key/value heads (kv.n_kv_heads); Hq % Hkv == 0, G = Hq / Hkv
 *   D    head dimension (kv.head_dim)
 *   L    committed length before the step (kv.length); the step's positions
 *        are L, L+1, ..., L+T-1
 *   R    allocated rows of the layer (kv.rows): flat capacity, or the ring's
 *        W + max_write - 1 slots
 *   W    sliding window of a ring layer (kv.window)
 *
 * Storage rows are og_kv_layer_view_row_stride(&kv) elements apart (kv.row_stride,
 * or Hkv * D when it is 0): in a packed block the stride is wider than the
 * layer's Hkv * D elements, and the elements between belong to other layers;
 * a kernel reads and writes only the layer's own Hkv * D of each row.
 *
 * A call first writes every token's k and v into the bound storage (flat: row
 * p; ring: row p mod R), then attends: the query at position p sees keys
 * 0..p (flat) or max(0, p-W+1)..p (ring); query head h reads kv head h / G.
 * Storage is bf16 or f32; dot products and sums accumulate in f32 with an
 * online softmax. Kernels never advance L: the caller commits the step.
 *
 * Kernels hold no memory between calls; the CPU version takes scratch for the
 * duration of one call.
 */
#ifndef OG_KERNELS_ATTEND_H
#define OG_KERNELS_ATTEND_H

#include "core/core.h"
#include "core/kv_quant.h"
#include "kernels/cpu_isa.h"

typedef struct og_attend_args {
    const float *q;           /* [T, Hq, D]  RoPE already applied            */
    const float *k, *v;       /* [T, Hkv, D] this step's keys and values     */
    const int32_t *positions; /* [T] or NULL; must be L, L+1, ..., L+T-1     */
    float *out;               /* [T, Hq, D]; must not overlap any other buffer */
    int32_t T, n_heads;       /* T, Hq                                        */
    float scale;              /* softmax scale; 0 -> 1/sqrt(D)                */
    og_kv_layer_view kv;      /* bound storage; kv.length is L                */
    /* int8 / fp8 storage: where kv's heads lie in a storage row ({0, 0}:
     * the whole row). A tensor-parallel shard (exec/backend_cpu_tp.c) binds
     * its heads [head0, head0 + Hkv) of rows of `heads`: kv.k and kv.v point
     * at head0's quants, kv.row_stride is the storage's, and each head's
     * scale stays where the whole row keeps it (core/kv_quant.h). bf16 and
     * f32 views need no part: their heads are contiguous elements. */
    og_kv_row_part kv_part;
} og_attend_args;

typedef struct og_attend_stats {
    int32_t splits; /* split-K partitions of the keys used, 1 = none */
    int32_t amx;    /* og_update_and_attend_cpu: 1 when the step ran on AMX tiles (attend_amx.h) */
} og_attend_stats;

/* Shared argument validation, done by every back end before any write.
 * Returns OG_OK or, with og_last_error() naming the problem:
 *   OG_ERR_UNBOUND           kv.k or kv.v is NULL
 *   OG_ERR_POSITION          positions[t] != L + t for some t
 *   OG_ERR_CAPACITY          flat layer and L + T > R
 *   OG_ERR_WRITE_TOO_WIDE    ring layer and T > R - W + 1 (its max_write)
 *   OG_ERR_UNSUPPORTED       storage dtype other than bf16 or f32
 *   OG_ERR_INVALID_ARGUMENT  anything else: NULL buffers, T < 1, sizes < 1,
 *                            Hq % Hkv != 0, 0 < kv.row_stride < Hkv * D,
 *                            a kv_part on bf16 / f32 storage, past its row's
 *                            heads or without the storage's row stride,
 *                            unknown dtype or policy, a ring
 *                            with W < 1 or R < W, a flat layer with W != 0,
 *                            L < 0, a non-finite scale, sizes that overflow. */
og_status og_attend_check(const og_attend_args *a);

/* The plain reference: loops, f32 accumulation, one online softmax per query
 * and head. Single-threaded, allocates nothing. */
og_status og_update_and_attend_ref(const og_attend_args *a);

/* Decode (T == 1) whose query sees n > OG_ATTEND_SPLIT_MIN_KEYS keys takes
 * the split-K (flash-decoding) path: the n visible keys are cut into
 * S = min(OG_ATTEND_MAX_SPLITS, ceil(n / OG_ATTEND_SPLIT_KEYS)) contiguous
 * splits of ceil(n / S) keys (the last one shorter), each split computes a
 * partial (max, sum, acc) per query head, and the partials are merged by
 * max-rescaling. S depends only on n, never on the thread count, so results
 * do not depend on the pool. Below the threshold one pass per query is as
 * fast: the keys of one kv head fit in cache and there is little to share. */
#define OG_ATTEND_SPLIT_MIN_KEYS 256
#define OG_ATTEND_SPLIT_KEYS 128
#define OG_ATTEND_MAX_SPLITS 64

/* The fast CPU kernel at the active instruction set (og_cpu_isa_active).
 * Work is spread over (query-row blocks x kv heads), or (kv heads x splits)
 * for split-K decode, through og_parallel_for on pool (NULL: the calling
 * thread alone). stats may be NULL. Allocates scratch for the call only;
 * OG_ERR_OUT_OF_MEMORY if it cannot, before anything is written.
 * A wide step over bf16 storage runs on AMX tiles where the CPU has them
 * (attend_amx.h: q and the softmax weights rounded to bf16;
 * OG_CPU_AMX_ATTEND=0 or OG_CPU_AMX=0 keeps it off). */
og_status og_update_and_attend_cpu(const og_attend_args *a, og_threadpool *pool,
                                   og_attend_stats *stats);
/* The vector kernel with a chosen instruction set, never the tiles (tests
 * and benchmarks); an isa the CPU lacks is refused with OG_ERR_UNSUPPORTED
 * before anything is written. */
og_status og_update_and_attend_cpu_isa(const og_attend_args *a, og_threadpool *pool,
                                       og_cpu_isa isa, og_attend_stats *stats);

/* First key position p sees under a ring window W (0: a flat layer sees
 * every earlier key): its visible keys are first .. p. */
static inline int64_t og_attend_first_key(int64_t W, int64_t p) { return W > 0 && p - W + 1 > 0 ? p - W + 1 : 0; }

#endif /* OG_KERNELS_ATTEND_H */
