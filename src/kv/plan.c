/* The KV planner (see plan.h).
 *
 * Letters: T step width, L committed length, W ring window, R ring slots. */
#include "kv/plan.h"

#include "core/core.h"

/* Splits count consecutive positions starting at pos into slot runs of a
 * slot space of size `slots` that wraps (ring) or not (flat, wrap = 0).
 * Returns the number of runs (1 or 2). */
static int split_runs(int64_t pos, int64_t count, int64_t slots, int wrap, og_kv_run runs[2]) {
    int64_t first = wrap ? pos % slots : pos;
    int64_t head = wrap && first + count > slots ? slots - first : count;
    runs[0] = (og_kv_run){first, pos, head};
    if (head == count) return 1;
    runs[1] = (og_kv_run){0, pos + head, count - head};
    return 2;
}

og_status og_kv_plan_layer(const og_kv_config *cfg, const og_kv_layer_config *layer, int64_t L,
                           int32_t T, og_kv_plan *out) {
    if (!cfg || !layer || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_plan_layer: NULL argument");
    if (T < 1) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv plan layer_id %d: step width T = %d must be >= 1",
                                   (int)layer->layer_id, (int)T);
    if (L < 0) return og_set_error(OG_ERR_INVALID_ARGUMENT, "kv plan layer_id %d: length L = %lld is negative",
                                   (int)layer->layer_id, (long long)L);
    if (T > cfg->max_write)
        return og_set_error(OG_ERR_WRITE_TOO_WIDE, "kv plan layer_id %d: step of T = %d tokens exceeds max_write %d",
                            (int)layer->layer_id, (int)T, (int)cfg->max_write);
    int ring = layer->policy == OG_KV_RING;
    if (!ring && L > cfg->max_capacity - T)
        return og_set_error(OG_ERR_CAPACITY,
                            "kv plan layer_id %d: L + T = %lld + %d exceeds max_capacity %lld",
                            (int)layer->layer_id, (long long)L, (int)T, (long long)cfg->max_capacity);

    og_kv_plan p = {0};
    p.length = L;
    p.width = T;
    p.policy = layer->policy;
    p.slots = og_kv_layer_slots(cfg, layer);
    p.rows_needed = ring ? p.slots : L + T;
    p.n_write = split_runs(L, T, p.slots, ring, p.write);
    /* The earliest query (position L) sees back to L - W + 1 on a ring layer. */
    int64_t first_key = ring ? L - layer->window + 1 : 0;
    if (first_key < 0) first_key = 0;
    p.n_read = split_runs(first_key, L + T - first_key, p.slots, ring, p.read);
    *out = p;
    return OG_OK;
}
