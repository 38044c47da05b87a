/* update_and_attend on CUDA against the plain C reference (og_update_and_attend_ref)
 * on odd sizes: T of 1, 3, 17, 129; histories 0, 1, 255, 257, 4097; flat and
 * ring (wrapping) layers, windows 37, 100 and 1000; GQA ratios 1, 3, 4, 8
 * (and 12: two head chunks); head dims 64 and 128 (and 8); bf16 and f32
 * storage. Fresh random inputs per case, outputs poisoned before each run,
 * the written storage rows compared exactly. Every case runs the split-K
 * kernel twice on one scratch (the second run checks that the first left
 * its split counters at 0), over bf16 storage with D 64/128 the split-K
 * kernel on the tensor cores twice too (kMmaAtol says its tolerance); steps
 * the tiled tensor-core kernel takes (T > 1, bf16 storage, D 64/128) then
 * run tiled. Decode cases at tile, warp and split edges (test_decode_edges)
 * for G 1, 2, 4, 8; the batched cases over bf16 run both split-K kernels.
 *
 * Tolerance, split-K: both sides read the same stored (bf16-rounded) keys
 * and values and accumulate in f32; only the order of the sums and exp2 of
 * pre-scaled scores against exp differ. Over at most ~4k keys that is well
 * under 1e-5 relative per output; outputs are convex mixes of values in
 * [-1, 1], so atol 5e-5 + rtol 5e-4 leaves a margin while a wrong or missing
 * key moves an output by ~1e-3 or more.
 * Tolerance, tiled: the weights p are rounded to bf16 (relative error at
 * most 2^-8: bf16 keeps 8 significant bits) before P x V while the row sums
 * use the unrounded p, so an output moves by at most 2^-8 max|v| = 3.9e-3
 * (|v| <= 1); q carried as bf16 hi + lo adds ~2^-16 relative to the scores.
 * Elementwise bound: atol 4.2e-3. The rounding errors are independent, so over a whole case they
 * average out: ||got - ref|| / ||ref|| must also stay under 1e-2, which a
 * missing key tile or a wrong head breaks.
 * Every fourth case stores its rows packed (row stride Hkv * D + 16, the
 * elements between must stay as they were).
 * Batched decode (og_update_and_attend_batch_cuda) against the reference run
 * per entry on host copies: B 1, 2, 3, 17, 64; lengths mixed in one call (0,
 * 1, 3, 127, 128, 129, 1000, 4097); flat and ring (W 4 and 64, wrapping);
 * bf16 and f32; Hq/Hkv 16/8, 4/1, 6/3, 16/2; D 64 and 128; padded entries (T = 0)
 * whose out rows stay poisoned and whose storage stays as it was; packed rows
 * (k and v of an entry in one block with other bytes around them), every
 * storage block compared byte for byte; max_keys below the longest entry (a
 * grid of one split); one graph replayed over a table rewritten between
 * replays (new lengths, padding and storage bases). Same tolerance as the
 * split-K cases.
 * int8 and fp8 storage (core/kv_quant.h: quants, a f32 scale per token and
 * head, padding to 16 bytes) through the same cases, single-session (T 1 to
 * 129, D 16 to 256) and batched: the reference quantizes with the CPU
 * quantizer and the kernel with its own code, so the byte-for-byte storage
 * check is the check of the kernel's quantizer (same f32 divisions, same
 * rounding). Both read the same quants and scales (the kernel folds the
 * scales into the score and the weight instead of into each element: one
 * more f32 rounding per product), so the split-K tolerance holds. Storage
 * around the rows is random bytes; the rows hold valid quantized rows. And
 * rows holding every int8 value and every finite e4m3 byte, decoded by both.
 * int8 / fp8 cases with D 64 / 128 run the tensor-core kernel too
 * (qmma_attend_kernel: quants as exact f16 operands, q and the weights in
 * f16 hi + lo; kQmmaAtol says its tolerance) and, outside the quick set,
 * the variant that widens tiles to bf16 (the scales folded as above:
 * kMmaAtol holds). The graph cases replay int8 and fp8 tables on it too.
 * OG_CUDA_TEST_QUICK=1 keeps T <= 17, histories <= 257 and B <= 17
 * (sanitizer runs); OG_ATTEND_CUDA_TEST_BATCH_ONLY=1 runs the batched cases
 * alone (racecheck of the batched kernel), OG_ATTEND_CUDA_TEST_QUANT_ONLY=1
 * the int8 / fp8 cases alone.
 * Skipped (77) without a CUDA build or device. */
#include "attend_seq.h"
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/attend.h"
#include "core/kv_quant.h"
#include "kernels/cuda/ops_cuda.h"

#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>

/* Tolerance of the split-K kernel on the tensor cores (bf16 storage, D 64
 * and 128; og_attend_cuda_decode_mma), from its roundings. Scores: q is
 * pre-scaled by c = scale log2(e) in f32 (2^-24) and carried as hi =
 * bf16(x) plus lo = bf16(x - hi) (x - hi is exact), so |x - hi - lo| <=
 * 2^-8 |x - hi| <= 2^-16 |x| (bf16 rounds by up to 2^-8 relative); k is
 * exact bf16 and the products are exact; the mma sums them in f32 over
 * D / 16 steps of 16 (at most 2^-23 of the terms' magnitude each, allowing
 * truncation), then hi + lo rows are added (2^-24). A score is off by at
 * most (2^-16 + (D/16 + 1) 2^-23) sum |c q k|; with |q|, |k| <= 1 the sum
 * is at most c D: 16.3 at D 128 and scale 1/sqrt(D) (11.5 at D 64; scale
 * 0.07 gives 12.9 / 6.5), so a score moves by at most 16.3 x 1.63e-5 =
 * 2.7e-4 (log2 units). A weight exp2(s - m) then moves by at most ln 2 x
 * 2.7e-4 = 1.9e-4 relative, plus exp2f's 2 ulp (2.4e-7) and the weight's
 * own split into hi + lo for P V (2^-16 = 1.5e-5): eta <= 2.0e-4. The f32
 * sums of p v over a warp's keys (at most a split's ~130 keys / 4 warps, 8
 * per mma) add 2^-23 per step. An output is a convex mix sum w v / sum w,
 * and weights each off by at most eta relative move it by at most 2 eta
 * max|v| = 4.0e-4 (|v| <= 1). Elementwise bound: atol 4.5e-4 beside the
 * split-K rtol 5e-4 (the merge of warps and splits is the split-K
 * kernel's), and the same case-wide 1e-3 relative norm: about 9 times
 * tighter than the tiled kernel's bf16 weights. (An earlier version took
 * bf16's rounding as 2^-9 and had 1.5e-4; measured errors sit inside both.)
 * int8 / fp8 storage: the quants are bf16 values (exact), the score is
 * (q . quants) x k scale and the weight p x v scale, two more f32 roundings
 * (2^-24 each) of the same terms: the same bound. */
static const double kMmaAtol = 4.5e-4;

/* Tolerance of the tensor-core kernel over int8 / fp8 storage
 * (qmma_attend_kernel, D 64 and 128), from its roundings. Scores: y = q x c
 * (c = scale log2(e)) in f32 (2^-24), times a power of two 2^e that puts a
 * head's largest |y| in [2^14, 2^15) (exact), split into f16 hi + lo: y -
 * hi is exact and lo rounds it by 2^-11 relative (f16 keeps 11 significant
 * bits) or, below f16's normal range (2^-14), by at most 2^-25, which is
 * 2^-39 of max |y|; so each element is off by at most 2^-22 |y| + 2^-39
 * max|y|. The quants are exact f16 values and the products exact in f32
 * (11 + 11 bits); the mma sums them over D / 16 steps (2^-23 of the terms'
 * magnitude each, allowing truncation), the hi and lo rows are added
 * (2^-24) and the sum is multiplied by 2^-e (exact) and the k scale
 * (2^-24): a score is off by at most (2^-22 + (D/16 + 2) 2^-23) sum |y k|
 * + 2^-39 max|y| sum |k| <= 1.43e-6 x 16.3 + 3e-11 = 2.3e-5 (D 128, |q|,
 * |k| <= 1, scale 1/sqrt(D): sum |y k| <= c D = 16.3), and a weight
 * exp2(s - m) by ln 2 x 2.3e-5 + exp2f's 2 ulp = 1.7e-5 relative. The weight
 * of P V, w = p x v scale x 2^15 / vmax (vmax: the largest v scale the warp
 * has seen), takes three f32 roundings (1.8e-7), and its f16 hi + lo is off
 * by at most 2^-22 w + 2^-25, which over the key's quants times vmax 2^-15
 * is at most 2^-22 p |v| + 2^-40 max|v| per key: 3.6e-7 max|v| over 2^17
 * keys (the row sum is at least 1). The f32 accumulators take one rounding
 * per 64-key tile for the sum and one for the rescale (2^-23 + 2^-24); a
 * warp sees at most 66 tiles here (one split over 4226 keys): 1.2e-5. So
 * eta <= 1.7e-5 + 1.2e-5 + 0.05e-5 = 3.0e-5 relative per weight, and an
 * output, a convex mix, moves by at most 2 eta max|v| = 6.0e-5 (|v| <= 1).
 * Elementwise bound: atol 1e-4 beside the split-K rtol 5e-4 (the merge of
 * warps and splits is the split-K kernel's), the case-wide 1e-3 relative
 * norm; 4.5 times tighter than the bf16 tensor-core kernel's bound. */
static const double kQmmaAtol = 1e-4;

/* OG_CUDA_TEST_QUICK: the sizes a sanitizer run can afford */
static bool g_quick;
/* OG_ATTEND_CUDA_TEST_QUANT_ONLY: the int8 / fp8 cases alone (a sanitizer run over their kernels) */
static bool g_quant_only;

typedef struct attend_case {
    og_kv_policy policy;
    int32_t T, Hkv, G, D, W;
    int64_t L;
    og_dtype dtype;
    float scale;
    int64_t RS; /* storage row stride in elements (int8 / fp8: bytes); 0: dense */
} attend_case;

/* Fills n elements of storage at random: bf16 / f32 uniform in [-1, 1),
 * int8 / fp8 random bytes (fill_rows then makes the rows valid), so that a
 * wrong read or write shows. */
static void fill_random(unsigned char *base, og_dtype dt, size_t n, og_rng *rng) {
    for (size_t e = 0; e < n; e++) {
        if (og_kv_dtype_quantized(dt)) base[e] = (unsigned char)og_rng_next(rng);
        else og_store_f32(base, dt, e, og_rng_uniform(rng, -1, 1));
    }
}

/* int8 / fp8 only: R rows, stride bytes apart from base + at, each a row
 * quantized from uniform values (og_kv_quantize_row): what a kernel reads
 * as history. */
static void fill_rows(unsigned char *base, og_dtype dt, int64_t R, size_t stride, size_t at, int32_t Hkv, int32_t D,
                      og_rng *rng) {
    if (!og_kv_dtype_quantized(dt)) return;
    float *x = malloc((size_t)Hkv * D * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        og_rng_fill(rng, x, (size_t)Hkv * D, -1, 1);
        og_kv_quantize_row(dt, x, Hkv, D, base + (size_t)r * stride + at);
    }
    free(x);
}

/* The stream every kernel of the test runs on (cudaStreamNonBlocking, as the
 * executor's; the legacy stream until main creates it: the refusals launch
 * there). Every copy and fill goes through it too. cudaMemcpy and cudaMemset
 * run on the legacy stream, which a non-blocking stream does not wait for:
 * cudaMemset returns before it runs, and cudaMemcpy from pageable memory to
 * the device returns once the bytes are staged, its DMA maybe still to come,
 * so a kernel launched next could read inputs not yet there or have its out
 * overwritten by the late poison (seen as NaN at the start of rows whose
 * blocks finished first, with other processes sharing the GPU). */
static cudaStream_t g_stream;

static void to_dev(void *d, const void *host, size_t bytes) {
    CK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, g_stream));
}

static void fill_dev(void *d, int byte, size_t bytes) { CK(cudaMemsetAsync(d, byte, bytes, g_stream)); }

/* Waits for the stream (the kernels before) and copies back. */
static void from_dev(void *host, const void *d, size_t bytes) {
    CK(cudaMemcpyAsync(host, d, bytes, cudaMemcpyDeviceToHost, g_stream));
    CK(cudaStreamSynchronize(g_stream));
}

/* What a NaN in out is: the poison itself (a row never written, or written
 * before the poison copy landed) or one the kernel computed. */
static const char *nan_kind(float x) {
    float poison;
    og_poison(&poison, 1);
    return !isnan(x) ? "" : memcmp(&x, &poison, sizeof x) == 0 ? " (the poison)" : " (computed)";
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    to_dev(d, host, bytes);
    return d;
}

static void run_case(const attend_case *c, og_rng *rng, cudaStream_t stream) {
    const int32_t T = c->T, Hkv = c->Hkv, Hq = c->Hkv * c->G, D = c->D;
    const int64_t R = c->policy == OG_KV_FLAT ? c->L + T + 5 : (int64_t)c->W + T + 1; /* ring max_write T + 2 */
    /* a row's own elements: Hkv x D, or int8 / fp8 bytes (quants, scales, padding) */
    const size_t es = og_dtype_size(c->dtype), row = (size_t)og_kv_dtype_row_bytes(c->dtype, Hkv, D) / es;
    const size_t RS = c->RS ? (size_t)c->RS : row; /* packed: the elements between rows stay untouched */
    const size_t qn = (size_t)T * Hq * D, kn = (size_t)T * Hkv * D, sn = (size_t)R * RS;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *ref = malloc(qn * 4), *got = malloc(qn * 4);
    void *kc = malloc(sn * es), *vc = malloc(sn * es), *kc_got = malloc(sn * es), *vc_got = malloc(sn * es);
    og_rng_fill(rng, q, qn, -1, 1);
    og_rng_fill(rng, k, kn, -1, 1);
    og_rng_fill(rng, v, kn, -1, 1);
    /* history: every stored row random (rows not yet written are random too:
     * a kernel that read them would show) */
    fill_random(kc, c->dtype, sn, rng);
    fill_random(vc, c->dtype, sn, rng);
    fill_rows(kc, c->dtype, R, RS * es, 0, Hkv, D, rng);
    fill_rows(vc, c->dtype, R, RS * es, 0, Hkv, D, rng);
    void *dq = dev_copy(q, qn * 4), *dk = dev_copy(k, kn * 4), *dv = dev_copy(v, kn * 4);
    void *dkc = dev_copy(kc, sn * es), *dvc = dev_copy(vc, sn * es);
    og_poison(got, qn);
    void *dout = dev_copy(got, qn * 4);
    float *partials = NULL;
    const size_t scratch = (size_t)og_attend_cuda_scratch_floats(Hq, D) * 4;
    CK(cudaMalloc((void **)&partials, scratch));
    fill_dev(partials, 0, scratch); /* the split counters start at 0 */
    int64_t *dlen = dev_copy(&c->L, sizeof c->L);

    og_kv_layer_view view = {.layer_id = 0, .policy = c->policy, .dtype = c->dtype,
                             .window = c->policy == OG_KV_RING ? c->W : 0, .n_kv_heads = Hkv, .head_dim = D,
                             .rows = R, .length = c->L, .k = kc, .v = vc, .row_stride = c->RS};
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int32_t t = 0; t < T; t++) pos[t] = (int32_t)(c->L + t);
    og_attend_args ra = {.q = q, .k = k, .v = v, .positions = pos, .out = ref, .T = T, .n_heads = Hq,
                         .scale = c->scale, .kv = view};
    CHECK_OK(og_update_and_attend_ref(&ra)); /* writes kc, vc too */

    /* split-K on the CUDA cores twice (the second step finds the split
     * counters the first left at 0, and rewrites the same storage rows), the
     * same on the tensor cores where that kernel applies, then tiled where it
     * applies */
    const og_attend_cuda_quant_decode qprev = og_attend_cuda_set_quant_decode(OG_ATTEND_CUDA_QUANT_MMA);
    const bool tiled = og_attend_cuda_tiled(T, c->dtype, D), mma = og_attend_cuda_decode_mma(c->dtype, D);
    const bool quant = og_kv_dtype_quantized(c->dtype);
    enum { SIMT, MMA, WIDEN, TILED }; /* WIDEN: int8 / fp8 on the tensor cores through bf16 tiles */
    int kinds[6], n_pass = 0;
    kinds[n_pass++] = SIMT, kinds[n_pass++] = SIMT;
    if (mma) kinds[n_pass++] = MMA, kinds[n_pass++] = MMA;
    if (mma && quant && !g_quick) kinds[n_pass++] = WIDEN;
    if (tiled) kinds[n_pass++] = TILED;
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    for (int pass = 0; pass < n_pass; pass++) {
        const int kind = kinds[pass];
        og_attend_cuda_set_decode(kind == MMA || kind == WIDEN ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
        og_attend_cuda_set_quant_decode(kind == WIDEN ? OG_ATTEND_CUDA_QUANT_WIDEN : OG_ATTEND_CUDA_QUANT_MMA);
        og_attend_cuda_args ga = {.q = dq, .k = dk, .v = dv, .out = dout, .T = T, .n_heads = Hq, .scale = c->scale,
                                  .kv = view, .length = dlen, .partials = partials, .split_k = kind != TILED};
        ga.kv.k = dkc, ga.kv.v = dvc;
        if (kind == TILED) CK(cudaMalloc((void **)&ga.out_bf16, qn * 2)); /* out as bf16 too: checked below */
        if (kind == TILED) fill_dev(ga.out_bf16, 0xff, qn * 2);
        og_poison(got, qn);
        to_dev(dout, got, qn * 4);
        CHECK_OK(og_update_and_attend_cuda(stream, &ga));
        CK(cudaStreamSynchronize(stream));
        from_dev(got, dout, qn * 4);
        if (ga.out_bf16) { /* the bf16 copy is out rounded to nearest even, element for element */
            uint16_t *h = malloc(qn * 2);
            from_dev(h, ga.out_bf16, qn * 2);
            size_t i = 0;
            while (i < qn && h[i] == og_bf16_from_f32(got[i])) i++;
            CHECK_MSG(i == qn, "tiled T=%d L=%lld: bf16 copy of out differs at %zu", T, (long long)c->L, i);
            free(h);
            cudaFree(ga.out_bf16);
        } else { /* a copy where the tiled kernel does not run is refused */
            uint16_t *d16 = NULL;
            CK(cudaMalloc((void **)&d16, qn * 2));
            og_attend_cuda_args bad = ga;
            bad.out_bf16 = d16;
            CHECK(og_update_and_attend_cuda(stream, &bad) == OG_ERR_INVALID_ARGUMENT);
            cudaFree(d16);
        }
        from_dev(kc_got, dkc, sn * es);
        from_dev(vc_got, dvc, sn * es);
        const double atol = kind == TILED ? 4.2e-3 : kind == MMA ? (quant ? kQmmaAtol : kMmaAtol)
                                                   : kind == WIDEN ? kMmaAtol : 5e-5;
        size_t worst = 0;
        double r = og_tol_ratio(got, ref, qn, atol, kind == TILED ? 0.0 : 5e-4, &worst);
        double err2 = 0.0, ref2 = 0.0;
        for (size_t i = 0; i < qn; i++) {
            err2 += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            ref2 += (double)ref[i] * ref[i];
        }
        const double rel = sqrt(err2 / ref2);
        CHECK_MSG(r <= 1.0 && !(rel > (kind == TILED ? 1e-2 : 1e-3)),
                  "%s %s %s T=%d L=%lld Hq=%d Hkv=%d D=%d W=%d: ratio %.3g at %zu (got %g%s, want %g), rel %.3g",
                  kind == TILED ? "tiled" : kind == MMA ? "split-K (tensor cores)"
                                           : kind == WIDEN ? "split-K (tensor cores, widened tiles)" : "split-K",
                  c->policy == OG_KV_FLAT ? "flat" : "ring", og_dtype_name(c->dtype), T, (long long)c->L, Hq, Hkv, D,
                  c->W, r, worst, (double)got[worst], nan_kind(got[worst]), (double)ref[worst], rel);
        CHECK_MSG(memcmp(kc_got, kc, sn * es) == 0 && memcmp(vc_got, vc, sn * es) == 0,
                  "storage differs after the step (T=%d L=%lld row stride %lld)", T, (long long)c->L,
                  (long long)c->RS);
    }
    og_attend_cuda_set_decode(prev);
    og_attend_cuda_set_quant_decode(qprev);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dkc), cudaFree(dvc), cudaFree(dout), cudaFree(partials),
        cudaFree(dlen);
    free(q), free(k), free(v), free(ref), free(got), free(kc), free(vc), free(kc_got), free(vc_got), free(pos);
}

/* Decode (T = 1) on the tensor-core kernel next to the CUDA-core one:
 * G 1, 2, 4, 8 (the rows of the mma), D 64 and 128 (tiles of 64 and 32
 * keys, 16 and 8 a warp), histories on both sides of the tile, warp and
 * split edges (a split holds up to OG_ATTEND_CUDA_SPLIT_KEYS = 128 keys),
 * flat and ring (W 37 and 100, wrapping), bf16, int8 and fp8 storage,
 * every fifth case packed. */
static void test_decode_edges(og_rng *rng, cudaStream_t stream, bool quick) {
    og_test_section("decode at tile and split edges (CUDA cores and tensor cores)");
    const int64_t Ls[] = {0, 1, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 383, 1023, 1024, 1025};
    const int32_t Gs[] = {1, 2, 4, 8};
    const og_dtype dts[] = {OG_DTYPE_BF16, OG_DTYPE_INT8, OG_DTYPE_FP8};
    int n = 0, combo = 0;
    for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
        for (size_t gi = 0; gi < 4; gi++)
            for (int d = 0; d < 2; d++)
                for (int ring = 0; ring < 2; ring++)
                    for (int di = 0; di < 3; di++) {
                        /* quick (sanitizer runs): histories <= 257, one combination in 5 */
                        if (quick && (combo++ % 5 != 0 || Ls[li] > 257)) continue;
                        const int32_t Hkv = Gs[gi] == 8 ? 1 : 2, D = d ? 128 : 64;
                        const og_dtype dt = dts[di];
                        if (g_quant_only && dt == OG_DTYPE_BF16) continue;
                        /* packed: 16 more bytes a row (bf16: 8 elements) */
                        const int64_t packed = dt == OG_DTYPE_BF16 ? (int64_t)Hkv * D + 8
                                                                   : og_kv_dtype_row_bytes(dt, Hkv, D) + 16;
                        attend_case c = {.policy = ring ? OG_KV_RING : OG_KV_FLAT, .T = 1, .Hkv = Hkv, .G = Gs[gi],
                                         .D = D, .W = ring ? (n % 4 < 2 ? 37 : 100) : 0, .L = Ls[li], .dtype = dt,
                                         .scale = n % 3 == 0 ? 0.0f : 0.07f, .RS = n % 5 == 1 ? packed : 0};
                        run_case(&c, rng, stream);
                        n++;
                    }
    printf("%d decode edge cases\n", n);
}

/* Stored rows holding every quant value (int8 -128..127, every finite e4m3
 * byte; 0x7f / 0xff, NaN, left out) over two kv heads with scales of
 * different sizes, decoded by the kernel and by the reference: a byte
 * decoded wrongly moves an output far past the split-K tolerance (4 keys,
 * each weighing ~1/4). Storage after the step compared byte for byte. */
static void test_every_quant_value(og_rng *rng, cudaStream_t stream) {
    enum { HQ = 4, HKV = 2, D = 128, L = 3, R = 8 };
    const og_dtype dts[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
    for (int di = 0; di < 2; di++) {
        const og_dtype dt = dts[di];
        char name[64];
        snprintf(name, sizeof name, "every %s value in stored rows", og_dtype_name(dt));
        og_test_section(name);
        const size_t RB = (size_t)og_kv_dtype_row_bytes(dt, HKV, D), sb = R * RB;
        unsigned char *k = calloc(sb, 1), *v = calloc(sb, 1), *kg = malloc(sb), *vg = malloc(sb);
        og_test_fill_every_quant(dt, k, v, L, HKV, D, (int64_t)RB);
        float q[HQ * D], kn[HKV * D], vn[HKV * D], want[HQ * D], got[HQ * D];
        og_rng_fill(rng, q, HQ * D, -1, 1);
        og_rng_fill(rng, kn, HKV * D, -1, 1);
        og_rng_fill(rng, vn, HKV * D, -1, 1);
        void *dkc = dev_copy(k, sb), *dvc = dev_copy(v, sb);
        void *dq = dev_copy(q, sizeof q), *dk = dev_copy(kn, sizeof kn), *dv = dev_copy(vn, sizeof vn);
        og_poison(got, HQ * D);
        void *dout = dev_copy(got, sizeof got);
        float *partials = NULL;
        const size_t scratch = (size_t)og_attend_cuda_scratch_floats(HQ, D) * 4;
        CK(cudaMalloc((void **)&partials, scratch));
        fill_dev(partials, 0, scratch);
        og_kv_layer_view view = {.policy = OG_KV_FLAT, .dtype = dt, .n_kv_heads = HKV, .head_dim = D, .rows = R,
                                 .length = L, .k = k, .v = v};
        og_attend_args ra = {.q = q, .k = kn, .v = vn, .out = want, .T = 1, .n_heads = HQ, .kv = view};
        CHECK_OK(og_update_and_attend_ref(&ra)); /* writes k, v too */
        og_attend_cuda_args ga = {.q = dq, .k = dk, .v = dv, .out = dout, .T = 1, .n_heads = HQ, .kv = view,
                                  .partials = partials};
        ga.kv.k = dkc, ga.kv.v = dvc;
        /* the CUDA-core kernel, then the tensor-core one (kQmmaAtol) and the one through bf16 tiles
         * (kMmaAtol), whose bounds scale with max |v|: 2 here */
        const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
        const og_attend_cuda_quant_decode qprev = og_attend_cuda_get_quant_decode();
        for (int kind = 0; kind < 3; kind++) {
            og_attend_cuda_set_decode(kind ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
            og_attend_cuda_set_quant_decode(kind == 2 ? OG_ATTEND_CUDA_QUANT_WIDEN : OG_ATTEND_CUDA_QUANT_MMA);
            CHECK_OK(og_update_and_attend_cuda(stream, &ga)); /* a second step rewrites the same row */
            CK(cudaStreamSynchronize(stream));
            from_dev(got, dout, sizeof got);
            from_dev(kg, dkc, sb);
            from_dev(vg, dvc, sb);
            size_t worst = 0;
            const double atol = kind == 2 ? 2 * kMmaAtol : kind == 1 ? 2 * kQmmaAtol : 5e-5;
            const double r = og_tol_ratio(got, want, HQ * D, atol, 5e-4, &worst);
            CHECK_MSG(r <= 1.0, "%s%s: element %zu got %.9g want %.9g (ratio %.3g)", name,
                      kind == 2 ? " (tensor cores, widened tiles)" : kind ? " (tensor cores)" : "", worst,
                      (double)got[worst], (double)want[worst], r);
            CHECK_MSG(!memcmp(kg, k, sb) && !memcmp(vg, v, sb), "%s: storage differs from the reference's", name);
        }
        og_attend_cuda_set_decode(prev);
        og_attend_cuda_set_quant_decode(qprev);
        cudaFree(dkc), cudaFree(dvc), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(partials);
        free(k), free(v), free(kg), free(vg);
    }
}

/* Malformed arguments are refused before anything is enqueued. */
static void test_refusals(void) {
    og_test_section("refusals");
    float *buf = NULL;
    CK(cudaMalloc((void **)&buf, 1 << 20));
    og_attend_cuda_args a = {.q = buf, .k = buf, .v = buf, .out = buf, .T = 1, .n_heads = 4, .partials = buf,
                             .kv = {.policy = OG_KV_FLAT, .dtype = OG_DTYPE_BF16, .n_kv_heads = 2, .head_dim = 64,
                                    .rows = 8, .length = 0, .k = buf, .v = buf}};
    CHECK_OK(og_update_and_attend_cuda(NULL, &a));
    og_attend_cuda_args b = a;
    b.kv.head_dim = 96;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNSUPPORTED);
    b = a, b.n_heads = 3;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a, b.kv.length = 8;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_CAPACITY);
    b = a, b.kv.k = NULL;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNBOUND);
    b = a, b.kv.policy = OG_KV_RING, b.kv.window = 6, b.T = 4; /* R 8: at most 3 per step */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_WRITE_TOO_WIDE);
    b = a, b.kv.row_stride = 64; /* below Hkv * D = 128 */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a, b.kv.row_stride = 132; /* 264 bytes: not a multiple of 16 */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b = a, b.kv.row_stride = 136;
    CHECK_OK(og_update_and_attend_cuda(NULL, &b));
    /* int8 / fp8: rows of 2 x (64 + 4) = 136 bytes padded to 144; heads of
     * fewer than 16 quants are refused */
    b = a, b.kv.dtype = OG_DTYPE_INT8;
    CHECK_OK(og_update_and_attend_cuda(NULL, &b));
    b.kv.row_stride = 136; /* without the padding */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_INVALID_ARGUMENT);
    b.kv.row_stride = 160;
    CHECK_OK(og_update_and_attend_cuda(NULL, &b));
    b = a, b.kv.dtype = OG_DTYPE_FP8, b.kv.head_dim = 8;
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNSUPPORTED);
    b = a, b.kv.dtype = OG_DTYPE_Q8; /* a weight format, not a KV one */
    CHECK_STATUS(og_update_and_attend_cuda(NULL, &b), OG_ERR_UNSUPPORTED);
    /* the batched call checks what the host holds (never the table) */
    fill_dev(buf, 0, 1 << 20); /* a table of padded entries (T = 0), zero counters */
    og_attend_batch_cuda_args ba = {.q = buf, .k = buf, .v = buf, .out = buf, .B = 2, .n_heads = 4, .n_kv_heads = 2,
                                    .head_dim = 64, .kv_dtype = OG_DTYPE_BF16, .policy = OG_KV_FLAT,
                                    .seqs = (const og_attend_cuda_seq *)buf, .max_keys = 100, .partials = buf};
    CHECK_OK(og_update_and_attend_batch_cuda(NULL, &ba));
    og_attend_batch_cuda_args bb = ba;
    bb.head_dim = 96;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_UNSUPPORTED);
    bb = ba, bb.n_heads = 3;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.B = 0;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.seqs = NULL;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.max_keys = 0;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.kv_dtype = OG_DTYPE_I32;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_UNSUPPORTED);
    bb = ba, bb.kv_dtype = OG_DTYPE_FP8;
    CHECK_OK(og_update_and_attend_batch_cuda(NULL, &bb));
    bb.head_dim = 8;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_UNSUPPORTED);
    bb = ba, bb.policy = (og_kv_policy)7;
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.partials = NULL, bb.max_keys = 100000; /* several splits need the scratch */
    CHECK_STATUS(og_update_and_attend_batch_cuda(NULL, &bb), OG_ERR_INVALID_ARGUMENT);
    bb = ba, bb.partials = NULL, bb.max_keys = 1; /* one split does not */
    CHECK_OK(og_update_and_attend_batch_cuda(NULL, &bb));
    CK(cudaDeviceSynchronize());
    /* an entry the planner would have refused (flat, L == rows) cannot be
     * refused from a graph: no storage write, NaN out */
    {
        unsigned char *store = (unsigned char *)buf + 65536, *tab_d = (unsigned char *)buf + 4096;
        float *out = buf + 4096; /* 16 KB in, past the table */
        const og_attend_cuda_seq e[2] = {{.k = store, .v = store + 8192, .length = 8, .rows = 8, .T = 1},
                                         {.k = store, .v = store + 8192, .length = 3, .rows = 8, .T = 0}};
        to_dev(tab_d, e, sizeof e);
        bb = ba, bb.seqs = (const og_attend_cuda_seq *)tab_d, bb.out = out;
        CHECK_OK(og_update_and_attend_batch_cuda(NULL, &bb));
        float got[2 * 4 * 64];
        unsigned char st[16384];
        from_dev(got, out, sizeof got);
        from_dev(st, store, sizeof st);
        bool nan_row = true, zero_rest = true, untouched = true;
        for (int i = 0; i < 4 * 64; i++) nan_row = nan_row && isnan(got[i]);
        for (int i = 4 * 64; i < 8 * 64; i++) zero_rest = zero_rest && got[i] == 0.0f;
        for (size_t i = 0; i < sizeof st; i++) untouched = untouched && st[i] == 0;
        CHECK_MSG(nan_row && zero_rest && untouched, "bad entry: NaN row %d, padded row kept %d, storage kept %d",
                  nan_row, zero_rest, untouched);
    }
    cudaFree(buf);
}

/* The split count follows the live length, not the capacity, and fills
 * about one wave of blocks (4 per SM) at long histories. */
static void test_splits(void) {
    og_test_section("split count");
    const int64_t K = OG_ATTEND_CUDA_SPLIT_KEYS;
    CHECK(og_attend_cuda_splits(1, 1, 32, 8, 132) == 1);
    CHECK(og_attend_cuda_splits(K, 1, 32, 8, 132) == 1);
    CHECK(og_attend_cuda_splits(K + 1, 1, 32, 8, 132) == 2);
    CHECK(og_attend_cuda_splits(16 * K, 1, 32, 8, 132) == 16);
    /* 8 kv heads x 66 splits = 528 blocks = 4 x 132; 65 would leave a gap */
    CHECK(og_attend_cuda_max_splits(1, 32, 8, 132) == 66);
    CHECK(og_attend_cuda_splits(131072, 1, 32, 8, 132) == 66);
    /* G 12 is served in two head chunks: 2 blocks per split */
    CHECK(og_attend_cuda_max_splits(1, 12, 1, 10) == 20);
    CHECK(og_attend_cuda_max_splits(1, 64, 64, 132) == 9);
    CHECK(og_attend_cuda_max_splits(1, 1, 1, 1000) == OG_ATTEND_CUDA_MAX_SPLITS);
    CHECK(og_attend_cuda_max_splits(129, 1, 1, 132) == 1);
    for (int32_t T = 1; T < 300; T += 3) {
        const int32_t s = og_attend_cuda_max_splits(T, 4, 2, 132);
        CHECK_MSG(s >= 1 && (s == 1 || s * T <= OG_ATTEND_CUDA_SPLIT_ROWS), "T=%d: %d splits past the scratch", T, s);
    }
    CHECK(og_attend_cuda_tiled(2, OG_DTYPE_BF16, 128) && og_attend_cuda_tiled(129, OG_DTYPE_BF16, 16));
    CHECK(!og_attend_cuda_tiled(1, OG_DTYPE_BF16, 128) && !og_attend_cuda_tiled(3, OG_DTYPE_F32, 64) &&
          !og_attend_cuda_tiled(3, OG_DTYPE_BF16, 8) && !og_attend_cuda_tiled(3, OG_DTYPE_BF16, 256));
    int32_t prev = 1;
    for (int64_t n = 1; n < 20000; n += 7) {
        int32_t s = og_attend_cuda_splits(n, 3, 8, 2, 132);
        int64_t chunk = (n + s - 1) / s;
        CHECK_MSG(s >= 1 && (s - 1) * chunk < n, "n=%lld: %d splits leave one empty", (long long)n, s);
        CHECK_MSG(s >= prev && (s - 1) * K < n, "n=%lld: %d splits after %d", (long long)n, s, prev);
        prev = s;
    }
}

/* ---- the batched decode kernel (og_update_and_attend_batch_cuda) ---- */

/* One batched call: B entries of one layer geometry; L[b] < 0 marks a
 * padded entry (T = 0). */
typedef struct batch_case {
    int32_t B, Hkv, G, D, W; /* W: ring window (policy ring), else 0 */
    og_kv_policy policy;
    og_dtype dtype;
    bool packed; /* k and v rows of an entry inside one block of wider rows, other bytes between */
    float scale;
    const int64_t *L; /* [B] */
} batch_case;

/* Device buffers a call (or a captured graph) uses, sized for Bmax entries. */
typedef struct batch_bufs {
    float *q, *k, *v, *out;   /* [Bmax, H*, D] */
    og_attend_cuda_seq *seqs; /* [Bmax] */
    float *partials;
} batch_bufs;

static void batch_bufs_make(batch_bufs *b, int32_t Bmax, int32_t Hq, int32_t Hkv, int32_t D, int64_t max_keys) {
    CK(cudaMalloc((void **)&b->q, (size_t)Bmax * Hq * D * 4));
    CK(cudaMalloc((void **)&b->out, (size_t)Bmax * Hq * D * 4));
    CK(cudaMalloc((void **)&b->k, (size_t)Bmax * Hkv * D * 4));
    CK(cudaMalloc((void **)&b->v, (size_t)Bmax * Hkv * D * 4));
    CK(cudaMalloc((void **)&b->seqs, (size_t)Bmax * sizeof *b->seqs));
    const size_t sb = (size_t)og_attend_batch_cuda_scratch_floats(Bmax, Hq, D, max_keys) * 4;
    CK(cudaMalloc((void **)&b->partials, sb));
    fill_dev(b->partials, 0, sb); /* the split counters start at 0 */
}

static void batch_bufs_free(batch_bufs *b) {
    cudaFree(b->q), cudaFree(b->out), cudaFree(b->k), cudaFree(b->v), cudaFree(b->seqs), cudaFree(b->partials);
}

static og_attend_batch_cuda_args batch_args(const batch_case *c, const batch_bufs *b, int64_t max_keys) {
    og_attend_batch_cuda_args a = {.q = b->q, .k = b->k, .v = b->v, .out = b->out, .B = c->B,
                                   .n_heads = c->Hkv * c->G, .n_kv_heads = c->Hkv, .head_dim = c->D,
                                   .kv_dtype = c->dtype, .policy = c->policy, .scale = c->scale, .seqs = b->seqs,
                                   .max_keys = max_keys, .partials = b->partials};
    return a;
}

/* Makes fresh inputs and storage for c, runs the reference per entry on host
 * copies, then runs the kernel `passes` times (through graph when it is not
 * NULL, captured over bufs with c's geometry) and checks every live output
 * row, every padded output row (still poison), and every storage block byte
 * for byte (the rows written, and untouched bytes elsewhere: rows not
 * written, other layers' bytes between packed rows, padded entries' storage). */
static void run_batch(const batch_case *c, og_rng *rng, cudaStream_t stream, const batch_bufs *bufs,
                      int64_t max_keys, cudaGraphExec_t graph, int passes) {
    const int32_t B = c->B, Hkv = c->Hkv, Hq = c->Hkv * c->G, D = c->D;
    /* the kernel the call (or the graph, captured under the same choice) runs */
    const bool mma = og_attend_cuda_get_decode() == OG_ATTEND_CUDA_MMA && og_attend_cuda_decode_mma(c->dtype, D);
    const bool qmma = mma && og_kv_dtype_quantized(c->dtype) &&
                      og_attend_cuda_get_quant_decode() == OG_ATTEND_CUDA_QUANT_MMA;
    const double atol = qmma ? kQmmaAtol : mma ? kMmaAtol : 5e-5;
    /* a row's own elements: Hkv x D, or int8 / fp8 bytes (quants, scales, padding) */
    const size_t es = og_dtype_size(c->dtype), row = (size_t)og_kv_dtype_row_bytes(c->dtype, Hkv, D) / es;
    /* packed: row = [16 bytes of another layer | k | v | 16 more]: 16-byte multiples (8 elements of bf16,
     * f32 rows of 8 elements on each side) */
    const size_t gap = c->dtype == OG_DTYPE_F32 ? 8 : 16 / es;
    const size_t RS = c->packed ? 2 * row + 2 * gap : row;
    const size_t qn = (size_t)B * Hq * D, kn = (size_t)B * Hkv * D;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *ref = malloc(qn * 4), *got = malloc(qn * 4);
    og_rng_fill(rng, q, qn, -1, 1);
    og_rng_fill(rng, k, kn, -1, 1);
    og_rng_fill(rng, v, kn, -1, 1);
    og_poison(ref, qn); /* padded rows must keep the poison */
    og_attend_cuda_seq *tab = calloc((size_t)B, sizeof *tab);
    unsigned char **host = calloc((size_t)B * 2, sizeof *host), **dev = calloc((size_t)B * 2, sizeof *dev);
    size_t *bytes = calloc((size_t)B, sizeof *bytes);
    const int n_blocks = c->packed ? 1 : 2;
    for (int32_t b = 0; b < B; b++) {
        const bool pad = c->L[b] < 0;
        const int64_t L = pad ? 5 : c->L[b];
        /* flat: a few rows past L; ring: R = W + 2 (max_write 3), wrapping once L >= R */
        const int64_t R = c->policy == OG_KV_FLAT ? L + 1 + (b % 4) : (int64_t)c->W + 2;
        bytes[b] = (size_t)R * RS * es;
        const size_t ko = c->packed ? gap * es : 0, vo = c->packed ? (gap + row) * es : 0;
        for (int i = 0; i < n_blocks; i++) {
            host[2 * b + i] = malloc(bytes[b]);
            /* every element random (a wrong read or write shows), quantized rows valid */
            fill_random(host[2 * b + i], c->dtype, (size_t)R * RS, rng);
            if (i == 0) fill_rows(host[2 * b], c->dtype, R, RS * es, ko, Hkv, D, rng);
            if (i == n_blocks - 1) fill_rows(host[2 * b + i], c->dtype, R, RS * es, vo, Hkv, D, rng);
            dev[2 * b + i] = dev_copy(host[2 * b + i], bytes[b]);
        }
        unsigned char *hk = host[2 * b] + ko, *hv = host[2 * b + n_blocks - 1] + vo;
        tab[b] = (og_attend_cuda_seq){.k = dev[2 * b] + ko, .v = dev[2 * b + n_blocks - 1] + vo,
                                      .row_stride = c->packed ? (int64_t)RS : (b % 2 ? 0 : (int64_t)row),
                                      .length = L, .rows = R, .window = c->policy == OG_KV_RING ? c->W : 0,
                                      .T = pad ? 0 : 1};
        if (pad) continue;
        og_kv_layer_view view = {.policy = c->policy, .dtype = c->dtype, .window = tab[b].window, .n_kv_heads = Hkv,
                                 .head_dim = D, .rows = R, .length = L, .k = hk, .v = hv,
                                 .row_stride = (int64_t)RS};
        og_attend_args ra = {.q = q + (size_t)b * Hq * D, .k = k + (size_t)b * Hkv * D, .v = v + (size_t)b * Hkv * D,
                             .out = ref + (size_t)b * Hq * D, .T = 1, .n_heads = Hq, .scale = c->scale, .kv = view};
        CHECK_OK(og_update_and_attend_ref(&ra)); /* writes the host storage too */
    }
    to_dev(bufs->q, q, qn * 4);
    to_dev(bufs->k, k, kn * 4);
    to_dev(bufs->v, v, kn * 4);
    to_dev(bufs->seqs, tab, (size_t)B * sizeof *tab);
    for (int pass = 0; pass < passes; pass++) { /* a second pass finds the counters the first left at 0 */
        og_poison(got, qn);
        to_dev(bufs->out, got, qn * 4);
        if (graph) {
            CK(cudaGraphLaunch(graph, stream));
        } else {
            const og_attend_batch_cuda_args a = batch_args(c, bufs, max_keys);
            CHECK_OK(og_update_and_attend_batch_cuda(stream, &a));
        }
        CK(cudaStreamSynchronize(stream));
        from_dev(got, bufs->out, qn * 4);
        int bad = 0;
        for (int32_t b = 0; b < B && bad < 3; b++) {
            const size_t o = (size_t)b * Hq * D, n = (size_t)Hq * D;
            if (c->L[b] < 0) {
                const bool same = memcmp(got + o, ref + o, n * 4) == 0;
                bad += !same;
                CHECK_MSG(same, "B=%d: padded entry %d: out row written", B, b);
                continue;
            }
            size_t worst = 0;
            const double r = og_tol_ratio(got + o, ref + o, n, atol, 5e-4, &worst);
            bad += r > 1.0;
            CHECK_MSG(r <= 1.0,
                      "batch%s%s %s %s %s B=%d entry %d L=%lld Hq=%d Hkv=%d D=%d W=%d max_keys=%lld: ratio %.3g at "
                      "%zu (got %g%s, want %g)",
                      graph ? " (graph)" : "", qmma ? " (tensor cores, quants in registers)" : mma ? " (tensor cores)" : "",
                      c->policy == OG_KV_FLAT ? "flat" : "ring", og_dtype_name(c->dtype),
                      c->packed ? "packed" : "dense", B, b, (long long)c->L[b], Hq, Hkv, D, c->W,
                      (long long)max_keys, r, worst, (double)got[o + worst], nan_kind(got[o + worst]),
                      (double)ref[o + worst]);
        }
        for (int32_t b = 0; b < B; b++)
            for (int i = 0; i < n_blocks; i++) {
                unsigned char *back = malloc(bytes[b]);
                from_dev(back, dev[2 * b + i], bytes[b]);
                CHECK_MSG(memcmp(back, host[2 * b + i], bytes[b]) == 0,
                          "batch %s %s B=%d entry %d (L=%lld): storage block %d differs", og_dtype_name(c->dtype),
                          c->packed ? "packed" : "dense", B, b, (long long)c->L[b], i);
                free(back);
            }
    }
    for (int32_t b = 0; b < 2 * B; b++) {
        free(host[b]);
        if (dev[b]) cudaFree(dev[b]);
    }
    free(q), free(k), free(v), free(ref), free(got), free(tab), free(host), free(dev), free(bytes);
}

static const int64_t kBatchLs[] = {0, 1, 3, 127, 128, 129, 1000, 4097};

/* Mixed lengths (one of kBatchLs per entry, a rotation per call), some
 * entries padded; flat and ring (W 4 and 64: the ring wraps); bf16 and f32
 * (quant: int8 and fp8); dense and packed rows; B 1, 2, 3, 17, 64. */
static void test_batch(og_rng *rng, cudaStream_t stream, bool quick, bool quant) {
    og_test_section(quant ? "batched decode vs reference, int8 and fp8" : "batched decode vs reference");
    const int32_t Bs[] = {1, 2, 3, 17, 64};
    const int32_t heads[][2] = {{16, 8}, {4, 1}, {6, 3}, {16, 2}}; /* Hq, Hkv (G 2, 4, 2, 8) */
    const int32_t Ds[] = {64, 128};
    int n = 0;
    for (size_t bi = 0; bi < sizeof Bs / sizeof *Bs; bi++)
        for (int ring = 0; ring < 2; ring++)
            for (size_t hi = 0; hi < 4; hi++)
                for (size_t di = 0; di < 2; di++) {
                    const int32_t B = Bs[bi];
                    if (quick && (B == 64 || di == 1 || (B == 17 && hi != 0))) continue;
                    int64_t *L = malloc((size_t)B * sizeof *L), maxL = 0;
                    for (int32_t b = 0; b < B; b++) {
                        L[b] = kBatchLs[(b + n) % 8];
                        if (quick && L[b] > 257) L[b] = L[b] % 257;
                        if (B > 1 && (b * 7 + n) % 5 == 4) L[b] = -1; /* padded */
                        if (L[b] > maxL) maxL = L[b];
                    }
                    const batch_case c = {.B = B, .Hkv = heads[hi][1], .G = heads[hi][0] / heads[hi][1], .D = Ds[di],
                                          .W = ring ? (n % 2 ? 64 : 4) : 0,
                                          .policy = ring ? OG_KV_RING : OG_KV_FLAT,
                                          .dtype = quant ? ((n / 2) % 2 ? OG_DTYPE_FP8 : OG_DTYPE_INT8)
                                                         : ((n / 2) % 2 ? OG_DTYPE_F32 : OG_DTYPE_BF16),
                                          .packed = (n / 4) % 2 == 1, .scale = n % 3 == 0 ? 0.0f : 0.07f, .L = L};
                    /* max_keys as the executor gives it (flat: capacity, ring: W), and sometimes 1 (a grid of
                     * one split: longer entries stay exact) */
                    const int64_t max_keys = n % 5 == 2 ? 1 : ring ? c.W : maxL + 4;
                    batch_bufs bufs;
                    batch_bufs_make(&bufs, B, heads[hi][0], heads[hi][1], Ds[di], max_keys);
                    run_batch(&c, rng, stream, &bufs, max_keys, NULL, 2);
                    if (og_attend_cuda_decode_mma(c.dtype, c.D)) { /* and on the tensor cores */
                        const og_attend_cuda_decode prev = og_attend_cuda_set_decode(OG_ATTEND_CUDA_MMA);
                        run_batch(&c, rng, stream, &bufs, max_keys, NULL, 2);
                        if (quant && !quick) { /* int8 / fp8: the variant through bf16 tiles too */
                            const og_attend_cuda_quant_decode qp =
                                og_attend_cuda_set_quant_decode(OG_ATTEND_CUDA_QUANT_WIDEN);
                            run_batch(&c, rng, stream, &bufs, max_keys, NULL, 1);
                            og_attend_cuda_set_quant_decode(qp);
                        }
                        og_attend_cuda_set_decode(prev);
                    }
                    batch_bufs_free(&bufs);
                    free(L);
                    n++;
                }
    printf("%d batched cases\n", n);
}

/* One graph captured over a table at a fixed address, replayed after the
 * host rewrote the table (lengths, padding and storage bases change: fresh
 * storage every round) and the step's inputs. Variants: bf16 flat and f32
 * ring on the CUDA cores, bf16 flat on the tensor cores, and int8 flat
 * (4 heads a block or fewer) and fp8 ring (8 heads a block, packed) on the
 * tensor cores with the call captured twice in a row: the second launch may
 * start before the first ends (programmatic dependent launch) and must
 * still give the same outputs and storage. */
static void test_batch_graph(og_rng *rng, cudaStream_t stream, bool quick) {
    og_test_section("batched decode replayed in a graph");
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    const og_attend_cuda_quant_decode qprev = og_attend_cuda_set_quant_decode(OG_ATTEND_CUDA_QUANT_MMA);
    for (int variant = g_quant_only ? 3 : 0; variant < 5; variant++) {
        og_attend_cuda_set_decode(variant >= 2 ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
        const bool ring = variant == 1 || variant == 4;
        const int32_t B = quick ? 5 : 17;
        int64_t *L = malloc((size_t)B * sizeof *L);
        batch_case c = {.B = B, .Hkv = variant == 4 ? 1 : ring ? 3 : 8, .G = variant == 4 ? 8 : 2,
                        .D = ring ? 64 : 128, .W = ring ? 64 : 0, .policy = ring ? OG_KV_RING : OG_KV_FLAT,
                        .dtype = variant == 4   ? OG_DTYPE_FP8
                                 : variant == 3 ? OG_DTYPE_INT8
                                 : ring         ? OG_DTYPE_F32
                                                : OG_DTYPE_BF16,
                        .packed = ring, .scale = 0.0f, .L = L};
        const int64_t max_keys = ring ? 64 : 4200;
        batch_bufs bufs;
        batch_bufs_make(&bufs, B, c.Hkv * c.G, c.Hkv, c.D, max_keys);
        cudaGraph_t g;
        cudaGraphExec_t ge;
        const og_attend_batch_cuda_args a = batch_args(&c, &bufs, max_keys);
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        CHECK_OK(og_update_and_attend_batch_cuda(stream, &a));
        if (variant >= 3) CHECK_OK(og_update_and_attend_batch_cuda(stream, &a));
        CK(cudaStreamEndCapture(stream, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int round = 0; round < 3; round++) {
            for (int32_t b = 0; b < B; b++) {
                L[b] = kBatchLs[(b * 3 + round * 5) % 8];
                if (quick && L[b] > 257) L[b] = L[b] % 257;
                if ((b + round) % 4 == 3) L[b] = -1;
            }
            run_batch(&c, rng, stream, &bufs, max_keys, ge, 2);
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        batch_bufs_free(&bufs);
        free(L);
    }
    og_attend_cuda_set_decode(prev);
    og_attend_cuda_set_quant_decode(qprev);
}

/* The grid's depth follows B, the heads and max_keys; the scratch bound
 * holds it for every Hkv and device size. */
static void test_batch_splits(void) {
    og_test_section("batched split count");
    CHECK(og_attend_batch_cuda_max_splits(1, 16, 8, 4097, 132) == 33);
    CHECK(og_attend_batch_cuda_max_splits(1, 16, 8, 1 << 20, 132) == 66); /* as the single-session decode */
    CHECK(og_attend_batch_cuda_max_splits(64, 16, 8, 4097, 132) == 2);
    CHECK(og_attend_batch_cuda_max_splits(256, 16, 8, 4097, 132) == 1);
    CHECK(og_attend_batch_cuda_max_splits(3, 16, 8, 64, 132) == 1);
    for (int32_t B = 1; B <= 300; B += 7)
        for (int32_t hkv = 1; hkv <= 16; hkv *= 2)
            for (int64_t mk = 1; mk < 100000; mk = mk * 3 + 1) {
                const int32_t S = og_attend_batch_cuda_max_splits(B, 16, hkv, mk, 200);
                const int64_t need = (((int64_t)B * 16 + 3) / 4 * 4) + (int64_t)B * S * 16 * (128 + 2);
                CHECK_MSG(S >= 1 && S <= OG_ATTEND_CUDA_MAX_SPLITS &&
                              og_attend_batch_cuda_scratch_floats(B, 16, 128, mk) >= need,
                          "B=%d Hkv=%d max_keys=%lld: depth %d past the scratch", B, hkv, (long long)mk, S);
            }
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    test_splits();
    test_batch_splits();
    test_refusals();
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    g_stream = stream;
    og_rng rng = og_rng_seed(20251202);
    /* OG_CUDA_TEST_QUICK: the sizes a sanitizer run can afford */
    const bool quick = getenv("OG_CUDA_TEST_QUICK") != NULL;
    g_quick = quick;
    g_quant_only = getenv("OG_ATTEND_CUDA_TEST_QUANT_ONLY") != NULL;
    test_every_quant_value(&rng, stream);
    test_decode_edges(&rng, stream, quick);
    if (!g_quant_only) test_batch(&rng, stream, quick, false);
    test_batch(&rng, stream, quick, true);
    test_batch_graph(&rng, stream, quick);
    /* OG_ATTEND_CUDA_TEST_BATCH_ONLY: the batched kernel alone (a sanitizer run over it) */
    if (getenv("OG_ATTEND_CUDA_TEST_BATCH_ONLY")) {
        CK(cudaStreamDestroy(stream));
        return og_test_finish();
    }
    const int32_t Ts[] = {1, 3, 17, 129};
    const int64_t Ls[] = {0, 1, 255, 257, 4097};
    const int32_t Gs[] = {1, 2, 3, 4, 8, 12};
    const int32_t Ds[] = {64, 128, 8};
    int n = 0;
    og_test_section("kernel vs reference");
    for (size_t ti = 0; ti < (g_quant_only ? 0 : sizeof Ts / sizeof *Ts); ti++)
        for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++)
                for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++) {
                    /* T = 129 over 4097 keys: G 1 and 4 only, which keeps the reference in seconds */
                    if (Ts[ti] == 129 && Ls[li] > 257 && (Ls[li] != 4097 || (Gs[gi] != 1 && Gs[gi] != 4) || Ds[di] == 8))
                        continue;
                    if (quick && (Ts[ti] > 17 || Ls[li] > 257)) continue;
                    if (Ds[di] == 8 && Gs[gi] == 12) continue;
                    for (int variant = 0; variant < 2; variant++) {
                        attend_case c = {
                            .policy = variant ? OG_KV_RING : OG_KV_FLAT,
                            .T = Ts[ti], .Hkv = Gs[gi] >= 8 ? 1 : 2, .G = Gs[gi], .D = Ds[di],
                            /* windows of 37 / 100 keys, and 1000 over 4097 (several splits) */
                            .W = variant ? (int32_t)(Ls[li] > 1000 ? 1000 : li % 2 ? 100 : 37) : 0, .L = Ls[li],
                            /* prefill mostly bf16 (the tiled kernel), decode alternating */
                            .dtype = (Ts[ti] > 1 ? (n / 2) % 4 == 3 : (n / 2) % 2) ? OG_DTYPE_F32 : OG_DTYPE_BF16,
                            .scale = n % 3 == 0 ? 0.0f : 0.07f,
                            /* every fourth case packed: 16 more elements per row (other layers') */
                            .RS = n % 4 == 1 ? (int64_t)(Gs[gi] >= 8 ? 1 : 2) * Ds[di] + 16 : 0,
                        };
                        run_case(&c, &rng, stream);
                        n++;
                    }
                }
    printf("%d cases\n", n);

    /* int8 and fp8 storage: the split-K kernel for every T; D 16 (one 16-byte
     * piece a row of a head, 512-key tiles) to 256; T = 129 only over short
     * histories, which keeps the reference in seconds */
    og_test_section("kernel vs reference, int8 and fp8 storage");
    const int32_t QDs[] = {64, 128, 16, 256};
    const int32_t QGs[] = {1, 4, 8, 12};
    int nq = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
            for (size_t gi = 0; gi < sizeof QGs / sizeof *QGs; gi++)
                for (size_t di = 0; di < sizeof QDs / sizeof *QDs; di++) {
                    if (Ts[ti] == 129 && Ls[li] > 257) continue;
                    if (Ts[ti] == 17 && Ls[li] == 4097 && QGs[gi] > 4) continue;
                    if (QDs[di] == 16 || QDs[di] == 256) { /* the tile edges: a few cases each */
                        if ((ti + li + gi) % 3 != 0) continue;
                    }
                    if (quick && (Ts[ti] > 17 || Ls[li] > 257)) continue;
                    for (int variant = 0; variant < 2; variant++) {
                        const int32_t Hkv = QGs[gi] >= 8 ? 1 : 2;
                        const og_dtype dt = nq % 2 ? OG_DTYPE_FP8 : OG_DTYPE_INT8;
                        attend_case c = {
                            .policy = variant ? OG_KV_RING : OG_KV_FLAT,
                            .T = Ts[ti], .Hkv = Hkv, .G = QGs[gi], .D = QDs[di],
                            .W = variant ? (int32_t)(Ls[li] > 1000 ? 1000 : li % 2 ? 100 : 37) : 0, .L = Ls[li],
                            .dtype = dt, .scale = nq % 3 == 0 ? 0.0f : 0.07f,
                            /* every fourth case packed: 16 more bytes per row */
                            .RS = nq % 4 == 1 ? og_kv_dtype_row_bytes(dt, Hkv, QDs[di]) + 16 : 0,
                        };
                        run_case(&c, &rng, stream);
                        nq++;
                    }
                }
    printf("%d int8 / fp8 cases\n", nq);
    CK(cudaStreamDestroy(stream));
    return og_test_finish();
}
#endif
