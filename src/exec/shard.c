/* The tensor-parallel planner (shard.h): which part of every instruction and
 * weight each shard holds.
 *
 * The plan is made in two passes over the program:
 *  - backwards, each value learns what its consumers want of it (all of it,
 *    a shard's columns of it, or partial sums), and each instruction picks
 *    its mode from that and from what its own operands can be: a product
 *    whose x comes out of a split op (attention, swiglu, the gated delta rule
 *    and its norm, the attention gate) is row-parallel; a product whose
 *    output a split op wants is column-parallel; anything else runs whole on
 *    every shard. Two consumers that want different things of one value get
 *    it whole, and a consumer that wants columns of a whole value reads them
 *    (correct, and only costs the replicated work);
 *  - forwards, each value's stored layout follows from its producer's mode,
 *    and every operand is checked against it.
 * Then every weight operand is cut for every shard (og_shard_slice_matrix). */
#include "exec/shard.h"

#include <string.h>

/* ------------------------------------------------------------ slicing */

static og_shard_cols all_cols(int64_t n) {
    og_shard_cols c = {.n = 1};
    c.lo[0] = 0;
    c.hi[0] = n;
    return c;
}

static bool cols_equal(const og_shard_cols *a, const og_shard_cols *b) {
    if (a->n != b->n) return false;
    for (int32_t i = 0; i < a->n; i++)
        if (a->lo[i] != b->lo[i] || a->hi[i] != b->hi[i]) return false;
    return true;
}

/* Copies elements [lo, hi) of a row of K elements of dt (cut at blocks). */
static size_t copy_cols(og_dtype dt, const unsigned char *row, const og_shard_cols *c, unsigned char *dst) {
    size_t n = 0;
    for (int32_t i = 0; i < c->n; i++) {
        size_t a, b;
        if (og_dtype_is_kquant(dt)) {
            a = (size_t)(c->lo[i] / OG_KQUANT_BLOCK) * og_kquant_block_bytes(dt);
            b = (size_t)(c->hi[i] / OG_KQUANT_BLOCK) * og_kquant_block_bytes(dt);
        } else {
            a = (size_t)c->lo[i] * og_dtype_size(dt);
            b = (size_t)c->hi[i] * og_dtype_size(dt);
        }
        memcpy(dst + n, row + a, b - a);
        n += b - a;
    }
    return n;
}

og_status og_shard_slice_matrix(og_dtype dt, const void *w, int64_t N, int64_t K, const og_shard_cols *rows,
                                const og_shard_cols *cols, void **out, size_t *nbytes) {
    *out = NULL;
    const og_shard_cols rall = all_cols(N), call = all_cols(K);
    if (!rows) rows = &rall;
    if (!cols) cols = &call;
    const int64_t unit = og_quant_block_elems(dt);
    for (int32_t i = 0; i < cols->n; i++)
        if (cols->lo[i] % unit || cols->hi[i] % unit || cols->lo[i] < 0 || cols->hi[i] > K || cols->lo[i] >= cols->hi[i])
            return og_set_error(OG_ERR_UNSUPPORTED,
                                "columns [%lld, %lld) of a %s weight of %lld columns do not fall on its blocks of %lld",
                                (long long)cols->lo[i], (long long)cols->hi[i], og_dtype_name(dt), (long long)K,
                                (long long)unit);
    for (int32_t i = 0; i < rows->n; i++)
        if (rows->lo[i] < 0 || rows->hi[i] > N || rows->lo[i] >= rows->hi[i])
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "rows [%lld, %lld) of a weight of %lld rows",
                                (long long)rows->lo[i], (long long)rows->hi[i], (long long)N);
    const int64_t Ns = og_shard_cols_width(rows), Ks = og_shard_cols_width(cols);
    const bool q = og_dtype_is_quantized(dt) && !og_dtype_is_kquant(dt); /* q8 / q4: quants, then scales */
    const size_t row_in = q ? og_quant_row_bytes(dt, K) : og_weight_row_bytes(dt, K);
    const size_t row_out = q ? og_quant_row_bytes(dt, Ks) : og_weight_row_bytes(dt, Ks);
    const size_t total = (size_t)Ns * og_weight_row_bytes(dt, Ks);
    unsigned char *dst = og_malloc(total ? total : 1);
    if (!dst) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a weight slice of %zu bytes", total);
    og_shard_cols qc = *cols, sc = *cols; /* q4: bytes of quants; scales: one per group */
    for (int32_t i = 0; q && i < cols->n; i++) {
        qc.lo[i] = cols->lo[i] * (int64_t)og_quant_row_bytes(dt, OG_QUANT_GROUP) / OG_QUANT_GROUP;
        qc.hi[i] = cols->hi[i] * (int64_t)og_quant_row_bytes(dt, OG_QUANT_GROUP) / OG_QUANT_GROUP;
        sc.lo[i] = cols->lo[i] / OG_QUANT_GROUP;
        sc.hi[i] = cols->hi[i] / OG_QUANT_GROUP;
    }
    int64_t r = 0;
    for (int32_t i = 0; i < rows->n; i++)
        for (int64_t n = rows->lo[i]; n < rows->hi[i]; n++, r++) {
            const unsigned char *src = (const unsigned char *)w + (size_t)n * row_in;
            if (q) {
                size_t o = 0;
                for (int32_t k = 0; k < qc.n; k++) {
                    memcpy(dst + (size_t)r * row_out + o, src + qc.lo[k], (size_t)(qc.hi[k] - qc.lo[k]));
                    o += (size_t)(qc.hi[k] - qc.lo[k]);
                }
                const unsigned char *ssrc = (const unsigned char *)og_quant_scales(dt, w, N, K) + (size_t)n * (size_t)(K / OG_QUANT_GROUP) * 2;
                unsigned char *sdst = dst + (size_t)Ns * row_out + (size_t)r * (size_t)(Ks / OG_QUANT_GROUP) * 2;
                o = 0;
                for (int32_t k = 0; k < sc.n; k++) {
                    memcpy(sdst + o, ssrc + sc.lo[k] * 2, (size_t)(sc.hi[k] - sc.lo[k]) * 2);
                    o += (size_t)(sc.hi[k] - sc.lo[k]) * 2;
                }
            } else {
                copy_cols(dt, src, cols, dst + (size_t)r * row_out);
            }
        }
    *out = dst;
    if (nbytes) *nbytes = total;
    return OG_OK;
}

/* ------------------------------------------------------------ the plan */

/* What a value's consumers want of it. */
enum { WANT_NONE = 0, WANT_FULL, WANT_SPLIT, WANT_PARTIAL };
typedef struct want {
    int kind;
    og_shard_cols cols[OG_SHARD_MAX]; /* WANT_SPLIT */
} want;

typedef struct planner {
    const og_program *p;
    int32_t N, logits_instr;
    og_shard_plan *plan;
    want *want; /* [n_instrs] */
    uint32_t taken; /* operands of the instruction being planned already taken */
} planner;

static void want_merge(planner *pl, int32_t v, int kind, const og_shard_cols *cols) {
    want *w = &pl->want[v];
    if (w->kind == WANT_NONE) {
        w->kind = kind;
        if (kind == WANT_SPLIT) memcpy(w->cols, cols, (size_t)pl->N * sizeof *cols);
        return;
    }
    if (w->kind == kind && kind != WANT_SPLIT) return;
    if (w->kind == WANT_SPLIT && kind == WANT_SPLIT) {
        bool same = true;
        for (int32_t s = 0; s < pl->N; s++) same = same && cols_equal(&w->cols[s], &cols[s]);
        if (same) return;
    }
    w->kind = WANT_FULL; /* different wishes: the whole value; a split consumer reads its columns */
}

/* Even cut of n units of u elements (offset off) into N shards: shard s gets
 * units [s n / N, (s+1) n / N). */
static og_shard_cols cut(int64_t n, int64_t u, int64_t off, int32_t N, int32_t s) {
    og_shard_cols c = {.n = 1};
    c.lo[0] = off + s * n / N * u;
    c.hi[0] = off + (s + 1) * n / N * u;
    return c;
}

static og_status refuse(const planner *pl, int32_t i, const char *why) {
    const og_program_instr *in = og_program_instr_at(pl->p, i);
    return og_set_error(OG_ERR_UNSUPPORTED, "tensor parallel %d: instruction %d (%s -> %s): %s", pl->N, i,
                        og_op_get(in->op)->name, in->out, why);
}

/* A cut of heads in two levels: U groups (attention's kv heads, a Gated
 * DeltaNet layer's key heads) of G members each (the query heads that read a
 * kv head; the value heads that read a key head), members D columns wide.
 * With N <= U, shard s holds groups [s U / N, (s+1) U / N) and all their
 * members (uneven when N does not divide U). With N > U, the shards of a
 * group share it and split its members the same way; when even members are
 * fewer than the shards sharing them, those shards share a member: each
 * computes it whole and owns a part of its D columns (its "own" columns,
 * which the row-parallel product after it reads, so that every column is
 * summed once). */
typedef struct head_cut {
    int64_t ga, gb;         /* groups [ga, gb)                            */
    int64_t ma, mb;         /* members [ma, mb) it computes               */
    int64_t own_lo, own_hi; /* the member columns it owns (of the [U G D]) */
} head_cut;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static head_cut cut_heads(int64_t U, int64_t G, int64_t D, int64_t N, int64_t s) {
    head_cut h;
    if (N <= U) {
        h.ga = s * U / N;
        h.gb = (s + 1) * U / N;
        h.ma = h.ga * G;
        h.mb = h.gb * G;
        h.own_lo = h.ma * D;
        h.own_hi = h.mb * D;
        return h;
    }
    const int64_t k = s * U / N, s0 = ceil_div(k * N, U), c = ceil_div((k + 1) * N, U) - s0, p = s - s0;
    h.ga = k;
    h.gb = k + 1;
    if (c <= G) {
        h.ma = k * G + p * G / c;
        h.mb = k * G + (p + 1) * G / c;
        h.own_lo = h.ma * D;
        h.own_hi = h.mb * D;
        return h;
    }
    const int64_t gi = p * G / c, p0 = ceil_div(gi * c, G), c2 = ceil_div((gi + 1) * c, G) - p0, q = p - p0;
    h.ma = k * G + gi;
    h.mb = h.ma + 1;
    h.own_lo = h.ma * D + q * D / c2;
    h.own_hi = h.ma * D + (q + 1) * D / c2;
    return h;
}

static og_shard_cols range(int64_t lo, int64_t hi) {
    og_shard_cols c = {.n = 1};
    c.lo[0] = lo;
    c.hi[0] = hi;
    return c;
}

/* Attention of instruction i: each shard's query columns (those it computes
 * and those it owns), its kv columns and first kv head. */
static og_status attend_cut(const planner *pl, int32_t i, og_shard_cols *qcols, og_shard_cols *own,
                            og_shard_cols *kvcols, int64_t *kv0) {
    const og_op_attrs *a = &og_program_instr_at(pl->p, i)->attrs;
    const int64_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    for (int32_t s = 0; s < pl->N; s++) {
        const head_cut h = cut_heads(Hkv, Hq / Hkv, D, pl->N, s);
        if (h.own_lo >= h.own_hi)
            return refuse(pl, i, "more shards share one query head than it has columns");
        qcols[s] = range(h.ma * D, h.mb * D);
        own[s] = range(h.own_lo, h.own_hi);
        kvcols[s] = range(h.ga * D, h.gb * D);
        kv0[s] = h.ga;
    }
    return OG_OK;
}

/* A Gated DeltaNet layer (instruction i): each shard's key heads (groups)
 * and value heads (members), as columns of the convolution's output (q
 * heads, k heads, v heads), of the layer's output (v heads: computed and
 * owned) and of a / b (one per v head). */
static og_status gdn_cut(const planner *pl, int32_t i, og_shard_cols *qkv, og_shard_cols *vcols, og_shard_cols *own,
                         og_shard_cols *heads, int64_t *k_heads) {
    const og_op_attrs *a = &og_program_instr_at(pl->p, i)->attrs;
    const int64_t Hk = a->k_heads, Hv = a->v_heads, Dk = a->k_head_dim, Dv = a->v_head_dim;
    for (int32_t s = 0; s < pl->N; s++) {
        const head_cut h = cut_heads(Hk, Hv / Hk, Dv, pl->N, s);
        if (h.own_lo >= h.own_hi)
            return refuse(pl, i, "more shards share one value head than it has columns");
        qkv[s].n = 3;
        qkv[s].lo[0] = h.ga * Dk;
        qkv[s].hi[0] = h.gb * Dk;
        qkv[s].lo[1] = Hk * Dk + h.ga * Dk;
        qkv[s].hi[1] = Hk * Dk + h.gb * Dk;
        qkv[s].lo[2] = 2 * Hk * Dk + h.ma * Dv;
        qkv[s].hi[2] = 2 * Hk * Dk + h.mb * Dv;
        vcols[s] = range(h.ma * Dv, h.mb * Dv);
        own[s] = range(h.own_lo, h.own_hi);
        heads[s] = range(h.ma, h.mb);
        k_heads[s] = h.gb - h.ga;
    }
    return OG_OK;
}

/* The columns of value o each shard owns when a split op made it, for a
 * row-parallel product whose weight is cut in blocks of unit elements;
 * false when o is no split op's output (the product then runs whole). */
static bool natural_cols(const planner *pl, og_program_operand o, int64_t unit, og_shard_cols *cols) {
    if (o.kind != OG_VALUE_ACTIVATION) return false;
    const og_program_instr *in = og_program_instr_at(pl->p, o.index);
    og_shard_cols t1[OG_SHARD_MAX], t2[OG_SHARD_MAX], t3[OG_SHARD_MAX];
    int64_t kv0[OG_SHARD_MAX];
    switch (in->op) {
    case OG_OP_UPDATE_AND_ATTEND:
        return attend_cut(pl, o.index, t1, cols, t2, kv0) == OG_OK;
    case OG_OP_GATED_DELTA_NET:
        return gdn_cut(pl, o.index, t1, t2, cols, t3, kv0) == OG_OK;
    case OG_OP_SIGMOID_MUL:
        return natural_cols(pl, in->in[0], unit, cols);
    case OG_OP_RMS_NORM_GATED: {
        const int64_t H = in->attrs.heads, D = in->out_width / H;
        for (int32_t s = 0; s < pl->N; s++) {
            const head_cut h = cut_heads(H, 1, D, pl->N, s);
            if (h.own_lo >= h.own_hi) return false;
            cols[s] = range(h.own_lo, h.own_hi);
        }
        return true;
    }
    case OG_OP_SWIGLU: {
        const int64_t F = in->out_width;
        if (F % unit || F / unit < pl->N) return false;
        for (int32_t s = 0; s < pl->N; s++) cols[s] = cut(F / unit, unit, 0, pl->N, s);
        return true;
    }
    default:
        return false;
    }
}

/* Head dim of a per-head op, 0 for other ops. */
static int64_t per_head_dim(const og_program_instr *in) {
    switch (in->op) {
    case OG_OP_ROPE: return in->attrs.head_dim;
    case OG_OP_HEAD_RMS_NORM:
    case OG_OP_RMS_NORM_GATED: return in->out_width / in->attrs.heads;
    default: return 0;
    }
}

/* c widened to whole heads of D columns. */
static og_shard_cols whole_heads(og_shard_cols c, int64_t D) {
    for (int32_t r = 0; r < c.n; r++) {
        c.lo[r] = c.lo[r] / D * D;
        c.hi[r] = ceil_div(c.hi[r], D) * D;
    }
    return c;
}

/* Every range of a inside a range of b. */
static bool cols_within(const og_shard_cols *a, const og_shard_cols *b) {
    for (int32_t i = 0; i < a->n; i++) {
        bool in = false;
        for (int32_t j = 0; j < b->n && !in; j++) in = a->lo[i] >= b->lo[j] && a->hi[i] <= b->hi[j];
        if (!in) return false;
    }
    return true;
}

/* Operand j of instruction i is taken whole / by columns / as partial sums
 * (the operands an instruction takes by columns first, then the rest whole:
 * take_all_full skips those taken). */
static void take(planner *pl, int32_t i, int32_t j, og_shard_take t, const og_shard_cols *cols) {
    og_shard_instr *si = &pl->plan->instr[i];
    const og_program_operand o = og_program_instr_at(pl->p, i)->in[j];
    si->take[j] = t;
    pl->taken |= 1u << j;
    if (t == OG_SHARD_TAKE_COLS) memcpy(si->in_cols[j], cols, (size_t)pl->N * sizeof *cols);
    if (o.kind != OG_VALUE_ACTIVATION) return;
    want_merge(pl, o.index, t == OG_SHARD_TAKE_FULL ? WANT_FULL : t == OG_SHARD_TAKE_COLS ? WANT_SPLIT : WANT_PARTIAL,
               cols);
}

static void take_all_full(planner *pl, int32_t i) {
    const og_program_instr *in = og_program_instr_at(pl->p, i);
    for (int32_t j = 0; j < in->n_in; j++)
        if (!(pl->taken & (1u << j))) take(pl, i, j, OG_SHARD_TAKE_FULL, NULL);
}

/* Instruction i, split by heads computing output columns cols: gathered
 * after unless its consumers want columns within these. */
static void split_out(planner *pl, int32_t i, const og_shard_cols *cols) {
    og_shard_instr *si = &pl->plan->instr[i];
    const want *w = &pl->want[i];
    si->mode = OG_SHARD_HEADS;
    memcpy(si->cols, cols, (size_t)pl->N * sizeof *cols);
    bool within = w->kind == WANT_SPLIT;
    for (int32_t s = 0; within && s < pl->N; s++) within = cols_within(&w->cols[s], &cols[s]);
    si->gather = !within; /* consumers read their columns of what it computes */
}

/* A stateful op split by heads: output columns out, its first operand taken
 * by x0's columns, the next two (k and v; a and b) by x12's, the rest whole. */
static void split_stateful(planner *pl, int32_t i, const og_shard_cols *out, const og_shard_cols *x0,
                           const og_shard_cols *x12) {
    split_out(pl, i, out);
    take(pl, i, 0, OG_SHARD_TAKE_COLS, x0);
    take(pl, i, 1, OG_SHARD_TAKE_COLS, x12);
    take(pl, i, 2, OG_SHARD_TAKE_COLS, x12);
    take_all_full(pl, i);
}

static og_status plan_instr(planner *pl, int32_t i) {
    const og_program_instr *in = og_program_instr_at(pl->p, i);
    og_shard_instr *si = &pl->plan->instr[i];
    const want *w = &pl->want[i];
    const int32_t N = pl->N;
    for (int32_t s = 0; s < N; s++) si->attrs[s] = in->attrs;
    og_shard_cols c[OG_SHARD_MAX], c2[OG_SHARD_MAX], c3[OG_SHARD_MAX];
    pl->taken = 0;
    switch (in->op) {
    case OG_OP_EMBED: {
        const og_program_tensor *t = og_program_tensor_at(pl->p, in->in[1].index);
        si->mode = OG_SHARD_VOCAB_EMBED;
        si->reduce = true;
        for (int32_t s = 0; s < N; s++) {
            const og_shard_cols v = cut(t->shape[0], 1, 0, N, s);
            si->head0[s] = v.lo[0];
        }
        take_all_full(pl, i);
        return OG_OK;
    }
    case OG_OP_MATMUL: {
        const og_program_tensor *wt = og_program_tensor_at(pl->p, in->in[1].index);
        if (i == pl->logits_instr) {
            si->mode = OG_SHARD_VOCAB_HEAD;
            si->gather = true;
            for (int32_t s = 0; s < N; s++) si->cols[s] = cut(in->out_width, 1, 0, N, s);
            take_all_full(pl, i);
        } else if (w->kind == WANT_SPLIT) {
            si->mode = OG_SHARD_COLUMNS;
            memcpy(si->cols, w->cols, (size_t)N * sizeof *si->cols);
            take_all_full(pl, i);
        } else if (natural_cols(pl, in->in[0], og_quant_block_elems(wt->dtype), c)) {
            si->mode = OG_SHARD_ROWS;
            si->reduce = w->kind != WANT_PARTIAL;
            take(pl, i, 0, OG_SHARD_TAKE_COLS, c);
            take_all_full(pl, i);
        } else {
            si->mode = OG_SHARD_REPLICATED;
            take_all_full(pl, i);
        }
        return OG_OK;
    }
    case OG_OP_ROPE:
    case OG_OP_HEAD_RMS_NORM:
    case OG_OP_SWIGLU:
    case OG_OP_SIGMOID_MUL:
    case OG_OP_CAUSAL_CONV1D:
    case OG_OP_RMS_NORM_GATED: {
        const int64_t D = per_head_dim(in);
        if (w->kind != WANT_SPLIT) {
            si->mode = OG_SHARD_REPLICATED;
            take_all_full(pl, i);
            return OG_OK;
        }
        for (int32_t s = 0; s < N; s++) c[s] = D > 0 ? whole_heads(w->cols[s], D) : w->cols[s];
        split_out(pl, i, c);
        /* the operands cut like the output: x (and the gate / z / up) */
        const int32_t n_split = in->op == OG_OP_SWIGLU || in->op == OG_OP_SIGMOID_MUL || in->op == OG_OP_RMS_NORM_GATED ? 2 : 1;
        for (int32_t j = 0; j < n_split; j++) take(pl, i, j, OG_SHARD_TAKE_COLS, c);
        take_all_full(pl, i);
        for (int32_t s = 0; D > 0 && s < N; s++) si->attrs[s].heads = og_shard_cols_width(&c[s]) / D;
        return OG_OK;
    }
    case OG_OP_UPDATE_AND_ATTEND: {
        int64_t kv0[OG_SHARD_MAX];
        OG_TRY(attend_cut(pl, i, c, c3, c2, kv0));
        split_stateful(pl, i, c, c, c2);
        for (int32_t s = 0; s < N; s++) {
            si->head0[s] = kv0[s];
            si->attrs[s].n_heads = og_shard_cols_width(&c[s]) / in->attrs.head_dim;
            si->attrs[s].n_kv_heads = og_shard_cols_width(&c2[s]) / in->attrs.head_dim;
        }
        return OG_OK;
    }
    case OG_OP_GATED_DELTA_NET: {
        int64_t kh[OG_SHARD_MAX];
        og_shard_cols own[OG_SHARD_MAX];
        OG_TRY(gdn_cut(pl, i, c, c2, own, c3, kh));
        split_stateful(pl, i, c2, c, c3);
        for (int32_t s = 0; s < N; s++) {
            si->head0[s] = c3[s].lo[0];
            si->attrs[s].k_heads = kh[s];
            si->attrs[s].v_heads = c3[s].hi[0] - c3[s].lo[0];
        }
        return OG_OK;
    }
    case OG_OP_MOE: {
        const og_program_tensor *gu = og_program_tensor_at(pl->p, in->in[2].index),
                                *dn = og_program_tensor_at(pl->p, in->in[3].index);
        const int64_t F = gu->shape[1] / 2, u = og_quant_block_elems(dn->dtype);
        if (F % u || F / u < N) return refuse(pl, i, "its experts' intermediate size has fewer blocks than shards");
        si->mode = OG_SHARD_EXPERTS;
        si->reduce = w->kind != WANT_PARTIAL;
        for (int32_t s = 0; s < N; s++) si->cols[s] = cut(F / u, u, 0, N, s);
        if (in->n_in > 4) take(pl, i, 4, OG_SHARD_TAKE_PARTIAL, NULL);
        take_all_full(pl, i);
        return OG_OK;
    }
    case OG_OP_RMS_NORM:
    case OG_OP_ADD:
        si->mode = OG_SHARD_REPLICATED;
        take_all_full(pl, i);
        return OG_OK;
    case OG_OP_COUNT:
        break;
    }
    return refuse(pl, i, "no rule to cut this op");
}

/* Forwards: each value's layout, and every operand checked against it. */
static og_status check_layouts(planner *pl) {
    og_shard_plan *plan = pl->plan;
    for (int32_t i = 0; i < plan->n_instrs; i++) {
        og_shard_instr *si = &plan->instr[i];
        switch (si->mode) {
        case OG_SHARD_COLUMNS: si->layout = OG_SHARD_SPLIT; break;
        case OG_SHARD_HEADS: si->layout = si->gather ? OG_SHARD_FULL : OG_SHARD_SPLIT; break;
        case OG_SHARD_ROWS:
        case OG_SHARD_EXPERTS: si->layout = si->reduce ? OG_SHARD_FULL : OG_SHARD_PARTIAL; break;
        default: si->layout = OG_SHARD_FULL; break;
        }
        const og_program_instr *in = og_program_instr_at(pl->p, i);
        for (int32_t j = 0; j < in->n_in; j++) {
            const og_program_operand o = in->in[j];
            if (o.kind != OG_VALUE_ACTIVATION) continue;
            const og_shard_instr *src = &plan->instr[o.index];
            bool ok = src->layout == OG_SHARD_FULL;
            if (si->take[j] == OG_SHARD_TAKE_PARTIAL) ok = ok || src->layout == OG_SHARD_PARTIAL;
            if (si->take[j] == OG_SHARD_TAKE_COLS && src->layout == OG_SHARD_SPLIT) {
                ok = true;
                for (int32_t s = 0; s < pl->N; s++) ok = ok && cols_within(&si->in_cols[j][s], &src->cols[s]);
            }
            if (!ok) return refuse(pl, i, "an operand's cut does not match its producer's (a planner bug)");
        }
    }
    return OG_OK;
}

/* ------------------------------------------------------------ weights */

static og_status keep(og_shard_plan *plan, void *p, size_t bytes) {
    if (plan->n_owned == plan->owned_cap) {
        const int32_t cap = plan->owned_cap ? 2 * plan->owned_cap : 64;
        void **n = og_realloc(plan->owned, (size_t)cap * sizeof *n);
        if (!n) {
            og_free(p);
            return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the shards' weights");
        }
        plan->owned = n;
        plan->owned_cap = cap;
    }
    plan->owned[plan->n_owned++] = p;
    plan->owned_bytes += (int64_t)bytes;
    return OG_OK;
}

/* A slice already made of tensor t with the same cut (a tied table read by
 * both embed and the head), so it is held once. */
typedef struct slice_key {
    int32_t tensor, shard;
    og_shard_cols rows, cols[2]; /* cols[1]: the second group of a moe gate_up (unused: n = 0) */
    bool has_rows, has_cols;
    og_shard_weight w;
} slice_key;

typedef struct slice_cache {
    slice_key *k;
    int32_t n, cap;
} slice_cache;

static const og_shard_weight *cache_find(const slice_cache *c, const slice_key *k) {
    for (int32_t i = 0; i < c->n; i++) {
        const slice_key *e = &c->k[i];
        if (e->tensor == k->tensor && e->shard == k->shard && e->has_rows == k->has_rows && e->has_cols == k->has_cols &&
            (!k->has_rows || cols_equal(&e->rows, &k->rows)) && (!k->has_cols || cols_equal(&e->cols[0], &k->cols[0])))
            return &e->w;
    }
    return NULL;
}

/* Slice of the [E, rows, cols] (E = 1 for a matrix; rank 1: [1, cols])
 * tensor t for shard s: the rows and columns given (NULL: all). */
static og_status slice_tensor(og_shard_plan *plan, slice_cache *cache, const og_program *p, int32_t t, int32_t s,
                              const og_shard_cols *rows, const og_shard_cols *cols, og_shard_weight *out) {
    const og_program_tensor *T = og_program_tensor_at(p, t);
    const int64_t E = T->rank == 3 ? T->shape[0] : 1, R = T->rank == 1 ? 1 : T->shape[T->rank - 2],
                  K = T->shape[T->rank - 1];
    const og_shard_cols all_r = all_cols(R), all_k = all_cols(K);
    if (rows && cols_equal(rows, &all_r)) rows = NULL; /* all of them: the tensor itself */
    if (cols && cols_equal(cols, &all_k)) cols = NULL;
    if (!rows && !cols) {
        *out = (og_shard_weight){T->data, R, K};
        return OG_OK;
    }
    slice_key key = {.tensor = t, .shard = s, .has_rows = rows != NULL, .has_cols = cols != NULL};
    if (rows) key.rows = *rows;
    if (cols) key.cols[0] = *cols;
    const og_shard_weight *hit = cache_find(cache, &key);
    if (hit) {
        *out = *hit;
        return OG_OK;
    }
    const int64_t Rs = rows ? og_shard_cols_width(rows) : R, Ks = cols ? og_shard_cols_width(cols) : K;
    const size_t in_bytes = (size_t)R * og_weight_row_bytes(T->dtype, K),
                 out_bytes = (size_t)Rs * og_weight_row_bytes(T->dtype, Ks);
    unsigned char *all = og_malloc((size_t)E * out_bytes + 1);
    if (!all) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the shards' weights");
    for (int64_t e = 0; e < E; e++) {
        void *part = NULL;
        og_status st = og_shard_slice_matrix(T->dtype, (const unsigned char *)T->data + (size_t)e * in_bytes, R, K, rows,
                                             cols, &part, NULL);
        if (st != OG_OK) {
            og_free(all);
            return og_set_error(st, "weight %s: %s", T->name, og_last_error());
        }
        memcpy(all + (size_t)e * out_bytes, part, out_bytes);
        og_free(part);
    }
    OG_TRY(keep(plan, all, (size_t)E * out_bytes));
    *out = (og_shard_weight){all, Rs, Ks};
    if (cache->n == cache->cap) {
        const int32_t cap = cache->cap ? 2 * cache->cap : 64;
        slice_key *n = og_realloc(cache->k, (size_t)cap * sizeof *n);
        if (!n) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the shards' weights");
        cache->k = n;
        cache->cap = cap;
    }
    key.w = *out;
    cache->k[cache->n++] = key;
    return OG_OK;
}

static og_status slice_weights(const planner *pl, slice_cache *cache) {
    og_shard_plan *plan = pl->plan;
    for (int32_t i = 0; i < plan->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(pl->p, i);
        const og_shard_instr *si = &plan->instr[i];
        for (int32_t j = 0; j < in->n_in; j++) {
            const og_program_operand o = in->in[j];
            if (o.kind != OG_VALUE_TENSOR) continue;
            const og_program_tensor *T = og_program_tensor_at(pl->p, o.index);
            if (!T->data) continue; /* runtime storage */
            for (int32_t s = 0; s < plan->n_shards; s++) {
                og_shard_weight *w = (og_shard_weight *)og_shard_weight_at(plan, i, j, s);
                const og_shard_cols *rows = NULL, *cols = NULL;
                og_shard_cols tmp;
                switch (si->mode) {
                case OG_SHARD_VOCAB_EMBED:
                    tmp = cut(T->shape[0], 1, 0, plan->n_shards, s);
                    rows = &tmp;
                    break;
                case OG_SHARD_COLUMNS:
                case OG_SHARD_VOCAB_HEAD:
                    if (j == 1) rows = &si->cols[s];
                    if (j == 2) cols = &si->cols[s]; /* bias */
                    break;
                case OG_SHARD_ROWS:
                    if (j == 1) cols = &si->in_cols[0][s];
                    if (j == 2 && s > 0) { /* the bias is added once, by shard 0 */
                        *w = (og_shard_weight){NULL, 0, 0};
                        continue;
                    }
                    break;
                case OG_SHARD_HEADS:
                    if (in->op == OG_OP_CAUSAL_CONV1D && j == 1) rows = &si->cols[s];
                    if (in->op == OG_OP_GATED_DELTA_NET && (j == 3 || j == 4)) {
                        tmp = range(si->head0[s], si->head0[s] + si->attrs[s].v_heads);
                        cols = &tmp;
                    }
                    break;
                case OG_SHARD_EXPERTS:
                    if (j == 2) { /* gate_up [E, 2F, H]: the shard's gate rows, then its up rows */
                        const int64_t F = T->shape[1] / 2;
                        tmp = si->cols[s];
                        tmp.n = 2;
                        tmp.lo[1] = F + tmp.lo[0];
                        tmp.hi[1] = F + tmp.hi[0];
                        rows = &tmp;
                    }
                    if (j == 3) cols = &si->cols[s]; /* down [E, H, F] */
                    break;
                default:
                    break;
                }
                OG_TRY(slice_tensor(plan, cache, pl->p, o.index, s, rows, cols, w));
            }
        }
    }
    return OG_OK;
}

/* ------------------------------------------------------------ create */

void og_shard_plan_destroy(og_shard_plan *plan) {
    if (!plan) return;
    for (int32_t i = 0; i < plan->n_owned; i++) og_free(plan->owned[i]);
    og_free(plan->owned);
    og_free(plan->weights);
    og_free(plan->instr);
    og_free(plan);
}

og_status og_shard_plan_create(const og_program *p, int32_t logits_instr, int32_t n_shards, og_shard_plan **out) {
    *out = NULL;
    if (n_shards < 1 || n_shards > OG_SHARD_MAX)
        return og_set_error(OG_ERR_UNSUPPORTED, "tensor parallel %d: this build cuts a model into 1 to %d shards",
                            n_shards, OG_SHARD_MAX);
    const int32_t n = og_program_n_instrs(p);
    og_shard_plan *plan = og_calloc(1, sizeof *plan);
    planner pl = {p, n_shards, logits_instr, plan, og_calloc((size_t)n, sizeof *pl.want), 0};
    slice_cache cache = {0};
    og_status st = OG_OK;
    if (plan) {
        plan->n_shards = n_shards;
        plan->n_instrs = n;
        plan->instr = og_calloc((size_t)n, sizeof *plan->instr);
        plan->weights = og_calloc((size_t)n * OG_OP_MAX_INPUTS * (size_t)n_shards, sizeof *plan->weights);
    }
    if (!plan || !pl.want || !plan->instr || !plan->weights) st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a shard plan");
    for (int32_t i = n - 1; st == OG_OK && i >= 0; i--) st = plan_instr(&pl, i);
    if (st == OG_OK) st = check_layouts(&pl);
    if (st == OG_OK) st = slice_weights(&pl, &cache);
    og_free(cache.k);
    og_free(pl.want);
    if (st != OG_OK) {
        og_shard_plan_destroy(plan);
        return st;
    }
    *out = plan;
    return OG_OK;
}
