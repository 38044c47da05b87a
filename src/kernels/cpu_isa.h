/* Instruction sets of the fast CPU kernels, chosen at run time: every fast
 * kernel asks og_cpu_isa_active() and runs the widest version it has at or
 * below that level. Tests and benchmarks cap the level to exercise every
 * version on one machine. */
#ifndef OG_KERNELS_CPU_ISA_H
#define OG_KERNELS_CPU_ISA_H

#include <stdbool.h>
#include <stdint.h>

typedef enum og_cpu_isa {
    OG_CPU_ISA_SCALAR = 0, /* portable C                         */
    OG_CPU_ISA_AVX2 = 1,   /* x86-64 AVX2 + FMA + F16C           */
    OG_CPU_ISA_AVX512 = 2, /* x86-64 AVX-512 F + BW + VL, FMA, F16C */
    OG_CPU_ISA_COUNT
} og_cpu_isa;

/* The widest level this CPU supports. */
og_cpu_isa og_cpu_isa_detect(void);
/* The level the fast kernels use now: the detected one unless capped. */
og_cpu_isa og_cpu_isa_active(void);
/* Caps the level at min(isa, detected) for all threads; returns the new level. */
og_cpu_isa og_cpu_isa_limit(og_cpu_isa isa);
/* True when the active level is AVX-512 and this CPU also has AVX512_BF16
 * (vdpbf16ps, vcvtne2ps2bf16): the bf16 matmul kernels run only then, so
 * capping the level below AVX-512 also turns them off. */
bool og_cpu_has_avx512_bf16(void);
/* Whether the CPU has AVX512_VNNI (vpdpbusd: the k-quant GEMV's integer
 * sums; without it the same sums take two instructions). */
bool og_cpu_has_avx512_vnni(void);
/* True when this CPU can run isa. */
bool og_cpu_isa_supported(og_cpu_isa isa);
/* Weights the CPU back end's loaded models hold, all together: a model adds
 * its weight bytes when it loads and takes them back when it is freed
 * (negative delta). */
void og_cpu_weights_loaded(int64_t delta);
/* True while those weights fit the caches (at most half the last-level
 * cache, and at most 32 MiB): then the decode products prefetch weights
 * into every cache level, where the next token finds them; otherwise into
 * L2 only (streamed from memory each token; ops_simd.c has the
 * measurements behind the hint). */
bool og_cpu_weights_fit_cache(void);
/* Static lower-case name ("scalar", "avx2", "avx512"); "unknown" otherwise. */
const char *og_cpu_isa_name(og_cpu_isa isa);

#endif
