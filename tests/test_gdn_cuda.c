/* The hybrid layers' CUDA kernels (kernels/cuda/gdn_cuda.h) against the C
 * references of kernels/gdn.h: the gated delta rule against the
 * double-precision recurrent oracle at odd head shapes and step widths
 * around the 64-token chunk edge, from a given state and from zero, and a
 * step cut into pieces (the state carried through state_in / state_out)
 * against the whole; the causal convolution with and without a state; the
 * gated norm and the sigmoid gate. Outputs are poisoned before each run.
 * Tolerances: the GPU's recurrent form sums Dk products per column in f32
 * (as the CPU's), with the device's expf/log1pf/rsqrtf: the CPU test's 1e-5
 * absolute + relative for the delta rule (measured errors there ~3e-7); the
 * convolution and the norms: 1e-6 + 1e-5 relative, the sigmoid gate 1e-6 +
 * 1e-6 relative. Skipped (77) without a CUDA build or device. */
#include "harness.h"

#ifndef OG_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return OG_TEST_SKIP;
}
#else
#include "kernels/cuda/gdn_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/gdn.h"

#include "cuda_check.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof *(a))

static void *up(const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}
static float *poisoned(size_t n) {
    float *h = malloc(n * 4);
    og_poison(h, n);
    float *d = up(h, n * 4);
    free(h);
    return d;
}
static float *down(const float *d, size_t n) {
    float *h = malloc(n * 4);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

typedef struct shape {
    int64_t Hk, Hv, Dk, Dv;
    float A_hi;
} shape;

static void test_gdn(og_rng *r) {
    og_test_section("gated_delta_net_cuda against the double oracle; pieces against the whole");
    static const shape shapes[] = {{1, 1, 1, 1, 0.5f}, {2, 4, 16, 24, 0.5f}, {3, 3, 7, 5, 16.0f}, {2, 4, 128, 128, 0.5f}};
    static const int64_t Ts[] = {1, 2, 17, 63, 64, 65, 130};
    for (size_t si = 0; si < COUNT(shapes); si++)
        for (size_t ti = 0; ti < COUNT(Ts); ti++) {
            const shape *c = &shapes[si];
            const int64_t T = Ts[ti], W = 2 * c->Hk * c->Dk + c->Hv * c->Dv;
            const size_t nq = (size_t)(T * W), nh = (size_t)(T * c->Hv), ns = (size_t)(c->Hv * c->Dk * c->Dv),
                         no = (size_t)(T * c->Hv * c->Dv);
            float *qkv = malloc(nq * 4), *a = malloc(nh * 4), *b = malloc(nh * 4), *A = malloc((size_t)c->Hv * 4),
                  *dt = malloc((size_t)c->Hv * 4), *s0 = malloc(ns * 4), *ref = malloc(no * 4), *sref = malloc(ns * 4);
            og_rng_fill(r, qkv, nq, -1, 1);
            og_rng_fill(r, a, nh, -2, 2);
            og_rng_fill(r, b, nh, -3, 3);
            og_rng_fill(r, s0, ns, -0.5f, 0.5f);
            for (int64_t h = 0; h < c->Hv; h++) {
                A[h] = logf(og_rng_uniform(r, 0.02f, c->A_hi));
                dt[h] = og_rng_uniform(r, -0.5f, 0.5f);
            }
            float *dq = up(qkv, nq * 4), *da = up(a, nh * 4), *db = up(b, nh * 4), *dA = up(A, (size_t)c->Hv * 4),
                  *ddt = up(dt, (size_t)c->Hv * 4), *ds0 = up(s0, ns * 4);
            for (int given = 0; given < 2; given++) {
                og_gdn_args ra = {.qkv = qkv, .a = a, .b = b, .A_log = A, .dt_bias = dt, .A_log_dtype = OG_DTYPE_F32,
                                  .dt_bias_dtype = OG_DTYPE_F32, .T = T, .Hk = c->Hk, .Hv = c->Hv, .Dk = c->Dk,
                                  .Dv = c->Dv, .state_in = given ? s0 : NULL, .state_out = sref, .out = ref};
                CHECK_OK(og_gated_delta_net_ref(&ra));
                float *dout = poisoned(no), *dst = poisoned(ns);
                og_gdn_args ga = ra;
                ga.qkv = dq, ga.a = da, ga.b = db, ga.A_log = dA, ga.dt_bias = ddt, ga.state_in = given ? ds0 : NULL,
                ga.state_out = dst, ga.out = dout;
                CHECK_OK(og_gated_delta_net_cuda(NULL, &ga));
                float *o = down(dout, no), *so = down(dst, ns);
                const double ro = og_tol_ratio(o, ref, no, 1e-5, 1e-5, NULL), rs = og_tol_ratio(so, sref, ns, 1e-5, 1e-5, NULL);
                CHECK_MSG(ro <= 1 && rs <= 1, "Hk %lld Hv %lld Dk %lld Dv %lld T %lld %s state: out %.3g state %.3g",
                          (long long)c->Hk, (long long)c->Hv, (long long)c->Dk, (long long)c->Dv, (long long)T,
                          given ? "given" : "zero", ro, rs);
                /* the step in two pieces, the state carried */
                if (T > 1 && given) {
                    const int64_t t1 = T / 3 + 1;
                    float *dmid = poisoned(ns), *dend = poisoned(ns), *dout2 = poisoned(no);
                    og_gdn_args p1 = ga, p2 = ga;
                    p1.T = t1, p1.state_out = dmid, p1.out = dout2;
                    p2.T = T - t1, p2.qkv = dq + t1 * W, p2.a = da + t1 * c->Hv, p2.b = db + t1 * c->Hv,
                    p2.state_in = dmid, p2.state_out = dend, p2.out = dout2 + t1 * c->Hv * c->Dv;
                    CHECK_OK(og_gated_delta_net_cuda(NULL, &p1));
                    CHECK_OK(og_gated_delta_net_cuda(NULL, &p2));
                    float *o2 = down(dout2, no), *se = down(dend, ns);
                    CHECK(og_tol_ratio(o2, ref, no, 1e-5, 1e-5, NULL) <= 1 &&
                          og_tol_ratio(se, sref, ns, 1e-5, 1e-5, NULL) <= 1);
                    free(o2), free(se);
                    cudaFree(dmid), cudaFree(dend), cudaFree(dout2);
                }
                free(o), free(so);
                cudaFree(dout), cudaFree(dst);
            }
            free(qkv), free(a), free(b), free(A), free(dt), free(s0), free(ref), free(sref);
            cudaFree(dq), cudaFree(da), cudaFree(db), cudaFree(dA), cudaFree(ddt), cudaFree(ds0);
        }
}

static void test_conv(og_rng *r) {
    og_test_section("causal_conv1d_cuda against the reference");
    static const int64_t Cs[] = {1, 3, 300, 1030}, Ks[] = {2, 4}, Ts[] = {1, 2, 17, 64};
    for (size_t ci = 0; ci < COUNT(Cs); ci++)
        for (size_t ki = 0; ki < COUNT(Ks); ki++)
            for (size_t ti = 0; ti < COUNT(Ts); ti++) {
                const int64_t C = Cs[ci], K = Ks[ki], T = Ts[ti];
                const size_t nx = (size_t)(T * C), nw = (size_t)(C * K), ns = (size_t)((K - 1) * C);
                float *x = malloc(nx * 4), *w = malloc(nw * 4), *s0 = malloc(ns * 4), *ref = malloc(nx * 4),
                      *sr = malloc(ns * 4);
                og_rng_fill(r, x, nx, -2, 2);
                og_rng_fill(r, w, nw, -1, 1);
                og_rng_fill(r, s0, ns, -2, 2);
                float *dx = up(x, nx * 4), *dw = up(w, nw * 4), *ds0 = up(s0, ns * 4);
                for (int given = 0; given < 2; given++) {
                    CHECK_OK(og_causal_conv1d_ref(x, w, OG_DTYPE_F32, given ? s0 : NULL, sr, T, C, K, ref));
                    float *dout = poisoned(nx), *dso = poisoned(ns);
                    CHECK_OK(og_causal_conv1d_cuda(NULL, dx, dw, OG_DTYPE_F32, given ? ds0 : NULL, dso, T, C, K, dout));
                    float *o = down(dout, nx), *so = down(dso, ns);
                    CHECK_MSG(og_tol_ratio(o, ref, nx, 1e-6, 1e-5, NULL) <= 1, "C %lld K %lld T %lld", (long long)C,
                              (long long)K, (long long)T);
                    CHECK(memcmp(so, sr, ns * 4) == 0);
                    free(o), free(so);
                    cudaFree(dout), cudaFree(dso);
                }
                free(x), free(w), free(s0), free(ref), free(sr);
                cudaFree(dx), cudaFree(dw), cudaFree(ds0);
            }
}

static void test_norm_gate(og_rng *r) {
    og_test_section("rms_norm_gated_cuda and sigmoid_mul_cuda against the references");
    static const int64_t Ts[] = {1, 3, 40}, ns[] = {1, 4, 32}, Ds[] = {1, 24, 128, 129};
    for (size_t a = 0; a < COUNT(Ts); a++)
        for (size_t b = 0; b < COUNT(ns); b++)
            for (size_t d = 0; d < COUNT(Ds); d++) {
                const int64_t T = Ts[a], n = ns[b], D = Ds[d], N = T * n * D;
                float *x = malloc((size_t)N * 4), *z = malloc((size_t)N * 4), *w = malloc((size_t)D * 4),
                      *ref = malloc((size_t)N * 4);
                og_rng_fill(r, x, (size_t)N, -3, 3);
                og_rng_fill(r, z, (size_t)N, -3, 3);
                og_rng_fill(r, w, (size_t)D, 0.5f, 1.5f);
                float *dx = up(x, (size_t)N * 4), *dz = up(z, (size_t)N * 4), *dw = up(w, (size_t)D * 4);
                float *dout = poisoned((size_t)N);
                CHECK_OK(og_rms_norm_gated_ref(x, z, w, OG_DTYPE_F32, T, n, D, 1e-6f, ref));
                CHECK_OK(og_rms_norm_gated_cuda(NULL, dx, dz, dw, OG_DTYPE_F32, T, n, D, 1e-6f, dout));
                float *o = down(dout, (size_t)N);
                CHECK_MSG(og_tol_ratio(o, ref, (size_t)N, 1e-6, 1e-5, NULL) <= 1, "norm T %lld n %lld D %lld",
                          (long long)T, (long long)n, (long long)D);
                free(o);
                CHECK_OK(og_sigmoid_mul_ref(x, z, N, ref));
                CHECK_OK(og_sigmoid_mul_cuda(NULL, dx, dz, N, dout));
                o = down(dout, (size_t)N);
                CHECK(og_tol_ratio(o, ref, (size_t)N, 1e-6, 1e-6, NULL) <= 1);
                free(o);
                free(x), free(z), free(w), free(ref);
                cudaFree(dx), cudaFree(dz), cudaFree(dw), cudaFree(dout);
            }
}

int main(void) {
    if (!og_cuda_device_present()) {
        printf("skipped: no CUDA device\n");
        return OG_TEST_SKIP;
    }
    og_rng r = og_rng_seed(2828);
    test_gdn(&r);
    test_conv(&r);
    test_norm_gate(&r);
    return og_test_finish();
}
#endif
