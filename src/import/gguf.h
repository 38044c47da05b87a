/* GGUF reader: the single-file model format of llama.cpp (versions 2 and 3,
 * little-endian; both have the same layout).
 *
 * A file is: "GGUF", u32 version, u64 tensor count, u64 key/value count;
 * the key/values (string key, u32 value type, value); the tensor infos
 * (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset);
 * padding to the alignment (general.alignment, default 32); the data, in
 * which every tensor's offset is a multiple of the alignment. Strings are
 * u64 length + bytes (no terminator). Arrays are u32 element type, u64
 * count, elements. ne[0] is the fastest-varying axis (the reverse of the
 * row-major shape of a safetensors tensor).
 *
 * The file is mapped read-only; every count and size is checked against the
 * bytes that remain before anything is allocated from it, so a malformed or
 * truncated file is refused (OG_ERR_FORMAT, og_last_error() naming the
 * field) and never read past its end. */
#ifndef OG_IMPORT_GGUF_H
#define OG_IMPORT_GGUF_H

#include "offgraph.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OG_GGUF_MAX_DIMS 4
/* Bounds on what a file may declare (far above any real model). */
#define OG_GGUF_MAX_TENSORS (1 << 20)
#define OG_GGUF_MAX_KV (1 << 20)
#define OG_GGUF_MAX_KEY 65535
#define OG_GGUF_MAX_ALIGNMENT (1u << 20)

typedef enum og_gguf_vtype {
    OG_GGUF_U8 = 0,
    OG_GGUF_I8 = 1,
    OG_GGUF_U16 = 2,
    OG_GGUF_I16 = 3,
    OG_GGUF_U32 = 4,
    OG_GGUF_I32 = 5,
    OG_GGUF_F32 = 6,
    OG_GGUF_BOOL = 7,
    OG_GGUF_STRING = 8,
    OG_GGUF_ARRAY = 9,
    OG_GGUF_U64 = 10,
    OG_GGUF_I64 = 11,
    OG_GGUF_F64 = 12,
    OG_GGUF_VTYPE_COUNT
} og_gguf_vtype;

/* ggml tensor types this reader knows the block layout of (the numbering
 * of the format). Only F32, F16, BF16, Q8_0, Q4_0 and the k-quants Q2_K to
 * Q6_K can be exported; the others are named in refusals. */
enum {
    OG_GGML_F32 = 0,
    OG_GGML_F16 = 1,
    OG_GGML_Q4_0 = 2,
    OG_GGML_Q8_0 = 8,
    OG_GGML_Q2_K = 10,
    OG_GGML_Q3_K = 11,
    OG_GGML_Q4_K = 12,
    OG_GGML_Q5_K = 13,
    OG_GGML_Q6_K = 14,
    OG_GGML_BF16 = 30,
};

/* A string inside the mapping: not NUL-terminated. */
typedef struct og_gguf_str {
    const char *p;
    uint64_t len;
} og_gguf_str;

typedef struct og_gguf_kv {
    char *key;          /* NUL-terminated copy, owned by the og_gguf       */
    og_gguf_vtype type;
    /* scalars: the value widened (u for U8..U64 and BOOL, i for the signed
     * types, f for F32/F64); STRING: s */
    uint64_t u;
    int64_t i;
    double f;
    og_gguf_str s;
    /* ARRAY: element type (never ARRAY), count, the first element's bytes;
     * for a STRING array, strs[count] */
    og_gguf_vtype elem_type;
    uint64_t count;
    const uint8_t *elems;
    og_gguf_str *strs;
} og_gguf_kv;

typedef struct og_gguf_tensor {
    char *name;     /* NUL-terminated copy, owned by the og_gguf          */
    uint32_t type;  /* ggml type                                          */
    int32_t n_dims;
    int64_t ne[OG_GGUF_MAX_DIMS]; /* ne[0] fastest; 1 past n_dims        */
    int64_t numel;
    uint64_t offset;  /* from the start of the data section               */
    uint64_t nbytes;  /* numel / block size * block bytes                 */
    const void *data; /* in the mapping                                   */
} og_gguf_tensor;

typedef struct og_gguf og_gguf;

/* Maps and parses a file. Owned by the caller: og_gguf_close. */
og_status og_gguf_open_file(const char *path, og_gguf **out);
/* Parses a buffer that must outlive the handle; origin names it in
 * messages. Owned by the caller: og_gguf_close. */
og_status og_gguf_open_memory(const void *data, size_t size, const char *origin, og_gguf **out);
void og_gguf_close(og_gguf *g);

const char *og_gguf_origin(const og_gguf *g);
uint32_t og_gguf_version(const og_gguf *g);
uint64_t og_gguf_alignment(const og_gguf *g);

int64_t og_gguf_n_kv(const og_gguf *g);
const og_gguf_kv *og_gguf_kv_at(const og_gguf *g, int64_t i);
const og_gguf_kv *og_gguf_find_kv(const og_gguf *g, const char *key);

int64_t og_gguf_n_tensors(const og_gguf *g);
const og_gguf_tensor *og_gguf_tensor_at(const og_gguf *g, int64_t i);
const og_gguf_tensor *og_gguf_find_tensor(const og_gguf *g, const char *name);

/* "u8", "string", "array", ...; "unknown" otherwise. Static. */
const char *og_gguf_vtype_name(uint32_t t);
/* "f32", "q4_K", ...; NULL for a number this reader does not know. Static. */
const char *og_ggml_type_name(uint32_t t);

/* Typed look-ups of key; absent keys leave *out alone and return
 * OG_ERR_FORMAT only when required (message naming the key). A value of
 * the wrong type, or an integer out of [lo, hi], is OG_ERR_FORMAT naming
 * the key. *found (may be NULL) tells whether the key was present. */
og_status og_gguf_get_int(const og_gguf *g, const char *key, bool required, int64_t lo, int64_t hi,
                          int64_t *out, bool *found);
og_status og_gguf_get_float(const og_gguf *g, const char *key, bool required, double *out, bool *found);
og_status og_gguf_get_bool(const og_gguf *g, const char *key, bool required, bool *out, bool *found);
/* The string, copied and NUL-terminated (owned by the caller: og_free);
 * a string with an embedded NUL is refused. */
og_status og_gguf_get_str(const og_gguf *g, const char *key, bool required, char **out, bool *found);

#endif
