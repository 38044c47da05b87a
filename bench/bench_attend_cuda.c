/* Decode attention on CUDA: the split-K kernel on the CUDA cores
 * ("offgraph") and on the tensor cores ("offgraph_mma": over bf16 storage
 * mma_attend_kernel, over int8 / fp8 qmma_attend_kernel) side by side in one
 * run, og_attend_cuda_set_decode / og_attend_cuda_set_quant_decode choosing.
 * Part 1, one session, Hq = 32, Hkv = 8, D = 128, bf16, int8 and fp8
 * storage (int8 / fp8 rows: 1024 quant bytes and 8 f32 scales), histories
 * 1 / 128 / 512 / 4k / 32k / 128k. Times og_update_and_attend_cuda (one
 * token: one split-K launch that writes the KV row and merges its splits)
 * with CUDA events around BATCH back-to-back calls (as a decode step issues
 * them, so launch gaps overlap as in a graph), median of 200 batches after a
 * warm-up, rotating over enough layers' storage that the KV bytes of a round
 * exceed the 60 MB L2. Beside each: the batched launch over a table of that
 * one session (what a decode step of the executor runs), the same with a
 * grid of one split (max_keys 1: no partials, no merge; histories up to 4k),
 * for int8 / fp8 the tensor-core variant that widens tiles to bf16 in shared
 * memory, and once the batched launch over a padded entry (every block
 * leaves at once: the floor of a launch in this timing). Reports
 * microseconds, KV bytes read per second, that rate as a fraction of a
 * device-to-device copy measured in the same run (bytes read plus written),
 * and bf16's tensor-core time over each row's. Prints one JSON line per row
 * and whether programmatic dependent launch was allowed (OG_CUDA_PDL=0 turns
 * it off: run twice to see what it gives).
 * Part 2, the batched decode kernel (og_update_and_attend_batch_cuda) at the
 * Qwen3-0.6B attention shape (Hq 16, Hkv 8, D 128, bf16): B = 1, 64, 256
 * sessions at context 512 and 4096 (every session at that length), and B = 64
 * at mixed lengths (1..4096, uneven); int8 at B = 1, 64, 256 and fp8 at B =
 * 1, 64, context 4096; at B = 1 the single-session call on the
 * same storage beside it. Each session has its own storage; the sessions of
 * a step are rotated over enough copies that a round reads more than L2
 * holds. Same timing (events around back-to-back calls, median of 100 after
 * a warm-up), GB/s of KV bytes read (every live key and value row once).
 * Then B = 64 and 256 at context 512 over rows packed as the KV manager
 * packs a session's flat layers (position p's k and v of 28 layers, the
 * 0.6B shape's, side by side; and 36, the 8B's, at B = 64): what a decode
 * step of the executor reads. BENCH_ATTEND_BATCHES_ONLY=1 runs part 2 alone.
 * Built in every configuration; without CUDA it says so and exits 77. */
#include "core/core.h"

#include <stdio.h>

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "core/kv_quant.h"
#include "kernels/cuda/ops_cuda.h"

#include "cuda_bench.h"
#include <stdlib.h>
#include <string.h>

enum { REPS = 200, BATCH = 16 };

/* Fills n bf16 values with a cheap pattern of small random-looking numbers. */
static void fill_bf16(uint16_t *h, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = og_bf16_from_f32((float)((int64_t)(seed % 2001) - 1000) / 1000.0f);
    }
}

/* Fills rows rows of int8 / fp8 storage (row_bytes each) with 64 distinct
 * rows quantized from the bf16 pattern, repeated. */
static void fill_quant(unsigned char *h, og_dtype dt, size_t rows, size_t row_bytes, int32_t Hkv, int32_t D,
                       uint64_t seed) {
    const size_t n = (size_t)Hkv * D;
    uint16_t *b = malloc(n * 2);
    float *x = malloc(n * 4);
    for (size_t r = 0; r < rows; r++) {
        if (r < 64) {
            fill_bf16(b, n, seed + r);
            for (size_t i = 0; i < n; i++) x[i] = og_f32_from_bf16(b[i]);
            og_kv_quantize_row(dt, x, Hkv, D, h + r * row_bytes);
        } else {
            memcpy(h + r * row_bytes, h + (r % 64) * row_bytes, row_bytes);
        }
    }
    free(b);
    free(x);
}

/* Fills `bytes` of device memory: a bf16 pattern, or int8 / fp8 rows of Hkv
 * heads of D (64 distinct rows, repeated): one piece from the host (8 MB, or
 * 64 rows), then doubled by device copies (which keep the rows whole). */
static void fill_dev(void *d, size_t bytes, og_dtype dt, int32_t Hkv, int32_t D, uint64_t seed) {
    const size_t RB = (size_t)og_kv_dtype_row_bytes(dt, Hkv, D);
    size_t piece = (size_t)8 << 20;
    unsigned char *h = malloc(piece > 64 * RB ? piece : 64 * RB);
    if (dt == OG_DTYPE_BF16) {
        fill_bf16((uint16_t *)h, piece / 2, seed);
    } else {
        piece = 64 * RB;
        fill_quant(h, dt, 64, RB, Hkv, D, seed);
    }
    const size_t first = bytes < piece ? bytes : piece;
    CK(cudaMemcpy(d, h, first, cudaMemcpyHostToDevice));
    free(h);
    for (size_t done = first; done < bytes;) {
        const size_t n = bytes - done < done ? bytes - done : done;
        CK(cudaMemcpy((char *)d + done, d, n, cudaMemcpyDeviceToDevice));
        done += n;
    }
}

typedef struct batch_result {
    og_dtype dt;
    int32_t B;
    const char *lengths;
    double us, gbps, frac, single_us; /* on the CUDA cores */
    double mma_us, mma_single_us;     /* on the tensor cores */
    int32_t depth;
} batch_result;

/* One batched configuration: B sessions, L[b] keys each before the step;
 * packed > 0: each session's rows packed as the KV manager packs them,
 * position p's k and v rows of `packed` layers side by side (the call reads
 * the first layer's), else one dense block of k and one of v a session. */
static batch_result bench_batch(cudaStream_t st, double copy, int sms, og_dtype dt, int32_t B, const int64_t *L,
                                int64_t rows, const char *label, int packed) {
    const int32_t Hq = 16, Hkv = 8, D = 128, HD = Hkv * D;
    const size_t RB = (size_t)og_kv_dtype_row_bytes(dt, Hkv, D); /* bytes of a row */
    size_t kv_bytes = 0; /* what one call must read: every live row of k and v */
    for (int32_t b = 0; b < B; b++) kv_bytes += 2 * (size_t)L[b] * RB;
    const size_t PB = packed > 0 ? 2 * (size_t)packed * RB : RB; /* bytes between a session's rows */
    const size_t layer = (size_t)B * rows * PB; /* bytes of k (or v; packed: both) of one copy, all sessions */
    int n_copies = (int)(256e6 / (double)kv_bytes) + 1;
    if (n_copies < 2) n_copies = 2;
    void **k = calloc((size_t)n_copies, sizeof *k), **v = calloc((size_t)n_copies, sizeof *v);
    og_attend_cuda_seq **tab = calloc((size_t)n_copies, sizeof *tab);
    og_attend_cuda_seq *h = calloc((size_t)B, sizeof *h);
    for (int c = 0; c < n_copies; c++) {
        CK(cudaMalloc(&k[c], layer));
        fill_dev(k[c], layer, dt, Hkv, D, 1234 + (uint64_t)c);
        if (!packed) {
            CK(cudaMalloc(&v[c], layer));
            fill_dev(v[c], layer, dt, Hkv, D, 777 + (uint64_t)c);
        }
        for (int32_t b = 0; b < B; b++) {
            char *kb = (char *)k[c] + (size_t)b * rows * PB;
            h[b] = (og_attend_cuda_seq){.k = kb, .v = packed ? kb + RB : (char *)v[c] + (size_t)b * rows * RB,
                                        .row_stride = packed ? (int64_t)(PB / og_dtype_size(dt)) : 0,
                                        .length = L[b], .rows = rows, .T = 1};
        }
        CK(cudaMalloc((void **)&tab[c], (size_t)B * sizeof *h));
        CK(cudaMemcpy(tab[c], h, (size_t)B * sizeof *h, cudaMemcpyHostToDevice));
    }
    float *q, *kn, *vn, *out, *part;
    CK(cudaMalloc((void **)&q, (size_t)B * Hq * D * 4));
    CK(cudaMalloc((void **)&kn, (size_t)B * HD * 4));
    CK(cudaMalloc((void **)&vn, (size_t)B * HD * 4));
    CK(cudaMalloc((void **)&out, (size_t)B * Hq * D * 4));
    CK(cudaMemset(q, 0, (size_t)B * Hq * D * 4));
    CK(cudaMemset(kn, 0, (size_t)B * HD * 4));
    CK(cudaMemset(vn, 0, (size_t)B * HD * 4));
    size_t sb = (size_t)og_attend_batch_cuda_scratch_floats(B, Hq, D, rows) * 4;
    const size_t s1 = (size_t)og_attend_cuda_scratch_floats(Hq, D) * 4;
    if (s1 > sb) sb = s1;
    CK(cudaMalloc((void **)&part, sb));
    CK(cudaMemset(part, 0, sb));
    og_attend_batch_cuda_args a = {.q = q, .k = kn, .v = vn, .out = out, .B = B, .n_heads = Hq, .n_kv_heads = Hkv,
                                   .head_dim = D, .kv_dtype = dt, .policy = OG_KV_FLAT, .scale = 0,
                                   .max_keys = rows, .partials = part};
    og_attend_cuda_args one = {.q = q, .k = kn, .v = vn, .out = out, .T = 1, .n_heads = Hq, .partials = part,
                               .kv = {.policy = OG_KV_FLAT, .dtype = dt, .n_kv_heads = Hkv, .head_dim = D,
                                      .rows = rows, .length = L[0]}};
    int per = (int)(256e6 / (double)kv_bytes);
    if (per < 1) per = 1;
    if (per > BATCH) per = BATCH;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    enum { BREPS = 100 };
    float ms[BREPS];
    double med[4] = {0, 0, 0, 0}; /* batched, single-session; then both on the tensor cores */
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    const og_attend_cuda_quant_decode qprev = og_attend_cuda_set_quant_decode(OG_ATTEND_CUDA_QUANT_MMA);
    for (int mode = 0; mode < 4; mode++) {
        const int single = mode & 1;
        if (single && B != 1) continue;
        og_attend_cuda_set_decode(mode >= 2 ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
        int next = 0;
        for (int r = -5; r < BREPS; r++) {
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < per; i++, next = (next + 1) % n_copies) {
                og_status s;
                if (single) {
                    one.kv.k = k[next], one.kv.v = v[next];
                    s = og_update_and_attend_cuda(st, &one);
                } else {
                    a.seqs = tab[next];
                    s = og_update_and_attend_batch_cuda(st, &a);
                }
                if (s != OG_OK) {
                    fprintf(stderr, "bench_attend_cuda: %s\n", og_last_error());
                    exit(1);
                }
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) {
                CK(cudaEventElapsedTime(&ms[r], e0, e1));
                ms[r] /= per;
            }
        }
        qsort(ms, BREPS, sizeof *ms, cmp_float);
        med[mode] = ms[BREPS / 2] * 1e-3;
    }
    og_attend_cuda_set_decode(prev);
    og_attend_cuda_set_quant_decode(qprev);
    batch_result res = {.dt = dt, .B = B, .lengths = label, .us = med[0] * 1e6, .gbps = (double)kv_bytes / med[0] / 1e9,
                        .frac = (double)kv_bytes / med[0] / copy, .single_us = med[1] * 1e6, .mma_us = med[2] * 1e6,
                        .mma_single_us = med[3] * 1e6, .depth = og_attend_batch_cuda_max_splits(B, Hq, Hkv, rows, sms)};
    printf("{\"bench\":\"batch_decode_attention\",\"kv\":\"%s\",\"B\":%d,\"lengths\":\"%s\",\"packed_layers\":%d,\"Hq\":%d,\"Hkv\":%d,\"D\":%d,"
           "\"us\":%.2f,\"kv_GBps\":%.1f,\"fraction_of_copy\":%.3f,\"depth\":%d,\"single_us\":%.2f,"
           "\"mma_us\":%.2f,\"mma_fraction_of_copy\":%.3f,\"mma_single_us\":%.2f}\n",
           og_dtype_name(dt), B, label, packed, Hq, Hkv, D, res.us, res.gbps, res.frac, res.depth, res.single_us, res.mma_us,
           (double)kv_bytes / med[2] / copy, res.mma_single_us);
    for (int c = 0; c < n_copies; c++) cudaFree(k[c]), cudaFree(v[c]), cudaFree(tab[c]);
    free(k), free(v), free(tab), free(h);
    cudaFree(q), cudaFree(kn), cudaFree(vn), cudaFree(out), cudaFree(part);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return res;
}

static void bench_batches(cudaStream_t st, double copy, int sms) {
    batch_result r[16];
    int n = 0;
    const int32_t Bs[] = {1, 64, 256};
    const int64_t ctx[] = {512, 4096};
    int64_t *L = malloc(256 * sizeof *L);
    char labels[2][16];
    for (int ci = 0; ci < 2; ci++) {
        snprintf(labels[ci], sizeof labels[ci], "%lld", (long long)ctx[ci]);
        for (int bi = 0; bi < 3; bi++) {
            for (int32_t b = 0; b < Bs[bi]; b++) L[b] = ctx[ci];
            r[n++] = bench_batch(st, copy, sms, OG_DTYPE_BF16, Bs[bi], L, ctx[ci] + 1, labels[ci], 0);
        }
    }
    uint64_t seed = 99;
    for (int32_t b = 0; b < 64; b++) { /* uneven: a few long sessions among short ones */
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        const int64_t x = (int64_t)(seed % 4096) + 1;
        L[b] = x * x / 4096 + 1;
    }
    r[n++] = bench_batch(st, copy, sms, OG_DTYPE_BF16, 64, L, 4097, "mixed 1..4096", 0);
    for (int di = 0; di < 2; di++) /* int8 and fp8 storage, context 4096 */
        for (int bi = 0; bi < (di ? 2 : 3); bi++) {
            for (int32_t b = 0; b < Bs[bi]; b++) L[b] = 4096;
            r[n++] = bench_batch(st, copy, sms, di ? OG_DTYPE_FP8 : OG_DTYPE_INT8, Bs[bi], L, 4097, labels[1], 0);
        }
    /* rows packed as a session of the 0.6B (28 layers) and 8B (36) shapes packs them */
    for (int bi = 1; bi < 3; bi++) {
        for (int32_t b = 0; b < Bs[bi]; b++) L[b] = 512;
        r[n++] = bench_batch(st, copy, sms, OG_DTYPE_BF16, Bs[bi], L, 513, "512, packed 28", 28);
    }
    for (int32_t b = 0; b < 64; b++) L[b] = 512;
    r[n++] = bench_batch(st, copy, sms, OG_DTYPE_BF16, 64, L, 513, "512, packed 36", 36);
    free(L);
    printf("\n| kv | B | context | us | KV GB/s | of copy | depth | single-session us | tensor cores: us | single-session us "
           "|\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        printf("| %s | %d | %s | %.1f | %.0f | %.2f | %d |", og_dtype_name(r[i].dt), r[i].B, r[i].lengths, r[i].us,
               r[i].gbps, r[i].frac, r[i].depth);
        if (r[i].single_us > 0) printf(" %.1f |", r[i].single_us);
        else printf(" - |");
        printf(" %.1f |", r[i].mma_us);
        if (r[i].mma_single_us > 0) printf(" %.1f |\n", r[i].mma_single_us);
        else printf(" - |\n");
    }
}

/* The kernels part 1 compares, one row each per dtype and history. */
enum impl {
    IMPL_SIMT,    /* single session, CUDA cores */
    IMPL_MMA,     /* single session, tensor cores (int8 / fp8: quants dequantized in registers) */
    IMPL_WIDEN,   /* int8 / fp8 on the tensor cores through bf16 tiles in shared memory */
    IMPL_BATCH,   /* the batched launch (a table of one session), tensor cores: what a decode step runs */
    IMPL_BATCH_1, /* the same with a grid of one split (max_keys 1): no partials, no merge */
    IMPL_PADDED,  /* the batched launch over a padded entry: every block leaves at once (launch floor) */
    N_IMPL
};
static const char *const kImplName[N_IMPL] = {"offgraph",       "offgraph_mma",     "offgraph_mma_widen",
                                              "offgraph_batch1", "offgraph_batch1_one_split", "offgraph_batch1_padded"};

/* Median microseconds of one og_update_and_attend_cuda (or batched) call of
 * impl over rotating copies of storage (k[l], v[l], tables tab[l]). */
static double time_impl(cudaStream_t st, int impl, og_attend_cuda_args *a, og_attend_batch_cuda_args *ba,
                        void **k, void **v, og_attend_cuda_seq **tab, int n_layers) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    int next = 0;
    for (int r = -10; r < REPS; r++) {
        CK(cudaEventRecord(e0, st));
        for (int b = 0; b < BATCH; b++, next = (next + 1) % n_layers) {
            og_status s;
            if (impl >= IMPL_BATCH) {
                ba->seqs = tab[next];
                s = og_update_and_attend_batch_cuda(st, ba);
            } else {
                a->kv.k = k[next], a->kv.v = v[next];
                s = og_update_and_attend_cuda(st, a);
            }
            if (s != OG_OK) {
                fprintf(stderr, "bench_attend_cuda: %s\n", og_last_error());
                exit(1);
            }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (r >= 0) {
            CK(cudaEventElapsedTime(&ms[r], e0, e1));
            ms[r] /= BATCH;
        }
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms[REPS / 2] * 1e3;
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double copy = copy_rate(st);
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (getenv("BENCH_ATTEND_BATCHES_ONLY")) { /* part 2 alone */
        printf("device-to-device copy: %.0f GB/s (read + written)\n", copy / 1e9);
        bench_batches(st, copy, sms);
        cudaStreamDestroy(st);
        return 0;
    }
    const char *pdl = getenv("OG_CUDA_PDL");
    printf("device-to-device copy: %.0f GB/s (read + written); programmatic dependent launch %s\n", copy / 1e9,
           pdl && pdl[0] == '0' ? "off (OG_CUDA_PDL=0)" : "allowed");
    const int32_t Hq = 32, Hkv = 8, D = 128;
    enum { NL = 6 };
    const int64_t Ls[NL] = {1, 128, 512, 4096, 32768, 131072};
    const og_dtype dts[] = {OG_DTYPE_BF16, OG_DTYPE_INT8, OG_DTYPE_FP8};
    double table[3][NL][N_IMPL] = {{{0}}}; /* [dtype][L][impl]: us, 0 where not run */
    enum { NK = 5 };
    static const int32_t kSplitKeys[NK] = {64, 128, 256, 512, 1024};
    double sweep[2][2][NK] = {{{0}}}; /* [bf16, int8][L 512, 4096][split keys]: us */
    int32_t sweep_s[2][2][NK] = {{{0}}};
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    const og_attend_cuda_quant_decode qprev = og_attend_cuda_get_quant_decode();
    for (int di = 0; di < 3; di++)
        for (int li = 0; li < NL; li++) {
            const og_dtype dt = dts[di];
            const bool quant = dt != OG_DTYPE_BF16;
            const int64_t L = Ls[li], rows = L + 1;
            const size_t row_bytes = (size_t)og_kv_dtype_row_bytes(dt, Hkv, D);
            const size_t layer = (size_t)rows * row_bytes;     /* bytes of k (or v) */
            const size_t kv_bytes = 2 * (size_t)L * row_bytes; /* what one call must read */
            int n_layers = (int)(256e6 / (double)(kv_bytes + 1)) + 1;
            if (n_layers < 2) n_layers = 2;
            if (n_layers > 64) n_layers = 64;
            void **k = calloc((size_t)n_layers, sizeof *k), **v = calloc((size_t)n_layers, sizeof *v);
            og_attend_cuda_seq **tab = calloc((size_t)n_layers, sizeof *tab), **pad = calloc((size_t)n_layers, sizeof *pad);
            unsigned char *h = malloc(layer);
            for (int l = 0; l < n_layers; l++) {
                CK(cudaMalloc(&k[l], layer));
                CK(cudaMalloc(&v[l], layer));
                for (int part = 0; part < 2; part++) {
                    const uint64_t seed = (part ? 777 : 1234) + (uint64_t)l;
                    if (dt == OG_DTYPE_BF16) fill_bf16((uint16_t *)h, layer / 2, seed);
                    else fill_quant(h, dt, (size_t)rows, row_bytes, Hkv, D, seed);
                    CK(cudaMemcpy(part ? v[l] : k[l], h, layer, cudaMemcpyHostToDevice));
                }
                const og_attend_cuda_seq e = {.k = k[l], .v = v[l], .length = L, .rows = rows, .T = 1};
                const og_attend_cuda_seq ep = {.k = k[l], .v = v[l], .length = L, .rows = rows, .T = 0};
                CK(cudaMalloc((void **)&tab[l], sizeof e));
                CK(cudaMalloc((void **)&pad[l], sizeof ep));
                CK(cudaMemcpy(tab[l], &e, sizeof e, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(pad[l], &ep, sizeof ep, cudaMemcpyHostToDevice));
            }
            free(h);
            float *q, *kn, *vn, *out, *part;
            int64_t *dlen;
            CK(cudaMalloc((void **)&q, (size_t)Hq * D * 4));
            CK(cudaMalloc((void **)&kn, (size_t)Hkv * D * 4));
            CK(cudaMalloc((void **)&vn, (size_t)Hkv * D * 4));
            CK(cudaMalloc((void **)&out, (size_t)Hq * D * 4));
            size_t scratch = (size_t)og_attend_cuda_scratch_floats(Hq, D) * 4;
            const size_t bscratch = (size_t)og_attend_batch_cuda_scratch_floats(1, Hq, D, rows) * 4;
            if (bscratch > scratch) scratch = bscratch;
            CK(cudaMalloc((void **)&part, scratch));
            CK(cudaMemset(part, 0, scratch)); /* the split counters start at 0 */
            CK(cudaMalloc((void **)&dlen, 8));
            float *hq = malloc((size_t)Hq * D * 4);
            for (int i = 0; i < Hq * D; i++) hq[i] = (float)((i * 37) % 101 - 50) / 50.0f;
            CK(cudaMemcpy(q, hq, (size_t)Hq * D * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(kn, hq, (size_t)Hkv * D * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(vn, hq, (size_t)Hkv * D * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dlen, &L, 8, cudaMemcpyHostToDevice));
            CK(cudaStreamSynchronize(0)); /* the legacy stream's copies: st (non-blocking) waits for none */
            free(hq);
            og_attend_cuda_args a = {.q = q, .k = kn, .v = vn, .out = out, .T = 1, .n_heads = Hq, .scale = 0,
                                     .length = dlen, .partials = part,
                                     .kv = {.policy = OG_KV_FLAT, .dtype = dt, .n_kv_heads = Hkv,
                                            .head_dim = D, .rows = rows, .length = L}};
            og_attend_batch_cuda_args ba = {.q = q, .k = kn, .v = vn, .out = out, .B = 1, .n_heads = Hq,
                                            .n_kv_heads = Hkv, .head_dim = D, .kv_dtype = dt,
                                            .policy = OG_KV_FLAT, .scale = 0, .max_keys = rows, .partials = part};
            for (int impl = 0; impl < N_IMPL; impl++) {
                if (impl == IMPL_WIDEN && !quant) continue;
                if (impl == IMPL_BATCH_1 && L > 4096) continue; /* one block a kv head over 32k keys: slow, not a choice */
                if (impl == IMPL_PADDED && (di > 0 || li > 0)) continue;
                og_attend_cuda_set_decode(impl == IMPL_SIMT ? OG_ATTEND_CUDA_SIMT : OG_ATTEND_CUDA_MMA);
                og_attend_cuda_set_quant_decode(impl == IMPL_WIDEN ? OG_ATTEND_CUDA_QUANT_WIDEN : OG_ATTEND_CUDA_QUANT_MMA);
                ba.max_keys = impl == IMPL_BATCH_1 ? 1 : rows;
                const double us = time_impl(st, impl, &a, &ba, k, v, impl == IMPL_PADDED ? pad : tab, n_layers);
                const double rate = impl == IMPL_PADDED ? 0.0 : (double)kv_bytes / (us * 1e-6);
                const int32_t splits = impl == IMPL_BATCH_1 || impl == IMPL_PADDED ? 1
                                                                                  : og_attend_cuda_splits(L + 1, 1, Hq, Hkv, sms);
                printf("{\"bench\":\"decode_attention\",\"impl\":\"%s\",\"kv\":\"%s\",\"L\":%lld,\"Hq\":%d,"
                       "\"Hkv\":%d,\"D\":%d,\"us\":%.2f,\"kv_GBps\":%.1f,\"copy_GBps\":%.1f,\"fraction_of_copy\":%.3f,"
                       "\"splits\":%d,\"pdl\":%d}\n",
                       kImplName[impl], og_dtype_name(dt), (long long)L, Hq, Hkv, D, us, rate / 1e9, copy / 1e9,
                       rate / copy, splits, !(pdl && pdl[0] == '0'));
                table[di][li][impl] = us;
            }
            /* keys a split takes (og_attend_cuda_set_split_keys), batched launch on the tensor cores,
             * histories 512 and 4k: splits against the merge's cost */
            for (int ki = 0; ki < NK && (Ls[li] == 512 || Ls[li] == 4096) && di < 2; ki++) {
                og_attend_cuda_set_decode(OG_ATTEND_CUDA_MMA);
                og_attend_cuda_set_quant_decode(OG_ATTEND_CUDA_QUANT_MMA);
                const int32_t kprev = og_attend_cuda_set_split_keys(kSplitKeys[ki]);
                ba.max_keys = rows;
                const double us = time_impl(st, IMPL_BATCH, &a, &ba, k, v, tab, n_layers);
                const int32_t splits = og_attend_cuda_splits(L + 1, 1, Hq, Hkv, sms);
                og_attend_cuda_set_split_keys(kprev);
                printf("{\"bench\":\"decode_attention_split_keys\",\"impl\":\"offgraph_batch1\",\"kv\":\"%s\","
                       "\"L\":%lld,\"split_keys\":%d,\"splits\":%d,\"us\":%.2f,\"pdl\":%d}\n",
                       og_dtype_name(dt), (long long)L, kSplitKeys[ki], splits, us, !(pdl && pdl[0] == '0'));
                sweep[di][Ls[li] == 4096][ki] = us;
                sweep_s[di][Ls[li] == 4096][ki] = splits;
            }
            for (int l = 0; l < n_layers; l++) cudaFree(k[l]), cudaFree(v[l]), cudaFree(tab[l]), cudaFree(pad[l]);
            free(k), free(v), free(tab), free(pad);
            cudaFree(q), cudaFree(kn), cudaFree(vn), cudaFree(out), cudaFree(part), cudaFree(dlen);
        }
    og_attend_cuda_set_decode(prev);
    og_attend_cuda_set_quant_decode(qprev);
    printf("\nsingle session, Hq %d / Hkv %d / D %d; us per call (back-to-back calls); of copy: KV bytes per second over "
           "the copy rate; x bf16: bf16's tensor-core time over this row's\n", Hq, Hkv, D);
    printf("| kv | L | CUDA cores | tensor cores | of copy | x bf16 | batched B=1 | x bf16 | one split | widened tiles |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int di = 0; di < 3; di++)
        for (int li = 0; li < NL; li++) {
            const double *t = table[di][li], *b = table[0][li];
            const size_t kvb = 2 * (size_t)Ls[li] * (size_t)og_kv_dtype_row_bytes(dts[di], Hkv, D);
            printf("| %s | %lld | %.1f | %.1f | %.2f | %.2f | %.1f | %.2f |", og_dtype_name(dts[di]), (long long)Ls[li],
                   t[IMPL_SIMT], t[IMPL_MMA], (double)kvb / (t[IMPL_MMA] * 1e-6) / copy, b[IMPL_MMA] / t[IMPL_MMA],
                   t[IMPL_BATCH], b[IMPL_BATCH] / t[IMPL_BATCH]);
            if (t[IMPL_BATCH_1] > 0) printf(" %.1f |", t[IMPL_BATCH_1]);
            else printf(" - |");
            if (t[IMPL_WIDEN] > 0) printf(" %.1f |\n", t[IMPL_WIDEN]);
            else printf(" - |\n");
        }
    printf("launch floor (batched launch over a padded entry: the grid of L 1 starts, reads the table, leaves): "
           "%.1f us\n", table[0][0][IMPL_PADDED]);
    printf("\nkeys a split takes (default %d), batched B=1 on the tensor cores: us (splits)\n| kv | L |",
           OG_ATTEND_CUDA_SPLIT_KEYS);
    for (int ki = 0; ki < NK; ki++) printf(" %d |", kSplitKeys[ki]);
    printf("\n|---|---|");
    for (int ki = 0; ki < NK; ki++) printf("---|");
    printf("\n");
    for (int di = 0; di < 2; di++)
        for (int j = 0; j < 2; j++) {
            printf("| %s | %d |", og_dtype_name(dts[di]), j ? 4096 : 512);
            for (int ki = 0; ki < NK; ki++) printf(" %.1f (%d) |", sweep[di][j][ki], sweep_s[di][j][ki]);
            printf("\n");
        }
    bench_batches(st, copy, sms);
    cudaStreamDestroy(st);
    return 0;
}
#endif
