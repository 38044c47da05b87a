/* The reference moe kernel (moe.h): routing, then every row's experts one
 * after the other with the reference products. Letters as in moe.h. */
#include "kernels/moe.h"

#include "kernels/ops.h"
#include "kernels/ops_internal.h"

#include <math.h>

og_status og_moe_check(const og_moe_args *a) {
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe: NULL arguments");
    OG_TRY(og_ops_check_ptr(a->x, "moe", "x"));
    OG_TRY(og_ops_check_ptr(a->logits, "moe", "logits"));
    OG_TRY(og_ops_check_ptr(a->gate_up, "moe", "gate_up"));
    OG_TRY(og_ops_check_ptr(a->down, "moe", "down"));
    OG_TRY(og_ops_check_ptr(a->out, "moe", "out"));
    OG_TRY(og_ops_check_dim(a->T, "moe", "T"));
    OG_TRY(og_ops_check_dim(a->H, "moe", "H"));
    OG_TRY(og_ops_check_dim(a->F, "moe", "F"));
    OG_TRY(og_ops_check_dim(a->E, "moe", "E"));
    if (a->top_k < 1 || a->top_k > a->E || a->top_k > OG_MOE_MAX_TOP_K)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe: top_k %d is outside [1, min(E %lld, %d)]", a->top_k,
                            (long long)a->E, OG_MOE_MAX_TOP_K);
    if (a->shared && !a->shared_gate)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe: shared given without shared_gate");
    size_t gu_bytes, d_bytes, xb, lb;
    OG_TRY(og_ops_check_matrix_dtype(a->gate_up_dtype, "moe", "gate_up"));
    OG_TRY(og_ops_check_matrix_dtype(a->down_dtype, "moe", "down"));
    OG_TRY(og_ops_check_matrix_size(a->gate_up_dtype, a->E * 2 * a->F, a->H, "moe", "gate_up", &gu_bytes));
    OG_TRY(og_ops_check_matrix_size(a->down_dtype, a->E * a->H, a->F, "moe", "down", &d_bytes));
    OG_TRY(og_ops_check_size(a->T, a->H, sizeof(float), "moe", "x", &xb));
    OG_TRY(og_ops_check_size(a->T, a->E, sizeof(float), "moe", "logits", &lb));
    OG_TRY(og_ops_check_disjoint(a->out, xb, a->x, xb, "moe", "x"));
    OG_TRY(og_ops_check_disjoint(a->out, xb, a->logits, lb, "moe", "logits"));
    OG_TRY(og_ops_check_disjoint(a->out, xb, a->gate_up, gu_bytes, "moe", "gate_up"));
    OG_TRY(og_ops_check_disjoint(a->out, xb, a->down, d_bytes, "moe", "down"));
    if (a->shared) {
        OG_TRY(og_ops_check_disjoint(a->out, xb, a->shared, xb, "moe", "shared"));
        OG_TRY(og_ops_check_disjoint(a->out, xb, a->shared_gate, (size_t)a->T * sizeof(float), "moe",
                                     "shared_gate"));
    }
    return OG_OK;
}

void og_moe_route_row(const float *logits, int64_t E, int32_t k, bool norm, float *p, int32_t *ex, float *w) {
    float mx = logits[0];
    for (int64_t e = 1; e < E; e++)
        if (logits[e] > mx) mx = logits[e];
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / sum;
    int32_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        /* an expert enters when the list has room or it beats the last one
         * strictly: among equals the one seen first (lower index) stays */
        if (n == k && !(p[e] > p[ex[k - 1]])) continue;
        int32_t at = n < k ? n : k - 1;
        while (at > 0 && p[e] > p[ex[at - 1]]) {
            ex[at] = ex[at - 1];
            at--;
        }
        ex[at] = (int32_t)e;
        if (n < k) n++;
    }
    float s = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        w[j] = p[ex[j]];
        s += w[j];
    }
    if (norm)
        for (int32_t j = 0; j < k; j++) w[j] = w[j] / s;
}

og_status og_moe_route_ref(const float *logits, int64_t T, int64_t E, int32_t top_k, bool norm, int32_t *experts,
                           float *weights) {
    OG_TRY(og_ops_check_ptr(logits, "moe_route", "logits"));
    OG_TRY(og_ops_check_ptr(experts, "moe_route", "experts"));
    OG_TRY(og_ops_check_ptr(weights, "moe_route", "weights"));
    OG_TRY(og_ops_check_dim(T, "moe_route", "T"));
    OG_TRY(og_ops_check_dim(E, "moe_route", "E"));
    if (top_k < 1 || top_k > E || top_k > OG_MOE_MAX_TOP_K)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe_route: top_k %d is outside [1, min(E %lld, %d)]", top_k,
                            (long long)E, OG_MOE_MAX_TOP_K);
    float *p = og_malloc((size_t)E * sizeof *p);
    if (!p) return og_set_error(OG_ERR_OUT_OF_MEMORY, "moe_route: no memory for %lld probabilities", (long long)E);
    for (int64_t t = 0; t < T; t++)
        og_moe_route_row(logits + t * E, E, top_k, norm, p, experts + t * top_k, weights + t * top_k);
    og_free(p);
    return OG_OK;
}

og_status og_moe_ref(const og_moe_args *a) {
    OG_TRY(og_moe_check(a));
    const int64_t H = a->H, F = a->F, E = a->E;
    const int32_t k = a->top_k;
    float *p = og_malloc((size_t)E * sizeof *p), *gu = og_malloc((size_t)(2 * F) * sizeof *gu),
          *h = og_malloc((size_t)F * sizeof *h), *y = og_malloc((size_t)H * sizeof *y),
          *acc = og_malloc((size_t)(a->T * H) * sizeof *acc);
    og_status st = OG_OK;
    if (!p || !gu || !h || !y || !acc) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "moe: no memory for a row's scratch");
    for (int64_t t = 0; st == OG_OK && t < a->T; t++) {
        int32_t ex[OG_MOE_MAX_TOP_K];
        float w[OG_MOE_MAX_TOP_K];
        og_moe_route_row(a->logits + t * E, E, k, a->norm_topk_prob, p, ex, w);
        float *o = acc + t * H;
        for (int64_t i = 0; i < H; i++) o[i] = 0.0f;
        /* in increasing expert index */
        for (int64_t e = 0; st == OG_OK && e < E; e++) {
            int32_t j = 0;
            while (j < k && ex[j] != e) j++;
            if (j == k) continue;
            const float *x = a->x + t * H;
            st = og_matmul_ref(x, og_moe_expert(a->gate_up, a->gate_up_dtype, e, 2 * F, H), NULL, a->gate_up_dtype,
                               1, H, 2 * F, gu);
            if (st == OG_OK) st = og_swiglu_ref(gu, gu + F, 1, F, h);
            if (st == OG_OK)
                st = og_matmul_ref(h, og_moe_expert(a->down, a->down_dtype, e, H, F), NULL, a->down_dtype, 1, F, H,
                                   y);
            for (int64_t i = 0; st == OG_OK && i < H; i++) o[i] = o[i] + y[i] * w[j];
        }
        if (st == OG_OK && a->shared) {
            const float g = 1.0f / (1.0f + expf(-a->shared_gate[t]));
            for (int64_t i = 0; i < H; i++) o[i] = o[i] + g * a->shared[t * H + i];
        }
    }
    if (st == OG_OK) memcpy(a->out, acc, (size_t)(a->T * H) * sizeof *acc);
    og_free(p);
    og_free(gu);
    og_free(h);
    og_free(y);
    og_free(acc);
    return st;
}
