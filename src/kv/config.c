/* The KV manifest: rule names, validation, and per-layer slot counts.
 *
 * Validation walks the rules in the order of og_kv_rule and stops at the
 * first broken one, so a config that breaks only rule X is always reported
 * as X. Every message starts "kv manifest rule <name>:" and names the layer
 * (index and layer_id) and the offending value. */
#include "kv/kv.h"
#include "core/kv_quant.h"

#include <stdio.h>
#include <string.h>

static const char *const k_rule_names[OG_KV_RULE_COUNT] = {
    [OG_KV_RULE_NONE] = "none",
    [OG_KV_RULE_VERSION] = "version",
    [OG_KV_RULE_KV_DTYPE] = "kv_dtype",
    [OG_KV_RULE_MAX_CAPACITY] = "max_capacity",
    [OG_KV_RULE_INITIAL_CAPACITY] = "initial_capacity",
    [OG_KV_RULE_MAX_WRITE] = "max_write",
    [OG_KV_RULE_LAYER_COUNT] = "layer_count",
    [OG_KV_RULE_LAYER_ID_RANGE] = "layer_id_range",
    [OG_KV_RULE_LAYER_ID_UNIQUE] = "layer_id_unique",
    [OG_KV_RULE_POLICY] = "policy",
    [OG_KV_RULE_RING_WINDOW] = "ring_window",
    [OG_KV_RULE_FLAT_WINDOW] = "flat_window",
    [OG_KV_RULE_KV_HEADS] = "kv_heads",
    [OG_KV_RULE_HEAD_DIM] = "head_dim",
    [OG_KV_RULE_SIZE_OVERFLOW] = "size_overflow",
    [OG_KV_RULE_STATE_OWNER] = "state_owner",
    [OG_KV_RULE_STATE_NAME] = "state_name",
    [OG_KV_RULE_STATE_DTYPE] = "state_dtype",
    [OG_KV_RULE_STATE_SHAPE] = "state_shape",
};

const char *og_kv_rule_name(og_kv_rule r) {
    return (unsigned)r < OG_KV_RULE_COUNT ? k_rule_names[r] : "unknown";
}

/* Dense rows are one row's own elements: Hkv * D, or for int8 and fp8 (one
 * byte an element) the Hkv * D quants, the Hkv f32 scales behind them and
 * the padding to 16 bytes (core/kv_quant.h). */
int64_t og_kv_layer_view_row_stride(const og_kv_layer_view *v) {
    if (v->row_stride > 0) return v->row_stride;
    return og_kv_dtype_quantized(v->dtype) ? og_kv_dtype_row_bytes(v->dtype, v->n_kv_heads, v->head_dim)
                                           : (int64_t)v->n_kv_heads * v->head_dim;
}

int64_t og_kv_layer_slots(const og_kv_config *cfg, const og_kv_layer_config *layer) {
    if (layer->policy == OG_KV_RING) return (int64_t)layer->window + cfg->max_write - 1;
    return cfg->max_capacity;
}

int64_t og_kv_row_bytes(const og_kv_config *cfg, const og_kv_layer_config *layer) {
    return og_kv_dtype_row_bytes(cfg->kv_dtype, layer->n_kv_heads, layer->head_dim);
}

/* Records the broken rule and formats "kv manifest rule <name>: <detail>". */
static og_status broken_rule(og_kv_rule *broken, og_kv_rule r, const char *fmt, ...) OG_PRINTF(3, 4);
static og_status broken_rule(og_kv_rule *broken, og_kv_rule r, const char *fmt, ...) {
    char detail[OG_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (broken) *broken = r;
    return og_set_error(OG_ERR_INVALID_CONFIG, "kv manifest rule %s: %s", og_kv_rule_name(r), detail);
}

/* Bytes of one layer's k and v storage at its full slot count, or false if
 * any product or the running total overflows int64. */
static bool layer_bytes_fit(const og_kv_config *cfg, const og_kv_layer_config *l, int64_t *total) {
    /* a row's bytes: Hkv * D * size, or Hkv * (D + 4) quantized and padded
     * to 16 (Hkv * (D + 4) < 2^63 - 16 for int32 sizes: og_kv_row_bytes cannot overflow) */
    const bool quant = og_kv_dtype_quantized(cfg->kv_dtype);
    int64_t slots = og_kv_layer_slots(cfg, l), b;
    if (quant) {
        b = og_kv_row_bytes(cfg, l);
        if (!og_mul_overflow_i64(b, slots, &b)) return false;
    } else {
        if (!og_mul_overflow_i64(slots, l->n_kv_heads, &b)) return false;
        if (!og_mul_overflow_i64(b, l->head_dim, &b)) return false;
        if (!og_mul_overflow_i64(b, (int64_t)og_dtype_size(cfg->kv_dtype), &b)) return false;
    }
    if (!og_mul_overflow_i64(b, 2, &b)) return false; /* k and v */
    return og_add_overflow_i64(*total, b, total);
}

int64_t og_kv_state_bytes(const og_kv_state_config *st) {
    int64_t b = (int64_t)og_dtype_size(st->dtype);
    for (int32_t d = 0; d < st->rank; d++) b *= st->shape[d]; /* fits: state_shape */
    return b;
}

/* The state rules, after every KV rule: total is the KV storage's bytes. */
static og_status validate_states(const og_kv_config *cfg, og_kv_rule *broken, int64_t total) {
    const og_kv_state_config *st = cfg->states;
    const int32_t n = cfg->n_states;
    for (int32_t i = 0; i < n; i++)
        if (st[i].layer_id < 0 || (cfg->n_model_layers > 0 && st[i].layer_id >= cfg->n_model_layers))
            return broken_rule(broken, OG_KV_RULE_STATE_OWNER, "state %d: layer_id %d out of range [0, %d)", (int)i,
                               (int)st[i].layer_id, cfg->n_model_layers > 0 ? (int)cfg->n_model_layers : INT32_MAX);
    for (int32_t i = 0; i < n; i++) {
        const size_t len = strnlen(st[i].name, OG_KV_STATE_NAME_CAP);
        if (len == 0 || len == OG_KV_STATE_NAME_CAP)
            return broken_rule(broken, OG_KV_RULE_STATE_NAME, "state %d (layer_id %d): the name must be 1 to %d characters",
                               (int)i, (int)st[i].layer_id, OG_KV_STATE_NAME_CAP - 1);
        for (int32_t j = 0; j < i; j++)
            if (st[j].layer_id == st[i].layer_id && !strcmp(st[j].name, st[i].name))
                return broken_rule(broken, OG_KV_RULE_STATE_NAME, "state %d: layer_id %d already has a state \"%s\" (state %d)",
                                   (int)i, (int)st[i].layer_id, st[i].name, (int)j);
    }
    for (int32_t i = 0; i < n; i++)
        if (st[i].dtype != OG_DTYPE_F32)
            return broken_rule(broken, OG_KV_RULE_STATE_DTYPE, "state %d (layer_id %d, \"%s\"): dtype %s must be f32",
                               (int)i, (int)st[i].layer_id, st[i].name, og_dtype_name(st[i].dtype));
    for (int32_t i = 0; i < n; i++) {
        bool ok = st[i].rank >= 1 && st[i].rank <= OG_KV_STATE_MAX_RANK;
        int64_t b = (int64_t)og_dtype_size(st[i].dtype);
        for (int32_t d = 0; ok && d < st[i].rank; d++)
            ok = st[i].shape[d] > 0 && og_mul_overflow_i64(b, st[i].shape[d], &b);
        /* two copies of every state, a checkpoint, and the KV storage */
        ok = ok && og_mul_overflow_i64(b, 3, &b) && og_add_overflow_i64(total, b, &total);
        if (!ok)
            return broken_rule(broken, OG_KV_RULE_STATE_SHAPE,
                               "state %d (layer_id %d, \"%s\"): rank %d must be 1 to %d with every dim > 0, and the "
                               "bytes (three copies, summed with the KV storage) must fit in 64 bits",
                               (int)i, (int)st[i].layer_id, st[i].name, (int)st[i].rank, OG_KV_STATE_MAX_RANK);
    }
    return OG_OK;
}

og_status og_kv_config_validate(const og_kv_config *cfg, og_kv_rule *broken) {
    if (broken) *broken = OG_KV_RULE_NONE;
    if (!cfg) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_kv_config_validate: cfg is NULL");

    if (cfg->version != OG_KV_MANIFEST_VERSION)
        return broken_rule(broken, OG_KV_RULE_VERSION, "version %d, this build reads version %d",
                           (int)cfg->version, OG_KV_MANIFEST_VERSION);
    if (cfg->kv_dtype != OG_DTYPE_BF16 && cfg->kv_dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(cfg->kv_dtype))
        return broken_rule(broken, OG_KV_RULE_KV_DTYPE, "kv_dtype %d (%s) must be bf16, f32, int8 or fp8",
                           (int)cfg->kv_dtype, og_dtype_name(cfg->kv_dtype));
    if (cfg->max_capacity <= 0)
        return broken_rule(broken, OG_KV_RULE_MAX_CAPACITY, "max_capacity %lld must be > 0",
                           (long long)cfg->max_capacity);
    if (cfg->initial_capacity <= 0 || cfg->initial_capacity > cfg->max_capacity)
        return broken_rule(broken, OG_KV_RULE_INITIAL_CAPACITY,
                           "initial_capacity %lld must be in [1, max_capacity %lld]",
                           (long long)cfg->initial_capacity, (long long)cfg->max_capacity);
    if (cfg->max_write < 1 || cfg->max_write > cfg->max_capacity)
        return broken_rule(broken, OG_KV_RULE_MAX_WRITE, "max_write %d must be in [1, max_capacity %lld]",
                           (int)cfg->max_write, (long long)cfg->max_capacity);
    if (cfg->n_layers < 0 || (cfg->n_layers > 0 && !cfg->layers) || (cfg->n_layers == 0 && cfg->n_states < 1) ||
        cfg->n_states < 0 || (cfg->n_states > 0 && !cfg->states))
        return broken_rule(broken, OG_KV_RULE_LAYER_COUNT,
                           "n_layers %d with layers %s, n_states %d with states %s: need >= 1 layer or state",
                           (int)cfg->n_layers, cfg->layers ? "set" : "NULL", (int)cfg->n_states,
                           cfg->states ? "set" : "NULL");

    const og_kv_layer_config *ls = cfg->layers;
    int32_t n = cfg->n_layers;
    for (int32_t i = 0; i < n; i++) {
        if (ls[i].layer_id < 0 || (cfg->n_model_layers > 0 && ls[i].layer_id >= cfg->n_model_layers))
            return broken_rule(broken, OG_KV_RULE_LAYER_ID_RANGE,
                               "layer %d: layer_id %d out of range [0, %d)", (int)i, (int)ls[i].layer_id,
                               cfg->n_model_layers > 0 ? (int)cfg->n_model_layers : INT32_MAX);
    }
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < i; j++)
            if (ls[i].layer_id == ls[j].layer_id)
                return broken_rule(broken, OG_KV_RULE_LAYER_ID_UNIQUE,
                                   "layer %d: layer_id %d already used by layer %d", (int)i,
                                   (int)ls[i].layer_id, (int)j);
    for (int32_t i = 0; i < n; i++)
        if (ls[i].policy != OG_KV_FLAT && ls[i].policy != OG_KV_RING)
            return broken_rule(broken, OG_KV_RULE_POLICY, "layer %d (layer_id %d): policy %d is neither flat nor ring",
                               (int)i, (int)ls[i].layer_id, (int)ls[i].policy);
    for (int32_t i = 0; i < n; i++)
        if (ls[i].policy == OG_KV_RING && ls[i].window <= 0)
            return broken_rule(broken, OG_KV_RULE_RING_WINDOW, "layer %d (layer_id %d): ring window %d must be > 0",
                               (int)i, (int)ls[i].layer_id, (int)ls[i].window);
    for (int32_t i = 0; i < n; i++)
        if (ls[i].policy == OG_KV_FLAT && ls[i].window != 0)
            return broken_rule(broken, OG_KV_RULE_FLAT_WINDOW, "layer %d (layer_id %d): flat window %d must be 0",
                               (int)i, (int)ls[i].layer_id, (int)ls[i].window);
    for (int32_t i = 0; i < n; i++)
        if (ls[i].n_kv_heads <= 0)
            return broken_rule(broken, OG_KV_RULE_KV_HEADS, "layer %d (layer_id %d): n_kv_heads %d must be > 0",
                               (int)i, (int)ls[i].layer_id, (int)ls[i].n_kv_heads);
    for (int32_t i = 0; i < n; i++)
        if (ls[i].head_dim <= 0)
            return broken_rule(broken, OG_KV_RULE_HEAD_DIM, "layer %d (layer_id %d): head_dim %d must be > 0",
                               (int)i, (int)ls[i].layer_id, (int)ls[i].head_dim);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        if (!layer_bytes_fit(cfg, &ls[i], &total))
            return broken_rule(broken, OG_KV_RULE_SIZE_OVERFLOW,
                               "layer %d (layer_id %d): %lld slots x %d heads x %d dims of %s (k and v, "
                               "summed over layers) overflows 64 bits",
                               (int)i, (int)ls[i].layer_id, (long long)og_kv_layer_slots(cfg, &ls[i]),
                               (int)ls[i].n_kv_heads, (int)ls[i].head_dim, og_dtype_name(cfg->kv_dtype));
    return validate_states(cfg, broken, total);
}
