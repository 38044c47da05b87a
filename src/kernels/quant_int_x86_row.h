/* The AVX-512 q8 / q4 integer products (quant_int_x86.c), included there
 * twice: with OG_QI_VNNI (1: vpdpbusd, 0: vpmaddubsw + vpmaddwd), OG_QI_TARGET
 * (the functions' target attribute) and OG_QI_NAME(x) (the functions' names
 * with the version's suffix) defined; undefines them. Not a header of its
 * own. */

/* acc + levels a times x terms by fours into int32 lanes. */
static OG_INLINE OG_QI_TARGET __m512i OG_QI_NAME(dot4)(__m512i acc, __m512i a, __m512i x) {
#if OG_QI_VNNI
    return _mm512_dpbusd_epi32(acc, a, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, x), _mm512_set1_epi16(1)));
#endif
}

/* The levels of a chunk of n4 (1 - 4) groups at p (dt a constant where
 * inlined): *A elements 0 - 15 of each group, *B 16 - 31, as unsigned bytes;
 * q8 without vpdpbusd: |q|, with *nA, *nB the bytes where q < 0. */
static OG_INLINE OG_QI_TARGET void OG_QI_NAME(levels)(og_dtype dt, const uint8_t *p, int n4, __m512i *A, __m512i *B,
                                                   __mmask64 *nA, __mmask64 *nB) {
    *nA = *nB = 0;
    if (dt == OG_DTYPE_Q4) {
        const __mmask64 m = n4 == 4 ? ~(__mmask64)0 : ((__mmask64)1 << (16 * n4)) - 1;
        const __m512i raw = _mm512_maskz_loadu_epi8(m, p), low4 = _mm512_set1_epi8(0x0f);
        *A = _mm512_and_si512(raw, low4);
        *B = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        return;
    }
    const __mmask64 m0 = n4 >= 2 ? ~(__mmask64)0 : 0xffffffffull;
    const __mmask64 m1 = n4 == 4 ? ~(__mmask64)0 : n4 == 3 ? 0xffffffffull : 0;
    const __m512i w0 = _mm512_maskz_loadu_epi8(m0, p), w1 = _mm512_maskz_loadu_epi8(m1, p + 64);
    *A = _mm512_shuffle_i64x2(w0, w1, 0x88); /* elements 0 - 15 of the four groups */
    *B = _mm512_shuffle_i64x2(w0, w1, 0xdd); /* 16 - 31 */
#if OG_QI_VNNI
    const __m512i bias = _mm512_set1_epi8((char)0x80); /* q + 128 */
    *A = _mm512_xor_si512(*A, bias);
    *B = _mm512_xor_si512(*B, bias);
#else
    *nA = _mm512_movepi8_mask(*A);
    *nB = _mm512_movepi8_mask(*B);
    *A = _mm512_abs_epi8(*A); /* -128 -> 128 as unsigned */
    *B = _mm512_abs_epi8(*B);
#endif
}

/* A chunk's lanes: four elements' n (254 hi + lo) each, from its levels
 * and x's terms xt (og_qi_x t[c]). */
static OG_INLINE OG_QI_TARGET __m512i OG_QI_NAME(chunk)(og_dtype dt, __m512i A, __m512i B, __mmask64 nA, __mmask64 nB,
                                                     const int8_t *xt) {
    __m512i hA = _mm512_loadu_si512(xt), hB = _mm512_loadu_si512(xt + 64);
    __m512i lA = _mm512_loadu_si512(xt + 128), lB = _mm512_loadu_si512(xt + 192);
    if (dt == OG_DTYPE_Q8 && !OG_QI_VNNI) { /* the terms take q's sign */
        const __m512i z = _mm512_setzero_si512();
        hA = _mm512_mask_sub_epi8(hA, nA, z, hA);
        lA = _mm512_mask_sub_epi8(lA, nA, z, lA);
        hB = _mm512_mask_sub_epi8(hB, nB, z, hB);
        lB = _mm512_mask_sub_epi8(lB, nB, z, lB);
    }
    __m512i v = OG_QI_NAME(dot4)(OG_QI_NAME(dot4)(_mm512_setzero_si512(), A, hA), B, hB);
    v = _mm512_mullo_epi32(v, _mm512_set1_epi32(254));
    return OG_QI_NAME(dot4)(OG_QI_NAME(dot4)(v, A, lA), B, lB);
}

/* A set's 16 groups: I less off S (shift: log2 off, or -1 for none), to
 * f32, times dw * u into acc. */
static OG_INLINE OG_QI_TARGET __m512 OG_QI_NAME(scale)(int shift, __m512i I, __m512 dw, const og_qi_x *xb,
                                                    __m512 acc) {
    if (shift >= 0) I = _mm512_sub_epi32(I, _mm512_slli_epi32(_mm512_loadu_si512(xb->s), (unsigned)shift));
    return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(xb->u)), _mm512_cvtepi32_ps(I), acc);
}

/* Prefetches the lines of a chunk at p (1: into L2, 2: into every level). */
static OG_INLINE OG_QI_TARGET void OG_QI_NAME(prefetch)(og_dtype dt, const uint8_t *p, int hint) {
    for (size_t line = 0; line < (dt == OG_DTYPE_Q4 ? 64u : 128u); line += 64) {
        if (hint == 1) _mm_prefetch((const char *)(p + line), _MM_HINT_T1);
        else if (hint == 2) _mm_prefetch((const char *)(p + line), _MM_HINT_T0);
    }
}

/* nf (<= 4) weight rows (quants p, rb bytes apart; scales sc, G a row)
 * against one row of x; out[f]. Row by row within each set of 16 groups,
 * so a row's four chunk sums are all that live in registers. hint as
 * above, for the same place of pf. dt and nf constants where inlined. */
static OG_INLINE OG_QI_TARGET void OG_QI_NAME(rows)(og_dtype dt, const og_qi_x *x, const uint8_t *p, size_t rb,
                                                 const og_f16 *sc, int64_t G, const int nf, const uint8_t *pf,
                                                 int hint, float *out) {
    const size_t gb = og_quant_row_bytes(dt, QG);
    /* off: q4's 8; q8's 128 as q + 128 with vpdpbusd, none as |q| without */
    const int shift = dt == OG_DTYPE_Q4 ? 3 : OG_QI_VNNI ? 7 : -1;
    __m512 acc[4];
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++) acc[f] = _mm512_setzero_ps();
    for (int64_t b = 0; 16 * b < G; b++) {
        const int ng = G - 16 * b < 16 ? (int)(G - 16 * b) : 16;
        const __mmask16 mg = ng == 16 ? (__mmask16)0xffff : (__mmask16)((1u << ng) - 1u);
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) {
            __m512i t[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                t[c] = _mm512_setzero_si512();
                if (4 * c >= ng) continue;
                const size_t at = (size_t)f * rb + (size_t)(16 * b + 4 * c) * gb;
                OG_QI_NAME(prefetch)(dt, pf + at, hint);
                __m512i A, B;
                __mmask64 nA, nB;
                OG_QI_NAME(levels)(dt, p + at, ng - 4 * c < 4 ? ng - 4 * c : 4, &A, &B, &nA, &nB);
                t[c] = OG_QI_NAME(chunk)(dt, A, B, nA, nB, x[b].t[c][0]);
            }
            const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mg, sc + f * G + 16 * b));
            acc[f] = OG_QI_NAME(scale)(shift, og_sum_by16_512(t[0], t[1], t[2], t[3]), dw, &x[b], acc[f]);
        }
    }
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++) out[f] = _mm512_reduce_add_ps(acc[f]);
}

/* One weight row against nr (<= 4, a constant where inlined) rows of x
 * (sets xs apart); out[r * ldo]. Chunk by chunk: each chunk's levels are
 * unpacked once for every row of x, and a row's chunk sums are folded two
 * by two as they come (og_sum_pairs_512: at most two live a row; together
 * og_sum_by16_512's sums, so the bits are those of rows). */
static OG_INLINE OG_QI_TARGET void OG_QI_NAME(tile)(og_dtype dt, const og_qi_x *x, int64_t xs, const uint8_t *p,
                                                 const og_f16 *sc, int64_t G, const int nr, const uint8_t *pf,
                                                 int hint, float *out, int64_t ldo) {
    const size_t gb = og_quant_row_bytes(dt, QG);
    const int shift = dt == OG_DTYPE_Q4 ? 3 : OG_QI_VNNI ? 7 : -1; /* as in rows */
    __m512 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; 16 * b < G; b++) {
        const int ng = G - 16 * b < 16 ? (int)(G - 16 * b) : 16;
        const __mmask16 mg = ng == 16 ? (__mmask16)0xffff : (__mmask16)((1u << ng) - 1u);
        __m512i half[4], first[4]; /* chunks 0 + 1 folded; chunk 0 or 2 */
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i A = _mm512_setzero_si512(), B = A;
            __mmask64 nA = 0, nB = 0;
            const bool live = 4 * c < ng;
            if (live) {
                const size_t at = (size_t)(16 * b + 4 * c) * gb;
                OG_QI_NAME(prefetch)(dt, pf + at, hint);
                OG_QI_NAME(levels)(dt, p + at, ng - 4 * c < 4 ? ng - 4 * c : 4, &A, &B, &nA, &nB);
            }
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const __m512i t =
                    live ? OG_QI_NAME(chunk)(dt, A, B, nA, nB, x[r * xs + b].t[c][0]) : _mm512_setzero_si512();
                if (c % 2 == 0) first[r] = t;
                else if (c == 1) half[r] = og_sum_pairs_512(first[r], t);
                else half[r] = og_sum_pairs_512(half[r], og_sum_pairs_512(first[r], t));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mg, sc + 16 * b));
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc[r] = OG_QI_NAME(scale)(shift, half[r], dw, &x[r * xs + b], acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) out[r * ldo] = _mm512_reduce_add_ps(acc[r]);
}

/* Weight rows [0, rows) against x rows [0, R). One row of x: four weight
 * rows a pass for q4 (four streams, whose loads hide each other's
 * latency), one for q8 (one stream, the shape the hardware prefetcher
 * follows best: see ops_simd.c); prefetched about 4 KiB ahead. More rows of
 * x: blocks of four outside (a block's terms stay in L1), weight rows one
 * by one inside, each chunk unpacked once for the block; the first block
 * brings the rows in (into L2 alone when they stream from memory), the
 * later ones find them in cache. */
static OG_QI_TARGET void OG_QI_NAME(run)(og_dtype dt, const og_qi_x *x, int64_t R, const uint8_t *q, const og_f16 *s,
                                      int64_t K, int64_t rows, bool stream, float *out, int64_t ldo) {
    const size_t rb = og_quant_row_bytes(dt, K);
    const int64_t G = K / QG, xs = og_qi_sets(K);
    const int64_t ahead = rb < 4096 ? (int64_t)(4096 / rb) : 1;
    if (R == 1) {
        const int hint = stream ? 1 : 2;
        int64_t f = 0;
        if (dt == OG_DTYPE_Q4)
            for (; f + 4 <= rows; f += 4)
                OG_QI_NAME(rows)(OG_DTYPE_Q4, x, q + (size_t)f * rb, rb, s + f * G, G, 4,
                                 q + (size_t)(f + ahead) * rb, hint, out + f);
        for (; f < rows; f++) {
            if (dt == OG_DTYPE_Q4)
                OG_QI_NAME(rows)(OG_DTYPE_Q4, x, q + (size_t)f * rb, rb, s + f * G, G, 1,
                                 q + (size_t)(f + ahead) * rb, hint, out + f);
            else
                OG_QI_NAME(rows)(OG_DTYPE_Q8, x, q + (size_t)f * rb, rb, s + f * G, G, 1,
                                 q + (size_t)(f + ahead) * rb, hint, out + f);
        }
        return;
    }
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
        const int nr = R - r0 < 4 ? (int)(R - r0) : 4;
        const int hint = r0 > 0 ? 0 : stream ? 1 : 2;
        const og_qi_x *xr = x + r0 * xs;
        for (int64_t f = 0; f < rows; f++) {
            const uint8_t *p = q + (size_t)f * rb, *pf = q + (size_t)(f + ahead) * rb;
            float *o = out + r0 * ldo + f;
#define OG_QI_TILE(DT, NR) OG_QI_NAME(tile)(DT, xr, xs, p, s + f * G, G, NR, pf, hint, o, ldo)
            switch ((dt == OG_DTYPE_Q4) * 4 + (nr - 1)) {
            case 0: OG_QI_TILE(OG_DTYPE_Q8, 1); break;
            case 1: OG_QI_TILE(OG_DTYPE_Q8, 2); break;
            case 2: OG_QI_TILE(OG_DTYPE_Q8, 3); break;
            case 3: OG_QI_TILE(OG_DTYPE_Q8, 4); break;
            case 4: OG_QI_TILE(OG_DTYPE_Q4, 1); break;
            case 5: OG_QI_TILE(OG_DTYPE_Q4, 2); break;
            case 6: OG_QI_TILE(OG_DTYPE_Q4, 3); break;
            default: OG_QI_TILE(OG_DTYPE_Q4, 4); break;
            }
#undef OG_QI_TILE
        }
    }
}

#undef OG_QI_VNNI
#undef OG_QI_TARGET
#undef OG_QI_NAME
