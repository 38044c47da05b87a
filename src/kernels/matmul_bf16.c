/* og_matmul_bf16_cpu: the prefill matmul of bf16 programs, x rounded to bf16
 * and multiplied with bf16 weights by vdpbf16ps (AVX512_BF16), accumulating
 * in f32.
 *
 * Letters: T tokens, K in features, N out features, P = ceil(K / 2) pairs of
 * k, TP = T rounded up to TT.
 *
 * vdpbf16ps adds a[2i] b[2i] + a[2i+1] b[2i+1] into f32 lane i. Lanes run
 * over tokens: x is packed once per call as pairs xp [TP/TT, P, TT] (lane t
 * of pair p of a token tile holds x[t, 2p] and x[t, 2p+1]; a tile's pairs
 * are contiguous), and each weight pair w[n, 2p..2p+1] is
 * broadcast straight from the weight rows, so the weights need no packing
 * and stream from memory once per call. A tile is TT = 32 tokens x NT = 8 out
 * features (16 accumulators); a task takes nb out features and runs every
 * tile of its rows, so its 8 weight rows are read from memory by the first
 * token tile and from cache by the others; while a tile of rows runs, its
 * token tiles prefetch the next 8 rows into L2 (bf16 weights), so that only
 * a task's first rows wait for memory. x is packed sixteen tokens at a time,
 * 16 x 16 pairs transposed in registers, and a whole tile's 8 x 32 sums are
 * transposed back in registers into 8 adjacent floats a token of out: both
 * moves took 14 % of a bf16 prefill as scalar loops.
 *
 * q8 and q4 weights take one product per weight: their integers q are
 * bf16 exactly (|q| <= 128), so a task turns GT = 4 rows at a time into q
 * (bf16, [GT, K]) and their group scales (f32), and group_kernel runs the
 * same pairs of x over each group of 32 k into zeroed accumulators, then
 * adds scale * that sum to the tile (x bf16 times q is exact in f32, so
 * only the sums round). Tiles of 4 rows keep 8 accumulators and 8 group
 * sums in registers.
 *
 * q4_k and q5_k take group_kernel too: their sub-blocks are groups of 32
 * whose levels (0..31) are bf16 exactly, with the scale d * sc and the min
 * d_min * m that og_kquant_dequantize_row forms; the group's sum of x
 * (vdpbf16ps against ones, exact products) times the min is subtracted
 * after the scaled sum. One product a weight where the pairs below take two.
 *
 * q6_k (groups of 16) takes the same kernel as bf16 weights, over 2K:
 * each weight, dequantized exactly to f32, is split into two bf16 values, hi
 * = bf16(w) and lo = bf16(w - hi), both rounded to nearest, which make one
 * pair (hi + lo is w within 2^-16 |w|, where bf16 alone is 2^-8), and x is
 * packed with each element twice, pair k = (x[k], x[k]): one vdpbf16ps adds
 * x[k] hi + x[k] lo. A task dequantizes NT rows at a time into its thread's
 * scratch and turns each f32 into its pair in place (4 bytes each), then
 * runs every token tile over them. */
#include "kernels/matmul_amx.h"
#include "kernels/ops_internal.h"

#include <string.h>

enum { TT = 32, NT = 8, NB_MIN = 64, NB_MAX = 256, GT = 4 };

/* q8, q4, q4_k and q5_k take group_kernel (one product per weight); q6_k hi + lo pairs */
static bool grouped(og_dtype dt) {
    return dt == OG_DTYPE_Q8 || dt == OG_DTYPE_Q4 || dt == OG_DTYPE_Q4_K || dt == OG_DTYPE_Q5_K;
}
static bool with_mins(og_dtype dt) { return dt == OG_DTYPE_Q4_K || dt == OG_DTYPE_Q5_K; }

typedef struct {
    const float *x;      /* [T, K]             */
    const void *w;       /* [N, K] of dt       */
    og_dtype dt;         /* bf16 or quantized  */
    const void *bias;    /* [N] of og_bias_dtype(dt), or NULL */
    int64_t T, K, N, P, TP; /* P: pairs of the kernel, (K + 1) / 2 or, quantized, K */
    uint32_t *xp;        /* [TP/TT, P, TT]     */
    og_bf16 *row;        /* [threads, K]; quantized: [threads, NT, K] pairs (uint32) */
    size_t row_stride;   /* elements of row per thread */
    float *out;          /* [T, N]             */
    int64_t nb;          /* out features a task, a multiple of NT (and of GT) */
} bf16_job;

/* The bias of out features [n0, n0 + nn) into b (zeros without one). */
static void load_bias(const bf16_job *j, int64_t n0, int64_t nn, float *b) {
    for (int64_t i = 0; i < nn; i++) b[i] = j->bias ? og_load_f32(j->bias, og_bias_dtype(j->dt), (size_t)(n0 + i)) : 0.0f;
}

/* Tokens [t0, t0 + TT) of out features [n0, n0 + nn) from tile [rows][TT]
 * (row i: feature n0 + i) plus the bias b: nn adjacent floats a token. */
static void store_tile(const bf16_job *j, int64_t t0, int64_t n0, int64_t nn, const float *tile, const float *b) {
    const int64_t tt = j->T - t0 < TT ? j->T - t0 : TT;
    for (int64_t t = 0; t < tt; t++) {
        float *o = j->out + (t0 + t) * j->N + n0;
        for (int64_t i = 0; i < nn; i++) o[i] = tile[i * TT + t] + b[i];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "kernels/bf16_split_x86.h"

#define OG_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline OG_BF16 __m512bh bcast_pair(const og_bf16 *w) {
    uint32_t v;
    memcpy(&v, w, sizeof v);
    return (__m512bh)_mm512_set1_epi32((int)v);
}

/* q4_k / q5_k rows [n0, n0 + rows): levels as bf16 (exact), and per group of
 * 32 the scale d * sc and the min d_min * m, as og_kquant_dequantize_row
 * forms them. */
static OG_BF16 void kq_ints_rows(og_dtype dt, const void *w, int64_t K, int64_t n0, int64_t rows, og_bf16 *ints,
                                 float *scales, float *mins) {
    const size_t rb = og_kquant_row_bytes(dt, K), bb = og_kquant_block_bytes(dt);
    const int64_t G = K / 32;
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t kb = 0; kb < K / 256; kb++) {
            const uint8_t *b = (const uint8_t *)w + (size_t)(n0 + r) * rb + (size_t)kb * bb;
            const float d = og_f32_from_f16((og_f16)(b[0] | b[1] << 8));
            const float dmin = og_f32_from_f16((og_f16)(b[2] | b[3] << 8));
            const uint8_t *s = b + 4, *qs = b + (dt == OG_DTYPE_Q4_K ? 16 : 48);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            for (int j = 0; j < 8; j++) {
                int sc, m;
                if (j < 4) {
                    sc = s[j] & 63;
                    m = s[j + 4] & 63;
                } else {
                    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                scales[r * G + kb * 8 + j] = d * (float)sc;
                mins[r * G + kb * 8 + j] = dmin * (float)m;
                __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
                if (j & 1) v = _mm256_srli_epi16(v, 4);
                v = _mm256_and_si256(v, low4);
                if (dt == OG_DTYPE_Q5_K)
                    v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4));
                const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(v)));
                const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1)));
                og_bf16 *o = ints + r * K + kb * 256 + 32 * j;
                _mm256_storeu_si256((__m256i *)o, (__m256i)_mm512_cvtneps_pbh(f0));
                _mm256_storeu_si256((__m256i *)(o + 16), (__m256i)_mm512_cvtneps_pbh(f1));
            }
        }
}

/* Sixteen rows of sixteen 32-bit lanes transposed in place: r[i] lane l
 * becomes r[l] lane i (four rounds of shuffles within and across the
 * 128-bit blocks). */
static inline OG_BF16 void transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4a + c], block k: lane 4k + c of rows 4a .. 4a + 3 */
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* lane 4k + c of all rows: block k of r[c], r[4 + c], r[8 + c], r[12 + c] */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i e0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), e1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88),
                      o0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd), o1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(e0, e1, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(e0, e1, 0xdd);
        t[4 + c] = _mm512_shuffle_i32x4(o0, o1, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(o0, o1, 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Lanes [i0, i0 + 16) of token tile b for K a multiple of 32: sixteen
 * tokens' x rounded to bf16 as og_f32_to_bf16_cpu does, 32 k at a time
 * (16 pairs a token), transposed into 16 pairs of 16 lanes; tokens past T
 * are read as zeros. */
static OG_BF16 void pack16(const bf16_job *j, int64_t b, int64_t i0) {
    uint32_t *tile = j->xp + b * j->P * TT;
    const float *x[16];
    __mmask16 live[16];
    for (int64_t i = 0; i < 16; i++) {
        const int64_t t = b * TT + i0 + i;
        x[i] = j->x + (t < j->T ? t : 0) * j->K;
        live[i] = t < j->T ? (__mmask16)0xffff : 0;
    }
    for (int64_t k = 0; k < j->K; k += 32) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const __m512i lo = og_bf16_lanes16(_mm512_maskz_loadu_ps(live[i], x[i] + k)),
                          hi = og_bf16_lanes16(_mm512_maskz_loadu_ps(live[i], x[i] + k + 16));
            r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)), _mm512_cvtepi32_epi16(hi), 1);
        }
        transpose16(r);
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++) _mm512_storeu_si512((void *)(tile + (k / 2 + q) * TT + i0), r[q]);
    }
}

/* Token tile b of x rounded to bf16 and scattered into its pair lanes;
 * lanes past T are zero. The k-quants' pairs (each element twice) and K
 * not a multiple of 32 take the plain loop. */
static void pack_task(void *ctx, int64_t b, int thread) {
    const bf16_job *j = ctx;
    if (j->K % 32 == 0 && (!og_dtype_is_quantized(j->dt) || grouped(j->dt))) {
        pack16(j, b, 0);
        pack16(j, b, 16);
        return;
    }
    og_bf16 *row = j->row + (size_t)thread * j->row_stride; /* [K] */
    uint32_t *tile = j->xp + b * j->P * TT;                 /* [P, TT] */
    const int64_t full = j->K / 2;
    for (int64_t i = 0; i < TT; i++) {
        const int64_t t = b * TT + i;
        if (t >= j->T) {
            for (int64_t p = 0; p < j->P; p++) tile[p * TT + i] = 0;
            continue;
        }
        og_f32_to_bf16_cpu(j->x + t * j->K, row, (size_t)j->K);
        if (og_dtype_is_quantized(j->dt) && !grouped(j->dt)) { /* each element twice */
            for (int64_t k = 0; k < j->K; k++) tile[k * TT + i] = (uint32_t)row[k] * 0x10001u;
            continue;
        }
        for (int64_t p = 0; p < full; p++)
            tile[p * TT + i] = (uint32_t)row[2 * p] | (uint32_t)row[2 * p + 1] << 16;
        if (j->K & 1) tile[full * TT + i] = row[j->K - 1];
    }
}

/* store_tile for a whole tile of NT = 8 rows: sixteen tokens at a time
 * transposed in registers into 8 adjacent floats a token (the same f32
 * additions of the bias); tokens of a last part-filled half go plainly. */
static OG_BF16 void store_tile8(const bf16_job *j, int64_t t0, int64_t n0, const float tile[NT][TT], const float *b) {
    const __m512 b8 = _mm512_castps256_ps512(_mm256_loadu_ps(b)), bias = _mm512_shuffle_f32x4(b8, b8, 0x44);
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
                  hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t h = 0; h < TT; h += 16) {
        const int64_t tb = t0 + h;
        if (tb >= j->T) return;
        if (tb + 16 > j->T) {
            for (int64_t t = tb; t < j->T; t++)
                for (int64_t i = 0; i < NT; i++) j->out[t * j->N + n0 + i] = tile[i][t - t0] + b[i];
            return;
        }
        __m512 r[NT], u[NT];
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) r[i] = _mm512_loadu_ps(tile[i] + h);
        /* u[4a + c], block k: rows 4a .. 4a + 3 at token 4k + c */
#pragma GCC unroll 2
        for (int a = 0; a < NT; a += 4) {
            const __m512 p0 = _mm512_unpacklo_ps(r[a], r[a + 1]), p1 = _mm512_unpackhi_ps(r[a], r[a + 1]),
                         p2 = _mm512_unpacklo_ps(r[a + 2], r[a + 3]), p3 = _mm512_unpackhi_ps(r[a + 2], r[a + 3]);
            u[a] = _mm512_shuffle_ps(p0, p2, 0x44);
            u[a + 1] = _mm512_shuffle_ps(p0, p2, 0xee);
            u[a + 2] = _mm512_shuffle_ps(p1, p3, 0x44);
            u[a + 3] = _mm512_shuffle_ps(p1, p3, 0xee);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512 v0 = _mm512_add_ps(_mm512_permutex2var_ps(u[c], lo, u[4 + c]), bias), /* tokens c, 4 + c */
                v1 = _mm512_add_ps(_mm512_permutex2var_ps(u[c], hi, u[4 + c]), bias);      /* 8 + c, 12 + c */
            float *o = j->out + (tb + c) * j->N + n0;
            _mm256_storeu_ps(o, _mm512_castps512_ps256(v0));
            _mm256_storeu_ps(o + 4 * j->N, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v0), 1)));
            _mm256_storeu_ps(o + 8 * j->N, _mm512_castps512_ps256(v1));
            _mm256_storeu_ps(o + 12 * j->N, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v1), 1)));
        }
    }
}

/* tile[i][t] = sum_k xr[t, k] w_i[k] for the TT tokens whose pairs are xp
 * [P, TT] and the NT weight rows w_i. With pf, it also brings elements
 * [pf0, pf1) of the rows pf_i (the next tile of rows) into L2, a cache line
 * a row at even steps of the loop, so that the next rows' first token tile
 * does not wait for memory. */
static OG_BF16 void tile_kernel(const uint32_t *xp, const og_bf16 *const w[NT], int64_t K, float tile[NT][TT],
                                const og_bf16 *const *pf, int64_t pf0, int64_t pf1) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00,
           c61 = c00, c70 = c00, c71 = c00;
    const og_bf16 *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5],
                  *w6 = w[6], *w7 = w[7];
    const int64_t full = K / 2, lines = pf ? (pf1 - pf0 + 31) / 32 : 0; /* 32 bf16 a line */
    const int64_t every = lines ? (full + lines - 1) / lines : full;       /* pairs between lines */
#define OG_STEP(i, b)                             \
    do {                                          \
        const __m512bh b_ = (b);                  \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, a0, b_); \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, a1, b_); \
    } while (0)
    for (int64_t p0 = 0, e = pf0; p0 < full; p0 += every, e += 32) {
        if (lines)
            for (int i = 0; i < NT; i++) _mm_prefetch((const char *)(pf[i] + e), _MM_HINT_T1);
        const int64_t p1 = full - p0 > every ? p0 + every : full;
        for (int64_t p = p0; p < p1; p++) {
            const uint32_t *xr = xp + p * TT;
            const __m512bh a0 = (__m512bh)_mm512_loadu_si512((const void *)xr);
            const __m512bh a1 = (__m512bh)_mm512_loadu_si512((const void *)(xr + 16));
            OG_STEP(0, bcast_pair(w0 + 2 * p));
            OG_STEP(1, bcast_pair(w1 + 2 * p));
            OG_STEP(2, bcast_pair(w2 + 2 * p));
            OG_STEP(3, bcast_pair(w3 + 2 * p));
            OG_STEP(4, bcast_pair(w4 + 2 * p));
            OG_STEP(5, bcast_pair(w5 + 2 * p));
            OG_STEP(6, bcast_pair(w6 + 2 * p));
            OG_STEP(7, bcast_pair(w7 + 2 * p));
        }
    }
    if (K & 1) { /* the last k alone: its pair's upper half is zero in xp */
        const uint32_t *xr = xp + full * TT;
        const __m512bh a0 = (__m512bh)_mm512_loadu_si512((const void *)xr);
        const __m512bh a1 = (__m512bh)_mm512_loadu_si512((const void *)(xr + 16));
#define OG_LAST(i) (__m512bh) _mm512_set1_epi32((int)(uint32_t)w##i[K - 1])
        OG_STEP(0, OG_LAST(0));
        OG_STEP(1, OG_LAST(1));
        OG_STEP(2, OG_LAST(2));
        OG_STEP(3, OG_LAST(3));
        OG_STEP(4, OG_LAST(4));
        OG_STEP(5, OG_LAST(5));
        OG_STEP(6, OG_LAST(6));
        OG_STEP(7, OG_LAST(7));
#undef OG_LAST
    }
#undef OG_STEP
    _mm512_storeu_ps(tile[0], c00), _mm512_storeu_ps(tile[0] + 16, c01);
    _mm512_storeu_ps(tile[1], c10), _mm512_storeu_ps(tile[1] + 16, c11);
    _mm512_storeu_ps(tile[2], c20), _mm512_storeu_ps(tile[2] + 16, c21);
    _mm512_storeu_ps(tile[3], c30), _mm512_storeu_ps(tile[3] + 16, c31);
    _mm512_storeu_ps(tile[4], c40), _mm512_storeu_ps(tile[4] + 16, c41);
    _mm512_storeu_ps(tile[5], c50), _mm512_storeu_ps(tile[5] + 16, c51);
    _mm512_storeu_ps(tile[6], c60), _mm512_storeu_ps(tile[6] + 16, c61);
    _mm512_storeu_ps(tile[7], c70), _mm512_storeu_ps(tile[7] + 16, c71);
}

/* tile[i][t] = sum_g scale_i[g] (sum_{k in group g} xr[t, k] q_i[k]) for
 * the TT tokens whose pairs are xp [K / 2, TT] and the GT rows of integers
 * q_i (bf16) with their group scales sc_i [K / 32]; with_min (a constant
 * where inlined): less min_i[g] (sum_{k in group g} xr[t, k]) a group. */
static inline __attribute__((always_inline)) OG_BF16 void
group_kernel_t(const uint32_t *xp, const og_bf16 *const q[GT], const float *const sc[GT], const float *const mn[GT],
               const bool with_min, int64_t K, float tile[GT][TT]) {
    const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    const og_bf16 *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (int64_t g = 0; g < K / OG_QUANT_GROUP; g++) {
        __m512 s00 = _mm512_setzero_ps(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00,
               s31 = s00, x0 = s00, x1 = s00;
#define OG_STEP(i)                                          \
    do {                                                    \
        const __m512bh b_ = bcast_pair(q##i + 2 * p);       \
        s##i##0 = _mm512_dpbf16_ps(s##i##0, a0, b_);        \
        s##i##1 = _mm512_dpbf16_ps(s##i##1, a1, b_);        \
    } while (0)
        for (int64_t p = g * (OG_QUANT_GROUP / 2); p < (g + 1) * (OG_QUANT_GROUP / 2); p++) {
            const uint32_t *xr = xp + p * TT;
            const __m512bh a0 = (__m512bh)_mm512_loadu_si512((const void *)xr);
            const __m512bh a1 = (__m512bh)_mm512_loadu_si512((const void *)(xr + 16));
            OG_STEP(0);
            OG_STEP(1);
            OG_STEP(2);
            OG_STEP(3);
            if (with_min) {
                x0 = _mm512_dpbf16_ps(x0, a0, ones);
                x1 = _mm512_dpbf16_ps(x1, a1, ones);
            }
        }
#undef OG_STEP
#define OG_SCALE(i)                                         \
    do {                                                    \
        const __m512 v_ = _mm512_set1_ps(sc[i][g]);         \
        c##i##0 = _mm512_fmadd_ps(v_, s##i##0, c##i##0);    \
        c##i##1 = _mm512_fmadd_ps(v_, s##i##1, c##i##1);    \
        if (with_min) {                                     \
            const __m512 m_ = _mm512_set1_ps(mn[i][g]);     \
            c##i##0 = _mm512_fnmadd_ps(m_, x0, c##i##0);    \
            c##i##1 = _mm512_fnmadd_ps(m_, x1, c##i##1);    \
        }                                                   \
    } while (0)
        OG_SCALE(0);
        OG_SCALE(1);
        OG_SCALE(2);
        OG_SCALE(3);
#undef OG_SCALE
    }
    _mm512_storeu_ps(tile[0], c00), _mm512_storeu_ps(tile[0] + 16, c01);
    _mm512_storeu_ps(tile[1], c10), _mm512_storeu_ps(tile[1] + 16, c11);
    _mm512_storeu_ps(tile[2], c20), _mm512_storeu_ps(tile[2] + 16, c21);
    _mm512_storeu_ps(tile[3], c30), _mm512_storeu_ps(tile[3] + 16, c31);
}

static OG_BF16 void group_kernel(const uint32_t *xp, const og_bf16 *const q[GT], const float *const sc[GT],
                                 int64_t K, float tile[GT][TT]) {
    group_kernel_t(xp, q, sc, NULL, false, K, tile);
}
static OG_BF16 void group_kernel_mins(const uint32_t *xp, const og_bf16 *const q[GT], const float *const sc[GT],
                                      const float *const mn[GT], int64_t K, float tile[GT][TT]) {
    group_kernel_t(xp, q, sc, mn, true, K, tile);
}

/* Out features [n0, n0 + nn) of a q8 / q4 / q4_k / q5_k weight (nn <= GT),
 * every token tile; scratch: the thread's row space. */
static void group_rows(const bf16_job *j, int64_t n0, int64_t nn, og_bf16 *scratch) {
    const int64_t K = j->K, G = K / OG_QUANT_GROUP;
    og_bf16 *ints = scratch;                          /* [GT, K] */
    float *scales = (float *)(void *)(ints + GT * K); /* [GT, G] */
    float *mins = scales + GT * G;                    /* [GT, G]: q4_k, q5_k */
    if (with_mins(j->dt)) kq_ints_rows(j->dt, j->w, K, n0, nn, ints, scales, mins);
    else og_quant_ints_rows_cpu(j->dt, j->w, j->N, K, n0, nn, ints, scales);
    const og_bf16 *q[GT]; /* rows past the end repeat the last; their sums are dropped */
    const float *sc[GT], *mn[GT];
    for (int64_t i = 0; i < GT; i++) {
        const int64_t r = i < nn ? i : nn - 1;
        q[i] = ints + r * K;
        sc[i] = scales + r * G;
        mn[i] = mins + r * G;
    }
    float b[GT];
    load_bias(j, n0, nn, b);
    float tile[GT][TT];
    for (int64_t t0 = 0; t0 < j->T; t0 += TT) {
        if (with_mins(j->dt)) group_kernel_mins(j->xp + t0 * j->P, q, sc, mn, K, tile);
        else group_kernel(j->xp + t0 * j->P, q, sc, K, tile);
        store_tile(j, t0, n0, nn, &tile[0][0], b);
    }
}

/* Quantized rows [n0, n0 + rows) as (hi, lo) bf16 pairs, [rows, K], made
 * in place over their exact f32 values. */
static OG_BF16 void split_rows(const bf16_job *j, int64_t n0, int64_t rows, uint32_t *pairs) {
    og_dequantize_rows_cpu(OG_CPU_ISA_AVX512, j->dt, j->w, j->N, j->K, n0, rows, (float *)pairs);
    for (int64_t e = 0; e < rows * j->K; e += 16) { /* K is a multiple of 32 */
        __m256i lo;
        const __m256i hi = og_split16_bf16(_mm512_loadu_ps((const float *)(pairs + e)), &lo);
        _mm512_storeu_si512((void *)(pairs + e),
                            _mm512_or_si512(_mm512_cvtepu16_epi32(hi), _mm512_slli_epi32(_mm512_cvtepu16_epi32(lo), 16)));
    }
}

/* Out features [task*nb, +nb): every tile, written to out with the bias. */
static void tiles_task(void *ctx, int64_t task, int thread) {
    const bf16_job *j = ctx;
    const bool quant = og_dtype_is_quantized(j->dt);
    const int64_t nb = j->nb, n_end = (task + 1) * nb < j->N ? (task + 1) * nb : j->N, kk = quant ? 2 * j->K : j->K;
    uint32_t *pairs = (uint32_t *)(j->row + (size_t)thread * j->row_stride); /* quantized: [NT, K] */
    if (grouped(j->dt)) {
        for (int64_t n0 = task * nb; n0 < n_end; n0 += GT)
            group_rows(j, n0, n_end - n0 < GT ? n_end - n0 : GT, j->row + (size_t)thread * j->row_stride);
        return;
    }
    float tile[NT][TT];
    for (int64_t n0 = task * nb; n0 < n_end; n0 += NT) {
        const int64_t nn = n_end - n0 < NT ? n_end - n0 : NT;
        if (quant) split_rows(j, n0, nn, pairs);
        const og_bf16 *w[NT]; /* rows past the end repeat the last; their sums are dropped */
        for (int64_t i = 0; i < NT; i++)
            w[i] = quant ? (const og_bf16 *)(pairs + (size_t)(i < nn ? i : nn - 1) * (size_t)j->K)
                         : (const og_bf16 *)j->w + (size_t)(n0 + (i < nn ? i : nn - 1)) * (size_t)j->K;
        /* bf16: the task's next tile of rows, brought into L2 over this one's token tiles */
        const bool next = !quant && n0 + 2 * NT <= n_end;
        const og_bf16 *pf[NT];
        for (int64_t i = 0; i < NT && next; i++) pf[i] = (const og_bf16 *)j->w + (size_t)(n0 + NT + i) * (size_t)j->K;
        float b[NT];
        load_bias(j, n0, nn, b);
        for (int64_t t0 = 0; t0 < j->T; t0 += TT) {
            tile_kernel(j->xp + t0 * j->P, w, kk, tile, next ? pf : NULL, kk * t0 / j->TP, kk * (t0 + TT) / j->TP);
            if (nn == NT)
                store_tile8(j, t0, n0, tile, b);
            else
                store_tile(j, t0, n0, nn, &tile[0][0], b);
        }
    }
}

static og_status matmul_dpbf16(og_threadpool *pool, const float *x, const void *w, og_dtype dt,
                               const void *bias, int64_t T, int64_t K, int64_t N, float *out) {
    const bool quant = og_dtype_is_quantized(dt) && !grouped(dt); /* hi + lo pairs over 2K */
    const int64_t P = quant ? K : (K + 1) / 2, TP = (T + TT - 1) / TT * TT;
    /* og_bf16 elements; grouped: GT rows of integers and their f32 scales and mins */
    const size_t row_stride = quant ? 2 * NT * (size_t)K
                              : grouped(dt) ? GT * (size_t)K + 4 * GT * (size_t)(K / OG_QUANT_GROUP)
                                            : (size_t)K;
    const int threads = og_threadpool_size(pool);
    uint32_t *xp = og_scratch(OG_SCRATCH_ACTIVATIONS, (size_t)(P * TP) * sizeof *xp);
    og_bf16 *row = og_scratch(OG_SCRATCH_PANELS, (size_t)threads * row_stride * sizeof *row);
    if (!xp || !row)
        return og_set_error(OG_ERR_OUT_OF_MEMORY,
                            "matmul_bf16: no memory to pack %lld x %lld activations",
                            (long long)T, (long long)K);
    /* a task's first rows wait for memory (the later ones are prefetched), so
     * tasks are as large as leaves four a thread, for the threads to finish
     * together: 64 -> 128 - 256 features a task gave the 0.6B shape's
     * 128-token prefill 2 - 6 % on two threads, four pairs */
    int64_t nb = N / (4 * (int64_t)threads) / NT * NT;
    nb = nb < NB_MIN ? NB_MIN : nb > NB_MAX ? NB_MAX : nb;
    bf16_job j = {x, w, dt, bias, T, K, N, P, TP, xp, row, row_stride, out, nb};
    og_parallel_for(pool, TP / TT, pack_task, &j);
    og_parallel_for(pool, (N + j.nb - 1) / j.nb, tiles_task, &j);
    return OG_OK;
}
#endif

/* Without the kernel: x rounded to bf16 (kept as f32) through og_matmul_cpu. */
static og_status matmul_rounded(og_threadpool *pool, const float *x, const void *w,
                                const void *bias, og_dtype dt, int64_t T, int64_t K, int64_t N,
                                float *out) {
    float *xr = og_scratch(OG_SCRATCH_ACTIVATIONS, (size_t)(T * K) * sizeof *xr); /* [T, K]; the product takes PANELS */
    if (!xr)
        return og_set_error(OG_ERR_OUT_OF_MEMORY,
                            "matmul_bf16: no memory to round %lld x %lld activations",
                            (long long)T, (long long)K);
    for (int64_t i = 0; i < T * K; i++) xr[i] = og_f32_from_bf16(og_bf16_from_f32(x[i]));
    return og_matmul_cpu(pool, xr, w, bias, dt, T, K, N, out);
}

og_status og_matmul_bf16_cpu(og_threadpool *pool, const float *x, const void *weight,
                             const void *bias, og_dtype weight_dtype, int64_t T, int64_t K,
                             int64_t N, float *out) {
    OG_TRY(og_ops_check_matmul(x, weight, bias, weight_dtype, T, K, N, out));
#if defined(__x86_64__) && defined(__GNUC__)
    /* AMX tiles where the CPU has them and K fills whole tile rows; its
     * scratch is the same size as the vdpbf16ps kernel's, so a failure to
     * get it is final */
    if (weight_dtype == OG_DTYPE_BF16 && K % 32 == 0 && og_cpu_has_amx_bf16())
        return og_matmul_bf16_amx(pool, x, weight, bias, T, K, N, out);
    if (og_dtype_is_quantized(weight_dtype) && K % 32 == 0 && og_cpu_has_amx_bf16())
        return og_matmul_quant_amx(pool, x, weight, weight_dtype, bias, T, K, N, out);
    if ((weight_dtype == OG_DTYPE_BF16 || (og_dtype_is_quantized(weight_dtype) && K % 32 == 0)) &&
        og_cpu_has_avx512_bf16())
        return matmul_dpbf16(pool, x, weight, weight_dtype, bias, T, K, N, out);
#endif
    return matmul_rounded(pool, x, weight, bias, weight_dtype, T, K, N, out);
}
