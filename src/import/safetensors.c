/* safetensors reader: header parsing and validation, read-only mapping,
 * single files and sharded checkpoints. */
#include "import/safetensors.h"

#include "core/core.h"
#include "core/textfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_file {
    char *path;        /* owned                                   */
    void *map;         /* mmap'd region, or NULL for a borrowed buffer */
    size_t map_size;
} st_file;

struct og_safetensors {
    st_file *files;
    int32_t n_files;
    og_st_tensor *tensors; /* sorted by name; names owned here */
    int64_t n_tensors;
};

/* Largest integer a JSON number (a double) holds exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

void og_safetensors_close(og_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) og_free((void *)st->tensors[i].name);
    og_free(st->tensors);
    for (int32_t i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_size);
        og_free(st->files[i].path);
    }
    og_free(st->files);
    og_free(st);
}

int64_t og_safetensors_count(const og_safetensors *st) { return st ? st->n_tensors : 0; }

const og_st_tensor *og_safetensors_at(const og_safetensors *st, int64_t i) {
    if (!st || i < 0 || i >= st->n_tensors) return NULL;
    return &st->tensors[i];
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const og_st_tensor *)a)->name, ((const og_st_tensor *)b)->name);
}

const og_st_tensor *og_safetensors_find(const og_safetensors *st, const char *name) {
    if (!st || !name || st->n_tensors == 0) return NULL;
    og_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_tensor_name);
}

static bool parse_dtype(const char *s, og_dtype *out) {
    if (!strcmp(s, "F32")) *out = OG_DTYPE_F32;
    else if (!strcmp(s, "BF16")) *out = OG_DTYPE_BF16;
    else if (!strcmp(s, "F16")) *out = OG_DTYPE_F16;
    else return false;
    return true;
}

/* A JSON number that is a non-negative integer a double holds exactly. */
static bool json_uint(const cJSON *j, int64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v <= ST_MAX_JSON_INT) || v != (double)(int64_t)v) return false;
    *out = (int64_t)v;
    return true;
}

typedef struct span {
    int64_t begin, end;
    const char *name;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Parses one tensor entry of the header into t (name not yet set). */
static og_status parse_entry(const char *origin, const cJSON *e, const uint8_t *data,
                             int64_t data_size, og_st_tensor *t, span *sp) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": entry is not an object",
                            origin, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd))
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": \"dtype\" missing or not a string",
                            origin, name);
    if (!parse_dtype(jd->valuestring, &t->dtype))
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "safetensors %s: tensor \"%s\": dtype \"%s\" is not supported (F32, BF16, F16)",
                            origin, name, jd->valuestring);
    if (!cJSON_IsArray(js))
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": \"shape\" missing or not an array",
                            origin, name);
    int rank = cJSON_GetArraySize(js);
    if (rank > OG_ST_MAX_RANK)
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": rank %d exceeds %d", origin,
                            name, rank, OG_ST_MAX_RANK);
    t->rank = rank;
    int64_t numel = 1;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        if (!json_uint(x, &t->shape[d]))
            return og_set_error(OG_ERR_FORMAT,
                                "safetensors %s: tensor \"%s\": shape[%d] is not a non-negative integer",
                                origin, name, d);
        if (!og_mul_overflow_i64(numel, t->shape[d], &numel))
            return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": shape product overflows",
                                origin, name);
    }
    t->numel = numel;
    int64_t nbytes;
    if (!og_mul_overflow_i64(numel, (int64_t)og_dtype_size(t->dtype), &nbytes))
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": byte size overflows", origin,
                            name);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &sp->begin) ||
        !json_uint(jo->child->next, &sp->end))
        return og_set_error(OG_ERR_FORMAT,
                            "safetensors %s: tensor \"%s\": \"data_offsets\" is not [begin, end] of "
                            "non-negative integers",
                            origin, name);
    if (sp->begin > sp->end)
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: tensor \"%s\": data_offsets begin %lld > end %lld",
                            origin, name, (long long)sp->begin, (long long)sp->end);
    if (sp->end > data_size)
        return og_set_error(OG_ERR_FORMAT,
                            "safetensors %s: tensor \"%s\": data_offsets end %lld past the data (%lld bytes)",
                            origin, name, (long long)sp->end, (long long)data_size);
    if (sp->end - sp->begin != nbytes)
        return og_set_error(OG_ERR_FORMAT,
                            "safetensors %s: tensor \"%s\": data_offsets span %lld bytes, shape x dtype "
                            "needs %lld",
                            origin, name, (long long)(sp->end - sp->begin), (long long)nbytes);
    t->nbytes = (size_t)nbytes;
    t->data = data + sp->begin;
    sp->name = name;
    return OG_OK;
}

/* Parses a whole file image and appends its tensors to st. `file` is the
 * name stored in each tensor (owned by st). */
static og_status parse_image(og_safetensors *st, const uint8_t *buf, size_t size, const char *origin,
                             const char *file) {
    if (size < 8)
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: %zu bytes, shorter than the 8-byte header length",
                            origin, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n < 2 || n > OG_ST_MAX_HEADER || n > size - 8)
        return og_set_error(OG_ERR_FORMAT,
                            "safetensors %s: header length %llu is out of range (file %zu bytes, at most %u)",
                            origin, (unsigned long long)n, size, OG_ST_MAX_HEADER);
    const char *hdr = (const char *)buf + 8;
    if (hdr[0] != '{')
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: header does not start with '{'", origin);
    cJSON *root = cJSON_ParseWithLength(hdr, (size_t)n);
    if (!root)
        return og_set_error(OG_ERR_FORMAT, "safetensors %s: header is not valid JSON", origin);
    og_status rc = OG_OK;
    span *spans = NULL;
    if (!cJSON_IsObject(root)) {
        rc = og_set_error(OG_ERR_FORMAT, "safetensors %s: header is not a JSON object", origin);
        goto done;
    }
    const uint8_t *data = buf + 8 + n;
    int64_t data_size = (int64_t)(size - 8 - n);
    int64_t count = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                rc = og_set_error(OG_ERR_FORMAT, "safetensors %s: \"__metadata__\" is not an object", origin);
                goto done;
            }
            continue;
        }
        count++;
    }
    og_st_tensor *grown = og_realloc(st->tensors, (size_t)(st->n_tensors + count + 1) * sizeof *grown);
    spans = og_calloc((size_t)count + 1, sizeof *spans);
    if (grown) st->tensors = grown;
    if (!grown || !spans) {
        rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory for %lld tensors", origin,
                          (long long)count);
        goto done;
    }
    int64_t k = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        og_st_tensor t = {0};
        rc = parse_entry(origin, e, data, data_size, &t, &spans[k]);
        if (rc != OG_OK) goto done;
        t.file = file;
        t.name = og_strdup(e->string);
        if (!t.name) {
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory", origin);
            goto done;
        }
        st->tensors[st->n_tensors++] = t;
        k++;
    }
    qsort(spans, (size_t)count, sizeof *spans, cmp_span);
    for (int64_t i = 1; i < count; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            rc = og_set_error(OG_ERR_FORMAT, "safetensors %s: tensors \"%s\" and \"%s\" overlap in the data",
                              origin, spans[i - 1].name, spans[i].name);
            goto done;
        }
    }
done:
    og_free(spans);
    cJSON_Delete(root);
    return rc;
}

/* Sorts by name and refuses duplicates (within a file or across shards). */
static og_status finish_index(og_safetensors *st) {
    if (st->n_tensors > 1)
        qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    for (int64_t i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name))
            return og_set_error(OG_ERR_FORMAT, "safetensors: tensor \"%s\" appears twice (%s, %s)",
                                st->tensors[i].name, st->tensors[i - 1].file, st->tensors[i].file);
    return OG_OK;
}

static st_file *add_file(og_safetensors *st, const char *path) {
    st_file *f = og_realloc(st->files, (size_t)(st->n_files + 1) * sizeof *f);
    if (!f) return NULL;
    st->files = f;
    f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->path = og_strdup(path);
    if (!f->path) return NULL;
    st->n_files++;
    return f;
}

og_status og_safetensors_open_memory(const void *data, size_t size, const char *origin,
                                     og_safetensors **out) {
    if (!out || (!data && size)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "safetensors: NULL argument");
    *out = NULL;
    if (!origin) origin = "<memory>";
    og_safetensors *st = og_calloc(1, sizeof *st);
    st_file *f = st ? add_file(st, origin) : NULL;
    if (!f) {
        og_safetensors_close(st);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory", origin);
    }
    og_status rc = parse_image(st, data, size, origin, f->path);
    if (rc == OG_OK) rc = finish_index(st);
    if (rc != OG_OK) {
        og_safetensors_close(st);
        return rc;
    }
    *out = st;
    return OG_OK;
}

/* Maps path read-only into a new file entry of st and parses it. */
static og_status map_and_parse(og_safetensors *st, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return og_set_error(OG_ERR_IO, "safetensors %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return og_set_error(OG_ERR_IO, "safetensors %s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int err = errno;
            close(fd);
            return og_set_error(OG_ERR_IO, "safetensors %s: mmap failed: %s", path, strerror(err));
        }
    }
    close(fd);
    st_file *f = add_file(st, path);
    if (!f) {
        if (map) munmap(map, size);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory", path);
    }
    f->map = map;
    f->map_size = size;
    static const uint8_t empty[1];
    return parse_image(st, map ? map : empty, size, path, f->path);
}

og_status og_safetensors_open_file(const char *path, og_safetensors **out) {
    if (!path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "safetensors: NULL argument");
    *out = NULL;
    og_safetensors *st = og_calloc(1, sizeof *st);
    if (!st) return og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory", path);
    og_status rc = map_and_parse(st, path);
    if (rc == OG_OK) rc = finish_index(st);
    if (rc != OG_OK) {
        og_safetensors_close(st);
        return rc;
    }
    *out = st;
    return OG_OK;
}

static og_status open_sharded(og_safetensors *st, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    og_status rc = og_read_text_file(index_path, &text, &len);
    if (rc != OG_OK) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    og_free(text);
    if (!root) return og_set_error(OG_ERR_FORMAT, "%s: not valid JSON", index_path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        rc = og_set_error(OG_ERR_FORMAT, "%s: \"weight_map\" missing, empty or not an object", index_path);
        goto done;
    }
    /* Map each distinct shard once, in order of first mention. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, "..")) {
            rc = og_set_error(OG_ERR_FORMAT,
                              "%s: weight_map[\"%s\"] is not a file name in the checkpoint folder",
                              index_path, e->string);
            goto done;
        }
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->valuestring) >= (int)sizeof path) {
            rc = og_set_error(OG_ERR_IO, "%s: shard path too long", index_path);
            goto done;
        }
        bool seen = false;
        for (int32_t i = 0; i < st->n_files && !seen; i++) seen = !strcmp(st->files[i].path, path);
        if (!seen && (rc = map_and_parse(st, path)) != OG_OK) goto done;
    }
    if ((rc = finish_index(st)) != OG_OK) goto done;
    for (const cJSON *e = wm->child; e; e = e->next) {
        const og_st_tensor *t = og_safetensors_find(st, e->string);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        if (!t || strcmp(base ? base + 1 : t->file, e->valuestring)) {
            rc = og_set_error(OG_ERR_FORMAT, "%s: weight_map[\"%s\"] names %s, which does not hold it",
                              index_path, e->string, e->valuestring);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    return rc;
}

og_status og_safetensors_open_dir(const char *dir, og_safetensors **out) {
    if (!dir || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "safetensors: NULL argument");
    *out = NULL;
    char index_path[4096], single[4096];
    if (snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir) >=
            (int)sizeof index_path ||
        snprintf(single, sizeof single, "%s/model.safetensors", dir) >= (int)sizeof single)
        return og_set_error(OG_ERR_IO, "safetensors: folder path too long: %s", dir);
    if (access(index_path, F_OK) != 0) return og_safetensors_open_file(single, out);
    og_safetensors *st = og_calloc(1, sizeof *st);
    if (!st) return og_set_error(OG_ERR_OUT_OF_MEMORY, "safetensors %s: out of memory", dir);
    og_status rc = open_sharded(st, dir, index_path);
    if (rc != OG_OK) {
        og_safetensors_close(st);
        return rc;
    }
    *out = st;
    return OG_OK;
}
