/* CUDA kernels of every instruction, callable from C.
 *
 * Every function takes `stream` (a cudaStream_t passed as void *, NULL = the
 * legacy default stream) and device pointers; it validates its arguments on
 * the host, enqueues its kernels on the stream and checks the launch
 * (cudaGetLastError). It returns OG_OK or a status with og_last_error()
 * naming what was wrong: OG_ERR_INVALID_ARGUMENT / OG_ERR_UNSUPPORTED before
 * anything is enqueued, OG_ERR_BACKEND when a launch fails. Nothing here
 * allocates: scratch is the caller's. Work is asynchronous: results are
 * ready once the stream reaches them.
 *
 * Numerics follow the CPU references of kernels/ops.h and kernels/attend.h:
 * f32 activations, bf16 or f32 weights and KV storage, f32 accumulation.
 * Embedding tables and product weights may also be quantized (q8, q4: the
 * layout at OG_QUANT_GROUP in offgraph.h, element = f32(f16 scale) * q);
 * such a tensor must be 16-byte aligned (cudaMalloc'd ones are), and a
 * bias beside it is f32 (og_bias_dtype).
 *
 * Letter legend (shape comments on buffers):
 *   T    tokens of the step           K   in features of a matmul
 *   N    out features / row width     V   vocabulary size
 *   H    hidden size                  F   ffn (intermediate) size
 *   D    head dim                     n   heads packed in one row ([T, n*D])
 *   Hq   query heads                  Hkv key/value heads, G = Hq / Hkv
 *   L    committed KV length before the step
 *   R    allocated rows of a KV layer (flat capacity, or a ring's slots)
 *   W    sliding window of a ring layer
 *   S    split-K partitions of a query's visible keys
 */
#ifndef OG_KERNELS_OPS_CUDA_H
#define OG_KERNELS_OPS_CUDA_H

#ifdef __cplusplus
extern "C" { /* core.h has no C++ guard of its own */
#endif

#include "core/core.h"

/* ---- devices ---- */

/* True when the CUDA runtime finds at least one device. Never fails: a
 * missing driver counts as no device (and clears the runtime's error). */
bool og_cuda_device_present(void);

/* ---- embed: out[t] = table[tokens[t]] ----
 * tokens are on the device and must already be checked against [0, V) by the
 * caller (the host holds them before they are uploaded). A q8/q4 table gives
 * the exact f32 values scale * q, as og_dequantize_row. */
og_status og_embed_cuda(void *stream, const int32_t *tokens /* [T] */, int64_t T,
                        const void *table /* [V, H] */, og_dtype table_dtype, int64_t V, int64_t H,
                        float *out /* [T, H] */);

/* ---- rms_norm of rows of N, and of every head of D (q/k norm) ----
 * out may equal x. */
og_status og_rms_norm_cuda(void *stream, const float *x /* [T, N] */, const void *weight /* [N] */,
                           og_dtype weight_dtype, int64_t T, int64_t N, float eps,
                           float *out /* [T, N] */);
og_status og_head_rms_norm_cuda(void *stream, const float *x /* [T, n*D] */,
                                const void *weight /* [D] */, og_dtype weight_dtype, int64_t T,
                                int64_t n, int64_t D, float eps, float *out /* [T, n*D] */);

/* ---- fused: residual add + rms_norm; head rms_norm + rope ----
 * og_add_rms_norm_cuda writes sum = a + b and out = rms_norm(sum) in one
 * pass: the add that ends a sublayer and the norm that starts the next. The
 * results equal og_add_cuda then og_rms_norm_cuda. sum and out must not
 * overlap a or b. out_bf16, when not NULL, also gets out rounded to bf16
 * (og_split_bf16_cuda's hi: the input of a tensor-core product, without a
 * split launch).
 * og_head_norm_rope_cuda applies og_head_rms_norm_cuda then og_rope_cuda to
 * every head of D (q/k norm before RoPE) without writing the normed heads;
 * the results equal the two kernels in turn. out may equal x. */
og_status og_add_rms_norm_cuda(void *stream, const float *a /* [T, N] */, const float *b /* [T, N] */,
                               const void *weight /* [N] */, og_dtype weight_dtype, int64_t T, int64_t N,
                               float eps, float *sum /* [T, N] */, float *out /* [T, N] */,
                               uint16_t *out_bf16 /* [T, N] or NULL */);
og_status og_head_norm_rope_cuda(void *stream, const float *x /* [T, n*D] */, const void *weight /* [D] */,
                                 og_dtype weight_dtype, const float *inv_freq /* [D/2] */,
                                 const int32_t *positions /* [T] */, int64_t T, int64_t n, int64_t D, float eps,
                                 float *out /* [T, n*D] */);

/* Two head norm + rope applications (e.g. a layer's q and k heads) in one
 * launch, each job computed exactly as og_head_norm_rope_cuda would. */
typedef struct og_head_norm_rope_cuda_job {
    const float *x;        /* [T, n*D] */
    const void *weight;    /* [D]      */
    og_dtype weight_dtype;
    const float *inv_freq; /* [D/2]    */
    int64_t n, D;
    float eps;
    float *out;            /* [T, n*D] */
} og_head_norm_rope_cuda_job;
og_status og_head_norm_rope_multi_cuda(void *stream, const og_head_norm_rope_cuda_job *jobs /* [n_jobs] */,
                                       int n_jobs /* 1 or 2 */, const int32_t *positions /* [T] */, int64_t T);

/* ---- rope (rotate_half), inv_freq on the device ----
 * inv_freq is [D/2] f32 (og_rope_table.inv_freq uploaded). out may equal x. */
og_status og_rope_cuda(void *stream, const float *inv_freq /* [D/2] */, int64_t D,
                       const float *x /* [T, n*D] */, const int32_t *positions /* [T] */, int64_t T,
                       int64_t n, float *out /* [T, n*D] */);

/* ---- swiglu: out = silu(gate) * up; add: out = a + b ----
 * out_bf16, when not NULL, also gets out rounded to bf16 (as og_add_rms_norm_cuda's). */
og_status og_swiglu_cuda(void *stream, const float *gate /* [T, F] */, const float *up /* [T, F] */,
                         int64_t count /* T * F */, float *out /* [T, F] */, uint16_t *out_bf16 /* [T, F] or NULL */);
og_status og_add_cuda(void *stream, const float *a /* [n] */, const float *b /* [n] */, int64_t count,
                      float *out /* [n] */);

/* ---- matmul: out = x @ weight^T (+ bias) ----
 * weight [N, K] row-major (bf16 or f32), bias NULL or [N] of the same dtype.
 * og_gemv_cuda streams the weights once for up to OG_GEMV_CUDA_MAX_T rows,
 * with the CPU's numerics (f32 x, f32 accumulation).
 * Quantized weights (q8, q4; K a multiple of OG_QUANT_GROUP, f32 bias) are
 * read as words of 4 quants (a warp reads contiguous bytes of quants and of
 * x) and turned into floats in registers; each lane sums its 4 products
 * x * q in f32 and scales that once (acc += scale * sum), which differs
 * from the reference's sum of x * (scale * q) by rounding only. x must be
 * 16-byte aligned with them. Every gemv entry point below takes them, the
 * fused ones included, with the same bits as the plain one. */
#define OG_GEMV_CUDA_MAX_T 8
og_status og_gemv_cuda(void *stream, const float *x /* [T, K] */, const void *weight /* [N, K] */,
                       const void *bias /* [N] or NULL */, og_dtype weight_dtype, int64_t T, int64_t K,
                       int64_t N, float *out /* [T, N] */);

/* Several products of one x in one launch (e.g. q, k and v projections):
 * part i is out_i = x @ weight_i^T (+ bias_i), each as og_gemv_cuda computes
 * it (the same bits). Every weight has the same dtype and K. */
#define OG_GEMV_CUDA_MAX_PARTS 4
typedef struct og_gemv_cuda_part {
    const void *weight; /* [N, K] */
    const void *bias;   /* [N] or NULL */
    int64_t N;
    float *out;         /* [T, N] */
} og_gemv_cuda_part;
og_status og_gemv_multi_cuda(void *stream, const float *x /* [T, K] */, og_dtype weight_dtype, int64_t T, int64_t K,
                             const og_gemv_cuda_part *parts /* [n_parts] */, int n_parts);

/* SwiGLU fused into the gate/up products: out = silu(x @ w_gate^T + b_gate)
 * * (x @ w_up^T + b_up), gate and up computed as og_gemv_cuda does and never
 * written. Biases may be NULL. out must not overlap x. */
og_status og_gemv_swiglu_cuda(void *stream, const float *x /* [T, K] */, const void *w_gate /* [F, K] */,
                              const void *b_gate /* [F] or NULL */, const void *w_up /* [F, K] */,
                              const void *b_up /* [F] or NULL */, og_dtype weight_dtype, int64_t T, int64_t K,
                              int64_t F, float *out /* [T, F] */);

/* The residual add + rms_norm before a product, folded into the gemv: with
 * norm set, x is not read; the product's input is rms_norm(a + b) (weight,
 * eps) and sum = a + b is written, both with the bits og_add_rms_norm_cuda
 * gives (the normed rows themselves are not written). Taken while T x K is
 * at most 2048, or 4096 for the q8 / q4 products of gemv_q.cu
 * (og_gemv_cuda_norm_fits: past that each block's own norm pass costs more
 * than the launch it saves). sum must not overlap a, b or an output. */
typedef struct og_gemv_cuda_norm {
    const float *a, *b;   /* [T, K] */
    const void *weight;   /* [K]    */
    og_dtype weight_dtype;
    float eps;
    float *sum;           /* [T, K] */
} og_gemv_cuda_norm;
bool og_gemv_cuda_norm_fits(og_dtype weight_dtype, int64_t T, int64_t K);
/* og_gemv_multi_cuda and og_gemv_swiglu_cuda with an optional norm prologue
 * (norm NULL: x is the input, exactly as those two). */
og_status og_gemv_norm_multi_cuda(void *stream, const float *x /* [T, K] or NULL */, const og_gemv_cuda_norm *norm,
                                  og_dtype weight_dtype, int64_t T, int64_t K,
                                  const og_gemv_cuda_part *parts /* [n_parts] */, int n_parts);
og_status og_gemv_norm_swiglu_cuda(void *stream, const float *x /* [T, K] or NULL */, const og_gemv_cuda_norm *norm,
                                   const void *w_gate, const void *b_gate, const void *w_up, const void *b_up,
                                   og_dtype weight_dtype, int64_t T, int64_t K, int64_t F, float *out /* [T, F] */);

/* Products of a narrow batch (gemm_narrow.cu): out_i = x @ weight_i^T
 * (+ bias_i) for every part, bf16 x (og_split_bf16_cuda's hi), weights of
 * one dtype: bf16 (bf16 biases), q8 or q4 (f32 biases; the quants times
 * their scales, as the gemv reads them); f32 sums; 1 <= T <=
 * OG_GEMM_NARROW_CUDA_MAX_T, K a multiple of 64, x and the weights 16-byte
 * aligned (og_gemm_narrow_cuda_takes). The weights are streamed once for
 * all T rows, K split across the blocks of a cluster where a launch has few
 * tiles. A row's bits depend on the weights, K and the parts' shapes, not
 * on T or the other rows. Past the gemv's rows, the steps of a q8 / q4
 * program with bf16 activations take it for every product unless
 * OG_CUDA_NARROW=0; the steps of a bf16 program take it for the products
 * of several parts one of which is at most OG_GEMM_NARROW_CUDA_THIN
 * features wide (the q, k, v of grouped-query attention, whose k and v
 * cuBLAS covers with too few tiles: one launch where cuBLAS took three; an
 * 8B model's 64-session step 2 - 6 % faster on an H100, see
 * bench/gpu/notes.md), or for every product of several parts (gate, up
 * too) where OG_CUDA_NARROW=1 asks (og_gemm_narrow_cuda_wanted);
 * OG_CUDA_NARROW_SPLITS=1, 2, 4 or 8 forces the blocks a tile
 * (measurements; og_gemm_narrow_cuda_set_splits overrides it, 0 restores
 * the choice by shape, -1 the environment's). */
#define OG_GEMM_NARROW_CUDA_MAX_T 64
#define OG_GEMM_NARROW_CUDA_THIN 2048
bool og_gemm_narrow_cuda_wanted(og_dtype weight_dtype, const og_gemv_cuda_part *parts, int n_parts);
void og_gemm_narrow_cuda_set_splits(int splits);
bool og_gemm_narrow_cuda_takes(const uint16_t *x, og_dtype weight_dtype, int64_t T, int64_t K,
                               const og_gemv_cuda_part *parts, int n_parts);
og_status og_gemm_narrow_cuda(void *stream, const uint16_t *x /* [T, K] bf16 */, og_dtype weight_dtype, int64_t T,
                              int64_t K, const og_gemv_cuda_part *parts /* [n_parts] */, int n_parts);

/* The bandwidth-first kernel for q8 / q4 decode products (gemv_q.cu: 16-byte
 * weight loads, 8 in flight a lane from the kernel's start to its end, x
 * staged in shared memory as two int8 terms a value and multiplied by
 * __dp4a; T <= 8 and the terms within 110 KB), taken by every gemv entry
 * point above when its mode says: 2, the default, at one row of x, and at
 * two where K >= 4096 (where it was faster on an H100; from four rows the
 * tensor-core kernel mostly is); 1 at every T (OG_CUDA_GEMVQ=ring); 0 never
 * (OG_CUDA_GEMVQ=0 or off). The environment is read at the first call;
 * og_gemvq_cuda_set sets the mode (tests, benchmarks) and returns the
 * previous one. x's terms carry it within 1/64516 of its group's largest
 * |x| (test_ops_cuda's tolerance for these products: 4e-5 sqrt(K)), and
 * the fused forms give the bits of the plain one. */
int og_gemvq_cuda_get(void);
int og_gemvq_cuda_set(int mode);

/* The split-K tensor-core products for bf16 weights (off by default;
 * OG_CUDA_GEMV_SPLIT=1 turns them on for every gemv entry point above):
 * a tile's K is split among 1, 2 or 4 blocks of a
 * thread-block cluster (chosen from the launch's shape, or forced by
 * OG_CUDA_GEMV_SPLITS), the sum's bits independent of that count
 * (src/kernels/cuda/gemv_tc.cu). For tests and benchmarks,
 * og_gemv_cuda_set_split overrides the environment for the launches that
 * follow (not thread-safe: call it between launches): mode -1 back to the
 * environment's settings, 0 off, 1 on; splits 0 chosen from the shape, or
 * 1, 2, 4; ring_kb > 0 caps a block's rings of weights in flight at that
 * many KB. */
void og_gemv_cuda_set_split(int mode, int splits, int ring_kb);

/* Rows row0 .. row0 + rows - 1 of a quantized [N, K] weight (q8 or q4) as
 * f32, the exact values scale * q (og_dequantize_row's): the weight panel a
 * cuBLAS product of a wide step reads. out 16-byte aligned. */
og_status og_dequantize_cuda(void *stream, const void *weight /* [N, K] */, og_dtype weight_dtype, int64_t N,
                             int64_t K, int64_t row0, int64_t rows, float *out /* [rows, K] */);

/* The same rows of a q8, q4 or k-quant weight as bf16 hi = bf16(w) and lo =
 * bf16(w - hi), both rounded to nearest (w to within 2^-16 |w|): the panels
 * of the two tensor-core products that take quantized weights in the
 * prefill of a bf16 program. hi and lo [rows, K], 16-byte aligned. */
og_status og_dequantize_split_cuda(void *stream, const void *weight /* [N, K] */, og_dtype weight_dtype, int64_t N,
                                   int64_t K, int64_t row0, int64_t rows, uint16_t *hi, uint16_t *lo);

/* Splits f32 x into hi = bf16(x) and lo = bf16(x - hi), so that two bf16
 * products W.hi + W.lo carry x to about 2^-16 relative (tensor-core prefill). */
og_status og_split_bf16_cuda(void *stream, const float *x /* [count] */, int64_t count,
                             uint16_t *hi /* [count] */, uint16_t *lo /* [count] */);
/* out[t, j] = bias[j] for every row (bf16 or f32 bias). */
og_status og_fill_rows_cuda(void *stream, const void *bias /* [N] */, og_dtype dtype, int64_t T, int64_t N,
                            float *out /* [T, N] */);

/* ---- argmax of one row, like torch.argmax: first maximum wins, NaN is
 * larger than any number (the first NaN wins). scratch is device memory of
 * og_argmax_cuda_scratch_bytes() (contents need no setup). ---- */
size_t og_argmax_cuda_scratch_bytes(void);
og_status og_argmax_cuda(void *stream, const float *x /* [V] */, int64_t V, int32_t *index /* [1] */,
                         void *scratch);

/* ---- update_and_attend (DESIGN.md section 2) ----
 * Writes this step's k and v into the bound storage (flat: row p, ring:
 * row p mod R), then every query row t (position p = L + t) attends to its
 * visible keys: flat 0..p, ring max(0, p-W+1)..p; query head h reads kv head
 * h / G, and every kv head is read once for all G query heads of its group.
 *
 * Two kernels (attend.cu and the files it names say how each works):
 *  - tiled, on the tensor cores, for prefill: T > 1 over bf16 storage with D
 *    of 16, 32, 64 or 128 (og_attend_cuda_tiled). q is carried as bf16 hi +
 *    lo, the softmax weights p are rounded to bf16 for P x V (f32 sums): an
 *    output is off by at most 2^-8 max|v| from the exact f32 mix.
 *  - split-K (flash-decoding) otherwise, or when split_k is set, in one
 *    launch: keys are cut into S splits; each split leaves a partial (max,
 *    sum, acc) per query head, and the last split of a row to finish merges
 *    them by max-rescaling. S follows the live key count n of the row, never
 *    the capacity: S = min(og_attend_cuda_max_splits(...), ceil(n /
 *    OG_ATTEND_CUDA_SPLIT_KEYS)), then reduced so that no split is empty.
 *    The most splits come from T, the heads and the SM count (about one wave
 *    of blocks at long histories), not from L. Rows with S == 1 are written
 *    directly. The grid is sized for the most splits and blocks past a row's
 *    S return at once, so one launch shape serves every L (graph replay).
 *    Storage rows of the step are written by the attend kernel itself.
 *
 * L is read on the device from *length when it is not NULL (graph replay
 * writes it before each step), else taken from kv.length. Storage rows are
 * og_kv_layer_view_row_stride(&kv) elements apart (a packed block's rows
 * hold other layers' elements between this layer's rows, never touched);
 * the stride must be a multiple of 16 bytes. The caller
 * guarantees what the planner checks (T <= max_write, a flat write inside
 * the allocated rows); the host check refuses D that is not a power of two
 * in [8, 256], Hq % Hkv != 0 and other malformed arguments.
 *
 * The partials scratch starts with one counter per (row, kv head, head
 * chunk): it must be zeroed once after allocation (cudaMemset), and every
 * step leaves its counters zero again. Steps on one scratch run one after
 * another (one stream) and share one Hq (a step of larger Hq would count on
 * floats of a smaller one's partials). */
#define OG_ATTEND_CUDA_SPLIT_KEYS 128
#define OG_ATTEND_CUDA_MAX_SPLITS 128
#define OG_ATTEND_CUDA_SPLIT_ROWS 256 /* T x S budget of one step */

typedef struct og_attend_cuda_args {
    const float *q;        /* [T, Hq, D]  RoPE already applied            */
    const float *k, *v;    /* [T, Hkv, D] this step's keys and values     */
    float *out;            /* [T, Hq, D]                                   */
    int32_t T, n_heads;    /* T, Hq                                        */
    float scale;           /* softmax scale; 0 -> 1/sqrt(D)                */
    og_kv_layer_view kv;   /* bound device storage; kv.length is L unless length is set */
    const int64_t *length; /* device L, or NULL                            */
    float *partials;       /* scratch of og_attend_cuda_scratch_floats(Hq, D) floats, zeroed once */
    bool split_k;          /* the split-K kernel even where the tiled one applies (tests, benchmarks) */
    uint16_t *out_bf16;    /* [T, Hq, D] out rounded to bf16 too (og_split_bf16_cuda's hi), or NULL; only
                            * where the tiled kernel runs (og_attend_cuda_tiled and not split_k) */
} og_attend_cuda_args;

/* Most splits one row of a T-token step over Hq / Hkv heads may use on a
 * device of sm_count SMs (cudaDevAttrMultiProcessorCount). */
int32_t og_attend_cuda_max_splits(int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count);
/* The scratch floats og_update_and_attend_cuda needs for Hq heads of D. */
int64_t og_attend_cuda_scratch_floats(int32_t n_heads, int32_t head_dim);
/* True when a step of T tokens over storage of kv_dtype with heads of
 * head_dim runs the tiled tensor-core kernel (unless split_k is set). */
bool og_attend_cuda_tiled(int32_t T, og_dtype kv_dtype, int32_t head_dim);
/* The split count the kernel uses for a row that sees n keys in a T-token
 * step (arguments as og_attend_cuda_max_splits). */
int32_t og_attend_cuda_splits(int64_t n, int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count);

og_status og_update_and_attend_cuda(void *stream, const og_attend_cuda_args *a);

/* The split-K kernel of steps over storage and heads that
 * og_attend_cuda_decode_mma accepts (bf16, int8 and fp8 with heads of 64 or
 * 128), single-session and batched: on the CUDA cores (SIMT: per-lane dot
 * products reduced by shuffles) or on the tensor cores (MMA: mma.sync; bf16
 * storage with q and the softmax weights carried as bf16 hi + lo, each kept
 * to ~2^-16; int8 / fp8 storage with the quants as exact f16 operands and q
 * and the weights as f16 hi + lo, ~2^-22; same grid, splits, scratch and
 * storage write). Other storage and head dims always run on the CUDA cores.
 * The choice is the process's: read from the environment variable
 * OG_CUDA_ATTEND ("simt"; anything else or unset: mma) at the first call, or
 * set by og_attend_cuda_set_decode (tests, benchmarks; it returns the
 * previous choice). A graph captured earlier keeps the kernel it captured. */
typedef enum og_attend_cuda_decode { OG_ATTEND_CUDA_SIMT = 0, OG_ATTEND_CUDA_MMA = 1 } og_attend_cuda_decode;
og_attend_cuda_decode og_attend_cuda_get_decode(void);
og_attend_cuda_decode og_attend_cuda_set_decode(og_attend_cuda_decode d);
/* int8 / fp8 storage under the MMA choice: the tensor-core kernel that
 * dequantizes in registers (QUANT_MMA, the default), the CUDA cores
 * (QUANT_SIMT: og_attend_cuda_decode_mma is then false for those formats),
 * or the earlier tensor-core variant that widens each tile to bf16 in shared
 * memory (QUANT_WIDEN). Read from OG_CUDA_ATTEND_QMMA ("0": SIMT, "widen":
 * WIDEN, anything else or unset: MMA) at the first call, or set by
 * og_attend_cuda_set_quant_decode (returns the previous choice). */
typedef enum og_attend_cuda_quant_decode {
    OG_ATTEND_CUDA_QUANT_SIMT = 0,
    OG_ATTEND_CUDA_QUANT_MMA = 1,
    OG_ATTEND_CUDA_QUANT_WIDEN = 2
} og_attend_cuda_quant_decode;
og_attend_cuda_quant_decode og_attend_cuda_get_quant_decode(void);
og_attend_cuda_quant_decode og_attend_cuda_set_quant_decode(og_attend_cuda_quant_decode d);
/* True when the tensor-core split-K kernel serves storage of kv_dtype with heads of head_dim. */
bool og_attend_cuda_decode_mma(og_dtype kv_dtype, int32_t head_dim);
/* Keys a split takes before the next is opened, in place of
 * OG_ATTEND_CUDA_SPLIT_KEYS (keys < 1 restores it; returns the previous
 * value), for every later launch of the process, single-session and
 * batched: a benchmark's knob (bench_attend_cuda sweeps it). The grid's
 * depth and the scratch do not depend on it (a row never takes more splits
 * than the depth), so any value is safe; og_attend_cuda_splits counts with it. */
int32_t og_attend_cuda_get_split_keys(void);
int32_t og_attend_cuda_set_split_keys(int32_t keys);

/* ---- batched decode update_and_attend (DESIGN.md section 7) ----
 * One layer of a step in which each of B sessions decodes one token: entry b
 * of a device table holds session b's storage and geometry, and row b of q,
 * k, v, out is its token. Per entry, exactly the contract above for T = 1:
 * k and v are written to slot L (flat) or L mod R (ring), then the query at
 * position L attends to keys 0..L (flat) or max(0, L-W+1)..L (ring), GQA,
 * f32 accumulation, split-K partials merged by max-rescaling.
 *
 * The kernel reads the table on the device when it runs, never the host: the
 * launch depends only on (B, Hq, Hkv, D, kv_dtype, policy, scale, max_keys,
 * the addresses of q, k, v, out, seqs, partials), so one captured graph per
 * batch size serves any mix of sessions: the host rewrites the table
 * (cudaMemcpyAsync before the replay, on the same stream) when sessions
 * join, leave, grow or move. Split-K follows each entry's live key count n
 * inside the kernel: S_b = splits of n as og_attend_cuda_splits counts them
 * (one per OG_ATTEND_CUDA_SPLIT_KEYS keys, none empty), at most the grid's
 * depth og_attend_batch_cuda_max_splits(B, Hq, Hkv, max_keys, sm_count);
 * the grid is (B, Hkv x head chunks, depth) and blocks past an entry's S_b
 * leave at once. max_keys only shapes the grid: an entry that sees more keys
 * is still exact (its splits are longer).
 *
 * Entries: T = 0 marks a padded entry: nothing of it is read or written (its
 * out row keeps what it held). An entry whose geometry breaks what the
 * planner guarantees (T not 0 or 1, NULL or misaligned storage, L < 0, a row
 * stride below Hkv * D or not a multiple of 16 bytes, a flat entry with
 * L >= rows or window != 0, a ring with window < 1 or rows < window) cannot
 * be refused from a graph: the kernel writes nothing to its storage and NaN
 * to its out row, so the failure shows. Entries must not share storage rows
 * (sessions never share storage).
 *
 * Scratch: partials holds og_attend_batch_cuda_scratch_floats(B, Hq, D,
 * max_keys) floats; its head is B x Hq split counters that must be zeroed
 * once after allocation, and every call leaves them zero (the rest needs no
 * setup). Calls on one scratch run one after another (one stream); a scratch
 * sized for (B, Hq, D, max_keys) serves any call with at most those. */
typedef struct og_attend_cuda_seq { /* one session of a batched decode step, one layer (48 bytes) */
    void *k, *v;        /* bound storage of dtype kv_dtype: row r at k + r * row_stride elements */
    int64_t row_stride; /* elements between rows; 0 means Hkv * D (dense) */
    int64_t length;     /* L: committed length before the step; the token is position L */
    int64_t rows;       /* allocated rows: flat capacity (L < rows), or R of a ring (slot = p mod R) */
    int32_t window;     /* W of a ring layer, 0 for flat */
    int32_t T;          /* 1, or 0 for a padded entry */
} og_attend_cuda_seq;

typedef struct og_attend_batch_cuda_args {
    const float *q;       /* [B, Hq, D] RoPE applied; row b is table entry b's token */
    const float *k, *v;   /* [B, Hkv, D] the step's keys and values */
    float *out;           /* [B, Hq, D]; rows of padded entries are left untouched */
    int32_t B, n_heads, n_kv_heads, head_dim; /* B, Hq, Hkv, D */
    og_dtype kv_dtype;    /* storage of every entry: bf16 or f32 */
    og_kv_policy policy;  /* of this layer, the same for every entry */
    float scale;          /* softmax scale; 0 -> 1/sqrt(D) */
    const og_attend_cuda_seq *seqs; /* device [B], read by the kernel when it runs */
    int64_t max_keys;     /* bound on the keys an entry sees (flat: max_capacity, ring: W): shapes the grid */
    float *partials;      /* scratch (see above); NULL allowed when the depth is 1 */
} og_attend_batch_cuda_args;

/* The grid's depth (most splits of one entry) of a batched call on a device
 * of sm_count SMs: min(OG_ATTEND_CUDA_MAX_SPLITS, ceil(max_keys /
 * OG_ATTEND_CUDA_SPLIT_KEYS), enough to fill about one wave of blocks when
 * every entry is long, OG_CUDA_ATTEND_BATCH_SPLITS where the environment sets
 * it: measurements), at least 1. */
int32_t og_attend_batch_cuda_max_splits(int32_t B, int32_t n_heads, int32_t n_kv_heads, int64_t max_keys,
                                        int32_t sm_count);
/* Scratch floats for batched calls of at most B entries of Hq heads of D and
 * max_keys (any Hkv, any device); 0 when an argument is below 1. */
int64_t og_attend_batch_cuda_scratch_floats(int32_t B, int32_t n_heads, int32_t head_dim, int64_t max_keys);
/* Validates the arguments on the host (not the table), then enqueues one
 * launch; capturable in a CUDA graph (no synchronization, no allocation). */
og_status og_update_and_attend_batch_cuda(void *stream, const og_attend_batch_cuda_args *a);

#ifdef __cplusplus
}
#endif
#endif /* OG_KERNELS_OPS_CUDA_H */
