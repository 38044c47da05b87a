/* Attention of wide bf16 steps on AMX tiles (see attend_amx.h).
 *
 * Letters: T tokens, Hq / Hkv heads, G = Hq / Hkv, D head dim, L length
 * before the step, R rows, W window (0: flat), RS storage row stride.
 *
 * Rows: per kv head g the step has T * G query rows; row f = t * G + x is
 * query head g * G + x of token t (position L + t). The G heads that read
 * the same keys sit side by side, so a tile of 16 rows holds 16 / G tokens
 * of all of them and every key loaded serves all 16. A work item is 32
 * consecutive rows (two row tiles) of one kv head.
 *
 * Keys: the keys the step can see, [K0, K1) with K0 the first key of
 * position L and K1 = L + T, are packed once per call and kv head, in
 * logical order (a ring's slots unwrapped), into the B operands of the two
 * products (a B tile row holds pairs of the contracted index):
 *   kp [NK/16 groups][D/32 chunks][16 pairs of d][16 keys] u32:
 *      the tile of group k, chunk c: row r holds d = 32c + 2r, 2r + 1 of
 *      each of the group's 16 keys (B of S = Q K^T);
 *   vp [NK/32 groups][16 pairs of keys][D][2] bf16:
 *      row r of a group holds keys 2r, 2r + 1 of every d; the tile of d
 *      16e .. 16e + 15 starts 32e elements into the row (B of O += P V).
 * NK is K1 - K0 rounded up to KBLK with zero keys: their weight is 0 and
 * their values 0, so they add exact zeros.
 *
 * Item: the 32 query rows rounded to bf16 (qp [32, D], A of S); for each
 * block of KBLK keys that a row of the item sees:
 *   S [32, KBLK] f32 = qp kp: per 32 keys four C tiles (2 row tiles x 2
 *     key groups), D / 32 tile products each;
 *   per row: the scores times scale log2(e) (base 2 from here on), the
 *     keys the row does not see masked off (the contract of attend.h, as
 *     row_keys in attend_cpu.c and og_attend_first_key apply it: position p sees
 *     max(0, p - W + 1) .. p), block max, running max m, c = 2^(m_old -
 *     m_new), p = 2^(s - m) rounded to bf16 into pp [32, KBLK] (A of P V),
 *     l = l c + the sum of the rounded p, the row of O times c where c != 1;
 *   O [32, D] f32 += pp vp: four C tiles (2 row tiles x 2 d tiles of 16)
 *     loaded from O, KBLK / 32 tile products, stored back.
 * Finally out = O / l. */
#include "kernels/attend_amx.h"

#include "kernels/matmul_amx.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_allowed = 1;

void og_attend_amx_allow(bool allow) { atomic_store(&g_allowed, allow ? 1 : 0); }

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11

#include <immintrin.h>
#include <pthread.h>

enum { MB = 32, KBLK = 64 }; /* query rows per item, keys per block */

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static bool g_env_off;

/* OG_CPU_AMX_ATTEND=0 keeps the tile attention off and the tile products
 * on (benchmarks compare the two attentions). */
static void read_env(void) {
    const char *e = getenv("OG_CPU_AMX_ATTEND");
    g_env_off = e && !strcmp(e, "0");
}


typedef struct amx_att {
    const og_attend_args *a;
    int64_t T, Hq, Hkv, G, D, L, R, W, RS;
    int64_t K0, K1, NK; /* visible keys [K0, K1), NK = K1 - K0 rounded up to KBLK */
    int64_t n_rb;       /* row blocks of MB per kv head */
    float cs;           /* scale * log2(e) */
    uint32_t *kp;       /* [Hkv][NK/16][D/32][16][16] */
    og_bf16 *vp;        /* [Hkv][NK/32][16][D][2] */
    unsigned char *scratch;
    size_t per_thread; /* bytes */
} amx_att;

static int64_t packed_keys(const og_attend_args *a) {
    const og_kv_layer_view *kv = &a->kv;
    const int64_t W = kv->policy == OG_KV_RING ? kv->window : 0;
    const int64_t n = kv->length + a->T - og_attend_first_key(W, kv->length);
    return (n + KBLK - 1) / KBLK * KBLK;
}

static size_t pack_bytes(const og_attend_args *a) {
    return (size_t)a->kv.n_kv_heads * (size_t)packed_keys(a) * (size_t)a->kv.head_dim * 2 * sizeof(og_bf16);
}

/* qp [MB, D] bf16, pp [MB, KBLK] bf16, s [MB, KBLK] f32, o [MB, D] f32,
 * m, l, c, bmax [MB] f32, each rounded up to 64 bytes */
static size_t thread_bytes(int64_t D) {
    return (size_t)(MB * D * 2 + MB * KBLK * 2 + MB * KBLK * 4 + MB * D * 4 + 4 * MB * 4 + 64 * 8);
}

bool og_attend_amx_usable(const og_attend_args *a) {
    const og_kv_layer_view *kv = &a->kv;
    pthread_once(&g_env_once, read_env);
    if (g_env_off || !atomic_load(&g_allowed)) return false;
    if (kv->dtype != OG_DTYPE_BF16 || kv->head_dim % 32 || kv->head_dim > OG_ATTEND_AMX_MAX_D) return false;
    const int64_t rows = (int64_t)a->T * (a->n_heads / kv->n_kv_heads);
    if (rows < OG_ATTEND_AMX_MIN_ROWS || packed_keys(a) > rows * OG_ATTEND_AMX_KEYS_PER_ROW) return false;
    if (pack_bytes(a) > OG_ATTEND_AMX_MAX_PACK) return false;
    return og_cpu_has_amx_bf16();
}

size_t og_attend_amx_scratch_bytes(const og_attend_args *a, int n_threads) {
    return pack_bytes(a) + (size_t)n_threads * thread_bytes(a->kv.head_dim) + 64;
}

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")

/* 2^x for x <= 0 (below -126, and -inf, give 0): x = n + f with |f| <= 1/2,
 * 2^f = e^(f ln2) by its degree-6 Taylor polynomial (truncation below
 * (ln2 / 2)^7 / 7! = 1.2e-7 relative), times 2^n by scalef. */
static inline __m512 exp2_nonpos(__m512 x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284770e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
}

/* 32 f32 to bf16 (round to nearest even), a 64-byte store. */
static inline __m512i bf16x32(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* Sum of 32 bf16 as f32: the even elements are the low halves of the
 * 32-bit lanes, the odd ones the high halves. */
static inline __m512 bf16x32_sum2(__m512i v) {
    return _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
                         _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))));
}

/* Lanes [lo, hi) of KBLK = 64 set, 0 <= lo < hi <= 64. */
static inline uint64_t lane_range(int64_t lo, int64_t hi) {
    const uint64_t below_hi = hi >= 64 ? ~0ull : (1ull << hi) - 1;
    return below_hi & ~((1ull << lo) - 1);
}

/* Key `key` (at K1 or past it: zeros) into lane `lane` of the K group at
 * kg ([D/2][16] u32), from kb (kv head g's first element of storage). */
static void pack_k_one(const amx_att *j, uint32_t *kg, const og_bf16 *kb, int64_t lane, int64_t key) {
    uint32_t kr[OG_ATTEND_AMX_MAX_D / 2];
    if (key < j->K1) memcpy(kr, kb + (j->W > 0 ? key % j->R : key) * j->RS, (size_t)j->D * sizeof(og_bf16));
    else memset(kr, 0, (size_t)j->D * sizeof(og_bf16));
    for (int64_t p = 0; p < j->D / 2; p++) kg[16 * p + lane] = kr[p];
}

/* Keys K0 + i0 .. + KBLK of kv head g into kp and vp (zeros past K1).
 * K, 16 keys at a time: tile row p of a group is pair p of each key, one
 * gather across the 16 keys' storage rows when they are 16 consecutive rows
 * (not across a ring's wrap, not past K1), key by key otherwise. V, two
 * keys at a time: 32 elements of each interleaved by two permutes. */
static void pack_task(void *ctx, int64_t item, int thread) {
    (void)thread;
    const amx_att *j = ctx;
    const og_kv_layer_view *kv = &j->a->kv;
    const int64_t nkb = j->NK / KBLK, g = item / nkb, i0 = item % nkb * KBLK, D = j->D, hw = D / 2;
    const og_bf16 *kb = (const og_bf16 *)kv->k + g * D, *vb = (const og_bf16 *)kv->v + g * D;
    uint32_t *kp = j->kp + (g * j->NK + i0) * hw; /* a group of 16 keys: [D/2][16] u32 */
    og_bf16 *vp = j->vp + (g * j->NK + i0) * D;   /* a group of 32 keys: [16][D][2] bf16 */
    /* byte offsets of 16 rows: 15 * RS * 2 + 2 * D fits an int32 below 2^26 elements a row */
    const bool gather = j->RS < ((int64_t)1 << 26);
    const __m512i rows16 = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(gather ? (int)(j->RS * (int64_t)sizeof(og_bf16)) : 0));
    for (int64_t i = 0; i < KBLK; i += 16) {
        const int64_t key = j->K0 + i0 + i, slot = j->W > 0 ? key % j->R : key;
        uint32_t *kg = kp + i * hw;
        if (!gather || key + 16 > j->K1 || (j->W > 0 && slot + 16 > j->R)) {
            for (int64_t n = 0; n < 16; n++) pack_k_one(j, kg, kb, n, key + n);
            continue;
        }
        const og_bf16 *base = kb + slot * j->RS;
        for (int64_t p = 0; p < hw; p++)
            _mm512_storeu_si512((void *)(kg + 16 * p),
                                _mm512_i32gather_epi32(_mm512_add_epi32(rows16, _mm512_set1_epi32((int)(4 * p))),
                                                       (const void *)base, 1));
    }
    const __m512i lo = _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005,
                                         0x00260006, 0x00270007, 0x00280008, 0x00290009, 0x002a000a, 0x002b000b,
                                         0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t i = 0; i < KBLK; i += 2) {
        const og_bf16 *src[2];
        for (int h = 0; h < 2; h++) {
            const int64_t key = j->K0 + i0 + i + h;
            src[h] = key < j->K1 ? vb + (j->W > 0 ? key % j->R : key) * j->RS : NULL;
        }
        og_bf16 *dst = vp + (i / 32) * 32 * D + (i % 32 / 2) * 2 * D; /* the pair's row */
        for (int64_t d = 0; d < D; d += 32) {
            const __m512i a = src[0] ? _mm512_loadu_si512((const void *)(src[0] + d)) : _mm512_setzero_si512();
            const __m512i b = src[1] ? _mm512_loadu_si512((const void *)(src[1] + d)) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(dst + 2 * d), _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512((void *)(dst + 2 * d + 32), _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

static inline unsigned char *align64(unsigned char *p) { return (unsigned char *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

static void attend_task(void *ctx, int64_t item, int thread) {
    const amx_att *j = ctx;
    const og_attend_args *a = j->a;
    const int64_t D = j->D, G = j->G, Hq = j->Hq;
    /* kv head by kv head, so that a head's packed keys stay in cache for all
     * its row blocks; within a head the blocks that see the most keys first */
    const int64_t g = item / j->n_rb, b = j->n_rb - 1 - item % j->n_rb;
    const int64_t f0 = b * MB, nr = j->T * G - f0 < MB ? j->T * G - f0 : MB;

    unsigned char *mem = align64(j->scratch + (size_t)thread * j->per_thread);
    og_bf16 *qp = (og_bf16 *)mem;                     /* [MB, D] */
    og_bf16 *pp = (og_bf16 *)align64((unsigned char *)(qp + MB * D)); /* [MB, KBLK] */
    float *s = (float *)align64((unsigned char *)(pp + MB * KBLK));   /* [MB, KBLK] */
    float *o = (float *)align64((unsigned char *)(s + MB * KBLK));    /* [MB, D] */
    float *m = (float *)align64((unsigned char *)(o + MB * D));       /* [MB] each */
    float *l = m + MB, *c = l + MB, *bmax = c + MB;
    int64_t pos[MB];

    for (int64_t r = 0; r < MB; r++) {
        og_bf16 *qr = qp + r * D;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(o + r * D, 0, (size_t)D * sizeof(float));
        if (r >= nr) {
            memset(qr, 0, (size_t)D * sizeof(og_bf16));
            pos[r] = -1;
            continue;
        }
        const int64_t t = (f0 + r) / G, x = (f0 + r) % G;
        pos[r] = j->L + t;
        const float *q = a->q + (t * Hq + g * G + x) * D;
        for (int64_t d = 0; d < D; d += 32)
            _mm512_storeu_si512((void *)(qr + d), bf16x32(_mm512_loadu_ps(q + d), _mm512_loadu_ps(q + d + 16)));
    }
    const int64_t key_lo = og_attend_first_key(j->W, pos[0]), key_hi = pos[nr - 1] + 1; /* keys of the item */

    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64; /* C: 16 f32; A: 32 bf16; B: 16 pairs of bf16 */
    }
    _tile_loadconfig(&cfg);

    const uint32_t *kp = j->kp + g * j->NK * (D / 2);
    const og_bf16 *vp = j->vp + g * j->NK * D;
    const __m512 csv = _mm512_set1_ps(j->cs);
    for (int64_t i0 = (key_lo - j->K0) / KBLK * KBLK; j->K0 + i0 < key_hi; i0 += KBLK) {
        const int64_t j0 = j->K0 + i0;                /* the block's first key */
        const int h0 = key_lo - j0 >= 32 ? 1 : 0;     /* halves of 32 keys some row sees */
        const int h1 = key_hi - j0 > 32 ? 2 : 1;

        /* S = Q K^T */
        for (int h = h0; h < h1; h++) {
            const uint32_t *k0 = kp + (i0 + 32 * h) * (D / 2), *k1 = k0 + 16 * (D / 2);
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t ch = 0; ch < D / 32; ch++) {
                _tile_loadd(4, qp + 32 * ch, D * (int64_t)sizeof(og_bf16));
                _tile_loadd(5, qp + 16 * D + 32 * ch, D * (int64_t)sizeof(og_bf16));
                _tile_loadd(6, k0 + 256 * ch, 64);
                _tile_loadd(7, k1 + 256 * ch, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, s + 32 * h, KBLK * (int64_t)sizeof(float));
            _tile_stored(1, s + 32 * h + 16, KBLK * (int64_t)sizeof(float));
            _tile_stored(2, s + 16 * KBLK + 32 * h, KBLK * (int64_t)sizeof(float));
            _tile_stored(3, s + 16 * KBLK + 32 * h + 16, KBLK * (int64_t)sizeof(float));
        }

        /* the rows' visible keys in the block, scores to base 2, block max */
        uint64_t vis[MB];
        for (int64_t r = 0; r < MB; r++) {
            vis[r] = 0;
            bmax[r] = -INFINITY;
            if (r >= nr) continue;
            int64_t lo = og_attend_first_key(j->W, pos[r]) - j0, hi = pos[r] + 1 - j0;
            lo = lo < 0 ? 0 : lo;
            hi = hi > KBLK ? KBLK : hi;
            if (hi <= lo) continue;
            vis[r] = lane_range(lo, hi);
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int k = 0; k < KBLK / 16; k++) {
                const __mmask16 mk = (__mmask16)(vis[r] >> (16 * k));
                if (!mk) continue;
                const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + r * KBLK + 16 * k), csv);
                _mm512_storeu_ps(s + r * KBLK + 16 * k, x);
                mx = _mm512_mask_max_ps(mx, mk, mx, x);
            }
            bmax[r] = _mm512_reduce_max_ps(mx);
        }
        /* running max and the factor c of what came before (1 where the max
         * stays, also -inf to -inf; 0 from -inf to a number) */
        for (int64_t r = 0; r < MB; r += 16) {
            const __m512 mo = _mm512_loadu_ps(m + r), mn = _mm512_max_ps(mo, _mm512_loadu_ps(bmax + r));
            const __mmask16 same = _mm512_cmp_ps_mask(mo, mn, _CMP_EQ_OQ);
            const __m512 cv = _mm512_mask_mov_ps(exp2_nonpos(_mm512_sub_ps(mo, mn)), same, _mm512_set1_ps(1.0f));
            _mm512_storeu_ps(m + r, mn);
            _mm512_storeu_ps(c + r, cv);
        }
        /* weights rounded to bf16, l, O rescaled */
        for (int64_t r = 0; r < MB; r++) {
            og_bf16 *pr = pp + r * KBLK;
            if (!vis[r]) {
                for (int k = 0; k < KBLK; k += 32) _mm512_storeu_si512((void *)(pr + k), _mm512_setzero_si512());
                continue;
            }
            const __m512 mv = _mm512_set1_ps(m[r]);
            __m512 sum = _mm512_setzero_ps();
            for (int k = 0; k < KBLK; k += 32) {
                const __mmask16 m0 = (__mmask16)(vis[r] >> k), m1 = (__mmask16)(vis[r] >> (k + 16));
                const __m512 p0 = _mm512_maskz_mov_ps(
                    m0, exp2_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, s + r * KBLK + k), mv)));
                const __m512 p1 = _mm512_maskz_mov_ps(
                    m1, exp2_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, s + r * KBLK + k + 16), mv)));
                const __m512i pb = bf16x32(p0, p1);
                _mm512_storeu_si512((void *)(pr + k), pb);
                sum = _mm512_add_ps(sum, bf16x32_sum2(pb));
            }
            l[r] = l[r] * c[r] + _mm512_reduce_add_ps(sum);
            if (c[r] != 1.0f) {
                const __m512 cv = _mm512_set1_ps(c[r]);
                for (int64_t d = 0; d < D; d += 16)
                    _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), cv));
            }
        }

        /* O += P V */
        for (int64_t e = 0; e < D / 16; e += 2) {
            _tile_loadd(0, o + 16 * e, D * (int64_t)sizeof(float));
            _tile_loadd(1, o + 16 * e + 16, D * (int64_t)sizeof(float));
            _tile_loadd(2, o + 16 * D + 16 * e, D * (int64_t)sizeof(float));
            _tile_loadd(3, o + 16 * D + 16 * e + 16, D * (int64_t)sizeof(float));
            for (int h = h0; h < h1; h++) {
                const og_bf16 *v = vp + (i0 + 32 * h) * D + 32 * e;
                _tile_loadd(4, pp + 32 * h, KBLK * (int64_t)sizeof(og_bf16));
                _tile_loadd(5, pp + 16 * KBLK + 32 * h, KBLK * (int64_t)sizeof(og_bf16));
                _tile_loadd(6, v, 2 * D * (int64_t)sizeof(og_bf16));
                _tile_loadd(7, v + 32, 2 * D * (int64_t)sizeof(og_bf16));
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, o + 16 * e, D * (int64_t)sizeof(float));
            _tile_stored(1, o + 16 * e + 16, D * (int64_t)sizeof(float));
            _tile_stored(2, o + 16 * D + 16 * e, D * (int64_t)sizeof(float));
            _tile_stored(3, o + 16 * D + 16 * e + 16, D * (int64_t)sizeof(float));
        }
    }
    _tile_release();

    for (int64_t r = 0; r < nr; r++) {
        const int64_t t = (f0 + r) / G, x = (f0 + r) % G;
        float *out = a->out + (t * Hq + g * G + x) * D;
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), inv));
    }
}

#pragma GCC pop_options

void og_attend_amx_run(const og_attend_args *a, og_threadpool *pool, void *scratch) {
    const og_kv_layer_view *kv = &a->kv;
    amx_att j = {
        .a = a,
        .T = a->T,
        .Hq = a->n_heads,
        .Hkv = kv->n_kv_heads,
        .G = a->n_heads / kv->n_kv_heads,
        .D = kv->head_dim,
        .L = kv->length,
        .R = kv->rows,
        .W = kv->policy == OG_KV_RING ? kv->window : 0,
        .RS = og_kv_layer_view_row_stride(kv),
    };
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)j.D);
    j.cs = scale * 1.44269504088896341f;
    j.K0 = og_attend_first_key(j.W, j.L);
    j.K1 = j.L + j.T;
    j.NK = packed_keys(a);
    j.n_rb = (j.T * j.G + MB - 1) / MB;
    unsigned char *mem = align64(scratch);
    j.kp = (uint32_t *)mem;
    j.vp = (og_bf16 *)(mem + (size_t)(j.Hkv * j.NK * j.D) * sizeof(og_bf16));
    j.scratch = mem + pack_bytes(a);
    j.per_thread = thread_bytes(j.D);
    og_parallel_for(pool, j.Hkv * (j.NK / KBLK), pack_task, &j);
    og_parallel_for(pool, j.n_rb * j.Hkv, attend_task, &j);
}

#else /* no AMX intrinsics: never usable */

bool og_attend_amx_usable(const og_attend_args *a) {
    (void)a;
    return false;
}

size_t og_attend_amx_scratch_bytes(const og_attend_args *a, int n_threads) {
    (void)a, (void)n_threads;
    return 0;
}

void og_attend_amx_run(const og_attend_args *a, og_threadpool *pool, void *scratch) { (void)a, (void)pool, (void)scratch; }

#endif
