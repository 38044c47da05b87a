/* ISA-specific inner loops of the fast ops (AVX-512 F/BW/VL + FMA and
 * AVX2 + FMA). Each function carries its own target attribute, so the file
 * needs no -march flag; ops_cpu.c calls them only after checking the CPU
 * (og_cpu_isa_active). Letters as in ops.h: K in features, V vocabulary,
 * N row width. bf16 is the top half of an f32, so widening is a shift. */
#include "kernels/cpu_isa.h"
#include "kernels/ops_internal.h"

#include <immintrin.h>
#include <math.h>

#include "kernels/bf16_split_x86.h"

#define OG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define OG_AVX2 __attribute__((target("avx2,fma")))
#define OG_INLINE inline __attribute__((always_inline))

/* ======================= AVX-512 ======================= */

static OG_INLINE OG_AVX512 __m512 load16_bf16_512(const og_bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static OG_INLINE OG_AVX512 __m512 maskload16_bf16_512(const og_bf16 *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* 16 weights at w + i (dt is a compile-time constant at every call). */
static OG_INLINE OG_AVX512 __m512 load_w_512(const void *w, og_dtype dt, size_t i) {
    return dt == OG_DTYPE_BF16 ? load16_bf16_512((const og_bf16 *)w + i)
                               : _mm512_loadu_ps((const float *)w + i);
}
static OG_INLINE OG_AVX512 __m512 maskload_w_512(const void *w, og_dtype dt, size_t i,
                                                   __mmask16 m) {
    return dt == OG_DTYPE_BF16 ? maskload16_bf16_512((const og_bf16 *)w + i, m)
                               : _mm512_maskz_loadu_ps(m, (const float *)w + i);
}

/* Four rows at a time share each load of x; the tail of K is masked. */
static OG_INLINE OG_AVX512 void gemv_avx512(const float *x, const void *w, og_dtype dt,
                                             int64_t K, int64_t rows, float *out) {
    const size_t k_main = (size_t)(K & ~(int64_t)15);
    const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1u);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const size_t b0 = (size_t)r * (size_t)K, b1 = b0 + (size_t)K, b2 = b1 + (size_t)K,
                     b3 = b2 + (size_t)K;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
               a3 = _mm512_setzero_ps();
        for (size_t k = 0; k < k_main; k += 16) {
            __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(load_w_512(w, dt, b0 + k), xv, a0);
            a1 = _mm512_fmadd_ps(load_w_512(w, dt, b1 + k), xv, a1);
            a2 = _mm512_fmadd_ps(load_w_512(w, dt, b2 + k), xv, a2);
            a3 = _mm512_fmadd_ps(load_w_512(w, dt, b3 + k), xv, a3);
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + k_main);
            a0 = _mm512_fmadd_ps(maskload_w_512(w, dt, b0 + k_main, tail), xv, a0);
            a1 = _mm512_fmadd_ps(maskload_w_512(w, dt, b1 + k_main, tail), xv, a1);
            a2 = _mm512_fmadd_ps(maskload_w_512(w, dt, b2 + k_main, tail), xv, a2);
            a3 = _mm512_fmadd_ps(maskload_w_512(w, dt, b3 + k_main, tail), xv, a3);
        }
        out[r] = _mm512_reduce_add_ps(a0);
        out[r + 1] = _mm512_reduce_add_ps(a1);
        out[r + 2] = _mm512_reduce_add_ps(a2);
        out[r + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; r < rows; r++) {
        const size_t b = (size_t)r * (size_t)K;
        __m512 a = _mm512_setzero_ps();
        for (size_t k = 0; k < k_main; k += 16)
            a = _mm512_fmadd_ps(load_w_512(w, dt, b + k), _mm512_loadu_ps(x + k), a);
        if (tail)
            a = _mm512_fmadd_ps(maskload_w_512(w, dt, b + k_main, tail),
                                _mm512_maskz_loadu_ps(tail, x + k_main), a);
        out[r] = _mm512_reduce_add_ps(a);
    }
}

/* bf16 weights. A 64-byte load holds 32 weights as 16 pairs; the even
 * weight of each pair widens with a shift, the odd one with a mask (bf16 is
 * the top half of an f32), and each meets x's even or odd elements, which
 * the caller split apart once (og_split_even_odd_avx512): no cross-lane work
 * per weight, and every load is a whole cache line.
 *
 * The rows run one after another, each a single stream of lines, with a
 * prefetch 4 lines ahead into every level. A block of rows is contiguous, so
 * a thread reads one run of memory start to end, which the hardware
 * prefetcher follows best. Measured on this 2-core kind (2026-12-06, a
 * decode-shaped walk over 1.19 GB of 0.6B-shaped weights, the work in
 * contiguous halves): 46-53 GB/s, against 31-47 for four rows a pass (four
 * interleaved streams, x permuted in the loop, prefetcht1 a pass ahead: the
 * scheme before) and 37-40 for one row with x permuted in the loop; a pure
 * read of the same bytes runs at about 60. Each row keeps the sums of the
 * four-row scheme (even and odd lanes over k in order, then their sum), so
 * the bits did not change. Rows past the block's last group of 4 (and the
 * tail of K, below 32) take the masked 16-wide loop of gemv_avx512, as
 * og_matmul_rows_avx512 reproduces. Weights that fit the caches
 * (og_cpu_weights_fit_cache) are not bound by memory but by the FMAs'
 * latency, so there four rows go a pass (eight sums in flight, not two),
 * with the same sums in the same order. */
static OG_INLINE OG_AVX512 __m512 bf16_even_512(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
static OG_INLINE OG_AVX512 __m512 bf16_odd_512(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u)));
}

static OG_AVX512 void gemv_bf16_avx512(const float *x, const float *xp, const og_bf16 *w, int64_t K,
                                       int64_t rows, float *out) {
    const size_t k32 = (size_t)(K & ~(int64_t)31);
    const int64_t rows_eo = rows & ~(int64_t)3;
    int64_t r = 0;
    if (og_cpu_weights_fit_cache()) /* cached: four rows a pass, for the FMAs' latency */
        for (; r < rows_eo; r += 4) {
            const og_bf16 *w0 = w + (size_t)r * (size_t)K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
            __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
            for (size_t k = 0; k < k32; k += 32) {
                const __m512 xe = _mm512_loadu_ps(xp + k), xo = _mm512_loadu_ps(xp + k + 16);
                const __m512i p0 = _mm512_loadu_si512((const void *)(w0 + k));
                const __m512i p1 = _mm512_loadu_si512((const void *)(w1 + k));
                const __m512i p2 = _mm512_loadu_si512((const void *)(w2 + k));
                const __m512i p3 = _mm512_loadu_si512((const void *)(w3 + k));
                e0 = _mm512_fmadd_ps(bf16_even_512(p0), xe, e0);
                o0 = _mm512_fmadd_ps(bf16_odd_512(p0), xo, o0);
                e1 = _mm512_fmadd_ps(bf16_even_512(p1), xe, e1);
                o1 = _mm512_fmadd_ps(bf16_odd_512(p1), xo, o1);
                e2 = _mm512_fmadd_ps(bf16_even_512(p2), xe, e2);
                o2 = _mm512_fmadd_ps(bf16_odd_512(p2), xo, o2);
                e3 = _mm512_fmadd_ps(bf16_even_512(p3), xe, e3);
                o3 = _mm512_fmadd_ps(bf16_odd_512(p3), xo, o3);
            }
            for (size_t k = k32; k < (size_t)K; k += 16) {
                const size_t left = (size_t)K - k;
                const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
                e0 = _mm512_fmadd_ps(maskload16_bf16_512(w0 + k, m), xv, e0);
                e1 = _mm512_fmadd_ps(maskload16_bf16_512(w1 + k, m), xv, e1);
                e2 = _mm512_fmadd_ps(maskload16_bf16_512(w2 + k, m), xv, e2);
                e3 = _mm512_fmadd_ps(maskload16_bf16_512(w3 + k, m), xv, e3);
            }
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(e0, o0));
            out[r + 1] = _mm512_reduce_add_ps(_mm512_add_ps(e1, o1));
            out[r + 2] = _mm512_reduce_add_ps(_mm512_add_ps(e2, o2));
            out[r + 3] = _mm512_reduce_add_ps(_mm512_add_ps(e3, o3));
        }
    for (; r < rows_eo; r++) {
        const og_bf16 *wr = w + (size_t)r * (size_t)K;
        __m512 e = _mm512_setzero_ps(), o = e;
        for (size_t k = 0; k < k32; k += 32) {
            _mm_prefetch((const char *)(wr + k) + 256, _MM_HINT_T0);
            const __m512i p = _mm512_loadu_si512((const void *)(wr + k));
            e = _mm512_fmadd_ps(bf16_even_512(p), _mm512_loadu_ps(xp + k), e);
            o = _mm512_fmadd_ps(bf16_odd_512(p), _mm512_loadu_ps(xp + k + 16), o);
        }
        for (size_t k = k32; k < (size_t)K; k += 16) {
            const size_t left = (size_t)K - k;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            e = _mm512_fmadd_ps(maskload16_bf16_512(wr + k, m), _mm512_maskz_loadu_ps(m, x + k), e);
        }
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(e, o));
    }
    if (rows_eo < rows)
        gemv_avx512(x, w + (size_t)rows_eo * (size_t)K, OG_DTYPE_BF16, K, rows - rows_eo, out + rows_eo);
}

OG_AVX512 void og_gemv_rows_avx512(const float *x, const float *xp, const void *w, og_dtype dt, int64_t K,
                                   int64_t rows, float *out) {
    if (dt == OG_DTYPE_BF16)
        gemv_bf16_avx512(x, xp, w, K, rows, out);
    else
        gemv_avx512(x, w, OG_DTYPE_F32, K, rows, out);
}

/* ---- many activation rows against one weight panel (og_matmul_rows_cpu) ----
 * Each output feature keeps the accumulation order the GEMV above gives it,
 * so a row's results are bit for bit those of og_gemv_rows_avx512:
 *  - even/odd features (bf16, inside a group of 4 of the GEMV): per 32-chunk
 *    of K, e += even(w) * x[k + 2i], o += odd(w) * x[k + 2i + 1]; then the
 *    tail of K in masked 16-wide steps into e; result reduce(e + o);
 *  - plain features (f32 weights, and bf16 rows left over by the GEMV's
 *    groups of 4): one accumulator, 16-wide steps, masked tail, reduce.
 * FMA products commute, so w * x and x * w round alike; everything else
 * (the order of the adds, the reduction) is the same code.
 * A tile is nf features x nr activation rows: one load of a weight line
 * (widened once) feeds nr rows, one load of x feeds nf features. */

OG_AVX512 void og_split_even_odd_avx512(const float *x, int64_t K, float *xp) {
    const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                               26, 28, 30);
    const __m512i odd_idx = _mm512_add_epi32(even_idx, _mm512_set1_epi32(1));
    const size_t k32 = (size_t)(K & ~(int64_t)31);
    for (size_t k = 0; k < k32; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        _mm512_storeu_ps(xp + k, _mm512_permutex2var_ps(x0, even_idx, x1));
        _mm512_storeu_ps(xp + k + 16, _mm512_permutex2var_ps(x0, odd_idx, x1));
    }
    for (size_t k = k32; k < (size_t)K; k++) xp[k] = x[k];
}

enum { EO_NF = 2, EO_NR = 4, PLAIN_NF = 4, PLAIN_NR = 4 };
/* K is swept in chunks of EO_KC so that a block's x (EO_NR rows of EO_KC
 * floats, 16 KiB) stays in L1 while the panel streams past it; between
 * chunks a tile's accumulators rest in the caller's scratch (stored and
 * reloaded unchanged, so the sums are those of one sweep). */
enum { EO_KC = 1024 };

size_t og_matmul_rows_avx512_scratch(int64_t K, int64_t rows) {
    return K >= 2 * EO_KC ? (size_t)rows * EO_NR * 32 : 0;
}

/* nf (<= EO_NF) bf16 weight rows w [nf, K] times nr (<= EO_NR) split rows
 * xp [nr, K] over the 32-chunks in [k0, k1); first: the sums start at zero,
 * else from acc [nf, EO_NR, 2, 16]; last: then the tail of K and the
 * results out[r * ldo + f], else the sums go back to acc. prefetch 1: the
 * same lines of the next nf weight rows, into L2 (the panel is read once; a
 * non-temporal prefetch ran the 0.6B shape's decode at half the speed on
 * this 2-core kind, 2026-12-03); 2: into all cache levels (later row blocks
 * read it again); 0: none. */
static OG_INLINE OG_AVX512 void rows_eo_tile(const float *xp, const og_bf16 *w, int64_t K,
                                             size_t k0, size_t k1, bool first, bool last,
                                             const int nf, const int nr, int prefetch,
                                             float *acc, float *out, int64_t ldo) {
    __m512 e[EO_NF][EO_NR], o[EO_NF][EO_NR];
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            if (first) {
                e[f][r] = o[f][r] = _mm512_setzero_ps();
            } else {
                e[f][r] = _mm512_loadu_ps(acc + (f * EO_NR + r) * 32);
                o[f][r] = _mm512_loadu_ps(acc + (f * EO_NR + r) * 32 + 16);
            }
        }
    const size_t k32 = (size_t)(K & ~(int64_t)31), ahead = (size_t)nf * (size_t)K;
    for (size_t k = k0; k < k1; k += 32) {
        __m512 we[EO_NF], wo[EO_NF];
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) {
            const og_bf16 *wf = w + (size_t)f * (size_t)K + k;
            if (prefetch == 1)
                _mm_prefetch((const char *)(wf + ahead), _MM_HINT_T1);
            else if (prefetch == 2)
                _mm_prefetch((const char *)(wf + ahead), _MM_HINT_T0);
            const __m512i p = _mm512_loadu_si512((const void *)wf);
            we[f] = bf16_even_512(p);
            wo[f] = bf16_odd_512(p);
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m512 xe = _mm512_loadu_ps(xp + (size_t)r * (size_t)K + k);
            const __m512 xo = _mm512_loadu_ps(xp + (size_t)r * (size_t)K + k + 16);
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) {
                e[f][r] = _mm512_fmadd_ps(we[f], xe, e[f][r]);
                o[f][r] = _mm512_fmadd_ps(wo[f], xo, o[f][r]);
            }
        }
    }
    if (!last) {
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++)
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                _mm512_storeu_ps(acc + (f * EO_NR + r) * 32, e[f][r]);
                _mm512_storeu_ps(acc + (f * EO_NR + r) * 32 + 16, o[f][r]);
            }
        return;
    }
    for (size_t k = k32; k < (size_t)K; k += 16) {
        const size_t left = (size_t)K - k;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        __m512 wv[EO_NF];
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) wv[f] = maskload16_bf16_512(w + (size_t)f * (size_t)K + k, m);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, xp + (size_t)r * (size_t)K + k);
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) e[f][r] = _mm512_fmadd_ps(wv[f], xv, e[f][r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++)
            out[(size_t)r * (size_t)ldo + (size_t)f] =
                _mm512_reduce_add_ps(_mm512_add_ps(e[f][r], o[f][r]));
}

/* nf (<= PLAIN_NF) weight rows w [nf, K] of dt times nr (<= PLAIN_NR) rows
 * x [nr, K]; out[r * ldo + f]. */
static OG_INLINE OG_AVX512 void rows_plain_tile(const float *x, const void *w, og_dtype dt,
                                                int64_t K, const int nf, const int nr,
                                                float *out, int64_t ldo) {
    const size_t k_main = (size_t)(K & ~(int64_t)15);
    const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1u);
    __m512 a[PLAIN_NF][PLAIN_NR];
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) a[f][r] = _mm512_setzero_ps();
    for (size_t k = 0; k < k_main; k += 16) {
        __m512 wv[PLAIN_NF];
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) wv[f] = load_w_512(w, dt, (size_t)f * (size_t)K + k);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)r * (size_t)K + k);
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) a[f][r] = _mm512_fmadd_ps(wv[f], xv, a[f][r]);
        }
    }
    if (tail) {
        __m512 wv[PLAIN_NF];
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++)
            wv[f] = maskload_w_512(w, dt, (size_t)f * (size_t)K + k_main, tail);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)r * (size_t)K + k_main);
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) a[f][r] = _mm512_fmadd_ps(wv[f], xv, a[f][r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++)
            out[(size_t)r * (size_t)ldo + (size_t)f] = _mm512_reduce_add_ps(a[f][r]);
}

/* One instance per (nf, nr): the tiles' loops unroll into registers only
 * with constant bounds. */
#define OG_EO_CASE(NF, NR)                                                                   \
    case NF * 8 + NR:                                                                        \
        rows_eo_tile(xp, w, K, k0, k1, first, last, NF, NR, prefetch, acc, out, ldo);        \
        return;
static OG_AVX512 void rows_eo_block(const float *xp, const og_bf16 *w, int64_t K, size_t k0,
                                    size_t k1, bool first, bool last, int nf, int nr,
                                    int prefetch, float *acc, float *out, int64_t ldo) {
    switch (nf * 8 + nr) {
        OG_EO_CASE(1, 1) OG_EO_CASE(1, 2) OG_EO_CASE(1, 3) OG_EO_CASE(1, 4)
        OG_EO_CASE(2, 1) OG_EO_CASE(2, 2) OG_EO_CASE(2, 3) OG_EO_CASE(2, 4)
    default: return; /* unreachable: nf <= EO_NF, nr <= EO_NR */
    }
}
#undef OG_EO_CASE

#define OG_PLAIN_CASE(NF, NR)                                                                \
    case NF * 8 + NR:                                                                        \
        if (dt == OG_DTYPE_BF16)                                                             \
            rows_plain_tile(x, w, OG_DTYPE_BF16, K, NF, NR, out, ldo);                       \
        else                                                                                 \
            rows_plain_tile(x, w, OG_DTYPE_F32, K, NF, NR, out, ldo);                        \
        return;
static OG_AVX512 void rows_plain_block(const float *x, const void *w, og_dtype dt, int64_t K, int nf,
                                 int nr, float *out, int64_t ldo) {
    switch (nf * 8 + nr) {
        OG_PLAIN_CASE(1, 1) OG_PLAIN_CASE(1, 2) OG_PLAIN_CASE(1, 3) OG_PLAIN_CASE(1, 4)
        OG_PLAIN_CASE(2, 1) OG_PLAIN_CASE(2, 2) OG_PLAIN_CASE(2, 3) OG_PLAIN_CASE(2, 4)
        OG_PLAIN_CASE(3, 1) OG_PLAIN_CASE(3, 2) OG_PLAIN_CASE(3, 3) OG_PLAIN_CASE(3, 4)
        OG_PLAIN_CASE(4, 1) OG_PLAIN_CASE(4, 2) OG_PLAIN_CASE(4, 3) OG_PLAIN_CASE(4, 4)
    default: return; /* unreachable: nf <= PLAIN_NF, nr <= PLAIN_NR */
    }
}
#undef OG_PLAIN_CASE

/* Blocks of EO_NR (PLAIN_NR) activation rows outside, then chunks of K,
 * then tiles of features: a block's x stays in L1 while the panel's weights
 * stream through, from memory on the first block and from L2 on the later
 * ones. */
OG_AVX512 void og_matmul_rows_avx512(const float *x, const float *xp, const void *w, og_dtype dt,
                                     int64_t R, int64_t K, int64_t rows, int64_t rows_eo,
                                     float *scratch, float *out, int64_t ldo) {
    const size_t es = og_dtype_size(dt);
    const size_t k32 = (size_t)(K & ~(int64_t)31);
    /* one sweep unless the scratch is there (K >= 2 EO_KC) */
    const size_t kc = og_matmul_rows_avx512_scratch(K, rows) ? EO_KC : k32;
    const bool cached = og_cpu_weights_fit_cache();
    for (int64_t r0 = 0; r0 < R; r0 += EO_NR) {
        const int nr = R - r0 < EO_NR ? (int)(R - r0) : EO_NR;
        /* the first block of rows brings the panel in: non-temporally when
         * only it reads the panel and the weights stream from memory each
         * token; into the caches when later blocks read it again, or when the
         * weights fit the caches and the next token reads them again too */
        const int prefetch = r0 > 0 ? 0 : R <= EO_NR && !cached ? 1 : 2;
        for (size_t k0 = 0, k1;; k0 = k1) {
            k1 = k32 - k0 > kc ? k0 + kc : k32;
            const bool last = k1 == k32;
            for (int64_t f0 = 0; f0 < rows_eo; f0 += EO_NF) {
                const int nf = rows_eo - f0 < EO_NF ? (int)(rows_eo - f0) : EO_NF;
                rows_eo_block(xp + r0 * K, (const og_bf16 *)w + (size_t)f0 * (size_t)K, K, k0,
                              k1, k0 == 0, last, nf, nr, prefetch,
                              scratch ? scratch + (size_t)f0 * EO_NR * 32 : NULL,
                              out + r0 * ldo + f0, ldo);
            }
            if (last) break;
        }
    }
    if (rows_eo == rows) return;
    for (int64_t r0 = 0; r0 < R; r0 += PLAIN_NR) {
        const int nr = R - r0 < PLAIN_NR ? (int)(R - r0) : PLAIN_NR;
        for (int64_t f0 = rows_eo; f0 < rows; f0 += PLAIN_NF) {
            const int nf = rows - f0 < PLAIN_NF ? (int)(rows - f0) : PLAIN_NF;
            rows_plain_block(x + r0 * K, (const char *)w + (size_t)f0 * (size_t)K * es, dt, K, nf, nr,
                       out + r0 * ldo + f0, ldo);
        }
    }
}

/* ---- quantized weights (q8, q4): the GEMV of decode and the dequantizer ----
 * Decode is bound by the bytes read, so the quants are widened to f32 and
 * meet x unquantized (f32 FMA): the products and sums are the reference's
 * up to f32 rounding, where VNNI (vpdpbusd) would first round x to 8 bits per
 * group, an error of up to 1/254 of each x far outside the reference's f32
 * tolerance, for arithmetic the memory stream hides anyway. A group's 32
 * products are summed in 16 lanes (two each), then scaled once by the
 * group's f16 scale into the row's 16 lane sums: scale * q is exact in f32,
 * so this is the reference's sum reassociated, one rounding more per group.
 * The scales of 16 groups of each row are widened by one vcvtph2ps into a
 * buffer and broadcast from it (a load, no shuffle). Each line of quants is
 * matched by a prefetch of the same line of a later row: into all cache
 * levels when the weights fit the caches (og_cpu_weights_fit_cache); when
 * they stream from memory each token, into L2 only (prefetcht1): on a 2-core
 * AVX-512 host, q8 [2048, 1024] streamed from memory ran at 6.5 GB/s per
 * core with prefetchnta and 10.5 with prefetcht1 (12 and 20 GB/s on both
 * cores; bf16 21), q4 at 6.5 and 8.5 (10.5 and 15.5). Rows go four a pass
 * (x's loads shared), prefetching the next pass's rows, except q8 streamed
 * from memory: one row a pass, one stream, prefetched about 4 KiB ahead (the
 * 0.6B shape's q8 decode on this 2-core kind, 2026-12-06: 46.6 - 47.8 tok/s
 * four rows a pass, 52 - 55 one; 34 without prefetches). q4 widens with more
 * work a weight and stays on four rows (one a pass measured 5 - 10 % slower
 * on the small MoE). */
enum { QG = OG_QUANT_GROUP, QCHUNK = 16 /* groups whose scales are widened at once */ };

/* q8: the 32 products of a group in 16 lanes. */
static OG_INLINE OG_AVX512 __m512 group_q8_512(const uint8_t *p, __m512 x0, __m512 x1) {
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    const __m512 b =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    return _mm512_fmadd_ps(b, x1, _mm512_mul_ps(a, x0));
}
/* q4: byte j holds element j (low nibble) and j + 16 (high), as q + 8;
 * lut[i] = i - 8 and vpermps reads only the low 4 bits of each index, so
 * the low nibble needs no mask. */
static OG_INLINE OG_AVX512 __m512 q4_lo_512(__m512i v, __m512 lut) {
    return _mm512_permutexvar_ps(v, lut);
}
static OG_INLINE OG_AVX512 __m512 q4_hi_512(__m512i v, __m512 lut) {
    return _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
}
static OG_INLINE OG_AVX512 __m512i q4_bytes_512(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static OG_INLINE OG_AVX512 __m512 group_q4_512(const uint8_t *p, __m512 x0, __m512 x1,
                                               __m512 lut) {
    const __m512i v = q4_bytes_512(p);
    return _mm512_fmadd_ps(q4_hi_512(v, lut), x1, _mm512_mul_ps(q4_lo_512(v, lut), x0));
}
static OG_INLINE OG_AVX512 __m512 q4_lut_512(void) {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}
/* The f16 scales of groups [g0, g0 + ng) of a row as f32 into sc. */
static OG_INLINE OG_AVX512 void scales_512(const og_f16 *s, int64_t ng, float *sc) {
    const __mmask16 m = ng >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << ng) - 1u);
    _mm512_storeu_ps(sc, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s)));
}

/* nr (<= 4, a constant where inlined) rows; dt a constant too. Each line
 * of quants is matched by a prefetch of the same line `ahead` rows on. */
static OG_INLINE OG_AVX512 void gemv_q_tile_512(const float *x, const uint8_t *q, const og_f16 *s,
                                                og_dtype dt, int64_t K, const int nr, int64_t ahead,
                                                bool stream, float *out) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const int64_t G = K / QG;
    const int64_t line = 64 / (int64_t)gb; /* groups per 64-byte line */
    const __m512 lut = q4_lut_512();
    __m512 acc[4];
    float sc[4][QCHUNK];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += QCHUNK) {
        const int64_t ng = G - g0 < QCHUNK ? G - g0 : QCHUNK;
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) scales_512(s + r * G + g0, ng, sc[r]);
        for (int64_t g = 0; g < ng; g++) {
            const size_t k = (size_t)(g0 + g) * QG;
            const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            const uint8_t *qg = q + (size_t)(g0 + g) * gb;
            if ((g0 + g) % line == 0) {
#pragma GCC unroll 4
                for (int r = 0; r < nr; r++) {
                    const char *next = (const char *)(qg + (size_t)(r + ahead) * rb);
                    if (stream)
                        _mm_prefetch(next, _MM_HINT_T1);
                    else
                        _mm_prefetch(next, _MM_HINT_T0);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const __m512 d = dt == OG_DTYPE_Q8 ? group_q8_512(qg + (size_t)r * rb, x0, x1)
                                                   : group_q4_512(qg + (size_t)r * rb, x0, x1, lut);
                acc[r] = _mm512_fmadd_ps(d, _mm512_set1_ps(sc[r][g]), acc[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

static OG_INLINE OG_AVX512 void gemv_q_512(const float *x, const uint8_t *q, const og_f16 *s,
                                           og_dtype dt, int64_t K, int64_t rows, bool stream,
                                           float *out) {
    const size_t rb = og_quant_row_bytes(dt, K);
    const int64_t G = K / QG;
    int64_t r = 0;
    if (stream && dt == OG_DTYPE_Q8) { /* one stream, prefetched about 4 KiB ahead */
        const int64_t ahead = rb < 4096 ? (int64_t)(4096 / rb) : 1;
        for (; r < rows; r++)
            gemv_q_tile_512(x, q + (size_t)r * rb, s + r * G, dt, K, 1, ahead, stream, out + r);
        return;
    }
    for (; r + 4 <= rows; r += 4)
        gemv_q_tile_512(x, q + (size_t)r * rb, s + r * G, dt, K, 4, 4, stream, out + r);
    for (; r < rows; r++)
        gemv_q_tile_512(x, q + (size_t)r * rb, s + r * G, dt, K, 1, 1, stream, out + r);
}

OG_AVX512 void og_gemv_q_rows_avx512(const float *x, const uint8_t *q, const og_f16 *s,
                                     og_dtype dt, int64_t K, int64_t rows, bool stream,
                                     float *out) {
    if (dt == OG_DTYPE_Q8)
        gemv_q_512(x, q, s, OG_DTYPE_Q8, K, rows, stream, out);
    else
        gemv_q_512(x, q, s, OG_DTYPE_Q4, K, rows, stream, out);
}

/* ---- og_matmul_rows_cpu with q8/q4 weights: tiles of QF features x QR
 * rows of x. A group's quants are widened once per tile and meet every row;
 * each (row, feature) takes exactly the GEMV's operations in its order
 * (products of the group into lanes, times the scale into the sums, the
 * same reduction), so the bits are og_gemv_q_rows_avx512's. ---- */
enum { QF = 4, QR = 4 };

static OG_INLINE OG_AVX512 void rows_q_tile(const float *x, int64_t K, const uint8_t *q,
                                            const og_f16 *s, og_dtype dt, const int nf,
                                            const int nr, int prefetch, float *out,
                                            int64_t ldo) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const int64_t G = K / QG;
    const int64_t line = 64 / (int64_t)gb;
    const __m512 lut = q4_lut_512();
    __m512 acc[QF][QR];
    float sc[QF][QCHUNK];
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc[f][r] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += QCHUNK) {
        const int64_t ng = G - g0 < QCHUNK ? G - g0 : QCHUNK;
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) scales_512(s + f * G + g0, ng, sc[f]);
        for (int64_t g = 0; g < ng; g++) {
            const size_t k = (size_t)(g0 + g) * QG;
            const uint8_t *qg = q + (size_t)(g0 + g) * gb;
            if (prefetch && (g0 + g) % line == 0) {
#pragma GCC unroll 4
                for (int f = 0; f < nf; f++) {
                    const char *next = (const char *)(qg + (size_t)(f + nf) * rb);
                    if (prefetch == 1)
                        _mm_prefetch(next, _MM_HINT_T1);
                    else
                        _mm_prefetch(next, _MM_HINT_T0);
                }
            }
            __m512 a[QF], b[QF];
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) {
                const uint8_t *p = qg + (size_t)f * rb;
                if (dt == OG_DTYPE_Q8) {
                    a[f] = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
                    b[f] = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
                } else {
                    const __m512i v = q4_bytes_512(p);
                    a[f] = q4_lo_512(v, lut);
                    b[f] = q4_hi_512(v, lut);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const __m512 x0 = _mm512_loadu_ps(x + (size_t)r * (size_t)K + k);
                const __m512 x1 = _mm512_loadu_ps(x + (size_t)r * (size_t)K + k + 16);
#pragma GCC unroll 4
                for (int f = 0; f < nf; f++) {
                    const __m512 d = _mm512_fmadd_ps(b[f], x1, _mm512_mul_ps(a[f], x0));
                    acc[f][r] = _mm512_fmadd_ps(d, _mm512_set1_ps(sc[f][g]), acc[f][r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++)
            out[(size_t)r * (size_t)ldo + (size_t)f] = _mm512_reduce_add_ps(acc[f][r]);
}

/* One instance per (dtype, nf, nr): the tile's loops unroll into registers
 * only with constant bounds. */
#define OG_Q_CASE(NF, NR)                                                                    \
    case NF * 8 + NR:                                                                        \
        if (dt == OG_DTYPE_Q8)                                                               \
            rows_q_tile(x, K, q, s, OG_DTYPE_Q8, NF, NR, prefetch, out, ldo);                \
        else                                                                                 \
            rows_q_tile(x, K, q, s, OG_DTYPE_Q4, NF, NR, prefetch, out, ldo);                \
        return;
static OG_AVX512 void rows_q_block(const float *x, int64_t K, const uint8_t *q, const og_f16 *s,
                                   og_dtype dt, int nf, int nr, int prefetch, float *out,
                                   int64_t ldo) {
    switch (nf * 8 + nr) {
        OG_Q_CASE(1, 1) OG_Q_CASE(1, 2) OG_Q_CASE(1, 3) OG_Q_CASE(1, 4)
        OG_Q_CASE(2, 1) OG_Q_CASE(2, 2) OG_Q_CASE(2, 3) OG_Q_CASE(2, 4)
        OG_Q_CASE(3, 1) OG_Q_CASE(3, 2) OG_Q_CASE(3, 3) OG_Q_CASE(3, 4)
        OG_Q_CASE(4, 1) OG_Q_CASE(4, 2) OG_Q_CASE(4, 3) OG_Q_CASE(4, 4)
    default: return; /* unreachable: nf <= QF, nr <= QR */
    }
}
#undef OG_Q_CASE

/* Blocks of QR rows of x outside (a block's x stays in L1), tiles of QF
 * features inside: the first block brings the panel in (into L2 when the
 * weights stream from memory, else into every level) and the later ones
 * read it from there. */
OG_AVX512 void og_matmul_rows_q_avx512(const float *x, const uint8_t *q, const og_f16 *s,
                                       og_dtype dt, int64_t R, int64_t K, int64_t rows,
                                       bool stream, float *out, int64_t ldo) {
    const size_t rb = og_quant_row_bytes(dt, K);
    const int64_t G = K / QG;
    for (int64_t r0 = 0; r0 < R; r0 += QR) {
        const int nr = R - r0 < QR ? (int)(R - r0) : QR;
        const int prefetch = r0 > 0 ? 0 : stream ? 1 : 2;
        for (int64_t f0 = 0; f0 < rows; f0 += QF) {
            const int nf = rows - f0 < QF ? (int)(rows - f0) : QF;
            rows_q_block(x + r0 * K, K, q + (size_t)f0 * rb, s + f0 * G, dt, nf, nr, prefetch,
                         out + r0 * ldo + f0, ldo);
        }
    }
}

/* The 32 integers q of one q8 / q4 group at p as floats (exact): elements
 * 0..15 in *a, 16..31 in *b. */
static OG_INLINE OG_AVX512 void group_ints_512(const uint8_t *p, og_dtype dt, __m512 lut, __m512 *a, __m512 *b) {
    if (dt == OG_DTYPE_Q8) {
        *a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
        *b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    } else {
        const __m512i v = q4_bytes_512(p);
        *a = q4_lo_512(v, lut);
        *b = q4_hi_512(v, lut);
    }
}

OG_AVX512 void og_dequantize_rows_avx512(const uint8_t *q, const og_f16 *s, og_dtype dt,
                                         int64_t K, int64_t rows, float *dst) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const int64_t G = K / QG;
    const __m512 lut = q4_lut_512();
    float sc[QCHUNK];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *qr = q + (size_t)r * rb;
        float *o = dst + r * K;
        for (int64_t g0 = 0; g0 < G; g0 += QCHUNK) {
            const int64_t ng = G - g0 < QCHUNK ? G - g0 : QCHUNK;
            scales_512(s + r * G + g0, ng, sc);
            for (int64_t g = g0; g < g0 + ng; g++) {
                const __m512 sv = _mm512_set1_ps(sc[g - g0]);
                __m512 a, b;
                group_ints_512(qr + (size_t)g * gb, dt, lut, &a, &b);
                /* scale * q as og_dequantize_row: exact */
                _mm512_storeu_ps(o + g * QG, _mm512_mul_ps(sv, a));
                _mm512_storeu_ps(o + g * QG + 16, _mm512_mul_ps(sv, b));
            }
        }
    }
}

/* 16 small integers held as floats -> their bf16 bits (exact: the low half
 * of each float is zero). */
static OG_INLINE OG_AVX512 __m256i int_floats_bf16_512(__m512 v) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

OG_AVX512 void og_quant_ints_avx512(const uint8_t *q, og_dtype dt, int64_t K, int64_t rows, og_bf16 *dst) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const __m512 lut = q4_lut_512();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < K / QG; g++) {
            __m512 a, b;
            group_ints_512(q + (size_t)r * rb + (size_t)g * gb, dt, lut, &a, &b);
            og_bf16 *o = dst + r * K + g * QG;
            _mm256_storeu_si256((__m256i *)o, int_floats_bf16_512(a));
            _mm256_storeu_si256((__m256i *)(o + 16), int_floats_bf16_512(b));
        }
}

OG_AVX512 void og_bf16_to_f32_avx512(const og_bf16 *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16_bf16_512(src + i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, maskload16_bf16_512(src + i, m));
    }
}

OG_AVX512 void og_f32_to_bf16_avx512(const float *src, og_bf16 *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtepi32_epi16(og_bf16_lanes16(_mm512_loadu_ps(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m,
                                          og_bf16_lanes16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

OG_AVX512 float og_sum_squares_avx512(const float *x, int64_t N) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= N; i += 32) {
        __m512 u = _mm512_loadu_ps(x + i), v = _mm512_loadu_ps(x + i + 16);
        a = _mm512_fmadd_ps(u, u, a);
        b = _mm512_fmadd_ps(v, v, b);
    }
    for (; i < N; i += 16) {
        __mmask16 m = N - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (N - i)) - 1u);
        __m512 u = _mm512_maskz_loadu_ps(m, x + i);
        a = _mm512_fmadd_ps(u, u, a);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

/* Pass 1 finds the maximum (and any NaN) lane-wise, pass 2 the first index
 * holding it; the row is small enough (V floats) to stay in cache. */
OG_AVX512 int64_t og_argmax_avx512(const float *x, int64_t V) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= V; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, v);
    }
    float best = _mm512_reduce_max_ps(mx);
    for (int64_t j = i; j < V; j++) {
        if (isnan(x[j])) nan = 1;
        if (x[j] > best) best = x[j];
    }
    if (nan) {
        for (int64_t j = 0; j < V; j++)
            if (isnan(x[j])) return j;
    }
    __m512 b = _mm512_set1_ps(best);
    for (i = 0; i + 16 <= V; i += 16) {
        __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < V; i++)
        if (x[i] == best) return i;
    return 0; /* unreachable: best is one of the values */
}

/* ======================= AVX2 ======================= */

static OG_INLINE OG_AVX2 __m256 load8_bf16_256(const og_bf16 *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static OG_INLINE OG_AVX2 __m256 load_w_256(const void *w, og_dtype dt, size_t i) {
    return dt == OG_DTYPE_BF16 ? load8_bf16_256((const og_bf16 *)w + i)
                               : _mm256_loadu_ps((const float *)w + i);
}
static OG_INLINE OG_AVX2 float hsum_256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Four rows at a time; the tail of K (< 8) is summed in scalar. */
static OG_INLINE OG_AVX2 void gemv_avx2(const float *x, const void *w, og_dtype dt, int64_t K,
                                        int64_t rows, float *out) {
    const size_t k_main = (size_t)(K & ~(int64_t)7);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const size_t b0 = (size_t)r * (size_t)K, b1 = b0 + (size_t)K, b2 = b1 + (size_t)K,
                     b3 = b2 + (size_t)K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
               a3 = _mm256_setzero_ps();
        for (size_t k = 0; k < k_main; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(load_w_256(w, dt, b0 + k), xv, a0);
            a1 = _mm256_fmadd_ps(load_w_256(w, dt, b1 + k), xv, a1);
            a2 = _mm256_fmadd_ps(load_w_256(w, dt, b2 + k), xv, a2);
            a3 = _mm256_fmadd_ps(load_w_256(w, dt, b3 + k), xv, a3);
        }
        float s0 = hsum_256(a0), s1 = hsum_256(a1), s2 = hsum_256(a2), s3 = hsum_256(a3);
        for (size_t k = k_main; k < (size_t)K; k++) {
            s0 += x[k] * og_load_f32(w, dt, b0 + k);
            s1 += x[k] * og_load_f32(w, dt, b1 + k);
            s2 += x[k] * og_load_f32(w, dt, b2 + k);
            s3 += x[k] * og_load_f32(w, dt, b3 + k);
        }
        out[r] = s0;
        out[r + 1] = s1;
        out[r + 2] = s2;
        out[r + 3] = s3;
    }
    for (; r < rows; r++) {
        const size_t b = (size_t)r * (size_t)K;
        __m256 a = _mm256_setzero_ps();
        for (size_t k = 0; k < k_main; k += 8)
            a = _mm256_fmadd_ps(load_w_256(w, dt, b + k), _mm256_loadu_ps(x + k), a);
        float s = hsum_256(a);
        for (size_t k = k_main; k < (size_t)K; k++) s += x[k] * og_load_f32(w, dt, b + k);
        out[r] = s;
    }
}

OG_AVX2 void og_gemv_rows_avx2(const float *x, const void *w, og_dtype dt, int64_t K,
                               int64_t rows, float *out) {
    if (dt == OG_DTYPE_BF16)
        gemv_avx2(x, w, OG_DTYPE_BF16, K, rows, out);
    else
        gemv_avx2(x, w, OG_DTYPE_F32, K, rows, out);
}

/* ---- quantized weights (q8, q4), as at AVX-512 with 8 lanes: a group's 32
 * products in 8 lanes (four each), then scaled into the row's lane sums.
 * The f16 scales widen with F16C (every AVX2 CPU has it; the AVX2 level
 * requires it), 8 groups at a time. ---- */
#define OG_AVX2_F16C __attribute__((target("avx2,fma,f16c")))
enum { QCHUNK8 = 8 };

static OG_INLINE OG_AVX2 __m256 q8_8_256(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* The 32 elements of a q4 group as q (not q + 8), in order: e[0] elements
 * 0..7, e[1] 8..15 (low nibbles of bytes 0..15), e[2] 16..23, e[3] 24..31. */
static OG_INLINE OG_AVX2 void q4_group_256(const uint8_t *p, __m256 e[4]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i lo = _mm256_cvtepu8_epi32(b), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i m = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    e[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(lo, m), eight));
    e[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(hi, m), eight));
    e[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(lo, 4), eight));
    e[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(hi, 4), eight));
}
static OG_INLINE OG_AVX2 void group_elems_256(const uint8_t *p, og_dtype dt, __m256 e[4]) {
    if (dt == OG_DTYPE_Q8) {
        e[0] = q8_8_256(p), e[1] = q8_8_256(p + 8), e[2] = q8_8_256(p + 16);
        e[3] = q8_8_256(p + 24);
    } else {
        q4_group_256(p, e);
    }
}
static OG_INLINE OG_AVX2_F16C void scales_256(const og_f16 *s, int64_t ng, float *sc) {
    og_f16 h[QCHUNK8] = {0};
    memcpy(h, s, (size_t)ng * sizeof *h);
    _mm256_storeu_ps(sc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
}

static OG_INLINE OG_AVX2_F16C void gemv_q_tile_256(const float *x, const uint8_t *q,
                                                   const og_f16 *s, og_dtype dt, int64_t K,
                                                   const int nr, bool stream, float *out) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const int64_t G = K / QG;
    const int64_t line = 64 / (int64_t)gb;
    __m256 acc[4];
    float sc[4][QCHUNK8];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += QCHUNK8) {
        const int64_t ng = G - g0 < QCHUNK8 ? G - g0 : QCHUNK8;
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) scales_256(s + r * G + g0, ng, sc[r]);
        for (int64_t g = 0; g < ng; g++) {
            const size_t k = (size_t)(g0 + g) * QG;
            const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8),
                         x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
            const uint8_t *qg = q + (size_t)(g0 + g) * gb;
            if ((g0 + g) % line == 0) {
#pragma GCC unroll 4
                for (int r = 0; r < nr; r++) {
                    const char *next = (const char *)(qg + (size_t)(r + nr) * rb);
                    if (stream)
                        _mm_prefetch(next, _MM_HINT_T1);
                    else
                        _mm_prefetch(next, _MM_HINT_T0);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                __m256 e[4];
                group_elems_256(qg + (size_t)r * rb, dt, e);
                __m256 d = _mm256_mul_ps(e[0], x0);
                d = _mm256_fmadd_ps(e[1], x1, d);
                d = _mm256_fmadd_ps(e[2], x2, d);
                d = _mm256_fmadd_ps(e[3], x3, d);
                acc[r] = _mm256_fmadd_ps(d, _mm256_set1_ps(sc[r][g]), acc[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) out[r] = hsum_256(acc[r]);
}

static OG_INLINE OG_AVX2_F16C void gemv_q_256(const float *x, const uint8_t *q, const og_f16 *s,
                                              og_dtype dt, int64_t K, int64_t rows, bool stream,
                                              float *out) {
    const size_t rb = og_quant_row_bytes(dt, K);
    const int64_t G = K / QG;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        gemv_q_tile_256(x, q + (size_t)r * rb, s + r * G, dt, K, 4, stream, out + r);
    for (; r < rows; r++)
        gemv_q_tile_256(x, q + (size_t)r * rb, s + r * G, dt, K, 1, stream, out + r);
}

OG_AVX2_F16C void og_gemv_q_rows_avx2(const float *x, const uint8_t *q, const og_f16 *s,
                                      og_dtype dt, int64_t K, int64_t rows, bool stream,
                                      float *out) {
    if (dt == OG_DTYPE_Q8)
        gemv_q_256(x, q, s, OG_DTYPE_Q8, K, rows, stream, out);
    else
        gemv_q_256(x, q, s, OG_DTYPE_Q4, K, rows, stream, out);
}

OG_AVX2_F16C void og_dequantize_rows_avx2(const uint8_t *q, const og_f16 *s, og_dtype dt,
                                          int64_t K, int64_t rows, float *dst) {
    const size_t rb = og_quant_row_bytes(dt, K), gb = og_quant_row_bytes(dt, QG);
    const int64_t G = K / QG;
    float sc[QCHUNK8];
    for (int64_t r = 0; r < rows; r++) {
        float *o = dst + r * K;
        for (int64_t g0 = 0; g0 < G; g0 += QCHUNK8) {
            const int64_t ng = G - g0 < QCHUNK8 ? G - g0 : QCHUNK8;
            scales_256(s + r * G + g0, ng, sc);
            for (int64_t g = g0; g < g0 + ng; g++) {
                const __m256 sv = _mm256_set1_ps(sc[g - g0]);
                __m256 e[4];
                group_elems_256(q + (size_t)r * rb + (size_t)g * gb, dt, e);
                for (int i = 0; i < 4; i++) /* scale * q as og_dequantize_row: exact */
                    _mm256_storeu_ps(o + g * QG + 8 * i, _mm256_mul_ps(sv, e[i]));
            }
        }
    }
}

OG_AVX2 void og_bf16_to_f32_avx2(const og_bf16 *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_bf16_256(src + i));
    for (; i < n; i++) dst[i] = og_f32_from_bf16(src[i]);
}

OG_AVX2 void og_f32_to_bf16_avx2(const float *src, og_bf16 *dst, size_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                  quiet_bit = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m256i u = _mm256_castps_si256(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, bias)), 16);
        __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet_bit);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        __m256i r = _mm256_blendv_epi8(rounded, quiet, nan); /* 8 x u32 <= 0xffff */
        /* packus keeps 128-bit lanes: [r0-3 r0-3 | r4-7 r4-7] -> take quads 0 and 2 */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
    }
    for (; i < n; i++) dst[i] = og_bf16_from_f32(src[i]);
}

OG_AVX2 float og_sum_squares_avx2(const float *x, int64_t N) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= N; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
        a = _mm256_fmadd_ps(u, u, a);
        b = _mm256_fmadd_ps(v, v, b);
    }
    for (; i + 8 <= N; i += 8) {
        __m256 u = _mm256_loadu_ps(x + i);
        a = _mm256_fmadd_ps(u, u, a);
    }
    float s = hsum_256(_mm256_add_ps(a, b));
    for (; i < N; i++) s += x[i] * x[i];
    return s;
}

OG_AVX2 int64_t og_argmax_avx2(const float *x, int64_t V) {
    __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mx);
    float best = -INFINITY;
    for (int j = 0; j < 8; j++)
        if (lanes[j] > best) best = lanes[j];
    bool any_nan = _mm256_movemask_ps(nan) != 0;
    for (int64_t j = i; j < V; j++) {
        if (isnan(x[j])) any_nan = true;
        if (x[j] > best) best = x[j];
    }
    if (any_nan) {
        for (int64_t j = 0; j < V; j++)
            if (isnan(x[j])) return j;
    }
    __m256 b = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= V; i += 8) {
        int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < V; i++)
        if (x[i] == best) return i;
    return 0; /* unreachable: best is one of the values */
}
