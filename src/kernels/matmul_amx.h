/* AMX tile products for the bf16 prefill matmul (og_matmul_bf16_cpu):
 * out = bf16(x) @ weight^T (+ bias) with bf16 weights, products exact in
 * f32 and accumulated in f32 by the tile unit (TDPBF16PS); quantized
 * weights as two bf16 terms each (og_matmul_quant_amx).
 *
 * Used when the CPU has AMX-BF16 and AMX-TILE, the kernel grants the
 * process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM), the active ISA
 * level is AVX-512 with AVX512_BF16 (capping the level turns AMX off with
 * the other bf16 kernels), K is a multiple of 32 (one tile row of k) and
 * the environment does not say OG_CPU_AMX=0. */
#ifndef OG_KERNELS_MATMUL_AMX_H
#define OG_KERNELS_MATMUL_AMX_H

#include "core/core.h"

#include <stdbool.h>

/* True when og_matmul_bf16_amx can run here now. */
bool og_cpu_has_amx_bf16(void);
/* Tests and benchmarks: false keeps the AMX kernel off (process-wide) so the
 * vdpbf16ps kernel it replaces can be measured and checked beside it. */
void og_cpu_amx_allow(bool allow);

/* Same arguments and result as og_matmul_bf16_cpu with bf16 weights and
 * K % 32 == 0 (the caller checked them). OG_ERR_OUT_OF_MEMORY when its
 * packing scratch cannot be had, OG_ERR_UNSUPPORTED when AMX is not usable. */
og_status og_matmul_bf16_amx(og_threadpool *pool, const float *x /* [T, K] */, const og_bf16 *weight /* [N, K] */,
                             const og_bf16 *bias /* [N] or NULL */, int64_t T, int64_t K, int64_t N,
                             float *out /* [T, N] */);
/* The same product with quantized weights (q8, q4, a k-quant; K % 32 == 0):
 * out = bf16(x) @ w^T (+ bias of og_bias_dtype(dt)), w dequantized exactly
 * and carried as two bf16 terms, within 2^-16 |w| of it (matmul_amx.c).
 * OG_ERR_UNSUPPORTED without AMX, for another dtype or K. */
og_status og_matmul_quant_amx(og_threadpool *pool, const float *x /* [T, K] */, const void *weight /* [N, K] of dt */,
                              og_dtype dt, const void *bias /* [N] or NULL */, int64_t T, int64_t K, int64_t N,
                              float *out /* [T, N] */);

#endif
