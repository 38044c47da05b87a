/* The fast moe kernel (moe.h): rows grouped by expert. Letters as in moe.h.
 *
 * 1. Every row is routed (og_moe_route_row, as the reference).
 * 2. The M = T * k selected (row, expert) pairs are sorted by expert (a
 *    counting sort, rows in order within an expert) and the rows of x
 *    gathered into that order: expert e's n_e rows are one block.
 * 3. Per selected expert, in increasing e: its gate_up product over its
 *    block (og_matmul_rows_cpu: the expert's weights stream once for all of
 *    its rows, across tokens and sessions), SwiGLU, its down product.
 * 4. Every row sums its experts' outputs in increasing e, times their
 *    weights, from 0 (then the gated shared expert), as the reference.
 * og_matmul_rows_cpu gives a row the bits a one-row call gives it, so the
 * result of a row depends on no other row of the call. */
#include "kernels/moe.h"

#include "kernels/ops.h"
#include "kernels/ops_internal.h"

#include <math.h>

/* The scratch of a call: [M] ints and floats, [E + 1] offsets, then f32
 * rows. */
typedef struct moe_scratch {
    int32_t *ex;    /* [T, k] experts of each row                          */
    float *w;       /* [T, k] their weights                                */
    int32_t *slot;  /* [T, k] where the pair's rows sit in the sorted order */
    int64_t *start; /* [E + 1] first sorted pair of each expert            */
    int32_t *row;   /* [M] the row (token) of each sorted pair             */
    float *xs;      /* [M, H] x of each sorted pair                        */
    float *gu;      /* [M, 2F] its gate_up products                        */
    float *h;       /* [M, F] their SwiGLU                                 */
    float *y;       /* [M, H] the expert's output                          */
    float *p;       /* [E] routing scratch                                 */
} moe_scratch;

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static og_status get_scratch(const og_moe_args *a, moe_scratch *s, void **block) {
    const size_t M = (size_t)a->T * (size_t)a->top_k, H = (size_t)a->H, F = (size_t)a->F, E = (size_t)a->E;
    /* every count below is bounded by validated tensor sizes; the sum is
     * checked against overflow term by term */
    size_t sizes[10] = {M * sizeof(int32_t), M * sizeof(float), M * sizeof(int32_t), (E + 1) * sizeof(int64_t),
                        M * sizeof(int32_t), 0, 0, 0, 0, E * sizeof(float)};
    const size_t rows[4] = {H, 2 * F, F, H};
    for (int i = 0; i < 4; i++) {
        if (rows[i] && M > SIZE_MAX / sizeof(float) / rows[i])
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe: scratch of %zu rows overflows", M);
        sizes[5 + i] = M * rows[i] * sizeof(float);
    }
    size_t total = 0;
    for (int i = 0; i < 10; i++) {
        if (total > SIZE_MAX - align16(sizes[i]) - 16)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "moe: scratch overflows");
        total += align16(sizes[i]);
    }
    char *b = og_malloc(total);
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "moe: no memory for %zu bytes of scratch", total);
    *block = b;
    void **dst[10] = {(void **)&s->ex, (void **)&s->w, (void **)&s->slot, (void **)&s->start, (void **)&s->row,
                      (void **)&s->xs, (void **)&s->gu, (void **)&s->h, (void **)&s->y, (void **)&s->p};
    for (int i = 0; i < 10; i++) {
        *dst[i] = b;
        b += align16(sizes[i]);
    }
    return OG_OK;
}

og_status og_moe_cpu(og_threadpool *pool, const og_moe_args *a) {
    OG_TRY(og_moe_check(a));
    const int64_t T = a->T, H = a->H, F = a->F, E = a->E;
    const int32_t k = a->top_k;
    moe_scratch s;
    void *block = NULL;
    OG_TRY(get_scratch(a, &s, &block));
    for (int64_t t = 0; t < T; t++)
        og_moe_route_row(a->logits + t * E, E, k, a->norm_topk_prob, s.p, s.ex + t * k, s.w + t * k);
    /* counting sort of the pairs by expert; rows in order inside each */
    for (int64_t e = 0; e <= E; e++) s.start[e] = 0;
    for (int64_t i = 0; i < T * k; i++) s.start[s.ex[i] + 1]++;
    for (int64_t e = 0; e < E; e++) s.start[e + 1] += s.start[e];
    for (int64_t t = 0; t < T; t++) {
        for (int32_t j = 0; j < k; j++) {
            const int32_t e = s.ex[t * k + j];
            /* start[e] walks forward as pairs are placed; it is rebuilt below */
            const int64_t at = s.start[e]++;
            s.slot[t * k + j] = (int32_t)at;
            s.row[at] = (int32_t)t;
            memcpy(s.xs + at * H, a->x + t * H, (size_t)H * sizeof(float));
        }
    }
    for (int64_t e = E; e > 0; e--) s.start[e] = s.start[e - 1];
    s.start[0] = 0;
    og_status st = OG_OK;
    for (int64_t e = 0; st == OG_OK && e < E; e++) {
        const int64_t r0 = s.start[e], n = s.start[e + 1] - r0;
        if (n == 0) continue;
        st = og_matmul_rows_cpu(pool, s.xs + r0 * H, og_moe_expert(a->gate_up, a->gate_up_dtype, e, 2 * F, H), NULL,
                                a->gate_up_dtype, n, H, 2 * F, s.gu + r0 * 2 * F);
        for (int64_t r = 0; st == OG_OK && r < n; r++) {
            const float *g = s.gu + (r0 + r) * 2 * F, *u = g + F;
            float *h = s.h + (r0 + r) * F;
            for (int64_t i = 0; i < F; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        if (st == OG_OK)
            st = og_matmul_rows_cpu(pool, s.h + r0 * F, og_moe_expert(a->down, a->down_dtype, e, H, F), NULL,
                                    a->down_dtype, n, F, H, s.y + r0 * H);
    }
    for (int64_t t = 0; st == OG_OK && t < T; t++) {
        /* the row's experts in increasing index: slots increase with e */
        int32_t order[OG_MOE_MAX_TOP_K];
        for (int32_t j = 0; j < k; j++) {
            int32_t at = j;
            while (at > 0 && s.ex[t * k + order[at - 1]] > s.ex[t * k + j]) {
                order[at] = order[at - 1];
                at--;
            }
            order[at] = j;
        }
        float *o = a->out + t * H;
        for (int64_t i = 0; i < H; i++) o[i] = 0.0f;
        for (int32_t q = 0; q < k; q++) {
            const int32_t j = order[q];
            const float w = s.w[t * k + j], *y = s.y + (int64_t)s.slot[t * k + j] * H;
            for (int64_t i = 0; i < H; i++) o[i] = o[i] + y[i] * w;
        }
        if (a->shared) {
            const float g = 1.0f / (1.0f + expf(-a->shared_gate[t]));
            const float *sh = a->shared + t * H;
            for (int64_t i = 0; i < H; i++) o[i] = o[i] + g * sh[i];
        }
    }
    og_free(block);
    return st;
}
