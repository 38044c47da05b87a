/* Opening a program: map the file read-only (or borrow a buffer), validate
 * (validate.c), and the accessors. */
#include "program/program_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t k_empty[1];

static og_status open_data(const void *data, size_t size, void *map, og_program **out) {
    og_program *p = og_calloc(1, sizeof *p);
    if (!p) {
        if (map) munmap(map, size);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "program: out of memory");
    }
    p->data = data;
    p->size = size;
    p->map = map;
    og_status st = og_program_parse(p);
    if (st != OG_OK) {
        og_program_close(p);
        return st;
    }
    *out = p;
    return OG_OK;
}

og_status og_program_open_memory(const void *data, size_t size, og_program **out) {
    if (!out || (!data && size)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_open_memory: NULL argument");
    *out = NULL;
    og_program_set_last_rule(OG_PROGRAM_RULE_NONE, OG_KV_RULE_NONE);
    return open_data(data ? data : k_empty, size, NULL, out);
}

og_status og_program_open(const char *path, og_program **out) {
    if (!path || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_open: NULL argument");
    *out = NULL;
    og_program_set_last_rule(OG_PROGRAM_RULE_NONE, OG_KV_RULE_NONE);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return og_set_error(OG_ERR_IO, "program %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return og_set_error(OG_ERR_IO, "program %s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return og_set_error(OG_ERR_IO, "program %s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return og_set_error(OG_ERR_IO, "program %s: cannot map %zu bytes: %s", path, size, strerror(e));
    og_status st = open_data(map ? map : k_empty, size, map, out);
    if (st == OG_ERR_FORMAT) {
        char why[OG_ERRMSG_CAP];
        snprintf(why, sizeof why, "%s", og_last_error());
        og_set_error(st, "%s (in %s)", why, path);
    }
    return st;
}

void og_program_close(og_program *p) {
    if (!p) return;
    if (p->map) munmap(p->map, p->size);
    cJSON_Delete(p->root);
    og_free(p->layers);
    og_free(p->states);
    og_free(p->tensors);
    og_free(p->instrs);
    og_free(p);
}

const og_program_model *og_program_get_model(const og_program *p) { return p ? &p->model : NULL; }
const cJSON *og_program_model_json(const og_program *p) { return p ? p->model_json : NULL; }
const og_kv_config *og_program_kv_config(const og_program *p) { return p ? &p->kv : NULL; }
int32_t og_program_n_tensors(const og_program *p) { return p ? p->n_tensors : 0; }

const og_program_tensor *og_program_tensor_at(const og_program *p, int32_t i) {
    return p && i >= 0 && i < p->n_tensors ? &p->tensors[i] : NULL;
}

int32_t og_program_find_tensor(const og_program *p, const char *name) {
    for (int32_t i = 0; p && name && i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return i;
    return -1;
}

int32_t og_program_n_instrs(const og_program *p) { return p ? p->n_instrs : 0; }

const og_program_instr *og_program_instr_at(const og_program *p, int32_t i) {
    return p && i >= 0 && i < p->n_instrs ? &p->instrs[i] : NULL;
}

int32_t og_program_logits_instr(const og_program *p) { return p ? p->logits_instr : -1; }

const char *og_program_operand_name(const og_program *p, og_program_operand o) {
    switch (o.kind) {
    case OG_VALUE_TENSOR:
        return o.index >= 0 && o.index < p->n_tensors ? p->tensors[o.index].name : "?";
    case OG_VALUE_INPUT:
        return o.index == OG_INPUT_TOKENS ? "tokens" : "positions";
    case OG_VALUE_ACTIVATION:
        return o.index >= 0 && o.index < p->n_instrs ? p->instrs[o.index].out : "?";
    }
    return "?";
}

const void *og_program_header_bytes(const og_program *p, size_t *size) {
    *size = p ? (size_t)p->payload_offset : 0;
    return p ? p->data : NULL;
}
const char *og_program_tokenizer_json(const og_program *p) { return p ? p->tokenizer_json : NULL; }
const char *og_program_tokenizer_config(const og_program *p) { return p ? p->tokenizer_config : NULL; }
uint64_t og_program_weight_bytes(const og_program *p) { return p ? p->weight_bytes : 0; }
uint64_t og_program_file_size(const og_program *p) { return p ? p->size : 0; }

void og_program_prefault(const og_program *p) {
    if (!p || !p->map) return;
    long page = sysconf(_SC_PAGESIZE);
#ifdef MADV_POPULATE_READ
    if (madvise(p->map, p->size, MADV_POPULATE_READ) == 0) return;
#endif
    /* older kernels: read one byte of every page */
    volatile const unsigned char *b = p->map;
    unsigned char sink = 0;
    for (size_t off = 0; off < p->size; off += (size_t)(page > 0 ? page : 4096)) sink ^= b[off];
    (void)sink;
}
