/* The prefix cache (og_prefix_cache in offgraph.h): idle sessions kept with
 * the tokens their KV holds, found again by the longest common prefix with
 * a new prompt, handed out as forks (og_session_fork), evicted least
 * recently used first under a memory budget.
 *
 * Keys: a prompt is cut into blocks of B tokens; block b's key is the hash
 * (cache/hash.h) of its tokens seeded with block b-1's key, so one key
 * names a whole prefix of b+1 blocks. Every entry puts the keys of its
 * whole blocks into one chained hash table. A lookup walks the prompt's
 * keys while some entry has them: the deepest one reached names the
 * entries sharing the most whole blocks with the prompt; their tokens are
 * compared (a hash collision never reuses a wrong row) and the common
 * prefix extended token by token past the last whole block. A prefix is
 * usable when it is at least the entry's fork floor (sliding-window layers
 * keep only their last positions) and leaves at least one prompt token to
 * feed; when the deepest entries' is not, shallower ones are tried. A
 * session with per-session state (a hybrid model's Gated DeltaNet layers)
 * holds that state only at its end and at its checkpoint
 * (og_session_checkpoint: the server takes one when a prompt has been read),
 * so its entry is reused at the longest of those within the common prefix.
 *
 * Charges: an entry counts its session's bytes_allocated (shared bytes
 * included, so the budget errs on the safe side). */
#include "cache/hash.h"
#include "exec/exec.h"
#include "kv/kv.h"

#include <pthread.h>
#include <string.h>

#define KEY_SEED 0x70726566ull

typedef struct entry entry;

typedef struct key_node {
    uint64_t key;
    entry *e;
    int64_t block; /* the key names blocks [0, block] of e's tokens */
    struct key_node *next;
} key_node;

struct entry {
    og_session *s; /* owned */
    og_model *m;
    int32_t *tokens; /* [n], owned */
    int64_t n, n_blocks, charge;
    key_node *nodes; /* [n_blocks], owned, linked into the table */
    entry *prev, *next; /* LRU list: head most recent */
};

struct og_prefix_cache {
    og_prefix_cache_params p;
    pthread_mutex_t lock;
    entry *head, *tail;
    key_node **buckets; /* [n_buckets] */
    size_t n_buckets, n_keys;
    og_prefix_cache_metrics metrics;
};

og_prefix_cache_params og_prefix_cache_default_params(void) {
    og_prefix_cache_params p = {.budget_bytes = (int64_t)1 << 30, .block_tokens = 64};
    return p;
}

og_status og_prefix_cache_create(const og_prefix_cache_params *params, og_prefix_cache **out) {
    if (!out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_prefix_cache_create: out is NULL");
    *out = NULL;
    og_prefix_cache_params p = params ? *params : og_prefix_cache_default_params();
    if (p.budget_bytes < 0 || p.block_tokens < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_prefix_cache_create: budget %lld bytes, blocks of %d tokens: %s",
                            (long long)p.budget_bytes, (int)p.block_tokens,
                            p.budget_bytes < 0 ? "a negative budget" : "blocks need at least one token");
    og_prefix_cache *c = og_calloc(1, sizeof *c);
    if (c) c->buckets = og_calloc(64, sizeof *c->buckets);
    if (!c || !c->buckets) {
        og_free(c);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_prefix_cache_create: no memory");
    }
    c->n_buckets = 64;
    c->p = p;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return OG_OK;
}

/* ------------------------------------------------------------ the table */

static size_t bucket_of(const og_prefix_cache *c, uint64_t key) { return (size_t)(key >> 7) & (c->n_buckets - 1); }

/* Doubles the table when it is full; keeps it as it is when memory is short. */
static void table_grow(og_prefix_cache *c) {
    if (c->n_keys < c->n_buckets) return;
    const size_t n = c->n_buckets * 2;
    key_node **b = og_calloc(n, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (key_node *k = c->buckets[i], *next; k; k = next) {
            next = k->next;
            const size_t j = (size_t)(k->key >> 7) & (n - 1);
            k->next = b[j];
            b[j] = k;
        }
    og_free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

static void table_remove(og_prefix_cache *c, key_node *node) {
    for (key_node **l = &c->buckets[bucket_of(c, node->key)]; *l; l = &(*l)->next)
        if (*l == node) {
            *l = node->next;
            c->n_keys--;
            return;
        }
}

/* Key of block b given the key of block b-1 (KEY_SEED for b = 0). */
static uint64_t block_key(uint64_t prev, const int32_t *block, int32_t B) {
    return og_hash64(block, (size_t)B * sizeof *block, prev);
}

/* ------------------------------------------------------------ entries */

static void lru_unlink(og_prefix_cache *c, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(og_prefix_cache *c, entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static void entry_free(entry *e) {
    if (!e) return;
    og_session_destroy(e->s);
    og_free(e->tokens);
    og_free(e->nodes);
    og_free(e);
}

/* Takes e out of the cache and frees it. */
static void entry_drop(og_prefix_cache *c, entry *e) {
    for (int64_t b = 0; b < e->n_blocks; b++) table_remove(c, &e->nodes[b]);
    lru_unlink(c, e);
    c->metrics.entries--;
    c->metrics.bytes_held -= e->charge;
    entry_free(e);
}

static void evict_to_budget(og_prefix_cache *c) {
    while (c->tail && c->metrics.bytes_held > c->p.budget_bytes) {
        entry_drop(c, c->tail);
        c->metrics.evictions++;
    }
}

/* Length of the common prefix of a [na] and b [nb]. */
static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    const int64_t n = na < nb ? na : nb;
    int64_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* True when session kv (holding o's tokens and more) can be forked at every
 * length o can: without states, when its fork floor is no higher; with
 * states (forks only at 0, the end and a checkpoint), at o's end and at
 * o's checkpoint. */
static bool serves(const og_kv_session *kv, const entry *o) {
    og_kv_metrics km;
    og_kv_session_metrics(kv, &km);
    if (!km.n_states) return og_kv_session_fork_floor(kv) <= og_kv_session_fork_floor(o->s->kv);
    const int64_t cp = og_kv_session_checkpoint_length(o->s->kv);
    return og_kv_session_fork_point(kv, o->n) == o->n && (cp < 0 || og_kv_session_fork_point(kv, cp) == cp);
}

og_status og_prefix_cache_put(og_prefix_cache *c, og_session *s, const int32_t *tokens, int64_t n) {
    if (!c || !s || (!tokens && n > 0) || n < 0) {
        og_session_destroy(s);
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_prefix_cache_put: NULL argument");
    }
    const int64_t length = og_session_length(s);
    if (n != length) {
        og_session_destroy(s);
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_prefix_cache_put: %lld tokens for a session of length %lld (they must be what it holds)",
                            (long long)n, (long long)length);
    }
    if (atomic_load(&s->stepping)) {
        og_session_destroy(s);
        return og_set_error(OG_ERR_STATE, "og_prefix_cache_put: the session is in a step");
    }
    const int32_t B = c->p.block_tokens;
    entry *e = og_calloc(1, sizeof *e);
    if (e) {
        e->s = s;
        e->m = s->m;
        e->n = n;
        e->n_blocks = n / B;
        e->tokens = og_malloc((size_t)(n > 0 ? n : 1) * sizeof *e->tokens);
        e->nodes = og_calloc((size_t)(e->n_blocks > 0 ? e->n_blocks : 1), sizeof *e->nodes);
    }
    if (!e || !e->tokens || !e->nodes) {
        if (e) entry_free(e);
        else og_session_destroy(s);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_prefix_cache_put: no memory");
    }
    if (n) memcpy(e->tokens, tokens, (size_t)n * sizeof *tokens);
    og_kv_metrics km;
    og_session_metrics(s, &km);
    e->charge = km.bytes_allocated;
    pthread_mutex_lock(&c->lock);
    c->metrics.puts++;
    /* entries this one serves as well (same model, their tokens a prefix of
     * these, their fork points all reachable here) go; an equal one stays
     * and this one goes */
    for (entry *o = c->head, *next; o; o = next) {
        next = o->next;
        if (o->m != e->m || o->n > n || common_prefix(o->tokens, o->n, tokens, n) < o->n) continue;
        if (o->n == n) {
            lru_unlink(c, o);
            lru_push_front(c, o);
            pthread_mutex_unlock(&c->lock);
            entry_free(e);
            return OG_OK;
        }
        if (serves(e->s->kv, o)) entry_drop(c, o);
    }
    uint64_t key = KEY_SEED;
    for (int64_t b = 0; b < e->n_blocks; b++) {
        key = block_key(key, tokens + b * B, B);
        key_node *k = &e->nodes[b];
        *k = (key_node){.key = key, .e = e, .block = b};
        table_grow(c);
        const size_t j = bucket_of(c, key);
        k->next = c->buckets[j];
        c->buckets[j] = k;
        c->n_keys++;
    }
    lru_push_front(c, e);
    c->metrics.entries++;
    c->metrics.bytes_held += e->charge;
    evict_to_budget(c);
    pthread_mutex_unlock(&c->lock);
    return OG_OK;
}

/* The usable prefix of entry e for tokens [n]: the longest length e can be
 * forked at (og_kv_session_fork_point: at or above its fork floor; with
 * states, its end or its checkpoint) within the common prefix and at most
 * n - 1; 0 when there is none. */
static int64_t usable(const entry *e, const int32_t *tokens, int64_t n) {
    int64_t k = common_prefix(e->tokens, e->n, tokens, n);
    if (k > n - 1) k = n - 1;
    if (k < 1) return 0;
    const int64_t p = og_kv_session_fork_point(e->s->kv, k);
    return p >= 1 ? p : 0;
}

og_status og_prefix_cache_lookup(og_prefix_cache *c, og_model *m, const int32_t *tokens, int64_t n, og_session **out,
                                 int64_t *reused) {
    if (out) *out = NULL;
    if (reused) *reused = 0;
    if (!c || !m || !out || !reused || (!tokens && n > 0) || n < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_prefix_cache_lookup: NULL argument");
    const int32_t B = c->p.block_tokens;
    const int64_t n_blocks = n / B;
    uint64_t *keys = og_malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *keys);
    if (!keys) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_prefix_cache_lookup: no memory");
    uint64_t key = KEY_SEED;
    for (int64_t b = 0; b < n_blocks; b++) keys[b] = key = block_key(key, tokens + b * B, B);
    pthread_mutex_lock(&c->lock);
    c->metrics.lookups++;
    /* the deepest block some entry of this model shares */
    int64_t depth = -1;
    for (int64_t b = 0; b < n_blocks; b++) {
        bool found = false;
        for (key_node *k = c->buckets[bucket_of(c, keys[b])]; k && !found; k = k->next)
            found = k->key == keys[b] && k->block == b && k->e->m == m;
        if (!found) break;
        depth = b;
    }
    entry *best = NULL;
    int64_t best_len = 0;
    for (int64_t b = depth; b >= 0 && !best; b--)
        for (key_node *k = c->buckets[bucket_of(c, keys[b])]; k; k = k->next) {
            if (k->key != keys[b] || k->block != b || k->e->m != m) continue;
            const int64_t len = usable(k->e, tokens, n);
            if (len > best_len) {
                best = k->e;
                best_len = len;
            }
        }
    og_status st = OG_OK;
    if (best) {
        og_session *f = NULL;
        st = og_session_fork(best->s, best_len, &f);
        if (st == OG_OK) {
            og_kv_metrics km;
            og_session_metrics(f, &km);
            c->metrics.hits++;
            c->metrics.tokens_reused += best_len;
            c->metrics.bytes_shared += km.bytes_shared;
            lru_unlink(c, best);
            lru_push_front(c, best);
            *out = f;
            *reused = best_len;
        }
    }
    pthread_mutex_unlock(&c->lock);
    og_free(keys);
    return st;
}

og_status og_prefix_cache_metrics_get(og_prefix_cache *c, og_prefix_cache_metrics *out) {
    if (!c || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_prefix_cache_metrics_get: NULL argument");
    pthread_mutex_lock(&c->lock);
    *out = c->metrics;
    pthread_mutex_unlock(&c->lock);
    return OG_OK;
}

int64_t og_prefix_cache_trim(og_prefix_cache *c, int64_t max_bytes) {
    if (!c) return 0;
    if (max_bytes < 0) max_bytes = 0;
    pthread_mutex_lock(&c->lock);
    while (c->tail && c->metrics.bytes_held > max_bytes) {
        entry_drop(c, c->tail);
        c->metrics.evictions++;
    }
    const int64_t held = c->metrics.bytes_held;
    pthread_mutex_unlock(&c->lock);
    return held;
}

void og_prefix_cache_clear(og_prefix_cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    while (c->head) entry_drop(c, c->head);
    pthread_mutex_unlock(&c->lock);
}

void og_prefix_cache_destroy(og_prefix_cache *c) {
    if (!c) return;
    og_prefix_cache_clear(c);
    pthread_mutex_destroy(&c->lock);
    og_free(c->buckets);
    og_free(c);
}
