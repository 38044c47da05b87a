/* The AVX-512 k-quant GEMV tile (kquant_x86.c), included there twice:
 * with OG_KQ_TILE (the function's name), OG_KQ_TARGET (its target
 * attribute) and OG_KQ_DOT4 (levels times x terms by fours into int32
 * lanes) defined; undefines them. Not a header of its own. */
/* nf weight rows (w, rb bytes apart) x nr rows of x (x blocks, nb apart),
 * all of K; out[r * ldo + f]. nf, nr, dt constants where inlined. prefetch
 * (1: into L2, 2: into every level, 0: none) the same block `ahead` rows
 * on as each block is read. */
static OG_INLINE OG_KQ_TARGET void OG_KQ_TILE(og_dtype dt, const og_kq_x *x, int64_t nb, const uint8_t *w,
                                         size_t rb, const int nf, const int nr, int prefetch, int64_t ahead,
                                         float *out, int64_t ldo) {
    const size_t bb = og_kquant_block_bytes(dt);
    __m512 acc[TF][TR];
#pragma GCC unroll 4
    for (int f = 0; f < nf; f++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc[f][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        block512 blk;
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) {
            const uint8_t *b = w + (size_t)f * rb + (size_t)k * bb;
            if (prefetch) {
                const char *next = (const char *)(b + (size_t)ahead * rb);
                for (size_t line = 0; line < bb; line += 64) {
                    if (prefetch == 1) _mm_prefetch(next + line, _MM_HINT_T1);
                    else _mm_prefetch(next + line, _MM_HINT_T0);
                }
            }
            unpack_512(dt, b, &blk, f);
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const og_kq_x *xb = &x[r * nb + k];
            const __m512i sum16 = _mm512_loadu_si512(xb->sum16);
            const float u = xb->d / 254.0f;
            __m512i xh[4], xl[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                xh[g] = _mm512_loadu_si512(xb->hi + 64 * g);
                xl[g] = _mm512_loadu_si512(xb->lo + 64 * g);
            }
#pragma GCC unroll 4
            for (int f = 0; f < nf; f++) {
                /* per run, lanes of 254 hi + lo by fours (at most 4 * 63 * 32385), then by 16 */
                __m512i v[4];
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    const __m512i h = OG_KQ_DOT4(_mm512_setzero_si512(), blk.lv[f][g], xh[g]);
                    v[g] = OG_KQ_DOT4(_mm512_mullo_epi32(h, _mm512_set1_epi32(254)), blk.lv[f][g], xl[g]);
                }
                const __m512i s = sum_by16_512(v[0], v[1], v[2], v[3]);
                const __m512 t = _mm512_cvtepi32_ps(_mm512_mullo_epi32(blk.xs[f], sum16));
                if (dt == OG_DTYPE_Q6_K) {
                    /* scales to 128 times lanes to 16 * 63 * 32385 would pass int32: f32 */
                    __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_cvtepi32_ps(blk.sc[f]));
                    a = _mm512_fnmadd_ps(t, _mm512_set1_ps(32.0f), a); /* levels stored plus 32 */
                    acc[f][r] = _mm512_fmadd_ps(a, _mm512_set1_ps(u * blk.d[f]), acc[f][r]);
                } else { /* at most 16 * 31 * 32385 * 63 < 2^31 */
                    const __m512 a = _mm512_cvtepi32_ps(_mm512_mullo_epi32(s, blk.sc[f]));
                    acc[f][r] = _mm512_fmadd_ps(a, _mm512_set1_ps(u * blk.d[f]), acc[f][r]);
                    acc[f][r] = _mm512_fnmadd_ps(t, _mm512_set1_ps(u * blk.dmin[f]), acc[f][r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int f = 0; f < nf; f++) out[(size_t)r * (size_t)ldo + (size_t)f] = _mm512_reduce_add_ps(acc[f][r]);
}

#undef OG_KQ_TILE
#undef OG_KQ_TARGET
#undef OG_KQ_DOT4
