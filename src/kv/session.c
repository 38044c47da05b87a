/* KV sessions: per-session storage, the prepare/commit step transaction,
 * growth, metrics and the capacity estimate.
 *
 * Letters: T step width, L committed length, W ring window,
 * R = W + max_write - 1 ring slots, Hkv kv heads, D head dim,
 * P the packed row's bytes.
 *
 * Two layouts (see og_kv_session_create in offgraph.h):
 *  - packed, with an allocator that grows in place (reserve/resize): every
 *    flat layer lives in one block reserved for max_capacity packed rows of
 *    P bytes; row p holds, for each flat layer in manifest order, its k row
 *    then its v row (Hkv * D elements each, each part starting on a 16-byte
 *    boundary). A prepare that needs N = L + T rows backs
 *    min(round_up(N * P, granularity), max_capacity * P) bytes of the block
 *    by one reserve (first prepare) or one resize, and the layers' rows are
 *    the whole rows that fit. Ring layers share one fixed block taken by
 *    alloc at the first prepare (per ring layer: k [R, Hkv, D], then v), so
 *    a session makes at most two allocations in its life plus one resize
 *    per growth, and nothing ever moves.
 *  - dense, otherwise: every layer has its own k and v blocks
 *    [rows, Hkv, D]; a flat layer starts at max(initial_capacity, T) rows
 *    and doubles up to max_capacity by alloc + copy of the committed prefix
 *    + free (the layer moves).
 * A prepare is all-or-nothing. Dense: new blocks are allocated and copied
 * into before the session changes; on any failure every new block is
 * freed. Packed: the ring block (first prepare only) comes first, then the
 * one reserve or resize of the packed block; a failed reserve leaves
 * nothing, a failed resize leaves the block backed as it was (the
 * allocator's contract), so rollback only frees a ring block taken in this
 * prepare, and the layers keep their rows, addresses and contents.
 *
 * Counting: growth_count counts layers grown, moved or in place (a prepare
 * that grows two flat layers counts 2, packed or not); the first allocation
 * of a layer is not a growth. rebinds counts prepares after which some
 * layer that already had storage is bound at a different address (the first
 * binding is not a rebind; packed storage never rebinds). steps,
 * growth_count, rebinds and graph_captures survive reset. */
#include "kv/kv.h"

#include <stdio.h>

/* Every part of a packed row (a layer's k or v) and of the ring block starts
 * on this boundary (bytes), so each layer's k and v are as aligned as the
 * block whenever its own row is a multiple of it. */
#define KV_PACK_ALIGN 16

typedef struct kv_storage {
    void *k;      /* [rows, Hkv, D] of kv_dtype (row stride: see the view), NULL until the first prepare */
    void *v;      /* [rows, Hkv, D] of kv_dtype                              */
    int64_t rows; /* allocated rows                                          */
} kv_storage;

/* Packed-mode blocks. */
typedef struct kv_pack {
    int64_t row_bytes;  /* P: bytes of one packed row, 0 without flat layers */
    size_t max_bytes;   /* max_capacity * P: the reservation                 */
    void *base;         /* [max_capacity, P bytes], NULL until the first prepare */
    size_t asked;       /* bytes the allocator was last asked to back        */
    int64_t rows;       /* whole rows in `asked`, capped at max_capacity     */
    size_t ring_bytes;  /* size of the ring block, 0 without ring layers     */
    void *ring;         /* the ring block, NULL until the first prepare      */
    int64_t *offset;    /* [n_layers, 2] byte offsets of k and v: in the packed row (flat)
                           or in the ring block (ring) */
    size_t shared;      /* bytes at the start of `base` mapped from the block of the
                           session this one was forked from (never written)  */
    size_t frozen;      /* bytes at the start of `base` that another session may map
                           (>= shared): never written again; a reset gives the
                           block back rather than write them                 */
    bool moved;         /* the block was given back: the next binding is a rebind */
} kv_pack;

/* The states (og_kv_state_config): one block [2][half] allocated at create,
 * each state at the same offset in both halves; `cur` names the half that
 * holds the committed state, the other is what a prepared step writes. */
typedef struct kv_states {
    void *block;          /* [2 * half] bytes, NULL without states            */
    int64_t *offset;      /* [n_states] byte offsets within a half            */
    size_t half;          /* bytes of one copy of every state                 */
    int cur;              /* 0 or 1                                           */
    void *checkpoint;     /* [half] bytes: the committed state at checkpoint_len, allocated on first use */
    int64_t checkpoint_len; /* -1: no checkpoint                              */
} kv_states;

/* States start on this boundary (bytes) within a half. */
#define KV_STATE_ALIGN 256

struct og_kv_session {
    og_kv_config cfg;           /* cfg.layers points at `layers`            */
    og_kv_layer_config *layers; /* [n_layers], owned                        */
    og_kv_state_config *states; /* [n_states], owned (cfg.states)           */
    kv_states st;
    og_kv_allocator alloc;
    bool packed;                /* alloc grows in place: the packed layout  */
    kv_pack pack;               /* packed mode only                         */
    kv_storage *store;          /* [n_layers], owned: what views show       */
    kv_storage *fresh;          /* [n_layers] scratch for a dense prepare's new blocks */
    /* What the prepared step changed, so that og_kv_session_rollback can undo
     * it: dense layers' blocks before the prepare (a replaced block is freed
     * at commit or abort, not before), the packed blocks' state, counters. */
    kv_storage *before;         /* [n_layers] dense only                   */
    struct {
        void *base, *ring;
        size_t asked;
        int64_t rows;
        bool moved;
    } pack_before;
    int64_t growth_before, rebinds_before;
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

static int64_t align_up(int64_t bytes, int64_t to) { return (bytes + to - 1) / to * to; }

/* Bytes an allocator of granularity g backs when asked for `bytes`. */
static size_t backed_size(size_t bytes, size_t g) { return g ? (bytes + g - 1) / g * g : bytes; }

/* Lays out the packed row and the ring block of s; OG_ERR_INVALID_CONFIG
 * when the packed reservation's size overflows. */
static og_status pack_layout(og_kv_session *s) {
    const og_kv_config *cfg = &s->cfg;
    kv_pack *pk = &s->pack;
    int64_t row = 0, ring = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &s->layers[i];
        const int64_t part = og_kv_row_bytes(cfg, l); /* fits: size_overflow */
        if (l->policy == OG_KV_FLAT) {
            pk->offset[2 * i] = row;
            pk->offset[2 * i + 1] = row + align_up(part, KV_PACK_ALIGN);
            row += 2 * align_up(part, KV_PACK_ALIGN);
        } else {
            const int64_t block = align_up(og_kv_layer_slots(cfg, l) * part, KV_PACK_ALIGN);
            pk->offset[2 * i] = ring;
            pk->offset[2 * i + 1] = ring + block;
            ring += 2 * block;
        }
    }
    int64_t max_bytes;
    if (!og_mul_overflow_i64(row, cfg->max_capacity, &max_bytes) || (uint64_t)max_bytes > SIZE_MAX)
        return og_set_error(OG_ERR_INVALID_CONFIG,
                            "og_kv_session_create: packed rows of %lld bytes for %lld positions overflow",
                            (long long)row, (long long)cfg->max_capacity);
    pk->row_bytes = row;
    pk->max_bytes = (size_t)max_bytes;
    pk->ring_bytes = (size_t)ring;
    return OG_OK;
}

/* Lays out the states and allocates both copies (nothing without states). */
static og_status states_create(og_kv_session *s) {
    int64_t half = 0;
    for (int32_t i = 0; i < s->cfg.n_states; i++) {
        s->st.offset[i] = half;
        half += align_up(og_kv_state_bytes(&s->states[i]), KV_STATE_ALIGN); /* fits: state_shape */
    }
    s->st.half = (size_t)half;
    if (!half) return OG_OK;
    og_status st = s->alloc.alloc(s->alloc.ctx, 2 * s->st.half, &s->st.block);
    if (st != OG_OK) {
        s->st.block = NULL;
        return og_set_error(st, "og_kv_session_create: %zu bytes for two copies of %d states: %s", 2 * s->st.half,
                            (int)s->cfg.n_states, og_last_error());
    }
    return OG_OK;
}

static unsigned char *state_half(const og_kv_session *s, int which) {
    return (unsigned char *)s->st.block + (size_t)which * s->st.half;
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

    /* every array gets at least one element, so that a manifest of states
     * only (no KV layer) allocates as one of layers does */
    size_t n = (size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1), ns = (size_t)(cfg->n_states > 0 ? cfg->n_states : 1);
    og_kv_session *s = og_calloc(1, sizeof *s);
    if (s) {
        s->layers = og_calloc(n, sizeof *s->layers);
        s->store = og_calloc(n, sizeof *s->store);
        s->fresh = og_calloc(n, sizeof *s->fresh);
        s->before = og_calloc(n, sizeof *s->before);
        s->pack.offset = og_calloc(2 * n, sizeof *s->pack.offset);
        s->states = og_calloc(ns, sizeof *s->states);
        s->st.offset = og_calloc(ns, sizeof *s->st.offset);
        s->st.checkpoint_len = -1;
    }
    if (!s || !s->layers || !s->store || !s->fresh || !s->before || !s->pack.offset || !s->states ||
        !s->st.offset) {
        og_kv_session_destroy(s);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_kv_session_create: no host memory for %zu layers", n);
    }
    if (cfg->n_layers > 0) memcpy(s->layers, cfg->layers, (size_t)cfg->n_layers * sizeof *s->layers);
    if (cfg->n_states > 0) memcpy(s->states, cfg->states, (size_t)cfg->n_states * sizeof *s->states);
    s->cfg = *cfg;
    s->cfg.layers = s->layers;
    s->cfg.states = cfg->n_states > 0 ? s->states : NULL;
    s->alloc = alloc ? *alloc : og_kv_allocator_cpu();
    s->packed = s->alloc.reserve != NULL;
    if (s->packed && (st = pack_layout(s)) != OG_OK) {
        og_kv_session_destroy(s);
        return st;
    }
    if ((st = states_create(s)) != OG_OK) {
        og_kv_session_destroy(s);
        return st;
    }
    *out = s;
    return OG_OK;
}

void og_kv_session_destroy(og_kv_session *s) {
    if (!s) return;
    og_kv_session_abort(s); /* frees blocks a prepared step replaced */
    if (s->packed) {
        if (s->pack.base) s->alloc.free(s->alloc.ctx, s->pack.base);
        if (s->pack.ring) s->alloc.free(s->alloc.ctx, s->pack.ring);
    } else if (s->store) {
        for (int32_t i = 0; i < s->cfg.n_layers; i++) {
            if (s->store[i].k) s->alloc.free(s->alloc.ctx, s->store[i].k);
            if (s->store[i].v) s->alloc.free(s->alloc.ctx, s->store[i].v);
        }
    }
    if (s->st.block) s->alloc.free(s->alloc.ctx, s->st.block);
    if (s->st.checkpoint) s->alloc.free(s->alloc.ctx, s->st.checkpoint);
    og_free(s->states);
    og_free(s->st.offset);
    og_free(s->layers);
    og_free(s->store);
    og_free(s->fresh);
    og_free(s->before);
    og_free(s->pack.offset);
    og_free(s);
}

/* Gives the packed block back (a reset of a session whose rows are shared
 * must not write them); the next prepare reserves a new one. */
static void pack_release(og_kv_session *s) {
    kv_pack *pk = &s->pack;
    if (!pk->base) return;
    s->alloc.free(s->alloc.ctx, pk->base);
    pk->base = NULL;
    pk->asked = 0;
    pk->rows = 0;
    pk->shared = pk->frozen = 0;
    pk->moved = true;
    for (int32_t i = 0; i < s->cfg.n_layers; i++)
        if (s->layers[i].policy == OG_KV_FLAT) s->store[i] = (kv_storage){0};
}

void og_kv_session_reset(og_kv_session *s) {
    if (!s) return;
    s->length = 0;
    s->prepared = 0;
    s->st.checkpoint_len = -1; /* states at length 0 are zero by definition: nothing to clear */
    if (s->packed && s->pack.frozen) pack_release(s);
}

int64_t og_kv_session_length(const og_kv_session *s) { return s ? s->length : 0; }

const char *og_kv_session_last_error(const og_kv_session *s) {
    return s ? s->err.msg : "og_kv_session_last_error: session is NULL";
}

const og_kv_config *og_kv_session_config(const og_kv_session *s) { return s ? &s->cfg : NULL; }

/* Rows a dense flat layer holding `have` rows grows to so that it holds
 * `need`: start at max(initial_capacity, T), double, cap at max_capacity. */
static int64_t flat_grow_rows(const og_kv_config *cfg, int64_t have, int32_t T, int64_t need) {
    int64_t rows = have;
    if (rows == 0) rows = cfg->initial_capacity > T ? cfg->initial_capacity : T;
    while (rows < need) rows = rows > cfg->max_capacity / 2 ? cfg->max_capacity : rows * 2;
    return rows < cfg->max_capacity ? rows : cfg->max_capacity;
}

/* Bytes the packed block is asked to back so that it holds `need` rows:
 * need * P rounded up to the granularity, at most the reservation. */
static size_t pack_ask(const og_kv_session *s, int64_t need) {
    size_t bytes = backed_size((size_t)need * (size_t)s->pack.row_bytes, s->alloc.granularity);
    return bytes < s->pack.max_bytes ? bytes : s->pack.max_bytes;
}

/* Whole packed rows in `asked` bytes, capped at max_capacity. */
static int64_t pack_rows_in(const og_kv_session *s, size_t asked) {
    int64_t rows = (int64_t)(asked / (size_t)s->pack.row_bytes);
    return rows < s->cfg.max_capacity ? rows : s->cfg.max_capacity;
}

/* Points every layer's storage at the packed and ring blocks. */
static void pack_bind(og_kv_session *s) {
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        const bool flat = s->layers[i].policy == OG_KV_FLAT;
        unsigned char *base = flat ? s->pack.base : s->pack.ring;
        s->store[i] = (kv_storage){
            .k = base + s->pack.offset[2 * i],
            .v = base + s->pack.offset[2 * i + 1],
            .rows = flat ? s->pack.rows : og_kv_layer_slots(&s->cfg, &s->layers[i]),
        };
    }
}

/* The context of a prepare's messages, put into words only when a message is
 * made: a step prepares every session, and most prepares make none. */
typedef struct prep_ctx {
    const char *fixed; /* the words, when they are fixed */
    int32_t T;
    int64_t L;
    char text[160];
} prep_ctx;

static const char *prep_text(prep_ctx *c) {
    if (c->fixed) return c->fixed;
    snprintf(c->text, sizeof c->text, "kv session prepare(T=%d) at L=%lld", (int)c->T, (long long)c->L);
    return c->text;
}

/* Step 2 of a packed prepare: the ring block (first prepare only), then one
 * reserve or resize of the packed block. All or nothing. */
static og_status pack_prepare(og_kv_session *s, int64_t need, prep_ctx *ctx) {
    kv_pack *pk = &s->pack;
    void *ring = NULL, *base = pk->base;
    og_status st = OG_OK;
    char where[320];
    if (pk->ring_bytes && !pk->ring) {
        st = s->alloc.alloc(s->alloc.ctx, pk->ring_bytes, &ring);
        if (st != OG_OK) {
            snprintf(where, sizeof where, "%s: ring block of %zu bytes", prep_text(ctx), pk->ring_bytes);
            return fail_with_last(s, st, where);
        }
    }
    size_t asked = pk->asked;
    if (pk->row_bytes && pk->rows < need) {
        asked = pack_ask(s, need);
        if (!base) {
            st = s->alloc.reserve(s->alloc.ctx, pk->max_bytes, asked, &base);
        } else {
            st = s->alloc.resize(s->alloc.ctx, base, asked);
        }
        if (st != OG_OK) {
            snprintf(where, sizeof where, "%s: packed flat rows: %s of %zu bytes (%lld rows of %lld bytes) of %zu",
                     prep_text(ctx), pk->base ? "resize" : "reserve", asked, (long long)need, (long long)pk->row_bytes,
                     pk->max_bytes);
            st = fail_with_last(s, st, where);
            if (ring) s->alloc.free(s->alloc.ctx, ring);
            return st;
        }
    }
    /* Nothing can fail from here on. */
    if (ring) pk->ring = ring;
    if (asked != pk->asked) {
        if (pk->base) {
            for (int32_t i = 0; i < s->cfg.n_layers; i++) s->growth_count += s->layers[i].policy == OG_KV_FLAT;
        }
        pk->base = base;
        pk->asked = asked;
        pk->rows = pack_rows_in(s, asked);
        if (pk->moved) s->rebinds++;
        pk->moved = false;
    }
    pack_bind(s);
    return OG_OK;
}

/* Undoes step 2 of a dense prepare: frees every new block. */
static void rollback_fresh(og_kv_session *s) {
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        kv_storage *f = &s->fresh[i];
        if (f->k) s->alloc.free(s->alloc.ctx, f->k);
        if (f->v) s->alloc.free(s->alloc.ctx, f->v);
        *f = (kv_storage){0};
    }
}

/* Steps 2-4 of a dense prepare for `length` positions (a flat layer holds
 * them, a ring layer its slots): new blocks, copies of the committed
 * prefixes, the swap. All or nothing. */
static og_status dense_prepare(og_kv_session *s, int32_t T, int64_t length, prep_ctx *ctx) {
    const og_kv_config *cfg = &s->cfg;
    /* 2. Allocate every new block before anything else of the session changes. */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &s->layers[i];
        const int64_t have = s->store[i].rows, need = l->policy == OG_KV_RING ? og_kv_layer_slots(cfg, l) : length;
        if (have >= need) continue;
        int64_t rows = l->policy == OG_KV_RING ? need : flat_grow_rows(cfg, have, T, need);
        size_t bytes = (size_t)(rows * og_kv_row_bytes(cfg, l)); /* fits: checked by size_overflow */
        kv_storage *f = &s->fresh[i];
        og_status st = s->alloc.alloc(s->alloc.ctx, bytes, &f->k);
        if (st == OG_OK) st = s->alloc.alloc(s->alloc.ctx, bytes, &f->v);
        if (st != OG_OK) {
            char where[320];
            snprintf(where, sizeof where, "%s: layer %d (layer_id %d) %lld rows (%zu bytes each for k and v)",
                     prep_text(ctx), (int)i, (int)l->layer_id, (long long)rows, bytes);
            st = fail_with_last(s, st, where);
            rollback_fresh(s);
            return st;
        }
        f->rows = rows;
    }

    /* 3. Copy the committed prefix of every layer that moves into its new block. */
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        if (!s->fresh[i].k || !s->store[i].k) continue;
        int64_t kept = s->length < s->store[i].rows ? s->length : s->store[i].rows;
        size_t bytes = (size_t)(kept * og_kv_row_bytes(cfg, &s->layers[i]));
        og_status st = s->alloc.copy(s->alloc.ctx, s->fresh[i].k, s->store[i].k, bytes);
        if (st == OG_OK) st = s->alloc.copy(s->alloc.ctx, s->fresh[i].v, s->store[i].v, bytes);
        if (st != OG_OK) {
            char where[240];
            snprintf(where, sizeof where, "%s: copying %lld rows of layer %d (layer_id %d)", prep_text(ctx),
                     (long long)kept, (int)i, (int)s->layers[i].layer_id);
            st = fail_with_last(s, st, where);
            rollback_fresh(s);
            return st;
        }
    }

    /* 4. Swap: nothing can fail from here on. The replaced blocks stay (in
     * s->before) until the step commits or aborts, so a rollback can restore
     * them. */
    int moved = 0;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        if (!s->fresh[i].k) continue;
        if (s->store[i].k) {
            s->growth_count++;
            moved = 1;
        }
        s->store[i] = s->fresh[i];
        s->fresh[i] = (kv_storage){0};
    }
    if (moved) s->rebinds++;
    return OG_OK;
}

og_status og_kv_session_prepare(og_kv_session *s, int32_t T) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_prepare: session is NULL");
    const og_kv_config *cfg = &s->cfg;
    prep_ctx ctx = {.T = T, .L = s->length};
    if (s->prepared)
        return og_errbuf_set(&s->err, OG_ERR_STATE, "%s: a step of T=%d is already prepared (commit or abort it)",
                             prep_text(&ctx), (int)s->prepared);
    if (T < 1) return og_errbuf_set(&s->err, OG_ERR_INVALID_ARGUMENT, "%s: T must be >= 1", prep_text(&ctx));
    if (T > cfg->max_write)
        return og_errbuf_set(&s->err, OG_ERR_WRITE_TOO_WIDE, "%s: T exceeds max_write %d", prep_text(&ctx),
                             (int)cfg->max_write);
    if (s->length > cfg->max_capacity - T)
        return og_errbuf_set(&s->err, OG_ERR_CAPACITY, "%s: L + T exceeds max_capacity %lld", prep_text(&ctx),
                             (long long)cfg->max_capacity);

    /* 1. The checks above are every layer's plan's (og_kv_plan_layer refuses
     * nothing else), so no plan is made here: og_kv_session_plan makes one
     * when asked. 2.-4. Allocate or grow storage, all or nothing. */
    if (s->packed) {
        s->pack_before.base = s->pack.base;
        s->pack_before.ring = s->pack.ring;
        s->pack_before.asked = s->pack.asked;
        s->pack_before.rows = s->pack.rows;
        s->pack_before.moved = s->pack.moved;
    } else {
        memcpy(s->before, s->store, (size_t)cfg->n_layers * sizeof *s->before);
    }
    s->growth_before = s->growth_count;
    s->rebinds_before = s->rebinds;
    og_status st = s->packed ? pack_prepare(s, s->length + T, &ctx) : dense_prepare(s, T, s->length + T, &ctx);
    if (st != OG_OK) return st;
    s->prepared = T;
    return OG_OK;
}
/* Frees the dense blocks the prepared step replaced (kept for a rollback). */
static void free_replaced(og_kv_session *s) {
    if (s->packed) return;
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        if (s->before[i].k && s->before[i].k != s->store[i].k) {
            s->alloc.free(s->alloc.ctx, s->before[i].k);
            s->alloc.free(s->alloc.ctx, s->before[i].v);
        }
        s->before[i] = s->store[i];
    }
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
    free_replaced(s);
    s->length += T;
    s->steps++;
    s->prepared = 0;
    s->st.cur ^= 1; /* the copy the step wrote is the committed state now */
    return OG_OK;
}

void og_kv_session_abort(og_kv_session *s) {
    if (!s || !s->prepared) return;
    free_replaced(s);
    s->prepared = 0;
}

void og_kv_session_rollback(og_kv_session *s) {
    if (!s || !s->prepared) return;
    if (s->packed) {
        kv_pack *pk = &s->pack;
        if (pk->ring && !s->pack_before.ring) {
            s->alloc.free(s->alloc.ctx, pk->ring);
            pk->ring = NULL;
        }
        if (pk->base && !s->pack_before.base) {
            s->alloc.free(s->alloc.ctx, pk->base);
            pk->base = NULL;
            pk->asked = 0;
            pk->rows = 0;
        } else if (pk->base && pk->asked != s->pack_before.asked &&
                   s->alloc.resize(s->alloc.ctx, pk->base, s->pack_before.asked) == OG_OK) {
            /* a shrink that fails leaves the block backed further: harmless */
            pk->asked = s->pack_before.asked;
            pk->rows = s->pack_before.rows;
        }
        pk->moved = s->pack_before.moved;
        if (pk->base || pk->ring) pack_bind(s);
        for (int32_t i = 0; i < s->cfg.n_layers; i++) {
            const bool flat = s->layers[i].policy == OG_KV_FLAT;
            if (!(flat ? pk->base : pk->ring)) s->store[i] = (kv_storage){0};
        }
    } else {
        for (int32_t i = 0; i < s->cfg.n_layers; i++) {
            if (s->store[i].k == s->before[i].k) continue;
            s->alloc.free(s->alloc.ctx, s->store[i].k);
            s->alloc.free(s->alloc.ctx, s->store[i].v);
            s->store[i] = s->before[i];
        }
    }
    s->growth_count = s->growth_before;
    s->rebinds = s->rebinds_before;
    s->prepared = 0;
}

og_status og_kv_session_plan(const og_kv_session *s, int32_t index, og_kv_plan *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_plan: NULL argument");
    if (index < 0 || index >= s->cfg.n_layers)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_plan: layer index %d out of [0, %d)", (int)index,
                            (int)s->cfg.n_layers);
    if (!s->prepared) return og_set_error(OG_ERR_STATE, "og_kv_session_plan: no step is prepared");
    return og_kv_plan_layer(&s->cfg, &s->layers[index], s->length, s->prepared, out);
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
        .row_stride = s->packed && l->policy == OG_KV_FLAT
                          ? s->pack.row_bytes / (int64_t)og_dtype_size(s->cfg.kv_dtype)
                          : 0,
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
        if (!s->packed) m.bytes_allocated += 2 * rows * row;
        m.bytes_live += 2 * live * row;
    }
    if (s->packed) {
        if (s->pack.base) m.bytes_allocated += (int64_t)backed_size(s->pack.asked, s->alloc.granularity);
        if (s->pack.ring) m.bytes_allocated += (int64_t)s->pack.ring_bytes;
        m.bytes_shared = (int64_t)s->pack.shared;
    }
    m.n_states = s->cfg.n_states;
    m.bytes_state = (int64_t)((s->st.block ? 2 : 0) + (s->st.checkpoint ? 1 : 0)) * (int64_t)s->st.half;
    m.bytes_allocated += m.bytes_state;
    if (s->length > 0) m.bytes_live += (int64_t)s->st.half;
    m.growth_count = s->growth_count;
    m.rebinds = s->rebinds;
    m.graph_captures = s->graph_captures;
    m.steps = s->steps;
    *out = m;
    return OG_OK;
}

/* Capacity of a packed session: the packed block may back whatever the
 * budget (plus what it backs already) holds in whole granules, the ring
 * block is taken once. See og_kv_session_capacity. */
static void capacity_packed(const og_kv_session *s, int64_t budget_bytes, og_kv_capacity *out) {
    const og_kv_config *cfg = &s->cfg;
    const kv_pack *pk = &s->pack;
    const size_t g = s->alloc.granularity;
    const int64_t first = pk->row_bytes ? (int64_t)backed_size(pack_ask(s, 1), g) : 0;
    const int64_t fresh = (int64_t)pk->ring_bytes + first;
    const bool allocated = pk->base || pk->ring;
    int64_t reach = s->length;
    if (allocated || fresh <= budget_bytes) {
        /* bytes the packed block may come to back */
        const int64_t held = pk->base ? (int64_t)backed_size(pk->asked, g) : 0;
        int64_t avail = !allocated ? budget_bytes - (int64_t)pk->ring_bytes
                        : budget_bytes > INT64_MAX - held ? INT64_MAX
                                                          : budget_bytes + held;
        if (!pk->row_bytes) {
            reach = cfg->max_capacity;
        } else {
            if (g) avail = avail / (int64_t)g * (int64_t)g;
            reach = avail / pk->row_bytes;
            if (reach > cfg->max_capacity) reach = cfg->max_capacity;
            if (reach < pk->rows) reach = pk->rows;
        }
        if (reach < s->length) reach = s->length;
    }
    out->tokens_reachable = reach - s->length;
    out->fresh_session_bytes = fresh + 2 * (int64_t)s->st.half;
    out->fresh_sessions = out->fresh_session_bytes > 0 ? budget_bytes / out->fresh_session_bytes : INT64_MAX;
    out->bytes_per_token = pk->row_bytes;
}

/* Capacity estimate. Assumes steps no wider than initial_capacity (decode).
 * Packed: a new session's first step (one token) takes the ring block and
 * one packed row's backing; the packed block then grows to any row count
 * whose backing (rounded up to the granularity) fits in the budget plus
 * what it backs already; no peaks, nothing moves.
 * Dense: tokens_reachable: starting from the flat rows held now (or, for a
 * session with no storage yet, after a first step that allocates ring R rows
 * plus initial_capacity flat rows out of the budget), the flat layers double
 * towards max_capacity; a growth to `next` rows moves the layers while the
 * old block is still held, so it needs next * bytes_per_token of budget at
 * its peak, after which the budget shrinks by (next - rows) *
 * bytes_per_token. The result is the capacity reached minus L (a session
 * without flat layers is bounded by max_capacity alone).
 * fresh_sessions: budget / fresh_session_bytes, counted independently of
 * tokens_reachable (the budget spent one way or the other). */
og_status og_kv_session_capacity(const og_kv_session *s, int64_t budget_bytes, og_kv_capacity *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_capacity: NULL argument");
    if (budget_bytes < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_capacity: budget %lld bytes is negative",
                            (long long)budget_bytes);
    if (s->packed) {
        capacity_packed(s, budget_bytes, out);
        return OG_OK;
    }
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
            if (next * per_token > budget) break;
            budget -= (next - rows) * per_token;
            rows = next;
        }
        reach = rows;
    }
    out->tokens_reachable = reach - s->length;
    out->fresh_session_bytes = fresh + 2 * (int64_t)s->st.half;
    out->fresh_sessions = out->fresh_session_bytes > 0 ? budget_bytes / out->fresh_session_bytes : INT64_MAX;
    out->bytes_per_token = per_token;
    return OG_OK;
}

/* ------------------------------------------------------------ fork */

int64_t og_kv_session_fork_floor(const og_kv_session *s) {
    if (!s) return 0;
    int64_t floor = 0;
    for (int32_t i = 0; i < s->cfg.n_layers; i++) {
        const og_kv_layer_config *l = &s->layers[i];
        if (l->policy != OG_KV_RING) continue;
        const int64_t R = og_kv_layer_slots(&s->cfg, l);
        /* the ring holds positions [L - R, L); a session at length a reads
         * back to a - W + 1 */
        if (s->length > R && s->length - R + l->window - 1 > floor) floor = s->length - R + l->window - 1;
    }
    return floor;
}

const og_kv_allocator *og_kv_session_allocator(const og_kv_session *s) { return s ? &s->alloc : NULL; }

/* Gives the child c (packed, new) the parent's rows below a: the ring block
 * copied, the flat block shared where the allocators can (whole granules
 * below a * P; the granule holding row a is copied), else copied. */
static og_status fork_packed(og_kv_session *c, og_kv_session *p, int64_t a) {
    kv_pack *pk = &c->pack;
    og_status st = OG_OK;
    if (pk->ring_bytes) {
        st = c->alloc.alloc(c->alloc.ctx, pk->ring_bytes, &pk->ring);
        if (st == OG_OK) st = c->alloc.copy(c->alloc.ctx, pk->ring, p->pack.ring, pk->ring_bytes);
        if (st != OG_OK) return fail_with_last(c, st, "kv session fork: ring block");
    }
    if (!pk->row_bytes) return OG_OK;
    const size_t live = (size_t)a * (size_t)pk->row_bytes, asked = pack_ask(c, a);
    const size_t g = c->alloc.granularity;
    size_t shared = 0;
    if (c->alloc.share && c->alloc.share == p->alloc.share && g) {
        shared = live / g * g;
        st = c->alloc.share(c->alloc.ctx, p->alloc.ctx, p->pack.base, shared, pk->max_bytes, asked, &pk->base);
    } else {
        st = c->alloc.reserve(c->alloc.ctx, pk->max_bytes, asked, &pk->base);
    }
    if (st == OG_OK && live > shared)
        st = c->alloc.copy(c->alloc.ctx, (unsigned char *)pk->base + shared,
                           (const unsigned char *)p->pack.base + shared, live - shared);
    if (st != OG_OK) return fail_with_last(c, st, "kv session fork: packed flat rows");
    pk->asked = asked;
    pk->rows = pack_rows_in(c, asked);
    pk->shared = pk->frozen = shared;
    if (shared > p->pack.frozen) p->pack.frozen = shared;
    return OG_OK;
}

/* Copies the parent's rows below a into new dense blocks of the child. */
static og_status fork_dense(og_kv_session *c, const og_kv_session *p, int64_t a) {
    const og_kv_config *cfg = &c->cfg;
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        const og_kv_layer_config *l = &c->layers[i];
        const bool ring = l->policy == OG_KV_RING;
        const int64_t rows = ring ? og_kv_layer_slots(cfg, l) : flat_grow_rows(cfg, 0, 1, a);
        const int64_t row = og_kv_row_bytes(cfg, l);
        const size_t bytes = (size_t)(rows * row), copied = (size_t)((ring ? rows : a) * row);
        kv_storage *d = &c->store[i];
        og_status st = c->alloc.alloc(c->alloc.ctx, bytes, &d->k);
        if (st == OG_OK) st = c->alloc.alloc(c->alloc.ctx, bytes, &d->v);
        if (st == OG_OK) d->rows = rows;
        if (st == OG_OK) st = c->alloc.copy(c->alloc.ctx, d->k, p->store[i].k, copied);
        if (st == OG_OK) st = c->alloc.copy(c->alloc.ctx, d->v, p->store[i].v, copied);
        if (st != OG_OK) {
            char where[160];
            snprintf(where, sizeof where, "kv session fork: layer %d (layer_id %d)", (int)i, (int)l->layer_id);
            return fail_with_last(c, st, where);
        }
    }
    return OG_OK;
}

og_status og_kv_session_fork(og_kv_session *parent, int64_t at_length, const og_kv_allocator *alloc,
                             og_kv_session **out) {
    if (!parent || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_fork: NULL argument");
    *out = NULL;
    if (parent->prepared)
        return og_set_error(OG_ERR_STATE, "og_kv_session_fork: the parent has a step of T=%d prepared",
                            (int)parent->prepared);
    if (at_length < 0 || at_length > parent->length)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_fork: at_length %lld is outside [0, %lld]",
                            (long long)at_length, (long long)parent->length);
    const int64_t floor = og_kv_session_fork_floor(parent);
    if (at_length < floor) {
        for (int32_t i = 0; i < parent->cfg.n_layers; i++) {
            const og_kv_layer_config *l = &parent->layers[i];
            const int64_t R = og_kv_layer_slots(&parent->cfg, l);
            if (l->policy == OG_KV_RING && parent->length - R + l->window - 1 > at_length)
                return og_set_error(OG_ERR_UNSUPPORTED,
                                    "og_kv_session_fork: at_length %lld: ring layer %d (layer_id %d, window %d) keeps "
                                    "only positions [%lld, %lld); a fork needs the %d before it (fork at >= %lld)",
                                    (long long)at_length, (int)i, (int)l->layer_id, (int)l->window,
                                    (long long)(parent->length - R), (long long)parent->length, (int)l->window - 1,
                                    (long long)floor);
        }
    }
    const void *state_src = NULL; /* the parent's state at at_length */
    if (parent->cfg.n_states > 0 && at_length > 0) {
        if (at_length == parent->length) {
            state_src = state_half(parent, parent->st.cur);
        } else if (at_length == parent->st.checkpoint_len) {
            state_src = parent->st.checkpoint;
        } else {
            const og_kv_state_config *st0 = &parent->states[0];
            char also[64] = "";
            if (parent->st.checkpoint_len >= 0)
                snprintf(also, sizeof also, ", its checkpoint's %lld", (long long)parent->st.checkpoint_len);
            return og_set_error(OG_ERR_UNSUPPORTED,
                                "og_kv_session_fork: at_length %lld: state layer_id %d (\"%s\") holds no history, only "
                                "the state at the session's length; a fork can start at 0, at the length %lld%s "
                                "(og_kv_session_checkpoint keeps another)",
                                (long long)at_length, (int)st0->layer_id, st0->name, (long long)parent->length, also);
        }
    }
    const og_kv_allocator *a = alloc ? alloc : &parent->alloc;
    if (!a->reserve != !parent->alloc.reserve)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_kv_session_fork: the child's allocator %s in place and the parent's %s",
                            a->reserve ? "grows" : "does not grow", parent->alloc.reserve ? "does" : "does not");
    og_kv_session *c = NULL;
    og_status st = og_kv_session_create(&parent->cfg, a, &c);
    if (st != OG_OK) return st;
    if (at_length > 0) {
        st = c->packed ? fork_packed(c, parent, at_length) : fork_dense(c, parent, at_length);
        if (st == OG_OK && state_src) {
            st = c->alloc.copy(c->alloc.ctx, state_half(c, 0), state_src, c->st.half);
            if (st != OG_OK) st = fail_with_last(c, st, "kv session fork: states");
        }
        if (st != OG_OK) {
            og_set_error(st, "%s", c->err.msg);
            og_kv_session_destroy(c);
            return st;
        }
        if (c->packed) pack_bind(c);
    }
    c->length = at_length;
    *out = c;
    return OG_OK;
}

/* ------------------------------------------------------------ states */

og_status og_kv_session_state_view(const og_kv_session *s, int32_t index, og_kv_state_view *out) {
    if (!s || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_state_view: NULL argument");
    if (index < 0 || index >= s->cfg.n_states)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_state_view: state index %d out of [0, %d)",
                            (int)index, (int)s->cfg.n_states);
    const og_kv_state_config *c = &s->states[index];
    *out = (og_kv_state_view){
        .layer_id = c->layer_id,
        .name = c->name,
        .dtype = c->dtype,
        .rank = c->rank,
        .bytes = og_kv_state_bytes(c),
        .length = s->length,
        .read = state_half(s, s->st.cur) + s->st.offset[index],
        .write = state_half(s, s->st.cur ^ 1) + s->st.offset[index],
    };
    memcpy(out->shape, c->shape, sizeof out->shape);
    return OG_OK;
}

og_status og_kv_session_checkpoint(og_kv_session *s) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_checkpoint: session is NULL");
    if (s->prepared)
        return og_errbuf_set(&s->err, OG_ERR_STATE, "kv session checkpoint at L=%lld: a step of T=%d is prepared",
                             (long long)s->length, (int)s->prepared);
    if (!s->st.half) return OG_OK;
    if (s->length > 0) {
        void *cp = s->st.checkpoint;
        og_status st = cp ? OG_OK : s->alloc.alloc(s->alloc.ctx, s->st.half, &cp);
        if (st != OG_OK) return fail_with_last(s, st, "kv session checkpoint: a copy of the states");
        s->st.checkpoint = cp;
        s->st.checkpoint_len = -1; /* a failed copy leaves no checkpoint rather than a wrong one */
        st = s->alloc.copy(s->alloc.ctx, cp, state_half(s, s->st.cur), s->st.half);
        if (st != OG_OK) return fail_with_last(s, st, "kv session checkpoint: copying the states");
    }
    s->st.checkpoint_len = s->length;
    return OG_OK;
}

int64_t og_kv_session_checkpoint_length(const og_kv_session *s) {
    return s && s->st.half ? s->st.checkpoint_len : -1;
}

int64_t og_kv_session_fork_point(const og_kv_session *s, int64_t at_most) {
    if (!s || at_most < 0) return -1;
    if (at_most > s->length) at_most = s->length;
    const int64_t floor = og_kv_session_fork_floor(s);
    if (!s->st.half) return at_most >= floor ? at_most : -1;
    int64_t best = floor == 0 ? 0 : -1;
    if (s->length <= at_most && s->length >= floor) best = s->length;
    const int64_t cp = s->st.checkpoint_len;
    if (cp >= 0 && cp <= at_most && cp >= floor && cp > best) best = cp;
    return best;
}

/* Copies the committed copy of state i between the storage and the host. */
static og_status state_copy(const og_kv_session *s, int32_t i, void *host, bool to_host) {
    if (!s || !host || i < 0 || i >= s->cfg.n_states)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv session state: bad argument");
    unsigned char *dev = state_half(s, s->st.cur) + s->st.offset[i];
    const size_t bytes = (size_t)og_kv_state_bytes(&s->states[i]);
    if (to_host && s->alloc.to_host) return s->alloc.to_host(s->alloc.ctx, host, bytes, dev, bytes, bytes, 1);
    if (!to_host && s->alloc.from_host) return s->alloc.from_host(s->alloc.ctx, dev, bytes, host, bytes, bytes, 1);
    if (to_host) memcpy(host, dev, bytes);
    else memcpy(dev, host, bytes);
    return OG_OK;
}

og_status og_kv_session_state_to_host(const og_kv_session *s, int32_t index, void *dst) {
    return state_copy(s, index, dst, true);
}

og_status og_kv_session_state_from_host(og_kv_session *s, int32_t index, const void *src) {
    return state_copy(s, index, (void *)src, false);
}

/* ------------------------------------------------- rows to and from the host */

/* The slot runs (at most two) that hold positions [pos0, pos0 + n) of layer
 * i; false when the storage does not hold them. */
static bool rows_runs(const og_kv_session *s, int32_t i, int64_t pos0, int64_t n, og_kv_run run[2], int *n_run) {
    const og_kv_layer_config *l = &s->layers[i];
    const int64_t rows = s->store[i].rows;
    *n_run = 0;
    if (pos0 < 0 || n < 0) return false;
    if (n == 0) return true;
    if (!s->store[i].k) return false;
    if (l->policy == OG_KV_FLAT) {
        if (pos0 > rows - n) return false;
        run[0] = (og_kv_run){pos0, pos0, n};
        *n_run = 1;
        return true;
    }
    if (n > rows) return false;
    const int64_t slot = pos0 % rows, first = n < rows - slot ? n : rows - slot;
    run[0] = (og_kv_run){slot, pos0, first};
    run[1] = (og_kv_run){0, pos0 + first, n - first};
    *n_run = n > first ? 2 : 1;
    return true;
}

/* Copies positions [pos0, pos0 + n) of layer i's k (part 0) or v (part 1)
 * between the storage and host memory [n, Hkv, D]; to_host picks the way. */
static og_status rows_copy(const og_kv_session *s, int32_t i, int part, int64_t pos0, int64_t n, void *host,
                           bool to_host) {
    og_kv_run run[2];
    int n_run = 0;
    if (!s || !host || i < 0 || i >= s->cfg.n_layers || (part != 0 && part != 1))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv session rows: bad argument");
    if (!rows_runs(s, i, pos0, n, run, &n_run))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv session rows: positions [%lld, %lld) of layer %d are not held",
                            (long long)pos0, (long long)(pos0 + n), (int)i);
    og_kv_layer_view v;
    og_status st = og_kv_session_layer_view(s, i, &v);
    if (st != OG_OK) return st;
    const size_t width = (size_t)og_kv_row_bytes(&s->cfg, &s->layers[i]);
    const size_t pitch = (size_t)og_kv_layer_view_row_stride(&v) * og_dtype_size(v.dtype);
    unsigned char *base = part ? v.v : v.k, *h = host;
    for (int r = 0; r < n_run && st == OG_OK; r++) {
        unsigned char *dev = base + (size_t)run[r].slot * pitch, *hp = h + (size_t)(run[r].pos - pos0) * width;
        const size_t count = (size_t)run[r].count;
        if (to_host && s->alloc.to_host) {
            st = s->alloc.to_host(s->alloc.ctx, hp, width, dev, pitch, width, count);
        } else if (!to_host && s->alloc.from_host) {
            st = s->alloc.from_host(s->alloc.ctx, dev, pitch, hp, width, width, count);
        } else if (pitch == width) {
            if (to_host) memcpy(hp, dev, count * width);
            else memcpy(dev, hp, count * width);
        } else {
            for (size_t k = 0; k < count; k++) {
                if (to_host) memcpy(hp + k * width, dev + k * pitch, width);
                else memcpy(dev + k * pitch, hp + k * width, width);
            }
        }
    }
    return st;
}

bool og_kv_session_rows_in_host(const og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                unsigned char **rows, size_t *pitch) {
    og_kv_run run[2];
    int n_run = 0;
    if (!s || !rows || !pitch || index < 0 || index >= s->cfg.n_layers || (part != 0 && part != 1) || n < 1 ||
        s->alloc.to_host || s->alloc.from_host || !rows_runs(s, index, pos0, n, run, &n_run) || n_run != 1)
        return false;
    og_kv_layer_view v;
    if (og_kv_session_layer_view(s, index, &v) != OG_OK) return false;
    *pitch = (size_t)og_kv_layer_view_row_stride(&v) * og_dtype_size(v.dtype);
    *rows = (unsigned char *)(part ? v.v : v.k) + (size_t)run[0].slot * *pitch;
    return true;
}

og_status og_kv_session_rows_to_host(const og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                     void *dst) {
    return rows_copy(s, index, part, pos0, n, dst, true);
}

og_status og_kv_session_rows_from_host(og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                       const void *src) {
    return rows_copy(s, index, part, pos0, n, (void *)src, false);
}

og_status og_kv_session_restore_begin(og_kv_session *s, int64_t length) {
    if (!s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_session_restore_begin: session is NULL");
    if (s->prepared || s->length)
        return og_errbuf_set(&s->err, OG_ERR_STATE, "kv session restore: the session %s",
                             s->prepared ? "has a step prepared" : "is not empty (reset it first)");
    if (length < 0 || length > s->cfg.max_capacity)
        return og_errbuf_set(&s->err, OG_ERR_CAPACITY, "kv session restore: length %lld is outside [0, %lld]",
                             (long long)length, (long long)s->cfg.max_capacity);
    if (length == 0) return OG_OK;
    if (s->packed && s->pack.frozen) pack_release(s);
    prep_ctx ctx = {.fixed = "kv session restore"};
    if (s->packed) return pack_prepare(s, length, &ctx);
    return dense_prepare(s, 1, length, &ctx);
}

void og_kv_session_restore_end(og_kv_session *s, int64_t length) {
    if (s) s->length = length;
}
