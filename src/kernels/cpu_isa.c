/* Run-time detection and the process-wide cap of the CPU instruction set. */
#include "kernels/cpu_isa.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <unistd.h>

static atomic_int g_isa_cap = OG_CPU_ISA_AVX512;

/* F16C (vcvtph2ps: the f16 scales of quantized weights), CPUID leaf 1 ECX
 * bit 29; not every compiler's __builtin_cpu_supports knows the name. Every
 * CPU with AVX2 has it, so requiring it costs no real machine a level.
 * Asked once, by og_cpu_isa_detect. */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static og_cpu_isa detect_once(void);

/* Every kernel call asks; CPUID is slow (in a virtual machine it traps to
 * the hypervisor: microseconds), so the answer is computed once. */
og_cpu_isa og_cpu_isa_detect(void) {
    static atomic_int detected = -1;
    int d = atomic_load_explicit(&detected, memory_order_relaxed);
    if (d < 0) {
        d = (int)detect_once();
        atomic_store_explicit(&detected, d, memory_order_relaxed);
    }
    return (og_cpu_isa)d;
}

static og_cpu_isa detect_once(void) {
    __builtin_cpu_init();
    if (!has_f16c()) return OG_CPU_ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        return OG_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return OG_CPU_ISA_AVX2;
    return OG_CPU_ISA_SCALAR;
}

og_cpu_isa og_cpu_isa_active(void) {
    og_cpu_isa d = og_cpu_isa_detect();
    og_cpu_isa cap = (og_cpu_isa)atomic_load(&g_isa_cap);
    return cap < d ? cap : d;
}

og_cpu_isa og_cpu_isa_limit(og_cpu_isa isa) {
    if (isa < OG_CPU_ISA_SCALAR) isa = OG_CPU_ISA_SCALAR;
    if (isa > OG_CPU_ISA_AVX512) isa = OG_CPU_ISA_AVX512;
    atomic_store(&g_isa_cap, (int)isa);
    return og_cpu_isa_active();
}

bool og_cpu_has_avx512_vnni(void) { return __builtin_cpu_supports("avx512vnni"); }

bool og_cpu_has_avx512_bf16(void) {
    return og_cpu_isa_active() == OG_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
}

static atomic_llong g_weight_bytes;

void og_cpu_weights_loaded(int64_t delta) { atomic_fetch_add(&g_weight_bytes, (long long)delta); }

bool og_cpu_weights_fit_cache(void) {
    static atomic_llong budget; /* 0 until measured */
    long long b = atomic_load_explicit(&budget, memory_order_relaxed);
    if (b == 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        b = 32ll << 20;
        if (l3 > 0 && l3 / 2 < b) b = l3 / 2;
        atomic_store_explicit(&budget, b, memory_order_relaxed);
    }
    return atomic_load_explicit(&g_weight_bytes, memory_order_relaxed) <= b;
}

bool og_cpu_isa_supported(og_cpu_isa isa) { return isa >= OG_CPU_ISA_SCALAR && isa <= og_cpu_isa_detect(); }

const char *og_cpu_isa_name(og_cpu_isa isa) {
    switch (isa) {
    case OG_CPU_ISA_SCALAR: return "scalar";
    case OG_CPU_ISA_AVX2: return "avx2";
    case OG_CPU_ISA_AVX512: return "avx512";
    case OG_CPU_ISA_COUNT: break;
    }
    return "unknown";
}
