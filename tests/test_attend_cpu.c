/* The fast CPU update_and_attend against the reference on odd sizes, for
 * every instruction set the CPU has, with and without a thread pool; and the
 * split-K decode path against the double-precision oracle.
 *
 * Letters: T tokens, Hq/Hkv heads, D head dim, L length, R rows, W window.
 *
 * Tolerance: both kernels accumulate in f32 (unit roundoff 6e-8) over D
 * products and up to ~4k keys, in different orders (SIMD lanes, chunks,
 * split merges). Inputs are in [-1, 1) and outputs are convex combinations
 * of v, so each side's error is ~1e-6 (random-walk growth over 4k terms);
 * atol 2e-5 + rtol 1e-4 holds with margin, yet a key dropped or added moves
 * an output by > 1e-4 even over 4k keys. bf16 changes nothing here: both
 * kernels read the same rounded storage; nor do int8 and fp8, whose rows both
 * kernels read as quant x scale (the oracle rounds the history on its own,
 * from the definition). The k/v writes must match exactly. */
#include "attend_seq.h"
#include "harness.h"
#include "kernels/attend.h"
#include "kernels/attend_amx.h"
#include "core/kv_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 2e-5
#define RTOL 1e-4

typedef struct cpu_case {
    int32_t T;
    int64_t L;
    int32_t D, Hq, Hkv;
    og_kv_policy policy;
    int32_t W, max_write; /* ring only */
    og_dtype dt;
    int32_t want_splits;  /* stats.splits the plan must report */
} cpu_case;

static const cpu_case k_cases[] = {
    {1, 1, 64, 4, 4, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 1},
    {3, 255, 80, 6, 2, OG_KV_FLAT, 0, 0, OG_DTYPE_F32, 1},
    {7, 257, 128, 8, 2, OG_KV_RING, 100, 64, OG_DTYPE_BF16, 1},
    {17, 1, 96, 8, 1, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 1},
    {129, 255, 64, 3, 1, OG_KV_FLAT, 0, 0, OG_DTYPE_F32, 1},
    {257, 257, 64, 4, 4, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 1},
    {1, 4097, 128, 16, 8, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 33},
    {1, 4097, 80, 4, 1, OG_KV_RING, 1000, 16, OG_DTYPE_F32, 8},
    {17, 4097, 64, 8, 8, OG_KV_FLAT, 0, 0, OG_DTYPE_F32, 1},
    {3, 255, 36, 12, 4, OG_KV_RING, 64, 8, OG_DTYPE_BF16, 1},
    {257, 1, 20, 4, 1, OG_KV_RING, 128, 257, OG_DTYPE_F32, 1},
    {7, 255, 96, 8, 1, OG_KV_FLAT, 0, 0, OG_DTYPE_F32, 1},
    {1, 255, 128, 16, 2, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 1}, /* sees 256 keys: no split */
    {1, 256, 128, 16, 2, OG_KV_FLAT, 0, 0, OG_DTYPE_BF16, 3}, /* sees 257 keys: split */
    /* the fused bf16 update (D % 32 == 0): a ring that wraps inside a step, key
     * counts off the 16-key blocks, G = 3, and a split decode over a ring */
    {5, 300, 32, 6, 2, OG_KV_RING, 50, 8, OG_DTYPE_BF16, 1},
    {1, 1000, 96, 3, 1, OG_KV_RING, 777, 4, OG_DTYPE_BF16, 7},
    /* int8 and fp8 rows (quants, then a scale per head): prefill, decode,
     * split decode, rings that wrap, GQA; D 9 with 3 kv heads puts the
     * scales at byte 27 of a 39-byte row (unaligned) */
    {3, 255, 80, 6, 2, OG_KV_FLAT, 0, 0, OG_DTYPE_INT8, 1},
    {7, 257, 128, 8, 2, OG_KV_RING, 100, 64, OG_DTYPE_FP8, 1},
    {1, 4097, 128, 16, 8, OG_KV_FLAT, 0, 0, OG_DTYPE_INT8, 33},
    {1, 4097, 80, 4, 1, OG_KV_RING, 1000, 16, OG_DTYPE_FP8, 8},
    {17, 1, 96, 8, 1, OG_KV_FLAT, 0, 0, OG_DTYPE_FP8, 1},
    {5, 300, 9, 3, 3, OG_KV_RING, 50, 8, OG_DTYPE_INT8, 1},
    {129, 255, 64, 3, 1, OG_KV_FLAT, 0, 0, OG_DTYPE_FP8, 1},
    {1, 256, 128, 16, 2, OG_KV_FLAT, 0, 0, OG_DTYPE_INT8, 3},
};

/* Storage of one layer holding the history rows of s that a step at L = s->n
 * would find: flat rows 0..L-1, ring the last R positions at p mod R. Rows
 * never written hold NaN bits. */
static og_kv_layer_view make_storage(const og_test_seq *s, og_kv_policy policy, int32_t W,
                                     int64_t rows) {
    og_kv_layer_view kv = {.layer_id = 0, .policy = policy, .dtype = s->dtype,
                           .window = policy == OG_KV_RING ? W : 0, .n_kv_heads = s->Hkv,
                           .head_dim = s->D, .rows = rows, .length = s->n};
    const int64_t HD = (int64_t)s->Hkv * s->D, RB = og_kv_dtype_row_bytes(s->dtype, s->Hkv, s->D);
    const size_t bytes = (size_t)(rows * RB);
    kv.k = malloc(bytes);
    kv.v = malloc(bytes);
    memset(kv.k, 0xff, bytes);
    memset(kv.v, 0xff, bytes);
    const int64_t first = policy == OG_KV_RING && s->n > rows ? s->n - rows : 0;
    for (int64_t p = first; p < s->n; p++) {
        const int64_t slot = policy == OG_KV_RING ? p % rows : p;
        if (og_kv_dtype_quantized(s->dtype)) { /* rows of RB bytes, from the inputs as given */
            og_kv_quantize_row(s->dtype, s->k + p * HD, s->Hkv, s->D, (unsigned char *)kv.k + slot * RB);
            og_kv_quantize_row(s->dtype, s->v + p * HD, s->Hkv, s->D, (unsigned char *)kv.v + slot * RB);
            continue;
        }
        for (int64_t i = 0; i < HD; i++) {
            /* ks/vs already hold bf16-exact values for bf16 storage */
            if (s->dtype == OG_DTYPE_F32) {
                ((float *)kv.k)[slot * HD + i] = s->ks[p * HD + i];
                ((float *)kv.v)[slot * HD + i] = s->vs[p * HD + i];
            } else {
                ((og_bf16 *)kv.k)[slot * HD + i] = og_bf16_from_f32(s->ks[p * HD + i]);
                ((og_bf16 *)kv.v)[slot * HD + i] = og_bf16_from_f32(s->vs[p * HD + i]);
            }
        }
    }
    return kv;
}

static void run_case(const cpu_case *c, og_threadpool *pool, uint64_t seed) {
    char name[160];
    snprintf(name, sizeof name, "T=%d L=%lld D=%d Hq=%d Hkv=%d %s W=%d %s", c->T,
             (long long)c->L, c->D, c->Hq, c->Hkv, c->policy == OG_KV_RING ? "ring" : "flat",
             c->W, og_dtype_name(c->dt));
    og_test_section(name);
    og_rng r = og_rng_seed(seed);
    og_test_seq s;
    if (!og_test_seq_init(&s, c->Hq, c->Hkv, c->D, c->dt, c->L + c->T)) {
        CHECK_MSG(false, "%s: out of memory", name);
        return;
    }
    og_test_seq_append(&s, &r, (int32_t)c->L); /* the history */
    const int64_t rows = c->policy == OG_KV_RING ? c->W + c->max_write - 1 : c->L + c->T + 3;
    og_kv_layer_view orig = make_storage(&s, c->policy, c->W, rows);
    const int64_t pos = og_test_seq_append(&s, &r, c->T); /* the step */
    const size_t n_out = (size_t)c->T * c->Hq * c->D;
    float *want = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));

    og_kv_layer_view ref_kv = og_test_kv_clone(&orig);
    og_attend_args a = {.q = s.q + pos * c->Hq * c->D, .k = s.k + pos * c->Hkv * c->D,
                        .v = s.v + pos * c->Hkv * c->D, .out = want, .T = c->T,
                        .n_heads = c->Hq, .kv = ref_kv};
    og_poison(want, n_out);
    CHECK_OK(og_update_and_attend_ref(&a));

    for (int isa = 0; isa < OG_CPU_ISA_COUNT; isa++) {
        if (!og_cpu_isa_supported((og_cpu_isa)isa)) continue;
        for (int with_pool = 0; with_pool < 2; with_pool++) {
            og_kv_layer_view kv = og_test_kv_clone(&orig);
            a.kv = kv;
            a.out = got;
            og_poison(got, n_out);
            og_attend_stats stats = {0};
            CHECK_OK(og_update_and_attend_cpu_isa(&a, with_pool ? pool : NULL, (og_cpu_isa)isa,
                                                  &stats));
            size_t worst = 0;
            const double ratio = og_tol_ratio(got, want, n_out, ATOL, RTOL, &worst);
            CHECK_MSG(ratio <= 1.0, "%s [%s%s]: element %zu got %.9g want %.9g (ratio %.3g)",
                      name, og_cpu_isa_name((og_cpu_isa)isa), with_pool ? ", pool" : "", worst,
                      (double)got[worst], (double)want[worst], ratio);
            CHECK_MSG(stats.splits == c->want_splits, "%s [%s]: %d splits, want %d", name,
                      og_cpu_isa_name((og_cpu_isa)isa), stats.splits, c->want_splits);
            CHECK_MSG(memcmp(kv.k, ref_kv.k, og_test_kv_bytes(&kv)) == 0 &&
                          memcmp(kv.v, ref_kv.v, og_test_kv_bytes(&kv)) == 0,
                      "%s [%s]: storage after the step differs from the reference's", name,
                      og_cpu_isa_name((og_cpu_isa)isa));
            og_test_kv_free(&kv);
        }
    }
    /* the fast kernel also against the oracle, for the best instruction set */
    CHECK_MSG(og_test_seq_check(&s, pos, c->T, c->policy == OG_KV_RING ? c->W : 0, 0.0f, got, ATOL,
                                RTOL) <= 1.0,
              "%s: fast kernel vs oracle", name);
    free(want);
    free(got);
    og_test_kv_free(&ref_kv);
    og_test_kv_free(&orig);
    og_test_seq_free(&s);
}

/* A 257-token prefill through the fast kernel, then a decode at position
 * 257: the decode sees 258 keys and must take the split-K path. Both steps
 * are checked against the oracle. */
static void split_decode_after_prefill(og_threadpool *pool) {
    og_test_section("decode at 257 after a 257-token prefill (split-K)");
    enum { HQ = 8, HKV = 2, D = 128, N = 258 };
    og_rng r = og_rng_seed(257);
    og_test_seq s;
    CHECK(og_test_seq_init(&s, HQ, HKV, D, OG_DTYPE_BF16, N));
    og_kv_layer_view kv = make_storage(&s, OG_KV_FLAT, 0, N);
    float *out = malloc((size_t)257 * HQ * D * sizeof(float));
    const int32_t widths[2] = {257, 1};
    for (int i = 0; i < 2; i++) {
        const int32_t T = widths[i];
        const int64_t pos = og_test_seq_append(&s, &r, T);
        kv.length = pos;
        og_attend_args a = {.q = s.q + pos * HQ * D, .k = s.k + pos * HKV * D,
                            .v = s.v + pos * HKV * D, .out = out, .T = T, .n_heads = HQ,
                            .kv = kv};
        og_poison(out, (size_t)T * HQ * D);
        og_attend_stats stats = {0};
        CHECK_OK(og_update_and_attend_cpu(&a, pool, &stats));
        CHECK_MSG(T == 1 ? stats.splits > 1 : stats.splits == 1, "T=%d: %d splits", T,
                  stats.splits);
        CHECK_MSG(og_test_seq_check(&s, pos, T, 0, 0.0f, out, ATOL, RTOL) <= 1.0,
                  "T=%d at L=%lld vs oracle", T, (long long)pos);
    }
    free(out);
    og_test_kv_free(&kv);
    og_test_seq_free(&s);
}

/* Stored rows holding every quant value: int8 -128..127 and every finite
 * e4m3 byte (0x7f / 0xff, NaN, left out), over two kv heads with scales of
 * different sizes, read by every instruction set (fused or widened) and by
 * the reference: a byte decoded wrongly anywhere moves an output by far
 * more than the tolerance (4 keys, so every key weighs ~1/4). */
static void every_quant_value(og_threadpool *pool) {
    enum { HQ = 4, HKV = 2, D = 128, L = 3, R = 8 };
    const og_dtype dts[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
    for (int di = 0; di < 2; di++) {
        const og_dtype dt = dts[di];
        char name[64];
        snprintf(name, sizeof name, "every %s value in stored rows", og_dtype_name(dt));
        og_test_section(name);
        const int64_t RB = og_kv_dtype_row_bytes(dt, HKV, D);
        og_kv_layer_view kv = {.layer_id = 0, .policy = OG_KV_FLAT, .dtype = dt, .n_kv_heads = HKV,
                               .head_dim = D, .rows = R, .length = L};
        unsigned char *k = calloc((size_t)(R * RB), 1), *v = calloc((size_t)(R * RB), 1);
        og_test_fill_every_quant(dt, k, v, L, HKV, D, RB);
        og_rng r = og_rng_seed(255 + (uint64_t)di);
        float q[HQ * D], kn[HKV * D], vn[HKV * D], want[HQ * D], got[HQ * D];
        og_rng_fill(&r, q, HQ * D, -1, 1);
        og_rng_fill(&r, kn, HKV * D, -1, 1);
        og_rng_fill(&r, vn, HKV * D, -1, 1);
        unsigned char *kr = malloc((size_t)(R * RB)), *vr = malloc((size_t)(R * RB));
        memcpy(kr, k, (size_t)(R * RB));
        memcpy(vr, v, (size_t)(R * RB));
        og_attend_args a = {.q = q, .k = kn, .v = vn, .out = want, .T = 1, .n_heads = HQ, .kv = kv};
        a.kv.k = kr, a.kv.v = vr;
        CHECK_OK(og_update_and_attend_ref(&a));
        bool finite = true;
        for (int i = 0; i < HQ * D; i++) finite = finite && isfinite(want[i]);
        CHECK_MSG(finite, "%s: reference outputs not finite", name);
        for (int isa = 0; isa < OG_CPU_ISA_COUNT; isa++) {
            if (!og_cpu_isa_supported((og_cpu_isa)isa)) continue;
            unsigned char *kf = malloc((size_t)(R * RB)), *vf = malloc((size_t)(R * RB));
            memcpy(kf, k, (size_t)(R * RB));
            memcpy(vf, v, (size_t)(R * RB));
            a.kv.k = kf, a.kv.v = vf, a.out = got;
            og_poison(got, HQ * D);
            CHECK_OK(og_update_and_attend_cpu_isa(&a, pool, (og_cpu_isa)isa, NULL));
            size_t worst = 0;
            const double ratio = og_tol_ratio(got, want, HQ * D, ATOL, RTOL, &worst);
            CHECK_MSG(ratio <= 1.0, "%s [%s]: element %zu got %.9g want %.9g", name, og_cpu_isa_name((og_cpu_isa)isa),
                      worst, (double)got[worst], (double)want[worst]);
            CHECK_MSG(!memcmp(kf, kr, (size_t)(R * RB)) && !memcmp(vf, vr, (size_t)(R * RB)),
                      "%s [%s]: storage differs from the reference's", name, og_cpu_isa_name((og_cpu_isa)isa));
            free(kf);
            free(vf);
        }
        free(k), free(v), free(kr), free(vr);
    }
}

/* A step over parts of the kv heads, as tensor-parallel shards run it
 * (og_attend_args.kv_part): the kv heads cut into parts of 1 and 2 heads
 * (3 and 5 heads of D 9 and 64; the rows hold padding), each part given
 * its query heads, k and v and a view that starts at its first head's
 * quants. After every part ran, storage must hold the bytes the whole-row
 * reference wrote (quants, every head's scale where the whole row keeps it,
 * the padding zeros over stale bytes), and each part's outputs must be the
 * whole reference's for its heads: exactly for the reference run on parts,
 * within the tolerance for the fast kernel at every instruction set. */
static void parts_of_rows(og_threadpool *pool) {
    typedef struct { int32_t T, D, Hkv, G; og_dtype dt; int64_t L; } part_case;
    static const part_case cases[] = {{3, 9, 3, 2, OG_DTYPE_INT8, 40}, {1, 64, 5, 1, OG_DTYPE_FP8, 300},
                                      {6, 64, 5, 2, OG_DTYPE_INT8, 7}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const part_case *c = &cases[ci];
        char name[128];
        snprintf(name, sizeof name, "parts of rows: T=%d D=%d Hkv=%d G=%d %s L=%lld", c->T, c->D, c->Hkv, c->G,
                 og_dtype_name(c->dt), (long long)c->L);
        og_test_section(name);
        const int32_t Hq = c->Hkv * c->G, D = c->D;
        og_rng r = og_rng_seed(4242 + ci);
        og_test_seq s;
        CHECK(og_test_seq_init(&s, Hq, c->Hkv, D, c->dt, c->L + c->T));
        og_test_seq_append(&s, &r, (int32_t)c->L);
        const int64_t rows = c->L + c->T + 2, RB = og_kv_dtype_row_bytes(c->dt, c->Hkv, D);
        og_kv_layer_view orig = make_storage(&s, OG_KV_FLAT, 0, rows);
        orig.row_stride = RB;
        const int64_t pos = og_test_seq_append(&s, &r, c->T);
        const size_t n_out = (size_t)c->T * Hq * D;
        float *want = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
        og_kv_layer_view ref_kv = og_test_kv_clone(&orig);
        og_attend_args whole = {.q = s.q + pos * Hq * D, .k = s.k + pos * c->Hkv * D, .v = s.v + pos * c->Hkv * D,
                                .out = want, .T = c->T, .n_heads = Hq, .kv = ref_kv};
        CHECK_OK(og_update_and_attend_ref(&whole));
        float *pq = malloc(n_out * sizeof(float)), *pk = malloc((size_t)c->T * c->Hkv * D * sizeof(float));
        float *pv = malloc((size_t)c->T * c->Hkv * D * sizeof(float)), *pout = malloc(n_out * sizeof(float));
        for (int run = -1; run < OG_CPU_ISA_COUNT; run++) { /* -1: the reference on parts */
            if (run >= 0 && !og_cpu_isa_supported((og_cpu_isa)run)) continue;
            og_kv_layer_view kv = og_test_kv_clone(&orig);
            og_poison(got, n_out);
            for (int32_t h0 = 0; h0 < c->Hkv;) {
                const int32_t n = h0 % 2 ? 1 : (h0 + 2 <= c->Hkv ? 2 : 1); /* parts of 2, 1, 2, ... heads */
                for (int32_t t = 0; t < c->T; t++) {
                    memcpy(pq + (size_t)t * n * c->G * D, whole.q + ((size_t)t * Hq + (size_t)h0 * c->G) * D,
                           (size_t)n * c->G * D * sizeof(float));
                    memcpy(pk + (size_t)t * n * D, whole.k + ((size_t)t * c->Hkv + h0) * D, (size_t)n * D * sizeof(float));
                    memcpy(pv + (size_t)t * n * D, whole.v + ((size_t)t * c->Hkv + h0) * D, (size_t)n * D * sizeof(float));
                }
                og_attend_args a = {.q = pq, .k = pk, .v = pv, .out = pout, .T = c->T, .n_heads = n * c->G, .kv = kv,
                                    .kv_part = {.heads = c->Hkv, .head0 = h0}};
                a.kv.k = (unsigned char *)kv.k + (size_t)h0 * D;
                a.kv.v = (unsigned char *)kv.v + (size_t)h0 * D;
                a.kv.n_kv_heads = n;
                CHECK_OK(run < 0 ? og_update_and_attend_ref(&a)
                                 : og_update_and_attend_cpu_isa(&a, pool, (og_cpu_isa)run, NULL));
                for (int32_t t = 0; t < c->T; t++)
                    memcpy(got + ((size_t)t * Hq + (size_t)h0 * c->G) * D, pout + (size_t)t * n * c->G * D,
                           (size_t)n * c->G * D * sizeof(float));
                h0 += n;
            }
            const char *who = run < 0 ? "reference" : og_cpu_isa_name((og_cpu_isa)run);
            if (run < 0) {
                CHECK_MSG(!memcmp(got, want, n_out * sizeof(float)), "%s [%s]: outputs differ from the whole row's",
                          name, who);
            } else {
                size_t worst = 0;
                const double ratio = og_tol_ratio(got, want, n_out, ATOL, RTOL, &worst);
                CHECK_MSG(ratio <= 1.0, "%s [%s]: element %zu got %.9g want %.9g", name, who, worst,
                          (double)got[worst], (double)want[worst]);
            }
            CHECK_MSG(!memcmp(kv.k, ref_kv.k, og_test_kv_bytes(&kv)) && !memcmp(kv.v, ref_kv.v, og_test_kv_bytes(&kv)),
                      "%s [%s]: storage differs from the whole row's", name, who);
            og_test_kv_free(&kv);
        }
        /* a part must be int8 / fp8 storage with whole heads inside the row */
        og_attend_args bad = whole;
        bad.kv_part = (og_kv_row_part){.heads = c->Hkv - 1, .head0 = 0};
        CHECK_STATUS(og_update_and_attend_ref(&bad), OG_ERR_INVALID_ARGUMENT);
        free(pq), free(pk), free(pv), free(pout), free(want), free(got);
        og_test_kv_free(&ref_kv);
        og_test_kv_free(&orig);
        og_test_seq_free(&s);
    }
}

int main(void) {
    /* the vector kernel at f32 tolerances: og_update_and_attend_cpu must not
     * hand wide bf16 steps to the tiles (bf16 q and weights; test_attend_amx) */
    og_attend_amx_allow(false);
    fprintf(stderr, "best instruction set: %s\n", og_cpu_isa_name(og_cpu_isa_active()));
    CHECK(og_cpu_isa_supported(OG_CPU_ISA_SCALAR));
    CHECK(og_cpu_isa_supported(og_cpu_isa_active()));
    og_threadpool *pool = og_threadpool_create(3);
    CHECK(pool != NULL);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        run_case(&k_cases[i], pool, 1000 + i);
    split_decode_after_prefill(pool);
    every_quant_value(pool);
    parts_of_rows(pool);
    og_threadpool_destroy(pool);
    return og_test_finish();
}
