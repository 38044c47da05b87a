/* The k-quant decode products on CUDA (kquant_cuda.h): the f32-x gemv
 * (og_kquant_gemv_cuda, "f32x") against the integer gemv (x written once as
 * int8 terms by og_kquant_quantize_x_cuda, then og_kquant_gemv_int8_cuda per
 * part, "dp4a"; its time includes the quantization) and the integer gemv's
 * second cut ("v2", og_kquant_gemv_int8_variant_cuda variant 2, the same
 * quantization included) and its streamed one ("stream", variant 3, as the
 * back end calls it: og_kquant_gemv_x_multi_cuda, every part of the shape in
 * one launch whose blocks write x's terms themselves where they fit, else
 * after the quantization; variant 3 at every T here, whatever the back end's
 * default would take) on the products of the
 * Qwen3-8B shape: hidden 4096, q/k/v 4096 + 1024 + 1024 (one x, three
 * products), o 4096 x 4096, gate/up 12288 + 12288 x 4096, down 4096 x
 * 12288, head 151936 x 4096; weights q4_k, q5_k and q6_k; T = 1, 2, 4, 8
 * rows of x.
 * CUDA events around BATCH back-to-back calls, median of REPS batches after
 * a warm-up, rotating over enough copies of the weights that a round reads
 * more than the 60 MB L2 holds. Reports microseconds, weight bytes read per
 * second as a fraction of a device-to-device copy measured in the same run
 * (bytes read + written per second, as bench_gemv_cuda), the quantization of
 * x alone (at these sizes the floor of a launch, ~4 us, not its work), dp4a's
 * time against f32x's, v2's against dp4a's and stream's against v2's, and
 * v2 less the quantization's time as a fraction of copy (the products
 * alone; stream writes x's terms itself where they fit). One JSON line per case, a table last (dp4a -> v2 ->
 * stream).
 *   bench_kquant_cuda [q4_k|q5_k|q6_k ...] [qkv|o|gate_up|down|head ...]
 * (default: every dtype, every product; naming one picks, for a profiler).
 * Weights are random bytes with finite f16 scales. Without CUDA it says so
 * and exits 77. */
#include "core/core.h"

#include <stdio.h>

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "kernels/cuda/kquant_cuda.h"
#include "kernels/cuda/ops_cuda.h"

#include "cuda_bench.h"
#include <stdlib.h>
#include <string.h>

enum { REPS = 15, BATCH = 16, MAX_CASES = 128 };
#define L2_BYTES ((size_t)60 << 20)

/* `copies` device copies of a [N, K] k-quant weight: whole rows of random
 * bytes in a tile of about 16 MiB, repeated, each block's f16 scales set to
 * values in (2^-7, 0.5). */
static void **make_weights(og_dtype dt, int64_t N, int64_t K, int copies, size_t *bytes, uint64_t seed) {
    const size_t rb = og_kquant_row_bytes(dt, K), bb = og_kquant_block_bytes(dt), total = rb * (size_t)N;
    size_t tile_rows = ((size_t)16 << 20) / rb;
    if (tile_rows < 1) tile_rows = 1;
    if (tile_rows > (size_t)N) tile_rows = (size_t)N;
    const size_t tile = tile_rows * rb;
    uint8_t *host = malloc(tile);
    if (!host) exit(2);
    for (size_t i = 0; i < tile; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        host[i] = (uint8_t)(seed >> 24);
    }
    const int d_off = dt == OG_DTYPE_Q6_K ? 208 : 0, dmin_off = dt == OG_DTYPE_Q6_K ? -1 : 2;
    for (size_t b = 0; b < tile / bb; b++) {
        const uint16_t f = (uint16_t)(0x2000 + (b * 2654435761u) % 0x1800);
        memcpy(host + b * bb + d_off, &f, 2);
        if (dmin_off >= 0) memcpy(host + b * bb + dmin_off, &f, 2);
    }
    void **d = malloc((size_t)copies * sizeof *d);
    if (!d) exit(2);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&d[c], total));
        for (size_t off = 0; off < total; off += tile)
            CK(cudaMemcpy((uint8_t *)d[c] + off, host, total - off < tile ? total - off : tile,
                          cudaMemcpyHostToDevice));
    }
    free(host);
    *bytes = total;
    return d;
}

typedef struct shape {
    const char *name;
    int parts;
    int64_t K, N[3];
} shape;

enum { F32X, DP4A, V2, STREAM, QUANT_ONLY };

/* Median microseconds of one call (all parts of the shape) of kernel `which`. */
static double time_case(cudaStream_t st, const shape *s, og_dtype dt, void **const *w, int copies, int64_t T,
                        const float *x, void *xq, float *out, int which) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    int c = 0;
    for (int rep = -2; rep < REPS; rep++) {
        CK(cudaEventRecord(e0, st));
        for (int b = 0; b < BATCH; b++, c = (c + 1) % copies) {
            og_status stt = OG_OK;
            if (which != F32X && which != STREAM) stt = og_kquant_quantize_x_cuda(st, x, T, s->K, xq);
            int64_t off = 0;
            if (which == STREAM && stt == OG_OK) {
                og_gemv_cuda_part parts[3];
                for (int p = 0; p < s->parts; p++) {
                    parts[p] = (og_gemv_cuda_part){w[p][c], NULL, s->N[p], out + T * off};
                    off += s->N[p];
                }
                stt = og_kquant_gemv_x_multi_cuda(st, x, NULL, xq, dt, T, s->K, parts, s->parts);
            }
            for (int p = 0; p < s->parts && stt == OG_OK && which != QUANT_ONLY && which != STREAM; p++) {
                stt = which == F32X ? og_kquant_gemv_cuda(st, x, w[p][c], NULL, dt, T, s->K, s->N[p], out + T * off)
                                    : og_kquant_gemv_int8_variant_cuda(st, which == V2 ? 2 : 1, xq, w[p][c], NULL, dt,
                                                                       T, s->K, s->N[p], out + T * off);
                off += s->N[p];
            }
            if (stt != OG_OK) {
                fprintf(stderr, "%s %s: %s\n", s->name, og_dtype_name(dt), og_last_error());
                exit(1);
            }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (rep >= 0) CK(cudaEventElapsedTime(&ms[rep], e0, e1));
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return (double)ms[REPS / 2] * 1000.0 / BATCH;
}

typedef struct result {
    const char *name, *dt;
    int64_t T;
    double f32x, dp4a, v2, sm, frac_f32x, frac_dp4a, frac_v2, frac_sm;
} result;

static bool is_dtype(const char *a) { return !strcmp(a, "q4_k") || !strcmp(a, "q5_k") || !strcmp(a, "q6_k"); }

static bool is_shape(const char *a, const shape *shapes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(a, shapes[i].name)) return true;
    return false;
}

/* Whether `name` is wanted: named on the command line, or no argument of
 * its kind is (a dtype when shapes is NULL, else a product). */
static bool named(int argc, char **argv, const char *name, const shape *shapes, size_t n_shapes) {
    bool any = false;
    for (int a = 1; a < argc; a++) {
        if (shapes ? !is_shape(argv[a], shapes, n_shapes) : !is_dtype(argv[a])) continue;
        if (!strcmp(argv[a], name)) return true;
        any = true;
    }
    return !any;
}

int main(int argc, char **argv) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const shape shapes[] = {
        {"qkv", 3, 4096, {4096, 1024, 1024}}, {"o", 1, 4096, {4096}}, {"gate_up", 2, 4096, {12288, 12288}},
        {"down", 1, 12288, {4096}},           {"head", 1, 4096, {151936}},
    };
    const og_dtype dts[] = {OG_DTYPE_Q4_K, OG_DTYPE_Q5_K, OG_DTYPE_Q6_K};
    const size_t n_shapes = sizeof shapes / sizeof *shapes;
    for (int a = 1; a < argc; a++)
        if (!is_dtype(argv[a]) && !is_shape(argv[a], shapes, n_shapes)) {
            fprintf(stderr, "bench_kquant_cuda: unknown argument \"%s\" (q4_k q5_k q6_k qkv o gate_up down head)\n",
                    argv[a]);
            return 2;
        }
    const int64_t Ts[] = {1, 2, 4, 8};
    const double copy = copy_rate(st);
    printf("{\"bench\":\"copy\",\"copy_GBps\":%.0f}\n", copy / 1e9);
    result res[MAX_CASES];
    int n_res = 0;
    for (int di = 0; di < 3; di++) {
        if (!named(argc, argv, og_dtype_name(dts[di]), NULL, 0)) continue;
        for (size_t si = 0; si < n_shapes; si++) {
            const shape *s = &shapes[si];
            if (!named(argc, argv, s->name, shapes, n_shapes)) continue;
            size_t per_copy = 0, nb[3];
            for (int p = 0; p < s->parts; p++) per_copy += og_kquant_row_bytes(dts[di], s->K) * (size_t)s->N[p];
            const int copies = (int)(2 * L2_BYTES / per_copy + 1);
            void **w[3];
            for (int p = 0; p < s->parts; p++)
                w[p] = make_weights(dts[di], s->N[p], s->K, copies, &nb[p], 77 + (uint64_t)p);
            int64_t out_n = 0;
            for (int p = 0; p < s->parts; p++) out_n += s->N[p];
            float *hx = malloc(sizeof(float) * (size_t)(8 * s->K));
            uint64_t seed = 5;
            for (int64_t i = 0; i < 8 * s->K; i++) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                hx[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5);
            }
            float *x = NULL, *out = NULL;
            void *xq = NULL;
            CK(cudaMalloc((void **)&x, (size_t)(8 * s->K) * sizeof(float)));
            CK(cudaMemcpy(x, hx, (size_t)(8 * s->K) * sizeof(float), cudaMemcpyHostToDevice));
            CK(cudaMalloc(&xq, og_kquant_x_cuda_bytes(8, s->K)));
            CK(cudaMalloc((void **)&out, (size_t)(8 * out_n) * sizeof(float)));
            CK(cudaStreamSynchronize(0)); /* the legacy stream's copies: st (non-blocking) waits for none */
            for (int ti = 0; ti < 4; ti++) {
                const int64_t T = Ts[ti];
                const double a = time_case(st, s, dts[di], w, copies, T, x, xq, out, F32X);
                const double b = time_case(st, s, dts[di], w, copies, T, x, xq, out, DP4A);
                const double v = time_case(st, s, dts[di], w, copies, T, x, xq, out, V2);
                setenv("OG_CUDA_KQUANT_GEMV", "stream", 1); /* variant 3 whatever the default would take */
                const double m = time_case(st, s, dts[di], w, copies, T, x, xq, out, STREAM);
                unsetenv("OG_CUDA_KQUANT_GEMV");
                const double q = time_case(st, s, dts[di], w, copies, T, x, xq, out, QUANT_ONLY);
                const double fa = (double)per_copy / (a * 1e-6) / copy, fb = (double)per_copy / (b * 1e-6) / copy,
                             fv = (double)per_copy / (v * 1e-6) / copy, fm = (double)per_copy / (m * 1e-6) / copy;
                printf("{\"bench\":\"kquant_gemv\",\"shape\":\"%s\",\"weights\":\"%s\",\"T\":%lld,\"weight_bytes\":%zu,"
                       "\"f32x_us\":%.2f,\"dp4a_us\":%.2f,\"quantize_x_us\":%.2f,\"f32x_fraction_of_copy\":%.3f,"
                       "\"dp4a_fraction_of_copy\":%.3f,\"dp4a_time_vs_f32x\":%.3f,\"v2_us\":%.2f,"
                       "\"v2_GBps\":%.0f,\"dp4a_GBps\":%.0f,\"v2_fraction_of_copy\":%.3f,\"v2_time_vs_dp4a\":%.3f,"
                       "\"v2_less_quantize_fraction_of_copy\":%.3f,\"stream_us\":%.2f,\"stream_fraction_of_copy\":%.3f,"
                       "\"stream_time_vs_v2\":%.3f}\n",
                       s->name, og_dtype_name(dts[di]), (long long)T, per_copy, a, b, q, fa, fb, b / a, v,
                       (double)per_copy / (v * 1e-6) / 1e9, (double)per_copy / (b * 1e-6) / 1e9, fv, v / b,
                       v > q ? (double)per_copy / ((v - q) * 1e-6) / copy : 0.0, m, fm, m / v);
                fflush(stdout);
                if (n_res < MAX_CASES) res[n_res++] = (result){s->name, og_dtype_name(dts[di]), T, a, b, v, m, fa, fb, fv, fm};
            }
            for (int p = 0; p < s->parts; p++) {
                for (int k = 0; k < copies; k++) cudaFree(w[p][k]);
                free(w[p]);
            }
            free(hx);
            cudaFree(x), cudaFree(xq), cudaFree(out);
        }
    }
    printf("---- k-quant decode products, 8B shape: us (fraction of the copy rate, %.0f GB/s), dp4a -> v2 -> stream\n",
           copy / 1e9);
    printf("%-8s %-5s %-34s %-34s %-34s %-34s\n", "product", "dtype", "T=1", "T=2", "T=4", "T=8");
    for (int i = 0; i + 3 < n_res; i += 4) {
        printf("%-8s %-5s", res[i].name, res[i].dt);
        for (int k = 0; k < 4; k++)
            printf(" %6.1f(%.2f)->%6.1f(%.2f)->%6.1f(%.2f)", res[i + k].dp4a, res[i + k].frac_dp4a, res[i + k].v2,
                   res[i + k].frac_v2, res[i + k].sm, res[i + k].frac_sm);
        printf("\n");
    }
    cudaStreamDestroy(st);
    return 0;
}
#endif
