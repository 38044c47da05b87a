/* GGUF reader (see gguf.h): a cursor over the mapped bytes that checks
 * every read against the end, then tensor infos checked against the data
 * section. */
#include "import/gguf.h"

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct og_gguf {
    char *origin;
    void *map; /* mmap'd file, or NULL for a borrowed buffer */
    size_t map_size;
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    og_gguf_kv *kv;
    int64_t n_kv;
    og_gguf_kv **kv_by_key; /* [n_kv] sorted by key */
    og_gguf_tensor *tensors;
    int64_t n_tensors;
    og_gguf_tensor **by_name; /* [n_tensors] sorted by name */
};

/* ------------------------------------------------------------ type tables */

static const char *const k_vtype_names[OG_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
/* bytes of a scalar of each type; 0 for string and array */
static const uint8_t k_vtype_size[OG_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *og_gguf_vtype_name(uint32_t t) { return t < OG_GGUF_VTYPE_COUNT ? k_vtype_names[t] : "unknown"; }

typedef struct ggml_type_info {
    const char *name;
    uint32_t block;  /* elements per block                    */
    uint32_t bytes;  /* bytes per block; 0: layout not known   */
} ggml_type_info;

/* Indexed by ggml type number; a NULL name is a number not in use. */
static const ggml_type_info k_ggml_types[] = {
    [0] = {"f32", 1, 4},        [1] = {"f16", 1, 2},       [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},     [6] = {"q5_0", 32, 22},    [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},     [9] = {"q8_1", 32, 36},    [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},  [12] = {"q4_K", 256, 144}, [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},  [15] = {"q8_K", 256, 292}, [16] = {"iq2_xxs", 256, 0},
    [17] = {"iq2_xs", 256, 0},  [18] = {"iq3_xxs", 256, 0}, [19] = {"iq1_s", 256, 0},
    [20] = {"iq4_nl", 32, 0},   [21] = {"iq3_s", 256, 0},  [22] = {"iq2_s", 256, 0},
    [23] = {"iq4_xs", 256, 0},  [24] = {"i8", 1, 1},       [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},       [27] = {"i64", 1, 8},      [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 0},   [30] = {"bf16", 1, 2},     [34] = {"tq1_0", 256, 0},
    [35] = {"tq2_0", 256, 0},   [39] = {"mxfp4", 32, 0},
};
#define N_GGML_TYPES (sizeof k_ggml_types / sizeof k_ggml_types[0])

const char *og_ggml_type_name(uint32_t t) { return t < N_GGML_TYPES ? k_ggml_types[t].name : NULL; }

/* ------------------------------------------------------------ accessors */

const char *og_gguf_origin(const og_gguf *g) { return g ? g->origin : ""; }
uint32_t og_gguf_version(const og_gguf *g) { return g ? g->version : 0; }
uint64_t og_gguf_alignment(const og_gguf *g) { return g ? g->alignment : 0; }
int64_t og_gguf_n_kv(const og_gguf *g) { return g ? g->n_kv : 0; }
int64_t og_gguf_n_tensors(const og_gguf *g) { return g ? g->n_tensors : 0; }

const og_gguf_kv *og_gguf_kv_at(const og_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const og_gguf_tensor *og_gguf_tensor_at(const og_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

static int cmp_kv_ptr(const void *a, const void *b) {
    return strcmp((*(og_gguf_kv *const *)a)->key, (*(og_gguf_kv *const *)b)->key);
}

const og_gguf_kv *og_gguf_find_kv(const og_gguf *g, const char *key) {
    if (!g || !key || !g->kv_by_key) return NULL;
    og_gguf_kv k = {.key = (char *)key}, *kp = &k;
    og_gguf_kv **hit = bsearch(&kp, g->kv_by_key, (size_t)g->n_kv, sizeof kp, cmp_kv_ptr);
    return hit ? *hit : NULL;
}

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(og_gguf_tensor *const *)a)->name, (*(og_gguf_tensor *const *)b)->name);
}

const og_gguf_tensor *og_gguf_find_tensor(const og_gguf *g, const char *name) {
    if (!g || !name || g->n_tensors == 0) return NULL;
    og_gguf_tensor key = {.name = (char *)name}, *kp = &key;
    og_gguf_tensor **hit = bsearch(&kp, g->by_name, (size_t)g->n_tensors, sizeof kp, cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

void og_gguf_close(og_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        og_free(g->kv[i].key);
        og_free(g->kv[i].strs);
    }
    og_free(g->kv);
    og_free(g->kv_by_key);
    for (int64_t i = 0; i < g->n_tensors; i++) og_free(g->tensors[i].name);
    og_free(g->tensors);
    og_free(g->by_name);
    if (g->map) munmap(g->map, g->map_size);
    og_free(g->origin);
    og_free(g);
}

/* ------------------------------------------------------------ the cursor */

typedef struct cursor {
    const og_gguf *g;
    size_t pos;
} cursor;

static size_t left(const cursor *c) { return c->g->size - c->pos; }

/* Reads n bytes; the message names `what` when they are not there. */
static og_status take(cursor *c, size_t n, const char *what, const uint8_t **p) {
    if (n > left(c))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s at byte %zu: needs %zu bytes, the file has %zu left",
                            c->g->origin, what, c->pos, n, left(c));
    *p = c->g->base + c->pos;
    c->pos += n;
    return OG_OK;
}

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static og_status rd_u32(cursor *c, const char *what, uint32_t *out) {
    const uint8_t *p = NULL;
    og_status rc = take(c, 4, what, &p);
    if (rc == OG_OK) *out = (uint32_t)le(p, 4);
    return rc;
}

static og_status rd_u64(cursor *c, const char *what, uint64_t *out) {
    const uint8_t *p = NULL;
    og_status rc = take(c, 8, what, &p);
    if (rc == OG_OK) *out = le(p, 8);
    return rc;
}

static og_status rd_str(cursor *c, const char *what, og_gguf_str *s) {
    uint64_t n;
    og_status rc = rd_u64(c, what, &n);
    if (rc != OG_OK) return rc;
    if (n > left(c))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s at byte %zu: length %llu exceeds the %zu bytes left",
                            c->g->origin, what, c->pos - 8, (unsigned long long)n, left(c));
    const uint8_t *p = NULL;
    take(c, (size_t)n, what, &p);
    s->p = (const char *)p;
    s->len = n;
    return OG_OK;
}

/* A NUL-terminated copy of s (no embedded NUL allowed). */
static og_status dup_str(const og_gguf *g, og_gguf_str s, const char *what, char **out) {
    if (memchr(s.p, 0, (size_t)s.len))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s contains a NUL byte", g->origin, what);
    char *d = og_malloc((size_t)s.len + 1);
    if (!d) return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    memcpy(d, s.p, (size_t)s.len);
    d[s.len] = 0;
    *out = d;
    return OG_OK;
}

/* ------------------------------------------------------------ key/values */

static void scalar(og_gguf_kv *kv, og_gguf_vtype t, const uint8_t *p) {
    uint64_t raw = le(p, k_vtype_size[t]);
    switch (t) {
    case OG_GGUF_I8: kv->i = (int8_t)raw; break;
    case OG_GGUF_I16: kv->i = (int16_t)raw; break;
    case OG_GGUF_I32: kv->i = (int32_t)raw; break;
    case OG_GGUF_I64: kv->i = (int64_t)raw; break;
    case OG_GGUF_F32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        kv->f = f;
        break;
    }
    case OG_GGUF_F64: memcpy(&kv->f, &raw, 8); break;
    default: kv->u = raw; break; /* u8..u64, bool */
    }
}

static og_status parse_value(cursor *c, og_gguf_kv *kv) {
    const og_gguf *g = c->g;
    const uint8_t *p = NULL;
    og_status rc;
    if (kv->type == OG_GGUF_STRING) return rd_str(c, kv->key, &kv->s);
    if (kv->type != OG_GGUF_ARRAY) {
        if ((rc = take(c, k_vtype_size[kv->type], kv->key, &p)) != OG_OK) return rc;
        scalar(kv, kv->type, p);
        if (kv->type == OG_GGUF_BOOL && kv->u > 1)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\": bool value %llu is not 0 or 1", g->origin,
                                kv->key, (unsigned long long)kv->u);
        return OG_OK;
    }
    uint32_t et;
    if ((rc = rd_u32(c, kv->key, &et)) != OG_OK || (rc = rd_u64(c, kv->key, &kv->count)) != OG_OK) return rc;
    if (et >= OG_GGUF_VTYPE_COUNT)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\": unknown array element type %u", g->origin,
                            kv->key, et);
    if (et == OG_GGUF_ARRAY)
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"%s\": arrays of arrays are not supported",
                            g->origin, kv->key);
    kv->elem_type = (og_gguf_vtype)et;
    kv->elems = g->base + c->pos;
    /* the smallest element is 1 byte (8 for a string's length): the count
     * is bounded by what is left before anything is sized from it */
    const size_t min = et == OG_GGUF_STRING ? 8 : k_vtype_size[et];
    if (kv->count > left(c) / min)
        return og_set_error(OG_ERR_FORMAT,
                            "gguf %s: key \"%s\": array of %llu %s elements does not fit in the %zu bytes left",
                            g->origin, kv->key, (unsigned long long)kv->count, k_vtype_names[et], left(c));
    if (et != OG_GGUF_STRING) {
        take(c, (size_t)kv->count * min, kv->key, &p);
        if (et == OG_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->count; i++)
                if (p[i] > 1)
                    return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\"[%llu]: bool value %u is not 0 or 1",
                                        g->origin, kv->key, (unsigned long long)i, p[i]);
        return OG_OK;
    }
    if (kv->count && !(kv->strs = og_calloc((size_t)kv->count, sizeof *kv->strs)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    for (uint64_t i = 0; i < kv->count; i++)
        if ((rc = rd_str(c, kv->key, &kv->strs[i])) != OG_OK) return rc;
    return OG_OK;
}

static og_status parse_kvs(cursor *c, og_gguf *g, uint64_t n) {
    /* a key/value takes at least 8 (key length) + 4 (type) + 1 bytes */
    if (n > OG_GGUF_MAX_KV || n > left(c) / 13)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: header field \"metadata_kv_count\" = %llu: more than the file can hold",
                            g->origin, (unsigned long long)n);
    if (n && !(g->kv = og_calloc((size_t)n, sizeof *g->kv)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    og_status rc;
    for (uint64_t i = 0; i < n; i++) {
        og_gguf_kv *kv = &g->kv[i];
        og_gguf_str key;
        char what[48];
        snprintf(what, sizeof what, "key of metadata entry %llu", (unsigned long long)i);
        if ((rc = rd_str(c, what, &key)) != OG_OK) return rc;
        if (key.len == 0 || key.len > OG_GGUF_MAX_KEY)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: %s: length %llu is not in [1, %d]", g->origin, what,
                                (unsigned long long)key.len, OG_GGUF_MAX_KEY);
        if ((rc = dup_str(g, key, what, &kv->key)) != OG_OK) return rc;
        g->n_kv = (int64_t)i + 1; /* owns kv->key from here */
        uint32_t t;
        if ((rc = rd_u32(c, kv->key, &t)) != OG_OK) return rc;
        if (t >= OG_GGUF_VTYPE_COUNT)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\": unknown value type %u", g->origin, kv->key, t);
        kv->type = (og_gguf_vtype)t;
        if ((rc = parse_value(c, kv)) != OG_OK) return rc;
    }
    if (n == 0) return OG_OK;
    if (!(g->kv_by_key = og_malloc((size_t)n * sizeof *g->kv_by_key)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    for (uint64_t i = 0; i < n; i++) g->kv_by_key[i] = &g->kv[i];
    qsort(g->kv_by_key, (size_t)n, sizeof *g->kv_by_key, cmp_kv_ptr);
    for (uint64_t i = 1; i < n; i++)
        if (!strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key))
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" is given twice", g->origin, g->kv_by_key[i]->key);
    return OG_OK;
}

/* ------------------------------------------------------------ tensors */

static og_status parse_tensor_info(cursor *c, og_gguf *g, uint64_t i) {
    og_gguf_tensor *t = &g->tensors[i];
    og_gguf_str name;
    char what[48];
    og_status rc;
    snprintf(what, sizeof what, "name of tensor %llu", (unsigned long long)i);
    if ((rc = rd_str(c, what, &name)) != OG_OK) return rc;
    if (name.len == 0 || name.len > OG_GGUF_MAX_KEY)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s: length %llu is not in [1, %d]", g->origin, what,
                            (unsigned long long)name.len, OG_GGUF_MAX_KEY);
    if ((rc = dup_str(g, name, what, &t->name)) != OG_OK) return rc;
    g->n_tensors = (int64_t)i + 1;
    uint32_t nd, type;
    if ((rc = rd_u32(c, t->name, &nd)) != OG_OK) return rc;
    if (nd < 1 || nd > OG_GGUF_MAX_DIMS)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": n_dims %u is not in [1, %d]", g->origin,
                            t->name, nd, OG_GGUF_MAX_DIMS);
    t->n_dims = (int32_t)nd;
    t->numel = 1;
    for (int d = 0; d < OG_GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if ((uint32_t)d < nd && (rc = rd_u64(c, t->name, &ne)) != OG_OK) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX || !og_mul_overflow_i64(t->numel, (int64_t)ne, &t->numel))
            return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": ne[%d] = %llu: zero, or too many elements",
                                g->origin, t->name, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = rd_u32(c, t->name, &type)) != OG_OK || (rc = rd_u64(c, t->name, &t->offset)) != OG_OK) return rc;
    t->type = type;
    const char *tn = og_ggml_type_name(type);
    if (!tn) return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": unknown ggml type %u", g->origin, t->name, type);
    const ggml_type_info *ti = &k_ggml_types[type];
    if (t->ne[0] % ti->block)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": ne[0] = %lld is not a multiple of the %s block of %u",
                            g->origin, t->name, (long long)t->ne[0], tn, ti->block);
    int64_t nbytes = 0;
    if (ti->bytes && !og_mul_overflow_i64(t->numel / ti->block, ti->bytes, &nbytes))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": size overflows", g->origin, t->name);
    t->nbytes = (uint64_t)nbytes;
    return OG_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const og_gguf_tensor *x = *(og_gguf_tensor *const *)a, *y = *(og_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Alignment, then each tensor inside the data section, aligned, not
 * overlapping another, names unique. */
static og_status place_tensors(cursor *c, og_gguf *g) {
    og_status rc;
    g->alignment = 32;
    const og_gguf_kv *al = og_gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != OG_GGUF_U32)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"general.alignment\" has type %s, not u32", g->origin,
                                k_vtype_names[al->type]);
        if (al->u == 0 || (al->u & (al->u - 1)) || al->u > OG_GGUF_MAX_ALIGNMENT)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"general.alignment\" = %llu: not a power of two up to %u",
                                g->origin, (unsigned long long)al->u, OG_GGUF_MAX_ALIGNMENT);
        g->alignment = al->u;
    }
    size_t start = c->pos + (size_t)((g->alignment - c->pos % g->alignment) % g->alignment);
    if (g->n_tensors && start > g->size)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: the data section (byte %zu) starts past the end of the file (%zu bytes)",
                            g->origin, start, g->size);
    const uint64_t data_size = start <= g->size ? g->size - start : 0;
    if (g->n_tensors == 0) return OG_OK;
    og_gguf_tensor **order = og_malloc((size_t)g->n_tensors * sizeof *order);
    g->by_name = og_malloc((size_t)g->n_tensors * sizeof *g->by_name);
    if (!order || !g->by_name) {
        og_free(order);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    }
    rc = OG_OK;
    for (int64_t i = 0; i < g->n_tensors && rc == OG_OK; i++) {
        og_gguf_tensor *t = &g->tensors[i];
        order[i] = g->by_name[i] = t;
        if (t->offset % g->alignment)
            rc = og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": offset %llu is not a multiple of the alignment %llu",
                              g->origin, t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            rc = og_set_error(OG_ERR_FORMAT,
                              "gguf %s: tensor \"%s\": bytes [%llu, +%llu) of the data section lie past its end (%llu bytes)",
                              g->origin, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                              (unsigned long long)data_size);
        else
            t->data = g->base + start + t->offset;
    }
    if (rc == OG_OK) {
        qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_offset);
        for (int64_t i = 1; i < g->n_tensors && rc == OG_OK; i++)
            if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset)
                rc = og_set_error(OG_ERR_FORMAT, "gguf %s: tensors \"%s\" and \"%s\" overlap", g->origin,
                                  order[i - 1]->name, order[i]->name);
        qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_tensor_ptr);
        for (int64_t i = 1; i < g->n_tensors && rc == OG_OK; i++)
            if (!strcmp(g->by_name[i - 1]->name, g->by_name[i]->name))
                rc = og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\" is given twice", g->origin, g->by_name[i]->name);
    }
    og_free(order);
    return rc;
}

static og_status parse(og_gguf *g) {
    cursor c = {g, 0};
    const uint8_t *p = NULL;
    og_status rc;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: not a GGUF file (no \"GGUF\" magic)", g->origin);
    take(&c, 4, "magic", &p);
    if ((rc = rd_u32(&c, "header field \"version\"", &g->version)) != OG_OK) return rc;
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && (g->version >> 24) <= 3)
            return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: big-endian GGUF files are not supported", g->origin);
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: header field \"version\" = %u: not supported (2, 3)",
                            g->origin, g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&c, "header field \"tensor_count\"", &n_tensors)) != OG_OK ||
        (rc = rd_u64(&c, "header field \"metadata_kv_count\"", &n_kv)) != OG_OK)
        return rc;
    if ((rc = parse_kvs(&c, g, n_kv)) != OG_OK) return rc;
    /* a tensor info takes at least 8 + 1 (name) + 4 + 8 + 4 + 8 bytes */
    if (n_tensors > OG_GGUF_MAX_TENSORS || n_tensors > left(&c) / 33)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: header field \"tensor_count\" = %llu: more than the file can hold",
                            g->origin, (unsigned long long)n_tensors);
    if (n_tensors && !(g->tensors = og_calloc((size_t)n_tensors, sizeof *g->tensors)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf %s: out of memory", g->origin);
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((rc = parse_tensor_info(&c, g, i)) != OG_OK) return rc;
    return place_tensors(&c, g);
}

og_status og_gguf_open_memory(const void *data, size_t size, const char *origin, og_gguf **out) {
    if (!out || (!data && size)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "gguf: NULL argument");
    *out = NULL;
    og_gguf *g = og_calloc(1, sizeof *g);
    if (!g || !(g->origin = og_strdup(origin ? origin : "buffer"))) {
        og_free(g);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    }
    static const uint8_t empty[1];
    g->base = data ? data : empty;
    g->size = size;
    og_status rc = parse(g);
    if (rc != OG_OK) {
        og_gguf_close(g);
        return rc;
    }
    *out = g;
    return OG_OK;
}

og_status og_gguf_open_file(const char *path, og_gguf **out) {
    if (!path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "gguf: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return og_set_error(OG_ERR_IO, "gguf %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return og_set_error(OG_ERR_IO, "gguf %s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0 && (map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
        int err = errno;
        close(fd);
        return og_set_error(OG_ERR_IO, "gguf %s: mmap failed: %s", path, strerror(err));
    }
    close(fd);
    og_gguf *g = NULL;
    og_status rc = og_gguf_open_memory(map, size, path, &g);
    if (rc != OG_OK) {
        if (map) munmap(map, size);
        return rc;
    }
    g->map = map;
    g->map_size = size;
    *out = g;
    return OG_OK;
}

/* ------------------------------------------------------------ typed look-ups */

static og_status absent(const og_gguf *g, const char *key, bool required, bool *found) {
    if (found) *found = false;
    return required ? og_set_error(OG_ERR_FORMAT, "gguf %s: required key \"%s\" is missing", g->origin, key) : OG_OK;
}

static og_status wrong_type(const og_gguf *g, const og_gguf_kv *kv, const char *want) {
    return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" has type %s, expected %s", g->origin, kv->key,
                        k_vtype_names[kv->type], want);
}

og_status og_gguf_get_int(const og_gguf *g, const char *key, bool required, int64_t lo, int64_t hi,
                          int64_t *out, bool *found) {
    const og_gguf_kv *kv = og_gguf_find_kv(g, key);
    if (!kv) return absent(g, key, required, found);
    switch (kv->type) {
    case OG_GGUF_U8: case OG_GGUF_U16: case OG_GGUF_U32: case OG_GGUF_U64:
        if (kv->u > (uint64_t)INT64_MAX || (int64_t)kv->u < lo || (int64_t)kv->u > hi)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" = %llu: not in [%lld, %lld]", g->origin, key,
                                (unsigned long long)kv->u, (long long)lo, (long long)hi);
        *out = (int64_t)kv->u;
        break;
    case OG_GGUF_I8: case OG_GGUF_I16: case OG_GGUF_I32: case OG_GGUF_I64:
        if (kv->i < lo || kv->i > hi)
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" = %lld: not in [%lld, %lld]", g->origin, key,
                                (long long)kv->i, (long long)lo, (long long)hi);
        *out = kv->i;
        break;
    default: return wrong_type(g, kv, "an integer");
    }
    if (found) *found = true;
    return OG_OK;
}

og_status og_gguf_get_float(const og_gguf *g, const char *key, bool required, double *out, bool *found) {
    const og_gguf_kv *kv = og_gguf_find_kv(g, key);
    if (!kv) return absent(g, key, required, found);
    if (kv->type != OG_GGUF_F32 && kv->type != OG_GGUF_F64) return wrong_type(g, kv, "f32 or f64");
    *out = kv->f;
    if (found) *found = true;
    return OG_OK;
}

og_status og_gguf_get_bool(const og_gguf *g, const char *key, bool required, bool *out, bool *found) {
    const og_gguf_kv *kv = og_gguf_find_kv(g, key);
    if (!kv) return absent(g, key, required, found);
    if (kv->type != OG_GGUF_BOOL) return wrong_type(g, kv, "bool");
    *out = kv->u != 0;
    if (found) *found = true;
    return OG_OK;
}

og_status og_gguf_get_str(const og_gguf *g, const char *key, bool required, char **out, bool *found) {
    const og_gguf_kv *kv = og_gguf_find_kv(g, key);
    if (!kv) return absent(g, key, required, found);
    if (kv->type != OG_GGUF_STRING) return wrong_type(g, kv, "string");
    char what[96];
    snprintf(what, sizeof what, "key \"%.60s\"", key);
    og_status rc = dup_str(g, kv->s, what, out);
    if (rc == OG_OK && found) *found = true;
    return rc;
}
