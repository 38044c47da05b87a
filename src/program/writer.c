/* Writing a program: collect the declaration, then finish streams it tensor
 * by tensor into <path>.tmp, validates that file with the reader, and
 * renames it onto <path>. */
#include "program/program_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

typedef struct wtensor {
    char *name;
    og_dtype dtype;
    int32_t rank;
    int64_t shape[OG_PROGRAM_MAX_RANK];
    og_program_binding binding;
    og_program_fill_fn fill; /* weight: fill or bytes */
    void *ctx;
    const void *bytes;
    uint64_t nbytes, offset;
    int32_t layer_id; /* runtime */
    og_kv_part part;
    int32_t state;    /* runtime state: index into kv.states, else -1 */
} wtensor;

struct og_program_writer {
    char *path;
    og_errbuf err;
    bool have_model;
    og_program_model model;
    cJSON *model_extra;       /* owned */
    bool have_kv;
    og_kv_config kv;
    og_kv_layer_config *layers; /* owned copy */
    og_kv_state_config *states; /* owned copy */
    wtensor *tensors;
    int32_t n_tensors, cap_tensors;
    cJSON *instrs;            /* owned array */
    char *tok_json, *tok_config;
};

og_status og_program_writer_create(const char *path, og_program_writer **out) {
    if (!path || !*path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_create: NULL argument");
    og_program_writer *w = og_calloc(1, sizeof *w);
    if (w) w->path = og_strdup(path);
    if (w) w->instrs = cJSON_CreateArray();
    if (!w || !w->path || !w->instrs) {
        og_program_writer_destroy(w);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
    }
    *out = w;
    return OG_OK;
}

void og_program_writer_destroy(og_program_writer *w) {
    if (!w) return;
    for (int32_t i = 0; i < w->n_tensors; i++) og_free(w->tensors[i].name);
    og_free(w->tensors);
    cJSON_Delete(w->model_extra);
    cJSON_Delete(w->instrs);
    og_free(w->layers);
    og_free(w->states);
    og_free(w->tok_json);
    og_free(w->tok_config);
    og_free(w->path);
    og_free(w);
}

const char *og_program_writer_last_error(const og_program_writer *w) { return w ? w->err.msg : ""; }

#define WFAIL(st, ...) og_errbuf_set(&w->err, (st), __VA_ARGS__)

og_status og_program_writer_set_model(og_program_writer *w, const og_program_model *m, cJSON *extra) {
    if (!w || !m) {
        cJSON_Delete(extra);
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_set_model: NULL argument");
    }
    if (extra && !cJSON_IsObject(extra)) {
        cJSON_Delete(extra);
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: model extra must be a JSON object");
    }
    if (!memchr(m->family, 0, sizeof m->family)) {
        cJSON_Delete(extra);
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: model family is not NUL-terminated");
    }
    cJSON_Delete(w->model_extra);
    w->model_extra = extra;
    w->model = *m;
    w->have_model = true;
    return OG_OK;
}

og_status og_program_writer_set_kv(og_program_writer *w, const og_kv_config *cfg) {
    if (!w || !cfg || (cfg->n_layers > 0 && !cfg->layers) || cfg->n_layers < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_set_kv: NULL argument or bad layer count");
    if (cfg->n_states < 0 || (cfg->n_states > 0 && !cfg->states))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_set_kv: bad state count");
    og_kv_layer_config *l = NULL;
    og_kv_state_config *st = NULL;
    if (cfg->n_layers > 0) {
        l = og_calloc((size_t)cfg->n_layers, sizeof *l);
        if (!l) return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
        memcpy(l, cfg->layers, (size_t)cfg->n_layers * sizeof *l);
    }
    if (cfg->n_states > 0) {
        st = og_calloc((size_t)cfg->n_states, sizeof *st);
        if (!st) {
            og_free(l);
            return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
        }
        memcpy(st, cfg->states, (size_t)cfg->n_states * sizeof *st);
    }
    og_free(w->layers);
    og_free(w->states);
    w->layers = l;
    w->states = st;
    w->kv = *cfg;
    w->kv.layers = l;
    w->kv.states = st;
    w->have_kv = true;
    return OG_OK;
}

static og_status add_tensor(og_program_writer *w, const char *name, og_dtype dtype, int32_t rank,
                            const int64_t *shape, wtensor **out) {
    int64_t bytes;
    if (!name || !*name || !shape || rank < 1 || rank > OG_PROGRAM_MAX_RANK)
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: tensor \"%s\": bad name or rank %d",
                     name ? name : "(null)", rank);
    if (!og_tensor_bytes(dtype, rank, shape, &bytes))
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: tensor \"%s\": dtype %s does not fit its shape", name,
                     og_dtype_name(dtype));
    for (int32_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: tensor \"%s\" added twice", name);
    if (w->n_tensors == w->cap_tensors) {
        int32_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        wtensor *t = og_realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
        w->tensors = t;
        w->cap_tensors = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->state = -1;
    if (!(t->name = og_strdup(name))) return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
    t->nbytes = (uint64_t)bytes;
    w->n_tensors++;
    *out = t;
    return OG_OK;
}

og_status og_program_writer_add_weight(og_program_writer *w, const char *name, og_dtype dtype, int32_t rank,
                                       const int64_t *shape, og_program_fill_fn fill, void *ctx) {
    if (!w || !fill) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_add_weight: NULL argument");
    wtensor *t;
    og_status st = add_tensor(w, name, dtype, rank, shape, &t);
    if (st != OG_OK) return st;
    t->binding = OG_BINDING_WEIGHT;
    t->fill = fill;
    t->ctx = ctx;
    return OG_OK;
}

og_status og_program_writer_add_weight_bytes(og_program_writer *w, const char *name, og_dtype dtype,
                                             int32_t rank, const int64_t *shape, const void *bytes) {
    if (!w || !bytes) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_add_weight_bytes: NULL argument");
    wtensor *t;
    og_status st = add_tensor(w, name, dtype, rank, shape, &t);
    if (st != OG_OK) return st;
    t->binding = OG_BINDING_WEIGHT;
    t->bytes = bytes;
    return OG_OK;
}

og_status og_program_writer_add_runtime(og_program_writer *w, const char *name, og_dtype dtype, int32_t rank,
                                        const int64_t *shape, int32_t layer_id, og_kv_part part) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_add_runtime: NULL writer");
    if (part != OG_KV_PART_K && part != OG_KV_PART_V)
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: runtime tensor \"%s\": part %d is neither k nor v",
                     name ? name : "(null)", (int)part);
    wtensor *t;
    og_status st = add_tensor(w, name, dtype, rank, shape, &t);
    if (st != OG_OK) return st;
    t->binding = OG_BINDING_RUNTIME;
    t->layer_id = layer_id;
    t->part = part;
    t->state = -1;
    return OG_OK;
}

og_status og_program_writer_add_kv_runtime(og_program_writer *w) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_add_kv_runtime: NULL writer");
    if (!w->have_kv) return WFAIL(OG_ERR_STATE, "program writer: set the KV manifest before its runtime tensors");
    for (int32_t i = 0; i < w->kv.n_states; i++) {
        const og_kv_state_config *sc = &w->states[i];
        char name[64];
        snprintf(name, sizeof name, "state.%d.%.*s", sc->layer_id, (int)sizeof sc->name, sc->name);
        wtensor *t;
        og_status st = add_tensor(w, name, sc->dtype, sc->rank, sc->shape, &t);
        if (st != OG_OK) return st;
        t->binding = OG_BINDING_RUNTIME;
        t->layer_id = sc->layer_id;
        t->state = i;
    }
    for (int32_t i = 0; i < w->kv.n_layers; i++) {
        const og_kv_layer_config *l = &w->layers[i];
        int64_t shape[3] = {og_program_layer_slots(&w->kv, l), l->n_kv_heads, l->head_dim};
        for (int part = 0; part < 2; part++) {
            char name[48];
            snprintf(name, sizeof name, "kv.%d.%s", l->layer_id, part ? "v" : "k");
            og_status st = og_program_writer_add_runtime(w, name, w->kv.kv_dtype, 3, shape, l->layer_id,
                                                         (og_kv_part)part);
            if (st != OG_OK) return st;
        }
    }
    return OG_OK;
}

og_status og_program_writer_add_instr(og_program_writer *w, og_op op, const char *const *in, int32_t n_in,
                                      const char *out, const og_op_attrs *attrs) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_add_instr: NULL writer");
    const og_op_info *info = og_op_get(op);
    if (!info) return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: unknown op %d", (int)op);
    if (!out || !*out || n_in < info->min_inputs || n_in > info->max_inputs || !in ||
        (info->n_attrs > 0 && !attrs))
        return WFAIL(OG_ERR_INVALID_ARGUMENT, "program writer: %s needs %d to %d inputs, an output name%s", info->name,
                     info->min_inputs, info->max_inputs, info->n_attrs ? " and attrs" : "");
    cJSON *ins = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(ins, "in");
    bool ok = ins && arr && cJSON_AddStringToObject(ins, "op", info->name) && cJSON_AddStringToObject(ins, "out", out);
    for (int32_t i = 0; ok && i < n_in; i++) {
        cJSON *s = in[i] ? cJSON_CreateString(in[i]) : NULL;
        ok = s && cJSON_AddItemToArray(arr, s);
        if (!ok) cJSON_Delete(s);
    }
    cJSON *a = info->n_attrs && ok ? cJSON_AddObjectToObject(ins, "attrs") : NULL;
    for (int32_t k = 0; ok && k < info->n_attrs; k++) {
        const og_attr_desc *d = &info->attrs[k];
        const char *src = (const char *)attrs + d->offset;
        if (d->kind == OG_ATTR_INT) {
            int64_t v;
            memcpy(&v, src, sizeof v);
            if (d->optional && v == 0) continue; /* absent means 0 */
            ok = cJSON_AddNumberToObject(a, d->name, (double)v) != NULL;
        } else if (d->kind == OG_ATTR_FLOAT) {
            double v;
            memcpy(&v, src, sizeof v);
            ok = cJSON_AddNumberToObject(a, d->name, v) != NULL;
        } else {
            og_rope_type v;
            memcpy(&v, src, sizeof v);
            ok = cJSON_AddStringToObject(a, d->name, og_rope_type_name(v)) != NULL;
        }
    }
    if (!ok || !cJSON_AddItemToArray(w->instrs, ins)) {
        cJSON_Delete(ins);
        return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory adding a %s instruction", info->name);
    }
    return OG_OK;
}

og_status og_program_writer_set_tokenizer(og_program_writer *w, const char *tokenizer_json,
                                          const char *tokenizer_config) {
    if (!w || !tokenizer_json) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_set_tokenizer: NULL argument");
    char *j = og_strdup(tokenizer_json), *c = tokenizer_config ? og_strdup(tokenizer_config) : NULL;
    if (!j || (tokenizer_config && !c)) {
        og_free(j);
        og_free(c);
        return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory copying the tokenizer");
    }
    og_free(w->tok_json);
    og_free(w->tok_config);
    w->tok_json = j;
    w->tok_config = c;
    return OG_OK;
}

/* ------------------------------------------------------------- finish */

/* Appends item to arr; frees it when that fails. */
static bool add_owned(cJSON *arr, cJSON *item) {
    if (item && cJSON_AddItemToArray(arr, item)) return true;
    cJSON_Delete(item);
    return false;
}

static cJSON *io_entry(const char *name, og_dtype dt, int64_t width) {
    cJSON *e = cJSON_CreateObject();
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    if (!shape || !cJSON_AddStringToObject(e, "name", name) || !cJSON_AddStringToObject(e, "dtype", og_dtype_name(dt)) ||
        !add_owned(shape, cJSON_CreateString("T")) || (width && !add_owned(shape, cJSON_CreateNumber((double)width)))) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

/* The manifest as JSON text (owned by the caller: cJSON_free), NULL when out of memory. */
static char *build_manifest(og_program_writer *w) {
    const og_program_model *m = &w->model;
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddNumberToObject(root, "format_version", OG_PROGRAM_FORMAT_VERSION);

    cJSON *mo = ok ? cJSON_AddObjectToObject(root, "model") : NULL;
    ok = mo && cJSON_AddStringToObject(mo, "family", m->family) &&
         cJSON_AddStringToObject(mo, "activation_dtype", og_dtype_name(m->activation_dtype)) &&
         cJSON_AddNumberToObject(mo, "vocab_size", (double)m->vocab_size) &&
         cJSON_AddNumberToObject(mo, "hidden_size", (double)m->hidden_size) &&
         cJSON_AddNumberToObject(mo, "intermediate_size", (double)m->intermediate_size) &&
         cJSON_AddNumberToObject(mo, "num_hidden_layers", m->num_hidden_layers) &&
         cJSON_AddNumberToObject(mo, "num_attention_heads", m->num_attention_heads) &&
         cJSON_AddNumberToObject(mo, "num_key_value_heads", m->num_key_value_heads) &&
         cJSON_AddNumberToObject(mo, "head_dim", m->head_dim) &&
         cJSON_AddNumberToObject(mo, "rms_norm_eps", m->rms_norm_eps) &&
         cJSON_AddBoolToObject(mo, "tie_word_embeddings", m->tie_word_embeddings);
    cJSON *rope = ok ? cJSON_AddObjectToObject(mo, "rope") : NULL;
    ok = rope && cJSON_AddNumberToObject(rope, "theta", m->rope.theta) &&
         cJSON_AddStringToObject(rope, "type", og_rope_type_name(m->rope.type)) &&
         cJSON_AddNumberToObject(rope, "factor", m->rope.factor) &&
         cJSON_AddNumberToObject(rope, "low_freq_factor", m->rope.low_freq_factor) &&
         cJSON_AddNumberToObject(rope, "high_freq_factor", m->rope.high_freq_factor) &&
         cJSON_AddNumberToObject(rope, "original_max_position_embeddings",
                                 (double)m->rope.original_max_position_embeddings);
    if (ok && w->model_extra) {
        cJSON *e = w->model_extra->child;
        while (ok && e) {
            cJSON *next = e->next;
            if (!cJSON_GetObjectItemCaseSensitive(mo, e->string)) {
                cJSON *c = cJSON_Duplicate(e, 1);
                ok = c && cJSON_AddItemToObject(mo, e->string, c);
                if (!ok) cJSON_Delete(c);
            }
            e = next;
        }
    }

    cJSON *kv = ok ? cJSON_AddObjectToObject(root, "kv") : NULL;
    ok = kv && cJSON_AddNumberToObject(kv, "version", w->kv.version) &&
         cJSON_AddStringToObject(kv, "kv_dtype", og_dtype_name(w->kv.kv_dtype)) &&
         cJSON_AddNumberToObject(kv, "max_capacity", (double)w->kv.max_capacity) &&
         cJSON_AddNumberToObject(kv, "initial_capacity", (double)w->kv.initial_capacity) &&
         cJSON_AddNumberToObject(kv, "max_write", w->kv.max_write);
    cJSON *layers = ok ? cJSON_AddArrayToObject(kv, "layers") : NULL;
    ok = ok && layers;
    for (int32_t i = 0; ok && i < w->kv.n_layers; i++) {
        const og_kv_layer_config *l = &w->layers[i];
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(layers, e) && cJSON_AddNumberToObject(e, "layer_id", l->layer_id) &&
             cJSON_AddStringToObject(e, "policy", l->policy == OG_KV_RING ? "ring" : "flat") &&
             cJSON_AddNumberToObject(e, "window", l->window) && cJSON_AddNumberToObject(e, "n_kv_heads", l->n_kv_heads) &&
             cJSON_AddNumberToObject(e, "head_dim", l->head_dim);
    }
    cJSON *states = ok && w->kv.n_states > 0 ? cJSON_AddArrayToObject(kv, "states") : NULL;
    ok = ok && (w->kv.n_states == 0 || states);
    for (int32_t i = 0; ok && i < w->kv.n_states; i++) {
        const og_kv_state_config *sc = &w->states[i];
        char sn[sizeof sc->name + 1] = "";
        memcpy(sn, sc->name, sizeof sc->name);
        cJSON *e = cJSON_CreateObject(), *shape = e ? cJSON_CreateArray() : NULL;
        ok = e && cJSON_AddItemToArray(states, e) && cJSON_AddNumberToObject(e, "layer_id", sc->layer_id) &&
             cJSON_AddStringToObject(e, "name", sn) && cJSON_AddStringToObject(e, "dtype", og_dtype_name(sc->dtype)) &&
             shape && cJSON_AddItemToObject(e, "shape", shape);
        if (!ok) cJSON_Delete(shape);
        for (int32_t k = 0; ok && k < sc->rank && k < OG_KV_STATE_MAX_RANK; k++)
            ok = add_owned(shape, cJSON_CreateNumber((double)sc->shape[k]));
    }

    cJSON *tensors = ok ? cJSON_AddArrayToObject(root, "tensors") : NULL;
    ok = ok && tensors;
    for (int32_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        cJSON *e = cJSON_CreateObject();
        cJSON *shape = e ? cJSON_CreateArray() : NULL;
        ok = e && cJSON_AddItemToArray(tensors, e) && cJSON_AddStringToObject(e, "name", t->name) &&
             cJSON_AddStringToObject(e, "dtype", og_dtype_name(t->dtype)) && shape &&
             cJSON_AddItemToObject(e, "shape", shape);
        if (!ok) cJSON_Delete(shape);
        for (int32_t k = 0; ok && k < t->rank; k++) ok = add_owned(shape, cJSON_CreateNumber((double)t->shape[k]));
        if (ok && t->binding == OG_BINDING_WEIGHT)
            ok = cJSON_AddStringToObject(e, "binding", "weight") &&
                 cJSON_AddNumberToObject(e, "offset", (double)t->offset) &&
                 cJSON_AddNumberToObject(e, "nbytes", (double)t->nbytes);
        else if (ok && t->state >= 0) {
            char sn[sizeof w->states[0].name + 1] = "";
            memcpy(sn, w->states[t->state].name, sizeof w->states[0].name);
            ok = cJSON_AddStringToObject(e, "binding", "runtime") && cJSON_AddNumberToObject(e, "layer_id", t->layer_id) &&
                 cJSON_AddStringToObject(e, "state", sn);
        } else if (ok)
            ok = cJSON_AddStringToObject(e, "binding", "runtime") && cJSON_AddNumberToObject(e, "layer_id", t->layer_id) &&
                 cJSON_AddStringToObject(e, "kv", t->part == OG_KV_PART_V ? "v" : "k");
    }

    cJSON *inputs = ok ? cJSON_AddArrayToObject(root, "inputs") : NULL;
    ok = inputs && add_owned(inputs, io_entry("tokens", OG_DTYPE_I32, 0)) &&
         add_owned(inputs, io_entry("positions", OG_DTYPE_I32, 0));
    cJSON *outputs = ok ? cJSON_AddArrayToObject(root, "outputs") : NULL;
    ok = outputs && add_owned(outputs, io_entry("logits", m->activation_dtype, m->vocab_size));
    cJSON *instrs = ok ? cJSON_Duplicate(w->instrs, 1) : NULL;
    ok = instrs && cJSON_AddItemToObject(root, "instructions", instrs);
    if (!ok) cJSON_Delete(instrs);

    if (ok && w->tok_json) {
        cJSON *t = cJSON_AddObjectToObject(root, "tokenizer");
        ok = t && cJSON_AddStringToObject(t, "json", w->tok_json) &&
             (w->tok_config ? cJSON_AddStringToObject(t, "config", w->tok_config) != NULL
                            : cJSON_AddNullToObject(t, "config") != NULL);
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

static uint64_t align_up(uint64_t x) { return (x + OG_PROGRAM_ALIGN - 1) / OG_PROGRAM_ALIGN * OG_PROGRAM_ALIGN; }

static og_status write_all(og_program_writer *w, FILE *f, const void *buf, size_t n, const char *tmp) {
    if (n && fwrite(buf, 1, n, f) != n)
        return WFAIL(OG_ERR_IO, "program writer: writing %s failed: %s", tmp, strerror(errno));
    return OG_OK;
}

static og_status write_zeros(og_program_writer *w, FILE *f, uint64_t n, const char *tmp) {
    static const uint8_t zeros[OG_PROGRAM_ALIGN];
    return write_all(w, f, zeros, (size_t)n, tmp);
}

/* Writes the whole file to tmp; the caller removes it on failure. */
static og_status write_file(og_program_writer *w, const char *tmp, og_program_progress_fn progress, void *pctx) {
    uint64_t payload = 0, biggest = 0;
    for (int32_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        if (t->binding != OG_BINDING_WEIGHT) continue;
        t->offset = align_up(payload);
        payload = t->offset + t->nbytes;
        if (!t->bytes && t->nbytes > biggest) biggest = t->nbytes;
    }
    char *manifest = build_manifest(w);
    if (!manifest) return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory building the manifest");
    uint64_t mlen = strlen(manifest);
    uint64_t poff = align_up(OG_PROGRAM_HEADER_SIZE + mlen);
    uint8_t hdr[OG_PROGRAM_HEADER_SIZE];
    memcpy(hdr, OG_PROGRAM_MAGIC, OG_PROGRAM_MAGIC_SIZE);
    og_put_le32(hdr + OG_HDR_VERSION, OG_PROGRAM_FORMAT_VERSION);
    og_put_le32(hdr + OG_HDR_FLAGS, 0);
    og_put_le64(hdr + OG_HDR_MANIFEST_LEN, mlen);
    og_put_le64(hdr + OG_HDR_PAYLOAD_OFFSET, poff);
    og_put_le64(hdr + OG_HDR_PAYLOAD_BYTES, payload);

    FILE *f = fopen(tmp, "wb");
    if (!f) {
        cJSON_free(manifest);
        return WFAIL(OG_ERR_IO, "program writer: cannot create %s: %s", tmp, strerror(errno));
    }
    uint8_t *buf = biggest ? og_malloc((size_t)biggest) : NULL;
    og_status st = biggest && !buf ? WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory for a %llu-byte tensor",
                                           (unsigned long long)biggest)
                                   : OG_OK;
    if (st == OG_OK) st = write_all(w, f, hdr, sizeof hdr, tmp);
    if (st == OG_OK) st = write_all(w, f, manifest, (size_t)mlen, tmp);
    if (st == OG_OK) st = write_zeros(w, f, poff - OG_PROGRAM_HEADER_SIZE - mlen, tmp);
    cJSON_free(manifest);
    uint64_t done = 0;
    if (st == OG_OK && progress) st = progress(pctx, 0, payload);
    for (int32_t i = 0; st == OG_OK && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if (t->binding != OG_BINDING_WEIGHT) continue;
        st = write_zeros(w, f, t->offset - done, tmp);
        const void *src = t->bytes;
        if (st == OG_OK && !src) {
            st = t->fill(t->ctx, buf, (size_t)t->nbytes);
            if (st != OG_OK)
                WFAIL(st, "program writer: filling tensor \"%s\" failed: %s", t->name, og_status_str(st));
            src = buf;
        }
        if (st == OG_OK) st = write_all(w, f, src, (size_t)t->nbytes, tmp);
        done = t->offset + t->nbytes;
        if (st == OG_OK && progress) {
            st = progress(pctx, done, payload);
            if (st != OG_OK) WFAIL(st, "program writer: cancelled by the progress callback at %llu bytes",
                                   (unsigned long long)done);
        }
    }
    og_free(buf);
    if (st == OG_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = WFAIL(OG_ERR_IO, "program writer: flushing %s failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == OG_OK) st = WFAIL(OG_ERR_IO, "program writer: closing %s failed: %s", tmp, strerror(errno));
    return st;
}

og_status og_program_writer_finish(og_program_writer *w, og_program_progress_fn progress, void *ctx) {
    if (!w) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_writer_finish: NULL writer");
    if (!w->have_model || !w->have_kv)
        return WFAIL(OG_ERR_STATE, "program writer: set the model and the KV manifest before finishing");
    size_t n = strlen(w->path) + 5;
    char *tmp = og_malloc(n);
    if (!tmp) return WFAIL(OG_ERR_OUT_OF_MEMORY, "program writer: out of memory");
    snprintf(tmp, n, "%s.tmp", w->path);
    og_status st = write_file(w, tmp, progress, ctx);
    if (st == OG_OK) {
        og_program *check = NULL;
        st = og_program_open(tmp, &check);
        if (st != OG_OK) {
            char why[OG_ERRMSG_CAP];
            snprintf(why, sizeof why, "%s", og_last_error());
            WFAIL(st, "program writer: the written program fails validation: %s", why);
        }
        og_program_close(check);
    }
    if (st == OG_OK && rename(tmp, w->path) != 0)
        st = WFAIL(OG_ERR_IO, "program writer: cannot rename %s onto %s: %s", tmp, w->path, strerror(errno));
    if (st != OG_OK) unlink(tmp);
    og_free(tmp);
    return st;
}
