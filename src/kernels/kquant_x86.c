/* AVX-512 and AVX2 versions of the k-quant products (kquant_cpu.h): the
 * decode GEMV of q4_k, q5_k and q6_k weights and the dequantization of
 * every k-quant (q2_k and q3_k products take the plain C GEMV).
 *
 * A block's levels are unpacked 64 at a time (32 with AVX2) into unsigned
 * bytes in element order, so they meet x's int8 terms (og_kq_x hi and lo,
 * also in element order) directly.
 * AVX-512: vpdpbusd (vpmaddubsw + vpmaddwd by ones without AVX512_VNNI,
 * the same sums) multiplies four levels by four x terms and adds them into
 * an int32 lane: the hi sums, times 254, are the lo sums' starting value,
 * so each lane holds 254 hi + lo over four elements. The four runs' lanes
 * are then added across, by permutes, into one vector of 16 lanes of 16
 * elements each (q4_k, q5_k: two lanes a sub-block of 32), multiplied by
 * the sub-block scales once a block rather than once a run; the lanes go
 * to f32 once, times u * d, less the mins' or level offsets' term (x's sums
 * of 16 times mins or scales, in int32 lanes too), into the row's f32
 * lanes, summed at the end.
 * AVX2: vpmaddubsw multiplies a level by an x term and adds neighbours
 * into int16 (at most 2 * 63 * 127, no saturation), vpmaddwd multiplies
 * those by the sub-block's scale and adds neighbours into int32 lanes; a
 * block's lanes go to f32 once (254 hi + lo), as above.
 * Every (weight row, x row) pair runs that same sequence in whatever tile
 * it falls, so the bits do not depend on how rows are split
 * (kquant_cpu.h).
 *
 * Each function carries its own target attribute; kquant_cpu.c calls them
 * only at the ISA level og_cpu_isa_active allows.
 * Letters as in kquant_cpu.h: K in features, R rows of x, rows weight rows. */
#include "kernels/kquant_cpu.h"

#include <immintrin.h>
#include <string.h>

#define OG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define OG_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c,avx512vnni")))
#define OG_AVX2 __attribute__((target("avx2,fma,f16c")))
#define OG_INLINE inline __attribute__((always_inline))

enum { QK = OG_KQUANT_BLOCK, TF = 4 /* weight rows a tile */, TR = 4 /* x rows a tile */ };

/* An f16 scale as f32 (exact), one vcvtph2ps: the bit shuffling it replaced,
 * with its branch for subnormals and NaN, cost a quarter of the q4_k GEMV
 * on one core in cache (12.3 -> 9.2 ns a block, 2026-12-07). */
static OG_INLINE OG_AVX2 float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* q4_k / q5_k: the 8 scales and 8 mins of a block's 12 packed bytes, one
 * byte each (kquant.c has the packing). */
static OG_INLINE void scales_mins_6bit(const uint8_t *s, uint64_t *sc, uint64_t *m) {
    const uint32_t u0 = le32(s), u1 = le32(s + 4), u2 = le32(s + 8);
    const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *m = m_lo | (uint64_t)m_hi << 32;
}

/* ======================= AVX-512 ======================= */

/* acc + the sums of four neighbouring products of unsigned levels and
 * signed x terms, into int32 lanes: vpdpbusd, or vpmaddubsw (levels at most
 * 63, so the pairs fit int16 unsaturated) then vpmaddwd by ones. */
static OG_INLINE OG_AVX512 __m512i dot4_512(__m512i acc, __m512i lv, __m512i x) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(lv, x), _mm512_set1_epi16(1)));
}
static OG_INLINE OG_AVX512_VNNI __m512i dot4_512_vnni(__m512i acc, __m512i lv, __m512i x) {
    return _mm512_dpbusd_epi32(acc, lv, x);
}

/* Four runs' lanes (run g: 16 lanes of four elements each, elements
 * 64 g ..) added by fours into 16 lanes of 16 elements in element order. */
static OG_INLINE OG_AVX512 __m512i sum_by16_512(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i a = _mm512_add_epi32(_mm512_permutex2var_epi32(v0, even, v1), _mm512_permutex2var_epi32(v0, odd, v1));
    const __m512i b = _mm512_add_epi32(_mm512_permutex2var_epi32(v2, even, v3), _mm512_permutex2var_epi32(v2, odd, v3));
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

/* One block of up to TF weight rows: per 64-element run g, its levels
 * (lv[f][g]); per weight row the scale of each 16 elements' lane (sc[f]:
 * q4_k / q5_k's sub-block scales, two lanes each; q6_k's own scales) and
 * the int32 lane terms the block's sums of x take (xs[f]: mins of q4_k /
 * q5_k; q6_k's scales, whose level offset 32 multiplies them); the f32
 * scales. */
typedef struct {
    __m512i lv[TF][4], sc[TF], xs[TF];
    float d[TF], dmin[TF];
} block512;

/* Levels of block b (dt a constant where inlined) into k's row f. */
static OG_INLINE OG_AVX512 void unpack_512(og_dtype dt, const uint8_t *b, block512 *k, int f) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (dt == OG_DTYPE_Q6_K) {
        k->d[f] = f16_at(b + 208);
        k->dmin[f] = 0;
        k->sc[f] = k->xs[f] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192)));
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(b + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
            for (int odd = 0; odd < 2; odd++) {
                const int g = 2 * h + odd;
                /* run g: the low (even g) or high nibbles of the 64 bytes;
                 * elements 0-31 take qh bits 4 odd .. +1, 32-63 bits 4 odd + 2 .. +3 */
                const __m512i lo = _mm512_and_si512(odd ? _mm512_srli_epi16(ql, 4) : ql, low4);
                const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * odd)),
                                                      _mm256_set1_epi16((short)(4 * odd + 2)), 1);
                const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qh, sh), _mm512_set1_epi8(3));
                k->lv[f][g] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
            }
        }
        return;
    }
    /* q4_k, q5_k: run g is sub-blocks 2g (the low nibbles of bytes 32g ..
     * 32g + 31) and 2g + 1 (their high nibbles) */
    k->d[f] = f16_at(b);
    k->dmin[f] = f16_at(b + 2);
    uint64_t sc, mn;
    scales_mins_6bit(b + 4, &sc, &mn);
    /* lane l (16 elements) of sub-block l / 2 */
    const __m512i by2 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    k->sc[f] = _mm512_permutexvar_epi32(by2, _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    k->xs[f] = _mm512_permutexvar_epi32(by2, _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    const uint8_t *qs = b + (dt == OG_DTYPE_Q4_K ? 16 : 48);
    for (int h = 0; h < 2; h++) { /* 64 bytes: runs 2h, 2h + 1 */
        const __m512i raw = _mm512_loadu_si512(qs + 64 * h);
        const __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        k->lv[f][2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
        k->lv[f][2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xee);
    }
    if (dt == OG_DTYPE_Q5_K) { /* the fifth bit of sub-block j is bit j of qh, moved to bit 4 */
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        for (int g = 0; g < 4; g++) {
            /* lanes of bytes 0-31 take bit 2g, 32-63 bit 2g + 1: shifted by at most 4 within a 16-bit
             * lane, each byte's bit 4 comes from its own byte */
            const int s0 = 4 - 2 * g, s1 = 3 - 2 * g;
            const __m512i hb = s1 >= 0 ? _mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16((short)s0),
                                                                                   _mm256_set1_epi16((short)s1), 1))
                                       : _mm512_srlv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16((short)-s0),
                                                                                   _mm256_set1_epi16((short)-s1), 1));
            k->lv[f][g] = _mm512_ternarylogic_epi32(k->lv[f][g], hb, bit4, 0xf8); /* lv | (hb & bit4) */
        }
    }
}

/* The tile kernel, once with vpmaddubsw + vpmaddwd and once with vpdpbusd
 * (kquant_x86_tile.h, included twice: a function can inline only what
 * its own target covers). */
#define OG_KQ_TILE tile_512
#define OG_KQ_TARGET OG_AVX512
#define OG_KQ_DOT4 dot4_512
#include "kernels/kquant_x86_tile.h"
#define OG_KQ_TILE tile_512v
#define OG_KQ_TARGET OG_AVX512_VNNI
#define OG_KQ_DOT4 dot4_512_vnni
#include "kernels/kquant_x86_tile.h"

#define OG_KQ_CASE(DT, V, NF, NR)                                                                    \
    case NF * 8 + NR:                                                                                \
        if (V) tile_512v(DT, x, nb, wf, rb, NF, NR, pf, ahead, o, ldo);                              \
        else tile_512(DT, x, nb, wf, rb, NF, NR, pf, ahead, o, ldo);                                 \
        break;
/* All `rows` weight rows against nr rows of x, tf weight rows a tile
 * (the loop here rather than in the caller: a call a row was a tenth of
 * the one-row GEMV at K = 1024). */
#define OG_KQ_TILES(NAME, DT, V, ATTR)                                                               \
    static ATTR void NAME(const og_kq_x *x, int64_t nb, const uint8_t *w, size_t rb, int64_t rows,    \
                          int tf, int nr, int prefetch, bool one, float *out, int64_t ldo) {         \
        for (int64_t f0 = 0; f0 < rows; f0 += tf) {                                                  \
            const int nf = rows - f0 < tf ? (int)(rows - f0) : tf;                                   \
            int64_t ahead = one ? (rb < 4096 ? (int64_t)(4096 / rb) : 1) : nf;                       \
            if (ahead > rows - f0 - nf) ahead = rows - f0 - nf; /* within the block */               \
            const int pf = ahead > 0 ? prefetch : 0;                                                 \
            const uint8_t *wf = w + (size_t)f0 * rb;                                                 \
            float *o = out + f0;                                                                     \
            switch (nf * 8 + nr) {                                                                   \
                OG_KQ_CASE(DT, V, 1, 1) OG_KQ_CASE(DT, V, 2, 1) OG_KQ_CASE(DT, V, 3, 1)              \
                OG_KQ_CASE(DT, V, 4, 1) OG_KQ_CASE(DT, V, 1, 2) OG_KQ_CASE(DT, V, 2, 2)              \
                OG_KQ_CASE(DT, V, 1, 3) OG_KQ_CASE(DT, V, 2, 3) OG_KQ_CASE(DT, V, 1, 4)              \
                OG_KQ_CASE(DT, V, 2, 4)                                                              \
            default: return;                                                                         \
            }                                                                                        \
        }                                                                                            \
    }
OG_KQ_TILES(tiles_q4_512, OG_DTYPE_Q4_K, false, OG_AVX512)
OG_KQ_TILES(tiles_q5_512, OG_DTYPE_Q5_K, false, OG_AVX512)
OG_KQ_TILES(tiles_q6_512, OG_DTYPE_Q6_K, false, OG_AVX512)
OG_KQ_TILES(tiles_q4_512v, OG_DTYPE_Q4_K, true, OG_AVX512_VNNI)
OG_KQ_TILES(tiles_q5_512v, OG_DTYPE_Q5_K, true, OG_AVX512_VNNI)
OG_KQ_TILES(tiles_q6_512v, OG_DTYPE_Q6_K, true, OG_AVX512_VNNI)
#undef OG_KQ_TILES
#undef OG_KQ_CASE

typedef void (*tiles_fn)(const og_kq_x *, int64_t, const uint8_t *, size_t, int64_t, int, int, int, bool, float *,
                         int64_t);

bool og_kq_gemv_avx512(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                       bool stream, bool vnni, float *out, int64_t ldo) {
    tiles_fn fn;
    switch (dt) {
    case OG_DTYPE_Q4_K: fn = vnni ? tiles_q4_512v : tiles_q4_512; break;
    case OG_DTYPE_Q5_K: fn = vnni ? tiles_q5_512v : tiles_q5_512; break;
    case OG_DTYPE_Q6_K: fn = vnni ? tiles_q6_512v : tiles_q6_512; break;
    default: return false;
    }
    const int64_t nb = K / QK;
    const size_t rb = og_kquant_row_bytes(dt, K);
    /* one row of x: tiles of TF weight rows, each prefetching the next
     * tile's; streamed from memory, one weight row at a time instead (one
     * stream, prefetched about 4 KiB on: q6_k decode of the 0.6B shape on
     * this 2-core kind, 2026-12-06, side by side: 41.8 - 43.0 tok/s four
     * rows a tile, 49.0 - 58.2 one). More rows of x: tiles of 2 weight rows
     * x TR rows of x (a block's levels unpacked once for TR rows), the first
     * pass over the panel bringing it into the caches. */
    const bool one = R == 1 && stream;
    const int tr = R == 1 ? 1 : TR, tf = one ? 1 : R == 1 ? TF : 2;
    for (int64_t r0 = 0; r0 < R; r0 += tr) {
        const int nr = R - r0 < tr ? (int)(R - r0) : tr;
        fn(x + r0 * nb, nb, w, rb, rows, tf, nr, r0 > 0 ? 0 : stream ? 1 : 2, one, out + r0 * ldo, ldo);
    }
    return true;
}

/* ---- dequantization: each element as og_kquant_dequantize_row gives it
 * (the product d * scale, then times the level, less d_min * min: the level
 * product is exact, so a fused multiply-subtract rounds once as the
 * reference's subtraction does; q6_k's two products stay two roundings) ---- */

/* The 16 bytes q (0..3) of 64 levels as f32. */
static OG_INLINE OG_AVX512 __m512 levels16_512(__m512i lv, int q) {
    __m128i part;
    switch (q) {
    case 0: part = _mm512_extracti32x4_epi32(lv, 0); break;
    case 1: part = _mm512_extracti32x4_epi32(lv, 1); break;
    case 2: part = _mm512_extracti32x4_epi32(lv, 2); break;
    default: part = _mm512_extracti32x4_epi32(lv, 3); break;
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(part));
}

static OG_INLINE OG_AVX512 void dequant_block_512(og_dtype dt, const uint8_t *b, float *y) {
    block512 blk;
    unpack_512(dt, b, &blk, 0);
    if (dt == OG_DTYPE_Q6_K) { /* per 16 elements (d * scale) * (level - 32): two roundings */
        float dl[16];
        _mm512_storeu_ps(dl, _mm512_mul_ps(_mm512_set1_ps(blk.d[0]), _mm512_cvtepi32_ps(blk.xs[0])));
        for (int g = 0; g < 4; g++)
            for (int q = 0; q < 4; q++)
                _mm512_storeu_ps(y + 64 * g + 16 * q,
                                 _mm512_mul_ps(_mm512_set1_ps(dl[4 * g + q]),
                                               _mm512_sub_ps(levels16_512(blk.lv[0][g], q), _mm512_set1_ps(32.0f))));
        return;
    }
    uint64_t sc, mn;
    scales_mins_6bit(b + 4, &sc, &mn);
    for (int g = 0; g < 4; g++)
        for (int q = 0; q < 4; q++) {
            const int j = 2 * g + q / 2; /* the sub-block of these 16 */
            const float dl = blk.d[0] * (float)((sc >> (8 * j)) & 0xff);
            const float ml = blk.dmin[0] * (float)((mn >> (8 * j)) & 0xff);
            _mm512_storeu_ps(y + 64 * g + 16 * q,
                             _mm512_fmsub_ps(_mm512_set1_ps(dl), levels16_512(blk.lv[0][g], q), _mm512_set1_ps(ml)));
        }
}

OG_AVX512 bool og_kq_dequantize_avx512(og_dtype dt, const uint8_t *w, int64_t K, int64_t rows, float *dst) {
    if (dt != OG_DTYPE_Q4_K && dt != OG_DTYPE_Q5_K && dt != OG_DTYPE_Q6_K) return false;
    const int64_t nb = K / QK;
    const size_t bb = og_kquant_block_bytes(dt), rb = og_kquant_row_bytes(dt, K);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < nb; k++) {
            const uint8_t *b = w + (size_t)r * rb + (size_t)k * bb;
            float *y = dst + r * K + k * QK;
            if (dt == OG_DTYPE_Q4_K) dequant_block_512(OG_DTYPE_Q4_K, b, y);
            else if (dt == OG_DTYPE_Q5_K) dequant_block_512(OG_DTYPE_Q5_K, b, y);
            else dequant_block_512(OG_DTYPE_Q6_K, b, y);
        }
    return true;
}

/* ======================= AVX2 ======================= */

/* Run c (0..7) of 32 elements of a block: its levels as unsigned bytes
 * and each element's scale as int16 (lanes 0-7 the first 16, 8-15 the
 * second). dt a constant where inlined. */
static OG_INLINE OG_AVX2 void run_256(og_dtype dt, const uint8_t *b, int c, const uint8_t *sc, __m256i *lv,
                                      __m256i *s16) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (dt == OG_DTYPE_Q6_K) {
        const int h = c / 4, i = c % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (i % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (i / 2))), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i)), _mm256_set1_epi8(3));
        *lv = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        *s16 = _mm256_set_m128i(_mm_set1_epi16((short)(int8_t)b[192 + 2 * c + 1]),
                                _mm_set1_epi16((short)(int8_t)b[192 + 2 * c]));
        return;
    }
    const uint8_t *qs = b + (dt == OG_DTYPE_Q4_K ? 16 : 48);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2)));
    __m256i v = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (c % 2))), low4);
    if (dt == OG_DTYPE_Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(c)), _mm256_set1_epi8(1));
        v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
    }
    *lv = v;
    *s16 = _mm256_set1_epi16((short)sc[c]);
}

/* The AVX2 tile: nf weight rows x nr rows of x, the AVX-512 tile's
 * arithmetic in 8 lanes. */
static OG_INLINE OG_AVX2 void tile_256(og_dtype dt, const og_kq_x *x, int64_t nb, const uint8_t *w, size_t rb,
                                       const int nf, const int nr, int prefetch, int64_t ahead, float *out,
                                       int64_t ldo) {
    const size_t bb = og_kquant_block_bytes(dt);
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int f = 0; f < nf; f++)
#pragma GCC unroll 2
        for (int r = 0; r < nr; r++) acc[f][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b[2];
        uint8_t sc[2][16];
        __m256i xs_lo[2], xs_hi[2]; /* the terms of x's sums: per 16 elements */
        float d[2], dmin[2];
#pragma GCC unroll 2
        for (int f = 0; f < nf; f++) {
            b[f] = w + (size_t)f * rb + (size_t)k * bb;
            if (prefetch) {
                const char *next = (const char *)(b[f] + (size_t)ahead * rb);
                for (size_t line = 0; line < bb; line += 64) {
                    if (prefetch == 1) _mm_prefetch(next + line, _MM_HINT_T1);
                    else _mm_prefetch(next + line, _MM_HINT_T0);
                }
            }
            if (dt == OG_DTYPE_Q6_K) {
                d[f] = f16_at(b[f] + 208);
                dmin[f] = 0;
                const __m128i s8 = _mm_loadu_si128((const __m128i *)(b[f] + 192));
                xs_lo[f] = _mm256_cvtepi8_epi32(s8);
                xs_hi[f] = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
            } else {
                d[f] = f16_at(b[f]);
                dmin[f] = f16_at(b[f] + 2);
                uint64_t s64, m64;
                scales_mins_6bit(b[f] + 4, &s64, &m64);
                memcpy(sc[f], &s64, 8);
                /* min l / 2 for the sums of 16 l */
                const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m64));
                const __m256i dup_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), dup_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
                xs_lo[f] = _mm256_permutevar8x32_epi32(m32, dup_lo);
                xs_hi[f] = _mm256_permutevar8x32_epi32(m32, dup_hi);
            }
        }
        __m256i ah[2][2], al[2][2];
#pragma GCC unroll 2
        for (int f = 0; f < nf; f++)
#pragma GCC unroll 2
            for (int r = 0; r < nr; r++) ah[f][r] = al[f][r] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
#pragma GCC unroll 2
            for (int f = 0; f < nf; f++) {
                __m256i lv, s16;
                run_256(dt, b[f], c, sc[f], &lv, &s16);
#pragma GCC unroll 2
                for (int r = 0; r < nr; r++) {
                    const og_kq_x *xb = &x[r * nb + k];
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(xb->hi + 32 * c));
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)(xb->lo + 32 * c));
                    ah[f][r] = _mm256_add_epi32(ah[f][r], _mm256_madd_epi16(_mm256_maddubs_epi16(lv, xh), s16));
                    al[f][r] = _mm256_add_epi32(al[f][r], _mm256_madd_epi16(_mm256_maddubs_epi16(lv, xl), s16));
                }
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < nr; r++) {
            const og_kq_x *xb = &x[r * nb + k];
            const float u = xb->d / 254.0f;
            const __m256i s_lo = _mm256_loadu_si256((const __m256i *)xb->sum16),
                          s_hi = _mm256_loadu_si256((const __m256i *)(xb->sum16 + 8));
#pragma GCC unroll 2
            for (int f = 0; f < nf; f++) {
                __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ah[f][r]), _mm256_set1_ps(254.0f),
                                           _mm256_cvtepi32_ps(al[f][r]));
                const __m256 t = _mm256_cvtepi32_ps(
                    _mm256_add_epi32(_mm256_mullo_epi32(xs_lo[f], s_lo), _mm256_mullo_epi32(xs_hi[f], s_hi)));
                if (dt == OG_DTYPE_Q6_K) {
                    v = _mm256_fnmadd_ps(t, _mm256_set1_ps(32.0f), v);
                    acc[f][r] = _mm256_fmadd_ps(v, _mm256_set1_ps(u * d[f]), acc[f][r]);
                } else {
                    acc[f][r] = _mm256_fmadd_ps(v, _mm256_set1_ps(u * d[f]), acc[f][r]);
                    acc[f][r] = _mm256_fnmadd_ps(t, _mm256_set1_ps(u * dmin[f]), acc[f][r]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 2
        for (int f = 0; f < nf; f++) {
            const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[f][r]), _mm256_extractf128_ps(acc[f][r], 1));
            const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
            out[(size_t)r * (size_t)ldo + (size_t)f] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
        }
}

#define OG_KQ_CASE(DT, NF, NR)                                                                       \
    case NF * 8 + NR:                                                                                \
        tile_256(DT, x, nb, w, rb, NF, NR, prefetch, ahead, out, ldo);                               \
        return;
#define OG_KQ_TILES(NAME, DT)                                                                        \
    static OG_AVX2 void NAME(const og_kq_x *x, int64_t nb, const uint8_t *w, size_t rb, int nf, int nr, \
                             int prefetch, int64_t ahead, float *out, int64_t ldo) {                 \
        switch (nf * 8 + nr) {                                                                       \
            OG_KQ_CASE(DT, 1, 1) OG_KQ_CASE(DT, 2, 1) OG_KQ_CASE(DT, 1, 2) OG_KQ_CASE(DT, 2, 2)      \
        default: return;                                                                             \
        }                                                                                            \
    }
OG_KQ_TILES(tiles_q4_256, OG_DTYPE_Q4_K)
OG_KQ_TILES(tiles_q5_256, OG_DTYPE_Q5_K)
OG_KQ_TILES(tiles_q6_256, OG_DTYPE_Q6_K)
#undef OG_KQ_TILES
#undef OG_KQ_CASE

typedef void (*tiles256_fn)(const og_kq_x *, int64_t, const uint8_t *, size_t, int, int, int, int64_t, float *,
                            int64_t);

bool og_kq_gemv_avx2(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                     bool stream, float *out, int64_t ldo) {
    tiles256_fn fn;
    switch (dt) {
    case OG_DTYPE_Q4_K: fn = tiles_q4_256; break;
    case OG_DTYPE_Q5_K: fn = tiles_q5_256; break;
    case OG_DTYPE_Q6_K: fn = tiles_q6_256; break;
    default: return false;
    }
    const int64_t nb = K / QK;
    const size_t rb = og_kquant_row_bytes(dt, K);
    for (int64_t r0 = 0; r0 < R; r0 += 2) {
        const int nr = R - r0 < 2 ? (int)(R - r0) : 2;
        const int prefetch = r0 > 0 ? 0 : stream ? 1 : 2;
        for (int64_t f0 = 0; f0 < rows; f0 += 2) {
            const int nf = rows - f0 < 2 ? (int)(rows - f0) : 2;
            fn(x + r0 * nb, nb, w + (size_t)f0 * rb, rb, nf, nr, prefetch && f0 + nf < rows ? prefetch : 0, nf,
               out + r0 * ldo + f0, ldo);
        }
    }
    return true;
}
