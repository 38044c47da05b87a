/* Validation of a program file: the header, then the manifest section by
 * section (model, kv, tensors, inputs, instructions, outputs, tokenizer).
 * Every refusal is OG_ERR_FORMAT with "program rule <name>: <what, where>"
 * and the rule recorded for og_program_last_rule. */
#include "program/program_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const k_rule_names[OG_PROGRAM_RULE_COUNT] = {
    [OG_PROGRAM_RULE_NONE] = "none",
    [OG_PROGRAM_RULE_MAGIC] = "magic",
    [OG_PROGRAM_RULE_VERSION] = "version",
    [OG_PROGRAM_RULE_HEADER] = "header",
    [OG_PROGRAM_RULE_MANIFEST_JSON] = "manifest_json",
    [OG_PROGRAM_RULE_REQUIRED_FIELD] = "required_field",
    [OG_PROGRAM_RULE_FIELD_TYPE] = "field_type",
    [OG_PROGRAM_RULE_FIELD_VALUE] = "field_value",
    [OG_PROGRAM_RULE_TENSOR_NAME_UNIQUE] = "tensor_name_unique",
    [OG_PROGRAM_RULE_DTYPE_KNOWN] = "dtype_known",
    [OG_PROGRAM_RULE_SHAPE_RANK] = "shape_rank",
    [OG_PROGRAM_RULE_SHAPE_POSITIVE] = "shape_positive",
    [OG_PROGRAM_RULE_SHAPE_OVERFLOW] = "shape_overflow",
    [OG_PROGRAM_RULE_QUANT_SHAPE] = "quant_shape",
    [OG_PROGRAM_RULE_PAYLOAD_SIZE] = "payload_size",
    [OG_PROGRAM_RULE_PAYLOAD_BOUNDS] = "payload_bounds",
    [OG_PROGRAM_RULE_PAYLOAD_ALIGNED] = "payload_aligned",
    [OG_PROGRAM_RULE_PAYLOAD_OVERLAP] = "payload_overlap",
    [OG_PROGRAM_RULE_RUNTIME_NO_PAYLOAD] = "runtime_no_payload",
    [OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER] = "runtime_matches_layer",
    [OG_PROGRAM_RULE_LAYER_HAS_KV] = "layer_has_kv",
    [OG_PROGRAM_RULE_RUNTIME_SHAPE] = "runtime_shape",
    [OG_PROGRAM_RULE_LAYER_ID] = "layer_id",
    [OG_PROGRAM_RULE_KV_MANIFEST] = "kv_manifest",
    [OG_PROGRAM_RULE_GRAPH_INPUTS] = "graph_inputs",
    [OG_PROGRAM_RULE_UNKNOWN_OP] = "unknown_op",
    [OG_PROGRAM_RULE_OPERAND_COUNT] = "operand_count",
    [OG_PROGRAM_RULE_OPERAND_EXISTS] = "operand_exists",
    [OG_PROGRAM_RULE_OPERAND_SHAPE] = "operand_shape",
    [OG_PROGRAM_RULE_ATTR_VALUE] = "attr_value",
    [OG_PROGRAM_RULE_VALUE_NAME_UNIQUE] = "value_name_unique",
    [OG_PROGRAM_RULE_GRAPH_OUTPUTS] = "graph_outputs",
    [OG_PROGRAM_RULE_LAYER_HAS_STATE] = "layer_has_state",
    [OG_PROGRAM_RULE_STATE_USED_ONCE] = "state_used_once",
};

const char *og_program_rule_name(og_program_rule r) {
    return (unsigned)r < OG_PROGRAM_RULE_COUNT ? k_rule_names[r] : "unknown";
}

static _Thread_local og_program_rule g_last_rule;
static _Thread_local og_kv_rule g_last_kv_rule;

void og_program_set_last_rule(og_program_rule r, og_kv_rule kv) {
    g_last_rule = r;
    g_last_kv_rule = kv;
}

og_program_rule og_program_last_rule(og_kv_rule *kv_rule) {
    if (kv_rule) *kv_rule = g_last_kv_rule;
    return g_last_rule;
}

static og_status refuse(og_program_rule r, const char *fmt, ...) OG_PRINTF(2, 3);
static og_status refuse(og_program_rule r, const char *fmt, ...) {
    char what[OG_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    og_program_set_last_rule(r, OG_KV_RULE_NONE);
    return og_set_error(OG_ERR_FORMAT, "program rule %s: %s", og_program_rule_name(r), what);
}

#define TRY(expr)                              \
    do {                                       \
        og_status st_ = (expr);                \
        if (st_ != OG_OK) return st_;          \
    } while (0)

/* ------------------------------------------------------- JSON fields */

/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0

static og_status field(const cJSON *obj, const char *key, const char *where, const cJSON **out) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!f) return refuse(OG_PROGRAM_RULE_REQUIRED_FIELD, "%s: missing \"%s\"", where, key);
    *out = f;
    return OG_OK;
}

static og_status field_obj(const cJSON *obj, const char *key, const char *where, const cJSON **out) {
    TRY(field(obj, key, where, out));
    if (!cJSON_IsObject(*out)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be an object", where, key);
    return OG_OK;
}

static og_status field_arr(const cJSON *obj, const char *key, const char *where, const cJSON **out) {
    TRY(field(obj, key, where, out));
    if (!cJSON_IsArray(*out)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be an array", where, key);
    return OG_OK;
}

static og_status field_str(const cJSON *obj, const char *key, const char *where, const char **out) {
    const cJSON *f = NULL;
    TRY(field(obj, key, where, &f));
    if (!cJSON_IsString(f) || !f->valuestring)
        return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be a string", where, key);
    *out = f->valuestring;
    return OG_OK;
}

static og_status as_int(const cJSON *f, const char *key, const char *where, int64_t lo, int64_t hi,
                        int64_t *out) {
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || fabs(f->valuedouble) > JSON_INT_MAX)
        return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be an integer", where, key);
    int64_t v = (int64_t)f->valuedouble;
    if (v < lo || v > hi)
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: \"%s\" = %lld is outside [%lld, %lld]", where, key,
                      (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return OG_OK;
}

static og_status field_int(const cJSON *obj, const char *key, const char *where, int64_t lo, int64_t hi,
                           int64_t *out) {
    const cJSON *f = NULL;
    TRY(field(obj, key, where, &f));
    return as_int(f, key, where, lo, hi, out);
}

static og_status field_i32(const cJSON *obj, const char *key, const char *where, int64_t lo, int32_t *out) {
    int64_t v;
    TRY(field_int(obj, key, where, lo, INT32_MAX, &v));
    *out = (int32_t)v;
    return OG_OK;
}

static og_status as_num(const cJSON *f, const char *key, const char *where, double *out) {
    if (!cJSON_IsNumber(f)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be a number", where, key);
    if (!isfinite(f->valuedouble))
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: \"%s\" must be finite", where, key);
    *out = f->valuedouble;
    return OG_OK;
}

static og_status field_num(const cJSON *obj, const char *key, const char *where, double *out) {
    const cJSON *f = NULL;
    TRY(field(obj, key, where, &f));
    return as_num(f, key, where, out);
}

/* A number that must be > 0 (or >= 0 when zero_ok). */
static og_status field_pos(const cJSON *obj, const char *key, const char *where, bool zero_ok, double *out) {
    TRY(field_num(obj, key, where, out));
    if (!(*out > 0 || (zero_ok && *out == 0)))
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: \"%s\" = %g must be %s 0", where, key, *out,
                      zero_ok ? ">=" : ">");
    return OG_OK;
}

/* A dtype name: a string naming a known og_dtype. */
static og_status field_dtype(const cJSON *obj, const char *key, const char *where, og_dtype *out) {
    const char *s;
    TRY(field_str(obj, key, where, &s));
    if (og_dtype_parse(s, out) != OG_OK)
        return refuse(OG_PROGRAM_RULE_DTYPE_KNOWN, "%s: \"%s\" = \"%.64s\" is not a known dtype", where, key, s);
    return OG_OK;
}

/* ------------------------------------------------------------ header */

static og_status check_header(og_program *p) {
    const uint8_t *b = p->data;
    if (p->size < OG_PROGRAM_MAGIC_SIZE || memcmp(b, OG_PROGRAM_MAGIC, OG_PROGRAM_MAGIC_SIZE) != 0)
        return refuse(OG_PROGRAM_RULE_MAGIC, "the file does not start with the program magic (size %zu)", p->size);
    if (p->size < OG_PROGRAM_HEADER_SIZE)
        return refuse(OG_PROGRAM_RULE_HEADER, "file of %zu bytes is shorter than the %d-byte header", p->size,
                      OG_PROGRAM_HEADER_SIZE);
    uint32_t version = og_le32(b + OG_HDR_VERSION);
    if (version != OG_PROGRAM_FORMAT_VERSION)
        return refuse(OG_PROGRAM_RULE_VERSION, "header format version %u, this reader knows %d", version,
                      OG_PROGRAM_FORMAT_VERSION);
    uint32_t flags = og_le32(b + OG_HDR_FLAGS);
    if (flags != 0) return refuse(OG_PROGRAM_RULE_HEADER, "header flags 0x%x, none are defined", flags);
    uint64_t mlen = og_le64(b + OG_HDR_MANIFEST_LEN);
    uint64_t poff = og_le64(b + OG_HDR_PAYLOAD_OFFSET);
    uint64_t pbytes = og_le64(b + OG_HDR_PAYLOAD_BYTES);
    uint64_t size = p->size;
    if (mlen == 0 || mlen > size - OG_PROGRAM_HEADER_SIZE)
        return refuse(OG_PROGRAM_RULE_HEADER, "manifest length %llu does not fit a file of %llu bytes",
                      (unsigned long long)mlen, (unsigned long long)size);
    if (poff % OG_PROGRAM_ALIGN != 0 || poff < OG_PROGRAM_HEADER_SIZE + mlen || poff > size)
        return refuse(OG_PROGRAM_RULE_HEADER,
                      "payload offset %llu must be a multiple of %d after the manifest (ends at %llu) "
                      "and within the file (%llu bytes)",
                      (unsigned long long)poff, OG_PROGRAM_ALIGN,
                      (unsigned long long)(OG_PROGRAM_HEADER_SIZE + mlen), (unsigned long long)size);
    if (pbytes != size - poff)
        return refuse(OG_PROGRAM_RULE_HEADER, "payload of %llu bytes at %llu disagrees with the file size %llu",
                      (unsigned long long)pbytes, (unsigned long long)poff, (unsigned long long)size);
    p->payload_offset = poff;
    p->payload_bytes = pbytes;
    return OG_OK;
}

static og_status parse_manifest(og_program *p) {
    const char *text = (const char *)p->data + OG_PROGRAM_HEADER_SIZE;
    size_t len = (size_t)og_le64(p->data + OG_HDR_MANIFEST_LEN);
    const char *end = NULL;
    p->root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!p->root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        const char *err = cJSON_GetErrorPtr();
        if (err && err >= text && err <= text + len) at = (size_t)(err - text);
        return refuse(OG_PROGRAM_RULE_MANIFEST_JSON, "the manifest is not valid JSON (near byte %zu of %zu)", at, len);
    }
    for (const char *c = end; c < text + len; c++) {
        if (*c != ' ' && *c != '\n' && *c != '\r' && *c != '\t')
            return refuse(OG_PROGRAM_RULE_MANIFEST_JSON, "bytes after the manifest's JSON value at byte %zu",
                          (size_t)(c - text));
    }
    if (!cJSON_IsObject(p->root))
        return refuse(OG_PROGRAM_RULE_MANIFEST_JSON, "the manifest is not a JSON object");
    int64_t v;
    TRY(field_int(p->root, "format_version", "manifest", INT64_MIN / 2, INT64_MAX / 2, &v));
    if (v != OG_PROGRAM_FORMAT_VERSION)
        return refuse(OG_PROGRAM_RULE_VERSION, "manifest format_version %lld, this reader knows %d", (long long)v,
                      OG_PROGRAM_FORMAT_VERSION);
    return OG_OK;
}

/* ------------------------------------------------------------- model */

static og_status parse_model(og_program *p) {
    const cJSON *m, *rope;
    og_program_model *mo = &p->model;
    const char *w = "model", *s;
    TRY(field_obj(p->root, "model", "manifest", &m));
    p->model_json = m;
    TRY(field_str(m, "family", w, &s));
    if (!*s || strlen(s) >= sizeof mo->family)
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "model: \"family\" must be 1 to %zu characters",
                      sizeof mo->family - 1);
    memcpy(mo->family, s, strlen(s) + 1);
    TRY(field_dtype(m, "activation_dtype", w, &mo->activation_dtype));
    if (mo->activation_dtype != OG_DTYPE_F32 && mo->activation_dtype != OG_DTYPE_BF16 &&
        mo->activation_dtype != OG_DTYPE_F16)
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "model: \"activation_dtype\" must be f32, bf16 or f16");
    /* bounded by this build's limits (program.h) before anything is sized */
    int64_t v;
    TRY(field_int(m, "vocab_size", w, 1, OG_MAX_VOCAB, &mo->vocab_size));
    TRY(field_int(m, "hidden_size", w, 1, OG_MAX_HIDDEN, &mo->hidden_size));
    TRY(field_int(m, "intermediate_size", w, 1, OG_MAX_INTERMEDIATE, &mo->intermediate_size));
    TRY(field_int(m, "num_hidden_layers", w, 1, OG_MAX_LAYERS, &v));
    mo->num_hidden_layers = (int32_t)v;
    TRY(field_int(m, "num_attention_heads", w, 1, OG_MAX_HEADS, &v));
    mo->num_attention_heads = (int32_t)v;
    TRY(field_int(m, "num_key_value_heads", w, 1, OG_MAX_HEADS, &v));
    mo->num_key_value_heads = (int32_t)v;
    TRY(field_int(m, "head_dim", w, 1, OG_MAX_HEAD_DIM, &v));
    mo->head_dim = (int32_t)v;
    if ((int64_t)mo->num_attention_heads * mo->head_dim > OG_MAX_ATTN_WIDTH)
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE,
                      "model: \"num_attention_heads\" x \"head_dim\" = %d x %d is over this build's limit %lld",
                      mo->num_attention_heads, mo->head_dim, (long long)OG_MAX_ATTN_WIDTH);
    TRY(field_pos(m, "rms_norm_eps", w, false, &mo->rms_norm_eps));
    const cJSON *tie = NULL;
    TRY(field(m, "tie_word_embeddings", w, &tie));
    if (!cJSON_IsBool(tie)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "model: \"tie_word_embeddings\" must be a boolean");
    mo->tie_word_embeddings = cJSON_IsTrue(tie);

    w = "model.rope";
    TRY(field_obj(m, "rope", "model", &rope));
    TRY(field_pos(rope, "theta", w, false, &mo->rope.theta));
    TRY(field_str(rope, "type", w, &s));
    if (!og_rope_type_parse(s, &mo->rope.type))
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "model.rope: unknown \"type\" \"%.64s\" (default, linear, llama3)", s);
    TRY(field_pos(rope, "factor", w, false, &mo->rope.factor));
    TRY(field_pos(rope, "low_freq_factor", w, true, &mo->rope.low_freq_factor));
    TRY(field_pos(rope, "high_freq_factor", w, true, &mo->rope.high_freq_factor));
    TRY(field_int(rope, "original_max_position_embeddings", w, 0, INT32_MAX,
                  &mo->rope.original_max_position_embeddings));
    return OG_OK;
}

/* ---------------------------------------------------------------- kv */

int64_t og_program_layer_slots(const og_kv_config *cfg, const og_kv_layer_config *l) {
    return l->policy == OG_KV_RING ? (int64_t)l->window + cfg->max_write - 1 : cfg->max_capacity;
}

/* The optional "states" of the KV manifest: [{layer_id, name, dtype,
 * shape}]; the values' rules are og_kv_config_validate's (state_*). */
static og_status parse_states(og_program *p, const cJSON *kv) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(kv, "states"), *e;
    if (!arr) return OG_OK;
    if (!cJSON_IsArray(arr)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "kv: \"states\" must be an array");
    const int n = cJSON_GetArraySize(arr);
    if (n > 4 * OG_MAX_LAYERS)
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "kv: %d states, this build reads at most %d", n, 4 * OG_MAX_LAYERS);
    if (n > 0 && !(p->states = og_calloc((size_t)n, sizeof *p->states)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory for %d states", n);
    int i = 0;
    cJSON_ArrayForEach(e, arr) {
        char where[48];
        og_kv_state_config *st = &p->states[i];
        snprintf(where, sizeof where, "kv.states[%d]", i);
        if (!cJSON_IsObject(e)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s must be an object", where);
        TRY(field_i32(e, "layer_id", where, INT32_MIN, &st->layer_id));
        const char *name;
        TRY(field_str(e, "name", where, &name));
        /* a longer name is kept cut and unterminated: the state_name rule refuses it */
        memcpy(st->name, name, strnlen(name, sizeof st->name));
        TRY(field_dtype(e, "dtype", where, &st->dtype));
        const cJSON *shape, *d;
        TRY(field_arr(e, "shape", where, &shape));
        st->rank = cJSON_GetArraySize(shape);
        if (st->rank > OG_KV_STATE_MAX_RANK) st->rank = OG_KV_STATE_MAX_RANK + 1; /* the state_shape rule refuses it */
        int k = 0;
        cJSON_ArrayForEach(d, shape) {
            if (k >= OG_KV_STATE_MAX_RANK) break;
            int64_t v;
            TRY(as_int(d, "shape", where, -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &v));
            st->shape[k++] = v;
        }
        i++;
    }
    p->kv.states = p->states;
    p->kv.n_states = n;
    return OG_OK;
}

static og_status parse_kv(og_program *p) {
    const cJSON *kv, *layers;
    og_kv_config *c = &p->kv;
    const char *w = "kv";
    int64_t v;
    TRY(field_obj(p->root, "kv", "manifest", &kv));
    TRY(field_int(kv, "version", w, INT32_MIN, INT32_MAX, &v));
    c->version = (int32_t)v;
    TRY(field_dtype(kv, "kv_dtype", w, &c->kv_dtype));
    TRY(field_int(kv, "max_capacity", w, -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &c->max_capacity));
    TRY(field_int(kv, "initial_capacity", w, -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &c->initial_capacity));
    TRY(field_int(kv, "max_write", w, INT32_MIN, INT32_MAX, &v));
    c->max_write = (int32_t)v;
    c->n_model_layers = p->model.num_hidden_layers;
    TRY(field_arr(kv, "layers", w, &layers));
    int n = cJSON_GetArraySize(layers);
    if (n > p->model.num_hidden_layers)
        return refuse(OG_PROGRAM_RULE_LAYER_ID, "kv: %d layers for a model of %d", n, p->model.num_hidden_layers);
    if (n > 0 && !(p->layers = og_calloc((size_t)n, sizeof *p->layers)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory for %d KV layers", n);
    c->layers = p->layers;
    c->n_layers = n;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, layers) {
        char where[48];
        og_kv_layer_config *l = &p->layers[i];
        snprintf(where, sizeof where, "kv.layers[%d]", i);
        if (!cJSON_IsObject(e)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s must be an object", where);
        TRY(field_i32(e, "layer_id", where, INT32_MIN, &l->layer_id));
        const char *pol;
        TRY(field_str(e, "policy", where, &pol));
        if (strcmp(pol, "flat") == 0)
            l->policy = OG_KV_FLAT;
        else if (strcmp(pol, "ring") == 0)
            l->policy = OG_KV_RING;
        else
            return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: policy \"%.32s\" is neither flat nor ring", where, pol);
        TRY(field_i32(e, "window", where, INT32_MIN, &l->window));
        TRY(field_i32(e, "n_kv_heads", where, INT32_MIN, &l->n_kv_heads));
        TRY(field_i32(e, "head_dim", where, INT32_MIN, &l->head_dim));
        if (l->layer_id < 0 || l->layer_id >= p->model.num_hidden_layers)
            return refuse(OG_PROGRAM_RULE_LAYER_ID, "%s: layer_id %d is outside [0, %d)", where, l->layer_id,
                          p->model.num_hidden_layers);
        for (int j = 0; j < i; j++)
            if (p->layers[j].layer_id == l->layer_id)
                return refuse(OG_PROGRAM_RULE_LAYER_ID, "%s: layer_id %d repeats kv.layers[%d]", where, l->layer_id, j);
        i++;
    }
    TRY(parse_states(p, kv));
    og_kv_rule broken = OG_KV_RULE_NONE;
    if (og_kv_config_validate(c, &broken) != OG_OK) {
        char why[OG_ERRMSG_CAP];
        snprintf(why, sizeof why, "%s", og_last_error());
        og_program_set_last_rule(OG_PROGRAM_RULE_KV_MANIFEST, broken);
        return og_set_error(OG_ERR_FORMAT, "program rule kv_manifest:%s: %s", og_kv_rule_name(broken), why);
    }
    return OG_OK;
}

/* ----------------------------------------------------------- tensors */

static og_status parse_shape(const cJSON *t, const char *where, og_dtype dt, og_program_tensor *out,
                             int64_t *bytes) {
    const cJSON *shape, *d;
    TRY(field_arr(t, "shape", where, &shape));
    int rank = cJSON_GetArraySize(shape);
    if (rank < 1 || rank > OG_PROGRAM_MAX_RANK)
        return refuse(OG_PROGRAM_RULE_SHAPE_RANK, "%s: rank %d is outside [1, %d]", where, rank, OG_PROGRAM_MAX_RANK);
    int i = 0;
    cJSON_ArrayForEach(d, shape) {
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || fabs(d->valuedouble) > JSON_INT_MAX)
            return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: shape[%d] must be an integer", where, i);
        int64_t v = (int64_t)d->valuedouble;
        if (v <= 0) return refuse(OG_PROGRAM_RULE_SHAPE_POSITIVE, "%s: shape[%d] = %lld must be > 0", where, i, (long long)v);
        out->shape[i++] = v;
    }
    /* a second pass so that a non-positive dim is reported before the rest */
    /* q8 / q4 may also be a stack [E, N, K] (a moe instruction's experts) */
    const int max_rank = og_dtype_is_kquant(dt) ? 2 : 3;
    if (og_dtype_is_quantized(dt) && (rank < 2 || rank > max_rank || out->shape[rank - 1] % og_quant_block_elems(dt)))
        return refuse(OG_PROGRAM_RULE_QUANT_SHAPE, "%s: a %s tensor must be [N, K]%s with K a multiple of %lld", where,
                      og_dtype_name(dt), max_rank == 3 ? " or [E, N, K]" : "", (long long)og_quant_block_elems(dt));
    int64_t n;
    if (!og_tensor_bytes(dt, rank, out->shape, &n))
        return refuse(OG_PROGRAM_RULE_SHAPE_OVERFLOW, "%s: the byte count of the shape overflows 64 bits", where);
    out->rank = rank;
    *bytes = n;
    return OG_OK;
}

static og_status parse_weight(og_program *p, const cJSON *t, const char *where, og_program_tensor *x,
                              int64_t bytes) {
    int64_t off, nb;
    TRY(field_int(t, "offset", where, 0, (int64_t)JSON_INT_MAX, &off));
    TRY(field_int(t, "nbytes", where, 0, (int64_t)JSON_INT_MAX, &nb));
    if (nb != bytes)
        return refuse(OG_PROGRAM_RULE_PAYLOAD_SIZE, "%s: nbytes %lld, its shape and dtype need %lld", where,
                      (long long)nb, (long long)bytes);
    if (off % OG_PROGRAM_ALIGN != 0)
        return refuse(OG_PROGRAM_RULE_PAYLOAD_ALIGNED, "%s: offset %lld is not a multiple of %d", where,
                      (long long)off, OG_PROGRAM_ALIGN);
    if ((uint64_t)off > p->payload_bytes || (uint64_t)nb > p->payload_bytes - (uint64_t)off)
        return refuse(OG_PROGRAM_RULE_PAYLOAD_BOUNDS, "%s: bytes [%lld, %lld) pass the payload's end (%llu)", where,
                      (long long)off, (long long)(off + nb), (unsigned long long)p->payload_bytes);
    x->binding = OG_BINDING_WEIGHT;
    x->state_index = -1;
    x->offset = (uint64_t)off;
    x->nbytes = (uint64_t)nb;
    x->data = p->data + p->payload_offset + off;
    x->kv_index = -1;
    x->layer_id = -1;
    p->weight_bytes += (uint64_t)nb;
    return OG_OK;
}

/* A runtime tensor naming a state of the manifest: {"layer_id", "state": name}. */
static og_status parse_runtime_state(og_program *p, const cJSON *t, const char *where, og_program_tensor *x,
                                     int32_t index) {
    const char *name;
    TRY(field_str(t, "state", where, &name));
    if (cJSON_GetObjectItemCaseSensitive(t, "kv"))
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: a runtime tensor is a KV half (\"kv\") or a state, not both",
                      where);
    x->binding = OG_BINDING_RUNTIME;
    x->kv_index = -1;
    x->part = OG_KV_PART_K;
    for (int32_t i = 0; i < p->kv.n_states; i++)
        if (p->states[i].layer_id == x->layer_id && !strncmp(p->states[i].name, name, sizeof p->states[i].name) &&
            strlen(name) < sizeof p->states[i].name)
            x->state_index = i;
    if (x->state_index < 0)
        return refuse(OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER, "%s: layer_id %d has no state \"%.32s\" in the manifest",
                      where, x->layer_id, name);
    for (int32_t j = 0; j < index; j++)
        if (p->tensors[j].binding == OG_BINDING_RUNTIME && p->tensors[j].state_index == x->state_index)
            return refuse(OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER, "%s: layer %d's state \"%s\" is also tensor \"%s\"",
                          where, x->layer_id, name, p->tensors[j].name);
    const og_kv_state_config *st = &p->states[x->state_index];
    bool same = x->dtype == st->dtype && x->rank == st->rank;
    for (int32_t d = 0; same && d < st->rank; d++) same = x->shape[d] == st->shape[d];
    if (!same) {
        char dims[96] = "";
        for (int32_t d = 0; d < st->rank; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? ", " : "", (long long)st->shape[d]);
        return refuse(OG_PROGRAM_RULE_RUNTIME_SHAPE, "%s: the state \"%s\" of layer %d is declared %s [%s]", where,
                      name, x->layer_id, og_dtype_name(st->dtype), dims);
    }
    return OG_OK;
}

static og_status parse_runtime(og_program *p, const cJSON *t, const char *where, og_program_tensor *x,
                               int32_t index) {
    if (cJSON_GetObjectItemCaseSensitive(t, "offset") || cJSON_GetObjectItemCaseSensitive(t, "nbytes"))
        return refuse(OG_PROGRAM_RULE_RUNTIME_NO_PAYLOAD, "%s: a runtime tensor must have no offset or nbytes", where);
    const char *part;
    TRY(field_i32(t, "layer_id", where, INT32_MIN, &x->layer_id));
    x->state_index = -1;
    if (cJSON_GetObjectItemCaseSensitive(t, "state")) return parse_runtime_state(p, t, where, x, index);
    TRY(field_str(t, "kv", where, &part));
    if (strcmp(part, "k") == 0)
        x->part = OG_KV_PART_K;
    else if (strcmp(part, "v") == 0)
        x->part = OG_KV_PART_V;
    else
        return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: \"kv\" must be \"k\" or \"v\"", where);
    x->binding = OG_BINDING_RUNTIME;
    x->kv_index = -1;
    for (int32_t l = 0; l < p->kv.n_layers; l++)
        if (p->layers[l].layer_id == x->layer_id) x->kv_index = l;
    if (x->kv_index < 0)
        return refuse(OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER, "%s: layer_id %d is not a KV-manifest layer", where,
                      x->layer_id);
    for (int32_t j = 0; j < index; j++) {
        const og_program_tensor *o = &p->tensors[j];
        if (o->binding == OG_BINDING_RUNTIME && o->state_index < 0 && o->kv_index == x->kv_index && o->part == x->part)
            return refuse(OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER, "%s: layer %d's %s storage is also tensor \"%s\"",
                          where, x->layer_id, part, o->name);
    }
    const og_kv_layer_config *l = &p->layers[x->kv_index];
    int64_t slots = og_program_layer_slots(&p->kv, l);
    if (x->dtype != p->kv.kv_dtype || x->rank != 3 || x->shape[0] != slots || x->shape[1] != l->n_kv_heads ||
        x->shape[2] != l->head_dim)
        return refuse(OG_PROGRAM_RULE_RUNTIME_SHAPE,
                      "%s: a runtime tensor of layer %d must be %s [%lld, %d, %d] (%s slots)", where, x->layer_id,
                      og_dtype_name(p->kv.kv_dtype), (long long)slots, l->n_kv_heads, l->head_dim,
                      l->policy == OG_KV_RING ? "ring: window + max_write - 1" : "flat: max_capacity");
    return OG_OK;
}

static bool is_input_name(const char *s) { return strcmp(s, "tokens") == 0 || strcmp(s, "positions") == 0; }

static int cmp_offset(const void *a, const void *b) {
    const og_program_tensor *x = *(const og_program_tensor *const *)a, *y = *(const og_program_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static og_status check_overlap(og_program *p) {
    if (p->n_tensors < 2) return OG_OK;
    const og_program_tensor **w = og_malloc((size_t)p->n_tensors * sizeof *w);
    if (!w) return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory sorting %d tensors", p->n_tensors);
    int32_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].binding == OG_BINDING_WEIGHT) w[n++] = &p->tensors[i];
    qsort(w, (size_t)n, sizeof *w, cmp_offset);
    og_status st = OG_OK;
    for (int32_t i = 1; i < n && st == OG_OK; i++)
        if (w[i - 1]->offset + w[i - 1]->nbytes > w[i]->offset)
            st = refuse(OG_PROGRAM_RULE_PAYLOAD_OVERLAP, "tensors \"%s\" and \"%s\" share payload bytes at %llu",
                        w[i - 1]->name, w[i]->name, (unsigned long long)w[i]->offset);
    og_free(w);
    return st;
}

static og_status parse_tensors(og_program *p) {
    const cJSON *arr, *t;
    TRY(field_arr(p->root, "tensors", "manifest", &arr));
    int n = cJSON_GetArraySize(arr);
    if (n > 0 && !(p->tensors = og_calloc((size_t)n, sizeof *p->tensors)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory for %d tensors", n);
    int32_t i = 0;
    cJSON_ArrayForEach(t, arr) {
        char where[160];
        og_program_tensor *x = &p->tensors[i];
        snprintf(where, sizeof where, "tensors[%d]", i);
        if (!cJSON_IsObject(t)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s must be an object", where);
        TRY(field_str(t, "name", where, &x->name));
        if (!*x->name) return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: empty name", where);
        snprintf(where, sizeof where, "tensors[%d] \"%.100s\"", i, x->name);
        for (int32_t j = 0; j < i; j++)
            if (strcmp(p->tensors[j].name, x->name) == 0)
                return refuse(OG_PROGRAM_RULE_TENSOR_NAME_UNIQUE, "%s: the name repeats tensors[%d]", where, j);
        if (is_input_name(x->name))
            return refuse(OG_PROGRAM_RULE_VALUE_NAME_UNIQUE, "%s: the name is a graph input's", where);
        TRY(field_dtype(t, "dtype", where, &x->dtype));
        int64_t bytes = 0;
        TRY(parse_shape(t, where, x->dtype, x, &bytes));
        const char *binding;
        TRY(field_str(t, "binding", where, &binding));
        if (strcmp(binding, "weight") == 0)
            TRY(parse_weight(p, t, where, x, bytes));
        else if (strcmp(binding, "runtime") == 0)
            TRY(parse_runtime(p, t, where, x, i));
        else
            return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: binding \"%.32s\" is neither weight nor runtime", where,
                          binding);
        p->n_tensors = ++i;
    }
    TRY(check_overlap(p));
    for (int32_t l = 0; l < p->kv.n_layers; l++) {
        bool has[2] = {false, false};
        for (int32_t j = 0; j < p->n_tensors; j++)
            if (p->tensors[j].binding == OG_BINDING_RUNTIME && p->tensors[j].kv_index == l)
                has[p->tensors[j].part] = true;
        if (!has[0] || !has[1])
            return refuse(OG_PROGRAM_RULE_LAYER_HAS_KV, "KV layer %d (kv.layers[%d]) has no runtime %s tensor",
                          p->layers[l].layer_id, l, has[0] ? "v" : "k");
    }
    for (int32_t k = 0; k < p->kv.n_states; k++) {
        bool has = false;
        for (int32_t j = 0; j < p->n_tensors && !has; j++) has = p->tensors[j].state_index == k;
        if (!has)
            return refuse(OG_PROGRAM_RULE_LAYER_HAS_STATE, "the state \"%s\" of layer %d (kv.states[%d]) has no runtime tensor",
                          p->states[k].name, p->states[k].layer_id, k);
    }
    return OG_OK;
}

/* ------------------------------------------------- inputs and outputs */

/* Checks a ["T"] or ["T", n] shape array. */
static bool is_act_shape(const cJSON *shape, int64_t width) {
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != (width ? 2 : 1)) return false;
    const cJSON *t = cJSON_GetArrayItem(shape, 0);
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "T") != 0) return false;
    if (!width) return true;
    const cJSON *n = cJSON_GetArrayItem(shape, 1);
    return cJSON_IsNumber(n) && n->valuedouble == (double)width;
}

static bool io_matches(const cJSON *e, const char *name, og_dtype dt, int64_t width) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    return cJSON_IsObject(e) && cJSON_IsString(n) && strcmp(n->valuestring, name) == 0 && cJSON_IsString(d) &&
           strcmp(d->valuestring, og_dtype_name(dt)) == 0 &&
           is_act_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), width);
}

static og_status parse_inputs(og_program *p) {
    const cJSON *arr;
    TRY(field_arr(p->root, "inputs", "manifest", &arr));
    if (cJSON_GetArraySize(arr) != 2 || !io_matches(cJSON_GetArrayItem(arr, 0), "tokens", OG_DTYPE_I32, 0) ||
        !io_matches(cJSON_GetArrayItem(arr, 1), "positions", OG_DTYPE_I32, 0))
        return refuse(OG_PROGRAM_RULE_GRAPH_INPUTS,
                      "inputs must be [{name: tokens, dtype: i32, shape: [\"T\"]}, {name: positions, ...}]");
    return OG_OK;
}

static og_status parse_outputs(og_program *p) {
    const cJSON *arr;
    TRY(field_arr(p->root, "outputs", "manifest", &arr));
    const og_program_model *m = &p->model;
    if (cJSON_GetArraySize(arr) != 1 ||
        !io_matches(cJSON_GetArrayItem(arr, 0), "logits", m->activation_dtype, m->vocab_size))
        return refuse(OG_PROGRAM_RULE_GRAPH_OUTPUTS, "outputs must be [{name: logits, dtype: %s, shape: [\"T\", %lld]}]",
                      og_dtype_name(m->activation_dtype), (long long)m->vocab_size);
    p->logits_instr = -1;
    for (int32_t i = 0; i < p->n_instrs; i++)
        if (strcmp(p->instrs[i].out, "logits") == 0) p->logits_instr = i;
    if (p->logits_instr < 0) return refuse(OG_PROGRAM_RULE_GRAPH_OUTPUTS, "no instruction produces \"logits\"");
    if (p->instrs[p->logits_instr].out_width != m->vocab_size)
        return refuse(OG_PROGRAM_RULE_GRAPH_OUTPUTS, "instruction %d produces logits [T, %lld], want [T, %lld]",
                      p->logits_instr, (long long)p->instrs[p->logits_instr].out_width, (long long)m->vocab_size);
    return OG_OK;
}

/* ------------------------------------------------------ instructions */

static og_status parse_attrs(const cJSON *ins, const og_op_info *info, const char *where, og_op_attrs *a) {
    const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(ins, "attrs");
    if (info->n_attrs == 0 && !attrs) return OG_OK;
    TRY(field_obj(ins, "attrs", where, &attrs));
    for (int k = 0; k < info->n_attrs; k++) {
        const og_attr_desc *d = &info->attrs[k];
        const cJSON *f = NULL;
        if (d->optional && !cJSON_GetObjectItemCaseSensitive(attrs, d->name)) continue; /* stays 0 */
        TRY(field(attrs, d->name, where, &f));
        char *dst = (char *)a + d->offset;
        if (d->kind == OG_ATTR_INT) {
            int64_t v;
            TRY(as_int(f, d->name, where, -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &v));
            memcpy(dst, &v, sizeof v);
        } else if (d->kind == OG_ATTR_FLOAT) {
            double v;
            TRY(as_num(f, d->name, where, &v));
            memcpy(dst, &v, sizeof v);
        } else {
            og_rope_type rt;
            if (!cJSON_IsString(f)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: \"%s\" must be a string", where, d->name);
            if (!og_rope_type_parse(f->valuestring, &rt))
                return refuse(OG_PROGRAM_RULE_ATTR_VALUE, "%s: unknown rope type \"%.32s\"", where, f->valuestring);
            memcpy(dst, &rt, sizeof rt);
        }
    }
    return OG_OK;
}

/* Finds what a name refers to among the first n_done outputs, the tensors
 * and the graph inputs, and its shape. */
static bool resolve(const og_program *p, int32_t n_done, const char *name, og_program_operand *o, og_shape *s) {
    memset(s, 0, sizeof *s);
    for (int32_t i = n_done - 1; i >= 0; i--) {
        if (strcmp(p->instrs[i].out, name) == 0) {
            *o = (og_program_operand){OG_VALUE_ACTIVATION, i};
            *s = (og_shape){2, {OG_DIM_T, p->instrs[i].out_width}, p->model.activation_dtype, false};
            return true;
        }
    }
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const og_program_tensor *t = &p->tensors[i];
        if (strcmp(t->name, name) == 0) {
            *o = (og_program_operand){OG_VALUE_TENSOR, i};
            s->rank = t->rank;
            memcpy(s->dim, t->shape, sizeof s->dim);
            s->dtype = t->dtype;
            s->runtime = t->binding == OG_BINDING_RUNTIME;
            return true;
        }
    }
    if (is_input_name(name)) {
        *o = (og_program_operand){OG_VALUE_INPUT, strcmp(name, "tokens") == 0 ? OG_INPUT_TOKENS : OG_INPUT_POSITIONS};
        *s = (og_shape){1, {OG_DIM_T}, OG_DTYPE_I32, false};
        return true;
    }
    return false;
}

static og_status parse_instr(og_program *p, const cJSON *ins, int32_t i) {
    og_program_instr *x = &p->instrs[i];
    char where[64];
    snprintf(where, sizeof where, "instructions[%d]", i);
    if (!cJSON_IsObject(ins)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s must be an object", where);
    const char *opname;
    TRY(field_str(ins, "op", where, &opname));
    if (!og_op_parse(opname, &x->op)) return refuse(OG_PROGRAM_RULE_UNKNOWN_OP, "%s: unknown op \"%.40s\"", where, opname);
    const og_op_info *info = og_op_get(x->op);
    snprintf(where, sizeof where, "instructions[%d] (%s)", i, info->name);
    const cJSON *in, *e;
    TRY(field_arr(ins, "in", where, &in));
    int n_in = cJSON_GetArraySize(in);
    if (n_in < info->min_inputs || n_in > info->max_inputs)
        return refuse(OG_PROGRAM_RULE_OPERAND_COUNT, "%s: %d inputs, the op takes %d to %d", where, n_in,
                      info->min_inputs, info->max_inputs);
    TRY(field_str(ins, "out", where, &x->out));
    TRY(parse_attrs(ins, info, where, &x->attrs));

    og_shape shapes[OG_OP_MAX_INPUTS];
    og_op_context ctx = {.act_dtype = p->model.activation_dtype, .cache_layer_id = {-1, -1}, .cache_part = {-1, -1}};
    for (int j = 0; j < OG_OP_MAX_INPUTS; j++) ctx.state_layer_id[j] = -1;
    int k = 0;
    cJSON_ArrayForEach(e, in) {
        if (!cJSON_IsString(e)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "%s: in[%d] must be a string", where, k);
        if (!resolve(p, i, e->valuestring, &x->in[k], &shapes[k]))
            return refuse(OG_PROGRAM_RULE_OPERAND_EXISTS,
                          "%s: %s operand \"%.64s\" is no graph input, tensor or earlier output", where,
                          info->input_names[k], e->valuestring);
        if (x->in[k].kind == OG_VALUE_TENSOR) {
            const og_program_tensor *t = &p->tensors[x->in[k].index];
            const bool kv = t->binding == OG_BINDING_RUNTIME && t->state_index < 0;
            if (k >= 4) {
                ctx.cache_layer_id[k - 4] = kv ? t->layer_id : -1;
                ctx.cache_part[k - 4] = kv ? (int32_t)t->part : -1;
            }
            if (t->state_index >= 0) ctx.state_layer_id[k] = t->layer_id;
        }
        k++;
    }
    x->n_in = n_in;
    x->kv_index = -1;
    if (x->op == OG_OP_UPDATE_AND_ATTEND) {
        for (int32_t l = 0; l < p->kv.n_layers; l++) {
            if (p->layers[l].layer_id == x->attrs.layer_id) {
                x->kv_index = l;
                ctx.layer_found = true;
                ctx.layer_kv_heads = p->layers[l].n_kv_heads;
                ctx.layer_head_dim = p->layers[l].head_dim;
            }
        }
    }
    og_shape out;
    char why[256];
    og_op_check c = og_op_infer(x->op, &x->attrs, shapes, n_in, &ctx, &out, why, sizeof why);
    if (c == OG_OP_CHECK_ATTR) return refuse(OG_PROGRAM_RULE_ATTR_VALUE, "%s: %s", where, why);
    if (c == OG_OP_CHECK_OPERAND) return refuse(OG_PROGRAM_RULE_OPERAND_SHAPE, "%s: %s", where, why);
    x->out_width = out.dim[1];

    og_program_operand o;
    og_shape s;
    if (!*x->out) return refuse(OG_PROGRAM_RULE_FIELD_VALUE, "%s: empty output name", where);
    if (resolve(p, i, x->out, &o, &s))
        return refuse(OG_PROGRAM_RULE_VALUE_NAME_UNIQUE, "%s: output \"%.64s\" is already %s", where, x->out,
                      o.kind == OG_VALUE_ACTIVATION ? "an earlier output" : o.kind == OG_VALUE_TENSOR ? "a tensor" : "a graph input");
    return OG_OK;
}

static og_status parse_instrs(og_program *p) {
    const cJSON *arr, *ins;
    TRY(field_arr(p->root, "instructions", "manifest", &arr));
    int n = cJSON_GetArraySize(arr);
    if (n > 0 && !(p->instrs = og_calloc((size_t)n, sizeof *p->instrs)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory for %d instructions", n);
    int32_t i = 0;
    cJSON_ArrayForEach(ins, arr) {
        TRY(parse_instr(p, ins, i));
        p->n_instrs = ++i;
    }
    /* a step commits every state as the new one: each must be written by
     * exactly one instruction of every step */
    for (int32_t t = 0; t < p->n_tensors; t++) {
        if (p->tensors[t].state_index < 0) continue;
        int32_t uses = 0, first = -1;
        for (int32_t k = 0; k < p->n_instrs; k++)
            for (int32_t j = 0; j < p->instrs[k].n_in; j++)
                if (p->instrs[k].in[j].kind == OG_VALUE_TENSOR && p->instrs[k].in[j].index == t) {
                    if (!uses++) first = k;
                }
        if (uses != 1)
            return refuse(OG_PROGRAM_RULE_STATE_USED_ONCE,
                          "the state tensor \"%s\" is an operand of %d instructions (the first: instructions[%d], "
                          "-1 for none); a step writes every state exactly once",
                          p->tensors[t].name, (int)uses, (int)first);
    }
    return OG_OK;
}

static og_status parse_tokenizer(og_program *p) {
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(p->root, "tokenizer");
    if (!tok || cJSON_IsNull(tok)) return OG_OK;
    if (!cJSON_IsObject(tok)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "manifest: \"tokenizer\" must be an object");
    TRY(field_str(tok, "json", "tokenizer", &p->tokenizer_json));
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(tok, "config");
    if (cfg && !cJSON_IsNull(cfg)) {
        if (!cJSON_IsString(cfg)) return refuse(OG_PROGRAM_RULE_FIELD_TYPE, "tokenizer: \"config\" must be a string");
        p->tokenizer_config = cfg->valuestring;
    }
    return OG_OK;
}

og_status og_program_parse(og_program *p) {
    og_program_set_last_rule(OG_PROGRAM_RULE_NONE, OG_KV_RULE_NONE);
    TRY(check_header(p));
    TRY(parse_manifest(p));
    TRY(parse_model(p));
    TRY(parse_kv(p));
    TRY(parse_tensors(p));
    TRY(parse_inputs(p));
    TRY(parse_instrs(p));
    TRY(parse_outputs(p));
    TRY(parse_tokenizer(p));
    return OG_OK;
}
