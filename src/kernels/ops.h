/* CPU kernels of every instruction except update_and_attend: embedding
 * lookup, RMS norms, matmul, RoPE, SwiGLU, residual add, argmax and bf16/f32
 * buffer conversion.
 *
 * Every op comes twice: og_<op>_ref is the plain C reference (one thread,
 * no SIMD, written to be read), og_<op>_cpu the fast version (SIMD with
 * run-time dispatch, threads from the pool; pool may be NULL = caller only).
 * Both validate their arguments the same way and return OG_OK or a status
 * with og_last_error() naming what was wrong; on failure nothing is written.
 *
 * Letter legend (shape comments on buffers):
 *   T  tokens of the step (rows of activations)
 *   R  independent decode rows (one per session of a batched step)
 *   K  in features of a matmul          N  out features / row width
 *   V  vocabulary size                  H  hidden size
 *   F  ffn (intermediate) size          D  head dim
 *   n  heads packed in one row ([T, n*D])
 *
 * Activations are f32 row-major. Weights (embedding table, norm weights,
 * matmul weights and biases) are OG_DTYPE_BF16 or OG_DTYPE_F32; embedding
 * tables and matmul weights may also be quantized (OG_DTYPE_Q8, OG_DTYPE_Q4:
 * the layout at OG_QUANT_GROUP in offgraph.h; the k-quants OG_DTYPE_Q2_K ..
 * OG_DTYPE_Q6_K, docs/program-format.md; their rows, H or K, a multiple of
 * the block, og_quant_block_elems, else OG_ERR_INVALID_ARGUMENT), a matmul
 * bias beside them being f32 (og_bias_dtype). Any other dtype is
 * OG_ERR_UNSUPPORTED. k-quant decode products round x to two int8 terms
 * (kquant_cpu.h has the bound); prefill products dequantize exactly.
 * Dimensions must be >= 1. Kernels allocate only scratch that is freed
 * before they return. */
#ifndef OG_KERNELS_OPS_H
#define OG_KERNELS_OPS_H

#include "core/core.h"
#include "kernels/cpu_isa.h"

/* ---- bf16 <-> f32 buffers (round to nearest even; NaN stays NaN) ---- */

void og_bf16_to_f32_ref(const og_bf16 *src /* [n] */, float *dst /* [n] */, size_t n);
void og_bf16_to_f32_cpu(const og_bf16 *src /* [n] */, float *dst /* [n] */, size_t n);
void og_f32_to_bf16_ref(const float *src /* [n] */, og_bf16 *dst /* [n] */, size_t n);
void og_f32_to_bf16_cpu(const float *src /* [n] */, og_bf16 *dst /* [n] */, size_t n);

/* ---- embed: out[t] = table[tokens[t]] ----
 * A token id outside [0, V) is OG_ERR_INVALID_ARGUMENT naming the id and its
 * position; all ids are checked before anything is read or written. A
 * quantized table's row is dequantized: bit for bit og_dequantize_row. */
og_status og_embed_ref(const int32_t *tokens /* [T] */, int64_t T, const void *table /* [V, H] */,
                       og_dtype table_dtype, int64_t V, int64_t H, float *out /* [T, H] */);
og_status og_embed_cpu(og_threadpool *pool, const int32_t *tokens /* [T] */, int64_t T,
                       const void *table /* [V, H] */, og_dtype table_dtype, int64_t V, int64_t H,
                       float *out /* [T, H] */);

/* ---- rms_norm: out = (x * rsqrt(mean(x^2) + eps)) * weight per row ----
 * Hugging Face LlamaRMSNorm order: normalise in f32, then multiply by the
 * weight. out may equal x (in place); partial overlap is refused. */
og_status og_rms_norm_ref(const float *x /* [T, N] */, const void *weight /* [N] */,
                          og_dtype weight_dtype, int64_t T, int64_t N, float eps,
                          float *out /* [T, N] */);
og_status og_rms_norm_cpu(og_threadpool *pool, const float *x /* [T, N] */,
                          const void *weight /* [N] */, og_dtype weight_dtype, int64_t T,
                          int64_t N, float eps, float *out /* [T, N] */);

/* ---- head_rms_norm: rms_norm of every head of D in a row of n heads ----
 * (Qwen3 q_norm / k_norm). out may equal x. */
og_status og_head_rms_norm_ref(const float *x /* [T, n*D] */, const void *weight /* [D] */,
                               og_dtype weight_dtype, int64_t T, int64_t n, int64_t D, float eps,
                               float *out /* [T, n*D] */);
og_status og_head_rms_norm_cpu(og_threadpool *pool, const float *x /* [T, n*D] */,
                               const void *weight /* [D] */, og_dtype weight_dtype, int64_t T,
                               int64_t n, int64_t D, float eps, float *out /* [T, n*D] */);

/* ---- matmul: out = x @ weight^T (+ bias) ----
 * weight is [N, K] row-major (the Hugging Face nn.Linear layout); bias is
 * NULL or [N] of og_bias_dtype(weight_dtype). Products accumulate in f32.
 * out must not overlap x, weight or bias. The reference takes quantized
 * weights as their dequantized f32 values (og_dequantize_row) through the
 * f32 sum.
 * The fast version streams the weights once per call: T == 1 is a SIMD
 * GEMV threaded over N (quantized: the quants widened to f32 against f32 x,
 * each group's 32 products summed and then scaled once); T > 1 converts
 * panels of bf16 weights to f32 (dequantizes q8/q4 ones, exactly) and
 * multiplies them with OpenBLAS sgemm, one panel per pool task (OpenBLAS
 * itself is set to one thread so the pool decides the parallelism). */
og_status og_matmul_ref(const float *x /* [T, K] */, const void *weight /* [N, K] */,
                        const void *bias /* [N] or NULL */, og_dtype weight_dtype, int64_t T,
                        int64_t K, int64_t N, float *out /* [T, N] */);
og_status og_matmul_cpu(og_threadpool *pool, const float *x /* [T, K] */,
                        const void *weight /* [N, K] */, const void *bias /* [N] or NULL */,
                        og_dtype weight_dtype, int64_t T, int64_t K, int64_t N,
                        float *out /* [T, N] */);

/* ---- matmul_rows: R independent decode rows, each exactly as
 * og_matmul_cpu computes a single row ----
 * Row r of out is bit for bit og_matmul_cpu(pool', x + r*K, weight, bias,
 * weight_dtype, 1, K, N, out + r*N) on this machine at the same ISA level,
 * for any pools (the GEMV's per-feature summation order depends on neither
 * the thread count nor the task split). It is the batched decode step's
 * matmul: the sessions' rows against one pass over the weights, which are read
 * from memory once per call and from cache for the other rows (decode is
 * bound by that read). Same argument rules as og_matmul_cpu with T = R; the
 * reference is og_matmul_ref (T = R), within the same tolerance.
 * Quantized weights at AVX-512: tiles of 4 features x 4 rows, each group's
 * quants widened once for the 4 rows (R = 16 and 64 of a q8 [2048, 1024]:
 * 1.8x the GEMV's loop run per row); AVX2 and scalar: the GEMV's own
 * single-row loop once per row over each task's panel (kept in the caches
 * for the later rows).
 * Float weights at AVX-512: one row takes the GEMV's own loop (four weight
 * rows a pass: more lines in flight than the tiles below); more rows a
 * blocked kernel (tiles of features x rows
 * sharing each load; with bf16 weights the rows of x are split into even/odd
 * halves once per call and K >= 2048 is swept in chunks: scratch of R * K
 * floats plus 32 KiB per thread per 64 panel features, OG_ERR_OUT_OF_MEMORY
 * if it cannot be had). AVX2 and scalar: the GEMV's own single-row loop runs
 * once per row over each task's panel of weights (the panel stays in cache),
 * which keeps the bits equal. */
og_status og_matmul_rows_cpu(og_threadpool *pool, const float *x /* [R, K] */,
                             const void *weight /* [N, K] */, const void *bias /* [N] or NULL */,
                             og_dtype weight_dtype, int64_t R, int64_t K, int64_t N,
                             float *out /* [R, N] */);

/* ---- several products of the same decode rows in one pass ----
 * Each part's out is bit for bit og_matmul_rows_cpu(pool, x, part.weight,
 * part.bias, part.weight_dtype, R, K, part.N, part.out): the parts' tasks
 * share one parallel-for (the q/k/v or gate/up products of a decode step,
 * whose x is read once and whose hand-offs to the threads are one). The
 * outs must not overlap one another or x. */
#define OG_MATMUL_MAX_PARTS 8
typedef struct og_matmul_part {
    const void *weight; /* [N, K] */
    const void *bias;   /* [N] or NULL */
    og_dtype weight_dtype;
    int64_t N;
    float *out;         /* [R, N] */
} og_matmul_part;
og_status og_matmul_rows_multi_cpu(og_threadpool *pool, const float *x /* [R, K] */, int64_t R,
                                   int64_t K, const og_matmul_part *parts, int n_parts);
/* gate and up (of the same N) as og_matmul_rows_multi_cpu, and out =
 * og_swiglu_cpu(gate.out, up.out) bit for bit, each task applying it to the
 * features it has just computed. out overlaps neither x, gate.out nor up.out. */
og_status og_matmul_rows_swiglu_cpu(og_threadpool *pool, const float *x /* [R, K] */, int64_t R,
                                    int64_t K, const og_matmul_part *gate,
                                    const og_matmul_part *up, float *out /* [R, N] */);

/* ---- matmul with bf16 activations: out = bf16(x) @ weight^T (+ bias) ----
 * What a bf16 program computes (and transformers in bf16): x is first rounded
 * to bf16 (nearest even); products of two bf16 values are exact in f32 and
 * accumulate in f32. Same arguments and rules as og_matmul_cpu. With bf16
 * weights on a CPU with AVX512_BF16 this is the AMX tile kernel (where the
 * CPU has one) or a blocked vdpbf16ps kernel; quantized weights (q8, q4,
 * k-quants; K a multiple of 32), whose dequantized values bf16 does not hold
 * exactly, take the same kernels with each weight as two bf16 values hi +
 * lo (within 2^-16 |w|: matmul_bf16.c). Otherwise the rounded x goes through
 * og_matmul_cpu. The reference is og_matmul_ref on x rounded by
 * og_bf16_from_f32 (the kernel treats f32 subnormal inputs and products as
 * zero, as vdpbf16ps does). */
og_status og_matmul_bf16_cpu(og_threadpool *pool, const float *x /* [T, K] */,
                             const void *weight /* [N, K] */, const void *bias /* [N] or NULL */,
                             og_dtype weight_dtype, int64_t T, int64_t K, int64_t N,
                             float *out /* [T, N] */);

/* ---- rope: rotary position embedding, Hugging Face "rotate_half" ----
 * Pairs (i, i + D/2) of every head rotate by angle pos * inv_freq[i]:
 *   out[i]       = x[i] * cos - x[i + D/2] * sin
 *   out[i + D/2] = x[i + D/2] * cos + x[i] * sin
 * The angle is rounded to f32 before cos/sin, as transformers does. */
#include "core/rope_type.h"

typedef struct og_rope_params {
    og_rope_type type;
    float theta;                         /* rope_theta (base), > 0          */
    float factor;                        /* LINEAR, LLAMA3: > 0             */
    float low_freq_factor;               /* LLAMA3                          */
    float high_freq_factor;              /* LLAMA3: > low_freq_factor       */
    int32_t original_max_position;       /* LLAMA3: original_max_position_embeddings */
    /* rotary dims rd (even, <= head_dim; 0 = head_dim): inv_freq is computed
     * as for a head of rd dims and is 0 past rd/2, so pairs (i, i + D/2)
     * with i >= rd/2 turn by angle 0 (left as they are) */
    int32_t rotary_dim;
} og_rope_params;

#define OG_ROPE_MAX_HEAD_DIM 1024
typedef struct og_rope_table {
    int32_t head_dim;                            /* D, even           */
    float inv_freq[OG_ROPE_MAX_HEAD_DIM / 2];    /* [D/2]             */
} og_rope_table;

/* Computes inv_freq as transformers' _compute_default_rope_parameters /
 * _compute_linear_scaling_rope_parameters / _compute_llama3_parameters do,
 * in f32 with the same operation order. D must be even, 2..1024. */
og_status og_rope_table_init(og_rope_table *table, int32_t head_dim, const og_rope_params *params);

/* out may equal x (in place); positions may be any values >= 0. */
og_status og_rope_ref(const og_rope_table *table, const float *x /* [T, n*D] */,
                      const int32_t *positions /* [T] */, int64_t T, int64_t n,
                      float *out /* [T, n*D] */);
og_status og_rope_cpu(og_threadpool *pool, const og_rope_table *table,
                      const float *x /* [T, n*D] */, const int32_t *positions /* [T] */,
                      int64_t T, int64_t n, float *out /* [T, n*D] */);

/* ---- swiglu: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) ----
 * out may equal gate or up. */
og_status og_swiglu_ref(const float *gate /* [T, F] */, const float *up /* [T, F] */, int64_t T,
                        int64_t F, float *out /* [T, F] */);
og_status og_swiglu_cpu(og_threadpool *pool, const float *gate /* [T, F] */,
                        const float *up /* [T, F] */, int64_t T, int64_t F,
                        float *out /* [T, F] */);

/* ---- add: out = a + b (residual); out may equal a or b ---- */
og_status og_add_ref(const float *a /* [n] */, const float *b /* [n] */, int64_t n,
                     float *out /* [n] */);
og_status og_add_cpu(og_threadpool *pool, const float *a /* [n] */, const float *b /* [n] */,
                     int64_t n, float *out /* [n] */);

/* ---- argmax of one row, like torch.argmax: the first maximum wins; a
 * NaN counts as larger than any number (the first NaN wins). ---- */
og_status og_argmax_ref(const float *x /* [V] */, int64_t V, int64_t *index);
og_status og_argmax_cpu(const float *x /* [V] */, int64_t V, int64_t *index);

#endif /* OG_KERNELS_OPS_H */
