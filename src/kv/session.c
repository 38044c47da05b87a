/* KV sessions: per-session storage, the prepare/commit step transaction,
 * geometric growth, metrics and the capacity estimate.
 *
 * Letters: T step width, L committed length, W ring window,
 * R = W + max_write - 1 ring slots, Hkv kv heads, D head dim.
 *
 * Storage of every layer is sequence-major [rows, Hkv, D] for k and for v,
 * so the committed rows are one prefix and growth appends rows at the end:
 *  - with an allocator that grows in place (reserve/resize), a flat layer
 *    reserves address space for max_capacity rows at its first allocation
 *    and grows by resizing: no copy, and its k and v never move;
 *  - otherwise growth allocates a larger block, copies the committed prefix
 *    and frees the old block (the layer moves).
 * A prepare is all-or-nothing across layers: new blocks are allocated and
 * layers resized before the session changes; when any of it fails, every
 * new block is freed and every layer resized in this prepare is resized
 * back to its old rows (rollback by shrinking). A shrink that itself fails
 * is harmless: the layer keeps its old rows and address, only memory past
 * them stays backed until the next growth or destroy.
 *
 * Counting: growth_count counts layers grown, moved or in place (a prepare
 * that grows two flat layers counts 2); the first allocation of a layer is
 * not a growth. rebinds counts prepares after which some layer that already
 * had storage is bound at a different address (the first binding is not a
 * rebind; growth in place never rebinds). steps, growth_count, rebinds and
 * graph_captures survive reset. */
#include "kv/kv.h"

#include <stdio.h>

typedef struct kv_storage {
    void *k;      /* [rows, Hkv, D] of kv_dtype, NULL until the first prepare */
    void *v;      /* [rows, Hkv, D] of kv_dtype                              */
    int64_t rows; /* allocated rows                                          */
} kv_storage;

struct og_kv_session {
    og_kv_config cfg;           /* cfg.layers points at `layers`            */
    og_kv_layer_config *layers; /* [n_layers], owned                        */
    og_kv_allocator alloc;
    kv_storage *store;          /* [n_layers], owned                        */
    kv_storage *fresh;          /* [n_layers] scratch for prepare's new blocks; k == the
                                   layer's own k marks a layer resized in place */
    og_kv_plan *plans;          /* [n_layers], meaningful while prepared > 0 */
    int64_t length;             /* L                                        */
    int32_t prepared;           /* T of the prepared step, 0 = none         */
    int64_t growth_count, rebinds, graph_captures, steps;
    og_errbuf err;
};

/* Sets the session's error to "<context>: <thread's last error>" (the
 * failing callee already described the cause in og_last_error). */
static og_status fail_with_last(og_kv_session *s, og_status st, const char *context) {
    char cause[OG_ERRMSG_CAP];
    snprintf(cause, sizeof cause, "%s", og_last_error());
    return og_errbuf_set(&s->err, st, "%s: %s", context, cause);
}

og_status og_kv_session_create(const og_kv_config *cfg, const og_kv_allocator *alloc,
                               og_kv_session **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_create: out is NULL");
    *out = NULL;
    og_status st = og_kv_config_validate(cfg, NULL);
    if (st != OG_OK) return st;
    if (alloc && (!alloc->alloc || !alloc->free || !alloc->copy))
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_kv_session_create: allocator lacks its %s function",
                            !alloc->alloc ? "alloc" : !alloc->free ? "free" : "copy");
    if (alloc && !alloc->reserve != !alloc->resize)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_kv_session_create: allocator has %s but not %s (growth in place needs both)",
                            alloc->reserve ? "reserve" : "resize", alloc->reserve ? "resize" : "reserve");

    size_t n = (size_t)cfg->n_layers;
    og_kv_session *s = og_calloc(1, sizeof *s);
    if (s) {
        s->layers = og_calloc(n, sizeof *s->layers);
        s->store = og_calloc(n, sizeof *s->store);
        s->fresh = og_calloc(n, sizeof *s->fresh);
        s->plans = og_calloc(n, sizeof *s->plans);
    }
    if (!s || !s->layers || !s->store || !s->fresh || !s->plans) {
        og_kv_session_destroy(s);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_kv_session_create: no host memory for %zu layers", n);
    }
    memcpy(s->layers, cfg->layers, n * sizeof *s->layers);
    s->cfg = *cfg;
    s->cfg.layers = s->layers;
    s->alloc = alloc ? *alloc : og_kv_allocator_cpu();
    *out = s;
    return OG_OK;
}

void og_kv_session_destroy(og_kv_session *s) {
    if (!s) return;
    if (s->store) {
        for (int32_t i = 0; i < s->cfg.n_layers; i++) {
            if (s->store[i].k) s->alloc.free(s->alloc.ctx, s->store[i].k);
            if (s->store[i].v) s->alloc.free(s->alloc.ctx, s->store[i].v);
        }
    }
    og_free(s->layers);
    og_free(s->store);
    og_free(s->fresh);
    og_free(s->plans);
    og_free(s);
}

void og_kv_session_reset(og_kv_session *s) {
    if (!s) return;
    s->length = 0;
    s->prepared = 0;
}

int64_t og_kv_session_length(const og_kv_session *s) { return s ? s->length : 0; }

const char *og_kv_session_last_error(const og_kv_session *s) {
    return s ? s->err.msg : "og_kv_session_last_error: session is NULL";
}

const og_kv_config *og_kv_session_config(const og_kv_session *s) { return s ? &s->cfg : NULL; }

/* Rows a flat layer holding `have` rows grows to so that it holds `need`:
 * start at max(initial_capacity, T), double, cap at max_capacity. */
static int64_t flat_grow_rows(const og_kv_config *cfg, int64_t have, int32_t T, int64_t need) {
    int64_t rows = have;
    if (rows == 0) rows = cfg->initial_capacity > T ? cfg->initial_capacity : T;
    while (rows < need) rows = rows > cfg->max_capacity / 2 ? cfg->max_capacity : rows * 2;
    return rows < cfg->max_capacity ? rows : cfg->max_capacity;
}

/* True when layer l grows in place (a flat layer, an allocator with reserve). */
static bool grows_in_place(const og_kv_session *s, const og_kv_layer_config *l) {
    return l->policy == OG_KV_FLAT && s->alloc.reserve;
}

/* Gives back the rows of a layer resized in place (block k or v) down to
 * `rows`; see the top comment for why a failed shrink is only warned about. */
static void shrink_back(og_kv_session *s, int32_t i, void *block, int64_t rows) {
    size_t bytes = (size_t)(rows * og_kv_row_bytes(&s->cfg, &s->layers[i]));
    if (s->alloc.resize(s->alloc.ctx, block, bytes) != OG_OK)
        OG_WARN("kv session: layer %d keeps memory past its %lld rows (%s)", (int)i, (long long)rows,
                og_last_error());
}

/* Undoes step 2 of prepare: frees new blocks, shrinks resized layers back. */
static void rollback_fresh(og_kv_session *s) {
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        kv_storage *f = &s->fresh[i];
        if (f->k && f->k == s->store[i].k) {
            shrink_back(s, i, f->k, s->store[i].rows);
            shrink_back(s, i, f->v, s->store[i].rows);
        } else {
            if (f->k) s->alloc.free(s->alloc.ctx, f->k);
            if (f->v) s->alloc.free(s->alloc.ctx, f->v);
        }
        *f = (kv_storage){0};
    }
}

/* Storage of `rows` rows (`bytes` each for k and v) for layer i into
 * s->fresh[i]: resized in place, reserved, or newly allocated. On failure
 * fresh[i] holds only what rollback_fresh must undo. */
static og_status grow_layer(og_kv_session *s, int32_t i, int64_t rows, size_t bytes) {
    const og_kv_layer_config *l = &s->layers[i];
    kv_storage *f = &s->fresh[i], *have = &s->store[i];
    og_status st;
    if (grows_in_place(s, l) && have->k) {
        st = s->alloc.resize(s->alloc.ctx, have->k, bytes);
        if (st != OG_OK) return st;
        st = s->alloc.resize(s->alloc.ctx, have->v, bytes);
        if (st != OG_OK) {
            char cause[OG_ERRMSG_CAP]; /* the failure to report, whatever the shrink says */
            snprintf(cause, sizeof cause, "%s", og_last_error());
            shrink_back(s, i, have->k, have->rows);
            return og_set_error(st, "%s", cause);
        }
        *f = (kv_storage){.k = have->k, .v = have->v, .rows = rows};
        return OG_OK;
    }
    if (grows_in_place(s, l)) {
        size_t max_bytes = (size_t)(s->cfg.max_capacity * og_kv_row_bytes(&s->cfg, l)); /* fits: size_overflow */
        st = s->alloc.reserve(s->alloc.ctx, max_bytes, bytes, &f->k);
        if (st == OG_OK) st = s->alloc.reserve(s->alloc.ctx, max_bytes, bytes, &f->v);
    } else {
        st = s->alloc.alloc(s->alloc.ctx, bytes, &f->k);
        if (st == OG_OK) st = s->alloc.alloc(s->alloc.ctx, bytes, &f->v);
    }
    if (st == OG_OK) f->rows = rows;
    return st;
}

og_status og_kv_session_prepare(og_kv_session *s, int32_t T) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_prepare: session is NULL");
    const og_kv_config *cfg = &s->cfg;
    char ctx[160];
    snprintf(ctx, sizeof ctx, "kv session prepare(T=%d) at L=%lld", (int)T, (long long)s->length);
    if (s->prepared)
        return og_errbuf_set(&s->err, OG_ERR_STATE, "%s: a step of T=%d is already prepared (commit or abort it)",
                             ctx, (int)s->prepared);
    if (T < 1) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "%s: T must be >= 1", ctx);
    if (T > cfg->max_write)
        return og_errbuf_set(&s->err, OG_ERR_WRITE_TOO_WIDE, "%s: T exceeds max_write %d", ctx, (int)cfg->max_write);
    if (s->length > cfg->max_capacity - T)
        return og_errbuf_set(&s->err, OG_ERR_CAPACITY, "%s: L + T exceeds max_capacity %lld", ctx,
                             (long long)cfg->max_capacity);

    /* 1. Plan every layer; a refusal changes nothing. */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        og_status st = og_kv_plan_layer(cfg, &s->layers[i], s->length, T, &s->plans[i]);
        if (st != OG_OK) return fail_with_last(s, st, ctx);
    }

    /* 2. Allocate every new block, and resize every layer growing in place,
     *    before anything else of the session changes. */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &s->layers[i];
        int64_t have = s->store[i].rows, need = s->plans[i].rows_needed;
        if (have >= need) continue;
        int64_t rows = l->policy == OG_KV_RING ? need : flat_grow_rows(cfg, have, T, need);
        size_t bytes = (size_t)(rows * og_kv_row_bytes(cfg, l)); /* fits: checked by size_overflow */
        og_status st = grow_layer(s, i, rows, bytes);
        if (st != OG_OK) {
            char where[320];
            snprintf(where, sizeof where, "%s: layer %d (layer_id %d) %lld rows (%zu bytes each for k and v)", ctx,
                     (int)i, (int)l->layer_id, (long long)rows, bytes);
            st = fail_with_last(s, st, where);
            rollback_fresh(s);
            return st;
        }
    }

    /* 3. Copy the committed prefix of every layer that moves into its new block. */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        if (!s->fresh[i].k || !s->store[i].k || s->fresh[i].k == s->store[i].k) continue;
        int64_t kept = s->length < s->store[i].rows ? s->length : s->store[i].rows;
        size_t bytes = (size_t)(kept * og_kv_row_bytes(cfg, &s->layers[i]));
        og_status st = s->alloc.copy(s->alloc.ctx, s->fresh[i].k, s->store[i].k, bytes);
        if (st == OG_OK) st = s->alloc.copy(s->alloc.ctx, s->fresh[i].v, s->store[i].v, bytes);
        if (st != OG_OK) {
            char where[240];
            snprintf(where, sizeof where, "%s: copying %lld rows of layer %d (layer_id %d)", ctx, (long long)kept,
                     (int)i, (int)s->layers[i].layer_id);
            st = fail_with_last(s, st, where);
            rollback_fresh(s);
            return st;
        }
    }

    /* 4. Swap: nothing can fail from here on. */
    int moved = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        if (!s->fresh[i].k) continue;
        if (s->fresh[i].k == s->store[i].k) {
            s->growth_count++;
        } else if (s->store[i].k) {
            s->alloc.free(s->alloc.ctx, s->store[i].k);
            s->alloc.free(s->alloc.ctx, s->store[i].v);
            s->growth_count++;
            moved = 1;
        }
        s->store[i] = s->fresh[i];
        s->fresh[i] = (kv_storage){0};
    }
    if (moved) s->rebinds++;
    s->prepared = T;
    return OG_OK;
}

og_status og_kv_session_commit(og_kv_session *s, int32_t T) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_commit: session is NULL");
    if (!s->prepared)
        return og_errbuf_set(&s->err, OG_ERR_STATE, "kv session commit(T=%d) at L=%lld: no step is prepared", (int)T,
                             (long long)s->length);
    if (T != s->prepared)
        return og_errbuf_set(&s->err, OG_ERR_STATE,
                             "kv session commit(T=%d) at L=%lld: the prepared step has T=%d (still prepared)",
                             (int)T, (long long)s->length, (int)s->prepared);
    s->length += T;
    s->steps++;
    s->prepared = 0;
    return OG_OK;
}

void og_kv_session_abort(og_kv_session *s) {
    if (s) s->prepared = 0;
}

og_status og_kv_session_plan(const og_kv_session *s, int32_t index, og_kv_plan *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_plan: NULL argument");
    if (index < 0 || index >= s->cfg.n_layers)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_plan: layer index %d out of [0, %d)", (int)index,
                            (int)s->cfg.n_layers);
    if (!s->prepared) return og_set_error(OG_ERR_STATE, "og_kv_session_plan: no step is prepared");
    *out = s->plans[index];
    return OG_OK;
}

og_status og_kv_session_layer_view(const og_kv_session *s, int32_t index, og_kv_layer_view *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_layer_view: NULL argument");
    if (index < 0 || index >= s->cfg.n_layers)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_layer_view: layer index %d out of [0, %d)",
                            (int)index, (int)s->cfg.n_layers);
    const og_kv_layer_config *l = &s->layers[index];
    *out = (og_kv_layer_view){
        .layer_id = l->layer_id,
        .policy = l->policy,
        .dtype = s->cfg.kv_dtype,
        .window = l->window,
        .n_kv_heads = l->n_kv_heads,
        .head_dim = l->head_dim,
        .rows = s->store[index].rows,
        .length = s->length,
        .k = s->store[index].k,
        .v = s->store[index].v,
    };
    return OG_OK;
}

int64_t og_kv_session_layer_rows(const og_kv_session *s, int32_t index) {
    if (!s || index < 0 || index >= s->cfg.n_layers) return -1;
    return s->store[index].rows;
}

void og_kv_session_note_capture(og_kv_session *s) {
    if (s) s->graph_captures++;
}

og_status og_kv_session_metrics(const og_kv_session *s, og_kv_metrics *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_metrics: NULL argument");
    og_kv_metrics m = {0};
    m.length = s->length;
    m.n_layers = s->cfg.n_layers;
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        int64_t rows = s->store[i].rows, row = og_kv_row_bytes(&s->cfg, &s->layers[i]);
        int64_t live = s->length < rows ? s->length : rows;
        m.rows_allocated += rows;
        m.bytes_allocated += 2 * rows * row;
        m.bytes_live += 2 * live * row;
    }
    m.growth_count = s->growth_count;
    m.rebinds = s->rebinds;
    m.graph_captures = s->graph_captures;
    m.steps = s->steps;
    *out = m;
    return OG_OK;
}

/* Capacity estimate. Assumes steps no wider than initial_capacity (decode).
 * tokens_reachable: starting from the flat rows held now (or, for a session
 * with no storage yet, after a first step that allocates ring R rows plus
 * initial_capacity flat rows out of the budget), the flat layers double
 * towards max_capacity; a growth to `next` rows that moves the layers is
 * possible while the old block is still held, so it needs
 * next * bytes_per_token of budget at its peak (in place: only the
 * (next - rows) * bytes_per_token it adds), after which the budget shrinks
 * by (next - rows) * bytes_per_token. The result is the capacity reached minus
 * L (a session without flat layers is bounded by max_capacity alone).
 * fresh_sessions: budget / fresh_session_bytes, counted independently of
 * tokens_reachable (the budget spent one way or the other). */
og_status og_kv_session_capacity(const og_kv_session *s, int64_t budget_bytes, og_kv_capacity *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_capacity: NULL argument");
    if (budget_bytes < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_capacity: budget %lld bytes is negative",
                            (long long)budget_bytes);
    const og_kv_config *cfg = &s->cfg;
    int64_t per_token = 0, ring_bytes = 0, flat_rows = 0;
    int has_flat = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        int64_t row2 = 2 * og_kv_row_bytes(cfg, &s->layers[i]);
        if (s->layers[i].policy == OG_KV_RING) {
            ring_bytes += og_kv_layer_slots(cfg, &s->layers[i]) * row2;
        } else {
            per_token += row2;
            flat_rows = s->store[i].rows;
            has_flat = 1;
        }
    }
    int64_t fresh = ring_bytes + cfg->initial_capacity * per_token;
    int64_t budget = budget_bytes, rows = flat_rows;
    int allocated = s->store[0].k != NULL;
    int64_t reach = s->length;
    if (allocated || fresh <= budget) {
        if (!allocated) {
            budget -= fresh;
            rows = cfg->initial_capacity;
        }
        if (!has_flat) rows = cfg->max_capacity;
        while (rows < cfg->max_capacity) {
            int64_t next = rows > cfg->max_capacity / 2 ? cfg->max_capacity : rows * 2;
            int64_t peak = s->alloc.reserve ? next - rows : next;
            if (peak * per_token > budget) break;
            budget -= (next - rows) * per_token;
            rows = next;
        }
        reach = rows;
    }
    out->tokens_reachable = reach - s->length;
    out->fresh_sessions = budget_bytes / fresh;
    out->bytes_per_token = per_token;
    out->fresh_session_bytes = fresh;
    return OG_OK;
}
